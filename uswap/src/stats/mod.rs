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

mod counter;
mod histogram;

use serde::{Deserialize, Serialize};

pub(crate) use counter::{Counter, PerCpuStats};
pub use histogram::{AtomicHistogram, Histogram, LatencySummary, NR_BUCKETS};

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
    /// Of those, slots this process freed that a fork child may still read (a file device
    /// shared with children): reused once no child can (see `swap::fork_refs`).
    pub slots_held_for_children: u64,
    /// Clusters entirely free / partly used / full.
    pub clusters_free: u64,
    pub clusters_nonfull: u64,
    pub clusters_full: u64,
    /// Clusters discarded (storage returned) before reuse, since the pager started.
    pub clusters_discarded: u64,
    /// Its writes fail now: it takes no pages until a probe write succeeds (see
    /// `swap::health`).
    pub degraded: bool,
    /// Times its writes began to fail since the pager started.
    pub degraded_episodes: u64,
    /// Times it was refused storage for 16 more slots (64 KiB) because the processes of its
    /// tree held the device's whole size together (`uswap run`; see `shared_charge::DeviceShare`).
    pub charges_refused_tree_full: u64,
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
    /// Clean pages reclaim dropped without writing them: their slot still held them (those
    /// the aging scan staged clean too, once writeback took them).
    pub swpout_clean: u64,
    /// Pages found all-zero at swap-out (kept as "known zero", no slot).
    pub swpout_zero: u64,
    /// Pages moved out of regions by the background reclaimer / by direct reclaim.
    pub pgsteal_background: u64,
    pub pgsteal_direct: u64,
    /// Victims given a second chance because they had faulted back from the swap cache, or
    /// from a device within the working set (`workingset_activate`) and written since.
    pub pgactivate: u64,
    /// Pages read back from a device soon enough after they left to count as part of the
    /// working set (their refault distance no more than the pages on the LRU): spared once
    /// by reclaim (`crate::lru`), a clean one once it has been written.
    pub workingset_activate: u64,
    /// Resident pages the aging scan moved to the swap cache to see whether they are still
    /// used (see [`crate::IdleAging`]).
    pub pgdeactivate: u64,
    /// Staged pages sent out because they had been idle for the idle age: written to a
    /// device, or, staged clean, dropped (counted in `swpout_clean` too).
    pub swpout_idle: u64,
    /// Pages moved down a tier because they had been idle there for the idle age.
    pub writeback_idle: u64,
    /// Pages the background reclaimer sent out for the faults that moved them out (see
    /// [`crate::BackgroundReclaim::StageTwo`]): written (also in `pswpout`), or, staged clean
    /// by the aging scan, dropped (also in `swpout_clean`).
    pub pswpout_background: u64,
    /// Swap-cache hits on pages the aging scan staged: pages found still in use (also in
    /// `pgfault_swapcache`; not stalls).
    pub pgfault_aged: u64,
    /// Device read calls (swap-ins and tier writeback; a call reads one or more runs of
    /// pages) and the time they took, in microseconds: `device_read_us / pgmajfault` is the
    /// device's share of a major fault, the rest of `fault_latency_us` is uswap's.
    pub device_reads: u64,
    pub device_read_us: u64,
    /// Device write calls (swap-outs and tier writeback) and the time they took.
    pub device_writes: u64,
    pub device_write_us: u64,
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
    /// Page-table words read to find which pages of a region are still its own, once some
    /// were unmapped (a fork, a region's release): nothing while no page is unmapped.
    pub gone_scan_pages: u64,
    /// Swap-cache hits on read-only (`mprotect`) or locked (`mlockall`) memory, served by
    /// copying the staged page.
    pub pgfault_swapcache_copy: u64,
    /// Pages of a part of a region moved away by `mremap` that were staged or swapped out
    /// and were copied into place at the new address (that part is ordinary memory since).
    pub remap_copied: u64,
    /// Of `limit_overrun`, the charges that went over the limit although the devices had
    /// room: every page reclaim found stayed busy in other threads' faults and device writes
    /// for the whole bounded wait (`reclaim::charge`). Nothing is lost; the pages stay
    /// resident until reclaim takes them.
    pub limit_overrun_busy: u64,
    /// Operations that gave up after waiting `sync::POP_WAIT_LIMIT_NS` (10 s) for a bounce
    /// buffer, every one of them lent out to threads that made no progress: a fault that
    /// ends in SIGBUS (its page kept on its device), or an mremap take-out tried again
    /// later. Should stay 0; nonzero means a device read hung or threads were starved.
    /// Named `pool_wait_timeout` before (read under that name too): it is not the
    /// compressed pool's.
    #[serde(alias = "pool_wait_timeout")]
    pub bounce_wait_timeout: u64,
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
    /// Waits past the bound (1 s) for the events already read (`munmap`, `madvise`,
    /// `mremap`) to be applied, that went on without: signal-mode faults and system calls,
    /// and the program's unmaps and new regions (which also wait for other threads' unmaps
    /// under way). Should stay 0; see `events::wait_until_applied`, `events::settle_unmaps`.
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
    /// Pages a fork child inherited that its parent then let go of (wrote, or moved out), so
    /// that the child alone mapped them: charged to the child from then on, and paged by it.
    pub shared_adopted: u64,
    /// Victims reclaim left resident because a system call in signal mode had pinned them:
    /// its memory stays in until the call returns (see [`crate::prepare_user_access`]); or,
    /// in a process that never forked, because `UFFDIO_MOVE` refused them lately (the
    /// kernel pins them for a call under way: `process_vm_readv`, `O_DIRECT`).
    pub reclaim_pinned: u64,
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
    /// Times a move into a staging area found pages the program had mapped there by reading
    /// them (a program that reads every readable mapping it has) and dropped them before it
    /// went on. Informational.
    pub staging_foreign_drops: u64,
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
    /// run`'s library does, from `/proc/self/pagemap`, every second; in a tree, a shared
    /// memory object counts only in the process that counts it for the tree). Process-wide:
    /// every pager of the process reports the same figure.
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
    /// once; or a `read`, `write`, `pread64` or `pwrite64` of the process's own memory file
    /// (`/proc/self/mem`) that met a page out of RAM; as the kernel, faulting page by page,
    /// would have gone on (see `syscall_guard::complete` and `syscall_guard::own_memory`).
    pub syscall_continued: u64,
    /// Signal mode: calls that set up memory the kernel reads or writes on its own, outside
    /// any call the preload can prepare (`io_uring_setup`, `io_setup`, a KVM memory region in
    /// managed memory): its accesses to pages that are out fail. Said once on stderr; such
    /// programs belong in thread mode.
    pub syscall_async_kernel_access: u64,
    /// Signal mode: calls whose memory was brought in unpinned because every pin slot was
    /// taken by other calls at once (see [`crate::prepare_user_access`]).
    pub syscall_unpinned: u64,
    /// Locks of managed memory (`mlock`, `munlock`'s split of a range) that could not be
    /// recorded, so their pages may be swapped out (see `crate::mlock`). Said once on stderr.
    pub mlock_unhonoured: u64,
    /// The most memory the in-RAM compressed pools held at once (sum of their devices'
    /// `pool_peak_bytes`): what the pager's devices cost on top of the resident pages.
    /// Summed over processes (as `uswap run` does) it bounds the tree's peak from above.
    pub pool_peak_bytes: u64,
    /// Per device, in priority order.
    pub devices: Vec<DeviceStats>,
    /// Fault service time (from entering the engine to the page being mapped), microseconds.
    pub fault_latency_us: LatencySummary,
    /// Time the application stalled on memory (see [`crate::pressure`]).
    pub stall: StallStats,
    /// Managed memory untouched for at least 1 s, 10 s, 1 min and 10 min.
    pub idle: IdleStats,
    /// How these counters are published for `uswap stat` (see [`crate::stats_server`]).
    pub publish: PublishStats,
}

/// Memory stalls as PSI's *some* line reports them (see [`crate::pressure`]): the time
/// during which at least one thread waited for a swap-in, a page on its way out or room under
/// the limit. Summed over pagers or processes, an upper bound of their union (`uswap run`
/// reports the tree's union itself).
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct StallStats {
    /// Since the pager started.
    pub seconds_total: f64,
    /// Running averages over 10 s, 60 s and 300 s, in percent of wall time.
    pub avg10: f64,
    pub avg60: f64,
    pub avg300: f64,
}

/// The idle-age histogram: bytes of managed memory untouched for at least each age. A page
/// counts from the moment it left its region (reclaim, or the aging scan of
/// `PagerBuilder::idle_aging`, moved it out) until it is touched again; a page in its region
/// counts as in use, so without the aging scan these are lower bounds (see
/// docs/auto-budget.md, "Idle aging"). Summed over pagers or processes.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct IdleStats {
    pub idle_1s_bytes: u64,
    pub idle_10s_bytes: u64,
    pub idle_60s_bytes: u64,
    pub idle_600s_bytes: u64,
}

impl IdleStats {
    /// From page counts for each of `swap::idle_ages::IDLE_BUCKETS_S`.
    pub fn from_pages(pages: [u64; 4]) -> IdleStats {
        let [a, b, c, d] = pages.map(|n| n * crate::uffd::PAGE_SIZE as u64);
        IdleStats { idle_1s_bytes: a, idle_10s_bytes: b, idle_60s_bytes: c, idle_600s_bytes: d }
    }

    /// The buckets with their ages in seconds.
    pub fn buckets(&self) -> [(u64, u64); 4] {
        [(1, self.idle_1s_bytes), (10, self.idle_10s_bytes), (60, self.idle_60s_bytes), (600, self.idle_600s_bytes)]
    }
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
    /// It stopped short at a page reclaim took out during the call (or, on the process's
    /// own memory file, at a page out of RAM), and was continued for the rest.
    Continued,
    /// It set up memory the kernel reads or writes on its own later, outside any call
    /// (io_uring, AIO, a KVM guest's RAM in managed memory).
    AsyncKernelAccess,
    /// Its memory was brought in unpinned: every pin slot was taken.
    Unpinned,
    /// A lock it made (`mlock`) could not be recorded (see `crate::mlock`).
    MlockUnhonoured,
}

static SYSCALL_EVENTS: [std::sync::atomic::AtomicU64; 7] = [const { std::sync::atomic::AtomicU64::new(0) }; 7];

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
pub(crate) fn syscall_events() -> [u64; 7] {
    SYSCALL_EVENTS.each_ref().map(|c| c.load(std::sync::atomic::Ordering::Relaxed))
}

/// The last and the peak measurement recorded with [`note_unmanaged`].
pub(crate) fn unmanaged() -> (u64, u64) {
    use std::sync::atomic::Ordering;
    (UNMANAGED_BYTES.load(Ordering::Relaxed), UNMANAGED_PEAK_BYTES.load(Ordering::Relaxed))
}

/// `a.f += b.f` for every field `f` named.
macro_rules! sum_fields {
    ($a:ident, $b:ident, $($field:ident),* $(,)?) => { $( $a.$field += $b.$field; )* };
}

impl Stats {
    /// The figures of a process that has ended, for a sum over a tree now: its counters
    /// (what it did) still count, what it held (resident and staged pages, idle memory,
    /// unmanaged memory, its devices' contents, its stall averages) no longer does.
    pub fn ended(mut self) -> Stats {
        self.resident_pages = 0;
        self.swapcache_pages = 0;
        self.clean_pages = 0;
        self.limit_pages = 0;
        self.unmanaged_bytes = 0;
        self.idle = IdleStats::default();
        self.stall.avg10 = 0.0;
        self.stall.avg60 = 0.0;
        self.stall.avg300 = 0.0;
        self.devices.clear();
        self
    }

    /// Adds `other`'s figures to these, for the sum of several pagers: counters and page
    /// counts (limit included) are summed; devices with the same name are merged (their
    /// figures summed, the compression ratio recomputed) and others appended; fault latency
    /// counts, means and maximum are combined exactly, its percentiles weighted by the
    /// counts (an estimate: percentiles of a sum cannot be had from summaries).
    pub fn add(&mut self, other: &Stats) {
        self.add_counters(other);
        for d in &other.devices {
            match self.devices.iter_mut().find(|mine| mine.name == d.name) {
                Some(mine) => mine.add(d),
                None => self.devices.push(d.clone()),
            }
        }
        self.idle.add(&other.idle);
        self.stall.add(&other.stall);
        add_latency(&mut self.fault_latency_us, &other.fault_latency_us);
        self.publish.queries += other.publish.queries;
        self.publish.peers_refused += other.publish.peers_refused;
        self.publish.send_errors += other.publish.send_errors;
    }

    /// Sums `other`'s counters and what it holds into these (see [`Stats::add`]).
    fn add_counters(&mut self, other: &Stats) {
        self.add_events(other);
        self.add_held(other);
    }

    /// Sums `other`'s event counters (what happened, in the style of `/proc/vmstat`).
    fn add_events(&mut self, other: &Stats) {
        self.add_fault_events(other);
        self.add_reclaim_events(other);
    }

    /// Faults, swap-ins, read-ahead, the fault handlers and system calls on managed memory.
    fn add_fault_events(&mut self, other: &Stats) {
        sum_fields!(
            self,
            other,
            pgfault,
            pgfault_zero,
            zero_fill_around,
            pgfault_swapcache,
            pgmajfault,
            pgfault_wp,
            pswpin,
            pgfault_aged,
            device_reads,
            device_read_us,
            swap_ra,
            swap_ra_hit,
            swap_ra_unused,
            swap_ra_async_started,
            swap_ra_async,
            swap_ra_async_dropped,
            swap_ra_async_wait,
            pgfault_swapcache_copy,
            fault_raced,
            fault_lock_free,
            fault_busy_timeout,
            fault_event_wait_timeout,
            fault_error,
            handler_retire,
            handler_backlog,
            handler_help,
            handler_steer,
            handler_spin_off,
            checksum_errors,
            syscall_prepared,
            syscall_efault_retried,
            syscall_efault,
            syscall_continued,
            syscall_async_kernel_access,
            syscall_unpinned,
            mlock_unhonoured,
            bounce_wait_timeout
        );
    }

    /// Reclaim, swap-outs, writeback and the device's slots.
    fn add_reclaim_events(&mut self, other: &Stats) {
        sum_fields!(
            self,
            other,
            pswpout,
            swpout_clean,
            swpout_zero,
            pgsteal_background,
            pgsteal_direct,
            pgactivate,
            workingset_activate,
            pgdeactivate,
            swpout_idle,
            writeback_idle,
            pswpout_background,
            device_writes,
            device_write_us,
            allocstall,
            swap_alloc_fail,
            limit_overrun,
            uffd_unmap,
            uffd_remap,
            uffd_remove,
            lru_overflow,
            move_refused,
            cow_broken,
            shared_adopted,
            reclaim_pinned,
            swpout_neighbours,
            swpout_error,
            swpout_spilled,
            writeback,
            slots_leaked,
            uffd_move_misreports,
            staging_foreign_drops,
            remap_copied,
            limit_overrun_busy,
            gone_scan_pages
        );
    }

    /// Sums what `other` holds (pages and bytes, now and at their peaks, the limit): the
    /// figures [`Stats::ended`] zeroes, but for the peaks.
    fn add_held(&mut self, other: &Stats) {
        sum_fields!(
            self,
            other,
            resident_pages,
            swapcache_pages,
            clean_pages,
            limit_pages,
            resident_peak_pages,
            unmanaged_bytes,
            unmanaged_peak_bytes,
            pool_peak_bytes,
        );
    }
}

impl IdleStats {
    /// Adds `other`'s bytes, bucket by bucket.
    fn add(&mut self, other: &IdleStats) {
        self.idle_1s_bytes += other.idle_1s_bytes;
        self.idle_10s_bytes += other.idle_10s_bytes;
        self.idle_60s_bytes += other.idle_60s_bytes;
        self.idle_600s_bytes += other.idle_600s_bytes;
    }
}

impl StallStats {
    /// Adds `other`'s stall time and averages (an upper bound of their union).
    fn add(&mut self, other: &StallStats) {
        self.seconds_total += other.seconds_total;
        self.avg10 += other.avg10;
        self.avg60 += other.avg60;
        self.avg300 += other.avg300;
    }
}

/// Combines fault latency summaries: counts, means and the maximum exactly; percentiles as
/// the two summaries' weighted by their counts, an estimate (percentiles of a sum cannot be
/// had from summaries). The larger of the two, as before, put a tree's p50 at 270 us when
/// 99.5 % of its faults were one process's at 7 us.
fn add_latency(a: &mut LatencySummary, b: &LatencySummary) {
    let count = a.count + b.count;
    let weighted = |x: f64, y: f64| {
        if count == 0 {
            x.max(y)
        } else {
            (x * a.count as f64 + y * b.count as f64) / count as f64
        }
    };
    a.mean = if count == 0 { 0.0 } else { weighted(a.mean, b.mean) };
    a.p50 = weighted(a.p50, b.p50);
    a.p90 = weighted(a.p90, b.p90);
    a.p99 = weighted(a.p99, b.p99);
    a.p999 = weighted(a.p999, b.p999);
    a.max = a.max.max(b.max);
    a.count = count;
}

impl DeviceStats {
    fn add(&mut self, other: &DeviceStats) {
        sum_fields!(
            self,
            other,
            nr_slots,
            slots_used,
            slots_held_for_children,
            clusters_free,
            clusters_nonfull,
            clusters_full,
            clusters_discarded,
            degraded_episodes,
            charges_refused_tree_full,
        );
        // Summed over processes: degraded in any of them.
        self.degraded |= other.degraded;
        match (&mut self.backend, &other.backend) {
            (Some(a), Some(b)) => {
                sum_fields!(
                    a,
                    b,
                    pool_bytes,
                    pool_peak_bytes,
                    stored_pages,
                    same_filled_pages,
                    same_filled_stores,
                    incompressible_pages,
                    compressed_bytes,
                    object_bytes,
                    compacted_chunks,
                    units,
                    unit_pages,
                    unit_fallbacks,
                    dictionary_bytes,
                    codec_bytes,
                    dictionary_failures,
                    dictionary_in_use,
                    dictionary_turned_off,
                    reject_pool_full,
                    reject_incompressible,
                    reject_alloc_fail,
                    discard_errors,
                    failovers,
                    redirects,
                    remote_read_errors,
                );
                a.compression_ratio = if a.pool_bytes == 0 {
                    0.0
                } else {
                    (a.stored_pages * crate::PAGE_SIZE as u64) as f64 / a.pool_bytes as f64
                };
            }
            (None, Some(b)) => self.backend = Some(b.clone()),
            (_, None) => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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

    /// A counter renamed is still read under its former name (a `uswap stat` of a program
    /// running an older engine, JSON kept from before), and written under its new one.
    #[test]
    fn renamed_counters_are_read_under_their_former_names() {
        let s: Stats = serde_json::from_str(r#"{"pool_wait_timeout": 3}"#).unwrap();
        assert_eq!(s.bounce_wait_timeout, 3);
        let v = serde_json::to_value(&s).unwrap();
        assert_eq!((v["bounce_wait_timeout"].as_u64(), v.get("pool_wait_timeout")), (Some(3), None));
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
        // Percentiles weighted by the counts (1 fault at 10 us, 3 at 2 us): 4 us, not 10.
        assert_eq!((l.count, l.mean, l.p50, l.max), (4, 4.0, 4.0, 30.0));
    }
}
