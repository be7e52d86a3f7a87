//! Idle aging: finding the pages the application no longer touches, without waiting for the
//! limit, and sending them out once idle long enough (`IdleAging`).
//!
//! User space sees no accessed bits, so a page's use is tested the way the kernel's NUMA
//! balancing tests it: by taking the mapping away. Once a second the background reclaimer
//! moves a slice of the oldest resident pages into the swap cache ([`deactivate`]: the
//! pages keep their RAM, `UFFDIO_MOVE` moves no data), stamped with the moment they left
//! (`crate::swap::idle_ages`). A page still in use faults straight back (a swap-cache hit)
//! and is marked referenced, so the next pass spares it once (second chance); a page left
//! alone stays staged and ages, which the idle-age histogram counts. The slice is sized so
//! that every resident page is tested about once per [`PASS_S`], within
//! [`MAX_DEACTIVATE_PER_S`]: a page in constant use costs a swap-cache hit every other
//! pass (2 x 10 s), a few microseconds, and its move out a TLB flush, an interrupt of the
//! application's CPUs (on this VM the dearer part: aging every page of a CPython job whose
//! pages were all in use every 10 s slowed it by 3 %, and 8 % under pressure). So a pass
//! that finds little (three quarters or more of its pages came back) is followed by one
//! twice as slow, up to [`MAX_SLOWDOWN`] times, and one that finds idle pages (half or
//! more stayed out) brings back the full pace. A tick that finds half or more of the last
//! tick's pages still out brings it back at once, and [`IDLE_SPEEDUP`] times that (and
//! times [`MAX_DEACTIVATE_PER_S`]) while it keeps finding them: idle pages cost their move
//! only. What each tick found goes to the automatic budget (`pressure::IdleSample`), which
//! takes the pages found untouched with its next probe.
//!
//! With `IdleAging::Evict(age)`, staged pages that have been idle for `age` are written to
//! their device, oldest first ([`evict_idle`]), and pages that have been idle for `age`
//! again on a device with a tier below go down a tier ([`tier_down`]). Reclaim under the
//! limit needs nothing more to pick by age: it writes the swap cache's oldest staged pages
//! first, and once the scan has run those are the longest idle.
//!
//! Locking: none of its own; it runs inside an `InFlight` (a fork's hold stops it) and takes
//! pages through their busy bits, in the same rounds as reclaim. Invariant: every loop is
//! bounded by a per-tick page or slot budget.

use std::sync::atomic::Ordering;

use super::round::InFlight;
use super::swapout::{shrink_active, shrink_inactive, Stager};
use super::victims::Take;
use super::writeback::move_slots_down;
use super::Reclaim;
use crate::backend::{AlignedPage, SWAPFILE_CLUSTER};
use crate::options::IdleAging;
use crate::state::RECLAIM_BATCH_PAGES as BATCH;
use crate::stats::Counter;
use crate::swap::idle_ages::{now_epoch, Epoch, EPOCH_MS};
use crate::swap::SwapDevice;

/// Seconds one pass over the resident pages takes (when [`MAX_DEACTIVATE_PER_S`] allows).
pub const PASS_S: usize = 10;
/// Pages deactivated a second at most (16 MiB/s): bounds the scan's cost on a large heap,
/// whose pass then takes longer.
pub const MAX_DEACTIVATE_PER_S: usize = 4096;
/// How many times slower than [`PASS_S`] a pass may go after passes that found nothing idle.
pub const MAX_SLOWDOWN: usize = 4;
/// How many times faster than its pace the scan goes while most of what it tests stays
/// untouched (up to this times [`MAX_DEACTIVATE_PER_S`]): the pages it finds idle are then
/// most of its cost-free work, and what an automatic budget follows a shrinking working set
/// down by (`pressure::Budget`): 320 MiB of a program that now uses 64 MiB are tested in
/// 5 s, not 20.
pub const IDLE_SPEEDUP: usize = 4;
/// Pages written out (or moved down a tier) for their age a second at most (64 MiB/s).
const MAX_EVICT_PER_S: usize = 16384;
/// Slots a tick looks at for pages to move down a tier.
const TIER_SCAN_SLOTS: u64 = 1 << 16;

/// The aging scan's state in the background reclaimer.
pub(crate) struct Aging {
    /// When the last tick ran (`pressure::now_us`).
    last_us: u64,
    /// Pages a tick deactivates in this pass (set at its start from the pages in regions).
    pass_rate: usize,
    /// Ticks left in this pass.
    pass_ticks_left: usize,
    /// How many times slower than `PASS_S` this pass goes (1 to `MAX_SLOWDOWN`).
    slowdown: usize,
    /// Pages this pass moved out, and the count of aged pages that came back at its start.
    pass_moved: usize,
    refaults_at_start: u64,
    /// Per device: the next slot [`tier_down`] looks at.
    tier_cursor: Vec<u64>,
    /// Pages the last tick moved out, and the counts then of aged pages that had come back
    /// and that reclaim had written out: the sample the next tick reports
    /// (`pressure::IdleSample`).
    last_moved: usize,
    last_refaults: u64,
    last_aged_written: u64,
    /// Whether half or more of the pages the last tick tested stayed untouched.
    finding_idle: bool,
}

impl Aging {
    /// A scan for `p`, or `None` when its idle aging is off.
    pub fn new(cx: &Reclaim<'_>) -> Option<Aging> {
        (cx.idle_aging != IdleAging::Off).then(|| Aging {
            last_us: 0,
            pass_rate: 0,
            pass_ticks_left: 0,
            slowdown: 1,
            pass_moved: 0,
            refaults_at_start: 0,
            tier_cursor: vec![0; cx.devices.devices().len()],
            last_moved: 0,
            last_refaults: 0,
            last_aged_written: 0,
            finding_idle: false,
        })
    }

    /// Runs once a second: deactivates a slice of the resident pages, then (with `Evict`)
    /// sends out those idle long enough.
    pub fn tick(&mut self, cx: &Reclaim<'_>, now_us: u64, buf: &mut [AlignedPage]) {
        if now_us < self.last_us + 1_000_000 || cx.charge.reclaim_held.load(Ordering::Acquire) {
            return;
        }
        self.last_us = now_us;
        let Some(_in_flight) = InFlight::enter(cx) else { return };
        // A pass over the pages in their regions, a tenth a tick (slowed down after passes
        // that found nothing). The rate only rises during a pass (set from each tick's
        // count, it would fall with every page staged and the pass would never end; it rises
        // with a program that grows).
        if self.pass_ticks_left == 0 {
            self.next_pass(cx);
        }
        let resident = cx.charge.resident_pages.load(Ordering::Acquire);
        let in_regions = resident.saturating_sub(cx.swap_cache.nr_pages());
        let rate = in_regions.div_ceil(PASS_S * self.slowdown).clamp(BATCH, MAX_DEACTIVATE_PER_S);
        self.pass_rate = self.pass_rate.max(rate);
        // The rate is clamped each tick and reset each pass: the scan's cost stays bounded.
        assert!(self.pass_rate <= MAX_DEACTIVATE_PER_S, "uswap invariant: aging rate above its bound");
        // A pass starts with `PASS_S` ticks or more (`next_pass`), and a new one starts at 0.
        debug_assert!(self.pass_ticks_left > 0, "a tick within a pass");
        self.pass_ticks_left -= 1;
        self.report_sample(cx);
        let want = match self.finding_idle {
            true => (self.pass_rate * IDLE_SPEEDUP).min(MAX_DEACTIVATE_PER_S * IDLE_SPEEDUP),
            false => self.pass_rate,
        };
        let moved = deactivate(cx, want);
        self.pass_moved += moved;
        self.last_moved = moved;
        if let IdleAging::Evict(age) = cx.idle_aging {
            let age_epochs = (age.as_millis() as u64 / EPOCH_MS).max(1);
            let now = now_epoch();
            evict_idle(cx, now.saturating_sub(age_epochs));
            self.tier_down(cx, now.saturating_sub(2 * age_epochs), buf);
        }
    }

    /// Reports what the last tick found to the automatic budget (`pressure::IdleSample`):
    /// the pages it moved out, and how many of them have not come back since. The pages
    /// that came back are counted by their faults, and those that reclaim wrote out before
    /// either (a probe takes the staged pages first) are left out of the sample; both
    /// counts may include a few pages moved out earlier (they saturate). A tick that found
    /// most of its pages idle brings the scan back to its full pace at once: a phase that
    /// shrank is found in seconds, not at the end of a slowed pass (up to [`MAX_SLOWDOWN`]
    /// times [`PASS_S`]).
    fn report_sample(&mut self, cx: &Reclaim<'_>) {
        let refaults = cx.stats.sum(Counter::PgfaultAged);
        let back = refaults.saturating_sub(self.last_refaults) as usize;
        self.last_refaults = refaults;
        let aged_written = cx.charge.aged_written_pages.load(Ordering::Relaxed);
        let written = aged_written.saturating_sub(self.last_aged_written) as usize;
        self.last_aged_written = aged_written;
        let moved = std::mem::take(&mut self.last_moved);
        // Written or not, a page that did not come back was not in use: the pace follows it.
        self.finding_idle = moved >= BATCH && moved.saturating_sub(back) * 2 >= moved;
        if self.finding_idle {
            self.slowdown = 1;
            self.pass_ticks_left = self.pass_ticks_left.min(PASS_S);
        }
        let tested = moved.saturating_sub(written);
        if tested == 0 {
            return;
        }
        let untouched = tested.saturating_sub(back);
        debug_assert!(untouched <= tested, "untouched pages are some of those tested");
        cx.charge.idle_sample.add(untouched as u64);
        if let Some(tree) = cx.charge.shared {
            tree.idle_sample.add(untouched as u64);
        }
    }

    /// Starts a pass, as slow as the last one's findings say (see the module doc).
    fn next_pass(&mut self, cx: &Reclaim<'_>) {
        let refaults = cx.stats.sum(Counter::PgfaultAged);
        let back = refaults.saturating_sub(self.refaults_at_start) as usize;
        if self.pass_moved >= BATCH {
            if back * 4 >= self.pass_moved * 3 {
                self.slowdown = (self.slowdown * 2).min(MAX_SLOWDOWN);
            } else if back * 2 <= self.pass_moved {
                self.slowdown = 1;
            }
        }
        self.refaults_at_start = refaults;
        self.pass_moved = 0;
        self.pass_rate = 0;
        self.pass_ticks_left = PASS_S * self.slowdown;
        debug_assert!((1..=MAX_SLOWDOWN).contains(&self.slowdown), "aging slowdown within its bounds");
    }

    /// Moves pages idle since epoch `cut` or before down a tier, from every device that has
    /// one below it, looking at [`TIER_SCAN_SLOTS`] slots of each per tick.
    fn tier_down(&mut self, cx: &Reclaim<'_>, cut: Epoch, buf: &mut [AlignedPage]) {
        let devices = cx.devices.devices();
        // The devices are fixed when the pager is built, before the scan is.
        debug_assert_eq!(self.tier_cursor.len(), devices.len(), "a tier cursor per device");
        let mut moved = 0;
        for dev in devices {
            if !devices.iter().any(|d| d.priority < dev.priority) {
                continue;
            }
            let cursor = &mut self.tier_cursor[dev.index];
            moved += tier_down_from(cx, dev, cursor, cut, buf);
        }
        cx.stats.add(Counter::WritebackIdle, moved as u64);
    }
}

/// Moves up to `want` of the oldest resident pages into the swap cache (see the module
/// doc). Returns the pages moved.
fn deactivate(cx: &Reclaim<'_>, want: usize) -> usize {
    let mut moved = 0;
    // A batch that moves nothing may have spared a run of referenced pages (each call
    // looks at 4 batches of the LRU at most), so such calls go on, up to twice as many as
    // `want` needs: at most 8 `want` entries looked at, under a pass's worth (10 `want`),
    // so that a page spared is not met again, and staged, in the same tick. Bounded by
    // `calls` and by the LRU running dry.
    let mut calls = 2 * want.div_ceil(BATCH);
    while moved < want && calls > 0 && !cx.devices.is_full() && !cx.shutdown.is_set() && !cx.lru.is_empty() {
        calls -= 1;
        let s = shrink_active(cx, BATCH.min(want - moved), Stager::Aging);
        // A round moves at most the victims it was asked for, and uncharges only some of those.
        debug_assert!(s.moved <= BATCH.min(want - moved) && s.uncharged <= s.moved);
        moved += s.moved;
        if s.uncharged > 0 {
            // Clean pages were dropped and zero pages freed: out as reclaim sends them.
            cx.devices.flush_frees();
        }
    }
    moved
}

/// Writes to their devices the staged pages that left their regions in epoch `cut` or
/// before, oldest first. Returns the pages written.
fn evict_idle(cx: &Reclaim<'_>, cut: Epoch) -> usize {
    let mut written = 0;
    // Bounded by the per-tick budget and by the first batch that writes nothing (the head
    // is younger than `cut`, busy, or its device takes nothing now).
    while written < MAX_EVICT_PER_S && !cx.shutdown.is_set() {
        let n = shrink_inactive(cx, BATCH, Take::StagedBy(cut));
        // Each staged victim of the round is written at most once.
        debug_assert!(n <= BATCH, "a writeback round uncharges at most its batch");
        if n == 0 {
            break;
        }
        written += n;
    }
    cx.stats.add(Counter::SwpoutIdle, written as u64);
    written
}

/// Moves down a tier the pages of `dev` idle since epoch `cut` or before, among the
/// [`TIER_SCAN_SLOTS`] slots from `cursor` on (which moves past them), in the clusters that
/// were ever given out: a pool's slot space is twice the machine's memory (12 M slots here),
/// and scanned whole at this pace a page idle for its age waited minutes to move (a lap took
/// 188 s). A tick stops at the last such cluster; the next starts again from the first.
/// Returns the pages moved.
fn tier_down_from(cx: &Reclaim<'_>, dev: &SwapDevice, cursor: &mut u64, cut: Epoch, buf: &mut [AlignedPage]) -> usize {
    let nr_slots = dev.nr_slots();
    if nr_slots == 0 || dev.inuse_slots() == 0 {
        return 0;
    }
    let cluster = SWAPFILE_CLUSTER as u64;
    let mut moved = 0;
    let mut batch = [0u64; BATCH];
    let mut n = 0;
    let mut seen = 0;
    // Bounded: each round looks at one more cluster's slots (or ends), and stops after
    // TIER_SCAN_SLOTS slots.
    while seen < TIER_SCAN_SLOTS {
        let at = (*cursor % nr_slots / cluster) as u32;
        let Some(ci) = dev.used_cluster_from(at) else {
            *cursor = 0;
            break;
        };
        let from = if ci == at { *cursor % nr_slots } else { ci as u64 * cluster };
        let end = ((ci as u64 + 1) * cluster).min(nr_slots);
        for slot in from..end {
            *cursor = slot + 1;
            seen += 1;
            let idle = dev.stamp_of(slot).is_some_and(|e| e <= cut);
            if idle && dev.slot_info(slot).is_some_and(|i| !i.cached) {
                batch[n] = slot;
                n += 1;
            }
            if n == BATCH {
                moved += move_slots_down(cx, dev, &batch, buf);
                n = 0;
                if moved >= MAX_EVICT_PER_S {
                    return moved;
                }
            }
        }
        if end == nr_slots {
            *cursor = 0;
            break;
        }
    }
    moved + move_slots_down(cx, dev, &batch[..n], buf)
}
