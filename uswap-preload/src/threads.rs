//! Thread creation: what the C library allocates for a new thread comes from its own malloc,
//! never from the managed heap.
//!
//! Why: inside `pthread_create` the dynamic linker allocates the new thread's dynamic thread
//! vector (DTV) with `malloc`, on the creating thread; from an application thread that is the
//! managed heap, whose pages reclaim may move out. `__tls_get_addr` reads the DTV on every
//! access to a shared library's thread-locals, uswap's own among them, and in signal mode it
//! does so inside the SIGBUS handler, where a fault on a swapped-out DTV page cannot be
//! delivered (SIGBUS is blocked in its own handler, so the kernel kills the process): a
//! four-thread program died that way about once in ten runs (the core showed the second
//! SIGBUS in `__tls_get_addr` under `uswap::sync`'s lock-depth thread-local). In thread mode
//! the same fault is served, but it is a swap-in the program never asked for.
//!
//! So `pthread_create` runs the C library's with this thread marked as uswap's own code
//! (`heap::Guard`): everything it allocates comes from the C library's malloc, and a later
//! `realloc` of the DTV (a module with thread-locals loaded by `dlopen`) stays there, since
//! `realloc` routes by address. Stacks are the C library's own mappings and never managed.
//! Not covered: a thread-local block of a `dlopen`ed module allocated lazily by
//! `__tls_get_addr` on the thread's first use (it is read by that module's code, which
//! faults like any application access).

use std::ffi::c_void;
use std::sync::atomic::AtomicPtr;

use crate::own_code;

type StartRoutine = extern "C" fn(*mut c_void) -> *mut c_void;
type PthreadCreateFn = unsafe extern "C" fn(
    *mut libc::pthread_t,
    *const libc::pthread_attr_t,
    Option<StartRoutine>,
    *mut c_void,
) -> libc::c_int;

static REAL_PTHREAD_CREATE: AtomicPtr<c_void> = AtomicPtr::new(std::ptr::null_mut());

fn real_pthread_create() -> PthreadCreateFn {
    let p = crate::real::next_symbol(&REAL_PTHREAD_CREATE, c"pthread_create");
    // SAFETY: `p` is the C library's pthread_create, of this type.
    unsafe { std::mem::transmute::<*mut c_void, PthreadCreateFn>(p) }
}

/// A thread and what it runs (one uswap creates for itself, or, in signal mode, one of the
/// program's).
struct UswapThread {
    start: StartRoutine,
    arg: *mut c_void,
}

/// The start of a thread uswap creates (an engine thread): marked as uswap's own code from
/// its first instruction, before the Rust runtime's thread set-up allocates (its thread-exit
/// registration calls `calloc`). That allocation used to come from the managed heap, whose
/// pages in a re-armed fork child are write-protected until charged: the new fault-handler
/// threads faulted there themselves and waited for a handler for good.
extern "C" fn uswap_thread_start(p: *mut c_void) -> *mut c_void {
    // SAFETY: `p` is the box `pthread_create` leaked for this thread, handed over once.
    let t = unsafe { Box::from_raw(p.cast::<UswapThread>()) };
    // For the thread's whole life.
    std::mem::forget(own_code::Guard::enter());
    (t.start)(t.arg)
}

/// The start of an application thread in signal mode: its alternate signal stack first
/// (see `altstack`), then the program's start routine.
extern "C" fn app_thread_start(p: *mut c_void) -> *mut c_void {
    // SAFETY: `p` is the box `pthread_create` leaked for this thread, handed over once.
    let t = unsafe { Box::from_raw(p.cast::<UswapThread>()) };
    let (start, arg) = (t.start, t.arg);
    {
        // The box and the thread-local's exit registration are the C library's malloc's.
        let _g = own_code::Guard::enter();
        drop(t);
        crate::altstack::install_on_this_thread();
    }
    uswap::note_thread_start();
    start(arg)
}

/// `pthread_create(3)`, the C library's, with its allocations kept out of the managed heap.
///
/// # Safety
/// As `pthread_create(3)`.
#[no_mangle]
pub unsafe extern "C" fn pthread_create(
    thread: *mut libc::pthread_t,
    attr: *const libc::pthread_attr_t,
    start: Option<StartRoutine>,
    arg: *mut c_void,
) -> libc::c_int {
    let real = real_pthread_create();
    let ours = own_code::in_uswap() || uswap::is_engine_thread();
    if !ours {
        // Lazy start: a pager starts while the process has one thread (see `uswap::syscall_guard`).
        crate::start_if_waiting(crate::StartCause::Thread);
    }
    let _g = own_code::Guard::enter();
    let signal_mode = || crate::pager().is_some_and(|p| p.fault_mode() == uswap::FaultMode::Signal);
    // uswap's own threads, and the program's in signal mode, start in a wrapper of ours.
    let wrapper: Option<StartRoutine> = if ours {
        Some(uswap_thread_start)
    } else if signal_mode() {
        Some(app_thread_start)
    } else {
        None
    };
    if let (Some(wrapper), Some(start)) = (wrapper, start) {
        let t = Box::into_raw(Box::new(UswapThread { start, arg }));
        // SAFETY: the caller's thread and attributes; the wrapper takes the box.
        let r = unsafe { real(thread, attr, Some(wrapper), t.cast()) };
        if r != 0 {
            // SAFETY: not handed to a thread: ours to free.
            drop(unsafe { Box::from_raw(t) });
        }
        return r;
    }
    // SAFETY: the caller's arguments, passed on unchanged to the C library's function.
    unsafe { real(thread, attr, start, arg) }
}
