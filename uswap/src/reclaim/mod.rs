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

pub(crate) use accounting::{shared_sub, uncharge};
pub(crate) use background::background_reclaimer;
pub(crate) use direct::charge;
pub(crate) use round::{reclaim_to_limit, InFlight};
