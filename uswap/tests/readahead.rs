//! Readahead against the real kernel: a sequential scan of swapped-out pages takes one
//! fault per window, random faults read nothing ahead, advice and the global switch work,
//! and every byte read is verified.

use std::sync::atomic::AtomicU64;

use uswap::{Advice, DeviceConfig, FaultMode, Pager, ReadaheadPolicy, PAGE_SIZE};

mod common;
use common::*;

const WINDOW: usize = 32;

fn build(mode: FaultMode, device: DeviceConfig) -> Pager {
    Pager::builder()
        .resident_limit(2 * MIB)
        .fault_mode(mode)
        .readahead_max_pages(WINDOW)
        .device(device)
        .build()
        .unwrap()
}

/// Fills a 16 MiB region (8x the limit), so that its first pages are on the device, then
/// reads `pages` pages in order from page 0 and returns (stats delta of major faults,
/// swap_ra, swap_ra_hit).
/// Extra major faults a thread-mode scan may take (see the first test).
const THREAD_SLACK: u64 = 2;

fn sequential_scan(p: &Pager, region: &uswap::Region, pages: usize) -> (u64, u64, u64) {
    let w = region.as_atomic_u64s();
    write_every_page(w);
    let before = quiet_stats(p);
    for i in 0..pages {
        check_page(w, i, 1);
    }
    let after = p.stats();
    (after.pgmajfault - before.pgmajfault, after.swap_ra - before.swap_ra, after.swap_ra_hit - before.swap_ra_hit)
}

#[test]
fn a_sequential_scan_takes_at_most_one_fault_per_window() {
    for mode in [FaultMode::Thread, FaultMode::Signal] {
        for device in [DeviceConfig::ram(64 * MIB), DeviceConfig::zpool(64 * MIB)] {
            let p = build(mode, device);
            let region = p.map(16 * MIB as usize).unwrap();
            let pages = 8 * MIB as usize / PAGE_SIZE; // all swapped out by the fill
            let (majflt, ra, hit) = sequential_scan(&p, &region, pages);
            // The window grows 1, 2, 4, 8, 16, 32: six faults cover the first 63 pages. In
            // thread mode, under load, a read-ahead page now and then goes out before the
            // scan reaches it (seen as swap_ra_unused 1) and faults again: 2 of slack.
            let slack = if mode == FaultMode::Thread { THREAD_SLACK } else { 0 };
            let bound = (pages - 63).div_ceil(WINDOW) as u64 + 6 + slack;
            assert!(majflt <= bound, "{mode:?}: {majflt} major faults for {pages} pages (bound {bound})");
            assert!(ra >= (pages as u64) * 9 / 10, "{mode:?}: read ahead {ra} of {pages}");
            // The last window is not run over yet when the scan stops.
            let decided = ra - (WINDOW as u64 - 1);
            assert!(hit * 100 >= decided * 99, "{mode:?}: hit {hit} of {ra} read ahead");
        }
    }
}

#[test]
fn a_backward_scan_reads_ahead_backwards() {
    let p = build(FaultMode::Signal, DeviceConfig::ram(64 * MIB));
    let region = p.map(16 * MIB as usize).unwrap();
    let w = region.as_atomic_u64s();
    for i in 0..region.len() / PAGE_SIZE {
        write_page(w, i, 2);
    }
    let before = quiet_stats(&p);
    let pages = 8 * MIB as usize / PAGE_SIZE;
    for i in (0..pages).rev() {
        check_page(w, i, 2);
    }
    let st = p.stats();
    let majflt = st.pgmajfault - before.pgmajfault;
    assert!(majflt <= (pages / WINDOW) as u64 + 8, "{majflt} major faults backwards");
    assert!(st.swap_ra_hit - before.swap_ra_hit > 0);
}

#[test]
fn random_faults_read_almost_nothing_ahead() {
    let p = build(FaultMode::Signal, DeviceConfig::ram(64 * MIB));
    let region = p.map(16 * MIB as usize).unwrap();
    let w = region.as_atomic_u64s();
    let pages = region.len() / PAGE_SIZE;
    for i in 0..pages {
        write_page(w, i, 3);
    }
    let before = quiet_stats(&p);
    let mut rng = Rng(77);
    for _ in 0..3000 {
        let i = (rng.next() % pages as u64) as usize;
        check_page(w, i, 3);
    }
    let st = p.stats();
    let (majflt, ra) = (st.pgmajfault - before.pgmajfault, st.swap_ra - before.swap_ra);
    assert!(majflt > 1000, "{majflt}");
    assert!(ra * 20 < majflt, "random faults read {ra} pages ahead for {majflt} faults");
}

#[test]
fn advice_and_the_global_switch() {
    let p = build(FaultMode::Thread, DeviceConfig::ram(64 * MIB));
    let region = p.map(16 * MIB as usize).unwrap();
    // Random advice: a sequential scan reads nothing ahead.
    region.advise(Advice::Random);
    let (majflt, ra, _) = sequential_scan(&p, &region, 1024);
    assert_eq!(ra, 0);
    assert!(majflt >= 1000, "one fault per page: {majflt}");
    // Sequential advice: full windows from the first fault.
    let region = p.map(16 * MIB as usize).unwrap();
    region.advise(Advice::Sequential);
    let (majflt, ra, _) = sequential_scan(&p, &region, 1024);
    assert!(majflt <= 1024 / WINDOW as u64 + 1 + THREAD_SLACK, "{majflt}");
    assert!(ra >= 1024 * 9 / 10, "{ra}");
    // Off: nothing read ahead, whatever the advice.
    p.set_readahead(false);
    let (majflt, ra, _) = sequential_scan(&p, &region, 1024);
    assert_eq!(ra, 0);
    assert!(majflt >= 1000, "one fault per page without readahead: {majflt}");
}

#[test]
fn cluster_readahead_reads_neighbouring_slots() {
    for mode in [FaultMode::Thread, FaultMode::Signal] {
        let p = build(mode, DeviceConfig::ram(64 * MIB).readahead(ReadaheadPolicy::Cluster));
        let region = p.map(16 * MIB as usize).unwrap();
        // Pages were evicted in address order, one batch of consecutive slots at a time, so
        // slot order mostly follows address order; batches from the two CPUs' clusters
        // interleave, which is why the kernel moved to readahead by address in 2017.
        let pages = 8 * MIB as usize / PAGE_SIZE;
        let (majflt, ra, hit) = sequential_scan(&p, &region, pages);
        assert!(majflt <= (pages / 8) as u64, "{mode:?}: {majflt} major faults for {pages} pages");
        // Hits are found through the slots' owners; signal mode frees the slots of the pages
        // it brings back (they come back writable), so it cannot see them (docs/devices.md, "Readahead").
        if mode == FaultMode::Thread {
            assert!(hit * 100 >= ra * 90, "{mode:?}: hit {hit} of {ra}");
        }
    }
}

#[test]
fn read_ahead_pages_of_file_devices_come_in_clean() {
    // Thread mode only: signal mode maps every page writable (see docs/devices.md, "Clean pages keep
    // their slot").
    for (mode, clean) in [(FaultMode::Thread, true), (FaultMode::Signal, false)] {
        let p = build(mode, DeviceConfig::file(std::env::temp_dir(), 64 * MIB));
        let region = p.map(16 * MIB as usize).unwrap();
        let (_, ra, _) = sequential_scan(&p, &region, 2048);
        assert!(ra > 1500);
        let st = p.stats();
        assert_eq!(st.clean_pages > 256, clean, "{mode:?}: read-ahead pages keep their slot: {st:?}");
    }
}

fn file_pager(mode: FaultMode, windows: usize, device: DeviceConfig) -> Pager {
    Pager::builder()
        .resident_limit(2 * MIB)
        .fault_mode(mode)
        .readahead_max_pages(WINDOW)
        .readahead_async_windows(windows)
        .device(device)
        .build()
        .unwrap()
}

fn file_device() -> DeviceConfig {
    DeviceConfig::file(std::env::temp_dir(), 64 * MIB)
}

/// Every page read asynchronously is accounted for once its region is gone: mapped from the
/// buffer or dropped.
fn assert_async_accounted(st: &uswap::Stats) {
    assert_eq!(
        st.swap_ra_async_started,
        st.swap_ra_async + st.swap_ra_async_dropped,
        "started = mapped + dropped: {st:?}"
    );
}

#[test]
fn sequential_scans_of_a_file_device_are_read_ahead_asynchronously() {
    for mode in [FaultMode::Thread, FaultMode::Signal] {
        let p = file_pager(mode, 2, file_device());
        let region = p.map(16 * MIB as usize).unwrap();
        let pages = 8 * MIB as usize / PAGE_SIZE;
        let before = quiet_stats(&p);
        let (majflt, ra, hit) = sequential_scan(&p, &region, pages);
        let st = p.stats();
        let started = st.swap_ra_async_started - before.swap_ra_async_started;
        let mapped = st.swap_ra_async - before.swap_ra_async;
        assert!(mapped >= pages as u64 * 8 / 10, "{mode:?}: {mapped} of {pages} pages came from asynchronous reads");
        assert!(started >= mapped, "{mode:?}: {st:?}");
        // Faults on pages already read asynchronously still count as major faults: about one
        // per window. A fault that lands inside an asynchronous window (a thread-mode race)
        // splits it in two, hence a little slack.
        let bound = (pages - 63).div_ceil(WINDOW) as u64 + 6 + 8;
        assert!(majflt <= bound, "{mode:?}: {majflt} major faults for {pages} pages (bound {bound})");
        let decided = ra - (WINDOW as u64 - 1);
        assert!(hit * 100 >= decided * 99, "{mode:?}: hit {hit} of {ra} read ahead");
        drop(region);
        assert_async_accounted(&p.stats());

        // Off: the same scan reads nothing asynchronously.
        let p = file_pager(mode, 0, file_device());
        let region = p.map(16 * MIB as usize).unwrap();
        let (_, ra, _) = sequential_scan(&p, &region, pages);
        assert!(ra >= pages as u64 * 9 / 10);
        assert_eq!(p.stats().swap_ra_async_started, 0);
    }
}

/// Fills a 16 MiB region of a file pager with asynchronous readahead (two windows) with
/// version 1 of every page, runs `scan(words, pages)` over it, and checks that the scan used
/// asynchronous reads and, once the region is gone, that every page read asynchronously is
/// accounted for. Returns the pager's stats then.
fn async_scan(mode: FaultMode, scan: impl FnOnce(&[AtomicU64], usize)) -> uswap::Stats {
    let p = file_pager(mode, 2, file_device());
    let region = p.map(16 * MIB as usize).unwrap();
    let w = region.as_atomic_u64s();
    let pages = region.len() / PAGE_SIZE;
    write_every_page(w);
    scan(w, pages);
    let st = p.stats();
    assert!(st.swap_ra_async > 0, "{mode:?}: {st:?}");
    drop(region);
    let st = p.stats();
    assert_async_accounted(&st);
    st
}

/// Streams that stop half-way, turn round or jump, with writes in between: windows read
/// asynchronously and never used are dropped, and every byte read is right.
#[test]
fn abandoned_streams_and_writes_lose_nothing() {
    for mode in [FaultMode::Thread, FaultMode::Signal] {
        let st = async_scan(mode, |w, pages| {
            let mut version = vec![1u64; pages];
            let mut rng = Rng(0x5eed ^ mode as u64);
            for _ in 0..60 {
                let start = (rng.next() % pages as u64) as usize;
                let len = 16 + (rng.next() % 300) as usize;
                let backward = rng.next() % 4 == 0;
                for k in 0..len.min(pages) {
                    let i = if backward { (start + pages - k) % pages } else { (start + k) % pages };
                    check_page(w, i, version[i]);
                    if rng.next() % 5 == 0 {
                        version[i] += 1;
                        write_page(w, i, version[i]);
                    }
                }
            }
            for (i, v) in version.iter().enumerate() {
                check_page(w, i, *v);
            }
        });
        assert!(st.swap_ra_async_dropped > 0, "{mode:?}: abandoned windows are dropped: {st:?}");
    }
}

#[test]
fn failed_and_corrupted_asynchronous_reads_are_read_again() {
    let f = uswap::FaultInjection { read_error_rate: 0.1, corrupt_rate: 0.1, seed: 13, ..Default::default() };
    for mode in [FaultMode::Thread, FaultMode::Signal] {
        let p = file_pager(mode, 2, file_device().inject_faults(f));
        let region = p.map(16 * MIB as usize).unwrap();
        rewrite_and_check(region.as_atomic_u64s(), 3);
        let st = p.stats();
        assert!(st.swap_ra_async > 0 && st.checksum_errors > 0, "{mode:?}: {st:?}");
        let base = region.as_ptr() as usize;
        let errors = p.recent_errors();
        assert!(!errors.is_empty(), "{mode:?}");
        for e in &errors {
            assert!(e.addr >= base && e.addr < base + region.len(), "{mode:?}: {e}");
        }
        drop(region);
        assert_async_accounted(&p.stats());
    }
}

#[test]
fn threads_scanning_one_region_share_the_readers() {
    for mode in [FaultMode::Thread, FaultMode::Signal] {
        async_scan(mode, |w, pages| {
            // Four threads, each scanning its quarter twice, forward then backward.
            std::thread::scope(|s| {
                for t in 0..4 {
                    s.spawn(move || {
                        let (lo, hi) = (t * pages / 4, (t + 1) * pages / 4);
                        for i in lo..hi {
                            check_page(w, i, 1);
                        }
                        for i in (lo..hi).rev() {
                            check_page(w, i, 1);
                        }
                    });
                }
            });
        });
    }
}

/// The use-once rule: pages a stream brought in are reclaimed before the others, so a
/// sequential scan many times the limit does not push out a working set touched at random.
/// (Reclaim oldest-first would have pushed out every page of it.)
#[test]
fn a_sequential_scan_does_not_push_out_pages_touched_at_random() {
    for mode in [FaultMode::Signal, FaultMode::Thread] {
        let p = Pager::builder()
            .resident_limit(4 * MIB)
            .fault_mode(mode)
            .readahead_max_pages(WINDOW)
            .device(DeviceConfig::ram(64 * MIB))
            .build()
            .unwrap();
        // The working set: half the limit, touched in random order (one fault per page, no
        // fault-around), so none of it counts as a stream's.
        let hot = p.map(2 * MIB as usize).unwrap();
        hot.advise(Advice::Random);
        let hw = hot.as_atomic_u64s();
        let nr_hot = hot.len() / PAGE_SIZE;
        let mut order: Vec<usize> = (0..nr_hot).collect();
        let mut rng = Rng(5);
        for i in (1..nr_hot).rev() {
            order.swap(i, (rng.next() % (i as u64 + 1)) as usize);
        }
        for &i in &order {
            write_page(hw, i, 9);
        }
        // A stream over 8x the limit: filled in order, then read back in order twice.
        let cold = p.map(32 * MIB as usize).unwrap();
        let cw = cold.as_atomic_u64s();
        let nr_cold = cold.len() / PAGE_SIZE;
        for i in 0..nr_cold {
            write_page(cw, i, 2);
        }
        for _ in 0..2 {
            for i in 0..nr_cold {
                check_page(cw, i, 2);
            }
        }
        let kept = hot.mapped_pages_in(0, hot.len()).unwrap();
        assert!(kept * 10 >= nr_hot * 9, "{mode:?}: {kept} of {nr_hot} working-set pages kept: {:?}", p.stats());
        for i in 0..nr_hot {
            check_page(hw, i, 9);
        }
    }
}
