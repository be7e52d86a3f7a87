//! The workloads of `uswap bench`, written once and run unchanged over a managed region
//! (uswap engines) or an ordinary anonymous mapping (the kernel engines and `ram`).
//!
//! Every workload first fills every page (sequential first touch: with a limit below the
//! working set, this is the swap-out phase), then accesses pages, checking what it reads
//! (see [`layout`]):
//!
//! - `memtouch`: `probes/memtouch.c`: threads share the region; each access reads or
//!   increments one word of a page and checks the page's index word.
//! - `usemem`: vm-scalability's usemem: each thread owns a slice of the region and makes
//!   word accesses in it. Sequential: every word of a page in turn (timed per page);
//!   otherwise one word of a page chosen by the pattern (timed per access).
//! - `pmbench`: threads share the region; each access is one word of a page chosen by the
//!   pattern (uniform, zipf, normal), timed; the latency histogram is pmbench's.
//! - `combined`: the seeds' mixed test (seed 001): sequential streams rewrite their range
//!   (5/8 of the working set, as 50 GB of 80 GB) over and over while random workers access
//!   the rest; the two sides are reported separately.

pub mod gen;
pub mod layout;
pub mod options;

pub use options::{Pattern, Verify, Workload};

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicU8, AtomicUsize, Ordering};
use std::time::Instant;

use serde::{Deserialize, Serialize};
use uswap::Histogram;

use gen::{PageGen, Rng};
use layout::{check_range, page, touch, PAGE_WORDS};

pub use layout::MAX_ERROR_SAMPLES;
/// Steps between two looks at the stop flag and two progress updates.
const CHUNK: u64 = 256;

/// Which part of a workload a result describes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Side {
    All,
    Seq,
    Random,
}

/// What one timed step is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum LatencyUnit {
    /// One access (one word, or one page for memtouch).
    Access,
    /// A page's worth of sequential word accesses (usemem seq, combined seq).
    Page,
}

/// A workload and its parameters: everything a workload process needs besides the memory.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct WorkloadSpec {
    pub workload: Workload,
    pub pattern: Pattern,
    /// Accesses after the fill, split over the threads (combined: the random side's).
    pub accesses: u64,
    pub read_pct: u32,
    /// Threads (combined: random workers).
    pub threads: usize,
    /// Combined: sequential streams.
    pub seq_streams: usize,
    pub verify: Verify,
    pub seed: u64,
    pub zipf_skew: f64,
    /// Normal pattern: standard deviation as a fraction of the range.
    pub normal_sd: f64,
}

impl WorkloadSpec {
    /// Threads that fill the region.
    pub fn fill_threads(&self) -> usize {
        match self.workload {
            Workload::Combined => self.threads + self.seq_streams,
            _ => self.threads,
        }
        .max(1)
    }
}

/// The phases a workload goes through, for progress reports.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Phase {
    Setup = 0,
    Fill = 1,
    Access = 2,
    Verify = 3,
    Done = 4,
}

impl Phase {
    fn from_u8(v: u8) -> Phase {
        match v {
            0 => Phase::Setup,
            1 => Phase::Fill,
            2 => Phase::Access,
            3 => Phase::Verify,
            _ => Phase::Done,
        }
    }

    pub fn label(self) -> &'static str {
        match self {
            Phase::Setup => "setup",
            Phase::Fill => "fill",
            Phase::Access => "access",
            Phase::Verify => "verify",
            Phase::Done => "done",
        }
    }
}

/// Where a running workload is: its phase, and steps done out of a total for that phase.
#[derive(Debug, Default)]
pub struct Progress {
    phase: AtomicU8,
    done: AtomicU64,
    total: AtomicU64,
}

impl Progress {
    pub fn set_phase(&self, phase: Phase, total: u64) {
        self.done.store(0, Ordering::Relaxed);
        self.total.store(total, Ordering::Relaxed);
        self.phase.store(phase as u8, Ordering::Release);
    }

    pub fn add(&self, n: u64) {
        self.done.fetch_add(n, Ordering::Relaxed);
    }

    /// Sets everything at once (the bench mirroring its workload processes).
    pub fn set(&self, phase: Phase, done: u64, total: u64) {
        self.done.store(done, Ordering::Relaxed);
        self.total.store(total, Ordering::Relaxed);
        self.phase.store(phase as u8, Ordering::Release);
    }

    /// (phase, done, total).
    pub fn get(&self) -> (Phase, u64, u64) {
        (
            Phase::from_u8(self.phase.load(Ordering::Acquire)),
            self.done.load(Ordering::Relaxed),
            self.total.load(Ordering::Relaxed),
        )
    }
}

/// What a workload reports to and hears from its runner.
#[derive(Clone, Copy)]
pub struct Control<'a> {
    pub progress: &'a Progress,
    /// Set when the user interrupts: the workload stops at the next chunk of steps.
    pub stop: &'a AtomicBool,
}

impl Control<'_> {
    pub fn stopped(&self) -> bool {
        self.stop.load(Ordering::Relaxed)
    }
}

/// What one side of a workload measured in one process.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct SideReport {
    pub side: Side,
    pub pattern: Pattern,
    pub latency_unit: LatencyUnit,
    /// Word accesses (memtouch: page accesses; combined seq: pages rewritten).
    pub accesses: u64,
    /// Bytes read or written by those accesses.
    pub bytes: u64,
    pub writes: u64,
    pub seconds: f64,
    #[serde(with = "crate::bench::histogram::log2")]
    pub latency: Histogram,
    pub verify_errors: u64,
    pub errors: Vec<String>,
}

/// Per-thread tally.
#[derive(Default)]
struct Tally {
    accesses: u64,
    bytes: u64,
    writes: u64,
    latency: Histogram,
    verify_errors: u64,
    errors: Vec<String>,
    end: Option<Instant>,
}

impl Tally {
    #[inline]
    fn record(&mut self, ns: u64, words: u64, write: bool, error: Option<String>) {
        self.accesses += words;
        self.bytes += words * 8;
        self.writes += u64::from(write);
        self.latency.record(ns);
        if let Some(e) = error {
            self.error(e);
        }
    }

    fn error(&mut self, e: String) {
        self.verify_errors += 1;
        if self.errors.len() < MAX_ERROR_SAMPLES {
            self.errors.push(e);
        }
    }

    fn report(parts: Vec<Tally>, side: Side, pattern: Pattern, unit: LatencyUnit, t0: Instant) -> SideReport {
        let mut r = SideReport {
            side,
            pattern,
            latency_unit: unit,
            accesses: 0,
            bytes: 0,
            writes: 0,
            seconds: 0.0,
            latency: Histogram::new(),
            verify_errors: 0,
            errors: vec![],
        };
        let mut end = t0;
        for p in parts {
            r.accesses += p.accesses;
            r.bytes += p.bytes;
            r.writes += p.writes;
            r.latency.merge(&p.latency);
            r.verify_errors += p.verify_errors;
            let room = MAX_ERROR_SAMPLES.saturating_sub(r.errors.len());
            r.errors.extend(p.errors.into_iter().take(room));
            end = end.max(p.end.unwrap_or(t0));
        }
        r.seconds = end.duration_since(t0).as_secs_f64();
        r
    }
}

/// This thread's share of `total` when split over `n`.
fn share(total: u64, n: usize, t: usize) -> u64 {
    let n = n.max(1) as u64;
    total / n + u64::from((t as u64) < total % n)
}

/// `lo..hi` of slice `t` of `n` over `pages`.
fn slice(pages: u64, n: usize, t: usize) -> (u64, u64) {
    let n = n.max(1) as u64;
    (t as u64 * pages / n, (t as u64 + 1) * pages / n)
}

fn thread_seed(seed: u64, t: usize) -> u64 {
    seed ^ 0x2545_F491_4F6C_DD1D_u64.wrapping_mul(t as u64 + 1)
}

#[inline]
fn elapsed_ns(a: Instant) -> u64 {
    a.elapsed().as_nanos() as u64
}

/// Fills every page, split in contiguous chunks over `threads`. Returns seconds taken.
pub fn fill(words: &[AtomicU64], threads: usize, ctl: Control) -> f64 {
    let nr_pages = (words.len() / PAGE_WORDS) as u64;
    let threads = threads.max(1);
    ctl.progress.set_phase(Phase::Fill, nr_pages);
    let t0 = Instant::now();
    std::thread::scope(|s| {
        for t in 0..threads {
            let (lo, hi) = slice(nr_pages, threads, t);
            s.spawn(move || {
                let mut i = lo;
                while i < hi && !ctl.stopped() {
                    let end = (i + CHUNK).min(hi);
                    for j in i..end {
                        layout::fill_page(page(words, j), j);
                    }
                    ctl.progress.add(end - i);
                    i = end;
                }
            });
        }
    });
    t0.elapsed().as_secs_f64()
}

/// Runs the access phase of `spec` over `words` (already filled), then with `Verify::Full`
/// checks every page. Returns one report per side (two for `combined`).
pub fn access(words: &[AtomicU64], spec: &WorkloadSpec, ctl: Control) -> Vec<SideReport> {
    let nr_pages = (words.len() / PAGE_WORDS) as u64;
    ctl.progress.set_phase(Phase::Access, spec.accesses);
    let mut sides = match spec.workload {
        Workload::Memtouch => vec![shared_pages(words, spec, ctl, false)],
        Workload::Pmbench => vec![shared_pages(words, spec, ctl, true)],
        Workload::Usemem => vec![usemem(words, spec, ctl)],
        Workload::Combined => combined(words, spec, ctl),
    };
    if spec.verify == Verify::Full && !ctl.stopped() {
        ctl.progress.set_phase(Phase::Verify, nr_pages);
        let ranges = match spec.workload {
            Workload::Combined => {
                let split = combined_split(nr_pages);
                vec![(0, split), (split, nr_pages)]
            }
            _ => vec![(0, nr_pages)],
        };
        for (side, (lo, hi)) in sides.iter_mut().zip(ranges) {
            let (bad, errors) = check_range(words, lo, hi, side.writes);
            side.verify_errors += bad;
            let room = MAX_ERROR_SAMPLES.saturating_sub(side.errors.len());
            side.errors.extend(errors.into_iter().take(room.max(1)));
            ctl.progress.add(hi - lo);
        }
    }
    sides
}

/// memtouch and pmbench: every thread over the whole region. memtouch touches the index
/// word (and the counter on writes); pmbench one word chosen at random in the page.
fn shared_pages(words: &[AtomicU64], spec: &WorkloadSpec, ctl: Control, word_access: bool) -> SideReport {
    let nr_pages = (words.len() / PAGE_WORDS) as u64;
    let threads = spec.threads.max(1);
    let t0 = Instant::now();
    let parts = on_threads(threads, |t| {
        let n = share(spec.accesses, threads, t);
        // Sequential threads start spread over the working set.
        let start = t as u64 * nr_pages / threads as u64;
        let g = PageGen::new(spec.pattern, 0, nr_pages, start, spec.zipf_skew, spec.normal_sd);
        page_accesses(words, spec, ctl, t, n, g, word_access)
    });
    let mut r = Tally::report(parts, Side::All, spec.pattern, LatencyUnit::Access, t0);
    if !word_access {
        // memtouch accesses are page accesses touching one word.
        r.bytes = r.accesses * 8;
    }
    r
}

/// The access loop of thread `t` of memtouch, pmbench and the random side of combined: `n`
/// timed accesses to pages drawn from `g`, each a read or (`100 - read_pct` % of them) a
/// write, of one word chosen at random in the page (`word_access`) or of the index word only.
/// Looks at the stop flag and reports progress every `CHUNK` accesses.
fn page_accesses(
    words: &[AtomicU64],
    spec: &WorkloadSpec,
    ctl: Control,
    t: usize,
    n: u64,
    mut g: PageGen,
    word_access: bool,
) -> Tally {
    let mut rng = Rng::new(thread_seed(spec.seed, t));
    let mut tally = Tally::default();
    let mut j = 0;
    while j < n && !ctl.stopped() {
        let end = (j + CHUNK).min(n);
        for _ in j..end {
            let i = g.next(&mut rng);
            let write = rng.below(100) >= spec.read_pct as u64;
            let (lo, hi) = if word_access {
                let k = rng.below(PAGE_WORDS as u64) as usize;
                (k, k + 1)
            } else {
                (0, 0)
            };
            let a = Instant::now();
            let e = touch(page(words, i), i, lo, hi, write, spec.verify);
            tally.record(elapsed_ns(a), 1, write, e);
        }
        ctl.progress.add(end - j);
        j = end;
    }
    tally.end = Some(Instant::now());
    tally
}

/// usemem: each thread owns a slice; sequential threads read or write every word of a page
/// in turn (one timed step per page), others one word of a page chosen by the pattern.
fn usemem(words: &[AtomicU64], spec: &WorkloadSpec, ctl: Control) -> SideReport {
    let nr_pages = (words.len() / PAGE_WORDS) as u64;
    let threads = spec.threads.max(1);
    let seq = spec.pattern == Pattern::Seq;
    let t0 = Instant::now();
    let parts = on_threads(threads, |t| {
        let n = share(spec.accesses, threads, t);
        let (lo, hi) = slice(nr_pages, threads, t);
        let mut rng = Rng::new(thread_seed(spec.seed, t));
        let mut g = PageGen::new(spec.pattern, lo, hi.max(lo + 1), lo, spec.zipf_skew, spec.normal_sd);
        let mut tally = Tally::default();
        let mut done = 0;
        let mut since_check = 0;
        while done < n {
            if since_check >= CHUNK * 8 {
                ctl.progress.add(since_check);
                since_check = 0;
                if ctl.stopped() {
                    break;
                }
            }
            let i = g.next(&mut rng);
            let write = rng.below(100) >= spec.read_pct as u64;
            let (wlo, whi) = if seq {
                (0, (n - done).min(PAGE_WORDS as u64) as usize)
            } else {
                let k = rng.below(PAGE_WORDS as u64) as usize;
                (k, k + 1)
            };
            let a = Instant::now();
            let e = touch(page(words, i), i, wlo, whi, write, spec.verify);
            let nw = (whi - wlo) as u64;
            tally.record(elapsed_ns(a), nw, write, e);
            done += nw;
            since_check += nw;
        }
        ctl.progress.add(since_check);
        tally.end = Some(Instant::now());
        tally
    });
    let unit = if seq { LatencyUnit::Page } else { LatencyUnit::Access };
    Tally::report(parts, Side::All, spec.pattern, unit, t0)
}

/// The first page of the random range of `combined`: 5/8 of the pages are sequential.
pub fn combined_split(nr_pages: u64) -> u64 {
    (nr_pages * 5 / 8).clamp(1, nr_pages.saturating_sub(1).max(1))
}

/// combined: sequential streams read and rewrite whole pages of their slice of the first
/// 5/8 until the random workers are done with their accesses to the rest.
fn combined(words: &[AtomicU64], spec: &WorkloadSpec, ctl: Control) -> Vec<SideReport> {
    let nr_pages = (words.len() / PAGE_WORDS) as u64;
    let split = combined_split(nr_pages);
    let streams = spec.seq_streams.max(1);
    let workers = spec.threads.max(1);
    let random_left = AtomicUsize::new(workers);
    let t0 = Instant::now();
    let (seq_parts, random_parts) = std::thread::scope(|s| {
        let random_left = &random_left;
        let seq: Vec<_> = (0..streams)
            .map(|t| {
                s.spawn(move || {
                    let (lo, hi) = slice(split, streams, t);
                    let mut rng = Rng::new(thread_seed(spec.seed, 1000 + t));
                    let mut g = PageGen::new(Pattern::Seq, lo, hi.max(lo + 1), lo, 0.0, 0.0);
                    let mut tally = Tally::default();
                    while random_left.load(Ordering::Acquire) > 0 && !ctl.stopped() {
                        let i = g.next(&mut rng);
                        let p = page(words, i);
                        let a = Instant::now();
                        // Read every word (a corrupted swap-in is seen), then rewrite the page.
                        let e = touch(p, i, 0, PAGE_WORDS, false, spec.verify)
                            .or_else(|| touch(p, i, 0, PAGE_WORDS, true, Verify::Index));
                        tally.record(elapsed_ns(a), 1, true, e);
                    }
                    tally.bytes = tally.accesses * uswap::PAGE_SIZE as u64;
                    tally.end = Some(Instant::now());
                    tally
                })
            })
            .collect();
        let random: Vec<_> = (0..workers)
            .map(|t| {
                s.spawn(move || {
                    let n = share(spec.accesses, workers, t);
                    let g = PageGen::new(spec.pattern, split, nr_pages, split, spec.zipf_skew, spec.normal_sd);
                    let tally = page_accesses(words, spec, ctl, t, n, g, true);
                    random_left.fetch_sub(1, Ordering::Release);
                    tally
                })
            })
            .collect();
        (join_all(seq), join_all(random))
    });
    vec![
        Tally::report(seq_parts, Side::Seq, Pattern::Seq, LatencyUnit::Page, t0),
        Tally::report(random_parts, Side::Random, spec.pattern, LatencyUnit::Access, t0),
    ]
}

/// Runs `f(t)` on `threads` threads at once, `t` from 0, and returns their tallies in that
/// order.
fn on_threads(threads: usize, f: impl Fn(usize) -> Tally + Sync) -> Vec<Tally> {
    let f = &f;
    std::thread::scope(|s| join_all((0..threads).map(|t| s.spawn(move || f(t))).collect()))
}

fn join_all(handles: Vec<std::thread::ScopedJoinHandle<'_, Tally>>) -> Vec<Tally> {
    handles
        .into_iter()
        .map(|h| match h.join() {
            Ok(t) => t,
            // A workload thread only panics on a bug; keep its message.
            Err(e) => std::panic::resume_unwind(e),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(workload: Workload, pattern: Pattern, accesses: u64, threads: usize) -> WorkloadSpec {
        WorkloadSpec {
            workload,
            pattern,
            accesses,
            read_pct: 80,
            threads,
            seq_streams: 1,
            verify: Verify::Full,
            seed: 1,
            zipf_skew: 0.99,
            normal_sd: 0.125,
        }
    }

    fn run(pages: usize, s: &WorkloadSpec) -> (uswap::PlainRegion, Vec<SideReport>) {
        let mem = uswap::PlainRegion::new(pages * uswap::PAGE_SIZE).unwrap();
        let progress = Progress::default();
        let stop = AtomicBool::new(false);
        let ctl = Control { progress: &progress, stop: &stop };
        fill(mem.as_atomic_u64s(), s.fill_threads(), ctl);
        assert_eq!(progress.get(), (Phase::Fill, pages as u64, pages as u64));
        let r = access(mem.as_atomic_u64s(), s, ctl);
        (mem, r)
    }

    #[test]
    fn every_workload_and_pattern_runs_clean() {
        for w in [Workload::Memtouch, Workload::Usemem, Workload::Pmbench] {
            for p in [Pattern::Random, Pattern::Seq, Pattern::Zipf, Pattern::Normal] {
                let s = spec(w, p, 30_000, 2);
                let (_m, r) = run(64, &s);
                assert_eq!(r.len(), 1);
                let r = &r[0];
                assert_eq!(r.accesses, 30_000, "{w:?} {p:?}");
                assert_eq!(r.verify_errors, 0, "{w:?} {p:?}: {:?}", r.errors);
                // usemem seq times a page of words at once: 15,000 words per thread, 30 pages.
                let steps =
                    if w == Workload::Usemem && p == Pattern::Seq { 2 * 15_000u64.div_ceil(512) } else { 30_000 };
                assert_eq!(r.latency.count(), steps, "{w:?} {p:?}");
                assert!(r.writes > 0 && r.writes < r.latency.count(), "{w:?} {p:?}: 20 % writes");
            }
        }
    }

    #[test]
    fn combined_reports_both_sides() {
        let s = spec(Workload::Combined, Pattern::Random, 20_000, 1);
        let (_m, r) = run(64, &s);
        assert_eq!(r.len(), 2);
        assert_eq!((r[0].side, r[0].pattern, r[0].latency_unit), (Side::Seq, Pattern::Seq, LatencyUnit::Page));
        assert_eq!((r[1].side, r[1].pattern), (Side::Random, Pattern::Random));
        assert_eq!(r[1].accesses, 20_000);
        assert!(r[0].accesses > 0, "the stream ran while the random worker did");
        assert_eq!(r[0].bytes, r[0].accesses * 4096);
        assert_eq!(r[0].writes, r[0].accesses);
        assert_eq!(r[0].verify_errors + r[1].verify_errors, 0, "{:?} {:?}", r[0].errors, r[1].errors);
        assert_eq!(combined_split(64), 40);
    }

    #[test]
    fn corruption_during_the_run_is_reported_not_averaged() {
        // Corrupt a page between fill and access: the full pass at the end finds it even if
        // no access did, and the sequential usemem pass reads every word of it.
        let mem = uswap::PlainRegion::new(32 * uswap::PAGE_SIZE).unwrap();
        let w = mem.as_atomic_u64s();
        let progress = Progress::default();
        let stop = AtomicBool::new(false);
        let ctl = Control { progress: &progress, stop: &stop };
        fill(w, 1, ctl);
        page(w, 9)[300].store(1, Ordering::Relaxed);
        let s =
            WorkloadSpec { read_pct: 100, verify: Verify::Index, ..spec(Workload::Usemem, Pattern::Seq, 32 * 512, 1) };
        let r = access(w, &s, ctl).remove(0);
        assert_eq!(r.verify_errors, 1, "{:?}", r.errors);
        assert_eq!(r.errors[0], "page 9: word 300 is 0x1, expected 0x0");
        let s = WorkloadSpec { verify: Verify::Full, ..s };
        let r = access(w, &s, ctl).remove(0);
        assert_eq!(r.verify_errors, 2, "once by the access, once by the final pass: {:?}", r.errors);
    }

    #[test]
    fn a_stop_request_ends_the_phase_early() {
        let mem = uswap::PlainRegion::new(16 * uswap::PAGE_SIZE).unwrap();
        let progress = Progress::default();
        let stop = AtomicBool::new(true);
        let ctl = Control { progress: &progress, stop: &stop };
        let s = spec(Workload::Memtouch, Pattern::Random, 1_000_000_000, 2);
        let r = access(mem.as_atomic_u64s(), &s, ctl).remove(0);
        assert_eq!(r.accesses, 0);
        let s = spec(Workload::Combined, Pattern::Random, 1_000_000_000, 1);
        let r = access(mem.as_atomic_u64s(), &s, ctl);
        assert_eq!(r[0].accesses + r[1].accesses, 0);
    }
}
