//! What memory a system call touches, by its rule (`super::table::Rule`), and making it
//! ready: every byte of managed memory the kernel will read or write is brought in
//! (`crate::user_access::prepare_user_access`) and pinned in the caller's `crate::pin::Pin`,
//! in the order the kernel touches it (a buffer's first pages first), and no more than the
//! kernel can touch (a length it refuses, a pipe's capacity, a socket's queue, an `mlock`
//! over a hole: nothing brought in for a call that fails or stops at once).
//!
//! Runs on the program's thread inside the slow path (`super::entry`), which calls it with
//! the thread's own system calls sent straight to the kernel: allocates nothing, takes no
//! lock. Structures the kernel follows (iovec arrays, `msghdr`, `argv`) are read with
//! `process_vm_readv` on the process itself unless they lie in managed memory
//! (`super::raw::read_user`), so that a bad pointer is the kernel's `EFAULT`, not a crash.

use libc::c_long;

use super::raw::{fd_flags, iov_at, is_stream_socket, pipe_capacity_bytes, queued_bytes, raw, read_user};
use super::table::Rule;

/// Bytes made ready behind a pointer argument under [`Rule::Generic`] and [`Rule::Ptrs`]:
/// the structures such calls take are smaller (`struct stat` is 144 bytes, a path at most
/// 4096).
const GENERIC_BYTES: u64 = 4096;
/// The most iovecs (or messages) whose buffers are made ready one by one; beyond it, the
/// rest are left to the retry (the kernel's own `UIO_MAXIOV` is 1024).
const MAX_VECS: usize = 1024;

/// What making a call's memory ready found.
#[derive(Debug, Default, Clone, Copy)]
pub(super) struct Prepared {
    /// Some of the memory is managed in signal mode.
    pub managed: bool,
    /// Pages that were out and had to be brought in.
    pub nr_brought_in: usize,
}

impl std::ops::BitOr for Prepared {
    type Output = Prepared;
    fn bitor(self, o: Prepared) -> Prepared {
        Prepared { managed: self.managed | o.managed, nr_brought_in: self.nr_brought_in + o.nr_brought_in }
    }
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
pub(super) fn prepare(pin: &mut crate::pin::Pin, nr: c_long, r: Rule, a: &[u64; 6]) -> Prepared {
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
