//! Memory pressure: how much of the wall time a program's threads spend stalled on memory,
//! per pager and per `uswap run` tree, as the kernel's pressure stall information (PSI)
//! reports it for a cgroup's `memory.pressure`.
//!
//! # What counts
//!
//! A thread stalls on memory while its fault waits for a device (a swap-in, with its
//! readahead window), for a page on its way out (a swap-cache hit, unless the aging scan
//! staged the page only to see whether it is used: `crate::reclaim::aging`), or for room
//! under the limit (direct reclaim). Zero-fill faults and write-protect faults are not stalls: a
//! program that allocates pays them with or without a limit, as PSI does not count page
//! allocation either. The figure is PSI's *some*: the share of wall time during which at
//! least one thread stalled, so eight threads stalled at once for a second count one
//! second, not eight.
//!
//! # How
//!
//! [`StallClock`] keeps the number of threads stalled now and since when at least one has
//! been, in one atomic word (`since_us << 16 | nr_stalled`), so that the first thread to
//! stall and the last to stop agree on the interval: the last adds it to the total. A stall
//! may begin before the clock hears of it (a major fault's trap and signal,
//! [`MAJOR_FAULT_UNSEEN_US`]), but never before the last one ended, so the total stays a
//! union no longer than the wall time (a program that does nothing but fault stalls 100 %
//! of the time, not more). A
//! [`StallGuard`] holds a stall on the pager's clock and, under `uswap run`, on the tree's
//! (in the shared charge segment: a union across processes, since every process reads the
//! same monotonic clock). [`StallAverages`] turns the total into PSI's running averages over
//! 10 s, 60 s and 300 s, sampled every [`SAMPLE_PERIOD_US`] (PSI's own period) by the
//! background reclaimer.
//!
//! Locking: none; compare-and-swap loops that allocate nothing, so a SIGBUS handler may
//! stall and unstall. Invariants: `nr_stalled` is the number of live guards on the clock;
//! `since_us` is meaningful only while it is not zero; `total_us(now)` grows by at most the
//! wall time that passes (up to the few microseconds by which two threads' reads of the
//! clock may disagree).

use std::sync::atomic::{AtomicU64, Ordering};

/// How often the averages are brought up to date (PSI's `PSI_FREQ`: 2 s).
pub const SAMPLE_PERIOD_US: u64 = 2_000_000;
/// The windows of the running averages, as PSI's `avg10`, `avg60`, `avg300`.
pub const WINDOWS_S: [u64; 3] = [10, 60, 300];

const COUNT_BITS: u32 = 16;
const COUNT_MASK: u64 = (1 << COUNT_BITS) - 1;

/// Microseconds on the monotonic clock, the same in every process of the machine.
pub fn now_us() -> u64 {
    crate::clock::now_ns() / 1000
}

/// Stall time: the union of the intervals during which some thread stalled.
#[repr(C)]
#[derive(Debug, Default)]
pub struct StallClock {
    /// `since_us << 16 | nr_stalled`.
    state: AtomicU64,
    /// Microseconds of stall that ended.
    total_us: AtomicU64,
    /// The latest end of a stall: where the next may begin at the earliest.
    last_end_us: AtomicU64,
}

impl StallClock {
    pub const fn new() -> StallClock {
        StallClock { state: AtomicU64::new(0), total_us: AtomicU64::new(0), last_end_us: AtomicU64::new(0) }
    }

    /// A thread stalls from `now_us`, or `unseen_us` earlier when no other thread stalls and
    /// the last stall ended before that (see the module's "How").
    fn enter(&self, now_us: u64, unseen_us: u64) {
        let mut s = self.state.load(Ordering::Acquire);
        // Lock-free: each retry means another thread's exchange succeeded.
        loop {
            let n = s & COUNT_MASK;
            assert!(n < COUNT_MASK, "uswap invariant: more than 65535 threads stalled at once");
            let new = if n == 0 {
                // Read after `s`: the thread whose exchange made it 0 raised `last_end_us`
                // before, so this stall cannot begin inside the one that just ended.
                let last_end_us = self.last_end_us.load(Ordering::Acquire);
                now_us.saturating_sub(unseen_us).max(last_end_us).min(now_us) << COUNT_BITS | 1
            } else {
                s + 1
            };
            match self.state.compare_exchange_weak(s, new, Ordering::AcqRel, Ordering::Acquire) {
                Ok(_) => return,
                Err(cur) => s = cur,
            }
        }
    }

    /// A thread stops stalling at `now_us`; the last one adds the interval to the total.
    fn leave(&self, now_us: u64) {
        // Before the exchange: a thread that stalls next, once it is made, must see it.
        self.last_end_us.fetch_max(now_us, Ordering::AcqRel);
        let mut s = self.state.load(Ordering::Relaxed);
        // Lock-free, as in `enter`.
        loop {
            let n = s & COUNT_MASK;
            assert!(n > 0, "uswap invariant: a stall ended that had not begun");
            let new = if n == 1 { 0 } else { s - 1 };
            match self.state.compare_exchange_weak(s, new, Ordering::AcqRel, Ordering::Relaxed) {
                Ok(_) => break,
                Err(cur) => s = cur,
            }
        }
        if s & COUNT_MASK == 1 {
            self.total_us.fetch_add(now_us.saturating_sub(s >> COUNT_BITS), Ordering::Relaxed);
        }
    }

    /// Microseconds of stall up to `now_us`, the one under way included.
    pub fn total_us(&self, now_us: u64) -> u64 {
        let s = self.state.load(Ordering::Acquire);
        let ongoing = if s & COUNT_MASK == 0 { 0 } else { now_us.saturating_sub(s >> COUNT_BITS) };
        self.total_us.load(Ordering::Relaxed) + ongoing
    }
}

/// A stall on a pager's clock and, if the pager shares a tree's limit, on the tree's.
/// Ends when dropped.
#[must_use]
pub struct StallGuard<'a> {
    clocks: [Option<&'a StallClock>; 2],
}

/// What a major fault costs the program beyond the service the clock times: the trap and the
/// signal (or the wake-ups) that bring the fault to the engine and back, and the TLB
/// shootdown that the page reclaimed to make room for it sends to the program's CPUs. Here,
/// a signal-mode fault took 5.5 us of which the service is about 1.5 (docs/design.md), a
/// major fault came with 1.2 shootdowns, each 10 us or more with the program's other CPU
/// interrupted; a CPython job faulting 7,000 times a second ran 15 % slower while its clock
/// saw 1.2 % (1.7 us a fault). A major fault's stall begins this much before the clock
/// hears of it, so that the automatic budget's target means what it says: the share of
/// time a program loses to its limit. Not before the last stall ended, though: a program
/// that faults back to back (a thrashing loop, 5 us a fault) stalls all its time, not
/// three times it (as when this was added to the total on its own).
pub const MAJOR_FAULT_UNSEEN_US: u64 = 15;

impl<'a> StallGuard<'a> {
    /// A stall from now.
    pub fn new(own: &'a StallClock, tree: Option<&'a StallClock>) -> StallGuard<'a> {
        Self::since_unseen(own, tree, 0)
    }

    /// A stall that began up to `unseen_us` ago, where the clock could not time it (see
    /// [`MAJOR_FAULT_UNSEEN_US`]).
    pub fn since_unseen(own: &'a StallClock, tree: Option<&'a StallClock>, unseen_us: u64) -> StallGuard<'a> {
        let now = now_us();
        own.enter(now, unseen_us);
        if let Some(t) = tree {
            t.enter(now, unseen_us);
        }
        StallGuard { clocks: [Some(own), tree] }
    }
}

impl Drop for StallGuard<'_> {
    fn drop(&mut self) {
        let now = now_us();
        for c in self.clocks.iter().flatten() {
            c.leave(now);
        }
    }
}

/// PSI's running averages of the stall share, in percent of wall time, each an exponential
/// moving average over its window ([`WINDOWS_S`]), brought up to date by [`sample`](Self::sample).
#[derive(Debug, Default)]
pub struct StallAverages {
    /// When the last sample was taken, and the total then (0 before the first).
    last_us: AtomicU64,
    last_total_us: AtomicU64,
    /// The averages, as `f64` bits.
    avgs: [AtomicU64; 3],
}

impl StallAverages {
    /// Takes a sample if [`SAMPLE_PERIOD_US`] has passed since the last: the share of the
    /// time since then that `clock` stalled, folded into each average. One caller at a time
    /// (the background reclaimer). Returns the share (0..=1) when it sampled.
    pub fn sample(&self, clock: &StallClock, now_us: u64) -> Option<f64> {
        let last = self.last_us.load(Ordering::Relaxed);
        let total = clock.total_us(now_us);
        if last == 0 {
            self.last_us.store(now_us, Ordering::Relaxed);
            self.last_total_us.store(total, Ordering::Relaxed);
            return None;
        }
        let elapsed = now_us.saturating_sub(last);
        if elapsed < SAMPLE_PERIOD_US {
            return None;
        }
        let stalled = total.saturating_sub(self.last_total_us.load(Ordering::Relaxed));
        let share = (stalled as f64 / elapsed as f64).min(1.0);
        for (avg, window_s) in self.avgs.iter().zip(WINDOWS_S) {
            let decay = exp_neg(elapsed as f64 / (window_s as f64 * 1e6));
            let old = f64::from_bits(avg.load(Ordering::Relaxed));
            avg.store((old * decay + share * 100.0 * (1.0 - decay)).to_bits(), Ordering::Relaxed);
        }
        self.last_us.store(now_us, Ordering::Relaxed);
        self.last_total_us.store(total, Ordering::Relaxed);
        Some(share)
    }

    /// `avg10`, `avg60`, `avg300`, in percent.
    pub fn averages(&self) -> [f64; 3] {
        [0, 1, 2].map(|i| f64::from_bits(self.avgs[i].load(Ordering::Relaxed)))
    }
}

/// `e^-x`, for `x >= 0`, as `(e^-(x/2^k))^(2^k)` with `x/2^k <= 1/32` taken from seven
/// terms of its series (relative error under 1e-10 where the result is a normal number);
/// 0 from where `e^-x` underflows (745), and for a NaN. Not `f64::exp`: that is the C
/// library's `libm`, a library every process of a run would load at `execve` for this one
/// function.
fn exp_neg(x: f64) -> f64 {
    debug_assert!(x.is_nan() || x >= 0.0, "a decay's exponent: {x}");
    if x.is_nan() || x >= 745.2 {
        return 0.0;
    }
    let (mut y, mut halvings) = (x, 0);
    // Bounded: x < 745.2 takes at most 15 halvings to reach 1/32.
    while y > 1.0 / 32.0 {
        y /= 2.0;
        halvings += 1;
    }
    let series =
        |y: f64| 1.0 - y * (1.0 - y / 2.0 * (1.0 - y / 3.0 * (1.0 - y / 4.0 * (1.0 - y / 5.0 * (1.0 - y / 6.0)))));
    let mut e = series(y);
    for _ in 0..halvings {
        e *= e;
    }
    e
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exp_neg_is_the_exponential() {
        for x in [0.0, 1e-9, 0.01, 0.2, 1.0 / 30.0, 1.0, 6.0, 100.0, 256.0, 512.0, 700.0] {
            let (got, want) = (exp_neg(x), (-x).exp());
            assert!(want > 0.0 && (got - want).abs() <= want * 1e-10, "e^-{x}: {got} against {want}");
        }
        for x in [745.2, 1e12, f64::INFINITY, f64::NAN] {
            assert_eq!(exp_neg(x), 0.0, "e^-{x} underflows to nothing");
        }
    }

    #[test]
    fn overlapping_stalls_count_once_and_nested_ones_too() {
        let c = StallClock::new();
        c.enter(100, 0);
        c.enter(150, 0); // a second thread, inside the first's stall
        c.leave(180);
        assert_eq!(c.total_us(190), 90, "the stall under way counts up to now");
        c.leave(200);
        assert_eq!(c.total_us(1000), 100);
        c.enter(300, 0);
        c.leave(310);
        assert_eq!(c.total_us(1000), 110);
    }

    #[test]
    fn unseen_time_extends_a_stall_back_but_not_over_the_last() {
        let c = StallClock::new();
        c.enter(1000, 15);
        c.leave(1005);
        assert_eq!(c.total_us(2000), 20, "5 us timed and 15 before it");
        // Back to back, as a thrashing loop faults: 5 us apart, each 5 us long.
        for k in 0..100 {
            let t = 1010 + k * 10;
            c.enter(t, 15);
            c.leave(t + 5);
        }
        assert_eq!(c.total_us(3000), 2005 - 985, "all the wall time from 985 to 2005, no more");
        c.enter(5000, 0);
        c.enter(5001, 15); // a second thread: the stall under way already covers it
        c.leave(5002);
        c.leave(5003);
        assert_eq!(c.total_us(6000), 1020 + 3);
    }

    #[test]
    fn threads_stalling_at_random_add_up_to_the_union() {
        let c = StallClock::new();
        std::thread::scope(|s| {
            for _ in 0..4 {
                s.spawn(|| {
                    for _ in 0..2000 {
                        let _g = StallGuard::new(&c, None);
                        std::hint::spin_loop();
                    }
                });
            }
        });
        let now = now_us();
        assert_eq!(c.state.load(Ordering::Relaxed) & COUNT_MASK, 0, "every stall ended");
        assert!(c.total_us(now) <= now, "a union is no longer than the time");
    }

    #[test]
    fn averages_follow_the_share_as_psi_does() {
        let (c, a) = (StallClock::new(), StallAverages::default());
        assert_eq!(a.sample(&c, 1_000_000), None, "the first call only starts the clock");
        // Stalled half of every period for 60 s.
        let mut t = 1_000_000;
        for _ in 0..30 {
            c.enter(t, 0);
            c.leave(t + SAMPLE_PERIOD_US / 2);
            t += SAMPLE_PERIOD_US;
            assert_eq!(a.sample(&c, t), Some(0.5));
        }
        let [avg10, avg60, avg300] = a.averages();
        assert!((avg10 - 50.0 * (1.0 - (-6.0f64).exp())).abs() < 0.01, "avg10 has settled: {avg10}");
        assert!((avg60 - 50.0 * (1.0 - (-1.0f64).exp())).abs() < 0.5, "avg60 after one window: {avg60}");
        assert!(avg300 < avg60 && avg300 > 5.0, "{avg300}");
        assert_eq!(a.sample(&c, t + 1), None, "not before a period has passed");
    }
}
