//! Reclaim: keeps a pager's pages in RAM within its resident limit.
//!
//! The parts, one concept each:
//!
//! * [`accounting`]: the resident charge (own and shared), counted, and the watermarks;
//! * [`direct`]: [`charge`], what a charge does at them: reclaim in the faulting context, or
//!   wait for room (direct reclaim);
//! * [`round`]: a reclaim round, and reclaim down to a lowered limit;
//! * [`swapout`]: the two stages of a swap-out, resident pages into the swap cache
//!   (`crate::swap::SwapCache`), then staged pages to their devices;
//! * [`writeback`]: pages moved from one device to the next tier down;
//! * [`cow`]: pages a fork shares, made exclusive again so that they can be moved out;
//! * [`aging`]: idle aging, which finds the pages no longer touched and sends them out by
//!   age;
//! * [`background`]: the background reclaimer thread.
//!
//! The victims' FIFOs (`active` and the use-once `streamed`) are `crate::lru`'s.
//!
//! Invariant: the pages in RAM (mapped in regions plus staged in the swap cache) never exceed
//! the limit, except when nothing at all can be reclaimed (see [`direct`]). A round reclaims
//! at most `RECLAIM_BATCH_PAGES` pages per stage.
//!
//! Locking: the queues are lock-free; pages are owned through their busy bits. A reclaim
//! round holds at most `MAX_REGIONS_PER_SET` region guards and allocates nothing, so direct
//! reclaim may run inside a SIGBUS handler (not on the lock-free route, which never
//! reclaims).

pub(crate) mod accounting;
pub(crate) mod aging;
pub(crate) mod background;
pub(crate) mod cow;
pub(crate) mod direct;
pub(crate) mod round;
pub(crate) mod swapout;
pub(crate) mod victims;
pub(crate) mod writeback;

pub(crate) use accounting::shared_sub;

/// Set once the process prepares its core dump (`crate::core_dump`): no reclaim round or
/// device writeback starts, and every charge is made at once, over the limits if need be
/// (every page must come in and stay in for the dump; a charge waiting for room that could
/// not come took 250 ms a page). Never cleared: the process is about to die.
static STOPPED_FOR_CORE_DUMP: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Turns [`STOPPED_FOR_CORE_DUMP`] on; the rounds under way end on their own
/// ([`Reclaim::wait_none_in_flight`]).
pub(crate) fn stop_for_core_dump() {
    STOPPED_FOR_CORE_DUMP.store(true, std::sync::atomic::Ordering::SeqCst);
}

/// Whether [`stop_for_core_dump`] was called.
pub(crate) fn stopped_for_core_dump() -> bool {
    STOPPED_FOR_CORE_DUMP.load(std::sync::atomic::Ordering::SeqCst)
}

use std::sync::atomic::AtomicUsize;

use crate::error::Result;
use crate::lru::Lru;
use crate::options::{BackgroundReclaim, FaultMode, IdleAging};
use crate::state::charge::Charge;
use crate::state::cow::CowQueue;
use crate::state::{ErrorLog, PagerId, PagerShared, Parent, Shutdown};
use crate::stats::PerCpuStats;
use crate::swap::{SwapCache, SwapDevices};
use crate::uffd::Uffd;

/// Reclaim's context: the parts of the pager's state reclaim works on, and nothing else.
/// The charge and its limit, the reclaim lists (`lru`), the swap cache and the devices, the
/// resident clean-page count, the queue of pages a fork shares (`cow`, with the parent
/// pager if this is a fork child), the counters, the error log, the regions' descriptor
/// (`uffd`, for moving pages out) and the user's choices reclaim reads (fault mode,
/// background reclaim, idle aging, the readahead window). Built by [`PagerShared::reclaim_cx`];
/// the fields are reclaim's own, others use the verbs below.
#[derive(Clone, Copy)]
pub(crate) struct Reclaim<'a> {
    id: PagerId,
    uffd: &'a Uffd,
    mode: FaultMode,
    charge: &'a Charge,
    parent: &'a Parent,
    clean_pages: &'a AtomicUsize,
    devices: &'a SwapDevices,
    lru: &'a Lru,
    swap_cache: &'a SwapCache,
    stats: &'a PerCpuStats,
    readahead_max_pages: usize,
    shutdown: &'a Shutdown,
    background_reclaim: BackgroundReclaim,
    idle_aging: IdleAging,
    /// How long a page stays out of RAM untouched before it moves down a tier (`None`:
    /// never, see `PagerBuilder::tier_age`).
    tier_age: Option<std::time::Duration>,
    errors: &'a ErrorLog,
    reclaimer: &'a crate::sync::Doze,
    cow: &'a CowQueue,
}

impl PagerShared {
    /// Reclaim's context (see [`Reclaim`]).
    pub(crate) fn reclaim_cx(&self) -> Reclaim<'_> {
        Reclaim {
            id: self.id(),
            uffd: &self.uffd,
            mode: self.mode,
            charge: &self.charge,
            parent: &self.parent,
            clean_pages: &self.clean_pages,
            devices: &self.devices,
            lru: &self.lru,
            swap_cache: &self.swap_cache,
            stats: &self.stats,
            readahead_max_pages: self.readahead_max_pages,
            shutdown: &self.shutdown,
            background_reclaim: self.background_reclaim,
            idle_aging: self.idle_aging,
            tier_age: self.tier_age,
            errors: &self.errors,
            reclaimer: &self.reclaimer,
            cow: &self.cow,
        }
    }
}

impl Reclaim<'_> {
    /// Charges `n` pages before they are mapped (see [`direct::charge`]).
    pub fn charge(&self, n: usize, lock_free: bool) {
        direct::charge(self, n, lock_free)
    }

    /// Gives back the charge of `n` pages (see [`accounting::uncharge`]).
    pub fn uncharge(&self, n: usize) {
        accounting::uncharge(self.charge, n)
    }

    /// Reclaims down to the limit, after it was lowered (see [`round::reclaim_to_limit`]).
    pub fn reclaim_to_limit(&self) -> Result<()> {
        round::reclaim_to_limit(self)
    }

    /// With reclaim held: waits until no round or writeback is under way
    /// ([`round::InFlight::wait_none`]).
    pub fn wait_none_in_flight(&self) {
        round::InFlight::wait_none(self)
    }

    /// The background reclaimer thread's body, until shutdown (see [`background`]).
    pub fn run_background(&self) {
        background::background_reclaimer(self)
    }
}
