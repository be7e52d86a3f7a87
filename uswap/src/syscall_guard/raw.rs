//! The slow path's two ways to the kernel: a system call made directly, and a read of the
//! program's memory that a bad pointer cannot crash.

use libc::c_long;

/// Makes system call `nr` with `args`, directly.
///
/// # Safety
/// The call is one the program made itself (what it does to memory is its contract), or
/// one that writes only memory the caller owns.
pub(super) unsafe fn raw(nr: c_long, a: [u64; 6]) -> c_long {
    // SAFETY: the caller's contract.
    unsafe { crate::mapping::syscall6(nr, a) }
}

/// Reads a `T` at `addr` without trusting it: `None` where the kernel could not.
pub(super) fn read_user<T: Copy>(pin: &mut crate::pin::Pin, addr: u64) -> Option<T> {
    if addr == 0 {
        return None;
    }
    let mut out = std::mem::MaybeUninit::<T>::uninit();
    let len = std::mem::size_of::<T>();
    if crate::user_access::prepare_user_access(pin, addr as usize, len, false).is_some() {
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

/// The type of descriptor `fd`'s file (`st_mode & S_IFMT`), `None` if `fstat` fails.
pub(super) fn file_type(fd: u64) -> Option<libc::mode_t> {
    let mut st = std::mem::MaybeUninit::<libc::stat>::uninit();
    // SAFETY: fstat writes one `struct stat` into `st`, ours.
    let r = unsafe { raw(libc::SYS_fstat, [fd, st.as_mut_ptr() as u64, 0, 0, 0, 0]) };
    // SAFETY: the kernel filled it when it returned 0.
    (r == 0).then(|| unsafe { st.assume_init() }.st_mode & libc::S_IFMT)
}

/// Descriptor `fd`'s file status flags (`F_GETFL`: the access mode, `O_DIRECT`, ...), `None`
/// if it is not open.
pub(super) fn fd_flags(fd: u64) -> Option<c_long> {
    // SAFETY: F_GETFL reads the descriptor's flags; no memory.
    let flags = unsafe { raw(libc::SYS_fcntl, [fd, libc::F_GETFL as u64, 0, 0, 0, 0]) };
    (flags >= 0).then_some(flags)
}

/// Iovec `i` of the array at `addr` in the program's memory (pinned in `pin` if managed),
/// `None` if it cannot be read.
pub(super) fn iov_at(pin: &mut crate::pin::Pin, addr: u64, i: u64) -> Option<libc::iovec> {
    read_user::<libc::iovec>(pin, addr + i * std::mem::size_of::<libc::iovec>() as u64)
}

/// The capacity of the pipe (or FIFO) `fd` reads from, in bytes; `None` if `fd` is not one.
pub(super) fn pipe_capacity_bytes(fd: u64) -> Option<u64> {
    // SAFETY: `fcntl(F_GETPIPE_SZ)` reads a size; it fails with `EBADF` on anything but a pipe.
    let r = unsafe { raw(libc::SYS_fcntl, [fd, libc::F_GETPIPE_SZ as u64, 0, 0, 0, 0]) };
    u64::try_from(r).ok().filter(|&bytes| bytes > 0)
}

/// Whether `fd` is a socket of type `SOCK_STREAM` (TCP, a Unix stream socket).
pub(super) fn is_stream_socket(fd: u64) -> bool {
    let mut kind: libc::c_int = 0;
    let mut len = std::mem::size_of::<libc::c_int>() as libc::socklen_t;
    let (kind_at, len_at) = (std::ptr::addr_of_mut!(kind) as u64, std::ptr::addr_of_mut!(len) as u64);
    // SAFETY: `getsockopt(SO_TYPE)` writes an int and its length, both ours; `ENOTSOCK` on
    // anything but a socket.
    let r =
        unsafe { raw(libc::SYS_getsockopt, [fd, libc::SOL_SOCKET as u64, libc::SO_TYPE as u64, kind_at, len_at, 0]) };
    r == 0 && kind == libc::SOCK_STREAM
}

/// The bytes queued to be read on socket or pipe `fd` now (`FIONREAD`), 0 if it cannot say.
pub(super) fn queued_bytes(fd: u64) -> u64 {
    let mut bytes: libc::c_int = 0;
    // SAFETY: `ioctl(FIONREAD)` writes an int, ours.
    let r = unsafe { raw(libc::SYS_ioctl, [fd, libc::FIONREAD, std::ptr::addr_of_mut!(bytes) as u64, 0, 0, 0]) };
    if r == 0 {
        u64::try_from(bytes).unwrap_or(0)
    } else {
        0
    }
}

/// Whether descriptor `fd` is a regular file.
pub(super) fn is_regular_file(fd: u64) -> bool {
    file_type(fd) == Some(libc::S_IFREG)
}
