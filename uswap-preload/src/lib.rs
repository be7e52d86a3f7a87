//! `libuswap_preload.so`: the library `uswap run` preloads into an unmodified program so
//! that uswap pages its memory.
//!
//! At load (an ELF constructor, before the program's `main`) it reads the environment
//! `uswap run` sets ([`config`]) and reserves one large region for the heap, which mimalloc
//! serves once the heap is worth it ([`heap`]). The [`uswap::Pager`] starts when the process first needs one (below),
//! takes the heap's region over with the pages it has, and from then on manages the
//! program's large anonymous `mmap`s too ([`mmap`]); what glibc allocates for a new thread
//! stays out of the managed heap ([`threads`]). At exit a process with a pager writes its
//! counters where `uswap run` collects them ([`report`]). A process started by exec loads it
//! again (the environment is inherited) and gets a pager of its own.
//!
//! **Lazy start.** Most processes of a tree are short and small (a shell, `sed`, `cc1` on a
//! small file), and a pager's start costs milliseconds: two userfaultfds, tables, threads,
//! and in signal mode the C library's system calls rewritten. So the pager starts at the
//! first of: the heap's bytes passing `USWAP_START_AFTER` (the C library's blocks from
//! before mimalloc came up, then what mimalloc commits: it tells each
//! commit and purge, [`heap`]), the tree's charge at half its limit ([`waiting_charge`]),
//! the program's first anonymous mapping that would be managed and that it cannot defer
//! ([`mmap`]: one of its own, read-write, is deferred while the process may wait), its
//! first thread ([`threads`]: the start needs the process to have one thread, see
//! `uswap::syscall_guard`). Until then the process is the kernel's, at plain speed: its
//! heap and deferred mappings are ordinary memory (at most a sixteenth of the limit; past
//! 16 MiB charged to the tree, [`waiting_charge`]), and it leaves no record. Its first 2
//! MiB of blocks are the C library's malloc's, and mimalloc comes up only past them, or
//! with the pager ([`heap`], "The C library's heap first"). What stays
//! on every process's start-up path: loading this library, reading the environment,
//! reserving the heap's address space, and in signal
//! mode the place of the trampolines the tree kept (`uswap::syscall_guard::reserve_image_place`:
//! an inaccessible mapping beside the C library, kept while no rewrite used it). In signal
//! mode the rewrite of the C library's system calls (`uswap::syscall_guard`) comes with the
//! pager, on the thread that starts it, and only if nothing on that thread would resume
//! inside the code it replaces: a start in a signal handler that allocates while the C
//! library's `read` waits would send the `read`'s return into a new jump (SIGILL). The
//! stack above the program's call into this library ([`program_frames`]) is read for such a
//! context; with one, the pager starts in thread mode, said on stderr. A start that
//! fails later is said on stderr and left beside the records as a refusal (the run fails);
//! the process goes on unmanaged, every byte kept. A cause met on an alternate signal
//! stack (a handler there that allocates) puts the start off to the next cause.
//! `USWAP_START_AFTER=0` starts the pager before `main`, as before.
//!
//! The engine and this library allocate only from the C library's malloc ([`real`]), never
//! from the memory they manage; `heap::Guard` marks this library's own code on a thread.
//!
//! If the pager cannot be built (no userfaultfd, a bad device list), the process stops with
//! a message and exit status 2 rather than run unmanaged: a budget that silently does not
//! apply is worse than none.

pub mod altstack;
pub mod c_library_heap;
mod config;
pub mod core_dump;
pub mod deep_bind;
pub mod escape;
pub mod fds;
pub mod first_stage;
pub mod fork;
pub mod heap;
pub mod last_thread;
pub mod let_go;
pub mod locale;
pub mod managed_table;
pub mod mlock;
pub mod mmap;
pub mod mremap;
pub mod munmap;
pub mod own_allocator;
pub mod own_code;
pub mod own_process;
pub mod program_break;
pub mod program_frames;
pub mod program_seccomp;
pub mod program_stacks;
pub mod program_system_calls;
pub mod program_userfaultfd;
pub mod raw_fork;
pub mod real;
pub mod remote_access;
pub mod report;
pub mod rlimit;
pub mod sanitizer_env;
pub mod signals;
pub mod threads;
pub mod unmanaged;
pub mod waiting_charge;

#[global_allocator]
static ALLOCATOR: real::LibcAllocator = real::LibcAllocator;

use std::sync::atomic::{AtomicBool, AtomicPtr, Ordering};
use std::sync::OnceLock;

/// Says whether this library pages the process (1) or stands aside in it (0: `USWAP_DISABLE`,
/// a program's own allocator, a fork child that could not get a pager): where it pages, a
/// pager of uswap's library API (a Python package, the C library, a Rust program) that another
/// copy of the engine would build is refused (`uswap::Error::UnderUswapRun`), since this
/// library takes the program's `mmap`, `ioctl` and signal handlers, that engine's among them.
#[no_mangle]
pub extern "C" fn uswap_run_library() -> std::ffi::c_int {
    std::ffi::c_int::from(PAGES_THE_PROCESS.load(Ordering::Acquire) && !is_unmanaged_fork_child())
}

/// Set once the constructor found that this library pages the process (it does not stand
/// aside), before the program runs.
static PAGES_THE_PROCESS: AtomicBool = AtomicBool::new(false);

/// The process's pager, built by the constructor (or, in a fork child, by `fork`'s re-arm)
/// and never dropped (the heap lives in its region until the process ends): a leaked box.
static PAGER: AtomicPtr<uswap::Pager> = AtomicPtr::new(std::ptr::null_mut());

/// The configuration the pager was built from, for a fork child's pager.
static CONFIG: OnceLock<config::Config> = OnceLock::new();

pub fn config() -> Option<&'static config::Config> {
    CONFIG.get()
}

/// Makes `pager` the process's pager for good (leaked: never dropped).
pub(crate) fn set_pager(pager: uswap::Pager) -> &'static uswap::Pager {
    let p: &'static uswap::Pager = Box::leak(Box::new(pager));
    PAGER.store(p as *const uswap::Pager as *mut uswap::Pager, Ordering::Release);
    p
}

/// The charge shared with the other processes of the `uswap run` tree, if any.
static SEGMENT: OnceLock<uswap::shared_charge::ChargeSegment> = OnceLock::new();

/// This process's slot in the shared charge segment, if it got one (a fork child's own,
/// once it has a pager of its own).
static OWN_SLOT: spin::Mutex<Option<uswap::shared_charge::OwnSlot>> = spin::Mutex::new(None);

/// Notes this process's slot (see [`own_slot`]).
pub(crate) fn set_own_slot(own: Option<uswap::shared_charge::OwnSlot>) {
    *OWN_SLOT.lock() = own;
}

/// In a fork child (its one thread, before it runs): the slot's lock is free, whichever
/// thread of the parent held it at the fork.
pub(crate) fn forget_own_slot_lock_in_fork_child() {
    if OWN_SLOT.is_locked() {
        // SAFETY: the holder was a thread of the parent's, not in this process; this thread
        // is the child's only one.
        unsafe { OWN_SLOT.force_unlock() };
    }
}

/// This process's slot in the shared charge segment, if any.
pub fn own_slot() -> Option<uswap::shared_charge::OwnSlot> {
    *OWN_SLOT.lock()
}

/// At exit and before `execve`: the image's unmanaged memory goes with it, and the shared
/// objects it counted for the tree go to the tree's other processes (a new image that never
/// takes a pager, or one that does not load the library, would hold them for good). Only by
/// the process whose slot it is: not a `vfork` child (its parent's memory and statics), nor
/// a fork child without a pager of its own (its slot is its parent's).
pub(crate) fn give_back_unmanaged() {
    if !own_process::is_own_process() {
        return;
    }
    let (Some(seg), Some(own)) = (segment(), own_slot()) else { return };
    if seg.held_by(&own, std::process::id()) {
        seg.charge().note_unmanaged(own.unmanaged_bytes, 0);
        seg.let_go_of_shared_objects(&own, &[]);
    }
}

/// Takes a slot of `seg` for this process (noted: [`own_slot`]) and charges `builder`'s
/// pager to the tree through it: its pages, its pools and its devices. With every slot
/// taken, the pager runs under its own limit only (said in its record).
pub(crate) fn join_tree(
    seg: &uswap::shared_charge::ChargeSegment,
    builder: uswap::PagerBuilder,
) -> uswap::PagerBuilder {
    // A waiting process's slot, if it joined (by pid): its waiting charge is given back.
    let own = seg.claim(std::process::id());
    waiting_charge::handed_to_pager();
    set_own_slot(own);
    match own {
        Some(own) => builder
            .shared_charge(seg.charge(), own.pages)
            .own_pool_bytes(own.pool_bytes)
            .own_device_bytes(own.device_bytes),
        None => {
            report::note_unshared();
            builder
        }
    }
}

/// What names this process's files in the tree's directory (see
/// `uswap::shared_charge::ChargeSegment::file_tag`): its pid, with its pid namespace where
/// that is not `uswap run`'s.
pub(crate) fn file_tag() -> String {
    let pid = std::process::id();
    open_segment().ok().flatten().map_or_else(|| pid.to_string(), |seg| seg.file_tag(pid))
}

/// The shared charge segment, if this process is under one and opened it.
pub fn segment() -> Option<&'static uswap::shared_charge::ChargeSegment> {
    SEGMENT.get()
}

/// The shared charge segment of the `uswap run` tree, opened (and swept of dead processes'
/// slots) the first time: `None` for a process run with the library by hand.
pub(crate) fn open_segment() -> Result<Option<&'static uswap::shared_charge::ChargeSegment>, String> {
    if let Some(seg) = SEGMENT.get() {
        return Ok(Some(seg));
    }
    let Some(dir) = config().and_then(|c| c.stats_dir.as_ref()) else { return Ok(None) };
    let path = dir.join(uswap::shared_charge::SEGMENT_FILE);
    // Not there: no tree to join (a directory set by hand, the run's end removing it, or a
    // directory out of this process's reach: `run_dir_out_of_reach`). Any other failure (a
    // directory this user may not enter) is said, not taken for "no tree".
    match std::fs::symlink_metadata(&path) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(format!("cannot reach the shared charge {}: {e}", path.display())),
        Ok(_) => {}
    }
    let seg = uswap::shared_charge::ChargeSegment::open(&path)
        .map_err(|e| format!("cannot open the shared charge {}: {e}", path.display()))?;
    seg.sweep_dead();
    Ok(Some(SEGMENT.get_or_init(|| seg)))
}

/// Whether this process's run's directory is not there for it, though the environment names
/// one: the directory is gone (the run ended before this process's pager started) or
/// another file system is at that path (a sandbox's private `/tmp`, a chroot, another
/// mount namespace). Its pager then runs under a limit of its own ([`say_out_of_reach`]).
fn run_dir_out_of_reach(cfg: &config::Config) -> bool {
    // There without a segment: a directory set by hand, or the run's end removing it.
    cfg.stats_dir
        .as_ref()
        .is_some_and(|dir| std::fs::symlink_metadata(dir).is_err_and(|e| e.kind() == std::io::ErrorKind::NotFound))
}

/// Says, once the pager runs, that this process pages outside its tree: neither its notes
/// nor its record can reach the run, whose figures leave it out.
fn say_out_of_reach(cfg: &config::Config) {
    let dir = cfg.stats_dir.as_deref().unwrap_or(std::path::Path::new(""));
    let limit = match cfg.limit_bytes {
        b if b % (1 << 20) == 0 => format!("{} MiB", b >> 20),
        b => format!("{} KiB", b >> 10),
    };
    real::say_of_this_process(&format!(
        "cannot reach its run's directory {} (the run ended, or another file system is at that path: a \
         sandbox's private /tmp, a chroot): it pages under a limit of its own, {limit}, left out of uswap run's \
         figures; to keep a sandbox in the tree, give uswap run a TMPDIR the sandbox shares (docs/cli.md)",
        dir.display()
    ));
}

/// Set in a fork child of a managed process that could not get a pager of its own (and so
/// runs unmanaged, see [`fork`]).
static UNMANAGED_FORK_CHILD: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Whether this process is a fork child that runs unmanaged.
pub fn is_unmanaged_fork_child() -> bool {
    UNMANAGED_FORK_CHILD.load(Ordering::Relaxed)
}

pub(crate) fn note_unmanaged_fork_child() {
    UNMANAGED_FORK_CHILD.store(true, Ordering::Relaxed);
}

/// The process's pager, once started; none in a fork child that could not get one of its
/// own (see [`fork`]).
pub fn pager() -> Option<&'static uswap::Pager> {
    if is_unmanaged_fork_child() {
        return None;
    }
    let p = PAGER.load(Ordering::Acquire);
    // SAFETY: non-null only once `set_pager` stored a leaked box, which lives for ever.
    (!p.is_null()).then(|| unsafe { &*p })
}

/// The constructor's work: the configuration, then the pager now
/// (`USWAP_START_AFTER=0`) or the heap as ordinary memory until the pager is needed
/// ([`start_if_waiting`]).
fn prepare() -> Result<(), String> {
    let _g = own_code::Guard::enter();
    // First: whatever this process does, its children get the user's own preload list.
    sanitizer_env::restore();
    // Before anything reads the engine's clock (the charge's times): the C library's own,
    // not a faked one a later preload (libfaketime) puts in front of it.
    uswap::use_the_c_librarys_clock();
    // Before the configuration sizes anything to an address-space limit.
    let set_inside = rlimit::inherit();
    let cfg = config::Config::from_env(set_inside)?;
    // Set once, here: the constructor runs once per image.
    let cfg = CONFIG.get_or_init(move || cfg);
    if cfg.stats_dir.is_some() {
        escape::init_here();
    }
    program_userfaultfd::resolve();
    last_thread::resolve();
    if own_allocator::under_valgrind() {
        own_allocator::stand_aside_under_valgrind();
        return Ok(());
    }
    if program_system_calls::program_needs_no_library() {
        program_system_calls::stand_aside();
        return Ok(());
    }
    if let Some(name) = own_allocator::program_allocator() {
        own_allocator::stand_aside(name);
        return Ok(());
    }
    PAGES_THE_PROCESS.store(true, Ordering::Release);
    // The C library's malloc serves uswap, and the program's first blocks until mimalloc
    // comes up (`heap`): one arena, and blocks up to 32 MiB from the brk heap rather than
    // mappings of their own, so that its memory is the `[heap]` a report of the program's
    // unmanaged memory measures apart (`unmanaged`). Its heap grows 1 MiB ahead of what it
    // hands out, so that the engine's threads rarely need the kernel for more: a program
    // that holds every mapping it may have (`vm.max_map_count`; stress-ng's brk stressor
    // does until it resets) makes the kernel refuse a growing break, and an engine
    // allocation that fails ends the process. (Trimmed, the heap keeps as much: at most 1
    // MiB of freed memory stays resident, against 128 KiB.)
    // SAFETY: mallopt only sets glibc malloc tunables.
    unsafe {
        libc::mallopt(libc::M_ARENA_MAX, 1);
        libc::mallopt(libc::M_MMAP_THRESHOLD, 32 << 20);
        libc::mallopt(libc::M_TOP_PAD, 1 << 20);
    }
    program_break::enable();
    fork::start()?;
    if cfg.start_after_bytes == 0 {
        return start_pager(cfg, None);
    }
    if let (uswap::FaultMode::Signal, Some(dir)) = (cfg.fault_mode, &cfg.stats_dir) {
        // Before the program maps its own files: the place of the tree's kept trampolines,
        // for this process's pager if it starts (see `route_system_calls`).
        uswap::syscall_guard::reserve_image_place(dir);
    }
    let len = cfg.heap_bytes;
    let start = reserve_heap(len)?;
    // mimalloc comes up when the heap first needs it (`heap`, "The C library's heap first").
    heap::prepare(start, len, cfg.start_after_bytes);
    // The kernel's address-space limit is refitted once the pager runs (`start_pager`):
    // until then the one a managed parent gave, with room for its own pager, stays.
    WAITING.store(true, Ordering::Release);
    Ok(())
}

/// Called by the first stage once its `dlopen` of this library returned and its entry points
/// lead here: the constructor's work, which the constructor leaves for now where the first
/// stage loaded this library. Not inside the `dlopen`: the loader's lock is held there, which
/// a pager's new threads take (their thread-locals' destructors) while the start waits on
/// them (a thread-mode fault: a hang); and the interposed calls the work makes itself
/// (`getrlimit`, which reports the limit the program set) would reach the C library's.
/// Returns 0 where this library could not set itself up after `main` (said and noted): the
/// first stage then sends every call back to the C library.
#[no_mangle]
pub extern "C" fn uswap_preload_after_load() -> std::ffi::c_int {
    if !first_stage::loaded_by_shim() {
        return 0;
    }
    std::ffi::c_int::from(start_up())
}

extern "C" fn init() {
    // Before anything reads the environment or the C library's functions.
    match first_stage::resolve() {
        first_stage::Loader::ByHand => {
            start_up();
        }
        // Once the first stage's entry points lead here (`uswap_preload_after_load`), or
        // never (a first stage of another build, which does not use this library).
        first_stage::Loader::Shim | first_stage::Loader::OtherShim => {}
    }
}

/// The constructor's work (the first stage calls it after its load): whether this library
/// serves the process (`false` only where it could not set itself up after `main`).
fn start_up() -> bool {
    // The C library has started: its allocator is found now, whatever the program does to
    // its environment later (`real::ready`).
    real::find_c_library_allocator();
    if first_stage::var_os(config::ENV_DISABLE).is_some() {
        return true;
    }
    if let Err(e) = prepare() {
        if first_stage::loaded_after_main() {
            // The program runs: it goes on with the C library's memory, as one whose pager
            // could not start (the first stage sends its calls there again).
            PAGES_THE_PROCESS.store(false, Ordering::Release);
            let msg = format!("uswap: process {} runs unmanaged, every byte kept: {e}\n", std::process::id());
            real::write_stderr(msg.as_bytes());
            note_refusal(&msg);
            return false;
        }
        let msg = format!("uswap: cannot manage this process ({}): {e}\n", std::process::id());
        note_refusal(&msg);
        real::fatal(msg.as_bytes());
    }
    true
}

/// Set from the constructor until the pager starts (lazy start, see the module doc).
static WAITING: AtomicBool = AtomicBool::new(false);

/// Whether this process waits for its pager (lazy start).
pub fn is_waiting() -> bool {
    WAITING.load(Ordering::Acquire)
}

/// The thread (its id) that is starting a waiting process's pager, from before `WAITING`
/// falls until the start returns; 0 otherwise. A start takes milliseconds (the pager's
/// devices and threads, then the hand-over of the heap and the deferred mappings): in
/// that time the process neither waits nor has its pager, and a mapping call of another
/// thread that went to the kernel then would leave memory out of the budget, or change
/// memory being handed over (a range unmapped after it was noted, adopted with whatever
/// the kernel mapped there next). Those calls wait for the start ([`wait_for_start`]).
static STARTING_TID: std::sync::atomic::AtomicI32 = std::sync::atomic::AtomicI32::new(0);

/// In a fork child: a start the parent had under way (on another thread, which the child
/// does not have) is forgotten, and the child waits for its own pager if it was waiting
/// when the start began. (The deferred ranges, if that start had already taken them, are
/// the parent's thread's: the child's copy of those mappings stays the kernel's.)
pub fn forget_start_in_fork_child() {
    if STARTING_TID.swap(0, Ordering::AcqRel) != 0 && pager().is_none() {
        WAITING.store(true, Ordering::Release);
    }
}

/// Whether a thread is starting this process's pager now (this one too: see
/// [`wait_for_start`]).
pub fn is_starting() -> bool {
    STARTING_TID.load(Ordering::Acquire) != 0
}

/// The calling thread's id (gettid).
pub(crate) fn this_thread_id() -> i32 {
    // SAFETY: gettid takes no arguments and cannot fail.
    unsafe { libc::syscall(libc::SYS_gettid) as i32 }
}

/// Waits until no other thread is starting this process's pager (see [`STARTING_TID`]);
/// returns at once when none is, and on the starting thread itself (its own calls during
/// the start are the engine's). Bounded: past 100,000 sleeps of 100 µs (ten seconds or
/// more) it goes on, as if the start had failed, rather than hang the program.
pub fn wait_for_start() {
    let starting = STARTING_TID.load(Ordering::Acquire);
    if starting == 0 || starting == this_thread_id() {
        return;
    }
    for _ in 0..100_000 {
        if STARTING_TID.load(Ordering::Acquire) == 0 {
            return;
        }
        std::thread::sleep(std::time::Duration::from_micros(100));
    }
}

/// Clears [`STARTING_TID`] when the start returns, whichever way.
struct StartInProgress;

impl Drop for StartInProgress {
    fn drop(&mut self) {
        STARTING_TID.store(0, Ordering::Release);
    }
}

/// Reserves the heap's address space as ordinary memory (lazy start): inaccessible until
/// mimalloc is handed a part of it, which then becomes readable and writable, committed by
/// the kernel on first touch (`heap::make_usable`); no transparent huge pages (the pager
/// will take it over, and moves split them). Not even the first arena is made usable here:
/// where overcommit is strict, the kernel charges a writable private mapping in full
/// (`MAP_NORESERVE` notwithstanding), 256 MiB for every process of a tree, most of which
/// never bring mimalloc up; and a refusal here would end the process, where one at
/// mimalloc's bring-up leaves it unmanaged, every byte kept. (The split that bring-up
/// makes needs one more mapping, which a program that holds `vm.max_map_count` of them
/// cannot have: it then runs unmanaged, said.)
fn reserve_heap(len: usize) -> Result<usize, String> {
    let p = real::sys_mmap(
        std::ptr::null_mut(),
        len,
        libc::PROT_NONE,
        libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
        -1,
        0,
    );
    if p == libc::MAP_FAILED {
        return Err(format!("cannot reserve the heap ({len} bytes): {}", std::io::Error::last_os_error()));
    }
    // SAFETY: advice on the mapping just made; it changes how the kernel backs it only.
    unsafe { libc::madvise(p, len, libc::MADV_NOHUGEPAGE) };
    // An `mlockall` locks the heap as it is touched: bringing all of what is usable in
    // would be bringing in a 256 MiB arena the program has not asked for.
    uswap::note_lock_on_fault(p as usize, len);
    Ok(p as usize)
}

/// What brought a waiting process's pager up (said only if the start fails).
#[derive(Clone, Copy)]
pub(crate) enum StartCause {
    /// The heap's committed bytes passed `USWAP_START_AFTER`.
    Heap,
    /// The tree's charge reached half its limit (`waiting_charge`).
    TreeCharge,
    /// What it holds passed 16 MiB with no tree to charge it to (`waiting_charge`).
    Unchargeable,
    /// A mapping that would be managed (its bytes).
    Mapping(usize),
    /// The program's first thread.
    Thread,
    /// The program set its own address-space limit (`ulimit -v`; see `rlimit`).
    AddressSpaceLimit,
    /// What it holds outside any region (small mappings, its own break: its bytes) passed
    /// `USWAP_START_AFTER` with its heap (`waiting_charge::note_small_mapping`).
    Unmanaged(usize),
    /// A coroutine's stack (`makecontext`; its bytes), let go of in signal mode
    /// (`program_stacks`).
    Stack(usize),
}

impl std::fmt::Display for StartCause {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            StartCause::Heap => write!(f, "its heap"),
            StartCause::TreeCharge => write!(f, "its tree's charge at half the limit"),
            StartCause::Unchargeable => write!(f, "16 MiB of heap and mappings with no tree to charge them to"),
            StartCause::Mapping(bytes) => write!(f, "a mapping of {bytes} bytes"),
            StartCause::Thread => write!(f, "its first thread"),
            StartCause::AddressSpaceLimit => write!(f, "an address-space limit it set"),
            StartCause::Unmanaged(bytes) => write!(f, "{bytes} bytes of small mappings and break"),
            StartCause::Stack(bytes) => write!(f, "a coroutine's stack of {bytes} bytes"),
        }
    }
}

/// Starts the pager of a process that waits for it (lazy start), once, on the thread that
/// needs it; a no-op otherwise. A failure is said on stderr and left as a refusal for
/// `uswap run`; the process goes on unmanaged, every byte kept. Must not be called from a
/// signal handler (it allocates, maps and starts threads).
pub(crate) fn start_if_waiting(cause: StartCause) {
    if !is_waiting() || !own_process::is_own_process() {
        // Another thread may be starting it: what the caller does next is made on the
        // pager it starts.
        wait_for_start();
        return;
    }
    let Some(cfg) = config() else { return };
    if program_seccomp::filtered() {
        // Its calls, and its threads' (a filter applies to the threads its thread starts),
        // are the filter's: the process goes on with the kernel's memory.
        return;
    }
    if in_signal_handler() {
        // On an alternate signal stack: the start waits for the next cause. It makes
        // threads, and the code a handler interrupted may hold the C library's locks for
        // that. (A handler on the thread's own stack is not told apart, but by signal
        // mode's rewrite, `route_system_calls`.)
        return;
    }
    // Raised before `WAITING` falls, so that a mapping call never finds neither.
    if STARTING_TID.compare_exchange(0, this_thread_id(), Ordering::AcqRel, Ordering::Acquire).is_err() {
        wait_for_start();
        return;
    }
    let _starting = StartInProgress;
    if WAITING.compare_exchange(true, false, Ordering::AcqRel, Ordering::Acquire).is_err() {
        return;
    }
    // The pager takes the heap over as mimalloc's region: up first, if it is not yet (a
    // refusal there is said and recorded by `bring_up`).
    heap::bring_up();
    if heap::arena_start() == 0 {
        return;
    }
    let heap = (heap::arena_start(), cfg.heap_bytes, heap::committed_extent());
    if let Err(e) = start_pager(cfg, Some(heap)) {
        if let (Some(seg), Some(_)) = (segment(), own_slot()) {
            // Claimed for a pager that did not come: the slot goes (the run fails anyway).
            seg.leave(std::process::id());
            set_own_slot(None);
        }
        let msg = format!(
            "uswap: process {} runs unmanaged, every byte kept (its pager was to start for {cause}): {e}\n",
            std::process::id()
        );
        real::write_stderr(msg.as_bytes());
        note_refusal(&msg);
    }
}

/// Builds the pager and makes it the process's: `heap`, the heap reserved as ordinary
/// memory (start, length, and the prefix that may have been touched) to take over, or none
/// to map it now (start before `main`).
fn start_pager(cfg: &'static config::Config, heap: Option<(usize, usize, usize)>) -> Result<(), String> {
    let _g = own_code::Guard::enter();
    let mut fault_mode = fault_mode_now(cfg, heap.is_some());
    // Here, when the process first needs a pager, not as the library loads: most processes
    // of a tree never need one, and the rewrite cost each about a millisecond. (A fork
    // child of a process that did it has it already.)
    if fault_mode == uswap::FaultMode::Signal && !uswap::syscall_guard::started() {
        if let Some(why) = route_system_calls(cfg)? {
            // Thread mode rewrites nothing and keeps the budget from now on; putting the
            // start off instead left what a handler wrote outside the budget until the
            // next cause. (Maybe in a signal handler: no `eprintln!` and its lock.)
            let msg = format!("uswap: process {} runs in thread mode: {why}\n", std::process::id());
            real::write_stderr(msg.as_bytes());
            fault_mode = uswap::FaultMode::Thread;
        }
    }
    if fault_mode == uswap::FaultMode::Signal && heap.is_some() {
        // What the program blocked before its pager existed: SIGBUS must get through.
        unblock_sigbus();
    }
    // What follows is the engine's set-up, not the program's calls (a file device's rings
    // are not the program's io_uring).
    let _direct = uswap::syscall_guard::EngineCalls::enter();
    let mut builder = cfg.builder().fault_mode(fault_mode).regions_survive_fork(true);
    let out_of_reach = match open_segment()? {
        Some(seg) => {
            builder = join_tree(seg, builder);
            false
        }
        None => run_dir_out_of_reach(cfg),
    };
    let pager = builder.build().map_err(|e| format!("cannot start the pager: {e}"))?;
    // Not yet the process's pager (`pager()` stays None until start-up is done).
    let pager: &'static uswap::Pager = Box::leak(Box::new(pager));
    if fault_mode == uswap::FaultMode::Signal {
        // Before any memory is the pager's: a handler with SIGBUS in its mask, installed
        // before now or meanwhile, must not meet a page that is out.
        signals::start();
    }
    let heap_region = match heap {
        Some((start, len, touched)) => pager
            .adopt_touched_prefix(start, len, touched)
            .map_err(|e| format!("cannot take the heap over ({len} bytes at {start:#x}): {e}"))?,
        None => pager
            .map(cfg.heap_bytes)
            .map_err(|e| format!("cannot map the managed heap ({} bytes): {e}", cfg.heap_bytes))?,
    };
    let (start, len) = (heap_region.as_ptr() as usize, heap_region.len());
    // The heap region lives as long as the process.
    std::mem::forget(heap_region);
    if heap.is_none() {
        heap::start(start, len, None)?;
    }
    mmap::start(cfg.min_size_bytes);
    mmap::adopt_deferred(pager);
    report::start(cfg.stats_dir.clone());
    PAGER.store(pager as *const uswap::Pager as *mut uswap::Pager, Ordering::Release);
    rlimit::refit();
    if fault_mode == uswap::FaultMode::Signal {
        altstack::install_on_this_thread();
        uswap::note_thread_start();
    }
    core_dump::start();
    if out_of_reach {
        say_out_of_reach(cfg);
    }
    Ok(())
}

/// The fault mode a pager starting now gets: the one asked for, but thread mode for a
/// signal-mode start (after `main`: `lazy`) in a process that signal mode cannot serve.
/// Said on stderr when it differs.
fn fault_mode_now(cfg: &config::Config, lazy: bool) -> uswap::FaultMode {
    if cfg.fault_mode == uswap::FaultMode::Thread {
        return thread_mode_if_still_permitted(cfg, lazy);
    }
    if cfg.fault_mode != uswap::FaultMode::Signal {
        return cfg.fault_mode;
    }
    // A thread uswap did not see start (made with a raw `clone`, or in another library's
    // constructor) has no alternate signal stack of uswap's for its SIGBUS frames (see
    // `altstack`); and asynchronous I/O set up before the start has rings the kernel will
    // read and write on its own, which signal mode cannot serve. Where `auto` chose signal
    // mode, a process a debugger follows (`gdb ./prog` under `uswap run`) gets thread mode
    // where this user may have it: each of its faults would be a SIGBUS that stops it in the
    // debugger.
    let threads = if lazy { thread_count() } else { Ok(1) };
    let why = if let Err(e) = &threads {
        format!("it cannot tell whether it has threads uswap did not see start (/proc/self/stat: {e})")
    } else if threads.is_ok_and(|n| n != 1) {
        "it has threads uswap did not see start".to_string()
    } else if lazy && async_io_in_use() {
        "it set up io_uring or AIO before its pager started, and the kernel's own accesses need it".to_string()
    } else if cfg.fault_mode_auto && traced() && uswap::thread_mode_permitted() {
        "a debugger or tracer follows it (ptrace), which signal mode's faults, each a SIGBUS, would stop".to_string()
    } else {
        return uswap::FaultMode::Signal;
    };
    crate::real::write_stderr(format!("uswap: process {} runs in thread mode: {why}\n", std::process::id()).as_bytes());
    uswap::FaultMode::Thread
}

/// Thread mode as `auto` chose it at the start (the process links liburing or libaio), unless
/// the process may no longer open the userfaultfd it takes: a server started as root that
/// dropped to its own user before its pager started (`mariadbd` with `user=mysql`,
/// `memcached -u`) ran wholly outside the budget, the run failing at its end. Signal mode
/// needs no permission; what the kernel does on its own in memory that is out (io_uring,
/// AIO) then fails with `EFAULT`, said and counted (`syscall_async_kernel_access`). Asked
/// for by the user (`--fault-mode thread`), thread mode stays, and its refusal is said.
fn thread_mode_if_still_permitted(cfg: &config::Config, lazy: bool) -> uswap::FaultMode {
    let signal_mode_can_start = !lazy || (single_threaded() && !async_io_in_use());
    if !cfg.fault_mode_auto || !signal_mode_can_start || uswap::thread_mode_permitted() {
        return uswap::FaultMode::Thread;
    }
    // SAFETY: getuid cannot fail.
    let uid = unsafe { libc::getuid() };
    crate::real::write_stderr(
        format!(
            "uswap: process {} runs in signal mode: thread mode, which `auto` chose for it, needs a userfaultfd that \
             this user (uid {uid}) may not open (it changed user after it started); the kernel's own accesses to \
             its memory that is out (io_uring, AIO) will fail and be said\n",
            std::process::id()
        )
        .as_bytes(),
    );
    uswap::FaultMode::Signal
}

/// Signal mode: every `syscall` instruction of the C library goes through uswap's dispatch
/// from now on (see `uswap::syscall_guard`), with this library's hooks around them (the
/// memory locks it records, the alternate stacks it pins). Called when the first
/// signal-mode pager starts, with one thread. `Some(why)`, with nothing changed, when this
/// thread may resume inside the code it replaces (a signal handler that interrupted the C
/// library, a `read` waiting, may run now: its return would land inside a new jump), or
/// when that cannot be told.
fn route_system_calls(cfg: &config::Config) -> Result<Option<&'static str>, String> {
    static HOOKS: uswap::syscall_guard::SyscallHooks = uswap::syscall_guard::SyscallHooks {
        mlock_before: mlock::before,
        mlock_populates: mlock::populates,
        mlock_after: mlock::after,
        note_altstack: altstack::note_program_stack,
    };
    // Below the program's call into this library, only this library's frames: not read.
    let program_sp = program_frames::program_stack_pointer();
    // SAFETY: once (the caller checks `started`), with one thread (`fault_mode_now`, or the
    // constructor), not on an alternate signal stack (`start_if_waiting`); `program_sp` as
    // found above.
    let r = match unsafe { uswap::syscall_guard::start(cfg.stats_dir.as_deref(), &HOOKS, program_sp) } {
        Ok(r) => r,
        Err(uswap::syscall_guard::PatchError::Interrupted { .. }) => {
            return Ok(Some(
                "its pager starts where a signal handler may have interrupted the C library's code, \
                 which signal mode would rewrite under it",
            ))
        }
        Err(uswap::syscall_guard::PatchError::StackUnknown { .. }) => {
            return Ok(Some(
                "its pager starts on a stack uswap cannot read (a coroutine's?), so it cannot check that \
                 signal mode's rewrite of the C library is safe there",
            ))
        }
        Err(e) => return Err(format!("cannot route system calls through uswap: {e}")),
    };
    if r.patched == r.sites {
        // With the alternate signal stacks every thread gets (see `altstack`).
        uswap::sigbus::note_system_calls_routed();
    }
    if r.patched < r.sites {
        // Said once per process: a call made from one of them on memory that is out
        // fails with EFAULT (counted in syscall_efault only if it went through uswap).
        crate::real::write_stderr(format!(
            "uswap: {} of {} system call instructions of the C library could not be routed through uswap (signal mode); \
             a call made from one of them on managed memory that is out fails with EFAULT: use --fault-mode thread if the program misbehaves\n",
            r.sites - r.patched,
            r.sites
        ).as_bytes());
    }
    Ok(None)
}

/// Whether this thread runs a signal handler on its alternate signal stack (only handlers
/// run there). A handler on the thread's own stack is not told apart: its frame has no
/// mark that a stale copy lower on the stack would not have too.
pub(crate) fn in_signal_handler() -> bool {
    // SAFETY: an all-zero stack_t is valid; sigaltstack only writes it.
    let mut ss: libc::stack_t = unsafe { std::mem::zeroed() };
    // SAFETY: a query (no new stack), into `ss`.
    unsafe { libc::sigaltstack(std::ptr::null(), &mut ss) == 0 && ss.ss_flags & libc::SS_ONSTACK != 0 }
}

/// Whether the process has one thread (`/proc/self/stat`'s 20th field); false when unknown.
fn single_threaded() -> bool {
    thread_count().is_ok_and(|n| n == 1)
}

/// The process's number of threads (field 20 of `/proc/self/stat`), or why it is not known
/// (no descriptor left to read it, for one).
fn thread_count() -> std::io::Result<u64> {
    let stat = std::fs::read_to_string("/proc/self/stat")?;
    let bad = || std::io::Error::new(std::io::ErrorKind::InvalidData, "no thread count");
    // The command name (field 2) may hold spaces and parentheses: count from its end.
    let after_comm = stat.rfind(')').map(|i| &stat[i + 1..]).ok_or_else(bad)?;
    after_comm.split_whitespace().nth(17).and_then(|n| n.parse().ok()).ok_or_else(bad)
}

/// Whether a tracer (a debugger, strace) is attached to this process (`TracerPid` in
/// `/proc/self/status`); false when unknown.
fn traced() -> bool {
    let Ok(status) = std::fs::read_to_string("/proc/self/status") else { return false };
    status.lines().find_map(|l| l.strip_prefix("TracerPid:")).is_some_and(|pid| pid.trim() != "0")
}

/// Whether the process has an io_uring instance (a descriptor `anon_inode:[io_uring]`) or an
/// AIO context (a `/[aio]` mapping); false when unknown.
fn async_io_in_use() -> bool {
    io_uring_descriptor(|_| true) || aio_mapped()
}

/// Whether `/proc/self/maps` lists an AIO context (`/[aio]`), read a buffer at a time:
/// nothing the size of the file is allocated.
fn aio_mapped() -> bool {
    let mut aio = false;
    uswap::for_each_maps_line::<{ uswap::MAPS_LINE_BYTES }>(|line| {
        aio = line.windows(6).any(|w| w == b"/[aio]");
        match aio {
            true => std::ops::ControlFlow::Break(()),
            false => std::ops::ControlFlow::Continue(()),
        }
    });
    aio
}

/// Whether a descriptor of the process that `counted(fd)` accepts is an io_uring instance
/// (`anon_inode:[io_uring]`); false when unknown.
pub(crate) fn io_uring_descriptor(counted: impl Fn(i32) -> bool) -> bool {
    std::fs::read_dir("/proc/self/fd").into_iter().flatten().flatten().take(1 << 16).any(|e| {
        let fd = e.file_name().to_str().and_then(|n| n.parse::<i32>().ok());
        fd.is_some_and(&counted)
            && std::fs::read_link(e.path()).is_ok_and(|t| t.as_os_str().as_encoded_bytes().ends_with(b"[io_uring]"))
    })
}

/// Takes SIGBUS out of this thread's mask (a signal-mode pager's faults are SIGBUS).
fn unblock_sigbus() {
    // SAFETY: an empty set with SIGBUS added, passed to the C library's pthread_sigmask
    // (uswap's own call: `signals` lets it through).
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        libc::sigaddset(&mut set, libc::SIGBUS);
        libc::pthread_sigmask(libc::SIG_UNBLOCK, &set, std::ptr::null_mut());
    }
}

/// Leaves `msg` where `uswap run` looks once the program ended (`refused-<pid>.txt` in the
/// run's directory), so that a run in which some process was refused a pager fails, even
/// when that process is one whose status nobody reads (a shell's background job) or one
/// that went on unmanaged (a fork child).
pub(crate) fn note_refusal(msg: &str) {
    let Some(dir) = first_stage::var_os(config::ENV_STATS_DIR) else { return };
    let path = std::path::Path::new(&dir).join(format!("{}{}.txt", uswap::shared_charge::REFUSAL_PREFIX, file_tag()));
    let Err(e) = report::write_new(&path, msg.as_bytes()) else { return };
    // Out of descriptors (a process at its `RLIMIT_NOFILE` is refused for that very reason):
    // a link needs none, and the run still fails.
    let Err(link) = report::link_note(&path, msg) else { return };
    // The refusal itself is said on stderr by the caller; this says why the run may not
    // know of it.
    let why = format!("uswap: cannot record the refusal in {}: {e} (and as a link: {link})\n", path.display());
    crate::real::write_stderr(why.as_bytes());
}

extern "C" fn fini() {
    // Under the program's seccomp filter, no call it did not expect (see `program_seccomp`).
    if program_seccomp::filtered() {
        return;
    }
    report::write_final();
    waiting_charge::leave();
}

/// Runs `init` when the library is loaded, before the program's `main`.
#[used]
#[link_section = ".init_array"]
static INIT: extern "C" fn() = init;

/// Runs `fini` at `exit()` (not at `_exit()` or a fatal signal; see `report`).
#[used]
#[link_section = ".fini_array"]
static FINI: extern "C" fn() = fini;
