//! Pre-allocated, page-aligned bounce buffers that any thread, including a SIGBUS handler,
//! may borrow without allocating or locking.
//!
//! Buffers are allocated once when the pager is built and then only moved in and out of a
//! lock-free queue as owned boxes, so taking one is a pop and returning it is a push. When
//! more threads fault at once than there are buffers, the extra ones spin (with backoff)
//! until one comes back; the buffers are sized to the number of CPUs times a margin so that this
//! only happens under extreme oversubscription. A wait past `sync::POP_WAIT_LIMIT_NS` gives
//! up: the caller fails its operation and counts it in `bounce_wait_timeout`.

use crossbeam_queue::ArrayQueue;

pub use crate::mapping::{AlignedPage, PageBuf};
use crate::sync::{pop_spinning, POP_WAIT_LIMIT_NS};
#[cfg(test)]
use crate::uffd::PAGE_SIZE;

/// A borrowed buffer of `nr_pages` aligned pages, returned to its [`BounceBuffers`] on drop.
pub struct Bounce<'a> {
    buf: Option<PageBuf>,
    buffers: &'a BounceBuffers,
}

impl Bounce<'_> {
    /// All pages of the buffer, for a backend read.
    pub fn pages_mut(&mut self) -> &mut [AlignedPage] {
        self.buf.as_mut().expect("present until drop")
    }

    #[cfg(test)]
    pub fn page(&self, i: usize) -> &[u8; PAGE_SIZE] {
        &self.buf.as_ref().expect("present until drop")[i].0
    }
}

impl Drop for Bounce<'_> {
    fn drop(&mut self) {
        if let Some(b) = self.buf.take() {
            // Cannot fail: the queue never holds more buffers than it was built with.
            let _ = self.buffers.free.push(b);
        }
    }
}

/// A pager's bounce buffers: the free ones, in a lock-free queue.
pub struct BounceBuffers {
    free: ArrayQueue<PageBuf>,
}

impl BounceBuffers {
    /// Fails only if the buffers' address space cannot be mapped. They cost no memory until
    /// used ([`PageBuf`]).
    pub fn new(nr_buffers: usize, pages_per_buffer: usize) -> std::io::Result<BounceBuffers> {
        let free = ArrayQueue::new(nr_buffers.max(1));
        for _ in 0..nr_buffers.max(1) {
            let _ = free.push(PageBuf::zeroed(pages_per_buffer.max(1))?);
        }
        Ok(BounceBuffers { free })
    }

    /// Takes a buffer, waiting for one if all are lent out; None if none came back within
    /// `sync::POP_WAIT_LIMIT_NS` (the caller fails and counts `Counter::BounceWaitTimeout`).
    pub fn take(&self) -> Option<Bounce<'_>> {
        // A wait ends: a buffer is lent for one swap-in, which waits on nothing a waiter here
        // holds (the lender owns its pages' busy bits and takes only lower locks, see the
        // hierarchy in `crate::sync`), and no application signal handler runs on a lender
        // (SIGBUS handler: full mask; engine calls: `uffd::AsyncSignalsBlocked`). But a
        // lender's device read may hang (a dead disk), so the wait is bounded all the same.
        Some(Bounce { buf: Some(pop_spinning(&self.free, POP_WAIT_LIMIT_NS)?), buffers: self })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buffers_are_aligned_and_come_back() {
        let buffers = BounceBuffers::new(2, 4).unwrap();
        {
            let mut a = buffers.take().expect("a free buffer");
            let b = buffers.take().expect("a free buffer");
            assert_eq!(a.pages_mut().len(), 4);
            assert_eq!(a.page(0).as_ptr() as usize % PAGE_SIZE, 0);
            a.pages_mut()[3].0[0] = 7;
            assert_eq!(a.page(3)[0], 7);
            assert_eq!(b.page(1).as_ptr() as usize % PAGE_SIZE, 0);
            assert!(buffers.free.is_empty());
            // Both lent out and never given back while this waits: it gives up.
            let t0 = std::time::Instant::now();
            assert!(buffers.take().is_none(), "took a buffer from empty buffers");
            assert!(t0.elapsed().as_nanos() as u64 >= POP_WAIT_LIMIT_NS);
        }
        assert_eq!(buffers.free.len(), 2);
        assert!(buffers.take().is_some());
    }
}
