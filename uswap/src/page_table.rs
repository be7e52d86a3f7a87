//! The page table's entries: one atomic word per page of a region ([`Pte`]), and the
//! references by which reclaim queues and the swap cache name a page ([`PageRef`]).
//!
//! The page table has one atomic word per page ([`Pte`]): a state, a busy bit, a referenced
//! bit, a generation and, for pages on a device or in the swap cache, the swap entry. Every
//! transition is a compare-and-swap; whoever sets the busy bit owns the page until it clears
//! it, and only the owner may move the page's contents or change its state. There is no
//! lock on the fault path.
//!
//! Page states and who moves between them:
//!
//! ```text
//!   NONE ──fault──► RESIDENT ──reclaim: UFFDIO_MOVE out──► CACHED ──writeback──► SWAPPED
//!   ZERO ──fault──►    ▲  ▲                                   │                      │
//!     ▲                │  └──────fault: UFFDIO_MOVE back──────┘                      │
//!     │                └───────────────fault: read device, UFFDIO_COPY───────────────┘
//!     └── reclaim found the page all zero (no slot kept)
//! ```
//!
//! The generation changes whenever a page enters RESIDENT or CACHED; reclaim queues carry it
//! so a stale queue entry (the page moved on since) is recognised and skipped.
//!
//! A RESIDENT page may be *clean*: read back from a device and not written since. It is
//! mapped write-protected and keeps its slot; its first write takes a write-protect fault
//! that unprotects it and frees the slot, and reclaim drops a page still clean without
//! writing it (the kernel's clean swap-cache pages).
//!
//! A SWAPPED page may carry the *async-read* hint: an asynchronous readahead was started
//! for its slot and its data may be waiting in a buffer (see `async_readahead`). It changes
//! nothing else: the slot still holds the page, and whoever locks the page may read the slot.
//!
//! Invariants: a page is mapped in its region iff its state is RESIDENT (outside a busy
//! section); a CACHED page's contents are at its entry's staging address; a clean page's
//! slot holds its contents, and a clean resident page is write-protected. The regions
//! themselves, and the registry the fault path searches, are `crate::region`'s.

use crate::swap::SwapEntry;
use crate::uffd::PAGE_SIZE;

/// Regions that may exist at once in one process, over all pagers: as many as the kernel's
/// default `vm.max_map_count` lets a process map (V8 makes each 256 KiB page of its heap a
/// mapping; Node.js with two worker threads had some 10,000).
pub const MAX_REGIONS: usize = 1 << REF_IDX_BITS;
/// Largest region: page indices must fit in 32 bits of a reclaim-queue entry.
pub const MAX_REGION_BYTES: usize = (1usize << 32) * PAGE_SIZE;

// ---------------------------------------------------------------------------------------
// Page-table entries
// ---------------------------------------------------------------------------------------

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum PageState {
    /// Never touched: reads as zero, owns nothing.
    None = 0,
    /// Known to be zero (found so at swap-out): owns nothing.
    Zero = 1,
    /// Mapped in the region.
    Resident = 2,
    /// Staged in the swap cache: unmapped, contents at the entry's staging page.
    Cached = 3,
    /// On a device at its swap entry.
    Swapped = 4,
    /// No longer the region's: the application unmapped it (or moved it out with a partial
    /// `mremap`). Owns nothing; the engine never touches the address again (see `events`).
    Gone = 5,
    /// Mapped write-protected and shared, so not charged and not on the LRU; its first write
    /// charges it and makes it `Resident`. Either the kernel's zero page, mapped for a read
    /// of a page never written (it costs no memory, as in the kernel), or a page inherited at
    /// a fork from the parent (a re-armed fork child, see `Pager::prepare_fork`): shared
    /// copy-on-write with it, the parent's charge covering it, as a memory cgroup charges a
    /// shared page once.
    Shared = 6,
    /// Out at the fork (a re-armed fork child, see `Pager::prepare_fork`): its contents are
    /// at the entry's slot of the *parent's* device, in the copy of that device's memory the
    /// child inherited (copy-on-write; only memory devices are inherited). Not charged, not
    /// on the LRU, owns no slot of this pager's: its first touch reads it from there,
    /// charges it and makes it `Resident`.
    Parent = 7,
}

impl PageState {
    /// Whether a page may go from `self` to `to` (the diagram in the module doc, plus what
    /// the application does to a range: a discard or an adoption makes any page `None` or
    /// `Zero`, an unmap makes it `Gone`, and a fork child's table starts from `None`).
    /// [`Pte::next`] asserts it, as the kernel's `VM_BUG_ON_PAGE` asserts a page's state.
    pub fn may_become(self, to: PageState) -> bool {
        use PageState::*;
        match to {
            None | Gone => true,
            Zero => self != Gone,
            // A clean page's first write (`Resident` again, dirty), a fault on any state
            // that is not gone.
            Resident => self != Gone,
            // The zero page for a read; a fork child's inherited page.
            Shared => matches!(self, None | Zero),
            Cached => self == Resident,
            // A clean page dropped, a staged page written, a page moved down a tier.
            Swapped => matches!(self, Resident | Cached | Swapped),
            Parent => self == None,
        }
    }
}

const STATE_MASK: u64 = 0x7;
const BUSY: u64 = 1 << 3;
const REFERENCED: u64 = 1 << 4;
/// Resident, write-protected, unchanged since it was read from its slot, which it keeps:
/// reclaim can drop it without writing it. A CACHED page is clean when the aging scan staged
/// a clean page in its own slot, which still holds it: writeback drops it without a write.
const CLEAN: u64 = 1 << 5;
/// Mapped by readahead and not yet known to be used (see `readahead`).
const READAHEAD: u64 = 1 << 6;
/// A SWAPPED page whose slot an asynchronous readahead may have read into a buffer (see
/// `async_readahead`). A hint only: the page is SWAPPED in every respect.
const ASYNC_READ: u64 = 1 << 7;
/// A RESIDENT page reclaim found locked (`crate::mlock`) and took off the LRU, as the
/// kernel moves a locked page to its unevictable list; an unlock puts it back. Shares its
/// bit with [`ASYNC_READ`], which only a SWAPPED page carries.
const UNEVICTABLE: u64 = 1 << 7;
/// A CACHED page the aging scan staged, not reclaim (`crate::reclaim::aging`): its
/// swap-cache hit tests whether it is still in use and is not a stall on memory. Shares its
/// bit with [`ASYNC_READ`] and [`UNEVICTABLE`], which other states carry.
const AGED: u64 = 1 << 7;
const GEN_SHIFT: u32 = 8;
const GEN_MASK: u64 = 0xff << GEN_SHIFT;
const ENTRY_SHIFT: u32 = 16;

/// One page-table word.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Pte(pub u64);

impl Pte {
    pub fn state(self) -> PageState {
        match self.0 & STATE_MASK {
            0 => PageState::None,
            1 => PageState::Zero,
            2 => PageState::Resident,
            3 => PageState::Cached,
            4 => PageState::Swapped,
            5 => PageState::Gone,
            6 => PageState::Shared,
            _ => PageState::Parent,
        }
    }
    pub fn busy(self) -> bool {
        self.0 & BUSY != 0
    }
    pub fn referenced(self) -> bool {
        self.0 & REFERENCED != 0
    }
    pub fn clean(self) -> bool {
        self.0 & CLEAN != 0
    }
    pub fn readahead(self) -> bool {
        self.0 & READAHEAD != 0
    }
    /// Marks a page mapped by readahead.
    pub fn with_readahead(self) -> Pte {
        Pte(self.0 | READAHEAD)
    }
    /// Whether an asynchronous readahead may hold the page's data (a SWAPPED page).
    pub fn async_read(self) -> bool {
        self.0 & ASYNC_READ != 0
    }
    pub fn with_async_read(self) -> Pte {
        debug_assert_eq!(self.state(), PageState::Swapped);
        Pte(self.0 | ASYNC_READ)
    }
    pub fn without_async_read(self) -> Pte {
        Pte(self.0 & !ASYNC_READ)
    }
    /// Whether reclaim took this resident page off the LRU because it is locked.
    pub fn unevictable(self) -> bool {
        self.state() == PageState::Resident && self.0 & UNEVICTABLE != 0
    }
    pub fn with_unevictable(self, on: bool) -> Pte {
        debug_assert_eq!(self.state(), PageState::Resident);
        Pte(if on { self.0 | UNEVICTABLE } else { self.0 & !UNEVICTABLE })
    }
    /// Whether the aging scan staged this CACHED page.
    pub fn aged(self) -> bool {
        self.state() == PageState::Cached && self.0 & AGED != 0
    }
    pub fn with_aged(self) -> Pte {
        debug_assert_eq!(self.state(), PageState::Cached);
        Pte(self.0 | AGED)
    }
    /// The same word without the readahead mark (the page was used).
    pub fn without_readahead(self) -> Pte {
        Pte(self.0 & !READAHEAD)
    }
    pub fn gen(self) -> u8 {
        ((self.0 & GEN_MASK) >> GEN_SHIFT) as u8
    }
    pub fn entry(self) -> SwapEntry {
        SwapEntry::from_bits(self.0 >> ENTRY_SHIFT)
    }
    pub fn with_busy(self) -> Pte {
        Pte(self.0 | BUSY)
    }
    pub fn with_referenced(self, r: bool) -> Pte {
        Pte(if r { self.0 | REFERENCED } else { self.0 & !REFERENCED })
    }
    /// Marks a resident or staged page clean (it keeps the slot `entry()` names, which
    /// holds its contents).
    pub fn with_clean(self) -> Pte {
        debug_assert!(matches!(self.state(), PageState::Resident | PageState::Cached));
        Pte(self.0 | CLEAN)
    }
    /// A clean page that was written: not busy, not clean, no slot; same generation, so its
    /// reclaim-queue entry stays valid (and a page off the LRU stays off it).
    pub fn dirtied(self) -> Pte {
        Pte(self.0 & (STATE_MASK | REFERENCED | GEN_MASK | UNEVICTABLE))
    }
    /// A new, not-busy word in `state`, with the next generation and `entry` (if any).
    /// The referenced bit is carried over; the clean bit is not. Panics on a transition
    /// the page table does not allow ([`PageState::may_become`]): an engine bug, which
    /// would otherwise map the wrong page or leak a slot.
    pub fn next(self, state: PageState, entry: Option<SwapEntry>) -> Pte {
        assert!(
            self.state().may_become(state),
            "uswap invariant: page state {:?} may not become {state:?} ({self:?})",
            self.state()
        );
        debug_assert!(
            match state {
                PageState::Cached | PageState::Swapped | PageState::Parent => entry.is_some(),
                // A clean page keeps the slot it was read from.
                PageState::Resident => true,
                _ => entry.is_none(),
            },
            "a swap entry exactly for the states that hold one ({state:?}, {entry:?})"
        );
        let gen = self.gen().wrapping_add(1) as u64;
        Pte(state as u64 | (self.0 & REFERENCED) | (gen << GEN_SHIFT) | entry.map_or(0, |e| e.bits() << ENTRY_SHIFT))
    }
    /// The same word with the busy bit cleared and nothing else changed.
    pub fn unbusy(self) -> Pte {
        Pte(self.0 & !BUSY)
    }
}

// ---------------------------------------------------------------------------------------
// References to pages from reclaim queues and the swap cache
// ---------------------------------------------------------------------------------------

const REF_IDX_BITS: u32 = 16;
/// Few bits: a reference that outlived its region and matches a later one in the same slot
/// by chance (one in 256 reuses, and its page's generation too) names a live page, which
/// every user checks before acting (a queue entry's page is reclaimed if resident; an
/// owner's page only if it still holds that very slot).
const REF_GEN_BITS: u32 = 8;
pub(crate) const REGION_GEN_MASK: u32 = (1 << REF_GEN_BITS) - 1;
const _: () = assert!(MAX_REGIONS <= 1 << REF_IDX_BITS);

/// A page named by registry slot, region generation, page generation and page index: the
/// entries of the reclaim queues (64 bits, so they fit a lock-free queue of words).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct PageRef {
    pub region_idx: usize,
    pub region_gen: u32,
    pub page_gen: u8,
    pub page: usize,
}

impl PageRef {
    pub fn pack(self) -> u64 {
        (self.region_idx as u64) << 48
            | ((self.region_gen & REGION_GEN_MASK) as u64) << 40
            | (self.page_gen as u64) << 32
            | self.page as u64
    }
    pub fn unpack(v: u64) -> PageRef {
        PageRef {
            region_idx: (v >> 48) as usize,
            region_gen: ((v >> 40) & REGION_GEN_MASK as u64) as u32,
            page_gen: (v >> 32) as u8,
            page: (v & 0xffff_ffff) as usize,
        }
    }
    /// The swap-cache owner value (reverse map) of this page: like `pack` without the page
    /// generation, plus one so it is never zero.
    pub fn owner(self) -> u64 {
        ((self.region_idx as u64) << 40 | ((self.region_gen & REGION_GEN_MASK) as u64) << 32 | self.page as u64) + 1
    }

    /// Whether this reference names a page of the region in registry slot `index`, of
    /// generation `gen` and `nr_pages` pages. A reference that outlived its region can match
    /// a later one in the same slot by its few generation bits; its page may then lie past
    /// the later region's end, and it names no page of it.
    pub fn names_page_of(self, index: usize, gen: u32, nr_pages: usize) -> bool {
        self.region_idx == index && (gen ^ self.region_gen) & REGION_GEN_MASK == 0 && self.page < nr_pages
    }

    /// The page an owner value names (page generation unknown: 0).
    pub fn from_owner(v: u64) -> PageRef {
        let v = v - 1;
        PageRef {
            region_idx: (v >> 40) as usize,
            region_gen: ((v >> 32) & REGION_GEN_MASK as u64) as u32,
            page_gen: 0,
            page: (v & 0xffff_ffff) as usize,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pte_transitions_keep_fields() {
        assert_eq!(Pte(0).state(), PageState::None);
        let p = Pte(0).next(PageState::Resident, None);
        assert_eq!(p.gen(), 1);
        let e = SwapEntry::new(3, 12345);
        let q = p.next(PageState::Cached, Some(e));
        assert_eq!(q.state(), PageState::Cached);
        assert_eq!(q.entry(), e);
        assert_eq!(q.gen(), 2);
        assert!(!q.busy());
        let r = q.with_referenced(true).with_busy();
        assert!(r.busy() && r.referenced());
        let s = r.next(PageState::Resident, Some(e)).with_clean();
        assert!(s.referenced() && !s.busy() && s.clean());
        let d = s.with_busy().dirtied();
        assert!(!d.clean() && !d.busy() && d.referenced() && d.gen() == s.gen() && d.entry().bits() == 0);
        let s = r.next(PageState::Resident, None);
        assert!(s.referenced() && !s.busy() && !s.clean());
        assert_eq!(s.gen(), 3);
        assert_eq!(s.unbusy(), s);
        let mut g = Pte(0);
        for _ in 0..300 {
            g = g.next(PageState::Resident, None);
        }
        assert_eq!(g.gen(), (300 % 256) as u8, "generation wraps");
    }

    #[test]
    fn transitions_follow_the_diagram() {
        use PageState::*;
        let all = [None, Zero, Resident, Cached, Swapped, Gone, Shared, Parent];
        for from in all {
            assert!(from.may_become(Gone) && from.may_become(None), "{from:?}");
        }
        assert!(Resident.may_become(Cached) && Cached.may_become(Swapped) && Swapped.may_become(Resident));
        assert!(Cached.may_become(Resident) && Resident.may_become(Swapped) && Swapped.may_become(Swapped));
        assert!(None.may_become(Shared) && Zero.may_become(Shared) && Shared.may_become(Resident));
        assert!(None.may_become(Parent) && Parent.may_become(Resident));
        for from in [None, Zero, Cached, Swapped, Gone, Shared, Parent] {
            assert!(!from.may_become(Cached), "only a resident page is staged, not {from:?}");
        }
        for from in [None, Zero, Gone, Shared, Parent] {
            assert!(!from.may_become(Swapped), "{from:?} holds nothing to swap");
        }
        assert!(!Gone.may_become(Resident) && !Gone.may_become(Zero), "a gone page is never touched again");
        assert!(!Resident.may_become(Parent) && !Swapped.may_become(Shared));
    }

    #[test]
    #[should_panic(expected = "may not become Cached")]
    fn a_transition_from_the_wrong_state_panics() {
        let swapped = Pte(0).next(PageState::Resident, None).next(PageState::Swapped, Some(SwapEntry::new(0, 1)));
        let _ = swapped.next(PageState::Cached, Some(SwapEntry::new(0, 1)));
    }

    #[test]
    fn page_refs_round_trip() {
        let r = PageRef { region_idx: MAX_REGIONS - 1, region_gen: 0xbc, page_gen: 0x7f, page: 0xffff_fffe };
        assert_eq!(PageRef::unpack(r.pack()), r);
        assert!(r.owner() < 1 << crate::swap::swap_table::OWNER_BITS);
        let o = PageRef::from_owner(r.owner());
        assert_eq!((o.region_idx, o.region_gen, o.page), (r.region_idx, r.region_gen, r.page));
        // A registry generation past the packed bits comes back as its low bits, which is
        // what lookups compare (`REGION_GEN_MASK`).
        let wide = PageRef { region_gen: 0x3bc, ..r };
        assert_eq!(PageRef::unpack(wide.pack()).region_gen, 0xbc);
        assert_eq!(PageRef::from_owner(wide.owner()).region_idx, MAX_REGIONS - 1);
    }

    /// A queue entry of a 64-page region, left behind when the region went, matches a later
    /// 1-page region in the same slot whose generation agrees in the packed bits. Its page
    /// is past that region's end: reclaim read its word out of bounds and panicked (seen
    /// once under Erlang-like churn of mappings).
    #[test]
    fn a_page_ref_names_no_page_past_a_later_regions_end() {
        let stale = PageRef { region_idx: 7, region_gen: 0x12, page_gen: 1, page: 63 };
        assert!(stale.names_page_of(7, 0x12, 64));
        let later_gen = 0x12 + (REGION_GEN_MASK + 1);
        assert!(!stale.names_page_of(7, later_gen, 1), "page 63 of a 1-page region");
        assert!(PageRef { page: 0, ..stale }.names_page_of(7, later_gen, 1), "the packed bits alone are compared");
        assert!(!stale.names_page_of(7, 0x13, 64) && !stale.names_page_of(8, 0x12, 64));
    }
}
