//! The unit table of a pool that compresses pages together (`unit_pages` above 1): where
//! each unit's object is, which of its pages are still stored, how many pages a unit can
//! hold, and the counters.
//!
//! A unit has a row in the table (two words: its object's entry, then the mask of its members
//! still stored), at the index of its head, one of its members' slots; each member's slot
//! entry names the head and its index (`encoding::member_entry`). The pool (`mod.rs`) places
//! and reads the objects; this module owns the rows. It imports the pool's encodings
//! (`encoding.rs`) only.
//!
//! Locking: none; rows are atomics. A row is filled (mask, then entry) only by the writer of
//! its head slot, and only while its entry is empty: no other writer can pick it, since a
//! head is a slot the writer writes. The release that clears the mask's last bit empties the
//! entry after, so a writer that finds the entry empty finds the unit gone. Compaction moves
//! a unit's object by a compare-and-swap of the row's entry (`row_entry`), as it does a slot's.
//!
//! Invariants: a row's mask has a member's bit set iff that member's slot entry names the
//! row; a row with a bit set holds an object entry; `unit_pages` is the bits set in all rows.

use std::sync::atomic::{AtomicU64, Ordering};

use super::encoding::{entry_kind, KIND_COMPRESSED, KIND_EMPTY};
use crate::mapping::AtomicTable;
use crate::uffd::PAGE_SIZE;

/// Compressed bytes a unit is expected to take at most to be tried: nine tenths of a page
/// (an object's most), so that a unit expected to fit narrowly is not compressed in vain
/// half the time.
const UNIT_FILL_BYTES: usize = PAGE_SIZE * 9 / 10;

pub(super) struct UnitTable {
    /// Two words per slot of the pool: a unit's row at its head's index.
    rows: AtomicTable,
    nr_slots: u64,
    /// Units stored now, and the pages they hold.
    nr_units: AtomicU64,
    unit_pages: AtomicU64,
    /// Groups of pages that did not go into a unit whole: they did not compress into a
    /// page, or found no free row.
    fallbacks: AtomicU64,
    /// Compressed bytes per page, a moving average over what was compressed lately (pages
    /// alone and units): how many pages a unit can hold.
    bytes_per_page: AtomicU64,
}

impl UnitTable {
    pub(super) fn new(nr_slots: u64) -> std::io::Result<UnitTable> {
        Ok(UnitTable {
            rows: AtomicTable::new(2 * nr_slots as usize)?,
            nr_slots,
            nr_units: AtomicU64::new(0),
            unit_pages: AtomicU64::new(0),
            fallbacks: AtomicU64::new(0),
            bytes_per_page: AtomicU64::new(0),
        })
    }

    /// A fork child reading its copy of the pool keeps the rows (see `Mapping::set_inherited`).
    pub(super) fn set_inherited(&self, inherit: bool) {
        self.rows.set_inherited(inherit);
    }

    /// The entry word of unit `head`'s row (None: not a slot of the pool).
    pub(super) fn row_entry(&self, head: u64) -> Option<&AtomicU64> {
        (head < self.nr_slots).then(|| &self.rows[2 * head as usize])
    }

    /// Whether `nr_pages` pages are worth trying as one unit: the bytes per page compressed
    /// lately say that they fit one object.
    pub(super) fn may_fit(&self, nr_pages: usize) -> bool {
        self.bytes_per_page.load(Ordering::Relaxed) as usize * nr_pages <= UNIT_FILL_BYTES
    }

    /// Folds `bytes` compressed for `nr_pages` into the moving average of compressed bytes
    /// per page (a 16th per sample; threads racing lose a sample, no more).
    pub(super) fn note_compressed(&self, bytes: usize, nr_pages: usize) {
        let per_page = (bytes / nr_pages.max(1)) as i64;
        let avg = self.bytes_per_page.load(Ordering::Relaxed) as i64;
        self.bytes_per_page.store((avg + (per_page - avg) / 16) as u64, Ordering::Relaxed);
    }

    /// A group that did not go into a unit whole.
    pub(super) fn note_fallback(&self) {
        self.fallbacks.fetch_add(1, Ordering::Relaxed);
    }

    /// A slot of `slots` (being written by the caller) whose row is free, to head a unit.
    pub(super) fn free_head(&self, slots: &[u64]) -> Option<u64> {
        slots.iter().copied().find(|&s| self.rows[2 * s as usize].load(Ordering::Acquire) == KIND_EMPTY)
    }

    /// Fills unit `head`'s row (free, see `free_head`) for `nr_pages` members with the object
    /// entry `object`: the mask, then the entry; the caller then publishes the members.
    pub(super) fn fill(&self, head: u64, nr_pages: usize, object: u64) {
        assert!((2..32).contains(&nr_pages), "a unit of {nr_pages} pages");
        debug_assert_eq!(entry_kind(object), KIND_COMPRESSED);
        debug_assert_eq!(self.rows[2 * head as usize].load(Ordering::Relaxed), KIND_EMPTY, "row {head} taken");
        self.rows[2 * head as usize + 1].store((1 << nr_pages) - 1, Ordering::Relaxed);
        self.rows[2 * head as usize].store(object, Ordering::Release);
        self.unit_pages.fetch_add(nr_pages as u64, Ordering::Relaxed);
        self.nr_units.fetch_add(1, Ordering::Relaxed);
    }

    /// Member `index` of unit `head` is no longer stored: clears its bit, and for the last
    /// one empties the row and returns the object entry to free.
    pub(super) fn release(&self, head: u64, index: usize) -> Option<u64> {
        let Some(row) = self.row_entry(head) else {
            debug_assert!(false, "a member of unit {head}, past the table");
            return None;
        };
        let bit = 1u64 << index;
        let before = self.rows[2 * head as usize + 1].fetch_and(!bit, Ordering::AcqRel);
        debug_assert!(before & bit != 0, "member {index} of unit {head} freed twice");
        self.unit_pages.fetch_sub(1, Ordering::Relaxed);
        if before != bit {
            return None;
        }
        let e = row.swap(KIND_EMPTY, Ordering::AcqRel);
        debug_assert_eq!(entry_kind(e), KIND_COMPRESSED, "unit {head}'s row held no object");
        self.nr_units.fetch_sub(1, Ordering::Relaxed);
        Some(e)
    }

    /// Units stored now, the pages they hold, and the groups stored otherwise since the start.
    pub(super) fn counts(&self) -> (u64, u64, u64) {
        let load = |c: &AtomicU64| c.load(Ordering::Relaxed);
        (load(&self.nr_units), load(&self.unit_pages), load(&self.fallbacks))
    }
}
