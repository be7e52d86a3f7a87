//! The slot allocator of one swap device: clusters of 512 slots, per-cluster locks, and a
//! per-CPU current cluster as the allocation fast path.
//!
//! This is the allocator of `mm/swapfile.c` after the 2024–2025 rework ("mm, swap: rework of
//! swap allocator locks", "use percpu cluster as allocation fast path"):
//!
//! * Slots are grouped in clusters of [`SWAPFILE_CLUSTER`]. Each cluster has its own lock,
//!   guarding its in-use bitmap and count (`swap_map` and `ci->count` in the kernel).
//! * The device keeps free / nonfull / full / discard lists of clusters under one lock that
//!   guards *list membership only*, never slot state.
//! * Each CPU owns a current cluster, taken off every list, and allocates from it under its
//!   per-CPU lock and the cluster lock, without touching the device lock. CPUs start in
//!   different clusters, spread over the device, so they do not meet in the same cluster
//!   (and swap-cache shard) — the problem "percpu cluster_next" (2020) fixed.
//! * A cluster that becomes empty goes to the discard list; its storage is discarded (the
//!   device may return memory or punch a hole) before it returns to the free list, so a
//!   discard never races with a new allocation in the same cluster.
//!
//! Lock order: per-CPU lock → cluster lock → device list lock (see the hierarchy in
//! `crate::sync`). A thread that holds its per-CPU lock may only `try_lock` another CPU's
//! (to steal its cluster when the lists are empty), so two CPUs never wait on each other.
//! The discard (a system call on file devices) runs with none of these locks held: `alloc`
//! drops its per-CPU lock, discards, and takes it again.
//!
//! Invariants: a cluster is on exactly one list or owned by exactly one CPU, or being
//! discarded (on neither, briefly); `count` equals the number of set bits of `map`; a cluster
//! on the nonfull list has `count < 512`, on the full list `count == 512`, on the free and
//! discard lists `count == 0`.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use crossbeam_utils::CachePadded;

use crate::mapping::ZeroedArray;
use crate::shared_charge::DeviceShare;
use crate::sync::{LockClass, SpinLock};

/// Nonfull clusters [`ClusterAllocator::alloc_run`] looks at for a run before it takes an
/// empty one.
const RUN_SEARCH_NONFULL: usize = 4;

/// Slots per cluster; devices align their discards to it (`backend::SWAPFILE_CLUSTER`).
pub use crate::backend::SWAPFILE_CLUSTER;
const MAP_WORDS: usize = SWAPFILE_CLUSTER / 64;
/// Slots of one unit of a cluster charged to a [`DeviceShare`] (see `Cluster::charged`).
const CHARGE_SLOTS: usize = 16;
const CHARGE_UNITS: usize = SWAPFILE_CLUSTER / CHARGE_SLOTS;
// The units of a cluster fit `Cluster::charged`, and each lies within one word of its map.
const _: () = assert!(CHARGE_UNITS <= 32 && SWAPFILE_CLUSTER % CHARGE_SLOTS == 0 && 64 % CHARGE_SLOTS == 0);
/// Bytes of storage behind one charge unit (64 KiB). A unit, not a whole cluster (2 MiB):
/// a tree of 32 processes with two CPUs each, charged by clusters, could hold 128 MiB of
/// its device for pages that filled half of that, and was refused slots while mostly empty.
const CHARGE_BYTES: u64 = (CHARGE_SLOTS * crate::uffd::PAGE_SIZE) as u64;
#[cfg(test)]
const CLUSTER_BYTES: u64 = CHARGE_BYTES * CHARGE_UNITS as u64;
const NIL: u32 = u32::MAX;

/// Slot state of one cluster, under the cluster lock.
struct Cluster {
    count: u16,
    map: [u64; MAP_WORDS],
    /// Where the owner's next scan starts, so consecutive allocations get consecutive slots.
    next: u16,
    /// The units of [`CHARGE_SLOTS`] slots charged to the tree's share of the device (bit
    /// `u` for slots `u * CHARGE_SLOTS..`; see [`ClusterAllocator::with_share`]): from a
    /// unit's first slot after a discard (or ever) to the cluster's next discard, since the
    /// storage written behind a freed slot stays allocated until then. A unit with a slot
    /// in use is charged.
    charged: u32,
}

impl Cluster {
    /// Sets up to `out.len()` free bits, writing their cluster-relative indices; returns how
    /// many. Scans from the hint, wrapping once; a unit not yet charged is used only if
    /// `charge(1)` grants it, else skipped.
    fn alloc_bits(&mut self, base: u64, out: &mut [u64], charge: &dyn Fn(u64) -> bool) -> usize {
        let mut got = 0;
        let mut i = self.next as usize;
        let mut scanned = 0;
        while got < out.len() && scanned < SWAPFILE_CLUSTER && (self.count as usize) < SWAPFILE_CLUSTER {
            let (w, b) = (i / 64, i % 64);
            let unit = i / CHARGE_SLOTS;
            if self.charged & (1 << unit) == 0 {
                if !charge(1) {
                    // No room for this unit: skip the rest of it.
                    let rest = CHARGE_SLOTS - i % CHARGE_SLOTS;
                    i = (i + rest) % SWAPFILE_CLUSTER;
                    scanned += rest;
                    continue;
                }
                self.charged |= 1 << unit;
            }
            if self.map[w] & (1 << b) == 0 {
                self.map[w] |= 1 << b;
                self.count += 1;
                out[got] = base + i as u64;
                got += 1;
            }
            i = (i + 1) % SWAPFILE_CLUSTER;
            scanned += 1;
        }
        self.next = i as u16;
        self.check_count();
        got
    }

    /// Sets `out.len()` consecutive free bits, the first such run from the hint (wrapping
    /// once, never across the cluster's end), writing their indices; false if there is none,
    /// or if `charge(n)` refuses the `n` units it would charge.
    fn alloc_run(&mut self, base: u64, out: &mut [u64], charge: &dyn Fn(u64) -> bool) -> bool {
        let len = out.len();
        if len == 0 || len > SWAPFILE_CLUSTER - self.count as usize {
            return false;
        }
        let is_free = |i: usize| self.map[i / 64] & (1 << (i % 64)) == 0;
        let hint = self.next as usize;
        let starts_end = SWAPFILE_CLUSTER - len + 1;
        // Bounded: each failed start moves past the taken bit it found, so each pass ends
        // within `SWAPFILE_CLUSTER` starts.
        for (lo, hi) in [(hint, starts_end), (0, hint.min(starts_end))] {
            let mut start = lo;
            while start < hi {
                match (start..start + len).find(|&i| !is_free(i)) {
                    Some(taken) => start = taken + 1,
                    None => {
                        let units =
                            (start / CHARGE_SLOTS..=(start + len - 1) / CHARGE_SLOTS).fold(0u32, |m, u| m | 1 << u);
                        let new_units = units & !self.charged;
                        if !charge(new_units.count_ones() as u64) {
                            return false;
                        }
                        self.charged |= new_units;
                        for (k, o) in out.iter_mut().enumerate() {
                            let i = start + k;
                            self.map[i / 64] |= 1 << (i % 64);
                            *o = base + i as u64;
                        }
                        self.count += len as u16;
                        self.next = ((start + len) % SWAPFILE_CLUSTER) as u16;
                        self.check_count();
                        return true;
                    }
                }
            }
        }
        false
    }

    fn free_bit(&mut self, i: usize) {
        let (w, b) = (i / 64, i % 64);
        assert!(self.map[w] & (1 << b) != 0, "swap slot {i} of its cluster freed twice");
        self.map[w] &= !(1 << b);
        self.count -= 1;
        self.check_count();
    }

    /// A cluster's count is the number of bits set in its map (8 popcounts: kept in release).
    fn check_count(&self) {
        let bits: u32 = self.map.iter().map(|w| w.count_ones()).sum();
        assert_eq!(self.count as u32, bits, "uswap invariant: a cluster's count disagrees with its bitmap");
        let mut used_units = 0u32;
        for (w, &word) in self.map.iter().enumerate() {
            for k in 0..64 / CHARGE_SLOTS {
                let unit_bits = (word >> (k * CHARGE_SLOTS)) & ((1 << CHARGE_SLOTS) - 1);
                used_units |= u32::from(unit_bits != 0) << (w * (64 / CHARGE_SLOTS) + k);
            }
        }
        assert_eq!(used_units & !self.charged, 0, "uswap invariant: a cluster uses a unit it has not charged");
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum ListId {
    Free = 0,
    Nonfull = 1,
    Full = 2,
    Discard = 3,
    /// A CPU's current cluster, or a cluster being discarded: on no list.
    Off = 4,
}
const NR_LISTS: usize = 4;

#[derive(Clone, Copy)]
struct Node {
    prev: u32,
    next: u32,
    list: ListId,
}

#[derive(Clone, Copy)]
struct ListHead {
    head: u32,
    tail: u32,
    len: u32,
}

/// List membership of every cluster, under the device list lock.
///
/// Clusters from `next_fresh` on that no CPU started in have never been used: they are free,
/// on no list, and their state in `ClusterAllocator::clusters` is still zero bytes (see
/// [`ClusterLists::pop_fresh`]). Keeping them off the free list means a device sized for
/// terabytes costs nothing at start-up for clusters it has not used.
struct ClusterLists {
    nodes: Vec<Node>,
    lists: [ListHead; NR_LISTS],
    next_fresh: u32,
    /// The clusters CPUs started in (few, sorted): used from the start, never fresh.
    started_in: Vec<u32>,
}

impl ClusterLists {
    fn unlink(&mut self, ci: u32) {
        let n = self.nodes[ci as usize];
        if n.list == ListId::Off {
            return;
        }
        let l = &mut self.lists[n.list as usize];
        if n.prev == NIL {
            l.head = n.next;
        } else {
            self.nodes[n.prev as usize].next = n.next;
        }
        let l = &mut self.lists[n.list as usize];
        if n.next == NIL {
            l.tail = n.prev;
        } else {
            self.nodes[n.next as usize].prev = n.prev;
        }
        self.lists[n.list as usize].len -= 1;
        self.nodes[ci as usize] = Node { prev: NIL, next: NIL, list: ListId::Off };
    }

    /// Moves a cluster to the tail of `to` (or off all lists).
    fn move_to(&mut self, ci: u32, to: ListId) {
        self.unlink(ci);
        if to == ListId::Off {
            return;
        }
        let tail = self.lists[to as usize].tail;
        self.nodes[ci as usize] = Node { prev: tail, next: NIL, list: to };
        if tail == NIL {
            self.lists[to as usize].head = ci;
        } else {
            self.nodes[tail as usize].next = ci;
        }
        let l = &mut self.lists[to as usize];
        l.tail = ci;
        l.len += 1;
    }

    fn pop(&mut self, from: ListId) -> Option<u32> {
        let h = self.lists[from as usize].head;
        if h == NIL {
            return None;
        }
        self.unlink(h);
        Some(h)
    }

    fn list_of(&self, ci: u32) -> ListId {
        self.nodes[ci as usize].list
    }

    /// A never-used cluster, if any is left. The caller initialises its state before
    /// anyone else can reach it (it was on no list and no CPU's).
    fn pop_fresh(&mut self, nr_clusters: u32) -> Option<u32> {
        while self.next_fresh < nr_clusters && self.started_in.binary_search(&self.next_fresh).is_ok() {
            self.next_fresh += 1;
        }
        (self.next_fresh < nr_clusters).then(|| {
            self.next_fresh += 1;
            self.next_fresh - 1
        })
    }

    /// Never-used clusters left.
    fn nr_fresh(&self, nr_clusters: u32) -> u32 {
        let started_ahead = self.started_in.iter().filter(|&&ci| ci >= self.next_fresh).count() as u32;
        nr_clusters - self.next_fresh - started_ahead
    }
}

/// A device dropped while its tree lives on (a pager dropped by a program that goes on)
/// gives its clusters' share back.
impl Drop for ClusterAllocator {
    fn drop(&mut self) {
        let Some(share) = self.share else { return };
        let (next_fresh, started_in) = {
            let lists = self.lists.lock();
            (lists.next_fresh, lists.started_in.clone())
        };
        // Every cluster ever initialised: the fresh ones taken, and those CPUs started in.
        let initialised = (0..next_fresh).chain(started_in.into_iter().filter(|&ci| ci >= next_fresh));
        let units: u64 = initialised.map(|ci| self.clusters[ci as usize].lock().charged.count_ones() as u64).sum();
        share.shrink(units * CHARGE_BYTES);
    }
}

/// What `take_cluster` found.
enum Take {
    Cluster(u32),
    /// Only clusters waiting for discard: discard them (with no lock held) and try again.
    Discard,
    None,
}

/// Cluster counts by list, for stats.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ClusterCounts {
    pub free: u64,
    pub nonfull: u64,
    pub full: u64,
    pub discard: u64,
    /// Clusters discarded since the device was set up.
    pub discarded: u64,
}

pub struct ClusterAllocator {
    nr_clusters: u32,
    /// Each cluster's state; zero bytes until the cluster is first used (see `ClusterLists`).
    clusters: ZeroedArray<CachePadded<SpinLock<Cluster>>>,
    lists: SpinLock<ClusterLists>,
    /// Each CPU's current cluster (`percpu_swap_cluster`).
    percpu: Box<[CachePadded<SpinLock<Option<u32>>>]>,
    inuse_slots: AtomicU64,
    discarded: AtomicU64,
    /// The tree this device's size is shared with, if any.
    share: Option<DeviceShare>,
    /// Charges refused because the tree held the device's whole size.
    share_refusals: AtomicU64,
    /// The last charge of a unit was refused (the tree holds the device's size): the device
    /// is full for this process until a charge succeeds again.
    share_refused: AtomicBool,
}

impl ClusterAllocator {
    /// An allocator for `nr_clusters` clusters shared by `nr_cpus` CPUs. Fails only if the
    /// address space for the cluster table cannot be reserved.
    pub fn new(nr_clusters: u32, nr_cpus: usize) -> std::io::Result<ClusterAllocator> {
        assert!(nr_clusters > 0 && nr_clusters < NIL);
        let nr_cpus = nr_cpus.max(1);
        // SAFETY: zero bytes are a valid CachePadded<SpinLock<Cluster>> (an unlocked spin
        // lock, an empty cluster, LockClass 0); each entry is given its own class by
        // `init_cluster` before any lock of it is taken.
        let clusters = unsafe { ZeroedArray::new(nr_clusters as usize)? };
        // CPUs start in different clusters, spread evenly over the device.
        let mut owned = vec![None; nr_cpus];
        if nr_clusters as usize >= nr_cpus {
            for (cpu, o) in owned.iter_mut().enumerate() {
                *o = Some((cpu as u64 * nr_clusters as u64 / nr_cpus as u64) as u32);
            }
        }
        let mut started_in: Vec<u32> = owned.iter().flatten().copied().collect();
        started_in.sort_unstable();
        let lists = ClusterLists {
            nodes: vec![Node { prev: NIL, next: NIL, list: ListId::Off }; nr_clusters as usize],
            lists: [ListHead { head: NIL, tail: NIL, len: 0 }; NR_LISTS],
            next_fresh: 0,
            started_in,
        };
        let a = ClusterAllocator {
            nr_clusters,
            clusters,
            lists: SpinLock::new(LockClass::SwapDeviceLists, lists),
            percpu: owned.iter().map(|&o| CachePadded::new(SpinLock::new(LockClass::SwapPerCpuCluster, o))).collect(),
            inuse_slots: AtomicU64::new(0),
            discarded: AtomicU64::new(0),
            share: None,
            share_refusals: AtomicU64::new(0),
            share_refused: AtomicBool::new(false),
        };
        for &ci in owned.iter().flatten() {
            // SAFETY: the allocator is not shared yet.
            unsafe { a.init_cluster(ci) };
        }
        Ok(a)
    }

    /// Gives never-used cluster `ci` its initial state.
    ///
    /// # Safety
    /// Nothing else may reach the cluster meanwhile: it is on no list and no CPU's.
    unsafe fn init_cluster(&self, ci: u32) {
        let empty = Cluster { count: 0, map: [0; MAP_WORDS], next: 0, charged: 0 };
        // SAFETY: the caller's contract; a cluster has nothing to drop.
        unsafe { self.clusters.init(ci as usize, CachePadded::new(SpinLock::new(LockClass::SwapCluster, empty))) };
    }

    /// Shares the device's size with the other processes of a tree: each unit of
    /// [`CHARGE_SLOTS`] slots of a cluster is charged to `share` when it takes its first
    /// slot and uncharged when the cluster is discarded, and a unit the tree has no room for
    /// takes no slot (the process uses the units it has charged; the device is full for it
    /// when those are, until some cluster of the tree is discarded). Once the tree holds
    /// half the device, free slots of charged units are taken first, as freed slots would
    /// otherwise keep storage no other process can use.
    pub fn with_share(mut self, share: Option<DeviceShare>) -> ClusterAllocator {
        self.share = share;
        self
    }

    /// Charges `nr_units` more units to the tree before they take slots; false if the tree
    /// has no room for them.
    fn charge_units(&self, nr_units: u64) -> bool {
        let Some(share) = &self.share else { return true };
        if nr_units == 0 {
            return true;
        }
        if share.try_grow(nr_units * CHARGE_BYTES) {
            self.share_refused.store(false, Ordering::Relaxed);
            return true;
        }
        self.share_refusals.fetch_add(1, Ordering::Relaxed);
        self.share_refused.store(true, Ordering::Relaxed);
        false
    }

    /// Charges refused because the tree held the device's whole size.
    pub fn share_refusals(&self) -> u64 {
        self.share_refusals.load(Ordering::Relaxed)
    }

    /// Whether the last charge of a unit was refused: the tree holds the device's size, and
    /// this process has no room on it beyond the units it charged.
    pub fn share_refused(&self) -> bool {
        self.share_refused.load(Ordering::Relaxed)
    }

    /// Forgets a refusal, so that the next allocation asks the tree again (another process
    /// may have given units back since).
    pub fn retry_share(&self) {
        self.share_refused.store(false, Ordering::Relaxed);
    }

    pub fn nr_slots(&self) -> u64 {
        self.nr_clusters as u64 * SWAPFILE_CLUSTER as u64
    }

    pub fn inuse_slots(&self) -> u64 {
        self.inuse_slots.load(Ordering::Relaxed)
    }

    /// Allocates up to `out.len()` slots for `cpu`, writing their offsets; returns how many
    /// (fewer only when the device is full). Slots come from the CPU's current cluster, so a
    /// batch is mostly contiguous. `discard` is run on clusters that must be discarded before
    /// they can be reused, if nothing else is free.
    pub fn alloc(&self, cpu: usize, out: &mut [u64], discard: &dyn Fn(u32)) -> usize {
        let cpu = cpu % self.percpu.len();
        let mut got = 0;
        // At most two rounds: the second only after a discard freed clusters, and it
        // discards no more.
        let mut may_discard = true;
        // Clusters given up because the tree had no room for their free units: bounded, as
        // those taken next off the nonfull list may be no better.
        let mut refused = 0;
        loop {
            let mut pc = self.percpu[cpu].lock();
            let mut wants_discard = false;
            while got < out.len() {
                let ci = match *pc {
                    Some(ci) => ci,
                    None => match self.take_cluster(cpu, may_discard) {
                        Take::Cluster(ci) => {
                            *pc = Some(ci);
                            ci
                        }
                        Take::Discard => {
                            wants_discard = true;
                            break;
                        }
                        Take::None => break,
                    },
                };
                let mut c = self.clusters[ci as usize].lock();
                let charge = |nr_units| self.charge_units(nr_units);
                let base = ci as u64 * SWAPFILE_CLUSTER as u64;
                let mut here = 0;
                if self.share.is_some_and(|s| s.over_half()) {
                    here = c.alloc_bits(base, &mut out[got..], &|_| false);
                }
                here += c.alloc_bits(base, &mut out[got + here..], &charge);
                got += here;
                if here == 0 && (c.count as usize) < SWAPFILE_CLUSTER {
                    // Its free slots are all in units the tree has no room for: try a
                    // nonfull cluster, whose freed slots are in units already charged.
                    let mut lists = self.lists.lock();
                    lists.move_to(ci, Self::list_for_given_up(&c));
                    drop(c);
                    refused += 1;
                    *pc = if refused <= RUN_SEARCH_NONFULL { lists.pop(ListId::Nonfull) } else { None };
                    if pc.is_none() {
                        break;
                    }
                    continue;
                }
                if c.count as usize == SWAPFILE_CLUSTER {
                    // Full: give it up to the full list; frees will bring it back to nonfull.
                    self.lists.lock().move_to(ci, ListId::Full);
                    *pc = None;
                }
            }
            drop(pc);
            if !wants_discard {
                break;
            }
            // Discarding is a system call on file devices: never under the per-CPU lock.
            may_discard = false;
            self.run_discards(discard);
        }
        self.inuse_slots.fetch_add(got as u64, Ordering::Relaxed);
        got
    }

    /// Allocates `out.len()` consecutive slots for `cpu`: from its current cluster if that has
    /// such a run free, else from the first of up to [`RUN_SEARCH_NONFULL`] nonfull clusters
    /// that has one, else from an empty cluster (free, or never used), as the kernel's
    /// allocator takes a free cluster for a large folio's entries. The cluster the run came
    /// from becomes the CPU's current one (the old one goes back to the nonfull list).
    /// Nonfull clusters come first because they are already in use: an empty cluster's
    /// storage was discarded (a RAM device faults every page of it in again, a file device
    /// allocates its blocks again), and sequential streams, which need long runs, free
    /// whole stretches of the clusters they came from. False when no cluster tried has the
    /// run (nothing allocated: the caller falls back to [`Self::alloc`]).
    pub fn alloc_run(&self, cpu: usize, out: &mut [u64]) -> bool {
        let cpu = cpu % self.percpu.len();
        if out.is_empty() || out.len() > SWAPFILE_CLUSTER {
            return false;
        }
        let mut pc = self.percpu[cpu].lock();
        if let Some(ci) = *pc {
            let mut c = self.clusters[ci as usize].lock();
            let charge = |nr_units| self.charge_units(nr_units);
            if c.alloc_run(ci as u64 * SWAPFILE_CLUSTER as u64, out, &charge) {
                if c.count as usize == SWAPFILE_CLUSTER {
                    self.lists.lock().move_to(ci, ListId::Full);
                    *pc = None;
                }
                drop(c);
                drop(pc);
                self.inuse_slots.fetch_add(out.len() as u64, Ordering::Relaxed);
                return true;
            }
        }
        // Bounded: RUN_SEARCH_NONFULL nonfull clusters, then one empty one.
        for attempt in 0..=RUN_SEARCH_NONFULL {
            let candidate = {
                let mut lists = self.lists.lock();
                let nonfull = if attempt < RUN_SEARCH_NONFULL { lists.pop(ListId::Nonfull) } else { None };
                nonfull.or_else(|| self.pop_empty(&mut lists))
            };
            let Some(ci) = candidate else { return false };
            let mut c = self.clusters[ci as usize].lock();
            let charge = |nr_units| self.charge_units(nr_units);
            if !c.alloc_run(ci as u64 * SWAPFILE_CLUSTER as u64, out, &charge) {
                // No such run here, or the tree has no room for its units: back to a list.
                self.lists.lock().move_to(ci, Self::list_for_given_up(&c));
                continue;
            }
            let full = c.count as usize == SWAPFILE_CLUSTER;
            drop(c);
            if full {
                self.lists.lock().move_to(ci, ListId::Full);
            } else if let Some(old) = pc.replace(ci) {
                self.release_owned(old);
            }
            drop(pc);
            self.inuse_slots.fetch_add(out.len() as u64, Ordering::Relaxed);
            return true;
        }
        false
    }

    /// An empty cluster off the lists: a free one, else a never-used one (initialised here).
    fn pop_empty(&self, lists: &mut ClusterLists) -> Option<u32> {
        lists.pop(ListId::Free).or_else(|| {
            let ci = lists.pop_fresh(self.nr_clusters)?;
            // SAFETY: fresh: on no list and no CPU's, and the caller holds the lists lock
            // (`lists` is borrowed from its guard), so no other thread can pop it.
            unsafe { self.init_cluster(ci) };
            Some(ci)
        })
    }

    /// The list for a cluster this thread took off the lists and gives up on, under its
    /// lock: the free list if it is empty and uncharged (nothing to discard), the discard
    /// list if it is empty but charged, else the nonfull list.
    fn list_for_given_up(c: &Cluster) -> ListId {
        match (c.count, c.charged) {
            (0, 0) => ListId::Free,
            (0, _) => ListId::Discard,
            _ => ListId::Nonfull,
        }
    }

    /// Puts a cluster this thread took off the lists back on the one its count says: the
    /// discard list if frees emptied it meanwhile, else the nonfull list. Under its cluster
    /// lock, so that a concurrent `free` (which leaves clusters that are on no list alone)
    /// cannot empty it between the check and the move.
    fn release_owned(&self, ci: u32) {
        let c = self.clusters[ci as usize].lock();
        let to = if c.count == 0 { ListId::Discard } else { ListId::Nonfull };
        self.lists.lock().move_to(ci, to);
    }

    /// A cluster for a CPU whose current one is full: nonfull first (keeps the free ones for
    /// contiguous allocation), then free, then (if `may_discard`) one waiting for discard,
    /// which the caller discards after dropping its per-CPU lock, then another CPU's.
    fn take_cluster(&self, cpu: usize, may_discard: bool) -> Take {
        {
            let mut lists = self.lists.lock();
            if let Some(ci) = lists.pop(ListId::Nonfull).or_else(|| self.pop_empty(&mut lists)) {
                return Take::Cluster(ci);
            }
            if may_discard && lists.lists[ListId::Discard as usize].len > 0 {
                return Take::Discard;
            }
        }
        // Lists are empty: other CPUs' current clusters may still have room.
        for other in (0..self.percpu.len()).filter(|&o| o != cpu) {
            if let Some(mut g) = self.percpu[other].try_lock() {
                if let Some(ci) = g.take() {
                    return Take::Cluster(ci);
                }
            }
        }
        Take::None
    }

    /// Frees slots (any order; sorted input takes each cluster lock once per run).
    pub fn free(&self, offsets: &[u64]) {
        let mut i = 0;
        while i < offsets.len() {
            let ci = (offsets[i] / SWAPFILE_CLUSTER as u64) as u32;
            assert!(ci < self.nr_clusters, "swap slot {} beyond device", offsets[i]);
            let mut c = self.clusters[ci as usize].lock();
            let old = c.count as usize;
            while i < offsets.len() && offsets[i] / SWAPFILE_CLUSTER as u64 == ci as u64 {
                c.free_bit((offsets[i] % SWAPFILE_CLUSTER as u64) as usize);
                self.inuse_slots.fetch_sub(1, Ordering::Relaxed);
                i += 1;
            }
            let new = c.count as usize;
            if new == 0 || (old == SWAPFILE_CLUSTER && new < SWAPFILE_CLUSTER) {
                let mut lists = self.lists.lock();
                match lists.list_of(ci) {
                    // Owned by a CPU (or being discarded): its owner keeps it.
                    ListId::Off => {}
                    _ if new == 0 => lists.move_to(ci, ListId::Discard),
                    _ => lists.move_to(ci, ListId::Nonfull),
                }
            }
        }
    }

    /// Discards clusters waiting on the discard list and returns them to the free list.
    /// Returns how many.
    pub fn run_discards(&self, discard: &dyn Fn(u32)) -> usize {
        let mut n = 0;
        // Bounded by the number of clusters: each is discarded at most once per call.
        for _ in 0..self.nr_clusters {
            let Some(ci) = self.lists.lock().pop(ListId::Discard) else {
                break;
            };
            discard(ci);
            self.discarded.fetch_add(1, Ordering::Relaxed);
            let mut c = self.clusters[ci as usize].lock();
            c.next = 0;
            let units = std::mem::take(&mut c.charged).count_ones() as u64;
            if let (Some(share), true) = (&self.share, units > 0) {
                share.shrink(units * CHARGE_BYTES);
            }
            let mut lists = self.lists.lock();
            // A cluster off all lists cannot have gained slots (only owners allocate).
            debug_assert_eq!(c.count, 0);
            lists.move_to(ci, ListId::Free);
            n += 1;
        }
        n
    }

    /// The first cluster at or after `ci` that was ever given out (and so may hold slots):
    /// the never-used ones are skipped by whoever scans the device's slots. `None` past the
    /// last.
    pub fn used_cluster_from(&self, ci: u32) -> Option<u32> {
        let l = self.lists.lock();
        if ci < l.next_fresh {
            return Some(ci);
        }
        // `started_in` is sorted (`pop_fresh` searches it).
        let k = l.started_in.partition_point(|&s| s < ci);
        l.started_in.get(k).copied()
    }

    pub fn cluster_counts(&self) -> ClusterCounts {
        let l = self.lists.lock();
        ClusterCounts {
            free: l.lists[ListId::Free as usize].len as u64 + l.nr_fresh(self.nr_clusters) as u64,
            nonfull: l.lists[ListId::Nonfull as usize].len as u64,
            full: l.lists[ListId::Full as usize].len as u64,
            discard: l.lists[ListId::Discard as usize].len as u64,
            discarded: self.discarded.load(Ordering::Relaxed),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashSet;
    use std::sync::Arc;

    fn no_discard(_: u32) {}

    /// The discard is a system call on file devices; the lock hierarchy (`crate::sync`)
    /// forbids one under a spin lock, so an allocation that needs a discarded cluster must
    /// run the discard with no engine lock held.
    /// A scan of the device's slots (the aging scan's tier moves) visits the clusters ever
    /// given out: every slot allocated lies in one, and past the last there is none.
    #[test]
    fn the_clusters_ever_given_out_hold_every_slot_allocated() {
        let a = ClusterAllocator::new(64, 2).unwrap();
        let mut out = vec![0u64; 3 * SWAPFILE_CLUSTER + 7];
        assert_eq!(a.alloc(0, &mut out, &no_discard), out.len());
        let used: HashSet<u32> = out.iter().map(|&s| (s / SWAPFILE_CLUSTER as u64) as u32).collect();
        for &ci in &used {
            assert_eq!(a.used_cluster_from(ci), Some(ci), "cluster {ci} holds slots");
        }
        let last = *used.iter().max().unwrap();
        let mut visited = 0;
        let mut ci = 0;
        // Bounded: each step moves past a cluster.
        while let Some(c) = a.used_cluster_from(ci) {
            assert!(c >= ci);
            visited += 1;
            ci = c + 1;
        }
        assert!(ci > last && visited < 64, "the walk ends after the last used cluster ({visited} visited)");
    }

    /// Two processes' allocators of one device of a tree: together they never hold more
    /// clusters than the device's size, a discard gives a cluster's share back, and a
    /// dropped allocator gives back all of its own.
    #[test]
    fn a_tree_share_bounds_the_clusters_of_every_process_together() {
        use crate::shared_charge::{DeviceShare, SharedCharge};
        let tree: &'static SharedCharge = Box::leak(Box::default());
        let share = || DeviceShare::new(tree, 0, None, 3 * CLUSTER_BYTES);
        let a = ClusterAllocator::new(4, 1).unwrap().with_share(share());
        let b = ClusterAllocator::new(4, 1).unwrap().with_share(share());
        let mut out = vec![0u64; 4 * SWAPFILE_CLUSTER];
        assert_eq!(a.alloc(0, &mut out[..2 * SWAPFILE_CLUSTER], &no_discard), 2 * SWAPFILE_CLUSTER);
        let got_b = b.alloc(0, &mut out[2 * SWAPFILE_CLUSTER..], &no_discard);
        assert_eq!(got_b, SWAPFILE_CLUSTER, "the tree had room for one more cluster");
        assert_eq!(tree.device_bytes[0].load(Ordering::Relaxed), 3 * CLUSTER_BYTES);
        assert!(b.share_refusals() > 0);
        assert!(!b.alloc_run(0, &mut out[..8]), "a run needs a new cluster the tree has no room for");
        // `a` frees a cluster; once discarded, `b` can take it.
        a.free(&out[..SWAPFILE_CLUSTER]);
        assert_eq!(a.run_discards(&no_discard), 1);
        assert_eq!(tree.device_bytes[0].load(Ordering::Relaxed), 2 * CLUSTER_BYTES);
        assert_eq!(b.alloc(0, &mut out[..SWAPFILE_CLUSTER], &no_discard), SWAPFILE_CLUSTER);
        assert_eq!(tree.device_peak_bytes[0].load(Ordering::Relaxed), 3 * CLUSTER_BYTES);
        drop(a);
        drop(b);
        assert_eq!(tree.device_bytes[0].load(Ordering::Relaxed), 0, "dropped devices hold nothing");
    }

    /// 32 processes with two CPUs each page 1.5 MiB apiece to a tree's device of 64 MiB:
    /// charged by whole clusters (2 MiB), the first CPU of each took one and the second was
    /// refused with the device a quarter empty. Charged by units, all fit.
    #[test]
    fn a_tree_share_charges_units_so_many_small_processes_fit() {
        use crate::shared_charge::{DeviceShare, SharedCharge};
        let tree: &'static SharedCharge = Box::leak(Box::default());
        let device_bytes = 32 * CLUSTER_BYTES;
        let processes: Vec<_> = (0..32)
            .map(|_| ClusterAllocator::new(32, 2).unwrap().with_share(DeviceShare::new(tree, 0, None, device_bytes)))
            .collect();
        let mut out = vec![0u64; 192];
        for (p, a) in processes.iter().enumerate() {
            for cpu in 0..2 {
                // In batches of 32, as reclaim asks.
                for batch in out.chunks_mut(32) {
                    assert_eq!(a.alloc(cpu, batch, &no_discard), 32, "process {p} CPU {cpu} refused");
                }
            }
        }
        let charged = tree.device_bytes[0].load(Ordering::Relaxed);
        assert_eq!(charged, 32 * 2 * 192 / CHARGE_SLOTS as u64 * CHARGE_BYTES, "each CPU charged its 192 slots");
        assert_eq!(processes.iter().map(|a| a.share_refusals()).sum::<u64>(), 0);
    }

    #[test]
    fn discards_run_with_no_lock_held() {
        let a = ClusterAllocator::new(2, 1).unwrap();
        let mut all = vec![0u64; 1024];
        assert_eq!(a.alloc(0, &mut all, &no_discard), 1024);
        a.free(&all);
        assert_eq!(a.cluster_counts().discard, 2, "both clusters wait for discard");
        let locks_seen = std::sync::Mutex::new(vec![]);
        let mut one = [0u64; 1];
        let n = a.alloc(0, &mut one, &|ci| {
            locks_seen.lock().unwrap().push((ci, crate::sync::locks_held_by_this_thread()));
        });
        assert_eq!(n, 1, "the discarded clusters are reused");
        let seen = locks_seen.into_inner().unwrap();
        assert_eq!(seen.len(), 2, "{seen:?}");
        assert!(seen.iter().all(|&(_, locks)| locks == 0), "discard ran under an engine lock: {seen:?}");
    }

    #[test]
    fn cpus_start_in_different_clusters_and_batches_are_contiguous() {
        let a = ClusterAllocator::new(8, 2).unwrap();
        let mut s0 = [0u64; 16];
        let mut s1 = [0u64; 16];
        assert_eq!(a.alloc(0, &mut s0, &no_discard), 16);
        assert_eq!(a.alloc(1, &mut s1, &no_discard), 16);
        assert_ne!(s0[0] / 512, s1[0] / 512, "CPUs share a starting cluster");
        assert!(s0.windows(2).all(|w| w[1] == w[0] + 1));
        assert_eq!(a.inuse_slots(), 32);
    }

    #[test]
    fn full_device_and_list_transitions() {
        let a = ClusterAllocator::new(2, 1).unwrap();
        let mut all = vec![0u64; 1024];
        assert_eq!(a.alloc(0, &mut all, &no_discard), 1024);
        let mut more = [0u64; 1];
        assert_eq!(a.alloc(0, &mut more, &no_discard), 0, "full device hands out nothing");
        assert_eq!(a.cluster_counts().full, 2);
        a.free(&all[..1]);
        let c = a.cluster_counts();
        assert_eq!((c.full, c.nonfull), (1, 1));
        a.free(&all[1..512]);
        assert_eq!(a.cluster_counts().discard, 1);
        let discarded = std::sync::Mutex::new(vec![]);
        assert_eq!(a.run_discards(&|ci| discarded.lock().unwrap().push(ci)), 1);
        assert_eq!(discarded.lock().unwrap().len(), 1);
        assert_eq!(a.cluster_counts().free, 1);
        assert_eq!(a.inuse_slots(), 512);
    }

    /// A run comes out consecutive: from the CPU's cluster if it has the run free, else from
    /// a nonfull cluster that has it (which becomes the CPU's), else from an empty cluster;
    /// with none of these, nothing is allocated.
    #[test]
    fn runs_are_consecutive_from_the_first_cluster_that_has_them() {
        let a = ClusterAllocator::new(3, 1).unwrap();
        let consecutive = |r: &[u64]| r.windows(2).all(|w| w[1] == w[0] + 1);
        let cluster_of = |slot: u64| slot / SWAPFILE_CLUSTER as u64;
        // Cluster 0 full; cluster 1 full, then every odd slot freed and 100..104: its only
        // run longer than one slot is 99..104 (99 and 103 are odd). Cluster 2 never used.
        let mut first = vec![0u64; 512];
        assert_eq!(a.alloc(0, &mut first, &no_discard), 512);
        let mut second = vec![0u64; 512];
        assert_eq!(a.alloc(0, &mut second, &no_discard), 512);
        let base = second[0];
        assert_eq!(cluster_of(base), 1);
        let freed: Vec<u64> = (0..512u64).filter(|i| i % 2 == 1 || (100..104).contains(i)).map(|i| base + i).collect();
        a.free(&freed);
        assert_eq!(a.cluster_counts().nonfull, 1);
        // The CPU has no current cluster (both went full): the nonfull one has the run.
        let mut four = [0u64; 4];
        assert!(a.alloc_run(0, &mut four));
        assert!(consecutive(&four) && four[0] >= base + 99 && four[3] < base + 104, "{four:?} (base {base})");
        // No run of 2 is left there: the empty cluster gives it, and becomes the CPU's.
        let mut two = [0u64; 2];
        assert!(a.alloc_run(0, &mut two));
        assert!(consecutive(&two) && cluster_of(two[0]) == 2, "{two:?}");
        let mut more = [0u64; 8];
        assert!(a.alloc_run(0, &mut more));
        assert_eq!(more[0], two[1] + 1, "the next run follows in the CPU's new cluster");
        assert_eq!(a.inuse_slots(), 1024 - freed.len() as u64 + 14);
        // Fill cluster 2: then no cluster has a run of 2 and none is empty.
        let mut fill = vec![0u64; 512 - 10];
        assert_eq!(a.alloc(0, &mut fill, &no_discard), 512 - 10);
        assert!(fill.iter().all(|&s| cluster_of(s) == 2), "singles come from the CPU's cluster first");
        let before = a.inuse_slots();
        assert!(!a.alloc_run(0, &mut two));
        assert_eq!(a.inuse_slots(), before, "a failed run allocates nothing");
        let c = a.cluster_counts();
        assert_eq!((c.full, c.nonfull, c.free), (2, 1, 0), "the lists are as they were");
    }

    #[test]
    fn lists_stay_consistent_under_random_alloc_free() {
        let a = ClusterAllocator::new(16, 3).unwrap();
        let mut live: Vec<u64> = vec![];
        let mut x = 0x9E37_79B9_7F4A_7C15u64;
        for round in 0..2000 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            if x % 3 == 1 && x % 5 == 0 {
                // Runs too, through every path: the CPU's cluster, nonfull ones, empty ones.
                let mut buf = [0u64; 16];
                let len = (x as usize >> 8) % 16 + 1;
                if a.alloc_run(round % 3, &mut buf[..len]) {
                    assert!(buf[..len].windows(2).all(|w| w[1] == w[0] + 1), "run not consecutive: {:?}", &buf[..len]);
                    live.extend_from_slice(&buf[..len]);
                }
            } else if x % 3 != 0 {
                let mut buf = [0u64; 37];
                let n = a.alloc(round % 3, &mut buf, &no_discard);
                live.extend_from_slice(&buf[..n]);
            } else if !live.is_empty() {
                let k = (x as usize / 3) % live.len().min(50) + 1;
                let mut batch: Vec<u64> = (0..k).map(|j| live.swap_remove((x as usize + j) % live.len())).collect();
                batch.sort_unstable();
                a.free(&batch);
            }
            a.run_discards(&no_discard);
            let set: HashSet<_> = live.iter().collect();
            assert_eq!(set.len(), live.len(), "slot handed out twice");
            assert_eq!(a.inuse_slots(), live.len() as u64);
            let c = a.cluster_counts();
            assert!(c.free + c.nonfull + c.full + c.discard <= 16);
        }
    }

    #[test]
    fn hammered_from_threads_never_hands_out_a_slot_twice_and_loses_none() {
        const NR_CLUSTERS: u32 = 64;
        let a = Arc::new(ClusterAllocator::new(NR_CLUSTERS, 4).unwrap());
        let threads: Vec<_> = (0..4)
            .map(|t| {
                let a = a.clone();
                std::thread::spawn(move || {
                    let mut mine: Vec<u64> = vec![];
                    let mut all_seen = 0u64;
                    for round in 0..3000 {
                        let mut buf = [0u64; 24];
                        let n = a.alloc((t + round) % 4, &mut buf, &no_discard);
                        mine.extend_from_slice(&buf[..n]);
                        all_seen += n as u64;
                        if mine.len() > 2000 || round % 5 == 0 {
                            let k = mine.len() / 2;
                            let mut batch: Vec<u64> = mine.drain(..k).collect();
                            batch.sort_unstable();
                            a.free(&batch);
                        }
                        if round % 97 == 0 {
                            a.run_discards(&no_discard);
                        }
                    }
                    (mine, all_seen)
                })
            })
            .collect();
        let mut live = HashSet::new();
        for t in threads {
            let (mine, seen) = t.join().unwrap();
            assert!(seen > 0);
            for s in mine {
                assert!(live.insert(s), "slot {s} held by two threads");
            }
        }
        assert_eq!(a.inuse_slots(), live.len() as u64, "in-use count drifted");
        // Free everything that is still held and check every slot can be allocated again.
        let mut v: Vec<u64> = live.into_iter().collect();
        v.sort_unstable();
        a.free(&v);
        a.run_discards(&no_discard);
        assert_eq!(a.inuse_slots(), 0);
        let mut all = vec![0u64; NR_CLUSTERS as usize * 512];
        let mut got = 0;
        for cpu in 0..4 {
            got += a.alloc(cpu, &mut all[got..], &no_discard);
        }
        assert_eq!(got, NR_CLUSTERS as usize * 512, "slots were lost");
        let set: HashSet<_> = all.iter().collect();
        assert_eq!(set.len(), all.len());
    }
}
