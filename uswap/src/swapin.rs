//! Swap-in: brings a swapped-out page back from its device together with the pages its
//! readahead window adds, in as few device reads and ioctls as possible.
//!
//! The window comes from the faulting region's streams (VMA-style readahead, by virtual
//! address) or, for a device configured for cluster readahead, from the device's streams over
//! slot numbers (the pre-2017 kernel policy: neighbouring slots, whichever pages own them).
//! Only pages that are on a device and not busy are read (the 2016 "skip readahead for
//! unreferenced slots"). The pages are read in runs of consecutive slots — one request per
//! run, one `read` call (one io_uring submission) per device — and mapped in runs of
//! consecutive addresses, one `UFFDIO_COPY` per run. In thread mode, read-ahead pages are mapped
//! write-protected and keep their slot (they are clean), and carry the readahead mark until
//! their use is detected (see `readahead`).
//!
//! Pages an asynchronous readahead already read (see `async_readahead`) are mapped straight
//! from its buffer; the next windows of a sequential stream are started on the way out.
//!
//! Locking: every page of the window is owned through its busy bit for the whole operation;
//! the pages of other regions (cluster readahead) through their registry guards. A page
//! already busy is simply left out. When the faulting page was read asynchronously, only the
//! pages listed in the same context are taken from a buffer; that context is locked from the
//! moment its buffer is read until the pages are mapped, after the charge (which may
//! reclaim, and so write) and the other reads, so that none of those runs under it.

use std::sync::atomic::Ordering;

use arrayvec::ArrayVec;

use std::sync::atomic::{AtomicBool, AtomicUsize};

use crate::async_readahead::AsyncRa;
use crate::backend::{BackendError, ReadReq};
use crate::bounce::BounceBuffers;
use crate::lru::Lru;
use crate::options::FaultMode;
use crate::readahead::{Window, MAX_WINDOW_PAGES};
use crate::reclaim::Reclaim;
use crate::region::{PageRef, PageState, Pte, RegionInner, RegionSet};
use crate::state::async_readahead::ContextIo;
use crate::state::clean_bets::CleanBets;
use crate::state::fault_error::FaultError;
use crate::state::route::Route;
use crate::state::{ErrorLog, PageErrorKind, PagerId, PagerShared};
use crate::stats::{Counter, PerCpuStats};
use crate::swap::{ReadaheadPolicy, SwapDevices, SwapEntry};
use crate::sync::SpinGuard;
use crate::uffd::{RangeResult, Uffd, PAGE_SIZE};

/// Swap-in's context: the devices it reads and frees slots on, the regions' descriptor and
/// the fault mode (`UFFDIO_COPY`, whether to keep pages clean), the reclaim lists it adds the
/// pages to and the clean-page count, the readahead switch and window, bounce buffers, the
/// asynchronous readahead contexts ([`AsyncRa`]), the charge (through [`Reclaim`], which
/// may reclaim to make room), counters and the error log. Built by
/// [`PagerShared::swap_in_cx`].
#[derive(Clone, Copy)]
pub(crate) struct SwapIn<'a> {
    id: PagerId,
    uffd: &'a Uffd,
    mode: FaultMode,
    clean_pages: &'a AtomicUsize,
    clean_bets: &'a CleanBets,
    devices: &'a SwapDevices,
    lru: &'a Lru,
    stats: &'a PerCpuStats,
    readahead: &'a AtomicBool,
    readahead_max_pages: usize,
    bounce: &'a BounceBuffers,
    errors: &'a ErrorLog,
    reclaim: Reclaim<'a>,
    async_ra: AsyncRa<'a>,
}

impl PagerShared {
    /// Swap-in's context (see [`SwapIn`]).
    pub(crate) fn swap_in_cx(&self) -> SwapIn<'_> {
        SwapIn {
            id: self.id(),
            uffd: &self.uffd,
            mode: self.mode,
            clean_pages: &self.clean_pages,
            clean_bets: &self.clean_bets,
            devices: &self.devices,
            lru: &self.lru,
            stats: &self.stats,
            readahead: &self.readahead,
            readahead_max_pages: self.readahead_max_pages,
            bounce: &self.bounce,
            errors: &self.errors,
            reclaim: self.reclaim_cx(),
            async_ra: self.async_ra_cx(),
        }
    }
}

/// Attempts per device read before the fault is reported as failed.
pub(crate) const READ_ATTEMPTS: usize = 3;

/// A page taking part in one swap-in.
#[derive(Clone, Copy)]
struct Item {
    /// `None`: the faulting region; `Some(i)`: guard `i` of the set (cluster readahead).
    gi: Option<usize>,
    page: usize,
    /// The page's word as locked (busy set).
    pte: Pte,
    /// The faulting page itself.
    faulting: bool,
    /// Read back and checked: it will be mapped.
    ok: bool,
    /// Where its data is once `ok`.
    src: *const u8,
    /// Its buffer page in the locked asynchronous-readahead context, if listed there.
    listed: Option<usize>,
    /// Its data came from an asynchronous read.
    from_async: bool,
    /// Mapped write-protected, keeping its slot (see [`keep_clean`]): decided once, before
    /// it is mapped, and published as mapped.
    clean: bool,
}

impl Item {
    fn new(gi: Option<usize>, page: usize, pte: Pte, faulting: bool, listed: Option<usize>) -> Item {
        Item { gi, page, pte, faulting, ok: false, src: std::ptr::null(), listed, from_async: false, clean: false }
    }

    fn entry(&self) -> SwapEntry {
        self.pte.entry()
    }
}

/// The asynchronous-readahead context locked for this swap-in: its index and guard.
type HeldContext<'a> = Option<(usize, SpinGuard<'a, ContextIo>)>;

/// The fault being served, and where: its region and page, the page's entry locked, whether
/// it writes, and its route (`crate::fault_service` builds one per fault it serves).
pub(crate) struct FaultSite<'a> {
    pub region: &'a RegionInner,
    pub reg_idx: usize,
    pub reg_gen: u32,
    pub page: usize,
    /// The faulting page, locked, in state SWAPPED (or PARENT, for `fault_service::parent_in`).
    pub locked: Pte,
    pub write: bool,
    pub route: Route,
}

impl FaultSite<'_> {
    fn region<'s>(&'s self, set: &'s RegionSet, gi: Option<usize>) -> &'s RegionInner {
        match gi {
            None => self.region,
            Some(i) => &set.g[i],
        }
    }

    /// The reverse-map owner of page `page` of the faulting region.
    fn owner(&self, page: usize) -> u64 {
        PageRef { region_idx: self.reg_idx, region_gen: self.reg_gen, page_gen: 0, page }.owner()
    }

    fn page_ref(&self, set: &RegionSet, it: &Item, pte: Pte) -> PageRef {
        match it.gi {
            None => PageRef { region_idx: self.reg_idx, region_gen: self.reg_gen, page_gen: pte.gen(), page: it.page },
            Some(i) => set.page_ref(i, it.page, pte),
        }
    }
}

/// Brings the faulting page back, with its readahead window.
pub(crate) fn swap_in(cx: &SwapIn<'_>, f: &FaultSite<'_>) -> Result<(), FaultError> {
    assert_eq!(f.locked.state(), PageState::Swapped);
    debug_assert!(f.locked.busy(), "the faulting page is owned by this fault");
    let readahead = !f.route.lock_free() && cx.readahead.load(Ordering::Relaxed);
    let max = if readahead { cx.readahead_max_pages } else { 1 };
    let async_ctx = async_context(cx, f);
    let mut set = RegionSet::new();
    let mut items: ArrayVec<Item, MAX_WINDOW_PAGES> = ArrayVec::new();
    let vma_window = gather_window(cx, f, async_ctx, max, &mut set, &mut items);

    crate::state::route::note_window(items.len());
    // Read-ahead pages are charged like the faulting page, reclaiming if need be (the kernel
    // charges its read-ahead pages to the memory cgroup too): the window only grows on
    // evidence that read-ahead pages are used.
    cx.reclaim.charge(items.len(), f.route.lock_free());

    // Read in slot order: runs of consecutive slots on one device are one request each.
    items.sort_unstable_by_key(|it| it.entry());
    // The window holds each slot once (each page was locked once, and a slot has one owner).
    assert!(
        items.windows(2).all(|w| w[0].entry() < w[1].entry()),
        "uswap invariant: a swap-in window lists a slot twice"
    );
    let Some(mut buf) = cx.bounce.take() else {
        // Every bounce buffer stayed lent out past the bound: nothing was read, every page
        // goes back as it was (its slot still holds it), and the fault fails rather than hang.
        give_back(cx, f, &set, &items);
        cx.stats.inc(Counter::BounceWaitTimeout);
        return Err(FaultError::BounceTimeout);
    };
    // What the last read that failed found, for the SIGBUS line.
    let mut failed = ReadFailure::default();
    // Held (if taken) until the pages from its buffer are mapped and published.
    let held = read_window(cx, f, async_ctx, &set, &mut items, buf.pages_mut(), &mut failed);

    if !items.iter().any(|it| it.faulting && it.ok) {
        // Nothing is mapped: every page goes back as it was (its slot still holds it).
        give_back(cx, f, &set, &items);
        let taken = items.iter().filter(|it| it.from_async).count();
        cx.stats.add(Counter::SwapRaAsyncDropped, taken as u64);
        return Err(FaultError::Device(failed.kind, failed.cause));
    }
    for it in items.iter_mut().filter(|it| it.ok) {
        it.clean = keep_clean(cx, f, it);
    }
    let mapping = map_runs(cx, f, &set, &mut items);
    let (nr_ra, nr_async) = publish(cx, f, &set, &items);
    if let Some(errno) = mapping.failed_errno {
        if !items.iter().any(|it| it.faulting && it.ok) {
            return Err(if mapping.gone_from_under { FaultError::Unmapped } else { FaultError::Ioctl(errno) });
        }
    }
    cx.stats.inc(Counter::Pgmajfault);
    cx.stats.add(Counter::Pswpin, mapping.nr_mapped as u64);
    cx.stats.add(Counter::SwapRa, nr_ra);
    cx.stats.add(Counter::SwapRaAsync, nr_async);
    drop(held);
    if let Some(w) = vma_window.filter(|_| readahead) {
        cx.async_ra.start_after(f.region, (f.reg_idx, f.reg_gen), f.page, w);
    }
    Ok(())
}

/// Locks the faulting page's readahead window (at most `max` pages), by address or by
/// slot as its device says, into `items`, the faulting page first. Returns the window when
/// it was by address (for the asynchronous readahead that follows it).
fn gather_window(
    cx: &SwapIn<'_>,
    f: &FaultSite<'_>,
    async_ctx: Option<usize>,
    max: usize,
    set: &mut RegionSet,
    items: &mut ArrayVec<Item, MAX_WINDOW_PAGES>,
) -> Option<Window> {
    debug_assert!(items.is_empty() && max >= 1);
    let listed = listed_in(cx, f, async_ctx, f.page, f.locked);
    items.push(Item::new(None, f.page, f.locked, true, listed));
    let window = match cx.devices.device(f.locked.entry()).readahead {
        ReadaheadPolicy::Vma => Some(gather_vma_window(cx, f, async_ctx, max, items)),
        ReadaheadPolicy::Cluster => {
            gather_cluster_window(cx, f, max, set, items);
            None
        }
    };
    // Every page of the window is owned by this fault and on a device.
    debug_assert!(
        items.iter().all(|it| it.pte.busy() && it.pte.state() == PageState::Swapped),
        "a swap-in window holds locked swapped pages"
    );
    window
}

/// Reads the window's pages into `buf` (see [`read_items`]): those not read ahead first,
/// with no lock held, then those listed in the asynchronous-readahead context `async_ctx`,
/// whose lock is taken here and returned, to be held until the pages from its buffer are
/// mapped; any listed page whose data is not there after all is read like the others,
/// under the lock.
fn read_window<'p>(
    cx: &SwapIn<'p>,
    f: &FaultSite<'_>,
    async_ctx: Option<usize>,
    set: &RegionSet,
    items: &mut [Item],
    buf: &mut [crate::backend::AlignedPage],
    failed: &mut ReadFailure,
) -> HeldContext<'p> {
    read_items(cx, f, set, items, buf, failed);
    let ctx = async_ctx.filter(|_| items.iter().any(|it| it.listed.is_some()))?;
    let mut io = cx.async_ra.context(ctx).io.lock();
    take_async(cx, f, ctx, &mut io, items);
    if items.iter().any(|it| !it.ok) {
        read_items(cx, f, set, items, buf, failed);
    }
    Some((ctx, io))
}

/// The asynchronous readahead context that may hold the faulting page's data, if its
/// read was started. Its lock is taken only once the other reads and the charge are done,
/// so that those do not run under it. On the lock-free route, where no lock may be taken,
/// the data is thrown away (the slot is read instead).
fn async_context(cx: &SwapIn<'_>, f: &FaultSite<'_>) -> Option<usize> {
    if !f.locked.async_read() {
        return None;
    }
    let (own, e) = (f.owner(f.page), f.locked.entry());
    if f.route.lock_free() {
        cx.async_ra.forget_page(own, e);
        return None;
    }
    cx.async_ra.find(own, e).map(|l| l.ctx)
}

/// The buffer page holding `page`'s data in the asynchronous readahead context `async_ctx`
/// (the one the faulting page was found in), if it is listed there.
fn listed_in(cx: &SwapIn<'_>, f: &FaultSite<'_>, async_ctx: Option<usize>, page: usize, pte: Pte) -> Option<usize> {
    cx.async_ra.context(async_ctx?).index_of(f.owner(page), pte.entry())
}

/// Readahead by virtual address: locks the swapped pages of the faulting region's window
/// (see `readahead`) and adds them to `items`. Returns the window.
fn gather_vma_window(
    cx: &SwapIn<'_>,
    f: &FaultSite<'_>,
    async_ctx: Option<usize>,
    max: usize,
    items: &mut ArrayVec<Item, MAX_WINDOW_PAGES>,
) -> Window {
    let pred = f.region.streams.advance(f.page, f.region.nr_pages, max, true);
    if let Some(passed) = pred.passed {
        count_hits_in_region(cx, f.region, passed, f.page);
    }
    for q in (pred.window.start..pred.window.end()).filter(|&q| q != f.page) {
        let pte = f.region.load(q);
        if pte.state() != PageState::Swapped || pte.busy() {
            continue;
        }
        // A page read asynchronously is taken only from the context we hold; others wait for
        // their own fault, which will find their data.
        let listed = listed_in(cx, f, async_ctx, q, pte);
        if pte.async_read() && listed.is_none() {
            continue;
        }
        if let Some(l) = f.region.try_lock(q, pte) {
            items.push(Item::new(None, q, l, false, listed));
        }
    }
    pred.window
}

/// Readahead by slot (`ReadaheadPolicy::Cluster`): locks the pages that own the slots
/// around the faulting one on its device, whatever their regions, and adds them to `items`.
fn gather_cluster_window(
    cx: &SwapIn<'_>,
    f: &FaultSite<'_>,
    max: usize,
    set: &mut RegionSet,
    items: &mut ArrayVec<Item, MAX_WINDOW_PAGES>,
) {
    let e = f.locked.entry();
    let dev = cx.devices.device(e);
    let pred = dev.cluster_streams.advance(e.offset() as usize, dev.nr_slots() as usize, max, true);
    if let Some(passed) = pred.passed {
        count_hits_by_slot(cx, e.device(), passed);
    }
    for slot in (pred.window.start..pred.window.end()).filter(|&s| s as u64 != e.offset()) {
        let Some(info) = dev.slot_info(slot as u64) else { continue };
        let r = PageRef::from_owner(info.owner);
        let Ok(gi) = set.get(cx.id, r) else { continue };
        let region = &set.g[gi];
        let pte = region.load(r.page);
        let own = SwapEntry::new(e.device(), slot as u64);
        if pte.state() == PageState::Swapped && pte.entry() == own && !pte.busy() && !pte.async_read() {
            if let Some(l) = region.try_lock(r.page, pte) {
                items.push(Item::new(Some(gi), r.page, l, false, None));
            }
        }
    }
}

/// Nothing was mapped: every page of the window goes back as it was (its slot still holds
/// it), and its charge is dropped.
fn give_back(cx: &SwapIn<'_>, f: &FaultSite<'_>, set: &RegionSet, items: &[Item]) {
    for it in items {
        f.region(set, it.gi).store(it.page, it.pte.unbusy());
    }
    cx.reclaim.uncharge(items.len());
}

/// What mapping a window's pages did.
struct Mapped {
    nr_mapped: usize,
    /// The errno of a failed copy, if one failed.
    failed_errno: Option<i32>,
    /// The faulting page has no registered mapping any more (the application unmapped it).
    gone_from_under: bool,
}

/// Maps the pages read (`ok`), in runs of consecutive addresses with consecutive buffer
/// pages and one protection, one `UFFDIO_COPY` each. A page whose copy failed is no longer
/// `ok`.
fn map_runs(cx: &SwapIn<'_>, f: &FaultSite<'_>, set: &RegionSet, items: &mut [Item]) -> Mapped {
    let mut m = Mapped { nr_mapped: 0, failed_errno: None, gone_from_under: false };
    let mut faulting_errno = None;
    let mut i = 0;
    while i < items.len() {
        if !items[i].ok {
            i += 1;
            continue;
        }
        // Kept clean (write-protected, slot kept): see `keep_clean`.
        let mut j = i + 1;
        while j < items.len()
            && items[j].ok
            && items[j].gi == items[i].gi
            && items[j].page == items[j - 1].page + 1
            && items[j].clean == items[i].clean
            && items[j].src == items[j - 1].src.wrapping_add(PAGE_SIZE)
        {
            j += 1;
        }
        let region = f.region(set, items[i].gi);
        let len = (j - i) * PAGE_SIZE;
        let r = cx.uffd.copy(region.page_addr(items[i].page), items[i].src, len, f.route.wake(), items[i].clean);
        let done = r.done_bytes(len) / PAGE_SIZE;
        if let RangeResult::Partial { errno, .. } = r {
            m.failed_errno = Some(errno);
            for it in &mut items[i + done..j] {
                if it.faulting {
                    faulting_errno = Some(errno);
                }
                it.ok = false;
            }
        }
        m.nr_mapped += done;
        i = j;
    }
    // ENOENT: the run was not inside one registered mapping. Whether the faulting page has
    // none (a stale fault on a page the application unmapped since, see
    // `FaultError::Unmapped`) or only other pages of its run (the mapping was split
    // meanwhile), a copy of that page alone tells, and serves it in the second case.
    if faulting_errno == Some(libc::ENOENT) {
        if let Some(k) = items.iter().position(|it| it.faulting) {
            let it = &items[k];
            match cx.uffd.copy(f.region.page_addr(it.page), it.src, PAGE_SIZE, f.route.wake(), it.clean) {
                RangeResult::Done => {
                    items[k].ok = true;
                    m.nr_mapped += 1;
                }
                RangeResult::Partial { errno, .. } => m.gone_from_under = errno == libc::ENOENT,
            }
        }
    }
    m
}

/// Whether the page of `entry`, read back for the fault, left so recently that it belongs to
/// the working set (`crate::lru`, "refault distance"): then reclaim spares it once.
fn refault_in_workingset(cx: &SwapIn<'_>, entry: SwapEntry) -> bool {
    let left = cx.devices.device(entry).stamp_of(entry.offset());
    left.is_some_and(|s| cx.lru.refault_in_workingset(s.eviction))
}

/// Publishes the window: mapped pages become resident (clean ones keep their slot, the
/// others' slots are freed) and join the LRU; the others go back as they were, uncharged.
/// Returns the pages mapped by readahead, and those of them read asynchronously.
fn publish(cx: &SwapIn<'_>, f: &FaultSite<'_>, set: &RegionSet, items: &[Item]) -> (u64, u64) {
    let (mut nr_ra, mut nr_async, mut unmapped) = (0, 0, 0);
    for it in items {
        let region = f.region(set, it.gi);
        if !it.ok {
            region.store(it.page, it.pte.unbusy());
            unmapped += 1;
            if it.from_async {
                cx.stats.inc(Counter::SwapRaAsyncDropped);
            }
            continue;
        }
        // Read before the slot goes or is unstamped: how the page left.
        let in_workingset = it.faulting && refault_in_workingset(cx, it.entry());
        let new = if !it.clean {
            cx.devices.free(it.entry(), f.route.lock_free());
            it.pte.next(PageState::Resident, None)
        } else {
            // Clean: mapped write-protected, it keeps its slot, and is in use again.
            cx.clean_pages.fetch_add(1, Ordering::Relaxed);
            cx.devices.device(it.entry()).unstamp(it.entry().offset());
            it.pte.next(PageState::Resident, Some(it.entry())).with_clean()
        };
        nr_async += u64::from(it.from_async);
        let new = if it.faulting {
            if it.from_async {
                // Read ahead (asynchronously) and now used: the kernel's swap-cache hit on a
                // read-ahead page.
                cx.stats.inc(Counter::SwapRa);
                cx.stats.inc(Counter::SwapRaHit);
                f.region.streams.note_used(1);
            }
            new
        } else {
            nr_ra += 1;
            new.with_readahead()
        };
        // Referenced clean too: reclaim spares it only once it is written (`reclaim::victims`:
        // a clean page leaves without a write), as thread mode's read-then-write pages are.
        if in_workingset {
            cx.stats.inc(Counter::WorkingsetActivate);
        }
        let new = new.with_referenced(in_workingset);
        region.store(it.page, new);
        cx.lru.add_mapped(f.page_ref(set, it, new), it.faulting, items.len(), cx.stats);
    }
    cx.reclaim.uncharge(unmapped);
    (nr_ra, nr_async)
}

/// Takes the data of the items listed in the held asynchronous-readahead context from its
/// buffer (waiting for its reads if need be), checking checksums. Items whose data is not
/// there (the read failed, the listing was claimed meanwhile) are left for `read_items`.
fn take_async(cx: &SwapIn<'_>, f: &FaultSite<'_>, ctx: usize, io: &mut ContextIo, items: &mut [Item]) {
    if !items.iter().any(|it| it.listed.is_some()) {
        return;
    }
    if io.wait() {
        cx.stats.inc(Counter::SwapRaAsyncWait);
    }
    let c = cx.async_ra.context(ctx);
    for it in items.iter_mut() {
        let Some(i) = it.listed.take() else { continue };
        let e = it.entry();
        let own = f.owner(it.page);
        if !(c.listed_at(i, own, e) && c.claim(i, own)) {
            continue;
        }
        let dev = cx.devices.device(e);
        let data = io.page(i).filter(|_| io.page_ok(i));
        let Some(data) = data else {
            cx.errors.record(f.region.page_addr(it.page), e, PageErrorKind::ReadFailed);
            cx.stats.inc(Counter::SwapRaAsyncDropped);
            continue;
        };
        if !dev.checksum_ok(e.offset(), data) {
            cx.stats.inc(Counter::ChecksumError);
            cx.stats.inc(Counter::SwapRaAsyncDropped);
            cx.errors.record(f.region.page_addr(it.page), e, PageErrorKind::ChecksumMismatch);
            continue;
        }
        it.ok = true;
        it.src = data.as_ptr();
        it.from_async = true;
    }
}

/// Whether a page comes in clean: write-protected, keeping its slot, so that reclaim can drop
/// it without writing it, at the price of a write-protect fault on its first write. Asked
/// once per page of a swap-in, before it is mapped ([`Item::clean`]).
///
/// * The faulting page of a read, while its device is under half full (the kernel keeps a
///   page's swap-cache copy only while swap is, `vm_swap_full`: the copy takes room new
///   pages may need): usually evicted untouched, never paying the fault. In thread mode,
///   always; in signal mode, where a lost bet is a SIGBUS round trip, while the pager's
///   bets win ([`CleanBets`]), and only where every system call of the C library is
///   routed through the guard and every thread has its alternate signal stack (`uswap
///   run`'s processes, `uffd::sigbus::system_calls_routed`, the rule for read faults'
///   zero pages too): otherwise a write-protected page cannot be written by the kernel (a
///   `read(2)` into it fails with `EFAULT`, as its write-protect fault would need a SIGBUS
///   the kernel does not send for its own accesses), so a page the thread has just touched
///   must be mapped writable.
/// * Read-ahead pages of devices where a write costs I/O (`DeviceConfig::clean_readahead`),
///   or with cluster readahead, which finds its pages through their slots' owners.
fn keep_clean(cx: &SwapIn<'_>, f: &FaultSite<'_>, it: &Item) -> bool {
    let dev = cx.devices.device(it.entry());
    if !it.faulting {
        return cx.mode == FaultMode::Thread && (dev.clean_readahead || dev.readahead == ReadaheadPolicy::Cluster);
    }
    if f.write || !dev.has_room_for_copies() {
        return false;
    }
    match cx.mode {
        FaultMode::Thread => true,
        FaultMode::Signal => crate::uffd::sigbus::system_calls_routed() && cx.clean_bets.place(),
    }
}

/// Whether pages of this entry's device are copied straight from the device's memory.
fn in_place(cx: &SwapIn<'_>, e: SwapEntry) -> bool {
    let dev = cx.devices.device(e);
    !dev.has_checksums() && dev.backend.page_ptr(e.offset()).is_some()
}

/// The device's own copy of an entry's page (an in-place device).
fn dev_page_ptr(cx: &SwapIn<'_>, e: SwapEntry) -> *const u8 {
    cx.devices.device(e).backend.page_ptr(e.offset()).unwrap_or(std::ptr::null())
}

/// What the last device read that failed found: the kind of failure, and what the device
/// said of it (`BackendError::cause`). A checksum mismatch after a read that said
/// something keeps what was said: the SIGBUS line then names the device's cause, which is
/// what a user can act on.
#[derive(Clone, Copy)]
struct ReadFailure {
    kind: PageErrorKind,
    cause: &'static str,
}

impl Default for ReadFailure {
    fn default() -> ReadFailure {
        ReadFailure { kind: PageErrorKind::ReadFailed, cause: "" }
    }
}

impl ReadFailure {
    /// A read returned data that failed its checksum here.
    fn checksum_mismatch(&mut self) {
        if self.cause.is_empty() {
            self.kind = PageErrorKind::ChecksumMismatch;
        }
    }
}

/// Reads every item not read in place into `buf[i]` (item `i`, items sorted by entry),
/// checking checksums, and marks the items read correctly. `failed`: what the last read
/// that failed found.
fn read_items(
    cx: &SwapIn<'_>,
    f: &FaultSite<'_>,
    set: &RegionSet,
    items: &mut [Item],
    buf: &mut [crate::backend::AlignedPage],
    failed: &mut ReadFailure,
) {
    assert!(items.len() <= buf.len());
    let mut attempts_left = READ_ATTEMPTS;
    // Bounded: each round either marks every item, or spends one attempt on the failures.
    loop {
        let mut i = 0;
        while i < items.len() {
            let e = items[i].entry();
            if items[i].ok || items[i].listed.is_some() {
                i += 1;
                continue;
            }
            if in_place(cx, e) {
                items[i].ok = true;
                items[i].src = dev_page_ptr(cx, e);
                i += 1;
                continue;
            }
            // All unread items of this device.
            let mut end = i;
            while end < items.len() && items[end].entry().device() == e.device() {
                end += 1;
            }
            read_from_device(cx, f, set, &mut items[i..end], &mut buf[i..end], failed);
            i = end;
        }
        let faulting_ok = items.iter().any(|it| it.faulting && it.ok);
        let unread = items.iter().any(|it| !it.ok && it.listed.is_none());
        attempts_left -= 1;
        if faulting_ok || !unread || attempts_left == 0 {
            return;
        }
    }
}

/// Reads the unread `items` (all of one device, in slot order) into `buf` (one page per
/// item), as runs of consecutive slots, one request each. An item read and matching its
/// checksum is `ok`; a failure is recorded, and kept in `failed`.
fn read_from_device(
    cx: &SwapIn<'_>,
    f: &FaultSite<'_>,
    set: &RegionSet,
    items: &mut [Item],
    buf: &mut [crate::backend::AlignedPage],
    failed: &mut ReadFailure,
) {
    let dev = cx.devices.device(items[0].entry());
    let unread = |it: &Item| !it.ok && it.listed.is_none();
    let mut runs: ArrayVec<(usize, usize), MAX_WINDOW_PAGES> = ArrayVec::new();
    let mut s = 0;
    while s < items.len() {
        if !unread(&items[s]) {
            s += 1;
            continue;
        }
        let mut t = s + 1;
        while t < items.len() && unread(&items[t]) && items[t].entry().offset() == items[t - 1].entry().offset() + 1 {
            t += 1;
        }
        runs.push((s, t));
        s = t;
    }
    // Items read into `buf` by this call (others were read before, or elsewhere).
    let mut fresh = [false; MAX_WINDOW_PAGES];
    {
        let mut reqs: ArrayVec<ReadReq<'_>, MAX_WINDOW_PAGES> = ArrayVec::new();
        let mut rest: &mut [crate::backend::AlignedPage] = buf;
        let mut at = 0;
        for &(s, t) in &runs {
            let (_, tail) = rest.split_at_mut(s - at);
            let (run, tail) = tail.split_at_mut(t - s);
            reqs.push(ReadReq::new(items[s].entry().offset(), run));
            rest = tail;
            at = t;
        }
        cx.stats.time_device_io(false, || dev.backend.read(&mut reqs));
        for (req, &(s, t)) in reqs.iter().zip(&runs) {
            if req.result.is_ok() {
                items[s..t].iter_mut().for_each(|it| it.ok = true);
                fresh[s..t].fill(true);
                continue;
            }
            // A device that checks its own data (the Redis tier's authenticated values)
            // reports a mismatch as Corrupt: a checksum error like ours.
            let kind = if matches!(req.result, Err(BackendError::Corrupt { .. })) {
                cx.stats.inc(Counter::ChecksumError);
                PageErrorKind::ChecksumMismatch
            } else {
                PageErrorKind::ReadFailed
            };
            let cause = req.result.as_ref().err().map_or("", BackendError::cause);
            *failed = ReadFailure { kind, cause };
            let it = &items[s];
            cx.errors.record_device(f.region(set, it.gi).page_addr(it.page), it.entry(), kind, cause);
        }
    }
    for k in (0..items.len()).filter(|&k| fresh[k]) {
        items[k].src = buf[k].0.as_ptr();
        if !dev.checksum_ok(items[k].entry().offset(), &buf[k].0) {
            // Never map a page that does not match what was written.
            items[k].ok = false;
            cx.stats.inc(Counter::ChecksumError);
            let addr = f.region(set, items[k].gi).page_addr(items[k].page);
            cx.errors.record(addr, items[k].entry(), PageErrorKind::ChecksumMismatch);
            failed.checksum_mismatch();
        }
    }
}

/// The stream ran over `w` in `region`: its read-ahead pages were used.
fn count_hits_in_region(cx: &SwapIn<'_>, region: &RegionInner, w: Window, faulting: usize) {
    let mut hits = 0;
    for q in (w.start..w.end()).filter(|&q| q != faulting && q < region.nr_pages) {
        if clear_readahead_mark(region, q) {
            hits += 1;
        }
    }
    cx.stats.add(Counter::SwapRaHit, hits);
    region.streams.note_used(hits);
}

/// Cluster readahead: the stream ran over slots `w` of device `dev`.
fn count_hits_by_slot(cx: &SwapIn<'_>, dev: usize, w: Window) {
    let d = &cx.devices.devices()[dev];
    let mut set = RegionSet::new();
    let mut hits = 0;
    for slot in w.start..w.end() {
        let Some(info) = d.slot_info(slot as u64) else { continue };
        let r = PageRef::from_owner(info.owner);
        if let Ok(gi) = set.get(cx.id, r) {
            if clear_readahead_mark(&set.g[gi], r.page) {
                hits += 1;
            }
        }
    }
    cx.stats.add(Counter::SwapRaHit, hits);
}

/// Clears the readahead mark of a resident page; true if it had one (a hit). A busy page is
/// waited for: it is usually the window the previous fault is still publishing (the faulting
/// thread runs on as soon as its own page is mapped).
pub(crate) fn clear_readahead_mark(region: &RegionInner, page: usize) -> bool {
    let backoff = crossbeam_utils::Backoff::new();
    // Bounded: a busy owner finishes a short critical section; other changes end the loop.
    for _ in 0..1024 {
        let pte = region.load(page);
        if pte.busy() {
            backoff.snooze();
            continue;
        }
        if pte.state() != PageState::Resident || !pte.readahead() {
            return false;
        }
        if region
            .pte(page)
            .compare_exchange(pte.0, pte.without_readahead().0, Ordering::AcqRel, Ordering::Acquire)
            .is_ok()
        {
            return true;
        }
    }
    false
}
