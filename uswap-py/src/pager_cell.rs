//! A Python pager's engine objects: its `uswap::Pager` and the handle of every region it
//! mapped for Python (a `uswap.Region` object or a numpy block), kept together in one table
//! per pager so that a fork child can put its own pager's handles in their place (`fork`).
//!
//! Python objects hold the cell (`Arc<PagerCell>`) and a region's key in its table, never an
//! engine handle: the cell keeps the engine alive while any of them lives, whatever order Python
//! frees them in.
//!
//! Locking: [`MAPS`], one reader-writer lock for the process, is held for reading around each
//! use of a table or of a cell's pager handle (a map, an unmap, a lookup), and for writing by
//! the fork's prepare handler until the fork is done: no thread is inside a table, mapping a
//! region or unmapping one when the child's copy is taken. Each use takes it once and never
//! waits for the GIL while it holds it (a second read on one thread, or the GIL, could wait
//! behind a forking thread that waits for the write lock). A table's mutex is taken only
//! under `MAPS`, and never across engine work.
//!
//! Invariants: a table entry's key is its region's start when it was mapped, or, where a
//! region mapped there before was moved away by the program's own `mremap` (the engine follows
//! such a move, and the moved region's entry keeps its key), the first free address above,
//! never page-aligned, so never a region's start; every region a cell's pager maps is
//! in the table from its `map` to its `unmap` (both under one read of `MAPS`); the handles are
//! the pager's own (in a re-armed fork child, the child's pager's).

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, RwLock, RwLockReadGuard, RwLockWriteGuard};

/// Held for reading by every use of a cell's table or pager handle, for writing across a fork
/// (see the module doc).
static MAPS: RwLock<()> = RwLock::new(());

/// Takes [`MAPS`] for reading. (Every change made under it is one insert or remove: a panic
/// cannot leave a table torn, so a poisoned lock is taken as it is.)
pub fn maps_read() -> RwLockReadGuard<'static, ()> {
    MAPS.read().unwrap_or_else(PoisonError::into_inner)
}

/// Takes [`MAPS`] for writing: the fork's prepare handler, until the fork is done.
pub fn maps_write() -> RwLockWriteGuard<'static, ()> {
    MAPS.write().unwrap_or_else(PoisonError::into_inner)
}

/// Who holds a region of a cell: a `uswap.Region` object, or a numpy handler's block (numpy
/// frees only what it allocated, so a numpy free never unmaps a `uswap.Region`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Owner {
    Region,
    Numpy,
}

struct Entry {
    owner: Owner,
    region: uswap::Region,
}

struct Handles {
    pager: uswap::Pager,
    /// Every live region, by key (its start when mapped, see the invariants).
    regions: HashMap<usize, Entry>,
}

/// A Python pager's engine pager and regions (see the module doc).
pub struct PagerCell {
    handles: Mutex<Handles>,
    /// How the pager was built, for a fork child to build its own: `Some` for the pager whose
    /// regions fork children inherit (`fork`), `None` for one whose regions they do not.
    rearm: Option<Rearm>,
}

/// What a fork child builds its pager from.
#[derive(Clone)]
pub struct Rearm {
    pub builder: uswap::PagerBuilder,
    /// Whether the limit moves by itself (`auto`): the child then starts from the builder's
    /// ceiling, not from where the parent's limit is.
    pub auto: bool,
}

impl PagerCell {
    pub fn new(pager: uswap::Pager, rearm: Option<Rearm>) -> Arc<PagerCell> {
        let handles = Mutex::new(Handles { pager, regions: HashMap::new() });
        Arc::new(PagerCell { handles, rearm })
    }

    /// Fails in a process whose pager this is not: a fork child whose pager could not be re-armed,
    /// or whose regions it does not inherit (its engine, threads and tables are the parent's).
    pub fn check_owner(&self) -> Result<(), String> {
        // The engine knows whose its pager is: after a re-armed fork the cell holds the child's.
        match self.pager().check_owner() {
            Err(uswap::Error::ForkChild { owner_pid, pid }) => Err(format!(
                "this pager's engine is in process {owner_pid}, and this process ({pid}) is a fork child of it in \
                 which the pager was not re-armed (its regions are not inherited, or re-arming failed, as said on \
                 stderr): build a new pager here"
            )),
            _ => Ok(()),
        }
    }

    /// The table; the caller holds [`MAPS`].
    fn handles(&self) -> MutexGuard<'_, Handles> {
        self.handles.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The pager (a shared handle to it).
    pub fn pager(&self) -> uswap::Pager {
        let _maps = maps_read();
        self.handles().pager.clone()
    }

    /// The pager, for a caller that holds [`MAPS`] for writing (the fork's prepare handler).
    pub fn pager_under_maps_write(&self) -> uswap::Pager {
        self.handles().pager.clone()
    }

    /// Maps a region of `len` bytes for `owner`: its key in the table, its start and its
    /// length (whole pages). The key is the start unless a region moved away from there by
    /// the program's `mremap` still has it (see the invariants).
    pub fn map(&self, len: usize, owner: Owner) -> uswap::Result<(usize, usize, usize)> {
        let _maps = maps_read();
        let pager = self.handles().pager.clone();
        let region = pager.map(len)?;
        let (start, len) = (region.as_ptr() as usize, region.len());
        let mut handles = self.handles();
        let mut key = start;
        // Bounded by the regions in the table: each key tried is a live region's.
        while handles.regions.contains_key(&key) {
            key += 1;
        }
        handles.regions.insert(key, Entry { owner, region });
        Ok((key, start, len))
    }

    /// Where the region of key `key` is now (it follows the program's `mremap`), if it is live.
    pub fn start_of(&self, key: usize) -> Option<usize> {
        let _maps = maps_read();
        self.handles().regions.get(&key).map(|e| e.region.as_ptr() as usize)
    }

    /// Unmaps `owner`'s region of key `key` (its memory and swap slots freed): its length, or
    /// `None` if `owner` holds no region of that key.
    pub fn unmap(&self, key: usize, owner: Owner) -> Option<usize> {
        let _maps = maps_read();
        let entry = {
            let mut handles = self.handles();
            match handles.regions.get(&key) {
                Some(e) if e.owner == owner => handles.regions.remove(&key),
                _ => None,
            }
        };
        // Unmapped outside the table's lock: it frees the region's slots.
        entry.map(|e| e.region.len())
    }

    /// The length of `owner`'s region of key `key`, if it holds that one.
    pub fn len_of(&self, key: usize, owner: Owner) -> Option<usize> {
        let _maps = maps_read();
        self.handles().regions.get(&key).filter(|e| e.owner == owner).map(|e| e.region.len())
    }

    /// Pages of the region of key `key` in RAM now (`mincore(2)`), if it is live.
    pub fn mapped_pages(&self, key: usize) -> Option<std::io::Result<usize>> {
        let _maps = maps_read();
        self.handles().regions.get(&key).map(|e| e.region.mapped_pages())
    }

    /// How a fork child builds its own pager, if fork children re-arm this one.
    pub fn rearm(&self) -> Option<&Rearm> {
        self.rearm.as_ref()
    }

    /// In a fork child that re-armed (`fork`), with [`MAPS`] held for writing: the child's
    /// pager and its regions take the places of the parent's. The parent's handles are
    /// forgotten, never dropped (their engine is the parent's).
    pub fn adopt_in_fork_child(&self, pager: uswap::Pager, regions: Vec<(usize, uswap::Region)>) {
        let mut handles = self.handles();
        std::mem::forget(std::mem::replace(&mut handles.pager, pager));
        for (start, region) in regions {
            // By where the parent's region was at the fork, not by key (a region the program
            // moved keeps the key of where it was mapped).
            let entry = handles.regions.values_mut().find(|e| e.region.as_ptr() as usize == start);
            match entry {
                Some(e) => std::mem::forget(std::mem::replace(&mut e.region, region)),
                // Not expected (every region is in the table, see the invariants): left
                // mapped and managed, never unmapped.
                None => std::mem::forget(region),
            }
        }
    }
}

impl Drop for PagerCell {
    fn drop(&mut self) {
        // Normally empty (each holder of a region holds the cell); unmapped as `unmap` does.
        let _maps = maps_read();
        let handles = self.handles.get_mut().unwrap_or_else(PoisonError::into_inner);
        handles.regions.clear();
    }
}
