//! The queue of pages a fork shares (`UFFDIO_MOVE` refused them with `EBUSY`), waiting for
//! the background reclaimer to make them exclusive, and the page it is populating now, which
//! a handler thread may claim. What is done with them is `crate::reclaim::cow`'s.
//!
//! Locking: none; a lock-free queue, and one atomic for the page being broken.

use std::sync::atomic::{AtomicUsize, Ordering};

use crossbeam_queue::ArrayQueue;

use crate::page_table::PageRef;

/// Refused pages waiting to be made exclusive; a page that finds it full stays on the LRU
/// and is queued when a later round is refused it again.
const QUEUE_LEN: usize = 4096;
/// The low bit of [`CowQueue::addr`]: a handler thread claimed the page.
const CLAIMED: usize = 1;

/// The queue of pages to break and the one being broken.
pub(crate) struct CowQueue {
    queue: ArrayQueue<u64>,
    /// The page-aligned address being populated right now, `| CLAIMED` once a handler thread
    /// mapped it; 0 when none.
    addr: AtomicUsize,
}

impl CowQueue {
    pub fn new() -> CowQueue {
        CowQueue { queue: ArrayQueue::new(QUEUE_LEN), addr: AtomicUsize::new(0) }
    }

    /// Queues `r`; false when the queue is full. Lock-free, allocation-free.
    pub fn push(&self, r: PageRef) -> bool {
        self.queue.push(r.pack()).is_ok()
    }

    pub fn pop(&self) -> Option<PageRef> {
        self.queue.pop().map(PageRef::unpack)
    }

    /// Claims the page at `page_addr` if it is the one being populated (a handler thread
    /// serves its fault instead); true when it did.
    pub fn claim(&self, page_addr: usize) -> bool {
        debug_assert_eq!(page_addr & CLAIMED, 0, "page addresses are aligned");
        self.addr.compare_exchange(page_addr, page_addr | CLAIMED, Ordering::AcqRel, Ordering::Acquire).is_ok()
    }

    /// The page at `addr` is being populated now.
    pub fn begin(&self, addr: usize) {
        assert_eq!(self.addr.load(Ordering::Relaxed), 0, "one page is populated at a time");
        self.addr.store(addr, Ordering::Release);
    }

    /// Population ended; true when a handler thread claimed the page meanwhile.
    pub fn end(&self) -> bool {
        self.addr.swap(0, Ordering::AcqRel) & CLAIMED != 0
    }
}
