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
//!   accessible (`Mapping::fresh` asks [`future_locked`]).
//!
//! How: the kernel's `mlockall` with `MCL_ONFAULT` added locks every mapping and brings
//! nothing in; the engine's data is then unlocked, and, unless the program asked for
//! `MCL_ONFAULT`, each of the program's mappings is locked again without it (`mlock2`),
//! which brings it in as the kernel's `MCL_CURRENT` would, errors ignored as the kernel
//! ignores them there (a page it cannot bring in is locked when touched).
//!
//! Not covered: an `mlockall` made with the raw system call in thread mode (not interposed):
//! the kernel's, as before.
//!
//! Locking: none; the flags are atomics. Allocation-free (it runs in the system-call guard's
//! slow path): `/proc/self/maps` is read a buffer at a time.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

use libc::{c_long, MCL_CURRENT, MCL_FUTURE, MCL_ONFAULT};

/// Whether an `mlockall(MCL_FUTURE)` of the program's holds: new mappings are locked.
static FUTURE: AtomicBool = AtomicBool::new(false);
/// The reservation locked on fault ([`note_lock_on_fault`]), `[start, end)`; empty if none.
static ON_FAULT: (AtomicUsize, AtomicUsize) = (AtomicUsize::new(0), AtomicUsize::new(0));

/// `[start, start + len)`, a reservation of the program's that an `mlockall` locks on fault
/// only (see the module's comment); one per process, the last noted.
pub fn note_lock_on_fault(start: usize, len: usize) {
    ON_FAULT.0.store(start, Ordering::Relaxed);
    ON_FAULT.1.store(start.saturating_add(len), Ordering::Release);
}

/// Whether the program's `MCL_FUTURE` holds (new mappings are locked by the kernel).
pub(super) fn future_locked() -> bool {
    FUTURE.load(Ordering::Acquire)
}

/// A fork child inherits no `MCL_FUTURE` (mlockall(2)).
pub(crate) fn forget_in_fork_child() {
    FUTURE.store(false, Ordering::Release);
}

/// The program's `mlockall(flags)`, as described in the module's comment. Returns what the
/// system call would: 0, or a negated `errno`.
pub fn mlockall(flags: u64) -> c_long {
    let (current, future) = (flags & MCL_CURRENT as u64 != 0, flags & MCL_FUTURE as u64 != 0);
    let had_future = FUTURE.load(Ordering::Acquire);
    // Before the call: an engine mapping made meanwhile is made as under `MCL_FUTURE`.
    FUTURE.store(had_future || future, Ordering::Release);
    if !current {
        let r = raw(libc::SYS_mlockall, flags, 0, 0);
        FUTURE.store(if r == 0 { future } else { had_future }, Ordering::Release);
        return r;
    }
    let r = raw(libc::SYS_mlockall, flags | MCL_ONFAULT as u64, 0, 0);
    if r != 0 {
        FUTURE.store(had_future, Ordering::Release);
        return r;
    }
    let on_fault = flags & MCL_ONFAULT as u64 != 0;
    if future && !on_fault {
        // New mappings brought in when made, as the program asked: `MCL_FUTURE` alone
        // changes only that, no mapping.
        raw(libc::SYS_mlockall, MCL_FUTURE as u64, 0, 0);
    }
    FUTURE.store(future, Ordering::Release);
    super::engine_ranges::for_each_engine_data(|start, end| {
        raw(libc::SYS_munlock, start as u64, (end - start) as u64, 0);
    });
    if !on_fault {
        super::probe::for_each_self_mapping(|start, end| {
            if !super::engine_ranges::is_engine_data(start, end) && !overlaps_on_fault(start, end) {
                // Errors ignored, as the kernel's `MCL_CURRENT` ignores them.
                raw(libc::SYS_mlock2, start as u64, (end - start) as u64, 0);
            }
        });
    }
    0
}

/// The program's `munlockall()`: the kernel's, and no `MCL_FUTURE` holds any more.
pub fn munlockall() -> c_long {
    let r = raw(libc::SYS_munlockall, 0, 0, 0);
    if r == 0 {
        FUTURE.store(false, Ordering::Release);
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
