//! The engine's counters ([`Counter`], named after `/proc/vmstat` where the kernel has one)
//! and their per-CPU blocks ([`PerCpuStats`]): an event costs one uncontended `fetch_add`
//! on the current CPU's block; a snapshot sums the blocks.

use std::sync::atomic::{AtomicU64, Ordering};

use crossbeam_utils::CachePadded;

use super::histogram::{AtomicHistogram, Histogram};
use super::Stats;
use crate::mapping::current_cpu;

/// Every counter the engine keeps. Names follow `/proc/vmstat` where the kernel has one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(usize)]
pub(crate) enum Counter {
    /// userfaultfd faults served (all kinds).
    Pgfault,
    /// Faults on pages never touched or known to be zero, served with a zero page.
    PgfaultZero,
    /// Faults on pages found in the swap cache (staged in RAM), served by `UFFDIO_MOVE`.
    PgfaultSwapcache,
    /// Faults that had to read a device (the kernel's major fault).
    Pgmajfault,
    /// Pages read from devices.
    Pswpin,
    /// Pages written to devices.
    Pswpout,
    /// Pages found all-zero at swap-out: no slot kept, nothing written (kernel 6.12 name).
    SwpoutZero,
    /// Pages moved out of regions into the swap cache by the background reclaimer.
    PgstealBackground,
    /// Pages moved out of regions into the swap cache by direct reclaim.
    PgstealDirect,
    /// Victims spared because they were referenced (faulted back from the swap cache, or
    /// from a device within the working set).
    Pgactivate,
    /// Pages read back from a device whose refault distance put them in the working set:
    /// marked referenced (the kernel's `workingset_activate_anon`).
    WorkingsetActivate,
    /// Times an allocation at the limit had to reclaim directly.
    Allocstall,
    /// Swap-outs that found no free slot on any device; the page stayed resident.
    SwapAllocFail,
    /// Charges that went above the resident limit because nothing could be reclaimed (or the
    /// room reclaim made kept going to other charges) within `reclaim::charge`'s bounds.
    LimitOverrun,
    /// Pages read ahead: read from a device and mapped along with a faulting page.
    SwapRa,
    /// Read-ahead pages the application used (see `readahead` for how use is detected).
    SwapRaHit,
    /// Faults that found the page already resolved by another thread, or an event for its
    /// range (a discard, an unmap) still to be applied: faulted again after it.
    FaultRaced,
    /// Faults served without taking any lock because the thread already held one.
    FaultLockFree,
    /// Pages whose fault-in failed (device read error); the fault is retried.
    FaultError,
    /// Resident pages that could not be queued for reclaim (queue full); found by scanning.
    LruOverflow,
    /// A `UFFDIO_MOVE` out of a region refused a page (e.g. pinned); it stayed resident.
    MoveRefused,
    /// Victims reclaim left resident because a system call had pinned them (see `pin`).
    ReclaimPinned,
    /// A page a fork shared made exclusive again, so that reclaim can move it (see
    /// `reclaim::cow`).
    CowBroken,
    /// A page a fork child inherited and its parent let go of (written, or moved out), now
    /// mapped by the child alone: charged to the child (see `reclaim::cow::adopt_exclusive`).
    SharedAdopted,
    /// Device writes that failed; the pages stayed staged in RAM and will be retried.
    SwpoutError,
    /// Pages a device declined (pool full, incompressible) written to another device.
    SwpoutSpilled,
    /// Pages moved from a device to a lower tier (zswap's `zswpwb`).
    Writeback,
    /// Device reads whose data did not match the page's checksum.
    ChecksumError,
    /// Never-touched pages mapped ahead by a zero-fill fault (fault-around).
    ZeroFillAround,
    /// First writes to clean pages (write-protect faults): the slot's copy went stale.
    PgfaultWp,
    /// Clean pages reclaim dropped without writing (their slot still held them).
    SwpoutClean,
    /// Read-ahead pages evicted before they were known to be used.
    SwapRaUnused,
    /// Pages whose asynchronous readahead was started.
    SwapRaAsyncStarted,
    /// Pages mapped from an asynchronous readahead.
    SwapRaAsync,
    /// Pages read asynchronously and never mapped from the buffer (not faulted in time, read
    /// failed, region gone).
    SwapRaAsyncDropped,
    /// Faults that found their asynchronous readahead still in flight and waited for it.
    SwapRaAsyncWait,
    /// Faults that gave up waiting for a page's busy bit (see `fault_service::BUSY_WAIT_LIMIT_NS`).
    FaultBusyTimeout,
    /// Signal-mode faults, program unmaps and new regions that gave up waiting for read
    /// events (and other threads' unmaps) to be applied (see `events::wait_until_applied`,
    /// `events::settle_unmaps`).
    FaultEventWaitTimeout,
    /// `munmap` events: the application unmapped part of a region (see `events`).
    UffdUnmap,
    /// `mremap` events: the application moved a region, or part of one.
    UffdRemap,
    /// `MADV_DONTNEED`/`MADV_REMOVE` events: the application discarded part of a region.
    UffdRemove,
    /// Page-table words read to find which pages of a region are still its own (some were
    /// unmapped): a fork's and a region's release (see `RegionInner::live_runs`).
    GoneScanPages,
    /// Swap-cache hits on read-only or locked memory, copied back (`UFFDIO_MOVE` needs equal
    /// protections and locks on both sides).
    PgfaultSwapcacheCopy,
    /// Pages of a part moved out of a region by `mremap` that were not in place (staged or
    /// swapped) and were copied to the new address (see `events`).
    RemapCopied,
    /// Charges that went above the resident limit while the devices had room: every victim
    /// stayed busy in other threads' faults and writes past
    /// `reclaim::direct::CHARGE_WAIT_LIMIT_NS` (also counted in `LimitOverrun`).
    LimitOverrunBusy,
    /// Operations that gave up waiting for a pooled bounce buffer: every one stayed lent out
    /// past `sync::POP_WAIT_LIMIT_NS` (the fault or take-out failed instead of hanging).
    BounceWaitTimeout,
    /// Dirty resident pages that left with a victim next to them, in one run (see
    /// `reclaim::victims::take_resident_neighbours`).
    SwpoutNeighbours,
    /// Thread mode: handlers that went dormant (see `handler_pool`).
    HandlerRetire,
    /// Thread mode: dormant handlers woken for a backlog of faults.
    HandlerBacklog,
    /// Thread mode: dormant handlers woken to help while a stream's window was served.
    HandlerHelp,
    /// Thread mode: hand-overs to the handler on the faulting thread's CPU.
    HandlerSteer,
    /// Thread mode: windows of spins that stopped spinning (mostly misses, or the CPU was
    /// wanted by another thread).
    HandlerSpinOff,
    /// Resident pages the aging scan moved to the swap cache to see whether they are still
    /// used (the kernel's `pgdeactivate`; see `reclaim::aging`).
    Pgdeactivate,
    /// Staged pages sent out because they had been idle for the idle age: written to a
    /// device, or, staged clean, dropped (counted in `SwpoutClean` too).
    SwpoutIdle,
    /// Pages moved down a tier because they had been idle there for the idle age.
    WritebackIdle,
    /// Staged pages the background reclaimer sent out for the faults that staged them
    /// (`BackgroundReclaim::StageTwo`): written (also in `Pswpout`), or, staged clean by the
    /// aging scan, dropped (also in `SwpoutClean`).
    PswpoutBackground,
    /// Swap-cache hits on pages the aging scan staged: pages found still in use.
    PgfaultAged,
    /// Device read calls (one or more runs of pages), and the nanoseconds they took.
    DeviceReads,
    DeviceReadNs,
    /// Device write calls, and the nanoseconds they took.
    DeviceWrites,
    DeviceWriteNs,
}

const NR_COUNTERS: usize = Counter::DeviceWriteNs as usize + 1;

struct CpuStats {
    counters: [AtomicU64; NR_COUNTERS],
    fault_latency: AtomicHistogram,
}

pub(crate) struct PerCpuStats {
    cpus: Box<[CachePadded<CpuStats>]>,
}

impl PerCpuStats {
    pub fn new(nr_cpus: usize) -> Self {
        PerCpuStats {
            cpus: (0..nr_cpus.max(1))
                .map(|_| {
                    CachePadded::new(CpuStats {
                        counters: std::array::from_fn(|_| AtomicU64::new(0)),
                        fault_latency: AtomicHistogram::new(),
                    })
                })
                .collect(),
        }
    }

    #[inline]
    fn this_cpu(&self) -> &CpuStats {
        &self.cpus[current_cpu() % self.cpus.len()]
    }

    #[inline]
    pub fn add(&self, c: Counter, n: u64) {
        if n != 0 {
            self.this_cpu().counters[c as usize].fetch_add(n, Ordering::Relaxed);
        }
    }

    #[inline]
    pub fn inc(&self, c: Counter) {
        self.add(c, 1)
    }

    /// Runs `io`, a device read (`write` false) or write, counting the call and its time.
    #[inline]
    pub fn time_device_io<R>(&self, write: bool, io: impl FnOnce() -> R) -> R {
        let start_ns = crate::clock::now_ns();
        let r = io();
        let took_ns = crate::clock::now_ns().saturating_sub(start_ns);
        let (calls, ns) = if write {
            (Counter::DeviceWrites, Counter::DeviceWriteNs)
        } else {
            (Counter::DeviceReads, Counter::DeviceReadNs)
        };
        self.inc(calls);
        self.add(ns, took_ns);
        r
    }

    #[inline]
    pub fn record_fault_latency(&self, ns: u64) {
        self.this_cpu().fault_latency.record(ns);
    }

    pub fn sum(&self, c: Counter) -> u64 {
        self.cpus.iter().map(|s| s.counters[c as usize].load(Ordering::Relaxed)).sum()
    }

    pub fn fault_latency(&self) -> Histogram {
        let mut h = Histogram::new();
        for s in self.cpus.iter() {
            s.fault_latency.add_to(&mut h);
        }
        h
    }
}

impl PerCpuStats {
    /// Fills the counter fields of a snapshot.
    pub(crate) fn fill(&self, s: &mut Stats) {
        use Counter::*;
        s.pgfault = self.sum(Pgfault);
        s.pgfault_zero = self.sum(PgfaultZero);
        s.pgfault_swapcache = self.sum(PgfaultSwapcache);
        s.pgmajfault = self.sum(Pgmajfault);
        s.pswpin = self.sum(Pswpin);
        s.pswpout = self.sum(Pswpout);
        s.swpout_zero = self.sum(SwpoutZero);
        s.pgsteal_background = self.sum(PgstealBackground);
        s.pgsteal_direct = self.sum(PgstealDirect);
        s.pgactivate = self.sum(Pgactivate);
        s.workingset_activate = self.sum(WorkingsetActivate);
        s.allocstall = self.sum(Allocstall);
        s.swap_alloc_fail = self.sum(SwapAllocFail);
        s.limit_overrun = self.sum(LimitOverrun);
        s.swap_ra = self.sum(SwapRa);
        s.swap_ra_hit = self.sum(SwapRaHit);
        s.swap_ra_unused = self.sum(SwapRaUnused);
        s.swap_ra_async_started = self.sum(SwapRaAsyncStarted);
        s.swap_ra_async = self.sum(SwapRaAsync);
        s.swap_ra_async_dropped = self.sum(SwapRaAsyncDropped);
        s.swap_ra_async_wait = self.sum(SwapRaAsyncWait);
        s.uffd_unmap = self.sum(UffdUnmap);
        s.uffd_remap = self.sum(UffdRemap);
        s.uffd_remove = self.sum(UffdRemove);
        s.gone_scan_pages = self.sum(GoneScanPages);
        s.pgfault_swapcache_copy = self.sum(PgfaultSwapcacheCopy);
        s.remap_copied = self.sum(RemapCopied);
        s.limit_overrun_busy = self.sum(LimitOverrunBusy);
        s.bounce_wait_timeout = self.sum(BounceWaitTimeout);
        s.fault_raced = self.sum(FaultRaced);
        s.fault_lock_free = self.sum(FaultLockFree);
        s.fault_busy_timeout = self.sum(FaultBusyTimeout);
        s.fault_event_wait_timeout = self.sum(FaultEventWaitTimeout);
        s.fault_error = self.sum(FaultError);
        s.lru_overflow = self.sum(LruOverflow);
        s.move_refused = self.sum(MoveRefused);
        s.cow_broken = self.sum(CowBroken);
        s.shared_adopted = self.sum(SharedAdopted);
        s.reclaim_pinned = self.sum(ReclaimPinned);
        s.swpout_neighbours = self.sum(SwpoutNeighbours);
        s.handler_retire = self.sum(HandlerRetire);
        s.handler_backlog = self.sum(HandlerBacklog);
        s.handler_help = self.sum(HandlerHelp);
        s.handler_steer = self.sum(HandlerSteer);
        s.handler_spin_off = self.sum(HandlerSpinOff);
        s.swpout_error = self.sum(SwpoutError);
        s.swpout_spilled = self.sum(SwpoutSpilled);
        s.writeback = self.sum(Writeback);
        s.checksum_errors = self.sum(ChecksumError);
        s.zero_fill_around = self.sum(ZeroFillAround);
        s.pgfault_wp = self.sum(PgfaultWp);
        s.swpout_clean = self.sum(SwpoutClean);
        s.pgdeactivate = self.sum(Pgdeactivate);
        s.swpout_idle = self.sum(SwpoutIdle);
        s.writeback_idle = self.sum(WritebackIdle);
        s.pswpout_background = self.sum(PswpoutBackground);
        s.pgfault_aged = self.sum(PgfaultAged);
        s.device_reads = self.sum(DeviceReads);
        s.device_read_us = self.sum(DeviceReadNs) / 1000;
        s.device_writes = self.sum(DeviceWrites);
        s.device_write_us = self.sum(DeviceWriteNs) / 1000;
        s.fault_latency_us = self.fault_latency().summary_us();
    }
}
