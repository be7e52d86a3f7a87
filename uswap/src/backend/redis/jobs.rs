//! Handing requests to the device threads without allocating or locking: the job table.
//!
//! # Job
//!
//! A caller (a fault handler, possibly inside a SIGBUS handler, or a reclaim thread) claims a
//! free [`Job`] with a compare-and-swap, fills in raw pointers to its requests, posts the
//! job's index on a lock-free queue, rings the doorbell (a futex) and sleeps on the job's
//! state (a futex) until a device thread marks it done. Everything is allocated when the
//! device opens; claiming, posting and waiting are atomics and `futex(2)`, which are
//! async-signal-safe.
//!
//! # Locking rules
//!
//! No locks. A job's `work` is written only by the caller that claimed it (state `CLAIMED`)
//! and read only by the device thread that took it off the queue (state `TAKEN`); the state
//! transitions with release/acquire ordering hand it over.
//!
//! # Invariants
//!
//! * A job's index is on the queue at most once (only a `CLAIMED` job is posted), so the
//!   queue, as long as the table, never overflows.
//! * The requests a job points to outlive it: the caller does not return (and so does not
//!   drop them) before the job is `DONE`. A device thread's work on a job is bounded in time
//!   (socket timeouts and the failover deadline), so the caller's wait ends.

use std::cell::UnsafeCell;
use std::sync::atomic::{AtomicU32, Ordering};

use crossbeam_queue::ArrayQueue;

use crate::backend::{AlignedPage, BackendError, ReadReq, WriteReq};
use crate::clock::now_ns;
use crate::sync::{futex_wait, futex_wake};

pub const FREE: u32 = 0;
pub const CLAIMED: u32 = 1;
pub const POSTED: u32 = 2;
pub const TAKEN: u32 = 3;
pub const DONE: u32 = 4;

/// What a job asks for. The pointers stay valid until the job is `DONE` (module invariant).
#[derive(Clone, Copy)]
pub enum Work {
    None,
    /// `Backend::read`: `n` requests.
    Read {
        reqs: *mut ReadReq<'static>,
        n: usize,
    },
    /// `Backend::write`: `n` requests.
    Write {
        reqs: *mut WriteReq<'static>,
        n: usize,
    },
    /// An asynchronous read: `n` runs into `buf`, results into `results`.
    AsyncRead {
        runs: *const crate::backend::AsyncRun,
        n: usize,
        buf: *mut AlignedPage,
        buf_pages: usize,
        results: *mut Result<(), BackendError>,
    },
}

/// One request slot of the table.
pub struct Job {
    pub state: AtomicU32,
    pub work: UnsafeCell<Work>,
}

// SAFETY: `work` is only accessed by the one party that owns the job by its state (the
// claiming caller, then the taking device thread), with release/acquire hand-over; the raw
// pointers it holds are valid for that time (module invariants).
unsafe impl Sync for Job {}
// SAFETY: as above; a Job holds no thread-bound data.
unsafe impl Send for Job {}

/// The table, its queue, and the device threads' doorbell.
pub struct Jobs {
    jobs: Box<[Job]>,
    queue: ArrayQueue<u32>,
    /// Bumped on every post; device threads sleep on it.
    pub doorbell: AtomicU32,
}

impl Jobs {
    pub fn new(nr_jobs: usize) -> Jobs {
        Jobs {
            jobs: (0..nr_jobs)
                .map(|_| Job { state: AtomicU32::new(FREE), work: UnsafeCell::new(Work::None) })
                .collect(),
            queue: ArrayQueue::new(nr_jobs.max(1)),
            doorbell: AtomicU32::new(0),
        }
    }

    /// Claims a free job, trying from `hint` on; `None` if all are in use.
    pub fn claim(&self, hint: usize) -> Option<u32> {
        let n = self.jobs.len();
        (0..n).map(|k| (hint + k) % n).find_map(|i| {
            self.jobs[i]
                .state
                .compare_exchange(FREE, CLAIMED, Ordering::Acquire, Ordering::Relaxed)
                .ok()
                .map(|_| i as u32)
        })
    }

    /// Sets a claimed job's work and hands it to the device threads.
    pub fn post(&self, i: u32, work: Work) {
        let job = &self.jobs[i as usize];
        // SAFETY: the job is CLAIMED by this caller: nobody else reads or writes `work`.
        unsafe { *job.work.get() = work };
        job.state.store(POSTED, Ordering::Release);
        // Cannot fail: each index is on the queue at most once (module invariants).
        let _ = self.queue.push(i);
        self.doorbell.fetch_add(1, Ordering::Release);
        futex_wake(&self.doorbell, 1);
    }

    /// Whether a job is waiting to be taken.
    pub fn pending(&self) -> bool {
        !self.queue.is_empty()
    }

    /// Takes a posted job (a device thread); its work is then the taker's.
    pub fn take(&self) -> Option<(u32, Work)> {
        let i = self.queue.pop()?;
        let job = &self.jobs[i as usize];
        // Acquire: pairs with the caller's release store of POSTED, after `work` was set.
        let _ = job.state.load(Ordering::Acquire);
        job.state.store(TAKEN, Ordering::Relaxed);
        // SAFETY: POSTED → TAKEN: the caller no longer touches `work` until DONE.
        let work = unsafe { *job.work.get() };
        Some((i, work))
    }

    /// Marks a taken job done and wakes its caller.
    pub fn finish(&self, i: u32) {
        let job = &self.jobs[i as usize];
        job.state.store(DONE, Ordering::Release);
        futex_wake(&job.state, 1);
    }

    /// Waits until job `i` is done, then frees it: polls for up to `poll_ns` (a round trip
    /// to a store on a nearby machine takes tens of microseconds, about what a sleeping
    /// thread takes to wake up), then sleeps. Async-signal-safe.
    pub fn wait_and_free(&self, i: u32, poll_ns: u64) {
        let job = &self.jobs[i as usize];
        if poll_ns > 0 {
            let until = now_ns() + poll_ns;
            // Bounded by the polling budget.
            while job.state.load(Ordering::Acquire) != DONE && now_ns() < until {
                for _ in 0..64 {
                    std::hint::spin_loop();
                }
            }
        }
        // Bounded: the device thread's work is bounded in time (module invariants); the
        // timeout only guards against a lost wake-up.
        loop {
            let s = job.state.load(Ordering::Acquire);
            if s == DONE {
                break;
            }
            futex_wait(&job.state, s, 100_000_000);
            // A store that does not answer holds the job until its failover deadline: a
            // stop signal (SIGTERM) ends the process meanwhile.
            crate::uffd::sigbus::let_stop_signals_through();
        }
        // SAFETY: DONE: the device thread no longer touches `work`; we still own the job.
        unsafe { *job.work.get() = Work::None };
        job.state.store(FREE, Ordering::Release);
    }
}
