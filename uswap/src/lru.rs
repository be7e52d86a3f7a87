//! The LRU: the resident pages reclaim picks its victims from, oldest first.
//!
//! Resident pages sit in a FIFO (`active`) in the order they came in. Pages a stream brought
//! in (a readahead window, a first-touch fault-around) sit in a FIFO of their own
//! (`streamed`) that reclaim takes first, down to a reserve for the windows streams are
//! working through (`limit / 16`, while streams run): the kernel's use-once rule, which keeps
//! a sequential scan from pushing out the pages of everything else. User space sees no
//! accessed bits, so whether a page was used again is not known; that it came in as part of
//! a stream is. A page that faults back from the swap cache is marked referenced and spared
//! once when it next reaches the head of a FIFO (second chance, in `swapout`; a streamed page
//! so spared moves to `active`). Staged pages wait on the swap cache's own queue
//! (`crate::swap::SwapCache`), not here.
//!
//! A page that faults back from a device is marked referenced too when its refault
//! distance says it belongs to the working set (the kernel's `workingset_refault`,
//! mm/workingset.c): the pages that left after it ([`Lru::note_evicted`]'s clock, read
//! into its slot's stamp when it left) are no more than the pages on the LRU, so it would
//! have stayed had there been room for that many more. What this protects is the pages a
//! program uses often but not in order, which a FIFO evicts as readily as the pages it
//! used once: a server's index pages among its values (each lookup reads one of each).
//!
//! How many of the pages reclaim staged fault back from the swap cache (the kernel's
//! refault signal, over a window of recent stagings: [`Lru::note_staged`],
//! [`Lru::note_returned`]) tells whether the FIFO's head holds cold pages. While it does,
//! a victim takes its dirty neighbours along (`reclaim::swapout`, one TLB flush for the
//! run); while most staged pages come back, the victims are pages in use (an order the
//! FIFO has not sorted yet, such as a program's hot rows loaded first), their neighbours
//! likely too, and each victim goes alone ([`Lru::victims_are_cold`]).
//!
//! Locking: none; the FIFOs are lock-free rings ([`Fifo`]) that allocate nothing, so a
//! SIGBUS handler may queue a page; the refault window is two relaxed counters, racy on
//! purpose (a count lost when the window halves changes a heuristic, nothing else); the
//! eviction clock is one atomic counter that wraps (distances are taken modulo 2^32).
//! Invariants: an entry is a packed [`PageRef`] with the page's generation when queued, so
//! an entry left behind by a page that moved on since is recognised (and dropped) when
//! popped; a resident page has at most one live entry, or none after a full FIFO refused it
//! (counted in `lru_overflow`, and found again by `reclaim::swapout`'s scan).

use std::sync::atomic::{AtomicU32, AtomicU64, AtomicUsize, Ordering};

use crate::fifo::Fifo;
use crate::page_table::PageRef;
use crate::stats::{Counter, PerCpuStats};

/// Which FIFO a page was popped from (and may go back to).
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum List {
    Active,
    Streamed,
}

pub(crate) struct Lru {
    /// Resident pages, oldest first (packed `PageRef`s).
    active: Fifo,
    /// Resident pages a stream brought in (read ahead, or faulted around on first touch),
    /// oldest first: used once, so reclaimed before `active`.
    streamed: Fifo,
    /// Reclaim rounds left during which `streamed` keeps its reserve: reset by every page
    /// queued there, counted down by every round (see [`Lru::streamed_reserve`]).
    streamed_rounds_left: AtomicUsize,
    /// Pages reclaim staged, and those of them that faulted back, over the last
    /// [`REFAULT_WINDOW_PAGES`] or so stagings (both halve when the window fills).
    staged_window: AtomicUsize,
    returned_window: AtomicUsize,
    /// Pages that left their regions by reclaim or aging, wrapping: the eviction clock
    /// (the kernel's `nonresident_age`).
    evictions: AtomicU32,
    /// When a scan of the pager's pages last found every resident page locked by the
    /// program (`reclaim::swapout`), in `clock::now_ns`; 0: never.
    all_locked_at_ns: AtomicU64,
}

/// How long a scan's finding that every resident page is locked holds while the LRU stays
/// empty: each charge over the limit scanned the pager's touched pages again, N pages
/// locked over the limit cost N scans.
const ALL_LOCKED_FRESH_NS: u64 = 20_000_000;

/// Stagings the refault ratio is taken over: about a second of heavy reclaim.
const REFAULT_WINDOW_PAGES: usize = 4096;

/// Reclaim rounds a reserve outlives the last page queued as a stream's.
const STREAMED_RESERVE_ROUNDS: usize = 64;

impl Lru {
    pub fn new(active: Fifo, streamed: Fifo) -> Lru {
        Lru {
            active,
            streamed,
            streamed_rounds_left: AtomicUsize::new(0),
            staged_window: AtomicUsize::new(0),
            returned_window: AtomicUsize::new(0),
            evictions: AtomicU32::new(0),
            all_locked_at_ns: AtomicU64::new(0),
        }
    }

    /// A scan found every resident page locked (see `all_locked_at_ns`).
    pub fn note_all_locked(&self) {
        self.all_locked_at_ns.store(crate::clock::now_ns(), Ordering::Relaxed);
    }

    /// Ends the finding of [`Lru::note_all_locked`] (pages were unlocked).
    pub fn forget_all_locked(&self) {
        self.all_locked_at_ns.store(0, Ordering::Relaxed);
    }

    /// Whether a scan found every resident page locked within the last
    /// [`ALL_LOCKED_FRESH_NS`] (the caller found the LRU empty since).
    pub fn all_locked_recently(&self) -> bool {
        let at = self.all_locked_at_ns.load(Ordering::Relaxed);
        at != 0 && crate::clock::now_ns().saturating_sub(at) < ALL_LOCKED_FRESH_NS
    }

    /// `n` pages leave their regions: advances the eviction clock. Returns the reading to
    /// stamp them with.
    pub fn note_evicted(&self, n: usize) -> u32 {
        self.evictions.fetch_add(n as u32, Ordering::Relaxed).wrapping_add(n as u32)
    }

    /// Whether a page that left when the eviction clock read `left_at` and faults back now
    /// belongs to the working set: the pages that left after it are no more than those on
    /// the LRU (its refault distance; the kernel compares it with its LRUs' size too).
    pub fn refault_in_workingset(&self, left_at: u32) -> bool {
        let distance = self.evictions.load(Ordering::Relaxed).wrapping_sub(left_at);
        (distance as usize) <= self.active.len() + self.streamed.len()
    }

    /// Reclaim staged `n` pages (victims and the neighbours they took).
    pub fn note_staged(&self, n: usize) {
        let staged = self.staged_window.fetch_add(n, Ordering::Relaxed) + n;
        if staged >= REFAULT_WINDOW_PAGES {
            self.staged_window.store(staged / 2, Ordering::Relaxed);
            let returned = self.returned_window.load(Ordering::Relaxed);
            self.returned_window.store(returned / 2, Ordering::Relaxed);
        }
    }

    /// A page reclaim staged faulted back from the swap cache.
    pub fn note_returned(&self) {
        self.returned_window.fetch_add(1, Ordering::Relaxed);
    }

    /// Whether at most half the pages reclaim staged lately faulted back: its victims are
    /// cold, and so, likely, are their neighbours. True before any staging.
    pub fn victims_are_cold(&self) -> bool {
        2 * self.returned_window.load(Ordering::Relaxed) <= self.staged_window.load(Ordering::Relaxed)
    }

    /// Queues a page that just became resident at the tail of the FIFO.
    pub fn add(&self, r: PageRef, stats: &PerCpuStats) {
        if self.active.push(r.pack()).is_err() {
            stats.inc(Counter::LruOverflow);
        }
    }

    /// Queues a page a stream brought in at the tail of the use-once FIFO (the other FIFO if
    /// that one is full).
    pub fn add_streamed(&self, r: PageRef, stats: &PerCpuStats) {
        // A load first: the common case writes nothing, so CPUs do not bounce the line.
        if self.streamed_rounds_left.load(Ordering::Relaxed) < STREAMED_RESERVE_ROUNDS {
            self.streamed_rounds_left.store(STREAMED_RESERVE_ROUNDS, Ordering::Relaxed);
        }
        if let Err(v) = self.streamed.push(r.pack()) {
            if self.active.push(v).is_err() {
                stats.inc(Counter::LruOverflow);
            }
        }
    }

    /// Queues a page a swap-in or fault-around of `nr_pages` (the faulting page among them)
    /// just mapped. A stream's pages go on the use-once FIFO: its readahead pages always, the
    /// faulting page too once the window shows a stream (the size rule gives 4 pages or more
    /// only after hits). Others go on `active`.
    pub fn add_mapped(&self, r: PageRef, faulting: bool, nr_pages: usize, stats: &PerCpuStats) {
        if !faulting || nr_pages >= 4 {
            self.add_streamed(r, stats);
        } else {
            self.add(r, stats);
        }
    }

    /// Puts a popped page back on the FIFO it came from (busy, or not taken this round).
    pub fn requeue(&self, list: List, r: PageRef, stats: &PerCpuStats) {
        match list {
            List::Streamed => self.add_streamed(r, stats),
            List::Active => self.add(r, stats),
        }
    }

    /// Pages of the use-once FIFO that reclaim leaves alone while it can take others: `limit
    /// / 16`, at least four maximum windows, while streams are running (a page was queued
    /// there within the last `STREAMED_RESERVE_ROUNDS` rounds); afterwards none, so the last
    /// pages of a finished stream do not sit in memory while everything else is reclaimed.
    /// Called once per round: counts the round.
    pub fn streamed_reserve(&self, limit_pages: usize, readahead_max_pages: usize) -> usize {
        let left = self.streamed_rounds_left.load(Ordering::Relaxed);
        if left == 0 {
            return 0;
        }
        // Racy on purpose: a lost decrement only keeps the reserve a round longer.
        self.streamed_rounds_left.store(left - 1, Ordering::Relaxed);
        (limit_pages / 16).max(4 * readahead_max_pages)
    }

    /// The oldest page of the use-once FIFO while it holds more than `reserve`, else of
    /// `active`; either, if the other is empty.
    pub fn pop(&self, reserve: usize) -> Option<(u64, List)> {
        let streamed = || self.streamed.pop().map(|v| (v, List::Streamed));
        let active = || self.active.pop().map(|v| (v, List::Active));
        if self.streamed.len() > reserve {
            streamed().or_else(active)
        } else {
            active().or_else(streamed)
        }
    }

    /// Entries on both FIFOs (stale ones included).
    pub fn len(&self) -> usize {
        self.active.len() + self.streamed.len()
    }

    pub fn is_empty(&self) -> bool {
        self.active.is_empty() && self.streamed.is_empty()
    }

    /// Queues `r` on `active` without counting an overflow; false when it is full (a scan
    /// that refills the FIFO stops there).
    pub fn try_add(&self, r: PageRef) -> bool {
        self.active.push(r.pack()).is_ok()
    }

    /// Entries `active` holds at most.
    pub fn active_capacity(&self) -> usize {
        self.active.capacity()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lru() -> Lru {
        Lru::new(Fifo::new(64).unwrap(), Fifo::new(64).unwrap())
    }

    #[test]
    fn victims_count_as_cold_until_most_staged_pages_come_back() {
        let l = lru();
        assert!(l.victims_are_cold(), "before any staging");
        l.note_staged(100);
        (0..50).for_each(|_| l.note_returned());
        assert!(l.victims_are_cold(), "half came back");
        l.note_returned();
        assert!(!l.victims_are_cold(), "more than half came back");
        // Pages staged since that stay out open it again.
        l.note_staged(10);
        assert!(l.victims_are_cold());
    }

    #[test]
    fn the_window_forgets_old_stagings() {
        let l = lru();
        l.note_staged(REFAULT_WINDOW_PAGES - 1);
        (0..REFAULT_WINDOW_PAGES).for_each(|_| l.note_returned());
        assert!(!l.victims_are_cold());
        // A window's worth of stagings that stay out: the old returns weigh a quarter.
        for _ in 0..4 {
            l.note_staged(REFAULT_WINDOW_PAGES / 2);
        }
        assert!(l.victims_are_cold(), "{:?}", (l.staged_window, l.returned_window));
        assert!(l.staged_window.load(Ordering::Relaxed) < 2 * REFAULT_WINDOW_PAGES, "bounded");
    }

    #[test]
    fn a_refault_is_in_the_working_set_while_its_distance_fits_the_lru() {
        let l = lru();
        let stats = PerCpuStats::new(1);
        for page in 0..10 {
            l.add(PageRef { region_idx: 0, region_gen: 0, page_gen: 0, page }, &stats);
        }
        let left_at = l.note_evicted(1);
        assert!(l.refault_in_workingset(left_at), "nothing left after it");
        l.note_evicted(10);
        assert!(l.refault_in_workingset(left_at), "10 left after it, 10 on the LRU");
        l.note_evicted(1);
        assert!(!l.refault_in_workingset(left_at), "11 left after it");
        // The clock wraps; distances do not.
        l.evictions.store(u32::MAX - 2, Ordering::Relaxed);
        let left_at = l.note_evicted(1);
        l.note_evicted(5);
        assert!(l.refault_in_workingset(left_at));
        l.note_evicted(6);
        assert!(!l.refault_in_workingset(left_at));
    }
}
