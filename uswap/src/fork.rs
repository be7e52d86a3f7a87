//! `fork()` of a process with managed regions: the parent's side ([`Pager::prepare_fork`],
//! [`ForkHold`]) and the child's ([`ForkHold::rearm_in_child`]).
//!
//! A pager's devices, threads and userfaultfd do not cross a fork. Before it, the parent
//! brings every page that is out back into its region and holds reclaim, so the child's copy
//! has every byte; it also records its regions and locks the region registry until the fork
//! is done. After it, the child may build a pager of its own that takes the regions over at
//! the same addresses: the pages it inherited stay mapped, shared copy-on-write with the
//! parent and charged to it (`PageState::Inherited`) until the child writes them.
//!
//! Locking: the hold keeps the region registry's writer lock (`Registry::lock_writers`)
//! from the recording of the regions until it is dropped (parent) or handed to
//! `rearm_in_child` (child). Invariant: the child never drops anything of the parent's pager;
//! it is leaked, since its threads exist only in the parent.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use crate::error::{Error, Result};
use crate::mapping::AppMapping;
use crate::pager::{Pager, PagerBuilder, REGISTER_MODES};
use crate::reclaim;
use crate::region::{PageState, Pte, RegionInner, MAX_REGIONS, REGIONS};
use crate::region_handle::Region;
use crate::uffd::PAGE_SIZE;

/// Bound on [`Pager::prepare_fork`]'s passes over the page tables.
const MAX_FORK_PASSES: usize = 8;

/// Returned by [`Pager::prepare_fork`]: reclaim stays held while it lives. In the parent,
/// drop it right after the fork; in the child, either forget it (the child runs unmanaged)
/// or hand it to [`ForkHold::rearm_in_child`].
#[must_use = "dropping the hold at once lets reclaim take pages out before the fork"]
pub struct ForkHold {
    pager: Pager,
    /// Every region of the pager at the fork, for a child to adopt.
    regions: Vec<InheritedRegion>,
    /// The region registry's writer lock, held across the fork: no region appears or goes
    /// between its recording and the fork, and the child's copy of the lock is not left
    /// held by a thread the child does not have.
    writers: Option<std::sync::MutexGuard<'static, ()>>,
}

/// A region as a fork child inherits it: where it is, and the runs of its pages that are
/// still its own (the rest the application unmapped).
struct InheritedRegion {
    start: usize,
    nr_pages: usize,
    live: Vec<(usize, usize)>,
    /// No page from here on was ever mapped (see `RegionInner::note_touched`).
    touched_end: usize,
}

impl Drop for ForkHold {
    fn drop(&mut self) {
        drop(self.writers.take());
        let _signals = crate::uffd::AsyncSignalsBlocked::new();
        let s = self.pager.shared();
        s.reclaim_held.store(false, Ordering::Release);
        // Back under the limit. Pages the child shares (copy-on-write) are refused here
        // (move_refused) and made exclusive by the background reclaimer (`reclaim::cow`),
        // whose next rounds move them out.
        let _ = reclaim::reclaim_to_limit(s);
    }
}

impl ForkHold {
    /// In a fork child, right after the fork (a `pthread_atfork` child handler, while the
    /// child has one thread): builds a pager from `builder` and gives it every region the
    /// parent's pager had, at the same addresses, so that the child goes on paging. The
    /// pages the child inherited stay mapped and shared with the parent, uncharged, until
    /// the child writes them ([`PageState::Inherited`]); what it touches anew, and what it
    /// writes, it pays for and pages out under its own limit. Returns the pager and, for
    /// each region, its start and its new handle (dropping a handle unmaps the region, as
    /// for [`Pager::map`]).
    ///
    /// The parent's pager in the child is left alone, never dropped (its threads exist only
    /// in the parent). So are the regions of any other pager of the process: the child's
    /// registry lets go of all of them, and only this pager's are adopted. On error the child
    /// keeps every byte, as ordinary memory.
    pub fn rearm_in_child(mut self, builder: PagerBuilder) -> Result<(Pager, Vec<(usize, Region)>)> {
        let regions = std::mem::take(&mut self.regions);
        let writers = self.writers.take();
        // Not dropped: that would run reclaim on the parent's pager, which has no threads here.
        std::mem::forget(self);
        REGIONS.forget_all_in_fork_child();
        drop(writers);
        let pager = builder.regions_survive_fork(true).build()?;
        let _signals = crate::uffd::AsyncSignalsBlocked::new();
        let mut adopted = Vec::with_capacity(regions.len());
        for r in &regions {
            match pager.adopt_inherited(r) {
                Ok(region) => adopted.push((r.start, region)),
                Err(e) => {
                    // Dropping what was adopted would unmap it: keep it, served by the new
                    // pager; the rest stays ordinary memory.
                    std::mem::forget(adopted);
                    std::mem::forget(pager);
                    return Err(e);
                }
            }
        }
        Ok((pager, adopted))
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
    /// Costs a scan of every region's page table, skipped when nothing is out.
    pub fn prepare_fork(&self) -> ForkHold {
        let s = self.shared();
        s.reclaim_held.store(true, Ordering::Release);
        // A reclaim round already under way when the hold was set may still take pages out
        // behind the first pass: passes repeat until one finds nothing to bring in (rounds
        // are short and no new one starts, so the second pass normally ends it).
        for _pass in 0..MAX_FORK_PASSES {
            let anything_out =
                s.swap_cache.nr_pages() > 0 || s.devices.devices().iter().any(|d| d.allocator.inuse_slots() > 0);
            if !anything_out {
                break;
            }
            let mut brought_in = 0usize;
            REGIONS.for_each(|r| {
                if !std::ptr::eq(&*r.pager, s) {
                    return;
                }
                for (first, end) in r.live_runs() {
                    for page in first..end {
                        if matches!(r.load(page).state(), PageState::Cached | PageState::Swapped) {
                            // SAFETY: the page lies in a live run of a registered region
                            // (mapped; the caller promises no concurrent unmap); a read
                            // takes the fault that brings it in and changes nothing.
                            unsafe { std::ptr::read_volatile(r.page_addr(page) as *const u8) };
                            brought_in += 1;
                        }
                    }
                }
            });
            if brought_in == 0 {
                break;
            }
        }
        let writers = REGIONS.lock_writers();
        let mut regions = Vec::new();
        REGIONS.for_each(|r| {
            if std::ptr::eq(&*r.pager, s) {
                regions.push(InheritedRegion {
                    start: r.start(),
                    nr_pages: r.nr_pages,
                    live: r.live_runs(),
                    touched_end: r.touched_end(),
                });
            }
        });
        ForkHold { pager: self.clone(), regions, writers: Some(writers) }
    }

    /// Takes over, in a fork child, a region inherited from the parent: its pages stay where
    /// they are, shared with the parent until written ([`PageState::Inherited`]); pages the
    /// application unmapped stay out.
    fn adopt_inherited(&self, r: &InheritedRegion) -> Result<Region> {
        let len = r.nr_pages * PAGE_SIZE;
        let shared = self.shared_arc();
        let inner = Arc::new(
            RegionInner::new(AppMapping::existing(r.start, len), shared.clone())
                .map_err(|e| Error::io("allocating an inherited region's page table", e))?,
        );
        let set = |page: usize, state: PageState| inner.pte(page).store(Pte(0).next(state, None).0, Ordering::Relaxed);
        let mut next = 0;
        let mut registered: Vec<(usize, usize)> = Vec::with_capacity(r.live.len());
        let adopt_runs = |registered: &mut Vec<(usize, usize)>| -> Result<()> {
            for &(first, end) in &r.live {
                let (addr, run_len) = (r.start + first * PAGE_SIZE, (end - first) * PAGE_SIZE);
                // Only where the parent ever mapped pages: a heap region is mostly untouched.
                let scan_pages = end.min(r.touched_end).saturating_sub(first);
                crate::mapping::for_each_present_page(addr, scan_pages, |i| set(first + i, PageState::Inherited))
                    .map_err(|e| Error::io("reading which inherited pages are mapped (mincore)", e))?;
                shared
                    .uffd
                    .register(addr, run_len, REGISTER_MODES)
                    .map_err(|e| Error::io("registering an inherited region with userfaultfd", e))?;
                registered.push((addr, run_len));
                // Written pages must be charged first (see `PageState::Inherited`). (With
                // "don't wake" the kernel refuses to protect: EINVAL. Nothing waits here.)
                shared
                    .uffd
                    .writeprotect(addr, run_len, true, true)
                    .map_err(|e| Error::io("write-protecting an inherited region", e))?;
            }
            Ok(())
        };
        if r.live != [(0, r.nr_pages)] {
            inner.note_gone();
        }
        for &(first, end) in &r.live {
            (next..first).for_each(|page| set(page, PageState::Gone));
            next = end;
        }
        (next..r.nr_pages).for_each(|page| set(page, PageState::Gone));
        let inserted = adopt_runs(&mut registered).and_then(|()| {
            REGIONS.insert(r.start, r.start + len, inner.clone()).ok_or(Error::TooManyRegions { max: MAX_REGIONS })
        });
        inner.note_touched(r.touched_end.saturating_sub(1));
        let slot = match inserted {
            Ok(slot) => slot,
            Err(e) => {
                // Back to ordinary memory (unregistering also lifts the write protection).
                for &(addr, run_len) in &registered {
                    let _ = shared.uffd.unregister(addr, run_len);
                }
                return Err(e);
            }
        };
        Ok(Region::new(inner, slot, self.clone()))
    }
}
