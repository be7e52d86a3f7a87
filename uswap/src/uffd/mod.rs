//! The userfaultfd layer: the kernel ABI, the handshake and the ioctls.
//!
//! Everything here is a thin, typed wrapper over one system call. The Debian headers on our
//! machines predate `UFFDIO_MOVE` (Linux 6.8), so the ABI is written out here from
//! `include/uapi/linux/userfaultfd.h` rather than generated.
//!
//! Locking: none. A [`Uffd`] is a file descriptor; every method is a single ioctl that the
//! kernel serialises itself, so it may be called from any thread and from a signal handler
//! (no allocation, no lock, `errno` is read immediately after the call).
//!
//! Invariants: a [`Uffd`] has completed the `UFFDIO_API` handshake with the features it was
//! opened for before any other ioctl is issued on it.

pub mod sigbus;
pub mod signal_guard;

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicU64, Ordering};

pub const PAGE_SIZE: usize = 4096;

const UFFDIO: u32 = 0xAA;
const UFFD_API: u64 = 0xAA;

const fn ioc(dir: u32, nr: u32, size: usize) -> libc::c_ulong {
    ((dir << 30) | ((size as u32) << 16) | (UFFDIO << 8) | nr) as libc::c_ulong
}
const IOC_WRITE: u32 = 1;
const IOC_READ: u32 = 2;
const fn iowr(nr: u32, size: usize) -> libc::c_ulong {
    ioc(IOC_READ | IOC_WRITE, nr, size)
}
const fn ior(nr: u32, size: usize) -> libc::c_ulong {
    ioc(IOC_READ, nr, size)
}

// Feature bits (uapi `UFFD_FEATURE_*`).
/// The application moved part of a registered range (`mremap`): `UFFD_EVENT_REMAP`.
pub const FEATURE_EVENT_REMAP: u64 = 1 << 2;
/// The application discarded part of a registered range (`MADV_DONTNEED`, `MADV_REMOVE`):
/// `UFFD_EVENT_REMOVE`, sent before the pages are zapped.
pub const FEATURE_EVENT_REMOVE: u64 = 1 << 3;
/// The application unmapped part of a registered range (`munmap`, `MAP_FIXED` over it, a
/// shrinking `mremap`): `UFFD_EVENT_UNMAP`, sent after the unmap.
pub const FEATURE_EVENT_UNMAP: u64 = 1 << 6;
pub const FEATURE_SIGBUS: u64 = 1 << 7;
pub const FEATURE_THREAD_ID: u64 = 1 << 8;
pub const FEATURE_WP_ASYNC: u64 = 1 << 15;
pub const FEATURE_MOVE: u64 = 1 << 16;

pub const REGISTER_MODE_MISSING: u64 = 1 << 0;
pub const REGISTER_MODE_WP: u64 = 1 << 1;

const COPY_MODE_DONTWAKE: u64 = 1 << 0;
const COPY_MODE_WP: u64 = 1 << 1;
const ZEROPAGE_MODE_DONTWAKE: u64 = 1 << 0;
const MOVE_MODE_DONTWAKE: u64 = 1 << 0;
const WRITEPROTECT_MODE_WP: u64 = 1 << 0;
const WRITEPROTECT_MODE_DONTWAKE: u64 = 1 << 1;

const EVENT_PAGEFAULT: u8 = 0x12;
const EVENT_REMAP: u8 = 0x14;
const EVENT_REMOVE: u8 = 0x15;
const EVENT_UNMAP: u8 = 0x16;
const PAGEFAULT_FLAG_WRITE: u64 = 1 << 0;

/// `UFFD_USER_MODE_ONLY`: only faults from user mode are delivered. Allowed to unprivileged
/// users when `vm.unprivileged_userfaultfd` is 0, which is enough for signal mode.
const UFFD_USER_MODE_ONLY: libc::c_int = 1;
/// `USERFAULTFD_IOC_NEW` on `/dev/userfaultfd` (Linux 6.1).
const USERFAULTFD_IOC_NEW: libc::c_ulong = (UFFDIO << 8) as libc::c_ulong;

#[repr(C)]
struct UffdioApi {
    api: u64,
    features: u64,
    ioctls: u64,
}
#[repr(C)]
#[derive(Clone, Copy)]
struct UffdioRange {
    start: u64,
    len: u64,
}
#[repr(C)]
struct UffdioRegister {
    range: UffdioRange,
    mode: u64,
    ioctls: u64,
}
#[repr(C)]
struct UffdioCopy {
    dst: u64,
    src: u64,
    len: u64,
    mode: u64,
    copy: i64,
}
#[repr(C)]
struct UffdioZeropage {
    range: UffdioRange,
    mode: u64,
    zeropage: i64,
}
#[repr(C)]
struct UffdioWriteprotect {
    range: UffdioRange,
    mode: u64,
}
#[repr(C)]
struct UffdioMove {
    dst: u64,
    src: u64,
    len: u64,
    mode: u64,
    moved: i64,
}

const UFFDIO_API: libc::c_ulong = iowr(0x3F, std::mem::size_of::<UffdioApi>());
const UFFDIO_REGISTER: libc::c_ulong = iowr(0x00, std::mem::size_of::<UffdioRegister>());
const UFFDIO_UNREGISTER: libc::c_ulong = ior(0x01, std::mem::size_of::<UffdioRange>());
const UFFDIO_WAKE: libc::c_ulong = ior(0x02, std::mem::size_of::<UffdioRange>());
const UFFDIO_COPY: libc::c_ulong = iowr(0x03, std::mem::size_of::<UffdioCopy>());
const UFFDIO_ZEROPAGE: libc::c_ulong = iowr(0x04, std::mem::size_of::<UffdioZeropage>());
const UFFDIO_MOVE: libc::c_ulong = iowr(0x05, std::mem::size_of::<UffdioMove>());
const UFFDIO_WRITEPROTECT: libc::c_ulong = iowr(0x06, std::mem::size_of::<UffdioWriteprotect>());

/// A message read from the descriptor (`struct uffd_msg`, 32 bytes), raw: decode it once
/// with [`UffdMsg::event`].
#[repr(C)]
#[derive(Clone, Copy, Default)]
pub struct UffdMsg {
    event: u8,
    reserved1: u8,
    reserved2: u16,
    reserved3: u32,
    /// `arg.pagefault.flags` for `EVENT_PAGEFAULT`.
    pf_flags: u64,
    /// `arg.pagefault.address`.
    pf_address: u64,
    pf_ptid: u32,
    reserved4: u32,
}
const _: () = assert!(std::mem::size_of::<UffdMsg>() == 32);

/// A message from the kernel, decoded: the events this engine enables, and anything else
/// by its raw code (which no enabled feature sends).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Event {
    /// A fault on the page at `addr` (page-aligned) by thread `tid`; `write` for a write
    /// access (or a write to a write-protected page).
    PageFault { addr: usize, write: bool, tid: u32 },
    /// `mremap` moved `[from, from + len)` to `to` (`UFFD_EVENT_REMAP`).
    Remap { from: usize, to: usize, len: usize },
    /// `MADV_DONTNEED`/`MADV_REMOVE` of `[start, end)`, sent before the pages are zapped.
    Remove { start: usize, end: usize },
    /// `munmap` (or `MAP_FIXED` over it, a shrinking `mremap`) of `[start, end)`, sent after.
    Unmap { start: usize, end: usize },
    /// A message of another kind (`UFFD_EVENT_FORK` is never enabled here).
    Other(u8),
}

impl UffdMsg {
    /// The message, decoded.
    pub fn event(&self) -> Event {
        match self.event {
            EVENT_PAGEFAULT => Event::PageFault {
                addr: self.pf_address as usize & !(PAGE_SIZE - 1),
                write: self.pf_flags & PAGEFAULT_FLAG_WRITE != 0,
                tid: self.pf_ptid,
            },
            EVENT_REMAP => Event::Remap {
                from: self.pf_flags as usize,
                to: self.pf_address as usize,
                len: (self.pf_ptid as u64 | (self.reserved4 as u64) << 32) as usize,
            },
            EVENT_REMOVE => Event::Remove { start: self.pf_flags as usize, end: self.pf_address as usize },
            EVENT_UNMAP => Event::Unmap { start: self.pf_flags as usize, end: self.pf_address as usize },
            other => Event::Other(other),
        }
    }

    /// Whether this is a page fault (cheaper than decoding it).
    pub fn is_page_fault(&self) -> bool {
        self.event == EVENT_PAGEFAULT
    }
}

/// Why the descriptor could not be opened: the caller turns this into a user-facing error.
#[derive(Debug)]
pub enum OpenError {
    /// Neither the system call nor `/dev/userfaultfd` was allowed.
    Denied {
        syscall: io::Error,
        dev: io::Error,
    },
    /// The kernel has no userfaultfd at all.
    Unsupported(io::Error),
    /// The process (`EMFILE`) or the system (`ENFILE`) has no descriptor left.
    NoDescriptors(io::Error),
    /// The handshake failed or lacks a feature we need.
    MissingFeatures {
        wanted: u64,
        available: u64,
    },
    Other(io::Error),
}

/// An open, handshaken userfaultfd.
#[derive(Debug)]
pub struct Uffd {
    /// Registered while `fd` is open (released first by the drop, see `crate::fd`).
    kept: crate::fd::Kept,
    /// Closed by the drop only while its number names it (a userfaultfd's inode is its
    /// own) and the keeper did not find it closed (`fd::Keeper`).
    fd: crate::fd::ClosedIfStillOurs<OwnedFd>,
    /// `UFFDIO_MOVE` calls that reported a page as not moved although it was (see
    /// [`Uffd::move_pages`]).
    move_misreports: AtomicU64,
    /// The hold on the file where the program cannot close it (library APIs).
    keeper: crate::fd::Keeper,
    /// Whether the destinations of its moves may hold the kernel's zero page, which the
    /// program mapped by reading them (the staging areas'; see [`Uffd::move_pages`]).
    zero_page_destinations: bool,
    /// The features asked for at the handshake (`FEATURE_*`).
    features: u64,
}

/// Outcome of a range ioctl that may stop part-way (`COPY`, `ZEROPAGE`, `MOVE`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RangeResult {
    /// The whole range was handled.
    Done,
    /// `done_bytes` were handled, then the ioctl failed with `errno`.
    Partial { done_bytes: usize, errno: i32 },
}

impl RangeResult {
    pub fn done_bytes(self, len: usize) -> usize {
        match self {
            RangeResult::Done => len,
            RangeResult::Partial { done_bytes, .. } => done_bytes,
        }
    }
}

/// Whether the page at `addr` (page-aligned) is mapped (`mincore(2)`; the shared zero page
/// counts). Allocation-free, for the signal-mode fault path.
fn page_present(addr: usize) -> bool {
    let mut v = 0u8;
    // SAFETY: mincore writes one byte per page of the one-page range starting at the
    // page-aligned `addr` into `v`; it reads nothing of ours.
    let r = unsafe { libc::mincore(addr as *mut libc::c_void, PAGE_SIZE, &mut v) };
    r == 0 && v & 1 != 0
}

/// Whether the page at `addr` (page-aligned) is a page of this process's own, by
/// `/proc/self/pagemap`: present and mapped by this process alone (bit 63 and bit 56), or
/// swapped out or migrating (bit 62). A page `UFFDIO_MOVE` put there is (it moves only pages
/// mapped once); an empty entry and the kernel's zero page are not. None if the file cannot
/// be read (no `/proc`, no descriptor left, a process made non-dumpable). Raw system calls,
/// no allocation: async-signal-safe, and no cancellation point (a thread cancelled inside
/// the C library's `open` would unwind out of the engine).
pub fn page_is_own(addr: usize) -> Option<bool> {
    const PRESENT: u64 = 1 << 63;
    const SWAPPED: u64 = 1 << 62;
    const EXCLUSIVE: u64 = 1 << 56;
    let path = c"/proc/self/pagemap";
    // SAFETY: openat(2) of a NUL-terminated path; the descriptor is closed below.
    let fd =
        unsafe { libc::syscall(libc::SYS_openat, libc::AT_FDCWD, path.as_ptr(), libc::O_RDONLY | libc::O_CLOEXEC) };
    if fd < 0 {
        return None;
    }
    let mut entry = 0u64;
    let offset = (addr / PAGE_SIZE * 8) as libc::off_t;
    // SAFETY: reads at most 8 bytes into `entry`; `fd` is ours until the close.
    let got =
        unsafe { libc::syscall(libc::SYS_pread64, fd, (&mut entry as *mut u64).cast::<libc::c_void>(), 8, offset) };
    // SAFETY: closes the descriptor opened above, which nothing else uses.
    unsafe { libc::syscall(libc::SYS_close, fd) };
    (got == 8).then_some(entry & SWAPPED != 0 || entry & (PRESENT | EXCLUSIVE) == PRESENT | EXCLUSIVE)
}

fn raw_userfaultfd(flags: libc::c_int) -> io::Result<OwnedFd> {
    // SAFETY: userfaultfd(2) takes an int of flags and returns a new descriptor or -1; it does
    // not touch our memory.
    let fd = unsafe { libc::syscall(libc::SYS_userfaultfd, flags) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: the kernel just returned this descriptor to us; nobody else owns it.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as RawFd) })
}

fn dev_userfaultfd(flags: libc::c_int) -> io::Result<OwnedFd> {
    let dev = std::fs::OpenOptions::new().read(true).write(true).open("/dev/userfaultfd")?;
    // SAFETY: USERFAULTFD_IOC_NEW takes the userfaultfd flags by value and returns a new fd.
    let fd = unsafe { libc::ioctl(dev.as_raw_fd(), USERFAULTFD_IOC_NEW, flags) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: a fresh descriptor owned by nobody else.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

fn open_fd(flags: libc::c_int, user_mode_only_ok: bool) -> Result<OwnedFd, OpenError> {
    let syscall_err = match raw_userfaultfd(flags) {
        Ok(fd) => return Ok(fd),
        Err(e) if e.raw_os_error() == Some(libc::ENOSYS) => return Err(OpenError::Unsupported(e)),
        // Not a permission problem: /dev/userfaultfd would need a descriptor too.
        Err(e) if matches!(e.raw_os_error(), Some(libc::EMFILE | libc::ENFILE)) => {
            return Err(OpenError::NoDescriptors(e))
        }
        Err(e) => e,
    };
    if user_mode_only_ok && syscall_err.raw_os_error() == Some(libc::EPERM) {
        if let Ok(fd) = raw_userfaultfd(flags | UFFD_USER_MODE_ONLY) {
            return Ok(fd);
        }
    }
    match dev_userfaultfd(flags) {
        Ok(fd) => Ok(fd),
        Err(dev) => Err(OpenError::Denied { syscall: syscall_err, dev }),
    }
}

fn api_handshake(fd: &OwnedFd, features: u64) -> io::Result<u64> {
    let mut api = UffdioApi { api: UFFD_API, features, ioctls: 0 };
    // SAFETY: UFFDIO_API reads and writes exactly one `struct uffdio_api`, which `api` is.
    let r = unsafe { libc::ioctl(fd.as_raw_fd(), UFFDIO_API, &mut api) };
    if r < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(api.features)
}

impl Drop for Uffd {
    fn drop(&mut self) {
        // Unregistered before `fd` closes (as a field, after this).
        self.kept.release();
        if self.keeper.number_lost() {
            // The number may be a file of the program's now: closing it would close that.
            self.fd.give_up();
        }
    }
}

impl Uffd {
    /// Whether the descriptor's number still names this userfaultfd: a program that closed
    /// descriptors it did not open (`close_range`) and opened files of its own may have one
    /// under the number, which an ioctl would then be sent to. An `fstat`, no allocation:
    /// callable from the SIGBUS handler.
    pub fn still_ours(&self) -> bool {
        self.fd.still_ours()
    }

    /// The features this kernel offers, probed on a throwaway descriptor (the handshake can
    /// only be done once per descriptor).
    pub fn probe_features(user_mode_only_ok: bool) -> Result<u64, OpenError> {
        let fd = open_fd(libc::O_CLOEXEC, user_mode_only_ok)?;
        api_handshake(&fd, 0).map_err(OpenError::Other)
    }

    /// Opens a descriptor and completes the handshake asking for `features`.
    pub fn open(features: u64, nonblocking: bool, user_mode_only_ok: bool) -> Result<Uffd, OpenError> {
        let available = Self::probe_features(user_mode_only_ok)?;
        if available & features != features {
            return Err(OpenError::MissingFeatures { wanted: features, available });
        }
        let flags = libc::O_CLOEXEC | if nonblocking { libc::O_NONBLOCK } else { 0 };
        let fd = crate::fd::relocate(open_fd(flags, user_mode_only_ok)?);
        api_handshake(&fd, features).map_err(OpenError::Other)?;
        Ok(Uffd {
            kept: crate::fd::keep(fd.as_raw_fd()),
            fd: crate::fd::ClosedIfStillOurs::new(fd),
            move_misreports: AtomicU64::new(0),
            keeper: crate::fd::Keeper::new(),
            zero_page_destinations: false,
            features,
        })
    }

    /// Whether the kernel tells this descriptor of discards in its registered ranges
    /// (`UFFD_EVENT_REMOVE`). Where it does not, nothing may drop pages there but what tells
    /// the engine itself (see `crate::events`), and reclaim may drop clean pages in place.
    pub fn sends_remove_events(&self) -> bool {
        self.features & FEATURE_EVENT_REMOVE != 0
    }

    /// Declares that the destinations of this descriptor's moves may hold the kernel's zero
    /// page where the program read them (the staging areas: see [`Uffd::move_pages`]).
    pub fn with_zero_page_destinations(mut self) -> Uffd {
        self.zero_page_destinations = true;
        self
    }

    pub fn raw_fd(&self) -> RawFd {
        self.fd.as_raw_fd()
    }

    /// What keeps this descriptor's file open where the program closes its number (see
    /// [`crate::fd::Keeper`]).
    pub fn keeper(&self) -> &crate::fd::Keeper {
        &self.keeper
    }

    /// Registers `[start, start + len)` in `mode` (`REGISTER_MODE_*`).
    pub fn register(&self, start: usize, len: usize, mode: u64) -> io::Result<()> {
        let mut reg = UffdioRegister { range: UffdioRange { start: start as u64, len: len as u64 }, mode, ioctls: 0 };
        // SAFETY: UFFDIO_REGISTER reads and writes one `struct uffdio_register`. Registering a
        // range changes how faults in it are delivered, never its contents.
        let r = unsafe { libc::ioctl(self.raw_fd(), UFFDIO_REGISTER, &mut reg) };
        if r < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(())
    }

    /// Unregisters `[start, start + len)`: faults there are the kernel's again, and unmapping
    /// it sends no event.
    pub fn unregister(&self, start: usize, len: usize) -> io::Result<()> {
        let range = UffdioRange { start: start as u64, len: len as u64 };
        // SAFETY: UFFDIO_UNREGISTER reads one `struct uffdio_range`; it changes how faults in
        // the range are delivered, never its contents.
        let r = unsafe { libc::ioctl(self.raw_fd(), UFFDIO_UNREGISTER, &range) };
        if r < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(())
    }

    /// Wakes threads blocked on faults in the range (after a fault was resolved by someone
    /// else, or with a `DONTWAKE` operation).
    pub fn wake(&self, start: usize, len: usize) -> io::Result<()> {
        let range = UffdioRange { start: start as u64, len: len as u64 };
        // SAFETY: UFFDIO_WAKE reads one `struct uffdio_range`.
        let r = unsafe { libc::ioctl(self.raw_fd(), UFFDIO_WAKE, &range) };
        if r < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(())
    }

    /// Retries an ioctl on `EAGAIN` (the kernel asks for it while mappings change under a
    /// non-cooperative event) and turns its result into a [`RangeResult`].
    #[inline]
    fn range_ioctl(len: usize, mut f: impl FnMut(usize) -> (i32, i64)) -> RangeResult {
        let mut done = 0usize;
        // Bounded: each EAGAIN round either makes progress or is a transient mapping change.
        for _ in 0..1000 {
            let (r, progress) = f(done);
            let errno = if r < 0 { io::Error::last_os_error().raw_os_error().unwrap_or(libc::EIO) } else { 0 };
            if progress > 0 {
                done += progress as usize;
            }
            if r == 0 || done >= len {
                return RangeResult::Done;
            }
            if errno != libc::EAGAIN {
                return RangeResult::Partial { done_bytes: done, errno };
            }
        }
        RangeResult::Partial { done_bytes: done, errno: libc::EAGAIN }
    }

    /// Maps a copy of `len` bytes at `src` at `dst` (`UFFDIO_COPY`). `src` may be any readable
    /// memory that is not registered with this descriptor.
    pub fn copy(&self, dst: usize, src: *const u8, len: usize, wake: bool, write_protect: bool) -> RangeResult {
        let mode = if wake { 0 } else { COPY_MODE_DONTWAKE } | if write_protect { COPY_MODE_WP } else { 0 };
        Self::range_ioctl(len, |done| {
            let mut c = UffdioCopy {
                dst: (dst + done) as u64,
                src: src as u64 + done as u64,
                len: (len - done) as u64,
                mode,
                copy: 0,
            };
            // SAFETY: UFFDIO_COPY reads and writes one `struct uffdio_copy`; the kernel reads
            // `len` bytes at `src` with copy_from_user, so a bad `src` gives EFAULT, never UB.
            let r = unsafe { libc::ioctl(self.raw_fd(), UFFDIO_COPY, &mut c) };
            (r, c.copy)
        })
    }

    /// Maps the shared zero page over `[dst, dst + len)` (`UFFDIO_ZEROPAGE`).
    pub fn zeropage(&self, dst: usize, len: usize, wake: bool) -> RangeResult {
        let mode = if wake { 0 } else { ZEROPAGE_MODE_DONTWAKE };
        Self::range_ioctl(len, |done| {
            let mut z = UffdioZeropage {
                range: UffdioRange { start: (dst + done) as u64, len: (len - done) as u64 },
                mode,
                zeropage: 0,
            };
            // SAFETY: UFFDIO_ZEROPAGE reads and writes one `struct uffdio_zeropage`.
            let r = unsafe { libc::ioctl(self.raw_fd(), UFFDIO_ZEROPAGE, &mut z) };
            (r, z.zeropage)
        })
    }

    /// Moves the pages mapped at `[src, src + len)` to `dst` without copying (`UFFDIO_MOVE`).
    /// `dst` must be registered with this descriptor and unmapped; `src` must be fully mapped.
    pub fn move_pages(&self, dst: usize, src: usize, len: usize, wake: bool) -> RangeResult {
        let mode = if wake { 0 } else { MOVE_MODE_DONTWAKE };
        let mut base = 0usize;
        // Bounded: every round that does not return moves `base` on by at least a page.
        loop {
            let r = Self::range_ioctl(len - base, |done| {
                let at = base + done;
                let mut m = UffdioMove {
                    dst: (dst + at) as u64,
                    src: (src + at) as u64,
                    len: (len - at) as u64,
                    mode,
                    moved: 0,
                };
                // SAFETY: UFFDIO_MOVE reads and writes one `struct uffdio_move`. It remaps page
                // table entries atomically; content is preserved, nothing in our address space
                // is freed or aliased.
                let r = unsafe { libc::ioctl(self.raw_fd(), UFFDIO_MOVE, &mut m) };
                (r, m.moved)
            });
            let RangeResult::Partial { done_bytes, errno } = r else { return RangeResult::Done };
            base += done_bytes;
            // Linux 6.18's batched UFFDIO_MOVE can move pages after an internal -EAGAIN retry
            // without counting them, and then fail on the page it already moved: EEXIST (the
            // destination holds it) or ENOENT (the source is empty). Observed on these VMs
            // about once per million pages. The end state is what was asked for, so it counts
            // as moved; the kernel woke nobody for it, so wake here. Where destinations may
            // hold the kernel's zero page a program's read left there (a staging area), the
            // page must be one that was moved: the process's own (where pagemap cannot be
            // read, mapped at all, as elsewhere; a region's destination is an empty entry).
            if (errno == libc::EEXIST || errno == libc::ENOENT)
                && !page_present(src + base)
                && self.moved_here(dst + base)
            {
                self.move_misreports.fetch_add(1, Ordering::Relaxed);
                if wake {
                    let _ = self.wake(dst + base, PAGE_SIZE);
                }
                base += PAGE_SIZE;
                if base >= len {
                    return RangeResult::Done;
                }
                continue;
            }
            return RangeResult::Partial { done_bytes: base, errno };
        }
    }

    /// Whether a page at `dst`, a destination a move reported as failed, is one it moved
    /// (see [`Uffd::move_pages`]).
    fn moved_here(&self, dst: usize) -> bool {
        if self.zero_page_destinations {
            page_is_own(dst).unwrap_or_else(|| page_present(dst))
        } else {
            page_present(dst)
        }
    }

    /// Moves the kernel reported as failed although they had happened (see `move_pages`).
    pub fn move_misreports(&self) -> u64 {
        self.move_misreports.load(Ordering::Relaxed)
    }

    /// Sets or clears userfaultfd write protection on a range (clearing it wakes threads
    /// waiting on write-protect faults there, unless `wake` is false).
    pub fn writeprotect(&self, start: usize, len: usize, protect: bool, wake: bool) -> io::Result<()> {
        let mut mode = if protect { WRITEPROTECT_MODE_WP } else { 0 };
        if !wake {
            mode |= WRITEPROTECT_MODE_DONTWAKE;
        }
        let wp = UffdioWriteprotect { range: UffdioRange { start: start as u64, len: len as u64 }, mode };
        // SAFETY: UFFDIO_WRITEPROTECT reads one `struct uffdio_writeprotect`; it changes page
        // permissions, never contents.
        let r = unsafe { libc::ioctl(self.raw_fd(), UFFDIO_WRITEPROTECT, &wp) };
        if r < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(())
    }

    /// Reads up to `msgs.len()` messages. Returns how many were read; 0 when the descriptor is
    /// non-blocking and nothing is pending.
    pub fn read_msgs(&self, msgs: &mut [UffdMsg]) -> io::Result<usize> {
        let bytes = std::mem::size_of_val(msgs);
        // SAFETY: `msgs` is a writable buffer of `bytes` bytes of plain-old-data messages.
        let r = unsafe { libc::read(self.raw_fd(), msgs.as_mut_ptr().cast(), bytes) };
        if r < 0 {
            let e = io::Error::last_os_error();
            if e.raw_os_error() == Some(libc::EAGAIN) {
                return Ok(0);
            }
            return Err(e);
        }
        Ok(r as usize / std::mem::size_of::<UffdMsg>())
    }
}

/// The kernel release string (`uname -r`), for error messages.
pub fn kernel_release() -> String {
    // SAFETY: `utsname` is plain data; uname fills it and NUL-terminates every field.
    unsafe {
        let mut u: libc::utsname = std::mem::zeroed();
        if libc::uname(&mut u) != 0 {
            return "unknown".into();
        }
        std::ffi::CStr::from_ptr(u.release.as_ptr()).to_string_lossy().into_owned()
    }
}

/// An eventfd that wakes handler threads blocked in [`poll_fault_or_doorbell_for`] (shutdown).
#[derive(Debug)]
pub struct Doorbell {
    /// Registered while `fd` is open (released first by the drop, see `crate::fd`).
    kept: crate::fd::Kept,
    /// Closed and rung only while its number names it. An eventfd's inode is shared by
    /// every eventfd (and epoll, timerfd...): the keeper's `kcmp` says more, where there is
    /// one ([`Doorbell::give_up_number`]).
    fd: crate::fd::ClosedIfStillOurs<OwnedFd>,
}

impl Drop for Doorbell {
    fn drop(&mut self) {
        // Unregistered before `fd` closes (as a field, after this).
        self.kept.release();
    }
}

impl Doorbell {
    pub fn new() -> io::Result<Doorbell> {
        // SAFETY: eventfd(2) returns a new descriptor or -1; no memory is touched.
        let fd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC | libc::EFD_NONBLOCK) };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: a fresh descriptor owned by nobody else.
        let fd = crate::fd::relocate(unsafe { OwnedFd::from_raw_fd(fd) });
        Ok(Doorbell { kept: crate::fd::keep(fd.as_raw_fd()), fd: crate::fd::ClosedIfStillOurs::new(fd) })
    }

    /// The number names another file now (the keeper found it so): the drop leaves it open.
    pub fn give_up_number(&self) {
        self.fd.give_up();
    }

    /// The eventfd's number (the descriptor keeper holds it too, `crate::fd::Keeper`).
    pub fn raw_fd(&self) -> RawFd {
        self.fd.as_raw_fd()
    }

    /// Makes every current and future poll on the doorbell return. Rings nothing where the
    /// number names another file (the program closed ours and reused it): 8 bytes would go
    /// into the program's file.
    pub fn ring(&self) {
        self.fd.ring_if_still_ours();
    }
}

/// While alive, the calling thread's asynchronous signals are blocked (all but the
/// synchronous SIGBUS, SIGSEGV, SIGILL, SIGFPE, SIGTRAP and SIGSYS); the previous mask comes
/// back on drop. Engine calls that hold busy bits or spin locks in the application's thread
/// (`set_resident_limit`, `map`, `stats`, a region's drop) take one, so that an application
/// signal handler never runs, and faults on a managed page, while its own thread owns what
/// that fault needs: in signal mode the nested fault would wait for its own thread; in
/// thread mode the handler thread would wait for the interrupted thread, which waits for
/// the handler thread. Two `rt_sigprocmask` calls (well under a microsecond), cheap next to
/// those calls. Signals sent meanwhile stay pending and run when the call returns.
pub struct AsyncSignalsBlocked {
    old: libc::sigset_t,
    /// Not `Send`: the mask belongs to the thread that made the guard.
    _thread: std::marker::PhantomData<*const ()>,
}

impl AsyncSignalsBlocked {
    // No `Default`: making one changes the thread's signal mask, which a default should not.
    #[allow(clippy::new_without_default)]
    pub fn new() -> AsyncSignalsBlocked {
        ASYNC_SIGNALS_BLOCKED.with(|d| d.set(d.get() + 1));
        // SAFETY: sigset_t is plain data; the calls fill and read sets we own, and
        // pthread_sigmask changes only the calling thread's mask.
        unsafe {
            let mut set: libc::sigset_t = std::mem::zeroed();
            libc::sigfillset(&mut set);
            for sig in [libc::SIGBUS, libc::SIGSEGV, libc::SIGILL, libc::SIGFPE, libc::SIGTRAP, libc::SIGSYS] {
                libc::sigdelset(&mut set, sig);
            }
            let mut old: libc::sigset_t = std::mem::zeroed();
            libc::pthread_sigmask(libc::SIG_BLOCK, &set, &mut old);
            AsyncSignalsBlocked { old, _thread: std::marker::PhantomData }
        }
    }
}

impl Drop for AsyncSignalsBlocked {
    fn drop(&mut self) {
        // SAFETY: restores the mask `new` saved, on the same thread (the guard is not Send).
        unsafe { libc::pthread_sigmask(libc::SIG_SETMASK, &self.old, std::ptr::null_mut()) };
        ASYNC_SIGNALS_BLOCKED.with(|d| d.set(d.get() - 1));
    }
}

thread_local! {
    /// How many [`AsyncSignalsBlocked`] this thread holds. Const-initialised, no destructor:
    /// read in signal handlers.
    static ASYNC_SIGNALS_BLOCKED: std::cell::Cell<u32> = const { std::cell::Cell::new(0) };
}

/// Whether the engine holds this thread's asynchronous signals off ([`AsyncSignalsBlocked`]):
/// outside the SIGBUS handler too (a system call's preparation, a munmap's release), a long
/// wait there lets the signals that end the process through (`sigbus::let_stop_signals_through`).
pub fn async_signals_blocked_by_engine() -> bool {
    ASYNC_SIGNALS_BLOCKED.with(|d| d.get() > 0)
}

/// What ended a wait in [`poll_fault_or_doorbell_for`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Wake {
    /// The userfaultfd has a message to read.
    Message,
    /// The doorbell rang, the wait timed out, or a signal interrupted it.
    Other,
    /// This descriptor, the userfaultfd or the doorbell, is not open any more (`POLLNVAL`):
    /// the program closed a descriptor it did not open. See [`crate::fd::Keeper`].
    Closed(RawFd),
}

/// The longest a wait in [`poll_fault_or_doorbell_for`] sleeps: where the program closed
/// the pager's numbers and put files of its own under them, a ring of the doorbell (by the
/// keeper, through its own table) wakes the sleeper, but a poll returns only for the files
/// now under the numbers; the caller looks at its shutdown flag this often.
const LONGEST_WAIT_MS: i32 = 1000;

/// Blocks until the userfaultfd has a message or the doorbell rang, for at most
/// `timeout_ms` (-1: [`LONGEST_WAIT_MS`]).
pub fn poll_fault_or_doorbell_for(uffd: &Uffd, bell: &Doorbell, timeout_ms: i32) -> Wake {
    if uffd.keeper().is_closed() {
        // The keeper found the number closed or reused: nothing under it is ours to poll.
        return Wake::Closed(uffd.raw_fd());
    }
    let timeout_ms = if timeout_ms < 0 { LONGEST_WAIT_MS } else { timeout_ms.min(LONGEST_WAIT_MS) };
    let mut fds = [
        libc::pollfd { fd: uffd.raw_fd(), events: libc::POLLIN, revents: 0 },
        libc::pollfd { fd: bell.fd.as_raw_fd(), events: libc::POLLIN, revents: 0 },
    ];
    // SAFETY: poll reads and writes the two pollfd structures we own.
    let r = unsafe { libc::poll(fds.as_mut_ptr(), 2, timeout_ms) };
    if r <= 0 {
        return Wake::Other;
    }
    // Without this, a closed descriptor makes every poll return at once: the caller spun on
    // a CPU for the rest of the process's life.
    if let Some(closed) = fds.iter().find(|p| p.revents & libc::POLLNVAL != 0) {
        return Wake::Closed(closed.fd);
    }
    if fds[0].revents & libc::POLLIN != 0 {
        Wake::Message
    } else {
        Wake::Other
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mapping::{MapOptions, Mapping};

    #[test]
    fn messages_decode_once_into_typed_events() {
        let fault = UffdMsg {
            event: EVENT_PAGEFAULT,
            pf_flags: PAGEFAULT_FLAG_WRITE,
            pf_address: 0x7f00_1234_5678,
            pf_ptid: 42,
            ..Default::default()
        };
        assert!(fault.is_page_fault());
        assert_eq!(fault.event(), Event::PageFault { addr: 0x7f00_1234_5000, write: true, tid: 42 });
        let read = UffdMsg { event: EVENT_PAGEFAULT, pf_address: 0x1000, ..Default::default() };
        assert_eq!(read.event(), Event::PageFault { addr: 0x1000, write: false, tid: 0 });
        // A remap's length is 64 bits, split over the last two words.
        let remap = UffdMsg {
            event: EVENT_REMAP,
            pf_flags: 0x10_0000,
            pf_address: 0x20_0000,
            pf_ptid: 0x1000,
            reserved4: 1,
            ..Default::default()
        };
        assert!(!remap.is_page_fault());
        assert_eq!(remap.event(), Event::Remap { from: 0x10_0000, to: 0x20_0000, len: (1 << 32) | 0x1000 });
        let remove = UffdMsg { event: EVENT_REMOVE, pf_flags: 0x1000, pf_address: 0x3000, ..Default::default() };
        assert_eq!(remove.event(), Event::Remove { start: 0x1000, end: 0x3000 });
        let unmap = UffdMsg { event: EVENT_UNMAP, pf_flags: 0x1000, pf_address: 0x3000, ..Default::default() };
        assert_eq!(unmap.event(), Event::Unmap { start: 0x1000, end: 0x3000 });
        assert_eq!(UffdMsg { event: 0x13, ..Default::default() }.event(), Event::Other(0x13));
    }

    /// A move the kernel already did (the page sits at the destination, the source is empty)
    /// reads back as done, not as EEXIST: what `move_pages` does about Linux 6.18 losing the
    /// count of a batched move.
    #[test]
    fn a_move_already_done_counts_as_done() {
        // As the staging areas' descriptor: its destinations may hold the zero page.
        let uffd = Uffd::open(FEATURE_MOVE, true, true)
            .expect("userfaultfd with UFFD_FEATURE_MOVE")
            .with_zero_page_destinations();
        let opts = MapOptions { no_huge_pages: true, dont_fork: true };
        let src = Mapping::anonymous(2 * PAGE_SIZE, opts).unwrap();
        let dst = Mapping::anonymous(2 * PAGE_SIZE, opts).unwrap();
        // SAFETY: both pages of `src` are ours and not registered, so writing them is plain.
        unsafe {
            std::ptr::write_bytes(src.addr() as *mut u8, 0xa5, PAGE_SIZE);
            std::ptr::write_bytes((src.addr() + PAGE_SIZE) as *mut u8, 0x5a, PAGE_SIZE);
        }
        uffd.register(dst.addr(), dst.len(), REGISTER_MODE_MISSING).unwrap();
        uffd.register(src.addr(), src.len(), REGISTER_MODE_MISSING).unwrap();

        // The first page alone, then both: the kernel says EEXIST for the first.
        assert_eq!(uffd.move_pages(dst.addr(), src.addr(), PAGE_SIZE, false), RangeResult::Done);
        assert_eq!(uffd.move_pages(dst.addr(), src.addr(), 2 * PAGE_SIZE, false), RangeResult::Done);
        assert_eq!(uffd.move_misreports(), 1);
        // SAFETY: both destination pages are present now (moved), so reading them does not fault.
        let (a, b) = unsafe { (*(dst.addr() as *const u8), *((dst.addr() + PAGE_SIZE) as *const u8)) };
        assert_eq!((a, b), (0xa5, 0x5a));
        assert!(!page_present(src.addr()) && !page_present(src.addr() + PAGE_SIZE));

        // A real refusal stays one: the destination is occupied and the source still holds a
        // page.
        let other = Mapping::anonymous(PAGE_SIZE, opts).unwrap();
        // SAFETY: our own page, not registered yet, so writing it is plain.
        unsafe { std::ptr::write_bytes(other.addr() as *mut u8, 1, PAGE_SIZE) };
        uffd.register(other.addr(), other.len(), REGISTER_MODE_MISSING).unwrap();
        assert_eq!(
            uffd.move_pages(dst.addr(), other.addr(), PAGE_SIZE, false),
            RangeResult::Partial { done_bytes: 0, errno: libc::EEXIST }
        );
        assert_eq!(uffd.move_misreports(), 1);

        // So is one onto the kernel's zero page (a program read an empty staging page) from
        // an empty source: nothing was moved there (a region's descriptor would take it for
        // moved; its destinations are empty entries).
        let zero_dst = Mapping::anonymous(PAGE_SIZE, opts).unwrap();
        let empty_src = Mapping::anonymous(PAGE_SIZE, opts).unwrap();
        uffd.register(zero_dst.addr(), PAGE_SIZE, REGISTER_MODE_MISSING).unwrap();
        uffd.register(empty_src.addr(), PAGE_SIZE, REGISTER_MODE_MISSING).unwrap();
        assert_eq!(uffd.zeropage(zero_dst.addr(), PAGE_SIZE, false), RangeResult::Done);
        assert!(page_present(zero_dst.addr()) && page_is_own(zero_dst.addr()) == Some(false));
        assert!(matches!(
            uffd.move_pages(zero_dst.addr(), empty_src.addr(), PAGE_SIZE, false),
            RangeResult::Partial { done_bytes: 0, .. }
        ));
        assert_eq!(uffd.move_misreports(), 1);
        assert_eq!(page_is_own(dst.addr()), Some(true), "a moved page is mapped alone");
    }
}
