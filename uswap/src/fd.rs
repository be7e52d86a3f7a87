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

impl Kept {
    /// Unregisters the number now, before its descriptor is closed or given up (the drop
    /// then does nothing).
    pub(crate) fn release(&mut self) {
        if let Some(i) = self.slot.take() {
            KEPT[i].store(-1, Ordering::Release);
        }
    }
}

impl Drop for Kept {
    fn drop(&mut self) {
        self.release();
    }
}

/// What a descriptor is (its device and inode), to tell at its close whether the number
/// still names it: a program that closed the engine's number may have reused it, and
/// closing it then would close the program's file. Descriptors of one kind made by anon
/// inodes (eventfds) share an inode, so another eventfd of the program's passes for ours.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Identity {
    dev: u64,
    ino: u64,
}

impl Identity {
    /// What `fd` names now; None if it is not open.
    pub(crate) fn of(fd: RawFd) -> Option<Identity> {
        // SAFETY: fstat fills one stat struct we own.
        let mut st: libc::stat = unsafe { std::mem::zeroed() };
        // SAFETY: as above; an invalid number fails with EBADF.
        if unsafe { libc::fstat(fd, &mut st) } != 0 {
            return None;
        }
        Some(Identity { dev: st.st_dev, ino: st.st_ino })
    }
}

/// A descriptor of the engine's, closed on drop only while its number still names it
/// ([`Identity`]) and nobody gave the number up ([`ClosedIfStillOurs::give_up`], where the
/// keeper's `kcmp` knows better than an inode shared by every eventfd): where the program
/// closed the number and reused it, the drop leaves the program's file alone.
#[derive(Debug)]
pub(crate) struct ClosedIfStillOurs<T: AsRawFd> {
    inner: std::mem::ManuallyDrop<T>,
    identity: Option<Identity>,
    given_up: std::sync::atomic::AtomicBool,
}

impl<T: AsRawFd> ClosedIfStillOurs<T> {
    pub(crate) fn new(inner: T) -> Self {
        let identity = Identity::of(inner.as_raw_fd());
        let given_up = std::sync::atomic::AtomicBool::new(false);
        ClosedIfStillOurs { inner: std::mem::ManuallyDrop::new(inner), identity, given_up }
    }

    pub(crate) fn get(&self) -> &T {
        &self.inner
    }

    /// Whether the number still names the descriptor made here.
    pub(crate) fn still_ours(&self) -> bool {
        !self.given_up.load(Ordering::Acquire) && Identity::of(self.inner.as_raw_fd()) == self.identity
    }

    /// Rings the eventfd this holds (see [`ring_eventfd`]), only while its number still
    /// names it: 8 bytes must not go into a file of the program's reused under the number.
    pub(crate) fn ring_if_still_ours(&self) {
        if self.still_ours() {
            ring_eventfd(self.inner.as_raw_fd());
        }
    }

    /// The number names another file now (something that knows said so): neither closed
    /// nor used by the drop.
    pub(crate) fn give_up(&self) {
        self.given_up.store(true, Ordering::Release);
    }
}

impl<T: AsRawFd> AsRawFd for ClosedIfStillOurs<T> {
    fn as_raw_fd(&self) -> RawFd {
        self.inner.as_raw_fd()
    }
}

impl<T: AsRawFd> Drop for ClosedIfStillOurs<T> {
    fn drop(&mut self) {
        if self.still_ours() {
            // SAFETY: dropped once, here; nothing uses `inner` after.
            unsafe { std::mem::ManuallyDrop::drop(&mut self.inner) };
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
        "uswap: the program closed descriptor {fd} (or put a file of its own under that number), a pager's own (its \
         userfaultfd, or the doorbell of the thread that reads it): code that closes descriptors it did not open (close_range(3, ~0U, 0), closefrom, \
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
/// the userfaultfd and the doorbell (at shutdown it rings its own copy of the doorbell: the
/// process's number may name a file of the program's by then, and threads asleep in `poll`
/// still wait on the doorbell's file). The userfaultfd lives as long as the keeper does,
/// so a program that closes every descriptor above 2 does not unregister the regions: no
/// page that was out reads as zeros. The thread that then finds the number closed
/// ([`Keeper::found_closed`]) wakes the keeper and parks, and so does the keeper itself
/// when it finds the number closed or reused (it looks once a second: a reused number
/// wakes no poll). From then on the keeper reads the descriptor in its own table: the
/// kernel's events (an unmap during the program's clean-up) are let through, and the first
/// fault ends the process with the message, written by a parked thread (the keeper's table
/// has no stderr), the faulting thread still waiting in the kernel. A process that closes
/// its descriptors and then execs or exits (`subprocess` in a child that made a pager:
/// `preexec_fn` and `close_fds`) is not ended. Where the sandbox refuses `unshare`
/// (Docker's default seccomp profile without `CAP_SYS_ADMIN`), there is no keeper: a thread
/// that finds the number closed ends the process a fifth of a second later, the time an
/// exec takes, and pages out may read as zeros in between.
///
/// Locking: one atomic word of flags, waited on with a futex. Invariant: `HELD` is set only
/// by the keeper, once its table holds the pager's file and nothing of the program's.
#[derive(Debug, Default)]
pub struct Keeper {
    state: AtomicU32,
    /// Threads of the process's table to compare the keeper's with (`kcmp`), besides the
    /// main thread (which may have exited): the one that built the pager, then the one
    /// that shuts it down; and an engine thread that lives until shutdown.
    witness_tid: AtomicI32,
    engine_witness_tid: AtomicI32,
}

/// The keeper holds the userfaultfd in its own table.
const HELD: u32 = 1;
/// The pager's number was found closed (or reused): the keeper reads the descriptor.
const CLOSED: u32 = 2;
/// The pager is shutting down: the keeper and parked threads return.
const SHUTDOWN: u32 = 4;
/// After `CLOSED`, a fault came on the userfaultfd: the process ends.
const NEEDED: u32 = 8;
/// The keeper could not hold the file (`unshare` or the clean-up refused, or the number
/// already closed).
const REFUSED: u32 = 16;
/// At shutdown the process's number was not the pager's file any more (closed, maybe
/// reused): the pager must not close it.
const LOST: u32 = 32;
/// A thread has taken on writing the message (one copy, not one per parked thread).
const SAYING: u32 = 64;
/// At shutdown the process's number for the doorbell was not the doorbell any more.
const BELL_LOST: u32 = 128;
/// How often a keeper reading a closed descriptor looks at the shutdown flag.
const WATCH_POLL_MS: i32 = 100;
/// How long the keeper gives a parked thread to end the process with its message before
/// it ends it itself.
const NEEDED_GRACE_MS: u64 = 200;
/// How long a process without a keeper has, after a thread found a number of the pager's
/// closed, to exec or exit before it is ended (a fork child's exec takes milliseconds).
const NO_KEEPER_GRACE_MS: u64 = 200;
/// How often the keeper looks whether the process's number still names the pager's file:
/// a number the program closed and reused at once wakes no poll, and the threads that
/// read the descriptor would wait on the other file for ever.
const CHECK_PERIOD: libc::timespec = libc::timespec { tv_sec: 1, tv_nsec: 0 };
/// `UFFD_EVENT_PAGEFAULT`, the first byte of a message (`struct uffd_msg`).
const EVENT_PAGEFAULT: u8 = 0x12;

impl Keeper {
    pub const fn new() -> Keeper {
        Keeper { state: AtomicU32::new(0), witness_tid: AtomicI32::new(0), engine_witness_tid: AtomicI32::new(0) }
    }

    /// Names the calling engine thread, which lives until the pager shuts down, as a
    /// witness of the process's table.
    pub fn witness_this_engine_thread(&self) {
        self.engine_witness_tid.store(this_thread_id(), Ordering::Release);
    }

    /// Names the calling thread as a witness of the process's table: call it on the thread
    /// that builds the pager, before the keeper starts.
    pub fn witness_this_thread(&self) {
        self.witness_tid.store(this_thread_id(), Ordering::Release);
    }

    /// The keeper thread's body: holds `uffd` and `bell` (an eventfd) in a table of its own
    /// until the pager shuts down (see the type). Returns at once, holding nothing, where
    /// the kernel or a sandbox refuses: a thread that finds the descriptor closed then ends
    /// the process itself.
    pub fn hold(&self, uffd: RawFd, bell: RawFd) {
        // SAFETY: unshare(CLONE_FILES) gives this thread its own copy of the descriptor
        // table; it touches no memory of ours.
        if unsafe { libc::unshare(libc::CLONE_FILES) } != 0 {
            self.decide(REFUSED);
            return;
        }
        let ours = self.is_the_process_file(uffd);
        // The program closed or replaced the number before the copy: hold nothing of it.
        let keep: &[RawFd] = if ours { &[uffd, bell] } else { &[] };
        if !close_all_but(keep) || !ours {
            self.decide(REFUSED);
            return;
        }
        self.decide(HELD);
        self.wait_for_closed(uffd);
        self.read_closed(uffd);
        if !self.is_the_process_file(uffd) {
            // Closed, maybe reused, whether or not a thread noticed.
            self.state.fetch_or(LOST, Ordering::AcqRel);
        }
        if !self.is_the_process_file(bell) {
            self.state.fetch_or(BELL_LOST, Ordering::AcqRel);
        }
        // Wakes the threads asleep on the doorbell's file, whatever the number names now
        // (the pager rings no number itself while a keeper holds the file).
        ring_eventfd(bell);
    }

    /// Until the pager shuts down or its number is found closed: asleep, looking once a
    /// second whether the number still names the file.
    fn wait_for_closed(&self, uffd: RawFd) {
        // Bounded by the pager's life: every wake-up rereads the flags.
        loop {
            let s = self.state.load(Ordering::Acquire);
            if s & (SHUTDOWN | CLOSED) != 0 {
                return;
            }
            if !futex_wait(&self.state, s, Some(CHECK_PERIOD)) && !self.is_the_process_file(uffd) {
                self.state.fetch_or(CLOSED, Ordering::AcqRel);
            }
        }
    }

    /// Once the number is closed and until shutdown: reads the descriptor in the keeper's
    /// table, lets events through, and ends the process at the first fault.
    fn read_closed(&self, uffd: RawFd) {
        let mut pfd = libc::pollfd { fd: uffd, events: libc::POLLIN, revents: 0 };
        let mut msg = [0u64; 4];
        while self.state.load(Ordering::Acquire) & SHUTDOWN == 0 {
            // SAFETY: poll reads and writes one pollfd we own.
            if unsafe { libc::poll(&mut pfd, 1, WATCH_POLL_MS) } <= 0 || pfd.revents & libc::POLLIN == 0 {
                continue;
            }
            // SAFETY: reads one 32-byte message into `msg`, which is 32 bytes.
            let n = unsafe { libc::read(uffd, msg.as_mut_ptr().cast(), std::mem::size_of_val(&msg)) };
            // The event is the message's first byte. An event's reader only acknowledges it
            // (the unmapping thread goes on); a fault's waits in the kernel until the end.
            if n == std::mem::size_of_val(&msg) as isize && msg[0] as u8 == EVENT_PAGEFAULT {
                self.end_process(uffd);
            }
        }
    }

    /// A fault needs the descriptor the program closed: a parked thread, which has the
    /// program's stderr, ends the process with the message; where none does, the keeper
    /// writes it to a copy of the process's stderr and ends it.
    fn end_process(&self, uffd: RawFd) -> ! {
        self.state.fetch_or(NEEDED, Ordering::AcqRel);
        futex_wake(&self.state);
        std::thread::sleep(std::time::Duration::from_millis(NEEDED_GRACE_MS));
        if self.state.fetch_or(SAYING, Ordering::AcqRel) & SAYING != 0 {
            std::process::abort();
        }
        // SAFETY: pidfd_open and pidfd_getfd copy the process's descriptor 2 into this
        // thread's own table (or fail); dup2 puts the copy at 2, where the message goes.
        unsafe {
            let pidfd = libc::syscall(libc::SYS_pidfd_open, libc::getpid(), 0) as RawFd;
            if pidfd >= 0 {
                let err = libc::syscall(libc::SYS_pidfd_getfd, pidfd, 2, 0) as RawFd;
                if err >= 0 {
                    libc::dup2(err, 2);
                }
            }
        }
        closed_by_program(uffd)
    }

    /// Whether `fd` in this thread's table is the file the process's table has under that
    /// number (`kcmp` against the main thread and the witnesses): true where the kernel
    /// cannot say. A thread that exited says nothing (`ESRCH`), one exiting says "not
    /// open" (`EBADF`, its table gone): the number counts as closed only where no witness
    /// finds it, and the engine's witness lives until shutdown.
    fn is_the_process_file(&self, fd: RawFd) -> bool {
        const KCMP_FILE: libc::c_long = 0;
        let me = this_thread_id() as libc::c_long;
        let witnesses = [
            std::process::id() as i32,
            self.witness_tid.load(Ordering::Acquire),
            self.engine_witness_tid.load(Ordering::Acquire),
        ];
        let mut unknown = true;
        for tid in witnesses.into_iter().filter(|&t| t > 0) {
            // SAFETY: kcmp compares two tasks' files and touches no memory.
            let r = unsafe {
                libc::syscall(
                    libc::SYS_kcmp,
                    tid as libc::c_long,
                    me,
                    KCMP_FILE,
                    fd as libc::c_long,
                    fd as libc::c_long,
                )
            };
            match (r, std::io::Error::last_os_error().raw_os_error()) {
                (0, _) => return true,
                (-1, Some(libc::ENOSYS | libc::EPERM)) => return true,
                (-1, Some(libc::ESRCH)) => {}
                _ => unknown = false,
            }
        }
        unknown
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
    /// (`POLLNVAL`). With a keeper, wakes it and parks the caller until the pager shuts
    /// down, then returns, or until the keeper says a fault needs the descriptor, then
    /// ends the process. Without one, ends the process unless it execs, exits or shuts the
    /// pager down within [`NO_KEEPER_GRACE_MS`].
    pub fn found_closed(&self, fd: RawFd) {
        let s = self.state.fetch_or(CLOSED, Ordering::AcqRel);
        if s & HELD == 0 {
            for _ in 0..NO_KEEPER_GRACE_MS / 10 {
                if self.state.load(Ordering::Acquire) & SHUTDOWN != 0 {
                    return;
                }
                std::thread::sleep(std::time::Duration::from_millis(10));
            }
            closed_by_program(fd);
        }
        futex_wake(&self.state);
        // Bounded by the pager's life.
        loop {
            let s = self.state.load(Ordering::Acquire);
            if s & NEEDED != 0 && self.state.fetch_or(SAYING, Ordering::AcqRel) & SAYING == 0 {
                closed_by_program(fd);
            }
            if s & SHUTDOWN != 0 {
                return;
            }
            futex_wait(&self.state, s, None);
        }
    }

    /// Whether the process's number for the pager's userfaultfd may now name another file
    /// (the program closed it, and may have reused the number): the pager must then not
    /// close it. Read once the keeper has returned.
    pub fn number_lost(&self) -> bool {
        self.state.load(Ordering::Acquire) & (CLOSED | LOST) != 0
    }

    /// Whether the process's number for the doorbell may now name another file (as
    /// [`Keeper::number_lost`]). Read once the keeper has returned.
    pub fn bell_number_lost(&self) -> bool {
        self.state.load(Ordering::Acquire) & BELL_LOST != 0
    }

    /// Whether a keeper holds the pager's files (then it rings the doorbell at shutdown).
    pub fn is_held(&self) -> bool {
        self.state.load(Ordering::Acquire) & HELD != 0
    }

    /// Whether the pager's number was found closed or reused: the pager's threads must not
    /// read it (a file of the program's may be under it) but park ([`Keeper::found_closed`]).
    pub fn is_closed(&self) -> bool {
        self.state.load(Ordering::Acquire) & CLOSED != 0
    }

    /// Lets the keeper and parked threads return (the pager shuts down). The calling thread
    /// is the keeper's witness from now on: it lives until the keeper has returned.
    pub fn shut_down(&self) {
        self.witness_this_thread();
        self.state.fetch_or(SHUTDOWN, Ordering::AcqRel);
        futex_wake(&self.state);
    }
}

/// The calling thread's id.
fn this_thread_id() -> i32 {
    // SAFETY: gettid takes no arguments and cannot fail.
    unsafe { libc::syscall(libc::SYS_gettid) as i32 }
}

/// Adds one to the eventfd `fd` (a doorbell): every poll on it returns. The caller knows
/// `fd` names its eventfd.
fn ring_eventfd(fd: RawFd) {
    let one: u64 = 1;
    // SAFETY: writes 8 bytes from a live u64 to a descriptor; nothing else is touched.
    unsafe { libc::write(fd, (&one as *const u64).cast(), 8) };
}

/// Closes every descriptor of this thread's table but `keep`. Only for a thread whose
/// table is its own. Returns whether it did (`close_range`, or one `close` per descriptor
/// where that is refused).
fn close_all_but(keep: &[RawFd]) -> bool {
    let mut keep: Vec<RawFd> = keep.iter().copied().filter(|&fd| fd >= 0).collect();
    keep.sort_unstable();
    let mut first: u32 = 0;
    let mut ranges_closed = true;
    for fd in keep.iter().map(|&fd| fd as u32).chain([u32::MAX]) {
        if fd > first {
            // SAFETY: close_range closes descriptors of this thread's own table (the
            // caller's contract), none that another thread uses.
            ranges_closed &= unsafe { libc::syscall(libc::SYS_close_range, first, fd - 1, 0u32) } == 0;
        }
        first = fd.saturating_add(1);
    }
    if ranges_closed {
        return true;
    }
    let Ok(dir) = std::fs::read_dir("/proc/thread-self/fd") else { return false };
    let open: Vec<RawFd> = dir.flatten().filter_map(|e| e.file_name().to_str()?.parse().ok()).collect();
    // The listing's own descriptor is among them, closed by the time the loop runs (EBADF).
    open.into_iter().filter(|fd| !keep.contains(fd)).all(|fd| {
        // SAFETY: as above, this thread's own table.
        let r = unsafe { libc::close(fd) };
        r == 0 || std::io::Error::last_os_error().raw_os_error() == Some(libc::EBADF)
    })
}

/// Waits while `word` holds `expected` (`FUTEX_WAIT`), at most `timeout` if given.
/// Returns false if the wait timed out.
fn futex_wait(word: &AtomicU32, expected: u32, timeout: Option<libc::timespec>) -> bool {
    let ts = timeout.as_ref().map_or(std::ptr::null(), |t| t as *const libc::timespec);
    // SAFETY: FUTEX_WAIT reads the aligned word we hold a reference to and the timespec,
    // if any, which lives on this frame.
    let r = unsafe {
        libc::syscall(libc::SYS_futex, word.as_ptr(), libc::FUTEX_WAIT | libc::FUTEX_PRIVATE_FLAG, expected, ts)
    };
    !(r < 0 && std::io::Error::last_os_error().raw_os_error() == Some(libc::ETIMEDOUT))
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
