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
//! write is brought in first (`uswap::prepare_user_access`), as a fault in the thread itself
//! would. Only then is the call made. If it still fails with `EFAULT` while it touched
//! managed memory, the memory is made ready again and the call made again, a bounded number
//! of times (the last ones for the first page of the buffer only, where the call may do
//! less than asked: see [`shrunk`]), unless no page was taken out of any region since the
//! last preparation and that one found nothing out: then the `EFAULT` is not uswap's and
//! goes back as it is. An `EFAULT` after which pages had to be brought in, and that the
//! program finally sees, is counted (`syscall_efault`) and said once.
//!
//! Runs on the program's thread, maybe inside its signal handler: allocates nothing, takes
//! no lock. Structures the kernel follows (iovec arrays, `msghdr`, `argv`) are read with
//! `process_vm_readv` on the process itself unless they lie in managed memory, so that a
//! bad pointer is the kernel's `EFAULT`, not a crash here.

use std::arch::global_asm;
use std::cell::Cell;

use libc::c_long;

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
/// Bytes made ready behind a pointer argument under [`Rule::Generic`]: the structures such
/// calls take are smaller (`struct stat` is 144 bytes, a path at most 4096).
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

/// Makes system call `nr` with `args`, directly.
///
/// # Safety
/// The call is one the program made itself (what it does to memory is its contract), or
/// one that writes only memory the caller owns.
unsafe fn raw(nr: c_long, a: [u64; 6]) -> c_long {
    let ret: c_long;
    // SAFETY: the caller's contract; `syscall` changes only rax, rcx and r11.
    unsafe {
        std::arch::asm!(
            "syscall",
            inlateout("rax") nr => ret,
            in("rdi") a[0], in("rsi") a[1], in("rdx") a[2], in("r10") a[3], in("r8") a[4], in("r9") a[5],
            lateout("rcx") _, lateout("r11") _,
            options(nostack),
        );
    }
    ret
}

/// Reads a `T` at `addr` without trusting it: `None` where the kernel could not.
fn read_user<T: Copy>(addr: u64) -> Option<T> {
    if addr == 0 {
        return None;
    }
    let mut out = std::mem::MaybeUninit::<T>::uninit();
    let len = std::mem::size_of::<T>();
    if uswap::prepare_user_access(addr as usize, len, false).is_some() {
        // Managed, and now in place.
        // SAFETY: the range is a managed region's, mapped readable (just made ready);
        // read_unaligned makes no alignment assumption.
        return Some(unsafe { std::ptr::read_unaligned(addr as *const T) });
    }
    let local = libc::iovec { iov_base: out.as_mut_ptr().cast(), iov_len: len };
    let remote = libc::iovec { iov_base: addr as *mut libc::c_void, iov_len: len };
    // SAFETY: process_vm_readv on this process itself: the kernel copies `len` bytes into
    // `out` or fails; the iovecs are valid for the call.
    let pid = unsafe { libc::getpid() } as u64;
    // SAFETY: writes only `out`, ours, through `local`.
    let n = unsafe {
        raw(libc::SYS_process_vm_readv, [pid, &local as *const _ as u64, 1, &remote as *const _ as u64, 1, 0])
    };
    // SAFETY: the kernel wrote all `len` bytes when it says so.
    (n == len as c_long).then(|| unsafe { out.assume_init() })
}

/// Makes `[ptr, ptr + len)` ready.
fn ready(ptr: u64, len: u64, write: bool) -> Prepared {
    // Below the lowest address a mapping may have (`vm.mmap_min_addr`), or past the user
    // half: not a pointer to memory of the program's (a descriptor, a length, a flag).
    const LOWEST: u64 = 1 << 16;
    const USER_END: u64 = 1 << 47;
    if !(LOWEST..USER_END).contains(&ptr) || len == 0 {
        return Prepared::default();
    }
    match uswap::prepare_user_access(ptr as usize, len as usize, write) {
        Some(nr_brought_in) => Prepared { managed: true, nr_brought_in },
        None => Prepared::default(),
    }
}

/// Makes the buffers of `cnt` iovecs at `iov` ready.
fn ready_iov(iov: u64, cnt: u64, write: bool) -> Prepared {
    let mut managed = Prepared::default();
    for i in 0..cnt.min(MAX_VECS as u64) {
        let Some(v) = read_user::<libc::iovec>(iov + i * std::mem::size_of::<libc::iovec>() as u64) else { break };
        managed = managed | ready(v.iov_base as u64, v.iov_len as u64, write);
    }
    managed
}

/// Makes what a `msghdr` at `msg` names ready: address, buffers, control data.
fn ready_msg(msg: u64, write: bool) -> Prepared {
    let Some(m) = read_user::<libc::msghdr>(msg) else { return Prepared::default() };
    let managed = ready(m.msg_name as u64, m.msg_namelen as u64, write)
        | ready_iov(m.msg_iov as u64, m.msg_iovlen as u64, write)
        | ready(m.msg_control as u64, m.msg_controllen as u64, write);
    // The kernel writes back the lengths (recvmsg) into the header itself.
    managed | ready(msg, std::mem::size_of::<libc::msghdr>() as u64, write)
}

/// Makes a NUL-terminated array of strings at `arr` ready (for `execve`).
fn ready_strings(arr: u64) -> Prepared {
    let mut managed = Prepared::default();
    for i in 0..(1u64 << 16) {
        let Some(p) = read_user::<u64>(arr + 8 * i) else { break };
        if p == 0 {
            break;
        }
        managed = managed | ready(p, GENERIC_BYTES, false);
    }
    managed
}

/// Makes the memory of a call ready by its rule.
fn prepare(r: Rule, a: &[u64; 6]) -> Prepared {
    let arg = |i: u8| a[i as usize];
    match r {
        Rule::Plain => Prepared::default(),
        Rule::Buf { ptr, len, scale, write } => ready(arg(ptr), arg(len).saturating_mul(scale as u64), write),
        Rule::Iov { iov, cnt, write } => ready_iov(arg(iov), arg(cnt), write),
        Rule::Msg { msg, write } => ready_msg(arg(msg), write),
        Rule::MMsg { vec, cnt, write } => {
            let size = std::mem::size_of::<libc::mmsghdr>() as u64;
            let mut managed = Prepared::default();
            for i in 0..arg(cnt).min(MAX_VECS as u64) {
                managed = managed | ready_msg(arg(vec) + i * size, write);
            }
            managed
        }
        Rule::Exec { path, argv, envp } => {
            ready(arg(path), GENERIC_BYTES, false) | ready_strings(arg(argv)) | ready_strings(arg(envp))
        }
        Rule::Generic => a.iter().fold(Prepared::default(), |m, &p| m | ready(p, GENERIC_BYTES, true)),
    }
}

/// The slow path (see the module's comment).
extern "C" fn slow(regs: &SavedRegs) -> c_long {
    let nr = regs.nr as c_long;
    let a = [regs.rdi, regs.rsi, regs.rdx, regs.r10, regs.r8, regs.r9];
    if DEPTH.get() > 0 || uswap::is_engine_thread() || uswap::sigbus::in_handler() {
        // SAFETY: the program's own call.
        return unsafe { raw(nr, a) };
    }
    let r = rule(nr);
    let mut seq = uswap::stats::taken_out_seq();
    let first = prepare_once(r, &a);
    if first.managed {
        uswap::stats::note_syscall(uswap::stats::SyscallEvent::Prepared);
    }
    // SAFETY: the program's own call.
    let mut ret = unsafe { raw(nr, a) };
    let efault = -(libc::EFAULT as c_long);
    if !first.managed {
        return ret;
    }
    // Bounded: EFAULT_RETRIES more calls at most. If nothing was taken out since the last
    // preparation and nothing is out now, the EFAULT is not uswap's (a bad pointer of the
    // program's, or an argument the call does not use that happens to point into managed
    // memory): it goes back as it is.
    let mut ours = false;
    let mut a = a;
    for retry in 0..EFAULT_RETRIES {
        if ret != efault {
            return ret;
        }
        if retry == SHRINK_FROM_RETRY {
            a = shrunk(nr, a);
        }
        let seq_now = uswap::stats::taken_out_seq();
        let again = prepare_once(r, &a);
        if again.nr_brought_in == 0 && seq_now == seq {
            return ret;
        }
        ours |= again.nr_brought_in > 0;
        seq = seq_now;
        uswap::stats::note_syscall(uswap::stats::SyscallEvent::EfaultRetried);
        // SAFETY: the program's own call, made again.
        ret = unsafe { raw(nr, a) };
    }
    if ret == efault && ours {
        uswap::stats::note_syscall(uswap::stats::SyscallEvent::Efault);
        say_efault_once(nr, &a);
    }
    ret
}

/// `a` with the buffer of a call that may return less than asked cut to the rest of its
/// first page (at least 512 bytes, for one directory entry): `getdents`, `getdents64`
/// (fewer entries), `pread64` and `read` of a regular file (a short read). Any other call
/// is left whole: a datagram cut short would be lost.
fn shrunk(nr: c_long, mut a: [u64; 6]) -> [u64; 6] {
    let page = uswap::PAGE_SIZE as u64;
    let first_page = |ptr: u64, len: u64| len.min((page - ptr % page).max(512));
    match nr {
        libc::SYS_getdents | libc::SYS_getdents64 | libc::SYS_pread64 => a[2] = first_page(a[1], a[2]),
        libc::SYS_read if is_regular_file(a[0]) => a[2] = first_page(a[1], a[2]),
        _ => {}
    }
    a
}

/// Whether descriptor `fd` is a regular file.
fn is_regular_file(fd: u64) -> bool {
    let mut st = std::mem::MaybeUninit::<libc::stat>::uninit();
    // SAFETY: fstat writes one `struct stat` into `st`, ours.
    let r = unsafe { raw(libc::SYS_fstat, [fd, st.as_mut_ptr() as u64, 0, 0, 0, 0]) };
    // SAFETY: the kernel filled it when it returned 0.
    r == 0 && unsafe { st.assume_init() }.st_mode & libc::S_IFMT == libc::S_IFREG
}

/// Says on stderr, once per process, which call's `EFAULT` on managed memory reached the
/// program. Allocation-free.
fn say_efault_once(nr: c_long, a: &[u64; 6]) {
    use std::sync::atomic::{AtomicBool, Ordering};
    static SAID: AtomicBool = AtomicBool::new(false);
    if SAID.swap(true, Ordering::Relaxed) {
        return;
    }
    let mut line = uswap::sigbus::StderrLine::default();
    line.put(b"uswap: system call ").put_number(nr as u64, 10, 1).put(
        b" failed with EFAULT on managed memory after every retry (signal mode; counted in syscall_efault), arguments",
    );
    for &v in a {
        line.put(b" 0x").put_number(v, 16, 1);
    }
    line.put(b"\n").write();
}

/// [`prepare`], with this thread's own system calls meanwhile (the engine's, serving the
/// faults) sent straight to the kernel. The call itself is made outside: a signal handler
/// that runs while it blocks has its calls prepared as usual.
fn prepare_once(r: Rule, a: &[u64; 6]) -> Prepared {
    DEPTH.set(DEPTH.get() + 1);
    let managed = prepare(r, a);
    DEPTH.set(DEPTH.get() - 1);
    managed
}
