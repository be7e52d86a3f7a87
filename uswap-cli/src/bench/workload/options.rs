//! What a workload is asked to do: which workload, the access pattern, how much it checks.
//! A leaf: the generators and the page layout use these, and import nothing else here.

use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Workload {
    /// probes/memtouch.c: page accesses checking the index word.
    Memtouch,
    /// vm-scalability usemem: per-thread (or per-process) slices, word accesses.
    Usemem,
    /// pmbench: word accesses by pattern, per-access latency histogram.
    Pmbench,
    /// Seed 001: sequential rewriting streams with random workers in the background.
    Combined,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Pattern {
    /// Uniformly random pages.
    #[value(alias = "uniform")]
    Random,
    /// Pages in order.
    Seq,
    /// Zipf-distributed pages (the first pages are the hottest); see --zipf-skew.
    Zipf,
    /// Normally distributed pages around the middle of the range; see --normal-sd.
    Normal,
}

impl Pattern {
    /// The name a workload's reader knows it by (pmbench says "uniform").
    pub fn name(self, workload: Workload) -> &'static str {
        match (self, workload) {
            (Pattern::Random, Workload::Pmbench) => "uniform",
            (Pattern::Random, _) => "random",
            (Pattern::Seq, _) => "seq",
            (Pattern::Zipf, _) => "zipf",
            (Pattern::Normal, _) => "normal",
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Verify {
    /// Check the words each access reads and the page's index word.
    Index,
    /// Check every byte of every page accessed, and every page once at the end (with the
    /// sum of its write counters).
    Full,
}
