//! Asynchronous readahead on the file device: [`FileAsyncReader`], the device's
//! [`AsyncReader`].
//!
//! # Job
//!
//! Reads the runs of a readahead window into a buffer of its own with an io_uring of its
//! own, on a duplicate of the device's descriptor, while the application works; short or
//! interrupted reads are finished with `pread`.
//!
//! # Locking rules
//!
//! Like every [`AsyncReader`], its methods may run inside a SIGBUS handler: after it is built
//! it allocates nothing and takes no lock. It is used through `&mut self` by its one owner.
//!
//! # Invariants
//!
//! The kernel writes into the buffer only while `in_flight > 0`, and nothing hands the
//! buffer out while it is (see the type's soundness note).

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};

use io_uring::{opcode, types, EnterFlags, IoUring};

use super::ring::{errno, PollBudget, MAX_RETRIES, MAX_STALLS};
use crate::backend::{AlignedPage, AsyncReader, AsyncRun, BackendError};
use crate::uffd::PAGE_SIZE;

/// The file device's [`AsyncReader`]: an io_uring and a buffer of its own, and a duplicate of
/// the device's descriptor (so that it can finish its reads whatever order things are
/// dropped in at shutdown).
///
/// Soundness: the kernel writes into `buf` from `start` until the last completion is reaped
/// in `wait_all`; `in_flight > 0` over exactly that time, and every accessor of the buffer
/// refuses while it is. `Drop` waits too. If the ring cannot be waited on (the kernel
/// refusing `io_uring_enter` [`MAX_STALLS`] times in a row) the buffer is leaked rather than
/// freed under a read, and the reader refuses all further work.
pub struct FileAsyncReader {
    /// `uring` and `file` registered as the engine's (see `crate::fd`); dropped first.
    _kept: [crate::fd::Kept; 2],
    uring: IoUring,
    file: OwnedFd,
    nr_slots: u64,
    buf: Box<[AlignedPage]>,
    /// The runs of the last `start`; `runs[..nr_runs]`.
    runs: Box<[AsyncRun]>,
    nr_runs: usize,
    /// Per run: bytes transferred so far, and the errno it failed with (0: none).
    done: Box<[u64]>,
    failed: Box<[i32]>,
    /// Reads submitted and not yet reaped.
    in_flight: usize,
    /// The ring refused work: never entered again, `start` refuses.
    broken: bool,
    /// Polling budget of a wait before it sleeps (see [`FileOptions::poll_us`]).
    ///
    /// [`FileOptions::poll_us`]: super::FileOptions::poll_us
    poll_ns: u64,
}

impl FileAsyncReader {
    pub(super) fn new(fd: RawFd, nr_slots: u64, nr_pages: usize, poll_ns: u64) -> io::Result<FileAsyncReader> {
        let nr_pages = nr_pages.max(1);
        // SAFETY: F_DUPFD_CLOEXEC on our open descriptor returns a new descriptor we own.
        let dup = unsafe { libc::fcntl(fd, libc::F_DUPFD_CLOEXEC, crate::fd::fd_base()) };
        if dup < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: `dup` is a fresh descriptor owned by nobody else.
        let file = unsafe { OwnedFd::from_raw_fd(dup) };
        let uring = match IoUring::builder().dontfork().setup_coop_taskrun().build(nr_pages as u32) {
            Ok(r) => r,
            Err(e) if e.raw_os_error() == Some(libc::EINVAL) => IoUring::builder().dontfork().build(nr_pages as u32)?,
            Err(e) => return Err(e),
        };
        Ok(FileAsyncReader {
            _kept: [crate::fd::keep(uring.as_raw_fd()), crate::fd::keep(file.as_raw_fd())],
            uring,
            file,
            nr_slots,
            buf: vec![AlignedPage([0; PAGE_SIZE]); nr_pages].into_boxed_slice(),
            runs: vec![AsyncRun { slot: 0, first_page: 0, nr_pages: 0 }; nr_pages].into_boxed_slice(),
            nr_runs: 0,
            done: vec![0; nr_pages].into_boxed_slice(),
            failed: vec![0; nr_pages].into_boxed_slice(),
            in_flight: 0,
            broken: false,
            poll_ns,
        })
    }

    fn run_bytes(&self, i: usize) -> u64 {
        (self.runs[i].nr_pages * PAGE_SIZE) as u64
    }

    /// Reads the rest of run `i` with `pread` (after a short or interrupted read).
    fn finish_sync(&mut self, i: usize) {
        let run = self.runs[i];
        let total = self.run_bytes(i);
        let mut retries = 0;
        // Bounded: each round reads something (done grows) or spends one of MAX_RETRIES.
        while self.done[i] < total {
            let done = self.done[i];
            let at = run.first_page * PAGE_SIZE + done as usize;
            let fd = self.file.as_raw_fd();
            let Some(dst) = self.buf_bytes_mut().get_mut(at..at + (total - done) as usize) else {
                self.failed[i] = libc::EINVAL; // Cannot happen: `start` checked the run.
                return;
            };
            // SAFETY: `dst` is a live, exclusively borrowed part of our buffer, `dst.len()`
            // bytes long; nothing else is reading into this run (its CQE was reaped).
            let r = unsafe {
                libc::pread(fd, dst.as_mut_ptr().cast(), dst.len(), (run.slot * PAGE_SIZE as u64 + done) as libc::off_t)
            };
            if r > 0 {
                self.done[i] += r as u64;
                continue;
            }
            let e = if r == 0 { libc::ENODATA } else { errno() };
            if (e == libc::EINTR || e == libc::EAGAIN) && retries < MAX_RETRIES {
                retries += 1;
                continue;
            }
            self.failed[i] = e;
            return;
        }
    }

    fn buf_bytes_mut(&mut self) -> &mut [u8] {
        let len = self.buf.len() * PAGE_SIZE;
        // SAFETY: `AlignedPage` is `repr(C)` around `[u8; PAGE_SIZE]`, so the slice of pages
        // is `len` contiguous, initialised bytes, borrowed exclusively through `self`.
        unsafe { std::slice::from_raw_parts_mut(self.buf.as_mut_ptr().cast::<u8>(), len) }
    }

    /// Queues one read per run into the ring, each into the run's place in the buffer
    /// (`start` checked that the runs lie in it). False if the queue had no room, which
    /// cannot happen: it has one entry per buffer page.
    fn queue_reads(&mut self, runs: &[AsyncRun]) -> bool {
        debug_assert_eq!(self.in_flight, 0, "the buffer is not the kernel's while queueing");
        let fd = types::Fd(self.file.as_raw_fd());
        let base = self.buf.as_mut_ptr().cast::<u8>();
        let mut sq = self.uring.submission();
        for (i, r) in runs.iter().enumerate() {
            // `wrapping_add` keeps this free of unsafe; the run was checked to lie in the
            // buffer.
            let dst = base.wrapping_add(r.first_page * PAGE_SIZE);
            let e = opcode::Read::new(fd, dst, (r.nr_pages * PAGE_SIZE) as u32)
                .offset(r.slot * PAGE_SIZE as u64)
                .build()
                .user_data(i as u64);
            // SAFETY: the entry points into our buffer, which stays allocated and is
            // handed to nobody until `wait_all` has reaped every completion (see the
            // type's soundness note). The queue has one entry per buffer page, so it
            // has room for every run.
            if unsafe { sq.push(&e) }.is_err() {
                return false;
            }
        }
        true
    }

    /// Submits the `nr` queued reads. Returns how many the kernel took. Bounded: every
    /// round submits something or spends one of MAX_RETRIES (a submit that takes nothing
    /// is a stall like EAGAIN; it would otherwise repeat for ever).
    fn submit_all(&mut self, nr: usize) -> usize {
        let mut submitted = 0;
        let mut retries = 0;
        while submitted < nr {
            match self.uring.submit() {
                Ok(n) if n > 0 => {
                    submitted += n;
                    continue;
                }
                Ok(_) => {} // Took nothing: a stall, like EAGAIN.
                Err(e) if matches!(e.raw_os_error(), Some(libc::EINTR | libc::EAGAIN | libc::EBUSY)) => {}
                Err(_) => break,
            }
            retries += 1;
            if retries > MAX_RETRIES {
                break;
            }
            std::thread::yield_now();
        }
        submitted
    }

    /// Reaps completions until nothing is in flight.
    fn wait_all(&mut self) {
        let mut stalls = 0;
        let budget = PollBudget::start(self.poll_ns);
        // Bounded: MAX_STALLS failed waits in a row give the buffer up (leaked, the reader
        // broken) rather than wait on for completions that may never come.
        while self.in_flight > 0 {
            let mut reaped = 0;
            // Collect first: finishing a run needs `&mut self`.
            let mut finished = [(0usize, 0i32); 16];
            for cqe in self.uring.completion().take(finished.len()) {
                finished[reaped] = (cqe.user_data() as usize, cqe.result());
                reaped += 1;
            }
            for &(i, res) in &finished[..reaped] {
                self.in_flight -= 1;
                if i >= self.nr_runs {
                    continue; // Not ours (cannot happen).
                }
                if res > 0 {
                    self.done[i] += res as u64;
                    if self.done[i] < self.run_bytes(i) {
                        self.finish_sync(i);
                    }
                } else if res == -libc::EINTR || res == -libc::EAGAIN {
                    self.finish_sync(i);
                } else {
                    self.failed[i] = if res == 0 { libc::ENODATA } else { -res };
                }
            }
            if self.in_flight == 0 || reaped > 0 {
                stalls = 0;
                continue;
            }
            let polling = budget.polling();
            let min_complete = if polling { 0 } else { self.in_flight as u32 };
            // SAFETY: nothing to submit, no signal mask.
            let r = unsafe {
                self.uring.submitter().enter::<libc::sigset_t>(0, min_complete, EnterFlags::GETEVENTS.bits(), None)
            };
            if polling {
                std::hint::spin_loop();
            }
            if r.is_err() {
                stalls += 1;
                if stalls >= MAX_STALLS {
                    // We can no longer know when the kernel is done with the buffer.
                    let buf = std::mem::take(&mut self.buf);
                    std::mem::forget(buf);
                    for f in &mut self.failed[..self.nr_runs] {
                        if *f == 0 {
                            *f = libc::EIO;
                        }
                    }
                    self.in_flight = 0;
                    self.broken = true;
                    return;
                }
                std::thread::yield_now();
            }
        }
    }
}

impl AsyncReader for FileAsyncReader {
    fn capacity_pages(&self) -> usize {
        self.buf.len()
    }

    fn start(&mut self, runs: &[AsyncRun]) -> bool {
        if self.in_flight > 0 || self.broken || runs.is_empty() || runs.len() > self.runs.len() {
            return false;
        }
        let cap = self.buf.len();
        let valid = |r: &AsyncRun| {
            r.nr_pages > 0
                && r.first_page.checked_add(r.nr_pages).is_some_and(|end| end <= cap)
                && r.slot.checked_add(r.nr_pages as u64).is_some_and(|end| end <= self.nr_slots)
        };
        if !runs.iter().all(valid) {
            return false;
        }
        self.runs[..runs.len()].copy_from_slice(runs);
        self.nr_runs = runs.len();
        self.done[..runs.len()].fill(0);
        self.failed[..runs.len()].fill(0);
        if !self.queue_reads(runs) {
            return false; // Cannot happen (see `queue_reads`); nothing was submitted.
        }
        let submitted = self.submit_all(runs.len());
        // The ring held nothing else (a ring left with queued entries is broken, and `start`
        // refuses it), so the kernel took no more than these: `in_flight` counts exactly the
        // reads that may write into the buffer (the type's soundness note).
        debug_assert!(submitted <= runs.len(), "the kernel took only the reads queued");
        self.in_flight = submitted;
        if submitted < runs.len() {
            // The kernel refused the rest: they stay queued in a ring that is never entered
            // again, so it never reads into the buffer for them.
            self.broken = true;
            for f in &mut self.failed[submitted..runs.len()] {
                *f = libc::EIO;
            }
            if submitted == 0 {
                return false;
            }
        }
        true
    }

    fn in_flight(&self) -> bool {
        self.in_flight > 0
    }

    fn wait(&mut self, results: &mut [Result<(), BackendError>]) {
        self.wait_all();
        for (i, res) in results.iter_mut().enumerate().take(self.nr_runs) {
            *res = match self.failed[i] {
                0 => Ok(()),
                e => Err(BackendError::Io {
                    slot: self.runs[i].slot + self.done[i] / PAGE_SIZE as u64,
                    source: io::Error::from_raw_os_error(e),
                }),
            };
        }
    }

    fn pages(&self) -> Option<&[AlignedPage]> {
        (self.in_flight == 0 && !self.buf.is_empty()).then_some(&self.buf[..])
    }

    fn pages_mut(&mut self) -> Option<&mut [AlignedPage]> {
        (self.in_flight == 0 && !self.buf.is_empty()).then_some(&mut self.buf[..])
    }
}

impl Drop for FileAsyncReader {
    fn drop(&mut self) {
        self.wait_all();
    }
}

#[cfg(test)]
mod tests {
    use super::super::tests::{opts, page_bytes, staging, write_runs, TestDir, MIB};
    use super::*;
    use crate::backend::file::FileBackend;
    use crate::backend::Backend;

    #[test]
    fn async_reader_reads_runs_into_its_buffer_and_guards_it_while_in_flight() {
        let dir = TestDir::new("async");
        let b = FileBackend::open(dir.path(), 4 * MIB, opts(4, 1)).unwrap();
        let src = staging(b.nr_slots());
        write_runs(&b, &src, &[(10, 5), (100, 3), (700, 8)], &[1, 2, 3]);
        let mut r = b.async_reader(16).expect("the file device reads asynchronously");
        assert_eq!(r.capacity_pages(), 16);
        // Three runs, out of slot order, into three parts of the buffer.
        let runs = [
            AsyncRun { slot: 700, first_page: 0, nr_pages: 8 },
            AsyncRun { slot: 10, first_page: 8, nr_pages: 5 },
            AsyncRun { slot: 100, first_page: 13, nr_pages: 3 },
        ];
        for _ in 0..2 {
            assert!(r.start(&runs));
            // While reads are in flight the buffer is out of bounds and nothing more starts.
            if r.in_flight() {
                assert!(r.pages().is_none());
                assert!(!r.start(&runs[..1]));
            }
            let mut results: Vec<Result<(), BackendError>> = (0..3).map(|_| Ok(())).collect();
            r.wait(&mut results);
            assert!(results.iter().all(|r| r.is_ok()), "{results:?}");
            let pages = r.pages().expect("nothing in flight");
            for (run, gen) in runs.iter().zip([3, 1, 2]) {
                for i in 0..run.nr_pages {
                    let slot = run.slot + i as u64;
                    assert!(pages[run.first_page + i].0 == page_bytes(slot, gen), "slot {slot}");
                }
            }
        }
        // Runs outside the device or the buffer start nothing.
        assert!(!r.start(&[AsyncRun { slot: b.nr_slots() - 1, first_page: 0, nr_pages: 2 }]));
        assert!(!r.start(&[AsyncRun { slot: 0, first_page: 15, nr_pages: 2 }]));
        assert!(!r.start(&[]));
        // Dropping with reads in flight waits for them.
        assert!(r.start(&runs));
        drop(r);
    }
}
