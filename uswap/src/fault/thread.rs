//! Thread mode's delivery: [`handler_thread`]s, one pinned to each CPU, read fault messages
//! from the userfaultfd and serve them. Only the active ones poll the descriptor (the
//! kernel wakes every poller for each fault); [`super::handler_pool`] decides which are
//! active, and whether a handler spins for the next fault instead of sleeping. Faults raised
//! in system calls arrive here too. Events (munmap, mremap, madvise) read among the
//! messages are applied first, in the kernel's order (`crate::events`).

use super::handler_pool::{
    describe_threads, thread_last_cpu, HandlerPool, WakeTally, BACKLOG_FAULTS, HELPER_WINDOW_PAGES,
    SPIN_AFTER_FAULT_NS, SPIN_ROUNDS_PER_YIELD, SPIN_YIELD_TAKEN_NS,
};
use super::retry::serve_with_retries;
use crate::clock::now_ns;
use crate::events::{self, Events};
use crate::mapping::pin_current_thread;
use crate::region::region_owning;
use crate::state::fault_error::FaultError;
use crate::state::route::{reset_window, window_pages, Route};
use crate::state::{PagerId, PagerShared, Shutdown};
use crate::stats::{Counter, PerCpuStats};
use crate::uffd::{self, Doorbell, Event, RangeResult, Uffd, UffdMsg, PAGE_SIZE};
use std::io::Write;

/// A handler thread's context: the regions' descriptor it reads and wakes faults on, the
/// events' context (events read among the faults), the pager's identity (to find its
/// regions), counters and the shutdown flag. Built by [`PagerShared::handler_cx`]; the faults themselves are served
/// through the region (`crate::fault_service`).
pub(crate) struct Handlers<'a> {
    id: PagerId,
    uffd: &'a Uffd,
    shutdown: &'a Shutdown,
    stats: &'a PerCpuStats,
    events: Events<'a>,
}

impl PagerShared {
    /// A handler thread's context (see [`Handlers`]).
    pub(crate) fn handler_cx(&self) -> Handlers<'_> {
        Handlers {
            id: self.id(),
            uffd: &self.uffd,
            shutdown: &self.shutdown,
            stats: &self.stats,
            events: self.events_cx(),
        }
    }
}

/// Thread mode: one of the handler threads. Reads fault messages and serves them until the
/// pager shuts down.
pub(crate) fn handler_thread(
    cx: &Handlers<'_>,
    doorbell: &Doorbell,
    pool: &HandlerPool,
    me: usize,
    cpu: Option<usize>,
) {
    if let Some(cpu) = cpu {
        // Best effort: unpinned, the handler still works, only the wake-up may be remote.
        let _ = pin_current_thread(cpu);
    }
    let mut msgs = [UffdMsg::default(); 16];
    let mut h = Handler::default();
    while !cx.shutdown.is_set() {
        if !pool.is_active(me) {
            pool.wait_dormant(me, || cx.shutdown.is_set());
            h.tally.reset();
            h.woke_for_message = false;
            h.spin_until_ns = None;
        }
        // Taken whether or not the handler slept: one that retired and was woken again as a
        // helper before it looked must still leave after its allowance, or two stay active.
        if pool.take_helper(me) {
            h.tally.start_helping();
        }
        if !pool.is_active(me) {
            continue;
        }
        // Events (munmap, mremap, madvise) among the messages are applied here, in the order
        // the kernel sent them, before any fault read after them is served.
        let n = events::read_and_apply(&cx.events, &mut msgs);
        let pending = events::run_take_outs(&cx.events);
        let retire = std::mem::take(&mut h.woke_for_message) && h.tally.woke(n > 0);
        if retire && n == 0 && pool.try_retire(me) {
            cx.stats.inc(Counter::HandlerRetire);
            continue;
        }
        if spin(cx, &mut h.tally, n, &mut h.spin_until_ns, &mut h.spin_rounds) {
            continue;
        }
        if n == 0 {
            let timeout_ms = if pending { events::TAKE_OUT_POLL_MS } else { -1 };
            h.woke_for_message = match uffd::poll_fault_or_doorbell_for(cx.uffd, doorbell, timeout_ms) {
                uffd::Wake::Message => true,
                uffd::Wake::Other => false,
                uffd::Wake::Closed(fd) => {
                    // Parks until the pager shuts down (or the process ends).
                    cx.uffd.keeper().found_closed(fd);
                    false
                }
            };
            continue;
        }
        h.serve_batch(cx, pool, me, &msgs[..n], retire);
    }
}

/// A handler thread's state between rounds of its loop.
#[derive(Default)]
struct Handler {
    tally: WakeTally,
    /// Whether the last poll said the descriptor had a message (the read after it judges the
    /// wake-up: useful if it found one, useless if another handler was first).
    woke_for_message: bool,
    /// While set, the handler polls the descriptor without sleeping, until then
    /// (`WakeTally::may_spin`).
    spin_until_ns: Option<u64>,
    spin_rounds: u32,
    /// The thread whose fault in the last batch mapped a window, if one did (the help rule).
    window_tid: Option<u32>,
}

impl Handler {
    /// Serves the faults among `msgs` (events were applied when they were read), applying
    /// the pool's rules to the batch, then retires if the wake-up (`retire`) or a helper's
    /// allowance says so.
    fn serve_batch(&mut self, cx: &Handlers<'_>, pool: &HandlerPool, me: usize, msgs: &[UffdMsg], retire: bool) {
        // Only this handler clears its own flag (`HandlerPool::try_retire`), and it was active
        // when it read the batch.
        debug_assert!(pool.is_active(me), "a handler serves only while active");
        let nr_faults = msgs.iter().filter(|m| m.is_page_fault()).count();
        adjust_pool(cx, pool, &mut self.tally, me, msgs, nr_faults, &mut self.window_tid);
        for m in msgs {
            let Event::PageFault { addr, write, tid } = m.event() else { continue };
            if serve_message(cx, addr, write, tid) {
                self.window_tid = Some(tid);
            }
        }
        let helped_enough = self.tally.served(nr_faults as u32);
        if self.tally.may_spin() {
            self.spin_until_ns = Some(now_ns() + SPIN_AFTER_FAULT_NS);
        }
        // Retiring with messages in hand waits until they are served.
        if (retire || helped_enough) && pool.try_retire(me) {
            cx.stats.inc(Counter::HandlerRetire);
        }
    }
}

/// While a spin is on (`spin_until_ns`) and nothing was read (`n == 0`): one round of
/// it, offering the CPU every `SPIN_ROUNDS_PER_YIELD` rounds. Returns true to poll again
/// without sleeping. A yield another thread takes, or the spin's end, ends the spin and
/// tells the tally whether it found a fault.
fn spin(cx: &Handlers<'_>, tally: &mut WakeTally, n: usize, spin_until_ns: &mut Option<u64>, rounds: &mut u32) -> bool {
    let Some(until_ns) = *spin_until_ns else { return false };
    if n == 0 && now_ns() < until_ns {
        *rounds = rounds.wrapping_add(1);
        if *rounds % SPIN_ROUNDS_PER_YIELD != 0 {
            std::hint::spin_loop();
            return true;
        }
        let before_ns = now_ns();
        std::thread::yield_now();
        if now_ns() - before_ns < SPIN_YIELD_TAKEN_NS {
            return true;
        }
        // Another thread had the CPU: spinning here takes its time.
        if tally.spun(false) {
            cx.stats.inc(Counter::HandlerSpinOff);
        }
        *spin_until_ns = None;
        return true;
    }
    if tally.spun(n > 0) {
        cx.stats.inc(Counter::HandlerSpinOff);
    }
    *spin_until_ns = None;
    false
}

/// The pool's rules that a batch of `nr_faults` faults (among `msgs`) applies: a backlog
/// adds a handler, a window served for one thread followed by another thread's fault
/// (`window_tid`, taken unless a backlog came first) wakes a helper, and a lone handler steers itself to the faulting thread's
/// CPU (see `handler_pool`).
fn adjust_pool(
    cx: &Handlers<'_>,
    pool: &HandlerPool,
    tally: &mut WakeTally,
    me: usize,
    msgs: &[UffdMsg],
    nr_faults: usize,
    window_tid: &mut Option<u32>,
) {
    let mut tids = msgs.iter().filter_map(|m| match m.event() {
        Event::PageFault { tid, .. } => Some(tid),
        _ => None,
    });
    if nr_faults >= BACKLOG_FAULTS {
        if pool.add_for_backlog() {
            cx.stats.inc(Counter::HandlerBacklog);
        }
    } else if std::mem::take(window_tid).is_some_and(|t| tids.clone().any(|tid| tid != t)) {
        if pool.wake_helper() {
            cx.stats.inc(Counter::HandlerHelp);
        }
    } else if pool.nr_active() == 1 && tally.served_alone(nr_faults as u32) && !tally.may_spin() {
        // A spinning handler serves from the other CPU by design: steering it to the
        // faulting thread's CPU would make the two compete for it.
        if let Some(cpu) = tids.next().and_then(thread_last_cpu) {
            // Served first anyway: the new handler polls only after its wake-up.
            if pool.steer_to(me, cpu) {
                cx.stats.inc(Counter::HandlerSteer);
            }
        }
    }
}

/// After a fault waited 10 s for its page (`FaultError::BusyTimeout`): the page's word and
/// where each thread of the process waits, one of which held the page. Allocates (thread
/// mode's handlers may).
fn report_busy_owner(region: &crate::region::RegionInner, addr: usize, tid: u32) {
    let word = region.page_of(addr).map_or(crate::region::Pte(0), |page| region.load(page));
    let (state, busy) = (word.state(), word.busy());
    // A write error (stderr closed) changes nothing: the SIGBUS report went before.
    let _ = writeln!(
        std::io::stderr(),
        "uswap: page {addr:#x} is {state:?} (busy {busy}, word {:#x}), faulted by thread {tid}; this process's threads: {}",
        word.0,
        describe_threads()
    );
}

/// Serves the fault of thread `tid` at `addr`, and wakes the thread or signals it. Returns
/// whether the service mapped a window of at least `HELPER_WINDOW_PAGES` (the help rule).
fn serve_message(cx: &Handlers<'_>, addr: usize, write: bool, tid: u32) -> bool {
    assert_eq!(addr % PAGE_SIZE, 0, "fault addresses are decoded page-aligned");
    reset_window();
    match region_owning(addr) {
        Some(g) if g.pager.id() == cx.id => {
            match serve_with_retries(&g, g.index, g.gen, addr, write, Route::Thread) {
                Ok(()) => return window_pages() >= HELPER_WINDOW_PAGES,
                // Gone: memory mremap grew back in place gets a zero page; else the thread
                // faults again and meets whatever is there now.
                Err(FaultError::Gone) => {
                    if cx.uffd.zeropage(addr, PAGE_SIZE, true) != RangeResult::Done {
                        let _ = cx.uffd.wake(addr, PAGE_SIZE);
                    }
                }
                // EAGAIN: an event is pending, and the thread faults again after it.
                // Unmapped: the message was stale; a thread still waiting there (it cannot be
                // this fault's) faults again and meets what is there now.
                Err(FaultError::Ioctl(libc::EAGAIN) | FaultError::Unmapped) => {
                    let _ = cx.uffd.wake(addr, PAGE_SIZE);
                }
                Err(lost) => {
                    // The page cannot be brought back: the faulting thread gets SIGBUS, as it
                    // would from the kernel for an unreadable swap page.
                    uffd::sigbus::report_lost_page(addr, lost.why_lost(), lost.device_cause());
                    if lost == FaultError::BusyTimeout {
                        report_busy_owner(&g, addr, tid);
                    }
                    uffd::sigbus::signal_thread(tid);
                }
            }
            return false;
        }
        // A part of a region moved away by mremap, its pages still being copied in: the
        // copy wakes the thread, or the range's unregistering does.
        None if events::is_pending(&cx.events, addr) => return false,
        // Registered memory no region claims: what mremap grew a region by in place (no
        // event tells of it). Ordinary anonymous memory: zero.
        None if cx.uffd.zeropage(addr, PAGE_SIZE, true) == RangeResult::Done => return false,
        _ => {}
    }
    // Not ours any more (the region was dropped under a racing access), or the page could
    // not be read: wake the thread; it faults again, and if the region is gone it gets
    // SIGSEGV like any access to unmapped memory.
    let _ = cx.uffd.wake(addr, PAGE_SIZE);
    false
}
