//! Stacks the program runs its own code on, made in memory uswap manages: a coroutine's
//! (`makecontext`: QEMU's coroutines, C programs' ucontext schedulers) and a thread's
//! (`pthread_attr_setstack`, given to `pthread_create`). In signal mode they are let go of.
//!
//! Why: the kernel writes a signal's frame below the interrupted stack pointer. uswap's own
//! SIGBUS frames go to an alternate stack (`altstack`), but a handler of the program's
//! installed without `SA_ONSTACK` (a timer's, `SIGINT`'s, `SIGCHLD`'s) has its frame
//! written onto whatever stack the thread is running on. Where that is managed memory and
//! the page below the stack pointer is out, or was never touched, signal mode cannot bring
//! it in for the kernel (its faults are served by the faulting thread, in a SIGBUS handler),
//! so the frame cannot be written and the thread dies of SIGSEGV: a program running 64
//! coroutines on stacks from `malloc`, with a timer signal, died at once. So in signal mode
//! such a stack is let go of when it is given (`Pager::unmanage`: its pages that are out
//! come back, and it becomes ordinary memory, as without uswap, where only what the code
//! touches takes memory), and the report of unmanaged memory names it. In thread mode the
//! kernel waits for such a page like any other: nothing is done.
//!
//! Letting go is for good: a stack from `malloc` that the program frees leaves ordinary
//! memory in its heap, which later blocks there take (counted as unmanaged memory, and
//! named as a stack's); a mapped stack that it unmaps goes with its mapping.
//!
//! A process still waiting for its pager (lazy start) starts it at its first `makecontext`
//! in signal mode: the stack may lie in its heap or in a mapping it deferred, which the
//! pager's start would take over. (`pthread_create` starts it anyway.)
//!
//! Not seen: stacks switched to by the program's own code (Boost.Context's, Ruby's fibers',
//! in assembly). A program that runs those in managed memory and takes signals on them with
//! handlers of its own needs `--fault-mode thread` (docs/cli.md, "Signals and system calls").

use std::ffi::c_void;
use std::sync::atomic::AtomicPtr;

use crate::let_go::LetGoRanges;
use crate::own_code::{in_uswap, Guard};

/// The stacks let go of, for the report of unmanaged memory (`crate::unmanaged`).
static LET_GO: LetGoRanges<256> = LetGoRanges::new();

/// Whether `[start, end)` overlaps a stack let go of.
pub(crate) fn let_go_of(start: usize, end: usize) -> bool {
    LET_GO.overlaps(start, end)
}

/// Forgets the stacks let go of inside `[start, end)`, unmapped: a later mapping there is
/// not named a stack.
pub(crate) fn forget(start: usize, end: usize) {
    LET_GO.forget(start, end);
}

/// Lets go of the stack `[start, start + len_bytes)` in signal mode (see the module's
/// comment), starting a waiting process's pager first; true if some of it was managed.
/// Whole pages: the ones the stack's ends share with neighbouring blocks of the heap go
/// too.
fn let_go_of_stack(start: usize, len_bytes: usize, starts_the_pager: bool) -> bool {
    let signal_mode = |mode| mode == uswap::FaultMode::Signal;
    if len_bytes == 0 || !crate::config().is_some_and(|c| signal_mode(c.fault_mode)) {
        return false;
    }
    if starts_the_pager {
        crate::start_if_waiting(crate::StartCause::Stack(len_bytes));
    }
    let Some(pager) = crate::pager().filter(|p| signal_mode(p.fault_mode())) else { return false };
    let from = start & !(uswap::PAGE_SIZE - 1);
    let to = start.saturating_add(len_bytes).next_multiple_of(uswap::PAGE_SIZE);
    let let_go = {
        let _g = Guard::enter();
        // Failing, the stack stays managed (and a signal taken on it may end the thread).
        pager.unmanage(from, to - from).is_ok_and(|nr_pages| nr_pages > 0)
    };
    if let_go && !LET_GO.overlaps(from, to) {
        LET_GO.keep(from, to - from);
    }
    let_go
}

/// The stack the program gave a new thread in `attr` (`pthread_attr_setstack`), let go of
/// in signal mode (see the module's comment); true if some of it was managed. For
/// `pthread_create`, which started the pager.
pub(crate) fn let_go_of_thread_stack(attr: *const libc::pthread_attr_t) -> bool {
    given_stack(attr).is_some_and(|(top, size)| let_go_of_stack(top.saturating_sub(size), size, false))
}

extern "C" {
    /// The top of the stack the program set in `attr` (`pthread_attr_setstack`), or null:
    /// `pthread_attr_getstack` cannot tell "none" from one, its address being computed.
    fn pthread_attr_getstackaddr(attr: *const libc::pthread_attr_t, stackaddr: *mut *mut c_void) -> libc::c_int;
}

/// The top and the size of the stack the program set in `attr` for a new thread
/// (`pthread_attr_setstack`), if it set one.
pub(crate) fn given_stack(attr: *const libc::pthread_attr_t) -> Option<(usize, usize)> {
    if attr.is_null() {
        return None;
    }
    let (mut top, mut size) = (std::ptr::null_mut(), 0usize);
    // SAFETY: `attr` is the caller's initialized attribute object; both calls only read it.
    let set = unsafe {
        pthread_attr_getstackaddr(attr, &mut top) == 0 && libc::pthread_attr_getstacksize(attr, &mut size) == 0
    };
    (set && !top.is_null() && size > 0).then_some((top as usize, size))
}

/// The C library's `makecontext`.
static REAL_MAKECONTEXT: AtomicPtr<c_void> = AtomicPtr::new(std::ptr::null_mut());

/// `makecontext`, interposed: [`makecontext_target`] lets go of the context's stack and
/// gives the C library's function, to which the stub jumps with the caller's registers and
/// stack as they were (the function is variadic: its arguments are in `rcx`, `r8`, `r9`
/// and on the stack, which a Rust function could not pass on).
///
/// # Safety
/// As the C function of this name.
#[no_mangle]
#[unsafe(naked)]
pub unsafe extern "C" fn makecontext(ucp: *mut libc::ucontext_t) {
    std::arch::naked_asm!(
        // At entry rsp is 8 past a 16-byte boundary; seven pushes make the call aligned.
        // rax: the number of vector registers a variadic call passes, kept as well.
        "push rdi",
        "push rsi",
        "push rdx",
        "push rcx",
        "push r8",
        "push r9",
        "push rax",
        "call {target}",
        "mov r11, rax",
        "pop rax",
        "pop r9",
        "pop r8",
        "pop rcx",
        "pop rdx",
        "pop rsi",
        "pop rdi",
        "jmp r11",
        target = sym makecontext_target,
    )
}

/// What the [`makecontext`] stub calls: lets go of `ucp`'s stack (see the module's comment)
/// and returns the C library's `makecontext`.
extern "C" fn makecontext_target(ucp: *const libc::ucontext_t) -> *mut c_void {
    let real = crate::real::next_symbol(&REAL_MAKECONTEXT, c"makecontext");
    if !ucp.is_null() && !in_uswap() && !uswap::is_engine_thread() {
        // SAFETY: `ucp` is the caller's context, initialized by `getcontext` and given a
        // stack, as `makecontext` requires; only its stack is read.
        let stack = unsafe { (*ucp).uc_stack };
        let_go_of_stack(stack.ss_sp as usize, stack.ss_size, true);
    }
    real
}
