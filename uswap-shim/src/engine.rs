//! Loading the engine: `dlopen` of `libuswap_preload.so` from this library's directory,
//! then every entry point's slot set to the preload library's function of the same name.
//!
//! The preload library is loaded `RTLD_LOCAL`: its names stay out of the global scope, where
//! this library's entry points are the program's; its own calls to them (`malloc` from its
//! C code) come back here and jump to it. Its constructor runs inside the `dlopen` and reads
//! the hand-off (`handoff`).
//!
//! Locking: the load is made once, by the first thread that asks ([`STATE`] from `IDLE` to
//! `LOADING`); the calls that thread makes meanwhile (the loader's and the engine's
//! constructor's allocations) are served from the C library, and another thread that asks
//! waits for the load, bounded. Nothing here allocates but `dlopen` itself.

use std::cell::UnsafeCell;
use std::ffi::{c_char, c_void, CStr};
use std::sync::atomic::{AtomicI32, AtomicU32, AtomicUsize, Ordering};

use crate::c_library::{c_library_fn, errno, set_errno};
use crate::handoff::HANDOFF_VERSION;
use crate::names::NAMES;

const IDLE: u32 = 0;
const LOADING: u32 = 1;
const LOADED: u32 = 2;
/// Not to be loaded: it failed, `USWAP_DISABLE`, or a seccomp filter of the program's.
const NEVER: u32 = 3;

static STATE: AtomicU32 = AtomicU32::new(IDLE);
static LOADER_TID: AtomicI32 = AtomicI32::new(0);
/// Set by the constructor once the engine's path is known.
static READY: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// The preload library's file name, beside this one.
const ENGINE_FILE: &[u8] = b"libuswap_preload.so";
const PATH_BYTES: usize = 4096;
struct PathBuf(UnsafeCell<[u8; PATH_BYTES]>);
// SAFETY: written by the constructor alone, before the program's threads; read after.
unsafe impl Sync for PathBuf {}
static ENGINE_PATH: PathBuf = PathBuf(UnsafeCell::new([0; PATH_BYTES]));

/// Waits for another thread's load at most this many yields (a load takes milliseconds).
const MAX_WAIT_YIELDS: u32 = 1_000_000;

// The slots of the entry points (`build.rs`): each the address its entry point jumps to.
extern "C" {
    static uswap_shim_slots: [AtomicUsize; NAMES.len()];
}

pub fn slot(i: usize) -> &'static AtomicUsize {
    // SAFETY: the generated table of `NAMES.len()` slots, written only atomically.
    unsafe { &uswap_shim_slots[i] }
}

/// From the constructor: the engine lies beside this library (`own`: the path the loader
/// preloaded it under).
pub fn find_path(own: *const c_char) {
    if !own.is_null() {
        // SAFETY: the loader's NUL-terminated name of this library.
        let own = unsafe { CStr::from_ptr(own) }.to_bytes();
        let dir = own.iter().rposition(|&b| b == b'/').map_or(&b""[..], |i| &own[..=i]);
        if dir.len() + ENGINE_FILE.len() < PATH_BYTES {
            // SAFETY: the constructor writes the path before any thread reads it.
            let path = unsafe { &mut *ENGINE_PATH.0.get() };
            path[..dir.len()].copy_from_slice(dir);
            path[dir.len()..dir.len() + ENGINE_FILE.len()].copy_from_slice(ENGINE_FILE);
        }
    }
    // Last: a load before this finds no path.
    READY.store(true, Ordering::Release);
}

/// `USWAP_DISABLE`: the engine is never loaded.
pub fn stand_aside() {
    STATE.store(NEVER, Ordering::Release);
}

/// A seccomp filter of the program's is in place: the engine is never loaded from now on (a
/// load already made stays; its own module for such filters takes it from there).
pub fn never_after_filter() {
    let _ = STATE.compare_exchange(IDLE, NEVER, Ordering::AcqRel, Ordering::Acquire);
}

/// Loads the engine from this library's constructor, before `main`.
pub fn load_before_main(cause: &str) {
    crate::handoff::set_before_main(true);
    load(cause);
    crate::handoff::set_before_main(false);
}

/// Whether no load began (or none ever will): a slot set to the C library's function then
/// stays so.
pub fn never_began() -> bool {
    matches!(STATE.load(Ordering::Acquire), IDLE | NEVER)
}

pub fn loaded() -> bool {
    STATE.load(Ordering::Acquire) == LOADED
}

/// Whether this thread is loading the engine now (its calls meanwhile go to the C library).
pub fn loading_here() -> bool {
    STATE.load(Ordering::Acquire) == LOADING && LOADER_TID.load(Ordering::Acquire) == tid()
}

fn tid() -> i32 {
    // SAFETY: gettid has no failure mode.
    unsafe { libc::gettid() }
}

/// Loads the engine for `cause` (said if the load fails), once; whether it is loaded.
pub fn load(cause: &str) -> bool {
    if !READY.load(Ordering::Acquire) {
        // Before the constructor (the loader allocating): nothing to load yet.
        return false;
    }
    match STATE.compare_exchange(IDLE, LOADING, Ordering::AcqRel, Ordering::Acquire) {
        Ok(_) => {}
        Err(LOADED) => return true,
        Err(LOADING) if LOADER_TID.load(Ordering::Acquire) != tid() => return wait_for_load(),
        Err(_) => return false,
    }
    LOADER_TID.store(tid(), Ordering::Release);
    let errno = errno();
    // SAFETY: the path written by the constructor, NUL-terminated (the buffer's zeroes).
    let path = unsafe { &*ENGINE_PATH.0.get() };
    let handle = if path[0] == 0 {
        std::ptr::null_mut()
    } else {
        // SAFETY: dlopen of a NUL-terminated path; the library's constructor runs inside.
        unsafe { libc::dlopen(path.as_ptr().cast(), libc::RTLD_NOW | libc::RTLD_LOCAL) }
    };
    if handle.is_null() || !same_build(handle) {
        say_load_failed(path, cause, handle.is_null());
        STATE.store(NEVER, Ordering::Release);
        set_errno(errno);
        return false;
    }
    for (i, name) in NAMES.iter().enumerate() {
        // SAFETY: dlsym on the handle just opened, a NUL-terminated name.
        let f = unsafe { libc::dlsym(handle, name.as_ptr()) };
        let f = if f.is_null() { c_library_fn(i) } else { f as usize };
        slot(i).store(f, Ordering::Release);
    }
    STATE.store(LOADED, Ordering::Release);
    // The preload library's constructor's work, left for after the load (`dlopen` holds the
    // loader's lock, which a pager's threads take; and the slots lead there only now).
    // SAFETY: dlsym on the open handle, a NUL-terminated name.
    let after = unsafe { libc::dlsym(handle, c"uswap_preload_after_load".as_ptr()) };
    // SAFETY: the preload library exports it with this type (`same_build` checked).
    let served =
        !after.is_null() && unsafe { std::mem::transmute::<*mut c_void, extern "C" fn() -> i32>(after)() } != 0;
    if !served {
        // It could not set itself up (said and noted there): the calls go to the C library.
        for i in 0..NAMES.len() {
            slot(i).store(c_library_fn(i), Ordering::Release);
        }
        STATE.store(NEVER, Ordering::Release);
    }
    set_errno(errno);
    served
}

/// Whether the preload library at `handle` reads this first stage's hand-off (not one of
/// another build: a reinstall during a run).
fn same_build(handle: *mut c_void) -> bool {
    // SAFETY: dlsym on an open handle, a NUL-terminated name.
    let f = unsafe { libc::dlsym(handle, c"uswap_preload_handoff_version".as_ptr()) };
    // SAFETY: the preload library exports it with this type.
    !f.is_null() && unsafe { std::mem::transmute::<*mut c_void, extern "C" fn() -> u32>(f)() } == HANDOFF_VERSION
}

fn wait_for_load() -> bool {
    for _ in 0..MAX_WAIT_YIELDS {
        match STATE.load(Ordering::Acquire) {
            LOADING => {
                // SAFETY: sched_yield has no memory effects.
                unsafe { libc::sched_yield() };
            }
            state => return state == LOADED,
        }
    }
    false
}

/// Says on stderr that the engine could not be loaded, and leaves a refusal in the run's
/// directory (the run fails): the process goes on, unmanaged, every byte its own.
fn say_load_failed(path: &[u8], cause: &str, not_loaded: bool) {
    // SAFETY: dlerror returns the loader's message for this thread, or null.
    let why = if not_loaded { unsafe { libc::dlerror() } } else { std::ptr::null_mut() };
    let why = match (why.is_null(), not_loaded) {
        // SAFETY: a NUL-terminated message of the loader's.
        (false, _) => unsafe { CStr::from_ptr(why) }.to_bytes(),
        (true, true) => &b"(no message)"[..],
        (true, false) => &b"it is of another build than libuswap_shim.so beside it: install both again"[..],
    };
    let end = path.iter().position(|&b| b == 0).unwrap_or(path.len());
    let mut msg = [0u8; 1024];
    let mut len = 0;
    for part in [
        &b"uswap: cannot load "[..],
        &path[..end],
        b" (",
        cause.as_bytes(),
        b" needs it): ",
        why,
        b"; this process runs unmanaged, every byte kept\n",
    ] {
        let n = part.len().min(msg.len() - len);
        msg[len..len + n].copy_from_slice(&part[..n]);
        len += n;
    }
    // SAFETY: write(2) of a buffer valid for `len` bytes.
    unsafe { libc::write(2, msg.as_ptr().cast(), len) };
    uswap_escape::note_refusal(&msg[..len]);
}
