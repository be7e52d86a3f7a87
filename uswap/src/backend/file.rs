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
//!   `capacity` bytes are used and the rest is left alone. Its owner and mode are the user's
//!   business: swapped memory lands in it, readable by whoever may read the file. It is
//!   locked (`flock(LOCK_EX)`) so that two devices cannot share it.
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

use super::{Backend, BackendError, ReadReq, WriteReq};
use crate::mapping::{current_cpu, nr_cpus_configured};
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
}

impl Default for FileOptions {
    fn default() -> Self {
        FileOptions { queue_depth: 64, rings: nr_cpus_configured().clamp(1, 16), preallocate: true }
    }
}

/// Why a file device could not be opened. Every message names the path and says what to do.
#[derive(Debug, Error)]
pub enum FileDeviceError {
    #[error(
        "swap device {}: no such file or directory; give an existing directory (uswap creates \
         an anonymous swap file in it), an existing regular file, or a block device",
        .path.display()
    )]
    NotFound { path: PathBuf },

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

        let meta = fs::metadata(path).map_err(|e| open_error(path, "stat", e))?;
        let ft = meta.file_type();
        let (file, kind, anonymous) = if ft.is_dir() {
            let fd = create_anonymous(path, true)?;
            // Exactly 0600 whatever the umask (which can only have removed bits).
            // SAFETY: plain system call on an open descriptor.
            if unsafe { libc::fchmod(fd.as_raw_fd(), 0o600) } != 0 {
                return Err(open_error(path, "fchmod of the swap file", io::Error::last_os_error()));
            }
            set_direct(fd.as_raw_fd(), path)?;
            size_file(fd.as_raw_fd(), path, len, options.preallocate)?;
            (fd, Kind::File, true)
        } else if ft.is_file() {
            let cpath = cstring(path)?;
            let fd = sys_open(&cpath, libc::O_RDWR | libc::O_DIRECT, 0).map_err(|e| match e.raw_os_error() {
                Some(libc::EINVAL) => FileDeviceError::DirectIoUnsupported { path: path.to_owned(), source: e },
                _ => open_error(path, "opening the swap file", e),
            })?;
            // SAFETY: plain system call on an open descriptor.
            if unsafe { libc::flock(fd.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } != 0 {
                let e = io::Error::last_os_error();
                return Err(match e.raw_os_error() {
                    Some(libc::EWOULDBLOCK) => FileDeviceError::Busy { path: path.to_owned() },
                    _ => FileDeviceError::Io { path: path.to_owned(), what: "locking the swap file", source: e },
                });
            }
            size_file(fd.as_raw_fd(), path, len, options.preallocate)?;
            (fd, Kind::File, false)
        } else if ft.is_block_device() {
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
            let kind = if ft.is_char_device() {
                "a character device"
            } else if ft.is_fifo() {
                "a FIFO"
            } else if ft.is_socket() {
                "a socket"
            } else {
                "an unknown kind of file"
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
        while unsubmitted > 0 || outstanding > 0 {
            let want = (unsubmitted + outstanding) as u32;
            // SAFETY: no signal mask argument (a null pointer of size 0); the queued entries
            // are valid (see `run_ring`).
            let r = unsafe {
                ring.uring.submitter().enter::<libc::sigset_t>(
                    unsubmitted as u32,
                    want,
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
            stalls = if progress { 0 } else { stalls + 1 };
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
            // SAFETY: plain system call on our open descriptor.
            unsafe { libc::flock(self.file.as_raw_fd(), libc::LOCK_UN) };
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
