//! Idle aging (`PagerBuilder::idle_aging`) and the idle-age histogram (`Stats::idle`),
//! against real faults: pages left alone go out by age with no pressure at all, and the
//! histogram says how much memory a program left alone, and since when.

mod common;

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use common::*;
use uswap::{DeviceConfig, FaultMode, IdleAging, Pager, PAGE_SIZE};

const PAGES_PER_MIB: usize = (MIB as usize) / PAGE_SIZE;

/// Reads the first word of each of `pages` (checked against version 1) until `until`.
fn touch_until(words: &[AtomicU64], pages: std::ops::Range<usize>, until: Instant) {
    while Instant::now() < until {
        for i in pages.clone() {
            assert_eq!(words[i * WORDS].load(Ordering::Relaxed), word(i, 1, 0), "page {i}");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn mib_of(bytes: u64) -> f64 {
    bytes as f64 / MIB as f64
}

/// Asserts that `got_bytes` is `want_mib` within 12 % and 1.5 MiB.
fn assert_near(what: &str, got_bytes: u64, want_mib: f64, st: &uswap::Stats) {
    let got = mib_of(got_bytes);
    let slack = (want_mib * 0.12).max(1.5);
    assert!((got - want_mib).abs() <= slack, "{what}: {got:.1} MiB, want {want_mib} MiB; {:?}", st.idle);
}

/// 64 MiB written once, 4 MiB of it then read over and over, under a limit of 256 MiB that
/// is never reached: with an idle age of 3 s, the 60 MiB left alone are written to the
/// pool within a pass and the age (about 15 s), the 4 MiB in use stay, the limit never
/// moves, and every byte reads back.
#[test]
fn idle_pages_go_out_after_their_age_with_no_pressure() {
    let p = Pager::builder()
        .resident_limit(256 * MIB)
        .fault_mode(FaultMode::Signal)
        .device(DeviceConfig::zpool(256 * MIB))
        .idle_aging(IdleAging::Evict(Duration::from_secs(3)))
        .build()
        .expect("pager");
    let region = p.map(64 * MIB as usize).unwrap();
    let words = region.as_atomic_u64s();
    let nr_pages = region.len() / PAGE_SIZE;
    write_every_page(words);
    let hot = 0..4 * PAGES_PER_MIB;
    touch_until(words, hot.clone(), Instant::now() + Duration::from_secs(20));
    let st = p.stats();
    let resident_mib = mib_of(st.resident_pages * PAGE_SIZE as u64);
    assert!(resident_mib <= 10.0, "resident {resident_mib:.1} MiB after 20 s; {st:?}");
    assert!(st.swpout_idle as usize >= 56 * PAGES_PER_MIB, "written for their age: {} pages; {st:?}", st.swpout_idle);
    assert_eq!((st.pgsteal_direct, st.allocstall), (0, 0), "no pressure: {st:?}");
    assert_eq!(p.resident_limit(), 256 * MIB);
    assert!(st.pgdeactivate as usize >= nr_pages - hot.len(), "{st:?}");
    // The pages in use stayed in use: few came back from the pool.
    assert!((st.pswpin as usize) < hot.len(), "pages read back: {}; {st:?}", st.pswpin);
    for i in 0..nr_pages {
        check_page(words, i, 1);
    }
    let st = p.stats();
    assert_eq!((st.fault_error, st.checksum_errors), (0, 0), "{st:?}");
}

/// A program that writes 48 MiB, then reads 8 MiB of it all along, 16 MiB more for its
/// first 30 s, and leaves the last 24 MiB alone. The histogram says so (observing only,
/// nothing written for its age): at 25 s, 24 MiB idle for 10 s and none for a minute; at
/// 75 s, 40 MiB idle for 10 s (the 16 MiB let go at 30 s among them) and 24 MiB for a
/// minute. Every figure within 12 % (and 1.5 MiB).
#[test]
fn the_histogram_matches_what_a_program_touched_and_when() {
    let p = Pager::builder()
        .resident_limit(256 * MIB)
        .fault_mode(FaultMode::Signal)
        .device(DeviceConfig::zpool(256 * MIB))
        .idle_aging(IdleAging::Observe)
        .build()
        .expect("pager");
    let region = p.map(48 * MIB as usize).unwrap();
    let words = region.as_atomic_u64s();
    let nr_pages = region.len() / PAGE_SIZE;
    let start = Instant::now();
    write_every_page(words);
    let always = 0..8 * PAGES_PER_MIB;
    let until_30s = 8 * PAGES_PER_MIB..24 * PAGES_PER_MIB;
    touch_until(words, 0..24 * PAGES_PER_MIB, start + Duration::from_secs(25));
    let st = p.stats();
    assert_near("idle 1 s at 25 s", st.idle.idle_1s_bytes, 24.0, &st);
    assert_near("idle 10 s at 25 s", st.idle.idle_10s_bytes, 24.0, &st);
    assert_eq!(st.idle.idle_60s_bytes, 0, "{:?}", st.idle);
    touch_until(words, 0..24 * PAGES_PER_MIB, start + Duration::from_secs(30));
    assert_eq!(until_30s.start, always.end);
    touch_until(words, always, start + Duration::from_secs(75));
    let st = p.stats();
    assert_near("idle 10 s at 75 s", st.idle.idle_10s_bytes, 40.0, &st);
    assert_near("idle 1 min at 75 s", st.idle.idle_60s_bytes, 24.0, &st);
    assert_eq!(st.idle.idle_600s_bytes, 0, "{:?}", st.idle);
    // Observing writes nothing for its age, and nothing was under pressure.
    assert_eq!((st.swpout_idle, st.pswpout), (0, 0), "{st:?}");
    for i in 0..nr_pages {
        check_page(words, i, 1);
    }
    // Back in use: no longer idle.
    let st = p.stats();
    assert!(st.idle.idle_1s_bytes < 4 * MIB, "after reading everything: {:?}", st.idle);
}

#[test]
fn an_idle_age_under_a_second_is_refused_saying_why() {
    let e = Pager::builder()
        .resident_limit(16 * MIB)
        .device(DeviceConfig::zpool(64 * MIB))
        .idle_aging(IdleAging::Evict(Duration::from_millis(500)))
        .build()
        .expect_err("refused");
    assert!(e.to_string().contains("1 s or more"), "{e}");
    assert_eq!(e.kind(), uswap::ErrorKind::InvalidArgument);
}

/// Checks every page of `words` at its version in `version`, and that no fault or checksum
/// failed on the way.
fn check_every_page(p: &Pager, words: &[AtomicU64], version: &[u64]) {
    check_versions(words, version);
    let st = p.stats();
    assert_eq!((st.fault_error, st.checksum_errors), (0, 0), "{st:?}");
}

/// Recompression of cold pages: a compressed pool (lz4) with a denser one (zstd) below it and
/// an idle age of 1 s. 48 MiB written, the first 4 MiB read all along, the rest left alone
/// but for one page rewritten every 20 ms (pages caught while they are staged, written,
/// read back for their move and written below). The pools' slot space is 8 GiB's (a pool's
/// is sized from the machine's memory): pages idle for twice the age reach the zstd pool
/// within 20 s (a scan of the whole slot space took over two minutes a lap), the lz4 pool
/// keeps few of them, and every byte reads back.
fn idle_pages_move_down_to_a_denser_pool(mode: FaultMode) {
    let p = Pager::builder()
        .resident_limit(256 * MIB)
        .fault_mode(mode)
        .device(DeviceConfig::zpool(8 << 30).priority(1))
        .device(DeviceConfig::zpool(8 << 30).compressor(uswap::Compressor::Zstd { level: 1 }))
        .idle_aging(IdleAging::Evict(Duration::from_secs(1)))
        .build()
        .expect("pager");
    let region = p.map(48 * MIB as usize).unwrap();
    let words = region.as_atomic_u64s();
    let nr_pages = region.len() / PAGE_SIZE;
    write_every_page(words);
    let hot = 4 * PAGES_PER_MIB;
    let cold = nr_pages - hot;
    let mut version = vec![1u64; nr_pages];
    let mut rng = Rng(0x7e2);
    let start = Instant::now();
    let moved = |p: &Pager| p.stats().devices[1].backend.as_ref().map_or(0, |b| b.stored_pages) as usize;
    // Bounded by the deadline; ends early once most cold pages are below.
    while start.elapsed() < Duration::from_secs(20) && moved(&p) < cold * 3 / 4 {
        for i in 0..hot {
            assert_eq!(words[i * WORDS].load(Ordering::Relaxed), word(i, 1, 0), "page {i}");
        }
        let i = hot + (rng.next() % cold as u64) as usize;
        version[i] += 1;
        write_page(words, i, version[i]);
        std::thread::sleep(Duration::from_millis(20));
    }
    let st = p.stats();
    let below = moved(&p);
    assert!(below >= cold * 3 / 4, "{below} of {cold} cold pages below after {:?}; {st:?}", start.elapsed());
    // They went down for their age (`writeback_idle`, counted batch by batch).
    assert!(st.writeback_idle as usize >= cold * 3 / 4, "moved for their age: {}; {st:?}", st.writeback_idle);
    check_every_page(&p, words, &version);
}

in_both_modes!(
    idle_pages_move_down_to_a_denser_pool() =>
    thread_mode_idle_pages_move_down_to_a_denser_pool,
    signal_mode_idle_pages_move_down_to_a_denser_pool
);

/// A tier age with idle aging off (`PagerBuilder::tier_age`): 64 MiB written under a limit
/// of 16 MiB go out by reclaim to an lz4 pool, and those out of RAM for a second move down
/// to the zstd pool below it, with no scan of the resident pages (none is counted idle by
/// aging), while pages all over the region are rewritten (some while they move: read back,
/// recompressed, written below) and 2 MiB are read over and over. Every byte reads back.
fn a_tier_age_moves_pages_down_with_aging_off(mode: FaultMode) {
    tier_age_moves_pages_down(mode, 1);
}

/// The same into a tier that stores pages in units of 4: pages rewritten and read while
/// they move down and while their units lose members, every byte checked. Only even pages
/// are written (the others stay zero): odd pages of the pattern do not compress, and a unit
/// holds four pages only if they fit one page compressed.
fn a_tier_age_moves_pages_down_into_units(mode: FaultMode) {
    tier_age_moves_pages_down(mode, 4);
}

fn tier_age_moves_pages_down(mode: FaultMode, unit_pages: usize) {
    let zstd = uswap::Compressor::Zstd { level: 1 };
    let p = Pager::builder()
        .resident_limit(16 * MIB)
        .fault_mode(mode)
        .device(DeviceConfig::zpool(256 * MIB).priority(1))
        .device(DeviceConfig::zpool(256 * MIB).compressor(zstd).unit_pages(unit_pages))
        .tier_age(Duration::from_secs(1))
        .build()
        .expect("pager");
    let region = p.map(64 * MIB as usize).unwrap();
    let words = region.as_atomic_u64s();
    let nr_pages = region.len() / PAGE_SIZE;
    // Pages written: every one, or with units every other (see above).
    let step = if unit_pages > 1 { 2 } else { 1 };
    let mut version = vec![0u64; nr_pages];
    for i in (0..nr_pages).step_by(step) {
        write_page(words, i, 1);
        version[i] = 1;
    }
    let hot = 2 * PAGES_PER_MIB;
    let mut rng = Rng(0x71e4);
    let below = |p: &Pager| p.stats().devices[1].backend.as_ref().map_or(0, |b| b.stored_pages) as usize;
    let out_of_ram = nr_pages / step - 16 * PAGES_PER_MIB;
    let start = Instant::now();
    // Bounded by the deadline; ends early once most pages out of RAM are below.
    while start.elapsed() < Duration::from_secs(20) && below(&p) < out_of_ram * 3 / 4 {
        for (i, &v) in version.iter().enumerate().take(hot) {
            check_page(words, i, v);
        }
        for _ in 0..8 {
            let i = (rng.next() % nr_pages as u64) as usize / step * step;
            version[i] += 1;
            write_page(words, i, version[i]);
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    let st = p.stats();
    assert!(
        below(&p) >= out_of_ram * 3 / 4,
        "{} of {out_of_ram} pages below after {:?}; {st:?}",
        below(&p),
        start.elapsed()
    );
    assert!(st.writeback_idle as usize >= out_of_ram * 3 / 4, "moved for their age: {}; {st:?}", st.writeback_idle);
    assert_eq!(st.swpout_idle, 0, "aging off sends nothing out for its age; {st:?}");
    if unit_pages > 1 {
        let units = st.devices[1].backend.clone().unwrap_or_default();
        assert!(units.unit_pages as usize >= out_of_ram / 2, "pages below in units: {units:?}");
        assert!(units.units * unit_pages as u64 >= units.unit_pages, "{units:?}");
    }
    check_every_page(&p, words, &version);
}

in_both_modes!(
    a_tier_age_moves_pages_down_with_aging_off() =>
    thread_mode_a_tier_age_moves_pages_down_with_aging_off,
    signal_mode_a_tier_age_moves_pages_down_with_aging_off
);

in_both_modes!(
    a_tier_age_moves_pages_down_into_units() =>
    thread_mode_a_tier_age_moves_pages_down_into_units,
    signal_mode_a_tier_age_moves_pages_down_into_units
);

#[test]
fn a_tier_age_without_a_tier_below_or_out_of_range_is_refused_saying_why() {
    let one = Pager::builder().resident_limit(16 * MIB).device(DeviceConfig::zpool(64 * MIB));
    let e = one.clone().tier_age(Duration::from_secs(30)).build().expect_err("refused");
    assert!(matches!(e, uswap::Error::NoTierBelow { nr_devices: 1 }), "{e}");
    assert!(e.to_string().contains("zpool,zpool:zstd-1"), "{e}");
    let two = one.device(DeviceConfig::zpool(64 * MIB).priority(-1));
    let e = two.clone().tier_age(Duration::from_millis(500)).build().expect_err("refused");
    assert!(matches!(e, uswap::Error::BadTierAge { age_ms: 500 }), "{e}");
    assert_eq!(e.kind(), uswap::ErrorKind::InvalidArgument);
    let p = two.tier_age(Duration::from_secs(30)).build().expect("two tiers");
    drop(p);
    assert_eq!(uswap::parse_tier_age("2m"), Ok(Duration::from_secs(120)));
    for bad in ["never", "0", "0.5s", "2x", ""] {
        assert!(uswap::parse_tier_age(bad).is_err(), "{bad:?} taken");
    }
}

/// Clean pages under the aging scan (thread mode, where a page read back comes in clean and
/// keeps its slot): 32 MiB written, sent out under a 4 MiB limit and read back out of order
/// under 256 MiB,
/// then the first 8 MiB read over and over for 16 s with an idle age of 3 s, one page of
/// them rewritten every 20 ms. The scan stages clean pages in their own slots: the pages in
/// use come back from RAM (aged swap-cache hits), not from the pool (each hot page was read
/// back from it every pass when the scan dropped clean pages), clean, so that a write to one
/// still takes its write-protect fault, and referenced, so that the scan spares them once;
/// the 24 MiB left alone go for their age without a write (dropped clean). Every byte reads
/// back.
#[test]
fn clean_pages_the_scan_takes_out_come_back_from_ram_and_idle_ones_go_unwritten() {
    let p = Pager::builder()
        .resident_limit(256 * MIB)
        .fault_mode(FaultMode::Thread)
        .device(DeviceConfig::zpool(256 * MIB))
        .idle_aging(IdleAging::Evict(Duration::from_secs(3)))
        .build()
        .expect("pager");
    let region = p.map(32 * MIB as usize).unwrap();
    let words = region.as_atomic_u64s();
    let nr_pages = region.len() / PAGE_SIZE;
    let mut version = write_every_page(words);
    p.set_resident_limit(4 * MIB).unwrap();
    check_every_page(&p, words, &version);
    p.set_resident_limit(256 * MIB).unwrap();
    // Out of order, so that readahead (whose pages come in writable on a memory device)
    // sees no stream.
    for k in 0..nr_pages {
        let i = k * 2477 % nr_pages;
        check_page(words, i, version[i]);
    }
    let before = p.stats();
    assert!(before.clean_pages as usize >= nr_pages * 3 / 4, "the pages came back clean: {before:?}");
    let hot = 8 * PAGES_PER_MIB;
    let mut rng = Rng(0xc1ea);
    let start = Instant::now();
    // Bounded by the deadline.
    while start.elapsed() < Duration::from_secs(16) {
        for i in 0..hot {
            assert_eq!(words[i * WORDS].load(Ordering::Relaxed), word(i, version[i], 0), "page {i}");
        }
        let i = (rng.next() % hot as u64) as usize;
        version[i] += 1;
        write_page(words, i, version[i]);
        std::thread::sleep(Duration::from_millis(20));
    }
    let st = p.stats();
    let d = |f: fn(&uswap::Stats) -> u64| f(&st) - f(&before);
    let report = format!("before {before:?}; after {st:?}");
    assert!(d(|s| s.pgfault_aged) as usize >= hot / 2, "the pages in use came back from RAM: {report}");
    // Back from RAM, referenced: the scan spares them once, clean as they are, as it spares
    // a dirty page (901 spared before, the rewritten pages; 15.5 k after).
    assert!(d(|s| s.pgactivate) as usize >= hot, "the pages in use were spared once: {report}");
    assert!((d(|s| s.pswpin) as usize) < hot / 8, "the pages in use were read from the pool: {report}");
    let cold = nr_pages - hot;
    assert!(d(|s| s.swpout_clean) as usize >= cold * 3 / 4, "the idle pages went unwritten: {report}");
    // Written: only pages rewritten (at most one each 20 ms), none of the idle ones.
    assert!((d(|s| s.pswpout) as usize) < 1000, "pages written: {report}");
    assert!(d(|s| s.pgfault_wp) > 0, "a page that came back clean took its write-protect fault: {report}");
    check_every_page(&p, words, &version);
}

/// A page the aging scan staged clean and the program then writes (without reading it
/// first) comes back writable in one fault, its slot freed, not write-protected to fault
/// again at once. Pages read back clean, left alone until the scan has staged many of them,
/// then each written once: one fault a page, every byte checked. Thread mode: signal mode
/// keeps pages clean only where the C library's system calls are routed (`uswap run`'s
/// processes, `swapin::keep_clean`), not in this test's process.
#[test]
fn a_write_to_a_page_staged_clean_takes_one_fault() {
    let p = Pager::builder()
        .resident_limit(256 * MIB)
        .fault_mode(FaultMode::Thread)
        .device(DeviceConfig::zpool(256 * MIB))
        .idle_aging(IdleAging::Evict(Duration::from_secs(2)))
        // Read-ahead pages come in writable on a memory device: none here, so that every
        // page read back comes back clean.
        .readahead(false)
        .build()
        .expect("pager");
    let region = p.map(16 * MIB as usize).unwrap();
    let words = region.as_atomic_u64s();
    let nr_pages = region.len() / PAGE_SIZE;
    let mut version = write_every_page(words);
    p.set_resident_limit(2 * MIB).unwrap();
    check_every_page(&p, words, &version);
    p.set_resident_limit(256 * MIB).unwrap();
    check_versions(words, &version);
    assert!(p.stats().clean_pages as usize >= nr_pages * 3 / 4, "the pages came back clean: {:?}", p.stats());
    let deadline = Instant::now() + Duration::from_secs(30);
    // Bounded by the deadline.
    while (p.stats().swapcache_pages as usize) < nr_pages / 4 {
        assert!(Instant::now() < deadline, "the scan staged too few pages: {:?}", p.stats());
        std::thread::sleep(Duration::from_millis(10));
    }
    let before = p.stats();
    for k in 0..nr_pages {
        let i = k * 2477 % nr_pages;
        version[i] += 1;
        write_page(words, i, version[i]);
    }
    let st = p.stats();
    let d = |f: fn(&uswap::Stats) -> u64| (f(&st) - f(&before)) as usize;
    let report = format!("before {before:?}; after {st:?}");
    assert!(d(|s| s.pgfault_aged) >= nr_pages / 8, "too few writes met a staged page: {report}");
    // Each page faults once: a staged one is served writable (twice before: the copy, then
    // its write-protect fault), a resident clean one takes its write-protect fault. The
    // scan may stage a page between two writes of this loop: a sixteenth of slack.
    assert!(d(|s| s.pgfault) <= nr_pages + nr_pages / 16, "faults for {nr_pages} writes: {report}");
    check_every_page(&p, words, &version);
}
