//! The exported functions called as C would call them, against the real kernel.

use super::*;
use crate::status::uswap_status::*;

fn last_error() -> String {
    // SAFETY: uswap_last_error never returns NULL, and the string lives until the next
    // failing call on this thread, after this read.
    unsafe { CStr::from_ptr(uswap_last_error()) }.to_string_lossy().into_owned()
}

/// Asserts `status` is `expected` and the message contains `needle`.
fn assert_fails(status: c_int, expected: uswap_status, needle: &str) {
    assert_eq!(status, expected as c_int, "message: {}", last_error());
    let msg = last_error();
    assert!(msg.contains(needle), "{needle:?} not in {msg:?}");
}

fn config(limit_bytes: u64, devices: &CStr) -> *mut uswap_config {
    let mut cfg = std::ptr::null_mut();
    // SAFETY: &mut cfg is a valid out pointer; devices is NUL-terminated.
    unsafe {
        assert_eq!(uswap_config_new(&mut cfg), 0);
        assert_eq!(uswap_config_set_devices(cfg, devices.as_ptr(), 16 << 20), 0, "{}", last_error());
    }
    assert_eq!(uswap_config_set_resident_limit(cfg, limit_bytes), 0);
    cfg
}

#[test]
fn null_pointers_are_einval_with_the_argument_named() {
    // SAFETY: NULL is allowed for every pointer argument of every call below.
    unsafe {
        assert_fails(uswap_config_new(std::ptr::null_mut()), USWAP_EINVAL, "uswap_config_new: config_out is NULL");
        assert_fails(uswap_config_free(std::ptr::null_mut()), USWAP_EINVAL, "config is NULL");
        assert_fails(uswap_config_set_resident_limit(std::ptr::null_mut(), 1 << 30), USWAP_EINVAL, "config is NULL");
        let cfg = config(8 << 20, c"ram");
        assert_fails(uswap_config_set_devices(cfg, std::ptr::null(), 0), USWAP_EINVAL, "devices is NULL");
        assert_fails(uswap_pager_new(cfg, std::ptr::null_mut()), USWAP_EINVAL, "pager_out is NULL");
        let mut pager = std::ptr::dangling_mut();
        assert_fails(uswap_pager_new(std::ptr::null(), &mut pager), USWAP_EINVAL, "config is NULL");
        assert!(pager.is_null(), "the out pointer is NULL after a failure");
        assert_fails(uswap_map(std::ptr::null_mut(), 4096, std::ptr::null_mut()), USWAP_EINVAL, "region_out is NULL");
        let mut region = std::ptr::null_mut();
        assert_fails(uswap_map(std::ptr::null_mut(), 4096, &mut region), USWAP_EINVAL, "pager is NULL");
        assert_fails(uswap_unmap(std::ptr::null_mut()), USWAP_EINVAL, "region is NULL");
        assert_fails(uswap_get_stats(std::ptr::null_mut(), std::ptr::null_mut()), USWAP_EINVAL, "stats is NULL");
        assert_fails(uswap_region_len(std::ptr::null(), std::ptr::null_mut()), USWAP_EINVAL, "len_bytes_out is NULL");
        assert_eq!(uswap_config_free(cfg), 0);
    }
}

#[test]
fn bad_values_are_einval_and_say_what_to_pass() {
    let cfg = config(8 << 20, c"ram");
    assert_fails(uswap_config_set_resident_limit(cfg, 4096), USWAP_EINVAL, "give the pager at least");
    assert_fails(uswap_config_set_fault_mode(cfg, 2), USWAP_EINVAL, "USWAP_FAULT_MODE_SIGNAL (1)");
    assert_fails(uswap_config_set_handler_threads(cfg, 0), USWAP_EINVAL, "pass at least 1");
    assert_fails(uswap_config_set_handler_threads(cfg, u32::MAX), USWAP_EINVAL, "at most 1024");
    assert_fails(uswap_config_set_idle_age(cfg, 1e300), USWAP_EINVAL, "a year");
    assert_fails(uswap_config_set_readahead(cfg, 2), USWAP_EINVAL, "pass 1 (on) or 0 (off)");
    // SAFETY: a NUL-terminated string; the rest are valid handles or values.
    unsafe {
        assert_fails(uswap_config_set_devices(cfg, c"ram:lots".as_ptr(), 0), USWAP_EINVAL, "bad device \"ram:lots\"");
        assert_fails(uswap_config_set_devices(cfg, c"\xff".as_ptr(), 0), USWAP_EINVAL, "not UTF-8");
    }
    assert_eq!(uswap_config_set_handler_threads(cfg, 1), 0);
    assert_eq!(uswap_config_set_readahead(cfg, 0), 0);
    assert_eq!(uswap_config_free(cfg), 0);
}

/// A tier age out of range is refused at once; one with a single device, by the pager's
/// creation, saying to give a tier below; with two devices the pager is made.
#[test]
fn a_tier_age_needs_a_range_and_a_tier_below() {
    let cfg = config(8 << 20, c"ram");
    for bad in [0.5, -1.0, f64::NAN, f64::INFINITY, 1e300] {
        assert_fails(uswap_config_set_tier_age(cfg, bad), USWAP_EINVAL, "1 to 31536000");
    }
    assert_eq!(uswap_config_set_tier_age(cfg, 30.0), 0);
    let mut pager = std::ptr::null_mut();
    // SAFETY: valid handles and out pointer; devices strings NUL-terminated.
    unsafe {
        assert_fails(uswap_pager_new(cfg, &mut pager), USWAP_EINVAL, "zpool,zpool:zstd-1");
        assert!(pager.is_null());
        assert_eq!(uswap_config_set_devices(cfg, c"zpool,zpool:zstd-1".as_ptr(), 16 << 20), 0);
        assert_eq!(uswap_pager_new(cfg, &mut pager), 0, "{}", last_error());
    }
    assert_eq!(uswap_pager_destroy(pager), 0);
    assert_eq!(uswap_config_set_tier_age(cfg, 0.0), 0, "0: the default again");
    assert_eq!(uswap_config_free(cfg), 0);
}

#[test]
fn a_configuration_without_limit_or_devices_says_which_call_is_missing() {
    let mut cfg = std::ptr::null_mut();
    let mut pager = std::ptr::null_mut();
    // SAFETY: valid out pointers and a NUL-terminated string.
    unsafe {
        assert_eq!(uswap_config_new(&mut cfg), 0);
        assert_fails(uswap_pager_new(cfg, &mut pager), USWAP_EINVAL, "uswap_config_set_resident_limit");
        assert_eq!(uswap_config_set_resident_limit(cfg, 8 << 20), 0);
        assert_fails(uswap_pager_new(cfg, &mut pager), USWAP_EINVAL, "uswap_config_set_devices");
        assert_eq!(uswap_config_set_devices(cfg, c"ram:4KiB".as_ptr(), 0), 0);
        assert_fails(uswap_pager_new(cfg, &mut pager), USWAP_EINVAL, "below one cluster");
    }
    assert!(pager.is_null());
    assert_eq!(uswap_config_free(cfg), 0);
}

#[test]
fn stale_and_wrong_kind_handles_are_refused_not_dereferenced() {
    let cfg = config(8 << 20, c"ram:16MiB");
    let mut pager = std::ptr::null_mut();
    let mut region = std::ptr::null_mut();
    let mut len = 0usize;
    // SAFETY: valid out pointers; the handles are uswap's (or deliberately wrong, which
    // the API must refuse without dereferencing them).
    unsafe {
        assert_eq!(uswap_pager_new(cfg, &mut pager), 0, "{}", last_error());
        assert_eq!(uswap_config_free(cfg), 0);
        assert_fails(uswap_config_free(cfg), USWAP_EINVAL, "is not a live uswap configuration");
        assert_eq!(uswap_map(pager, 10_000, &mut region), 0, "{}", last_error());
        assert_eq!(uswap_region_len(region, &mut len), 0);
        assert_eq!(len, 12_288, "rounded up to whole pages");
        assert_fails(uswap_pager_destroy(region.cast()), USWAP_EINVAL, "is not a live uswap pager");
        assert_fails(uswap_unmap(pager.cast()), USWAP_EINVAL, "is not a live uswap region");
        assert_fails(uswap_pager_destroy(pager), USWAP_EBUSY, "1 region(s) of this pager are still mapped");
        assert_eq!(uswap_unmap(region), 0);
        assert_fails(uswap_region_len(region, &mut len), USWAP_EINVAL, "already freed");
        assert_eq!(uswap_pager_destroy(pager), 0);
        assert_fails(uswap_map(pager, 4096, &mut region), USWAP_EINVAL, "is not a live uswap pager");
        assert!(region.is_null());
        let forged: *mut uswap_pager = std::ptr::without_provenance_mut(0xdead_beef);
        assert_fails(uswap_set_resident_limit(forged, 8 << 20), USWAP_EINVAL, "never returned by uswap");
    }
}

#[test]
fn a_fork_child_is_refused_the_parents_pager() {
    let cfg = config(8 << 20, c"ram:16MiB");
    let mut pager = std::ptr::null_mut();
    // SAFETY: a valid out pointer.
    assert_eq!(unsafe { uswap_pager_new(cfg, &mut pager) }, 0, "{}", last_error());
    // The thread's message slot exists before the fork (its first use registers a
    // destructor), and no other test's thread holds the table of pagers at the fork: the
    // child, which has only this thread, must find neither held.
    let _ = last_error();
    let pagers = PAGERS.lock();
    // SAFETY: the child makes calls that fail before any engine work, then _exits (never
    // unwinding into the test harness).
    let pid = unsafe { libc::fork() };
    drop(pagers);
    assert!(pid >= 0, "fork: {}", std::io::Error::last_os_error());
    if pid == 0 {
        let mut st = uswap_stats { size: std::mem::size_of::<uswap_stats>() as u64, ..Default::default() };
        let mut region = std::ptr::null_mut();
        // SAFETY: valid out pointers.
        let statuses = unsafe {
            [
                uswap_get_stats(pager, &mut st),
                uswap_map(pager, 1 << 20, &mut region),
                uswap_set_resident_limit(pager, 4 << 20),
            ]
        };
        let refused = statuses.iter().all(|&s| s == USWAP_EINVAL as c_int) && last_error().contains("fork child");
        // SAFETY: ends the child at once.
        unsafe { libc::_exit(if refused { 0 } else { 1 }) };
    }
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    let mut status = 0;
    loop {
        // SAFETY: waits for our own child; `status` is a valid out pointer.
        match unsafe { libc::waitpid(pid, &mut status, libc::WNOHANG) } {
            0 if std::time::Instant::now() < deadline => std::thread::sleep(std::time::Duration::from_millis(10)),
            0 => {
                // SAFETY: our own child, still there (not reaped).
                unsafe { libc::kill(pid, libc::SIGKILL) };
                panic!("the fork child did not end within 30 s (killed)");
            }
            r => {
                assert_eq!(r, pid, "waitpid: {}", std::io::Error::last_os_error());
                break;
            }
        }
    }
    assert!(libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0, "child status {status:#x}");
    assert_eq!(uswap_pager_destroy(pager), 0);
    assert_eq!(uswap_config_free(cfg), 0);
}

#[test]
fn stats_fill_only_what_the_caller_says_it_has() {
    let cfg = config(8 << 20, c"ram:16MiB");
    let mut pager = std::ptr::null_mut();
    let mut region = std::ptr::null_mut();
    let mut addr = std::ptr::null_mut();
    // SAFETY: valid out pointers; the region's memory is written within its length.
    unsafe {
        assert_eq!(uswap_pager_new(cfg, &mut pager), 0, "{}", last_error());
        assert_eq!(uswap_map(pager, 1 << 20, &mut region), 0, "{}", last_error());
        assert_eq!(uswap_region_addr(region, &mut addr), 0);
        std::ptr::write_bytes(addr.cast::<u8>(), 7, 1 << 20);
    }
    const MARK: u64 = 0x5555_5555_5555_5555;
    let old_caller = |size: u64| {
        let mut s = [MARK; 4];
        s[0] = size;
        // SAFETY: `s` is aligned for u64 and holds `size` bytes or more (size <= 32).
        let status = unsafe { uswap_get_stats(pager, s.as_mut_ptr().cast()) };
        (status, s)
    };
    // A caller whose struct is two fields long gets two, and nothing past them is written.
    let (status, s) = old_caller(20);
    assert_eq!(status, 0);
    assert_eq!(s, [16, engine::PAGE_SIZE as u64, MARK, MARK]);
    let (status, s) = old_caller(32);
    assert_eq!(status, 0);
    assert_eq!(s[0], 32);
    assert_eq!(s[2], 256 * engine::PAGE_SIZE as u64, "resident_bytes after touching 1 MiB");
    assert_eq!(s[3], 8 << 20, "limit_bytes");
    assert_fails(old_caller(4).0, USWAP_EINVAL, "set it to sizeof(uswap_stats)");
    // A newer caller with a longer struct: we fill ours and say so.
    let mut big = [MARK; 128];
    big[0] = 1024;
    // SAFETY: 1024 bytes, aligned.
    assert_eq!(unsafe { uswap_get_stats(pager, big.as_mut_ptr().cast()) }, 0);
    let ours = std::mem::size_of::<uswap_stats>();
    assert_eq!(big[0] as usize, ours);
    assert_eq!(big[ours / 8], MARK, "nothing past our struct is written");
    // A handler thread counts a fault after it has mapped the page and woken the faulting
    // thread, so the counters may lag the memset by a moment: wait for them, bounded.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    let full = loop {
        let mut full = uswap_stats { size: ours as u64, ..Default::default() };
        // SAFETY: a whole uswap_stats.
        assert_eq!(unsafe { uswap_get_stats(pager, &mut full) }, 0);
        if full.pgfault_zero + full.zero_fill_around == 256 || std::time::Instant::now() > deadline {
            break full;
        }
        std::thread::sleep(std::time::Duration::from_millis(10));
    };
    assert_eq!(full.resident_pages, 256);
    assert_eq!(full.pgfault_zero + full.zero_fill_around, 256, "every page zero-filled once, within 5 s");
    assert_eq!(uswap_unmap(region), 0);
    assert_eq!(uswap_pager_destroy(pager), 0);
    assert_eq!(uswap_config_free(cfg), 0);
}
