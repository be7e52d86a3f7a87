//! What the first stage keeps of the process's start and hands to the preload library when
//! it loads it ([`uswap_shim_handoff`]; the preload library's `first_stage` reads it): the
//! `USWAP_` variables as the process started with them (a program may clear or rewrite its
//! environment before it needs a pager: a daemon, `setproctitle` over the environment's
//! strings), the thresholds the watchers load the engine at, and the counts they kept.
//!
//! State: written by the constructor before the program runs, read after; the counts are
//! atomics.

use std::cell::UnsafeCell;
use std::ffi::{c_char, c_int, c_void, CStr};
use std::sync::atomic::{AtomicIsize, AtomicUsize, Ordering};

use uswap_escape::objects::object_of;

/// The layout the preload library's `first_stage::Handoff` reads; the version guards it.
#[repr(C)]
pub struct Handoff {
    version: u32,
    env: *const *const c_char,
    library_path: *const c_char,
    library_base: usize,
    c_heap_live_bytes: isize,
    bootstrap_start: usize,
    bootstrap_bytes: usize,
    next_symbol: unsafe extern "C" fn(*const c_char) -> *mut c_void,
    before_main: u32,
}

pub const HANDOFF_VERSION: u32 = 1;

/// Room for the `USWAP_` variables (uswap run sets about ten, each well under 200 bytes).
const ENV_BYTES: usize = 8 << 10;
const ENV_ENTRIES: usize = 64;

/// A static written by the constructor alone, before the program's threads, then read.
struct StartOnly<T>(UnsafeCell<T>);
// SAFETY: written only by the constructor (single-threaded, before the program runs) and by
// `uswap_shim_handoff` under the engine's load lock; read after.
unsafe impl<T> Sync for StartOnly<T> {}

/// Whether the `USWAP_` variables fit [`ENV_TEXT`] (if not, the engine reads the environment).
static ENV_FITS: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(true);
static ENV_TEXT: StartOnly<[u8; ENV_BYTES]> = StartOnly(UnsafeCell::new([0; ENV_BYTES]));
static ENV_LIST: StartOnly<[*const c_char; ENV_ENTRIES + 1]> =
    StartOnly(UnsafeCell::new([std::ptr::null(); ENV_ENTRIES + 1]));
static HANDOFF: StartOnly<Handoff> = StartOnly(UnsafeCell::new(Handoff {
    version: HANDOFF_VERSION,
    env: std::ptr::null(),
    library_path: std::ptr::null(),
    library_base: 0,
    c_heap_live_bytes: 0,
    bootstrap_start: 0,
    bootstrap_bytes: 0,
    next_symbol: next_symbol_from_here,
    before_main: 0,
}));

extern "C" {
    static __environ: *const *const c_char;
}

/// Copies the `USWAP_` variables of the environment; `false` if they did not all fit (the
/// engine is then loaded at once, and reads the environment itself).
pub fn snapshot_environment() -> bool {
    // SAFETY: the constructor runs before the program's threads; the C library's `environ`
    // is a NULL-terminated array of NUL-terminated strings.
    let (text, list, mut env) = unsafe { (&mut *ENV_TEXT.0.get(), &mut *ENV_LIST.0.get(), __environ) };
    let (mut used, mut n) = (0, 0);
    // Bounded: the environment's entries, up to its NULL.
    while !env.is_null() {
        // SAFETY: as above.
        let s = unsafe { *env };
        if s.is_null() {
            break;
        }
        // SAFETY: a NUL-terminated string of the environment's.
        let entry = unsafe { CStr::from_ptr(s) }.to_bytes_with_nul();
        if entry.starts_with(b"USWAP_") {
            if n == ENV_ENTRIES || used + entry.len() > ENV_BYTES {
                ENV_FITS.store(false, Ordering::Relaxed);
                return false;
            }
            text[used..used + entry.len()].copy_from_slice(entry);
            list[n] = text[used..].as_ptr().cast();
            (used, n) = (used + entry.len(), n + 1);
        }
        // SAFETY: the next entry of the NULL-terminated array.
        env = unsafe { env.add(1) };
    }
    true
}

/// Variable `name`'s value as the process started with it (without its NUL).
pub fn var(name: &[u8]) -> Option<&'static [u8]> {
    // SAFETY: written by the constructor only, before this is read.
    let list = unsafe { &*ENV_LIST.0.get() };
    list.iter().take_while(|p| !p.is_null()).find_map(|&p| {
        // SAFETY: an entry of the snapshot, NUL-terminated, static.
        let entry = unsafe { CStr::from_ptr(p) }.to_bytes();
        entry.strip_prefix(name).and_then(|rest| rest.strip_prefix(b"="))
    })
}

/// A size in bytes as `uswap run` writes it (decimal digits); `None` otherwise (by hand,
/// `64MiB`: the engine reads those, and the thresholds here fall back to small ones).
fn bytes_var(name: &[u8]) -> Option<usize> {
    let v = var(name)?;
    if v.is_empty() || v.len() > 19 || !v.iter().all(u8::is_ascii_digit) {
        return None;
    }
    Some(v.iter().fold(0usize, |n, d| n * 10 + usize::from(d - b'0')))
}

/// Where the engine's lazy start acts (`uswap-preload`'s `c_library_heap` and `config`): the C
/// library's first 2 MiB of blocks (a quarter of `USWAP_START_AFTER` where that is less),
/// `USWAP_START_AFTER` itself (a sixteenth of the limit by default), mappings from
/// `USWAP_MIN_SIZE`. A value that cannot be read here gives the smallest of each.
const C_LIBRARY_HEAP_BYTES: usize = 2 << 20;
const FALLBACK_START_AFTER_BYTES: usize = 1 << 20;
const FALLBACK_MIN_SIZE_BYTES: usize = 4 << 10;
// Until the constructor reads them, nothing loads the engine (the loader allocating).
static HEAP_THRESHOLD_BYTES: AtomicUsize = AtomicUsize::new(usize::MAX);
static START_AFTER_BYTES: AtomicUsize = AtomicUsize::new(usize::MAX);
static MIN_SIZE_BYTES: AtomicUsize = AtomicUsize::new(usize::MAX);

pub fn read_thresholds() {
    let start_after = match (var(b"USWAP_START_AFTER"), bytes_var(b"USWAP_START_AFTER")) {
        (None, _) => bytes_var(b"USWAP_LIMIT").map_or(FALLBACK_START_AFTER_BYTES, |limit| limit / 16),
        (Some(_), Some(bytes)) => bytes,
        (Some(_), None) => FALLBACK_START_AFTER_BYTES,
    };
    START_AFTER_BYTES.store(start_after, Ordering::Relaxed);
    HEAP_THRESHOLD_BYTES.store(C_LIBRARY_HEAP_BYTES.min(start_after / 4), Ordering::Relaxed);
    MIN_SIZE_BYTES.store(bytes_var(b"USWAP_MIN_SIZE").unwrap_or(FALLBACK_MIN_SIZE_BYTES), Ordering::Relaxed);
}

/// The C library's live blocks at which the engine is loaded.
pub fn heap_threshold_bytes() -> usize {
    HEAP_THRESHOLD_BYTES.load(Ordering::Relaxed)
}

/// What the process holds at which the engine's pager would start.
pub fn start_after_bytes() -> usize {
    START_AFTER_BYTES.load(Ordering::Relaxed)
}

/// The smallest anonymous mapping the engine manages.
pub fn min_size_bytes() -> usize {
    MIN_SIZE_BYTES.load(Ordering::Relaxed)
}

/// Why the engine must be loaded before the program runs, if it must: what the engine does
/// then that cannot wait (the pager before `main`, the sanitizer's runtime out of
/// `LD_PRELOAD`), or a process where the engine stands aside and names it.
pub fn load_at_start(env_fits: bool) -> Option<&'static str> {
    if !env_fits {
        return Some("its environment's USWAP_ variables");
    }
    if var(b"USWAP_START_AFTER") == Some(b"0") {
        return Some("USWAP_START_AFTER=0");
    }
    if var(b"USWAP_SANITIZER_PRELOAD").is_some() {
        return Some("a sanitizer's runtime");
    }
    if var(b"USWAP_ADDRESS_SPACE_LIMIT").is_some() || var(b"USWAP_DATA_LIMIT").is_some() {
        // A limit a managed parent set, raised by its reservations: the program must see the
        // one it set (`getrlimit`), and the kernel's is refitted (the preload's `rlimit`).
        return Some("a limit its parent set inside the run");
    }
    let (no_library, valgrind) = program_and_tool();
    if no_library || valgrind || !malloc_is_ours() {
        return Some("a process the engine stands aside in");
    }
    None
}

/// Whether the program's executable needs no shared library (no `DT_NEEDED`), and whether
/// valgrind's core is loaded: the preload library's `program_system_calls` and
/// `own_allocator` judge both again, precisely, once loaded.
fn program_and_tool() -> (bool, bool) {
    struct Found {
        first: bool,
        no_library: bool,
        valgrind: bool,
    }
    extern "C" fn each(info: *mut libc::dl_phdr_info, _size: usize, data: *mut c_void) -> c_int {
        // SAFETY: dl_iterate_phdr passes a valid info; `data` is the `Found` below.
        let (info, found) = unsafe { (&*info, &mut *(data as *mut Found)) };
        if std::mem::take(&mut found.first) {
            found.no_library = !has_needed(info);
        }
        if !info.dlpi_name.is_null() {
            // SAFETY: the loader's NUL-terminated name of the object.
            let name = unsafe { CStr::from_ptr(info.dlpi_name) }.to_bytes();
            let file = name.rsplit(|&b| b == b'/').next().unwrap_or(name);
            found.valgrind |= file.starts_with(b"vgpreload_core-");
        }
        0
    }
    let mut found = Found { first: true, no_library: false, valgrind: false };
    // SAFETY: the callback reads the objects it is given and writes `found`.
    unsafe { libc::dl_iterate_phdr(Some(each), (&mut found as *mut Found).cast()) };
    (found.no_library, found.valgrind)
}

/// Whether the object `info` has a dynamic section with a `DT_NEEDED` entry (`true` where
/// that cannot be told).
fn has_needed(info: &libc::dl_phdr_info) -> bool {
    const MAX_ENTRIES: usize = 4096;
    // SAFETY: the loader's program headers of the object, `dlpi_phnum` of them.
    let phdrs = unsafe { std::slice::from_raw_parts(info.dlpi_phdr, usize::from(info.dlpi_phnum)) };
    let Some(dynamic) = phdrs.iter().find(|p| p.p_type == libc::PT_DYNAMIC) else { return true };
    let at = (info.dlpi_addr as usize + dynamic.p_vaddr as usize) as *const [i64; 2];
    for i in 0..MAX_ENTRIES {
        // SAFETY: the object's dynamic section, mapped, ended by DT_NULL (bounded anyway).
        let [tag, _] = unsafe { *at.add(i) };
        match tag {
            0 => return false,
            1 => return true,
            _ => {}
        }
    }
    true
}

/// Whether the first `malloc` of the global scope is this library's (not the program's own,
/// nor an allocator preloaded before uswap's).
fn malloc_is_ours() -> bool {
    // SAFETY: dlsym with RTLD_DEFAULT and a NUL-terminated name.
    let first = unsafe { libc::dlsym(libc::RTLD_DEFAULT, c"malloc".as_ptr()) };
    if first.is_null() {
        return true;
    }
    object_of(first as usize).is_some_and(|o| o.map_start == OWN_BASE.load(Ordering::Acquire))
}

/// The path the loader preloaded this library under, and its load address (from the
/// constructor, before anything reads them).
static OWN_PATH: AtomicUsize = AtomicUsize::new(0);
static OWN_BASE: AtomicUsize = AtomicUsize::new(0);

pub fn note_own(path: *const c_char, base: usize) {
    OWN_PATH.store(path as usize, Ordering::Release);
    OWN_BASE.store(base, Ordering::Release);
}

/// Set while this library's constructor loads the engine (before `main`).
static BEFORE_MAIN: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

pub fn set_before_main(before: bool) {
    BEFORE_MAIN.store(before, Ordering::Release);
}

/// The usable bytes of the C library's live blocks the program got (counted by `watch`;
/// a block from before the count began, freed, makes it low, read as at least 0).
static C_HEAP_LIVE_BYTES: AtomicIsize = AtomicIsize::new(0);

pub fn c_heap_live_bytes() -> isize {
    C_HEAP_LIVE_BYTES.load(Ordering::Relaxed)
}

pub fn add_c_heap_bytes(bytes: isize) {
    let _ = uswap_escape::c_block::add_live_bytes(&C_HEAP_LIVE_BYTES, bytes);
}

/// `dlsym(RTLD_NEXT, name)` from this library, for the preload library (see its
/// `first_stage`).
unsafe extern "C" fn next_symbol_from_here(name: *const c_char) -> *mut c_void {
    // SAFETY: the caller's NUL-terminated name.
    unsafe { libc::dlsym(libc::RTLD_NEXT, name) }
}

/// The hand-off, for the preload library's constructor (it runs inside the engine's load,
/// under its lock): the counts as they are now.
#[no_mangle]
pub extern "C" fn uswap_shim_handoff() -> *const Handoff {
    let h = HANDOFF.0.get();
    let (bootstrap_start, bootstrap_bytes) = crate::alloc::bootstrap_area();
    // SAFETY: written under the engine's load lock, read by the engine's constructor on the
    // same thread.
    unsafe {
        (*h).env = if ENV_FITS.load(Ordering::Relaxed) { (*ENV_LIST.0.get()).as_ptr() } else { std::ptr::null() };
        (*h).library_path = OWN_PATH.load(Ordering::Acquire) as *const c_char;
        (*h).library_base = OWN_BASE.load(Ordering::Acquire);
        (*h).c_heap_live_bytes = c_heap_live_bytes();
        (*h).bootstrap_start = bootstrap_start;
        (*h).bootstrap_bytes = bootstrap_bytes;
        (*h).before_main = u32::from(BEFORE_MAIN.load(Ordering::Acquire));
    }
    h
}
