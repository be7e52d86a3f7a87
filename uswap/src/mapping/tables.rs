//! Large tables in lazily zero-filled mappings: an entry per page of a terabyte region or per
//! cluster of a terabyte device costs memory only where it is written.

use std::io;
use std::sync::atomic::AtomicU64;

use super::{MapOptions, Mapping};
use crate::uffd::PAGE_SIZE;

/// A zero-initialised table of atomic words backed by its own anonymous mapping, so that a
/// large table (one word per page of a terabyte region) costs memory only where it is used;
/// or, made with [`AtomicTable::small_in_heap`], a small one in the heap.
pub struct AtomicTable {
    words: Words,
    len: usize,
}

enum Words {
    Mapped(Mapping),
    /// Never given to a fork child on its own (`set_inherited`) nor removed (`remove_all`).
    Heap(Box<[AtomicU64]>),
}

/// Largest table [`AtomicTable::small_in_heap`] puts in the heap: a page of words.
pub const HEAP_TABLE_MAX_WORDS: usize = PAGE_SIZE / 8;

impl AtomicTable {
    pub fn new(len: usize) -> io::Result<AtomicTable> {
        let map = Mapping::anonymous((len * 8).max(PAGE_SIZE), MapOptions { no_huge_pages: false, dont_fork: true })?;
        Ok(AtomicTable { words: Words::Mapped(map), len })
    }

    /// As [`AtomicTable::new`], but a table of up to [`HEAP_TABLE_MAX_WORDS`] is allocated
    /// from the heap: a region's page table, of which a process may have tens of thousands
    /// (V8 makes each 256 KiB page of its heap a mapping), each of which would otherwise be
    /// a kernel mapping of its own beside the region's, and count against the process's
    /// `vm.max_map_count` and the engine's range table. Such a table is in a fork child too
    /// (copy-on-write), where nothing reads it.
    pub fn small_in_heap(len: usize) -> io::Result<AtomicTable> {
        if len > HEAP_TABLE_MAX_WORDS {
            return AtomicTable::new(len);
        }
        let words: Box<[AtomicU64]> = (0..len).map(|_| AtomicU64::new(0)).collect();
        Ok(AtomicTable { words: Words::Heap(words), len })
    }
}

impl AtomicTable {
    /// A table shared with every fork child made while it lives (`MAP_SHARED`): a word one
    /// process changes, the others see changed.
    pub fn shared(len: usize) -> io::Result<AtomicTable> {
        Ok(AtomicTable { words: Words::Mapped(Mapping::shared_anonymous((len * 8).max(PAGE_SIZE))?), len })
    }

    /// Zeroes a [`AtomicTable::shared`] table and gives its memory back (`MADV_REMOVE`; for
    /// every process that maps it). A word read concurrently reads its old value or zero.
    pub fn remove_all(&self) -> io::Result<()> {
        match &self.words {
            Words::Mapped(map) => map.advise(0, map.len(), libc::MADV_REMOVE),
            Words::Heap(_) => unreachable!("uswap invariant: a table in the heap is never shared"),
        }
    }

    /// Whether a fork child gets a copy of the table (see [`Mapping::set_inherited`]).
    pub fn set_inherited(&self, inherit: bool) {
        match &self.words {
            Words::Mapped(map) => map.set_inherited(inherit),
            Words::Heap(_) => assert!(inherit, "uswap invariant: a table in the heap is always inherited"),
        }
    }
}

impl std::ops::Deref for AtomicTable {
    type Target = [AtomicU64];
    fn deref(&self) -> &[AtomicU64] {
        match &self.words {
            // SAFETY: the mapping is at least `len * 8` bytes, page-aligned (so 8-aligned),
            // zero-filled by the kernel (a valid AtomicU64), owned by `self` and never
            // unmapped while `self` lives; all access goes through atomics.
            Words::Mapped(map) => unsafe { std::slice::from_raw_parts(map.addr() as *const AtomicU64, self.len) },
            Words::Heap(words) => words,
        }
    }
}

/// An array of `T` in lazily zero-filled memory: a large array (one entry per cluster of a
/// terabyte device) costs memory and start-up time only where entries are written. Every
/// entry starts as all-zero bytes, which must be a valid `T` (the constructor's contract);
/// an entry is given its real initial value with [`ZeroedArray::init`] before first use.
/// Entries are never dropped: `T` may not need dropping.
pub struct ZeroedArray<T> {
    map: Mapping,
    len: usize,
    _t: std::marker::PhantomData<T>,
}

// SAFETY: the array owns its entries as a `Box<[T]>` would; sharing it shares `&T`s.
unsafe impl<T: Send> Send for ZeroedArray<T> {}
// SAFETY: as above: `&ZeroedArray<T>` only hands out `&T` (and `init`, whose caller excludes
// every other access to the entry).
unsafe impl<T: Sync> Sync for ZeroedArray<T> {}

impl<T> ZeroedArray<T> {
    /// # Safety
    /// All-zero bytes must be a valid value of `T`.
    pub unsafe fn new(len: usize) -> io::Result<ZeroedArray<T>> {
        const { assert!(std::mem::align_of::<T>() <= PAGE_SIZE && !std::mem::needs_drop::<T>()) };
        let bytes = (len * std::mem::size_of::<T>()).max(PAGE_SIZE);
        let map = Mapping::anonymous(bytes, MapOptions { no_huge_pages: false, dont_fork: true })?;
        Ok(ZeroedArray { map, len, _t: std::marker::PhantomData })
    }

    /// Writes entry `i`'s initial value over its zero bytes (which need no drop).
    ///
    /// # Safety
    /// No reference to entry `i` may exist, and no other thread may access it, until this
    /// returns; the entry must not have been given a value that needs dropping.
    pub unsafe fn init(&self, i: usize, value: T) {
        assert!(i < self.len, "entry {i} of {}", self.len);
        // SAFETY: in bounds (checked), aligned (page-aligned base, T-sized stride); the caller
        // guarantees exclusive access to the entry and that nothing there needs dropping.
        unsafe { std::ptr::write((self.map.addr() as *mut T).add(i), value) };
    }
}

impl<T> std::ops::Deref for ZeroedArray<T> {
    type Target = [T];
    fn deref(&self) -> &[T] {
        // SAFETY: the mapping holds `len` entries, page-aligned, each a valid `T` (zero bytes
        // are one, by the constructor's contract, or `init` wrote one); owned by `self` and
        // never unmapped while it lives.
        unsafe { std::slice::from_raw_parts(self.map.addr() as *const T, self.len) }
    }
}
