//! The slow path of a rewritten system call: make the memory it touches ready, then make it.
//!
//! `uswap_syscall_slow_entry` (assembly) is called from a trampoline below the red zone with
//! the call's number in `rax` and its arguments in `rdi, rsi, rdx, r10, r8, r9`. It saves
//! those, the flags and `xmm0`-`xmm15` (the code around an inline `syscall` may keep values
//! in them; the instruction itself changes only `rax`, `rcx` and `r11`), calls [`slow`], and
//! returns its result in `rax`. The C library is built for the baseline x86-64, so the
//! compiler keeps nothing in the upper halves of vector registers or in x87 registers across
//! an inline `syscall`, and [`slow`] changes neither the x87 control word nor `MXCSR`.
//!
//! [`slow`] applies the call's [`Rule`]: every byte of managed memory the kernel will read or
//! write is brought in first (`super::prepare`), as a fault in the thread itself would, and
//! pinned (`crate::pin::Pin`, up to `crate::pin::MAX_PIN_BYTES` a call, a buffer's first
//! pages first, as the kernel starts there): reclaim leaves it in until the call returned.
//! Only then is the call made. If it still fails with `EFAULT` while it touched managed
//! memory (a buffer beyond the pin's allowance, a structure larger than assumed), the
//! memory is made ready again and the call made again, a bounded number of times (the last
//! ones cut to the first page of the buffer where the call may do less than asked: see
//! [`shrunk`]),
//! unless no page was taken out of any region since the last preparation and that one
//! found nothing out: then the `EFAULT` is not uswap's and goes back as it is. Reads and
//! writes of data (see [`super::complete`]) are made again once at their whole size, then
//! in windows ([`in_windows`]), and one that came back short while reclaim ran is continued
//! for the rest. An `EFAULT` after which pages had to be brought in, and that the program
//! finally sees, is counted (`syscall_efault`) and said once.
//!
//! Runs on the program's thread, maybe inside its signal handler: allocates nothing, takes
//! no lock, but for a discard (`super::discards`), whose application takes the pager's event
//! reader lock and may allocate as an event's does (a program's handler that discards while
//! its thread is inside `malloc` could wait on the C library's lock). Once the process can cancel threads (glibc installed its SIGCANCEL handler), a
//! preparation runs with the thread's cancellation disabled and deferred
//! ([`CancelPutOff`]): a cancellation pending ends the thread as the preparation ends,
//! unwound through glibc's unwinder (which takes the dynamic loader's lock), never from
//! inside the engine.

use std::arch::global_asm;
use std::cell::Cell;
use std::sync::atomic::{AtomicBool, Ordering};

use libc::c_long;

use super::complete::{self, Iovs, Transfer};
use super::prepare::{prepare, Prepared};
use super::raw::{raw, read_user};
use super::table::{rule, Rule};

global_asm!(
    ".globl uswap_syscall_slow_entry",
    ".type uswap_syscall_slow_entry,@function",
    "uswap_syscall_slow_entry:",
    "    pushfq",
    "    cld",
    "    push rdi",
    "    push rsi",
    "    push rdx",
    "    push r10",
    "    push r8",
    "    push r9",
    "    push rax",
    "    push rbp",
    "    mov rbp, rsp",
    "    and rsp, -16",
    "    sub rsp, 256",
    "    movups [rsp + 0], xmm0",
    "    movups [rsp + 16], xmm1",
    "    movups [rsp + 32], xmm2",
    "    movups [rsp + 48], xmm3",
    "    movups [rsp + 64], xmm4",
    "    movups [rsp + 80], xmm5",
    "    movups [rsp + 96], xmm6",
    "    movups [rsp + 112], xmm7",
    "    movups [rsp + 128], xmm8",
    "    movups [rsp + 144], xmm9",
    "    movups [rsp + 160], xmm10",
    "    movups [rsp + 176], xmm11",
    "    movups [rsp + 192], xmm12",
    "    movups [rsp + 208], xmm13",
    "    movups [rsp + 224], xmm14",
    "    movups [rsp + 240], xmm15",
    "    lea rdi, [rbp + 8]",
    "    call {slow}",
    "    movups xmm0, [rsp + 0]",
    "    movups xmm1, [rsp + 16]",
    "    movups xmm2, [rsp + 32]",
    "    movups xmm3, [rsp + 48]",
    "    movups xmm4, [rsp + 64]",
    "    movups xmm5, [rsp + 80]",
    "    movups xmm6, [rsp + 96]",
    "    movups xmm7, [rsp + 112]",
    "    movups xmm8, [rsp + 128]",
    "    movups xmm9, [rsp + 144]",
    "    movups xmm10, [rsp + 160]",
    "    movups xmm11, [rsp + 176]",
    "    movups xmm12, [rsp + 192]",
    "    movups xmm13, [rsp + 208]",
    "    movups xmm14, [rsp + 224]",
    "    movups xmm15, [rsp + 240]",
    "    mov rsp, rbp",
    "    pop rbp",
    "    lea rsp, [rsp + 8]",
    "    pop r9",
    "    pop r8",
    "    pop r10",
    "    pop rdx",
    "    pop rsi",
    "    pop rdi",
    "    popfq",
    "    ret",
    ".size uswap_syscall_slow_entry, .-uswap_syscall_slow_entry",
    slow = sym slow,
);

extern "C" {
    fn uswap_syscall_slow_entry();
}

/// The slow path's entry, for the trampolines.
pub fn slow_entry() -> u64 {
    uswap_syscall_slow_entry as *const () as u64
}

/// The registers `uswap_syscall_slow_entry` pushed, lowest address first.
#[repr(C)]
pub struct SavedRegs {
    nr: u64,
    r9: u64,
    r8: u64,
    r10: u64,
    rdx: u64,
    rsi: u64,
    rdi: u64,
}

/// The window a transfer that did not go through whole goes on in, while it is larger: half
/// a pin, so that a window's buffer stays in whole until the call returned (with room for a
/// buffer's unaligned last page). Windows of the rest of the buffer, as this once was, were
/// readied whole each time and kept in only as far as the pin: one `write` of 256 MiB from
/// a heap under a 32 MiB limit brought its pages in 34 times over (16 s, 0.5 s plain), each
/// call moving the 4 MiB the pin held.
const PINNED_WINDOW_BYTES: u64 = crate::pin::MAX_PIN_BYTES as u64 / 2;
/// Times a call is made again after an `EFAULT` on managed memory.
const EFAULT_RETRIES: usize = 8;
/// From this retry on, a call that may legally do less than asked (see [`shrunk`]) is made
/// for the first page of its buffer only: under a limit so tight that reclaim takes the
/// buffer's pages out again while the rest are brought in, the whole buffer is never in at
/// once (the kernel, faulting page by page as it copies, never needs it to be).
const SHRINK_FROM_RETRY: usize = 4;
thread_local! {
    /// Depth of slow paths on this thread: system calls made while one prepares memory (the
    /// engine's own, serving a fault) go straight to the kernel. Const-initialised: safe in
    /// a signal handler.
    static DEPTH: Cell<u32> = const { Cell::new(0) };
}

/// `mlockall` and `munlockall`, made as `crate::mapping::mlockall` says (the engine's own
/// mappings kept out of the program's lock), with this thread's calls meanwhile the engine's.
fn lock_all_call(nr: c_long, a: &[u64; 6]) -> Option<c_long> {
    match nr {
        libc::SYS_mlockall => Some(guarded(|| crate::mapping::mlockall(a[0]))),
        libc::SYS_munlockall => Some(guarded(crate::mapping::munlockall)),
        _ => None,
    }
}

/// `madvise(MADV_POPULATE_READ or MADV_POPULATE_WRITE)`: the kernel populates with faults of
/// its own, which signal mode cannot serve (`EFAULT`, where the same call succeeds without
/// uswap), so the range is brought in first, window by window, as `uswap run`'s library does
/// (`user_access::populate_in_windows`; docs/cli.md, "Populating").
/// `None` for other calls and other advice, made as any call.
fn populate_call(nr: c_long, a: &[u64; 6]) -> Option<c_long> {
    const MADV_POPULATE_READ: u64 = 22;
    const MADV_POPULATE_WRITE: u64 = 23;
    if nr != libc::SYS_madvise || !matches!(a[2], MADV_POPULATE_READ | MADV_POPULATE_WRITE) {
        return None;
    }
    let r = crate::user_access::populate_in_windows(a[0] as usize, a[1] as usize, |pin, at, n| {
        guarded(|| crate::user_access::prepare_user_access(pin, at, n, a[2] == MADV_POPULATE_WRITE));
        let mut window = *a;
        (window[0], window[1]) = (at as u64, n as u64);
        // SAFETY: the program's own call, on a part of the range it gave.
        unsafe { raw(nr, window) }
    });
    Some(r)
}

/// The slow path (see the module's comment).
extern "C" fn slow(regs: &SavedRegs) -> c_long {
    let nr = regs.nr as c_long;
    let a = [regs.rdi, regs.rsi, regs.rdx, regs.r10, regs.r8, regs.r9];
    let nested = DEPTH.get() > 0
        || crate::mapping::is_engine_thread()
        || crate::uffd::sigbus::in_handler()
        || crate::user_access::in_preparation();
    note_cancellation_handler(nr, &a, !nested);
    if nested {
        // SAFETY: the program's own call.
        return unsafe { raw(nr, a) };
    }
    note_async_kernel_access(nr, &a);
    // Lives until the call returned: the kernel reads the mask from here.
    let mut mask_copy = [0u64; 4];
    let mut a = a;
    super::masks::keep_sigbus_deliverable(nr, &mut a, &mut mask_copy);
    let r = rule(nr);
    // A transfer is made again once at its whole size; then it goes in windows.
    let transfer = complete::is_transfer(nr);
    let hooks = super::hooks();
    let locked = (hooks.mlock_before)(nr, &a);
    let r = if (hooks.mlock_populates)(nr, &a) { r } else { Rule::Plain };
    let made = match lock_all_call(nr, &a)
        .or_else(|| populate_call(nr, &a))
        .or_else(|| super::discards::is_discard(nr, &a).then(|| guarded(|| super::discards::make(nr, &a))))
    {
        Some(ret) => Made { ret, managed: false, maybe_cut: false, ours: false },
        None if transfer => make_prepared(nr, r, a, 1, first_ready_bytes(nr, &a)),
        None => make_prepared(nr, r, a, EFAULT_RETRIES, u64::MAX),
    };
    (hooks.mlock_after)(nr, &a, made.ret, locked);
    if nr == libc::SYS_sigaltstack && made.ret == 0 && a[0] != 0 {
        if let Some(ss) = read_user::<libc::stack_t>(&mut crate::pin::Pin::none(), a[0]) {
            (hooks.note_altstack)(&ss);
        }
    }
    if let Some(done_bytes) = super::own_memory::cut_after_bytes(nr, &a, made.ret) {
        if let Some(ret) = guarded(|| super::own_memory::continued(nr, &a, made.ret, done_bytes)) {
            return ret;
        }
    }
    let efault = -(libc::EFAULT as c_long);
    let needs_more = if made.ret > 0 { made.maybe_cut } else { made.ret == efault && made.ours };
    if !made.managed || !needs_more {
        return made.ret;
    }
    // Reads the call's iovecs, which may bring pages in: guarded as a preparation.
    let transfer = guarded(|| Transfer::of(nr, &a));
    let made = match transfer {
        Some(t) if !(t.once && made.ret > 0) => in_windows(nr, r, &a, &t, made),
        Some(_) => made,
        None if made.ret == efault => make_prepared(nr, r, a, EFAULT_RETRIES, u64::MAX),
        None => made,
    };
    if made.ret == efault && made.ours {
        crate::stats::note_syscall(crate::stats::SyscallEvent::Efault);
        say_efault_once(nr, &a);
    }
    made.ret
}

/// What a call made by [`make_prepared`] gave.
#[derive(Clone, Copy)]
struct Made {
    ret: c_long,
    /// Some of its memory is managed.
    managed: bool,
    /// A short count may be uswap's doing: pages were taken out while it ran, or it ended
    /// past the part of the buffer that was readied.
    maybe_cut: bool,
    /// Its `EFAULT` is uswap's: pages had to be brought in again for a retry.
    ours: bool,
}

/// The bytes of a transfer's buffer its first call readies: a flat transfer larger than a
/// pinned window that goes on for the rest in windows when it comes back short
/// (`complete::goes_on_in_windows`), only its first window. Readied whole, a buffer far
/// over the limit came in twice: reclaim took out all but its pinned head and tail again
/// before the call reached them, and the windows brought them in once more.
fn first_ready_bytes(nr: c_long, a: &[u64; 6]) -> u64 {
    if complete::goes_on_in_windows(nr, a, PINNED_WINDOW_BYTES) {
        PINNED_WINDOW_BYTES
    } else {
        u64::MAX
    }
}

/// Makes the call with its memory made ready first, and again, up to `retries` times,
/// after an `EFAULT` of uswap's; of a [`Rule::Buf`] call's buffer, `ready_max_bytes` at most
/// (the rest as it is: a count that ends past them may be uswap's doing, see [`Made`]).
fn make_prepared(nr: c_long, r: Rule, a: [u64; 6], retries: usize, ready_max_bytes: u64) -> Made {
    // Pinned until the call (and its retries) returned: see `crate::pin::Pin`. A futex reads its
    // word as the wait begins, then may sleep for good: not pinned (it is made again if the
    // word went out meanwhile).
    // An `execve` that succeeds does not return: its pin is known by the kernel's thread id.
    let mut pin = match nr {
        libc::SYS_futex | libc::SYS_futex_waitv => crate::pin::Pin::none(),
        libc::SYS_execve | libc::SYS_execveat => crate::pin::Pin::for_exec(),
        _ => crate::pin::Pin::new(),
    };
    let made = make_pinned(&mut pin, nr, r, a, retries, ready_max_bytes);
    pin.release();
    made
}

/// [`make_prepared`]'s work, its memory pinned in `pin`.
fn make_pinned(
    pin: &mut crate::pin::Pin,
    nr: c_long,
    r: Rule,
    a: [u64; 6],
    retries: usize,
    ready_max_bytes: u64,
) -> Made {
    let mut seq = crate::stats::taken_out_seq();
    let first = prepare_once(pin, nr, r, &a, ready_max_bytes);
    if first.managed {
        crate::stats::note_syscall(crate::stats::SyscallEvent::Prepared);
    }
    // SAFETY: the program's own call.
    let mut ret = unsafe { raw(nr, a) };
    let efault = -(libc::EFAULT as c_long);
    let mut made = Made { ret, managed: first.managed, maybe_cut: false, ours: false };
    if !first.managed {
        return made;
    }
    // Bounded: `retries` more calls at most. If nothing was taken out since the last
    // preparation and nothing is out now, the EFAULT is not uswap's (a bad pointer of the
    // program's, or an argument the call does not use that happens to point into managed
    // memory): it goes back as it is.
    let mut a = a;
    for retry in 0..retries {
        if ret != efault {
            break;
        }
        if retry == SHRINK_FROM_RETRY {
            a = shrunk(nr, a);
        }
        let seq_now = crate::stats::taken_out_seq();
        let again = prepare_once(pin, nr, r, &a, ready_max_bytes);
        if again.nr_brought_in == 0 && seq_now == seq {
            break;
        }
        made.ours |= again.nr_brought_in > 0;
        seq = seq_now;
        crate::stats::note_syscall(crate::stats::SyscallEvent::EfaultRetried);
        // SAFETY: the program's own call, made again.
        ret = unsafe { raw(nr, a) };
    }
    made.ret = ret;
    let past_ready = ret > 0 && ret as u64 >= ready_max_bytes;
    made.maybe_cut = crate::stats::taken_out_seq() != seq || past_ready;
    made
}

/// A transfer that came back short while reclaim ran, or whose buffer was never in whole
/// at once (`EFAULT` at its whole size), made for the rest as the kernel would have gone on
/// (see [`super::complete`]): in windows of its buffer, halved while one fails with
/// `EFAULT` (down to one page; only on byte streams). Returns the last call's result if
/// nothing was transferred, else the bytes transferred before the end or an error.
fn in_windows(nr: c_long, r: Rule, a: &[u64; 6], t: &Transfer, first: Made) -> Made {
    let page = crate::uffd::PAGE_SIZE as u64;
    let efault = -(libc::EFAULT as c_long);
    let mut done_bytes = 0u64;
    let mut window_bytes = t.total_bytes;
    let mut asked_bytes = t.total_bytes;
    let mut splittable = None;
    let mut iovs = Iovs::new();
    let mut last = first;
    // Bounded: every call transfers a byte or more, or halves the window.
    let max_calls = 2 * t.total_bytes.div_ceil(page) + 64;
    for _ in 0..max_calls {
        if last.ret > 0 {
            done_bytes += last.ret as u64;
            let short = (last.ret as u64) < asked_bytes;
            if t.once || done_bytes >= t.total_bytes || (short && !last.maybe_cut) {
                break;
            }
            if short {
                // Cut by reclaim, or past the first window readied: the rest goes in windows
                // that stay in whole.
                window_bytes = window_bytes.min(PINNED_WINDOW_BYTES);
            }
        } else if last.ret == efault && last.ours && window_bytes > page {
            if !*splittable.get_or_insert_with(|| complete::splittable(a[0])) {
                return make_prepared(nr, r, *a, EFAULT_RETRIES, u64::MAX);
            }
            window_bytes =
                if window_bytes > PINNED_WINDOW_BYTES { PINNED_WINDOW_BYTES } else { (window_bytes / 2).max(page) };
        } else {
            break;
        }
        // Reads the call's iovecs, which may bring pages in: guarded as a preparation.
        let (args, bytes) = guarded(|| t.window(a, done_bytes, window_bytes, &mut iovs));
        if bytes == 0 {
            break;
        }
        asked_bytes = bytes;
        crate::stats::note_syscall(crate::stats::SyscallEvent::Continued);
        // At one page, the last size, the full retries.
        let retries = if window_bytes <= page { EFAULT_RETRIES } else { 1 };
        last = make_prepared(nr, r, args, retries, u64::MAX);
    }
    if done_bytes > 0 {
        last.ret = done_bytes as c_long;
    }
    last
}

/// `a` with the buffer of a call that may legally do less than asked cut to what fits the
/// rest of its first page: `getdents` and `getdents64` return fewer entries (at least 512
/// bytes, for one), `epoll_wait` and its variants fewer events (at least one), and the
/// program calls again for the rest. (Reads and writes of data are made in windows
/// instead, see [`in_windows`].)
fn shrunk(nr: c_long, mut a: [u64; 6]) -> [u64; 6] {
    let page = crate::uffd::PAGE_SIZE as u64;
    let in_first_page = page - a[1] % page;
    match nr {
        libc::SYS_getdents | libc::SYS_getdents64 => a[2] = a[2].min(in_first_page.max(512)),
        libc::SYS_epoll_wait | libc::SYS_epoll_pwait | libc::SYS_epoll_pwait2 => {
            let event_bytes = std::mem::size_of::<libc::epoll_event>() as u64;
            // `int maxevents`: only a valid count gets here (see `super::prepare::buf_bytes`).
            a[2] = (a[2] as u32 as u64).min((in_first_page / event_bytes).max(1));
        }
        _ => {}
    }
    a
}

/// `KVM_SET_USER_MEMORY_REGION` and `KVM_SET_USER_MEMORY_REGION2` (`_IOW(KVMIO, 0x46, ...)`
/// and `_IOW(KVMIO, 0x49, ...)`).
const KVM_SET_USER_MEMORY_REGIONS: [u64; 2] = [0x4020_ae46, 0x40a0_ae49];

/// The head of `struct kvm_userspace_memory_region` (and of its `2` form).
#[repr(C)]
#[derive(Clone, Copy)]
struct KvmMemoryRegion {
    slot: u32,
    flags: u32,
    guest_phys_addr: u64,
    memory_size: u64,
    userspace_addr: u64,
}

/// Counts, and says once, a call that sets up memory the kernel reads or writes on its own
/// later, outside any call this path could prepare: an io_uring or AIO context (its reads
/// and writes complete asynchronously, into buffers that may be out by then, and fail with
/// `EFAULT` in their completions), or a KVM guest's RAM in managed memory (the guest's
/// accesses fail). Such programs belong in thread mode, where the kernel waits for a fault
/// wherever it takes it.
fn note_async_kernel_access(nr: c_long, a: &[u64; 6]) {
    let what: &[u8] = match nr {
        libc::SYS_io_uring_setup => b"io_uring",
        libc::SYS_io_setup => b"Linux AIO",
        libc::SYS_ioctl if KVM_SET_USER_MEMORY_REGIONS.contains(&a[1]) => {
            let Some(r) = read_user::<KvmMemoryRegion>(&mut crate::pin::Pin::none(), a[2]) else { return };
            let end = r.userspace_addr.saturating_add(r.memory_size) as usize;
            let mut managed = false;
            crate::region::REGIONS.for_each(|reg| managed = managed || reg.owns_any_of(r.userspace_addr as usize, end));
            if !managed {
                return;
            }
            b"a KVM guest's RAM in managed memory"
        }
        _ => return,
    };
    say_async_kernel_access(what);
}

/// Said once: see [`say_async_kernel_access`].
static ASYNC_KERNEL_ACCESS_SAID: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Counts (`syscall_async_kernel_access`) and says once on stderr that the kernel will
/// access managed memory of a signal-mode process later, by itself (`what`: an io_uring
/// instance, a KVM guest's RAM). Allocation-free.
fn say_async_kernel_access(what: &[u8]) {
    crate::stats::note_syscall(crate::stats::SyscallEvent::AsyncKernelAccess);
    if ASYNC_KERNEL_ACCESS_SAID.swap(true, std::sync::atomic::Ordering::Relaxed) {
        return;
    }
    let mut line = crate::uffd::sigbus::StderrLine::default();
    line.put(b"uswap: ").put(what).put(
        b" in signal mode: the kernel's own later accesses to managed pages that are out fail; \
          run this program with --fault-mode thread\n",
    );
    line.write();
}

/// As [`say_async_kernel_access`], for an instance set up where this path did not see the
/// call (`uswap run`'s library finds its mappings: liburing makes its own system calls);
/// nothing if one was said already.
pub fn note_async_kernel_access_found(what: &[u8]) {
    if !ASYNC_KERNEL_ACCESS_SAID.load(std::sync::atomic::Ordering::Relaxed) {
        say_async_kernel_access(what);
    }
}

/// Says on stderr, once per process, which call's `EFAULT` on managed memory reached the
/// program. Allocation-free.
fn say_efault_once(nr: c_long, a: &[u64; 6]) {
    use std::sync::atomic::{AtomicBool, Ordering};
    static SAID: AtomicBool = AtomicBool::new(false);
    if SAID.swap(true, Ordering::Relaxed) {
        return;
    }
    let mut line = crate::uffd::sigbus::StderrLine::default();
    line.put(b"uswap: system call ").put_number(nr as u64, 10, 1).put(
        b" failed with EFAULT on managed memory after every retry (signal mode; counted in syscall_efault), arguments",
    );
    for &v in a {
        line.put(b" 0x").put_number(v, 16, 1);
    }
    line.put(b"\n").write();
}

/// Whether this thread is in a slow path or an [`EngineCalls`] now: its system calls are the
/// engine's. Async-signal-safe.
pub fn in_engine_calls() -> bool {
    DEPTH.get() > 0
}

/// While it lives, this thread's rewritten system calls go straight to the kernel: for the
/// engine's own calls made on a program's thread outside a slow path (a fork child building
/// its pager, whose file device sets up io_uring rings over the engine's memory). The
/// thread's asynchronous signals are blocked meanwhile, so that no handler of the program's
/// runs with its calls unprepared.
pub struct EngineCalls {
    _signals: crate::uffd::AsyncSignalsBlocked,
}

impl EngineCalls {
    pub fn enter() -> EngineCalls {
        let _signals = crate::uffd::AsyncSignalsBlocked::new();
        DEPTH.set(DEPTH.get() + 1);
        EngineCalls { _signals }
    }
}

impl Drop for EngineCalls {
    fn drop(&mut self) {
        DEPTH.set(DEPTH.get() - 1);
    }
}

/// [`prepare`], with this thread's own system calls meanwhile (the engine's, serving the
/// faults) sent straight to the kernel, and its asynchronous cancellation put off (see
/// [`CancelPutOff`]). The call itself is made outside: a signal handler that runs while it
/// blocks has its calls prepared as usual, and a `pthread_cancel` ends it there.
fn prepare_once(pin: &mut crate::pin::Pin, nr: c_long, r: Rule, a: &[u64; 6], ready_max_bytes: u64) -> Prepared {
    if matches!(r, Rule::Plain) {
        return Prepared::default();
    }
    let mut ready = *a;
    if let Rule::Buf { len, .. } = r {
        ready[len as usize] = ready[len as usize].min(ready_max_bytes);
    }
    guarded(|| prepare(pin, nr, r, &ready))
}

/// Runs `f`, work of the slow path's own that may bring pages in, with this thread's system
/// calls sent straight to the kernel and its cancellation put off ([`CancelPutOff`]).
fn guarded<T>(f: impl FnOnce() -> T) -> T {
    let cancel = CANCELLATION_IN_USE.load(Ordering::Acquire).then(CancelPutOff::enter);
    DEPTH.set(DEPTH.get() + 1);
    let v = f();
    DEPTH.set(DEPTH.get() - 1);
    if let Some(cancel) = cancel {
        cancel.leave();
    }
    v
}

/// glibc's signal for `pthread_cancel` (the kernel's first real-time signal, which glibc
/// keeps for itself).
const SIGCANCEL: u64 = 32;

/// Whether this process has a SIGCANCEL handler: glibc installs it at the first
/// `pthread_cancel`, and until then no thread can be cancelled, so [`guarded`] need not put
/// cancellation off (30 ns a call measured: `probes/syscall_cost.c`, 190 ns against 220).
/// Set by [`slow`] as glibc's `rt_sigaction` goes through it, or by [`note_cancellation`]
/// when the rewrite comes after; never cleared. Not covered: a thread already inside a
/// preparation when the first `pthread_cancel` of the process installs the handler, and
/// cancelled by it (not seen in 20 runs of a program whose first cancellation is of a thread
/// starting to read into memory that is out; docs/cli.md).
static CANCELLATION_IN_USE: AtomicBool = AtomicBool::new(false);

/// An `rt_sigaction` that installs a handler for SIGCANCEL (`a`: signal, new action), before
/// it is made: see [`CANCELLATION_IN_USE`]. One that ignores it (glibc's `posix_spawn` in its
/// child, which shares the parent's memory until it execs) is not an install. Inside a
/// preparation (`read` false) the action is not read, and taken for an install.
fn note_cancellation_handler(nr: c_long, a: &[u64; 6], read: bool) {
    if nr != libc::SYS_rt_sigaction || a[0] != SIGCANCEL || a[1] == 0 {
        return;
    }
    let handler = read.then(|| read_user::<u64>(&mut crate::pin::Pin::none(), a[1])).flatten();
    if handler.is_none_or(|h| h != libc::SIG_DFL as u64 && h != libc::SIG_IGN as u64) {
        CANCELLATION_IN_USE.store(true, Ordering::Release);
    }
}

/// At the rewrite: notes a SIGCANCEL handler installed before it (see
/// [`CANCELLATION_IN_USE`]).
pub(super) fn note_cancellation() {
    // Ignored is not installed: glibc's `posix_spawn` ignores SIGCANCEL in the child it
    // makes, and `uswap run` starts the program so.
    if super::sys::sys_signal_action(SIGCANCEL as usize).is_none_or(|act| super::sys::is_handled(&act)) {
        CANCELLATION_IN_USE.store(true, Ordering::Release);
    }
}

extern "C-unwind" {
    /// glibc's: may end the thread by unwinding, when it sets the asynchronous type with a
    /// cancellation pending.
    fn pthread_setcanceltype(kind: libc::c_int, old: *mut libc::c_int) -> libc::c_int;
    /// glibc's: may act on a pending cancellation when it enables cancellation with the
    /// asynchronous type (older versions do); [`CancelPutOff`] enables it with the type
    /// still deferred.
    fn pthread_setcancelstate(state: libc::c_int, old: *mut libc::c_int) -> libc::c_int;
}
const PTHREAD_CANCEL_DEFERRED: libc::c_int = 0;
const PTHREAD_CANCEL_ASYNCHRONOUS: libc::c_int = 1;
const PTHREAD_CANCEL_DISABLE: libc::c_int = 1;

/// The thread's cancellation put off while the slow path prepares memory, and given back
/// after. glibc makes it asynchronous around each call that is a cancellation point
/// (`read`, `write`, `recv`...), and the rewritten `syscall` of such a call runs this slow
/// path: a `pthread_cancel` then sends SIGCANCEL, whose handler unwinds the thread from
/// wherever it is. Inside the engine (a page brought in on the fault handlers' stack, with
/// a page busy or a lock held) that unwinding aborted the process (measured: 11 of 30 runs
/// of a program that cancels threads as they read into memory that is out). So the type
/// is made deferred (a SIGCANCEL already sent then does nothing) and cancellation disabled
/// (the engine's own cancellation points, a `nanosleep` under pressure, a file device's
/// `pread`, do not act either); [`CancelPutOff::leave`] enables it, then makes the type
/// asynchronous again if it was, which acts on a pending cancellation: the thread is
/// unwound from there, through the frames the call itself would be unwound through.
#[must_use]
struct CancelPutOff {
    was_asynchronous: bool,
    state: libc::c_int,
}

impl CancelPutOff {
    fn enter() -> CancelPutOff {
        let (mut kind, mut state) = (PTHREAD_CANCEL_DEFERRED, 0);
        // SAFETY: each sets this thread's cancellation type or state and reads the old one
        // into a local; neither acts on a cancellation when deferring or disabling. The
        // type first: a SIGCANCEL that comes between the two then finds it deferred.
        unsafe {
            pthread_setcanceltype(PTHREAD_CANCEL_DEFERRED, &mut kind);
            pthread_setcancelstate(PTHREAD_CANCEL_DISABLE, &mut state);
        }
        CancelPutOff { was_asynchronous: kind == PTHREAD_CANCEL_ASYNCHRONOUS, state }
    }

    /// Not a destructor: the thread may end inside it (see `crate::pin::Pin` on why the
    /// frames a cancellation unwinds hold none).
    fn leave(self) {
        let mut old = 0;
        // SAFETY: as in `enter`. The state first, with the type still deferred: that never
        // acts. Then the asynchronous type, if it was: with a cancellation pending, glibc
        // unwinds the thread from here, which holds nothing of the engine's.
        unsafe {
            pthread_setcancelstate(self.state, &mut old);
            if self.was_asynchronous {
                pthread_setcanceltype(PTHREAD_CANCEL_ASYNCHRONOUS, &mut old);
            }
        }
    }
}
