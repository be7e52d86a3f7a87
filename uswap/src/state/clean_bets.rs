//! Whether a signal-mode read fault maps its page clean: the bet that the page leaves
//! again before it is written, kept while it wins at least three times in four.
//!
//! A page that comes in clean (write-protected, keeping its slot) is dropped by reclaim
//! without being compressed or written again (`swpout_clean`): a round's clean victims
//! leave with one `process_madvise`, one TLB flush for the round, where a dirty victim is
//! compressed and moved out with a flush for its run, which with several threads
//! interrupts every CPU running the program. Its first write costs a write-protect fault
//! (`pgfault_wp`), in signal mode a SIGBUS round trip of a few microseconds and the
//! unprotect's flush. Programs differ: redis-server's GETs read values they never write
//! (0.4 % of its bets lost), and betting it ran at 75-88k GETs a second instead of 45-50k,
//! compressing a sixth of the pages it did; a CPython job writes nearly every object it
//! reads (reference counts) and loses nearly all. In between, pmbench (`-p uniform`, 2 vCPUs,
//! 2026-12-07) lost 9 % of its bets at `-r 80` and 14 % at `-r 50`, and betting still won:
//! at `-r 80` 1.05-1.18x the rate of not betting with one thread, 1.2x with two, 1.7x with
//! four; at `-r 50` 0.99-1.09x with one thread and 1.1-1.2x with two. (Before clean
//! victims were dropped a round at a time, a 3 % bound was right: pmbench `-r 80` ran 10 %
//! slower betting.) So a pager counts its bets in windows of [`WINDOW_BETS`] and keeps
//! betting only while a window loses fewer than [`LOSING_BETS`] (a quarter); otherwise
//! read faults map their pages writable, but one in [`SAMPLE_ONE_IN`], which still bets,
//! so that a later phase of the program that would win turns betting on again within a
//! few thousand faults.
//!
//! Locking: none; atomics updated racily (a bet lost in the window after the one it was
//! placed in counts there). A miscounted window costs speed, never correctness: each
//! fault takes one answer (`swapin`) and maps and publishes its page by it.
//! Async-signal-safe.

use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};

/// Bets a window counts before it decides.
const WINDOW_BETS: u32 = 256;
/// While not betting, one read fault in this many still bets.
const SAMPLE_ONE_IN: u32 = 32;
/// A window that lost this many of its bets or more stops betting.
const LOSING_BETS: u32 = WINDOW_BETS / 4;

/// A pager's bets on clean pages (see the module's comment).
pub(crate) struct CleanBets {
    betting: AtomicBool,
    /// Bets placed, ever (a window ends at each multiple of [`WINDOW_BETS`]).
    placed: AtomicU32,
    /// Bets lost since the last window ended.
    lost: AtomicU32,
    /// Read faults that did not bet, for the one-in-[`SAMPLE_ONE_IN`] sample.
    passed: AtomicU32,
}

impl CleanBets {
    pub(crate) const fn new() -> CleanBets {
        CleanBets {
            betting: AtomicBool::new(true),
            placed: AtomicU32::new(0),
            lost: AtomicU32::new(0),
            passed: AtomicU32::new(0),
        }
    }

    /// Whether this read fault's page comes in clean. Ask once per fault: the answer is
    /// counted as a bet.
    pub(crate) fn place(&self) -> bool {
        if !self.betting.load(Ordering::Relaxed)
            && self.passed.fetch_add(1, Ordering::Relaxed) % SAMPLE_ONE_IN != SAMPLE_ONE_IN - 1
        {
            return false;
        }
        let placed = self.placed.fetch_add(1, Ordering::Relaxed).wrapping_add(1);
        if placed % WINDOW_BETS == 0 {
            let lost = self.lost.swap(0, Ordering::Relaxed);
            self.betting.store(lost < LOSING_BETS, Ordering::Relaxed);
        }
        true
    }

    /// A page a read fault brought in clean was written before it left.
    pub(crate) fn lose(&self) {
        self.lost.fetch_add(1, Ordering::Relaxed);
    }

    /// Whether read faults bet now.
    #[cfg(test)]
    fn betting(&self) -> bool {
        self.betting.load(Ordering::Relaxed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_window_that_loses_a_quarter_of_its_bets_stops_betting_and_a_sample_wins_it_back() {
        let b = CleanBets::new();
        // A window that loses LOSING_BETS.
        for i in 0..WINDOW_BETS {
            assert!(b.place(), "betting in the first window");
            if i < LOSING_BETS {
                b.lose();
            }
        }
        assert!(!b.betting());
        // One read fault in SAMPLE_ONE_IN still bets, and a window of them that wins
        // turns betting back on.
        let mut placed = 0;
        for _ in 0..WINDOW_BETS * SAMPLE_ONE_IN {
            placed += u32::from(b.place());
        }
        assert_eq!(placed, WINDOW_BETS);
        assert!(b.betting());
        // A window that loses fewer keeps betting.
        for i in 0..WINDOW_BETS {
            assert!(b.place());
            if i + 1 < LOSING_BETS {
                b.lose();
            }
        }
        assert!(b.betting());
    }
}
