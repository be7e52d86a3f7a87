//! Counters in the style of `/proc/vmstat` and latency histograms, cheap enough to stay on.
//!
//! Each CPU has its own cache-line-aligned block of relaxed atomic counters and its own fault
//! latency histogram; an event costs one uncontended `fetch_add` on the current CPU's block
//! (threads migrate, so the block is not exclusively ours, hence atomics rather than plain
//! integers). [`crate::Pager::stats`] sums the blocks. Nothing here allocates after start-up
//! or takes a lock, so the signal-mode fault path may count freely.
//!
//! The histogram is log-linear: 16 sub-buckets per power of two (relative error below 6.25 %),
//! the layout pmbench uses for its per-access latency report.

use std::sync::atomic::{AtomicU64, Ordering};

use crossbeam_utils::CachePadded;
use serde::{Deserialize, Serialize};

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
    /// Victims spared because they were referenced (faulted back from the swap cache).
    Pgactivate,
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
    /// A page a fork shared made exclusive again, so that reclaim can move it (see
    /// `reclaim::cow`).
    CowBroken,
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
    /// Signal-mode faults that gave up waiting for read events to be applied (see
    /// `events::wait_until_applied`).
    FaultEventWaitTimeout,
    /// `munmap` events: the application unmapped part of a region (see `events`).
    UffdUnmap,
    /// `mremap` events: the application moved a region, or part of one.
    UffdRemap,
    /// `MADV_DONTNEED`/`MADV_REMOVE` events: the application discarded part of a region.
    UffdRemove,
    /// Swap-cache hits on read-only memory, copied back (`UFFDIO_MOVE` needs equal
    /// protections on both sides).
    PgfaultSwapcacheCopy,
    /// Pages of a part moved out of a region by `mremap` that were not in place (staged or
    /// swapped) and were copied to the new address (see `events`).
    RemapCopied,
    /// Charges that went above the resident limit while the devices had room: every victim
    /// stayed busy in other threads' faults and writes past
    /// `reclaim::charge::CHARGE_WAIT_LIMIT_NS` (also counted in `LimitOverrun`).
    LimitOverrunBusy,
    /// Operations that gave up waiting for a pooled bounce buffer: every one stayed lent out
    /// past `sync::POOL_WAIT_LIMIT_NS` (the fault or take-out failed instead of hanging).
    PoolWaitTimeout,
    /// Dirty resident pages that left with a victim next to them, in one run (see
    /// `reclaim::swapout::take_resident_neighbours`).
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
}

const NR_COUNTERS: usize = Counter::HandlerSpinOff as usize + 1;

// ---------------------------------------------------------------------------------------
// Histogram
// ---------------------------------------------------------------------------------------

const SUB_BITS: u32 = 4;
const SUB: usize = 1 << SUB_BITS;
/// Values up to 2^40 ns (18 minutes) are bucketed; larger ones land in the last bucket.
const MAX_EXP: u32 = 40;
/// Number of buckets of every histogram.
pub const NR_BUCKETS: usize = SUB + (MAX_EXP - SUB_BITS) as usize * SUB;

fn bucket_of(v: u64) -> usize {
    if v < SUB as u64 {
        return v as usize;
    }
    let e = 63 - v.leading_zeros();
    if e >= MAX_EXP {
        return NR_BUCKETS - 1;
    }
    let sub = ((v >> (e - SUB_BITS)) as usize) & (SUB - 1);
    SUB + (e - SUB_BITS) as usize * SUB + sub
}

/// Lowest value that falls in bucket `i` and the bucket's width.
fn bucket_range(i: usize) -> (u64, u64) {
    if i < SUB {
        return (i as u64, 1);
    }
    let e = (i - SUB) / SUB + SUB_BITS as usize;
    let sub = ((i - SUB) % SUB) as u64;
    let width = 1u64 << (e - SUB_BITS as usize);
    ((SUB as u64 + sub) * width, width)
}

/// A log-linear latency histogram that may be recorded into from several threads (and from a
/// signal handler) without locks.
pub struct AtomicHistogram {
    buckets: Box<[AtomicU64]>,
}

impl Default for AtomicHistogram {
    fn default() -> Self {
        Self::new()
    }
}

impl AtomicHistogram {
    pub fn new() -> Self {
        AtomicHistogram { buckets: (0..NR_BUCKETS).map(|_| AtomicU64::new(0)).collect() }
    }

    #[inline]
    pub fn record(&self, value_ns: u64) {
        self.buckets[bucket_of(value_ns)].fetch_add(1, Ordering::Relaxed);
    }

    pub fn add_to(&self, h: &mut Histogram) {
        for (dst, src) in h.counts.iter_mut().zip(self.buckets.iter()) {
            *dst += src.load(Ordering::Relaxed);
        }
    }
}

/// A plain (single-owner) log-linear histogram: what the bench records per thread and what
/// snapshots of the engine's atomic histograms become.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Histogram {
    counts: Vec<u64>,
}

impl Default for Histogram {
    fn default() -> Self {
        Self::new()
    }
}

impl Histogram {
    pub fn new() -> Self {
        Histogram { counts: vec![0; NR_BUCKETS] }
    }

    #[inline]
    pub fn record(&mut self, value_ns: u64) {
        self.counts[bucket_of(value_ns)] += 1;
    }

    /// Records `n` values of `value_ns` at once (rebuilding a histogram from its buckets, e.g.
    /// one another process reported).
    pub fn record_n(&mut self, value_ns: u64, n: u64) {
        self.counts[bucket_of(value_ns)] += n;
    }

    pub fn merge(&mut self, other: &Histogram) {
        for (a, b) in self.counts.iter_mut().zip(&other.counts) {
            *a += b;
        }
    }

    pub fn count(&self) -> u64 {
        self.counts.iter().sum()
    }

    /// The value at quantile `q` (0.0..=1.0), as the middle of its bucket; 0 when empty.
    pub fn quantile(&self, q: f64) -> u64 {
        let total = self.count();
        if total == 0 {
            return 0;
        }
        let rank = ((q.clamp(0.0, 1.0) * total as f64).ceil() as u64).max(1);
        let mut seen = 0;
        for (i, &c) in self.counts.iter().enumerate() {
            seen += c;
            if seen >= rank {
                let (lo, w) = bucket_range(i);
                return lo + w / 2;
            }
        }
        let (lo, w) = bucket_range(NR_BUCKETS - 1);
        lo + w / 2
    }

    /// Mean of the bucket midpoints, weighted by count.
    pub fn mean(&self) -> f64 {
        let total = self.count();
        if total == 0 {
            return 0.0;
        }
        let sum: f64 = self
            .counts
            .iter()
            .enumerate()
            .map(|(i, &c)| {
                let (lo, w) = bucket_range(i);
                c as f64 * (lo as f64 + w as f64 / 2.0)
            })
            .sum();
        sum / total as f64
    }

    /// Non-empty buckets as `(lowest value, width, count)`, in ascending order: the pmbench
    /// log2 histogram with sub-buckets.
    pub fn buckets(&self) -> impl Iterator<Item = (u64, u64, u64)> + '_ {
        self.counts.iter().enumerate().filter(|(_, &c)| c > 0).map(|(i, &c)| {
            let (lo, w) = bucket_range(i);
            (lo, w, c)
        })
    }

    /// The usual percentiles, in microseconds.
    pub fn summary_us(&self) -> LatencySummary {
        let us = |q| self.quantile(q) as f64 / 1000.0;
        LatencySummary {
            count: self.count(),
            mean: self.mean() / 1000.0,
            p50: us(0.50),
            p90: us(0.90),
            p99: us(0.99),
            p999: us(0.999),
            max: us(1.0),
        }
    }
}

/// Percentiles of a latency histogram, in microseconds.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct LatencySummary {
    pub count: u64,
    pub mean: f64,
    pub p50: f64,
    pub p90: f64,
    pub p99: f64,
    pub p999: f64,
    pub max: f64,
}

// ---------------------------------------------------------------------------------------
// Per-CPU counters
// ---------------------------------------------------------------------------------------

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

/// Per-device figures in a [`Stats`] snapshot.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct DeviceStats {
    /// What the device is (`ram`, ...), as configured.
    pub name: String,
    pub priority: i32,
    /// Slots (pages) the device can hold.
    pub nr_slots: u64,
    /// Slots allocated right now (stored pages plus pages staged for them in the swap cache).
    pub slots_used: u64,
    /// Clusters entirely free / partly used / full.
    pub clusters_free: u64,
    pub clusters_nonfull: u64,
    pub clusters_full: u64,
    /// Clusters discarded (storage returned) before reuse, since the pager started.
    pub clusters_discarded: u64,
    /// The device's own counters (the compressed pool's, zswap-style), if it keeps any.
    pub backend: Option<crate::backend::BackendStats>,
}

/// A snapshot of a pager's counters. Counter names follow `/proc/vmstat` where one exists.
///
/// Serializes to JSON (what a pager's stats socket answers, see [`crate::stats_server`]) and
/// back; fields missing from a document (one from an older or newer uswap) read as zero.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct Stats {
    /// Faults served, all kinds.
    pub pgfault: u64,
    /// Zero-fill faults (page never touched, or known to be zero).
    pub pgfault_zero: u64,
    /// Never-touched pages mapped ahead by zero-fill faults of a sequential stream (fault-
    /// around); they took no fault of their own.
    pub zero_fill_around: u64,
    /// Swap-cache hits: the page was staged in RAM and moved back without a copy.
    pub pgfault_swapcache: u64,
    /// Faults that read a device.
    pub pgmajfault: u64,
    /// Write-protect faults: the first write to a clean page (one read back from a device
    /// and not written since); its slot is freed.
    pub pgfault_wp: u64,
    /// Pages read from devices.
    pub pswpin: u64,
    /// Pages written to devices.
    pub pswpout: u64,
    /// Clean pages reclaim dropped without writing them: their slot still held them.
    pub swpout_clean: u64,
    /// Pages found all-zero at swap-out (kept as "known zero", no slot).
    pub swpout_zero: u64,
    /// Pages moved out of regions by the background reclaimer / by direct reclaim.
    pub pgsteal_background: u64,
    pub pgsteal_direct: u64,
    /// Victims given a second chance because they had faulted back from the swap cache.
    pub pgactivate: u64,
    /// Allocations that had to reclaim directly because the limit was reached.
    pub allocstall: u64,
    /// Swap-outs that found no free slot: the page stayed resident, nothing was lost.
    pub swap_alloc_fail: u64,
    /// Charges that exceeded the limit because nothing could be reclaimed (devices full,
    /// victims busy or refused) or, rarely, because the room this thread's reclaim made kept
    /// going to other threads' charges for the whole bounded wait.
    pub limit_overrun: u64,
    /// Pages read ahead: read from a device and mapped along with the page that faulted
    /// (the kernel's `swap_ra`).
    pub swap_ra: u64,
    /// Read-ahead pages the application used (the kernel's `swap_ra_hit`). Read-ahead pages
    /// are mapped at once, so use is detected rather than seen as a fault: the page's stream
    /// faulted next just past it (the application ran over it), or the application wrote it.
    pub swap_ra_hit: u64,
    /// Read-ahead pages evicted before they were known to be used. `swap_ra` minus these two
    /// is the read-ahead pages still resident and undecided.
    pub swap_ra_unused: u64,
    /// Pages whose asynchronous readahead was started: while the application worked through
    /// one window, the next windows of its stream were already being read (file devices).
    pub swap_ra_async_started: u64,
    /// Of those, pages mapped from the readahead buffer (each also counts in `swap_ra`; the
    /// first page of an asynchronous window, which takes the fault, also in `swap_ra_hit`).
    pub swap_ra_async: u64,
    /// Of those, pages never mapped from the buffer: not faulted in before the buffer was
    /// needed again, the read failed, or the region went away. Their slot still holds them.
    pub swap_ra_async_dropped: u64,
    /// Faults that found their asynchronous readahead still in flight and waited for it.
    pub swap_ra_async_wait: u64,
    /// Application `munmap`s over regions (userfaultfd `UNMAP` events): those pages are gone,
    /// their swap space freed, and the engine never touches those addresses again.
    pub uffd_unmap: u64,
    /// Application `mremap`s of regions (`REMAP` events).
    pub uffd_remap: u64,
    /// Application `MADV_DONTNEED`/`MADV_REMOVE` over regions (`REMOVE` events): those pages
    /// read zero afterwards, their swap space freed.
    pub uffd_remove: u64,
    /// Swap-cache hits on read-only (`mprotect`) memory, served by copying the staged page.
    pub pgfault_swapcache_copy: u64,
    /// Pages of a part of a region moved away by `mremap` that were staged or swapped out
    /// and were copied into place at the new address (that part is ordinary memory since).
    pub remap_copied: u64,
    /// Of `limit_overrun`, the charges that went over the limit although the devices had
    /// room: every page reclaim found stayed busy in other threads' faults and device writes
    /// for the whole bounded wait (`reclaim::charge`). Nothing is lost; the pages stay
    /// resident until reclaim takes them.
    pub limit_overrun_busy: u64,
    /// Operations that gave up after waiting `sync::POOL_WAIT_LIMIT_NS` (10 s) for a bounce
    /// buffer, every one of them lent out to threads that made no progress: a fault that
    /// ends in SIGBUS (its page kept on its device), or an mremap take-out tried again
    /// later. Should stay 0; nonzero means a device read hung or threads were starved.
    pub pool_wait_timeout: u64,
    /// Faults that found their page already resolved by a racing thread, or an event for
    /// its range still to be applied (`EAGAIN`; the thread faults again after it). Not
    /// errors: nothing is lost.
    pub fault_raced: u64,
    /// Signal-mode faults served on the lock-free route (the thread held an engine lock).
    pub fault_lock_free: u64,
    /// Faults that waited longer than the bound for a page another owner held busy and
    /// failed instead of hanging (each also in `Pager::recent_errors`). Nonzero means a
    /// thread faulted on a page its own interrupted code owned, which the engine prevents by
    /// blocking signals in its calls; see docs/fault-modes.md.
    pub fault_busy_timeout: u64,
    /// Signal mode: faults and system calls that waited past the bound (1 s) for the events
    /// already read (`munmap`, `madvise`, `mremap`) to be applied, and went on without.
    /// Should stay 0; see `events::wait_until_applied`.
    pub fault_event_wait_timeout: u64,
    /// Fault-service attempts that failed (every read of the page failed or failed its
    /// checksum). The fault is attempted again; only a page that fails every attempt ends in
    /// SIGBUS for its thread, as in the kernel.
    pub fault_error: u64,
    /// Resident pages the reclaim queue had no room for (found later by a scan).
    pub lru_overflow: u64,
    /// Pages `UFFDIO_MOVE` refused to move out (pinned or shared); they stayed resident.
    pub move_refused: u64,
    /// Pages refused because a fork child shared them, made exclusive again (copied for
    /// this process, as a write would) so that reclaim could move them out.
    pub cow_broken: u64,
    /// Dirty resident pages that left with a victim next to them (in its aligned 64 KiB
    /// block), in one run: one `UFFDIO_MOVE` and one TLB flush for all of them.
    pub swpout_neighbours: u64,
    /// Thread mode: handler threads that stopped waiting on the userfaultfd and went
    /// dormant: most of their wake-ups found another handler had been first, a helper's 64
    /// faults were served, or a handler handed over to another (`handler_steer`). See
    /// `uswap/src/fault/handler_pool.rs` and docs/fault-modes.md.
    pub handler_retire: u64,
    /// Thread mode: dormant handlers woken because one read 4 or more faults at once.
    pub handler_backlog: u64,
    /// Thread mode: dormant handlers woken as helpers, after a stream's window was served
    /// while another thread's fault waited.
    pub handler_help: u64,
    /// Thread mode: hand-overs from a lone handler to the one pinned on the CPU where the
    /// faulting thread last ran.
    pub handler_steer: u64,
    /// Thread mode: times a handler stopped spinning for the next fault for a while (its
    /// spins mostly found nothing, or another thread wanted its CPU).
    pub handler_spin_off: u64,
    /// Device writes that failed; the pages stayed staged in RAM and are retried later.
    pub swpout_error: u64,
    /// Pages a device declined (pool full, incompressible) and another device took.
    pub swpout_spilled: u64,
    /// Pages moved from a device to the next tier (zswap's `zswpwb`).
    pub writeback: u64,
    /// Device reads whose data did not match the page's checksum (the page was not mapped;
    /// see `Pager::recent_errors`).
    pub checksum_errors: u64,
    /// Slots that could not be freed (the lock-free free queue was full): leaked, never
    /// reused. Should stay 0.
    pub slots_leaked: u64,
    /// `UFFDIO_MOVE` calls that moved a page but reported it as failed (a Linux 6.18 bug in
    /// batched moves; the engine checks the page tables and carries on). Informational.
    pub uffd_move_misreports: u64,
    /// Application pages in RAM that count against the limit: mapped plus staged.
    pub resident_pages: u64,
    /// The most application pages that were resident at once since the pager started.
    pub resident_peak_pages: u64,
    /// Of those, pages staged in the swap cache (unmapped, contents in RAM).
    pub swapcache_pages: u64,
    /// Of the resident pages, clean ones: read back from a device and not written since, so
    /// their slot still holds them (the kernel's `SwapCached`).
    pub clean_pages: u64,
    /// The resident limit, in pages.
    pub limit_pages: u64,
    /// The process's anonymous memory that no pager manages (and that is not the engine's
    /// own), in bytes, as last measured by whoever measures it ([`note_unmanaged`]; `uswap
    /// run`'s library does, from `/proc/self/smaps`, every second). Process-wide: every
    /// pager of the process reports the same figure.
    pub unmanaged_bytes: u64,
    /// The most of it measured at once.
    pub unmanaged_peak_bytes: u64,
    /// Signal mode: system calls whose memory was partly managed and made ready before the
    /// call (see [`crate::prepare_user_access`]). Process-wide, as the two below.
    pub syscall_prepared: u64,
    /// Of those, calls that still failed with `EFAULT` and were made again (a page taken
    /// out again before the call, a structure larger than assumed).
    pub syscall_efault_retried: u64,
    /// Calls on managed memory whose `EFAULT` reached the program after every retry. Should
    /// stay 0: anything else is a call whose memory the rules did not cover.
    pub syscall_efault: u64,
    /// Calls made again for part of a transfer (`write`, `read` of a file, their vector and
    /// positioned forms): the rest of one that stopped short because reclaim took a page of
    /// its buffer out during the call, or a window of a buffer too large to be in whole at
    /// once; as the kernel, faulting page by page, would have gone on (see the preload's
    /// `syscalls::complete`).
    pub syscall_continued: u64,
    /// Signal mode: calls that set up memory the kernel reads or writes on its own, outside
    /// any call the preload can prepare (`io_uring_setup`, `io_setup`, a KVM memory region in
    /// managed memory): its accesses to pages that are out fail. Said once on stderr; such
    /// programs belong in thread mode.
    pub syscall_async_kernel_access: u64,
    /// The most memory the in-RAM compressed pools held at once (sum of their devices'
    /// `pool_peak_bytes`): what the pager's devices cost on top of the resident pages.
    /// Summed over processes (as `uswap run` does) it bounds the tree's peak from above.
    pub pool_peak_bytes: u64,
    /// Per device, in priority order.
    pub devices: Vec<DeviceStats>,
    /// Fault service time (from entering the engine to the page being mapped), microseconds.
    pub fault_latency_us: LatencySummary,
    /// How these counters are published for `uswap stat` (see [`crate::stats_server`]).
    pub publish: PublishStats,
}

/// The stats socket's own figures (see [`crate::stats_server`]).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct PublishStats {
    /// The abstract unix socket the counters are served on (`uswap.<pid>.<n>`), if any.
    pub socket: Option<String>,
    /// Why they are not published, if binding the socket failed (the pager runs on).
    pub error: Option<String>,
    /// Queries answered.
    pub queries: u64,
    /// Connections closed without an answer: the peer was neither this process's user nor
    /// root.
    pub peers_refused: u64,
    /// Answers not delivered: the peer did not read them within the send timeout, or left.
    pub send_errors: u64,
}

/// The process's unmanaged memory, last measured and at its peak (see
/// [`Stats::unmanaged_bytes`]).
static UNMANAGED_BYTES: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
static UNMANAGED_PEAK_BYTES: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// Records a measurement of the process's anonymous memory that no pager manages; every
/// pager's counters report it from then on.
pub fn note_unmanaged(bytes: u64) {
    use std::sync::atomic::Ordering;
    UNMANAGED_BYTES.store(bytes, Ordering::Relaxed);
    UNMANAGED_PEAK_BYTES.fetch_max(bytes, Ordering::Relaxed);
}

/// What happened to a system call on managed memory in signal mode (see
/// [`Stats::syscall_prepared`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SyscallEvent {
    /// Its memory was made ready before the call.
    Prepared,
    /// It failed with `EFAULT` and was made again.
    EfaultRetried,
    /// Its `EFAULT` reached the program.
    Efault,
    /// It stopped short at a page reclaim took out during the call, and was continued
    /// for the rest.
    Continued,
    /// It set up memory the kernel reads or writes on its own later, outside any call
    /// (io_uring, AIO, a KVM guest's RAM in managed memory).
    AsyncKernelAccess,
}

static SYSCALL_EVENTS: [std::sync::atomic::AtomicU64; 5] = [const { std::sync::atomic::AtomicU64::new(0) }; 5];

/// Counts a system call event; async-signal-safe.
pub fn note_syscall(event: SyscallEvent) {
    SYSCALL_EVENTS[event as usize].fetch_add(1, std::sync::atomic::Ordering::Relaxed);
}

/// Pages taken out of regions by reclaim, process-wide, ever: a system call that met
/// `EFAULT` compares it before and after preparing its memory again (see
/// [`crate::prepare_user_access`]).
static TAKEN_OUT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// Records that reclaim took `nr_pages` out of regions (after the moves).
pub(crate) fn note_taken_out(nr_pages: u64) {
    if nr_pages != 0 {
        TAKEN_OUT.fetch_add(nr_pages, std::sync::atomic::Ordering::Release);
    }
}

/// Pages taken out of regions since the process started: unchanged across a preparation
/// and a system call, no page it prepared can have gone out meanwhile.
pub fn taken_out_seq() -> u64 {
    TAKEN_OUT.load(std::sync::atomic::Ordering::Acquire)
}

/// The counts recorded with [`note_syscall`], in [`SyscallEvent`] order.
pub(crate) fn syscall_events() -> [u64; 5] {
    SYSCALL_EVENTS.each_ref().map(|c| c.load(std::sync::atomic::Ordering::Relaxed))
}

/// The last and the peak measurement recorded with [`note_unmanaged`].
pub(crate) fn unmanaged() -> (u64, u64) {
    use std::sync::atomic::Ordering;
    (UNMANAGED_BYTES.load(Ordering::Relaxed), UNMANAGED_PEAK_BYTES.load(Ordering::Relaxed))
}

impl Stats {
    /// Adds `other`'s figures to these, for the sum of several pagers: counters and page
    /// counts (limit included) are summed; devices with the same name are merged (their
    /// figures summed, the compression ratio recomputed) and others appended; fault latency
    /// counts and means are combined exactly, its percentiles and maximum are the largest
    /// of the two (an upper bound: percentiles of a sum cannot be had from summaries).
    pub fn add(&mut self, other: &Stats) {
        macro_rules! sum {
            ($($field:ident),* $(,)?) => { $( self.$field += other.$field; )* };
        }
        sum!(
            pgfault,
            pgfault_zero,
            zero_fill_around,
            pgfault_swapcache,
            pgmajfault,
            pgfault_wp,
            pswpin,
            pswpout,
            swpout_clean,
            swpout_zero,
            pgsteal_background,
            pgsteal_direct,
            pgactivate,
            allocstall,
            swap_alloc_fail,
            limit_overrun,
            swap_ra,
            swap_ra_hit,
            swap_ra_unused,
            swap_ra_async_started,
            swap_ra_async,
            swap_ra_async_dropped,
            swap_ra_async_wait,
            uffd_unmap,
            uffd_remap,
            uffd_remove,
            pgfault_swapcache_copy,
            fault_raced,
            fault_lock_free,
            fault_busy_timeout,
            fault_event_wait_timeout,
            fault_error,
            lru_overflow,
            move_refused,
            cow_broken,
            swpout_neighbours,
            handler_retire,
            handler_backlog,
            handler_help,
            handler_steer,
            handler_spin_off,
            swpout_error,
            swpout_spilled,
            writeback,
            checksum_errors,
            slots_leaked,
            uffd_move_misreports,
            resident_pages,
            swapcache_pages,
            clean_pages,
            limit_pages,
            resident_peak_pages,
            unmanaged_bytes,
            unmanaged_peak_bytes,
            syscall_prepared,
            syscall_efault_retried,
            syscall_efault,
            syscall_continued,
            syscall_async_kernel_access,
            remap_copied,
            limit_overrun_busy,
            pool_wait_timeout,
            pool_peak_bytes,
        );
        for d in &other.devices {
            match self.devices.iter_mut().find(|mine| mine.name == d.name) {
                Some(mine) => mine.add(d),
                None => self.devices.push(d.clone()),
            }
        }
        let (a, b) = (&mut self.fault_latency_us, &other.fault_latency_us);
        let count = a.count + b.count;
        a.mean = if count == 0 { 0.0 } else { (a.mean * a.count as f64 + b.mean * b.count as f64) / count as f64 };
        a.count = count;
        a.p50 = a.p50.max(b.p50);
        a.p90 = a.p90.max(b.p90);
        a.p99 = a.p99.max(b.p99);
        a.p999 = a.p999.max(b.p999);
        a.max = a.max.max(b.max);
        self.publish.queries += other.publish.queries;
        self.publish.peers_refused += other.publish.peers_refused;
        self.publish.send_errors += other.publish.send_errors;
    }
}

impl DeviceStats {
    fn add(&mut self, other: &DeviceStats) {
        self.nr_slots += other.nr_slots;
        self.slots_used += other.slots_used;
        self.clusters_free += other.clusters_free;
        self.clusters_nonfull += other.clusters_nonfull;
        self.clusters_full += other.clusters_full;
        self.clusters_discarded += other.clusters_discarded;
        match (&mut self.backend, &other.backend) {
            (Some(a), Some(b)) => {
                a.pool_bytes += b.pool_bytes;
                a.pool_peak_bytes += b.pool_peak_bytes;
                a.stored_pages += b.stored_pages;
                a.same_filled_pages += b.same_filled_pages;
                a.incompressible_pages += b.incompressible_pages;
                a.compressed_bytes += b.compressed_bytes;
                a.compression_ratio = if a.pool_bytes == 0 {
                    0.0
                } else {
                    (a.stored_pages * crate::PAGE_SIZE as u64) as f64 / a.pool_bytes as f64
                };
                a.reject_pool_full += b.reject_pool_full;
                a.reject_incompressible += b.reject_incompressible;
                a.reject_alloc_fail += b.reject_alloc_fail;
                a.discard_errors += b.discard_errors;
                a.failovers += b.failovers;
                a.remote_read_errors += b.remote_read_errors;
            }
            (None, Some(b)) => self.backend = Some(b.clone()),
            (_, None) => {}
        }
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
        s.pgfault_swapcache_copy = self.sum(PgfaultSwapcacheCopy);
        s.remap_copied = self.sum(RemapCopied);
        s.limit_overrun_busy = self.sum(LimitOverrunBusy);
        s.pool_wait_timeout = self.sum(PoolWaitTimeout);
        s.fault_raced = self.sum(FaultRaced);
        s.fault_lock_free = self.sum(FaultLockFree);
        s.fault_busy_timeout = self.sum(FaultBusyTimeout);
        s.fault_event_wait_timeout = self.sum(FaultEventWaitTimeout);
        s.fault_error = self.sum(FaultError);
        s.lru_overflow = self.sum(LruOverflow);
        s.move_refused = self.sum(MoveRefused);
        s.cow_broken = self.sum(CowBroken);
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
        s.fault_latency_us = self.fault_latency().summary_us();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_are_contiguous_and_cover_their_values() {
        let mut prev_end = 0;
        for i in 0..NR_BUCKETS {
            let (lo, w) = bucket_range(i);
            assert_eq!(lo, prev_end, "bucket {i} starts where {} ended", i.saturating_sub(1));
            assert_eq!(bucket_of(lo), i);
            assert_eq!(bucket_of(lo + w - 1), i);
            prev_end = lo + w;
        }
    }

    #[test]
    fn quantiles_are_within_the_relative_error() {
        let mut h = Histogram::new();
        for v in 1..=100_000u64 {
            h.record(v * 10);
        }
        for (q, exact) in [(0.5, 500_000.0), (0.9, 900_000.0), (0.99, 990_000.0)] {
            let got = h.quantile(q) as f64;
            assert!((got - exact).abs() / exact < 0.0625, "q{q}: {got} vs {exact}");
        }
        assert_eq!(h.count(), 100_000);
        let m = h.mean();
        assert!((m - 500_005.0).abs() / 500_005.0 < 0.0625, "mean {m}");
    }

    #[test]
    fn per_cpu_counters_sum() {
        let s = PerCpuStats::new(4);
        for _ in 0..10 {
            s.inc(Counter::Pswpin);
        }
        s.add(Counter::Pswpout, 7);
        assert_eq!(s.sum(Counter::Pswpin), 10);
        assert_eq!(s.sum(Counter::Pswpout), 7);
        s.record_fault_latency(5_000);
        assert_eq!(s.fault_latency().count(), 1);
    }

    #[test]
    fn record_n_rebuilds_a_histogram_from_its_buckets() {
        let mut h = Histogram::new();
        for v in [3u64, 17, 17, 1000, 123_456, 9_999_999] {
            h.record(v);
        }
        let mut rebuilt = Histogram::new();
        for (lo, _, count) in h.buckets() {
            rebuilt.record_n(lo, count);
        }
        assert_eq!(rebuilt, h);
    }

    #[test]
    fn add_sums_every_counter_and_merges_devices_by_name() {
        // Every top-level number set to 1: a counter added to `add` later cannot be forgotten.
        let mut ones = serde_json::to_value(Stats::default()).unwrap();
        let nr_numbers = {
            let obj = ones.as_object_mut().unwrap();
            let mut n = 0;
            for v in obj.values_mut() {
                if v.is_u64() {
                    *v = 1.into();
                    n += 1;
                }
            }
            n
        };
        assert!(nr_numbers >= 40, "{nr_numbers} numeric fields");
        let mut a: Stats = serde_json::from_value(ones).unwrap();
        let dev = |name: &str, used, stored| DeviceStats {
            name: name.into(),
            nr_slots: 1000,
            slots_used: used,
            backend: Some(crate::backend::BackendStats {
                pool_bytes: 4096,
                stored_pages: stored,
                ..Default::default()
            }),
            ..Default::default()
        };
        a.devices = vec![dev("zpool", 10, 2)];
        a.fault_latency_us = LatencySummary { count: 1, mean: 10.0, p50: 10.0, max: 10.0, ..Default::default() };
        let mut b = a.clone();
        b.devices = vec![dev("zpool", 5, 4), dev("ram", 7, 0)];
        b.fault_latency_us = LatencySummary { count: 3, mean: 2.0, p50: 2.0, max: 30.0, ..Default::default() };
        a.add(&b);
        let sum = serde_json::to_value(&a).unwrap();
        for (k, v) in sum.as_object().unwrap() {
            if v.is_u64() {
                assert_eq!(v.as_u64(), Some(2), "{k} not summed");
            }
        }
        assert_eq!(a.devices.len(), 2);
        assert_eq!((a.devices[0].name.as_str(), a.devices[0].nr_slots, a.devices[0].slots_used), ("zpool", 2000, 15));
        let pool = a.devices[0].backend.as_ref().unwrap();
        assert_eq!((pool.pool_bytes, pool.stored_pages), (8192, 6));
        assert_eq!(pool.compression_ratio, 3.0);
        assert_eq!((a.devices[1].name.as_str(), a.devices[1].slots_used), ("ram", 7));
        let l = a.fault_latency_us;
        assert_eq!((l.count, l.mean, l.p50, l.max), (4, 4.0, 10.0, 30.0));
    }
}
