//! The engine's own file descriptors, kept out of the program's way.
//!
//! A pager lives in the program's process and so in its descriptor table: userfaultfds, an
//! eventfd, the stats socket, a file device and its io_uring. Daemons and sandboxes close
//! every descriptor above 2 at start (`close_range(3, ~0U, 0)`, `closefrom`, a `close`
//! loop) or `dup2` `/dev/null` over 3..63. Closing a pager's userfaultfd silently
//! unregisters every region (what was swapped out would read as zeros); a number the
//! program reuses would receive the engine's ioctls.
//!
//! Two defences. [`relocate`] moves a descriptor up to [`fd_base`] and beyond (the lowest
//! free numbers stay the program's, and loops over the low numbers never meet ours). And
//! every number the engine holds is registered here ([`keep`]), so that a library that
//! interposes the program's `close`, `close_range`, `dup2` and the like (`uswap run`'s) can
//! leave them alone ([`is_kept`], [`kept`]). Where nothing interposes (the library APIs),
//! a thread of the engine holds the userfaultfd where the program cannot close it, and the
//! first fault that needs a descriptor the program closed ends the process ([`Keeper`]).
//!
//! Locking: none. The table is a fixed array of atomics, read without locks (an interposed
//! `close` may run anywhere, a signal handler included). Invariant: a number is registered
//! from before the engine first uses it until before it is closed (a [`Kept`] is declared
//! ahead of the descriptor it guards, so it drops first).

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicI32, AtomicU32, Ordering};

/// Descriptors registered at once, over all pagers (a few per pager).
const MAX_KEPT: usize = 256;
static KEPT: [AtomicI32; MAX_KEPT] = [const { AtomicI32::new(-1) }; MAX_KEPT];

/// The lowest number [`relocate`] moves descriptors to: 768 when the soft limit on open
/// files is the usual 1024 or more (fd tables stay small; programs that raise the limit
/// get their new numbers lowest first, below ours), half the limit below that.
pub fn fd_base() -> RawFd {
    let mut lim = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: getrlimit writes one rlimit struct.
    let soft = if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) } == 0 { lim.rlim_cur } else { 1024 };
    if soft >= 1024 {
        768
    } else {
        (soft / 2).max(3) as RawFd
    }
}

/// Moves `fd` to the lowest free number at or above [`fd_base`] (close-on-exec), or leaves
/// it where it is if that fails (a low limit on open files): it is still [`keep`]-able.
pub(crate) fn relocate(fd: OwnedFd) -> OwnedFd {
    if fd.as_raw_fd() >= fd_base() {
        return fd;
    }
    // SAFETY: F_DUPFD_CLOEXEC on a descriptor we own returns a new one we own, or -1.
    let high = unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_DUPFD_CLOEXEC, fd_base()) };
    if high < 0 {
        return fd;
    }
    // SAFETY: `high` is a fresh descriptor nobody else owns; `fd` is closed by its drop.
    unsafe { OwnedFd::from_raw_fd(high) }
}

/// A registered descriptor number; dropping it unregisters the number. Declare it before
/// the descriptor it guards.
#[derive(Debug)]
pub(crate) struct Kept {
    slot: Option<usize>,
}

/// Registers `fd` as the engine's. If the table is full the number is not protected (the
/// engine still works; a program that closes it then breaks the pager, as before).
pub(crate) fn keep(fd: RawFd) -> Kept {
    for (i, s) in KEPT.iter().enumerate() {
        if s.compare_exchange(-1, fd, Ordering::AcqRel, Ordering::Relaxed).is_ok() {
            return Kept { slot: Some(i) };
        }
    }
    Kept { slot: None }
}

impl Drop for Kept {
    fn drop(&mut self) {
        if let Some(i) = self.slot {
            KEPT[i].store(-1, Ordering::Release);
        }
    }
}

/// Whether `fd` is one of the engine's descriptors. Lock-free and allocation-free.
pub fn is_kept(fd: RawFd) -> bool {
    fd >= 0 && KEPT.iter().any(|s| s.load(Ordering::Acquire) == fd)
}

/// The engine's descriptors now, sorted, in a fixed array (no allocation): the numbers,
/// and how many there are.
pub fn kept() -> ([RawFd; MAX_KEPT], usize) {
    let mut out = [0; MAX_KEPT];
    let mut n = 0;
    for s in &KEPT {
        let fd = s.load(Ordering::Acquire);
        if fd >= 0 {
            out[n] = fd;
            n += 1;
        }
    }
    out[..n].sort_unstable();
    (out, n)
}

/// Ends the process because the program closed `fd`, one of a pager's descriptors (its
/// userfaultfd or the doorbell that wakes the thread reading it), as a library cannot stop
/// it from doing (`uswap run`'s can). Once the last reference to a userfaultfd goes, the
/// kernel unregisters its regions: a page that was out of RAM reads as zeros, and a page
/// the program writes there is not the engine's any more. Going on would hand the program
/// wrong bytes without a word; ending it names the cause.
pub(crate) fn closed_by_program(fd: RawFd) -> ! {
    let message = format!(
        "uswap: the program closed descriptor {fd}, a pager's own (its userfaultfd, or the doorbell of the thread that \
         reads it): code that closes descriptors it did not open (close_range(3, ~0U, 0), closefrom, \
         os.closerange, a close loop) ran after the pager was made, and the pager was needed after it. Its pages out \
         of RAM can no longer come back, so the process aborts. Make the pager after that code runs, or run the \
         program under `uswap run`, which keeps its descriptors open.\n"
    );
    // One write(2), not Rust's stderr: its lock may be held by a thread of the program, and
    // nothing may keep the abort waiting.
    // SAFETY: writes the bytes of a string we own to descriptor 2; the result is ignored.
    unsafe { libc::write(2, message.as_ptr().cast(), message.len()) };
    std::process::abort()
}

/// A pager's hold on its userfaultfd where the program cannot close it, and what the
/// pager's threads do once the program closed it anyway (library APIs only: `uswap run`'s
/// library keeps the descriptors open).
///
/// A thread of the engine, the keeper ([`Keeper::hold`]), takes a descriptor table of its
/// own (`unshare(CLONE_FILES)`), a copy of the process's in which it closes everything but
/// the userfaultfd. The file lives as long as the keeper does, so a
/// program that closes every descriptor above 2 does not unregister the regions: no page
/// that was out reads as zeros. The thread that then finds the number closed
/// ([`Keeper::found_closed`]) wakes the keeper and parks; a fault or an event that needs
/// the descriptor after that queues a message on the file, which the keeper sees and says
/// so to the parked threads, one of which ends the process ([`closed_by_program`]; the
/// keeper cannot: its table has no stderr), the thread that faulted still waiting in the
/// kernel. A process that closes descriptors and execs (`subprocess` in a child that made a
/// pager: `preexec_fn` and `close_fds`) needs nothing and is not ended.
///
/// Locking: one atomic word of flags, waited on with a futex. Invariant: `HELD` is set only
/// by the keeper, once its table holds the pager's file and nothing of the program's.
#[derive(Debug, Default)]
pub struct Keeper {
    state: AtomicU32,
}

/// The keeper holds the userfaultfd in its own table.
const HELD: u32 = 1;
/// A thread of the pager found a descriptor of the pager closed.
const CLOSED: u32 = 2;
/// The pager is shutting down: the keeper and parked threads return.
const SHUTDOWN: u32 = 4;
/// After `CLOSED`, a message came on the userfaultfd: a fault or an event needs it.
const NEEDED: u32 = 8;
/// The keeper could not hold the file (`unshare` refused, or the number already closed).
const REFUSED: u32 = 16;
/// How long the keeper gives a parked thread to end the process with its message before
/// it aborts it itself, without one.
const NEEDED_GRACE_MS: u64 = 1000;
/// How often a keeper watching a closed descriptor looks at the shutdown flag.
const WATCH_POLL_MS: i32 = 100;

impl Keeper {
    pub const fn new() -> Keeper {
        Keeper { state: AtomicU32::new(0) }
    }

    /// The keeper thread's body: holds `uffd` in a table of its own until the pager shuts
    /// down (see the type). Returns at once, holding nothing, where the kernel
    /// or a sandbox refuses `unshare(CLONE_FILES)`: a thread that finds the descriptor
    /// closed then ends the process itself.
    pub fn hold(&self, uffd: RawFd) {
        // SAFETY: unshare(CLONE_FILES) gives this thread its own copy of the descriptor
        // table; it touches no memory of ours.
        if unsafe { libc::unshare(libc::CLONE_FILES) } != 0 {
            self.decide(REFUSED);
            return;
        }
        if !is_the_process_file(uffd) {
            // The program closed or replaced the number before the copy: hold nothing of it.
            close_all_but(&[]);
            self.decide(REFUSED);
            return;
        }
        close_all_but(&[uffd]);
        self.decide(HELD);
        // Bounded by the pager's life: every wake-up rereads the flags.
        loop {
            let s = self.state.load(Ordering::Acquire);
            if s & SHUTDOWN != 0 {
                return;
            }
            if s & CLOSED != 0 {
                break;
            }
            futex_wait(&self.state, s);
        }
        let mut pfd = libc::pollfd { fd: uffd, events: libc::POLLIN, revents: 0 };
        while self.state.load(Ordering::Acquire) & SHUTDOWN == 0 {
            // SAFETY: poll reads and writes one pollfd we own.
            if unsafe { libc::poll(&mut pfd, 1, WATCH_POLL_MS) } > 0 && pfd.revents & libc::POLLIN != 0 {
                self.state.fetch_or(NEEDED, Ordering::AcqRel);
                futex_wake(&self.state);
                std::thread::sleep(std::time::Duration::from_millis(NEEDED_GRACE_MS));
                std::process::abort();
            }
        }
    }

    /// Sets `outcome` (`HELD` or `REFUSED`) and wakes [`Keeper::wait_until_held`].
    fn decide(&self, outcome: u32) {
        self.state.fetch_or(outcome, Ordering::AcqRel);
        futex_wake(&self.state);
    }

    /// Waits until the keeper thread holds the file or could not: the pager is returned to
    /// the program only then, or a program that closes its descriptors at once (a fork
    /// child that re-armed a pager, then execs) would find no keeper. Bounded: past about
    /// a second (a keeper thread not scheduled) it returns, and the pager runs without one.
    pub fn wait_until_held(&self) {
        for _ in 0..10_000 {
            if self.state.load(Ordering::Acquire) & (HELD | REFUSED) != 0 {
                return;
            }
            std::thread::sleep(std::time::Duration::from_micros(100));
        }
    }

    /// Called by a pager thread whose poll found `fd`, a descriptor of the pager, closed
    /// (`POLLNVAL`). Without a keeper, ends the process; with one, wakes it and parks the
    /// caller until the pager shuts down, then returns, or until the keeper says the
    /// descriptor is needed, then ends the process.
    pub fn found_closed(&self, fd: RawFd) {
        let s = self.state.fetch_or(CLOSED, Ordering::AcqRel);
        if s & HELD == 0 {
            closed_by_program(fd);
        }
        futex_wake(&self.state);
        // Bounded by the pager's life.
        loop {
            let s = self.state.load(Ordering::Acquire);
            if s & NEEDED != 0 {
                closed_by_program(fd);
            }
            if s & SHUTDOWN != 0 {
                return;
            }
            futex_wait(&self.state, s);
        }
    }

    /// Lets the keeper and parked threads return (the pager shuts down).
    pub fn shut_down(&self) {
        self.state.fetch_or(SHUTDOWN, Ordering::AcqRel);
        futex_wake(&self.state);
    }
}

/// Whether `fd` in this thread's table is the file the process's own table has under that
/// number (`kcmp`); true where the kernel cannot say (no `kcmp`).
fn is_the_process_file(fd: RawFd) -> bool {
    const KCMP_FILE: libc::c_long = 0;
    // SAFETY: getpid and gettid take no arguments; kcmp compares two tasks' files and
    // touches no memory.
    let r = unsafe {
        let tid = libc::syscall(libc::SYS_gettid);
        libc::syscall(
            libc::SYS_kcmp,
            libc::getpid() as libc::c_long,
            tid,
            KCMP_FILE,
            fd as libc::c_long,
            fd as libc::c_long,
        )
    };
    match r {
        0 => true,
        -1 => matches!(std::io::Error::last_os_error().raw_os_error(), Some(libc::ENOSYS | libc::EPERM)),
        _ => false,
    }
}

/// Closes every descriptor of this thread's table but `keep` (sorted or not). Only for a
/// thread whose table is its own.
fn close_all_but(keep: &[RawFd]) {
    let mut keep: Vec<RawFd> = keep.iter().copied().filter(|&fd| fd >= 0).collect();
    keep.sort_unstable();
    let mut first: u32 = 0;
    for fd in keep.into_iter().map(|fd| fd as u32).chain([u32::MAX]) {
        if fd > first {
            // SAFETY: close_range closes descriptors of this thread's own table (the
            // caller's contract), none that another thread uses.
            unsafe { libc::syscall(libc::SYS_close_range, first, fd - 1, 0u32) };
        }
        first = fd.saturating_add(1);
    }
}

/// Waits while `word` holds `expected` (`FUTEX_WAIT`, no timeout).
fn futex_wait(word: &AtomicU32, expected: u32) {
    let no_timeout: *const libc::timespec = std::ptr::null();
    // SAFETY: FUTEX_WAIT reads the aligned word we hold a reference to; no timeout.
    unsafe {
        libc::syscall(libc::SYS_futex, word.as_ptr(), libc::FUTEX_WAIT | libc::FUTEX_PRIVATE_FLAG, expected, no_timeout)
    };
}

/// Wakes every thread waiting on `word`.
fn futex_wake(word: &AtomicU32) {
    // SAFETY: FUTEX_WAKE only reads the word's address.
    unsafe { libc::syscall(libc::SYS_futex, word.as_ptr(), libc::FUTEX_WAKE | libc::FUTEX_PRIVATE_FLAG, i32::MAX) };
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A relocated descriptor sits at or above the base and is listed while kept, and no
    /// longer once its guard is dropped.
    #[test]
    fn relocated_descriptors_are_high_and_listed_while_kept() {
        // SAFETY: eventfd returns a fresh descriptor or -1.
        let raw = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC) };
        assert!(raw >= 0);
        // SAFETY: fresh, owned by nobody else.
        let fd = relocate(unsafe { OwnedFd::from_raw_fd(raw) });
        assert!(fd.as_raw_fd() >= fd_base(), "{} below {}", fd.as_raw_fd(), fd_base());
        let kept_guard = keep(fd.as_raw_fd());
        assert!(is_kept(fd.as_raw_fd()));
        let (list, n) = kept();
        assert!(list[..n].contains(&fd.as_raw_fd()));
        assert!(list[..n].windows(2).all(|w| w[0] <= w[1]));
        drop(kept_guard);
        assert!(!is_kept(fd.as_raw_fd()));
        assert!(!is_kept(-1));
    }
}
