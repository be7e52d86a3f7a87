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

use crate::clock::now_ns;
use crate::events::{self, Events};
use crate::options::FaultMode;
use crate::readahead::MAX_WINDOW_PAGES;
use crate::reclaim::Reclaim;
use crate::region::{PageRef, PageState, Pte, RegionInner};
use crate::release::Release;
use crate::state::fault_error::FaultError;
use crate::state::route::{note_window, Route};
use crate::state::{PageErrorKind, PagerShared};
use crate::stats::Counter;
use crate::swapin::{swap_in, FaultSite};
use crate::uffd::{self, RangeResult, PAGE_SIZE};

/// The fault service's context. The service reaches nearly every part of the pager's
/// state, itself (the regions' descriptor, the fault mode, the charge's stall clock, the
/// reclaim lists, the devices and the swap cache, counters and the error log) or through
/// the contexts of the services it hands a fault to (swap-in, reclaim, events, release), so
/// it wraps the state, privately; those contexts are built only on the paths that need
/// them. Built from the faulting region's pager, in [`serve_fault`]: nothing outside this
/// module names it.
#[derive(Clone, Copy)]
struct FaultService<'a>(&'a PagerShared);

impl<'a> FaultService<'a> {
    fn reclaim(&self) -> Reclaim<'a> {
        self.0.reclaim_cx()
    }

    fn events(&self) -> Events<'a> {
        self.0.events_cx()
    }

    fn release(&self) -> Release<'a> {
        self.0.release_cx()
    }
}

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
/// name the region in the registry (for the reclaim queues). Takes ownership of the page,
/// then hands it to the function for its state, each of which ends ownership.
pub(crate) fn serve_fault(
    region: &RegionInner,
    reg_idx: usize,
    reg_gen: u32,
    addr: usize,
    write: bool,
    route: Route,
) -> Result<(), FaultError> {
    let t0 = now_ns();
    let cx = &FaultService(&region.pager);
    let Some(page) = region.page_of(addr) else {
        return Err(FaultError::Gone);
    };
    assert!(page < region.nr_pages);
    region.note_touched(page);
    let result = lock_for_fault(cx, region, page, t0).and_then(|locked| {
        let f = FaultSite { region, reg_idx, reg_gen, page, locked, write, route };
        serve_locked(cx, &f)
    });
    account_fault(cx, result, route, t0);
    result
}

/// Takes ownership of `page` (its busy bit), waiting for its current owner (another fault,
/// or reclaim) to finish a short critical section. No owner touches its page's memory (a
/// fault there would wait for this very wait), so the wait ends. Bounded: a wait past
/// `BUSY_WAIT_LIMIT_NS` fails the fault (counted, recorded) rather than hang.
fn lock_for_fault(cx: &FaultService<'_>, region: &RegionInner, page: usize, t0: u64) -> Result<Pte, FaultError> {
    let page_addr = region.page_addr(page);
    let backoff = Backoff::new();
    loop {
        let pte = region.load(page);
        if !pte.busy() {
            match region.try_lock(page, pte) {
                Some(locked) => return Ok(locked),
                None => continue,
            }
        }
        if backoff.is_completed() && now_ns().saturating_sub(t0) > BUSY_WAIT_LIMIT_NS {
            cx.0.stats.inc(Counter::FaultBusyTimeout);
            cx.0.errors.record(page_addr, pte.entry(), PageErrorKind::BusyTimeout);
            return Err(FaultError::BusyTimeout);
        }
        if backoff.is_completed() {
            // The owner may be waiting for a device that does not answer.
            uffd::sigbus::let_stop_signals_through();
        }
        backoff.snooze();
    }
}

/// The service of a page the fault owns, by its state (one function per case).
fn serve_locked(cx: &FaultService<'_>, f: &FaultSite<'_>) -> Result<(), FaultError> {
    assert!(f.locked.busy(), "the fault owns its page");
    match f.locked.state() {
        PageState::None | PageState::Zero => zero_fill(cx, f),
        PageState::Resident if f.locked.clean() => write_to_clean(cx, f),
        PageState::Resident => resident_again(cx, f),
        // Staged by the aging scan to see whether it is still used: it is, no stall.
        PageState::Cached if f.locked.aged() => {
            cx.0.stats.inc(Counter::PgfaultAged);
            swap_cache_hit(cx, f)
        }
        PageState::Cached => {
            let _stalled = cx.0.charge.stall();
            cx.0.lru.note_returned();
            swap_cache_hit(cx, f)
        }
        PageState::Swapped => {
            let _stalled = cx.0.charge.stall_since_unseen(crate::pressure::MAJOR_FAULT_UNSEEN_US);
            swap_in(&cx.0.swap_in_cx(), f)
        }
        PageState::Shared => write_to_shared(cx, f),
        PageState::Parent => parent_in(cx, f),
        PageState::Gone => {
            f.region.store(f.page, f.locked.unbusy());
            Err(FaultError::Gone)
        }
    }
}

/// Counts a fault and its latency, and an error by kind. Gone and Unmapped lose nothing:
/// the address is not the region's any more. EAGAIN is an event (a discard, an unmap)
/// pending for the range: the thread faults again once it is applied.
fn account_fault(cx: &FaultService<'_>, result: Result<(), FaultError>, route: Route, t0: u64) {
    cx.0.stats.inc(Counter::Pgfault);
    if route.lock_free() {
        cx.0.stats.inc(Counter::FaultLockFree);
    }
    match result {
        Ok(()) | Err(FaultError::Gone) => {}
        Err(FaultError::Unmapped | FaultError::Ioctl(libc::EAGAIN)) => cx.0.stats.inc(Counter::FaultRaced),
        Err(_) => cx.0.stats.inc(Counter::FaultError),
    }
    cx.0.stats.record_fault_latency(now_ns().saturating_sub(t0));
}

/// The first write to a clean page (a write-protect fault): it is dirty now and its slot's
/// copy goes stale. (In signal mode the SIGBUS may also be a missing fault on a clean page
/// the application discarded: then the retried access faults again and is served by
/// [`resident_again`].)
fn write_to_clean(cx: &FaultService<'_>, f: &FaultSite<'_>) -> Result<(), FaultError> {
    let (region, page, pte) = (f.region, f.page, f.locked);
    debug_assert!(pte.state() == PageState::Resident && pte.clean());
    let page_addr = region.page_addr(page);
    let r = cx.0.uffd.writeprotect(page_addr, PAGE_SIZE, false, f.route.wake());
    if r.as_ref().is_err_and(|e| e.raw_os_error() == Some(libc::EAGAIN)) {
        // An event is pending: nothing changed, the write faults again.
        region.store(page, pte.unbusy());
        return Err(FaultError::Ioctl(libc::EAGAIN));
    }
    cx.0.devices.free(pte.entry(), f.route.lock_free());
    region.store(page, pte.dirtied());
    cx.0.clean_pages.fetch_sub(1, std::sync::atomic::Ordering::Relaxed);
    cx.0.stats.inc(Counter::PgfaultWp);
    if pte.readahead() {
        // Written: a read-ahead page the application used.
        cx.0.stats.inc(Counter::SwapRaHit);
        region.streams.note_used(1);
    } else {
        // A read fault's bet that the page would leave unwritten, lost.
        cx.0.clean_bets.lose();
    }
    match r {
        Err(e) if e.raw_os_error() != Some(libc::ENOENT) => {
            Err(FaultError::Ioctl(e.raw_os_error().unwrap_or(libc::EIO)))
        }
        _ => Ok(()),
    }
}

/// A fault on a page that is resident: either another thread mapped it after this fault
/// was raised, or the application discarded it (`MADV_DONTNEED`), which reads back as
/// zeros. In thread mode the first case is common: a swap-in maps its faulting page (waking
/// the thread) before its readahead pages, the thread faults on one of those meanwhile, and
/// the message of that fault, still read by another handler, is served after the page is
/// mapped, while its thread runs on.
fn resident_again(cx: &FaultService<'_>, f: &FaultSite<'_>) -> Result<(), FaultError> {
    let page_addr = f.region.page_addr(f.page);
    let r = cx.0.uffd.zeropage(page_addr, PAGE_SIZE, f.route.wake());
    f.region.store(f.page, f.locked.unbusy());
    match r {
        RangeResult::Done => Ok(()),
        RangeResult::Partial { errno: libc::EEXIST, .. } => {
            if f.route.wake() {
                let _ = cx.0.uffd.wake(page_addr, PAGE_SIZE);
            }
            cx.0.stats.inc(Counter::FaultRaced);
            Ok(())
        }
        // One page, so no registered mapping at this address (the range of a fill ioctl lies
        // in one registered mapping or it fails with ENOENT): the application unmapped the
        // page since it was mapped for the racing fault. Not a lost page: a SIGBUS here used
        // to hit a thread that had read the page and moved on, e.g. into that very munmap.
        RangeResult::Partial { errno: libc::ENOENT, .. } => Err(FaultError::Unmapped),
        RangeResult::Partial { errno, .. } => Err(FaultError::Ioctl(errno)),
    }
}

/// A swap-cache hit: the page is staged in RAM; moved back with `UFFDIO_MOVE` (no copy). A
/// page staged clean and read keeps its slot ([`clean_swap_cache_hit`]); written, it is
/// served here, as dirty.
fn swap_cache_hit(cx: &FaultService<'_>, f: &FaultSite<'_>) -> Result<(), FaultError> {
    let (region, page, locked) = (f.region, f.page, f.locked);
    debug_assert_eq!(locked.state(), PageState::Cached);
    // A write to a page staged clean makes it dirty: it comes back writable as a dirty one
    // does, its slot freed now, rather than write-protected and faulting again at once.
    if locked.clean() && !f.write {
        return clean_swap_cache_hit(cx, f);
    }
    let page_addr = region.page_addr(page);
    let e = locked.entry();
    let dev = cx.0.devices.device(e);
    let staged = dev.staging_addr(e.offset());
    let mut r = cx.0.uffd.move_pages(page_addr, staged, PAGE_SIZE, f.route.wake());
    let mut copied = false;
    if r == (RangeResult::Partial { done_bytes: 0, errno: libc::EINVAL }) {
        copied = true;
        // UFFDIO_MOVE needs equal protections and locks on both sides: the application made
        // the region read-only (mprotect), or locked it (mlockall; the staging area stays
        // unlocked, `mapping::lock_all`). Copy the staged page, then drop it.
        r = cx.0.uffd.copy(page_addr, staged as *const u8, PAGE_SIZE, f.route.wake(), false);
        if r == RangeResult::Done {
            dev.discard_staged(e.offset());
            cx.0.stats.inc(Counter::PgfaultSwapcacheCopy);
        }
    }
    if let RangeResult::Partial { errno, .. } = r {
        region.store(page, locked.unbusy());
        // ENOENT: no mapping at the page any more (a stale fault, as above), or, from the
        // move only, no staged page to move (the engine broke its own rule: reported as a
        // failure). A copy checks the destination first.
        if errno == libc::ENOENT && (copied || crate::mapping::page_present(staged)) {
            return Err(FaultError::Unmapped);
        }
        return Err(FaultError::Ioctl(errno));
    }
    cx.0.swap_cache.remove(dev, e.offset());
    cx.0.devices.free(e, f.route.lock_free());
    // Referenced: it came back from the swap cache, so reclaim spares it once.
    let new = locked.next(PageState::Resident, None).with_referenced(true);
    region.store(page, new);
    cx.0.lru.add(page_ref(f.reg_idx, f.reg_gen, page, new.gen()), &cx.0.stats);
    cx.0.stats.inc(Counter::PgfaultSwapcache);
    Ok(())
}

/// A swap-cache hit on a page the aging scan staged clean (its slot still holds it): copied
/// back write-protected (`UFFDIO_COPY` with `MODE_WP`), so that it stays clean and keeps its
/// slot, and its staging page dropped. A move would map it writable, and a write by another
/// thread before it was write-protected again would be lost when the page, still taken for
/// clean, was dropped.
fn clean_swap_cache_hit(cx: &FaultService<'_>, f: &FaultSite<'_>) -> Result<(), FaultError> {
    let (region, page, locked) = (f.region, f.page, f.locked);
    debug_assert!(locked.state() == PageState::Cached && locked.clean() && locked.busy());
    let e = locked.entry();
    let dev = cx.0.devices.device(e);
    let staged = dev.staging_addr(e.offset());
    let r = cx.0.uffd.copy(region.page_addr(page), staged as *const u8, PAGE_SIZE, f.route.wake(), true);
    if let RangeResult::Partial { errno, .. } = r {
        region.store(page, locked.unbusy());
        // ENOENT: no mapping at the page any more (a stale fault; a copy checks the
        // destination first).
        return Err(if errno == libc::ENOENT { FaultError::Unmapped } else { FaultError::Ioctl(errno) });
    }
    // Empty before the page can leave into it again.
    dev.discard_staged(e.offset());
    cx.0.swap_cache.remove(dev, e.offset());
    dev.unstamp(e.offset());
    cx.0.clean_pages.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let new = locked.next(PageState::Resident, Some(e)).with_clean().with_referenced(true);
    region.store(page, new);
    cx.0.lru.add(page_ref(f.reg_idx, f.reg_gen, page, new.gen()), &cx.0.stats);
    cx.0.stats.inc(Counter::PgfaultSwapcache);
    Ok(())
}

/// A re-armed fork child's first write to a page it shares with its parent (or, missing, a
/// page the application discarded: then the access faults again and is served as a
/// resident page that is not there, with zeros). From now on the page is this process's
/// own: charged, on the LRU, writable (the kernel makes the copy when the write is retried).
fn write_to_shared(cx: &FaultService<'_>, f: &FaultSite<'_>) -> Result<(), FaultError> {
    let (region, page, locked) = (f.region, f.page, f.locked);
    debug_assert_eq!(locked.state(), PageState::Shared);
    cx.reclaim().charge(1, f.route.lock_free());
    let r = cx.0.uffd.writeprotect(region.page_addr(page), PAGE_SIZE, false, f.route.wake());
    if r.as_ref().is_err_and(|e| e.raw_os_error() == Some(libc::EAGAIN)) {
        // An event is pending: nothing changed, the write faults again.
        cx.reclaim().uncharge(1);
        region.store(page, locked.unbusy());
        return Err(FaultError::Ioctl(libc::EAGAIN));
    }
    let new = locked.next(PageState::Resident, None);
    region.store(page, new);
    cx.0.lru.add(page_ref(f.reg_idx, f.reg_gen, page, new.gen()), &cx.0.stats);
    cx.0.stats.inc(Counter::PgfaultWp);
    Ok(())
}

/// First touch of a never-touched (or known-zero) page: maps zero pages for it and, when its
/// stream is sequential, for the never-touched pages of its window (fault-around), in runs
/// of consecutive pages with one ioctl each.
///
/// A run that meets the end of a mapping fails whole (ENOENT: a fill ioctl's range must lie
/// in one mapping): the region holds several once the application `mprotect`ed or re-mapped
/// parts of it (a reservation it commits piece by piece; the heap's handed part before its
/// `PROT_NONE` rest). Then only the faulting page is filled and the others go back
/// untouched (`faulting_page_only`): the next mapping may be inaccessible, where a fill still
/// succeeds (the kernel's fill ioctls do not look at the protection) and leaves a charged
/// page that no move can take out (`UFFDIO_MOVE` needs equal protections on both sides).
fn zero_fill(cx: &FaultService<'_>, f: &FaultSite<'_>) -> Result<(), FaultError> {
    let (region, page, write, route) = (f.region, f.page, f.write, f.route);
    debug_assert!(matches!(f.locked.state(), PageState::None | PageState::Zero));
    let (shared_zero, max) = zero_fill_policy(cx, write, route);
    let pages = lock_zero_window(f, max);
    note_window(pages.len());
    // Charged like one fault's worth of pages, reclaiming if need be: the window only grows
    // while the stream keeps using what it brought in.
    let nr_charged = if shared_zero { 0 } else { pages.len() };
    cx.reclaim().charge(nr_charged, route.lock_free());
    let mut mapped = 0;
    let mut faulting_done = false;
    // Set once a run met the end of a mapping (see the doc above).
    let mut faulting_page_only = false;
    let mut i = 0;
    // Bounded: every round moves `i` on by at least one page.
    while i < pages.len() {
        if faulting_page_only && pages[i].0 != page {
            region.store(pages[i].0, pages[i].1.unbusy());
            i += 1;
            continue;
        }
        let mut j = i + 1;
        while !faulting_page_only && j < pages.len() && pages[j].0 == pages[j - 1].0 + 1 {
            j += 1;
        }
        let len = (j - i) * PAGE_SIZE;
        let addr = region.page_addr(pages[i].0);
        let r = if write {
            cx.0.uffd.copy(addr, ZERO_PAGES.0.as_ptr(), len, route.wake(), false)
        } else {
            cx.0.uffd.zeropage(addr, len, route.wake() && !shared_zero)
        };
        let done = r.done_bytes(len) / PAGE_SIZE;
        // The zero pages mapped, write-protected now; pages the protection missed are
        // charged and kept as resident ones. (A write by another thread between the two
        // ioctls copies the zero page before it is protected: that page stays shared and
        // uncharged until its next write. Its contents are safe either way.)
        let protected = shared_zero && protect_zero_pages(cx, addr, done, route);
        let crossed = j - i - done > 1 && matches!(r, RangeResult::Partial { errno: libc::ENOENT, .. });
        if crossed {
            // The run crossed into another mapping: of what is left, the faulting page
            // alone (the next round starts at the first page not mapped).
            j = i + done;
            faulting_page_only = true;
        }
        if shared_zero && !protected && done > 0 {
            cx.reclaim().charge(done, route.lock_free());
        }
        mapped += publish_zero_run(cx, f, &pages[i..j], done, protected, pages.len(), &mut faulting_done);
        i = j;
        if crossed {
            continue;
        }
        if let RangeResult::Partial { errno, .. } = r {
            if !faulting_done && pages[..i].iter().any(|&(q, _)| q == page) {
                cx.reclaim().uncharge(nr_charged.saturating_sub(mapped));
                for &(q, l) in &pages[i..] {
                    region.store(q, l.unbusy());
                }
                return zero_fill_failed(cx, f, errno);
            }
        }
    }
    cx.reclaim().uncharge(nr_charged.saturating_sub(mapped));
    cx.0.stats.inc(Counter::PgfaultZero);
    cx.0.stats.add(Counter::ZeroFillAround, mapped.saturating_sub(1) as u64);
    Ok(())
}

/// A read maps the kernel's zero page, write-protected: shared, no memory of its own, so
/// neither charged nor a reclaim victim until its first write (see `PageState::Shared`).
/// In thread mode a kernel write to it waits for its write-protect fault like any other.
/// In signal mode it fails instead. System calls make their pages writable first
/// (`prepare_user_access`), and uswap's SIGBUS frames go to each thread's alternate
/// stack, where `uswap run`'s library sets them up (`system_calls_routed`); through the
/// library API neither holds, and zero pages are charged. What stays: the program's own
/// signal frames on a stack in managed memory (QEMU's coroutines). Fault-around of a read
/// mapped pages below such a stack pointer as protected zero pages, and the next signal's
/// frame could not be written (SIGSEGV). So in signal mode a read fault shares the
/// faulting page alone (a stack page is written before it is read), and maps no others.
/// Returns whether a read maps the shared zero page, and the most pages the fill maps.
fn zero_fill_policy(cx: &FaultService<'_>, write: bool, route: Route) -> (bool, usize) {
    let shared_zero = !write && (cx.0.mode == FaultMode::Thread || uffd::sigbus::system_calls_routed());
    let one_page = route.lock_free() || (shared_zero && cx.0.mode == FaultMode::Signal);
    (shared_zero, if one_page { 1 } else { cx.0.readahead_max_pages })
}

/// The faulting page (owned) and the never-touched pages of its fault-around window that
/// could be locked at once and are contiguous with it, in address order. Contiguous: a run
/// with a gap before it (a page resident or busy) could lie wholly in the next mapping, a
/// `PROT_NONE` part of the region, where a fill succeeds with no error to stop it (see
/// `zero_fill`); a run through the faulting page starts in the faulting page's mapping.
fn lock_zero_window(f: &FaultSite<'_>, max: usize) -> ArrayVec<(usize, Pte), MAX_WINDOW_PAGES> {
    let region = f.region;
    let pred = region.streams.advance(f.page, region.nr_pages, max, false);
    let (start, end) = (pred.window.start, pred.window.end());
    let lock = |q: usize| {
        let pq = region.load(q);
        matches!(pq.state(), PageState::None | PageState::Zero).then(|| region.try_lock(q, pq)).flatten()
    };
    let mut below: ArrayVec<(usize, Pte), MAX_WINDOW_PAGES> = ArrayVec::new();
    for q in (start..f.page).rev() {
        let Some(l) = lock(q) else { break };
        below.push((q, l));
    }
    let mut pages: ArrayVec<(usize, Pte), MAX_WINDOW_PAGES> = below.into_iter().rev().collect();
    pages.push((f.page, f.locked));
    for q in f.page + 1..end {
        let Some(l) = lock(q) else { break };
        pages.push((q, l));
    }
    debug_assert!(pages.windows(2).all(|w| w[1].0 == w[0].0 + 1), "one run of consecutive pages");
    pages
}

/// Publishes a run of zero-filled pages of which the first `done` were mapped: shared
/// (`protected`) or resident and on the LRU; the rest go back as they were. Returns the
/// pages made resident.
fn publish_zero_run(
    cx: &FaultService<'_>,
    f: &FaultSite<'_>,
    run: &[(usize, Pte)],
    done: usize,
    protected: bool,
    nr_window: usize,
    faulting_done: &mut bool,
) -> usize {
    let mut mapped = 0;
    for (k, &(q, l)) in run.iter().enumerate() {
        if k < done && protected {
            f.region.store(q, l.next(PageState::Shared, None));
            *faulting_done |= q == f.page;
        } else if k < done {
            let new = l.next(PageState::Resident, None);
            f.region.store(q, new);
            let r = page_ref(f.reg_idx, f.reg_gen, q, new.gen());
            cx.0.lru.add_mapped(r, q == f.page, nr_window, &cx.0.stats);
            *faulting_done |= q == f.page;
            mapped += 1;
        } else {
            f.region.store(q, l.unbusy());
        }
    }
    mapped
}

/// The faulting page's zero fill failed with `errno` (its window given back). `EEXIST`: a
/// page is there already (see [`take_present_page`]). `ENOENT`: no registered mapping at the
/// faulting page any more; the application unmapped it while this fault waited (a stale
/// fault, as in [`resident_again`]). Nothing was there to lose.
fn zero_fill_failed(cx: &FaultService<'_>, f: &FaultSite<'_>, errno: i32) -> Result<(), FaultError> {
    match errno {
        libc::EEXIST => take_present_page(cx, f.region, f.reg_idx, f.reg_gen, f.page, f.route),
        libc::ENOENT => Err(FaultError::Unmapped),
        _ => Err(FaultError::Ioctl(errno)),
    }
}

/// Write-protects `nr_pages` zero pages just mapped at `addr` (waking the faulting thread in
/// thread mode). False if the protection failed: they must then be charged.
fn protect_zero_pages(cx: &FaultService<'_>, addr: usize, nr_pages: usize, route: Route) -> bool {
    if nr_pages == 0 {
        return true;
    }
    // UFFDIO_WRITEPROTECT wakes nobody when it protects (and refuses DONTWAKE then): the
    // faulting thread is woken separately.
    let r = cx.0.uffd.writeprotect(addr, nr_pages * PAGE_SIZE, true, true);
    if route.wake() {
        let _ = cx.0.uffd.wake(addr, nr_pages * PAGE_SIZE);
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
    cx: &FaultService<'_>,
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
    cx.reclaim().charge(1, route.lock_free());
    match cx.0.uffd.writeprotect(addr, PAGE_SIZE, false, route.wake()) {
        Err(e) if e.raw_os_error() == Some(libc::EAGAIN) => {
            cx.reclaim().uncharge(1);
            region.store(page, locked.unbusy());
            return Err(FaultError::Ioctl(libc::EAGAIN));
        }
        // ENOENT: gone meanwhile after all; it is resident-and-missing now, served as zeros.
        _ => {}
    }
    let new = locked.next(PageState::Resident, None);
    region.store(page, new);
    cx.0.lru.add(page_ref(reg_idx, reg_gen, page, new.gen()), &cx.0.stats);
    cx.0.stats.inc(Counter::PgfaultWp);
    Ok(())
}

/// Pages a fork child's fault on a `PageState::Parent` page brings in at most: the page and
/// the ones after it that were out at the fork in the slots after its own (the parent
/// swapped them out together), in one read, as the kernel reads a swap cluster.
const PARENT_RUN_PAGES: usize = 16;

/// A fork child's first touch of a page that was out at the fork (`PageState::Parent`):
/// read from the parent's device as the child inherited it (with the run of pages after it
/// in the slots after its own), mapped, charged to the child and on its LRU from now on
/// (the child's reclaim sends them to its own devices).
fn parent_in(cx: &FaultService<'_>, f: &FaultSite<'_>) -> Result<(), FaultError> {
    let FaultSite { region, page, locked, route, .. } = *f;
    debug_assert_eq!(locked.state(), PageState::Parent);
    let entry = locked.entry();
    let mut run: ArrayVec<Pte, PARENT_RUN_PAGES> = ArrayVec::new();
    run.push(locked);
    if !route.lock_free() {
        lock_parent_run(region, page, cx.0.readahead_max_pages, &mut run);
    }
    let addr = region.page_addr(page);
    let read = events::read_run_from_parent(&cx.events(), entry, run.len(), |data| {
        let n = data.len();
        cx.reclaim().charge(n, route.lock_free());
        let r = cx.0.uffd.copy(addr, data.as_ptr().cast(), n * PAGE_SIZE, route.wake(), false);
        let done = match r {
            RangeResult::Done => n,
            RangeResult::Partial { done_bytes, .. } => done_bytes / PAGE_SIZE,
        };
        cx.reclaim().uncharge(n - done);
        (r, done)
    });
    let done = read.as_ref().map_or(0, |&(_, done)| done);
    for (k, &l) in run.iter().enumerate() {
        if k < done {
            let new = l.next(PageState::Resident, None);
            region.store(page + k, new);
            cx.release().release_parent_slot(l.entry());
            cx.0.lru.add(page_ref(f.reg_idx, f.reg_gen, page + k, new.gen()), &cx.0.stats);
        } else {
            region.store(page + k, l.unbusy());
        }
    }
    match read {
        Ok((_, done)) if done > 0 => {
            cx.0.stats.inc(Counter::Pgmajfault);
            cx.0.stats.add(Counter::Pswpin, done as u64);
            Ok(())
        }
        // ENOENT: unmapped while this fault waited (see `serve_fault`'s resident case).
        Ok((RangeResult::Partial { errno: libc::ENOENT, .. }, _)) => Err(FaultError::Unmapped),
        Ok((RangeResult::Partial { errno, .. }, _)) => Err(FaultError::Ioctl(errno)),
        Ok((RangeResult::Done, _)) => Err(FaultError::Ioctl(libc::EIO)),
        Err(e) => {
            let kind = match e {
                FaultError::Device(kind, _) => kind,
                _ => PageErrorKind::ReadFailed,
            };
            cx.0.errors.record_device(addr, entry, kind, e.device_cause());
            Err(e)
        }
    }
}

/// Adds to `run` (which holds the faulting page, locked) the pages after it that are out
/// at the fork in the slots after its own, each locked, up to `max` in all; stops at the
/// first that is not, or that another thread holds.
fn lock_parent_run(region: &RegionInner, page: usize, max: usize, run: &mut ArrayVec<Pte, PARENT_RUN_PAGES>) {
    let first = run[0].entry();
    let max = max.min(PARENT_RUN_PAGES);
    // Bounded by `max`.
    for k in 1..max {
        let q = page + k;
        if q >= region.nr_pages {
            break;
        }
        let pq = region.load(q);
        let next = pq.state() == PageState::Parent
            && pq.entry().device() == first.device()
            && pq.entry().offset() == first.offset() + k as u64;
        let Some(l) = next.then(|| region.try_lock(q, pq)).flatten() else { break };
        run.push(l);
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
