//! `fork()` without exec: the child gets a copy of every byte, as ordinary memory.
//!
//! The pager lives in the parent: its handler threads, its devices (the compressed pool is
//! `MADV_DONTFORK`) and its userfaultfd do not cross a fork, and a registered range whose
//! pages are out would read as zeros in the child. So the prepare handler (`pthread_atfork`)
//! brings every page that is out back in and holds reclaim (`Pager::prepare_fork`); the
//! child inherits the regions fully populated and unregistered, and from then on runs
//! unmanaged: its heap stays in the same range (mimalloc's state is copied with it), new
//! mappings are ordinary, and its pages are counted by the kernel, not by uswap. The parent
//! drops the hold and reclaims back to its limit; the pages it shares copy-on-write with the
//! child are refused by `UFFDIO_MOVE` once (`move_refused`; the parent's faults charge over
//! the limit rather than wait for them), then made exclusive by the engine's background
//! reclaimer and moved out (`cow_broken`, see the engine's `reclaim::cow`). A child that
//! execs starts a pager of its own.
//!
//! Cost: the fork waits for every swapped-out page to come in (a scan of the page tables,
//! skipped when nothing is out), and the parent may exceed its limit for a few background
//! periods after it.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;

static HOLD: Mutex<Option<uswap::ForkHold>> = Mutex::new(None);
static FORKED_CHILD: AtomicBool = AtomicBool::new(false);

/// Whether this process is a fork child of a managed one (and so unmanaged itself).
pub fn is_forked_child() -> bool {
    FORKED_CHILD.load(Ordering::Relaxed)
}

extern "C" fn prepare() {
    if is_forked_child() {
        return;
    }
    let Some(pager) = crate::pager() else { return };
    let hold = pager.prepare_fork();
    *HOLD.lock().unwrap_or_else(|e| e.into_inner()) = Some(hold);
}

extern "C" fn parent() {
    let hold = HOLD.lock().unwrap_or_else(|e| e.into_inner()).take();
    drop(hold);
}

extern "C" fn child() {
    FORKED_CHILD.store(true, Ordering::Relaxed);
    // The hold belongs to the parent's pager, whose threads do not exist here: forget it
    // (dropping it would run reclaim on a pager that cannot serve faults).
    if let Some(hold) = HOLD.lock().unwrap_or_else(|e| e.into_inner()).take() {
        std::mem::forget(hold);
    }
}

pub fn start() -> Result<(), String> {
    // SAFETY: registers three handlers with no captured state; they run around fork() on
    // the forking thread.
    let r = unsafe { libc::pthread_atfork(Some(prepare), Some(parent), Some(child)) };
    if r != 0 {
        return Err(format!("pthread_atfork failed: {}", std::io::Error::from_raw_os_error(r)));
    }
    Ok(())
}
