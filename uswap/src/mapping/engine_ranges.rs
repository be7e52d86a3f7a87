//! The engine's own mappings, by address range: what a scan of the process's memory must
//! not count as the program's (the unmanaged-memory report) and what an address-space limit
//! must leave room for. Lock-free.

use std::sync::atomic::{AtomicBool, AtomicUsize};

/// Address ranges of the engine's own mappings (`[start, end)`, 0 when free): the staging
/// areas, RAM devices, page tables and queues, so that a scan of the process's memory can
/// tell the engine's from the program's ([`is_engine_memory`]). Lock-free: slots are taken
/// by a compare-and-swap of `start`, scanned up to [`ENGINE_RANGES_HIGH`].
const MAX_ENGINE_RANGES: usize = 16384;
static ENGINE_RANGES: [(AtomicUsize, AtomicUsize); MAX_ENGINE_RANGES] =
    [const { (AtomicUsize::new(0), AtomicUsize::new(0)) }; MAX_ENGINE_RANGES];
static ENGINE_RANGES_HIGH: AtomicUsize = AtomicUsize::new(0);
/// Which of [`ENGINE_RANGES`] hold the engine's data (a `Mapping`: pools, page tables,
/// staging areas), which a core dump leaves out, as against its threads' stacks and the
/// program's code it rewrote, which a debugger reads a backtrace through.
static ENGINE_DATA: [AtomicBool; MAX_ENGINE_RANGES] = [const { AtomicBool::new(false) }; MAX_ENGINE_RANGES];
/// Which of [`ENGINE_RANGES`] a fork child does not get (`MADV_DONTFORK`): forgotten there,
/// or a mapping of the child's own at those addresses would be taken for the engine's.
static NOT_INHERITED: [AtomicBool; MAX_ENGINE_RANGES] = [const { AtomicBool::new(false) }; MAX_ENGINE_RANGES];

/// Records `[addr, addr + len)` as the engine's (best effort: a full table only makes a
/// scan count the range as the program's).
pub(super) fn note_engine_range(addr: usize, len: usize) {
    note(addr, len, false);
}

/// Records `[addr, addr + len)` as the engine's data (see [`ENGINE_DATA`]).
pub(super) fn note_engine_data(addr: usize, len: usize) {
    note(addr, len, true);
}

fn note(addr: usize, len: usize, data: bool) {
    use std::sync::atomic::Ordering;
    for (i, (start, end)) in ENGINE_RANGES.iter().enumerate() {
        if start.compare_exchange(0, addr, Ordering::AcqRel, Ordering::Relaxed).is_ok() {
            ENGINE_DATA[i].store(data, Ordering::Release);
            NOT_INHERITED[i].store(false, Ordering::Release);
            end.store(addr + len, Ordering::Release);
            ENGINE_RANGES_HIGH.fetch_max(i + 1, Ordering::AcqRel);
            return;
        }
    }
}

/// Records `[addr, addr + len)` as memory uswap itself made or changed (outside the engine:
/// the preload library's rewritten code), so that a report of the program's unmanaged memory
/// leaves it out.
pub fn note_engine_memory(addr: usize, len: usize) {
    note_engine_range(addr, len);
}

/// Forgets the range [`note_engine_memory`] recorded at `addr`, before its memory is
/// unmapped: a record left behind names a later mapping of the program at those addresses
/// the engine's, and fills the table.
pub fn forget_engine_memory(addr: usize) {
    forget_engine_range(addr);
}

pub(super) fn forget_engine_range(addr: usize) {
    use std::sync::atomic::Ordering;
    let high = ENGINE_RANGES_HIGH.load(Ordering::Acquire);
    if let Some((start, end)) = ENGINE_RANGES[..high].iter().find(|(s, _)| s.load(Ordering::Acquire) == addr) {
        end.store(0, Ordering::Release);
        start.store(0, Ordering::Release);
    }
}

/// Records whether a fork child gets the engine's mapping at `addr` (`MADV_DOFORK` or
/// `MADV_DONTFORK` on all of it); nothing if `addr` starts none.
pub(super) fn note_inherited(addr: usize, inherited: bool) {
    use std::sync::atomic::Ordering;
    let high = ENGINE_RANGES_HIGH.load(Ordering::Acquire);
    if let Some(i) = ENGINE_RANGES[..high].iter().position(|(s, _)| s.load(Ordering::Acquire) == addr) {
        NOT_INHERITED[i].store(!inherited, Ordering::Release);
    }
}

/// In a fork child (one thread): the parent's mappings the child did not get are forgotten.
pub(super) fn forget_not_inherited_in_fork_child() {
    use std::sync::atomic::Ordering;
    let high = ENGINE_RANGES_HIGH.load(Ordering::Acquire);
    for (i, (s, e)) in ENGINE_RANGES[..high].iter().enumerate() {
        if NOT_INHERITED[i].swap(false, Ordering::AcqRel) {
            e.store(0, Ordering::Release);
            s.store(0, Ordering::Release);
        }
    }
}

/// Leaves the engine's data (see [`ENGINE_DATA`]) out of a core dump of this process
/// (`MADV_DONTDUMP`): the compressed pool and the tables mean nothing to a debugger, as the
/// kernel's zram is in no core. Returns how many ranges were left out. Allocation-free.
pub(crate) fn leave_engine_data_out_of_core_dump() -> usize {
    let mut nr_ranges = 0;
    for_each_engine_data(|s, e| nr_ranges += usize::from(leave_out_of_core_dump(s, e - s)));
    nr_ranges
}

/// Whether `[start, end)` overlaps one of the engine's own mappings.
pub fn is_engine_memory(start: usize, end: usize) -> bool {
    use std::sync::atomic::Ordering;
    let high = ENGINE_RANGES_HIGH.load(Ordering::Acquire);
    ENGINE_RANGES[..high].iter().any(|(s, e)| {
        let (s, e) = (s.load(Ordering::Acquire), e.load(Ordering::Acquire));
        s != 0 && s < end && start < e
    })
}

/// Whether `[start, end)` overlaps one of the engine's data mappings (see [`ENGINE_DATA`]).
pub(super) fn is_engine_data(start: usize, end: usize) -> bool {
    let mut found = false;
    for_each_engine_data(|s, e| found = found || (s < end && start < e));
    found
}

/// Calls `f(start, end)` for each of the engine's data mappings (see [`ENGINE_DATA`]).
/// Allocation-free.
pub(super) fn for_each_engine_data(mut f: impl FnMut(usize, usize)) {
    use std::sync::atomic::Ordering;
    let high = ENGINE_RANGES_HIGH.load(Ordering::Acquire);
    for (i, (s, e)) in ENGINE_RANGES[..high].iter().enumerate() {
        let (s, e) = (s.load(Ordering::Acquire), e.load(Ordering::Acquire));
        if s != 0 && e > s && ENGINE_DATA[i].load(Ordering::Acquire) {
            f(s, e);
        }
    }
}

/// Bytes of address space the engine's own mappings hold now (what [`is_engine_memory`]
/// knows of), reserved or touched: what an address-space limit set after the pager started
/// must leave room for (the preload's `rlimit`).
pub fn engine_reserved_bytes() -> u64 {
    use std::sync::atomic::Ordering;
    let high = ENGINE_RANGES_HIGH.load(Ordering::Acquire);
    ENGINE_RANGES[..high]
        .iter()
        .map(|(s, e)| {
            let (s, e) = (s.load(Ordering::Acquire), e.load(Ordering::Acquire));
            if s != 0 && e > s {
                (e - s) as u64
            } else {
                0
            }
        })
        .sum()
}

/// Leaves `[addr, addr + len)` (page-aligned) out of a core dump of this process
/// (`MADV_DONTDUMP`); false if the kernel refused (the range stays in). Allocation-free.
pub(crate) fn leave_out_of_core_dump(addr: usize, len: usize) -> bool {
    debug_assert_eq!(addr % crate::uffd::PAGE_SIZE, 0);
    // SAFETY: MADV_DONTDUMP changes what a core dump holds, not the memory or its contents;
    // the kernel checks the range.
    unsafe { libc::madvise(addr as *mut libc::c_void, len, libc::MADV_DONTDUMP) == 0 }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A range noted as the engine's is forgotten before its unmap: a record left behind
    /// would name a later mapping of the program there the engine's. (Addresses in the
    /// kernel's half: no mapping of this process is there.)
    #[test]
    fn a_forgotten_range_is_nobodys() {
        let other = 0xffff_9000_0000_0000usize;
        note_engine_memory(other, 1 << 20);
        assert!(is_engine_memory(other, other + 4096) && is_engine_memory(other - 4096, other + 1));
        forget_engine_memory(other);
        assert!(!is_engine_memory(other, other + 4096), "forgotten before its unmap");
    }
}
