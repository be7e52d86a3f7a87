//! Readahead: per-region (VMA-style) windows of pages brought in by one fault.
//!
//! A fault costs 5–80 µs here (DESIGN.md), so a fault that brings in many pages is the
//! biggest lever on throughput. Each region keeps a few recent *streams* (the kernel keeps
//! one per VMA; several let threads scanning different parts of a region, or a sequential
//! scan mixed with random faults, be told apart). For a fault at page `p` a stream gives the
//! window of pages to bring in with it:
//!
//! * **size**, after the kernel's `__swapin_nr_pages`: `hits + 2` rounded up to a power of two
//!   (at least 4) when the stream's last window was used; 2 when the fault is adjacent to the
//!   stream's last page; otherwise 1. Never more than the maximum, and never less than half
//!   the previous window, so it shrinks gradually when read-ahead pages go unused;
//! * **placement**: forward from `p` when the fault follows the stream's last window,
//!   backward when it precedes it, centred on `p` otherwise; clamped to the region.
//!
//! Where this differs from the kernel, and why: the kernel stages read-ahead pages in the
//! swap cache, and a later fault that finds one there is a *hit*. Here read-ahead pages are
//! mapped at once, because a fault costs microseconds in user space (see docs/design.md): a page
//! that was read ahead and used never faults. So a stream's window counts as *used* when the
//! stream's next fault lands just past it — the application ran over those pages — and its
//! read-ahead pages are counted as hits then. A write to a read-ahead page (its first write
//! takes a write-protect fault) also counts it. A read-ahead page evicted before either is
//! counted as dropped unused. The window then grows on the same evidence the kernel uses.
//!
//! **Backing off.** The kernel resets a VMA's hit count at every window, so a fault next to
//! the last one always reads one page ahead (`pages == 2`). Programs whose objects span two
//! pages (redis' 4 KiB values in 5 KiB allocations) fault on a page and its neighbour, and
//! each such pair read a third page nobody used: 1 % of redis' read-ahead pages were used.
//! So each region keeps a *score*: read-ahead pages used add to it, pages evicted unused
//! take from it (the kernel's hit statistics, kept across windows). While the score is
//! negative, a fault next to a single page reads nothing ahead; a window opens only after
//! a longer run of faults in a row, 3 and one more per 64 of negative score (the stream
//! remembers the run's direction and length). Each fault that continues such a run is
//! credited as the hit a window would have made, so a region whose accesses turn
//! sequential again wins its readahead back. Windows grown from hits are not limited: a
//! window that was run over was used.
//!
//! Used both for swap-in (pages read from a device) and for first-touch fault-around
//! (never-touched pages mapped as zero pages). On devices slow enough to overlap (files), a
//! stream whose window has reached the maximum also has its next windows read while the
//! application works through this one (`async_readahead`).
//!
//! Locking: none. Streams are atomic words updated racily: two threads racing on one stream
//! at worst mis-size a window, which costs performance, never correctness.

use std::sync::atomic::{AtomicI32, AtomicU64, AtomicU8, AtomicUsize, Ordering};

/// Streams tracked per region.
const NR_STREAMS: usize = 8;
/// Largest window the engine supports, in pages.
pub const MAX_WINDOW_PAGES: usize = 128;
/// Default maximum window (one reclaim batch).
pub const DEFAULT_MAX_WINDOW_PAGES: usize = 32;
/// Bound of a region's readahead score either way: how many unused pages undo a run of
/// hits, and how many hits undo a run of unused pages.
const SCORE_BOUND: i32 = 256;

/// How a region is expected to be accessed (`madvise` advice).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Advice {
    /// Adapt the window to what the faults show (the default).
    #[default]
    Normal,
    /// Expect sequential access: always read ahead the maximum window, forward.
    Sequential,
    /// Expect random access: no readahead.
    Random,
}

impl Advice {
    fn to_u8(self) -> u8 {
        self as u8
    }
    fn from_u8(v: u8) -> Advice {
        match v {
            1 => Advice::Sequential,
            2 => Advice::Random,
            _ => Advice::Normal,
        }
    }
}

/// A range of pages of a region.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Window {
    pub start: usize,
    pub len: usize,
}

impl Window {
    pub fn end(self) -> usize {
        self.start + self.len
    }
    pub fn contains(self, page: usize) -> bool {
        page >= self.start && page < self.end()
    }
}

/// What a stream says about a fault.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Prediction {
    /// Pages to bring in (contains the faulting page).
    pub window: Window,
    /// The stream's previous window when this fault shows it was run over: its read-ahead
    /// pages were used.
    pub passed: Option<Window>,
    /// When the window was backed off to the faulting page (see "Backing off"): the
    /// direction the stream keeps for its next fault, and how many faults in a row it has
    /// had.
    backed_off: Option<BackedOff>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct BackedOff {
    dir: u64,
    run: u64,
}

// A stream word: start (32 bits) | len (8 bits) << 32 | dir (2 bits) << 40 | valid << 42 |
// run (4 bits) << 43, the run counted only while the stream is backed off.
const DIR_NONE: u64 = 0;
const DIR_FORWARD: u64 = 1;
const DIR_BACKWARD: u64 = 2;
const VALID: u64 = 1 << 42;
const RUN_MAX: u64 = 15;

fn pack(start: usize, len: usize, dir: u64, run: u64) -> u64 {
    (start as u64 & 0xffff_ffff) | ((len.min(255) as u64) << 32) | (dir << 40) | VALID | (run.min(RUN_MAX) << 43)
}
fn unpack(w: u64) -> (usize, usize, u64) {
    ((w & 0xffff_ffff) as usize, ((w >> 32) & 0xff) as usize, (w >> 40) & 3)
}
fn unpack_run(w: u64) -> u64 {
    (w >> 43) & RUN_MAX
}

/// The kernel's `__swapin_nr_pages` size rule (see the module doc).
pub fn window_size(hits: usize, adjacent: bool, prev_window: usize, max: usize) -> usize {
    let mut pages = hits + 2;
    if pages == 2 {
        if !adjacent {
            pages = 1;
        }
    } else {
        pages = pages.next_power_of_two().max(4);
    }
    pages.min(max).max((prev_window / 2).min(max)).max(1)
}

/// The streams of one region, and its advice.
pub struct FaultStreams {
    streams: [AtomicU64; NR_STREAMS],
    next_victim: AtomicUsize,
    advice: AtomicU8,
    /// Read-ahead pages used minus pages evicted unused, within ±`SCORE_BOUND`.
    score: AtomicI32,
}

impl Default for FaultStreams {
    fn default() -> Self {
        Self::new()
    }
}

impl FaultStreams {
    pub fn new() -> FaultStreams {
        FaultStreams {
            streams: std::array::from_fn(|_| AtomicU64::new(0)),
            next_victim: AtomicUsize::new(0),
            advice: AtomicU8::new(Advice::Normal.to_u8()),
            score: AtomicI32::new(0),
        }
    }

    /// `nr_pages` read-ahead pages were used (run over, written, or read by a system call).
    pub fn note_used(&self, nr_pages: u64) {
        let n = nr_pages.min(SCORE_BOUND as u64) as i32;
        self.score.fetch_add(n, Ordering::Relaxed);
        self.score.fetch_min(SCORE_BOUND, Ordering::Relaxed);
    }

    /// `nr_pages` read-ahead pages were evicted without being used.
    pub fn note_unused(&self, nr_pages: u64) {
        let n = nr_pages.min(SCORE_BOUND as u64) as i32;
        self.score.fetch_sub(n, Ordering::Relaxed);
        self.score.fetch_max(-SCORE_BOUND, Ordering::Relaxed);
    }

    /// Faults in a row on single pages before a window opens: 2 while speculating (the
    /// kernel's rule), then one more per 64 of negative score, 6 at the bound.
    fn run_needed(&self) -> u64 {
        let score = self.score.load(Ordering::Relaxed);
        if score >= 0 {
            2
        } else {
            3 + (score.unsigned_abs() as u64 - 1) / 64
        }
    }

    pub fn advise(&self, a: Advice) {
        self.advice.store(a.to_u8(), Ordering::Relaxed);
    }

    pub fn advice(&self) -> Advice {
        Advice::from_u8(self.advice.load(Ordering::Relaxed))
    }

    /// The streams in use, each with its slot, its last window, its direction and its run
    /// (read once each, racily: see the module's locking rules).
    fn live_streams(&self) -> impl Iterator<Item = (&AtomicU64, Window, u64, u64)> + '_ {
        self.streams.iter().filter_map(|s| {
            let w = s.load(Ordering::Relaxed);
            (w & VALID != 0).then(|| {
                let (start, len, dir) = unpack(w);
                (s, Window { start, len }, dir, unpack_run(w))
            })
        })
    }

    /// The window for a fault at `page` in a region of `nr_pages`, at most `max` pages.
    /// `swap_in`: the fault is on a swapped-out page. The score speaks only for those:
    /// fault-around of never-touched pages maps zero pages, which cost next to nothing, and
    /// a first-touch scan (a heap being filled) says nothing about how it is read later.
    pub fn predict(&self, page: usize, nr_pages: usize, max: usize, swap_in: bool) -> Prediction {
        let max = max.clamp(1, MAX_WINDOW_PAGES);
        let clamp = |start: isize, len: usize| {
            let start = start.clamp(0, nr_pages.saturating_sub(len) as isize) as usize;
            Window { start, len: len.min(nr_pages - start) }
        };
        match self.advice() {
            Advice::Random => {
                return Prediction { window: Window { start: page, len: 1 }, passed: None, backed_off: None }
            }
            Advice::Sequential => {
                let window = Window { start: page, len: max.min(nr_pages - page) };
                return Prediction { window, passed: None, backed_off: None };
            }
            Advice::Normal => {}
        }
        for (_, prev, prev_dir, prev_run) in self.live_streams() {
            // The fault continues the stream: just past its window, forward or backward.
            let forward = page == prev.end() && prev_dir != DIR_BACKWARD;
            let backward = page + 1 == prev.start && prev_dir != DIR_FORWARD;
            // Or it is next to the stream's only page (direction not known yet).
            let adjacent = prev.len == 1 && (page == prev.start + 1 || page + 1 == prev.start);
            if !(forward || backward || adjacent) {
                continue;
            }
            let go_back = backward || (adjacent && page + 1 == prev.start);
            if prev.len == 1 {
                // A single page continued: the second fault in a row, or one more after a
                // backed-off single page (which kept its direction).
                let run = if prev_dir != DIR_NONE && (forward || backward) {
                    if swap_in {
                        // The page a backed-off window would have read ahead is used now.
                        self.note_used(1);
                    }
                    prev_run + 1
                } else {
                    2
                };
                if swap_in && run < self.run_needed() {
                    let dir = if go_back { DIR_BACKWARD } else { DIR_FORWARD };
                    let backed_off = Some(BackedOff { dir, run });
                    return Prediction { window: Window { start: page, len: 1 }, passed: None, backed_off };
                }
            }
            let hits = if forward || backward { prev.len - 1 } else { 0 };
            let size = window_size(hits, true, prev.len, max);
            let window =
                if go_back { clamp(page as isize - size as isize + 1, size) } else { clamp(page as isize, size) };
            let passed = (hits > 0).then_some(prev);
            return Prediction { window, passed, backed_off: None };
        }
        Prediction { window: Window { start: page, len: 1 }, passed: None, backed_off: None }
    }

    /// Predicts the window for a fault at `page` and records it at once, before the pages
    /// are brought in: the faulting thread runs again as soon as its own page is mapped,
    /// and its next fault (perhaps served by another thread) must find the stream moved on.
    pub fn advance(&self, page: usize, nr_pages: usize, max: usize, swap_in: bool) -> Prediction {
        let p = self.predict(page, nr_pages, max, swap_in);
        self.record(page, p.window, p.backed_off);
        p
    }

    /// Records the window brought in for a fault at `page`; `backed_off` as in [`Prediction`].
    fn record(&self, page: usize, window: Window, backed_off: Option<BackedOff>) {
        debug_assert!(window.contains(page));
        debug_assert!(backed_off.is_none() || window.len == 1);
        let run = backed_off.map_or(0, |b| b.run);
        let dir = if let Some(b) = backed_off {
            b.dir
        } else if window.len == 1 {
            DIR_NONE
        } else if window.start == page {
            DIR_FORWARD
        } else if window.end() == page + 1 {
            DIR_BACKWARD
        } else {
            DIR_NONE
        };
        let word = pack(window.start, window.len, dir, run);
        // Update the stream this fault continued, if any.
        for (s, prev, _, _) in self.live_streams() {
            if page == prev.end() || page + 1 == prev.start || (prev.len == 1 && page.abs_diff(prev.start) == 1) {
                s.store(word, Ordering::Relaxed);
                return;
            }
        }
        // A new stream: an unused slot, else an idle one (a single-page, direction-less
        // stream) so that an established stream is not pushed out by random faults, else any.
        // Idle and busy slots are taken round robin: always taking the first idle slot let
        // each new stream replace the one before, so threads starting their scans at once
        // (one handler serving their faults in turn) never got past one page.
        if let Some(s) = self.streams.iter().find(|s| s.load(Ordering::Relaxed) & VALID == 0) {
            s.store(word, Ordering::Relaxed);
            return;
        }
        let start = self.next_victim.fetch_add(1, Ordering::Relaxed);
        let slot = |k: usize| &self.streams[(start + k) % NR_STREAMS];
        let idle = (0..NR_STREAMS).map(slot).find(|s| unpack(s.load(Ordering::Relaxed)).1 <= 1);
        idle.unwrap_or_else(|| slot(0)).store(word, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const N: usize = 1 << 20;

    fn fault(s: &FaultStreams, page: usize, max: usize) -> Prediction {
        s.advance(page, N, max, true)
    }

    /// Faults `nr_faults` times on a forward scan from `page`, each just past the last
    /// window (windows of up to 32 pages). Returns the page after the last window.
    fn scan_forward(s: &FaultStreams, mut page: usize, nr_faults: usize) -> usize {
        for _ in 0..nr_faults {
            page = fault(s, page, 32).window.end();
        }
        page
    }

    #[test]
    fn size_follows_swapin_nr_pages() {
        assert_eq!(window_size(0, false, 0, 32), 1, "no hits, not adjacent");
        assert_eq!(window_size(0, true, 0, 32), 2, "adjacent");
        assert_eq!(window_size(1, true, 2, 32), 4);
        assert_eq!(window_size(3, true, 4, 32), 8);
        assert_eq!(window_size(7, true, 8, 32), 16);
        assert_eq!(window_size(100, true, 32, 32), 32, "clamped to the maximum");
        assert_eq!(window_size(0, false, 32, 32), 16, "shrinks by half at most");
    }

    #[test]
    fn a_forward_scan_grows_to_the_maximum_and_reports_its_hits() {
        let s = FaultStreams::new();
        let mut page = 1000;
        let mut sizes = vec![];
        let mut hits = 0;
        for _ in 0..9 {
            let p = fault(&s, page, 32);
            assert_eq!(p.window.start, page, "forward windows start at the fault");
            hits += p.passed.map_or(0, |w| w.len - 1);
            sizes.push(p.window.len);
            page = p.window.end();
        }
        assert_eq!(sizes, [1, 2, 4, 8, 16, 32, 32, 32, 32]);
        let read_ahead: usize = sizes[..8].iter().map(|n| n - 1).sum();
        assert_eq!(hits, read_ahead, "every page read ahead (but the last window's) was run over");
    }

    #[test]
    fn a_backward_scan_places_windows_below_the_fault() {
        let s = FaultStreams::new();
        let mut page = 5000;
        let mut last = 0;
        for _ in 0..7 {
            let p = fault(&s, page, 16);
            assert_eq!(p.window.end(), page + 1, "backward windows end at the fault");
            last = p.window.len;
            page = p.window.start - 1;
        }
        assert_eq!(last, 16);
    }

    #[test]
    fn random_faults_get_one_page_and_do_not_evict_a_stream() {
        let s = FaultStreams::new();
        let page = scan_forward(&s, 100, 6);
        let mut x = 0x1234_5678u64;
        for _ in 0..50 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let p = fault(&s, (x % (N as u64)) as usize, 32);
            assert_eq!(p.window.len, 1);
        }
        let p = fault(&s, page, 32);
        assert_eq!(p.window.len, 32, "the sequential stream survived the random faults");
        assert!(p.passed.is_some());
    }

    /// Four threads starting their scans at once, their faults served in turn: each stream's
    /// second fault must still find its first, though every slot is in use.
    #[test]
    fn interleaved_new_streams_do_not_push_each_other_out() {
        let s = FaultStreams::new();
        // Every slot taken: one established stream, the rest single pages.
        let page = scan_forward(&s, 0, 6);
        for k in 0..NR_STREAMS {
            fault(&s, 10_000 + 100 * k, 32);
        }
        let starts = [20_000, 22_000, 24_000, 26_000];
        for start in starts {
            assert_eq!(fault(&s, start, 32).window.len, 1);
        }
        for start in starts {
            assert_eq!(fault(&s, start + 1, 32).window.len, 2, "stream at {start} continued");
        }
        assert_eq!(fault(&s, page, 32).window.len, 32, "the established stream survived");
    }

    /// Objects of two pages (redis' values): each pair of faults read a third page ahead.
    /// Once those pages are evicted unused, pairs read nothing ahead.
    #[test]
    fn pairs_of_faults_stop_reading_ahead_once_their_pages_go_unused() {
        let s = FaultStreams::new();
        let pair = |page: usize| (fault(&s, page, 32).window.len, fault(&s, page + 1, 32).window.len);
        assert_eq!(pair(1000), (1, 2), "a fresh region speculates, as the kernel does");
        s.note_unused(1);
        for k in 0..100 {
            assert_eq!(pair(10_000 + 50 * k), (1, 1), "pair {k} read ahead while the score is negative");
        }
    }

    /// A backed-off region still finds a sequential scan: the third fault in a row starts a
    /// window and is credited, so enough scans win speculation back.
    #[test]
    fn a_backed_off_region_finds_a_scan_on_its_third_fault_and_recovers() {
        let s = FaultStreams::new();
        s.note_unused(3);
        let sizes: Vec<usize> = {
            let mut page = 5000;
            (0..6)
                .map(|_| {
                    let p = fault(&s, page, 32);
                    // What the fault path does with a window that was run over.
                    if let Some(w) = p.passed {
                        s.note_used(w.len as u64 - 1);
                    }
                    page = p.window.end();
                    p.window.len
                })
                .collect()
        };
        assert_eq!(sizes, [1, 1, 2, 4, 8, 16], "one fault later than in a fresh region, then the same growth");
        assert!(s.run_needed() == 2, "the scan's hits outweigh three unused pages");
        assert_eq!((fault(&s, 90_000, 32).window.len, fault(&s, 90_001, 32).window.len), (1, 2));
    }

    /// The more unused pages, the longer the run it takes: at the bound, six faults.
    #[test]
    fn the_run_a_window_needs_grows_with_unused_pages() {
        let s = FaultStreams::new();
        s.note_unused(1000);
        let mut sizes = vec![];
        let mut page = 3000;
        for _ in 0..7 {
            let p = fault(&s, page, 32);
            sizes.push(p.window.len);
            page = p.window.end();
        }
        assert_eq!(sizes, [1, 1, 1, 1, 1, 2, 4]);
        assert_eq!(s.score.load(Ordering::Relaxed), -SCORE_BOUND + 4, "faults 3 to 6 credited");
    }

    /// First-touch faults (fault-around of zero pages) neither back off nor move the score.
    #[test]
    fn first_touch_faults_keep_the_kernels_rule_and_leave_the_score_alone() {
        let s = FaultStreams::new();
        s.note_unused(100);
        let mut page = 8000;
        let mut sizes = vec![];
        for _ in 0..3 {
            let w = s.advance(page, N, 32, false).window;
            sizes.push(w.len);
            page = w.end();
        }
        assert_eq!(sizes, [1, 2, 4]);
        assert_eq!(s.score.load(Ordering::Relaxed), -100);
    }

    #[test]
    fn a_backward_scan_is_found_after_backing_off_too() {
        let s = FaultStreams::new();
        s.note_unused(1);
        assert_eq!(fault(&s, 7000, 32).window.len, 1);
        assert_eq!(fault(&s, 6999, 32).window.len, 1);
        let p = fault(&s, 6998, 32);
        assert_eq!(p.window, Window { start: 6997, len: 2 }, "the window ends at the fault");
    }

    #[test]
    fn the_score_is_bounded_both_ways() {
        let s = FaultStreams::new();
        s.note_used(u64::MAX);
        s.note_used(1000);
        assert_eq!(s.score.load(Ordering::Relaxed), SCORE_BOUND);
        s.note_unused(u64::MAX);
        s.note_unused(1000);
        assert_eq!(s.score.load(Ordering::Relaxed), -SCORE_BOUND);
        s.note_used(SCORE_BOUND as u64);
        assert!(s.run_needed() == 2, "as many hits as the bound undo any run of unused pages");
    }

    #[test]
    fn a_fault_elsewhere_after_a_window_shrinks_gradually() {
        let s = FaultStreams::new();
        let page = scan_forward(&s, 0, 7);
        // Not the next page: the stream is not continued; a new one starts at one page.
        assert_eq!(fault(&s, page + 10, 32).window.len, 1);
    }

    #[test]
    fn windows_are_clamped_to_the_region_and_advice_overrides() {
        let s = FaultStreams::new();
        let p = s.predict(N - 3, N, 32, true);
        assert!(p.window.end() <= N);
        s.advise(Advice::Sequential);
        assert_eq!(s.predict(10, N, 32, true).window, Window { start: 10, len: 32 });
        assert_eq!(s.predict(N - 5, N, 32, true).window, Window { start: N - 5, len: 5 });
        s.advise(Advice::Random);
        for page in 0..5 {
            assert_eq!(fault(&s, page, 32).window.len, 1, "a sequential run gets no readahead");
        }
    }

    #[test]
    fn centred_windows_stay_inside_the_region() {
        let s = FaultStreams::new();
        // Establish a stream, then continue it backwards from near the start of the region.
        let p = fault(&s, 3, 32);
        assert_eq!(p.window, Window { start: 3, len: 1 });
        let p = fault(&s, 2, 32);
        assert_eq!(p.window.end(), 3);
        assert!(p.window.start <= 2);
    }
}
