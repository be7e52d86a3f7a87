//! Why a file device could not be opened: [`FileDeviceError`], one variant per cause, each
//! message naming the path and saying what to do.
//!
//! A leaf of the folder: opening (`open.rs`) builds these errors and this module imports
//! nothing of its siblings'. Locking: none (plain values).

use std::io;
use std::path::PathBuf;

use thiserror::Error;

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
        "swap device {}: a symbolic link to nothing ({}); uswap does not create a swap file through a link: \
         give the path it should have, or a directory",
        .path.display(), .target.display()
    )]
    DanglingLink { path: PathBuf, target: PathBuf },

    #[error(
        "swap device {}: the directory exists, but its filesystem creates no file in it (it \
         answered \"{source}\", as a pseudo-filesystem such as /proc does); give a \
         directory on a disk filesystem such as ext4, xfs or btrfs (e.g. /var/tmp)",
        .path.display()
    )]
    CannotCreateIn { path: PathBuf, source: io::Error },

    #[error(
        "swap device {}: mode {mode:04o} lets other users read or write the swapped-out memory \
         it would hold; run `chmod 600 {}`, or give a directory (uswap creates a private \
         anonymous swap file in it)",
        .path.display(), .path.display()
    )]
    OthersMayAccess { path: PathBuf, mode: u32 },

    #[error(
        "swap device {}: the file holds data, which swapping to it would destroy (uswap uses a \
         file that is empty, sparse or zeros, as it leaves its own after a clean exit); give a \
         directory (uswap creates an anonymous swap file in it) or a new path, or, if it is \
         yours to lose (a swap file a killed run left behind, whose program has ended), empty \
         it first: `truncate -s 0 {}`",
        .path.display(), .path.display()
    )]
    HoldsData { path: PathBuf },

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

impl FileDeviceError {
    /// Whether the device as given can never be opened, whatever the file: a size below one
    /// cluster, or a queue depth out of range (the C API's `USWAP_EINVAL`, Python's
    /// `InvalidArgumentError`, as for the other devices), not a device that failed.
    pub fn is_bad_argument(&self) -> bool {
        matches!(self, FileDeviceError::TooSmall { .. } | FileDeviceError::BadQueueDepth { .. })
    }
}
