//! Accounting of the resident charge and its watermarks: the counting, own and shared. What
//! a charge does when it reaches the limit (reclaim directly, or wait for room) is
//! `super::direct`'s ([`super::direct::charge`], which every fault calls through
//! [`super::Reclaim::charge`]). These functions take the part they count, the charge.
//!
//! Accounting. `resident_pages` counts application pages in RAM: mapped in a region or
//! staged in the swap cache. A fault charges a page *before* mapping it, with a
//! compare-and-swap that never takes the count above the limit; at the limit it reclaims
//! directly first. Moving a page into the swap cache does not change the count; writing it
//! back and dropping its staging page uncharges it. So the pages in RAM never exceed the
//! limit, except when nothing at all can be reclaimed (every device full): then the charge
//! goes through, is counted in `limit_overrun`, and no data is lost. The bound the tests
//! check, with `mincore(2)` rather than the counters, is `limit + RECLAIM_BATCH_PAGES`,
//! which leaves room for a change of implementation; this one stays at the limit. A pager
//! under a shared charge (`crate::shared_charge`) charges that too, and must fit under both.
//!
//! Watermarks. With `gap = max(32 pages, limit / 64)`, `high = limit - gap` and
//! `low = limit - 2 * gap` (see `super::direct` and `super::background` for who acts at each).
//!
//! Locking: none; the charges are atomics, and nothing here sleeps or allocates.
//! Invariant: every uncharge matches an earlier charge (an underflow is a bug, and panics).

use std::sync::atomic::Ordering;

use crate::state::charge::Charge;
use crate::state::RECLAIM_BATCH_PAGES as BATCH;

/// `(high, low)` watermarks for a limit, in pages.
pub(crate) fn watermarks(limit_pages: usize) -> (usize, usize) {
    let gap = BATCH.max(limit_pages / 64);
    (limit_pages.saturating_sub(gap), limit_pages.saturating_sub(2 * gap))
}

/// Charges `n` pages whatever the limit (the callers count why).
pub(super) fn force_charge(charge: &Charge, n: usize) {
    let now = charge.resident_pages.fetch_add(n, Ordering::AcqRel) + n;
    shared_add(charge, n);
    note_peak(charge, now);
}

/// Whether `n` more pages fit under the shared charge, if the pager has one. Read without a
/// lock: pagers that charge at the same moment may each see the same room, so the shared
/// charge can pass its limit by at most one charge (`n` pages, a readahead window at most)
/// per thread charging at once, and reclaim brings it back.
pub(super) fn shared_room(charge: &Charge, n: usize) -> bool {
    match charge.shared {
        None => true,
        Some(t) => t.resident_pages.load(Ordering::Acquire) + n <= t.limit_pages.load(Ordering::Acquire),
    }
}

pub(super) fn shared_add(charge: &Charge, n: usize) {
    if let Some(t) = charge.shared {
        let now = t.resident_pages.fetch_add(n, Ordering::AcqRel) + n;
        if now > t.resident_peak_pages.load(Ordering::Relaxed) {
            t.resident_peak_pages.fetch_max(now, Ordering::Relaxed);
        }
    }
}

/// Takes `n` pages off the shared charge, if the pager has one (its own is the caller's).
pub(crate) fn shared_sub(charge: &Charge, n: usize) {
    if let Some(t) = charge.shared {
        t.resident_pages.fetch_sub(n, Ordering::AcqRel);
    }
}

/// Whether the shared charge, if any, is above the high (`low == false`) or low watermark of
/// its limit, or of the goal an automatic budget set below it (who reclaims for it:
/// [`shared_reclaim_is_ours`]).
pub(super) fn shared_above(charge: &Charge, low: bool) -> bool {
    match charge.shared {
        None => false,
        Some(t) => {
            let (high, lowmark) = watermarks(t.reclaim_goal_pages());
            t.resident_pages.load(Ordering::Acquire) > if low { lowmark } else { high }
        }
    }
}

/// Whether the shared charge, if any, is above its limit (or the goal below it), and that
/// was lowered below the one the processes were given (`uswap run --auto` moves the tree's): a tree whose
/// pages are all in use never faults its way down to it, so its pagers reclaim for it in the
/// background even while their programs fault. Not for a tree merely over its own limit (a
/// fork's shared pages, which reclaim cannot move: reclaiming harder there only breaks
/// more of them copy-on-write, and raised a fork test's peak past its bound).
pub(super) fn shared_over_limit(charge: &Charge) -> bool {
    charge.shared.is_some_and(|t| {
        let goal = t.reclaim_goal_pages();
        goal < charge.limit_pages.load(Ordering::Acquire) && t.resident_pages.load(Ordering::Acquire) > goal
    })
}

/// Whether the shared charge, if any, is above a goal its automatic budget set below its
/// limit (`uswap run --auto`), which its pagers' background reclaimers are bringing it down
/// to; the budget sets the limit to it, and clears it, within a second.
pub(super) fn shared_goal_pending(charge: &Charge) -> bool {
    charge.shared.is_some_and(|t| {
        let goal = t.goal_pages.load(Ordering::Acquire);
        goal != 0 && t.resident_pages.load(Ordering::Acquire) > goal
    })
}

/// Whether this pager should reclaim its own pages because the shared charge is above its
/// high watermark (`low == false`) or its low one. A memcg reclaims the coldest pages of all
/// its tasks; uswap can reclaim a process's pages only in that process, so it asks those
/// that hold at least an average share of the tree's charge (the largest always does), or
/// every pager when the charge does not count its processes (one made by hand). A small
/// process of the tree (a load generator, a shell, `tr` in a pipeline) evicting its own few
/// pages, which it uses all the time, for a large one's pressure would only fault them back
/// (redis.sh: redis-benchmark, 350 pages resident, swapped 20,000 times in 10 s).
/// `idle_long`: the application has not faulted for [`super::background::IDLE_COLD`]; its
/// pages are taken as the tree's coldest, whatever their number. The shared limit itself
/// still holds for everyone (`direct::charge`).
pub(super) fn shared_reclaim_is_ours(charge: &Charge, low: bool, idle_long: bool) -> bool {
    let Some(t) = charge.shared else { return false };
    if !shared_above(charge, low) {
        return false;
    }
    let nr_processes = t.nr_processes.load(Ordering::Acquire);
    let own = charge.resident_pages.load(Ordering::Acquire);
    idle_long || nr_processes == 0 || own.saturating_mul(nr_processes) >= t.resident_pages.load(Ordering::Acquire)
}

/// Records a new high of the charge (`Stats::resident_peak_pages`). The load first keeps the
/// common case (no new peak) a read of a shared line, not a write.
pub(super) fn note_peak(charge: &Charge, resident: usize) {
    if resident > charge.resident_peak_pages.load(Ordering::Relaxed) {
        charge.resident_peak_pages.fetch_max(resident, Ordering::Relaxed);
    }
}

pub(crate) fn uncharge(charge: &Charge, n: usize) {
    shared_sub(charge, n);
    let old = charge.resident_pages.fetch_sub(n, Ordering::AcqRel);
    assert!(old >= n, "uswap invariant: resident charge underflow ({old} - {n}): an uncharge without its charge");
}
