//! `fork()` without exec: the child gets a copy of every byte and a pager of its own.
//!
//! The pager lives in the parent: its handler threads and its userfaultfd do not cross a
//! fork, and a registered range whose pages are out would read as zeros in a child that
//! nothing serves. So the prepare handler (`pthread_atfork`) holds reclaim and readies the
//! engine for a child that re-arms (`Pager::prepare_fork_to_rearm`): pages out on a memory
//! device stay out, and the child inherits the engine's memory to read them from; pages on
//! a swap file or a Redis device stay out, and the child reads them where they are; the
//! rest comes back in. The table of managed mappings is locked so that no thread is inside it at
//! the fork.
//!
//! The child handler, which runs while the child has one thread, re-arms it
//! (`ForkHold::rearm_in_child`): a pager of its own, built from the same configuration and
//! charged to the same shared budget (a slot of its own in the `uswap run` tree's charge),
//! takes over every region at the same address, the heap's included; the heap's mimalloc
//! state came with the copy. The pages the child inherited stay mapped, shared with the
//! parent and charged to it (as a memory cgroup charges a shared page once), until the child
//! writes one: that write charges it to the child, whose reclaim can then page it out. What
//! the child allocates or touches anew is paged as in any process. It leaves its own record
//! for `uswap run`. The pages that were out at the fork it reads on first touch from its
//! copy of the parent's device. If the re-arm fails (no userfaultfd left, say), the child
//! says so on stderr and runs unmanaged, every byte still there (those pages are written in
//! place from its copy of the device), and `uswap run` fails once the program ended (the
//! child leaves a refusal beside its records, `crate::note_refusal`).
//!
//! The parent drops the hold and reclaims back to its limit; the pages it shares
//! copy-on-write with the child are refused by `UFFDIO_MOVE` once (`move_refused`; its
//! faults charge over the limit rather than wait for them), then made exclusive by the
//! engine's background reclaimer and moved out (`cow_broken`, see the engine's
//! `reclaim::cow`). A child that execs starts a pager of its own.
//!
//! Cost: the fork scans the page tables of what was ever touched and waits for staged
//! pages to come in; the engine's memory is shared
//! copy-on-write with the child while it lives; the parent may exceed its limit by the
//! resident pages the child shares; the child pays for a pager's start (a few
//! milliseconds).

use std::cell::RefCell;

/// What the prepare handler holds across the fork; the parent and child handlers run on the
/// same thread, so a thread-local carries it (the hold is not `Send`).
struct Held {
    pager: uswap::ForkHold,
    table: crate::mmap::TableHold,
}

thread_local! {
    static HELD: RefCell<Option<Held>> = const { RefCell::new(None) };
    /// The deferred table of a process that waits (or waited) for its pager, held across the
    /// fork (`waiting_charge::hold_for_fork`), with what a start under way holds while no
    /// pager is there to hold it ([`StartHold`]).
    static DEFERRED: RefCell<Option<(crate::waiting_charge::DeferredHold, Option<StartHold>)>> =
        const { RefCell::new(None) };
    /// Whether this thread's prepare handler touched [`DEFERRED`]: a thread-local with a
    /// destructor registers it at its first touch, which allocates, and a fork child must
    /// not allocate before its heap is re-armed (it crashed in mimalloc). No destructor.
    static DEFERRED_TOUCHED: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// What a pager's start on another thread takes while it adopts the deferred mappings (the
/// table of managed mappings, the region registry's writers, the fork advice), held across a
/// fork made before the pager is published: a child that inherited one of them held would
/// wait for it for good at its own start. Taken in the start's order.
struct StartHold {
    table: crate::mmap::TableHold,
    regions: uswap::RegionsHeld,
}

impl StartHold {
    fn take() -> StartHold {
        let table = crate::mmap::hold_for_fork();
        StartHold { table, regions: uswap::hold_regions_for_fork() }
    }

    /// In the child: the mappings the parent's start adopted are not the child's (their
    /// regions are the parent's pager's: forgotten, never dropped), nor is its advice.
    /// Allocation-free.
    fn release_in_child(self) {
        self.table.rearm(&mut Vec::new());
        self.regions.release_in_fork_child();
    }
}

/// Lets go of the deferred table held across the fork, if the prepare handler held it.
fn release_deferred(in_child: bool) {
    if DEFERRED_TOUCHED.with(|t| t.get()) {
        let held = DEFERRED.with(|d| d.borrow_mut().take());
        if let Some((deferred, Some(start))) = held {
            if in_child {
                start.release_in_child();
            }
            drop(deferred);
        }
    }
}

pub(crate) extern "C" fn prepare() {
    // First, and in every process that has these handlers: a fork child, even one that
    // runs unmanaged, must not inherit the lock held. (Handlers of libraries set up before
    // this one run after it: one that holds a lock of its own while it calls `sbrk` on
    // another thread could wait here, as on any lock it shares with a forking thread.)
    crate::program_break::hold_for_fork();
    // Pages shared with the child may be refused by reclaim, here or once a pager starts.
    uswap::note_fork();
    if crate::is_unmanaged_fork_child() {
        return;
    }
    // Touched whatever it holds, here in the parent (see `DEFERRED_TOUCHED`).
    let deferred = crate::pager().is_none().then(crate::waiting_charge::hold_for_fork);
    // A start under way on another thread may be inside the registry (it adopts the
    // deferred mappings it took before this hold): a child that inherited its writers' lock
    // held would wait for it for good at its own start.
    let mut start = deferred.as_ref().map(|_| {
        let _g = crate::own_code::Guard::enter();
        StartHold::take()
    });
    let pager = crate::pager();
    if pager.is_some() {
        // The start ended meanwhile: the pager's own holds take these below.
        start = None;
    }
    DEFERRED.with(|d| *d.borrow_mut() = deferred.map(|hold| (hold, start)));
    DEFERRED_TOUCHED.with(|t| t.set(true));
    let Some(pager) = pager else { return };
    let _g = crate::own_code::Guard::enter();
    // The table first: a thread mapping a region holds it while the pager registers.
    let table = crate::mmap::hold_for_fork();
    let pager = pager.prepare_fork_to_rearm();
    HELD.with(|h| *h.borrow_mut() = Some(Held { pager, table }));
}

pub(crate) extern "C" fn parent() {
    crate::program_break::release_after_fork();
    release_deferred(false);
    let held = HELD.with(|h| h.borrow_mut().take());
    drop(held);
}

pub(crate) extern "C" fn child() {
    forget_the_parents_locks_in_child();
    release_deferred(true);
    forget_the_parents_work_in_child();
    let Some(held) = HELD.with(|h| h.borrow_mut().take()) else { return };
    let _g = crate::own_code::Guard::enter();
    // The new pager's set-up is the engine's, not the program's (a file device's rings).
    let _direct = uswap::syscall_guard::EngineCalls::enter();
    if let Err(e) = rearm(held) {
        crate::note_unmanaged_fork_child();
        let msg = format!("uswap: fork child {} runs unmanaged (every byte kept): {e}\n", std::process::id());
        crate::real::write_stderr(msg.as_bytes());
        crate::note_refusal(&msg);
    }
    crate::altstack::after_fork_in_child();
}

/// In a fork child (its one thread, before it runs): the locks of the parent's threads
/// are let go of, pager or not.
pub(crate) fn forget_the_parents_locks_in_child() {
    uswap::forget_engine_threads_in_fork_child();
    crate::report::forget_locks_in_fork_child();
    crate::forget_own_slot_lock_in_fork_child();
    crate::program_break::release_after_fork();
    crate::own_process::note();
}

/// In a fork child, after [`forget_the_parents_locks_in_child`]: what the parent's threads
/// had under way, and what is the parent process's, is forgotten.
pub(crate) fn forget_the_parents_work_in_child() {
    // A start under way on another thread of the parent is not the child's: it waits again.
    crate::forget_start_in_fork_child();
    // A waiting parent's slot is its own; the child joins with one of its own if it must.
    crate::waiting_charge::forget_in_fork_child();
    // The thread-local holds the parent's thread's id.
    uswap::note_thread_start();
    // A process of its own: its own word on the libraries it loads.
    crate::deep_bind::forget_in_fork_child();
    // Another thread's unmap under way is the parent's: it never ends here.
    crate::munmap::forget_unmaps_in_fork_child();
    // Pages still shared with the parent are the parent's to count.
    crate::unmanaged::note_fork_child();
    // No lock of the parent's holds here (mlockall(2)), pager or not.
    uswap::forget_parent_in_fork_child();
}

/// Gives the child a pager of its own and its regions (see the module doc).
fn rearm(held: Held) -> Result<(), String> {
    let Held { pager: hold, table } = held;
    let Some(cfg) = crate::config() else {
        std::mem::forget(hold);
        return Err("no configuration".into());
    };
    // The parent's mode, which may be thread mode where the configuration says signal
    // (a lazy start that found threads or asynchronous I/O, see the crate's doc).
    let mode = crate::pager().map_or(cfg.fault_mode, |p| p.fault_mode());
    let mut builder = cfg.builder().fault_mode(mode);
    if let Some(seg) = crate::segment() {
        builder = crate::join_tree(seg, builder);
    }
    let (pager, mut regions) = hold.rearm_in_child(builder).map_err(|e| e.to_string())?;
    // The heap's region: kept for the life of the process, as in the parent.
    if let Some(k) = regions.iter().position(|(start, _)| *start == crate::heap::arena_start()) {
        std::mem::forget(regions.swap_remove(k));
    }
    table.rearm(&mut regions);
    // Regions no table entry claimed (none expected): kept mapped, never unmapped.
    std::mem::forget(regions);
    crate::set_pager(pager);
    crate::report::start_in_fork_child();
    Ok(())
}

pub fn start() -> Result<(), String> {
    crate::own_process::note();
    // SAFETY: registers three handlers with no captured state; they run around fork() on
    // the forking thread.
    let r = unsafe { libc::pthread_atfork(Some(prepare), Some(parent), Some(child)) };
    if r != 0 {
        return Err(format!("pthread_atfork failed: {}", std::io::Error::from_raw_os_error(r)));
    }
    Ok(())
}
