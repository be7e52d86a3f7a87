//! Swap-out, in two stages: resident pages into the swap cache, staged pages to a device.
//!
//! Stage one ([`shrink_active`]) takes the oldest resident pages off the LRU (`crate::lru`),
//! each dirty one with its dirty resident neighbours in its aligned 64 KiB block (as a large
//! folio leaves in the kernel: one TLB flush for the run, `swpout_neighbours`), and moves
//! them out of their region with `UFFDIO_MOVE` into the staging pages of freshly allocated
//! slots (batched: runs of consecutive pages get consecutive slots where the allocator has
//! them, and move with one ioctl); they are then staged in the swap cache
//! (`crate::swap::SwapCache`) and queued for writeback. Staging pages are dropped a round
//! at a time, with one `process_madvise` (`crate::mapping::DiscardBatch`). A page found all
//! zero when staged keeps no slot (`swpout_zero`); a clean page (its slot still holds it)
//! is dropped without a write (`swpout_clean`). Stage two
//! ([`shrink_inactive`]) writes the oldest staged pages to their slots in batches, drops
//! their staging pages and uncharges them; a page its device declines is written to another
//! device, in priority order (`swpout_spilled`). A page that faults back from the swap cache
//! meanwhile is marked referenced and spared once when it next reaches the head of a FIFO
//! (second chance, in [`pop_victims`]).
//!
//! Locking: the queues are lock-free; a victim is owned through its busy bit from the moment
//! it is popped until its new page-table word is stored. A round holds at most
//! `MAX_REGIONS_PER_SET` region guards and allocates nothing (it may run in a SIGBUS
//! handler). Invariants: a page leaves the charge only once its contents are on a device
//! (written, or clean), or known zero; a page whose write fails stays staged and charged,
//! and goes round again; a slot's staging page is empty before the slot can be reused.

use std::sync::atomic::Ordering;

use arrayvec::ArrayVec;

use super::accounting::uncharge;
use super::cow;
use crate::backend::{BackendError, WriteReq};
use crate::lru::List;
use crate::mapping::DiscardBatch;
use crate::pin::{hold_of, Hold};
use crate::region::{PageRef, PageState, Pte, RegionInner, RegionSet, REGIONS};
use crate::state::PagerShared;
use crate::state::RECLAIM_BATCH_PAGES as BATCH;
use crate::stats::Counter;
use crate::swap::idle_ages::Epoch;
use crate::swap::{SwapDevice, SwapEntry};
use crate::uffd::{RangeResult, PAGE_SIZE};

/// Stale queue entries one round may drop (bounds a round's work; stale entries cost a load
/// and a compare each).
const MAX_STALE_PER_ROUND: usize = 64 * BATCH;

/// Where a popped page goes back to.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Queue {
    Lru(List),
    SwapCache,
}

fn requeue(p: &PagerShared, q: Queue, r: PageRef) {
    match q {
        Queue::Lru(list) => p.lru.requeue(list, r, &p.stats),
        Queue::SwapCache => requeue_staged(p, r),
    }
}

/// Queues a staged page (again) for writeback.
fn requeue_staged(p: &PagerShared, r: PageRef) {
    if p.swap_cache.push(r.pack()).is_err() {
        p.stats.inc(Counter::LruOverflow);
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
    /// The oldest staged pages (stage two).
    Staged,
    /// The oldest staged pages that left their regions in this epoch or before (idle aging).
    StagedBy(Epoch),
}

/// Whether the staged page `pte` left its region after epoch `cut`.
fn staged_after(p: &PagerShared, pte: Pte, cut: Epoch) -> bool {
    p.devices.device(pte.entry()).stamp_of(pte.entry().offset()).is_some_and(|e| e > cut)
}

/// Whether the swap cache's oldest page left its region after epoch `cut` (a hint, as the
/// queue's head may be popped meanwhile).
fn staged_head_after(p: &PagerShared, guards: &mut RegionSet, cut: Epoch) -> bool {
    let Some(v) = p.swap_cache.peek() else { return false };
    let r = PageRef::unpack(v);
    let Ok(gi) = guards.get(p, r) else { return false };
    let pte = guards.g[gi].load(r.page);
    pte.state() == PageState::Cached && pte.gen() == r.page_gen && staged_after(p, pte, cut)
}

/// Where a round pops its victims from, and which pages it takes (see [`pop_victims`]).
struct Source {
    /// Staged pages from the swap cache (stage two), rather than resident ones from the LRU.
    inactive: bool,
    /// [`Take::StagedBy`]'s epoch: only pages that left their regions then or before.
    cut: Option<Epoch>,
    /// The state a page must be in to be taken.
    want: PageState,
    /// Resident victims come from the use-once FIFO only while it holds more than this.
    reserve: usize,
}

impl Source {
    fn new(p: &PagerShared, take: Take) -> Source {
        let inactive = take != Take::Resident;
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
            p.lru.streamed_reserve(p.charge.limit_pages.load(Ordering::Relaxed), p.readahead_max_pages)
        };
        Source { inactive, cut, want, reserve }
    }

    /// The next queue entry, and the queue it goes back to if it is not taken.
    fn pop(&self, p: &PagerShared) -> Option<(u64, Queue)> {
        if self.inactive {
            return p.swap_cache.pop().map(|v| (v, Queue::SwapCache));
        }
        p.lru.pop(self.reserve).map(|(v, list)| (v, Queue::Lru(list)))
    }

    /// Pops the next entry and looks its page up in the round's region guards (taking one
    /// for its region if need be).
    fn pop_live(&self, p: &PagerShared, guards: &mut RegionSet) -> Popped {
        let Some((v, from)) = self.pop(p) else { return Popped::End };
        let r = PageRef::unpack(v);
        let gi = match guards.get(p, r) {
            Ok(gi) => gi,
            Err(true) => {
                requeue(p, from, r);
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
fn pop_victims(
    p: &PagerShared,
    take: Take,
    nr: usize,
    guards: &mut RegionSet,
    nr_pinned: &mut usize,
) -> ArrayVec<Victim, BATCH> {
    let src = Source::new(p, take);
    let max = nr.min(BATCH);
    let mut victims = ArrayVec::new();
    // Stale entries (pages that moved on since they were queued) are dropped as they are
    // found, cheaply, and do not count against the scan; entries put back (busy, spared)
    // do, so a round ends even when every page is in use.
    let mut scanned = 0;
    let mut stale = 0;
    while victims.len() < max && scanned < 4 * BATCH && stale < MAX_STALE_PER_ROUND {
        if src.cut.is_some_and(|cut| staged_head_after(p, guards, cut)) {
            break; // the oldest staged page is not idle long enough: nor are the others
        }
        let (r, from, gi, pte) = match src.pop_live(p, guards) {
            Popped::Live { r, from, gi, pte } => (r, from, gi, pte),
            Popped::Stale => {
                stale += 1;
                continue;
            }
            Popped::End => break,
        };
        let region = &guards.g[gi];
        scanned += 1;
        if pte.busy() {
            requeue(p, from, r);
            continue;
        }
        if src.cut.is_some_and(|cut| staged_after(p, pte, cut)) {
            // Not the head peeked at (another thread popped that one): a young page, put
            // back at the tail, out of order once.
            requeue(p, from, r);
            break;
        }
        if !src.inactive && pte.referenced() {
            spare_referenced(p, region, r, pte);
            continue;
        }
        let Some(locked) = region.try_lock(r.page, pte) else {
            requeue(p, from, r);
            continue;
        };
        if src.inactive {
            victims.push(Victim { gi, page: r.page, pte: locked });
        } else {
            take_resident(p, guards, Victim { gi, page: r.page, pte: locked }, r, max, &mut victims, nr_pinned);
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
fn spare_referenced(p: &PagerShared, region: &RegionInner, r: PageRef, pte: Pte) {
    debug_assert!(pte.state() == PageState::Resident && pte.referenced());
    let spared = pte.with_referenced(false);
    if region.pte(r.page).compare_exchange(pte.0, spared.0, Ordering::AcqRel, Ordering::Acquire).is_ok() {
        p.stats.inc(Counter::Pgactivate);
    }
    // Used again: no longer use-once.
    p.lru.add(r, &p.stats);
}

/// A resident page just locked (`v`, popped as `r`): left in place if the program locked it
/// or a system call pins it (counted in `nr_pinned`), else taken as a victim, with its dirty
/// neighbours (up to `max` victims in all) while staged pages stay out.
fn take_resident(
    p: &PagerShared,
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
            p.stats.inc(Counter::ReclaimPinned);
            *nr_pinned += 1;
        }
        Some(Hold::Pinned) => {
            // A system call's memory: stays in until the call returns (see `pin`).
            region.store(v.page, v.pte.unbusy());
            p.stats.inc(Counter::ReclaimPinned);
            *nr_pinned += 1;
            p.lru.add(r, &p.stats);
        }
        None => {
            victims.push(v);
            // Neighbours only while staged pages stay out (see `crate::lru`): taken with
            // a victim in use, they came back at once (sqlite3 under `--auto`: 3,200 a
            // second, its limit held 80 % above its working set).
            if !v.pte.clean() && p.lru.victims_are_cold() {
                let before = victims.len();
                take_resident_neighbours(guards, v.gi, v.page, max, victims);
                p.stats.add(Counter::SwpoutNeighbours, (victims.len() - before) as u64);
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

/// Who moves resident pages out.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum Stager {
    /// Reclaim, in the faulting thread.
    Direct,
    /// Reclaim, in the background reclaimer.
    Background,
    /// The aging scan (`super::aging`): its pages are marked aged, and their swap-cache hits
    /// are no stalls.
    Aging,
}

impl Stager {
    fn counter(self) -> Counter {
        match self {
            Stager::Direct => Counter::PgstealDirect,
            Stager::Background => Counter::PgstealBackground,
            Stager::Aging => Counter::Pgdeactivate,
        }
    }
}

/// Moves up to `nr` of the oldest resident pages into the swap cache for `by`. Returns the
/// pages moved, and of those the pages found all zero (uncharged at once).
pub(super) fn shrink_active(p: &PagerShared, nr: usize, by: Stager) -> Shrunk {
    let mut guards = RegionSet::new();
    let mut nr_pinned = 0;
    let mut victims = pop_victims(p, Take::Resident, nr, &mut guards, &mut nr_pinned);
    if victims.is_empty() {
        if p.lru.is_empty() {
            refill_active_by_scan(p);
        }
        return Shrunk { pinned: nr_pinned, ..Shrunk::default() };
    }
    assert!(victims.len() <= nr.min(BATCH));
    victims.sort_unstable_by_key(|v| (v.gi, v.page));
    let (dropped, mut refused) = drop_clean(p, &guards, &victims);
    victims.retain(|v| !v.pte.clean());
    if victims.is_empty() {
        return Shrunk { moved: dropped, uncharged: dropped, refused, pinned: nr_pinned };
    }
    let mut entries = [SwapEntry::new(0, 0); BATCH];
    alloc_slots(p, &guards, &mut victims, &mut entries);
    let mut to_free: ArrayVec<u64, BATCH> = ArrayVec::new();
    let staged = stage(p, by, &guards, &victims, &entries, &mut to_free);
    refused += staged.refused;
    p.stats.add(by.counter(), staged.moved as u64);
    crate::stats::note_taken_out((staged.moved + dropped) as u64);
    p.devices.free_now(&mut to_free);
    Shrunk { moved: staged.moved + dropped, uncharged: staged.uncharged + dropped, refused, pinned: nr_pinned }
}

/// Clean victims need no write: their slot still holds them. They leave the region as dirty
/// pages do, into their own slot's staging page, which is then dropped: `MADV_DONTNEED` on
/// the region itself would send a REMOVE event (see `events`). Runs of consecutive pages
/// with consecutive slots move with one call. Returns the pages dropped and refused.
fn drop_clean(p: &PagerShared, guards: &RegionSet, victims: &[Victim]) -> (usize, usize) {
    let (mut dropped, mut refused) = (0, 0);
    // Moved first, every run; their staging pages are then dropped with one TLB flush (see
    // `DiscardBatch`), and only then are the pages published as swapped: a page that faults
    // back and leaves again must find its slot's staging page empty.
    let mut discards = DiscardBatch::<BATCH>::new();
    let clean_runs = move_clean_runs(p, guards, victims, &mut discards);
    discards.flush();
    let now = crate::swap::idle_ages::now_epoch();
    for &(i, j, done, r) in &clean_runs {
        refused += publish_clean_run(p, guards, &victims[i..j], done, r, now);
        dropped += done;
    }
    p.stats.add(Counter::SwpoutClean, dropped as u64);
    assert!(dropped + refused <= victims.len());
    (dropped, refused)
}

/// A run of clean victims moved out (or not): victims `i..j`, the first `done` of them
/// moved, and what the move said.
type CleanRun = (usize, usize, usize, RangeResult);

/// Moves the clean victims into their own slots' staging pages, a run of consecutive pages
/// with consecutive slots at a time, and queues the staging pages moved into on `discards`.
/// Returns the runs.
fn move_clean_runs(
    p: &PagerShared,
    guards: &RegionSet,
    victims: &[Victim],
    discards: &mut DiscardBatch<BATCH>,
) -> ArrayVec<CleanRun, BATCH> {
    let mut clean_runs = ArrayVec::new();
    let mut i = 0;
    while i < victims.len() {
        if !victims[i].pte.clean() {
            i += 1;
            continue;
        }
        // A clean page is resident and keeps the slot it was read from (`page_table`).
        debug_assert!(victims[i].pte.state() == PageState::Resident && victims[i].pte.busy());
        let e = |k: usize| victims[k].pte.entry();
        let mut j = i + 1;
        while j < victims.len()
            && victims[j].pte.clean()
            && victims[j].gi == victims[i].gi
            && victims[j].page == victims[j - 1].page + 1
            && e(j).device() == e(i).device()
            && e(j).offset() == e(j - 1).offset() + 1
        {
            j += 1;
        }
        let region = &guards.g[victims[i].gi];
        let dev = p.devices.device(e(i));
        let len = (j - i) * PAGE_SIZE;
        let r = p.swap_cache.move_in(dev, e(i).offset(), region.page_addr(victims[i].page), len);
        let done = r.done_bytes(len) / PAGE_SIZE;
        debug_assert!(done <= j - i, "a move reports no more than it was asked");
        if done > 0 {
            dev.discard_staged_later(discards, e(i).offset(), done);
        }
        clean_runs.push((i, j, done, r));
        i = j;
    }
    clean_runs
}

/// Publishes a run of clean victims (`run`, all of one region) once their staging pages are
/// dropped: the first `done`, moved, are swapped (stamped `now`) and uncharged; the others
/// stay resident and clean, back on the LRU. `r`: what the move said. Returns 1 when the
/// move was refused (counted), else 0.
fn publish_clean_run(
    p: &PagerShared,
    guards: &RegionSet,
    run: &[Victim],
    done: usize,
    r: RangeResult,
    now: Epoch,
) -> usize {
    let region = &guards.g[run[0].gi];
    for (k, v) in run.iter().enumerate() {
        if k < done {
            p.devices.device(v.pte.entry()).stamp(v.pte.entry().offset(), now);
            region.store(v.page, v.pte.next(PageState::Swapped, Some(v.pte.entry())).with_referenced(false));
        } else {
            // Refused (read-only after mprotect, or gone: an event settles it) or not
            // tried: stays resident and clean.
            region.store(v.page, v.pte.unbusy());
            p.lru.add(guards.page_ref(v.gi, v.page, v.pte), &p.stats);
        }
    }
    let mut refused = 0;
    if done < run.len() {
        // One page refused (the first not moved); the rest of its run was not tried and
        // goes back on the LRU.
        p.stats.inc(Counter::MoveRefused);
        refused = 1;
        if matches!(r, RangeResult::Partial { errno: libc::EBUSY, .. }) {
            let v = run[done];
            cow::queue(p, guards.page_ref(v.gi, v.page, v.pte));
        }
    }
    uncharge(p, done);
    // Each page dropped was counted clean when it was mapped so (`swapin::publish`), before
    // its word said so: the count cannot be below the clean pages this round owns.
    let clean_before = p.clean_pages.fetch_sub(done, Ordering::Relaxed);
    debug_assert!(clean_before >= done, "clean page count below the clean pages dropped");
    // A run lies in one region.
    let unused = run[..done].iter().filter(|v| v.pte.readahead()).count() as u64;
    p.stats.add(Counter::SwapRaUnused, unused);
    region.streams.note_unused(unused);
    refused
}

/// Allocates a slot for each victim into `entries`: a run of consecutive pages gets
/// consecutive slots where the allocator has them, so that it moves with one ioctl and one
/// TLB flush. Victims left without a slot (every device full) stay resident and are
/// dropped from `victims`; each slot allocated records its page as owner.
fn alloc_slots(p: &PagerShared, guards: &RegionSet, victims: &mut ArrayVec<Victim, BATCH>, entries: &mut [SwapEntry]) {
    let n = victims.len();
    let mut got = 0;
    while got < n {
        let run_end = (got + 1..n)
            .find(|&j| victims[j].gi != victims[got].gi || victims[j].page != victims[j - 1].page + 1)
            .unwrap_or(n);
        let want = run_end - got;
        let m = if want > 1 {
            p.devices.alloc_run(&mut entries[got..run_end])
        } else {
            p.devices.alloc(&mut entries[got..run_end])
        };
        got += m;
        if m < want {
            break; // every device is full
        }
    }
    if got < n {
        // No room on any device: these pages stay resident, nothing is lost.
        for v in &victims[got..] {
            guards.g[v.gi].store(v.page, v.pte.unbusy());
            p.lru.add(guards.page_ref(v.gi, v.page, v.pte), &p.stats);
        }
        p.stats.add(Counter::SwapAllocFail, (n - got) as u64);
        victims.truncate(got);
    }
    for (v, e) in victims.iter().zip(entries.iter()) {
        let owner = guards.page_ref(v.gi, v.page, v.pte).owner();
        p.devices.device(*e).set_owner(e.offset(), owner);
    }
}

/// What staging a batch of victims did.
struct Staged {
    /// Pages moved out of their regions (into the swap cache, or found zero).
    moved: usize,
    /// Pages uncharged: found zero.
    uncharged: usize,
    /// Pages the kernel refused to move.
    refused: usize,
}

/// Moves each victim into the staging page of its slot (`entries`), in runs: same region,
/// consecutive pages, consecutive slots on one device. A page found all zero keeps no
/// slot; the others join the swap cache. Slots to free go to `to_free`.
fn stage(
    p: &PagerShared,
    by: Stager,
    guards: &RegionSet,
    victims: &[Victim],
    entries: &[SwapEntry],
    to_free: &mut ArrayVec<u64, BATCH>,
) -> Staged {
    assert!(entries.len() >= victims.len(), "a slot for every victim");
    let mut staged = Staged { moved: 0, uncharged: 0, refused: 0 };
    let mut i = 0;
    while i < victims.len() {
        let mut j = i + 1;
        while j < victims.len()
            && victims[j].gi == victims[i].gi
            && victims[j].page == victims[j - 1].page + 1
            && entries[j].device() == entries[j - 1].device()
            && entries[j].offset() == entries[j - 1].offset() + 1
        {
            j += 1;
        }
        let region = &guards.g[victims[i].gi];
        let dev = p.devices.device(entries[i]);
        let mut k = i;
        while k < j {
            let len = (j - k) * PAGE_SIZE;
            let r = p.swap_cache.move_in(dev, entries[k].offset(), region.page_addr(victims[k].page), len);
            let done = r.done_bytes(len) / PAGE_SIZE;
            for m in k..k + done {
                staged.uncharged += stage_moved(p, by, guards, victims[m], entries[m], to_free);
            }
            staged.moved += done;
            k += done;
            if let RangeResult::Partial { errno, .. } = r {
                staged.refused += move_refused(p, guards, victims[k], entries[k], errno, to_free);
                k += 1;
            }
        }
        i = j;
    }
    staged
}

/// Victim `v` is in the staging page of its slot `e`: it joins the swap cache, or, found
/// all zero, keeps no slot (returns 1: uncharged).
fn stage_moved(
    p: &PagerShared,
    by: Stager,
    guards: &RegionSet,
    v: Victim,
    e: SwapEntry,
    to_free: &mut ArrayVec<u64, BATCH>,
) -> usize {
    let region = &guards.g[v.gi];
    let dev = p.devices.device(e);
    if v.pte.readahead() {
        p.stats.inc(Counter::SwapRaUnused);
        region.streams.note_unused(1);
    }
    if dev.staged_page_is_zero(e.offset()) {
        // Nothing worth a slot: drop the staged page, remember "zero".
        dev.release_staged(e.offset());
        to_free.push(e.bits());
        region.store(v.page, v.pte.next(PageState::Zero, None).with_referenced(false));
        uncharge(p, 1);
        p.stats.inc(Counter::SwpoutZero);
        return 1;
    }
    p.swap_cache.insert(dev, e.offset());
    let new = v.pte.next(PageState::Cached, Some(e)).with_referenced(false);
    let new = if by == Stager::Aging {
        new.with_aged()
    } else {
        p.lru.note_staged(1);
        new
    };
    region.store(v.page, new);
    requeue_staged(p, guards.page_ref(v.gi, v.page, new));
    0
}

/// The kernel refused to move victim `v` (`errno`): it stays where it is, back on the LRU,
/// and its slot `e` is forgotten. Returns 1 when the refusal counts as one (not `ENOENT`).
fn move_refused(
    p: &PagerShared,
    guards: &RegionSet,
    v: Victim,
    e: SwapEntry,
    errno: i32,
    to_free: &mut ArrayVec<u64, BATCH>,
) -> usize {
    let region = &guards.g[v.gi];
    p.devices.device(e).forget_slot(e.offset());
    region.store(v.page, v.pte.unbusy());
    p.lru.add(guards.page_ref(v.gi, v.page, v.pte), &p.stats);
    p.stats.inc(Counter::MoveRefused);
    if errno == libc::ENOENT {
        // Not there: the application unmapped, moved or discarded it, and the event that
        // says which settles the page (see `events`). Until then it stays as it is: turning
        // it into a zero page would lose a page that `mremap` moved.
        to_free.push(e.bits());
        return 0;
    }
    // Pinned, shared or otherwise refused. A slot whose staging page is unexpectedly
    // occupied (EEXIST) is not reused.
    debug_assert_ne!(errno, libc::EEXIST, "staging page of slot {e:?} occupied");
    if errno != libc::EEXIST {
        to_free.push(e.bits());
    }
    if errno == libc::EBUSY {
        // Shared with a fork child (or pinned): see `cow`.
        cow::queue(p, guards.page_ref(v.gi, v.page, v.pte));
    }
    1
}

/// What `shrink_active` did with its victims.
#[derive(Debug, Default, Clone, Copy)]
pub(super) struct Shrunk {
    /// Pages that left their region (into the swap cache, or dropped clean or zero).
    pub moved: usize,
    /// Of those, pages uncharged at once (clean or zero).
    pub uncharged: usize,
    /// Pages the kernel refused to move for a reason waiting does not cure: shared with
    /// a fork child (copy-on-write), pinned, or protected differently from the staging
    /// area (`mprotect`). Pages found unmapped (`ENOENT`, an event settles them) are not
    /// counted.
    pub refused: usize,
    /// Victims left in place because a system call pins them (`crate::pin`; the pin may be
    /// the charging thread's own, bringing the rest of its call's memory in).
    pub pinned: usize,
}

/// Writes back up to `nr` of the oldest staged pages (with [`Take::StagedBy`], only those
/// idle long enough). Returns the pages uncharged.
///
/// Each page goes first to its own slot. A device may decline a page (a pool at its cap,
/// or an incompressible page it passes on): the page then gets a slot on another device and
/// is written there, in priority order. A page that no device takes, or whose write fails,
/// stays staged in RAM (still charged) and is retried in a later round.
pub(super) fn shrink_inactive(p: &PagerShared, nr: usize, take: Take) -> usize {
    debug_assert!(take != Take::Resident);
    let mut guards = RegionSet::new();
    let mut victims = pop_victims(p, take, nr, &mut guards, &mut 0);
    if victims.is_empty() {
        return 0;
    }
    victims.sort_unstable_by_key(|v| v.pte.entry());
    // Where each victim goes: its own slot first.
    let mut targets: ArrayVec<SwapEntry, BATCH> = victims.iter().map(|v| v.pte.entry()).collect();
    let mut pending: ArrayVec<usize, BATCH> = (0..victims.len()).collect();
    let mut excluded = 0u64;
    let mut uncharged = 0;
    let mut to_free: ArrayVec<u64, BATCH> = ArrayVec::new();
    // Bounded by the number of devices: each round excludes the devices that declined.
    while !pending.is_empty() {
        let mut rejected: ArrayVec<usize, BATCH> = ArrayVec::new();
        uncharged += write_runs(p, &guards, &victims, &targets, &pending, &mut rejected, &mut to_free);
        if rejected.is_empty() {
            break;
        }
        for &i in &rejected {
            let t = targets[i];
            excluded |= 1 << t.device();
            if t != victims[i].pte.entry() {
                to_free.push(t.bits());
            }
        }
        let mut fresh = [SwapEntry::new(0, 0); BATCH];
        let got = p.devices.alloc_excluding_mask(excluded, &mut fresh[..rejected.len()]);
        p.stats.add(Counter::SwpoutSpilled, got as u64);
        for (k, &i) in rejected.iter().enumerate() {
            if k < got {
                targets[i] = fresh[k];
            } else {
                // No other device has room: the page stays staged.
                let v = &victims[i];
                guards.g[v.gi].store(v.page, v.pte.unbusy());
                requeue_staged(p, guards.page_ref(v.gi, v.page, v.pte));
                p.stats.inc(Counter::SwapAllocFail);
            }
        }
        pending.clear();
        pending.extend(rejected.iter().copied().take(got));
    }
    p.devices.free_now(&mut to_free);
    uncharged
}

/// The staged victims `run` (indices into `victims` and `targets`) were written to their
/// targets: they are swapped now, uncharged and out of the swap cache. Returns how many.
fn written(
    p: &PagerShared,
    guards: &RegionSet,
    victims: &[Victim],
    targets: &[SwapEntry],
    run: &[usize],
    crcs: &[u32],
    to_free: &mut ArrayVec<u64, BATCH>,
) -> usize {
    assert_eq!(run.len(), crcs.len());
    let sdev = p.devices.device(victims[run[0]].pte.entry());
    for (&k, &crc) in run.iter().zip(crcs) {
        let v = &victims[k];
        let (old, new) = (v.pte.entry(), targets[k]);
        let dev = p.devices.device(new);
        dev.set_checksum(new.offset(), crc);
        if new == old {
            sdev.complete_writeback(old.offset());
        } else {
            // Written elsewhere: the old slot held only the staging page. The page keeps the
            // moment it left its region.
            let left = sdev.stamp_of(old.offset());
            sdev.forget_slot(old.offset());
            to_free.push(old.bits());
            dev.set_owner(new.offset(), guards.page_ref(v.gi, v.page, v.pte).owner());
            if let Some(e) = left {
                dev.stamp(new.offset(), e);
            }
        }
        guards.g[v.gi].store(v.page, v.pte.next(PageState::Swapped, Some(new)));
    }
    let n = run.len();
    p.swap_cache.uncount(n);
    uncharge(p, n);
    p.stats.add(Counter::Pswpout, n as u64);
    n
}

/// The write of the staged victims `run` failed: the pages stay staged in RAM (still
/// charged) and go round again; their new slots, if any, are freed.
fn write_failed(
    p: &PagerShared,
    guards: &RegionSet,
    victims: &[Victim],
    targets: &[SwapEntry],
    run: &[usize],
    to_free: &mut ArrayVec<u64, BATCH>,
) {
    for &k in run {
        let v = &victims[k];
        guards.g[v.gi].store(v.page, v.pte.unbusy());
        requeue_staged(p, guards.page_ref(v.gi, v.page, v.pte));
        if targets[k] != v.pte.entry() {
            to_free.push(targets[k].bits());
        }
    }
    p.stats.add(Counter::SwpoutError, run.len() as u64);
}

/// Writes the `pending` victims to their `targets`, in runs (consecutive staging pages to
/// consecutive slots of one device), and finishes the written ones. Victims their device
/// declined go to `rejected`; other failures stay staged. Returns the pages uncharged.
fn write_runs(
    p: &PagerShared,
    guards: &RegionSet,
    victims: &[Victim],
    targets: &[SwapEntry],
    pending: &[usize],
    rejected: &mut ArrayVec<usize, BATCH>,
    to_free: &mut ArrayVec<u64, BATCH>,
) -> usize {
    // Each victim is a staged page this round owns; only those are written.
    debug_assert!(
        pending.iter().all(|&k| victims[k].pte.busy() && victims[k].pte.state() == PageState::Cached),
        "written victims are staged and locked"
    );
    let mut uncharged = 0;
    let mut i = 0;
    while i < pending.len() {
        // One write call per target device.
        let tdev = targets[pending[i]].device();
        let dev = &p.devices.devices()[tdev];
        let mut end = i;
        while end < pending.len() && targets[pending[end]].device() == tdev {
            end += 1;
        }
        if dev.health.is_degraded() {
            // Its writes fail: not tried (each failure may cost a timeout), redirected as
            // if it had declined them (see `swap::health`).
            rejected.extend(pending[i..end].iter().copied());
            i = end;
            continue;
        }
        let batch = WriteBatch { guards, victims, targets, pending: &pending[i..end] };
        uncharged += write_to_device(p, dev, batch, rejected, to_free);
        i = end;
    }
    uncharged
}

/// The staged victims one write call sends: `pending` (indices into `victims` and
/// `targets`), all to one device, in the round's region guards.
#[derive(Clone, Copy)]
struct WriteBatch<'a> {
    guards: &'a RegionSet,
    victims: &'a [Victim],
    targets: &'a [SwapEntry],
    pending: &'a [usize],
}

/// Writes `b`'s victims to device `dev` with one call, drops the staging pages of the runs
/// written, and finishes each run: swapped and uncharged, declined (to `rejected`), or
/// failed (staged again). Returns the pages uncharged.
fn write_to_device(
    p: &PagerShared,
    dev: &SwapDevice,
    b: WriteBatch<'_>,
    rejected: &mut ArrayVec<usize, BATCH>,
    to_free: &mut ArrayVec<u64, BATCH>,
) -> usize {
    debug_assert!(b.pending.iter().all(|&k| b.targets[k].device() == dev.index), "one device per write call");
    let mut crcs = [0u32; BATCH];
    let (runs, mut reqs) = plan_writes(p, dev, b, &mut crcs);
    assert_eq!(runs.len(), reqs.len(), "a request per run");
    dev.backend.write(&mut reqs);
    for req in &reqs {
        dev.health.note_write(&req.result);
    }
    // The staging pages must be empty before their slots can be freed and reused, which
    // may happen as soon as the pages are published as swapped: all written runs are
    // dropped first, with one TLB flush for the batch (see `DiscardBatch`).
    let mut discards = DiscardBatch::<BATCH>::new();
    for (req, &(s, t)) in reqs.iter().zip(&runs) {
        if req.result.is_ok() {
            let first = b.victims[b.pending[s]].pte.entry();
            let sdev = p.devices.device(first);
            sdev.discard_staged_later(&mut discards, first.offset(), t - s);
        }
    }
    discards.flush();
    let mut uncharged = 0;
    for (req, &(s, t)) in reqs.iter().zip(&runs) {
        let run = &b.pending[s..t];
        match &req.result {
            Ok(()) => uncharged += written(p, b.guards, b.victims, b.targets, run, &crcs[s..t], to_free),
            Err(BackendError::Rejected { .. }) => rejected.extend(run.iter().copied()),
            Err(_) => write_failed(p, b.guards, b.victims, b.targets, run, to_free),
        }
    }
    uncharged
}

/// Splits `b`'s victims into runs (indices into `b.pending`) of consecutive staging pages
/// going to consecutive slots, and makes each run's write request; fills `crcs` (by index
/// into `b.pending`) when `dev` keeps checksums.
fn plan_writes<'p>(
    p: &'p PagerShared,
    dev: &SwapDevice,
    b: WriteBatch<'_>,
    crcs: &mut [u32; BATCH],
) -> (ArrayVec<(usize, usize), BATCH>, ArrayVec<WriteReq<'p>, BATCH>) {
    let (pending, victims, targets) = (b.pending, b.victims, b.targets);
    let mut runs = ArrayVec::new();
    let mut reqs = ArrayVec::new();
    let src = |k: usize| victims[pending[k]].pte.entry();
    let mut s = 0;
    while s < pending.len() {
        let mut t = s + 1;
        while t < pending.len()
            && targets[pending[t]].offset() == targets[pending[t - 1]].offset() + 1
            && src(t).device() == src(t - 1).device()
            && src(t).offset() == src(t - 1).offset() + 1
        {
            t += 1;
        }
        let sdev = p.devices.device(src(s));
        if dev.has_checksums() {
            for (k, crc) in crcs.iter_mut().enumerate().take(t).skip(s) {
                *crc = sdev.staged_page_crc32c(src(k).offset());
            }
        }
        runs.push((s, t));
        reqs.push(WriteReq::new(targets[pending[s]].offset(), sdev.staged_pages(src(s).offset(), t - s)));
        s = t;
    }
    (runs, reqs)
}

/// Re-queues resident pages that have no queue entry (the queue overflowed at some point).
fn refill_active_by_scan(p: &PagerShared) {
    let resident = p.charge.resident_pages.load(Ordering::Acquire);
    let staged = p.swap_cache.nr_pages();
    if resident <= staged {
        return;
    }
    let budget = p.lru.active_capacity() / 2;
    let mut pushed = 0;
    REGIONS.for_each(|g| {
        if !std::ptr::eq(&*g.pager, p) {
            return;
        }
        for page in 0..g.nr_pages {
            if pushed >= budget {
                return;
            }
            let mut pte = g.load(page);
            if pte.unevictable() && !pte.busy() && !crate::mlock::is_locked(g.page_addr(page)) {
                // Unlocked while it was busy, so the unlock left it off the LRU: back on it.
                let back = pte.with_unevictable(false);
                if g.pte(page).compare_exchange(pte.0, back.0, Ordering::AcqRel, Ordering::Acquire).is_ok() {
                    pte = back;
                }
            }
            if pte.state() == PageState::Resident && !pte.busy() && !pte.unevictable() {
                let r = PageRef { region_idx: g.index, region_gen: g.gen, page_gen: pte.gen(), page };
                if p.lru.try_add(r) {
                    pushed += 1;
                }
            }
        }
    });
}
