//! What the program asked to happen to ranges of managed memory at a fork:
//! `madvise(MADV_DONTFORK)` (the child does not get the range) and `MADV_WIPEONFORK` (the
//! child gets it empty, reading zeros), undone by `MADV_DOFORK` and `MADV_KEEPONFORK`.
//!
//! Why: the kernel keeps these as flags of the mapping (`VM_DONTCOPY`, `VM_WIPEONFORK`) and
//! applies them to what it copies at the fork. A page uswap had moved out is not in the
//! mapping: the child of a re-armed pager reads it from its parent's device
//! (`PageState::Parent`), which gave a wipe-on-fork child its parent's bytes instead of
//! zeros; and a don't-copy range the child does not have was registered and paged as if it
//! had it (the child died of SIGBUS). So the calls are recorded here (`uswap run`'s library
//! sees the C library's `madvise`), for managed memory only (no event says when other
//! memory goes, and a region dropped whole forgets its own), and the fork reads them
//! (`fork::ForkPlan`).
//!
//! Locking: one mutex over the table, taken by the calls that advise and by a fork's
//! recording; never on a fault path or in a signal handler. Invariants: ranges are
//! page-aligned and non-empty; ranges of one advice do not overlap (a new one replaces
//! what it covers), so a lookup is a walk down an ordered map from the range's end.

use std::collections::BTreeMap;
use std::sync::Mutex;

use crate::uffd::PAGE_SIZE;

/// What a fork does to a range.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ForkAdvice {
    /// `MADV_DONTFORK`: the child does not get it.
    DontFork,
    /// `MADV_WIPEONFORK`: the child gets it empty.
    WipeOnFork,
}

/// The most ranges kept, of both kinds: more than the regions a process may have
/// (`MAX_REGIONS`) each advised in a few pieces. Past it new advice is not kept, said once.
const MAX_RANGES: usize = 4 * crate::page_table::MAX_REGIONS;

/// The advised ranges, `start -> end` for each kind, in address order.
pub(crate) struct Table {
    dont_fork: BTreeMap<usize, usize>,
    wipe_on_fork: BTreeMap<usize, usize>,
}

impl Table {
    const fn new() -> Table {
        Table { dont_fork: BTreeMap::new(), wipe_on_fork: BTreeMap::new() }
    }

    fn of(&mut self, kind: ForkAdvice) -> &mut BTreeMap<usize, usize> {
        match kind {
            ForkAdvice::DontFork => &mut self.dont_fork,
            ForkAdvice::WipeOnFork => &mut self.wipe_on_fork,
        }
    }

    fn len(&self) -> usize {
        self.dont_fork.len() + self.wipe_on_fork.len()
    }
}

static RANGES: Mutex<Table> = Mutex::new(Table::new());

/// Records `madvise(start, len, advice)` once the kernel accepted it, on the parts of the
/// range in `managed` (advice given is recorded there only; undone, it is undone across the
/// whole range). Advice that is not about forks is ignored.
pub fn note_madvise(start: usize, len: usize, advice: i32, managed: &[(usize, usize)]) {
    let (start, end) = (start & !(PAGE_SIZE - 1), start.saturating_add(len).next_multiple_of(PAGE_SIZE));
    let (kind, on) = match advice {
        libc::MADV_DONTFORK => (ForkAdvice::DontFork, true),
        libc::MADV_DOFORK => (ForkAdvice::DontFork, false),
        libc::MADV_WIPEONFORK => (ForkAdvice::WipeOnFork, true),
        libc::MADV_KEEPONFORK => (ForkAdvice::WipeOnFork, false),
        _ => return,
    };
    if end <= start {
        return;
    }
    let mut table = RANGES.lock().unwrap_or_else(|e| e.into_inner());
    remove(table.of(kind), start, end);
    if !on {
        return;
    }
    for &(from, to) in managed {
        let (from, to) = (from.max(start) & !(PAGE_SIZE - 1), to.min(end).next_multiple_of(PAGE_SIZE));
        if from >= to {
            continue;
        }
        if table.len() >= MAX_RANGES {
            say_full_once();
            return;
        }
        // The parts given may overlap (regions whose ranges overlap): each replaces what it
        // covers, so the ranges of a kind never do.
        remove(table.of(kind), from, to);
        table.of(kind).insert(from, to);
    }
}

/// The range `[start, end)` was unmapped, or mapped anew, or is no longer managed: the
/// kernel's flags went with it, or are the kernel's own business now.
pub(crate) fn forget(start: usize, end: usize) {
    let mut table = RANGES.lock().unwrap_or_else(|e| e.into_inner());
    let (start, end) = (start & !(PAGE_SIZE - 1), end.next_multiple_of(PAGE_SIZE));
    remove(&mut table.dont_fork, start, end);
    remove(&mut table.wipe_on_fork, start, end);
}

/// A whole managed mapping moved from `from` to `to` (`mremap`): the kernel's flags went
/// with it.
pub(crate) fn moved(from: usize, to: usize, len: usize) {
    let mut table = RANGES.lock().unwrap_or_else(|e| e.into_inner());
    for kind in [ForkAdvice::DontFork, ForkAdvice::WipeOnFork] {
        let ranges = table.of(kind);
        let inside = overlapping(ranges, from, from + len);
        remove(ranges, from, from + len);
        remove(ranges, to, to + len);
        for (s, e) in inside {
            ranges.insert(s.max(from) - from + to, e.min(from + len) - from + to);
        }
    }
}

/// The table, held across a fork (`crate::fork::ForkHold`, after the region registry's
/// writers): the event thread takes it for each unmapping, and a child whose copy a thread
/// of its parent held waited for it for good in its fork handler.
pub(crate) type Held = std::sync::MutexGuard<'static, Table>;

/// Takes the table for a fork (see [`Held`]).
pub(crate) fn hold_for_fork() -> Held {
    RANGES.lock().unwrap_or_else(|e| e.into_inner())
}

/// A fork child, with the table held across its fork: its own mappings carry no advice of
/// its parent's it did not inherit; what it inherited (wipe-on-fork, which stays set in the
/// child) is kept.
pub(crate) fn after_fork_in_child(mut table: Held) {
    table.dont_fork.clear();
}

/// The ranges of `kind` that overlap `[start, end)`, clipped to it, in address order.
pub(crate) fn ranges_in(kind: ForkAdvice, start: usize, end: usize) -> Vec<(usize, usize)> {
    let mut table = RANGES.lock().unwrap_or_else(|e| e.into_inner());
    let mut out: Vec<(usize, usize)> =
        overlapping(table.of(kind), start, end).into_iter().map(|(s, e)| (s.max(start), e.min(end))).collect();
    out.reverse();
    out
}

/// The ranges of `ranges` that overlap `[start, end)`, last first. Ranges of one kind do
/// not overlap, so their ends rise with their starts: the walk down from `end` stops at the
/// first range that ends at or before `start`.
fn overlapping(ranges: &BTreeMap<usize, usize>, start: usize, end: usize) -> Vec<(usize, usize)> {
    ranges.range(..end).rev().map(|(&s, &e)| (s, e)).take_while(|&(_, e)| e > start).collect()
}

/// Takes `[start, end)` out of `ranges`, splitting those that cover it on both sides.
fn remove(ranges: &mut BTreeMap<usize, usize>, start: usize, end: usize) {
    if start >= end {
        return;
    }
    for (s, e) in overlapping(ranges, start, end) {
        ranges.remove(&s);
        if s < start {
            ranges.insert(s, start);
        }
        if end < e {
            ranges.insert(end, e);
        }
    }
}

fn say_full_once() {
    use std::sync::atomic::{AtomicBool, Ordering};
    static SAID: AtomicBool = AtomicBool::new(false);
    if !SAID.swap(true, Ordering::Relaxed) {
        eprintln!(
            "uswap: more than {MAX_RANGES} ranges of managed memory advised MADV_DONTFORK or MADV_WIPEONFORK: \
             the next are not kept, and a fork child may get them as if not advised"
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // One test: the table is the process's.
    #[test]
    fn advice_is_recorded_split_and_undone() {
        let base = 0x5000_0000_0000usize;
        let page = |i: usize| base + i * PAGE_SIZE;
        let all = &[(page(0), page(100))][..];
        note_madvise(page(0), 10 * PAGE_SIZE, libc::MADV_DONTFORK, all);
        note_madvise(page(20), 4 * PAGE_SIZE, libc::MADV_WIPEONFORK, all);
        note_madvise(page(0), PAGE_SIZE, libc::MADV_NORMAL, all);
        assert_eq!(ranges_in(ForkAdvice::DontFork, page(0), page(30)), vec![(page(0), page(10))]);
        // Undone in the middle: split in two.
        note_madvise(page(3), 2 * PAGE_SIZE, libc::MADV_DOFORK, all);
        assert_eq!(ranges_in(ForkAdvice::DontFork, page(0), page(30)), vec![(page(0), page(3)), (page(5), page(10))]);
        // Clipped to the range asked about.
        assert_eq!(ranges_in(ForkAdvice::DontFork, page(6), page(8)), vec![(page(6), page(8))]);
        assert_eq!(ranges_in(ForkAdvice::WipeOnFork, page(0), page(30)), vec![(page(20), page(24))]);
        // A fork child keeps wipe-on-fork only; an unmap forgets every kind.
        after_fork_in_child(hold_for_fork());
        assert!(ranges_in(ForkAdvice::DontFork, page(0), page(30)).is_empty());
        forget(page(21), page(22));
        assert_eq!(
            ranges_in(ForkAdvice::WipeOnFork, page(0), page(30)),
            vec![(page(20), page(21)), (page(22), page(24))]
        );
        note_madvise(page(20), 4 * PAGE_SIZE, libc::MADV_KEEPONFORK, all);
        assert!(ranges_in(ForkAdvice::WipeOnFork, page(0), page(30)).is_empty());
        // Advice on memory no region manages is not kept: only the managed part is.
        note_madvise(page(40), 10 * PAGE_SIZE, libc::MADV_DONTFORK, &[(page(42) + 100, page(44))]);
        assert_eq!(ranges_in(ForkAdvice::DontFork, page(0), page(100)), vec![(page(42), page(44))]);
        note_madvise(page(60), PAGE_SIZE, libc::MADV_DONTFORK, &[]);
        assert_eq!(ranges_in(ForkAdvice::DontFork, page(60), page(61)), vec![]);
        // Parts that overlap (regions whose ranges overlap) are kept as one cover.
        note_madvise(page(60), 10 * PAGE_SIZE, libc::MADV_DONTFORK, &[(page(60), page(66)), (page(62), page(64))]);
        note_madvise(page(60), 10 * PAGE_SIZE, libc::MADV_DONTFORK, &[(page(62), page(64)), (page(60), page(66))]);
        assert_eq!(ranges_in(ForkAdvice::DontFork, page(50), page(100)), vec![(page(60), page(66))]);
        // Adjacent ranges stay apart; a range touching the one asked about at either end is
        // not in it.
        note_madvise(page(66), 2 * PAGE_SIZE, libc::MADV_DONTFORK, all);
        assert_eq!(ranges_in(ForkAdvice::DontFork, page(66), page(68)), vec![(page(66), page(68))]);
        assert!(ranges_in(ForkAdvice::DontFork, page(68), page(70)).is_empty());
        forget(page(66), page(66));
        assert_eq!(
            ranges_in(ForkAdvice::DontFork, page(60), page(70)),
            vec![(page(60), page(66)), (page(66), page(68))]
        );
        // A whole mapping moved: its advice goes with it, clipped to it.
        moved(page(64), page(90), 3 * PAGE_SIZE);
        assert_eq!(
            ranges_in(ForkAdvice::DontFork, page(60), page(70)),
            vec![(page(60), page(64)), (page(67), page(68))]
        );
        assert_eq!(
            ranges_in(ForkAdvice::DontFork, page(80), page(100)),
            vec![(page(90), page(92)), (page(92), page(93))]
        );
    }
}
