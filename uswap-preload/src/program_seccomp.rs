//! The program's own seccomp filter: `prctl(PR_SET_SECCOMP)` and `seccomp(2)` (called
//! directly or through `syscall`), watched so that uswap makes no system call of its own
//! that the filter did not expect.
//!
//! Why: a sandboxed process (OpenSSH's pre-authentication child, a browser's renderer,
//! stress-ng's seccomp stressor) installs a filter that allows a handful of calls and traps
//! or kills on the rest. Its last calls, `write` and `_exit`, are in the list; but at
//! `_exit` uswap wrote the process's final report (`getpid`, then `/proc/self/maps`, a new
//! file), and the process died of `SIGSYS` where it would have exited 0. Once a filter is
//! in place, the process's exit writes no report and makes no call but `exit_group`: its
//! figures are those of its last measurement, and `uswap run` counts its charge as for a
//! process killed. What uswap's threads and, in signal mode, its fault handler call stays
//! as it is: a filter applied to every thread (`SECCOMP_FILTER_FLAG_TSYNC`) that forbids
//! them is not one uswap can run under (docs/cli.md, "A program's own seccomp filter").
//!
//! A process whose filter is in place starts no pager any more (a lazy start's calls and
//! threads would be the filter's). Not seen: a filter inherited across `execve` (the new
//! image starts without the flag), and one installed by a `vfork` child (which sets the
//! parent's flag too, in their shared memory: the parent then ends without its report).
//!
//! Locking: one flag, set once and never cleared (a filter cannot be removed; fork
//! children inherit it, and with it the flag).

use std::ffi::{c_int, c_long, c_ulong};
use std::sync::atomic::{AtomicBool, Ordering};

/// `prctl`'s option that installs a filter, and its two modes.
const PR_SET_SECCOMP: c_long = 22;
const SECCOMP_MODE_STRICT: c_long = 1;
const SECCOMP_MODE_FILTER: c_long = 2;
/// `seccomp(2)`'s operations that install one, and the flag with which a filter's
/// installation returns a descriptor (its listener) rather than 0.
const SECCOMP_SET_MODE_STRICT: c_long = 0;
const SECCOMP_SET_MODE_FILTER: c_long = 1;
const SECCOMP_FILTER_FLAG_NEW_LISTENER: c_long = 1 << 3;

static FILTERED: AtomicBool = AtomicBool::new(false);

/// Whether the program has installed a seccomp filter (or strict mode) in some thread.
pub fn filtered() -> bool {
    FILTERED.load(Ordering::Acquire)
}

/// After system call `nr` (`prctl` or `seccomp`) with its first two arguments returned
/// `ret`: notes a filter it installed.
pub fn note(nr: c_long, a1: c_long, a2: c_long, ret: c_long) {
    let installed = match nr {
        libc::SYS_prctl => a1 == PR_SET_SECCOMP && (a2 == SECCOMP_MODE_STRICT || a2 == SECCOMP_MODE_FILTER) && ret == 0,
        libc::SYS_seccomp if a1 == SECCOMP_SET_MODE_FILTER && a2 & SECCOMP_FILTER_FLAG_NEW_LISTENER != 0 => ret >= 0,
        libc::SYS_seccomp => (a1 == SECCOMP_SET_MODE_STRICT || a1 == SECCOMP_SET_MODE_FILTER) && ret == 0,
        _ => false,
    };
    if installed {
        FILTERED.store(true, Ordering::Release);
    }
}

/// `prctl`'s option that turns syscall user dispatch on, and its "on".
const PR_SET_SYSCALL_USER_DISPATCH: c_long = 59;
const PR_SYS_DISPATCH_ON: c_long = 1;

/// `prctl`, interposed: the C library's is the system call and nothing more.
#[no_mangle]
pub extern "C" fn prctl(option: c_int, a2: c_ulong, a3: c_ulong, a4: c_ulong, a5: c_ulong) -> c_int {
    let (option, a2) = (option as c_long, a2 as c_long);
    // SAFETY: the program's own call, passed on as it made it.
    let ret = unsafe { libc::syscall(libc::SYS_prctl, option, a2, a3, a4, a5) };
    note(libc::SYS_prctl, option, a2, ret);
    if option == PR_SET_SYSCALL_USER_DISPATCH && a2 == PR_SYS_DISPATCH_ON && ret == 0 {
        say_dispatch_once();
    }
    ret as c_int
}

/// Syscall user dispatch (Wine's, stress-ng's usersyscall stressor) traps every system call
/// made outside the code the program allows, the C library's in general. In signal mode
/// the C library's calls are made from uswap's code (`uswap::syscall_guard`), outside that
/// range, and the program's handler gets them as its own (stress-ng: "didn't get pid on
/// libc getpid syscall"). Said once; thread mode leaves the C library's calls where they are.
fn say_dispatch_once() {
    static SAID: AtomicBool = AtomicBool::new(false);
    let signal_mode = crate::pager().is_some_and(|p| p.fault_mode() == uswap::FaultMode::Signal);
    if signal_mode && !SAID.swap(true, Ordering::Relaxed) {
        crate::real::write_stderr(
            b"uswap: the program turned on syscall user dispatch (PR_SET_SYSCALL_USER_DISPATCH): in signal \
              mode the C library's system calls are made from uswap's code, outside the range it allows, \
              and reach its handler; run it with --fault-mode thread (docs/cli.md)\n",
        );
    }
}
