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
//! Locking: none; `clock_gettime` through the vDSO, async-signal-safe, allocates nothing.

/// What the clock reads at boot: one day, in nanoseconds.
pub const ORIGIN_NS: u64 = 86_400 * 1_000_000_000;

/// Monotonic time in nanoseconds, at least [`ORIGIN_NS`] (vDSO; async-signal-safe).
pub fn now_ns() -> u64 {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: clock_gettime writes one timespec.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
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
