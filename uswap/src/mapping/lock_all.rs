//! The program's `mlockall` and `munlockall` in a process where the engine has mappings of
//! its own. The kernel's `mlockall(MCL_CURRENT)` locks every mapping of the process and
//! brings every page of them in, the engine's too, and the engine reserves address space it
//! fills only as it needs it: the compressed pool's arena, the swap cache's staging area,
//! tables sized for a terabyte. `stress-ng --mlock` under `uswap run --limit 96MiB` spent
//! 19 s in one `mlockall(MCL_CURRENT | MCL_FUTURE)`, which left 12.9 GB resident; with
//! `MCL_FUTURE` in force before the pager started, the pager's own mappings were each brought
//! in whole as they were made. [`mlockall`] locks what the kernel would, except:
//!
//! * the engine's data ([`super::engine_ranges`]'s data ranges) is not locked: nothing of it
//!   is brought in, the pool can still give memory back (`MADV_DONTNEED` refuses a locked
//!   mapping), and it holds the program's pages only as copies uswap's own lock keeps from
//!   being needed (`crate::mlock`: reclaim stops while an `mlockall` holds);
//! * a reservation noted with [`note_lock_on_fault`] (`uswap run`'s heap, mostly untouched
//!   address space the program never asked for) is locked on fault: its pages are locked
//!   as they are touched, and making more of it usable (`mprotect`) brings nothing in;
//! * with `MCL_FUTURE` in force, the engine's new mappings are unlocked before they are made
//!   accessible, and application regions the engine maps are locked on fault
//!   (`Mapping::fresh` asks [`must_unlock`]).
//!
//! How: the kernel's `mlockall` with `MCL_ONFAULT` added locks every mapping and brings
//! nothing in; the engine's data is then unlocked, and, unless the program asked for
//! `MCL_ONFAULT`, each of the program's mappings is locked again without it (`mlock2`),
//! which brings it in as the kernel's `MCL_CURRENT` would, errors ignored as the kernel
//! ignores them there (a page it cannot bring in is locked when touched).
//!
//! An engine mapping made while a call is under way (a pager starting on another thread) is
//! made inaccessible, noted as the engine's, then unlocked if a call began meanwhile
//! ([`must_unlock`]), before it is made accessible: a call's unlocking pass either sees it
//! noted or began after the mapping's own check, which then unlocks it. Left open: the walk
//! may read a line for such a mapping before it is noted and lock it just after it became
//! accessible (a window of a few system calls, between two threads' `mlockall` and a
//! pager's start).
//!
//! Not covered: an `mlockall` made with `syscall(2)` or the raw instruction in thread mode
//! (neither is interposed for it): the kernel's, as before. If `/proc/self/maps` cannot be
//! read, the program's memory is locked as it is touched, not brought in
//! ([`lock_all_brought_nothing_in`] says so).
//!
//! Locking: the calls are serialised, as the kernel serialises them on the address space's
//! lock, by [`CALLING`], a flag a call waits for (sleeping, [`MAX_WAIT_MS`] times a
//! millisecond at most; then it goes on unserialised) and a fork child clears (a std mutex held
//! by another thread at a fork would stay held in the child for good). Taken on the
//! program's thread only, never on a fault path; the walk's population in thread mode waits
//! for the handler threads, which never take it. The other flags are atomics.
//! Allocation-free (it runs in the system-call guard's slow path): `/proc/self/maps` is read
//! a buffer at a time.

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};

use libc::{c_long, MCL_CURRENT, MCL_FUTURE, MCL_ONFAULT};

/// Whether an `mlockall(MCL_FUTURE)` of the program's holds: new mappings are locked (set
/// before the call is made, taken back if it fails).
static FUTURE: AtomicBool = AtomicBool::new(false);
/// The reservation locked on fault ([`note_lock_on_fault`]), `[start, end)`; empty if none.
static ON_FAULT: (AtomicUsize, AtomicUsize) = (AtomicUsize::new(0), AtomicUsize::new(0));
/// Calls begun (`EPOCH`) and under way (`UNDER_WAY`): see [`must_unlock`].
static EPOCH: AtomicU64 = AtomicU64::new(0);
static UNDER_WAY: AtomicUsize = AtomicUsize::new(0);
/// Whether a call could not read the process's mappings, and so brought nothing in.
static NOTHING_BROUGHT_IN: AtomicBool = AtomicBool::new(false);
/// One call at a time (see the module's comment).
static CALLING: AtomicBool = AtomicBool::new(false);
/// How long a call waits for another's end, in sleeps of a millisecond (at least that many
/// milliseconds): more than a walk that brings in GiBs takes.
const MAX_WAIT_MS: u32 = 30_000;

/// A call's turn ([`CALLING`]), given back when dropped; `held` false if the wait ran out.
struct OneCall {
    held: bool,
}

impl OneCall {
    fn enter() -> OneCall {
        for _ in 0..MAX_WAIT_MS {
            if CALLING.compare_exchange(false, true, Ordering::Acquire, Ordering::Relaxed).is_ok() {
                return OneCall { held: true };
            }
            // The system call itself: the C library's `nanosleep` is a cancellation point,
            // and a thread cancelled here would unwind out of an `extern "C"` function.
            let ms = libc::timespec { tv_sec: 0, tv_nsec: 1_000_000 };
            // SAFETY: reads the timespec above; writes nothing (no remainder asked for).
            unsafe {
                libc::syscall(libc::SYS_nanosleep, &ms as *const libc::timespec, std::ptr::null_mut::<libc::timespec>())
            };
        }
        OneCall { held: false }
    }
}

impl Drop for OneCall {
    fn drop(&mut self) {
        if self.held {
            CALLING.store(false, Ordering::Release);
        }
    }
}

/// `[start, start + len)`, a reservation of the program's that an `mlockall` locks on fault
/// only (see the module's comment); one per process, the last noted.
pub fn note_lock_on_fault(start: usize, len: usize) {
    ON_FAULT.0.store(start, Ordering::Relaxed);
    ON_FAULT.1.store(start.saturating_add(len), Ordering::Release);
}

/// The calls begun so far: what a new mapping reads before it is made, for [`must_unlock`].
pub(super) fn epoch() -> u64 {
    EPOCH.load(Ordering::SeqCst)
}

/// Whether a mapping made inaccessible after [`epoch`] returned `epoch`, and noted as the
/// engine's since, must be unlocked before it is made accessible: the program's
/// `MCL_FUTURE` holds (the kernel locked it), or a call began or is under way (its
/// `MCL_CURRENT` may have locked it before its unlocking pass could see it noted).
pub(super) fn must_unlock(epoch: u64) -> bool {
    FUTURE.load(Ordering::SeqCst) || UNDER_WAY.load(Ordering::SeqCst) > 0 || EPOCH.load(Ordering::SeqCst) != epoch
}

/// Whether an `mlockall(MCL_CURRENT)` could not read the process's mappings (no `/proc`,
/// no descriptor left): it locked the program's memory on fault and brought nothing in.
pub fn lock_all_brought_nothing_in() -> bool {
    NOTHING_BROUGHT_IN.load(Ordering::Relaxed)
}

/// A fork child inherits no `MCL_FUTURE` (mlockall(2)), nor a call of another thread's.
pub(crate) fn forget_in_fork_child() {
    FUTURE.store(false, Ordering::Release);
    CALLING.store(false, Ordering::Release);
    UNDER_WAY.store(0, Ordering::Release);
}

/// The program's `mlockall(flags)`, as described in the module's comment. Returns what the
/// system call would: 0, or a negated `errno`.
pub fn mlockall(flags: u64) -> c_long {
    let _one = OneCall::enter();
    UNDER_WAY.fetch_add(1, Ordering::SeqCst);
    EPOCH.fetch_add(1, Ordering::SeqCst);
    let r = lock_all(flags);
    UNDER_WAY.fetch_sub(1, Ordering::SeqCst);
    r
}

/// [`mlockall`]'s work, its call serialised and counted under way.
fn lock_all(flags: u64) -> c_long {
    let (current, future) = (flags & MCL_CURRENT as u64 != 0, flags & MCL_FUTURE as u64 != 0);
    let had_future = FUTURE.load(Ordering::SeqCst);
    // Before the call: an engine mapping made meanwhile is made as under `MCL_FUTURE`.
    FUTURE.store(had_future || future, Ordering::SeqCst);
    if !current {
        let r = raw(libc::SYS_mlockall, flags, 0, 0);
        FUTURE.store(if r == 0 { future } else { had_future }, Ordering::SeqCst);
        return r;
    }
    let r = raw(libc::SYS_mlockall, flags | MCL_ONFAULT as u64, 0, 0);
    if r != 0 {
        FUTURE.store(had_future, Ordering::SeqCst);
        return r;
    }
    let on_fault = flags & MCL_ONFAULT as u64 != 0;
    if future && !on_fault {
        // New mappings brought in when made, as the program asked: `MCL_FUTURE` alone
        // changes only that, no mapping.
        raw(libc::SYS_mlockall, MCL_FUTURE as u64, 0, 0);
    }
    FUTURE.store(future, Ordering::SeqCst);
    super::engine_ranges::for_each_engine_data(|start, end| {
        raw(libc::SYS_munlock, start as u64, (end - start) as u64, 0);
    });
    if !on_fault {
        let read = super::probe::for_each_self_mapping(|start, end| {
            if !super::engine_ranges::is_engine_data(start, end) && !overlaps_on_fault(start, end) {
                // Errors ignored, as the kernel's `MCL_CURRENT` ignores them.
                raw(libc::SYS_mlock2, start as u64, (end - start) as u64, 0);
            }
        });
        NOTHING_BROUGHT_IN.fetch_or(!read, Ordering::Relaxed);
    }
    0
}

/// The program's `munlockall()`: the kernel's, and no `MCL_FUTURE` holds any more.
pub fn munlockall() -> c_long {
    let _one = OneCall::enter();
    let r = raw(libc::SYS_munlockall, 0, 0, 0);
    if r == 0 {
        FUTURE.store(false, Ordering::SeqCst);
    }
    r
}

fn overlaps_on_fault(start: usize, end: usize) -> bool {
    let (s, e) = (ON_FAULT.0.load(Ordering::Relaxed), ON_FAULT.1.load(Ordering::Acquire));
    s < end && start < e
}

/// A memory-locking system call; 0 or a negated `errno`.
fn raw(nr: c_long, a0: u64, a1: u64, a2: u64) -> c_long {
    // SAFETY: mlockall, munlockall, mlock2 and munlock change how memory is kept, never
    // what is mapped; the kernel checks every argument.
    let r = unsafe { libc::syscall(nr, a0, a1, a2) };
    if r == -1 {
        -(std::io::Error::last_os_error().raw_os_error().unwrap_or(libc::EINVAL) as c_long)
    } else {
        r
    }
}
