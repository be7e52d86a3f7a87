//! The C library's allocator, which serves the program while the engine is not loaded: its
//! functions as the C library's own (an allocator preloaded after uswap's, found next, would
//! serve blocks the engine later frees into the C library; the preload library's `real`
//! looks them up so too), once the C library has started: `RTLD_NEXT`, kept where the
//! definition found lies in the C library (a `dlopen` of it, which costs every exec more, only
//! where not). Before that (the
//! dynamic loader allocating while it relocates, under `LD_AUDIT`) and while the look-up
//! itself allocates, blocks come from a static bootstrap area, never freed; the preload
//! library recognises them by the range the hand-off gives.
//!
//! Invariant: a block is from the bootstrap area (16 bytes before it hold its size) or from
//! the C library's malloc; `free` tells them apart by address.

use std::cell::UnsafeCell;
use std::ffi::c_void;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

use uswap_escape::objects::object_of;

type MallocFn = unsafe extern "C" fn(usize) -> *mut c_void;
type FreeFn = unsafe extern "C" fn(*mut c_void);
type CallocFn = unsafe extern "C" fn(usize, usize) -> *mut c_void;
type ReallocFn = unsafe extern "C" fn(*mut c_void, usize) -> *mut c_void;
type MemalignFn = unsafe extern "C" fn(usize, usize) -> *mut c_void;
type UsableFn = unsafe extern "C" fn(*mut c_void) -> usize;

const MALLOC: usize = 0;
const FREE: usize = 1;
const CALLOC: usize = 2;
const REALLOC: usize = 3;
const MEMALIGN: usize = 4;
const USABLE: usize = 5;
const NAMES: [&std::ffi::CStr; 6] = [c"malloc", c"free", c"calloc", c"realloc", c"memalign", c"malloc_usable_size"];
static FNS: [AtomicUsize; 6] = [const { AtomicUsize::new(0) }; 6];

/// 0: not resolved; 1: resolving (nested calls use the bootstrap area); 2: resolved.
static STATE: AtomicUsize = AtomicUsize::new(0);
static STARTED: AtomicBool = AtomicBool::new(false);

const BOOTSTRAP_BYTES: usize = 16 << 10;
#[repr(C, align(64))]
struct Bootstrap(UnsafeCell<[u8; BOOTSTRAP_BYTES]>);
// SAFETY: each block of the area is handed to one caller alone (`bootstrap_alloc`'s
// compare-exchange on `BOOTSTRAP_USED`).
unsafe impl Sync for Bootstrap {}
static BOOTSTRAP: Bootstrap = Bootstrap(UnsafeCell::new([0; BOOTSTRAP_BYTES]));
static BOOTSTRAP_USED: AtomicUsize = AtomicUsize::new(0);

/// The bootstrap area's start and length, for the hand-off.
pub fn bootstrap_area() -> (usize, usize) {
    (BOOTSTRAP.0.get() as usize, BOOTSTRAP_BYTES)
}

pub fn is_bootstrap(p: *mut c_void) -> bool {
    let (start, len) = bootstrap_area();
    (p as usize) >= start && (p as usize) < start + len
}

fn bootstrap_size(p: *mut c_void) -> usize {
    // SAFETY: a bootstrap block (the caller checked), whose 16-byte header holds its size.
    unsafe { *((p as usize - 16) as *const usize) }
}

fn bootstrap_alloc(size: usize, align: usize) -> *mut c_void {
    let (base, _) = bootstrap_area();
    let align = align.max(16);
    let mut used = BOOTSTRAP_USED.load(Ordering::Relaxed);
    // Bounded: each failed exchange means another caller advanced `used`.
    loop {
        let start = (base + used + 16).next_multiple_of(align);
        let end = start.saturating_add(size);
        if end > base + BOOTSTRAP_BYTES {
            fatal(b"uswap: the first stage's bootstrap allocator ran out (before the C library's malloc was found)\n");
        }
        match BOOTSTRAP_USED.compare_exchange(used, end - base, Ordering::AcqRel, Ordering::Relaxed) {
            Ok(_) => {
                // SAFETY: [start - 16, end) lies in the area, reserved for this caller alone.
                unsafe { *((start - 16) as *mut usize) = size };
                return start as *mut c_void;
            }
            Err(u) => used = u,
        }
    }
}

pub fn fatal(msg: &[u8]) -> ! {
    // SAFETY: write(2) and _exit(2) are async-signal-safe; the buffer is valid.
    unsafe {
        libc::write(2, msg.as_ptr().cast(), msg.len());
        libc::_exit(2)
    }
}

/// From the constructor: the loader is done.
pub fn c_library_started_now() {
    STARTED.store(true, Ordering::Release);
    let _ = resolve();
}

fn c_library_started() -> bool {
    if STARTED.load(Ordering::Acquire) {
        return true;
    }
    extern "C" {
        static __environ: *const *const std::ffi::c_char;
    }
    // SAFETY: a read of the C library's pointer, set by its start-up code.
    let set = !unsafe { std::ptr::read_volatile(std::ptr::addr_of!(__environ)) }.is_null();
    if set {
        STARTED.store(true, Ordering::Release);
    }
    set
}

fn resolve() -> bool {
    match STATE.compare_exchange(0, 1, Ordering::AcqRel, Ordering::Acquire) {
        Ok(_) => {}
        Err(2) => return true,
        Err(_) => return false,
    }
    let handle = if next_is_the_c_librarys() {
        libc::RTLD_NEXT
    } else {
        // SAFETY: dlopen of a loaded library by its soname with RTLD_NOLOAD loads nothing.
        let libc_handle = unsafe { libc::dlopen(c"libc.so.6".as_ptr(), libc::RTLD_NOLOAD | libc::RTLD_LAZY) };
        if libc_handle.is_null() {
            libc::RTLD_NEXT
        } else {
            libc_handle
        }
    };
    for (name, slot) in NAMES.iter().zip(&FNS) {
        // SAFETY: dlsym with a handle and a NUL-terminated name.
        let f = unsafe { libc::dlsym(handle, name.as_ptr()) };
        if f.is_null() {
            fatal(b"uswap: the C library's malloc was not found (dlsym)\n");
        }
        slot.store(f as usize, Ordering::Release);
    }
    STATE.store(2, Ordering::Release);
    true
}

/// Whether the `malloc` after this library is the C library's: the object that defines it
/// is the one that defines `getenv` (which this library does not interpose, so the address
/// it links is the C library's).
fn next_is_the_c_librarys() -> bool {
    // SAFETY: dlsym with RTLD_NEXT and a NUL-terminated name.
    let malloc = unsafe { libc::dlsym(libc::RTLD_NEXT, c"malloc".as_ptr()) } as usize;
    let object = object_of(malloc);
    malloc != 0 && object.is_some() && object == object_of(libc::getenv as *const () as usize)
}

fn ready() -> bool {
    STATE.load(Ordering::Acquire) == 2
        || ((c_library_started() || BOOTSTRAP_USED.load(Ordering::Relaxed) >= BOOTSTRAP_BYTES / 2) && resolve())
}

macro_rules! c_fn {
    ($i:expr, $ty:ty) => {{
        // After `ready()` the slot holds the C library's function of this type (the caller's
        // SAFETY comment says why it is called).
        std::mem::transmute::<usize, $ty>(FNS[$i].load(Ordering::Acquire))
    }};
}

pub fn malloc(size: usize) -> *mut c_void {
    if !ready() {
        return bootstrap_alloc(size, 16);
    }
    // SAFETY: the C library's malloc.
    unsafe { c_fn!(MALLOC, MallocFn)(size) }
}

pub fn calloc(n: usize, size: usize) -> *mut c_void {
    if !ready() {
        // The area is static, hence zeroed, and never reused.
        return n.checked_mul(size).map_or(std::ptr::null_mut(), |b| bootstrap_alloc(b, 16));
    }
    // SAFETY: the C library's calloc.
    unsafe { c_fn!(CALLOC, CallocFn)(n, size) }
}

pub fn memalign(align: usize, size: usize) -> *mut c_void {
    if !ready() {
        return bootstrap_alloc(size, align);
    }
    // SAFETY: the C library's memalign.
    unsafe { c_fn!(MEMALIGN, MemalignFn)(align, size) }
}

/// # Safety
/// `p` is null or a live block of the C library's malloc or of the bootstrap area.
pub unsafe fn free(p: *mut c_void) {
    if p.is_null() || is_bootstrap(p) {
        return;
    }
    // SAFETY: the C library's block (the caller's contract); one exists only once resolved.
    unsafe { c_fn!(FREE, FreeFn)(p) }
}

/// # Safety
/// As [`free`].
pub unsafe fn realloc(p: *mut c_void, size: usize) -> *mut c_void {
    if p.is_null() {
        return malloc(size);
    }
    if is_bootstrap(p) {
        let n = malloc(size);
        if !n.is_null() {
            // SAFETY: both valid for the smaller size, and apart.
            unsafe { std::ptr::copy_nonoverlapping(p as *const u8, n as *mut u8, bootstrap_size(p).min(size)) };
        }
        return n;
    }
    // SAFETY: the C library's block (the caller's contract).
    unsafe { c_fn!(REALLOC, ReallocFn)(p, size) }
}

/// # Safety
/// As [`free`].
pub unsafe fn usable_size(p: *mut c_void) -> usize {
    if p.is_null() {
        return 0;
    }
    if is_bootstrap(p) {
        return bootstrap_size(p);
    }
    // SAFETY: the C library's block (the caller's contract); its usable size is read from
    // its header where that agrees with the C library's (`watch` counts it at each `malloc`
    // and `free`).
    unsafe { uswap_escape::c_block::usable_bytes(p, |q| c_fn!(USABLE, UsableFn)(q)) }
}
