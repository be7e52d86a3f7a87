//! Reclaim: the resident charge, watermarks, victim selection and the two-stage swap-out.
//!
//! Accounting. `resident_pages` counts application pages in RAM: mapped in a region or
//! staged in the swap cache. A fault charges a page *before* mapping it, with a
//! compare-and-swap that never takes the count above the limit; at the limit it reclaims
//! directly first. Moving a page into the swap cache does not change the count; writing it
//! back and dropping its staging page uncharges it. So the pages in RAM never exceed the
//! limit, except when nothing at all can be reclaimed (every device full): then the charge
//! goes through, is counted in `limit_overrun`, and no data is lost. The bound the tests
//! check, with `mincore(2)` rather than the counters, is `limit + RECLAIM_BATCH_PAGES`,
//! which leaves room for a change of implementation; this one stays at the limit.
//!
//! Victims. Resident pages sit in a FIFO (`active`) in the order they came in: oldest first.
//! Pages a stream brought in (a readahead window, a first-touch fault-around) sit in a FIFO
//! of their own (`streamed`) that reclaim takes first, down to a reserve for the windows
//! streams are working through (`limit / 16`, while streams run): the kernel's use-once
//! rule, which keeps a sequential scan from pushing out the pages of everything else. User
//! space sees no accessed bits, so whether a page was used again is not known; that it came
//! in as part of a stream is. Reclaim moves the oldest out of their region with
//! `UFFDIO_MOVE` into the staging pages of freshly allocated slots (batched: runs of
//! consecutive pages with consecutive slots move with one ioctl), and queues them on
//! `inactive`, the swap cache. A page that faults back from there is marked referenced and
//! spared once when it next reaches the head of a FIFO (second chance; a streamed page so
//! spared moves to `active`). Pages leaving the swap cache are written to their slot in
//! batches, their staging pages dropped, and uncharged. A page found all zero when staged
//! keeps no slot (`swpout_zero`).
//!
//! Watermarks. With `gap = max(32 pages, limit / 64)`, `high = limit - gap` and
//! `low = limit - 2 * gap`. A fault that takes the charge above `high` reclaims one batch in
//! the faulting context (memcg's `memory.high`); a charge that would pass the limit reclaims
//! until it fits (direct reclaim, counted in `allocstall`). The background reclaimer brings an
//! idle pager from above `high` down to `low`, so a burst of faults after a pause starts with
//! headroom. Reclaim keeps the swap cache near `max(64 pages, limit / 32)`.
//!
//! Locking: the queues are lock-free; pages are owned through their busy bits. A reclaim
//! round holds at most [`MAX_REGIONS_PER_ROUND`] region guards and allocates nothing, so
//! direct reclaim may run inside a SIGBUS handler (not on the lock-free route, which never
//! reclaims).

use std::sync::atomic::Ordering;

use arrayvec::ArrayVec;

use crate::backend::{AlignedPage, BackendError, WriteReq};
use crate::error::{Error, Result};
use crate::fault::Route;
use crate::pager::{BackgroundReclaim, PagerShared, RECLAIM_BATCH_PAGES};
use crate::region::{PageRef, PageState, Pte, RegionSet, REGIONS};
use crate::stats::Counter;
use crate::swap::SwapEntry;
use crate::uffd::{RangeResult, PAGE_SIZE};

const BATCH: usize = RECLAIM_BATCH_PAGES;
/// Stale queue entries one round may drop (bounds a round's work; stale entries cost a load
/// and a compare each).
const MAX_STALE_PER_ROUND: usize = 64 * BATCH;
/// Direct-reclaim rounds that free nothing before a charge (or `reclaim_to_limit`) stops
/// yielding and starts sleeping between rounds.
const MAX_FRUITLESS_ROUNDS: usize = 16;

/// `(high, low)` watermarks for a limit, in pages.
pub(crate) fn watermarks(limit: usize) -> (usize, usize) {
    let gap = BATCH.max(limit / 64);
    (limit.saturating_sub(gap), limit.saturating_sub(2 * gap))
}

/// Pages the reclaimer keeps staged in the swap cache.
pub(crate) fn swapcache_target(limit: usize) -> usize {
    (2 * BATCH).max(limit / 32)
}

/// How long a charge waits, in all, for room while every victim it finds is busy in other
/// threads' faults and device writes (the devices have room) before it charges over the
/// limit (`limit_overrun_busy`). Well below `fault::BUSY_WAIT_LIMIT_NS` (10 s): the waiting
/// thread owns its faulting page, and another thread faulting on that page waits for it.
pub(crate) const CHARGE_WAIT_LIMIT_NS: u64 = 250_000_000;
/// How long a charge waits while no thread makes any progress at all (nothing written
/// back, dropped or found zero anywhere) before it gives up sooner.
const CHARGE_STALL_LIMIT_NS: u64 = 100_000_000;
/// First and longest sleep between fruitless rounds of a charge.
const CHARGE_BACKOFF_MIN_NS: u64 = 20_000;
const CHARGE_BACKOFF_MAX_NS: u64 = 1_000_000;

/// Pages uncharged by reclaim so far, over every thread: written back, dropped clean, or
/// found zero. What a waiting charge measures others' progress by.
fn reclaim_progress(p: &PagerShared) -> u64 {
    p.stats.sum(Counter::Pswpout) + p.stats.sum(Counter::SwpoutClean) + p.stats.sum(Counter::SwpoutZero)
}

/// Sleeps `ns` with `nanosleep(2)`, which is async-signal-safe and allocates nothing (a
/// charge may run in a SIGBUS handler).
fn nap(ns: u64) {
    let ts = libc::timespec { tv_sec: (ns / 1_000_000_000) as libc::time_t, tv_nsec: (ns % 1_000_000_000) as _ };
    // SAFETY: nanosleep reads `ts` and writes nothing (no remainder pointer); an early
    // wake-up by a signal only shortens the nap.
    unsafe { libc::nanosleep(&ts, std::ptr::null_mut()) };
}

/// Charges `n` pages against the limit, reclaiming directly when at it (see the module doc).
///
/// While its reclaim rounds find nothing (every victim busy in other threads' faults and
/// writes, which happens with many more faulting threads than CPUs on a slow device), it
/// yields for `MAX_FRUITLESS_ROUNDS` rounds, then sleeps with an exponential back-off and
/// tries again, for up to `CHARGE_WAIT_LIMIT_NS`, or `CHARGE_STALL_LIMIT_NS` during which no
/// thread reclaimed anything. Only then, or at once when every device is full or on the
/// lock-free route (which may not reclaim), does it charge over the limit: counted in
/// `limit_overrun` (and `limit_overrun_busy` when the devices had room). Nothing is lost;
/// reclaim takes the extra pages later.
pub(crate) fn charge(p: &PagerShared, n: usize, route: Route) {
    let mut stalled = false;
    let mut fruitless = 0;
    let mut backoff_ns = CHARGE_BACKOFF_MIN_NS;
    // (when the waiting began, when progress was last seen, the progress then)
    let mut waiting: Option<(u64, u64, u64)> = None;
    // Terminates: a failed compare-exchange means another thread changed the charge (its
    // progress); a fruitful round resets nothing but the back-off and uncharges pages;
    // fruitless rounds sleep, and the wait is bounded by CHARGE_WAIT_LIMIT_NS in all.
    loop {
        let cur = p.resident_pages.load(Ordering::Acquire);
        let limit = p.limit_pages.load(Ordering::Acquire);
        if cur + n <= limit && shared_room(p, n) {
            if p.resident_pages.compare_exchange_weak(cur, cur + n, Ordering::AcqRel, Ordering::Acquire).is_ok() {
                shared_add(p, n);
                note_peak(p, cur + n);
                break;
            }
            continue;
        }
        if p.reclaim_held.load(Ordering::Acquire) {
            // Pager::prepare_fork: every page comes in before the fork; none may go out.
            force_charge(p, n);
            return;
        }
        if route == Route::SignalLockFree {
            force_charge(p, n);
            p.stats.inc(Counter::LimitOverrun);
            break;
        }
        if !stalled {
            p.stats.inc(Counter::Allocstall);
            stalled = true;
        }
        if reclaim_round(p, true).any() {
            fruitless = 0;
            backoff_ns = CHARGE_BACKOFF_MIN_NS;
            continue;
        }
        if p.devices.is_full() {
            // Nothing can go anywhere: keep the page, count the overrun.
            force_charge(p, n);
            p.stats.inc(Counter::LimitOverrun);
            break;
        }
        fruitless += 1;
        if fruitless <= MAX_FRUITLESS_ROUNDS {
            std::thread::yield_now();
            continue;
        }
        // The victims are busy in other threads' writes: sleep, so that they get the CPU to
        // finish them, rather than spin or give up.
        let now = crate::mapping::now_ns();
        let progress = reclaim_progress(p);
        let (since, last_seen, seen) = waiting.get_or_insert((now, now, progress));
        if progress != *seen {
            (*last_seen, *seen) = (now, progress);
        }
        if now - *since > CHARGE_WAIT_LIMIT_NS || now - *last_seen > CHARGE_STALL_LIMIT_NS {
            force_charge(p, n);
            p.stats.inc(Counter::LimitOverrun);
            p.stats.inc(Counter::LimitOverrunBusy);
            break;
        }
        nap(backoff_ns);
        backoff_ns = (backoff_ns * 2).min(CHARGE_BACKOFF_MAX_NS);
    }
    if route != Route::SignalLockFree {
        task_reclaim(p);
    }
}

/// Charges `n` pages whatever the limit (the callers count why).
fn force_charge(p: &PagerShared, n: usize) {
    let now = p.resident_pages.fetch_add(n, Ordering::AcqRel) + n;
    shared_add(p, n);
    note_peak(p, now);
}

/// Whether `n` more pages fit under the shared charge, if the pager has one. Read without a
/// lock: pagers that charge at the same moment may each see the same room, so the shared
/// charge can pass its limit by at most one charge (`n` pages, a readahead window at most)
/// per thread charging at once, and reclaim brings it back.
fn shared_room(p: &PagerShared, n: usize) -> bool {
    match p.shared_charge {
        None => true,
        Some(t) => t.resident_pages.load(Ordering::Acquire) + n <= t.limit_pages.load(Ordering::Acquire),
    }
}

fn shared_add(p: &PagerShared, n: usize) {
    if let Some(t) = p.shared_charge {
        let now = t.resident_pages.fetch_add(n, Ordering::AcqRel) + n;
        if now > t.resident_peak_pages.load(Ordering::Relaxed) {
            t.resident_peak_pages.fetch_max(now, Ordering::Relaxed);
        }
    }
}

pub(crate) fn shared_sub(p: &PagerShared, n: usize) {
    if let Some(t) = p.shared_charge {
        t.resident_pages.fetch_sub(n, Ordering::AcqRel);
    }
}

/// Whether the shared charge, if any, is above its high (`low == false`) or low watermark:
/// then every pager under it reclaims its own pages in the background, as a memcg reclaims
/// from all its tasks' memory.
fn shared_above(p: &PagerShared, low: bool) -> bool {
    match p.shared_charge {
        None => false,
        Some(t) => {
            let (high, lowmark) = watermarks(t.limit_pages.load(Ordering::Acquire));
            t.resident_pages.load(Ordering::Acquire) > if low { lowmark } else { high }
        }
    }
}

/// Records a new high of the charge (`Stats::resident_peak_pages`). The load first keeps the
/// common case (no new peak) a read of a shared line, not a write.
fn note_peak(p: &PagerShared, resident: usize) {
    if resident > p.resident_peak_pages.load(Ordering::Relaxed) {
        p.resident_peak_pages.fetch_max(resident, Ordering::Relaxed);
    }
}

/// Above the high watermark the faulting thread reclaims one batch itself, as memcg does at
/// `memory.high` (memcg has no kswapd: all its reclaim runs in the charging task). On these
/// VMs that is also the cheap place: `UFFDIO_MOVE` flushes the TLB, and while another thread
/// of the process runs on another CPU the flush is a synchronous IPI (9.7 µs instead of
/// 1.05 µs per single-page move, see BENCHMARKS.md), so reclaim from a second CPU would slow
/// every fault it overlaps with.
fn task_reclaim(p: &PagerShared) {
    if p.reclaim_held.load(Ordering::Acquire) {
        return;
    }
    let (high, _) = watermarks(p.limit_pages.load(Ordering::Relaxed));
    if p.resident_pages.load(Ordering::Acquire) <= high && !shared_above(p, false) {
        return;
    }
    match p.background_reclaim {
        BackgroundReclaim::WhenIdle => {
            reclaim_round(p, true);
        }
        BackgroundReclaim::Always => {
            // Thread::unpark is an atomic swap and, if the thread sleeps, a futex wake: no
            // allocation, no lock, so it is safe in a signal handler.
            if let Some(t) = p.reclaimer.get() {
                t.unpark();
            }
        }
    }
}

pub(crate) fn uncharge(p: &PagerShared, n: usize) {
    shared_sub(p, n);
    let old = p.resident_pages.fetch_sub(n, Ordering::AcqRel);
    assert!(old >= n, "uswap invariant: resident charge underflow ({old} - {n}): an uncharge without its charge");
}

/// Queues a page that just became resident at the tail of the FIFO.
pub(crate) fn lru_add(p: &PagerShared, r: PageRef) {
    if p.active.push(r.pack()).is_err() {
        p.stats.inc(Counter::LruOverflow);
    }
}

/// Queues a page a stream brought in at the tail of the use-once FIFO (the other FIFO if
/// that one is full).
pub(crate) fn lru_add_streamed(p: &PagerShared, r: PageRef) {
    // A load first: the common case writes nothing, so CPUs do not bounce the line.
    if p.streamed_rounds_left.load(Ordering::Relaxed) < STREAMED_RESERVE_ROUNDS {
        p.streamed_rounds_left.store(STREAMED_RESERVE_ROUNDS, Ordering::Relaxed);
    }
    if let Err(v) = p.streamed.push(r.pack()) {
        if p.active.push(v).is_err() {
            p.stats.inc(Counter::LruOverflow);
        }
    }
}

/// Reclaim rounds a reserve outlives the last page queued as a stream's.
const STREAMED_RESERVE_ROUNDS: usize = 64;

/// Pages of the use-once FIFO that reclaim leaves alone while it can take others: `limit /
/// 16`, at least four maximum windows, while streams are running (a page was queued there
/// within the last `STREAMED_RESERVE_ROUNDS` rounds); afterwards none, so the last pages of
/// a finished stream do not sit in memory while everything else is reclaimed.
fn streamed_reserve(p: &PagerShared) -> usize {
    let left = p.streamed_rounds_left.load(Ordering::Relaxed);
    if left == 0 {
        return 0;
    }
    // Racy on purpose: a lost decrement only keeps the reserve a round longer.
    p.streamed_rounds_left.store(left - 1, Ordering::Relaxed);
    (p.limit_pages.load(Ordering::Relaxed) / 16).max(4 * p.readahead_max_pages)
}

/// Queues a page a swap-in or fault-around of `nr_pages` (the faulting page among them)
/// just mapped. A stream's pages go on the use-once FIFO: its readahead pages always, the
/// faulting page too once the window shows a stream (the size rule gives 4 pages or more
/// only after hits). Others go on `active`.
pub(crate) fn lru_add_mapped(p: &PagerShared, r: PageRef, faulting: bool, nr_pages: usize) {
    if !faulting || nr_pages >= 4 {
        lru_add_streamed(p, r);
    } else {
        lru_add(p, r);
    }
}

/// Where a popped page goes back to.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Queue {
    Active,
    Streamed,
    Inactive,
}

fn requeue(p: &PagerShared, q: Queue, r: PageRef) {
    match q {
        Queue::Streamed => lru_add_streamed(p, r),
        Queue::Active => lru_add(p, r),
        Queue::Inactive => {
            if p.inactive.push(r.pack()).is_err() {
                p.stats.inc(Counter::LruOverflow);
            }
        }
    }
}

/// What a reclaim round achieved.
#[derive(Debug, Default, Clone, Copy)]
pub(crate) struct Progress {
    /// Pages moved from regions into the swap cache.
    pub moved: usize,
    /// Pages uncharged: written back, or found zero.
    pub uncharged: usize,
}

impl Progress {
    pub fn any(self) -> bool {
        self.moved + self.uncharged > 0
    }
}

/// One round: top the swap cache up towards its target with the oldest resident pages,
/// then, once it is at the target (or nothing more can be moved), write back its oldest
/// batch. A direct round that finds every staged page busy stages and writes a batch of its
/// own over the target (see below).
pub(crate) fn reclaim_round(p: &PagerShared, direct: bool) -> Progress {
    let target = swapcache_target(p.limit_pages.load(Ordering::Acquire));
    let mut progress = Progress::default();
    if p.swapcache_pages.load(Ordering::Acquire) < target && !p.devices.is_full() {
        let (moved, zero) = shrink_active(p, BATCH, direct);
        progress.moved = moved;
        progress.uncharged = zero;
    }
    if p.swapcache_pages.load(Ordering::Acquire) >= target || progress.moved == 0 {
        progress.uncharged += shrink_inactive(p, BATCH);
    }
    if direct && !progress.any() && !p.devices.is_full() {
        // Every staged page is busy in other threads' writes (many more faulting threads
        // than CPUs, a slow device): stage a batch of our own over the target and write it
        // back, rather than wait for theirs, as the kernel's direct reclaim starts writeback
        // of more pages while earlier ones are still under it. The swap cache then exceeds
        // its target by at most one batch per thread reclaiming at that moment; later
        // rounds stop topping it up until it is back under.
        let (moved, zero) = shrink_active(p, BATCH, direct);
        progress.moved += moved;
        progress.uncharged += zero;
        if moved > zero {
            progress.uncharged += shrink_inactive(p, BATCH);
        }
    }
    progress
}

/// Reclaims until the charge is at or below the limit (after the limit was lowered).
pub(crate) fn reclaim_to_limit(p: &PagerShared) -> Result<()> {
    let mut fruitless = 0;
    let mut backoff_us = 50u64;
    let mut busy_since: Option<std::time::Instant> = None;
    // Bounded by the number of charged pages (each fruitful round uncharges at least one)
    // and, while rounds find nothing, by `LIMIT_BUSY_WAIT`.
    while p.resident_pages.load(Ordering::Acquire) > p.limit_pages.load(Ordering::Acquire) {
        if reclaim_round(p, true).any() {
            fruitless = 0;
            backoff_us = 50;
            busy_since = None;
            continue;
        }
        fruitless += 1;
        if fruitless <= MAX_FRUITLESS_ROUNDS {
            std::thread::yield_now();
            continue;
        }
        let resident_bytes = (p.resident_pages.load(Ordering::Acquire) * PAGE_SIZE) as u64;
        let limit_bytes = (p.limit_pages.load(Ordering::Acquire) * PAGE_SIZE) as u64;
        if p.devices.is_full() {
            return Err(Error::LimitNotReached { resident_bytes, limit_bytes });
        }
        // Rounds that find nothing while the devices have room: the victims are busy in
        // faults or device writes of other threads. That is no reason to give up yet.
        let since = *busy_since.get_or_insert_with(std::time::Instant::now);
        if since.elapsed() > LIMIT_BUSY_WAIT {
            let waited_ms = since.elapsed().as_millis() as u64;
            return Err(Error::LimitBusy { resident_bytes, limit_bytes, waited_ms });
        }
        std::thread::sleep(std::time::Duration::from_micros(backoff_us));
        backoff_us = (backoff_us * 2).min(2_000);
    }
    p.devices.flush_frees();
    Ok(())
}

/// How long `set_resident_limit` keeps trying while every victim it finds is busy and the
/// devices have room, before it reports [`Error::LimitBusy`].
const LIMIT_BUSY_WAIT: std::time::Duration = std::time::Duration::from_secs(2);

#[derive(Clone, Copy)]
struct Victim {
    gi: usize,
    page: usize,
    /// The page's word as we locked it (busy set).
    pte: Pte,
}

/// Pops up to `nr` pages in `want` state from `queue`, skipping stale entries and giving
/// referenced resident pages their second chance. The pages come back locked.
fn pop_victims(p: &PagerShared, inactive: bool, nr: usize, guards: &mut RegionSet) -> ArrayVec<Victim, BATCH> {
    let want = if inactive { PageState::Cached } else { PageState::Resident };
    // Resident victims come from the use-once FIFO while it holds more than its reserve:
    // the windows streams are working through right now, which must not go before they are
    // used (a stream's next fault would read them again).
    let reserve = if inactive { 0 } else { streamed_reserve(p) };
    let pop = || -> Option<(u64, Queue)> {
        if inactive {
            return p.inactive.pop().map(|v| (v, Queue::Inactive));
        }
        let streamed = || p.streamed.pop().map(|v| (v, Queue::Streamed));
        let active = || p.active.pop().map(|v| (v, Queue::Active));
        if p.streamed.len() > reserve {
            streamed().or_else(active)
        } else {
            active().or_else(streamed)
        }
    };
    let mut victims = ArrayVec::new();
    // Stale entries (pages that moved on since they were queued) are dropped as they are
    // found, cheaply, and do not count against the scan; entries put back (busy, spared)
    // do, so a round ends even when every page is in use.
    let mut scanned = 0;
    let mut stale = 0;
    while victims.len() < nr.min(BATCH) && scanned < 4 * BATCH && stale < MAX_STALE_PER_ROUND {
        let Some((v, from)) = pop() else { break };
        let r = PageRef::unpack(v);
        let gi = match guards.get(p, r) {
            Ok(gi) => gi,
            Err(true) => {
                requeue(p, from, r);
                break;
            }
            Err(false) => {
                stale += 1;
                continue;
            }
        };
        let region = &guards.g[gi];
        let pte = region.load(r.page);
        if pte.state() != want || pte.gen() != r.page_gen {
            stale += 1;
            continue; // the page moved on since it was queued
        }
        scanned += 1;
        if pte.busy() {
            requeue(p, from, r);
            continue;
        }
        if !inactive && pte.referenced() {
            let spared = pte.with_referenced(false);
            if region.pte(r.page).compare_exchange(pte.0, spared.0, Ordering::AcqRel, Ordering::Acquire).is_ok() {
                p.stats.inc(Counter::Pgactivate);
            }
            // Used again: no longer use-once.
            requeue(p, Queue::Active, r);
            continue;
        }
        match region.try_lock(r.page, pte) {
            Some(locked) => victims.push(Victim { gi, page: r.page, pte: locked }),
            None => requeue(p, from, r),
        }
    }
    victims
}

/// Moves up to `nr` of the oldest resident pages into the swap cache. Returns the pages
/// moved, and of those the pages found all zero (uncharged at once).
fn shrink_active(p: &PagerShared, nr: usize, direct: bool) -> (usize, usize) {
    let mut guards = RegionSet::new();
    let mut victims = pop_victims(p, false, nr, &mut guards);
    if victims.is_empty() {
        if p.active.is_empty() && p.streamed.is_empty() {
            refill_active_by_scan(p);
        }
        return (0, 0);
    }
    victims.sort_unstable_by_key(|v| (v.gi, v.page));
    // Clean pages need no write: their slot still holds them. They leave the region as dirty
    // pages do, into their own slot's staging page, which is then dropped: `MADV_DONTNEED`
    // on the region itself would send a REMOVE event (see `events`). Runs of consecutive
    // pages with consecutive slots move with one call.
    let mut dropped = 0;
    let mut i = 0;
    while i < victims.len() {
        if !victims[i].pte.clean() {
            i += 1;
            continue;
        }
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
        let r =
            p.staging_uffd.move_pages(dev.staging_addr(e(i).offset()), region.page_addr(victims[i].page), len, false);
        let done = r.done_bytes(len) / PAGE_SIZE;
        if done > 0 {
            let _ = dev.staging.discard(e(i).offset() as usize * PAGE_SIZE, done * PAGE_SIZE);
        }
        for (k, v) in victims[i..j].iter().enumerate() {
            if k < done {
                region.store(v.page, v.pte.next(PageState::Swapped, Some(v.pte.entry())).with_referenced(false));
            } else {
                // Refused (read-only after mprotect, or gone: an event settles it) or not
                // tried: stays resident and clean.
                region.store(v.page, v.pte.unbusy());
                requeue(p, Queue::Active, guards.page_ref(v.gi, v.page, v.pte));
            }
        }
        if done < j - i {
            p.stats.inc(Counter::MoveRefused);
        }
        uncharge(p, done);
        p.clean_pages.fetch_sub(done, Ordering::Relaxed);
        p.stats.add(Counter::SwapRaUnused, victims[i..i + done].iter().filter(|v| v.pte.readahead()).count() as u64);
        dropped += done;
        i = j;
    }
    p.stats.add(Counter::SwpoutClean, dropped as u64);
    victims.retain(|v| !v.pte.clean());
    if victims.is_empty() {
        return (dropped, dropped);
    }
    let n = victims.len();
    let mut entries = [SwapEntry::new(0, 0); BATCH];
    let got = p.devices.alloc(&mut entries[..n]);
    if got < n {
        // No room on any device: these pages stay resident, nothing is lost.
        for v in &victims[got..] {
            guards.g[v.gi].store(v.page, v.pte.unbusy());
            requeue(p, Queue::Active, guards.page_ref(v.gi, v.page, v.pte));
        }
        p.stats.add(Counter::SwapAllocFail, (n - got) as u64);
        victims.truncate(got);
    }
    for (v, e) in victims.iter().zip(&entries) {
        let owner = guards.page_ref(v.gi, v.page, v.pte).owner();
        p.devices.device(*e).cache.set_owner(e.offset(), owner);
    }

    let mut to_free: ArrayVec<u64, BATCH> = ArrayVec::new();
    let mut uncharged = 0;
    let mut moved = 0u64;
    let mut i = 0;
    while i < victims.len() {
        // A run: same region, consecutive pages, consecutive slots on one device.
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
            // Through the staging area's descriptor: the destination is registered there.
            let r = p.staging_uffd.move_pages(
                dev.staging_addr(entries[k].offset()),
                region.page_addr(victims[k].page),
                len,
                false,
            );
            let done = r.done_bytes(len) / PAGE_SIZE;
            for m in k..k + done {
                let v = victims[m];
                let e = entries[m];
                if v.pte.readahead() {
                    p.stats.inc(Counter::SwapRaUnused);
                }
                if dev.staging.page_is_zero(e.offset() as usize * PAGE_SIZE) {
                    // Nothing worth a slot: drop the staged page, remember "zero".
                    let _ = dev.staging.discard(e.offset() as usize * PAGE_SIZE, PAGE_SIZE);
                    dev.cache.clear(e.offset());
                    to_free.push(e.bits());
                    region.store(v.page, v.pte.next(PageState::Zero, None).with_referenced(false));
                    uncharge(p, 1);
                    uncharged += 1;
                    p.stats.inc(Counter::SwpoutZero);
                } else {
                    debug_assert_eq!(dev.cache.lookup(e.offset()).map(|i| i.cached), Some(false));
                    dev.cache.set_cached(e.offset(), true);
                    p.swapcache_pages.fetch_add(1, Ordering::AcqRel);
                    let new = v.pte.next(PageState::Cached, Some(e)).with_referenced(false);
                    region.store(v.page, new);
                    requeue(p, Queue::Inactive, guards.page_ref(v.gi, v.page, new));
                }
                moved += 1;
            }
            k += done;
            if let RangeResult::Partial { errno, .. } = r {
                let v = victims[k];
                let e = entries[k];
                dev.cache.clear(e.offset());
                if errno == libc::ENOENT {
                    // Not there: the application unmapped, moved or discarded it, and the event
                    // that says which settles the page (see `events`). Until then it stays as
                    // it is: turning it into a zero page would lose a page that `mremap` moved.
                    to_free.push(e.bits());
                    region.store(v.page, v.pte.unbusy());
                    requeue(p, Queue::Active, guards.page_ref(v.gi, v.page, v.pte));
                    p.stats.inc(Counter::MoveRefused);
                } else {
                    // Pinned, shared or otherwise refused: it stays where it is. A slot whose
                    // staging page is unexpectedly occupied (EEXIST) is not reused.
                    debug_assert_ne!(errno, libc::EEXIST, "staging page of slot {e:?} occupied");
                    if errno != libc::EEXIST {
                        to_free.push(e.bits());
                    }
                    region.store(v.page, v.pte.unbusy());
                    requeue(p, Queue::Active, guards.page_ref(v.gi, v.page, v.pte));
                    p.stats.inc(Counter::MoveRefused);
                }
                k += 1;
            }
        }
        i = j;
    }
    p.stats.add(if direct { Counter::PgstealDirect } else { Counter::PgstealBackground }, moved);
    p.devices.free_now(&mut to_free);
    (moved as usize + dropped, uncharged + dropped)
}

/// Writes back up to `nr` of the oldest staged pages. Returns the pages uncharged.
///
/// Each page goes first to its own slot. A device may decline a page (a pool at its cap,
/// or an incompressible page it passes on): the page then gets a slot on another device and
/// is written there, in priority order. A page that no device takes, or whose write fails,
/// stays staged in RAM (still charged) and is retried in a later round.
fn shrink_inactive(p: &PagerShared, nr: usize) -> usize {
    let mut guards = RegionSet::new();
    let mut victims = pop_victims(p, true, nr, &mut guards);
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
                requeue(p, Queue::Inactive, guards.page_ref(v.gi, v.page, v.pte));
                p.stats.inc(Counter::SwapAllocFail);
            }
        }
        pending.clear();
        pending.extend(rejected.iter().copied().take(got));
    }
    p.devices.free_now(&mut to_free);
    uncharged
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
        let mut runs: ArrayVec<(usize, usize), BATCH> = ArrayVec::new();
        let mut reqs: ArrayVec<WriteReq<'_>, BATCH> = ArrayVec::new();
        let mut crcs = [0u32; BATCH];
        let mut s = i;
        while s < end {
            let src = |k: usize| victims[pending[k]].pte.entry();
            let mut t = s + 1;
            while t < end
                && targets[pending[t]].offset() == targets[pending[t - 1]].offset() + 1
                && src(t).device() == src(t - 1).device()
                && src(t).offset() == src(t - 1).offset() + 1
            {
                t += 1;
            }
            let sdev = p.devices.device(src(s));
            if dev.checksums.is_some() {
                for (k, crc) in crcs.iter_mut().enumerate().take(t).skip(s) {
                    *crc = sdev.staging.page_crc32c(src(k).offset() as usize * PAGE_SIZE);
                }
            }
            runs.push((s, t));
            reqs.push(WriteReq::new(
                targets[pending[s]].offset(),
                sdev.staging.pages(src(s).offset() as usize * PAGE_SIZE, t - s),
            ));
            s = t;
        }
        dev.backend.write(&mut reqs);
        for (req, &(s, t)) in reqs.iter().zip(&runs) {
            match &req.result {
                Ok(()) => {}
                Err(BackendError::Rejected { .. }) => {
                    rejected.extend(pending[s..t].iter().copied());
                    continue;
                }
                Err(_) => {
                    // The pages stay staged in RAM (still charged) and go round again.
                    for &k in &pending[s..t] {
                        let v = &victims[k];
                        guards.g[v.gi].store(v.page, v.pte.unbusy());
                        requeue(p, Queue::Inactive, guards.page_ref(v.gi, v.page, v.pte));
                        if targets[k] != v.pte.entry() {
                            to_free.push(targets[k].bits());
                        }
                    }
                    p.stats.add(Counter::SwpoutError, (t - s) as u64);
                    continue;
                }
            }
            // The staging pages must be empty before their slots can be freed and reused,
            // which may happen as soon as the pages are published as swapped.
            let first = victims[pending[s]].pte.entry();
            let sdev = p.devices.device(first);
            let _ = sdev.staging.discard(first.offset() as usize * PAGE_SIZE, (t - s) * PAGE_SIZE);
            for k in s..t {
                let v = &victims[pending[k]];
                let (old, new) = (v.pte.entry(), targets[pending[k]]);
                dev.set_checksum(new.offset(), crcs[k]);
                if new == old {
                    sdev.cache.set_cached(old.offset(), false);
                } else {
                    // Written elsewhere: the old slot held only the staging page.
                    sdev.cache.clear(old.offset());
                    to_free.push(old.bits());
                    dev.cache.set_owner(new.offset(), guards.page_ref(v.gi, v.page, v.pte).owner());
                }
                guards.g[v.gi].store(v.page, v.pte.next(PageState::Swapped, Some(new)));
            }
            let n = t - s;
            p.swapcache_pages.fetch_sub(n, Ordering::AcqRel);
            uncharge(p, n);
            uncharged += n;
            p.stats.add(Counter::Pswpout, n as u64);
        }
        i = end;
    }
    uncharged
}

/// Re-queues resident pages that have no queue entry (the queue overflowed at some point).
fn refill_active_by_scan(p: &PagerShared) {
    let resident = p.resident_pages.load(Ordering::Acquire);
    let staged = p.swapcache_pages.load(Ordering::Acquire);
    if resident <= staged {
        return;
    }
    let budget = p.active.capacity() / 2;
    let mut pushed = 0;
    REGIONS.for_each(|g| {
        if !std::ptr::eq(&*g.pager, p) {
            return;
        }
        for page in 0..g.nr_pages {
            if pushed >= budget {
                return;
            }
            let pte = g.load(page);
            if pte.state() == PageState::Resident && !pte.busy() {
                let r = PageRef { region_idx: g.index, region_gen: g.gen, page_gen: pte.gen(), page };
                if p.active.push(r.pack()).is_ok() {
                    pushed += 1;
                }
            }
        }
    });
}

/// Moves pages from devices that want room (a pool above its accept threshold) to the next
/// tier: reads them (checking their checksum), writes them to a device of lower priority, and
/// repoints their page-table words. Touches no page table of the process, so it costs the
/// application's CPU nothing (no TLB flush) and runs even while the application faults.
/// `buf` holds `BATCH` pages. Returns the pages moved.
pub(crate) fn device_writeback(p: &PagerShared, buf: &mut [AlignedPage]) -> usize {
    let mut moved = 0;
    for dev in p.devices.devices() {
        let mut slots = [0u64; BATCH];
        let n = dev.backend.writeback_candidates(&mut slots);
        if n == 0 {
            continue;
        }
        let mut guards = RegionSet::new();
        let mut victims: ArrayVec<Victim, BATCH> = ArrayVec::new();
        for &slot in &slots[..n] {
            let Some(info) = dev.cache.lookup(slot) else { continue };
            let r = PageRef::from_owner(info.owner);
            let Ok(gi) = guards.get(p, r) else { continue };
            let pte = guards.g[gi].load(r.page);
            let own = crate::swap::SwapEntry::new(dev.index, slot);
            if pte.state() != PageState::Swapped || pte.entry() != own {
                continue; // freed or moved since it was queued
            }
            if let Some(locked) = guards.g[gi].try_lock(r.page, pte) {
                victims.push(Victim { gi, page: r.page, pte: locked });
            }
        }
        if victims.is_empty() {
            continue;
        }
        // Read the pages; a page that does not read back cleanly stays where it is.
        let mut ok = [false; BATCH];
        for (k, v) in victims.iter().enumerate() {
            let e = v.pte.entry();
            let mut req = [crate::backend::ReadReq::new(e.offset(), &mut buf[k..k + 1])];
            dev.backend.read(&mut req);
            ok[k] = req[0].result.is_ok() && dev.checksum_ok(e.offset(), &buf[k].0);
            if !ok[k] {
                let addr = guards.g[v.gi].page_addr(v.page);
                p.record_error(addr, e, crate::pager::PageErrorKind::ReadFailed);
            }
        }
        // Slots on devices of lower priority only: writeback goes down the tiers.
        let mask =
            p.devices.devices().iter().filter(|d| d.priority >= dev.priority).fold(0u64, |m, d| m | 1 << d.index);
        let mut targets = [crate::swap::SwapEntry::new(0, 0); BATCH];
        let want = victims.len();
        let got = p.devices.alloc_excluding_mask(mask, &mut targets[..want]);
        let mut to_free: ArrayVec<u64, BATCH> = ArrayVec::new();
        let mut k = 0;
        while k < want {
            let mut t = k + 1;
            while t < got
                && ok[t] == ok[k]
                && targets[t].device() == targets[k].device()
                && targets[t].offset() == targets[t - 1].offset() + 1
            {
                t += 1;
            }
            if k >= got || !ok[k] {
                // No lower tier has room, or the page did not read back: leave it.
                for v in &victims[k..t.max(k + 1)] {
                    guards.g[v.gi].store(v.page, v.pte.unbusy());
                }
                if k < got {
                    for e in &targets[k..t] {
                        to_free.push(e.bits());
                    }
                }
                k = t.max(k + 1);
                continue;
            }
            let tdev = p.devices.device(targets[k]);
            let mut req = [WriteReq::new(targets[k].offset(), crate::mapping::PageRun::from_pages(&buf[k..t]))];
            tdev.backend.write(&mut req);
            for j in k..t {
                let v = &victims[j];
                if req[0].result.is_ok() {
                    tdev.set_checksum(targets[j].offset(), crc32c::crc32c(&buf[j].0));
                    tdev.cache.set_owner(targets[j].offset(), guards.page_ref(v.gi, v.page, v.pte).owner());
                    guards.g[v.gi].store(v.page, v.pte.next(PageState::Swapped, Some(targets[j])));
                    dev.cache.clear(v.pte.entry().offset());
                    to_free.push(v.pte.entry().bits());
                    moved += 1;
                } else {
                    guards.g[v.gi].store(v.page, v.pte.unbusy());
                    to_free.push(targets[j].bits());
                    p.stats.inc(Counter::SwpoutError);
                }
            }
            k = t;
        }
        p.devices.free_now(&mut to_free);
    }
    p.stats.add(Counter::Writeback, moved as u64);
    moved
}

/// How often the background reclaimer looks at the pager.
pub(crate) const BACKGROUND_PERIOD: std::time::Duration = std::time::Duration::from_millis(5);

/// The background reclaimer. With [`BackgroundReclaim::WhenIdle`]: every
/// [`BACKGROUND_PERIOD`], if the charge is above the high watermark and the application took
/// no fault during the last period, reclaims towards the low watermark, stopping as soon as
/// faults resume. While the application faults, reclaim runs in its own context (see
/// `task_reclaim`), so the two never contend for the page tables, and the fault path never
/// pays for waking this thread. With [`BackgroundReclaim::Always`]: woken by the fault that
/// crosses the high watermark, reclaims down to the low one.
pub(crate) fn background_reclaimer(p: &PagerShared) {
    let mut last_faults = p.stats.sum(Counter::Pgfault);
    let mut writeback_buf = vec![AlignedPage([0; PAGE_SIZE]); BATCH];
    while !p.is_shutdown() {
        std::thread::park_timeout(BACKGROUND_PERIOD);
        // Tiers first: a full pool would otherwise send every new page past itself. Bounded:
        // stops when no device wants room or nothing can move.
        while !p.is_shutdown() && device_writeback(p, &mut writeback_buf) > 0 {}
        for d in p.devices.devices() {
            d.backend.prepare();
        }
        let faults = p.stats.sum(Counter::Pgfault);
        // Pressure on a shared charge comes from other pagers: reclaim whatever this one does.
        let idle = faults == last_faults || p.background_reclaim == BackgroundReclaim::Always || shared_above(p, false);
        last_faults = faults;
        p.devices.run_discards();
        if !idle || p.reclaim_held.load(Ordering::Acquire) {
            continue;
        }
        let (high, low) = watermarks(p.limit_pages.load(Ordering::Acquire));
        if p.resident_pages.load(Ordering::Acquire) <= high && !shared_above(p, false) {
            continue;
        }
        let mut fruitless = 0;
        // Bounded by the charge: each fruitful round uncharges pages; stops when the
        // application faults again (it then reclaims for itself) or nothing is reclaimable.
        while (p.resident_pages.load(Ordering::Acquire) > low || shared_above(p, true))
            && !p.is_shutdown()
            && !p.reclaim_held.load(Ordering::Acquire)
        {
            if !reclaim_round(p, false).any() {
                fruitless += 1;
                if fruitless > MAX_FRUITLESS_ROUNDS {
                    break;
                }
                std::thread::yield_now();
            } else {
                fruitless = 0;
            }
            if p.background_reclaim == BackgroundReclaim::WhenIdle && p.stats.sum(Counter::Pgfault) != last_faults {
                break;
            }
        }
        p.devices.flush_frees();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
