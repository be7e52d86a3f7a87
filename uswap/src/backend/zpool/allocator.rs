//! The compressed pool's object allocator: where each compressed page lives in the arena.
//!
//! Compressed objects live in an arena carved into 64 KiB chunks; each chunk serves one size
//! class (multiples of 16 bytes up to a page, as zsmalloc's classes on 4 KiB pages). A class
//! keeps a list of its chunks that have room; a chunk that empties goes back to the arena
//! for any class, and `trim` (from the background thread) gives the memory of free chunks
//! beyond a reserve back to the kernel. An object may live in a chunk of a larger class
//! than its length needs (at most a quarter larger, see `alloc_object`), so that sparse
//! classes share chunks; its entry names the chunk's class. `compact` (from the background
//! thread too) empties a class's sparsest chunks into its others when they have a chunk's
//! worth of room. The encoding of a slot's entry and of a chunk's metadata word, and the
//! classes' arithmetic, are `encoding.rs`'s.
//!
//! Named for its job rather than after the kernel's zsmalloc: it shares zsmalloc's size
//! classes and its rule for when a class is worth compacting, but its chunks, its single
//! list of partial chunks per class, borrowing between classes and compaction by a
//! compare-and-swap of the slot's entry differ enough that the kernel's name would mislead.
//!
//! [`Allocator`] owns the arena and everything about its chunks: their metadata and lists,
//! the chunks in use and their high-water mark, the report to a shared charge
//! (`crate::shared_charge::PoolShare`), populating ahead of use (`prepare`), giving memory
//! back (`trim`), compaction, and picking the chunk writeback sheds. The pool (`mod.rs`)
//! owns the slots and hands this module the bytes to place (and, to compact, each slot's
//! entry word); this module imports only the configuration's error (`config.rs`) and the
//! encodings (`encoding.rs`).
//!
//! Locking (in the hierarchy of `crate::sync`): one spin lock per size class guards its
//! chunks' metadata and free lists; the arena lock guards the lists of free chunks and nests
//! inside a class lock. Compaction takes one class lock at a time, never across a copy.
//!
//! Invariants: a chunk is free (class `NO_CLASS`), or belongs to one class and is on that
//! class's partial list iff `0 < inuse < objects_per_chunk` and it is not being evacuated
//! (`META_EVACUATING`: off the list, nothing placed in it, freed only by its compactor);
//! `chunks_in_use` counts the chunks that belong to a class. A free chunk is on the warm
//! list (`nr_free_warm` of them, memory populated), on the cold list (memory given back),
//! or, for the moment of a `trim` batch, on neither. A chunk is not reused while an entry
//! may still name it: an evacuated chunk is freed once no object in it is live.

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::OnceLock;

use super::config::ZpoolError;
use super::encoding::{
    borrow_limit, class_of, class_size, entry, entry_chunk, entry_class, entry_kind, entry_len, entry_obj, meta,
    meta_class, meta_evacuating, meta_free_head, meta_inuse, meta_next_unused, objects_per_chunk, ANCHOR, CHUNK_BYTES,
    KIND_COMPRESSED, KIND_RAW, MAX_CHUNKS, META_EVACUATING, NO_CLASS, NO_OBJ, NR_CLASSES, OBJ_HEADER,
};
use crate::mapping::{AtomicTable, DiscardBatch, MapOptions, Reservation};
use crate::shared_charge::PoolShare;
use crate::sync::{LockClass, SpinLock};
use crate::uffd::PAGE_SIZE;

/// Chunks writeback looks at from its clock hand to pick the sparsest.
const WRITEBACK_LOOKAHEAD_CHUNKS: u32 = 16;
/// Most of the arena populated ahead of the first never-used chunk by `prepare` (4 MiB).
/// The lead grows with use, from [`PREPARE_AHEAD_MIN_CHUNKS`] to this: a pool that stores
/// nothing populates nothing (a short-lived process under `uswap run` paid 32 MiB of RAM and
/// 26 ms of page zeroing for a pool it never used). The populated lead is memory the process
/// holds and the pool does not use: at 32 MiB it was the gap between the pool's 51 MiB and
/// its 84 MiB of RSS under sqlite3, and the kernel's zram allocates on demand.
const PREPARE_AHEAD_CHUNKS: u32 = 64;
/// The lead once the pool holds anything (1 MiB).
const PREPARE_AHEAD_MIN_CHUNKS: u32 = 16;
/// Free chunks kept populated for reuse, at least (1 MiB): what `trim` leaves of the warm
/// free list. Beyond it, a 32nd of the chunks in use (a pool of 300 MiB keeps 9 MiB), so
/// that a pool churning at a steady size reuses its chunks rather than dropping and
/// zero-filling them again.
pub(super) const TRIM_RESERVE_MIN_CHUNKS: u32 = 16;
const TRIM_RESERVE_DIVISOR: u64 = 32;
/// Partial chunks of a class `compact` looks at to pick the sparsest (the walk holds the
/// class's lock).
const COMPACT_SCAN_CHUNKS: u32 = 64;
/// Chunks dropped with one TLB flush (2 MiB).
const TRIM_BATCH_CHUNKS: usize = 32;
/// Batches one `trim` drops at most (64 MiB): the rest waits for the next call.
const TRIM_MAX_BATCHES: usize = 32;

const NIL: u32 = u32::MAX;

struct ClassState {
    /// First chunk of this class with room, linked through `links`.
    partial_head: u32,
    /// Chunks on the partial list.
    nr_partial: u32,
    /// Whether this class has started a chunk of its anchor class (see `alloc_object`):
    /// the next chunk it needs is its own.
    anchored: bool,
}

struct ArenaState {
    /// Free chunks whose memory is populated (freed since the last `trim`), linked through
    /// `links` (next half): taken first.
    free_head: u32,
    /// How many chunks are on `free_head`'s list.
    nr_free_warm: u32,
    /// Free chunks whose memory `trim` gave back to the kernel, linked the same way: they
    /// read as zero and fault their pages in again on first use.
    cold_head: u32,
    /// Chunks never used yet start here.
    next_fresh: u32,
}

/// Per-chunk words that read as `init` until written, in lazily zero-filled memory (each
/// word is kept XORed with `init`): a pool sized for a large cap costs no RAM and no start-up
/// time for the chunks it never uses (filled eagerly, the tables of the default pool, half
/// the RAM, took 3 MiB and most of a short process's start under `uswap run`).
struct LazyWords {
    words: AtomicTable,
    init: u64,
}

impl LazyWords {
    fn new(len: usize, init: u64) -> std::io::Result<LazyWords> {
        Ok(LazyWords { words: AtomicTable::new(len)?, init })
    }

    #[inline]
    fn load(&self, i: usize, order: Ordering) -> u64 {
        self.words[i].load(order) ^ self.init
    }

    #[inline]
    fn store(&self, i: usize, v: u64, order: Ordering) {
        self.words[i].store(v ^ self.init, order)
    }
}

/// The arena and its chunks: where the pool's objects live (see the module documentation).
pub(super) struct Allocator {
    /// The pool's cap (of the tree's pools together under a shared charge).
    cap_bytes: u64,
    /// Opened as chunks are first used: a program that reads every readable mapping read
    /// the whole cap otherwise (see `crate::mapping::Reservation`).
    arena: Reservation,
    nr_chunks: u32,
    /// Per chunk: metadata word and list links (prev << 32 | next).
    chunk_meta: LazyWords,
    chunk_links: LazyWords,
    /// Per chunk: bumped each time `compact` ends an evacuation of it, before the chunk can
    /// be reused, so that a reader can tell that the place it copied from may have held
    /// something else meanwhile even if the entry reads the same again (an object moved
    /// out and, a pass later, back into the same place).
    chunk_generation: LazyWords,
    classes: Box<[SpinLock<ClassState>]>,
    free_chunks: SpinLock<ArenaState>,
    /// The next size class `compact` looks at.
    compact_hand: AtomicU32,
    /// Clock hand over chunks for writeback: chunks are shed whole, in index order (roughly
    /// allocation order), so writeback always returns memory.
    writeback_hand: AtomicU32,
    /// Copy of `ArenaState::next_fresh`, readable without the lock.
    fresh_hint: AtomicU32,
    /// Chunks `0..populated` have been populated by `prepare`.
    populated: AtomicU32,
    chunks_in_use: AtomicU64,
    /// The most chunks in use at once (the pool's high-water mark).
    chunks_peak: AtomicU64,
    /// Where chunks taken and freed are reported beside other pools, if anywhere.
    share: OnceLock<PoolShare>,
}

/// Whether a pool may be capped at `cap_bytes`: one chunk at least, and no more chunks than
/// a handle can name.
pub fn check_cap(cap_bytes: u64) -> Result<(), ZpoolError> {
    if cap_bytes < CHUNK_BYTES as u64 {
        return Err(ZpoolError::CapTooSmall { cap_bytes, min_bytes: CHUNK_BYTES as u64 });
    }
    let nr_chunks = cap_bytes.div_ceil(CHUNK_BYTES as u64) + NR_CLASSES as u64;
    if nr_chunks >= MAX_CHUNKS {
        let max_bytes = (MAX_CHUNKS - NR_CLASSES as u64 - 1) * CHUNK_BYTES as u64;
        return Err(ZpoolError::CapTooLarge { cap_bytes, max_bytes });
    }
    Ok(())
}

impl Allocator {
    /// An arena for a pool capped at `cap_bytes`: room for the cap plus one partly used
    /// chunk per size class, mapped but not populated.
    pub(super) fn new(cap_bytes: u64) -> Result<Allocator, ZpoolError> {
        check_cap(cap_bytes)?;
        // Room for the cap plus one partly used chunk per size class.
        let nr_chunks = (cap_bytes as usize).div_ceil(CHUNK_BYTES) + NR_CLASSES;
        let arena_bytes = nr_chunks * CHUNK_BYTES;
        let map_err = |source| ZpoolError::Map { bytes: arena_bytes as u64, source };
        let arena =
            Reservation::new(arena_bytes, MapOptions { no_huge_pages: true, dont_fork: true }).map_err(map_err)?;
        Ok(Allocator {
            cap_bytes,
            arena,
            nr_chunks: nr_chunks as u32,
            chunk_meta: LazyWords::new(nr_chunks, meta(NO_CLASS, 0, NO_OBJ, 0)).map_err(map_err)?,
            chunk_links: LazyWords::new(nr_chunks, u64::MAX).map_err(map_err)?,
            chunk_generation: LazyWords::new(nr_chunks, 0).map_err(map_err)?,
            classes: (0..NR_CLASSES)
                .map(|_| {
                    SpinLock::new(
                        LockClass::ZpoolSizeClass,
                        ClassState { partial_head: NIL, nr_partial: 0, anchored: false },
                    )
                })
                .collect(),
            free_chunks: SpinLock::new(
                LockClass::ZpoolArena,
                ArenaState { free_head: NIL, nr_free_warm: 0, cold_head: NIL, next_fresh: 0 },
            ),
            compact_hand: AtomicU32::new(0),
            writeback_hand: AtomicU32::new(0),
            fresh_hint: AtomicU32::new(0),
            populated: AtomicU32::new(0),
            chunks_in_use: AtomicU64::new(0),
            chunks_peak: AtomicU64::new(0),
            share: OnceLock::new(),
        })
    }

    /// Bytes of the arena's mapping.
    pub(super) fn arena_bytes(&self) -> u64 {
        self.nr_chunks as u64 * CHUNK_BYTES as u64
    }

    /// Checks the lists against the chunks' metadata (see the module's invariants), for
    /// tests: each class's partial list holds `nr_partial` chunks of the class with room,
    /// none evacuating; the warm free list `nr_free_warm` free chunks; the cold list free
    /// chunks; the chunks of a class number `chunks_in_use`. Panics on the first violation.
    #[cfg(test)]
    pub(super) fn check_invariants(&self) {
        let walk = |mut chunk: u32, mut each: Box<dyn FnMut(u32) + '_>| {
            let mut n = 0u32;
            while chunk != NIL {
                assert!(n < self.nr_chunks, "a list loops");
                each(chunk);
                n += 1;
                chunk = self.links(chunk).1;
            }
            n
        };
        for c in 0..NR_CLASSES {
            let cls = self.classes[c].lock();
            let n = walk(
                cls.partial_head,
                Box::new(|ch| {
                    let m = self.chunk_meta.load(ch as usize, Ordering::Relaxed);
                    assert_eq!(meta_class(m), c as u64, "chunk {ch} on class {c}'s list");
                    assert!(meta_inuse(m) > 0 && meta_inuse(m) < objects_per_chunk(c), "chunk {ch}: {}", meta_inuse(m));
                    assert!(!meta_evacuating(m), "chunk {ch} evacuating on a list");
                }),
            );
            assert_eq!(n, cls.nr_partial, "class {c}'s partial list");
        }
        let free = |ch: u32| {
            assert_eq!(meta_class(self.chunk_meta.load(ch as usize, Ordering::Relaxed)), NO_CLASS, "chunk {ch}");
        };
        let a = self.free_chunks.lock();
        assert_eq!(walk(a.free_head, Box::new(free)), a.nr_free_warm, "the warm free list");
        walk(a.cold_head, Box::new(free));
        let in_use = (0..self.nr_chunks)
            .filter(|&ch| {
                let m = self.chunk_meta.load(ch as usize, Ordering::Relaxed);
                assert!(!meta_evacuating(m), "chunk {ch} left evacuating");
                meta_class(m) != NO_CLASS
            })
            .count() as u64;
        assert_eq!(in_use, self.chunks_in_use.load(Ordering::Relaxed), "chunks in use");
    }

    /// Bytes of the arena present in memory (`mincore`), for tests.
    #[cfg(test)]
    pub(super) fn arena_resident_bytes(&self) -> u64 {
        let pages = crate::mapping::mincore_pages(self.arena.addr(), self.arena_bytes() as usize).expect("mincore");
        (pages * PAGE_SIZE) as u64
    }

    /// Bytes of arena the pool uses (chunks in use).
    pub(super) fn pool_bytes(&self) -> u64 {
        self.chunks_in_use.load(Ordering::Relaxed) * CHUNK_BYTES as u64
    }

    /// The most bytes of arena the pool used at once.
    pub(super) fn peak_bytes(&self) -> u64 {
        self.chunks_peak.load(Ordering::Relaxed) * CHUNK_BYTES as u64
    }

    /// The bytes the cap applies to: this pool's, or, under a shared charge, the tree's
    /// pools' together (see `crate::shared_charge::PoolShare`).
    pub(super) fn capped_bytes(&self) -> u64 {
        let own = self.pool_bytes();
        self.share.get().map_or(own, |s| s.tree_bytes().max(own))
    }

    /// Reports chunks taken and freed from now on to `share`, starting with those in use.
    pub(super) fn share_pool(&self, share: PoolShare) {
        if self.share.set(share).is_ok() {
            share.grow(self.pool_bytes());
        }
    }

    /// Whether a fork child keeps what a read uses: the arena and the chunks' generations
    /// (see `Mapping::set_inherited`). A child reads its copy of the parent's pool and
    /// never places or frees in it, so the chunks' metadata and lists stay behind.
    pub(super) fn set_inherited(&self, inherit: bool) {
        self.arena.set_inherited(inherit);
        self.chunk_generation.words.set_inherited(inherit);
    }

    /// Places `data` for `slot` (the object's header names it): returns the slot entry of
    /// kind `kind` that points at it, or None when no chunk has room (the arena, or the
    /// tree's pools, are at the cap).
    pub(super) fn store(&self, kind: u64, slot: u64, data: &[u8]) -> Option<u64> {
        let c = class_of(OBJ_HEADER + data.len());
        let (chunk, c, obj) = self.alloc_object(c)?;
        let off = Self::obj_offset(chunk, c, obj);
        self.arena.write(off, &(slot as u32).to_ne_bytes());
        self.arena.write(off + OBJ_HEADER, data);
        Some(entry(kind, data.len(), c, chunk, obj))
    }

    /// The generation of the chunk the object entry `e` points at (see `chunk_generation`):
    /// read before and after copying an object out.
    pub(super) fn generation(&self, e: u64) -> u64 {
        self.chunk_generation.load(entry_chunk(e) as usize, Ordering::Acquire)
    }

    /// Reads the first `dst.len()` bytes of the data of the object entry `e` points at.
    /// Compaction may move the object and its place be reused while it is read: the caller
    /// checks the entry and the chunk's generation again after (`ZpoolBackend::load_page`),
    /// as a seqlock's reader, and uses the bytes only if neither changed.
    pub(super) fn load(&self, e: u64, dst: &mut [u8]) {
        let off = Self::obj_offset(entry_chunk(e), entry_class(e), entry_obj(e));
        self.arena.read(off + OBJ_HEADER, dst);
    }

    /// Frees the object entry `e` points at.
    pub(super) fn free(&self, e: u64) {
        self.free_object(entry_chunk(e), entry_obj(e));
    }

    /// Populates the arena ahead of the first never-used chunk (see [`PREPARE_AHEAD_CHUNKS`]),
    /// unless the arena holds no object (`holds_objects` false) and never populated anything.
    /// True if it populated something.
    pub(super) fn prepare(&self, holds_objects: bool) -> bool {
        if !holds_objects && self.populated.load(Ordering::Relaxed) == 0 {
            return false;
        }
        let from = self.populated.load(Ordering::Relaxed);
        let fresh = self.fresh_hint.load(Ordering::Relaxed);
        let ahead = fresh.clamp(PREPARE_AHEAD_MIN_CHUNKS, PREPARE_AHEAD_CHUNKS);
        let to = (fresh + ahead).min(self.nr_chunks);
        if to > from {
            let (off, len) = (from as usize * CHUNK_BYTES, (to - from) as usize * CHUNK_BYTES);
            // Best effort: without it the same pages are populated on first use (and their
            // window opened by `take_chunk`).
            if self.arena.open(off, len).is_ok() {
                let _ = self.arena.advise(off, len, libc::MADV_POPULATE_WRITE);
            }
            self.populated.store(to, Ordering::Relaxed);
        }
        to > from
    }

    /// Gives the memory of free chunks beyond a reserve back to the kernel (zsmalloc frees
    /// an empty zspage's pages at once). Without it the arena held the pool's peak for
    /// the life of the process: a program that swapped 256 MiB out under a 64 MiB limit,
    /// then unmapped three quarters of it, kept 193 MiB of RSS with 0.9 MiB of pool in use.
    /// Each batch of chunks is dropped with one TLB flush, outside the arena lock (the
    /// chunks are off every list meanwhile, so a concurrent `take_chunk` may start a
    /// never-used chunk instead). Returns the bytes given back. Bounded by
    /// [`TRIM_MAX_BATCHES`].
    pub(super) fn trim(&self) -> u64 {
        let in_use = self.chunks_in_use.load(Ordering::Relaxed);
        let reserve = TRIM_RESERVE_MIN_CHUNKS.max((in_use / TRIM_RESERVE_DIVISOR).min(u32::MAX as u64) as u32);
        let mut released_chunks = 0u64;
        for _ in 0..TRIM_MAX_BATCHES {
            let mut taken = [NIL; TRIM_BATCH_CHUNKS];
            let mut n = 0;
            {
                let mut a = self.free_chunks.lock();
                while n < TRIM_BATCH_CHUNKS && a.nr_free_warm > reserve {
                    let ch = a.free_head;
                    assert_ne!(ch, NIL, "{} warm free chunks counted on an empty list", a.nr_free_warm);
                    a.free_head = self.links(ch).1;
                    a.nr_free_warm -= 1;
                    taken[n] = ch;
                    n += 1;
                }
            }
            if n == 0 {
                break;
            }
            let mut batch = DiscardBatch::<TRIM_BATCH_CHUNKS>::new();
            for &ch in &taken[..n] {
                debug_assert_eq!(meta_class(self.chunk_meta.load(ch as usize, Ordering::Relaxed)), NO_CLASS);
                self.arena.discard_later(&mut batch, ch as usize * CHUNK_BYTES, CHUNK_BYTES);
            }
            batch.flush();
            let mut a = self.free_chunks.lock();
            for &ch in &taken[..n] {
                self.set_links(ch, NIL, a.cold_head);
                a.cold_head = ch;
            }
            released_chunks += n as u64;
        }
        released_chunks * CHUNK_BYTES as u64
    }

    /// Compacts size classes, from where the last call stopped, until `budget_objects`
    /// objects have moved or every class was looked at once: while a class's partial chunks
    /// have a whole chunk's worth of free objects (zsmalloc's `zs_can_compact`), its
    /// sparsest partial chunk is emptied into the others and goes back to the arena.
    /// `slot_entry(slot)` is the entry word of a slot of the pool (None: not one). Returns
    /// the objects moved and the chunks freed.
    pub(super) fn compact<'a>(
        &self,
        budget_objects: u64,
        slot_entry: impl Fn(u64) -> Option<&'a AtomicU64>,
    ) -> (u64, u64) {
        let (mut moved, mut freed) = (0, 0);
        for _ in 0..NR_CLASSES {
            if moved >= budget_objects {
                break;
            }
            let c = self.compact_hand.fetch_add(1, Ordering::Relaxed) as usize % NR_CLASSES;
            // Victim after victim while the class can give a chunk back; bounded by the
            // budget, the chunks it can look at, and a victim that did not empty.
            for _ in 0..COMPACT_SCAN_CHUNKS {
                let Some(victim) = self.pick_victim(c) else { break };
                let (objects, emptied) = self.evacuate(victim, c, &slot_entry);
                moved += objects;
                freed += emptied as u64;
                if !emptied || moved >= budget_objects {
                    break;
                }
            }
        }
        (moved, freed)
    }

    /// Takes the sparsest of class `c`'s partial chunks (of the first
    /// [`COMPACT_SCAN_CHUNKS`]) off its list, marked evacuating, if the others have room for
    /// its objects and the class a chunk's worth of free objects.
    fn pick_victim(&self, c: usize) -> Option<u32> {
        let mut cls = self.classes[c].lock();
        if cls.nr_partial < 2 {
            return None;
        }
        let per_chunk = objects_per_chunk(c);
        let (mut free_objects, mut sparsest) = (0, (NIL, u64::MAX));
        let mut chunk = cls.partial_head;
        for _ in 0..COMPACT_SCAN_CHUNKS {
            if chunk == NIL {
                break;
            }
            let inuse = meta_inuse(self.chunk_meta.load(chunk as usize, Ordering::Relaxed));
            debug_assert!(inuse > 0 && inuse < per_chunk, "chunk {chunk} on class {c}'s partial list with {inuse}");
            free_objects += per_chunk - inuse;
            if inuse < sparsest.1 {
                sparsest = (chunk, inuse);
            }
            chunk = self.links(chunk).1;
        }
        let (victim, inuse) = sparsest;
        let room_elsewhere = free_objects - (per_chunk - inuse);
        if free_objects < per_chunk || room_elsewhere < inuse {
            return None;
        }
        self.partial_unlink(&mut cls, victim);
        let m = self.chunk_meta.load(victim as usize, Ordering::Relaxed);
        self.chunk_meta.store(victim as usize, m | META_EVACUATING, Ordering::Relaxed);
        Some(victim)
    }

    /// Moves every live object of `victim` (class `c`, evacuating) to other chunks of its
    /// class, each by a copy and a compare-and-swap of its slot's entry: an entry changed
    /// meanwhile (the slot invalidated by its owner) keeps its own object and the copy is
    /// freed. A reader that loaded the old entry checks it again after reading (see
    /// `ZpoolBackend::load_page`); the victim is not reused before every object is out, so
    /// an entry that still names it names what it holds. Then frees the victim, or puts it
    /// back on its list if the class ran out of room. Returns the objects moved and whether
    /// the victim was freed.
    fn evacuate<'a>(&self, victim: u32, c: usize, slot_entry: &impl Fn(u64) -> Option<&'a AtomicU64>) -> (u64, bool) {
        let mut buf = [0u8; OBJ_HEADER + PAGE_SIZE];
        let mut moved = 0;
        let next_unused = meta_next_unused(self.chunk_meta.load(victim as usize, Ordering::Relaxed));
        for obj in 0..next_unused {
            let from = Self::obj_offset(victim, c, obj);
            let mut hdr = [0u8; OBJ_HEADER];
            self.arena.read(from, &mut hdr);
            let Some(entry_word) = slot_entry(u32::from_ne_bytes(hdr) as u64) else { continue };
            let e = entry_word.load(Ordering::Acquire);
            let kind = entry_kind(e);
            let live = (kind == KIND_COMPRESSED || kind == KIND_RAW) && entry_chunk(e) == victim && entry_obj(e) == obj;
            if !live {
                continue;
            }
            debug_assert_eq!(entry_class(e), c);
            let Some((to_chunk, to_obj)) = self.place_in_partial(c) else { break };
            let len = OBJ_HEADER + entry_len(e);
            self.arena.read(from, &mut buf[..len]);
            self.arena.write(Self::obj_offset(to_chunk, c, to_obj), &buf[..len]);
            let moved_entry = entry(kind, entry_len(e), c, to_chunk, to_obj);
            if entry_word.compare_exchange(e, moved_entry, Ordering::AcqRel, Ordering::Acquire).is_ok() {
                self.free_object(victim, obj);
                moved += 1;
            } else {
                self.free_object(to_chunk, to_obj);
            }
        }
        (moved, self.end_evacuation(victim, c))
    }

    /// An object in a partial chunk of class `c`, if it has one (never a new chunk).
    fn place_in_partial(&self, c: usize) -> Option<(u32, u64)> {
        let mut cls = self.classes[c].lock();
        let chunk = cls.partial_head;
        (chunk != NIL).then(|| (chunk, self.place_object(&mut cls, chunk, c)))
    }

    /// Clears `victim`'s evacuating mark: frees it if empty (returns true), else puts it
    /// back on its list.
    fn end_evacuation(&self, victim: u32, c: usize) -> bool {
        let mut cls = self.classes[c].lock();
        let m = self.chunk_meta.load(victim as usize, Ordering::Relaxed);
        assert!(meta_evacuating(m) && meta_class(m) == c as u64, "chunk {victim} was not being evacuated");
        // Before anything can be placed in it again (see `chunk_generation`).
        let generation = self.chunk_generation.load(victim as usize, Ordering::Relaxed);
        self.chunk_generation.store(victim as usize, generation.wrapping_add(1), Ordering::Release);
        if meta_inuse(m) == 0 {
            self.release_chunk(victim);
            true
        } else {
            self.chunk_meta.store(victim as usize, m & !META_EVACUATING, Ordering::Relaxed);
            self.partial_push(&mut cls, victim);
            false
        }
    }

    /// Fills `out` with slots whose objects live in the chunk to shed next; `entry_of(slot)`
    /// is the slot's entry (None: not a slot of the pool). Returns how many.
    pub(super) fn writeback_candidates(&self, out: &mut [u64], entry_of: impl Fn(u64) -> Option<u64>) -> usize {
        // A chunk to shed: of the next chunks in use on the clock, the one with the fewest
        // live objects for its size (most memory back per page written). Every live object
        // in it goes, so the chunk empties and returns its memory.
        // Bounded by one turn of the clock.
        for _ in 0..self.nr_chunks {
            let hand = self.writeback_hand.load(Ordering::Relaxed);
            let mut best: Option<(u32, u64)> = None;
            for k in 0..WRITEBACK_LOOKAHEAD_CHUNKS.min(self.nr_chunks) {
                let ch = (hand + k) % self.nr_chunks;
                let m = self.chunk_meta.load(ch as usize, Ordering::Relaxed);
                if meta_class(m) == NO_CLASS || meta_inuse(m) == 0 {
                    continue;
                }
                // Live fraction in 1/1024ths.
                let fill = meta_inuse(m) * 1024 / objects_per_chunk(meta_class(m) as usize);
                if best.is_none_or(|(_, f)| fill < f) {
                    best = Some((ch, fill));
                }
            }
            let Some((chunk, _)) = best else {
                self.writeback_hand.fetch_add(WRITEBACK_LOOKAHEAD_CHUNKS, Ordering::Relaxed);
                continue;
            };
            let m = self.chunk_meta.load(chunk as usize, Ordering::Relaxed);
            let c = meta_class(m);
            let c = c as usize;
            let mut n = 0;
            for obj in 0..meta_next_unused(m) {
                if n == out.len() {
                    break;
                }
                let mut hdr = [0u8; OBJ_HEADER];
                self.arena.read(Self::obj_offset(chunk, c, obj), &mut hdr);
                let slot = u32::from_ne_bytes(hdr) as u64;
                let Some(e) = entry_of(slot) else { continue };
                let kind = entry_kind(e);
                if (kind == KIND_COMPRESSED || kind == KIND_RAW) && entry_chunk(e) == chunk && entry_obj(e) == obj {
                    out[n] = slot;
                    n += 1;
                }
            }
            // The clock moves on once the window's first chunk is done with (the chosen chunk
            // may hold more than one batch; it stays the sparsest until emptied), or when the
            // chosen one holds nothing writeback takes (units: `entry_of` gives None).
            if n == 0 || (n < out.len() && chunk == hand % self.nr_chunks) {
                self.writeback_hand.fetch_add(1, Ordering::Relaxed);
            }
            if n > 0 {
                return n;
            }
        }
        0
    }

    fn obj_offset(chunk: u32, class: usize, obj: u64) -> usize {
        chunk as usize * CHUNK_BYTES + obj as usize * class_size(class)
    }

    fn links(&self, chunk: u32) -> (u32, u32) {
        let l = self.chunk_links.load(chunk as usize, Ordering::Relaxed);
        ((l >> 32) as u32, l as u32)
    }

    fn set_links(&self, chunk: u32, prev: u32, next: u32) {
        self.chunk_links.store(chunk as usize, (prev as u64) << 32 | next as u64, Ordering::Relaxed);
    }

    /// Pushes `chunk` at the head of its class's partial list (class lock held).
    fn partial_push(&self, cls: &mut ClassState, chunk: u32) {
        let head = cls.partial_head;
        self.set_links(chunk, NIL, head);
        if head != NIL {
            let (_, hn) = self.links(head);
            self.set_links(head, chunk, hn);
        }
        cls.partial_head = chunk;
        cls.nr_partial += 1;
    }

    /// Unlinks `chunk` from its class's partial list (class lock held).
    fn partial_unlink(&self, cls: &mut ClassState, chunk: u32) {
        let (prev, next) = self.links(chunk);
        if prev == NIL {
            cls.partial_head = next;
        } else {
            let (pp, _) = self.links(prev);
            self.set_links(prev, pp, next);
        }
        if next != NIL {
            let (_, nn) = self.links(next);
            self.set_links(next, prev, nn);
        }
        self.set_links(chunk, NIL, NIL);
        cls.nr_partial -= 1;
    }

    /// Allocates an object of class `c`: returns (chunk, the chunk's class, object index).
    ///
    /// Every class in use holds a partial chunk of 64 KiB, and real programs spread their
    /// pages over many classes: in redis-server, 143k objects of one class filled 107
    /// chunks while 105 other classes held a chunk each for 1 to 180 objects, half the
    /// pool. So a class with no room of its own first borrows a free object from a chunk
    /// of a class at most a quarter larger ([`borrow_limit`]); failing that, its first new
    /// chunk is started at its anchor class ([`ANCHOR`], at most an eighth larger), where
    /// its neighbours can borrow too, and only the next at its own class. The class locks
    /// are taken one at a time, never nested.
    fn alloc_object(&self, c: usize) -> Option<(u32, usize, u64)> {
        for k in c..=borrow_limit(c) {
            let mut cls = self.classes[k].lock();
            if cls.partial_head != NIL {
                let chunk = cls.partial_head;
                return Some((chunk, k, self.place_object(&mut cls, chunk, k)));
            }
        }
        let k = {
            let mut cls = self.classes[c].lock();
            let anchor = ANCHOR[c] as usize;
            if cls.anchored || anchor == c {
                c
            } else {
                cls.anchored = true;
                anchor
            }
        };
        let mut cls = self.classes[k].lock();
        let chunk = if cls.partial_head != NIL { cls.partial_head } else { self.take_chunk(&mut cls, k)? };
        Some((chunk, k, self.place_object(&mut cls, chunk, k)))
    }

    /// A free chunk (one given back, else a never-used one) for class `c`, on its partial
    /// list (class lock held).
    /// None when the arena has no chunk left, or when the tree's pools (see
    /// `crate::shared_charge::PoolShare`) are at the cap.
    fn take_chunk(&self, cls: &mut ClassState, c: usize) -> Option<u32> {
        let share = self.share.get();
        if share.is_some_and(|s| !s.try_grow(CHUNK_BYTES as u64, self.cap_bytes)) {
            return None;
        }
        let ch = {
            let mut a = self.free_chunks.lock();
            if a.free_head != NIL {
                let ch = a.free_head;
                a.free_head = self.links(ch).1;
                a.nr_free_warm -= 1;
                ch
            } else if a.cold_head != NIL {
                let ch = a.cold_head;
                a.cold_head = self.links(ch).1;
                ch
            } else if a.next_fresh < self.nr_chunks {
                a.next_fresh += 1;
                self.fresh_hint.store(a.next_fresh, Ordering::Relaxed);
                a.next_fresh - 1
            } else {
                drop(a);
                if let Some(s) = share {
                    s.shrink(CHUNK_BYTES as u64);
                }
                return None;
            }
        };
        // A never-used chunk may lie past the windows of the arena opened so far (a system
        // call every 64 MiB; `prepare` opens ahead of it). Refused (the process's mappings at
        // `vm.max_map_count`): the chunk waits on the cold list, the page stays in its region.
        if self.arena.open(ch as usize * CHUNK_BYTES, CHUNK_BYTES).is_err() {
            let mut a = self.free_chunks.lock();
            self.set_links(ch, NIL, a.cold_head);
            a.cold_head = ch;
            drop(a);
            if let Some(s) = share {
                s.shrink(CHUNK_BYTES as u64);
            }
            return None;
        }
        let in_use = self.chunks_in_use.fetch_add(1, Ordering::Relaxed) + 1;
        self.chunks_peak.fetch_max(in_use, Ordering::Relaxed);
        self.chunk_meta.store(ch as usize, meta(c as u64, 0, NO_OBJ, 0), Ordering::Relaxed);
        self.partial_push(cls, ch);
        Some(ch)
    }

    /// Takes a free object of `chunk`, a partial chunk of class `c` (class lock held).
    fn place_object(&self, cls: &mut ClassState, chunk: u32, c: usize) -> u64 {
        let m = self.chunk_meta.load(chunk as usize, Ordering::Relaxed);
        assert_eq!(meta_class(m), c as u64, "chunk {chunk} on the partial list of another class");
        assert!(meta_inuse(m) < objects_per_chunk(c), "full chunk {chunk} on a partial list");
        let (obj, free_head, next_unused) = if meta_free_head(m) != NO_OBJ {
            let obj = meta_free_head(m);
            let mut link = [0u8; 2];
            self.arena.read(Self::obj_offset(chunk, c, obj), &mut link);
            (obj, u16::from_ne_bytes(link) as u64, meta_next_unused(m))
        } else {
            let obj = meta_next_unused(m);
            (obj, NO_OBJ, obj + 1)
        };
        let inuse = meta_inuse(m) + 1;
        if inuse == objects_per_chunk(c) {
            self.partial_unlink(cls, chunk);
        }
        self.chunk_meta.store(chunk as usize, meta(c as u64, inuse, free_head, next_unused), Ordering::Relaxed);
        obj
    }

    fn free_object(&self, chunk: u32, obj: u64) {
        let c = meta_class(self.chunk_meta.load(chunk as usize, Ordering::Relaxed)) as usize;
        assert!(c < NR_CLASSES, "object freed in a free chunk {chunk}");
        let mut cls = self.classes[c].lock();
        let m = self.chunk_meta.load(chunk as usize, Ordering::Relaxed);
        let inuse = meta_inuse(m);
        assert!(inuse > 0, "chunk {chunk}: object freed twice");
        // A chunk being emptied by `compact` is on no list and stays its compactor's.
        let evacuating = meta_evacuating(m);
        let was_full = inuse == objects_per_chunk(c);
        self.arena.write(Self::obj_offset(chunk, c, obj), &(meta_free_head(m) as u16).to_ne_bytes());
        let inuse = inuse - 1;
        if inuse == 0 && !evacuating {
            if !was_full {
                self.partial_unlink(&mut cls, chunk);
            }
            self.release_chunk(chunk);
        } else {
            if was_full && !evacuating {
                self.partial_push(&mut cls, chunk);
            }
            let flag = m & META_EVACUATING;
            self.chunk_meta.store(
                chunk as usize,
                meta(c as u64, inuse, obj, meta_next_unused(m)) | flag,
                Ordering::Relaxed,
            );
        }
    }

    /// Returns an empty chunk, on no list, to the arena's warm free list (its class's lock
    /// held).
    fn release_chunk(&self, chunk: u32) {
        self.chunk_meta.store(chunk as usize, meta(NO_CLASS, 0, NO_OBJ, 0), Ordering::Relaxed);
        let mut a = self.free_chunks.lock();
        self.set_links(chunk, NIL, a.free_head);
        a.free_head = chunk;
        a.nr_free_warm += 1;
        self.chunks_in_use.fetch_sub(1, Ordering::Relaxed);
        if let Some(share) = self.share.get() {
            share.shrink(CHUNK_BYTES as u64);
        }
    }
}

impl Drop for Allocator {
    fn drop(&mut self) {
        // The pool's memory goes with it: out of the tree's sum too.
        if let Some(share) = self.share.get() {
            share.shrink(self.pool_bytes());
        }
    }
}
