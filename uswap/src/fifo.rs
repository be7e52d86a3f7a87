//! The reclaim FIFOs' queue ([`Fifo`]): a bounded multi-producer, multi-consumer ring of
//! packed page references (D. Vyukov's bounded queue), lock-free and allocation-free, so
//! that a SIGBUS handler may push and pop.
//!
//! Why not crossbeam's `ArrayQueue`, which it replaces: that one writes every slot when it is
//! made (each slot's initial sequence number), and the FIFOs are sized for four times the
//! resident limit. For a 1 GiB limit that was 48 MB written and 50 ms spent at start-up, in
//! every process `uswap run` starts. Here the slots live in a mapping that reads as zero
//! until used, and each slot stores its sequence number *relative to its index*, so a zero
//! slot is already in its initial state: a queue costs memory for the slots it has used.
//!
//! Invariants (Vyukov): slot `i` with relative sequence `r` has sequence `s = i + r`; a
//! producer at position `pos` may fill the slot when `s == pos`, then publishes `s = pos + 1`
//! (Release, after the value); a consumer at `pos` may take it when `s == pos + 1`, then
//! frees it with `s = pos + capacity`. Every loop retries only when another thread moved
//! `head` or `tail` (its progress), so each is lock-free.

use std::io;
use std::sync::atomic::{AtomicUsize, Ordering};

use crossbeam_utils::CachePadded;

use crate::mapping::AtomicTable;

pub struct Fifo {
    /// `[2 * i]`: slot i's sequence relative to i; `[2 * i + 1]`: its value.
    slots: AtomicTable,
    mask: usize,
    head: CachePadded<AtomicUsize>,
    tail: CachePadded<AtomicUsize>,
}

impl Fifo {
    /// A queue of at least `min_capacity` entries (rounded up to a power of two).
    pub fn new(min_capacity: usize) -> io::Result<Fifo> {
        let cap = min_capacity.max(2).next_power_of_two();
        Ok(Fifo {
            slots: AtomicTable::new(2 * cap)?,
            mask: cap - 1,
            head: CachePadded::new(AtomicUsize::new(0)),
            tail: CachePadded::new(AtomicUsize::new(0)),
        })
    }

    pub fn capacity(&self) -> usize {
        self.mask + 1
    }

    fn seq(&self, i: usize) -> usize {
        (self.slots[2 * i].load(Ordering::Acquire) as usize).wrapping_add(i)
    }

    fn set_seq(&self, i: usize, seq: usize) {
        self.slots[2 * i].store(seq.wrapping_sub(i) as u64, Ordering::Release);
    }

    /// Appends `v`; gives it back if the queue is full.
    pub fn push(&self, v: u64) -> Result<(), u64> {
        let mut pos = self.tail.load(Ordering::Relaxed);
        // Lock-free: a round repeats only because another push moved the tail (its progress);
        // a slot whose pop is unfinished makes this return Err, never wait.
        loop {
            let i = pos & self.mask;
            let dif = self.seq(i).wrapping_sub(pos) as isize;
            if dif == 0 {
                match self.tail.compare_exchange_weak(pos, pos.wrapping_add(1), Ordering::Relaxed, Ordering::Relaxed) {
                    Ok(_) => {
                        self.slots[2 * i + 1].store(v, Ordering::Relaxed);
                        self.set_seq(i, pos.wrapping_add(1));
                        return Ok(());
                    }
                    Err(now) => pos = now,
                }
            } else if dif < 0 {
                return Err(v);
            } else {
                pos = self.tail.load(Ordering::Relaxed);
            }
        }
    }

    /// Takes the oldest entry, if any.
    pub fn pop(&self) -> Option<u64> {
        let mut pos = self.head.load(Ordering::Relaxed);
        // Lock-free: a round repeats only because another pop moved the head (its progress);
        // a slot whose push is unfinished makes this return None, never wait.
        loop {
            let i = pos & self.mask;
            let dif = self.seq(i).wrapping_sub(pos.wrapping_add(1)) as isize;
            if dif == 0 {
                match self.head.compare_exchange_weak(pos, pos.wrapping_add(1), Ordering::Relaxed, Ordering::Relaxed) {
                    Ok(_) => {
                        let v = self.slots[2 * i + 1].load(Ordering::Relaxed);
                        self.set_seq(i, pos.wrapping_add(self.mask + 1));
                        return Some(v);
                    }
                    Err(now) => pos = now,
                }
            } else if dif < 0 {
                return None;
            } else {
                pos = self.head.load(Ordering::Relaxed);
            }
        }
    }

    /// The oldest entry, left in the queue: a hint, which a concurrent pop may take first.
    pub fn peek(&self) -> Option<u64> {
        let pos = self.head.load(Ordering::Acquire);
        let i = pos & self.mask;
        if self.seq(i) != pos.wrapping_add(1) {
            return None; // empty, or its push is unfinished
        }
        let v = self.slots[2 * i + 1].load(Ordering::Relaxed);
        // Still the head: the value read is the one a pop at `pos` takes (or took).
        (self.seq(i) == pos.wrapping_add(1) && self.head.load(Ordering::Acquire) == pos).then_some(v)
    }

    /// Entries queued (a snapshot: exact only while no one pushes or pops).
    pub fn len(&self) -> usize {
        let tail = self.tail.load(Ordering::Acquire);
        let head = self.head.load(Ordering::Acquire);
        tail.wrapping_sub(head).min(self.capacity())
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fifo_order_full_and_empty() {
        let q = Fifo::new(5).unwrap();
        assert_eq!(q.peek(), None);
        assert_eq!(q.capacity(), 8);
        assert_eq!(q.pop(), None);
        for round in 0..3u64 {
            for v in 0..8 {
                q.push(round * 100 + v).unwrap();
            }
            assert_eq!(q.push(999), Err(999), "a full queue gives the value back");
            assert_eq!(q.len(), 8);
            for v in 0..8 {
                assert_eq!(q.peek(), Some(round * 100 + v));
                assert_eq!(q.pop(), Some(round * 100 + v));
            }
            assert!(q.is_empty());
            assert_eq!(q.pop(), None);
        }
    }

    #[test]
    fn many_threads_lose_and_duplicate_nothing() {
        const THREADS: u64 = 4;
        const PER_THREAD: u64 = 50_000;
        let q = std::sync::Arc::new(Fifo::new(1024).unwrap());
        let seen = std::sync::Arc::new((0..THREADS * PER_THREAD).map(|_| AtomicUsize::new(0)).collect::<Vec<_>>());
        let threads: Vec<_> = (0..THREADS)
            .map(|t| {
                let (q, seen) = (q.clone(), seen.clone());
                std::thread::spawn(move || {
                    let mut next = t * PER_THREAD;
                    let end = next + PER_THREAD;
                    let mut popped = 0;
                    while next < end || popped < PER_THREAD {
                        if next < end && q.push(next).is_ok() {
                            next += 1;
                        }
                        if popped < PER_THREAD {
                            if let Some(v) = q.pop() {
                                seen[v as usize].fetch_add(1, Ordering::Relaxed);
                                popped += 1;
                            }
                        }
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        assert!(q.is_empty());
        let wrong: Vec<_> =
            seen.iter().enumerate().filter(|(_, n)| n.load(Ordering::Relaxed) != 1).map(|(v, _)| v).take(5).collect();
        assert!(wrong.is_empty(), "values popped other than once: {wrong:?}");
    }

    #[test]
    fn a_large_queue_costs_only_what_it_uses() {
        // 4 Mi entries (64 MiB of slots): making it must not touch them.
        let q = Fifo::new(4 << 20).unwrap();
        q.push(7).unwrap();
        let resident = crate::mapping::mincore_pages(q.slots.as_ptr() as usize, 2 * q.capacity() * 8).unwrap();
        assert!(resident <= 2, "{resident} pages touched");
        assert_eq!(q.pop(), Some(7));
    }
}
