//! Which code runs on a thread: uswap's own (this library's, marked by a [`Guard`]) or the
//! program's. uswap's own allocations and mappings are ordinary memory, and the interposed
//! calls pass straight through for it. A leaf: the allocator routing (`heap`), the mapping
//! interposition (`mmap`) and the C library's functions (`real`) all ask it.

use std::cell::Cell;

thread_local! {
    /// Depth of this library's own code on this thread (no destructor, no allocation).
    static IN_USWAP: Cell<u32> = const { Cell::new(0) };
}

/// Marks the calling thread as running uswap's own code for its lifetime: its allocations
/// and mappings are ordinary memory, and the interposed calls pass straight through.
pub struct Guard(());

impl Guard {
    pub fn enter() -> Guard {
        IN_USWAP.with(|d| d.set(d.get() + 1));
        Guard(())
    }
}

impl Drop for Guard {
    fn drop(&mut self) {
        IN_USWAP.with(|d| d.set(d.get() - 1));
    }
}

/// The calling thread runs the program's code from now on, whatever marked it uswap's (a
/// thread of uswap's that calls `exit` for the program: `last_thread`). It holds no
/// [`Guard`] that is still to drop.
pub fn leave_for_good() {
    IN_USWAP.with(|d| d.set(0));
}

/// Whether this library's own code is running on the calling thread.
pub fn in_uswap() -> bool {
    IN_USWAP.with(|d| d.get() > 0)
}
