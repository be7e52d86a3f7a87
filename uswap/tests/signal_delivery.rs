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
/// README ("The two fault modes"); this pins the documented behaviour down.
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
