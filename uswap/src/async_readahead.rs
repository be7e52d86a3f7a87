//! Asynchronous readahead: while the application works through the window a fault just
//! brought in, the next windows of its stream are already being read (the kernel's async
//! readahead, which starts the next window's I/O when the application reaches the
//! `PG_readahead` page of the current one).
//!
//! Why: on a file device a window of 32 pages takes about 150-250 µs to read and the
//! application about as long to work through it, so doing both at once nearly halves the
//! time per window of a sequential scan (see BENCHMARKS.md). Devices in memory gain nothing
//! (their "read" is a copy or a decompression on the CPU the application would use) and get
//! no readers.
//!
//! How: each device with an [`crate::backend::AsyncReader`] has a few *contexts*, each a reader (its own
//! io_uring and buffer) plus a *listing* saying which page each buffer page was read for. At
//! the end of a swap-in whose window showed a sequential stream, [`AsyncRa::start_after`]
//! locks the swapped pages of the next window(s), lists them in a free context, starts the
//! reads, and marks the pages with the async-read hint. A later fault on such a page finds
//! its context, waits for the reads if they are still in flight, and maps the listed pages
//! of its window straight from the context's buffer ([`crate::swapin`]).
//!
//! Claims: a listing entry names a page and the swap entry that was read. Whoever takes the
//! data (or throws it away) first *claims* the entry by swapping it to 0, and must hold the
//! page's busy bit while doing so; only a claim made while also holding the context's lock
//! may use the buffer. So a page's data is used at most once, only by its owner, and only
//! while the buffer cannot be reused. A page is only listed by a starter holding its busy
//! bit, so a listing entry names a page that has stayed SWAPPED at that entry ever since:
//! every transition of the page either claims its entry (swap-in) or takes place after its
//! region left the registry ([`AsyncRa::forget_region`] clears those), or moves it to
//! another slot (tier writeback), which the consumer sees as an entry mismatch.
//!
//! Locking (its place in the hierarchy, and why it may be held across reads: `crate::sync`):
//! each context's `io` is a [`crate::sync::SpinLock`] held while starting, waiting for and mapping from
//! its reads (up to a device read, ~250 µs), and never together with another context's lock. A thread that holds one only try-locks pages, so a fault that holds a
//! page and waits for the context cannot deadlock with it. The lock-free fault route never
//! takes a context lock: it claims its page's entry (throwing the data away) and reads the
//! slot itself. Listings are atomics, read without the lock.
//!
//! Memory: `CONTEXTS_PER_DEVICE` buffers of one maximum window each, allocated at start-up
//! and not charged to the resident limit (like the bounce buffers); pages are charged when
//! they are mapped.

use std::sync::atomic::Ordering;

use arrayvec::ArrayVec;

use crate::backend::AsyncRun;
use crate::readahead::{Window, MAX_WINDOW_PAGES};
use crate::region::{PageRef, PageState, RegionInner, RegionSet};
pub(crate) use crate::state::async_readahead::AsyncReadahead;
use crate::state::async_readahead::{Context, ContextIo};

/// Asynchronous readahead's context: the pager's readahead contexts (`AsyncReadahead`), the
/// counters it keeps, and the pager's identity (to find its regions). Built by
/// [`PagerShared::async_ra_cx`]; used by swap-in (start, find, consume), events and release
/// (forget a page's or a region's listings).
#[derive(Clone, Copy)]
pub(crate) struct AsyncRa<'a> {
    id: PagerId,
    ra: &'a AsyncReadahead,
    stats: &'a PerCpuStats,
}
use crate::state::async_readahead::Listed;
pub use crate::state::async_readahead::{DEFAULT_ASYNC_WINDOWS, MAX_ASYNC_WINDOWS};
use crate::state::{PagerId, PagerShared};
use crate::stats::Counter;
use crate::stats::PerCpuStats;
use crate::swap::SwapEntry;

impl PagerShared {
    /// Asynchronous readahead's context (see [`AsyncRa`]).
    pub(crate) fn async_ra_cx(&self) -> AsyncRa<'_> {
        AsyncRa { id: self.id(), ra: &self.async_ra, stats: &self.stats }
    }
}

impl<'a> AsyncRa<'a> {
    /// Context `ctx` (an index from [`find`](Self::find) or a listing).
    pub fn context(&self, ctx: usize) -> &'a Context {
        self.ra.context(ctx)
    }

    /// Where the page `owner` is listed for `entry`, if it is.
    pub fn find(&self, owner: u64, entry: SwapEntry) -> Option<Listed> {
        self.ra.find(owner, entry)
    }

    /// Throws away the listing of a page the caller holds (busy) and will read itself.
    /// Lock-free.
    pub fn forget_page(&self, owner: u64, entry: SwapEntry) {
        if let Some(l) = self.ra.find(owner, entry) {
            if self.ra.contexts[l.ctx].claim(l.idx, owner) {
                self.stats.inc(Counter::SwapRaAsyncDropped);
            }
        }
    }

    /// Clears every listing of a region that left the registry (its pages are gone; reads
    /// still in flight land in buffers nobody will map from). Lock-free.
    pub fn forget_region(&self, reg_idx: usize) {
        let mut dropped = 0;
        for c in self.ra.contexts.iter() {
            for (i, o) in c.owner.iter().enumerate() {
                let v = o.load(Ordering::Acquire);
                if v != 0 && PageRef::from_owner(v).region_idx == reg_idx && c.claim(i, v) {
                    dropped += 1;
                }
            }
        }
        self.stats.add(Counter::SwapRaAsyncDropped, dropped);
    }

    /// After a swap-in with window `w` on the faulting `region`, starts reading the next
    /// windows of its stream if it is sequential (forward or backward, with a window of the
    /// maximum size). Pages already in flight, resident or busy are left out.
    pub fn start_after(&self, region: &RegionInner, (reg_idx, reg_gen): (usize, u32), faulting: usize, w: Window) {
        if self.ra.windows == 0 || w.len < self.ra.window_pages {
            return;
        }
        let forward = w.start == faulting;
        let backward = w.end() == faulting + 1;
        if forward == backward {
            return; // centred (or a single page): not a stream
        }
        for k in 1..=self.ra.windows {
            let next = if forward {
                let start = w.end() + (k - 1) * w.len;
                if start >= region.nr_pages {
                    return;
                }
                Window { start, len: w.len.min(region.nr_pages - start) }
            } else {
                let Some(start) = w.start.checked_sub(k * w.len) else { return };
                Window { start, len: w.len }
            };
            self.start(region, (reg_idx, reg_gen), next);
        }
    }

    /// Starts an asynchronous read of the swapped pages of `w` (those on the device of its
    /// first such page) into a free context.
    fn start(&self, region: &RegionInner, (reg_idx, reg_gen): (usize, u32), w: Window) {
        // Cheap check first: anything to read, and on which device?
        let Some(device) = (w.start..w.end()).find_map(|q| {
            let pte = region.load(q);
            (pte.state() == PageState::Swapped && !pte.async_read() && !pte.busy()).then(|| pte.entry().device())
        }) else {
            return;
        };
        // A free context of that device: round robin, never waiting for one.
        let n = self.ra.contexts.len();
        let first = self.ra.next.fetch_add(1, Ordering::Relaxed);
        let Some((ctx, mut io)) = (0..n).map(|k| (first + k) % n).find_map(|i| {
            let c = &self.ra.contexts[i];
            if c.device != device {
                return None;
            }
            c.io.try_lock().map(|g| (i, g))
        }) else {
            return;
        };
        let c = &self.ra.contexts[ctx];
        self.retire(c, &mut io);
        let pages = lock_window(region, w, device, c.owner.len());
        if pages.is_empty() {
            return;
        }
        let started = list_and_read(c, &mut io, &pages, (reg_idx, reg_gen));
        for (i, &(_, q, locked)) in pages.iter().enumerate() {
            if started {
                region.store(q, locked.with_async_read().unbusy());
            } else {
                c.owner[i].store(0, Ordering::Release);
                region.store(q, locked.unbusy());
            }
        }
        if started {
            self.stats.add(Counter::SwapRaAsyncStarted, pages.len() as u64);
        }
    }

    /// Makes a context reusable: waits for its reads, throws away what nobody claimed, and
    /// takes the async-read hint off those pages when they can be locked at once.
    fn retire(&self, c: &Context, io: &mut ContextIo) {
        io.wait();
        let mut set = RegionSet::new();
        let mut dropped = 0;
        for i in 0..c.owner.len() {
            let owner = c.owner[i].load(Ordering::Acquire);
            if owner == 0 || !c.claim(i, owner) {
                continue;
            }
            dropped += 1;
            let r = PageRef::from_owner(owner);
            let Ok(gi) = set.get(self.id, r) else { continue };
            let region = &set.g[gi];
            let pte = region.load(r.page);
            let entry = SwapEntry::from_bits(c.entry[i].load(Ordering::Relaxed));
            if pte.state() == PageState::Swapped && pte.async_read() && pte.entry() == entry {
                if let Some(locked) = region.try_lock(r.page, pte) {
                    region.store(r.page, locked.without_async_read().unbusy());
                }
            }
        }
        self.stats.add(Counter::SwapRaAsyncDropped, dropped);
    }
}

/// A page of an asynchronous read: its entry, its index in the region, its word as locked.
type Locked = (SwapEntry, usize, crate::region::Pte);

/// Locks the swapped pages of `w` on `device` not read asynchronously already, up to `cap`
/// (a context's buffer), in slot order, so that runs of consecutive slots land in
/// consecutive buffer pages.
fn lock_window(region: &RegionInner, w: Window, device: usize, cap: usize) -> ArrayVec<Locked, MAX_WINDOW_PAGES> {
    let mut pages: ArrayVec<Locked, MAX_WINDOW_PAGES> = ArrayVec::new();
    for q in w.start..w.end() {
        if pages.len() == cap {
            break;
        }
        let pte = region.load(q);
        if pte.state() != PageState::Swapped || pte.async_read() || pte.entry().device() != device {
            continue;
        }
        if let Some(locked) = region.try_lock(q, pte) {
            pages.push((pte.entry(), q, locked));
        }
    }
    pages.sort_unstable_by_key(|&(e, _, _)| e);
    pages
}

/// Lists the locked `pages` (sorted by slot) in context `c`, whose lock `io` the caller
/// holds, and starts their reads, a run of consecutive slots each. Returns whether the
/// reads started (if not, the listings stay, for the caller to clear).
fn list_and_read(c: &Context, io: &mut ContextIo, pages: &[Locked], (reg_idx, reg_gen): (usize, u32)) -> bool {
    // Retired, under its lock: nothing is listed (a claim only clears a listing, and only a
    // starter holding the lock makes one).
    debug_assert!(c.owner.iter().all(|o| o.load(Ordering::Relaxed) == 0), "a retired context lists nothing");
    assert!(pages.len() <= c.owner.len(), "uswap invariant: an asynchronous read larger than its buffer");
    io.runs.clear();
    for (i, &(e, q, locked)) in pages.iter().enumerate() {
        debug_assert!(locked.busy() && locked.state() == PageState::Swapped && locked.entry() == e);
        let owner = PageRef { region_idx: reg_idx, region_gen: reg_gen, page_gen: locked.gen(), page: q }.owner();
        c.entry[i].store(e.bits(), Ordering::Relaxed);
        c.owner[i].store(owner, Ordering::Release);
        match io.runs.last_mut() {
            Some(r) if r.slot + r.nr_pages as u64 == e.offset() => r.nr_pages += 1,
            _ => io.runs.push(AsyncRun { slot: e.offset(), first_page: i, nr_pages: 1 }),
        }
    }
    let runs = io.runs.clone();
    let started = io.reader.start(&runs);
    io.waited = !started;
    if !started {
        io.runs.clear();
    }
    started
}
