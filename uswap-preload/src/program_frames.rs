//! Where the program's frames begin on this thread's stack: the stack pointer of the
//! program's call into this library, found by unwinding this library's own frames.
//!
//! Why: signal mode's rewrite of the C library (`uswap::syscall_guard::start`), made when a
//! process first needs its pager, reads the stack for a call the C library was making when a
//! signal handler now running interrupted it. This library's own frames, below the
//! program's call, hold no such context, but the slots they never wrote may still hold a
//! copy of one from a handler that has returned (a handler that allocated while `read`
//! waited, then `main` allocating again at the same depth): read, it would put the start off
//! for nothing.
//!
//! The frames are walked with the C++ ABI's unwinder (`_Unwind_Backtrace`: GCC's, which
//! Rust's standard library needs, linked into this library by `build.rs`), by the call
//! frame information of this library's Rust code and of its mimalloc. It stops at the first
//! frame whose code is not this library's; a frame it cannot step over ends the walk with no
//! answer, and the caller then reads the whole stack from its own frame up (safe, only more
//! often put off). It takes
//! the dynamic linker's lock as `dl_iterate_phdr` does, which the rewrite takes anyway; not
//! for a signal handler of uswap's own.

use std::ffi::c_void;
use std::sync::OnceLock;

#[repr(C)]
struct UnwindContext {
    _opaque: [u8; 0],
}

/// `_Unwind_Reason_Code`'s values this walk uses.
const URC_NO_REASON: libc::c_int = 0;
const URC_END_OF_STACK: libc::c_int = 5;

type Trace = extern "C" fn(*mut UnwindContext, *mut c_void) -> libc::c_int;

extern "C" {
    fn _Unwind_Backtrace(trace: Trace, data: *mut c_void) -> libc::c_int;
    fn _Unwind_GetIP(ctx: *mut UnwindContext) -> usize;
    fn _Unwind_GetCFA(ctx: *mut UnwindContext) -> usize;
}

/// The most frames of this library walked: more is not a stack this library makes.
const MAX_OWN_FRAMES: usize = 256;

/// This library's extent `[start, end)` (its code among the rest), found once.
fn own_text() -> Option<(usize, usize)> {
    static TEXT: OnceLock<Option<(usize, usize)>> = OnceLock::new();
    *TEXT.get_or_init(|| {
        // SAFETY: an all-zero Dl_info is valid; dladdr only fills it.
        let mut info: libc::Dl_info = unsafe { std::mem::zeroed() };
        // SAFETY: dladdr reads the loader's tables for an address of this library's code.
        if unsafe { libc::dladdr(program_stack_pointer as *const c_void, &mut info) } == 0 {
            return None;
        }
        crate::real::loaded_extent(info.dli_fbase as usize)
    })
}

/// The stack pointer of the program's frame that called into this library on this thread
/// (the canonical frame address of this library's outermost frame), or none if the walk
/// could not tell (then the whole stack is read, and the rewrite may be refused for a stale
/// word: safe).
pub fn program_stack_pointer() -> Option<usize> {
    struct Walk {
        text: (usize, usize),
        sp: usize,
        frames: usize,
        left: bool,
    }
    extern "C" fn step(ctx: *mut UnwindContext, data: *mut c_void) -> libc::c_int {
        // SAFETY: `data` is the `Walk` below, alive for the walk; `ctx` is the unwinder's.
        let (w, ip) = unsafe { (&mut *(data as *mut Walk), _Unwind_GetIP(ctx)) };
        if !(w.text.0..w.text.1).contains(&ip) {
            // libgcc's "CFA" of a context is that frame's own stack pointer (its callee's
            // canonical frame address): here, the program's at its call into this library.
            // SAFETY: as above.
            w.sp = unsafe { _Unwind_GetCFA(ctx) };
            w.left = true;
            return URC_END_OF_STACK;
        }
        w.frames += 1;
        if w.frames > MAX_OWN_FRAMES {
            return URC_END_OF_STACK;
        }
        URC_NO_REASON
    }
    let mut walk = Walk { text: own_text()?, sp: 0, frames: 0, left: false };
    // SAFETY: `step` matches the callback type and reads only what it is given.
    unsafe { _Unwind_Backtrace(step, &mut walk as *mut Walk as *mut c_void) };
    (walk.left && walk.sp != 0).then_some(walk.sp)
}
