//! Fault service: [`serve_fault`] brings one missing page into a region, whatever delivered
//! the fault (`crate::fault`: a handler thread, or the faulting thread's SIGBUS handler):
//!
//! * never touched / known zero → for a read, `UFFDIO_ZEROPAGE` and `UFFDIO_WRITEPROTECT`:
//!   the kernel's zero page, `Shared`, neither charged nor a reclaim victim until its first
//!   write (a write-protect fault) charges it, as the kernel charges nothing for a read of
//!   anonymous memory never written; for a write, `UFFDIO_COPY` of a zero page (saves the
//!   copy-on-write fault that would follow a zero-page mapping);
//! * staged in the swap cache → `UFFDIO_MOVE` back from the staging page: no copy;
//! * on a device → `swapin`: read the slot with its readahead window (in place for the RAM
//!   device, else into a bounce buffer) and `UFFDIO_COPY` them in.
//!
//! First touches of a sequential stream map the never-touched pages of their window too
//! (fault-around, the user-space analogue of the kernel's multi-size anonymous THP).
//!
//! On the signal-mode route the service allocates nothing and takes no lock the thread
//! could hold (`Route::SignalLockFree`: no direct reclaim, slot frees deferred).
//!
//! Locking: none of its own; ownership of a page is its busy bit (see `crate::page_table`).

use arrayvec::ArrayVec;
use crossbeam_utils::Backoff;

use crate::mapping::now_ns;
use crate::readahead::MAX_WINDOW_PAGES;
use crate::region::{PageRef, PageState, Pte, RegionInner};
use crate::state::fault::{note_window, FaultError, Route};
use crate::state::{FaultMode, PageErrorKind, PagerShared};
use crate::stats::Counter;
use crate::swapin::{swap_in, Fault};
use crate::uffd::{self, RangeResult, PAGE_SIZE};
use crate::{events, reclaim};

/// Zeros, the source of `UFFDIO_COPY` for first writes (a fault-around window's worth).
#[repr(C, align(4096))]
struct ZeroPages([u8; MAX_WINDOW_PAGES * PAGE_SIZE]);
static ZERO_PAGES: ZeroPages = ZeroPages([0; MAX_WINDOW_PAGES * PAGE_SIZE]);

/// How long a fault waits for another owner of its page before failing. Owners hold a
/// page for one device operation (a batch write to a file device under load: milliseconds);
/// ten seconds is beyond any legitimate wait, and a fault that fails ends in SIGBUS with
/// the page's address, where waiting would hang the thread forever.
const BUSY_WAIT_LIMIT_NS: u64 = if cfg!(test) { 200_000_000 } else { 10_000_000_000 };

/// Serves a missing-page fault at `addr` (any address in the page). `reg_idx`/`reg_gen`
/// name the region in the registry (for the reclaim queues).
pub(crate) fn serve_fault(
    region: &RegionInner,
    reg_idx: usize,
    reg_gen: u32,
    addr: usize,
    write: bool,
    route: Route,
) -> Result<(), FaultError> {
    let t0 = now_ns();
    let pager = &*region.pager;
    let Some(page) = region.page_of(addr) else {
        return Err(FaultError::Gone);
    };
    region.note_touched(page);
    let page_addr = region.page_addr(page);
    let backoff = Backoff::new();
    // Bounded: each round either takes ownership of the page, or waits for the current owner
    // (another fault, or reclaim) to finish a short critical section; a wait past
    // BUSY_WAIT_LIMIT_NS fails the fault (counted, recorded) rather than hang.
    let result = loop {
        let pte = region.load(page);
        if pte.busy() {
            if route == Route::Thread && reclaim::cow::claim_for_fault(pager, page_addr) {
                // The background reclaimer owns the page and is making it exclusive; it may be
                // waiting for this very fault (see `reclaim::cow`). A missing page there was
                // discarded by the application: zeros. A present one (a write-protect fault
                // raised before the page was unprotected) only needs its thread woken.
                if pager.uffd.zeropage(page_addr, PAGE_SIZE, true) != RangeResult::Done {
                    let _ = pager.uffd.wake(page_addr, PAGE_SIZE);
                }
                break Ok(());
            }
            if backoff.is_completed() && now_ns().saturating_sub(t0) > BUSY_WAIT_LIMIT_NS {
                pager.stats.inc(Counter::FaultBusyTimeout);
                pager.record_error(page_addr, pte.entry(), PageErrorKind::BusyTimeout);
                break Err(FaultError::BusyTimeout);
            }
            backoff.snooze();
            continue;
        }
        let Some(locked) = region.try_lock(page, pte) else {
            continue;
        };
        match pte.state() {
            PageState::None | PageState::Zero => {
                break zero_fill(pager, region, reg_idx, reg_gen, page, locked, write, route)
            }
            PageState::Resident if pte.clean() => {
                // The first write to a clean page (a write-protect fault): it is dirty now and
                // its slot's copy goes stale. (In signal mode the SIGBUS may also be a missing
                // fault on a clean page the application discarded: then the retried access
                // faults again and is served as below.)
                let r = pager.uffd.writeprotect(page_addr, PAGE_SIZE, false, route.wake());
                if r.as_ref().is_err_and(|e| e.raw_os_error() == Some(libc::EAGAIN)) {
                    // An event is pending: nothing changed, the write faults again.
                    region.store(page, locked.unbusy());
                    break Err(FaultError::Ioctl(libc::EAGAIN));
                }
                pager.devices.free(pte.entry(), route.lock_free());
                region.store(page, locked.dirtied());
                pager.clean_pages.fetch_sub(1, std::sync::atomic::Ordering::Relaxed);
                pager.stats.inc(Counter::PgfaultWp);
                if pte.readahead() {
                    // Written: a read-ahead page the application used.
                    pager.stats.inc(Counter::SwapRaHit);
                    region.streams.note_used(1);
                }
                if let Err(e) = r {
                    if e.raw_os_error() != Some(libc::ENOENT) {
                        break Err(FaultError::Ioctl(e.raw_os_error().unwrap_or(libc::EIO)));
                    }
                }
                break Ok(());
            }
            PageState::Resident => {
                // Either another thread mapped it after our fault was raised, or the
                // application discarded it (MADV_DONTNEED), which reads back as zeros.
                // In thread mode the first case is common: a swap-in maps its faulting page
                // (waking the thread) before its readahead pages, the thread faults on one of
                // those meanwhile, and the message of that fault, still read by another
                // handler, is served after the page is mapped, while its thread runs on.
                let r = pager.uffd.zeropage(page_addr, PAGE_SIZE, route.wake());
                region.store(page, locked.unbusy());
                match r {
                    RangeResult::Done => {}
                    RangeResult::Partial { errno, .. } if errno == libc::EEXIST => {
                        if route.wake() {
                            let _ = pager.uffd.wake(page_addr, PAGE_SIZE);
                        }
                        pager.stats.inc(Counter::FaultRaced);
                    }
                    // One page, so no registered mapping at this address (the range of a fill
                    // ioctl lies in one registered mapping or it fails with ENOENT): the
                    // application unmapped the page since it was mapped for the racing fault.
                    // Not a lost page: a SIGBUS here used to hit a thread that had read the
                    // page and moved on, e.g. into that very munmap.
                    RangeResult::Partial { errno: libc::ENOENT, .. } => break Err(FaultError::Unmapped),
                    RangeResult::Partial { errno, .. } => break Err(FaultError::Ioctl(errno)),
                }
                break Ok(());
            }
            PageState::Cached => {
                let e = pte.entry();
                let dev = pager.devices.device(e);
                let staged = dev.staging_addr(e.offset());
                let mut r = pager.uffd.move_pages(page_addr, staged, PAGE_SIZE, route.wake());
                let mut copied = false;
                if r == (RangeResult::Partial { done_bytes: 0, errno: libc::EINVAL }) {
                    copied = true;
                    // UFFDIO_MOVE needs equal protections on both sides: the application made
                    // the region read-only (mprotect). Copy the staged page, then drop it.
                    r = pager.uffd.copy(page_addr, staged as *const u8, PAGE_SIZE, route.wake(), false);
                    if r == RangeResult::Done {
                        let _ = dev.staging.discard(e.offset() as usize * PAGE_SIZE, PAGE_SIZE);
                        pager.stats.inc(Counter::PgfaultSwapcacheCopy);
                    }
                }
                if let RangeResult::Partial { errno, .. } = r {
                    region.store(page, locked.unbusy());
                    // ENOENT: no mapping at the page any more (a stale fault, as above), or,
                    // from the move only, no staged page to move (the engine broke its own
                    // rule: reported as a failure). A copy checks the destination first.
                    if errno == libc::ENOENT && (copied || crate::mapping::page_present(staged)) {
                        break Err(FaultError::Unmapped);
                    }
                    break Err(FaultError::Ioctl(errno));
                }
                pager.swap_cache.remove(dev, e.offset());
                pager.devices.free(e, route.lock_free());
                // Referenced: it came back from the swap cache, so reclaim spares it once.
                let new = locked.next(PageState::Resident, None).with_referenced(true);
                region.store(page, new);
                pager.lru.add(page_ref(reg_idx, reg_gen, page, new.gen()), &pager.stats);
                pager.stats.inc(Counter::PgfaultSwapcache);
                break Ok(());
            }
            PageState::Swapped => {
                let f = Fault { region, reg_idx, reg_gen, page, locked, write, route };
                break swap_in(pager, &f);
            }
            PageState::Shared => {
                // A re-armed fork child's first write to a page it shares with its parent (or,
                // missing, a page the application discarded: then the access faults again and
                // is served as a resident page that is not there, with zeros). From now on the
                // page is this process's own: charged, on the LRU, writable (the kernel makes
                // the copy when the write is retried).
                reclaim::charge(pager, 1, route.lock_free());
                let r = pager.uffd.writeprotect(page_addr, PAGE_SIZE, false, route.wake());
                if r.as_ref().is_err_and(|e| e.raw_os_error() == Some(libc::EAGAIN)) {
                    // An event is pending: nothing changed, the write faults again.
                    reclaim::uncharge(pager, 1);
                    region.store(page, locked.unbusy());
                    break Err(FaultError::Ioctl(libc::EAGAIN));
                }
                let new = locked.next(PageState::Resident, None);
                region.store(page, new);
                pager.lru.add(page_ref(reg_idx, reg_gen, page, new.gen()), &pager.stats);
                pager.stats.inc(Counter::PgfaultWp);
                break Ok(());
            }
            PageState::Parent => {
                let f = Fault { region, reg_idx, reg_gen, page, locked, write, route };
                break parent_in(pager, &f);
            }
            PageState::Gone => {
                region.store(page, locked.unbusy());
                break Err(FaultError::Gone);
            }
        }
    };
    pager.stats.inc(Counter::Pgfault);
    if route.lock_free() {
        pager.stats.inc(Counter::FaultLockFree);
    }
    // Gone and Unmapped lose nothing: the address is not the region's any more. EAGAIN is
    // an event (a discard, an unmap) pending for the range: the thread faults again once it
    // is applied.
    if matches!(result, Err(FaultError::Unmapped) | Err(FaultError::Ioctl(libc::EAGAIN))) {
        pager.stats.inc(Counter::FaultRaced);
    } else if result.is_err() && result != Err(FaultError::Gone) {
        pager.stats.inc(Counter::FaultError);
    }
    pager.stats.record_fault_latency(now_ns().saturating_sub(t0));
    result
}

/// First touch of a never-touched (or known-zero) page: maps zero pages for it and, when its
/// stream is sequential, for the never-touched pages of its window (fault-around), in runs
/// of consecutive pages with one ioctl each.
#[allow(clippy::too_many_arguments)]
fn zero_fill(
    pager: &PagerShared,
    region: &RegionInner,
    reg_idx: usize,
    reg_gen: u32,
    page: usize,
    locked: Pte,
    write: bool,
    route: Route,
) -> Result<(), FaultError> {
    // A read maps the kernel's zero page, write-protected: shared, no memory of its own, so
    // neither charged nor a reclaim victim until its first write (see `PageState::Shared`).
    // In thread mode a kernel write to it waits for its write-protect fault like any other.
    // In signal mode it fails instead. System calls make their pages writable first
    // (`prepare_user_access`), and uswap's SIGBUS frames go to each thread's alternate
    // stack, where `uswap run`'s library sets them up (`system_calls_routed`); through the
    // library API neither holds, and zero pages are charged. What stays: the program's own
    // signal frames on a stack in managed memory (QEMU's coroutines). Fault-around of a read
    // mapped pages below such a stack pointer as protected zero pages, and the next signal's
    // frame could not be written (SIGSEGV). So in signal mode a read fault shares the
    // faulting page alone (a stack page is written before it is read), and maps no others.
    let shared_zero = !write && (pager.mode == FaultMode::Thread || uffd::sigbus::system_calls_routed());
    let one_page = route.lock_free() || (shared_zero && pager.mode == FaultMode::Signal);
    let max = if one_page { 1 } else { pager.readahead_max_pages };
    let pred = region.streams.advance(page, region.nr_pages, max, false);
    let mut pages: ArrayVec<(usize, Pte), MAX_WINDOW_PAGES> = ArrayVec::new();
    for q in pred.window.start..pred.window.end() {
        if q == page {
            pages.push((q, locked));
            continue;
        }
        let pq = region.load(q);
        if matches!(pq.state(), PageState::None | PageState::Zero) {
            if let Some(l) = region.try_lock(q, pq) {
                pages.push((q, l));
            }
        }
    }
    note_window(pages.len());
    // Charged like one fault's worth of pages, reclaiming if need be: the window only grows
    // while the stream keeps using what it brought in.
    let nr_charged = if shared_zero { 0 } else { pages.len() };
    reclaim::charge(pager, nr_charged, route.lock_free());
    let mut mapped = 0;
    let mut faulting_done = false;
    // Set once a run met the end of a mapping (ENOENT: a fill ioctl's range must lie in one
    // mapping): the region holds several once the application `mprotect`ed or re-mapped
    // parts of it (a reservation it commits piece by piece). The rest goes page by page.
    let mut one_by_one = false;
    let mut i = 0;
    // Bounded: every round moves `i` on by at least one page.
    while i < pages.len() {
        let mut j = i + 1;
        while !one_by_one && j < pages.len() && pages[j].0 == pages[j - 1].0 + 1 {
            j += 1;
        }
        let len = (j - i) * PAGE_SIZE;
        let addr = region.page_addr(pages[i].0);
        let r = if write {
            pager.uffd.copy(addr, ZERO_PAGES.0.as_ptr(), len, route.wake(), false)
        } else {
            pager.uffd.zeropage(addr, len, route.wake() && !shared_zero)
        };
        let done = r.done_bytes(len) / PAGE_SIZE;
        // The zero pages mapped, write-protected now; pages the protection missed are
        // charged and kept as resident ones. (A write by another thread between the two
        // ioctls copies the zero page before it is protected: that page stays shared and
        // uncharged until its next write. Its contents are safe either way.)
        let protected = shared_zero && protect_zero_pages(pager, addr, done, route);
        let crossed = j - i - done > 1 && matches!(r, RangeResult::Partial { errno: libc::ENOENT, .. });
        if crossed {
            // The run crossed into another mapping: what is left of it goes page by page
            // (the next round starts at the first page not mapped).
            j = i + done;
            one_by_one = true;
        }
        if shared_zero && !protected && done > 0 {
            reclaim::charge(pager, done, route.lock_free());
        }
        for (k, &(q, l)) in pages[i..j].iter().enumerate() {
            if k < done && protected {
                region.store(q, l.next(PageState::Shared, None));
                faulting_done |= q == page;
            } else if k < done {
                let new = l.next(PageState::Resident, None);
                region.store(q, new);
                pager.lru.add_mapped(page_ref(reg_idx, reg_gen, q, new.gen()), q == page, pages.len(), &pager.stats);
                faulting_done |= q == page;
                mapped += 1;
            } else {
                region.store(q, l.unbusy());
            }
        }
        i = j;
        if crossed {
            continue;
        }
        if let RangeResult::Partial { errno, .. } = r {
            if !faulting_done && pages[..i].iter().any(|&(q, _)| q == page) {
                reclaim::uncharge(pager, nr_charged.saturating_sub(mapped));
                for &(q, l) in &pages[i..] {
                    region.store(q, l.unbusy());
                }
                if errno == libc::EEXIST {
                    return take_present_page(pager, region, reg_idx, reg_gen, page, route);
                }
                // ENOENT: no registered mapping at the faulting page any more; the
                // application unmapped it while this fault waited (a stale fault, as in
                // `serve_fault`'s resident case). Nothing was there to lose.
                return Err(if errno == libc::ENOENT { FaultError::Unmapped } else { FaultError::Ioctl(errno) });
            }
        }
    }
    reclaim::uncharge(pager, nr_charged.saturating_sub(mapped));
    pager.stats.inc(Counter::PgfaultZero);
    pager.stats.add(Counter::ZeroFillAround, mapped.saturating_sub(1) as u64);
    Ok(())
}

/// Write-protects `nr_pages` zero pages just mapped at `addr` (waking the faulting thread in
/// thread mode). False if the protection failed: they must then be charged.
fn protect_zero_pages(pager: &PagerShared, addr: usize, nr_pages: usize, route: Route) -> bool {
    if nr_pages == 0 {
        return true;
    }
    // UFFDIO_WRITEPROTECT wakes nobody when it protects (and refuses DONTWAKE then): the
    // faulting thread is woken separately.
    let r = pager.uffd.writeprotect(addr, nr_pages * PAGE_SIZE, true, true);
    if route.wake() {
        let _ = pager.uffd.wake(addr, nr_pages * PAGE_SIZE);
    }
    r.is_ok()
}

/// A fault on a page the engine holds for gone or zero that is mapped after all: the
/// application freed it with `MADV_FREE`, which sends the same REMOVE event as
/// `MADV_DONTNEED` but leaves the page in place until the kernel needs the memory (and, for
/// a page shared with a fork child, for good). The fault is a write to it while it was
/// write-protected (a clean page, or one a fork child inherited): the page is taken as
/// resident (charged, on the LRU) and made writable. Its contents are whatever `MADV_FREE`
/// left, as without uswap.
fn take_present_page(
    pager: &PagerShared,
    region: &RegionInner,
    reg_idx: usize,
    reg_gen: u32,
    page: usize,
    route: Route,
) -> Result<(), FaultError> {
    let pte = region.load(page);
    let Some(locked) =
        matches!(pte.state(), PageState::None | PageState::Zero).then(|| region.try_lock(page, pte)).flatten()
    else {
        // It changed meanwhile: the access faults again and meets what is there now.
        return Err(FaultError::Ioctl(libc::EAGAIN));
    };
    let addr = region.page_addr(page);
    reclaim::charge(pager, 1, route.lock_free());
    match pager.uffd.writeprotect(addr, PAGE_SIZE, false, route.wake()) {
        Err(e) if e.raw_os_error() == Some(libc::EAGAIN) => {
            reclaim::uncharge(pager, 1);
            region.store(page, locked.unbusy());
            return Err(FaultError::Ioctl(libc::EAGAIN));
        }
        // ENOENT: gone meanwhile after all; it is resident-and-missing now, served as zeros.
        _ => {}
    }
    let new = locked.next(PageState::Resident, None);
    region.store(page, new);
    pager.lru.add(page_ref(reg_idx, reg_gen, page, new.gen()), &pager.stats);
    pager.stats.inc(Counter::PgfaultWp);
    Ok(())
}

/// A fork child's first touch of a page that was out at the fork (`PageState::Parent`):
/// read from the parent's device as the child inherited it, mapped, charged to the child
/// and on its LRU from now on (the child's reclaim sends it to its own devices). One page:
/// no readahead across the parent's slots.
fn parent_in(pager: &PagerShared, f: &Fault<'_>) -> Result<(), FaultError> {
    let Fault { region, reg_idx, reg_gen, page, locked, route, .. } = *f;
    debug_assert_eq!(locked.state(), PageState::Parent);
    let addr = region.page_addr(page);
    let entry = locked.entry();
    let read = events::read_from_parent(pager, entry, |data| {
        reclaim::charge(pager, 1, route.lock_free());
        let r = pager.uffd.copy(addr, data.as_ptr(), PAGE_SIZE, route.wake(), false);
        if r != RangeResult::Done {
            reclaim::uncharge(pager, 1);
        }
        r
    });
    match read {
        Ok(RangeResult::Done) => {
            let new = locked.next(PageState::Resident, None);
            region.store(page, new);
            pager.lru.add(page_ref(reg_idx, reg_gen, page, new.gen()), &pager.stats);
            pager.stats.inc(Counter::Pgmajfault);
            pager.stats.inc(Counter::Pswpin);
            Ok(())
        }
        Ok(RangeResult::Partial { errno, .. }) => {
            region.store(page, locked.unbusy());
            // ENOENT: unmapped while this fault waited (see `serve_fault`'s resident case).
            Err(if errno == libc::ENOENT { FaultError::Unmapped } else { FaultError::Ioctl(errno) })
        }
        Err(e) => {
            region.store(page, locked.unbusy());
            pager.record_error(
                addr,
                entry,
                match e {
                    FaultError::Device(kind) => kind,
                    _ => PageErrorKind::ReadFailed,
                },
            );
            Err(e)
        }
    }
}

fn page_ref(region_idx: usize, region_gen: u32, page: usize, page_gen: u8) -> PageRef {
    PageRef { region_idx, region_gen, page_gen, page }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::region::region_owning;
    use crate::{DeviceConfig, Pager};

    /// A fault on a page whose busy bit its owner never clears (here: held by the test, as
    /// an interrupted thread would hold it) fails after the bound, counted and recorded,
    /// instead of spinning forever.
    #[test]
    fn a_fault_on_a_page_busy_forever_fails_after_the_bound() {
        let p = Pager::builder()
            .resident_limit(4 << 20)
            .fault_mode(FaultMode::Signal)
            .device(DeviceConfig::ram(16 << 20))
            .build()
            .unwrap();
        let region = p.map(16 * PAGE_SIZE).unwrap();
        region.as_atomic_u64s()[0].store(7, std::sync::atomic::Ordering::Relaxed);
        let addr = region.as_ptr() as usize;
        let g = region_owning(addr).expect("the region is registered");
        let locked = g.try_lock(0, g.load(0)).expect("page 0 is not busy");
        let t0 = std::time::Instant::now();
        let r = serve_fault(&g, g.index, g.gen, addr, false, Route::Signal);
        let waited = t0.elapsed();
        assert_eq!(r, Err(FaultError::BusyTimeout));
        assert!(waited.as_nanos() as u64 >= BUSY_WAIT_LIMIT_NS, "gave up after {waited:?}");
        g.store(0, locked.unbusy());
        drop(g);
        let st = p.stats();
        assert_eq!(st.fault_busy_timeout, 1, "{st:?}");
        let errors = p.recent_errors();
        assert!(
            errors.iter().any(|e| e.addr == addr && e.kind == crate::PageErrorKind::BusyTimeout),
            "recorded: {errors:?}"
        );
        assert_eq!(region.as_atomic_u64s()[0].load(std::sync::atomic::Ordering::Relaxed), 7);
    }
}
