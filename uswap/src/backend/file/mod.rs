//! The file device: pages in a regular file or on a block device, read and written with
//! `O_DIRECT` through io_uring, slot `n` at byte offset `n * PAGE_SIZE`.
//!
//! # Job
//!
//! [`FileBackend`] is the device; its work is split by concept:
//! * `open.rs`: opening (or creating) and sizing the device, [`FileOptions`];
//! * `ring.rs`: reads and writes, through the io_uring rings or the system calls;
//! * `async_reader.rs`: [`FileAsyncReader`], asynchronous readahead with a ring and a buffer
//!   of its own;
//! * this module: the type, its counters and errors, `Drop` (which empties a regular file
//!   the user keeps: `scrub`), and the [`Backend`] impl with `discard`.
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
//! * The rings are dropped before the file they refer to (field order of [`FileBackend`]).
//! * On drop, each ring gives back its registered file at once: a ring is torn down
//!   asynchronously after its descriptor closes, and the file lock and a block device's
//!   exclusive claim must not outlive the backend.

use std::io;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use crossbeam_utils::CachePadded;
use thiserror::Error;

use super::{AlignedPage, AsyncReader, Backend, ReadReq, WriteReq};
use crate::sync::SpinLock;
use crate::uffd::PAGE_SIZE;
use open::BLKDISCARD;
use ring::Ring;

mod async_reader;
mod open;
mod ring;
#[cfg(test)]
mod tests;

pub use async_reader::FileAsyncReader;
pub use open::{FileOptions, CLUSTER_BYTES, DEFAULT_POLL_US, MAX_QUEUE_DEPTH};

/// Why a file device could not be opened. Every message names the path and says what to do.
#[derive(Debug, Error)]
pub enum FileDeviceError {
    #[error(
        "swap device {}: no such file or directory; give an existing directory (uswap creates \
         an anonymous swap file in it), a file in an existing directory (uswap creates it, mode \
         0600), an existing regular file, or a block device",
        .path.display()
    )]
    NotFound { path: PathBuf },

    #[error(
        "swap device {}: mode {mode:04o} lets other users read or write the swapped-out memory \
         it would hold; run `chmod 600 {}`, or give a directory (uswap creates a private \
         anonymous swap file in it)",
        .path.display(), .path.display()
    )]
    OthersMayAccess { path: PathBuf, mode: u32 },

    #[error(
        "swap device {}: permission denied ({source}); run as a user that may read and write \
         it, or give a directory you own (uswap creates a private swap file in it)",
        .path.display()
    )]
    PermissionDenied { path: PathBuf, source: io::Error },

    #[error(
        "swap device {}: read-only filesystem or device; give a writable directory, file or \
         block device",
        .path.display()
    )]
    ReadOnly { path: PathBuf },

    #[error(
        "swap device {}: capacity of {capacity_bytes} bytes is below one cluster \
         ({min_bytes} bytes); give it at least {min_bytes} bytes",
        .path.display()
    )]
    TooSmall { path: PathBuf, capacity_bytes: u64, min_bytes: u64 },

    #[error(
        "swap device {}: capacity of {capacity_bytes} bytes is larger than the block device \
         ({device_bytes} bytes); uswap never writes past the end of a device: give at most \
         {device_bytes} bytes",
        .path.display()
    )]
    LargerThanDevice { path: PathBuf, capacity_bytes: u64, device_bytes: u64 },

    #[error(
        "swap device {}: the filesystem does not support direct I/O (O_DIRECT with 4096-byte \
         blocks: {source}), which uswap needs to keep swapped pages out of the page cache; put \
         the swap file on a disk filesystem such as ext4, xfs or btrfs (e.g. a directory under \
         /var/tmp), not ramfs, a network or a FUSE filesystem",
        .path.display()
    )]
    DirectIoUnsupported { path: PathBuf, source: io::Error },

    #[error(
        "swap device {}: it is {kind}, not a directory, regular file or block device; give a \
         directory (uswap creates an anonymous swap file in it), a regular file, or a block \
         device",
        .path.display()
    )]
    UnsupportedFileType { path: PathBuf, kind: &'static str },

    #[error(
        "swap device {}: the filesystem cannot allocate the swap file with fallocate \
         ({source}); set FileOptions::preallocate to false to use a sparse file, or choose a \
         directory on ext4, xfs or btrfs",
        .path.display()
    )]
    FallocateUnsupported { path: PathBuf, source: io::Error },

    #[error(
        "swap device {}: not enough free space for {capacity_bytes} bytes ({source}); free \
         space, lower the capacity, or choose another filesystem",
        .path.display()
    )]
    NoSpace { path: PathBuf, capacity_bytes: u64, source: io::Error },

    #[error(
        "swap device {}: in use (a mounted or exclusively opened block device, or a swap file \
         another uswap device holds); give a device or file nothing else uses",
        .path.display()
    )]
    Busy { path: PathBuf },

    #[error(
        "swap device {}: logical block size of {block_size} bytes does not divide the \
         {page_size}-byte page; uswap needs a device with 512- or 4096-byte blocks",
        .path.display()
    )]
    BlockSizeUnsupported { path: PathBuf, block_size: u32, page_size: usize },

    #[error(
        "swap device {}: queue depth {queue_depth} is outside 1..={max}; pick a value in that \
         range (64 is the default)",
        .path.display()
    )]
    BadQueueDepth { path: PathBuf, queue_depth: u32, max: u32 },

    #[error("swap device {}: {what} failed: {source}", .path.display())]
    Io { path: PathBuf, what: &'static str, source: io::Error },
}

/// Counters of a file device (monotonic, summed over all threads).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct FileStats {
    /// `read`/`write` calls served through an io_uring.
    pub ring_calls: u64,
    /// `read`/`write` calls served with `pread`/`pwrite` (all rings busy, the calling thread
    /// held an engine lock, or no ring).
    pub sync_calls: u64,
    /// Transfers resubmitted for their remainder after a short read or write.
    pub short_transfers: u64,
    /// Transfers retried after `EINTR`/`EAGAIN`.
    pub retries: u64,
    /// `discard` calls.
    pub discards: u64,
    /// `discard` calls that did not free the range (failed, unsupported or out of range).
    pub discard_errors: u64,
    /// io_uring instances given up after the kernel refused a submission with an unexpected
    /// error (their calls were finished with system calls; later calls use the other rings).
    pub rings_poisoned: u64,
}

#[derive(Default)]
struct Counters {
    ring_calls: AtomicU64,
    sync_calls: AtomicU64,
    short_transfers: AtomicU64,
    retries: AtomicU64,
    discards: AtomicU64,
    discard_errors: AtomicU64,
    rings_poisoned: AtomicU64,
}

fn bump(c: &AtomicU64) {
    c.fetch_add(1, Ordering::Relaxed);
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    File,
    BlockDevice,
}

/// A swap device on a file or block device. See the module documentation.
pub struct FileBackend {
    /// `file` registered as the engine's (see `crate::fd`); dropped before it closes.
    _kept: crate::fd::Kept,
    // Dropped first: the rings go before the file they refer to.
    rings: Box<[CachePadded<SpinLock<Ring>>]>,
    file: OwnedFd,
    path: PathBuf,
    kind: Kind,
    anonymous: bool,
    nr_slots: u64,
    queue_depth: u32,
    /// Polling budget of a call before it sleeps (see [`FileOptions::poll_us`]).
    poll_ns: u64,
    ring_error: Option<io::Error>,
    counters: Counters,
    discard_unsupported: AtomicBool,
    /// Set in a fork child's copy of the parent's device: system calls only, the rings
    /// being the parent's (see `Backend::enter_fork_child`).
    syscalls_only: AtomicBool,
}

fn errno() -> i32 {
    io::Error::last_os_error().raw_os_error().unwrap_or(libc::EIO)
}

impl FileBackend {
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
        self.rings.len()
    }

    /// Why fewer io_uring instances than asked for exist, if so (I/O then uses system calls).
    pub fn ring_error(&self) -> Option<&io::Error> {
        self.ring_error.as_ref()
    }

    /// Discards that did not free their range (failed, unsupported, or out of range).
    pub fn discard_errors(&self) -> u64 {
        self.counters.discard_errors.load(Ordering::Relaxed)
    }

    pub fn stats(&self) -> FileStats {
        let c = &self.counters;
        let l = |a: &AtomicU64| a.load(Ordering::Relaxed);
        FileStats {
            ring_calls: l(&c.ring_calls),
            sync_calls: l(&c.sync_calls),
            short_transfers: l(&c.short_transfers),
            retries: l(&c.retries),
            discards: l(&c.discards),
            discard_errors: l(&c.discard_errors),
            rings_poisoned: l(&c.rings_poisoned),
        }
    }
}

impl Drop for FileBackend {
    fn drop(&mut self) {
        // A ring is torn down asynchronously after its descriptor closes, and until then it
        // keeps its registered file open: the file lock and a block device's exclusive claim
        // would outlive the backend, and reopening the same path right away would find it
        // busy. Release both now.
        for ring in self.rings.iter() {
            if let Some(ring) = ring.try_lock() {
                if ring.fixed_file {
                    let _ = ring.uring.submitter().unregister_files();
                }
            }
        }
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

/// Overwrites the first `len` bytes (whole pages) of an `O_DIRECT` file with zeros: for
/// filesystems that cannot punch holes.
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
        self.submit(reqs);
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
        self.submit(reqs);
    }

    /// An anonymous file or a block device. Not a named file the user keeps: the parent
    /// empties it when its device is dropped, whether or not a child still reads it.
    fn shared_with_fork_children(&self) -> bool {
        self.anonymous || self.kind == Kind::BlockDevice
    }

    fn enter_fork_child(&self) {
        self.syscalls_only.store(true, Ordering::Relaxed);
    }

    fn discard(&self, slot: u64, nr: u64) {
        if nr == 0 {
            return;
        }
        bump(&self.counters.discards);
        let in_range = slot.checked_add(nr).is_some_and(|end| end <= self.nr_slots);
        if !in_range || self.discard_unsupported.load(Ordering::Relaxed) {
            bump(&self.counters.discard_errors);
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
            bump(&self.counters.discard_errors);
            if matches!(e, libc::EOPNOTSUPP | libc::ENOTTY) {
                self.discard_unsupported.store(true, Ordering::Relaxed);
            }
            return;
        }
    }
}
