//! The signals of `uswap run` itself: those a supervisor sends it, passed on to the program
//! ([`ForwardSignals`]), the terminal's, left to the program ([`IgnoreTerminalSignals`]), and
//! the stop they make of a run ([`stopped_by`]).
//!
//! Locking: none; the handler uses atomics and `kill(2)` only (async-signal-safe).

use std::sync::atomic::Ordering;

/// SIGINT and SIGQUIT ignored while it lives (restored on drop).
pub(super) struct IgnoreTerminalSignals {
    old: [libc::sighandler_t; 2],
}

impl IgnoreTerminalSignals {
    pub(super) fn new() -> Self {
        // SAFETY: signal(2) with SIG_IGN installs no handler code; the old dispositions are
        // restored on drop.
        let old = unsafe { [libc::signal(libc::SIGINT, libc::SIG_IGN), libc::signal(libc::SIGQUIT, libc::SIG_IGN)] };
        IgnoreTerminalSignals { old }
    }
}

impl Drop for IgnoreTerminalSignals {
    fn drop(&mut self) {
        // SAFETY: restores the dispositions saved in `new`.
        unsafe {
            libc::signal(libc::SIGINT, self.old[0]);
            libc::signal(libc::SIGQUIT, self.old[1]);
        }
    }
}

/// Signals sent to `uswap run` alone (by a supervisor: `kill`, `timeout`, systemd, `docker
/// stop`), passed on to the program, which decides what to do with them; `uswap run` waits
/// for it as for any end. They killed `uswap run` before, leaving the program running
/// unsupervised and the run's directory behind. (SIGINT and SIGQUIT come from a terminal to
/// the whole group, the program included: ignored here, not passed on twice.)
const FORWARDED_SIGNALS: [libc::c_int; 4] = [libc::SIGTERM, libc::SIGHUP, libc::SIGUSR1, libc::SIGUSR2];

/// The program's pid, for [`forward_signal`]; 0 before it is started.
static PROGRAM_PID: std::sync::atomic::AtomicI32 = std::sync::atomic::AtomicI32::new(0);
/// A signal that came before the program was started, passed on once it is.
static PENDING_SIGNAL: std::sync::atomic::AtomicI32 = std::sync::atomic::AtomicI32::new(0);
/// The first SIGTERM or SIGHUP that came (0 before): the run is being stopped, its tree is
/// ended once the program is (`end_stopped_tree`), and its clean-up must not wait long on a
/// device (see `Launch`'s drop).
static STOPPED_BY: std::sync::atomic::AtomicI32 = std::sync::atomic::AtomicI32::new(0);

/// The signal that stopped the run, if one did.
pub(super) fn stopped_by() -> Option<libc::c_int> {
    Some(STOPPED_BY.load(Ordering::Relaxed)).filter(|&sig| sig != 0)
}

/// Blocks [`FORWARDED_SIGNALS`] in this thread. The engine's threads (the tree's counters'
/// server among them) block them from their start, so one that comes now stays pending,
/// unhandled, until `uswap run` exits with the program's status (or, under `--strict
/// --auto`, runs the handler on the budget's thread, which only records it). A signal
/// handled here would cut short a read from a Redis store (a socket with a timeout returns
/// EINTR whatever `SA_RESTART` says) and fail the deletion of the run's keys.
pub(super) fn hold_forwarded_signals() {
    // SAFETY: sigemptyset, sigaddset and pthread_sigmask only write the set on our stack and
    // this thread's signal mask.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        for sig in FORWARDED_SIGNALS {
            libc::sigaddset(&mut set, sig);
        }
        libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut());
    }
}

extern "C" fn forward_signal(sig: libc::c_int) {
    if sig == libc::SIGTERM || sig == libc::SIGHUP {
        let _ = STOPPED_BY.compare_exchange(0, sig, Ordering::Relaxed, Ordering::Relaxed);
    }
    let pid = PROGRAM_PID.load(Ordering::Relaxed);
    if pid <= 0 {
        PENDING_SIGNAL.store(sig, Ordering::Relaxed);
        return;
    }
    // SAFETY: kill(2) is async-signal-safe; it sends a signal to the program we started.
    // errno is saved and restored: the handler may interrupt code that is about to read it.
    unsafe {
        let errno = *libc::__errno_location();
        libc::kill(pid, sig);
        *libc::__errno_location() = errno;
    }
}

/// [`FORWARDED_SIGNALS`] passed on to the program while it lives. Set before the program
/// starts (an exec resets caught signals, so the program does not inherit the handler); one
/// that comes before is passed on once it runs. Once the program is reaped (drop) they stay
/// caught, only recorded, until the clean-up holds them (`hold_forwarded_signals`), never back
/// at their default action: a supervisor that stops a run signals
/// its whole process group (`timeout`, `kill -TERM -PGID`, a service manager), and its
/// signal may reach `uswap run` after the program ended, while it ends the tree. With the
/// old dispositions back, that signal killed `uswap run` there, silently, and the tree's
/// processes that ignore SIGTERM ran on (7 of 40 runs of `timeout` on a loaded machine).
/// A signal `uswap run` was started with ignored stays ignored, and the program inherits
/// that: `nohup uswap run ...` leaves the program's SIGHUP ignored, as `nohup` promises (a
/// caught signal is reset at exec, so handling it here gave the program the default action).
pub(super) struct ForwardSignals;

impl ForwardSignals {
    pub(super) fn new() -> Self {
        let handler = forward_signal as extern "C" fn(libc::c_int) as libc::sighandler_t;
        for sig in FORWARDED_SIGNALS {
            // SAFETY: a null new action only reads the current one into `old`.
            let ignored = unsafe {
                let mut old: libc::sigaction = std::mem::zeroed();
                libc::sigaction(sig, std::ptr::null(), &mut old) == 0 && old.sa_sigaction == libc::SIG_IGN
            };
            if !ignored {
                // SAFETY: the handler only uses atomics and kill(2), both async-signal-safe.
                unsafe { libc::signal(sig, handler) };
            }
        }
        ForwardSignals
    }

    /// From now on signals go to `program_pid`, and one that came before goes now.
    pub(super) fn forward_to(&mut self, program_pid: u32) {
        PROGRAM_PID.store(program_pid as i32, Ordering::Relaxed);
        let sig = PENDING_SIGNAL.swap(0, Ordering::Relaxed);
        if sig != 0 {
            // SAFETY: kill(2) on the program we just started.
            unsafe { libc::kill(program_pid as i32, sig) };
        }
    }
}

impl Drop for ForwardSignals {
    /// The program was reaped: its pid may be anyone's now, so nothing is forwarded any more;
    /// the signals stay caught (see above).
    fn drop(&mut self) {
        PROGRAM_PID.store(0, Ordering::Relaxed);
    }
}
