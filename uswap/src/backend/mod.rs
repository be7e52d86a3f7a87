//! Where page contents go: the [`Backend`] trait and its implementations.
//!
//! A backend stores pages in numbered slots. The swap layer decides which slot a page gets
//! (cluster allocator) and calls the backend with batches: runs of consecutive slots, each
//! with its buffer, so a device can issue one large I/O (or one io_uring submission) per
//! batch. The fault path never sees which backend it talks to.
//!
//! Contract for implementors:
//! * `write` and `read` may be called concurrently from several threads, for different slots.
//!   The engine never reads a slot while it is being written, nor writes a slot twice without
//!   a `discard` or a successful `write` in between.
//! * `read` may run inside a SIGBUS handler (signal mode): it must not allocate or take a
//!   lock that a thread could hold while being interrupted by that signal. Report failures
//!   through each request's `result`; never panic.
//! * A failed write must leave the slot's previous contents (if any) readable.

pub mod file;
pub mod ram;

use std::io;

use thiserror::Error;

use crate::mapping::PageRun;
use crate::uffd::PAGE_SIZE;

/// A failed backend operation, with the slot it concerns.
#[derive(Debug, Error)]
pub enum BackendError {
    #[error("I/O error on slot {slot}: {source}")]
    Io { slot: u64, source: io::Error },
    #[error("slot {slot} is beyond the device's {nr_slots} slots")]
    OutOfRange { slot: u64, nr_slots: u64 },
    #[error("injected failure on slot {slot}")]
    Injected { slot: u64 },
}

/// Write the pages of `data` to consecutive slots starting at `slot`. The pages are staged
/// pages the engine owns for the duration of the call; they are handed over as a [`PageRun`]
/// (copy out or take the address for I/O) rather than as a slice.
pub struct WriteReq<'a> {
    pub slot: u64,
    pub data: PageRun<'a>,
    pub result: Result<(), BackendError>,
}

/// One page, aligned for `O_DIRECT` I/O: the unit of read buffers.
#[derive(Clone, Copy)]
#[repr(C, align(4096))]
pub struct AlignedPage(pub [u8; PAGE_SIZE]);

/// Read consecutive slots starting at `slot` into `buf`, one page per slot. The pages are
/// contiguous in memory, so a device may read the whole run with one I/O.
pub struct ReadReq<'a> {
    pub slot: u64,
    pub buf: &'a mut [AlignedPage],
    pub result: Result<(), BackendError>,
}

impl<'a> WriteReq<'a> {
    pub fn new(slot: u64, data: PageRun<'a>) -> Self {
        WriteReq { slot, data, result: Ok(()) }
    }
    pub fn nr_pages(&self) -> u64 {
        self.data.nr_pages() as u64
    }
}

impl<'a> ReadReq<'a> {
    pub fn new(slot: u64, buf: &'a mut [AlignedPage]) -> Self {
        debug_assert!(!buf.is_empty());
        ReadReq { slot, buf, result: Ok(()) }
    }
    pub fn nr_pages(&self) -> u64 {
        self.buf.len() as u64
    }
}

/// Page storage behind a swap device.
pub trait Backend: Send + Sync {
    /// Short name for stats and messages (`ram`, `zpool`, `file:/path`).
    fn name(&self) -> String;

    /// Capacity in slots (pages).
    fn nr_slots(&self) -> u64;

    /// Stores each request's pages; sets each request's `result`.
    fn write(&self, reqs: &mut [WriteReq<'_>]);

    /// Loads each request's pages; sets each request's `result`. May run in a signal handler.
    fn read(&self, reqs: &mut [ReadReq<'_>]);

    /// The slots `[slot, slot + nr)` hold nothing the engine needs any more: the backend may
    /// drop their storage (return memory, punch a hole).
    fn discard(&self, _slot: u64, _nr: u64) {}

    /// Where slot `slot`'s page can be read in place, if the backend keeps pages uncompressed
    /// in this address space; lets the fault path hand it straight to `UFFDIO_COPY` with no
    /// bounce copy. Valid until the slot is written or discarded.
    fn page_ptr(&self, _slot: u64) -> Option<*const u8> {
        None
    }
}
