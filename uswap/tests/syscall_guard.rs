//! The system-call guard through the library (`PagerBuilder::syscall_guard`): a program that
//! builds a signal-mode pager itself gets what `uswap run`'s library gives, a `recv` of a
//! datagram or a `read` into managed memory that is out brings it in first instead of
//! failing with `EFAULT` (the datagram lost). Thread mode needs no guard; it is checked with
//! the same loops. Every device kind (Redis on a local server), every byte checked.
//!
//! Not under the test harness (`harness = false` in Cargo.toml): the guard rewrites the C
//! library only in a process with one thread, and the harness runs tests on threads of its
//! own. The checks run in turn from `main`; a watchdog thread, started once the first pager
//! (and the rewrite) is built, ends the process with every thread's state if one stalls.
//! A build asking for the guard in a process that already has a second thread fails with
//! `Error::SyscallGuardThreads`, checked in a child process. With the guard, masks set
//! later (a thread blocking every signal, a handler with a full `sa_mask`) keep SIGBUS out,
//! and such a thread touches pages that are out without being killed.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use uswap::{DeviceConfig, Error, FaultMode, Pager, RedisOptions, PAGE_SIZE};

mod common;
use common::{skipped, thread_states, MIB};

const LIMIT_BYTES: u64 = 2 * MIB;
/// Four times the limit: most of the region is out once it has been filled.
const REGION_BYTES: usize = 8 * MIB as usize;
/// Datagrams received into pages that are out, per pager.
const NR_DATAGRAMS: usize = 200;
/// `read`s into pages just written from user code, per pager, while two threads fault.
const NR_READS: usize = 3000;
/// No progress for this long is a hang.
const STALL: Duration = Duration::from_secs(60);

/// Steps taken, for the watchdog.
static PROGRESS: AtomicU64 = AtomicU64::new(0);

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if args.iter().any(|a| a == "--list") {
        // `cargo test -- --list`: this binary has no harness to list tests.
        return;
    }
    if args.get(1).map(String::as_str) == Some("--child-with-a-thread") {
        return child_with_a_thread();
    }
    let dir = std::env::temp_dir().join(format!("uswap-syscall-guard-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("a directory for the file device");
    let device_bytes = 8 * REGION_BYTES as u64;
    let mut nr_checks = 0;
    // The first pager rewrites the C library while this process has one thread.
    for (name, device) in [
        ("ram", DeviceConfig::ram(device_bytes)),
        ("zpool", DeviceConfig::zpool(device_bytes)),
        ("file", DeviceConfig::file(&dir, device_bytes)),
    ] {
        if !check_device(name, device, nr_checks == 0) {
            return;
        }
        nr_checks += 1;
    }
    let _ = std::fs::remove_dir_all(&dir);
    // After the rewrite: the local servers are processes of their own, started from here.
    if let Some(r) = common::local_redis(1, 0, &[]) {
        let redis = DeviceConfig::redis(r.seeds(0), device_bytes).redis_options(RedisOptions::new(r.seeds(0)));
        assert!(check_device("redis", redis, false));
        nr_checks += 1;
    }
    a_second_thread_refuses_the_guard();
    // Each device's two modes and its masks in signal mode, and the refusal.
    println!("\ntest result: ok. {} passed; 0 failed", 7 * nr_checks + 1);
}

/// Every check on `device`, with a pager in each mode asking for the guard; false if this
/// process may not open a userfaultfd (said). `first`: the first pager of the process,
/// after which the watchdog starts.
fn check_device(name: &str, device: DeviceConfig, first: bool) -> bool {
    for mode in [FaultMode::Signal, FaultMode::Thread] {
        let built = Pager::builder()
            .resident_limit(LIMIT_BYTES)
            .fault_mode(mode)
            .device(device.clone())
            .syscall_guard(true)
            .build();
        let p = match built {
            Ok(p) => p,
            Err(e) if e.kind() == uswap::ErrorKind::Permission => {
                skipped(&format!("no userfaultfd: {e}"));
                return false;
            }
            Err(e) => panic!("{name}, {mode:?}: the pager with the guard: {e}"),
        };
        if first && mode == FaultMode::Signal {
            // The rewrite is done (one thread until now): other threads may start.
            start_watchdog();
            // What `uswap run`'s library declares once every call of the C library is
            // rewritten and every thread has an alternate signal stack; this test's threads
            // keep their stacks outside managed memory, and it calls only through the C
            // library. Signal mode may then bring a read fault's page in clean
            // (write-protected), which `reads_into_pages_just_touched` relies on.
            uswap::sigbus::note_system_calls_routed();
        }
        // First, on the fresh pager, which bets that its read faults' pages leave unwritten
        // (`state::clean_bets`): they come in clean, every `read` into one has the guard
        // unprotect it first, and the pager stops betting only after a window of 256 bets
        // that lost a quarter of them (`LOSING_BETS`): its first 256 read faults bet.
        reads_into_pages_just_touched(&p, name, mode, Touch::Read);
        if mode == FaultMode::Signal {
            let wp = p.stats().pgfault_wp;
            assert!(wp >= 8, "{name}: {wp} write-protect faults: no page came in clean");
        }
        datagrams_into_pages_that_are_out(&p, name, mode);
        reads_into_pages_just_touched(&p, name, mode, Touch::Write);
        if mode == FaultMode::Signal {
            masks_set_later_never_block_sigbus(&p, name);
        }
        only_what_the_kernel_can_touch_is_brought_in(&p, name, mode);
        clean_pages_leave_and_discards_read_zero(&p, name, mode);
        populating_brings_the_range_in(&p, name, mode);
        one_write_and_read_larger_than_the_limit(&p, name, mode);
        let st = p.stats();
        assert_eq!((st.syscall_efault, st.fault_error, st.checksum_errors), (0, 0, 0), "{name}, {mode:?}: {st:?}");
        if mode == FaultMode::Signal {
            assert!(st.syscall_prepared > 0, "{name}: no call went through the guard: {st:?}");
        }
        println!("test {name}_{mode:?}_recv_and_read_into_managed_memory ... ok");
    }
    true
}

/// Page `i`'s bytes at `version`: pseudo-random (xorshift), nothing compresses.
fn page_bytes(i: usize, version: u64) -> Vec<u8> {
    let mut s = (i as u64 + 1).wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ version.wrapping_mul(0xbf58_476d_1ce4_e5b9) | 1;
    let mut out = Vec::with_capacity(PAGE_SIZE);
    for _ in 0..PAGE_SIZE / 8 {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        out.extend_from_slice(&s.to_le_bytes());
    }
    out
}

fn page_of(region: &uswap::Region, i: usize) -> *mut u8 {
    region.as_ptr().wrapping_add(i * PAGE_SIZE)
}

/// Fills every page of `region` with its bytes at version 0; with a limit a quarter of the
/// region, the first pages end up on the device.
fn fill(region: &mut uswap::Region) {
    for (i, page) in region.as_mut_slice().chunks_mut(PAGE_SIZE).enumerate() {
        page.copy_from_slice(&page_bytes(i, 0));
    }
}

/// One `write` of a region twelve times the limit (six pins), most of it out, to a file,
/// and one `pread` of it back into the region: both move every byte, and each brings a page
/// in a bounded number of times. The rest of a buffer that did not stay in went on in
/// windows as large as the rest, each readied whole and kept in only as far as the pin: a
/// 256 MiB `write` under a 32 MiB limit brought its pages in 34 times over, and here 42,734
/// pages came in for the two calls' 12,288; 22,532 with windows of half a pin but a first
/// call that readied the whole buffer; now 12,288 in signal mode and about 12,800 in thread
/// mode (each page once a call, its first window readied first).
fn one_write_and_read_larger_than_the_limit(p: &Pager, name: &str, mode: FaultMode) {
    let bytes = 3 * REGION_BYTES;
    let mut region = p.map(bytes).expect("map");
    fill(&mut region);
    // A file of its own, unlinked at once (as `reads_into_pages_just_touched`'s).
    let path = std::env::temp_dir().join(format!("uswap-syscall-guard-big-{}", std::process::id()));
    let file = std::fs::OpenOptions::new().read(true).write(true).create_new(true).open(&path).expect("a file");
    let _ = std::fs::remove_file(&path);
    let before = p.stats().pswpin;
    // SAFETY: a file of our own; the write reads the region's bytes, the read writes them.
    let (written, read) = unsafe {
        let fd = std::os::fd::AsRawFd::as_raw_fd(&file);
        let written = libc::write(fd, region.as_ptr().cast(), bytes);
        (written, libc::pread(fd, region.as_ptr().cast(), bytes, 0))
    };
    assert_eq!((written, read), (bytes as isize, bytes as isize), "{name}, {mode:?}");
    let nr_pages = (bytes / PAGE_SIZE) as u64;
    let brought_in = p.stats().pswpin - before;
    for i in 0..bytes / PAGE_SIZE {
        // SAFETY: page `i` of the region, whole.
        let got = unsafe { std::slice::from_raw_parts(page_of(&region, i), PAGE_SIZE) };
        assert!(got == page_bytes(i, 0).as_slice(), "{name}, {mode:?}: page {i} read back wrong");
    }
    let bound = 2 * nr_pages + nr_pages / 4;
    assert!(brought_in <= bound, "{name}, {mode:?}: {brought_in} pages brought in for 2 x {nr_pages}");
    println!("test {name}_{mode:?}_one_write_and_read_larger_than_the_limit ... ok");
}

/// `madvise(MADV_POPULATE_READ)`, then `MADV_POPULATE_WRITE`, over a region four times the
/// limit, most of it out: both succeed as without uswap (in signal mode the kernel's own
/// faults cannot be served; the guard brings each window in first), and every byte reads back.
fn populating_brings_the_range_in(p: &Pager, name: &str, mode: FaultMode) {
    let mut region = p.map(REGION_BYTES).expect("map");
    fill(&mut region);
    for advice in [libc::MADV_POPULATE_READ, libc::MADV_POPULATE_WRITE] {
        // SAFETY: the region is this test's, mapped and page-aligned.
        let r = unsafe { libc::madvise(region.as_ptr().cast(), REGION_BYTES, advice) };
        assert_eq!(r, 0, "{name}, {mode:?}: madvise({advice}): {}", std::io::Error::last_os_error());
    }
    for (i, page) in region.as_slice().chunks(PAGE_SIZE).enumerate() {
        assert!(page == page_bytes(i, 0).as_slice(), "{name}, {mode:?}: page {i} after populating");
    }
}

fn close(fd: libc::c_int) {
    // SAFETY: closes a descriptor this test opened.
    unsafe { libc::close(fd) };
}

/// `recv` of a datagram into a page that is out, over and over: each gets every byte, and
/// the pages not written keep theirs.
fn datagrams_into_pages_that_are_out(p: &Pager, name: &str, mode: FaultMode) {
    let mut region = p.map(REGION_BYTES).expect("map");
    fill(&mut region);
    let mut sv = [0; 2];
    // SAFETY: socketpair(2) writes two descriptors into the array we own.
    let r = unsafe { libc::socketpair(libc::AF_UNIX, libc::SOCK_DGRAM, 0, sv.as_mut_ptr()) };
    assert_eq!(r, 0, "socketpair: {}", std::io::Error::last_os_error());
    let nr_pages = REGION_BYTES / PAGE_SIZE;
    let mut version = vec![0u64; nr_pages];
    let mut nr_out = 0;
    for k in 0..NR_DATAGRAMS {
        // Oldest first: the pages filled first are the ones on the device.
        let i = (k * 37) % nr_pages;
        if region.mapped_pages_in(i * PAGE_SIZE, PAGE_SIZE).unwrap() == 0 {
            nr_out += 1;
        }
        let data = page_bytes(i, k as u64 + 1);
        // SAFETY: send(2) of a buffer we own.
        let n = unsafe { libc::send(sv[0], data.as_ptr().cast(), PAGE_SIZE, 0) };
        assert_eq!(n, PAGE_SIZE as isize, "send: {}", std::io::Error::last_os_error());
        // SAFETY: recv(2) into one page of the region, which we own.
        let n = unsafe { libc::recv(sv[1], page_of(&region, i).cast(), PAGE_SIZE, libc::MSG_DONTWAIT) };
        let err = std::io::Error::last_os_error();
        assert_eq!(n, PAGE_SIZE as isize, "{name}, {mode:?}: recv {k} into page {i}: {err} (the datagram is lost)");
        version[i] = k as u64 + 1;
        PROGRESS.fetch_add(1, Ordering::Relaxed);
    }
    close(sv[0]);
    close(sv[1]);
    assert!(nr_out > NR_DATAGRAMS / 4, "{name}, {mode:?}: only {nr_out} of the pages received into were out");
    for (i, &v) in version.iter().enumerate() {
        assert!(
            region.as_slice()[i * PAGE_SIZE..(i + 1) * PAGE_SIZE] == page_bytes(i, v)[..],
            "{name}, {mode:?}: page {i}"
        );
    }
}

/// How a buffer is touched from user code before it is handed to `read`.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Touch {
    Write,
    /// In signal mode with the guard, a read fault may bring the page in clean
    /// (write-protected, keeping its slot): the guard must unprotect it for the kernel.
    Read,
}

/// The patterns programs use: write (or read) a buffer from user code, then hand it to
/// `read`. Two other threads fault all the while, so reclaim may take the page between the
/// touch and the call; every `read` must still get its bytes.
fn reads_into_pages_just_touched(p: &Pager, name: &str, mode: FaultMode, touch: Touch) {
    let mut region = p.map(REGION_BYTES).expect("map");
    fill(&mut region);
    let nr_pages = REGION_BYTES / PAGE_SIZE;
    // The file `read` copies from: one page of bytes no page of the region holds.
    let path = std::env::temp_dir().join(format!("uswap-syscall-guard-src-{}", std::process::id()));
    let src = page_bytes(usize::MAX / 2, 7);
    std::fs::write(&path, &src).expect("the source file");
    let file = std::fs::File::open(&path).expect("open the source file");
    let _ = std::fs::remove_file(&path);
    let fd = std::os::fd::AsRawFd::as_raw_fd(&file);
    let stop = AtomicBool::new(false);
    // The other threads own the second half of the region; this one the first half.
    let half = nr_pages / 2;
    let base = region.as_ptr() as usize;
    std::thread::scope(|s| {
        for t in 0..2u64 {
            let stop = &stop;
            s.spawn(move || {
                let mut rng = t + 1;
                // Bounded by the reading thread, which sets `stop` after NR_READS.
                while !stop.load(Ordering::Relaxed) {
                    rng ^= rng << 13;
                    rng ^= rng >> 7;
                    rng ^= rng << 17;
                    let i = half + (rng as usize % half);
                    let at = (base + i * PAGE_SIZE + (t as usize) * 8) as *const u64;
                    // SAFETY: a word of a mapped region page (read only: its bytes stay).
                    std::hint::black_box(unsafe { std::ptr::read_volatile(at) });
                }
            });
        }
        let mut failed = vec![];
        for k in 0..NR_READS {
            let i = (k * 7919) % half;
            let page = page_of(&region, i);
            match touch {
                // SAFETY: the first byte of a region page we own, written from user code.
                Touch::Write => unsafe { std::ptr::write_volatile(page, 0x5a) },
                // SAFETY: as above, read.
                Touch::Read => drop(std::hint::black_box(unsafe { std::ptr::read_volatile(page) })),
            }
            // SAFETY: pread(2) into one page of the region, which we own.
            let n = unsafe { libc::pread(fd, page.cast(), PAGE_SIZE, 0) };
            if n != PAGE_SIZE as isize {
                failed.push((i, std::io::Error::last_os_error()));
            }
            PROGRESS.fetch_add(1, Ordering::Relaxed);
        }
        stop.store(true, Ordering::Relaxed);
        assert!(
            failed.is_empty(),
            "{name}, {mode:?}, {touch:?}: {} of {NR_READS} reads failed: {:?}",
            failed.len(),
            &failed[..failed.len().min(5)]
        );
    });
    for i in 0..nr_pages {
        let got = &region.as_slice()[i * PAGE_SIZE..(i + 1) * PAGE_SIZE];
        let touched = i < half && (0..NR_READS).any(|k| (k * 7919) % half == i);
        let want = if touched { src.clone() } else { page_bytes(i, 0) };
        assert!(got == &want[..], "{name}, {mode:?}, {touch:?}: page {i} (read into: {touched})");
    }
}

/// Two threads read every page of a region four times the limit over and over (in signal
/// mode the pager bets their pages leave unwritten: they come in clean, and reclaim drops
/// them where they lie, a round's with one `process_madvise`, since the regions' descriptor
/// asks for no `REMOVE` events under the guard), then the program discards part of the
/// region with `madvise` and another part with `process_madvise`: every page read holds its
/// bytes, every discarded page reads zero afterwards (the guard applied the discard, or, in
/// thread mode, the event), the rest keeps its bytes.
fn clean_pages_leave_and_discards_read_zero(p: &Pager, name: &str, mode: FaultMode) {
    let mut region = p.map(REGION_BYTES).expect("map");
    fill(&mut region);
    let nr_pages = REGION_BYTES / PAGE_SIZE;
    let before = p.stats();
    let base = region.as_ptr() as usize;
    let bad = AtomicU64::new(0);
    std::thread::scope(|s| {
        for t in 0..2usize {
            let bad = &bad;
            s.spawn(move || {
                for pass in 0..3 {
                    for k in 0..nr_pages {
                        let i = if t == 0 { (k * 7919 + pass) % nr_pages } else { nr_pages - 1 - k };
                        // SAFETY: a mapped page of the region, read only.
                        let got = unsafe { std::slice::from_raw_parts((base + i * PAGE_SIZE) as *const u8, PAGE_SIZE) };
                        if got != &page_bytes(i, 0)[..] {
                            bad.fetch_add(1, Ordering::Relaxed);
                        }
                        PROGRESS.fetch_add(1, Ordering::Relaxed);
                    }
                }
            });
        }
    });
    assert_eq!(bad.load(Ordering::Relaxed), 0, "{name}, {mode:?}: pages read back wrong");
    let read = p.stats();
    if mode == FaultMode::Signal {
        let clean = read.swpout_clean - before.swpout_clean;
        assert!(clean > 0, "{name}: no clean page left: {read:?}");
    }
    // Pages [q, 2q) by `madvise`, [2q, 2q + q/2) and [3q, 3q + q/2) by one `process_madvise`.
    let q = nr_pages / 4;
    let at = |i: usize| (base + i * PAGE_SIZE) as *mut libc::c_void;
    // SAFETY: a range of the region, which this test owns; its pages then read zero.
    assert_eq!(unsafe { libc::madvise(at(q), q * PAGE_SIZE, libc::MADV_DONTNEED) }, 0, "{name}: madvise");
    let iov = [
        libc::iovec { iov_base: at(2 * q), iov_len: q / 2 * PAGE_SIZE },
        libc::iovec { iov_base: at(3 * q), iov_len: q / 2 * PAGE_SIZE },
    ];
    const PIDFD_SELF: libc::c_long = -10000;
    // SAFETY: as above; the kernel reads the two iovecs.
    let n = unsafe { libc::syscall(libc::SYS_process_madvise, PIDFD_SELF, iov.as_ptr(), 2, libc::MADV_DONTNEED, 0) };
    let by_vector = n == (q * PAGE_SIZE) as libc::c_long;
    let discarded = |i: usize| (q..2 * q).contains(&i) || (by_vector && (i % q) < q / 2 && (i / q == 2 || i / q == 3));
    for i in 0..nr_pages {
        let got = &region.as_slice()[i * PAGE_SIZE..(i + 1) * PAGE_SIZE];
        let want = if discarded(i) { vec![0u8; PAGE_SIZE] } else { page_bytes(i, 0) };
        assert!(got == &want[..], "{name}, {mode:?}: page {i} (discarded: {})", discarded(i));
    }
    let removes = p.stats().uffd_remove - read.uffd_remove;
    let want_removes = if by_vector { 3 } else { 1 };
    assert!(removes >= want_removes, "{name}, {mode:?}: {removes} discards applied, {want_removes} made");
    println!("test {name}_{mode:?}_clean_pages_leave_and_discards_read_zero ... ok (process_madvise: {by_vector})");
}

/// This thread's blocked signals, from `/proc/thread-self/status`.
fn blocked_signals_of_this_thread() -> u64 {
    let status = std::fs::read_to_string("/proc/thread-self/status").expect("/proc/thread-self/status");
    let line = status.lines().find_map(|l| l.strip_prefix("SigBlk:")).expect("a SigBlk line");
    u64::from_str_radix(line.trim(), 16).expect("SigBlk in hex")
}

extern "C" fn on_sigusr2(_: libc::c_int) {}

/// A thread that blocks every signal after the pager (and the guard) started, then touches
/// pages that are out: SIGBUS stays deliverable (killed the process before), and every page
/// holds its bytes. A handler installed with a full `sa_mask` gets it without SIGBUS.
fn masks_set_later_never_block_sigbus(p: &Pager, name: &str) {
    let sigbus_bit = 1u64 << (libc::SIGBUS - 1);
    let mut region = p.map(REGION_BYTES).expect("map");
    fill(&mut region);
    let (base, nr_pages) = (region.as_ptr() as usize, REGION_BYTES / PAGE_SIZE);
    let out_before = nr_pages - region.mapped_pages().unwrap();
    std::thread::scope(|s| {
        s.spawn(move || {
            // SAFETY: a full set of our own, blocked in this thread only.
            unsafe {
                let mut all: libc::sigset_t = std::mem::zeroed();
                libc::sigfillset(&mut all);
                assert_eq!(libc::pthread_sigmask(libc::SIG_BLOCK, &all, std::ptr::null_mut()), 0);
            }
            let blocked = blocked_signals_of_this_thread();
            assert_eq!(blocked & sigbus_bit, 0, "{name}: SIGBUS blocked ({blocked:#x})");
            assert_ne!(blocked & (1 << (libc::SIGUSR1 - 1)), 0, "{name}: the rest of the mask stands ({blocked:#x})");
            for i in 0..nr_pages {
                let at = (base + i * PAGE_SIZE) as *const [u8; 8];
                // SAFETY: the first bytes of a mapped region page (may take a fault).
                let head = unsafe { std::ptr::read_volatile(at) };
                assert_eq!(head[..], page_bytes(i, 0)[..8], "{name}: page {i}");
                PROGRESS.fetch_add(1, Ordering::Relaxed);
            }
        });
    });
    assert!(out_before > nr_pages / 2, "{name}: only {out_before} pages were out");
    // SAFETY: sigaction(2) with structures we own; the handler does nothing, and the old
    // action (the default) is put back.
    unsafe {
        let mut act: libc::sigaction = std::mem::zeroed();
        act.sa_sigaction = on_sigusr2 as extern "C" fn(libc::c_int) as usize;
        libc::sigfillset(&mut act.sa_mask);
        let mut old: libc::sigaction = std::mem::zeroed();
        assert_eq!(libc::sigaction(libc::SIGUSR2, &act, &mut old), 0);
        let mut now: libc::sigaction = std::mem::zeroed();
        assert_eq!(libc::sigaction(libc::SIGUSR2, std::ptr::null(), &mut now), 0);
        assert_eq!(libc::sigismember(&now.sa_mask, libc::SIGBUS), 0, "{name}: SIGBUS in a handler's mask");
        assert_eq!(libc::sigismember(&now.sa_mask, libc::SIGUSR1), 1, "{name}: the rest of the mask stands");
        libc::sigaction(libc::SIGUSR2, &old, std::ptr::null_mut());
    }
    println!("test {name}_masks_set_after_the_guard_keep_sigbus_deliverable ... ok");
}

/// The pages of `region` the pager has zero-filled or mapped around a zero fill, in all.
fn zero_filled(p: &Pager) -> u64 {
    let st = p.stats();
    st.pgfault_zero + st.zero_fill_around
}

fn errno() -> i32 {
    std::io::Error::last_os_error().raw_os_error().unwrap_or(0)
}

/// Calls whose length alone the kernel refuses (`epoll_wait` for `INT_MIN` events, a
/// `readlink` into `-1` bytes, a `poll` of more descriptors than `RLIMIT_NOFILE` allows),
/// with their buffer in an untouched region, fail with `EINVAL` as without uswap and bring
/// none of it in; a `readlink` into `INT_MAX` bytes brings in the page the path goes to, a
/// `read` of a pipe into the whole region the pipe's capacity. Read as given, each length
/// named gigabytes (or the region), brought in page by page in signal mode (stress-ng's
/// epoll stressor: 90 s for a call that fails at once; `dd bs=256M` reading a pipe: its
/// whole buffer for each 64 KiB).
fn only_what_the_kernel_can_touch_is_brought_in(p: &Pager, name: &str, mode: FaultMode) {
    let region = p.map(REGION_BYTES).expect("map");
    let at = region.as_ptr();
    let before = zero_filled(p);
    // SAFETY: calls the kernel refuses before it touches `at`; an epoll descriptor of our own.
    unsafe {
        let epfd = libc::epoll_create1(0);
        assert!(epfd >= 0);
        let n = libc::epoll_wait(epfd, at.cast::<libc::epoll_event>(), i32::MIN, 0);
        assert_eq!((n, errno()), (-1, libc::EINVAL), "{name}, {mode:?}: epoll_wait for INT_MIN events");
        close(epfd);
        let n = libc::readlink(c"/proc/self/exe".as_ptr(), at.cast::<libc::c_char>(), usize::MAX);
        assert_eq!((n, errno()), (-1, libc::EINVAL), "{name}, {mode:?}: readlink into -1 bytes");
        let mut open_files = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
        assert_eq!(libc::getrlimit(libc::RLIMIT_NOFILE, &mut open_files), 0);
        let nr_fds = open_files.rlim_cur.saturating_add(1).max(1 << 20);
        let n = libc::poll(at.cast::<libc::pollfd>(), nr_fds as libc::nfds_t, 0);
        assert_eq!((n, errno()), (-1, libc::EINVAL), "{name}, {mode:?}: poll of {nr_fds} descriptors");
    }
    let brought_in = zero_filled(p) - before;
    assert_eq!(brought_in, 0, "{name}, {mode:?}: refused calls brought {brought_in} pages in");
    // SAFETY: the path goes to the region's first bytes, which are ours.
    let n = unsafe { libc::readlink(c"/proc/self/exe".as_ptr(), at.cast::<libc::c_char>(), i32::MAX as usize) };
    let exe = std::fs::read_link("/proc/self/exe").expect("/proc/self/exe");
    let exe = exe.as_os_str().as_encoded_bytes();
    assert_eq!(n, exe.len() as isize, "{name}, {mode:?}: readlink into INT_MAX bytes");
    // SAFETY: the `n` bytes the kernel wrote.
    assert_eq!(unsafe { std::slice::from_raw_parts(at, exe.len()) }, exe, "{name}, {mode:?}");
    let brought_in = zero_filled(p) - before;
    assert!(brought_in <= 16, "{name}, {mode:?}: a readlink brought {brought_in} pages in");
    // A read of a pipe gets what the pipe holds, at most its capacity (64 KiB): the rest of
    // a region-sized buffer stays untouched.
    let mut fds = [0; 2];
    // SAFETY: a pipe of our own; the read writes at most the region's bytes, ours.
    let n = unsafe {
        assert_eq!(libc::pipe(fds.as_mut_ptr()), 0);
        assert_eq!(libc::write(fds[1], b"through a pipe".as_ptr().cast(), 14), 14);
        libc::read(fds[0], at.add(PAGE_SIZE).cast(), REGION_BYTES - PAGE_SIZE)
    };
    close(fds[0]);
    close(fds[1]);
    assert_eq!(n, 14, "{name}, {mode:?}: read of a pipe");
    // SAFETY: the bytes the read wrote.
    assert_eq!(unsafe { std::slice::from_raw_parts(at.add(PAGE_SIZE), 14) }, b"through a pipe");
    let brought_in = zero_filled(p) - before;
    assert!(brought_in <= 32, "{name}, {mode:?}: a read of a pipe brought {brought_in} pages in");
    stream_socket_reads_into_a_large_buffer(p, name, mode, at, before);
    println!("test {name}_{mode:?}_only_what_the_kernel_can_touch_is_brought_in ... ok");
}

/// A `recv` of a stream socket into a region-sized buffer at `at` brings in what the socket
/// holds (at least 64 KiB), not the buffer: 14 bytes queued, a few pages. Then 3 MiB sent
/// by another thread while `recv`s wait: each may stop short where the buffer was not
/// readied, and every byte arrives once, in order.
fn stream_socket_reads_into_a_large_buffer(p: &Pager, name: &str, mode: FaultMode, at: *mut u8, before: u64) {
    const SENT_BYTES: usize = 3 << 20;
    let mut fds = [0; 2];
    // SAFETY: a socket pair of our own; the recv writes at most the region's bytes, ours.
    let n = unsafe {
        assert_eq!(libc::socketpair(libc::AF_UNIX, libc::SOCK_STREAM, 0, fds.as_mut_ptr()), 0);
        assert_eq!(libc::send(fds[1], b"through a pipe".as_ptr().cast(), 14, 0), 14);
        libc::recv(fds[0], at.add(PAGE_SIZE).cast(), REGION_BYTES - PAGE_SIZE, 0)
    };
    assert_eq!(n, 14, "{name}, {mode:?}: recv of a stream socket");
    let brought_in = zero_filled(p) - before;
    assert!(brought_in <= 48, "{name}, {mode:?}: a recv of 14 bytes brought {brought_in} pages in");
    let sent: Vec<u8> = (0..SENT_BYTES).map(|i| (i.wrapping_mul(0x9e37_79b9) >> 13) as u8).collect();
    let mut received = Vec::with_capacity(SENT_BYTES);
    let (rx, tx) = (fds[0], fds[1]);
    let at = at as usize;
    std::thread::scope(|s| {
        s.spawn(|| {
            std::thread::sleep(Duration::from_millis(50));
            let mut off = 0;
            // Bounded: each send moves at least a byte, or the test fails.
            while off < SENT_BYTES {
                // SAFETY: sends from `sent`, ours.
                let n = unsafe { libc::send(tx, sent[off..].as_ptr().cast(), SENT_BYTES - off, 0) };
                assert!(n > 0, "{name}, {mode:?}: send: {}", std::io::Error::last_os_error());
                off += n as usize;
            }
        });
        // Bounded: each recv gets at least a byte until all were sent.
        while received.len() < SENT_BYTES {
            // SAFETY: the region's bytes, ours.
            let n = unsafe { libc::recv(rx, (at + PAGE_SIZE) as *mut libc::c_void, REGION_BYTES - PAGE_SIZE, 0) };
            assert!(n > 0, "{name}, {mode:?}: recv: {}", std::io::Error::last_os_error());
            // SAFETY: the `n` bytes the recv wrote.
            received
                .extend_from_slice(unsafe { std::slice::from_raw_parts((at + PAGE_SIZE) as *const u8, n as usize) });
            PROGRESS.fetch_add(1, Ordering::Relaxed);
        }
    });
    close(fds[0]);
    close(fds[1]);
    assert!(received == sent, "{name}, {mode:?}: the stream's bytes differ from what was sent");
}

/// Ends the process, with every thread's state, if no check makes progress for [`STALL`].
fn start_watchdog() {
    std::thread::spawn(|| {
        let (mut last, mut since) = (PROGRESS.load(Ordering::Relaxed), Instant::now());
        loop {
            std::thread::sleep(Duration::from_millis(200));
            let now = PROGRESS.load(Ordering::Relaxed);
            if now != last {
                (last, since) = (now, Instant::now());
            } else if since.elapsed() > STALL {
                eprintln!(
                    "no progress for {STALL:?} after {now} steps\nthreads (name (tid): state, wait channel, system call):\n{}",
                    thread_states()
                );
                std::process::exit(101);
            }
        }
    });
}

/// Runs this binary again as a child that starts a thread, then asks for the guard.
fn a_second_thread_refuses_the_guard() {
    let mut child = std::process::Command::new(std::env::current_exe().unwrap())
        .arg("--child-with-a-thread")
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("the child");
    let started = Instant::now();
    // Bounded: the child builds one pager; killed after 60 s.
    while child.try_wait().unwrap().is_none() {
        if started.elapsed() > STALL {
            let _ = child.kill();
            panic!("the child asking for the guard with two threads did not finish in {STALL:?}");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success(), "child: {}\n{}", out.status, String::from_utf8_lossy(&out.stderr));
    println!("test a_second_thread_refuses_the_guard ... ok");
}

fn child_with_a_thread() {
    let (tx, rx) = std::sync::mpsc::channel::<()>();
    let waiter = std::thread::spawn(move || rx.recv());
    let r = Pager::builder()
        .resident_limit(LIMIT_BYTES)
        .fault_mode(FaultMode::Signal)
        .device(DeviceConfig::ram(4 * MIB))
        .syscall_guard(true)
        .build();
    match r {
        Err(e @ Error::SyscallGuardThreads { threads: 2 }) => {
            assert!(e.to_string().contains("at the start of main"), "the error says what to do: {e}");
        }
        Err(e) if e.kind() == uswap::ErrorKind::Permission => {}
        other => panic!("a pager asking for the guard with two threads: {:?}", other.map(|_| "built")),
    }
    drop(tx);
    let _ = waiter.join();
}
