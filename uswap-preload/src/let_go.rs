//! Ranges of managed memory uswap let go of (`Pager::unmanage`) because of what the program
//! asked, kept so that the report of unmanaged memory (`crate::unmanaged`) can say why they
//! are not managed long after `/proc` stopped showing it: a range made read-only and then
//! writable again looks like any other anonymous mapping there.
//!
//! Lock-free and allocation-free: a fixed table of `[start, end)` pairs, the first `N` kept
//! (later ones are counted, not kept; a range forgotten keeps its slot). A slot is claimed
//! before its bounds are written, the end last, and readers load the end first: a slot whose
//! end reads 0 (not yet written, or forgotten) overlaps nothing.

use std::sync::atomic::{AtomicUsize, Ordering};

/// The first `N` ranges let go of for one reason.
pub struct LetGoRanges<const N: usize> {
    ranges: [(AtomicUsize, AtomicUsize); N],
    nr_kept: AtomicUsize,
}

impl<const N: usize> LetGoRanges<N> {
    pub const fn new() -> Self {
        LetGoRanges { ranges: [const { (AtomicUsize::new(0), AtomicUsize::new(0)) }; N], nr_kept: AtomicUsize::new(0) }
    }

    /// Keeps `[start, start + len_bytes)`, if fewer than `N` are kept.
    pub fn keep(&self, start: usize, len_bytes: usize) {
        let k = self.nr_kept.fetch_add(1, Ordering::Relaxed);
        if let Some((s, e)) = self.ranges.get(k) {
            s.store(start, Ordering::Relaxed);
            e.store(start.saturating_add(len_bytes), Ordering::Release);
        }
    }

    /// Forgets the ranges kept that lie inside `[start, end)` (unmapped): their end becomes
    /// 0, which overlaps nothing whatever the start (left as it was, so that no reader pairs
    /// an old end with a new start). Their slots stay used.
    pub fn forget(&self, start: usize, end: usize) {
        let n = self.nr_kept.load(Ordering::Acquire).min(N);
        for (s, e) in &self.ranges[..n] {
            let e_now = e.load(Ordering::Acquire);
            if e_now != 0 && start <= s.load(Ordering::Relaxed) && e_now <= end {
                e.store(0, Ordering::Release);
            }
        }
    }

    /// Whether `[start, end)` overlaps a range kept.
    pub fn overlaps(&self, start: usize, end: usize) -> bool {
        let n = self.nr_kept.load(Ordering::Acquire).min(N);
        self.ranges[..n].iter().any(|(s, e)| {
            let e = e.load(Ordering::Acquire);
            start < e && s.load(Ordering::Relaxed) < end
        })
    }
}

impl<const N: usize> Default for LetGoRanges<N> {
    fn default() -> Self {
        Self::new()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges_past_the_first_n_are_not_kept_and_a_kept_one_overlaps_only_its_neighbours() {
        let t = LetGoRanges::<2>::new();
        assert!(!t.overlaps(0, usize::MAX));
        t.keep(0x1000, 0x2000);
        t.keep(0x8000, 0x1000);
        t.keep(0x20000, 0x1000);
        assert!(t.overlaps(0x2fff, 0x4000));
        assert!(!t.overlaps(0x3000, 0x8000));
        assert!(t.overlaps(0x8fff, 0x9000));
        assert!(!t.overlaps(0x20000, 0x21000), "a third range kept in a table of two");
        t.forget(0x8000, 0x10000);
        assert!(!t.overlaps(0x8fff, 0x9000), "forgotten once unmapped");
        t.forget(0x2000, 0x3000);
        assert!(t.overlaps(0x1000, 0x2000), "a range only partly unmapped is kept");
    }
}
