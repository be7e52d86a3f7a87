//! Per-region fault locality: detects sequential streams of faults and sizes the window of
//! pages a fault brings in at once.
//!
//! A fault costs 5–80 µs here (DESIGN.md), so bringing many pages per fault is the biggest
//! lever on throughput. This module keeps, per region, a few recent streams (last page and
//! window), so that several threads scanning different parts of a region are each seen as
//! sequential. A fault that continues a stream doubles its window (up to the maximum); one
//! that does not starts a new stream with a window of one page.
//!
//! Used for first-touch faults (fault-around of never-touched pages, the user-space analogue
//! of the kernel's multi-size anonymous THP).
//!
//! Locking: none. Stream slots are atomics updated racily: two threads racing on one slot
//! at worst mis-size a window, which costs performance, never correctness.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

/// Streams tracked per region.
const NR_STREAMS: usize = 4;
/// Largest window, in pages (one reclaim batch: the pages come in with one ioctl).
pub const MAX_WINDOW_PAGES: usize = 32;

/// One stream: `last_page + 1` is where it continues; `window` its current size.
struct Stream {
    /// (last_page << 8) | window; 0 means unused.
    word: AtomicU64,
}

pub struct FaultStreams {
    streams: [Stream; NR_STREAMS],
    next_victim: AtomicUsize,
}

impl Default for FaultStreams {
    fn default() -> Self {
        Self::new()
    }
}

impl FaultStreams {
    pub fn new() -> FaultStreams {
        FaultStreams {
            streams: std::array::from_fn(|_| Stream { word: AtomicU64::new(0) }),
            next_victim: AtomicUsize::new(0),
        }
    }

    /// A fault at `page`: returns how many pages, starting at `page`, to bring in (at most
    /// `max`), and records the stream.
    pub fn window_at(&self, page: usize, max: usize) -> usize {
        let max = max.clamp(1, MAX_WINDOW_PAGES);
        for s in &self.streams {
            let w = s.word.load(Ordering::Relaxed);
            if w != 0 && (w >> 8) as usize + 1 == page {
                let window = ((w & 0xff) as usize * 2).clamp(1, max);
                s.word.store(((page + window - 1) as u64) << 8 | window as u64, Ordering::Relaxed);
                return window;
            }
        }
        let i = self.next_victim.fetch_add(1, Ordering::Relaxed) % NR_STREAMS;
        self.streams[i].word.store((page as u64) << 8 | 1, Ordering::Relaxed);
        1
    }

    /// The window actually brought in was `n` pages (neighbours may have been resident):
    /// the stream continues after them.
    pub fn brought_in(&self, page: usize, n: usize) {
        for s in &self.streams {
            let w = s.word.load(Ordering::Relaxed);
            if w != 0 && w >> 8 >= page as u64 && (w >> 8) < (page + MAX_WINDOW_PAGES) as u64 {
                s.word.store(((page + n.max(1) - 1) as u64) << 8 | (w & 0xff), Ordering::Relaxed);
                return;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_sequential_stream_doubles_its_window_up_to_the_maximum() {
        let s = FaultStreams::new();
        let mut page = 100;
        let mut windows = vec![];
        for _ in 0..8 {
            let w = s.window_at(page, MAX_WINDOW_PAGES);
            windows.push(w);
            page += w;
        }
        assert_eq!(windows, [1, 2, 4, 8, 16, 32, 32, 32]);
    }

    #[test]
    fn random_faults_get_one_page_and_streams_are_kept_apart() {
        let s = FaultStreams::new();
        for p in [5, 900, 77, 4000, 13] {
            assert_eq!(s.window_at(p, MAX_WINDOW_PAGES), 1);
        }
        // Two interleaved sequential streams both grow.
        let (mut a, mut b) = (10_000, 50_000);
        let mut last = (0, 0);
        for _ in 0..5 {
            let wa = s.window_at(a, MAX_WINDOW_PAGES);
            a += wa;
            let wb = s.window_at(b, MAX_WINDOW_PAGES);
            b += wb;
            last = (wa, wb);
        }
        assert_eq!(last, (16, 16));
    }

    #[test]
    fn windows_respect_the_caller_maximum_and_actual_progress() {
        let s = FaultStreams::new();
        assert_eq!(s.window_at(0, 4), 1);
        assert_eq!(s.window_at(1, 4), 2);
        // Only one of the two pages could be brought in: the stream continues after it.
        s.brought_in(1, 1);
        assert_eq!(s.window_at(2, 4), 4);
    }
}
