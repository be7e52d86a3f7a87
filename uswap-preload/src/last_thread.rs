//! The program's last thread ending with `pthread_exit`: the process ends, as without uswap.
//!
//! Why: glibc ends a process when the last of its threads leaves through `pthread_exit` (the
//! main thread's included): it counts the threads it started, and the last to leave calls
//! `exit(0)`. uswap's engine threads are threads glibc started, so a program whose main
//! thread called `pthread_exit` and whose workers then finished was left with only uswap's
//! threads, and never ended (a C program's `main` that ends with `pthread_exit(NULL)` once
//! its workers are started hung under `uswap run` after its last line of output).
//!
//! So `pthread_exit` is interposed to note that the main thread left, and from then on the
//! publisher thread (`report`) looks, at each of its ticks, whether any thread is left but
//! uswap's own ([`uswap::live_engine_threads`]); when none is, it becomes a thread of the
//! program's (its calls prepared, its allocations the program's, the main thread's signal
//! mask) and calls `exit(0)`, as glibc's last thread would have (the `atexit` handlers and
//! the flush of the program's streams run). Not seen, and such a process still waits for
//! uswap's threads (docs/cli.md): a main thread that left another way (the raw `exit`
//! system call, as under seccomp's strict mode; `pthread_cancel`; C11's `thrd_exit`), and
//! a process with io_uring workers of the kernel's (threads of the process, not told apart
//! from the program's).
//!
//! Locking: one flag, set by the main thread as it leaves, read by the publisher; the thread
//! count is the kernel's (`/proc/self/stat`, once the main thread is a zombie there), less
//! the main thread, compared with the engine's count of its live threads, which is never
//! above the kernel's (see `live_engine_threads`): a thread that is starting or ending
//! makes the program look alive, never ended.

use std::ffi::c_void;
use std::sync::atomic::{AtomicBool, AtomicPtr, AtomicU64, Ordering};

static MAIN_LEFT: AtomicBool = AtomicBool::new(false);
/// The main thread's signal mask as it left (the kernel's 64 signals), for the thread that
/// calls `exit` in its place.
static MAIN_MASK: AtomicU64 = AtomicU64::new(0);
static REAL_PTHREAD_EXIT: AtomicPtr<c_void> = AtomicPtr::new(std::ptr::null_mut());

/// Looks the C library's `pthread_exit` up, from the constructor (not in a thread that is
/// leaving, where `dlsym` would allocate).
pub fn resolve() {
    crate::real::next_symbol(&REAL_PTHREAD_EXIT, c"pthread_exit");
}

/// `pthread_exit`, interposed: notes the main thread leaving, then leaves as the C library
/// does. The C library's unwinds the thread's stack (a forced unwind) through this frame:
/// "C-unwind", and no value with a destructor lives across the call.
#[no_mangle]
pub extern "C-unwind" fn pthread_exit(retval: *mut c_void) -> ! {
    // SAFETY: gettid and getpid take no arguments and cannot fail.
    if unsafe { libc::gettid() == libc::getpid() } {
        MAIN_MASK.store(this_thread_mask(), Ordering::Relaxed);
        MAIN_LEFT.store(true, Ordering::Release);
    }
    let f = crate::real::next_symbol(&REAL_PTHREAD_EXIT, c"pthread_exit");
    // SAFETY: `f` is the C library's `pthread_exit`, which takes one pointer and does not return.
    unsafe {
        let f: extern "C-unwind" fn(*mut c_void) -> ! = std::mem::transmute(f);
        f(retval)
    }
}

/// The calling thread's signal mask, as the kernel's 64-bit set.
fn this_thread_mask() -> u64 {
    let mut old = 0u64;
    // SAFETY: rt_sigprocmask with no new set only writes the current one (8 bytes) into `old`.
    unsafe { libc::syscall(libc::SYS_rt_sigprocmask, libc::SIG_BLOCK, std::ptr::null::<u64>(), &mut old, 8) };
    old
}

/// From the publisher thread, at each tick: once the main thread has left, ends the process
/// with `exit(0)` if no thread of the program's is left.
pub fn end_if_no_thread_left() {
    if !MAIN_LEFT.load(Ordering::Acquire) {
        return;
    }
    // The main thread, once it has left, stays as a zombie that the kernel still counts
    // until the whole process ends; it has left for good once its state says so (its
    // cleanup handlers and destructors have run).
    let Some((main_state, nr_threads)) = threads_of_this_process() else { return };
    if main_state != 'Z' {
        return;
    }
    if nr_threads.saturating_sub(1) > uswap::live_engine_threads() {
        return;
    }
    uswap::become_program_thread();
    crate::own_code::leave_for_good();
    // SIGBUS stays deliverable: signal mode's faults are served by its handler.
    let mask = MAIN_MASK.load(Ordering::Relaxed) & !(1u64 << (libc::SIGBUS - 1));
    // SAFETY: rt_sigprocmask sets this thread's mask from `mask`, 8 bytes of ours; then exit
    // runs the program's atexit handlers and ends the process, as the C library's last
    // thread would have; no thread of the program's is left to race it.
    unsafe {
        libc::syscall(libc::SYS_rt_sigprocmask, libc::SIG_SETMASK, &mask, std::ptr::null_mut::<u64>(), 8);
        libc::exit(0)
    }
}

/// The main thread's state and the process's threads, the main thread's included, from
/// `/proc/self/stat` (its 3rd and 20th fields).
fn threads_of_this_process() -> Option<(char, usize)> {
    let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
    // After the command's name, which may hold spaces and parentheses.
    let mut fields = stat[stat.rfind(')')? + 1..].split_whitespace();
    let state = fields.next()?.chars().next()?;
    Some((state, fields.nth(16)?.parse().ok()?))
}
