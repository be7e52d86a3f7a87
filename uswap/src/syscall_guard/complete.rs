//! Transfers that uswap cut short, continued for the rest as the kernel would have.
//!
//! The kernel copies a call's buffer page by page; at a missing page it faults the page in
//! and goes on, so a `write` to a blocking pipe or socket, or a `read` of a regular file,
//! stops short only for reasons of its own (a signal, the end of the file, a full disk). In
//! signal mode it cannot fault a managed page in: the call is prepared first, but if reclaim
//! takes a page of the buffer out before the kernel reaches it, the call returns the bytes
//! it copied up to there. That is a legal result, and a program that loops on short writes
//! loses nothing; but many take a blocking write as whole. CPython 3.11's buffered writer
//! drops the rest of a short write (without uswap too: a 30,000-line `sys.stdout.write`
//! loop under a 100 µs `SIGALRM` timer came out 4,000 to 12,000 bytes short in 3 runs of
//! 3), so under signal mode a Python pipeline lost bytes in about 1 run in 5.
//!
//! So a call here that came back short while pages were being taken out is made again for
//! the rest of its buffer, in windows of half a pin (`crate::pin::MAX_PIN_BYTES`, which keeps
//! a window's buffer in until the call returned), and the counts are added up, as if the
//! kernel had gone on. A buffer too large to be in whole at once (its `EFAULT` comes back
//! however often it is prepared: a 12 MiB `write` under a 16 MiB limit shared with a
//! neighbour) is transferred in such windows too, halved until one goes through (down to
//! one page), on byte streams only
//! ([`splittable`]: two writes to a pipe read back as one; two datagrams do not).
//! The calls: `write`, `pwrite64`, `writev`, `pwritev`, `pwritev2`, `sendto` without an
//! address, `sendmsg` without control data; `pread64`, `preadv`, `preadv2`, `read` and
//! `readv` of regular files, and `recvfrom` and `recvmsg` with `MSG_WAITALL` on a stream
//! socket (the kernel waits for all of it), without an address or control data. A
//! `read` or `readv` of anything else (a pipe, a socket, a terminal) may rightly return
//! less, and reading on could block: it is only cut to a window when its whole buffer
//! cannot be in, and returns what the first window got ([`Transfer::once`]). A flat
//! `write`, `pwrite64`, `read` or `pread64` larger than a window that goes on so has only
//! its first window readied before it is made ([`goes_on_in_windows`]): readied whole, a
//! buffer far over the limit came in twice.
//!
//! A continuation that fails or transfers nothing ends it: the program gets the bytes done
//! so far, as the kernel returns a partial count before an error. A short write that only a
//! signal caused is continued as well when reclaim happened to run meanwhile: the bytes
//! still all go, a little later than the signal; on a non-blocking descriptor the
//! continuation meets `EAGAIN` and ends. A write split in windows is no longer one write
//! for other writers of the same file or pipe: a pipe's atomic writes are at most
//! `PIPE_BUF` (4 KiB) anyway, but concurrent `O_APPEND` writers of one file could interleave
//! between windows.
//!
//! Allocation-free: a vector call's iovecs are read from the program's memory as its
//! windows need them, and each window's (at most [`MAX_IOVS`], adjusted) are copied to the
//! stack; a call with more iovecs goes in more windows.

use std::cell::Cell;

use libc::c_long;

use super::raw::{fd_flags, file_type, iov_at, is_regular_file, is_stream_socket, read_user};

/// The most iovecs one window of a continued vector call holds (copied to the stack: the
/// slow path may run on a small signal stack of the program's).
pub const MAX_IOVS: usize = 32;
/// The kernel's `UIO_MAXIOV`: a vector call with more fails with `EINVAL` before it moves
/// a byte, and is not continued.
const UIO_MAXIOV: u64 = 1024;

/// The iovecs of one window, on the stack, and the message header that names them for a
/// `sendmsg` or `recvmsg` window.
pub struct Iovs {
    v: [libc::iovec; MAX_IOVS],
    len: usize,
    hdr: libc::msghdr,
}

impl Iovs {
    pub fn new() -> Iovs {
        // SAFETY: `msghdr` is plain data; all zeroes is an empty header.
        let hdr = unsafe { std::mem::zeroed() };
        Iovs { v: [libc::iovec { iov_base: std::ptr::null_mut(), iov_len: 0 }; MAX_IOVS], len: 0, hdr }
    }
}

/// The bytes the `cnt` iovecs at `addr` name, `None` if there are more than the kernel
/// takes or one cannot be read.
fn iov_total_bytes(addr: u64, cnt: u64) -> Option<u64> {
    if cnt > UIO_MAXIOV {
        return None;
    }
    (0..cnt).try_fold(0u64, |sum, i| {
        Some(sum.saturating_add(iov_at(&mut crate::pin::Pin::none(), addr, i)?.iov_len as u64))
    })
}

/// What kind of transfer a call is, for continuing it.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Kind {
    /// Buffer in arguments 1 and 2.
    Flat,
    /// Buffer in arguments 1 and 2, file offset in argument 3.
    FlatAt,
    /// Iovecs in arguments 1 and 2.
    Vec,
    /// Iovecs in arguments 1 and 2, file offset in argument 3 (`-1`: the file position).
    VecAt,
    /// A `struct msghdr` in argument 1 with no control data: its iovecs (`sendmsg`,
    /// `recvmsg`); the windows after the first name neither address nor control data.
    Msg,
}

/// The shape of transfer call `nr`, and whether it is a `read` or `readv`, which ends at its
/// first transfer unless its descriptor is a regular file (see [`kind`]).
fn shape(nr: c_long) -> Option<(Kind, bool)> {
    match nr {
        libc::SYS_write | libc::SYS_sendto | libc::SYS_recvfrom => Some((Kind::Flat, false)),
        libc::SYS_sendmsg | libc::SYS_recvmsg => Some((Kind::Msg, false)),
        libc::SYS_pwrite64 | libc::SYS_pread64 => Some((Kind::FlatAt, false)),
        libc::SYS_writev => Some((Kind::Vec, false)),
        libc::SYS_pwritev | libc::SYS_pwritev2 | libc::SYS_preadv | libc::SYS_preadv2 => Some((Kind::VecAt, false)),
        libc::SYS_read => Some((Kind::Flat, true)),
        libc::SYS_readv => Some((Kind::Vec, true)),
        _ => None,
    }
}

/// Whether call `nr` may be one of this module's transfers (by its number alone: whether
/// it is depends on its arguments, see [`Transfer::of`]).
pub fn is_transfer(nr: c_long) -> bool {
    shape(nr).is_some()
}

/// How call `nr` is made in windows, if it is one of this module's, and whether it ends
/// at its first transfer: a read of anything but a regular file (a pipe, a socket, a
/// terminal) may return less than asked, and reading on could block. `sendto` only without
/// an address; `recvfrom` and `recvmsg` only with `MSG_WAITALL` (the kernel then waits for
/// all of it) and without an address to write back, on a stream socket (on a datagram
/// socket the rest would be the next datagram's).
fn kind(nr: c_long, a: &[u64; 6]) -> Option<(Kind, bool)> {
    let waitall = |flags: u64| flags & libc::MSG_WAITALL as u64 != 0;
    match nr {
        libc::SYS_sendto if a[4] != 0 => return None,
        libc::SYS_recvfrom if !waitall(a[3]) || a[4] != 0 || !is_stream_socket(a[0]) => return None,
        libc::SYS_recvmsg if !waitall(a[2]) || !is_stream_socket(a[0]) => return None,
        _ => {}
    }
    let (kind, stream_read) = shape(nr)?;
    Some((kind, stream_read && !is_regular_file(a[0])))
}

/// A call that may be continued: what it asked for.
pub struct Transfer {
    kind: Kind,
    /// It ends at its first call that transfers anything (see [`kind`]).
    pub once: bool,
    /// The bytes it asked to transfer.
    pub total_bytes: u64,
    /// A vector call's iovecs in the program's memory: where, and how many.
    iov_addr: u64,
    nr_iovs: u64,
    /// The first iovec not wholly transferred and the bytes before it, as far as the windows
    /// so far looked (they only move forward): each window reads on from there.
    cursor: Cell<(u64, u64)>,
}

impl Transfer {
    /// The transfer call `nr` with arguments `a` asks for; `None` for calls that are not
    /// continued (see the module's comment).
    pub fn of(nr: libc::c_long, a: &[u64; 6]) -> Option<Transfer> {
        let (kind, once) = kind(nr, a)?;
        let (iov_addr, nr_iovs) = match kind {
            Kind::Flat | Kind::FlatAt => (0, 0),
            Kind::Vec | Kind::VecAt => (a[1], a[2]),
            Kind::Msg => {
                let m = read_user::<libc::msghdr>(&mut crate::pin::Pin::none(), a[1])?;
                // Control data (descriptors, credentials) goes with the first bytes only.
                if m.msg_controllen != 0 {
                    return None;
                }
                (m.msg_iov as u64, m.msg_iovlen as u64)
            }
        };
        let total_bytes =
            if kind == Kind::Flat || kind == Kind::FlatAt { a[2] } else { iov_total_bytes(iov_addr, nr_iovs)? };
        Some(Transfer { kind, once, total_bytes, iov_addr, nr_iovs, cursor: Cell::new((0, 0)) })
    }

    /// The arguments that transfer at most `max_bytes` of what is left after `done_bytes`
    /// (`iovs` holds the iovecs of a vector call, and must outlive the call), and how many
    /// bytes they ask for: fewer than `max_bytes` where a vector call's window ends at
    /// [`MAX_IOVS`] iovecs, none if an iovec can no longer be read.
    pub fn window(&self, a: &[u64; 6], done_bytes: u64, max_bytes: u64, iovs: &mut Iovs) -> ([u64; 6], u64) {
        debug_assert!(done_bytes < self.total_bytes, "nothing left after {done_bytes} bytes");
        let mut r = *a;
        let mut max_bytes = max_bytes.min(self.total_bytes - done_bytes);
        match self.kind {
            Kind::Flat | Kind::FlatAt => {
                r[1] = a[1] + done_bytes;
                r[2] = max_bytes;
            }
            Kind::Vec | Kind::VecAt => {
                max_bytes = self.window_into(done_bytes, max_bytes, iovs);
                r[1] = iovs.v.as_ptr() as u64;
                r[2] = iovs.len as u64;
            }
            Kind::Msg => {
                max_bytes = self.window_into(done_bytes, max_bytes, iovs);
                // SAFETY: `msghdr` is plain data; all zeroes is an empty header.
                iovs.hdr = unsafe { std::mem::zeroed() };
                iovs.hdr.msg_iov = iovs.v.as_mut_ptr();
                iovs.hdr.msg_iovlen = iovs.len;
                r[1] = &iovs.hdr as *const libc::msghdr as u64;
            }
        }
        // `-1` in `preadv2`/`pwritev2` means the file position, which the kernel moves on.
        if matches!(self.kind, Kind::FlatAt | Kind::VecAt) && a[3] as i64 != -1 {
            r[3] = a[3] + done_bytes;
        }
        (r, max_bytes)
    }

    /// The iovecs of at most `max_bytes` after the first `done_bytes`, at most [`MAX_IOVS`]
    /// of them, into `out`; returns the bytes they name.
    fn window_into(&self, done_bytes: u64, max_bytes: u64, out: &mut Iovs) -> u64 {
        let (mut i, mut before) = self.cursor.get();
        if before > done_bytes {
            (i, before) = (0, 0);
        }
        out.len = 0;
        let mut left = max_bytes;
        // Bounded: one step an iovec, at most `nr_iovs` (checked against UIO_MAXIOV).
        while i < self.nr_iovs && out.len < MAX_IOVS && left > 0 {
            let Some(v) = iov_at(&mut crate::pin::Pin::none(), self.iov_addr, i) else { break };
            let len = v.iov_len as u64;
            if before + len <= done_bytes {
                before += len;
                i += 1;
                self.cursor.set((i, before));
                continue;
            }
            let skip = done_bytes.saturating_sub(before);
            let take = (len - skip).min(left);
            out.v[out.len] =
                libc::iovec { iov_base: (v.iov_base as u64 + skip) as *mut libc::c_void, iov_len: take as usize };
            out.len += 1;
            left -= take;
            before += len;
            i += 1;
        }
        max_bytes - left
    }
}

/// Whether a transfer on descriptor `fd` may be made in smaller calls without anyone seeing
/// the difference: `fd` is a byte stream (a regular file, a block or character device, a
/// pipe not in packet mode, a stream socket), where two writes read back as one. A datagram
/// split in two is two datagrams.
pub fn splittable(fd: u64) -> bool {
    let Some(file_type) = file_type(fd) else { return false };
    match file_type {
        libc::S_IFREG | libc::S_IFBLK | libc::S_IFCHR => true,
        libc::S_IFIFO => fd_flags(fd).is_some_and(|flags| flags & libc::O_DIRECT as c_long == 0),
        libc::S_IFSOCK => is_stream_socket(fd),
        _ => false,
    }
}

/// Whether flat transfer `nr` (`write`, `pwrite64`, `read`, `pread64`) of more than
/// `window_bytes` goes on for the rest, in windows, when it comes back short: not one that
/// ends at its first transfer ([`Transfer::once`]), and on a descriptor that takes its
/// bytes in several calls as in one (a datagram must be readied whole, or it is lost).
/// Such a call may have only its first window readied before it is made. System calls
/// (`fstat`, `fcntl`, `getsockopt`) only for calls larger than `window_bytes`.
pub fn goes_on_in_windows(nr: c_long, a: &[u64; 6], window_bytes: u64) -> bool {
    let flat = matches!(nr, libc::SYS_write | libc::SYS_pwrite64 | libc::SYS_read | libc::SYS_pread64);
    flat && a[2] > window_bytes && kind(nr, a).is_some_and(|(_, once)| !once) && splittable(a[0])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_rest_of_a_vector_skips_what_was_done() {
        let bufs = [[0u8; 10], [0u8; 10], [0u8; 10]];
        let iov: Vec<libc::iovec> =
            bufs.iter().map(|b| libc::iovec { iov_base: b.as_ptr() as *mut _, iov_len: b.len() }).collect();
        let a = [1, iov.as_ptr() as u64, 3, 0, 0, 0];
        let t = Transfer::of(libc::SYS_writev, &a).expect("writev is continued");
        assert_eq!(t.total_bytes, 30);
        let mut rest = Iovs::new();
        let (r, bytes) = t.window(&a, 5, 7, &mut rest);
        assert_eq!((r[2], bytes), (2, 7));
        assert_eq!((rest.v[0].iov_base as u64, rest.v[0].iov_len), (bufs[0].as_ptr() as u64 + 5, 5));
        assert_eq!((rest.v[1].iov_base as u64, rest.v[1].iov_len), (bufs[1].as_ptr() as u64, 2));
        let (r, bytes) = t.window(&a, 14, u64::MAX, &mut rest);
        assert_eq!((r[2], bytes), (2, 16));
        assert_eq!(rest.v[0].iov_base as u64, bufs[1].as_ptr() as u64 + 4);
        assert_eq!(rest.v[0].iov_len, 6);
        assert_eq!(rest.v[1].iov_len, 10);
    }

    /// A call with more iovecs than a window holds goes in windows of at most `MAX_IOVS`,
    /// each saying how many bytes it asks for; more than the kernel takes is not continued.
    #[test]
    fn a_vector_longer_than_a_window_goes_in_several() {
        let buf = [0u8; 1000];
        let iov: Vec<libc::iovec> =
            (0..100).map(|i| libc::iovec { iov_base: buf[i * 10..].as_ptr() as *mut _, iov_len: 10 }).collect();
        let a = [1, iov.as_ptr() as u64, 100, 0, 0, 0];
        let t = Transfer::of(libc::SYS_writev, &a).expect("writev is continued");
        assert_eq!(t.total_bytes, 1000);
        let mut w = Iovs::new();
        let (mut done, mut nr_windows) = (0, 0);
        while done < t.total_bytes {
            let (r, bytes) = t.window(&a, done, u64::MAX, &mut w);
            assert!(r[2] as usize <= MAX_IOVS && bytes > 0);
            assert_eq!(w.v[0].iov_base as u64, buf.as_ptr() as u64 + done);
            done += bytes;
            nr_windows += 1;
        }
        assert_eq!((done, nr_windows), (1000, 100usize.div_ceil(MAX_IOVS)));
        let many = [1, iov.as_ptr() as u64, UIO_MAXIOV + 1, 0, 0, 0];
        assert!(Transfer::of(libc::SYS_writev, &many).is_none());
    }

    #[test]
    fn positioned_calls_move_their_offset_and_reads_of_pipes_end_at_the_first_transfer() {
        let a = [1, 0x10000, 4106, 100, 0, 0];
        let t = Transfer::of(libc::SYS_pwrite64, &a).expect("pwrite64 is continued");
        let (r, bytes) = t.window(&a, 4096, u64::MAX, &mut Iovs::new());
        assert_eq!((r[1], r[2], r[3], bytes), (0x10000 + 4096, 10, 4196, 10));
        let (r, bytes) = t.window(&a, 0, 1000, &mut Iovs::new());
        assert_eq!((r[1], r[2], r[3], bytes), (0x10000, 1000, 100, 1000));
        let mut fds = [0; 2];
        // SAFETY: pipe writes two descriptors into `fds`.
        assert_eq!(unsafe { libc::pipe(fds.as_mut_ptr()) }, 0);
        let r = Transfer::of(libc::SYS_read, &[fds[0] as u64, 0x10000, 10, 0, 0, 0]).expect("a pipe read");
        assert!(r.once, "a pipe read ends at its first transfer");
        let w = Transfer::of(libc::SYS_write, &[fds[1] as u64, 0x10000, 10, 0, 0, 0]).expect("a pipe write");
        assert!(!w.once, "a pipe write goes on for the rest");
        assert!(splittable(fds[1] as u64));
        let mut dg = [0; 2];
        // SAFETY: socketpair writes two descriptors into `dg`, ours.
        assert_eq!(unsafe { libc::socketpair(libc::AF_UNIX, libc::SOCK_DGRAM, 0, dg.as_mut_ptr()) }, 0);
        assert!(!splittable(dg[0] as u64), "a datagram socket is not a byte stream");
        // SAFETY: closes the datagram pair opened above.
        unsafe {
            libc::close(dg[0]);
            libc::close(dg[1]);
        }
        // SAFETY: closes the two descriptors opened above.
        unsafe {
            libc::close(fds[0]);
            libc::close(fds[1]);
        }
    }
}
