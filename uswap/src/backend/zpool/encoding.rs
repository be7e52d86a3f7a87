//! The words the compressed pool stores and the arithmetic of its size classes: a slot's
//! entry (kind, length, class, chunk, object; a unit member's head and index), a chunk's
//! metadata word (class, objects in use, free list, next unused object, evacuation), and
//! the classes (16 bytes apart up to a page and an object header, each with its anchor and
//! the largest class it may borrow room in). Pure functions and constants: the pool
//! (`mod.rs`) and its allocator (`allocator.rs`) share them; nothing here holds state.

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
pub(super) const NO_OBJ: u64 = 0xffff;
pub(super) const NO_CLASS: u64 = 0x1ff;
// Every class fits the metadata word's 9 bits, and every object index a slot entry's 12.
const _: () = assert!(NR_CLASSES < NO_CLASS as usize && CHUNK_BYTES / CLASS_BYTES <= 1 << 12);

// Slot entry, word 0: kind | length << 2 | object << 16 | class << 28 | chunk << 37 (the
// chunk's class, which may be larger than the length's: see `Allocator::alloc_object`).
// Word 1: the repeated word.
pub(super) const KIND_EMPTY: u64 = 0;
pub(super) const KIND_SAME: u64 = 1;
pub(super) const KIND_COMPRESSED: u64 = 2;
pub(super) const KIND_RAW: u64 = 3;
/// A unit member's entry (see `mod.rs`, "Units"): `KIND_SAME`'s kind, which uses no other
/// bit, with this bit set, the page's index in its unit (bits 3-7) and the unit's head
/// (bits 8 on), the slot whose row in the pool's unit table holds the unit's object entry.
const MEMBER: u64 = 1 << 2;
/// An object header naming a unit (its head slot with this bit) rather than a slot.
pub(super) const UNIT_ID: u64 = 1 << 31;

pub(super) fn member_entry(head: u64, index: usize) -> u64 {
    debug_assert!(index < 32 && head < UNIT_ID);
    KIND_SAME | MEMBER | (index as u64) << 3 | head << 8
}
/// The head and index of a unit member's entry; None for any other entry.
pub(super) fn entry_member(e: u64) -> Option<(u64, usize)> {
    (entry_kind(e) == KIND_SAME && e & MEMBER != 0).then_some((e >> 8, ((e >> 3) & 0x1f) as usize))
}
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
/// Bytes the object entry `e` points at takes in its chunk: its class's size.
pub(super) fn entry_object_bytes(e: u64) -> u64 {
    class_size(entry_class(e)) as u64
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
pub(super) const fn class_size(c: usize) -> usize {
    (c + 1) * CLASS_BYTES
}

/// Each class's anchor: the smallest class at or above it whose size is on a ladder 1/8
/// apart (every class up to 128 bytes, then sizes growing by an eighth). A class's first
/// chunk is started at its anchor, so that the classes of a sparse stretch share it.
pub(super) const ANCHOR: [u16; NR_CLASSES] = anchors();

pub(super) const fn anchors() -> [u16; NR_CLASSES] {
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
pub(super) fn meta_free_head(m: u64) -> u64 {
    (m >> 25) & 0xffff
}
pub(super) fn meta_next_unused(m: u64) -> u64 {
    (m >> 41) & 0xffff
}
/// Set on a chunk `compact` is emptying: off its class's partial list though it has room,
/// so nothing is placed in it, and not freed by `free_object` when its last object goes (the
/// compactor, which still reads its objects, frees it).
pub(super) const META_EVACUATING: u64 = 1 << 57;
pub(super) fn meta_evacuating(m: u64) -> bool {
    m & META_EVACUATING != 0
}
