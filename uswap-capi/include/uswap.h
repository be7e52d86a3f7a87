/*
 * uswap: user-space swap. The C API of libuswap.so.
 *
 * Build:  cargo build --release -p uswap-capi   (target/release/libuswap.so)
 * Link:   cc -I uswap-capi/include prog.c -L target/release -luswap
 * Every fallible function returns 0 (USWAP_OK) or a negative USWAP_E* code;
 * uswap_last_error() then says what went wrong and what to do.
 * See docs/api.md, "C API", and uswap-capi/examples/example.c.
 */

#ifndef USWAP_H
#define USWAP_H

/* Generated from uswap-capi/src by cbindgen (uswap-capi/cbindgen.toml): do not edit. Regenerate with uswap-capi/gen-header.sh. */

#include <stddef.h>
#include <stdint.h>

/**
 * Status codes: what every fallible uswap function returns, as an `int`. 0 is success; every
 * failure is negative, and `uswap_last_error()` then tells what went wrong and what to do.
 * New codes may be added (with new negative values); treat an unknown negative value as a
 * failure and show `uswap_last_error()`.
 */
typedef enum uswap_status {
    /**
     * Success.
     */
    USWAP_OK = 0,
    /**
     * A bad argument: a null pointer, a handle that is unknown or already freed, a value out
     * of range, a device list that does not parse, a configuration the engine refuses.
     */
    USWAP_EINVAL = -1,
    /**
     * Not permitted to open a userfaultfd (see the message for the ways to grant it).
     */
    USWAP_EPERM = -2,
    /**
     * The kernel lacks userfaultfd or `UFFDIO_MOVE`: uswap needs Linux >= 6.8.
     */
    USWAP_ENOTSUP = -3,
    /**
     * Out of address space, or every region slot of the process is in use.
     */
    USWAP_ENOMEM = -4,
    /**
     * A swap device could not be opened, or failed.
     */
    USWAP_EDEVICE = -5,
    /**
     * The swap devices are full: a lower resident limit could not be reached. The new limit
     * is in place all the same.
     */
    USWAP_ENOSPC = -6,
    /**
     * Busy: the pager still has regions mapped (`uswap_pager_destroy`), or reclaim found
     * every page busy in other threads (`uswap_set_resident_limit`; the limit is in place).
     */
    USWAP_EBUSY = -7,
    /**
     * Signal mode cannot serve faults in this process or thread: SIGBUS is blocked, or its
     * handler was replaced after the first signal-mode pager was created, or the system-call
     * guard was asked for in a process with more than one thread.
     */
    USWAP_ESIGNAL = -8,
    /**
     * A system call failed (the message names it and the reason).
     */
    USWAP_EIO = -9,
    /**
     * A bug in uswap: it panicked inside the call. The panic was stopped at the boundary;
     * the object the call was given may be in an unknown state. Please report the message.
     */
    USWAP_EPANIC = -10,
} uswap_status;

/**
 * How faults on managed memory reach uswap; for `uswap_config_set_fault_mode`.
 */
typedef enum uswap_fault_mode {
    /**
     * Handler threads read the userfaultfd (the default). Faults raised inside system calls
     * (`read(2)` into a managed buffer) are served.
     */
    USWAP_FAULT_MODE_THREAD = 0,
    /**
     * The faulting thread serves its own fault in a SIGBUS handler: faster, with limits
     * (docs/fault-modes.md): system calls on pages that are not resident fail with
     * `EFAULT`, threads touching managed memory must not block SIGBUS and need 128 KiB of
     * stack, and a program's own SIGBUS handler must be installed before the first pager.
     */
    USWAP_FAULT_MODE_SIGNAL = 1,
} uswap_fault_mode;

/**
 * A pager configuration (opaque). Made by `uswap_config_new`, freed by `uswap_config_free`.
 */
typedef struct uswap_config uswap_config;

/**
 * A pager (opaque): a resident limit, swap devices and the threads that serve faults. Made
 * by `uswap_pager_new`, destroyed by `uswap_pager_destroy` once its regions are unmapped.
 */
typedef struct uswap_pager uswap_pager;

/**
 * A managed region (opaque). Made by `uswap_map`, freed by `uswap_unmap`.
 */
typedef struct uswap_region uswap_region;

/**
 * A snapshot of a pager's counters, filled by `uswap_get_stats`. Counter names follow
 * `/proc/vmstat` where the kernel has one. Fields are only ever added at the end.
 */
typedef struct uswap_stats {
    /**
     * Set to `sizeof(uswap_stats)` before calling `uswap_get_stats`; on return, the number of
     * bytes uswap filled (fields past it were left as they were).
     */
    uint64_t size;
    /**
     * The page size uswap works in, in bytes.
     */
    uint64_t page_size_bytes;
    /**
     * Bytes of application pages in RAM that count against the limit (`resident_pages` times
     * the page size).
     */
    uint64_t resident_bytes;
    /**
     * The resident limit in bytes (`limit_pages` times the page size).
     */
    uint64_t limit_bytes;
    /**
     * Faults served, all kinds.
     */
    uint64_t pgfault;
    /**
     * Zero-fill faults (page never touched, or known to be zero).
     */
    uint64_t pgfault_zero;
    /**
     * Never-touched pages mapped ahead by zero-fill faults of a sequential stream (fault-around);
     * they took no fault of their own.
     */
    uint64_t zero_fill_around;
    /**
     * Swap-cache hits: the page was staged in RAM and moved back without a copy.
     */
    uint64_t pgfault_swapcache;
    /**
     * Faults that read a device.
     */
    uint64_t pgmajfault;
    /**
     * Write-protect faults: the first write to a clean page (read back from a device and not
     * written since); its slot is freed.
     */
    uint64_t pgfault_wp;
    /**
     * Pages read from devices.
     */
    uint64_t pswpin;
    /**
     * Pages written to devices.
     */
    uint64_t pswpout;
    /**
     * Clean pages reclaim dropped without writing them: their slot still held them (those
     * the aging scan staged clean too, once writeback took them).
     */
    uint64_t swpout_clean;
    /**
     * Pages found all-zero at swap-out (kept as "known zero", no slot).
     */
    uint64_t swpout_zero;
    /**
     * Pages moved out of regions by the background reclaimer.
     */
    uint64_t pgsteal_background;
    /**
     * Pages moved out of regions by direct reclaim (in the faulting thread).
     */
    uint64_t pgsteal_direct;
    /**
     * Victims given a second chance because they had faulted back from the swap cache.
     */
    uint64_t pgactivate;
    /**
     * Allocations that had to reclaim directly because the limit was reached.
     */
    uint64_t allocstall;
    /**
     * Swap-outs that found no free slot: the page stayed resident, nothing was lost.
     */
    uint64_t swap_alloc_fail;
    /**
     * Charges that exceeded the limit because nothing could be reclaimed (devices full).
     */
    uint64_t limit_overrun;
    /**
     * Pages read ahead: read from a device and mapped along with the page that faulted.
     */
    uint64_t swap_ra;
    /**
     * Read-ahead pages the application used.
     */
    uint64_t swap_ra_hit;
    /**
     * Read-ahead pages evicted before they were known to be used.
     */
    uint64_t swap_ra_unused;
    /**
     * Pages whose asynchronous readahead was started (file devices).
     */
    uint64_t swap_ra_async_started;
    /**
     * Of those, pages mapped from the readahead buffer.
     */
    uint64_t swap_ra_async;
    /**
     * Of those, pages never mapped from the buffer.
     */
    uint64_t swap_ra_async_dropped;
    /**
     * Faults that found their asynchronous readahead still in flight and waited for it.
     */
    uint64_t swap_ra_async_wait;
    /**
     * Application `munmap`s over regions: those pages are gone, their swap space freed.
     */
    uint64_t uffd_unmap;
    /**
     * Application `mremap`s of regions.
     */
    uint64_t uffd_remap;
    /**
     * Application `MADV_DONTNEED`/`MADV_REMOVE` over regions: those pages read zero afterwards.
     */
    uint64_t uffd_remove;
    /**
     * Swap-cache hits on read-only (`mprotect`) memory, served by copying the staged page.
     */
    uint64_t pgfault_swapcache_copy;
    /**
     * Faults that found their page already resolved by a racing thread, or an event for
     * its range still to be applied (retried; nothing is lost).
     */
    uint64_t fault_raced;
    /**
     * Signal-mode faults served on the lock-free route (the thread held an engine lock).
     */
    uint64_t fault_lock_free;
    /**
     * Faults that waited longer than the bound for a busy page and failed (SIGBUS) instead of
     * hanging.
     */
    uint64_t fault_busy_timeout;
    /**
     * Fault-service attempts that failed (device read or checksum); the fault is attempted again.
     */
    uint64_t fault_error;
    /**
     * Resident pages the reclaim queue had no room for (found later by a scan).
     */
    uint64_t lru_overflow;
    /**
     * Pages `UFFDIO_MOVE` refused to move out (pinned or shared); they stayed resident.
     */
    uint64_t move_refused;
    /**
     * Device writes that failed; the pages stayed staged in RAM and are retried later.
     */
    uint64_t swpout_error;
    /**
     * Pages a device declined (pool full, incompressible) and another device took.
     */
    uint64_t swpout_spilled;
    /**
     * Pages moved from a device to the next tier (zswap's `zswpwb`).
     */
    uint64_t writeback;
    /**
     * Device reads whose data did not match the page's checksum (the page was not mapped).
     */
    uint64_t checksum_errors;
    /**
     * Slots that could not be freed and are never reused. Should stay 0.
     */
    uint64_t slots_leaked;
    /**
     * `UFFDIO_MOVE` calls that moved a page but reported failure (a Linux 6.18 bug the engine
     * works around). Informational.
     */
    uint64_t uffd_move_misreports;
    /**
     * Application pages in RAM that count against the limit: mapped plus staged.
     */
    uint64_t resident_pages;
    /**
     * Of those, pages staged in the swap cache (unmapped, contents in RAM).
     */
    uint64_t swapcache_pages;
    /**
     * Of the resident pages, clean ones: their slot still holds them (the kernel's `SwapCached`).
     */
    uint64_t clean_pages;
    /**
     * The resident limit, in pages.
     */
    uint64_t limit_pages;
    /**
     * The most pages that were resident at once since the pager started.
     */
    uint64_t resident_peak_pages;
    /**
     * Pages a partial `mremap` moved out of a region, copied into place.
     */
    uint64_t remap_copied;
    /**
     * Of `limit_overrun`, charges forced over the limit because every victim stayed busy.
     */
    uint64_t limit_overrun_busy;
    /**
     * Faults or take-outs that gave up waiting 10 s for a bounce buffer (should stay 0):
     * the engine's `bounce_wait_timeout`, under its former name, kept for the ABI.
     */
    uint64_t pool_wait_timeout;
    /**
     * Pages a fork child shared copy-on-write, made exclusive again (copied, as a write
     * would) so that reclaim could move them out.
     */
    uint64_t cow_broken;
    /**
     * Dirty resident pages that left with a victim next to them, in one run (one TLB flush
     * for the run).
     */
    uint64_t swpout_neighbours;
    /**
     * Thread mode: fault handlers that went dormant (see docs/fault-modes.md).
     */
    uint64_t handler_retire;
    /**
     * Thread mode: dormant handlers woken because one read 4 or more faults at once.
     */
    uint64_t handler_backlog;
    /**
     * Thread mode: dormant handlers woken to help while a stream's window was served.
     */
    uint64_t handler_help;
    /**
     * Thread mode: hand-overs to the handler pinned where the faulting thread last ran.
     */
    uint64_t handler_steer;
    /**
     * Thread mode: times a handler stopped spinning for its next fault for a while.
     */
    uint64_t handler_spin_off;
    /**
     * The process's anonymous memory that no pager manages, in bytes, as last measured
     * (`uswap run`'s library measures it every second; 0 when nothing measures it).
     */
    uint64_t unmanaged_bytes;
    /**
     * The most of it measured at once.
     */
    uint64_t unmanaged_peak_bytes;
    /**
     * Signal mode: system calls whose managed memory was made ready before the call.
     */
    uint64_t syscall_prepared;
    /**
     * Of those, calls that still failed with `EFAULT` and were made again.
     */
    uint64_t syscall_efault_retried;
    /**
     * Calls on managed memory whose `EFAULT` reached the program. Should stay 0.
     */
    uint64_t syscall_efault;
    /**
     * Waits past the bound for read events to be applied: signal-mode faults and system
     * calls, new regions, and the program's unmaps under `uswap run`. Should stay 0.
     */
    uint64_t fault_event_wait_timeout;
    /**
     * Signal mode: transfers that stopped short at a page reclaim took out during the
     * call, continued for the rest.
     */
    uint64_t syscall_continued;
    /**
     * Signal mode: calls that set up memory the kernel touches on its own later (io_uring,
     * AIO, KVM guest RAM in managed memory). Such programs belong in thread mode.
     */
    uint64_t syscall_async_kernel_access;
    /**
     * The most memory the in-RAM compressed pools held at once, in bytes.
     */
    uint64_t pool_peak_bytes;
    /**
     * Victims reclaim left resident because a system call in signal mode had pinned them.
     */
    uint64_t reclaim_pinned;
    /**
     * Signal mode: calls whose memory was brought in unpinned (every pin slot taken).
     */
    uint64_t syscall_unpinned;
    /**
     * Pages a fork child inherited and came to map alone (its parent wrote them or moved
     * them out), charged to the child from then on.
     */
    uint64_t shared_adopted;
    /**
     * Locks of managed memory (mlock) that could not be recorded: their pages may be swapped out.
     */
    uint64_t mlock_unhonoured;
    /**
     * Microseconds during which some thread of the application stalled on memory (a
     * swap-in, a page on its way out, room under the limit): PSI's *some* total.
     */
    uint64_t stall_us;
    /**
     * The share of wall time some thread stalled, running averages over 10 s, 60 s and
     * 300 s, in hundredths of a percent (PSI's avg10, avg60, avg300).
     */
    uint64_t stall_avg10_centipercent;
    uint64_t stall_avg60_centipercent;
    uint64_t stall_avg300_centipercent;
    /**
     * Resident pages the aging scan moved to the swap cache to see whether they are still
     * used.
     */
    uint64_t pgdeactivate;
    /**
     * Staged pages sent out because they had been idle for the idle age: written to a
     * device, or, staged clean, dropped (counted in `swpout_clean` too).
     */
    uint64_t swpout_idle;
    /**
     * Pages moved down a tier because they had been idle there for the idle age.
     */
    uint64_t writeback_idle;
    /**
     * Swap-cache hits on pages the aging scan staged: pages found still in use.
     */
    uint64_t pgfault_aged;
    /**
     * Bytes of managed memory untouched for at least 1 s, 10 s, 60 s and 600 s (pages out
     * of their regions since then; see `uswap_config_set_idle_age`).
     */
    uint64_t idle_1s_bytes;
    uint64_t idle_10s_bytes;
    uint64_t idle_60s_bytes;
    uint64_t idle_600s_bytes;
    /**
     * Device read calls (swap-ins and tier writeback) and the time they took, in
     * microseconds: `device_read_us / pgmajfault` is the device's share of a major fault.
     */
    uint64_t device_reads;
    uint64_t device_read_us;
    /**
     * Device write calls (swap-outs and tier writeback) and the time they took.
     */
    uint64_t device_writes;
    uint64_t device_write_us;
    /**
     * Pages read back from a device soon enough after they left to count as part of the
     * working set (their refault distance within the pages on the LRU): spared once by
     * reclaim (a clean one once it has been written).
     */
    uint64_t workingset_activate;
    /**
     * Times a move into a staging area found pages the program had mapped there by reading
     * them and dropped them before it went on. Informational.
     */
    uint64_t staging_foreign_drops;
    /**
     * Page-table words read to find which pages of a region are still its own, once some
     * were unmapped (a fork, a region's release). Informational.
     */
    uint64_t gone_scan_pages;
    /**
     * Pages the background reclaimer sent out for the faults that moved them out (a zstd
     * pool first: the faults move, the background thread compresses): written (also in
     * `pswpout`), or, staged clean by the aging scan, dropped (also in `swpout_clean`).
     */
    uint64_t pswpout_background;
} uswap_stats;

#ifdef __cplusplus
extern "C" {
#endif // __cplusplus

/**
 * The message of the most recent failed uswap call on the calling thread: what went wrong
 * and what to do about it. Never NULL; an empty string if no call on this thread has failed.
 * Successful calls leave it as it is (like `errno`). The string stays valid until the next
 * failing uswap call on the same thread; copy it to keep it longer.
 */
const char *uswap_last_error(void);

/**
 * A fixed description of a status code (`USWAP_OK`, `USWAP_EINVAL`, ...), or "unknown uswap
 * status code". Never NULL; the string is static. `uswap_last_error()` says more about a
 * particular failure.
 */
const char *uswap_strerror(int code);

/**
 * Makes a configuration with the defaults: thread fault mode, one handler thread per CPU,
 * readahead on, and no resident limit or devices (both must be set before
 * `uswap_pager_new`). Stores its handle in `*config_out` (NULL on failure).
 *
 * Errors: `USWAP_EINVAL` if `config_out` is NULL.
 *
 * # Safety
 *
 * `config_out` must be NULL or valid for writing one pointer.
 */
int uswap_config_new(struct uswap_config **config_out);

/**
 * Frees a configuration. Pagers made from it are not affected. Afterwards the handle is
 * refused (`USWAP_EINVAL`) by every function.
 *
 * Errors: `USWAP_EINVAL` if `config` is NULL or not a live configuration.
 */
int uswap_config_free(struct uswap_config *config);

/**
 * Sets the resident limit: bytes of application pages the pager keeps in RAM (mapped plus
 * staged in its swap cache). Required.
 *
 * Errors: `USWAP_EINVAL` if `config` is NULL or not live, or `limit_bytes` is below the
 * minimum (256 pages, 1 MiB with 4 KiB pages) or above the maximum (1 PiB, more than any
 * machine's memory); the message gives the bound.
 */
int uswap_config_set_resident_limit(struct uswap_config *config, uint64_t limit_bytes);

/**
 * Sets the swap devices from a device list, the syntax of `uswap bench --device`:
 * comma-separated devices, highest priority first, each `ram[:SIZE]`,
 * `zpool[:SIZE][:lz4|zstd|zstd-LEVEL][:raw|reject][:unit=SIZE][:dict]`, `file:PATH[:SIZE]`,
 * `redis://HOST:PORT[;HOST:PORT...][?OPTIONS]` or `redis-cluster://...` (docs/devices.md),
 * any of them ending in `:cluster` for cluster readahead. Sizes take `KiB`, `MiB`, `GiB`,
 * `TiB` (or `K`, `M`, `G`, `T`) or plain bytes; a device given without a size gets
 * `default_capacity_bytes`. A `zpool`'s SIZE is the memory its compressed pages may take;
 * it holds up to four times that of pages, or `default_capacity_bytes` of them where that
 * is more (pages that compress well). Example: `"zpool:64MiB,file:/var/tmp:4GiB"`.
 * Replaces any list set before. Required.
 *
 * Errors: `USWAP_EINVAL` if an argument is NULL, `config` is not live, or the list does not
 * parse or cannot work (the message names the bad device and why: an option given twice,
 * a zstd level out of 1..=22, a pool larger than one pool can index). Devices are opened, and so their paths
 * and sizes checked, by `uswap_pager_new`.
 *
 * # Safety
 *
 * `devices` must be NULL or a NUL-terminated string, readable for the duration of the call.
 */
int uswap_config_set_devices(struct uswap_config *config,
                             const char *devices,
                             uint64_t default_capacity_bytes);

/**
 * Sets the fault mode: `USWAP_FAULT_MODE_THREAD` (the default) or `USWAP_FAULT_MODE_SIGNAL`
 * (a `uswap_fault_mode` value, passed as an `int`).
 *
 * Errors: `USWAP_EINVAL` if `config` is NULL or not live, or `mode` is neither value.
 */
int uswap_config_set_fault_mode(struct uswap_config *config, int mode);

/**
 * Thread mode: the number of fault-handler threads (default: one per CPU the process may
 * run on, each pinned to its CPU). Ignored in signal mode.
 *
 * Errors: `USWAP_EINVAL` if `config` is NULL or not live, or `nr_threads` is 0 or more than
 * 1024.
 */
int uswap_config_set_handler_threads(struct uswap_config *config, uint32_t nr_threads);

/**
 * Readahead on swap-in: 1 on (the default), 0 off.
 *
 * Errors: `USWAP_EINVAL` if `config` is NULL or not live, or `enabled` is neither 0 nor 1.
 */
int uswap_config_set_readahead(struct uswap_config *config, int enabled);

/**
 * Signal mode's system-call guard: 1 routes the C library's system calls through uswap, so
 * that a `read`, `recv` or `write` on managed memory that is out brings it in first instead
 * of failing with `EFAULT` (a datagram lost); 0 off (the default). The C library's code is
 * rewritten once per process, when the first pager asking for it is made, which must be
 * while the process has one thread (at the start of `main`); `uswap_pager_new` fails with
 * `USWAP_ESIGNAL` otherwise. Ignored in thread mode (docs/fault-modes.md).
 *
 * Errors: `USWAP_EINVAL` if `config` is NULL or not live, or `enabled` is neither 0 nor 1.
 */
int uswap_config_set_syscall_guard(struct uswap_config *config, int enabled);

/**
 * An automatic budget: the pager moves its resident limit by itself to the smallest that
 * keeps the application's memory stalls under `target_share` of wall time (0.01 for 1 %,
 * the default of `uswap run --auto`); the resident limit set is the ceiling and where it
 * starts. `uswap_stats`' `limit_bytes` says where it is now, and `stall_us` and the
 * `stall_avg*` fields what it runs on. 0 turns it off (the default).
 *
 * Errors: `USWAP_EINVAL` if `config` is NULL or not live, or `target_share` is not 0 and not
 * in (0, 0.5].
 */
int uswap_config_set_auto_budget(struct uswap_config *config, double target_share);

/**
 * Idle aging: the pager moves resident pages to its swap cache a few at a time to see
 * which the application still touches; a page left alone for `seconds` is written to the
 * first device without waiting for the limit, and one left alone as long again on a
 * device with a tier below goes down a tier. `INFINITY` looks without sending anything
 * out for its age (reclaim then takes the longest idle first); 0 turns it off (the
 * default, or looking only, with an automatic budget). `uswap_stats`' `idle_*_bytes`
 * say how much memory has been untouched for 1 s, 10 s, 1 min and 10 min.
 *
 * Errors: `USWAP_EINVAL` if `config` is NULL or not live, or `seconds` is not 0,
 * `INFINITY` or from 1 to a year (31,536,000).
 */
int uswap_config_set_idle_age(struct uswap_config *config, double seconds);

/**
 * How long a page stays out of RAM untouched before the background reclaimer moves it
 * down a tier, off the fault path: from a device to one of lower priority (the next in
 * `uswap_config_set_devices`' list), such as an lz4 pool's page recompressed into the zstd
 * pool below it (`"zpool,zpool:zstd-1"`), or a pool's page written to a file device after
 * it. Works with any idle age, 0 included. 0 (the default) leaves it to the idle age: twice
 * an idle age that sends pages out, never otherwise.
 *
 * Errors: `USWAP_EINVAL` if `config` is NULL or not live, or `seconds` is not 0 or from 1 to
 * a year (31,536,000); `uswap_pager_new` then fails with `USWAP_EINVAL` if the devices have
 * no tier below the first.
 */
int uswap_config_set_tier_age(struct uswap_config *config, double seconds);

/**
 * Creates a pager from a configuration (which stays the caller's: it may be changed or freed
 * afterwards without affecting the pager). Stores its handle in `*pager_out` (NULL on
 * failure). This opens the userfaultfd and the swap devices and starts the pager's threads.
 *
 * Signal mode: call it from a thread that does not block SIGBUS, after installing any SIGBUS
 * handler of the program's own (uswap passes it every SIGBUS that is not for managed memory).
 *
 * Errors: `USWAP_EINVAL` (NULL argument, configuration not live, no resident limit or no
 * devices set, a device too small, a process that `uswap run`'s library pages), `USWAP_EPERM` (no permission to open a userfaultfd),
 * `USWAP_ENOTSUP` (kernel too old), `USWAP_EDEVICE` (a device could not be opened),
 * `USWAP_ENOMEM`, `USWAP_ESIGNAL`, `USWAP_EIO`.
 *
 * # Safety
 *
 * `pager_out` must be NULL or valid for writing one pointer.
 */
int uswap_pager_new(const struct uswap_config *config,
                    struct uswap_pager **pager_out);

/**
 * Destroys a pager: stops its threads and releases its devices (a regular file given as a
 * device is emptied here, so a program that exits without destroying its pagers leaves
 * swapped pages in such a file). Refuses, with `USWAP_EBUSY` and the pager left as it was,
 * while any region of the pager is still mapped: unmap each with `uswap_unmap` first. A
 * call on the pager already running in another thread completes, and the pager is
 * released when it returns; but a `uswap_map` that finishes after the destroy gives its new
 * region back and fails with `USWAP_EINVAL`. Afterwards the handle is refused
 * (`USWAP_EINVAL`) by every function. In a fork child, `uswap_map`, `uswap_get_stats` and
 * `uswap_set_resident_limit` on a pager inherited from the parent fail with
 * `USWAP_EINVAL`, and `uswap_unmap` and `uswap_pager_destroy` forget the handle without
 * touching the parent's memory or devices.
 *
 * Errors: `USWAP_EINVAL` if `pager` is NULL or not live, `USWAP_EBUSY` as above.
 */
int uswap_pager_destroy(struct uswap_pager *pager);

/**
 * Changes the resident limit. A lower limit takes effect at once: the call reclaims down to
 * it before returning. With an automatic budget (`uswap_config_set_auto_budget`) the limit
 * given is the budget's new ceiling: the budget moves the limit under it from then on.
 *
 * Errors: `USWAP_EINVAL` (NULL or dead `pager`, limit below the minimum or above the
 * maximum of `uswap_config_set_resident_limit`; nothing changed),
 * `USWAP_ENOSPC` (the devices are full; the new limit is in place), `USWAP_EBUSY` (every
 * page reclaim found was busy for 2 s; the new limit is in place, call again later).
 */
int uswap_set_resident_limit(struct uswap_pager *pager, uint64_t limit_bytes);

/**
 * Reads the pager's counters into `*stats`. Set `stats->size = sizeof(uswap_stats)` first:
 * uswap fills that many bytes (whole fields, at most its own size) and writes back in
 * `stats->size` how many it filled, so programs built against an older or newer header
 * work with this library.
 *
 * Errors: `USWAP_EINVAL` if an argument is NULL, `pager` is not live, `stats` is not aligned
 * for `uint64_t`, `stats->size` is below 8, or this process is a fork child of the one that
 * made the pager.
 *
 * # Safety
 *
 * `stats` must be NULL or point to memory readable and writable for `stats->size` bytes.
 */
int uswap_get_stats(struct uswap_pager *pager, struct uswap_stats *stats);

/**
 * Maps a managed region of `len_bytes` (rounded up to whole pages), zero-filled and
 * page-aligned, and stores its handle in `*region_out` (NULL on failure). Its memory
 * (`uswap_region_addr`, `uswap_region_len`) may be read and written by any thread until
 * `uswap_unmap`; pages come back from swap on first touch.
 *
 * Errors: `USWAP_EINVAL` (NULL argument, `pager` not live, `len_bytes` 0 or above the
 * maximum region size), `USWAP_ENOMEM` (out of address space or region slots),
 * `USWAP_ESIGNAL` (signal mode: the SIGBUS handler was replaced), `USWAP_EIO`.
 *
 * # Safety
 *
 * `region_out` must be NULL or valid for writing one pointer.
 */
int uswap_map(struct uswap_pager *pager, size_t len_bytes, struct uswap_region **region_out);

/**
 * Unmaps a region: its memory is unmapped as by `munmap` (the addresses may be reused by
 * later mappings) and every swap slot and cache page it held is freed. Afterwards the handle
 * is refused (`USWAP_EINVAL`) by every function. Stop every thread's use of the memory
 * first.
 *
 * Errors: `USWAP_EINVAL` if `region` is NULL or not live.
 */
int uswap_unmap(struct uswap_region *region);

/**
 * Stores the address of the region's first byte in `*addr_out`. It is fixed for the life
 * of the region (unless the program moves it with `mremap`, which uswap follows).
 *
 * Errors: `USWAP_EINVAL` if an argument is NULL or `region` is not live.
 *
 * # Safety
 *
 * `addr_out` must be NULL or valid for writing one pointer.
 */
int uswap_region_addr(const struct uswap_region *region, void **addr_out);

/**
 * Stores the region's length in bytes (a whole number of pages) in `*len_bytes_out`.
 *
 * Errors: `USWAP_EINVAL` if an argument is NULL or `region` is not live.
 *
 * # Safety
 *
 * `len_bytes_out` must be NULL or valid for writing one `size_t`.
 */
int uswap_region_len(const struct uswap_region *region, size_t *len_bytes_out);

#ifdef __cplusplus
}  // extern "C"
#endif  // __cplusplus

#endif  /* USWAP_H */
