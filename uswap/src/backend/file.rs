//! The file device: pages in a regular file or on a block device, read and written with
//! `O_DIRECT` through io_uring, slot `n` at byte offset `n * PAGE_SIZE`.
//!
//! # Job
//!
//! [`FileBackend::open`] takes a directory, an existing regular file or a block device:
//! * a **directory**: uswap creates an anonymous swap file in it, mode 0600, never linked
//!   into the directory (`O_TMPFILE | O_EXCL`; where the filesystem has no `O_TMPFILE`, a
//!   file created 0600 with `O_EXCL` and unlinked at once). No other user can open it, and
//!   nothing is left behind when the process ends or crashes.
//! * an existing **regular file**: used as it is. It is never shrunk or truncated; if it is
//!   shorter than the capacity it is extended (allocated with `fallocate`, or sparse with
//!   `ftruncate` when [`FileOptions::preallocate`] is off); if it is longer, only the first
//!   `capacity` bytes are used and the rest is left alone. Swapped memory lands in it, so a
//!   file that its group or other users may read or write is refused
//!   ([`FileDeviceError::OthersMayAccess`], which says to `chmod 600` it). It is locked
//!   (`flock(LOCK_EX)`) so that two devices cannot share it. When the device is dropped,
//!   the range it used is punched out (or, where the filesystem cannot punch holes,
//!   overwritten with zeros): the file is kept, the swapped memory is not.
//! * a path that does not exist, in an existing directory: uswap creates a regular file
//!   there, mode 0600 (`O_CREAT | O_EXCL | O_NOFOLLOW`), and treats it as above; it is kept
//!   after the device is dropped, emptied.
//! * a **block device**: opened exclusively (`O_EXCL`: not while mounted or in use), never
//!   resized; a capacity larger than the device is an error.
//!
//! The capacity is rounded down to whole clusters (`SWAPFILE_CLUSTER` pages, 2 MiB). Nothing
//! is ever synced: swap contents are worthless after a crash.
//!
//! Reads and writes: each request (a run of consecutive slots with one contiguous buffer)
//! becomes one `IORING_OP_READ`/`IORING_OP_WRITE` of the whole run straight from/into the
//! caller's buffer (staging pages for writes, aligned bounce pages for reads; both are
//! page-aligned, as `O_DIRECT` wants). All requests of one call go to the kernel with one
//! `io_uring_enter`, which also waits for all of them; a call with more requests than the
//! queue depth is done in windows of `queue_depth`. Short transfers are resubmitted for
//! the remainder; `EINTR`/`EAGAIN` are retried (a bounded number of times); any other error
//! ends that request with `BackendError::Io` naming the first slot not transferred.
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
//! nothing and never waits for a lock:
//! * There are [`FileOptions::rings`] io_uring instances, each behind a [`SpinLock`] that is
//!   only ever taken with `try_lock`. A call tries the ring of its CPU first, then the others;
//!   if all are busy it does its requests with `pread`/`pwrite` on the same `O_DIRECT` file
//!   descriptor instead (the *syscall fallback*). It never waits for a ring.
//! * If the calling thread already holds any engine [`SpinLock`]
//!   ([`locks_held_by_this_thread`] > 0: it was interrupted inside engine code, possibly
//!   inside this very backend while it held a ring), the call uses the syscall fallback
//!   without touching a ring.
//! * `discard` takes no lock (one system call).
//!
//! Everything the ring path needs (the rings, per-ring bookkeeping of in-flight operations)
//! is allocated at open. Errors are built from `errno` values (`io::Error::from_raw_os_error`,
//! which does not allocate).
//!
//! # Invariants
//!
//! * A ring whose lock is free has nothing in flight and nothing queued: every operation a
//!   call submits completes (its CQE is reaped) before the call releases the ring. So the
//!   kernel never touches a caller's buffer after the call returns, and a completion never
//!   lands on another thread.
//! * If `io_uring_enter` ever fails with an unexpected error while operations are still
//!   queued but not submitted, the ring is marked *poisoned* and never entered again (the
//!   queued entries are dropped with the ring at close, unsubmitted); the call finishes its
//!   remaining requests with the syscall fallback. Operations already submitted are always
//!   waited for.
//! * Per-call work on a ring is bounded by the queue depth: at most `queue_depth` operations
//!   in flight, the completion queue (twice the depth) cannot overflow.

use std::ffi::CString;
use std::fs;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::FileTypeExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use crossbeam_utils::CachePadded;
use io_uring::{opcode, squeue, types, EnterFlags, IoUring};
use thiserror::Error;

use super::{AlignedPage, AsyncReader, AsyncRun, Backend, BackendError, ReadReq, WriteReq};
use crate::mapping::{current_cpu, now_ns, nr_cpus_configured};
use crate::swap::SWAPFILE_CLUSTER;
use crate::sync::{locks_held_by_this_thread, SpinLock};
use crate::uffd::PAGE_SIZE;

/// Bytes in one cluster: the smallest capacity, and the unit capacities are rounded down to.
pub const CLUSTER_BYTES: u64 = (SWAPFILE_CLUSTER * PAGE_SIZE) as u64;
/// Largest accepted queue depth.
pub const MAX_QUEUE_DEPTH: u32 = 4096;
/// Largest single transfer; a longer request is done as several (as if it were short).
const MAX_IO_BYTES: u64 = 1 << 30;
/// How many times one request is retried after `EINTR`/`EAGAIN` before it fails.
const MAX_RETRIES: u32 = 100;
/// `io_uring_enter` calls in a row that make no progress before the ring is given up.
const MAX_STALLS: u32 = 10_000;

// Block-device ioctls (linux/fs.h), absent from the libc crate.
const BLKGETSIZE64: libc::c_ulong = 0x8008_1272; // _IOR(0x12, 114, u64)
const BLKSSZGET: libc::c_ulong = 0x1268; // _IO(0x12, 104)
const BLKDISCARD: libc::c_ulong = 0x1277; // _IO(0x12, 119)

/// How a file device is set up.
#[derive(Debug, Clone)]
pub struct FileOptions {
    /// Entries of each io_uring submission queue: the most operations one call has in flight
    /// at once (1..=[`MAX_QUEUE_DEPTH`]). A call with more requests is done in several rounds.
    pub queue_depth: u32,
    /// Number of io_uring instances. A call takes a free one (the one of its CPU first) and
    /// falls back to `pread`/`pwrite` when all are busy. 0: no io_uring, system calls only.
    pub rings: usize,
    /// Allocate the file's blocks at open (`fallocate`), so that a full filesystem shows at
    /// open rather than as failed swap-outs. Off: the file is sized with `ftruncate`
    /// (sparse). Ignored for block devices.
    pub preallocate: bool,
    /// How long a call polls for its completions before it sleeps, in microseconds (hybrid
    /// polling, like the block layer's for NVMe). A vCPU that sleeps waits 10-20 µs longer
    /// for its wake-up than a 4 KiB read takes on the device here (see BENCHMARKS.md); the
    /// thread waiting has nothing else to do. 0: always sleep.
    pub poll_us: u32,
}

/// Default polling budget: covers a 4 KiB read (about 25 µs after submission here) and most
/// of a 128 KiB one.
pub const DEFAULT_POLL_US: u32 = 100;

/// One wait's hybrid polling (see [`FileOptions::poll_us`]): until the budget is spent each
/// round asks `io_uring_enter` for no completions (it returns at once, having run the
/// completion work); after that a round sleeps for all it waits for.
#[derive(Clone, Copy)]
struct PollBudget {
    /// When polling stops; 0: it never started (no budget, and no clock read).
    until_ns: u64,
}

impl PollBudget {
    fn start(poll_ns: u64) -> PollBudget {
        PollBudget { until_ns: if poll_ns == 0 { 0 } else { now_ns() + poll_ns } }
    }

    /// Whether this round polls.
    fn polling(self) -> bool {
        self.until_ns != 0 && now_ns() < self.until_ns
    }
}

impl Default for FileOptions {
    fn default() -> Self {
        FileOptions {
            queue_depth: 64,
            rings: nr_cpus_configured().clamp(1, 16),
            preallocate: true,
            poll_us: DEFAULT_POLL_US,
        }
    }
}

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

/// One operation of a call: request `req`, of which `done` bytes are transferred.
#[derive(Clone, Copy, Default)]
struct Op {
    req: u32,
    done: u64,
    retries: u32,
}

/// One io_uring instance and its pre-allocated bookkeeping.
struct Ring {
    uring: IoUring,
    /// The file is registered with the ring as fixed file 0 (saves a file lookup per I/O).
    fixed_file: bool,
    /// Never entered again (see the module invariants).
    poisoned: bool,
    /// The operations of the current round, indexed by SQE `user_data`.
    cur: Box<[Op]>,
    /// Operations carried over to the next round (short or retried).
    carry: Box<[Op]>,
}

/// A swap device on a file or block device. See the module documentation.
pub struct FileBackend {
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
}

fn errno() -> i32 {
    io::Error::last_os_error().raw_os_error().unwrap_or(libc::EIO)
}

fn cstring(path: &Path) -> Result<CString, FileDeviceError> {
    CString::new(path.as_os_str().as_bytes()).map_err(|_| FileDeviceError::Io {
        path: path.to_owned(),
        what: "path contains a NUL byte; open",
        source: io::Error::from(io::ErrorKind::InvalidInput),
    })
}

/// Maps an `open`-time error to the typed error that tells the user what to do.
fn open_error(path: &Path, what: &'static str, e: io::Error) -> FileDeviceError {
    let path = path.to_owned();
    match e.raw_os_error() {
        Some(libc::ENOENT) => FileDeviceError::NotFound { path },
        Some(libc::EACCES | libc::EPERM) => FileDeviceError::PermissionDenied { path, source: e },
        Some(libc::EROFS) => FileDeviceError::ReadOnly { path },
        Some(libc::EBUSY) => FileDeviceError::Busy { path },
        _ => FileDeviceError::Io { path, what, source: e },
    }
}

fn sys_open(path: &CString, flags: i32, mode: libc::mode_t) -> io::Result<OwnedFd> {
    loop {
        // SAFETY: `path` is a NUL-terminated string that outlives the call; open has no other
        // memory effects.
        let fd = unsafe { libc::open(path.as_ptr(), flags | libc::O_CLOEXEC, mode as libc::c_uint) };
        if fd >= 0 {
            // SAFETY: a fresh descriptor that nothing else owns.
            return Ok(unsafe { OwnedFd::from_raw_fd(fd) });
        }
        let e = io::Error::last_os_error();
        if e.raw_os_error() != Some(libc::EINTR) {
            return Err(e);
        }
    }
}

fn fstat(fd: RawFd) -> io::Result<libc::stat> {
    // SAFETY: `stat` is plain data that fstat fills in.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: `fd` is open; `st` is a valid out-pointer.
    if unsafe { libc::fstat(fd, &mut st) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(st)
}

/// Creates an anonymous (never linked, or already unlinked) file in `dir`, mode 0600, open
/// read-write. With `try_tmpfile`, `O_TMPFILE | O_EXCL` first (it can never be linked into
/// the filesystem); without it, or where the filesystem does not support it, a uniquely named
/// file created with `O_EXCL | O_NOFOLLOW` and unlinked at once.
fn create_anonymous(dir: &Path, try_tmpfile: bool) -> Result<OwnedFd, FileDeviceError> {
    let cdir = cstring(dir)?;
    if try_tmpfile {
        match sys_open(&cdir, libc::O_TMPFILE | libc::O_EXCL | libc::O_RDWR, 0o600) {
            Ok(fd) => return Ok(fd),
            // No O_TMPFILE in this filesystem (EOPNOTSUPP) or kernel (EISDIR): named file.
            Err(e) if matches!(e.raw_os_error(), Some(libc::EOPNOTSUPP | libc::EISDIR)) => {}
            Err(e) => return Err(open_error(dir, "creating an anonymous swap file (O_TMPFILE)", e)),
        }
    }
    static SEQ: AtomicU64 = AtomicU64::new(0);
    for _ in 0..100 {
        let name = format!(
            ".uswap-swap-{}-{}-{}",
            std::process::id(),
            SEQ.fetch_add(1, Ordering::Relaxed),
            crate::mapping::now_ns()
        );
        let path = dir.join(name);
        let cpath = cstring(&path)?;
        match sys_open(&cpath, libc::O_CREAT | libc::O_EXCL | libc::O_NOFOLLOW | libc::O_RDWR, 0o600) {
            Ok(fd) => {
                // SAFETY: `cpath` is NUL-terminated and outlives the call.
                if unsafe { libc::unlink(cpath.as_ptr()) } != 0 {
                    let e = io::Error::last_os_error();
                    return Err(open_error(dir, "unlinking the new swap file", e));
                }
                return Ok(fd);
            }
            Err(e) if e.raw_os_error() == Some(libc::EEXIST) => continue,
            Err(e) => return Err(open_error(dir, "creating a swap file", e)),
        }
    }
    Err(FileDeviceError::Io {
        path: dir.to_owned(),
        what: "creating a swap file with a unique name",
        source: io::Error::from_raw_os_error(libc::EEXIST),
    })
}

/// Sizes a regular file to at least `len` bytes; never shrinks it.
fn size_file(fd: RawFd, path: &Path, len: u64, preallocate: bool) -> Result<(), FileDeviceError> {
    if preallocate {
        loop {
            // SAFETY: plain system call on an open descriptor. Mode 0 allocates blocks and
            // extends the size when `len` is past the end; it never shrinks or changes data.
            if unsafe { libc::fallocate(fd, 0, 0, len as libc::off_t) } == 0 {
                return Ok(());
            }
            let e = io::Error::last_os_error();
            return Err(match e.raw_os_error() {
                Some(libc::EINTR) => continue,
                Some(libc::EOPNOTSUPP) => FileDeviceError::FallocateUnsupported { path: path.to_owned(), source: e },
                Some(libc::ENOSPC | libc::EDQUOT) => {
                    FileDeviceError::NoSpace { path: path.to_owned(), capacity_bytes: len, source: e }
                }
                _ => FileDeviceError::Io {
                    path: path.to_owned(),
                    what: "allocating the swap file (fallocate)",
                    source: e,
                },
            });
        }
    }
    let st = fstat(fd).map_err(|e| FileDeviceError::Io { path: path.to_owned(), what: "fstat", source: e })?;
    if (st.st_size as u64) < len {
        // SAFETY: plain system call on an open descriptor; only ever grows the file here.
        if unsafe { libc::ftruncate(fd, len as libc::off_t) } != 0 {
            let e = io::Error::last_os_error();
            return Err(match e.raw_os_error() {
                Some(libc::ENOSPC | libc::EDQUOT | libc::EFBIG) => {
                    FileDeviceError::NoSpace { path: path.to_owned(), capacity_bytes: len, source: e }
                }
                _ => FileDeviceError::Io { path: path.to_owned(), what: "sizing the swap file (ftruncate)", source: e },
            });
        }
    }
    Ok(())
}

/// Opens the regular file `path` for a device of `len` bytes, or with `create` creates it
/// (mode 0600; it must not exist). Refuses a file its group or others may read or write,
/// locks it, sizes it. A file created here is removed again if a later step fails.
fn open_regular(path: &Path, create: bool, len: u64, preallocate: bool) -> Result<OwnedFd, FileDeviceError> {
    let cpath = cstring(path)?;
    let fd = if create {
        let flags = libc::O_CREAT | libc::O_EXCL | libc::O_NOFOLLOW | libc::O_RDWR;
        sys_open(&cpath, flags, 0o600).map_err(|e| open_error(path, "creating the swap file", e))?
    } else {
        sys_open(&cpath, libc::O_RDWR | libc::O_DIRECT, 0).map_err(|e| match e.raw_os_error() {
            Some(libc::EINVAL) => FileDeviceError::DirectIoUnsupported { path: path.to_owned(), source: e },
            _ => open_error(path, "opening the swap file", e),
        })?
    };
    let setup = || -> Result<(), FileDeviceError> {
        if create {
            // Exactly 0600 whatever the umask (which can only have removed bits).
            // SAFETY: plain system call on an open descriptor.
            if unsafe { libc::fchmod(fd.as_raw_fd(), 0o600) } != 0 {
                return Err(open_error(path, "fchmod of the swap file", io::Error::last_os_error()));
            }
            set_direct(fd.as_raw_fd(), path)?;
        } else {
            // The mode of what was opened (fstat), not of what the path named a moment ago.
            let st = fstat(fd.as_raw_fd()).map_err(|e| open_error(path, "fstat", e))?;
            let mode = st.st_mode & 0o7777;
            if mode & 0o066 != 0 {
                return Err(FileDeviceError::OthersMayAccess { path: path.to_owned(), mode });
            }
        }
        // SAFETY: plain system call on an open descriptor.
        if unsafe { libc::flock(fd.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } != 0 {
            let e = io::Error::last_os_error();
            return Err(match e.raw_os_error() {
                Some(libc::EWOULDBLOCK) => FileDeviceError::Busy { path: path.to_owned() },
                _ => FileDeviceError::Io { path: path.to_owned(), what: "locking the swap file", source: e },
            });
        }
        size_file(fd.as_raw_fd(), path, len, preallocate)
    };
    match setup() {
        Ok(()) => Ok(fd),
        Err(e) => {
            if create {
                // A failed open leaves nothing behind.
                // SAFETY: `cpath` is NUL-terminated and outlives the call.
                unsafe { libc::unlink(cpath.as_ptr()) };
            }
            Err(e)
        }
    }
}

/// Deallocates `len` bytes at `off` of a regular file: they read back as zero.
fn punch_hole(fd: RawFd, off: u64, len: u64) -> io::Result<()> {
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

/// Turns `O_DIRECT` on for a descriptor opened without it.
fn set_direct(fd: RawFd, path: &Path) -> Result<(), FileDeviceError> {
    // SAFETY: F_GETFL/F_SETFL take and return plain integers.
    let flags = unsafe { libc::fcntl(fd, libc::F_GETFL) };
    // SAFETY: as above.
    if flags < 0 || unsafe { libc::fcntl(fd, libc::F_SETFL, flags | libc::O_DIRECT) } != 0 {
        let e = io::Error::last_os_error();
        return Err(match e.raw_os_error() {
            Some(libc::EINVAL) => FileDeviceError::DirectIoUnsupported { path: path.to_owned(), source: e },
            _ => FileDeviceError::Io { path: path.to_owned(), what: "enabling O_DIRECT", source: e },
        });
    }
    Ok(())
}

fn new_ring(fd: RawFd, queue_depth: u32) -> io::Result<Ring> {
    // COOP_TASKRUN: completions are processed when we enter the kernel to wait for them
    // anyway, so the kernel need not interrupt the thread (5.19+; plain ring otherwise).
    let uring = match IoUring::builder().dontfork().setup_coop_taskrun().setup_submit_all().build(queue_depth) {
        Ok(r) => r,
        Err(e) if e.raw_os_error() == Some(libc::EINVAL) => IoUring::builder().dontfork().build(queue_depth)?,
        Err(e) => return Err(e),
    };
    let fixed_file = uring.submitter().register_files(&[fd]).is_ok();
    let qd = queue_depth as usize;
    Ok(Ring {
        uring,
        fixed_file,
        poisoned: false,
        cur: vec![Op::default(); qd].into_boxed_slice(),
        carry: vec![Op::default(); qd].into_boxed_slice(),
    })
}

/// The requests of one call, read or write, seen the same way by the I/O loops.
trait Batch {
    const WRITE: bool;
    fn count(&self) -> usize;
    fn slot(&self, i: usize) -> u64;
    fn bytes(&self, i: usize) -> u64;
    /// Start of request `i`'s buffer (`bytes(i)` long, page-aligned).
    fn addr(&mut self, i: usize) -> *mut u8;
    fn result_mut(&mut self, i: usize) -> &mut Result<(), BackendError>;
}

impl Batch for [ReadReq<'_>] {
    const WRITE: bool = false;
    fn count(&self) -> usize {
        self.len()
    }
    fn slot(&self, i: usize) -> u64 {
        self[i].slot
    }
    fn bytes(&self, i: usize) -> u64 {
        self[i].nr_pages() * PAGE_SIZE as u64
    }
    fn addr(&mut self, i: usize) -> *mut u8 {
        self[i].buf.as_mut_ptr().cast()
    }
    fn result_mut(&mut self, i: usize) -> &mut Result<(), BackendError> {
        &mut self[i].result
    }
}

impl Batch for [WriteReq<'_>] {
    const WRITE: bool = true;
    fn count(&self) -> usize {
        self.len()
    }
    fn slot(&self, i: usize) -> u64 {
        self[i].slot
    }
    fn bytes(&self, i: usize) -> u64 {
        self[i].data.len_bytes() as u64
    }
    fn addr(&mut self, i: usize) -> *mut u8 {
        // Only ever handed to the kernel as the source of a write.
        self[i].data.as_ptr().cast_mut()
    }
    fn result_mut(&mut self, i: usize) -> &mut Result<(), BackendError> {
        &mut self[i].result
    }
}

/// What to do with an operation after one transfer attempt.
enum Step {
    Done,
    Again,
    Failed(BackendError),
}

impl FileBackend {
    /// Opens (or, for a directory, creates) a swap device of `capacity_bytes` (rounded down to
    /// whole 2 MiB clusters) at `path`: a directory, an existing regular file, or a block
    /// device. See the module documentation for what happens to each.
    pub fn open(
        path: impl AsRef<Path>,
        capacity_bytes: u64,
        options: FileOptions,
    ) -> Result<FileBackend, FileDeviceError> {
        let path = path.as_ref();
        if capacity_bytes < CLUSTER_BYTES {
            return Err(FileDeviceError::TooSmall { path: path.to_owned(), capacity_bytes, min_bytes: CLUSTER_BYTES });
        }
        if options.queue_depth == 0 || options.queue_depth > MAX_QUEUE_DEPTH {
            return Err(FileDeviceError::BadQueueDepth {
                path: path.to_owned(),
                queue_depth: options.queue_depth,
                max: MAX_QUEUE_DEPTH,
            });
        }
        let nr_slots = capacity_bytes / CLUSTER_BYTES * SWAPFILE_CLUSTER as u64;
        let len = nr_slots * PAGE_SIZE as u64;

        let ft = match fs::metadata(path) {
            Ok(meta) => Some(meta.file_type()),
            // Created below, if its directory exists (the README promises a 0600 file).
            Err(e) if e.kind() == io::ErrorKind::NotFound => None,
            Err(e) => return Err(open_error(path, "stat", e)),
        };
        let (file, kind, anonymous) = if ft.is_some_and(|ft| ft.is_dir()) {
            let fd = create_anonymous(path, true)?;
            // Exactly 0600 whatever the umask (which can only have removed bits).
            // SAFETY: plain system call on an open descriptor.
            if unsafe { libc::fchmod(fd.as_raw_fd(), 0o600) } != 0 {
                return Err(open_error(path, "fchmod of the swap file", io::Error::last_os_error()));
            }
            set_direct(fd.as_raw_fd(), path)?;
            size_file(fd.as_raw_fd(), path, len, options.preallocate)?;
            (fd, Kind::File, true)
        } else if ft.is_none_or(|ft| ft.is_file()) {
            (open_regular(path, ft.is_none(), len, options.preallocate)?, Kind::File, false)
        } else if ft.is_some_and(|ft| ft.is_block_device()) {
            let cpath = cstring(path)?;
            let fd = sys_open(&cpath, libc::O_RDWR | libc::O_DIRECT | libc::O_EXCL, 0)
                .map_err(|e| open_error(path, "opening the block device", e))?;
            let mut device_bytes: u64 = 0;
            // SAFETY: BLKGETSIZE64 writes one u64 through the pointer, which is valid.
            if unsafe { libc::ioctl(fd.as_raw_fd(), BLKGETSIZE64, &mut device_bytes as *mut u64) } != 0 {
                return Err(open_error(path, "reading the device size (BLKGETSIZE64)", io::Error::last_os_error()));
            }
            if capacity_bytes > device_bytes {
                return Err(FileDeviceError::LargerThanDevice { path: path.to_owned(), capacity_bytes, device_bytes });
            }
            let mut block_size: libc::c_int = 0;
            // SAFETY: BLKSSZGET writes one int through the pointer, which is valid.
            if unsafe { libc::ioctl(fd.as_raw_fd(), BLKSSZGET, &mut block_size as *mut libc::c_int) } != 0 {
                return Err(open_error(path, "reading the block size (BLKSSZGET)", io::Error::last_os_error()));
            }
            if block_size <= 0 || PAGE_SIZE % block_size as usize != 0 {
                return Err(FileDeviceError::BlockSizeUnsupported {
                    path: path.to_owned(),
                    block_size: block_size.max(0) as u32,
                    page_size: PAGE_SIZE,
                });
            }
            (fd, Kind::BlockDevice, false)
        } else {
            let kind = match ft {
                Some(ft) if ft.is_char_device() => "a character device",
                Some(ft) if ft.is_fifo() => "a FIFO",
                Some(ft) if ft.is_socket() => "a socket",
                _ => "an unknown kind of file",
            };
            return Err(FileDeviceError::UnsupportedFileType { path: path.to_owned(), kind });
        };

        // Probe: one direct read of slot 0, so that a filesystem that accepts O_DIRECT at open
        // but not 4096-byte direct I/O fails here rather than on the first swap-in.
        let mut probe = Box::new(super::AlignedPage([0; PAGE_SIZE]));
        // SAFETY: the buffer is one owned, page-aligned page, valid for PAGE_SIZE bytes.
        let r = unsafe { libc::pread(file.as_raw_fd(), probe.0.as_mut_ptr().cast(), PAGE_SIZE, 0) };
        if r < 0 {
            let e = io::Error::last_os_error();
            return Err(match e.raw_os_error() {
                Some(libc::EINVAL) => FileDeviceError::DirectIoUnsupported { path: path.to_owned(), source: e },
                _ => FileDeviceError::Io { path: path.to_owned(), what: "probe read with O_DIRECT", source: e },
            });
        }

        let mut rings = Vec::with_capacity(options.rings);
        let mut ring_error = None;
        for _ in 0..options.rings {
            match new_ring(file.as_raw_fd(), options.queue_depth) {
                Ok(r) => rings.push(CachePadded::new(SpinLock::new(r))),
                Err(e) => {
                    // io_uring disabled (sysctl kernel.io_uring_disabled, seccomp) or out of
                    // locked memory: serve everything with system calls; say why on request.
                    ring_error = Some(e);
                    break;
                }
            }
        }
        Ok(FileBackend {
            rings: rings.into_boxed_slice(),
            file,
            path: path.to_owned(),
            kind,
            anonymous,
            nr_slots,
            queue_depth: options.queue_depth,
            poll_ns: options.poll_us as u64 * 1000,
            ring_error,
            counters: Counters::default(),
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

    /// Sets every request's result to `Ok` or `OutOfRange`; only `Ok` ones are transferred.
    /// Returns how many are to be transferred.
    fn check_ranges<B: Batch + ?Sized>(&self, reqs: &mut B) -> usize {
        let mut todo = 0;
        for i in 0..reqs.count() {
            let nr = reqs.bytes(i) / PAGE_SIZE as u64;
            let slot = reqs.slot(i);
            *reqs.result_mut(i) = match slot.checked_add(nr) {
                Some(end) if end <= self.nr_slots => {
                    todo += usize::from(nr > 0);
                    Ok(())
                }
                _ => Err(BackendError::OutOfRange {
                    slot: slot.saturating_add(nr).saturating_sub(1),
                    nr_slots: self.nr_slots,
                }),
            };
        }
        todo
    }

    /// The common entry of `read` and `write`: a ring if one is free and allowed, otherwise
    /// the system calls. Allocation-free, never waits for a lock.
    fn submit<B: Batch + ?Sized>(&self, reqs: &mut B) {
        if self.check_ranges(reqs) == 0 {
            return;
        }
        if locks_held_by_this_thread() == 0 && !self.rings.is_empty() {
            let n = self.rings.len();
            let start = current_cpu() % n;
            for k in 0..n {
                if let Some(mut ring) = self.rings[(start + k) % n].try_lock() {
                    if ring.poisoned {
                        continue;
                    }
                    bump(&self.counters.ring_calls);
                    self.run_ring(&mut ring, reqs);
                    return;
                }
            }
        }
        bump(&self.counters.sync_calls);
        self.run_sync_from(reqs, 0);
    }

    /// Request `i` passed the range check and has something to transfer.
    fn needs_io<B: Batch + ?Sized>(reqs: &mut B, i: usize) -> bool {
        reqs.bytes(i) > 0 && reqs.result_mut(i).is_ok()
    }

    /// Does requests `first..` with system calls.
    fn run_sync_from<B: Batch + ?Sized>(&self, reqs: &mut B, first: usize) {
        for i in first..reqs.count() {
            if Self::needs_io(reqs, i) {
                self.run_sync(reqs, Op { req: i as u32, done: 0, retries: 0 });
            }
        }
    }

    /// Judges one transfer attempt of `op` that returned `res` (bytes, or `-errno`).
    fn step<B: Batch + ?Sized>(&self, reqs: &B, op: &mut Op, res: i64) -> Step {
        let i = op.req as usize;
        let failed_slot = reqs.slot(i) + op.done / PAGE_SIZE as u64;
        if res > 0 {
            op.done += res as u64;
            if op.done >= reqs.bytes(i) {
                return Step::Done;
            }
            bump(&self.counters.short_transfers);
            op.retries = 0;
            return Step::Again;
        }
        let source = if res == 0 {
            // End of file on a read (the file was truncated behind our back), or a write that
            // made no progress.
            io::Error::from(if B::WRITE { io::ErrorKind::WriteZero } else { io::ErrorKind::UnexpectedEof })
        } else {
            let e = (-res) as i32;
            if (e == libc::EINTR || e == libc::EAGAIN) && op.retries < MAX_RETRIES {
                op.retries += 1;
                bump(&self.counters.retries);
                return Step::Again;
            }
            io::Error::from_raw_os_error(e)
        };
        Step::Failed(BackendError::Io { slot: failed_slot, source })
    }

    /// Transfers the rest of `op` with `pread`/`pwrite` and sets its request's result.
    fn run_sync<B: Batch + ?Sized>(&self, reqs: &mut B, mut op: Op) {
        let i = op.req as usize;
        let total = reqs.bytes(i);
        let base = reqs.addr(i);
        let offset = reqs.slot(i) * PAGE_SIZE as u64;
        loop {
            let len = (total - op.done).min(MAX_IO_BYTES) as usize;
            // SAFETY: `base + done .. + len` lies inside request i's buffer (`done < total`,
            // `len <= total - done`), which the caller keeps valid and unaliased for this call
            // (an exclusive borrow for reads; engine-owned staging pages for writes). The
            // offset is inside the device (checked by `check_ranges`).
            let r = unsafe {
                let buf = base.add(op.done as usize);
                let off = (offset + op.done) as libc::off_t;
                if B::WRITE {
                    libc::pwrite(self.file.as_raw_fd(), buf as *const libc::c_void, len, off)
                } else {
                    libc::pread(self.file.as_raw_fd(), buf.cast(), len, off)
                }
            };
            let res = if r < 0 { -(errno() as i64) } else { r as i64 };
            match self.step(reqs, &mut op, res) {
                Step::Done => return,
                Step::Again => {
                    if res == -(libc::EAGAIN as i64) {
                        std::thread::yield_now();
                    }
                }
                Step::Failed(e) => {
                    *reqs.result_mut(i) = Err(e);
                    return;
                }
            }
        }
    }

    /// Builds the SQE for the next transfer of `op`, tagged with `user_data`.
    fn sqe<B: Batch + ?Sized>(&self, fixed_file: bool, reqs: &mut B, op: &Op, user_data: u64) -> squeue::Entry {
        let i = op.req as usize;
        let len = (reqs.bytes(i) - op.done).min(MAX_IO_BYTES) as u32;
        // `wrapping_add` keeps this function free of unsafe; `done < bytes(i)`, so the result
        // is inside the request's buffer.
        let buf = reqs.addr(i).wrapping_add(op.done as usize);
        let offset = reqs.slot(i) * PAGE_SIZE as u64 + op.done;
        macro_rules! build {
            ($fd:expr) => {
                if B::WRITE {
                    opcode::Write::new($fd, buf, len).offset(offset).build()
                } else {
                    opcode::Read::new($fd, buf, len).offset(offset).build()
                }
            };
        }
        let e = if fixed_file { build!(types::Fixed(0)) } else { build!(types::Fd(self.file.as_raw_fd())) };
        e.user_data(user_data)
    }

    /// Does the requests of one call on `ring`, in rounds of at most `queue_depth`
    /// operations, each round one `io_uring_enter` that submits and waits for all.
    fn run_ring<B: Batch + ?Sized>(&self, ring: &mut Ring, reqs: &mut B) {
        let qd = ring.cur.len();
        let n = reqs.count();
        let mut next_req = 0;
        let mut nr_carried = 0;
        loop {
            // Fill the round: carried-over operations first, then new requests.
            let mut k = 0;
            while k < nr_carried {
                ring.cur[k] = ring.carry[k];
                k += 1;
            }
            while k < qd && next_req < n {
                if Self::needs_io(reqs, next_req) {
                    ring.cur[k] = Op { req: next_req as u32, done: 0, retries: 0 };
                    k += 1;
                }
                next_req += 1;
            }
            if k == 0 {
                return;
            }
            let mut pushed = 0;
            {
                let fixed_file = ring.fixed_file;
                let mut sq = ring.uring.submission();
                while pushed < k {
                    let e = self.sqe(fixed_file, reqs, &ring.cur[pushed], pushed as u64);
                    // SAFETY: the entry points into request `req`'s buffer, valid for `len`
                    // bytes for the whole call (see `run_sync`); this function reaps every
                    // submitted entry before it returns, and entries never submitted stay in
                    // a poisoned ring that is never entered again (module invariants), so the
                    // kernel never touches the buffer after the call.
                    if unsafe { sq.push(&e) }.is_err() {
                        break; // Cannot happen: the queue is empty and holds >= qd entries.
                    }
                    pushed += 1;
                }
            } // Dropping the SubmissionQueue publishes the new tail to the kernel.
            for j in pushed..k {
                let op = ring.cur[j];
                self.run_sync(reqs, op);
            }
            nr_carried = self.complete_round(ring, reqs, pushed);
            if ring.poisoned {
                for j in 0..nr_carried {
                    let op = ring.carry[j];
                    self.run_sync(reqs, op);
                }
                self.run_sync_from(reqs, next_req);
                return;
            }
        }
    }

    /// Submits the `pushed` queued entries, waits for all their completions and handles them.
    /// Returns how many operations were carried over to `ring.carry` for another round.
    fn complete_round<B: Batch + ?Sized>(&self, ring: &mut Ring, reqs: &mut B, pushed: usize) -> usize {
        let mut unsubmitted = pushed;
        let mut outstanding = 0usize;
        let mut nr_carried = 0;
        let mut stalls = 0;
        let budget = PollBudget::start(self.poll_ns);
        while unsubmitted > 0 || outstanding > 0 {
            let want = (unsubmitted + outstanding) as u32;
            let polling = budget.polling();
            let min_complete = if polling { 0 } else { want };
            // SAFETY: no signal mask argument (a null pointer of size 0); the queued entries
            // are valid (see `run_ring`).
            let r = unsafe {
                ring.uring.submitter().enter::<libc::sigset_t>(
                    unsubmitted as u32,
                    min_complete,
                    EnterFlags::GETEVENTS.bits(),
                    None,
                )
            };
            let mut progress = false;
            match r {
                Ok(submitted) => {
                    let s = submitted.min(unsubmitted);
                    unsubmitted -= s;
                    outstanding += s;
                    progress = s > 0;
                }
                Err(e) => match e.raw_os_error() {
                    Some(libc::EINTR) => {}
                    Some(libc::EAGAIN | libc::EBUSY) => std::thread::yield_now(),
                    _ if unsubmitted > 0 => {
                        // The kernel refuses the queued entries: give the ring up (never enter
                        // it again) and do them with system calls once the submitted ones are
                        // back. They are the last `unsubmitted` of this round, in order.
                        ring.poisoned = true;
                    }
                    _ => std::thread::yield_now(),
                },
            }
            if self.reap(ring, reqs, pushed, &mut outstanding, &mut nr_carried) {
                progress = true;
            }
            // (A polling round that finds nothing yet is not a stall.)
            stalls = if progress || (polling && unsubmitted == 0) { 0 } else { stalls + 1 };
            if polling && !progress {
                std::hint::spin_loop();
            }
            if stalls >= MAX_STALLS && unsubmitted > 0 {
                ring.poisoned = true; // The kernel takes nothing: same as a refusal.
            }
            if ring.poisoned && unsubmitted > 0 {
                bump(&self.counters.rings_poisoned);
                if outstanding > 0 {
                    // Wait for the submitted ones without submitting anything more.
                    self.wait_outstanding(ring, reqs, pushed, &mut outstanding, &mut nr_carried);
                }
                for j in pushed - unsubmitted..pushed {
                    let op = ring.cur[j];
                    self.run_sync(reqs, op);
                }
                return nr_carried;
            }
        }
        nr_carried
    }

    /// For a poisoned ring: waits until the `outstanding` submitted operations complete,
    /// never submitting the entries still queued.
    fn wait_outstanding<B: Batch + ?Sized>(
        &self,
        ring: &mut Ring,
        reqs: &mut B,
        pushed: usize,
        outstanding: &mut usize,
        nr_carried: &mut usize,
    ) {
        while *outstanding > 0 {
            // SAFETY: to_submit is 0, so nothing queued is submitted; no signal mask.
            let r = unsafe {
                ring.uring.submitter().enter::<libc::sigset_t>(
                    0,
                    *outstanding as u32,
                    EnterFlags::GETEVENTS.bits(),
                    None,
                )
            };
            if r.is_err() {
                std::thread::yield_now();
            }
            self.reap(ring, reqs, pushed, outstanding, nr_carried);
        }
    }

    /// Handles the completions waiting in the ring's completion queue: finished operations
    /// set their request's result, short or retried ones go to `ring.carry`. Returns whether
    /// there were any.
    fn reap<B: Batch + ?Sized>(
        &self,
        ring: &mut Ring,
        reqs: &mut B,
        pushed: usize,
        outstanding: &mut usize,
        nr_carried: &mut usize,
    ) -> bool {
        let mut any = false;
        let Ring { uring, cur, carry, .. } = ring;
        for cqe in uring.completion() {
            // Indexing is checked without panicking: a panic here would unwind with
            // operations in flight.
            let idx = cqe.user_data() as usize;
            let Some(mut op) = cur.get(..pushed).and_then(|c| c.get(idx)).copied() else {
                continue; // Not ours (cannot happen: the ring is empty between calls).
            };
            *outstanding = outstanding.saturating_sub(1);
            any = true;
            match self.step(reqs, &mut op, cqe.result() as i64) {
                Step::Done => {}
                Step::Again => match carry.get_mut(*nr_carried) {
                    Some(c) => {
                        *c = op;
                        *nr_carried += 1;
                    }
                    None => self.run_sync(reqs, op), // Cannot happen: one carry per op.
                },
                Step::Failed(e) => *reqs.result_mut(op.req as usize) = Err(e),
            }
        }
        any
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

    fn async_reader(&self, nr_pages: usize) -> Option<Box<dyn AsyncReader>> {
        FileAsyncReader::new(self.file.as_raw_fd(), self.nr_slots, nr_pages, self.poll_ns)
            .ok()
            .map(|r| Box::new(r) as _)
    }

    fn read(&self, reqs: &mut [ReadReq<'_>]) {
        self.submit(reqs);
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

// ---------------------------------------------------------------------------------------
// Asynchronous readahead
// ---------------------------------------------------------------------------------------

/// The file device's [`AsyncReader`]: an io_uring and a buffer of its own, and a duplicate of
/// the device's descriptor (so that it can finish its reads whatever order things are
/// dropped in at shutdown).
///
/// Soundness: the kernel writes into `buf` from `start` until the last completion is reaped
/// in `wait_all`; `in_flight > 0` over exactly that time, and every accessor of the buffer
/// refuses while it is. `Drop` waits too. If the ring cannot be waited on (the kernel
/// refusing `io_uring_enter` [`MAX_STALLS`] times in a row) the buffer is leaked rather than
/// freed under a read, and the reader refuses all further work.
pub struct FileAsyncReader {
    uring: IoUring,
    file: OwnedFd,
    nr_slots: u64,
    buf: Box<[AlignedPage]>,
    /// The runs of the last `start`; `runs[..nr_runs]`.
    runs: Box<[AsyncRun]>,
    nr_runs: usize,
    /// Per run: bytes transferred so far, and the errno it failed with (0: none).
    done: Box<[u64]>,
    failed: Box<[i32]>,
    /// Reads submitted and not yet reaped.
    in_flight: usize,
    /// The ring refused work: never entered again, `start` refuses.
    broken: bool,
    /// Polling budget of a wait before it sleeps (see [`FileOptions::poll_us`]).
    poll_ns: u64,
}

impl FileAsyncReader {
    fn new(fd: RawFd, nr_slots: u64, nr_pages: usize, poll_ns: u64) -> io::Result<FileAsyncReader> {
        let nr_pages = nr_pages.max(1);
        // SAFETY: F_DUPFD_CLOEXEC on our open descriptor returns a new descriptor we own.
        let dup = unsafe { libc::fcntl(fd, libc::F_DUPFD_CLOEXEC, 0) };
        if dup < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: `dup` is a fresh descriptor owned by nobody else.
        let file = unsafe { OwnedFd::from_raw_fd(dup) };
        let uring = match IoUring::builder().dontfork().setup_coop_taskrun().build(nr_pages as u32) {
            Ok(r) => r,
            Err(e) if e.raw_os_error() == Some(libc::EINVAL) => IoUring::builder().dontfork().build(nr_pages as u32)?,
            Err(e) => return Err(e),
        };
        Ok(FileAsyncReader {
            uring,
            file,
            nr_slots,
            buf: vec![AlignedPage([0; PAGE_SIZE]); nr_pages].into_boxed_slice(),
            runs: vec![AsyncRun { slot: 0, first_page: 0, nr_pages: 0 }; nr_pages].into_boxed_slice(),
            nr_runs: 0,
            done: vec![0; nr_pages].into_boxed_slice(),
            failed: vec![0; nr_pages].into_boxed_slice(),
            in_flight: 0,
            broken: false,
            poll_ns,
        })
    }

    fn run_bytes(&self, i: usize) -> u64 {
        (self.runs[i].nr_pages * PAGE_SIZE) as u64
    }

    /// Reads the rest of run `i` with `pread` (after a short or interrupted read).
    fn finish_sync(&mut self, i: usize) {
        let run = self.runs[i];
        let total = self.run_bytes(i);
        let mut retries = 0;
        while self.done[i] < total {
            let done = self.done[i];
            let at = run.first_page * PAGE_SIZE + done as usize;
            let fd = self.file.as_raw_fd();
            let Some(dst) = self.buf_bytes_mut().get_mut(at..at + (total - done) as usize) else {
                self.failed[i] = libc::EINVAL; // Cannot happen: `start` checked the run.
                return;
            };
            // SAFETY: `dst` is a live, exclusively borrowed part of our buffer, `dst.len()`
            // bytes long; nothing else is reading into this run (its CQE was reaped).
            let r = unsafe {
                libc::pread(fd, dst.as_mut_ptr().cast(), dst.len(), (run.slot * PAGE_SIZE as u64 + done) as libc::off_t)
            };
            if r > 0 {
                self.done[i] += r as u64;
                continue;
            }
            let e = if r == 0 { libc::ENODATA } else { errno() };
            if (e == libc::EINTR || e == libc::EAGAIN) && retries < MAX_RETRIES {
                retries += 1;
                continue;
            }
            self.failed[i] = e;
            return;
        }
    }

    fn buf_bytes_mut(&mut self) -> &mut [u8] {
        let len = self.buf.len() * PAGE_SIZE;
        // SAFETY: `AlignedPage` is `repr(C)` around `[u8; PAGE_SIZE]`, so the slice of pages
        // is `len` contiguous, initialised bytes, borrowed exclusively through `self`.
        unsafe { std::slice::from_raw_parts_mut(self.buf.as_mut_ptr().cast::<u8>(), len) }
    }

    /// Reaps completions until nothing is in flight.
    fn wait_all(&mut self) {
        let mut stalls = 0;
        let budget = PollBudget::start(self.poll_ns);
        while self.in_flight > 0 {
            let mut reaped = 0;
            // Collect first: finishing a run needs `&mut self`.
            let mut finished = [(0usize, 0i32); 16];
            for cqe in self.uring.completion().take(finished.len()) {
                finished[reaped] = (cqe.user_data() as usize, cqe.result());
                reaped += 1;
            }
            for &(i, res) in &finished[..reaped] {
                self.in_flight -= 1;
                if i >= self.nr_runs {
                    continue; // Not ours (cannot happen).
                }
                if res > 0 {
                    self.done[i] += res as u64;
                    if self.done[i] < self.run_bytes(i) {
                        self.finish_sync(i);
                    }
                } else if res == -libc::EINTR || res == -libc::EAGAIN {
                    self.finish_sync(i);
                } else {
                    self.failed[i] = if res == 0 { libc::ENODATA } else { -res };
                }
            }
            if self.in_flight == 0 || reaped > 0 {
                stalls = 0;
                continue;
            }
            let polling = budget.polling();
            let min_complete = if polling { 0 } else { self.in_flight as u32 };
            // SAFETY: nothing to submit, no signal mask.
            let r = unsafe {
                self.uring.submitter().enter::<libc::sigset_t>(0, min_complete, EnterFlags::GETEVENTS.bits(), None)
            };
            if polling {
                std::hint::spin_loop();
            }
            if r.is_err() {
                stalls += 1;
                if stalls >= MAX_STALLS {
                    // We can no longer know when the kernel is done with the buffer.
                    let buf = std::mem::take(&mut self.buf);
                    std::mem::forget(buf);
                    for f in &mut self.failed[..self.nr_runs] {
                        if *f == 0 {
                            *f = libc::EIO;
                        }
                    }
                    self.in_flight = 0;
                    self.broken = true;
                    return;
                }
                std::thread::yield_now();
            }
        }
    }
}

impl AsyncReader for FileAsyncReader {
    fn capacity_pages(&self) -> usize {
        self.buf.len()
    }

    fn start(&mut self, runs: &[AsyncRun]) -> bool {
        if self.in_flight > 0 || self.broken || runs.is_empty() || runs.len() > self.runs.len() {
            return false;
        }
        let cap = self.buf.len();
        let valid = |r: &AsyncRun| {
            r.nr_pages > 0
                && r.first_page.checked_add(r.nr_pages).is_some_and(|end| end <= cap)
                && r.slot.checked_add(r.nr_pages as u64).is_some_and(|end| end <= self.nr_slots)
        };
        if !runs.iter().all(valid) {
            return false;
        }
        self.runs[..runs.len()].copy_from_slice(runs);
        self.nr_runs = runs.len();
        self.done[..runs.len()].fill(0);
        self.failed[..runs.len()].fill(0);
        let fd = types::Fd(self.file.as_raw_fd());
        let base = self.buf.as_mut_ptr().cast::<u8>();
        {
            let mut sq = self.uring.submission();
            for (i, r) in runs.iter().enumerate() {
                // `wrapping_add` keeps this free of unsafe; the run was checked to lie in the
                // buffer.
                let dst = base.wrapping_add(r.first_page * PAGE_SIZE);
                let e = opcode::Read::new(fd, dst, (r.nr_pages * PAGE_SIZE) as u32)
                    .offset(r.slot * PAGE_SIZE as u64)
                    .build()
                    .user_data(i as u64);
                // SAFETY: the entry points into our buffer, which stays allocated and is
                // handed to nobody until `wait_all` has reaped every completion (see the
                // type's soundness note). The queue has one entry per buffer page, so it
                // has room for every run.
                if unsafe { sq.push(&e) }.is_err() {
                    return false; // Cannot happen (see above); nothing was submitted.
                }
            }
        }
        let mut submitted = 0;
        let mut retries = 0;
        while submitted < runs.len() {
            match self.uring.submit() {
                Ok(n) => submitted += n,
                Err(e) if matches!(e.raw_os_error(), Some(libc::EINTR | libc::EAGAIN | libc::EBUSY)) => {
                    retries += 1;
                    if retries > MAX_RETRIES {
                        break;
                    }
                    std::thread::yield_now();
                }
                Err(_) => break,
            }
        }
        self.in_flight = submitted;
        if submitted < runs.len() {
            // The kernel refused the rest: they stay queued in a ring that is never entered
            // again, so it never reads into the buffer for them.
            self.broken = true;
            for f in &mut self.failed[submitted..runs.len()] {
                *f = libc::EIO;
            }
            if submitted == 0 {
                return false;
            }
        }
        true
    }

    fn in_flight(&self) -> bool {
        self.in_flight > 0
    }

    fn wait(&mut self, results: &mut [Result<(), BackendError>]) {
        self.wait_all();
        for (i, res) in results.iter_mut().enumerate().take(self.nr_runs) {
            *res = match self.failed[i] {
                0 => Ok(()),
                e => Err(BackendError::Io {
                    slot: self.runs[i].slot + self.done[i] / PAGE_SIZE as u64,
                    source: io::Error::from_raw_os_error(e),
                }),
            };
        }
    }

    fn pages(&self) -> Option<&[AlignedPage]> {
        (self.in_flight == 0 && !self.buf.is_empty()).then_some(&self.buf[..])
    }

    fn pages_mut(&mut self) -> Option<&mut [AlignedPage]> {
        (self.in_flight == 0 && !self.buf.is_empty()).then_some(&mut self.buf[..])
    }
}

impl Drop for FileAsyncReader {
    fn drop(&mut self) {
        self.wait_all();
    }
}

#[cfg(test)]
mod tests {
    use super::super::AlignedPage;
    use super::*;
    use crate::mapping::{MapOptions, Mapping};
    use crate::sync::SpinLock;
    use arrayvec::ArrayVec;
    use std::os::unix::fs::{MetadataExt, OpenOptionsExt, PermissionsExt};
    use std::sync::atomic::AtomicUsize;
    use std::sync::{Arc, Barrier};

    /// Counts heap operations per thread, so a test can prove a code path allocates nothing
    /// while other tests run in parallel on other threads.
    mod alloc_count {
        use std::alloc::{GlobalAlloc, Layout, System};
        use std::cell::Cell;

        thread_local! {
            // const, no destructor: usable from inside the allocator.
            static OPS: Cell<u64> = const { Cell::new(0) };
        }

        fn bump() {
            let _ = OPS.try_with(|c| c.set(c.get() + 1));
        }

        /// Allocations, reallocations and frees made by the calling thread so far.
        pub fn this_thread() -> u64 {
            OPS.try_with(|c| c.get()).unwrap_or(0)
        }

        pub struct Counting;

        // SAFETY: forwards every call unchanged to the system allocator.
        unsafe impl GlobalAlloc for Counting {
            unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
                bump();
                // SAFETY: same contract as ours.
                unsafe { System.alloc(layout) }
            }
            unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
                bump();
                // SAFETY: same contract as ours.
                unsafe { System.alloc_zeroed(layout) }
            }
            unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
                bump();
                // SAFETY: same contract as ours.
                unsafe { System.dealloc(ptr, layout) }
            }
            unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
                bump();
                // SAFETY: same contract as ours.
                unsafe { System.realloc(ptr, layout, new_size) }
            }
        }

        #[global_allocator]
        static COUNTING: Counting = Counting;
    }

    const MIB: u64 = 1 << 20;

    /// A fresh directory under the temporary directory (ext4 on these machines), removed
    /// with its contents on drop.
    struct TestDir(PathBuf);

    impl TestDir {
        fn new(tag: &str) -> TestDir {
            static N: AtomicUsize = AtomicUsize::new(0);
            let p = std::env::temp_dir().join(format!(
                "uswap-file-{tag}-{}-{}",
                std::process::id(),
                N.fetch_add(1, Ordering::Relaxed)
            ));
            fs::create_dir(&p).unwrap();
            TestDir(p)
        }
        fn path(&self) -> &Path {
            &self.0
        }
    }

    impl Drop for TestDir {
        fn drop(&mut self) {
            let _ = fs::remove_dir_all(&self.0);
        }
    }

    /// A file only its owner may read and write, as a regular-file device must be.
    fn write_private(path: &Path, bytes: &[u8]) {
        fs::write(path, bytes).unwrap();
        fs::set_permissions(path, fs::Permissions::from_mode(0o600)).unwrap();
    }

    fn opts(queue_depth: u32, rings: usize) -> FileOptions {
        FileOptions { queue_depth, rings, ..FileOptions::default() }
    }

    /// xorshift64*: deterministic randomness without a dependency.
    struct Rng(u64);

    impl Rng {
        fn next(&mut self) -> u64 {
            self.0 ^= self.0 >> 12;
            self.0 ^= self.0 << 25;
            self.0 ^= self.0 >> 27;
            self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
        }
        fn below(&mut self, n: u64) -> u64 {
            self.next() % n
        }
        fn shuffle<T>(&mut self, v: &mut [T]) {
            for i in (1..v.len()).rev() {
                v.swap(i, self.below(i as u64 + 1) as usize);
            }
        }
    }

    /// The contents of `slot` at generation `gen`: every byte depends on both and on its
    /// position, so a page read from the wrong slot, generation or offset is caught.
    fn page_bytes(slot: u64, gen: u64) -> [u8; PAGE_SIZE] {
        let mut p = [0u8; PAGE_SIZE];
        for (k, w) in p.chunks_exact_mut(8).enumerate() {
            let mut z = slot << 32
                ^ gen.wrapping_mul(0x9E37_79B9_7F4A_7C15)
                ^ (k as u64 + 1).wrapping_mul(0xBF58_476D_1CE4_E5B9);
            z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
            w.copy_from_slice(&(z ^ (z >> 27)).to_le_bytes());
        }
        p
    }

    /// A staging area holding, at page `slot`, the contents of `slot` at generation `gen`.
    fn staging(nr_slots: u64) -> Mapping {
        Mapping::anonymous(nr_slots as usize * PAGE_SIZE, MapOptions { no_huge_pages: true, dont_fork: false }).unwrap()
    }

    fn stage(src: &Mapping, slot: u64, nr: u64, gen: u64) {
        for s in slot..slot + nr {
            src.write(s as usize * PAGE_SIZE, &page_bytes(s, gen));
        }
    }

    fn zero_pages(n: usize) -> Vec<AlignedPage> {
        vec![AlignedPage([0; PAGE_SIZE]); n]
    }

    /// Random non-overlapping runs `(first slot, pages)` covering part of `[lo, hi)`.
    fn random_runs(rng: &mut Rng, lo: u64, hi: u64, max_run: u64) -> Vec<(u64, u64)> {
        let mut runs = Vec::new();
        let mut s = lo + rng.below(4);
        while s < hi {
            let n = (1 + rng.below(max_run)).min(hi - s);
            runs.push((s, n));
            s += n + rng.below(4);
        }
        runs
    }

    /// Writes `runs` (at generation `gens[i]`) in one call; every result must be Ok.
    fn write_runs(b: &FileBackend, src: &Mapping, runs: &[(u64, u64)], gens: &[u64]) {
        for (&(s, n), &g) in runs.iter().zip(gens) {
            stage(src, s, n, g);
        }
        let mut reqs: Vec<WriteReq<'_>> =
            runs.iter().map(|&(s, n)| WriteReq::new(s, src.pages(s as usize * PAGE_SIZE, n as usize))).collect();
        b.write(&mut reqs);
        for r in &reqs {
            if let Err(e) = &r.result {
                panic!("write of slot {} failed: {e}", r.slot);
            }
        }
    }

    /// Reads `runs` in one call and checks every byte against generation `gens[i]`.
    fn read_and_verify(b: &FileBackend, runs: &[(u64, u64)], gens: &[u64]) {
        let total: u64 = runs.iter().map(|r| r.1).sum();
        let mut buf = zero_pages(total as usize);
        let mut reqs = Vec::new();
        let mut rest = &mut buf[..];
        for &(s, n) in runs {
            let (head, tail) = rest.split_at_mut(n as usize);
            reqs.push(ReadReq::new(s, head));
            rest = tail;
        }
        b.read(&mut reqs);
        for r in &reqs {
            if let Err(e) = &r.result {
                panic!("read of slot {} failed: {e}", r.slot);
            }
        }
        drop(reqs);
        let mut off = 0;
        for (&(s, n), &g) in runs.iter().zip(gens) {
            for i in 0..n {
                assert!(buf[off].0 == page_bytes(s + i, g), "slot {} (generation {g}) read back wrong", s + i);
                off += 1;
            }
        }
    }

    /// Many random runs, written and read back in random batches of up to 40 requests (ten
    /// times the queue depth of 4), twice with overwrites; every byte checked.
    fn round_trip(options: FileOptions, seed: u64) -> FileStats {
        let dir = TestDir::new("rt");
        let b = FileBackend::open(dir.path(), 8 * MIB, options).unwrap();
        let nr = b.nr_slots();
        assert_eq!(nr, 2048);
        let src = staging(nr);
        let mut rng = Rng(seed);
        let runs = random_runs(&mut rng, 0, nr, 40);
        let mut gen = vec![0u64; runs.len()];
        for round in 1..=3u64 {
            // Overwrite a random half of the runs (all of them the first time).
            let mut order: Vec<usize> = (0..runs.len()).filter(|_| round == 1 || rng.below(2) == 0).collect();
            rng.shuffle(&mut order);
            for batch in order.chunks(1 + rng.below(40) as usize) {
                let rs: Vec<_> = batch.iter().map(|&i| runs[i]).collect();
                let gs: Vec<_> = batch.iter().map(|&i| round * 1000 + i as u64).collect();
                write_runs(&b, &src, &rs, &gs);
                for &i in batch {
                    gen[i] = round * 1000 + i as u64;
                }
            }
            let mut order: Vec<usize> = (0..runs.len()).collect();
            rng.shuffle(&mut order);
            let mut i = 0;
            while i < order.len() {
                let k = (1 + rng.below(40) as usize).min(order.len() - i);
                let rs: Vec<_> = order[i..i + k].iter().map(|&j| runs[j]).collect();
                let gs: Vec<_> = order[i..i + k].iter().map(|&j| gen[j]).collect();
                read_and_verify(&b, &rs, &gs);
                i += k;
            }
        }
        b.stats()
    }

    #[test]
    fn async_reader_reads_runs_into_its_buffer_and_guards_it_while_in_flight() {
        let dir = TestDir::new("async");
        let b = FileBackend::open(dir.path(), 4 * MIB, opts(4, 1)).unwrap();
        let src = staging(b.nr_slots());
        write_runs(&b, &src, &[(10, 5), (100, 3), (700, 8)], &[1, 2, 3]);
        let mut r = b.async_reader(16).expect("the file device reads asynchronously");
        assert_eq!(r.capacity_pages(), 16);
        // Three runs, out of slot order, into three parts of the buffer.
        let runs = [
            AsyncRun { slot: 700, first_page: 0, nr_pages: 8 },
            AsyncRun { slot: 10, first_page: 8, nr_pages: 5 },
            AsyncRun { slot: 100, first_page: 13, nr_pages: 3 },
        ];
        for _ in 0..2 {
            assert!(r.start(&runs));
            // While reads are in flight the buffer is out of bounds and nothing more starts.
            if r.in_flight() {
                assert!(r.pages().is_none());
                assert!(!r.start(&runs[..1]));
            }
            let mut results: Vec<Result<(), BackendError>> = (0..3).map(|_| Ok(())).collect();
            r.wait(&mut results);
            assert!(results.iter().all(|r| r.is_ok()), "{results:?}");
            let pages = r.pages().expect("nothing in flight");
            for (run, gen) in runs.iter().zip([3, 1, 2]) {
                for i in 0..run.nr_pages {
                    let slot = run.slot + i as u64;
                    assert!(pages[run.first_page + i].0 == page_bytes(slot, gen), "slot {slot}");
                }
            }
        }
        // Runs outside the device or the buffer start nothing.
        assert!(!r.start(&[AsyncRun { slot: b.nr_slots() - 1, first_page: 0, nr_pages: 2 }]));
        assert!(!r.start(&[AsyncRun { slot: 0, first_page: 15, nr_pages: 2 }]));
        assert!(!r.start(&[]));
        // Dropping with reads in flight waits for them.
        assert!(r.start(&runs));
        drop(r);
    }

    #[test]
    fn round_trip_through_io_uring_with_batches_beyond_the_queue_depth() {
        let st = round_trip(opts(4, 1), 0x1234_5678);
        assert!(st.ring_calls > 0);
        assert_eq!(st.sync_calls, 0, "one thread, one free ring: every call should use it");
    }

    #[test]
    fn round_trip_sleeping_and_polling_for_completions() {
        // 0: every wait sleeps in the kernel. A budget longer than any test: every wait polls
        // until its completions are in (a polling round that finds nothing is not a stall).
        for (poll_us, seed) in [(0, 0x0bad_cafe), (10_000_000, 0x0dd_ba11)] {
            let st = round_trip(FileOptions { poll_us, ..opts(4, 1) }, seed);
            assert!(st.ring_calls > 0, "poll_us {poll_us}");
            assert_eq!(st.sync_calls, 0, "poll_us {poll_us}: the ring was given up");
        }
    }

    #[test]
    fn round_trip_through_the_syscall_fallback() {
        let st = round_trip(opts(4, 0), 0x8765_4321);
        assert_eq!(st.ring_calls, 0);
        assert!(st.sync_calls > 0);
    }

    #[test]
    fn concurrent_readers_and_writers_on_disjoint_slots() {
        let dir = TestDir::new("conc");
        let b = Arc::new(FileBackend::open(dir.path(), 8 * MIB, opts(8, 2)).unwrap());
        let nr_threads = 4u64;
        let per = b.nr_slots() / nr_threads;
        let iters = 60;
        let threads: Vec<_> = (0..nr_threads)
            .map(|t| {
                let b = b.clone();
                std::thread::spawn(move || {
                    let src = staging(b.nr_slots());
                    let mut rng = Rng(0x9E37 + t);
                    for it in 0..iters {
                        let runs = random_runs(&mut rng, t * per, (t + 1) * per, 24);
                        let k = 1 + rng.below(runs.len() as u64) as usize;
                        let start = rng.below((runs.len() - k + 1) as u64) as usize;
                        let rs = &runs[start..start + k];
                        let gs: Vec<u64> = (0..k as u64).map(|i| it * 100 + i).collect();
                        write_runs(&b, &src, rs, &gs);
                        read_and_verify(&b, rs, &gs);
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        let st = b.stats();
        assert_eq!(st.ring_calls + st.sync_calls, nr_threads * iters * 2);
    }

    #[test]
    fn busy_ring_and_held_engine_lock_fall_back_to_syscalls() {
        let dir = TestDir::new("busy");
        let b = Arc::new(FileBackend::open(dir.path(), 2 * MIB, opts(4, 1)).unwrap());
        let src = staging(b.nr_slots());
        let runs = [(3, 5), (20, 1), (100, 32)];

        // Another thread holds the only ring: reads and writes go around it, at once.
        let held = Arc::new(Barrier::new(2));
        let release = Arc::new(Barrier::new(2));
        let holder = {
            let (b, held, release) = (b.clone(), held.clone(), release.clone());
            std::thread::spawn(move || {
                let _g = b.rings[0].try_lock().expect("ring free");
                held.wait();
                release.wait();
            })
        };
        held.wait();
        let before = b.stats();
        write_runs(&b, &src, &runs, &[1, 2, 3]);
        read_and_verify(&b, &runs, &[1, 2, 3]);
        let after = b.stats();
        assert_eq!(after.sync_calls - before.sync_calls, 2);
        assert_eq!(after.ring_calls, before.ring_calls);
        release.wait();
        holder.join().unwrap();

        // This thread holds an engine lock (as if a signal interrupted engine code): the
        // ring is free, but it must not be used.
        let engine_lock = SpinLock::new(());
        let g = engine_lock.lock();
        read_and_verify(&b, &runs, &[1, 2, 3]);
        drop(g);
        let st = b.stats();
        assert_eq!(st.sync_calls - after.sync_calls, 1);
        assert_eq!(st.ring_calls, after.ring_calls);

        // And with nothing held the ring is used again.
        read_and_verify(&b, &runs, &[1, 2, 3]);
        assert_eq!(b.stats().ring_calls, st.ring_calls + 1);
    }

    #[test]
    fn no_allocation_on_the_read_and_write_paths() {
        let dir = TestDir::new("alloc");
        let b = Arc::new(FileBackend::open(dir.path(), 2 * MIB, opts(4, 1)).unwrap());
        let src = staging(b.nr_slots());
        stage(&src, 0, 64, 7);
        let mut buf = zero_pages(64);
        let engine_lock = SpinLock::new(());
        let (held, release) = (Arc::new(Barrier::new(2)), Arc::new(AtomicBool::new(false)));

        // Everything below runs once to warm up (the ring's first use, lazily initialised
        // thread-locals), then again under the allocation counter.
        let pass = |b: &FileBackend, buf: &mut [AlignedPage], hold_engine_lock: bool| {
            // Ten two-page writes and reads: more than the queue depth of 4.
            let mut w: ArrayVec<WriteReq<'_>, 10> =
                (0..10).map(|i| WriteReq::new(i * 4, src.pages(i as usize * 4 * PAGE_SIZE, 2))).collect();
            let g = hold_engine_lock.then(|| engine_lock.lock());
            b.write(&mut w);
            drop(g);
            assert!(w.iter().all(|r| r.result.is_ok()));
            let mut r: ArrayVec<ReadReq<'_>, 10> =
                buf.chunks_mut(2).take(10).enumerate().map(|(i, c)| ReadReq::new(i as u64 * 4, c)).collect();
            let g = hold_engine_lock.then(|| engine_lock.lock());
            b.read(&mut r);
            drop(g);
            assert!(r.iter().all(|r| r.result.is_ok()));
            drop(r);
            // An out-of-range request fails without allocating either.
            let mut r = [ReadReq::new(b.nr_slots() - 1, &mut buf[..2])];
            b.read(&mut r);
            assert!(matches!(r[0].result, Err(BackendError::OutOfRange { .. })));
        };
        pass(&b, &mut buf, false);
        pass(&b, &mut buf, true);

        let go = Arc::new(Barrier::new(2));
        let holder = {
            let (b, go, held, release) = (b.clone(), go.clone(), held.clone(), release.clone());
            std::thread::spawn(move || {
                go.wait();
                let _g = b.rings[0].try_lock().expect("ring free");
                held.wait();
                while !release.load(Ordering::Acquire) {
                    std::thread::yield_now();
                }
            })
        };
        let before_stats = b.stats();
        let before = alloc_count::this_thread();
        pass(&b, &mut buf, false); // io_uring
        pass(&b, &mut buf, true); // engine lock held: syscalls
        go.wait(); // (Barrier::wait does not allocate)
        held.wait();
        pass(&b, &mut buf, false); // ring busy: syscalls
        let allocs = alloc_count::this_thread() - before;
        release.store(true, Ordering::Release);
        holder.join().unwrap();
        assert_eq!(allocs, 0, "the read/write paths allocated or freed {allocs} times");
        let st = b.stats();
        // (The out-of-range reads need no I/O and take neither route.)
        assert_eq!(st.ring_calls - before_stats.ring_calls, 2);
        assert_eq!(st.sync_calls - before_stats.sync_calls, 4);
        for (i, p) in buf.iter().take(20).enumerate() {
            let slot = (i / 2 * 4 + i % 2) as u64;
            assert!(p.0 == page_bytes(slot, 7), "slot {slot}");
        }
    }

    #[test]
    fn a_ring_the_kernel_refuses_is_given_up_and_the_call_still_succeeds() {
        let dir = TestDir::new("poison");
        let b = FileBackend::open(dir.path(), 2 * MIB, opts(4, 1)).unwrap();
        // Make the ring's descriptor number refer to /dev/null: io_uring_enter then fails
        // with an error that is neither EINTR nor EAGAIN, with the first round still queued.
        let null = fs::File::open("/dev/null").unwrap();
        {
            let ring = b.rings[0].try_lock().unwrap();
            // SAFETY: replaces the ring's descriptor number with /dev/null. The ring's
            // memory stays mapped (the mappings keep the io_uring alive) and the IoUring
            // closes the number on drop, which then closes /dev/null: nothing dangles.
            assert!(unsafe { libc::dup2(null.as_raw_fd(), ring.uring.as_raw_fd()) } >= 0);
        }
        let src = staging(b.nr_slots());
        let runs: Vec<(u64, u64)> = (0..10).map(|i| (i * 8, 1 + i % 3)).collect();
        let gens: Vec<u64> = (0..10).collect();
        write_runs(&b, &src, &runs, &gens); // 10 requests: rounds of 4, the first one refused
        let st = b.stats();
        assert_eq!((st.ring_calls, st.rings_poisoned), (1, 1));
        assert!(b.rings[0].try_lock().unwrap().poisoned);
        // The poisoned ring is never used again: later calls use the system calls.
        read_and_verify(&b, &runs, &gens);
        assert_eq!(b.stats().sync_calls, 1);
        assert_eq!(b.stats().ring_calls, 1);
    }

    #[test]
    fn empty_requests_succeed_without_io() {
        let dir = TestDir::new("empty");
        for rings in [1, 0] {
            let b = FileBackend::open(dir.path(), 2 * MIB, opts(4, rings)).unwrap();
            let src = staging(b.nr_slots());
            stage(&src, 7, 1, 3);
            let mut w = [WriteReq::new(5, src.pages(0, 0)), WriteReq::new(7, src.pages(7 * PAGE_SIZE, 1))];
            b.write(&mut w);
            assert!(w.iter().all(|r| r.result.is_ok()));
            let mut buf = zero_pages(1);
            // (ReadReq::new refuses an empty buffer in debug builds; the engine never makes one.)
            let mut r = [ReadReq { slot: 9, buf: &mut [], result: Ok(()) }, ReadReq::new(7, &mut buf)];
            b.read(&mut r);
            assert!(r.iter().all(|r| r.result.is_ok()));
            assert!(buf[0].0 == page_bytes(7, 3));
        }
    }

    fn blocks(path_or_fd: &OwnedFd) -> u64 {
        fstat(path_or_fd.as_raw_fd()).unwrap().st_blocks as u64
    }

    #[test]
    fn discard_punches_a_hole_that_reads_back_as_zero() {
        for preallocate in [true, false] {
            let dir = TestDir::new("discard");
            let b = FileBackend::open(dir.path(), 4 * MIB, FileOptions { preallocate, ..opts(8, 1) }).unwrap();
            let cluster = SWAPFILE_CLUSTER as u64;
            let src = staging(b.nr_slots());
            let runs: Vec<(u64, u64)> = (0..2 * cluster / 32).map(|i| (i * 32, 32)).collect();
            let gens = vec![5; runs.len()];
            write_runs(&b, &src, &runs, &gens);
            let full = blocks(&b.file);
            assert!(full >= 2 * CLUSTER_BYTES / 512, "written file holds {full} blocks of 512 bytes");
            b.discard(cluster, cluster);
            let after = blocks(&b.file);
            assert!(
                full - after >= CLUSTER_BYTES / 512,
                "discard of one cluster freed only {} blocks (preallocate {preallocate})",
                full - after
            );
            assert_eq!(fstat(b.file.as_raw_fd()).unwrap().st_size as u64, 4 * MIB, "the size is kept");
            let mut buf = zero_pages(cluster as usize);
            buf.iter_mut().for_each(|p| p.0.fill(0xAA));
            let mut r = [ReadReq::new(cluster, &mut buf)];
            b.read(&mut r);
            assert!(r[0].result.is_ok());
            assert!(buf.iter().all(|p| p.0.iter().all(|&x| x == 0)), "a discarded slot reads back zero");
            // The other cluster is untouched.
            read_and_verify(&b, &runs[..runs.len() / 2], &gens[..runs.len() / 2]);
            assert_eq!(b.discard_errors(), 0);
            b.discard(2 * cluster - 1, 2);
            b.discard(u64::MAX, 2);
            assert_eq!(b.discard_errors(), 2, "out-of-range discards are counted, not performed");
            assert_eq!(b.stats().discards, 3);
        }
    }

    fn assert_private_and_unlinked(fd: &OwnedFd, dir: &Path) {
        let st = fstat(fd.as_raw_fd()).unwrap();
        assert_eq!(st.st_mode & 0o7777, 0o600, "mode {:o}", st.st_mode & 0o7777);
        assert_eq!(st.st_mode & libc::S_IFMT, libc::S_IFREG);
        assert_eq!(st.st_nlink, 0, "the file has a name somewhere");
        assert_eq!(fs::read_dir(dir).unwrap().count(), 0, "the directory is not empty");
        let link = fs::read_link(format!("/proc/self/fd/{}", fd.as_raw_fd())).unwrap();
        assert!(link.to_string_lossy().ends_with(" (deleted)"), "/proc/self/fd shows {link:?}");
    }

    #[test]
    fn anonymous_files_are_0600_and_leave_no_directory_entry() {
        let dir = TestDir::new("anon");
        // A umask that would normally leave group and others some access.
        // SAFETY: umask only changes the process's file-creation mask.
        let old = unsafe { libc::umask(0o002) };
        let b = FileBackend::open(dir.path(), 2 * MIB, FileOptions::default());
        // SAFETY: as above.
        unsafe { libc::umask(old) };
        let b = b.unwrap();
        assert!(b.is_anonymous() && !b.is_block_device());
        assert_eq!(b.name(), format!("file:{}", dir.path().display()));
        assert_private_and_unlinked(&b.file, dir.path());
        // O_DIRECT is on.
        // SAFETY: F_GETFL takes no pointer.
        assert_ne!(unsafe { libc::fcntl(b.file.as_raw_fd(), libc::F_GETFL) } & libc::O_DIRECT, 0);
        drop(b);

        // The fallback for filesystems without O_TMPFILE: created 0600, unlinked at once.
        let fd = create_anonymous(dir.path(), false).unwrap();
        assert_private_and_unlinked(&fd, dir.path());
    }

    #[test]
    fn a_kept_file_is_emptied_on_drop_by_punching_or_by_writing_zeros() {
        let dir = TestDir::new("scrub");
        let path = dir.path().join("kept");
        write_private(&path, b"");
        let b = FileBackend::open(&path, 4 * MIB, opts(4, 1)).unwrap();
        let src = staging(b.nr_slots());
        // Slots in both clusters; none discarded.
        write_runs(&b, &src, &[(0, 3), (700, 5), (1023, 1)], &[1, 2, 3]);
        drop(b);
        let bytes = fs::read(&path).unwrap();
        assert_eq!(bytes.len() as u64, 4 * MIB, "the file keeps its size");
        assert!(bytes.iter().all(|&x| x == 0), "punched out on drop");
        assert!(fs::metadata(&path).unwrap().blocks() < 64, "and deallocated");

        // The fallback where holes cannot be punched: zeros over the whole range, not past it.
        fs::write(&path, vec![0xa5u8; 3 * MIB as usize]).unwrap();
        let f = fs::OpenOptions::new().write(true).custom_flags(libc::O_DIRECT).open(&path).unwrap();
        write_zeros(f.as_raw_fd(), 2 * MIB + PAGE_SIZE as u64).unwrap();
        let bytes = fs::read(&path).unwrap();
        let cut = 2 * MIB as usize + PAGE_SIZE;
        assert!(bytes[..cut].iter().all(|&x| x == 0), "zeroed");
        assert!(bytes[cut..].iter().all(|&x| x == 0xa5), "bytes past the device are left alone");
    }

    #[test]
    fn existing_files_are_extended_never_shrunk_and_locked() {
        let dir = TestDir::new("exist");
        let path = dir.path().join("swapfile");
        fs::write(&path, vec![1u8; MIB as usize]).unwrap();
        fs::set_permissions(&path, fs::Permissions::from_mode(0o640)).unwrap();
        let e = FileBackend::open(&path, 4 * MIB + 12345, opts(4, 1)).err().unwrap();
        assert!(matches!(e, FileDeviceError::OthersMayAccess { mode: 0o640, .. }), "{e}");
        assert_eq!(fs::metadata(&path).unwrap().len(), MIB, "a refused file is left as it was");
        fs::set_permissions(&path, fs::Permissions::from_mode(0o400 | 0o200)).unwrap();
        let b = FileBackend::open(&path, 4 * MIB + 12345, opts(4, 1)).unwrap();
        assert!(!b.is_anonymous());
        assert_eq!(b.nr_slots(), 2 * SWAPFILE_CLUSTER as u64, "capacity rounds down to whole clusters");
        let meta = fs::metadata(&path).unwrap();
        assert_eq!(meta.len(), 4 * MIB, "extended to the capacity");
        assert_eq!(meta.mode() & 0o777, 0o600, "an existing file keeps its mode");
        // A second device on the same file is refused while the first one lives.
        let e = FileBackend::open(&path, 2 * MIB, opts(4, 1)).err().unwrap();
        assert!(matches!(e, FileDeviceError::Busy { .. }), "{e}");
        assert!(e.to_string().contains(path.to_str().unwrap()), "{e}");
        let src = staging(b.nr_slots());
        write_runs(&b, &src, &[(0, 3), (1020, 4)], &[1, 2]);
        read_and_verify(&b, &[(0, 3), (1020, 4)], &[1, 2]);
        drop(b);

        // A longer file is used in part, never truncated.
        let big = dir.path().join("big");
        write_private(&big, &vec![0u8; 10 * MIB as usize]);
        let b = FileBackend::open(&big, 4 * MIB, FileOptions { preallocate: false, ..opts(4, 1) }).unwrap();
        assert_eq!(b.nr_slots(), 1024);
        assert_eq!(fs::metadata(&big).unwrap().len(), 10 * MIB);
        drop(b);
        // A short file without preallocation is extended sparse.
        let sparse = dir.path().join("sparse");
        write_private(&sparse, b"");
        let b = FileBackend::open(&sparse, 4 * MIB, FileOptions { preallocate: false, ..opts(4, 1) }).unwrap();
        let meta = fs::metadata(&sparse).unwrap();
        assert_eq!(meta.len(), 4 * MIB);
        assert!(meta.blocks() < 64, "{} blocks allocated", meta.blocks());
        drop(b);
    }

    #[test]
    fn a_closed_device_can_be_reopened_at_once() {
        let dir = TestDir::new("reopen");
        let path = dir.path().join("swapfile");
        write_private(&path, b"");
        for _ in 0..20 {
            let b = FileBackend::open(&path, 2 * MIB, opts(4, 2)).unwrap();
            let src = staging(b.nr_slots());
            write_runs(&b, &src, &[(1, 2)], &[1]);
        }
        let backing = dir.path().join("backing");
        fs::write(&backing, vec![0u8; 2 * MIB as usize]).unwrap();
        let Some(lo) = attach_loop(&backing) else {
            eprintln!("skipped the block device part: no loop device available here");
            return;
        };
        for _ in 0..20 {
            let b = FileBackend::open(&lo.path, 2 * MIB, opts(4, 2)).unwrap();
            let src = staging(b.nr_slots());
            write_runs(&b, &src, &[(1, 2)], &[1]);
        }
    }

    #[test]
    fn short_reads_are_continued_and_end_of_file_names_the_slot() {
        let dir = TestDir::new("short");
        let path = dir.path().join("swapfile");
        write_private(&path, b"");
        for rings in [1, 0] {
            let b = FileBackend::open(&path, 2 * MIB, FileOptions { preallocate: false, ..opts(4, rings) }).unwrap();
            let src = staging(b.nr_slots());
            write_runs(&b, &src, &[(500, 12)], &[9]);
            // Someone cuts the file short behind our back: 2 of the 4 pages of the last
            // request are past the end.
            fs::OpenOptions::new().write(true).open(&path).unwrap().set_len(510 * PAGE_SIZE as u64).unwrap();
            let mut buf = zero_pages(8);
            let (a, c) = buf.split_at_mut(4);
            let mut r = [ReadReq::new(500, a), ReadReq::new(508, c)];
            b.read(&mut r);
            assert!(r[0].result.is_ok());
            match &r[1].result {
                Err(BackendError::Io { slot: 510, source }) => {
                    assert_eq!(source.kind(), io::ErrorKind::UnexpectedEof)
                }
                other => panic!("expected an I/O error on slot 510, got {other:?}"),
            }
            assert!(b.stats().short_transfers >= 1);
            assert!(buf[..4].iter().enumerate().all(|(i, p)| p.0 == page_bytes(500 + i as u64, 9)));
            assert!(buf[4..6].iter().enumerate().all(|(i, p)| p.0 == page_bytes(508 + i as u64, 9)));
            drop(b);
            fs::OpenOptions::new().write(true).open(&path).unwrap().set_len(0).unwrap();
        }
    }

    fn open_err(path: &Path, capacity: u64, options: FileOptions) -> FileDeviceError {
        let e = FileBackend::open(path, capacity, options).err().expect("open should fail");
        let msg = e.to_string();
        assert!(msg.contains(&*path.to_string_lossy()), "message does not name the path: {msg}");
        e
    }

    #[test]
    fn open_errors_name_the_path_and_say_what_to_do() {
        let dir = TestDir::new("err");
        let missing = dir.path().join("no/such/dir");
        let e = open_err(&missing, 4 * MIB, FileOptions::default());
        assert!(matches!(e, FileDeviceError::NotFound { .. }), "{e}");
        assert!(e.to_string().contains("give an existing directory"), "{e}");

        let e = open_err(dir.path(), MIB, FileOptions::default());
        assert!(
            matches!(e, FileDeviceError::TooSmall { capacity_bytes, min_bytes, .. }
            if capacity_bytes == MIB && min_bytes == CLUSTER_BYTES),
            "{e}"
        );
        assert!(e.to_string().contains("give it at least 2097152 bytes"), "{e}");

        let e = open_err(Path::new("/dev/null"), 4 * MIB, FileOptions::default());
        assert!(matches!(e, FileDeviceError::UnsupportedFileType { kind: "a character device", .. }), "{e}");

        let e = open_err(dir.path(), 4 * MIB, opts(0, 1));
        assert!(matches!(e, FileDeviceError::BadQueueDepth { .. }), "{e}");
        let e = open_err(dir.path(), 4 * MIB, opts(MAX_QUEUE_DEPTH + 1, 1));
        assert!(matches!(e, FileDeviceError::BadQueueDepth { .. }), "{e}");
        assert_eq!(fs::read_dir(dir.path()).unwrap().count(), 0, "a failed open leaves nothing behind");
    }

    /// Runs `f` on a thread whose filesystem uid is `nobody` (root's file capabilities
    /// dropped with it). `None` if that is not possible (not root).
    fn as_nobody<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> Option<T> {
        std::thread::spawn(move || {
            // SAFETY: setfsuid is a per-thread system call (glibc does not broadcast it);
            // this thread ends right after `f`.
            unsafe { libc::setfsuid(65534) };
            // SAFETY: -1 is an invalid uid: the call only reports the current fsuid.
            (unsafe { libc::setfsuid(u32::MAX) } == 65534).then(f)
        })
        .join()
        .unwrap()
    }

    #[test]
    fn permission_denied_names_the_path() {
        let dir = TestDir::new("perm");
        fs::set_permissions(dir.path(), fs::Permissions::from_mode(0o755)).unwrap();
        let file = dir.path().join("root-only");
        fs::write(&file, b"").unwrap();
        fs::set_permissions(&file, fs::Permissions::from_mode(0o600)).unwrap();
        let (d, f) = (dir.path().to_owned(), file.clone());
        // SAFETY: getuid has no memory effects.
        let root = unsafe { libc::getuid() } == 0;
        let errs = as_nobody(move || {
            let precondition = fs::File::open(&f).map_err(|e| e.kind());
            (
                precondition,
                FileBackend::open(&d, 4 * MIB, opts(4, 1)).err(),
                FileBackend::open(&f, 4 * MIB, opts(4, 1)).err(),
            )
        });
        let Some((Err(io::ErrorKind::PermissionDenied), dir_err, file_err)) = errs else {
            assert!(!root, "as root, dropping to fsuid nobody should deny access");
            eprintln!("skipped: cannot drop privileges here (not root)");
            return;
        };
        for (e, path) in [(dir_err.unwrap(), dir.path()), (file_err.unwrap(), file.as_path())] {
            assert!(matches!(e, FileDeviceError::PermissionDenied { .. }), "{e}");
            assert!(e.to_string().contains(path.to_str().unwrap()), "{e}");
        }
        assert_eq!(fs::read_dir(dir.path()).unwrap().count(), 1, "nothing created");
    }

    #[test]
    fn filesystems_without_direct_io_are_refused_with_advice() {
        // ramfs has no O_DIRECT (tmpfs has it since Linux 6.6). Mount one in a private mount
        // namespace of a helper thread, so that nothing is visible outside it and the mount
        // goes away with the thread.
        let dir = TestDir::new("ramfs");
        let d = dir.path().to_owned();
        let r = std::thread::spawn(move || {
            let cdir = CString::new(d.as_os_str().as_bytes()).unwrap();
            // SAFETY: unshare and mount take NUL-terminated strings that outlive the calls;
            // the namespace is private to this thread (CLONE_NEWNS implies CLONE_FS).
            unsafe {
                if libc::unshare(libc::CLONE_NEWNS) != 0 {
                    return None;
                }
                let root = c"/";
                if libc::mount(
                    std::ptr::null(),
                    root.as_ptr(),
                    std::ptr::null(),
                    libc::MS_REC | libc::MS_PRIVATE,
                    std::ptr::null(),
                ) != 0
                {
                    return None;
                }
                if libc::mount(c"none".as_ptr(), cdir.as_ptr(), c"ramfs".as_ptr(), 0, std::ptr::null()) != 0 {
                    return None;
                }
            }
            let in_dir = open_err(&d, 4 * MIB, FileOptions::default());
            let file = d.join("swapfile");
            fs::write(&file, b"").unwrap();
            let on_file = open_err(&file, 4 * MIB, FileOptions { preallocate: false, ..FileOptions::default() });
            Some((in_dir, on_file))
        })
        .join()
        .unwrap();
        let Some((in_dir, on_file)) = r else {
            eprintln!("skipped: cannot mount a ramfs in a private namespace here");
            return;
        };
        for e in [in_dir, on_file] {
            assert!(matches!(e, FileDeviceError::DirectIoUnsupported { .. }), "{e}");
            assert!(e.to_string().contains("ext4"), "{e}");
        }
    }

    /// A loop device over a file of `len` bytes, detached automatically when its last
    /// descriptor closes (LO_FLAGS_AUTOCLEAR), so that a crashed test leaks nothing.
    struct Loop {
        _fd: fs::File,
        path: PathBuf,
    }

    #[repr(C)]
    struct LoopInfo64 {
        device: u64,
        inode: u64,
        rdevice: u64,
        offset: u64,
        sizelimit: u64,
        number: u32,
        encrypt_type: u32,
        encrypt_key_size: u32,
        flags: u32,
        file_name: [u8; 64],
        crypt_name: [u8; 64],
        encrypt_key: [u8; 32],
        init: [u64; 2],
    }

    #[repr(C)]
    struct LoopConfig {
        fd: u32,
        block_size: u32,
        info: LoopInfo64,
        reserved: [u64; 8],
    }

    const LOOP_CTL_GET_FREE: libc::c_ulong = 0x4C82;
    const LOOP_CONFIGURE: libc::c_ulong = 0x4C0A;
    const LO_FLAGS_AUTOCLEAR: u32 = 4;

    fn attach_loop(backing: &Path) -> Option<Loop> {
        let ctl = fs::File::open("/dev/loop-control").ok()?;
        let file = fs::OpenOptions::new().read(true).write(true).open(backing).ok()?;
        for _ in 0..10 {
            // SAFETY: LOOP_CTL_GET_FREE takes no argument and returns a device number.
            let n = unsafe { libc::ioctl(ctl.as_raw_fd(), LOOP_CTL_GET_FREE) };
            if n < 0 {
                return None;
            }
            let path = PathBuf::from(format!("/dev/loop{n}"));
            let dev = fs::OpenOptions::new().read(true).write(true).open(&path).ok()?;
            // SAFETY: plain data, all zeroes is a valid value.
            let mut cfg: LoopConfig = unsafe { std::mem::zeroed() };
            cfg.fd = file.as_raw_fd() as u32;
            cfg.info.flags = LO_FLAGS_AUTOCLEAR;
            // SAFETY: LOOP_CONFIGURE reads one loop_config, which `cfg` is (same layout).
            if unsafe { libc::ioctl(dev.as_raw_fd(), LOOP_CONFIGURE, &cfg as *const LoopConfig) } == 0 {
                return Some(Loop { _fd: dev, path });
            }
            // EBUSY: someone else took it in between; try the next free one.
        }
        None
    }

    #[test]
    fn block_device_round_trip_size_check_and_discard() {
        let dir = TestDir::new("blk");
        let backing = dir.path().join("backing");
        fs::write(&backing, b"").unwrap();
        fs::OpenOptions::new().write(true).open(&backing).unwrap().set_len(4 * MIB).unwrap();
        let Some(lo) = attach_loop(&backing) else {
            eprintln!("skipped: no loop device available here (needs root and /dev/loop-control)");
            return;
        };
        let e = open_err(&lo.path, 8 * MIB, FileOptions::default());
        assert!(
            matches!(e, FileDeviceError::LargerThanDevice { capacity_bytes, device_bytes, .. }
                if capacity_bytes == 8 * MIB && device_bytes == 4 * MIB),
            "{e}"
        );
        assert!(e.to_string().contains("give at most 4194304 bytes"), "{e}");
        let b = FileBackend::open(&lo.path, 4 * MIB, opts(8, 1)).unwrap();
        assert!(b.is_block_device());
        assert_eq!(b.nr_slots(), 1024);
        // Opened exclusively: a second device on it is refused.
        let e = open_err(&lo.path, 4 * MIB, FileOptions::default());
        assert!(matches!(e, FileDeviceError::Busy { .. }), "{e}");
        let src = staging(b.nr_slots());
        let runs: Vec<(u64, u64)> = (0..32).map(|i| (i * 32, 32)).collect();
        let gens: Vec<u64> = (0..32).collect();
        write_runs(&b, &src, &runs, &gens);
        read_and_verify(&b, &runs, &gens);
        b.discard(512, 512);
        assert_eq!(b.discard_errors(), 0, "BLKDISCARD on a loop device");
        read_and_verify(&b, &runs[..16], &gens[..16]);
    }

    /// Rough throughput figures (not a test): `cargo test --release -p uswap -- --ignored
    /// --nocapture bench_file_backend`.
    #[test]
    #[ignore]
    fn bench_file_backend() {
        let dir = TestDir::new("bench");
        let capacity = 64 * MIB;
        for rings in [1, 0] {
            let b = FileBackend::open(dir.path(), capacity, opts(64, rings)).unwrap();
            let nr = b.nr_slots();
            let src = staging(nr);
            let label = if rings > 0 { "io_uring qd 64" } else { "pread/pwrite  " };
            // Write everything once, so that later writes overwrite allocated, written blocks.
            // This first pass writes into preallocated (unwritten) extents, as a write after
            // a discard does: ext4 converts them at completion.
            let all: Vec<(u64, u64)> = (0..nr / 32).map(|i| (i * 32, 32)).collect();
            let t = std::time::Instant::now();
            for c in all.chunks(64) {
                write_runs(&b, &src, c, &vec![0; c.len()]);
            }
            println!(
                "{label} {:<38} {:>9.0} pages/s",
                "first write: 64 x 32 pages (unwritten)",
                nr as f64 / t.elapsed().as_secs_f64()
            );
            let mut rng = Rng(42);
            let secs = 0.7;
            let run = |what: &str, pages_per_call: u64, f: &mut dyn FnMut()| {
                let t = std::time::Instant::now();
                let mut calls = 0u64;
                while t.elapsed().as_secs_f64() < secs {
                    f();
                    calls += 1;
                }
                let el = t.elapsed().as_secs_f64();
                println!(
                    "{label} {what:<38} {:>9.0} pages/s  ({:.1} us per call)",
                    (calls * pages_per_call) as f64 / el,
                    el * 1e6 / calls as f64
                );
            };
            run("write: 1 request of 32 pages", 32, &mut || {
                let s = rng.below(nr / 32) * 32;
                let mut w = [WriteReq::new(s, src.pages(s as usize * PAGE_SIZE, 32))];
                b.write(&mut w);
                assert!(w[0].result.is_ok());
            });
            run("write: 32 requests of 1 page (random)", 32, &mut || {
                let mut w: ArrayVec<WriteReq<'_>, 32> = (0..32)
                    .map(|_| {
                        let s = rng.below(nr);
                        WriteReq::new(s, src.pages(s as usize * PAGE_SIZE, 1))
                    })
                    .collect();
                // (Random slots may repeat within a batch; harmless for a benchmark.)
                b.write(&mut w);
            });
            let mut buf = zero_pages(32);
            run("read: 1 page (random)", 1, &mut || {
                let mut r = [ReadReq::new(rng.below(nr), &mut buf[..1])];
                b.read(&mut r);
                assert!(r[0].result.is_ok());
            });
            run("read: 32 requests of 1 page (random)", 32, &mut || {
                let mut r: ArrayVec<ReadReq<'_>, 32> =
                    buf.chunks_mut(1).map(|c| ReadReq::new(rng.below(nr), c)).collect();
                b.read(&mut r);
            });
            run("read: 1 request of 32 pages", 32, &mut || {
                let mut r = [ReadReq::new(rng.below(nr / 32) * 32, &mut buf[..])];
                b.read(&mut r);
                assert!(r[0].result.is_ok());
            });
        }
    }
}
