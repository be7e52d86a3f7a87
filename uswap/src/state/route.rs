//! How a fault reached the engine ([`Route`]: a handler thread, the faulting thread's own
//! SIGBUS handler, or that handler on the lock-free route), and how many pages its service
//! mapped at once (the window, which thread mode's help rule reads): the words fault
//! delivery (`crate::fault`) hands fault service (`crate::fault_service`) and reads back.
//! Why a service failed is [`super::fault_error`]'s.
//!
//! Locking: none; the window is a thread-local `Cell`.

use std::cell::Cell;

thread_local! {
    /// The most pages one fault's service mapped since the handler last reset it (a
    /// readahead or fault-around window), for `crate::fault::handler_pool`'s help rule. Const-initialised,
    /// no destructor: writing it from the SIGBUS handler is safe too.
    static WINDOW_PAGES: Cell<usize> = const { Cell::new(0) };
}

/// Records that a fault's service maps `nr_pages` at once.
pub(crate) fn note_window(nr_pages: usize) {
    WINDOW_PAGES.with(|w| w.set(w.get().max(nr_pages)));
}

/// The most pages a fault's service mapped at once since [`reset_window`].
pub(crate) fn window_pages() -> usize {
    WINDOW_PAGES.with(Cell::get)
}

/// Starts counting the window of the next fault served on this thread.
pub(crate) fn reset_window() {
    WINDOW_PAGES.with(|w| w.set(0));
}

/// How the fault reached us; decides waking and which locks may be taken.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Route {
    /// A handler thread: the faulting thread sleeps in the kernel and must be woken.
    Thread,
    /// The faulting thread's own SIGBUS handler.
    Signal,
    /// Signal mode, and the thread holds an engine lock: take none.
    SignalLockFree,
}

impl Route {
    pub(crate) fn wake(self) -> bool {
        self == Route::Thread
    }
    pub(crate) fn lock_free(self) -> bool {
        self == Route::SignalLockFree
    }
}
