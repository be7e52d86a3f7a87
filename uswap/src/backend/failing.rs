//! A backend that wraps another and fails on purpose: reads or writes fail, or reads return
//! corrupted data, at configured rates, from a seeded deterministic stream. For testing that
//! the engine loses nothing when a device misbehaves; never a mock of the kernel.
//!
//! Locking: none; the random stream is one atomic counter hashed per decision.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use super::{AlignedPage, AsyncReader, AsyncRun, Backend, BackendError, BackendStats, ReadReq, WriteReq};
use crate::uffd::PAGE_SIZE;

/// Failure rates, each a probability in `0.0..=1.0`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct FaultInjection {
    /// A read request fails with an error.
    pub read_error_rate: f64,
    /// A write request fails with an error (nothing is stored).
    pub write_error_rate: f64,
    /// A read request succeeds but one bit of the data is flipped.
    pub corrupt_rate: f64,
    pub seed: u64,
}

impl Default for FaultInjection {
    fn default() -> Self {
        FaultInjection { read_error_rate: 0.0, write_error_rate: 0.0, corrupt_rate: 0.0, seed: 1 }
    }
}

pub struct FailingBackend {
    inner: Box<dyn Backend>,
    inj: Arc<Injector>,
}

/// The seeded decisions and their counts, shared with the backend's asynchronous readers.
struct Injector {
    cfg: FaultInjection,
    counter: AtomicU64,
    injected_read_errors: AtomicU64,
    injected_write_errors: AtomicU64,
    injected_corruptions: AtomicU64,
}

impl Injector {
    /// A uniform draw in [0, 1) from the seeded stream (splitmix64 of a counter).
    fn draw(&self) -> (f64, u64) {
        let n = self.counter.fetch_add(1, Ordering::Relaxed);
        let mut z = n.wrapping_add(self.cfg.seed).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^= z >> 31;
        ((z >> 11) as f64 / (1u64 << 53) as f64, z)
    }

    /// Decides the fate of a read of `pages` from `slot` that succeeded: fail it, flip one
    /// bit of it, or leave it alone.
    fn after_read(&self, slot: u64, pages: &mut [AlignedPage]) -> Result<(), BackendError> {
        let (d, z) = self.draw();
        if d < self.cfg.read_error_rate {
            self.injected_read_errors.fetch_add(1, Ordering::Relaxed);
            return Err(BackendError::Injected { slot });
        }
        if d < self.cfg.read_error_rate + self.cfg.corrupt_rate && !pages.is_empty() {
            let bit = (z as usize) % (pages.len() * PAGE_SIZE * 8);
            pages[bit / 8 / PAGE_SIZE].0[(bit / 8) % PAGE_SIZE] ^= 1 << (bit % 8);
            self.injected_corruptions.fetch_add(1, Ordering::Relaxed);
        }
        Ok(())
    }
}

impl FailingBackend {
    pub fn new(inner: Box<dyn Backend>, cfg: FaultInjection) -> FailingBackend {
        FailingBackend {
            inner,
            inj: Arc::new(Injector {
                cfg,
                counter: AtomicU64::new(0),
                injected_read_errors: AtomicU64::new(0),
                injected_write_errors: AtomicU64::new(0),
                injected_corruptions: AtomicU64::new(0),
            }),
        }
    }

    /// Failures injected so far: (read errors, write errors, corruptions), asynchronous
    /// readahead included.
    pub fn injected(&self) -> (u64, u64, u64) {
        (
            self.inj.injected_read_errors.load(Ordering::Relaxed),
            self.inj.injected_write_errors.load(Ordering::Relaxed),
            self.inj.injected_corruptions.load(Ordering::Relaxed),
        )
    }
}

/// The inner device's asynchronous reader, with the same failures injected into its reads.
struct FailingAsyncReader {
    inner: Box<dyn AsyncReader>,
    inj: Arc<Injector>,
    runs: Box<[AsyncRun]>,
    nr_runs: usize,
}

impl AsyncReader for FailingAsyncReader {
    fn capacity_pages(&self) -> usize {
        self.inner.capacity_pages()
    }

    fn start(&mut self, runs: &[AsyncRun]) -> bool {
        if runs.len() > self.runs.len() || !self.inner.start(runs) {
            return false;
        }
        self.runs[..runs.len()].copy_from_slice(runs);
        self.nr_runs = runs.len();
        true
    }

    fn in_flight(&self) -> bool {
        self.inner.in_flight()
    }

    fn wait(&mut self, results: &mut [Result<(), BackendError>]) {
        self.inner.wait(results);
        let Some(pages) = self.inner.pages_mut() else { return };
        for (res, run) in results.iter_mut().zip(&self.runs[..self.nr_runs]) {
            if res.is_ok() {
                if let Some(p) = pages.get_mut(run.first_page..run.first_page + run.nr_pages) {
                    *res = self.inj.after_read(run.slot, p);
                }
            }
        }
    }

    fn pages(&self) -> Option<&[AlignedPage]> {
        self.inner.pages()
    }

    fn pages_mut(&mut self) -> Option<&mut [AlignedPage]> {
        self.inner.pages_mut()
    }
}

impl Backend for FailingBackend {
    fn name(&self) -> String {
        format!("failing({})", self.inner.name())
    }

    fn nr_slots(&self) -> u64 {
        self.inner.nr_slots()
    }

    fn slow_writes(&self) -> bool {
        self.inner.slow_writes()
    }

    fn dear_writes(&self) -> bool {
        self.inner.dear_writes()
    }

    fn write(&self, reqs: &mut [WriteReq<'_>]) {
        self.inner.write(reqs);
        for r in reqs.iter_mut().filter(|r| r.result.is_ok()) {
            if self.inj.draw().0 < self.inj.cfg.write_error_rate {
                // Undo what the inner device stored: a failed write stores nothing.
                for i in 0..r.nr_pages() {
                    self.inner.invalidate(r.slot + i);
                }
                r.result = Err(BackendError::Injected { slot: r.slot });
                self.inj.injected_write_errors.fetch_add(1, Ordering::Relaxed);
            }
        }
    }

    fn read(&self, reqs: &mut [ReadReq<'_>]) {
        self.inner.read(reqs);
        for r in reqs.iter_mut().filter(|r| r.result.is_ok()) {
            r.result = self.inj.after_read(r.slot, r.buf);
        }
    }

    fn async_reader(&self, nr_pages: usize) -> Option<Box<dyn AsyncReader>> {
        let inner = self.inner.async_reader(nr_pages)?;
        let runs = vec![AsyncRun { slot: 0, first_page: 0, nr_pages: 0 }; inner.capacity_pages()].into_boxed_slice();
        Some(Box::new(FailingAsyncReader { inner, inj: self.inj.clone(), runs, nr_runs: 0 }))
    }

    fn discard(&self, slot: u64, nr: u64) {
        self.inner.discard(slot, nr)
    }

    fn invalidate(&self, slot: u64) {
        self.inner.invalidate(slot)
    }

    fn accepting(&self) -> bool {
        self.inner.accepting()
    }

    fn share_pool(&self, share: crate::shared_charge::PoolShare) {
        self.inner.share_pool(share)
    }

    fn writeback_candidates(&self, out: &mut [u64]) -> usize {
        self.inner.writeback_candidates(out)
    }

    fn trim(&self) -> u64 {
        self.inner.trim()
    }

    fn stats(&self) -> Option<BackendStats> {
        self.inner.stats()
    }

    // No in-place reads: every read goes through `read`, where failures are injected.
}
