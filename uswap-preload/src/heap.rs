//! The program's heap: `malloc` and its family, served by mimalloc from one managed region.
//!
//! glibc's malloc reaches the kernel through internal calls (`__mmap`, `brk`) that no symbol
//! interposition sees, so managing its memory means replacing it. mimalloc is given the
//! managed region as its arenas (`mi_manage_memory`) and told never to ask the OS for
//! more (`disallow_os_alloc`): every block the program allocates lies in the region, and
//! when mimalloc gives pages back (`MADV_DONTNEED` on a purge) the engine sees the
//! `UFFD_EVENT_REMOVE` and frees their slots. Far below the limit, a purge of an arena
//! handed before the pager started keeps its pages instead ([`commit`]).
//!
//! Who is served from where (the routing rule, [`managed_caller`]): application threads get
//! the managed heap once it is up; uswap's engine threads, this library's own code (the
//! thread-local [`Guard`]), the dynamic linker and anything before start-up get the C
//! library's malloc (`real`). `free` and friends route by address: a block in the arena goes
//! back to mimalloc whichever thread frees it.
//!
//! Why the dynamic linker's blocks stay unmanaged: among them are every thread's DTV (the
//! table `__tls_get_addr` reads on each access to a thread-local of a shared library) and
//! the TLS bookkeeping of `dlopen`. uswap's own thread-locals (the SIGBUS handler's, the
//! system-call entry's) are read through them. A thread made by calling the C library's
//! `pthread_create` directly (jemalloc's background threads find it with
//! `dlsym(RTLD_NEXT)`) had its DTV in the managed heap; once it was swapped out, the
//! thread's next system call faulted on it, and the handler's own thread-local faulted again
//! inside the handler: redis-server died of SIGBUS. `malloc`, `calloc` and `realloc` look at
//! their return address (the dynamic linker calls exactly these) and serve a caller inside
//! the dynamic linker from the C library's heap.
//!
//! **The C library's heap first** (lazy start): a process that waits for its pager leaves its
//! first blocks to the C library's malloc, within what its tree grants it
//! ([`crate::c_library_heap`]), and mimalloc is brought up ([`bring_up`]) only when an
//! allocation would take them past that, or when the pager starts for another cause. The
//! blocks from before the bring-up stay in the C library's heap, outside the budget, and
//! are reported with the unmanaged memory while they live ([`c_library_heap_bytes`]);
//! `free` routes them back by address as before. mimalloc has no ELF constructor in this
//! build (`.cargo/config.toml`): [`start`] runs its start, and its exit-time collection is
//! not run at all (it would give back, range by range, memory the process is about to
//! drop).
//!
//! mimalloc caps one arena at 16 GiB, so the largest single allocation is a little under
//! 16 GiB ([`MAX_ARENA_BYTES`]). The region is handed over in pieces as the heap grows ([`grow`], on an allocation mimalloc could not place), doubling
//! from [`FIRST_ARENA_BYTES`].

use std::ffi::c_void;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

use libmimalloc_sys as mi;

/// mimalloc 3's option numbers (its `mi_option_t`), where the Rust bindings lack a name.
const MI_OPTION_DISALLOW_OS_ALLOC: mi::mi_option_t = 17;
const MI_OPTION_ALLOW_LARGE_OS_PAGES: mi::mi_option_t = 6;
const MI_OPTION_RESERVE_HUGE_OS_PAGES: mi::mi_option_t = 7;
const MI_OPTION_RESERVE_OS_MEMORY: mi::mi_option_t = 9;
const MI_OPTION_ARENA_RESERVE: mi::mi_option_t = 23;
const MI_OPTION_ARENA_MAX_OBJECT_SIZE: mi::mi_option_t = 45;
const MI_OPTION_PURGE_DELAY: mi::mi_option_t = 15;

/// How long mimalloc keeps freed pages before giving them back (`MADV_DONTNEED`), in ms.
/// mimalloc 3's default is 1000. Under a budget a freed page kept is a page charged, then
/// compressed and stored when it is evicted: sqlite3 under 128 MiB swapped out 416k pages
/// with 1000 ms and 351k with 10 ms (managed peak 374-403 MiB against 362), at the same wall
/// time. 10 ms is mimalloc 2's default. `MIMALLOC_PURGE_DELAY` in the environment wins.
const PURGE_DELAY_MS: std::ffi::c_long = 10;

/// mimalloc's `mi_commit_fun_t`: `bool (bool commit, void* start, size_t size, bool*
/// is_zero, void* user_arg)`.
type CommitFn = extern "C" fn(bool, *mut c_void, usize, *mut bool, *mut c_void) -> bool;

extern "C" {
    /// `bool mi_manage_memory(void* start, size_t size, bool is_committed, bool is_pinned,
    /// bool is_zero, int numa_node, bool exclusive, mi_commit_fun_t* commit_fun, void*
    /// commit_fun_arg, mi_arena_id_t* arena_id)`: an arena whose commits and decommits
    /// mimalloc asks of `commit_fun` (none: committed memory, which is all
    /// `mi_manage_os_memory_ex` does).
    fn mi_manage_memory(
        start: *mut c_void,
        size: usize,
        is_committed: bool,
        is_pinned: bool,
        is_zero: bool,
        numa_node: i32,
        exclusive: bool,
        commit_fun: Option<CommitFn>,
        commit_fun_arg: *mut c_void,
        arena_id: *mut *mut c_void,
    ) -> bool;
}

use crate::c_library_heap;
use crate::own_code::{in_uswap, Guard};
use crate::real::{self, set_errno};

/// The most bytes of the region handed to mimalloc at once while the heap grows.
pub const ARENA_CHUNK_BYTES: usize = 8 << 30;
/// mimalloc's largest arena (`MI_ARENA_MAX_SIZE`); an allocation larger than
/// [`ARENA_CHUNK_BYTES`] gets an arena of up to this size.
pub const MAX_ARENA_BYTES: usize = 16 << 30;

static ARENA_START: AtomicUsize = AtomicUsize::new(0);
static ARENA_END: AtomicUsize = AtomicUsize::new(0);

/// Whether the calling thread's allocations belong in the managed heap.
#[inline]
pub fn managed_caller() -> bool {
    ARENA_END.load(Ordering::Acquire) != 0 && program_thread()
}

/// Whether the program's blocks come, or may come, from the managed heap: it is up, or
/// waits to come up (lazy start). False where the library stands aside (its `malloc` is
/// the C library's then).
pub fn serves_the_program() -> bool {
    ARENA_END.load(Ordering::Acquire) != 0 || PENDING.load(Ordering::Acquire)
}

/// Whether the calling thread runs the program's code: not uswap's engine threads, not this
/// library's own code.
#[inline]
fn program_thread() -> bool {
    !in_uswap() && !uswap::is_engine_thread()
}

/// Whether an allocation for a caller that returns to `ret` (none: an entry point the
/// dynamic linker never calls) is the program's: from its thread, not from the dynamic
/// linker.
#[inline]
fn program_caller(ret: Option<usize>) -> bool {
    program_thread()
        && ret.is_none_or(|ret| !(ret >= RTLD_START.load(Ordering::Relaxed) && ret < RTLD_END.load(Ordering::Relaxed)))
}

/// The dynamic linker's mapped extent `[start, end)` (see the module doc); empty until
/// [`prepare`] (or, starting before `main`, [`start`]) finds it.
static RTLD_START: AtomicUsize = AtomicUsize::new(0);
static RTLD_END: AtomicUsize = AtomicUsize::new(0);

/// Whether an allocation of `size` bytes for a caller that returns to `ret` is served by
/// mimalloc: once it is up, the program's ([`program_caller`]); before (lazy start), none,
/// until the program's live blocks in the C library's heap would pass what it may hold there
/// (`c_library_heap`'s first 2 MiB, or a grant of its calm tree's) with this one, which brings
/// mimalloc up first. Inlined whole into every allocation (what is past the grant is
/// [`managed_past_the_grant`]'s): this is the path of each `malloc` of a process that waits.
#[inline(always)]
fn managed_for(size: usize, ret: Option<usize>) -> bool {
    if ARENA_END.load(Ordering::Acquire) != 0 {
        return program_caller(ret);
    }
    if !PENDING.load(Ordering::Acquire) {
        return false;
    }
    let live = c_library_heap::live_bytes();
    let wanted_bytes = live.saturating_add(size);
    let most = PENDING_START_AFTER.load(Ordering::Relaxed) / 4;
    // Within the grant the C library serves whoever asks: asked first, before who the
    // caller is (two thread-local reads, through `__tls_get_addr` in a library loaded
    // with `dlopen`), on every `malloc` of a process that waits.
    if c_library_heap::within_grant(wanted_bytes, most) {
        return false;
    }
    managed_past_the_grant(wanted_bytes, most, ret)
}

/// [`managed_for`] of an allocation that would take the C library's heap to `wanted_bytes`,
/// past its grant (`most`: the most it may be granted).
#[inline(never)]
fn managed_past_the_grant(wanted_bytes: usize, most: usize, ret: Option<usize>) -> bool {
    if !program_caller(ret) {
        return false;
    }
    if crate::program_seccomp::filtered() {
        // No grant, no start: their calls would be the filter's (see `program_seccomp`).
        return false;
    }
    if c_library_heap::grant(wanted_bytes, most) {
        return false;
    }
    bring_up();
    ARENA_END.load(Ordering::Acquire) != 0
}

/// Lazy start, before the bring-up: the region reserved for the heap (its start and length)
/// and the pager's start threshold, for [`bring_up`]; `PENDING` is set once they are.
static PENDING: AtomicBool = AtomicBool::new(false);
static PENDING_START: AtomicUsize = AtomicUsize::new(0);
static PENDING_LEN: AtomicUsize = AtomicUsize::new(0);
static PENDING_START_AFTER: AtomicUsize = AtomicUsize::new(0);
static BRING_UP: std::sync::Once = std::sync::Once::new();

/// Counts `p`, just allocated (or resized from `old_bytes`) by the C library's malloc,
/// while mimalloc is not up.
#[inline]
fn count_c_library_block(p: *mut c_void, old_bytes: usize) {
    if !p.is_null() && PENDING.load(Ordering::Relaxed) {
        // SAFETY: `p` was just returned by the C library's malloc.
        unsafe { c_library_heap::count_block(p, old_bytes) }
    }
}

/// Uncounts the C library's block `p`, about to be freed, while mimalloc is not up. After,
/// a free cannot tell the program's blocks from the dynamic linker's (a thread's TLS
/// tables, freed on its thread as it ends) or uswap's: the count stays as it was.
#[inline]
fn uncount_c_library_block(p: *mut c_void) {
    if PENDING.load(Ordering::Relaxed) {
        // SAFETY: `p` is a live block of the C library's malloc (the caller's contract).
        unsafe { c_library_heap::uncount_block(p) }
    }
}

/// The program's bytes in the C library's heap when mimalloc came up (0 before, or when it
/// came up with the pager before `main`): outside the budget for good, as long as they live
/// (the report bounds the figure by the brk heap's resident pages).
pub fn c_library_heap_bytes() -> u64 {
    if PENDING.load(Ordering::Acquire) || ARENA_END.load(Ordering::Acquire) == 0 {
        return 0;
    }
    c_library_heap::live_bytes() as u64
}

/// Lazy start: notes the heap's region, reserved as ordinary memory, for [`bring_up`], and
/// finds the dynamic linker (its blocks are never counted). `start_after_bytes`: the
/// pager starts once the heap holds about that much: the C library's count at the bring-up,
/// then mimalloc's commits ([`commit`]).
pub fn prepare(start: usize, len: usize, start_after_bytes: usize) {
    note_dynamic_linker();
    PENDING_START.store(start, Ordering::Relaxed);
    PENDING_LEN.store(len, Ordering::Relaxed);
    PENDING_START_AFTER.store(start_after_bytes, Ordering::Relaxed);
    // The blocks the program got through the first stage before it loaded this library.
    c_library_heap::add_handed_over(crate::first_stage::c_heap_live_bytes());
    PENDING.store(true, Ordering::Release);
}

/// Brings mimalloc up on the region [`prepare`] noted, once, from whichever thread gets
/// here first (the others wait); a no-op when it is up already or nothing was prepared.
/// Not in a signal handler that interrupted the C library's malloc (it may allocate there).
/// A refusal is said on stderr and left for `uswap run`; the process goes on with the C
/// library's malloc, every byte kept.
pub fn bring_up() {
    if !PENDING.load(Ordering::Acquire) {
        return;
    }
    // A malloc that succeeds leaves errno as it was (this thread's bring-up, or its wait for
    // another thread's).
    let errno = real::errno();
    BRING_UP.call_once(|| {
        let _uswap = Guard::enter();
        let start_after = PENDING_START_AFTER.load(Ordering::Relaxed);
        let (start_at, len) = (PENDING_START.load(Ordering::Relaxed), PENDING_LEN.load(Ordering::Relaxed));
        // The heap `USWAP_START_AFTER` measures is the program's, both allocators' (the
        // pager's start counts mimalloc's commits on from here).
        let c_library_bytes = c_library_heap::live_bytes();
        COMMITTED_BYTES.store(c_library_bytes, Ordering::Release);
        if let Err(e) = start(start_at, len, Some(start_after)) {
            let msg =
                format!("uswap: process {} runs unmanaged, every byte kept (its heap): {e}\n", std::process::id());
            real::write_stderr(msg.as_bytes());
            crate::note_refusal(&msg);
        }
        PENDING.store(false, Ordering::Release);
    });
    real::set_errno(errno);
}

/// Finds the dynamic linker and the extent of its loaded segments: the object that holds
/// `__tls_get_addr` (which the dynamic linker defines), whether it was loaded as the
/// program's interpreter or run as the program (`ld.so PROGRAM`, where `AT_BASE` is 0).
fn find_dynamic_linker() -> Option<(usize, usize)> {
    extern "C" {
        // Only its address is taken.
        fn __tls_get_addr();
    }
    // SAFETY: an all-zero Dl_info is valid (null pointers); dladdr fills it for an address
    // inside a loaded object.
    let mut info: libc::Dl_info = unsafe { std::mem::zeroed() };
    // SAFETY: as above; the address is that of a function of a loaded object.
    let found_it = unsafe { libc::dladdr(__tls_get_addr as *const c_void, &mut info) } != 0;
    let base = if found_it && !info.dli_fbase.is_null() {
        info.dli_fbase as usize
    } else {
        // SAFETY: getauxval reads the auxiliary vector.
        unsafe { libc::getauxval(libc::AT_BASE) as usize }
    };
    crate::real::loaded_extent(base)
}

/// The first byte of the heap's region (0 before start-up).
pub fn arena_start() -> usize {
    ARENA_START.load(Ordering::Acquire)
}

#[inline]
pub fn in_arena(p: *mut c_void) -> bool {
    let a = p as usize;
    // The end first: `start` stores the start before it (Release), so a thread that sees
    // the end sees the start too. Read the other way round, a `free` racing mimalloc's
    // bring-up on another thread could see the end with a start of 0, and take a block of
    // the C library's for mimalloc's.
    let end = ARENA_END.load(Ordering::Acquire);
    end != 0 && a < end && a >= ARENA_START.load(Ordering::Acquire)
}

/// Whether the user set mimalloc's purge delay (its current name or its legacy one).
fn purge_delay_in_environment() -> bool {
    ["MIMALLOC_PURGE_DELAY", "MIMALLOC_RESET_DELAY"].iter().any(|v| std::env::var_os(v).is_some())
}

/// Hands `[start, start + len)` (zero-filled on first touch: a managed region, or ordinary
/// memory the pager will take over) to mimalloc as its only memory and turns routing on.
/// Called once: by [`bring_up`] (lazy start), or by the pager's start before `main`. Only
/// the first [`FIRST_ARENA_BYTES`] become an arena now; the rest follows as allocations need
/// it ([`grow`]). `start_after_bytes`: the process waits for its pager (lazy start, see the
/// crate's doc), which starts once the heap holds about that much ([`commit`]).
pub fn start(start: usize, len: usize, start_after_bytes: Option<usize>) -> Result<(), String> {
    // SAFETY: option setters take plain integers (a store each); then mimalloc's start, once;
    // all before any mimalloc allocation (routing is still off, so nothing has called into
    // mimalloc yet).
    unsafe {
        mi::mi_option_set(MI_OPTION_DISALLOW_OS_ALLOC, 1);
        // The region is ours to page: no huge pages, no OS reservations, not even those
        // the environment asks of mimalloc's start (they would lie outside the region).
        mi::mi_option_set(MI_OPTION_ALLOW_LARGE_OS_PAGES, 0);
        mi::mi_option_set(MI_OPTION_RESERVE_HUGE_OS_PAGES, 0);
        mi::mi_option_set(MI_OPTION_RESERVE_OS_MEMORY, 0);
        mi::mi_option_set(MI_OPTION_ARENA_RESERVE, 0);
        // Objects above this (2 GiB by default) go to the OS, which is disallowed: a 3 GiB
        // malloc failed. In KiB; mimalloc clamps it to its largest arena less its metadata.
        mi::mi_option_set(MI_OPTION_ARENA_MAX_OBJECT_SIZE, (MAX_ARENA_BYTES >> 10) as std::ffi::c_long);
        if !purge_delay_in_environment() {
            mi::mi_option_set(MI_OPTION_PURGE_DELAY, PURGE_DELAY_MS);
        }
        start_mimalloc();
    }
    if RTLD_END.load(Ordering::Relaxed) == 0 {
        note_dynamic_linker();
    }
    REGION_LEN.store(len, Ordering::Release);
    let first = len.min(FIRST_ARENA_BYTES);
    // What follows the first arena stays inaccessible until it is handed (`grow`); the first
    // becomes usable (see `make_usable`).
    make_usable(start, first)?;
    if len > first && real::sys_mprotect((start + first) as *mut c_void, len - first, libc::PROT_NONE) != 0 {
        return Err(format!(
            "cannot reserve the heap past its first arena ({:#x}, {} bytes): {}",
            start + first,
            len - first,
            std::io::Error::last_os_error()
        ));
    }
    match start_after_bytes {
        Some(bytes) => {
            START_AFTER_BYTES.store(bytes, Ordering::Release);
            add_arena(start, 0, first, true)?;
        }
        None => add_arena(start, 0, first, false)?,
    }
    HANDED_BYTES.store(first, Ordering::Release);
    ARENA_START.store(start, Ordering::Release);
    ARENA_END.store(start + len, Ordering::Release);
    Ok(())
}

/// mimalloc's start, which its ELF constructor makes in a default build and this one leaves
/// to [`start`] (`.cargo/config.toml`): the whole of it (`_mi_auto_process_init`), not only
/// `mi_process_init`, which leaves mimalloc "preloading" for good (it then never purges,
/// never gives back a thread's pages when the thread ends, and keeps its messages from
/// stderr). A no-op where a constructor ran it.
///
/// # Safety
/// Once, before any allocation from mimalloc, from one thread.
unsafe fn start_mimalloc() {
    extern "C" {
        /// Whether mimalloc's start has not run yet (`internal.h`).
        fn _mi_preloading() -> bool;
        /// mimalloc's start, as its ELF constructor runs it (`init.c`).
        fn _mi_auto_process_init();
    }
    // SAFETY: the caller's contract; both are mimalloc's own, public in its static library.
    unsafe {
        if _mi_preloading() {
            _mi_auto_process_init();
        }
        debug_assert!(!_mi_preloading(), "mimalloc started");
    }
}

/// Finds the dynamic linker's extent (see the module doc), once, before any program
/// allocation is routed.
fn note_dynamic_linker() {
    match find_dynamic_linker() {
        Some((rtld_start, rtld_end)) => {
            RTLD_START.store(rtld_start, Ordering::Relaxed);
            RTLD_END.store(rtld_end, Ordering::Relaxed);
        }
        // Managed all the same; said, since a DTV in the managed heap can kill a thread
        // in signal mode (see the module doc).
        None => real::write_stderr(
            format!(
                "uswap: cannot find the dynamic linker in this process ({}); its allocations (threads' TLS tables) \
                 go to the managed heap\n",
                std::process::id()
            )
            .as_bytes(),
        ),
    }
}

/// The first arena. mimalloc initialises an arena's bitmaps on its first pages, which fault
/// into the engine one by one: handing it the whole region at start cost a short process
/// (a shell's `/bin/true`) 10 ms for the default devices' 50 GiB heap.
pub const FIRST_ARENA_BYTES: usize = 256 << 20;
/// Bytes of the region, and of it the bytes handed to mimalloc so far (a prefix).
static REGION_LEN: AtomicUsize = AtomicUsize::new(0);
static HANDED_BYTES: AtomicUsize = AtomicUsize::new(0);
/// Serialises [`grow`] (taken only when an allocation found every arena full).
static GROW: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// Makes `[addr, addr + len)` of the heap's region readable and writable, as it is handed to
/// mimalloc. The region is reserved without access (`PROT_NONE`), and only what mimalloc was
/// given becomes usable: a program that reads every readable mapping of its address space
/// (stress-ng's `--fork-vm` children read each page of `/proc/self/maps`) would otherwise
/// read the whole reservation (the limit plus the devices' capacity, tens of GiB), each
/// never-touched page a fault into the engine in signal mode (a minute a process), and the
/// kernel's page tables would map it all. A stray pointer past the heap faults (SIGSEGV), as
/// without uswap; reserved so (the lazy start's `reserve_heap`), the region costs no commit
/// charge where overcommit is strict until it is handed out.
fn make_usable(addr: usize, len: usize) -> Result<(), String> {
    if real::sys_mprotect(addr as *mut c_void, len, libc::PROT_READ | libc::PROT_WRITE) != 0 {
        return Err(format!(
            "cannot make the heap's next {len} bytes at {addr:#x} usable: {}",
            std::io::Error::last_os_error()
        ));
    }
    Ok(())
}

/// Hands `[start + off, start + off + len)` to mimalloc as an arena. `counted`: an arena
/// handed while the process waits for its pager, whose commits and decommits mimalloc asks
/// of [`commit`] (it counts them, so that the pager starts when the heap is worth paging);
/// otherwise committed from the start.
fn add_arena(start: usize, off: usize, len: usize, counted: bool) -> Result<(), String> {
    let mut id: *mut c_void = std::ptr::null_mut();
    let commit_fun: Option<CommitFn> = if counted { Some(commit) } else { None };
    // SAFETY: the range is mapped, readable and writable for the pager's lifetime (the whole
    // process: it is never unmapped) and no one else uses it; is_committed (unless counted)
    // because touching it is enough to use it (userfaultfd fills it, or the kernel before
    // the pager starts), is_zero because it reads as zero until written.
    let ok = unsafe {
        mi_manage_memory(
            (start + off) as *mut c_void,
            len,
            !counted,
            false,
            true,
            -1,
            false,
            commit_fun,
            std::ptr::null_mut(),
            &mut id,
        )
    };
    if !ok {
        return Err(format!("mimalloc refused the heap's region at {start:#x} (+{off}, {len} bytes)"));
    }
    Ok(())
}

/// Lazy start: the heap bytes mimalloc may commit before the pager starts (`usize::MAX`:
/// not waiting), what it has committed of the arenas handed while the process waited, from
/// the C library's count of the program's blocks at the bring-up (about: a range partly
/// committed already is counted whole, and the start only comes earlier for it), and the
/// end of the furthest commit, an address (past it, nothing of the region was ever
/// touched).
static START_AFTER_BYTES: AtomicUsize = AtomicUsize::new(usize::MAX);
static COMMITTED_BYTES: AtomicUsize = AtomicUsize::new(0);
static COMMITTED_END: AtomicUsize = AtomicUsize::new(0);

/// The prefix of the heap's region that may have been touched: what the pager scans for
/// present pages when it takes the heap over. Every arena handed while the process waited
/// is counted (`grow`), so the furthest commit bounds it.
pub fn committed_extent() -> usize {
    COMMITTED_END.load(Ordering::Acquire).saturating_sub(arena_start())
}

/// mimalloc's commit and decommit of a range of an arena handed while the process waited
/// for its pager (lazy start). A commit has nothing to do (the range is mapped read-write)
/// but count; once the count passes
/// `USWAP_START_AFTER`, the pager starts, here, on the allocating thread. A decommit (a
/// purge) gives the pages back to the kernel, as mimalloc's own does: `MADV_DONTNEED`,
/// which a running pager sees as an `UFFD_EVENT_REMOVE`; but not while the pager is far
/// below its limit (`Pager::far_below_limit`): then the range stays committed. Returns
/// whether the range is now what was asked: committed, or given back (to be committed
/// again before reuse); a decommit answered false keeps it committed, and mimalloc reuses
/// it as it is.
extern "C" fn commit(commit: bool, start: *mut c_void, size: usize, is_zero: *mut bool, _arg: *mut c_void) -> bool {
    if commit {
        if !is_zero.is_null() {
            // SAFETY: mimalloc's out-parameter, valid for the call. Not known zero: part of
            // the range may have been committed and written before (as mimalloc's own).
            unsafe { *is_zero = false };
        }
        let now = COMMITTED_BYTES.fetch_add(size, Ordering::AcqRel) + size;
        COMMITTED_END.fetch_max(start as usize + size, Ordering::AcqRel);
        if crate::is_waiting() {
            start_if_worth_it(now);
        }
        return true;
    }
    if crate::pager().is_some_and(|p| p.far_below_limit(size)) {
        // Kept: still committed for mimalloc, which reuses it without asking again. Given
        // back, a purge made the purging thread wait for the engine to read its
        // `UFFD_EVENT_REMOVE` (a compiler purged some 400 times a second, 4-6 % of its run),
        // and the range faulted page by page when used again.
        return false;
    }
    let before = COMMITTED_BYTES.fetch_update(Ordering::AcqRel, Ordering::Acquire, |c| Some(c.saturating_sub(size)));
    if crate::is_waiting() {
        // The tree's charge follows the heap down too (a trigger there waits for a commit).
        let _ = crate::waiting_charge::note_heap(before.unwrap_or(0).saturating_sub(size));
    }
    real::sys_madvise(start, size, libc::MADV_DONTNEED) == 0
}

/// A waiting process's heap holds `committed_bytes` after a commit: charged to the tree
/// past a threshold (`waiting_charge`), and the pager started, here, on the allocating
/// thread, once the heap (with the mappings the process deferred, see `mmap`) passes
/// `USWAP_START_AFTER` or the tree's charge half its limit.
fn start_if_worth_it(committed_bytes: usize) {
    let start_after = START_AFTER_BYTES.load(Ordering::Acquire);
    if committed_bytes + crate::waiting_charge::mapped_bytes() < start_after {
        // Charged while it waits; not first and then handed to a pager that starts now,
        // which would count the heap twice in the tree's peak (the waiting charge, then
        // the pages the pager takes over).
        if crate::waiting_charge::note_heap(committed_bytes) && managed_caller() {
            crate::start_if_waiting(crate::waiting_charge::start_cause());
        }
        return;
    }
    if !managed_caller() {
        return;
    }
    crate::start_if_waiting(crate::StartCause::Heap);
    if crate::is_waiting() {
        // Put off (on an alternate signal stack): charged meanwhile, and tried again an
        // eighth further on, not at every commit.
        let _ = crate::waiting_charge::note_heap(committed_bytes);
        START_AFTER_BYTES.store(committed_bytes + start_after / 8, Ordering::Release);
    }
}

/// An allocation failed with `handed_seen` bytes handed to mimalloc: hands it the next piece
/// of the region, as large as all handed so far (so the heap doubles), at most
/// [`ARENA_CHUNK_BYTES`], and at least `want` bytes with room for the arena's metadata (up to
/// [`MAX_ARENA_BYTES`]). Returns whether the caller should try again: another thread may
/// have grown the heap meanwhile, or there was more to hand; false once the region is all
/// handed (the allocation then fails, as the program's malloc would).
fn grow(handed_seen: usize, want: usize) -> bool {
    let _g = GROW.lock().unwrap_or_else(|e| e.into_inner());
    let handed = HANDED_BYTES.load(Ordering::Acquire);
    if handed != handed_seen {
        return true;
    }
    let left = REGION_LEN.load(Ordering::Acquire) - handed;
    if left == 0 {
        return false;
    }
    let for_want = want.saturating_add(FIRST_ARENA_BYTES).next_multiple_of(FIRST_ARENA_BYTES).min(MAX_ARENA_BYTES);
    let len = handed.min(ARENA_CHUNK_BYTES).max(for_want).min(left);
    let _uswap = Guard::enter();
    let start = ARENA_START.load(Ordering::Acquire);
    // While the process waits for its pager, every arena's commits are counted as the
    // first's are (`commit`): they start the pager, and bound what it scans.
    if make_usable(start + handed, len).is_err() || add_arena(start, handed, len, crate::is_waiting()).is_err() {
        return false;
    }
    HANDED_BYTES.store(handed + len, Ordering::Release);
    true
}

/// Runs a mimalloc allocation of `size` bytes, growing the heap while it fails and the
/// region has more. Bounded: each retry follows a growth of the handed prefix, which is
/// finite. A block no arena can hold (larger than mimalloc's largest arena) becomes a
/// managed mapping of its own ([`huge`]).
#[inline]
fn mi_alloc(size: usize, alloc: impl Fn() -> *mut c_void) -> *mut c_void {
    if size > HUGE_MIN_BYTES {
        return huge(size);
    }
    loop {
        let seen = HANDED_BYTES.load(Ordering::Acquire);
        let p = alloc();
        if !p.is_null() || !grow(seen, size) {
            return p;
        }
    }
}

/// Blocks above this are managed mappings of their own, not heap blocks: mimalloc cannot
/// place a block larger than its largest arena (less the arena's metadata).
const HUGE_MIN_BYTES: usize = MAX_ARENA_BYTES - (64 << 20);

/// A block of `size` bytes in a managed mapping of its own (page-aligned, zero-filled): the
/// program's `malloc` of 20 GiB must not fail where glibc's would succeed. `free`, `realloc`
/// and `malloc_usable_size` find it by its start ([`huge_len`]).
fn huge(size: usize) -> *mut c_void {
    match crate::mmap::map_for_heap(size, uswap::PAGE_SIZE) {
        Some(p) => p,
        None => {
            set_errno(libc::ENOMEM);
            std::ptr::null_mut()
        }
    }
}

/// The length of `p`'s block if it is a [`huge`] one. Outside the arena and page-aligned
/// first (a lock and a table search only then: the C library's blocks are page-aligned
/// only where a program asked for it, `valloc` or `posix_memalign`, before mimalloc came up).
fn huge_len(p: *mut c_void) -> Option<usize> {
    let a = p as usize;
    if in_arena(p) || a % uswap::PAGE_SIZE != 0 {
        return None;
    }
    crate::mmap::managed_len(a)
}

/// glibc's `realloc(p, 0)` frees and returns null; programs rely on it.
const REALLOC_ZERO_FREES: bool = true;

// `malloc`, `calloc` and `realloc` pass their return address on to the function that
// serves them, as one more argument (the System V ABI's next argument register), so that a
// caller in the dynamic linker is told apart (see the module doc).

#[no_mangle]
#[unsafe(naked)]
pub extern "C" fn malloc(size: usize) -> *mut c_void {
    std::arch::naked_asm!("mov rsi, [rsp]", "jmp {serve}", serve = sym malloc_returning_to)
}

#[no_mangle]
#[unsafe(naked)]
pub extern "C" fn calloc(n: usize, size: usize) -> *mut c_void {
    std::arch::naked_asm!("mov rdx, [rsp]", "jmp {serve}", serve = sym calloc_returning_to)
}

#[no_mangle]
#[unsafe(naked)]
/// # Safety
/// As the C function of this name: the pointer comes from this allocator (or is null).
pub unsafe extern "C" fn realloc(p: *mut c_void, size: usize) -> *mut c_void {
    std::arch::naked_asm!("mov rdx, [rsp]", "jmp {serve}", serve = sym realloc_returning_to)
}

extern "C" fn malloc_returning_to(size: usize, ret: usize) -> *mut c_void {
    if managed_for(size, Some(ret)) {
        // SAFETY: mimalloc's malloc; any size is valid.
        mi_alloc(size, || unsafe { mi::mi_malloc(size) })
    } else {
        let p = real::malloc(size);
        count_c_library_block(p, 0);
        p
    }
}

extern "C" fn calloc_returning_to(n: usize, size: usize, ret: usize) -> *mut c_void {
    if managed_for(n.saturating_mul(size), Some(ret)) {
        // SAFETY: mimalloc's calloc checks the product for overflow.
        mi_alloc(n.saturating_mul(size), || unsafe { mi::mi_calloc(n, size) })
    } else {
        let p = real::calloc(n, size);
        count_c_library_block(p, 0);
        p
    }
}

#[no_mangle]
/// # Safety
/// As the C function of this name: the pointer comes from this allocator (or is null).
pub unsafe extern "C" fn free(p: *mut c_void) {
    // SAFETY: the caller's contract.
    unsafe { free_here(p) }
}

/// `free`'s work, called directly (not through the exported name, which an executable's own
/// `free` takes over: one that calls `__libc_free` would be called back, for good).
///
/// # Safety
/// As `free`.
unsafe fn free_here(p: *mut c_void) {
    if p.is_null() {
        return;
    }
    if in_arena(p) {
        // SAFETY: every pointer in the arena was returned by mimalloc (module invariant).
        unsafe { mi::mi_free(p) }
    } else if let Some(len) = huge_len(p) {
        crate::munmap::munmap(p, len);
    } else {
        uncount_c_library_block(p);
        // SAFETY: not in the arena, so the C library's or the bootstrap area's.
        unsafe { real::free(p) }
    }
}

/// `cfree` is an old alias some programs still call.
#[no_mangle]
/// # Safety
/// As the C function of this name: the pointer comes from this allocator (or is null).
pub unsafe extern "C" fn cfree(p: *mut c_void) {
    // SAFETY: the caller's contract is free's.
    unsafe { free_here(p) }
}

/// `realloc`, for a caller that returns to `ret`.
///
/// # Safety
/// As the C function `realloc`: the pointer comes from this allocator (or is null).
unsafe extern "C" fn realloc_returning_to(p: *mut c_void, size: usize, ret: usize) -> *mut c_void {
    if p.is_null() {
        return malloc_returning_to(size, ret);
    }
    if size == 0 && REALLOC_ZERO_FREES {
        // SAFETY: `p` is a live block of this allocator (the caller's contract).
        unsafe { free_here(p) };
        return std::ptr::null_mut();
    }
    let huge_block = huge_len(p).is_some();
    let from_arena = in_arena(p);
    // A counted block of the C library's (mimalloc not up yet): its size, and what the C
    // library's heap would hold more, its growth.
    let counted_bytes = (PENDING.load(Ordering::Relaxed) && !from_arena && !huge_block)
        // SAFETY: `p` is the C library's (not in the arena, not a huge block).
        .then(|| unsafe { real::usable_size(p) });
    let more = counted_bytes.map_or(size, |old| size.saturating_sub(old));
    let managed = managed_for(more, Some(ret));
    match (from_arena, managed && !huge_block && size <= HUGE_MIN_BYTES) {
        // SAFETY: `p` is mimalloc's.
        (true, true) => mi_alloc(size, || unsafe { mi::mi_realloc(p, size) }),
        // A block of the C library's that stays there; one the program grows past what an
        // arena holds becomes a huge block (the arm below).
        (false, false) if !huge_block && !managed => {
            // SAFETY: `p` is the C library's (not in the arena, not a huge block).
            let n = unsafe { real::realloc(p, size) };
            if let Some(old_bytes) = counted_bytes {
                count_c_library_block(n, old_bytes);
            }
            n
        }
        // A block moves between heaps: allocate on the caller's side, copy, free the old one.
        _ => {
            let old_size = if let Some(len) = huge_len(p) {
                len
            } else if from_arena {
                // SAFETY: `p` is mimalloc's.
                unsafe { mi::mi_usable_size(p) }
            } else {
                // SAFETY: `p` is the C library's.
                unsafe { real::usable_size(p) }
            };
            let n = malloc_returning_to(size, ret);
            if !n.is_null() {
                // SAFETY: `p` is valid for old_size bytes, `n` for size; distinct blocks; `p`
                // is freed once, by the allocator it came from.
                unsafe {
                    std::ptr::copy_nonoverlapping(p as *const u8, n as *mut u8, old_size.min(size));
                    free_here(p);
                }
            }
            n
        }
    }
}

#[no_mangle]
/// # Safety
/// As the C function of this name: the pointer comes from this allocator (or is null).
pub unsafe extern "C" fn reallocarray(p: *mut c_void, n: usize, size: usize) -> *mut c_void {
    match n.checked_mul(size) {
        // SAFETY: the caller's contract is realloc's.
        Some(total) => unsafe { realloc(p, total) },
        None => {
            set_errno(libc::ENOMEM);
            std::ptr::null_mut()
        }
    }
}

/// A block of `size` bytes at a multiple of `align` (a power of two, checked by callers).
fn aligned(align: usize, size: usize) -> *mut c_void {
    aligned_for(align, size, None)
}

/// [`aligned`] for a caller that returns to `ret`, if known: the dynamic loader of a C
/// library before 2.26 allocates threads' TLS blocks with `__libc_memalign` (see the module
/// doc for why those stay the C library's).
fn aligned_for(align: usize, size: usize, ret: Option<usize>) -> *mut c_void {
    debug_assert!(align.is_power_of_two());
    if managed_for(size, ret) {
        if align > MI_ARENA_ALIGN_MAX || size > HUGE_MIN_BYTES {
            return huge_aligned(align, size);
        }
        // SAFETY: mimalloc's aligned malloc; `align` is a power of two (checked by callers).
        mi_alloc(size, || unsafe { mi::mi_malloc_aligned(size, align) })
    } else {
        c_library_aligned(align, size)
    }
}

/// The largest alignment mimalloc serves from its arenas (its `MI_PAGE_MAX_OVERALLOC_ALIGN`,
/// one arena slice); past it, it asks the system for a mapping of its own, which
/// `disallow_os_alloc` refuses: x264's `memalign` of 2 MiB for a frame it wants in one huge
/// page failed, and ffmpeg with it.
const MI_ARENA_ALIGN_MAX: usize = 64 << 10;

/// A block aligned past what mimalloc's arenas serve, or too large for them: a managed
/// mapping of its own at that alignment (`free` finds it by its start, as a [`huge`] one)
/// if it is as large as `--min-size` (a mapping per block is a region per block), else, or
/// where the pager refuses one, the C library's (outside the limit, as a mapping smaller
/// than `--min-size` is).
fn huge_aligned(align: usize, size: usize) -> *mut c_void {
    // The configuration's, set before the heap serves the program: the mapping layer's own
    // copy is set only once the pager is up, and a block asked for while the process waits
    // for it must start it (`map_for_heap`), not slip outside the limit.
    let min_size_bytes = crate::config().map_or(usize::MAX, |cfg| cfg.min_size_bytes);
    if size >= min_size_bytes {
        if let Some(p) = crate::mmap::map_for_heap(size, align.max(uswap::PAGE_SIZE)) {
            debug_assert!(p as usize % align == 0);
            return p;
        }
    }
    c_library_aligned(align, size)
}

/// The C library's `memalign`, counted as its other blocks are.
fn c_library_aligned(align: usize, size: usize) -> *mut c_void {
    let p = real::memalign(align, size);
    count_c_library_block(p, 0);
    p
}

#[no_mangle]
/// # Safety
/// As the C function of this name: the pointer comes from this allocator (or is null).
pub unsafe extern "C" fn posix_memalign(out: *mut *mut c_void, align: usize, size: usize) -> i32 {
    if !align.is_power_of_two() || align % std::mem::size_of::<*mut c_void>() != 0 {
        return libc::EINVAL;
    }
    if out.is_null() {
        return libc::EINVAL;
    }
    let p = aligned(align, size);
    if p.is_null() {
        return libc::ENOMEM;
    }
    // SAFETY: `out` is the caller's non-null result pointer.
    unsafe { *out = p };
    0
}

#[no_mangle]
pub extern "C" fn aligned_alloc(align: usize, size: usize) -> *mut c_void {
    memalign(align, size)
}

/// `memalign` (and `aligned_alloc`, which is `memalign` in the C library before 2.38): an
/// alignment that is not a power of two is rounded up to the next one, and one under 16 is
/// 16, as the C library does (a program that asked for 3 got NULL); past half the address
/// space, `EINVAL`.
#[no_mangle]
pub extern "C" fn memalign(align: usize, size: usize) -> *mut c_void {
    memalign_here(align, size)
}

/// `memalign`'s work, called directly (see [`free_here`]).
fn memalign_here(align: usize, size: usize) -> *mut c_void {
    memalign_returning_to(align, size, 0)
}

/// `memalign`'s work for a caller that returns to `ret` (0: not known).
extern "C" fn memalign_returning_to(align: usize, size: usize, ret: usize) -> *mut c_void {
    let Some(align) = align.max(16).checked_next_power_of_two() else {
        set_errno(libc::EINVAL);
        return std::ptr::null_mut();
    };
    aligned_for(align, size, (ret != 0).then_some(ret))
}

#[no_mangle]
pub extern "C" fn valloc(size: usize) -> *mut c_void {
    aligned(uswap::PAGE_SIZE, size)
}

#[no_mangle]
pub extern "C" fn pvalloc(size: usize) -> *mut c_void {
    pvalloc_here(size)
}

/// `pvalloc`'s work, called directly (see [`free_here`]).
fn pvalloc_here(size: usize) -> *mut c_void {
    match size.checked_next_multiple_of(uswap::PAGE_SIZE) {
        Some(rounded) => aligned(uswap::PAGE_SIZE, rounded.max(uswap::PAGE_SIZE)),
        None => {
            set_errno(libc::ENOMEM);
            std::ptr::null_mut()
        }
    }
}

#[no_mangle]
/// # Safety
/// As the C function of this name: the pointer comes from this allocator (or is null).
pub unsafe extern "C" fn malloc_usable_size(p: *mut c_void) -> usize {
    if p.is_null() {
        0
    } else if in_arena(p) {
        // SAFETY: `p` is mimalloc's.
        unsafe { mi::mi_usable_size(p) }
    } else if let Some(len) = huge_len(p) {
        len
    } else {
        // SAFETY: not in the arena, so the C library's or the bootstrap area's.
        unsafe { real::usable_size(p) }
    }
}

// The C library's own names for its allocator (`__libc_malloc`, ...), which some programs
// and libraries call directly: served as the standard names are, as jemalloc and mimalloc
// do when they replace `malloc`. A block the program got from one name and gives to the
// other then has one allocator: before, `__libc_realloc` of a block from `malloc` aborted
// the program ("realloc(): invalid pointer"). Where uswap stands aside, the standard names
// go to the C library, and so do these. Each calls the work of its standard name directly,
// never the exported name: an executable with an allocator of its own takes those over, and
// one whose `free` calls `__libc_free` would be called back, for good.

#[no_mangle]
#[unsafe(naked)]
pub extern "C" fn __libc_malloc(size: usize) -> *mut c_void {
    std::arch::naked_asm!("mov rsi, [rsp]", "jmp {serve}", serve = sym malloc_returning_to)
}

#[no_mangle]
#[unsafe(naked)]
pub extern "C" fn __libc_calloc(n: usize, size: usize) -> *mut c_void {
    std::arch::naked_asm!("mov rdx, [rsp]", "jmp {serve}", serve = sym calloc_returning_to)
}

#[no_mangle]
#[unsafe(naked)]
/// # Safety
/// As `realloc`.
pub unsafe extern "C" fn __libc_realloc(p: *mut c_void, size: usize) -> *mut c_void {
    std::arch::naked_asm!("mov rdx, [rsp]", "jmp {serve}", serve = sym realloc_returning_to)
}

#[no_mangle]
/// # Safety
/// As `free`.
pub unsafe extern "C" fn __libc_free(p: *mut c_void) {
    // SAFETY: the caller's contract is free's.
    unsafe { free_here(p) }
}

#[no_mangle]
#[unsafe(naked)]
pub extern "C" fn __libc_memalign(align: usize, size: usize) -> *mut c_void {
    std::arch::naked_asm!("mov rdx, [rsp]", "jmp {serve}", serve = sym memalign_returning_to)
}

#[no_mangle]
pub extern "C" fn __libc_valloc(size: usize) -> *mut c_void {
    aligned(uswap::PAGE_SIZE, size)
}

#[no_mangle]
pub extern "C" fn __libc_pvalloc(size: usize) -> *mut c_void {
    pvalloc_here(size)
}
