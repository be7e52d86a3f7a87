//! Fault latency histograms: log-linear, 16 sub-buckets per power of two (relative error
//! below 6.25 %), the layout pmbench uses for its per-access latency report. The atomic one
//! is recorded into on the fault path (no allocation, no lock); the plain one is what a
//! snapshot carries.

use std::sync::atomic::{AtomicU64, Ordering};

use serde::{Deserialize, Serialize};

const SUB_BITS: u32 = 4;
const SUB: usize = 1 << SUB_BITS;
/// Values up to 2^40 ns (18 minutes) are bucketed; larger ones land in the last bucket.
const MAX_EXP: u32 = 40;
/// Number of buckets of every histogram.
pub const NR_BUCKETS: usize = SUB + (MAX_EXP - SUB_BITS) as usize * SUB;

fn bucket_of(v: u64) -> usize {
    if v < SUB as u64 {
        return v as usize;
    }
    let e = 63 - v.leading_zeros();
    if e >= MAX_EXP {
        return NR_BUCKETS - 1;
    }
    let sub = ((v >> (e - SUB_BITS)) as usize) & (SUB - 1);
    SUB + (e - SUB_BITS) as usize * SUB + sub
}

/// Lowest value that falls in bucket `i` and the bucket's width.
fn bucket_range(i: usize) -> (u64, u64) {
    if i < SUB {
        return (i as u64, 1);
    }
    let e = (i - SUB) / SUB + SUB_BITS as usize;
    let sub = ((i - SUB) % SUB) as u64;
    let width = 1u64 << (e - SUB_BITS as usize);
    ((SUB as u64 + sub) * width, width)
}

/// A log-linear latency histogram that may be recorded into from several threads (and from a
/// signal handler) without locks.
pub struct AtomicHistogram {
    buckets: Box<[AtomicU64]>,
}

impl Default for AtomicHistogram {
    fn default() -> Self {
        Self::new()
    }
}

impl AtomicHistogram {
    pub fn new() -> Self {
        AtomicHistogram { buckets: (0..NR_BUCKETS).map(|_| AtomicU64::new(0)).collect() }
    }

    #[inline]
    pub fn record(&self, value_ns: u64) {
        self.buckets[bucket_of(value_ns)].fetch_add(1, Ordering::Relaxed);
    }

    pub fn add_to(&self, h: &mut Histogram) {
        for (dst, src) in h.counts.iter_mut().zip(self.buckets.iter()) {
            *dst += src.load(Ordering::Relaxed);
        }
    }
}

/// A plain (single-owner) log-linear histogram: what the bench records per thread and what
/// snapshots of the engine's atomic histograms become.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Histogram {
    counts: Vec<u64>,
}

impl Default for Histogram {
    fn default() -> Self {
        Self::new()
    }
}

impl Histogram {
    pub fn new() -> Self {
        Histogram { counts: vec![0; NR_BUCKETS] }
    }

    #[inline]
    pub fn record(&mut self, value_ns: u64) {
        self.counts[bucket_of(value_ns)] += 1;
    }

    /// Records `n` values of `value_ns` at once (rebuilding a histogram from its buckets, e.g.
    /// one another process reported).
    pub fn record_n(&mut self, value_ns: u64, n: u64) {
        self.counts[bucket_of(value_ns)] += n;
    }

    pub fn merge(&mut self, other: &Histogram) {
        for (a, b) in self.counts.iter_mut().zip(&other.counts) {
            *a += b;
        }
    }

    pub fn count(&self) -> u64 {
        self.counts.iter().sum()
    }

    /// The value at quantile `q` (0.0..=1.0), as the middle of its bucket; 0 when empty.
    pub fn quantile(&self, q: f64) -> u64 {
        let total = self.count();
        if total == 0 {
            return 0;
        }
        let rank = ((q.clamp(0.0, 1.0) * total as f64).ceil() as u64).max(1);
        let mut seen = 0;
        for (i, &c) in self.counts.iter().enumerate() {
            seen += c;
            if seen >= rank {
                let (lo, w) = bucket_range(i);
                return lo + w / 2;
            }
        }
        let (lo, w) = bucket_range(NR_BUCKETS - 1);
        lo + w / 2
    }

    /// Mean of the bucket midpoints, weighted by count.
    pub fn mean(&self) -> f64 {
        let total = self.count();
        if total == 0 {
            return 0.0;
        }
        let sum: f64 = self
            .counts
            .iter()
            .enumerate()
            .map(|(i, &c)| {
                let (lo, w) = bucket_range(i);
                c as f64 * (lo as f64 + w as f64 / 2.0)
            })
            .sum();
        sum / total as f64
    }

    /// Non-empty buckets as `(lowest value, width, count)`, in ascending order: the pmbench
    /// log2 histogram with sub-buckets.
    pub fn buckets(&self) -> impl Iterator<Item = (u64, u64, u64)> + '_ {
        self.counts.iter().enumerate().filter(|(_, &c)| c > 0).map(|(i, &c)| {
            let (lo, w) = bucket_range(i);
            (lo, w, c)
        })
    }

    /// The usual percentiles, in microseconds.
    pub fn summary_us(&self) -> LatencySummary {
        let us = |q| self.quantile(q) as f64 / 1000.0;
        LatencySummary {
            count: self.count(),
            mean: self.mean() / 1000.0,
            p50: us(0.50),
            p90: us(0.90),
            p99: us(0.99),
            p999: us(0.999),
            max: us(1.0),
        }
    }
}

/// Percentiles of a latency histogram, in microseconds.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct LatencySummary {
    pub count: u64,
    pub mean: f64,
    pub p50: f64,
    pub p90: f64,
    pub p99: f64,
    pub p999: f64,
    pub max: f64,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_are_contiguous_and_cover_their_values() {
        let mut prev_end = 0;
        for i in 0..NR_BUCKETS {
            let (lo, w) = bucket_range(i);
            assert_eq!(lo, prev_end, "bucket {i} starts where {} ended", i.saturating_sub(1));
            assert_eq!(bucket_of(lo), i);
            assert_eq!(bucket_of(lo + w - 1), i);
            prev_end = lo + w;
        }
    }

    #[test]
    fn quantiles_are_within_the_relative_error() {
        let mut h = Histogram::new();
        for v in 1..=100_000u64 {
            h.record(v * 10);
        }
        for (q, exact) in [(0.5, 500_000.0), (0.9, 900_000.0), (0.99, 990_000.0)] {
            let got = h.quantile(q) as f64;
            assert!((got - exact).abs() / exact < 0.0625, "q{q}: {got} vs {exact}");
        }
        assert_eq!(h.count(), 100_000);
        let m = h.mean();
        assert!((m - 500_005.0).abs() / 500_005.0 < 0.0625, "mean {m}");
    }

    #[test]
    fn record_n_rebuilds_a_histogram_from_its_buckets() {
        let mut h = Histogram::new();
        for v in [3u64, 17, 17, 1000, 123_456, 9_999_999] {
            h.record(v);
        }
        let mut rebuilt = Histogram::new();
        for (lo, _, count) in h.buckets() {
            rebuilt.record_n(lo, count);
        }
        assert_eq!(rebuilt, h);
    }
}
