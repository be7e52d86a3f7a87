//! Managed regions as the engine sees them (the VMA of uswap): the application mapping, its
//! page table and the process-wide registry that the fault path searches by address. The
//! application's handle, [`crate::Region`], is `region_handle`'s.
//!
//! Page states, and the page-table entry that holds them, are `crate::page_table`'s.
//!
//! Invariants: a page is mapped in the region iff its state is RESIDENT (outside a busy
//! section); a CACHED page's contents are at its entry's staging address; a clean page is
//! write-protected and its slot holds its contents; the region's memory is never read or
//! written by the engine, only moved by ioctls (and a clean page dropped).

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

use arrayvec::ArrayVec;
use std::sync::Arc;

use crate::mapping::registry::{Registry, RegistryGuard};
use crate::mapping::{AppMapping, AtomicTable};
use crate::readahead::FaultStreams;
use crate::state::{PagerId, PagerShared};
use crate::uffd::PAGE_SIZE;

pub(crate) use crate::page_table::{PageRef, PageState, Pte, REGION_GEN_MASK};
pub use crate::page_table::{MAX_REGIONS, MAX_REGION_BYTES};

/// Every managed region of the process, for the fault path and reclaim.
pub(crate) static REGIONS: Registry<RegionInner, MAX_REGIONS> = Registry::new();

// ---------------------------------------------------------------------------------------
// Regions
// ---------------------------------------------------------------------------------------

/// The engine's view of a region: address range, page table and owning pager.
pub(crate) struct RegionInner {
    /// The application's memory: never unmapped by dropping this (`unmap_region` unmaps
    /// what is still the region's). Its address changes when the application moves the
    /// whole region (`mremap`).
    memory: std::mem::ManuallyDrop<AppMapping>,
    pub nr_pages: usize,
    pub ptes: AtomicTable,
    pub pager: Arc<PagerShared>,
    /// Fault streams and access advice, for readahead and fault-around.
    pub streams: FaultStreams,
    /// Pages from here on have never been mapped by the engine (nor inherited): a fork child
    /// adopting the region looks for mapped pages only below it, instead of across a heap
    /// region of tens of gigabytes it mostly never touched (see [`RegionInner::note_touched`]).
    touched_end: AtomicUsize,
    /// At least as many as the pages `Gone` (unmapped by the application, or let go of):
    /// raised before a word becomes `Gone` ([`RegionInner::note_going`]), lowered once such
    /// a page is the region's again (`Region::adopt_range`). While it is zero every page is
    /// the region's, and [`RegionInner::live_runs`] needs no scan. A count, not a flag: GHC's
    /// runtime commits its 1 TiB reservation with `mmap(MAP_FIXED)`, whose `UNMAP` makes the
    /// pages `Gone` until they are adopted again a moment later, and a flag, set for good,
    /// made each fork scan the reservation's 268 M words (1-2 s).
    nr_gone: AtomicUsize,
}

/// Pages a fault may map beyond its own (a fault-around or readahead window, and the
/// asynchronous windows read ahead of it), for [`RegionInner::note_touched`].
const TOUCH_AHEAD_PAGES: usize = 4 * crate::readahead::MAX_WINDOW_PAGES;

impl RegionInner {
    /// A fault on `page` may map pages up to [`TOUCH_AHEAD_PAGES`] past it. A load on the
    /// fault path, and a store only when the region's touched part grows.
    #[inline]
    pub fn note_touched(&self, page: usize) {
        let end = (page + 1 + TOUCH_AHEAD_PAGES).min(self.nr_pages);
        if end > self.touched_end.load(Ordering::Relaxed) {
            self.touched_end.fetch_max(end, Ordering::Relaxed);
        }
    }

    /// Pages `[0, touched_end)` may have been mapped; none beyond.
    pub fn touched_end(&self) -> usize {
        self.touched_end.load(Ordering::Acquire)
    }

    /// Every page from here on is `None`: never mapped, and none `Gone` now.
    pub fn all_none_from(&self) -> usize {
        if self.nr_gone.load(Ordering::Acquire) > 0 {
            self.nr_pages
        } else {
            self.touched_end()
        }
    }

    pub fn new(memory: AppMapping, pager: Arc<PagerShared>) -> std::io::Result<RegionInner> {
        let nr_pages = memory.len() / PAGE_SIZE;
        Ok(RegionInner {
            memory: std::mem::ManuallyDrop::new(memory),
            nr_pages,
            ptes: AtomicTable::small_in_heap(nr_pages)?,
            pager,
            streams: FaultStreams::new(),
            touched_end: AtomicUsize::new(0),
            nr_gone: AtomicUsize::new(0),
        })
    }

    /// The application's memory, where it is now.
    pub fn memory(&self) -> &AppMapping {
        &self.memory
    }

    #[inline]
    pub fn start(&self) -> usize {
        self.memory.addr()
    }

    /// The region moved (a whole-region `mremap`).
    pub fn set_start(&self, start: usize) {
        self.memory.set_addr(start);
    }

    /// `nr_pages` pages that are not `Gone` are about to be: called before their words are
    /// stored, so that the count is never below the pages `Gone`, whatever another thread
    /// adopts meanwhile.
    pub fn note_going(&self, nr_pages: usize) {
        self.nr_gone.fetch_add(nr_pages, Ordering::Release);
    }

    /// `nr_pages` pages that were `Gone` are the region's again: called once their words are
    /// stored.
    pub fn note_not_gone(&self, nr_pages: usize) {
        let before = self.nr_gone.fetch_sub(nr_pages, Ordering::Release);
        assert!(before >= nr_pages, "uswap invariant: {nr_pages} pages back from {before} gone");
    }

    /// Whether no page is `Gone` now (nor about to be): every page is the region's.
    fn none_gone(&self) -> bool {
        self.nr_gone.load(Ordering::Acquire) == 0
    }

    /// Whether any page of `[start, end)` (addresses, clipped to the region) is still the
    /// region's (not `Gone`: unmapped, or let go of with `Pager::unmanage`). A scan of the
    /// page table only while some page is `Gone`.
    pub fn owns_any_of(&self, start: usize, end: usize) -> bool {
        let (first, last) = (start.max(self.start()), end.min(self.start() + self.nr_pages * PAGE_SIZE));
        if first >= last {
            return false;
        }
        if self.none_gone() {
            return true;
        }
        let (first, last) = ((first - self.start()) / PAGE_SIZE, (last - self.start()).div_ceil(PAGE_SIZE));
        self.pager.stats.add(crate::stats::Counter::GoneScanPages, (last - first) as u64);
        (first..last).any(|page| self.load(page).state() != PageState::Gone)
    }

    /// Runs `[first, end)` of pages that are still the region's (not `Gone`). A scan of the
    /// page table only while some page is `Gone`.
    pub fn live_runs(&self) -> Vec<(usize, usize)> {
        if self.none_gone() {
            return vec![(0, self.nr_pages)];
        }
        self.pager.stats.add(crate::stats::Counter::GoneScanPages, self.nr_pages as u64);
        let mut live: Vec<(usize, usize)> = Vec::new();
        for page in 0..self.nr_pages {
            if self.load(page).state() != PageState::Gone {
                match live.last_mut() {
                    Some((_, end)) if *end == page => *end = page + 1,
                    _ => live.push((page, page + 1)),
                }
            }
        }
        live
    }

    /// The page `addr` falls in, if it is inside the region.
    #[inline]
    pub fn page_of(&self, addr: usize) -> Option<usize> {
        let page = addr.checked_sub(self.start())? / PAGE_SIZE;
        (page < self.nr_pages).then_some(page)
    }

    #[inline]
    pub fn pte(&self, page: usize) -> &AtomicU64 {
        &self.ptes[page]
    }

    #[inline]
    pub fn load(&self, page: usize) -> Pte {
        Pte(self.ptes[page].load(Ordering::Acquire))
    }

    /// Tries to take ownership of a page in the given observed state. Returns the word as it
    /// was (with busy set) on success.
    #[inline]
    pub fn try_lock(&self, page: usize, seen: Pte) -> Option<Pte> {
        if seen.busy() {
            return None;
        }
        self.ptes[page]
            .compare_exchange(seen.0, seen.with_busy().0, Ordering::AcqRel, Ordering::Acquire)
            .ok()
            .map(|_| seen.with_busy())
    }

    /// Publishes a page's new word, ending ownership.
    #[inline]
    pub fn store(&self, page: usize, pte: Pte) {
        debug_assert!(!pte.busy());
        // Only the owner (the busy bit's holder) changes a page: a store over a word that is
        // not busy would overwrite another thread's transition. One load, kept in release.
        let was = Pte(self.ptes[page].load(Ordering::Relaxed));
        assert!(
            was.busy(),
            "uswap invariant: page {page} changed by a thread that does not own it ({was:?} -> {pte:?})"
        );
        self.ptes[page].store(pte.0, Ordering::Release);
    }

    #[inline]
    pub fn page_addr(&self, page: usize) -> usize {
        self.start() + page * PAGE_SIZE
    }
}

/// Distinct regions one reclaim round or one readahead window may touch (their guards live
/// on the stack).
pub(crate) const MAX_REGIONS_PER_SET: usize = 4;

/// The region guards one operation holds, found by `PageRef` (reclaim queues, swap-cache
/// owners). Holding a guard keeps the region's engine state alive and its memory mapped.
pub(crate) struct RegionSet {
    pub g: ArrayVec<RegistryGuard<'static, RegionInner>, MAX_REGIONS_PER_SET>,
}

impl RegionSet {
    pub fn new() -> RegionSet {
        RegionSet { g: ArrayVec::new() }
    }

    /// Index of the guard for `r`'s region, taking one if needed. `Err(true)`: no room for
    /// another region this round; `Err(false)`: the region is gone (stale entry), or is not
    /// `owner`'s.
    pub fn get(&mut self, owner: PagerId, r: PageRef) -> Result<usize, bool> {
        if let Some(i) = self.g.iter().position(|g| g.index == r.region_idx && g.gen & REGION_GEN_MASK == r.region_gen)
        {
            // The guard held may be a later region than `r`'s (see `PageRef::names_page_of`).
            let g = &self.g[i];
            return if r.names_page_of(g.index, g.gen, g.nr_pages) { Ok(i) } else { Err(false) };
        }
        if self.g.is_full() {
            return Err(true);
        }
        match region_of(r) {
            Some(g) if g.pager.id() == owner && r.names_page_of(g.index, g.gen, g.nr_pages) => {
                self.g.push(g);
                Ok(self.g.len() - 1)
            }
            _ => Err(false),
        }
    }

    pub fn page_ref(&self, gi: usize, page: usize, pte: Pte) -> PageRef {
        PageRef { region_idx: self.g[gi].index, region_gen: self.g[gi].gen, page_gen: pte.gen(), page }
    }
}

/// The region that owns the page at `addr`, for the fault paths. Regions may overlap: the
/// application unmapped part of one and something new was mapped there (a grown mapping, a
/// new reservation placed in the hole). The page belongs to the region where it is not
/// `Gone`; only if every region there has it `Gone` is that one returned.
pub(crate) fn region_owning(addr: usize) -> Option<RegistryGuard<'static, RegionInner>> {
    REGIONS.find_preferring(addr, |r| r.page_of(addr).is_some_and(|page| r.load(page).state() != PageState::Gone))
}

/// Looks a region up by a `PageRef` (reclaim queues, swap-cache owners).
pub(crate) fn region_of(r: PageRef) -> Option<RegistryGuard<'static, RegionInner>> {
    REGIONS.get(r.region_idx, r.region_gen, REGION_GEN_MASK)
}
