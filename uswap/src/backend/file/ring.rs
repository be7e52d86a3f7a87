//! Reads and writes of the file device: the io_uring rings, their batches, and the system
//! call fallback.
//!
//! # Job
//!
//! Each request (a run of consecutive slots with one contiguous buffer) becomes one
//! `IORING_OP_READ`/`IORING_OP_WRITE` of the whole run straight from/into the caller's
//! buffer (staging pages for writes, aligned bounce pages for reads; both are page-aligned,
//! as `O_DIRECT` wants). All requests of one call go to the kernel with one
//! `io_uring_enter`, which also waits for all of them; a call with more requests than the
//! queue depth is done in windows of `queue_depth`. Short transfers are resubmitted for the
//! remainder; `EINTR`/`EAGAIN` are retried (a bounded number of times); any other error ends
//! that request with `BackendError::Io` naming the first slot not transferred.
//!
//! [`RingIo`] owns this path's state: the rings, and the copies of the device's descriptor,
//! size and polling budget it needs, and the device's counters. The device (`mod.rs`) holds
//! one and calls [`RingIo::submit`]; this module imports only the counters (`stats.rs`).
//!
//! # Locking rules
//!
//! `read` may run inside a SIGBUS handler on an application thread (signal mode), and
//! `read`/`write` run concurrently on several threads. So the read/write path allocates
//! nothing and never waits for a lock:
//! * There are [`FileOptions::rings`] io_uring instances, each behind a [`SpinLock`] that is
//!   only ever taken with `try_lock`. A call tries the ring of its CPU first, then the others;
//!   if all are busy it does its requests with `pread`/`pwrite` on the same `O_DIRECT` file
//!   descriptor instead (the *syscall fallback*). It never waits for a ring.
//! * If the calling thread already holds any engine [`SpinLock`]
//!   ([`locks_held_by_this_thread`] > 0: it was interrupted inside engine code, possibly
//!   inside this very backend while it held a ring), the call uses the syscall fallback
//!   without touching a ring.
//!
//! Everything the ring path needs (the rings, per-ring bookkeeping of in-flight operations)
//! is allocated at open. Errors are built from `errno` values (`io::Error::from_raw_os_error`,
//! which does not allocate).
//!
//! # Invariants
//!
//! * A ring whose lock is free has nothing in flight and nothing queued: every operation a
//!   call submits completes (its CQE is reaped) before the call releases the ring. So the
//!   kernel never touches a caller's buffer after the call returns, and a completion never
//!   lands on another thread.
//! * If `io_uring_enter` ever fails with an unexpected error while operations are still
//!   queued but not submitted, the ring is marked *poisoned* and never entered again (the
//!   queued entries are dropped with the ring at close, unsubmitted); the call finishes its
//!   remaining requests with the syscall fallback. Operations already submitted are always
//!   waited for.
//! * Per-call work on a ring is bounded by the queue depth: at most `queue_depth` operations
//!   in flight, the completion queue (twice the depth) cannot overflow.
//! * The descriptor a [`RingIo`] uses is the device's, which `FileBackend` closes only after
//!   dropping the [`RingIo`] (field order).
//!
//! [`FileOptions::rings`]: super::FileOptions::rings
//! [`SpinLock`]: crate::sync::SpinLock

use std::io;
use std::os::fd::{AsRawFd, RawFd};
use std::sync::atomic::{AtomicBool, Ordering};

use crossbeam_utils::CachePadded;
use io_uring::{opcode, squeue, types, EnterFlags, IoUring};

use super::stats::{bump, Counters};
use crate::backend::{BackendError, ReadReq, WriteReq};
use crate::clock::now_ns;
use crate::mapping::current_cpu;
use crate::sync::{locks_held_by_this_thread, LockClass, SpinLock};
use crate::uffd::PAGE_SIZE;

/// The calling thread's `errno` (`EIO` if there is none).
pub(super) fn errno() -> i32 {
    io::Error::last_os_error().raw_os_error().unwrap_or(libc::EIO)
}

/// Largest single transfer; a longer request is done as several (as if it were short).
const MAX_IO_BYTES: u64 = 1 << 30;
/// How many times one request is retried after `EINTR`/`EAGAIN` before it fails.
pub(super) const MAX_RETRIES: u32 = 100;
/// `io_uring_enter` calls in a row that make no progress before the ring is given up.
pub(super) const MAX_STALLS: u32 = 10_000;

/// One wait's hybrid polling (see [`FileOptions::poll_us`]): until the budget is spent each
/// round asks `io_uring_enter` for no completions (it returns at once, having run the
/// completion work); after that a round sleeps for all it waits for.
///
/// [`FileOptions::poll_us`]: super::FileOptions::poll_us
#[derive(Clone, Copy)]
pub(super) struct PollBudget {
    /// When polling stops; 0: it never started (no budget, and no clock read).
    until_ns: u64,
}

impl PollBudget {
    pub(super) fn start(poll_ns: u64) -> PollBudget {
        PollBudget { until_ns: if poll_ns == 0 { 0 } else { now_ns() + poll_ns } }
    }

    /// Whether this round polls.
    pub(super) fn polling(self) -> bool {
        self.until_ns != 0 && now_ns() < self.until_ns
    }
}

/// One operation of a call: request `req`, of which `done` bytes are transferred.
#[derive(Clone, Copy, Default)]
struct Op {
    req: u32,
    done: u64,
    retries: u32,
}

/// One io_uring instance and its pre-allocated bookkeeping.
struct Ring {
    /// The ring's descriptor registered as the engine's (see `crate::fd`); dropped first.
    _kept: crate::fd::Kept,
    uring: IoUring,
    /// The file is registered with the ring as fixed file 0 (saves a file lookup per I/O).
    fixed_file: bool,
    /// Never entered again (see the module invariants).
    poisoned: bool,
    /// The operations of the current round, indexed by SQE `user_data`.
    cur: Box<[Op]>,
    /// Operations carried over to the next round (short or retried).
    carry: Box<[Op]>,
}

fn new_ring(fd: RawFd, queue_depth: u32) -> io::Result<Ring> {
    // COOP_TASKRUN: completions are processed when we enter the kernel to wait for them
    // anyway, so the kernel need not interrupt the thread (5.19+; plain ring otherwise).
    let uring = match IoUring::builder().dontfork().setup_coop_taskrun().setup_submit_all().build(queue_depth) {
        Ok(r) => r,
        Err(e) if e.raw_os_error() == Some(libc::EINVAL) => IoUring::builder().dontfork().build(queue_depth)?,
        Err(e) => return Err(e),
    };
    let fixed_file = uring.submitter().register_files(&[fd]).is_ok();
    let qd = queue_depth as usize;
    Ok(Ring {
        _kept: crate::fd::keep(uring.as_raw_fd()),
        uring,
        fixed_file,
        poisoned: false,
        cur: vec![Op::default(); qd].into_boxed_slice(),
        carry: vec![Op::default(); qd].into_boxed_slice(),
    })
}

/// The requests of one call, read or write, seen the same way by the I/O loops.
pub(super) trait Batch {
    const WRITE: bool;
    fn count(&self) -> usize;
    fn slot(&self, i: usize) -> u64;
    fn bytes(&self, i: usize) -> u64;
    /// Start of request `i`'s buffer (`bytes(i)` long, page-aligned).
    fn addr(&mut self, i: usize) -> *mut u8;
    fn result_mut(&mut self, i: usize) -> &mut Result<(), BackendError>;
}

impl Batch for [ReadReq<'_>] {
    const WRITE: bool = false;
    fn count(&self) -> usize {
        self.len()
    }
    fn slot(&self, i: usize) -> u64 {
        self[i].slot
    }
    fn bytes(&self, i: usize) -> u64 {
        self[i].nr_pages() * PAGE_SIZE as u64
    }
    fn addr(&mut self, i: usize) -> *mut u8 {
        self[i].buf.as_mut_ptr().cast()
    }
    fn result_mut(&mut self, i: usize) -> &mut Result<(), BackendError> {
        &mut self[i].result
    }
}

impl Batch for [WriteReq<'_>] {
    const WRITE: bool = true;
    fn count(&self) -> usize {
        self.len()
    }
    fn slot(&self, i: usize) -> u64 {
        self[i].slot
    }
    fn bytes(&self, i: usize) -> u64 {
        self[i].data.len_bytes() as u64
    }
    fn addr(&mut self, i: usize) -> *mut u8 {
        // Only ever handed to the kernel as the source of a write.
        self[i].data.as_ptr().cast_mut()
    }
    fn result_mut(&mut self, i: usize) -> &mut Result<(), BackendError> {
        &mut self[i].result
    }
}

/// What to do with an operation after one transfer attempt.
enum Step {
    Done,
    Again,
    Failed(BackendError),
}

/// The device's read and write path: its io_uring instances, and the system calls when
/// none is free or allowed. See the module documentation.
pub(super) struct RingIo {
    rings: Box<[CachePadded<SpinLock<Ring>>]>,
    /// The device's descriptor (`FileBackend` owns it and closes it after this is dropped).
    fd: RawFd,
    nr_slots: u64,
    /// Polling budget of a call before it sleeps (see [`FileOptions::poll_us`]).
    ///
    /// [`FileOptions::poll_us`]: super::FileOptions::poll_us
    poll_ns: u64,
    /// The device's counters (`discard` counts here too).
    pub(super) counters: Counters,
    /// Set in a fork child's copy of the parent's device: system calls only, the rings
    /// being the parent's (see `Backend::enter_fork_child`).
    syscalls_only: AtomicBool,
}

impl RingIo {
    /// The path for the device open on `fd` with `nr_slots` slots: up to `nr_rings` rings of
    /// `queue_depth` entries each, and why there are fewer, if there are.
    pub(super) fn new(
        fd: RawFd,
        nr_slots: u64,
        poll_ns: u64,
        nr_rings: usize,
        queue_depth: u32,
    ) -> (RingIo, Option<io::Error>) {
        let mut rings = Vec::with_capacity(nr_rings);
        let mut ring_error = None;
        for _ in 0..nr_rings {
            match new_ring(fd, queue_depth) {
                Ok(r) => rings.push(CachePadded::new(SpinLock::new(LockClass::DeviceChannel, r))),
                Err(e) => {
                    // io_uring disabled (sysctl kernel.io_uring_disabled, seccomp) or out of
                    // locked memory: serve everything with system calls; say why on request.
                    ring_error = Some(e);
                    break;
                }
            }
        }
        let io = RingIo {
            rings: rings.into_boxed_slice(),
            fd,
            nr_slots,
            poll_ns,
            counters: Counters::default(),
            syscalls_only: AtomicBool::new(false),
        };
        (io, ring_error)
    }

    /// io_uring instances in use.
    pub(super) fn nr_rings(&self) -> usize {
        self.rings.len()
    }

    /// From now on, system calls only (a fork child: the rings are the parent's).
    pub(super) fn enter_fork_child(&self) {
        self.syscalls_only.store(true, Ordering::Relaxed);
    }

    /// Makes each ring give back its registered file now (at the device's drop): a ring is
    /// torn down asynchronously after its descriptor closes, and until then it keeps the
    /// file open.
    pub(super) fn release_files(&self) {
        for ring in self.rings.iter() {
            if let Some(ring) = ring.try_lock() {
                if ring.fixed_file {
                    let _ = ring.uring.submitter().unregister_files();
                }
            }
        }
    }

    /// Sets every request's result to `Ok` or `OutOfRange`; only `Ok` ones are transferred.
    /// Returns how many are to be transferred.
    fn check_ranges<B: Batch + ?Sized>(&self, reqs: &mut B) -> usize {
        let mut todo = 0;
        for i in 0..reqs.count() {
            let nr = reqs.bytes(i) / PAGE_SIZE as u64;
            let slot = reqs.slot(i);
            *reqs.result_mut(i) = match slot.checked_add(nr) {
                Some(end) if end <= self.nr_slots => {
                    todo += usize::from(nr > 0);
                    Ok(())
                }
                _ => Err(BackendError::OutOfRange {
                    slot: slot.saturating_add(nr).saturating_sub(1),
                    nr_slots: self.nr_slots,
                }),
            };
        }
        todo
    }

    /// The common entry of `read` and `write`: a ring if one is free and allowed, otherwise
    /// the system calls. Allocation-free, never waits for a lock.
    pub(super) fn submit<B: Batch + ?Sized>(&self, reqs: &mut B) {
        if self.check_ranges(reqs) == 0 {
            return;
        }
        if locks_held_by_this_thread() == 0 && !self.rings.is_empty() && !self.syscalls_only.load(Ordering::Relaxed) {
            let n = self.rings.len();
            let start = current_cpu() % n;
            for k in 0..n {
                if let Some(mut ring) = self.rings[(start + k) % n].try_lock() {
                    if ring.poisoned {
                        continue;
                    }
                    bump(&self.counters.ring_calls);
                    self.run_ring(&mut ring, reqs);
                    return;
                }
            }
        }
        bump(&self.counters.sync_calls);
        self.run_sync_from(reqs, 0);
    }

    /// Request `i` passed the range check and has something to transfer.
    fn needs_io<B: Batch + ?Sized>(reqs: &mut B, i: usize) -> bool {
        reqs.bytes(i) > 0 && reqs.result_mut(i).is_ok()
    }

    /// Does requests `first..` with system calls.
    fn run_sync_from<B: Batch + ?Sized>(&self, reqs: &mut B, first: usize) {
        for i in first..reqs.count() {
            if Self::needs_io(reqs, i) {
                self.run_sync(reqs, Op { req: i as u32, done: 0, retries: 0 });
            }
        }
    }

    /// Judges one transfer attempt of `op` that returned `res` (bytes, or `-errno`).
    fn step<B: Batch + ?Sized>(&self, reqs: &B, op: &mut Op, res: i64) -> Step {
        let i = op.req as usize;
        let failed_slot = reqs.slot(i) + op.done / PAGE_SIZE as u64;
        if res > 0 {
            op.done += res as u64;
            if op.done >= reqs.bytes(i) {
                return Step::Done;
            }
            bump(&self.counters.short_transfers);
            op.retries = 0;
            return Step::Again;
        }
        let source = if res == 0 {
            // End of file on a read (the file was truncated behind our back), or a write that
            // made no progress.
            io::Error::from(if B::WRITE { io::ErrorKind::WriteZero } else { io::ErrorKind::UnexpectedEof })
        } else {
            let e = (-res) as i32;
            if (e == libc::EINTR || e == libc::EAGAIN) && op.retries < MAX_RETRIES {
                op.retries += 1;
                bump(&self.counters.retries);
                return Step::Again;
            }
            io::Error::from_raw_os_error(e)
        };
        Step::Failed(BackendError::Io { slot: failed_slot, source })
    }

    /// Transfers the rest of `op` with `pread`/`pwrite` and sets its request's result.
    fn run_sync<B: Batch + ?Sized>(&self, reqs: &mut B, mut op: Op) {
        let i = op.req as usize;
        let total = reqs.bytes(i);
        let base = reqs.addr(i);
        let offset = reqs.slot(i) * PAGE_SIZE as u64;
        // Bounded: each round transfers bytes (op.done grows to total) or spends one of the
        // op's MAX_RETRIES (counted in `retries`); anything else fails the request.
        loop {
            let len = (total - op.done).min(MAX_IO_BYTES) as usize;
            // SAFETY: `base + done .. + len` lies inside request i's buffer (`done < total`,
            // `len <= total - done`), which the caller keeps valid and unaliased for this call
            // (an exclusive borrow for reads; engine-owned staging pages for writes). The
            // offset is inside the device (checked by `check_ranges`).
            let r = unsafe {
                let buf = base.add(op.done as usize);
                let off = (offset + op.done) as libc::off_t;
                if B::WRITE {
                    libc::pwrite(self.fd, buf as *const libc::c_void, len, off)
                } else {
                    libc::pread(self.fd, buf.cast(), len, off)
                }
            };
            let res = if r < 0 { -(errno() as i64) } else { r as i64 };
            match self.step(reqs, &mut op, res) {
                Step::Done => return,
                Step::Again => {
                    if res == -(libc::EAGAIN as i64) {
                        std::thread::yield_now();
                    }
                }
                Step::Failed(e) => {
                    *reqs.result_mut(i) = Err(e);
                    return;
                }
            }
        }
    }

    /// Builds the SQE for the next transfer of `op`, tagged with `user_data`.
    fn sqe<B: Batch + ?Sized>(&self, fixed_file: bool, reqs: &mut B, op: &Op, user_data: u64) -> squeue::Entry {
        let i = op.req as usize;
        let len = (reqs.bytes(i) - op.done).min(MAX_IO_BYTES) as u32;
        // `wrapping_add` keeps this function free of unsafe; `done < bytes(i)`, so the result
        // is inside the request's buffer.
        let buf = reqs.addr(i).wrapping_add(op.done as usize);
        let offset = reqs.slot(i) * PAGE_SIZE as u64 + op.done;
        macro_rules! build {
            ($fd:expr) => {
                if B::WRITE {
                    opcode::Write::new($fd, buf, len).offset(offset).build()
                } else {
                    opcode::Read::new($fd, buf, len).offset(offset).build()
                }
            };
        }
        let e = if fixed_file { build!(types::Fixed(0)) } else { build!(types::Fd(self.fd)) };
        e.user_data(user_data)
    }

    /// Does the requests of one call on `ring`, in rounds of at most `queue_depth`
    /// operations, each round one `io_uring_enter` that submits and waits for all.
    fn run_ring<B: Batch + ?Sized>(&self, ring: &mut Ring, reqs: &mut B) {
        let qd = ring.cur.len();
        let n = reqs.count();
        let mut next_req = 0;
        let mut nr_carried = 0;
        // Bounded: an operation is carried over only after a short transfer (progress) or a
        // retry (at most MAX_RETRIES each, see `step`), and new requests are finite.
        loop {
            // Fill the round: carried-over operations first, then new requests.
            let mut k = 0;
            while k < nr_carried {
                ring.cur[k] = ring.carry[k];
                k += 1;
            }
            while k < qd && next_req < n {
                if Self::needs_io(reqs, next_req) {
                    ring.cur[k] = Op { req: next_req as u32, done: 0, retries: 0 };
                    k += 1;
                }
                next_req += 1;
            }
            if k == 0 {
                return;
            }
            let mut pushed = 0;
            {
                let fixed_file = ring.fixed_file;
                let mut sq = ring.uring.submission();
                while pushed < k {
                    let e = self.sqe(fixed_file, reqs, &ring.cur[pushed], pushed as u64);
                    // SAFETY: the entry points into request `req`'s buffer, valid for `len`
                    // bytes for the whole call (see `run_sync`); this function reaps every
                    // submitted entry before it returns, and entries never submitted stay in
                    // a poisoned ring that is never entered again (module invariants), so the
                    // kernel never touches the buffer after the call.
                    if unsafe { sq.push(&e) }.is_err() {
                        break; // Cannot happen: the queue is empty and holds >= qd entries.
                    }
                    pushed += 1;
                }
            } // Dropping the SubmissionQueue publishes the new tail to the kernel.
            for j in pushed..k {
                let op = ring.cur[j];
                self.run_sync(reqs, op);
            }
            nr_carried = self.complete_round(ring, reqs, pushed);
            if ring.poisoned {
                for j in 0..nr_carried {
                    let op = ring.carry[j];
                    self.run_sync(reqs, op);
                }
                self.run_sync_from(reqs, next_req);
                return;
            }
        }
    }

    /// Submits the `pushed` queued entries, waits for all their completions and handles them.
    /// Returns how many operations were carried over to `ring.carry` for another round.
    fn complete_round<B: Batch + ?Sized>(&self, ring: &mut Ring, reqs: &mut B, pushed: usize) -> usize {
        let mut unsubmitted = pushed;
        let mut outstanding = 0usize;
        let mut nr_carried = 0;
        let mut stalls = 0;
        let budget = PollBudget::start(self.poll_ns);
        // Submitting is bounded by MAX_STALLS (then the ring is poisoned, `rings_poisoned`).
        // Waiting for submitted operations has no bound on purpose: the kernel owns the
        // caller's buffers until it completes them, so this cannot return before it does
        // (unlike `FileAsyncReader`, which can leak its own buffer); an I/O that never
        // completes hangs here as it would hang a kernel page fault.
        while unsubmitted > 0 || outstanding > 0 {
            let polling = budget.polling();
            let mut progress = enter(ring, &mut unsubmitted, &mut outstanding, polling);
            if self.reap(ring, reqs, pushed, &mut outstanding, &mut nr_carried) {
                progress = true;
            }
            // (A polling round that finds nothing yet is not a stall.)
            stalls = if progress || (polling && unsubmitted == 0) { 0 } else { stalls + 1 };
            if polling && !progress {
                std::hint::spin_loop();
            }
            if stalls >= MAX_STALLS && unsubmitted > 0 {
                ring.poisoned = true; // The kernel takes nothing: same as a refusal.
            }
            if ring.poisoned && unsubmitted > 0 {
                self.abandon_round(ring, reqs, pushed, unsubmitted, &mut outstanding, &mut nr_carried);
                return nr_carried;
            }
        }
        nr_carried
    }

    /// The ring was poisoned with `unsubmitted` of the round's `pushed` entries still queued
    /// (the last ones, in order): waits for the submitted ones without submitting anything
    /// more, then does the queued ones with system calls.
    fn abandon_round<B: Batch + ?Sized>(
        &self,
        ring: &mut Ring,
        reqs: &mut B,
        pushed: usize,
        unsubmitted: usize,
        outstanding: &mut usize,
        nr_carried: &mut usize,
    ) {
        bump(&self.counters.rings_poisoned);
        if *outstanding > 0 {
            self.wait_outstanding(ring, reqs, pushed, outstanding, nr_carried);
        }
        for j in pushed - unsubmitted..pushed {
            let op = ring.cur[j];
            self.run_sync(reqs, op);
        }
    }

    /// For a poisoned ring: waits until the `outstanding` submitted operations complete,
    /// never submitting the entries still queued.
    fn wait_outstanding<B: Batch + ?Sized>(
        &self,
        ring: &mut Ring,
        reqs: &mut B,
        pushed: usize,
        outstanding: &mut usize,
        nr_carried: &mut usize,
    ) {
        // Not bounded, on purpose: see `complete_round` (the kernel owns the buffers).
        while *outstanding > 0 {
            // SAFETY: to_submit is 0, so nothing queued is submitted; no signal mask.
            let r = unsafe {
                ring.uring.submitter().enter::<libc::sigset_t>(
                    0,
                    *outstanding as u32,
                    EnterFlags::GETEVENTS.bits(),
                    None,
                )
            };
            if r.is_err() {
                std::thread::yield_now();
            }
            self.reap(ring, reqs, pushed, outstanding, nr_carried);
        }
    }

    /// Handles the completions waiting in the ring's completion queue: finished operations
    /// set their request's result, short or retried ones go to `ring.carry`. Returns whether
    /// there were any.
    fn reap<B: Batch + ?Sized>(
        &self,
        ring: &mut Ring,
        reqs: &mut B,
        pushed: usize,
        outstanding: &mut usize,
        nr_carried: &mut usize,
    ) -> bool {
        let mut any = false;
        let Ring { uring, cur, carry, .. } = ring;
        for cqe in uring.completion() {
            // Indexing is checked without panicking: a panic here would unwind with
            // operations in flight.
            let idx = cqe.user_data() as usize;
            let Some(mut op) = cur.get(..pushed).and_then(|c| c.get(idx)).copied() else {
                continue; // Not ours (cannot happen: the ring is empty between calls).
            };
            *outstanding = outstanding.saturating_sub(1);
            any = true;
            match self.step(reqs, &mut op, cqe.result() as i64) {
                Step::Done => {}
                Step::Again => match carry.get_mut(*nr_carried) {
                    Some(c) => {
                        *c = op;
                        *nr_carried += 1;
                    }
                    None => self.run_sync(reqs, op), // Cannot happen: one carry per op.
                },
                Step::Failed(e) => *reqs.result_mut(op.req as usize) = Err(e),
            }
        }
        any
    }
}

/// One `io_uring_enter` of a round: submits the `unsubmitted` queued entries and, unless
/// `polling`, waits for all the round's operations. Moves what the kernel took from
/// `unsubmitted` to `outstanding`; poisons the ring if the kernel refuses the queued
/// entries. Returns whether it submitted anything.
fn enter(ring: &mut Ring, unsubmitted: &mut usize, outstanding: &mut usize, polling: bool) -> bool {
    let want = (*unsubmitted + *outstanding) as u32;
    let min_complete = if polling { 0 } else { want };
    // SAFETY: no signal mask argument (a null pointer of size 0); the queued entries
    // are valid (see `run_ring`).
    let r = unsafe {
        ring.uring.submitter().enter::<libc::sigset_t>(
            *unsubmitted as u32,
            min_complete,
            EnterFlags::GETEVENTS.bits(),
            None,
        )
    };
    match r {
        Ok(submitted) => {
            let s = submitted.min(*unsubmitted);
            *unsubmitted -= s;
            *outstanding += s;
            s > 0
        }
        Err(e) => {
            match e.raw_os_error() {
                Some(libc::EINTR) => {}
                Some(libc::EAGAIN | libc::EBUSY) => std::thread::yield_now(),
                _ if *unsubmitted > 0 => {
                    // The kernel refuses the queued entries: give the ring up (never enter
                    // it again) and do them with system calls once the submitted ones are
                    // back. They are the last `unsubmitted` of this round, in order.
                    ring.poisoned = true;
                }
                _ => std::thread::yield_now(),
            }
            false
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::tests::{
        opts, page_bytes, random_runs, read_and_verify, stage, staging, write_private, write_runs, zero_pages, Rng,
        TestDir, MIB,
    };
    use super::*;
    use crate::backend::file::{FileBackend, FileOptions, FileStats};
    use crate::backend::{AlignedPage, Backend};
    use crate::sync::{LockClass, SpinLock};
    use arrayvec::ArrayVec;
    use std::fs;
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::{Arc, Barrier};

    /// Counts heap operations per thread, so a test can prove a code path allocates nothing
    /// while other tests run in parallel on other threads.
    mod alloc_count {
        use std::alloc::{GlobalAlloc, Layout, System};
        use std::cell::Cell;

        thread_local! {
            // const, no destructor: usable from inside the allocator.
            static OPS: Cell<u64> = const { Cell::new(0) };
        }

        fn bump() {
            let _ = OPS.try_with(|c| c.set(c.get() + 1));
        }

        /// Allocations, reallocations and frees made by the calling thread so far.
        pub fn this_thread() -> u64 {
            OPS.try_with(|c| c.get()).unwrap_or(0)
        }

        pub struct Counting;

        // SAFETY: forwards every call unchanged to the system allocator.
        unsafe impl GlobalAlloc for Counting {
            unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
                bump();
                // SAFETY: same contract as ours.
                unsafe { System.alloc(layout) }
            }
            unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
                bump();
                // SAFETY: same contract as ours.
                unsafe { System.alloc_zeroed(layout) }
            }
            unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
                bump();
                // SAFETY: same contract as ours.
                unsafe { System.dealloc(ptr, layout) }
            }
            unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
                bump();
                // SAFETY: same contract as ours.
                unsafe { System.realloc(ptr, layout, new_size) }
            }
        }

        #[global_allocator]
        static COUNTING: Counting = Counting;
    }

    /// Many random runs, written and read back in random batches of up to 40 requests (ten
    /// times the queue depth of 4), twice with overwrites; every byte checked.
    fn round_trip(options: FileOptions, seed: u64) -> FileStats {
        let dir = TestDir::new("rt");
        let b = FileBackend::open(dir.path(), 8 * MIB, options).unwrap();
        let nr = b.nr_slots();
        assert_eq!(nr, 2048);
        let src = staging(nr);
        let mut rng = Rng(seed);
        let runs = random_runs(&mut rng, 0, nr, 40);
        let mut gen = vec![0u64; runs.len()];
        for round in 1..=3u64 {
            // Overwrite a random half of the runs (all of them the first time).
            let mut order: Vec<usize> = (0..runs.len()).filter(|_| round == 1 || rng.below(2) == 0).collect();
            rng.shuffle(&mut order);
            for batch in order.chunks(1 + rng.below(40) as usize) {
                let rs: Vec<_> = batch.iter().map(|&i| runs[i]).collect();
                let gs: Vec<_> = batch.iter().map(|&i| round * 1000 + i as u64).collect();
                write_runs(&b, &src, &rs, &gs);
                for &i in batch {
                    gen[i] = round * 1000 + i as u64;
                }
            }
            let mut order: Vec<usize> = (0..runs.len()).collect();
            rng.shuffle(&mut order);
            let mut i = 0;
            while i < order.len() {
                let k = (1 + rng.below(40) as usize).min(order.len() - i);
                let rs: Vec<_> = order[i..i + k].iter().map(|&j| runs[j]).collect();
                let gs: Vec<_> = order[i..i + k].iter().map(|&j| gen[j]).collect();
                read_and_verify(&b, &rs, &gs);
                i += k;
            }
        }
        b.stats()
    }

    #[test]
    fn round_trip_through_io_uring_with_batches_beyond_the_queue_depth() {
        let st = round_trip(opts(4, 1), 0x1234_5678);
        assert!(st.ring_calls > 0);
        assert_eq!(st.sync_calls, 0, "one thread, one free ring: every call should use it");
    }

    #[test]
    fn round_trip_sleeping_and_polling_for_completions() {
        // 0: every wait sleeps in the kernel. A budget longer than any test: every wait polls
        // until its completions are in (a polling round that finds nothing is not a stall).
        for (poll_us, seed) in [(0, 0x0bad_cafe), (10_000_000, 0x0dd_ba11)] {
            let st = round_trip(FileOptions { poll_us, ..opts(4, 1) }, seed);
            assert!(st.ring_calls > 0, "poll_us {poll_us}");
            assert_eq!(st.sync_calls, 0, "poll_us {poll_us}: the ring was given up");
        }
    }

    #[test]
    fn round_trip_through_the_syscall_fallback() {
        let st = round_trip(opts(4, 0), 0x8765_4321);
        assert_eq!(st.ring_calls, 0);
        assert!(st.sync_calls > 0);
    }

    #[test]
    fn concurrent_readers_and_writers_on_disjoint_slots() {
        let dir = TestDir::new("conc");
        let b = Arc::new(FileBackend::open(dir.path(), 8 * MIB, opts(8, 2)).unwrap());
        let nr_threads = 4u64;
        let per = b.nr_slots() / nr_threads;
        let iters = 60;
        let threads: Vec<_> = (0..nr_threads)
            .map(|t| {
                let b = b.clone();
                std::thread::spawn(move || {
                    let src = staging(b.nr_slots());
                    let mut rng = Rng(0x9E37 + t);
                    for it in 0..iters {
                        let runs = random_runs(&mut rng, t * per, (t + 1) * per, 24);
                        let k = 1 + rng.below(runs.len() as u64) as usize;
                        let start = rng.below((runs.len() - k + 1) as u64) as usize;
                        let rs = &runs[start..start + k];
                        let gs: Vec<u64> = (0..k as u64).map(|i| it * 100 + i).collect();
                        write_runs(&b, &src, rs, &gs);
                        read_and_verify(&b, rs, &gs);
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        let st = b.stats();
        assert_eq!(st.ring_calls + st.sync_calls, nr_threads * iters * 2);
    }

    #[test]
    fn busy_ring_and_held_engine_lock_fall_back_to_syscalls() {
        let dir = TestDir::new("busy");
        let b = Arc::new(FileBackend::open(dir.path(), 2 * MIB, opts(4, 1)).unwrap());
        let src = staging(b.nr_slots());
        let runs = [(3, 5), (20, 1), (100, 32)];

        // Another thread holds the only ring: reads and writes go around it, at once.
        let held = Arc::new(Barrier::new(2));
        let release = Arc::new(Barrier::new(2));
        let holder = {
            let (b, held, release) = (b.clone(), held.clone(), release.clone());
            std::thread::spawn(move || {
                let _g = b.io.rings[0].try_lock().expect("ring free");
                held.wait();
                release.wait();
            })
        };
        held.wait();
        let before = b.stats();
        write_runs(&b, &src, &runs, &[1, 2, 3]);
        read_and_verify(&b, &runs, &[1, 2, 3]);
        let after = b.stats();
        assert_eq!(after.sync_calls - before.sync_calls, 2);
        assert_eq!(after.ring_calls, before.ring_calls);
        release.wait();
        holder.join().unwrap();

        // This thread holds an engine lock (as if a signal interrupted engine code): the
        // ring is free, but it must not be used.
        let engine_lock = SpinLock::new(LockClass::AsyncReadaheadContext, ());
        let g = engine_lock.lock();
        read_and_verify(&b, &runs, &[1, 2, 3]);
        drop(g);
        let st = b.stats();
        assert_eq!(st.sync_calls - after.sync_calls, 1);
        assert_eq!(st.ring_calls, after.ring_calls);

        // And with nothing held the ring is used again.
        read_and_verify(&b, &runs, &[1, 2, 3]);
        assert_eq!(b.stats().ring_calls, st.ring_calls + 1);
    }

    #[test]
    fn no_allocation_on_the_read_and_write_paths() {
        let dir = TestDir::new("alloc");
        let b = Arc::new(FileBackend::open(dir.path(), 2 * MIB, opts(4, 1)).unwrap());
        let src = staging(b.nr_slots());
        stage(&src, 0, 64, 7);
        let mut buf = zero_pages(64);
        let engine_lock = SpinLock::new(LockClass::AsyncReadaheadContext, ());
        let (held, release) = (Arc::new(Barrier::new(2)), Arc::new(AtomicBool::new(false)));

        // Everything below runs once to warm up (the ring's first use, lazily initialised
        // thread-locals), then again under the allocation counter.
        let pass = |b: &FileBackend, buf: &mut [AlignedPage], hold_engine_lock: bool| {
            // Ten two-page writes and reads: more than the queue depth of 4.
            let mut w: ArrayVec<WriteReq<'_>, 10> =
                (0..10).map(|i| WriteReq::new(i * 4, src.pages(i as usize * 4 * PAGE_SIZE, 2))).collect();
            let g = hold_engine_lock.then(|| engine_lock.lock());
            b.write(&mut w);
            drop(g);
            assert!(w.iter().all(|r| r.result.is_ok()));
            let mut r: ArrayVec<ReadReq<'_>, 10> =
                buf.chunks_mut(2).take(10).enumerate().map(|(i, c)| ReadReq::new(i as u64 * 4, c)).collect();
            let g = hold_engine_lock.then(|| engine_lock.lock());
            b.read(&mut r);
            drop(g);
            assert!(r.iter().all(|r| r.result.is_ok()));
            drop(r);
            // An out-of-range request fails without allocating either.
            let mut r = [ReadReq::new(b.nr_slots() - 1, &mut buf[..2])];
            b.read(&mut r);
            assert!(matches!(r[0].result, Err(BackendError::OutOfRange { .. })));
        };
        pass(&b, &mut buf, false);
        pass(&b, &mut buf, true);

        let go = Arc::new(Barrier::new(2));
        let holder = {
            let (b, go, held, release) = (b.clone(), go.clone(), held.clone(), release.clone());
            std::thread::spawn(move || {
                go.wait();
                let _g = b.io.rings[0].try_lock().expect("ring free");
                held.wait();
                while !release.load(Ordering::Acquire) {
                    std::thread::yield_now();
                }
            })
        };
        let before_stats = b.stats();
        let before = alloc_count::this_thread();
        pass(&b, &mut buf, false); // io_uring
        pass(&b, &mut buf, true); // engine lock held: syscalls
        go.wait(); // (Barrier::wait does not allocate)
        held.wait();
        pass(&b, &mut buf, false); // ring busy: syscalls
        let allocs = alloc_count::this_thread() - before;
        release.store(true, Ordering::Release);
        holder.join().unwrap();
        assert_eq!(allocs, 0, "the read/write paths allocated or freed {allocs} times");
        let st = b.stats();
        // (The out-of-range reads need no I/O and take neither route.)
        assert_eq!(st.ring_calls - before_stats.ring_calls, 2);
        assert_eq!(st.sync_calls - before_stats.sync_calls, 4);
        for (i, p) in buf.iter().take(20).enumerate() {
            let slot = (i / 2 * 4 + i % 2) as u64;
            assert!(p.0 == page_bytes(slot, 7), "slot {slot}");
        }
    }

    #[test]
    fn a_ring_the_kernel_refuses_is_given_up_and_the_call_still_succeeds() {
        let dir = TestDir::new("poison");
        let b = FileBackend::open(dir.path(), 2 * MIB, opts(4, 1)).unwrap();
        // Make the ring's descriptor number refer to /dev/null: io_uring_enter then fails
        // with an error that is neither EINTR nor EAGAIN, with the first round still queued.
        let null = fs::File::open("/dev/null").unwrap();
        {
            let ring = b.io.rings[0].try_lock().unwrap();
            // SAFETY: replaces the ring's descriptor number with /dev/null. The ring's
            // memory stays mapped (the mappings keep the io_uring alive) and the IoUring
            // closes the number on drop, which then closes /dev/null: nothing dangles.
            assert!(unsafe { libc::dup2(null.as_raw_fd(), ring.uring.as_raw_fd()) } >= 0);
        }
        let src = staging(b.nr_slots());
        let runs: Vec<(u64, u64)> = (0..10).map(|i| (i * 8, 1 + i % 3)).collect();
        let gens: Vec<u64> = (0..10).collect();
        write_runs(&b, &src, &runs, &gens); // 10 requests: rounds of 4, the first one refused
        let st = b.stats();
        assert_eq!((st.ring_calls, st.rings_poisoned), (1, 1));
        assert!(b.io.rings[0].try_lock().unwrap().poisoned);
        // The poisoned ring is never used again: later calls use the system calls.
        read_and_verify(&b, &runs, &gens);
        assert_eq!(b.stats().sync_calls, 1);
        assert_eq!(b.stats().ring_calls, 1);
    }

    #[test]
    fn empty_requests_succeed_without_io() {
        let dir = TestDir::new("empty");
        for rings in [1, 0] {
            let b = FileBackend::open(dir.path(), 2 * MIB, opts(4, rings)).unwrap();
            let src = staging(b.nr_slots());
            stage(&src, 7, 1, 3);
            let mut w = [WriteReq::new(5, src.pages(0, 0)), WriteReq::new(7, src.pages(7 * PAGE_SIZE, 1))];
            b.write(&mut w);
            assert!(w.iter().all(|r| r.result.is_ok()));
            let mut buf = zero_pages(1);
            // (ReadReq::new refuses an empty buffer in debug builds; the engine never makes one.)
            let mut r = [ReadReq { slot: 9, buf: &mut [], result: Ok(()) }, ReadReq::new(7, &mut buf)];
            b.read(&mut r);
            assert!(r.iter().all(|r| r.result.is_ok()));
            assert!(buf[0].0 == page_bytes(7, 3));
        }
    }

    #[test]
    fn short_reads_are_continued_and_end_of_file_names_the_slot() {
        let dir = TestDir::new("short");
        let path = dir.path().join("swapfile");
        write_private(&path, b"");
        for rings in [1, 0] {
            let b = FileBackend::open(&path, 2 * MIB, FileOptions { preallocate: false, ..opts(4, rings) }).unwrap();
            let src = staging(b.nr_slots());
            write_runs(&b, &src, &[(500, 12)], &[9]);
            // Someone cuts the file short behind our back: 2 of the 4 pages of the last
            // request are past the end.
            fs::OpenOptions::new().write(true).open(&path).unwrap().set_len(510 * PAGE_SIZE as u64).unwrap();
            let mut buf = zero_pages(8);
            let (a, c) = buf.split_at_mut(4);
            let mut r = [ReadReq::new(500, a), ReadReq::new(508, c)];
            b.read(&mut r);
            assert!(r[0].result.is_ok());
            match &r[1].result {
                Err(BackendError::Io { slot: 510, source }) => {
                    assert_eq!(source.kind(), io::ErrorKind::UnexpectedEof)
                }
                other => panic!("expected an I/O error on slot 510, got {other:?}"),
            }
            assert!(b.stats().short_transfers >= 1);
            assert!(buf[..4].iter().enumerate().all(|(i, p)| p.0 == page_bytes(500 + i as u64, 9)));
            assert!(buf[4..6].iter().enumerate().all(|(i, p)| p.0 == page_bytes(508 + i as u64, 9)));
            drop(b);
            fs::OpenOptions::new().write(true).open(&path).unwrap().set_len(0).unwrap();
        }
    }
}
