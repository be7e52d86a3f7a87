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
//!   lose their slots; resident ones their charge.
//! * `REMAP` (`mremap` that moves): a move of the whole region moves the region (its address
//!   and its registry entry); the engine goes on paging it at the new address. A move of
//!   part of a region takes that part out of uswap's management: every page of it that is
//!   not in place (staged or swapped) is copied into place at the new address, the new range
//!   is unregistered (it is ordinary memory from then on, not counted against the limit) and
//!   the old pages are `Gone`.
//!
//! The thread that caused an event waits in the kernel until the event is *read*, and is
//! released by that read, before the engine has acted on it. So there is a window between
//! the application's call returning and the engine's page table saying so; the engine
//! narrows what can go wrong in it:
//! * reclaim moves pages out through the staging area's descriptor; a page that is not there
//!   any more (`ENOENT`) stays as it is for the event to settle, never turns into a zero page;
//! * in signal mode, a SIGBUS at an address no region claims while an event is being handled
//!   is retried rather than passed on (a whole-region `mremap` not yet applied);
//! * residual: a reclaim round that locked a page before an `UNMAP` and moves it after the
//!   application has mapped new memory at that address *and* touched it, all before the
//!   event thread marked the page `Gone`, moves that new page into the swap cache. The
//!   window is one `UFFDIO_MOVE` long and needs a second thread of the application mapping
//!   at the exact address; it is not closed.
//!
//! The engine's own unmaps and discards send no events: a dropped region is unregistered
//! before it is unmapped, and staging pages belong to a second descriptor that asks for
//! none (clean pages leave a region by `UFFDIO_MOVE` into their slot's staging page, not by
//! `MADV_DONTNEED` on the region).
//!
//! Locking: every page is taken through its busy bit. An owner never waits for an event to
//! be read (reclaim's moves and discards go through the staging descriptor, which has no
//! events; an ioctl on the regions' descriptor that meets a pending event fails with
//! `EAGAIN`, and the fault is retried), so waiting for a busy bit here ends.

use std::sync::atomic::{AtomicUsize, Ordering};

use crossbeam_utils::Backoff;

use crate::backend::ReadReq;
use crate::mapping::registry::RegistryGuard;
use crate::pager::{PageErrorKind, PagerShared, Released};
use crate::region::{PageRef, PageState, Pte, RegionInner, REGIONS};

type Guard<'a> = RegistryGuard<'a, RegionInner>;
use crate::stats::Counter;
use crate::uffd::{self, Doorbell, RangeResult, UffdMsg, PAGE_SIZE};

/// Event reads in progress, over all pagers: set before the read that releases the
/// application's thread, cleared once the event is applied (see `fault::sigbus_fault`).
static EVENTS_IN_FLIGHT: AtomicUsize = AtomicUsize::new(0);

/// Whether some pager is reading or applying an event right now.
pub(crate) fn in_flight() -> bool {
    EVENTS_IN_FLIGHT.load(Ordering::Acquire) > 0
}

/// Signal mode: reads the regions' descriptor for events (faults come as signals) until the
/// pager shuts down.
pub(crate) fn event_thread(p: &PagerShared, bell: &Doorbell) {
    let mut msgs = [UffdMsg::default(); 16];
    while !p.is_shutdown() {
        EVENTS_IN_FLIGHT.fetch_add(1, Ordering::AcqRel);
        // EAGAIN reads as 0; EINTR is the only other error a valid descriptor gives.
        let n = p.uffd.read_msgs(&mut msgs).unwrap_or(0);
        for m in &msgs[..n] {
            handle_event(p, m);
        }
        EVENTS_IN_FLIGHT.fetch_sub(1, Ordering::AcqRel);
        if n == 0 {
            uffd::poll_fault_or_doorbell(&p.uffd, bell);
        }
    }
}

/// Applies one non-fault message (thread mode's handlers call this too).
pub(crate) fn handle_event(p: &PagerShared, m: &UffdMsg) {
    match m.event {
        uffd::EVENT_UNMAP => {
            let (start, end) = m.range();
            for_each_overlap(p, start, end, |r, first, last| release(p, r, first, last, PageState::Gone));
            p.stats.inc(Counter::UffdUnmap);
        }
        uffd::EVENT_REMOVE => {
            let (start, end) = m.range();
            for_each_overlap(p, start, end, |r, first, last| release(p, r, first, last, PageState::Zero));
            p.stats.inc(Counter::UffdRemove);
        }
        uffd::EVENT_REMAP => {
            let (from, to, len) = m.remap();
            remap(p, from, to, len);
            p.stats.inc(Counter::UffdRemap);
        }
        _ => {}
    }
}

/// Calls `f(region, first_page, end_page)` for the pages of each of this pager's regions
/// inside `[start, end)`.
fn for_each_overlap(p: &PagerShared, start: usize, end: usize, mut f: impl FnMut(&Guard<'_>, usize, usize)) {
    REGIONS.for_each(|g| {
        if !std::ptr::eq(&*g.pager, p) {
            return;
        }
        let (rs, re) = (g.start(), g.start() + g.nr_pages * PAGE_SIZE);
        let (s, e) = (start.max(rs), end.min(re));
        if s < e {
            f(g, (s - rs) / PAGE_SIZE, (e - rs).div_ceil(PAGE_SIZE));
        }
    });
}

/// Takes ownership of a page, waiting for its current owner (a fault or reclaim, which
/// never waits for an event to be read: see the module doc).
fn lock_page(r: &RegionInner, page: usize) -> Pte {
    let backoff = Backoff::new();
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
fn release(p: &PagerShared, r: &Guard<'_>, first: usize, last: usize, to: PageState) {
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
            p.async_ra.forget_page(p, owner, pte.entry());
        }
        p.release_page(pte, &mut released);
        r.store(page, pte.next(to, None).with_referenced(false));
    }
    p.apply_released(released);
}

/// An `mremap` that moved `[from, from + len)` to `to`.
fn remap(p: &PagerShared, from: usize, to: usize, len: usize) {
    let mut whole = None;
    REGIONS.for_each(|g| {
        if std::ptr::eq(&*g.pager, p) && g.start() == from && g.nr_pages * PAGE_SIZE == len {
            whole = Some(g.index);
        }
    });
    if let Some(idx) = whole {
        // The page table moved with the pages: only the address changes.
        REGIONS.set_range(idx, to, to + len, |r| r.set_start(to));
        return;
    }
    let mut moved_out = false;
    for_each_overlap(p, from, from + len, |r, first, last| {
        take_out(p, r, first, last, to + (r.page_addr(first) - from));
        moved_out = true;
    });
    if moved_out {
        // Ordinary memory from now on: faults there are the kernel's.
        let _ = p.uffd.unregister(to, len);
    }
}

/// A partial move: pages `[first, last)` of `r` now live at `dst`; brings the ones that are
/// not in place (staged or swapped) there, and lets the range go.
///
/// Known open problem: in signal mode every `UFFDIO_COPY` here fails with `EAGAIN` (the
/// kernel's "mappings changing" mark stays set while the application's thread retries its
/// SIGBUS), so each page waits out `copy_in`'s second and is then lost. Thread mode works
/// (`thread_mode_mremap_part_of_a_region`).
fn take_out(p: &PagerShared, r: &Guard<'_>, first: usize, last: usize, dst: usize) {
    let mut buf = p.bounce.take();
    for page in first..last {
        // Locked before its state is read: a reclaim round that owns the page may be moving
        // it into the swap cache right now, and its state says so only once it lets go.
        let pte = lock_page(r, page);
        if matches!(pte.state(), PageState::Cached | PageState::Swapped) {
            let at = dst + (page - first) * PAGE_SIZE;
            let e = pte.entry();
            let dev = p.devices.device(e);
            let res = match pte.state() {
                PageState::Cached => copy_in(p, at, dev.staging_addr(e.offset()) as *const u8),
                PageState::Swapped => {
                    let pages = &mut buf.pages_mut()[..1];
                    let mut req = [ReadReq::new(e.offset(), pages)];
                    dev.backend.read(&mut req);
                    let ok = req[0].result.is_ok();
                    let data = &buf.pages_mut()[0].0;
                    if ok && dev.checksum_ok(e.offset(), data) {
                        copy_in(p, at, data.as_ptr())
                    } else {
                        p.record_error(at, e, PageErrorKind::ReadFailed);
                        RangeResult::Partial { done_bytes: 0, errno: libc::EIO }
                    }
                }
                _ => RangeResult::Done,
            };
            if let RangeResult::Partial { errno, .. } = res {
                if errno != libc::EEXIST {
                    p.stats.inc(Counter::FaultError);
                }
            }
        }
        r.store(page, pte.unbusy());
    }
    drop(buf);
    release(p, r, first, last, PageState::Gone);
}

/// Maps a copy of one page at `at`. The thread that moved the range clears the kernel's
/// "mappings changing" mark only once it runs again after the event was read; until then
/// the ioctl fails with `EAGAIN`, so it is retried, yielding, for up to a second.
fn copy_in(p: &PagerShared, at: usize, src: *const u8) -> RangeResult {
    let deadline = crate::mapping::now_ns() + 1_000_000_000;
    loop {
        let r = p.uffd.copy(at, src, PAGE_SIZE, true, false);
        match r {
            RangeResult::Partial { errno: libc::EAGAIN, .. } if crate::mapping::now_ns() < deadline => {
                std::thread::yield_now();
            }
            _ => return r,
        }
    }
}
