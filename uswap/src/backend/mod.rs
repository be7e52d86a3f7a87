//! Where page contents go: the [`Backend`] trait and its implementations.
//!
//! A backend stores pages in numbered slots. The swap layer decides which slot a page gets
//! (cluster allocator) and calls the backend with batches: runs of consecutive slots, each
//! with its buffer, so a device can issue one large I/O (or one io_uring submission) per
//! batch. The fault path never sees which backend it talks to.
//!
//! Contract for implementors:
//! * `write` and `read` may be called concurrently from several threads, for different slots.
//!   The engine never reads a slot while it is being written, nor writes a slot twice without
//!   a `discard` or a successful `write` in between.
//! * `read` may run inside a SIGBUS handler (signal mode): it must not allocate or take a
//!   lock that a thread could hold while being interrupted by that signal. Report failures
//!   through each request's `result`; never panic.
//! * A failed write must leave the slot's previous contents (if any) readable.
//! * An [`AsyncReader`] may still be reading a slot when the engine frees it and writes it
//!   again: the engine then throws that read's data away unused, so a device only has to
//!   make sure such a race cannot corrupt the *write* (true of any file or block device).

pub mod failing;
pub mod file;
pub mod ram;
pub mod redis;
pub mod zpool;

use std::io;

use thiserror::Error;

pub use crate::mapping::PageRun;

/// A failed backend operation, with the slot it concerns.
#[derive(Debug, Error)]
pub enum BackendError {
    #[error("I/O error on slot {slot}: {source}")]
    Io { slot: u64, source: io::Error },
    #[error("slot {slot} is beyond the device's {nr_slots} slots")]
    OutOfRange { slot: u64, nr_slots: u64 },
    #[error("injected failure on slot {slot}")]
    Injected { slot: u64 },
    #[error("slot {slot} holds no page (read of a slot never written)")]
    Empty { slot: u64 },
    /// The stored data failed its check: it does not decompress to a page, or its checksum
    /// or authentication tag does not match (the engine counts it as a checksum error).
    #[error("slot {slot}: stored data failed its check (does not decompress, or checksum mismatch)")]
    Corrupt { slot: u64 },
    /// A remote store could not serve the request (no primary reachable in time, replicas
    /// not acknowledging a write, a page missing after a failover). The reason is static
    /// text: errors are dropped on the signal-mode fault path, which must not free memory.
    #[error("slot {slot}: {why}")]
    Remote { slot: u64, why: &'static str },
    /// The device declines to store the page (it goes to the next device instead).
    #[error("slot {slot}: device declined the page ({reason})")]
    Rejected { slot: u64, reason: RejectReason },
}

impl BackendError {
    /// What went wrong, in a few words and without the slot: static text, so that the
    /// signal-mode fault path can keep it (`PageError::cause`) and print it before SIGBUS.
    pub fn cause(&self) -> &'static str {
        match self {
            BackendError::Io { .. } => "an I/O error",
            BackendError::OutOfRange { .. } => "a slot beyond the device",
            BackendError::Injected { .. } => "an injected failure",
            BackendError::Empty { .. } => "the slot holds no page",
            BackendError::Corrupt { .. } => "the stored data failed its check",
            BackendError::Remote { why, .. } => why,
            BackendError::Rejected { .. } => "the device declined the page",
        }
    }
}

/// Why a device declined a page (zswap's reject counters).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RejectReason {
    /// The pool is at its size cap (or has not yet drained below its accept threshold).
    PoolFull,
    /// The page did not compress below the threshold and the device passes such pages on.
    Incompressible,
}

impl std::fmt::Display for RejectReason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            RejectReason::PoolFull => "pool full",
            RejectReason::Incompressible => "incompressible",
        })
    }
}

/// Counters a device may report (the compressed pool reports zswap's).
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(default)]
pub struct BackendStats {
    /// Bytes of memory the device holds (pool footprint), if it lives in RAM.
    pub pool_bytes: u64,
    /// The most `pool_bytes` held at once since the device started.
    pub pool_peak_bytes: u64,
    /// Pages stored.
    pub stored_pages: u64,
    /// Of those, pages filled with one repeated 64-bit word, stored as that word alone: no
    /// pool bytes, no compressed bytes (zram's `same_pages`).
    pub same_filled_pages: u64,
    /// Pages stored as one repeated word since the device started (a count of writes; the
    /// pages stored so now are `same_filled_pages`).
    pub same_filled_stores: u64,
    /// Of those, pages that did not compress and were stored as they are.
    pub incompressible_pages: u64,
    /// Bytes of compressed data (before size-class rounding).
    pub compressed_bytes: u64,
    /// Bytes of the pool's objects: the compressed data of each, its header, and its
    /// size class's rounding (a class larger than its length needs included). Of
    /// `pool_bytes`, what is not in objects is room its chunks have left (fragmentation).
    pub object_bytes: u64,
    /// Chunks (64 KiB) the pool's compaction emptied and freed, since the device started
    /// (zram's `pages_compacted`).
    pub compacted_chunks: u64,
    /// Units stored now (pages compressed together as one object: `zpool:...:unit=SIZE`),
    /// and the stored pages they hold.
    pub units: u64,
    pub unit_pages: u64,
    /// Groups of pages meant for a unit and stored page by page (they did not compress into
    /// a page, or no row was free), since the device started.
    pub unit_fallbacks: u64,
    /// Memory of the pool's trained zstd dictionary (`zpool:zstd-N:dict`), counted in
    /// `pool_bytes`: 0 until it is trained, and without one.
    pub dictionary_bytes: u64,
    /// Memory the pool's codecs hold whatever it stores, not in `pool_bytes` (nor against
    /// its cap): workspaces (four per CPU), a zstd pool's contexts (two per CPU, about 170
    /// KB each), a dictionary's contexts, and its samples while they are taken.
    pub codec_bytes: u64,
    /// Pools whose dictionary could not be trained (they go on compressing without one).
    pub dictionary_failures: u64,
    /// Pools compressing new pages with their dictionary now (a pool stops while its
    /// dictionary costs bytes, checked on one page in 32 compressed both ways).
    pub dictionary_in_use: u64,
    /// Times a pool turned its dictionary off for costing bytes.
    pub dictionary_turned_off: u64,
    /// Stored pages per byte of pool: `stored_pages * PAGE_SIZE / pool_bytes` (0 while the
    /// pool holds no chunk). Same-filled pages count as stored pages taking no pool bytes, as
    /// zram counts them in `orig_data_size` and not in `compr_data_size`.
    pub compression_ratio: f64,
    pub reject_pool_full: u64,
    pub reject_incompressible: u64,
    /// Writes refused because no memory was left for the object.
    pub reject_alloc_fail: u64,
    /// Discards that failed (hole punching unsupported, ...); nothing is lost.
    pub discard_errors: u64,
    /// Times a remote device switched to another primary (the Redis tier's failovers).
    pub failovers: u64,
    /// Commands a Redis Cluster node sent to another node (`MOVED`, `ASK`), followed.
    pub redirects: u64,
    /// Pages a remote device could not find or could not check (read errors it reported:
    /// missing after a failover, or a value failing its authentication).
    pub remote_read_errors: u64,
}

/// Write the pages of `data` to consecutive slots starting at `slot`. The pages are staged
/// pages the engine owns for the duration of the call; they are handed over as a [`PageRun`]
/// (copy out, read a page in place for the length of a closure, or take the address for
/// I/O) rather than as a slice.
pub struct WriteReq<'a> {
    pub slot: u64,
    pub data: PageRun<'a>,
    pub result: Result<(), BackendError>,
}

pub use crate::mapping::AlignedPage;

/// Slots per swap cluster (the kernel's `SWAPFILE_CLUSTER`): the swap layer allocates and
/// frees slots by cluster, and devices discard (punch out) whole clusters.
pub const SWAPFILE_CLUSTER: usize = 512;

/// Read consecutive slots starting at `slot` into `buf`, one page per slot. The pages are
/// contiguous in memory, so a device may read the whole run with one I/O.
pub struct ReadReq<'a> {
    pub slot: u64,
    pub buf: &'a mut [AlignedPage],
    pub result: Result<(), BackendError>,
}

impl<'a> WriteReq<'a> {
    pub fn new(slot: u64, data: PageRun<'a>) -> Self {
        WriteReq { slot, data, result: Ok(()) }
    }
    pub fn nr_pages(&self) -> u64 {
        self.data.nr_pages() as u64
    }
}

impl<'a> ReadReq<'a> {
    pub fn new(slot: u64, buf: &'a mut [AlignedPage]) -> Self {
        debug_assert!(!buf.is_empty());
        ReadReq { slot, buf, result: Ok(()) }
    }
    pub fn nr_pages(&self) -> u64 {
        self.buf.len() as u64
    }
}

/// One run of an asynchronous read: `nr_pages` consecutive slots from `slot`, into the
/// reader's buffer from page `first_page` on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AsyncRun {
    pub slot: u64,
    pub first_page: usize,
    pub nr_pages: usize,
}

/// A queue and a buffer of their own for asynchronous readahead, on a device where a read
/// takes long enough to be worth overlapping with the application's work (a file or block
/// device). The reader owns its buffer and hands it out only when nothing is in flight, so
/// the kernel never writes memory the engine is looking at.
///
/// Like [`Backend::read`], every method may run inside a SIGBUS handler: no allocation, no
/// lock, failures reported through results.
pub trait AsyncReader: Send {
    /// Pages the buffer holds.
    fn capacity_pages(&self) -> usize;
    /// Starts reading `runs` (each inside the device and inside the buffer, at most
    /// [`Self::capacity_pages`] runs) and returns at once. False if nothing was started: reads
    /// still in flight, a run out of range, or the queue refused them.
    fn start(&mut self, runs: &[AsyncRun]) -> bool;
    /// Whether reads started are not yet waited for.
    fn in_flight(&self) -> bool;
    /// Waits until every read started has finished (completing short reads synchronously)
    /// and sets `results[i]` for run `i` of the last `start`.
    fn wait(&mut self, results: &mut [Result<(), BackendError>]);
    /// The buffer, or `None` while reads are in flight.
    fn pages(&self) -> Option<&[AlignedPage]>;
    /// The buffer for changing it (fault injection), or `None` while reads are in flight.
    fn pages_mut(&mut self) -> Option<&mut [AlignedPage]>;
}

/// Page storage behind a swap device.
pub trait Backend: Send + Sync {
    /// Short name for stats and messages (`ram`, `zpool`, `file:/path`).
    fn name(&self) -> String;

    /// Capacity in slots (pages).
    fn nr_slots(&self) -> u64;

    /// Stores each request's pages; sets each request's `result`.
    fn write(&self, reqs: &mut [WriteReq<'_>]);

    /// Loads each request's pages; sets each request's `result`. May run in a signal handler.
    fn read(&self, reqs: &mut [ReadReq<'_>]);

    /// The slots `[slot, slot + nr)` hold nothing the engine needs any more: the backend may
    /// drop their storage (return memory, punch a hole).
    fn discard(&self, _slot: u64, _nr: u64) {}

    /// Slot `slot` was freed: drop whatever the device keeps for it (`zswap_invalidate`).
    /// Called for every freed slot, before the slot can be allocated again. Must not block on
    /// a lock the caller could hold (it may run on the signal-mode fault path).
    fn invalidate(&self, _slot: u64) {}

    /// False while the device takes no new pages (a pool at its cap): allocation then skips
    /// it and pages go to the next device.
    fn accepting(&self) -> bool {
        true
    }

    /// Whether every part of the device can take writes as durable as asked, checked before
    /// the probe write of a degraded device (`swap::health`). A sharded device (a Redis
    /// Cluster) says no while any shard cannot: its one probe write may land on a healthy
    /// shard, and taking pages again would send the next batch for the bare shard to wait
    /// out its timeout and degrade the device again, once a probe period. Engine threads
    /// only; may take a round trip to each part.
    fn writable(&self) -> Result<(), BackendError> {
        Ok(())
    }

    /// Whether a fork child may read this device's pages from its copy of the process's
    /// memory (a RAM device, the compressed pool): its contents live only in memory the
    /// child inherits copy-on-write, and its reads take no lock (a lock held by another
    /// thread at the fork would never be released in the child). Devices whose pages live
    /// elsewhere (a file, Redis) are not.
    fn inheritable(&self) -> bool {
        false
    }

    /// Whether a fork child may read this device's pages where they are, the device being
    /// shared rather than copied: a swap file or block device, read through the child's copy
    /// of the descriptor, or a Redis store, read on connections of the child's own
    /// ([`enter_fork_child`](Backend::enter_fork_child)). The parent then
    /// keeps each slot a child may read until the child lets go of it (`swap::fork_refs`).
    /// Devices that are neither this nor [`inheritable`](Backend::inheritable) have their
    /// pages brought in before a fork.
    fn shared_with_fork_children(&self) -> bool {
        false
    }

    /// In a fork child, on its copy of the parent's device, before the first read: reads
    /// from now on use nothing that the parent's threads use too (a file device's io_uring
    /// rings, whose queues the child would share), and no lock.
    fn enter_fork_child(&self) {}

    /// The device is dropped while fork children may still read it (a
    /// [`shared_with_fork_children`](Backend::shared_with_fork_children) device): what it
    /// would erase on drop, it must leave (a Redis device's keys).
    fn outlived_by_children(&self) {}

    /// For an [`inheritable`](Backend::inheritable) device: whether a fork child gets a
    /// copy-on-write copy of the memory its reads use (around a fork, see
    /// `Pager::prepare_fork_to_rearm`; off again in the parent after it).
    fn set_inherited(&self, _inherit: bool) {}

    /// For a device that holds its pages in this process's memory: where to report that
    /// memory as it grows and shrinks, beside other pagers' (a `uswap run` tree's pools).
    /// Called once, before the device is used.
    fn share_pool(&self, _share: crate::shared_charge::PoolShare) {}

    /// Slots whose pages should move to a lower tier, oldest first, when the device wants
    /// room (a pool above its accept threshold). Writes up to `out.len()`; returns how many.
    fn writeback_candidates(&self, _out: &mut [u64]) -> usize {
        0
    }

    /// Called now and then from the background thread: a chance to get ready for upcoming
    /// writes off the fault path (the pool populates arena memory ahead of use, so that the
    /// kernel's zeroing of fresh pages is not paid during reclaim). Must not change the page
    /// tables of existing mappings in a way that needs a TLB flush. Returns whether it did
    /// anything: the background thread keeps its short period while a device prepares.
    fn prepare(&self) -> bool {
        false
    }

    /// Called now and then from the background thread: gives memory the device holds and
    /// no longer uses back to the kernel (the pool's free chunks beyond a reserve). Unlike
    /// `prepare` it may drop pages of the device's own mappings (a TLB flush per batch).
    /// Returns the bytes given back.
    fn trim(&self) -> u64 {
        0
    }

    /// The device's own counters, if it keeps any.
    fn stats(&self) -> Option<BackendStats> {
        None
    }

    /// Whether a write waits for something much slower than memory: a disk (the file
    /// device's `O_DIRECT` writes) or the network (the Redis tier's `MSET` and a replica's
    /// acknowledgement, hundreds of µs). A pager with such a device reclaims from its
    /// background thread by default (`BackgroundReclaim::Auto`), so that the faulting thread
    /// does not wait for those writes (BENCHMARKS.md, "The Redis tier";
    /// docs/bench/design-measurements.md, "Background reclaim for slow devices").
    fn slow_writes(&self) -> bool {
        false
    }

    /// Whether a write costs the CPU several times what lz4 does (a zstd pool's
    /// compression: 6-12 µs a page against 2). With such a device first, a pager has its
    /// background thread do the writes while the faulting threads move the victims out
    /// (`BackgroundReclaim::StageTwo`): a CPython job swapping through a zstd pool with a
    /// dictionary ran 1.35x as fast on 2 vCPUs (BENCHMARKS.md, "Memory per swapped page").
    fn dear_writes(&self) -> bool {
        false
    }

    /// A reader for asynchronous readahead with a buffer of `nr_pages`, if reads on this
    /// device are slow enough to overlap (see [`AsyncReader`]). Called at start-up only.
    fn async_reader(&self, _nr_pages: usize) -> Option<Box<dyn AsyncReader>> {
        None
    }

    /// Where slot `slot`'s page can be read in place, if the backend keeps pages uncompressed
    /// in this address space; lets the fault path hand it straight to `UFFDIO_COPY` with no
    /// bounce copy. Valid until the slot is written or discarded.
    fn page_ptr(&self, _slot: u64) -> Option<*const u8> {
        None
    }
}
