//! Memory the application mapped itself, taken over by a pager: [`Pager::adopt`] makes an
//! existing anonymous private mapping a region, and [`Region::adopt_range`] gives a region
//! back the pages the application replaced with fresh anonymous memory (`mmap(MAP_FIXED)`
//! over them).
//!
//! Why: runtimes reserve address space first and commit it later. HotSpot reserves its heap
//! with `mmap(PROT_NONE)` (at an address it picks, for compressed pointers) and commits and
//! uncommits parts of it with `mmap(MAP_FIXED)`; V8 reserves a 4 GiB cage and commits with
//! `mprotect`; QEMU reserves guest RAM and maps it `MAP_FIXED` inside. A region the engine
//! mapped itself ([`Pager::map`]) cannot be placed or shaped like that, so `uswap run`
//! lets the kernel do exactly what the program asked and takes the result over.
//!
//! What the kernel keeps across these calls: a registration survives `mprotect` (a
//! `PROT_NONE` part is never faulted on, and fault-around stops at the end of a mapping,
//! `fault_service::zero_fill`; made writable, it faults into the engine).
//! `mmap(MAP_FIXED)` over registered memory replaces the mapping: the engine gets an
//! `UNMAP` event for the old pages (they become `Gone`, their slots freed, see `events`),
//! and the new mapping is not registered. `adopt_range` registers it and makes those pages
//! the region's again, never touched (zero).
//!
//! Locking: `adopt_range` takes the event reader lock (`events::EventState::reader`,
//! outermost), so that the `UNMAP` the kernel sent for the replaced pages, which was read
//! before the application's `mmap` returned, has also been applied; under it each page is
//! taken through its busy bit. Invariant: a page becomes the region's again (`None`) only
//! while unregistered or `Gone`, and before its range is registered, so no fault can see
//! it half-adopted. `Pager::unmanage` takes the reader lock only while it takes its pages'
//! busy bits, and copies them back into place without it: a copy fails (`EAGAIN`) while
//! another thread's event is pending, until a reader, which needs that lock, reads it.

use std::sync::Arc;

use crate::error::{Error, Result};
use crate::mapping::{for_each_present_page, AppMapping};
use crate::pager::Pager;
use crate::region::{PageRef, PageState, RegionInner, MAX_REGIONS, MAX_REGION_BYTES, REGIONS};
use crate::region_handle::Region;
use crate::release::Released;
use crate::state::{PagerShared, REGISTER_MODES};
use crate::uffd::{RangeResult, PAGE_SIZE};

impl Pager {
    /// Takes over `[addr, addr + len_bytes)`, an anonymous private mapping the caller made
    /// (any protection, `PROT_NONE` included; any placement): it becomes a managed region,
    /// as if [`Pager::map`] had made it. Pages already present (`MAP_POPULATE`, or touched
    /// before) are charged and paged like the others; the rest read zero. Dropping the
    /// region unmaps the range.
    ///
    /// Fails with an [`Error::Io`] when the range is not one the kernel lets userfaultfd
    /// manage (not mapped, file-backed, shared, already registered), and like `map` for a
    /// size of zero, one too large, or too many regions.
    pub fn adopt(&self, addr: usize, len_bytes: usize) -> Result<Region> {
        self.adopt_touched_prefix(addr, len_bytes, len_bytes)
    }

    /// As [`adopt`](Self::adopt), for a mapping of which the caller knows that nothing past
    /// its first `touched_bytes` was ever touched (a heap that handed out only a prefix of
    /// its reservation): only that prefix is scanned for present pages. Scanning a 50 GiB
    /// reservation with `mincore` takes about 17 ms, a prefix of 16 MiB a few µs.
    pub fn adopt_touched_prefix(&self, addr: usize, len_bytes: usize, touched_bytes: usize) -> Result<Region> {
        if self.fault_mode() == crate::FaultMode::Signal {
            crate::pager::check_sigbus_handler()?;
        }
        if len_bytes == 0 {
            return Err(Error::ZeroLengthMap { page_size: PAGE_SIZE });
        }
        if len_bytes > MAX_REGION_BYTES {
            return Err(Error::MapTooLarge { len_bytes: len_bytes as u64, max_bytes: MAX_REGION_BYTES as u64 });
        }
        if addr % PAGE_SIZE != 0 {
            return Err(Error::io(
                "adopting a mapping",
                std::io::Error::new(std::io::ErrorKind::InvalidInput, format!("{addr:#x} is not page-aligned")),
            ));
        }
        let len = len_bytes.div_ceil(PAGE_SIZE) * PAGE_SIZE;
        if crate::mapping::is_engine_memory(addr, addr.saturating_add(len)) {
            // A caller's stale note of a range the kernel has since given to the engine
            // (its staging areas, devices, tables): never the program's to hand over.
            return Err(Error::io(
                "adopting a mapping",
                std::io::Error::new(
                    std::io::ErrorKind::InvalidInput,
                    format!("{addr:#x}..{:#x} holds uswap's own memory", addr.saturating_add(len)),
                ),
            ));
        }
        let _signals = crate::uffd::AsyncSignalsBlocked::new();
        let shared = self.shared_arc();
        let inner = RegionInner::new(AppMapping::existing(addr, len), shared.clone())
            .map_err(|e| Error::io("allocating the region's page table", e))?;
        let inner = Arc::new(inner);
        prepare_range(shared, addr, len)?;
        // After any late `UNMAP` of what was at these addresses before (`events::UnmapUnderWay`).
        crate::events::settle_unmaps(&shared.events, &shared.stats);
        // Advice is kept for managed memory only: none recorded here is this memory's.
        crate::fork_advice::forget(addr, addr + len);
        let Some(slot) = REGIONS.insert(addr, addr + len, inner.clone()) else {
            // Back to the caller's ordinary memory, as it was.
            let _ = shared.uffd.unregister(addr, len);
            return Err(Error::TooManyRegions { max: MAX_REGIONS });
        };
        let touched_pages = touched_bytes.div_ceil(PAGE_SIZE).min(inner.nr_pages);
        charge_present(shared, &inner, slot, 0, touched_pages);
        Ok(Region::new(inner, slot, self.clone()))
    }
}

impl Region {
    /// The application replaced the pages of `[addr, addr + len_bytes)` (clipped to the
    /// region) with a fresh anonymous private mapping (`mmap(MAP_FIXED)`): they are the
    /// region's again. The kernel's `UNMAP` event has freed what they held; they read zero
    /// (or, present already, are charged as resident). A no-op outside the region.
    pub fn adopt_range(&self, addr: usize, len_bytes: usize) -> Result<()> {
        let inner = self.inner();
        let start = addr.max(inner.start());
        let end = addr.saturating_add(len_bytes).min(inner.start() + inner.nr_pages * PAGE_SIZE);
        if start >= end {
            return Ok(());
        }
        let _signals = crate::uffd::AsyncSignalsBlocked::new();
        let shared = self.pager().shared_arc();
        let (first, last) = ((start - inner.start()) / PAGE_SIZE, (end - inner.start()).div_ceil(PAGE_SIZE));
        {
            // The UNMAP for the replaced pages was read before the application's mmap
            // returned; under the reader lock it has been applied too (module doc).
            let _reader = shared.events.reader.lock().unwrap_or_else(|e| e.into_inner());
            let release = shared.release_cx();
            let mut released = Released::default();
            let mut nr_back = 0;
            for page in first..last {
                let pte = crate::events::lock_page(inner, page);
                // Normally `Gone`. Anything else was not unmapped after all (a mapping the
                // kernel refused to replace partly): it keeps nothing and reads zero, as
                // the new mapping does.
                release.release_page(pte, &mut released);
                inner.store(page, pte.next(PageState::None, None).with_referenced(false));
                nr_back += usize::from(pte.state() == PageState::Gone);
            }
            inner.note_not_gone(nr_back);
            release.apply_released(released);
        }
        let (addr, len) = (inner.page_addr(first), (last - first) * PAGE_SIZE);
        if let Err(e) = prepare_range(shared, addr, len) {
            // Not the region's after all: the program's ordinary memory, never touched by
            // the engine (nor unmapped with the region).
            for page in first..last {
                let pte = crate::events::lock_page(inner, page);
                if pte.state() != PageState::Gone {
                    inner.note_going(1);
                }
                inner.store(page, pte.next(PageState::Gone, None));
            }
            return Err(e);
        }
        charge_present(shared, inner, self.registry_slot(), first, last);
        Ok(())
    }
}

/// Readies a range the application mapped for paging: no transparent huge pages (a move
/// would split them), not inherited by a fork child unless the pager's regions are, and
/// registered with the pager's userfaultfd.
fn prepare_range(shared: &PagerShared, addr: usize, len: usize) -> Result<()> {
    let advise = |advice: libc::c_int, what: &str| -> Result<()> {
        // SAFETY: madvise checks the range itself (ENOMEM when unmapped); these advices
        // change how the kernel treats the range, never its contents.
        if unsafe { libc::madvise(addr as *mut libc::c_void, len, advice) } != 0 {
            return Err(Error::io(format!("adopting {addr:#x}+{len:#x}: {what}"), std::io::Error::last_os_error()));
        }
        Ok(())
    };
    advise(libc::MADV_NOHUGEPAGE, "madvise(MADV_NOHUGEPAGE)")?;
    if !shared.regions_survive_fork {
        advise(libc::MADV_DONTFORK, "madvise(MADV_DONTFORK)")?;
    }
    shared.uffd.register(addr, len, REGISTER_MODES).map_err(|e| {
        Error::io(
            format!(
                "registering {addr:#x}+{len:#x} with userfaultfd (only anonymous private memory that no \
                 other userfaultfd manages can be adopted)"
            ),
            e,
        )
    })
}

/// Pages of `[first, last)` already present (populated by the kernel before the range was
/// registered) become resident: charged, on the LRU. The rest stay never-touched. (`mincore`
/// cannot fail on a range just registered, which is mapped; if it did, the pages it did not
/// report would stay uncharged, not lost.)
fn charge_present(shared: &PagerShared, inner: &RegionInner, (idx, gen): (usize, u32), first: usize, last: usize) {
    let mut present = Vec::new();
    let _ = for_each_present_page(inner.page_addr(first), last - first, |i| present.push(first + i));
    if present.is_empty() {
        return;
    }
    let reclaim = shared.reclaim_cx();
    reclaim.charge(present.len(), false);
    for &page in &present {
        // Before its word can leave `None`: a discard stops at the touched part.
        inner.note_touched(page);
        let pte = crate::events::lock_page(inner, page);
        if pte.state() != PageState::None {
            // Faulted in since the scan (it was missing then, or the application discarded
            // it): that fault charged it.
            inner.store(page, pte.unbusy());
            reclaim.uncharge(1);
            continue;
        }
        let new = pte.next(PageState::Resident, None);
        inner.store(page, new);
        shared.lru.add(PageRef { region_idx: idx, region_gen: gen, page_gen: new.gen(), page }, &shared.stats);
    }
}

impl Pager {
    /// Lets go of `[addr, addr + len_bytes)` in this pager's regions, for good: every page
    /// that is out (staged or on a device) is copied back into place, and the range becomes
    /// the program's ordinary memory, uncharged and unregistered, its slots freed. For memory
    /// the program is about to make executable (`mprotect(PROT_EXEC)`: a JIT's code buffer),
    /// which reclaim could never move out again (the kernel moves pages only between
    /// mappings of equal protection). Pages that cannot be read back are counted in
    /// `fault_error` and recorded (`Pager::recent_errors`); they read zero. Returns how many
    /// pages of regions the range covered, let go of now or before (0 where it met no
    /// region: nothing there was managed).
    pub fn unmanage(&self, addr: usize, len_bytes: usize) -> Result<usize> {
        let _signals = crate::uffd::AsyncSignalsBlocked::new();
        let shared: &PagerShared = self.shared();
        let mut result = Ok(0);
        crate::events::for_each_overlap(&shared.events_cx(), addr, addr.saturating_add(len_bytes), |r, first, last| {
            if let Ok(nr_pages) = result {
                result = unmanage_pages(shared, r, first, last).map(|()| nr_pages + (last - first));
            }
        });
        result
    }
}

impl Pager {
    /// Whether `[start, end)` holds the whole staging area of one of this pager's devices:
    /// a `munmap` of it takes memory no pager goes on without (a program unmapping its whole
    /// address space), and wants [`Pager::unregister_for_teardown`] first. The pager's own
    /// live mappings, never a record of another's (a fork child's table still lists its
    /// parent's, which it does not have). Lock-free.
    pub fn holds_staging_within(&self, start: usize, end: usize) -> bool {
        self.shared().devices.devices().iter().any(|d| {
            let (addr, len) = d.staging_range();
            start <= addr && addr + len <= end
        })
    }

    /// Unregisters this pager's regions inside `[start, end)` and nothing else: for a
    /// program that is unmapping the engine's own memory (stress-ng's vm-segv child unmaps
    /// its whole address space, to die of SIGSEGV), after which this pager cannot go on.
    /// The program's `munmap` then sends no `UNMAP` event, which would wait for the engine's
    /// event thread to read it: a tracer that stopped the process and resumes only the
    /// thread it traces (that child's parent) never lets it run, and the `munmap` waited
    /// for good. Nothing is freed or uncharged (the pages go with the unmap), and no lock is
    /// taken (a stopped engine thread may hold one): the registry's walk is lock-free.
    pub fn unregister_for_teardown(&self, start: usize, end: usize) {
        let shared: &PagerShared = self.shared();
        crate::events::for_each_overlap(&shared.events_cx(), start, end, |r, first, last| {
            // Fails only for a range already unmapped: nothing to unregister there.
            let _ = shared.uffd.unregister(r.page_addr(first), (last - first) * PAGE_SIZE);
        });
    }
}

/// [`Pager::unmanage`] for pages `[first, last)` of one region. Every page is held (busy)
/// from before its contents are put back until the range is unregistered: a fault there
/// meanwhile waits, then meets ordinary memory.
fn unmanage_pages(shared: &PagerShared, r: &RegionInner, first: usize, last: usize) -> Result<()> {
    let Some(mut buf) = shared.bounce.take() else {
        return Err(Error::io(
            "taking pages out of management",
            std::io::Error::new(std::io::ErrorKind::WouldBlock, "every bounce buffer stayed lent out"),
        ));
    };
    let held: Vec<_> = {
        // Events first (the module doc's ordering): every event read so far is applied before
        // the pages are taken, and one read later waits for their busy bits.
        let _reader = shared.events.reader.lock().unwrap_or_else(|e| e.into_inner());
        (first..last).map(|page| crate::events::lock_page(r, page)).collect()
    };
    // Put back without the reader lock: the kernel refuses every copy (`EAGAIN`) while an
    // event of another thread is pending, until a reader reads it, which takes that lock.
    // Not covered: an event on these very pages (the program discarding or unmapping memory
    // it is making executable, on another thread) is read, and its reader then waits for
    // their busy bits under the lock; one more pending event meanwhile makes the remaining
    // copies give up (counted in `fault_error`, recorded).
    for (page, &pte) in (first..last).zip(&held) {
        if matches!(pte.state(), PageState::Cached | PageState::Swapped | PageState::Parent) {
            put_back(shared, r, page, pte, &mut buf.pages_mut()[0]);
        }
    }
    drop(buf);
    let (addr, len) = (r.page_addr(first), (last - first) * PAGE_SIZE);
    // Fails only for a range the application unmapped meanwhile: nothing left to let go of.
    let _ = shared.uffd.unregister(addr, len);
    // Counted before any is stored (all are held): another thread's adoption of some of
    // them meanwhile takes off only what was added.
    r.note_going(held.iter().filter(|pte| pte.state() != PageState::Gone).count());
    let release = shared.release_cx();
    let mut released = Released::default();
    for (page, pte) in (first..last).zip(held) {
        release.release_page(pte, &mut released);
        r.store(page, pte.next(PageState::Gone, None).with_referenced(false));
    }
    release.apply_released(released);
    // Ordinary memory now: its fork advice is the kernel's alone (no event will say when
    // these addresses go). Not while the pages were held: a fork holds the advice's lock
    // until its handlers have run, and its thread may touch these pages meanwhile.
    crate::fork_advice::forget(addr, addr + len);
    Ok(())
}

/// Copies the contents of a staged or swapped page (held busy) into its place in the
/// region, retrying while an event keeps the kernel from filling (`EAGAIN`).
fn put_back(
    shared: &PagerShared,
    r: &RegionInner,
    page: usize,
    pte: crate::region::Pte,
    buf: &mut crate::backend::AlignedPage,
) {
    let addr = r.page_addr(page);
    let events = shared.events_cx();
    // Bounded: an EAGAIN lasts until a pending event is read and its thread runs again
    // (microseconds: the caller holds no reader lock); give up after a while.
    for _ in 0..PUT_BACK_ATTEMPTS {
        match crate::events::copy_page(&events, addr, pte, buf) {
            // EEXIST: something is mapped there already (the application's own).
            RangeResult::Done | RangeResult::Partial { errno: libc::EEXIST, .. } => return,
            RangeResult::Partial { errno: libc::EAGAIN, .. } => std::thread::yield_now(),
            RangeResult::Partial { .. } => break,
        }
    }
    shared.stats.inc(crate::stats::Counter::FaultError);
    shared.errors.record(addr, pte.entry(), crate::state::PageErrorKind::ReadFailed);
}

/// Tries of [`put_back`] while the kernel answers `EAGAIN`.
const PUT_BACK_ATTEMPTS: usize = 10_000;
