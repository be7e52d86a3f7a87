//! The program's `munmap`, interposed: what goes of managed memory is released by its
//! regions first, then unmapped with one kernel call ([`unmap`]), which `mremap` uses too.
//! A `munmap` that takes a whole staging area of the pager with it (a program unmapping its
//! address space to die) unregisters every region in its range first ([`unmap_with_uswap`]);
//! the pages of the program's own break stay the break's. A process waiting for its pager
//! unmaps its deferred mappings with the kernel (`crate::waiting_charge`; see `crate::mmap`).
//!
//! Locking: the table of managed mappings (`crate::managed_table`, behind the mutex of
//! `crate::mmap`) is held only to look entries up and take them out; regions are dropped
//! outside it (a drop reaches the engine's locks). Invariant: a managed unmap is counted begun before its
//! regions leave the registry and ended after the kernel's call ([`managed_unmaps`]), so
//! that a scan of unmanaged memory can tell when it overlapped one.

use std::ffi::c_void;

use crate::mmap::{
    config, forget_unmapped, overlaps_managed, page_round_up, take_covered, user_space_top, LET_GO_BY_PROTECTION,
};
use crate::own_code::{in_uswap, Guard};
use crate::real::{self, errno, set_errno};

/// Whether the kernel takes `munmap(start, len)` at all (`do_vmi_munmap`: a page-aligned
/// start, a length that rounds up to more than nothing, the whole range below the top of
/// user space). A call it refuses with `EINVAL` changes nothing, so none of it may be done
/// to managed memory first: `munmap(p, 1 << 62)` released every region above `p`, and the
/// program, told `EINVAL`, found its memory gone (SIGSEGV). Allocation-free.
fn munmap_accepted(start: usize, len: usize) -> bool {
    let top = user_space_top();
    start % uswap::PAGE_SIZE == 0 && len > 0 && page_round_up(len).is_some_and(|len| start <= top && len <= top - start)
}

#[no_mangle]
pub extern "C" fn munmap(addr: *mut c_void, len: usize) -> i32 {
    if in_uswap() || uswap::is_engine_thread() || !munmap_accepted(addr as usize, len) {
        return real::sys_munmap(addr, len);
    }
    let start = addr as usize;
    let end = page_round_up(len).and_then(|l| start.checked_add(l));
    // What was let go of there is gone with it (the report must not name a later mapping
    // at these addresses so).
    LET_GO_BY_PROTECTION.forget(start, end.unwrap_or(usize::MAX));
    crate::program_stacks::forget(start, end.unwrap_or(usize::MAX));
    let pager = crate::pager().filter(|_| start % uswap::PAGE_SIZE == 0);
    if let Some((pager, end)) = pager.zip(end).filter(|(p, end)| p.holds_staging_within(start, *end)) {
        return unmap_with_uswap(pager, addr, len, end);
    }
    if let Some(outside) = end
        .filter(|_| start % uswap::PAGE_SIZE == 0 && len > 0)
        .and_then(|end| crate::program_break::unmap_inside(start, end))
    {
        // Pages of the program's break stay the break's; the rest goes as any munmap.
        let mut r = 0;
        for (s, e) in outside.into_iter().filter(|(s, e)| e > s) {
            r |= munmap(s as *mut c_void, e - s);
        }
        return r;
    }
    if config().is_none() {
        // A waiting process's deferred mappings are the kernel's until its pager starts:
        // what goes is no longer noted (CPython unmaps each arena it empties), in step
        // with a start on another thread that takes them over.
        let unmapped = |r: i32, _| r == 0;
        match crate::waiting_charge::call_on_deferred(addr as usize, len, || real::sys_munmap(addr, len), unmapped) {
            Some((r, e)) => {
                set_errno(e);
                return r;
            }
            None => crate::wait_for_start(),
        }
        if config().is_none() {
            if crate::config().is_some_and(|c| len < c.min_size_bytes) {
                crate::waiting_charge::note_small_mapping(len, false);
            }
            if let Some(end) = end.filter(|_| crate::is_unmanaged_fork_child()) {
                // The parent's regions are not this process's to page: what the table says
                // of them goes with the range, so that a block the C library places here
                // later is not taken for one of them (`heap::huge_len`) and unmapped whole.
                crate::mmap::forget_entries(start, end);
            }
            return real::sys_munmap(addr, len);
        }
    }
    let _g = Guard::enter();
    unmap(addr, len)
}

/// `munmap` for a managed process, on the program's behalf (the caller holds a [`Guard`]).
pub(crate) fn unmap(addr: *mut c_void, len: usize) -> i32 {
    let start = addr as usize;
    let Some(end) = page_round_up(len).and_then(|l| start.checked_add(l)) else {
        return real::sys_munmap(addr, len);
    };
    // Refused by the kernel (`munmap_accepted`): nothing may be released first. (Also
    // reached from `mremap`'s shrink and move.)
    if start % uswap::PAGE_SIZE != 0 || len == 0 || !munmap_accepted(start, len) || !overlaps_managed(start, end) {
        return real::sys_munmap(addr, len);
    }
    let _counted = ManagedUnmap::begin();
    let (covered, partial) = take_covered(start, end);
    // The regions inside the range let go of their pages and slots, and leave their memory
    // mapped for the one `munmap` below. (Dropping them unmapped it first: another thread's
    // `mmap` could get the freed addresses before the second unmap, which took them from
    // it, and two arenas of a program then shared one address.)
    let mut live = Vec::new();
    for e in covered {
        live.extend(e.region.release_leaving_mapped());
    }
    // All of it: the regions' memory, parts of other managed mappings (the engine handles
    // the kernel's UNMAP event for them), parts of the regions that were no longer theirs
    // (let go of, or mapped over), and ordinary memory. The regions taken whole are
    // unregistered already and send no event; for the parts of others, no thread's new
    // region is entered until their event is applied (`uswap::UnmapUnderWay`).
    let under_way = crate::pager().filter(|_| partial).map(|p| p.unmap_under_way());
    let r = real::sys_munmap(addr, len);
    let e = errno();
    drop(under_way);
    if r != 0 {
        // The program's call failed, but the regions are gone: their memory goes as
        // dropping them would have unmapped it (it holds none of their swapped pages now).
        for (addr, len) in live {
            real::sys_munmap(addr as *mut c_void, len);
        }
        say_refused_after_release(e);
    }
    if partial && r == 0 {
        forget_unmapped(start, end);
    }
    set_errno(e);
    r
}

/// The program's `munmap` of a range that holds a whole mapping of the pager's own (a
/// device's staging area): a program unmapping its whole address space to die (stress-ng's
/// vm-segv child), after which no pager goes on. Every region in the range is unregistered
/// first, those of no table entry too (the heap's), so that the kernel's call sends no
/// `UNMAP` event to wait on: the engine's event thread may never read it (a tracer that
/// stopped the process resumes only the thread it traces). Before the split around the
/// program's break: each piece alone may hold no engine data. Should the kernel refuse the
/// call (a split past `vm.max_map_count`), the regions stay mapped but unregistered: their
/// pages that are out read as zeros, in a process that meant to end.
fn unmap_with_uswap(pager: &uswap::Pager, addr: *mut c_void, len: usize, end: usize) -> i32 {
    pager.unregister_for_teardown(addr as usize, end);
    real::sys_munmap(addr, len)
}

/// Managed unmaps begun and ended ([`unmap`]), for the report of unmanaged memory: between
/// a region's leaving the registry and its memory's `munmap`, a scan of `/proc` would find
/// the region's pages in a mapping no region owns ([`managed_unmaps`]).
static MANAGED_UNMAPS_BEGUN: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
static MANAGED_UNMAPS_ENDED: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// One managed unmap, counted begun when made and ended when dropped.
struct ManagedUnmap;

impl ManagedUnmap {
    fn begin() -> ManagedUnmap {
        MANAGED_UNMAPS_BEGUN.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        ManagedUnmap
    }
}

impl Drop for ManagedUnmap {
    fn drop(&mut self) {
        MANAGED_UNMAPS_ENDED.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
    }
}

/// In a fork child: an unmap another thread of the parent had under way never ends here.
pub fn forget_unmaps_in_fork_child() {
    let begun = MANAGED_UNMAPS_BEGUN.load(std::sync::atomic::Ordering::SeqCst);
    MANAGED_UNMAPS_ENDED.store(begun, std::sync::atomic::Ordering::SeqCst);
}

/// How many managed unmaps have begun and ended, in that order: a scan that read `(b, e)`
/// with `b == e` before it and `b` again after it overlapped none.
pub fn managed_unmaps() -> (u64, u64) {
    let begun = MANAGED_UNMAPS_BEGUN.load(std::sync::atomic::Ordering::SeqCst);
    (begun, MANAGED_UNMAPS_ENDED.load(std::sync::atomic::Ordering::SeqCst))
}

/// Says, once, that the kernel refused a `munmap` of managed memory after its regions let go
/// of their pages: what was out reads zero if the program goes on using the range. The kernel
/// refuses only a split past `vm.max_map_count` (`ENOMEM`) and sealed memory (`EPERM`),
/// neither of which uswap can tell beforehand without a walk of `/proc/self/maps`.
fn say_refused_after_release(errno: i32) {
    static SAID: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
    if SAID.swap(true, std::sync::atomic::Ordering::Relaxed) {
        return;
    }
    let why = match errno {
        libc::ENOMEM => "ENOMEM: the split would pass vm.max_map_count",
        libc::EPERM => "EPERM: the memory is sealed",
        _ => "an error",
    };
    real::write_stderr(
        format!(
            "uswap: process {}: the kernel refused a munmap of managed memory ({why}) after uswap had let go of \
             its pages: the pages of that range that were out read zero from now on\n",
            std::process::id()
        )
        .as_bytes(),
    );
}
