//! Process-wide SIGBUS plumbing for signal mode (`UFFD_FEATURE_SIGBUS`).
//!
//! With `UFFD_FEATURE_SIGBUS` the kernel does not queue a message for a missing page: it sends
//! SIGBUS to the faulting thread, which resolves its own fault inside the handler and returns
//! to retry the access. One handler serves every signal-mode pager in the process; it asks the
//! fault layer (through the function given to [`install`]) whether the address is managed and
//! otherwise passes the signal on to whatever handler was installed before, so the program's
//! own SIGBUS behaviour (and Rust's stack-overflow guard) is untouched.
//!
//! Every other signal is blocked while the handler runs, as the kernel defers signals until
//! its own page fault is done: an application signal handler cannot interrupt a fault
//! half-served and touch the page that fault holds.
//!
//! Locking: the chained action (the one installed before ours, or one a `sigaction`
//! interposer put there since: [`replace_chained`]) is read by the handler under a sequence
//! counter it never waits on for long; writers, rare (a program installing its own SIGBUS
//! handler), take a spin flag among themselves. Everything the handler does is async-signal-safe: it reads
//! `errno` and restores it, calls the registered function and, if that declines, the previous
//! handler.

use std::cell::{Cell, UnsafeCell};
use std::sync::atomic::{fence, AtomicBool, AtomicU32, AtomicUsize, Ordering};
use std::sync::Once;

/// Resolves a fault at `addr`; `is_write` is the hardware's write bit where the architecture
/// reports it. Returns false if the address is not one we manage.
pub type FaultFn = fn(addr: usize, is_write: bool) -> bool;

static INSTALL: Once = Once::new();
static FAULT_FN: AtomicUsize = AtomicUsize::new(0);
/// Sequence counter of `OLD_ACTION`: odd while a writer is changing it.
static CHAIN_SEQ: AtomicU32 = AtomicU32::new(0);
/// Held by the one writer of `OLD_ACTION` at a time.
static CHAIN_WRITER: AtomicBool = AtomicBool::new(false);
/// Set when the chained action had `SA_RESETHAND` and was delivered: the kernel puts the
/// default action back as it delivers such a signal, and so does the chain (the stored
/// action is left as it is: writing it needs `CHAIN_WRITER`, which the interrupted thread
/// may hold). Cleared when the program sets an action again ([`replace_chained`]).
static CHAIN_RESET: AtomicBool = AtomicBool::new(false);

/// The chained action as the program would see it: the default once an `SA_RESETHAND`
/// action was delivered.
fn effective_chained_action() -> libc::sigaction {
    let action = chained_action();
    if action.sa_flags & libc::SA_RESETHAND != 0 && CHAIN_RESET.load(Ordering::Acquire) {
        // SAFETY: an all-zero sigaction is SIG_DFL with no flags.
        return unsafe { std::mem::zeroed() };
    }
    action
}
/// Rounds a reader of `OLD_ACTION` retries while a writer is at work before it takes the
/// default action instead (the writer may be this very thread, interrupted).
const CHAIN_READ_ROUNDS: u32 = 10_000;

thread_local! {
    /// Depth of uswap's SIGBUS handler on this thread (const, no destructor: a plain TLS slot).
    static IN_HANDLER: Cell<u32> = const { Cell::new(0) };
}

/// Set once every system call of the process's C library goes through
/// `prepare_user_access` first and every thread has an alternate signal stack (`uswap run`'s
/// library does both): the kernel then meets no write-protected managed page in a call nor
/// when it writes uswap's SIGBUS frames, and signal mode may map a never-written page that
/// is read as the shared zero page, write-protected (see `fault_service::zero_fill`).
static SYSTEM_CALLS_ROUTED: AtomicBool = AtomicBool::new(false);

/// Declares what [`SYSTEM_CALLS_ROUTED`] says. Irrevocable.
pub fn note_system_calls_routed() {
    SYSTEM_CALLS_ROUTED.store(true, Ordering::Release);
}

/// Whether [`note_system_calls_routed`] was called.
pub fn system_calls_routed() -> bool {
    SYSTEM_CALLS_ROUTED.load(Ordering::Acquire)
}

/// Whether uswap's SIGBUS handler is running on this thread (its own `sigaction` calls, to
/// restore the default action for a fault it does not manage, must reach the C library).
pub fn in_handler() -> bool {
    IN_HANDLER.with(|d| d.get() > 0)
}

/// Signals whose default action ends the process, that a user or a supervisor sends to
/// stop a program (`uswap run` forwards SIGTERM, SIGHUP, SIGUSR1 and SIGUSR2; a terminal
/// sends SIGINT and SIGQUIT).
const STOP_SIGNALS: [libc::c_int; 7] =
    [libc::SIGTERM, libc::SIGINT, libc::SIGHUP, libc::SIGQUIT, libc::SIGUSR1, libc::SIGUSR2, libc::SIGALRM];

/// For a long wait inside the SIGBUS handler (a device read that does not answer): if a
/// signal that ends the process is pending, and the program left it at its default action,
/// unblocks it, so that the kernel ends the process now, as it ends a thread waiting in a
/// kernel page fault, rather than once the device answers or its timeouts run out. Signals
/// the program handles stay blocked until the fault is done (see the module doc). Does
/// nothing outside the handler, or outside a section where the engine blocked signals on
/// the program's thread (a system call's preparation serving a page). Async-signal-safe:
/// `sigpending`, `sigaction` (read only) and `pthread_sigmask`.
pub fn let_stop_signals_through() {
    if !in_handler() && !super::async_signals_blocked_by_engine() {
        return;
    }
    // SAFETY: sigset_t and sigaction are plain data these calls fill; the only change is to
    // this thread's mask, unblocking a signal whose action is the default.
    unsafe {
        let mut pending: libc::sigset_t = std::mem::zeroed();
        if libc::sigpending(&mut pending) != 0 {
            return;
        }
        for sig in STOP_SIGNALS {
            if libc::sigismember(&pending, sig) != 1 {
                continue;
            }
            let mut act: libc::sigaction = std::mem::zeroed();
            if libc::sigaction(sig, std::ptr::null(), &mut act) == 0 && act.sa_sigaction == libc::SIG_DFL {
                let mut one: libc::sigset_t = std::mem::zeroed();
                libc::sigemptyset(&mut one);
                libc::sigaddset(&mut one, sig);
                libc::pthread_sigmask(libc::SIG_UNBLOCK, &one, std::ptr::null_mut());
            }
        }
    }
}

struct OldAction(UnsafeCell<std::mem::MaybeUninit<libc::sigaction>>);
// SAFETY: written inside `INSTALL.call_once`, before the handler that reads it can run, and
// afterwards only by `replace_chained`, one writer at a time (`CHAIN_WRITER`) under the
// sequence counter `CHAIN_SEQ`, which every reader checks around its copy.
unsafe impl Sync for OldAction {}
static OLD_ACTION: OldAction = OldAction(UnsafeCell::new(std::mem::MaybeUninit::zeroed()));

/// Installs the process-wide SIGBUS handler (once) and routes managed faults to `f`.
pub fn install(f: FaultFn) -> std::io::Result<()> {
    FAULT_FN.store(f as usize, Ordering::Release);
    let mut result = Ok(());
    INSTALL.call_once(|| {
        // SAFETY: `sigaction` structures are plain data. We save the old action into its
        // static before installing ours, so the handler never sees it half-written.
        unsafe {
            let mut sa: libc::sigaction = std::mem::zeroed();
            sa.sa_sigaction = on_sigbus as *const () as usize;
            // SA_ONSTACK: on a thread with an alternate signal stack (`uswap run` gives every
            // thread one), the kernel's frame goes there, not onto a stack in managed memory.
            // Every asynchronous signal is blocked while a fault is served; SIGBUS is not
            // (SA_NODEFER, and out of the mask): a thread serving a fault then never looks
            // like one that blocks SIGBUS to the look at the masks (`super::signal_guard`),
            // which named threads caught mid-fault, and a nested fault is delivered (the
            // handler's depth counts it) rather than forced to the default action.
            sa.sa_flags = libc::SA_SIGINFO | libc::SA_RESTART | libc::SA_ONSTACK | libc::SA_NODEFER;
            libc::sigfillset(&mut sa.sa_mask);
            libc::sigdelset(&mut sa.sa_mask, libc::SIGBUS);
            let old = (*OLD_ACTION.0.get()).as_mut_ptr();
            if libc::sigaction(libc::SIGBUS, std::ptr::null(), old) != 0 {
                result = Err(std::io::Error::last_os_error());
                return;
            }
            if libc::sigaction(libc::SIGBUS, &sa, std::ptr::null_mut()) != 0 {
                result = Err(std::io::Error::last_os_error());
            }
        }
    });
    result
}

/// Whether the process's SIGBUS action is still uswap's handler. False before [`install`],
/// and after the program replaced it (`sigaction`/`signal` for SIGBUS after the first
/// signal-mode pager): faults on managed pages then reach the program's handler.
pub fn handler_is_ours() -> std::io::Result<bool> {
    // SAFETY: sigaction with a null new action only reads the current one into ours.
    let current = unsafe {
        let mut cur: libc::sigaction = std::mem::zeroed();
        if libc::sigaction(libc::SIGBUS, std::ptr::null(), &mut cur) != 0 {
            return Err(std::io::Error::last_os_error());
        }
        cur.sa_sigaction
    };
    Ok(current == on_sigbus as *const () as usize)
}

/// Whether uswap's handler was ever installed in this process.
pub fn installed() -> bool {
    INSTALL.is_completed()
}

/// Whether the calling thread blocks SIGBUS. A fault the kernel raises in such a thread
/// cannot be handled: `force_sig_fault` resets a blocked SIGBUS to its default action
/// (kernel/signal.c, `force_sig_info_to_task`) and the process dies.
pub fn blocked_in_this_thread() -> bool {
    // SAFETY: pthread_sigmask with a null new set only reads this thread's mask into ours.
    unsafe {
        let mut cur: libc::sigset_t = std::mem::zeroed();
        libc::pthread_sigmask(libc::SIG_BLOCK, std::ptr::null(), &mut cur) == 0
            && libc::sigismember(&cur, libc::SIGBUS) == 1
    }
}

#[cfg(all(target_os = "linux", target_arch = "x86_64"))]
fn is_write_fault(uctx: *mut libc::c_void) -> bool {
    // The page-fault error code's bit 1 is "write access" (Intel SDM vol. 3, 4.7).
    // SAFETY: the kernel passes a valid `ucontext_t` to an SA_SIGINFO handler.
    let err = unsafe { (*(uctx as *const libc::ucontext_t)).uc_mcontext.gregs[libc::REG_ERR as usize] };
    err & 2 != 0
}

#[cfg(not(all(target_os = "linux", target_arch = "x86_64")))]
fn is_write_fault(_uctx: *mut libc::c_void) -> bool {
    // Unknown: assume a write, which maps a private zero-filled page (always correct).
    true
}

extern "C" fn on_sigbus(sig: libc::c_int, info: *mut libc::siginfo_t, uctx: *mut libc::c_void) {
    IN_HANDLER.with(|d| d.set(d.get() + 1));
    on_sigbus_inner(sig, info, uctx);
    IN_HANDLER.with(|d| d.set(d.get() - 1));
}

fn on_sigbus_inner(sig: libc::c_int, info: *mut libc::siginfo_t, uctx: *mut libc::c_void) {
    // SAFETY: __errno_location returns this thread's errno slot; the ioctls we make while
    // resolving the fault may change it and the interrupted code must not see that.
    let errno_slot = unsafe { libc::__errno_location() };
    // SAFETY: see above; the slot is valid for the thread's lifetime.
    let saved_errno = unsafe { *errno_slot };
    // SAFETY: the kernel passes a valid siginfo to an SA_SIGINFO handler.
    let (addr, code) = unsafe { ((*info).si_addr() as usize, (*info).si_code) };
    let f = FAULT_FN.load(Ordering::Acquire);
    // si_code > 0 means the kernel raised it for a fault (BUS_ADRERR for userfaultfd); a
    // SIGBUS sent with kill(2) or sigqueue(3) is never ours.
    let handled = code > 0 && f != 0 && {
        // SAFETY: FAULT_FN only ever holds a `FaultFn` stored by `install`.
        let f: FaultFn = unsafe { std::mem::transmute::<usize, FaultFn>(f) };
        f(addr, is_write_fault(uctx))
    };
    if !handled {
        chain(sig, info, uctx);
    }
    // SAFETY: restoring the value saved on entry.
    unsafe { *errno_slot = saved_errno };
}

/// Passes a SIGBUS we do not manage to the handler that was installed before ours.
fn chain(sig: libc::c_int, info: *mut libc::siginfo_t, uctx: *mut libc::c_void) {
    let mut old = effective_chained_action();
    // Delivered once, as the kernel delivers it: the first thread here takes the handler,
    // and the reset, for itself (two threads' SIGBUS at once call it once).
    if old.sa_flags & libc::SA_RESETHAND != 0 && CHAIN_RESET.swap(true, Ordering::AcqRel) {
        // SAFETY: an all-zero sigaction is SIG_DFL with no flags.
        old = unsafe { std::mem::zeroed() };
    }
    let handler = old.sa_sigaction;
    // SAFETY: the kernel's siginfo for this signal, valid for the handler's duration.
    let sent = unsafe { (*info).si_code } <= 0;
    if handler == libc::SIG_IGN && sent {
        // Sent by a process (`kill -BUS`) to a program that ignores SIGBUS: dropped, as the
        // kernel drops an ignored signal. Resetting the action here took uswap's handler
        // away, and the program's next fault on managed memory killed it.
        return;
    }
    if handler == libc::SIG_DFL || handler == libc::SIG_IGN {
        // Restore the default action and let it happen: for a fault, returning re-executes the
        // access, which now raises SIGBUS with the default (fatal) action, as without us. An
        // ignored SIGBUS from a fault cannot be ignored either: the kernel forces the default.
        // SAFETY: plain sigaction/raise calls, both async-signal-safe.
        unsafe {
            let mut dfl: libc::sigaction = std::mem::zeroed();
            dfl.sa_sigaction = libc::SIG_DFL;
            libc::sigaction(libc::SIGBUS, &dfl, std::ptr::null_mut());
            if sent && handler == libc::SIG_DFL {
                // Sent by a process: it will not recur on return, so deliver it again.
                libc::raise(sig);
            }
        }
        return;
    }
    // The program's handler runs as the program's code, outside uswap's handler's depth: it
    // may leave with `siglongjmp` (the usual way past a read beyond the end of a mapped
    // file) and never come back here, and the depth, left raised, made every later call
    // of the thread look like uswap's own: its system calls no longer had managed memory
    // brought in first (reads into it failed with EFAULT), and its signal masks went to the
    // kernel unchecked.
    IN_HANDLER.with(|d| d.set(d.get().saturating_sub(1)));
    set_program_handler_mask(&old, uctx);
    if old.sa_flags & libc::SA_SIGINFO != 0 {
        // SAFETY: with SA_SIGINFO, sa_sigaction is a three-argument handler.
        let h: extern "C" fn(libc::c_int, *mut libc::siginfo_t, *mut libc::c_void) =
            unsafe { std::mem::transmute(handler) };
        h(sig, info, uctx);
    } else {
        // SAFETY: without SA_SIGINFO, sa_sigaction holds a one-argument sa_handler.
        let h: extern "C" fn(libc::c_int) = unsafe { std::mem::transmute(handler) };
        h(sig);
    }
    IN_HANDLER.with(|d| d.set(d.get() + 1));
}

/// The signal mask the program's own handler gets, as the kernel would give it: the mask of
/// the code the signal interrupted and the handler's `sa_mask`, but SIGBUS not blocked (a
/// fault on managed memory in the handler must reach uswap's). uswap's handler blocks every
/// asynchronous signal; a program handler that left with `longjmp` (or `siglongjmp` without
/// the mask saved) kept them all blocked, and a SIGTERM never got through. Set with the
/// system call itself: the C library's may be interposed. Allocation-free.
fn set_program_handler_mask(action: &libc::sigaction, uctx: *mut libc::c_void) {
    // SAFETY: the kernel passes a valid `ucontext_t` to an SA_SIGINFO handler; sigset_t is
    // plain data, and the set functions only read and write the sets given.
    unsafe {
        let mut set = (*(uctx as *const libc::ucontext_t)).uc_sigmask;
        for sig in 1..=64 {
            if libc::sigismember(&action.sa_mask, sig) == 1 {
                libc::sigaddset(&mut set, sig);
            }
        }
        libc::sigdelset(&mut set, libc::SIGBUS);
        // The kernel's sigset is 8 bytes: the first 64 signals of the C library's set.
        libc::syscall(libc::SYS_rt_sigprocmask, libc::SIG_SETMASK, &set as *const libc::sigset_t, 0usize, 8usize);
    }
}

/// A consistent copy of the chained action; the default action if a writer stays mid-way
/// for `CHAIN_READ_ROUNDS` rounds (it can only be this thread, interrupted inside
/// [`replace_chained`] by a fault uswap does not manage). Allocation-free, never blocks.
fn chained_action() -> libc::sigaction {
    for _ in 0..CHAIN_READ_ROUNDS {
        let before = CHAIN_SEQ.load(Ordering::Acquire);
        if before & 1 == 0 {
            // SAFETY: OLD_ACTION is initialised (by `install`, before this handler could
            // run); a copy torn by a concurrent writer is detected by the counter below and
            // thrown away, and `sigaction` is plain data, valid for any bit pattern.
            let copy = unsafe { std::ptr::read_volatile((*OLD_ACTION.0.get()).as_ptr()) };
            fence(Ordering::Acquire);
            if CHAIN_SEQ.load(Ordering::Relaxed) == before {
                return copy;
            }
        }
        std::hint::spin_loop();
    }
    // SAFETY: an all-zero sigaction is SIG_DFL with no flags.
    unsafe { std::mem::zeroed() }
}

/// Makes `new` the action that SIGBUS signals uswap does not manage are passed to, and
/// returns the one it replaces (what the program would have got back from `sigaction` had
/// uswap's handler not been there). For a `sigaction` interposer (`uswap run`'s library): a
/// program that installs a SIGBUS handler of its own after the pager keeps uswap's in place,
/// and its own gets every SIGBUS that is not a managed page's fault. `None` only reads.
/// Does nothing but return the default action before [`install`].
pub fn replace_chained(new: Option<&libc::sigaction>) -> libc::sigaction {
    if !installed() {
        // SAFETY: an all-zero sigaction is SIG_DFL with no flags.
        return unsafe { std::mem::zeroed() };
    }
    // Copied before the counter goes odd: the caller's struct may be in managed memory,
    // and a fault while the counter is odd would make this thread's own handler wait.
    let new = new.copied();
    // Asynchronous signals stay out of the section: a handler of the program's that calls
    // `sigaction(SIGBUS, ..)` while this thread holds CHAIN_WRITER would spin on it forever.
    // Another thread holds it for a copy of a few words, so the wait is short.
    let _async_blocked = super::AsyncSignalsBlocked::new();
    while CHAIN_WRITER.swap(true, Ordering::Acquire) {
        std::thread::yield_now();
    }
    let old = effective_chained_action();
    if let Some(new) = new {
        CHAIN_SEQ.fetch_add(1, Ordering::Relaxed);
        fence(Ordering::Release);
        // SAFETY: the one writer (CHAIN_WRITER held); readers check CHAIN_SEQ around their
        // copy and retry if it changed.
        unsafe { std::ptr::write_volatile((*OLD_ACTION.0.get()).as_mut_ptr(), new) };
        CHAIN_RESET.store(false, Ordering::Release);
        CHAIN_SEQ.fetch_add(1, Ordering::Release);
    }
    CHAIN_WRITER.store(false, Ordering::Release);
    old
}

/// A line for stderr built without allocating (a buffer on the stack), for messages written
/// from a signal handler or the system-call path. Longer lines are cut at 512 bytes.
pub struct StderrLine {
    buf: [u8; 512],
    len: usize,
}

impl Default for StderrLine {
    fn default() -> Self {
        StderrLine { buf: [0; 512], len: 0 }
    }
}

impl StderrLine {
    /// Appends `bytes` (what does not fit is dropped).
    pub fn put(&mut self, bytes: &[u8]) -> &mut Self {
        let k = bytes.len().min(self.buf.len() - self.len);
        self.buf[self.len..self.len + k].copy_from_slice(&bytes[..k]);
        self.len += k;
        self
    }

    /// Appends `v` in `base` (10 or 16), with at least `min_digits` digits.
    pub fn put_number(&mut self, mut v: u64, base: u64, min_digits: usize) -> &mut Self {
        debug_assert!(base == 10 || base == 16);
        let mut digits = [b'0'; 20];
        let mut n = 0;
        // Bounded: 20 digits at most (u64 in base 10).
        while (v > 0 || n < min_digits) && n < digits.len() {
            digits[digits.len() - 1 - n] = b"0123456789abcdef"[(v % base) as usize];
            v /= base;
            n += 1;
        }
        self.put(&digits[digits.len() - n.max(1)..])
    }

    /// Writes the line to stderr; async-signal-safe.
    pub fn write(&self) {
        // SAFETY: write(2) of a buffer we own to stderr; async-signal-safe.
        unsafe { libc::write(2, self.buf.as_ptr().cast(), self.len) };
    }
}

/// Writes "uswap: page 0x… <why[0]>[: <cause>]<why[1]>; delivering SIGBUS" to stderr
/// without allocating (for the moment before SIGBUS is delivered). `why` says what failed
/// (`FaultError::why_lost`), `cause` what the device said of it (may be empty);
/// `Pager::recent_errors` and the `fault_error` counter keep the details.
pub fn report_lost_page(addr: usize, why: [&str; 2], cause: &str) {
    let mut line = StderrLine::default();
    line.put(b"uswap: page 0x").put_number(addr as u64, 16, 16).put(b" ").put(why[0].as_bytes());
    if !cause.is_empty() {
        line.put(b": ").put(cause.as_bytes());
    }
    line.put(why[1].as_bytes()).put(b"; delivering SIGBUS\n").write();
}

/// Sends SIGBUS to thread `tid` of this process (thread mode: the thread waiting on a page
/// that cannot be brought back).
pub fn signal_thread(tid: u32) {
    // SAFETY: tgkill(2) with our own pid; a stale tid at worst yields ESRCH.
    unsafe { libc::syscall(libc::SYS_tgkill, libc::getpid(), tid as libc::pid_t, libc::SIGBUS) };
}

#[cfg(test)]
mod tests {
    use super::StderrLine;

    /// Numbers padded and not, in both bases; a line too long is cut, not overrun.
    #[test]
    fn stderr_lines_format_numbers_and_stop_at_their_buffer() {
        let mut l = StderrLine::default();
        l.put(b"a ").put_number(0, 10, 1).put(b" ").put_number(1234, 10, 1).put(b" 0x");
        l.put_number(0xbeef, 16, 1).put(b" ").put_number(0x7f00_1000, 16, 16).put(b" ").put_number(u64::MAX, 10, 1);
        assert_eq!(&l.buf[..l.len], b"a 0 1234 0xbeef 000000007f001000 18446744073709551615");
        for _ in 0..100 {
            l.put(b"0123456789");
        }
        assert_eq!(l.len, l.buf.len());
    }
}
