//! The application's region types: [`Region`], a managed mapping, and [`PlainRegion`], an
//! ordinary one with the same accessors (for baselines).
//!
//! A `Region` is the handle [`Pager::map`] returns: the engine's view of the region (page
//! table, registry entry) is `crate::region`, which knows nothing of the public `Pager`;
//! this module ties the two handles together (a region keeps its pager's threads alive,
//! and tells which pager it belongs to).
//!
//! Locking: none of its own. Invariants: the engine lets go of a region (every slot and
//! staged page freed, see `crate::release`) before its memory is unmapped, and
//! the pager's threads outlive every region of the pager.

use std::sync::Arc;

use crate::error::{Error, Result};
use crate::mapping::AppMapping;
use crate::options::FaultMode;
use crate::pager::{check_sigbus_handler, Pager};
use crate::readahead::Advice;
use crate::region::{RegionInner, MAX_REGIONS, MAX_REGION_BYTES, REGIONS};
use crate::state::REGISTER_MODES;
use crate::uffd::PAGE_SIZE;

/// A managed mapping: zero-filled at first, page-aligned, its resident pages counted against
/// its pager's limit. Pages are brought back on first touch, from any thread.
///
/// Dropping the region unmaps it and frees every swap slot and swap-cache page it held.
pub struct Region {
    inner: Arc<RegionInner>,
    reg_idx: usize,
    /// The registry slot's generation when the region was inserted (reclaim-queue entries
    /// name the region by slot and generation).
    reg_gen: u32,
    // Keeps the pager's threads alive while the region exists, even if every `Pager` handle
    // was dropped first.
    pager: Pager,
    /// Set by [`Region::release_leaving_mapped`]: dropping it unmaps nothing.
    leave_mapped: bool,
}

impl Region {
    pub(crate) fn new(inner: Arc<RegionInner>, (reg_idx, reg_gen): (usize, u32), pager: Pager) -> Region {
        Region { inner, reg_idx, reg_gen, pager, leave_mapped: false }
    }

    /// The engine's view of the region.
    pub(crate) fn inner(&self) -> &RegionInner {
        &self.inner
    }

    /// The region's registry slot and its generation.
    pub(crate) fn registry_slot(&self) -> (usize, u32) {
        (self.reg_idx, self.reg_gen)
    }

    /// The memory, where it is now (the application may have moved it with `mremap`).
    fn memory(&self) -> &AppMapping {
        self.inner.memory()
    }

    /// First byte of the region.
    pub fn as_ptr(&self) -> *mut u8 {
        self.memory().addr() as *mut u8
    }

    /// Length in bytes (a whole number of pages).
    pub fn len(&self) -> usize {
        self.memory().len()
    }

    pub fn is_empty(&self) -> bool {
        self.memory().is_empty()
    }

    /// The region as a byte slice. Touching a page that is not resident brings it back
    /// transparently (in signal mode only from user code: a system call given this slice
    /// gets EFAULT on a page that is not resident).
    pub fn as_slice(&self) -> &[u8] {
        self.memory().as_slice()
    }

    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        // `&mut self`: no other slice of this region lives (the inner state never makes one).
        self.inner.memory().as_mut_slice_shared()
    }

    /// The region as 64-bit atomic words, for threads that share it (mixing this with
    /// `as_slice` on the same bytes at the same time is a data race, as for any memory).
    pub fn as_atomic_u64s(&self) -> &[std::sync::atomic::AtomicU64] {
        self.memory().as_atomic_u64s()
    }

    /// Pages of this region mapped in the process page table right now, measured with
    /// `mincore(2)` (independent of the engine's own counters).
    pub fn mapped_pages(&self) -> std::io::Result<usize> {
        self.memory().resident_pages(0, self.memory().len())
    }

    /// Like [`Region::mapped_pages`] for the pages overlapping `[offset, offset + len)`.
    pub fn mapped_pages_in(&self, offset: usize, len: usize) -> std::io::Result<usize> {
        let start = offset / PAGE_SIZE * PAGE_SIZE;
        let end = (offset + len).div_ceil(PAGE_SIZE) * PAGE_SIZE;
        if end > self.memory().len() || len == 0 {
            return Err(std::io::Error::from(std::io::ErrorKind::InvalidInput));
        }
        self.memory().resident_pages(start, end - start)
    }

    /// Tells the engine how the region will be accessed (like `madvise`): `Sequential` always
    /// reads ahead the maximum window, `Random` never reads ahead, `Normal` (the default)
    /// adapts the window to the faults it sees.
    pub fn advise(&self, advice: Advice) {
        self.inner.streams.advise(advice);
    }

    /// The pager this region belongs to.
    pub fn pager(&self) -> &Pager {
        &self.pager
    }

    /// Whether any page is still the region's: false once the application unmapped every
    /// page of it (in pieces, `munmap` or `MAP_FIXED` over it). Waits until the events the
    /// kernel has sent so far are applied, so that an `munmap` that returned is counted.
    /// Stops at the first page still the region's: the interposed `munmap` asks after every
    /// partial unmap, and a scan of all of a 16 GiB reservation's pages each time (a
    /// program's break, a runtime's heap) took 95 % of the program's time.
    pub fn has_live_pages(&self) -> bool {
        let start = self.inner.start();
        self.owns_any_in(start, start + self.inner.nr_pages * PAGE_SIZE)
    }

    /// Whether any page of `[start, end)` (clipped to the region) is still the region's,
    /// once the events the kernel has sent so far are applied, as [`Region::has_live_pages`].
    pub fn owns_any_in(&self, start: usize, end: usize) -> bool {
        let shared = self.pager.shared();
        let _reader = shared.events.reader.lock().unwrap_or_else(|e| e.into_inner());
        self.inner.owns_any_of(start, end)
    }
}

impl Pager {
    /// Maps a managed region of `len_bytes` (rounded up to whole pages), zero-filled. Zero
    /// bytes and more than [`MAX_REGION_BYTES`] are refused.
    ///
    /// Signal mode: fails with [`Error::SigbusHandlerReplaced`] if the process's SIGBUS
    /// handler is no longer uswap's. Faults are served on the faulting thread's stack, which
    /// needs room for the handler below the deepest frame that touches managed memory (see
    /// docs/fault-modes.md).
    pub fn map(&self, len_bytes: usize) -> Result<Region> {
        self.map_aligned(len_bytes, PAGE_SIZE)
    }

    /// As [`Pager::map`], the region starting at a multiple of `align_bytes`, a power of two
    /// from a page to [`MAX_REGION_BYTES`], else [`Error::BadAlignment`] (a program's
    /// `posix_memalign` of 2 MiB, for a buffer it wants in one huge page).
    pub fn map_aligned(&self, len_bytes: usize, align_bytes: usize) -> Result<Region> {
        if !align_bytes.is_power_of_two() || !(PAGE_SIZE..=MAX_REGION_BYTES).contains(&align_bytes) {
            return Err(Error::BadAlignment { align_bytes: align_bytes as u64, page_size: PAGE_SIZE });
        }
        self.check_owner()?;
        if self.shared().mode == FaultMode::Signal {
            check_sigbus_handler()?;
        }
        if len_bytes == 0 {
            return Err(Error::ZeroLengthMap { page_size: PAGE_SIZE });
        }
        // Checked before rounding: rounding a size near usize::MAX up to whole pages would
        // overflow. MAX_REGION_BYTES is whole pages, so the rounded size stays within it.
        const { assert!(MAX_REGION_BYTES % PAGE_SIZE == 0) };
        if len_bytes > MAX_REGION_BYTES {
            return Err(Error::MapTooLarge { len_bytes: len_bytes as u64, max_bytes: MAX_REGION_BYTES as u64 });
        }
        let len = len_bytes.div_ceil(PAGE_SIZE) * PAGE_SIZE;
        let survive_fork = self.shared().regions_survive_fork;
        let memory = AppMapping::aligned_with_fork(len, align_bytes, survive_fork).map_err(|e| {
            Error::OutOfAddressSpace { what: "a managed region".into(), len_bytes: len as u64, source: e }
        })?;
        let _signals = crate::uffd::AsyncSignalsBlocked::new();
        let shared = self.shared();
        shared
            .uffd
            .register(memory.addr(), len, REGISTER_MODES)
            .map_err(|e| Error::io("registering the region with userfaultfd", e))?;
        let addr = memory.addr();
        let inner = Arc::new(
            RegionInner::new(memory, self.shared_arc().clone())
                .map_err(|e| Error::io("allocating the region's page table", e))?,
        );
        // A new mapping starts unlocked, whatever was locked at these addresses before.
        // After any late `UNMAP` of what was at these addresses before (which would take
        // the new region's pages, its lock and its advice).
        crate::events::settle_unmaps(&shared.events, &shared.stats);
        crate::mlock::unlock(None, addr, addr + len);
        crate::fork_advice::forget(addr, addr + len);
        let Some(slot) = REGIONS.insert(addr, addr + len, inner.clone()) else {
            let _ = shared.uffd.unregister(addr, len);
            crate::mapping::unmap_app_range(addr, len);
            return Err(Error::TooManyRegions { max: MAX_REGIONS });
        };
        Ok(Region::new(inner, slot, self.clone()))
    }
}

impl std::fmt::Debug for Region {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Region")
            .field("addr", &format_args!("{:#x}", self.memory().addr()))
            .field("len", &self.memory().len())
            .finish()
    }
}

impl Region {
    /// Lets go of the region as dropping it does (every slot and staged page freed, the
    /// charge given back), but leaves what is still its memory mapped, as ordinary memory,
    /// and returns those ranges, `(address, bytes)`: for a caller that unmaps the whole range
    /// itself at once (a program's `munmap`). Dropping the region and then unmapping the
    /// range again would leave a moment in which the kernel can hand the freed addresses to
    /// another thread's new mapping, which the second unmap would then take from it.
    pub fn release_leaving_mapped(mut self) -> Vec<(usize, usize)> {
        let _signals = crate::uffd::AsyncSignalsBlocked::new();
        self.leave_mapped = true;
        self.pager.shared().release_cx().release_region(self.reg_idx, &self.inner)
    }
}

impl Drop for Region {
    fn drop(&mut self) {
        // In a fork child the engine's tables are the parent's (or gone): the child's copy
        // of the region, if it has one, is left as it is.
        if self.leave_mapped || !self.pager.in_owner() {
            return;
        }
        let _signals = crate::uffd::AsyncSignalsBlocked::new();
        // Unmaps what is still the region's, after the engine let go of it.
        self.pager.shared().release_cx().unmap_region(self.reg_idx, &self.inner);
    }
}

/// An ordinary anonymous mapping with the same accessors as [`Region`] but no pager behind
/// it: the kernel manages its pages (and swaps them, if the system swaps). For baselines
/// that must run the same code as a managed region.
#[derive(Debug)]
pub struct PlainRegion {
    memory: AppMapping,
}

impl PlainRegion {
    pub fn new(len_bytes: usize) -> crate::Result<PlainRegion> {
        let len = len_bytes.max(1).div_ceil(PAGE_SIZE) * PAGE_SIZE;
        AppMapping::new(len).map(|memory| PlainRegion { memory }).map_err(|e| crate::Error::OutOfAddressSpace {
            what: "a plain region".into(),
            len_bytes: len as u64,
            source: e,
        })
    }

    pub fn as_ptr(&self) -> *mut u8 {
        self.memory.addr() as *mut u8
    }

    pub fn len(&self) -> usize {
        self.memory.len()
    }

    pub fn is_empty(&self) -> bool {
        self.memory.is_empty()
    }

    pub fn as_slice(&self) -> &[u8] {
        self.memory.as_slice()
    }

    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        self.memory.as_mut_slice()
    }

    pub fn as_atomic_u64s(&self) -> &[std::sync::atomic::AtomicU64] {
        self.memory.as_atomic_u64s()
    }
}
