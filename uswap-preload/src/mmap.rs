//! The program's own anonymous mappings: `mmap`, `mprotect` and `madvise`, interposed
//! (`munmap` is [`crate::munmap`]'s, `mremap` [`crate::mremap`]'s).
//!
//! Every private anonymous mapping that is not executable, not a stack and not huge-page
//! memory is managed once it is at least `--min-size` bytes, however the program asks for
//! it ([`plan`]):
//! * read-write with no address asked for: a region the engine maps (`Pager::map`);
//! * anything else (a `PROT_NONE` reservation, an address hint, `MAP_FIXED_NOREPLACE`):
//!   the kernel maps it as asked, but for `MAP_POPULATE` (its pages come in on first touch,
//!   under the budget, not all at once over it), and the pager takes it over
//!   (`Pager::adopt`). A reservation's pages are paged once the program makes them
//!   accessible, with `mprotect` (the registration survives it) or with `mmap(MAP_FIXED)`;
//! * fresh anonymous memory mapped `MAP_FIXED` over managed memory, whatever its size (a
//!   runtime committing or uncommitting part of its reservation): the kernel replaces the
//!   pages (its `UNMAP` event frees what they held) and they become the region's again,
//!   reading zero (`Region::adopt_range`).
//!
//! A process waiting for its pager (lazy start, see the crate's doc) maps what would be a
//! region of its own ([`Plan::Map`]) as the kernel's, ordinary memory, while what it holds
//! stays under `--start-after` and its tree's charge under half the limit: the mapping is
//! noted ("deferred"), charged to the tree with the heap (`waiting_charge`), and taken
//! over as a region when the pager starts ([`adopt_deferred`]). CPython maps its object
//! arenas itself, 1 MiB at a time; its first one started a pager before. An `munmap` of
//! deferred memory goes to the kernel (what goes is no longer noted nor charged), and so
//! does an `mprotect` to read-only or executable (such memory is let go of when managed);
//! an `mremap` or `mmap(MAP_FIXED)` over it, advice about forks or huge pages and `mlock`
//! start the pager first, and are then made as on managed memory. Any other mapping that
//! would be managed still starts the pager at once, as does one the process cannot defer
//! (`MAP_LOCKED`, `MAP_NORESERVE`, past `--start-after`).
//!
//! Everything else passes straight to the kernel: file and shared mappings, executable
//! memory (reclaim moves pages into read-write staging pages, and the kernel moves only
//! between equal protections), stacks (`MAP_STACK`, `MAP_GROWSDOWN`, and thread stacks,
//! which glibc maps with internal calls no interposition sees), huge pages, and small
//! mappings.
//!
//! The table of managed mappings ([`crate::managed_table`]: by start, at most
//! [`MAX_MAPPINGS`] entries, the engine's own region limit minus the heap) is behind one
//! mutex, taken only by the interposed `mmap`, `munmap` ([`crate::munmap`]), `mremap`
//! ([`crate::mremap`]) and `madvise`, the pager's start, fork's handlers and the report of
//! unmanaged memory; a region is dropped outside it. `munmap`
//! ([`crate::munmap`]) of a whole managed mapping drops its region (its slots are freed at
//! once); `munmap` of a part goes to the kernel, whose `UFFD_EVENT_UNMAP` the engine
//! handles, and a mapping left with no page of its own is dropped (its addresses may be
//! handed out again). `mremap` of managed memory is done by the library, by mapping the new
//! place through the same rules and copying ([`crate::mremap`]).
//! The kernel's `mremap` of part of a region would leave the moved part as ordinary memory
//! (the engine copies its pages into place and lets it go, see `uswap/src/events.rs`),
//! which would take it out of the budget.

use std::ffi::c_void;
use std::sync::Mutex;

use crate::managed_table::{Entry, Table};
use crate::own_code::{in_uswap, Guard};
use crate::real::{self, errno, set_errno};

/// At most this many managed mappings at once; more are ordinary memory (counted). Past
/// the kernel's default `vm.max_map_count` (65,530 mappings in all); the engine's regions
/// hold them and the heap's own.
pub const MAX_MAPPINGS: usize = 65_000;
const _: () = assert!(MAX_MAPPINGS + 256 <= uswap::MAX_REGIONS);

static TABLE: Mutex<Table> = Mutex::new(Table::new());

pub(crate) struct Config {
    pager: &'static uswap::Pager,
    min_size_bytes: usize,
}

static MIN_SIZE_BYTES: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(usize::MAX);

/// The configuration while this process is managed: none before start-up and in a fork
/// child that could not get a pager of its own (whose mappings are all ordinary; see
/// `fork`).
pub(crate) fn config() -> Option<Config> {
    let min_size_bytes = MIN_SIZE_BYTES.load(std::sync::atomic::Ordering::Acquire);
    if min_size_bytes == usize::MAX {
        return None;
    }
    Some(Config { pager: crate::pager()?, min_size_bytes })
}

/// Mappings left ordinary because the table was full or the pager refused them.
pub static UNMANAGED: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// Lazy start: maps what would be a region of its own as ordinary memory, deferred (see
/// the module's comment), if the process may go on waiting with it: what it holds stays
/// under `--start-after`, its tree's charge under half the limit, and the mapping is not
/// locked (`MAP_LOCKED`: the kernel moves no locked page) nor a sparse reservation
/// (`MAP_NORESERVE`: charged whole, it would hold the tree's budget for nothing). `None`:
/// the pager must start first. The caller checked the plan ([`Plan::Map`]).
fn map_deferred(len: usize, prot: i32, flags: i32) -> Option<*mut c_void> {
    let cfg = crate::config()?;
    let len_r = page_round_up(len)?;
    let holds = crate::waiting_charge::waiting_bytes().saturating_add(len_r);
    if !crate::own_process::is_own_process()
        || flags & (libc::MAP_LOCKED | libc::MAP_NORESERVE) != 0
        || holds >= cfg.start_after_bytes
        || crate::waiting_charge::tree_wants_pagers()
        || crate::waiting_charge::unchargeable()
        || !crate::waiting_charge::room_for_deferred()
    {
        return None;
    }
    let p = real::sys_mmap(std::ptr::null_mut(), len, prot, flags, -1, 0);
    if p == libc::MAP_FAILED {
        return Some(p);
    }
    // As the pager's own regions: it takes the mapping over in 4 KiB pages.
    real::sys_madvise(p, len_r, libc::MADV_NOHUGEPAGE);
    match crate::waiting_charge::note_deferred(p as usize, len_r) {
        Some(start_now) => {
            if start_now {
                // The tree's charge reached half its limit (or there is no tree to charge,
                // found as this mapping passed 16 MiB): the pager starts now, and takes this
                // mapping over with the others.
                crate::start_if_waiting(crate::waiting_charge::start_cause());
            }
            Some(p)
        }
        None => {
            real::sys_munmap(p, len_r);
            None
        }
    }
}

/// At the pager's start: the mappings the process deferred become regions of its own
/// (`Pager::adopt`, which takes the pages they hold). One the pager refuses (the program
/// changed it into something userfaultfd cannot manage) stays ordinary memory (counted).
pub fn adopt_deferred(pager: &'static uswap::Pager) {
    let deferred = crate::waiting_charge::take_deferred();
    let mut table = TABLE.lock().unwrap_or_else(|e| e.into_inner());
    for (start, end) in deferred {
        let len = end - start;
        if table.len() >= MAX_MAPPINGS {
            count_table_full(len);
            continue;
        }
        match pager.adopt(start, len) {
            Ok(region) => table.insert(Entry::new(start, len, region)),
            Err(_) => count_unmanaged(),
        }
    }
}

pub fn start(min_size_bytes: usize) {
    MIN_SIZE_BYTES.store(min_size_bytes, std::sync::atomic::Ordering::Release);
}

/// The table, locked across a `fork` (from the prepare handler to the parent's and the
/// child's): no thread is inside it when the child is made, and the child re-arms it.
pub struct TableHold(std::sync::MutexGuard<'static, Table>);

pub fn hold_for_fork() -> TableHold {
    TableHold(TABLE.lock().unwrap_or_else(|e| e.into_inner()))
}

impl TableHold {
    /// In a fork child: each managed mapping takes its re-armed region (matched by start);
    /// the parent's handles are forgotten, never dropped (their pager is the parent's). A
    /// mapping without a new region leaves the table and stays ordinary memory.
    pub fn rearm(mut self, regions: &mut Vec<(usize, uswap::Region)>) {
        self.0.rearm(regions, uswap::Region::len);
    }
}

/// Bytes currently managed through `mmap` (the heap's region not included).
pub fn managed_bytes() -> usize {
    TABLE.lock().unwrap_or_else(|e| e.into_inner()).bytes()
}

pub(crate) fn page_round_up(n: usize) -> Option<usize> {
    n.checked_next_multiple_of(uswap::PAGE_SIZE)
}

/// The kernel's `TASK_SIZE` for this process (x86-64): the end of the address space it
/// maps for user space, 128 TiB less a page with four-level page tables, 64 PiB less a page with
/// five (which take a mapping at 128 TiB when it is asked for by address). Found once,
/// by asking for that page. Allocation-free; a race computes the same value twice.
pub(crate) fn user_space_top() -> usize {
    use std::sync::atomic::{AtomicUsize, Ordering};
    static TOP: AtomicUsize = AtomicUsize::new(0);
    let top = TOP.load(Ordering::Relaxed);
    if top != 0 {
        return top;
    }
    const LOW_TOP: usize = (1 << 47) - uswap::PAGE_SIZE;
    const HIGH_TOP: usize = (1 << 56) - uswap::PAGE_SIZE;
    let probe = LOW_TOP + uswap::PAGE_SIZE;
    let flags = libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_FIXED_NOREPLACE;
    let saved_errno = errno();
    let p = real::sys_mmap(probe as *mut c_void, uswap::PAGE_SIZE, libc::PROT_NONE, flags, -1, 0);
    // Taken already (`EEXIST`): only five-level tables map anything there.
    let five_level = p as usize == probe || (p == libc::MAP_FAILED && errno() == libc::EEXIST);
    let top = if five_level { HIGH_TOP } else { LOW_TOP };
    if p != libc::MAP_FAILED {
        // The probe, or wherever a kernel that ignores the address put the page.
        real::sys_munmap(p, uswap::PAGE_SIZE);
    }
    set_errno(saved_errno);
    TOP.store(top, Ordering::Relaxed);
    top
}

/// What the interposed `mmap` does with a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Plan {
    /// A fresh managed region, placed by the engine (`Pager::map`).
    Map,
    /// The kernel maps it as asked, then the pager takes the result over: a reservation
    /// (`PROT_NONE`), memory at an address the program chose, or fresh memory over managed
    /// memory (`MAP_FIXED`), which becomes that region's again.
    MapThenAdopt,
    /// Passed to the kernel and left alone.
    Plain,
}

fn plan(addr: *mut c_void, len: usize, prot: i32, flags: i32, min_size_bytes: usize) -> Plan {
    // The mapping type is a 4-bit field (MAP_SHARED_VALIDATE = MAP_SHARED | MAP_PRIVATE),
    // not flags: compare it whole.
    const MAP_TYPE: i32 = 0x0f;
    let never = libc::MAP_STACK | libc::MAP_GROWSDOWN | libc::MAP_HUGETLB;
    // Executable memory is left alone: reclaim moves pages into read-write staging pages,
    // and the kernel moves only between mappings of equal protection.
    let anonymous_private = flags & libc::MAP_ANONYMOUS != 0
        && flags & MAP_TYPE == libc::MAP_PRIVATE
        && flags & never == 0
        && prot & libc::PROT_EXEC == 0
        && len > 0;
    if !anonymous_private {
        if flags & libc::MAP_ANONYMOUS != 0 && flags & (libc::MAP_STACK | libc::MAP_GROWSDOWN) != 0 {
            STACK_MAPPED_BYTES.fetch_add(len as u64, std::sync::atomic::Ordering::Relaxed);
        }
        return Plan::Plain;
    }
    // The kernel places the mapping where the program asked (`MAP_32BIT`: below 2 GiB, as a
    // JIT with 32-bit pointers needs), then it is adopted; a region uswap maps lies anywhere.
    let placed = flags & (libc::MAP_FIXED | libc::MAP_FIXED_NOREPLACE | libc::MAP_32BIT) != 0;
    if addr.is_null() && !placed && prot == libc::PROT_READ | libc::PROT_WRITE && len >= min_size_bytes {
        return Plan::Map;
    }
    let over_managed = flags & libc::MAP_FIXED != 0
        && page_round_up(len)
            .and_then(|l| (addr as usize).checked_add(l))
            .is_some_and(|end| overlaps_managed(addr as usize, end));
    if len >= min_size_bytes || over_managed {
        return Plan::MapThenAdopt;
    }
    SMALL_MAPPED_BYTES.fetch_add(len as u64, std::sync::atomic::Ordering::Relaxed);
    Plan::Plain
}

/// Bytes of the program's anonymous private mappings left ordinary because they were
/// smaller than `--min-size`, all that were ever made: the kernel merges neighbouring ones
/// into one mapping (Ruby's 16 KiB heap pages: 30 MiB in one), which a report of unmanaged
/// memory then tells apart from memory mapped where uswap does not see it
/// (`unmanaged::why`).
pub static SMALL_MAPPED_BYTES: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// Bytes of the program's own stacks (`MAP_STACK`, `MAP_GROWSDOWN`), never managed, all
/// that were ever made: a hint for the report of unmanaged memory, as the above.
pub static STACK_MAPPED_BYTES: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// Bytes of mappings left ordinary because the table already held [`MAX_MAPPINGS`], all
/// that were ever refused so (V8 makes each 256 KiB page of its heap a mapping of its own):
/// how a report of unmanaged memory tells them apart (`unmanaged::why`).
pub static TABLE_FULL_BYTES: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// A mapping stays ordinary memory: the table was full or the pager refused it.
fn count_unmanaged() {
    UNMANAGED.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
}

/// A mapping of `len` bytes stays ordinary memory because the table is full: said once, at
/// the first (the exit report then names such mappings, `unmanaged::why`).
fn count_table_full(len: usize) {
    if TABLE_FULL_BYTES.fetch_add(len as u64, std::sync::atomic::Ordering::Relaxed) == 0 {
        // Allocation-free: under the table's lock, inside the program's mmap.
        real::write_stderr(
            b"uswap: this process has 65000 managed mappings, the most uswap keeps: its next ones stay \
              ordinary memory, outside the limit (docs/cli.md, \"Not managed\")\n",
        );
    }
    count_unmanaged();
}

/// Maps a managed region of `len` bytes, or `None` to fall back to an ordinary mapping.
fn map_managed(cfg: &Config, len: usize) -> Option<*mut c_void> {
    map_managed_aligned(cfg, len, uswap::PAGE_SIZE)
}

/// As [`map_managed`], starting at a multiple of `align_bytes` (a power of two, at least a
/// page).
fn map_managed_aligned(cfg: &Config, len: usize, align_bytes: usize) -> Option<*mut c_void> {
    let len = page_round_up(len)?;
    let mut table = TABLE.lock().unwrap_or_else(|e| e.into_inner());
    if table.len() >= MAX_MAPPINGS {
        count_table_full(len);
        return None;
    }
    match cfg.pager.map_aligned(len, align_bytes) {
        Ok(region) => {
            let start = region.as_ptr() as usize;
            table.insert(Entry::new(start, len, region));
            Some(start as *mut c_void)
        }
        Err(_) => {
            count_unmanaged();
            None
        }
    }
}

/// The kernel mapped `[start, start + len)` as the program asked (anonymous, private, not
/// executable): fresh memory over managed memory becomes those regions' pages again, and
/// anything else of at least `--min-size` becomes a region of its own. What the pager
/// refuses stays the program's ordinary memory (counted). A reservation (`PROT_NONE`) has
/// no page present to look for: GHC's runtime reserves 1 TiB, which `mincore` takes
/// hundreds of milliseconds to go through.
fn adopt(cfg: &Config, start: usize, len: usize, fixed: bool, reserved: bool) {
    let Some(len) = page_round_up(len) else { return };
    let end = start + len;
    let mut table = TABLE.lock().unwrap_or_else(|e| e.into_inner());
    let mut over_managed = false;
    if fixed {
        for e in table.meeting(start, end) {
            over_managed = true;
            // What the entry still covers: what it lost at its ends may be another's now.
            let (from, to) = (start.max(e.start), end.min(e.end()));
            if e.region.adopt_range(from, to - from).is_err() {
                count_unmanaged();
            }
        }
    }
    if over_managed {
        // Parts outside every entry stay ordinary (a program mapping across the end of a
        // region it reserved, or over pages an entry lost at its ends).
        return;
    }
    if len < cfg.min_size_bytes {
        count_unmanaged();
        return;
    }
    if table.len() >= MAX_MAPPINGS {
        count_table_full(len);
        return;
    }
    let touched_bytes = if reserved { 0 } else { len };
    match cfg.pager.adopt_touched_prefix(start, len, touched_bytes) {
        Ok(region) => table.insert(Entry::new(start, len, region)),
        Err(_) => {
            count_unmanaged();
        }
    }
}

/// Takes the entries that meet `[start, end)` out of the table without dropping their
/// regions: in a fork child without a pager they are its parent's, and no engine here may
/// touch them.
pub fn forget_entries(start: usize, end: usize) {
    let taken = TABLE.lock().unwrap_or_else(|e| e.into_inner()).take_meeting(start, end, |_| true);
    for entry in taken {
        std::mem::forget(entry);
    }
}

/// A managed mapping of `len` bytes for the heap's largest blocks (see `heap::huge`), or
/// `None` when this process is not managed or the pager refuses it.
pub fn map_for_heap(len: usize, align_bytes: usize) -> Option<*mut c_void> {
    crate::start_if_waiting(crate::StartCause::Mapping(len));
    let cfg = config()?;
    let _g = Guard::enter();
    map_managed_aligned(&cfg, len, align_bytes)
}

/// The length of the managed mapping that starts exactly at `start`, if there is one.
pub fn managed_len(start: usize) -> Option<usize> {
    TABLE.lock().unwrap_or_else(|e| e.into_inner()).starting_at(start).map(|e| e.len)
}

/// `mmap` for a managed process, on the program's behalf (the caller holds a [`Guard`]).
pub(crate) fn map(
    cfg: &Config,
    addr: *mut c_void,
    len: usize,
    prot: i32,
    flags: i32,
    fd: i32,
    off: libc::off_t,
) -> *mut c_void {
    match plan(addr, len, prot, flags, cfg.min_size_bytes) {
        Plan::Map => {
            if let Some(p) = map_managed(cfg, len) {
                return p;
            }
        }
        Plan::MapThenAdopt => {
            // Without `MAP_POPULATE`: the kernel would fault in every page before the pager
            // adopts them, all over the limit at once (stress-ng's mmap stressor, 256 MiB
            // with an address hint, resident under 64 MiB). They come in on first touch,
            // under the budget, as in a region uswap maps (`Plan::Map`), which is all the
            // flag changes for anonymous memory; `MAP_LOCKED` still brings them in.
            let flags = flags & !libc::MAP_POPULATE;
            let p = real::sys_mmap(addr, len, prot, flags, fd, off);
            if p != libc::MAP_FAILED {
                adopt(cfg, p as usize, len, flags & libc::MAP_FIXED != 0, prot == libc::PROT_NONE);
            }
            return p;
        }
        Plan::Plain => {}
    }
    real::sys_mmap(addr, len, prot, flags, fd, off)
}

#[no_mangle]
pub extern "C" fn mmap(addr: *mut c_void, len: usize, prot: i32, flags: i32, fd: i32, off: libc::off_t) -> *mut c_void {
    program_mmap(addr, len, prot, flags, fd, off)
}

/// The program's `mmap` and `mmap64`. A function of its own: a call from inside this library
/// to the symbol `mmap` is linked to the kernel's (`__wrap_mmap`, see `build.rs`).
fn program_mmap(addr: *mut c_void, len: usize, prot: i32, flags: i32, fd: i32, off: libc::off_t) -> *mut c_void {
    if !in_uswap() && !uswap::is_engine_thread() {
        if crate::is_waiting() {
            // Lazy start: a mapping that would be managed is deferred while the process
            // may go on waiting, and starts the pager otherwise. Shared anonymous memory
            // too: it is never managed, but a process with a pager measures it as
            // unmanaged and reports it (`--strict`).
            let min_size_bytes = crate::config().map_or(usize::MAX, |c| c.min_size_bytes);
            let plan = plan(addr, len, prot, flags, min_size_bytes);
            if plan == Plan::Map {
                if let Some(p) = map_deferred(len, prot, flags) {
                    return p;
                }
            }
            let small = flags & libc::MAP_ANONYMOUS != 0 && len < min_size_bytes;
            if small && flags & libc::MAP_SHARED == 0 && prot != libc::PROT_NONE {
                crate::waiting_charge::note_small_mapping(len, true);
            }
            let anonymous = flags & libc::MAP_ANONYMOUS != 0 && len >= min_size_bytes;
            let fixed = flags & libc::MAP_FIXED != 0;
            let over_deferred = fixed && crate::waiting_charge::overlaps_deferred(addr as usize, len);
            if anonymous || plan != Plan::Plain || over_deferred {
                crate::start_if_waiting(crate::StartCause::Mapping(len));
            }
            if over_deferred && crate::is_waiting() {
                // Put off: mapped as the kernel's over deferred memory, which is no longer it.
                let p = real::sys_mmap(addr, len, prot, flags, fd, off);
                if p != libc::MAP_FAILED {
                    crate::waiting_charge::trim_deferred(p as usize, page_round_up(len).unwrap_or(len));
                }
                return p;
            }
        }
        // A start on another thread: the mapping is made on the pager it starts.
        crate::wait_for_start();
        if let Some(cfg) = config() {
            let _g = Guard::enter();
            let p = map(&cfg, addr, len, prot, flags, fd, off);
            if flags & libc::MAP_LOCKED != 0 && p != libc::MAP_FAILED {
                // An `mlock` made with the mapping: its pages stay resident once touched.
                let kind = uswap::mlock::LockKind::Program;
                crate::mlock::lock_if_managed(kind, p as usize, (p as usize).saturating_add(len));
            }
            return p;
        }
    }
    real::sys_mmap(addr, len, prot, flags, fd, off)
}

/// `mmap` as called from inside this library (linked with `--wrap=mmap`, see `build.rs`):
/// mimalloc's own mappings, the engine's and the Rust runtime's go to the kernel as asked.
#[no_mangle]
pub extern "C" fn __wrap_mmap(
    addr: *mut c_void,
    len: usize,
    prot: i32,
    flags: i32,
    fd: i32,
    off: libc::off_t,
) -> *mut c_void {
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
    program_mmap(addr, len, prot, flags, fd, off)
}

/// Removes and returns the managed entries inside `[start, end)`; reports whether any entry
/// only partly overlaps it.
pub(crate) fn take_covered(start: usize, end: usize) -> (Vec<Entry>, bool) {
    let mut partial = false;
    let taken = TABLE.lock().unwrap_or_else(|e| e.into_inner()).take_meeting(start, end, |e| {
        let inside = e.start >= start && e.end() <= end;
        partial |= !inside;
        inside
    });
    (taken, partial)
}

/// After the program unmapped `[start, end)`, part of some managed mappings: drops the
/// entries overlapping it that have no page left (the program unmapped them piece by
/// piece), and trims the others that lost their first or last pages (`Table::trim`): the
/// addresses gone may be handed out again, and must not still look managed.
pub(crate) fn forget_unmapped(start: usize, end: usize) {
    let mut table = TABLE.lock().unwrap_or_else(|e| e.into_inner());
    let emptied = table.take_meeting(start, end, |e| !e.region.has_live_pages());
    table.trim(start, end, uswap::Region::owns_any_in);
    drop(table);
    // Outside the table's lock: a region's drop reaches the engine's locks.
    drop(emptied);
}

/// Whether any managed mapping meets `[start, end)`.
pub(crate) fn overlaps_managed(start: usize, end: usize) -> bool {
    TABLE.lock().unwrap_or_else(|e| e.into_inner()).meets_any(start, end)
}

/// `mprotect`: managed memory made executable (a JIT's code buffer, mapped read-write and
/// then made executable) or read-only (a table sealed once built) is let go of first
/// (`Pager::unmanage`: its pages come back into place and it becomes ordinary memory,
/// reported as unmanaged): the kernel moves pages only between mappings of equal
/// protection, so reclaim could never move it out again, and met a refusal per page per
/// round (QEMU's 1 GiB TCG buffer: hundreds of thousands; 32 MiB made read-only held a
/// 16 MiB limit at 51 MiB, `read_only_memory_is_let_go_of_and_the_limit_holds`).
/// `PROT_NONE` is left managed: runtimes uncommit their heaps that way, and discard the
/// pages too.
#[no_mangle]
pub extern "C" fn mprotect(addr: *mut c_void, len: usize, prot: i32) -> i32 {
    protect(addr, len, prot, || real::sys_mprotect(addr, len, prot))
}

/// `pkey_mprotect`, as [`mprotect`].
#[no_mangle]
pub extern "C" fn pkey_mprotect(addr: *mut c_void, len: usize, prot: i32, pkey: i32) -> i32 {
    // SAFETY: the pkey_mprotect system call; the kernel validates every argument.
    let call = || unsafe { libc::syscall(libc::SYS_pkey_mprotect, addr as usize, len, prot, pkey) as i32 };
    protect(addr, len, prot, call)
}

/// `call`, the program's `mprotect` of `[addr, addr + len)` to `prot`, with what it does to
/// memory uswap pages (see [`mprotect`]).
fn protect(addr: *mut c_void, len: usize, prot: i32, call: impl Fn() -> i32 + Copy) -> i32 {
    let executable = prot & libc::PROT_EXEC != 0;
    let read_only = prot & (libc::PROT_READ | libc::PROT_WRITE) == libc::PROT_READ;
    if !(executable || read_only) || in_uswap() || uswap::is_engine_thread() {
        return call();
    }
    if config().is_none() {
        // What a waiting process deferred there is let go of as below: it stays the
        // kernel's. Only what the kernel changed: a refused call (`EINVAL`: an address not
        // page-aligned) changed nothing, one that met a hole (`ENOMEM`) changed what lies
        // before it, nothing if the hole is where it starts.
        let changed = |r: i32, e: i32| r == 0 || (e == libc::ENOMEM && is_mapped(addr as usize));
        match crate::waiting_charge::call_on_deferred(addr as usize, len, call, changed) {
            Some((r, e)) => {
                set_errno(e);
                return r;
            }
            None => crate::wait_for_start(),
        }
    }
    let Some(cfg) = config() else { return call() };
    let regions_met = {
        let _g = Guard::enter();
        // Failing, the memory stays managed (and its pages refused by reclaim, counted).
        cfg.pager.unmanage(addr as usize, len).is_ok_and(|nr_pages| nr_pages > 0)
    };
    // Outside the guard: a handler of the program's that runs during the call is the
    // program's.
    let r = call();
    let end = (addr as usize).saturating_add(len);
    // Kept once (a JIT flips its code pages between writable and executable).
    if regions_met && r == 0 && !LET_GO_BY_PROTECTION.overlaps(addr as usize, end) {
        LET_GO_BY_PROTECTION.keep(addr as usize, len);
    }
    r
}

/// Ranges [`protect`] let go of, for the report of unmanaged memory: made writable again,
/// such a range stays the kernel's, and `/proc` no longer says why.
pub(crate) static LET_GO_BY_PROTECTION: crate::let_go::LetGoRanges<64> = crate::let_go::LetGoRanges::new();

/// Whether `[start, end)` overlaps memory uswap let go of because the program made it
/// read-only or executable.
pub fn let_go_by_protection(start: usize, end: usize) -> bool {
    LET_GO_BY_PROTECTION.overlaps(start, end)
}

/// `madvise`: what asks the kernel to change how managed memory is paged is left out, with
/// success: `MADV_HUGEPAGE` (regions are paged in 4 KiB pages; a huge page collapsed in
/// one must be split before any of its pages can move out) and `MADV_MERGEABLE` (pages KSM
/// merged are shared, and the kernel refuses to move them). QEMU asks for both on guest
/// RAM: before, reclaim met hundreds of thousands of refusals and the limit did not hold.
/// `MADV_COLLAPSE` too. `MADV_GUARD_INSTALL` empties the range for the engine first (see
/// below). Advice about forks (`MADV_DONTFORK`, `MADV_WIPEONFORK` and their undoing) goes to the
/// kernel and is recorded for uswap's own fork (`uswap::note_madvise`). In signal mode
/// `MADV_POPULATE_READ` and `MADV_POPULATE_WRITE` of managed memory have its pages brought
/// in first (see [`populate`]). Everything else goes to the kernel (`MADV_DONTNEED` and the
/// like reach the engine as events).
#[no_mangle]
pub extern "C" fn madvise(addr: *mut c_void, len: usize, advice: i32) -> i32 {
    if !in_uswap() && !uswap::is_engine_thread() && advice_needs_a_pager(advice) {
        // On a deferred mapping of a waiting process: made as on managed memory.
        crate::waiting_charge::start_if_deferred(addr as usize, len);
    }
    let ours = !in_uswap() && !uswap::is_engine_thread() && config().is_some();
    let paging_advice = advice == libc::MADV_HUGEPAGE || advice == libc::MADV_MERGEABLE;
    let start = addr as usize;
    let managed =
        || page_round_up(len).and_then(|l| start.checked_add(l)).is_some_and(|end| overlaps_managed(start, end));
    if paging_advice && ours && managed() {
        return 0;
    }
    if advice == MADV_COLLAPSE && ours && managed() {
        // As `MADV_HUGEPAGE`: a hint (the kernel refuses it on userfaultfd memory, `EINVAL`).
        return 0;
    }
    if advice == MADV_GUARD_INSTALL && ours && managed() {
        // The kernel zaps the range's pages for its guards without telling userfaultfd, so
        // the pages that were out would come back after `MADV_GUARD_REMOVE` with their old
        // contents instead of zeros. `MADV_DONTNEED` first tells the engine (a `REMOVE`
        // event: their slots go), and zaps nothing the guards would not.
        real::sys_madvise(addr, len, libc::MADV_DONTNEED);
    }
    let populating = advice == MADV_POPULATE_READ || advice == MADV_POPULATE_WRITE;
    let signal_mode = crate::pager().is_some_and(|p| p.fault_mode() == uswap::FaultMode::Signal);
    if populating && ours && signal_mode && managed() {
        return populate(start, len, advice);
    }
    let r = real::sys_madvise(addr, len, advice);
    if r == 0 && ours {
        // The record is the engine's: from the C library's heap, never the managed one.
        let _g = Guard::enter();
        uswap::note_madvise(addr as usize, len, advice);
    }
    r
}

/// Advice [`madvise`] handles, or records, for managed memory (huge pages and merging, forks,
/// populating), which a deferred mapping must be managed memory to get.
fn advice_needs_a_pager(advice: i32) -> bool {
    matches!(
        advice,
        libc::MADV_HUGEPAGE
            | libc::MADV_MERGEABLE
            | libc::MADV_DONTFORK
            | libc::MADV_DOFORK
            | libc::MADV_WIPEONFORK
            | libc::MADV_KEEPONFORK
            | MADV_POPULATE_READ
            | MADV_POPULATE_WRITE
    )
}

const MADV_COLLAPSE: i32 = 25;
const MADV_GUARD_INSTALL: i32 = 102;
const MADV_POPULATE_READ: i32 = 22;
const MADV_POPULATE_WRITE: i32 = 23;

/// Signal mode's `MADV_POPULATE_READ`/`_WRITE` of managed memory. The kernel populates with
/// faults of its own, which signal mode cannot serve: the call failed with `EFAULT`. So each
/// window of the range is brought in (for writing, for `_WRITE`) and pinned, then handed to
/// the kernel, which finds its pages present (`uswap::populate_in_windows`).
fn populate(start: usize, len: usize, advice: i32) -> i32 {
    let r = uswap::populate_in_windows(start, len, |pin, at, n| {
        let _ = uswap::prepare_user_access(pin, at, n, advice == MADV_POPULATE_WRITE);
        i64::from(real::sys_madvise(at as *mut c_void, n, advice))
    });
    // What `sys_madvise` returned (0 or -1), widened and back.
    r as i32
}

/// Whether the page at `addr` is mapped (`mincore` fails with `ENOMEM` on a hole).
fn is_mapped(addr: usize) -> bool {
    let page = addr & !(uswap::PAGE_SIZE - 1);
    let mut vec = [0u8; 1];
    // SAFETY: mincore reads the page tables of one page and writes one byte into `vec`.
    unsafe { libc::mincore(page as *mut c_void, uswap::PAGE_SIZE, vec.as_mut_ptr()) == 0 }
}
