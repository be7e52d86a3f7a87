//! What a process that waits for its pager holds, charged to the tree's budget: its heap,
//! and the mappings it defers.
//!
//! A process's pager starts when what it holds passes `USWAP_START_AFTER`: a sixteenth of
//! the limit unless `uswap run --start-after` says otherwise (the crate's doc, "Lazy
//! start"). Until then the process pays nothing for uswap, which under a large limit is a
//! lot of memory with no pager: a `sqlite3` of 380 MiB under `--limit 64GiB` never needs
//! one. What it holds is its heap's committed bytes, as mimalloc commits and gives memory
//! back, and the mappings it made as the kernel's instead of as regions of its own
//! ([`note_deferred`]: `mmap`'s "deferred" mappings, such as CPython's arenas). Past
//! [`CHARGED_AFTER_BYTES`] a waiting process takes a slot of the tree's charge segment and
//! charges it there, in pages; one whose C library heap passes its first 2 MiB takes it
//! then, and keeps that heap only while the tree is calm ([`charge_c_library_heap`]). The
//! tree's pagers then reclaim for it (the limit holds for the tree as a whole), and `uswap
//! run`'s resident peak counts it. A waiting process cannot reclaim, and a tree of waiting
//! processes would have no one to hold the limit:
//! once the tree's charge is at half its limit or more, a waiting process starts its pager
//! at its next commit or deferred mapping ([`tree_wants_pagers`]).
//!
//! When the pager starts, it claims the same slot (`join_tree`, by pid): the waiting charge
//! is given back there and the pager charges the pages it takes over instead
//! ([`handed_to_pager`]), the deferred mappings with the heap ([`take_deferred`]). A process
//! that ends (`exit`, `_exit`) or execs while waiting gives its slot back ([`leave`]); one
//! killed is swept by the next process that sweeps dead slots (every join, every pager's
//! start and publisher). A fork child charges its own copy, inherited pages included
//! (counted twice while they are shared: the limit is held early, never late). Outside a
//! tree (the library preloaded by hand) nothing can be charged: the pager starts where the
//! process would have joined ([`unchargeable`]).
//!
//! Invariants: while [`SLOT`] is set, this process's slot holds [`waiting_bytes`] in pages
//! as of its last change, and nothing else; it is cleared when the pager takes over, when
//! the process leaves, and in a fork child. The deferred ranges are page-aligned, disjoint,
//! at most [`MAX_DEFERRED`] + 1, and [`MAPPED_BYTES`] is their sum. Locking: the heap's
//! figures and the slot are atomics (a commit may come from a signal handler that
//! allocates; the join, which opens the segment, is not made on an alternate signal
//! stack). The deferred ranges are one mutex ([`DEFERRED`]), taken by the interposed
//! mapping calls only when there are ranges, a start is under way or has taken them
//! ([`NR_DEFERRED`], `crate::is_starting`, [`TAKEN`]), and by `fork`'s handlers; never
//! across another lock, held across a system call with asynchronous signals blocked, and
//! with no allocation under it once the table is reserved (a handler that unmaps while
//! its thread holds it would wait for good, as for `mmap`'s own table). A program's `munmap` or `mprotect` of them is made
//! with it held ([`call_on_deferred`]), and the pager's start takes the ranges under it
//! ([`take_deferred`], [`TAKEN`]): a range is either cut out before the start takes it or
//! changed on the pager after the start, never unmapped by the kernel in between and then
//! adopted with whatever the kernel mapped there next (the engine's own buffers: the
//! process hung).

use std::sync::atomic::{AtomicBool, AtomicPtr, AtomicUsize, Ordering};
use std::sync::Mutex;

/// What a waiting process holds uncharged (heap and deferred mappings): more than a shell,
/// `sed`, `cc1` on a small file or a test runner's short process ever holds (the lazy
/// start's threshold before it became a share of the limit), so that they never open the
/// segment.
pub const CHARGED_AFTER_BYTES: usize = 16 << 20;

/// This process's own charge cell in the segment while it is charged as a waiting process;
/// null otherwise.
static SLOT: AtomicPtr<AtomicUsize> = AtomicPtr::new(std::ptr::null_mut());
/// The join failed (no tree: the library preloaded by hand; every slot taken; a segment
/// that cannot be opened, which the pager's start then says and records): the pager
/// starts instead.
static JOIN_FAILED: AtomicBool = AtomicBool::new(false);

/// What a waiting process holds: its heap (mimalloc's committed bytes; before mimalloc came
/// up, what its tree granted the C library's heap, [`charge_c_library_heap`]), and the
/// mappings it made as ordinary memory to be taken over when its pager starts (`mmap`,
/// "deferred").
static HEAP_BYTES: AtomicUsize = AtomicUsize::new(0);
static MAPPED_BYTES: AtomicUsize = AtomicUsize::new(0);

/// The bytes of the mappings this process deferred while it waits.
pub fn mapped_bytes() -> usize {
    MAPPED_BYTES.load(Ordering::Acquire)
}

/// Memory a waiting process holds that no pager would manage: anonymous private mappings
/// smaller than `--min-size` (less those unmapped, by their length) and its own break. Not
/// charged (a starting pager takes none of it over), but counted toward the start: a
/// process measures and reports its unmanaged memory once its pager runs, and one that
/// held 100 MiB in 8 KiB mappings, or in its break, never started one: the run named none
/// of it, and `--strict` passed.
static SMALL_MAPPED_BYTES: AtomicUsize = AtomicUsize::new(0);
static BREAK_BYTES: AtomicUsize = AtomicUsize::new(0);

/// A waiting process mapped (`mapped`) or unmapped `len` bytes of anonymous memory too small
/// to manage; starts its pager once what it holds passes `USWAP_START_AFTER`.
pub fn note_small_mapping(len: usize, mapped: bool) {
    if mapped {
        SMALL_MAPPED_BYTES.fetch_add(len, Ordering::Relaxed);
        start_if_unmanaged_passes();
    } else {
        let _ = SMALL_MAPPED_BYTES.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |b| Some(b.saturating_sub(len)));
    }
}

/// The program's own break now spans `bytes`; starts its pager once what the process holds
/// passes `USWAP_START_AFTER`.
pub fn note_break(bytes: usize) {
    let before = BREAK_BYTES.swap(bytes, Ordering::Relaxed);
    if bytes > before {
        start_if_unmanaged_passes();
    }
}

fn start_if_unmanaged_passes() {
    let Some(cfg) = crate::config() else { return };
    let unmanaged_bytes = SMALL_MAPPED_BYTES.load(Ordering::Relaxed) + BREAK_BYTES.load(Ordering::Relaxed);
    if crate::is_waiting() && unmanaged_bytes.saturating_add(waiting_bytes()) >= cfg.start_after_bytes {
        crate::start_if_waiting(crate::StartCause::Unmanaged(unmanaged_bytes));
    }
}

/// What this process holds while it waits: its heap and its deferred mappings.
pub fn waiting_bytes() -> usize {
    HEAP_BYTES.load(Ordering::Acquire) + MAPPED_BYTES.load(Ordering::Acquire)
}

/// A waiting process's heap now holds `committed_bytes` (after a commit or a give-back, or
/// a grant of the C library's heap lowered):
/// charged with its deferred mappings ([`recharge`]). Returns whether the pager should
/// start now.
pub fn note_heap(committed_bytes: usize) -> bool {
    HEAP_BYTES.store(committed_bytes, Ordering::Release);
    recharge()
}

/// The tree is calm while what it holds (its charge, the asking process's included, and the
/// unmanaged memory its pagers measured) is under this share of its limit (a sixteenth): a
/// waiting process's C library heap may then grow past 2 MiB ([`charge_c_library_heap`]).
const CALM_SHARE_DIVISOR: usize = 16;

/// A waiting process's C library heap would hold `heap_bytes`, past its first 2 MiB
/// (`crate::heap`, "The C library's heap first"). Joins the tree if need be and charges the
/// heap there; returns whether the tree is calm ([`CALM_SHARE_DIVISOR`]). Then the heap may
/// stay the C library's: with no pager to come (a `sqlite3` of 380 MiB under `--limit
/// 64GiB`) the program keeps its own allocator's size classes. What the C library's heaps of
/// a tree's processes hold past their first 2 MiB when their pagers start stays outside the
/// budget for good, and the pagers count it as unmanaged: granted only while the tree's
/// charge and unmanaged memory are under a sixteenth of the limit, it is about that much
/// together (as of the pagers' last measures, once a second), below `uswap run`'s warning at
/// a tenth. False (the caller brings mimalloc up, as at 2 MiB before) in a `vfork` child, in
/// a signal handler (the join opens a file), after [`leave`], outside a tree, or with every
/// slot taken.
pub fn charge_c_library_heap(heap_bytes: usize) -> bool {
    if !crate::own_process::is_own_process()
        || !crate::is_waiting()
        || crate::in_signal_handler()
        || LEFT.load(Ordering::Acquire)
    {
        return false;
    }
    if SLOT.load(Ordering::Acquire).is_null() && (JOIN_FAILED.load(Ordering::Relaxed) || !join()) {
        return false;
    }
    HEAP_BYTES.store(heap_bytes, Ordering::Release);
    let Some(charge) = charge_slot() else { return false };
    // What the tree holds: its charge, and what its pagers measured outside it (among it,
    // the C library's heaps that their processes kept when their pagers started).
    let held_bytes = (charge.resident_pages.load(Ordering::Acquire) * uswap::PAGE_SIZE) as u64
        + charge.unmanaged_bytes.load(Ordering::Acquire);
    let limit_bytes = (charge.limit_pages.load(Ordering::Acquire) * uswap::PAGE_SIZE) as u64;
    held_bytes < limit_bytes / CALM_SHARE_DIVISOR as u64
}

/// Set by [`leave`] (the process is exiting or exec'ing): no join after it, from the
/// destructors that run after `exit`'s; cleared by [`exec_failed`].
static LEFT: AtomicBool = AtomicBool::new(false);

/// An `execve` returned (it failed): the process goes on, and may join again.
pub fn exec_failed() {
    if crate::own_process::is_own_process() {
        LEFT.store(false, Ordering::Release);
    }
}

/// The mappings a waiting process made as the kernel's, to be taken over when its pager
/// starts: `[start, end)` ranges (see the module's invariants), kept exact as the program
/// unmaps parts of them. [`NR_DEFERRED`] says whether there are any, so that a process with
/// none never takes the lock; [`MAPPED_BYTES`], their sum, is written under the lock.
static DEFERRED: Mutex<Vec<(usize, usize)>> = Mutex::new(Vec::new());
static NR_DEFERRED: AtomicUsize = AtomicUsize::new(0);
/// A pager's start took the ranges ([`take_deferred`]; set under the lock, never cleared):
/// from then on a change to them is made on the pager, once its start is done.
static TAKEN: AtomicBool = AtomicBool::new(false);
/// The most ranges noted by [`note_deferred`]; a mapping past them starts the pager. An
/// unmapping that splits a range may add one more; one that would pass that drops both
/// pieces (they stay the kernel's, uncharged, for good).
pub const MAX_DEFERRED: usize = 1024;

/// Whether another deferred mapping can be noted.
pub fn room_for_deferred() -> bool {
    NR_DEFERRED.load(Ordering::Acquire) < MAX_DEFERRED
}

/// Notes `[start, start + len_bytes)` (page-aligned), just mapped as the kernel's, as
/// deferred, and charges it with the heap. `None`, and nothing noted, when the table is
/// full; `Some(start_now)` otherwise: whether the pager should start now ([`recharge`]).
pub fn note_deferred(start: usize, len_bytes: usize) -> Option<bool> {
    {
        let _g = crate::own_code::Guard::enter();
        let mut deferred = DEFERRED.lock().unwrap_or_else(|e| e.into_inner());
        if deferred.len() >= MAX_DEFERRED || TAKEN.load(Ordering::Acquire) {
            // Full, or a pager's start (on another thread) took the ranges after this
            // mapping was planned: it would never be adopted.
            return None;
        }
        if deferred.capacity() == 0 {
            // Once: nothing is allocated under the lock after this.
            deferred.reserve_exact(MAX_DEFERRED + 1);
        }
        deferred.push((start, start + len_bytes));
        MAPPED_BYTES.fetch_add(len_bytes, Ordering::AcqRel);
        NR_DEFERRED.store(deferred.len(), Ordering::Release);
    }
    Some(recharge())
}

/// Whether `[start, start + len)` touches a deferred mapping.
pub fn overlaps_deferred(start: usize, len: usize) -> bool {
    if NR_DEFERRED.load(Ordering::Acquire) == 0 {
        return false;
    }
    let end = start.saturating_add(len);
    let deferred = DEFERRED.lock().unwrap_or_else(|e| e.into_inner());
    deferred.iter().any(|&(s, e)| s < end && start < e)
}

/// The program unmapped, replaced or changed `[start, start + len)` itself while it waits:
/// what of the deferred mappings lay there is no longer theirs (a range cut in the middle
/// becomes two), no longer charged, and stays the kernel's. The range is widened to whole
/// pages (the ranges stay page-aligned).
pub fn trim_deferred(start: usize, len: usize) {
    if NR_DEFERRED.load(Ordering::Acquire) == 0 {
        return;
    }
    let mut deferred = DEFERRED.lock().unwrap_or_else(|e| e.into_inner());
    let removed_bytes = cut_locked(&mut deferred, start, len);
    drop(deferred);
    if removed_bytes > 0 {
        let _ = recharge();
    }
}

/// [`cut_out`] of `[start, start + len)` widened to whole pages, with the sum and the count
/// brought up to date; the caller holds the lock. Returns the bytes no longer noted.
fn cut_locked(deferred: &mut Vec<(usize, usize)>, start: usize, len: usize) -> usize {
    let page_mask = uswap::PAGE_SIZE - 1;
    let end = start.saturating_add(len).saturating_add(page_mask) & !page_mask;
    let removed_bytes = cut_out(deferred, start & !page_mask, end);
    let _ = MAPPED_BYTES.fetch_update(Ordering::AcqRel, Ordering::Acquire, |m| Some(m.saturating_sub(removed_bytes)));
    NR_DEFERRED.store(deferred.len(), Ordering::Release);
    removed_bytes
}

/// Makes `call`, a system call of the program's that unmaps or changes `[start, start +
/// len)` while the process has no pager, in step with the deferred ranges: with the lock
/// held, so that a pager's start cannot take a range between the kernel's change and its
/// note here, and then cuts the range out of them if `changed(result, errno)` says the
/// kernel changed it. Returns the call's result and its errno (for the caller to leave to
/// the program: what follows may change it). `None`, and no call made, when a pager's start
/// has taken the ranges: the caller waits for the start (`crate::wait_for_start`) and makes
/// the call on the pager. A process with no ranges and no start makes the call unlocked.
pub fn call_on_deferred(
    start: usize,
    len: usize,
    call: impl FnOnce() -> i32,
    changed: impl FnOnce(i32, i32) -> bool,
) -> Option<(i32, i32)> {
    let errno = crate::real::errno;
    if NR_DEFERRED.load(Ordering::Acquire) == 0 && !crate::is_starting() && !TAKEN.load(Ordering::Acquire) {
        let r = call();
        return Some((r, errno()));
    }
    // Held across the system call: a signal that came during it is delivered as it returns,
    // and a handler of the program that maps or unmaps would wait on this thread's own lock.
    let _signals = uswap::sigbus::AsyncSignalsBlocked::new();
    let mut deferred = DEFERRED.lock().unwrap_or_else(|e| e.into_inner());
    if TAKEN.load(Ordering::Acquire) {
        return None;
    }
    let r = call();
    let e = errno();
    let removed_bytes = if changed(r, e) { cut_locked(&mut deferred, start, len) } else { 0 };
    drop(deferred);
    if removed_bytes > 0 {
        let _ = recharge();
    }
    Some((r, e))
}

/// Cuts `[start, end)` out of the ranges, in place, without allocating (a split inserts
/// only within the capacity reserved; past it, both pieces are dropped). Returns the bytes
/// no longer noted.
fn cut_out(ranges: &mut Vec<(usize, usize)>, start: usize, end: usize) -> usize {
    let mut removed_bytes = 0;
    let mut i = 0;
    // Bounded: each round moves past a range, or removes one.
    while i < ranges.len() {
        let (s, e) = ranges[i];
        if e <= start || end <= s {
            i += 1;
            continue;
        }
        removed_bytes += e.min(end) - s.max(start);
        match ((s < start).then_some((s, start)), (end < e).then_some((end, e))) {
            (Some(left), Some(right)) if ranges.len() < ranges.capacity() => {
                ranges[i] = left;
                ranges.insert(i + 1, right);
                i += 2;
            }
            (Some(left), Some(right)) => {
                removed_bytes += (left.1 - left.0) + (right.1 - right.0);
                ranges.remove(i);
            }
            (Some(piece), None) | (None, Some(piece)) => {
                ranges[i] = piece;
                i += 1;
            }
            (None, None) => {
                ranges.remove(i);
            }
        }
    }
    removed_bytes
}

/// A call that changes how memory is paged (`mremap`, `mmap(MAP_FIXED)`, `madvise` with
/// advice about forks or huge pages, `mlock`) on a deferred mapping: the pager starts first
/// and takes the mappings over, so that the call is made as on managed memory. If the start
/// was put off (the process still waits), what the call touches is no longer noted (it stays
/// the kernel's) and false is returned.
pub fn start_if_deferred(start: usize, len: usize) -> bool {
    if !crate::is_waiting() {
        // A start on another thread: the call is made on the pager it starts.
        crate::wait_for_start();
        return true;
    }
    if !overlaps_deferred(start, len) {
        return true;
    }
    crate::start_if_waiting(crate::StartCause::Mapping(len));
    if crate::is_waiting() {
        trim_deferred(start, len);
        return false;
    }
    true
}

/// The deferred table, locked (see [`hold_for_fork`]).
pub type DeferredHold = std::sync::MutexGuard<'static, Vec<(usize, usize)>>;

/// The deferred table, held across a `fork` (from the prepare handler to the parent's and
/// the child's, on the forking thread): no other thread is inside it when the child is made
/// (a `munmap` holds it across its system call), so the child never finds it locked.
pub fn hold_for_fork() -> DeferredHold {
    DEFERRED.lock().unwrap_or_else(|e| e.into_inner())
}

/// At the pager's start: the deferred mappings, handed over (`mmap::adopt_deferred`); they
/// are the pager's pages from now on.
pub fn take_deferred() -> Vec<(usize, usize)> {
    let mut deferred = DEFERRED.lock().unwrap_or_else(|e| e.into_inner());
    TAKEN.store(true, Ordering::Release);
    let taken = std::mem::take(&mut *deferred);
    MAPPED_BYTES.store(0, Ordering::Release);
    NR_DEFERRED.store(0, Ordering::Release);
    taken
}

/// Charges what the process holds ([`waiting_bytes`]) to the tree once past
/// [`CHARGED_AFTER_BYTES`], joining it first. Returns whether the pager should start now:
/// the join failed ([`unchargeable`]), or the tree's charge is at half its limit or more
/// ([`tree_wants_pagers`]).
fn recharge() -> bool {
    let committed_bytes = waiting_bytes();
    if crate::program_seccomp::filtered() {
        // A join's calls would be the filter's (see `program_seccomp`); it goes on uncharged.
        return false;
    }
    if !crate::own_process::is_own_process() || !crate::is_waiting() || LEFT.load(Ordering::Acquire) {
        // A vfork child: the memory and the slot are its parent's. A process whose pager
        // is starting: the pager claims the slot and charges what it takes over (a join
        // now would find that slot and overwrite the pager's charge). One that left (its
        // `exit`'s destructors): a slot taken now would outlive it.
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
    charge_slot().is_some() && tree_wants_pagers()
}

/// Charges [`waiting_bytes`] to this process's slot, once it has joined, and returns the
/// tree's charge. `None` with no slot: a pager's start on another thread (one the program
/// made without the interposed `pthread_create`) may have taken it over since it was read.
fn charge_slot() -> Option<&'static uswap::shared_charge::SharedCharge> {
    let slot = SLOT.load(Ordering::Acquire);
    let charge = crate::segment().filter(|_| !slot.is_null() && crate::is_waiting())?.charge();
    // SAFETY: a cell of the segment, which stays mapped for the life of the process.
    charge.set_charge_without_pager(unsafe { &*slot }, waiting_bytes() / uswap::PAGE_SIZE);
    Some(charge)
}

/// Why a waiting process whose charge says so ([`note_heap`], [`note_deferred`]) starts its
/// pager now: the tree's charge at half its limit, or nothing to charge it to.
pub(crate) fn start_cause() -> crate::StartCause {
    match unchargeable() {
        true => crate::StartCause::Unchargeable,
        false => crate::StartCause::TreeCharge,
    }
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
    if !crate::own_process::is_own_process() {
        return;
    }
    LEFT.store(true, Ordering::Release);
    if SLOT.swap(std::ptr::null_mut(), Ordering::AcqRel).is_null() {
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
    LEFT.store(false, Ordering::Release);
}

#[cfg(test)]
mod tests {
    use super::cut_out;

    #[test]
    fn cutting_out_splits_trims_and_drops_ranges_within_their_capacity() {
        let mut ranges = Vec::with_capacity(4);
        ranges.extend([(0x1000, 0x5000), (0x8000, 0x9000)]);
        assert_eq!(cut_out(&mut ranges, 0x2000, 0x3000), 0x1000, "a hole in the middle");
        assert_eq!(ranges, [(0x1000, 0x2000), (0x3000, 0x5000), (0x8000, 0x9000)]);
        assert_eq!(cut_out(&mut ranges, 0x4000, 0x8800), 0x1000 + 0x800, "a tail and a head");
        assert_eq!(ranges, [(0x1000, 0x2000), (0x3000, 0x4000), (0x8800, 0x9000)]);
        assert_eq!(cut_out(&mut ranges, 0x6000, 0x7000), 0, "nothing there");
        assert_eq!(cut_out(&mut ranges, 0, 0x10000), 0x1000 + 0x1000 + 0x800, "all of them");
        assert!(ranges.is_empty());
        // No room for a second piece: both go, and nothing is allocated.
        let mut full = Vec::with_capacity(1);
        full.push((0x1000, 0x4000));
        let capacity = full.capacity();
        let mut far = 0x10_0000;
        while full.len() < capacity {
            full.push((far, far + 0x1000));
            far += 0x2000;
        }
        assert_eq!(cut_out(&mut full, 0x2000, 0x3000), 0x3000);
        assert_eq!((full.len(), full.capacity()), (capacity - 1, capacity));
        assert!(full.iter().all(|&(s, _)| s >= 0x10_0000), "{full:?}");
    }
}
