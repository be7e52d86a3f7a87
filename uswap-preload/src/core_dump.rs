//! Core dumps: a managed process killed by a signal that dumps core has in its dump what it
//! had out of RAM, as under the kernel's swap (`uswap::prepare_core_dump`; without it each
//! such page was a hole, read as zeros by a debugger).
//!
//! The kernel gives no hook between a fatal signal and its dump, so this library stands in
//! for the default action. Where the program leaves a signal whose default action dumps
//! core ([`DUMPING_SIGNALS`]) at `SIG_DFL`, and a dump would be kept (`RLIMIT_CORE` of a
//! page or more, or a `core_pattern` that pipes to a program other than systemd-coredump,
//! which the kernel feeds whatever the limit; the process dumpable), [`on_dumping_signal`]
//! is installed in its place. It prepares the
//! dump, puts `SIG_DFL` back and sends its thread the same signal with the same `siginfo`,
//! which the kernel delivers once the handler returns: the default action, with the signal,
//! code and address the dump would have said.
//!
//! The program sees `SIG_DFL`: `sigaction` and `signal` report it while the stand-in is
//! installed, a handler of the program's replaces it, and `SIG_DFL` set again puts it back.
//! SIGBUS is uswap's (`uswap::sigbus`). Not covered: actions read or set with the raw system
//! call (the stand-in shows), or by the C library's `sigset`, `sysv_signal` and `bsd_signal`,
//! and a default the kernel puts back (`SA_RESETHAND`): the dump then has the holes, as
//! before. A `vfork` child changes nothing of its parent's (it shares its memory).
//!
//! Locking: none; atomics. The handler allocates nothing; a second thread dying meanwhile
//! waits, bounded, for the first one's preparation.

use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};

use crate::{own_code, real};

/// The signals whose default action dumps core (signal(7)), less SIGBUS.
const DUMPING_SIGNALS: [libc::c_int; 9] = [
    libc::SIGQUIT,
    libc::SIGILL,
    libc::SIGTRAP,
    libc::SIGABRT,
    libc::SIGFPE,
    libc::SIGSEGV,
    libc::SIGSYS,
    libc::SIGXCPU,
    libc::SIGXFSZ,
];

/// The stand-ins are on: a pager runs and a dump would be written when it started (or
/// when the program last raised `RLIMIT_CORE`).
static ENABLED: AtomicBool = AtomicBool::new(false);

/// The preparation of a dump: not begun, under way, done.
static PREPARATION: AtomicU32 = AtomicU32::new(NOT_BEGUN);
/// The thread preparing it: a fatal signal of its own meanwhile (an abort in the engine)
/// must not wait for itself.
static PREPARER_TID: AtomicU32 = AtomicU32::new(0);
const NOT_BEGUN: u32 = 0;
const UNDER_WAY: u32 = 1;
const DONE: u32 = 2;

/// How long a second thread dying waits for the first one's preparation: a dump past this
/// has holes where the first one had not reached.
const MAX_WAIT_MS: u32 = 120_000;

/// Installs the stand-ins, if a dump would be written (called once the pager runs, and when
/// the program sets `RLIMIT_CORE`).
pub fn start() {
    if ENABLED.load(Ordering::Acquire) || !dump_would_be_written() {
        return;
    }
    ENABLED.store(true, Ordering::Release);
    for sig in DUMPING_SIGNALS {
        let mut now = default_action();
        // SAFETY: reads the action of a valid signal into our struct.
        if unsafe { real::sigaction(sig, std::ptr::null(), &mut now) } == 0 && now.sa_sigaction == libc::SIG_DFL {
            stand_in(sig, true);
        }
    }
}

/// Whether the program's `sigaction` and `signal` calls on `sig` go through
/// [`program_sigaction`].
pub fn intercepts(sig: libc::c_int) -> bool {
    ENABLED.load(Ordering::Acquire)
        && DUMPING_SIGNALS.contains(&sig)
        && !own_code::in_uswap()
        && !uswap::is_engine_thread()
        && !crate::is_unmanaged_fork_child()
        && crate::own_process::is_own_process()
}

/// The program's `sigaction(sig, act, old)` on a signal [`intercepts`] takes: `SIG_DFL`
/// keeps (or puts) the stand-in in place, any other action replaces it; `old` says `SIG_DFL`
/// where the stand-in was.
///
/// # Safety
/// `act` and `old` are null or valid, as for `sigaction(2)`.
pub unsafe fn program_sigaction(
    sig: libc::c_int,
    act: *const libc::sigaction,
    old: *mut libc::sigaction,
) -> libc::c_int {
    // SAFETY: `act` is null or valid (the caller's contract).
    let wants_default = match unsafe { act.as_ref() } {
        None => {
            return if standing_in(sig) {
                // SAFETY: `old` is null or valid for a write.
                unsafe { report_default(old) };
                0
            } else {
                // SAFETY: the caller's arguments.
                unsafe { real::sigaction(sig, act, old) }
            };
        }
        Some(a) => a.sa_sigaction == libc::SIG_DFL,
    };
    if wants_default {
        if !standing_in(sig) {
            // SAFETY: reads the action being replaced into the caller's `old`.
            let r = unsafe { real::sigaction(sig, std::ptr::null(), old) };
            if r != 0 {
                return r;
            }
            // In place of whatever the action is: the program asked for the default.
            stand_in(sig, false);
            return 0;
        }
        // SAFETY: as above.
        unsafe { report_default(old) };
        return 0;
    }
    let was_standing_in = standing_in(sig);
    // SAFETY: the caller's arguments: its action replaces the stand-in.
    let r = unsafe { real::sigaction(sig, act, old) };
    if r == 0 && was_standing_in {
        // SAFETY: as above.
        unsafe { report_default(old) };
    }
    r
}

/// Whether the stand-in is `sig`'s action now, as the kernel has it: a flag of ours could be
/// stale (an action set past this library, by the C library's `sigset` or the raw system
/// call; a `vfork` child's calls, in its parent's memory), and a `SIG_DFL` taken for already
/// in place would then be lost.
fn standing_in(sig: libc::c_int) -> bool {
    let mut now = default_action();
    // SAFETY: reads the action of a valid signal into our struct.
    unsafe { real::sigaction(sig, std::ptr::null(), &mut now) == 0 && now.sa_sigaction == stand_in_handler() }
}

/// [`on_dumping_signal`] as an action's handler.
fn stand_in_handler() -> libc::sighandler_t {
    on_dumping_signal as *const () as libc::sighandler_t
}

/// `SIG_DFL`, no flags, an empty mask.
fn default_action() -> libc::sigaction {
    // SAFETY: an all-zero sigaction is SIG_DFL with no flags and an empty mask.
    unsafe { std::mem::zeroed() }
}

/// Writes `SIG_DFL` to `old` unless it is null.
///
/// # Safety
/// `old` is null or valid for a write.
unsafe fn report_default(old: *mut libc::sigaction) {
    if !old.is_null() {
        // SAFETY: the caller's contract.
        unsafe { *old = default_action() };
    }
}

/// Installs [`on_dumping_signal`] for `sig`; `over_default_only`: in place of `SIG_DFL` only
/// (an action another thread of the program set meanwhile is put back).
fn stand_in(sig: libc::c_int, over_default_only: bool) {
    let mut a = default_action();
    a.sa_sigaction = stand_in_handler();
    a.sa_flags = libc::SA_SIGINFO | libc::SA_ONSTACK | libc::SA_RESTART;
    // SAFETY: a valid sigset of our struct. Every signal waits while the process prepares
    // its dump, but SIGBUS, through which a signal-mode thread is served.
    unsafe {
        libc::sigfillset(&mut a.sa_mask);
        libc::sigdelset(&mut a.sa_mask, libc::SIGBUS);
    }
    let mut replaced = default_action();
    // SAFETY: installs our handler, a valid extern "C" function of the signature SA_SIGINFO
    // asks for, reading the action it replaces into ours.
    if unsafe { real::sigaction(sig, &a, &mut replaced) } != 0 {
        return;
    }
    if over_default_only && replaced.sa_sigaction != libc::SIG_DFL && replaced.sa_sigaction != stand_in_handler() {
        // SAFETY: puts back the action we read, as it was.
        unsafe { real::sigaction(sig, &replaced, std::ptr::null_mut()) };
    }
}

/// The stand-in for the default action of a dumping signal: see the module doc.
extern "C" fn on_dumping_signal(sig: libc::c_int, info: *mut libc::siginfo_t, _ctx: *mut libc::c_void) {
    let errno = std::io::Error::last_os_error().raw_os_error().unwrap_or(0);
    // Not from inside uswap (a fault of its own code: the dump shows it as it is), nor in a
    // fork child whose regions are its parent's, nor in a vfork child (its parent's memory).
    // A signal sent (`abort`, `kill`) rather than raised by a fault (si_code > 0) is not a
    // fault of uswap's even while the thread prepares a system call's memory: only a thread
    // holding an engine lock is left as it is then.
    // SAFETY: the kernel's siginfo for this delivery.
    let raised_by_fault = unsafe { info.as_ref() }.is_some_and(|i| i.si_code > 0);
    let ours = own_code::in_uswap()
        || uswap::is_engine_thread()
        || uswap::sigbus::in_handler()
        || uswap::this_thread_is_in_the_engine(!raised_by_fault);
    let managed = !crate::is_unmanaged_fork_child() && crate::own_process::is_own_process() && crate::pager().is_some();
    if !ours && managed && dump_would_be_written() {
        prepare_once(sig);
    }
    let dfl = default_action();
    // SAFETY: restores the default action; `info` is the kernel's for this delivery, sent
    // back to this very thread (which the kernel allows for any code); the ids are ours.
    unsafe {
        real::sigaction(sig, &dfl, std::ptr::null_mut());
        let (pid, tid) = (libc::getpid(), libc::gettid());
        if libc::syscall(libc::SYS_rt_tgsigqueueinfo, pid, tid, sig, info) != 0 {
            libc::syscall(libc::SYS_tgkill, pid, tid, sig);
        }
        // Delivered as the handler returns; should it not be, the program goes on as it was.
        *libc::__errno_location() = errno;
    }
}

/// Prepares the dump once for the process; another thread dying meanwhile waits for it.
fn prepare_once(sig: libc::c_int) {
    // SAFETY: gettid has no memory effects.
    let tid = unsafe { libc::gettid() } as u32;
    if PREPARATION.compare_exchange(NOT_BEGUN, UNDER_WAY, Ordering::AcqRel, Ordering::Acquire).is_err() {
        if PREPARER_TID.load(Ordering::Acquire) == tid {
            return;
        }
        for _ in 0..MAX_WAIT_MS {
            if PREPARATION.load(Ordering::Acquire) == DONE {
                break;
            }
            // `nanosleep`: async-signal-safe.
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        return;
    }
    PREPARER_TID.store(tid, Ordering::Release);
    let done = uswap::prepare_core_dump();
    if done.nr_pages_left_out > 0 {
        let page_kib = uswap::PAGE_SIZE as u64 / 1024;
        uswap::sigbus::StderrLine::default()
            .put(b"uswap: process ")
            // SAFETY: getpid has no memory effects.
            .put_number(unsafe { libc::getpid() } as u64, 10, 1)
            .put(b" dies of signal ")
            .put_number(sig as u64, 10, 1)
            .put(b" with a core dump: ")
            .put_number(done.nr_pages_left_out * page_kib, 10, 1)
            .put(
                b" KiB of its memory that was out of RAM could not be brought back for it (more than the machine or \
                   its cgroup had available, more than a minute's reading, or unreadable); the dump has zeros there\n",
            )
            .write();
    }
    PREPARATION.store(DONE, Ordering::Release);
}

/// Whether a core dump of this process would be kept now: dumpable, and either
/// `RLIMIT_CORE` is at least a page or `core_pattern` pipes to a program that keeps dumps
/// whatever the limit (the kernel feeds a pipe whatever the limit; systemd-coredump drops a
/// dump the limit disables, apport keeps it in its crash report). System calls only: called
/// in a signal handler.
fn dump_would_be_written() -> bool {
    // SAFETY: PR_GET_DUMPABLE reads a flag of this process.
    if unsafe { libc::prctl(libc::PR_GET_DUMPABLE) } <= 0 {
        return false;
    }
    let mut limit = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: reads this process's limit into our struct (the raw call: `getrlimit` is
    // interposed by this library, and `rlimit` calls on `core_dump`).
    let r = unsafe { libc::syscall(libc::SYS_prlimit64, 0, libc::RLIMIT_CORE, std::ptr::null::<u8>(), &mut limit) };
    if r == 0 && limit.rlim_cur >= uswap::PAGE_SIZE as u64 {
        return true;
    }
    core_pattern_pipes()
}

/// Whether `/proc/sys/kernel/core_pattern` pipes to a program other than systemd-coredump.
fn core_pattern_pipes() -> bool {
    let mut buf = [0u8; 256];
    let Some(pattern) = uswap::read_small_file(c"/proc/sys/kernel/core_pattern", &mut buf) else { return false };
    const SYSTEMD: &[u8] = b"systemd-coredump";
    pattern.first() == Some(&b'|') && !pattern.windows(SYSTEMD.len()).any(|w| w == SYSTEMD)
}
