//! System calls on managed memory in signal mode: the third route by which a fault reaches
//! the engine, besides a handler thread and the faulting thread's SIGBUS handler.
//!
//! In signal mode the kernel does not wait for a page a system call touches: the call fails
//! with `EFAULT`. [`prepare_user_access`], called before such a call (`uswap run`'s library
//! does it for every call of the C library), brings in the pages of the call's memory the
//! kernel could not access, through the same path as a SIGBUS (`fault::sigbus_fault`),
//! pinned first (`crate::pin`) so that reclaim leaves them in until the call returns, and
//! marks them used (the call is their use).
//!
//! Locking: none of its own; allocation-free, safe in a signal handler (see `fault`). While
//! it works, the thread's own system calls are the engine's ([`in_preparation`]); while it
//! serves a page, asynchronous signals are blocked, as in the SIGBUS handler.

use crate::fault::sigbus_fault;
use crate::mapping::registry::RegistryGuard;
use crate::mlock::LockKind;
use crate::options::FaultMode;
use crate::page_table::PageRef;
use crate::pin::Pin;
use crate::region::{region_owning, PageState, Pte, RegionInner, REGIONS};
use crate::stats::Counter;
use crate::uffd::PAGE_SIZE;
use std::sync::atomic::Ordering;

/// Signal mode, before a system call reads (`write` false) or writes `[addr, addr + len)`:
/// brings in every page of a signal-mode region there that the kernel could not access, as
/// the faulting thread's SIGBUS handler would (a fault the kernel raises itself is not a
/// signal but `EFAULT`). A page is ready when it is mapped, and for a write not
/// write-protected. The managed part is pinned in `pin` before its pages are looked at.
/// Returns `None` if no page of the range belongs to a signal-mode region, else how many
/// pages had to be brought in (an `EFAULT` after a preparation that brought nothing in is
/// not uswap's). Allocation-free; takes no lock the thread holds.
pub(crate) fn prepare_user_access(pin: &mut Pin, addr: usize, len: usize, write: bool) -> Option<usize> {
    let _preparing = Preparing::enter();
    let mut managed = false;
    let mut nr_brought_in = 0;
    // Made at the first page to serve, kept to the end (see `bring_in_for_kernel`).
    let mut signals_held = None;
    for_each_region_in(addr & !(PAGE_SIZE - 1), addr.saturating_add(len), |g, from, to| {
        if g.pager.mode != FaultMode::Signal {
            return;
        }
        if !managed {
            // The page-table words read below must say what the events this thread has
            // seen (its own `madvise`) made of them; see `events::wait_until_applied`.
            crate::events::wait_until_applied(&g.pager.stats);
        }
        managed = true;
        // Before the words are read: see `pin` for the ordering with reclaim.
        pin.add(from, to);
        for page_addr in (from..to).step_by(PAGE_SIZE) {
            if let Some(page) = g.page_of(page_addr) {
                let pte = g.load(page);
                if !ready_for_kernel(pte, write) {
                    signals_held.get_or_insert_with(crate::uffd::AsyncSignalsBlocked::new);
                    bring_in_for_kernel(g, page, page_addr, write);
                    nr_brought_in += 1;
                }
                mark_used_by_kernel(g, page);
            }
        }
    });
    managed.then_some(nr_brought_in)
}

/// How long [`bring_in_for_kernel`] serves a page again while the kernel refuses to map it.
const READY_WAIT_LIMIT_NS: u64 = 250_000_000;

/// Brings `page` of `region` (at `page_addr`) in for a system call as a SIGBUS would, and
/// again while the handler's answer is "retry the access" but the page is still not ready:
/// another thread's `madvise` or `munmap` has an event under way, and the kernel refuses
/// every userfaultfd ioctl until the engine reads it. A system call does not retry by itself
/// as a faulting access does; the call's own `EFAULT` retries, made at once, all came within
/// the event's window (159-247 `EFAULT`s reached a program whose other thread discarded
/// memory). Bounded by `READY_WAIT_LIMIT_NS`; between tries it yields, then sleeps ([`back_off`]).
///
/// The caller holds asynchronous signals off, as the SIGBUS handler's `sa_mask` does while
/// it serves a fault: a handler of the program's that touched managed memory in the middle
/// of this service entered the engine again while this frame held its page busy, its
/// codec's workspace or a bounce buffer, and spun for good or died of SIGBUS 10 s later (a
/// SIGUSR1 every 20 us to threads copying managed pages through pipes, 7 runs of 7). Signals
/// that end the process still get through a long device wait (`let_stop_signals_through`).
fn bring_in_for_kernel(region: &RegionInner, page: usize, page_addr: usize, write: bool) {
    debug_assert!(crate::uffd::async_signals_blocked_by_engine(), "signals held off by the caller");
    let deadline_ns = crate::clock::now_ns() + READY_WAIT_LIMIT_NS;
    let mut tries = 0;
    // Bounded by the deadline; a page lost, or no longer the region's, ends it at once.
    while sigbus_fault(page_addr, write) {
        if ready_for_kernel(region.load(page), write) || crate::clock::now_ns() > deadline_ns {
            return;
        }
        tries += 1;
        back_off(tries);
    }
}

/// Tries of [`bring_in_for_kernel`] made after a yield only; later ones sleep first.
const READY_SPIN_TRIES: u32 = 4;
/// The first sleep between tries, doubled each try up to [`READY_SLEEP_MAX_US`].
const READY_SLEEP_MIN_US: u64 = 20;
const READY_SLEEP_MAX_US: u64 = 1000;

/// Waits before try `tries + 1` of [`bring_in_for_kernel`]: a yield for the first few, then a
/// sleep. The kernel refuses the ioctls until the thread whose `madvise` raised the event
/// runs again (it ends the window once the engine has read the event), and a thread that
/// discards in a loop raises the next event almost at once. Spinning, even with yields,
/// took the CPU those two threads needed: on 2 CPUs beside 4 busy processes the event
/// stayed under way at every try for 250 ms, and the pipe copies of `discardio` (two threads
/// copying, one discarding) met `EFAULT` in 11 runs of 30; with these sleeps in none of 30.
/// Async-signal-safe (`nanosleep`).
fn back_off(tries: u32) {
    if tries <= READY_SPIN_TRIES {
        std::thread::yield_now();
        return;
    }
    let doublings = (tries - READY_SPIN_TRIES - 1).min(6);
    let sleep_us = (READY_SLEEP_MIN_US << doublings).min(READY_SLEEP_MAX_US);
    std::thread::sleep(std::time::Duration::from_micros(sleep_us));
}

thread_local! {
    /// How deep this thread is in [`prepare_user_access`]. Const-initialised, no
    /// destructor: read in signal handlers.
    static PREPARING: std::cell::Cell<u32> = const { std::cell::Cell::new(0) };
}

/// Whether this thread is bringing pages in for a system call: the system calls it makes
/// meanwhile are the engine's (`UFFDIO_MOVE`, `UFFDIO_COPY`, a device's reads), which the
/// rewritten C library must send straight to the kernel (`syscall_guard`'s slow path). Taken
/// for the program's, the generic rule readied the memory behind each of their six
/// registers, and a leftover register that pointed at the page being brought in waited
/// for its own busy bit: 10 s, then SIGBUS (stress-ng's vm stressor, whose
/// `MADV_POPULATE_READ` the preload prepares; about 4 times a minute).
pub(crate) fn in_preparation() -> bool {
    PREPARING.with(|p| p.get()) > 0
}

/// [`in_preparation`] while it lives.
struct Preparing;

impl Preparing {
    fn enter() -> Preparing {
        PREPARING.with(|p| p.set(p.get() + 1));
        Preparing
    }
}

impl Drop for Preparing {
    fn drop(&mut self) {
        PREPARING.with(|p| p.set(p.get() - 1));
    }
}

/// Calls `f(region, from, to)` for each region's part `[from, to)` of `[start, end)`
/// (`start` page-aligned), in address order. Allocation-free.
fn for_each_region_in(start: usize, end: usize, mut f: impl FnMut(&RegistryGuard<'static, RegionInner>, usize, usize)) {
    let mut addr = start;
    // Bounded: every step moves to the end of a region's part or to the next region's start.
    while addr < end {
        let Some(g) = region_owning(addr) else {
            match REGIONS.next_start_after(addr) {
                Some(next) => addr = next,
                None => break,
            }
            continue;
        };
        // Up to the next region's start too: one placed in a hole of this one (its pages
        // there `Gone`) has its own pages to prepare.
        let next = REGIONS.next_start_after(addr).unwrap_or(usize::MAX);
        let to = (g.start() + g.nr_pages * PAGE_SIZE).min(end).min(next);
        f(&g, addr, to);
        addr = to;
    }
}

/// Whether any page of `[addr, addr + len)` belongs to a managed region (of either mode):
/// a look-up of the regions, nothing brought in.
pub(crate) fn touches_managed(addr: usize, len: usize) -> bool {
    let mut found = false;
    for_each_region_in(addr & !(PAGE_SIZE - 1), addr.saturating_add(len), |_, _, _| found = true);
    found
}

/// A page a system call is about to use: referenced, so that reclaim spares it (as the
/// neighbour of a victim, and as a victim once unless it is clean: a clean page leaves
/// without a write, and the kernel's use faults it back) until the call has used it, and no
/// longer read ahead and unused (the call is its use). Best effort: a page that changed
/// meanwhile is left.
fn mark_used_by_kernel(region: &RegionInner, page: usize) {
    let pte = region.load(page);
    if pte.state() != PageState::Resident || pte.busy() || (pte.referenced() && !pte.readahead()) {
        return;
    }
    let used = pte.with_referenced(true).without_readahead();
    let swapped = region.pte(page).compare_exchange(
        pte.0,
        used.0,
        std::sync::atomic::Ordering::AcqRel,
        std::sync::atomic::Ordering::Acquire,
    );
    if swapped.is_ok() && pte.readahead() {
        region.pager.stats.inc(Counter::SwapRaHit);
        region.streams.note_used(1);
    }
}

/// Whether the kernel can access a page in this state without a fault uswap must serve. A
/// busy page is not: reclaim may be taking it out (the fault path waits for it).
fn ready_for_kernel(pte: Pte, write: bool) -> bool {
    if pte.busy() {
        return false;
    }
    match pte.state() {
        PageState::Resident => !(write && pte.clean()),
        PageState::Shared => !write,
        // Not the region's: whatever is there now is not uswap's to bring in.
        PageState::Gone => true,
        PageState::None | PageState::Zero | PageState::Cached | PageState::Swapped | PageState::Parent => false,
    }
}

/// `madvise(MADV_POPULATE_READ or _WRITE)` of `[start, start + len)` in signal mode, whose
/// kernel populates with faults of its own that signal mode cannot serve (`EFAULT`): the
/// range goes in windows of [`crate::pin::MAX_PIN_BYTES`], each given a fresh pin and handed
/// to `window(pin, addr, len)`, which brings it in (pinned) and makes the call. The first
/// non-zero result ends it and is returned; 0 otherwise. As under the kernel's swap with a
/// limit smaller than the range, windows populated first may go out again while later ones
/// come in.
pub fn populate_in_windows(start: usize, len: usize, mut window: impl FnMut(&mut Pin, usize, usize) -> i64) -> i64 {
    let end = start.saturating_add(len);
    let mut at = start;
    // Bounded: every round moves `at` on by a window, or returns.
    while at < end {
        let n = (end - at).min(crate::pin::MAX_PIN_BYTES);
        let mut pin = Pin::new();
        let r = window(&mut pin, at, n);
        pin.release();
        if r != 0 {
            return r;
        }
        at += n;
    }
    0
}

/// Ends the locks of `kind` on `[start, end)` (`crate::mlock`) and puts the pages reclaim
/// took off the LRU for them back on it, unless another lock still covers them (the
/// kernel's `munlock` moves them back to the evictable LRU). Allocation-free.
pub(crate) fn unlock_memory(kind: LockKind, start: usize, end: usize) {
    crate::mlock::unlock(Some(kind), start, end);
    for_each_region_in(start & !(PAGE_SIZE - 1), end.next_multiple_of(PAGE_SIZE), |g, from, to| {
        if let (Some(first), Some(last)) = (g.page_of(from), g.page_of(to - 1)) {
            return_to_lru(g, first, last + 1);
        }
    });
}

/// `munlockall`: every lock of the program's ends (the alternate stacks' stay), and the
/// pages reclaim took off the LRU go back on it.
pub(crate) fn unlock_all_memory() {
    crate::mlock::lock_all(false);
    // No page past the touched part was ever on the LRU.
    REGIONS.for_each(|g| return_to_lru(g, 0, g.touched_end()));
}

/// Puts the pages of `region`'s `[first, end)` that reclaim took off the LRU, and that no
/// lock covers now, back on its pager's LRU. A page busy meanwhile is left off; the scan
/// that refills an empty LRU puts it back (`reclaim::swapout`).
fn return_to_lru(region: &RegistryGuard<'_, RegionInner>, first: usize, end: usize) {
    let (index, gen) = (region.index, region.gen);
    // An unlock ends a scan's finding that every resident page is locked (busy pages left
    // off here are for the next scan, which that finding would put off).
    region.pager.lru.forget_all_locked();
    for page in first..end {
        let pte = region.load(page);
        if !pte.unevictable() || pte.busy() || crate::mlock::is_locked(region.page_addr(page)) {
            continue;
        }
        let back = pte.with_unevictable(false);
        if region.pte(page).compare_exchange(pte.0, back.0, Ordering::AcqRel, Ordering::Acquire).is_ok() {
            let r = PageRef { region_idx: index, region_gen: gen, page_gen: back.gen(), page };
            region.pager.lru.add(r, &region.pager.stats);
        }
    }
}
