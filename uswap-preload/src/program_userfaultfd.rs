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
//! ranges let go of are kept (the first [`MAX_KEPT`], `crate::let_go`) for the report of unmanaged memory,
//! which names them. They stay ordinary memory after the program unregisters them.
//!
//! Every other `ioctl` passes straight on, uswap's own too (its calls on its userfaultfds
//! reach this symbol: one comparison each). The C library's `ioctl` is looked up in the
//! constructor ([`resolve`]), so that no call, the SIGBUS handler's (`UFFDIO_COPY`,
//! `UFFDIO_MOVE`) or a program's signal handler's, reaches `dlsym`, which allocates.

use std::ffi::{c_int, c_long, c_ulong, c_void};
use std::sync::atomic::AtomicPtr;

use crate::let_go::LetGoRanges;
use crate::own_code::in_uswap;
use crate::real::{self, errno, set_errno};

/// `_IOWR(0xAA, 0x00, struct uffdio_register)`: 32 bytes of range, mode and ioctls. The
/// kernel reads a request as 32 bits.
const UFFDIO_REGISTER: u32 = (3 << 30) | (32 << 16) | (0xAA << 8);

/// Ranges let go of for the program's userfaultfd, kept for the report: `[start, end)`
/// pairs, the first `MAX_KEPT`.
const MAX_KEPT: usize = 16;
static KEPT: LetGoRanges<MAX_KEPT> = LetGoRanges::new();

static REAL_IOCTL: AtomicPtr<c_void> = AtomicPtr::new(std::ptr::null_mut());

/// Looks the C library's `ioctl` up, from the constructor: a program's first `ioctl` may
/// be in a signal handler (`TIOCGWINSZ` on `SIGWINCH`), where `dlsym` must not run.
pub fn resolve() {
    real::next_symbol(&REAL_IOCTL, c"ioctl");
}

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
    let call = || real_ioctl(fd, request, arg) as c_long;
    register_again_if_refused(fd, request, arg, call) as c_int
}

/// `syscall(SYS_ioctl, ...)`, as [`ioctl`]; `call` makes the system call as the C
/// library's `syscall` does (-1 and errno on failure).
pub fn sys_ioctl(a: [c_long; 3], call: impl Fn() -> c_long) -> c_long {
    register_again_if_refused(a[0] as c_int, a[1] as c_ulong, a[2] as *mut c_void, call)
}

/// `call`, the program's `ioctl(fd, request, arg)`; a `UFFDIO_REGISTER` refused with
/// `EBUSY` on a userfaultfd lets go of what uswap manages in its range and is made again.
fn register_again_if_refused(fd: c_int, request: c_ulong, arg: *mut c_void, call: impl Fn() -> c_long) -> c_long {
    let r = call();
    if r == 0 || request as u32 != UFFDIO_REGISTER || errno() != libc::EBUSY || in_uswap() || uswap::is_engine_thread()
    {
        return r;
    }
    let Some((start, len)) = registered_range(fd, arg) else {
        set_errno(libc::EBUSY);
        return r;
    };
    if !let_go_of(start, len) {
        set_errno(libc::EBUSY);
        return r;
    }
    let again = call();
    if again == 0 {
        KEPT.keep(start, len);
    }
    again
}

/// The range of the `struct uffdio_register` at `arg`, if `fd` is a userfaultfd: the
/// kernel read the structure before it refused the range with `EBUSY`, so its first 16
/// bytes are the caller's, readable. (Another device may answer `EBUSY` to the same number,
/// with anything as its argument: it is not read.)
fn registered_range(fd: c_int, arg: *mut c_void) -> Option<(usize, usize)> {
    let mut link = [0u8; 64];
    let path = format!("/proc/self/fd/{fd}\0");
    // SAFETY: readlink with a NUL-terminated path and a buffer of link.len() bytes.
    let n = unsafe { libc::readlink(path.as_ptr().cast(), link.as_mut_ptr().cast(), link.len()) };
    if usize::try_from(n).ok().and_then(|n| link.get(..n)) != Some(&b"anon_inode:[userfaultfd]"[..]) {
        return None;
    }
    let range = arg as *const u64;
    // SAFETY: see above; unaligned reads, as the caller's structure may be anywhere.
    let (start, len) = unsafe { (range.read_unaligned(), range.add(1).read_unaligned()) };
    Some((start as usize, len as usize))
}

/// Lets go of the managed memory in `[start, start + len)`; whether there was a pager to
/// ask and it did.
fn let_go_of(start: usize, len: usize) -> bool {
    let Some(pager) = crate::pager() else { return false };
    let _g = crate::own_code::Guard::enter();
    // Failing, the range stays managed and the program's call fails as it did.
    pager.unmanage(start, len).is_ok()
}

/// Whether `[start, end)` overlaps a range let go of for the program's userfaultfd (for the
/// report of unmanaged memory).
pub fn overlaps(start: usize, end: usize) -> bool {
    KEPT.overlaps(start, end)
}
