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
//! the rest of its buffer, and the counts are added up, as if the kernel had gone on. A
//! buffer too large to be in whole at once (its `EFAULT` comes back however often it is
//! prepared: a 12 MiB `write` under a 16 MiB limit shared with a neighbour) is transferred
//! in windows, halved until one goes through (down to one page), on byte streams only
//! ([`Transfer::splittable`]: two writes to a pipe read back as one; two datagrams do not).
//! The calls: `write`, `pwrite64`, `writev`, `pwritev`, `pwritev2`, `sendto` without an
//! address; `pread64`, `preadv`, `preadv2`, and `read` and `readv` of regular files. A
//! `read` or `readv` of anything else (a pipe, a socket, a terminal) may rightly return
//! less, and reading on could block: it is only cut to a window when its whole buffer
//! cannot be in, and returns what the first window got ([`Transfer::once`]).
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
//! Allocation-free: vectors are copied to and adjusted on the stack, up to [`MAX_IOVS`];
//! a call with more is not continued.

use libc::c_long;

use super::raw::{file_type, is_regular_file, raw, read_user};

/// The most iovecs a vector call may have to be continued.
pub const MAX_IOVS: usize = 32;

/// A vector call's iovecs, copied from the program's memory.
pub struct Iovs {
    v: [libc::iovec; MAX_IOVS],
    len: usize,
}

impl Iovs {
    pub fn new() -> Iovs {
        Iovs { v: [libc::iovec { iov_base: std::ptr::null_mut(), iov_len: 0 }; MAX_IOVS], len: 0 }
    }

    /// Copies `cnt` iovecs from `addr`; false if there are too many or one cannot be read.
    fn read(&mut self, addr: u64, cnt: u64) -> bool {
        if cnt as usize > MAX_IOVS {
            return false;
        }
        for i in 0..cnt as usize {
            let at = addr + (i * std::mem::size_of::<libc::iovec>()) as u64;
            let Some(v) = read_user::<libc::iovec>(&mut crate::pin::Pin::none(), at) else { return false };
            self.v[i] = v;
        }
        self.len = cnt as usize;
        true
    }

    fn total_bytes(&self) -> u64 {
        self.v[..self.len].iter().map(|v| v.iov_len as u64).sum()
    }

    /// The iovecs of the `max_bytes` after the first `done_bytes`, into `out`; returns how
    /// many.
    fn window_into(&self, done_bytes: u64, max_bytes: u64, out: &mut Iovs) -> usize {
        let mut skip = done_bytes;
        let mut left = max_bytes;
        out.len = 0;
        for v in &self.v[..self.len] {
            let len = v.iov_len as u64;
            if skip >= len {
                skip -= len;
                continue;
            }
            if left == 0 {
                break;
            }
            let take = (len - skip).min(left);
            out.v[out.len] =
                libc::iovec { iov_base: (v.iov_base as u64 + skip) as *mut libc::c_void, iov_len: take as usize };
            out.len += 1;
            left -= take;
            skip = 0;
        }
        out.len
    }
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
}

/// The shape of transfer call `nr`, and whether it is a `read` or `readv`, which ends at its
/// first transfer unless its descriptor is a regular file (see [`kind`]).
fn shape(nr: c_long) -> Option<(Kind, bool)> {
    match nr {
        libc::SYS_write | libc::SYS_sendto => Some((Kind::Flat, false)),
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
/// an address.
fn kind(nr: c_long, a: &[u64; 6]) -> Option<(Kind, bool)> {
    if nr == libc::SYS_sendto && a[4] != 0 {
        return None;
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
    iovs: Iovs,
}

impl Transfer {
    /// The transfer call `nr` with arguments `a` asks for; `None` for calls that are not
    /// continued (see the module's comment).
    pub fn of(nr: libc::c_long, a: &[u64; 6]) -> Option<Transfer> {
        let (kind, once) = kind(nr, a)?;
        let mut iovs = Iovs::new();
        let total_bytes = match kind {
            Kind::Flat | Kind::FlatAt => a[2],
            Kind::Vec | Kind::VecAt => {
                if !iovs.read(a[1], a[2]) {
                    return None;
                }
                iovs.total_bytes()
            }
        };
        Some(Transfer { kind, once, total_bytes, iovs })
    }

    /// The arguments that transfer at most `max_bytes` of what is left after `done_bytes`
    /// (`iovs` holds the iovecs of a vector call, and must outlive the call).
    pub fn window(&self, a: &[u64; 6], done_bytes: u64, max_bytes: u64, iovs: &mut Iovs) -> [u64; 6] {
        debug_assert!(done_bytes < self.total_bytes, "nothing left after {done_bytes} bytes");
        let mut r = *a;
        let max_bytes = max_bytes.min(self.total_bytes - done_bytes);
        match self.kind {
            Kind::Flat | Kind::FlatAt => {
                r[1] = a[1] + done_bytes;
                r[2] = max_bytes;
            }
            Kind::Vec | Kind::VecAt => {
                let n = self.iovs.window_into(done_bytes, max_bytes, iovs);
                r[1] = iovs.v.as_ptr() as u64;
                r[2] = n as u64;
            }
        }
        // `-1` in `preadv2`/`pwritev2` means the file position, which the kernel moves on.
        if matches!(self.kind, Kind::FlatAt | Kind::VecAt) && a[3] as i64 != -1 {
            r[3] = a[3] + done_bytes;
        }
        r
    }

    /// Whether the transfer may be made in smaller calls without anyone seeing the
    /// difference: its descriptor is a byte stream (a regular file, a block or character
    /// device, a pipe not in packet mode, a stream socket), where two writes read back as
    /// one. A datagram split in two is two datagrams.
    pub fn splittable(&self, fd: u64) -> bool {
        let Some(file_type) = file_type(fd) else { return false };
        match file_type {
            libc::S_IFREG | libc::S_IFBLK | libc::S_IFCHR => true,
            libc::S_IFIFO => {
                // SAFETY: F_GETFL reads the descriptor's flags; no memory.
                let flags = unsafe { raw(libc::SYS_fcntl, [fd, libc::F_GETFL as u64, 0, 0, 0, 0]) };
                flags >= 0 && flags & libc::O_DIRECT as c_long == 0
            }
            libc::S_IFSOCK => {
                let mut ty: libc::c_int = 0;
                let mut len = std::mem::size_of::<libc::c_int>() as libc::socklen_t;
                let (level, name) = (libc::SOL_SOCKET as u64, libc::SO_TYPE as u64);
                let (p_ty, p_len) = (&mut ty as *mut libc::c_int as u64, &mut len as *mut libc::socklen_t as u64);
                // SAFETY: getsockopt writes one int into `ty` and its length into `len`, ours.
                let r = unsafe { raw(libc::SYS_getsockopt, [fd, level, name, p_ty, p_len, 0]) };
                r == 0 && ty == libc::SOCK_STREAM
            }
            _ => false,
        }
    }
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
        let r = t.window(&a, 14, u64::MAX, &mut rest);
        assert_eq!(r[2], 2);
        assert_eq!(rest.v[0].iov_base as u64, bufs[1].as_ptr() as u64 + 4);
        assert_eq!(rest.v[0].iov_len, 6);
        assert_eq!(rest.v[1].iov_len, 10);
        let r = t.window(&a, 5, 7, &mut rest);
        assert_eq!(r[2], 2);
        assert_eq!((rest.v[0].iov_base as u64, rest.v[0].iov_len), (bufs[0].as_ptr() as u64 + 5, 5));
        assert_eq!((rest.v[1].iov_base as u64, rest.v[1].iov_len), (bufs[1].as_ptr() as u64, 2));
    }

    #[test]
    fn positioned_calls_move_their_offset_and_reads_of_pipes_end_at_the_first_transfer() {
        let a = [1, 0x10000, 4106, 100, 0, 0];
        let t = Transfer::of(libc::SYS_pwrite64, &a).expect("pwrite64 is continued");
        let r = t.window(&a, 4096, u64::MAX, &mut Iovs::new());
        assert_eq!((r[1], r[2], r[3]), (0x10000 + 4096, 10, 4196));
        let r = t.window(&a, 0, 1000, &mut Iovs::new());
        assert_eq!((r[1], r[2], r[3]), (0x10000, 1000, 100));
        let mut fds = [0; 2];
        // SAFETY: pipe writes two descriptors into `fds`.
        assert_eq!(unsafe { libc::pipe(fds.as_mut_ptr()) }, 0);
        let r = Transfer::of(libc::SYS_read, &[fds[0] as u64, 0x10000, 10, 0, 0, 0]).expect("a pipe read");
        assert!(r.once, "a pipe read ends at its first transfer");
        let w = Transfer::of(libc::SYS_write, &[fds[1] as u64, 0x10000, 10, 0, 0, 0]).expect("a pipe write");
        assert!(w.splittable(fds[1] as u64));
        let mut dg = [0; 2];
        // SAFETY: socketpair writes two descriptors into `dg`, ours.
        assert_eq!(unsafe { libc::socketpair(libc::AF_UNIX, libc::SOCK_DGRAM, 0, dg.as_mut_ptr()) }, 0);
        assert!(!w.splittable(dg[0] as u64), "a datagram socket is not a byte stream");
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
