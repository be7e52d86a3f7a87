//! Opening the file device and sizing it.
//!
//! # Job
//!
//! [`open_device`] (which [`FileBackend::open`] calls) takes a directory, a regular file (existing, or created) or a block
//! device:
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
//! This module opens, checks, sizes and probes the file; it returns an [`Opened`] file, on
//! which `FileBackend::open` (`mod.rs`) sets up the rings (`ring.rs`). It imports only the
//! folder's error type (`error.rs`).
//!
//! # Locking rules
//!
//! Opening takes no lock: the device is not shared until `open` returns it. Everything the
//! ring path needs (the rings, per-ring bookkeeping of in-flight operations) is allocated
//! at open, so that reads and writes allocate nothing.
//!
//! # Invariants
//!
//! * A swap file uswap creates is mode 0600 and has no name in the filesystem.
//! * An existing file is never shrunk or truncated; a block device is never resized and
//!   never used past its end.
//! * The capacity is whole clusters, at least one.
//!
//! [`FileBackend::open`]: super::FileBackend::open

use std::ffi::CString;
use std::fs;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::FileTypeExt;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};

use super::error::FileDeviceError;
use crate::backend::{AlignedPage, SWAPFILE_CLUSTER};
use crate::mapping::nr_cpus_configured;
use crate::uffd::PAGE_SIZE;

/// Bytes in one cluster: the smallest capacity, and the unit capacities are rounded down to.
pub const CLUSTER_BYTES: u64 = (SWAPFILE_CLUSTER * PAGE_SIZE) as u64;
/// Largest accepted queue depth.
pub const MAX_QUEUE_DEPTH: u32 = 4096;

// Block-device ioctls (linux/fs.h), absent from the libc crate.
const BLKGETSIZE64: libc::c_ulong = 0x8008_1272; // _IOR(0x12, 114, u64)
const BLKSSZGET: libc::c_ulong = 0x1268; // _IO(0x12, 104)
pub(super) const BLKDISCARD: libc::c_ulong = 0x1277; // _IO(0x12, 119)

/// What the device is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Kind {
    File,
    BlockDevice,
}

/// A device opened, checked, sized and probed: what [`open_device`] hands the backend.
pub(super) struct Opened {
    /// The device, open read-write with `O_DIRECT`.
    pub(super) file: OwnedFd,
    pub(super) kind: Kind,
    /// uswap created the (unlinked) file itself.
    pub(super) anonymous: bool,
    /// The capacity in slots (whole clusters).
    pub(super) nr_slots: u64,
}

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
    // Bounded: only EINTR repeats, and each one is a signal delivered to this thread.
    loop {
        // SAFETY: `path` is a NUL-terminated string that outlives the call; open has no other
        // memory effects.
        let fd = unsafe { libc::open(path.as_ptr(), flags | libc::O_CLOEXEC, mode as libc::c_uint) };
        if fd >= 0 {
            // SAFETY: a fresh descriptor that nothing else owns.
            return Ok(crate::fd::relocate(unsafe { OwnedFd::from_raw_fd(fd) }));
        }
        let e = io::Error::last_os_error();
        if e.raw_os_error() != Some(libc::EINTR) {
            return Err(e);
        }
    }
}

pub(super) fn fstat(fd: RawFd) -> io::Result<libc::stat> {
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
            crate::clock::now_ns()
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
            // `dir` was just found to be a directory: ENOENT here is its filesystem refusing
            // new names (procfs, for root), not a missing path.
            Err(e) if e.raw_os_error() == Some(libc::ENOENT) => {
                return Err(FileDeviceError::CannotCreateIn { path: dir.to_owned(), source: e })
            }
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
        // Bounded: only EINTR repeats, and each one is a signal delivered to this thread.
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
        let mut size_bytes = 0;
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
            size_bytes = st.st_size;
        }
        lock_exclusive(fd.as_raw_fd(), path)?;
        // Locked first: a file another pager holds is busy, not a file with data in it.
        if !create {
            refuse_if_holds_data(fd.as_raw_fd(), size_bytes, path)?;
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

/// Locks the swap file against a second user (`flock`, exclusive, without waiting).
fn lock_exclusive(fd: RawFd, path: &Path) -> Result<(), FileDeviceError> {
    // SAFETY: plain system call on an open descriptor.
    if unsafe { libc::flock(fd, libc::LOCK_EX | libc::LOCK_NB) } != 0 {
        let e = io::Error::last_os_error();
        return Err(match e.raw_os_error() {
            Some(libc::EWOULDBLOCK) => FileDeviceError::Busy { path: path.to_owned() },
            _ => FileDeviceError::Io { path: path.to_owned(), what: "locking the swap file", source: e },
        });
    }
    Ok(())
}

/// Pages of an existing file [`refuse_if_holds_data`] reads at most, in each of two ways.
const DATA_SAMPLES: usize = 16;

/// Refuses an existing file that holds data someone may want: a byte that is not zero in
/// the first page of one of its first [`DATA_SAMPLES`] data extents (`SEEK_DATA`), or in one
/// of as many pages spread over its length. uswap leaves its own files empty (holes, or
/// zeros where the filesystem cannot punch them, see `FileBackend::scrub`), so a file that
/// holds anything else is not one of them: `file:PATH` with a typo in PATH wiped a key file.
/// A sample, not a proof: bounded to `2 * DATA_SAMPLES` reads whatever the file's size.
fn refuse_if_holds_data(fd: RawFd, size_bytes: i64, path: &Path) -> Result<(), FileDeviceError> {
    let page = PAGE_SIZE as i64;
    let mut buf = Box::new(AlignedPage([0; PAGE_SIZE]));
    let mut nonzero_at = |at: i64| -> io::Result<bool> {
        // SAFETY: the buffer is one owned, page-aligned page; `at` is page-aligned (O_DIRECT).
        let n = unsafe { libc::pread(fd, buf.0.as_mut_ptr().cast(), PAGE_SIZE, at & !(page - 1)) };
        if n < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(buf.0[..n as usize].iter().any(|&b| b != 0))
    };
    let mut sample = || -> io::Result<bool> {
        let mut pos = 0;
        for _ in 0..DATA_SAMPLES {
            // SAFETY: lseek on our open descriptor; moves only its offset, which pread ignores.
            let data = unsafe { libc::lseek(fd, pos, libc::SEEK_DATA) };
            if data < 0 {
                break; // ENXIO: no data past `pos`; EINVAL: no SEEK_DATA here (the spread below)
            }
            if nonzero_at(data)? {
                return Ok(true);
            }
            // SAFETY: as above.
            pos = unsafe { libc::lseek(fd, data, libc::SEEK_HOLE) }.max(data + page);
        }
        for i in 0..DATA_SAMPLES as i64 {
            let at = size_bytes / DATA_SAMPLES as i64 * i;
            if at < size_bytes && nonzero_at(at)? {
                return Ok(true);
            }
        }
        Ok(false)
    };
    match sample() {
        Ok(false) => Ok(()),
        Ok(true) => Err(FileDeviceError::HoldsData { path: path.to_owned() }),
        Err(e) => Err(FileDeviceError::Io {
            path: path.to_owned(),
            what: "reading the file to see that it is empty",
            source: e,
        }),
    }
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

/// Opens the block device at `path` exclusively, and checks that it holds `capacity_bytes`
/// and that its logical blocks divide a page.
fn open_block_device(path: &Path, capacity_bytes: u64) -> Result<OwnedFd, FileDeviceError> {
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
    Ok(fd)
}

/// Opens (or, for a directory, creates) a swap device of `capacity_bytes` (rounded down to
/// whole 2 MiB clusters) at `path`: a directory, an existing regular file, or a block
/// device, checked, sized and probed with one direct read. See the module documentation for
/// what happens to each.
pub(super) fn open_device(path: &Path, capacity_bytes: u64, options: &FileOptions) -> Result<Opened, FileDeviceError> {
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
        // Created below, if its directory exists (docs/devices.md promises a 0600 file).
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
        (open_block_device(path, capacity_bytes)?, Kind::BlockDevice, false)
    } else {
        return Err(unsupported_file_type(path, ft));
    };

    // Probe: one direct read of slot 0, so that a filesystem that accepts O_DIRECT at open
    // but not 4096-byte direct I/O fails here rather than on the first swap-in.
    let mut probe = Box::new(AlignedPage([0; PAGE_SIZE]));
    // SAFETY: the buffer is one owned, page-aligned page, valid for PAGE_SIZE bytes.
    let r = unsafe { libc::pread(file.as_raw_fd(), probe.0.as_mut_ptr().cast(), PAGE_SIZE, 0) };
    if r < 0 {
        let e = io::Error::last_os_error();
        return Err(match e.raw_os_error() {
            Some(libc::EINVAL) => FileDeviceError::DirectIoUnsupported { path: path.to_owned(), source: e },
            _ => FileDeviceError::Io { path: path.to_owned(), what: "probe read with O_DIRECT", source: e },
        });
    }

    Ok(Opened { file, kind, anonymous, nr_slots })
}

/// Checks that a device could be opened at `path`, without sizing, locking or leaving
/// anything: a directory (or the existing directory of a path to create) takes an anonymous
/// direct-I/O file, an existing file opens for direct reads and writes, a block device
/// opens exclusively (read-only) and must be writable by this user, and
/// a file others may access is refused as [`open_device`] would. `uswap run` checks its
/// devices with this before the program runs: its pagers start later, in every process that
/// needs one, where a typo in the path would fail the run after the program's work.
pub fn check_path(path: &Path) -> Result<(), FileDeviceError> {
    let ft = match fs::metadata(path) {
        Ok(meta) => Some(meta.file_type()),
        Err(e) if e.kind() == io::ErrorKind::NotFound => None,
        Err(e) => return Err(open_error(path, "stat", e)),
    };
    let direct_file_in = |dir: &Path| -> Result<(), FileDeviceError> {
        let fd = create_anonymous(dir, true)?;
        set_direct(fd.as_raw_fd(), path)
    };
    match ft {
        Some(ft) if ft.is_dir() => direct_file_in(path),
        None => {
            // A link to nothing: the pager's create (`O_EXCL|O_NOFOLLOW`) would fail with
            // `EEXIST` once the program ran; said here, before anything starts.
            if let Ok(target) = fs::read_link(path) {
                return Err(FileDeviceError::DanglingLink { path: path.to_owned(), target });
            }
            let dir = match path.parent() {
                Some(d) if !d.as_os_str().is_empty() => d,
                _ => Path::new("."),
            };
            if !fs::metadata(dir).is_ok_and(|m| m.is_dir()) {
                return Err(FileDeviceError::NotFound { path: path.to_owned() });
            }
            direct_file_in(dir)
        }
        Some(ft) if ft.is_file() => {
            let fd =
                sys_open(&cstring(path)?, libc::O_RDWR | libc::O_DIRECT, 0).map_err(|e| match e.raw_os_error() {
                    Some(libc::EINVAL) => FileDeviceError::DirectIoUnsupported { path: path.to_owned(), source: e },
                    _ => open_error(path, "opening the swap file", e),
                })?;
            let st = fstat(fd.as_raw_fd()).map_err(|e| open_error(path, "fstat", e))?;
            let mode = st.st_mode & 0o7777;
            if mode & 0o066 != 0 {
                return Err(FileDeviceError::OthersMayAccess { path: path.to_owned(), mode });
            }
            // A file a running pager holds is busy (its data is that pager's); the lock goes
            // with the descriptor when this returns.
            lock_exclusive(fd.as_raw_fd(), path)?;
            refuse_if_holds_data(fd.as_raw_fd(), st.st_size, path)
        }
        Some(ft) if ft.is_block_device() => {
            // Read-only: closing a block device opened for writing makes udev rescan it, which
            // holds it for a moment and would make the first pager's exclusive open fail.
            let cpath = cstring(path)?;
            sys_open(&cpath, libc::O_RDONLY | libc::O_EXCL, 0)
                .map_err(|e| open_error(path, "opening the block device", e))?;
            // SAFETY: access(2) reads the NUL-terminated path it is given.
            if unsafe { libc::access(cpath.as_ptr(), libc::R_OK | libc::W_OK) } != 0 {
                let e = io::Error::last_os_error();
                return Err(open_error(path, "checking write access to the block device", e));
            }
            Ok(())
        }
        Some(_) => Err(unsupported_file_type(path, ft)),
    }
}

/// The error for a path that is none of a directory, a regular file or a block device.
fn unsupported_file_type(path: &Path, ft: Option<fs::FileType>) -> FileDeviceError {
    let kind = match ft {
        Some(ft) if ft.is_char_device() => "a character device",
        Some(ft) if ft.is_fifo() => "a FIFO",
        Some(ft) if ft.is_socket() => "a socket",
        _ => "an unknown kind of file",
    };
    FileDeviceError::UnsupportedFileType { path: path.to_owned(), kind }
}

#[cfg(test)]
mod tests {
    use super::super::tests::{open_err, opts, read_and_verify, staging, write_private, write_runs, TestDir, MIB};
    use super::*;
    use crate::backend::file::FileBackend;
    use crate::backend::Backend;
    use std::os::unix::fs::{MetadataExt, PermissionsExt};

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
    fn existing_files_are_extended_never_shrunk_and_locked() {
        let dir = TestDir::new("exist");
        let path = dir.path().join("swapfile");
        fs::write(&path, vec![1u8; MIB as usize]).unwrap();
        fs::set_permissions(&path, fs::Permissions::from_mode(0o640)).unwrap();
        let e = FileBackend::open(&path, 4 * MIB + 12345, opts(4, 1)).err().unwrap();
        assert!(matches!(e, FileDeviceError::OthersMayAccess { mode: 0o640, .. }), "{e}");
        assert_eq!(fs::metadata(&path).unwrap().len(), MIB, "a refused file is left as it was");
        fs::set_permissions(&path, fs::Permissions::from_mode(0o400 | 0o200)).unwrap();
        // Private, but it holds data: refused, and left as it was.
        let e = FileBackend::open(&path, 4 * MIB + 12345, opts(4, 1)).err().unwrap();
        assert!(matches!(e, FileDeviceError::HoldsData { .. }), "{e}");
        assert_eq!(fs::read(&path).unwrap(), vec![1u8; MIB as usize], "a refused file is left as it was");
        // Zeros (as uswap leaves a file where it cannot punch holes) are taken.
        fs::write(&path, vec![0u8; MIB as usize]).unwrap();
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
        // Holding the first device's pages, it is still busy, not a file with data in it
        // (whose message would tell the user to empty it under a live pager).
        let e = FileBackend::open(&path, 2 * MIB, opts(4, 1)).err().unwrap();
        assert!(matches!(e, FileDeviceError::Busy { .. }), "{e}");
        assert!(matches!(check_path(&path), Err(FileDeviceError::Busy { .. })));
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

    /// `check_path` says what `open_device` would refuse, and leaves nothing behind: no file
    /// in a directory, no file at a path to create, an existing file as it was.
    #[test]
    fn checked_paths_are_left_as_they_were() {
        let dir = TestDir::new("check");
        check_path(dir.path()).unwrap();
        let new = dir.path().join("swapfile");
        check_path(&new).unwrap();
        assert_eq!(fs::read_dir(dir.path()).unwrap().count(), 0, "the check left a file");
        write_private(&new, &[7u8; 4096]);
        let e = check_path(&new).unwrap_err();
        assert!(matches!(e, FileDeviceError::HoldsData { .. }), "{e}");
        assert_eq!(fs::read(&new).unwrap(), vec![7u8; 4096], "an existing file changed");
        // Data past a long hole is found too: the file's extents are sampled, not its start.
        let holey = dir.path().join("holey");
        write_private(&holey, b"");
        let f = fs::OpenOptions::new().write(true).open(&holey).unwrap();
        std::os::unix::fs::FileExt::write_at(&f, b"secret", 64 * MIB).unwrap();
        drop(f);
        let e = check_path(&holey).unwrap_err();
        assert!(matches!(e, FileDeviceError::HoldsData { .. }), "{e}");
        write_private(&new, &[0u8; 4096]);
        check_path(&new).unwrap();
        fs::set_permissions(&new, fs::Permissions::from_mode(0o644)).unwrap();
        let e = check_path(&new).unwrap_err();
        assert!(matches!(e, FileDeviceError::OthersMayAccess { mode: 0o644, .. }), "{e}");
        let e = check_path(&dir.path().join("no/such")).unwrap_err();
        assert!(matches!(e, FileDeviceError::NotFound { .. }), "{e}");
        let link = dir.path().join("link");
        std::os::unix::fs::symlink(dir.path().join("nothing"), &link).unwrap();
        let e = check_path(&link).unwrap_err();
        assert!(matches!(e, FileDeviceError::DanglingLink { .. }) && e.to_string().contains("nothing"), "{e}");
        let e = check_path(Path::new("/dev/null")).unwrap_err();
        assert!(matches!(e, FileDeviceError::UnsupportedFileType { kind: "a character device", .. }), "{e}");
    }

    #[test]
    fn open_errors_name_the_path_and_say_what_to_do() {
        let dir = TestDir::new("err");
        let missing = dir.path().join("no/such/dir");
        let e = open_err(&missing, 4 * MIB, FileOptions::default());
        assert!(matches!(e, FileDeviceError::NotFound { .. }), "{e}");
        assert!(e.to_string().contains("give an existing directory"), "{e}");
        // A directory whose filesystem creates no file is not "missing": procfs answers root
        // ENOENT, and another user EACCES (it may not write the directory).
        let e = open_err(Path::new("/proc"), 4 * MIB, FileOptions::default());
        // SAFETY: geteuid only reads the process's credentials.
        if unsafe { libc::geteuid() } == 0 {
            assert!(matches!(e, FileDeviceError::CannotCreateIn { .. }), "{e}");
            assert!(e.to_string().contains("disk filesystem"), "{e}");
        } else {
            assert!(matches!(e, FileDeviceError::PermissionDenied { .. }), "{e}");
        }

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
            uswap_testkit::skipped("cannot drop privileges here (not root)");
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
            uswap_testkit::skipped("cannot mount a ramfs in a private namespace here");
            return;
        };
        for e in [in_dir, on_file] {
            assert!(matches!(e, FileDeviceError::DirectIoUnsupported { .. }), "{e}");
            assert!(e.to_string().contains("ext4"), "{e}");
        }
    }
}
