//! Signal safety, proved: in signal mode the faulting thread serves its own fault in a
//! SIGBUS handler, which must allocate nothing (a thread interrupted inside `malloc` that
//! faults on a managed page would deadlock on the allocator's lock).
//!
//! How "this thread is in the SIGBUS handler" is known without any hook in the engine:
//! uswap installs its handler with every signal but SIGBUS in its `sa_mask`, so while it
//! runs SIGSYS is blocked on that thread. Nothing else blocks SIGSYS on the test's threads
//! (the engine's calls from an application thread block the asynchronous signals only,
//! `AsyncSignalsBlocked`, and SIGSYS is a synchronous one), so an allocation made on a
//! watched thread while SIGSYS is blocked is one made by the handler. Two layers count:
//! the Rust global allocator below, and `malloc`/`free` themselves (defined here, forwarding
//! to glibc's `__libc_*`), which also see C code (zstd) that never goes through Rust's.
//!
//! Every scenario drives faults through one device setup and then asserts, from
//! `Pager::stats`, that the paths it is meant to prove actually ran, and checks every byte.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::ffi::c_void;
use std::time::{Duration, Instant};

use uswap::{
    Compressor, DeviceConfig, FaultInjection, FaultMode, Incompressible, Pager, ReadaheadPolicy, Stats, PAGE_SIZE,
};

mod common;
use common::*;

thread_local! {
    // const-initialised, no destructor: reading them never allocates.
    static WATCHED: Cell<bool> = const { Cell::new(false) };
    static RUST_ALLOCS: Cell<u64> = const { Cell::new(0) };
    static C_ALLOCS: Cell<u64> = const { Cell::new(0) };
    static FIRST_SIZE: Cell<usize> = const { Cell::new(0) };
    // Every call on a watched thread, in or out of the handler.
    static RUST_ANY: Cell<u64> = const { Cell::new(0) };
    static C_ANY: Cell<u64> = const { Cell::new(0) };
}

/// True on a watched thread whose SIGSYS is blocked, i.e. inside uswap's SIGBUS handler.
fn in_sigbus_handler() -> bool {
    if !WATCHED.try_with(|w| w.get()).unwrap_or(false) {
        return false;
    }
    // SAFETY: querying the calling thread's mask (a system call) with a valid out pointer.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::pthread_sigmask(libc::SIG_BLOCK, std::ptr::null(), &mut set);
        libc::sigismember(&set, libc::SIGSYS) == 1
    }
}

fn note(counter: &'static std::thread::LocalKey<Cell<u64>>, size: usize) {
    if WATCHED.try_with(|w| w.get()).unwrap_or(false) {
        let any = if std::ptr::eq(counter, &RUST_ALLOCS) { &RUST_ANY } else { &C_ANY };
        let _ = any.try_with(|c| c.set(c.get() + 1));
    }
    if in_sigbus_handler() {
        let _ = counter.try_with(|c| c.set(c.get() + 1));
        let _ = FIRST_SIZE.try_with(|f| {
            if f.get() == 0 {
                f.set(size.max(1));
            }
        });
    }
}

struct Counting;

// SAFETY: forwards every call to `System` unchanged; counting touches only TLS cells.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        note(&RUST_ALLOCS, layout.size());
        // SAFETY: the caller's contract is passed on unchanged.
        unsafe { System.alloc(layout) }
    }
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        note(&RUST_ALLOCS, layout.size());
        // SAFETY: as above.
        unsafe { System.alloc_zeroed(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        note(&RUST_ALLOCS, layout.size());
        // SAFETY: as above.
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        note(&RUST_ALLOCS, new_size);
        // SAFETY: as above.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

// The C allocator, interposed: this executable's definitions win over libc's for every
// caller linked into it (zstd included); glibc exports its own under `__libc_*`.
extern "C" {
    fn __libc_malloc(n: usize) -> *mut c_void;
    fn __libc_calloc(n: usize, size: usize) -> *mut c_void;
    fn __libc_realloc(p: *mut c_void, n: usize) -> *mut c_void;
    fn __libc_free(p: *mut c_void);
    fn __libc_memalign(align: usize, n: usize) -> *mut c_void;
}

/// # Safety
/// The C `malloc` contract.
#[no_mangle]
pub unsafe extern "C" fn malloc(n: usize) -> *mut c_void {
    note(&C_ALLOCS, n);
    // SAFETY: same contract.
    unsafe { __libc_malloc(n) }
}

/// # Safety
/// The C `calloc` contract.
#[no_mangle]
pub unsafe extern "C" fn calloc(n: usize, size: usize) -> *mut c_void {
    note(&C_ALLOCS, n.saturating_mul(size));
    // SAFETY: same contract.
    unsafe { __libc_calloc(n, size) }
}

/// # Safety
/// The C `realloc` contract.
#[no_mangle]
pub unsafe extern "C" fn realloc(p: *mut c_void, n: usize) -> *mut c_void {
    note(&C_ALLOCS, n);
    // SAFETY: same contract.
    unsafe { __libc_realloc(p, n) }
}

/// # Safety
/// The C `free` contract.
#[no_mangle]
pub unsafe extern "C" fn free(p: *mut c_void) {
    if !p.is_null() {
        note(&C_ALLOCS, 0);
    }
    // SAFETY: same contract.
    unsafe { __libc_free(p) }
}

/// # Safety
/// The C `posix_memalign` contract.
#[no_mangle]
pub unsafe extern "C" fn posix_memalign(out: *mut *mut c_void, align: usize, n: usize) -> libc::c_int {
    note(&C_ALLOCS, n);
    // SAFETY: same contract; `out` is valid per the caller.
    unsafe {
        let p = __libc_memalign(align, n);
        if p.is_null() {
            return libc::ENOMEM;
        }
        *out = p;
    }
    0
}

/// # Safety
/// The C `aligned_alloc` contract.
#[no_mangle]
pub unsafe extern "C" fn aligned_alloc(align: usize, n: usize) -> *mut c_void {
    note(&C_ALLOCS, n);
    // SAFETY: same contract.
    unsafe { __libc_memalign(align, n) }
}

/// Allocations (Rust, C) counted on this thread inside the SIGBUS handler, and the size of
/// the first.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
struct HandlerAllocs {
    rust: u64,
    c: u64,
    first_size: usize,
}

/// Runs `f` on a new watched thread (under a watchdog) and returns what its SIGBUS handler
/// allocated.
fn watched<R: Send>(what: &str, f: impl FnOnce() -> R + Send) -> (R, HandlerAllocs) {
    let done = std::sync::atomic::AtomicBool::new(false);
    std::thread::scope(|s| {
        let worker = s.spawn(|| {
            WATCHED.with(|w| w.set(true));
            let r = f();
            WATCHED.with(|w| w.set(false));
            let allocs = HandlerAllocs {
                rust: RUST_ALLOCS.with(|c| c.replace(0)),
                c: C_ALLOCS.with(|c| c.replace(0)),
                first_size: FIRST_SIZE.with(|c| c.replace(0)),
            };
            done.store(true, std::sync::atomic::Ordering::Release);
            (r, allocs)
        });
        let deadline = Instant::now() + Duration::from_secs(120);
        while !done.load(std::sync::atomic::Ordering::Acquire) && !worker.is_finished() {
            if Instant::now() > deadline {
                eprintln!("signal_safety: scenario '{what}' stuck for 120 s in its fault loop");
                std::process::abort();
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        worker.join().unwrap_or_else(|_| panic!("scenario '{what}' panicked"))
    })
}

/// Calls an engine API from a watched thread without counting: the API is not the handler,
/// and it may block signals for its own duration.
fn unwatched<R>(f: impl FnOnce() -> R) -> R {
    WATCHED.with(|w| w.set(false));
    let r = f();
    WATCHED.with(|w| w.set(true));
    r
}

fn signal_pager(limit_bytes: u64, devices: Vec<DeviceConfig>) -> Pager {
    let mut b = Pager::builder().resident_limit(limit_bytes).fault_mode(FaultMode::Signal);
    for d in devices {
        b = b.device(d);
    }
    b.build().expect("pager")
}

/// The workload every scenario runs on the watched thread, each phase checking every byte
/// it reads: fill (direct reclaim in the handler), a sequential read (readahead, async
/// readahead on file devices), random reads and rewrites (swap-cache hits), then the limit
/// halved (`set_resident_limit` reclaims at once) and everything read again, then the
/// limit restored and a last sequential pass over the rewritten pages.
fn drive(p: &Pager, region_bytes: u64, random_accesses: usize) -> Stats {
    let region = unwatched(|| p.map(region_bytes as usize).expect("map"));
    let words = region.as_atomic_u64s();
    let nr_pages = region.len() / PAGE_SIZE;
    let mut version = unwatched(|| vec![1u64; nr_pages]);
    for i in 0..nr_pages {
        write_page(words, i, 1);
    }
    for i in 0..nr_pages {
        check_page(words, i, 1);
    }
    let mut rng = Rng(0x5eed ^ region_bytes);
    for _ in 0..random_accesses {
        let i = (rng.next() % nr_pages as u64) as usize;
        check_page(words, i, version[i]);
        if rng.next() % 4 == 0 {
            version[i] += 1;
            write_page(words, i, version[i]);
        }
    }
    let limit = p.resident_limit();
    unwatched(|| p.set_resident_limit(limit / 2)).expect("shrink the limit");
    for (i, &v) in version.iter().enumerate() {
        check_page(words, i, v);
    }
    unwatched(|| p.set_resident_limit(limit)).expect("restore the limit");
    for (i, &v) in version.iter().enumerate().rev() {
        check_page(words, i, v);
    }
    let st = p.stats();
    unwatched(|| drop(region));
    st
}

/// Runs `drive` on a watched thread and asserts the handler allocated nothing and the
/// basic paths ran: swap-out by direct reclaim, swap-in, swap-cache hits, readahead.
fn scenario(what: &str, p: &Pager, region_bytes: u64, random_accesses: usize) -> Stats {
    let (st, allocs) = watched(what, || drive(p, region_bytes, random_accesses));
    assert_eq!(allocs, HandlerAllocs::default(), "{what}: the SIGBUS handler allocated; {st:?}");
    assert!(st.pswpout > 0 && st.pswpin > 0, "{what}: pages went out and came back: {st:?}");
    assert!(st.pgsteal_direct > 0, "{what}: direct reclaim ran in the handler: {st:?}");
    assert!(st.pgfault_swapcache > 0, "{what}: swap-cache hits: {st:?}");
    assert!(st.swap_ra > 0, "{what}: readahead: {st:?}");
    // Cluster readahead finds its hits through slot owners, and signal mode frees a slot
    // when it brings the page back, so it sees none (docs/devices.md, "Readahead").
    if !what.contains("cluster readahead") {
        assert!(st.swap_ra_hit > 0, "{what}: readahead hits: {st:?}");
    }
    assert_eq!(st.fault_error, 0, "{what}: {st:?}");
    st
}

/// The detector detects: an allocation in a handler installed as uswap installs its
/// (full `sa_mask`) is counted, one outside is not. Without this, zero proves nothing.
#[test]
fn the_detector_counts_an_allocation_made_in_a_handler() {
    extern "C" fn allocating_handler(_: libc::c_int) {
        let b = std::hint::black_box(Box::new([7u8; 100]));
        drop(b);
    }
    let ((), outside) = watched("detector, outside", || {
        drop(std::hint::black_box(Box::new([7u8; 100])));
    });
    assert_eq!(outside, HandlerAllocs::default());
    let ((), inside) = watched("detector, inside", || {
        // SAFETY: installs a handler for SIGUSR2 (unused elsewhere in this binary) with a
        // full mask, as uswap installs its SIGBUS handler, and raises it on this thread.
        unsafe {
            let mut sa: libc::sigaction = std::mem::zeroed();
            sa.sa_sigaction = allocating_handler as extern "C" fn(libc::c_int) as usize;
            libc::sigfillset(&mut sa.sa_mask);
            assert_eq!(libc::sigaction(libc::SIGUSR2, &sa, std::ptr::null_mut()), 0);
            libc::pthread_kill(libc::pthread_self(), libc::SIGUSR2);
        }
    });
    assert!(inside.rust >= 2 && inside.c >= 2, "alloc and free counted, in Rust and in C: {inside:?}");
    assert_eq!(inside.first_size, 100, "{inside:?}");
    // The C layer sees C code: zstd's contexts, created with the pager, are C allocations
    // that Rust's allocator never sees (every Rust call reaches C once, so the difference
    // counts C's own).
    let (c_only, _) = watched("detector, zstd contexts", || {
        let (rust0, c0) = (RUST_ANY.with(|c| c.get()), C_ANY.with(|c| c.get()));
        let p = signal_pager(MIB, vec![DeviceConfig::zpool(4 * MIB).compressor(Compressor::Zstd { level: 3 })]);
        drop(p);
        (C_ANY.with(|c| c.get()) - c0) as i64 - (RUST_ANY.with(|c| c.get()) - rust0) as i64
    });
    assert!(c_only >= 2 * 16, "zstd's context allocations were seen: {c_only}");
    // The premise: uswap's own SIGBUS handler runs with SIGSYS blocked (and SIGBUS not:
    // a thread serving a fault must not look like one that blocks SIGBUS).
    let _p = signal_pager(MIB, vec![DeviceConfig::ram(4 * MIB)]);
    // SAFETY: reads the current SIGBUS disposition into a struct we own.
    let (sys_masked, bus_masked, nodefer) = unsafe {
        let mut sa: libc::sigaction = std::mem::zeroed();
        assert_eq!(libc::sigaction(libc::SIGBUS, std::ptr::null(), &mut sa), 0);
        (
            libc::sigismember(&sa.sa_mask, libc::SIGSYS) == 1,
            libc::sigismember(&sa.sa_mask, libc::SIGBUS) == 1,
            sa.sa_flags & libc::SA_NODEFER != 0,
        )
    };
    assert!(sys_masked, "uswap's SIGBUS handler must run with SIGSYS blocked for this detector");
    assert!(!bus_masked && nodefer, "uswap's SIGBUS handler runs with SIGBUS deliverable");
}

#[test]
fn ram_device() {
    let p = signal_pager(2 * MIB, vec![DeviceConfig::ram(64 * MIB)]);
    scenario("ram", &p, 6 * MIB, 3000);
}

#[test]
fn ram_device_with_cluster_readahead() {
    let p = signal_pager(2 * MIB, vec![DeviceConfig::ram(64 * MIB).readahead(ReadaheadPolicy::Cluster)]);
    scenario("ram, cluster readahead", &p, 6 * MIB, 3000);
}

#[test]
fn zpool_lz4() {
    let p = signal_pager(2 * MIB, vec![DeviceConfig::zpool(32 * MIB)]);
    let st = scenario("zpool lz4", &p, 6 * MIB, 3000);
    let pool = st.devices[0].backend.clone().expect("pool counters");
    assert!(pool.stored_pages > pool.same_filled_pages, "pages were compressed: {pool:?}");
}

#[test]
fn zpool_zstd() {
    let p = signal_pager(2 * MIB, vec![DeviceConfig::zpool(32 * MIB).compressor(Compressor::Zstd { level: 3 })]);
    let st = scenario("zpool zstd", &p, 6 * MIB, 3000);
    let pool = st.devices[0].backend.clone().expect("pool counters");
    assert!(pool.compressed_bytes > 0 && pool.stored_pages > pool.same_filled_pages, "{pool:?}");
}

/// A zstd pool of units with a dictionary: trained first (outside the watched phase: the
/// background thread trains once the pool has compressed enough pages), then every write
/// in the handler compresses with it (or, where it does not pay, without, one page in 32
/// both ways) and every read of a frame that names it decompresses with it, on contexts
/// warmed for each size.
#[test]
fn zpool_zstd_units_with_a_dictionary() {
    let device = DeviceConfig::zpool(64 * MIB).compressor(Compressor::Zstd { level: 1 }).unit_pages(4).dictionary(true);
    let p = signal_pager(2 * MIB, vec![device]);
    let region = p.map(24 * MIB as usize).expect("map");
    let words = region.as_atomic_u64s();
    let nr_pages = region.len() / PAGE_SIZE;
    let trained =
        |p: &Pager| p.stats().devices[0].backend.as_ref().map_or(0, |b| b.dictionary_bytes + b.dictionary_failures);
    // Bounded: 20 s at most; each pass writes every page (its samples and its writes).
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut pass = 1;
    while trained(&p) == 0 {
        assert!(Instant::now() < deadline, "no dictionary trained in 20 s: {:?}", p.stats());
        for i in 0..nr_pages {
            write_page(words, i, pass);
        }
        pass += 1;
        std::thread::sleep(Duration::from_millis(100));
    }
    drop(region);
    let st = scenario("zpool zstd units with a dictionary", &p, 6 * MIB, 3000);
    let pool = st.devices[0].backend.clone().expect("pool counters");
    assert!(pool.dictionary_bytes > 0 && pool.dictionary_failures == 0, "{pool:?}");
}

#[test]
fn file_device_with_async_readahead() {
    let p = signal_pager(2 * MIB, vec![DeviceConfig::file("/var/tmp", 64 * MIB)]);
    let st = scenario("file", &p, 8 * MIB, 3000);
    assert!(st.swap_ra_async > 0, "asynchronous readahead mapped pages: {st:?}");
}

#[test]
fn nearly_full_file_device_discards_clusters_with_cluster_readahead() {
    // 4 clusters (8 MiB) for up to 6.5 MiB of swapped pages.
    let p = signal_pager(2 * MIB, vec![DeviceConfig::file("/var/tmp", 8 * MIB).readahead(ReadaheadPolicy::Cluster)]);
    scenario("nearly full file (cluster readahead), first region", &p, 15 * MIB / 2, 2000);
    // The first region's clusters wait for discard: the second region's swap-outs (in the
    // handler) find no other cluster and discard them.
    let st = scenario("nearly full file (cluster readahead), second region", &p, 15 * MIB / 2, 2000);
    assert!(st.devices[0].clusters_discarded > 0, "clusters were discarded: {st:?}");
}

#[test]
fn fault_injection_with_checksums() {
    let f = FaultInjection { read_error_rate: 0.05, write_error_rate: 0.1, corrupt_rate: 0.05, seed: 5 };
    let p = signal_pager(2 * MIB, vec![DeviceConfig::zpool(32 * MIB).checksum(true).inject_faults(f)]);
    let (st, allocs) = watched("fault injection", || drive(&p, 6 * MIB, 3000));
    assert_eq!(allocs, HandlerAllocs::default(), "fault injection: the SIGBUS handler allocated; {st:?}");
    assert!(st.swpout_error > 0 && st.checksum_errors > 0 && st.pswpin > 0, "{st:?}");
    assert!(!p.recent_errors().is_empty(), "failed reads were recorded");
}

#[test]
fn tiers_spill_from_a_small_first_device() {
    // The pool declines incompressible pages (spilled to the next device); the small RAM
    // device fills up and allocation passes to the last one.
    let p = signal_pager(
        2 * MIB,
        vec![
            DeviceConfig::zpool(16 * MIB).incompressible(Incompressible::Reject).priority(5),
            DeviceConfig::ram(2 * MIB).priority(3),
            DeviceConfig::ram(64 * MIB),
        ],
    );
    let st = scenario("spill", &p, 8 * MIB, 4000);
    assert!(st.swpout_spilled > 0, "{st:?}");
    assert!(st.devices.iter().all(|d| d.slots_used > 0), "every tier holds pages: {st:?}");
}

#[test]
fn tiers_pool_writeback_to_a_file() {
    let p = signal_pager(
        2 * MIB,
        vec![DeviceConfig::zpool(2 * MIB).priority(10), DeviceConfig::file("/var/tmp", 64 * MIB)],
    );
    let (st, allocs) = watched("pool writeback", || {
        let region = unwatched(|| p.map(16 * MIB as usize).expect("map"));
        let words = region.as_atomic_u64s();
        let nr_pages = region.len() / PAGE_SIZE;
        for i in 0..nr_pages {
            write_page(words, i, 1);
        }
        // Writeback runs in the background reclaimer; keep faulting while it does.
        let deadline = Instant::now() + Duration::from_secs(10);
        let mut round = 1;
        while p.stats().writeback == 0 && Instant::now() < deadline {
            for i in 0..nr_pages {
                check_page(words, i, round);
            }
            round += 1;
            for i in 0..nr_pages {
                write_page(words, i, round);
            }
        }
        for i in 0..nr_pages {
            check_page(words, i, round);
        }
        let st = p.stats();
        unwatched(|| drop(region));
        st
    });
    assert_eq!(allocs, HandlerAllocs::default(), "pool writeback: the SIGBUS handler allocated; {st:?}");
    assert!(st.writeback > 0 && st.pswpin > 0, "{st:?}");
}
