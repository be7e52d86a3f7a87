//! Core dumps: a process that dies with a core dump has what it had out of RAM in the dump.
//!
//! The kernel writes a core without waiting on a userfaultfd: a page of a registered range
//! that is not mapped is a hole in the dump (`handle_userfault` returns at once for a task
//! dumping core, `get_dump_page` skips the page), which a debugger reads as zeros, where
//! under the kernel's swap the page is read back in. So [`prepare`], called by the thread
//! about to die (in the handler of its fatal signal, before the default action runs), brings
//! every page that is out back in, with reclaim stopped (`mlock::lock_all`) and every
//! charge made at once, over the limit (`reclaim::stop_for_core_dump`), while the
//! machine has the memory for it (`MemAvailable`, less a margin: a dump must not make the
//! machine swap or kill). It then leaves out of the dump what is uswap's own (the pool,
//! the tables and the staging areas: the kernel's zram is in no core either), and each
//! region's tail that was never touched: a region reserves far more than it uses (a heap
//! of 50 GiB), and a dump written to a pipe (`core_pattern` `|systemd-coredump`) carries its
//! holes as zeros.
//!
//! Locking: the fault path's, as a SIGBUS handler's (a thread holding an engine lock takes
//! none). Allocation-free. Invariant: once [`prepare`] has begun, no managed page of the
//! process is a reclaim victim (`mlock::lock_all`), so what it brought in stays in.

use crate::fault::serve_with_retries;
use crate::mapping::registry::RegistryGuard;
use crate::options::FaultMode;
use crate::page_table::PageState;
use crate::region::{RegionInner, REGIONS};
use crate::state::fault_error::FaultError;
use crate::state::route::Route;
use crate::uffd::PAGE_SIZE;

/// What [`prepare`] did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CoreDumpPrepared {
    /// Pages that were out and are in the dump.
    pub nr_pages_brought_in: u64,
    /// Pages that were out and are holes in the dump: past the memory the machine had, or
    /// not readable from their device.
    pub nr_pages_left_out: u64,
}

/// The memory a dump leaves the machine: `MemAvailable` less this is what may be brought in.
const MARGIN_BYTES: u64 = 256 << 20;

/// The attempts at a page the kernel refused for the moment (an event being delivered, the
/// range moved under the call): each after a yield, as a SIGBUS handler retries the access.
const ATTEMPTS_PER_PAGE: u32 = 8;

/// Brings in every page of the process's regions that is out, within the memory the
/// machine has, and leaves the engine's data and the untouched tails out of the dump. See
/// the module doc.
pub(crate) fn prepare() -> CoreDumpPrepared {
    crate::mlock::lock_all(true);
    crate::reclaim::stop_for_core_dump();
    // A round under way (the background reclaimer's) holds the pages it staged until it
    // ends: a fault on one waits for it.
    REGIONS.for_each(|g| wait_for_rounds_to_end(&g.pager.charge.reclaim_in_flight));
    let available = crate::mapping::mem_available_bytes().unwrap_or(0);
    let mut budget_pages = available.saturating_sub(MARGIN_BYTES) / PAGE_SIZE as u64;
    let mut done = CoreDumpPrepared::default();
    REGIONS.for_each(|g| bring_in(g, &mut budget_pages, &mut done));
    crate::mapping::leave_engine_data_out_of_core_dump();
    REGIONS.for_each(leave_untouched_tail_out);
    done
}

/// Longest wait for the reclaim rounds under way to end, in milliseconds: a round is short;
/// one that does not end (its thread stopped) leaves its pages to the faults' own bound.
const MAX_ROUND_WAIT_MS: u32 = 2_000;

/// Waits, bounded, until no reclaim round or writeback of a pager is under way (`in_flight`,
/// its `reclaim_in_flight`). `std::thread::sleep` is `nanosleep`: async-signal-safe.
fn wait_for_rounds_to_end(in_flight: &std::sync::atomic::AtomicUsize) {
    for _ in 0..MAX_ROUND_WAIT_MS {
        if in_flight.load(std::sync::atomic::Ordering::SeqCst) == 0 {
            return;
        }
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
}

/// Whether a page in this word is out: its contents are where a dump cannot read them.
fn is_out(state: PageState) -> bool {
    matches!(state, PageState::Cached | PageState::Swapped | PageState::Parent)
}

/// Brings `region`'s pages that are out in, each within `budget_pages`, counted in `done`.
fn bring_in(region: &RegistryGuard<'_, RegionInner>, budget_pages: &mut u64, done: &mut CoreDumpPrepared) {
    crate::events::wait_until_applied(&region.pager.stats);
    let route = match region.pager.mode {
        FaultMode::Thread => Route::Thread,
        FaultMode::Signal if crate::sync::locks_held_by_this_thread() > 0 => Route::SignalLockFree,
        FaultMode::Signal => Route::Signal,
    };
    for page in 0..region.nr_pages {
        let pte = region.load(page);
        // A busy page may be on its way out (a reclaim begun before the stop): served, the
        // fault path waits for it.
        if !(is_out(pte.state()) || pte.busy() && pte.state() == PageState::Resident) {
            continue;
        }
        if *budget_pages == 0 {
            done.nr_pages_left_out += 1;
            continue;
        }
        if serve(region, region.page_addr(page), route) {
            *budget_pages -= 1;
            done.nr_pages_brought_in += 1;
        } else {
            done.nr_pages_left_out += 1;
        }
    }
}

/// Serves a read fault on `addr` as its thread would; whether the page is in now.
fn serve(region: &RegistryGuard<'_, RegionInner>, addr: usize, route: Route) -> bool {
    for _ in 0..ATTEMPTS_PER_PAGE {
        let served = crate::mapping::handler_stack::run(|| {
            serve_with_retries(region, region.index, region.gen, addr, false, route)
        });
        match served {
            Ok(()) => return true,
            Err(FaultError::Unmapped | FaultError::Ioctl(libc::EAGAIN)) => std::thread::yield_now(),
            Err(_) => return false,
        }
    }
    false
}

/// Leaves the part of `region` past its last page ever touched out of the dump.
fn leave_untouched_tail_out(region: &RegistryGuard<'_, RegionInner>) {
    let touched = (0..region.nr_pages).rev().find(|&page| region.load(page).state() != PageState::None);
    let first_untouched = touched.map_or(0, |page| page + 1);
    if first_untouched < region.nr_pages {
        let len = (region.nr_pages - first_untouched) * PAGE_SIZE;
        crate::mapping::leave_out_of_core_dump(region.page_addr(first_untouched), len);
    }
}
