//! A process reading or writing its own memory through its memory file (`/proc/self/mem`,
//! `/proc/PID/mem`, `/proc/thread-self/mem`), as a careful `memcpy` or to write past a
//! mapping's protection (a debugger in the process, a JIT patching its code).
//!
//! The kernel reaches those pages with a remote access (`access_remote_vm`), which takes no
//! retry and so cannot wait for a userfaultfd in either mode: at a page that is out of RAM
//! the call fails with `EIO` (nothing moved) or stops short. Plain, the kernel would have
//! faulted the page in. So a `read`, `write`, `pread64` or `pwrite64` of this process's
//! memory file that failed with `EIO` or came back short is made again for the rest, in
//! windows of half a pin, each with the memory file's range and the caller's buffer made
//! ready first, and the counts are added up, as the kernel would have gone on. The file is
//! told by its link in `/proc/self/fd` (a system call, made only on such a failure, and only
//! when the rest of the range lies in managed memory: a short `pread64` at the end of an
//! ordinary file costs nothing more). A short `read` or `write` is looked at only on a
//! descriptor already found to be the memory file ([`KNOWN`]: a short read of a pipe or a
//! socket is everyday, and where such a call stands in the file would take a system call
//! to ask). Not served: the vector calls (`readv`, `preadv` and the others), a first `read`
//! or `write` on a descriptor that stops short after a first page that was in (the kernel
//! returns short counts on this file too, at an unmapped page; a program that reads on
//! gets `EIO` at its next call, which is served), and another process's memory file
//! (docs/cli.md, "Other processes").
//!
//! Runs on the program's thread, maybe in its signal handler: allocates nothing, takes no
//! lock; the caller holds the slow path's guard (`entry::guarded`).

use std::sync::atomic::{AtomicU32, Ordering};

use libc::c_long;

use super::raw::raw;

/// Descriptors found to be this process's memory file (each plus one; 0 is a free slot),
/// whose short `read`s and `write`s are looked at too. A descriptor closed and reused for
/// another file is found out at its next short call and forgotten.
static KNOWN: [AtomicU32; 4] = [const { AtomicU32::new(0) }; 4];

fn is_known(fd: u64) -> bool {
    let tag = fd.wrapping_add(1);
    tag != 0 && KNOWN.iter().any(|k| u64::from(k.load(Ordering::Relaxed)) == tag)
}

/// Notes `fd` as the memory file (over the slot its number picks, when every slot is taken).
fn note_known(fd: u64) {
    let Ok(tag) = u32::try_from(fd.wrapping_add(1)) else { return };
    if tag == 0 || is_known(fd) {
        return;
    }
    let free = KNOWN.iter().find(|k| k.compare_exchange(0, tag, Ordering::Relaxed, Ordering::Relaxed).is_ok());
    if free.is_none() {
        KNOWN[fd as usize % KNOWN.len()].store(tag, Ordering::Relaxed);
    }
}

fn forget(fd: u64) {
    let Ok(tag) = u32::try_from(fd.wrapping_add(1)) else { return };
    for k in &KNOWN {
        let _ = k.compare_exchange(tag, 0, Ordering::Relaxed, Ordering::Relaxed);
    }
}

/// The most windows a continued call is made in: 64 windows of half a pin are 128 MiB, far
/// more than a program moves through its memory file at once.
const MAX_WINDOWS: usize = 64;

/// The calls served, as (positional, write): `None` for any other.
fn shape(nr: c_long) -> Option<(bool, bool)> {
    match nr {
        libc::SYS_read => Some((false, false)),
        libc::SYS_write => Some((false, true)),
        libc::SYS_pread64 => Some((true, false)),
        libc::SYS_pwrite64 => Some((true, true)),
        _ => None,
    }
}

/// The bytes call `nr` with arguments `a` moved before it failed with `EIO` or stopped
/// short as a call on the memory file does at a page out of RAM (what [`continued`] goes on
/// from), `None` if it did neither. Cheap, no system call: the slow path asks it of every
/// call it makes.
pub(super) fn cut_after_bytes(nr: c_long, a: &[u64; 6], ret: c_long) -> Option<u64> {
    let (positional, _) = shape(nr)?;
    match ret {
        r if r == -(libc::EIO as c_long) => Some(0),
        r if r >= 0 && (r as u64) < a[2] && (positional || is_known(a[0])) => Some(r as u64),
        _ => None,
    }
}

/// A call on the memory file that uswap's pages made fail or stop short after `done_bytes`
/// ([`cut_after_bytes`]): `Some` with the call's result once continued, `None` if it is not
/// one (its result stands).
pub(super) fn continued(nr: c_long, a: &[u64; 6], ret: c_long, done_bytes: u64) -> Option<c_long> {
    let (positional, write) = shape(nr)?;
    debug_assert!(done_bytes <= a[2], "a call cut short moved no more than asked");
    let fd = a[0];
    // Where the call began: a `read` or `write` moved the position past what it did.
    let at = if positional {
        a[3]
    } else {
        // SAFETY: lseek of the program's descriptor by 0 moves nothing; it reads the position.
        let position = unsafe { raw(libc::SYS_lseek, [fd, 0, libc::SEEK_CUR as u64, 0, 0, 0]) };
        match u64::try_from(position).ok().and_then(|p| p.checked_sub(done_bytes)) {
            Some(at) => at,
            None => {
                forget(fd);
                return None;
            }
        }
    };
    let rest_at = at.checked_add(done_bytes)?;
    if !crate::user_access::touches_managed(rest_at as usize, (a[2] - done_bytes) as usize) {
        return None;
    }
    if !is_own_memory_file(fd) {
        forget(fd);
        return None;
    }
    note_known(fd);
    crate::stats::note_syscall(crate::stats::SyscallEvent::Continued);
    Some(go_on(nr, a, positional, write, at, done_bytes).unwrap_or(ret))
}

/// Makes call `nr` on the memory file again from `done_bytes` on, in windows (see the
/// module's comment): the bytes moved in all, or `None` if no window moved any.
fn go_on(nr: c_long, a: &[u64; 6], positional: bool, write: bool, at: u64, done_bytes: u64) -> Option<c_long> {
    let (fd, buf, len_bytes) = (a[0], a[1], a[2]);
    let window_bytes = (crate::pin::MAX_PIN_BYTES / 2) as u64;
    let mut moved_bytes = done_bytes;
    let mut last = 0;
    // Bounded: `MAX_WINDOWS` calls at most, and each that moves nothing ends it.
    for _ in 0..MAX_WINDOWS {
        let left_bytes = len_bytes - moved_bytes;
        if left_bytes == 0 {
            break;
        }
        let n = left_bytes.min(window_bytes);
        let (mem_at, buf_at) = (at + moved_bytes, buf + moved_bytes);
        let mut pin = crate::pin::Pin::new();
        // The kernel reads the memory file's range for a read and writes it for a write;
        // the caller's buffer the other way round.
        let _ = crate::user_access::prepare_user_access(&mut pin, mem_at as usize, n as usize, write);
        let _ = crate::user_access::prepare_user_access(&mut pin, buf_at as usize, n as usize, !write);
        let args = [fd, buf_at, n, if positional { mem_at } else { a[3] }, a[4], a[5]];
        // SAFETY: the program's own call, for the part of its range not moved yet.
        last = unsafe { raw(nr, args) };
        pin.release();
        if last <= 0 {
            break;
        }
        debug_assert!(last as u64 <= n, "the kernel moved more than asked");
        moved_bytes += last as u64;
    }
    if moved_bytes == 0 {
        return (last < 0).then_some(last);
    }
    Some(moved_bytes as c_long)
}

/// Whether descriptor `fd` is this process's memory file: its link in `/proc/self/fd` reads
/// `/proc/PID/mem` or `/proc/PID/task/TID/mem`, with this process's PID.
fn is_own_memory_file(fd: u64) -> bool {
    let mut path = [0u8; 40];
    let mut link = [0u8; 64];
    let path_len = write_path(&mut path, fd);
    debug_assert!(path_len < path.len(), "the path keeps its NUL");
    // SAFETY: readlinkat of a NUL-terminated path into `link`, ours, at most its length.
    let n = unsafe {
        raw(libc::SYS_readlinkat, [libc::AT_FDCWD as u64, path.as_ptr() as u64, link.as_mut_ptr() as u64, 64, 0, 0])
    };
    let Ok(n) = usize::try_from(n) else { return false };
    // SAFETY: getpid takes no arguments and touches no memory.
    let pid = unsafe { raw(libc::SYS_getpid, [0; 6]) } as u64;
    let mut own = [0u8; 32];
    let own_len = write_decimal(&mut own, b"/proc/", pid);
    let link = &link[..n.min(link.len())];
    let Some(rest) = link.strip_prefix(&own[..own_len]) else { return false };
    rest == b"/mem" || (rest.starts_with(b"/task/") && rest.ends_with(b"/mem"))
}

/// Writes `/proc/self/fd/FD` and a NUL into `out`: its length without the NUL.
fn write_path(out: &mut [u8; 40], fd: u64) -> usize {
    let len = write_decimal(out, b"/proc/self/fd/", fd);
    out[len] = 0;
    len
}

/// Writes `prefix` and `n` in decimal into `out` (large enough): the length written.
fn write_decimal(out: &mut [u8], prefix: &[u8], n: u64) -> usize {
    out[..prefix.len()].copy_from_slice(prefix);
    let mut digits = [0u8; 20];
    let mut nr_digits = 0;
    let mut v = n;
    // Bounded: a u64 has at most 20 decimal digits.
    loop {
        digits[nr_digits] = b'0' + (v % 10) as u8;
        nr_digits += 1;
        v /= 10;
        if v == 0 {
            break;
        }
    }
    for (i, d) in digits[..nr_digits].iter().rev().enumerate() {
        out[prefix.len() + i] = *d;
    }
    prefix.len() + nr_digits
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_are_written_in_decimal() {
        let mut out = [0u8; 40];
        let len = write_path(&mut out, 1234);
        assert_eq!(&out[..len + 1], b"/proc/self/fd/1234\0");
        let len = write_path(&mut out, 0);
        assert_eq!(&out[..len], b"/proc/self/fd/0");
        let mut own = [0u8; 32];
        let len = write_decimal(&mut own, b"/proc/", u64::from(u32::MAX));
        assert_eq!(&own[..len], b"/proc/4294967295");
    }

    #[test]
    fn descriptors_known_are_noted_once_and_forgotten() {
        let fds = [1000u64, 1001, 1002, 1003, 1004];
        for fd in fds {
            note_known(fd);
            note_known(fd);
            assert!(is_known(fd), "{fd} just noted");
        }
        let known = KNOWN.iter().filter(|k| k.load(Ordering::Relaxed) != 0).count();
        assert_eq!(known, KNOWN.len(), "every slot taken, none twice");
        for fd in fds {
            forget(fd);
            assert!(!is_known(fd));
        }
        assert!(KNOWN.iter().all(|k| k.load(Ordering::Relaxed) == 0));
        assert!(!is_known(u64::MAX), "a descriptor of -1 matches no free slot");
    }

    #[test]
    fn the_memory_file_is_told_from_other_files() {
        let mem = std::fs::File::open("/proc/self/mem").expect("open /proc/self/mem");
        let task = std::fs::File::open("/proc/thread-self/mem").expect("open /proc/thread-self/mem");
        let other = std::fs::File::open("/proc/self/status").expect("open /proc/self/status");
        let parent = std::fs::File::open(format!("/proc/{}/mem", std::os::unix::process::parent_id()));
        use std::os::fd::AsRawFd;
        assert!(is_own_memory_file(mem.as_raw_fd() as u64));
        assert!(is_own_memory_file(task.as_raw_fd() as u64));
        assert!(!is_own_memory_file(other.as_raw_fd() as u64));
        assert!(!is_own_memory_file(u64::from(u32::MAX)), "a descriptor that is not open");
        if let Ok(parent) = parent {
            assert!(!is_own_memory_file(parent.as_raw_fd() as u64), "another process's memory file");
        }
    }
}
