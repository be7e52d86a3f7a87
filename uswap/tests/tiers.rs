//! Tiers and failures: the compressed pool in front of another device, writeback and spill
//! between them, checksums, and fault injection. Every byte read is verified; a failure may
//! slow the engine down or keep pages in RAM, never change what the application reads.

use uswap::{BackgroundReclaim, Compressor, DeviceConfig, FaultInjection, FaultMode, Incompressible, Pager, PAGE_SIZE};

mod common;
use common::*;

fn build(mode: FaultMode, limit: u64, devices: Vec<DeviceConfig>) -> Pager {
    let mut b = Pager::builder().resident_limit(limit).fault_mode(mode);
    for d in devices {
        b = b.device(d);
    }
    b.build().expect("pager")
}

fn zstd_pool(size: u64) -> DeviceConfig {
    DeviceConfig::zpool(size).compressor(Compressor::Zstd { level: 3 })
}

/// `BackgroundReclaim::Auto` (the default) reclaims in the background, kswapd-style, as
/// soon as one device's writes are slow (a file on a disk here; the Redis tier in
/// `redis_tier.rs`); has the background thread write what the faults move out when the
/// first device's writes are dear (a zstd pool); and reclaims only while the application
/// is idle with RAM and the lz4 pool (a zstd pool below one included: it takes pages from
/// the background thread only).
#[test]
fn background_reclaim_auto_is_always_with_a_slow_device() {
    let dir = std::env::temp_dir();
    for (devices, want) in [
        (vec![DeviceConfig::ram(16 * MIB)], BackgroundReclaim::WhenIdle),
        (vec![DeviceConfig::zpool(16 * MIB)], BackgroundReclaim::WhenIdle),
        (vec![DeviceConfig::file(&dir, 16 * MIB)], BackgroundReclaim::Always),
        (
            vec![DeviceConfig::zpool(4 * MIB).priority(10), DeviceConfig::file(&dir, 16 * MIB)],
            BackgroundReclaim::Always,
        ),
        (vec![zstd_pool(16 * MIB)], BackgroundReclaim::StageTwo),
        (vec![DeviceConfig::zpool(4 * MIB).priority(1), zstd_pool(16 * MIB)], BackgroundReclaim::WhenIdle),
        (vec![zstd_pool(4 * MIB).priority(1), DeviceConfig::file(&dir, 16 * MIB)], BackgroundReclaim::Always),
    ] {
        let names: Vec<String> = devices.iter().map(|d| format!("{d:?}")).collect();
        let p = build(FaultMode::Thread, 4 * MIB, devices);
        assert_eq!(p.background_reclaim(), want, "{names:?}");
    }
    let chosen = Pager::builder()
        .resident_limit(4 * MIB)
        .background_reclaim(BackgroundReclaim::WhenIdle)
        .device(DeviceConfig::file(&dir, 16 * MIB))
        .build()
        .expect("pager");
    assert_eq!(chosen.background_reclaim(), BackgroundReclaim::WhenIdle, "a policy given explicitly is kept");
}

#[test]
fn compressed_pool_alone_in_both_modes() {
    for mode in [FaultMode::Thread, FaultMode::Signal] {
        let p = build(mode, 2 * MIB, vec![DeviceConfig::zpool(32 * MIB)]);
        let st = churn(&p, 8 * MIB, 4000, || {});
        let pool = st.devices[0].backend.clone().expect("the pool reports its counters");
        assert!(st.pswpout > 0 && st.pswpin > 0, "{st:?}");
        assert!(pool.stored_pages > 0 && pool.incompressible_pages > 0, "{pool:?}");
        assert!(pool.compressed_bytes < pool.stored_pages * PAGE_SIZE as u64, "even pages compress: {pool:?}");
        assert_eq!((st.fault_error, st.limit_overrun, st.slots_leaked), (0, 0, 0), "{st:?}");
    }
}

/// A zstd pool first: the faults move their victims out and the background thread
/// compresses and writes them (`BackgroundReclaim::StageTwo`, what `Auto` picks), while two
/// threads read and rewrite pages at random; every byte read back, no charge over the limit.
#[test]
fn a_zstd_pool_is_written_by_the_background_thread_in_both_modes() {
    for mode in [FaultMode::Thread, FaultMode::Signal] {
        let p = build(mode, 2 * MIB, vec![zstd_pool(32 * MIB)]);
        assert_eq!(p.background_reclaim(), BackgroundReclaim::StageTwo);
        let st = churn(&p, 8 * MIB, 4000, || {});
        assert!(st.pswpin > 0 && st.pgsteal_direct > 0, "the faults moved victims out: {st:?}");
        assert!(st.pswpout_background > 0 && st.pswpout_background <= st.pswpout, "{mode:?}: {st:?}");
        assert_eq!((st.fault_error, st.limit_overrun, st.slots_leaked), (0, 0, 0), "{st:?}");
    }
}

/// The word page `i` is filled with in `same_filled_pages_keep_no_pool_memory`: distinct per
/// page and never zero (an odd multiplier is a bijection that maps only 0 to 0), so the
/// engine's zero-page path does not catch them and the pool does.
fn fill_word(i: usize) -> u64 {
    (i as u64 + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15)
}

/// Pages each filled with one repeated non-zero word are stored in the compressed pool as
/// their word (zram's same pages): every byte reads back, and the pool holds no memory for
/// them. The device keeps checksums too, checked on every read.
fn same_filled_pages_keep_no_pool_memory(mode: FaultMode) {
    let limit = 2 * MIB;
    let p = build(mode, limit, vec![DeviceConfig::zpool(32 * MIB).checksum(true)]);
    let region = p.map(12 * MIB as usize).unwrap();
    let words = region.as_atomic_u64s();
    let nr_pages = region.len() / PAGE_SIZE;
    let fill = |i: usize| {
        for w in &words[i * WORDS..(i + 1) * WORDS] {
            w.store(fill_word(i), std::sync::atomic::Ordering::Relaxed);
        }
    };
    let check = |i: usize| {
        for (k, w) in words[i * WORDS..(i + 1) * WORDS].iter().enumerate() {
            assert_eq!(w.load(std::sync::atomic::Ordering::Relaxed), fill_word(i), "page {i} word {k}");
        }
    };
    for round in 0..2 {
        (0..nr_pages).for_each(fill);
        (0..nr_pages).for_each(check);
        // Backwards too: the pages read first are the ones the forward pass sent out.
        (0..nr_pages).rev().for_each(check);
        let st = quiet_stats(&p);
        let pool = st.devices[0].backend.clone().expect("the pool reports its counters");
        let out_pages = nr_pages as u64 - limit / PAGE_SIZE as u64;
        assert!(pool.same_filled_stores >= (round + 1) * out_pages, "round {round}: {st:?}");
        assert!(pool.same_filled_pages > 0, "{pool:?}");
        assert_eq!(pool.same_filled_pages, pool.stored_pages, "every page stored is same-filled: {pool:?}");
        assert_eq!((pool.pool_bytes, pool.compressed_bytes, pool.compression_ratio), (0, 0, 0.0), "{pool:?}");
        // A page sent out half written (its head filled, its tail still zero) is compressed;
        // it is written again at once and leaves the pool, but may have taken a chunk.
        assert!(pool.pool_peak_bytes <= 2 * uswap::backend::zpool::CHUNK_BYTES as u64, "{pool:?}");
        assert_eq!(st.swpout_zero, 0, "no page was zero: {st:?}");
        assert_eq!((st.fault_error, st.checksum_errors, st.slots_leaked), (0, 0, 0), "{st:?}");
    }
}

in_both_modes!(same_filled_pages_keep_no_pool_memory() =>
    thread_mode_same_filled_pages_keep_no_pool_memory, signal_mode_same_filled_pages_keep_no_pool_memory);

#[test]
fn a_full_pool_writes_its_oldest_pages_back_to_the_next_device() {
    let cap = 2 * MIB;
    let p = build(
        FaultMode::Signal,
        2 * MIB,
        vec![DeviceConfig::zpool(cap).priority(10), DeviceConfig::ram(64 * MIB).checksum(true)],
    );
    let region = p.map(24 * MIB as usize).unwrap();
    let words = region.as_atomic_u64s();
    let nr_pages = region.len() / PAGE_SIZE;
    for i in 0..nr_pages {
        write_page(words, i, 3);
    }
    // The background reclaimer moves pages down while the pool is above its threshold.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while p.stats().writeback == 0 && std::time::Instant::now() < deadline {
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    for i in 0..nr_pages {
        check_page(words, i, 3);
    }
    let st = p.stats();
    let pool = st.devices[0].backend.clone().unwrap();
    assert!(st.writeback > 0, "nothing was written back: {st:?}");
    assert!(pool.pool_bytes <= cap + 64 * 1024, "the pool kept to its cap: {pool:?}");
    assert!(pool.reject_pool_full > 0 || st.devices[1].slots_used > 0, "{st:?}");
    assert_eq!((st.fault_error, st.checksum_errors), (0, 0), "{st:?}");
}

#[test]
fn incompressible_pages_pass_to_the_next_device() {
    let p = build(
        FaultMode::Thread,
        MIB,
        vec![
            DeviceConfig::zpool(16 * MIB).incompressible(Incompressible::Reject).priority(1),
            DeviceConfig::ram(32 * MIB),
        ],
    );
    let st = churn(&p, 8 * MIB, 2000, || {});
    let pool = st.devices[0].backend.clone().unwrap();
    assert!(pool.reject_incompressible > 0, "{pool:?}");
    assert_eq!(pool.incompressible_pages, 0, "{pool:?}");
    assert!(st.swpout_spilled > 0 && st.devices[1].slots_used > 0, "{st:?}");
}

#[test]
fn failed_writes_keep_pages_in_ram_and_lose_nothing() {
    for mode in [FaultMode::Thread, FaultMode::Signal] {
        let f = FaultInjection { write_error_rate: 0.25, seed: 7, ..Default::default() };
        let p = build(mode, 2 * MIB, vec![DeviceConfig::ram(32 * MIB).inject_faults(f)]);
        let st = churn(&p, 8 * MIB, 4000, || {});
        assert!(st.swpout_error > 0, "{st:?}");
        assert!(st.pswpout > 0, "most writes still succeed: {st:?}");
        assert_eq!(st.fault_error, 0, "{st:?}");
    }
}

#[test]
fn failed_reads_are_retried_and_reported_with_the_page_address() {
    for mode in [FaultMode::Thread, FaultMode::Signal] {
        let f = FaultInjection { read_error_rate: 0.2, seed: 11, ..Default::default() };
        let p = build(mode, 2 * MIB, vec![DeviceConfig::zpool(64 * MIB).inject_faults(f)]);
        let region = p.map(8 * MIB as usize).unwrap();
        rewrite_and_check(region.as_atomic_u64s(), 3);
        let errors = p.recent_errors();
        assert!(!errors.is_empty(), "failed reads are reported");
        let base = region.as_ptr() as usize;
        for e in &errors {
            assert!(e.addr >= base && e.addr < base + region.len() && e.addr % PAGE_SIZE == 0, "{e}");
            assert!(e.to_string().contains("device read failed"), "{e}");
        }
        // Every page read back exactly (checked above), however many attempts it took.
    }
}

#[test]
fn checksums_catch_corruption_and_the_page_is_read_again() {
    let f = FaultInjection { corrupt_rate: 0.1, seed: 3, ..Default::default() };
    let p = build(FaultMode::Signal, 2 * MIB, vec![DeviceConfig::ram(32 * MIB).checksum(true).inject_faults(f)]);
    let st = churn(&p, 8 * MIB, 4000, || {});
    assert!(st.checksum_errors > 0, "{st:?}");
    assert!(p.recent_errors().iter().any(|e| e.to_string().contains("checksum mismatch")));
}

#[test]
fn a_long_random_run_with_every_failure_injected_reads_back_exactly() {
    let f = FaultInjection { read_error_rate: 0.05, write_error_rate: 0.1, corrupt_rate: 0.05, seed: 5 };
    let p = build(
        FaultMode::Signal,
        2 * MIB,
        vec![
            DeviceConfig::zpool(4 * MIB).checksum(true).inject_faults(f).priority(2),
            DeviceConfig::ram(64 * MIB).checksum(true).inject_faults(FaultInjection { seed: 9, ..f }),
        ],
    );
    let st = churn(&p, 16 * MIB, 20_000, || {});
    assert!(st.swpout_error > 0 && st.checksum_errors > 0, "{st:?}");
    assert!(st.writeback > 0 || st.swpout_spilled > 0, "both tiers were used: {st:?}");
}

#[test]
fn a_full_device_spills_to_the_next_one() {
    let p = build(FaultMode::Thread, MIB, vec![DeviceConfig::ram(2 * MIB).priority(5), DeviceConfig::ram(32 * MIB)]);
    let region = p.map(12 * MIB as usize).unwrap();
    let words = region.as_atomic_u64s();
    let pages = region.len() / PAGE_SIZE;
    for i in 0..pages {
        write_page(words, i, 4);
    }
    let st = p.stats();
    assert_eq!(st.devices[0].slots_used, st.devices[0].nr_slots, "the first device filled: {st:?}");
    assert!(st.devices[1].slots_used > 0, "{st:?}");
    assert_eq!((st.limit_overrun, st.swap_alloc_fail), (0, 0), "{st:?}");
    for i in 0..pages {
        check_page(words, i, 4);
    }
}

/// A page that cannot be read back ends in SIGBUS for the thread that needs it, with its
/// address on stderr and what failed: a read error with what the device said, or a
/// checksum that never matched. Run in a child process (this test binary, re-executed),
/// since the child must die.
#[test]
fn a_page_that_cannot_be_read_ends_in_sigbus_with_its_address() {
    if let Ok(how) = std::env::var("USWAP_TEST_LOST_PAGE") {
        let mode = if how.starts_with("signal") { FaultMode::Signal } else { FaultMode::Thread };
        let f = if how.ends_with("corrupt") {
            FaultInjection { corrupt_rate: 1.0, seed: 1, ..Default::default() }
        } else {
            FaultInjection { read_error_rate: 1.0, seed: 1, ..Default::default() }
        };
        let p = build(mode, MIB, vec![DeviceConfig::ram(32 * MIB).checksum(true).inject_faults(f)]);
        let region = p.map(8 * MIB as usize).unwrap();
        // No fault-around, so no page counts as a stream's: reclaim goes oldest first and
        // page 0 is out after the fill.
        region.advise(uswap::Advice::Random);
        let words = region.as_atomic_u64s();
        write_every_page(words);
        eprintln!("page0={:#x}", region.as_ptr() as usize);
        check_page(words, 0, 1); // swapped out, unreadable: must not return
        std::process::exit(0);
    }
    const READ_ERROR: &str =
        "could not be read from its swap device (I/O error on every attempt: an injected failure); its slot is kept; \
         delivering SIGBUS";
    const MISMATCH: &str =
        "read back from its swap device with a checksum mismatch on every attempt; its slot is kept; \
         delivering SIGBUS";
    for (mode, line) in
        [("thread", READ_ERROR), ("signal", READ_ERROR), ("thread-corrupt", MISMATCH), ("signal-corrupt", MISMATCH)]
    {
        let out = std::process::Command::new(std::env::current_exe().unwrap())
            .args(["--exact", "a_page_that_cannot_be_read_ends_in_sigbus_with_its_address", "--nocapture"])
            .env("USWAP_TEST_LOST_PAGE", mode)
            .output()
            .unwrap();
        use std::os::unix::process::ExitStatusExt;
        assert_eq!(out.status.signal(), Some(libc::SIGBUS), "{mode}: {:?}", out.status);
        let err = String::from_utf8_lossy(&out.stderr);
        let page0 = err.lines().find_map(|l| l.strip_prefix("page0=")).expect("child printed the page address");
        let page0 = usize::from_str_radix(page0.trim_start_matches("0x"), 16).unwrap();
        assert!(err.contains(&format!("uswap: page {page0:#018x}")), "{mode}: {err}");
        // The line says what failed (a read error or a checksum, not a busy page).
        assert!(err.contains(line), "{mode}: {err}");
    }
}
