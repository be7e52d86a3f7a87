//! The program's own break: `brk`, `sbrk` and `syscall(SYS_brk)`, interposed.
//!
//! Why: the real break is the heap of the C library's malloc, which serves uswap's own
//! allocations, from the engine's threads too (one arena, see `prepare` in the crate's
//! root). A program that moves its break itself cut those threads' blocks: stress-ng's brk
//! stressor grows its break a page at a time and sets it back where it began at its first
//! `ENOMEM`, which gave back what malloc had grown in between (the stressor died of SIGSEGV,
//! then of "realloc(): invalid next size"); without uswap it has no other thread. So in a
//! process this library serves, the program's first call gives it a break of its own: the
//! start of a reservation mapped as the program's own `PROT_NONE` reservation would be
//! (through `mmap`'s interposition: managed, its pages paged under the limit), which the
//! calls move as the kernel moves the real one. Growing makes the pages up to the new break
//! accessible (`mprotect`, which the kernel refuses past the data limit, `ENOMEM`, as it
//! refuses a `brk`); shrinking maps fresh inaccessible memory over the pages given back, so
//! that they read zero when the break grows over them again, as after the kernel's unmap.
//! The break only moves within the reservation ([`reservation_bytes`]); past it, `ENOMEM`.
//! What differs from the kernel's: the break's first value is a page into the reservation,
//! not the end of the program's data (no program may assume either; the page below it is
//! accessible, as the data's end is), and the reservation's address space is taken at the
//! first call.
//!
//! The C library's own `__sbrk` (its malloc's) is not interposed: its internal calls do not
//! go through the symbol.
//!
//! State: one mutex over the break (its reservation and where it stands), taken by the three
//! calls only, never by uswap's own code; a fork child inherits it with the mapping. A
//! process whose library is inert (`USWAP_DISABLE`) keeps the kernel's break.

use std::ffi::{c_int, c_long, c_void};
use std::sync::atomic::AtomicPtr;
use std::sync::Mutex;

use crate::real::{self, set_errno};

/// The largest break a program gets: the kernel's is bounded only by the next mapping.
const MAX_RESERVATION_BYTES: usize = 16 << 30;
/// The smallest reservation worth making under an address-space limit.
const MIN_RESERVATION_BYTES: usize = 16 << 20;

/// The program's break, once it has called one of these functions.
#[derive(Clone, Copy)]
struct Break {
    /// The reservation's start: the break's first value and its lowest.
    base: usize,
    /// The reservation's end: the break's highest.
    limit: usize,
    /// Where the break stands.
    at: usize,
    /// The end of the accessible pages: `at` rounded up to a page.
    accessible_end: usize,
}

static BREAK: Mutex<Option<Break>> = Mutex::new(None);

static REAL_SBRK: AtomicPtr<c_void> = AtomicPtr::new(std::ptr::null_mut());
static REAL_BRK: AtomicPtr<c_void> = AtomicPtr::new(std::ptr::null_mut());

/// How much address space the program's break reserves: [`MAX_RESERVATION_BYTES`], or a
/// quarter of an address-space limit the program set (the rest stays its own).
fn reservation_bytes() -> usize {
    let as_limit = crate::rlimit::program_soft_limit(libc::RLIMIT_AS as c_int);
    let quarter = usize::try_from(as_limit / 4).unwrap_or(usize::MAX);
    quarter.clamp(MIN_RESERVATION_BYTES, MAX_RESERVATION_BYTES) & !(uswap::PAGE_SIZE - 1)
}

/// `f` on the program's break, made at its first call; `None` when this process keeps the
/// kernel's break (its library is inert). Under the break's lock: a call of the program's
/// moves it whole, as one `brk` system call does.
fn with_break<R>(f: impl FnOnce(&mut Break) -> R) -> Option<R> {
    let mut guard = BREAK.lock().unwrap_or_else(|e| e.into_inner());
    if guard.is_none() {
        crate::config()?;
        *guard = Some(reserve());
    }
    guard.as_mut().map(f)
}

/// The program's first break: a reservation of [`reservation_bytes`], halved until the
/// kernel gives it; if it gives none, an empty one at 0, where every move but to 0 is
/// refused (`ENOMEM`, as the kernel's at its end).
fn reserve() -> Break {
    let mut len = reservation_bytes();
    let flags = libc::MAP_PRIVATE | libc::MAP_ANONYMOUS;
    // Bounded: `len` halves each round down to MIN_RESERVATION_BYTES.
    loop {
        let p = crate::mmap::program_mmap(std::ptr::null_mut(), len, libc::PROT_NONE, flags, -1, 0);
        if p != libc::MAP_FAILED {
            // The page below the break stays accessible, as the end of the data (or of
            // malloc's heap) lies below the kernel's: a program may touch the byte before
            // the break it is given (stress-ng's brk stressor does, at once).
            let below = p as usize;
            let rw = libc::PROT_READ | libc::PROT_WRITE;
            if real::sys_mprotect(p, uswap::PAGE_SIZE, rw) == 0 {
                let base = below + uswap::PAGE_SIZE;
                return Break { base, limit: below + len, at: base, accessible_end: base };
            }
            crate::mmap::munmap(p, len);
        }
        if len <= MIN_RESERVATION_BYTES {
            return Break { base: 0, limit: 0, at: 0, accessible_end: 0 };
        }
        len /= 2;
    }
}

/// Moves the break `b` to `to` within its reservation, as the kernel's `brk` does.
fn set(b: &mut Break, to: usize) -> Result<(), c_int> {
    if to < b.base || to > b.limit {
        return Err(libc::ENOMEM);
    }
    let data_limit = crate::rlimit::program_soft_limit(libc::RLIMIT_DATA as c_int);
    if (to - b.base) as u64 > data_limit {
        return Err(libc::ENOMEM);
    }
    let end = to.next_multiple_of(uswap::PAGE_SIZE);
    if end > b.accessible_end {
        let grow = end - b.accessible_end;
        let rw = libc::PROT_READ | libc::PROT_WRITE;
        if real::sys_mprotect(b.accessible_end as *mut c_void, grow, rw) != 0 {
            return Err(real::errno());
        }
    } else if end < b.accessible_end {
        let fixed = libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_FIXED;
        let given_back = b.accessible_end - end;
        let p = crate::mmap::program_mmap(end as *mut c_void, given_back, libc::PROT_NONE, fixed, -1, 0);
        if p == libc::MAP_FAILED {
            return Err(real::errno());
        }
    }
    debug_assert!(end <= b.limit && to >= b.base);
    b.at = to;
    b.accessible_end = end;
    Ok(())
}

/// `sbrk(increment)`: the break before the move, or `(void *)-1` with `ENOMEM`.
#[no_mangle]
pub extern "C" fn sbrk(increment: isize) -> *mut c_void {
    let moved = with_break(|b| {
        let old = b.at;
        let to = old.checked_add_signed(increment).ok_or(libc::ENOMEM)?;
        set(b, to).map(|()| old)
    });
    match moved {
        Some(Ok(old)) => old as *mut c_void,
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
        Some(Ok(())) => 0,
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

/// The `brk` system call through `syscall(2)`: the break after the call (where it stands if
/// the move was refused; 0 asks where it stands), `None` when this process keeps the
/// kernel's break.
pub fn sys_brk(addr: c_long) -> Option<c_long> {
    with_break(|b| {
        if addr != 0 {
            // Refused, the break stays, and the call says where: as the kernel's.
            let _ = set(b, addr as usize);
        }
        b.at as c_long
    })
}
