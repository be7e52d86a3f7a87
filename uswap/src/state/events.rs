//! The pager's event state: the reader lock that orders the application of userfaultfd
//! events, and the parts of regions an `mremap` moved out whose pages are still being copied
//! into place (take-outs). What the events mean, and the copying, are `crate::events`'.
//!
//! Locking: `reader` is outermost in the engine's lock hierarchy (`crate::sync`);
//! `take_outs` is taken under it or alone, never on the signal-mode fault path.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Mutex;

use crate::page_table::Pte;

/// Ranges moved out of regions whose pages are still being copied into place, over all
/// pagers (see `crate::events::run_take_outs`).
pub(crate) static TAKE_OUT_RANGES: AtomicUsize = AtomicUsize::new(0);

/// Per-pager event state.
#[derive(Default)]
pub(crate) struct EventState {
    /// Held across a read of the descriptor and the application of the events read: with
    /// several readers (thread mode), events are applied in the order the kernel sent them.
    /// An `mremap` sends `REMAP` then `UNMAP` of the old range; applied the other way round,
    /// the `UNMAP` would free pages the move still has to copy. Outermost in the lock
    /// hierarchy (`crate::sync`): its holder waits for page busy bits, no owner of a busy bit
    /// ever waits for it.
    pub reader: Mutex<()>,
    /// Parts moved out of regions still being copied into place. Taken under `reader` and
    /// by `crate::events::run_take_outs` (which holds no busy bit), never on the signal-mode fault path.
    pub take_outs: Mutex<TakeOuts>,
    /// `take_outs.ranges.len()`, readable without the lock.
    pub pending_ranges: AtomicUsize,
    /// Reads of the descriptor begun, and the last of them whose events are all applied
    /// (both under `reader`, so in order): an event read before `reads_begun` was sampled
    /// is applied once `reads_applied` reaches the sample (`crate::events::UnmapUnderWay`).
    pub reads_begun: AtomicU64,
    pub reads_applied: AtomicU64,
    /// Set when the regions' descriptor asks for no `REMOVE` events: the program's discards
    /// reach the engine through the system-call guard (`crate::events::ProgramDiscard`).
    pub _without_remove_events: Option<WithoutRemoveEvents>,
}

/// Pagers alive whose regions' descriptor asks for no `REMOVE` events, over the process.
static PAGERS_WITHOUT_REMOVE_EVENTS: AtomicUsize = AtomicUsize::new(0);

/// Counts a pager without `REMOVE` events while it lives (held by its event state).
pub(crate) struct WithoutRemoveEvents(());

impl WithoutRemoveEvents {
    /// Whether some pager alive has none.
    pub(crate) fn any() -> bool {
        PAGERS_WITHOUT_REMOVE_EVENTS.load(Ordering::Acquire) > 0
    }

    pub(crate) fn new() -> WithoutRemoveEvents {
        PAGERS_WITHOUT_REMOVE_EVENTS.fetch_add(1, Ordering::AcqRel);
        WithoutRemoveEvents(())
    }
}

impl Drop for WithoutRemoveEvents {
    fn drop(&mut self) {
        PAGERS_WITHOUT_REMOVE_EVENTS.fetch_sub(1, Ordering::AcqRel);
    }
}

/// One page of a part moved out of a region, not yet copied to its new address.
pub(crate) struct TakeOut {
    /// Its new address.
    pub dst: usize,
    /// Its page-table word when it was detached (`Cached` or `Swapped`; not busy): what it
    /// owns (slot, staging page, charge) until it is copied.
    pub pte: Pte,
}

/// Parts moved out of regions that are still being copied into place (see
/// `crate::events::run_take_outs`).
#[derive(Default)]
pub(crate) struct TakeOuts {
    pub pages: Vec<TakeOut>,
    /// Address ranges to unregister once no page of theirs is pending: the moved parts, and
    /// what `mremap` grew.
    pub ranges: Vec<(usize, usize)>,
    /// When the oldest pending page was detached (for the bound).
    pub since_ns: u64,
}

impl TakeOuts {
    /// Publishes how many ranges are pending (read without the lock by the fault paths).
    pub fn publish(&mut self, ev: &EventState) {
        if self.ranges.is_empty() {
            self.since_ns = 0;
        } else if self.since_ns == 0 {
            self.since_ns = crate::clock::now_ns();
        }
        let old = ev.pending_ranges.swap(self.ranges.len(), Ordering::AcqRel);
        let new = self.ranges.len();
        if new > old {
            TAKE_OUT_RANGES.fetch_add(new - old, Ordering::AcqRel);
        } else {
            TAKE_OUT_RANGES.fetch_sub(old - new, Ordering::AcqRel);
        }
    }

    /// `[from, from + len)` moved to `to`: pending pages and ranges inside it move along.
    pub fn remap(&mut self, from: usize, to: usize, len: usize) {
        let end = from + len;
        let moved = |a: usize| a.wrapping_sub(from).wrapping_add(to);
        for t in &mut self.pages {
            if (from..end).contains(&t.dst) {
                t.dst = moved(t.dst);
            }
        }
        let mut out = Vec::with_capacity(self.ranges.len() + 2);
        for &(s, e) in &self.ranges {
            let (is, ie) = (s.max(from), e.min(end));
            if is >= ie {
                out.push((s, e));
                continue;
            }
            if s < is {
                out.push((s, is));
            }
            out.push((moved(is), moved(ie)));
            if ie < e {
                out.push((ie, e));
            }
        }
        self.ranges = out;
    }
}
