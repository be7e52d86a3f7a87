//! Buffers of whole pages that the engine owns and lends whole, committed only as they are
//! used (see [`PageBuf`]).

use std::io;

use super::{AlignedPage, MapOptions, Mapping};
use crate::uffd::PAGE_SIZE;

/// Zeroed, page-aligned pages of the engine's own, in an anonymous mapping of their own
/// (noted as the engine's): nothing is committed until a page is touched. For buffers sized
/// for the worst case, lent whole to one user at a time (the bounce buffers: written as
/// heap memory, they faulted in 2 MiB at every pager's start).
pub struct PageBuf {
    map: Mapping,
    nr_pages: usize,
}

impl PageBuf {
    pub fn zeroed(nr_pages: usize) -> io::Result<PageBuf> {
        let map =
            Mapping::anonymous(nr_pages.max(1) * PAGE_SIZE, MapOptions { no_huge_pages: false, dont_fork: false })?;
        Ok(PageBuf { map, nr_pages })
    }

    /// The pages as one run of bytes.
    pub fn as_bytes(&self) -> &[u8] {
        // SAFETY: as for `deref`: `nr_pages` readable pages, contiguous, living as long as
        // `self`, written only through `&mut self`.
        unsafe { std::slice::from_raw_parts(self.map.addr as *const u8, self.nr_pages * PAGE_SIZE) }
    }
}

impl std::ops::Deref for PageBuf {
    type Target = [AlignedPage];
    fn deref(&self) -> &[AlignedPage] {
        // SAFETY: the mapping is page-aligned, readable and `nr_pages` pages long, lives as
        // long as `self`, and is written only through `deref_mut` (it is private).
        unsafe { std::slice::from_raw_parts(self.map.addr as *const AlignedPage, self.nr_pages) }
    }
}

impl std::ops::DerefMut for PageBuf {
    fn deref_mut(&mut self) -> &mut [AlignedPage] {
        // SAFETY: as for `deref`, and `&mut self` makes this the only reference to it.
        unsafe { std::slice::from_raw_parts_mut(self.map.addr as *mut AlignedPage, self.nr_pages) }
    }
}
