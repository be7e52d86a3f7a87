//! Fault delivery (thread mode and signal mode) and fault service.
//!
//! [`serve_fault`] brings one missing page into a region, whatever delivered the fault:
//!
//! * never touched / known zero → `UFFDIO_ZEROPAGE` for a read, `UFFDIO_COPY` of a zero page
//!   for a write (saves the copy-on-write fault that would follow a zero-page mapping);
//! * staged in the swap cache → `UFFDIO_MOVE` back from the staging page: no copy;
//! * on a device → read the slot (in place for the RAM device, else into a bounce buffer)
//!   and `UFFDIO_COPY` it in.
//!
//! Thread mode: [`handler_thread`]s, one pinned to each CPU, poll the userfaultfd. The
//! kernel wakes every waiter; the handler on the faulting CPU runs as soon as the faulting
//! thread sleeps, so the wake-up is local (8 µs instead of 81 µs cross-CPU on these VMs, see
//! DESIGN.md and BENCHMARKS.md). Faults raised in system calls arrive here too.
//!
//! Signal mode: [`sigbus_fault`] runs in the faulting thread's SIGBUS handler. It allocates
//! nothing and takes no lock the thread could already hold: if the thread was interrupted
//! inside engine code holding a spin lock (an application signal handler touching managed
//! memory), the fault takes the lock-free route — no direct reclaim, slot frees deferred.
//!
//! Locking: none of its own; ownership of a page is its busy bit (see `region`).

use arrayvec::ArrayVec;
use crossbeam_utils::Backoff;

use crate::mapping::{now_ns, pin_current_thread};
use crate::pager::{FaultMode, PageErrorKind, PagerShared};
use crate::readahead::MAX_WINDOW_PAGES;
use crate::reclaim;
use crate::region::{PageRef, PageState, Pte, RegionInner, REGIONS};
use crate::stats::Counter;
use crate::sync::locks_held_by_this_thread;
use crate::uffd::{self, Doorbell, RangeResult, UffdMsg, PAGE_SIZE};

/// Zeros, the source of `UFFDIO_COPY` for first writes (a fault-around window's worth).
#[repr(C, align(4096))]
struct ZeroPages([u8; MAX_WINDOW_PAGES * PAGE_SIZE]);
static ZERO_PAGES: ZeroPages = ZeroPages([0; MAX_WINDOW_PAGES * PAGE_SIZE]);

/// How the fault reached us; decides waking and which locks may be taken.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Route {
    /// A handler thread: the faulting thread sleeps in the kernel and must be woken.
    Thread,
    /// The faulting thread's own SIGBUS handler.
    Signal,
    /// Signal mode, and the thread holds an engine lock: take none.
    SignalLockFree,
}

impl Route {
    fn wake(self) -> bool {
        self == Route::Thread
    }
    fn lock_free(self) -> bool {
        self == Route::SignalLockFree
    }
}

/// Why a fault could not be served.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum FaultError {
    /// The device read failed, or returned data that failed its checksum, on every attempt;
    /// the page is still on the device.
    Device(PageErrorKind),
    /// An ioctl failed with this errno.
    Ioctl(i32),
}

/// Serves a missing-page fault at `addr` (any address in the page). `reg_idx`/`reg_gen`
/// name the region in the registry (for the reclaim queues).
pub(crate) fn serve_fault(
    region: &RegionInner,
    reg_idx: usize,
    reg_gen: u32,
    addr: usize,
    write: bool,
    route: Route,
) -> Result<(), FaultError> {
    let t0 = now_ns();
    let pager = &*region.pager;
    let page = (addr - region.start) / PAGE_SIZE;
    let page_addr = region.page_addr(page);
    let backoff = Backoff::new();
    // Bounded: each round either takes ownership of the page, or waits for the current owner
    // (another fault, or reclaim) to finish a short critical section.
    let result = loop {
        let pte = region.load(page);
        if pte.busy() {
            backoff.snooze();
            continue;
        }
        let Some(locked) = region.try_lock(page, pte) else {
            continue;
        };
        match pte.state() {
            PageState::None | PageState::Zero => {
                // Fault-around: a sequential stream of first touches brings its next pages
                // in with the same ioctl (never-touched or known-zero neighbours only).
                let want = if route.lock_free() {
                    1
                } else {
                    region.streams.window_at(page, MAX_WINDOW_PAGES.min(region.nr_pages - page))
                };
                let mut locks: ArrayVec<Pte, MAX_WINDOW_PAGES> = ArrayVec::new();
                locks.push(locked);
                while locks.len() < want {
                    let q = page + locks.len();
                    let pq = region.load(q);
                    if !matches!(pq.state(), PageState::None | PageState::Zero) {
                        break;
                    }
                    match region.try_lock(q, pq) {
                        Some(l) => locks.push(l),
                        None => break,
                    }
                }
                let charged = reclaim::charge_up_to(pager, locks.len(), route);
                for (k, l) in locks.iter().enumerate().skip(charged) {
                    region.store(page + k, l.unbusy());
                }
                locks.truncate(charged);
                let n = locks.len();
                if n < want {
                    region.streams.brought_in(page, n);
                }
                let len = n * PAGE_SIZE;
                let r = if write {
                    pager.uffd.copy(page_addr, ZERO_PAGES.0.as_ptr(), len, route.wake(), false)
                } else {
                    pager.uffd.zeropage(page_addr, len, route.wake())
                };
                let done = r.done_bytes(len) / PAGE_SIZE;
                for (k, l) in locks.iter().enumerate().skip(done) {
                    region.store(page + k, l.unbusy());
                }
                reclaim::uncharge(pager, n - done);
                if let RangeResult::Partial { errno, .. } = r {
                    if done == 0 {
                        break Err(FaultError::Ioctl(errno));
                    }
                }
                for (k, l) in locks.iter().enumerate().take(done) {
                    let new = l.next(PageState::Resident, None);
                    region.store(page + k, new);
                    reclaim::lru_add(pager, page_ref(reg_idx, reg_gen, page + k, new.gen()));
                }
                pager.stats.inc(Counter::PgfaultZero);
                pager.stats.add(Counter::ZeroFillAround, done as u64 - 1);
                break Ok(());
            }
            PageState::Resident if pte.clean() => {
                // The first write to a clean page (a write-protect fault): it is dirty now and
                // its slot's copy goes stale. (In signal mode the SIGBUS may also be a missing
                // fault on a clean page the application discarded: then the retried access
                // faults again and is served as below.)
                let r = pager.uffd.writeprotect(page_addr, PAGE_SIZE, false, route.wake());
                pager.devices.free(pte.entry(), route.lock_free());
                region.store(page, locked.dirtied());
                pager.clean_pages.fetch_sub(1, std::sync::atomic::Ordering::Relaxed);
                pager.stats.inc(Counter::PgfaultWp);
                if let Err(e) = r {
                    if e.raw_os_error() != Some(libc::ENOENT) {
                        break Err(FaultError::Ioctl(e.raw_os_error().unwrap_or(libc::EIO)));
                    }
                }
                break Ok(());
            }
            PageState::Resident => {
                // Either another thread mapped it after our fault was raised, or the
                // application discarded it (MADV_DONTNEED), which reads back as zeros.
                let r = pager.uffd.zeropage(page_addr, PAGE_SIZE, route.wake());
                region.store(page, locked.unbusy());
                match r {
                    RangeResult::Done => {}
                    RangeResult::Partial { errno, .. } if errno == libc::EEXIST => {
                        if route.wake() {
                            let _ = pager.uffd.wake(page_addr, PAGE_SIZE);
                        }
                        pager.stats.inc(Counter::FaultRaced);
                    }
                    RangeResult::Partial { errno, .. } => break Err(FaultError::Ioctl(errno)),
                }
                break Ok(());
            }
            PageState::Cached => {
                let e = pte.entry();
                let dev = pager.devices.device(e);
                let r = pager.uffd.move_pages(page_addr, dev.staging_addr(e.offset()), PAGE_SIZE, route.wake());
                if let RangeResult::Partial { errno, .. } = r {
                    region.store(page, locked.unbusy());
                    break Err(FaultError::Ioctl(errno));
                }
                dev.cache.set_cached(e.offset(), false);
                pager.swapcache_pages.fetch_sub(1, std::sync::atomic::Ordering::AcqRel);
                pager.devices.free(e, route.lock_free());
                // Referenced: it came back from the swap cache, so reclaim spares it once.
                let new = locked.next(PageState::Resident, None).with_referenced(true);
                region.store(page, new);
                reclaim::lru_add(pager, page_ref(reg_idx, reg_gen, page, new.gen()));
                pager.stats.inc(Counter::PgfaultSwapcache);
                break Ok(());
            }
            PageState::Swapped => {
                let e = pte.entry();
                reclaim::charge(pager, 1, route);
                // Brought in for a read, the page stays clean: mapped write-protected, it keeps
                // its slot, and reclaim can drop it again without writing it.
                let keep_slot = !write;
                match read_into_region(pager, e, page_addr, route, keep_slot) {
                    Ok(()) => {}
                    Err(err) => {
                        reclaim::uncharge(pager, 1);
                        region.store(page, locked.unbusy());
                        break Err(err);
                    }
                }
                let new = if keep_slot {
                    pager.clean_pages.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    locked.next(PageState::Resident, Some(e)).with_clean()
                } else {
                    pager.devices.free(e, route.lock_free());
                    locked.next(PageState::Resident, None)
                };
                let new = new.with_referenced(false);
                region.store(page, new);
                reclaim::lru_add(pager, page_ref(reg_idx, reg_gen, page, new.gen()));
                pager.stats.inc(Counter::Pgmajfault);
                pager.stats.inc(Counter::Pswpin);
                break Ok(());
            }
        }
    };
    pager.stats.inc(Counter::Pgfault);
    if route.lock_free() {
        pager.stats.inc(Counter::FaultLockFree);
    }
    if result.is_err() {
        pager.stats.inc(Counter::FaultError);
    }
    pager.stats.record_fault_latency(now_ns().saturating_sub(t0));
    result
}

/// Attempts per device read before the fault is reported as failed.
const READ_ATTEMPTS: usize = 3;

/// Reads the page at `e` and maps it at `page_addr`.
fn read_into_region(
    pager: &PagerShared,
    e: crate::swap::SwapEntry,
    page_addr: usize,
    route: Route,
    write_protect: bool,
) -> Result<(), FaultError> {
    let dev = pager.devices.device(e);
    if dev.checksums.is_none() {
        if let Some(src) = dev.backend.page_ptr(e.offset()) {
            return match pager.uffd.copy(page_addr, src, PAGE_SIZE, route.wake(), write_protect) {
                RangeResult::Done => Ok(()),
                RangeResult::Partial { errno, .. } => Err(FaultError::Ioctl(errno)),
            };
        }
    }
    let mut buf = pager.bounce.take();
    let mut kind = PageErrorKind::ReadFailed;
    for _ in 0..READ_ATTEMPTS {
        let mut req = [crate::backend::ReadReq::new(e.offset(), &mut buf.pages_mut()[..1])];
        dev.backend.read(&mut req);
        if req[0].result.is_err() {
            kind = PageErrorKind::ReadFailed;
            pager.record_error(page_addr, e, kind);
            continue;
        }
        if !dev.checksum_ok(e.offset(), buf.page(0)) {
            // Never map a page that does not match what was written: read it again.
            kind = PageErrorKind::ChecksumMismatch;
            pager.stats.inc(Counter::ChecksumError);
            pager.record_error(page_addr, e, kind);
            continue;
        }
        return match pager.uffd.copy(page_addr, buf.page(0).as_ptr(), PAGE_SIZE, route.wake(), write_protect) {
            RangeResult::Done => Ok(()),
            RangeResult::Partial { errno, .. } => Err(FaultError::Ioctl(errno)),
        };
    }
    Err(FaultError::Device(kind))
}

fn page_ref(region_idx: usize, region_gen: u32, page: usize, page_gen: u8) -> PageRef {
    PageRef { region_idx, region_gen, page_gen, page }
}

/// The SIGBUS entry point (see `uffd::sigbus`): serves the fault if `addr` belongs to a
/// signal-mode region. Async-signal-safe.
pub(crate) fn sigbus_fault(addr: usize, is_write: bool) -> bool {
    let Some(g) = REGIONS.find(addr) else {
        return false;
    };
    if g.pager.mode != FaultMode::Signal {
        return false;
    }
    let route = if locks_held_by_this_thread() > 0 { Route::SignalLockFree } else { Route::Signal };
    // Bounded retries of transient failures; a page that cannot be brought back ends in
    // SIGBUS, as in the kernel.
    for _ in 0..READ_ATTEMPTS {
        if serve_fault(&g, g.index, g.gen, addr, is_write, route).is_ok() {
            return true;
        }
    }
    uffd::sigbus::report_lost_page(addr);
    false
}

/// Thread mode: one of the handler threads. Reads fault messages and serves them until the
/// pager shuts down.
pub(crate) fn handler_thread(pager: &PagerShared, doorbell: &Doorbell, cpu: Option<usize>) {
    if let Some(cpu) = cpu {
        // Best effort: unpinned, the handler still works, only the wake-up may be remote.
        let _ = pin_current_thread(cpu);
    }
    let mut msgs = [UffdMsg::default(); 16];
    while !pager.is_shutdown() {
        // EAGAIN reads as 0; EINTR is the only other error a valid descriptor gives: poll again.
        let n = pager.uffd.read_msgs(&mut msgs).unwrap_or(0);
        if n == 0 {
            uffd::poll_fault_or_doorbell(&pager.uffd, doorbell);
            continue;
        }
        for m in &msgs[..n] {
            if m.event != uffd::EVENT_PAGEFAULT {
                continue;
            }
            let addr = m.pf_address as usize & !(PAGE_SIZE - 1);
            let write = m.pf_flags & uffd::PAGEFAULT_FLAG_WRITE != 0;
            let served = match REGIONS.find(addr) {
                Some(g) if std::ptr::eq(&*g.pager, pager) => {
                    let mut ok = false;
                    for _ in 0..READ_ATTEMPTS {
                        if serve_fault(&g, g.index, g.gen, addr, write, Route::Thread).is_ok() {
                            ok = true;
                            break;
                        }
                    }
                    if !ok {
                        // The page cannot be brought back: the faulting thread gets SIGBUS, as
                        // it would from the kernel for an unreadable swap page.
                        uffd::sigbus::report_lost_page(addr);
                        uffd::sigbus::signal_thread(m.pf_ptid);
                        continue;
                    }
                    ok
                }
                _ => false,
            };
            if !served {
                // Not ours any more (the region was dropped under a racing access), or the
                // page could not be read: wake the thread; it faults again, and if the region
                // is gone it gets SIGSEGV like any access to unmapped memory.
                if pager.devices.devices().iter().any(|d| d.staging.contains(addr)) {
                    // A fault on an empty staging page means the engine broke its own rule.
                    panic!("uswap: engine thread faulted on empty staging page {addr:#x}");
                }
                let _ = pager.uffd.wake(addr, PAGE_SIZE);
            }
        }
    }
}
