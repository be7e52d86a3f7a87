//! Core dumps: a process that dies with a core dump has what it had out of RAM in the dump.
//!
//! The kernel writes a core without waiting on a userfaultfd: a page of a registered range
//! that is not mapped is a hole in the dump (`handle_userfault` returns at once for a task
//! dumping core, `get_dump_page` skips the page), which a debugger reads as zeros, where
//! under the kernel's swap the page is read back in. So [`prepare`], called by the thread
//! about to die (in the handler of its fatal signal, before the default action runs), brings
//! every page that is out back in, with reclaim stopped (`mlock::lock_all`) and every
//! charge made at once, over the limit (`reclaim::stop_for_core_dump`), while the
//! machine and the process's cgroups have the memory for it (`MemAvailable`, the room
//! under the cgroup limits, looked at again as pages come in, less margins: a dump must not
//! make the machine swap or the cgroup kill), for at most a minute (a device that does not
//! answer must not turn a crash into a hang). It then leaves out of the dump what is uswap's own (the pool,
//! the tables and the staging areas: the kernel's zram is in no core either), and each
//! region's tail that was never touched: a region reserves far more than it uses (a heap
//! of 50 GiB), and a dump written to a pipe (`core_pattern` `|systemd-coredump`) carries its
//! holes as zeros.
//!
//! Locking: the fault path's, as a SIGBUS handler's; never called by a thread holding an
//! engine lock (its dump is left as the kernel writes it). Allocation-free. Invariant: once [`prepare`] has begun, no managed page of the
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
    /// Pages that were out and are holes in the dump: past the memory the machine had, past
    /// the minute a preparation takes at most, or not readable from their device.
    pub nr_pages_left_out: u64,
}

/// The memory a dump leaves the machine: what may be brought in is `MemAvailable` less this.
const MARGIN_BYTES: u64 = 256 << 20;
/// The room a dump leaves under the limit of the process's cgroup. Smaller: a cgroup's usage
/// counts its page cache, which the kernel reclaims before it kills, and a cgroup of a few
/// hundred MiB would otherwise get no page back.
const CGROUP_MARGIN_BYTES: u64 = 16 << 20;

/// The attempts at a page the kernel refused for the moment (an event being delivered, the
/// range moved under the call): each after a yield, as a SIGBUS handler retries the access.
const ATTEMPTS_PER_PAGE: u32 = 8;

/// Longest a preparation brings pages in: a device that does not answer (a Redis server
/// gone, each read a timeout) must not turn a crash into a hang; what is left is a hole.
const MAX_PREPARATION_NS: u64 = 60_000_000_000;

/// Longest wait, in all, for the reclaim rounds under way to end: a round is short; one
/// that does not end leaves its pages to the faults' own bound.
const MAX_ROUND_WAIT_NS: u64 = 2_000_000_000;

/// Pages served between two looks at the memory left (a serve's readahead is counted in the
/// budget; other threads' faults are not).
const SERVES_PER_LOOK: u64 = 64;

/// Failures in a row after which no page is tried any more (a device that fails every
/// read would cost its timeout for each).
const MAX_FAILURES_IN_A_ROW: u32 = 64;

/// Brings in every page of the process's regions that is out, within the memory the
/// machine has, and leaves the engine's data and the untouched tails out of the dump. See
/// the module doc.
pub(crate) fn prepare() -> CoreDumpPrepared {
    crate::mlock::lock_all(true);
    crate::reclaim::stop_for_core_dump();
    let start_ns = crate::clock::now_ns();
    // A round under way (the background reclaimer's) holds the pages it staged until it
    // ends: a fault on one waits for it.
    REGIONS.for_each(|g| wait_for_rounds_to_end(&g.pager.charge.reclaim_in_flight, start_ns + MAX_ROUND_WAIT_NS));
    let mut bounds = Bounds {
        deadline_ns: start_ns + MAX_PREPARATION_NS,
        budget_pages: room_pages(),
        serves_since_look: 0,
        failures_in_a_row: 0,
    };
    let mut done = CoreDumpPrepared::default();
    let mut last_pager = std::ptr::null();
    REGIONS.for_each(|g| {
        // After the events this thread has seen, once per pager (each wait is bounded).
        if !std::ptr::eq(&*g.pager, last_pager) {
            crate::events::wait_until_applied(&g.pager.stats);
            last_pager = &*g.pager;
            // Failures are counted per pager: another may read from devices that answer.
            bounds.failures_in_a_row = 0;
        }
        bring_in(g, &mut bounds, &mut done)
    });
    crate::mapping::leave_engine_data_out_of_core_dump();
    REGIONS.for_each(leave_untouched_tail_out);
    done
}

/// The bounds one preparation keeps to.
struct Bounds {
    /// When it stops bringing pages in ([`MAX_PREPARATION_NS`]).
    deadline_ns: u64,
    /// Pages that may still be served before the memory is looked at again.
    budget_pages: u64,
    serves_since_look: u64,
    failures_in_a_row: u32,
}

impl Bounds {
    /// Whether one more page may be served.
    fn allow(&mut self) -> bool {
        if self.serves_since_look >= SERVES_PER_LOOK {
            // The memory itself says what is left: the program's other threads fault too.
            self.budget_pages = room_pages();
            self.serves_since_look = 0;
        }
        self.budget_pages > 0
            && self.failures_in_a_row < MAX_FAILURES_IN_A_ROW
            && crate::clock::now_ns() < self.deadline_ns
    }

    /// Notes a serve that charged `nr_pages` (its page and the readahead window it mapped).
    fn note(&mut self, served: bool, nr_pages: u64) {
        self.serves_since_look += 1;
        self.budget_pages = self.budget_pages.saturating_sub(nr_pages.max(1));
        self.failures_in_a_row = if served { 0 } else { self.failures_in_a_row + 1 };
    }
}

/// Pages that may come in now: the lower of `MemAvailable` less [`MARGIN_BYTES`] and the
/// cgroup's room less [`CGROUP_MARGIN_BYTES`].
fn room_pages() -> u64 {
    let machine = crate::mapping::mem_available_bytes().unwrap_or(0).saturating_sub(MARGIN_BYTES);
    let cgroup = crate::mapping::cgroup_room_bytes().map_or(u64::MAX, |room| room.saturating_sub(CGROUP_MARGIN_BYTES));
    machine.min(cgroup) / PAGE_SIZE as u64
}

/// Waits, bounded by `deadline_ns`, until no reclaim round or writeback of a pager is under
/// way (`in_flight`, its `reclaim_in_flight`). `std::thread::sleep` is `nanosleep`:
/// async-signal-safe.
fn wait_for_rounds_to_end(in_flight: &std::sync::atomic::AtomicUsize, deadline_ns: u64) {
    while in_flight.load(std::sync::atomic::Ordering::SeqCst) != 0 && crate::clock::now_ns() < deadline_ns {
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
}

/// Whether a page in this word is out: its contents are where a dump cannot read them.
fn is_out(state: PageState) -> bool {
    matches!(state, PageState::Cached | PageState::Swapped | PageState::Parent)
}

/// Brings `region`'s pages that are out in, within `bounds`, counted in `done`.
fn bring_in(region: &RegistryGuard<'_, RegionInner>, bounds: &mut Bounds, done: &mut CoreDumpPrepared) {
    // The caller holds no engine lock (a thread that does is left to die as it is): the
    // signal route may take them.
    debug_assert_eq!(crate::sync::locks_held_by_this_thread(), 0);
    let route = match region.pager.mode {
        FaultMode::Thread => Route::Thread,
        FaultMode::Signal => Route::Signal,
    };
    // None is out past the touched part (`RegionInner::note_touched`).
    for page in 0..region.touched_end() {
        let pte = region.load(page);
        // A busy page may be on its way out (a reclaim begun before the stop): served, the
        // fault path waits for it.
        if !(is_out(pte.state()) || pte.busy() && pte.state() == PageState::Resident) {
            continue;
        }
        if !bounds.allow() {
            done.nr_pages_left_out += 1;
            continue;
        }
        let charged_before = region.pager.charge.resident_pages.load(std::sync::atomic::Ordering::Acquire);
        let served = serve(region, region.page_addr(page), route);
        let charged = region.pager.charge.resident_pages.load(std::sync::atomic::Ordering::Acquire);
        bounds.note(served, charged.saturating_sub(charged_before) as u64);
        if served {
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
    // Past `all_none_from` every page is `None`: their words are not read. (Not past the
    // touched part alone: a page `Gone` there is another mapping's address, kept in the dump.)
    let touched = (0..region.all_none_from()).rev().find(|&page| region.load(page).state() != PageState::None);
    let first_untouched = touched.map_or(0, |page| page + 1);
    if first_untouched < region.nr_pages {
        let len = (region.nr_pages - first_untouched) * PAGE_SIZE;
        crate::mapping::leave_out_of_core_dump(region.page_addr(first_untouched), len);
    }
}
