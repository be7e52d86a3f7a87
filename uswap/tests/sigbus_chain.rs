//! Signal mode installs a process-wide SIGBUS handler. A SIGBUS at an address no pager
//! manages must reach the handler that was installed before, with its siginfo, so the
//! program's own SIGBUS behaviour is untouched. Its own test binary: the "previous" handler
//! has to be in place before the first signal-mode pager exists.

use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicI32, AtomicUsize, Ordering};

use uswap::{DeviceConfig, FaultMode, Pager, PAGE_SIZE};

static HITS: AtomicUsize = AtomicUsize::new(0);
static FAULT_HITS: AtomicUsize = AtomicUsize::new(0);
static FILE_FD: AtomicI32 = AtomicI32::new(-1);

extern "C" fn previous_handler(_sig: libc::c_int, info: *mut libc::siginfo_t, _ctx: *mut libc::c_void) {
    HITS.fetch_add(1, Ordering::SeqCst);
    // SAFETY: the kernel passes a valid siginfo to an SA_SIGINFO handler.
    if unsafe { (*info).si_code } > 0 {
        FAULT_HITS.fetch_add(1, Ordering::SeqCst);
        // A real fault past the end of a mapped file: grow the file so the retried access
        // succeeds (ftruncate is async-signal-safe).
        // SAFETY: plain system call on a descriptor the test keeps open.
        unsafe { libc::ftruncate(FILE_FD.load(Ordering::SeqCst), PAGE_SIZE as libc::off_t) };
    }
}

#[test]
fn unmanaged_sigbus_reaches_the_previous_handler() {
    // SAFETY: installing an SA_SIGINFO handler with a zeroed, then filled, sigaction.
    unsafe {
        let mut sa: libc::sigaction = std::mem::zeroed();
        sa.sa_sigaction = previous_handler as *const () as usize;
        sa.sa_flags = libc::SA_SIGINFO;
        libc::sigemptyset(&mut sa.sa_mask);
        assert_eq!(libc::sigaction(libc::SIGBUS, &sa, std::ptr::null_mut()), 0);
    }
    let pager = Pager::builder()
        .resident_limit(1 << 20)
        .fault_mode(FaultMode::Signal)
        .device(DeviceConfig::ram(16 << 20))
        .build()
        .unwrap();
    let mut region = pager.map(4 << 20).unwrap();
    for (i, b) in region.as_mut_slice().iter_mut().enumerate().step_by(PAGE_SIZE) {
        *b = (i / PAGE_SIZE) as u8;
    }
    for (i, b) in region.as_slice().iter().enumerate().step_by(PAGE_SIZE) {
        assert_eq!(*b, (i / PAGE_SIZE) as u8);
    }
    assert!(pager.stats().pswpin > 0, "managed faults were served");
    assert_eq!(HITS.load(Ordering::SeqCst), 0, "managed faults never reach the previous handler");

    // A hardware SIGBUS at an unmanaged address: reading a file mapping beyond its end.
    let path = std::env::temp_dir().join(format!("uswap-sigbus-{}", std::process::id()));
    let file = std::fs::OpenOptions::new().read(true).write(true).create(true).truncate(true).open(&path).unwrap();
    std::fs::remove_file(&path).unwrap();
    FILE_FD.store(file.as_raw_fd(), Ordering::SeqCst);
    // SAFETY: a fresh shared read-only mapping of our file; unmapped below.
    let p =
        unsafe { libc::mmap(std::ptr::null_mut(), PAGE_SIZE, libc::PROT_READ, libc::MAP_SHARED, file.as_raw_fd(), 0) };
    assert_ne!(p, libc::MAP_FAILED);
    // SAFETY: `p` is a valid mapping; the read faults, the previous handler grows the file
    // and the retried read sees the new (zero) byte.
    let v = unsafe { std::ptr::read_volatile(p as *const u8) };
    assert_eq!(v, 0);
    assert_eq!(FAULT_HITS.load(Ordering::SeqCst), 1, "the fault was chained with its siginfo");
    // SAFETY: unmapping the mapping made above.
    unsafe { libc::munmap(p, PAGE_SIZE) };

    // A SIGBUS sent by a process (si_code <= 0) is never ours either.
    // SAFETY: raise(3) delivers the signal to this thread, handled by the handlers above.
    unsafe { libc::raise(libc::SIGBUS) };
    assert_eq!(HITS.load(Ordering::SeqCst), 2);
    assert_eq!(FAULT_HITS.load(Ordering::SeqCst), 1);
}
