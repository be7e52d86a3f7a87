//! The program's own userfaultfd: `ioctl(UFFDIO_REGISTER)` (and `syscall(SYS_ioctl)`) on
//! memory uswap manages.
//!
//! Why: a range has one userfaultfd at a time, and the kernel refuses a second
//! registration with `EBUSY`. A program that registers memory with a userfaultfd of its own
//! (a VMM restoring a snapshot page by page, CRIU's lazy pages, QEMU's postcopy migration,
//! stress-ng's userfaultfd stressor) failed wherever uswap had registered the range
//! ("ioctl UFFDIO_REGISTER failed, errno = 16"). So a registration the kernel refuses with
//! `EBUSY` lets go of the range (`Pager::unmanage`: its pages come back in place, and it
//! becomes the program's ordinary memory, outside the budget) and is made again, once. The
//! ranges let go of are kept (the first [`MAX_KEPT`]) for the report of unmanaged memory,
//! which names them.
//!
//! Every other `ioctl` passes straight on, uswap's own too (its calls on its userfaultfds
//! reach this symbol: one comparison each). The C library's `ioctl` is looked up at the
//! first call, which is the pager's `UFFDIO_API` when nothing else came before: before any
//! fault, so that the SIGBUS handler's calls (`UFFDIO_COPY`, `UFFDIO_MOVE`) find it and
//! never reach `dlsym`, which allocates.

use std::ffi::{c_int, c_long, c_ulong, c_void};
use std::sync::atomic::{AtomicPtr, AtomicUsize, Ordering};

use crate::own_code::in_uswap;
use crate::real::{self, errno, set_errno};

/// `_IOWR(0xAA, 0x00, struct uffdio_register)`: 32 bytes of range, mode and ioctls.
const UFFDIO_REGISTER: c_ulong = (3 << 30) | (32 << 16) | (0xAA << 8);

/// Ranges let go of for the program's userfaultfd, kept for the report: `[start, end)`
/// pairs, the first `MAX_KEPT`.
const MAX_KEPT: usize = 16;
static KEPT: [(AtomicUsize, AtomicUsize); MAX_KEPT] = [const { (AtomicUsize::new(0), AtomicUsize::new(0)) }; MAX_KEPT];
static NR_KEPT: AtomicUsize = AtomicUsize::new(0);

static REAL_IOCTL: AtomicPtr<c_void> = AtomicPtr::new(std::ptr::null_mut());

fn real_ioctl(fd: c_int, request: c_ulong, arg: *mut c_void) -> c_int {
    let f = real::next_symbol(&REAL_IOCTL, c"ioctl");
    // SAFETY: the C library's ioctl, with the caller's arguments (its third is variadic; on
    // the x86-64 and AArch64 Linux ABIs it travels where a fixed one does).
    unsafe {
        std::mem::transmute::<*mut c_void, extern "C" fn(c_int, c_ulong, *mut c_void) -> c_int>(f)(fd, request, arg)
    }
}

/// # Safety
/// As the C library's `ioctl`.
#[no_mangle]
pub unsafe extern "C" fn ioctl(fd: c_int, request: c_ulong, arg: *mut c_void) -> c_int {
    let r = real_ioctl(fd, request, arg);
    if r == 0 || request != UFFDIO_REGISTER || errno() != libc::EBUSY || in_uswap() || uswap::is_engine_thread() {
        return r;
    }
    if !let_go_of_registered(arg) {
        set_errno(libc::EBUSY);
        return r;
    }
    real_ioctl(fd, request, arg)
}

/// `syscall(SYS_ioctl, ...)`, as [`ioctl`] (the kernel's return convention is the C
/// library's `syscall`'s: -1 and errno).
pub fn sys_ioctl(fd: c_long, request: c_long, arg: c_long) -> c_long {
    // SAFETY: forwards the program's own call.
    unsafe { ioctl(fd as c_int, request as c_ulong, arg as *mut c_void) as c_long }
}

/// Lets go of the managed memory in the range of the `struct uffdio_register` at `arg`,
/// which the kernel read and refused with `EBUSY`; whether there was a pager to ask.
fn let_go_of_registered(arg: *mut c_void) -> bool {
    let Some(pager) = crate::pager() else { return false };
    // SAFETY: the kernel has just read the structure's range from `arg` (a refusal with
    // EBUSY comes after the copy), so its first 16 bytes are the caller's, readable.
    let (start, len) = unsafe { (*(arg as *const u64) as usize, *(arg as *const u64).add(1) as usize) };
    let _g = crate::own_code::Guard::enter();
    // Failing, the range stays managed and the program's call fails as it did.
    if pager.unmanage(start, len).is_err() {
        return false;
    }
    let k = NR_KEPT.fetch_add(1, Ordering::Relaxed);
    if let Some((s, e)) = KEPT.get(k) {
        s.store(start, Ordering::Relaxed);
        e.store(start.saturating_add(len), Ordering::Release);
    }
    true
}

/// Whether `addr` lies in a range let go of for the program's userfaultfd (for the report
/// of unmanaged memory).
pub fn contains(addr: usize) -> bool {
    let n = NR_KEPT.load(Ordering::Acquire).min(MAX_KEPT);
    KEPT[..n].iter().any(|(s, e)| (s.load(Ordering::Relaxed)..e.load(Ordering::Acquire)).contains(&addr))
}
