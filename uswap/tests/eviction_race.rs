//! Eviction racing with writes: several threads write the same pages while reclaim, in the
//! faulting threads and in the background reclaimer at once, moves those pages out in
//! batches (runs of neighbouring pages with one `UFFDIO_MOVE` each). No write may be lost:
//! a write that lands while its page is being moved must be in the copy that goes out, or
//! fault and land in the page that comes back.
//!
//! Each thread owns one word of every page and increments it (a plain load and store: the
//! page can move out between the two) at random pages, keeping its own count. At the end
//! every word of every page is checked: the owned words against the counts, all others zero.

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use uswap::{BackgroundReclaim, DeviceConfig, FaultMode, Pager, PAGE_SIZE};

mod common;
use common::*;

const THREADS: usize = 4;
/// Words apart, so that threads do not share a cache line (the race is with eviction, not
/// between the threads).
const STRIDE_WORDS: usize = 8;
const INCREMENTS_PER_THREAD: usize = 60_000;
const BOUND: Duration = Duration::from_secs(120);

fn writes_racing_with_eviction_are_never_lost(mode: FaultMode) {
    let limit = MIB;
    let pager = Pager::builder()
        .resident_limit(limit)
        .fault_mode(mode)
        .device(DeviceConfig::zpool(64 * MIB))
        // The background reclaimer moves pages out while the application writes them, on
        // top of the faulting threads' own reclaim.
        .background_reclaim(BackgroundReclaim::Always)
        .build()
        .expect("pager");
    let region = pager.map(8 * limit as usize).expect("map");
    let nr_pages = region.len() / PAGE_SIZE;
    let words = region.as_atomic_u64s();
    let t0 = Instant::now();
    let pager_ref = &pager;
    let counts: Vec<Vec<u64>> = std::thread::scope(|s| {
        let workers: Vec<_> = (0..THREADS)
            .map(|t| {
                s.spawn(move || {
                    let mut count = vec![0u64; nr_pages];
                    let mut rng = Rng(0x9E37_79B9 + t as u64);
                    for n in 0..INCREMENTS_PER_THREAD {
                        // Mostly random pages, with runs of neighbours so that moves batch.
                        let page = if n % 4 == 0 {
                            rng.next() as usize % nr_pages
                        } else {
                            (rng.next() as usize % 64 + n / 4 * 64) % nr_pages
                        };
                        let w = &words[page * WORDS + t * STRIDE_WORDS];
                        // Not an atomic add: the page may move out between the load and the
                        // store, which is the race under test.
                        let v = w.load(Ordering::Relaxed);
                        w.store(v + 1, Ordering::Relaxed);
                        count[page] += 1;
                        if n % 4096 == 0 && t0.elapsed() > BOUND {
                            panic!("{mode:?}: thread {t} still writing after {BOUND:?}: {:?}", pager_ref.stats());
                        }
                    }
                    count
                })
            })
            .collect();
        workers.into_iter().map(|w| w.join().expect("writer")).collect()
    });

    let mut lost = 0u64;
    let mut stray = 0usize;
    for page in 0..nr_pages {
        for k in 0..WORDS {
            let got = words[page * WORDS + k].load(Ordering::Relaxed);
            let owner = (k % STRIDE_WORDS == 0).then_some(k / STRIDE_WORDS).filter(|&t| t < THREADS);
            match owner {
                Some(t) => lost += counts[t][page].saturating_sub(got) + got.saturating_sub(counts[t][page]),
                None => stray += (got != 0) as usize,
            }
        }
    }
    let st = pager.stats();
    assert_eq!((lost, stray), (0, 0), "{mode:?}: writes lost (or extra), words changed that nobody wrote: {st:?}");
    assert!(st.pswpout > 0 && st.pswpin > 0, "{mode:?}: the run must swap: {st:?}");
    assert!(st.pgsteal_background > 0, "{mode:?}: the background reclaimer never raced the writers: {st:?}");
    assert_eq!(st.fault_error + st.fault_busy_timeout, 0, "{mode:?}: {st:?}");
}

in_both_modes!(writes_racing_with_eviction_are_never_lost() => thread_mode_writes_racing_with_eviction_are_never_lost,
    signal_mode_writes_racing_with_eviction_are_never_lost);
