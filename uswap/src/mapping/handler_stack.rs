//! Stacks for the signal-mode fault handler's work, so that it does not need the faulting
//! thread's.
//!
//! Serving a fault takes up to 25.6 KiB of stack in a release build and 38.5 KiB in a debug
//! build (a device read, decompression, readahead). On the faulting thread's own stack that
//! killed threads with small stacks (16 KiB: SIGSEGV inside the handler), which programs
//! give their worker threads and coroutines. So the handler, once the kernel has written its
//! signal frame on the thread's stack (1.8 KiB here, `AT_MINSIGSTKSZ`), switches to a stack
//! of this pool for the fault's service ([`run`]) and back for anything else (a SIGBUS passed
//! on to the program's own handler runs on the thread's stack, so that a `siglongjmp` out of
//! it leaves no pool stack taken).
//!
//! The pool is [`NR_STACKS`] stacks of [`STACK_BYTES`], each above a guard page, reserved once
//! when the first signal-mode pager is built ([`reserve`]; `MAP_NORESERVE`: only the pages a
//! handler touched are memory). A handler takes a free one with one compare-and-swap, and
//! gives it back when the service ends; a nested fault takes another. With every stack taken
//! (more faults at once than [`NR_STACKS`]) the service runs where it is, as before.
//!
//! Locking: one atomic flag per stack; nothing waits. Allocation-free after [`reserve`].

use std::ffi::c_void;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Once;

use crate::uffd::PAGE_SIZE;

/// Stacks in the pool: the faults that can be served at once on a stack of their own.
pub const NR_STACKS: usize = 64;
/// One stack: five times the release build's measured need, three times the debug build's.
pub const STACK_BYTES: usize = 128 << 10;
/// A stack and the guard page below it.
const SLOT_BYTES: usize = STACK_BYTES + PAGE_SIZE;

static RESERVE: Once = Once::new();
/// The pool's base address; 0 until reserved (or if reserving failed).
static BASE: AtomicUsize = AtomicUsize::new(0);
static TAKEN: [AtomicBool; NR_STACKS] = [const { AtomicBool::new(false) }; NR_STACKS];

std::arch::global_asm!(
    ".globl uswap_call_on_stack",
    ".type uswap_call_on_stack,@function",
    // uswap_call_on_stack(arg: rdi, f: rsi, stack_top: rdx): calls f(arg) on the stack that
    // ends at `stack_top` (16-byte aligned), and returns on the caller's.
    "uswap_call_on_stack:",
    "    .cfi_startproc",
    "    push rbp",
    "    .cfi_def_cfa_offset 16",
    "    .cfi_offset rbp, -16",
    "    mov rbp, rsp",
    "    .cfi_def_cfa_register rbp",
    "    mov rsp, rdx",
    "    call rsi",
    "    mov rsp, rbp",
    "    pop rbp",
    "    .cfi_def_cfa rsp, 8",
    "    ret",
    "    .cfi_endproc",
    ".size uswap_call_on_stack, .-uswap_call_on_stack",
);

extern "C" {
    fn uswap_call_on_stack(arg: *mut c_void, f: extern "C" fn(*mut c_void), stack_top: usize);
}

/// Reserves the pool (once; later calls do nothing). Without it, [`run`] runs its function
/// where it is called.
pub fn reserve() {
    RESERVE.call_once(|| {
        if let Some(base) = map_pool() {
            BASE.store(base, Ordering::Release);
        }
    });
}

/// Maps the pool: read-write stacks, each above a `PROT_NONE` guard page. It lives as long
/// as the process.
fn map_pool() -> Option<usize> {
    let opts = super::MapOptions { no_huge_pages: false, dont_fork: false };
    let pool = super::Mapping::anonymous(NR_STACKS * SLOT_BYTES, opts).ok()?;
    for i in 0..NR_STACKS {
        // Dropping `pool` on a failure unmaps it: it was never published.
        pool.protect(i * SLOT_BYTES, PAGE_SIZE, libc::PROT_NONE).ok()?;
    }
    let base = pool.addr();
    std::mem::forget(pool);
    Some(base)
}

/// What [`run`] hands to the function on the other stack.
struct Call<F, R> {
    f: Option<F>,
    out: Option<R>,
}

extern "C" fn call_closure<F: FnOnce() -> R, R>(arg: *mut c_void) {
    // SAFETY: `run` passes a pointer to its own `Call<F, R>`, alive and not otherwise
    // borrowed until `uswap_call_on_stack` returns.
    let call = unsafe { &mut *(arg as *mut Call<F, R>) };
    if let Some(f) = call.f.take() {
        call.out = Some(f());
    }
}

/// Runs `f` on a stack of the pool, or where it is called when the pool is not reserved or
/// every stack is taken. A panic in `f` aborts the process (it would unwind through a
/// signal handler's frames otherwise). Async-signal-safe.
pub fn run<R, F: FnOnce() -> R>(f: F) -> R {
    let Some(i) = take() else { return f() };
    let top = BASE.load(Ordering::Acquire) + i * SLOT_BYTES + SLOT_BYTES;
    debug_assert_eq!(top % 16, 0, "a stack top must be 16-byte aligned");
    let mut call = Call { f: Some(f), out: None };
    // SAFETY: `top` is the end of slot `i`'s stack, which this thread now owns (its flag);
    // the function called is `call_closure` for this very `Call`, which outlives the call.
    unsafe { uswap_call_on_stack(&mut call as *mut Call<F, R> as *mut c_void, call_closure::<F, R>, top) };
    TAKEN[i].store(false, Ordering::Release);
    match call.out {
        Some(out) => out,
        // Unreachable: `call_closure` ran `f` (a panic in it aborts, see above).
        None => std::process::abort(),
    }
}

/// Takes a free stack of the pool; `None` if it is not reserved or all are taken.
fn take() -> Option<usize> {
    if BASE.load(Ordering::Acquire) == 0 {
        return None;
    }
    // Bounded: one pass over the flags.
    (0..NR_STACKS).find(|&i| TAKEN[i].compare_exchange(false, true, Ordering::Acquire, Ordering::Relaxed).is_ok())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_function_runs_on_a_pool_stack_and_gives_it_back() {
        reserve();
        let base = BASE.load(Ordering::Acquire);
        assert_ne!(base, 0, "the pool is reserved");
        let (sp, nested_sp) = run(|| {
            let here = 0u8;
            let nested = run(|| {
                let there = 0u8;
                &there as *const u8 as usize
            });
            (&here as *const u8 as usize, nested)
        });
        let pool = base..base + NR_STACKS * SLOT_BYTES;
        assert!(pool.contains(&sp), "{sp:#x} not in the pool {pool:x?}");
        assert!(pool.contains(&nested_sp), "{nested_sp:#x} not in the pool");
        let (slot, nested_slot) = ((sp - base) / SLOT_BYTES, (nested_sp - base) / SLOT_BYTES);
        assert_ne!(slot, nested_slot, "a nested call takes a stack of its own");
        // (Another test's fault could take a stack meanwhile, but not these two, given back
        // a moment ago, both at once.)
        assert!(!TAKEN[slot].load(Ordering::Acquire) || !TAKEN[nested_slot].load(Ordering::Acquire));
    }
}
