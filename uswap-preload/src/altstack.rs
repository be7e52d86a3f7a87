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
//! goes through the rewritten system calls, which a signal-mode pager brings), the stack is
//! locked (`uswap::mlock`, as an `mlock` would, of its own kind so that the program's `munlock` leaves it) and its pages
//! brought in, writable, for as long as it is the thread's stack: until the thread sets
//! another, disables it, or ends. At most [`MAX_LOCKED_STACK_BYTES`] are locked, the top of a
//! larger stack (where frames go). A fork child's thread locks the stack it inherited again
//! (see [`after_fork_in_child`]). A stack too small for a signal's frame is not used at all:
//! uswap's own is put back in its place ([`keep_own_stack`]).

use std::cell::Cell;

use crate::real::{sys_mmap, sys_mprotect, sys_munmap};

/// One alternate stack: the kernel's frame (under 3.4 KiB here, `AT_MINSIGSTKSZ`, more with
/// AVX-512 state) and the handler's entry need a few KiB; but a program that set no
/// alternate stack of its own and installs a handler with `SA_ONSTACK` (for a crash report,
/// a backtrace) has that handler run here too, where without uswap it runs on the thread's
/// own stack. At 64 KiB a handler with a 64 KiB frame died of SIGSEGV: 1 MiB, reserved
/// (`MAP_NORESERVE`), of which only the pages a handler touches take memory.
pub const ALT_STACK_BYTES: usize = 1 << 20;
const GUARD_BYTES: usize = 4096;

/// The most of a program's alternate stack that is locked (its top).
pub const MAX_LOCKED_STACK_BYTES: usize = 4 << 20;

/// This thread's alternate stack, if uswap made it; unmapped when the thread ends. Or the
/// locked range of the program's own, if that lies in managed memory (`[0, 0)`: none);
/// unlocked when the thread ends.
struct AltStack {
    base: Cell<usize>,
    program_locked: Cell<(usize, usize)>,
}

impl AltStack {
    fn unlock_program_stack(&self) {
        let (start, end) = self.program_locked.replace((0, 0));
        if end > start {
            uswap::unlock_memory(uswap::mlock::LockKind::AltStack, start, end);
        }
    }
}

impl Drop for AltStack {
    fn drop(&mut self) {
        if crate::program_seccomp::filtered() {
            // A thread's end under the program's seccomp filter makes no call of uswap's:
            // its stack goes with the process.
            return;
        }
        self.unlock_program_stack();
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
            uswap::forget_engine_memory(base);
            sys_munmap(base as *mut libc::c_void, GUARD_BYTES + ALT_STACK_BYTES);
        }
    }
}

thread_local! {
    static ALT: AltStack = const { AltStack { base: Cell::new(0), program_locked: Cell::new((0, 0)) } };
}

/// After the calling thread's `sigaltstack` set `ss` (see the module's comment): locks the
/// stack if it lies in managed memory, and unlocks the previous one.
pub fn note_program_stack(ss: &libc::stack_t) {
    let _ = ALT.try_with(|a| {
        a.unlock_program_stack();
        if ss.ss_flags & libc::SS_DISABLE != 0 || ss.ss_size == 0 {
            return;
        }
        if ss.ss_size < least_stack_bytes() {
            keep_own_stack(a, ss.ss_size);
            return;
        }
        let end = (ss.ss_sp as usize).saturating_add(ss.ss_size);
        let start = (ss.ss_sp as usize).max(end.saturating_sub(MAX_LOCKED_STACK_BYTES));
        if lock_and_bring_in(start, end) {
            a.program_locked.set((start, end));
        }
    });
}

/// The least alternate stack a fault can be served on: the kernel's frame
/// (`AT_MINSIGSTKSZ`, 3,376 bytes here, with room for state this CPU does not have) and the
/// handler's entry, before it moves to a stack of `uswap::mapping::handler_stack`'s pool.
/// Measured here: 3,600 bytes held both, 3,072 did not.
fn least_stack_bytes() -> usize {
    const HANDLER_ENTRY_BYTES: usize = 512;
    // A kernel before 5.14 gives no `AT_MINSIGSTKSZ`: a frame with AVX-512 state is 3.4 KiB.
    const FRAME_WITHOUT_AUXV_BYTES: usize = 4096;
    // SAFETY: getauxval reads the process's auxiliary vector; 0 where the entry is absent.
    let frame = match unsafe { libc::getauxval(libc::AT_MINSIGSTKSZ) } as usize {
        0 => FRAME_WITHOUT_AUXV_BYTES,
        n => n.max(libc::MINSIGSTKSZ),
    };
    frame + HANDLER_ENTRY_BYTES
}

/// The program set an alternate stack too small for a signal's frame (under
/// [`least_stack_bytes`]; `MINSIGSTKSZ`, 2,048, is under the kernel's own minimum on a
/// machine with AVX): any signal taken on it overruns it, into the memory below, and each
/// of signal mode's faults is one (the program died of SIGSEGV, or spun for good re-entering
/// the handler). uswap's stack is put back in its place, for the program's handlers too,
/// and this is said once. A later `sigaltstack` of the program's replaces it as usual.
fn keep_own_stack(a: &AltStack, program_bytes: usize) {
    static SAID: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
    let base = match a.base.get() {
        0 => map_own_stack(),
        base => Some(base),
    };
    let Some(base) = base else { return };
    a.base.set(base);
    let ss = libc::stack_t { ss_sp: (base + GUARD_BYTES) as *mut libc::c_void, ss_flags: 0, ss_size: ALT_STACK_BYTES };
    // SAFETY: uswap's stack for this thread, mapped for as long as the thread lives.
    unsafe { libc::sigaltstack(&ss, std::ptr::null_mut()) };
    if !SAID.swap(true, std::sync::atomic::Ordering::Relaxed) {
        // Without allocating: `sigaltstack` may be called from a signal handler.
        // SAFETY: getpid cannot fail.
        let pid = unsafe { libc::getpid() } as u64;
        let mut line = uswap::sigbus::StderrLine::default();
        line.put(b"uswap: process ").put_number(pid, 10, 1).put(b" set an alternate signal stack of ");
        line.put_number(program_bytes as u64, 10, 1).put(b" bytes, too small for a signal's frame (");
        line.put_number(least_stack_bytes() as u64, 10, 1);
        line.put(b" bytes at least here): uswap's own stays in its place, for the program's signals too\n");
        line.write();
    }
}

/// Maps an alternate stack of uswap's (above a guard page) and returns its base.
fn map_own_stack() -> Option<usize> {
    let len = GUARD_BYTES + ALT_STACK_BYTES;
    let flags = libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE;
    let p = sys_mmap(std::ptr::null_mut(), len, libc::PROT_READ | libc::PROT_WRITE, flags, -1, 0);
    if p == libc::MAP_FAILED || (p as isize) < 0 {
        return None;
    }
    // The guard page below: an overflow is a SIGSEGV, not a write into whatever lies there.
    sys_mprotect(p, GUARD_BYTES, libc::PROT_NONE);
    uswap::note_engine_memory(p as usize, len);
    Some(p as usize)
}

/// Locks `[start, end)` if it is managed memory, then brings its pages in writable (locked
/// first: see `uswap::mlock`'s ordering). Returns whether it locked.
fn lock_and_bring_in(start: usize, end: usize) -> bool {
    if !crate::mlock::lock_if_managed(uswap::mlock::LockKind::AltStack, start, end) {
        return false;
    }
    // Written by the kernel: brought in writable, pinned while it is (the lock holds after).
    let mut pin = uswap::Pin::new();
    let _ = uswap::prepare_user_access(&mut pin, start, end - start, true);
    pin.release();
    true
}

/// In a fork child (one thread, the one that forked), once its pager took the regions over:
/// its alternate stack is the forking thread's, whose lock the child did not inherit, and
/// its pages are shared with the parent, write-protected until the child writes them (the
/// kernel's frame could not be written). So it is locked again and made writable.
pub fn after_fork_in_child() {
    let _ = ALT.try_with(|a| {
        let (start, end) = a.program_locked.replace((0, 0));
        if end > start && lock_and_bring_in(start, end) {
            a.program_locked.set((start, end));
        }
    });
}

/// Gives the calling thread an alternate signal stack, unless it has one: then the
/// program's is locked if it lies in managed memory (one set before the pager started, in
/// the heap the pager has just taken over).
pub fn install_on_this_thread() {
    let mut cur: libc::stack_t = libc::stack_t { ss_sp: std::ptr::null_mut(), ss_flags: 0, ss_size: 0 };
    // SAFETY: sigaltstack with a null new stack only reads the current one into `cur`.
    if unsafe { libc::sigaltstack(std::ptr::null(), &mut cur) } != 0 {
        return;
    }
    if cur.ss_flags & libc::SS_DISABLE == 0 {
        if ALT.try_with(|a| a.base.get() == 0 && a.program_locked.get() == (0, 0)).unwrap_or(false) {
            note_program_stack(&cur);
        }
        return;
    }
    let Some(base) = map_own_stack() else { return };
    let ss = libc::stack_t { ss_sp: (base + GUARD_BYTES) as *mut libc::c_void, ss_flags: 0, ss_size: ALT_STACK_BYTES };
    // SAFETY: the stack just mapped, ours, for as long as this thread lives (unmapped by the
    // thread-local's destructor at its end).
    if unsafe { libc::sigaltstack(&ss, std::ptr::null_mut()) } != 0 {
        uswap::forget_engine_memory(base);
        sys_munmap(base as *mut libc::c_void, GUARD_BYTES + ALT_STACK_BYTES);
        return;
    }
    ALT.with(|a| a.base.set(base));
}
