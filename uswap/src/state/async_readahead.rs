//! The asynchronous readahead contexts of a pager: per device with an [`AsyncReader`], a few
//! readers (each its own io_uring and buffer) and the listing of which page each buffer
//! page was read for. Starting reads, and mapping from them, are `crate::async_readahead`'s
//! (its module doc has the claim rules and the locking).

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

use arrayvec::ArrayVec;

use crate::backend::{AsyncReader, AsyncRun, BackendError};
use crate::readahead::MAX_WINDOW_PAGES;
use crate::swap::SwapEntry;
use crate::sync::{LockClass, SpinLock};

/// Contexts (readers) per device with asynchronous readahead.
pub const CONTEXTS_PER_DEVICE: usize = 8;
/// Most windows a stream may have in flight ahead of the one it works on.
pub const MAX_ASYNC_WINDOWS: usize = 4;
/// Windows read ahead asynchronously by default.
pub const DEFAULT_ASYNC_WINDOWS: usize = 2;

/// One reader and the listing of what its buffer holds.
pub(crate) struct Context {
    pub device: usize,
    pub io: SpinLock<ContextIo>,
    /// Per buffer page: the owner (`PageRef::owner`) of the page read into it, or 0.
    pub owner: Box<[AtomicU64]>,
    /// Per buffer page: the swap entry read into it (bits).
    pub entry: Box<[AtomicU64]>,
}

pub(crate) struct ContextIo {
    pub reader: Box<dyn AsyncReader>,
    pub runs: ArrayVec<AsyncRun, MAX_WINDOW_PAGES>,
    pub results: Box<[Result<(), BackendError>]>,
    /// `results` hold the outcome of the last start.
    pub waited: bool,
}

impl ContextIo {
    /// Waits for the reads if they are still in flight; true if it had to wait.
    pub fn wait(&mut self) -> bool {
        if self.waited {
            return false;
        }
        let in_flight = self.reader.in_flight();
        self.reader.wait(&mut self.results);
        self.waited = true;
        in_flight
    }

    /// Whether buffer page `i` was read correctly (after [`ContextIo::wait`]).
    pub fn page_ok(&self, i: usize) -> bool {
        self.waited
            && self
                .runs
                .iter()
                .zip(self.results.iter())
                .any(|(r, res)| i >= r.first_page && i < r.first_page + r.nr_pages && res.is_ok())
    }

    /// Buffer page `i`, if no read is in flight.
    pub fn page(&self, i: usize) -> Option<&[u8]> {
        self.reader.pages().and_then(|p| p.get(i)).map(|p| &p.0[..])
    }
}

/// Where a page's asynchronously read data is: context `ctx`, buffer page `idx`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Listed {
    pub ctx: usize,
    pub idx: usize,
}

/// The asynchronous readahead contexts of a pager.
pub(crate) struct AsyncReadahead {
    pub contexts: Box<[Context]>,
    /// Windows a sequential stream keeps in flight ahead of the one it works on (0: off).
    pub windows: usize,
    /// The largest readahead window: only a stream whose window has grown to it (it has
    /// shown itself sequential for several windows) reads ahead asynchronously, and its
    /// asynchronous windows are the same size, so they line up with the windows its faults
    /// will ask for.
    pub window_pages: usize,
    pub next: AtomicUsize,
}

impl AsyncReadahead {
    /// Contexts for each device whose `reader` gives one (called per device index; `None`:
    /// no asynchronous readahead on that device).
    pub fn new(
        windows: usize,
        window_pages: usize,
        mut reader: impl FnMut(usize) -> Option<Box<dyn AsyncReader>>,
        nr_devices: usize,
    ) -> AsyncReadahead {
        let mut contexts = Vec::new();
        if windows > 0 {
            for device in 0..nr_devices {
                for _ in 0..CONTEXTS_PER_DEVICE {
                    let Some(r) = reader(device) else { break };
                    let n = r.capacity_pages().min(window_pages);
                    contexts.push(Context {
                        device,
                        io: SpinLock::new(
                            LockClass::AsyncReadaheadContext,
                            ContextIo {
                                reader: r,
                                runs: ArrayVec::new(),
                                results: (0..n).map(|_| Ok(())).collect(),
                                waited: true,
                            },
                        ),
                        owner: (0..n).map(|_| AtomicU64::new(0)).collect(),
                        entry: (0..n).map(|_| AtomicU64::new(0)).collect(),
                    });
                }
            }
        }
        AsyncReadahead {
            contexts: contexts.into_boxed_slice(),
            windows: windows.min(MAX_ASYNC_WINDOWS),
            window_pages,
            next: AtomicUsize::new(0),
        }
    }

    pub fn context(&self, ctx: usize) -> &Context {
        &self.contexts[ctx]
    }

    /// Finds the listing of page `owner` read from `entry` (no lock).
    pub fn find(&self, owner: u64, entry: SwapEntry) -> Option<Listed> {
        for (ctx, c) in self.contexts.iter().enumerate() {
            if c.device != entry.device() {
                continue;
            }
            if let Some(idx) = c.find(owner, entry) {
                return Some(Listed { ctx, idx });
            }
        }
        None
    }
}

impl Context {
    pub fn find(&self, owner: u64, entry: SwapEntry) -> Option<usize> {
        (0..self.owner.len()).find(|&i| self.listed_at(i, owner, entry))
    }

    /// Whether buffer page `i` is listed for `owner` read from `entry` (no lock).
    pub fn listed_at(&self, i: usize, owner: u64, entry: SwapEntry) -> bool {
        self.owner.get(i).is_some_and(|o| o.load(Ordering::Acquire) == owner)
            && self.entry[i].load(Ordering::Relaxed) == entry.bits()
    }

    /// Buffer page index listing `owner` at `entry`, if any (no lock).
    pub fn index_of(&self, owner: u64, entry: SwapEntry) -> Option<usize> {
        self.find(owner, entry)
    }

    /// Claims listing entry `i` for `owner`: true for exactly one caller.
    pub fn claim(&self, i: usize, owner: u64) -> bool {
        self.owner[i].compare_exchange(owner, 0, Ordering::AcqRel, Ordering::Acquire).is_ok()
    }
}
