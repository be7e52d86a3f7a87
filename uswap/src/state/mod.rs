//! The pager's shared state: what the pager's handle, its regions and its threads share
//! (`Arc<PagerShared>`), and the page errors it logs. The choices a user makes (fault mode,
//! background reclaim, idle aging) are `crate::options`'.
//!
//! Split by concern, each part a type of the layer that owns it: the resident charge and
//! limit ([`charge::Charge`]: atomics; the rules are `crate::reclaim::accounting`'s), the swap
//! devices and the swap cache (`crate::swap`), the reclaim lists (`crate::lru`), the queue
//! of pages a fork shares ([`cow::CowQueue`]), the event state ([`events::EventState`]),
//! the asynchronous readahead contexts ([`async_readahead::AsyncReadahead`]), the words
//! fault delivery and service share ([`route`], [`fault_error`]), counters and bounce
//! buffers. The services that work on it (`reclaim`, `swapin`, `events`, `async_readahead`,
//! `release`, `fault_service`) sit above this module; each takes a narrow context of its own
//! (`reclaim::Reclaim`, `swapin::SwapIn`, ...), built from `&PagerShared` in the service's
//! module, that holds only the parts it uses. Nothing here calls them. The small types
//! here ([`ErrorLog`], [`Shutdown`], [`Parent`], [`PagerId`]) let a context hold one part
//! without the whole.
//!
//! Locking: the shared state is atomics and lock-free queues; see `crate::sync` for the
//! engine's lock hierarchy, `crate::reclaim` for the accounting rules and `crate::swap` for
//! the allocator's locks.

pub(crate) mod async_readahead;
pub(crate) mod charge;
pub(crate) mod clean_bets;
pub(crate) mod cow;
pub(crate) mod events;
pub(crate) mod fault_error;
pub(crate) mod route;

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;

use crossbeam_queue::ArrayQueue;

use crate::bounce::BounceBuffers;
use crate::lru::Lru;
use crate::options::{BackgroundReclaim, FaultMode, IdleAging};
use crate::stats::{DeviceStats, PerCpuStats, Stats};
use crate::swap::{SwapCache, SwapDevices};
use crate::uffd::{self, Uffd, PAGE_SIZE};
use async_readahead::AsyncReadahead;
pub use fault_error::{PageError, PageErrorKind};

/// Pages moved out (and written back) per reclaim round: the kernel's `SWAP_CLUSTER_MAX`.
pub const RECLAIM_BATCH_PAGES: usize = 32;
/// The smallest resident limit a pager accepts.
pub const MIN_LIMIT_BYTES: u64 = 256 * PAGE_SIZE as u64;
/// The largest resident limit a pager accepts: 1 PiB, more than any machine's memory, so
/// that a limit meant as "never reached" is taken, while the pages counted against it
/// cannot overflow the charge's arithmetic.
pub const MAX_LIMIT_BYTES: u64 = 1 << 50;

/// Whether `limit_bytes` is a resident limit a pager accepts.
pub fn check_limit(limit_bytes: u64) -> crate::Result<()> {
    if limit_bytes < MIN_LIMIT_BYTES {
        return Err(crate::Error::LimitTooSmall { limit_bytes, min_bytes: MIN_LIMIT_BYTES });
    }
    if limit_bytes > MAX_LIMIT_BYTES {
        return Err(crate::Error::LimitTooLarge { limit_bytes, max_bytes: MAX_LIMIT_BYTES });
    }
    Ok(())
}

/// Regions take missing-page faults and write-protect faults (the first write to a clean
/// page). Staging areas: `crate::swap::STAGING_REGISTER_MODE`.
pub(crate) const REGISTER_MODES: u64 = uffd::REGISTER_MODE_MISSING | uffd::REGISTER_MODE_WP;

/// State shared by the pager's handle, its regions and its threads.
pub(crate) struct PagerShared {
    /// The regions' descriptor: faults, events, and every ioctl whose destination is a region.
    pub uffd: Uffd,
    pub mode: FaultMode,
    /// The resident limit and the charge against it, own and shared (see [`charge::Charge`]).
    pub charge: charge::Charge,
    /// In a re-armed fork child: the parent's engine state as the child inherited it, whose
    /// memory devices hold the pages that were out at the fork (`PageState::Parent`). Only
    /// their reads are used: the parent's threads and locks are not the child's ([`Parent`]).
    pub parent: Parent,
    /// Regions are inherited by fork (see [`crate::PagerBuilder::regions_survive_fork`]).
    pub regions_survive_fork: bool,
    /// Resident pages that are clean (their slot still holds them).
    pub clean_pages: AtomicUsize,
    /// Whether a signal-mode read fault brings its page in clean (see [`clean_bets`]).
    pub clean_bets: clean_bets::CleanBets,
    pub devices: SwapDevices,
    /// Resident pages, oldest first: reclaim's victims (see `crate::lru`).
    pub lru: Lru,
    /// Pages staged in RAM on their way to a device, counted in `resident_pages` too.
    pub swap_cache: SwapCache,
    pub stats: PerCpuStats,
    pub bounce: BounceBuffers,
    /// The global readahead switch.
    pub readahead: AtomicBool,
    pub readahead_max_pages: usize,
    /// Asynchronous readahead contexts (none when no device reads asynchronously).
    pub async_ra: AsyncReadahead,
    pub shutdown: Shutdown,
    pub background_reclaim: BackgroundReclaim,
    pub idle_aging: IdleAging,
    /// How long a page stays out of RAM untouched before it moves down a tier (`None`: never).
    pub tier_age: Option<std::time::Duration>,
    /// The most recent page errors (oldest dropped first).
    pub errors: ErrorLog,
    /// The background reclaimer, for waking it (`BackgroundReclaim::Always`, staged pages to
    /// write under `StageTwo`, and pages to make exclusive after a fork).
    pub reclaimer: crate::sync::Doze,
    /// Pages a fork shares, waiting to be made exclusive (see `reclaim::cow`).
    pub cow: cow::CowQueue,
    /// Event ordering and the parts of regions `mremap` moved out (see `events`).
    pub events: events::EventState,
}

/// The identity of a pager's shared state, for checking that a region is this pager's
/// (`crate::region::RegionSet::get`) without holding the state itself.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) struct PagerId(usize);

/// The most recent page errors, oldest dropped first (lock-free).
pub(crate) struct ErrorLog(ArrayQueue<PageError>);

impl ErrorLog {
    pub fn new(len: usize) -> ErrorLog {
        ErrorLog(ArrayQueue::new(len))
    }

    /// Logs a page error (lock-free; the oldest entry goes when the log is full).
    pub fn record(&self, addr: usize, e: crate::swap::SwapEntry, kind: PageErrorKind) {
        self.record_device(addr, e, kind, "");
    }

    /// As [`record`](Self::record), with what the device said (`cause`).
    pub fn record_device(&self, addr: usize, e: crate::swap::SwapEntry, kind: PageErrorKind, cause: &'static str) {
        let err = PageError { addr, device: e.device(), slot: e.offset(), kind, cause };
        if let Err(err) = self.0.push(err) {
            let _ = self.0.pop();
            let _ = self.0.push(err);
        }
    }

    /// The errors logged, oldest first; the log keeps them.
    pub fn recent(&self) -> Vec<PageError> {
        let q = &self.0;
        let mut v = Vec::with_capacity(q.len());
        while let Some(e) = q.pop() {
            v.push(e);
        }
        for e in &v {
            let _ = q.push(*e);
        }
        v
    }
}

/// Set when the pager's handle is dropped: its threads stop.
#[derive(Default)]
pub(crate) struct Shutdown(AtomicBool);

impl Shutdown {
    pub fn is_set(&self) -> bool {
        self.0.load(Ordering::Acquire)
    }

    pub fn set(&self) {
        self.0.store(true, Ordering::Release);
    }
}

/// In a re-armed fork child: the parent's engine state as the child inherited it. Only its
/// memory devices are reachable from here ([`Parent::devices`]), and only for reads and
/// for giving slots back (`swap::fork_refs`): the parent's threads and locks are not the
/// child's.
#[derive(Default)]
pub(crate) struct Parent(std::sync::OnceLock<Arc<PagerShared>>);

impl Parent {
    /// Sets the parent once (a fork child's re-arm); `Err` with it if one was set.
    pub fn set(&self, parent: Arc<PagerShared>) -> Result<(), Arc<PagerShared>> {
        self.0.set(parent)
    }

    /// The parent's swap devices, when this pager is a fork child's.
    pub fn devices(&self) -> Option<&SwapDevices> {
        self.0.get().map(|p| &p.devices)
    }

    pub fn is_set(&self) -> bool {
        self.0.get().is_some()
    }
}

impl PagerShared {
    /// This state's identity (see [`PagerId`]).
    pub fn id(&self) -> PagerId {
        PagerId(self as *const PagerShared as usize)
    }

    /// A snapshot of the counters (without `publish`). `flush` first empties the per-CPU
    /// batches of freed slots, so the per-device slot counts are exact; the caller blocks
    /// asynchronous signals (it takes spin locks the fault path takes).
    pub fn snapshot(&self, flush: bool) -> Stats {
        if flush {
            self.devices.flush_frees();
        }
        let mut st = Stats::default();
        self.stats.fill(&mut st);
        st.resident_pages = self.charge.resident_pages.load(Ordering::Acquire) as u64;
        st.resident_peak_pages = self.charge.resident_peak_pages.load(Ordering::Relaxed) as u64;
        st.swapcache_pages = self.swap_cache.nr_pages() as u64;
        st.clean_pages = self.clean_pages.load(Ordering::Acquire) as u64;
        // In a tree the limit that holds is the tree's where it is lower: `--auto` moves only
        // the tree's, and a process's own stayed at the ceiling in `uswap stat PID`.
        let tree_limit_pages = self.charge.shared.map_or(usize::MAX, |t| t.limit_pages.load(Ordering::Acquire));
        st.limit_pages = self.charge.limit_pages.load(Ordering::Acquire).min(tree_limit_pages) as u64;
        let [avg10, avg60, avg300] = self.charge.stall_avgs.averages();
        let stalled_us = self.charge.stall.total_us(crate::pressure::now_us());
        st.stall = crate::stats::StallStats { seconds_total: stalled_us as f64 / 1e6, avg10, avg60, avg300 };
        let now = crate::swap::idle_ages::now_epoch();
        let mut idle = [0u64; 4];
        for d in self.devices.devices() {
            for (sum, n) in idle.iter_mut().zip(d.idle_histogram(now)) {
                *sum += n;
            }
        }
        st.idle = crate::stats::IdleStats::from_pages(idle);
        (st.unmanaged_bytes, st.unmanaged_peak_bytes) = crate::stats::unmanaged();
        [
            st.syscall_prepared,
            st.syscall_efault_retried,
            st.syscall_efault,
            st.syscall_continued,
            st.syscall_async_kernel_access,
            st.syscall_unpinned,
            st.mlock_unhonoured,
        ] = crate::stats::syscall_events();
        st.slots_leaked = self.devices.deferred_overflow();
        st.uffd_move_misreports = self.uffd.move_misreports();
        st.staging_foreign_drops = self.swap_cache.foreign_drops();
        st.devices = self
            .devices
            .devices()
            .iter()
            .map(|d| {
                let c = d.cluster_counts();
                DeviceStats {
                    name: d.backend.name(),
                    priority: d.priority,
                    nr_slots: d.nr_slots(),
                    slots_used: d.inuse_slots(),
                    slots_held_for_children: d.fork_refs.nr_held() as u64,
                    clusters_free: c.free + c.discard,
                    clusters_nonfull: c.nonfull,
                    clusters_full: c.full,
                    clusters_discarded: c.discarded,
                    degraded: d.health.is_degraded(),
                    degraded_episodes: d.health.episodes(),
                    charges_refused_tree_full: d.share_refusals(),
                    backend: d.backend.stats(),
                }
            })
            .collect();
        st.pool_peak_bytes = st.devices.iter().filter_map(|d| d.backend.as_ref()).map(|b| b.pool_peak_bytes).sum();
        st
    }
}

#[cfg(test)]
mod tests {
    use super::IdleAging;
    use std::time::Duration;

    #[test]
    fn idle_ages_parse_with_units_and_refuse_what_is_no_age() {
        assert_eq!(IdleAging::parse("90s"), Ok(IdleAging::Evict(Duration::from_secs(90))));
        assert_eq!(IdleAging::parse("2m"), Ok(IdleAging::Evict(Duration::from_secs(120))));
        assert_eq!(IdleAging::parse(" 1h "), Ok(IdleAging::Evict(Duration::from_secs(3600))));
        assert_eq!(IdleAging::parse("30"), Ok(IdleAging::Evict(Duration::from_secs(30))));
        assert_eq!(IdleAging::parse("never"), Ok(IdleAging::Observe));
        assert_eq!(IdleAging::parse("off"), Ok(IdleAging::Off));
        assert_eq!(IdleAging::parse("8760h"), Ok(IdleAging::Evict(Duration::from_secs(365 * 24 * 3600))));
        for bad in ["0.5s", "-3", "abc", "10d", "", "nan", "8761h", "20000000000000000000", "5000000000000000000h"] {
            assert!(IdleAging::parse(bad).is_err(), "{bad:?}");
        }
    }
}
