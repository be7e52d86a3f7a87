//! The size of a block of the C library's malloc, as both preloaded libraries count the heap
//! a process keeps there (the first stage until the engine loads, the preload library until
//! mimalloc comes up): its live bytes decide when the engine, then mimalloc, take over.
//!
//! Why not `malloc_usable_size` each time: glibc's reads the header of the chunk after the
//! block too (whether the block is in use), a cache line the program's `free` and `malloc`
//! seldom touch otherwise. Counted on every `malloc` and `free`, it was over a quarter of a
//! loop of `free` and `malloc` of random sizes (perf), 20 ns of a pair's 77 against 57
//! plain. The block's own chunk header, the word before it, holds its size (glibc's
//! `malloc/malloc.c`: the size with three flag bits, `IS_MMAPPED` the second), and `free`
//! reads that word anyway. That layout is glibc's, not a promise of the C library's: the
//! first [`CHECKED_BLOCKS`] blocks are read both ways, and one that disagrees (another C
//! library, a glibc built with memory tagging) turns the header's reading off for good.
//!
//! The count itself changes on every `malloc` and `free` too ([`add_live_bytes`]).
//!
//! Invariant: for a block, the value returned is the same while it lives (what is added at
//! its `malloc` is what is taken away at its `free`): while blocks are checked, a block's
//! reading is returned only where it equals `malloc_usable_size`'s; after, the header's
//! reading for every block, or `malloc_usable_size`'s for every block once one disagreed.

use std::ffi::{c_char, c_void};
use std::sync::atomic::{AtomicIsize, AtomicUsize, Ordering};

/// Blocks read both ways before the header's reading is trusted alone.
pub const CHECKED_BLOCKS: usize = 64;

/// Blocks still to check; [`DISAGREED`] once one disagreed.
static TO_CHECK: AtomicUsize = AtomicUsize::new(CHECKED_BLOCKS);
const DISAGREED: usize = usize::MAX;

/// glibc's chunk header flags (`PREV_INUSE`, `IS_MMAPPED`, `NON_MAIN_ARENA`).
const FLAG_BITS: usize = 0b111;
const IS_MMAPPED: usize = 0b010;

/// The usable size of `p`, a live block of the C library's malloc (not null), whose own
/// `malloc_usable_size` is `usable`.
///
/// # Safety
/// `p` is a live block of the C library's malloc: the word before it is its chunk header
/// (under glibc) and readable whatever the C library.
#[inline]
pub unsafe fn usable_bytes(p: *mut c_void, usable: impl Fn(*mut c_void) -> usize) -> usize {
    // SAFETY: the caller's contract.
    unsafe { usable_bytes_checked_by(&TO_CHECK, p, usable) }
}

/// [`usable_bytes`], with the blocks still to check in `checks`.
///
/// # Safety
/// As [`usable_bytes`].
#[inline]
unsafe fn usable_bytes_checked_by(
    checks: &AtomicUsize,
    p: *mut c_void,
    usable: impl Fn(*mut c_void) -> usize,
) -> usize {
    debug_assert!(!p.is_null() && p as usize % std::mem::align_of::<usize>() == 0);
    let to_check = checks.load(Ordering::Relaxed);
    if to_check == DISAGREED {
        return usable(p);
    }
    // SAFETY: the caller's contract: the word before a live block is readable. Volatile:
    // the word lies outside the block, and a compiler that knows where the block came from
    // (`malloc`, to LLVM an allocation of its own) may take a plain read there for
    // undefined and fold it away (it read 0 in this module's test).
    let header = unsafe { std::ptr::read_volatile((p as *const usize).sub(1)) };
    let bytes = from_header(header);
    if to_check == 0 {
        return bytes;
    }
    let asked = usable(p);
    if asked != bytes {
        checks.store(DISAGREED, Ordering::Relaxed);
        return asked;
    }
    // Racing threads may each count a check down: the loop ends at zero or at a
    // disagreement.
    let _ = checks.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| (n != DISAGREED && n > 0).then(|| n - 1));
    bytes
}

/// Adds `delta_bytes` to `live_bytes`, a count of the heap's live bytes that every `malloc`
/// and `free` changes: without a locked instruction while the process has one thread (the C
/// library's `__libc_single_threaded`, which its `pthread_create` clears before the second
/// thread runs, and by which its own malloc skips its locks). The locked add waited for the
/// cache miss of the block's header read just before it (the `free` of a random block; perf
/// put most of the `free` path's samples on it). A thread made without the C library (a raw
/// `clone`) could lose an update, as the C library's malloc would then race with itself; so
/// could a `malloc` in a signal handler that interrupts one, which the C library's malloc
/// does not allow either. The count only decides when another allocator takes over.
/// Returns the count with `delta_bytes` added.
#[inline]
pub fn add_live_bytes(live_bytes: &AtomicIsize, delta_bytes: isize) -> isize {
    extern "C" {
        static __libc_single_threaded: c_char;
    }
    // SAFETY: a read of the C library's flag (glibc 2.32), which only it writes; volatile,
    // since it changes under the program.
    if unsafe { std::ptr::read_volatile(std::ptr::addr_of!(__libc_single_threaded)) } != 0 {
        let now = live_bytes.load(Ordering::Relaxed).wrapping_add(delta_bytes);
        live_bytes.store(now, Ordering::Relaxed);
        now
    } else {
        live_bytes.fetch_add(delta_bytes, Ordering::Relaxed).wrapping_add(delta_bytes)
    }
}

/// glibc's `musable` of an in-use chunk from its size word: the chunk less its header,
/// and less the next chunk's size word too for a mapped chunk (an ordinary chunk may use
/// that word, the next chunk's `prev_size`, while it is in use).
fn from_header(header: usize) -> usize {
    let chunk_bytes = header & !FLAG_BITS;
    let overhead = if header & IS_MMAPPED != 0 { 16 } else { 8 };
    chunk_bytes.saturating_sub(overhead)
}

#[cfg(test)]
mod tests {
    use super::*;

    extern "C" {
        fn malloc_usable_size(p: *mut c_void) -> usize;
    }

    /// Blocks of every size class glibc has, small, large and mapped, read both ways: the
    /// header agrees with `malloc_usable_size` for each (this test runs against the
    /// system's glibc, where the reading must hold).
    #[test]
    fn the_header_agrees_with_malloc_usable_size() {
        let sizes = (0..4200).chain([8 << 10, 100 << 10, 200 << 10, 4 << 20, (4 << 20) + 1]);
        for size in sizes {
            // SAFETY: the C library's malloc; the block is freed below.
            let p = unsafe { libc::malloc(size) };
            assert!(!p.is_null());
            // SAFETY: a live block of the C library's malloc (volatile: see `usable_bytes`).
            let header = unsafe { std::ptr::read_volatile((p as *const usize).sub(1)) };
            // SAFETY: as above.
            let usable = unsafe { malloc_usable_size(p) };
            assert_eq!(from_header(header), usable, "size {size}, header {header:#x}");
            assert!(usable >= size);
            // SAFETY: the block just checked.
            let counted = unsafe { usable_bytes(p, |q| malloc_usable_size(q)) };
            assert_eq!(counted, usable, "size {size}");
            // SAFETY: the block allocated above, freed once.
            unsafe { libc::free(p) };
        }
        assert_ne!(TO_CHECK.load(Ordering::Relaxed), DISAGREED);
    }

    #[test]
    fn a_header_that_disagrees_turns_the_reading_off() {
        // A block whose header says something else than its allocator: a reading that must
        // not be trusted (a stand-in for another C library).
        let mut words = [0usize; 4];
        words[0] = 4096 | 1;
        let p = words[1..].as_mut_ptr().cast::<c_void>();
        let checks = AtomicUsize::new(1);
        // SAFETY: the word before `p` is `words[0]`; `usable` does not read `p`.
        let bytes = unsafe { usable_bytes_checked_by(&checks, p, |_| 24) };
        let after = checks.load(Ordering::Relaxed);
        assert_eq!(bytes, 24, "the allocator's own answer once they disagree");
        assert_eq!(after, DISAGREED);
    }
}
