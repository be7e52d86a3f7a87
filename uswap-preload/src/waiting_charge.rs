//! The heap of a process that waits for its pager, charged to the tree's budget.
//!
//! A process's pager starts when its heap passes `USWAP_START_AFTER`: a sixteenth of the
//! limit unless `uswap run --start-after` says otherwise (the crate's doc, "Lazy start").
//! Until then the process pays nothing for uswap, which under a large limit is a lot of
//! memory with no pager: a `sqlite3` of 380 MiB under `--limit 64GiB` never needs one. So
//! past [`CHARGED_AFTER_BYTES`] of heap a waiting process takes a slot of the tree's charge
//! segment and charges its heap's committed bytes there, in pages, as mimalloc commits and
//! gives memory back. The tree's pagers then reclaim for it (the limit holds for the tree
//! as a whole), and `uswap run`'s resident peak counts it. A waiting process cannot
//! reclaim, and a tree of waiting processes would have no one to hold the limit: once the
//! tree's charge is at half its limit or more, a waiting process starts its pager at its
//! next commit ([`tree_wants_pagers`]).
//!
//! When the pager starts, it claims the same slot (`join_tree`, by pid): the waiting charge
//! is given back there and the pager charges the pages it takes over instead
//! ([`handed_to_pager`]). A process that ends (`exit`, `_exit`) or execs while waiting
//! gives its slot back ([`leave`]); one killed is swept by the next process that sweeps dead
//! slots (every join, every pager's start and publisher). A fork child charges its own copy
//! of the heap, inherited pages included (counted twice while they are shared: the limit is
//! held early, never late). Outside a tree (the library preloaded by hand) nothing can be
//! charged: the pager starts where the process would have joined ([`unchargeable`]).
//!
//! Invariants: while [`SLOT`] is set, this process's slot holds its heap's committed pages
//! as of its last commit or give-back, and nothing else; it is cleared when the pager takes
//! over, when the process leaves, and in a fork child. Locking: none, atomics only (a commit may come
//! from a signal handler that allocates; the join, which opens the segment, is not made
//! on an alternate signal stack).

use std::sync::atomic::{AtomicBool, AtomicPtr, AtomicUsize, Ordering};

/// Heap bytes a waiting process holds uncharged: less than a shell, `sed`, `cc1` on a small
/// file or a test runner's short process ever commits (the lazy start's threshold before it
/// became a share of the limit), so that they never open the segment.
pub const CHARGED_AFTER_BYTES: usize = 16 << 20;

/// This process's own charge cell in the segment while it is charged as a waiting process;
/// null otherwise.
static SLOT: AtomicPtr<AtomicUsize> = AtomicPtr::new(std::ptr::null_mut());
/// The join failed (no tree: the library preloaded by hand; every slot taken; a segment
/// that cannot be opened, which the pager's start then says and records): the pager
/// starts instead.
static JOIN_FAILED: AtomicBool = AtomicBool::new(false);

/// A waiting process's heap now holds `committed_bytes` (after a commit or a give-back):
/// charges the difference to the tree once past [`CHARGED_AFTER_BYTES`], joining it first.
/// Returns whether the pager should start now: the join failed ([`unchargeable`]), or the
/// tree's charge is at half its limit or more ([`tree_wants_pagers`]).
pub fn note_heap(committed_bytes: usize) -> bool {
    if !crate::fork::is_own_process() {
        // A vfork child: the memory and the slot are its parent's.
        return false;
    }
    let slot = SLOT.load(Ordering::Acquire);
    if slot.is_null() {
        if committed_bytes < CHARGED_AFTER_BYTES || JOIN_FAILED.load(Ordering::Relaxed) {
            return JOIN_FAILED.load(Ordering::Relaxed);
        }
        if crate::in_signal_handler() {
            // The join opens a file and maps it: at the next commit.
            return false;
        }
        if !join() {
            JOIN_FAILED.store(true, Ordering::Relaxed);
            return true;
        }
    }
    let (slot, Some(seg)) = (SLOT.load(Ordering::Acquire), crate::segment()) else { return false };
    // SAFETY: a cell of the segment, which stays mapped for the life of the process.
    seg.charge().set_charge_without_pager(unsafe { &*slot }, committed_bytes / uswap::PAGE_SIZE);
    tree_wants_pagers()
}

/// Whether this process's heap cannot be charged to a tree (a process run with the library
/// by hand, outside `uswap run`; every slot taken): its pager starts past
/// [`CHARGED_AFTER_BYTES`] of heap, where it would have joined.
pub fn unchargeable() -> bool {
    JOIN_FAILED.load(Ordering::Relaxed)
}

/// Takes this process's slot in the tree's segment (opened here if no one in this process
/// did yet). False where there is no tree (a process run with the library by hand) or no
/// slot left.
fn join() -> bool {
    // This library's own work: its allocations are the C library's, never the program's.
    let _g = crate::own_code::Guard::enter();
    let Some(seg) = crate::open_segment().ok().flatten() else { return false };
    seg.sweep_dead();
    let Some(own) = seg.claim(std::process::id()) else { return false };
    SLOT.store(own.pages as *const AtomicUsize as *mut AtomicUsize, Ordering::Release);
    true
}

/// Whether the tree's charge is at half its limit or more, for a process that joined it:
/// its waiting processes then start their pagers (see the module's comment).
pub fn tree_wants_pagers() -> bool {
    if SLOT.load(Ordering::Acquire).is_null() {
        return false;
    }
    crate::segment().is_some_and(|s| {
        let t = s.charge();
        t.resident_pages.load(Ordering::Acquire) >= t.limit_pages.load(Ordering::Acquire) / 2
    })
}

/// The pager took the process over: its start claimed the slot again (`join_tree`), which
/// gave the waiting charge back. Forgets it here.
pub fn handed_to_pager() {
    SLOT.store(std::ptr::null_mut(), Ordering::Release);
}

/// At `exit`, `_exit` or `execve` of a process still waiting: gives its slot back, charge
/// and all (not a `vfork` child's, which shares its parent's memory and statics).
pub fn leave() {
    if !crate::fork::is_own_process() || SLOT.swap(std::ptr::null_mut(), Ordering::AcqRel).is_null() {
        return;
    }
    if let Some(seg) = crate::segment() {
        seg.leave(std::process::id());
    }
}

/// In a fork child (its one thread, before it runs): the slot is the parent's. The child
/// joins with a slot of its own at its next commit past [`CHARGED_AFTER_BYTES`].
pub fn forget_in_fork_child() {
    SLOT.store(std::ptr::null_mut(), Ordering::Release);
}
