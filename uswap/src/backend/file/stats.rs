//! The file device's counters: [`FileStats`], the snapshot callers read, and `Counters`,
//! the atomics the device bumps.
//!
//! A leaf of the folder: the read/write path (`ring.rs`) and the device (`mod.rs`) both
//! count here, and this module imports nothing of its siblings'.
//!
//! Locking: none; relaxed atomics, monotonic, summed over all threads.

use std::sync::atomic::{AtomicU64, Ordering};

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

/// The device's live counters, bumped by the read/write path (`ring.rs`) and by `discard`
/// (`mod.rs`); [`Counters::snapshot`] reads them as [`FileStats`].
#[derive(Default)]
pub(super) struct Counters {
    pub(super) ring_calls: AtomicU64,
    pub(super) sync_calls: AtomicU64,
    pub(super) short_transfers: AtomicU64,
    pub(super) retries: AtomicU64,
    pub(super) discards: AtomicU64,
    pub(super) discard_errors: AtomicU64,
    pub(super) rings_poisoned: AtomicU64,
}

impl Counters {
    pub(super) fn snapshot(&self) -> FileStats {
        let l = |a: &AtomicU64| a.load(Ordering::Relaxed);
        FileStats {
            ring_calls: l(&self.ring_calls),
            sync_calls: l(&self.sync_calls),
            short_transfers: l(&self.short_transfers),
            retries: l(&self.retries),
            discards: l(&self.discards),
            discard_errors: l(&self.discard_errors),
            rings_poisoned: l(&self.rings_poisoned),
        }
    }
}

/// Counts one event.
pub(super) fn bump(c: &AtomicU64) {
    c.fetch_add(1, Ordering::Relaxed);
}
