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
//! The folder, one job a file: this file's [`Mapping`], [`AppMapping`] and [`PageRun`];
//! [`registry`], the process-wide table of managed mappings that the fault path searches by
//! address; [`handler_stack`], the stacks signal-mode faults are served on; `engine_thread`,
//! which starts the engine's threads (signals blocked, stacks noted, panics abort);
//! `engine_ranges`, the engine's own mappings by address; `reservation`, large areas opened
//! as the engine first uses them; `lock_all`, the program's
//! `mlockall` kept off them; `discard`, batched drops with one
//! TLB flush; `tables`, large lazily zero-filled tables; `probe`, questions to the page
//! table (`mincore`, pagemap) and the process's mappings (`/proc/self/maps`); `page_buf`, the bounce buffers' pages; `cpu`, the CPUs;
//! `rlimit`, the address-space limit and the machine's RAM.

mod cpu;
mod discard;
mod engine_ranges;
mod engine_thread;
pub mod handler_stack;
mod lock_all;
mod page_buf;
mod probe;
pub mod registry;
mod reservation;
mod rlimit;
mod tables;

pub use cpu::{allowed_cpus, current_cpu, nr_cpus_configured, pin_current_thread};
pub use discard::{drop_in_place, syscall6, DiscardBatch};
pub use engine_ranges::{engine_reserved_bytes, forget_engine_memory, is_engine_memory, note_engine_memory};
pub use engine_thread::{
    become_program_thread, forget_engine_threads_in_fork_child, is_engine_thread, live_engine_threads,
    spawn_engine_thread,
};
pub use lock_all::{lock_all_brought_nothing_in, mlockall, munlockall, note_lock_on_fault};
pub use page_buf::PageBuf;
pub use probe::{
    for_each_exclusive_page, for_each_line_of, for_each_maps_line, for_each_present_page, maps_text, mincore_bitmap,
    mincore_pages, mincore_pages_where, page_present, populate_write, self_maps, MapsEntry, MAPS_LINE_BYTES,
};
pub use reservation::{Reservation, WINDOW_BYTES};
pub use rlimit::{
    address_space_limit, address_space_limit_bytes, cgroup_room_bytes, mem_available_bytes, ram_bytes, read_small_file,
    AddressSpaceLimit,
};
pub use tables::{AtomicTable, ZeroedArray};

use std::io;
use std::sync::atomic::AtomicU64;

use engine_ranges::{forget_engine_range, note_engine_data};
pub(crate) use engine_ranges::{leave_engine_data_out_of_core_dump, leave_out_of_core_dump};

use crate::uffd::PAGE_SIZE;

/// In a fork child (its one thread, before it runs): no `mlockall(MCL_FUTURE)` of the
/// parent's holds (mlockall(2)), and the parent's engine mappings the child did not get are
/// no longer the engine's.
pub(crate) fn forget_in_fork_child() {
    lock_all::forget_in_fork_child();
    engine_ranges::forget_not_inherited_in_fork_child();
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
        Mapping::private(len, opts, false, true)
    }

    /// As [`Mapping::anonymous`], but inaccessible (`PROT_NONE`) until parts of it are opened
    /// (see [`Reservation`]).
    fn inaccessible(len: usize, opts: MapOptions) -> io::Result<Mapping> {
        Mapping::private(len, opts, false, false)
    }

    /// As [`Mapping::anonymous`]; `app`: the program's memory, which its `mlockall(MCL_FUTURE)`
    /// locks (see [`Mapping::fresh`]); `accessible`: readable and writable, else `PROT_NONE`.
    fn private(len: usize, opts: MapOptions, app: bool, accessible: bool) -> io::Result<Mapping> {
        Mapping::private_aligned(len, PAGE_SIZE, opts, app, accessible)
    }

    /// As [`Mapping::private`], starting at a multiple of `align_bytes` (a power of two, at
    /// least a page).
    fn private_aligned(
        len: usize,
        align_bytes: usize,
        opts: MapOptions,
        app: bool,
        accessible: bool,
    ) -> io::Result<Mapping> {
        let m = Mapping::fresh(len, align_bytes, libc::MAP_PRIVATE, app, accessible)?;
        let len = m.len;
        if opts.no_huge_pages {
            m.advise(0, len, libc::MADV_NOHUGEPAGE)?;
        }
        if opts.dont_fork {
            m.advise(0, len, libc::MADV_DONTFORK)?;
            engine_ranges::note_inherited(m.addr, false);
        }
        Ok(m)
    }

    /// Maps `len` bytes (rounded up to pages) of zero-filled memory shared with every fork
    /// child (`MAP_SHARED | MAP_ANONYMOUS`, reserved lazily): what one process writes, the
    /// others read.
    pub fn shared_anonymous(len: usize) -> io::Result<Mapping> {
        Mapping::fresh(len, PAGE_SIZE, libc::MAP_SHARED, false, true)
    }

    /// A fresh, lazily reserved anonymous mapping of `len` bytes rounded up to pages,
    /// `MAP_PRIVATE` or `MAP_SHARED` (`sharing`), noted as the engine's unless it is the
    /// program's (`app`).
    ///
    /// It is made inaccessible first: while the program's `mlockall(MCL_FUTURE)` holds, the
    /// kernel locks a new mapping and, a private one, brings it in whole when it becomes
    /// accessible (a staging area of tens of GiB; an application region's pages, behind the
    /// engine's back), so it is then unlocked (the engine's) or locked on fault (`app`: its
    /// pages are locked as they are touched, as `mlock2(MLOCK_ONFAULT)` locks) before it is
    /// made accessible. Noted before that, so that an `mlockall` under way leaves it out (see
    /// `lock_all`). Without `accessible` it stays `PROT_NONE` (a [`Reservation`]).
    ///
    /// It starts at a multiple of `align_bytes` (a power of two, at least a page): the kernel
    /// aligns only to pages, so a larger alignment maps `align_bytes` more and unmaps the
    /// ends, while all of it is still `PROT_NONE` and no one else's.
    fn fresh(len: usize, align_bytes: usize, sharing: libc::c_int, app: bool, accessible: bool) -> io::Result<Mapping> {
        assert!(align_bytes.is_power_of_two() && align_bytes >= PAGE_SIZE, "alignment {align_bytes:#x}");
        let len = len.div_ceil(PAGE_SIZE) * PAGE_SIZE;
        let slack = align_bytes - PAGE_SIZE;
        let mapped = len.checked_add(slack).ok_or_else(|| io::Error::from_raw_os_error(libc::ENOMEM))?;
        let epoch = lock_all::epoch();
        // SAFETY: a fresh anonymous mapping at an address the kernel chooses; it aliases
        // nothing we own.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                mapped,
                libc::PROT_NONE,
                sharing | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
                -1,
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        let addr = trim_to_alignment(p as usize, mapped, len, align_bytes)?;
        let p = addr as *mut libc::c_void;
        let m = Mapping { addr, len };
        if !app {
            note_engine_data(m.addr, len);
        }
        if accessible {
            make_accessible(p, len, app, lock_all::must_unlock(epoch))?;
        } else if lock_all::must_unlock(epoch) {
            // Opening a window unlocks that window again (`Reservation`).
            keep_out_of_locks(p, len, app)?;
        }
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
        if self.advise(0, self.len, if inherit { libc::MADV_DOFORK } else { libc::MADV_DONTFORK }).is_ok() {
            engine_ranges::note_inherited(self.addr, inherit);
        }
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
        batch.add((self.addr + offset) as *mut libc::c_void, len);
    }

    /// Copies `dst.len()` bytes out of the mapping.
    ///
    /// The caller must own the pages it reads (no concurrent writer) and, if the mapping is
    /// registered with userfaultfd, they must be populated (a missing page would fault into
    /// the engine itself, or, in a staging area, read as zeros).
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

/// Makes `[p, p + len)`, a mapping just made inaccessible, readable and writable; first, if
/// `unlock` (see [`Mapping::fresh`]), [`keep_out_of_locks`]. The system calls themselves:
/// `uswap run`'s library interposes the C library's functions, for the program's memory.
fn make_accessible(p: *mut libc::c_void, len: usize, app: bool, unlock: bool) -> io::Result<()> {
    if unlock {
        keep_out_of_locks(p, len, app)?;
    }
    // SAFETY: the caller's fresh mapping, which nothing uses yet; a protection change on it
    // changes how it is accessed, not what is mapped.
    if unsafe { libc::syscall(libc::SYS_mprotect, p, len, libc::PROT_READ | libc::PROT_WRITE) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Unlocks `[p, p + len)` (the engine's) or locks it on fault (`app`), where the program's
/// `mlockall(MCL_FUTURE)` locked it as it was mapped: made accessible, it would be brought
/// in whole; inaccessible, it would count in the process's locked memory.
fn keep_out_of_locks(p: *mut libc::c_void, len: usize, app: bool) -> io::Result<()> {
    // SAFETY: the caller's fresh mapping, which nothing uses yet; locking calls on it change
    // how it is kept, not what is mapped.
    let r = unsafe {
        if app {
            libc::syscall(libc::SYS_mlock2, p, len, libc::MLOCK_ONFAULT)
        } else {
            libc::syscall(libc::SYS_munlock, p, len)
        }
    };
    if r != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
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
        AppMapping::aligned_with_fork(len, PAGE_SIZE, inherit)
    }

    /// As [`AppMapping::with_fork`], starting at a multiple of `align_bytes` (a power of two,
    /// at least a page).
    pub fn aligned_with_fork(len: usize, align_bytes: usize, inherit: bool) -> io::Result<AppMapping> {
        let opts = MapOptions { no_huge_pages: true, dont_fork: !inherit };
        let m = Mapping::private_aligned(len, align_bytes, opts, true, true)?;
        let (addr, len) = (m.addr, m.len);
        // The application's memory from now on, which the handle unmaps.
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

/// Of the fresh `PROT_NONE` mapping `[start, start + mapped)`, keeps the `len` bytes from
/// its first multiple of `align_bytes` and unmaps the rest; returns where they start. If
/// the kernel refuses to unmap an end (a mapping merged with a neighbour, at
/// `vm.max_map_count`), all of it goes and the error is returned.
fn trim_to_alignment(start: usize, mapped: usize, len: usize, align_bytes: usize) -> io::Result<usize> {
    let addr = start.next_multiple_of(align_bytes);
    assert!(addr + len <= start + mapped, "{len:#x} bytes at {addr:#x} outside {mapped:#x} at {start:#x}");
    // What is still this function's: after the head goes, another thread may map there.
    let mut ours = start;
    for (from, to) in [(start, addr), (addr + len, start + mapped)] {
        // SAFETY: a part of the fresh mapping this function was given and keeps no part
        // of; nothing refers to it.
        if from < to && unsafe { libc::munmap(from as *mut libc::c_void, to - from) } != 0 {
            let e = io::Error::last_os_error();
            // SAFETY: what is left of the fresh mapping, still no one's.
            unsafe { libc::munmap(ours as *mut libc::c_void, start + mapped - ours) };
            return Err(e);
        }
        ours = addr;
    }
    Ok(addr)
}

/// Unmaps `[addr, addr + len)` of application memory the engine owns (a plain region, or the
/// parts of a managed region that are still its own, unregistered first).
pub fn unmap_app_range(addr: usize, len: usize) {
    // SAFETY: the caller owns the range (it is still the region's, not the application's
    // other memory); no Rust reference to it outlives this call.
    unsafe { libc::munmap(addr as *mut libc::c_void, len) };
}

/// Whether `uswap run`'s library (`uswap-preload`) is loaded in this process and pages it:
/// it exports `uswap_run_library`, which says 0 where it stands aside (`USWAP_DISABLE`, a
/// program's own allocator, a fork child that could not get a pager). Not async-signal-safe
/// (`dlsym`).
pub fn run_library_loaded() -> bool {
    // SAFETY: dlsym with the default search scope and a NUL-terminated name only looks the
    // symbol up.
    let f = unsafe { libc::dlsym(libc::RTLD_DEFAULT, c"uswap_run_library".as_ptr()) };
    if f.is_null() {
        return false;
    }
    // SAFETY: the symbol is the preload's `extern "C" fn() -> c_int` of that name, which
    // reads an atomic.
    let active = unsafe { std::mem::transmute::<*mut libc::c_void, extern "C" fn() -> libc::c_int>(f) };
    active() != 0
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
            assert_eq!(
                discard::PROCESS_MADVISE_SELF.load(std::sync::atomic::Ordering::Relaxed),
                1,
                "process_madvise fell back"
            );
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
