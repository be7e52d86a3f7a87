//! The C library's heap in a process that waits for its pager (`heap`'s lazy start): how
//! much of it the process may keep there, and how much it holds.
//!
//! A process that waits for its pager leaves its first [`C_LIBRARY_HEAP_BYTES`] of live
//! blocks (a quarter of `USWAP_START_AFTER` where that is less) to the C library's malloc,
//! and mimalloc is brought up (`heap::bring_up`: its start, then the first arena) only when
//! an allocation would take the blocks there past that, or when the pager starts for another
//! cause. Most processes of a tree (a shell, `true`, `sed`, `expr`) never get there:
//! mimalloc's start (four `cpuid`, each a VM exit here, two files of `/proc` and `/sys`
//! read, its page map mapped) and the first arena's bitmaps cost about 0.15 ms of every
//! exec, and a shell's forks copied mimalloc's pages on write. Past its first 2 MiB a
//! process asks its tree ([`grant`], a MiB at a time): while the tree is calm (its charge,
//! this process's included, and the memory its pagers measured outside the budget, under a
//! sixteenth of the limit) the C library's heap may grow on to a quarter of
//! `USWAP_START_AFTER`, charged to the tree from its first byte
//! (`waiting_charge::charge_c_library_heap`). So a program far below a large limit keeps its
//! own allocator and its size classes: `sqlite3`'s 4.1-4.8 KiB page-cache blocks sat in
//! mimalloc's 5 KiB class, 377 MiB at its peak against 325 MiB with the C library's
//! (maximum RSS under `--limit 64GiB`; 317 plain). A free that leaves the heap two steps
//! below its grant gives the grant back down to one ([`uncount_block`]).
//!
//! What the heap holds is counted at each `malloc` and `free` the C library serves while the
//! process waits ([`count_block`], [`uncount_block`]), from the block's own header where
//! that agrees with the C library's `malloc_usable_size` (`uswap_escape::c_block`), without
//! a locked instruction while the process has one thread.
//!
//! Invariants: the grant only grows but by [`uncount_block`]'s give-back, which never takes
//! it under [`C_LIBRARY_HEAP_BYTES`]; what is granted past that is charged to the tree.
//! Runs on the program's threads inside `malloc` and `free`: allocation-free but for the
//! tree's segment, opened at a grant (cold).

use std::ffi::c_void;
use std::sync::atomic::{AtomicIsize, AtomicUsize, Ordering};

use crate::real;

/// The blocks the C library's malloc may hold before mimalloc is brought up or the tree is
/// asked for more (see the module doc): a shell's, `sed`'s, `perl -e`'s or the `gcc`
/// driver's whole heap (38-220 KiB live at exit), CPython's start's, not `cc1`'s on a small
/// file (1.6 MiB). A quarter of `USWAP_START_AFTER` where that is less (a 64th of a small
/// limit): what a process whose heap needs a pager keeps outside its budget for good, unless
/// its tree was calm.
pub const C_LIBRARY_HEAP_BYTES: usize = 2 << 20;

/// What a grant takes ahead of the heap, so that a heap that grows asks its tree once a
/// MiB, not at every block.
const GRANT_STEP_BYTES: usize = 1 << 20;

/// The blocks the C library's malloc may hold now in a waiting process: at first
/// [`C_LIBRARY_HEAP_BYTES`], then what [`grant`] granted. A fork child keeps its parent's,
/// and charges its copy at its next grant (or give-back), as a child's copy of mimalloc's
/// heap is charged at its next commit: a shell with a large heap forks without opening its
/// tree's segment.
static GRANT_BYTES: AtomicUsize = AtomicUsize::new(C_LIBRARY_HEAP_BYTES);

/// The usable bytes of the live blocks the C library's malloc handed out since the lazy
/// start was prepared, whoever asked (uswap's own and the dynamic linker's are few, and
/// only bring mimalloc up sooner), until the bring-up; then frozen, for the unmanaged
/// report (`heap::c_library_heap_bytes`). About: a block from before, freed, is subtracted
/// too (read as at least 0).
static LIVE_BYTES: AtomicIsize = AtomicIsize::new(0);

/// The bytes the C library's heap holds (as counted).
#[inline]
pub fn live_bytes() -> usize {
    LIVE_BYTES.load(Ordering::Relaxed).max(0) as usize
}

/// Adds the blocks the program got through the first stage before it loaded this library.
pub fn add_handed_over(bytes: isize) {
    LIVE_BYTES.fetch_add(bytes, Ordering::Relaxed);
}

/// Whether the heap may hold `wanted_bytes` without asking its tree (`most`: the most it
/// may be granted). Inlined into every allocation of a waiting process.
#[inline(always)]
pub fn within_grant(wanted_bytes: usize, most: usize) -> bool {
    wanted_bytes <= GRANT_BYTES.load(Ordering::Relaxed).min(most)
}

/// The C library's heap of a waiting process would hold `wanted_bytes`, past what it was
/// granted: grants that and [`GRANT_STEP_BYTES`] more (at most `most`, a quarter of
/// `USWAP_START_AFTER`) if the tree is calm (`waiting_charge::charge_c_library_heap`, which
/// charges the grant to the tree). False, and nothing granted, otherwise: mimalloc comes up.
#[cold]
pub fn grant(wanted_bytes: usize, most: usize) -> bool {
    if wanted_bytes > most {
        return false;
    }
    let grant_bytes = wanted_bytes.saturating_add(GRANT_STEP_BYTES).min(most);
    // A malloc that succeeds leaves errno as it was (the join's `kill(pid, 0)` of dead
    // slots sets it).
    let errno = real::errno();
    let granted = crate::waiting_charge::charge_c_library_heap(grant_bytes);
    if granted {
        GRANT_BYTES.fetch_max(grant_bytes, Ordering::Relaxed);
    }
    real::set_errno(errno);
    granted
}

/// Counts `p`, just allocated (or resized from `old_bytes`) by the C library's malloc.
///
/// # Safety
/// `p` is a live block of the C library's malloc.
#[inline]
pub unsafe fn count_block(p: *mut c_void, old_bytes: usize) {
    debug_assert!(!p.is_null());
    // SAFETY: the caller's contract.
    let bytes = unsafe { real::usable_size(p) };
    let _ = uswap_escape::c_block::add_live_bytes(&LIVE_BYTES, bytes as isize - old_bytes as isize);
}

/// Uncounts the C library's block `p`, about to be freed; gives the grant back down when the
/// heap is two steps under it.
///
/// # Safety
/// `p` is a live block of the C library's malloc.
#[inline]
pub unsafe fn uncount_block(p: *mut c_void) {
    // SAFETY: the caller's contract.
    let bytes = unsafe { real::usable_size(p) };
    let live_bytes = uswap_escape::c_block::add_live_bytes(&LIVE_BYTES, -(bytes as isize)).max(0) as usize;
    let grant_bytes = GRANT_BYTES.load(Ordering::Relaxed);
    if grant_bytes > C_LIBRARY_HEAP_BYTES && live_bytes + 2 * GRANT_STEP_BYTES < grant_bytes {
        shrink_grant(grant_bytes, live_bytes);
    }
}

/// The C library's heap shrank to `live_bytes`: a grant more than two steps above it is
/// lowered to one step above it (not below [`C_LIBRARY_HEAP_BYTES`]), and the tree's charge
/// with it. Only the process's own thread calls it (not a `vfork` child's, which would lower
/// its parent's grant).
#[cold]
fn shrink_grant(grant_bytes: usize, live_bytes: usize) {
    let lower_bytes = live_bytes.saturating_add(GRANT_STEP_BYTES).max(C_LIBRARY_HEAP_BYTES);
    if !crate::own_process::is_own_process()
        || GRANT_BYTES.compare_exchange(grant_bytes, lower_bytes, Ordering::Relaxed, Ordering::Relaxed).is_err()
    {
        return;
    }
    debug_assert!(lower_bytes < grant_bytes, "a give-back lowers the grant");
    // Whether the tree wants this process's pager is asked again at the next grant. The
    // grant as it is now: a grant on another thread may have raised it again.
    let errno = real::errno();
    let _ = crate::waiting_charge::note_heap(GRANT_BYTES.load(Ordering::Relaxed));
    real::set_errno(errno);
}
