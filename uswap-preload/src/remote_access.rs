//! `process_vm_readv` and `process_vm_writev`: a process of the tree reading or writing
//! another process's memory (MPI's single-copy transfers between ranks, a profiler such as
//! py-spy). The kernel reaches the other process's pages with faults of its own, which a
//! signal-mode pager cannot serve (userfaultfd's SIGBUS mode fails them at once): the call
//! comes back short, or with `EFAULT`, at the first page that process has out of RAM. A
//! thread-mode pager serves them (`--fault-mode auto` picks thread mode for MPI's libraries,
//! see `config.rs`). The calls go through unchanged; one that comes back short is said once
//! per process, with the way out. The caller's own buffers are the system-call guard's
//! (`Rule::ProcessVm`) in signal mode, and the kernel waits for them in thread mode.
//!
//! Runs on the program's thread: allocates nothing, takes no lock; errno is the call's.

use std::sync::atomic::{AtomicBool, Ordering};

/// Whether a short transfer was said in this process.
static SAID: AtomicBool = AtomicBool::new(false);

/// The most iovecs summed to tell a short transfer (the kernel's `UIO_MAXIOV`).
const MAX_IOVS: usize = 1024;

#[no_mangle]
pub extern "C" fn process_vm_readv(
    pid: libc::pid_t,
    local: *const libc::iovec,
    local_cnt: libc::c_ulong,
    remote: *const libc::iovec,
    remote_cnt: libc::c_ulong,
    flags: libc::c_ulong,
) -> libc::ssize_t {
    let args = [pid as u64, local as u64, local_cnt, remote as u64, remote_cnt, flags];
    transfer(libc::SYS_process_vm_readv, b"process_vm_readv", args)
}

#[no_mangle]
pub extern "C" fn process_vm_writev(
    pid: libc::pid_t,
    local: *const libc::iovec,
    local_cnt: libc::c_ulong,
    remote: *const libc::iovec,
    remote_cnt: libc::c_ulong,
    flags: libc::c_ulong,
) -> libc::ssize_t {
    let args = [pid as u64, local as u64, local_cnt, remote as u64, remote_cnt, flags];
    transfer(libc::SYS_process_vm_writev, b"process_vm_writev", args)
}

/// Makes call `nr`, and says once if it moved less than both sides asked for.
fn transfer(nr: libc::c_long, name: &[u8], a: [u64; 6]) -> libc::ssize_t {
    // SAFETY: the call as the program made it; the kernel validates every argument (and
    // fails bad pointers with EFAULT).
    let done = unsafe { libc::syscall(nr, a[0], a[1], a[2], a[3], a[4], a[5]) } as libc::ssize_t;
    let errno = crate::real::errno();
    if SAID.load(Ordering::Relaxed) || uswap::syscall_guard::is_this_process(a[0] as libc::pid_t) {
        return done;
    }
    // A failed call may have failed on its own vectors: they are read only after a success,
    // when the kernel has read them.
    let short = if done < 0 {
        (errno == libc::EFAULT).then_some(None)
    } else {
        let asked = iov_bytes(a[1], a[2]).min(iov_bytes(a[3], a[4]));
        ((done as u64) < asked).then_some(Some((done as u64, asked)))
    };
    if let Some(moved) = short {
        if !SAID.swap(true, Ordering::Relaxed) {
            say_short(name, a[0] as libc::pid_t, moved);
            crate::real::set_errno(errno);
        }
    }
    done
}

/// The bytes `cnt` iovecs at `vec` name, for a call that has just succeeded with them.
fn iov_bytes(vec: u64, cnt: u64) -> u64 {
    if vec == 0 || cnt as usize > MAX_IOVS {
        return 0;
    }
    let mut sum = 0u64;
    for i in 0..cnt as usize {
        // SAFETY: the call has just succeeded with the same `cnt` iovecs at `vec`: the
        // kernel read them, so they are readable memory of this process (maybe unaligned,
        // as the kernel accepts them).
        let iov = unsafe { std::ptr::read_unaligned((vec as *const libc::iovec).add(i)) };
        sum = sum.saturating_add(iov.iov_len as u64);
    }
    sum
}

/// Says a transfer with process `pid` that moved `moved` (bytes done, bytes asked), or
/// failed with `EFAULT` (`None`).
fn say_short(name: &[u8], pid: libc::pid_t, moved: Option<(u64, u64)>) {
    let mut line = uswap::sigbus::StderrLine::default();
    line.put(b"uswap: ").put(name).put(b" of process ").put_number(pid as u64, 10, 1);
    match moved {
        None => line.put(b"'s memory failed with EFAULT"),
        Some((done, asked)) => {
            line.put(b"'s memory moved ").put_number(done, 10, 1).put(b" of ").put_number(asked, 10, 1).put(b" bytes")
        }
    };
    line.put(b": if it runs under uswap in signal mode, its pages out of RAM cannot be reached from ")
        .put(
            b"another process; run it with --fault-mode thread (docs/cli.md, \"Other processes reading its memory\")\n",
        )
        .write();
}
