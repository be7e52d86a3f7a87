//! The swap cache: application pages staged in RAM between their region and their device.
//!
//! Reclaim moves a page out of its region (`UFFDIO_MOVE`, no copy) into the staging page of
//! a freshly allocated slot (slot `n` of a device at `staging + n * PAGE_SIZE`), where it
//! waits, still charged, until reclaim writes it back; a fault on it meanwhile moves it
//! straight back (a swap-cache hit). [`SwapCache`] is what the pager knows of its staged
//! pages as a whole: how many there are, the queue they wait on for writeback (oldest
//! first), and the descriptor every staging area is registered with. What each slot holds
//! (its owner, whether it is staged) stays in its device's [`super::SwapTable`], and each staging
//! area stays with its device: both are sized and indexed by the device's slots.
//!
//! Why the staging areas have a descriptor of their own, which asks for no events: the
//! engine discards staging pages all the time, and on the regions' descriptor each discard
//! would be a REMOVE event that blocks the discarding thread until it is read (see
//! `events`). `UFFDIO_MOVE` needs only its destination registered with the descriptor it is
//! issued on: moves out go through this one, moves back through the regions'.
//!
//! Locking: none; the count is an atomic and the queue lock-free. Invariants: a page is
//! counted from the moment its slot's table entry is marked staged ([`SwapCache::insert`])
//! until the mark goes (faulted back, written back, or released with its region); a counted
//! page's contents are at its entry's staging address. The queue may also hold stale
//! entries (pages that left since), which whoever pops them recognises by generation.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

use super::SwapDevice;
use crate::fifo::Fifo;
use crate::mapping::page_present;
use crate::uffd::{RangeResult, Uffd, PAGE_SIZE};

pub struct SwapCache {
    /// The staging areas' descriptor (no events).
    uffd: Uffd,
    /// Staged pages waiting for writeback, oldest first (packed page references).
    inactive: Fifo,
    /// Pages staged, over every device.
    nr_pages: AtomicUsize,
    /// See [`SwapCache::foreign_drops`].
    foreign_drops: AtomicU64,
}

/// How staging areas are registered with the swap cache's descriptor: for write-protect
/// faults only (none comes: moves drop the write-protect bit). `UFFDIO_MOVE` needs its
/// destination registered with the descriptor it is issued on, in any mode, and a
/// registration needs one. Not for missing faults: then a read of an empty staging page by
/// the program (one that reads every readable mapping it has) was a SIGBUS that killed it;
/// now it maps the kernel's zero page, as a read of never-written memory does, and
/// [`SwapCache::move_in`] drops it. An engine read of an empty staging page would see zeros
/// too, rather than fail: debug builds check every page staged (`SwapDevice::staged_page_is_zero`).
pub const STAGING_REGISTER_MODE: u64 = crate::uffd::REGISTER_MODE_WP;

/// Drops of staging pages the program mapped, per [`SwapCache::move_in`], before it gives up
/// (the pages stay in their region): a program that keeps reading the same staging pages
/// while reclaim moves into them.
const MOVE_IN_DROPS: u32 = 4;

impl SwapCache {
    /// An empty swap cache whose staging areas are (or will be) registered with `uffd`.
    pub fn new(uffd: Uffd, inactive: Fifo) -> SwapCache {
        SwapCache { uffd, inactive, nr_pages: AtomicUsize::new(0), foreign_drops: AtomicU64::new(0) }
    }

    /// Moves `len_bytes` of a region at `src` into the staging pages of `dev` from slot
    /// `offset` on, through the staging descriptor (the destination is registered there),
    /// the staging area opened there first. A move stays within one of the area's windows:
    /// windows opened apart may stay apart as mappings (each has its own `anon_vma` once
    /// used), and `UFFDIO_MOVE` needs its destination in one mapping.
    pub fn move_in(&self, dev: &SwapDevice, offset: u64, src: usize, len_bytes: usize) -> RangeResult {
        let mut done_bytes = 0;
        // Bounded: each round moves a window's piece of the run or returns.
        while done_bytes < len_bytes {
            let slot = offset + (done_bytes / PAGE_SIZE) as u64;
            let piece = dev.staging_window_room(slot).min(len_bytes - done_bytes);
            match self.move_piece(dev, slot, src + done_bytes, piece) {
                RangeResult::Done => done_bytes += piece,
                RangeResult::Partial { done_bytes: d, errno } => {
                    return RangeResult::Partial { done_bytes: done_bytes + d, errno }
                }
            }
        }
        RangeResult::Done
    }

    /// [`SwapCache::move_in`] within one window. Staging pages the program mapped by
    /// reading them (the kernel's zero page, see [`STAGING_REGISTER_MODE`]) make the move
    /// fail with `EEXIST`: they are dropped, counted, and the move goes on, [`MOVE_IN_DROPS`]
    /// times at most. The slots are the caller's and hold no staged page. Only while the
    /// page the move stopped at is still at its source: a page the move put at the
    /// destination (reported as failed, Linux 6.18) must not be dropped, and is never taken
    /// for the program's (`Uffd::move_pages` tells them apart where it can).
    fn move_piece(&self, dev: &SwapDevice, offset: u64, src: usize, len_bytes: usize) -> RangeResult {
        let nr_pages = len_bytes / PAGE_SIZE;
        if let Err(e) = dev.open_staging(offset, nr_pages) {
            // Refused like a move into a mapping of another protection: the pages stay in.
            return RangeResult::Partial { done_bytes: 0, errno: e.raw_os_error().unwrap_or(libc::ENOMEM) };
        }
        let (dst, mut done_bytes, mut drops) = (dev.staging_addr(offset), 0, 0);
        // Bounded: a round that does not return drops once, at most `MOVE_IN_DROPS` times.
        loop {
            let r = self.uffd.move_pages(dst + done_bytes, src + done_bytes, len_bytes - done_bytes, false);
            let RangeResult::Partial { done_bytes: d, errno } = r else { return RangeResult::Done };
            done_bytes += d;
            if errno != libc::EEXIST || drops == MOVE_IN_DROPS || !page_present(src + done_bytes) {
                return RangeResult::Partial { done_bytes, errno };
            }
            // The rest of the piece at once: a program reading the area maps page after page.
            let first = offset + (done_bytes / PAGE_SIZE) as u64;
            dev.drop_foreign_staging_pages(first, nr_pages - done_bytes / PAGE_SIZE);
            self.foreign_drops.fetch_add(1, Ordering::Relaxed);
            drops += 1;
        }
    }

    /// Times [`SwapCache::move_in`] found staging pages the program had mapped.
    pub fn foreign_drops(&self) -> u64 {
        self.foreign_drops.load(Ordering::Relaxed)
    }

    /// Pages staged right now.
    pub fn nr_pages(&self) -> usize {
        self.nr_pages.load(Ordering::Acquire)
    }

    /// The page just moved into the staging page of slot `offset` of `dev` is staged: marks
    /// its slot, stamps it with the moment it left its region (see `super::idle_ages`) and
    /// the eviction clock's reading `eviction` (`crate::lru`), and counts it. The caller
    /// queues it with [`SwapCache::push`] once its page table word says so (a reclaimer
    /// popping it earlier would take it for stale).
    pub fn insert(&self, dev: &SwapDevice, offset: u64, eviction: u32) {
        debug_assert_eq!(dev.table.lookup(offset).map(|i| i.cached), Some(false));
        dev.table.set_cached(offset, true);
        dev.table.stamp(offset, super::idle_ages::Stamp::new(super::idle_ages::now_epoch(), eviction));
        self.nr_pages.fetch_add(1, Ordering::AcqRel);
    }

    /// The staged page of slot `offset` of `dev` went back to its region (a swap-cache hit):
    /// unmarks and uncounts it. The caller frees the slot.
    pub fn remove(&self, dev: &SwapDevice, offset: u64) {
        dev.table.set_cached(offset, false);
        self.nr_pages.fetch_sub(1, Ordering::AcqRel);
    }

    /// `n` staged pages left by another way (written back, or released with their region),
    /// their slots' marks already cleared.
    pub fn uncount(&self, n: usize) {
        self.nr_pages.fetch_sub(n, Ordering::AcqRel);
    }

    /// Queues a staged page (packed page reference) for writeback; gives it back if the queue
    /// is full.
    pub fn push(&self, page: u64) -> Result<(), u64> {
        self.inactive.push(page)
    }

    /// The oldest queued page, if any.
    pub fn pop(&self) -> Option<u64> {
        self.inactive.pop()
    }

    /// The oldest staged page, left queued (a hint: another thread may pop it first).
    pub fn peek(&self) -> Option<u64> {
        self.inactive.peek()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::ram::RamBackend;
    use crate::mapping::{MapOptions, Mapping};
    use crate::swap::{DeviceSpec, ReadaheadPolicy, SwapDevices, SwapEntry};
    use crate::uffd::{FEATURE_MOVE, FEATURE_SIGBUS, PAGE_SIZE, REGISTER_MODE_MISSING, REGISTER_MODE_WP};

    /// A page moved in lies at its slot's staging address, where the program may have read
    /// before (a zero page, dropped); staging marks its slot and counts it; a swap-cache hit
    /// or an uncount takes it out of the count again; the queue gives back what was pushed,
    /// oldest first.
    #[test]
    fn staged_pages_are_where_their_slot_says_marked_and_counted() {
        let spec = DeviceSpec {
            priority: 0,
            backend: Box::new(RamBackend::new(1024).unwrap()),
            checksum: false,
            readahead: ReadaheadPolicy::Vma,
            clean_readahead: false,
            tree_share: None,
        };
        let devices = SwapDevices::new(vec![spec], 1).unwrap();
        let dev = &devices.devices()[0];
        let uffd = Uffd::open(FEATURE_MOVE | FEATURE_SIGBUS, true, true)
            .expect("userfaultfd with UFFD_FEATURE_MOVE")
            .with_zero_page_destinations();
        uffd.register(dev.staging.addr(), dev.staging.len(), STAGING_REGISTER_MODE).unwrap();
        let src = Mapping::anonymous(2 * PAGE_SIZE, MapOptions { no_huge_pages: true, dont_fork: true }).unwrap();
        // SAFETY: both pages of `src` are ours and not registered yet, so writing them is plain.
        unsafe {
            std::ptr::write_bytes(src.addr() as *mut u8, 0xa5, PAGE_SIZE);
            std::ptr::write_bytes((src.addr() + PAGE_SIZE) as *mut u8, 0x5a, PAGE_SIZE);
        }
        uffd.register(src.addr(), src.len(), REGISTER_MODE_MISSING | REGISTER_MODE_WP).unwrap();
        let cache = SwapCache::new(uffd, Fifo::new(64).unwrap());

        let mut e = [SwapEntry::new(0, 0); 2];
        assert_eq!(devices.alloc(&mut e), 2);
        assert_eq!(e[1].offset(), e[0].offset() + 1, "a fresh device hands out consecutive slots");
        // A program that reads the (opened) staging page of the second slot maps the zero
        // page there; the move drops it and goes on.
        dev.open_staging(e[0].offset(), 2).unwrap();
        let mut read = [0xffu8; PAGE_SIZE];
        dev.staging.read(e[1].offset() as usize * PAGE_SIZE, &mut read);
        assert!(read.iter().all(|&b| b == 0) && crate::mapping::page_present(dev.staging_addr(e[1].offset())));
        assert_eq!(cache.move_in(dev, e[0].offset(), src.addr(), 2 * PAGE_SIZE), RangeResult::Done);
        assert_eq!(cache.foreign_drops(), 1);
        for (k, (e, byte)) in e.iter().zip([0xa5u8, 0x5a]).enumerate() {
            dev.table.set_owner(e.offset(), 40 + k as u64);
            cache.insert(dev, e.offset(), 0);
            assert_eq!(dev.table.lookup(e.offset()).map(|i| (i.owner, i.cached)), Some((40 + k as u64, true)));
            let mut staged = [0u8; PAGE_SIZE];
            dev.staging.read(e.offset() as usize * PAGE_SIZE, &mut staged);
            assert!(staged.iter().all(|&b| b == byte), "slot {} holds its page", e.offset());
            assert!(!crate::mapping::page_present(src.addr() + k * PAGE_SIZE), "moved, not copied");
            cache.push(100 + k as u64).unwrap();
        }
        assert_eq!(cache.nr_pages(), 2);
        assert_eq!((cache.pop(), cache.pop(), cache.pop()), (Some(100), Some(101), None));

        cache.remove(dev, e[0].offset());
        assert_eq!(dev.table.lookup(e[0].offset()).map(|i| i.cached), Some(false));
        assert_eq!(cache.nr_pages(), 1);
        dev.table.clear(e[1].offset());
        cache.uncount(1);
        assert_eq!(cache.nr_pages(), 0);
    }
}
