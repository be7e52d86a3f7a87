//! The calls that lock memory (`mlock`, `mlock2`, `munlock`, `mlockall`, `munlockall`):
//! what they lock in managed memory is recorded for uswap's reclaim (`uswap::mlock`), which
//! the kernel's lock does not reach.
//!
//! Once signal mode has rewritten the C library's system calls (with a signal-mode pager),
//! every such call of the C library reaches the rewritten path (`uswap::syscall_guard`), which
//! calls [`before`] and [`after`] around it. Otherwise (thread mode, or a process still
//! waiting for its pager) the C library's functions are interposed here and do the same;
//! the kernel populates a lock through the handler threads as it does any fault. Before a
//! pager starts only `mlockall` is recorded (nothing is managed yet for a range to fall in).
//!
//! `mlock` is recorded before the call, so that the pages the slow path brings in for it
//! (the kernel populates a private writable mapping with write faults, which signal mode
//! cannot serve: the call failed with `ENOMEM`) stay in; a call that fails takes its record
//! back. The others are recorded once the kernel said yes.
//!
//! Runs on the program's thread, maybe in its signal handler: allocates nothing, takes no
//! lock the thread may hold (`uswap::mlock`'s writer flag is spun on a bounded number of
//! times), but for a process waiting for its pager that locks deferred memory
//! (`waiting_charge::start_if_deferred`: the pager starts first).

use std::sync::atomic::{AtomicBool, Ordering};

use libc::c_long;

/// `mlock2`'s flag: lock pages as they are faulted in, not now.
const MLOCK_ONFAULT: u64 = 1;

/// Before call `nr`: an `mlock` of managed memory is recorded.
/// Returns the range recorded, `[start, end)`.
pub fn before(nr: c_long, a: &[u64; 6]) -> Option<(usize, usize)> {
    if nr != libc::SYS_mlock && nr != libc::SYS_mlock2 {
        return None;
    }
    let (start, end) = (a[0] as usize, (a[0] as usize).saturating_add(a[1] as usize));
    lock_if_managed(uswap::mlock::LockKind::Program, start, end).then_some((start, end))
}

/// Records a lock of `kind` on `[start, end)` if any of it is managed memory; returns
/// whether it did (see `uswap::mlock`).
pub fn lock_if_managed(kind: uswap::mlock::LockKind, start: usize, end: usize) -> bool {
    uswap::memory_owner(start, end) == uswap::MemoryOwner::Managed && uswap::mlock::lock(kind, start, end)
}

/// Whether call `nr`'s memory is made ready first: not for a lock on fault (`mlock2` with
/// `MLOCK_ONFAULT`), which brings nothing in.
pub fn populates(nr: c_long, a: &[u64; 6]) -> bool {
    !(nr == libc::SYS_mlock2 && a[2] & MLOCK_ONFAULT != 0)
}

/// After call `nr` returned `ret`.
pub fn after(nr: c_long, a: &[u64; 6], ret: c_long, recorded: Option<(usize, usize)>) {
    match nr {
        libc::SYS_mlock | libc::SYS_mlock2 => {
            if let (Some((start, end)), true) = (recorded, ret != 0) {
                uswap::unlock_memory(uswap::mlock::LockKind::Program, start, end);
            }
        }
        libc::SYS_munlock if ret == 0 => {
            let start = a[0] as usize;
            uswap::unlock_memory(uswap::mlock::LockKind::Program, start, start.saturating_add(a[1] as usize));
        }
        libc::SYS_mlockall if ret == 0 && a[0] & (libc::MCL_CURRENT | libc::MCL_FUTURE) as u64 != 0 => {
            uswap::lock_all_memory();
            say_lock_all_once();
            if uswap::lock_all_brought_nothing_in() {
                say_nothing_brought_in_once();
            }
        }
        libc::SYS_munlockall if ret == 0 => uswap::unlock_all_memory(),
        _ => {}
    }
}

fn say_lock_all_once() {
    static SAID: AtomicBool = AtomicBool::new(false);
    say_once(
        &SAID,
        &[
            b"uswap: mlockall: this process's managed memory is no longer paged out (over its limit if need be, ",
            b"counted in limit_overrun); pages out already come back on their next touch\n",
        ],
    );
}

fn say_nothing_brought_in_once() {
    static SAID: AtomicBool = AtomicBool::new(false);
    say_once(
        &SAID,
        &[
            b"uswap: mlockall: /proc/self/maps could not be read, so the program's memory is locked as it is ",
            b"touched (MCL_ONFAULT), not brought in now\n",
        ],
    );
}

/// Writes `parts` as one line on stderr, the first time only (`said`). Allocation-free.
fn say_once(said: &AtomicBool, parts: &[&[u8]]) {
    if said.swap(true, Ordering::Relaxed) {
        return;
    }
    let mut line = uswap::sigbus::StderrLine::default();
    for part in parts {
        line.put(part);
    }
    line.write();
}

/// Calls `nr` with [`before`] and [`after`] around it, unless the rewritten system-call
/// path does that (signal mode, once the C library is rewritten): then the call is only made.
fn interposed(nr: c_long, a: [u64; 6]) -> libc::c_int {
    let here = !uswap::syscall_guard::started();
    let recorded = if here { before(nr, &a) } else { None };
    let ret = match nr {
        // The engine's mappings kept out of the program's lock (see `uswap::mlockall`; the
        // rewritten path does the same).
        libc::SYS_mlockall if here => uswap::mlockall(a[0]),
        libc::SYS_munlockall if here => uswap::munlockall(),
        // SAFETY: the memory-locking system calls; the kernel validates every argument.
        _ => match unsafe { libc::syscall(nr, a[0], a[1], a[2]) } {
            -1 => -(std::io::Error::last_os_error().raw_os_error().unwrap_or(libc::EINVAL) as c_long),
            r => r,
        },
    };
    if here {
        after(nr, &a, ret, recorded);
    }
    if ret < 0 {
        // This thread's errno, as the C library's function would set it.
        crate::real::set_errno(-ret as libc::c_int);
        return -1;
    }
    ret as libc::c_int
}

#[no_mangle]
pub extern "C" fn mlock(addr: *const libc::c_void, len: usize) -> libc::c_int {
    // A deferred mapping of a waiting process is locked as managed memory (recorded).
    crate::waiting_charge::start_if_deferred(addr as usize, len);
    interposed(libc::SYS_mlock, [addr as u64, len as u64, 0, 0, 0, 0])
}

#[no_mangle]
pub extern "C" fn mlock2(addr: *const libc::c_void, len: usize, flags: libc::c_uint) -> libc::c_int {
    crate::waiting_charge::start_if_deferred(addr as usize, len);
    interposed(libc::SYS_mlock2, [addr as u64, len as u64, flags as u64, 0, 0, 0])
}

#[no_mangle]
pub extern "C" fn munlock(addr: *const libc::c_void, len: usize) -> libc::c_int {
    interposed(libc::SYS_munlock, [addr as u64, len as u64, 0, 0, 0, 0])
}

#[no_mangle]
pub extern "C" fn mlockall(flags: libc::c_int) -> libc::c_int {
    interposed(libc::SYS_mlockall, [flags as u64, 0, 0, 0, 0, 0])
}

#[no_mangle]
pub extern "C" fn munlockall() -> libc::c_int {
    interposed(libc::SYS_munlockall, [0; 6])
}
