//! The process this library set itself up in: the one that loaded it, or a fork child
//! (which `fork`'s child handler notes). A `vfork` child runs no fork handler and shares its
//! parent's memory, its code and this library's statics included, so what it must not do
//! as its own (start a pager, charge or give back a slot) is told apart here. A leaf: the
//! modules that ask it are below `fork`, which notes it.
//!
//! Locking: none; one atomic.

use std::sync::atomic::{AtomicU32, Ordering};

static OWN_PID: AtomicU32 = AtomicU32::new(0);

/// Notes the calling process as the library's own: where the library starts, and in a fork
/// child.
pub fn note() {
    OWN_PID.store(std::process::id(), Ordering::Relaxed);
}

/// Whether the calling process is the one this library set itself up in, not a `vfork`
/// child of it (which must start no pager: a rewrite of the C library's code, its tables,
/// would be its parent's). A child made by a raw fork (`syscall(SYS_fork)`, a `clone`
/// without `CLONE_VM`) has its fork handler's work done by `crate::raw_fork`, which notes
/// it; one made by the raw instruction, outside the C library, is not told apart.
pub fn is_own_process() -> bool {
    OWN_PID.load(Ordering::Relaxed) == std::process::id()
}
