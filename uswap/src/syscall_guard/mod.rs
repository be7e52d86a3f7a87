//! Signal mode's system calls: a call that reads or writes a managed page that is out must
//! behave as it does without uswap, not fail with `EFAULT`.
//!
//! In signal mode a fault the program's code takes is a SIGBUS its own thread serves. A
//! fault the kernel takes inside a system call (`read` into a buffer that is out, `write`
//! from one, `futex` on a word in one) cannot be served that way: the kernel fails the call
//! with `EFAULT`, and what it had done by then (a datagram received, bytes consumed) may be
//! lost. So at start-up every `syscall` instruction of the C library is rewritten ([`patch`])
//! to go through a dispatch that brings the call's memory in first ([`entry`], by the rules
//! of [`table`]). Calls that take no pointer cost three more instructions; the others one
//! function call and a look-up of their buffers in the region registry.
//!
//! Not covered: `syscall` instructions outside the C library (a program or library that
//! makes its own, statically linked code), and memory the kernel touches outside any call
//! (io_uring, AIO, a KVM guest's RAM): those stay in thread mode. Signal frames are written
//! by the kernel too: uswap's SIGBUS frames go to an alternate stack of its own on every
//! thread, and a program's own alternate stack in managed memory is pinned while it is set
//! (see `crate::altstack`); a frame of the program's own handler without `SA_ONSTACK`, on a
//! stack it made in managed memory (a coroutine's), is not covered.

mod code;
mod complete;
mod entry;
mod image;
mod patch;
mod raw;
mod table;

pub use entry::EngineCalls;
pub use patch::PatchReport;

/// Rewrites the C library's system calls (see the module's comment); `cache_dir`, where the
/// windows found are kept for the next process (`uswap run`'s directory for the tree).
///
/// # Safety
/// Called once, while the process has one thread.
pub unsafe fn start(cache_dir: Option<&std::path::Path>) -> Result<PatchReport, String> {
    // SAFETY: the caller's contract; the table and the entry live as long as the library.
    unsafe { patch::patch_c_library(table::CLASS.as_ptr() as u64, entry::slow_entry(), cache_dir) }
}
