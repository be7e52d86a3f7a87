//! Slots of a device that fork children still read: the kernel's `swap_map` use counts,
//! across processes, for a device the parent and its children share rather than copy.
//!
//! # Job
//!
//! A memory device (RAM, the compressed pool) reaches a fork child copy-on-write: each
//! process frees slots in its own copy. A file or block device, or a Redis store, is one
//! device that both processes see; the child reads the pages that were out at the fork
//! where they are (`Backend::shared_with_fork_children`). So the parent must not reuse a
//! slot (nor delete its key) while a child may still read it, and must reuse it once no
//! child can.
//!
//! Each fork that leaves pages out on such a device takes a *child record*:
//! * a bitmap, one bit per slot, in memory shared with the child (`MAP_SHARED`): the parent
//!   sets the bit of every slot the child may read before the fork; the child clears a bit
//!   when it has read the page, or dropped it ([`ForkRefs::release_own`]);
//! * a pipe whose write end only the child keeps (close-on-exec, kept out of the program's
//!   way by `crate::fd`): when the child exits or execs, the parent's read end reports
//!   `POLLHUP` and the whole record goes, whatever bits were left.
//!
//! A slot the parent frees while a record has its bit goes onto the *held* bitmap instead of
//! back to the allocator ([`ForkRefs::hold_if_referenced`]); the background reclaimer
//! ([`ForkRefs::sweep`]) drops the records of children that are gone and frees the held
//! slots no record refers to any more. Held slots stay allocated: a device that fills with
//! them spills to the next device, as a full one does.
//!
//! # Locking rules
//!
//! No spin lock. Records are read without locks (frees run on fault paths): a record's
//! state is an atomic, and its bitmap, once made, is never unmapped while the device lives
//! (a later fork reuses it, zeroed). A read that races with the sweep or with a fork can only
//! keep a slot held longer. A free racing with the fork's recording is settled as in
//! Dekker's algorithm: the recording sets the slot's bit, then (`SeqCst` fence) reads the
//! page's entry again and leaves the page out if it changed; a release stores the page's new
//! entry before it frees the slot, and the free (`hold_if_referenced`, after a `SeqCst`
//! fence) reads the bits. So either the free sees the bit and holds the slot, or the
//! recording sees the page gone (discarded, unmapped) and the child never reads that slot.
//! A swap-in frees the slot before it stores the entry, but after it mapped the page, so a
//! child forked after that has the page mapped and reads nothing from the device. A
//! record's read end sits under a std mutex taken only by fork preparation and the sweep,
//! never on a fault path; a fork child only ever `try_lock`s it (it is a leaf, under the
//! preload's table hold; `crate::sync`, level 6).
//!
//! # Invariants
//!
//! * A held bit is set only for a slot this process freed (and so no longer uses) and is
//!   cleared only by the sweep, as it frees the slot.
//! * A record is `LIVE` from before the fork until the sweep sees its pipe hung up.

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::atomic::{AtomicU8, AtomicUsize, Ordering};
use std::sync::{Mutex, OnceLock};

use crate::fd::Kept;
use crate::mapping::AtomicTable;

/// Children that may read a device's slots at once. A fork beyond them brings the device's
/// pages in first, as for a device no child can read.
pub const MAX_FORK_CHILDREN: usize = 64;

const FREE: u8 = 0;
/// Claimed by a fork being prepared: bits may be set, the child does not exist yet.
const PREPARING: u8 = 1;
const LIVE: u8 = 2;

/// No record: this process is not a child reading this device (see [`ForkRefs::own`]).
const NO_RECORD: usize = usize::MAX;

/// One fork child's references (see the module doc).
struct ChildRecord {
    state: AtomicU8,
    /// One bit per slot, shared with the child; made at the record's first use.
    bits: OnceLock<AtomicTable>,
    /// The parent's end of the child's pipe, registered as the engine's.
    read_end: Mutex<Option<(Kept, OwnedFd)>>,
}

/// The fork children's references to one device's slots, and the slots held for them.
pub struct ForkRefs {
    nr_slots: usize,
    records: Box<[ChildRecord]>,
    /// Records not `FREE`: frees look no further while it is 0.
    nr_records: AtomicUsize,
    /// Slots this process freed while a child referred to them: one bit per slot, made at
    /// the first hold. Private (a child has nothing to do with it).
    held: OnceLock<AtomicTable>,
    nr_held: AtomicUsize,
    /// In a fork child, in its copy of the parent's device: this child's record.
    own: AtomicUsize,
}

/// What [`ForkRefs::begin_fork`] gives the fork: the record to fill and the child's end of
/// its pipe.
pub struct ForkRecord {
    pub record: usize,
    /// The write end: dropped by the parent after the fork, kept for life by the child.
    pub child_end: (Kept, OwnedFd),
}

fn word_bit(slot: u64) -> (usize, u64) {
    ((slot / 64) as usize, 1 << (slot % 64))
}

impl ForkRefs {
    pub fn new(nr_slots: u64) -> ForkRefs {
        let records = (0..MAX_FORK_CHILDREN)
            .map(|_| ChildRecord { state: AtomicU8::new(FREE), bits: OnceLock::new(), read_end: Mutex::new(None) })
            .collect();
        ForkRefs {
            nr_slots: nr_slots as usize,
            records,
            nr_records: AtomicUsize::new(0),
            held: OnceLock::new(),
            nr_held: AtomicUsize::new(0),
            own: AtomicUsize::new(NO_RECORD),
        }
    }

    /// Claims a record for a fork about to be made, with an empty bitmap and a fresh pipe.
    /// `None` when every record is taken or the memory or the pipe cannot be had: the fork
    /// then brings this device's pages in instead.
    pub fn begin_fork(&self) -> Option<ForkRecord> {
        let (i, rec) =
            self.records.iter().enumerate().find(|(_, r)| {
                r.state.compare_exchange(FREE, PREPARING, Ordering::AcqRel, Ordering::Relaxed).is_ok()
            })?;
        self.nr_records.fetch_add(1, Ordering::AcqRel);
        let ready = || -> Option<(Kept, OwnedFd, Kept, OwnedFd)> {
            // The held bitmap too, here rather than at the first hold, on a fault path.
            if self.held.get().is_none() {
                let _ = self.held.set(AtomicTable::new(self.nr_slots.div_ceil(64)).ok()?);
            }
            match rec.bits.get() {
                Some(bits) => bits.remove_all().ok()?,
                None => {
                    let _ = rec.bits.set(AtomicTable::shared(self.nr_slots.div_ceil(64)).ok()?);
                }
            }
            let mut fds = [0; 2];
            // SAFETY: pipe2 writes two descriptors into the array.
            if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
                return None;
            }
            // SAFETY: both are fresh descriptors that nothing else owns.
            let (r, w) = unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) };
            let (r, w) = (crate::fd::relocate(r), crate::fd::relocate(w));
            Some((crate::fd::keep(r.as_raw_fd()), r, crate::fd::keep(w.as_raw_fd()), w))
        };
        let Some((rk, r, wk, w)) = ready() else {
            self.release_record(rec);
            return None;
        };
        *rec.read_end.lock().unwrap_or_else(|e| e.into_inner()) = Some((rk, r));
        Some(ForkRecord { record: i, child_end: (wk, w) })
    }

    /// Notes that the fork of `record` may read `slot` of this device, then asks `still`
    /// whether the page is still out there; false: leave the page out of the child's list
    /// (the bit stays: at worst the slot is held until the child goes). See the module doc.
    pub fn recorded(&self, record: usize, slot: u64, still: impl FnOnce() -> bool) -> bool {
        let rec = &self.records[record];
        debug_assert_eq!(rec.state.load(Ordering::Relaxed), PREPARING);
        let (w, b) = word_bit(slot);
        let Some(bits) = rec.bits.get() else { return false };
        bits[w].fetch_or(b, Ordering::Relaxed);
        std::sync::atomic::fence(Ordering::SeqCst);
        still()
    }

    /// In a fork child, on its copy of the parent's device: closes the parent's ends of the
    /// pipes (the child has no use for them, and they are registered descriptors).
    pub fn close_parent_ends(&self) {
        for rec in self.records.iter() {
            // The child has one thread; a lock taken by one of the parent's is left alone.
            if let Ok(mut end) = rec.read_end.try_lock() {
                drop(end.take());
            }
        }
    }

    /// The record is complete: from now on the sweep watches its pipe.
    pub fn publish(&self, record: usize) {
        self.records[record].state.store(LIVE, Ordering::Release);
    }

    /// In a fork child, on its copy of the parent's device: `record` is this child's.
    pub fn enter_child(&self, record: usize) {
        self.own.store(record, Ordering::Relaxed);
    }

    /// In a fork child: lets go of `slot` of the parent's device (its page was read, or
    /// dropped). A no-op anywhere else. Lock- and allocation-free.
    pub fn release_own(&self, slot: u64) {
        let own = self.own.load(Ordering::Relaxed);
        if own == NO_RECORD || slot as usize >= self.nr_slots {
            return;
        }
        if let Some(bits) = self.records[own].bits.get() {
            let (w, b) = word_bit(slot);
            bits[w].fetch_and(!b, Ordering::Release);
        }
    }

    /// Whether a child may still read `slot`.
    fn referenced(&self, slot: u64) -> bool {
        let (w, b) = word_bit(slot);
        self.records.iter().any(|r| {
            r.state.load(Ordering::Acquire) != FREE
                && r.bits.get().is_some_and(|t| t[w].load(Ordering::Acquire) & b != 0)
        })
    }

    /// For a slot this process frees (its page's entry already changed): if a child may
    /// still read it, holds it (true) rather than let it be reused. Lock- and
    /// allocation-free.
    pub fn hold_if_referenced(&self, slot: u64) -> bool {
        // Pairs with the fence of `recorded`: see the module doc.
        std::sync::atomic::fence(Ordering::SeqCst);
        if self.nr_records.load(Ordering::Relaxed) == 0 || !self.referenced(slot) {
            return false;
        }
        // Made by `begin_fork` before any record could refer to a slot.
        let Some(held) = self.held.get() else { return true };
        let (w, b) = word_bit(slot);
        // Counted first, so that the sweep never takes the count below zero.
        self.nr_held.fetch_add(1, Ordering::Relaxed);
        if held[w].fetch_or(b, Ordering::AcqRel) & b != 0 {
            self.nr_held.fetch_sub(1, Ordering::Relaxed);
        }
        true
    }

    /// Whether a child may still read this device (one that has not exited or exec'd).
    /// System calls: not on a fault path.
    pub fn children_may_read(&self) -> bool {
        self.records.iter().any(|r| match r.state.load(Ordering::Acquire) {
            FREE => false,
            LIVE => !child_gone(r),
            _ => true,
        })
    }

    /// Slots held for children now.
    pub fn nr_held(&self) -> usize {
        self.nr_held.load(Ordering::Relaxed)
    }

    /// Drops the records of children that are gone, then hands every held slot no record
    /// refers to any more to `free` (in batches). Makes system calls (`poll`): engine
    /// threads only, never on a fault path. Bounded by the records and the held bitmap.
    pub fn sweep(&self, free: &mut dyn FnMut(&[u64])) {
        if self.nr_records.load(Ordering::Acquire) == 0 && self.nr_held() == 0 {
            return;
        }
        for rec in self.records.iter() {
            if rec.state.load(Ordering::Acquire) == LIVE && child_gone(rec) {
                self.release_record(rec);
            }
        }
        let Some(held) = self.held.get() else { return };
        if self.nr_held() == 0 {
            return;
        }
        let mut batch = [0u64; crate::swap::FREE_BATCH];
        let mut n = 0;
        for (w, word) in held.iter().enumerate() {
            let held_bits = word.load(Ordering::Acquire);
            if held_bits == 0 {
                continue;
            }
            // Sixty-four slots at a time: the bits some child still has.
            let referenced = self.referenced_word(w);
            let mut free_bits = held_bits & !referenced;
            if free_bits == 0 {
                continue;
            }
            word.fetch_and(!free_bits, Ordering::AcqRel);
            self.nr_held.fetch_sub(free_bits.count_ones() as usize, Ordering::Relaxed);
            while free_bits != 0 {
                batch[n] = (w * 64) as u64 + free_bits.trailing_zeros() as u64;
                free_bits &= free_bits - 1;
                n += 1;
                if n == batch.len() {
                    free(&batch[..n]);
                    n = 0;
                }
            }
        }
        free(&batch[..n]);
    }

    /// The bits of word `w` that some record still has (slots `64 * w ..`).
    fn referenced_word(&self, w: usize) -> u64 {
        self.records
            .iter()
            .filter(|r| r.state.load(Ordering::Acquire) != FREE)
            .filter_map(|r| r.bits.get())
            .fold(0, |acc, t| acc | t[w].load(Ordering::Acquire))
    }

    /// Gives a record back: closes the parent's end of its pipe and frees it for a later fork.
    fn release_record(&self, rec: &ChildRecord) {
        drop(rec.read_end.lock().unwrap_or_else(|e| e.into_inner()).take());
        rec.state.store(FREE, Ordering::Release);
        self.nr_records.fetch_sub(1, Ordering::AcqRel);
    }
}

/// Whether every write end of the record's pipe is closed: the child (and any process that
/// inherited the end from it) exited or exec'd.
fn child_gone(rec: &ChildRecord) -> bool {
    let end = rec.read_end.lock().unwrap_or_else(|e| e.into_inner());
    let Some((_, fd)) = end.as_ref() else { return true };
    let mut pfd = libc::pollfd { fd: fd.as_raw_fd(), events: 0, revents: 0 };
    // SAFETY: polls one descriptor we own, without waiting.
    let r = unsafe { libc::poll(&mut pfd, 1, 0) };
    r == 1 && pfd.revents & (libc::POLLHUP | libc::POLLERR) != 0
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicU64;

    /// The word of a record's bitmap that holds `slot`.
    fn record_word(refs: &ForkRefs, record: usize, slot: u64) -> &AtomicU64 {
        &refs.records[record].bits.get().expect("bitmap")[word_bit(slot).0]
    }

    fn swept(refs: &ForkRefs) -> Vec<u64> {
        let mut out = Vec::new();
        refs.sweep(&mut |s| out.extend_from_slice(s));
        out
    }

    /// A slot a live child refers to is held when freed, and freed by the sweep once the
    /// child has let go of it, or once the child is gone (its pipe's write end closed).
    #[test]
    fn held_slots_come_free_when_the_child_lets_go_or_goes() {
        let refs = ForkRefs::new(4096);
        assert!(!refs.hold_if_referenced(7), "no child: nothing is held");
        let fork = refs.begin_fork().expect("a record");
        for slot in [7, 8, 4000] {
            assert!(refs.recorded(fork.record, slot, || true));
        }
        refs.publish(fork.record);
        assert!(refs.hold_if_referenced(7));
        assert!(refs.hold_if_referenced(4000));
        assert!(!refs.hold_if_referenced(9), "slot 9 is not the child's");
        assert_eq!(refs.nr_held(), 2);
        assert!(swept(&refs).is_empty(), "the child still refers to both");
        // The child reads slot 7 (what `release_own` does in its copy of the device).
        record_word(&refs, fork.record, 7).fetch_and(!(1 << 7), Ordering::Release);
        assert_eq!(swept(&refs), vec![7]);
        assert_eq!(refs.nr_held(), 1);
        // The child exits: its end of the pipe closes.
        drop(fork.child_end);
        assert_eq!(swept(&refs), vec![4000]);
        assert_eq!(refs.nr_held(), 0);
        assert_eq!(refs.nr_records.load(Ordering::Relaxed), 0, "the record was given back");
        assert!(!refs.hold_if_referenced(8), "a dead child's bits are not looked at");
        // The record is reused, zeroed.
        let again = refs.begin_fork().expect("a record");
        assert_eq!(again.record, fork.record);
        refs.publish(again.record);
        assert!(!refs.hold_if_referenced(8), "a reused record starts empty");
    }

    /// Records run out at MAX_FORK_CHILDREN; `release_own` does nothing outside a child.
    #[test]
    fn records_are_bounded_and_release_own_is_only_for_a_child() {
        let refs = ForkRefs::new(64);
        let forks: Vec<_> = (0..MAX_FORK_CHILDREN).map(|_| refs.begin_fork().expect("a record")).collect();
        assert!(refs.begin_fork().is_none());
        assert!(!refs.recorded(forks[0].record, 3, || false), "a page that changed is left out");
        refs.release_own(3);
        assert_ne!(record_word(&refs, forks[0].record, 3).load(Ordering::Relaxed), 0);
        refs.own.store(forks[0].record, Ordering::Relaxed);
        refs.release_own(3);
        refs.release_own(1 << 40); // out of range: ignored
        assert_eq!(record_word(&refs, forks[0].record, 3).load(Ordering::Relaxed), 0);
    }
}
