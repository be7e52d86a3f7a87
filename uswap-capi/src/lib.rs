//! The C ABI of uswap: `libuswap.so` and `include/uswap.h` (generated from this crate by
//! cbindgen; `gen-header.sh` regenerates it, a test checks it is current).
//!
//! The API is handles and status codes. A configuration (`uswap_config`) is filled in and
//! given to `uswap_pager_new`; the pager (`uswap_pager`) maps regions (`uswap_region`) whose
//! memory C uses directly. Every fallible function returns an `int`: 0 (`USWAP_OK`) or a
//! negative `USWAP_E*` code, with `uswap_last_error()` describing the failure. Handles are
//! table keys, never dereferenced (see `handles`), so a stale, NULL or wrong-kind handle is
//! `USWAP_EINVAL`, not a crash. No panic crosses the boundary (see `status::guard`).
//!
//! Locking: only the handle tables' mutexes, never held across engine work. Calls are not
//! async-signal-safe (they take those mutexes and allocate); the memory of a region is, like
//! any memory. Invariant: a pager is destroyed only once no region of it is mapped.

#![deny(unsafe_op_in_unsafe_fn)]

mod handles;
mod stats;
mod status;

use std::ffi::{c_char, c_int, c_void, CStr};

use engine::{DeviceConfig, FaultMode, Pager, PagerBuilder, Region};

use crate::handles::{id_of, to_handle, Table};
pub use crate::stats::uswap_stats;
pub use crate::status::uswap_status;
use crate::status::{guard, Failure};

/// How faults on managed memory reach uswap; for `uswap_config_set_fault_mode`.
#[allow(non_camel_case_types)]
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum uswap_fault_mode {
    /// Handler threads read the userfaultfd (the default). Faults raised inside system calls
    /// (`read(2)` into a managed buffer) are served.
    USWAP_FAULT_MODE_THREAD = 0,
    /// The faulting thread serves its own fault in a SIGBUS handler: faster, with limits
    /// (docs/fault-modes.md): system calls on pages that are not resident fail with
    /// `EFAULT`, threads touching managed memory must not block SIGBUS and need 128 KiB of
    /// stack, and a program's own SIGBUS handler must be installed before the first pager.
    USWAP_FAULT_MODE_SIGNAL = 1,
}

/// A pager configuration (opaque). Made by `uswap_config_new`, freed by `uswap_config_free`.
#[allow(non_camel_case_types)]
pub struct uswap_config {
    _opaque: [u8; 0],
}

/// A pager (opaque): a resident limit, swap devices and the threads that serve faults. Made
/// by `uswap_pager_new`, destroyed by `uswap_pager_destroy` once its regions are unmapped.
#[allow(non_camel_case_types)]
pub struct uswap_pager {
    _opaque: [u8; 0],
}

/// A managed region (opaque). Made by `uswap_map`, freed by `uswap_unmap`.
#[allow(non_camel_case_types)]
pub struct uswap_region {
    _opaque: [u8; 0],
}

/// What a configuration holds until a pager is made from it.
#[derive(Debug, Clone)]
struct Settings {
    limit_bytes: Option<u64>,
    devices: Option<Vec<DeviceConfig>>,
    mode: FaultMode,
    handler_threads: Option<usize>,
    readahead: bool,
    syscall_guard: bool,
    auto_target: Option<f64>,
    idle_aging: engine::IdleAging,
    tier_age: Option<std::time::Duration>,
}

struct RegionEntry {
    region: Region,
    pager_id: usize,
}

static CONFIGS: Table<std::sync::Mutex<Settings>> = Table::new("configuration");
static PAGERS: Table<Pager> = Table::new("pager");
static REGIONS: Table<RegionEntry> = Table::new("region");

/// Stores a handle in `*out`, which the caller checked is not NULL.
///
/// # Safety
///
/// `out` must be valid for a write of one pointer.
unsafe fn put<T>(out: *mut *mut T, handle: *mut T) {
    // SAFETY: the caller's contract.
    unsafe { out.write_unaligned(handle) }
}

/// Fails unless `p` is non-NULL; `what` names the argument in the message.
fn non_null<T>(p: *const T, function: &str, what: &str) -> Result<(), Failure> {
    if p.is_null() {
        return Err(Failure::null(function, what));
    }
    Ok(())
}

fn with_settings(
    config: *mut uswap_config,
    function: &str,
    change: impl FnOnce(&mut Settings) -> Result<(), Failure>,
) -> Result<(), Failure> {
    let entry = CONFIGS.get(id_of(config), function, "config")?;
    let mut settings = entry.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    change(&mut settings)
}

// ---------------------------------------------------------------------------------------
// Errors
// ---------------------------------------------------------------------------------------

/// The message of the most recent failed uswap call on the calling thread: what went wrong
/// and what to do about it. Never NULL; an empty string if no call on this thread has failed.
/// Successful calls leave it as it is (like `errno`). The string stays valid until the next
/// failing uswap call on the same thread; copy it to keep it longer.
#[no_mangle]
pub extern "C" fn uswap_last_error() -> *const c_char {
    status::last_error_ptr()
}

/// A fixed description of a status code (`USWAP_OK`, `USWAP_EINVAL`, ...), or "unknown uswap
/// status code". Never NULL; the string is static. `uswap_last_error()` says more about a
/// particular failure.
#[no_mangle]
pub extern "C" fn uswap_strerror(code: c_int) -> *const c_char {
    status::describe(code).as_ptr()
}

// ---------------------------------------------------------------------------------------
// Configuration
// ---------------------------------------------------------------------------------------

/// Makes a configuration with the defaults: thread fault mode, one handler thread per CPU,
/// readahead on, and no resident limit or devices (both must be set before
/// `uswap_pager_new`). Stores its handle in `*config_out` (NULL on failure).
///
/// Errors: `USWAP_EINVAL` if `config_out` is NULL.
///
/// # Safety
///
/// `config_out` must be NULL or valid for writing one pointer.
#[no_mangle]
pub unsafe extern "C" fn uswap_config_new(config_out: *mut *mut uswap_config) -> c_int {
    guard(|| {
        non_null(config_out, "uswap_config_new", "config_out")?;
        let id = CONFIGS.insert(std::sync::Mutex::new(Settings {
            limit_bytes: None,
            devices: None,
            mode: FaultMode::Thread,
            handler_threads: None,
            readahead: true,
            syscall_guard: false,
            auto_target: None,
            idle_aging: engine::IdleAging::Off,
            tier_age: None,
        }));
        // SAFETY: checked non-NULL above; the caller's contract makes it writable.
        unsafe { put(config_out, to_handle(id)) };
        Ok(())
    })
}

/// Frees a configuration. Pagers made from it are not affected. Afterwards the handle is
/// refused (`USWAP_EINVAL`) by every function.
///
/// Errors: `USWAP_EINVAL` if `config` is NULL or not a live configuration.
#[no_mangle]
pub extern "C" fn uswap_config_free(config: *mut uswap_config) -> c_int {
    guard(|| {
        let id = id_of(config);
        CONFIGS.check(id, "uswap_config_free", "config")?;
        let removed = CONFIGS.lock().remove(&id);
        removed.map(drop).ok_or_else(|| CONFIGS.unknown(id, "uswap_config_free", "config"))
    })
}

/// Sets the resident limit: bytes of application pages the pager keeps in RAM (mapped plus
/// staged in its swap cache). Required.
///
/// Errors: `USWAP_EINVAL` if `config` is NULL or not live, or `limit_bytes` is below the
/// minimum (256 pages, 1 MiB with 4 KiB pages) or above the maximum (1 PiB, more than any
/// machine's memory); the message gives the bound.
#[no_mangle]
pub extern "C" fn uswap_config_set_resident_limit(config: *mut uswap_config, limit_bytes: u64) -> c_int {
    guard(|| {
        with_settings(config, "uswap_config_set_resident_limit", |s| {
            engine::check_limit(limit_bytes)?;
            s.limit_bytes = Some(limit_bytes);
            Ok(())
        })
    })
}

/// Sets the swap devices from a device list, the syntax of `uswap bench --device`:
/// comma-separated devices, highest priority first, each `ram[:SIZE]`,
/// `zpool[:SIZE][:lz4|zstd|zstd-LEVEL][:raw|reject][:unit=SIZE][:dict]`, `file:PATH[:SIZE]`,
/// `redis://HOST:PORT[;HOST:PORT...][?OPTIONS]` or `redis-cluster://...` (docs/devices.md),
/// any of them ending in `:cluster` for cluster readahead. Sizes take `KiB`, `MiB`, `GiB`,
/// `TiB` (or `K`, `M`, `G`, `T`) or plain bytes; a device given without a size gets
/// `default_capacity_bytes`. A `zpool`'s SIZE is the memory its compressed pages may take;
/// it holds up to four times that of pages, or `default_capacity_bytes` of them where that
/// is more (pages that compress well). Example: `"zpool:64MiB,file:/var/tmp:4GiB"`.
/// Replaces any list set before. Required.
///
/// Errors: `USWAP_EINVAL` if an argument is NULL, `config` is not live, or the list does not
/// parse or cannot work (the message names the bad device and why: an option given twice,
/// a zstd level out of 1..=22, a pool larger than one pool can index). Devices are opened, and so their paths
/// and sizes checked, by `uswap_pager_new`.
///
/// # Safety
///
/// `devices` must be NULL or a NUL-terminated string, readable for the duration of the call.
#[no_mangle]
pub unsafe extern "C" fn uswap_config_set_devices(
    config: *mut uswap_config,
    devices: *const c_char,
    default_capacity_bytes: u64,
) -> c_int {
    guard(|| {
        const FUNCTION: &str = "uswap_config_set_devices";
        CONFIGS.check(id_of(config), FUNCTION, "config")?;
        non_null(devices, FUNCTION, "devices")?;
        // SAFETY: non-NULL (checked), NUL-terminated and readable by the caller's contract;
        // the CStr is used only within this call.
        let spec = unsafe { CStr::from_ptr(devices) };
        let spec =
            spec.to_str().map_err(|e| Failure::invalid(format!("{FUNCTION}: the device list is not UTF-8 ({e})")))?;
        let list = DeviceConfig::parse_list(spec, default_capacity_bytes)?;
        with_settings(config, FUNCTION, |s| {
            s.devices = Some(list);
            Ok(())
        })
    })
}

/// Sets the fault mode: `USWAP_FAULT_MODE_THREAD` (the default) or `USWAP_FAULT_MODE_SIGNAL`
/// (a `uswap_fault_mode` value, passed as an `int`).
///
/// Errors: `USWAP_EINVAL` if `config` is NULL or not live, or `mode` is neither value.
#[no_mangle]
pub extern "C" fn uswap_config_set_fault_mode(config: *mut uswap_config, mode: c_int) -> c_int {
    guard(|| {
        let mode = match mode {
            m if m == uswap_fault_mode::USWAP_FAULT_MODE_THREAD as c_int => FaultMode::Thread,
            m if m == uswap_fault_mode::USWAP_FAULT_MODE_SIGNAL as c_int => FaultMode::Signal,
            other => {
                return Err(Failure::invalid(format!(
                    "uswap_config_set_fault_mode: mode {other} is not a fault mode; pass USWAP_FAULT_MODE_THREAD \
                     (0) or USWAP_FAULT_MODE_SIGNAL (1)"
                )))
            }
        };
        with_settings(config, "uswap_config_set_fault_mode", |s| {
            s.mode = mode;
            Ok(())
        })
    })
}

/// Thread mode: the number of fault-handler threads (default: one per CPU the process may
/// run on, each pinned to its CPU). Ignored in signal mode.
///
/// Errors: `USWAP_EINVAL` if `config` is NULL or not live, or `nr_threads` is 0 or more than
/// 1024.
#[no_mangle]
pub extern "C" fn uswap_config_set_handler_threads(config: *mut uswap_config, nr_threads: u32) -> c_int {
    guard(|| {
        if nr_threads == 0 {
            return Err(Failure::invalid(
                "uswap_config_set_handler_threads: 0 handler threads cannot serve faults; pass at least 1, or do \
                 not call it for one per CPU",
            ));
        }
        if nr_threads as usize > engine::MAX_HANDLER_THREADS {
            return Err(Failure::invalid(format!(
                "uswap_config_set_handler_threads: {nr_threads} handler threads; a pager starts at most {}, pass \
                 fewer, or do not call it for one per CPU",
                engine::MAX_HANDLER_THREADS
            )));
        }
        with_settings(config, "uswap_config_set_handler_threads", |s| {
            s.handler_threads = Some(nr_threads as usize);
            Ok(())
        })
    })
}

/// A C flag: 1 on, 0 off, anything else refused naming `function`.
fn on_or_off(enabled: c_int, function: &str) -> Result<bool, Failure> {
    match enabled {
        0 => Ok(false),
        1 => Ok(true),
        other => Err(Failure::invalid(format!("{function}: enabled is {other}; pass 1 (on) or 0 (off)"))),
    }
}

/// Readahead on swap-in: 1 on (the default), 0 off.
///
/// Errors: `USWAP_EINVAL` if `config` is NULL or not live, or `enabled` is neither 0 nor 1.
#[no_mangle]
pub extern "C" fn uswap_config_set_readahead(config: *mut uswap_config, enabled: c_int) -> c_int {
    guard(|| {
        let on = on_or_off(enabled, "uswap_config_set_readahead")?;
        with_settings(config, "uswap_config_set_readahead", |s| {
            s.readahead = on;
            Ok(())
        })
    })
}

/// Signal mode's system-call guard: 1 routes the C library's system calls through uswap, so
/// that a `read`, `recv` or `write` on managed memory that is out brings it in first instead
/// of failing with `EFAULT` (a datagram lost); 0 off (the default). The C library's code is
/// rewritten once per process, when the first pager asking for it is made, which must be
/// while the process has one thread (at the start of `main`); `uswap_pager_new` fails with
/// `USWAP_ESIGNAL` otherwise. Ignored in thread mode (docs/fault-modes.md).
///
/// Errors: `USWAP_EINVAL` if `config` is NULL or not live, or `enabled` is neither 0 nor 1.
#[no_mangle]
pub extern "C" fn uswap_config_set_syscall_guard(config: *mut uswap_config, enabled: c_int) -> c_int {
    guard(|| {
        let on = on_or_off(enabled, "uswap_config_set_syscall_guard")?;
        with_settings(config, "uswap_config_set_syscall_guard", |s| {
            s.syscall_guard = on;
            Ok(())
        })
    })
}

/// An automatic budget: the pager moves its resident limit by itself to the smallest that
/// keeps the application's memory stalls under `target_share` of wall time (0.01 for 1 %,
/// the default of `uswap run --auto`); the resident limit set is the ceiling and where it
/// starts. `uswap_stats`' `limit_bytes` says where it is now, and `stall_us` and the
/// `stall_avg*` fields what it runs on. 0 turns it off (the default).
///
/// Errors: `USWAP_EINVAL` if `config` is NULL or not live, or `target_share` is not 0 and not
/// in (0, 0.5].
#[no_mangle]
pub extern "C" fn uswap_config_set_auto_budget(config: *mut uswap_config, target_share: f64) -> c_int {
    guard(|| {
        if target_share != 0.0 && !(target_share > 0.0 && target_share <= 0.5) {
            return Err(Failure::invalid(format!(
                "uswap_config_set_auto_budget: a target of {target_share} is not a share of wall time; pass one in \
                 (0, 0.5], such as 0.01 for 1 %, or 0 to turn it off"
            )));
        }
        with_settings(config, "uswap_config_set_auto_budget", |s| {
            s.auto_target = (target_share != 0.0).then_some(target_share);
            Ok(())
        })
    })
}

/// Idle aging: the pager moves resident pages to its swap cache a few at a time to see
/// which the application still touches; a page left alone for `seconds` is written to the
/// first device without waiting for the limit, and one left alone as long again on a
/// device with a tier below goes down a tier. `INFINITY` looks without sending anything
/// out for its age (reclaim then takes the longest idle first); 0 turns it off (the
/// default, or looking only, with an automatic budget). `uswap_stats`' `idle_*_bytes`
/// say how much memory has been untouched for 1 s, 10 s, 1 min and 10 min.
///
/// Errors: `USWAP_EINVAL` if `config` is NULL or not live, or `seconds` is not 0,
/// `INFINITY` or from 1 to a year (31,536,000).
#[no_mangle]
pub extern "C" fn uswap_config_set_idle_age(config: *mut uswap_config, seconds: f64) -> c_int {
    guard(|| {
        let Some(aging) = engine::IdleAging::from_secs(seconds) else {
            return Err(Failure::invalid(format!(
                "uswap_config_set_idle_age: an idle age of {seconds} s is not one uswap evicts at; pass 1 to \
                 31536000 (a year), INFINITY to look without evicting, or 0 to turn it off"
            )));
        };
        with_settings(config, "uswap_config_set_idle_age", |s| {
            s.idle_aging = aging;
            Ok(())
        })
    })
}

/// How long a page stays out of RAM untouched before the background reclaimer moves it
/// down a tier, off the fault path: from a device to one of lower priority (the next in
/// `uswap_config_set_devices`' list), such as an lz4 pool's page recompressed into the zstd
/// pool below it (`"zpool,zpool:zstd-1"`), or a pool's page written to a file device after
/// it. Works with any idle age, 0 included. 0 (the default) leaves it to the idle age: twice
/// an idle age that sends pages out, never otherwise.
///
/// Errors: `USWAP_EINVAL` if `config` is NULL or not live, or `seconds` is not 0 or from 1 to
/// a year (31,536,000); `uswap_pager_new` then fails with `USWAP_EINVAL` if the devices have
/// no tier below the first.
#[no_mangle]
pub extern "C" fn uswap_config_set_tier_age(config: *mut uswap_config, seconds: f64) -> c_int {
    guard(|| {
        let age = match seconds {
            0.0 => None,
            s => Some(engine::tier_age_from_secs(s).ok_or_else(|| {
                Failure::invalid(format!(
                    "uswap_config_set_tier_age: a tier age of {seconds} s is out of range; pass 1 to 31536000 \
                     (a year), or 0 for the default"
                ))
            })?),
        };
        with_settings(config, "uswap_config_set_tier_age", |s| {
            s.tier_age = age;
            Ok(())
        })
    })
}

// ---------------------------------------------------------------------------------------
// Pager
// ---------------------------------------------------------------------------------------

/// Creates a pager from a configuration (which stays the caller's: it may be changed or freed
/// afterwards without affecting the pager). Stores its handle in `*pager_out` (NULL on
/// failure). This opens the userfaultfd and the swap devices and starts the pager's threads.
///
/// Signal mode: call it from a thread that does not block SIGBUS, after installing any SIGBUS
/// handler of the program's own (uswap passes it every SIGBUS that is not for managed memory).
///
/// Errors: `USWAP_EINVAL` (NULL argument, configuration not live, no resident limit or no
/// devices set, a device too small, a process that `uswap run`'s library pages), `USWAP_EPERM` (no permission to open a userfaultfd),
/// `USWAP_ENOTSUP` (kernel too old), `USWAP_EDEVICE` (a device could not be opened),
/// `USWAP_ENOMEM`, `USWAP_ESIGNAL`, `USWAP_EIO`.
///
/// # Safety
///
/// `pager_out` must be NULL or valid for writing one pointer.
#[no_mangle]
pub unsafe extern "C" fn uswap_pager_new(config: *const uswap_config, pager_out: *mut *mut uswap_pager) -> c_int {
    guard(|| {
        const FUNCTION: &str = "uswap_pager_new";
        non_null(pager_out, FUNCTION, "pager_out")?;
        // SAFETY: checked non-NULL; writable by the caller's contract. NULL until success.
        unsafe { put(pager_out, std::ptr::null_mut()) };
        let entry = CONFIGS.get(id_of(config), FUNCTION, "config")?;
        let settings = entry.lock().unwrap_or_else(std::sync::PoisonError::into_inner).clone();
        let limit_bytes = settings.limit_bytes.ok_or_else(|| {
            Failure::invalid(format!(
                "{FUNCTION}: the configuration has no resident limit; set one with uswap_config_set_resident_limit"
            ))
        })?;
        let devices = settings.devices.ok_or_else(|| {
            Failure::invalid(format!(
                "{FUNCTION}: the configuration has no swap device; set them with uswap_config_set_devices (e.g. \
                 \"ram:1GiB\")"
            ))
        })?;
        let mut builder: PagerBuilder =
            Pager::builder().resident_limit(limit_bytes).fault_mode(settings.mode).readahead(settings.readahead);
        if let Some(n) = settings.handler_threads {
            builder = builder.handler_threads(n);
        }
        builder = builder.syscall_guard(settings.syscall_guard);
        if let Some(t) = settings.auto_target {
            builder = builder.auto_budget(t);
        }
        builder = builder.idle_aging(settings.idle_aging);
        if let Some(age) = settings.tier_age {
            builder = builder.tier_age(age);
        }
        for d in devices {
            builder = builder.device(d);
        }
        let pager = builder.build()?;
        let id = PAGERS.insert(pager);
        // SAFETY: as above.
        unsafe { put(pager_out, to_handle(id)) };
        Ok(())
    })
}

/// Destroys a pager: stops its threads and releases its devices (a regular file given as a
/// device is emptied here, so a program that exits without destroying its pagers leaves
/// swapped pages in such a file). Refuses, with `USWAP_EBUSY` and the pager left as it was,
/// while any region of the pager is still mapped: unmap each with `uswap_unmap` first. A
/// call on the pager already running in another thread completes, and the pager is
/// released when it returns; but a `uswap_map` that finishes after the destroy gives its new
/// region back and fails with `USWAP_EINVAL`. Afterwards the handle is refused
/// (`USWAP_EINVAL`) by every function. In a fork child, `uswap_map`, `uswap_get_stats` and
/// `uswap_set_resident_limit` on a pager inherited from the parent fail with
/// `USWAP_EINVAL`, and `uswap_unmap` and `uswap_pager_destroy` forget the handle without
/// touching the parent's memory or devices.
///
/// Errors: `USWAP_EINVAL` if `pager` is NULL or not live, `USWAP_EBUSY` as above.
#[no_mangle]
pub extern "C" fn uswap_pager_destroy(pager: *mut uswap_pager) -> c_int {
    guard(|| {
        const FUNCTION: &str = "uswap_pager_destroy";
        let id = id_of(pager);
        PAGERS.check(id, FUNCTION, "pager")?;
        let removed = {
            let mut pagers = PAGERS.lock();
            if !pagers.contains_key(&id) {
                return Err(PAGERS.unknown(id, FUNCTION, "pager"));
            }
            let mapped = REGIONS.lock().values().filter(|r| r.pager_id == id).count();
            if mapped > 0 {
                return Err(Failure::new(
                    uswap_status::USWAP_EBUSY,
                    format!(
                        "{FUNCTION}: {mapped} region(s) of this pager are still mapped; unmap each with uswap_unmap, \
                         then destroy the pager (it was left as it was)"
                    ),
                ));
            }
            pagers.remove(&id)
        };
        // Dropped outside the locks: the last handle joins the pager's threads.
        drop(removed);
        Ok(())
    })
}

/// Changes the resident limit. A lower limit takes effect at once: the call reclaims down to
/// it before returning. With an automatic budget (`uswap_config_set_auto_budget`) the limit
/// given is the budget's new ceiling: the budget moves the limit under it from then on.
///
/// Errors: `USWAP_EINVAL` (NULL or dead `pager`, limit below the minimum or above the
/// maximum of `uswap_config_set_resident_limit`; nothing changed),
/// `USWAP_ENOSPC` (the devices are full; the new limit is in place), `USWAP_EBUSY` (every
/// page reclaim found was busy for 2 s; the new limit is in place, call again later).
#[no_mangle]
pub extern "C" fn uswap_set_resident_limit(pager: *mut uswap_pager, limit_bytes: u64) -> c_int {
    guard(|| {
        let pager = PAGERS.get(id_of(pager), "uswap_set_resident_limit", "pager")?;
        pager.set_resident_limit(limit_bytes)?;
        Ok(())
    })
}

/// Reads the pager's counters into `*stats`. Set `stats->size = sizeof(uswap_stats)` first:
/// uswap fills that many bytes (whole fields, at most its own size) and writes back in
/// `stats->size` how many it filled, so programs built against an older or newer header
/// work with this library.
///
/// Errors: `USWAP_EINVAL` if an argument is NULL, `pager` is not live, `stats` is not aligned
/// for `uint64_t`, `stats->size` is below 8, or this process is a fork child of the one that
/// made the pager.
///
/// # Safety
///
/// `stats` must be NULL or point to memory readable and writable for `stats->size` bytes.
#[no_mangle]
pub unsafe extern "C" fn uswap_get_stats(pager: *mut uswap_pager, stats: *mut uswap_stats) -> c_int {
    guard(|| {
        const FUNCTION: &str = "uswap_get_stats";
        non_null(stats, FUNCTION, "stats")?;
        if !stats.cast::<u64>().is_aligned() {
            return Err(Failure::invalid(format!("{FUNCTION}: stats is not aligned for uint64_t")));
        }
        // SAFETY: non-NULL and aligned (checked); the caller's contract makes at least the
        // `size` field readable (it says how much is).
        let caller_size = unsafe { stats.cast::<u64>().read() };
        let Some(n) = stats::filled_bytes(caller_size) else {
            return Err(Failure::invalid(format!(
                "{FUNCTION}: stats->size is {caller_size}; set it to sizeof(uswap_stats) before the call"
            )));
        };
        let pager = PAGERS.get(id_of(pager), FUNCTION, "pager")?;
        // In a fork child the engine's tables are the parent's, partly absent.
        pager.check_owner()?;
        let mut snapshot = uswap_stats::from_engine(&pager.stats());
        snapshot.size = n as u64;
        // SAFETY: `n` is at most both the caller's size (writable by contract) and ours; the
        // snapshot is plain `u64`s with no padding, and the two do not overlap (one is ours).
        unsafe { std::ptr::copy_nonoverlapping((&raw const snapshot).cast::<u8>(), stats.cast::<u8>(), n) };
        Ok(())
    })
}

// ---------------------------------------------------------------------------------------
// Regions
// ---------------------------------------------------------------------------------------

/// Maps a managed region of `len_bytes` (rounded up to whole pages), zero-filled and
/// page-aligned, and stores its handle in `*region_out` (NULL on failure). Its memory
/// (`uswap_region_addr`, `uswap_region_len`) may be read and written by any thread until
/// `uswap_unmap`; pages come back from swap on first touch.
///
/// Errors: `USWAP_EINVAL` (NULL argument, `pager` not live, `len_bytes` 0 or above the
/// maximum region size), `USWAP_ENOMEM` (out of address space or region slots),
/// `USWAP_ESIGNAL` (signal mode: the SIGBUS handler was replaced), `USWAP_EIO`.
///
/// # Safety
///
/// `region_out` must be NULL or valid for writing one pointer.
#[no_mangle]
pub unsafe extern "C" fn uswap_map(
    pager: *mut uswap_pager,
    len_bytes: usize,
    region_out: *mut *mut uswap_region,
) -> c_int {
    guard(|| {
        const FUNCTION: &str = "uswap_map";
        non_null(region_out, FUNCTION, "region_out")?;
        // SAFETY: checked non-NULL; writable by the caller's contract. NULL until success.
        unsafe { put(region_out, std::ptr::null_mut()) };
        let pager_id = id_of(pager);
        let engine_pager = PAGERS.get(pager_id, FUNCTION, "pager")?;
        let region = engine_pager.map(len_bytes)?;
        let id = {
            let pagers = PAGERS.lock();
            if !pagers.contains_key(&pager_id) {
                // Destroyed by another thread while this one mapped: the region goes with it.
                drop(pagers);
                drop(region);
                return Err(PAGERS.unknown(pager_id, FUNCTION, "pager"));
            }
            Table::insert_locked(&mut REGIONS.lock(), RegionEntry { region, pager_id })
        };
        // SAFETY: as above.
        unsafe { put(region_out, to_handle(id)) };
        Ok(())
    })
}

/// Unmaps a region: its memory is unmapped as by `munmap` (the addresses may be reused by
/// later mappings) and every swap slot and cache page it held is freed. Afterwards the handle
/// is refused (`USWAP_EINVAL`) by every function. Stop every thread's use of the memory
/// first.
///
/// Errors: `USWAP_EINVAL` if `region` is NULL or not live.
#[no_mangle]
pub extern "C" fn uswap_unmap(region: *mut uswap_region) -> c_int {
    guard(|| {
        let id = id_of(region);
        REGIONS.check(id, "uswap_unmap", "region")?;
        let removed = REGIONS.lock().remove(&id);
        // Dropped outside the lock: unmapping frees the region's slots and pages.
        removed.map(drop).ok_or_else(|| REGIONS.unknown(id, "uswap_unmap", "region"))
    })
}

/// Stores the address of the region's first byte in `*addr_out`. It is fixed for the life
/// of the region (unless the program moves it with `mremap`, which uswap follows).
///
/// Errors: `USWAP_EINVAL` if an argument is NULL or `region` is not live.
///
/// # Safety
///
/// `addr_out` must be NULL or valid for writing one pointer.
#[no_mangle]
pub unsafe extern "C" fn uswap_region_addr(region: *const uswap_region, addr_out: *mut *mut c_void) -> c_int {
    guard(|| {
        non_null(addr_out, "uswap_region_addr", "addr_out")?;
        let entry = REGIONS.get(id_of(region), "uswap_region_addr", "region")?;
        // SAFETY: checked non-NULL; writable by the caller's contract.
        unsafe { addr_out.write_unaligned(entry.region.as_ptr().cast::<c_void>()) };
        Ok(())
    })
}

/// Stores the region's length in bytes (a whole number of pages) in `*len_bytes_out`.
///
/// Errors: `USWAP_EINVAL` if an argument is NULL or `region` is not live.
///
/// # Safety
///
/// `len_bytes_out` must be NULL or valid for writing one `size_t`.
#[no_mangle]
pub unsafe extern "C" fn uswap_region_len(region: *const uswap_region, len_bytes_out: *mut usize) -> c_int {
    guard(|| {
        non_null(len_bytes_out, "uswap_region_len", "len_bytes_out")?;
        let entry = REGIONS.get(id_of(region), "uswap_region_len", "region")?;
        // SAFETY: checked non-NULL; writable by the caller's contract.
        unsafe { len_bytes_out.write_unaligned(entry.region.len()) };
        Ok(())
    })
}

#[cfg(test)]
mod tests;
