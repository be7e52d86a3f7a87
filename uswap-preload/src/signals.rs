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
//!   and report the program's previous one back; uswap's handler stays.
//!
//! uswap's own calls (engine threads, this library's code, the SIGBUS handler restoring the
//! default action for a fault it does not manage) go straight to the C library. Calls glibc
//! makes internally (`signal()`'s own `sigaction`, the masks around thread creation and exit)
//! are not seen here; `signal` is interposed for that reason. In thread mode nothing changes.
//! Not covered: masks passed to `sigsuspend`, `pselect`, `ppoll` and `epoll_pwait`.

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
    // SAFETY: all-zero is a valid sigaction; the fields set are plain data.
    let mut a: libc::sigaction = unsafe { std::mem::zeroed() };
    a.sa_sigaction = handler;
    a.sa_flags = libc::SA_RESTART;
    if ours_bus {
        return uswap::sigbus::replace_chained(Some(&a)).sa_sigaction;
    }
    // SAFETY: as above.
    let mut old: libc::sigaction = unsafe { std::mem::zeroed() };
    // SAFETY: our two structs.
    match unsafe { crate::core_dump::program_sigaction(sig, &a, &mut old) } {
        0 => old.sa_sigaction,
        _ => libc::SIG_ERR,
    }
}
