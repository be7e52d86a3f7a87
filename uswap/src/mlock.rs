//! Locked memory: the ranges a program locked with `mlock`, `mlock2` or `mlockall`, which
//! reclaim leaves resident, as the kernel keeps `VM_LOCKED` pages off its swap (its
//! unevictable LRU).
//!
//! Why: a program locks memory so that it is never written to swap (keys, passwords) or
//! never waits for a page (a latency-bound server). The kernel's lock does not reach
//! uswap's reclaim, which would pick such pages as victims like any other: the kernel
//! refuses to move a page out of a locked mapping (`UFFDIO_MOVE` fails with `EINVAL`), and
//! each refusal left the charge over the limit (`limit_overrun`). So the calls that lock and unlock (`uswap run`'s library sees every one
//! the C library makes) record what they locked here, and reclaim asks [`is_locked`] of each
//! victim and leaves a locked one in, off the LRU (`Pte::unevictable`, the kernel's
//! unevictable list: rotated on the LRU instead, a few locked pages in a short list were
//! picked again and again and reclaim made no progress); an unlock puts them back
//! (`crate::unlock_memory`). Locked pages stay charged: above the limit if the program
//! locks more than it (counted in `limit_overrun`, as any charge reclaim cannot make room
//! for).
//!
//! Two kinds of lock share the table ([`LockKind`]): the program's own (`mlock`), and the
//! alternate signal stacks `uswap run`'s library keeps in ([`LockKind::AltStack`]), so that
//! an `munlock` of the program's ends only its own locks.
//!
//! What is locked: up to [`NR_RANGES`] page-aligned `[start, end)` ranges, and everything
//! while an `mlockall` holds ([`lock_all`]: the kernel's `MCL_FUTURE` locks what is mapped
//! later too, and its `MCL_CURRENT` what is mapped now; both are taken as every managed
//! page). `munlock` shrinks, splits or frees ranges; a lock ends where its memory is
//! unmapped, and a region mapped anew starts unlocked (`unlock` from the region's insertion
//! and the unmap event), as in the kernel; a fork child inherits no lock ([`forget`]).
//! A lock the table has no room for is not honoured: counted (`mlock_unhonoured`) and said
//! once on stderr.
//!
//! Ordering, as for pins (`crate::pin`): a locker stores its range, then a `SeqCst` fence,
//! then brings the pages in; reclaim sets a victim's busy bit, then a fence, then reads the
//! table. A range's two bounds are written so that a reader racing the writer sees the old
//! range, the new one, or an empty one, never more than either: a free entry is `[0, 0)`, a
//! new range stores its start before its end, a freed one its end (0) first, and a changed
//! one only shrinks.
//!
//! Locking: writers take [`WRITER`], a flag they spin on a bounded number of times (calls
//! that lock are rare, and made one at a time by a program); readers take nothing and
//! allocate nothing (reclaim, signal handlers).

use std::sync::atomic::{fence, AtomicBool, AtomicUsize, Ordering};

use crate::uffd::PAGE_SIZE;

/// Locked ranges the table holds apart.
pub const NR_RANGES: usize = 128;

/// What locked a range.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LockKind {
    /// The program: `mlock`, `mlock2`.
    Program = 1,
    /// A thread's alternate signal stack in managed memory (`uswap run`'s library).
    AltStack = 2,
}

/// `[start, end, kind]` per entry; `[0, 0, _]` is free. The kind is written before the
/// range is and read only by writers.
static RANGES: [[AtomicUsize; 3]; NR_RANGES] =
    [const { [AtomicUsize::new(0), AtomicUsize::new(0), AtomicUsize::new(0)] }; NR_RANGES];
/// One past the highest entry ever used: readers look no further.
static HIGH: AtomicUsize = AtomicUsize::new(0);
/// An `mlockall` holds: every managed page is locked.
static ALL: AtomicBool = AtomicBool::new(false);
/// Held by the one thread changing [`RANGES`].
static WRITER: AtomicBool = AtomicBool::new(false);
/// Attempts at [`WRITER`] before a change gives up (about a millisecond of spinning).
const WRITER_ATTEMPTS: usize = 1 << 16;

/// Whether a lock covers the page at `addr`. Called by reclaim after it set the page's busy
/// bit (the fence orders that store before the reads of the table).
pub(crate) fn is_locked(addr: usize) -> bool {
    fence(Ordering::SeqCst);
    covers(addr)
}

/// [`is_locked`] without its fence, for a caller that issued one (`pin::hold_of`).
pub(crate) fn covers(addr: usize) -> bool {
    if ALL.load(Ordering::Relaxed) {
        return true;
    }
    let high = HIGH.load(Ordering::Relaxed).min(NR_RANGES);
    RANGES[..high].iter().any(|[s, e, _]| (s.load(Ordering::Relaxed)..e.load(Ordering::Relaxed)).contains(&addr))
}

/// Whether a lock of `kind` covers the page at `addr`: a query outside reclaim (`uswap
/// run`'s `mremap` carries a program's lock to the range it moves). Allocation-free.
pub fn covered_by(kind: LockKind, addr: usize) -> bool {
    let high = HIGH.load(Ordering::Acquire).min(NR_RANGES);
    RANGES[..high].iter().any(|[s, e, k]| {
        k.load(Ordering::Relaxed) == kind as usize
            && (s.load(Ordering::Relaxed)..e.load(Ordering::Relaxed)).contains(&addr)
    })
}

/// The table's writer section; released on drop.
struct Writer;

impl Writer {
    fn enter() -> Option<Writer> {
        // Bounded: WRITER_ATTEMPTS tries.
        for _ in 0..WRITER_ATTEMPTS {
            if WRITER.compare_exchange_weak(false, true, Ordering::Acquire, Ordering::Relaxed).is_ok() {
                return Some(Writer);
            }
            std::hint::spin_loop();
        }
        None
    }
}

impl Drop for Writer {
    fn drop(&mut self) {
        WRITER.store(false, Ordering::Release);
    }
}

/// Records that `[start, end)` (rounded out to pages) is locked. Returns false where it
/// could not be recorded (the table full, or its writer stuck): the lock is then not
/// honoured, counted and said once. Allocation-free.
pub fn lock(kind: LockKind, start: usize, end: usize) -> bool {
    let (start, end) = (start & !(PAGE_SIZE - 1), end.next_multiple_of(PAGE_SIZE));
    if end <= start {
        return true;
    }
    let recorded = Writer::enter().is_some_and(|_w| add(kind, start, end));
    if !recorded {
        unhonoured();
    }
    fence(Ordering::SeqCst);
    recorded
}

/// Adds `[start, end)` as an entry of its own (writer section held).
fn add(kind: LockKind, start: usize, end: usize) -> bool {
    let free = |[s, e, _]: &[AtomicUsize; 3]| s.load(Ordering::Relaxed) == 0 && e.load(Ordering::Relaxed) == 0;
    let Some(i) = RANGES.iter().position(free) else {
        return false;
    };
    RANGES[i][2].store(kind as usize, Ordering::Relaxed);
    RANGES[i][0].store(start, Ordering::Relaxed);
    RANGES[i][1].store(end, Ordering::Release);
    HIGH.fetch_max(i + 1, Ordering::Relaxed);
    true
}

/// Ends the locks of `kind` (every kind: `None`) on `[start, end)` (rounded out to pages):
/// `munlock`, an alternate stack replaced, an unmap, a region mapped anew. A range that
/// covers it on both sides is split in two. The pages reclaim took off the LRU are the
/// caller's to put back (`crate::unlock_memory`).
pub(crate) fn unlock(kind: Option<LockKind>, start: usize, end: usize) {
    let (start, end) = (start & !(PAGE_SIZE - 1), end.next_multiple_of(PAGE_SIZE));
    if end <= start || HIGH.load(Ordering::Relaxed) == 0 {
        return;
    }
    let Some(_w) = Writer::enter() else {
        unhonoured();
        return;
    };
    let high = HIGH.load(Ordering::Relaxed).min(NR_RANGES);
    for [s, e, k] in &RANGES[..high] {
        let (s_addr, e_addr) = (s.load(Ordering::Relaxed), e.load(Ordering::Relaxed));
        let entry_kind = k.load(Ordering::Relaxed);
        if e_addr <= start || end <= s_addr || kind.is_some_and(|kind| kind as usize != entry_kind) {
            continue;
        }
        if start <= s_addr && e_addr <= end {
            e.store(0, Ordering::Relaxed);
            s.store(0, Ordering::Relaxed);
        } else if start <= s_addr {
            s.store(end, Ordering::Relaxed);
        } else {
            e.store(start, Ordering::Relaxed);
            let entry_kind =
                if entry_kind == LockKind::AltStack as usize { LockKind::AltStack } else { LockKind::Program };
            if end < e_addr && !add(entry_kind, end, e_addr) {
                // No room for the right part: it loses its lock, said.
                unhonoured();
            }
        }
    }
}

/// `mlockall` (`on`) or `munlockall` (off: the program's ranges too).
pub(crate) fn lock_all(on: bool) {
    ALL.store(on, Ordering::Relaxed);
    if !on {
        forget(Some(LockKind::Program));
    }
    fence(Ordering::SeqCst);
}

/// A fork child (its one thread, before it runs) inherits no memory lock, and no writer: a
/// thread of its parent's (the event thread, unlocking an unmapped range) may have held
/// [`WRITER`] at the fork, and every lock of the child's then gave up.
pub(crate) fn forget_in_fork_child() {
    WRITER.store(false, Ordering::Release);
    forget(None);
}

/// Every lock of `kind` (every kind: `None`) ends: `munlockall`; and every lock of a fork
/// child, which inherits none (its thread's alternate stack is locked again).
pub(crate) fn forget(kind: Option<LockKind>) {
    if kind.is_none() {
        ALL.store(false, Ordering::Relaxed);
    }
    let high = HIGH.load(Ordering::Relaxed).min(NR_RANGES);
    for [s, e, k] in &RANGES[..high] {
        if kind.is_none_or(|kind| kind as usize == k.load(Ordering::Relaxed)) {
            e.store(0, Ordering::Relaxed);
            s.store(0, Ordering::Relaxed);
        }
    }
}

fn unhonoured() {
    crate::stats::note_syscall(crate::stats::SyscallEvent::MlockUnhonoured);
    static SAID: AtomicBool = AtomicBool::new(false);
    if !SAID.swap(true, Ordering::Relaxed) {
        crate::uffd::sigbus::StderrLine::default()
            .put(b"uswap: a lock of managed memory (mlock) could not be recorded: its pages may be swapped out ")
            .put(b"(counted in mlock_unhonoured)\n")
            .write();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // One test: the table is the process's.
    #[test]
    fn locks_cover_their_ranges_and_unlock_shrinks_splits_and_frees_them() {
        let base = 0x6000_0000_0000usize;
        let page = |i: usize| base + i * PAGE_SIZE;
        assert!(!is_locked(page(0)));
        assert!(lock(LockKind::Program, page(0) + 5, page(10) - 3));
        assert!((0..10).all(|i| is_locked(page(i))) && !is_locked(page(10)));
        // Split: pages 3 and 4 unlocked, the rest kept.
        unlock(Some(LockKind::Program), page(3), page(5));
        assert!((0..3).chain(5..10).all(|i| is_locked(page(i))));
        assert!(!is_locked(page(3)) && !is_locked(page(4)));
        // Shrunk from the left and from the right.
        unlock(Some(LockKind::Program), page(0), page(1));
        unlock(Some(LockKind::Program), page(9), page(12));
        assert!(!is_locked(page(0)) && is_locked(page(1)) && is_locked(page(8)) && !is_locked(page(9)));
        // Freed whole.
        unlock(None, page(0), page(20));
        assert!((0..20).all(|i| !is_locked(page(i))));
        // An unlock of one kind leaves the other's.
        assert!(lock(LockKind::AltStack, page(30), page(32)));
        unlock(Some(LockKind::Program), page(30), page(32));
        assert!(is_locked(page(31)));
        unlock(Some(LockKind::AltStack), page(31), page(32));
        assert!(is_locked(page(30)) && !is_locked(page(31)));
        forget(None);
        assert!(!is_locked(page(30)));
        // mlockall covers everything until munlockall, which ends every range too.
        assert!(lock(LockKind::Program, page(100), page(101)));
        lock_all(true);
        assert!(is_locked(page(50)) && is_locked(page(100)));
        lock_all(false);
        assert!(!is_locked(page(50)) && !is_locked(page(100)));
        // A full table: the lock is not honoured, and counted.
        let before = crate::stats::syscall_events()[crate::stats::SyscallEvent::MlockUnhonoured as usize];
        for i in 0..NR_RANGES {
            assert!(lock(LockKind::Program, page(2 * i), page(2 * i + 1)), "range {i}");
        }
        assert!(!lock(LockKind::Program, page(4 * NR_RANGES), page(4 * NR_RANGES + 1)));
        assert!(!is_locked(page(4 * NR_RANGES)));
        let after = crate::stats::syscall_events()[crate::stats::SyscallEvent::MlockUnhonoured as usize];
        assert_eq!(after, before + 1);
        forget(None);
        assert!((0..2 * NR_RANGES).all(|i| !is_locked(page(i))));
    }
}
