//! Device health: a device whose writes fail is *degraded*, and takes no pages until a
//! probe write succeeds.
//!
//! Why: a device that cannot make writes durable (a Redis primary whose replicas are gone,
//! so every `WAIT` times out; a file whose file system is full, `ENOSPC`) fails every
//! batch, and each failure can cost a timeout. Reclaim that kept trying made the program
//! crawl: under a Redis primary left without its replica, faults took 13 ms on average, 990 ms
//! at p99 (issue "Cluster"). The kernel's answer to a full swap device is the same: pages stay
//! in memory, over `memory.high` if need be. So the first failed write degrades the device:
//! allocation passes it by (the next device takes its pages, or they stay resident, over the
//! limit if need be: `limit_overrun`), and a write already staged for it is redirected the
//! same way rather than tried. Nothing waits on it: a charge that finds no device taking pages
//! goes over the limit at once (`reclaim::direct`), at the speed of RAM.
//!
//! Recovery: once every [`PROBE_PERIOD_NS`] the background reclaimer writes one page (zeros)
//! to a free slot of each degraded device ([`super::SwapDevices::probe_degraded`]); when that
//! write succeeds, or any other write to it does, the device is healthy again and paging to
//! it resumes. Both transitions are said on stderr (at most [`MAX_SAID`] times a device,
//! then only counted in `DeviceStats::degraded_episodes`).
//!
//! Which failures degrade: an I/O error (`EINTR` and `EAGAIN` aside) and a remote store's
//! refusal. A failure injected by the failing backend is per request, as is a device's
//! declining of a page (`Rejected`: a full pool, an incompressible page), which has its
//! own back-off.
//!
//! Locking: none; atomics only, and [`StderrLine`], so a write failing in a SIGBUS handler
//! (signal-mode direct reclaim) may note it. Invariant: `degraded_since_ns` is 0 exactly
//! while the device is healthy.

use std::io;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

use crate::backend::BackendError;
use crate::clock::now_ns;
use crate::uffd::sigbus::StderrLine;

/// How often a degraded device is probed.
pub const PROBE_PERIOD_NS: u64 = 1_000_000_000;
/// Transitions said on stderr per device; later ones are only counted.
const MAX_SAID: u32 = 8;

/// The write health of one device.
pub struct Health {
    /// When the device degraded ([`now_ns`]); 0 while it is healthy.
    degraded_since_ns: AtomicU64,
    /// When the background reclaimer may probe it next.
    next_probe_ns: AtomicU64,
    /// Times it degraded since the pager started.
    episodes: AtomicU64,
    /// Transitions said on stderr.
    said: AtomicU32,
    /// The device's name, for stderr lines written without allocating.
    name: Box<[u8]>,
}

impl Health {
    pub fn new(name: &str) -> Health {
        Health {
            degraded_since_ns: AtomicU64::new(0),
            next_probe_ns: AtomicU64::new(0),
            episodes: AtomicU64::new(0),
            said: AtomicU32::new(0),
            name: name.as_bytes().into(),
        }
    }

    #[inline]
    pub fn is_degraded(&self) -> bool {
        self.degraded_since_ns.load(Ordering::Acquire) != 0
    }

    pub fn episodes(&self) -> u64 {
        self.episodes.load(Ordering::Relaxed)
    }

    /// Claims the probe of a degraded device if one is due: true for one caller a period.
    pub fn claim_probe(&self) -> bool {
        let now = now_ns();
        let due = self.next_probe_ns.load(Ordering::Acquire);
        self.is_degraded()
            && now >= due
            && self
                .next_probe_ns
                .compare_exchange(due, now + PROBE_PERIOD_NS, Ordering::AcqRel, Ordering::Relaxed)
                .is_ok()
    }

    /// Notes the outcome of a write to the device (a batch, or a probe).
    pub fn note_write(&self, result: &Result<(), BackendError>) {
        match result {
            Ok(()) => self.recovered(),
            Err(e) if degrades(e) => self.degraded(e),
            Err(_) => {}
        }
    }

    fn degraded(&self, e: &BackendError) {
        debug_assert!(degrades(e), "only a failure that says the device cannot write degrades it");
        // Never 0: 0 means healthy (the module invariant).
        let now = now_ns().max(1);
        self.next_probe_ns.store(now + PROBE_PERIOD_NS, Ordering::Release);
        if self.degraded_since_ns.compare_exchange(0, now, Ordering::AcqRel, Ordering::Relaxed).is_err() {
            return; // already degraded: a probe, or a write under way when it degraded
        }
        self.episodes.fetch_add(1, Ordering::Relaxed);
        if !self.may_say() {
            return;
        }
        let mut line = StderrLine::default();
        line.put(b"uswap: ").put(&self.name).put(b": writes fail (");
        put_why(&mut line, e);
        line.put(b"); pages stay in RAM (over the limit if need be) or go to the next device; retried every second\n")
            .write();
    }

    fn recovered(&self) {
        // Every successful batch comes here: a load, not a write, while healthy.
        if !self.is_degraded() {
            return;
        }
        let since = self.degraded_since_ns.swap(0, Ordering::AcqRel);
        // Another recovery may have come first (0); otherwise it was a moment, never in
        // the future (both from the monotonic clock).
        debug_assert!(since <= now_ns().max(1), "degraded since a moment not yet come");
        if since == 0 || !self.may_say() {
            return;
        }
        StderrLine::default()
            .put(b"uswap: ")
            .put(&self.name)
            .put(b": writes succeed again after ")
            .put_number(now_ns().saturating_sub(since) / 1_000_000_000, 10, 1)
            .put(b" s; paging to it resumes\n")
            .write();
    }

    fn may_say(&self) -> bool {
        let n = self.said.fetch_add(1, Ordering::Relaxed);
        if n + 1 == MAX_SAID {
            StderrLine::default()
                .put(b"uswap: ")
                .put(&self.name)
                .put(b": further changes of its health are only counted (degraded_episodes)\n")
                .write();
        }
        n < MAX_SAID
    }
}

/// Whether a failed write says the device cannot take writes now, rather than that one
/// request failed.
fn degrades(e: &BackendError) -> bool {
    match e {
        BackendError::Io { source, .. } => {
            !matches!(source.kind(), io::ErrorKind::Interrupted | io::ErrorKind::WouldBlock)
        }
        BackendError::Remote { .. } => true,
        BackendError::OutOfRange { .. }
        | BackendError::Injected { .. }
        | BackendError::Empty { .. }
        | BackendError::Corrupt { .. }
        | BackendError::Rejected { .. } => false,
    }
}

/// Says why, without allocating: the errno of an I/O error, a remote store's static reason.
fn put_why(line: &mut StderrLine, e: &BackendError) {
    match e {
        BackendError::Io { source, .. } => match source.raw_os_error() {
            Some(libc::ENOSPC) => line.put(b"no space left on the device's file system, ENOSPC"),
            Some(errno) => line.put(b"I/O error, errno ").put_number(errno as u64, 10, 1),
            None => line.put(b"I/O error"),
        },
        BackendError::Remote { why, .. } => line.put(why.as_bytes()),
        _ => line.put(b"write refused"),
    };
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_failed_write_degrades_until_a_write_succeeds_and_probes_come_once_a_period() {
        let h = Health::new("test");
        assert!(!h.is_degraded() && !h.claim_probe());
        h.note_write(&Err(BackendError::Injected { slot: 0 }));
        assert!(!h.is_degraded(), "an injected failure is per request");
        let enospc = BackendError::Io { slot: 1, source: io::Error::from_raw_os_error(libc::ENOSPC) };
        h.note_write(&Err(enospc));
        assert!(h.is_degraded() && h.episodes() == 1);
        assert!(!h.claim_probe(), "no probe before a period has passed");
        h.next_probe_ns.store(0, Ordering::Relaxed);
        assert!(h.claim_probe() && !h.claim_probe(), "one probe a period");
        h.note_write(&Err(BackendError::Remote { slot: 2, why: "WAIT" }));
        assert_eq!(h.episodes(), 1, "a failed probe continues the episode");
        h.note_write(&Ok(()));
        assert!(!h.is_degraded() && !h.claim_probe());
    }
}
