//! The resident bound, sampled from outside while the workload runs. Four threads (two
//! sequential streams, two random readers) go over a region four times the limit, on every
//! kind of device and readahead in both fault modes, while a sampler counts the pages in
//! RAM with `mincore(2)` every half millisecond: the region's page tables alone, and
//! `Pager::measured_resident_pages` (regions plus staged pages). Both must stay within the
//! documented bound, the limit plus one reclaim batch (over it only as far as the engine
//! counted charges over the limit, allowed on the Redis tier alone and only for victims that
//! all stayed busy in other threads' writes past the bounded wait, `limit_overrun_busy`: its
//! round trips can). Every byte read is verified, and a watchdog fails a case that stops
//! making progress, with where its threads are.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use uswap::backend::redis::RedisOptions;
use uswap::{Compressor, DeviceConfig, FaultMode, Pager, ReadaheadPolicy, PAGE_SIZE, RECLAIM_BATCH_PAGES};

mod common;
use common::*;

const LIMIT_BYTES: u64 = 8 * MIB;
const THREADS: usize = 4;
/// How long the four threads run after the region is filled.
const RUN: Duration = Duration::from_millis(1500);

/// The residency vector of `[addr, addr + len)`, by `mincore(2)`: bit 0 of each byte.
fn mincore_vec(addr: usize, len: usize) -> Vec<u8> {
    let mut vec = vec![0u8; len / PAGE_SIZE];
    // SAFETY: `[addr, addr + len)` is a live region of the test (mapped until the sampler
    // stops); mincore only reads page tables and writes one byte a page into `vec`.
    let rc = unsafe { libc::mincore(addr as *mut libc::c_void, len, vec.as_mut_ptr()) };
    assert_eq!(rc, 0, "mincore: {}", std::io::Error::last_os_error());
    vec
}

/// Pages of `[addr, addr + len)` in RAM at one moment: present in two `mincore(2)` scans
/// one after the other. One scan is not one moment: the kernel reads the page tables one
/// table (512 pages) at a time under that table's lock, beside the other threads' moves,
/// and lets go of the address space every 4,096 pages, where a loaded machine may preempt
/// it. A scan then counted pages that reclaim took out behind it and pages faulted in ahead
/// of it, both: 2,129 pages of a 2,048-page limit the engine held (its charge never over
/// 2,048). A page present in both scans was present when the first one ended (unless it
/// went out and came back in between, which counts it once more than that moment had).
/// Returns (that, what the first scan alone counted).
fn region_pages_in_ram(addr: usize, len: usize) -> (u64, u64) {
    let first = mincore_vec(addr, len);
    let second = mincore_vec(addr, len);
    let both = first.iter().zip(&second).filter(|&(a, b)| a & b & 1 != 0).count() as u64;
    (both, first.iter().filter(|&&a| a & 1 != 0).count() as u64)
}

/// The largest counts the sampler saw: the region's page tables alone, and regions plus
/// staged pages.
#[derive(Default)]
struct Peaks {
    region: AtomicU64,
    /// One scan's count (printed, not checked: see `region_pages_in_ram`).
    region_one_scan: AtomicU64,
    measured: AtomicU64,
    samples: AtomicU64,
}

/// One case: fills the region, runs the four threads under the sampler, checks the bound.
fn soak(what: &str, mode: FaultMode, devices: Vec<DeviceConfig>, overrun_allowed: bool) {
    let mut b = Pager::builder().resident_limit(LIMIT_BYTES).fault_mode(mode);
    for d in devices {
        b = b.device(d);
    }
    let p = Arc::new(b.build().expect("pager"));
    let region = p.map(4 * LIMIT_BYTES as usize).expect("region");
    let nr_pages = region.len() / PAGE_SIZE;
    for i in 0..nr_pages {
        write_page(region.as_atomic_u64s(), i, 1);
    }
    let peaks = Arc::new(Peaks::default());
    let progress = Arc::new(AtomicU64::new(0));
    let work = {
        let (p, peaks, progress) = (p.clone(), peaks.clone(), progress.clone());
        move || {
            let words = region.as_atomic_u64s();
            let (addr, len) = (words.as_ptr() as usize, region.len());
            let done = AtomicBool::new(false);
            std::thread::scope(|s| {
                let sampler = s.spawn(|| {
                    // Bounded by `done`, set once the workers are joined.
                    while !done.load(Ordering::Relaxed) {
                        let (region, one_scan) = region_pages_in_ram(addr, len);
                        peaks.region.fetch_max(region, Ordering::Relaxed);
                        peaks.region_one_scan.fetch_max(one_scan, Ordering::Relaxed);
                        // The engine's own measurement scans the regions once: the smaller of
                        // two in a row, for the reason `region_pages_in_ram` gives.
                        let measured = (0..2)
                            .map(|_| p.measured_resident_pages().expect("mincore") as u64)
                            .min()
                            .expect("two readings");
                        peaks.measured.fetch_max(measured, Ordering::Relaxed);
                        peaks.samples.fetch_add(1, Ordering::Relaxed);
                        std::thread::sleep(Duration::from_micros(500));
                    }
                });
                let workers: Vec<_> = (0..THREADS)
                    .map(|t| {
                        s.spawn({
                            let progress = &progress;
                            move || run_worker(words, t, progress)
                        })
                    })
                    .collect();
                for w in workers {
                    w.join().expect("worker");
                }
                done.store(true, Ordering::Relaxed);
                sampler.join().expect("sampler");
            });
        }
    };
    with_watchdog(what, &p, &progress, work);
    let st = quiet_stats(&p);
    let limit_pages = LIMIT_BYTES / PAGE_SIZE as u64;
    let bound = limit_pages + RECLAIM_BATCH_PAGES as u64;
    let (region_peak, measured_peak) = (peaks.region.load(Ordering::Relaxed), peaks.measured.load(Ordering::Relaxed));
    let samples = peaks.samples.load(Ordering::Relaxed);
    let one_scan_peak = peaks.region_one_scan.load(Ordering::Relaxed);
    println!(
        "{what}: peaks {region_peak} (region; one scan: {one_scan_peak}), {measured_peak} (with staging) of bound {bound}, {samples} samples"
    );
    assert!(samples >= 20, "{what}: the sampler ran {samples} times");
    assert!(measured_peak > bound / 2, "{what}: the workload should fill the limit ({measured_peak})");
    assert!(st.pgmajfault > 0 && st.pswpout > 0, "{what}: the run must swap: {st:?}");
    assert_eq!((st.fault_error, st.slots_leaked), (0, 0), "{what}: {st:?}");
    // The engine goes over the limit only where it counts why (`limit_overrun`; on the
    // Redis tier only with every victim busy in other threads' writes for the bounded wait,
    // which its round trips on a loaded machine can cause); what the page tables show stays
    // within a batch of what it counted.
    assert!(
        st.resident_peak_pages <= limit_pages || st.limit_overrun > 0,
        "{what}: charged {} pages of a {limit_pages}-page limit with no overrun counted: {st:?}",
        st.resident_peak_pages
    );
    let allowed = if overrun_allowed { st.limit_overrun_busy } else { 0 };
    assert_eq!(st.limit_overrun, allowed, "{what}: charges over the limit, other than busy victims': {st:?}");
    let engine_bound = bound.max(st.resident_peak_pages + RECLAIM_BATCH_PAGES as u64);
    assert!(
        region_peak <= engine_bound,
        "{what}: {region_peak} pages of the region in RAM, bound {engine_bound}: {st:?}"
    );
    assert!(
        measured_peak <= engine_bound,
        "{what}: {measured_peak} pages in RAM with staging, bound {engine_bound}: {st:?}"
    );
}

/// Worker `t` of [`THREADS`]: the even ones stream over their quarter of the region in
/// order, the odd ones read random pages of the whole region; every page read is checked.
fn run_worker(words: &[std::sync::atomic::AtomicU64], t: usize, progress: &AtomicU64) {
    let nr_pages = words.len() / WORDS;
    let quarter = nr_pages / THREADS;
    let mut rng = Rng(0x7e57 + t as u64);
    let start = Instant::now();
    // Bounded by RUN: every pass takes finite time.
    while start.elapsed() < RUN {
        for k in 0..quarter {
            let i = if t % 2 == 0 { t * quarter + k } else { (rng.next() % nr_pages as u64) as usize };
            check_page(words, i, 1);
            progress.fetch_add(1, Ordering::Relaxed);
        }
    }
}

fn zpool() -> DeviceConfig {
    DeviceConfig::zpool(256 * MIB)
}

fn zstd_cluster() -> DeviceConfig {
    DeviceConfig::zpool(256 * MIB).compressor(Compressor::Zstd { level: 3 }).readahead(ReadaheadPolicy::Cluster)
}

fn file() -> DeviceConfig {
    DeviceConfig::file(std::env::temp_dir(), 256 * MIB)
}

fn each_mode(what: &str, devices: impl Fn() -> Vec<DeviceConfig>, overrun_allowed: bool) {
    for mode in [FaultMode::Thread, FaultMode::Signal] {
        soak(&format!("{what}, {mode:?} mode"), mode, devices(), overrun_allowed);
    }
}

#[test]
fn resident_bound_holds_on_the_compressed_pool() {
    each_mode("zpool (lz4, VMA readahead)", || vec![zpool()], false);
}

#[test]
fn resident_bound_holds_with_zstd_and_cluster_readahead() {
    each_mode("zpool (zstd, cluster readahead)", || vec![zstd_cluster()], false);
}

#[test]
fn resident_bound_holds_on_a_file_device() {
    each_mode("file device", || vec![file()], false);
}

#[test]
fn resident_bound_holds_on_a_redis_tier() {
    let Some(r) = local_redis(1, 0, &[]) else { return };
    let redis = || DeviceConfig::redis(r.seeds(0), 256 * MIB).redis_options(RedisOptions::new(r.seeds(0)));
    // A small pool first, so that most pages go on to Redis, a tier below it (as `uswap run
    // --device zpool:2MiB,redis:...` makes them); then the two at equal priority, taking turns.
    each_mode("zpool then redis", || vec![DeviceConfig::zpool(2 * MIB), redis().priority(-1)], true);
    each_mode("zpool and redis taking turns", || vec![DeviceConfig::zpool(2 * MIB), redis()], true);
}
