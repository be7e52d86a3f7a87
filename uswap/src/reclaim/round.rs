//! A reclaim round (the swap cache topped up from the LRU, then its oldest batch written
//! back), the count of rounds under way that a fork waits out, and reclaim down to a lowered
//! limit.
//!
//! Invariant: a round reclaims at most [`RECLAIM_BATCH_PAGES`] pages per stage.
//!
//! Locking: the queues are lock-free; pages are owned through their busy bits. A round
//! holds at most `MAX_REGIONS_PER_SET` region guards and allocates nothing, so direct
//! reclaim may run inside a SIGBUS handler.

use std::sync::atomic::Ordering;

use super::swapout::{shrink_active, shrink_inactive, Stager};
use super::victims::Take;
use super::Reclaim;
use crate::error::{Error, Result};
use crate::state::charge::Charge;
use crate::state::RECLAIM_BATCH_PAGES;
use crate::uffd::PAGE_SIZE;

const BATCH: usize = RECLAIM_BATCH_PAGES;
/// Direct-reclaim rounds that free nothing before a charge (or `reclaim_to_limit`) stops
/// yielding and starts sleeping between rounds.
pub(super) const MAX_FRUITLESS_ROUNDS: usize = 16;

/// Pages the reclaimer keeps staged in the swap cache.
fn swapcache_target(limit_pages: usize) -> usize {
    (2 * BATCH).max(limit_pages / 32)
}

/// The swap cache's target for `cx`: under a tree's lower limit (or an automatic budget's
/// goal), sized by that. Sized by the process's own limit (64 GiB under `uswap run
/// --auto`), rounds kept topping it up with pages in use rather than write the idle ones it
/// held.
fn cache_target(cx: &Reclaim<'_>) -> usize {
    let own = cx.charge.limit_pages.load(Ordering::Acquire);
    swapcache_target(cx.charge.shared.map_or(own, |t| t.reclaim_goal_pages().min(own)))
}

/// Staged pages a faulting thread may leave over the swap cache's target for the
/// background thread to write (`BackgroundReclaim::StageTwo`) before it writes some
/// itself: 256 pages, 1 MiB, a few hundred microseconds of zstd.
const STAGE_TWO_BACKLOG_PAGES: usize = 8 * BATCH;

/// Stage one of a swap-out for a faulting thread `excess_pages` over its high watermark,
/// under `BackgroundReclaim::StageTwo`: stages a batch, unless the pages already staged
/// over the cache's target will bring the charge under the watermark once written. Returns
/// false when the background thread is behind (the backlog is full, or nothing could be
/// staged): the caller then reclaims a whole round itself.
pub(crate) fn stage_for_background(cx: &Reclaim<'_>, excess_pages: usize) -> bool {
    let target = cache_target(cx);
    let cached = cx.swap_cache.nr_pages();
    if cached.saturating_sub(target) >= excess_pages {
        return true;
    }
    if cached >= target + STAGE_TWO_BACKLOG_PAGES || cx.devices.is_full() {
        return false;
    }
    let Some(_in_flight) = InFlight::enter(cx) else {
        return true;
    };
    let s = shrink_active(cx, BATCH, Stager::Direct);
    // Zero and clean pages are uncharged at once; only the others wait for a write.
    debug_assert!(s.uncharged <= s.moved && s.moved <= BATCH, "a batch's moves are bounded");
    s.moved > 0
}

/// The background thread's half of `BackgroundReclaim::StageTwo`: writes the staged
/// pages over the swap cache's target, a batch at a time, up to `MAX_BACKLOG_ROUNDS`
/// batches. Returns whether it wrote any.
pub(crate) fn write_backlog(cx: &Reclaim<'_>) -> bool {
    const MAX_BACKLOG_ROUNDS: usize = 4 * STAGE_TWO_BACKLOG_PAGES / BATCH;
    let mut worked = false;
    // Bounded by the rounds, and by the first round that writes nothing (every staged page
    // busy, or no device takes them: the faults then write for themselves).
    for _ in 0..MAX_BACKLOG_ROUNDS {
        if cx.swap_cache.nr_pages() <= cache_target(cx) || cx.shutdown.is_set() {
            break;
        }
        let Some(_in_flight) = InFlight::enter(cx) else { break };
        let written = shrink_inactive(cx, BATCH, Take::Staged).uncharged;
        if written == 0 {
            break;
        }
        cx.stats.add(crate::stats::Counter::PswpoutBackground, written as u64);
        worked = true;
    }
    worked
}

/// What a reclaim round achieved.
#[derive(Debug, Default, Clone, Copy)]
pub(crate) struct Progress {
    /// Pages moved from regions into the swap cache.
    pub moved: usize,
    /// Pages uncharged: written back, or found zero.
    pub uncharged: usize,
    /// Victims the kernel refused to move (see `swapout::Shrunk::refused`).
    pub refused: usize,
    /// Victims left in place because a system call pins them (put back at the LRU's tail).
    pub pinned: usize,
    /// Every resident page is locked by the program (see `swapout::Shrunk::all_locked`).
    pub all_locked: bool,
    /// Staged pages this round offered that no device took (see `swapout::WrittenBack`).
    pub declined: usize,
}

impl Progress {
    pub fn any(self) -> bool {
        self.moved + self.uncharged > 0
    }

    fn add_written(&mut self, w: super::swapout::WrittenBack) {
        self.uncharged += w.uncharged;
        self.declined += w.declined;
    }
}

/// One round: top the swap cache up towards its target with the oldest resident pages,
/// then, once it is at the target (or nothing more can be moved), write back its oldest
/// batch. A direct round that finds every staged page busy stages and writes a batch of its
/// own over the target (see below).
pub(crate) fn reclaim_round(cx: &Reclaim<'_>, direct: bool) -> Progress {
    let Some(_in_flight) = InFlight::enter(cx) else {
        return Progress::default();
    };
    let target = cache_target(cx);
    let steal = if direct { Stager::Direct } else { Stager::Background };
    let mut progress = Progress::default();
    let topped_up = cx.swap_cache.nr_pages() < target && !cx.devices.is_full();
    if topped_up {
        let s = shrink_active(cx, BATCH, steal);
        progress.moved = s.moved;
        progress.uncharged = s.uncharged;
        progress.refused = s.refused;
        progress.pinned = s.pinned;
        progress.all_locked = s.all_locked;
    }
    if cx.swap_cache.nr_pages() >= target || progress.moved == 0 {
        progress.add_written(shrink_inactive(cx, BATCH, Take::Staged));
    }
    if direct && !topped_up && !progress.any() && !cx.devices.is_full() {
        // The cache is at its target and every staged page is busy in other threads' writes
        // (many more faulting threads than CPUs, a slow device): stage a batch of our own
        // over the target and write it
        // back, rather than wait for theirs, as the kernel's direct reclaim starts writeback
        // of more pages while earlier ones are still under it. The swap cache then exceeds
        // its target by at most one batch per thread reclaiming at that moment; later
        // rounds stop topping it up until it is back under.
        let s = shrink_active(cx, BATCH, steal);
        progress.moved += s.moved;
        progress.uncharged += s.uncharged;
        progress.refused += s.refused;
        progress.pinned += s.pinned;
        progress.all_locked |= s.all_locked;
        if s.moved > s.uncharged {
            progress.add_written(shrink_inactive(cx, BATCH, Take::Staged));
        }
    }
    progress
}

/// A reclaim round or a device writeback under way, counted in `reclaim_in_flight` while
/// it lives. None starts while reclaim is held (`Pager::prepare_fork`), which waits for the
/// ones under way to end ([`InFlight::wait_none`]).
pub(crate) struct InFlight<'a>(&'a Charge);

impl<'a> InFlight<'a> {
    pub fn enter(cx: &Reclaim<'a>) -> Option<InFlight<'a>> {
        // Counted before the hold is read, and the hold set before the count is read (both
        // SeqCst): a round either sees the hold, or is seen by the waiter.
        cx.charge.reclaim_in_flight.fetch_add(1, Ordering::SeqCst);
        if cx.charge.reclaim_held.load(Ordering::SeqCst) || super::stopped_for_core_dump() {
            cx.charge.reclaim_in_flight.fetch_sub(1, Ordering::SeqCst);
            return None;
        }
        Some(InFlight(cx.charge))
    }

    /// With reclaim held: waits until no round or writeback is under way. Bounded: rounds
    /// and writebacks are short and none starts while the hold is set.
    pub fn wait_none(cx: &Reclaim<'_>) {
        debug_assert!(cx.charge.reclaim_held.load(Ordering::SeqCst) || super::stopped_for_core_dump());
        while cx.charge.reclaim_in_flight.load(Ordering::SeqCst) != 0 {
            std::thread::yield_now();
        }
    }
}

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        self.0.reclaim_in_flight.fetch_sub(1, Ordering::SeqCst);
    }
}

/// Reclaims until the charge is at or below the limit (after the limit was lowered).
pub(crate) fn reclaim_to_limit(cx: &Reclaim<'_>) -> Result<()> {
    reclaim_to(cx, usize::MAX)
}

/// Reclaims until the charge is at or below `goal_pages` or the limit, whichever is lower.
pub(crate) fn reclaim_to(cx: &Reclaim<'_>, goal_pages: usize) -> Result<()> {
    let (mut fruitless, mut declining) = (0, 0);
    let mut backoff_us = 50u64;
    let mut busy_since_ns: Option<u64> = None;
    // Bounded by the number of charged pages (each fruitful round uncharges at least one)
    // and, while rounds find nothing, by `LIMIT_BUSY_WAIT`.
    let goal = || goal_pages.min(cx.charge.limit_pages.load(Ordering::Acquire));
    while cx.charge.resident_pages.load(Ordering::Acquire) > goal() {
        let progress = reclaim_round(cx, true);
        if progress.any() {
            (fruitless, declining) = (0, 0);
            backoff_us = 50;
            busy_since_ns = None;
            continue;
        }
        fruitless += 1;
        // Rounds whose pages every device declined (a pool that rejects what does not
        // compress, or too small to store one) wait for nothing: those devices are full
        // for these pages. Before, `set_resident_limit` waited 2 s and said "busy".
        declining += usize::from(progress.declined > 0);
        if fruitless <= MAX_FRUITLESS_ROUNDS {
            std::thread::yield_now();
            continue;
        }
        let resident_bytes = (cx.charge.resident_pages.load(Ordering::Acquire) * PAGE_SIZE) as u64;
        let limit_bytes = (cx.charge.limit_pages.load(Ordering::Acquire) * PAGE_SIZE) as u64;
        if cx.devices.is_full() || cx.devices.take_no_pages() || declining == fruitless {
            return Err(Error::LimitNotReached { resident_bytes, limit_bytes });
        }
        // Rounds that find nothing while the devices have room: the victims are busy in
        // faults or device writes of other threads. That is no reason to give up yet.
        let waited = crate::clock::elapsed_since(*busy_since_ns.get_or_insert_with(crate::clock::now_ns));
        if waited > LIMIT_BUSY_WAIT {
            let waited_ms = waited.as_millis() as u64;
            return Err(Error::LimitBusy { resident_bytes, limit_bytes, waited_ms });
        }
        std::thread::sleep(std::time::Duration::from_micros(backoff_us));
        backoff_us = (backoff_us * 2).min(2_000);
    }
    cx.devices.flush_frees();
    Ok(())
}

/// How long `set_resident_limit` keeps trying while every victim it finds is busy and the
/// devices have room, before it reports [`Error::LimitBusy`].
const LIMIT_BUSY_WAIT: std::time::Duration = std::time::Duration::from_secs(2);

#[cfg(test)]
mod tests {
    use super::*;
    use crate::reclaim::accounting::watermarks;

    #[test]
    fn watermarks_are_ordered_and_a_batch_apart_at_least() {
        for limit in [256usize, 1000, 65536, 1 << 20] {
            let (high, low) = watermarks(limit);
            assert!(low < high && high < limit, "limit {limit}: {low} {high}");
            assert!(limit - high >= BATCH);
            assert!(swapcache_target(limit) >= 2 * BATCH);
        }
    }
}
