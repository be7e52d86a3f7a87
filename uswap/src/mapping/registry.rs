//! A fixed-size, lock-free-to-read table of managed mappings, searched by address.
//!
//! The signal-mode fault path must find the region that owns a faulting address without
//! allocating or locking, and several pagers in one process share one SIGBUS handler, so
//! the table is process-wide (a `static`). Readers protect the entry they use with a
//! per-slot user count (a one-slot hazard pointer); removal clears the pointer, waits for the
//! count to drain, and only then hands the `Arc` back to be dropped. Readers never clone or
//! drop an `Arc`, so the last reference is never released inside a signal handler.
//!
//! Locking: `insert`, `remove` and `set_range` are serialised by a mutex (they run on
//! `map`, `drop` and an event's move, never on the fault path). `find_preferring`, `get`,
//! `next_start_after` and `for_each_overlapping` take no lock: they read the index under
//! its sequence count (below), and scan the slots when a writer was at it.
//!
//! Search: a process may have tens of thousands of regions (V8 makes each 256 KiB page of
//! its heap a mapping of its own), and a scan of every slot on each fault would cost more
//! than the fault. `find_preferring` looks first where a hash of the address's 64 KiB says
//! (the slot found there last), then in the index: the ranges sorted by start, highest
//! first, which the writers shift in place (under their lock) and readers binary-search
//! without a lock,
//! between two reads of `index_seq` (odd while a writer rewrites it; a search that saw it
//! change is redone by a scan of every slot). Neither is trusted: a slot
//! found is acquired and its range re-checked as a scan's is. The index is rewritten before
//! a value is published and after one is withdrawn, so that it never lacks a published
//! range (a search between the two finds a slot it cannot acquire, as a scan would).
//! Highest first because mmap places each new mapping below the last: the common insert
//! and the common removal (the newest mapping) are at the index's end, and with each
//! entry's `max_end` covering the entries after it, neither shifts nor recomputes more
//! than a few entries. A writer finds a slot's entry by its start, not by a walk.
//!
//! Invariants: a slot's `start`, `end` and `gen` are written before its pointer is published
//! and are stable while the pointer is non-null; a non-null pointer came from
//! `Arc::into_raw` and stays valid while the slot's user count is non-zero. Once a process
//! inserts, every entry is its own: a fork child's first `insert` forgets the parent's.

use std::sync::atomic::{AtomicPtr, AtomicU32, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use crossbeam_utils::Backoff;

struct Slot<T> {
    start: AtomicUsize,
    end: AtomicUsize,
    gen: AtomicU32,
    users: AtomicU32,
    value: AtomicPtr<T>,
}

impl<T> Slot<T> {
    const fn new() -> Self {
        Slot {
            start: AtomicUsize::new(0),
            end: AtomicUsize::new(0),
            gen: AtomicU32::new(0),
            users: AtomicU32::new(0),
            value: AtomicPtr::new(std::ptr::null_mut()),
        }
    }
}

pub struct Registry<T, const N: usize> {
    slots: [Slot<T>; N],
    /// Slots `0..high` have been used at least once: the scan bound of `find_preferring`.
    high: AtomicUsize,
    /// No slot below this one is free (writers only): where `insert` looks for one.
    first_free: AtomicUsize,
    /// The slot plus one whose range `set_range` is changing (0: none), which
    /// `for_each_overlapping` meets wherever it moves.
    moving: AtomicUsize,
    /// Slot index plus one of the value last found for addresses hashing here (0: none):
    /// where `find_preferring` looks before it scans (see the module's comment).
    hints: [AtomicU32; NR_HINTS],
    /// The registered ranges sorted by start, highest first, `index_len` of them (see the
    /// module's comment).
    index: [IndexEntry; N],
    index_len: AtomicUsize,
    /// Odd while a writer rewrites `index`.
    index_seq: AtomicUsize,
    /// Serialises `insert`, `remove` and `set_range`, and with them every write to the index.
    /// (Every field starts as zeros: the table is in `.bss`, not in the library's file.)
    writers: Mutex<()>,
    /// The process whose `insert`s filled the table (0: none yet). A fork child inherits
    /// its parent's table; its first `insert` lets the parent's entries go, or they would be
    /// found first for the child's own regions where the ranges meet.
    owner_pid: AtomicU32,
}

/// A reference to a registered value, valid while the guard lives.
pub struct RegistryGuard<'a, T> {
    slot: &'a Slot<T>,
    value: &'a T,
    pub index: usize,
    pub gen: u32,
}

impl<T> std::ops::Deref for RegistryGuard<'_, T> {
    type Target = T;
    fn deref(&self) -> &T {
        self.value
    }
}

impl<T> Drop for RegistryGuard<'_, T> {
    fn drop(&mut self) {
        self.slot.users.fetch_sub(1, Ordering::SeqCst);
    }
}

impl<T, const N: usize> Default for Registry<T, N> {
    fn default() -> Self {
        Self::new()
    }
}

/// An entry of the readers' index: a range, the largest end of it and every entry after it
/// (those that start no higher; ranges may overlap: a search walks on while that passes the
/// address), and its slot.
struct IndexEntry {
    start: AtomicUsize,
    end: AtomicUsize,
    max_end: AtomicUsize,
    slot: AtomicUsize,
}

impl IndexEntry {
    const fn new() -> Self {
        IndexEntry {
            start: AtomicUsize::new(0),
            end: AtomicUsize::new(0),
            max_end: AtomicUsize::new(0),
            slot: AtomicUsize::new(0),
        }
    }

    /// The writer's move of an entry, with its `max_end` (the entries after it are the same).
    fn copy_from(&self, other: &IndexEntry) {
        self.start.store(other.start.load(Ordering::Relaxed), Ordering::Relaxed);
        self.end.store(other.end.load(Ordering::Relaxed), Ordering::Relaxed);
        self.max_end.store(other.max_end.load(Ordering::Relaxed), Ordering::Relaxed);
        self.slot.store(other.slot.load(Ordering::Relaxed), Ordering::Relaxed);
    }

    /// The index's order: by start, highest first (then by slot, highest first: keys are
    /// unique).
    fn key(&self) -> (usize, usize) {
        (self.start.load(Ordering::Relaxed), self.slot.load(Ordering::Relaxed))
    }
}

/// Entries a search walks over (ranges that start below the address and may reach it: a
/// large one partly unmapped and reused by small ones) before it gives up for a scan.
const MAX_INDEX_WALK: usize = 64;
/// Ranges that may hold one address at once, for a search of the index (else a scan).
const MAX_CANDIDATES: usize = 8;

/// Hints kept (a power of two): 256 KiB, touched only where addresses hash.
const NR_HINTS: usize = 1 << 16;
/// A hint covers 64 KiB of addresses, the smallest mapping `uswap run` manages.
const HINT_SHIFT: u32 = 16;
/// A region of up to this many hint granules has all of them pointed at it when inserted.
const HINTS_FILLED_ON_INSERT: usize = 64;

/// The hint for `addr` (Fibonacci hashing of its 64 KiB granule: neighbours spread).
fn hint_of(addr: usize) -> usize {
    ((addr >> HINT_SHIFT) as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15) as usize >> (usize::BITS - NR_HINTS.ilog2())
}

impl<T, const N: usize> Registry<T, N> {
    pub const fn new() -> Self {
        Registry {
            slots: [const { Slot::new() }; N],
            high: AtomicUsize::new(0),
            first_free: AtomicUsize::new(0),
            moving: AtomicUsize::new(0),
            hints: [const { AtomicU32::new(0) }; NR_HINTS],
            index: [const { IndexEntry::new() }; N],
            index_len: AtomicUsize::new(0),
            index_seq: AtomicUsize::new(0),
            writers: Mutex::new(()),
            owner_pid: AtomicU32::new(0),
        }
    }

    /// Registers `value` for addresses `[start, end)`. Returns its slot index and generation,
    /// or `None` when all `N` slots are taken.
    pub fn insert(&self, start: usize, end: usize, value: Arc<T>) -> Option<(usize, u32)> {
        let _w = self.writers.lock().unwrap_or_else(|e| e.into_inner());
        if self.owner_pid.load(Ordering::SeqCst) != std::process::id() {
            // A fork child's first region: the entries are the parent's (a child that re-arms
            // has let them go already, and this finds nothing more to forget).
            self.forget_all_in_fork_child();
        }
        let first_free = self.first_free.load(Ordering::Relaxed).min(N);
        let idx =
            first_free + self.slots[first_free..].iter().position(|s| s.value.load(Ordering::SeqCst).is_null())?;
        self.first_free.store(idx + 1, Ordering::Relaxed);
        let s = &self.slots[idx];
        let gen = s.gen.load(Ordering::Relaxed).wrapping_add(1);
        s.gen.store(gen, Ordering::Relaxed);
        // Sequentially consistent, as `remove`'s clearing: `for_each_overlapping` skips a
        // slot on its range alone.
        s.start.store(start, Ordering::SeqCst);
        s.end.store(end, Ordering::SeqCst);
        self.reindex(idx, None, Some((start, end)));
        s.value.store(Arc::into_raw(value) as *mut T, Ordering::SeqCst);
        self.high.fetch_max(idx + 1, Ordering::SeqCst);
        self.hint_range(idx, start, end);
        Some((idx, gen))
    }

    /// Points the hints of a small range at slot `idx` (a large one is hinted as it faults).
    fn hint_range(&self, idx: usize, start: usize, end: usize) {
        let (first, last) = (start >> HINT_SHIFT, end.saturating_sub(1) >> HINT_SHIFT);
        if end > start && last - first < HINTS_FILLED_ON_INSERT {
            for granule in first..=last {
                self.hints[hint_of(granule << HINT_SHIFT)].store(idx as u32 + 1, Ordering::Relaxed);
            }
        }
    }

    /// Unregisters slot `idx`, waits until no reader uses it, and returns the value.
    pub fn remove(&self, idx: usize) -> Option<Arc<T>> {
        let _w = self.writers.lock().unwrap_or_else(|e| e.into_inner());
        let s = &self.slots[idx];
        let p = s.value.swap(std::ptr::null_mut(), Ordering::SeqCst);
        if p.is_null() {
            return None;
        }
        let backoff = Backoff::new();
        // Terminates: the slot no longer publishes the region, so no new user arrives; each
        // current user is a fault or reclaim round that ends without waiting on this thread
        // (which blocks its asynchronous signals for the call, see `AsyncSignalsBlocked`).
        while s.users.load(Ordering::SeqCst) != 0 {
            backoff.snooze();
        }
        let old_start = s.start.load(Ordering::Relaxed);
        s.start.store(0, Ordering::SeqCst);
        s.end.store(0, Ordering::SeqCst);
        self.reindex(idx, Some(old_start), None);
        self.first_free.fetch_min(idx, Ordering::Relaxed);
        // SAFETY: `p` came from `Arc::into_raw` in `insert`, the slot no longer publishes it
        // and no reader holds it (users drained after the swap), so we own that reference.
        Some(unsafe { Arc::from_raw(p) })
    }

    /// Moves slot `idx` to `[start, end)` (its value moved: `update` tells it so, first).
    /// Readers see the old or the new range, and re-check what they find.
    pub fn set_range(&self, idx: usize, start: usize, end: usize, update: impl FnOnce(&T)) {
        let _w = self.writers.lock().unwrap_or_else(|e| e.into_inner());
        let Some(g) = self.acquire(idx) else { return };
        let s = &self.slots[idx];
        let old_start = s.start.load(Ordering::Relaxed);
        // A window where the slot matches nothing is harmless (a fault finds no region and is
        // retried); one where it matches a wrong range is not: clear it first, before the
        // value moves (`for_each_overlapping` takes a cleared slot, and the one `moving`).
        self.moving.store(idx + 1, Ordering::SeqCst);
        s.end.store(0, Ordering::SeqCst);
        update(&g);
        // The index first, as `insert` does: it never lacks a range a slot shows.
        self.reindex(idx, Some(old_start), Some((start, end)));
        s.start.store(start, Ordering::SeqCst);
        s.end.store(end, Ordering::SeqCst);
        self.moving.store(0, Ordering::SeqCst);
        self.hint_range(idx, start, end);
    }

    fn acquire(&self, idx: usize) -> Option<RegistryGuard<'_, T>> {
        let s = &self.slots[idx];
        s.users.fetch_add(1, Ordering::SeqCst);
        let p = s.value.load(Ordering::SeqCst);
        if p.is_null() {
            s.users.fetch_sub(1, Ordering::SeqCst);
            return None;
        }
        // SAFETY: `p` is non-null, so it came from `Arc::into_raw`; our increment of `users`
        // happened before `remove` could observe zero, so the Arc stays alive until the guard
        // decrements it.
        let value = unsafe { &*p };
        Some(RegistryGuard { slot: s, value, index: idx, gen: s.gen.load(Ordering::Acquire) })
    }

    /// The first value registered for `addr` that `pred` accepts, if any; else the first
    /// registered for `addr` at all. For ranges that overlap (a new mapping placed where an
    /// older one lost part of its range). Lock-free and allocation-free: the hinted slot
    /// first, then the index, then (when the index cannot say) a scan; a find becomes the
    /// hint.
    pub fn find_preferring(&self, addr: usize, pred: impl Fn(&T) -> bool) -> Option<RegistryGuard<'_, T>> {
        let hint = &self.hints[hint_of(addr)];
        let hinted = hint.load(Ordering::Relaxed) as usize;
        if let Some(g) = hinted.checked_sub(1).filter(|&idx| idx < N).and_then(|idx| self.covering(idx, addr)) {
            if pred(&g) {
                return Some(g);
            }
        }
        let candidates = self.search_index(addr);
        let slots = candidates.as_ref().map_or(0..self.high.load(Ordering::Acquire), |c| 0..c.len());
        let mut first = None;
        // Bounded: at most `MAX_INDEX_WALK` candidates, or every used slot.
        for k in slots {
            let idx = candidates.as_ref().map_or(k, |c| c[k]);
            if let Some(g) = self.covering(idx, addr) {
                if pred(&g) {
                    hint.store(idx as u32 + 1, Ordering::Relaxed);
                    return Some(g);
                }
                first.get_or_insert(g);
            }
        }
        first
    }

    /// The slots whose ranges held `addr` in the index, in slot order (a scan's); `None` when
    /// the index cannot say (see [`Self::indexed_overlapping`]): then every slot must be
    /// scanned.
    fn search_index(&self, addr: usize) -> Option<arrayvec::ArrayVec<usize, MAX_CANDIDATES>> {
        self.indexed_overlapping(addr, addr)
    }

    /// The slots whose indexed ranges overlap `[start, last]` (`last` included), in slot
    /// order; `None` when the index cannot say: a writer changed it meanwhile, more than
    /// `MAX_INDEX_WALK` ranges start at or below `last` and may reach `start`, or more than
    /// `CAP` overlap it. The fault path's search (`CAP` a few) and an event's walk.
    fn indexed_overlapping<const CAP: usize>(
        &self,
        start: usize,
        last: usize,
    ) -> Option<arrayvec::ArrayVec<usize, CAP>> {
        self.read_index(|| {
            let len = self.index_len.load(Ordering::Relaxed).min(N);
            let lo = self.first_indexed_at_or_below(last, len);
            let mut found = arrayvec::ArrayVec::new();
            let mut complete = len - lo <= MAX_INDEX_WALK;
            for e in self.index[lo..len].iter().take(MAX_INDEX_WALK) {
                if e.max_end.load(Ordering::Relaxed) <= start {
                    complete = true; // no range from here on reaches `start`
                    break;
                }
                if start < e.end.load(Ordering::Relaxed) {
                    found.try_push(e.slot.load(Ordering::Relaxed).min(N - 1)).ok()?;
                }
            }
            found.sort_unstable();
            complete.then_some(found)
        })
    }

    /// `read`'s answer, if no writer changed the index while it read (a seqlock's reader:
    /// what it read may be torn, and is then thrown away). `None`: a writer was at it, or
    /// `read` could not say.
    fn read_index<R>(&self, read: impl FnOnce() -> Option<R>) -> Option<R> {
        let seq = self.index_seq.load(Ordering::Acquire);
        if seq % 2 == 1 {
            return None;
        }
        let answer = read();
        std::sync::atomic::fence(Ordering::Acquire);
        answer.filter(|_| self.index_seq.load(Ordering::Relaxed) == seq)
    }

    /// Runs `write` on the index between two increments of `index_seq` (a seqlock's writer:
    /// a reader that overlapped it sees the count changed). Under the writers' lock.
    fn write_index(&self, write: impl FnOnce()) {
        let seq = self.index_seq.load(Ordering::Relaxed);
        debug_assert!(seq % 2 == 0, "one writer at a time");
        self.index_seq.store(seq + 1, Ordering::Relaxed);
        std::sync::atomic::fence(Ordering::Release);
        write();
        self.index_seq.store(seq + 2, Ordering::Release);
    }

    /// The first of the index's first `len` entries for which `before` is false (those for
    /// which it holds come first): a binary search.
    fn index_partition(&self, len: usize, before: impl Fn(&IndexEntry) -> bool) -> usize {
        debug_assert!(len <= N);
        let (mut lo, mut hi) = (0, len);
        // Bounded: the interval halves each round.
        while lo < hi {
            let mid = (lo + hi) / 2;
            match before(&self.index[mid]) {
                true => lo = mid + 1,
                false => hi = mid,
            }
        }
        lo
    }

    /// The first of the index's first `len` entries that starts at or below `addr` (`len`
    /// if none; those before it start past `addr`): a binary search, whose result the caller
    /// validates by `index_seq`.
    fn first_indexed_at_or_below(&self, addr: usize, len: usize) -> usize {
        self.index_partition(len, |e| e.start.load(Ordering::Relaxed) > addr)
    }

    /// Under the writers' lock: slot `idx`'s entry, at `old_start` (`None`: it has none),
    /// leaves the index, and one for `range` enters it. The entries past each change are
    /// shifted in place, and the `max_end`s before it recomputed back to the first that stays,
    /// between two increments of `index_seq` (a seqlock's writer: a reader that overlapped it
    /// sees the count changed and scans instead). Allocation-free.
    fn reindex(&self, idx: usize, old_start: Option<usize>, range: Option<(usize, usize)>) {
        // Checked before the rewrite, not in it: a panic inside `write_index` would leave
        // `index_seq` odd, and the next writer would make it even over a half-rewritten
        // index. (Under the writers' lock the index is this thread's to read.)
        let len_before = self.index_len.load(Ordering::Relaxed);
        let at_old = old_start.and_then(|old_start| self.indexed_at(idx, old_start, len_before));
        debug_assert!(
            old_start.is_none_or(|s| at_old.is_some_and(|at| self.index[at].key() == (s, idx))),
            "uswap invariant: slot {idx} not indexed at its start {old_start:#x?}"
        );
        // One entry per live slot: `insert` found a free one, so there is room.
        let room = len_before - usize::from(at_old.is_some()) < N;
        debug_assert!(range.is_none() || room, "uswap invariant: more ranges indexed than slots");
        self.write_index(|| {
            // The writer's own stores: relaxed loads see them.
            let mut len = len_before;
            if let Some(at) = at_old {
                for i in at..len - 1 {
                    self.index[i].copy_from(&self.index[i + 1]);
                }
                len -= 1;
                self.recompute_max_ends_before(at, len);
            }
            if let Some((start, end)) = range.filter(|_| room) {
                let at = self.index_partition(len, |e| e.key() > (start, idx));
                for i in (at..len).rev() {
                    self.index[i + 1].copy_from(&self.index[i]);
                }
                len += 1;
                let after = if at + 1 < len { self.index[at + 1].max_end.load(Ordering::Relaxed) } else { 0 };
                let e = &self.index[at];
                e.start.store(start, Ordering::Relaxed);
                e.end.store(end, Ordering::Relaxed);
                e.max_end.store(end.max(after), Ordering::Relaxed);
                e.slot.store(idx, Ordering::Relaxed);
                self.recompute_max_ends_before(at, len);
            }
            self.index_len.store(len, Ordering::Relaxed);
        });
    }

    /// Where slot `idx`'s entry is among the index's first `len`, found by its start; not
    /// found there (never expected: a writer records both under the writers' lock), looked
    /// for by slot (the caller checks which).
    fn indexed_at(&self, idx: usize, old_start: usize, len: usize) -> Option<usize> {
        let at = self.index_partition(len, |e| e.key() > (old_start, idx));
        if at < len && self.index[at].key() == (old_start, idx) {
            return Some(at);
        }
        self.index[..len].iter().position(|e| e.slot.load(Ordering::Relaxed) == idx)
    }

    /// Under the writers' lock, after the entries from `from` on changed: the `max_end`s of
    /// the entries before `from`, from the nearest back to the first whose value stays
    /// (each is the larger of its end and the next entry's `max_end`: those before it stay
    /// too). Mappings placed top-down stop at once: a new one ends below the older starts.
    fn recompute_max_ends_before(&self, from: usize, len: usize) {
        let mut after = if from < len { self.index[from].max_end.load(Ordering::Relaxed) } else { 0 };
        // Bounded: at most `from` entries.
        for e in self.index[..from].iter().rev() {
            let max_end = e.end.load(Ordering::Relaxed).max(after);
            if e.max_end.load(Ordering::Relaxed) == max_end {
                break;
            }
            e.max_end.store(max_end, Ordering::Relaxed);
            after = max_end;
        }
    }

    /// Under the writers' lock: the index emptied (a fork child letting its parent's go).
    fn clear_index(&self) {
        self.write_index(|| self.index_len.store(0, Ordering::Relaxed));
    }

    /// Slot `idx`'s value if its range holds `addr`: read before and again under the
    /// slot's protection (the slot may have been reused between).
    fn covering(&self, idx: usize, addr: usize) -> Option<RegistryGuard<'_, T>> {
        let s = &self.slots[idx];
        let holds = || addr >= s.start.load(Ordering::Relaxed) && addr < s.end.load(Ordering::Relaxed);
        if !holds() {
            return None;
        }
        let g = self.acquire(idx)?;
        holds().then_some(g)
    }

    /// The lowest start of a registered range above `addr` (a hint: ranges change under
    /// it), so that a walk over addresses can skip what no range covers. Lock-free.
    pub fn next_start_after(&self, addr: usize) -> Option<usize> {
        let indexed = self.read_index(|| {
            let len = self.index_len.load(Ordering::Relaxed).min(N);
            let at_or_below = self.first_indexed_at_or_below(addr, len);
            Some(at_or_below.checked_sub(1).map(|next| self.index[next].start.load(Ordering::Relaxed)))
        });
        if let Some(next) = indexed {
            return next;
        }
        let high = self.high.load(Ordering::Acquire);
        self.slots[..high]
            .iter()
            .filter(|s| s.end.load(Ordering::Relaxed) != 0)
            .map(|s| s.start.load(Ordering::Relaxed))
            .filter(|&start| start > addr)
            .min()
    }

    /// The value in slot `idx` if its generation still matches `gen` in the bits of
    /// `gen_mask` (callers that pack generations into few bits compare only those).
    pub fn get(&self, idx: usize, gen: u32, gen_mask: u32) -> Option<RegistryGuard<'_, T>> {
        if idx >= N {
            return None;
        }
        let g = self.acquire(idx)?;
        (g.gen & gen_mask == gen & gen_mask).then_some(g)
    }

    /// Holds off `insert`, `remove` and `set_range` until the guard drops: across a `fork`,
    /// so that the regions do not change between their recording and the fork, and the
    /// child's copy of the lock is not left held by a thread it does not have.
    pub fn lock_writers(&self) -> std::sync::MutexGuard<'_, ()> {
        self.writers.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// In a fork child, before anything else reads the registry: lets go of every entry
    /// without dropping it. The entries are the parent's; their values may refer to threads
    /// and descriptors the child does not have, so they are leaked, never dropped. The
    /// caller holds the writer lock (`lock_writers`, taken before the fork, or `insert`'s).
    pub fn forget_all_in_fork_child(&self) {
        let high = self.high.load(Ordering::Acquire);
        for s in &self.slots[..high] {
            s.end.store(0, Ordering::SeqCst);
            s.start.store(0, Ordering::SeqCst);
            s.value.store(std::ptr::null_mut(), Ordering::SeqCst);
            // Readers that held it were the parent's other threads, which the child lacks.
            s.users.store(0, Ordering::SeqCst);
        }
        self.first_free.store(0, Ordering::Relaxed);
        self.moving.store(0, Ordering::SeqCst);
        self.clear_index();
        self.owner_pid.store(std::process::id(), Ordering::SeqCst);
    }

    /// Calls `f` on every registered value whose range may overlap `[start, end)` (one being
    /// moved, `set_range`, is included): an event's walk, which must not take every slot
    /// of tens of thousands. `f` checks the value's own range. The index's ranges, else
    /// (a writer at it, or more than `MAX_INDEX_WALK` ranges to walk) a scan of the slots.
    pub fn for_each_overlapping(&self, start: usize, end: usize, mut f: impl FnMut(&RegistryGuard<'_, T>)) {
        // Read before the index: a move that began after this load overlaps the walk (it may
        // be met at either place, as a scan would); one under way is met wherever it is.
        let moving = self.moving.load(Ordering::SeqCst);
        // Room for every range of a whole walk, and the one moving.
        let indexed =
            end.checked_sub(1).and_then(|last| self.indexed_overlapping::<{ MAX_INDEX_WALK + 1 }>(start, last));
        if let Some(mut found) = indexed {
            if let Some(idx) = moving.checked_sub(1).filter(|i| !found.contains(i)) {
                // The index may show it where it was; `f` checks where it is.
                found.push(idx.min(N - 1));
            }
            found.sort_unstable();
            for idx in found {
                if let Some(g) = self.acquire(idx) {
                    f(&g);
                }
            }
            return;
        }
        let high = self.high.load(Ordering::Acquire);
        for (idx, s) in self.slots[..high].iter().enumerate() {
            // `end`, `start`, `end` again: `set_range` clears `end` before it writes `start`,
            // so a pair torn by a move shows as a changed or cleared `end`, and is taken.
            let s_end = s.end.load(Ordering::SeqCst);
            let s_start = s.start.load(Ordering::SeqCst);
            let apart = s_end <= start || end <= s_start;
            if s_end != 0 && apart && s.end.load(Ordering::SeqCst) == s_end {
                continue;
            }
            if let Some(g) = self.acquire(idx) {
                f(&g);
            }
        }
    }

    /// Calls `f` on every registered value (for scans that are not on the fault path).
    pub fn for_each(&self, mut f: impl FnMut(&RegistryGuard<'_, T>)) {
        let high = self.high.load(Ordering::Acquire);
        for idx in 0..high {
            if let Some(g) = self.acquire(idx) {
                f(&g);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn find_get_remove() {
        static R: Registry<String, 8> = Registry::new();
        let (i, g) = R.insert(0x1000, 0x3000, Arc::new("a".to_string())).unwrap();
        let (j, _) = R.insert(0x5000, 0x6000, Arc::new("b".to_string())).unwrap();
        assert_ne!(i, j);
        assert_eq!(R.find_preferring(0x2fff, |_| true).map(|g| g.as_str().to_string()), Some("a".into()));
        assert!(R.find_preferring(0x3000, |_| true).is_none());
        assert_eq!(R.get(i, g, u32::MAX).map(|g| g.len()), Some(1));
        assert!(R.get(i, g + 1, u32::MAX).is_none());
        let a = R.remove(i).unwrap();
        assert_eq!(Arc::strong_count(&a), 1, "registry gave its reference back");
        assert!(R.find_preferring(0x2000, |_| true).is_none());
        assert!(R.get(i, g, u32::MAX).is_none());
        let (k, g2) = R.insert(0x9000, 0xa000, Arc::new("c".to_string())).unwrap();
        assert_eq!(k, i, "slot reused");
        assert_ne!(g2, g, "with a new generation");
        let mut n = 0;
        R.for_each(|_| n += 1);
        assert_eq!(n, 2);
    }

    /// Overlapping ranges: the first the predicate accepts, else the first at all.
    #[test]
    fn find_preferring_skips_what_the_predicate_refuses() {
        static R: Registry<String, 4> = Registry::new();
        R.insert(0x1000, 0x9000, Arc::new("old".to_string())).unwrap();
        R.insert(0x4000, 0x6000, Arc::new("new".to_string())).unwrap();
        let found = |addr, want: &str| R.find_preferring(addr, |v| v == want).map(|g| g.as_str().to_string());
        assert_eq!(found(0x5000, "new").as_deref(), Some("new"));
        assert_eq!(found(0x5000, "old").as_deref(), Some("old"));
        assert_eq!(found(0x5000, "none").as_deref(), Some("old"), "no match: the first registered");
        assert_eq!(found(0x2000, "new").as_deref(), Some("old"));
        assert!(found(0x9000, "old").is_none());
    }

    /// The next start above an address, for walks that skip unregistered addresses.
    #[test]
    fn next_start_after_skips_to_the_next_range() {
        static R: Registry<u8, 4> = Registry::new();
        R.insert(0x5000, 0x6000, Arc::new(1)).unwrap();
        let (i, _) = R.insert(0x9000, 0xa000, Arc::new(2)).unwrap();
        assert_eq!(R.next_start_after(0x1000), Some(0x5000));
        assert_eq!(R.next_start_after(0x5000), Some(0x9000));
        assert_eq!(R.next_start_after(0x9000), None);
        R.remove(i);
        assert_eq!(R.next_start_after(0x5000), None, "a removed range is not a next start");
    }

    /// A hint is where to look first, never an answer: a slot reused elsewhere, moved, or
    /// refused by the predicate sends the search on to a scan.
    #[test]
    fn stale_hints_are_checked_and_passed_over() {
        static R: Registry<String, 8> = Registry::new();
        let name = |addr| R.find_preferring(addr, |_| true).map(|g| g.as_str().to_string());
        let (a, _) = R.insert(0x10_0000, 0x11_0000, Arc::new("a".to_string())).unwrap();
        assert_eq!(name(0x10_8000).as_deref(), Some("a"));
        R.remove(a);
        let (b, _) = R.insert(0x50_0000, 0x51_0000, Arc::new("b".to_string())).unwrap();
        assert_eq!(b, a, "the slot the hint names, reused elsewhere");
        assert!(name(0x10_8000).is_none());
        R.insert(0x10_0000, 0x10_8000, Arc::new("c".to_string())).unwrap();
        assert_eq!(name(0x10_4000).as_deref(), Some("c"));
        R.set_range(b, 0x60_0000, 0x61_0000, |_| {});
        assert!(name(0x50_0000).is_none(), "a moved range is not found where it was");
        assert_eq!(name(0x60_f000).as_deref(), Some("b"));
        // Overlapping: the new range's insert pointed the hint at it; a predicate that
        // refuses it still finds the older one.
        R.insert(0x60_4000, 0x60_6000, Arc::new("d".to_string())).unwrap();
        let found = |want: &str| R.find_preferring(0x60_5000, |v| v == want).map(|g| g.as_str().to_string());
        assert_eq!(found("d").as_deref(), Some("d"));
        assert_eq!(found("b").as_deref(), Some("b"));
    }

    /// An event's walk meets the ranges it overlaps, and only those.
    #[test]
    fn for_each_overlapping_meets_the_overlapping_ranges() {
        static R: Registry<String, 8> = Registry::new();
        for (start, end, v) in [(0x1000, 0x3000, "a"), (0x3000, 0x5000, "b"), (0x8000, 0x9000, "c")] {
            R.insert(start, end, Arc::new(v.to_string())).unwrap();
        }
        let met = |start, end| {
            let mut met = Vec::new();
            R.for_each_overlapping(start, end, |g| met.push(g.as_str().to_string()));
            met.sort();
            met
        };
        assert_eq!(met(0x2000, 0x4000), ["a", "b"]);
        assert_eq!(met(0x3000, 0x8000), ["b"]);
        assert_eq!(met(0x8fff, 0xa000), ["c"]);
        assert!(met(0x5000, 0x8000).is_empty());
    }

    /// The index finds where a scan of every slot finds: for ranges apart, touching, nested
    /// and overlapping more deeply than a search walks back, at every address around them,
    /// and after some are removed and moved.
    #[test]
    fn the_index_finds_what_a_scan_finds() {
        static R: Registry<usize, 64> = Registry::new();
        let mut ranges: Vec<Option<(usize, usize)>> = Vec::new();
        let k = |i: usize| 0x100_0000 + i * 0x1_0000;
        for i in 0..30 {
            ranges.push(Some((k(i), k(i + 1)))); // apart and touching
        }
        for i in 0..12 {
            ranges.push(Some((k(40) + i * 0x1000, k(60)))); // twelve deep, nested
        }
        ranges.push(Some((k(35), k(70)))); // over all of them
        for (i, r) in ranges.iter().enumerate() {
            let (start, end) = r.unwrap();
            assert_eq!(R.insert(start, end, Arc::new(i)).map(|(slot, _)| slot), Some(i));
        }
        let check = |ranges: &[Option<(usize, usize)>]| {
            let mut said = 0;
            for addr in (k(0) - 0x1000..k(75)).step_by(0x800) {
                // The index alone, without the hints: where it answers, exactly the ranges
                // that hold `addr`, in slot order.
                let holding: Vec<usize> =
                    (0..ranges.len()).filter(|&i| ranges[i].is_some_and(|(s, e)| s <= addr && addr < e)).collect();
                if let Some(found) = R.search_index(addr) {
                    assert_eq!(found.as_slice(), holding.as_slice(), "{addr:#x}");
                    said += 1;
                } else {
                    assert!(holding.len() > MAX_CANDIDATES, "{addr:#x}: the index could not say, for {holding:?}");
                }
                // A range that holds `addr` (which one, where several do, is the hint's), or
                // none when none does.
                let holds = |i: usize| ranges[i].is_some_and(|(s, e)| s <= addr && addr < e);
                match R.find_preferring(addr, |_| true).map(|g| *g) {
                    Some(i) => assert!(holds(i), "{addr:#x}: found {i}"),
                    None => assert!(!(0..ranges.len()).any(holds), "{addr:#x}: none found"),
                }
                let next = ranges.iter().flatten().map(|&(s, _)| s).filter(|&s| s > addr).min();
                assert_eq!(R.next_start_after(addr), next, "{addr:#x}");
            }
            assert!(said > 1000, "the index answered {said} times");
        };
        check(&ranges);
        for i in [0, 5, 31, 42] {
            R.remove(i);
            ranges[i] = None;
        }
        R.set_range(7, k(72), k(73), |_| {});
        ranges[7] = Some((k(72), k(73)));
        check(&ranges);
    }

    /// A region that stays is found by every search while other threads' regions come and
    /// go beside it (the index rewritten under the searches).
    #[test]
    fn searches_find_a_region_while_others_come_and_go() {
        static R: Registry<u64, 64> = Registry::new();
        R.insert(0x800_0000, 0x801_0000, Arc::new(7)).unwrap();
        let stop = std::sync::atomic::AtomicBool::new(false);
        std::thread::scope(|s| {
            s.spawn(|| {
                for round in 0..20_000usize {
                    let start = 0x100_0000 + (round % 50) * 0x2_0000;
                    let (i, _) = R.insert(start, start + 0x1_0000, Arc::new(1)).unwrap();
                    R.remove(i);
                }
                stop.store(true, Ordering::Relaxed);
            });
            let (mut searches, mut answered) = (0u64, 0u64);
            while !stop.load(Ordering::Relaxed) {
                assert_eq!(R.find_preferring(0x800_8000, |_| true).map(|g| *g), Some(7));
                // The index alone (the hint answers the search above): it names the region,
                // or cannot say while a writer is at it.
                if let Some(found) = R.search_index(0x800_8000) {
                    assert_eq!(found.as_slice(), [0], "the index lost the region");
                    answered += 1;
                }
                searches += 1;
            }
            assert!(answered > 0 && searches > 0);
        });
    }

    /// The index's own invariants, read under the writers' lock: sorted by (start, slot),
    /// highest first, each `max_end` the largest end from it on, one entry per live slot.
    fn check_index<T, const N: usize>(r: &Registry<T, N>) {
        let _w = r.lock_writers();
        let len = r.index_len.load(Ordering::Relaxed);
        let mut after = 0;
        for i in (0..len).rev() {
            let e = &r.index[i];
            after = after.max(e.end.load(Ordering::Relaxed));
            assert_eq!(e.max_end.load(Ordering::Relaxed), after, "entry {i} of {len}");
            if i + 1 < len {
                assert!(e.key() > r.index[i + 1].key(), "entries {i} and {} out of order", i + 1);
            }
            let s = &r.slots[e.slot.load(Ordering::Relaxed)];
            assert!(!s.value.load(Ordering::Relaxed).is_null(), "entry {i} names a free slot");
            assert_eq!(s.start.load(Ordering::Relaxed), e.start.load(Ordering::Relaxed));
            assert_eq!(s.end.load(Ordering::Relaxed), e.end.load(Ordering::Relaxed));
        }
        let live = r.slots.iter().filter(|s| !s.value.load(Ordering::Relaxed).is_null()).count();
        assert_eq!(live, len, "every live slot indexed once");
    }

    /// Inserts, removals and moves in a random order (mappings placed top-down, as mmap
    /// does, and anywhere): after each the index keeps its invariants, and an event's walk
    /// over the index meets exactly the ranges a scan of the slots meets.
    #[test]
    fn the_index_keeps_its_order_through_inserts_removals_and_moves() {
        static R: Registry<usize, 256> = Registry::new();
        let mut live: Vec<Option<(usize, usize)>> = vec![None; 256];
        let mut rng = 0x2545_f491_4f6c_dd1du64;
        let mut next = || {
            rng ^= rng << 13;
            rng ^= rng >> 7;
            rng ^= rng << 17;
            rng as usize
        };
        let mut top = 0x7f00_0000_0000usize;
        let (mut walked_in_index, mut ops) = (0, 0);
        while ops < 6_000 {
            ops += 1;
            let pages = 1 + next() % 64;
            let (start, end) = match next() % 3 {
                0 => {
                    top -= pages * 0x1000 + (next() % 2) * 0x1000; // below the last, touching or not
                    (top, top + pages * 0x1000)
                }
                _ => {
                    let start = 0x7f00_0000_0000 - (next() % 0x4000) * 0x1000; // anywhere, overlapping too
                    (start, start + pages * 0x1000)
                }
            };
            let taken: Vec<usize> = (0..live.len()).filter(|&i| live[i].is_some()).collect();
            match next() % 4 {
                0 | 1 if taken.len() < 200 => {
                    let (i, _) = R.insert(start, end, Arc::new(0)).unwrap();
                    assert_eq!(Some(i), live.iter().position(Option::is_none), "not the lowest free slot");
                    live[i] = Some((start, end));
                }
                2 if !taken.is_empty() => {
                    let i = taken[next() % taken.len()];
                    R.set_range(i, start, end, |_| {});
                    live[i] = Some((start, end));
                }
                _ if !taken.is_empty() => {
                    let i = taken[next() % taken.len()];
                    R.remove(i).unwrap();
                    live[i] = None;
                }
                _ => continue,
            }
            check_index(&R);
            let (a, b) = (start - 0x4000, start + 0x2000);
            let mut met = Vec::new();
            R.for_each_overlapping(a, b, |g| met.push(g.index));
            let overlap = |i: usize| live[i].is_some_and(|(s, e)| s < b && a < e);
            let want: Vec<usize> = (0..live.len()).filter(|&i| overlap(i)).collect();
            met.retain(|&i| overlap(i)); // the walk may name more; its callers check ranges
            assert_eq!(met, want, "walk over [{a:#x}, {b:#x})");
            walked_in_index += usize::from(R.indexed_overlapping::<{ MAX_INDEX_WALK + 1 }>(a, b - 1).is_some());
            for addr in [a, start, b - 1] {
                // The fault path's search: exactly the ranges that hold `addr`, or no answer
                // (more ranges than it takes).
                let holding: Vec<usize> =
                    (0..live.len()).filter(|&i| live[i].is_some_and(|(s, e)| s <= addr && addr < e)).collect();
                match R.search_index(addr) {
                    Some(found) => assert_eq!(found.as_slice(), holding.as_slice(), "{addr:#x}"),
                    None => assert!(holding.len() > MAX_CANDIDATES, "{addr:#x}: no answer for {holding:?}"),
                }
            }
            let next_start = live.iter().flatten().map(|&(s, _)| s).filter(|&s| s > a).min();
            assert_eq!(R.next_start_after(a), next_start, "{a:#x}");
        }
        assert!(walked_in_index > ops / 2, "the index answered {walked_in_index} of {ops} walks");
    }

    #[test]
    fn remove_waits_for_readers() {
        static R: Registry<u64, 4> = Registry::new();
        let (i, _) = R.insert(0x1000, 0x2000, Arc::new(7)).unwrap();
        let g = R.find_preferring(0x1800, |_| true).unwrap();
        let t = std::thread::spawn(move || R.remove(i).map(|a| *a));
        std::thread::sleep(std::time::Duration::from_millis(50));
        assert!(!t.is_finished(), "remove returned while a reader held the slot");
        assert_eq!(*g, 7);
        drop(g);
        assert_eq!(t.join().unwrap(), Some(7));
    }
}
