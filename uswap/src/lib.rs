//! uswap: a swap subsystem in user space.
//!
//! A [`Pager`] gives a process managed memory regions whose resident size is capped. Cold
//! pages move out to swap devices (a compressed RAM pool, uncompressed RAM, a file through
//! io_uring, a Redis store with replicas) and come back on first touch through userfaultfd, with the machinery the Linux swap subsystem grew for
//! fast devices: per-cluster slot allocation with a per-CPU fast path, a swap cache sharded
//! per cluster, batched moves, and a choice of fault delivery (handler threads, or the
//! faulting thread itself in a SIGBUS handler).
//!
//! ```no_run
//! # fn main() -> Result<(), uswap::Error> {
//! let pager = uswap::Pager::builder()
//!     .resident_limit(256 << 20)                    // bytes of application pages in RAM
//!     .fault_mode(uswap::FaultMode::Thread)         // or FaultMode::Signal
//!     .device(uswap::DeviceConfig::ram(4 << 30))    // an uncompressed RAM swap device
//!     .build()?;
//! let mut region = pager.map(1 << 30)?;             // zero-filled, page-aligned, managed
//! region.as_mut_slice()[12345] = 7;                 // any thread may touch any page
//! let stats = pager.stats();                        // pswpin, pswpout, faults by kind, ...
//! pager.set_resident_limit(128 << 20)?;             // takes effect at once
//! drop(region);                                     // frees every slot it held
//! # let _ = stats; Ok(()) }
//! ```
//!
//! See `docs/design.md` in the repository for the architecture and the measured cost of every
//! userfaultfd operation, and `BENCHMARKS.md` for comparisons with the kernel's own swap.

// The README's Rust example is compiled and run as a doc test, so it cannot drift from the API.
#[cfg(doctest)]
#[doc = include_str!("../../README.md")]
struct ReadmeDoctests;

mod adopt;
mod async_readahead;
pub mod backend;
mod bounce;
pub mod budget;
mod clock;
mod core_dump;
mod device_config;
mod error;
mod events;
mod fault;
mod fault_service;
pub mod fd;
mod fifo;
mod fork;
mod fork_advice;
mod lru;
mod mapping;
pub mod mlock;
mod options;
mod page_table;
mod pager;
mod pin;
pub mod pressure;
mod readahead;
mod reclaim;
mod region;
mod region_handle;
mod release;
pub mod shared_charge;
mod state;
pub mod stats;
pub mod stats_server;
mod swap;
mod swapin;
mod sync;
pub mod syscall_guard;
mod uffd;
mod user_access;

pub use async_readahead::{DEFAULT_ASYNC_WINDOWS, MAX_ASYNC_WINDOWS};
pub use backend::failing::FaultInjection;
pub use backend::redis::RedisOptions;
pub use backend::zpool::{Compressor, Incompressible};
pub use clock::resolve as use_the_c_librarys_clock;
pub use core_dump::CoreDumpPrepared;
pub use device_config::{parse_size, DeviceConfig};
pub use error::{Error, ErrorKind, Result};
pub use events::UnmapUnderWay;
pub use mapping::{
    address_space_limit, address_space_limit_bytes, become_program_thread, engine_reserved_bytes, for_each_line_of,
    for_each_maps_line, for_each_present_page, forget_engine_memory, forget_engine_threads_in_fork_child,
    is_engine_thread, live_engine_threads, lock_all_brought_nothing_in, maps_text, mlockall, munlockall,
    note_engine_memory, note_lock_on_fault, ram_bytes, read_small_file, spawn_engine_thread, AddressSpaceLimit,
    MAPS_LINE_BYTES,
};

/// Signal mode's SIGBUS handler, for a library that interposes the program's signal calls
/// (`uswap run`'s): see [`sigbus::replace_chained`].
pub mod sigbus {
    pub use crate::uffd::sigbus::{in_handler, note_system_calls_routed, replace_chained, StderrLine};
    pub use crate::uffd::signal_guard::note_signal_calls_interposed;
    pub use crate::uffd::AsyncSignalsBlocked;
}
pub use fault::handler_pool::describe_threads;
pub use fork::ForkHold;
pub use pager::{
    check_limit, check_tier_below, parse_tier_age, tier_age_from_secs, BackgroundReclaim, FaultMode, IdleAging,
    PageError, PageErrorKind, Pager, PagerBuilder, MAX_HANDLER_THREADS, MAX_IDLE_AGE_SECS, MAX_LIMIT_BYTES,
    MIN_LIMIT_BYTES, RECLAIM_BATCH_PAGES,
};
pub use pin::{note_fork, note_thread_start, release_pins_of_dead_threads, Pin, MAX_PIN_BYTES};
pub use readahead::Advice;
pub use region::{MAX_REGIONS, MAX_REGION_BYTES};
pub use region_handle::{PlainRegion, Region};
pub use shared_charge::SharedCharge;
pub use stats::{DeviceStats, Histogram, IdleStats, LatencySummary, PublishStats, Stats};
pub use swap::ReadaheadPolicy;
pub use sync::lock_waits;
pub use uffd::signal_guard::GUARD_PERIOD as SIGNAL_GUARD_PERIOD;

/// Who owns the memory of an address range of this process, for tools that account for it
/// (`uswap run`'s report of unmanaged memory).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MemoryOwner {
    /// Part of a managed region: paged under a pager's limit.
    Managed,
    /// The engine's own memory: swap-cache staging, RAM devices, page tables, queues.
    Engine,
    /// Neither: the program's memory that no pager manages.
    Other,
}

/// Who owns `[start, end)` (see [`MemoryOwner`]); a range that overlaps a managed region's
/// pages (not those it let go of: unmapped, or `Pager::unmanage`d) is `Managed`. Scans the
/// region registry and the engine's mappings: not for hot paths.
pub fn memory_owner(start: usize, end: usize) -> MemoryOwner {
    let mut managed = false;
    region::REGIONS.for_each_overlapping(start, end, |r| {
        managed = managed || r.owns_any_of(start, end);
    });
    owner_unless_managed(managed, start, end)
}

/// `Managed` if `managed`, else whether `[start, end)` is the engine's own memory.
fn owner_unless_managed(managed: bool, start: usize, end: usize) -> MemoryOwner {
    if managed {
        MemoryOwner::Managed
    } else if mapping::is_engine_memory(start, end) {
        MemoryOwner::Engine
    } else {
        MemoryOwner::Other
    }
}

/// The region registry's writers and the fork advice, held across a `fork` made while this
/// process has no pager that holds them itself ([`Pager::prepare_fork_to_rearm`]): `uswap
/// run`'s library before its pager has started, while another thread may be starting it
/// (adopting regions). A child that inherited a lock held would wait for it for good. Drop
/// it in the parent after the fork, and let go of it with
/// [`RegionsHeld::release_in_fork_child`] in the child.
pub struct RegionsHeld {
    // Dropped in this order: the advice, then the writers (taken the other way round).
    advice: fork_advice::Held,
    _writers: std::sync::MutexGuard<'static, ()>,
}

/// Takes [`RegionsHeld`] (waits for a region being registered or dropped meanwhile).
pub fn hold_regions_for_fork() -> RegionsHeld {
    let writers = region::REGIONS.lock_writers();
    RegionsHeld { advice: fork_advice::hold_for_fork(), _writers: writers }
}

impl RegionsHeld {
    /// In the fork child: the parent's don't-fork advice is not the child's memory's, and
    /// neither are the memory locks and the unmaps and event reads its other threads had
    /// under way (counts that would never come down: a signal-mode pager the child builds
    /// would wait on them at every fault), as in [`ForkHold::rearm_in_child`].
    pub fn release_in_fork_child(self) {
        let RegionsHeld { advice, _writers } = self;
        forget_parent_in_fork_child();
        crate::events::forget_in_fork_child();
        fork_advice::after_fork_in_child(advice);
    }
}

/// [`memory_owner`] for many ranges at one moment (a scan of `/proc/self/maps`): the
/// registry is read once, and each range is looked up in a sorted copy of it instead of
/// walking every region (Node.js with worker threads has some 10,000).
pub struct MemoryOwners {
    /// `(start, end, slot, generation)` of every region, by start.
    regions: Vec<(usize, usize, usize, u32)>,
    /// `max_end[i]`: the largest end among `regions[..=i]` (ranges may overlap).
    max_end: Vec<usize>,
}

/// The regions as they are now, for [`MemoryOwners::owner`].
pub fn memory_owners() -> MemoryOwners {
    let mut regions = Vec::new();
    region::REGIONS.for_each(|g| {
        // Read once: a region moved meanwhile (`mremap`) must not get a start and an end
        // from two places.
        let start = g.start();
        regions.push((start, start + g.nr_pages * PAGE_SIZE, g.index, g.gen))
    });
    regions.sort_unstable();
    let max_end = regions
        .iter()
        .scan(0, |max, r| {
            *max = r.1.max(*max);
            Some(*max)
        })
        .collect();
    MemoryOwners { regions, max_end }
}

impl MemoryOwners {
    /// As [`memory_owner`], for regions that were there when the copy was taken (and are
    /// still: a region gone since is not `Managed`).
    pub fn owner(&self, start: usize, end: usize) -> MemoryOwner {
        let managed = self.overlapping(start, end).any(|&(_, _, idx, gen)| {
            region::REGIONS.get(idx, gen, u32::MAX).is_some_and(|r| r.owns_any_of(start, end))
        });
        owner_unless_managed(managed, start, end)
    }

    /// Whether a region overlapping `[start, end)` is in one of `self` and `later` and not
    /// in the other: registered or dropped between the two copies. A scan of
    /// `/proc/self/maps` taken between them cannot tell whose such a range's pages were
    /// (a region dropped by `munmap` while the scan read its pages, or a new one at the
    /// same addresses, already written).
    pub fn changed_in(&self, later: &MemoryOwners, start: usize, end: usize) -> bool {
        self.overlapping(start, end).any(|r| later.regions.binary_search(r).is_err())
            || later.overlapping(start, end).any(|r| self.regions.binary_search(r).is_err())
    }

    /// The regions of the copy that overlap `[start, end)`.
    fn overlapping(&self, start: usize, end: usize) -> impl Iterator<Item = &(usize, usize, usize, u32)> {
        let below = self.regions.partition_point(|r| r.0 < end);
        (0..below)
            .rev()
            .take_while(move |&i| self.max_end[i] > start)
            .map(move |i| &self.regions[i])
            .filter(move |r| r.0 < end && start < r.1)
    }
}

/// Signal mode: makes `[addr, addr + len)` ready for a system call that reads it (`write`
/// false) or writes it, by bringing in the pages of signal-mode regions there. In signal mode
/// the kernel cannot wait for a page the way a faulting thread can, so a system call that
/// touches a page that is out fails with `EFAULT`; `uswap run`'s preload library calls this
/// before each such call. Returns `None` if none of the range is managed in signal mode,
/// else the number of pages it had to bring in: a call that fails with `EFAULT` after a
/// preparation that brought nothing in did not fail because of uswap. The range is pinned
/// in `pin` first (up to [`MAX_PIN_BYTES`] per pin): reclaim leaves its pages in until the
/// caller releases the pin ([`Pin::release`]) once the call returned. Safe to call from a signal
/// handler; allocates nothing. The thread's asynchronous signals are blocked meanwhile: its
/// own system calls are the engine's until it returns (see `user_access::in_preparation`),
/// and a handler of the program's that ran in between would have its calls unprepared.
pub fn prepare_user_access(pin: &mut Pin, addr: usize, len: usize, write: bool) -> Option<usize> {
    let _signals = uffd::AsyncSignalsBlocked::new();
    user_access::prepare_user_access(pin, addr, len, write)
}

pub use user_access::populate_in_windows;

/// Ends the locks of `kind` on `[start, end)` (`munlock`, an alternate stack replaced) and
/// lets reclaim take their pages again, unless another lock covers them (see [`mlock`]).
/// Allocation-free.
pub fn unlock_memory(kind: mlock::LockKind, start: usize, end: usize) {
    user_access::unlock_memory(kind, start, end)
}

/// Whether this process may open the userfaultfd thread mode needs (one that the kernel's
/// own faults reach: root, `CAP_SYS_PTRACE`, `vm.unprivileged_userfaultfd`, or access to
/// `/dev/userfaultfd`); signal mode needs none of these. Opens and closes one descriptor.
pub fn thread_mode_permitted() -> bool {
    uffd::Uffd::probe_features(false).is_ok()
}

/// Whether a pager could open its userfaultfd in this process, found out before anything
/// is started: `Ok`, or the error every pager would fail with (access refused, no
/// userfaultfd in this kernel, no `UFFDIO_MOVE`). `thread_mode`: one that the kernel's own
/// faults reach (see [`thread_mode_permitted`]); signal mode's is allowed to every user on
/// Linux >= 5.11. Opens and closes one descriptor.
pub fn check_userfaultfd(thread_mode: bool) -> Result<()> {
    let available = uffd::Uffd::probe_features(!thread_mode).map_err(|e| match e {
        // Refused though user-mode faults were asked for, which the kernel grants everyone.
        uffd::OpenError::Denied { syscall, dev } if !thread_mode => Error::UserfaultfdFiltered { syscall, dev },
        e => pager::open_error(e),
    })?;
    let wanted = uffd::FEATURE_MOVE;
    if available & wanted != wanted {
        return Err(pager::open_error(uffd::OpenError::MissingFeatures { wanted, available }));
    }
    Ok(())
}

/// Before this process dies with a core dump (in its fatal signal's handler): brings what
/// it has out of RAM back in, as far as the machine has memory for it, and leaves uswap's
/// own memory out of the dump (see `core_dump`). Paging stops for good. Allocation-free;
/// async-signal-safe as the fault path is.
pub fn prepare_core_dump() -> CoreDumpPrepared {
    // The engine's system calls on this thread (a program's, in signal mode with its C
    // library rewritten) go straight to the kernel: taken for the program's, an ioctl's
    // register naming the page being brought in had that very page prepared, and waited
    // 10 s for its own busy bit.
    let _engine_calls = syscall_guard::EngineCalls::enter();
    core_dump::prepare()
}

/// Whether this thread is inside uswap's engine now: holding one of its locks, or (unless
/// `locks_only`) bringing pages in for a system call or making the engine's system calls. A
/// fault there is uswap's own, whose core dump is best left as the kernel writes it; a
/// thread holding an engine lock must not serve pages. Async-signal-safe.
pub fn this_thread_is_in_the_engine(locks_only: bool) -> bool {
    let locks = sync::locks_held_by_this_thread() > 0;
    locks || (!locks_only && (user_access::in_preparation() || syscall_guard::in_engine_calls()))
}

/// `mlockall`: no managed page of the process is a reclaim victim until
/// [`unlock_all_memory`].
pub fn lock_all_memory() {
    mlock::lock_all(true)
}

/// In a fork child (its one thread, before it runs), with or without a pager: no memory lock
/// of the parent's holds (mlock(2): a child inherits none, nor its `MCL_FUTURE`), and the
/// parent's own mappings the child did not get (`MADV_DONTFORK`) are no longer the engine's.
pub fn forget_parent_in_fork_child() {
    mlock::forget_in_fork_child();
    mapping::forget_in_fork_child();
}

/// `munlockall`: every lock of the program's ends (see [`mlock`]); its pages are reclaim's
/// again.
pub fn unlock_all_memory() {
    user_access::unlock_all_memory()
}

/// Records an `madvise(start, len, advice)` the kernel accepted on the program's memory, for
/// the advice uswap must honour itself: `MADV_DONTFORK`, `MADV_WIPEONFORK` and their
/// undoing, which a re-armed fork child applies to the pages it would otherwise read from its
/// parent's devices. Other advice, and advice on memory no region manages, is ignored
/// (the kernel applies it there itself, and no event would say when such memory goes).
pub fn note_madvise(start: usize, len: usize, advice: i32) {
    if advice != libc::MADV_DONTFORK && advice != libc::MADV_WIPEONFORK {
        // Undoing needs no regions; other advice (a heap's purges) is not recorded at all.
        return fork_advice::note_madvise(start, len, advice, &[]);
    }
    let end = start.saturating_add(len);
    let mut managed = Vec::new();
    // A signal handler that left by `longjmp` while a region was held would hold it for good.
    let _signals = crate::uffd::AsyncSignalsBlocked::new();
    region::REGIONS.for_each_overlapping(start, end, |r| {
        let (rs, re) = (r.start(), r.start() + r.nr_pages * PAGE_SIZE);
        if rs < end && start < re {
            managed.push((rs.max(start), re.min(end)));
        }
    });
    fork_advice::note_madvise(start, len, advice, &managed)
}

/// The fork advice recorded on `[start, end)` (see [`note_madvise`]), clipped to it, as
/// `(start, end, MADV_DONTFORK | MADV_WIPEONFORK)`: what a move of the range (`uswap run`'s
/// `mremap`) carries to its new place, as the kernel's move keeps the mapping's flags.
pub fn fork_advice_in(start: usize, end: usize) -> Vec<(usize, usize, i32)> {
    use fork_advice::ForkAdvice::{DontFork, WipeOnFork};
    let mut out = Vec::new();
    for (kind, advice) in [(DontFork, libc::MADV_DONTFORK), (WipeOnFork, libc::MADV_WIPEONFORK)] {
        out.extend(fork_advice::ranges_in(kind, start, end).into_iter().map(|(s, e)| (s, e, advice)));
    }
    out
}

/// The page size uswap works in.
pub const PAGE_SIZE: usize = uffd::PAGE_SIZE;

/// Compile-time proof that the handles can cross threads.
const _: () = {
    const fn assert_send_sync<T: Send + Sync>() {}
    assert_send_sync::<Pager>();
    assert_send_sync::<Region>();
};
