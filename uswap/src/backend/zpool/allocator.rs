//! The compressed pool's object allocator: where each compressed page lives in the arena.
//!
//! Compressed objects live in an arena carved into 64 KiB chunks; each chunk serves one size
//! class (multiples of 16 bytes up to a page, as zsmalloc's classes on 4 KiB pages). A class
//! keeps a list of its chunks that have room; a chunk that empties goes back to the arena
//! for any class. An object may live in a chunk of a larger class than its length needs
//! (at most a quarter larger, see `alloc_object`), so that sparse classes share chunks;
//! its entry names the chunk's class. Also here: the encoding of a slot's entry (kind,
//! length, class, chunk, object) and of a chunk's metadata word.
//!
//! Named for its job rather than after the kernel's zsmalloc: it shares zsmalloc's size
//! classes, but its chunks, its single list of partial chunks per class, and writeback that
//! sheds whole chunks instead of compaction differ enough that the kernel's name would
//! mislead.
//!
//! Locking (in the hierarchy of `crate::sync`): one spin lock per size class guards its
//! chunks' metadata and free lists; the arena lock guards the list of free chunks and nests
//! inside a class lock.
//!
//! Invariants: a chunk is free (class `NO_CLASS`), or belongs to one class and is on that
//! class's partial list iff `0 < inuse < objects_per_chunk`; `chunks_in_use` counts the
//! chunks that belong to a class.

use std::sync::atomic::Ordering;

use super::ZpoolBackend;
use crate::uffd::PAGE_SIZE;

/// Granularity of size classes. 32 bytes wasted 16 on average per object: a quarter of
/// the pool when pages compress to 40-odd bytes (redis-server's values did).
const CLASS_BYTES: usize = 16;
/// Each object starts with the number of the slot that owns it (4 bytes), so a chunk's live
/// objects can be found for writeback: an object is live iff its slot's entry points at it.
pub(super) const OBJ_HEADER: usize = 4;
/// Classes up to a page plus the header.
pub(super) const NR_CLASSES: usize = (PAGE_SIZE + OBJ_HEADER).div_ceil(CLASS_BYTES);
/// Arena unit handed to a size class.
pub const CHUNK_BYTES: usize = 64 << 10;
pub(super) const NIL: u32 = u32::MAX;
pub(super) const NO_OBJ: u64 = 0xffff;
pub(super) const NO_CLASS: u64 = 0x1ff;
// Every class fits the metadata word's 9 bits, and every object index a slot entry's 12.
const _: () = assert!(NR_CLASSES < NO_CLASS as usize && CHUNK_BYTES / CLASS_BYTES <= 1 << 12);

// Slot entry, word 0: kind | length << 2 | object << 16 | class << 28 | chunk << 37 (the
// chunk's class, which may be larger than the length's: see `alloc_object`). Word 1: the
// repeated word.
pub(super) const KIND_EMPTY: u64 = 0;
pub(super) const KIND_SAME: u64 = 1;
pub(super) const KIND_COMPRESSED: u64 = 2;
pub(super) const KIND_RAW: u64 = 3;
/// Chunks a slot entry can name (27 bits): an arena of up to 8 TiB.
pub(super) const MAX_CHUNKS: u64 = 1 << 27;

pub(super) fn entry(kind: u64, len: usize, class: usize, chunk: u32, obj: u64) -> u64 {
    debug_assert!(len < 1 << 13 && obj < 1 << 12 && (class as u64) < NO_CLASS && (chunk as u64) < MAX_CHUNKS);
    kind | (len as u64) << 2 | (obj << 16) | (class as u64) << 28 | (chunk as u64) << 37
}
pub(super) fn entry_kind(e: u64) -> u64 {
    e & 3
}
pub(super) fn entry_len(e: u64) -> usize {
    ((e >> 2) & 0x1fff) as usize
}
pub(super) fn entry_obj(e: u64) -> u64 {
    (e >> 16) & 0xfff
}
pub(super) fn entry_class(e: u64) -> usize {
    ((e >> 28) & 0x1ff) as usize
}
pub(super) fn entry_chunk(e: u64) -> u32 {
    (e >> 37) as u32
}

pub(super) fn class_of(len: usize) -> usize {
    len.div_ceil(CLASS_BYTES).max(1) - 1
}
const fn class_size(c: usize) -> usize {
    (c + 1) * CLASS_BYTES
}

/// Each class's anchor: the smallest class at or above it whose size is on a ladder 1/8
/// apart (every class up to 128 bytes, then sizes growing by an eighth). A class's first
/// chunk is started at its anchor, so that the classes of a sparse stretch share it.
const ANCHOR: [u16; NR_CLASSES] = anchors();

const fn anchors() -> [u16; NR_CLASSES] {
    let mut on_ladder = [false; NR_CLASSES];
    let mut size = CLASS_BYTES;
    while size <= class_size(NR_CLASSES - 1) {
        on_ladder[size / CLASS_BYTES - 1] = true;
        size = if size < 128 { size + CLASS_BYTES } else { (size * 9 / 8).div_ceil(CLASS_BYTES) * CLASS_BYTES };
    }
    on_ladder[NR_CLASSES - 1] = true;
    let mut out = [0u16; NR_CLASSES];
    let (mut c, mut next) = (NR_CLASSES, NR_CLASSES - 1);
    while c > 0 {
        c -= 1;
        if on_ladder[c] {
            next = c;
        }
        out[c] = next as u16;
    }
    out
}
/// The largest class an object of class `c` may borrow room in: one at most a quarter
/// larger (zsmalloc's classes are 16 bytes apart too; its waste per object is below one
/// class step, ours below a quarter where a class borrows).
pub(super) fn borrow_limit(c: usize) -> usize {
    (class_size(c) * 5 / 4 / CLASS_BYTES - 1).clamp(c, NR_CLASSES - 1)
}
pub(super) fn objects_per_chunk(c: usize) -> u64 {
    (CHUNK_BYTES / class_size(c)) as u64
}

// Chunk metadata word: class (9 bits) | inuse << 9 | free_head << 25 | next_unused << 41.
pub(super) fn meta(class: u64, inuse: u64, free_head: u64, next_unused: u64) -> u64 {
    debug_assert!(class <= NO_CLASS && inuse <= 0xffff && free_head <= 0xffff && next_unused <= 0xffff);
    class | inuse << 9 | free_head << 25 | next_unused << 41
}
pub(super) fn meta_class(m: u64) -> u64 {
    m & 0x1ff
}
pub(super) fn meta_inuse(m: u64) -> u64 {
    (m >> 9) & 0xffff
}
fn meta_free_head(m: u64) -> u64 {
    (m >> 25) & 0xffff
}
pub(super) fn meta_next_unused(m: u64) -> u64 {
    (m >> 41) & 0xffff
}

pub(super) struct ClassState {
    /// First chunk of this class with room, linked through `links`.
    pub(super) partial_head: u32,
    /// Whether this class has started a chunk of its anchor class (see `alloc_object`):
    /// the next chunk it needs is its own.
    pub(super) anchored: bool,
}

pub(super) struct ArenaState {
    /// Free chunks, linked through `links` (next half).
    pub(super) free_head: u32,
    /// Chunks never used yet start here.
    pub(super) next_fresh: u32,
}

impl ZpoolBackend {
    pub(super) fn obj_offset(chunk: u32, class: usize, obj: u64) -> usize {
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
    pub(super) fn alloc_object(&self, c: usize) -> Option<(u32, usize, u64)> {
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
        if share.is_some_and(|s| !s.try_grow(CHUNK_BYTES as u64, self.cfg.cap_bytes)) {
            return None;
        }
        let ch = {
            let mut a = self.free_chunks.lock();
            if a.free_head != NIL {
                let ch = a.free_head;
                a.free_head = self.links(ch).1;
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

    pub(super) fn free_object(&self, chunk: u32, obj: u64) {
        let c = meta_class(self.chunk_meta.load(chunk as usize, Ordering::Relaxed)) as usize;
        assert!(c < NR_CLASSES, "object freed in a free chunk {chunk}");
        let mut cls = self.classes[c].lock();
        let m = self.chunk_meta.load(chunk as usize, Ordering::Relaxed);
        let inuse = meta_inuse(m);
        assert!(inuse > 0, "chunk {chunk}: object freed twice");
        let was_full = inuse == objects_per_chunk(c);
        self.arena.write(Self::obj_offset(chunk, c, obj), &(meta_free_head(m) as u16).to_ne_bytes());
        let inuse = inuse - 1;
        if inuse == 0 {
            if !was_full {
                self.partial_unlink(&mut cls, chunk);
            }
            self.chunk_meta.store(chunk as usize, meta(NO_CLASS, 0, NO_OBJ, 0), Ordering::Relaxed);
            let mut a = self.free_chunks.lock();
            self.set_links(chunk, NIL, a.free_head);
            a.free_head = chunk;
            self.chunks_in_use.fetch_sub(1, Ordering::Relaxed);
            if let Some(share) = self.share.get() {
                share.shrink(CHUNK_BYTES as u64);
            }
        } else {
            if was_full {
                self.partial_push(&mut cls, chunk);
            }
            self.chunk_meta.store(chunk as usize, meta(c as u64, inuse, obj, meta_next_unused(m)), Ordering::Relaxed);
        }
    }
}
