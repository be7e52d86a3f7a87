//! The C library's own allocator as uswap's two preloaded libraries call it: the first stage
//! (`uswap-shim`) serves the program from it while a process has no pager, and the preload
//! library (`uswap-preload`) serves uswap's engine and its tables from it, which must never
//! live in managed memory.
//!
//! The functions are the C library's own, found once the C library has started (at the
//! latest from each library's constructor): the next definition after the library
//! (`RTLD_NEXT`), kept where it lies in the object that defines `getenv` (which neither
//! library interposes, so the address it links is the C library's), else looked up in the
//! C library by its soname (an allocator the user preloads after uswap's,
//! `LD_PRELOAD=libjemalloc.so`, takes its chunks from the program's `mmap`, managed memory;
//! and from the preload library, loaded by the first stage outside the global scope,
//! `RTLD_NEXT` finds the first stage's stubs). The `dlopen` that takes is left to the
//! processes that need it: it costs every exec more.
//!
//! Before that, blocks come from a static bootstrap area, never freed: the dynamic loader
//! allocating while it relocates (under an `LD_AUDIT` auditor it calls back into itself
//! through its own PLT, not yet bound), and the allocations nested in the look-up itself
//! (`dlsym`'s error buffer). A few hundred bytes in practice; running out of it ends the
//! process with a message (status 2, what `uswap run` reports as a process it could not
//! manage). Half the area is kept for the nested ones.
//!
//! Invariant: a block an allocator hands out is from its bootstrap area (the 16 bytes before
//! it hold its size), from another bootstrap area the caller names ([`OtherArea`]: the
//! preload library frees the first stage's), or from the C library's malloc; `free` tells
//! them apart by address. Allocation-free and lock-free but for the look-up, which runs once.

use std::cell::UnsafeCell;
use std::ffi::{c_void, CStr};
use std::marker::PhantomData;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

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
const NAMES: [&CStr; 6] = [c"malloc", c"free", c"calloc", c"realloc", c"memalign", c"malloc_usable_size"];

/// The look-up's states.
const UNRESOLVED: usize = 0;
const RESOLVING: usize = 1;
const RESOLVED: usize = 2;

/// A bootstrap area of another library whose blocks this one may be handed: `size_of` the
/// block at `p` if it is one of them.
pub trait OtherArea {
    fn size_of(p: *mut c_void) -> Option<usize>;
}

/// No other area.
pub struct NoOtherArea;

impl OtherArea for NoOtherArea {
    #[inline]
    fn size_of(_p: *mut c_void) -> Option<usize> {
        None
    }
}

#[repr(C, align(64))]
struct Area<const BYTES: usize>(UnsafeCell<[u8; BYTES]>);

/// The C library's allocator with a bootstrap area of `BYTES`, and the blocks of `O`'s.
pub struct CAllocator<const BYTES: usize, O: OtherArea> {
    fns: [AtomicUsize; 6],
    state: AtomicUsize,
    started: AtomicBool,
    used_bytes: AtomicUsize,
    area: Area<BYTES>,
    other: PhantomData<O>,
}

// SAFETY: the functions' slots and the states are atomics; each block of the area is handed
// to one caller alone (`bootstrap_alloc`'s compare-exchange on `used_bytes`), and the area is
// never read but through blocks.
unsafe impl<const BYTES: usize, O: OtherArea> Sync for CAllocator<BYTES, O> {}

impl<const BYTES: usize, O: OtherArea> CAllocator<BYTES, O> {
    pub const fn new() -> Self {
        CAllocator {
            fns: [const { AtomicUsize::new(0) }; 6],
            state: AtomicUsize::new(UNRESOLVED),
            started: AtomicBool::new(false),
            used_bytes: AtomicUsize::new(0),
            area: Area(UnsafeCell::new([0; BYTES])),
            other: PhantomData,
        }
    }

    /// The bootstrap area's start and length (the first stage hands them to the preload
    /// library).
    pub fn bootstrap_area(&self) -> (usize, usize) {
        (self.area.0.get() as usize, BYTES)
    }

    /// The size of `p` if it is a bootstrap block (this allocator's or the other area's).
    #[inline]
    pub fn bootstrap_size(&self, p: *mut c_void) -> Option<usize> {
        let (start, len) = self.bootstrap_area();
        let a = p as usize;
        if a >= start && a < start + len {
            // SAFETY: a block of this area, whose 16-byte header holds its size.
            return Some(unsafe { *((a - 16) as *const usize) });
        }
        O::size_of(p)
    }

    #[inline]
    pub fn is_bootstrap(&self, p: *mut c_void) -> bool {
        self.bootstrap_size(p).is_some()
    }

    /// From the library's constructor: the loader is done, whatever the environment says (a
    /// constructor that ran before may have cleared it: `clearenv` sets `__environ` to null).
    pub fn c_library_started_now(&self) {
        self.started.store(true, Ordering::Release);
        let _ = self.resolve();
    }

    pub fn malloc(&self, size: usize) -> *mut c_void {
        if !self.ready() {
            return self.bootstrap_alloc(size, 16);
        }
        // SAFETY: the C library's malloc.
        unsafe { self.c_fn::<MallocFn>(MALLOC)(size) }
    }

    pub fn calloc(&self, n: usize, size: usize) -> *mut c_void {
        if !self.ready() {
            // The area is static, hence zeroed, and never reused.
            return n.checked_mul(size).map_or(std::ptr::null_mut(), |b| self.bootstrap_alloc(b, 16));
        }
        // SAFETY: the C library's calloc.
        unsafe { self.c_fn::<CallocFn>(CALLOC)(n, size) }
    }

    pub fn memalign(&self, align: usize, size: usize) -> *mut c_void {
        if !self.ready() {
            return self.bootstrap_alloc(size, align);
        }
        // SAFETY: the C library's memalign.
        unsafe { self.c_fn::<MemalignFn>(MEMALIGN)(align, size) }
    }

    /// # Safety
    /// `p` is null or a live block of the C library's malloc or a bootstrap area.
    pub unsafe fn free(&self, p: *mut c_void) {
        if p.is_null() || self.is_bootstrap(p) {
            return;
        }
        // SAFETY: the C library's block (the caller's contract); one exists only once the
        // look-up is done.
        unsafe { self.c_fn::<FreeFn>(FREE)(p) }
    }

    /// # Safety
    /// As [`Self::free`].
    pub unsafe fn realloc(&self, p: *mut c_void, size: usize) -> *mut c_void {
        if p.is_null() {
            return self.malloc(size);
        }
        if let Some(old_bytes) = self.bootstrap_size(p) {
            let n = self.malloc(size);
            if !n.is_null() {
                // SAFETY: both valid for the smaller size, and apart.
                unsafe { std::ptr::copy_nonoverlapping(p as *const u8, n as *mut u8, old_bytes.min(size)) };
            }
            return n;
        }
        // SAFETY: the C library's block (the caller's contract).
        unsafe { self.c_fn::<ReallocFn>(REALLOC)(p, size) }
    }

    /// The usable bytes of block `p` (0 for null): a C library block's read from its header
    /// where that agrees with the C library's (see [`crate::c_block`]).
    ///
    /// # Safety
    /// As [`Self::free`].
    #[inline]
    pub unsafe fn usable_size(&self, p: *mut c_void) -> usize {
        if p.is_null() {
            return 0;
        }
        if let Some(bytes) = self.bootstrap_size(p) {
            return bytes;
        }
        // SAFETY: the C library's block (the caller's contract).
        unsafe { self.c_library_usable_size(p) }
    }

    /// The usable bytes of block `p` of the C library's malloc (not null, not a bootstrap
    /// block: the caller told it apart), read from its header where that agrees with the C
    /// library's (see [`crate::c_block`]).
    ///
    /// # Safety
    /// `p` is a live block of the C library's malloc.
    #[inline]
    pub unsafe fn c_library_usable_size(&self, p: *mut c_void) -> usize {
        debug_assert!(!p.is_null() && !self.is_bootstrap(p), "a block of the C library's malloc");
        // SAFETY: the C library's block (the caller's contract); one exists only once the
        // look-up is done.
        unsafe { crate::c_block::usable_bytes(p, |q| self.c_fn::<UsableFn>(USABLE)(q)) }
    }

    /// The C library's function in slot `i`, of type `F`.
    ///
    /// # Safety
    /// Only once [`Self::ready`] said so (or for a block that exists only then): the slot
    /// holds the C library's function of that type.
    #[inline]
    unsafe fn c_fn<F: Copy>(&self, i: usize) -> F {
        let f = self.fns[i].load(Ordering::Acquire);
        debug_assert!(f != 0, "the C library's {:?} called before it was found", NAMES[i]);
        debug_assert_eq!(std::mem::size_of::<F>(), std::mem::size_of::<usize>());
        // SAFETY: the caller's contract: a function pointer of type `F`, stored by `resolve`.
        unsafe { std::mem::transmute_copy::<usize, F>(&f) }
    }

    #[inline]
    fn ready(&self) -> bool {
        self.state.load(Ordering::Acquire) == RESOLVED
            || ((self.c_library_started() || self.used_bytes.load(Ordering::Relaxed) >= BYTES / 2) && self.resolve())
    }

    /// Whether the C library has started: its start-up code sets `__environ` (the variable
    /// it writes; `environ` is a weak alias that a program defining its own binds
    /// elsewhere); until then only the dynamic loader runs.
    fn c_library_started(&self) -> bool {
        if self.started.load(Ordering::Acquire) {
            return true;
        }
        extern "C" {
            static __environ: *const *const std::ffi::c_char;
        }
        // SAFETY: a read of the C library's pointer, volatile since setenv and clearenv
        // rewrite it (a stale value only sends a block to the bootstrap area).
        let set = !unsafe { std::ptr::read_volatile(std::ptr::addr_of!(__environ)) }.is_null();
        if set {
            self.started.store(true, Ordering::Release);
        }
        set
    }

    #[cold]
    fn resolve(&self) -> bool {
        match self.state.compare_exchange(UNRESOLVED, RESOLVING, Ordering::AcqRel, Ordering::Acquire) {
            Ok(_) => {}
            Err(RESOLVED) => return true,
            // Another thread is looking them up, or this one is (nested in dlsym): the
            // caller falls back to the bootstrap area.
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
        for (name, slot) in NAMES.iter().zip(&self.fns) {
            // SAFETY: dlsym with a handle and a NUL-terminated name.
            let f = unsafe { libc::dlsym(handle, name.as_ptr()) };
            if f.is_null() {
                fatal(b"uswap: the C library's malloc was not found (dlsym)\n");
            }
            slot.store(f as usize, Ordering::Release);
        }
        self.state.store(RESOLVED, Ordering::Release);
        true
    }

    #[cold]
    fn bootstrap_alloc(&self, size: usize, align: usize) -> *mut c_void {
        let (base, _) = self.bootstrap_area();
        let align = align.max(16);
        let mut used = self.used_bytes.load(Ordering::Relaxed);
        // Bounded: each failed exchange means another caller advanced `used`.
        loop {
            let start = (base + used + 16).next_multiple_of(align);
            let end = start.saturating_add(size);
            if end > base + BYTES {
                fatal(b"uswap: a preloaded library's bootstrap allocator ran out (before the C library's malloc was found)\n");
            }
            match self.used_bytes.compare_exchange(used, end - base, Ordering::AcqRel, Ordering::Relaxed) {
                Ok(_) => {
                    // SAFETY: [start - 16, end) lies in the area, reserved for this caller alone.
                    unsafe { *((start - 16) as *mut usize) = size };
                    return start as *mut c_void;
                }
                Err(u) => used = u,
            }
        }
    }
}

impl<const BYTES: usize, O: OtherArea> Default for CAllocator<BYTES, O> {
    fn default() -> Self {
        Self::new()
    }
}

/// Whether the `malloc` after the calling library is the C library's: the object that
/// defines it is the one that defines `getenv`.
fn next_is_the_c_librarys() -> bool {
    // SAFETY: dlsym with RTLD_NEXT and a NUL-terminated name.
    let malloc = unsafe { libc::dlsym(libc::RTLD_NEXT, c"malloc".as_ptr()) } as usize;
    let object = crate::objects::object_of(malloc);
    malloc != 0 && object.is_some() && object == crate::objects::object_of(libc::getenv as *const () as usize)
}

/// Writes `msg` to stderr and exits with status 2 (what `uswap run` reports as a process it
/// could not manage). Allocation-free.
pub fn fatal(msg: &[u8]) -> ! {
    // SAFETY: write(2) and _exit(2) are async-signal-safe; the buffer is valid.
    unsafe {
        libc::write(2, msg.as_ptr().cast(), msg.len());
        libc::_exit(2)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Fixed;
    static OTHER: [u64; 4] = [0, 24, 0, 0];
    impl OtherArea for Fixed {
        fn size_of(p: *mut c_void) -> Option<usize> {
            (p as usize == OTHER.as_ptr() as usize + 16).then_some(24)
        }
    }

    #[test]
    fn blocks_come_from_the_c_library_once_it_has_started() {
        static A: CAllocator<4096, NoOtherArea> = CAllocator::new();
        A.c_library_started_now();
        let p = A.malloc(100);
        assert!(!p.is_null() && !A.is_bootstrap(p));
        // SAFETY: a live block of the C library's, then resized, then freed.
        unsafe {
            std::ptr::write_bytes(p as *mut u8, 7, 100);
            assert!(A.usable_size(p) >= 100);
            let q = A.realloc(p, 5000);
            assert_eq!(*(q as *const u8).add(99), 7, "realloc keeps the contents");
            A.free(q);
        }
        assert_eq!(A.used_bytes.load(Ordering::Relaxed), 0, "nothing from the bootstrap area");
    }

    #[test]
    fn bootstrap_blocks_keep_their_size_and_move_out_whole() {
        static A: CAllocator<4096, Fixed> = CAllocator::new();
        let p = A.bootstrap_alloc(40, 64);
        assert!(A.is_bootstrap(p) && p as usize % 64 == 0);
        // SAFETY: a bootstrap block of 40 bytes, then resized into the C library's heap.
        unsafe {
            std::ptr::write_bytes(p as *mut u8, 9, 40);
            assert_eq!(A.usable_size(p), 40);
            A.free(p);
            A.c_library_started_now();
            let q = A.realloc(p, 80);
            assert!(!A.is_bootstrap(q));
            assert_eq!(std::slice::from_raw_parts(q as *const u8, 40), &[9u8; 40][..]);
            A.free(q);
        }
        let other = (OTHER.as_ptr() as usize + 16) as *mut c_void;
        assert_eq!(A.bootstrap_size(other), Some(24), "the other area's block is told by its header");
    }
}
