//! A spin lock that is safe to take in a signal handler, and the per-thread count of engine
//! locks held that lets the signal-mode fault path know when it must not take any.
//!
//! Why not `std::sync::Mutex` or `parking_lot`: in signal mode the fault path runs inside a
//! SIGBUS handler on the application's thread. `parking_lot` allocates per-thread parking
//! data lazily; a futex mutex would be fine but gains nothing for critical sections that are
//! a few dozen instructions long. Every critical section guarded by a [`SpinLock`] is short
//! and bounded, allocates nothing, and nests only as the hierarchy below says.
//!
//! # The lock hierarchy (the one place it is written)
//!
//! Every lock of the engine, outermost first. A thread holding one may take only locks
//! further down the list, and only in the order given; "try" means it may only `try_lock`
//! (and does something else on failure), so it never waits.
//!
//! 0. **Event reader lock** (`events::EventState::reader`, a std mutex, engine threads only):
//!    held across a read of the regions' userfaultfd and the application of the events it
//!    returned, so that events are applied in the order the kernel sent them. Its holder
//!    waits for page busy bits (1) and takes the take-out list's std mutex (a leaf, held by
//!    `events::run_take_outs` across device reads and ioctls that never wait on an event);
//!    no owner of a busy bit ever waits for either.
//! 1. **Page busy bits** (`region::Pte`, one per page): ownership of a page, taken by a
//!    compare-and-swap. Faults, reclaim and the async-readahead starter hold them; a holder
//!    may take further busy bits only with `try_lock`. The only waits on a busy bit are a
//!    fault waiting for its own page while holding nothing else (bounded:
//!    `fault::BUSY_WAIT_LIMIT_NS`, counted in `fault_busy_timeout`). May be held across
//!    system calls and device I/O.
//! 2. **Async-readahead context lock** (`async_readahead::Context::io`, a [`SpinLock`]):
//!    held while starting, waiting for and mapping from a context's reads, and across
//!    `SwapDevices::free` of the pages it maps (which takes 5). Never two at once. Taken
//!    with `lock` only by a fault that owns its page (1) and wants that context's data, and
//!    with "try" by the starter; its holder only try-locks pages. **Exception to the no
//!    system call rule**: held across the context's reads (io_uring, ~250 µs on a file
//!    device), because the waiter needs exactly that data; never taken on the lock-free
//!    fault route.
//! 3. **File-device ring locks** (`backend::file`, one [`SpinLock`] per io_uring): "try"
//!    only, never waited on (a caller that finds every ring busy, or holds any engine lock,
//!    uses `pread`/`pwrite`). **Exception to the no system call rule**: held across
//!    `io_uring_enter`; harmless since nobody spins behind it.
//! 4. **Compressed pool**: a size class's lock, then the arena (free chunks) lock.
//!    Leaves: nothing else is taken under them; no system call.
//! 5. **Swap slots**: the per-CPU free batch lock (`swap::SwapDevices`), a leaf released
//!    before its batch is freed; then, for allocation and frees, the per-CPU cluster lock
//!    (its holder may "try" other CPUs' per-CPU locks) → a cluster lock → the device's list
//!    lock (`swap::cluster_allocator`). No system call: a cluster's discard runs after the
//!    per-CPU lock is dropped.
//! 6. **`std::sync::Mutex`es**, never on a fault path: the region registry's writer lock
//!    (`mapping::registry`, `Pager::map` and a region's drop; released before anything
//!    else is taken) and the pager's thread list (build and drop).
//!
//! Under every [`SpinLock`]: no allocation, no blocking on anything but a lower lock, and no
//! system call except the two exceptions above (and `sched_yield` while *waiting*, see
//! [`Relax`]). In signal mode a fault taken by a thread that holds any [`SpinLock`] takes
//! none ([`locks_held_by_this_thread`], the lock-free route), and engine calls made by the
//! application that hold busy bits or locks block its asynchronous signals
//! (`uffd::AsyncSignalsBlocked`), so no signal handler runs, and faults, on top of them.
//!
//! The lock-depth counter: a signal handler of the application (say SIGALRM) may touch
//! managed memory while its thread is inside an engine call that holds a spin lock. The
//! nested SIGBUS must then not take any engine lock, or the thread would wait on itself.
//! [`locks_held_by_this_thread`] tells the fault path to take its lock-free route.
//!
//! Pools of pre-allocated objects (bounce buffers, the compressed pool's workspaces and
//! zstd contexts) lend them without a lock: [`pop_spinning`] takes one from a lock-free
//! queue, spinning with backoff while all are lent out, and the borrower pushes it back.

use std::cell::Cell;
use std::ops::{Deref, DerefMut};

use crossbeam_queue::ArrayQueue;
use crossbeam_utils::Backoff;

thread_local! {
    // const-initialised and without a destructor: plain TLS slots, no lazy registration.
    static LOCK_DEPTH: Cell<u32> = const { Cell::new(0) };
    static SPINS: Cell<u32> = const { Cell::new(0) };
}

/// Number of [`SpinLock`]s the calling thread holds right now.
pub fn locks_held_by_this_thread() -> u32 {
    LOCK_DEPTH.with(|d| d.get())
}

/// Spin with a pause instruction; every 64th round give the CPU away (`sched_yield`, which
/// is async-signal-safe), since on a small VM the holder may be waiting for our vCPU.
///
/// A wait for a [`SpinLock`] ends because of the hierarchy above: a holder takes only lower
/// locks, never waits for a higher one, and is never interrupted by a handler that takes
/// the same lock (the lock-free route, `uffd::AsyncSignalsBlocked`).
pub struct Relax;

impl spin::RelaxStrategy for Relax {
    fn relax() {
        let n = SPINS.with(|s| {
            let n = s.get().wrapping_add(1);
            s.set(n);
            n
        });
        if n % 64 == 0 {
            std::thread::yield_now();
        } else {
            std::hint::spin_loop();
        }
    }
}

/// Takes an object from a pool of pre-allocated ones, spinning (with backoff) until one is
/// given back if all are lent out. Takes no lock and allocates nothing: a SIGBUS handler may
/// call it.
pub fn pop_spinning<T>(pool: &ArrayQueue<T>) -> T {
    let backoff = Backoff::new();
    loop {
        if let Some(x) = pool.pop() {
            return x;
        }
        backoff.snooze();
    }
}

/// A spin lock that keeps the per-thread lock depth.
pub struct SpinLock<T>(spin::mutex::SpinMutex<T, Relax>);

impl<T> SpinLock<T> {
    pub const fn new(value: T) -> Self {
        SpinLock(spin::mutex::SpinMutex::new(value))
    }

    pub fn lock(&self) -> SpinGuard<'_, T> {
        let g = self.0.lock();
        LOCK_DEPTH.with(|d| d.set(d.get() + 1));
        SpinGuard { guard: Some(g) }
    }

    pub fn try_lock(&self) -> Option<SpinGuard<'_, T>> {
        let g = self.0.try_lock()?;
        LOCK_DEPTH.with(|d| d.set(d.get() + 1));
        Some(SpinGuard { guard: Some(g) })
    }
}

pub struct SpinGuard<'a, T> {
    // An Option only so that Drop can release the lock *before* lowering the depth: a signal
    // arriving in between must still see the lock as held by this thread.
    guard: Option<spin::mutex::SpinMutexGuard<'a, T>>,
}

impl<T> Deref for SpinGuard<'_, T> {
    type Target = T;
    fn deref(&self) -> &T {
        self.guard.as_ref().expect("guard is Some until drop")
    }
}

impl<T> DerefMut for SpinGuard<'_, T> {
    fn deref_mut(&mut self) -> &mut T {
        self.guard.as_mut().expect("guard is Some until drop")
    }
}

impl<T> Drop for SpinGuard<'_, T> {
    fn drop(&mut self) {
        drop(self.guard.take());
        LOCK_DEPTH.with(|d| d.set(d.get() - 1));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    #[test]
    fn counts_nested_locks_and_excludes_other_threads() {
        let a = SpinLock::new(0u32);
        let b = SpinLock::new(0u32);
        assert_eq!(locks_held_by_this_thread(), 0);
        {
            let _ga = a.lock();
            let _gb = b.lock();
            assert_eq!(locks_held_by_this_thread(), 2);
            assert!(a.try_lock().is_none());
        }
        assert_eq!(locks_held_by_this_thread(), 0);

        let counter = Arc::new(SpinLock::new(0u64));
        let threads: Vec<_> = (0..4)
            .map(|_| {
                let c = counter.clone();
                std::thread::spawn(move || {
                    for _ in 0..10_000 {
                        *c.lock() += 1;
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        assert_eq!(*counter.lock(), 40_000);
    }

    #[test]
    fn pop_spinning_waits_until_an_object_is_given_back() {
        let pool = Arc::new(ArrayQueue::new(1));
        pool.push(7u32).unwrap();
        // The borrower takes the one object, then spins on the empty pool until this thread
        // pushes another. It runs on its own thread so that a hang fails the test here.
        let (tx, rx) = std::sync::mpsc::channel();
        let borrower = {
            let pool = pool.clone();
            std::thread::spawn(move || {
                for _ in 0..2 {
                    tx.send(pop_spinning(&pool)).unwrap();
                }
            })
        };
        let timeout = std::time::Duration::from_secs(10);
        let first = rx.recv_timeout(timeout).expect("stuck in pop_spinning on a pool holding an object");
        assert_eq!(first, 7);
        std::thread::sleep(std::time::Duration::from_millis(20));
        assert!(rx.try_recv().is_err(), "took an object from an empty pool");
        pool.push(9).unwrap();
        let second = rx.recv_timeout(timeout).expect("stuck in pop_spinning: the object given back was not taken");
        assert_eq!(second, 9);
        borrower.join().unwrap();
        assert!(pool.is_empty());
    }
}
