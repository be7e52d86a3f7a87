//! `fork()` of a process with managed regions: the parent's side ([`Pager::prepare_fork`],
//! [`ForkHold`]) and the child's ([`ForkHold::rearm_in_child`]).
//!
//! A pager's threads and userfaultfd do not cross a fork; the memory of its devices can, and
//! a swap file or a Redis store is there for both. Before the fork the parent holds reclaim
//! and waits for the rounds under way, so that no page is half moved; brings back in what
//! the child could not read where it is (staged pages); records its regions and which pages
//! are out on a memory device (RAM, the compressed pool) or a shared one (a swap file, a
//! block device, Redis), once the events already read are applied (an `madvise`, `munmap`
//! or `mremap` returns when its event is read, not applied: up to 1 s, counted); makes the
//! memory devices' memory inherited by the child (copy-on-write, `MADV_DOFORK` for the
//! fork's duration); notes, for each shared device, the slots the child
//! may read (`swap::fork_refs`); and locks the region registry until the fork is done. A
//! fork so brings in nothing that is out on a memory or shared device, however large. After
//! it, the child may build a pager of its own that takes the regions over at the same
//! addresses: the pages it inherited stay mapped, shared copy-on-write with the parent and
//! charged to it (`PageState::Shared`) until the child writes them, and the pages that were
//! out are read on first touch from the child's copy of the parent's device, or from the
//! parent's swap file through the child's copy of its descriptor, or from the parent's keys
//! on connections of the child's own (`PageState::Parent`), then charged to the child. Each
//! process frees slots in its own copy of a memory device: the kernel's copy-on-write keeps
//! the other's. A slot of a shared device that the parent
//! frees while a child may still read it is held until the child has read or dropped that
//! page, or has exited or exec'd (the kernel's `swap_map` counts, across processes).
//!
//! Locking: the hold keeps the region registry's writer lock (`Registry::lock_writers`)
//! from the recording of the regions, and then the fork advice's list, until it is dropped
//! (parent) or handed to `rearm_in_child` (child). Invariant: the child never drops anything of the parent's pager;
//! it is leaked, since its threads exist only in the parent.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use crate::error::{Error, Result};
use crate::fork_advice::ForkAdvice;
use crate::mapping::AppMapping;
use crate::pager::{Pager, PagerBuilder};
use crate::region::{PageState, Pte, RegionInner, MAX_REGIONS, REGIONS};
use crate::region_handle::Region;
use crate::state::REGISTER_MODES;
use crate::swap::ForkRecord;
use crate::uffd::PAGE_SIZE;

/// Returned by [`Pager::prepare_fork`]: reclaim stays held while it lives. In the parent,
/// drop it right after the fork; in the child, either forget it (the child runs unmanaged,
/// and the registry's writer lock and the fork advice's list stay held in it: it maps no
/// managed memory and records no advice) or hand it to [`ForkHold::rearm_in_child`].
#[must_use = "dropping the hold at once lets reclaim take pages out before the fork"]
pub struct ForkHold {
    pager: Pager,
    /// Every region of the pager at the fork, for a child to adopt.
    regions: Vec<InheritedRegion>,
    /// The region registry's writer lock, held across the fork: no region appears or goes
    /// between its recording and the fork, and the child's copy of the lock is not left
    /// held by a thread the child does not have.
    writers: Option<std::sync::MutexGuard<'static, ()>>,
    /// The program's fork advice, held across the fork after the writers, for the same
    /// reason (`crate::fork_advice::Held`).
    advice: Option<crate::fork_advice::Held>,
    /// The devices whose memory the child inherits for this fork (`set_inherited`).
    inherited: Vec<usize>,
    /// For each device the child reads where it is (a swap file, Redis): its record of the
    /// slots the child may read, and the child's end of the record's pipe.
    child_refs: Vec<(usize, ForkRecord)>,
}

/// A region as a fork child inherits it: where it is, and the runs of its pages that are
/// still its own (the rest the application unmapped).
struct InheritedRegion {
    start: usize,
    nr_pages: usize,
    live: Vec<(usize, usize)>,
    /// No page from here on was ever mapped (see `RegionInner::note_touched`).
    touched_end: usize,
    /// Pages out at the fork on a device the child inherits (a memory device), and their
    /// entries: the child reads them from its copy of that device (`PageState::Parent`).
    swapped: Vec<(usize, crate::swap::SwapEntry)>,
}

impl Drop for ForkHold {
    fn drop(&mut self) {
        // The parent lets go of the child's ends of the pipes first, before another fork can
        // copy them: from now on only the child (and what it forks) holds them.
        self.child_refs.clear();
        drop(self.advice.take());
        drop(self.writers.take());
        // The parent's devices are its own again at the next fork.
        let devices = self.pager.shared().devices.devices();
        for &d in &self.inherited {
            devices[d].set_inherited(false);
        }
        let _signals = crate::uffd::AsyncSignalsBlocked::new();
        let s = self.pager.shared();
        s.charge.reclaim_held.store(false, Ordering::Release);
        // Back under the limit. Pages the child shares (copy-on-write) are refused here
        // (move_refused) and made exclusive by the background reclaimer (`reclaim::cow`),
        // whose next rounds move them out.
        let _ = s.reclaim_cx().reclaim_to_limit();
        // Copy-on-write breaks queued while reclaim was held wait for the background
        // reclaimer, which may be in a long idle sleep.
        s.reclaimer.wake();
    }
}

impl ForkHold {
    /// In a fork child, right after the fork (a `pthread_atfork` child handler, while the
    /// child has one thread): builds a pager from `builder` and gives it every region the
    /// parent's pager had, at the same addresses, so that the child goes on paging. The
    /// pages the child inherited stay mapped and shared with the parent, uncharged, until
    /// the child writes them ([`PageState::Shared`]); what it touches anew, and what it
    /// writes, it pays for and pages out under its own limit. Returns the pager and, for
    /// each region, its start and its new handle (dropping a handle unmaps the region, as
    /// for [`Pager::map`]).
    ///
    /// The parent's pager in the child is left alone, never dropped (its threads exist only
    /// in the parent). So are the regions of any other pager of the process: the child's
    /// registry lets go of all of them, and only this pager's are adopted. On error the child
    /// keeps every byte, as ordinary memory.
    pub fn rearm_in_child(mut self, builder: PagerBuilder) -> Result<(Pager, Vec<(usize, Region)>)> {
        // A child inherits no memory lock (mlock(2)), and none of its parent's other
        // threads' unmaps and event reads under way.
        crate::forget_parent_in_fork_child();
        crate::events::forget_in_fork_child();
        let advice = self.advice.take().unwrap_or_else(crate::fork_advice::hold_for_fork);
        crate::fork_advice::after_fork_in_child(advice);
        let regions = std::mem::take(&mut self.regions);
        let writers = self.writers.take();
        let parent = self.pager.shared_arc().clone();
        // The parent's shared devices, as this child reads them: nothing of the parent's
        // threads (a file device's rings, a Redis device's connections), and the child's own
        // record of the slots it may read, whose pipe end it keeps for life (its exit or
        // exec tells the parent it is gone).
        for d in parent.devices.devices() {
            d.fork_refs.close_parent_ends();
        }
        // The memory devices it inherited (a pool): read from here on with codec workspaces
        // of its own (the copies of the parent's could be mid-way through a push or pop).
        for &d in &self.inherited {
            // (A device it also reads as shared enters below, once.)
            if !self.child_refs.iter().any(|(dev, _)| *dev == d) {
                parent.devices.devices()[d].backend.enter_fork_child();
            }
        }
        for (dev, rec) in std::mem::take(&mut self.child_refs) {
            let d = &parent.devices.devices()[dev];
            d.backend.enter_fork_child();
            d.fork_refs.enter_child(rec.record);
            std::mem::forget(rec.child_end);
        }
        // Not dropped: that would run reclaim on the parent's pager, which has no threads here.
        std::mem::forget(self);
        REGIONS.forget_all_in_fork_child();
        drop(writers);
        // What is mapped before this child maps anything of its own: a run may have a hole
        // (another thread of the parent's `munmap`, made by the kernel, its UNMAP event not
        // read at the fork), which the new pager's stacks and arenas may take next; only what
        // was mapped at the fork is the region's.
        let mut regions = regions;
        if let Some(maps) = crate::mapping::self_maps() {
            for r in &mut regions {
                r.live = mapped_parts(&maps, r.start, &r.live);
            }
        }
        let pager = match builder.regions_survive_fork(true).build() {
            Ok(pager) => pager,
            Err(e) => {
                restore_parent_pages(&parent, &regions);
                return Err(e);
            }
        };
        let _signals = crate::uffd::AsyncSignalsBlocked::new();
        // The pages that were out at the fork are read from the parent's memory devices,
        // as this process inherited them. (Set before any region is adopted.)
        let _ = pager.shared().parent.set(parent.clone());
        let mut adopted = Vec::with_capacity(regions.len());
        for (k, r) in regions.iter().enumerate() {
            match pager.adopt_inherited(r) {
                Ok(region) => adopted.push((r.start, region)),
                Err(e) => {
                    // Dropping what was adopted would unmap it: keep it, served by the new
                    // pager; the rest stays ordinary memory, with every byte.
                    restore_parent_pages(&parent, &regions[k..]);
                    std::mem::forget(adopted);
                    std::mem::forget(pager);
                    return Err(e);
                }
            }
        }
        Ok((pager, adopted))
    }
}

impl ForkHold {
    /// In the child of a fork readied with [`Pager::prepare_fork`] (every page in) that
    /// builds no pager of its own, on its one thread before it runs: what the hold took is
    /// let go of there, so that the child may map, advise and build a pager later (the
    /// region registry, emptied of the parent's regions, and its writer lock; the fork
    /// advice's list; the parent's threads' unmaps and event reads under way; the parent's
    /// ends of its devices' pipes). Its regions stay ordinary memory, every byte in. The
    /// parent's pager is left alone, never dropped (its threads exist only in the parent).
    pub fn release_in_unmanaged_child(mut self) {
        crate::forget_parent_in_fork_child();
        crate::events::forget_in_fork_child();
        let advice = self.advice.take().unwrap_or_else(crate::fork_advice::hold_for_fork);
        crate::fork_advice::after_fork_in_child(advice);
        let writers = self.writers.take();
        for d in self.pager.shared().devices.devices() {
            d.fork_refs.close_parent_ends();
        }
        // Not dropped: that would run reclaim on the parent's pager, which has no threads here.
        std::mem::forget(self);
        REGIONS.forget_all_in_fork_child();
        drop(writers);
    }
}

/// A child that could not re-arm runs unmanaged: its regions are ordinary memory (the
/// parent's registrations do not cross a fork), where the pages that were out at the fork
/// read zero. Each is written in place from the child's copy of the parent's device, so
/// that every byte is there. A page that cannot be read is reported on stderr.
fn restore_parent_pages(parent: &crate::state::PagerShared, regions: &[InheritedRegion]) {
    let mut page = crate::backend::AlignedPage([0; PAGE_SIZE]);
    for r in regions {
        for &(i, entry) in &r.swapped {
            let addr = r.start + i * PAGE_SIZE;
            // Unmapped (a hole of the run), or mapped (brought in by the parent just before
            // the fork, and what is there is newer than the slot): nothing to write.
            let in_live_run = r.live.iter().any(|&(first, end)| (first..end).contains(&i));
            if !in_live_run || crate::mapping::page_present(addr) {
                parent.devices.device(entry).fork_refs.release_own(entry.offset());
                continue;
            }
            if crate::events::read_checked(parent.devices.device(entry), entry.offset(), &mut page).is_err() {
                let msg =
                    format!("uswap: fork child: the page at {addr:#x} could not be read from the parent's device\n");
                // SAFETY: writes a buffer we own to stderr.
                unsafe { libc::write(2, msg.as_ptr().cast(), msg.len()) };
                continue;
            }
            // SAFETY: the page lies in a live run of a region the child inherited, which is
            // ordinary anonymous memory of this process now (no userfaultfd registration
            // crosses a fork) and mapped; the child has one thread, so nothing else writes it.
            unsafe { std::ptr::copy_nonoverlapping(page.0.as_ptr(), addr as *mut u8, PAGE_SIZE) };
            parent.devices.device(entry).fork_refs.release_own(entry.offset());
        }
    }
}

impl Pager {
    /// Readies the regions for a `fork()` that copies them: holds reclaim and brings every
    /// page that is out (staged or on a device) back into its region, so the child's copy
    /// has every byte. Until the returned [`ForkHold`] is dropped (in the parent, right
    /// after the fork) the pager may exceed its limit; dropping it reclaims back down.
    /// Must run on an application thread (it takes the faults itself), with no other
    /// thread unmapping regions at the same time. Needs
    /// [`PagerBuilder::regions_survive_fork`]; without it the child gets no regions at all.
    ///
    /// The hold also locks the process's region registry (so that the regions the child
    /// inherits are the ones it records): while it lives, no region of any pager may be
    /// mapped, dropped or moved, on any thread; fork at once and drop it (or, in the child,
    /// hand it to [`ForkHold::rearm_in_child`]).
    ///
    /// Costs a scan of the part of every region's page table that was ever touched, after
    /// a wait (bounded at 1 s, counted) for the events already read to be applied.
    pub fn prepare_fork(&self) -> ForkHold {
        self.prepare(false)
    }

    /// [`Pager::prepare_fork`] for a fork whose child calls [`ForkHold::rearm_in_child`]
    /// (as `uswap run`'s library does): pages out on a memory device (RAM, the compressed
    /// pool) stay out, and the child reads them from its copy of the device; pages on a swap
    /// file uswap created, a block device or Redis stay out too, and the child reads them
    /// there, the parent holding each slot until the child lets go of it. So the fork brings
    /// in only what the child could not read where it is (staged pages, pages on a named
    /// swap file, which the parent empties when its device goes; also a shared device's
    /// pages when 64 children already read from it). A child that does not re-arm would
    /// read zeros where those pages are: use `prepare_fork` for it.
    pub fn prepare_fork_to_rearm(&self) -> ForkHold {
        self.prepare(true)
    }

    fn prepare(&self, leave_memory_devices_out: bool) -> ForkHold {
        let s = self.shared();
        crate::pin::note_fork();
        s.charge.reclaim_held.store(true, Ordering::SeqCst);
        // No page is half moved out when the child's copy is taken.
        s.reclaim_cx().wait_none_in_flight();
        // An `madvise(MADV_DONTNEED)`, `munmap` or `mremap` returns once its event is read,
        // not applied: applied now, so that a page the program discarded before its fork is
        // recorded as zero, not at the slot the event frees (the child would read the old
        // bytes from its copy of the device, or fail on a slot freed before the fork).
        crate::events::settle_reads(&s.events, &s.stats);
        let plan = ForkPlan::new(s, leave_memory_devices_out);
        bring_in_what_the_child_cannot_read(s, &plan);
        let writers = REGIONS.lock_writers();
        let mut regions = Vec::new();
        REGIONS.for_each(|r| {
            if std::ptr::eq(&*r.pager, s) {
                regions.push(plan.record_region(r));
            }
        });
        let (inherited, child_refs) = plan.hand_over();
        let advice = Some(crate::fork_advice::hold_for_fork());
        ForkHold { pager: self.clone(), regions, writers: Some(writers), advice, inherited, child_refs }
    }

    /// Takes over, in a fork child, a region inherited from the parent: its pages stay where
    /// they are, shared with the parent until written ([`PageState::Shared`]); pages the
    /// application unmapped stay out.
    fn adopt_inherited(&self, r: &InheritedRegion) -> Result<Region> {
        let len = r.nr_pages * PAGE_SIZE;
        let shared = self.shared_arc();
        let inner = Arc::new(
            RegionInner::new(AppMapping::existing(r.start, len), shared.clone())
                .map_err(|e| Error::io("allocating an inherited region's page table", e))?,
        );
        let (mut registered, live_pages) = self.adopt_live_runs(&inner, r)?;
        inner.note_going(r.nr_pages - live_pages);
        // Out at the fork (and not mapped since: a fault in the parent may have brought one
        // in just before it): read from the parent's device on first touch. The slots of
        // pages mapped here, or unmapped, go back once the region is in (before, a failure
        // leaves them to `restore_parent_pages`, which skips such pages).
        let mut given_back = Vec::new();
        for &(page, entry) in &r.swapped {
            match inner.load(page).state() {
                PageState::Shared | PageState::Gone => given_back.push(entry),
                _ => inner.pte(page).store(Pte(0).next(PageState::Parent, Some(entry)).0, Ordering::Relaxed),
            }
        }
        let inserted =
            REGIONS.insert(r.start, r.start + len, inner.clone()).ok_or(Error::TooManyRegions { max: MAX_REGIONS });
        inner.note_touched(r.touched_end.saturating_sub(1));
        let slot = match inserted {
            Ok(slot) => slot,
            Err(e) => {
                self.unregister_ranges(&mut registered);
                return Err(e);
            }
        };
        for entry in given_back {
            shared.release_cx().release_parent_slot(entry);
        }
        Ok(Region::new(inner, slot, self.clone()))
    }

    /// Registers the runs of `r` and marks their present pages shared, the other pages gone;
    /// returns the ranges registered and their pages.
    fn adopt_live_runs(&self, inner: &RegionInner, r: &InheritedRegion) -> Result<(Vec<(usize, usize)>, usize)> {
        let mut registered = Vec::with_capacity(r.live.len());
        if let Err(e) = self.register_runs(inner, r, &r.live, &mut registered) {
            self.unregister_ranges(&mut registered);
            return Err(e);
        }
        let set_gone = |page: usize| inner.pte(page).store(Pte(0).next(PageState::Gone, None).0, Ordering::Relaxed);
        let mut next = 0;
        for &(first, end) in &r.live {
            (next..first).for_each(set_gone);
            next = end;
        }
        (next..r.nr_pages).for_each(set_gone);
        Ok((registered, r.live.iter().map(|&(first, end)| end - first).sum()))
    }

    /// Registers each of `runs` (pages of `r`) with userfaultfd, write-protected, after
    /// marking the pages mapped there shared; what it registered is in `registered`.
    fn register_runs(
        &self,
        inner: &RegionInner,
        r: &InheritedRegion,
        runs: &[(usize, usize)],
        registered: &mut Vec<(usize, usize)>,
    ) -> Result<()> {
        let uffd = &self.shared().uffd;
        for &(first, end) in runs {
            debug_assert!(first < end && end <= r.nr_pages, "a run of the region: {first}..{end}");
            let (addr, run_len) = (r.start + first * PAGE_SIZE, (end - first) * PAGE_SIZE);
            // Only where the parent ever mapped pages: a heap region is mostly untouched.
            let scan_pages = end.min(r.touched_end).saturating_sub(first);
            let shared = Pte(0).next(PageState::Shared, None).0;
            crate::mapping::for_each_present_page(addr, scan_pages, |i| {
                inner.pte(first + i).store(shared, Ordering::Relaxed)
            })
            .map_err(|e| Error::io("reading which inherited pages are mapped (mincore)", e))?;
            uffd.register(addr, run_len, REGISTER_MODES)
                .map_err(|e| Error::io("registering an inherited region with userfaultfd", e))?;
            registered.push((addr, run_len));
            // Written pages must be charged first (see `PageState::Shared`). (With "don't
            // wake" the kernel refuses to protect: EINVAL. Nothing waits here.)
            uffd.writeprotect(addr, run_len, true, true)
                .map_err(|e| Error::io("write-protecting an inherited region", e))?;
        }
        Ok(())
    }

    /// Back to ordinary memory (unregistering also lifts the write protection).
    fn unregister_ranges(&self, registered: &mut Vec<(usize, usize)>) {
        for (addr, run_len) in registered.drain(..) {
            let _ = self.shared().uffd.unregister(addr, run_len);
        }
    }
}

/// What a fork does with each device of the pager: which the child inherits (memory
/// devices), and which it reads where they are, with the record of the slots it may read.
struct ForkPlan<'a> {
    devices: &'a [crate::swap::SwapDevice],
    inheritable: Vec<bool>,
    /// For a device the child reads where it is; `None` without a record (too many
    /// children): its pages come in.
    records: Vec<Option<ForkRecord>>,
}

impl<'a> ForkPlan<'a> {
    fn new(s: &'a crate::state::PagerShared, leave_out: bool) -> ForkPlan<'a> {
        let devices = s.devices.devices();
        let inheritable = devices.iter().map(|d| leave_out && d.backend.inheritable()).collect();
        let records = devices
            .iter()
            .map(|d| {
                let shared = leave_out && !d.backend.inheritable() && d.backend.shared_with_fork_children();
                if shared {
                    d.fork_refs.begin_fork()
                } else {
                    None
                }
            })
            .collect();
        ForkPlan { devices, inheritable, records }
    }

    /// Whether the page stays out for the child to read where it is.
    fn stays_out(&self, pte: Pte) -> bool {
        let dev = pte.entry().device();
        pte.state() == PageState::Swapped && (self.inheritable[dev] || self.records[dev].is_some())
    }

    /// The region as the child inherits it: its live runs (less what the program advised
    /// `MADV_DONTFORK`: the child does not have it) and the pages that stay out (less what it
    /// advised `MADV_WIPEONFORK`: the child reads zeros there). See `fork_advice`.
    fn record_region(&self, r: &RegionInner) -> InheritedRegion {
        let advised = |kind| advised_pages(r, kind);
        let (live, touched_end) = (without(r.live_runs(), &advised(ForkAdvice::DontFork)), r.touched_end());
        let wiped = advised(ForkAdvice::WipeOnFork);
        let mut swapped = Vec::new();
        for &(first, end) in &live {
            for page in first..end.min(touched_end) {
                let pte = r.load(page);
                if !self.stays_out(pte) || wiped.iter().any(|&(s, e)| (s..e).contains(&page)) {
                    continue;
                }
                let e = pte.entry();
                // On a shared device, a page released meanwhile (its slot perhaps freed
                // already) is left out: the child reads zeros, as after the discard
                // (`swap::fork_refs`, locking).
                let kept = self.records[e.device()].as_ref().is_none_or(|rec| {
                    self.devices[e.device()].fork_refs.recorded(rec.record, e.offset(), || {
                        let now = r.load(page);
                        now.state() == PageState::Swapped && now.entry() == e
                    })
                });
                if kept {
                    swapped.push((page, e));
                }
            }
        }
        InheritedRegion { start: r.start(), nr_pages: r.nr_pages, live, touched_end, swapped }
    }

    /// The memory devices' pages, and what they are found by (a shared device's
    /// checksums), go to the child copy-on-write (the parent makes them its own again when
    /// the hold drops). Only theirs: the swap cache's staging pages, shared with a child,
    /// could not be moved back into a region (`UFFDIO_MOVE` refuses shared pages), in any
    /// pager. The shared devices' records are complete. Returns the devices inherited and
    /// the records, for the hold.
    fn hand_over(self) -> (Vec<usize>, Vec<(usize, ForkRecord)>) {
        let mut inherited = Vec::new();
        let mut child_refs = Vec::new();
        for (i, (d, rec)) in self.devices.iter().zip(self.records).enumerate() {
            if let Some(rec) = rec {
                d.fork_refs.publish(rec.record);
                child_refs.push((i, rec));
            } else if !self.inheritable[i] {
                continue;
            }
            d.set_inherited(true);
            inherited.push(i);
        }
        (inherited, child_refs)
    }
}

/// The pages of `r` the program advised `kind`, as runs `[first, end)` in address order.
fn advised_pages(r: &RegionInner, kind: ForkAdvice) -> Vec<(usize, usize)> {
    let start = r.start();
    crate::fork_advice::ranges_in(kind, start, start + r.nr_pages * PAGE_SIZE)
        .into_iter()
        .map(|(s, e)| ((s - start) / PAGE_SIZE, (e - start) / PAGE_SIZE))
        .collect()
}

/// `runs` less `holes` (both in address order, `[first, end)`).
fn without(runs: Vec<(usize, usize)>, holes: &[(usize, usize)]) -> Vec<(usize, usize)> {
    if holes.is_empty() {
        return runs;
    }
    let mut out = Vec::with_capacity(runs.len() + holes.len());
    for (mut first, end) in runs {
        for &(hs, he) in holes {
            if he <= first || end <= hs {
                continue;
            }
            if first < hs {
                out.push((first, hs));
            }
            first = first.max(he);
        }
        if first < end {
            out.push((first, end));
        }
    }
    out
}

/// What the child could not read where it is comes back in: staged pages (the swap cache
/// lives in the parent's staging area), pages on devices that are neither memory nor shared
/// with the child (a named swap file), and pages this process still reads from its own
/// parent. Reclaim is held and no round runs, so one pass brings everything in; faults only
/// bring pages in.
fn bring_in_what_the_child_cannot_read(s: &crate::state::PagerShared, plan: &ForkPlan<'_>) {
    REGIONS.for_each(|r| {
        if !std::ptr::eq(&*r.pager, s) {
            return;
        }
        for (first, end) in r.live_runs() {
            for page in first..end.min(r.touched_end()) {
                let pte = r.load(page);
                if matches!(pte.state(), PageState::Cached | PageState::Swapped | PageState::Parent)
                    && !plan.stays_out(pte)
                {
                    // SAFETY: the page lies in a live run of a registered region (mapped;
                    // the caller promises no concurrent unmap); a read takes the fault that
                    // brings it in and changes nothing.
                    unsafe { std::ptr::read_volatile(r.page_addr(page) as *const u8) };
                }
            }
        }
    });
}

/// The parts of `runs` (pages from `start`) that `maps` (`/proc/self/maps`, by address)
/// shows mapped, as runs.
fn mapped_parts(maps: &[crate::mapping::MapsEntry], start: usize, runs: &[(usize, usize)]) -> Vec<(usize, usize)> {
    let mut parts = Vec::with_capacity(runs.len());
    for &(first, end) in runs {
        let (lo, hi) = (start + first * PAGE_SIZE, start + end * PAGE_SIZE);
        for m in maps.iter().filter(|m| m.start < hi && lo < m.end) {
            let (s, e) = (m.start.max(lo), m.end.min(hi));
            parts.push(((s - start) / PAGE_SIZE, (e - start) / PAGE_SIZE));
        }
    }
    parts
}
