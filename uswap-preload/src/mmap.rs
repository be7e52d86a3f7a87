//! The program's own anonymous mappings: `mmap`, `munmap` and `mremap`, interposed.
//!
//! A request for private, anonymous, readable and writable memory of at least `--min-size`
//! bytes, with no address asked for, becomes a managed region (`Pager::map`). Everything else
//! passes straight to the kernel: file and shared mappings, `MAP_FIXED` and address hints,
//! `PROT_EXEC` and `PROT_NONE` reservations, stacks (`MAP_STACK`, `MAP_GROWSDOWN`, and thread
//! stacks, which glibc maps with internal calls no interposition sees), huge pages.
//!
//! The table of managed mappings is one mutex over a vector reserved at start-up (never
//! grown: [`MAX_MAPPINGS`] entries, the engine's own region limit minus the heap). The lock
//! is taken only by these three calls; a region is dropped outside it. `munmap` of a whole
//! managed mapping drops its region (its slots are freed at once); `munmap` of a part goes
//! to the kernel, whose `UFFD_EVENT_UNMAP` the engine handles. `mremap` of a managed mapping
//! is done here, by copying into a new managed mapping: the kernel's `mremap` of part of a
//! region leaves the moved part as ordinary memory (the engine copies its pages into place
//! and lets it go, see `uswap/src/events.rs`), which would take it out of the budget; and
//! growing in place is something the kernel may refuse anyway.

use std::ffi::c_void;
use std::sync::Mutex;

use crate::heap::{in_uswap, Guard};
use crate::real;

/// At most this many managed mappings at once; more are ordinary memory (counted).
pub const MAX_MAPPINGS: usize = 4000;

struct Entry {
    start: usize,
    len: usize,
    /// Held for its drop: unmapping the region frees its slots.
    _region: uswap::Region,
}

static TABLE: Mutex<Vec<Entry>> = Mutex::new(Vec::new());

struct Config {
    pager: &'static uswap::Pager,
    min_size_bytes: usize,
}

static MIN_SIZE_BYTES: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(usize::MAX);

/// The configuration while this process is managed: none before start-up and in a fork
/// child that could not get a pager of its own (whose mappings are all ordinary; see
/// `fork`).
fn config() -> Option<Config> {
    let min_size_bytes = MIN_SIZE_BYTES.load(std::sync::atomic::Ordering::Acquire);
    if min_size_bytes == usize::MAX {
        return None;
    }
    Some(Config { pager: crate::pager()?, min_size_bytes })
}

/// Mappings left ordinary because the table was full or the pager refused them.
pub static UNMANAGED: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

pub fn start(min_size_bytes: usize) {
    TABLE.lock().unwrap_or_else(|e| e.into_inner()).reserve_exact(MAX_MAPPINGS);
    MIN_SIZE_BYTES.store(min_size_bytes, std::sync::atomic::Ordering::Release);
}

/// The table, locked across a `fork` (from the prepare handler to the parent's and the
/// child's): no thread is inside it when the child is made, and the child re-arms it.
pub struct TableHold(std::sync::MutexGuard<'static, Vec<Entry>>);

pub fn hold_for_fork() -> TableHold {
    TableHold(TABLE.lock().unwrap_or_else(|e| e.into_inner()))
}

impl TableHold {
    /// In a fork child: each managed mapping takes its re-armed region (matched by start);
    /// the parent's handles are forgotten, never dropped (their pager is the parent's). A
    /// mapping without a new region leaves the table and stays ordinary memory.
    pub fn rearm(mut self, regions: &mut Vec<(usize, uswap::Region)>) {
        let table = &mut self.0;
        let mut i = 0;
        while i < table.len() {
            match regions.iter().position(|(start, _)| *start == table[i].start) {
                Some(k) => {
                    let (_, region) = regions.swap_remove(k);
                    std::mem::forget(std::mem::replace(&mut table[i]._region, region));
                    i += 1;
                }
                None => std::mem::forget(table.swap_remove(i)),
            }
        }
    }
}

/// Bytes currently managed through `mmap` (the heap's region not included).
pub fn managed_bytes() -> usize {
    TABLE.lock().unwrap_or_else(|e| e.into_inner()).iter().map(|e| e.len).sum()
}

fn page_round_up(n: usize) -> Option<usize> {
    n.checked_next_multiple_of(uswap::PAGE_SIZE)
}

fn manageable(addr: *mut c_void, len: usize, prot: i32, flags: i32, cfg: &Config) -> bool {
    // The mapping type is a 4-bit field (MAP_SHARED_VALIDATE = MAP_SHARED | MAP_PRIVATE),
    // not flags: compare it whole.
    const MAP_TYPE: i32 = 0x0f;
    let excluded =
        libc::MAP_FIXED | libc::MAP_FIXED_NOREPLACE | libc::MAP_STACK | libc::MAP_GROWSDOWN | libc::MAP_HUGETLB;
    addr.is_null()
        && flags & libc::MAP_ANONYMOUS != 0
        && flags & MAP_TYPE == libc::MAP_PRIVATE
        && flags & excluded == 0
        && prot == libc::PROT_READ | libc::PROT_WRITE
        && len >= cfg.min_size_bytes
        && len > 0
}

/// Maps a managed region of `len` bytes, or `None` to fall back to an ordinary mapping.
fn map_managed(cfg: &Config, len: usize) -> Option<*mut c_void> {
    let len = page_round_up(len)?;
    let mut table = TABLE.lock().unwrap_or_else(|e| e.into_inner());
    if table.len() >= MAX_MAPPINGS {
        UNMANAGED.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        return None;
    }
    match cfg.pager.map(len) {
        Ok(region) => {
            let start = region.as_ptr() as usize;
            table.push(Entry { start, len, _region: region });
            Some(start as *mut c_void)
        }
        Err(_) => {
            UNMANAGED.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            None
        }
    }
}

/// A managed mapping of `len` bytes for the heap's largest blocks (see `heap::huge`), or
/// `None` when this process is not managed or the pager refuses it.
pub fn map_for_heap(len: usize) -> Option<*mut c_void> {
    let cfg = config()?;
    let _g = Guard::enter();
    map_managed(&cfg, len)
}

/// The length of the managed mapping that starts exactly at `start`, if there is one.
pub fn managed_len(start: usize) -> Option<usize> {
    TABLE.lock().unwrap_or_else(|e| e.into_inner()).iter().find(|e| e.start == start).map(|e| e.len)
}

#[no_mangle]
pub extern "C" fn mmap(addr: *mut c_void, len: usize, prot: i32, flags: i32, fd: i32, off: libc::off_t) -> *mut c_void {
    if !in_uswap() && !uswap::is_engine_thread() {
        if let Some(cfg) = config() {
            if manageable(addr, len, prot, flags, &cfg) {
                let _g = Guard::enter();
                if let Some(p) = map_managed(&cfg, len) {
                    return p;
                }
            }
        }
    }
    real::sys_mmap(addr, len, prot, flags, fd, off)
}

#[no_mangle]
pub extern "C" fn mmap64(
    addr: *mut c_void,
    len: usize,
    prot: i32,
    flags: i32,
    fd: i32,
    off: libc::off_t,
) -> *mut c_void {
    mmap(addr, len, prot, flags, fd, off)
}

/// Removes and returns the managed entries inside `[start, end)`; reports whether any entry
/// only partly overlaps it.
fn take_covered(start: usize, end: usize) -> (Vec<Entry>, bool) {
    let mut table = TABLE.lock().unwrap_or_else(|e| e.into_inner());
    let mut partial = false;
    let mut taken = Vec::new();
    let mut i = 0;
    while i < table.len() {
        let e = &table[i];
        let (es, ee) = (e.start, e.start + e.len);
        if es >= start && ee <= end {
            taken.push(table.swap_remove(i));
            continue;
        }
        if es < end && start < ee {
            partial = true;
        }
        i += 1;
    }
    (taken, partial)
}

fn overlaps_managed(start: usize, end: usize) -> bool {
    TABLE.lock().unwrap_or_else(|e| e.into_inner()).iter().any(|e| e.start < end && start < e.start + e.len)
}

#[no_mangle]
pub extern "C" fn munmap(addr: *mut c_void, len: usize) -> i32 {
    if in_uswap() || uswap::is_engine_thread() || config().is_none() {
        return real::sys_munmap(addr, len);
    }
    let _g = Guard::enter();
    let start = addr as usize;
    let Some(end) = page_round_up(len).and_then(|l| start.checked_add(l)) else {
        return real::sys_munmap(addr, len);
    };
    if start % uswap::PAGE_SIZE != 0 || len == 0 || !overlaps_managed(start, end) {
        return real::sys_munmap(addr, len);
    }
    let (covered, partial) = take_covered(start, end);
    let whole_entries: usize = covered.iter().map(|e| e.len).sum();
    // Dropping a region unmaps what is still its own and frees its slots.
    drop(covered);
    if partial || whole_entries != end - start {
        // The rest of the range: parts of other managed mappings (the engine handles the
        // kernel's UNMAP event for them) and ordinary memory.
        return real::sys_munmap(addr, len);
    }
    0
}

/// `mremap(old, old_len, new_len, flags, ...)`. The fifth argument is variadic in C; on the
/// x86-64 and AArch64 Linux ABIs a variadic pointer argument travels in the same register as
/// a fixed one, so declaring it fixed reads the caller's value when it passed one
/// (`MREMAP_FIXED`/`MREMAP_DONTUNMAP`) and is ignored otherwise.
#[no_mangle]
pub extern "C" fn mremap(
    old: *mut c_void,
    old_len: usize,
    new_len: usize,
    flags: i32,
    new_addr: *mut c_void,
) -> *mut c_void {
    if in_uswap() || uswap::is_engine_thread() || config().is_none() {
        return real::sys_mremap(old, old_len, new_len, flags, new_addr);
    }
    let _g = Guard::enter();
    let start = old as usize;
    let (Some(old_len_r), Some(new_len_r)) = (page_round_up(old_len), page_round_up(new_len)) else {
        return real::sys_mremap(old, old_len, new_len, flags, new_addr);
    };
    let Some(end) = start.checked_add(old_len_r) else {
        return real::sys_mremap(old, old_len, new_len, flags, new_addr);
    };
    if start % uswap::PAGE_SIZE != 0 || old_len == 0 || !overlaps_managed(start, end) {
        return real::sys_mremap(old, old_len, new_len, flags, new_addr);
    }
    let special = libc::MREMAP_FIXED | libc::MREMAP_DONTUNMAP;
    if flags & special != 0 || new_len == 0 {
        // Not supported on managed memory: fail as the kernel does for what it cannot do.
        set_errno(libc::EINVAL);
        return libc::MAP_FAILED;
    }
    if new_len_r <= old_len_r {
        // Shrink in place: the tail goes (the engine handles the UNMAP event).
        if new_len_r < old_len_r && real::sys_munmap((start + new_len_r) as *mut c_void, old_len_r - new_len_r) != 0 {
            return libc::MAP_FAILED;
        }
        return old;
    }
    if flags & libc::MREMAP_MAYMOVE == 0 {
        // Growing in place is never attempted on managed memory; the kernel may refuse it
        // too, and callers must handle that.
        set_errno(libc::ENOMEM);
        return libc::MAP_FAILED;
    }
    let Some(cfg) = config() else { return libc::MAP_FAILED };
    let Some(new) = map_managed(&cfg, new_len_r) else {
        set_errno(libc::ENOMEM);
        return libc::MAP_FAILED;
    };
    // SAFETY: `old` is mapped for old_len bytes (the caller's contract, as for mremap) and
    // `new` is a fresh mapping of new_len_r > old_len bytes; they cannot overlap. Reading old
    // pages faults them in through the engine; writing new ones faults them in zero-filled.
    unsafe { std::ptr::copy_nonoverlapping(old as *const u8, new as *mut u8, old_len) };
    drop(_g);
    munmap(old, old_len);
    new
}

fn set_errno(e: i32) {
    // SAFETY: __errno_location returns the calling thread's errno slot.
    unsafe { *libc::__errno_location() = e };
}
