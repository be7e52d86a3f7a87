//! The background reclaimer: one thread per pager that reclaims while the application does
//! not, and moves pages down the device tiers.
//!
//! Locking: it takes no lock of its own; it reclaims in the same rounds as a faulting thread
//! (`super::reclaim_round`), and stops at once while `Pager::prepare_fork` holds reclaim.
//! Invariant: every loop it runs is bounded (by the charge, by the pages that can move, or
//! by a count of fruitless rounds), so shutdown is seen within a period.

use std::sync::atomic::Ordering;

use super::accounting::{shared_over_limit, shared_reclaim_is_ours, watermarks};
use super::cow;
use super::round::{reclaim_round, MAX_FRUITLESS_ROUNDS};
use super::writeback::device_writeback;
use super::Reclaim;
use crate::backend::AlignedPage;
use crate::options::{BackgroundReclaim, FaultMode};
use crate::state::RECLAIM_BATCH_PAGES as BATCH;
use crate::stats::Counter;
use crate::uffd::PAGE_SIZE;

/// How often the background reclaimer looks at the pager while it finds work (pages to
/// reclaim, write back or make exclusive).
pub(crate) const BACKGROUND_PERIOD: std::time::Duration = std::time::Duration::from_millis(5);

/// How often it looks when it finds none: each idle tick doubles the period up to this.
/// A timer wake-up is not free on a busy machine: every 5 ms, it cost sqlite3 driven through
/// a pipe by a Python script (both under uswap, 2 vCPUs) 15 % of its query rate (a sleeping
/// vCPU woken, the pipe's partners moved between CPUs: 101 migrations against 6 in 10 s);
/// every 100 ms, too little to tell from the runs' noise. Work that cannot wait a period wakes the thread
/// (a queued copy-on-write break, the end of a fork's hold, a fault crossing the watermark
/// with `Always`); an idle application above the high watermark is found within a period.
pub(crate) const IDLE_PERIOD: std::time::Duration = std::time::Duration::from_millis(100);

/// The background reclaimer's sleep: [`BACKGROUND_PERIOD`] after a tick that did work,
/// doubled after each one that did none, up to [`IDLE_PERIOD`].
struct Period(std::time::Duration);

impl Period {
    fn after(&mut self, worked: bool) -> std::time::Duration {
        self.0 = if worked { BACKGROUND_PERIOD } else { (self.0 * 2).min(IDLE_PERIOD) };
        debug_assert!(self.0 >= BACKGROUND_PERIOD && self.0 <= IDLE_PERIOD);
        self.0
    }
}

/// How often the slots held for fork children are looked at (`swap::fork_refs`), and the
/// shortest wait between a fork child's looks for inherited pages it has come to map alone
/// (`reclaim::cow::adopt_exclusive`; the longest is [`ADOPT_PERIOD_MAX`]).
const FORK_PERIOD: std::time::Duration = std::time::Duration::from_millis(100);

/// The longest a fork child waits between looks for inherited pages it has come to map
/// alone: each look that finds none doubles the wait from [`FORK_PERIOD`], one that finds
/// some brings it back. A look reads the state of every inherited page and `pagemap` for
/// those still shared: every 100 ms, four Python children of a parent holding 120 MiB, idle
/// in `sleep`, spent a fifth of a CPU each on it.
const ADOPT_PERIOD_MAX: std::time::Duration = std::time::Duration::from_millis(1600);

/// The wait before the next look (see [`ADOPT_PERIOD_MAX`]) after one that adopted `adopted`
/// pages.
fn next_adopt_period(period: std::time::Duration, adopted: usize) -> std::time::Duration {
    match adopted {
        0 => (period * 2).min(ADOPT_PERIOD_MAX),
        _ => FORK_PERIOD,
    }
}

/// How long an application must go without a fault before its pages count as the tree's
/// coldest, so that its pager reclaims them for the shared charge whatever its share (see
/// `super::accounting::shared_reclaim_is_ours`). Long: a process whose working set is all in
/// takes no fault either, and would evict it each time.
pub(super) const IDLE_COLD: std::time::Duration = std::time::Duration::from_secs(5);

/// Moves the limit as the automatic budget's law says, once a tick and when the aging scan
/// reports idle pages (`budget::Budget`).
/// A lower limit is reclaimed down to first, here, off the application's threads, and set
/// after: faults meanwhile see the old one and do not reclaim for the probe, whose cost is
/// then what it measures (the pages it took that are in use).
fn move_budget(cx: &Reclaim<'_>, b: &mut crate::budget::Budget, now_us: u64) {
    // A limit set on the pager since the last tick is the ceiling (`Pager::set_resident_limit`),
    // and one that a tick under way stored over it comes down to it here.
    let ceiling = cx.charge.auto_ceiling_pages.load(Ordering::Acquire);
    b.set_ceiling(ceiling);
    cx.charge.limit_pages.fetch_min(ceiling, Ordering::AcqRel);
    let limit = cx.charge.limit_pages.load(Ordering::Acquire);
    let resident = cx.charge.resident_pages.load(Ordering::Acquire);
    let idle = cx.charge.idle_sample.total();
    let Some(next) = b.tick(cx.charge.stall.total_us(now_us), now_us, limit, resident, idle) else { return };
    if next < resident && !cx.charge.reclaim_held.load(Ordering::Acquire) {
        // Best effort: pages that cannot go now go with later rounds.
        let _ = super::round::reclaim_to(cx, next);
    }
    // A limit set while this tick ran (and reclaimed) bounds what it stores.
    cx.charge.limit_pages.store(next.min(cx.charge.auto_ceiling_pages.load(Ordering::Acquire)), Ordering::Release);
}

/// The background reclaimer. With [`BackgroundReclaim::WhenIdle`]: every period (see
/// [`Period`]), if the charge is above the high watermark and the application took no fault
/// during the last period, reclaims towards the low watermark, stopping as soon as
/// faults resume. While the application faults, reclaim runs in its own context (see
/// `task_reclaim`), so the two never contend for the page tables, and the fault path never
/// pays for waking this thread. With [`BackgroundReclaim::Always`]: woken by the fault that
/// crosses the high watermark, reclaims down to the low one. With
/// [`BackgroundReclaim::StageTwo`]: as `WhenIdle`, and woken by the faults that staged
/// pages, writes them (`round::write_backlog`).
pub(crate) fn background_reclaimer(cx: &Reclaim<'_>) {
    let mut r = Reclaimer::new(cx);
    let mut period = Period(BACKGROUND_PERIOD);
    let mut worked = true;
    while !cx.shutdown.is_set() {
        cx.reclaimer.sleep(period.after(worked));
        worked = r.queued_work(cx);
        let (idle, idle_long) = r.note_faults(cx);
        worked |= r.upkeep(cx);
        if !idle || cx.charge.reclaim_held.load(Ordering::Acquire) {
            continue;
        }
        let (high, low) = watermarks(cx.charge.limit_pages.load(Ordering::Acquire));
        debug_assert!(low <= high, "the low watermark is below the high one");
        if cx.charge.resident_pages.load(Ordering::Acquire) <= high
            && !shared_reclaim_is_ours(cx.charge, false, idle_long)
        {
            continue;
        }
        worked |= r.reclaim_down_to(cx, low, idle_long);
        cx.devices.flush_frees();
    }
}

/// The background reclaimer's state between ticks.
struct Reclaimer {
    /// Faults counted at the last tick, and when the count last changed.
    last_faults: u64,
    last_fault_seen_ns: u64,
    /// Pages read back for tier writeback and the aging scan's tier moves.
    writeback_buf: Vec<AlignedPage>,
    /// When the slots held for fork children were last looked at (see [`FORK_PERIOD`]).
    last_fork_pass_ns: u64,
    /// When a fork child last looked for inherited pages it maps alone, and how long it
    /// waits between looks (see [`ADOPT_PERIOD_MAX`]).
    last_adopt_ns: u64,
    adopt_period: std::time::Duration,
    /// The automatic budget, if the limit is automatic.
    budget: Option<crate::budget::Budget>,
    /// The aging scan, if idle aging is on.
    aging: Option<super::aging::Aging>,
}

impl Reclaimer {
    fn new(cx: &Reclaim<'_>) -> Reclaimer {
        Reclaimer {
            last_faults: cx.stats.sum(Counter::Pgfault),
            last_fault_seen_ns: crate::clock::now_ns(),
            writeback_buf: vec![AlignedPage([0; PAGE_SIZE]); BATCH],
            last_fork_pass_ns: crate::clock::now_ns(),
            last_adopt_ns: crate::clock::now_ns(),
            adopt_period: FORK_PERIOD,
            budget: cx.charge.auto.clone(),
            aging: super::aging::Aging::new(cx),
        }
    }

    /// Work that waits for this thread whatever the application does: queued copy-on-write
    /// breaks, the tree's charge, tier writeback and pools growing. Returns whether it
    /// found any.
    fn queued_work(&mut self, cx: &Reclaim<'_>) -> bool {
        // Whatever the application does: a populate that faults in turn must not run on a
        // thread that serves faults (see `cow`).
        let mut worked = cow::break_queued(cx) > 0;
        // The pages the faults staged for this thread to write (`StageTwo`).
        if cx.background_reclaim == BackgroundReclaim::StageTwo {
            worked |= super::round::write_backlog(cx);
        }
        // A tree above its high watermark that counts on this pager's pages: other processes'
        // charges go over while they wait for it (a fork child with nothing of its own to
        // reclaim), so it looks again soon, to start the moment its application goes idle.
        worked |= shared_reclaim_is_ours(cx.charge, false, false);
        // Tiers first: a full pool would otherwise send every new page past itself. Bounded:
        // stops when no device wants room or nothing can move.
        while !cx.shutdown.is_set() && device_writeback(cx, &mut self.writeback_buf) > 0 {
            worked = true;
        }
        for d in cx.devices.devices() {
            // A pool growing under the program's faults: keep ahead of it.
            worked |= d.backend.prepare();
        }
        worked
    }

    /// Counts the application's faults since the last tick. Returns whether this tick may
    /// reclaim (idle), and whether its pages count as the tree's coldest (idle long).
    fn note_faults(&mut self, cx: &Reclaim<'_>) -> (bool, bool) {
        let faults = cx.stats.sum(Counter::Pgfault);
        // With `WhenIdle`, a faulting pager reclaims for the shared charge in its own faults
        // (`task_reclaim` looks at both charges), so pressure on the shared charge wakes this
        // thread only while its application is idle, like its own: reclaiming here while the
        // application faults would IPI its CPU on every move (pmbench under `uswap run`:
        // 7.8 % of its CPU in `smp_call_function_many_cond`).
        // A tree over its lowered limit (`--auto`) is reclaimed for here too: its programs
        // may never charge their way down to it (see `shared_over_limit`).
        let idle = faults == self.last_faults
            || cx.background_reclaim == BackgroundReclaim::Always
            || shared_over_limit(cx.charge);
        if faults != self.last_faults {
            self.last_fault_seen_ns = crate::clock::now_ns();
        }
        let idle_long = crate::clock::elapsed_since(self.last_fault_seen_ns) >= IDLE_COLD;
        self.last_faults = faults;
        (idle, idle_long)
    }

    /// The periodic upkeep of every tick: fork children's slots, discards, pressure
    /// figures and the automatic budget, idle ages and the aging scan, probes of degraded
    /// devices.
    /// Returns whether the aging scan tested pages and has more of its tick's slice to test.
    fn upkeep(&mut self, cx: &Reclaim<'_>) -> bool {
        // Slots held for fork children that have read them, or are gone, come free
        // (a few `poll`s and a scan of the held slots while children live, nothing
        // otherwise); in a fork child, the inherited pages its parent let go of are charged
        // to it (a `pagemap` scan).
        if crate::clock::elapsed_since(self.last_fork_pass_ns) >= FORK_PERIOD {
            self.last_fork_pass_ns = crate::clock::now_ns();
            cx.devices.release_fork_held();
        }
        if crate::clock::elapsed_since(self.last_adopt_ns) >= self.adopt_period {
            self.last_adopt_ns = crate::clock::now_ns();
            // A look that could not be made (not a fork child, or not one yet) waits no longer.
            if let Some(adopted) = cow::adopt_exclusive(cx) {
                self.adopt_period = next_adopt_period(self.adopt_period, adopted);
            }
        }
        cx.devices.run_discards();
        // Pools compact and give back the chunks they emptied (beyond a reserve), as
        // zsmalloc frees an empty zspage: the process's memory follows the pool's, not its
        // peak. Counted in flight, so that a fork being prepared waits for it and none
        // starts meanwhile: the child's copy of a pool is not taken with a class lock held
        // or a chunk half evacuated.
        if let Some(_in_flight) = super::round::InFlight::enter(cx) {
            for d in cx.devices.devices() {
                d.backend.trim();
            }
        }
        // PSI's averages, every 2 s; the automatic budget, every second.
        let now_us = crate::pressure::now_us();
        cx.charge.stall_avgs.sample(&cx.charge.stall, now_us);
        if let Some(b) = self.budget.as_mut() {
            move_budget(cx, b, now_us);
        }
        let now_epoch = crate::swap::idle_ages::now_epoch();
        for d in cx.devices.devices() {
            d.fold_idle_ages(now_epoch);
        }
        let scan_left = self.aging.as_mut().is_some_and(|a| a.tick(cx, now_us, &mut self.writeback_buf));
        // A device whose writes failed takes pages again once a probe succeeds.
        cx.devices.probe_degraded();
        // Signal mode: the program's signal masks (see `crate::uffd::signal_guard`).
        if cx.mode == FaultMode::Signal {
            crate::uffd::signal_guard::tick();
        }
        scan_left
    }

    /// Reclaims down to the `low` watermark (or while the tree's charge counts on this
    /// pager), until the application faults again or nothing is reclaimable. Returns
    /// whether a round did anything.
    fn reclaim_down_to(&self, cx: &Reclaim<'_>, low: usize, mut idle_long: bool) -> bool {
        let mut worked = false;
        let mut fruitless = 0;
        // Bounded by the charge: each fruitful round uncharges pages; stops when the
        // application faults again (it then reclaims for itself) or nothing is reclaimable.
        while (cx.charge.resident_pages.load(Ordering::Acquire) > low
            || shared_reclaim_is_ours(cx.charge, true, idle_long))
            && !cx.shutdown.is_set()
            && !cx.charge.reclaim_held.load(Ordering::Acquire)
        {
            let progress = reclaim_round(cx, false);
            worked |= progress.any();
            if cx.devices.take_no_pages() {
                // No device takes pages (see `swap::health`): a round a period drops what
                // is clean, and the rest waits for a probe to succeed.
                break;
            }
            if !progress.any() {
                fruitless += 1;
                if fruitless > MAX_FRUITLESS_ROUNDS {
                    break;
                }
                std::thread::yield_now();
            } else {
                fruitless = 0;
            }
            if cx.stats.sum(Counter::Pgfault) != self.last_faults {
                let when_idle =
                    matches!(cx.background_reclaim, BackgroundReclaim::WhenIdle | BackgroundReclaim::StageTwo);
                if when_idle && !shared_over_limit(cx.charge) {
                    break;
                }
                // `Always` goes on for its own limit, but its application faults again: its
                // pages are no longer the tree's coldest (it kept evicting them for the
                // tree's charge, a whole working set, after a pause of 5 s).
                idle_long = false;
            }
        }
        worked
    }
}
