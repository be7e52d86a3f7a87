//! A reservation: a large engine mapping that stays inaccessible (`PROT_NONE`) but for the
//! windows the engine has come to use.
//!
//! The engine sizes some mappings for the worst case: a staging page for every slot of a
//! device (48 GiB with `zpool` on a 24 GiB machine), an arena for the pool's cap (half the
//! RAM). Readable and writable from the start, they cost nothing until touched, but a
//! program that reads every readable mapping of its address space (stress-ng's `--fork-vm`
//! children, a memory scanner) read them whole, page by page, as the kernel's zero page:
//! seconds of page faults and page tables for nothing. Opened window by window, only what
//! the engine used is readable, and `/proc/self/maps` lists the rest as `---p`.
//!
//! Locking: none. A window's bit is set once its `mprotect` has returned; two threads that
//! both find it clear both open it (the calls are idempotent). Windows never close: the
//! engine uses a part it used once again, with no system call on its hot paths.
//!
//! Invariant: a set bit means its window is readable and writable (and not locked).

use std::io;
use std::ops::Deref;
use std::sync::atomic::{AtomicU64, Ordering};

use super::{make_accessible, MapOptions, Mapping};

/// Bytes opened at a time. Few enough system calls (two per 64 MiB the engine comes to
/// use) and few enough mappings (a window opened alone splits its reservation in three).
pub const WINDOW_BYTES: usize = 64 << 20;

/// An engine mapping opened in windows of [`WINDOW_BYTES`] (see the module documentation).
/// Reads as the [`Mapping`] it is; the caller opens a range before it moves or writes pages
/// there.
#[derive(Debug)]
pub struct Reservation {
    mapping: Mapping,
    /// Bit `w` of word `w / 64`: window `w`, `[w * WINDOW_BYTES, (w + 1) * WINDOW_BYTES)`,
    /// is open.
    open: Box<[AtomicU64]>,
}

impl Reservation {
    /// Reserves `len` bytes (rounded up to pages) of private anonymous memory, every window
    /// closed.
    pub fn new(len: usize, opts: MapOptions) -> io::Result<Reservation> {
        let mapping = Mapping::inaccessible(len, opts)?;
        let nr_windows = mapping.len().div_ceil(WINDOW_BYTES);
        let open = (0..nr_windows.div_ceil(64)).map(|_| AtomicU64::new(0)).collect();
        Ok(Reservation { mapping, open })
    }

    /// Opens the windows that `[offset, offset + len)` touches. After it returns `Ok`, the
    /// range is readable and writable for good. Async-signal-safe: atomics and, for a window
    /// not yet open, two system calls.
    #[inline]
    pub fn open(&self, offset: usize, len: usize) -> io::Result<()> {
        assert!(len > 0 && offset + len <= self.mapping.len(), "range {offset:#x}+{len:#x} outside the reservation");
        for w in offset / WINDOW_BYTES..=(offset + len - 1) / WINDOW_BYTES {
            if !self.is_open(w) {
                self.open_window(w)?;
            }
        }
        Ok(())
    }

    fn is_open(&self, w: usize) -> bool {
        self.open[w / 64].load(Ordering::Acquire) & (1 << (w % 64)) != 0
    }

    /// Unlocked first: `mprotect` makes a window of a mapping the kernel locked (a raw
    /// `mlockall(MCL_CURRENT)` of the program's, see `lock_all`) writable by bringing it in
    /// whole.
    #[cold]
    fn open_window(&self, w: usize) -> io::Result<()> {
        let start = w * WINDOW_BYTES;
        let len = WINDOW_BYTES.min(self.mapping.len() - start);
        make_accessible((self.mapping.addr() + start) as *mut libc::c_void, len, false, true)?;
        self.open[w / 64].fetch_or(1 << (w % 64), Ordering::Release);
        Ok(())
    }

    /// Windows open.
    #[cfg(test)]
    pub fn open_windows(&self) -> usize {
        self.open.iter().map(|b| b.load(Ordering::Relaxed).count_ones() as usize).sum()
    }
}

impl Deref for Reservation {
    type Target = Mapping;

    fn deref(&self) -> &Mapping {
        &self.mapping
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mapping::self_maps;

    /// Whether `/proc/self/maps` lists the mapping that holds `addr` as readable.
    fn listed_readable(addr: usize) -> bool {
        let maps = self_maps().expect("reading /proc/self/maps");
        maps.iter().find(|m| m.start <= addr && addr < m.end).expect("a mapping holds the address").readable
    }

    #[test]
    fn only_opened_windows_are_accessible_and_opening_is_idempotent() {
        let r = Reservation::new(4 * WINDOW_BYTES, MapOptions { no_huge_pages: true, dont_fork: true })
            .expect("reserving 256 MiB");
        assert_eq!(r.open_windows(), 0);
        assert!(!listed_readable(r.addr()), "closed at first");
        // A range across the boundary of windows 1 and 2 opens both, and only them.
        r.open(2 * WINDOW_BYTES - 4096, 8192).expect("opening");
        assert_eq!(r.open_windows(), 2);
        assert!(!listed_readable(r.addr()));
        assert!(listed_readable(r.addr() + WINDOW_BYTES));
        assert!(listed_readable(r.addr() + 2 * WINDOW_BYTES));
        assert!(!listed_readable(r.addr() + 3 * WINDOW_BYTES));
        r.open(WINDOW_BYTES, 4096).expect("opening again");
        assert_eq!(r.open_windows(), 2);
        let page = [0x5au8; 4096];
        r.write(2 * WINDOW_BYTES - 4096, &page);
        r.write(2 * WINDOW_BYTES, &page);
        let mut back = [0u8; 4096];
        r.read(2 * WINDOW_BYTES, &mut back);
        assert_eq!(back, page);
        assert_eq!(r.resident_pages(WINDOW_BYTES, 2 * WINDOW_BYTES).expect("mincore"), 2);
    }
}
