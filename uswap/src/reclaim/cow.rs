//! Pages a fork shares: made exclusive again so that reclaim can move them out.
//!
//! After `fork()` every private page of the parent is shared copy-on-write with the child,
//! and stays marked so (not `PageAnonExclusive`) until the parent writes it, even after the
//! child exits. `UFFDIO_MOVE` refuses such a page (`EBUSY`), so a parent that forks (Redis'
//! BGSAVE, Python's `multiprocessing`) could not get back under its limit. The kernel's own
//! reclaim unmaps a shared page from one process through its reverse map; user space cannot,
//! so this does what a write would do, without writing: `MADV_POPULATE_WRITE` copies the page
//! for this process (or, once the child has gone, just marks it exclusive), and the next
//! reclaim round moves it out like any other page. The copy costs a page of RAM for a moment,
//! until that round; nothing else changes.
//!
//! Swap-out queues the pages it was refused with `EBUSY` ([`queue`]); the background
//! reclaimer breaks them ([`break_queued`]) one at a time. It owns a page only to make a
//! clean one dirty (its slot's copy goes stale once it is writable), and populates it owning
//! nothing: `MADV_POPULATE_WRITE` on a page the application discarded at that very moment
//! (`MADV_DONTNEED` racing with reclaim) or that direct reclaim moved out meanwhile faults
//! into the engine, and that fault must find the page free. (Owning it, the reclaimer's
//! fault waited in thread mode for a handler that waited for the page, or for the handler
//! applying the discard's event, which holds the descriptor's reader lock: a deadlock.) In
//! signal mode that fault fails the call (`EFAULT`); in thread mode a handler serves it like
//! any other. Populating changes no byte, so a page that moved on meanwhile is only faulted
//! in (the next round takes it out again).
//!
//! Pinned pages are refused with `EBUSY` too (io_uring's registered buffers); populating
//! them changes nothing (they are exclusive already), and they are refused again
//! (`move_refused`). A page queued again within [`POPULATED_RECENTLY_NS`] of its populate is
//! taken for pinned: not queued (each queueing woke the background reclaimer, whose rounds
//! were refused and queued it again: a program that registered 24 MiB of buffers under
//! 16 MiB spent 3.0 s of CPU in 3 s asleep; 0.3 s now), nor populated. After that time it
//! is populated once more (the pin may have ended, or a new fork shares it).
//!
//! The other side, in a fork child ([`adopt_exclusive`]): the pages it inherited stay mapped,
//! shared with the parent and charged to it (`PageState::Shared`). Once the parent lets go
//! of one (writes it, and so gets a copy of its own, or has it copied by the pass above and
//! moves it out), the child's is the only mapping left, and nobody was charged for it: the
//! tree's memory passed its limit by that page without a word. The child finds such pages
//! in its page table (`/proc/self/pagemap`, "exclusively mapped"), charges them to itself
//! and puts them on its LRU, from where its reclaim moves them out like its own (they are
//! exclusive now, so `UFFDIO_MOVE` takes them): at most [`ADOPT_BATCH`] pages per pass, so
//! that the charge they add is reclaimed as it comes rather than all at once. A page several
//! children still share is nobody's alone and stays uncharged until all but one have let go
//! of it.
//!
//! Locking: none; a clean page is owned through its busy bit while it is made dirty.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

use super::Reclaim;
use crate::mapping::{for_each_exclusive_page, page_present, populate_write};
use crate::region::{PageRef, PageState, Pte, RegionInner, RegionSet, REGIONS, REGION_GEN_MASK};
use crate::stats::Counter;
use crate::uffd::PAGE_SIZE;

/// Pages one call of [`break_queued`] handles (bounds the background period).
const MAX_PER_CALL: usize = 1024;
/// How long a page populated here is taken for pinned if it is queued again: short, as a
/// page a new fork shares again waits that long for its next populate.
const POPULATED_RECENTLY_NS: u64 = 1_000_000_000;
/// Pages populated lately, by page number (lossy: a page whose slot another took is
/// populated again; 16,384 pages, 64 MiB of buffers, keep slots of their own), and when.
/// Only the background reclaimer's [`break_queued`] reads and writes them.
const NR_POPULATED: usize = 1 << 14;
static POPULATED_ADDR: [AtomicUsize; NR_POPULATED] = [const { AtomicUsize::new(0) }; NR_POPULATED];
static POPULATED_NS: [AtomicU64; NR_POPULATED] = [const { AtomicU64::new(0) }; NR_POPULATED];

/// Whether the page at `addr` was populated here within [`POPULATED_RECENTLY_NS`]: refused
/// again since, it is pinned. Lock-free, allocation-free.
fn populated_recently(addr: usize, now_ns: u64) -> bool {
    let i = (addr / PAGE_SIZE) % NR_POPULATED;
    POPULATED_ADDR[i].load(Ordering::Relaxed) == addr
        && now_ns.saturating_sub(POPULATED_NS[i].load(Ordering::Relaxed)) < POPULATED_RECENTLY_NS
}

/// Notes that the page at `addr` is populated now (the background reclaimer only).
fn note_populated(addr: usize, now_ns: u64) {
    let i = (addr / PAGE_SIZE) % NR_POPULATED;
    POPULATED_ADDR[i].store(addr, Ordering::Relaxed);
    POPULATED_NS[i].store(now_ns, Ordering::Relaxed);
}
/// Pages one pass of [`adopt_exclusive`] takes over at most (1 MiB; a pass every 100 ms while
/// passes find some, up to 1.6 s apart while they find none: `reclaim::background`).
const ADOPT_BATCH: usize = 256;
/// Queues a page `UFFDIO_MOVE` refused with `EBUSY` (shared with a fork child, or pinned).
/// Lock-free, allocation-free.
pub(crate) fn queue(cx: &Reclaim<'_>, r: PageRef) {
    // Taken for pinned (see the module doc): neither queued nor a reason to wake the
    // background reclaimer, whose own refusals of it woke it at once, for good.
    let addr = REGIONS
        .get(r.region_idx, r.region_gen, REGION_GEN_MASK)
        .filter(|g| r.names_page_of(g.index, g.gen, g.nr_pages))
        .map(|g| g.page_addr(r.page));
    if addr.is_some_and(|addr| populated_recently(addr, crate::clock::now_ns())) {
        return;
    }
    if !cx.cow.push(r) {
        return;
    }
    cx.reclaimer.wake();
}

/// Makes the queued pages exclusive, one at a time. Returns how many it populated.
pub(crate) fn break_queued(cx: &Reclaim<'_>) -> usize {
    let mut broken = 0;
    for _ in 0..MAX_PER_CALL {
        if cx.charge.reclaim_held.load(Ordering::Acquire) || cx.shutdown.is_set() {
            break;
        }
        let Some(r) = cx.cow.pop() else { break };
        let mut guards = RegionSet::new();
        let Ok(gi) = guards.get(cx.id, r) else { continue };
        let region = &guards.g[gi];
        let pte = region.load(r.page);
        if pte.state() != PageState::Resident || pte.gen() != r.page_gen {
            continue; // it moved on (written, freed, or taken out after all)
        }
        let addr = region.page_addr(r.page);
        if pte.clean() && !make_dirty(cx, region, r.page, pte) {
            continue;
        }
        // Not mapped any more (moved out by direct reclaim, or discarded, since its word was
        // read): nothing is shared, and populating would only fault it back in.
        if !page_present(addr) {
            continue;
        }
        // Made exclusive lately and refused again: pinned (see the module doc).
        let now_ns = crate::clock::now_ns();
        if populated_recently(addr, now_ns) {
            continue;
        }
        note_populated(addr, now_ns);
        if populate_write(addr).is_ok() {
            cx.stats.inc(Counter::CowBroken);
            broken += 1;
        }
    }
    debug_assert!(broken <= MAX_PER_CALL);
    broken
}

/// A clean page about to be populated for writing becomes an ordinary dirty page, as on its
/// first write: unprotected (populating a write-protected page would fault into the engine)
/// and its slot freed. False when it moved on meanwhile or could not be unprotected.
fn make_dirty(cx: &Reclaim<'_>, region: &RegionInner, page: usize, pte: Pte) -> bool {
    let Some(locked) = region.try_lock(page, pte) else { return false };
    debug_assert!(locked.busy() && locked.state() == PageState::Resident && locked.clean());
    let addr = region.page_addr(page);
    if cx.uffd.writeprotect(addr, PAGE_SIZE, false, cx.mode.wakes()).is_err() {
        region.store(page, locked.unbusy());
        return false;
    }
    cx.devices.free(pte.entry(), false);
    // Counted clean when it was mapped so (`swapin::publish`), before its word said so.
    let clean_before = cx.clean_pages.fetch_sub(1, Ordering::Relaxed);
    debug_assert!(clean_before > 0, "a clean page uncounted");
    region.store(page, locked.dirtied());
    true
}

/// In a fork child: charges to this process the inherited pages it now maps alone, and puts
/// them on its LRU (see the module doc). Returns how many, or `None` where it did not look:
/// not a fork child (or not one yet: its regions are taken over after its reclaimer starts),
/// or reclaim held (a fork being prepared). System calls (`pagemap`): the background
/// reclaimer only. Bounded by the regions' pages.
pub(crate) fn adopt_exclusive(cx: &Reclaim<'_>) -> Option<usize> {
    if !cx.parent.is_set() || cx.charge.reclaim_held.load(Ordering::Acquire) {
        return None;
    }
    let mut adopted = 0;
    REGIONS.for_each(|r| {
        if r.pager.id() != cx.id {
            return;
        }
        for (first, end) in r.live_runs() {
            let end = end.min(r.touched_end());
            let mut page = first;
            // Bounded: each round moves `page` past a run of shared pages, or by one; a full
            // batch ends the pass (the rest waits for the next, unread).
            while page < end && adopted < ADOPT_BATCH {
                if r.load(page).state() != PageState::Shared {
                    page += 1;
                    continue;
                }
                let run = (page..end).take_while(|&q| r.load(q).state() == PageState::Shared).count();
                let _ = for_each_exclusive_page(r.page_addr(page), run, |i| {
                    if adopted < ADOPT_BATCH {
                        adopted += usize::from(adopt_page(cx, r, r.index, r.gen, page + i));
                    }
                });
                page += run;
            }
        }
    });
    // The pass's pacing: the charge it adds is at most a batch (see the module doc).
    debug_assert!(adopted <= ADOPT_BATCH, "a pass adopts at most a batch");
    Some(adopted)
}

/// Makes an inherited page this process maps alone its own: writable, charged, on the LRU.
fn adopt_page(cx: &Reclaim<'_>, r: &RegionInner, region_idx: usize, region_gen: u32, page: usize) -> bool {
    let pte = r.load(page);
    if pte.state() != PageState::Shared {
        return false; // written meanwhile (then charged by its fault)
    }
    let Some(locked) = r.try_lock(page, pte) else { return false };
    // Only an inherited page is adopted: it was charged to nobody (`PageState::Shared`).
    debug_assert_eq!(locked.state(), PageState::Shared);
    // Its first write would otherwise fault for the charge it has now.
    if cx.uffd.writeprotect(r.page_addr(page), PAGE_SIZE, false, cx.mode.wakes()).is_err() {
        r.store(page, locked.unbusy());
        return false;
    }
    // Charged at once (the page is there, counted or not); the child's reclaim takes the
    // tree back under its limit, and `ADOPT_BATCH` paces the pages taken over so that it
    // keeps up.
    super::accounting::force_charge(cx.charge, 1);
    let new = locked.next(PageState::Resident, None);
    r.store(page, new);
    cx.lru.add(PageRef { region_idx, region_gen, page_gen: new.gen(), page }, cx.stats);
    cx.stats.inc(Counter::SharedAdopted);
    true
}
