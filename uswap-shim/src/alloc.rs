//! The C library's allocator, which serves the program while the engine is not loaded
//! (`uswap_escape::c_allocator`: the C library's own functions once it has started, a static
//! bootstrap area before, for the dynamic loader allocating while it relocates under
//! `LD_AUDIT` and for the look-up's own allocations; the preload library recognises this
//! area's blocks by the range the hand-off gives).
//!
//! Invariant: a block is from the bootstrap area (16 bytes before it hold its size) or from
//! the C library's malloc; `free` tells them apart by address.

use std::ffi::c_void;

use uswap_escape::c_allocator::{CAllocator, NoOtherArea};

/// The bootstrap area's size: a few hundred bytes are used in practice.
const BOOTSTRAP_BYTES: usize = 16 << 10;

static C: CAllocator<BOOTSTRAP_BYTES, NoOtherArea> = CAllocator::new();

/// The bootstrap area's start and length, for the hand-off.
pub fn bootstrap_area() -> (usize, usize) {
    C.bootstrap_area()
}

/// From the constructor: the loader is done.
pub fn c_library_started_now() {
    C.c_library_started_now();
}

pub fn malloc(size: usize) -> *mut c_void {
    C.malloc(size)
}

pub fn calloc(n: usize, size: usize) -> *mut c_void {
    C.calloc(n, size)
}

pub fn memalign(align: usize, size: usize) -> *mut c_void {
    C.memalign(align, size)
}

/// # Safety
/// `p` is null or a live block of the C library's malloc or of the bootstrap area.
pub unsafe fn free(p: *mut c_void) {
    // SAFETY: the caller's contract.
    unsafe { C.free(p) }
}

/// # Safety
/// As [`free`].
pub unsafe fn realloc(p: *mut c_void, size: usize) -> *mut c_void {
    // SAFETY: the caller's contract.
    unsafe { C.realloc(p, size) }
}

/// The usable bytes of block `p` as the program's count of the C library's heap takes
/// them: 0 for null or a bootstrap block (never freed, and not the C library's).
///
/// # Safety
/// As [`free`].
pub unsafe fn counted_bytes(p: *mut c_void) -> usize {
    if p.is_null() || C.is_bootstrap(p) {
        return 0;
    }
    // SAFETY: neither null nor a bootstrap block, so the C library's (the caller's contract).
    unsafe { C.c_library_usable_size(p) }
}

/// # Safety
/// As [`free`].
pub unsafe fn usable_size(p: *mut c_void) -> usize {
    // SAFETY: the caller's contract; the count (`watch`) reads the size at each `malloc` and
    // `free` from the block's header where that agrees with the C library's.
    unsafe { C.usable_size(p) }
}
