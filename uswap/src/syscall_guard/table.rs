//! Which memory each system call makes the kernel read or write, for [`super::entry`].
//!
//! The class table is indexed by the low 16 bits of the call's number (the dispatch reads
//! it without touching the flags, see `patch`): 0 means the call takes no memory the kernel
//! reads or writes through a pointer and goes straight to the kernel. Every other call goes
//! to the slow path, which looks its rule up here. A call with no rule of its own is
//! [`Rule::Generic`]: each argument that points into managed memory gets the 4096 bytes
//! behind it made ready for writing, which covers the structures such calls take (`stat`,
//! `timespec`, a path, a futex word).

use libc::c_long;

/// How a system call's arguments name the memory it touches.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Rule {
    /// No memory through pointers: straight to the kernel.
    Plain,
    /// Argument `ptr` points to `len` bytes (argument `len` times `scale`), which the kernel
    /// writes (`write`) or reads.
    Buf { ptr: u8, len: u8, scale: u16, write: bool },
    /// `mincore`: argument `vec` points to a byte for each page of the range of argument
    /// `len` bytes, which the kernel writes.
    PageVector { vec: u8, len: u8 },
    /// Argument `iov` is an array of argument `cnt` `struct iovec`s.
    Iov { iov: u8, cnt: u8, write: bool },
    /// `recvfrom` (`write`) or `sendto`: argument 1 points to argument 2 bytes of data,
    /// argument 4 to the peer's address (written by `recvfrom`, with its length at the
    /// `socklen_t` argument 5 points to).
    Datagram { write: bool },
    /// Argument `msg` is a `struct msghdr`.
    Msg { msg: u8, write: bool },
    /// Argument `vec` is an array of argument `cnt` `struct mmsghdr`s.
    MMsg { vec: u8, cnt: u8, write: bool },
    /// `process_vm_readv` (`write`: the kernel writes the caller's buffers) or
    /// `process_vm_writev`: the local iovecs (arguments 1 and 2) and their buffers, and the
    /// remote iovecs' array (arguments 3 and 4), which lies in the caller's memory; the
    /// remote buffers too when the process named (argument 0) is the caller itself, not
    /// when they are another process's.
    ProcessVm { write: bool },
    /// `msgrcv` (`write`) or `msgsnd`: argument 1 points to a `long` type and argument 2
    /// bytes of text.
    SysvMsg { write: bool },
    /// `mq_timedreceive` (`write`, and the priority it writes at argument 3) or
    /// `mq_timedsend`: argument 1 points to argument 2 bytes; argument 4 to a `timespec`.
    PosixMsg { write: bool },
    /// `vmsplice`: argument 1 is an array of argument 2 `struct iovec`s, which the kernel
    /// reads into a pipe, or, given the pipe's read end, writes from it.
    Vmsplice,
    /// `futex_waitv`: argument 0 is an array of argument 1 `struct futex_waitv`s, each naming
    /// a futex word the kernel reads; argument 3 points to a `timespec`.
    FutexWaitv,
    /// `execve`-like: arguments `argv` and `envp` are NULL-terminated arrays of strings.
    Exec { path: u8, argv: u8, envp: u8 },
    /// The arguments of bit mask `ptrs` (bit `i`: argument `i`) point to structures (a path,
    /// a `struct stat`, a `timespec`, a socket address), each made ready as
    /// [`Rule::Generic`] makes an argument ready. The call's other arguments are not
    /// pointers, and the registers past its own arguments hold whatever the caller left
    /// there: under `Generic` such a value that happened to point into managed memory had a
    /// page made ready for nothing, one inside a `PROT_NONE` part of a region included,
    /// where no move could take it out again (`openat`'s two unused registers, which held a
    /// pointer the program had just computed).
    Ptrs { ptrs: u8 },
    /// Every argument that points into managed memory: see the module's comment.
    Generic,
}

const fn ptrs(ptrs: u8) -> Rule {
    Rule::Ptrs { ptrs }
}

const fn buf(ptr: u8, len: u8, write: bool) -> Rule {
    Rule::Buf { ptr, len, scale: 1, write }
}

/// The rule for system call `nr`.
pub fn rule(nr: c_long) -> Rule {
    match nr {
        libc::SYS_recvfrom => Rule::Datagram { write: true },
        libc::SYS_sendto => Rule::Datagram { write: false },
        libc::SYS_read | libc::SYS_pread64 | libc::SYS_getdents64 | libc::SYS_getdents | libc::SYS_readlink => {
            buf(1, 2, true)
        }
        libc::SYS_write | libc::SYS_pwrite64 => buf(1, 2, false),
        libc::SYS_readlinkat => buf(2, 3, true),
        libc::SYS_getrandom | libc::SYS_getcwd => buf(0, 1, true),
        libc::SYS_epoll_wait | libc::SYS_epoll_pwait | libc::SYS_epoll_pwait2 => {
            Rule::Buf { ptr: 1, len: 2, scale: 12, write: true }
        }
        libc::SYS_poll | libc::SYS_ppoll => Rule::Buf { ptr: 0, len: 1, scale: 8, write: true },
        libc::SYS_readv | libc::SYS_preadv | libc::SYS_preadv2 => Rule::Iov { iov: 1, cnt: 2, write: true },
        libc::SYS_writev | libc::SYS_pwritev | libc::SYS_pwritev2 => Rule::Iov { iov: 1, cnt: 2, write: false },
        libc::SYS_vmsplice => Rule::Vmsplice,
        // A message is taken off its queue before it is copied out: a copy that fails loses
        // it (ipc/msg.c, ipc/mqueue.c). Its whole buffer must be in first; readied as
        // `Generic`, a message past the first page was lost.
        libc::SYS_msgrcv => Rule::SysvMsg { write: true },
        libc::SYS_msgsnd => Rule::SysvMsg { write: false },
        libc::SYS_mq_timedreceive => Rule::PosixMsg { write: true },
        libc::SYS_mq_timedsend => Rule::PosixMsg { write: false },
        libc::SYS_futex_waitv => Rule::FutexWaitv,
        // The local side: the caller's own buffers, which the kernel writes (readv) or
        // reads (writev). The other process's memory is that process's to bring in: a
        // signal-mode process's pages out of RAM cannot be (docs/cli.md, "Other processes
        // reading its memory").
        libc::SYS_process_vm_readv => Rule::ProcessVm { write: true },
        libc::SYS_process_vm_writev => Rule::ProcessVm { write: false },
        libc::SYS_recvmsg => Rule::Msg { msg: 1, write: true },
        libc::SYS_sendmsg => Rule::Msg { msg: 1, write: false },
        libc::SYS_recvmmsg => Rule::MMsg { vec: 1, cnt: 2, write: true },
        libc::SYS_sendmmsg => Rule::MMsg { vec: 1, cnt: 2, write: false },
        libc::SYS_execve => Rule::Exec { path: 0, argv: 1, envp: 2 },
        libc::SYS_execveat => Rule::Exec { path: 1, argv: 2, envp: 3 },
        // Recorded for reclaim (see `crate::mlock`); the kernel populates a lock with writes.
        libc::SYS_mlock | libc::SYS_mlock2 => buf(0, 1, true),
        libc::SYS_munlock | libc::SYS_mlockall | libc::SYS_munlockall => Rule::Plain,
        // A range, not a pointer the kernel follows; the slow path brings in the ranges the
        // kernel would populate (`MADV_POPULATE_*`, see `entry::populate_call`).
        libc::SYS_madvise => Rule::Plain,
        // Its first argument is a range asked about, not memory the kernel reads: made
        // ready as `Generic` would, `mincore` brought in the page it asked about and always
        // found it resident. Only the vector is written: a byte a page. (Readied for `len`
        // bytes, a query of 24 MiB brought in and charged 24 MiB of the heap after its
        // vector of 6 KiB.)
        libc::SYS_mincore => Rule::PageVector { vec: 2, len: 1 },
        // Frequent calls, by the kernel's own signatures (`SYSCALL_DEFINEn`): the pointers
        // among their arguments, and nothing past their last.
        libc::SYS_open | libc::SYS_access | libc::SYS_unlink | libc::SYS_uname | libc::SYS_sysinfo => ptrs(0b1),
        libc::SYS_stat | libc::SYS_lstat | libc::SYS_nanosleep | libc::SYS_gettimeofday | libc::SYS_sigaltstack => {
            ptrs(0b11)
        }
        libc::SYS_openat
        | libc::SYS_fstat
        | libc::SYS_faccessat
        | libc::SYS_faccessat2
        | libc::SYS_unlinkat
        | libc::SYS_clock_gettime
        | libc::SYS_clock_getres
        | libc::SYS_getrusage
        | libc::SYS_connect
        | libc::SYS_bind => ptrs(0b10),
        libc::SYS_newfstatat
        | libc::SYS_rt_sigprocmask
        | libc::SYS_rt_sigaction
        | libc::SYS_accept4
        | libc::SYS_getsockname
        | libc::SYS_getpeername => ptrs(0b110),
        libc::SYS_statx => ptrs(0b10010),
        libc::SYS_fcntl | libc::SYS_ioctl => ptrs(0b100),
        libc::SYS_clock_nanosleep | libc::SYS_prlimit64 => ptrs(0b1100),
        libc::SYS_wait4 => ptrs(0b1010),
        libc::SYS_epoll_ctl | libc::SYS_setsockopt => ptrs(0b1000),
        libc::SYS_getsockopt => ptrs(0b11000),
        n if is_plain(n) => Rule::Plain,
        _ => Rule::Generic,
    }
}

/// Calls that take no pointer the kernel follows. The clone family and `rt_sigreturn` must be
/// here: they may not run on a stack the dispatch has pushed to (see `patch`).
const PLAIN: [c_long; 72] = [
    libc::SYS_close,
    libc::SYS_lseek,
    libc::SYS_mmap,
    libc::SYS_mprotect,
    libc::SYS_munmap,
    libc::SYS_brk,
    libc::SYS_rt_sigreturn,
    libc::SYS_sched_yield,
    libc::SYS_mremap,
    libc::SYS_msync,
    libc::SYS_dup,
    libc::SYS_dup2,
    libc::SYS_dup3,
    libc::SYS_pause,
    libc::SYS_alarm,
    libc::SYS_getpid,
    libc::SYS_socket,
    libc::SYS_shutdown,
    libc::SYS_listen,
    libc::SYS_clone,
    libc::SYS_clone3,
    libc::SYS_fork,
    libc::SYS_vfork,
    libc::SYS_exit,
    libc::SYS_exit_group,
    libc::SYS_kill,
    libc::SYS_tkill,
    libc::SYS_tgkill,
    libc::SYS_flock,
    libc::SYS_fsync,
    libc::SYS_fdatasync,
    libc::SYS_ftruncate,
    libc::SYS_fallocate,
    libc::SYS_fchdir,
    libc::SYS_fchmod,
    libc::SYS_fchown,
    libc::SYS_umask,
    libc::SYS_getuid,
    libc::SYS_getgid,
    libc::SYS_geteuid,
    libc::SYS_getegid,
    libc::SYS_setuid,
    libc::SYS_setgid,
    libc::SYS_setpgid,
    libc::SYS_getppid,
    libc::SYS_getpgrp,
    libc::SYS_setsid,
    libc::SYS_getpgid,
    libc::SYS_getsid,
    libc::SYS_gettid,
    libc::SYS_getpriority,
    libc::SYS_setpriority,
    libc::SYS_eventfd,
    libc::SYS_eventfd2,
    libc::SYS_epoll_create,
    libc::SYS_epoll_create1,
    libc::SYS_timerfd_create,
    libc::SYS_inotify_init,
    libc::SYS_inotify_init1,
    libc::SYS_inotify_rm_watch,
    libc::SYS_syncfs,
    libc::SYS_sync,
    libc::SYS_tee,
    libc::SYS_sync_file_range,
    libc::SYS_userfaultfd,
    libc::SYS_membarrier,
    libc::SYS_close_range,
    libc::SYS_pidfd_open,
    libc::SYS_set_tid_address,
    libc::SYS_unshare,
    libc::SYS_setns,
    libc::SYS_personality,
];

/// Whether `nr` is one of [`PLAIN`], by the dispatch's own table.
fn is_plain(nr: c_long) -> bool {
    usize::try_from(nr).ok().and_then(|i| CLASS.get(i)) == Some(&0)
}

/// The dispatch's table: 0 where a call goes straight to the kernel, 1 where it goes to the
/// slow path. Built at compile time.
pub static CLASS: [u8; 1 << 16] = {
    let mut t = [1u8; 1 << 16];
    let mut i = 0;
    while i < PLAIN.len() {
        t[PLAIN[i] as usize] = 0;
        i += 1;
    }
    t
};

#[cfg(test)]
mod tests {
    use super::*;

    /// The table the dispatch reads and the rules the slow path looks up agree: the calls of
    /// [`PLAIN`] and only those go straight to the kernel.
    #[test]
    fn the_class_table_and_the_rules_agree() {
        let nr_straight = CLASS.iter().filter(|&&c| c == 0).count();
        assert_eq!(nr_straight, PLAIN.len(), "a call listed twice in PLAIN, or out of the table");
        for nr in PLAIN {
            assert_eq!((CLASS[nr as usize], rule(nr)), (0, Rule::Plain), "call {nr}");
        }
        for nr in [
            libc::SYS_read,
            libc::SYS_recvfrom,
            libc::SYS_write,
            libc::SYS_futex,
            libc::SYS_mincore,
            libc::SYS_process_vm_readv,
            libc::SYS_process_vm_writev,
        ] {
            assert_eq!(CLASS[nr as usize], 1, "call {nr} must reach the slow path");
            assert_ne!(rule(nr), Rule::Plain, "call {nr}");
        }
        assert_eq!((rule(-1), rule(1 << 16), rule(libc::SYS_futex)), (Rule::Generic, Rule::Generic, Rule::Generic));
        // The pointers of `openat`, and of `newfstatat`, whose last argument is a flag.
        assert_eq!((rule(libc::SYS_openat), rule(libc::SYS_newfstatat)), (ptrs(0b10), ptrs(0b110)));
    }
}
