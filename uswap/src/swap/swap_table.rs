//! The swap table of one device: a table per cluster, indexed by slot, saying which page owns
//! the slot and whether its contents are staged in RAM (in the swap cache, see
//! [`super::SwapCache`]).
//!
//! This is the kernel's per-cluster swap table (2025), which replaced the swap cache radix
//! tree that had been split into 64 MB trunks (2016) to cut lock contention. Here a staged
//! page lives at a fixed address derived from its swap entry (the device's staging area,
//! slot `n` at `n * PAGE_SIZE`), so "finding a page by swap entry" is arithmetic and the table
//! only needs to record presence and the reverse map (slot → owning page), which cluster
//! readahead uses.
//!
//! Each slot whose page is out of its region (staged, or on the device) is also stamped with
//! the epoch the page left in, and counted by it in [`IdleAges`]: the idle-age histogram
//! (see `super::idle_ages`). Freeing the slot takes the stamp away.
//!
//! Locking: none; every entry is an atomic word. An entry is written only by the thread that
//! owns the slot (it allocated it, or holds the owning page's busy bit), so plain stores
//! suffice; lookups from other threads are racy hints that callers re-validate against the
//! page table.

use std::sync::atomic::{AtomicU64, Ordering};

use super::cluster_allocator::SWAPFILE_CLUSTER;
use super::idle_ages::{IdleAges, Stamp};
use crate::mapping::AtomicTable;

/// Bit of an entry meaning "contents staged in RAM" (`SWAP_HAS_CACHE`).
const HAS_CACHE: u64 = 1 << 63;
/// Bits of the opaque owner value.
pub const OWNER_BITS: u32 = 62;

/// One word per slot, cluster after cluster (`SWAPFILE_CLUSTER` words per cluster), in a
/// mapping that reads as zero until used: a device sized for tens of GiB costs memory only
/// for the clusters it has used (one boxed table per cluster, written at start-up, cost a
/// 48 GiB pool 100 MB and 50 ms in every process).
pub struct SwapTable {
    slots: AtomicTable,
    /// Each slot's page's [`Stamp`] (packed; 0: none), lazily zero as `slots`.
    stamps: AtomicTable,
    /// The stamps, counted by epoch.
    pub ages: IdleAges,
}

/// What the table says about a slot.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SlotInfo {
    /// Opaque owner (the region layer's reverse-map value); never 0 for an owned slot.
    pub owner: u64,
    /// Contents staged in RAM (in the swap cache).
    pub cached: bool,
}

impl SwapTable {
    pub fn new(nr_clusters: u32) -> std::io::Result<SwapTable> {
        let nr_slots = nr_clusters as usize * SWAPFILE_CLUSTER;
        Ok(SwapTable { slots: AtomicTable::new(nr_slots)?, stamps: AtomicTable::new(nr_slots)?, ages: IdleAges::new() })
    }

    #[inline]
    fn slot(&self, offset: u64) -> &AtomicU64 {
        &self.slots[offset as usize]
    }

    /// Records the owner of a freshly allocated slot (not cached yet).
    pub fn set_owner(&self, offset: u64, owner: u64) {
        debug_assert!(owner != 0 && owner < 1 << OWNER_BITS);
        self.slot(offset).store(owner, Ordering::Release);
    }

    pub fn set_cached(&self, offset: u64, cached: bool) {
        let s = self.slot(offset);
        if cached {
            s.fetch_or(HAS_CACHE, Ordering::AcqRel);
        } else {
            s.fetch_and(!HAS_CACHE, Ordering::AcqRel);
        }
    }

    /// Forgets a slot that is being freed.
    pub fn clear(&self, offset: u64) {
        self.unstamp(offset);
        self.slot(offset).store(0, Ordering::Release);
    }

    /// The slot's page left its region as `s` says (replaces any earlier stamp).
    pub fn stamp(&self, offset: u64, s: Stamp) {
        let old = self.stamps[offset as usize].swap(s.pack(), Ordering::AcqRel);
        if let Some(old) = Stamp::unpack(old) {
            self.ages.remove(old.epoch);
        }
        self.ages.add(s.epoch);
    }

    /// The slot's page is in its region again (or the slot goes): no longer idle.
    pub fn unstamp(&self, offset: u64) {
        let old = self.stamps[offset as usize].swap(0, Ordering::AcqRel);
        if let Some(old) = Stamp::unpack(old) {
            self.ages.remove(old.epoch);
        }
    }

    /// How the slot's page left its region, if it is out.
    pub fn stamp_of(&self, offset: u64) -> Option<Stamp> {
        Stamp::unpack(self.stamps[offset as usize].load(Ordering::Acquire))
    }

    pub fn lookup(&self, offset: u64) -> Option<SlotInfo> {
        let v = self.slot(offset).load(Ordering::Acquire);
        (v != 0).then_some(SlotInfo { owner: v & !HAS_CACHE, cached: v & HAS_CACHE != 0 })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_owner_and_presence() {
        let c = SwapTable::new(2).unwrap();
        assert_eq!(c.lookup(700), None);
        c.set_owner(700, 42);
        assert_eq!(c.lookup(700), Some(SlotInfo { owner: 42, cached: false }));
        c.set_cached(700, true);
        assert_eq!(c.lookup(700), Some(SlotInfo { owner: 42, cached: true }));
        c.set_cached(700, false);
        assert_eq!(c.lookup(700).map(|i| i.cached), Some(false));
        c.clear(700);
        assert_eq!(c.lookup(700), None);
    }

    #[test]
    fn stamps_are_counted_until_their_slot_goes() {
        let c = SwapTable::new(2).unwrap();
        let now = super::super::idle_ages::now_epoch();
        c.set_owner(5, 1);
        c.stamp(5, Stamp::new(now - 100, u32::MAX));
        c.set_owner(6, 2);
        c.stamp(6, Stamp::new(now, 7));
        assert_eq!(c.stamp_of(5), Some(Stamp { epoch: now - 100, eviction: u32::MAX }));
        assert_eq!(c.stamp_of(6).map(|s| s.eviction), Some(7));
        assert_eq!(c.ages.histogram(now), [1, 1, 0, 0]);
        // Stamped again (moved to another tier and back): counted once, by the new stamp.
        c.stamp(5, Stamp::new(now - 50, 3));
        assert_eq!(c.ages.total(), 2);
        c.unstamp(6);
        assert_eq!(c.stamp_of(6), None);
        c.clear(5);
        c.clear(6);
        assert_eq!(c.ages.total(), 0);
    }
}
