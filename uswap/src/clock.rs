//! The engine's clock: monotonic nanoseconds that never read less than [`ORIGIN_NS`].
//!
//! Every age, window and deadline of the engine (idle ages, aging, stall windows, busy-wait
//! limits, device health) is a difference of two readings, often "now less a window". On
//! `CLOCK_MONOTONIC` such a difference underflows on a machine booted less than a window ago:
//! a VM, a container or a CI runner started a minute before the program (an idle-age test
//! panicked with "attempt to subtract with overflow" within 12 minutes of boot). The clock
//! therefore starts one day after boot: every window of the engine is far shorter, so "now
//! less a window" is never below zero, and an epoch or stamp of 0 keeps meaning "none".
//!
//! Readings are comparable across the processes of a tree (the shared charge segment holds
//! them): every process adds the same origin to the same system clock. They are not
//! comparable with `std::time::Instant` or the kernel's own timestamps.
//!
//! The readings are the C library's own `clock_gettime`'s once [`resolve`] found it (a pager
//! is built): a program run under libfaketime (`faketime '2020-01-01'`, test suites that
//! fake the date) binds every caller in the process, uswap's engine too, to a
//! `clock_gettime` that returns a monotonic clock of its own making (the faked date's
//! seconds), whose epochs overflowed a slot's stamp and ended the program.
//!
//! Locking: none; `clock_gettime` through the vDSO, async-signal-safe, allocates nothing
//! ([`resolve`] excepted: it is called where a pager is built, never on a fault).

use std::sync::atomic::{AtomicBool, AtomicPtr, Ordering};

/// What the clock reads at boot: one day, in nanoseconds.
pub const ORIGIN_NS: u64 = 86_400 * 1_000_000_000;

type ClockGettimeFn = unsafe extern "C" fn(libc::clockid_t, *mut libc::timespec) -> libc::c_int;

/// The C library's own `clock_gettime`, once [`resolve`] found it; null until then (the
/// definition the process binds is used).
static CLOCK_GETTIME: AtomicPtr<libc::c_void> = AtomicPtr::new(std::ptr::null_mut());
/// Set once [`resolve`] has looked, found or not: a C library it cannot find (musl) is not
/// looked for again at every pager built (a fork child's among them). Set after the
/// function is stored: a caller that finds it clear looks too (the lookup is idempotent),
/// rather than wait, which a fork child could do for ever.
static RESOLVED: AtomicBool = AtomicBool::new(false);

/// Finds the C library's own `clock_gettime` (looked up in `libc.so.6` itself, past any
/// preloaded library's), for [`now_ns`]. Not async-signal-safe (`dlopen`, `dlsym`): called
/// where a pager is built. Where the C library is not `libc.so.6` (a static program) the
/// bound definition stays.
pub fn resolve() {
    if RESOLVED.load(Ordering::Acquire) {
        return;
    }
    let f = libc_clock_gettime();
    if !f.is_null() {
        CLOCK_GETTIME.store(f, Ordering::Release);
    }
    RESOLVED.store(true, Ordering::Release);
}

/// `clock_gettime` as `libc.so.6` defines it, or null.
fn libc_clock_gettime() -> *mut libc::c_void {
    // SAFETY: dlopen of an already loaded library by its soname with RTLD_NOLOAD loads
    // nothing; it returns the library's handle (a reference taken) or null.
    let handle = unsafe { libc::dlopen(c"libc.so.6".as_ptr(), libc::RTLD_NOLOAD | libc::RTLD_LAZY) };
    if handle.is_null() {
        return std::ptr::null_mut();
    }
    // SAFETY: dlsym with a live handle and a NUL-terminated name: the C library's
    // definition, or null.
    let f = unsafe { libc::dlsym(handle, c"clock_gettime".as_ptr()) };
    // SAFETY: gives back the reference dlopen took; the C library stays loaded (the program
    // holds it), and so does `f`.
    unsafe { libc::dlclose(handle) };
    f
}

/// How long ago the reading `since_ns` of [`now_ns`] was (zero for one not yet reached).
pub fn elapsed_since(since_ns: u64) -> std::time::Duration {
    std::time::Duration::from_nanos(now_ns().saturating_sub(since_ns))
}

/// Monotonic time in nanoseconds, at least [`ORIGIN_NS`] (vDSO; async-signal-safe).
pub fn now_ns() -> u64 {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    let f = CLOCK_GETTIME.load(Ordering::Acquire);
    if f.is_null() {
        // SAFETY: clock_gettime writes one timespec.
        unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    } else {
        // SAFETY: `f` is the C library's clock_gettime (`resolve`), of this signature; it
        // writes one timespec.
        unsafe { std::mem::transmute::<*mut libc::c_void, ClockGettimeFn>(f)(libc::CLOCK_MONOTONIC, &mut ts) };
    }
    ORIGIN_NS + ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The clock reads at least its origin and never goes back, whatever the uptime.
    #[test]
    fn reads_past_its_origin_and_never_back() {
        let mut last = now_ns();
        assert!(last >= ORIGIN_NS);
        for _ in 0..1000 {
            let t = now_ns();
            assert!(t >= last, "{t} < {last}");
            last = t;
        }
    }
}
