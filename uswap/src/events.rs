//! What the application does to a region's address range: `munmap`, `mremap` and
//! `madvise(MADV_DONTNEED)` reach the engine as userfaultfd events, and each gets the
//! kernel's meaning.
//!
//! * `UNMAP` (munmap, `MAP_FIXED` over a region, a shrinking `mremap`; sent after the unmap):
//!   the pages are `Gone`. Their slots and swap-cache pages are freed, their charge dropped,
//!   and no fault, reclaim or teardown touches those addresses again: whatever the
//!   application maps there next is not the engine's.
//! * `REMOVE` (`MADV_DONTNEED`, `MADV_FREE`, `MADV_REMOVE`; sent before the kernel zaps the
//!   pages): the pages read zero afterwards, as Linux zero-fills. Swapped and staged pages
//!   lose their slots; resident ones their charge. In signal mode under the system-call
//!   guard the regions' descriptor asks for no `REMOVE`: the guard sees the program's
//!   discards and applies them the same way before they return ([`ProgramDiscard`]), and
//!   reclaim may then drop clean pages where they lie (`reclaim::swapout`).
//! * `REMAP` (`mremap` that moves; sent after the move, and followed by an `UNMAP` of the
//!   old range): a move of the whole region moves the region (its address and its registry
//!   entry); the engine goes on paging it at the new address. A move of part of a region
//!   takes that part out of uswap's management: it becomes ordinary, fully populated memory.
//!   Why not a managed region of its own: nothing owns it (no `Region` handle says when it
//!   is freed), and an application that moves part of a region (a shim's `realloc`) means
//!   to own that memory. Its pages are detached at once, under the reader lock (each
//!   becomes `Gone` in the region, so the `UNMAP` of the old range that follows frees
//!   nothing); those not in place (staged or swapped) are then copied to the new address
//!   ([`run_take_outs`]), and the new range is unregistered. What `mremap` grew the part
//!   (or a whole region) by is unregistered too: zero memory the engine never owned.
//!
//! Why the copies wait: the kernel refuses every fill ioctl (`EAGAIN`) from the moment
//! `mremap` starts until the thread that called it has seen both events read and runs
//! again. Copying inside the `REMAP` handler therefore waited on the very `UNMAP` it kept
//! from being read (signal mode: pages lost after a timeout), or, with several handler
//! threads (thread mode), raced another handler applying that `UNMAP`, which freed the
//! slots and staging pages of pages not yet copied (about one run in 20 found a moved page
//! zero). Now events are applied in the order they were read (one reader at a time,
//! [`crate::state::events::EventState::reader`]), detaching never waits on an event, and the copies are retried
//! after each read until they succeed. Meanwhile a fault on the moved part waits: in thread
//! mode its handler leaves it for the copy (or the unregistering) to wake; in signal mode
//! the handler retries while [`in_flight`] says a take-out is pending.
//!
//! Growing in place (`mremap` without a move, into free address space after a region)
//! sends no event: the grown pages are registered memory no page table describes. Thread
//! mode serves them as zero pages (ordinary memory, not counted against the limit). In
//! signal mode the SIGBUS is passed on (the process dies of it unless it has its own
//! handler): the handler cannot tell which userfaultfd a SIGBUS came from, and a fill
//! ioctl works through any descriptor of the process, so serving it could fill memory
//! another userfaultfd user owns.
//!
//! The thread that caused an event waits in the kernel until the event is *read*, and is
//! released by that read, before the engine has acted on it. So there is a window between
//! the application's call returning and the engine's page table saying so; the engine
//! narrows what can go wrong in it:
//! * reclaim moves pages out through the staging area's descriptor; a page that is not there
//!   any more (`ENOENT`) stays as it is for the event to settle, never turns into a zero page;
//! * in signal mode, a SIGBUS at an address no region claims while an event is being handled
//!   (or a moved part is being copied in) is retried rather than passed on; so is, once, one
//!   raised just before a moved part was unregistered and handled just after;
//! * a fault served after the application unmapped its page, but before the `UNMAP` is
//!   applied, finds no mapping there (`ENOENT`) and ends quietly (`FaultError::Unmapped`).
//!   In thread mode that is a stale message: its thread faulted while another handler was
//!   mapping the page, was woken by that mapping, and has since unmapped the range;
//! * a new region enters the registry only once no program `munmap` of part of a managed
//!   mapping is under way and every event its pager read is applied ([`UnmapUnderWay`],
//!   [`settle_unmaps`]; bounded at 1 s): the kernel frees the addresses before it queues
//!   the `UNMAP`, and another thread's new mapping there would otherwise lose its pages to
//!   the late event. Unmaps made without the guard (a raw system call the interposer does
//!   not see, a library user's own `munmap`) are not waited for;
//! * a fork records its pages once every event read is applied ([`settle_reads`], bounded
//!   at 1 s): a page the program discarded before it forked is recorded as zero, not at
//!   the slot its `REMOVE` frees. An event still unread when the fork records (a discard
//!   truly concurrent with it) can leave the child a slot the parent frees after the fork:
//!   its fault on that page is then a device read error (as for a page a device lost)
//!   instead of a zero page;
//! * residual: a reclaim round that locked a page before an `UNMAP` and moves it after the
//!   application has mapped new memory at that address *and* touched it, all before the
//!   event thread marked the page `Gone`, moves that new page into the swap cache. The
//!   window is one `UFFDIO_MOVE` long and needs a second thread of the application mapping
//!   at the exact address; it is not closed.
//!
//! The engine's own unmaps and discards send no events: a dropped region is unregistered
//! before it is unmapped, and staging pages belong to a second descriptor that asks for
//! none (clean pages leave a region by `UFFDIO_MOVE` into their slot's staging page, not by
//! `MADV_DONTNEED` on the region, but where the regions' descriptor asks for no `REMOVE`;
//! that drop is a direct system call, which the guard does not see).
//!
//! Locking: the reader lock ([`crate::state::events::EventState::reader`]) is outermost; under it, every page is
//! taken through its busy bit, then the take-out list's lock. An owner of a busy bit never
//! waits for an event to be read nor for the reader lock (reclaim's moves and discards go
//! through the staging descriptor, which has no events; an ioctl on the regions' descriptor
//! that meets a pending event fails with `EAGAIN`, and the fault is retried), so waiting
//! for a busy bit here ends. [`run_take_outs`] holds the take-out list's lock (never waited
//! for by a fault) and no busy bit. Pages waiting in the take-out list own their slot,
//! staging page and charge, as they did in the region, until their copy is done.

use std::sync::atomic::{AtomicUsize, Ordering};

use crossbeam_utils::Backoff;

use crate::async_readahead::AsyncRa;
use crate::backend::{AlignedPage, ReadReq};
use crate::bounce::BounceBuffers;
use crate::mapping::registry::RegistryGuard;
use crate::options::FaultMode;
use crate::region::{PageRef, PageState, Pte, RegionInner, REGIONS};
use crate::release::{Release, Released};
use crate::state::events::{EventState, TakeOut, TakeOuts, TAKE_OUT_RANGES};
use crate::state::{ErrorLog, PageErrorKind, PagerId, PagerShared, Parent, Shutdown};
use crate::stats::{Counter, PerCpuStats};
use crate::swap::SwapDevices;
use crate::uffd::Uffd;

type Guard<'a> = RegistryGuard<'a, RegionInner>;
use crate::swapin::READ_ATTEMPTS;
use crate::uffd::{self, Doorbell, Event, RangeResult, UffdMsg, PAGE_SIZE};

/// The events' context: the event state (reader lock, take-out list), the regions'
/// descriptor and the fault mode (reads, copies, unregistering), what pages are released
/// through ([`Release`], and their asynchronous readahead listings), the devices and the
/// parent's (to copy pages out), bounce buffers, counters, the error log and the shutdown
/// flag. Built by [`PagerShared::events_cx`].
#[derive(Clone, Copy)]
pub(crate) struct Events<'a> {
    id: PagerId,
    uffd: &'a Uffd,
    mode: FaultMode,
    parent: &'a Parent,
    devices: &'a SwapDevices,
    bounce: &'a BounceBuffers,
    stats: &'a PerCpuStats,
    events: &'a EventState,
    shutdown: &'a Shutdown,
    errors: &'a ErrorLog,
    release: Release<'a>,
    async_ra: AsyncRa<'a>,
}

impl PagerShared {
    /// The events' context (see [`Events`]).
    pub(crate) fn events_cx(&self) -> Events<'_> {
        Events {
            id: self.id(),
            uffd: &self.uffd,
            mode: self.mode,
            parent: &self.parent,
            devices: &self.devices,
            bounce: &self.bounce,
            stats: &self.stats,
            events: &self.events,
            shutdown: &self.shutdown,
            errors: &self.errors,
            release: self.release_cx(),
            async_ra: self.async_ra_cx(),
        }
    }
}

/// Event reads in progress, over all pagers: set before the read that releases the
/// application's thread, cleared once the event is applied (see `fault::sigbus_fault`).
static EVENTS_IN_FLIGHT: AtomicUsize = AtomicUsize::new(0);

/// Whether some pager is reading or applying an event right now, or still copying the
/// pages of a part moved out of a region into place: a signal-mode fault at an address no
/// region claims is then retried rather than passed on.
pub(crate) fn in_flight() -> bool {
    EVENTS_IN_FLIGHT.load(Ordering::Acquire) > 0 || TAKE_OUT_RANGES.load(Ordering::Acquire) > 0
}

/// The longest a signal-mode fault waits in [`wait_until_applied`] before it goes on; also
/// the bound of a program unmap's wait for its event, and of a new region's for unmaps
/// under way ([`UnmapUnderWay`], [`settle_unmaps`]).
const APPLY_WAIT_LIMIT_NS: u64 = 1_000_000_000;

/// Signal mode: waits until every event that has been read is applied, before a fault is
/// served or a system call's memory is made ready. Returns false if it gave up (counted).
///
/// Why: the read of an event releases the application's thread before the engine applies
/// it. In thread mode a fault raised after that comes as a message behind the event, and is
/// read (under the reader lock) only once the event is applied. A SIGBUS is served at once.
/// After `madvise(MADV_DONTNEED)` returned, an allocator (mimalloc purging a page, then
/// handing it out again) could write the page, and reclaim could move it to the swap cache,
/// all before the `REMOVE` was applied; applying it then freed the slot holding the new
/// data and left the page reading zero (a CPython process writing a pipe under memory
/// pressure lost bytes about one run in five). Waiting here puts each fault after the
/// events its thread has seen, as thread mode does.
///
/// Bounded: the event thread applies an event with page locks only, and an owner of a page
/// lock never waits for an event. But a program's signal handler that faults on the
/// thread that holds a page lock (in the engine, under `prepare_user_access`) would wait
/// here for an event that waits for that lock: after [`APPLY_WAIT_LIMIT_NS`] the fault
/// goes on as it did before this wait existed (and meets the busy page's own bound).
pub(crate) fn wait_until_applied(stats: &PerCpuStats) -> bool {
    if EVENTS_IN_FLIGHT.load(Ordering::Acquire) == 0 {
        return true;
    }
    let deadline = crate::clock::now_ns().saturating_add(APPLY_WAIT_LIMIT_NS);
    bounded_wait(stats, deadline, || EVENTS_IN_FLIGHT.load(Ordering::Acquire) == 0)
}

/// The program's unmaps of managed memory under way, over all pagers: counted from before
/// the kernel's `munmap` until its `UNMAP` is applied, or the wait for that gave up
/// ([`UnmapUnderWay`]).
static UNMAPS_UNDER_WAY: AtomicUsize = AtomicUsize::new(0);

/// Held across a program's `munmap` of part of a managed mapping, from before the system
/// call until the `UNMAP` it sends to this pager is applied: dropping it waits for that
/// (at most a second once the call returned, counted in `fault_event_wait_timeout`).
/// Asynchronous signals stay blocked meanwhile: a program's handler that left by
/// `siglongjmp` would leave the count raised for good. One per pager whose regions the
/// range overlaps; a thread that holds one and maps a region waits the full bound on
/// itself. Bind it to a named variable (`let _ = ...` drops it at once).
///
/// Why: the kernel frees the addresses, drops the `mmap` lock and only then queues the
/// event, which is applied after it is read. In that window another thread's `mmap` can be
/// handed the same addresses and made a region; applied then, the stale `UNMAP` made the new
/// region's pages `Gone`, and its first touch a SIGBUS that no region claimed (Erlang's
/// schedulers, which map and trim their carriers from several threads, died of it within
/// seconds). A new region waits for the unmaps under way (`settle_unmaps`) before it is
/// entered in the registry, where the event would find it.
#[must_use = "the unmap is under way only while this is held"]
pub struct UnmapUnderWay<'a> {
    events: &'a EventState,
    stats: &'a PerCpuStats,
    _signals: crate::uffd::AsyncSignalsBlocked,
}

impl<'a> UnmapUnderWay<'a> {
    pub(crate) fn begin(events: &'a EventState, stats: &'a PerCpuStats) -> Self {
        let _signals = crate::uffd::AsyncSignalsBlocked::new();
        UNMAPS_UNDER_WAY.fetch_add(1, Ordering::SeqCst);
        Self { events, stats, _signals }
    }
}

impl Drop for UnmapUnderWay<'_> {
    fn drop(&mut self) {
        // The `munmap` returned once its event was read (or it sent none): by a read begun
        // by now, which is applied once `reads_applied` reaches it.
        let deadline = crate::clock::now_ns().saturating_add(APPLY_WAIT_LIMIT_NS);
        wait_for_reads_begun(self.events, self.stats, deadline);
        // Saturating: a fork child forgets the count its parent's threads held (none can
        // hold one across a fork: signals are blocked, and engine threads never fork).
        let before = UNMAPS_UNDER_WAY.fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| Some(n.saturating_sub(1)));
        debug_assert!(before.is_ok_and(|n| n > 0), "uswap invariant: more unmaps ended than began");
    }
}

/// Waits until every read of `events`' descriptor begun by now is applied, or `deadline_ns`
/// (counted). Returns false if it gave up.
fn wait_for_reads_begun(events: &EventState, stats: &PerCpuStats, deadline_ns: u64) -> bool {
    let begun = events.reads_begun.load(Ordering::SeqCst);
    bounded_wait(stats, deadline_ns, || events.reads_applied.load(Ordering::Acquire) >= begun)
}

/// Spins, then yields, until `done()` or `deadline_ns` (counted in `FaultEventWaitTimeout`).
fn bounded_wait(stats: &PerCpuStats, deadline_ns: u64, done: impl Fn() -> bool) -> bool {
    let backoff = Backoff::new();
    // Bounded by the deadline.
    while !done() {
        if backoff.is_completed() {
            if crate::clock::now_ns() > deadline_ns {
                stats.inc(Counter::FaultEventWaitTimeout);
                return false;
            }
            std::thread::yield_now();
        } else {
            backoff.snooze();
        }
    }
    true
}

/// Before a new region enters the registry: waits until no program unmap is under way
/// ([`UnmapUnderWay`]) and every event read is applied, so that no `UNMAP` of an earlier
/// mapping at these addresses reaches the new region. Bounded at [`APPLY_WAIT_LIMIT_NS`]
/// in all (counted): a region entered early only meets the race described there. Only the
/// unmaps that go through an interposer holding [`UnmapUnderWay`] are waited for.
pub(crate) fn settle_unmaps(events: &EventState, stats: &PerCpuStats) {
    let deadline = crate::clock::now_ns().saturating_add(APPLY_WAIT_LIMIT_NS);
    if bounded_wait(stats, deadline, || UNMAPS_UNDER_WAY.load(Ordering::SeqCst) == 0) {
        wait_for_reads_begun(events, stats, deadline);
    }
}

/// Waits until every read of `events`' descriptor begun by now is applied (bounded at
/// [`APPLY_WAIT_LIMIT_NS`], counted): the events of calls that have returned to the
/// program are then in the page tables (a fork's record of them, `crate::fork`).
pub(crate) fn settle_reads(events: &EventState, stats: &PerCpuStats) {
    let deadline = crate::clock::now_ns().saturating_add(APPLY_WAIT_LIMIT_NS);
    wait_for_reads_begun(events, stats, deadline);
}

/// A fork child's own threads are the only ones: the counts of unmaps under way, reads in
/// flight and moved parts being copied that its parent's other threads held at the fork
/// would never come down (a SIGBUS at an address no region claims would be retried for good
/// while a copy looked pending).
pub(crate) fn forget_in_fork_child() {
    UNMAPS_UNDER_WAY.store(0, Ordering::SeqCst);
    EVENTS_IN_FLIGHT.store(0, Ordering::SeqCst);
    TAKE_OUT_RANGES.store(0, Ordering::SeqCst);
}

/// Reads up to `msgs.len()` messages and applies the events among them, in order, under
/// the reader lock (see [`crate::state::events::EventState::reader`]). Returns how many messages were read;
/// faults among them are the caller's.
pub(crate) fn read_and_apply(cx: &Events<'_>, msgs: &mut [UffdMsg]) -> usize {
    if cx.uffd.keeper().is_closed() {
        // The number may name a file of the program's now: the keeper reads ours.
        return 0;
    }
    let _reader = cx.events.reader.lock().unwrap_or_else(|e| e.into_inner());
    EVENTS_IN_FLIGHT.fetch_add(1, Ordering::AcqRel);
    // Under the reader lock: reads begin and end in order.
    let read = cx.events.reads_begun.fetch_add(1, Ordering::SeqCst) + 1;
    // EAGAIN reads as 0; EINTR is the only other error a valid descriptor gives.
    let n = cx.uffd.read_msgs(msgs).unwrap_or(0);
    for m in &msgs[..n] {
        if !m.is_page_fault() {
            handle_event(cx, m.event());
        }
    }
    cx.events.reads_applied.store(read, Ordering::Release);
    let _ = EVENTS_IN_FLIGHT.fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| Some(n.saturating_sub(1)));
    n
}

/// Signal mode: reads the regions' descriptor for events (faults come as signals) until the
/// pager shuts down.
pub(crate) fn event_thread(cx: &Events<'_>, bell: &Doorbell) {
    let mut msgs = [UffdMsg::default(); 16];
    while !cx.shutdown.is_set() {
        let n = read_and_apply(cx, &mut msgs);
        let pending = run_take_outs(cx);
        if n == 0 {
            let timeout_ms = if pending { TAKE_OUT_POLL_MS } else { -1 };
            if let uffd::Wake::Closed(fd) = uffd::poll_fault_or_doorbell_for(cx.uffd, bell, timeout_ms) {
                // Parks until the pager shuts down (or the process ends).
                cx.uffd.keeper().found_closed(fd);
            }
        }
    }
}

/// Applies one non-fault message.
fn handle_event(cx: &Events<'_>, event: Event) {
    match event {
        Event::Unmap { start, end } => {
            // The kernel's lock ends with the mapping.
            crate::mlock::unlock(None, start, end);
            crate::fork_advice::forget(start, end);
            cx.events.take_outs.lock().unwrap_or_else(|e| e.into_inner()).drop_range(cx, start, end, true);
            for_each_overlap(cx, start, end, |r, first, last| release(cx, r, first, last, PageState::Gone));
            cx.stats.inc(Counter::UffdUnmap);
        }
        Event::Remove { start, end } => discard(cx, start, end),
        Event::Remap { from, to, len } => {
            remap(cx, from, to, len);
            cx.stats.inc(Counter::UffdRemap);
        }
        // Faults are the caller's; no enabled feature sends anything else.
        Event::PageFault { .. } | Event::Other(_) => {}
    }
}

/// The program discarded `[start, end)` (`MADV_DONTNEED`, `MADV_FREE`): its pages read zero
/// from now on. Under the reader lock.
fn discard(cx: &Events<'_>, start: usize, end: usize) {
    cx.events.take_outs.lock().unwrap_or_else(|e| e.into_inner()).drop_range(cx, start, end, false);
    for_each_overlap(cx, start, end, |r, first, last| release(cx, r, first, last, PageState::Zero));
    cx.stats.inc(Counter::UffdRemove);
}

/// A discard of the program's that the system-call guard saw, for the pagers whose regions'
/// descriptor asks for no `REMOVE` events (signal mode under the guard, `pager::open_uffd`):
/// begun before the system call, applied once it returned ([`ProgramDiscard::applied`]),
/// before the program goes on.
///
/// Why before: from the kernel's zap until the engine's page table says so, a page the
/// engine counts resident is not mapped; a fault on it then waits ([`wait_until_applied`],
/// as for an event being read), and one served after would meet a `Zero` page either way.
/// Why after: only what the kernel did is applied. A call it refused applies nothing, so a
/// page out of RAM keeps its contents (the kernel stops at a locked range with `EINVAL`
/// after it zapped the part before: those pages, if out, come back with their contents,
/// where the kernel's swap would read zero). Asynchronous signals stay blocked meanwhile: a
/// program's handler that discarded too would wait on the reader lock its thread holds.
#[must_use = "the discard is under way only while this is held"]
pub(crate) struct ProgramDiscard {
    _signals: crate::uffd::AsyncSignalsBlocked,
}

impl ProgramDiscard {
    /// Whether a pager without `REMOVE` events may own memory in this process now: the guard
    /// then has discards to apply.
    pub(crate) fn needed() -> bool {
        crate::state::events::WithoutRemoveEvents::any()
    }

    pub(crate) fn begin() -> ProgramDiscard {
        let _signals = crate::uffd::AsyncSignalsBlocked::new();
        EVENTS_IN_FLIGHT.fetch_add(1, Ordering::AcqRel);
        ProgramDiscard { _signals }
    }

    /// The kernel discarded `len` bytes from `start` (a page-aligned address; the length is
    /// rounded up to pages, as the kernel does): [`ProgramDiscard::applied`].
    pub(crate) fn applied_bytes(&self, start: u64, len: u64) {
        let page = crate::uffd::PAGE_SIZE as u64;
        if let Some(end) = len.checked_next_multiple_of(page).and_then(|l| start.checked_add(l)) {
            self.applied(start as usize, end as usize);
        }
    }

    /// The kernel discarded `[start, end)` (page-aligned) for the program: applied for every
    /// pager without `REMOVE` events whose regions it overlaps, one pager at a time, in the
    /// order of their ids (bounded by the number of pagers), as a `REMOVE` event is.
    pub(crate) fn applied(&self, start: usize, end: usize) {
        if start >= end {
            return;
        }
        let mut after = None;
        loop {
            let mut next: Option<std::sync::Arc<crate::state::PagerShared>> = None;
            REGIONS.for_each_overlapping(start, end, |g| {
                let id = g.pager.id();
                let nearer = next.as_ref().is_none_or(|n| id < n.id());
                if !g.pager.uffd.sends_remove_events() && after.is_none_or(|a| id > a) && nearer {
                    next = Some(g.pager.clone());
                }
            });
            let Some(pager) = next else { break };
            after = Some(pager.id());
            let cx = pager.events_cx();
            let _reader = cx.events.reader.lock().unwrap_or_else(|e| e.into_inner());
            discard(&cx, start, end);
        }
    }
}

impl Drop for ProgramDiscard {
    fn drop(&mut self) {
        let _ = EVENTS_IN_FLIGHT.fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| Some(n.saturating_sub(1)));
    }
}

/// Calls `f(region, first_page, end_page)` for the pages of each of this pager's regions
/// inside `[start, end)`.
pub(crate) fn for_each_overlap(cx: &Events<'_>, start: usize, end: usize, mut f: impl FnMut(&Guard<'_>, usize, usize)) {
    assert!(start <= end, "uswap invariant: a range [{start:#x}, {end:#x}) that ends before it starts");
    REGIONS.for_each_overlapping(start, end, |g| {
        if g.pager.id() != cx.id {
            return;
        }
        let (rs, re) = (g.start(), g.start() + g.nr_pages * PAGE_SIZE);
        let (s, e) = (start.max(rs), end.min(re));
        if s < e {
            let (first, last) = ((s - rs) / PAGE_SIZE, (e - rs).div_ceil(PAGE_SIZE));
            assert!(first < last && last <= g.nr_pages);
            f(g, first, last);
        }
    });
}

/// Takes ownership of a page, waiting for its current owner (a fault or reclaim, which
/// never waits for an event to be read: see the module doc).
pub(crate) fn lock_page(r: &RegionInner, page: usize) -> Pte {
    let backoff = Backoff::new();
    // Not time-bounded, on purpose: the event must be applied, and the owner holds the page
    // for one device operation and never waits for this reader (lock hierarchy level 0).
    assert!(page < r.nr_pages, "uswap invariant: page {page} of a region of {} pages", r.nr_pages);
    loop {
        let pte = r.load(page);
        if let Some(l) = r.try_lock(page, pte) {
            return l;
        }
        if backoff.is_completed() {
            std::thread::yield_now();
        } else {
            backoff.snooze();
        }
    }
}

/// Drops everything pages `[first, last)` own (slot, swap-cache page, charge) and leaves
/// them in state `to`: `Zero` (discarded: they read zero) or `Gone` (unmapped).
fn release(cx: &Events<'_>, r: &Guard<'_>, first: usize, last: usize, to: PageState) {
    assert!(matches!(to, PageState::Zero | PageState::Gone), "released pages read zero or are gone, not {to:?}");
    assert!(first <= last && last <= r.nr_pages);
    // Past the touched part every page is `None` or `Gone` and owns nothing, and `None` reads
    // zero as `Zero` does: a discard leaves those words unwritten. GHC's runtime reserves 1
    // TiB and discards all of it at start; writing `Zero` there made 2 GiB of the page table
    // resident, a word for each of its 268 M pages. (A fault that maps a page there after
    // this load races the kernel's zap as one on a page released above does.)
    let last = if to == PageState::Zero { last.min(r.touched_end()).max(first) } else { last };
    let mut released = Released::default();
    for page in first..last {
        let pte = lock_page(r, page);
        if pte.state() == PageState::Gone {
            r.store(page, pte.unbusy());
            continue;
        }
        if pte.state() == PageState::Swapped && pte.async_read() {
            // Its slot is freed: a later owner of the slot must never be served the data an
            // asynchronous readahead read for this page.
            let owner = PageRef { region_idx: r.index, region_gen: r.gen, page_gen: 0, page }.owner();
            cx.async_ra.forget_page(owner, pte.entry());
        }
        cx.release.release_page(pte, &mut released);
        if to == PageState::Gone {
            r.note_going(1);
        }
        r.store(page, pte.next(to, None).with_referenced(false));
    }
    cx.release.apply_released(released);
}

/// An `mremap` that moved `[from, from + len)` to `to` (`len` is the old length: a grown
/// mapping is longer at `to`).
fn remap(cx: &Events<'_>, from: usize, to: usize, len: usize) {
    // The kernel moves whole pages.
    assert!(
        (from | to | len) % PAGE_SIZE == 0,
        "uswap invariant: a remap of {len:#x} bytes from {from:#x} to {to:#x} is not page-aligned"
    );
    let mut take_outs = cx.events.take_outs.lock().unwrap_or_else(|e| e.into_inner());
    // Memory moved on again before its pages were copied in: the copies follow it.
    take_outs.remap(from, to, len);
    let mut whole = None;
    REGIONS.for_each(|g| {
        if g.pager.id() == cx.id && g.start() == from && g.nr_pages * PAGE_SIZE == len {
            whole = Some(g.index);
        }
    });
    if let Some(idx) = whole {
        // The page table moved with the pages: only the address changes.
        REGIONS.set_range(idx, to, to + len, |r| r.set_start(to));
        crate::fork_advice::moved(from, to, len);
    } else {
        let mut moved_out = false;
        for_each_overlap(cx, from, from + len, |r, first, last| {
            detach(cx, r, first, last, to + (r.page_addr(first) - from), &mut take_outs);
            moved_out = true;
        });
        if !moved_out {
            return;
        }
        // Ordinary memory from now on, once the pages detached above are in place.
        take_outs.ranges.push((to, to + len));
    }
    // A grown mapping: the part past the old length is new, zero memory the engine knows
    // nothing of; it is let go of with the rest (for a whole region, on its own).
    if let Some(end) = grown_end(cx, to + len, &take_outs) {
        take_outs.ranges.push((to + len, end));
    }
    take_outs.publish(cx.events);
}

/// A partial move: pages `[first, last)` of `r` now live at `dst`. Each becomes `Gone` in
/// the region at once, so the `UNMAP` of the old range that the kernel sends next finds
/// nothing to free; those not in place (staged or swapped) keep their slot, staging page
/// and charge in `take_outs` until [`run_take_outs`] has copied them to their new address.
fn detach(cx: &Events<'_>, r: &Guard<'_>, first: usize, last: usize, dst: usize, take_outs: &mut TakeOuts) {
    assert!(first <= last && last <= r.nr_pages && dst % PAGE_SIZE == 0);
    let mut released = Released::default();
    for page in first..last {
        // Locked before its state is read: a reclaim round that owns the page may be moving
        // it into the swap cache right now, and its state says so only once it lets go.
        let pte = lock_page(r, page);
        let gone = pte.next(PageState::Gone, None).with_referenced(false);
        if pte.state() != PageState::Gone {
            r.note_going(1);
        }
        match pte.state() {
            PageState::Cached | PageState::Swapped | PageState::Parent => {
                if pte.state() == PageState::Swapped && pte.async_read() {
                    // Read again from the device by the copy: no asynchronous read may serve
                    // the slot once it is freed.
                    let owner = PageRef { region_idx: r.index, region_gen: r.gen, page_gen: 0, page }.owner();
                    cx.async_ra.forget_page(owner, pte.entry());
                }
                take_outs.pages.push(TakeOut { dst: dst + (page - first) * PAGE_SIZE, pte: pte.unbusy() });
            }
            // In place at `dst` already (moved with the page tables), or zero.
            _ => cx.release.release_page(pte, &mut released),
        }
        r.store(page, gone);
    }
    cx.release.apply_released(released);
}

/// Where the mapping that holds `addr - 1` ends, if it goes on past `addr`: the kernel
/// grew it (`mremap` to a larger size). Clipped at the next address the engine manages,
/// since the kernel may have merged the new mapping with a region's. Read from
/// `/proc/self/maps`; events are rare, and this runs on an engine thread.
fn grown_end(cx: &Events<'_>, addr: usize, take_outs: &TakeOuts) -> Option<usize> {
    let end = crate::mapping::self_maps()?.iter().find_map(|m| (m.start < addr && addr < m.end).then_some(m.end))?;
    let mut clip = end;
    REGIONS.for_each(|g| {
        if g.pager.id() == cx.id && g.start() >= addr {
            clip = clip.min(g.start());
        }
    });
    for &(s, _) in &take_outs.ranges {
        if s >= addr {
            clip = clip.min(s);
        }
    }
    (clip > addr).then_some(clip)
}

impl TakeOuts {
    /// The application unmapped (`unmap`) or discarded `[start, end)`: pending pages there
    /// are let go of (they read zero, or are gone); an unmapped range needs no unregistering.
    fn drop_range(&mut self, cx: &Events<'_>, start: usize, end: usize, unmap: bool) {
        assert!(start <= end);
        let mut released = Released::default();
        self.pages.retain(|t| {
            let inside = (start..end).contains(&t.dst);
            if inside {
                cx.release.release_page(t.pte, &mut released);
            }
            !inside
        });
        cx.release.apply_released(released);
        if unmap {
            let mut out = Vec::with_capacity(self.ranges.len() + 1);
            for &(s, e) in &self.ranges {
                if s < start.min(e) {
                    out.push((s, start.min(e)));
                }
                if end.max(s) < e {
                    out.push((end.max(s), e));
                }
            }
            self.ranges = out;
        }
        self.publish(cx.events);
    }
}

/// How long pages of a moved part may wait for their copy (`UFFDIO_COPY` keeps failing
/// with `EAGAIN` while an event is pending) before they are given up on, counted in
/// `fault_error`. Every event is read within microseconds, so this bound is never reached
/// unless the kernel misbehaves; it keeps a fault on the moved part from retrying forever.
const TAKE_OUT_LIMIT_NS: u64 = 10_000_000_000;

/// How long a reader polls before trying pending copies again: the `EAGAIN` ends when the
/// thread that called `mremap` runs again, which sends no message.
pub(crate) const TAKE_OUT_POLL_MS: i32 = 1;

/// Whether `addr` lies in a part moved out of a region that is not yet ordinary memory (a
/// fault there waits for its copy, or for the range to be unregistered, which wakes it).
pub(crate) fn is_pending(cx: &Events<'_>, addr: usize) -> bool {
    if cx.events.pending_ranges.load(Ordering::Acquire) == 0 {
        return false;
    }
    let t = cx.events.take_outs.lock().unwrap_or_else(|e| e.into_inner());
    t.ranges.iter().any(|&(s, e)| (s..e).contains(&addr))
}

/// Copies the pending pages of moved parts to their new addresses and unregisters the
/// ranges that have nothing pending left. Returns whether anything is still pending (then
/// call again after reading the descriptor: a copy fails with `EAGAIN` until the event
/// that blocks it has been read and its thread has run). Never waits for another reader: if
/// one runs it right now, returns at once (a wait for a bounce buffer is bounded, see `bounce`).
pub(crate) fn run_take_outs(cx: &Events<'_>) -> bool {
    if cx.events.pending_ranges.load(Ordering::Acquire) == 0 {
        return false;
    }
    let Ok(mut t) = cx.events.take_outs.try_lock() else {
        return true;
    };
    let expired = crate::clock::now_ns().saturating_sub(t.since_ns) > TAKE_OUT_LIMIT_NS;
    let Some(mut buf) = cx.bounce.take() else {
        // Every bounce buffer stayed lent out past the bound: nothing was taken out; the
        // caller tries again after `TAKE_OUT_POLL_MS` (`t` stays as it was).
        cx.stats.inc(Counter::BounceWaitTimeout);
        return true;
    };
    let mut released = Released::default();
    // Bounded by the pending pages: each round removes one, or stops at an EAGAIN.
    while let Some(&TakeOut { dst, pte }) = t.pages.last() {
        let r = copy_page(cx, dst, pte, &mut buf.pages_mut()[0]);
        match r {
            RangeResult::Partial { errno: libc::EAGAIN, .. } if !expired => break,
            RangeResult::Done => cx.stats.inc(Counter::RemapCopied),
            // Something is there already: the application's (it cannot be ours).
            RangeResult::Partial { errno: libc::EEXIST, .. } => {}
            RangeResult::Partial { .. } => {
                cx.stats.inc(Counter::FaultError);
                cx.errors.record(dst, pte.entry(), PageErrorKind::ReadFailed);
            }
        }
        t.pages.pop();
        cx.release.release_page(pte, &mut released);
    }
    drop(buf);
    cx.release.apply_released(released);
    if t.pages.is_empty() {
        for (s, e) in std::mem::take(&mut t.ranges) {
            // Wakes whatever still waits there: it faults again on ordinary memory. Fails
            // only where the application unmapped the range meanwhile.
            let _ = cx.uffd.unregister(s, e - s);
        }
    }
    t.publish(cx.events);
    !t.ranges.is_empty()
}

/// Reads the page at `entry` of the parent's device (a fork child's `PageState::Parent`
/// page, see `crate::state::Parent`) into a bounce buffer, checks it, and hands it to `map`.
/// Up to `READ_ATTEMPTS` reads; `Err` when none read back, or no buffer came free.
/// Allocation- and lock-free: the fault path of signal mode calls it.
pub(crate) fn read_from_parent(
    cx: &Events<'_>,
    entry: crate::swap::SwapEntry,
    map: impl FnOnce(&[u8]) -> RangeResult,
) -> Result<RangeResult, crate::state::fault_error::FaultError> {
    read_run_from_parent(cx, entry, 1, |pages| map(&pages[0].0))
}

/// [`read_from_parent`] for a run: the pages of `n` consecutive slots from `entry`, read in
/// one request, each checked. Hands `map` the pages read: all `n`, or, when the run did not
/// read back (or `n` exceeds a bounce buffer), only the first, read alone.
pub(crate) fn read_run_from_parent<T>(
    cx: &Events<'_>,
    entry: crate::swap::SwapEntry,
    n: usize,
    map: impl FnOnce(&[AlignedPage]) -> T,
) -> Result<T, crate::state::fault_error::FaultError> {
    use crate::state::fault_error::FaultError;
    let Some(parent) = cx.parent.devices() else {
        // Only a re-armed fork child has `Parent` pages, and it has the parent's state.
        return Err(FaultError::Device(PageErrorKind::ReadFailed, "no parent state in this fork child"));
    };
    let Some(mut buf) = cx.bounce.take() else {
        cx.stats.inc(Counter::BounceWaitTimeout);
        return Err(FaultError::BounceTimeout);
    };
    let dev = parent.device(entry);
    let pages = buf.pages_mut();
    if n > 1 && n <= pages.len() {
        let mut req = [ReadReq::new(entry.offset(), &mut pages[..n])];
        dev.backend.read(&mut req);
        let ok = req[0].result.is_ok();
        if ok && (0..n).all(|k| dev.checksum_ok(entry.offset() + k as u64, &pages[k].0)) {
            return Ok(map(&pages[..n]));
        }
    }
    read_checked(dev, entry.offset(), &mut pages[0]).map_err(|(kind, cause)| FaultError::Device(kind, cause))?;
    Ok(map(&pages[..1]))
}

/// Reads slot `offset` of `dev` into `page` and checks it, up to `READ_ATTEMPTS` times. The
/// error is the last attempt's, with what the device said (empty on a checksum mismatch).
/// Allocation- and lock-free where the device's reads are.
pub(crate) fn read_checked(
    dev: &crate::swap::SwapDevice,
    offset: u64,
    page: &mut AlignedPage,
) -> Result<(), (PageErrorKind, &'static str)> {
    let mut why = (PageErrorKind::ReadFailed, "");
    for _ in 0..READ_ATTEMPTS {
        let mut req = [ReadReq::new(offset, std::slice::from_mut(page))];
        dev.backend.read(&mut req);
        if let Err(e) = &req[0].result {
            why = (PageErrorKind::ReadFailed, e.cause());
            continue;
        }
        if dev.checksum_ok(offset, &page.0) {
            return Ok(());
        }
        // A mismatch after a read that failed with a cause keeps the cause (as a swap-in
        // does): it is what the user can act on.
        if why.1.is_empty() {
            why = (PageErrorKind::ChecksumMismatch, "");
        }
    }
    Err(why)
}

/// Maps a copy of the page `pte` holds (staged or swapped) at `dst`: one attempt, `EAGAIN`
/// left to the caller. A swapped page is read (and its checksum checked) up to
/// `READ_ATTEMPTS` times; one that never reads back is reported as `EIO`.
pub(crate) fn copy_page(cx: &Events<'_>, dst: usize, pte: Pte, buf: &mut AlignedPage) -> RangeResult {
    let e = pte.entry();
    let dev = cx.devices.device(e);
    let wake = cx.mode == FaultMode::Thread;
    if pte.state() == PageState::Parent {
        let copied = read_from_parent(cx, e, |data| cx.uffd.copy(dst, data.as_ptr(), PAGE_SIZE, wake, false));
        return copied.unwrap_or(RangeResult::Partial { done_bytes: 0, errno: libc::EIO });
    }
    if pte.state() == PageState::Cached {
        return cx.uffd.copy(dst, dev.staging_addr(e.offset()) as *const u8, PAGE_SIZE, wake, false);
    }
    if read_checked(dev, e.offset(), buf).is_err() {
        return RangeResult::Partial { done_bytes: 0, errno: libc::EIO };
    }
    cx.stats.inc(Counter::Pswpin);
    cx.uffd.copy(dst, buf.0.as_ptr(), PAGE_SIZE, wake, false)
}
