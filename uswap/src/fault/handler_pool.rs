//! Thread mode: which fault-handler threads wait on the userfaultfd, and whether they
//! sleep between faults.
//!
//! The kernel wakes every thread polling a userfaultfd for each fault (`handle_userfault`
//! wakes `fd_wqh` non-exclusively). With a handler pinned to each CPU and all of them
//! polling, every fault woke them all; on these 2-vCPU VMs the handler on the *other*, idle
//! vCPU usually won (woken first, no context switch to wait for) while the one on the
//! faulting CPU woke for nothing, and with two handlers busy each `UFFDIO_MOVE` flushed a
//! CPU running the process. One handler did better than two at 2, 8 and 32 faulting threads.
//!
//! So only *active* handlers poll the descriptor; the others are *dormant* (asleep).
//! Handler 0 starts alone; five rules, each applied by a handler to itself, do the rest:
//!
//! * **Retire:** a handler that found nothing to read after more than
//!   [`RETIRE_USELESS_PER_WINDOW`] of its last [`WAKE_WINDOW`] wake-ups (another handler
//!   was first) goes dormant, unless it is the last active one.
//! * **Backlog:** a handler that reads [`BACKLOG_FAULTS`] or more faults at once (the active
//!   ones do not keep up) wakes a dormant one, up to half the CPUs
//!   ([`HandlerPool::add_for_backlog`]): for machines with many CPUs, unmeasured here.
//! * **Help:** a handler that served a stream's window (at least [`HELPER_WINDOW_PAGES`]
//!   pages) and then reads a fault of another thread wakes a dormant handler as a helper
//!   for [`HELPER_FAULTS`] faults: a random fault should not wait behind a stream's
//!   32-page windows. A reclaim round is as long, but is not a window, and a thread's own
//!   next fault did not wait behind its window: both tried as triggers, both cost more
//!   than they gave (docs/bench/journal/combined.md, the combined workload's reading).
//! * **Steer:** every [`PROBE_EVERY_FAULTS`] faults, a lone active handler that is not
//!   spinning looks up the CPU the faulting thread last ran on (`/proc`, 5-20 µs). If that
//!   is not its own, it wakes the handler pinned there and retires.
//! * **Spin:** after serving, a handler polls the descriptor without sleeping for
//!   [`SPIN_AFTER_FAULT_NS`], as long as such spins mostly find the next fault
//!   ([`WakeTally::may_spin`]). A sleeping handler is woken by an IPI the faulting CPU pays
//!   (a VM exit here) and a halted vCPU wakes slowly; a spinning one is found at once.
//!   Spinning is only free on a CPU nothing else wants: every [`SPIN_ROUNDS_PER_YIELD`]
//!   rounds the handler offers its CPU (`sched_yield`), and a yield that another thread
//!   took (it returned after [`SPIN_YIELD_TAKEN_NS`] or more) ends the spin as a miss. Two
//!   processes, each with one worker and one handler, on 2 vCPUs: 90k accesses a second
//!   with plain spinning (the two handlers spun on the CPUs the two workers needed), 155-175k
//!   with this rule; the handlers then sleep, and steering puts each next to its worker.
//!
//! What remains per fault is the `UFFDIO_COPY` that wakes the faulting thread on another
//! CPU: 5.7 µs at one application thread and 8-9 µs at eight, against 2.5-3 µs for the
//! same copy without the wake-up (the IPI again). Deferring the wake-ups of a batch to the
//! end, so that wake-ups to one CPU could share an IPI, did not help.
//!
//! Invariants: at least one handler is active (a handler retires only by a compare-and-swap
//! of the active count from above one), and a handler's `active` flag changes only with
//! that count (set with an increment, cleared with a decrement). Lock-free: atomics and
//! a [`crate::sync::Doze`] per handler; a dormant handler also wakes at shutdown (`Pager`'s
//! drop wakes every one: `HandlerPool::wake_all`).

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

/// Wake-ups a handler judges itself over.
pub(crate) const WAKE_WINDOW: u32 = 64;
/// More useless wake-ups than this in a window, and the handler retires.
pub(crate) const RETIRE_USELESS_PER_WINDOW: u32 = WAKE_WINDOW * 2 / 5;
/// Faults read at once that make a handler wake a dormant one.
pub(crate) const BACKLOG_FAULTS: usize = 4;
/// How often a lone active handler checks that it runs where the faults come from, in
/// faults served.
pub(crate) const PROBE_EVERY_FAULTS: u32 = 4096;
/// A fault whose service mapped this many pages or more (a stream's readahead or
/// fault-around window) makes faults of other threads read after it wake a helper.
pub(crate) const HELPER_WINDOW_PAGES: usize = 8;
/// Faults a helper serves before it retires.
pub(crate) const HELPER_FAULTS: u32 = 64;
/// A dormant handler checks for shutdown at least this often (a wake-up can only be lost to
/// a bug, but a bounded sleep makes such a bug slow, not a hang).
const DORMANT_PARK: Duration = Duration::from_millis(100);

/// The thread-mode handlers' active set. One per pager.
pub(crate) struct HandlerPool {
    active: Box<[AtomicBool]>,
    /// Set for a handler woken as a helper ([`HandlerPool::wake_helper`]), taken by it.
    helper: Box<[AtomicBool]>,
    /// Each handler's sleep while dormant.
    dozes: Box<[crate::sync::Doze]>,
    /// The CPU each handler is pinned to, if it is.
    cpus: Box<[Option<usize>]>,
    /// CPUs the process may run on.
    nr_cpus: usize,
    nr_active: AtomicUsize,
    /// Where the next search for a dormant handler starts (round robin).
    next_wake: AtomicUsize,
}

impl HandlerPool {
    /// `cpus[i]`: where handler `i` is pinned, if it is; `nr_cpus`: CPUs the process may
    /// run on.
    pub(crate) fn new(cpus: Vec<Option<usize>>, nr_cpus: usize) -> HandlerPool {
        let mut cpus = cpus;
        if cpus.is_empty() {
            cpus.push(None);
        }
        let n = cpus.len();
        HandlerPool {
            // Handler 0 alone at first: the rules add and move handlers as faults come.
            active: (0..n).map(|i| AtomicBool::new(i == 0)).collect(),
            helper: (0..n).map(|_| AtomicBool::new(false)).collect(),
            dozes: (0..n).map(|_| crate::sync::Doze::new()).collect(),
            cpus: cpus.into_boxed_slice(),
            nr_cpus: nr_cpus.max(1),
            nr_active: AtomicUsize::new(1),
            next_wake: AtomicUsize::new(0),
        }
    }

    /// Wakes every dormant handler (the pager shuts down: each sees it and returns).
    pub(crate) fn wake_all(&self) {
        for doze in self.dozes.iter() {
            doze.wake();
        }
    }

    pub(crate) fn is_active(&self, me: usize) -> bool {
        self.active[me].load(Ordering::Acquire)
    }

    pub(crate) fn nr_active(&self) -> usize {
        self.nr_active.load(Ordering::Acquire)
    }

    /// Handler `me` goes dormant, unless it is the last active one. Returns whether it did.
    pub(crate) fn try_retire(&self, me: usize) -> bool {
        // Only `me` clears its own flag: one already clear (a steer retired `me` earlier in
        // the same batch) must not be counted down twice, or the count falls below the
        // flags and the backlog cap loosens.
        if !self.active[me].load(Ordering::Acquire) {
            return false;
        }
        let mut n = self.nr_active.load(Ordering::Acquire);
        while n > 1 {
            match self.nr_active.compare_exchange_weak(n, n - 1, Ordering::AcqRel, Ordering::Acquire) {
                Ok(_) => {
                    self.active[me].store(false, Ordering::Release);
                    return true;
                }
                Err(now) => n = now,
            }
        }
        false
    }

    /// On a backlog: makes one dormant handler active and wakes it, unless half the CPUs
    /// serve faults already. Returns whether it did.
    pub(crate) fn add_for_backlog(&self) -> bool {
        if self.nr_active() >= self.max_active_for_backlog() {
            return false;
        }
        self.wake_one()
    }

    /// The most handlers backlogs make active: half the CPUs, the other half for the
    /// application (at least one). On 2 vCPUs a second active handler lost to one at 2, 8
    /// and 32 faulting threads (each of its `UFFDIO_MOVE`s then flushes a CPU busy with the
    /// process; docs/bench/design-measurements.md, "Handler placement").
    fn max_active_for_backlog(&self) -> usize {
        (self.nr_cpus / 2).max(1)
    }

    /// After a stream's window was served while another thread's fault waited: wakes a
    /// dormant handler as a helper, which serves [`HELPER_FAULTS`] faults and retires
    /// (whatever the CPU count: a few faults' help, not a second permanent poller).
    pub(crate) fn wake_helper(&self) -> bool {
        self.wake(true)
    }

    /// Whether handler `me` was woken as a helper (once per wake-up). Called on every round
    /// of a handler's loop: a load first keeps the flag's cache line shared.
    pub(crate) fn take_helper(&self, me: usize) -> bool {
        self.helper[me].load(Ordering::Acquire) && self.helper[me].swap(false, Ordering::AcqRel)
    }

    /// Makes one dormant handler active and wakes it. Returns whether there was one.
    pub(crate) fn wake_one(&self) -> bool {
        self.wake(false)
    }

    fn wake(&self, as_helper: bool) -> bool {
        let n = self.active.len();
        let start = self.next_wake.fetch_add(1, Ordering::Relaxed);
        (0..n).any(|k| self.activate((start + k) % n, as_helper))
    }

    /// Makes handler `i` active and wakes it, if it was dormant. Returns whether it was.
    fn activate(&self, i: usize, as_helper: bool) -> bool {
        if self.active[i].compare_exchange(false, true, Ordering::AcqRel, Ordering::Acquire).is_err() {
            return false;
        }
        self.helper[i].store(as_helper, Ordering::Release);
        let before = self.nr_active.fetch_add(1, Ordering::AcqRel);
        // The count never exceeds the active flags (a flag is set before its increment and
        // cleared after its decrement), and handler `i`'s was clear until just now.
        debug_assert!(before < self.active.len(), "more active handlers than handlers");
        self.dozes[i].wake();
        true
    }

    /// Hands handler `me`'s work to a dormant handler pinned to `cpu` (where the faulting
    /// threads run) and retires `me`. Returns whether it did: not if `me` runs there already,
    /// no handler is pinned there, or that one is active already.
    pub(crate) fn steer_to(&self, me: usize, cpu: usize) -> bool {
        if self.cpus[me] == Some(cpu) {
            return false;
        }
        let Some(to) = self.cpus.iter().position(|c| *c == Some(cpu)) else {
            return false;
        };
        // `me` is not on `cpu` (checked above): the handler found there is another one.
        debug_assert_ne!(to, me);
        self.activate(to, false) && self.try_retire(me)
    }

    /// Handler `me`, dormant, sleeps until it is made active or `stop` says to return.
    pub(crate) fn wait_dormant(&self, me: usize, stop: impl Fn() -> bool) {
        while !self.is_active(me) && !stop() {
            self.dozes[me].sleep(DORMANT_PARK);
        }
    }
}

/// The CPU thread `tid` of this process last ran on (`/proc/self/task/TID/stat`, field
/// 39), or None if it cannot be read (the thread exited). For a thread asleep in a fault,
/// where it will most likely run again: a thread woken from another CPU stays where it was
/// while its CPU is idle.
pub(crate) fn thread_last_cpu(tid: u32) -> Option<usize> {
    let stat = std::fs::read_to_string(format!("/proc/self/task/{tid}/stat")).ok()?;
    // Field 2, the command, is in parentheses and may hold spaces; field 3 follows it.
    let after_comm = &stat[stat.rfind(')')? + 1..];
    after_comm.split_ascii_whitespace().nth(39 - 3)?.parse().ok()
}

/// Threads [`describe_threads`] names at most (a JVM has hundreds).
const MAX_THREADS_DESCRIBED: usize = 256;

/// Where each thread of this process waits, as `name (tid): state, kernel function, system
/// call number`, joined by "; ": for the report of a page that stayed busy (its owner is one
/// of them, and the kernel function says what it waits for: `handle_userfault`, a fault of
/// its own; `userfaultfd_event_wait_completion`, an event not yet read), and for a hang's
/// dump in the tests. Allocates: not for the signal path.
pub fn describe_threads() -> String {
    describe_threads_up_to(MAX_THREADS_DESCRIBED)
}

fn describe_threads_up_to(max_threads: usize) -> String {
    let Ok(dir) = std::fs::read_dir("/proc/self/task") else {
        return "(/proc/self/task unreadable)".into();
    };
    let read = |tid: &str, what: &str| {
        let s = std::fs::read_to_string(format!("/proc/self/task/{tid}/{what}")).unwrap_or_default();
        s.trim().to_string()
    };
    let mut out = Vec::new();
    for task in dir.flatten().take(max_threads) {
        let tid = task.file_name().to_string_lossy().into_owned();
        let syscall = read(&tid, "syscall");
        let nr = syscall.split_ascii_whitespace().next().unwrap_or("?");
        // Field 3 of stat, after the command in parentheses (which may hold spaces).
        let stat = read(&tid, "stat");
        let state = stat.rsplit(')').next().and_then(|s| s.split_ascii_whitespace().next()).unwrap_or("?");
        out.push(format!("{} ({tid}): {state}, {}, syscall {nr}", read(&tid, "comm"), read(&tid, "wchan")));
    }
    out.join("; ")
}

/// How long a handler polls the descriptor without sleeping after serving a fault. About
/// three times the gap between two faults of a thread that does nothing else: a thread that
/// computes longer between faults finds the handler asleep.
pub(crate) const SPIN_AFTER_FAULT_NS: u64 = 20_000;
/// A spinning handler offers its CPU (`sched_yield`) every this many rounds of polling.
pub(crate) const SPIN_ROUNDS_PER_YIELD: u32 = 8;
/// A `sched_yield` in a spin that takes longer than this gave the CPU to another thread.
pub(crate) const SPIN_YIELD_TAKEN_NS: u64 = 5_000;
/// Spins a handler judges its spinning over.
pub(crate) const SPIN_WINDOW: u32 = 32;
/// Faults a handler serves without spinning after a window in which fewer than half its
/// spins found a fault, before it tries again.
pub(crate) const SPIN_BACKOFF_FAULTS: u32 = 4096;

/// One handler's view of its own wake-ups and of the threads whose faults it serves.
#[derive(Default)]
pub(crate) struct WakeTally {
    wakes: u32,
    useless: u32,
    served_alone: u32,
    spins: u32,
    spin_hits: u32,
    /// Faults left to serve without spinning (after a window of failed spins).
    spin_off_faults: u32,
    /// Woken as a helper: faults left to serve before retiring (0: not a helper).
    helper_faults_left: u32,
}

impl WakeTally {
    /// Whether to spin after serving a fault. A handler that sleeps in `poll` is woken by an
    /// IPI to its vCPU, which the faulting CPU pays and the host delivers slowly when the
    /// vCPU is halted; one that spins finds the next fault at once (and the faulting thread
    /// finds no waiter to wake), but keeps a CPU busy. Worth it while spins find faults, as
    /// the guest's halt-polling is worth it while wake-ups come soon.
    pub(crate) fn may_spin(&self) -> bool {
        self.spin_off_faults == 0
    }

    /// Records whether a spin found a fault before [`SPIN_AFTER_FAULT_NS`] ran out. At the end
    /// of a window with fewer hits than misses, spinning stops for [`SPIN_BACKOFF_FAULTS`]:
    /// returns true then.
    pub(crate) fn spun(&mut self, hit: bool) -> bool {
        self.spins += 1;
        self.spin_hits += u32::from(hit);
        debug_assert!(self.spin_hits <= self.spins && self.spins <= SPIN_WINDOW, "a spin window's tally");
        if self.spins < SPIN_WINDOW {
            return false;
        }
        let stop = self.spin_hits * 2 < self.spins;
        if stop {
            self.spin_off_faults = SPIN_BACKOFF_FAULTS;
        }
        self.spins = 0;
        self.spin_hits = 0;
        stop
    }

    /// Records `faults` served (the spin back-off and a helper's allowance count them).
    /// Returns true when a helper has served its allowance: time to retire.
    pub(crate) fn served(&mut self, faults: u32) -> bool {
        self.spin_off_faults = self.spin_off_faults.saturating_sub(faults);
        if self.helper_faults_left == 0 {
            return false;
        }
        self.helper_faults_left = self.helper_faults_left.saturating_sub(faults.max(1));
        self.helper_faults_left == 0
    }

    /// Starts a helper's allowance of [`HELPER_FAULTS`].
    pub(crate) fn start_helping(&mut self) {
        self.helper_faults_left = HELPER_FAULTS;
    }

    /// Records a wake-up from `poll`; `useful` if the read after it found a message. Returns
    /// true at the end of a window with too many useless wake-ups: time to retire.
    pub(crate) fn woke(&mut self, useful: bool) -> bool {
        self.wakes += 1;
        self.useless += u32::from(!useful);
        debug_assert!(self.useless <= self.wakes && self.wakes <= WAKE_WINDOW, "a wake window's tally");
        if self.wakes < WAKE_WINDOW {
            return false;
        }
        let retire = self.useless > RETIRE_USELESS_PER_WINDOW;
        self.wakes = 0;
        self.useless = 0;
        retire
    }

    /// Records `faults` served while the only active handler. Returns true every
    /// [`PROBE_EVERY_FAULTS`]: time to check where the faults come from.
    pub(crate) fn served_alone(&mut self, faults: u32) -> bool {
        self.served_alone += faults;
        if self.served_alone < PROBE_EVERY_FAULTS {
            return false;
        }
        self.served_alone = 0;
        true
    }

    /// Starts a fresh window (after a state change).
    pub(crate) fn reset(&mut self) {
        *self = WakeTally::default();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every thread is named with where it waits: a thread asleep in `nanosleep` is there,
    /// under its name and thread id, with the system call it is in.
    #[test]
    fn describe_threads_names_each_thread_and_where_it_waits() {
        let stop = std::sync::Arc::new(AtomicBool::new(false));
        let (tx, rx) = std::sync::mpsc::channel();
        let sleeper = std::thread::Builder::new()
            .name("uswap-t-sleeper".into())
            .spawn({
                let stop = stop.clone();
                move || {
                    // "/proc/thread-self" links to "<pid>/task/<tid>".
                    let link = std::fs::read_link("/proc/thread-self").unwrap();
                    tx.send(link.file_name().unwrap().to_string_lossy().into_owned()).unwrap();
                    // Bounded by the test, which sets `stop` once it has read the list.
                    while !stop.load(Ordering::Acquire) {
                        std::thread::sleep(Duration::from_millis(20));
                    }
                }
            })
            .unwrap();
        let tid = rx.recv().unwrap();
        let in_sleep = [libc::SYS_nanosleep, libc::SYS_clock_nanosleep].map(|nr| format!("syscall {nr}"));
        // A few tries: between two sleeps the thread runs (its syscall reads "running").
        let found = (0..50).find_map(|_| {
            std::thread::sleep(Duration::from_millis(5));
            let described = describe_threads_up_to(usize::MAX);
            let me = described.split("; ").find(|t| t.starts_with(&format!("uswap-t-sleeper ({tid}): ")))?;
            in_sleep.iter().any(|s| me.ends_with(s.as_str())).then(|| me.to_string())
        });
        stop.store(true, Ordering::Release);
        sleeper.join().unwrap();
        assert!(found.is_some(), "the sleeper was never named asleep: {}", describe_threads_up_to(usize::MAX));
    }

    #[test]
    fn handler_0_starts_alone_and_never_retires_alone() {
        let p = HandlerPool::new(vec![Some(0), Some(1), Some(2)], 3);
        assert_eq!(p.nr_active(), 1);
        assert!(p.is_active(0) && !p.is_active(1) && !p.is_active(2));
        assert!(!p.try_retire(0), "handler 0 is the last active one");
        assert!(p.wake_one() && p.wake_one());
        assert!(p.try_retire(0) && p.try_retire(2));
        assert!(!p.try_retire(1), "handler 1 is the last active one");
        assert_eq!(p.nr_active(), 1);
        assert!(p.is_active(1) && !p.is_active(0) && !p.is_active(2));
    }

    /// A handler a steer retired, retiring again at the end of its batch (as
    /// `handler_thread` does), is not counted down a second time.
    #[test]
    fn a_handler_retired_by_a_steer_is_not_retired_twice() {
        let p = HandlerPool::new(vec![Some(0), Some(1), Some(2)], 3);
        assert!(p.wake_one(), "handler 1 joins 0");
        assert_eq!(p.nr_active(), 2);
        assert!(p.steer_to(0, 2), "0 hands over to 2, pinned on CPU 2");
        assert!(!p.is_active(0) && p.is_active(1) && p.is_active(2));
        assert_eq!(p.nr_active(), 2);
        assert!(!p.try_retire(0), "0 is dormant already");
        assert_eq!(p.nr_active(), 2, "the count follows the flags");
    }

    #[test]
    fn wake_one_activates_each_dormant_handler_once() {
        let p = HandlerPool::new(vec![Some(0), Some(1), Some(2)], 3);
        assert!(p.wake_one());
        assert!(p.wake_one());
        assert!(!p.wake_one(), "all three are active");
        assert_eq!(p.nr_active(), 3);
        assert!((0..3).all(|i| p.is_active(i)));
    }

    #[test]
    fn backlogs_activate_at_most_half_the_cpus() {
        let p = HandlerPool::new((0..8).map(Some).collect(), 8);
        let added = (0..8).filter(|_| p.add_for_backlog()).count();
        assert_eq!((added, p.nr_active()), (3, 4));
        // Two CPUs: one handler, whatever the backlog.
        let p = HandlerPool::new(vec![Some(0), Some(1)], 2);
        assert!(!p.add_for_backlog());
        assert_eq!(p.nr_active(), 1);
    }

    #[test]
    fn a_helper_is_told_once_and_retires_after_its_allowance() {
        let p = HandlerPool::new(vec![Some(0), Some(1)], 2);
        assert!(!p.add_for_backlog(), "two CPUs: no second handler for a backlog");
        assert!(p.wake_helper(), "but one to help after a window");
        assert!(p.take_helper(1) && !p.take_helper(1));
        assert!(!p.wake_helper(), "both active");
        let mut t = WakeTally::default();
        assert!(!t.served(1), "not a helper: never told to retire");
        t.start_helping();
        assert!(!t.served(HELPER_FAULTS - 1));
        assert!(t.served(1));
        assert!(!t.served(1), "once");
    }

    #[test]
    fn steering_hands_over_to_the_handler_on_that_cpu() {
        let p = HandlerPool::new(vec![Some(0), Some(1), Some(2)], 3);
        assert!(!p.steer_to(0, 0), "already there");
        assert!(!p.steer_to(0, 7), "no handler on CPU 7");
        assert!(p.steer_to(0, 2));
        assert!(!p.is_active(0) && p.is_active(2) && !p.is_active(1));
        assert_eq!(p.nr_active(), 1);
        // Onto an active handler: nothing changes.
        assert!(p.wake_one() && p.wake_one());
        assert!(!p.steer_to(0, 2));
        assert_eq!(p.nr_active(), 3);
    }

    #[test]
    fn a_window_of_mostly_useless_wakes_says_retire() {
        let mut t = WakeTally::default();
        // A quarter useless: keep polling.
        assert!(!(0..WAKE_WINDOW).any(|i| t.woke(i % 4 != 0)));
        // Half useless (two handlers each first for half the faults): one should go.
        assert_eq!((0..WAKE_WINDOW).filter(|i| t.woke(i % 2 == 0)).count(), 1);
        // All useless: retire exactly at the window's end.
        let said: Vec<bool> = (0..WAKE_WINDOW).map(|_| t.woke(false)).collect();
        assert_eq!(said.iter().filter(|r| **r).count(), 1);
        assert!(said[WAKE_WINDOW as usize - 1]);
    }

    #[test]
    fn a_thread_pinned_to_a_cpu_is_found_there() {
        // On a thread of its own: the pinning must not outlive the test.
        std::thread::spawn(|| {
            // SAFETY: sched_getcpu has no arguments.
            let cpu = unsafe { libc::sched_getcpu() };
            assert!(cpu >= 0, "sched_getcpu");
            crate::mapping::pin_current_thread(cpu as usize).expect("pinning to the current CPU");
            // SAFETY: gettid has no arguments and cannot fail.
            let tid = unsafe { libc::gettid() } as u32;
            assert_eq!(thread_last_cpu(tid), Some(cpu as usize));
            assert_eq!(thread_last_cpu(u32::MAX), None, "no such thread");
        })
        .join()
        .expect("test thread");
    }

    #[test]
    fn spinning_stops_when_spins_find_nothing_and_comes_back() {
        let mut t = WakeTally::default();
        assert!(t.may_spin());
        // Half the spins found a fault: go on.
        assert_eq!((0..SPIN_WINDOW).filter(|i| t.spun(i % 2 == 0)).count(), 0);
        assert!(t.may_spin());
        // Fewer: stop for the back-off (said once, at the window's end), counted in faults
        // served.
        let stops: Vec<u32> = (0..SPIN_WINDOW).filter(|i| t.spun(i % 4 == 0)).collect();
        assert_eq!(stops, [SPIN_WINDOW - 1]);
        assert!(!t.may_spin());
        t.served(SPIN_BACKOFF_FAULTS - 1);
        assert!(!t.may_spin());
        t.served(16);
        assert!(t.may_spin());
    }

    #[test]
    fn a_lone_handler_probes_every_period() {
        let mut t = WakeTally::default();
        let probes = (0..3 * PROBE_EVERY_FAULTS).filter(|_| t.served_alone(1)).count();
        assert_eq!(probes, 3);
    }

    #[test]
    fn a_dormant_handler_returns_when_woken() {
        let p = std::sync::Arc::new(HandlerPool::new(vec![Some(0), Some(1)], 2));
        assert!(!p.is_active(1));
        let q = p.clone();
        let h = std::thread::spawn(move || {
            q.wait_dormant(1, || false);
            q.is_active(1)
        });
        // Whether or not the thread sleeps yet, the flag is what it waits on.
        std::thread::sleep(Duration::from_millis(20));
        assert!(p.wake_one());
        assert!(h.join().expect("dormant handler thread"), "woken handler is active");
    }
}
