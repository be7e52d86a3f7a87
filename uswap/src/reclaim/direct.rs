//! Direct reclaim: what a charge does when it reaches the watermarks. A fault charges its
//! page before mapping it; above the high watermark the faulting thread reclaims one batch
//! itself (memcg's `memory.high`), and a charge that would pass the limit reclaims until it
//! fits (direct reclaim, counted in `allocstall`), or waits, boundedly, for room.
//!
//! A fault that takes the charge above `high` reclaims one batch in
//! the faulting context (memcg's `memory.high`); a charge that would pass the limit reclaims
//! until it fits (direct reclaim, counted in `allocstall`). The background reclaimer brings an
//! idle pager from above `high` down to `low`, so a burst of faults after a pause starts with
//! headroom.
//!
//! Locking: none of its own. A charge allocates nothing and sleeps only with
//! `nanosleep(2)`, so it may run in a SIGBUS handler; on the lock-free route (the thread
//! holds an engine lock) it neither reclaims nor waits.

use std::sync::atomic::Ordering;

use super::accounting::{force_charge, note_peak, shared_add, shared_reclaim_is_ours, shared_room, watermarks};
use super::round::{reclaim_round, stage_for_background, Progress, MAX_FRUITLESS_ROUNDS};
use super::Reclaim;
use crate::options::BackgroundReclaim;
use crate::pin;
use crate::pressure::StallGuard;
use crate::stats::Counter;

/// How long a charge waits, in all, for room while every victim it finds is busy in other
/// threads' faults and device writes (the devices have room) before it charges over the
/// limit (`limit_overrun_busy`). Well below `fault_service::BUSY_WAIT_LIMIT_NS` (10 s): the waiting
/// thread owns its faulting page, and another thread faulting on that page waits for it.
pub(crate) const CHARGE_WAIT_LIMIT_NS: u64 = 250_000_000;
/// How long a charge waits while no thread makes any progress at all (nothing written
/// back, dropped or found zero anywhere) before it gives up sooner.
const CHARGE_STALL_LIMIT_NS: u64 = 100_000_000;
/// Rounds a charge makes at once while its rounds find only pinned victims (each round looks
/// at up to four batches of the LRU) before it charges over the limit; more in a process
/// that never forked (see [`ChargeWait::another_round_past_held`]).
const MAX_PINNED_ROUNDS: usize = 4;
/// Held victims a charge passes, in all, in a process that never forked, before it charges
/// over the limit (see [`ChargeWait::another_round_past_held`]): eight of `process_vm_readv`'s
/// pins (1,024 pages each, the kernel's `PVM_MAX_KMALLOC_PAGES`).
const MAX_HELD_PAGES: usize = 8192;
/// Rounds a charge makes at once past held victims, at most (each looks at up to four
/// batches of the LRU).
const MAX_HELD_ROUNDS: usize = 256;
/// First and longest sleep between fruitless rounds of a charge.
const CHARGE_BACKOFF_MIN_NS: u64 = 20_000;
const CHARGE_BACKOFF_MAX_NS: u64 = 1_000_000;

/// Pages uncharged by reclaim so far, over every thread: written back, dropped clean, or
/// found zero. What a waiting charge measures others' progress by.
fn reclaim_progress(cx: &Reclaim<'_>) -> u64 {
    cx.stats.sum(Counter::Pswpout) + cx.stats.sum(Counter::SwpoutClean) + cx.stats.sum(Counter::SwpoutZero)
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
/// thread reclaimed anything. Only then, when its rounds did reclaim but other threads'
/// charges took the room first for `CHARGE_WAIT_LIMIT_NS` in all (starvation), at once when
/// every device is full or none takes pages (each degraded or declining, see
/// `swap::health`), when the round's victims were refused (shared with a fork child: see
/// below) or pinned (after four rounds; in a process that never forked, once the charge
/// has passed as many pinned pages as the LRU holds, 8,192 at most, or waited
/// `CHARGE_WAIT_LIMIT_NS`: see `ChargeWait::another_round_past_held`), when only the shared
/// limit is reached and this pager has nothing to reclaim, or on the lock-free route
/// (which may not reclaim), does it charge over the limit: counted in `limit_overrun` (and
/// `limit_overrun_busy` when the devices had room). Nothing is lost; reclaim takes the
/// extra pages later. `lock_free`: the caller may take no lock (signal mode, its thread
/// interrupted inside the engine).
pub(crate) fn charge(cx: &Reclaim<'_>, n: usize, lock_free: bool) {
    // Dropped when this returns: its stall lasts until the charge is made (and the task
    // reclaim after it is done), as it did when its fields were this function's locals.
    let mut wait = ChargeWait::new();
    // Terminates: a failed compare-exchange means another thread changed the charge (its
    // progress); a fruitful round uncharges pages, and fruitless rounds sleep; reclaiming
    // is bounded by CHARGE_WAIT_LIMIT_NS in all, fruitful or not.
    while let Err((cur, limit)) = try_charge(cx, n) {
        if cx.charge.reclaim_held.load(Ordering::Acquire) || super::stopped_for_core_dump() {
            // Pager::prepare_fork: every page comes in before the fork; none may go out.
            // Likewise before a core dump.
            force_charge(cx.charge, n);
            return;
        }
        if lock_free {
            overrun(cx, n, false);
            break;
        }
        match wait.round(cx, n, cur, limit) {
            Wait::Again => continue,
            Wait::Overrun { busy } => {
                overrun(cx, n, busy);
                break;
            }
        }
    }
    if !lock_free {
        task_reclaim(cx);
    }
}

/// Charges `n` pages over the limit, counted in `limit_overrun` (and, `busy`: when the
/// devices had room but every victim stayed busy, `limit_overrun_busy`).
fn overrun(cx: &Reclaim<'_>, n: usize, busy: bool) {
    force_charge(cx.charge, n);
    cx.stats.inc(Counter::LimitOverrun);
    if busy {
        cx.stats.inc(Counter::LimitOverrunBusy);
    }
}

/// What a charge that did not fit does after one more reclaim round.
enum Wait {
    /// Tries to charge again.
    Again,
    /// Stops waiting and charges over the limit.
    Overrun { busy: bool },
}

/// A charge's wait for room, across its reclaim rounds (see [`charge`]).
struct ChargeWait<'a> {
    /// Held from the first reclaim round to the charge: a stall on memory (`crate::pressure`).
    stalled: Option<StallGuard<'a>>,
    fruitless: usize,
    backoff_ns: u64,
    /// (when the waiting began, when progress was last seen, the progress then)
    waiting: Option<(u64, u64, u64)>,
    /// When the first reclaim round began: fruitful rounds whose room other threads' charges
    /// keep taking first are bounded by CHARGE_WAIT_LIMIT_NS all told, like fruitless ones.
    reclaim_since_ns: u64,
    /// Rounds that found only pinned victims (refused ones held in included), and those
    /// victims (see [`ChargeWait::another_round_past_held`]).
    held_rounds: usize,
    held_pages: usize,
}

impl<'a> ChargeWait<'a> {
    fn new() -> ChargeWait<'a> {
        ChargeWait {
            stalled: None,
            fruitless: 0,
            backoff_ns: CHARGE_BACKOFF_MIN_NS,
            waiting: None,
            reclaim_since_ns: 0,
            held_rounds: 0,
            held_pages: 0,
        }
    }

    /// One reclaim round for a charge of `n` pages that found `cur` charged of `limit_pages`.
    /// Not on the lock-free route (its caller checked): this reclaims and may sleep.
    fn round(&mut self, cx: &Reclaim<'a>, n: usize, cur: usize, limit_pages: usize) -> Wait {
        if self.stalled.is_none() {
            cx.stats.inc(Counter::Allocstall);
            self.stalled = Some(cx.charge.stall());
            self.reclaim_since_ns = crate::clock::now_ns();
        }
        let round = reclaim_round(cx, true);
        // No device took any page this round wrote (every one declined them: incompressible
        // pages and `zpool:reject` last; or none had a slot): more rounds would stage and
        // offer more of the same, 250 ms per charge. A batch with one page taken goes on.
        if round.uncharged == 0 && round.declined > 0 {
            return Wait::Overrun { busy: false };
        }
        if round.any() {
            self.fruitless = 0;
            self.backoff_ns = CHARGE_BACKOFF_MIN_NS;
            if crate::clock::now_ns().saturating_sub(self.reclaim_since_ns) > CHARGE_WAIT_LIMIT_NS {
                // Reclaim works, but the room it makes keeps going to other charges: stop
                // reclaiming for them and charge over the limit (counted), as below.
                return Wait::Overrun { busy: false };
            }
            return Wait::Again;
        }
        if self.another_round_past_held(cx, &round) {
            return Wait::Again;
        }
        debug_assert!(self.held_rounds <= MAX_HELD_ROUNDS, "rounds past held pages are bounded");
        // Still only pinned pages (all this small process has are its call's own): waiting
        // would not unpin them, the call waits for this charge.
        // Or every resident page is locked by the program (`mlock` of more than the limit):
        // none will be a victim however long this waits, as the kernel charges a locked
        // page over `memory.high` and keeps it.
        if round.all_locked || waiting_cannot_help(cx, round.refused + round.pinned, cur + n <= limit_pages) {
            return Wait::Overrun { busy: false };
        }
        self.fruitless += 1;
        if self.fruitless <= MAX_FRUITLESS_ROUNDS {
            std::thread::yield_now();
            return Wait::Again;
        }
        self.nap_for_others(cx)
    }

    /// Whether a round that took nothing but found pinned victims is worth another at once:
    /// they went to the LRU's tail, and the next round sees others. Up to
    /// [`MAX_PINNED_ROUNDS`] rounds; in a process that never forked, until the charge has
    /// passed as many as the LRU holds (every page once, at most [`MAX_HELD_PAGES`]) or has
    /// waited [`CHARGE_WAIT_LIMIT_NS`]. There the pinned victims include the pages
    /// `UFFDIO_MOVE` refused lately (`EBUSY`), pinned by a system call under way
    /// (`process_vm_readv` pins up to 4 MiB of the memory it reads at a time, a peer's or
    /// its own; `O_DIRECT` I/O; `vmsplice`) and held in a while (`pin::note_refused`), as
    /// the kernel's reclaim activates a page it cannot unmap and scans on. Charged over the
    /// limit at once instead (each refusal taken for a page shared with a fork child), a
    /// thread-mode program that copied its own 128 MiB with `process_vm_readv` under 16 MiB
    /// went to 22 MiB. Pins of more than the limit (io_uring's registered buffers) make each
    /// charge pass up to that many pages, about 50 ns each, before it goes over. After a
    /// fork a refused page may be shared with the child instead, and the same for every
    /// round (see [`waiting_cannot_help`]).
    fn another_round_past_held(&mut self, cx: &Reclaim<'_>, round: &Progress) -> bool {
        if round.pinned == 0 || self.held_rounds >= MAX_HELD_ROUNDS {
            return false;
        }
        self.held_rounds += 1;
        self.held_pages += round.pinned;
        if self.held_rounds <= MAX_PINNED_ROUNDS {
            return true;
        }
        let waited_ns = crate::clock::now_ns().saturating_sub(self.reclaim_since_ns);
        pin::refusals_are_pins()
            && self.held_pages <= cx.lru.len().min(MAX_HELD_PAGES)
            && waited_ns <= CHARGE_WAIT_LIMIT_NS
    }

    /// After `MAX_FRUITLESS_ROUNDS`: the victims are busy in other threads' writes. Sleeps,
    /// so that they get the CPU to finish them, rather than spin or give up; gives up once
    /// the wait passes its bounds.
    fn nap_for_others(&mut self, cx: &Reclaim<'_>) -> Wait {
        let now = crate::clock::now_ns();
        let progress = reclaim_progress(cx);
        let (since, last_seen, seen) = self.waiting.get_or_insert((now, now, progress));
        if progress != *seen {
            (*last_seen, *seen) = (now, progress);
        }
        // The clock is monotonic (`crate::clock`), and both moments were read from it.
        debug_assert!(*since <= *last_seen && *last_seen <= now, "charge wait times in order");
        if now - *since > CHARGE_WAIT_LIMIT_NS || now - *last_seen > CHARGE_STALL_LIMIT_NS {
            return Wait::Overrun { busy: true };
        }
        debug_assert!(
            (CHARGE_BACKOFF_MIN_NS..=CHARGE_BACKOFF_MAX_NS).contains(&self.backoff_ns),
            "charge back-off within its bounds"
        );
        nap(self.backoff_ns);
        self.backoff_ns = (self.backoff_ns * 2).min(CHARGE_BACKOFF_MAX_NS);
        Wait::Again
    }
}

/// Charges `n` pages if they fit under the limit, and under the shared one if any.
/// `Err((charged, limit))`, what it saw, when they do not. Lock-free: a failed
/// compare-exchange means another thread changed the charge, and it tries again.
fn try_charge(cx: &Reclaim<'_>, n: usize) -> Result<(), (usize, usize)> {
    loop {
        let cur = cx.charge.resident_pages.load(Ordering::Acquire);
        let limit = cx.charge.limit_pages.load(Ordering::Acquire);
        if cur + n > limit || !shared_room(cx.charge, n) {
            return Err((cur, limit));
        }
        if cx.charge.resident_pages.compare_exchange_weak(cur, cur + n, Ordering::AcqRel, Ordering::Acquire).is_ok() {
            shared_add(cx.charge, n);
            note_peak(cx.charge, cur + n);
            return Ok(());
        }
    }
}

/// Whether a charge whose reclaim round found nothing should go over the limit at once
/// rather than wait: when waiting cannot cure what stops it.
fn waiting_cannot_help(cx: &Reclaim<'_>, refused: usize, within_own_limit: bool) -> bool {
    // The victims were refused, not busy: pages shared copy-on-write with a fork child (or
    // pinned, or made read-only) stay where they are however long this waits, and while they
    // are shared they cost the same RAM whether this process maps them or not. Over the
    // limit at once (`limit_overrun`, with `move_refused` saying why) rather than make every
    // fault wait out the back-off: after a fork, a parent's faults took 100 ms each until its
    // children exited.
    refused > 0
        // Nothing can go anywhere (every device full, or each degraded or declining, see
        // `swap::health`): keep the page, count the overrun. A round still drops what is
        // clean or zero first.
        || cx.devices.is_full()
        || cx.devices.take_no_pages()
        // Within our own limit, over the shared one, and nothing of ours to reclaim (a
        // re-armed fork child whose pages are all still its parent's): the pagers that hold
        // the tree's memory reclaim theirs (the largest always holds an average share, see
        // `super::accounting::shared_reclaim_is_ours`).
        || (within_own_limit && cx.lru.is_empty() && cx.swap_cache.nr_pages() == 0)
}

/// Above the high watermark the faulting thread reclaims one batch itself, as memcg does at
/// `memory.high` (memcg has no kswapd: all its reclaim runs in the charging task). On these
/// VMs that is also the cheap place: `UFFDIO_MOVE` flushes the TLB, and while another thread
/// of the process runs on another CPU the flush is a synchronous IPI (9.7 µs instead of
/// 1.05 µs per single-page move, see BENCHMARKS.md), so reclaim from a second CPU would slow
/// every fault it overlaps with. Under `StageTwo` (a zstd pool first) the faulting thread
/// keeps the moves and leaves the writes, the compression, to the background thread, whose
/// flushes come one per batch of staging pages dropped.
fn task_reclaim(cx: &Reclaim<'_>) {
    if cx.charge.reclaim_held.load(Ordering::Acquire) || super::stopped_for_core_dump() {
        return;
    }
    let (high, _) = watermarks(cx.charge.limit_pages.load(Ordering::Relaxed));
    let resident = cx.charge.resident_pages.load(Ordering::Acquire);
    if resident <= high && !shared_reclaim_is_ours(cx.charge, false, false) {
        return;
    }
    match cx.background_reclaim {
        // `Auto` is resolved when the pager is built; never stored.
        BackgroundReclaim::WhenIdle | BackgroundReclaim::Auto => {
            reclaim_round(cx, true);
        }
        // Over its own watermark: the background thread writes what this thread stages. For
        // the tree's charge alone, a whole round here (the background thread's target is
        // this pager's own).
        BackgroundReclaim::StageTwo if resident > high => {
            if stage_for_background(cx, resident - high) {
                cx.reclaimer.wake();
            } else {
                reclaim_round(cx, true);
            }
        }
        BackgroundReclaim::StageTwo => {
            reclaim_round(cx, true);
        }
        BackgroundReclaim::Always => {
            // An atomic swap and, if the thread sleeps, a futex wake: no allocation, no
            // lock, so it is safe in a signal handler (`sync::Doze`).
            cx.reclaimer.wake();
        }
    }
}
