//! The samples a zstd pool's dictionary is trained from (`zpool:zstd-N:dict`), and the
//! training: the dictionary's bytes, which the codecs (`codec.rs`) prepare and use.
//!
//! Why a dictionary: a page alone gives zstd little history to match against, and the
//! pages of one program share their structure (allocator headers, object layouts, common
//! strings). Trained on the program's own pages, a 64 KiB dictionary gave sqlite3's pages
//! 355 bytes each against zstd-1's 466, CPython's 459 against 482, and halved the time to
//! compress one (docs/bench/design-measurements.md, "A dictionary trained on the program's
//! own pages").
//!
//! A trained dictionary does not help every program: a [`Payoff`] compresses one page in
//! `CHECK_EVERY` both ways and turns the dictionary off while it costs bytes (and on again
//! when it pays once more).
//!
//! Life of a [`Sampler`]: sampling, then trained (or failed), once. While sampling, every
//! `SAMPLE_EVERY`th page the pool compresses is copied into the sample buffer; once that
//! holds `NR_SAMPLES` pages, the background thread (`Backend::trim`) trains a dictionary of
//! at most `DICT_BYTES` from them (`ZDICT_trainFromBuffer`, a few hundred ms of one CPU)
//! and frees the samples. One dictionary per pool, never replaced: a page compressed with it
//! may stay in the pool for the pool's life.
//!
//! Locking: the sample buffer's mutex is only `try_lock`ed (a page is not sampled while
//! another thread copies one, and training waits for the next round), so the fault path
//! never waits and allocates nothing here. The state moves forward only:
//! `SAMPLING` → `TRAINING` → `TRAINED` or `FAILED` (or `STOPPED`, in a fork child).
//!
//! Memory: the sample buffer (`NR_SAMPLES` pages, 4 MiB) is mapped when the pool is made
//! and touched only as samples fill it; it is unmapped after training. A fork child stops
//! sampling ([`Sampler::stop`]): it reads what it inherited and trains nothing.

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicU8, AtomicUsize, Ordering};
use std::sync::Mutex;

use crate::mapping::PageBuf;
use crate::uffd::PAGE_SIZE;

/// The most bytes a dictionary holds (zstd's own default for `zstd --train`: 110 KiB; the
/// measurements above used 64 KiB).
pub(super) const DICT_BYTES: usize = 64 << 10;

/// Pages a dictionary is trained from: 4 MiB, 64 times the dictionary (zstd suggests about
/// 100 times; training time grows with the samples, on the background thread).
pub(super) const NR_SAMPLES: usize = 1024;

/// One page sampled in so many compressed: the samples span the first 16 MiB the pool
/// compresses rather than its first 4.
pub(super) const SAMPLE_EVERY: u64 = 4;

const SAMPLING: u8 = 0;
const TRAINING: u8 = 1;
const TRAINED: u8 = 2;
const FAILED: u8 = 3;
const STOPPED: u8 = 4;

/// Pages copied for training, and where training stands.
pub(super) struct Sampler {
    state: AtomicU8,
    samples: Mutex<Samples>,
    /// Pages of the buffer filled (0 once trained from): written under `samples`' lock,
    /// read without it for the pool's `codec_bytes` (the buffer is `MAP_NORESERVE`, memory
    /// only as it fills).
    filled_pages: AtomicUsize,
}

struct Samples {
    /// `NR_SAMPLES` pages of a mapping of their own (`MAP_NORESERVE`: memory only as
    /// they fill); None once trained from.
    buf: Option<PageBuf>,
    /// Pages offered.
    seen: u64,
}

impl Sampler {
    /// Maps the sample buffer. At pool creation only.
    pub(super) fn new() -> std::io::Result<Sampler> {
        let samples = Samples { buf: Some(PageBuf::zeroed(NR_SAMPLES)?), seen: 0 };
        Ok(Sampler { state: AtomicU8::new(SAMPLING), samples: Mutex::new(samples), filled_pages: AtomicUsize::new(0) })
    }

    /// Memory of the samples held now.
    pub(super) fn buffer_bytes(&self) -> u64 {
        (self.filled_pages.load(Ordering::Relaxed) * PAGE_SIZE) as u64
    }

    /// On the write path (a SIGBUS handler's too): keeps a copy of every `SAMPLE_EVERY`th
    /// page of those offered (`src`: a page, or a unit's pages) while sampling. Never
    /// waits, never allocates.
    pub(super) fn offer(&self, src: &[u8]) {
        if self.state.load(Ordering::Relaxed) != SAMPLING {
            return;
        }
        let Ok(mut s) = self.samples.try_lock() else {
            return;
        };
        // Bounded by a unit's pages.
        for page in src.chunks_exact(PAGE_SIZE) {
            s.seen += 1;
            let nr = self.filled_pages.load(Ordering::Relaxed);
            if s.seen % SAMPLE_EVERY != 0 || nr == NR_SAMPLES {
                continue;
            }
            let Some(buf) = s.buf.as_mut() else {
                return;
            };
            assert!(nr < buf.len(), "uswap invariant: sample {nr} past the buffer");
            buf[nr].0.copy_from_slice(page);
            self.filled_pages.store(nr + 1, Ordering::Relaxed);
        }
    }

    /// On the background thread: once every sample is in, trains a dictionary from them
    /// and frees them. `Some` once (the dictionary's bytes, or why zstd could not train
    /// one: then the pool goes on without), `None` before and after.
    pub(super) fn train_when_ready(&self) -> Option<Result<Vec<u8>, String>> {
        if self.state.load(Ordering::Acquire) != SAMPLING {
            return None;
        }
        let samples = {
            let mut s = self.samples.try_lock().ok()?;
            if self.filled_pages.load(Ordering::Relaxed) < NR_SAMPLES {
                return None;
            }
            self.state.store(TRAINING, Ordering::Release);
            s.buf.take()?
        };
        let sizes = vec![PAGE_SIZE; NR_SAMPLES];
        let mut dict = vec![0u8; DICT_BYTES];
        let trained = zstd_safe::train_from_buffer(&mut dict[..], samples.as_bytes(), &sizes);
        drop(samples);
        self.filled_pages.store(0, Ordering::Relaxed);
        match trained {
            Ok(len) => {
                dict.truncate(len);
                self.state.store(TRAINED, Ordering::Release);
                Some(Ok(dict))
            }
            Err(code) => {
                self.state.store(FAILED, Ordering::Release);
                Some(Err(zstd_safe::get_error_name(code).to_string()))
            }
        }
    }

    /// In a fork child: no more samples, no training.
    pub(super) fn stop(&self) {
        self.state.store(STOPPED, Ordering::Release);
    }
}

/// One page in so many compressed with a trained dictionary is compressed without it too, to
/// see whether the dictionary still pays.
const CHECK_EVERY: u64 = 32;

/// Checks per decision: one every 2,048 pages written.
const CHECKS_PER_DECISION: u64 = 64;

/// The bytes a dictionary may cost over none, in percent, and still be used: on the pages of
/// some programs it costs bytes (GNU sort's hexadecimal keys: 12 % more with one trained on
/// them, twice as many with one trained on its first pages, which were others), on others
/// it saves a few (CPython's heap: 5 % page by page) but halves the time to compress.
const COST_PERCENT_ALLOWED: u64 = 2;

/// Whether the trained dictionary pays, decided again every `CHECKS_PER_DECISION` checks:
/// it is used while its pages take at most `COST_PERCENT_ALLOWED` % more bytes than without
/// it. Lock-free (the write path, in SIGBUS handlers, counts here); two threads deciding at
/// once only shift a few checks into the next window.
pub(super) struct Payoff {
    /// Pages compressed since the dictionary was trained.
    nr: AtomicU64,
    /// This window's checks, and their bytes with and without the dictionary.
    checks: AtomicU64,
    with_bytes: AtomicU64,
    without_bytes: AtomicU64,
    in_use: AtomicBool,
    /// Decisions that turned it off, and on again (a program whose pages changed).
    turned_off: AtomicU64,
}

impl Payoff {
    pub(super) fn new() -> Payoff {
        Payoff {
            nr: AtomicU64::new(0),
            checks: AtomicU64::new(0),
            with_bytes: AtomicU64::new(0),
            without_bytes: AtomicU64::new(0),
            in_use: AtomicBool::new(true),
            turned_off: AtomicU64::new(0),
        }
    }

    /// Whether new pages are compressed with the dictionary now.
    pub(super) fn in_use(&self) -> bool {
        self.in_use.load(Ordering::Relaxed)
    }

    /// Counts a page about to be compressed: whether to compress it both ways.
    pub(super) fn check_due(&self) -> bool {
        self.nr.fetch_add(1, Ordering::Relaxed) % CHECK_EVERY == 0
    }

    /// A page compressed both ways took `with` and `without` bytes; every
    /// `CHECKS_PER_DECISION` checks, decides whether the dictionary stays in use.
    pub(super) fn note(&self, with: usize, without: usize) {
        self.with_bytes.fetch_add(with as u64, Ordering::Relaxed);
        self.without_bytes.fetch_add(without as u64, Ordering::Relaxed);
        if self.checks.fetch_add(1, Ordering::AcqRel) + 1 != CHECKS_PER_DECISION {
            return;
        }
        let with = self.with_bytes.swap(0, Ordering::Relaxed);
        let without = self.without_bytes.swap(0, Ordering::Relaxed);
        self.checks.store(0, Ordering::Release);
        let pays = with * 100 <= without * (100 + COST_PERCENT_ALLOWED);
        if self.in_use.swap(pays, Ordering::Relaxed) && !pays {
            self.turned_off.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Times the dictionary was turned off because it cost bytes.
    pub(super) fn turned_off(&self) -> u64 {
        self.turned_off.load(Ordering::Relaxed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A dictionary that costs more than the allowance is turned off at the end of a window,
    /// and on again once it pays; one page in `CHECK_EVERY` is a check.
    #[test]
    fn a_dictionary_is_used_while_it_pays() {
        let p = Payoff::new();
        assert!(p.in_use());
        let due = (0..10 * CHECK_EVERY).filter(|_| p.check_due()).count() as u64;
        assert_eq!(due, 10);
        for _ in 0..CHECKS_PER_DECISION - 1 {
            p.note(1030, 1000); // 3 % more: over the allowance
        }
        assert!(p.in_use(), "decided before the window ended");
        p.note(1030, 1000);
        assert!(!p.in_use() && p.turned_off() == 1);
        for _ in 0..CHECKS_PER_DECISION {
            p.note(1015, 1000); // within the allowance
        }
        assert!(p.in_use() && p.turned_off() == 1);
    }
}
