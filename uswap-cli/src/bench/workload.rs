//! The memtouch workload (same as `shared/probe/memtouch.c`, so figures compare with the
//! kernel's): fill every page of the working set, then time N accesses to pages chosen at
//! random or in order, each checked.
//!
//! Page layout: word 0 holds the page index, words 2..256 a pseudo-random pattern derived
//! from the index, word 1 a write counter, the second half of the page zero. A read checks
//! the index word; a write increments the counter word and checks the index word. With
//! `Verify::Full` every access checks the whole page against the pattern.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use uswap::Histogram;

pub const PAGE_WORDS: usize = uswap::PAGE_SIZE / 8;
const PATTERN_WORDS: usize = PAGE_WORDS / 2;

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Pattern {
    Random,
    Seq,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Verify {
    /// Check the index word of every page accessed (what memtouch does).
    Index,
    /// Check every byte of every page accessed.
    Full,
}

#[derive(Debug, Clone)]
pub struct AccessConfig {
    pub pattern: Pattern,
    pub accesses: u64,
    pub read_pct: u32,
    pub threads: usize,
    pub verify: Verify,
    pub seed: u64,
}

/// What one run of the access phase measured.
#[derive(Debug, Default)]
pub struct AccessResult {
    pub accesses: u64,
    pub seconds: f64,
    pub latency: Histogram,
    pub verify_errors: u64,
    /// The first few mismatches, described.
    pub errors: Vec<String>,
}

#[inline]
fn xorshift(x: &mut u64) -> u64 {
    *x ^= *x << 13;
    *x ^= *x >> 7;
    *x ^= *x << 17;
    *x
}

/// The pattern word `k` (2 ≤ k < 256) of page `i`: a splitmix64 of (i, k).
#[inline]
pub fn pattern_word(i: u64, k: usize) -> u64 {
    let mut z = i.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ (k as u64).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

fn fill_page(page: &[AtomicU64], i: u64) {
    page[0].store(i, Ordering::Relaxed);
    page[1].store(0, Ordering::Relaxed);
    for (k, w) in page.iter().enumerate().take(PATTERN_WORDS).skip(2) {
        w.store(pattern_word(i, k), Ordering::Relaxed);
    }
    // The second half stays as mapped: zero.
}

/// Fills every page, split in contiguous chunks over `threads`. Returns seconds taken.
pub fn fill(words: &[AtomicU64], threads: usize) -> f64 {
    let nr_pages = words.len() / PAGE_WORDS;
    let threads = threads.max(1);
    let chunk = nr_pages.div_ceil(threads);
    let t0 = Instant::now();
    std::thread::scope(|s| {
        for t in 0..threads {
            let lo = (t * chunk).min(nr_pages);
            let hi = ((t + 1) * chunk).min(nr_pages);
            s.spawn(move || {
                for i in lo..hi {
                    fill_page(&words[i * PAGE_WORDS..(i + 1) * PAGE_WORDS], i as u64);
                }
            });
        }
    });
    t0.elapsed().as_secs_f64()
}

/// Checks a page; returns a description of the first difference.
fn check_page(page: &[AtomicU64], i: u64, verify: Verify) -> Option<String> {
    let idx = page[0].load(Ordering::Relaxed);
    if idx != i {
        return Some(format!("page {i}: index word is {idx:#x}"));
    }
    if verify == Verify::Full {
        for (k, w) in page.iter().enumerate().skip(2) {
            let want = if k < PATTERN_WORDS { pattern_word(i, k) } else { 0 };
            let got = w.load(Ordering::Relaxed);
            if got != want {
                return Some(format!("page {i}: word {k} is {got:#x}, expected {want:#x}"));
            }
        }
    }
    None
}

/// Runs the access phase over `words` with `cfg.threads` threads, each doing its share of
/// the accesses with its own random stream.
pub fn access(words: &[AtomicU64], cfg: &AccessConfig) -> AccessResult {
    let nr_pages = (words.len() / PAGE_WORDS) as u64;
    let threads = cfg.threads.max(1) as u64;
    let t0 = Instant::now();
    let parts: Vec<AccessResult> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..threads)
            .map(|t| {
                let n = cfg.accesses / threads + u64::from(t < cfg.accesses % threads);
                let cfg = cfg.clone();
                s.spawn(move || {
                    let mut rng = cfg.seed ^ 0x2545_F491_4F6C_DD1D_u64.wrapping_mul(t + 1);
                    let mut r = AccessResult::default();
                    // Sequential threads start spread over the working set.
                    let start = t * nr_pages / threads;
                    for j in 0..n {
                        let i = match cfg.pattern {
                            Pattern::Random => xorshift(&mut rng) % nr_pages,
                            Pattern::Seq => (start + j) % nr_pages,
                        };
                        let is_write = xorshift(&mut rng) % 100 >= cfg.read_pct as u64;
                        let a = Instant::now();
                        let page = &words[i as usize * PAGE_WORDS..(i as usize + 1) * PAGE_WORDS];
                        if is_write {
                            page[1].fetch_add(1, Ordering::Relaxed);
                        }
                        let bad = check_page(page, i, cfg.verify);
                        r.latency.record(a.elapsed().as_nanos() as u64);
                        if let Some(e) = bad {
                            r.verify_errors += 1;
                            if r.errors.len() < 8 {
                                r.errors.push(e);
                            }
                        }
                    }
                    r.accesses = n;
                    r
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().expect("workload thread panicked")).collect()
    });
    let mut total = AccessResult { seconds: t0.elapsed().as_secs_f64(), ..Default::default() };
    for p in parts {
        total.accesses += p.accesses;
        total.latency.merge(&p.latency);
        total.verify_errors += p.verify_errors;
        total.errors.extend(p.errors.into_iter().take(8usize.saturating_sub(total.errors.len())));
    }
    total
}

/// Checks every page of the working set once (after the run): counts pages that differ.
pub fn verify_all(words: &[AtomicU64]) -> (u64, Vec<String>) {
    let nr_pages = words.len() / PAGE_WORDS;
    let mut bad = 0;
    let mut errors = vec![];
    for i in 0..nr_pages {
        if let Some(e) = check_page(&words[i * PAGE_WORDS..(i + 1) * PAGE_WORDS], i as u64, Verify::Full) {
            bad += 1;
            if errors.len() < 8 {
                errors.push(e);
            }
        }
    }
    (bad, errors)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fill_then_access_verifies_clean_and_catches_corruption() {
        let mem = uswap::PlainRegion::new(64 * uswap::PAGE_SIZE).unwrap();
        let w = mem.as_atomic_u64s();
        fill(w, 2);
        let cfg = AccessConfig {
            pattern: Pattern::Random,
            accesses: 1000,
            read_pct: 80,
            threads: 2,
            verify: Verify::Full,
            seed: 1,
        };
        let r = access(w, &cfg);
        assert_eq!(r.accesses, 1000);
        assert_eq!(r.verify_errors, 0);
        assert_eq!(r.latency.count(), 1000);
        assert_eq!(verify_all(w).0, 0);
        // Corrupt one pattern word of page 5: full verification must see it.
        w[5 * PAGE_WORDS + 7].fetch_xor(1, Ordering::Relaxed);
        let (bad, errs) = verify_all(w);
        assert_eq!(bad, 1);
        assert!(errs[0].starts_with("page 5: word 7"), "{errs:?}");
        let seq = access(w, &AccessConfig { pattern: Pattern::Seq, accesses: 64, ..cfg });
        assert_eq!(seq.verify_errors, 1, "the sequential pass touches page 5 once");
    }
}
