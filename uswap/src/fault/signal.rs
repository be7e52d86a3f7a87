//! Signal mode's delivery: [`sigbus_fault`] runs in the faulting thread's SIGBUS handler
//! (installed by `crate::uffd::sigbus`), on a stack of the handler's pool. It allocates
//! nothing and takes no lock the thread could already hold: if the thread was interrupted
//! inside engine code holding a spin lock (an application signal handler touching managed
//! memory), the fault takes the lock-free route — no direct reclaim, slot frees deferred.

use std::cell::Cell;

use super::retry::serve_with_retries;
use crate::events;
use crate::options::FaultMode;
use crate::region::region_owning;
use crate::state::fault_error::FaultError;
use crate::state::route::Route;
use crate::sync::locks_held_by_this_thread;
use crate::uffd;

thread_local! {
    /// The address of this thread's last SIGBUS that no region claimed and that was retried
    /// once (0: none). A const-initialised `Cell` has no destructor and no lazy
    /// initialisation: a plain TLS slot, safe to use in a signal handler.
    static UNCLAIMED_FAULT_ADDR: Cell<usize> = const { Cell::new(0) };
}

/// The SIGBUS entry point (see `uffd::sigbus`): serves the fault if `addr` belongs to a
/// signal-mode region, on a stack of the handler's pool rather than the faulting thread's
/// (`mapping::handler_stack`: threads with small stacks). Async-signal-safe.
pub(crate) fn sigbus_fault(addr: usize, is_write: bool) -> bool {
    crate::mapping::handler_stack::run(|| sigbus_fault_here(addr, is_write))
}

/// [`sigbus_fault`], on the stack it runs on.
fn sigbus_fault_here(addr: usize, is_write: bool) -> bool {
    let Some(g) = region_owning(addr) else {
        // A region being moved (mremap) is found again once its event is applied: retry the
        // access rather than pass the signal on.
        if events::in_flight() {
            std::thread::yield_now();
            return true;
        }
        // The fault may have been raised before the last pending part moved out of a region
        // was unregistered, and is handled after (`in_flight` has just turned false): the
        // access, retried once, finds ordinary memory. A SIGBUS that is not uswap's comes
        // back at the same address and is passed on then.
        if UNCLAIMED_FAULT_ADDR.replace(addr) != addr {
            std::thread::yield_now();
            return true;
        }
        UNCLAIMED_FAULT_ADDR.set(0);
        return false;
    };
    if g.pager.mode != FaultMode::Signal {
        UNCLAIMED_FAULT_ADDR.set(0);
        return false;
    }
    // After the events this thread has seen (its own `madvise`, `munmap`, `mremap`).
    events::wait_until_applied(&g.pager.stats);
    let route = if locks_held_by_this_thread() > 0 { Route::SignalLockFree } else { Route::Signal };
    // Bounded retries of transient failures; a page that cannot be brought back ends in
    // SIGBUS, as in the kernel.
    match serve_with_retries(&g, g.index, g.gen, addr, is_write, route) {
        Ok(()) => {
            UNCLAIMED_FAULT_ADDR.set(0);
            true
        }
        // Not the region's any more: not uswap's fault, unless it was raised just before
        // the page was let go of (`Pager::unmanage` unregisters the range once its pages
        // are in place): the access, retried once, meets ordinary memory. (Memory the
        // application grew back over it in place is not served here: nothing tells which
        // userfaultfd a SIGBUS came from, and `UFFDIO_ZEROPAGE` works through any
        // descriptor of the process.)
        Err(FaultError::Gone) => {
            if UNCLAIMED_FAULT_ADDR.replace(addr) != addr {
                return true;
            }
            UNCLAIMED_FAULT_ADDR.set(0);
            false
        }
        // Unmapped by another thread: the access, retried, meets whatever is there now
        // (SIGSEGV where nothing is, as without uswap). An event is being delivered (the
        // kernel refuses ioctls until it is read): the access faults again once it is.
        Err(FaultError::Unmapped | FaultError::Ioctl(libc::EAGAIN)) => {
            std::thread::yield_now();
            true
        }
        Err(lost) => {
            uffd::sigbus::report_lost_page(addr, lost.why_lost(), lost.device_cause());
            false
        }
    }
}
