//! Forks the C library's `fork` does not make: `syscall(SYS_fork)`, `_Fork`, and a `clone`
//! without `CLONE_VM` (by `syscall`, or the C library's `clone`: container tools' children
//! in new namespaces).
//!
//! Why: no fork handler runs for them (`crate::fork`), and a child's copy of a managed
//! region is no longer registered with a userfaultfd: where a page was out, the child read
//! zeros (its checksum of 64 MiB written under a 16 MiB limit came out different, and the
//! program went on). So such a fork is made with every page of the process brought in
//! first (`Pager::prepare_fork`; reclaim held, the parent over its limit for the fork's
//! length), and the child runs unmanaged until it execs, every byte its own: the state of
//! the parent's threads is forgotten in it, as in a fork child, but it builds no pager.
//! A re-arm allocates, and without the C library's `fork` a thread of the engine's may
//! have held the C library's malloc lock at the fork. Its memory is outside the budget,
//! as the C library's `vfork` child's is, until its exec starts it a pager of its own.
//!
//! A process without a pager (one still waiting for it, lazy start, or whose library stands
//! aside) has nothing out: its fork runs the fork handlers themselves, as the C library's
//! `fork` would (`crate::fork`). A fork made where this library's own code runs on the
//! thread (a handler that interrupted it, whose locks may be held) is made as asked, and
//! said on stderr. Not covered: a `clone` with `CLONE_VFORK` and without `CLONE_VM` keeps
//! the parent's holds until the child execs or exits (its other threads' `mmap`s wait);
//! an `_Fork` from a signal handler that interrupted the program's own `sbrk` waits for
//! the break's lock for good (as the C library's `fork` would, in its handlers).
//!
//! Locking: as the fork handlers, the break's lock, then the table of managed mappings,
//! then the pager's hold, taken before the call; the parent lets go of them after it, the
//! child of its copies ([`uswap::ForkHold::release_in_unmanaged_child`]).

use std::ffi::{c_int, c_long, c_void};
use std::sync::atomic::AtomicPtr;

use crate::own_code::{in_uswap, Guard};

/// What the parent holds across a raw fork with a pager; the child lets go of its copy.
pub struct RawForkHold {
    pager: uswap::ForkHold,
    table: crate::mmap::TableHold,
}

/// What the child of a raw fork does first, on its one thread (see the module's comment).
#[derive(Clone, Copy)]
pub(crate) enum InChild {
    /// Nothing: the fork was made as asked.
    Nothing,
    /// The fork handler's work (`crate::fork::child`): the process had no pager.
    Handler,
    /// Forget the parent's state and run unmanaged, letting go of its copy of the holds at
    /// this place (in the parent's frame of [`around`], as the child's copy has it).
    Unmanaged(*mut Option<RawForkHold>),
}

impl InChild {
    pub(crate) fn run(self) {
        match self {
            InChild::Nothing => {}
            InChild::Handler => crate::fork::child(),
            InChild::Unmanaged(held) => run_unmanaged_in_child(held),
        }
    }
}

/// Makes the fork that `call` makes (see the module's comment). `call` gets what its child
/// must do first, which a child that does not return from `call` (the C library's `clone`
/// runs a function of its own) does itself; it returns what the call returned: 0 in a child
/// that returns, the child's id in the parent, or an error.
pub(crate) fn around(call: impl FnOnce(InChild) -> c_long) -> c_long {
    if in_uswap() || uswap::is_engine_thread() {
        crate::real::write_stderr(
            b"uswap: a fork without the C library's fork, made inside uswap's own code (a signal handler's?): \
              its child reads zeros where pages were out\n",
        );
        uswap::note_fork();
        return call(InChild::Nothing);
    }
    let mut held = None;
    let first = match crate::pager() {
        // Nothing out: the fork handlers' own work, as the C library's `fork` runs them.
        None => {
            crate::fork::prepare();
            InChild::Handler
        }
        Some(pager) => {
            crate::program_break::hold_for_fork();
            let _g = Guard::enter();
            let table = crate::mmap::hold_for_fork();
            held = Some(RawForkHold { pager: pager.prepare_fork(), table });
            InChild::Unmanaged(&mut held)
        }
    };
    let r = call(first);
    match (r, first) {
        (0, _) => first.run(),
        (_, InChild::Handler) => crate::fork::parent(),
        _ => {
            crate::program_break::release_after_fork();
            drop(held);
        }
    }
    r
}

/// In the child of a raw fork with a pager, on its one thread before it runs the program's
/// code: the parent's state forgotten, and no pager (see the module's comment). `held` is
/// the place [`around`] gave its call.
fn run_unmanaged_in_child(held: *mut Option<RawForkHold>) {
    // SAFETY: `held` is the child's copy of the parent's `Option` in `around`'s frame,
    // which no other thread of the child (it has one) reaches.
    let Some(RawForkHold { pager, table }) = (unsafe { held.as_mut() }).and_then(Option::take) else {
        return;
    };
    crate::fork::forget_the_parents_locks_in_child();
    crate::fork::forget_the_parents_work_in_child();
    crate::note_unmanaged_fork_child();
    // The parent's regions and pager are never dropped here (their threads are the
    // parent's); each managed mapping leaves the table as ordinary memory, every page in.
    pager.release_in_unmanaged_child();
    table.rearm(&mut Vec::new());
    crate::altstack::after_fork_in_child();
}

/// `clone(3)`'s `CLONE_VM` bit.
const CLONE_VM: c_long = libc::CLONE_VM as c_long;

/// Whether `syscall(n, a1, a2, ...)` makes a fork (not a thread, not a `vfork` that shares
/// the memory) that returns in the child: `fork`, or `clone`/`clone3` without `CLONE_VM`
/// and without a stack of its own (with one, the C library's `syscall` could not return in
/// the child).
pub(crate) fn is_raw_fork(n: c_long, a1: c_long, a2: c_long) -> bool {
    match n {
        libc::SYS_fork => true,
        libc::SYS_clone => a1 & CLONE_VM == 0 && a2 == 0,
        libc::SYS_clone3 => clone3_forks(a1 as *const u64, a2 as usize),
        _ => false,
    }
}

/// Whether `clone3`'s arguments (`struct clone_args`: `flags` first, `stack` its sixth
/// word) make a fork that returns in the child. False for a size too small to hold them.
fn clone3_forks(args: *const u64, size_bytes: usize) -> bool {
    const STACK_WORD: usize = 5;
    if args.is_null() || size_bytes < (STACK_WORD + 1) * 8 {
        return false;
    }
    // SAFETY: the caller's `struct clone_args` of `size_bytes` (checked to hold six words),
    // which the kernel is about to read; read only, wherever it is aligned. (A bad pointer
    // ends the program with SIGSEGV here, where the call would have failed with EFAULT.)
    let (flags, stack) = unsafe { (args.read_unaligned(), args.add(STACK_WORD).read_unaligned()) };
    flags & libc::CLONE_VM as u64 == 0 && stack == 0
}

/// The C library's `_Fork` (glibc 2.34: `fork` without its handlers).
static REAL_FORK_WITHOUT_HANDLERS: AtomicPtr<c_void> = AtomicPtr::new(std::ptr::null_mut());

/// `_Fork`, interposed (see the module's comment).
#[no_mangle]
pub extern "C" fn _Fork() -> libc::pid_t {
    let real = crate::real::next_symbol(&REAL_FORK_WITHOUT_HANDLERS, c"_Fork");
    // SAFETY: the C library's `_Fork`, which takes no argument.
    let call = |_| c_long::from(unsafe { std::mem::transmute::<*mut c_void, extern "C" fn() -> libc::pid_t>(real)() });
    around(call) as libc::pid_t
}

/// The C library's `clone`.
static REAL_CLONE: AtomicPtr<c_void> = AtomicPtr::new(std::ptr::null_mut());

type ChildFn = extern "C" fn(*mut c_void) -> c_int;
type CloneFn = unsafe extern "C" fn(ChildFn, *mut c_void, c_int, *mut c_void, ...) -> c_int;

/// What the child of a raw `clone` starts with: the program's function and argument, and
/// what it does first.
struct CloneChild {
    run: ChildFn,
    arg: *mut c_void,
    first: InChild,
}

/// `clone(fn, stack, flags, arg, parent_tid, tls, child_tid)`, interposed: one without
/// `CLONE_VM` is a fork (see the module's comment), whose child starts in
/// [`clone_child_start`]. The arguments after `arg` are variadic in C; on the x86-64 ABI
/// they travel where fixed ones do, so declaring them reads what the caller passed (and
/// harmless leftovers where it passed fewer, which the C library's `clone` reads only for
/// the flags that name them).
///
/// # Safety
/// As the C function of this name.
#[no_mangle]
pub unsafe extern "C" fn clone(
    run: ChildFn,
    stack: *mut c_void,
    flags: c_int,
    arg: *mut c_void,
    parent_tid: *mut c_void,
    tls: *mut c_void,
    child_tid: *mut c_void,
) -> c_int {
    let real = crate::real::next_symbol(&REAL_CLONE, c"clone");
    // SAFETY: `real` is the C library's `clone`, of this type.
    let real = unsafe { std::mem::transmute::<*mut c_void, CloneFn>(real) };
    if c_long::from(flags) & CLONE_VM != 0 {
        // SAFETY: the caller's arguments, as given.
        return unsafe { real(run, stack, flags, arg, parent_tid, tls, child_tid) };
    }
    let call = |first| {
        // The parent's copy lives through the call; the child reads its own copy.
        let child = CloneChild { run, arg, first };
        let child_arg = &child as *const CloneChild as *mut c_void;
        // SAFETY: the caller's arguments, but for the function the child starts in, which
        // runs the caller's with its argument.
        c_long::from(unsafe { real(clone_child_start, stack, flags, child_arg, parent_tid, tls, child_tid) })
    };
    around(call) as c_int
}

/// Where the child of a raw `clone` starts, on the stack the program gave: what it does
/// first ([`InChild`]), then the program's function.
extern "C" fn clone_child_start(p: *mut c_void) -> c_int {
    // SAFETY: `p` is the child's copy of the `CloneChild` in the parent's `clone` frame,
    // read once, before anything could change it.
    let child = unsafe { std::ptr::read(p.cast::<CloneChild>()) };
    child.first.run();
    (child.run)(child.arg)
}
