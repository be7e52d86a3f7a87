//! Tier writeback: pages moved from a device that wants room to a device of lower priority.
//!
//! A pool above its accept threshold offers the slots it would rather lose
//! (`Backend::writeback_candidates`); the background reclaimer reads those pages back
//! (checking their checksum), writes them a tier down, and repoints their page-table words.
//! It touches no page table of the process, so it costs the application's CPU nothing (no
//! TLB flush) and runs even while the application faults.
//!
//! Locking: a page is owned through its busy bit while it moves; its new slot is published
//! (owner, checksum) before its page-table word names it, and its old slot is freed only
//! after. Invariants: writeback only goes down the tiers; a page that does not read back
//! cleanly, or finds no room below, stays where it was.

use arrayvec::ArrayVec;

use super::victims::Victim;
use super::Reclaim;
use crate::backend::{AlignedPage, WriteReq};
use crate::region::{PageRef, PageState, RegionSet};
use crate::state::RECLAIM_BATCH_PAGES as BATCH;
use crate::stats::Counter;
use crate::swap::{SwapDevice, SwapEntry};

/// Moves pages from devices that want room (a pool above its accept threshold) to the next
/// tier: reads them (checking their checksum), writes them to a device of lower priority, and
/// repoints their page-table words. Touches no page table of the process, so it costs the
/// application's CPU nothing (no TLB flush) and runs even while the application faults.
/// `buf` holds `BATCH` pages. Returns the pages moved.
pub(crate) fn device_writeback(cx: &Reclaim<'_>, buf: &mut [AlignedPage]) -> usize {
    let Some(_in_flight) = super::round::InFlight::enter(cx) else {
        return 0;
    };
    let mut moved = 0;
    for dev in cx.devices.devices() {
        let mut slots = [0u64; BATCH];
        let n = dev.backend.writeback_candidates(&mut slots);
        assert!(n <= BATCH);
        moved += move_slots_down(cx, dev, &slots[..n], buf);
    }
    cx.stats.add(Counter::Writeback, moved as u64);
    moved
}

/// Moves the pages of `slots` (at most `BATCH`) from `dev` to the next tier down, where they
/// are still swapped there and free to take. The caller holds an `InFlight`. Returns the
/// pages moved.
pub(super) fn move_slots_down(cx: &Reclaim<'_>, dev: &SwapDevice, slots: &[u64], buf: &mut [AlignedPage]) -> usize {
    assert!(slots.len() <= BATCH);
    // With no device of lower priority (a pool and a device of equal priority take turns,
    // they are not tiers) there is nowhere to go: reading the pages back would be wasted.
    if slots.is_empty() || cx.devices.devices().iter().all(|d| d.priority >= dev.priority) {
        return 0;
    }
    let mut guards = RegionSet::new();
    let victims = lock_candidates(cx, dev, slots, &mut guards);
    if victims.is_empty() {
        return 0;
    }
    let ok = read_candidates(cx, dev, &guards, &victims, buf);
    move_down(cx, dev, &guards, &victims, &ok, buf)
}

/// Locks the pages the device's writeback candidates `slots` hold, where they are still
/// swapped there and free to take.
fn lock_candidates(
    cx: &Reclaim<'_>,
    dev: &SwapDevice,
    slots: &[u64],
    guards: &mut RegionSet,
) -> ArrayVec<Victim, BATCH> {
    let mut victims = ArrayVec::new();
    for &slot in slots {
        let Some(info) = dev.slot_info(slot) else { continue };
        let r = PageRef::from_owner(info.owner);
        let Ok(gi) = guards.get(cx.id, r) else { continue };
        let pte = guards.g[gi].load(r.page);
        let own = SwapEntry::new(dev.index, slot);
        if pte.state() != PageState::Swapped || pte.entry() != own {
            continue; // freed or moved since it was queued
        }
        if let Some(locked) = guards.g[gi].try_lock(r.page, pte) {
            victims.push(Victim { gi, page: r.page, pte: locked });
        }
    }
    victims
}

/// Reads the victims' pages into `buf`; a page that does not read back cleanly (recorded)
/// stays where it is. Returns which read back.
fn read_candidates(
    cx: &Reclaim<'_>,
    dev: &SwapDevice,
    guards: &RegionSet,
    victims: &[Victim],
    buf: &mut [AlignedPage],
) -> [bool; BATCH] {
    let mut ok = [false; BATCH];
    for (k, v) in victims.iter().enumerate() {
        let e = v.pte.entry();
        let mut req = [crate::backend::ReadReq::new(e.offset(), &mut buf[k..k + 1])];
        cx.stats.time_device_io(false, || dev.backend.read(&mut req));
        ok[k] = req[0].result.is_ok() && dev.checksum_ok(e.offset(), &buf[k].0);
        if !ok[k] {
            let addr = guards.g[v.gi].page_addr(v.page);
            cx.errors.record(addr, e, crate::state::PageErrorKind::ReadFailed);
        }
    }
    ok
}

/// Writes the victims read back (`ok`) to slots on devices of lower priority only
/// (writeback goes down the tiers), in runs of consecutive target slots, and publishes
/// them there. Returns how many moved; the others stay where they were.
fn move_down(
    cx: &Reclaim<'_>,
    dev: &SwapDevice,
    guards: &RegionSet,
    victims: &[Victim],
    ok: &[bool; BATCH],
    buf: &[AlignedPage],
) -> usize {
    let mask = cx.devices.devices().iter().filter(|d| d.priority >= dev.priority).fold(0u64, |m, d| m | 1 << d.index);
    let mut targets = [SwapEntry::new(0, 0); BATCH];
    let want = victims.len();
    let got = cx.devices.alloc_excluding_mask(mask, &mut targets[..want]);
    let mut to_free: ArrayVec<u64, BATCH> = ArrayVec::new();
    let mut moved = 0;
    let mut k = 0;
    while k < want {
        let mut t = k + 1;
        while t < got
            && ok[t] == ok[k]
            && targets[t].device() == targets[k].device()
            && targets[t].offset() == targets[t - 1].offset() + 1
        {
            t += 1;
        }
        if k >= got || !ok[k] {
            // No lower tier has room, or the page did not read back: leave it.
            for v in &victims[k..t.max(k + 1)] {
                guards.g[v.gi].store(v.page, v.pte.unbusy());
            }
            if k < got {
                for e in &targets[k..t] {
                    to_free.push(e.bits());
                }
            }
            k = t.max(k + 1);
            continue;
        }
        let tdev = cx.devices.device(targets[k]);
        let mut req = [WriteReq::new(targets[k].offset(), crate::mapping::PageRun::from_pages(&buf[k..t]))];
        cx.stats.time_device_io(true, || tdev.backend.write(&mut req));
        tdev.health.note_write(&req[0].result);
        for j in k..t {
            let v = &victims[j];
            if req[0].result.is_ok() {
                tdev.set_checksum(targets[j].offset(), crc32c::crc32c(&buf[j].0));
                tdev.set_owner(targets[j].offset(), guards.page_ref(v.gi, v.page, v.pte).owner());
                // Down a tier, still untouched since it left its region.
                if let Some(s) = dev.stamp_of(v.pte.entry().offset()) {
                    tdev.stamp(targets[j].offset(), s);
                }
                guards.g[v.gi].store(v.page, v.pte.next(PageState::Swapped, Some(targets[j])));
                dev.forget_slot(v.pte.entry().offset());
                to_free.push(v.pte.entry().bits());
                moved += 1;
            } else {
                guards.g[v.gi].store(v.page, v.pte.unbusy());
                to_free.push(targets[j].bits());
                cx.stats.inc(Counter::SwpoutError);
            }
        }
        k = t;
    }
    cx.devices.free_now(&mut to_free);
    moved
}
