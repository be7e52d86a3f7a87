//! Release: what a page holds besides its mapping, given back when the page goes (a region
//! unmapped or dropped, a range discarded): the slot of a clean, staged or swapped page, the
//! staging page of a staged one, and its charge if it is in RAM. The kernel's
//! `free_swap_and_cache` and the uncharge of a zapped page.
//!
//! Locking: none of its own. The caller owns the pages it releases (their busy bits, or the
//! region is out of the registry); slots are freed through the swap devices' per-CPU
//! batches.

use std::sync::atomic::Ordering;

use std::sync::atomic::AtomicUsize;

use crate::async_readahead::AsyncRa;
use crate::page_table::{PageState, Pte};
use crate::reclaim;
use crate::region::{RegionInner, REGIONS};
use crate::state::charge::Charge;
use crate::state::{PagerShared, Parent};
use crate::swap::{SwapCache, SwapDevices};
use crate::uffd::{Uffd, PAGE_SIZE};

/// Release's context: what a page can hold besides its mapping (the devices' slots, the
/// swap cache's staging pages, the charge and the clean-page count, the parent's slots in a
/// fork child, the page's asynchronous readahead listings) and the regions' descriptor, to
/// unregister a region's ranges. Built by [`PagerShared::release_cx`].
#[derive(Clone, Copy)]
pub(crate) struct Release<'a> {
    uffd: &'a Uffd,
    charge: &'a Charge,
    parent: &'a Parent,
    clean_pages: &'a AtomicUsize,
    devices: &'a SwapDevices,
    swap_cache: &'a SwapCache,
    async_ra: AsyncRa<'a>,
}

impl PagerShared {
    /// Release's context (see [`Release`]).
    pub(crate) fn release_cx(&self) -> Release<'_> {
        Release {
            uffd: &self.uffd,
            charge: &self.charge,
            parent: &self.parent,
            clean_pages: &self.clean_pages,
            devices: &self.devices,
            swap_cache: &self.swap_cache,
            async_ra: self.async_ra_cx(),
        }
    }
}

/// What [`Release::release_page`] gave back, for [`Release::apply_released`] to
/// settle in one go: the slots to free and the counts to drop.
#[derive(Default)]
pub(crate) struct Released {
    to_free: Vec<u64>,
    uncharge: usize,
    uncache: usize,
    unclean: usize,
}

impl Release<'_> {
    /// Lets go of what page `pte` holds besides its mapping (the caller owns the page, or
    /// the page can no longer be reached): the slot of a clean, staged or swapped page, the
    /// staging page of a staged one, and its charge if it is in RAM.
    pub fn release_page(&self, pte: Pte, rel: &mut Released) {
        match pte.state() {
            PageState::Resident => {
                rel.uncharge += 1;
                if pte.clean() {
                    rel.unclean += 1;
                    let e = pte.entry();
                    self.devices.device(e).forget_slot(e.offset());
                    rel.to_free.push(e.bits());
                }
            }
            PageState::Cached => {
                let e = pte.entry();
                self.devices.device(e).release_staged(e.offset());
                rel.to_free.push(e.bits());
                rel.uncharge += 1;
                rel.uncache += 1;
            }
            PageState::Swapped => {
                let e = pte.entry();
                self.devices.device(e).forget_slot(e.offset());
                rel.to_free.push(e.bits());
            }
            // A page still in the parent's device holds nothing of ours, but the parent
            // keeps its slot while we may read it (a shared device, `swap::fork_refs`).
            PageState::Parent => self.release_parent_slot(pte.entry()),
            // An inherited page is the parent's charge, not ours.
            PageState::None | PageState::Zero | PageState::Gone | PageState::Shared => {}
        }
    }

    /// In a fork child: lets the parent reuse the slot of a page that was out at the fork
    /// (`PageState::Parent`), now read or dropped. Lock- and allocation-free.
    pub fn release_parent_slot(&self, entry: crate::swap::SwapEntry) {
        if let Some(devices) = self.parent.devices() {
            devices.device(entry).fork_refs.release_own(entry.offset());
        }
    }

    /// Settles what [`Release::release_page`] collected: counters, then slot frees.
    pub fn apply_released(&self, mut rel: Released) {
        self.clean_pages.fetch_sub(rel.unclean, Ordering::Relaxed);
        self.swap_cache.uncount(rel.uncache);
        reclaim::shared_sub(self.charge, rel.uncharge);
        self.charge.resident_pages.fetch_sub(rel.uncharge, Ordering::AcqRel);
        self.devices.free_now(&mut rel.to_free);
        self.devices.flush_frees();
    }

    /// Releases everything a region holds. Called by `Region::drop` before it unmaps.
    pub fn unmap_region(&self, reg_idx: usize, inner: &RegionInner) {
        for (addr, len) in self.release_region(reg_idx, inner) {
            crate::mapping::unmap_app_range(addr, len);
        }
    }

    /// As [`unmap_region`](Self::unmap_region), but the runs of pages still the region's
    /// are left mapped (unregistered: ordinary memory) and returned, `(address, bytes)`, for
    /// the caller to unmap.
    pub fn release_region(&self, reg_idx: usize, inner: &RegionInner) -> Vec<(usize, usize)> {
        // After this no fault handler or reclaimer can reach the region, and none is inside
        // it: every busy bit has been released.
        let _ = REGIONS.remove(reg_idx);
        self.async_ra.forget_region(reg_idx);
        let mut released = Released::default();
        // Runs of pages still the region's: only those are unregistered and unmapped (a
        // range the application unmapped may hold another mapping by now).
        let live = inner.live_runs();
        // Pages past the touched part own nothing (`RegionInner::note_touched`), and their
        // words, never written, need not be read (a reservation of 1 TiB has 2 GiB of them).
        for page in 0..inner.touched_end() {
            let pte = inner.load(page);
            debug_assert!(!pte.busy(), "page {page} still busy after the region left the registry");
            self.release_page(pte, &mut released);
        }
        self.apply_released(released);
        let mut ranges = Vec::with_capacity(live.len());
        for (first, end) in live {
            let (addr, len) = (inner.page_addr(first), (end - first) * PAGE_SIZE);
            // Unregistered first: the engine's own munmap must send no UNMAP event (its
            // thread would wait for the event to be read, and it is not the application's).
            let _ = self.uffd.unregister(addr, len);
            // No event will say these addresses left: their fork advice goes now, or it
            // would fill the table (and stay for a later mapping there).
            crate::fork_advice::forget(addr, addr + len);
            ranges.push((addr, len));
        }
        ranges
    }
}
