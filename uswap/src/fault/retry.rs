//! The one retry loop of fault delivery: thread and signal mode serve a fault through
//! [`serve_with_retries`], and each acts on what it returns in its own way (wake the
//! faulting thread, or return from its SIGBUS handler so that the access is retried).

use crate::fault_service::serve_fault;
use crate::region::RegionInner;
use crate::state::fault_error::FaultError;
use crate::state::route::Route;
use crate::swapin::READ_ATTEMPTS;

/// Serves the fault at `addr` in region `region` (registry slot `reg_idx`, generation
/// `reg_gen`), retrying failures that a second attempt may not meet (a device read or an
/// ioctl that failed) up to [`READ_ATTEMPTS`] times in all. Returns at once what the
/// delivery must act on: the page is no longer the region's (`Gone`), the range was
/// unmapped under the fault (`Unmapped`), an event is pending (`Ioctl(EAGAIN)`), or a wait
/// that already took its full bound (`BusyTimeout`, `BounceTimeout`: not retried). Any other
/// error returned is the last of the attempts: the page cannot be brought back.
pub(crate) fn serve_with_retries(
    region: &RegionInner,
    reg_idx: usize,
    reg_gen: u32,
    addr: usize,
    write: bool,
    route: Route,
) -> Result<(), FaultError> {
    const { assert!(READ_ATTEMPTS > 0) };
    let mut last = FaultError::BusyTimeout;
    for _ in 0..READ_ATTEMPTS {
        match serve_fault(region, reg_idx, reg_gen, addr, write, route) {
            Ok(()) => return Ok(()),
            Err(
                e @ (FaultError::BusyTimeout
                | FaultError::BounceTimeout
                | FaultError::Gone
                | FaultError::Unmapped
                | FaultError::Ioctl(libc::EAGAIN)),
            ) => return Err(e),
            // The userfaultfd's number names another file now (or nothing): no attempt can
            // succeed, and each would send ioctls to a file of the program's.
            Err(FaultError::Ioctl(_)) if !region.pager.uffd.still_ours() => return Err(FaultError::Ioctl(libc::EBADF)),
            Err(e) => {
                last = e;
                // Each attempt may have waited out a device's timeouts.
                crate::uffd::sigbus::let_stop_signals_through();
            }
        }
    }
    Err(last)
}
