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
//! write is brought in first (`crate::user_access::prepare_user_access`), as a fault in the thread itself
//! would, and pinned (`crate::pin::Pin`, up to `crate::pin::MAX_PIN_BYTES` a call, a buffer's first
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
//! inside the engine. Structures the kernel follows (iovec arrays, `msghdr`, `argv`) are read with
//! `process_vm_readv` on the process itself unless they lie in managed memory, so that a
//! bad pointer is the kernel's `EFAULT`, not a crash here.

use std::arch::global_asm;
use std::cell::Cell;
use std::sync::atomic::{AtomicBool, Ordering};

use libc::c_long;

use super::complete::{self, Iovs, Transfer};
use super::raw::{fd_flags, iov_at, is_stream_socket, pipe_capacity_bytes, queued_bytes, raw, read_user};
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

/// Times a call is made again after an `EFAULT` on managed memory.
const EFAULT_RETRIES: usize = 8;
/// From this retry on, a call that may legally do less than asked (see [`shrunk`]) is made
/// for the first page of its buffer only: under a limit so tight that reclaim takes the
/// buffer's pages out again while the rest are brought in, the whole buffer is never in at
/// once (the kernel, faulting page by page as it copies, never needs it to be).
const SHRINK_FROM_RETRY: usize = 4;
/// Bytes made ready behind a pointer argument under [`Rule::Generic`] and [`Rule::Ptrs`]:
/// the structures such calls take are smaller (`struct stat` is 144 bytes, a path at most
/// 4096).
const GENERIC_BYTES: u64 = 4096;
/// The most iovecs (or messages) whose buffers are made ready one by one; beyond it, the
/// rest are left to the retry (the kernel's own `UIO_MAXIOV` is 1024).
const MAX_VECS: usize = 1024;

/// What making a call's memory ready found.
#[derive(Debug, Default, Clone, Copy)]
struct Prepared {
    /// Some of the memory is managed in signal mode.
    managed: bool,
    /// Pages that were out and had to be brought in.
    nr_brought_in: usize,
}

impl std::ops::BitOr for Prepared {
    type Output = Prepared;
    fn bitor(self, o: Prepared) -> Prepared {
        Prepared { managed: self.managed | o.managed, nr_brought_in: self.nr_brought_in + o.nr_brought_in }
    }
}

thread_local! {
    /// Depth of slow paths on this thread: system calls made while one prepares memory (the
    /// engine's own, serving a fault) go straight to the kernel. Const-initialised: safe in
    /// a signal handler.
    static DEPTH: Cell<u32> = const { Cell::new(0) };
}

/// Makes `[ptr, ptr + len)` ready.
fn ready(pin: &mut crate::pin::Pin, ptr: u64, len: u64, write: bool) -> Prepared {
    // Below the lowest address a mapping may have (`vm.mmap_min_addr`), or past the user
    // half: not a pointer to memory of the program's (a descriptor, a length, a flag).
    const LOWEST: u64 = 1 << 16;
    const USER_END: u64 = 1 << 47;
    if !(LOWEST..USER_END).contains(&ptr) || len == 0 {
        return Prepared::default();
    }
    // In order, so that the pin (at most `crate::pin::MAX_PIN_BYTES`) holds the first pages: the
    // kernel starts there (an `epoll_wait` or a short `read` never goes further, and a
    // transfer too large to pin whole goes on in windows, see `super::complete`).
    match crate::user_access::prepare_user_access(pin, ptr as usize, len as usize, write) {
        Some(nr_brought_in) => Prepared { managed: true, nr_brought_in },
        None => Prepared::default(),
    }
}

/// Makes `cnt` iovecs at `iov` ready, and their buffers.
fn ready_iov(pin: &mut crate::pin::Pin, iov: u64, cnt: u64, write: bool) -> Prepared {
    ready_iov_up_to(pin, iov, cnt, write, u64::MAX)
}

/// [`ready_iov`] for the first `max_bytes` of the buffers only (what the call can move).
fn ready_iov_up_to(pin: &mut crate::pin::Pin, iov: u64, cnt: u64, write: bool, max_bytes: u64) -> Prepared {
    let vec_bytes = std::mem::size_of::<libc::iovec>() as u64;
    // The array itself: the kernel reads it first.
    let mut managed = ready(pin, iov, cnt.min(MAX_VECS as u64) * vec_bytes, false);
    let mut left_bytes = max_bytes;
    for i in 0..cnt.min(MAX_VECS as u64) {
        let Some(v) = iov_at(pin, iov, i) else { break };
        let len = (v.iov_len as u64).min(left_bytes);
        managed = managed | ready(pin, v.iov_base as u64, len, write);
        left_bytes -= len;
    }
    managed
}

/// The bytes `cnt` iovecs at `iov` name (what `process_vm_readv` can move at most).
fn iov_total_bytes(pin: &mut crate::pin::Pin, iov: u64, cnt: u64) -> u64 {
    (0..cnt.min(MAX_VECS as u64))
        .map_while(|i| iov_at(pin, iov, i))
        .fold(0u64, |sum, v| sum.saturating_add(v.iov_len as u64))
}

/// Makes what a `msghdr` at `msg` names ready: address, buffers, control data.
fn ready_msg(pin: &mut crate::pin::Pin, msg: u64, write: bool) -> Prepared {
    let Some(m) = read_user::<libc::msghdr>(pin, msg) else { return Prepared::default() };
    let managed = ready(pin, m.msg_name as u64, m.msg_namelen as u64, write)
        | ready_iov(pin, m.msg_iov as u64, m.msg_iovlen as u64, write)
        | ready(pin, m.msg_control as u64, m.msg_controllen as u64, write);
    // The kernel writes back the lengths (recvmsg) into the header itself.
    managed | ready(pin, msg, std::mem::size_of::<libc::msghdr>() as u64, write)
}

/// Makes a NUL-terminated array of strings at `arr` ready (for `execve`): the strings, then
/// the array itself (the kernel reads it as it copies them).
fn ready_strings(pin: &mut crate::pin::Pin, arr: u64) -> Prepared {
    let mut managed = Prepared::default();
    let mut nr = 0;
    while nr < (1u64 << 16) {
        let Some(p) = read_user::<u64>(pin, arr + 8 * nr) else { break };
        nr += 1;
        if p == 0 {
            break;
        }
        managed = managed | ready(pin, p, GENERIC_BYTES, false);
    }
    managed | ready(pin, arr, 8 * nr, false)
}

/// Whether `pid` names this process: its pid, or one of its threads' ids (which name the
/// same memory to `process_vm_readv`). System calls only: allocation-free, lock-free.
pub fn is_this_process(pid: i32) -> bool {
    // SAFETY: getpid takes no arguments and touches no memory.
    let own_pid = unsafe { raw(libc::SYS_getpid, [0; 6]) };
    let target = pid as c_long;
    // SAFETY: tgkill with signal 0 sends nothing and touches no memory: it succeeds when
    // `target` is a thread of this process.
    target > 0
        && (target == own_pid || unsafe { raw(libc::SYS_tgkill, [own_pid as u64, target as u64, 0, 0, 0, 0]) } == 0)
}

/// `process_vm_readv` (`write`) or `process_vm_writev` with arguments `a`: the caller's
/// buffers and the remote vector; on this process itself (its pid or one of its threads'
/// ids: a careful `memcpy`) the remote buffers too, read by `readv` and written by
/// `writev`. Each side only as far as the other's total, which is what the call can move; on
/// itself, each side only as far as half a pin, so that both are pinned whole: readied
/// whole, a 16 MiB copy under a 16 MiB limit had its first pages taken out again while the
/// rest came in, and failed with `EFAULT`, nothing copied (and 6 MiB ones now and then),
/// where a call now moves at least that much and may come back short (the program calls
/// again for the rest, as for any short count).
fn ready_process_vm(pin: &mut crate::pin::Pin, a: &[u64; 6], write: bool) -> Prepared {
    let is_self = is_this_process(a[0] as i32);
    let movable_bytes = iov_total_bytes(pin, a[1], a[2]).min(iov_total_bytes(pin, a[3], a[4]));
    if is_self {
        let movable_bytes = movable_bytes.min(crate::pin::MAX_PIN_BYTES as u64 / 2);
        let local = ready_iov_up_to(pin, a[1], a[2], write, movable_bytes);
        return local | ready_iov_up_to(pin, a[3], a[4], !write, movable_bytes);
    }
    let local = ready_iov_up_to(pin, a[1], a[2], write, movable_bytes);
    let remote_vec_bytes = a[4].min(MAX_VECS as u64) * std::mem::size_of::<libc::iovec>() as u64;
    local | ready(pin, a[3], remote_vec_bytes, false)
}

/// The most bytes of a [`Rule::Buf`] call's buffer the kernel can touch, for the length
/// argument `len` as the program passed it (in units of `scale` bytes): nothing where the
/// kernel refuses the length before it touches memory, at most a page where it writes a
/// path, else all of it. Readied as given, `epoll_wait(fd, events, INT_MIN, ...)` (stress-ng's
/// epoll stressor, to see `EINVAL`) read as 2^31 events brought in and charged 24 GiB of
/// the heap behind `events`, page by page, for a call that fails at once.
fn buf_bytes(nr: c_long, len: u64, scale: u16) -> u64 {
    let page = crate::PAGE_SIZE as u64;
    // An `int` argument: the kernel reads the low 32 bits, signed.
    let as_int = len as u32 as i32;
    match nr {
        // fs/eventpoll.c: `maxevents <= 0 || maxevents > EP_MAX_EVENTS` is `EINVAL`.
        libc::SYS_epoll_wait | libc::SYS_epoll_pwait | libc::SYS_epoll_pwait2 => {
            let max_events = i32::MAX as u64 / scale as u64;
            match u64::try_from(as_int) {
                Ok(n) if n > 0 && n <= max_events => n * scale as u64,
                _ => 0,
            }
        }
        // A `bufsiz <= 0` is `EINVAL`; a link or a path is at most a page (`PATH_MAX`).
        libc::SYS_readlink | libc::SYS_readlinkat => u64::try_from(as_int).unwrap_or(0).min(page),
        libc::SYS_getcwd => len.min(page),
        // fs/select.c: `unsigned int nfds`; more than `RLIMIT_NOFILE` is `EINVAL`.
        libc::SYS_poll | libc::SYS_ppoll => {
            let nr_fds = len as u32 as u64;
            if nr_fds > 1024 && nr_fds > open_files_limit() {
                0
            } else {
                nr_fds * scale as u64
            }
        }
        _ => len.saturating_mul(scale as u64),
    }
}

/// The most bytes of a `read`, `recvfrom` or `mlock` of `len` bytes worth readying
/// (`u64::MAX`: as many as asked), so that what the kernel will not touch stays untouched
/// (for `mlock`, nothing over a range with a hole: `lock_populates_bytes`):
/// - from a pipe or FIFO, its capacity (`F_GETPIPE_SZ`: 64 KiB, or 8 KiB past the user's
///   soft limit of pipe pages, unless the program set it), or what it holds now if that is
///   more (a buffer spliced in from a socket can be larger than a page): the kernel then
///   stops at the first page not readied, with a short count, or with `EFAULT` before its
///   first byte, after which the retry asks again;
/// - from a stream socket (without `MSG_WAITALL`), what it holds now, at least 64 KiB. More
///   can arrive while the call waits: the kernel then stops at the first page not readied
///   and returns what it copied, a short count that a stream may always give; the rest
///   stays queued for the next call.
///
/// Readied whole, `dd bs=256M` reading a pipe brought in and charged its whole buffer for
/// every 64 KiB read (a 100 MiB copy under a 64 MiB limit ran past 5 minutes, 0.05 s
/// without uswap), and CPython's `sock.recv(1 << 26)` 64 MiB for each message (50 messages
/// of 1 KB: 4.4 s, 1 ms without uswap). A datagram is taken whole or dropped: readied as
/// asked. The kernel is asked only for calls longer than 64 KiB. (A `readv` is readied whole:
/// its length is known only from its vectors.)
fn readable_bytes(nr: c_long, a: &[u64; 6], len: u64) -> u64 {
    const SMALL_BYTES: u64 = 64 << 10;
    let waits_for_all = match nr {
        libc::SYS_read => false,
        libc::SYS_recvfrom => a[3] & libc::MSG_WAITALL as u64 != 0,
        libc::SYS_mlock | libc::SYS_mlock2 => return lock_populates_bytes(a[0], len),
        _ => return u64::MAX,
    };
    if len <= SMALL_BYTES {
        return u64::MAX;
    }
    if let Some(capacity_bytes) = pipe_capacity_bytes(a[0]) {
        return capacity_bytes.max(queued_bytes(a[0]));
    }
    if !waits_for_all && is_stream_socket(a[0]) {
        return queued_bytes(a[0]).max(SMALL_BYTES);
    }
    u64::MAX
}

/// What an `mlock` of `len` bytes at `start` brings in: all of it, or nothing where the
/// range is not mapped whole. The kernel locks the mappings from `start` up to the first
/// hole and fails with `ENOMEM` there, populating nothing (`apply_vma_lock_flags`, then
/// `do_mlock` returns before `__mm_populate`). Readied as given, `mlock(p, 1 << 62)`
/// brought every managed page above `p` in, the heap's untouched reservation included (2.5
/// GiB in 60 s, and on). `msync(MS_ASYNC)`, which changes nothing, answers `ENOMEM` for a
/// range with a hole.
fn lock_populates_bytes(start: u64, len: u64) -> u64 {
    let page = crate::PAGE_SIZE as u64;
    let offset = start % page;
    let Some(len_aligned) = len.checked_add(offset).and_then(|l| l.checked_next_multiple_of(page)) else {
        return 0;
    };
    // SAFETY: msync with MS_ASYNC writes nothing and changes no mapping; the kernel checks
    // the range.
    let ret = unsafe { raw(libc::SYS_msync, [start - offset, len_aligned, libc::MS_ASYNC as u64, 0, 0, 0]) };
    if ret == -(libc::ENOMEM as c_long) {
        0
    } else {
        len
    }
}

/// The process's `RLIMIT_NOFILE` (its soft limit), or no bound if it cannot be read.
fn open_files_limit() -> u64 {
    let mut limit = libc::rlimit { rlim_cur: libc::RLIM_INFINITY, rlim_max: libc::RLIM_INFINITY };
    // SAFETY: `prlimit64` of this process, reading only: it writes `limit`, on this stack.
    let ret = unsafe {
        raw(libc::SYS_prlimit64, [0, libc::RLIMIT_NOFILE as u64, 0, std::ptr::addr_of_mut!(limit) as u64, 0, 0])
    };
    if ret == 0 {
        limit.rlim_cur
    } else {
        u64::MAX
    }
}

/// Makes the memory of call `nr` ready by its rule `r`.
fn prepare(pin: &mut crate::pin::Pin, nr: c_long, r: Rule, a: &[u64; 6]) -> Prepared {
    let arg = |i: u8| a[i as usize];
    match r {
        Rule::Plain => Prepared::default(),
        Rule::Buf { ptr, len, scale, write } => {
            let len_bytes = buf_bytes(nr, arg(len), scale).min(readable_bytes(nr, a, arg(len)));
            ready(pin, arg(ptr), len_bytes, write)
        }
        Rule::PageVector { vec, len } => ready(pin, arg(vec), arg(len).div_ceil(crate::PAGE_SIZE as u64), true),
        Rule::Iov { iov, cnt, write } => ready_iov(pin, arg(iov), arg(cnt), write),
        Rule::Datagram { write } => {
            // The address's length is not known before the call: as much as `Generic` takes.
            let addr = ready(pin, arg(4), GENERIC_BYTES, write);
            let addr_len = if write { ready(pin, arg(5), 4, true) } else { Prepared::default() };
            let data_bytes = if write { arg(2).min(readable_bytes(nr, a, arg(2))) } else { arg(2) };
            ready(pin, arg(1), data_bytes, write) | addr | addr_len
        }
        Rule::Msg { msg, write } => ready_msg(pin, arg(msg), write),
        Rule::ProcessVm { write } => ready_process_vm(pin, a, write),
        Rule::MMsg { vec, cnt, write } => {
            let size = std::mem::size_of::<libc::mmsghdr>() as u64;
            let mut managed = Prepared::default();
            for i in 0..arg(cnt).min(MAX_VECS as u64) {
                // The header, and after it the length the kernel writes back (`msg_len`).
                let at = arg(vec) + i * size;
                managed = managed | ready_msg(pin, at, write) | ready(pin, at, size, write);
            }
            managed
        }
        Rule::SysvMsg { write } => ready(pin, arg(1), 8 + arg(2).min(MAX_MESSAGE_BYTES), write),
        Rule::PosixMsg { write } => {
            let prio = if write { ready(pin, arg(3), 4, true) } else { Prepared::default() };
            ready(pin, arg(1), arg(2).min(MAX_MESSAGE_BYTES), write) | prio | ready(pin, arg(4), 16, false)
        }
        Rule::Vmsplice => ready_iov(pin, arg(1), arg(2), is_read_end(arg(0))),
        Rule::FutexWaitv => ready_futex_waitv(pin, arg(0), arg(1)) | ready(pin, arg(3), 16, false),
        Rule::Exec { path, argv, envp } => {
            ready(pin, arg(path), GENERIC_BYTES, false) | ready_strings(pin, arg(argv)) | ready_strings(pin, arg(envp))
        }
        Rule::Ptrs { ptrs } => ready_pointers(pin, a, ptrs),
        Rule::Generic => ready_pointers(pin, a, ALL_ARGUMENTS),
    }
}

/// The most bytes of a message queue's message readied: the kernel's largest (`mqueue`'s
/// `HARD_MSGSIZEMAX`; System V's `msgmax` is 8 KiB unless raised), so that a buffer size
/// given far larger than any message brings in no more than one could fill.
const MAX_MESSAGE_BYTES: u64 = 16 << 20;

/// Whether descriptor `fd` is open for reading only (a pipe's read end, for `vmsplice`,
/// which then writes the caller's buffers).
fn is_read_end(fd: u64) -> bool {
    fd_flags(fd).is_some_and(|flags| flags & libc::O_ACCMODE as c_long == libc::O_RDONLY as c_long)
}

/// Makes ready the `cnt` `struct futex_waitv`s at `waiters` (`u64 val, u64 uaddr, u32
/// flags, u32 reserved`) and the futex word each names, which the kernel reads.
fn ready_futex_waitv(pin: &mut crate::pin::Pin, waiters: u64, cnt: u64) -> Prepared {
    // The kernel's `FUTEX_WAITV_MAX`; more is `EINVAL` before it reads anything.
    const FUTEX_WAITV_MAX: u64 = 128;
    const WAITER_BYTES: u64 = 24;
    if cnt > FUTEX_WAITV_MAX {
        return Prepared::default();
    }
    let mut managed = ready(pin, waiters, cnt * WAITER_BYTES, false);
    for i in 0..cnt {
        let Some([_val, uaddr, _flags]) = read_user::<[u64; 3]>(pin, waiters + i * WAITER_BYTES) else { break };
        managed = managed | ready(pin, uaddr, 4, false);
    }
    managed
}

/// Every argument register, as [`Rule::Generic`] takes them.
const ALL_ARGUMENTS: u8 = 0b11_1111;

/// Makes ready the [`GENERIC_BYTES`] behind each argument of bit mask `ptrs` (bit `i`:
/// argument `i`) that points into managed memory.
fn ready_pointers(pin: &mut crate::pin::Pin, a: &[u64; 6], ptrs: u8) -> Prepared {
    (0..a.len())
        .filter(|&i| ptrs & (1 << i) != 0)
        .fold(Prepared::default(), |m, i| m | ready(pin, a[i], GENERIC_BYTES, true))
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
        None => make_prepared(nr, r, a, if transfer { 1 } else { EFAULT_RETRIES }),
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
        None if made.ret == efault => make_prepared(nr, r, a, EFAULT_RETRIES),
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
    /// A short count may be uswap's doing: pages were taken out while it ran.
    maybe_cut: bool,
    /// Its `EFAULT` is uswap's: pages had to be brought in again for a retry.
    ours: bool,
}

/// Makes the call with its memory made ready first, and again, up to `retries` times,
/// after an `EFAULT` of uswap's.
fn make_prepared(nr: c_long, r: Rule, a: [u64; 6], retries: usize) -> Made {
    // Pinned until the call (and its retries) returned: see `crate::pin::Pin`. A futex reads its
    // word as the wait begins, then may sleep for good: not pinned (it is made again if the
    // word went out meanwhile).
    // An `execve` that succeeds does not return: its pin is known by the kernel's thread id.
    let mut pin = match nr {
        libc::SYS_futex | libc::SYS_futex_waitv => crate::pin::Pin::none(),
        libc::SYS_execve | libc::SYS_execveat => crate::pin::Pin::for_exec(),
        _ => crate::pin::Pin::new(),
    };
    let made = make_pinned(&mut pin, nr, r, a, retries);
    pin.release();
    made
}

/// [`make_prepared`]'s work, its memory pinned in `pin`.
fn make_pinned(pin: &mut crate::pin::Pin, nr: c_long, r: Rule, a: [u64; 6], retries: usize) -> Made {
    let mut seq = crate::stats::taken_out_seq();
    let first = prepare_once(pin, nr, r, &a);
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
        let again = prepare_once(pin, nr, r, &a);
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
    made.maybe_cut = crate::stats::taken_out_seq() != seq;
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
        } else if last.ret == efault && last.ours && window_bytes > page {
            if !*splittable.get_or_insert_with(|| t.splittable(a[0])) {
                return make_prepared(nr, r, *a, EFAULT_RETRIES);
            }
            window_bytes = (window_bytes / 2).max(page);
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
        last = make_prepared(nr, r, args, if window_bytes <= page { EFAULT_RETRIES } else { 1 });
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
            // `int maxevents`: only a valid count gets here (see `buf_bytes`).
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
fn prepare_once(pin: &mut crate::pin::Pin, nr: c_long, r: Rule, a: &[u64; 6]) -> Prepared {
    if matches!(r, Rule::Plain) {
        return Prepared::default();
    }
    guarded(|| prepare(pin, nr, r, a))
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
