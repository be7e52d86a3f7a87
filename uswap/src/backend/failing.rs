//! A backend that wraps another and fails on purpose: reads or writes fail, or reads return
//! corrupted data, at configured rates, from a seeded deterministic stream. For testing that
//! the engine loses nothing when a device misbehaves; never a mock of the kernel.
//!
//! Locking: none; the random stream is one atomic counter hashed per decision.

use std::sync::atomic::{AtomicU64, Ordering};

use super::{Backend, BackendError, BackendStats, ReadReq, WriteReq};

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
    cfg: FaultInjection,
    counter: AtomicU64,
    injected_read_errors: AtomicU64,
    injected_write_errors: AtomicU64,
    injected_corruptions: AtomicU64,
}

impl FailingBackend {
    pub fn new(inner: Box<dyn Backend>, cfg: FaultInjection) -> FailingBackend {
        FailingBackend {
            inner,
            cfg,
            counter: AtomicU64::new(0),
            injected_read_errors: AtomicU64::new(0),
            injected_write_errors: AtomicU64::new(0),
            injected_corruptions: AtomicU64::new(0),
        }
    }

    /// A uniform draw in [0, 1) from the seeded stream (splitmix64 of a counter).
    fn draw(&self) -> (f64, u64) {
        let n = self.counter.fetch_add(1, Ordering::Relaxed);
        let mut z = n.wrapping_add(self.cfg.seed).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^= z >> 31;
        ((z >> 11) as f64 / (1u64 << 53) as f64, z)
    }

    /// Failures injected so far: (read errors, write errors, corruptions).
    pub fn injected(&self) -> (u64, u64, u64) {
        (
            self.injected_read_errors.load(Ordering::Relaxed),
            self.injected_write_errors.load(Ordering::Relaxed),
            self.injected_corruptions.load(Ordering::Relaxed),
        )
    }
}

impl Backend for FailingBackend {
    fn name(&self) -> String {
        format!("failing({})", self.inner.name())
    }

    fn nr_slots(&self) -> u64 {
        self.inner.nr_slots()
    }

    fn write(&self, reqs: &mut [WriteReq<'_>]) {
        self.inner.write(reqs);
        for r in reqs.iter_mut().filter(|r| r.result.is_ok()) {
            if self.draw().0 < self.cfg.write_error_rate {
                // Undo what the inner device stored: a failed write stores nothing.
                for i in 0..r.nr_pages() {
                    self.inner.invalidate(r.slot + i);
                }
                r.result = Err(BackendError::Injected { slot: r.slot });
                self.injected_write_errors.fetch_add(1, Ordering::Relaxed);
            }
        }
    }

    fn read(&self, reqs: &mut [ReadReq<'_>]) {
        self.inner.read(reqs);
        for r in reqs.iter_mut().filter(|r| r.result.is_ok()) {
            let (d, z) = self.draw();
            if d < self.cfg.read_error_rate {
                r.result = Err(BackendError::Injected { slot: r.slot });
                self.injected_read_errors.fetch_add(1, Ordering::Relaxed);
            } else if d < self.cfg.read_error_rate + self.cfg.corrupt_rate {
                let bit = (z as usize) % (r.buf.len() * crate::uffd::PAGE_SIZE * 8);
                r.buf[bit / 8 / crate::uffd::PAGE_SIZE].0[(bit / 8) % crate::uffd::PAGE_SIZE] ^= 1 << (bit % 8);
                self.injected_corruptions.fetch_add(1, Ordering::Relaxed);
            }
        }
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

    fn writeback_candidates(&self, out: &mut [u64]) -> usize {
        self.inner.writeback_candidates(out)
    }

    fn stats(&self) -> Option<BackendStats> {
        self.inner.stats()
    }

    // No in-place reads: every read goes through `read`, where failures are injected.
}
