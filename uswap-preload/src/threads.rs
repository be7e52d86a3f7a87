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
//! `realloc` routes by address. Stacks are the C library's own mappings and never managed,
//! but for one the program gives (`pthread_attr_setstack`, from its `malloc` or `mmap`): in
//! signal mode the new thread's first frames (the C library's start, then ours) land there
//! before it has an alternate signal stack, and a fault on a page that is out (or never
//! written) has nowhere to put its SIGBUS frame: the thread died of SIGSEGV at its first
//! instruction. So that stack is let go of (`crate::program_stacks`: a handler of the
//! program's may take a signal on it for the thread's whole life), and where that fails
//! its top is brought in and pinned until the thread has its alternate stack
//! ([`pin_program_stack`]). Not covered: a thread-local block of a
//! `dlopen`ed module allocated lazily by `__tls_get_addr` on the thread's first use (it is
//! read by that module's code, which faults like any application access).

use std::ffi::c_void;
use std::sync::atomic::{AtomicPtr, AtomicUsize, Ordering};

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
/// program's, with the pin that holds in the top of a stack the program gave it).
struct UswapThread {
    start: StartRoutine,
    arg: *mut c_void,
    stack_pin: Option<uswap::Pin>,
}

/// What a new thread's frames take on its stack before its alternate signal stack is up,
/// besides the static TLS block the C library puts at the top of a stack the program gave:
/// the C library's start and ours, with room to spare.
const START_FRAMES_BYTES: usize = 64 << 10;

/// The size of the C library's static TLS block (its thread control block and every
/// initially loaded module's thread-locals), which it puts at the top of a thread's stack;
/// 256 KiB where the C library does not say. Looked up once: it is fixed at start-up.
fn static_tls_bytes() -> usize {
    type Info = unsafe extern "C" fn(*mut usize, *mut usize);
    static BYTES: AtomicUsize = AtomicUsize::new(0);
    let known = BYTES.load(Ordering::Relaxed);
    if known != 0 {
        return known;
    }
    // SAFETY: dlsym with RTLD_DEFAULT and a NUL-terminated name (the dynamic linker's).
    let p = unsafe { libc::dlsym(libc::RTLD_DEFAULT, c"_dl_get_tls_static_info".as_ptr()) };
    let mut size = 256 << 10;
    if !p.is_null() {
        let mut align = 0usize;
        // SAFETY: glibc's `_dl_get_tls_static_info(size_t *, size_t *)`, which writes both.
        unsafe { std::mem::transmute::<*mut c_void, Info>(p)(&mut size, &mut align) };
    }
    let size = size.max(1);
    BYTES.store(size, Ordering::Relaxed);
    size
}

/// Signal mode: the top of a stack the program gave the new thread in `attr`, brought in
/// writable and pinned, if it lies in memory a signal-mode pager manages (see the module's
/// comment); the thread releases the pin once it has its alternate stack.
fn pin_program_stack(attr: *const libc::pthread_attr_t) -> Option<uswap::Pin> {
    let (top, size) = crate::program_stacks::given_stack(attr)?;
    let len = (static_tls_bytes() + START_FRAMES_BYTES).min(size);
    let mut pin = uswap::Pin::for_handoff();
    match uswap::prepare_user_access(&mut pin, top - len, len, true) {
        Some(_) => Some(pin),
        None => {
            pin.release();
            None
        }
    }
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
        let mut t = t;
        let stack_pin = t.stack_pin.take();
        drop(t);
        crate::altstack::install_on_this_thread();
        // Its SIGBUS frames go to the alternate stack now: the program's stack may go out.
        if let Some(pin) = stack_pin {
            pin.release();
        }
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
        // Signal mode: a stack the program gave is let go of (`program_stacks`); its top
        // is pinned only where that failed.
        let stack_pin = match ours || crate::program_stacks::let_go_of_thread_stack(attr) {
            true => None,
            false => pin_program_stack(attr),
        };
        let t = Box::into_raw(Box::new(UswapThread { start, arg, stack_pin }));
        // SAFETY: the caller's thread and attributes; the wrapper takes the box.
        let r = unsafe { real(thread, attr, Some(wrapper), t.cast()) };
        if r != 0 {
            // SAFETY: not handed to a thread: ours to free.
            let t = unsafe { Box::from_raw(t) };
            if let Some(pin) = t.stack_pin {
                pin.release();
            }
        }
        return r;
    }
    // SAFETY: the caller's arguments, passed on unchanged to the C library's function.
    unsafe { real(thread, attr, start, arg) }
}
