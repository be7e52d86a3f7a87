//! Idle ages: how long each page out of its region has been untouched, and how many pages
//! have been untouched for at least 1 s, 10 s, 1 min and 10 min.
//!
//! User space sees no accessed bits. What it does see is a page leave its region (reclaim,
//! or the aging scan of `crate::reclaim::aging`, moves it to the swap cache or drops it) and
//! come back (a fault). A page out of its region is untouched since it left: its slot is
//! stamped with that moment (an [`Epoch`]), and the stamp goes when the slot is freed or
//! the page is mapped again while keeping its slot (a clean page). Every stamp is also
//! counted in [`IdleAges`], a ring of counters, one per epoch of the last
//! [`RING_EPOCHS`]; epochs older than [`FOLD_AGE_EPOCHS`] are folded into one counter, which
//! covers the 10 min bucket. The histogram is then a sum over at most the ring's counters,
//! with no scan of the pages.
//!
//! Locking: none; atomics, and nothing allocated (a SIGBUS handler frees slots). The fold
//! runs in one thread at a time (a flag taken with a compare-and-swap).
//!
//! The ring relies on being folded more often than every 224 s (its length less the fold
//! age; the background reclaimer folds at least every 100 ms): a stamp whose counter still
//! holds an epoch not yet folded would be folded with it, into `older`.
//!
//! Invariant: the ring's counters plus `older` equal the stamps in the table. Which counter
//! holds a page may be off for a stamp removed while its epoch was being folded (it is taken
//! from the ring after the fold read it): the sum stays exact, and the ring counter's
//! residue joins `older` when that counter's next epoch is folded.

use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, Ordering};

/// Length of an epoch, the histogram's resolution.
pub const EPOCH_MS: u64 = 250;
/// Epochs per second.
const EPOCHS_PER_S: u64 = 1000 / EPOCH_MS;
/// Epochs the ring counts one by one (1,024 s).
pub const RING_EPOCHS: usize = 4096;
/// Epochs this old are folded into one counter: past the 10 min bucket, and far enough from
/// the ring's wrap (1,024 s) that a late fold never meets an epoch being stamped.
const FOLD_AGE_EPOCHS: u64 = 800 * EPOCHS_PER_S;
const _: () = assert!(FOLD_AGE_EPOCHS + 60 * EPOCHS_PER_S < RING_EPOCHS as u64);

/// The ages the histogram reports, in seconds (`uswap stat`'s buckets).
pub const IDLE_BUCKETS_S: [u64; 4] = [1, 10, 60, 600];
const _: () = assert!(IDLE_BUCKETS_S[3] * EPOCHS_PER_S < FOLD_AGE_EPOCHS);

/// A moment, in epochs of the monotonic clock (never 0: 0 means "no stamp").
pub type Epoch = u64;

/// The epoch of now.
pub fn now_epoch() -> Epoch {
    epoch_of_ns(crate::clock::now_ns())
}

/// The epoch of a monotonic time in nanoseconds. Past 34 years of the monotonic clock (only
/// a time namespace's offset gets there) the last one a stamp holds ([`Stamp::new`]): ages
/// then stop growing, and no page counts as idle, rather than every one.
pub fn epoch_of_ns(ns: u64) -> Epoch {
    (ns / (EPOCH_MS * 1_000_000) + 1).min(u64::from(u32::MAX))
}

/// Epochs in `secs` seconds.
pub fn epochs_of_secs(secs: u64) -> u64 {
    secs * EPOCHS_PER_S
}

/// What a slot's stamp says of its page's leaving: the epoch (for the idle ages) and the
/// reading of its pager's eviction clock (for the refault distance, `crate::lru`). Stored as
/// one word, the epoch in the low 32 bits (34 years of 250 ms epochs), the clock above.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Stamp {
    pub epoch: Epoch,
    pub eviction: u32,
}

impl Stamp {
    pub fn new(epoch: Epoch, eviction: u32) -> Stamp {
        assert!(epoch != 0, "epoch 0 is no stamp");
        // Past 34 years of the monotonic clock the last epoch (see `epoch_of_ns`): idle
        // ages are wrong there, but a fault never ends the program.
        Stamp { epoch: epoch.min(u64::from(u32::MAX)), eviction }
    }

    /// The word a slot stores: never 0 (an epoch is never 0).
    pub fn pack(self) -> u64 {
        self.epoch | u64::from(self.eviction) << 32
    }

    /// The stamp of a stored word; `None` for 0, no stamp.
    pub fn unpack(word: u64) -> Option<Stamp> {
        let epoch = word & u64::from(u32::MAX);
        (epoch != 0).then_some(Stamp { epoch, eviction: (word >> 32) as u32 })
    }
}

/// Pages out of their regions counted by the epoch they left in.
pub struct IdleAges {
    ring: Box<[AtomicI64]>,
    /// Pages stamped in epochs before `folded_to`.
    older: AtomicI64,
    /// Every epoch before this one is folded into `older`.
    folded_to: AtomicU64,
    folding: AtomicBool,
}

impl Default for IdleAges {
    fn default() -> Self {
        IdleAges::new()
    }
}

impl IdleAges {
    pub fn new() -> IdleAges {
        let ring = (0..RING_EPOCHS).map(|_| AtomicI64::new(0)).collect();
        let first = now_epoch().saturating_sub(FOLD_AGE_EPOCHS);
        IdleAges { ring, older: AtomicI64::new(0), folded_to: AtomicU64::new(first), folding: AtomicBool::new(false) }
    }

    fn counter(&self, e: Epoch) -> &AtomicI64 {
        &self.ring[(e % RING_EPOCHS as u64) as usize]
    }

    /// A page left its region in epoch `e`.
    pub fn add(&self, e: Epoch) {
        debug_assert!(e != 0);
        self.count(e, 1);
    }

    /// A page stamped with `e` came back, or its slot went.
    pub fn remove(&self, e: Epoch) {
        debug_assert!(e != 0);
        self.count(e, -1);
    }

    fn count(&self, e: Epoch, n: i64) {
        if e < self.folded_to.load(Ordering::SeqCst) {
            self.older.fetch_add(n, Ordering::Relaxed);
        } else {
            self.counter(e).fetch_add(n, Ordering::Relaxed);
        }
    }

    /// Folds the epochs older than [`FOLD_AGE_EPOCHS`] into one counter. Cheap (nothing
    /// to do most calls); any thread, one at a time (others return at once).
    pub fn fold(&self, now: Epoch) {
        if self.folding.swap(true, Ordering::Acquire) {
            return;
        }
        let to = now.saturating_sub(FOLD_AGE_EPOCHS);
        let mut e = self.folded_to.load(Ordering::SeqCst);
        // Bounded: a fold late by more than the ring's length folds the ring once (every
        // counter is then older than the fold age).
        e = e.max(to.saturating_sub(RING_EPOCHS as u64));
        while e < to {
            self.folded_to.store(e + 1, Ordering::SeqCst);
            let n = self.counter(e).swap(0, Ordering::SeqCst);
            self.older.fetch_add(n, Ordering::Relaxed);
            e += 1;
        }
        self.folding.store(false, Ordering::Release);
    }

    /// Pages untouched for at least each of [`IDLE_BUCKETS_S`], at `now`.
    pub fn histogram(&self, now: Epoch) -> [u64; 4] {
        self.fold(now);
        let mut out = [0i64; 4];
        let older = self.older.load(Ordering::Relaxed);
        let from = self.folded_to.load(Ordering::SeqCst);
        // Youngest first: each epoch counts in every bucket its age reaches.
        for e in (from..=now).rev() {
            let age = now - e;
            let n = self.counter(e).load(Ordering::Relaxed);
            for (k, &s) in IDLE_BUCKETS_S.iter().enumerate() {
                if age >= epochs_of_secs(s) {
                    out[k] += n;
                }
            }
        }
        out.map(|n| (n + older).max(0) as u64)
    }

    /// Pages stamped, in all.
    #[cfg(test)]
    pub fn total(&self) -> u64 {
        let ring: i64 = self.ring.iter().map(|c| c.load(Ordering::Relaxed)).sum();
        (ring + self.older.load(Ordering::Relaxed)).max(0) as u64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_count_each_page_by_its_age() {
        let a = IdleAges::new();
        let now = now_epoch();
        a.add(now); // 0 s
        a.add(now - epochs_of_secs(2)); // 2 s
        a.add(now - epochs_of_secs(30)); // 30 s
        a.add(now - epochs_of_secs(100)); // 100 s
        a.add(now - epochs_of_secs(700)); // 700 s
        assert_eq!(a.histogram(now), [4, 3, 2, 1]);
        a.remove(now - epochs_of_secs(2));
        assert_eq!(a.histogram(now), [3, 3, 2, 1]);
        assert_eq!(a.total(), 4);
    }

    #[test]
    fn folded_epochs_stay_counted_and_come_out_exactly() {
        let a = IdleAges::new();
        let start = now_epoch();
        a.add(start);
        a.add(start + 1);
        // Twenty minutes later, three times over the ring: folded, still counted. (The
        // background reclaimer folds every few milliseconds: before any stamp of `now`.)
        for k in 1..=3 {
            let now = start + k * epochs_of_secs(1200);
            a.fold(now);
            a.add(now);
            assert_eq!(a.histogram(now), [k + 1, k + 1, k + 1, k + 1], "round {k}");
            assert_eq!(a.histogram(now + epochs_of_secs(1))[0], k + 2);
        }
        a.remove(start);
        a.remove(start + 1);
        assert_eq!(a.total(), 3);
        // The last one is 400 s old.
        assert_eq!(a.histogram(start + epochs_of_secs(4000)), [3, 3, 3, 2]);
    }

    #[test]
    fn a_remove_during_a_fold_keeps_the_sum() {
        let a = std::sync::Arc::new(IdleAges::new());
        let start = now_epoch();
        for e in start..start + 2000 {
            a.add(e);
        }
        let b = a.clone();
        let t = std::thread::spawn(move || {
            for e in start..start + 2000 {
                b.remove(e);
            }
        });
        for k in 0..2000 {
            a.fold(start + FOLD_AGE_EPOCHS + k);
        }
        t.join().unwrap();
        assert_eq!(a.total(), 0);
    }
}
