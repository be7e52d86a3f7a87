//! The program's signal calls, in signal mode: what it does with its masks and handlers must
//! not turn a managed page's fault into a crash.
//!
//! In signal mode a fault on a swapped-out page is a SIGBUS that uswap's handler serves. The
//! kernel cannot deliver it to a thread that blocks SIGBUS (it resets the action to the
//! default and kills the process), and a SIGBUS handler the program installs in place of
//! uswap's would receive the faults. So, while a signal-mode pager runs:
//! * `sigprocmask`, `pthread_sigmask` (SIG_BLOCK, SIG_SETMASK) and the `sa_mask` of every
//!   handler installed with `sigaction` never include SIGBUS: the rest of the mask applies
//!   as asked. A SIGBUS the hardware raises cannot be blocked anyway (the kernel forces it).
//! * `sigaction(SIGBUS, ...)` and `signal(SIGBUS, ...)` install the program's action as the
//!   one uswap passes on every SIGBUS it does not manage to (`uswap::sigbus::replace_chained`)
//!   and report the program's previous one back; uswap's handler stays. So do the older
//!   calls in which the C library calls its own `sigaction`, out of an interposer's sight
//!   (`sigset`, `sysv_signal` and `__sysv_signal`, `bsd_signal`, `ssignal`, `sigignore`,
//!   and `__sigaction` itself, a name a program may call: each is made here through
//!   [`sigaction`], with the C library's semantics), and `syscall(SYS_rt_sigaction)` (its
//!   kernel structures converted, see [`raw_sigaction`]).
//!
//! uswap's own calls (engine threads, this library's code, the SIGBUS handler restoring the
//! default action for a fault it does not manage) go straight to the C library. Calls glibc
//! makes internally (`signal()`'s own `sigaction`, the masks around thread creation and exit)
//! are not seen here; `signal` and the older calls above are interposed for that reason
//! (`siginterrupt` is not: it reads the action back and installs it again, uswap's). In
//! thread mode nothing changes.
//! The masks of `sigsuspend`, `pselect`, `ppoll`, `epoll_pwait(2)` and `io_pgetevents` are kept
//! from holding SIGBUS by the system-call guard (`uswap::syscall_guard`), as every mask the C
//! library's own calls set.

use std::ffi::c_void;
use std::sync::atomic::{AtomicBool, AtomicPtr, Ordering};

use crate::own_code;

static SIGNAL_MODE: AtomicBool = AtomicBool::new(false);

/// Turns the rules above on (called once the signal-mode pager is up).
pub fn start() {
    SIGNAL_MODE.store(true, Ordering::Release);
    // The engine's own look at the masks (for programs without this library) is not needed.
    uswap::sigbus::note_signal_calls_interposed();
}

/// Whether this call is the program's, in a signal-mode process.
fn applies() -> bool {
    SIGNAL_MODE.load(Ordering::Acquire)
        && !own_code::in_uswap()
        && !uswap::is_engine_thread()
        && !uswap::sigbus::in_handler()
        && !crate::is_unmanaged_fork_child()
}

/// `set` without SIGBUS if it has it (a copy), else `set` itself.
///
/// # Safety
/// `set` is null or points to a valid `sigset_t`.
unsafe fn without_sigbus(set: *const libc::sigset_t, copy: &mut libc::sigset_t) -> *const libc::sigset_t {
    // SAFETY: the caller's set, valid by the contract above; `copy` is ours.
    unsafe {
        if set.is_null() || libc::sigismember(set, libc::SIGBUS) != 1 {
            return set;
        }
        *copy = *set;
        libc::sigdelset(copy, libc::SIGBUS);
    }
    copy
}

type MaskFn = unsafe extern "C" fn(libc::c_int, *const libc::sigset_t, *mut libc::sigset_t) -> libc::c_int;
type SignalFn = unsafe extern "C" fn(libc::c_int, libc::sighandler_t) -> libc::sighandler_t;

static SIGPROCMASK: AtomicPtr<c_void> = AtomicPtr::new(std::ptr::null_mut());
static PTHREAD_SIGMASK: AtomicPtr<c_void> = AtomicPtr::new(std::ptr::null_mut());
static SIGNAL: AtomicPtr<c_void> = AtomicPtr::new(std::ptr::null_mut());

/// # Safety
/// As `sigprocmask(2)`.
#[no_mangle]
pub unsafe extern "C" fn sigprocmask(
    how: libc::c_int,
    set: *const libc::sigset_t,
    old: *mut libc::sigset_t,
) -> libc::c_int {
    // SAFETY: the C library's sigprocmask, found by dlsym; the caller's arguments.
    unsafe { set_mask(crate::real::next_symbol(&SIGPROCMASK, c"sigprocmask"), how, set, old) }
}

/// # Safety
/// As `pthread_sigmask(3)`.
#[no_mangle]
pub unsafe extern "C" fn pthread_sigmask(
    how: libc::c_int,
    set: *const libc::sigset_t,
    old: *mut libc::sigset_t,
) -> libc::c_int {
    // SAFETY: the C library's pthread_sigmask, found by dlsym; the caller's arguments.
    unsafe { set_mask(crate::real::next_symbol(&PTHREAD_SIGMASK, c"pthread_sigmask"), how, set, old) }
}

/// Calls `real` (the C library's `sigprocmask` or `pthread_sigmask`) with `set` less SIGBUS
/// when the rules apply and the call blocks or sets.
///
/// # Safety
/// `real` is one of those two functions; the other arguments are as the caller got them.
unsafe fn set_mask(
    real: *mut c_void,
    how: libc::c_int,
    set: *const libc::sigset_t,
    old: *mut libc::sigset_t,
) -> libc::c_int {
    // SAFETY: both functions have this type (the caller's contract).
    let real = unsafe { std::mem::transmute::<*mut c_void, MaskFn>(real) };
    // SAFETY: all-zero is a valid (empty) sigset_t.
    let mut copy: libc::sigset_t = unsafe { std::mem::zeroed() };
    // SAFETY: `set` is null or valid (the caller's contract); `copy` lives until the call.
    unsafe {
        let set = if how != libc::SIG_UNBLOCK && applies() { without_sigbus(set, &mut copy) } else { set };
        real(how, set, old)
    }
}

/// # Safety
/// As `sigaction(2)`.
#[no_mangle]
pub unsafe extern "C" fn sigaction(
    sig: libc::c_int,
    act: *const libc::sigaction,
    old: *mut libc::sigaction,
) -> libc::c_int {
    // SAFETY: the caller's contract.
    unsafe { sigaction_here(sig, act, old) }
}

/// `sigaction`'s work, called directly by the other names here (never through the exported
/// name, which an executable's own `sigaction` takes over: one that calls `__sigaction`
/// would be called back, for good).
///
/// # Safety
/// As `sigaction(2)`.
unsafe fn sigaction_here(sig: libc::c_int, act: *const libc::sigaction, old: *mut libc::sigaction) -> libc::c_int {
    let signal_mode = applies();
    if signal_mode && sig == libc::SIGBUS {
        // SAFETY: `act` is null or valid (the caller's contract).
        let new = unsafe { act.as_ref() }.map(|a| {
            let mut a = *a;
            // SAFETY: a valid sigset_t of our copy.
            unsafe { libc::sigdelset(&mut a.sa_mask, libc::SIGBUS) };
            a
        });
        let previous = uswap::sigbus::replace_chained(new.as_ref());
        if !old.is_null() {
            // SAFETY: `old` is valid for a write (the caller's contract).
            unsafe { *old = previous };
        }
        return 0;
    }
    // SAFETY: `act` is null or valid (the caller's contract); the copy lives until the call.
    unsafe {
        let copy: libc::sigaction;
        let act = match act.as_ref() {
            Some(a) if signal_mode && libc::sigismember(&a.sa_mask, libc::SIGBUS) == 1 => {
                let mut without = *a;
                libc::sigdelset(&mut without.sa_mask, libc::SIGBUS);
                copy = without;
                &copy as *const libc::sigaction
            }
            _ => act,
        };
        if crate::core_dump::intercepts(sig) {
            return crate::core_dump::program_sigaction(sig, act, old);
        }
        crate::real::sigaction(sig, act, old)
    }
}

/// # Safety
/// As `signal(2)`.
#[no_mangle]
pub unsafe extern "C" fn signal(sig: libc::c_int, handler: libc::sighandler_t) -> libc::sighandler_t {
    // SAFETY: the caller's contract.
    unsafe { signal_here(sig, handler) }
}

/// `signal`'s work, called directly by its other names (see [`sigaction_here`]).
///
/// # Safety
/// As `signal(2)`.
unsafe fn signal_here(sig: libc::c_int, handler: libc::sighandler_t) -> libc::sighandler_t {
    // SAFETY: the C library's signal, found by dlsym.
    let real = unsafe { std::mem::transmute::<*mut c_void, SignalFn>(crate::real::next_symbol(&SIGNAL, c"signal")) };
    let (ours_bus, ours_dump) = (sig == libc::SIGBUS && applies(), crate::core_dump::intercepts(sig));
    if !ours_bus && !ours_dump {
        // SAFETY: the caller's arguments, unchanged.
        return unsafe { real(sig, handler) };
    }
    if handler == libc::SIG_ERR {
        // As the C library answers it.
        // SAFETY: this thread's errno.
        unsafe { *libc::__errno_location() = libc::EINVAL };
        return libc::SIG_ERR;
    }
    // glibc's signal(): BSD semantics, a handler that stays installed and restarts calls.
    install_with_flags(sig, handler, libc::SA_RESTART)
}

/// Installs `handler` for `sig` with `flags` and an empty mask through [`sigaction`] (so
/// that SIGBUS in signal mode and the signals `core_dump` stands in for are kept as there),
/// as `signal` and the C library's older calls do with its internal `sigaction`, which no
/// interposer sees; returns the previous handler, or `SIG_ERR`.
fn install_with_flags(sig: libc::c_int, handler: libc::sighandler_t, flags: libc::c_int) -> libc::sighandler_t {
    // SAFETY: all-zero is a valid sigaction (empty mask); the fields set are plain data.
    let mut act: libc::sigaction = unsafe { std::mem::zeroed() };
    act.sa_sigaction = handler;
    act.sa_flags = flags;
    // SAFETY: as above.
    let mut old: libc::sigaction = unsafe { std::mem::zeroed() };
    // SAFETY: our two structs, valid for the call.
    match unsafe { sigaction_here(sig, &act, &mut old) } {
        0 => old.sa_sigaction,
        _ => libc::SIG_ERR,
    }
}

/// Whether `sig` is a signal the older calls may name (as the C library checks).
fn is_signal_number(sig: libc::c_int) -> bool {
    (1..=libc::SIGRTMAX()).contains(&sig)
}

/// # Safety
/// As `sysv_signal(3)`.
#[no_mangle]
pub unsafe extern "C" fn sysv_signal(sig: libc::c_int, handler: libc::sighandler_t) -> libc::sighandler_t {
    sysv_signal_here(sig, handler)
}

/// `sysv_signal`'s work, for both its names.
fn sysv_signal_here(sig: libc::c_int, handler: libc::sighandler_t) -> libc::sighandler_t {
    if handler == libc::SIG_ERR || !is_signal_number(sig) {
        // SAFETY: this thread's errno.
        unsafe { *libc::__errno_location() = libc::EINVAL };
        return libc::SIG_ERR;
    }
    // System V's semantics, as the C library's: reset to the default when it runs, not
    // blocked while it runs, no restart.
    install_with_flags(sig, handler, libc::SA_RESETHAND | libc::SA_NODEFER)
}

/// # Safety
/// As `sysv_signal(3)` (the C library's own name for it).
#[no_mangle]
pub unsafe extern "C" fn __sysv_signal(sig: libc::c_int, handler: libc::sighandler_t) -> libc::sighandler_t {
    sysv_signal_here(sig, handler)
}

/// # Safety
/// As `bsd_signal(3)`: the C library's `signal`.
#[no_mangle]
pub unsafe extern "C" fn bsd_signal(sig: libc::c_int, handler: libc::sighandler_t) -> libc::sighandler_t {
    // SAFETY: the caller's contract.
    unsafe { signal_here(sig, handler) }
}

/// # Safety
/// As `signal(2)`: the C library's `ssignal` is its `signal`.
#[no_mangle]
pub unsafe extern "C" fn ssignal(sig: libc::c_int, handler: libc::sighandler_t) -> libc::sighandler_t {
    // SAFETY: the caller's contract.
    unsafe { signal_here(sig, handler) }
}

/// # Safety
/// As `sigaction(2)`: the C library's other name for it, which a program may call.
#[no_mangle]
pub unsafe extern "C" fn __sigaction(
    sig: libc::c_int,
    act: *const libc::sigaction,
    old: *mut libc::sigaction,
) -> libc::c_int {
    // SAFETY: the caller's contract.
    unsafe { sigaction_here(sig, act, old) }
}

/// # Safety
/// As `sigignore(3)`.
#[no_mangle]
pub unsafe extern "C" fn sigignore(sig: libc::c_int) -> libc::c_int {
    match install_with_flags(sig, libc::SIG_IGN, 0) {
        libc::SIG_ERR => -1,
        _ => 0,
    }
}

/// `SIG_HOLD`: `sigset`'s disposition that blocks the signal.
const SIG_HOLD: libc::sighandler_t = 2;

/// # Safety
/// As `sigset(3)`.
#[no_mangle]
pub unsafe extern "C" fn sigset(sig: libc::c_int, disp: libc::sighandler_t) -> libc::sighandler_t {
    if !is_signal_number(sig) {
        // SAFETY: this thread's errno.
        unsafe { *libc::__errno_location() = libc::EINVAL };
        return libc::SIG_ERR;
    }
    // SAFETY: all-zero is a valid (empty) sigset_t; `set` and `was` are ours.
    let (mut set, mut was): (libc::sigset_t, libc::sigset_t) = unsafe { std::mem::zeroed() };
    // SAFETY: as above.
    unsafe { libc::sigaddset(&mut set, sig) };
    // As the C library's: hold adds the signal to the mask; a disposition installs it and
    // takes the signal out of the mask. Either way SIG_HOLD says it was blocked before.
    let (how, previous) = if disp == SIG_HOLD {
        // SAFETY: a query into our struct.
        let mut old: libc::sigaction = unsafe { std::mem::zeroed() };
        // SAFETY: as above.
        match unsafe { sigaction_here(sig, std::ptr::null(), &mut old) } {
            0 => (libc::SIG_BLOCK, old.sa_sigaction),
            _ => return libc::SIG_ERR,
        }
    } else {
        match install_with_flags(sig, disp, 0) {
            libc::SIG_ERR => return libc::SIG_ERR,
            previous => (libc::SIG_UNBLOCK, previous),
        }
    };
    // SAFETY: the C library's sigprocmask, found by dlsym, with our two sets; SIGBUS kept
    // deliverable as by the interposed one.
    if unsafe { set_mask(crate::real::next_symbol(&SIGPROCMASK, c"sigprocmask"), how, &set, &mut was) } != 0 {
        return libc::SIG_ERR;
    }
    // SAFETY: our set.
    match unsafe { libc::sigismember(&was, sig) } {
        1 => SIG_HOLD,
        _ => previous,
    }
}

/// `struct kernel_sigaction` of the `rt_sigaction` system call on x86-64 and AArch64: what a
/// program passes when it calls it itself (`syscall(SYS_rt_sigaction, ...)`).
#[repr(C)]
#[derive(Clone, Copy)]
struct KernelSigaction {
    handler: libc::sighandler_t,
    flags: libc::c_ulong,
    restorer: libc::sighandler_t,
    mask: u64,
}

/// Whether a raw `rt_sigaction` of `sig` with a mask of `mask_bytes` is one [`sigaction`]
/// must see: SIGBUS in signal mode, a signal `core_dump` stands in for.
pub fn routes_raw_sigaction(sig: libc::c_int, mask_bytes: usize) -> bool {
    mask_bytes == std::mem::size_of::<u64>()
        && ((sig == libc::SIGBUS && applies()) || crate::core_dump::intercepts(sig))
}

/// A raw `rt_sigaction(sig, act, old)` made through [`sigaction`] (see
/// [`routes_raw_sigaction`]): the kernel's structures converted to the C library's and back.
/// Returns what the C library's `syscall` would: 0, or -1 with `errno` set. Unlike the
/// kernel, a bad pointer is not `EFAULT` (it faults here), and the previous SIGBUS action
/// read back carries no restorer of its own (installed again this way it gets the C
/// library's).
///
/// # Safety
/// `act` is null or valid for a read, `old` null or valid for a write, of a
/// `struct kernel_sigaction` (the system call's contract).
pub unsafe fn raw_sigaction(sig: libc::c_int, act: usize, old: usize) -> libc::c_long {
    // SAFETY: the caller's contract (read unaligned: the kernel does not ask for alignment).
    let given = (act != 0).then(|| unsafe { (act as *const KernelSigaction).read_unaligned() });
    let new = given.map(|k| {
        // SAFETY: all-zero is a valid sigaction; the fields set are plain data.
        let mut a: libc::sigaction = unsafe { std::mem::zeroed() };
        a.sa_sigaction = k.handler;
        // The C library sets its own restorer.
        a.sa_flags = (k.flags as libc::c_int) & !SA_RESTORER;
        // SAFETY: the first word of a valid sigset_t holds signals 1-64.
        unsafe { *(&mut a.sa_mask as *mut libc::sigset_t).cast::<u64>() = k.mask };
        a
    });
    // SAFETY: all-zero is a valid sigaction.
    let mut previous: libc::sigaction = unsafe { std::mem::zeroed() };
    let new_ptr = new.as_ref().map_or(std::ptr::null(), |a| a as *const libc::sigaction);
    // SAFETY: our structs, valid for the call.
    if unsafe { sigaction_here(sig, new_ptr, &mut previous) } != 0 {
        return -1;
    }
    if old != 0 {
        let k = KernelSigaction {
            handler: previous.sa_sigaction,
            // The kernel's flags are an unsigned word: SA_RESETHAND is not sign-extended.
            flags: previous.sa_flags as u32 as libc::c_ulong,
            restorer: previous.sa_restorer.map_or(0, |f| f as libc::sighandler_t),
            // SAFETY: as above.
            mask: unsafe { *(&previous.sa_mask as *const libc::sigset_t).cast::<u64>() },
        };
        // SAFETY: the caller's contract.
        unsafe { (old as *mut KernelSigaction).write_unaligned(k) };
    }
    0
}

/// The flag that says a `kernel_sigaction` carries its own restorer.
const SA_RESTORER: libc::c_int = 0x0400_0000;
