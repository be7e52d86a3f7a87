//! The mapping layer: anonymous mappings owned by the engine and the few raw memory
//! operations the engine performs on memory it owns (never on application pages).
//!
//! A [`Mapping`] is an `mmap` that is unmapped on drop. The engine uses them for application
//! regions (whose contents it only ever moves with userfaultfd ioctls), for the staging area
//! of the swap cache and for RAM device storage. Byte access to a mapping goes through the
//! methods here, each of which states which pages the caller must own.
//!
//! Racy-but-owned access: the byte accessors below are safe functions, as in Firecracker's
//! guest-memory layer. Their contract is logical ownership (the caller holds the page's busy
//! bit or owns the slot); a caller that broke it would read torn data, never cause undefined
//! behaviour in the engine's own Rust objects, because no Rust reference to mapped bytes
//! outlives the call (`PageRun::with_page` lends one for the length of a closure).
//!
//! Locking: none; a `Mapping` is an address range. Callers serialise access to individual
//! pages with the page-table busy bit (see `region`) or slot ownership (see `swap`).
//!
//! [`registry`] is the process-wide table of managed mappings that the fault path searches
//! by address; [`handler_stack`] the stacks signal-mode faults are served on; `engine_thread`
//! starts the engine's threads (signals blocked, stacks noted, panics abort).

mod engine_thread;
pub mod handler_stack;
mod page_buf;
pub mod registry;

pub use engine_thread::{is_engine_thread, spawn_engine_thread};
pub use page_buf::PageBuf;

use std::io;
use std::sync::atomic::{AtomicU64, AtomicUsize};

use crate::uffd::PAGE_SIZE;

/// Ranges of engine-owned mappings to drop (`MADV_DONTNEED`) together.
///
/// Why: each `madvise` that drops a page of this process flushes the TLB of every other CPU
/// running one of its threads (an IPI each). Staging pages leave the swap cache one run of
/// consecutive slots at a time, and under random access a run is mostly one page long, so
/// dropping them one call per run cost about one shootdown per major fault with two
/// application threads. `process_madvise(PIDFD_SELF_THREAD, …)` drops a whole batch with
/// one flush (Linux 6.13 allows any advice on the caller's own process; 6.15 added the
/// sentinel, which names the caller's own memory even in a fork child). Where the kernel
/// refuses it, the ranges are dropped one `madvise` each, as before.
///
/// The batch must be flushed before the pages it names may be reused (the caller's rule,
/// as for `discard`); dropping it flushes what is left. Allocation-free: a fixed array on
/// the caller's stack, usable in a SIGBUS handler.
pub struct DiscardBatch<const N: usize> {
    ranges: arrayvec::ArrayVec<(*mut libc::c_void, usize), N>,
}

/// `PIDFD_SELF_THREAD` (include/uapi/linux/pidfd.h): the calling thread, whose memory is
/// the process's.
const PIDFD_SELF_THREAD: libc::c_int = -10000;

/// Whether `process_madvise` on ourselves works here: 0 not tried yet, 1 yes, 2 no.
static PROCESS_MADVISE_SELF: std::sync::atomic::AtomicU8 = std::sync::atomic::AtomicU8::new(0);

impl<const N: usize> Default for DiscardBatch<N> {
    fn default() -> Self {
        Self::new()
    }
}

impl<const N: usize> DiscardBatch<N> {
    pub const fn new() -> Self {
        DiscardBatch { ranges: arrayvec::ArrayVec::new_const() }
    }

    /// Drops every range added so far (one TLB flush where the kernel allows it).
    pub fn flush(&mut self) {
        use std::sync::atomic::Ordering;
        if self.ranges.is_empty() {
            return;
        }
        let total: usize = self.ranges.iter().map(|r| r.1).sum();
        if self.ranges.len() > 1 && PROCESS_MADVISE_SELF.load(Ordering::Relaxed) != 2 {
            let mut iov = [libc::iovec { iov_base: std::ptr::null_mut(), iov_len: 0 }; N];
            for (v, &(base, len)) in iov.iter_mut().zip(&self.ranges) {
                *v = libc::iovec { iov_base: base, iov_len: len };
            }
            // SAFETY: every range lies inside a mapping the engine owns (`discard_later`
            // checked it) and names pages the caller owns and may drop, as for `discard`;
            // `iov` holds `ranges.len()` valid entries. The kernel reads the array only.
            let r = unsafe {
                libc::syscall(
                    libc::SYS_process_madvise,
                    PIDFD_SELF_THREAD,
                    iov.as_ptr(),
                    self.ranges.len(),
                    libc::MADV_DONTNEED,
                    0,
                )
            };
            if r >= 0 && r as usize == total {
                PROCESS_MADVISE_SELF.store(1, Ordering::Relaxed);
                self.ranges.clear();
                return;
            }
            let refused = r < 0
                && matches!(
                    io::Error::last_os_error().raw_os_error(),
                    Some(libc::EBADF | libc::EINVAL | libc::ENOSYS | libc::EPERM | libc::ESRCH)
                );
            if refused && PROCESS_MADVISE_SELF.load(Ordering::Relaxed) == 0 {
                // Refused by an older kernel (no sentinel, or no MADV_DONTNEED there): never
                // tried again. A partial drop or another failure falls back for this batch
                // only; dropping a range twice is harmless.
                PROCESS_MADVISE_SELF.store(2, Ordering::Relaxed);
            }
        }
        for &(base, len) in &self.ranges {
            // SAFETY: as above; one range per call.
            unsafe { libc::madvise(base, len, libc::MADV_DONTNEED) };
        }
        self.ranges.clear();
    }
}

impl<const N: usize> Drop for DiscardBatch<N> {
    fn drop(&mut self) {
        self.flush();
    }
}

/// Address ranges of the engine's own mappings (`[start, end)`, 0 when free): the staging
/// areas, RAM devices, page tables and queues, so that a scan of the process's memory can
/// tell the engine's from the program's ([`is_engine_memory`]). Lock-free: slots are taken
/// by a compare-and-swap of `start`, scanned up to [`ENGINE_RANGES_HIGH`].
const MAX_ENGINE_RANGES: usize = 16384;
static ENGINE_RANGES: [(AtomicUsize, AtomicUsize); MAX_ENGINE_RANGES] =
    [const { (AtomicUsize::new(0), AtomicUsize::new(0)) }; MAX_ENGINE_RANGES];
static ENGINE_RANGES_HIGH: AtomicUsize = AtomicUsize::new(0);

/// Records `[addr, addr + len)` as the engine's (best effort: a full table only makes a
/// scan count the range as the program's).
fn note_engine_range(addr: usize, len: usize) {
    use std::sync::atomic::Ordering;
    for (i, (start, end)) in ENGINE_RANGES.iter().enumerate() {
        if start.compare_exchange(0, addr, Ordering::AcqRel, Ordering::Relaxed).is_ok() {
            end.store(addr + len, Ordering::Release);
            ENGINE_RANGES_HIGH.fetch_max(i + 1, Ordering::AcqRel);
            return;
        }
    }
}

/// Records `[addr, addr + len)` as memory uswap itself made or changed (outside the engine:
/// the preload library's rewritten code), so that a report of the program's unmanaged memory
/// leaves it out.
pub fn note_engine_memory(addr: usize, len: usize) {
    note_engine_range(addr, len);
}

fn forget_engine_range(addr: usize) {
    use std::sync::atomic::Ordering;
    let high = ENGINE_RANGES_HIGH.load(Ordering::Acquire);
    if let Some((start, end)) = ENGINE_RANGES[..high].iter().find(|(s, _)| s.load(Ordering::Acquire) == addr) {
        end.store(0, Ordering::Release);
        start.store(0, Ordering::Release);
    }
}

/// Whether `[start, end)` overlaps one of the engine's own mappings.
pub fn is_engine_memory(start: usize, end: usize) -> bool {
    use std::sync::atomic::Ordering;
    let high = ENGINE_RANGES_HIGH.load(Ordering::Acquire);
    ENGINE_RANGES[..high].iter().any(|(s, e)| {
        let (s, e) = (s.load(Ordering::Acquire), e.load(Ordering::Acquire));
        s != 0 && s < end && start < e
    })
}

/// Bytes of address space the engine's own mappings hold now (what [`is_engine_memory`]
/// knows of), reserved or touched: what an address-space limit set after the pager started
/// must leave room for (the preload's `rlimit`).
pub fn engine_reserved_bytes() -> u64 {
    use std::sync::atomic::Ordering;
    let high = ENGINE_RANGES_HIGH.load(Ordering::Acquire);
    ENGINE_RANGES[..high]
        .iter()
        .map(|(s, e)| {
            let (s, e) = (s.load(Ordering::Acquire), e.load(Ordering::Acquire));
            if s != 0 && e > s {
                (e - s) as u64
            } else {
                0
            }
        })
        .sum()
}

/// An anonymous private mapping, unmapped on drop.
#[derive(Debug)]
pub struct Mapping {
    addr: usize,
    len: usize,
}

/// How a mapping is set up.
#[derive(Debug, Clone, Copy)]
pub struct MapOptions {
    /// `MADV_NOHUGEPAGE`: userfaultfd regions work page by page, and `UFFDIO_MOVE` must split
    /// a transparent huge page before it can move one of its pages.
    pub no_huge_pages: bool,
    /// `MADV_DONTFORK`: `UFFDIO_MOVE` fails with EBUSY on pages a fork child shares, so
    /// managed memory is not inherited by children.
    pub dont_fork: bool,
}

impl Mapping {
    /// Maps `len` bytes (rounded up to pages) of zero-filled anonymous memory, reserved lazily
    /// (`MAP_NORESERVE`): nothing is committed until touched.
    pub fn anonymous(len: usize, opts: MapOptions) -> io::Result<Mapping> {
        let m = Mapping::fresh(len, libc::MAP_PRIVATE)?;
        let len = m.len;
        if opts.no_huge_pages {
            m.advise(0, len, libc::MADV_NOHUGEPAGE)?;
        }
        if opts.dont_fork {
            m.advise(0, len, libc::MADV_DONTFORK)?;
        }
        Ok(m)
    }

    /// Maps `len` bytes (rounded up to pages) of zero-filled memory shared with every fork
    /// child (`MAP_SHARED | MAP_ANONYMOUS`, reserved lazily): what one process writes, the
    /// others read.
    pub fn shared_anonymous(len: usize) -> io::Result<Mapping> {
        Mapping::fresh(len, libc::MAP_SHARED)
    }

    /// A fresh, lazily reserved anonymous mapping of `len` bytes rounded up to pages,
    /// `MAP_PRIVATE` or `MAP_SHARED` (`sharing`), noted as the engine's.
    fn fresh(len: usize, sharing: libc::c_int) -> io::Result<Mapping> {
        let len = len.div_ceil(PAGE_SIZE) * PAGE_SIZE;
        // SAFETY: a fresh anonymous mapping at an address the kernel chooses; it aliases
        // nothing we own.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                sharing | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
                -1,
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        let m = Mapping { addr: p as usize, len };
        note_engine_range(m.addr, len);
        Ok(m)
    }

    pub fn addr(&self) -> usize {
        self.addr
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    pub fn contains(&self, addr: usize) -> bool {
        addr >= self.addr && addr < self.addr + self.len
    }

    fn check_range(&self, offset: usize, len: usize) {
        assert!(
            offset % PAGE_SIZE == 0 && len % PAGE_SIZE == 0 && offset + len <= self.len,
            "range {offset:#x}+{len:#x} outside mapping of {:#x} bytes",
            self.len
        );
    }

    /// `madvise` on a page-aligned sub-range.
    pub fn advise(&self, offset: usize, len: usize, advice: libc::c_int) -> io::Result<()> {
        self.check_range(offset, len);
        // SAFETY: the range lies inside this mapping. The advice values the engine uses
        // (NOHUGEPAGE, DONTFORK, DONTNEED, POPULATE_WRITE, REMOVE) change residency, not
        // validity.
        let r = unsafe { libc::madvise((self.addr + offset) as *mut libc::c_void, len, advice) };
        if r != 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(())
    }

    /// `mprotect` on a page-aligned sub-range.
    pub fn protect(&self, offset: usize, len: usize, prot: libc::c_int) -> io::Result<()> {
        self.check_range(offset, len);
        // SAFETY: the range lies inside this mapping, which the engine owns; what the new
        // protection means for those pages is the caller's contract.
        let r = unsafe { libc::mprotect((self.addr + offset) as *mut libc::c_void, len, prot) };
        if r != 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(())
    }

    /// Whether a fork child gets a copy-on-write copy of the mapping (`MADV_DOFORK`) or none
    /// (`MADV_DONTFORK`): around a fork whose child reads a memory device's pages from its
    /// copy (`Pager::prepare_fork_to_rearm`). Cannot fail for a whole mapping the engine
    /// owns; a failure would only leave the flag as it was.
    pub fn set_inherited(&self, inherit: bool) {
        let _ = self.advise(0, self.len, if inherit { libc::MADV_DOFORK } else { libc::MADV_DONTFORK });
    }

    /// Drops the pages of a sub-range (`MADV_DONTNEED`): they read back as zero, or fault
    /// into userfaultfd if the mapping is registered. Async-signal-safe.
    pub fn discard(&self, offset: usize, len: usize) -> io::Result<()> {
        self.advise(offset, len, libc::MADV_DONTNEED)
    }

    /// Adds `[offset, offset + len)` to `batch`, to be dropped like [`Mapping::discard`] when
    /// the batch is flushed (at once if the batch is full).
    pub fn discard_later<const N: usize>(&self, batch: &mut DiscardBatch<N>, offset: usize, len: usize) {
        self.check_range(offset, len);
        if batch.ranges.is_full() {
            batch.flush();
        }
        batch.ranges.push(((self.addr + offset) as *mut libc::c_void, len));
    }

    /// Copies `dst.len()` bytes out of the mapping.
    ///
    /// The caller must own the pages it reads (no concurrent writer) and, if the mapping is
    /// registered with userfaultfd, they must be populated (a missing page would fault into
    /// the engine itself).
    pub fn read(&self, offset: usize, dst: &mut [u8]) {
        assert!(offset + dst.len() <= self.len);
        // SAFETY: in bounds (checked above); the caller owns the pages (documented contract),
        // so no data race; `dst` is a distinct Rust buffer.
        unsafe { std::ptr::copy_nonoverlapping((self.addr + offset) as *const u8, dst.as_mut_ptr(), dst.len()) };
    }

    /// Copies `src` into the mapping. Same ownership contract as [`Mapping::read`].
    pub fn write(&self, offset: usize, src: &[u8]) {
        assert!(offset + src.len() <= self.len);
        // SAFETY: in bounds; the caller owns the destination pages; `src` is distinct memory.
        unsafe { std::ptr::copy_nonoverlapping(src.as_ptr(), (self.addr + offset) as *mut u8, src.len()) };
    }

    /// Copies `len` bytes within or between mappings: from `self` at `offset` to `dst` at
    /// `dst_offset`. The caller owns both ranges; they must not overlap.
    pub fn copy_to(&self, offset: usize, dst: &Mapping, dst_offset: usize, len: usize) {
        assert!(offset + len <= self.len && dst_offset + len <= dst.len);
        // SAFETY: both ranges are in bounds; the caller owns both and guarantees they do not
        // overlap (distinct slots / distinct staging pages).
        unsafe {
            std::ptr::copy_nonoverlapping((self.addr + offset) as *const u8, (dst.addr + dst_offset) as *mut u8, len)
        };
    }

    /// A run of `nr_pages` pages starting at `offset`, to hand to a backend without creating
    /// a lasting reference to their bytes. Same ownership contract as [`Mapping::read`].
    pub fn pages(&self, offset: usize, nr_pages: usize) -> PageRun<'_> {
        self.check_range(offset, nr_pages * PAGE_SIZE);
        PageRun { addr: self.addr + offset, nr_pages, _owner: std::marker::PhantomData }
    }

    /// True if every byte of the page at `offset` is zero. Same ownership contract as
    /// [`Mapping::read`].
    pub fn page_is_zero(&self, offset: usize) -> bool {
        self.check_range(offset, PAGE_SIZE);
        // SAFETY: one page inside the mapping, owned by the caller; reading it as u64 words is
        // aligned because the offset is page-aligned.
        let words = unsafe { std::slice::from_raw_parts((self.addr + offset) as *const u64, PAGE_SIZE / 8) };
        words.iter().all(|&w| w == 0)
    }

    /// crc32c of the page at `offset`. Same ownership contract as [`Mapping::read`].
    pub fn page_crc32c(&self, offset: usize) -> u32 {
        self.check_range(offset, PAGE_SIZE);
        // SAFETY: one page inside the mapping, owned by the caller for the duration (no
        // concurrent writer); the slice does not outlive this call.
        crc32c::crc32c(unsafe { std::slice::from_raw_parts((self.addr + offset) as *const u8, PAGE_SIZE) })
    }

    /// Pages of `[offset, offset + len)` present in the page table (`mincore(2)`).
    pub fn resident_pages(&self, offset: usize, len: usize) -> io::Result<usize> {
        self.check_range(offset, len);
        mincore_pages(self.addr + offset, len)
    }
}

/// One page, aligned for `O_DIRECT` I/O: the unit of read buffers and bounce pages.
#[derive(Clone, Copy)]
#[repr(C, align(4096))]
pub struct AlignedPage(pub [u8; PAGE_SIZE]);

/// Consecutive pages that the engine owns for the duration of a backend call: the source of
/// a device write. Either staged pages of a [`Mapping`] or a buffer of aligned pages.
#[derive(Clone, Copy)]
pub struct PageRun<'a> {
    addr: usize,
    nr_pages: usize,
    _owner: std::marker::PhantomData<&'a [u8]>,
}

impl<'a> PageRun<'a> {
    /// A run over pages of an ordinary buffer.
    pub fn from_pages(pages: &'a [AlignedPage]) -> PageRun<'a> {
        PageRun { addr: pages.as_ptr() as usize, nr_pages: pages.len(), _owner: std::marker::PhantomData }
    }

    /// Calls `f` on page `i` of the run in place: how a device that reads a page once
    /// (compression) reads it without copying it first. The slice does not outlive `f`.
    pub fn with_page<R>(&self, i: usize, f: impl FnOnce(&[u8]) -> R) -> R {
        assert!(i < self.nr_pages);
        // SAFETY: in bounds of the run, which is valid and unchanging for 'a: a borrowed
        // buffer, or staged pages the engine owns for the backend call (their busy bits keep
        // faults and other reclaimers off them, and the application cannot reach a staged
        // page: it was moved out of its region). The slice lives only for the call of `f`.
        f(unsafe { std::slice::from_raw_parts((self.addr + i * PAGE_SIZE) as *const u8, PAGE_SIZE) })
    }

    fn read_at(&self, offset: usize, dst: &mut [u8]) {
        assert!(offset + dst.len() <= self.len_bytes());
        // SAFETY: in bounds of the run, which is valid for 'a (a borrowed buffer, or a
        // mapping range the caller owns by contract); `dst` is distinct memory.
        unsafe { std::ptr::copy_nonoverlapping((self.addr + offset) as *const u8, dst.as_mut_ptr(), dst.len()) };
    }
}

impl PageRun<'_> {
    pub fn nr_pages(&self) -> usize {
        self.nr_pages
    }

    pub fn len_bytes(&self) -> usize {
        self.nr_pages * PAGE_SIZE
    }

    /// Address of the first byte, for handing to the kernel (io_uring, pwrite).
    pub fn as_ptr(&self) -> *const u8 {
        self.addr as *const u8
    }

    /// Copies page `i` of the run into `dst` (one page long).
    pub fn copy_page_to(&self, i: usize, dst: &mut [u8]) {
        assert!(i < self.nr_pages && dst.len() == PAGE_SIZE);
        self.read_at(i * PAGE_SIZE, dst);
    }

    /// Copies the whole run into another mapping at `dst_offset`.
    pub fn copy_to_mapping(&self, dst: &Mapping, dst_offset: usize) {
        assert!(dst_offset + self.len_bytes() <= dst.len);
        // SAFETY: both ranges are in bounds; the destination belongs to the caller (a device
        // slot it owns) and cannot overlap the run (distinct mappings or buffers).
        unsafe {
            std::ptr::copy_nonoverlapping(self.addr as *const u8, (dst.addr + dst_offset) as *mut u8, self.len_bytes())
        };
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        forget_engine_range(self.addr);
        // SAFETY: we own the whole range; nothing refers to it after drop.
        unsafe { libc::munmap(self.addr as *mut libc::c_void, self.len) };
    }
}

/// An application region's memory. The engine never reads or writes these bytes: it only
/// moves whole pages in and out with userfaultfd ioctls, which preserve their contents. So
/// the borrow rules on this handle are the only aliasing rules that apply, and the slice
/// accessors are sound. The address follows the memory when the application moves it
/// (`mremap`); dropping the handle unmaps `[addr, addr + len)`, so a managed region keeps
/// its handle in a `ManuallyDrop` and unmaps only what is still its own
/// ([`unmap_app_range`]).
#[derive(Debug)]
pub struct AppMapping {
    addr: std::sync::atomic::AtomicUsize,
    len: usize,
}

impl AppMapping {
    pub fn new(len: usize) -> io::Result<AppMapping> {
        AppMapping::with_fork(len, false)
    }

    /// Memory already mapped at `[addr, addr + len)` (page-aligned), which the handle now
    /// owns: a fork child adopting the regions it inherited.
    pub fn existing(addr: usize, len: usize) -> AppMapping {
        debug_assert!(addr % PAGE_SIZE == 0 && len % PAGE_SIZE == 0);
        AppMapping { addr: std::sync::atomic::AtomicUsize::new(addr), len }
    }

    /// A mapping a forked child inherits (`inherit`) or does not (`MADV_DONTFORK`: the child
    /// gets no mapping rather than one whose swapped-out pages read as zeros).
    pub fn with_fork(len: usize, inherit: bool) -> io::Result<AppMapping> {
        let m = Mapping::anonymous(len, MapOptions { no_huge_pages: true, dont_fork: !inherit })?;
        let (addr, len) = (m.addr, m.len);
        // The application's memory from now on, not the engine's.
        forget_engine_range(addr);
        std::mem::forget(m);
        Ok(AppMapping { addr: std::sync::atomic::AtomicUsize::new(addr), len })
    }

    pub fn addr(&self) -> usize {
        self.addr.load(std::sync::atomic::Ordering::Acquire)
    }

    /// The application moved the memory to `addr` (same length).
    pub fn set_addr(&self, addr: usize) {
        self.addr.store(addr, std::sync::atomic::Ordering::Release);
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    pub fn resident_pages(&self, offset: usize, len: usize) -> io::Result<usize> {
        assert!(offset % PAGE_SIZE == 0 && len % PAGE_SIZE == 0 && offset + len <= self.len);
        mincore_pages(self.addr() + offset, len)
    }

    pub fn as_slice(&self) -> &[u8] {
        // SAFETY: the mapping is valid for `len` bytes for the lifetime of `self`; the engine
        // never creates references to it or writes it (see the type's doc), so a shared slice
        // tied to `&self` aliases nothing mutable in Rust's model.
        unsafe { std::slice::from_raw_parts(self.addr() as *const u8, self.len) }
    }

    /// A mutable slice from a shared handle: the caller guarantees no other slice of this
    /// memory lives (a `Region` hands it out from `&mut self`; the engine makes none).
    #[allow(clippy::mut_from_ref)]
    pub fn as_mut_slice_shared(&self) -> &mut [u8] {
        // SAFETY: as `as_slice`, and the caller holds the only live reference (see above).
        unsafe { std::slice::from_raw_parts_mut(self.addr() as *mut u8, self.len) }
    }

    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        self.as_mut_slice_shared()
    }

    pub fn as_atomic_u64s(&self) -> &[AtomicU64] {
        // SAFETY: valid for `len` bytes (a multiple of 8), page-aligned, and every bit pattern
        // is a valid AtomicU64; shared access through atomics is data-race free.
        unsafe { std::slice::from_raw_parts(self.addr() as *const AtomicU64, self.len / 8) }
    }
}

impl Drop for AppMapping {
    fn drop(&mut self) {
        unmap_app_range(self.addr(), self.len);
    }
}

/// Unmaps `[addr, addr + len)` of application memory the engine owns (a plain region, or the
/// parts of a managed region that are still its own, unregistered first).
pub fn unmap_app_range(addr: usize, len: usize) {
    // SAFETY: the caller owns the range (it is still the region's, not the application's
    // other memory); no Rust reference to it outlives this call.
    unsafe { libc::munmap(addr as *mut libc::c_void, len) };
}

/// A zero-initialised table of atomic words backed by its own anonymous mapping, so that a
/// large table (one word per page of a terabyte region) costs memory only where it is used.
pub struct AtomicTable {
    map: Mapping,
    len: usize,
}

impl AtomicTable {
    pub fn new(len: usize) -> io::Result<AtomicTable> {
        let map = Mapping::anonymous((len * 8).max(PAGE_SIZE), MapOptions { no_huge_pages: false, dont_fork: true })?;
        Ok(AtomicTable { map, len })
    }
}

impl AtomicTable {
    /// A table shared with every fork child made while it lives (`MAP_SHARED`): a word one
    /// process changes, the others see changed.
    pub fn shared(len: usize) -> io::Result<AtomicTable> {
        Ok(AtomicTable { map: Mapping::shared_anonymous((len * 8).max(PAGE_SIZE))?, len })
    }

    /// Zeroes a [`AtomicTable::shared`] table and gives its memory back (`MADV_REMOVE`; for
    /// every process that maps it). A word read concurrently reads its old value or zero.
    pub fn remove_all(&self) -> io::Result<()> {
        self.map.advise(0, self.map.len(), libc::MADV_REMOVE)
    }

    /// Whether a fork child gets a copy of the table (see [`Mapping::set_inherited`]).
    pub fn set_inherited(&self, inherit: bool) {
        self.map.set_inherited(inherit);
    }
}

impl std::ops::Deref for AtomicTable {
    type Target = [AtomicU64];
    fn deref(&self) -> &[AtomicU64] {
        // SAFETY: the mapping is at least `len * 8` bytes, page-aligned (so 8-aligned),
        // zero-filled by the kernel (a valid AtomicU64), owned by `self` and never unmapped
        // while `self` lives; all access goes through atomics.
        unsafe { std::slice::from_raw_parts(self.map.addr() as *const AtomicU64, self.len) }
    }
}

/// An array of `T` in lazily zero-filled memory: a large array (one entry per cluster of a
/// terabyte device) costs memory and start-up time only where entries are written. Every
/// entry starts as all-zero bytes, which must be a valid `T` (the constructor's contract);
/// an entry is given its real initial value with [`ZeroedArray::init`] before first use.
/// Entries are never dropped: `T` may not need dropping.
pub struct ZeroedArray<T> {
    map: Mapping,
    len: usize,
    _t: std::marker::PhantomData<T>,
}

// SAFETY: the array owns its entries as a `Box<[T]>` would; sharing it shares `&T`s.
unsafe impl<T: Send> Send for ZeroedArray<T> {}
// SAFETY: as above: `&ZeroedArray<T>` only hands out `&T` (and `init`, whose caller excludes
// every other access to the entry).
unsafe impl<T: Sync> Sync for ZeroedArray<T> {}

impl<T> ZeroedArray<T> {
    /// # Safety
    /// All-zero bytes must be a valid value of `T`.
    pub unsafe fn new(len: usize) -> io::Result<ZeroedArray<T>> {
        const { assert!(std::mem::align_of::<T>() <= PAGE_SIZE && !std::mem::needs_drop::<T>()) };
        let bytes = (len * std::mem::size_of::<T>()).max(PAGE_SIZE);
        let map = Mapping::anonymous(bytes, MapOptions { no_huge_pages: false, dont_fork: true })?;
        Ok(ZeroedArray { map, len, _t: std::marker::PhantomData })
    }

    /// Writes entry `i`'s initial value over its zero bytes (which need no drop).
    ///
    /// # Safety
    /// No reference to entry `i` may exist, and no other thread may access it, until this
    /// returns; the entry must not have been given a value that needs dropping.
    pub unsafe fn init(&self, i: usize, value: T) {
        assert!(i < self.len, "entry {i} of {}", self.len);
        // SAFETY: in bounds (checked), aligned (page-aligned base, T-sized stride); the caller
        // guarantees exclusive access to the entry and that nothing there needs dropping.
        unsafe { std::ptr::write((self.map.addr() as *mut T).add(i), value) };
    }
}

impl<T> std::ops::Deref for ZeroedArray<T> {
    type Target = [T];
    fn deref(&self) -> &[T] {
        // SAFETY: the mapping holds `len` entries, page-aligned, each a valid `T` (zero bytes
        // are one, by the constructor's contract, or `init` wrote one); owned by `self` and
        // never unmapped while it lives.
        unsafe { std::slice::from_raw_parts(self.map.addr() as *const T, self.len) }
    }
}

/// Makes the page at `addr` (page-aligned) writable and exclusive to this process
/// (`MADV_POPULATE_WRITE`): a page it shares copy-on-write with a fork child is copied, as
/// a write fault would, without changing a byte of it. A page that is missing is faulted in
/// like any access (into userfaultfd, if the range is registered). Async-signal-safe.
pub fn populate_write(addr: usize) -> io::Result<()> {
    // SAFETY: madvise checks the range itself (ENOMEM if unmapped); POPULATE_WRITE faults
    // pages in for writing and never changes their contents or the mapping.
    let r = unsafe { libc::madvise(addr as *mut libc::c_void, PAGE_SIZE, libc::MADV_POPULATE_WRITE) };
    if r != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Whether the page at `addr` (page-aligned, in a mapping) is present in the page table.
/// Allocates nothing: safe in a signal handler.
pub fn page_present(addr: usize) -> bool {
    let mut v = 0u8;
    // SAFETY: mincore reads page tables and writes one byte, into `v`, for a one-page range;
    // an unmapped address gives ENOMEM, not undefined behaviour.
    let r = unsafe { libc::mincore(addr as *mut libc::c_void, PAGE_SIZE, &mut v) };
    r == 0 && v & 1 != 0
}

/// Calls `f(page)` for each page of `[addr, addr + nr_pages * PAGE_SIZE)` present in the
/// page table (`mincore(2)`, in chunks). The range must be mapped, `addr` page-aligned.
pub fn for_each_present_page(addr: usize, nr_pages: usize, mut f: impl FnMut(usize)) -> io::Result<()> {
    const CHUNK_PAGES: usize = 4096;
    let mut vec = vec![0u8; CHUNK_PAGES];
    let mut first = 0;
    // Bounded: each round moves `first` on by at least one page.
    while first < nr_pages {
        let n = (nr_pages - first).min(CHUNK_PAGES);
        // SAFETY: mincore only reads page tables and writes `n` bytes into `vec`, which has
        // room for CHUNK_PAGES; an unmapped range gives ENOMEM, not undefined behaviour.
        let r =
            unsafe { libc::mincore((addr + first * PAGE_SIZE) as *mut libc::c_void, n * PAGE_SIZE, vec.as_mut_ptr()) };
        if r != 0 {
            return Err(io::Error::last_os_error());
        }
        for (i, b) in vec[..n].iter().enumerate() {
            if b & 1 != 0 {
                f(first + i);
            }
        }
        first += n;
    }
    Ok(())
}

/// Calls `f(i)` for each page `i` of the `nr_pages` at `addr` that is present and mapped by
/// this process alone (`/proc/self/pagemap`: bits 63 and 56, the latter since Linux 4.2; the
/// kernel's zero page never counts). Reads the entries in chunks with `pread`.
pub fn for_each_exclusive_page(addr: usize, nr_pages: usize, mut f: impl FnMut(usize)) -> io::Result<()> {
    const CHUNK_PAGES: usize = 512;
    const PRESENT: u64 = 1 << 63;
    const EXCLUSIVE: u64 = 1 << 56;
    use std::os::fd::AsRawFd;
    let pagemap = std::fs::File::open("/proc/self/pagemap")?;
    let mut entries = [0u64; CHUNK_PAGES];
    let mut first = 0;
    // Bounded: each round moves `first` on by at least one page, or fails.
    while first < nr_pages {
        let n = (nr_pages - first).min(CHUNK_PAGES);
        let offset = ((addr / PAGE_SIZE + first) * 8) as libc::off_t;
        // SAFETY: reads at most `n * 8` bytes into `entries`, which has room for CHUNK_PAGES
        // entries; the descriptor is open for as long as `pagemap` lives.
        let got = unsafe { libc::pread(pagemap.as_raw_fd(), entries.as_mut_ptr().cast(), n * 8, offset) };
        if got <= 0 {
            return Err(if got == 0 { io::ErrorKind::UnexpectedEof.into() } else { io::Error::last_os_error() });
        }
        let got = got as usize / 8;
        for (i, &e) in entries[..got].iter().enumerate() {
            if e & (PRESENT | EXCLUSIVE) == PRESENT | EXCLUSIVE {
                f(first + i);
            }
        }
        first += got;
    }
    Ok(())
}

/// Pages of `[addr, addr + len)` present in the page table, counted with `mincore(2)` in
/// chunks so the vector stays small. The range must be mapped, `addr` page-aligned; a
/// partial last page counts as a page.
pub fn mincore_pages(addr: usize, len: usize) -> io::Result<usize> {
    mincore_pages_where(addr, len, |_| true)
}

/// As [`mincore_pages`], counting only the pages whose index from `addr` `counted` accepts.
pub fn mincore_pages_where(addr: usize, len: usize, counted: impl Fn(usize) -> bool) -> io::Result<usize> {
    const CHUNK_PAGES: usize = 4096;
    let mut vec = vec![0u8; CHUNK_PAGES];
    let mut total = 0;
    let mut off = 0;
    // Bounded: each round moves `off` on by at least a page (a partial last page included;
    // rounding down made a `len` that was not whole pages spin for ever on n = 0).
    while off < len {
        let n = (len - off).div_ceil(PAGE_SIZE).min(CHUNK_PAGES);
        // SAFETY: mincore only reads page tables and writes `n` bytes into `vec`, which has
        // room for CHUNK_PAGES; an unmapped range gives ENOMEM, not undefined behaviour.
        let r = unsafe { libc::mincore((addr + off) as *mut libc::c_void, n * PAGE_SIZE, vec.as_mut_ptr()) };
        if r != 0 {
            return Err(io::Error::last_os_error());
        }
        let first = off / PAGE_SIZE;
        total += vec[..n].iter().enumerate().filter(|&(i, &b)| b & 1 != 0 && counted(first + i)).count();
        off += n * PAGE_SIZE;
    }
    Ok(total)
}

/// The CPU the calling thread runs on (`sched_getcpu`, a vDSO call; async-signal-safe).
pub fn current_cpu() -> usize {
    // SAFETY: no arguments, returns -1 on failure.
    let c = unsafe { libc::sched_getcpu() };
    if c < 0 {
        0
    } else {
        c as usize
    }
}

/// Number of CPUs the system is configured with (an upper bound for `current_cpu`).
/// The process's address-space limit (`RLIMIT_AS`, `ulimit -v`), `None` where there is none.
/// Reservations count against it whether or not they are touched.
pub fn address_space_limit_bytes() -> Option<u64> {
    let mut lim = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: getrlimit writes the limit into `lim`, which lives for the call.
    if unsafe { libc::getrlimit(libc::RLIMIT_AS, &mut lim) } != 0 || lim.rlim_cur == libc::RLIM_INFINITY {
        return None;
    }
    Some(lim.rlim_cur)
}

pub fn nr_cpus_configured() -> usize {
    // SAFETY: sysconf has no memory effects.
    let n = unsafe { libc::sysconf(libc::_SC_NPROCESSORS_CONF) };
    if n < 1 {
        1
    } else {
        n as usize
    }
}

/// The CPUs this thread may run on (its affinity mask), in ascending order.
pub fn allowed_cpus() -> Vec<usize> {
    // SAFETY: cpu_set_t is plain data; sched_getaffinity fills it.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        if libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut set) != 0 {
            return (0..nr_cpus_configured()).collect();
        }
        (0..libc::CPU_SETSIZE as usize).filter(|&c| libc::CPU_ISSET(c, &set)).collect()
    }
}

/// Pins the calling thread to one CPU.
pub fn pin_current_thread(cpu: usize) -> io::Result<()> {
    // SAFETY: cpu_set_t is plain data; sched_setaffinity reads it.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(cpu, &mut set);
        if libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set) != 0 {
            return Err(io::Error::last_os_error());
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A batch drops exactly the ranges it was given, over more ranges than it holds (a
    /// full batch is flushed on the next add), and on this kernel through one
    /// `process_madvise` per flush.
    #[test]
    fn discard_batch_drops_its_ranges_and_nothing_else() {
        const NR_PAGES: usize = 96;
        let m = Mapping::anonymous(NR_PAGES * PAGE_SIZE, MapOptions { no_huge_pages: true, dont_fork: false }).unwrap();
        for i in 0..NR_PAGES {
            m.write(i * PAGE_SIZE, &[i as u8 + 1; PAGE_SIZE]);
        }
        // Every third page, the last of them with its neighbour: 32 ranges through a batch of 8.
        let dropped = |i: usize| i % 3 == 0 || i == 94;
        let mut batch = DiscardBatch::<8>::new();
        let mut i = 0;
        let mut nr_ranges = 0;
        while i < NR_PAGES {
            if dropped(i) {
                let len = if dropped(i + 1) { 2 } else { 1 };
                m.discard_later(&mut batch, i * PAGE_SIZE, len * PAGE_SIZE);
                nr_ranges += 1;
                i += len;
            } else {
                i += 1;
            }
        }
        assert_eq!(nr_ranges, 32);
        drop(batch);
        let mut buf = [0u8; PAGE_SIZE];
        for i in 0..NR_PAGES {
            m.read(i * PAGE_SIZE, &mut buf);
            let want = if dropped(i) { 0 } else { i as u8 + 1 };
            assert!(buf.iter().all(|&b| b == want), "page {i}: want {want}, found {}", buf[0]);
        }
        let kernel_has_it = std::fs::read_to_string("/proc/sys/kernel/osrelease")
            .ok()
            .and_then(|r| {
                let mut v = r.trim().split(['.', '-']).map(|x| x.parse::<u32>().unwrap_or(0));
                Some((v.next()?, v.next()?))
            })
            .is_some_and(|v| v >= (6, 15));
        if kernel_has_it {
            assert_eq!(PROCESS_MADVISE_SELF.load(std::sync::atomic::Ordering::Relaxed), 1, "process_madvise fell back");
        }
    }

    /// A length that is not whole pages counts its partial last page, and ends: rounding it
    /// down used to leave a round of zero pages that never moved on.
    #[test]
    fn mincore_of_a_partial_page_counts_it_and_ends() {
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let mut pages = vec![AlignedPage([0; PAGE_SIZE]); 2];
            pages[0].0[0] = 1;
            pages[1].0[0] = 1;
            let addr = pages.as_ptr() as usize;
            let r = (mincore_pages(addr, 100).ok(), mincore_pages(addr, PAGE_SIZE + 1).ok());
            tx.send(r).unwrap();
        });
        let r = rx.recv_timeout(std::time::Duration::from_secs(10)).expect("stuck in mincore_pages on a partial page");
        assert_eq!(r, (Some(1), Some(2)));
    }
}
