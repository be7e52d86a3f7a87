//! Signal mode: an alternate signal stack on every thread of the program, so that the
//! kernel writes uswap's SIGBUS frames (`SA_ONSTACK`) onto memory no pager manages.
//!
//! Why: the kernel writes a signal's frame below the interrupted stack pointer, and a stack
//! the program made itself in managed memory (a coroutine's, a green thread's: QEMU's) may
//! have no page there, or a write-protected zero page: the frame cannot be written and the
//! thread dies of SIGSEGV. With a stack of its own for the signal, a fault on such a stack
//! is served like any other. The handler's work runs on the engine's own pool of stacks
//! (`uswap::mapping::handler_stack`), so this one only holds the kernel's frame and the
//! handler's entry: [`ALT_STACK_BYTES`].
//!
//! The main thread gets one at start-up, every thread `pthread_create` makes gets one before
//! its start routine runs, and each is unmapped when its thread ends (a thread-local's
//! destructor). A thread that already has an alternate stack (the program set one) keeps it.
//! Threads made without our `pthread_create` (a raw `clone`, or the C library's function
//! found with `dlsym`, as jemalloc's background threads are) get none: their SIGBUS frames
//! land on their own stack, which the C library mapped and no pager manages.
//!
//! **The program's own alternate stacks.** A program may set one in memory uswap manages
//! (a buffer from `malloc`, as many C programs and language runtimes do). The kernel writes
//! every frame of a signal taken with `SA_ONSTACK` there, uswap's SIGBUS frames included,
//! and in signal mode it cannot wait for a page that is out: the thread would die of the
//! signal it was about to handle. So when a thread sets such a stack (its `sigaltstack`
//! goes through the rewritten system calls), the stack's pages are brought in, writable, and
//! pinned (`uswap::Pin`) for as long as it is the thread's stack: until the thread sets
//! another, disables it, or ends. A pin covers at most `uswap::MAX_PIN_BYTES`, the top of a
//! larger stack (where frames go). A fork child's thread pins the stack it inherited again
//! (see [`after_fork_in_child`]).

use std::cell::Cell;

use crate::real::{sys_mmap, sys_mprotect, sys_munmap};

/// One alternate stack: the kernel's frame (1.8 KiB here, `AT_MINSIGSTKSZ`, more with
/// AVX-512 state) and the handler's entry, with room to spare.
pub const ALT_STACK_BYTES: usize = 64 << 10;
const GUARD_BYTES: usize = 4096;

/// This thread's alternate stack, if uswap made it; unmapped when the thread ends. Or the
/// pin of the program's own, if that lies in managed memory; released when the thread ends.
struct AltStack {
    base: Cell<usize>,
    program_pin: Cell<Option<uswap::Pin>>,
}

impl Drop for AltStack {
    fn drop(&mut self) {
        if let Some(pin) = self.program_pin.take() {
            pin.release();
        }
        let base = self.base.get();
        if base == 0 {
            return;
        }
        let mut cur: libc::stack_t = libc::stack_t { ss_sp: std::ptr::null_mut(), ss_flags: 0, ss_size: 0 };
        // SAFETY: sigaltstack with a null new stack only reads the current one into `cur`.
        unsafe { libc::sigaltstack(std::ptr::null(), &mut cur) };
        if cur.ss_sp as usize == base + GUARD_BYTES && cur.ss_flags & libc::SS_ONSTACK == 0 {
            let off = libc::stack_t { ss_sp: std::ptr::null_mut(), ss_flags: libc::SS_DISABLE, ss_size: 0 };
            // SAFETY: disables this thread's alternate stack, ours, which it is not running on.
            unsafe { libc::sigaltstack(&off, std::ptr::null_mut()) };
            sys_munmap(base as *mut libc::c_void, GUARD_BYTES + ALT_STACK_BYTES);
        }
    }
}

thread_local! {
    static ALT: AltStack = const { AltStack { base: Cell::new(0), program_pin: Cell::new(None) } };
}

/// After the calling thread's `sigaltstack` set `ss` (see the module's comment): pins the
/// stack's pages if it lies in managed memory, and lets go of the previous one's.
pub fn note_program_stack(ss: &libc::stack_t) {
    let _ = ALT.try_with(|a| {
        if let Some(old) = a.program_pin.take() {
            old.release();
        }
        if ss.ss_flags & libc::SS_DISABLE != 0 || ss.ss_size == 0 {
            return;
        }
        let end = (ss.ss_sp as usize).saturating_add(ss.ss_size);
        let start = (ss.ss_sp as usize).max(end.saturating_sub(uswap::MAX_PIN_BYTES));
        if uswap::memory_owner(start, end) != uswap::MemoryOwner::Managed {
            return;
        }
        let mut pin = uswap::Pin::new();
        // Written by the kernel: brought in writable. `None`: no signal-mode region there.
        if uswap::prepare_user_access(&mut pin, start, end - start, true).is_none() {
            pin.release();
            return;
        }
        a.program_pin.set(Some(pin));
    });
}

/// In a fork child (one thread, the one that forked), once its pager took the regions over:
/// its alternate stack is the forking thread's, pinned under that thread's id, and its pages
/// are shared with the parent, write-protected until the child writes them (the kernel's
/// frame could not be written). So it is pinned again, for this thread, and made writable.
pub fn after_fork_in_child() {
    let Ok(true) = ALT.try_with(|a| a.program_pin.take().map(uswap::Pin::release).is_some()) else { return };
    let mut cur = libc::stack_t { ss_sp: std::ptr::null_mut(), ss_flags: 0, ss_size: 0 };
    // SAFETY: sigaltstack with a null new stack only reads the current one into `cur`.
    if unsafe { libc::sigaltstack(std::ptr::null(), &mut cur) } == 0 {
        note_program_stack(&cur);
    }
}

/// Gives the calling thread an alternate signal stack, unless it has one.
pub fn install_on_this_thread() {
    let mut cur: libc::stack_t = libc::stack_t { ss_sp: std::ptr::null_mut(), ss_flags: 0, ss_size: 0 };
    // SAFETY: sigaltstack with a null new stack only reads the current one into `cur`.
    if unsafe { libc::sigaltstack(std::ptr::null(), &mut cur) } != 0 || cur.ss_flags & libc::SS_DISABLE == 0 {
        return;
    }
    let len = GUARD_BYTES + ALT_STACK_BYTES;
    let flags = libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE;
    let p = sys_mmap(std::ptr::null_mut(), len, libc::PROT_READ | libc::PROT_WRITE, flags, -1, 0);
    if p == libc::MAP_FAILED || (p as isize) < 0 {
        return;
    }
    // The guard page below: an overflow is a SIGSEGV, not a write into whatever lies there.
    sys_mprotect(p, GUARD_BYTES, libc::PROT_NONE);
    uswap::note_engine_memory(p as usize, len);
    let ss =
        libc::stack_t { ss_sp: (p as usize + GUARD_BYTES) as *mut libc::c_void, ss_flags: 0, ss_size: ALT_STACK_BYTES };
    // SAFETY: the stack just mapped, ours, for as long as this thread lives (unmapped by the
    // thread-local's destructor at its end).
    if unsafe { libc::sigaltstack(&ss, std::ptr::null_mut()) } != 0 {
        sys_munmap(p, len);
        return;
    }
    ALT.with(|a| a.base.set(p as usize));
}
