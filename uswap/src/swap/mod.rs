//! Swap devices: entries, priorities, the cluster allocator, the swap table and the staging
//! area, the swap cache, and batched slot frees.
//!
//! A pager has one or more devices, ordered by priority (highest first). Allocation tries
//! each priority group in turn; inside a group the devices take turns, one allocation batch
//! each (swapon(2) priorities, round robin among equals). Each device has:
//!
//! * a [`Backend`] that stores page contents;
//! * a [`ClusterAllocator`] for its slots;
//! * a [`SwapTable`] (owner and "staged" bit per slot);
//! * a staging area: an engine-only mapping registered with the swap cache's userfaultfd (for
//!   write-protect faults only: [`STAGING_REGISTER_MODE`]), one page per slot, opened in
//!   windows as its slots come into use (`mapping::Reservation`). `UFFDIO_MOVE` only moves
//!   into an area registered with the descriptor it is issued on, so reclaim moves a victim
//!   to `staging + slot * PAGE_SIZE`, and a fault on a staged page moves it straight back.
//!
//! The [`SwapCache`] is the pager's view of the pages staged on all its devices: their
//! count, the queue they wait on for writeback, and the staging areas' descriptor.
//!
//! Frees are batched per CPU (the free half of the kernel's old swap slot cache) and flushed
//! sorted, so a batch takes each cluster lock once. The signal-mode fault path, when its
//! thread already holds an engine lock, frees through a lock-free queue instead, drained by
//! the next flush.
//!
//! Locking: a per-CPU free-batch lock is never held while taking another lock (the batch is
//! copied out first). Allocator locks: see `cluster_allocator`; the whole hierarchy:
//! `crate::sync`.

pub mod cluster_allocator;
pub mod entry;
pub mod fork_refs;
pub mod health;
pub mod idle_ages;
pub mod swap_cache;
pub mod swap_table;

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};

use crossbeam_queue::ArrayQueue;
use crossbeam_utils::CachePadded;

pub use cluster_allocator::{ClusterAllocator, ClusterCounts, SWAPFILE_CLUSTER};
pub use entry::{SwapEntry, MAX_DEVICES};
pub use fork_refs::{ForkRecord, ForkRefs};
pub use health::Health;
pub use swap_cache::{SwapCache, STAGING_REGISTER_MODE};
pub use swap_table::{SlotInfo, SwapTable};

use crate::backend::Backend;
use crate::mapping::{
    current_cpu, mincore_bitmap, page_present, AtomicTable, DiscardBatch, MapOptions, PageRun, Reservation,
    WINDOW_BYTES,
};
use crate::readahead::FaultStreams;
use crate::shared_charge::DeviceShare;
use crate::sync::{LockClass, SpinLock};
use crate::uffd::{page_is_own, PAGE_SIZE};

/// Frees collected per CPU before the allocator is touched.
pub const FREE_BATCH: usize = 64;
/// Room for frees made on the lock-free route between two flushes.
const DEFERRED_FREES: usize = 4096;

/// How a device chooses the pages to read ahead with a faulting one.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ReadaheadPolicy {
    /// Neighbouring pages of the faulting address, per region (the kernel's VMA readahead,
    /// 2017): follows the application's access pattern. The default.
    #[default]
    Vma,
    /// Neighbouring slots on the device, whichever pages own them (the kernel's policy before
    /// 2017): for rotating or high-latency devices, where one large read beats many small
    /// ones and slot order follows eviction order.
    Cluster,
}

/// What a pager gives the swap layer for one device.
pub struct DeviceSpec {
    pub priority: i32,
    pub backend: Box<dyn Backend>,
    /// Keep and check a crc32c per page.
    pub checksum: bool,
    pub readahead: ReadaheadPolicy,
    /// Map read-ahead pages clean (write-protected, keeping their slot).
    pub clean_readahead: bool,
    /// The tree this device's size is shared with (`uswap run`), if any.
    pub tree_share: Option<DeviceShare>,
}

/// One swap device: its backend, the allocator of its slots, the swap table (each slot's
/// owner and staged bit) and the staging area (slot `n`'s page at `staging + n * PAGE_SIZE`).
/// The table and the staging area change only through the verbs below, which check their
/// preconditions (debug builds), as the kernel's `add_to_swap_cache` does.
pub struct SwapDevice {
    pub index: usize,
    pub priority: i32,
    pub backend: Box<dyn Backend>,
    allocator: ClusterAllocator,
    /// Owner and "staged" bit of each slot.
    table: SwapTable,
    /// Opened as slots come into use (a program reading every readable mapping read all of
    /// it otherwise; see `mapping::Reservation`).
    staging: Reservation,
    /// crc32c of each slot's page (low 32 bits), when checksums are on.
    checksums: Option<AtomicTable>,
    pub readahead: ReadaheadPolicy,
    /// Read-ahead pages come in clean (see `swapin::keep_clean`).
    pub clean_readahead: bool,
    /// Streams over slot numbers, for cluster readahead.
    pub cluster_streams: FaultStreams,
    /// Slots fork children still read, for a device they share (see `fork_refs`).
    pub fork_refs: ForkRefs,
    /// Whether its writes fail now (see `health`).
    pub health: Health,
}

impl Drop for SwapDevice {
    fn drop(&mut self) {
        // A child reading the parent's slots where they are outlives the parent's pager.
        if self.fork_refs.children_may_read() {
            self.backend.outlived_by_children();
        }
    }
}

impl SwapDevice {
    /// Returns slots no page needs any more to the allocator. The device drops what it keeps
    /// for each (`Backend::invalidate`) before the slot can be reused.
    fn give_back(&self, offsets: &[u64]) {
        for &o in offsets {
            self.backend.invalidate(o);
        }
        self.allocator.free(offsets);
    }

    fn new(index: usize, spec: DeviceSpec, nr_cpus: usize) -> std::io::Result<SwapDevice> {
        let DeviceSpec { priority, backend, checksum, readahead, clean_readahead, tree_share } = spec;
        let nr_clusters = (backend.nr_slots() / SWAPFILE_CLUSTER as u64) as u32;
        let staging = Reservation::new(
            nr_clusters as usize * SWAPFILE_CLUSTER * PAGE_SIZE,
            MapOptions { no_huge_pages: true, dont_fork: true },
        )?;
        Ok(SwapDevice {
            index,
            priority,
            allocator: ClusterAllocator::new(nr_clusters, nr_cpus)?.with_share(tree_share),
            table: SwapTable::new(nr_clusters)?,
            checksums: if checksum { Some(AtomicTable::new(nr_clusters as usize * SWAPFILE_CLUSTER)?) } else { None },
            staging,
            readahead,
            clean_readahead,
            cluster_streams: FaultStreams::new(),
            fork_refs: ForkRefs::new(nr_clusters as u64 * SWAPFILE_CLUSTER as u64),
            health: Health::new(&backend.name()),
            backend,
        })
    }

    /// Records the checksum of the page written to `offset`.
    pub fn set_checksum(&self, offset: u64, crc: u32) {
        if let Some(t) = &self.checksums {
            t[offset as usize].store(crc as u64, Ordering::Relaxed);
        }
    }

    /// Whether a fork child gets a copy of what reading this device's pages needs (its
    /// backend's memory and the checksums): see `Backend::set_inherited`.
    pub fn set_inherited(&self, inherit: bool) {
        self.backend.set_inherited(inherit);
        if let Some(t) = &self.checksums {
            t.set_inherited(inherit);
        }
    }

    /// True if `page` matches the checksum recorded for `offset` (or checksums are off).
    pub fn checksum_ok(&self, offset: u64, page: &[u8]) -> bool {
        match &self.checksums {
            Some(t) => t[offset as usize].load(Ordering::Relaxed) as u32 == crc32c::crc32c(page),
            None => true,
        }
    }

    pub fn nr_slots(&self) -> u64 {
        self.allocator.nr_slots()
    }

    /// Whether new pages may go to the device: it accepts them (a pool below its cap) and
    /// its writes do not fail (see `health`).
    #[inline]
    pub fn takes_pages(&self) -> bool {
        self.backend.accepting() && !self.health.is_degraded()
    }

    /// Writes one page of zeros to a free slot of this degraded device, if its probe is due,
    /// and frees the slot again (see `health`). Returns whether the device recovered.
    /// Engine threads only: the write may take as long as the device's timeouts.
    fn probe(&self) -> bool {
        if !self.health.claim_probe() {
            return false;
        }
        if let Err(e) = self.backend.writable() {
            self.health.note_write(&Err(e));
            return false;
        }
        let mut offset = [0u64; 1];
        if self.allocator.alloc(current_cpu(), &mut offset, &|ci| self.discard_cluster(ci)) == 0 {
            return false; // every slot holds a page: nothing to probe with, nothing to free
        }
        let zeros = [crate::backend::AlignedPage([0; PAGE_SIZE])];
        let mut req = [crate::backend::WriteReq::new(offset[0], PageRun::from_pages(&zeros))];
        self.backend.write(&mut req);
        self.health.note_write(&req[0].result);
        self.give_back(&offset);
        !self.health.is_degraded()
    }

    /// Address of the staging page of slot `offset`.
    pub fn staging_addr(&self, offset: u64) -> usize {
        self.staging.addr() + offset as usize * PAGE_SIZE
    }

    // --- The swap table: what each slot holds.

    /// The owner of the page slot `slot` holds and whether it is staged; `None` when free.
    pub fn slot_info(&self, slot: u64) -> Option<SlotInfo> {
        self.table.lookup(slot)
    }

    /// A freshly allocated slot now holds the page of `owner` (`PageRef::owner`), not staged
    /// yet: the reverse map readahead and writeback use.
    pub fn set_owner(&self, slot: u64, owner: u64) {
        debug_assert_eq!(self.table.lookup(slot), None, "slot {slot} is taken");
        self.table.set_owner(slot, owner);
    }

    /// The page of slot `slot` left its region as `s` says (see `idle_ages`).
    pub fn stamp(&self, slot: u64, s: idle_ages::Stamp) {
        self.table.stamp(slot, s);
    }

    /// The page of slot `slot` is mapped again, keeping its slot (a clean page).
    pub fn unstamp(&self, slot: u64) {
        self.table.unstamp(slot);
    }

    /// When the page of slot `slot` left its region, if it is out.
    pub fn stamp_of(&self, slot: u64) -> Option<idle_ages::Stamp> {
        self.table.stamp_of(slot)
    }

    /// Pages of this device untouched for at least each of `idle_ages::IDLE_BUCKETS_S`.
    pub fn idle_histogram(&self, now: idle_ages::Epoch) -> [u64; 4] {
        self.table.ages.histogram(now)
    }

    /// Keeps the idle-age ring from wrapping (see `idle_ages`): the background reclaimer,
    /// often (cheap when there is nothing to fold).
    pub fn fold_idle_ages(&self, now: idle_ages::Epoch) {
        self.table.ages.fold(now);
    }

    /// Slot `slot` no longer holds a page (the caller frees it, or has moved its page to
    /// another slot).
    pub fn forget_slot(&self, slot: u64) {
        self.table.clear(slot);
    }

    /// The page staged at `slot` was written to that slot: it is no longer staged (the
    /// caller has discarded its staging page).
    pub fn complete_writeback(&self, slot: u64) {
        debug_assert_eq!(self.table.lookup(slot).map(|i| i.cached), Some(true), "slot {slot} was not staged");
        self.table.set_cached(slot, false);
    }

    // --- The staging area: pages on their way to the device.

    /// The staging area's address range, `(addr, len_bytes)`.
    pub fn staging_range(&self) -> (usize, usize) {
        (self.staging.addr(), self.staging.len())
    }

    /// Bytes of the staging area from slot `slot`'s page to the end of its window (see
    /// `mapping::Reservation`).
    pub fn staging_window_room(&self, slot: u64) -> usize {
        let at = slot as usize * PAGE_SIZE;
        (at / WINDOW_BYTES + 1) * WINDOW_BYTES - at
    }

    /// Opens the staging pages of slots `[slot, slot + nr_pages)` for moves (see
    /// `mapping::Reservation`). Async-signal-safe.
    pub fn open_staging(&self, slot: u64, nr_pages: usize) -> std::io::Result<()> {
        self.staging.open(slot as usize * PAGE_SIZE, nr_pages * PAGE_SIZE)
    }

    /// Drops whatever the program mapped in the staging pages of slots `[slot, slot +
    /// nr_pages)`, which this thread holds and which hold no staged page: the kernel's zero
    /// page, where the program read the staging area (see [`STAGING_REGISTER_MODE`]).
    pub fn drop_foreign_staging_pages(&self, slot: u64, nr_pages: usize) {
        debug_assert!(
            (slot..slot + nr_pages as u64).all(|s| self.table.lookup(s).is_none_or(|i| !i.cached)),
            "a staged page among slots {slot}+{nr_pages} taken for the program's"
        );
        let _ = self.staging.discard(slot as usize * PAGE_SIZE, nr_pages * PAGE_SIZE);
    }

    /// Which pages of the staging area are in RAM (`mincore`; see [`mincore_bitmap`]) and
    /// hold a staged page (not the kernel's zero page a program's read left there).
    pub fn staging_resident_bitmap(&self) -> std::io::Result<Vec<u64>> {
        let mut bits = mincore_bitmap(self.staging.addr(), self.staging.len())?;
        for (w, word) in bits.iter_mut().enumerate() {
            let mut rest = *word;
            // Bounded: one round per set bit of the word.
            while rest != 0 {
                let b = rest.trailing_zeros() as u64;
                rest &= rest - 1;
                if self.table.lookup(w as u64 * 64 + b).is_none_or(|i| !i.cached) {
                    *word &= !(1 << b);
                }
            }
        }
        Ok(bits)
    }

    /// Whether the page staged at `slot` is all zero.
    ///
    /// Every page staged is looked at here first. An empty staging page reads as zeros (the
    /// read maps the kernel's zero page there: the area is not registered for missing
    /// faults, [`STAGING_REGISTER_MODE`]), so debug builds check before the read that the
    /// page is there: mapped (the kernel's zero page too, which a move of a region's zero
    /// page puts there), or swapped out by the system (`uffd::page_is_own`). A move that
    /// reported a page it did not put there would otherwise store zeros for it. Not release
    /// builds: a system call or more for each page reclaimed.
    pub fn staged_page_is_zero(&self, slot: u64) -> bool {
        let addr = self.staging_addr(slot);
        debug_assert!(
            page_present(addr) || page_is_own(addr) == Some(true),
            "uswap invariant: slot {slot} staged no page (its staging page is empty)"
        );
        self.staging.page_is_zero(slot as usize * PAGE_SIZE)
    }

    /// The crc32c of the page staged at `slot`.
    pub fn staged_page_crc32c(&self, slot: u64) -> u32 {
        self.staging.page_crc32c(slot as usize * PAGE_SIZE)
    }

    /// The `nr_pages` pages staged from `slot` on, as the source of a device write.
    pub fn staged_pages(&self, slot: u64, nr_pages: usize) -> PageRun<'_> {
        self.staging.pages(slot as usize * PAGE_SIZE, nr_pages)
    }

    /// Drops the staging page of `slot`: its contents were copied or moved elsewhere, or are
    /// no longer needed. Best effort: `MADV_DONTNEED` on the engine's own mapping cannot
    /// fail for a valid range.
    pub fn discard_staged(&self, slot: u64) {
        let _ = self.staging.discard(slot as usize * PAGE_SIZE, PAGE_SIZE);
    }

    /// Adds the staging pages `[slot, slot + nr_pages)` to a batch of discards (one TLB flush
    /// for the batch).
    pub fn discard_staged_later<const N: usize>(&self, batch: &mut DiscardBatch<N>, slot: u64, nr_pages: usize) {
        self.staging.discard_later(batch, slot as usize * PAGE_SIZE, nr_pages * PAGE_SIZE);
    }

    /// Releases the page staged at `slot` without writing it: its staging page dropped and
    /// the slot forgotten (the caller frees it). The staging page must be empty before the
    /// slot is reused.
    pub fn release_staged(&self, slot: u64) {
        self.discard_staged(slot);
        self.forget_slot(slot);
    }

    // --- The allocator.

    /// Clusters by list (free, nonfull, full, discarded).
    pub fn cluster_counts(&self) -> ClusterCounts {
        self.allocator.cluster_counts()
    }

    /// Clusters refused because the tree held the device's whole size.
    pub fn share_refusals(&self) -> u64 {
        self.allocator.share_refusals()
    }

    /// The first cluster at or after `ci` that may hold slots (one ever given out).
    pub fn used_cluster_from(&self, ci: u32) -> Option<u32> {
        self.allocator.used_cluster_from(ci)
    }

    /// Slots allocated now.
    pub fn inuse_slots(&self) -> u64 {
        self.allocator.inuse_slots()
    }

    /// Whether a page read back may keep its slot (come in clean): the device is under half
    /// full, the kernel's rule for keeping a swap-cache copy (`vm_swap_full`), and is no
    /// pool at its cap. A degraded device (its writes fail) keeps its copies: dropping clean
    /// pages is then the only way reclaim has to make room. A few atomic loads; any thread.
    #[inline]
    pub fn has_room_for_copies(&self) -> bool {
        self.backend.accepting() && self.inuse_slots().saturating_mul(2) < self.nr_slots()
    }

    /// Whether a crc32c is kept per slot.
    pub fn has_checksums(&self) -> bool {
        self.checksums.is_some()
    }

    fn discard_cluster(&self, ci: u32) {
        self.backend.discard(ci as u64 * SWAPFILE_CLUSTER as u64, SWAPFILE_CLUSTER as u64);
    }

    /// Runs pending cluster discards (called from the background reclaimer).
    pub fn run_discards(&self) -> usize {
        self.allocator.run_discards(&|ci| self.discard_cluster(ci))
    }
}

struct PriorityGroup {
    start: usize,
    end: usize,
    next: AtomicUsize,
}

struct FreeBatch {
    len: usize,
    entries: [u64; FREE_BATCH],
}

pub struct SwapDevices {
    devices: Vec<SwapDevice>,
    groups: Vec<PriorityGroup>,
    free_batches: Box<[CachePadded<SpinLock<FreeBatch>>]>,
    deferred: ArrayQueue<u64>,
    /// Frees dropped because the deferred queue was full (a slot leak, counted).
    deferred_overflow: AtomicU64,
    /// Set when an allocation came up short with every free batch flushed *and* no device
    /// it could use has a free slot left; cleared by the next free. Lets reclaim skip
    /// hopeless rounds, and a charge overrun at once, while the devices are full. (An
    /// allocation also comes up short while the free slots sit in clusters other CPUs hold
    /// or that wait for their discard: that is contention, not a full device.)
    full: AtomicBool,
}

impl SwapDevices {
    /// Builds devices from their specs, in any order.
    pub fn new(mut backends: Vec<DeviceSpec>, nr_cpus: usize) -> std::io::Result<SwapDevices> {
        assert!(!backends.is_empty() && backends.len() <= MAX_DEVICES);
        // Highest priority first; stable, so equal priorities keep their configured order.
        backends.sort_by_key(|d| std::cmp::Reverse(d.priority));
        let mut devices = Vec::with_capacity(backends.len());
        for (i, spec) in backends.into_iter().enumerate() {
            devices.push(SwapDevice::new(i, spec, nr_cpus)?);
        }
        let mut groups: Vec<PriorityGroup> = vec![];
        for (i, d) in devices.iter().enumerate() {
            match groups.last_mut() {
                Some(g) if devices[g.start].priority == d.priority => g.end = i + 1,
                _ => groups.push(PriorityGroup { start: i, end: i + 1, next: AtomicUsize::new(0) }),
            }
        }
        Ok(SwapDevices {
            devices,
            groups,
            free_batches: (0..nr_cpus.max(1))
                .map(|_| {
                    CachePadded::new(SpinLock::new(
                        LockClass::SwapFreeBatch,
                        FreeBatch { len: 0, entries: [0; FREE_BATCH] },
                    ))
                })
                .collect(),
            deferred: ArrayQueue::new(DEFERRED_FREES),
            deferred_overflow: AtomicU64::new(0),
            full: AtomicBool::new(false),
        })
    }

    pub fn devices(&self) -> &[SwapDevice] {
        &self.devices
    }

    #[inline]
    pub fn device(&self, entry: SwapEntry) -> &SwapDevice {
        &self.devices[entry.device()]
    }

    /// Allocates up to `out.len()` slots, highest priority first, equal priorities in turn.
    /// Returns how many were allocated (fewer only when every device is full, counting slots
    /// waiting in free batches as free).
    pub fn alloc(&self, out: &mut [SwapEntry]) -> usize {
        self.alloc_excluding_mask(0, out)
    }

    /// As [`SwapDevices::alloc`], but consecutive slots on one device: on the device `alloc`
    /// would start with (highest priority, equal priorities in turn), if one of the clusters
    /// `ClusterAllocator::alloc_run` looks at has such a run free; otherwise whatever `alloc`
    /// finds. Returns how many were allocated.
    pub fn alloc_run(&self, out: &mut [SwapEntry]) -> usize {
        let mut offsets = [0u64; 64];
        if out.len() <= offsets.len() {
            let first = self.groups.iter().find_map(|g| {
                let n = g.end - g.start;
                let start = g.next.fetch_add(1, Ordering::Relaxed) % n;
                (0..n).map(|k| &self.devices[g.start + (start + k) % n]).find(|d| d.takes_pages())
            });
            if let Some(dev) = first {
                let offsets = &mut offsets[..out.len()];
                if dev.allocator.alloc_run(current_cpu(), offsets) {
                    for (o, off) in out.iter_mut().zip(offsets.iter()) {
                        *o = SwapEntry::new(dev.index, *off);
                    }
                    return out.len();
                }
            }
        }
        self.alloc(out)
    }

    /// As [`SwapDevices::alloc`], never on the devices whose bit is set in `exclude` (devices
    /// that declined a page).
    pub fn alloc_excluding_mask(&self, exclude: u64, out: &mut [SwapEntry]) -> usize {
        let mut got = self.alloc_once(exclude, out);
        if got < out.len() {
            self.flush_frees();
            got += self.alloc_once(exclude, &mut out[got..]);
            // Full only when no device at all has room: devices this allocation left out
            // (those that declined a page, the tiers above a writeback) may still have it,
            // and a flag set for them made every charge overrun the limit at once.
            if got < out.len() && self.no_free_slot() {
                self.full.store(true, Ordering::Relaxed);
            }
        }
        got
    }

    /// True while the last allocation found every device full and nothing was freed since.
    pub fn is_full(&self) -> bool {
        self.full.load(Ordering::Relaxed)
    }

    /// Whether no device takes pages now: each is degraded (its writes fail) or declines
    /// them (a pool at its cap). Pages staged for a device that is merely full can still be
    /// written; these cannot.
    pub fn take_no_pages(&self) -> bool {
        !self.devices.iter().any(|d| d.takes_pages())
    }

    /// Probes the degraded devices whose probe is due (see `health`). The background
    /// reclaimer only.
    pub fn probe_degraded(&self) {
        for d in self.devices.iter().filter(|d| d.health.is_degraded()) {
            if d.probe() {
                // What the last allocation found no longer holds.
                self.full.store(false, Ordering::Relaxed);
            }
        }
        // A device full for this process because its tree held the device's size: asked
        // again at each tick, as another process may have given room back (this one may
        // free nothing for a long time, and `full` stays set until it does).
        if self.full.load(Ordering::Relaxed) && self.devices.iter().any(|d| d.allocator.share_refused()) {
            for d in self.devices.iter() {
                d.allocator.retry_share();
            }
            self.full.store(false, Ordering::Relaxed);
        }
    }

    /// Whether every device declines new pages, has every slot in use, or is full for this
    /// process because its tree holds the device's size (a tree of processes on a full
    /// shared device waited 100-250 ms at each charge, and nearly stopped, where a process
    /// alone on a full device goes over the limit at once, counted and said).
    fn no_free_slot(&self) -> bool {
        self.devices
            .iter()
            .all(|d| !d.takes_pages() || d.allocator.inuse_slots() >= d.nr_slots() || d.allocator.share_refused())
    }

    fn alloc_once(&self, exclude: u64, out: &mut [SwapEntry]) -> usize {
        let cpu = current_cpu();
        let mut got = 0;
        let mut offsets = [0u64; 64];
        for g in &self.groups {
            let n = g.end - g.start;
            let first = g.next.fetch_add(1, Ordering::Relaxed) % n;
            for k in 0..n {
                let dev = &self.devices[g.start + (first + k) % n];
                if exclude & (1 << dev.index) != 0 || !dev.takes_pages() {
                    continue;
                }
                while got < out.len() {
                    let want = (out.len() - got).min(offsets.len());
                    let m = dev.allocator.alloc(cpu, &mut offsets[..want], &|ci| dev.discard_cluster(ci));
                    for (o, off) in out[got..got + m].iter_mut().zip(&offsets[..m]) {
                        *o = SwapEntry::new(dev.index, *off);
                    }
                    got += m;
                    if m < want {
                        break; // this device is full
                    }
                }
                if got == out.len() {
                    return got;
                }
            }
        }
        got
    }

    /// Frees a slot whose page no longer needs it. Batched per CPU. With `lock_free`, takes
    /// no lock at all (for a signal handler whose thread already holds an engine lock).
    pub fn free(&self, entry: SwapEntry, lock_free: bool) {
        self.device(entry).table.clear(entry.offset());
        if self.full.load(Ordering::Relaxed) {
            self.full.store(false, Ordering::Relaxed);
        }
        if lock_free {
            if self.deferred.push(entry.bits()).is_err() {
                self.deferred_overflow.fetch_add(1, Ordering::Relaxed);
            }
            return;
        }
        let mut out = [0u64; FREE_BATCH];
        let n = {
            let mut b = self.free_batches[current_cpu() % self.free_batches.len()].lock();
            let len = b.len;
            b.entries[len] = entry.bits();
            b.len += 1;
            if b.len < FREE_BATCH {
                return;
            }
            out.copy_from_slice(&b.entries);
            b.len = 0;
            FREE_BATCH
        };
        self.free_now(&mut out[..n]);
    }

    /// Frees many slots at once (region teardown, reclaim batches): sorted, each cluster lock
    /// taken once per run. The caller has already cleared their swap-table entries.
    pub fn free_now(&self, entries: &mut [u64]) {
        if !entries.is_empty() && self.full.load(Ordering::Relaxed) {
            self.full.store(false, Ordering::Relaxed);
        }
        entries.sort_unstable();
        let mut i = 0;
        while i < entries.len() {
            let dev = SwapEntry::from_bits(entries[i]).device();
            let mut j = i;
            let mut offsets = [0u64; FREE_BATCH];
            let mut n = 0;
            let d = &self.devices[dev];
            while j < entries.len() && SwapEntry::from_bits(entries[j]).device() == dev && n < FREE_BATCH {
                let offset = SwapEntry::from_bits(entries[j]).offset();
                j += 1;
                // A fork child may still read it: kept until it no longer can.
                if d.fork_refs.hold_if_referenced(offset) {
                    continue;
                }
                offsets[n] = offset;
                n += 1;
            }
            d.give_back(&offsets[..n]);
            i = j;
        }
    }

    /// Frees the slots held for fork children that no child reads any more, and forgets the
    /// children that are gone (see `fork_refs`). System calls: engine threads only.
    pub fn release_fork_held(&self) {
        for d in &self.devices {
            d.fork_refs.sweep(&mut |offsets| {
                d.give_back(offsets);
                if !offsets.is_empty() {
                    self.full.store(false, Ordering::Relaxed);
                }
            });
        }
    }

    /// Empties every per-CPU free batch and the deferred queue, so slot counts are exact.
    pub fn flush_frees(&self) {
        for b in self.free_batches.iter() {
            let mut out = [0u64; FREE_BATCH];
            let n = {
                let mut g = b.lock();
                let n = g.len;
                out[..n].copy_from_slice(&g.entries[..n]);
                g.len = 0;
                n
            };
            self.free_now(&mut out[..n]);
        }
        // Bounded: the queue holds at most DEFERRED_FREES entries, so that many batches (and
        // one more) empty it even while lock-free faults keep adding to it.
        for _ in 0..=DEFERRED_FREES.div_ceil(FREE_BATCH) {
            let mut out = [0u64; FREE_BATCH];
            let mut n = 0;
            while n < FREE_BATCH {
                match self.deferred.pop() {
                    Some(e) => {
                        out[n] = e;
                        n += 1;
                    }
                    None => break,
                }
            }
            if n == 0 {
                break;
            }
            self.free_now(&mut out[..n]);
        }
    }

    /// Slots leaked because the lock-free free queue was full (reported in stats).
    pub fn deferred_overflow(&self) -> u64 {
        self.deferred_overflow.load(Ordering::Relaxed)
    }

    pub fn run_discards(&self) {
        for d in &self.devices {
            d.run_discards();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::ram::RamBackend;

    fn ram(nr_slots: u64) -> Box<dyn Backend> {
        Box::new(RamBackend::new(nr_slots).unwrap())
    }

    fn specs(v: Vec<(i32, Box<dyn Backend>)>) -> Vec<DeviceSpec> {
        v.into_iter()
            .map(|(priority, backend)| DeviceSpec {
                priority,
                backend,
                checksum: false,
                readahead: ReadaheadPolicy::Vma,
                clean_readahead: false,
                tree_share: None,
            })
            .collect()
    }

    #[test]
    fn priorities_first_then_equal_devices_take_turns() {
        let d = SwapDevices::new(specs(vec![(0, ram(1024)), (5, ram(1024)), (0, ram(1024))]), 1).unwrap();
        assert_eq!(d.devices()[0].priority, 5);
        let mut e = [SwapEntry::new(0, 0); 16];
        assert_eq!(d.alloc(&mut e), 16);
        assert!(e.iter().all(|e| e.device() == 0), "highest priority first");
        // Fill the high-priority device, then batches alternate between the two others.
        let mut rest = vec![SwapEntry::new(0, 0); 1024 - 16];
        assert_eq!(d.alloc(&mut rest), 1024 - 16);
        let mut a = [SwapEntry::new(0, 0); 8];
        let mut b = [SwapEntry::new(0, 0); 8];
        d.alloc(&mut a);
        d.alloc(&mut b);
        assert!(a.iter().all(|e| e.device() == a[0].device()));
        assert!(b.iter().all(|e| e.device() == b[0].device()));
        assert_ne!(a[0].device(), b[0].device(), "equal priorities take turns");
        assert!(a[0].device() >= 1 && b[0].device() >= 1);
    }

    #[test]
    fn batched_frees_are_exact_after_flush() {
        let d = SwapDevices::new(specs(vec![(0, ram(2048))]), 2).unwrap();
        let mut e = vec![SwapEntry::new(0, 0); 100];
        assert_eq!(d.alloc(&mut e), 100);
        for (i, x) in e.iter().enumerate() {
            d.free(*x, i % 10 == 0);
        }
        assert!(d.devices()[0].allocator.inuse_slots() > 0, "frees are batched");
        d.flush_frees();
        assert_eq!(d.devices()[0].allocator.inuse_slots(), 0);
        assert_eq!(d.deferred_overflow(), 0);
    }

    #[test]
    fn spills_to_lower_priority_when_full() {
        let d = SwapDevices::new(specs(vec![(10, ram(512)), (1, ram(1024))]), 1).unwrap();
        let mut e = vec![SwapEntry::new(0, 0); 700];
        assert_eq!(d.alloc(&mut e), 700);
        assert_eq!(e.iter().filter(|e| e.device() == 0).count(), 512);
        assert_eq!(e.iter().filter(|e| e.device() == 1).count(), 188);
        let mut more = vec![SwapEntry::new(0, 0); 1000];
        assert_eq!(d.alloc(&mut more), 1024 - 188, "allocation stops when every device is full");
        assert!(d.is_full());
    }

    /// An allocation that leaves out every device with room (a writeback from a device with
    /// nothing below it, a retry after a device declined) finds nothing, but the devices
    /// are not full: the flag made every charge overrun the limit at once.
    #[test]
    fn devices_left_out_of_an_allocation_are_not_full() {
        let d = SwapDevices::new(specs(vec![(0, ram(512)), (0, ram(512))]), 1).unwrap();
        let mut e = vec![SwapEntry::new(0, 0); 32];
        assert_eq!(d.alloc_excluding_mask(0b11, &mut e), 0);
        assert!(!d.is_full());
        assert_eq!(d.alloc_excluding_mask(0b01, &mut e), 32);
        assert!(e.iter().all(|e| e.device() == 1));
        assert!(!d.is_full());
    }
}
