//! Idle aging: finding the pages the application no longer touches, without waiting for the
//! limit, and sending them out once idle long enough (`IdleAging`).
//!
//! User space sees no accessed bits, so a page's use is tested the way the kernel's NUMA
//! balancing tests it: by taking the mapping away. Once a second (twice while it finds idle
//! pages) the background reclaimer moves a slice of the oldest resident pages into the swap cache ([`deactivate`]: the
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
//! tick's pages still out brings it back at once, and [`IDLE_SPEEDUP`] times that, then four
//! times more at the next such tick (up to [`MAX_IDLE_SPEEDUP`] times [`MAX_DEACTIVATE_PER_S`]),
//! with a tick every half second, while half or more stay out; a tick that finds under a
//! quarter divides the speed-up by four. Idle pages cost their move only, and hot and cold
//! pages lie in runs along the LRU (in the order the program allocated them), so one hot
//! slice among cold ones does not stop the search. A tick's slice is tested in parts
//! ([`SCAN_PART_PAGES`]) between the background reclaimer's rounds, and waits while the
//! tree is over a goal its automatic budget set: the reclaim that takes the pages found
//! idle runs on this thread. What each tick found goes to the automatic budget
//! (`budget::IdleSample`), which takes the pages found untouched as soon as they are 4 MiB,
//! and at its tick otherwise.
//!
//! With `IdleAging::Evict(age)`, staged pages that have been idle for `age` are written to
//! their device, oldest first ([`evict_idle`]). With a tier age (`PagerBuilder::tier_age`;
//! twice `age` under `Evict` unless given), pages out of their regions that long, untouched,
//! on a device with a tier below go down a tier ([`tier_down`]): with aging off or observing
//! too, in which case a tick does only that (no scan of the resident pages is needed, a
//! page's age out of RAM is stamped when it leaves). Reclaim under the
//! limit needs nothing more to pick by age: it writes the swap cache's oldest staged pages
//! first, and once the scan has run those are the longest idle.
//!
//! Locking: none of its own; it runs inside an `InFlight` (a fork's hold stops it) and takes
//! pages through their busy bits, in the same rounds as reclaim. Invariant: every loop is
//! bounded by a per-tick page or slot budget.

use std::sync::atomic::Ordering;

use super::accounting::shared_goal_pending;
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
/// How many times faster than its pace the scan goes once half of what it tests stays
/// untouched (then up to [`MAX_IDLE_SPEEDUP`] times): the pages it finds idle are then most
/// of its cost-free work, and what an automatic budget follows a shrinking working set down
/// by (`budget::Budget`).
pub const IDLE_SPEEDUP: usize = 4;
/// How far the speed-up goes (four times more) while the next tick finds half of its pages
/// idle again (256 MiB/s asked; one thread moves about 160 MiB/s on this VM, at a TLB
/// shootdown of 25 us a page, seven eighths of each period): the 256 MiB a phase stopped
/// using are tested in about 2 s, not 4 at [`IDLE_SPEEDUP`], within the 5 s `--auto` has
/// to follow a fivefold drop. A tick at this
/// pace among hot pages costs the program up to 32 K swap-cache hits, a few microseconds
/// each, before the next divides it by four.
pub const MAX_IDLE_SPEEDUP: usize = 16;
/// Pages a part of a tick's slice tests at a time (about 25 ms here).
const SCAN_PART_PAGES: u64 = 1024;
/// The scan's tick while it finds idle pages: a page untouched for half a second (62 ms at
/// least, see [`Aging::resume`]) is judged idle then (the automatic budget
/// judges what it gets wrong by the stalls that follow).
const FINDING_PERIOD_US: u64 = 500_000;
/// How long a tick's slice waits for the reclaim of an automatic budget's goal at most: a
/// goal the devices cannot take does not stop the scan.
const GOAL_WAIT_US: u64 = 1_000_000;
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
    /// Pages the last tick moved out, of those the pages it staged in the swap cache (where
    /// a touch shows: zero pages are freed at once, and a touch then faults in a zero page,
    /// as if they had been in use or not), and the counts then of
    /// aged pages that had come back and that reclaim had written out: the sample the next
    /// tick reports (`budget::IdleSample`).
    last_moved: usize,
    last_staged: usize,
    last_refaults: u64,
    last_aged_written: u64,
    /// How many times its pace the scan goes for the idle pages it finds (1: it found few).
    idle_speedup: usize,
    /// Pages of this tick's slice still to test, and the slice.
    scan_left: u64,
    last_asked: usize,
    /// Rounds of `deactivate` left to this tick's slice.
    calls_left: usize,
    /// Since when this tick's slice waits for a budget's goal (`None`: it did not wait).
    waiting_since_us: Option<u64>,
}

impl Aging {
    /// A scan for `cx`, or `None` when its idle aging is off and nothing moves down a tier
    /// for its age.
    pub fn new(cx: &Reclaim<'_>) -> Option<Aging> {
        (cx.idle_aging != IdleAging::Off || cx.tier_age.is_some()).then(|| Aging {
            last_us: 0,
            pass_rate: 0,
            pass_ticks_left: 0,
            slowdown: 1,
            pass_moved: 0,
            refaults_at_start: 0,
            tier_cursor: vec![0; cx.devices.devices().len()],
            last_moved: 0,
            last_staged: 0,
            last_refaults: 0,
            last_aged_written: 0,
            idle_speedup: 1,
            scan_left: 0,
            last_asked: 0,
            calls_left: 0,
            waiting_since_us: None,
        })
    }

    /// Runs once a second (every [`FINDING_PERIOD_US`] while it finds idle pages): reports
    /// the last tick's sample and sets the slice of the resident pages this tick tests (in
    /// parts, by [`Aging::resume`], from here and between ticks) unless aging is off, then
    /// (with `Evict`) sends out those idle long enough, and (with a tier age) moves down a
    /// tier the pages out of RAM that long. Returns whether some of the slice is left.
    pub fn tick(&mut self, cx: &Reclaim<'_>, now_us: u64, buf: &mut [AlignedPage]) -> bool {
        if now_us < self.last_us + self.period_us() || cx.charge.reclaim_held.load(Ordering::Acquire) {
            return self.resume(cx, now_us);
        }
        self.last_us = now_us;
        let Some(in_flight) = InFlight::enter(cx) else { return false };
        if cx.idle_aging != IdleAging::Off {
            self.start_slice(cx);
        }
        let now = now_epoch();
        if let IdleAging::Evict(age) = cx.idle_aging {
            evict_idle(cx, now.saturating_sub(age_epochs(age)));
        }
        if let Some(age) = cx.tier_age {
            self.tier_down(cx, now.saturating_sub(age_epochs(age)), buf);
        }
        drop(in_flight);
        self.resume(cx, now_us)
    }

    /// Sets the slice of the resident pages this tick tests (in parts, by [`Aging::resume`])
    /// and reports the last tick's sample.
    fn start_slice(&mut self, cx: &Reclaim<'_>) {
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
        // This tick's pages are the next sample's (see `aged_written_pages`).
        cx.charge.aged_cohort_epoch.store(now_epoch(), Ordering::Relaxed);
        // At most MAX_IDLE_SPEEDUP times the bounded rate (asserted above), for the tick's
        // share of a second, and half the pages in their regions; what the last tick left
        // untested is dropped, not carried.
        let slice = (self.pass_rate * self.idle_speedup) as u64 * self.period_us() / 1_000_000;
        self.scan_left = slice.min((in_regions / 2).max(BATCH) as u64);
        self.last_asked = self.scan_left as usize;
        // A round that moves nothing may have spared a run of referenced pages (each looks at
        // 4 batches of the LRU at most), so rounds go on, up to twice as many as the slice
        // needs: at the normal pace, at most 8 slices' entries looked at, under a pass's worth
        // (10 slices), so that a page spared is not met again, and staged, in the same tick;
        // sped up, one may be (a swap-cache hit).
        self.calls_left = 2 * self.last_asked.div_ceil(BATCH);
        self.waiting_since_us = None;
    }

    /// Once a second, twice while the scan finds idle pages: the program's working set
    /// shrank, and what it left is found (and judged) in half the time.
    fn period_us(&self) -> u64 {
        if self.idle_speedup > 1 {
            FINDING_PERIOD_US
        } else {
            1_000_000
        }
    }

    /// Tests the next part of this tick's slice, [`SCAN_PART_PAGES`] at most, in flight
    /// on its own (a fork waits for one part, not for a slice: 64 K pages take 1.6 s on this
    /// VM, a TLB shootdown a page). Not in the last eighth of the tick's period: a page is
    /// judged an eighth of it at least after it left. Waits (up to [`GOAL_WAIT_US`]) while
    /// the tree is above a goal an automatic budget set (`SharedCharge::goal_pages`): the
    /// pages found idle go first, and the reclaim that takes them runs on this thread.
    /// Returns whether it tested pages and some of the slice is left.
    fn resume(&mut self, cx: &Reclaim<'_>, now_us: u64) -> bool {
        if self.scan_left == 0 {
            return false;
        }
        if shared_goal_pending(cx.charge) && now_us < *self.waiting_since_us.get_or_insert(now_us) + GOAL_WAIT_US {
            return false;
        }
        if now_us >= self.last_us + self.period_us() * 7 / 8 {
            self.scan_left = 0;
            return false;
        }
        let Some(_in_flight) = InFlight::enter(cx) else { return false };
        let want = self.scan_left.min(SCAN_PART_PAGES) as usize;
        // A part's rounds, out of the slice's: a fork waits for a bounded part.
        let mut rounds = self.calls_left.min(2 * want.div_ceil(BATCH));
        self.calls_left -= rounds;
        let (moved, staged) = deactivate(cx, want, &mut rounds);
        self.calls_left += rounds;
        // A part moves at most what it was asked for.
        debug_assert!(moved <= want, "the scan moved more than its part");
        self.pass_moved += moved;
        self.last_moved += moved;
        self.last_staged += staged;
        self.scan_left -= moved as u64;
        // Fewer than asked with rounds left: the LRU ran dry or the devices are full; with
        // none left in the slice, the LRU's head is referenced pages. Either way the rest
        // waits for the next tick.
        if moved < want && (rounds > 0 || self.calls_left == 0) {
            self.scan_left = 0;
        }
        self.scan_left > 0
    }

    /// Reports what the last tick found to the automatic budget (`budget::IdleSample`):
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
        // Only the staged pages were tested: a page freed zero, touched or not, never comes
        // back as an aged fault. (Clean pages were dropped once, and counted out they made
        // every clean page look idle: the law cut a working set of clean pages to its floor,
        // 2 MiB, again and again, at half the time stalled,
        // `a_working_set_of_clean_pages_is_not_taken_for_idle`; they are staged clean now.)
        let staged = std::mem::take(&mut self.last_staged);
        debug_assert!(staged <= moved, "the pages staged are some of those moved");
        // Written or not, a page that did not come back was not in use: the pace follows it.
        let out = staged.saturating_sub(back);
        // A sample smaller than half what the tick asked for (the scan waited while the
        // budget's goal was reclaimed) is too small to slow down on: the hot pages the
        // second chance spared sit at the LRU's head, and such a sample is mostly them.
        let representative = moved * 2 >= self.last_asked || moved >= SCAN_PART_PAGES as usize;
        let waited = self.waiting_since_us.is_some();
        self.idle_speedup = match self.idle_speedup {
            s if waited && !representative => s,
            _ if staged < BATCH => 1,
            // A quarter at a time: hot and cold pages lie in runs along the LRU (a program's
            // pages come in, and go cold, in the order it allocated them), and one slice of
            // hot pages among cold ones held the scan at its normal pace for the 4 s its
            // 64 MiB took to test (measured, a working set dropped from 320 to its first
            // 64 MiB).
            s if out * 4 < staged && representative => s / IDLE_SPEEDUP,
            1 if out * 2 >= staged => IDLE_SPEEDUP,
            s if out * 2 >= staged => (s * IDLE_SPEEDUP).min(MAX_IDLE_SPEEDUP),
            s => s,
        };
        self.idle_speedup = self.idle_speedup.max(1);
        debug_assert!((1..=MAX_IDLE_SPEEDUP).contains(&self.idle_speedup), "idle speed-up within its bounds");
        if self.idle_speedup > 1 {
            self.slowdown = 1;
            self.pass_ticks_left = self.pass_ticks_left.min(PASS_S);
        }
        let tested = staged.saturating_sub(written);
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
        // Counted batch by batch (`move_down_counted`): a tick moves up to 64 MiB.
        debug_assert!(moved <= devices.len() * (MAX_EVICT_PER_S + BATCH), "a tick's tier moves are bounded");
    }
}

/// Moves up to `want` of the oldest resident pages into the swap cache (see the module
/// doc), with at most `calls` rounds of [`shrink_active`] (counted down). Returns the pages
/// moved, and of those the pages staged in the swap cache (clean ones too; not zero ones).
fn deactivate(cx: &Reclaim<'_>, want: usize, calls: &mut usize) -> (usize, usize) {
    let (mut moved, mut staged) = (0, 0);
    // Bounded by `calls`, and by the LRU running dry.
    while moved < want && *calls > 0 && !cx.devices.is_full() && !cx.shutdown.is_set() && !cx.lru.is_empty() {
        *calls -= 1;
        let s = shrink_active(cx, BATCH.min(want - moved), Stager::Aging);
        // A round moves at most the victims it was asked for, and uncharges only some of those.
        debug_assert!(s.moved <= BATCH.min(want - moved) && s.uncharged <= s.moved);
        moved += s.moved;
        staged += s.moved - s.uncharged;
        if s.uncharged > 0 {
            // Zero pages were freed: out as reclaim sends them.
            cx.devices.flush_frees();
        }
    }
    (moved, staged)
}

/// An age in idle-age epochs, one at least.
fn age_epochs(age: std::time::Duration) -> Epoch {
    (age.as_millis() as u64 / EPOCH_MS).max(1)
}

/// Writes to their devices the staged pages that left their regions in epoch `cut` or
/// before, oldest first. Returns the pages written.
fn evict_idle(cx: &Reclaim<'_>, cut: Epoch) -> usize {
    let mut written = 0;
    // Bounded by the per-tick budget and by the first batch that writes nothing (the head
    // is younger than `cut`, busy, or its device takes nothing now).
    while written < MAX_EVICT_PER_S && !cx.shutdown.is_set() {
        let n = shrink_inactive(cx, BATCH, Take::StagedBy(cut)).uncharged;
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
            let idle = dev.stamp_of(slot).is_some_and(|s| s.epoch <= cut);
            if idle && dev.slot_info(slot).is_some_and(|i| !i.cached) {
                batch[n] = slot;
                n += 1;
            }
            if n == BATCH {
                moved += move_down_counted(cx, dev, &batch, buf);
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
    moved + move_down_counted(cx, dev, &batch[..n], buf)
}

/// Moves a batch of idle slots down a tier and counts them at once: a tick's moves take
/// seconds, and a count made at its end showed pages below that no counter had seen.
fn move_down_counted(cx: &Reclaim<'_>, dev: &SwapDevice, slots: &[u64], buf: &mut [AlignedPage]) -> usize {
    let moved = move_slots_down(cx, dev, slots, buf);
    cx.stats.add(Counter::WritebackIdle, moved as u64);
    moved
}
