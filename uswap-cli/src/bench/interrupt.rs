//! Ctrl-C and friends: SIGINT, SIGTERM and SIGHUP set one flag instead of killing the
//! process, so that a run with the kernel engines always reaches its cleanup (swapoff, zram
//! reset, swap file and cgroup removal). Workloads look at the flag between chunks of
//! accesses; the runner kills workload processes when it sees it.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};

static FLAG: OnceLock<Arc<AtomicBool>> = OnceLock::new();

fn shared() -> &'static Arc<AtomicBool> {
    FLAG.get_or_init(|| Arc::new(AtomicBool::new(false)))
}

/// Routes SIGINT, SIGTERM and SIGHUP to the flag. Idempotent.
pub fn install() -> std::io::Result<()> {
    static INSTALLED: OnceLock<()> = OnceLock::new();
    if INSTALLED.get().is_some() {
        return Ok(());
    }
    for sig in [signal_hook::consts::SIGINT, signal_hook::consts::SIGTERM, signal_hook::consts::SIGHUP] {
        signal_hook::flag::register(sig, Arc::clone(shared()))?;
    }
    let _ = INSTALLED.set(());
    Ok(())
}

/// The flag itself, for workloads.
pub fn flag() -> &'static AtomicBool {
    shared()
}

pub fn interrupted() -> bool {
    shared().load(Ordering::Relaxed)
}
