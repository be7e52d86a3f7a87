//! The file device: pages in a regular file or on a block device, read and written with
//! `O_DIRECT` through io_uring, slot `n` at byte offset `n * PAGE_SIZE`.
//!
//! # Job
//!
//! [`FileBackend`] is the device; its work is split by concept, each file owning its types
//! (no file adds `impl` blocks to another's type):
//! * `error.rs`: [`FileDeviceError`] (a leaf);
//! * `stats.rs`: [`FileStats`] and the counters behind it (a leaf);
//! * `open.rs`: opening (or creating), sizing and probing the device, [`FileOptions`];
//! * `ring.rs`: `RingIo`, reads and writes, through the io_uring rings or the system calls;
//! * `async_reader.rs`: [`FileAsyncReader`], asynchronous readahead with a ring and a buffer
//!   of its own;
//! * this module: the type, which holds the open file and a `RingIo`; `open` (which sets
//!   up the rings on what `open.rs` opened), `Drop` (which empties a regular file the user
//!   keeps: `scrub`), and the [`Backend`] impl with `discard`. It imports its children; none
//!   imports it.
//!
//! `discard` punches a hole (`FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE`) in a file, or
//! issues `BLKDISCARD` on a block device. Best effort: failures are counted
//! ([`FileBackend::discard_errors`]), never reported, and after an "unsupported" answer the
//! backend stops trying. A discarded file range reads back as zero; a discarded block-device
//! range reads back as whatever the device returns (the engine never reads a discarded slot).
//!
//! # Locking rules
//!
//! (The ring locks' place in the engine's lock hierarchy: `crate::sync`.)
//! `read` may run inside a SIGBUS handler on an application thread (signal mode), and
//! `read`/`write` run concurrently on several threads. So the read/write path allocates
//! nothing and never waits for a lock (how: see `ring.rs`).
//! * `discard` takes no lock (one system call).
//!
//! # Invariants
//!
//! * The rings (in its `RingIo`) are dropped before the file they refer to (field order of
//!   [`FileBackend`]).
//! * On drop, each ring gives back its registered file at once: a ring is torn down
//!   asynchronously after its descriptor closes, and the file lock and a block device's
//!   exclusive claim must not outlive the backend.

use std::io;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};

use super::{AlignedPage, AsyncReader, Backend, ReadReq, WriteReq};
use crate::uffd::PAGE_SIZE;
use open::{open_device, Kind, Opened, BLKDISCARD};
use ring::{errno, RingIo};
use stats::bump;

mod async_reader;
mod error;
mod open;
mod ring;
mod stats;
#[cfg(test)]
mod tests;

pub use async_reader::FileAsyncReader;
pub use error::FileDeviceError;
pub use open::{check_path, FileOptions, CLUSTER_BYTES, DEFAULT_POLL_US, MAX_QUEUE_DEPTH};
pub use stats::FileStats;

/// A swap device on a file or block device. See the module documentation.
pub struct FileBackend {
    /// `file` registered as the engine's (see `crate::fd`); dropped before it closes.
    _kept: crate::fd::Kept,
    // Dropped first: the rings go before the file they refer to.
    io: RingIo,
    file: OwnedFd,
    path: PathBuf,
    kind: Kind,
    anonymous: bool,
    nr_slots: u64,
    queue_depth: u32,
    /// Polling budget of a call before it sleeps (see [`FileOptions::poll_us`]).
    poll_ns: u64,
    ring_error: Option<io::Error>,
    discard_unsupported: AtomicBool,
}

impl FileBackend {
    /// Opens (or, for a directory, creates) a swap device of `capacity_bytes` (rounded down to
    /// whole 2 MiB clusters) at `path`: a directory, an existing regular file, or a block
    /// device. See `open.rs` for what happens to each.
    pub fn open(
        path: impl AsRef<Path>,
        capacity_bytes: u64,
        options: FileOptions,
    ) -> Result<FileBackend, FileDeviceError> {
        let path = path.as_ref();
        let Opened { file, kind, anonymous, nr_slots } = open_device(path, capacity_bytes, &options)?;
        let poll_ns = options.poll_us as u64 * 1000;
        let (io, ring_error) = RingIo::new(file.as_raw_fd(), nr_slots, poll_ns, options.rings, options.queue_depth);
        Ok(FileBackend {
            _kept: crate::fd::keep(file.as_raw_fd()),
            io,
            file,
            path: path.to_owned(),
            kind,
            anonymous,
            nr_slots,
            queue_depth: options.queue_depth,
            poll_ns,
            ring_error,
            discard_unsupported: AtomicBool::new(false),
        })
    }

    /// The path the device was opened with (for an anonymous file: its directory).
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// True for a block device, false for a file.
    pub fn is_block_device(&self) -> bool {
        self.kind == Kind::BlockDevice
    }

    /// True if uswap created the (unlinked) file itself.
    pub fn is_anonymous(&self) -> bool {
        self.anonymous
    }

    pub fn queue_depth(&self) -> u32 {
        self.queue_depth
    }

    /// io_uring instances in use (fewer than asked if the kernel refused some).
    pub fn nr_rings(&self) -> usize {
        self.io.nr_rings()
    }

    /// Why fewer io_uring instances than asked for exist, if so (I/O then uses system calls).
    pub fn ring_error(&self) -> Option<&io::Error> {
        self.ring_error.as_ref()
    }

    /// Discards that did not free their range (failed, unsupported, or out of range).
    pub fn discard_errors(&self) -> u64 {
        self.io.counters.discard_errors.load(Ordering::Relaxed)
    }

    pub fn stats(&self) -> FileStats {
        self.io.counters.snapshot()
    }
}

impl Drop for FileBackend {
    fn drop(&mut self) {
        // A ring is torn down asynchronously after its descriptor closes, and until then it
        // keeps its registered file open: the file lock and a block device's exclusive claim
        // would outlive the backend, and reopening the same path right away would find it
        // busy. Release both now.
        self.io.release_files();
        if self.kind == Kind::File && !self.anonymous {
            // Before unlocking, so that the next user of the file finds it empty.
            self.scrub();
            // SAFETY: plain system call on our open descriptor.
            unsafe { libc::flock(self.file.as_raw_fd(), libc::LOCK_UN) };
        }
    }
}

impl FileBackend {
    /// Empties a file the user keeps of the swapped memory in it: punches out the whole range
    /// the device used, or, where the filesystem cannot punch holes, overwrites it with
    /// zeros. Discards while the engine runs do not suffice: they cover whole clusters that
    /// came free and were taken off the discard list by the background reclaimer, so the
    /// clusters still waiting at shutdown, the clusters CPUs were allocating from, and freed
    /// slots of partly used clusters kept their data (up to a few clusters after a clean
    /// exit, depending on when the reclaimer last ran).
    fn scrub(&self) {
        let len = self.nr_slots * PAGE_SIZE as u64;
        let fd = self.file.as_raw_fd();
        let Err(punch) = punch_hole(fd, 0, len) else { return };
        if let Err(e) = write_zeros(fd, len) {
            // Nothing to return an error to from a drop, and the user must know.
            eprintln!(
                "uswap: swap device {}: could not erase the swap file on close (punching a hole: \
                 {punch}; writing zeros: {e}); it may still hold swapped-out memory: delete it",
                self.path.display()
            );
        }
    }
}

/// What [`erase_swap_file`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Erased {
    /// The file's whole length reads as zeros now.
    Yes,
    /// Another process holds the file's lock: a device still uses it. Left alone.
    InUse,
    /// The path names no regular file (a directory's files are anonymous and go with their
    /// processes; a block device is the user's to erase).
    NotAFile,
}

/// How long [`erase_swap_file`] waits for a file's lock: a process's io_uring keeps its
/// registered file, and with it the lock, until the kernel tears the ring down, a moment
/// after the process exited.
const ERASE_LOCK_WAIT: std::time::Duration = std::time::Duration::from_secs(2);

/// Empties the swap file at `path` after the processes that used it are gone without
/// dropping their pagers (`uswap run`'s program exits; only a dropped device scrubs
/// itself): punches out its whole length, or writes zeros where the filesystem cannot punch
/// holes. Takes the file's lock first (waiting up to [`ERASE_LOCK_WAIT`]), so a file a
/// device still holds is left alone.
pub fn erase_swap_file(path: &Path) -> io::Result<Erased> {
    use std::os::unix::fs::OpenOptionsExt;
    if !std::fs::symlink_metadata(path).is_ok_and(|m| m.is_file()) {
        return Ok(Erased::NotAFile);
    }
    let file = std::fs::OpenOptions::new().write(true).custom_flags(libc::O_NOFOLLOW).open(path)?;
    let fd = file.as_raw_fd();
    let since_ns = crate::clock::now_ns();
    // Bounded by the wait.
    loop {
        // SAFETY: plain system call on our open descriptor; the lock goes with it.
        if unsafe { libc::flock(fd, libc::LOCK_EX | libc::LOCK_NB) } == 0 {
            break;
        }
        let e = io::Error::last_os_error();
        match e.raw_os_error() {
            Some(libc::EWOULDBLOCK) if crate::clock::elapsed_since(since_ns) >= ERASE_LOCK_WAIT => {
                return Ok(Erased::InUse)
            }
            Some(libc::EWOULDBLOCK | libc::EINTR) => std::thread::sleep(std::time::Duration::from_millis(10)),
            _ => return Err(e),
        }
    }
    let len = file.metadata()?.len() / PAGE_SIZE as u64 * PAGE_SIZE as u64;
    if punch_hole(fd, 0, len).is_err() {
        write_zeros(fd, len)?;
    }
    Ok(Erased::Yes)
}

/// Deallocates `len` bytes at `off` of a regular file: they read back as zero.
fn punch_hole(fd: RawFd, off: u64, len: u64) -> io::Result<()> {
    // Bounded: only EINTR repeats, and each one is a signal delivered to this thread.
    loop {
        let flags = libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE;
        // SAFETY: plain system call on an open descriptor; KEEP_SIZE leaves the size alone.
        if unsafe { libc::fallocate(fd, flags, off as libc::off_t, len as libc::off_t) } == 0 {
            return Ok(());
        }
        let e = io::Error::last_os_error();
        if e.raw_os_error() != Some(libc::EINTR) {
            return Err(e);
        }
    }
}

/// Overwrites the first `len` bytes (whole pages) of a file (`O_DIRECT` or not) with zeros:
/// for filesystems that cannot punch holes.
fn write_zeros(fd: RawFd, len: u64) -> io::Result<()> {
    const CHUNK_PAGES: usize = 256;
    let zeros = vec![AlignedPage([0; PAGE_SIZE]); CHUNK_PAGES];
    let mut off = 0u64;
    // Bounded: each round writes something (off grows) or is an EINTR (a signal delivered).
    while off < len {
        let n = (len - off).min((CHUNK_PAGES * PAGE_SIZE) as u64) as usize;
        // SAFETY: `zeros` is page-aligned (as O_DIRECT wants) and valid for `n` bytes.
        let r = unsafe { libc::pwrite(fd, zeros.as_ptr().cast(), n, off as libc::off_t) };
        match r {
            r if r > 0 => off += r as u64,
            0 => return Err(io::Error::from(io::ErrorKind::WriteZero)),
            _ => {
                let e = io::Error::last_os_error();
                if e.raw_os_error() != Some(libc::EINTR) {
                    return Err(e);
                }
            }
        }
    }
    Ok(())
}

impl Backend for FileBackend {
    fn name(&self) -> String {
        format!("file:{}", self.path.display())
    }

    fn nr_slots(&self) -> u64 {
        self.nr_slots
    }

    fn write(&self, reqs: &mut [WriteReq<'_>]) {
        self.io.submit(reqs);
    }

    fn slow_writes(&self) -> bool {
        true
    }

    fn async_reader(&self, nr_pages: usize) -> Option<Box<dyn AsyncReader>> {
        FileAsyncReader::new(self.file.as_raw_fd(), self.nr_slots, nr_pages, self.poll_ns)
            .ok()
            .map(|r| Box::new(r) as _)
    }

    fn read(&self, reqs: &mut [ReadReq<'_>]) {
        self.io.submit(reqs);
    }

    /// An anonymous file or a block device. Not a named file the user keeps: the parent
    /// empties it when its device is dropped, whether or not a child still reads it.
    fn shared_with_fork_children(&self) -> bool {
        self.anonymous || self.kind == Kind::BlockDevice
    }

    fn enter_fork_child(&self) {
        self.io.enter_fork_child();
    }

    fn discard(&self, slot: u64, nr: u64) {
        if nr == 0 {
            return;
        }
        bump(&self.io.counters.discards);
        let in_range = slot.checked_add(nr).is_some_and(|end| end <= self.nr_slots);
        if !in_range || self.discard_unsupported.load(Ordering::Relaxed) {
            bump(&self.io.counters.discard_errors);
            return;
        }
        let off = slot * PAGE_SIZE as u64;
        let len = nr * PAGE_SIZE as u64;
        let fd = self.file.as_raw_fd();
        // Bounded: only EINTR repeats, and each one is a signal delivered to this thread.
        loop {
            let r = match self.kind {
                // SAFETY: plain system call on an open descriptor; the range is inside the
                // device and belongs to slots the engine no longer uses.
                Kind::File => unsafe {
                    libc::fallocate(
                        fd,
                        libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE,
                        off as libc::off_t,
                        len as libc::off_t,
                    )
                },
                Kind::BlockDevice => {
                    let range = [off, len];
                    // SAFETY: BLKDISCARD reads two u64 (start, length) from the pointer,
                    // which points at `range`.
                    unsafe { libc::ioctl(fd, BLKDISCARD, range.as_ptr()) }
                }
            };
            if r == 0 {
                return;
            }
            let e = errno();
            if e == libc::EINTR {
                continue;
            }
            bump(&self.io.counters.discard_errors);
            if matches!(e, libc::EOPNOTSUPP | libc::ENOTTY) {
                self.discard_unsupported.store(true, Ordering::Relaxed);
            }
            return;
        }
    }
}
