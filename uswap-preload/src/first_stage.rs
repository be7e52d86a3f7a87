//! The first stage, seen from this library: under `uswap run` the loader preloads the small
//! `libuswap_shim.so` (crate `uswap-shim`) instead of this library, and the shim loads this
//! one with `dlopen` when the process first does something a pager is for (a heap past its
//! first blocks, a mapping that would be managed, a thread, its own break). A shell, `true`,
//! `expr` or `sed` never loads it: loading this library costs an exec about 0.1-0.2 ms (its
//! relocations, the symbol look-ups of its imports, the first touches of its code), which
//! a script of short processes paid in every one.
//!
//! What the shim hands over ([`Handoff`], found by name in the global scope: the shim is
//! preloaded, this library is not): the `USWAP_` variables as the process started with them
//! (the program may have changed its environment since; [`var_os`]), the path `LD_PRELOAD`
//! named (which an exec must pass on to stay in the budget: `crate::escape`), where the
//! shim's code lies (its exported `malloc` is not the program's own allocator:
//! `crate::own_allocator`), the bytes of the C library's blocks it counted (`crate::heap`),
//! its bootstrap area (blocks served before the C library could be called, which `free`
//! must recognise: `crate::real`), and the C library's functions as `dlsym(RTLD_NEXT)` finds
//! them from the shim: from this library, not in the global scope, `RTLD_NEXT` would find
//! the shim's own stubs first (`crate::real::next_symbol`).
//!
//! The layout is the shim's (`uswap-shim/src/handoff.rs`); [`HANDOFF_VERSION`] guards it: a
//! shim and a preload library of different builds (one reinstalled during a run) are not
//! used together, and the process goes on unmanaged, said.
//! Without a shim (the library preloaded by hand) every answer here is `None` and this
//! library reads the environment itself.
//!
//! Locking: none. [`resolve`] runs once, in the constructor, before any other thread of the
//! program can call into this library (the shim loads it under its own lock).

use std::ffi::{c_char, c_void, CStr, OsString};
use std::os::unix::ffi::OsStrExt;
use std::sync::atomic::{AtomicPtr, Ordering};

/// The version of [`Handoff`]'s layout this library reads.
pub const HANDOFF_VERSION: u32 = 1;

/// What the shim hands over (its `uswap_shim_handoff()` returns it; it lives as long as the
/// process).
#[repr(C)]
pub struct Handoff {
    pub version: u32,
    /// The `USWAP_` variables of the process's start, `NAME=value`, NULL-terminated; null
    /// where they did not fit the shim's copy (the environment is read as it is then).
    pub env: *const *const c_char,
    /// The path the loader preloaded the shim under.
    pub library_path: *const c_char,
    /// The shim's load address (`dladdr`'s `dli_fbase`).
    pub library_base: usize,
    /// The usable bytes of the C library's live blocks the program got through the shim.
    pub c_heap_live_bytes: isize,
    /// The shim's bootstrap area: blocks served before the C library's malloc was found,
    /// each with its size in the 16 bytes before it (as `crate::real`'s).
    pub bootstrap_start: usize,
    pub bootstrap_bytes: usize,
    /// `dlsym(RTLD_NEXT, name)` made from the shim.
    pub next_symbol: unsafe extern "C" fn(*const c_char) -> *mut c_void,
    /// 1 where the shim loads this library from its constructor, before `main`.
    pub before_main: u32,
}

static HANDOFF: AtomicPtr<Handoff> = AtomicPtr::new(std::ptr::null_mut());

/// Whether the shim loaded this library, found by [`resolve`].
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Loader {
    /// Preloaded by hand (or by an older `uswap run`): no shim.
    ByHand,
    /// Loaded by the shim, whose hand-off is read.
    Shim,
    /// Loaded by a shim of another build: this library does nothing, and the shim, which
    /// checks [`HANDOFF_VERSION`] itself (`uswap_preload_handoff_version`), does not use it.
    OtherShim,
}

/// The hand-off's layout version this library reads, for the shim to check before it uses
/// this library.
#[no_mangle]
pub extern "C" fn uswap_preload_handoff_version() -> u32 {
    HANDOFF_VERSION
}

/// Finds the shim's hand-off, if the shim loaded this library. From the constructor, first.
pub fn resolve() -> Loader {
    type HandoffFn = unsafe extern "C" fn() -> *const Handoff;
    // SAFETY: dlsym with RTLD_DEFAULT and a NUL-terminated name: the shim's function, or null.
    let f = unsafe { libc::dlsym(libc::RTLD_DEFAULT, c"uswap_shim_handoff".as_ptr()) };
    if f.is_null() {
        return Loader::ByHand;
    }
    // SAFETY: the shim exports `uswap_shim_handoff` with this type.
    let h = unsafe { std::mem::transmute::<*mut c_void, HandoffFn>(f)() };
    // SAFETY: the shim's hand-off lives as long as the process; its version is read first.
    if h.is_null() || unsafe { (*h).version } != HANDOFF_VERSION {
        return Loader::OtherShim;
    }
    HANDOFF.store(h.cast_mut(), Ordering::Release);
    Loader::Shim
}

fn handoff() -> Option<&'static Handoff> {
    // SAFETY: set by `resolve` to the shim's hand-off, which lives as long as the process.
    unsafe { HANDOFF.load(Ordering::Acquire).as_ref() }
}

/// Whether the shim loaded this library.
pub fn loaded_by_shim() -> bool {
    handoff().is_some()
}

/// Variable `name` as the process started with it where the shim loaded this library, else
/// as the environment has it now.
pub fn var_os(name: &str) -> Option<OsString> {
    let Some(h) = handoff().filter(|h| !h.env.is_null()) else { return std::env::var_os(name) };
    // Bounded: the shim's snapshot holds at most its fixed number of entries.
    for i in 0.. {
        // SAFETY: the shim's NULL-terminated array of NUL-terminated strings.
        let entry = unsafe { *h.env.add(i) };
        if entry.is_null() {
            return None;
        }
        // SAFETY: as above.
        let entry = unsafe { CStr::from_ptr(entry) }.to_bytes();
        if let Some(value) = entry.strip_prefix(name.as_bytes()).and_then(|rest| rest.strip_prefix(b"=")) {
            return Some(std::ffi::OsStr::from_bytes(value).to_owned());
        }
    }
    None
}

/// [`var_os`] as text: `Ok(None)` if unset, an error if not UTF-8.
pub fn var(name: &str) -> Result<Option<String>, std::env::VarError> {
    match var_os(name) {
        None => Ok(None),
        Some(v) => v.into_string().map(Some).map_err(std::env::VarError::NotUnicode),
    }
}

/// Whether the shim loaded this library after the program's `main` began: a failure to set
/// up then leaves the process unmanaged (said and noted), where before `main` it ends it.
pub fn loaded_after_main() -> bool {
    handoff().is_some_and(|h| h.before_main == 0)
}

/// The path the loader preloaded the shim under.
pub fn library_path() -> Option<*const c_char> {
    handoff().map(|h| h.library_path)
}

/// The shim's load address.
pub fn library_base() -> Option<usize> {
    handoff().map(|h| h.library_base)
}

/// The C library's live blocks the shim counted before it loaded this library.
pub fn c_heap_live_bytes() -> isize {
    handoff().map_or(0, |h| h.c_heap_live_bytes)
}

/// Whether `p` is a block of the shim's bootstrap area (never freed), and its size.
pub fn bootstrap_block(p: *mut c_void) -> Option<usize> {
    let h = handoff()?;
    let a = p as usize;
    if a < h.bootstrap_start || a >= h.bootstrap_start + h.bootstrap_bytes {
        return None;
    }
    // SAFETY: a block of the shim's bootstrap area, whose 16-byte header holds its size.
    Some(unsafe { *((a - 16) as *const usize) })
}

/// `dlsym(RTLD_NEXT, name)` as the shim finds it, where the shim loaded this library.
pub fn next_symbol(name: &CStr) -> Option<*mut c_void> {
    // SAFETY: the shim's function, given a NUL-terminated name.
    handoff().map(|h| unsafe { (h.next_symbol)(name.as_ptr()) })
}
