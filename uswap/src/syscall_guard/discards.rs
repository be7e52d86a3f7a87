//! Discards the program makes (`madvise` and `process_madvise` with `MADV_DONTNEED`,
//! `MADV_FREE`, ...), applied to the engine's page tables before they return, for the pagers
//! whose regions' descriptor asks for no `REMOVE` events (`crate::events::ProgramDiscard`).
//!
//! Runs on the program's thread, in the slow path ([`super::entry`]); the application takes
//! the pager's event reader lock and may allocate, as an event's does.

use libc::c_long;

use super::raw::{iov_at, raw};

/// Whether call `nr` with arguments `a` is a `madvise` or `process_madvise` with advice that
/// discards, while a pager lives whose regions' descriptor asks for no `REMOVE` events
/// (`crate::events::ProgramDiscard`): then [`make`] makes it.
pub(super) fn is_discard(nr: c_long, a: &[u64; 6]) -> bool {
    const MADV_DONTNEED_LOCKED: u64 = 24;
    let advice = match nr {
        libc::SYS_madvise => a[2],
        libc::SYS_process_madvise => a[3],
        _ => return false,
    };
    let discards = [libc::MADV_DONTNEED as u64, libc::MADV_FREE as u64, libc::MADV_REMOVE as u64, MADV_DONTNEED_LOCKED];
    discards.contains(&advice) && crate::events::ProgramDiscard::needed()
}

/// Makes a discard ([`is_discard`]), and applies what the kernel discarded to the engine's
/// page tables before the program goes on: its pages out of RAM read zero, as the kernel's
/// swap makes them. The caller runs it as the engine's work (its own calls, the signal
/// mask, straight to the kernel).
pub(super) fn make(nr: c_long, a: &[u64; 6]) -> c_long {
    match nr {
        libc::SYS_process_madvise => vector_discard(a),
        _ => {
            let discard = crate::events::ProgramDiscard::begin();
            // SAFETY: the program's own call.
            let ret = unsafe { raw(nr, *a) };
            // ENOMEM: a hole in the range, the mapped parts discarded all the same.
            if ret == 0 || ret == -(libc::ENOMEM as c_long) {
                discard.applied_bytes(a[0], a[1]);
            }
            ret
        }
    }
}

/// The most iovecs one call takes (the kernel's `UIO_MAXIOV`).
const UIO_MAXIOV: u64 = 1024;

/// Iovecs a `process_madvise` of [`make`]'s is made with at a time.
const DISCARD_VECS: usize = 64;

/// `process_madvise(pidfd, iov, n, advice, flags)` that discards: made [`DISCARD_VECS`]
/// iovecs at a time, each part with a copy of its iovecs read before the discard begins
/// (read after, an array in managed memory would wait on this very discard to be applied;
/// and the copy is what the kernel and the engine both see), and what each part discarded
/// applied before the next. Returns the bytes discarded, as the kernel counts them (whole
/// iovecs, in order, up to the first it refused), or its error if the first part failed.
fn vector_discard(a: &[u64; 6]) -> c_long {
    if a[2] > UIO_MAXIOV {
        // SAFETY: the program's own call, which the kernel refuses (`EINVAL`: more iovecs
        // than `UIO_MAXIOV`).
        return unsafe { raw(libc::SYS_process_madvise, *a) };
    }
    let mut done_bytes: c_long = 0;
    let nr_vecs = a[2];
    let mut first = 0;
    // Bounded: UIO_MAXIOV / DISCARD_VECS parts.
    loop {
        let mut part = [libc::iovec { iov_base: std::ptr::null_mut(), iov_len: 0 }; DISCARD_VECS];
        let n = (nr_vecs - first).min(DISCARD_VECS as u64) as usize;
        let mut pin = crate::pin::Pin::new();
        for (k, v) in part[..n].iter_mut().enumerate() {
            match iov_at(&mut pin, a[1], first + k as u64) {
                Some(read) => *v = read,
                None => return if done_bytes > 0 { done_bytes } else { -(libc::EFAULT as c_long) },
            }
        }
        pin.release();
        let total: u64 = part[..n].iter().map(|v| v.iov_len as u64).sum();
        let discard = crate::events::ProgramDiscard::begin();
        let args = [a[0], part.as_ptr() as u64, n as u64, a[3], a[4], a[5]];
        // SAFETY: the program's own call, with its iovecs copied here.
        let ret = unsafe { raw(libc::SYS_process_madvise, args) };
        if ret < 0 {
            return if done_bytes > 0 { done_bytes } else { ret };
        }
        let mut left_bytes = ret as u64;
        for v in &part[..n] {
            // The kernel may have cut the last iovec (its total is capped): that part of it.
            let len = (v.iov_len as u64).min(left_bytes);
            discard.applied_bytes(v.iov_base as u64, len);
            left_bytes -= len;
        }
        drop(discard);
        done_bytes = done_bytes.saturating_add(ret);
        first += n as u64;
        if ret as u64 != total || first >= nr_vecs || n == 0 {
            return done_bytes;
        }
    }
}
