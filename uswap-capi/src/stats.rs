//! The counters as a C struct that can grow without breaking the ABI.
//!
//! `uswap_stats` starts with its size. The caller sets `size` to the `sizeof` it was compiled
//! with; uswap fills that many bytes (whole fields, at most its own size) and writes back how
//! many it filled. A program built against an older header gets the fields it knows; one
//! built against a newer header than the library it runs with sees, in `size`, which fields
//! were filled. Fields are only ever added at the end, and all are `uint64_t`, so there is no
//! padding and every field's offset is fixed.
//!
//! No locks and no invariants beyond the layout; the values are one `Pager::stats` snapshot.

use engine::Stats;

/// A snapshot of a pager's counters, filled by `uswap_get_stats`. Counter names follow
/// `/proc/vmstat` where the kernel has one. Fields are only ever added at the end.
#[allow(non_camel_case_types)]
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct uswap_stats {
    /// Set to `sizeof(uswap_stats)` before calling `uswap_get_stats`; on return, the number of
    /// bytes uswap filled (fields past it were left as they were).
    pub size: u64,
    /// The page size uswap works in, in bytes.
    pub page_size_bytes: u64,
    /// Bytes of application pages in RAM that count against the limit (`resident_pages` times
    /// the page size).
    pub resident_bytes: u64,
    /// The resident limit in bytes (`limit_pages` times the page size).
    pub limit_bytes: u64,
    /// Faults served, all kinds.
    pub pgfault: u64,
    /// Zero-fill faults (page never touched, or known to be zero).
    pub pgfault_zero: u64,
    /// Never-touched pages mapped ahead by zero-fill faults of a sequential stream (fault-around);
    /// they took no fault of their own.
    pub zero_fill_around: u64,
    /// Swap-cache hits: the page was staged in RAM and moved back without a copy.
    pub pgfault_swapcache: u64,
    /// Faults that read a device.
    pub pgmajfault: u64,
    /// Write-protect faults: the first write to a clean page (read back from a device and not
    /// written since); its slot is freed.
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
    /// Pages moved out of regions by the background reclaimer.
    pub pgsteal_background: u64,
    /// Pages moved out of regions by direct reclaim (in the faulting thread).
    pub pgsteal_direct: u64,
    /// Victims given a second chance because they had faulted back from the swap cache.
    pub pgactivate: u64,
    /// Allocations that had to reclaim directly because the limit was reached.
    pub allocstall: u64,
    /// Swap-outs that found no free slot: the page stayed resident, nothing was lost.
    pub swap_alloc_fail: u64,
    /// Charges that exceeded the limit because nothing could be reclaimed (devices full).
    pub limit_overrun: u64,
    /// Pages read ahead: read from a device and mapped along with the page that faulted.
    pub swap_ra: u64,
    /// Read-ahead pages the application used.
    pub swap_ra_hit: u64,
    /// Read-ahead pages evicted before they were known to be used.
    pub swap_ra_unused: u64,
    /// Pages whose asynchronous readahead was started (file devices).
    pub swap_ra_async_started: u64,
    /// Of those, pages mapped from the readahead buffer.
    pub swap_ra_async: u64,
    /// Of those, pages never mapped from the buffer.
    pub swap_ra_async_dropped: u64,
    /// Faults that found their asynchronous readahead still in flight and waited for it.
    pub swap_ra_async_wait: u64,
    /// Application `munmap`s over regions: those pages are gone, their swap space freed.
    pub uffd_unmap: u64,
    /// Application `mremap`s of regions.
    pub uffd_remap: u64,
    /// Application `MADV_DONTNEED`/`MADV_REMOVE` over regions: those pages read zero afterwards.
    pub uffd_remove: u64,
    /// Swap-cache hits on read-only (`mprotect`) memory, served by copying the staged page.
    pub pgfault_swapcache_copy: u64,
    /// Faults that found their page already resolved by a racing thread, or an event for
    /// its range still to be applied (retried; nothing is lost).
    pub fault_raced: u64,
    /// Signal-mode faults served on the lock-free route (the thread held an engine lock).
    pub fault_lock_free: u64,
    /// Faults that waited longer than the bound for a busy page and failed (SIGBUS) instead of
    /// hanging.
    pub fault_busy_timeout: u64,
    /// Fault-service attempts that failed (device read or checksum); the fault is attempted again.
    pub fault_error: u64,
    /// Resident pages the reclaim queue had no room for (found later by a scan).
    pub lru_overflow: u64,
    /// Pages `UFFDIO_MOVE` refused to move out (pinned or shared); they stayed resident.
    pub move_refused: u64,
    /// Device writes that failed; the pages stayed staged in RAM and are retried later.
    pub swpout_error: u64,
    /// Pages a device declined (pool full, incompressible) and another device took.
    pub swpout_spilled: u64,
    /// Pages moved from a device to the next tier (zswap's `zswpwb`).
    pub writeback: u64,
    /// Device reads whose data did not match the page's checksum (the page was not mapped).
    pub checksum_errors: u64,
    /// Slots that could not be freed and are never reused. Should stay 0.
    pub slots_leaked: u64,
    /// `UFFDIO_MOVE` calls that moved a page but reported failure (a Linux 6.18 bug the engine
    /// works around). Informational.
    pub uffd_move_misreports: u64,
    /// Application pages in RAM that count against the limit: mapped plus staged.
    pub resident_pages: u64,
    /// Of those, pages staged in the swap cache (unmapped, contents in RAM).
    pub swapcache_pages: u64,
    /// Of the resident pages, clean ones: their slot still holds them (the kernel's `SwapCached`).
    pub clean_pages: u64,
    /// The resident limit, in pages.
    pub limit_pages: u64,
    /// The most pages that were resident at once since the pager started.
    pub resident_peak_pages: u64,
    /// Pages a partial `mremap` moved out of a region, copied into place.
    pub remap_copied: u64,
    /// Of `limit_overrun`, charges forced over the limit because every victim stayed busy.
    pub limit_overrun_busy: u64,
    /// Faults or take-outs that gave up waiting 10 s for a bounce buffer (should stay 0):
    /// the engine's `bounce_wait_timeout`, under its former name, kept for the ABI.
    pub pool_wait_timeout: u64,
    /// Pages a fork child shared copy-on-write, made exclusive again (copied, as a write
    /// would) so that reclaim could move them out.
    pub cow_broken: u64,
    /// Dirty resident pages that left with a victim next to them, in one run (one TLB flush
    /// for the run).
    pub swpout_neighbours: u64,
    /// Thread mode: fault handlers that went dormant (see docs/fault-modes.md).
    pub handler_retire: u64,
    /// Thread mode: dormant handlers woken because one read 4 or more faults at once.
    pub handler_backlog: u64,
    /// Thread mode: dormant handlers woken to help while a stream's window was served.
    pub handler_help: u64,
    /// Thread mode: hand-overs to the handler pinned where the faulting thread last ran.
    pub handler_steer: u64,
    /// Thread mode: times a handler stopped spinning for its next fault for a while.
    pub handler_spin_off: u64,
    /// The process's anonymous memory that no pager manages, in bytes, as last measured
    /// (`uswap run`'s library measures it every second; 0 when nothing measures it).
    pub unmanaged_bytes: u64,
    /// The most of it measured at once.
    pub unmanaged_peak_bytes: u64,
    /// Signal mode: system calls whose managed memory was made ready before the call.
    pub syscall_prepared: u64,
    /// Of those, calls that still failed with `EFAULT` and were made again.
    pub syscall_efault_retried: u64,
    /// Calls on managed memory whose `EFAULT` reached the program. Should stay 0.
    pub syscall_efault: u64,
    /// Waits past the bound for read events to be applied: signal-mode faults and system
    /// calls, new regions, and the program's unmaps under `uswap run`. Should stay 0.
    pub fault_event_wait_timeout: u64,
    /// Signal mode: transfers that stopped short at a page reclaim took out during the
    /// call, continued for the rest.
    pub syscall_continued: u64,
    /// Signal mode: calls that set up memory the kernel touches on its own later (io_uring,
    /// AIO, KVM guest RAM in managed memory). Such programs belong in thread mode.
    pub syscall_async_kernel_access: u64,
    /// The most memory the in-RAM compressed pools held at once, in bytes.
    pub pool_peak_bytes: u64,
    /// Victims reclaim left resident because a system call in signal mode had pinned them.
    pub reclaim_pinned: u64,
    /// Signal mode: calls whose memory was brought in unpinned (every pin slot taken).
    pub syscall_unpinned: u64,
    /// Pages a fork child inherited and came to map alone (its parent wrote them or moved
    /// them out), charged to the child from then on.
    pub shared_adopted: u64,
    /// Locks of managed memory (mlock) that could not be recorded: their pages may be swapped out.
    pub mlock_unhonoured: u64,
    /// Microseconds during which some thread of the application stalled on memory (a
    /// swap-in, a page on its way out, room under the limit): PSI's *some* total.
    pub stall_us: u64,
    /// The share of wall time some thread stalled, running averages over 10 s, 60 s and
    /// 300 s, in hundredths of a percent (PSI's avg10, avg60, avg300).
    pub stall_avg10_centipercent: u64,
    pub stall_avg60_centipercent: u64,
    pub stall_avg300_centipercent: u64,
    /// Resident pages the aging scan moved to the swap cache to see whether they are still
    /// used.
    pub pgdeactivate: u64,
    /// Staged pages sent out because they had been idle for the idle age: written to a
    /// device, or, staged clean, dropped (counted in `swpout_clean` too).
    pub swpout_idle: u64,
    /// Pages moved down a tier because they had been idle there for the idle age.
    pub writeback_idle: u64,
    /// Swap-cache hits on pages the aging scan staged: pages found still in use.
    pub pgfault_aged: u64,
    /// Bytes of managed memory untouched for at least 1 s, 10 s, 60 s and 600 s (pages out
    /// of their regions since then; see `uswap_config_set_idle_age`).
    pub idle_1s_bytes: u64,
    pub idle_10s_bytes: u64,
    pub idle_60s_bytes: u64,
    pub idle_600s_bytes: u64,
    /// Device read calls (swap-ins and tier writeback) and the time they took, in
    /// microseconds: `device_read_us / pgmajfault` is the device's share of a major fault.
    pub device_reads: u64,
    pub device_read_us: u64,
    /// Device write calls (swap-outs and tier writeback) and the time they took.
    pub device_writes: u64,
    pub device_write_us: u64,
    /// Pages read back from a device soon enough after they left to count as part of the
    /// working set (their refault distance within the pages on the LRU): spared once by
    /// reclaim (a clean one once it has been written).
    pub workingset_activate: u64,
    /// Times a move into a staging area found pages the program had mapped there by reading
    /// them and dropped them before it went on. Informational.
    pub staging_foreign_drops: u64,
    /// Page-table words read to find which pages of a region are still its own, once some
    /// were unmapped (a fork, a region's release). Informational.
    pub gone_scan_pages: u64,
    /// Pages the background reclaimer sent out for the faults that moved them out (a zstd
    /// pool first: the faults move, the background thread compresses): written (also in
    /// `pswpout`), or, staged clean by the aging scan, dropped (also in `swpout_clean`).
    pub pswpout_background: u64,
}

/// Builds a `uswap_stats` from an engine snapshot, each counter named once: `copied` are the
/// fields of both structs, copied as they are; `left_out` are the engine's fields the C struct
/// does not carry; `derived` are the C struct's own fields, computed from the copied ones.
/// Exhaustive on purpose: a counter added to the engine does not compile until it is listed
/// here (after adding it at the end of the struct) or named as left out, and a field added
/// to the struct does not compile until it is copied or derived.
macro_rules! from_stats {
    ($s:expr; copied: $($c:ident),* $(,)?; left_out: $($l:ident),* $(,)?; derived: $($d:ident: $v:expr),* $(,)?) => {{
        let Stats { $($c,)* $($l: _,)* } = $s;
        uswap_stats { $($c: *$c,)* $($d: $v,)* }
    }};
}

impl uswap_stats {
    /// The C struct for an engine snapshot, `size` set to the full size.
    pub(crate) fn from_engine(s: &Stats) -> uswap_stats {
        let page_size_bytes = engine::PAGE_SIZE as u64;
        from_stats!(s;
        copied:
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
            fault_error,
            lru_overflow,
            move_refused,
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
            remap_copied,
            limit_overrun_busy,
            cow_broken,
            swpout_neighbours,
            handler_retire,
            handler_backlog,
            handler_help,
            handler_steer,
            handler_spin_off,
            unmanaged_bytes,
            unmanaged_peak_bytes,
            syscall_prepared,
            syscall_efault_retried,
            syscall_efault,
            fault_event_wait_timeout,
            syscall_continued,
            syscall_async_kernel_access,
            pool_peak_bytes,
            reclaim_pinned,
            syscall_unpinned,
            shared_adopted,
            mlock_unhonoured,
            pgdeactivate,
            swpout_idle,
            writeback_idle,
            pgfault_aged,
            device_reads,
            device_read_us,
            device_writes,
            device_write_us,
            workingset_activate,
            staging_foreign_drops,
            gone_scan_pages,
            pswpout_background;
        left_out: devices, fault_latency_us, publish, stall, idle, bounce_wait_timeout;
        derived:
            pool_wait_timeout: s.bounce_wait_timeout,
            idle_1s_bytes: s.idle.idle_1s_bytes,
            idle_10s_bytes: s.idle.idle_10s_bytes,
            idle_60s_bytes: s.idle.idle_60s_bytes,
            idle_600s_bytes: s.idle.idle_600s_bytes,
            stall_us: (s.stall.seconds_total * 1e6) as u64,
            stall_avg10_centipercent: (s.stall.avg10 * 100.0).round() as u64,
            stall_avg60_centipercent: (s.stall.avg60 * 100.0).round() as u64,
            stall_avg300_centipercent: (s.stall.avg300 * 100.0).round() as u64,
            size: std::mem::size_of::<uswap_stats>() as u64,
            page_size_bytes: page_size_bytes,
            resident_bytes: resident_pages * page_size_bytes,
            limit_bytes: limit_pages * page_size_bytes,
        )
    }
}

/// Bytes of `uswap_stats` to fill for a caller that says its struct is `caller_size` bytes:
/// whole fields only, at most ours. `None` if not even `size` fits.
pub(crate) fn filled_bytes(caller_size: u64) -> Option<usize> {
    const FIELD: u64 = std::mem::size_of::<u64>() as u64;
    let ours = std::mem::size_of::<uswap_stats>() as u64;
    let n = caller_size.min(ours) / FIELD * FIELD;
    (n >= FIELD).then_some(n as usize)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_struct_is_all_u64_with_size_first() {
        assert_eq!(std::mem::offset_of!(uswap_stats, size), 0);
        assert_eq!(std::mem::size_of::<uswap_stats>() % 8, 0);
        assert_eq!(std::mem::align_of::<uswap_stats>(), 8);
    }

    #[test]
    fn filled_bytes_takes_whole_fields_up_to_the_smaller_size() {
        let ours = std::mem::size_of::<uswap_stats>();
        assert_eq!(filled_bytes(0), None);
        assert_eq!(filled_bytes(7), None);
        assert_eq!(filled_bytes(8), Some(8));
        assert_eq!(filled_bytes(20), Some(16));
        assert_eq!(filled_bytes(ours as u64), Some(ours));
        assert_eq!(filled_bytes(ours as u64 + 64), Some(ours), "a newer caller gets what we have");
    }

    #[test]
    fn bytes_and_pages_agree() {
        let s = Stats { resident_pages: 3, limit_pages: 5, pswpout: 7, ..Stats::default() };
        let c = uswap_stats::from_engine(&s);
        assert_eq!(c.resident_bytes, 3 * engine::PAGE_SIZE as u64);
        assert_eq!(c.limit_bytes, 5 * engine::PAGE_SIZE as u64);
        assert_eq!((c.pswpout, c.resident_pages, c.limit_pages), (7, 3, 5));
        assert_eq!(c.size as usize, std::mem::size_of::<uswap_stats>());
    }
}
