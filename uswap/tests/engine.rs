//! Integration tests against the real kernel: real userfaultfd, real UFFDIO_MOVE, real
//! SIGBUS delivery. Every test checks contents or counts; every byte read is verified.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

use uswap::{DeviceConfig, Error, FaultMode, Pager, MIN_LIMIT_BYTES, PAGE_SIZE, RECLAIM_BATCH_PAGES};

mod common;
use common::*;

/// Threads doing random reads and writes over a region 4x the limit, each on its own pages
/// (page i belongs to thread i % threads), verifying every byte of every page they read
/// against their own record of its version. Between rounds all threads stop and the
/// resident bound is measured from the page tables.
fn random_rw_verified(mode: FaultMode, threads: usize) {
    let limit = 4 * MIB;
    let p = pager(mode, limit, 32 * MIB);
    let region = p.map(4 * limit as usize).unwrap();
    let nr_pages = region.len() / PAGE_SIZE;
    let words = region.as_atomic_u64s();
    let rounds = 8;
    let barrier = Barrier::new(threads + 1);
    let max_measured = AtomicU64::new(0);
    std::thread::scope(|s| {
        for t in 0..threads {
            let barrier = &barrier;
            s.spawn(move || {
                let mine: Vec<usize> = (t..nr_pages).step_by(threads).collect();
                let mut version = vec![0u64; mine.len()];
                let mut rng = Rng(0x1234_5678 + t as u64);
                for _ in 0..rounds {
                    for _ in 0..3000 {
                        let j = (rng.next() % mine.len() as u64) as usize;
                        let i = mine[j];
                        check_page(words, i, version[j]);
                        if rng.next() % 3 == 0 {
                            version[j] += 1;
                            write_page(words, i, version[j]);
                        }
                    }
                    barrier.wait(); // round done: the checker measures
                    barrier.wait(); // checker done
                }
                for (j, &i) in mine.iter().enumerate() {
                    check_page(words, i, version[j]);
                }
            });
        }
        for _ in 0..rounds {
            barrier.wait();
            let measured = p.measured_resident_pages().unwrap() as u64;
            max_measured.fetch_max(measured, Ordering::Relaxed);
            barrier.wait();
        }
    });
    let st = p.stats();
    let bound = limit / PAGE_SIZE as u64 + RECLAIM_BATCH_PAGES as u64;
    let max = max_measured.load(Ordering::Relaxed);
    assert!(max <= bound, "measured {max} resident pages, bound {bound}");
    assert!(max > bound / 2, "the workload should fill the limit (measured {max})");
    assert!(st.resident_pages <= st.limit_pages, "{st:?}");
    assert!(st.pswpout > 0 && st.pswpin > 0, "the run must swap: {st:?}");
    assert_eq!((st.limit_overrun, st.fault_error, st.slots_leaked), (0, 0, 0), "{st:?}");
}

#[test]
fn thread_mode_random_rw_two_threads_every_byte_verified() {
    random_rw_verified(FaultMode::Thread, 2);
}

#[test]
fn signal_mode_random_rw_three_threads_every_byte_verified() {
    random_rw_verified(FaultMode::Signal, 3);
}

/// A victim's dirty resident neighbours (its aligned 64 KiB block) leave with it, in one
/// run: after a sequential write of four times the limit, most pages moved out went as a
/// neighbour, and every byte reads back, through a second pass that rewrites every third
/// page and a third that checks them all.
fn dirty_neighbours_leave_with_their_victim(mode: FaultMode) {
    let p = pager(mode, MIB, 32 * MIB);
    let region = p.map(4 * MIB as usize).unwrap();
    let words = region.as_atomic_u64s();
    let nr_pages = region.len() / PAGE_SIZE;
    write_every_page(words);
    let st = quiet_stats(&p);
    let moved_out = st.pswpout + st.swapcache_pages + st.swpout_zero;
    assert!(moved_out as usize >= nr_pages / 2, "{st:?}");
    assert!(
        st.swpout_neighbours * 2 >= moved_out,
        "{} of {moved_out} pages left as a victim's neighbour: {st:?}",
        st.swpout_neighbours
    );
    for i in (0..nr_pages).step_by(3) {
        check_page(words, i, 1);
        write_page(words, i, 2);
    }
    for i in 0..nr_pages {
        check_page(words, i, if i % 3 == 0 { 2 } else { 1 });
    }
    let st = quiet_stats(&p);
    assert_eq!((st.fault_error, st.slots_leaked, st.limit_overrun), (0, 0, 0), "{st:?}");
}

in_both_modes!(
    dirty_neighbours_leave_with_their_victim() =>
    thread_mode_dirty_neighbours_leave_with_their_victim,
    signal_mode_dirty_neighbours_leave_with_their_victim
);

fn never_written_pages_take_no_slot(mode: FaultMode) {
    let p = pager(mode, MIB, 16 * MIB);
    let region = p.map(8 * MIB as usize).unwrap();
    let words = region.as_atomic_u64s();
    let nr_pages = region.len() / PAGE_SIZE;
    for _ in 0..2 {
        for i in 0..nr_pages {
            check_page(words, i, 0);
        }
    }
    let st = quiet_stats(&p);
    assert_eq!(st.devices[0].slots_used, 0, "{st:?}");
    assert_eq!(st.pswpout, 0);
    if mode == FaultMode::Thread {
        // Read as the kernel's zero page: never charged, so never evicted.
        assert_eq!(st.swpout_zero, 0, "{st:?}");
        assert!(st.resident_peak_pages < 16, "{st:?}");
    } else {
        // Signal mode through the library API (system calls not routed): charged, and
        // found all zero at eviction.
        assert!(st.swpout_zero as usize >= nr_pages - 2 * (MIB as usize / PAGE_SIZE), "{st:?}");
    }
    // Written pages do take slots, and read back intact.
    for i in 0..nr_pages {
        write_page(words, i, 1);
    }
    for i in 0..nr_pages {
        check_page(words, i, 1);
    }
    let st = quiet_stats(&p);
    assert!(st.devices[0].slots_used > 0 && st.pswpout > 0, "{st:?}");
}

in_both_modes!(
    never_written_pages_take_no_slot() =>
    thread_mode_never_written_pages_take_no_slot,
    signal_mode_never_written_pages_take_no_slot
);

#[test]
fn dropping_a_region_returns_every_slot_and_cache_page() {
    for mode in [FaultMode::Thread, FaultMode::Signal] {
        let p = pager(mode, MIB, 32 * MIB);
        let keep = p.map(2 * MIB as usize).unwrap();
        let region = p.map(16 * MIB as usize).unwrap();
        let w = region.as_atomic_u64s();
        for i in 0..region.len() / PAGE_SIZE {
            write_page(w, i, 7);
        }
        let kw = keep.as_atomic_u64s();
        write_page(kw, 0, 3);
        let before = quiet_stats(&p);
        assert!(before.devices[0].slots_used > 0 && before.swapcache_pages > 0, "{before:?}");
        drop(region);
        let st = quiet_stats(&p);
        // Only the surviving region's pages remain accounted.
        assert!(st.resident_pages <= 1, "{st:?}");
        assert!(st.devices[0].slots_used <= 1, "{st:?}");
        assert!(st.swapcache_pages <= 1, "{st:?}");
        assert_eq!(p.measured_resident_pages().unwrap() as u64, st.resident_pages);
        check_page(kw, 0, 3);
        drop(keep);
        let st = quiet_stats(&p);
        assert_eq!((st.resident_pages, st.swapcache_pages, st.devices[0].slots_used), (0, 0, 0), "{st:?}");
        assert_eq!(p.measured_resident_pages().unwrap(), 0);
    }
}

/// Fills `region` past the limit so that page 0 is swapped out (FIFO reclaim: with random
/// advice no fault maps pages around it, so no page counts as a stream's, which reclaim
/// would take first).
fn push_page0_out(region: &uswap::Region, limit_pages: usize) {
    region.advise(uswap::Advice::Random);
    let w = region.as_atomic_u64s();
    write_every_page(w);
    assert!(region.len() / PAGE_SIZE > 4 * limit_pages);
}

fn pipe() -> (std::fs::File, std::fs::File) {
    let mut fds = [0; 2];
    // SAFETY: pipe(2) writes two descriptors into the array we own.
    assert_eq!(unsafe { libc::pipe(fds.as_mut_ptr()) }, 0);
    use std::os::fd::FromRawFd;
    // SAFETY: fresh descriptors, owned by nobody else.
    unsafe { (std::fs::File::from_raw_fd(fds[0]), std::fs::File::from_raw_fd(fds[1])) }
}

#[test]
fn thread_mode_system_calls_reach_swapped_out_pages() {
    use std::io::{Read, Write};
    let p = pager(FaultMode::Thread, MIB, 32 * MIB);
    let mut region = p.map(8 * MIB as usize).unwrap();
    push_page0_out(&region, (MIB / PAGE_SIZE as u64) as usize);
    assert_eq!(region.mapped_pages_in(0, 2 * PAGE_SIZE).unwrap(), 0, "pages 0 and 1 are swapped out");
    // write(2) from a swapped-out page: the kernel reads it through the fault handler.
    let (mut rd, mut wr) = pipe();
    wr.write_all(&region.as_slice()[PAGE_SIZE..2 * PAGE_SIZE]).unwrap();
    let mut got = vec![0u8; PAGE_SIZE];
    rd.read_exact(&mut got).unwrap();
    let expect: Vec<u8> = (0..WORDS).flat_map(|k| word(1, 1, k).to_ne_bytes()).collect();
    assert_eq!(got, expect);
    // read(2) into a swapped-out page: the kernel writes it through the fault handler.
    let payload: Vec<u8> = (0..PAGE_SIZE).map(|i| (i * 7 % 256) as u8).collect();
    wr.write_all(&payload).unwrap();
    rd.read_exact(&mut region.as_mut_slice()[..PAGE_SIZE]).unwrap();
    assert_eq!(&region.as_slice()[..PAGE_SIZE], &payload[..]);
    assert_eq!(region.mapped_pages_in(0, 2 * PAGE_SIZE).unwrap(), 2, "both pages are back");
}

#[test]
fn signal_mode_system_calls_on_swapped_out_pages_fail_with_efault() {
    use std::io::Write;
    let p = pager(FaultMode::Signal, MIB, 32 * MIB);
    let region = p.map(8 * MIB as usize).unwrap();
    push_page0_out(&region, (MIB / PAGE_SIZE as u64) as usize);
    assert_eq!(region.mapped_pages_in(0, PAGE_SIZE).unwrap(), 0);
    let (_rd, mut wr) = pipe();
    let err = wr.write(&region.as_slice()[..PAGE_SIZE]).unwrap_err();
    assert_eq!(err.raw_os_error(), Some(libc::EFAULT), "documented: EFAULT in signal mode");
    // Touched from user code, the same page comes back intact.
    check_page(region.as_atomic_u64s(), 0, 1);
}

/// Signal mode: memory prepared for a system call under a pin stays in while reclaim runs
/// (other faults of the thread, at the limit), over the limit if it must (counted), so that
/// the call finds it; once the pin is dropped it goes out again. Before pins, a call whose
/// memory did not fit beside what the other faults needed was taken out again between its
/// preparation and the call (a shell's `execve` failed with `EFAULT` in a tree of twenty
/// processes under 16 MiB).
#[test]
fn signal_mode_pinned_memory_stays_in_until_the_pin_is_released() {
    use std::io::{Read, Seek, Write};
    let limit_pages = (MIB / PAGE_SIZE as u64) as usize;
    let p = pager(FaultMode::Signal, MIB, 32 * MIB);
    let region = p.map(8 * MIB as usize).unwrap();
    push_page0_out(&region, limit_pages);
    let w = region.as_atomic_u64s();
    let pinned_bytes = 2 * MIB as usize;
    let nr_pinned = pinned_bytes / PAGE_SIZE;
    let mut pin = uswap::Pin::new();
    let brought_in = uswap::prepare_user_access(&mut pin, region.as_ptr() as usize, pinned_bytes, false);
    assert!(brought_in.unwrap() > nr_pinned / 2, "{brought_in:?}");
    assert_eq!(region.mapped_pages_in(0, pinned_bytes).unwrap(), nr_pinned, "all of it in at once");
    // The thread faults on: its reclaim must take other pages.
    for i in 4 * nr_pinned / 2..region.len() / PAGE_SIZE {
        check_page(w, i, 1);
    }
    assert_eq!(region.mapped_pages_in(0, pinned_bytes).unwrap(), nr_pinned, "a pinned page went out");
    let mut f = tempfile();
    f.write_all(&region.as_slice()[..pinned_bytes]).expect("a write from pinned memory");
    let st = quiet_stats(&p);
    assert!(st.reclaim_pinned > 0 && st.limit_overrun > 0, "{st:?}");
    pin.release();
    for i in nr_pinned..region.len() / PAGE_SIZE {
        check_page(w, i, 1);
    }
    assert!(region.mapped_pages_in(0, pinned_bytes).unwrap() < nr_pinned / 2, "unpinned, it goes out");
    assert!(p.measured_resident_pages().unwrap() <= limit_pages + RECLAIM_BATCH_PAGES);
    let mut back = vec![0u8; pinned_bytes];
    f.rewind().unwrap();
    f.read_exact(&mut back).unwrap();
    assert!(back == region.as_slice()[..pinned_bytes], "the write carried other bytes");
    for i in 0..region.len() / PAGE_SIZE {
        check_page(w, i, 1);
    }
}

fn tempfile() -> std::fs::File {
    let path = std::env::temp_dir().join(format!("uswap-pin-{}", std::process::id()));
    let f = std::fs::OpenOptions::new().read(true).write(true).create(true).truncate(true).open(&path).unwrap();
    std::fs::remove_file(&path).unwrap();
    f
}

#[test]
fn two_pagers_in_one_process_in_both_modes() {
    let pagers = [
        pager(FaultMode::Thread, MIB, 16 * MIB),
        pager(FaultMode::Signal, 2 * MIB, 16 * MIB),
        pager(FaultMode::Signal, MIB, 16 * MIB),
    ];
    let regions: Vec<_> = pagers.iter().map(|p| p.map(6 * MIB as usize).unwrap()).collect();
    std::thread::scope(|s| {
        for (n, r) in regions.iter().enumerate() {
            s.spawn(move || {
                let w = r.as_atomic_u64s();
                let pages = r.len() / PAGE_SIZE;
                for v in 1..=3u64 {
                    for i in 0..pages {
                        write_page(w, i, v * 10 + n as u64);
                    }
                    for i in (0..pages).rev() {
                        check_page(w, i, v * 10 + n as u64);
                    }
                }
            });
        }
    });
    for (p, r) in pagers.iter().zip(&regions) {
        let st = p.stats();
        assert!(st.pswpout > 0 && st.pswpin > 0, "{st:?}");
        assert!(p.measured_resident_pages().unwrap() as u64 <= st.limit_pages + RECLAIM_BATCH_PAGES as u64);
        assert_eq!(r.pager().fault_mode(), p.fault_mode());
    }
}

#[test]
fn full_device_keeps_pages_resident_and_loses_nothing() {
    for mode in [FaultMode::Thread, FaultMode::Signal] {
        // One 2 MiB cluster of swap for 8 MiB of data under a 1 MiB limit.
        let p = pager(mode, MIB, 2 * MIB);
        let region = p.map(8 * MIB as usize).unwrap();
        let w = region.as_atomic_u64s();
        let pages = region.len() / PAGE_SIZE;
        for i in 0..pages {
            write_page(w, i, 5);
        }
        for i in 0..pages {
            check_page(w, i, 5);
        }
        let st = quiet_stats(&p);
        assert!(st.swap_alloc_fail > 0, "{st:?}");
        assert!(st.limit_overrun > 0, "{st:?}");
        // Every page is on the device, in RAM, or both (clean): overrun, not loss.
        assert_eq!(st.devices[0].slots_used + st.resident_pages - st.clean_pages, pages as u64, "{st:?}");
        assert!(st.resident_pages > st.limit_pages, "{st:?}");
        assert!(st.devices[0].slots_used + 1 >= st.devices[0].nr_slots, "the device filled up: {st:?}");
    }
}

#[test]
fn lowering_the_limit_reclaims_at_once() {
    let p = pager(FaultMode::Signal, 8 * MIB, 32 * MIB);
    let region = p.map(8 * MIB as usize).unwrap();
    let w = region.as_atomic_u64s();
    for i in 0..region.len() / PAGE_SIZE {
        write_page(w, i, 2);
    }
    assert!(p.measured_resident_pages().unwrap() > (6 * MIB as usize) / PAGE_SIZE);
    p.set_resident_limit(2 * MIB).unwrap();
    assert_eq!(p.resident_limit(), 2 * MIB);
    let measured = p.measured_resident_pages().unwrap();
    assert!(measured <= (2 * MIB as usize) / PAGE_SIZE, "measured {measured}");
    for i in 0..region.len() / PAGE_SIZE {
        check_page(w, i, 2);
    }
}

/// `far_below_limit`: true while the charge plus the bytes asked stay within a quarter of
/// the limit and nothing is on the devices, false past it or with pages out (what `uswap
/// run`'s heap reads before giving freed memory back).
#[test]
fn far_below_limit_means_within_a_quarter_of_the_limit() {
    let p = pager(FaultMode::Thread, 16 * MIB, 32 * MIB);
    let quarter = 4 * MIB as usize;
    assert!(p.far_below_limit(quarter));
    assert!(!p.far_below_limit(quarter + PAGE_SIZE));
    let region = p.map(8 * MIB as usize).unwrap();
    let w = region.as_atomic_u64s();
    for i in 0..(2 * MIB as usize) / PAGE_SIZE {
        write_page(w, i, 1);
    }
    let resident_bytes = p.stats().resident_pages as usize * PAGE_SIZE;
    assert!(resident_bytes >= 2 * MIB as usize, "{resident_bytes}");
    assert!(p.far_below_limit(quarter - resident_bytes));
    assert!(!p.far_below_limit(quarter - resident_bytes + PAGE_SIZE));
    // Pages on a device: not far below, however low the charge (a range kept then would
    // keep their slots).
    p.set_resident_limit(MIB).unwrap();
    p.set_resident_limit(64 * MIB).unwrap();
    assert!(p.stats().devices[0].slots_used > 0);
    assert!(!p.far_below_limit(0));
    for i in 0..(2 * MIB as usize) / PAGE_SIZE {
        check_page(w, i, 1);
    }
}

#[test]
fn bad_input_gives_errors_that_say_what_to_do() {
    let e = Pager::builder().resident_limit(4096).device(DeviceConfig::ram(64 * MIB)).build().unwrap_err();
    assert!(matches!(e, Error::LimitTooSmall { .. }), "{e}");
    assert!(e.to_string().contains("at least"), "{e}");
    let e = Pager::builder().resident_limit(8 * MIB).build().unwrap_err();
    assert!(matches!(e, Error::NoDevice), "{e}");
    assert!(e.to_string().contains("PagerBuilder::device"), "{e}");
    let e = Pager::builder().resident_limit(8 * MIB).device(DeviceConfig::ram(MIB)).build().unwrap_err();
    assert!(matches!(e, Error::DeviceTooSmall { .. }), "{e}");
    let p = pager(FaultMode::Thread, 8 * MIB, 8 * MIB);
    let e = p.map(0).unwrap_err();
    assert!(matches!(e, Error::ZeroLengthMap { .. }), "{e}");
    let e = p.map(uswap::MAX_REGION_BYTES + 1).unwrap_err();
    assert!(matches!(e, Error::MapTooLarge { .. }), "{e}");
    assert!(e.to_string().contains("split it"), "{e}");
    let e = p.set_resident_limit(4096).unwrap_err();
    assert!(matches!(e, Error::LimitTooSmall { .. }), "{e}");
    assert_eq!(p.resident_limit(), 8 * MIB, "a refused limit changes nothing");
}

/// `Pager::map_aligned`: each region starts at its alignment (a page to 32 MiB), its pages
/// keep their bytes through a limit a quarter of them, in both modes, and an alignment that
/// is not a power of two of at least a page is refused.
#[test]
fn aligned_regions_start_at_their_alignment_and_keep_every_byte() {
    for mode in [FaultMode::Signal, FaultMode::Thread] {
        let p = pager(mode, 2 * MIB, 64 * MIB);
        let mut regions = vec![];
        for align in [PAGE_SIZE, 64 << 10, 2 << 20, 32 << 20] {
            let region = p.map_aligned(2 * MIB as usize + PAGE_SIZE, align).unwrap();
            assert_eq!(region.as_ptr() as usize % align, 0, "{mode:?}: aligned to {align:#x}");
            assert_eq!(region.len(), 2 * MIB as usize + PAGE_SIZE, "{mode:?}");
            let w = region.as_atomic_u64s();
            for i in 0..region.len() / PAGE_SIZE {
                write_page(w, i, align as u64);
            }
            regions.push((align, region));
        }
        assert!(p.measured_resident_pages().unwrap() <= (2 * MIB as usize) / PAGE_SIZE, "{mode:?}");
        for (align, region) in &regions {
            let w = region.as_atomic_u64s();
            for i in 0..region.len() / PAGE_SIZE {
                check_page(w, i, *align as u64);
            }
        }
        for align in [0, 2048, 3 * PAGE_SIZE, uswap::MAX_REGION_BYTES * 2] {
            let e = p.map_aligned(PAGE_SIZE, align).unwrap_err();
            assert!(matches!(e, Error::BadAlignment { .. }), "{align:#x}: {e}");
        }
    }
}

#[test]
fn map_sizes_near_the_top_of_usize_are_refused_with_their_size() {
    // Rounding a size near usize::MAX up to whole pages overflowed: a panic with overflow
    // checks, and without them a wrapped length of 0 and an error about "0 bytes".
    let p = pager(FaultMode::Thread, 8 * MIB, 8 * MIB);
    let max = uswap::MAX_REGION_BYTES;
    for len in [usize::MAX, usize::MAX - PAGE_SIZE + 2, usize::MAX / 2 + 1, max + 1] {
        let e = p.map(len).unwrap_err();
        match &e {
            Error::MapTooLarge { len_bytes, max_bytes } => {
                assert_eq!((*len_bytes, *max_bytes), (len as u64, max as u64), "{e}");
            }
            other => panic!("map({len}): {other}"),
        }
        let msg = e.to_string();
        assert!(msg.contains(&len.to_string()) && msg.contains(&max.to_string()), "{msg}");
        assert!(msg.contains("MAX_REGION_BYTES"), "{msg}");
    }
    // Sizes that are not whole pages are rounded up, as documented.
    for (len, want) in [(1, PAGE_SIZE), (PAGE_SIZE, PAGE_SIZE), (PAGE_SIZE + 1, 2 * PAGE_SIZE)] {
        let r = p.map(len).unwrap();
        assert_eq!(r.len(), want, "map({len})");
        r.as_slice()[want - 1..].iter().for_each(|b| assert_eq!(*b, 0));
    }
}

#[test]
fn a_region_outlives_its_pager_handle() {
    let p = pager(FaultMode::Thread, MIB, 16 * MIB);
    let region = p.map(4 * MIB as usize).unwrap();
    drop(p);
    let w = region.as_atomic_u64s();
    for i in 0..region.len() / PAGE_SIZE {
        write_page(w, i, 9);
    }
    for i in 0..region.len() / PAGE_SIZE {
        check_page(w, i, 9);
    }
    assert!(region.pager().stats().pswpout > 0);
}

#[test]
fn regions_and_pagers_are_shared_across_threads() {
    let p = Arc::new(pager(FaultMode::Signal, MIB, 16 * MIB));
    let region = Arc::new(p.map(4 * MIB as usize).unwrap());
    let handles: Vec<_> = (0..2)
        .map(|t| {
            let region = region.clone();
            std::thread::spawn(move || {
                let w = region.as_atomic_u64s();
                for i in (t..region.len() / PAGE_SIZE).step_by(2) {
                    write_page(w, i, 4);
                }
            })
        })
        .collect();
    for h in handles {
        h.join().unwrap();
    }
    for i in 0..region.len() / PAGE_SIZE {
        check_page(region.as_atomic_u64s(), i, 4);
    }
}

#[test]
fn device_lists_parse_in_priority_order() {
    let d = DeviceConfig::parse_list("ram:64MiB, ram", 32 * MIB).unwrap();
    assert_eq!(d.len(), 2);
    let p = Pager::builder().resident_limit(MIB).device(d[0].clone()).device(d[1].clone()).build().unwrap();
    let st = p.stats();
    assert_eq!(st.devices[0].nr_slots, 64 * MIB / PAGE_SIZE as u64, "first listed = highest priority");
    assert_eq!(st.devices[1].nr_slots, 32 * MIB / PAGE_SIZE as u64);
    assert!(st.devices[0].priority > st.devices[1].priority);
    for bad in ["floppy", "ram:12XB", "", "ram:"] {
        let e = DeviceConfig::parse_list(bad, MIB).unwrap_err();
        assert!(matches!(e, Error::BadDeviceSpec { .. }), "{bad}: {e}");
    }
}

/// Limits outside what a pager takes are refused, at build and on a running pager, saying
/// the bound; a limit far above the machine's memory within it is taken (its reclaim queue
/// sized by the RAM, not by the limit: 2^64 - 1 asked for 256 PiB of address space and
/// failed with a message about a queue).
#[test]
fn limits_outside_the_bounds_are_refused_and_a_huge_one_within_them_is_taken() {
    let build = |limit: u64| Pager::builder().resident_limit(limit).device(DeviceConfig::ram(32 * MIB)).build();
    for bad in [0, uswap::MIN_LIMIT_BYTES - 1, uswap::MAX_LIMIT_BYTES + 1, u64::MAX] {
        let e = build(bad).expect_err("refused");
        assert!(matches!(e, Error::LimitTooSmall { .. } | Error::LimitTooLarge { .. }), "{bad}: {e}");
        assert_eq!(e.kind(), uswap::ErrorKind::InvalidArgument, "{bad}: {e}");
    }
    let p = build(uswap::MAX_LIMIT_BYTES).expect("a limit of 1 PiB is taken");
    let e = p.set_resident_limit(u64::MAX).unwrap_err();
    assert!(e.to_string().contains("above the most a pager takes"), "{e}");
    assert_eq!(p.resident_limit(), uswap::MAX_LIMIT_BYTES, "a refused limit changes nothing");
    let region = p.map(4 * MIB as usize).unwrap();
    rewrite_and_check(region.as_atomic_u64s(), 2);
}

/// A device that declines pages (`zpool:reject` with pages that do not compress) and no
/// device after it: each charge over the limit is made at once, counted and said, instead
/// of waiting out 100-250 ms for rounds that stage and offer the same pages again (64 MiB
/// of random bytes under 4 MiB took minutes).
#[test]
fn pages_no_device_takes_are_charged_over_the_limit_at_once() {
    let zpool = DeviceConfig::zpool(32 * MIB).incompressible(uswap::backend::zpool::Incompressible::Reject);
    let p = Pager::builder().resident_limit(4 * MIB).device(zpool).build().expect("pager");
    let region = p.map(32 * MIB as usize).unwrap();
    let bytes = region.as_atomic_u64s();
    let started = Instant::now();
    let mut rng = Rng(0x5e1ec7);
    let noise: Vec<u64> = (0..bytes.len()).map(|_| rng.next()).collect();
    for (w, &v) in bytes.iter().zip(&noise) {
        w.store(v, Ordering::Relaxed);
    }
    let took = started.elapsed();
    for (w, &v) in bytes.iter().zip(&noise) {
        assert_eq!(w.load(Ordering::Relaxed), v);
    }
    let st = p.stats();
    assert!(st.limit_overrun > 0 && st.swap_alloc_fail > 0, "{st:?}");
    assert!(took < Duration::from_secs(10), "8,192 pages no device takes took {took:?}: {st:?}");
    // Lowering the limit over them: the devices are full for these pages (ENOSPC in C),
    // said at once. Before, it waited 2 s for victims "busy on other threads" (there are
    // none) and said so, with advice to call again that could never work.
    let started = Instant::now();
    let e = p.set_resident_limit(MIB).expect_err("no device takes these pages");
    assert_eq!(e.kind(), uswap::ErrorKind::LimitNotReached, "{e}");
    assert!(started.elapsed() < Duration::from_secs(1), "took {:?}: {e}", started.elapsed());
    assert_eq!(p.resident_limit(), MIB, "the limit is in place all the same");
}

/// A pager with a 1 MiB limit and an 8 MiB region of it, every page written (version 1) and
/// then read back twice: in thread mode the second pass swaps each page in clean and drops
/// it again. One fault per page: readahead (whose pages come in writable on a RAM device)
/// is tested in tests/readahead.rs. Returns the stats once the pager is quiet.
fn written_then_read_twice(mode: FaultMode) -> (Pager, uswap::Region, uswap::Stats) {
    let p = pager(mode, MIB, 32 * MIB);
    let region = p.map(8 * MIB as usize).unwrap();
    region.advise(uswap::Advice::Random);
    let pages = region.len() / PAGE_SIZE;
    let w = region.as_atomic_u64s();
    write_every_page(w);
    for _ in 0..2 {
        for i in 0..pages {
            check_page(w, i, 1);
        }
    }
    let st = quiet_stats(&p);
    (p, region, st)
}

/// A page read back from a device and not written since keeps its slot: reclaim drops it
/// without writing it again; its first write takes a write-protect fault and frees the slot.
fn clean_pages_keep_their_slot(mode: FaultMode) {
    let (p, mut region, st) = written_then_read_twice(mode);
    let pages = region.len() / PAGE_SIZE;
    assert!(st.swpout_clean as usize >= pages / 2, "{st:?}");
    assert!(st.clean_pages > 0, "{st:?}");
    // Written pages go out once; re-reading them wrote nothing more.
    assert!(st.pswpout < pages as u64 + 512, "clean pages were written again: {st:?}");
    let (before, wp_before) = (st.pswpout, st.pgfault_wp);
    {
        // A few pages read back (clean, and resident: they fit under the limit), then written.
        let w = region.as_atomic_u64s();
        let few = 64;
        for i in 0..few {
            check_page(w, i, 1);
        }
        let clean_before = p.stats().clean_pages;
        assert!(clean_before >= few as u64 / 2, "pages read back are clean");
        for i in 0..few {
            write_page(w, i, 2);
        }
        let st = p.stats();
        // (A page that came back from the swap cache instead of the device is not clean.)
        assert!(st.pgfault_wp >= wp_before + few as u64 / 2, "first writes to clean pages fault: {st:?}");
        assert!(st.clean_pages < clean_before, "and leave them dirty: {st:?}");
        for i in 0..pages {
            write_page(w, i, 2);
        }
        for i in 0..pages {
            check_page(w, i, 2);
        }
    }
    let st = quiet_stats(&p);
    assert!(st.pswpout > before, "written pages are written again: {st:?}");
    if mode == FaultMode::Thread {
        // The kernel writing into a clean page (read(2) into it) takes the same fault.
        use std::io::{Read, Write};
        let page = (pages - 1) * PAGE_SIZE;
        for i in 0..pages {
            check_page(region.as_atomic_u64s(), i, 2);
        }
        let mut f = tempfile_with(&[0x5a; PAGE_SIZE]);
        f.read_exact(&mut region.as_mut_slice()[page..page + PAGE_SIZE]).unwrap();
        assert!(region.as_slice()[page..page + PAGE_SIZE].iter().all(|&b| b == 0x5a));
        let _ = f.flush();
    }
}

fn tempfile_with(bytes: &[u8]) -> std::fs::File {
    use std::io::{Seek, Write};
    let path =
        std::env::temp_dir().join(format!("uswap-clean-{}-{:?}", std::process::id(), std::thread::current().id()));
    let mut f = std::fs::OpenOptions::new().read(true).write(true).create(true).truncate(true).open(&path).unwrap();
    std::fs::remove_file(&path).unwrap();
    f.write_all(bytes).unwrap();
    f.rewind().unwrap();
    f
}

#[test]
fn thread_mode_clean_pages_keep_their_slot() {
    clean_pages_keep_their_slot(FaultMode::Thread);
}

/// `MADV_FREE` sends the same REMOVE event as `MADV_DONTNEED` but leaves the pages in place
/// until the kernel needs the memory. A clean page (write-protected) freed that way and then
/// written faulted into the engine as a page it held for gone; mapping a zero page there
/// failed (EEXIST) on every attempt and the thread got SIGBUS. Now the page is taken as
/// resident and made writable, with the contents the write left.
#[test]
fn thread_mode_writes_to_clean_pages_after_madv_free() {
    let (p, region, _) = written_then_read_twice(FaultMode::Thread);
    let pages = region.len() / PAGE_SIZE;
    let w = region.as_atomic_u64s();
    let few = 64;
    for i in 0..few {
        check_page(w, i, 1);
    }
    assert!(p.stats().clean_pages >= few as u64 / 2, "pages read back are clean: {:?}", p.stats());
    // SAFETY: MADV_FREE on the region's own first pages; they stay mapped (or read as zero
    // once the kernel takes them), which is what the checks below allow.
    let r = unsafe { libc::madvise(region.as_ptr().cast(), few * PAGE_SIZE, libc::MADV_FREE) };
    assert_eq!(r, 0, "madvise: {}", std::io::Error::last_os_error());
    for i in 0..few {
        write_page(w, i, 3);
    }
    for i in 0..few {
        check_page(w, i, 3);
    }
    for i in few..pages {
        check_page(w, i, 1);
    }
    let st = quiet_stats(&p);
    assert_eq!(st.fault_error, 0, "{st:?}");
    assert!(st.uffd_remove >= 1, "the MADV_FREE reached the engine: {st:?}");
}

/// Signal mode keeps no page clean unless every system call is routed through the guard
/// (`uswap::sigbus::note_system_calls_routed`, which `uswap run` declares): the kernel could
/// not write a write-protected page (`read(2)` into it failed with EFAULT), so every page
/// comes back writable, frees its slot, and is written again when evicted. (Routed: see
/// `uswap-cli/tests/run.rs`, `signal_mode_keeps_pages_read_back_clean_while_the_bet_wins`.)
#[test]
fn signal_mode_pages_come_back_writable() {
    let (_p, region, st) = written_then_read_twice(FaultMode::Signal);
    let pages = region.len() / PAGE_SIZE;
    assert!(st.pswpin >= pages as u64, "{st:?}");
    assert_eq!((st.clean_pages, st.swpout_clean, st.pgfault_wp), (0, 0, 0), "{st:?}");
    assert!(st.pswpout >= pages as u64 + pages as u64 / 2, "pages read back are written again: {st:?}");
}

/// `set_resident_limit` while other threads fault: rounds that find every victim busy (in a
/// fault, or being written) are not a full device. Only a full device may be reported as one.
fn shrinking_under_faults_is_not_a_full_device(mode: FaultMode) {
    // A file device: its writes keep victims busy for a while.
    let p = Pager::builder()
        .resident_limit(8 * MIB)
        .fault_mode(mode)
        .device(DeviceConfig::file("/var/tmp", 256 * MIB))
        .build()
        .expect("pager");
    let region = p.map(32 * MIB as usize).unwrap();
    let nr_pages = region.len() / PAGE_SIZE;
    let words = region.as_atomic_u64s();
    let threads = 4;
    let stop = std::sync::atomic::AtomicBool::new(false);
    let errors: Vec<String> = std::thread::scope(|s| {
        for t in 0..threads {
            let stop = &stop;
            s.spawn(move || {
                let mine: Vec<usize> = (t..nr_pages).step_by(threads).collect();
                let mut version = vec![0u64; mine.len()];
                let mut rng = Rng(0x51ab_0000 + t as u64);
                while !stop.load(Ordering::Relaxed) {
                    let j = (rng.next() % mine.len() as u64) as usize;
                    check_page(words, mine[j], version[j]);
                    version[j] += 1;
                    write_page(words, mine[j], version[j]);
                }
                for (j, &i) in mine.iter().enumerate() {
                    check_page(words, i, version[j]);
                }
            });
        }
        let mut errors = Vec::new();
        let t0 = std::time::Instant::now();
        let mut k = 0u64;
        while t0.elapsed() < std::time::Duration::from_secs(4) {
            let limit = if k % 2 == 0 { MIN_LIMIT_BYTES } else { 8 * MIB };
            if let Err(e) = p.set_resident_limit(limit) {
                errors.push(format!("limit {limit}: {e}"));
            }
            k += 1;
        }
        stop.store(true, Ordering::Relaxed);
        errors
    });
    let st = p.stats();
    assert!(errors.is_empty(), "{} of the limit changes failed, first: {}; {st:?}", errors.len(), errors[0]);
    assert!(st.pswpout > 0 && st.pswpin > 0, "the run must swap: {st:?}");
}

in_both_modes!(
    shrinking_under_faults_is_not_a_full_device() =>
    thread_mode_shrinking_under_faults_is_not_a_full_device,
    signal_mode_shrinking_under_faults_is_not_a_full_device
);

/// A page a program uses often, among many it uses rarely, is spared by reclaim once it has
/// faulted back within its refault distance (`lru.rs`, the kernel's working-set rule): 64
/// hot pages, spread over the region, are all read and written every round, between which half the
/// limit's worth of cold pages, drawn at random from eight times the limit, are read. A FIFO
/// evicts each hot page every other round (about 1,000 faults in 32 rounds; 670-1,020
/// measured without the rule); sparing them once, a hot page comes back about every fourth
/// round (500-510 measured). Most cold refaults, about seven limits apart, are not taken for
/// the working set (those drawn again within a limit are: one in seven, as for the kernel).
/// Every byte read is checked.
fn pages_used_often_are_spared(mode: FaultMode) {
    let limit = 4 * MIB;
    let limit_pages = (limit / PAGE_SIZE as u64) as usize;
    let p = pager(mode, limit, 64 * MIB);
    let region = p.map(8 * limit as usize).unwrap();
    let words = region.as_atomic_u64s();
    let nr_pages = region.len() / PAGE_SIZE;
    let hot: Vec<usize> = (0..64).map(|k| k * (nr_pages / 64) + 13).collect();
    write_every_page(words);
    let mut rng = Rng(0x5eed);
    let (mut hot_faults, mut hot_activations) = (0, 0);
    let (mut cold_faults, mut cold_activations) = (0, 0);
    let faults = |s: &uswap::Stats| s.pgmajfault + s.pgfault_swapcache;
    let rounds = 40;
    for round in 0..rounds {
        let before = p.stats();
        for k in 0..hot.len() {
            // In a different order each round: no stream for readahead to follow. Written
            // (with the same bytes): a page read back clean is not spared.
            let i = hot[(k * 37 + round * 11) % hot.len()];
            check_page(words, i, 1);
            write_page(words, i, 1);
        }
        let mid = p.stats();
        for _ in 0..limit_pages / 2 {
            check_page(words, (rng.next() % nr_pages as u64) as usize, 1);
        }
        let after = p.stats();
        if round >= 8 {
            hot_faults += faults(&mid) - faults(&before);
            hot_activations += mid.workingset_activate - before.workingset_activate;
            cold_faults += faults(&after) - faults(&mid);
            cold_activations += after.workingset_activate - mid.workingset_activate;
        }
    }
    let fifo_faults = (rounds - 8) as u64 * hot.len() as u64 / 2;
    assert!(hot_activations > 0, "no hot page was taken for the working set ({hot_faults} hot faults)");
    assert!(
        hot_faults * 5 <= fifo_faults * 3,
        "{hot_faults} faults on hot pages: a FIFO makes about {fifo_faults} (activated: {hot_activations})"
    );
    assert!(cold_activations * 4 <= cold_faults, "{cold_activations} of {cold_faults} cold refaults activated");
    let st = quiet_stats(&p);
    assert_eq!((st.fault_error, st.slots_leaked, st.limit_overrun), (0, 0, 0), "{st:?}");
}

in_both_modes!(
    pages_used_often_are_spared() =>
    thread_mode_pages_used_often_are_spared,
    signal_mode_pages_used_often_are_spared
);

/// `Pager::unmanage` (what `uswap run`'s library does before an `mprotect` to executable or
/// read-only: a JIT's code) copies the pages that are out back into place while another
/// thread's `madvise(MADV_DONTNEED)` sends events. The kernel refuses every copy (`EAGAIN`)
/// until such an event is read; `unmanage` held the events' reader lock while it copied, so
/// no event could be read, and after its 10,000 tries each page was counted lost and read
/// zero. Every byte is checked.
fn unmanage_while_another_thread_discards(mode: FaultMode) {
    const CHUNK_PAGES: usize = 64;
    let limit = 4 * MIB;
    let p = pager(mode, limit, 64 * MIB);
    let region = p.map(4 * limit as usize).unwrap();
    let other = p.map(2 * MIB as usize).unwrap();
    let nr_pages = region.len() / PAGE_SIZE;
    let w = region.as_atomic_u64s();
    (0..nr_pages).for_each(|i| write_page(w, i, 1));
    assert!(p.stats().pswpout > 0, "{mode:?}: nothing went out: {:?}", p.stats());
    let stop = std::sync::atomic::AtomicBool::new(false);
    let discards = AtomicU64::new(0);
    /// Stops the discarding thread however the main thread leaves the scope (a failed check
    /// would otherwise leave the scope waiting for it for ever).
    struct StopOnDrop<'a>(&'a std::sync::atomic::AtomicBool);
    impl Drop for StopOnDrop<'_> {
        fn drop(&mut self) {
            self.0.store(true, Ordering::Release);
        }
    }
    std::thread::scope(|s| {
        let _stop = StopOnDrop(&stop);
        s.spawn(|| {
            let ow = other.as_atomic_u64s();
            // Bounded by the main thread's work, which sets `stop`.
            while !stop.load(Ordering::Acquire) {
                // SAFETY: MADV_DONTNEED on a region of our own, which reads zero after it.
                let r = unsafe { libc::madvise(other.as_ptr() as *mut libc::c_void, other.len(), libc::MADV_DONTNEED) };
                assert_eq!(r, 0, "madvise: {}", std::io::Error::last_os_error());
                ow[0].store(1, Ordering::Relaxed);
                discards.fetch_add(1, Ordering::Relaxed);
            }
        });
        for first in (0..nr_pages).step_by(CHUNK_PAGES) {
            let addr = region.as_ptr() as usize + first * PAGE_SIZE;
            assert_eq!(p.unmanage(addr, CHUNK_PAGES * PAGE_SIZE).expect("unmanage"), CHUNK_PAGES, "pages let go of");
            (first..first + CHUNK_PAGES).for_each(|i| check_page(w, i, 1));
        }
    });
    let st = quiet_stats(&p);
    assert!(discards.load(Ordering::Relaxed) > 0, "{mode:?}: no discard ran beside the unmanaging");
    assert_eq!(st.fault_error, 0, "{mode:?}: {st:?}");
}

in_both_modes!(unmanage_while_another_thread_discards() => thread_mode_unmanage_while_another_thread_discards,
    signal_mode_unmanage_while_another_thread_discards);

/// Regions at once far past the 4,096 the registry held before, as V8's heap makes them
/// (each 256 KiB page a mapping of its own; Node.js with two worker threads had some
/// 10,000): every one is managed, paged out and read back, and each fault finds its region
/// among thousands (the registry's hints, then its scan).
fn many_small_regions_are_paged(mode: FaultMode) {
    const NR_REGIONS: usize = 6_000;
    const PAGES: usize = 2;
    let p = pager(mode, 4 * MIB, 256 * MIB);
    let regions: Vec<_> =
        (0..NR_REGIONS).map(|n| p.map(PAGES * PAGE_SIZE).unwrap_or_else(|e| panic!("{n}: {e}"))).collect();
    // Version `v` of region `n`'s page `i`: each page's contents are its own.
    let version = |v: u64, n: usize| v << 32 | n as u64;
    for v in 1..=2 {
        for (n, r) in regions.iter().enumerate() {
            (0..PAGES).for_each(|i| write_page(r.as_atomic_u64s(), i, version(v, n)));
        }
        // Read back in a scattered order (7919 is prime to NR_REGIONS).
        for k in 0..NR_REGIONS {
            let n = k * 7919 % NR_REGIONS;
            (0..PAGES).for_each(|i| check_page(regions[n].as_atomic_u64s(), i, version(v, n)));
        }
    }
    let st = p.stats();
    assert!(
        st.pswpout > (NR_REGIONS * PAGES) as u64 / 2 && st.pswpin > 0,
        "{mode:?}: the regions were not paged: {st:?}"
    );
    assert_eq!((st.limit_overrun, st.fault_error), (0, 0), "{mode:?}: {st:?}");
    drop(regions);
    assert_eq!(p.stats().slots_leaked, 0);
}

#[test]
fn thread_mode_many_small_regions_are_paged() {
    many_small_regions_are_paged(FaultMode::Thread);
}

#[test]
fn signal_mode_many_small_regions_are_paged() {
    many_small_regions_are_paged(FaultMode::Signal);
}
