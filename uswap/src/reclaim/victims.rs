//! Choosing reclaim's victims: the oldest pages off the LRU's FIFOs or the swap cache's
//! queue, each owned through its busy bit from the moment it is popped ([`pop_victims`]), a
//! page that faulted back from the swap cache spared once (second chance), and a dirty
//! victim's dirty resident neighbours taken along (`swpout_neighbours`). What happens to the
//! victims (staged, written, dropped clean) is `super::swapout`'s.
//!
//! Locking: the queues are lock-free; a victim's region guard is held in the caller's
//! `RegionSet`. Allocates nothing (a round may run in a SIGBUS handler).

use std::sync::atomic::Ordering;

use arrayvec::ArrayVec;

use super::Reclaim;
use crate::lru::List;
use crate::pin::{hold_of, Hold};
use crate::region::{PageRef, PageState, Pte, RegionInner, RegionSet};
use crate::state::RECLAIM_BATCH_PAGES as BATCH;
use crate::stats::Counter;
use crate::swap::idle_ages::Epoch;

/// Stale queue entries one round may drop (bounds a round's work; stale entries cost a load
/// and a compare each).
const MAX_STALE_PER_ROUND: usize = 64 * BATCH;

/// Where a popped page goes back to.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Queue {
    Lru(List),
    SwapCache,
}

fn requeue(cx: &Reclaim<'_>, q: Queue, r: PageRef) {
    match q {
        Queue::Lru(list) => cx.lru.requeue(list, r, cx.stats),
        Queue::SwapCache => requeue_staged(cx, r),
    }
}

/// Queues a staged page (again) for writeback.
pub(super) fn requeue_staged(cx: &Reclaim<'_>, r: PageRef) {
    if cx.swap_cache.push(r.pack()).is_err() {
        cx.stats.inc(Counter::LruOverflow);
    }
}

/// A page a round owns (its busy bit set), in the round's region guards.
#[derive(Clone, Copy)]
pub(super) struct Victim {
    /// Its region's index in the round's `RegionSet`.
    pub gi: usize,
    pub page: usize,
    /// The page's word as we locked it (busy set).
    pub pte: Pte,
}

/// Which pages a round takes.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum Take {
    /// The oldest resident pages (stage one).
    Resident,
    /// The oldest resident pages, for the aging scan (`super::aging`): a referenced page is
    /// spared once even when clean. Reclaim takes clean pages referenced or not, for the
    /// room they make without a write; the scan makes no room, and a clean page in use it
    /// took every pass cost a swap-cache hit every pass, where a dirty one costs one every
    /// other pass.
    Aging,
    /// The oldest staged pages (stage two).
    Staged,
    /// The oldest staged pages that left their regions in this epoch or before (idle aging).
    StagedBy(Epoch),
}

/// Whether the staged page `pte` left its region after epoch `cut`.
fn staged_after(cx: &Reclaim<'_>, pte: Pte, cut: Epoch) -> bool {
    cx.devices.device(pte.entry()).stamp_of(pte.entry().offset()).is_some_and(|s| s.epoch > cut)
}

/// Whether the swap cache's oldest page left its region after epoch `cut` (a hint, as the
/// queue's head may be popped meanwhile).
fn staged_head_after(cx: &Reclaim<'_>, guards: &mut RegionSet, cut: Epoch) -> bool {
    let Some(v) = cx.swap_cache.peek() else { return false };
    let r = PageRef::unpack(v);
    let Ok(gi) = guards.get(cx.id, r) else { return false };
    let pte = guards.g[gi].load(r.page);
    pte.state() == PageState::Cached && pte.gen() == r.page_gen && staged_after(cx, pte, cut)
}

/// Where a round pops its victims from, and which pages it takes (see [`pop_victims`]).
struct Source {
    /// Staged pages from the swap cache (stage two), rather than resident ones from the LRU.
    inactive: bool,
    /// Referenced clean pages get their second chance too ([`Take::Aging`]).
    spare_clean: bool,
    /// [`Take::StagedBy`]'s epoch: only pages that left their regions then or before.
    cut: Option<Epoch>,
    /// The state a page must be in to be taken.
    want: PageState,
    /// Resident victims come from the use-once FIFO only while it holds more than this.
    reserve: usize,
}

impl Source {
    fn new(cx: &Reclaim<'_>, take: Take) -> Source {
        let inactive = matches!(take, Take::Staged | Take::StagedBy(_));
        let cut = match take {
            Take::StagedBy(e) => Some(e),
            _ => None,
        };
        let want = if inactive { PageState::Cached } else { PageState::Resident };
        // Resident victims come from the use-once FIFO while it holds more than its reserve:
        // the windows streams are working through right now, which must not go before they
        // are used (a stream's next fault would read them again).
        let reserve = if inactive {
            0
        } else {
            cx.lru.streamed_reserve(cx.charge.limit_pages.load(Ordering::Relaxed), cx.readahead_max_pages)
        };
        Source { inactive, spare_clean: take == Take::Aging, cut, want, reserve }
    }

    /// The next queue entry, and the queue it goes back to if it is not taken.
    fn pop(&self, cx: &Reclaim<'_>) -> Option<(u64, Queue)> {
        if self.inactive {
            return cx.swap_cache.pop().map(|v| (v, Queue::SwapCache));
        }
        cx.lru.pop(self.reserve).map(|(v, list)| (v, Queue::Lru(list)))
    }

    /// Pops the next entry and looks its page up in the round's region guards (taking one
    /// for its region if need be).
    fn pop_live(&self, cx: &Reclaim<'_>, guards: &mut RegionSet) -> Popped {
        let Some((v, from)) = self.pop(cx) else { return Popped::End };
        let r = PageRef::unpack(v);
        let gi = match guards.get(cx.id, r) {
            Ok(gi) => gi,
            Err(true) => {
                requeue(cx, from, r);
                return Popped::End;
            }
            Err(false) => return Popped::Stale,
        };
        let pte = guards.g[gi].load(r.page);
        if pte.state() != self.want || pte.gen() != r.page_gen {
            return Popped::Stale; // the page moved on since it was queued
        }
        Popped::Live { r, from, gi, pte }
    }
}

/// What popping a queue entry found.
enum Popped {
    /// The page the entry names, still as queued: its entry, the queue it goes back to if
    /// it is not taken, its region's guard index in the round's set and its word.
    Live { r: PageRef, from: Queue, gi: usize, pte: Pte },
    /// The page moved on since it was queued, or its region is gone: the entry is dropped.
    Stale,
    /// Nothing more this round: the queue is empty, or the round holds as many regions as
    /// it may (the entry went back).
    End,
}

/// Pops up to `nr` pages in `want` state from `queue`, skipping stale entries, giving
/// referenced resident pages their second chance and leaving pinned ones (counted in
/// `nr_pinned`). The pages come back locked.
pub(super) fn pop_victims(
    cx: &Reclaim<'_>,
    take: Take,
    nr: usize,
    guards: &mut RegionSet,
    nr_pinned: &mut usize,
) -> ArrayVec<Victim, BATCH> {
    let src = Source::new(cx, take);
    let max = nr.min(BATCH);
    let mut victims = ArrayVec::new();
    // Stale entries (pages that moved on since they were queued) are dropped as they are
    // found, cheaply, and do not count against the scan; entries put back (busy, spared)
    // do, so a round ends even when every page is in use. Spared pages (aged: the next round
    // takes them) have a longer bound: working-set refaults make runs of thousands of them.
    let mut scanned = 0;
    let mut spared = 0;
    let mut stale = 0;
    while victims.len() < max && scanned < 4 * BATCH && spared < 16 * BATCH && stale < MAX_STALE_PER_ROUND {
        if src.cut.is_some_and(|cut| staged_head_after(cx, guards, cut)) {
            break; // the oldest staged page is not idle long enough: nor are the others
        }
        let (r, from, gi, pte) = match src.pop_live(cx, guards) {
            Popped::Live { r, from, gi, pte } => (r, from, gi, pte),
            Popped::Stale => {
                stale += 1;
                continue;
            }
            Popped::End => break,
        };
        let region = &guards.g[gi];
        if pte.busy() {
            scanned += 1;
            requeue(cx, from, r);
            continue;
        }
        if src.cut.is_some_and(|cut| staged_after(cx, pte, cut)) {
            // Not the head peeked at (another thread popped that one): a young page, put
            // back at the tail, out of order once.
            requeue(cx, from, r);
            break;
        }
        // A clean page is not spared by reclaim, referenced or not (until its first write):
        // it leaves without a write or a new slot, the room reclaim can still make when the
        // devices are full (spared, a full device's rounds found only pages that need a
        // slot, and the limit was overrun with slots free).
        if !src.inactive && pte.referenced() && (!pte.clean() || src.spare_clean) {
            spared += 1;
            spare_referenced(cx, region, r, pte);
            continue;
        }
        scanned += 1;
        let Some(locked) = region.try_lock(r.page, pte) else {
            requeue(cx, from, r);
            continue;
        };
        if src.inactive {
            victims.push(Victim { gi, page: r.page, pte: locked });
        } else {
            take_resident(cx, guards, Victim { gi, page: r.page, pte: locked }, r, max, &mut victims, nr_pinned);
        }
    }
    // Every victim is owned (busy) and in the state the round takes, and the batch is no
    // larger than asked: its callers size their slot arrays by it.
    debug_assert!(victims.len() <= max, "a round takes at most the victims asked for");
    debug_assert!(
        victims.iter().all(|v| v.pte.busy() && v.pte.state() == src.want),
        "victims are locked, in the state taken"
    );
    victims
}

/// A referenced resident page at the head of the LRU: spared once (its referenced bit
/// cleared, if the page did not change meanwhile) and put back, as used again.
fn spare_referenced(cx: &Reclaim<'_>, region: &RegionInner, r: PageRef, pte: Pte) {
    debug_assert!(pte.state() == PageState::Resident && pte.referenced());
    let spared = pte.with_referenced(false);
    if region.pte(r.page).compare_exchange(pte.0, spared.0, Ordering::AcqRel, Ordering::Acquire).is_ok() {
        cx.stats.inc(Counter::Pgactivate);
    }
    // Used again: no longer use-once.
    cx.lru.add(r, cx.stats);
}

/// A resident page just locked (`v`, popped as `r`): left in place if the program locked it
/// or a system call pins it (counted in `nr_pinned`), else taken as a victim, with its dirty
/// neighbours (up to `max` victims in all) while staged pages stay out.
fn take_resident(
    cx: &Reclaim<'_>,
    guards: &RegionSet,
    v: Victim,
    r: PageRef,
    max: usize,
    victims: &mut ArrayVec<Victim, BATCH>,
    nr_pinned: &mut usize,
) {
    debug_assert!(v.pte.busy() && v.pte.state() == PageState::Resident && v.page == r.page);
    let region = &guards.g[v.gi];
    match hold_of(region.page_addr(v.page)) {
        Some(Hold::Locked) => {
            // Locked by the program: off the LRU until it is unlocked (see `mlock`).
            region.store(v.page, v.pte.unbusy().with_unevictable(true));
            cx.stats.inc(Counter::ReclaimPinned);
            *nr_pinned += 1;
        }
        Some(Hold::Pinned) => {
            // A system call's memory: stays in until the call returns (see `pin`).
            region.store(v.page, v.pte.unbusy());
            cx.stats.inc(Counter::ReclaimPinned);
            *nr_pinned += 1;
            cx.lru.add(r, cx.stats);
        }
        None => {
            victims.push(v);
            // Neighbours only while staged pages stay out (see `crate::lru`): taken with
            // a victim in use, they came back at once (sqlite3 under `--auto`: 3,200 a
            // second, its limit held 80 % above its working set).
            if !v.pte.clean() && cx.lru.victims_are_cold() {
                let before = victims.len();
                take_resident_neighbours(guards, v.gi, v.page, max, victims);
                cx.stats.add(Counter::SwpoutNeighbours, (victims.len() - before) as u64);
            }
        }
    }
}

/// Pages per swap-out cluster: a victim's dirty resident neighbours in its aligned block of
/// this many pages (64 KiB, the kernel's smallest mTHP swap-out unit) leave with it.
const SWAPOUT_CLUSTER_PAGES: usize = 16;

/// Adds the dirty resident pages next to `page` (consecutive with it, inside its aligned
/// `SWAPOUT_CLUSTER_PAGES` block) to `victims`, locked, up to `max` victims in all.
///
/// Why: `UFFDIO_MOVE` flushes the TLB once per run of consecutive present pages it moves
/// (measured on 6.18: a block with k scattered present pages costs k shootdowns, with k
/// consecutive ones, one), and with a second application thread running every flush is an
/// IPI. A victim's neighbours taken with it share its flush (their slots are allocated as
/// one run, see `SwapDevices::alloc_run`), as the pages of a large folio share one in the
/// kernel's swap-out. They may be younger than the FIFO's next victims; the kernel makes the
/// same trade for a large folio. Pages in use (referenced from the swap cache, read ahead
/// and not yet used, busy) stay, and none is taken while most staged pages fault back
/// (`Lru::victims_are_cold`).
fn take_resident_neighbours(
    guards: &RegionSet,
    gi: usize,
    page: usize,
    max: usize,
    victims: &mut ArrayVec<Victim, BATCH>,
) {
    let region = &guards.g[gi];
    let block = page - page % SWAPOUT_CLUSTER_PAGES;
    let block_end = (block + SWAPOUT_CLUSTER_PAGES).min(region.nr_pages);
    let mut take = |n: usize| -> bool {
        if victims.len() >= max {
            return false;
        }
        let pte = region.load(n);
        let wanted =
            pte.state() == PageState::Resident && !pte.busy() && !pte.clean() && !pte.readahead() && !pte.referenced();
        match wanted.then(|| region.try_lock(n, pte)).flatten() {
            Some(locked) if hold_of(region.page_addr(n)).is_some() => {
                region.store(n, locked.unbusy());
                false
            }
            Some(locked) => {
                victims.push(Victim { gi, page: n, pte: locked });
                true
            }
            None => false,
        }
    };
    for n in (block..page).rev() {
        if !take(n) {
            break;
        }
    }
    for n in page + 1..block_end {
        if !take(n) {
            break;
        }
    }
}
