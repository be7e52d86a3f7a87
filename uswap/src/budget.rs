//! The automatic budget (`uswap run --auto`, `PagerBuilder::auto_budget`): the control law
//! that moves a pager's (or a tree's) limit once a tick so that its threads stall on memory
//! about a target share of the wall time ([`Budget`], Senpai's law on uswap's own stall
//! figure, [`crate::pressure`]), and what the idle aging scan tells it ([`IdleSample`]).
//!
//! Locking: a [`Budget`] belongs to the one thread that runs the law (the background
//! reclaimer, or `uswap run`'s budget thread), which passes it the stall total, the limit
//! and the resident pages; an [`IdleSample`] is one atomic counter, in a pager or in a
//! tree's shared segment. Invariant: every limit the law returns lies within
//! `[floor_pages, ceiling_pages]`. The measurements behind its constants are in
//! docs/auto-budget.md.

use std::sync::atomic::{AtomicU64, Ordering};

/// What the idle aging scan found, for the automatic budget: the pages it took out of their
/// regions that were still out a tick later, since the pager (or the tree) started. Added
/// to at each tick of each aging scan; read by the law whenever it looks. A plain atomic, so
/// that a tree's lives in its shared segment.
#[repr(C)]
#[derive(Debug, Default)]
pub struct IdleSample {
    untouched_pages: AtomicU64,
}

impl IdleSample {
    pub const fn new() -> IdleSample {
        IdleSample { untouched_pages: AtomicU64::new(0) }
    }

    /// `untouched` pages taken out a tick ago are still out.
    pub fn add(&self, untouched: u64) {
        self.untouched_pages.fetch_add(untouched, Ordering::Relaxed);
    }

    /// Pages found untouched so far.
    pub fn total(&self) -> u64 {
        self.untouched_pages.load(Ordering::Relaxed)
    }
}

/// The default stall target of the automatic budget: 1 % of wall time. Why: a
/// single-threaded program stalled 1 % of the time runs at most about 1 % slower than with
/// all its memory, well inside the 5 % a user would call "no slower"; a smaller target
/// keeps more memory for stalls too short to notice (Senpai's default, 10 ms in 6 s, is
/// 0.17 %, set for fleets where a tenth of a percent of memory is worth a machine); and
/// 1 % of a second is 10 ms, hundreds of faults, so one second's figure is not noise.
pub const DEFAULT_TARGET: f64 = 0.01;

/// Parses a stall target as `uswap run --auto=TARGET` and the Python API take it: a
/// percentage (`1%`) or a share of wall time (`0.01`), in (0, 0.5].
pub fn parse_target(s: &str) -> Result<f64, String> {
    let t = s.trim();
    let share = match t.strip_suffix('%') {
        Some(pct) => pct.trim().parse::<f64>().map(|p| p / 100.0),
        None => t.parse::<f64>(),
    }
    .map_err(|_| format!("{s:?} is not a stall target: give a percentage such as 1% or a share such as 0.01"))?;
    if share > 0.0 && share <= 0.5 {
        Ok(share)
    } else {
        Err(format!("{s:?} is not a share of wall time between 0 and 50 %: give one such as 1%"))
    }
}
/// How often the budget moves.
pub const BUDGET_TICK_US: u64 = 1_000_000;
/// The shortest tick: a probe whose stalls pass [`EARLY_UNDO_SHARE`] over at least this
/// long is undone then, not at the end of its second. Why: a probe below a working set
/// thrashes (every fault evicts another page in use), and thrashing costs half of each
/// second or more; redis-server under `--auto` stalled 0.2 to 0.6 s on each of its probes
/// that went too deep, five or six a minute.
pub const EARLY_UNDO_US: u64 = 200_000;
/// The stall share that undoes a probe early: half the time, thrashing by any target.
pub const EARLY_UNDO_SHARE: f64 = 0.5;
/// The first probe, as a share of the budget, when the stalls were under a tenth of the
/// target ([`COEFF_PROBE`]). Senpai probes 1 % every 6 s; uswap's figure is exact and per
/// second, so it probes faster.
pub const FIRST_PROBE: f64 = 0.05;
/// The largest probe: each probe that cost nothing doubles the next, up to this, so that
/// memory a phase stopped using goes in seconds (256 MiB down to 32 MiB in about 12 s),
/// not minutes.
pub const MAX_PROBE: f64 = 0.25;
/// The smallest probe: what a probe shrinks to after probes that went below the working set.
pub const MIN_PROBE: f64 = 0.005;
const COEFF_PROBE: f64 = 10.0;
/// The most it grows in a tick (it doubles): reached when the stalls were 20 times the
/// target ([`COEFF_BACKOFF`]). Twice the target grows it 1 %; a phase that needs more
/// memory thrashes far above the target and gets it in a few seconds.
pub const MAX_BACKOFF: f64 = 1.0;
const COEFF_BACKOFF: f64 = 20.0;
/// What a probe that hurt is undone to: the level before it, and this much more.
const UNDO_MARGIN: f64 = 0.02;
/// Ticks without a probe after one was undone: the edge of the working set was found.
const HOLD_TICKS: u32 = 10;
/// Stalls this many times the target after a probe mean it went below the working set (and
/// hold the next probe for [`HOLD_TICKS`]); fewer, that it took pages still in use on their
/// way out (reclaim sees no accessed bits, so a probe takes some hot pages with the cold):
/// the next probe waits one tick.
const SEVERE: f64 = 4.0;
/// Pages the idle aging scan (`crate::reclaim::aging`) found untouched a tick after it
/// took them out, since the law's last tick, that make it trust the scan: the working set
/// is below the resident pages by at least this (1 MiB), and the pages can go at once.
pub const IDLE_TRUSTED_PAGES: usize = 256;
/// Pages found untouched that go between two ticks (4 MiB): fewer wait for the tick, so
/// that a lowered limit, which the reclaimers then bring the tree down to, is not set over
/// and over for a few pages each.
pub const IDLE_AT_ONCE_PAGES: usize = 1024;
/// What stays after the pages found idle go: all but a sixteenth of them. The scan's count is
/// a sample (a page it took out late in its tick is judged after less time), and taken
/// whole it left a working set of 32 MiB under a limit of 31 (measured: 0.25 s of stall and
/// the limit undone to twice the working set for 10 s); the probes after it take the margin
/// if it is not used.
fn without_idle(level_pages: usize, idle_pages: usize) -> usize {
    level_pages.saturating_sub(idle_pages - idle_pages / IDLE_MARGIN_DIVISOR)
}
const IDLE_MARGIN_DIVISOR: usize = 16;
/// Whether the resident pages fill the limit: they are within a 16th of it, or 96 pages.
/// Reclaim keeps them under it by its watermarks' gaps (`reclaim::accounting::watermarks`:
/// the low one lies a 32nd of the limit or 64 pages below it, whichever is more), so a
/// program's pages never reach the limit itself, and stalls with them this close are not
/// pages coming back into room.
fn room_full(limit_pages: usize, resident_pages: usize) -> bool {
    resident_pages + (limit_pages / ROOM_FULL_DIVISOR).max(ROOM_FULL_MIN_PAGES) >= limit_pages
}
const ROOM_FULL_DIVISOR: usize = 16;
const ROOM_FULL_MIN_PAGES: usize = 96;
/// Resident memory that grew by more than 1/this in a tick means the program is allocating.
const GROWING_DIVISOR: usize = 100;
/// Ticks without a probe after the budget grew: the program is bringing its pages back in,
/// and a probe then would take pages it is about to touch (Senpai's grace ticks).
const HOLD_AFTER_GROWTH_TICKS: u32 = 3;

/// The automatic budget's control law: Senpai's, on uswap's own stall figure, with the
/// probe made adaptive. Once a [`BUDGET_TICK_US`], the share of the tick some thread
/// stalled is compared with the target.
///
/// * At or below it, the budget *probes*: the limit (or the resident pages, when fewer: an
///   idle program's excess goes at once) shrinks by `step * min(1, (target/share/10)^2)`.
///   `step` starts at [`FIRST_PROBE`], halves each time a probe is undone, down to
///   [`MIN_PROBE`], and doubles with each probe that costs nothing, up to [`MAX_PROBE`].
/// * Above it, right after a probe, the probe went below the working set: the limit grows
///   as below, but no further than the level before the probe plus 2 % (the probe undone,
///   when the stalls were 20 times the target or more; judged after [`EARLY_UNDO_US`]
///   when they pass [`EARLY_UNDO_SHARE`]), and no probe follows for
///   [`HOLD_TICKS`] (one tick only when the stalls were under [`SEVERE`] times the target, or
///   when it was the first probe since the program grew: see `undo`).
/// * At or below it while the resident pages grew by more than 1 % in the tick (or, at the
///   first tick, since the clock started: the program allocates, or brings pages back in),
///   no probe: its new pages are in use.
/// * Above it in the tick after an undo, nothing moves: the undone probe's pages are coming
///   back into the room the undo gave.
/// * Above it otherwise (the working set grew), the limit grows to the resident pages times
///   `1 + MAX_BACKOFF * min(1, (share/target/20)^2)`, or stays, if that is lower (the
///   stalls are pages coming back into room it has); when the resident pages fill the
///   limit (`room_full`), it grows from the limit: doubling while the program thrashes;
///   no probe follows for [`HOLD_AFTER_GROWTH_TICKS`], while the program brings its pages in,
///   and the next probe is [`FIRST_PROBE`] again: the step the last phase reached (up to
///   [`MAX_PROBE`]) says nothing of the new one.
///
/// * When the idle aging scan runs (`uswap run --auto` turns it on), the pages it took out
///   of their regions a tick ago and that are still untouched are not in use: at least
///   [`IDLE_TRUSTED_PAGES`] of them end a hold and go with the next tick, all but a 16th
///   (the scan's count is a sample), and with no step on top (a blind probe below pages the
///   scan has yet to judge); [`IDLE_AT_ONCE_PAGES`] or more go as soon as the scan reports
///   them, between ticks, while the tick so far stalls no more than the target and the
///   program is not growing (judged with the tick, as a probe). A tick over
///   the target leaves them for the next. So a working set that shrank is followed as fast
///   as the scan finds its idle pages, without the stalls of probes that take hot pages
///   with cold ones. Measured (docs/auto-budget.md): a program whose working set dropped
///   from 320 MiB to 64 MiB kept a limit of 326 MiB for over 5 s of the small phase (a
///   hold) and came within 1.5x of the new working set after 18 s or more; with the scan's
///   findings at the next probe, after 6.7-7.8 s; taken at once, and found twice as fast,
///   after 3.6-5.7 s (within 5 s in 5 runs of 6).
///
/// Why it does not oscillate: a probe that finds the edge of the working set is undone in
/// the next tick and followed by ever smaller probes, so the limit stays within the last
/// step below the level that met the target (the first that hurts is at most `MAX_PROBE`,
/// the next ones halve down to `MIN_PROBE`),
/// and 2 % above it; a probe that costs nothing moves it down for good. Over a stable working
/// set the limit walks down from 2 % above its edge in small doubling steps and is undone
/// when a step crosses it: one tick of stalls every dozen or so, the price of knowing that
/// the working set did not shrink. A first probe's retry comes once per growth (the retry,
/// judged, counts as the test of the pages' order). Measured on a program (`uswap/tests/auto_budget.rs`); a model in the unit tests.
/// Bounded by `floor_pages` and `ceiling_pages` (`--limit`).
#[derive(Debug, Clone)]
pub struct Budget {
    target: f64,
    floor_pages: usize,
    ceiling_pages: usize,
    last_us: u64,
    last_total_us: u64,
    /// The next probe's largest share.
    step: f64,
    /// The level the last tick probed from, if it probed.
    probed_from: Option<usize>,
    /// Ticks left without probing.
    hold: u32,
    /// The resident pages at the last tick: a program whose resident memory grows is
    /// allocating (or bringing pages back), and is not probed.
    last_resident: Option<usize>,
    /// Whether a probe has been judged since the program last grew. Until then the LRU's
    /// order is only the order pages came in (user space sees no accessed bits): right
    /// after a fill, the oldest pages a probe takes are as likely the hot ones as the cold.
    /// Those that fault back are marked referenced, and the next probe spares them.
    tested: bool,
    /// Whether the last tick undid a probe: stalls in the next are the probe's pages
    /// coming back into the room the undo gave, not a working set that grew.
    undone: bool,
    /// Pages the aging scan found untouched since the last tick (0 below
    /// [`IDLE_TRUSTED_PAGES`]), and the scan's count then.
    idle_pages: usize,
    idle_seen: u64,
    /// The last limit this returned (the ceiling before the first), and whether pages
    /// found idle went between the last two ticks (`idle_between_ticks`, which set it).
    last_set: usize,
    cut_between_ticks: bool,
    /// Whether the last limit set took idle pages alone (no step).
    idle_cut: bool,
}

impl Budget {
    pub fn new(target: f64, floor_pages: usize, ceiling_pages: usize) -> Budget {
        assert!(target > 0.0 && target < 1.0, "a stall target is a share of wall time");
        assert!(floor_pages <= ceiling_pages);
        Budget {
            target,
            floor_pages,
            ceiling_pages,
            last_us: 0,
            last_total_us: 0,
            step: FIRST_PROBE,
            probed_from: None,
            hold: 0,
            last_resident: None,
            tested: false,
            undone: false,
            idle_pages: 0,
            idle_seen: 0,
            last_set: ceiling_pages,
            cut_between_ticks: false,
            idle_cut: false,
        }
    }

    /// A new ceiling (the program's own limit, set while it runs): the limits this returns
    /// stay under it from now on. Never below the floor.
    pub fn set_ceiling(&mut self, ceiling_pages: usize) {
        self.ceiling_pages = ceiling_pages.max(self.floor_pages);
        self.last_set = self.last_set.min(self.ceiling_pages);
    }

    pub fn target(&self) -> f64 {
        self.target
    }

    /// Called often (each pass of a background loop) with the stall clock's total and the
    /// aging scan's ([`IdleSample::total`]; zero without a scan): the new limit, in pages,
    /// once a tick has passed since the last, or [`EARLY_UNDO_US`] after a probe that
    /// thrashes, or between ticks when the scan reports [`IDLE_AT_ONCE_PAGES`] idle
    /// (`None` otherwise).
    pub fn tick(
        &mut self,
        stall_total_us: u64,
        now_us: u64,
        limit_pages: usize,
        resident_pages: usize,
        idle_untouched_pages: u64,
    ) -> Option<usize> {
        if self.last_us == 0 {
            (self.last_us, self.last_total_us) = (now_us, stall_total_us);
            // So that the first tick knows whether the program grew: one that starts by
            // allocating is not probed (a CPython job building its 340 MiB dict, probed at
            // its first tick, stalled 1.4 s in the next two, until the limit had doubled).
            self.last_resident = Some(resident_pages);
            return None;
        }
        let elapsed = now_us.saturating_sub(self.last_us);
        let share = stall_total_us.saturating_sub(self.last_total_us) as f64 / elapsed.max(1) as f64;
        let thrashing = self.probed_from.is_some() && share >= EARLY_UNDO_SHARE.max(self.target);
        if elapsed < BUDGET_TICK_US && !(thrashing && elapsed >= EARLY_UNDO_US) {
            return self.idle_between_ticks(share, limit_pages, resident_pages, idle_untouched_pages);
        }
        (self.last_us, self.last_total_us) = (now_us, stall_total_us);
        self.note_idle(idle_untouched_pages);
        // A limit set between ticks may still be a goal the tree is being brought down to
        // (`uswap run --auto`): the tick starts from it, or a hold would set the old one back.
        let limit_pages = match self.cut_between_ticks {
            true => limit_pages.min(self.last_set),
            false => limit_pages,
        };
        let next = self.next_limit(share, limit_pages, resident_pages);
        self.last_set = next;
        Some(next)
    }

    /// The pages found idle since the last tick, from the aging scan's total (too few are
    /// kept for the next tick). Approximate by what reclaim takes between a scan's report
    /// and this tick: those pages already left the resident count the probe starts from, so
    /// the probe goes that much deeper, and its stalls judge it as any probe's.
    fn note_idle(&mut self, untouched: u64) {
        let new = untouched.saturating_sub(self.idle_seen) as usize;
        self.idle_pages = 0;
        if new >= IDLE_TRUSTED_PAGES {
            (self.idle_pages, self.idle_seen) = (new, untouched);
        }
    }

    /// Between ticks, the pages the scan reports untouched (at least [`IDLE_AT_ONCE_PAGES`])
    /// go as soon as it reports them, while the tick so far stalled no more than the target
    /// and the program is not growing: waiting for the tick only delays what the next probe
    /// takes anyway. The tick's clock, its probe and its judgement are left as they are; a
    /// probe under way is judged by the whole tick's stalls, and its undo bounded by the
    /// limit this leaves. Measured (docs/auto-budget.md): up to a second of the descent
    /// after a working set shrank, which a second's scan reports in a few steps.
    fn idle_between_ticks(
        &mut self,
        share: f64,
        limit_pages: usize,
        resident_pages: usize,
        untouched: u64,
    ) -> Option<usize> {
        let new = untouched.saturating_sub(self.idle_seen) as usize;
        let growing = self.last_resident.is_none_or(|r| resident_pages > r + r / GROWING_DIVISOR);
        if new < IDLE_AT_ONCE_PAGES || share > self.target || growing {
            return None;
        }
        self.idle_seen = untouched;
        // As at a tick: a phase that shrank ends a hold, and the last phase's step says
        // nothing of it.
        self.hold = 0;
        self.step = self.step.max(FIRST_PROBE);
        // From the last limit set, too, while it may still be a goal the reclaimers are
        // bringing the tree down to (a probe's or a cut's), which this must not raise.
        let pending = self.cut_between_ticks || self.probed_from.is_some();
        let level = limit_pages.min(resident_pages).min(if pending { self.last_set } else { usize::MAX });
        // Judged with the tick, as a probe from here: undone if it hurts.
        self.probed_from.get_or_insert(level);
        self.idle_cut = true;
        debug_assert!(self.floor_pages <= self.ceiling_pages, "the bounds are ordered");
        self.last_set = without_idle(level, new).clamp(self.floor_pages, self.ceiling_pages);
        self.cut_between_ticks = true;
        Some(self.last_set)
    }

    /// The law itself: the limit after a tick whose stall share was `share`.
    pub fn next_limit(&mut self, share: f64, limit_pages: usize, resident_pages: usize) -> usize {
        let probed_from = self.probed_from.take();
        let idle_only = std::mem::take(&mut self.idle_cut);
        let found_between_ticks = std::mem::take(&mut self.cut_between_ticks);
        let after_undo = std::mem::take(&mut self.undone);
        let growing = self.last_resident.is_some_and(|r| resident_pages > r + r / GROWING_DIVISOR);
        self.last_resident = Some(resident_pages);
        let next = if share > self.target {
            // Pages found idle wait for the next tick (or go between ticks once the stalls
            // stop): a tick over the target moves the limit for its stalls, and the idle
            // pages are no less idle for them (measured: 122 MiB found in the tick a probe
            // hurt were dropped with it, and the limit came down 4 s later).
            self.idle_seen = self.idle_seen.saturating_sub(std::mem::take(&mut self.idle_pages) as u64);
            let adj = (share / self.target / COEFF_BACKOFF).powi(2).min(1.0) * MAX_BACKOFF;
            let grown = limit_pages.min(resident_pages.max(self.floor_pages)) as f64 * (1.0 + adj);
            match probed_from {
                Some(level) => self.undo(share, level, grown),
                // Measured: a CPython job's probe undone early (at 200 ms) stalled 14 % in the
                // next tick as its pages came back; read as growth, that held the next probe
                // 3 ticks instead of 10 and made it a first probe: one every 6 s, 0.3-0.45 s
                // of stall each.
                None if after_undo => return limit_pages,
                None => self.grow(adj, grown, limit_pages, resident_pages),
            }
        } else if self.hold > 0 && self.idle_pages == 0 {
            self.hold -= 1;
            return limit_pages;
        } else if growing {
            // Its new pages are in use by definition: a probe would only take them back.
            self.tested = false;
            return limit_pages;
        } else {
            // A cut of idle pages alone that cost nothing says nothing of the step.
            if probed_from.is_some() && !idle_only {
                self.step = (self.step * 2.0).min(MAX_PROBE);
                self.tested = true;
            }
            self.hold = 0;
            if self.idle_pages > 0 {
                // Pages left idle: a phase that shrank, which the last phase's step says
                // nothing of (as for one that grew).
                self.step = self.step.max(FIRST_PROBE);
            }
            let level = limit_pages.min(resident_pages);
            self.probed_from = Some(level);
            if found_between_ticks || self.idle_pages > 0 {
                // The scan is finding what the program left: those pages go, with no step.
                // A step on top is a blind probe below what the scan has yet to judge, and it
                // crossed the working set (measured: a 25 % step with the idle pages took a
                // program from 161 to 120 MiB, 64 in use, undone and held for 10 s).
                self.idle_cut = true;
                return without_idle(level, self.idle_pages).clamp(self.floor_pages, self.ceiling_pages);
            }
            let adj = (self.target / share.max(1e-9) / COEFF_PROBE).powi(2).min(1.0) * self.step;
            level as f64 * (1.0 - adj)
        };
        (next as usize).clamp(self.floor_pages, self.ceiling_pages)
    }

    /// The working set grew (stalls over the target, no probe to undo): the limit grows by
    /// `adj` from the resident pages (`grown`), or from the limit when they fill it, and
    /// never shrinks; the next probe waits, and is a first one.
    fn grow(&mut self, adj: f64, grown: f64, limit_pages: usize, resident_pages: usize) -> f64 {
        self.hold = HOLD_AFTER_GROWTH_TICKS;
        self.step = FIRST_PROBE;
        self.tested = false;
        // Resident pages that fill the limit leave no room to come back into: growth is from
        // the limit (measured: a 12 MiB working set under a 12.2 MiB limit, 12.0 resident,
        // stalled twice the target for 9 s while growth from the resident pages stayed under
        // the limit).
        let grown = match room_full(limit_pages, resident_pages) {
            true => limit_pages as f64 * (1.0 + adj),
            false => grown,
        };
        // Growth never lowers the limit: grown from resident pages under it (a program
        // bringing back what a probe took), it would (measured: an undo to 49 MiB, then 48.1
        // for a 48 MiB working set, then thrashing and doubling).
        grown.max(limit_pages as f64)
    }

    /// A probe from `level` stalled `share` of the tick: the limit goes back to `grown` (as
    /// after any tick over the target), but never past `level` and a margin (Senpai's
    /// step). A probe whose pages came back by the thousand went below the working set: the
    /// step halves and the edge is left alone for [`HOLD_TICKS`]. Unless it was the first
    /// probe since the program grew: then what it took says nothing of the working set's
    /// edge (the oldest pages of a fill may be its hot ones; measured: a program that filled
    /// 256 MiB and used its first 32 MiB stalled 12 % after a 5 % probe, and was then left
    /// at 256 MiB for 10 s), so the same probe comes again after a tick, sparing the pages
    /// that came back.
    fn undo(&mut self, share: f64, level: usize, grown: f64) -> f64 {
        self.undone = true;
        if !std::mem::replace(&mut self.tested, true) {
            self.hold = 1;
        } else {
            self.step = (self.step / 2.0).max(MIN_PROBE);
            self.hold = if share >= SEVERE * self.target { HOLD_TICKS } else { 1 };
        }
        grown.min(level as f64 * (1.0 + UNDO_MARGIN))
    }
}

#[cfg(test)]
mod budget_tests {
    use super::*;

    /// No aging scan: its total stays at zero.
    const NO_SCAN: u64 = 0;

    #[test]
    fn the_law_shrinks_under_the_target_grows_over_it_and_keeps_its_bounds() {
        let b = || Budget::new(0.01, 100, 100_000);
        assert_eq!(b().next_limit(0.0, 10_000, 10_000), 9_500, "no stall: the full probe, 5 %");
        assert_eq!(b().next_limit(0.0, 10_000, 4_000), 3_800, "an idle excess goes at once");
        assert_eq!(b().next_limit(0.005, 10_000, 10_000), 9_980, "half the target: a 0.2 % probe");
        assert_eq!(b().next_limit(0.02, 10_000, 10_000), 10_100, "twice the target: 1 % more");
        assert_eq!(b().next_limit(0.5, 10_000, 10_000), 20_000, "thrashing: doubled");
        assert_eq!(b().next_limit(0.5, 90_000, 90_000), 100_000, "never above the ceiling");
        assert_eq!(b().next_limit(0.0, 100, 100), 100, "never below the floor");
    }

    #[test]
    fn a_probe_that_hurts_is_undone_then_held_then_made_smaller() {
        // A program whose pages were sorted by an earlier probe.
        let tested = || Budget { tested: true, ..Budget::new(0.01, 100, 100_000) };
        let mut b = tested();
        assert_eq!(b.next_limit(0.0, 10_000, 10_000), 9_500);
        assert_eq!(b.next_limit(0.4, 9_500, 9_500), 10_200, "undone, and 2 % more");
        let mut mild = tested();
        mild.next_limit(0.0, 10_000, 10_000);
        assert_eq!(mild.next_limit(0.03, 9_500, 9_500), 9_713, "3 times the target: 2.25 % back, no more");
        for _ in 0..HOLD_TICKS {
            assert_eq!(b.next_limit(0.0, 10_200, 10_000), 10_200, "held");
        }
        assert_eq!(b.next_limit(0.0, 10_200, 10_000), 9_750, "a probe half as deep: 2.5 %");
        let mut refill = tested();
        refill.next_limit(0.0, 10_000, 10_000);
        assert_eq!(refill.next_limit(0.4, 9_500, 9_500), 10_200);
        assert_eq!(
            refill.next_limit(0.011, 10_200, 9_900),
            10_200,
            "pages still coming back into the room the undo gave: no lower, no higher"
        );
        assert_eq!(b.next_limit(0.0, 9_750, 9_750), 9_262, "it cost nothing: the next is 5 % again");
    }

    #[test]
    fn the_first_probe_after_a_fill_that_hurts_is_tried_again_after_a_tick() {
        let mut b = Budget::new(0.01, 100, 100_000);
        assert_eq!(b.next_limit(0.0, 50_000, 40_000), 38_000, "the first probe");
        assert_eq!(b.next_limit(0.2, 38_000, 38_000), 40_800, "it took hot pages: undone");
        assert_eq!(b.next_limit(0.0, 40_800, 40_000), 40_800, "held one tick");
        assert_eq!(b.next_limit(0.0, 40_800, 40_000), 38_000, "the same probe again");
        assert_eq!(b.next_limit(0.2, 38_000, 38_000), 40_800, "it hurt again: the edge");
        for _ in 0..HOLD_TICKS {
            assert_eq!(b.next_limit(0.0, 40_800, 40_000), 40_800, "held");
        }
        assert_eq!(b.next_limit(0.0, 40_800, 40_000), 39_000, "then probed half as deep");
        let mut grew = Budget::new(0.01, 100, 100_000);
        assert_eq!(grew.next_limit(0.0, 50_000, 40_000), 38_000);
        assert_eq!(grew.next_limit(0.0, 38_000, 38_000), 34_200, "a free probe sorts the pages");
        assert_eq!(grew.next_limit(0.0, 60_000, 50_000), 60_000, "then it grows");
        assert_eq!(grew.next_limit(0.0, 60_000, 50_000), 45_000, "the first probe after the growth (10 %)");
        assert_eq!(grew.next_limit(0.2, 45_000, 45_000), 51_000, "undone");
        assert_eq!(grew.next_limit(0.0, 51_000, 50_000), 51_000, "and held one tick only");
    }

    #[test]
    fn pages_the_scan_found_idle_end_a_hold_and_go_with_the_next_probe() {
        let mut b = Budget { tested: true, ..Budget::new(0.01, 100, 100_000) };
        assert_eq!(b.tick(0, 1_000_000, 10_000, 10_000, NO_SCAN), None);
        assert_eq!(b.tick(0, 2_000_000, 10_000, 10_000, 0), Some(9_500), "a probe; nothing found idle");
        assert_eq!(b.tick(400_000, 3_000_000, 9_500, 9_500, 0), Some(10_200), "it hurt: undone, held");
        assert_eq!(b.tick(400_000, 4_000_000, 10_200, 9_600, 100), Some(10_200), "too few idle: held");
        // 4,100 pages the scan took out are untouched a tick later (the 100 of the last tick,
        // too few then, count now): the working set shrank.
        // They go, less a 16th (256), with no step on top.
        assert_eq!(b.tick(400_000, 5_000_000, 10_200, 9_600, 4_100), Some(5_756), "the hold ends, they go");
        assert_eq!(
            b.tick(400_000, 6_000_000, 5_756, 5_756, 4_100),
            Some(5_468),
            "then plain probes (5 %: the cut took idle pages only)"
        );
        let mut fresh = Budget::new(0.01, 100, 100_000);
        fresh.step = MIN_PROBE;
        fresh.idle_pages = 1_024;
        assert_eq!(fresh.next_limit(0.0, 50_000, 50_000), 49_040, "idle pages go, alone");
        fresh.idle_pages = 0;
        assert_eq!(fresh.next_limit(0.0, 49_040, 49_040), 46_588, "and bring the step back to 5 % (not doubled)");
    }

    #[test]
    fn pages_found_idle_between_ticks_go_at_once_unless_the_program_stalls_or_grows() {
        let mut b = Budget { tested: true, ..Budget::new(0.01, 100, 100_000) };
        assert_eq!(b.tick(0, 1_000_000, 10_000, 10_000, NO_SCAN), None);
        assert_eq!(b.tick(0, 1_100_000, 10_000, 10_000, 1_000), None, "under 4 MiB: they wait for the tick");
        assert_eq!(b.tick(0, 1_200_000, 10_000, 10_000, 2_048), Some(8_080), "4 MiB and more go at once");
        assert_eq!(b.tick(5_000, 1_300_000, 10_000, 10_000, 4_096), None, "not while the tick stalls (1.7 %)");
        assert_eq!(b.tick(5_000, 1_900_000, 10_000, 12_000, 4_096), None, "nor while the program grows (0.56 %)");
        // The tick starts from the limit set between ticks (a goal the tree may not have
        // reached yet), and takes the pages found since: 2,048 (less 128) below it.
        assert_eq!(b.tick(5_000, 2_000_000, 10_000, 10_000, 4_096), Some(6_160), "the tick starts from the cut");
    }

    #[test]
    fn pages_found_idle_in_a_tick_that_stalled_wait_for_the_next() {
        let mut b = Budget { tested: true, ..Budget::new(0.01, 100, 100_000) };
        assert_eq!(b.tick(0, 1_000_000, 10_000, 10_000, NO_SCAN), None);
        assert_eq!(b.tick(0, 2_000_000, 10_000, 10_000, 0), Some(9_500), "a probe");
        // It hurt (a share of 2 %: back to 1 % above, held one tick), and the scan found 512
        // pages idle meanwhile.
        assert_eq!(b.tick(20_000, 3_000_000, 9_500, 9_500, 512), Some(9_595), "undone");
        assert_eq!(b.tick(20_000, 4_000_000, 9_595, 9_595, 512), Some(9_115), "the idle pages go then");
    }

    #[test]
    fn a_program_that_allocates_is_not_probed() {
        let mut b = Budget::new(0.01, 100, 100_000);
        assert_eq!(b.next_limit(0.0, 50_000, 10_000), 9_500, "the first tick probes");
        assert_eq!(b.next_limit(0.0, 9_500, 9_500), 8_550, "a steady program is probed (10 %: the last was free)");
        assert_eq!(b.next_limit(0.0, 20_000, 12_000), 20_000, "one that grew by a fifth is not");
        assert_eq!(b.next_limit(0.0, 20_000, 12_050), 10_845, "once it grows by under 1 % a tick, it is again");
    }

    #[test]
    fn ticks_come_once_a_period_with_the_share_of_that_period() {
        let mut b = Budget::new(0.01, 1, 1 << 20);
        assert_eq!(b.tick(0, 1_000_000, 1000, 1000, NO_SCAN), None, "the first call starts the clock");
        let mut started = Budget::new(0.01, 1, 1 << 20);
        assert_eq!(started.tick(0, 1_000_000, 1 << 20, 1000, NO_SCAN), None);
        assert_eq!(
            started.tick(0, 2_000_000, 1 << 20, 2000, NO_SCAN),
            Some(1 << 20),
            "it grew since the clock started"
        );
        assert_eq!(b.tick(0, 1_500_000, 1000, 1000, NO_SCAN), None);
        // 0.5 s of stall in 1 s: 50 times the target, no probe before it.
        assert_eq!(b.tick(500_000, 2_000_000, 1000, 1000, NO_SCAN), Some(2000));
        for t in 0..HOLD_AFTER_GROWTH_TICKS as u64 {
            assert_eq!(
                b.tick(500_000, 3_000_000 + t * 1_000_000, 2000, 1000, NO_SCAN),
                Some(2000),
                "held after growing"
            );
        }
        assert_eq!(b.tick(500_000, 9_000_000, 2000, 1000, NO_SCAN), Some(950));
    }

    #[test]
    fn a_probe_that_thrashes_is_undone_before_its_tick_ends() {
        let mut b = Budget { tested: true, ..Budget::new(0.01, 1, 1 << 20) };
        assert_eq!(b.tick(0, 1_000_000, 10_000, 10_000, NO_SCAN), None);
        assert_eq!(b.tick(0, 2_000_000, 10_000, 10_000, NO_SCAN), Some(9_500), "a probe");
        assert_eq!(b.tick(100_000, 2_150_000, 9_500, 9_500, NO_SCAN), None, "too soon to tell");
        assert_eq!(b.tick(120_000, 2_300_000, 9_500, 9_500, NO_SCAN), None, "40 % of 300 ms: not thrashing");
        // 200 ms of stall in 350 ms: 57 % of the time, the probe went below the working set.
        assert_eq!(b.tick(200_000, 2_350_000, 9_500, 9_500, NO_SCAN), Some(10_200), "undone at once, and 2 % more");
        // Then only full ticks: no probe outstanding, no early tick.
        assert_eq!(b.tick(500_000, 2_600_000, 10_200, 9_800, NO_SCAN), None);
        assert_eq!(b.tick(500_000, 3_350_000, 10_200, 10_000, NO_SCAN), Some(10_200), "its pages come back: no growth");
        for t in 0..HOLD_TICKS as u64 {
            assert_eq!(b.tick(500_000, 4_350_000 + t * 1_000_000, 10_200, 10_000, NO_SCAN), Some(10_200), "held");
        }
        assert_eq!(
            b.tick(1_200_000, 15_350_000, 10_200, 10_000, NO_SCAN),
            Some(20_400),
            "a full tick of thrashing doubles it, from the limit its pages fill"
        );
    }

    #[test]
    fn a_phase_that_needs_more_is_probed_from_the_first_step_again() {
        let mut b = Budget::new(0.01, 100, 100_000);
        let mut limit = 50_000;
        for _ in 0..4 {
            limit = b.next_limit(0.0, limit, limit);
        }
        assert_eq!(limit, 25_650, "free probes doubled the step to a quarter");
        assert_eq!(b.next_limit(0.02, limit, limit), 25_906, "the edge: 1 % back, the step an eighth");
        assert_eq!(b.next_limit(0.0, 25_906, 25_906), 25_906, "held a tick");
        assert_eq!(b.next_limit(0.5, 25_906, 25_906), 51_812, "a new phase thrashes: doubled");
        for _ in 0..HOLD_AFTER_GROWTH_TICKS {
            assert_eq!(b.next_limit(0.0, 51_812, 50_000), 51_812, "held while its pages come in");
        }
        assert_eq!(b.next_limit(0.0, 51_812, 50_000), 47_500, "then probed by 5 %, not an eighth");
    }

    #[test]
    fn stalls_with_the_room_full_grow_the_limit_from_the_limit() {
        // Reclaim keeps the resident pages a watermark gap under the limit: a working set
        // of 3,072 pages under a limit of 3,133 holds 3,072 and faults on and on.
        let mut b = Budget::new(0.01, 100, 100_000);
        assert_eq!(b.next_limit(0.021, 3_133, 3_072), 3_167, "1.1 % more, from the limit");
        let mut room = Budget::new(0.01, 100, 100_000);
        assert_eq!(room.next_limit(0.021, 3_133, 2_000), 3_133, "pages coming back into room: it stays");
    }

    /// A model of a program whose working set is sharp (uniform random access: any page cut
    /// below it faults at once): stalls rise steeply once the limit is under it. From far
    /// above and from far below, the limit settles within the working set's last few percent
    /// and 2 % above it, and the stalls average under the target.
    #[test]
    fn against_a_model_program_the_limit_settles_at_the_working_set() {
        let wss = 10_000.0;
        let share = |limit: usize| ((wss - limit as f64).max(0.0) / wss * 20.0).min(1.0);
        for start in [100_000usize, 2_000] {
            let mut b = Budget::new(DEFAULT_TARGET, 256, 200_000);
            let (mut limit, mut resident) = (start, start);
            let mut seen = Vec::new();
            for _ in 0..200 {
                let s = share(limit.min(resident));
                seen.push((limit, s));
                limit = b.next_limit(s, limit, resident);
                // The program holds what it can of its working set.
                resident = limit.min(wss as usize);
            }
            let last = &seen[100..];
            let lo = last.iter().map(|x| x.0).min().unwrap() as f64;
            let hi = last.iter().map(|x| x.0).max().unwrap() as f64;
            assert!(lo >= wss * 0.95 && hi <= wss * 1.05, "from {start}: {lo}..{hi}");
            let mean = last.iter().map(|x| x.1).sum::<f64>() / last.len() as f64;
            assert!(mean <= DEFAULT_TARGET, "from {start}: stalls averaged {mean}");
        }
    }
}
