//! Helpers shared by the integration tests: a page pattern where every byte depends on the
//! page index and a version, and checks that compare every byte.

#![allow(dead_code)]

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use uswap::{DeviceConfig, FaultMode, Pager, Stats, PAGE_SIZE};

pub const MIB: u64 = 1 << 20;
pub const WORDS: usize = PAGE_SIZE / 8;

pub fn pager(mode: FaultMode, limit: u64, device: u64) -> Pager {
    Pager::builder().resident_limit(limit).fault_mode(mode).device(DeviceConfig::ram(device)).build().expect("pager")
}

/// Word `k` of page `i` at version `v`: every byte of a page depends on all three. Even
/// pages are compressible (random head, repeated tail), odd pages are not.
pub fn word(i: usize, v: u64, k: usize) -> u64 {
    if i % 2 == 0 && k >= 64 {
        return (i as u64) << 20 ^ v ^ (k as u64 & 7);
    }
    let mut z =
        (i as u64) << 32 ^ v.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ (k as u64).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z ^ (z >> 27)
}

pub fn write_page(w: &[AtomicU64], i: usize, v: u64) {
    for k in 0..WORDS {
        w[i * WORDS + k].store(word(i, v, k), Ordering::Relaxed);
    }
}

/// Writes every page of `w` at version 1; returns the version of each page (all 1), for
/// the test to bump as it rewrites pages and to check them against.
pub fn write_every_page(w: &[AtomicU64]) -> Vec<u64> {
    let nr_pages = w.len() / WORDS;
    for i in 0..nr_pages {
        write_page(w, i, 1);
    }
    vec![1; nr_pages]
}

/// One access of a random workload: checks a random page of `w` against its version in
/// `version` (one per page) and, one time in `write_one_in`, writes it at the next version.
pub fn access_random_page(w: &[AtomicU64], rng: &mut Rng, version: &mut [u64], write_one_in: u64) {
    let i = (rng.next() % version.len() as u64) as usize;
    check_page(w, i, version[i]);
    if rng.next() % write_one_in == 0 {
        version[i] += 1;
        write_page(w, i, version[i]);
    }
}

/// Panics with the first differing word; version 0 means "never written", i.e. all zero.
pub fn check_page(w: &[AtomicU64], i: usize, v: u64) {
    for k in 0..WORDS {
        let got = w[i * WORDS + k].load(Ordering::Relaxed);
        let want = if v == 0 { 0 } else { word(i, v, k) };
        assert_eq!(got, want, "page {i} word {k} (version {v})");
    }
}

/// Checks every page of `w` against its version in `version` (one per page).
pub fn check_versions(w: &[AtomicU64], version: &[u64]) {
    for (i, &v) in version.iter().enumerate() {
        check_page(w, i, v);
    }
}

/// `rounds` times: writes every page of `w` with the next version, then checks every page.
pub fn rewrite_and_check(w: &[AtomicU64], rounds: u64) {
    let pages = w.len() / WORDS;
    for v in 1..=rounds {
        for i in 0..pages {
            write_page(w, i, v);
        }
        for i in 0..pages {
            check_page(w, i, v);
        }
    }
}

pub struct Rng(pub u64);
impl Rng {
    pub fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
}

/// Writes every page, then random reads and rewrites from two threads on disjoint pages
/// for `rounds`, then checks every page. Calls `before_unmap` while the region still
/// exists, and returns the stats from then.
pub fn churn(p: &Pager, region_bytes: u64, rounds: usize, before_unmap: impl FnOnce()) -> Stats {
    let region = p.map(region_bytes as usize).unwrap();
    let words = region.as_atomic_u64s();
    let nr_pages = region.len() / PAGE_SIZE;
    for i in 0..nr_pages {
        write_page(words, i, 1);
    }
    std::thread::scope(|s| {
        for t in 0..2 {
            s.spawn(move || {
                let mine: Vec<usize> = (t..nr_pages).step_by(2).collect();
                let mut version = vec![1u64; mine.len()];
                let mut rng = Rng(0xfeed + t as u64);
                for _ in 0..rounds {
                    let j = (rng.next() % mine.len() as u64) as usize;
                    check_page(words, mine[j], version[j]);
                    if rng.next() % 4 == 0 {
                        version[j] += 1;
                        write_page(words, mine[j], version[j]);
                    }
                }
                for (j, &i) in mine.iter().enumerate() {
                    check_page(words, i, version[j]);
                }
            });
        }
    });
    before_unmap();
    p.stats()
}

/// Stats once the pager is quiet: the idle-time background reclaimer may still be moving
/// pages, and a snapshot is not atomic across counters, so read until two agree.
pub fn quiet_stats(p: &Pager) -> uswap::Stats {
    let mut prev = p.stats();
    for _ in 0..200 {
        std::thread::sleep(std::time::Duration::from_millis(10));
        let next = p.stats();
        let key = |s: &uswap::Stats| {
            (s.resident_pages, s.swapcache_pages, s.devices.iter().map(|d| d.slots_used).sum::<u64>())
        };
        if key(&next) == key(&prev) {
            return next;
        }
        prev = next;
    }
    prev
}

/// Two `#[test]`s running one scenario, one in each fault mode, under the names given:
/// `in_both_modes!(scenario(args) => thread_mode_name, signal_mode_name);` calls
/// `scenario(FaultMode::Thread, args)` and `scenario(FaultMode::Signal, args)`.
// (Not every test binary that shares this module uses it, as with the functions above.)
#[allow(unused_macros)]
macro_rules! in_both_modes {
    ($scenario:ident($($arg:expr),*) => $thread:ident, $signal:ident) => {
        #[test]
        fn $thread() {
            $scenario(FaultMode::Thread $(, $arg)*);
        }

        #[test]
        fn $signal() {
            $scenario(FaultMode::Signal $(, $arg)*);
        }
    };
}
#[allow(unused_imports)]
pub(crate) use in_both_modes;

/// The one way a test says it could not run (see `uswap_testkit`).
#[allow(unused_imports)]
pub use uswap_testkit::skipped;

/// No progress for this long is a hang (the slowest progress step is one access).
pub const STALL: Duration = Duration::from_secs(30);

/// Each thread of this process, a line each: name, tid, state, kernel wait channel, system
/// call (`uswap::describe_threads`).
pub fn thread_states() -> String {
    uswap::describe_threads().split("; ").map(|t| format!("  {t}\n")).collect()
}

/// Runs `work` on its own thread and waits for it, failing if `progress` stands still for
/// [`STALL`]. A hung worker is left behind (the process ends with the test binary).
pub fn with_watchdog<F>(what: &str, pager: &Pager, progress: &Arc<AtomicU64>, work: F)
where
    F: FnOnce() + Send + 'static,
{
    let worker = std::thread::Builder::new().name("work".into()).spawn(work).unwrap();
    let mut last = progress.load(Ordering::Relaxed);
    let mut since = Instant::now();
    while !worker.is_finished() {
        std::thread::sleep(Duration::from_millis(50));
        let now = progress.load(Ordering::Relaxed);
        if now != last {
            last = now;
            since = Instant::now();
        } else if since.elapsed() > STALL {
            panic!(
                "{what}: no progress for {STALL:?} after {now} steps\nthreads (name (tid): state, wait channel, system call):\n{}stats: {:?}",
                thread_states(),
                pager.stats()
            );
        }
    }
    if let Err(e) = worker.join() {
        std::panic::resume_unwind(e);
    }
}

/// Local Redis servers for a test (`primaries` with `replicas` each, `extra` arguments), or
/// `None` and a message saying the test is skipped when `redis-server` is not installed.
/// Every server is killed when the returned value is dropped.
pub fn local_redis(primaries: usize, replicas: usize, extra: &[&str]) -> Option<uswap::backend::redis::LocalRedis> {
    if !uswap::backend::redis::redis_server_available() {
        skipped("redis-server is not installed (apt-get install redis-server)");
        return None;
    }
    Some(uswap::backend::redis::LocalRedis::start(primaries, replicas, extra).expect("local redis servers start"))
}
