//! The system-call guard of signal mode: a call that reads or writes a managed page that is
//! out must behave as it does without uswap, not fail with `EFAULT`.
//!
//! In signal mode a fault the program's code takes is a SIGBUS its own thread serves. A
//! fault the kernel takes inside a system call (`read` into a buffer that is out, `write`
//! from one, `futex` on a word in one) cannot be served that way: the kernel fails the call
//! with `EFAULT`, and what it had done by then (a datagram received, bytes consumed) may be
//! lost. So at start-up every `syscall` instruction of the C library is rewritten ([`patch`])
//! to go through a dispatch that brings the call's memory in first ([`entry`], by the rules
//! of [`table`]). Calls that take no pointer cost three more instructions; the others one
//! function call and a look-up of their buffers in the region registry. The masks calls set
//! (`sigprocmask`, `sigsuspend`, ...) are made without SIGBUS ([`masks`]). Discards
//! (`madvise(MADV_DONTNEED)`, `process_madvise`, ...) are applied to the engine's page
//! tables before they return (`crate::events::ProgramDiscard`), in place of the `REMOVE`
//! events a signal-mode pager under the guard does not ask for.
//!
//! Not covered: `syscall` instructions outside the C library (a program or library that
//! makes its own, statically linked code), and memory the kernel touches outside any call
//! (io_uring, AIO, a KVM guest's RAM): those stay in thread mode. Signal frames are written
//! by the kernel too: uswap's SIGBUS frames go to an alternate stack of its own on every
//! thread, and a program's own alternate stack in managed memory is pinned while it is set
//! (`uswap run`'s library does it, through [`SyscallHooks`]); a frame of the program's own
//! handler without `SA_ONSTACK`, on a stack it made in managed memory (a coroutine's), is
//! not covered.
//!
//! Two ways in: `uswap run`'s library calls [`start`] when a process's first signal-mode
//! pager starts, with hooks of its own (the memory locks it records, the alternate stacks
//! it pins); a program that uses the library asks for it with `PagerBuilder::syscall_guard`,
//! and the first signal-mode pager it builds calls [`install`]. Both need a process with
//! one thread: the rewrite replaces instructions another thread could be executing, or be
//! stopped in (a call blocked in the kernel returns into the middle of the new jump). On
//! the calling thread itself, the stack is read first: a signal handler running now that
//! interrupted the C library would return into a window, and the rewrite refuses
//! ([`PatchError::Interrupted`]).
//!
//! While uswap's SIGBUS handler is installed, the masks the program sets through the C
//! library (`sigprocmask`, `pthread_sigmask`, a handler's `sa_mask`) are set without SIGBUS
//! (`entry::keep_sigbus_deliverable`): a thread that blocked it would be killed by its
//! first fault on memory that is out.
//!
//! `pthread_cancel` of a thread inside a rewritten call: glibc makes cancellation
//! asynchronous around its cancellation points, so the slow path puts it off while it
//! brings memory in (`entry::CancelPutOff`), and a cancellation acts between the
//! preparation and the call, or during the call, never inside the engine (but for a thread
//! already preparing when the first `pthread_cancel` of the process installs glibc's
//! handler: see `entry::CANCELLATION_IN_USE`).
//!
//! Invariants: the rewrite happens at most once per process; the hooks are set before it
//! and never change after it (the slow path reads them with no lock, in signal handlers);
//! whether the process can cancel threads (`entry::CANCELLATION_IN_USE`) only goes from
//! false to true; the place reserved for the trampolines (`image`) is set once, at load, and
//! taken once, by the rewrite.

mod code;
mod complete;
mod discards;
mod entry;
mod image;
mod masks;
mod own_memory;
mod patch;
mod prepare;
mod raw;
mod sys;
mod table;

use std::sync::atomic::{AtomicBool, AtomicPtr, Ordering};

use libc::c_long;

pub use entry::{in_engine_calls, note_async_kernel_access_found, EngineCalls};
pub use patch::PatchReport;
pub use prepare::is_this_process;

/// A range of memory recorded as locked, `[start, end)`.
pub type LockedRange = Option<(usize, usize)>;

/// What the slow path calls around a system call besides making its memory ready: `uswap
/// run`'s library records the program's memory locks for reclaim (`crate::mlock`) and pins
/// its alternate signal stacks. The defaults do nothing.
#[derive(Clone, Copy)]
pub struct SyscallHooks {
    /// Before an `mlock` or `mlock2`: the range recorded as locked, if any.
    pub mlock_before: fn(c_long, &[u64; 6]) -> LockedRange,
    /// Whether the call's memory is made ready (not for a lock on fault).
    pub mlock_populates: fn(c_long, &[u64; 6]) -> bool,
    /// After the call returned: the lock taken back if it failed, the others recorded.
    pub mlock_after: fn(c_long, &[u64; 6], c_long, LockedRange),
    /// After a `sigaltstack` that set a stack.
    pub note_altstack: fn(&libc::stack_t),
}

static NO_HOOKS: SyscallHooks = SyscallHooks {
    mlock_before: |_, _| None,
    mlock_populates: |_, _| true,
    mlock_after: |_, _, _, _| {},
    note_altstack: |_| {},
};

static HOOKS: AtomicPtr<SyscallHooks> = AtomicPtr::new(std::ptr::null_mut());

/// The hooks in force: lock-free, allocation-free (the slow path runs in signal handlers).
fn hooks() -> &'static SyscallHooks {
    let p = HOOKS.load(Ordering::Acquire);
    if p.is_null() {
        &NO_HOOKS
    } else {
        // SAFETY: only `start` stores, and only a `&'static SyscallHooks`.
        unsafe { &*p }
    }
}

/// Set once the C library's calls are rewritten.
static STARTED: AtomicBool = AtomicBool::new(false);

/// Whether this process's C library calls go through the guard.
pub fn started() -> bool {
    STARTED.load(Ordering::Acquire)
}

/// Why the C library's calls were not rewritten.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PatchError {
    /// This thread may resume at `at`, inside code the rewrite replaces: a call of the C
    /// library that a signal interrupted, whose handler runs now (`code::resume_points`).
    /// Nothing was changed; the rewrite can be tried again once the handler returned.
    Interrupted { at: usize },
    /// What this thread would resume cannot be told: its stack pointer `sp` lies in no
    /// readable run of memory, or in one too large to read (a coroutine's stack inside a
    /// heap). Nothing was changed.
    StackUnknown { sp: usize },
    /// The rewrite cannot be done: a static program, no room for trampolines, code that
    /// cannot be made writable.
    Failed(String),
}

impl std::fmt::Display for PatchError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            PatchError::Interrupted { at } => write!(
                f,
                "this thread interrupted the C library's code at {at:#x}, which the rewrite replaces \
                 (a signal handler that runs now?); try again outside the handler"
            ),
            PatchError::StackUnknown { sp } => write!(
                f,
                "cannot tell what this thread will resume: its stack pointer {sp:#x} lies in no stack uswap can read \
                 (a coroutine's?)"
            ),
            PatchError::Failed(why) => f.write_str(why),
        }
    }
}

impl From<String> for PatchError {
    fn from(why: String) -> PatchError {
        PatchError::Failed(why)
    }
}

/// Rewrites the C library's system calls (see the module's comment), with `hooks` around
/// them; `cache_dir`, where the windows found are kept for the next process (`uswap run`'s
/// directory for the tree). Refused, with nothing changed, while this thread would resume
/// inside the code it replaces ([`PatchError::Interrupted`]), so that it can be called when
/// a pager starts and not only before `main`. `program_sp`, if known, is the program's stack
/// pointer at its call into the caller's library: the caller's own frames, below it, are not
/// read for interrupted contexts (see `code::resume_points`).
///
/// # Safety
/// Called while the process has one thread, not on an alternate signal stack, and not
/// again once it succeeded; `program_sp`'s frames below it are the caller's own.
pub unsafe fn start(
    cache_dir: Option<&std::path::Path>,
    hooks: &'static SyscallHooks,
    program_sp: Option<usize>,
) -> Result<PatchReport, PatchError> {
    assert!(!STARTED.load(Ordering::Acquire), "uswap invariant: the system-call guard starts once");
    HOOKS.store(hooks as *const SyscallHooks as *mut SyscallHooks, Ordering::Release);
    entry::note_cancellation();
    // SAFETY: the caller's contract; the table and the entry live as long as the process.
    let r = unsafe { patch::patch_c_library(table::CLASS.as_ptr() as u64, entry::slow_entry(), cache_dir, program_sp) };
    // The place reserved for the trampolines, if the rewrite did not map them there (with
    // one thread still: see `image::take_reservation`).
    image::release_reservation();
    if r.is_ok() {
        STARTED.store(true, Ordering::Release);
    }
    r
}

/// At a process's load, before the program maps its own files: reserves the place where
/// the trampolines a process of the tree kept in `cache_dir` lie, so that a pager that
/// starts later, in signal mode, finds it free (the image is then applied: about 3 ms less
/// and 170 fewer private pages than a rewrite of its own). Best effort: nothing happens
/// without an image or if the place is taken. Cost: a `stat`, an open, a read of 64 bytes
/// and a close, and a `mmap` of address space. [`start`] gives the place back if the
/// rewrite does not use it; a process that never rewrites (no pager, or one in thread mode)
/// keeps it, inaccessible address space beside the C library, for its life.
pub fn reserve_image_place(cache_dir: &std::path::Path) {
    patch::reserve_image_place(cache_dir);
}

/// Why [`install`] could not rewrite the C library's calls.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum InstallError {
    /// The process had this many threads (the rewrite needs one).
    Threads(usize),
    /// The rewrite itself failed or had to wait (see [`PatchError`]).
    Patch(PatchError),
}

/// The library's way in (`PagerBuilder::syscall_guard`): rewrites the C library's calls
/// once per process, with no hooks, if this process has one thread; Ok at once if the
/// guard already runs (a second pager, or `uswap run`'s library). Serialised by the caller.
pub fn install() -> Result<(), InstallError> {
    if started() {
        return Ok(());
    }
    let threads = thread_count();
    if threads != 1 {
        return Err(InstallError::Threads(threads));
    }
    // SAFETY: one thread (just checked; this thread is the only one that could start
    // another), not started (checked above); a handler on an alternate stack that builds a
    // pager is the program's contract (`PagerBuilder::syscall_guard`).
    unsafe { start(None, &NO_HOOKS, None) }.map(|_| ()).map_err(InstallError::Patch)
}

/// Serialises the tests that map trampolines: `map_near` picks a gap from a snapshot of the
/// address space, and the place reserved for them is the process's one (at start-up the
/// process has one thread, so these races are the tests' own).
#[cfg(test)]
fn serialised() -> std::sync::MutexGuard<'static, ()> {
    static ADDRESS_SPACE: std::sync::Mutex<()> = std::sync::Mutex::new(());
    ADDRESS_SPACE.lock().unwrap_or_else(|e| e.into_inner())
}

/// Threads of this process, by `/proc/self/task` (0 if it cannot be read: refused).
fn thread_count() -> usize {
    std::fs::read_dir("/proc/self/task").map(|d| d.count()).unwrap_or(0)
}
