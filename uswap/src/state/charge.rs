//! The resident charge of a pager: its limit, the pages charged against it (own, and the
//! tree's when several processes share one limit), the peak, and the hold a fork sets.
//! The rules (the counting, the watermarks) are `crate::reclaim::accounting`'s; what a charge
//! does at the limit (`crate::reclaim::Reclaim::charge`, when reclaim runs) is `crate::reclaim::direct`'s.
//!
//! Locking: none; atomics.

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize};

use crate::budget::{Budget, IdleSample};
use crate::pressure::{StallAverages, StallClock, StallGuard};
use crate::shared_charge::{ChargeCell, SharedCharge};

/// The resident limit and the charge against it.
pub(crate) struct Charge {
    /// The resident limit, in pages.
    pub limit_pages: AtomicUsize,
    /// Pages charged against the limit: mapped in regions plus staged in the swap cache.
    pub resident_pages: ChargeCell,
    /// The charge this pager shares with others (several processes under one limit), if any.
    pub shared: Option<&'static SharedCharge>,
    /// The most `resident_pages` has been (the memcg's `memory.peak`).
    pub resident_peak_pages: AtomicUsize,
    /// Set while [`crate::Pager::prepare_fork`] brings every page in: charges never wait and no
    /// reclaim runs, so nothing goes out again before the fork copies it.
    pub reclaim_held: AtomicBool,
    /// Reclaim rounds and device writebacks under way (see `reclaim::InFlight`): the fork
    /// waits for them to end once `reclaim_held` is set, so that no page is half moved
    /// when the child's copy of the engine's state is taken.
    pub reclaim_in_flight: AtomicUsize,
    /// The application's memory stalls (`crate::pressure`), and their running averages.
    pub stall: StallClock,
    pub stall_avgs: StallAverages,
    /// What the idle aging scan found, for the automatic budget (its tree's too, in the
    /// shared charge, under `uswap run`).
    pub idle_sample: IdleSample,
    /// Pages the aging scan staged that reclaim wrote out before they were touched: neither
    /// found in use nor shown idle (a page in use then faults from the device), so the scan's
    /// sample leaves them out (`reclaim::aging`). Only those of the scan's last tick (that
    /// left their regions in `aged_cohort_epoch` or after): the pages an earlier tick found
    /// idle, which the automatic budget then takes, were counted already, and subtracted
    /// from the next sample they halved what the scan reported while a working set shrank.
    pub aged_written_pages: AtomicU64,
    pub aged_cohort_epoch: AtomicU64,
    /// With an automatic budget: its control law, with the ceiling (the limit given), which
    /// the background reclaimer copies and runs (`reclaim::background`).
    pub auto: Option<Budget>,
    /// With an automatic budget: its ceiling, in pages, which a limit set on the running
    /// pager moves (`Pager::set_resident_limit`); the reclaimer's copy follows it each tick.
    pub auto_ceiling_pages: AtomicUsize,
}

impl Charge {
    /// A stall of the calling thread on memory, on this pager's clock and its tree's, until
    /// the guard drops. No lock, no allocation.
    #[inline]
    pub fn stall(&self) -> StallGuard<'_> {
        StallGuard::new(&self.stall, self.shared.map(|s| &s.stall))
    }

    /// A stall that began up to `unseen_us` before the engine heard of it (a major fault's
    /// trap: `crate::pressure::MAJOR_FAULT_UNSEEN_US`).
    #[inline]
    pub fn stall_since_unseen(&self, unseen_us: u64) -> StallGuard<'_> {
        StallGuard::since_unseen(&self.stall, self.shared.map(|s| &s.stall), unseen_us)
    }
}
