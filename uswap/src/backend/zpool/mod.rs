//! The compressed RAM pool: zswap's role, in front of slower devices.
//!
//! Each slot holds one of: nothing; a page filled with one repeated 64-bit word (zeros
//! included), stored as that word alone; a compressed page (lz4 by default, zstd as an
//! option); or, for a page that does not compress below the threshold, the page as it is
//! (or nothing: with [`Incompressible::Reject`] the device declines it and the engine sends
//! it to the next device).
//!
//! Same-filled pages (zram's `ZRAM_SAME`, zswap's former `same_filled_pages`): a page whose
//! 4 KiB are one 64-bit word repeated (zeros included, should one reach the device: the
//! engine keeps no slot for a page found all zero when staging, `swpout_zero`) keeps no
//! object in the arena. Its slot's entry says `KIND_SAME` and the slot's second word holds
//! the word; a read fills the page with it, an invalidation frees nothing. The test
//! (`same_filled_word`) compares words, bails out at the first that differs, and runs once
//! per page written, before compression. Such a page costs no pool bytes, so it is taken
//! even while the pool is full and is never offered for writeback; in the counters it is a
//! stored page (`stored_pages`, and so in `compression_ratio`'s numerator, as zram counts it
//! in `orig_data_size`) with no compressed bytes (`compressed_bytes`, as zram's
//! `compr_data_size`); `same_filled_pages` counts those stored now (zram's `same_pages`),
//! `same_filled_stores` every one stored since the device started.
//!
//! Units (issue 46's multi-page units; the kernel's counterpart is mTHP swap to zswap and
//! zram): with `unit_pages` above 1 (`zpool:...:unit=16KiB`), the pages of one write request
//! that are not same-filled are compressed `unit_pages` at a time as one object, so that
//! zstd finds what neighbouring pages share (a 16 KiB unit of zstd-1 stored 0.80x the bytes
//! of single pages of CPython's heap, 0.69x of sqlite3's). The object's entry lives in the
//! unit table (`units.rs`), in the row of its head, one of its members' slots whose row was
//! free; each member's slot entry names the head and its index. A read decompresses the
//! whole unit (a read of several members decompresses it once) and copies its page out; an
//! invalidation clears the member's bit, and the last one frees the object. A unit is tried
//! only when the pool's recent bytes per page say that it fits one object of at most a
//! page; one that does not fit, or finds no free row, is stored as two halves, each the same
//! way, down to single pages. Units stay in the pool: writeback offers single pages only (a unit's pages are
//! moved down a tier page by page by idle aging, through reads). Meant for a tier of cold
//! pages, where a fault pays the unit's decompression (16 KiB of zstd-1: 3-9 us).
//!
//! The pool's footprint is the chunks in use; at `cap_bytes` it stops accepting pages until
//! it drains below `accept_threshold_percent` of the cap (zswap's hysteresis), and meanwhile
//! offers its oldest slots for writeback to the next device.
//!
//! Parts, each owning its share of the pool's state (no file adds `impl` blocks to another's
//! type):
//! * `config.rs`: [`ZpoolConfig`], [`Compressor`], [`Incompressible`], [`ZpoolError`]; a
//!   leaf, imported by the others;
//! * `allocator.rs`: `Allocator`, the arena: places compressed objects (chunks and size
//!   classes), encodes slot entries, counts the chunks in use (and reports them to a shared
//!   charge), populates ahead of use, compacts, gives free chunks' memory back, picks the
//!   chunk writeback sheds;
//! * `codec.rs`: `Codecs`, compression and decompression (lz4, zstd) with pre-allocated
//!   contexts and workspaces, and the pool's zstd dictionary once trained;
//! * `dictionary.rs`: `Sampler`, the pages a zstd dictionary is trained from
//!   (`zpool:zstd-N:dict`), and the training, which the background thread runs (`trim`);
//! * `units.rs`: `UnitTable`, the rows of a pool's units, which of their pages are stored,
//!   and how many pages a unit can hold;
//! * this module: [`ZpoolBackend`], which holds one of each with the slot table, the cap
//!   (its full flag) and the counters, and the [`Backend`] impl. It imports its children;
//!   none imports it but `tests.rs`, its unit tests.
//!
//! Locking (in the hierarchy of `crate::sync`): slot entries are atomics written by the
//! slot's owner (the engine never writes a slot twice without invalidating it, nor reads
//! one while writing it) and by compaction, which moves an object with a compare-and-swap
//! of its entry and so never undoes an owner's write. Reads take no lock: they copy the
//! object, then check that the entry still names it (a seqlock's read; see `load_page`).
//! The allocator's locks are described in `allocator.rs`; the codecs take none. Nothing
//! allocates on any path and every path is safe in a SIGBUS handler.
//!
//! A unit's row is filled before its members' entries are published (see `units.rs`);
//! compaction moves a unit's object by a compare-and-swap of its row's entry.
//!
//! Invariants: an object is live iff its slot's entry (a unit's: its row's) points at it
//! (each object starts with the number of the slot that owns it, or its unit's head with
//! `UNIT_ID`, so writeback and compaction find a chunk's live objects); a unit's row has a
//! member's bit set iff that member's slot entry names it.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use super::{Backend, BackendError, BackendStats, ReadReq, RejectReason, WriteReq};
use crate::mapping::AtomicTable;
use crate::shared_charge::PoolShare;
use crate::uffd::PAGE_SIZE;
use allocator::Allocator;
use codec::{Codecs, Workspace};
use encoding::{
    entry, entry_kind, entry_len, entry_member, entry_object_bytes, member_entry, KIND_COMPRESSED, KIND_EMPTY,
    KIND_RAW, KIND_SAME, UNIT_ID,
};
use units::UnitTable;

mod allocator;
mod codec;
mod config;
mod dictionary;
mod encoding;
mod units;

pub use allocator::check_cap;
pub use encoding::CHUNK_BYTES;

/// Room in the pool's chunks (bytes not in objects) past which `trim` looks for classes
/// to compact: a 64th of the pool, and at least 1 MiB. Part of the room is each chunk's
/// tail that no object of its class fits (up to 6 % for the largest classes), which
/// compaction cannot take back; each class's own rule (see `Allocator::compact`) tells.
/// At an eighth, redis-server's pool never compacted: its room was 3 % of it, a partial
/// chunk's worth in many classes.
const COMPACT_ROOM_DIVISOR: u64 = 64;
const COMPACT_MIN_ROOM_BYTES: u64 = 1 << 20;
/// Objects one `trim` moves at most (copies of up to a page each: about a millisecond).
const COMPACT_BUDGET_OBJECTS: u64 = 2048;
/// Compaction's period at most: each pass takes every class's lock once, which stores on
/// the fault path may want (the background thread calls `trim` every 5 ms while it works).
const COMPACT_PERIOD_MS: u64 = 50;
/// Reads of a slot whose object compaction moved while it was read, before giving up
/// (a retry each move; an object moves once per compaction pass).
const LOAD_ATTEMPTS: usize = 4;
pub use config::{Compressor, Incompressible, ZpoolConfig, ZpoolError, MAX_UNIT_PAGES, ZSTD_LEVELS};

pub struct ZpoolBackend {
    cfg: ZpoolConfig,
    /// Two words per slot (see `encoding::entry`).
    slots: AtomicTable,
    /// With units: where each unit's object is (see `units.rs`).
    units: Option<UnitTable>,
    /// The arena and its chunks.
    alloc: Allocator,
    /// The codec, its workspaces and contexts.
    codecs: Codecs,
    full: AtomicBool,
    stored_pages: AtomicU64,
    same_filled: AtomicU64,
    /// Same-filled pages stored since the device started (requests that succeeded).
    same_filled_stores: AtomicU64,
    incompressible: AtomicU64,
    compressed_bytes: AtomicU64,
    /// Bytes of the objects stored (see `BackendStats::object_bytes`).
    object_bytes: AtomicU64,
    /// Chunks compaction emptied and freed.
    compacted_chunks: AtomicU64,
    /// When the pool was made, and when `trim` may compact next (ms after it).
    created_ns: u64,
    next_compact_ms: AtomicU64,
    reject_pool_full: AtomicU64,
    reject_incompressible: AtomicU64,
    reject_alloc_fail: AtomicU64,
}

impl ZpoolBackend {
    pub fn new(cfg: ZpoolConfig) -> Result<ZpoolBackend, ZpoolError> {
        let alloc = Allocator::new(cfg.cap_bytes)?;
        let map_err = |source| ZpoolError::Map { bytes: alloc.arena_bytes(), source };
        let slots = AtomicTable::new(2 * cfg.nr_slots as usize).map_err(map_err)?;
        if !(1..=MAX_UNIT_PAGES).contains(&cfg.unit_pages) {
            return Err(ZpoolError::UnitPages { unit_pages: cfg.unit_pages });
        }
        if cfg.unit_pages > 1 && cfg.nr_slots >= UNIT_ID {
            return Err(ZpoolError::UnitSlots { nr_slots: cfg.nr_slots });
        }
        let units = match cfg.unit_pages {
            1 => None,
            _ => Some(UnitTable::new(cfg.nr_slots).map_err(map_err)?),
        };
        let codecs = Codecs::new(cfg.compressor, cfg.unit_pages, cfg.dictionary)?;
        Ok(ZpoolBackend {
            slots,
            units,
            alloc,
            codecs,
            full: AtomicBool::new(false),
            stored_pages: AtomicU64::new(0),
            same_filled: AtomicU64::new(0),
            same_filled_stores: AtomicU64::new(0),
            incompressible: AtomicU64::new(0),
            compressed_bytes: AtomicU64::new(0),
            object_bytes: AtomicU64::new(0),
            compacted_chunks: AtomicU64::new(0),
            created_ns: crate::clock::now_ns(),
            next_compact_ms: AtomicU64::new(0),
            reject_pool_full: AtomicU64::new(0),
            reject_incompressible: AtomicU64::new(0),
            reject_alloc_fail: AtomicU64::new(0),
            cfg,
        })
    }

    /// Bytes of memory the pool uses for pages: chunks in use, and its zstd dictionary
    /// (needed to read what was compressed with it).
    pub fn pool_bytes(&self) -> u64 {
        self.alloc.pool_bytes() + self.codecs.dictionary_bytes()
    }

    fn accept_limit_bytes(&self) -> u64 {
        self.cfg.cap_bytes * self.cfg.accept_threshold_percent as u64 / 100
    }

    /// Updates the full flag: set at the cap, cleared below the accept threshold.
    /// Full at the cap, of this pool or, under a shared charge, of the tree's pools
    /// together (the cap is the tree's; see `crate::shared_charge::PoolShare`); accepting
    /// again below the accept threshold of the same.
    fn update_full(&self) {
        let bytes = self.alloc.capped_bytes();
        if bytes >= self.cfg.cap_bytes {
            self.full.store(true, Ordering::Relaxed);
        } else if bytes < self.accept_limit_bytes() {
            self.full.store(false, Ordering::Relaxed);
        }
    }

    /// Stores one page into `slot`: returns whether it was same-filled (stored as its word).
    /// On rejection nothing is stored.
    fn store_page(
        &self,
        slot: u64,
        page: &[u8],
        scratch: &mut [u8],
        lz4: &mut lz4_flex::block::CompressTable,
    ) -> Result<bool, BackendError> {
        let e = &self.slots[2 * slot as usize];
        debug_assert_eq!(e.load(Ordering::Relaxed), KIND_EMPTY, "slot {slot} written twice");
        if let Some(word) = same_filled_word(page) {
            self.store_same(slot, word);
            return Ok(true);
        }
        self.check_not_full(slot)?;
        let compressed = self.codecs.compress(page, scratch, lz4);
        if let Some(units) = &self.units {
            units.note_compressed(compressed.unwrap_or(PAGE_SIZE), 1);
        }
        let (kind, data): (u64, &[u8]) = match compressed {
            Some(n) if n < self.cfg.incompressible_threshold_bytes => (KIND_COMPRESSED, &scratch[..n]),
            _ => match self.cfg.incompressible {
                Incompressible::StoreRaw => (KIND_RAW, page),
                Incompressible::Reject => {
                    self.reject_incompressible.fetch_add(1, Ordering::Relaxed);
                    return Err(BackendError::Rejected { slot, reason: RejectReason::Incompressible });
                }
            },
        };
        let Some(stored) = self.alloc.store(kind, slot, data) else {
            self.reject_alloc_fail.fetch_add(1, Ordering::Relaxed);
            self.full.store(true, Ordering::Relaxed);
            return Err(BackendError::Rejected { slot, reason: RejectReason::PoolFull });
        };
        e.store(stored, Ordering::Release);
        if kind == KIND_RAW {
            self.incompressible.fetch_add(1, Ordering::Relaxed);
        }
        self.compressed_bytes.fetch_add(data.len() as u64, Ordering::Relaxed);
        self.object_bytes.fetch_add(entry_object_bytes(stored), Ordering::Relaxed);
        self.stored_pages.fetch_add(1, Ordering::Relaxed);
        self.update_full();
        Ok(false)
    }

    /// Stores a page filled with `word` into `slot` as the word alone.
    fn store_same(&self, slot: u64, word: u64) {
        // The word before the entry that says it is there (a reader loads the entry with
        // Acquire, then the word).
        self.slots[2 * slot as usize + 1].store(word, Ordering::Relaxed);
        self.slots[2 * slot as usize].store(entry(KIND_SAME, 0, 0, 0, 0), Ordering::Release);
        self.same_filled.fetch_add(1, Ordering::Relaxed);
        self.stored_pages.fetch_add(1, Ordering::Relaxed);
    }

    /// Refuses a page while the pool is full (see `update_full`), counted.
    fn check_not_full(&self, slot: u64) -> Result<(), BackendError> {
        if self.full.load(Ordering::Relaxed) {
            self.reject_pool_full.fetch_add(1, Ordering::Relaxed);
            return Err(BackendError::Rejected { slot, reason: RejectReason::PoolFull });
        }
        Ok(())
    }

    /// Stores the pages of request `r` one by one; all or nothing (the pages stored are
    /// undone on an error). Returns how many were same-filled.
    fn write_pages(&self, r: &WriteReq<'_>, ws: &mut Workspace) -> Result<u64, BackendError> {
        let Workspace { out, lz4, .. } = ws;
        let mut same_filled = 0;
        for i in 0..r.nr_pages() {
            // Compressed where it lies: a copy first cost 4 % of pmbench's CPU.
            match r.data.with_page(i as usize, |page| self.store_page(r.slot + i, page, &mut out.0, lz4)) {
                Ok(same) => same_filled += same as u64,
                Err(e) => {
                    for j in 0..i {
                        self.invalidate(r.slot + j);
                    }
                    return Err(e);
                }
            }
        }
        Ok(same_filled)
    }

    /// Stores the pages of request `r` in units (see "Units" above): same-filled pages as
    /// their word, the others gathered `unit_pages` at a time into `ws.unit`, each group
    /// stored as one unit or, failing that, page by page. All or nothing: on an error every
    /// slot of the request is emptied (those not written yet are empty already). Returns how
    /// many pages were same-filled.
    fn write_units(&self, r: &WriteReq<'_>, ws: &mut Workspace) -> Result<u64, BackendError> {
        let mut group = [0u64; MAX_UNIT_PAGES];
        let (mut nr_group, mut same_filled) = (0, 0);
        let mut result = Ok(());
        for i in 0..r.nr_pages() {
            let dst = &mut ws.unit[nr_group * PAGE_SIZE..(nr_group + 1) * PAGE_SIZE];
            let word = r.data.with_page(i as usize, |page| {
                let word = same_filled_word(page);
                if word.is_none() {
                    dst.copy_from_slice(page);
                }
                word
            });
            if let Some(word) = word {
                self.store_same(r.slot + i, word);
                same_filled += 1;
                continue;
            }
            group[nr_group] = r.slot + i;
            nr_group += 1;
            if nr_group == self.cfg.unit_pages {
                result = self.store_group(&group[..nr_group], 0, ws);
                nr_group = 0;
                if result.is_err() {
                    break;
                }
            }
        }
        // The last group, however the request ended (a same-filled last page too).
        if result.is_ok() && nr_group > 0 {
            result = self.store_group(&group[..nr_group], 0, ws);
        }
        if let Err(e) = result {
            for i in 0..r.nr_pages() {
                self.invalidate(r.slot + i);
            }
            return Err(e);
        }
        Ok(same_filled)
    }

    /// Stores the pages gathered in `ws.unit` for `slots` (from page `first` of it) as units:
    /// whole if they are several, the bytes per page compressed lately say that they fit one
    /// object of at most a page, and one of their rows is free; otherwise as two halves, each
    /// the same way, down to single pages (a depth of log2 of `MAX_UNIT_PAGES`). On an error,
    /// some may be stored (the caller undoes them).
    fn store_group(&self, slots: &[u64], first: usize, ws: &mut Workspace) -> Result<(), BackendError> {
        assert!(!slots.is_empty() && slots.len() <= self.cfg.unit_pages);
        let Workspace { out, lz4, unit } = ws;
        let nr = slots.len();
        if nr == 1 {
            let page = &unit[first * PAGE_SIZE..][..PAGE_SIZE];
            return self.store_page(slots[0], page, &mut out.0, lz4).map(|_| ());
        }
        let units = self.units.as_ref().expect("a pool storing units has a unit table");
        if let (true, Some(head)) = (units.may_fit(nr), units.free_head(slots)) {
            self.check_not_full(head)?;
            let pages = &unit[first * PAGE_SIZE..(first + nr) * PAGE_SIZE];
            let n = self.codecs.compress(pages, &mut out.0, lz4).filter(|&n| n <= PAGE_SIZE);
            // Did not fit: at least a page for these pages.
            units.note_compressed(n.unwrap_or(PAGE_SIZE + PAGE_SIZE / 4), nr);
            if let Some(n) = n {
                return self.store_unit(units, head, slots, &out.0[..n]);
            }
            units.note_fallback();
        }
        let half = nr / 2;
        self.store_group(&slots[..half], first, ws)?;
        self.store_group(&slots[half..], first + half, ws)
    }

    /// Places a unit's compressed bytes `data` and publishes it: its row at `head` (free, and
    /// only this writer can fill it: `head` is one of the slots it writes), then its members'
    /// entries.
    fn store_unit(&self, units: &UnitTable, head: u64, slots: &[u64], data: &[u8]) -> Result<(), BackendError> {
        let Some(stored) = self.alloc.store(KIND_COMPRESSED, head | UNIT_ID, data) else {
            self.reject_alloc_fail.fetch_add(1, Ordering::Relaxed);
            self.full.store(true, Ordering::Relaxed);
            return Err(BackendError::Rejected { slot: head, reason: RejectReason::PoolFull });
        };
        units.fill(head, slots.len(), stored);
        for (index, &slot) in slots.iter().enumerate() {
            let e = &self.slots[2 * slot as usize];
            debug_assert_eq!(e.load(Ordering::Relaxed), KIND_EMPTY, "slot {slot} written twice");
            e.store(member_entry(head, index), Ordering::Release);
        }
        self.compressed_bytes.fetch_add(data.len() as u64, Ordering::Relaxed);
        self.object_bytes.fetch_add(entry_object_bytes(stored), Ordering::Relaxed);
        self.stored_pages.fetch_add(slots.len() as u64, Ordering::Relaxed);
        self.update_full();
        Ok(())
    }

    /// Reads slot `slot` into `dst`. Takes no lock: the object is copied out (the compressed
    /// bytes into `scratch`), then the entry and its chunk's generation are read again, as a
    /// seqlock's reader does, since compaction may move the object meanwhile and its old
    /// place then be reused; a copy whose entry or generation changed is taken again from
    /// where the entry points now.
    fn load_page(
        &self,
        slot: u64,
        dst: &mut [u8; PAGE_SIZE],
        ws: &mut Workspace,
        last: &mut LastUnit,
    ) -> Result<(), BackendError> {
        let e = self.slots[2 * slot as usize].load(Ordering::Acquire);
        match entry_member(e) {
            Some((head, index)) => self.load_member(slot, head, index, dst, ws, last),
            None => self.load_page_from(slot, e, dst, &mut ws.out.0),
        }
    }

    /// Reads page `index` of the unit whose head is `head` (for slot `slot`, a live member)
    /// into `dst`: decompresses the unit into `ws.unit` unless `last` says that it holds it
    /// already (a read of its neighbours, in the same call). As `load_page_from`, a seqlock's
    /// read against compaction.
    fn load_member(
        &self,
        slot: u64,
        head: u64,
        index: usize,
        dst: &mut [u8; PAGE_SIZE],
        ws: &mut Workspace,
        last: &mut LastUnit,
    ) -> Result<(), BackendError> {
        let Some(row) = self.units.as_ref().and_then(|u| u.row_entry(head)) else {
            return Err(BackendError::Corrupt { slot });
        };
        let page = index * PAGE_SIZE..(index + 1) * PAGE_SIZE;
        for _ in 0..LOAD_ATTEMPTS {
            let e = row.load(Ordering::Acquire);
            if entry_kind(e) != KIND_COMPRESSED {
                return Err(BackendError::Corrupt { slot }); // a live member's unit is stored
            }
            if *last == Some((head, e)) {
                dst.copy_from_slice(&ws.unit[page]);
                return Ok(());
            }
            let generation = self.alloc.generation(e);
            self.alloc.load(e, &mut ws.out.0[..entry_len(e)]);
            std::sync::atomic::fence(Ordering::Acquire);
            if row.load(Ordering::Acquire) != e || self.alloc.generation(e) != generation {
                continue;
            }
            *last = None;
            let n = self.codecs.decompress_into(&ws.out.0[..entry_len(e)], &mut ws.unit);
            if n.is_none_or(|n| n < page.end || n % PAGE_SIZE != 0) {
                return Err(BackendError::Corrupt { slot });
            }
            *last = Some((head, e));
            dst.copy_from_slice(&ws.unit[page]);
            return Ok(());
        }
        Err(BackendError::Io { slot, source: std::io::Error::from_raw_os_error(libc::EAGAIN) })
    }

    /// `load_page` once the slot's entry read `e` (a test reads it, then moves the object).
    fn load_page_from(
        &self,
        slot: u64,
        mut e: u64,
        dst: &mut [u8; PAGE_SIZE],
        scratch: &mut [u8],
    ) -> Result<(), BackendError> {
        let entry_word = &self.slots[2 * slot as usize];
        for _ in 0..LOAD_ATTEMPTS {
            let kind = entry_kind(e);
            let generation = self.alloc.generation(e);
            match kind {
                KIND_SAME => {
                    let w = self.slots[2 * slot as usize + 1].load(Ordering::Relaxed).to_ne_bytes();
                    for d in dst.chunks_exact_mut(8) {
                        d.copy_from_slice(&w);
                    }
                    return Ok(());
                }
                KIND_RAW => self.alloc.load(e, dst),
                KIND_COMPRESSED => self.alloc.load(e, &mut scratch[..entry_len(e)]),
                _ => return Err(BackendError::Empty { slot }),
            }
            // The copy's loads before the second loads of the entry and the generation.
            std::sync::atomic::fence(Ordering::Acquire);
            let now = entry_word.load(Ordering::Acquire);
            if now != e || self.alloc.generation(e) != generation {
                e = now;
                continue;
            }
            if kind == KIND_COMPRESSED && !self.codecs.decompress(&scratch[..entry_len(e)], dst) {
                return Err(BackendError::Corrupt { slot });
            }
            return Ok(());
        }
        // Moved on every attempt: the engine counts a failed read and tries again.
        Err(BackendError::Io { slot, source: std::io::Error::from_raw_os_error(libc::EAGAIN) })
    }

    /// Empties a unit member's slot: the last member frees the unit's object.
    fn invalidate_member(&self, head: u64, index: usize) {
        let Some(e) = self.units.as_ref().and_then(|u| u.release(head, index)) else { return };
        self.compressed_bytes.fetch_sub(entry_len(e) as u64, Ordering::Relaxed);
        self.object_bytes.fetch_sub(entry_object_bytes(e), Ordering::Relaxed);
        self.alloc.free(e);
        self.update_full();
    }

    /// The entry word that the object header `id` names: a slot's, or a unit's row.
    fn owner_entry(&self, id: u64) -> Option<&AtomicU64> {
        let nr_slots = self.cfg.nr_slots;
        match (id & UNIT_ID != 0, &self.units) {
            (false, _) => (id < nr_slots).then(|| &self.slots[2 * id as usize]),
            (true, Some(units)) => units.row_entry(id & !UNIT_ID),
            (true, None) => None,
        }
    }

    /// One compaction pass of up to [`COMPACT_BUDGET_OBJECTS`] objects (see
    /// `Allocator::compact`). Returns the chunks it freed.
    fn compact(&self) -> u64 {
        let (_, freed) = self.alloc.compact(COMPACT_BUDGET_OBJECTS, |id| self.owner_entry(id));
        self.compacted_chunks.fetch_add(freed, Ordering::Relaxed);
        if freed > 0 {
            self.update_full();
        }
        freed
    }

    fn check(&self, slot: u64, nr: u64) -> Result<(), BackendError> {
        if slot + nr > self.cfg.nr_slots {
            return Err(BackendError::OutOfRange { slot: slot + nr - 1, nr_slots: self.cfg.nr_slots });
        }
        Ok(())
    }
}

/// The word `page` is filled with, if its 8-byte words are all the same (zram's
/// `page_same_filled`): the last word is compared first, so a page that differs only near
/// its end (a zeroed buffer with a tail written) is told apart in two loads, then the rest
/// in order up to the first that differs.
fn same_filled_word(page: &[u8]) -> Option<u64> {
    let mut words = page.chunks_exact(8).map(|w| u64::from_ne_bytes(w.try_into().expect("8 bytes")));
    let first = words.next()?;
    let last = words.next_back().unwrap_or(first);
    (last == first && words.all(|w| w == first)).then_some(first)
}

/// The unit a read call decompressed last into its workspace (its head, its row's entry
/// then), so that reading its neighbours decompresses it once.
type LastUnit = Option<(u64, u64)>;

/// The error of an operation that found no workspace free within `sync::POP_WAIT_LIMIT_NS`
/// (`ETIMEDOUT`; `from_raw_os_error` allocates nothing, as a SIGBUS handler needs).
fn workspace_timeout(slot: u64) -> BackendError {
    BackendError::Io { slot, source: std::io::Error::from_raw_os_error(libc::ETIMEDOUT) }
}

impl Backend for ZpoolBackend {
    fn name(&self) -> String {
        match self.cfg.compressor {
            Compressor::Lz4 => "zpool(lz4)".into(),
            Compressor::Zstd { level } if self.cfg.dictionary => format!("zpool(zstd-{level}, dict)"),
            Compressor::Zstd { level } => format!("zpool(zstd-{level})"),
        }
    }

    fn nr_slots(&self) -> u64 {
        self.cfg.nr_slots
    }

    /// zstd's compression, with a dictionary or not, is 3-6x lz4's per page.
    fn dear_writes(&self) -> bool {
        matches!(self.cfg.compressor, Compressor::Zstd { .. })
    }

    /// Pages live in the process's memory and reads take no lock (see the trait).
    fn inheritable(&self) -> bool {
        true
    }

    fn share_pool(&self, share: PoolShare) {
        self.alloc.share_pool(share);
    }

    /// Workspaces of the child's own: see `Codecs::enter_fork_child`.
    fn enter_fork_child(&self) {
        self.codecs.enter_fork_child();
    }

    /// A read uses the slot words, the arena and the chunks' generations (and workspaces,
    /// on the heap): a fork child that reads its copy of the pool keeps those.
    fn set_inherited(&self, inherit: bool) {
        self.slots.set_inherited(inherit);
        if let Some(units) = &self.units {
            units.set_inherited(inherit);
        }
        self.alloc.set_inherited(inherit);
    }

    fn write(&self, reqs: &mut [WriteReq<'_>]) {
        let Some(mut ws) = self.codecs.take_workspace() else {
            // Nothing stored: the engine keeps the pages staged and writes them later.
            for r in reqs {
                r.result = Err(workspace_timeout(r.slot));
            }
            return;
        };
        for r in reqs {
            r.result = self.check(r.slot, r.nr_pages());
            if r.result.is_err() {
                continue;
            }
            // All or nothing per request.
            let stored = match self.units {
                Some(_) if r.nr_pages() > 1 => self.write_units(r, &mut ws),
                _ => self.write_pages(r, &mut ws),
            };
            r.result = stored.map(|same_filled| {
                self.same_filled_stores.fetch_add(same_filled, Ordering::Relaxed);
            });
        }
        self.codecs.put_workspace(ws);
    }

    fn read(&self, reqs: &mut [ReadReq<'_>]) {
        let Some(mut ws) = self.codecs.take_workspace() else {
            // Nothing read: the engine counts a failed attempt and tries again.
            for r in reqs {
                r.result = Err(workspace_timeout(r.slot));
            }
            return;
        };
        for r in reqs {
            r.result = self.check(r.slot, r.nr_pages());
            if r.result.is_err() {
                continue;
            }
            let mut last = None;
            for (i, page) in r.buf.iter_mut().enumerate() {
                if let Err(e) = self.load_page(r.slot + i as u64, &mut page.0, &mut ws, &mut last) {
                    r.result = Err(e);
                    break;
                }
            }
        }
        self.codecs.put_workspace(ws);
    }

    fn invalidate(&self, slot: u64) {
        if slot >= self.cfg.nr_slots {
            return;
        }
        let e = self.slots[2 * slot as usize].swap(KIND_EMPTY, Ordering::AcqRel);
        if let Some((head, index)) = entry_member(e) {
            self.invalidate_member(head, index);
            self.stored_pages.fetch_sub(1, Ordering::Relaxed);
            return;
        }
        match entry_kind(e) {
            KIND_EMPTY => return,
            KIND_SAME => {
                self.same_filled.fetch_sub(1, Ordering::Relaxed);
            }
            kind => {
                if kind == KIND_RAW {
                    self.incompressible.fetch_sub(1, Ordering::Relaxed);
                }
                self.compressed_bytes.fetch_sub(entry_len(e) as u64, Ordering::Relaxed);
                self.object_bytes.fetch_sub(entry_object_bytes(e), Ordering::Relaxed);
                self.alloc.free(e);
                self.update_full();
            }
        }
        self.stored_pages.fetch_sub(1, Ordering::Relaxed);
    }

    fn accepting(&self) -> bool {
        !self.full.load(Ordering::Relaxed)
    }

    /// Populates ahead only once the arena holds something: a pool of same-filled pages
    /// alone uses none of it.
    fn prepare(&self) -> bool {
        self.alloc.prepare(self.pool_bytes() != 0)
    }

    /// Compacts the pool (at most every [`COMPACT_PERIOD_MS`]) while the room in its chunks
    /// passes a bound, then gives the arena's free chunks beyond a reserve back (see
    /// `Allocator::compact` and `Allocator::trim`).
    /// Trains the pool's dictionary first, once its samples are in (`dictionary.rs`).
    fn trim(&self) -> u64 {
        self.codecs.train_dictionary();
        let pool_bytes = self.alloc.pool_bytes();
        let room_bytes = pool_bytes.saturating_sub(self.object_bytes.load(Ordering::Relaxed));
        let now_ms = crate::clock::elapsed_since(self.created_ns).as_millis() as u64;
        let due = now_ms >= self.next_compact_ms.load(Ordering::Relaxed);
        if due && room_bytes >= COMPACT_MIN_ROOM_BYTES.max(pool_bytes / COMPACT_ROOM_DIVISOR) {
            self.next_compact_ms.store(now_ms + COMPACT_PERIOD_MS, Ordering::Relaxed);
            self.compact();
        }
        self.alloc.trim()
    }

    fn writeback_candidates(&self, out: &mut [u64]) -> usize {
        if self.pool_bytes() < self.accept_limit_bytes() {
            return 0;
        }
        // Slots only: a unit's object (`UNIT_ID`) is not one page to move.
        self.alloc.writeback_candidates(out, |id| {
            (id & UNIT_ID == 0).then(|| self.owner_entry(id)).flatten().map(|e| e.load(Ordering::Acquire))
        })
    }

    fn stats(&self) -> Option<BackendStats> {
        let pool_bytes = self.pool_bytes();
        let (units, unit_pages, unit_fallbacks) = self.units.as_ref().map_or((0, 0, 0), UnitTable::counts);
        let stored = self.stored_pages.load(Ordering::Relaxed);
        let (dictionary_in_use, dictionary_turned_off) = self.codecs.dictionary_use();
        Some(BackendStats {
            pool_bytes,
            pool_peak_bytes: self.alloc.peak_bytes() + self.codecs.dictionary_bytes(),
            stored_pages: stored,
            same_filled_pages: self.same_filled.load(Ordering::Relaxed),
            same_filled_stores: self.same_filled_stores.load(Ordering::Relaxed),
            incompressible_pages: self.incompressible.load(Ordering::Relaxed),
            compressed_bytes: self.compressed_bytes.load(Ordering::Relaxed),
            object_bytes: self.object_bytes.load(Ordering::Relaxed),
            compacted_chunks: self.compacted_chunks.load(Ordering::Relaxed),
            units,
            unit_pages,
            unit_fallbacks,
            compression_ratio: if pool_bytes == 0 {
                0.0
            } else {
                (stored * PAGE_SIZE as u64) as f64 / pool_bytes as f64
            },
            reject_pool_full: self.reject_pool_full.load(Ordering::Relaxed),
            reject_incompressible: self.reject_incompressible.load(Ordering::Relaxed),
            reject_alloc_fail: self.reject_alloc_fail.load(Ordering::Relaxed),
            dictionary_bytes: self.codecs.dictionary_bytes(),
            codec_bytes: self.codecs.codec_bytes(),
            dictionary_in_use: u64::from(dictionary_in_use),
            dictionary_turned_off,
            dictionary_failures: u64::from(self.codecs.dictionary_error().is_some()),
            ..BackendStats::default()
        })
    }
}

#[cfg(test)]
mod tests;
