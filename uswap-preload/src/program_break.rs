//! The program's own break: `brk`, `sbrk` and `syscall(SYS_brk)`, interposed.
//!
//! Why: the real break is the heap of the C library's malloc, which serves uswap's own
//! allocations, from the engine's threads too (one arena, see `prepare` in the crate's
//! root). A program that moves its break itself cut those threads' blocks: stress-ng's brk
//! stressor grows its break a page at a time and sets it back where it began at its first
//! `ENOMEM`, which gave back what malloc had grown in between (the stressor died of SIGSEGV,
//! then of "realloc(): invalid next size"); without uswap it has no other thread. So in a
//! process this library serves, the program's first call gives it a break of its own, at
//! the start of an inaccessible reservation of its own ([`reservation_bytes`]), which the
//! calls move as the kernel moves the real one, with system calls of their own: growing
//! makes the pages up to the new break accessible (`mprotect`); shrinking maps fresh
//! inaccessible memory over the pages given back, so that they read zero when the break
//! grows over them again, as after the kernel's unmap. A move past the reservation's end or
//! past the data limit the program set fails with `ENOMEM` (checked here: the kernel's
//! data limit is raised by uswap's own reservations, see `rlimit`); a move below the
//! break's start changes nothing and succeeds, as the C library's `brk` reports the
//! kernel's refusal. The break's memory is ordinary memory, outside the budget as the real
//! break was, and reported as the program's break (`unmanaged`). What differs from the
//! kernel's: the break starts a page into the reservation, not at the end of the program's
//! data (no program may assume either; the page below it is accessible, as the data's end
//! is), and the first call, even `sbrk(0)` (libiberty's, in every GCC tool), maps the
//! reservation: a system call, address space, no pager.
//!
//! The C library's own `__sbrk` (its malloc's) is not interposed: its internal calls do not
//! go through the symbol. A process where the library stands aside (`USWAP_DISABLE`, a
//! program with an allocator of its own) keeps the kernel's break, and so does one that
//! used the kernel's break before this library was set up.
//!
//! State: the break, under a lock of its own, taken by these calls and across a `fork`
//! (`fork`: no thread is inside when the child is made, and both sides let go of it). Only
//! system calls are made under it. The reservation's place is also kept in atomics, for the
//! report of unmanaged memory and the program's `munmap`, which read it without the lock;
//! its size is noted for the address-space limit (`rlimit`).

use std::cell::UnsafeCell;
use std::ffi::{c_int, c_long, c_void};
use std::sync::atomic::{AtomicBool, AtomicPtr, AtomicUsize, Ordering};

use crate::real::{self, set_errno};

/// The largest break a program gets: the kernel's is bounded only by the next mapping.
const MAX_RESERVATION_BYTES: usize = 16 << 30;
/// The smallest reservation worth making under an address-space limit.
const MIN_RESERVATION_BYTES: usize = 16 << 20;

/// The program's break, once it has called one of these functions.
#[derive(Clone, Copy)]
struct Break {
    /// The break's start, and its lowest.
    base: usize,
    /// The reservation's end: the break's highest.
    limit: usize,
    /// Where the break stands.
    at: usize,
    /// The end of the accessible pages: `at` rounded up to a page.
    accessible_end: usize,
}

#[derive(Clone, Copy)]
enum State {
    /// No call yet.
    Undecided,
    /// The kernel's break (the library stands aside, or was not set up at the first call).
    Kernel,
    /// A break of the program's own.
    Own(Break),
}

/// The break and its lock: a flag, so that the fork handlers can let go of it on both sides
/// (a mutex held across `fork` cannot be unlocked in the child by another owner).
struct Locked {
    held: AtomicBool,
    state: UnsafeCell<State>,
}

// SAFETY: `state` is only reached through `lock`, which gives one thread at a time.
unsafe impl Sync for Locked {}

static BREAK: Locked = Locked { held: AtomicBool::new(false), state: UnsafeCell::new(State::Undecided) };

/// Whether this process's library serves it (set at start-up past the stand-aside check).
static ENABLED: AtomicBool = AtomicBool::new(false);
/// The reservation's place, `[start, end)`, once made (0, 0 before).
static RESERVED_START: AtomicUsize = AtomicUsize::new(0);
static RESERVED_END: AtomicUsize = AtomicUsize::new(0);

static REAL_SBRK: AtomicPtr<c_void> = AtomicPtr::new(std::ptr::null_mut());
static REAL_BRK: AtomicPtr<c_void> = AtomicPtr::new(std::ptr::null_mut());

thread_local! {
    /// Whether this thread's fork prepare handler holds the lock (no destructor: read in a
    /// fork child before its heap is re-armed).
    static HELD_FOR_FORK: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// The lock, held while the value lives.
struct Guard;

impl Guard {
    fn lock() -> Guard {
        // Bounded by the holder's system calls (a few, and never a wait on another lock).
        while BREAK.held.compare_exchange_weak(false, true, Ordering::Acquire, Ordering::Relaxed).is_err() {
            std::thread::yield_now();
        }
        Guard
    }

    fn state(&mut self) -> &mut State {
        // SAFETY: this guard holds the lock (see `Locked`).
        unsafe { &mut *BREAK.state.get() }
    }
}

impl Drop for Guard {
    fn drop(&mut self) {
        BREAK.held.store(false, Ordering::Release);
    }
}

/// At start-up, once the library serves this process: its program's break will be its own.
pub fn enable() {
    ENABLED.store(true, Ordering::Release);
}

/// Fork prepare handler: holds the lock, so that no thread is inside when the child is
/// made.
pub fn hold_for_fork() {
    std::mem::forget(Guard::lock());
    HELD_FOR_FORK.with(|h| h.set(true));
}

/// Fork parent and child handlers: lets go of what [`hold_for_fork`] held.
pub fn release_after_fork() {
    if HELD_FOR_FORK.with(|h| h.replace(false)) {
        drop(Guard);
    }
}

/// The reservation, `[start, end)`, once made. The end is stored first and the start with
/// `Release`, so a start read with `Acquire` comes with its end.
fn reservation() -> Option<(usize, usize)> {
    let start = RESERVED_START.load(Ordering::Acquire);
    (start != 0).then(|| (start, RESERVED_END.load(Ordering::Relaxed)))
}

/// Whether `[start, end)` overlaps the program's break's reservation (for the report of
/// unmanaged memory: the break's accessible part may have merged with a neighbour).
pub fn overlaps(start: usize, end: usize) -> bool {
    reservation().is_some_and(|(s, e)| start < e && s < end)
}

/// The program's `munmap` of `[start, end)`: the part inside the break's reservation is not
/// unmapped but made inaccessible with fresh pages, so that it stays the break's (a hole
/// there would take the next small mapping of the process, which the break's next shrink
/// would then map over); what lies outside it, `None` when the range is all outside. The
/// pages read zero if the break grows back over them, as the kernel's.
pub fn unmap_inside(start: usize, end: usize) -> Option<[(usize, usize); 2]> {
    let (s, e) = reservation().filter(|&(s, e)| start < e && s < end)?;
    let (inside_start, inside_end) = (start.max(s), end.min(e));
    // Failing, the pages stay as they were (the kernel's munmap of a hole cannot fail).
    let _ = make_inaccessible(inside_start, inside_end - inside_start);
    Some([(start, inside_start), (inside_end, end)])
}

/// Maps fresh inaccessible pages over `[start, start + len)` of the reservation: what they
/// held is gone, and they read zero once made accessible again. `Err`: the errno.
fn make_inaccessible(start: usize, len: usize) -> Result<(), c_int> {
    let fixed = libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_FIXED;
    match real::sys_mmap(start as *mut c_void, len, libc::PROT_NONE, fixed, -1, 0) {
        libc::MAP_FAILED => Err(real::errno()),
        _ => Ok(()),
    }
}

/// How much address space the program's break reserves: [`MAX_RESERVATION_BYTES`], or a
/// quarter of an address-space limit the program has (the rest stays its own).
fn reservation_bytes() -> usize {
    let as_limit = crate::rlimit::program_soft_limit(libc::RLIMIT_AS as c_int);
    let quarter = usize::try_from(as_limit / 4).unwrap_or(usize::MAX);
    quarter.clamp(MIN_RESERVATION_BYTES, MAX_RESERVATION_BYTES) & !(uswap::PAGE_SIZE - 1)
}

/// `f` on the program's break, made at its first call; `None` when this process keeps the
/// kernel's break. Under the lock: a call of the program's moves it whole, as one `brk`
/// system call does.
fn with_break<R>(f: impl FnOnce(&mut Break) -> R) -> Option<R> {
    let mut guard = Guard::lock();
    let state = guard.state();
    if let State::Undecided = state {
        *state = match ENABLED.load(Ordering::Acquire) {
            true => State::Own(reserve()),
            false => State::Kernel,
        };
    }
    match state {
        State::Own(b) => Some(f(b)),
        _ => None,
    }
}

/// The program's first break: a reservation of [`reservation_bytes`], halved until the
/// kernel gives it; if it gives none (an address-space limit nearly reached), an empty one
/// at 0, where `sbrk(0)` answers 0 and every move up is refused (`ENOMEM`, as the kernel's
/// at its end).
fn reserve() -> Break {
    let mut len = reservation_bytes();
    // Not MAP_NORESERVE: the pages made accessible are committed, as the kernel's break.
    let flags = libc::MAP_PRIVATE | libc::MAP_ANONYMOUS;
    // Bounded: `len` halves each round down to MIN_RESERVATION_BYTES.
    loop {
        let p = real::sys_mmap(std::ptr::null_mut(), len, libc::PROT_NONE, flags, -1, 0);
        if p != libc::MAP_FAILED {
            // The page below the break stays accessible, as the end of the data (or of
            // malloc's heap) lies below the kernel's: a program may touch the byte before
            // the break it is given (stress-ng's brk stressor does, at once).
            let reserved = p as usize;
            let rw = libc::PROT_READ | libc::PROT_WRITE;
            if real::sys_mprotect(p, uswap::PAGE_SIZE, rw) == 0 {
                RESERVED_END.store(reserved + len, Ordering::Relaxed);
                RESERVED_START.store(reserved, Ordering::Release);
                crate::rlimit::note_reserved_address_space(len as u64);
                if crate::pager().is_some() {
                    // An address-space limit the program set gets this room on top.
                    crate::rlimit::refit();
                }
                let base = reserved + uswap::PAGE_SIZE;
                return Break { base, limit: reserved + len, at: base, accessible_end: base };
            }
            real::sys_munmap(p, len);
        }
        if len <= MIN_RESERVATION_BYTES {
            return Break { base: 0, limit: 0, at: 0, accessible_end: 0 };
        }
        len /= 2;
    }
}

/// Moves the break `b` to `to` within its reservation, as the kernel's `brk` does; below
/// the break's start it stays where it is (the kernel's refusal, which the C library's
/// `brk` and `sbrk` report as success).
fn set(b: &mut Break, to: usize) -> Result<(), c_int> {
    if to < b.base {
        return Ok(());
    }
    let data_limit = crate::rlimit::program_soft_limit(libc::RLIMIT_DATA as c_int);
    if to > b.limit || (to - b.base) as u64 > data_limit {
        return Err(libc::ENOMEM);
    }
    let end = to.next_multiple_of(uswap::PAGE_SIZE);
    if end > b.accessible_end {
        let rw = libc::PROT_READ | libc::PROT_WRITE;
        if real::sys_mprotect(b.accessible_end as *mut c_void, end - b.accessible_end, rw) != 0 {
            return Err(real::errno());
        }
    } else if end < b.accessible_end {
        // Fresh pages over the ones given back: they read zero when grown over again.
        make_inaccessible(end, b.accessible_end - end)?;
    }
    debug_assert!(b.base <= to && end <= b.limit);
    b.at = to;
    b.accessible_end = end;
    Ok(())
}

/// After a move: a waiting process's break counts toward its pager's start (see
/// `waiting_charge::note_break`), made outside the break's lock.
fn note_size() {
    if let Some(bytes) = with_break(|b| b.accessible_end - b.base) {
        crate::waiting_charge::note_break(bytes);
    }
}

/// `sbrk(increment)`: the break before the move, or `(void *)-1` with `ENOMEM`.
#[no_mangle]
pub extern "C" fn sbrk(increment: isize) -> *mut c_void {
    let moved = with_break(|b| {
        let old = b.at;
        if increment == 0 {
            // The C library's answers from the break it keeps, with no system call.
            return Ok(old);
        }
        let to = old.checked_add_signed(increment).ok_or(libc::ENOMEM)?;
        set(b, to).map(|()| old)
    });
    match moved {
        Some(Ok(old)) => {
            if increment > 0 {
                note_size();
            }
            old as *mut c_void
        }
        Some(Err(e)) => {
            set_errno(e);
            -1isize as *mut c_void
        }
        None => {
            let real = real::next_symbol(&REAL_SBRK, c"sbrk");
            // SAFETY: the C library's sbrk, with the caller's argument.
            unsafe { std::mem::transmute::<*mut c_void, extern "C" fn(isize) -> *mut c_void>(real)(increment) }
        }
    }
}

/// `brk(addr)`: 0, or -1 with `ENOMEM`.
#[no_mangle]
pub extern "C" fn brk(addr: *mut c_void) -> c_int {
    match with_break(|b| set(b, addr as usize)) {
        Some(Ok(())) => {
            note_size();
            0
        }
        Some(Err(e)) => {
            set_errno(e);
            -1
        }
        None => {
            let real = real::next_symbol(&REAL_BRK, c"brk");
            // SAFETY: the C library's brk, with the caller's argument.
            unsafe { std::mem::transmute::<*mut c_void, extern "C" fn(*mut c_void) -> c_int>(real)(addr) }
        }
    }
}

/// The `brk` system call through `syscall(2)`: the break after the call (where it stands
/// if the move was refused, as the kernel's), `None` when this process keeps the kernel's
/// break.
pub fn sys_brk(addr: c_long) -> Option<c_long> {
    with_break(|b| {
        // Refused, the break stays where it is, and the call says where.
        let _ = set(b, addr as usize);
        b.at as c_long
    })
    .inspect(|_| note_size())
}
