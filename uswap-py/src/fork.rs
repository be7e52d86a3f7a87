//! `fork()` of a Python process with a pager (`os.fork`, `multiprocessing`'s `fork` start
//! method, a C extension's `fork`): the child reads every byte of the pager's regions and goes
//! on paging them under a pager of its own.
//!
//! The engine's threads and userfaultfd stay in the parent, so a child would find the pages
//! that were out missing. One pager of the process (the first made while no other such pager
//! lives) is built with `regions_survive_fork`, and `pthread_atfork` handlers, which run for
//! every `fork()` whoever calls it, do what the engine asks of such a fork
//! (`Pager::prepare_fork_to_rearm`, then `ForkHold::rearm_in_child`): the child gets a pager
//! built from the same arguments, with the parent's limit at the fork as a limit of its own
//! (with `auto`, the same ceiling), which takes over every region at the same address. Pages
//! resident at the fork stay shared copy-on-write with the parent (charged to it) until the
//! child writes them; pages out at the fork are read on first touch from the child's copy of
//! the parent's device. So `uswap.Region` objects, memoryviews and numpy arrays in managed
//! memory work in the child as in the parent, and what the child writes is its own. If the
//! child cannot build its pager (no userfaultfd left, a file device's disk full), it says so
//! on stderr and keeps every byte as ordinary memory, paged by nobody; the pager's methods
//! then raise in it. A pager on a named swap file or a block device, which the parent's
//! device holds exclusively, is never the inherited one.
//!
//! The engine re-arms one pager per fork, so the regions of any other pager that lives at the
//! same time are not inherited at all (`MADV_DONTFORK`), and in the child its methods raise
//! (`PagerCell::check_owner`); docs/api.md says so. With no pager to re-arm, the prepare
//! handler holds the engine's region registry and fork advice across the fork instead.
//! `vfork` and `posix_spawn` (`subprocess`) copy nothing and run no handlers.
//!
//! Locking: the prepare handler takes `pager_cell`'s lock for writing first (no thread is
//! mapping, unmapping or inside a table), then holds the engine's fork hold; the parent and
//! child handlers, which run on the same thread, let go in the other order. [`REARMED`] is
//! taken only under that lock.

use std::cell::RefCell;
use std::sync::{Arc, Mutex, PoisonError, RwLockWriteGuard, Weak};

use crate::pager_cell::{maps_read, maps_write, PagerCell, Rearm};

/// The pager whose regions fork children inherit, while it lives.
static REARMED: Mutex<Option<Weak<PagerCell>>> = Mutex::new(None);

/// What the prepare handler holds across the fork.
struct Held {
    maps: RwLockWriteGuard<'static, ()>,
    engine: EngineHold,
}

/// The engine's part: the re-armed pager's hold, with its limit at the fork; or, with no such
/// pager, the engine's region registry and fork advice, which another pager's event thread may
/// be changing (a child that inherited them held would wait for them for good).
enum EngineHold {
    Rearm { cell: Arc<PagerCell>, hold: uswap::ForkHold, limit_bytes: u64 },
    Registry(uswap::RegionsHeld),
}

thread_local! {
    /// The prepare, parent and child handlers of one fork run on the forking thread.
    static HELD: RefCell<Option<Held>> = const { RefCell::new(None) };
}

/// Builds a pager: the one whose regions fork children inherit if no such pager lives and a
/// child can open devices like its own (`rearmable`: no named swap file or block device), else
/// one whose regions they do not. Called with the GIL released.
pub fn build(builder: uswap::PagerBuilder, auto: bool, rearmable: bool) -> uswap::Result<Arc<PagerCell>> {
    // A fork waits for the build, so that it finds the pager claimed and built together.
    let _maps = maps_read();
    let mut rearmed = REARMED.lock().unwrap_or_else(PoisonError::into_inner);
    if !rearmable || rearmed.as_ref().is_some_and(|w| w.strong_count() > 0) {
        let pager = builder.regions_survive_fork(false).build()?;
        return Ok(PagerCell::new(pager, None));
    }
    let builder = builder.regions_survive_fork(true);
    let cell = PagerCell::new(builder.clone().build()?, Some(Rearm { builder, auto }));
    *rearmed = Some(Arc::downgrade(&cell));
    Ok(cell)
}

/// Whether `cell` is the pager whose regions fork children inherit.
pub fn is_rearmed(cell: &Arc<PagerCell>) -> bool {
    // First: it takes the lock for reading itself.
    if cell.check_owner().is_err() {
        return false;
    }
    let _maps = maps_read();
    let rearmed = REARMED.lock().unwrap_or_else(PoisonError::into_inner);
    rearmed.as_ref().is_some_and(|w| std::ptr::eq(w.as_ptr(), Arc::as_ptr(cell)))
}

extern "C" fn prepare() {
    let maps = maps_write();
    let cell = REARMED.lock().unwrap_or_else(PoisonError::into_inner).as_ref().and_then(Weak::upgrade);
    let engine = match cell {
        Some(cell) => {
            let pager = cell.pager_under_maps_write();
            let limit_bytes = pager.resident_limit();
            EngineHold::Rearm { hold: pager.prepare_fork_to_rearm(), cell, limit_bytes }
        }
        None => EngineHold::Registry(uswap::hold_regions_for_fork()),
    };
    HELD.with(|h| *h.borrow_mut() = Some(Held { maps, engine }));
}

extern "C" fn parent() {
    let Some(Held { maps, engine }) = HELD.with(|h| h.borrow_mut().take()) else { return };
    // The hold first: dropping it reclaims back down to the limit.
    let cell = match engine {
        EngineHold::Rearm { cell, hold, .. } => {
            drop(hold);
            Some(cell)
        }
        EngineHold::Registry(held) => {
            drop(held);
            None
        }
    };
    drop(maps);
    // Last: if it was the last reference, its drop takes the lock for reading.
    drop(cell);
}

extern "C" fn child() {
    let Some(Held { maps, engine }) = HELD.with(|h| h.borrow_mut().take()) else { return };
    uswap::forget_engine_threads_in_fork_child();
    // The thread-local holds the parent's thread's id.
    uswap::note_thread_start();
    let cell = match engine {
        EngineHold::Rearm { cell, hold, limit_bytes } => {
            rearm_child(&cell, hold, limit_bytes);
            Some(cell)
        }
        EngineHold::Registry(held) => {
            held.release_in_fork_child();
            None
        }
    };
    drop(maps);
    drop(cell);
}

/// Builds the child's pager, with the parent's limit at the fork, and gives it the regions
/// (see the module doc).
fn rearm_child(cell: &PagerCell, hold: uswap::ForkHold, limit_bytes: u64) {
    let Some(Rearm { builder, auto }) = cell.rearm().cloned() else {
        // Not reached: only a cell with a builder is claimed.
        std::mem::forget(hold);
        return;
    };
    // With `auto` the builder's limit is the ceiling the law moves under.
    let builder = if auto { builder } else { builder.resident_limit(limit_bytes) };
    match hold.rearm_in_child(builder) {
        Ok((pager, regions)) => cell.adopt_in_fork_child(pager, regions),
        Err(e) => {
            // Its regions are ordinary memory now, every byte in place (but for a failure
            // part-way through adopting them, out of region slots or registrations, whose
            // adopted regions the engine leaves to a pager of its own): a fork of this child
            // copies them as they are.
            *REARMED.lock().unwrap_or_else(PoisonError::into_inner) = None;
            let msg = format!(
                "uswap: fork child {}: could not build its own pager, so its managed memory is ordinary memory \
                 here (every byte kept, nothing paged; the pager's methods raise): {e}\n",
                std::process::id()
            );
            // SAFETY: writes a buffer we own to stderr.
            unsafe { libc::write(2, msg.as_ptr().cast(), msg.len()) };
        }
    }
}

/// Registers the handlers (once, at the module's import).
pub fn start() -> Result<(), String> {
    // SAFETY: registers three handlers with no captured state; they run around fork() on the
    // forking thread.
    let r = unsafe { libc::pthread_atfork(Some(prepare), Some(parent), Some(child)) };
    if r != 0 {
        return Err(format!("pthread_atfork failed: {}", std::io::Error::from_raw_os_error(r)));
    }
    Ok(())
}
