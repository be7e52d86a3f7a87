//! The handles C holds: configurations, pagers and regions, kept in three tables.
//!
//! A handle given to C is not a pointer to anything: it is a number, unique for the life of
//! the process (one counter for all three kinds), dressed as an opaque pointer type. Every
//! call looks its handle up in the table of its kind and works on an `Arc` of the entry, so
//! a handle that was freed, never existed, or is of another kind is an error
//! (`USWAP_EINVAL`), never a use-after-free, and a handle freed by one thread while another
//! thread is inside a call on it stays alive until that call returns.
//!
//! Locking: each table is one mutex, held only to find, insert or remove an entry, never
//! across engine work (mapping, reclaim, joining threads). Where two are held, `PAGERS` is
//! taken before `REGIONS`, which is what makes "a pager with mapped regions cannot be
//! destroyed" exact: `uswap_map` inserts its region while holding `PAGERS` and only if its
//! pager is still there, and `uswap_pager_destroy` counts regions and removes the pager under
//! both. Lock poisoning is ignored: every change to a table is one insert or remove, complete
//! or not done.
//!
//! Invariants: an id is never 0 (so never NULL) and never reused; a region entry's `pager_id`
//! names a pager in `PAGERS` for as long as the region is in `REGIONS`.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use crate::status::Failure;

/// The next handle id; 0 is NULL, so ids start at 1. 2^64 handles will not be made.
static NEXT_ID: AtomicUsize = AtomicUsize::new(1);

/// A table of live handles of one kind.
pub(crate) struct Table<T> {
    /// What the handles are called in messages (`pager`, ...).
    kind: &'static str,
    entries: Mutex<BTreeMap<usize, Arc<T>>>,
}

impl<T> Table<T> {
    pub const fn new(kind: &'static str) -> Table<T> {
        Table { kind, entries: Mutex::new(BTreeMap::new()) }
    }

    pub fn lock(&self) -> MutexGuard<'_, BTreeMap<usize, Arc<T>>> {
        self.entries.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Adds an entry to a table already locked by the caller; returns its new id.
    pub fn insert_locked(entries: &mut BTreeMap<usize, Arc<T>>, value: T) -> usize {
        let id = NEXT_ID.fetch_add(1, Ordering::Relaxed);
        entries.insert(id, Arc::new(value));
        id
    }

    pub fn insert(&self, value: T) -> usize {
        Self::insert_locked(&mut self.lock(), value)
    }

    /// The entry of handle `id`, given as argument `what` of `function`.
    pub fn get(&self, id: usize, function: &str, what: &str) -> Result<Arc<T>, Failure> {
        self.check(id, function, what)?;
        self.lock().get(&id).cloned().ok_or_else(|| self.unknown(id, function, what))
    }

    /// Fails for a NULL handle; the message names the argument.
    pub fn check(&self, id: usize, function: &str, what: &str) -> Result<(), Failure> {
        if id == 0 {
            return Err(Failure::null(function, what));
        }
        Ok(())
    }

    /// The failure for a handle that is not (or no longer) in this table.
    pub fn unknown(&self, id: usize, function: &str, what: &str) -> Failure {
        Failure::invalid(format!(
            "{function}: {what} ({id:#x}) is not a live uswap {kind}: it was already freed, or it is another \
             kind of handle, or it was never returned by uswap",
            kind = self.kind
        ))
    }
}

/// A handle as C sees it: an opaque pointer that is never dereferenced.
pub(crate) fn to_handle<H>(id: usize) -> *mut H {
    std::ptr::without_provenance_mut(id)
}

/// The id a handle from C stands for (0 for NULL).
pub(crate) fn id_of<H>(handle: *const H) -> usize {
    handle.addr()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_are_unique_across_tables_and_lookups_check_them() {
        let a: Table<u32> = Table::new("thing");
        let b: Table<u32> = Table::new("other");
        let ia = a.insert(1);
        let ib = b.insert(2);
        assert_ne!(ia, ib);
        assert_eq!(*a.get(ia, "f", "x").map_err(|f| f.message).unwrap(), 1);
        let wrong_kind = a.get(ib, "f", "x").unwrap_err();
        assert!(wrong_kind.message.contains("not a live uswap thing"), "{}", wrong_kind.message);
        let null = a.get(0, "f", "x").unwrap_err();
        assert!(null.message.contains("x is NULL"), "{}", null.message);
        let held = a.get(ia, "f", "x").map_err(|f| f.message).unwrap();
        assert!(a.lock().remove(&ia).is_some());
        assert_eq!(*held, 1, "an entry removed while in use stays alive for its user");
        assert!(a.get(ia, "f", "x").is_err(), "a freed handle is refused");
        let ia2 = a.insert(3);
        assert_ne!(ia2, ia, "ids are never reused");
    }

    #[test]
    fn handles_round_trip_and_null_is_zero() {
        let h: *mut u8 = to_handle(42);
        assert_eq!(id_of(h), 42);
        assert_eq!(id_of(std::ptr::null::<u8>()), 0);
    }
}
