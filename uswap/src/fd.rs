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
//! leave them alone ([`is_kept`], [`kept`]). Where nothing interposes (the library APIs), a
//! thread that finds one closed ends the process ([`closed_by_program`]).
//!
//! Locking: none. The table is a fixed array of atomics, read without locks (an interposed
//! `close` may run anywhere, a signal handler included). Invariant: a number is registered
//! from before the engine first uses it until before it is closed (a [`Kept`] is declared
//! ahead of the descriptor it guards, so it drops first).

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicI32, Ordering};

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
    use std::io::Write;
    // One write: threads the release woke may read zeros until the abort (docs/api.md).
    let message = format!(
        "uswap: the program closed descriptor {fd}, a pager's own (its userfaultfd, or the doorbell of the thread that \
         reads it): code that closes descriptors it did not open (close_range(3, ~0U, 0), closefrom, \
         os.closerange, a close loop, dup2 over it) ran after the pager was made. Its pages out of RAM can no longer \
         come back and would read as zeros, so the process aborts. Make the pager after that code runs, or run the \
         program under `uswap run`, which keeps its descriptors open.\n"
    );
    let _ = std::io::stderr().write_all(message.as_bytes());
    std::process::abort()
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
