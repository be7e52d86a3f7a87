//! `libuswap_preload.so`: the library `uswap run` preloads into an unmodified program so
//! that uswap pages its memory.
//!
//! At load (an ELF constructor, before the program's `main`) it builds a [`uswap::Pager`]
//! from the environment `uswap run` sets ([`config`]), maps one large managed region for the
//! heap and hands it to mimalloc ([`heap`]), and starts managing the program's large
//! anonymous `mmap`s ([`mmap`]); what glibc allocates for a new thread stays out of the
//! managed heap ([`threads`]). At exit it writes the pager's counters where `uswap run`
//! collects them ([`report`]). A process started by exec loads it again (the environment is
//! inherited) and gets a pager of its own.
//!
//! The engine and this library allocate only from the C library's malloc ([`real`]), never
//! from the memory they manage; `heap::Guard` marks this library's own code on a thread.
//!
//! If the pager cannot be built (no userfaultfd, a bad device list), the process stops with
//! a message and exit status 2 rather than run unmanaged: a budget that silently does not
//! apply is worse than none.

pub mod altstack;
mod config;
pub mod fds;
pub mod fork;
pub mod heap;
pub mod locale;
pub mod mlock;
pub mod mmap;
pub mod own_code;
pub mod real;
pub mod report;
pub mod rlimit;
pub mod signals;
pub mod syscalls;
pub mod threads;
pub mod unmanaged;

#[global_allocator]
static ALLOCATOR: real::LibcAllocator = real::LibcAllocator;

use std::sync::atomic::{AtomicPtr, Ordering};
use std::sync::OnceLock;

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
static OWN_SLOT: std::sync::Mutex<Option<uswap::shared_charge::OwnSlot>> = std::sync::Mutex::new(None);

/// Notes this process's slot (see [`own_slot`]).
pub(crate) fn set_own_slot(own: Option<uswap::shared_charge::OwnSlot>) {
    *OWN_SLOT.lock().unwrap_or_else(|e| e.into_inner()) = own;
}

/// This process's slot in the shared charge segment, if any.
pub fn own_slot() -> Option<uswap::shared_charge::OwnSlot> {
    *OWN_SLOT.lock().unwrap_or_else(|e| e.into_inner())
}

/// Takes a slot of `seg` for this process (noted: [`own_slot`]) and charges `builder`'s
/// pager to the tree through it: its pages, its pools and its devices. With every slot
/// taken, the pager runs under its own limit only (said in its record).
pub(crate) fn join_tree(
    seg: &uswap::shared_charge::ChargeSegment,
    builder: uswap::PagerBuilder,
) -> uswap::PagerBuilder {
    let own = seg.claim(std::process::id());
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

/// The shared charge segment, if this process is under one.
pub fn segment() -> Option<&'static uswap::shared_charge::ChargeSegment> {
    SEGMENT.get()
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

fn start() -> Result<(), String> {
    let _g = own_code::Guard::enter();
    // The C library's malloc serves only uswap from now on (the program's goes to the
    // managed heap): one arena, and blocks up to 32 MiB from the brk heap rather than
    // mappings of their own, so that uswap's own memory is the `[heap]` a report of the
    // program's unmanaged memory leaves out (`unmanaged`).
    // SAFETY: mallopt only sets glibc malloc tunables.
    unsafe {
        libc::mallopt(libc::M_ARENA_MAX, 1);
        libc::mallopt(libc::M_MMAP_THRESHOLD, 32 << 20);
    }
    // Before the configuration sizes anything to an address-space limit.
    let limit_set_inside = rlimit::inherit();
    let cfg = config::Config::from_env(limit_set_inside)?;
    if cfg.fault_mode == uswap::FaultMode::Signal {
        // SAFETY: the library's constructor: the process has one thread.
        let r = unsafe { syscalls::start(cfg.stats_dir.as_deref()) }
            .map_err(|e| format!("cannot route system calls through uswap: {e}"))?;
        if r.patched == r.sites {
            // With the alternate signal stacks every thread gets (see `altstack`).
            uswap::sigbus::note_system_calls_routed();
        }
        if r.patched < r.sites {
            // Said once per process: a call made from one of them on memory that is out
            // fails with EFAULT (counted in syscall_efault only if it went through uswap).
            eprintln!(
                "uswap: {} of {} system call instructions of the C library could not be routed through uswap (signal mode); \
                 a call made from one of them on managed memory that is out fails with EFAULT: use --fault-mode thread if the program misbehaves",
                r.sites - r.patched,
                r.sites
            );
        }
    }
    // What follows is the engine's set-up, not the program's calls (a file device's rings
    // are not the program's io_uring).
    let _direct = syscalls::EngineCalls::enter();
    let mut builder = cfg.builder().regions_survive_fork(true);
    if let Some(dir) = &cfg.stats_dir {
        let path = dir.join(uswap::shared_charge::SEGMENT_FILE);
        if path.exists() {
            let seg = uswap::shared_charge::ChargeSegment::open(&path)
                .map_err(|e| format!("cannot open the shared charge {}: {e}", path.display()))?;
            seg.sweep_dead();
            builder = join_tree(&seg, builder);
            let _ = SEGMENT.set(seg);
        }
    }
    let pager = builder.build().map_err(|e| format!("cannot start the pager: {e}"))?;
    // Not yet the process's pager (`pager()` stays None until start-up is done).
    let pager: &'static uswap::Pager = Box::leak(Box::new(pager));
    let heap_region = pager
        .map(cfg.heap_bytes)
        .map_err(|e| format!("cannot map the managed heap ({} bytes): {e}", cfg.heap_bytes))?;
    let (start, len) = (heap_region.as_ptr() as usize, heap_region.len());
    // The heap region lives as long as the process.
    std::mem::forget(heap_region);
    heap::start(start, len)?;
    mmap::start(cfg.min_size_bytes);
    report::start(cfg.stats_dir.clone());
    PAGER.store(pager as *const uswap::Pager as *mut uswap::Pager, Ordering::Release);
    let signal_mode = cfg.fault_mode == uswap::FaultMode::Signal;
    let _ = CONFIG.set(cfg);
    fork::start()?;
    rlimit::refit();
    if signal_mode {
        signals::start();
        altstack::install_on_this_thread();
        uswap::note_thread_start();
    }
    Ok(())
}

extern "C" fn init() {
    if std::env::var_os(config::ENV_DISABLE).is_some() {
        return;
    }
    if let Err(e) = start() {
        let msg = format!("uswap: cannot manage this process ({}): {e}\n", std::process::id());
        note_refusal(&msg);
        real::fatal(msg.as_bytes());
    }
}

/// Leaves `msg` where `uswap run` looks once the program ended (`refused-<pid>.txt` in the
/// run's directory), so that a run in which some process was refused a pager fails, even
/// when that process is one whose status nobody reads (a shell's background job) or one
/// that went on unmanaged (a fork child).
pub(crate) fn note_refusal(msg: &str) {
    let Some(dir) = std::env::var_os(config::ENV_STATS_DIR) else { return };
    let path =
        std::path::Path::new(&dir).join(format!("{}{}.txt", uswap::shared_charge::REFUSAL_PREFIX, std::process::id()));
    if let Err(e) = std::fs::write(&path, msg) {
        // The refusal itself is said on stderr by the caller; this says why the run may not
        // know of it.
        eprintln!("uswap: cannot record the refusal in {}: {e}", path.display());
    }
}

extern "C" fn fini() {
    report::write_final();
}

/// Runs `init` when the library is loaded, before the program's `main`.
#[used]
#[link_section = ".init_array"]
static INIT: extern "C" fn() = init;

/// Runs `fini` at `exit()` (not at `_exit()` or a fatal signal; see `report`).
#[used]
#[link_section = ".fini_array"]
static FINI: extern "C" fn() = fini;
