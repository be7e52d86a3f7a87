//! The queue of pages a fork shares (`UFFDIO_MOVE` refused them with `EBUSY`), waiting for
//! the background reclaimer to make them exclusive. What is done with them is
//! `crate::reclaim::cow`'s.
//!
//! Locking: none; a lock-free queue.

use crossbeam_queue::ArrayQueue;

use crate::page_table::PageRef;

/// Refused pages waiting to be made exclusive; a page that finds it full stays on the LRU
/// and is queued when a later round is refused it again.
const QUEUE_LEN: usize = 4096;

/// The queue of pages to break.
pub(crate) struct CowQueue {
    queue: ArrayQueue<u64>,
}

impl CowQueue {
    pub fn new() -> CowQueue {
        CowQueue { queue: ArrayQueue::new(QUEUE_LEN) }
    }

    /// Queues `r`; false when the queue is full. Lock-free, allocation-free.
    pub fn push(&self, r: PageRef) -> bool {
        self.queue.push(r.pack()).is_ok()
    }

    pub fn pop(&self) -> Option<PageRef> {
        self.queue.pop().map(PageRef::unpack)
    }
}
