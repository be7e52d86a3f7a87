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
//! sees the C library's `madvise`), and the fork reads them (`fork::ForkPlan`).
//!
//! Locking: one mutex over the table, taken by the calls that advise and by a fork's
//! recording; never on a fault path or in a signal handler. Invariants: ranges are
//! page-aligned and non-empty; ranges of one advice do not overlap (a new one replaces
//! what it covers).

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

/// The most ranges kept; a program that advises more loses the oldest, said once.
const MAX_RANGES: usize = 4096;

static RANGES: Mutex<Vec<(usize, usize, ForkAdvice)>> = Mutex::new(Vec::new());

/// Records `madvise(start, len, advice)` once the kernel accepted it. Advice that is not
/// about forks is ignored.
pub fn note_madvise(start: usize, len: usize, advice: i32) {
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
    let mut ranges = RANGES.lock().unwrap_or_else(|e| e.into_inner());
    remove(&mut ranges, Some(kind), start, end);
    if on {
        if ranges.len() >= MAX_RANGES {
            ranges.remove(0);
            say_dropped_once();
        }
        ranges.push((start, end, kind));
    }
}

/// The range `[start, end)` was unmapped, or mapped anew: the kernel's flags went with it.
pub(crate) fn forget(start: usize, end: usize) {
    let mut ranges = RANGES.lock().unwrap_or_else(|e| e.into_inner());
    if !ranges.is_empty() {
        remove(&mut ranges, None, start, end.next_multiple_of(PAGE_SIZE));
    }
}

/// The list, held across a fork (`crate::fork::ForkHold`, after the region registry's
/// writers): the event thread takes it for each unmapping, and a child whose copy a thread
/// of its parent held waited for it for good in its fork handler.
pub(crate) type Held = std::sync::MutexGuard<'static, Vec<(usize, usize, ForkAdvice)>>;

/// Takes the list for a fork (see [`Held`]).
pub(crate) fn hold_for_fork() -> Held {
    RANGES.lock().unwrap_or_else(|e| e.into_inner())
}

/// A fork child, with the list held across its fork: its own mappings carry no advice of
/// its parent's it did not inherit; what it inherited (wipe-on-fork, which stays set in the
/// child) is kept.
pub(crate) fn after_fork_in_child(mut ranges: Held) {
    ranges.retain(|&(_, _, k)| k == ForkAdvice::WipeOnFork);
}

/// The ranges of `kind` that overlap `[start, end)`, clipped to it, in address order.
pub(crate) fn ranges_in(kind: ForkAdvice, start: usize, end: usize) -> Vec<(usize, usize)> {
    let ranges = RANGES.lock().unwrap_or_else(|e| e.into_inner());
    let mut out: Vec<(usize, usize)> = ranges
        .iter()
        .filter(|&&(s, e, k)| k == kind && s < end && start < e)
        .map(|&(s, e, _)| (s.max(start), e.min(end)))
        .collect();
    out.sort_unstable();
    out
}

/// Takes `[start, end)` out of the ranges of `kind` (every kind: `None`), splitting those
/// that cover it on both sides.
fn remove(ranges: &mut Vec<(usize, usize, ForkAdvice)>, kind: Option<ForkAdvice>, start: usize, end: usize) {
    let mut kept = Vec::with_capacity(ranges.len() + 1);
    for &(s, e, k) in ranges.iter() {
        if kind.is_some_and(|kind| kind != k) || e <= start || end <= s {
            kept.push((s, e, k));
            continue;
        }
        if s < start {
            kept.push((s, start, k));
        }
        if end < e {
            kept.push((end, e, k));
        }
    }
    *ranges = kept;
}

fn say_dropped_once() {
    use std::sync::atomic::{AtomicBool, Ordering};
    static SAID: AtomicBool = AtomicBool::new(false);
    if !SAID.swap(true, Ordering::Relaxed) {
        eprintln!(
            "uswap: more than {MAX_RANGES} ranges of managed memory advised MADV_DONTFORK or MADV_WIPEONFORK: \
             the oldest is forgotten, and a fork child may get it as if not advised"
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
        note_madvise(page(0), 10 * PAGE_SIZE, libc::MADV_DONTFORK);
        note_madvise(page(20), 4 * PAGE_SIZE, libc::MADV_WIPEONFORK);
        note_madvise(page(0), PAGE_SIZE, libc::MADV_NORMAL);
        assert_eq!(ranges_in(ForkAdvice::DontFork, page(0), page(30)), vec![(page(0), page(10))]);
        // Undone in the middle: split in two.
        note_madvise(page(3), 2 * PAGE_SIZE, libc::MADV_DOFORK);
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
        note_madvise(page(20), 4 * PAGE_SIZE, libc::MADV_KEEPONFORK);
        assert!(ranges_in(ForkAdvice::WipeOnFork, page(0), page(30)).is_empty());
    }
}
