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
//! (second chance; choosing the victims is `super::victims`').
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
use super::victims::{pop_victims, requeue_staged, Take, Victim};
use super::Reclaim;
use crate::backend::{BackendError, WriteReq};
use crate::mapping::DiscardBatch;
use crate::region::{PageRef, PageState, Pte, RegionSet, REGIONS};
use crate::state::RECLAIM_BATCH_PAGES as BATCH;
use crate::stats::Counter;
use crate::swap::idle_ages::{Epoch, Stamp};
use crate::swap::{SwapDevice, SwapEntry};
use crate::uffd::{RangeResult, PAGE_SIZE};

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

    /// Of `n` pages it moved out, those that advance the eviction clock (`crate::lru`): the
    /// pages reclaim pushes out, not the idle ones the aging scan moves (which compete with
    /// nothing; they are stamped with the clock's reading all the same).
    fn nr_evicted(self, n: usize) -> usize {
        if self == Stager::Aging {
            0
        } else {
            n
        }
    }
}

/// Moves up to `nr` of the oldest resident pages into the swap cache for `by`. Returns the
/// pages moved, and of those the pages found all zero (uncharged at once).
pub(super) fn shrink_active(cx: &Reclaim<'_>, nr: usize, by: Stager) -> Shrunk {
    let mut guards = RegionSet::new();
    let mut nr_pinned = 0;
    let take = if by == Stager::Aging { Take::Aging } else { Take::Resident };
    let mut victims = pop_victims(cx, take, nr, &mut guards, &mut nr_pinned);
    if victims.is_empty() {
        // A scan a moment ago found only locked pages, and the LRU is still empty: the
        // same answer, without scanning again.
        let all_locked = cx.lru.is_empty() && (cx.lru.all_locked_recently() || refill_active_by_scan(cx));
        return Shrunk { pinned: nr_pinned, all_locked, ..Shrunk::default() };
    }
    assert!(victims.len() <= nr.min(BATCH));
    victims.sort_unstable_by_key(|v| (v.gi, v.page));
    let clean = take_out_clean(cx, by, &guards, &victims);
    let (dropped, mut refusals) = (clean.moved, clean.refusals);
    victims.retain(|v| !v.pte.clean());
    if victims.is_empty() {
        let (uncharged, refused, pinned) = (clean.uncharged, refusals.refused, nr_pinned + refusals.held);
        return Shrunk { moved: dropped, uncharged, refused, pinned, all_locked: false };
    }
    let mut entries = [SwapEntry::new(0, 0); BATCH];
    alloc_slots(cx, &guards, &mut victims, &mut entries);
    let mut to_free: ArrayVec<u64, BATCH> = ArrayVec::new();
    let staged = stage(cx, by, &guards, &victims, &entries, &mut to_free);
    refusals.add(staged.refusals);
    cx.stats.add(by.counter(), staged.moved as u64);
    crate::stats::note_taken_out((staged.moved + dropped) as u64);
    cx.devices.free_now(&mut to_free);
    let (moved, uncharged) = (staged.moved + dropped, staged.uncharged + clean.uncharged);
    Shrunk { moved, uncharged, refused: refusals.refused, pinned: nr_pinned + refusals.held, all_locked: false }
}

/// Victims the kernel refused to move, by what the refusal means.
#[derive(Debug, Default, Clone, Copy)]
struct Refusals {
    /// For a reason waiting does not cure (see [`Shrunk::refused`]).
    refused: usize,
    /// Pinned by a system call under way (`EBUSY` in a process that never forked), held in
    /// a while (`pin::note_refused`): counted with the pinned victims.
    held: usize,
}

impl Refusals {
    fn add(&mut self, other: Refusals) {
        self.refused += other.refused;
        self.held += other.held;
    }
}

/// Counts the refusal of victim `v` with `errno`. `ENOENT` (not there: the application
/// unmapped, moved or discarded it, and the event that says which settles the page, see
/// `events`) is no refusal that matters to the charge. With `EBUSY` the page is pinned, or
/// shared with a fork child: held in a while if it is pinned (`pin`), and queued to be made
/// exclusive in case it is shared (`cow`; after a fork only that). Others (`EINVAL`: made
/// read-only; `EEXIST`: its staging page still mapped) are refused.
fn note_refusal(cx: &Reclaim<'_>, guards: &RegionSet, v: Victim, errno: i32) -> Refusals {
    cx.stats.inc(Counter::MoveRefused);
    if errno == libc::ENOENT {
        return Refusals::default();
    }
    if errno != libc::EBUSY {
        return Refusals { refused: 1, held: 0 };
    }
    let held = crate::pin::note_refused(guards.g[v.gi].page_addr(v.page), crate::clock::now_ns());
    cow::queue(cx, guards.page_ref(v.gi, v.page, v.pte));
    Refusals { refused: usize::from(!held), held: usize::from(held) }
}

/// What [`take_out_clean`] did with the clean victims.
struct CleanTaken {
    /// Pages that left their region (dropped, or staged by the aging scan).
    moved: usize,
    /// Of those, pages uncharged: dropped.
    uncharged: usize,
    /// Pages the kernel refused to move.
    refusals: Refusals,
}

/// Clean victims need no write: their slot still holds them. They leave the region as dirty
/// pages do, into their own slot's staging page. Reclaim then drops that page:
/// `MADV_DONTNEED` on the region itself would send a REMOVE event (see `events`), but where
/// the regions' descriptor asks for none ([`drop_clean_runs`]). The aging
/// scan keeps it staged, clean, so that a page still in use comes back from RAM (a
/// swap-cache hit) rather than from its device: dropped, each hot clean page of a cache's
/// working set was read back every pass, a stall on memory the program had. Runs of
/// consecutive pages with consecutive slots move with one call.
fn take_out_clean(cx: &Reclaim<'_>, by: Stager, guards: &RegionSet, victims: &[Victim]) -> CleanTaken {
    let (mut moved, mut refusals) = (0, Refusals::default());
    let keep = by == Stager::Aging;
    // Moved first, every run; their staging pages are then dropped with one TLB flush (see
    // `DiscardBatch`), and only then are the pages published as swapped: a page that faults
    // back and leaves again must find its slot's staging page empty.
    let mut discards = DiscardBatch::<BATCH>::new();
    let clean_runs = if keep || cx.uffd.sends_remove_events() {
        move_clean_runs(cx, guards, victims, (!keep).then_some(&mut discards))
    } else {
        drop_clean_runs(cx, guards, victims, &mut discards)
    };
    discards.flush();
    let now = crate::swap::idle_ages::now_epoch();
    for &(i, j, done, r) in &clean_runs {
        refusals.add(publish_clean_run(cx, by, guards, &victims[i..j], done, r, now));
        moved += done;
    }
    let uncharged = if keep { 0 } else { moved };
    cx.stats.add(if keep { by.counter() } else { Counter::SwpoutClean }, moved as u64);
    assert!(moved + refusals.refused + refusals.held <= victims.len());
    CleanTaken { moved, uncharged, refusals }
}

/// A run of clean victims moved out (or not): victims `i..j`, the first `done` of them
/// moved, and what the move said.
type CleanRun = (usize, usize, usize, RangeResult);

/// Moves the clean victims into their own slots' staging pages, a run of consecutive pages
/// with consecutive slots at a time, and queues the staging pages moved into on `discards`
/// (when they are to be dropped). Returns the runs.
fn move_clean_runs(
    cx: &Reclaim<'_>,
    guards: &RegionSet,
    victims: &[Victim],
    mut discards: Option<&mut DiscardBatch<BATCH>>,
) -> ArrayVec<CleanRun, BATCH> {
    let mut clean_runs = ArrayVec::new();
    for (i, j) in clean_runs_of(victims, true) {
        let e = |k: usize| victims[k].pte.entry();
        let region = &guards.g[victims[i].gi];
        let dev = cx.devices.device(e(i));
        let len = (j - i) * PAGE_SIZE;
        let r = cx.swap_cache.move_in(dev, e(i).offset(), region.page_addr(victims[i].page), len);
        let done = r.done_bytes(len) / PAGE_SIZE;
        debug_assert!(done <= j - i, "a move reports no more than it was asked");
        if let Some(discards) = discards.as_deref_mut().filter(|_| done > 0) {
            dev.discard_staged_later(discards, e(i).offset(), done);
        }
        clean_runs.push((i, j, done, r));
    }
    clean_runs
}

/// The runs `i..j` of clean victims: consecutive pages of one region, and with `by_slot`
/// consecutive slots of one device too (what one move into staging pages needs).
fn clean_runs_of(victims: &[Victim], by_slot: bool) -> impl Iterator<Item = (usize, usize)> + '_ {
    let e = |k: usize| victims[k].pte.entry();
    let mut i = 0;
    // Bounded: each call advances `i` past the run it returns.
    std::iter::from_fn(move || {
        while i < victims.len() && !victims[i].pte.clean() {
            i += 1;
        }
        if i == victims.len() {
            return None;
        }
        // A clean page is resident and keeps the slot it was read from (`page_table`).
        debug_assert!(victims[i].pte.state() == PageState::Resident && victims[i].pte.busy());
        let mut j = i + 1;
        while j < victims.len()
            && victims[j].pte.clean()
            && victims[j].gi == victims[i].gi
            && victims[j].page == victims[j - 1].page + 1
            && (!by_slot || (e(j).device() == e(i).device() && e(j).offset() == e(j - 1).offset() + 1))
        {
            j += 1;
        }
        let run = (i, j);
        i = j;
        Some(run)
    })
}

/// Drops the clean victims where they lie, all runs of consecutive pages with one
/// `process_madvise` (one TLB flush for the round, where each move flushed once a run: with
/// several threads of the program running, an IPI to each of their CPUs a run). Only on a
/// regions' descriptor without `REMOVE` events (`crate::events::ProgramDiscard`). Runs the
/// kernel did not drop (an older kernel, a range unmapped meanwhile) are moved out as
/// [`move_clean_runs`] does, their staging pages queued on `discards`. Returns the runs.
fn drop_clean_runs(
    cx: &Reclaim<'_>,
    guards: &RegionSet,
    victims: &[Victim],
    discards: &mut DiscardBatch<BATCH>,
) -> ArrayVec<CleanRun, BATCH> {
    let mut runs: ArrayVec<CleanRun, BATCH> = ArrayVec::new();
    let mut ranges: ArrayVec<(usize, usize), BATCH> = ArrayVec::new();
    for (i, j) in clean_runs_of(victims, false) {
        ranges.push((guards.g[victims[i].gi].page_addr(victims[i].page), (j - i) * PAGE_SIZE));
        runs.push((i, j, j - i, RangeResult::Done));
    }
    let dropped = crate::mapping::drop_in_place(&ranges).unwrap_or(0);
    assert!(dropped <= runs.len(), "the kernel drops no more ranges than it was given");
    if dropped < runs.len() {
        let (stopped_at, after) = (runs[dropped].0, runs[dropped].1);
        runs.truncate(dropped);
        // The range the kernel stopped at may be zapped in part (a hole the program just
        // unmapped: `ENOMEM` after the rest; a range it just locked: `EINVAL`): its pages
        // not mapped any more are out, their slots hold them; the others move out.
        let mut k = stopped_at;
        while k < after {
            let gone = |v: &Victim| !crate::mapping::page_present(guards.g[v.gi].page_addr(v.page));
            let zapped = gone(&victims[k]);
            let mut m = k + 1;
            while m < after && gone(&victims[m]) == zapped {
                m += 1;
            }
            if zapped {
                runs.push((k, m, m - k, RangeResult::Done));
            } else {
                for (i, j, done, r) in move_clean_runs(cx, guards, &victims[k..m], Some(discards)) {
                    runs.push((k + i, k + j, done, r));
                }
            }
            k = m;
        }
        // The rest, which the kernel did not reach, as before.
        for (i, j, done, r) in move_clean_runs(cx, guards, &victims[after..], Some(discards)) {
            runs.push((after + i, after + j, done, r));
        }
    }
    runs
}

/// Publishes a run of clean victims (`run`, all of one region, taken out `by`) once their
/// staging pages are dropped: the first `done`, moved, are swapped (stamped `now`) and
/// uncharged, or, taken by the aging scan, staged clean and aged; the others
/// stay resident and clean, back on the LRU. `r`: what the move said. Returns the refusal,
/// if the move was refused.
fn publish_clean_run(
    cx: &Reclaim<'_>,
    by: Stager,
    guards: &RegionSet,
    run: &[Victim],
    done: usize,
    r: RangeResult,
    now: Epoch,
) -> Refusals {
    let region = &guards.g[run[0].gi];
    let keep = by == Stager::Aging;
    let left = Stamp::new(now, cx.lru.note_evicted(by.nr_evicted(done)));
    for (k, v) in run.iter().enumerate() {
        let (e, dev) = (v.pte.entry(), cx.devices.device(v.pte.entry()));
        if k < done && keep {
            cx.swap_cache.insert(dev, e.offset(), left.eviction);
            let new = v.pte.next(PageState::Cached, Some(e)).with_referenced(false).with_aged().with_clean();
            region.store(v.page, new);
            requeue_staged(cx, guards.page_ref(v.gi, v.page, new));
        } else if k < done {
            dev.stamp(e.offset(), left);
            region.store(v.page, v.pte.next(PageState::Swapped, Some(e)).with_referenced(false));
        } else {
            // Refused (pinned, shared with a fork child, read-only after mprotect, or gone:
            // an event settles it) or not tried: stays resident and clean.
            region.store(v.page, v.pte.unbusy());
            cx.lru.add(guards.page_ref(v.gi, v.page, v.pte), cx.stats);
        }
    }
    let mut refusals = Refusals::default();
    if let (RangeResult::Partial { errno, .. }, Some(&v)) = (r, run.get(done)) {
        // One page refused (the first not moved); the rest of its run was not tried and
        // goes back on the LRU.
        refusals = note_refusal(cx, guards, v, errno);
    }
    if !keep {
        uncharge(cx.charge, done);
    }
    // Each page taken out was counted clean when it was mapped so (`swapin::publish`),
    // before its word said so: the count cannot be below the clean pages this round owns.
    // A page staged clean is not mapped: out of the count until it comes back.
    let clean_before = cx.clean_pages.fetch_sub(done, Ordering::Relaxed);
    debug_assert!(clean_before >= done, "clean page count below the clean pages dropped");
    // A run lies in one region.
    let unused = run[..done].iter().filter(|v| v.pte.readahead()).count() as u64;
    cx.stats.add(Counter::SwapRaUnused, unused);
    region.streams.note_unused(unused);
    refusals
}

/// Allocates a slot for each victim into `entries`: a run of consecutive pages gets
/// consecutive slots where the allocator has them, so that it moves with one ioctl and one
/// TLB flush. Victims left without a slot (every device full) stay resident and are
/// dropped from `victims`; each slot allocated records its page as owner.
fn alloc_slots(cx: &Reclaim<'_>, guards: &RegionSet, victims: &mut ArrayVec<Victim, BATCH>, entries: &mut [SwapEntry]) {
    let n = victims.len();
    let mut got = 0;
    while got < n {
        let run_end = (got + 1..n)
            .find(|&j| victims[j].gi != victims[got].gi || victims[j].page != victims[j - 1].page + 1)
            .unwrap_or(n);
        let want = run_end - got;
        let m = if want > 1 {
            cx.devices.alloc_run(&mut entries[got..run_end])
        } else {
            cx.devices.alloc(&mut entries[got..run_end])
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
            cx.lru.add(guards.page_ref(v.gi, v.page, v.pte), cx.stats);
        }
        cx.stats.add(Counter::SwapAllocFail, (n - got) as u64);
        victims.truncate(got);
    }
    for (v, e) in victims.iter().zip(entries.iter()) {
        let owner = guards.page_ref(v.gi, v.page, v.pte).owner();
        cx.devices.device(*e).set_owner(e.offset(), owner);
    }
}

/// What staging a batch of victims did.
struct Staged {
    /// Pages moved out of their regions (into the swap cache, or found zero).
    moved: usize,
    /// Pages uncharged: found zero.
    uncharged: usize,
    /// Pages the kernel refused to move.
    refusals: Refusals,
}

/// Moves each victim into the staging page of its slot (`entries`), in runs: same region,
/// consecutive pages, consecutive slots on one device. A page found all zero keeps no
/// slot; the others join the swap cache. Slots to free go to `to_free`.
fn stage(
    cx: &Reclaim<'_>,
    by: Stager,
    guards: &RegionSet,
    victims: &[Victim],
    entries: &[SwapEntry],
    to_free: &mut ArrayVec<u64, BATCH>,
) -> Staged {
    assert!(entries.len() >= victims.len(), "a slot for every victim");
    let mut staged = Staged { moved: 0, uncharged: 0, refusals: Refusals::default() };
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
        let dev = cx.devices.device(entries[i]);
        let mut k = i;
        while k < j {
            let len = (j - k) * PAGE_SIZE;
            let r = cx.swap_cache.move_in(dev, entries[k].offset(), region.page_addr(victims[k].page), len);
            let done = r.done_bytes(len) / PAGE_SIZE;
            for m in k..k + done {
                staged.uncharged += stage_moved(cx, by, guards, victims[m], entries[m], to_free);
            }
            staged.moved += done;
            k += done;
            if let RangeResult::Partial { errno, .. } = r {
                staged.refusals.add(move_refused(cx, guards, victims[k], entries[k], errno, to_free));
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
    cx: &Reclaim<'_>,
    by: Stager,
    guards: &RegionSet,
    v: Victim,
    e: SwapEntry,
    to_free: &mut ArrayVec<u64, BATCH>,
) -> usize {
    let region = &guards.g[v.gi];
    let dev = cx.devices.device(e);
    if v.pte.readahead() {
        cx.stats.inc(Counter::SwapRaUnused);
        region.streams.note_unused(1);
    }
    if dev.staged_page_is_zero(e.offset()) {
        // Nothing worth a slot: drop the staged page, remember "zero".
        dev.release_staged(e.offset());
        to_free.push(e.bits());
        region.store(v.page, v.pte.next(PageState::Zero, None).with_referenced(false));
        uncharge(cx.charge, 1);
        cx.stats.inc(Counter::SwpoutZero);
        return 1;
    }
    cx.swap_cache.insert(dev, e.offset(), cx.lru.note_evicted(by.nr_evicted(1)));
    let new = v.pte.next(PageState::Cached, Some(e)).with_referenced(false);
    let new = if by == Stager::Aging {
        new.with_aged()
    } else {
        cx.lru.note_staged(1);
        new
    };
    region.store(v.page, new);
    requeue_staged(cx, guards.page_ref(v.gi, v.page, new));
    0
}

/// The kernel refused to move victim `v` (`errno`): it stays where it is, back on the LRU,
/// and its slot `e` is forgotten. Returns the refusal (none for `ENOENT`).
fn move_refused(
    cx: &Reclaim<'_>,
    guards: &RegionSet,
    v: Victim,
    e: SwapEntry,
    errno: i32,
    to_free: &mut ArrayVec<u64, BATCH>,
) -> Refusals {
    let region = &guards.g[v.gi];
    cx.devices.device(e).forget_slot(e.offset());
    region.store(v.page, v.pte.unbusy());
    cx.lru.add(guards.page_ref(v.gi, v.page, v.pte), cx.stats);
    // Not there (`ENOENT`): until its event settles it the page stays as it is (turning it
    // into a zero page would lose a page that `mremap` moved). Pinned, shared or otherwise
    // refused; or (`EEXIST`) the program kept mapping the slot's staging page by reading
    // it, and the next move into it drops it again (`SwapCache::move_in`).
    to_free.push(e.bits());
    note_refusal(cx, guards, v, errno)
}

/// What `shrink_active` did with its victims.
#[derive(Debug, Default, Clone, Copy)]
pub(super) struct Shrunk {
    /// Pages that left their region (into the swap cache, or dropped clean or zero).
    pub moved: usize,
    /// Of those, pages uncharged at once (clean or zero).
    pub uncharged: usize,
    /// Pages the kernel refused to move for a reason waiting does not cure: shared with
    /// a fork child (copy-on-write; after a fork, also pinned), or protected differently
    /// from the staging area (`mprotect`). Pages found unmapped (`ENOENT`, an event settles
    /// them) are not counted.
    pub refused: usize,
    /// Victims left in place because a system call pins them (`crate::pin`; the pin may be
    /// the charging thread's own, bringing the rest of its call's memory in), or, in a
    /// process that never forked, because the kernel refused them lately (`EBUSY`: pinned
    /// by a system call under way, `pin::note_refused`).
    pub pinned: usize,
    /// The LRU was empty and a scan of the pager's pages found every resident one locked by
    /// the program (`crate::mlock`), none busy: nothing will become a victim by waiting.
    pub all_locked: bool,
}

/// What [`shrink_inactive`] did with the staged pages it took.
#[derive(Debug, Default, Clone, Copy)]
pub(super) struct WrittenBack {
    /// Pages written (or found zero) and uncharged.
    pub uncharged: usize,
    /// Pages that no device took (each declined them, or none had a slot): still staged.
    pub declined: usize,
}

/// Writes back up to `nr` of the oldest staged pages (with [`Take::StagedBy`], only those
/// idle long enough).
///
/// Each page goes first to its own slot. A device may decline a page (a pool at its cap,
/// or an incompressible page it passes on): the page then gets a slot on another device and
/// is written there, in priority order. A page that no device takes, or whose write fails,
/// stays staged in RAM (still charged) and is retried in a later round.
pub(super) fn shrink_inactive(cx: &Reclaim<'_>, nr: usize, take: Take) -> WrittenBack {
    debug_assert!(matches!(take, Take::Staged | Take::StagedBy(_)), "stage two takes staged pages");
    let mut guards = RegionSet::new();
    let mut victims = pop_victims(cx, take, nr, &mut guards, &mut 0);
    let dropped = drop_clean_staged(cx, &guards, &mut victims);
    if victims.is_empty() {
        return WrittenBack { uncharged: dropped, declined: 0 };
    }
    victims.sort_unstable_by_key(|v| v.pte.entry());
    // Where each victim goes: its own slot first.
    let mut targets: ArrayVec<SwapEntry, BATCH> = victims.iter().map(|v| v.pte.entry()).collect();
    let mut pending: ArrayVec<usize, BATCH> = (0..victims.len()).collect();
    let mut excluded = 0u64;
    let (mut uncharged, mut declined) = (0, 0);
    let mut to_free: ArrayVec<u64, BATCH> = ArrayVec::new();
    // Bounded by the number of devices: each round excludes the devices that declined.
    while !pending.is_empty() {
        let mut rejected: ArrayVec<usize, BATCH> = ArrayVec::new();
        uncharged += write_runs(cx, &guards, &victims, &targets, &pending, &mut rejected, &mut to_free);
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
        let got = cx.devices.alloc_excluding_mask(excluded, &mut fresh[..rejected.len()]);
        cx.stats.add(Counter::SwpoutSpilled, got as u64);
        for (k, &i) in rejected.iter().enumerate() {
            if k < got {
                targets[i] = fresh[k];
            } else {
                // No other device has room: the page stays staged.
                let v = &victims[i];
                guards.g[v.gi].store(v.page, v.pte.unbusy());
                requeue_staged(cx, guards.page_ref(v.gi, v.page, v.pte));
                cx.stats.inc(Counter::SwapAllocFail);
                declined += 1;
            }
        }
        pending.clear();
        pending.extend(rejected.iter().copied().take(got));
    }
    cx.devices.free_now(&mut to_free);
    debug_assert!(uncharged + declined <= victims.len(), "each victim is written or declined at most once");
    WrittenBack { uncharged: uncharged + dropped, declined }
}

/// Drops the clean staged pages among `victims` (the aging scan staged them in their own
/// slots, which still hold them) and takes them out of `victims`: swapped without a write,
/// uncharged. Their staging pages are dropped first, with one TLB flush, so that a page that
/// faults back and leaves again finds its slot's staging page empty. Returns how many.
fn drop_clean_staged(cx: &Reclaim<'_>, guards: &RegionSet, victims: &mut ArrayVec<Victim, BATCH>) -> usize {
    let mut discards = DiscardBatch::<BATCH>::new();
    let mut n = 0;
    for v in victims.iter().filter(|v| v.pte.clean()) {
        debug_assert!(v.pte.busy() && v.pte.state() == PageState::Cached, "a staged victim is locked");
        let e = v.pte.entry();
        cx.devices.device(e).discard_staged_later(&mut discards, e.offset(), 1);
        n += 1;
    }
    if n == 0 {
        return 0;
    }
    discards.flush();
    let mut aged = AgedOut::new(cx);
    for v in victims.iter().filter(|v| v.pte.clean()) {
        let (e, dev) = (v.pte.entry(), cx.devices.device(v.pte.entry()));
        aged.note(v.pte, dev.stamp_of(e.offset()));
        // Still stamped with the moment it left its region.
        dev.complete_writeback(e.offset());
        guards.g[v.gi].store(v.page, v.pte.next(PageState::Swapped, Some(e)));
    }
    victims.retain(|v| !v.pte.clean());
    cx.swap_cache.uncount(n);
    uncharge(cx.charge, n);
    cx.stats.add(Counter::SwpoutClean, n as u64);
    aged.publish(cx);
    n
}

/// Of the staged pages a writeback round sends out (written or dropped clean), those the
/// aging scan staged at its last tick or after (`Charge::aged_written_pages`): neither found
/// in use nor shown idle, so the scan's next sample leaves them out.
struct AgedOut {
    cohort: Epoch,
    nr_pages: u64,
}

impl AgedOut {
    fn new(cx: &Reclaim<'_>) -> AgedOut {
        AgedOut { cohort: cx.charge.aged_cohort_epoch.load(Ordering::Relaxed), nr_pages: 0 }
    }

    /// A page `pte` that left its region at `left` goes out.
    fn note(&mut self, pte: Pte, left: Option<Stamp>) {
        self.nr_pages += u64::from(pte.aged() && left.is_some_and(|s| s.epoch >= self.cohort));
    }

    fn publish(self, cx: &Reclaim<'_>) {
        if self.nr_pages > 0 {
            cx.charge.aged_written_pages.fetch_add(self.nr_pages, Ordering::Relaxed);
        }
    }
}

/// The staged victims `run` (indices into `victims` and `targets`) were written to their
/// targets: they are swapped now, uncharged and out of the swap cache. Returns how many.
fn written(
    cx: &Reclaim<'_>,
    guards: &RegionSet,
    victims: &[Victim],
    targets: &[SwapEntry],
    run: &[usize],
    crcs: &[u32],
    to_free: &mut ArrayVec<u64, BATCH>,
) -> usize {
    assert_eq!(run.len(), crcs.len());
    let sdev = cx.devices.device(victims[run[0]].pte.entry());
    let mut aged = AgedOut::new(cx);
    for (&k, &crc) in run.iter().zip(crcs) {
        let v = &victims[k];
        let (old, new) = (v.pte.entry(), targets[k]);
        let left = sdev.stamp_of(old.offset());
        aged.note(v.pte, left);
        let dev = cx.devices.device(new);
        dev.set_checksum(new.offset(), crc);
        if new == old {
            sdev.complete_writeback(old.offset());
        } else {
            // Written elsewhere: the old slot held only the staging page. The page keeps the
            // moment it left its region.
            sdev.forget_slot(old.offset());
            to_free.push(old.bits());
            dev.set_owner(new.offset(), guards.page_ref(v.gi, v.page, v.pte).owner());
            if let Some(s) = left {
                dev.stamp(new.offset(), s);
            }
        }
        guards.g[v.gi].store(v.page, v.pte.next(PageState::Swapped, Some(new)));
    }
    let n = run.len();
    cx.swap_cache.uncount(n);
    uncharge(cx.charge, n);
    cx.stats.add(Counter::Pswpout, n as u64);
    aged.publish(cx);
    n
}

/// The write of the staged victims `run` failed: the pages stay staged in RAM (still
/// charged) and go round again; their new slots, if any, are freed.
fn write_failed(
    cx: &Reclaim<'_>,
    guards: &RegionSet,
    victims: &[Victim],
    targets: &[SwapEntry],
    run: &[usize],
    to_free: &mut ArrayVec<u64, BATCH>,
) {
    for &k in run {
        let v = &victims[k];
        guards.g[v.gi].store(v.page, v.pte.unbusy());
        requeue_staged(cx, guards.page_ref(v.gi, v.page, v.pte));
        if targets[k] != v.pte.entry() {
            to_free.push(targets[k].bits());
        }
    }
    cx.stats.add(Counter::SwpoutError, run.len() as u64);
}

/// Writes the `pending` victims to their `targets`, in runs (consecutive staging pages to
/// consecutive slots of one device), and finishes the written ones. Victims their device
/// declined go to `rejected`; other failures stay staged. Returns the pages uncharged.
fn write_runs(
    cx: &Reclaim<'_>,
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
        let dev = &cx.devices.devices()[tdev];
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
        uncharged += write_to_device(cx, dev, batch, rejected, to_free);
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
    cx: &Reclaim<'_>,
    dev: &SwapDevice,
    b: WriteBatch<'_>,
    rejected: &mut ArrayVec<usize, BATCH>,
    to_free: &mut ArrayVec<u64, BATCH>,
) -> usize {
    debug_assert!(b.pending.iter().all(|&k| b.targets[k].device() == dev.index), "one device per write call");
    let mut crcs = [0u32; BATCH];
    let (runs, mut reqs) = plan_writes(cx, dev, b, &mut crcs);
    assert_eq!(runs.len(), reqs.len(), "a request per run");
    cx.stats.time_device_io(true, || dev.backend.write(&mut reqs));
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
            let sdev = cx.devices.device(first);
            sdev.discard_staged_later(&mut discards, first.offset(), t - s);
        }
    }
    discards.flush();
    let mut uncharged = 0;
    for (req, &(s, t)) in reqs.iter().zip(&runs) {
        let run = &b.pending[s..t];
        match &req.result {
            Ok(()) => uncharged += written(cx, b.guards, b.victims, b.targets, run, &crcs[s..t], to_free),
            Err(BackendError::Rejected { .. }) => rejected.extend(run.iter().copied()),
            Err(_) => write_failed(cx, b.guards, b.victims, b.targets, run, to_free),
        }
    }
    uncharged
}

/// Splits `b`'s victims into runs (indices into `b.pending`) of consecutive staging pages
/// going to consecutive slots, and makes each run's write request; fills `crcs` (by index
/// into `b.pending`) when `dev` keeps checksums.
fn plan_writes<'p>(
    cx: &Reclaim<'p>,
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
        let sdev = cx.devices.device(src(s));
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

/// Re-queues resident pages that have no queue entry (the queue overflowed at some point,
/// or the pages were locked). Only each region's touched part: a heap's 16 GiB reservation
/// is 4 M entries, and with every resident page locked each charge scanned it again.
/// Returns whether every resident page it saw is locked by the program and none but pages
/// of locked ranges is busy (in another thread's reclaim, or a fault that will map a page
/// reclaim could take): then no victim appears by waiting, and a charge over the limit goes
/// over at once (`direct::charge`) rather than nap and scan again for each page (an `mlock`
/// of 64 MiB under a 16 MiB limit brought about 100 pages a second in, the call never
/// ending).
fn refill_active_by_scan(cx: &Reclaim<'_>) -> bool {
    let resident = cx.charge.resident_pages.load(Ordering::Acquire);
    let staged = cx.swap_cache.nr_pages();
    if resident <= staged {
        return false;
    }
    let budget = cx.lru.active_capacity() / 2;
    let (mut pushed, mut locked, mut busy) = (0, 0, 0);
    REGIONS.for_each(|g| {
        if g.pager.id() != cx.id {
            return;
        }
        for page in 0..g.nr_pages.min(g.touched_end()) {
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
            if pte.busy() {
                busy += usize::from(!crate::mlock::is_locked(g.page_addr(page)));
            } else if pte.state() == PageState::Resident && pte.unevictable() {
                locked += 1;
            } else if pte.state() == PageState::Resident {
                let r = PageRef { region_idx: g.index, region_gen: g.gen, page_gen: pte.gen(), page };
                if cx.lru.try_add(r) {
                    pushed += 1;
                }
            }
        }
    });
    let all_locked = pushed == 0 && busy == 0 && locked > 0;
    if all_locked {
        cx.lru.note_all_locked();
    }
    all_locked
}
