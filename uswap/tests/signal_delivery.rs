//! What a program sees of signal mode's delivery: system calls into managed memory, the SIGBUS
//! handler's stack, threads that block SIGBUS, and a SIGBUS handler replaced after the pager.
//! Every blocking step runs under a watchdog that fails the test with where it stuck.

mod common;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use common::{pager, MIB};
use uswap::{DeviceConfig, FaultMode, Pager, Region, PAGE_SIZE};

/// Fails the test (aborting the process) if `f` does not return within `secs`.
fn with_watchdog<T>(what: &'static str, secs: u64, f: impl FnOnce() -> T) -> T {
    let done = Arc::new(AtomicBool::new(false));
    let d = done.clone();
    let dog = std::thread::spawn(move || {
        for _ in 0..secs * 10 {
            if d.load(Ordering::SeqCst) {
                return;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        eprintln!("watchdog: stuck in {what} for {secs} s");
        std::process::abort();
    });
    let r = f();
    done.store(true, Ordering::SeqCst);
    dog.join().expect("watchdog thread");
    r
}

/// Byte `k` of page `i`'s pattern.
fn pattern(i: usize, k: usize) -> u8 {
    (i.wrapping_mul(31) ^ k.wrapping_mul(7) ^ (k >> 8)) as u8
}

/// Fills every page of `region` with its pattern: with a limit a quarter of the region, the
/// first pages end up on the device.
fn fill(region: &mut Region) {
    for (i, page) in region.as_mut_slice().chunks_mut(PAGE_SIZE).enumerate() {
        for (k, b) in page.iter_mut().enumerate() {
            *b = pattern(i, k);
        }
    }
}

/// The first page of a run of `n` non-resident pages in the first half of `region`.
fn swapped_out_run(region: &Region, n: usize) -> usize {
    let half = region.len() / PAGE_SIZE / 2;
    (0..half - n)
        .find(|&i| region.mapped_pages_in(i * PAGE_SIZE, n * PAGE_SIZE).unwrap() == 0)
        .expect("a quarter-size limit leaves the first half of the region swapped out")
}

fn pipe() -> (libc::c_int, libc::c_int) {
    let mut fds = [0; 2];
    // SAFETY: pipe(2) writes two descriptors into the array we own.
    assert_eq!(unsafe { libc::pipe(fds.as_mut_ptr()) }, 0, "pipe: {}", std::io::Error::last_os_error());
    (fds[0], fds[1])
}

fn close(fd: libc::c_int) {
    // SAFETY: closing a descriptor this test opened and no longer uses.
    unsafe { libc::close(fd) };
}

/// Signal mode: a page the thread has just read from user code (swapped in by that read, or
/// by the readahead of an earlier one) is resident and writable by the kernel, so `read(2)`
/// into it succeeds. It used to be mapped write-protected (a clean page keeping its slot), and
/// the kernel's write to it failed with EFAULT.
#[test]
fn signal_mode_read_syscall_into_a_page_just_read_succeeds() {
    with_watchdog("signal-mode read(2) into a page just read (ram)", 120, || {
        read_syscall_after_touch(pager(FaultMode::Signal, MIB, 16 * MIB));
    });
    with_watchdog("signal-mode read(2) into a page just read (file)", 120, || {
        let p = Pager::builder()
            .resident_limit(MIB)
            .fault_mode(FaultMode::Signal)
            .device(DeviceConfig::file(std::env::temp_dir(), 16 * MIB))
            .build()
            .expect("pager on a file device");
        read_syscall_after_touch(p);
    });
}

fn read_syscall_after_touch(p: Pager) {
    let mut region = p.map(4 * MIB as usize).unwrap();
    fill(&mut region);
    let pages = 64;
    // The pages that start out on the device; reads of the first bring some of the others
    // in as readahead.
    let out: Vec<usize> =
        (0..pages).filter(|&i| region.mapped_pages_in(i * PAGE_SIZE, PAGE_SIZE).unwrap() == 0).collect();
    assert!(out.len() >= pages / 2, "only {} of the first {pages} pages were swapped out", out.len());
    let (rd, wr) = pipe();
    let data: Vec<u8> = (0..PAGE_SIZE).map(|k| (k % 251) as u8 ^ 0x5a).collect();
    let before = p.stats().pswpin;
    let mut failed = Vec::new();
    for &i in &out {
        let addr = region.as_ptr().wrapping_add(i * PAGE_SIZE);
        // SAFETY: a byte inside the region, read from user code (may take a fault).
        let v = unsafe { std::ptr::read_volatile(addr) };
        assert_eq!(v, pattern(i, 0), "page {i} came back with its data");
        // SAFETY: write(2) of a buffer we own into our pipe.
        let n = unsafe { libc::write(wr, data.as_ptr().cast(), PAGE_SIZE) };
        assert_eq!(n, PAGE_SIZE as isize);
        // SAFETY: read(2) into one whole page of the region, which we own.
        let n = unsafe { libc::read(rd, addr.cast(), PAGE_SIZE) };
        if n != PAGE_SIZE as isize {
            failed.push(i);
            // Drain what the failed read left in the pipe.
            let mut sink = vec![0u8; PAGE_SIZE];
            // SAFETY: read(2) into a buffer we own.
            unsafe { libc::read(rd, sink.as_mut_ptr().cast(), PAGE_SIZE) };
            continue;
        }
        assert_eq!(
            &region.as_slice()[i * PAGE_SIZE..(i + 1) * PAGE_SIZE],
            &data[..],
            "page {i} holds what read(2) wrote"
        );
    }
    close(rd);
    close(wr);
    assert!(p.stats().pswpin > before, "the pages came back from the device");
    assert!(
        failed.is_empty(),
        "read(2) failed into {} of {} pages just read from user code: {failed:?}",
        failed.len(),
        out.len()
    );
    // They stay correct through another round of swapping.
    fill_rest_and_check(&mut region, &out, &data);
}

/// Pushes the region through the device again and checks that pages `out` hold `data`.
fn fill_rest_and_check(region: &mut Region, out: &[usize], data: &[u8]) {
    let len = region.len();
    for (i, page) in region.as_mut_slice()[len / 2..].chunks_mut(PAGE_SIZE).enumerate() {
        page[0] = pattern(i, 0);
    }
    for &i in out {
        assert_eq!(&region.as_slice()[i * PAGE_SIZE..(i + 1) * PAGE_SIZE], data, "page {i} after another round");
    }
}

/// Sends one datagram of `len` bytes over a fresh socket pair and receives it into `buf`;
/// returns recv's result (or -errno) and the data sent.
fn datagram_into(buf: *mut u8, len: usize) -> (isize, Vec<u8>) {
    let mut sv = [0; 2];
    // SAFETY: socketpair(2) writes two descriptors into the array we own.
    let r = unsafe { libc::socketpair(libc::AF_UNIX, libc::SOCK_DGRAM, 0, sv.as_mut_ptr()) };
    assert_eq!(r, 0, "socketpair: {}", std::io::Error::last_os_error());
    let data: Vec<u8> = (0..len).map(|k| (k * 13 % 256) as u8 ^ 0xa5).collect();
    // SAFETY: send(2) of a buffer we own.
    let n = unsafe { libc::send(sv[0], data.as_ptr().cast(), len, 0) };
    assert_eq!(n, len as isize, "send: {}", std::io::Error::last_os_error());
    // SAFETY: recv(2) into `len` bytes the caller owns.
    let n = unsafe { libc::recv(sv[1], buf.cast(), len, libc::MSG_DONTWAIT) };
    let n = if n < 0 { -(std::io::Error::last_os_error().raw_os_error().unwrap_or(0) as isize) } else { n };
    close(sv[0]);
    close(sv[1]);
    (n, data)
}

/// Thread mode (the default): `recv` on a datagram socket into a swapped-out buffer waits
/// for the pages and gets every byte.
#[test]
fn thread_mode_recv_datagram_into_swapped_out_buffer_gets_every_byte() {
    with_watchdog("thread-mode recv into a swapped-out buffer", 120, || {
        let p = pager(FaultMode::Thread, MIB, 16 * MIB);
        let mut region = p.map(4 * MIB as usize).unwrap();
        fill(&mut region);
        let len = 2 * PAGE_SIZE;
        let at = swapped_out_run(&region, 2) * PAGE_SIZE;
        let (n, data) = datagram_into(region.as_ptr().wrapping_add(at), len);
        assert_eq!(n, len as isize, "recv got the whole datagram");
        assert_eq!(&region.as_slice()[at..at + len], &data[..]);
    });
}

/// Signal mode: the same `recv` fails with EFAULT and the datagram is gone. Documented in the
/// docs/fault-modes.md; this pins the documented behaviour down.
#[test]
fn signal_mode_recv_datagram_into_swapped_out_buffer_fails_with_efault() {
    with_watchdog("signal-mode recv into a swapped-out buffer", 120, || {
        let p = pager(FaultMode::Signal, MIB, 16 * MIB);
        let mut region = p.map(4 * MIB as usize).unwrap();
        fill(&mut region);
        let len = 2 * PAGE_SIZE;
        let first = swapped_out_run(&region, 2);
        let (n, _) = datagram_into(region.as_ptr().wrapping_add(first * PAGE_SIZE), len);
        assert_eq!(n, -(libc::EFAULT as isize), "recv into a non-resident page fails with EFAULT");
        // The pages themselves are intact.
        for i in first..first + 2 {
            assert_eq!(region.as_slice()[i * PAGE_SIZE + 5], pattern(i, 5));
        }
    });
}

// ---- The SIGBUS handler's stack ----------------------------------------------------------

const CANARY: u64 = 0xC0DE_CAFE_F00D_5AFE;

/// This thread's stack: (lowest usable address, highest address).
fn stack_bounds() -> (usize, usize) {
    // SAFETY: pthread_getattr_np fills an attribute object we own and destroy; getstack reads it.
    unsafe {
        let mut attr: libc::pthread_attr_t = std::mem::zeroed();
        assert_eq!(libc::pthread_getattr_np(libc::pthread_self(), &mut attr), 0);
        let mut addr: *mut libc::c_void = std::ptr::null_mut();
        let mut size: libc::size_t = 0;
        assert_eq!(libc::pthread_attr_getstack(&attr, &mut addr, &mut size), 0);
        libc::pthread_attr_destroy(&mut attr);
        (addr as usize, addr as usize + size)
    }
}

/// Fills this thread's stack below the caller's frame with the canary; returns the painted
/// range.
#[inline(never)]
fn paint_stack() -> (usize, usize) {
    let (low, _) = stack_bounds();
    let marker = 0u64;
    // Well below this frame (and its red zone), and a page above the lowest address.
    let high = (std::ptr::addr_of!(marker) as usize - 4096) & !7;
    let low = low + PAGE_SIZE;
    let mut a = low;
    while a < high {
        // SAFETY: unused stack of this thread, below every live frame.
        unsafe { std::ptr::write_volatile(a as *mut u64, CANARY) };
        a += 8;
    }
    (low, high)
}

/// The lowest address in `range` whose canary was overwritten.
fn deepest_use((low, high): (usize, usize)) -> usize {
    let mut a = low;
    // SAFETY: reading this thread's own painted stack.
    while a < high && unsafe { std::ptr::read_volatile(a as *const u64) } == CANARY {
        a += 8;
    }
    a
}

/// Touches `region` through every fault path: first touch with fault-around under direct
/// reclaim, a sequential read (swap-in windows, asynchronous readahead), random reads and
/// writes (swap cache, readahead of random streams). Returns this frame's address, which is
/// the stack pointer the handler interrupts (give or take the frame's few words).
#[inline(never)]
fn touch_every_path(w: &[std::sync::atomic::AtomicU64], words_per_page: usize, frame: &mut usize) {
    let marker = 0u64;
    *frame = std::ptr::addr_of!(marker) as usize;
    let pages = w.len() / words_per_page;
    for i in 0..pages {
        w[i * words_per_page].store(i as u64 ^ 0x55, Ordering::Relaxed);
        w[i * words_per_page + 9].store(!(i as u64), Ordering::Relaxed);
    }
    for _ in 0..2 {
        for i in 0..pages {
            assert_eq!(w[i * words_per_page].load(Ordering::Relaxed), i as u64 ^ 0x55, "page {i}");
        }
    }
    let mut x = 0x9E37_79B9_7F4A_7C15u64;
    for n in 0..pages * 4 {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        let i = (x % pages as u64) as usize;
        if n % 3 == 0 {
            w[i * words_per_page + 1].store(x, Ordering::Relaxed);
        }
        assert_eq!(w[i * words_per_page + 9].load(Ordering::Relaxed), !(i as u64), "page {i}");
    }
}

/// The device lists the handler's stack is measured and checked on: every device, and the
/// paths only some of them take (bounce buffers and io_uring for files, compression for the
/// pool, writeback and spills for a tier list, cluster readahead).
fn stack_configs() -> Vec<(&'static str, Vec<DeviceConfig>)> {
    let tmp = std::env::temp_dir();
    vec![
        ("ram", vec![DeviceConfig::ram(32 * MIB)]),
        ("zpool-lz4", vec![DeviceConfig::zpool(32 * MIB)]),
        ("zpool-zstd", vec![DeviceConfig::zpool(32 * MIB).compressor(uswap::Compressor::Zstd { level: 3 })]),
        ("file", vec![DeviceConfig::file(&tmp, 32 * MIB)]),
        ("file-cluster", vec![DeviceConfig::file(&tmp, 32 * MIB).readahead(uswap::ReadaheadPolicy::Cluster)]),
        ("zpool+file", vec![DeviceConfig::zpool(2 * MIB).priority(1), DeviceConfig::file(&tmp, 32 * MIB)]),
    ]
}

/// Runs the workload on a fresh signal-mode pager over `devices` on the calling thread;
/// returns the pager's counters and how many bytes of stack the faults used below the
/// workload's frame.
fn run_stack_workload(devices: Vec<DeviceConfig>) -> (uswap::Stats, usize) {
    let mut b = Pager::builder().resident_limit(MIB).fault_mode(FaultMode::Signal);
    for d in devices {
        b = b.device(d);
    }
    let p = b.build().expect("pager");
    let region = p.map(8 * MIB as usize).unwrap();
    // Painted after building (which runs deeper than any fault) and right before the faults.
    let painted = paint_stack();
    let mut frame = 0;
    touch_every_path(region.as_atomic_u64s(), PAGE_SIZE / 8, &mut frame);
    let used = frame - deepest_use(painted);
    (p.stats(), used)
}

/// Measures how far below the interrupted frame the SIGBUS handler (with the kernel's signal
/// frame) reaches on the faulting thread's stack, on each device list: the service itself
/// runs on a stack of the handler's pool. Prints the figures; the bound docs/fault-modes.md documents
/// (`SIGNAL_HANDLER_STACK_BYTES` below) must cover every one of them with room to spare.
#[test]
fn signal_handler_stack_use_is_within_the_documented_bound() {
    let mut worst = 0;
    let mut configs = stack_configs();
    // The Redis device's faults read on the faulting thread (`backend/redis/direct.rs`).
    let redis = uswap::backend::redis::redis_server_available()
        .then(|| uswap::backend::redis::LocalRedis::start(1, 0, &[]).expect("local redis server starts"));
    match &redis {
        Some(r) => configs.push(("redis", vec![DeviceConfig::redis(r.seeds(0), 32 * MIB)])),
        None => common::skipped("the redis device: redis-server is not installed"),
    }
    for (name, devices) in configs {
        let used = std::thread::Builder::new()
            .stack_size(1 << 20)
            .spawn(move || {
                with_watchdog("stack measurement workload", 300, || {
                    let (stats, used) = run_stack_workload(devices);
                    assert!(stats.pswpin > 0 && stats.pswpout > 0, "{name}: the workload swapped");
                    used
                })
            })
            .unwrap()
            .join()
            .unwrap();
        eprintln!("SIGBUS handler stack use, {name}: {used} bytes below the faulting frame");
        worst = worst.max(used);
    }
    eprintln!("SIGBUS handler stack use, worst: {worst} bytes");
    assert!(
        worst <= SIGNAL_HANDLER_STACK_BYTES,
        "the handler used {worst} bytes of stack, over the documented {SIGNAL_HANDLER_STACK_BYTES}"
    );
}

/// The stack docs/fault-modes.md promises the SIGBUS handler needs on the faulting thread, at most,
/// below the frame that touches managed memory (measured 4 KiB, kernel signal frame
/// included, in debug and release builds; see docs/fault-modes.md).
const SIGNAL_HANDLER_STACK_BYTES: usize = 8 << 10;

// ---- Threads that block SIGBUS -------------------------------------------------------------

/// Blocks SIGBUS in the calling thread.
fn block_sigbus() {
    // SAFETY: building a one-signal set we own and adding it to this thread's mask.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        libc::sigaddset(&mut set, libc::SIGBUS);
        assert_eq!(libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut()), 0);
    }
}

/// Signal mode cannot serve a fault in a thread that blocks SIGBUS (the kernel kills the
/// process): building a signal-mode pager there is a typed error, and the check is there for
/// other threads. It used to build, and the first fault on a swapped-out page killed the process.
#[test]
fn signal_mode_build_in_a_thread_blocking_sigbus_is_an_error() {
    let p = pager(FaultMode::Signal, MIB, 16 * MIB);
    let r = std::thread::spawn(move || {
        block_sigbus();
        let built = Pager::builder()
            .resident_limit(MIB)
            .fault_mode(FaultMode::Signal)
            .device(DeviceConfig::ram(16 * MIB))
            .build()
            .map(|_| ());
        (built, p.check_signal_delivery())
    })
    .join()
    .unwrap();
    assert!(matches!(r.0, Err(uswap::Error::SigbusBlocked)), "build: {:?}", r.0);
    assert!(matches!(r.1, Err(uswap::Error::SigbusBlocked)), "check: {:?}", r.1);
    // Thread mode has no such limit, and an unblocked thread passes the check.
    let t = pager(FaultMode::Thread, MIB, 16 * MIB);
    let ok = std::thread::spawn(move || {
        block_sigbus();
        t.check_signal_delivery().is_ok()
    })
    .join()
    .unwrap();
    assert!(ok);
    pager(FaultMode::Signal, MIB, 16 * MIB).check_signal_delivery().expect("an unblocked thread may take faults");
}

/// Thread mode serves faults of a thread that blocks SIGBUS (bytes checked), the mode such
/// programs need.
#[test]
fn thread_mode_serves_a_thread_blocking_sigbus() {
    with_watchdog("thread mode, a SIGBUS-blocking thread touching swapped-out pages", 120, || {
        let p = pager(FaultMode::Thread, MIB, 16 * MIB);
        let region = p.map(4 * MIB as usize).unwrap();
        let p2 = p.clone();
        std::thread::spawn(move || {
            block_sigbus();
            let w = region.as_atomic_u64s();
            common::rewrite_and_check(w, 2);
            assert!(p2.stats().pswpin > 0, "the thread's pages went out and came back");
        })
        .join()
        .unwrap();
    });
}

/// Where the SIGUSR1 handler below reads (a swapped-out managed page), and what it read.
static HANDLER_READS_AT: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
static HANDLER_READ: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(usize::MAX);

extern "C" fn read_managed_page(_sig: libc::c_int) {
    let at = HANDLER_READS_AT.load(Ordering::SeqCst);
    // SAFETY: a byte of a live managed region (the test keeps it mapped while it raises).
    let b = unsafe { std::ptr::read_volatile(at as *const u8) };
    HANDLER_READ.store(b as usize, Ordering::SeqCst);
}

/// Whether `sig`'s handler blocks SIGBUS while it runs.
fn handler_blocks_sigbus(sig: libc::c_int) -> bool {
    // SAFETY: a query into a zeroed struct of ours, and a look at its mask.
    unsafe {
        let mut cur: libc::sigaction = std::mem::zeroed();
        assert_eq!(libc::sigaction(sig, std::ptr::null(), &mut cur), 0);
        libc::sigismember(&cur.sa_mask, libc::SIGBUS) == 1
    }
}

/// Signal mode through the library (no interposer): a handler installed after the pager with
/// every signal in its `sa_mask` gets SIGBUS taken out of it within the guard's period, and
/// then reads a swapped-out page while it runs (the byte checked). Blocked, that SIGBUS
/// killed the process.
#[test]
fn signal_mode_handler_with_a_full_mask_installed_after_the_pager_can_fault() {
    with_watchdog("a SIGUSR1 handler with a full sa_mask reading a swapped-out page", 120, || {
        let p = pager(FaultMode::Signal, MIB, 16 * MIB);
        let mut region = p.map(4 * MIB as usize).unwrap();
        fill(&mut region);
        // SAFETY: a handler of ours for SIGUSR1, every signal in its mask; zeroed plain data.
        unsafe {
            let mut sa: libc::sigaction = std::mem::zeroed();
            sa.sa_sigaction = read_managed_page as *const () as usize;
            libc::sigfillset(&mut sa.sa_mask);
            assert_eq!(libc::sigaction(libc::SIGUSR1, &sa, std::ptr::null_mut()), 0);
        }
        assert!(handler_blocks_sigbus(libc::SIGUSR1));
        let deadline = std::time::Instant::now() + uswap::SIGNAL_GUARD_PERIOD * 5;
        while handler_blocks_sigbus(libc::SIGUSR1) {
            assert!(std::time::Instant::now() < deadline, "SIGBUS still in the handler's mask");
            std::thread::sleep(Duration::from_millis(20));
        }
        let page = swapped_out_run(&region, 1);
        HANDLER_READS_AT.store(region.as_ptr() as usize + page * PAGE_SIZE + 7, Ordering::SeqCst);
        // SAFETY: raises SIGUSR1 in this thread; its handler is the one installed above.
        assert_eq!(unsafe { libc::raise(libc::SIGUSR1) }, 0);
        assert_eq!(HANDLER_READ.load(Ordering::SeqCst), pattern(page, 7) as usize);
        // The rest of the handler's mask is the program's.
        // SAFETY: a query into a zeroed struct of ours; then SIGUSR1 back to its default.
        unsafe {
            let mut cur: libc::sigaction = std::mem::zeroed();
            assert_eq!(libc::sigaction(libc::SIGUSR1, std::ptr::null(), &mut cur), 0);
            assert_eq!(libc::sigismember(&cur.sa_mask, libc::SIGSEGV), 1);
            libc::signal(libc::SIGUSR1, libc::SIG_DFL);
        }
    });
}

/// In a child process: a signal-mode pager, then a thread that blocks SIGBUS and lives for
/// four guard periods (it is named at the second look that sees it), beside a thread that
/// creates threads all the while (glibc blocks every signal in it for a moment each time:
/// it must not be named).
fn sigbus_blocking_thread_child() -> ! {
    let p = pager(FaultMode::Signal, MIB, 16 * MIB);
    let stop = std::sync::atomic::AtomicBool::new(false);
    std::thread::scope(|s| {
        std::thread::Builder::new()
            .name("creates-threads".into())
            .spawn_scoped(s, || {
                // Bounded by the blocking thread's life, which sets `stop`.
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    std::thread::spawn(|| {}).join().unwrap();
                }
            })
            .unwrap();
        std::thread::Builder::new()
            .name("blocks-sigbus".into())
            .spawn_scoped(s, || {
                block_sigbus();
                std::thread::sleep(uswap::SIGNAL_GUARD_PERIOD * 4);
                stop.store(true, std::sync::atomic::Ordering::Relaxed);
            })
            .unwrap();
    });
    drop(p);
    std::process::exit(0)
}

/// Signal mode through the library: a thread created after the pager that blocks SIGBUS
/// cannot be changed from outside, and a fault of its would kill the process; it is named on
/// stderr within two of the guard's periods, with what to do. A thread that blocks signals
/// only for a moment (creating threads) is not named.
#[test]
fn signal_mode_thread_blocking_sigbus_after_the_pager_is_named() {
    if std::env::var_os("USWAP_TEST_SIGBUS_THREAD_CHILD").is_some() {
        sigbus_blocking_thread_child();
    }
    let out = with_watchdog("a child with a thread blocking SIGBUS", 120, || {
        std::process::Command::new(std::env::current_exe().unwrap())
            .args(["--exact", "signal_mode_thread_blocking_sigbus_after_the_pager_is_named", "--nocapture"])
            .env("USWAP_TEST_SIGBUS_THREAD_CHILD", "1")
            .output()
            .expect("child test process")
    });
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "child: {:?}\n{stderr}", out.status);
    assert!(
        stderr.contains("(blocks-sigbus) blocks SIGBUS") && stderr.contains("thread mode"),
        "the thread is named with what to do:\n{stderr}"
    );
    assert_eq!(stderr.matches("blocks SIGBUS:").count(), 1, "named once, and only it:\n{stderr}");
}

/// The smallest stack glibc gives a thread (`PTHREAD_STACK_MIN`): enough for threads that
/// touch managed memory in signal mode, whose handler serves faults on a stack of its own
/// (`mapping::handler_stack`); only the kernel's signal frame lands on the thread's.
const MIN_THREAD_STACK_BYTES: usize = 16 << 10;

/// In a child process: signal mode, on every device list, a thread with `stack_bytes` of
/// stack faults through every path. Exits 0 when every byte checked out.
fn min_stack_child(stack_bytes: usize) -> ! {
    for (name, devices) in stack_configs() {
        let r = std::thread::Builder::new()
            .stack_size(1 << 20)
            .spawn(move || {
                let mut b = Pager::builder().resident_limit(MIB).fault_mode(FaultMode::Signal);
                for d in devices {
                    b = b.device(d);
                }
                let p = b.build().expect("pager");
                let region = p.map(8 * MIB as usize).unwrap();
                // The workload runs on a thread of its own with the small stack (building the
                // pager is not what is measured: it runs on the thread above).
                let mut frame = 0;
                let w = region.as_atomic_u64s();
                std::thread::scope(|s| {
                    std::thread::Builder::new()
                        .stack_size(stack_bytes)
                        .spawn_scoped(s, || touch_every_path(w, PAGE_SIZE / 8, &mut frame))
                        .unwrap()
                        .join()
                        .unwrap()
                });
                p.stats().pswpin
            })
            .unwrap()
            .join();
        match r {
            Ok(n) if n > 0 => eprintln!("{name}: ok with {stack_bytes} bytes of stack"),
            _ => {
                eprintln!("{name}: failed");
                std::process::exit(1)
            }
        }
    }
    std::process::exit(0)
}

/// Runs `min_stack_child(stack_bytes)` in a child process under a timeout; returns its status.
fn run_min_stack_child(stack_bytes: usize) -> std::process::ExitStatus {
    let mut child = std::process::Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "signal_mode_threads_with_the_smallest_stack_survive_every_path", "--nocapture"])
        .env("USWAP_TEST_STACK_CHILD", stack_bytes.to_string())
        .spawn()
        .expect("child test process");
    for _ in 0..3000 {
        if let Some(status) = child.try_wait().unwrap() {
            return status;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    let _ = child.kill();
    panic!("the child with {stack_bytes}-byte thread stacks did not finish in 300 s");
}

/// Signal mode serves faults on a stack of its own: a thread with the smallest stack glibc
/// gives (16 KiB) survives faults through every path on every device list (bytes checked).
/// It used to be killed by SIGSEGV inside the handler, which needed up to 38.5 KiB.
#[test]
fn signal_mode_threads_with_the_smallest_stack_survive_every_path() {
    if let Ok(bytes) = std::env::var("USWAP_TEST_STACK_CHILD") {
        min_stack_child(bytes.parse().unwrap());
    }
    let status = run_min_stack_child(MIN_THREAD_STACK_BYTES);
    assert!(status.success(), "threads with {MIN_THREAD_STACK_BYTES} bytes of stack: {status:?}");
}
