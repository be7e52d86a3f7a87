//! The table of the program's managed mappings ([`crate::mmap`]): each entry holds the
//! region of one mapping the program made, by the range it still has of it at its ends,
//! until the program unmaps all of it.
//!
//! A program may hold tens of thousands (V8 makes each 256 KiB page of its heap a mapping
//! of its own), and every `munmap`, `mremap`, `madvise` and `mprotect` of the program asks
//! which entries a range meets: so the entries are kept by start, and a query takes the
//! ones it meets, not all of them.
//!
//! Locking: none of its own; the table lives behind `mmap`'s mutex (held across a fork).
//!
//! Invariants: the entries in `apart` are pairwise disjoint, so the one that starts last
//! below an address is the only one of them that may reach it. An entry covers what the
//! program still has at its ends: one that loses its first or last pages to an `munmap`
//! is trimmed to what is left ([`Table::trim`]), while its region spans what was mapped
//! first. An entry that overlapped another when it came (a mapping the kernel placed in a
//! hole the program unmapped in the middle of another) is kept in `nested`, which every
//! query scans; it moves to `apart` once it no longer overlaps any entry there nor an older
//! nested one (`nested` is kept oldest first). Such entries are rare (a program that
//! unmaps the middle of a managed mapping and keeps both ends, whose hole the kernel then
//! fills), but nothing bounds them: a program that keeps doing so pays a scan of them per
//! query, and each entry taken out a scan of them per nested entry. Entries are never
//! dropped here: a caller takes them out and drops or forgets them, and a fork child's
//! re-arming forgets the parent's regions it replaces and the entries left without one.

use std::collections::BTreeMap;

pub struct Entry<R = uswap::Region> {
    /// What the program still has of the mapping, at either end ([`Table::trim`]).
    pub start: usize,
    pub len: usize,
    /// Held for its drop: unmapping the region frees its slots.
    pub region: R,
    /// The range first mapped, which the region spans.
    mapped: (usize, usize),
}

impl<R> Entry<R> {
    /// The entry of a mapping of `len` bytes at `start`, all of it `region`'s.
    pub fn new(start: usize, len: usize, region: R) -> Entry<R> {
        Entry { start, len, region, mapped: (start, len) }
    }

    /// The end of what the program still has of the mapping.
    pub fn end(&self) -> usize {
        self.start + self.len
    }

    fn meets(&self, start: usize, end: usize) -> bool {
        self.start < end && start < self.end()
    }
}

pub struct Table<R = uswap::Region> {
    /// Disjoint entries, by start.
    apart: BTreeMap<usize, Entry<R>>,
    /// Entries that overlapped another when they came (few: see the module doc).
    nested: Vec<Entry<R>>,
}

impl<R> Default for Table<R> {
    fn default() -> Self {
        Self::new()
    }
}

impl<R> Table<R> {
    pub const fn new() -> Self {
        Table { apart: BTreeMap::new(), nested: Vec::new() }
    }

    pub fn len(&self) -> usize {
        self.apart.len() + self.nested.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub fn insert(&mut self, entry: Entry<R>) {
        assert!(entry.len > 0, "uswap invariant: an empty managed mapping at {:#x}", entry.start);
        if self.meets_any(entry.start, entry.end()) {
            self.nested.push(entry);
        } else {
            self.apart.insert(entry.start, entry);
        }
    }

    /// The entries of `apart` that meet `[start, end)`, by start.
    fn apart_meeting(&self, start: usize, end: usize) -> impl Iterator<Item = &Entry<R>> {
        let below = self.apart.range(..start).next_back().map(|(_, e)| e).filter(|e| e.end() > start);
        below.into_iter().chain(self.apart.range(start..end.max(start)).map(|(_, e)| e))
    }

    /// Every entry that meets `[start, end)`.
    pub fn meeting(&self, start: usize, end: usize) -> impl Iterator<Item = &Entry<R>> {
        self.apart_meeting(start, end).chain(self.nested.iter().filter(move |e| e.meets(start, end)))
    }

    pub fn meets_any(&self, start: usize, end: usize) -> bool {
        self.meeting(start, end).next().is_some()
    }

    /// The newest entry that starts at `start`, if one does: one in a hole of another that
    /// starts there too is the newer (it came while that one was in the table), and it is
    /// what the program now has at `start` (the older one lost its first pages to it).
    /// `nested` is oldest first, and older than it every entry of `apart` it meets.
    pub fn starting_at(&self, start: usize) -> Option<&Entry<R>> {
        self.nested.iter().rev().find(|e| e.start == start).or_else(|| self.apart.get(&start))
    }

    /// Takes out the entries that meet `[start, end)` and for which `take` holds.
    pub fn take_meeting(&mut self, start: usize, end: usize, mut take: impl FnMut(&Entry<R>) -> bool) -> Vec<Entry<R>> {
        let keys: Vec<usize> = self.apart_meeting(start, end).filter(|e| take(e)).map(|e| e.start).collect();
        let mut taken: Vec<Entry<R>> = keys.iter().filter_map(|k| self.apart.remove(k)).collect();
        let mut i = 0;
        // Bounded: every round removes an entry or moves past one.
        while i < self.nested.len() {
            if self.nested[i].meets(start, end) && take(&self.nested[i]) {
                // `remove`, not `swap_remove`: `nested` stays oldest first.
                taken.push(self.nested.remove(i));
            } else {
                i += 1;
            }
        }
        if !taken.is_empty() {
            self.settle_nested();
        }
        taken
    }

    /// The program unmapped `[start, end)`: an entry that lost its first or its last pages
    /// to it (`owns(region, from, to)` false: its region owns none of the pages cut) now
    /// starts or ends where the unmapping did, so that a mapping the kernel then places
    /// there meets nothing. Ruby's heap maps 32 KiB and unmaps the first 16 KiB of it at
    /// once, and the kernel places the next mapping right below, over that half: kept at
    /// their first length, the entries each overlapped the one before, every one went to
    /// `nested`, and a program with 8,000 of them spent 88 % of its time in
    /// [`Table::settle_nested`]. A mapping another thread placed there between the
    /// program's `munmap` and this call owns its pages: it is left whole. An entry that
    /// lost pages in its middle keeps its range: the hole is inside it. The entry's region
    /// is not changed: it still spans what was mapped first ([`Table::rearm`] matches it by
    /// that).
    pub fn trim(&mut self, start: usize, end: usize, owns: impl Fn(&R, usize, usize) -> bool) {
        // What is left of `e` once its pages in `[start, end)` are cut, if they are at
        // one of its ends and its region owns none of them.
        let cut = |e: &Entry<R>| -> Option<(usize, usize)> {
            let (s, e_end) = (e.start, e.end());
            let (left, cut) = match (start <= s, end >= e_end) {
                (true, false) if end > s => ((end, e_end - end), (s, end)),
                (false, true) if start < e_end => ((s, start - s), (start, e_end)),
                _ => return None,
            };
            (!owns(&e.region, cut.0, cut.1)).then_some(left)
        };
        let trimmed: Vec<(usize, usize, usize)> =
            self.apart_meeting(start, end).filter_map(|e| cut(e).map(|(s, l)| (e.start, s, l))).collect();
        for (key, new_start, new_len) in trimmed {
            if let Some(mut e) = self.apart.remove(&key) {
                (e.start, e.len) = (new_start, new_len);
                // A shorter entry meets no entry it did not meet before: `apart` stays disjoint.
                let before = self.apart.insert(new_start, e);
                debug_assert!(before.is_none(), "uswap invariant: two entries of `apart` at one start");
            }
        }
        let mut nested_trimmed = false;
        for e in self.nested.iter_mut() {
            if let Some((s, l)) = cut(e) {
                (e.start, e.len) = (s, l);
                nested_trimmed = true;
            }
        }
        if nested_trimmed {
            self.settle_nested();
        }
    }

    /// Moves the nested entries that no longer overlap an entry of `apart`, nor an older
    /// nested one, there: oldest first, so that an entry of `apart` is older than every
    /// nested entry it meets (what [`Table::starting_at`] relies on).
    fn settle_nested(&mut self) {
        let mut i = 0;
        // Bounded: every round moves an entry or moves past one.
        while i < self.nested.len() {
            let (start, end) = (self.nested[i].start, self.nested[i].end());
            let older_met = self.nested[..i].iter().any(|o| o.meets(start, end));
            if !older_met && self.apart_meeting(start, end).next().is_none() {
                let e = self.nested.remove(i);
                let before = self.apart.insert(e.start, e);
                debug_assert!(before.is_none(), "uswap invariant: two entries of `apart` at one start");
            } else {
                i += 1;
            }
        }
    }

    /// Bytes the entries cover (what the program still has of its mappings at their ends,
    /// holes inside them included).
    pub fn bytes(&self) -> usize {
        self.apart.values().chain(&self.nested).map(|e| e.len).sum()
    }

    /// In a fork child: each entry takes the region of `regions` that starts where its own
    /// did and is as long (`len_of`; two entries may start at one address, see the module
    /// doc), else one that starts there, and the parent's region it held is forgotten, never
    /// dropped (its pager is the parent's); an entry with none leaves the table, forgotten.
    /// What `regions` has left stays there. Allocation-free when `regions` is empty.
    pub fn rearm(&mut self, regions: &mut Vec<(usize, R)>, len_of: impl Fn(&R) -> usize) {
        if regions.is_empty() {
            std::mem::forget(std::mem::take(&mut self.apart));
            std::mem::forget(std::mem::take(&mut self.nested));
            return;
        }
        let mut by_start: BTreeMap<usize, Vec<R>> = BTreeMap::new();
        for (start, region) in regions.drain(..) {
            by_start.entry(start).or_default().push(region);
        }
        let mut take = |e: &Entry<R>| {
            let (mapped_start, mapped_len) = e.mapped;
            let at_start = by_start.get_mut(&mapped_start)?;
            let k = at_start.iter().position(|r| len_of(r) == mapped_len).unwrap_or(at_start.len().checked_sub(1)?);
            Some(at_start.swap_remove(k))
        };
        let mut kept = Table::new();
        let entries = std::mem::take(&mut self.apart).into_values().chain(std::mem::take(&mut self.nested));
        for mut e in entries {
            match take(&e) {
                Some(region) => {
                    std::mem::forget(std::mem::replace(&mut e.region, region));
                    kept.insert(e);
                }
                None => std::mem::forget(e),
            }
        }
        *self = kept;
        regions.extend(by_start.into_iter().flat_map(|(start, rs)| rs.into_iter().map(move |r| (start, r))));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const P: usize = 0x1000;

    fn entry(start_page: usize, pages: usize, id: u32) -> Entry<u32> {
        Entry::new(start_page * P, pages * P, id)
    }

    /// A table holding `entries`, inserted in their order.
    fn table_of<const N: usize>(entries: [Entry<u32>; N]) -> Table<u32> {
        let mut t = Table::new();
        for e in entries {
            t.insert(e);
        }
        t
    }

    fn ids<'a>(it: impl Iterator<Item = &'a Entry<u32>>) -> Vec<u32> {
        let mut v: Vec<u32> = it.map(|e| e.region).collect();
        v.sort();
        v
    }

    /// Apart, touching and nested entries: a query meets exactly those that share a page
    /// with its range, wherever it falls.
    #[test]
    fn queries_meet_exactly_the_entries_that_share_a_page() {
        let all =
            [entry(10, 5, 1), entry(15, 5, 2), entry(30, 40, 3), entry(40, 2, 4), entry(40, 1, 5), entry(60, 4, 6)];
        let ranges: Vec<(usize, usize, u32)> = all.iter().map(|e| (e.start, e.start + e.len, e.region)).collect();
        let t = table_of(all);
        assert_eq!(t.len(), 6);
        assert_eq!(t.nested.len(), 3, "the entries inside the 40 pages at 30");
        for a in 0..80 {
            for b in a + 1..82 {
                let (start, end) = (a * P, b * P);
                let want: Vec<u32> = ranges.iter().filter(|r| r.0 < end && start < r.1).map(|r| r.2).collect();
                assert_eq!(ids(t.meeting(start, end)), want, "[{a}, {b}) pages");
                assert_eq!(t.meets_any(start, end), !want.is_empty());
            }
        }
        assert_eq!(t.starting_at(40 * P).map(|e| e.len), Some(P), "the newer of two");
        assert!(t.starting_at(41 * P).is_none());
        assert_eq!(t.bytes(), 57 * P);
    }

    /// Taking entries out leaves the rest found, and a nested entry whose outer one went
    /// joins the disjoint ones.
    #[test]
    fn taken_entries_go_and_nested_ones_settle() {
        let mut t = table_of([entry(0, 100, 1), entry(10, 5, 2), entry(50, 5, 3), entry(200, 5, 4)]);
        assert_eq!(t.nested.len(), 2);
        let taken = t.take_meeting(0, 100 * P, |e| e.len == 100 * P);
        assert_eq!(ids(taken.iter()), [1]);
        assert!(t.nested.is_empty(), "both settled once the outer entry went");
        assert_eq!(ids(t.meeting(0, 300 * P)), [2, 3, 4]);
        let mut met = Vec::new();
        let taken = t.take_meeting(12 * P, 51 * P, |e| {
            met.push(e.region);
            true
        });
        met.sort();
        assert_eq!(met, [2, 3], "the predicate saw only the entries that meet the range");
        assert_eq!(ids(taken.iter()), [2, 3]);
        assert_eq!(ids(t.meeting(0, usize::MAX)), [4]);
    }

    /// Taking entries out keeps the nested ones oldest first: the newest of two at one start
    /// is still the one found there, and the older settles before it.
    #[test]
    fn the_newest_entry_at_a_start_is_found_after_others_go() {
        // X holds the others' range; O at 10 (its own hole at 10..12 filled by N).
        let mut t = table_of([entry(0, 100, 1), entry(5, 1, 2), entry(10, 20, 3), entry(10, 2, 4)]);
        assert_eq!(t.nested.len(), 3);
        let taken = t.take_meeting(5 * P, 6 * P, |e| e.region == 2);
        assert_eq!(ids(taken.iter()), [2]);
        assert_eq!(t.starting_at(10 * P).map(|e| e.region), Some(4), "the newer of two at 10");
        // X goes: O settles (it meets nothing in `apart`), N stays nested (it meets O).
        let taken = t.take_meeting(0, P, |e| e.region == 1);
        assert_eq!(ids(taken.iter()), [1]);
        assert_eq!(t.starting_at(10 * P).map(|e| e.region), Some(4));
        assert_eq!(ids(t.nested.iter()), [4]);
        // With something older in `apart` that meets O but not N: N must not settle ahead
        // of O.
        let mut t = table_of([entry(0, 100, 1), entry(11, 1, 2), entry(10, 20, 3), entry(10, 1, 4)]);
        t.take_meeting(0, P, |e| e.region == 1);
        // 2 (at 11) settled first; O (10..30) meets it and stays; N (10..11) meets O, older.
        assert_eq!(t.starting_at(10 * P).map(|e| e.region), Some(4));
        assert_eq!(ids(t.nested.iter()), [3, 4]);
    }

    /// An entry that loses its first or last pages ends where the program's mapping now
    /// does, so that a mapping the kernel places in what went is kept apart (Ruby's heap
    /// pages: 32 KiB mapped, 16 KiB of it unmapped, the next placed in the hole); one that
    /// loses pages in its middle keeps its range. A fork child still matches each by the
    /// range its region spans.
    #[test]
    fn entries_lose_their_ends_to_unmapping_and_mappings_placed_there_stay_apart() {
        let mut t = table_of([entry(100, 8, 1), entry(200, 8, 2), entry(300, 8, 3)]);
        t.trim(96 * P, 104 * P, |_, _, _| false); // the first half of 1, and no entry's whole
        t.trim(206 * P, 210 * P, |_, _, _| false); // the last two pages of 2
        t.trim(302 * P, 304 * P, |_, _, _| false); // a hole in 3
        let spans: Vec<(usize, usize)> = t.meeting(0, usize::MAX).map(|e| (e.start / P, e.len / P)).collect();
        assert_eq!(spans, [(104, 4), (200, 6), (300, 8)]);
        // What the kernel places where 1's first pages were, and in 3's hole.
        t.insert(entry(96, 8, 4));
        t.insert(entry(302, 2, 5));
        assert_eq!(ids(t.nested.iter()), [5], "only the mapping in a hole nests");
        assert_eq!(ids(t.meeting(103 * P, 104 * P)), [4]);
        assert_eq!(ids(t.meeting(104 * P, 105 * P)), [1]);
        assert!(t.meeting(206 * P, 208 * P).next().is_none(), "2's last pages are no entry's");
        // The program unmaps 3's first pages and the mapping in its hole (which goes whole,
        // as `munmap` takes it): 3 now starts past them.
        assert_eq!(ids(t.take_meeting(300 * P, 304 * P, |e| e.start >= 300 * P && e.end() <= 304 * P).iter()), [5]);
        t.trim(300 * P, 304 * P, |_, _, _| false);
        // A mapping another thread made there after the `munmap` owns its pages: left whole.
        t.insert(entry(400, 8, 6));
        t.trim(404 * P, 410 * P, |&id, from, to| id == 6 && (from, to) == (404 * P, 408 * P));
        assert_eq!(t.starting_at(400 * P).map(|e| e.len), Some(8 * P));
        assert_eq!(ids(t.take_meeting(400 * P, 408 * P, |_| true).iter()), [6]);
        assert_eq!(ids(t.meeting(0, usize::MAX)), [1, 2, 3, 4]);
        assert_eq!(t.starting_at(304 * P).map(|e| e.region), Some(3));
        // Region ids are their first page here: each entry takes the child's region that
        // starts where its parent's did, not where the entry now starts.
        let mut regions = vec![(100 * P, 11), (200 * P, 12), (300 * P, 13), (96 * P, 14)];
        t.rearm(&mut regions, |_| 0);
        assert!(regions.is_empty(), "every region claimed: {regions:?}");
        let mut by_start: Vec<(usize, u32)> = t.meeting(0, usize::MAX).map(|e| (e.start / P, e.region)).collect();
        by_start.sort();
        assert_eq!(by_start, [(96, 14), (104, 11), (200, 12), (304, 13)]);
    }

    /// A fork child's table: entries take the new region of their start, the others leave,
    /// and regions no entry claimed are given back.
    #[test]
    fn rearm_matches_regions_by_start() {
        let mut t = table_of([entry(0, 10, 1), entry(2, 2, 2), entry(20, 4, 3)]);
        let mut regions = vec![(0, 11), (20 * P, 13), (99 * P, 99)];
        t.rearm(&mut regions, |_| 0);
        assert_eq!(ids(t.meeting(0, usize::MAX)), [11, 13]);
        assert_eq!(regions, [(99 * P, 99)]);
        t.rearm(&mut Vec::new(), |_| 0);
        assert!(t.is_empty());
    }

    /// Two entries at one start (the newer in a hole the older's first pages left): each
    /// takes the region as long as it, whatever the order the regions come in, and the
    /// newer is the one found at that start.
    #[test]
    fn entries_at_one_start_keep_their_own_regions() {
        let t = table_of([entry(0, 10, 1), entry(0, 2, 2)]);
        assert_eq!(t.starting_at(0).map(|e| e.region), Some(2), "the newer");
        // Region ids are their lengths in pages here.
        for order in [[10, 2], [2, 10]] {
            let mut t2 = table_of([entry(0, 10, 1), entry(0, 2, 2)]);
            let mut regions = order.iter().map(|&pages| (0, pages)).collect();
            t2.rearm(&mut regions, |&pages| pages as usize * P);
            for e in t2.meeting(0, usize::MAX) {
                assert_eq!(e.len, e.region as usize * P, "entry of {} pages took region {}", e.len / P, e.region);
            }
            assert!(regions.is_empty());
        }
    }
}
