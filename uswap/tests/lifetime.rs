//! What the application does to a region's address range has the kernel's meaning: `munmap`,
//! `mremap`, `madvise(MADV_DONTNEED)` and `mprotect` over managed memory, in both fault
//! modes, against the real kernel. Every byte is checked; memory uswap does not own (a
//! mapping that lands where a region was) must never be touched.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use uswap::{FaultMode, Pager, PAGE_SIZE};

mod common;
use common::*;

const LIMIT_PAGES: usize = 256;
const REGION_PAGES: usize = 1024;

/// One test at a time: each unmaps ranges and maps others at exact addresses, which a
/// mapping made by a test running beside it could take first.
static SERIAL: Mutex<()> = Mutex::new(());

/// Aborts the whole test binary with a message naming `what` if the test has not finished
/// within `secs`: a hang in a fault or in the kernel must fail, not wait forever. Holds the
/// lock that runs the tests one at a time.
struct Watchdog(Arc<AtomicBool>, #[allow(dead_code)] MutexGuard<'static, ()>);

impl Watchdog {
    fn new(what: &'static str, secs: u64) -> Watchdog {
        let serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
        let done = Arc::new(AtomicBool::new(false));
        let d = done.clone();
        std::thread::spawn(move || {
            for _ in 0..secs * 10 {
                std::thread::sleep(Duration::from_millis(100));
                if d.load(Ordering::Acquire) {
                    return;
                }
            }
            eprintln!("lifetime test stuck for {secs} s in: {what}");
            std::process::abort();
        });
        Watchdog(done, serial)
    }
}

impl Drop for Watchdog {
    fn drop(&mut self) {
        self.0.store(true, Ordering::Release);
    }
}

fn new_pager(mode: FaultMode) -> Pager {
    pager(mode, (LIMIT_PAGES * PAGE_SIZE) as u64, 64 * MIB)
}

/// The 64-bit words of `pages` pages at `addr` (memory the caller keeps mapped).
fn words_at<'a>(addr: usize, pages: usize) -> &'a [AtomicU64] {
    // SAFETY: the tests keep `[addr, addr + pages * PAGE_SIZE)` mapped read-write for as long
    // as they use the slice, and access it only through atomics.
    unsafe { std::slice::from_raw_parts(addr as *const AtomicU64, pages * PAGE_SIZE / 8) }
}

/// An anonymous mapping of `pages` pages at exactly `addr`, with `prot` and `MAP_PRIVATE |
/// MAP_ANONYMOUS | flags` (`flags` holds `MAP_FIXED` or `MAP_FIXED_NOREPLACE`).
fn mmap_at(addr: usize, pages: usize, prot: libc::c_int, flags: libc::c_int) -> usize {
    // SAFETY: the callers own `[addr, addr + pages)` or ask for it free
    // (MAP_FIXED_NOREPLACE fails rather than replace a mapping).
    let p = unsafe {
        libc::mmap(
            addr as *mut libc::c_void,
            pages * PAGE_SIZE,
            prot,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | flags,
            -1,
            0,
        )
    };
    assert_eq!(p as usize, addr, "mmap at {addr:#x}: {}", std::io::Error::last_os_error());
    addr
}

fn unmap(addr: usize, pages: usize) {
    // SAFETY: the test owns this range and nothing refers to it afterwards.
    let r = unsafe { libc::munmap(addr as *mut libc::c_void, pages * PAGE_SIZE) };
    assert_eq!(r, 0, "munmap: {}", std::io::Error::last_os_error());
}

/// Replaces `[addr, addr + pages)` (memory the test owns) with an inaccessible reservation.
fn reserve_at(addr: usize, pages: usize) {
    mmap_at(addr, pages, libc::PROT_NONE, libc::MAP_NORESERVE | libc::MAP_FIXED);
}

/// An ordinary read-write mapping of `pages` pages over the test's own reservation at `addr`.
fn map_over(addr: usize, pages: usize) -> usize {
    mmap_at(addr, pages, libc::PROT_READ | libc::PROT_WRITE, libc::MAP_FIXED)
}

/// Fills an ordinary mapping with a pattern of its own (version 1000 + tag).
fn fill_plain(w: &[AtomicU64], tag: u64) {
    for i in 0..w.len() / WORDS {
        write_page(w, i, 1000 + tag);
    }
}

/// Counts the pages of an ordinary mapping that no longer hold their pattern.
fn damaged_pages(w: &[AtomicU64], tag: u64) -> usize {
    (0..w.len() / WORDS)
        .filter(|&i| (0..WORDS).any(|k| w[i * WORDS + k].load(Ordering::Relaxed) != word(i, 1000 + tag, k)))
        .count()
}

/// An ordinary mapping over a range an `mremap` just left free: mapped whole, or, if
/// something took part of it first, page by page where it is still free (the pager reads the
/// remap or unmap event as `mremap` returns, and a mapping of its own can land in the hole:
/// seen once in CI). At least half of it must be free. Each page holds the pattern of its
/// index in the range (version 1000 + tag).
struct PlainPages {
    base: usize,
    pages: Vec<usize>,
    tag: u64,
}

impl PlainPages {
    fn map(base: usize, nr_pages: usize, tag: u64) -> PlainPages {
        let pages = if map_free(base, nr_pages) {
            (0..nr_pages).collect()
        } else {
            let free: Vec<usize> = (0..nr_pages).filter(|&i| map_free(base + i * PAGE_SIZE, 1)).collect();
            eprintln!(
                "{} of {nr_pages} pages at {base:#x} were taken before the test could map them",
                nr_pages - free.len()
            );
            assert!(free.len() >= nr_pages / 2, "only {} of {nr_pages} pages at {base:#x} were free", free.len());
            free
        };
        let plain = PlainPages { base, pages, tag };
        for &i in &plain.pages {
            for (k, w) in plain.page(i).iter().enumerate() {
                w.store(word(i, 1000 + tag, k), Ordering::Relaxed);
            }
        }
        plain
    }

    /// Page `i` of the range (one the test mapped).
    fn page(&self, i: usize) -> &[AtomicU64] {
        words_at(self.base + i * PAGE_SIZE, 1)
    }

    /// The pages that no longer hold their pattern.
    fn damaged(&self) -> usize {
        let bad = |i: usize| (0..WORDS).any(|k| self.page(i)[k].load(Ordering::Relaxed) != word(i, 1000 + self.tag, k));
        self.pages.iter().filter(|&&i| bad(i)).count()
    }

    fn unmap(self) {
        for &i in &self.pages {
            unmap(self.base + i * PAGE_SIZE, 1);
        }
    }
}

/// Maps `pages` ordinary pages at `addr` if nothing is there; false if something is
/// (`EEXIST`); any other failure fails the test.
fn map_free(addr: usize, pages: usize) -> bool {
    // SAFETY: MAP_FIXED_NOREPLACE maps only where nothing is mapped, else fails.
    let p = unsafe {
        libc::mmap(
            addr as *mut libc::c_void,
            pages * PAGE_SIZE,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_FIXED_NOREPLACE,
            -1,
            0,
        )
    };
    if p == libc::MAP_FAILED {
        let e = std::io::Error::last_os_error();
        assert_eq!(e.raw_os_error(), Some(libc::EEXIST), "mmap at {addr:#x}: {e}");
        return false;
    }
    assert_eq!(p as usize, addr, "mmap at {addr:#x} placed elsewhere");
    true
}

/// A region of `REGION_PAGES` pages (four times the limit) with every page written at
/// version 1, in order: the first pages are swapped out by the time it returns.
fn filled_region(p: &Pager) -> uswap::Region {
    let region = p.map(REGION_PAGES * PAGE_SIZE).unwrap();
    let w = region.as_atomic_u64s();
    for i in 0..REGION_PAGES {
        write_page(w, i, 1);
    }
    region
}

/// Pressure on `pages` of `w` (at version 1): each is checked and rewritten twice (versions
/// 2 and 3), which with more pages than the limit pushes them out again and again, then
/// each is checked at version 3.
fn rewrite_twice(w: &[AtomicU64], pages: impl Iterator<Item = usize> + Clone) {
    for v in 2..=3 {
        for i in pages.clone() {
            check_page(w, i, v - 1);
            write_page(w, i, v);
        }
    }
    for i in pages {
        check_page(w, i, 3);
    }
}

fn slots_used(p: &Pager) -> u64 {
    p.stats().devices.iter().map(|d| d.slots_used).sum()
}

/// (a) Part of a region unmapped (by a mapping put over it: the kernel sends the UNMAP event
/// a `munmap` sends), an ordinary mapping in the hole, then pressure: the ordinary mapping
/// keeps every byte, the rest of the region too, and dropping the region leaves the mapping
/// in the hole alone.
fn munmap_then_mmap_in_the_hole(mode: FaultMode) {
    let _w = Watchdog::new("munmap_then_mmap_in_the_hole", 120);
    let p = new_pager(mode);
    let region = filled_region(&p);
    let base = region.as_ptr() as usize;
    let w = region.as_atomic_u64s();
    // The hole: pages [256, 512), resident ones and swapped ones both (the last 256 written
    // are resident).
    let (hole, hole_pages) = (256, 256);
    let hole_addr = base + hole * PAGE_SIZE;
    // Unmapped by a PROT_NONE mapping put over it (the kernel unmaps the region's pages and
    // sends the same UNMAP event as for munmap), which keeps the address ours: after a bare
    // munmap, another test's mmap could take the hole before the mapping below.
    reserve_at(hole_addr, hole_pages);
    let plain = words_at(map_over(hole_addr, hole_pages), hole_pages);
    fill_plain(plain, 7);
    // Pressure: the rest of the region, written twice, pushes everything out again and again.
    let live = |i: usize| !(hole..hole + hole_pages).contains(&i);
    rewrite_twice(w, (0..REGION_PAGES).filter(|&i| live(i)));
    assert_eq!(damaged_pages(plain, 7), 0, "reclaim wrote into a mapping that is not the region's");
    let st = p.stats();
    assert!(st.pswpout > 0, "the run must swap: {st:?}");
    assert!(st.uffd_unmap >= 1, "the unmap was not seen: {st:?}");
    drop(region);
    assert_eq!(damaged_pages(plain, 7), 0, "dropping the region touched the mapping in its hole");
    assert_eq!(slots_used(&p), 0, "slots of unmapped pages were not freed");
    unmap(hole_addr, hole_pages);
}

in_both_modes!(
    munmap_then_mmap_in_the_hole() =>
    thread_mode_munmap_then_mmap_in_the_hole,
    signal_mode_munmap_then_mmap_in_the_hole
);

/// A reserved, inaccessible range of `pages` pages, for `MREMAP_FIXED` to land on.
fn reserve(pages: usize) -> usize {
    // SAFETY: a fresh PROT_NONE mapping at an address the kernel picks.
    let p = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            pages * PAGE_SIZE,
            libc::PROT_NONE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
            -1,
            0,
        )
    };
    assert_ne!(p, libc::MAP_FAILED);
    p as usize
}

/// (b) `mremap` of the whole region to a new address after many pages were swapped out:
/// every byte is at the new address, paging goes on there, and an ordinary mapping placed
/// at the old address is never touched (not by reclaim, not by dropping the region).
fn mremap_whole_region(mode: FaultMode) {
    let _w = Watchdog::new("mremap_whole_region", 120);
    let p = new_pager(mode);
    let region = filled_region(&p);
    let old = region.as_ptr() as usize;
    let before = p.stats();
    assert!(before.pswpout > 0, "pages must be out: {before:?}");
    let new = reserve(REGION_PAGES);
    // SAFETY: moves the region's pages to `new`, replacing the reservation there.
    let r = unsafe {
        libc::mremap(
            old as *mut libc::c_void,
            REGION_PAGES * PAGE_SIZE,
            REGION_PAGES * PAGE_SIZE,
            libc::MREMAP_MAYMOVE | libc::MREMAP_FIXED,
            new as *mut libc::c_void,
        )
    };
    assert_eq!(r as usize, new, "mremap: {}", std::io::Error::last_os_error());
    let plain = PlainPages::map(old, REGION_PAGES, 9);
    assert_eq!(region.as_ptr() as usize, new, "the region handle must follow its memory");
    let w = words_at(new, REGION_PAGES);
    for i in 0..REGION_PAGES {
        check_page(w, i, 1);
    }
    for v in 2..=3 {
        for i in 0..REGION_PAGES {
            write_page(w, i, v);
        }
        for i in 0..REGION_PAGES {
            check_page(w, i, v);
        }
    }
    assert_eq!(plain.damaged(), 0, "reclaim wrote into the mapping at the old address");
    let st = p.stats();
    assert!(st.uffd_remap >= 1, "the remap was not seen: {st:?}");
    assert!(st.pswpin > before.pswpin, "pages must come back from the device at the new address: {st:?}");
    drop(region);
    assert_eq!(plain.damaged(), 0, "dropping the region touched the mapping at its old address");
    assert_eq!(slots_used(&p), 0);
    plain.unmap();
}

in_both_modes!(
    mremap_whole_region() =>
    thread_mode_mremap_whole_region,
    signal_mode_mremap_whole_region
);

/// (c) `madvise(MADV_DONTNEED)` over a region with swapped, cached and resident pages: every
/// page reads zero afterwards, as Linux zero-fills, and no slot or swap-cache page is kept.
fn dontneed_reads_zero(mode: FaultMode) {
    let _w = Watchdog::new("dontneed_reads_zero", 120);
    let p = new_pager(mode);
    let region = filled_region(&p);
    let w = region.as_atomic_u64s();
    let st = quiet_stats(&p);
    assert!(st.swapcache_pages > 0 && st.pswpout > 0 && st.resident_pages > st.swapcache_pages, "{st:?}");
    // SAFETY: the region's memory, discarded as an application would.
    let r = unsafe { libc::madvise(region.as_ptr().cast(), region.len(), libc::MADV_DONTNEED) };
    assert_eq!(r, 0);
    let st = quiet_stats(&p);
    assert_eq!((st.swapcache_pages, slots_used(&p)), (0, 0), "discarded pages keep swap space: {st:?}");
    assert_eq!(st.resident_pages, 0, "discarded pages are still charged: {st:?}");
    assert!(st.uffd_remove >= 1, "{st:?}");
    for i in 0..REGION_PAGES {
        check_page(w, i, 0);
    }
    // And the region keeps working.
    rewrite_and_check(w, 2);
    let st = p.stats();
    assert_eq!(st.fault_error, 0, "{st:?}");
}

in_both_modes!(
    dontneed_reads_zero() =>
    thread_mode_dontneed_reads_zero,
    signal_mode_dontneed_reads_zero
);

/// (d) `mprotect(PROT_READ)` over a region with pages in the swap cache: every page reads
/// back right (none raises SIGBUS); back to read-write, paging goes on.
fn mprotect_read_only(mode: FaultMode) {
    let _w = Watchdog::new("mprotect_read_only", 120);
    let p = new_pager(mode);
    let region = filled_region(&p);
    let w = region.as_atomic_u64s();
    let st = quiet_stats(&p);
    assert!(st.swapcache_pages > 0, "{st:?}");
    let protect = |prot| {
        // SAFETY: changes the protection of the region's own memory.
        let r = unsafe { libc::mprotect(region.as_ptr().cast(), region.len(), prot) };
        assert_eq!(r, 0, "mprotect: {}", std::io::Error::last_os_error());
    };
    protect(libc::PROT_READ);
    // Newest first: the resident pages, then the swap cache's (before any reclaim, which
    // cannot move read-only pages, writes the swap cache back), then the swapped ones.
    for _ in 0..2 {
        for i in (0..REGION_PAGES).rev() {
            check_page(w, i, 1);
        }
    }
    protect(libc::PROT_READ | libc::PROT_WRITE);
    for i in 0..REGION_PAGES {
        check_page(w, i, 1);
    }
    rewrite_and_check(w, 2);
    let st = p.stats();
    assert_eq!(st.fault_error, 0, "{st:?}");
    assert!(st.pgfault_swapcache > 0, "{st:?}");
}

in_both_modes!(
    mprotect_read_only() =>
    thread_mode_mprotect_read_only,
    signal_mode_mprotect_read_only
);

/// Moves pages `[old, old + old_pages)` to `new` (a reservation of at least `new_pages`),
/// resized to `new_pages`.
fn mremap_to(old: usize, old_pages: usize, new: usize, new_pages: usize) {
    // SAFETY: moves memory the test owns to `new`, replacing the reservation there.
    let r = unsafe {
        libc::mremap(
            old as *mut libc::c_void,
            old_pages * PAGE_SIZE,
            new_pages * PAGE_SIZE,
            libc::MREMAP_MAYMOVE | libc::MREMAP_FIXED,
            new as *mut libc::c_void,
        )
    };
    assert_eq!(r as usize, new, "mremap: {}", std::io::Error::last_os_error());
}

/// Resizes the mapping at `addr` in place (no `MREMAP_MAYMOVE`).
fn mremap_in_place(addr: usize, old_pages: usize, new_pages: usize) {
    // SAFETY: resizes memory the test owns; without MREMAP_MAYMOVE it never moves.
    let r = unsafe { libc::mremap(addr as *mut libc::c_void, old_pages * PAGE_SIZE, new_pages * PAGE_SIZE, 0) };
    assert_eq!(r as usize, addr, "mremap in place: {}", std::io::Error::last_os_error());
}

/// (e) `mremap` of part of a region (swapped, staged and resident pages, and one never
/// written) to a new address, grown by `grow_pages`: that part becomes ordinary memory with
/// every byte in place and the grown tail zero, the rest of the region keeps paging, and a
/// mapping placed where the part was is never touched. Nothing it held is kept: no slot,
/// no swap-cache page, no charge.
fn mremap_part_of_a_region(mode: FaultMode, grow_pages: usize) {
    let _w = Watchdog::new("mremap_part_of_a_region", 120);
    let p = new_pager(mode);
    let region = p.map(REGION_PAGES * PAGE_SIZE).unwrap();
    let base = region.as_ptr() as usize;
    let w = region.as_atomic_u64s();
    let (part, part_pages) = (REGION_PAGES / 2, REGION_PAGES / 2);
    // Never written: reads zero wherever it is.
    let blank = part + 7;
    for i in (0..REGION_PAGES).filter(|&i| i != blank) {
        write_page(w, i, 1);
    }
    // Written in order, so the newest pages (the upper half) hold every kind: the oldest of
    // them swapped out, then the swap cache (reclaim's newest victims), then the resident.
    let before = quiet_stats(&p);
    let resident_in_part = region.mapped_pages_in(part * PAGE_SIZE, part_pages * PAGE_SIZE).unwrap();
    assert!(before.swapcache_pages > 0 && before.pswpout > 0, "{before:?}");
    assert!(
        resident_in_part > 0 && resident_in_part + (before.swapcache_pages as usize) < part_pages,
        "the moved part must hold resident, staged and swapped pages: {resident_in_part} resident, {before:?}"
    );
    let old = base + part * PAGE_SIZE;
    let new_pages = part_pages + grow_pages;
    let new = reserve(new_pages);
    mremap_to(old, part_pages, new, new_pages);
    let plain = PlainPages::map(old, part_pages, 11);
    let moved = words_at(new, new_pages);
    for i in 0..part_pages {
        let v = if part + i == blank { 0 } else { 1 };
        for k in 0..WORDS {
            let want = if v == 0 { 0 } else { word(part + i, v, k) };
            assert_eq!(moved[i * WORDS + k].load(Ordering::Relaxed), want, "moved page {i} word {k}");
        }
    }
    for i in part_pages..new_pages {
        check_page(moved, i, 0);
    }
    let st = quiet_stats(&p);
    // Every page that was not in place came over by copy, and let go of what it held.
    let not_in_place = part_pages - resident_in_part;
    assert!(
        st.remap_copied as usize <= not_in_place && st.remap_copied as usize + 1 >= not_in_place,
        "{not_in_place} pages were staged or swapped: {st:?}"
    );
    assert_eq!(st.swapcache_pages, 0, "the staged pages were all in the moved part: {st:?}");
    assert_eq!(st.fault_error, 0, "{st:?}");
    // The lower half keeps paging; the moved part (and what it grew by) is ordinary memory.
    for v in 2..=3 {
        for i in 0..part {
            check_page(w, i, v - 1);
            write_page(w, i, v);
        }
    }
    for i in 0..part {
        check_page(w, i, 3);
    }
    for i in 0..new_pages {
        write_page(moved, i, 5);
    }
    for i in 0..new_pages {
        check_page(moved, i, 5);
    }
    assert_eq!(plain.damaged(), 0, "reclaim wrote into the mapping where the moved part was");
    let st = p.stats();
    assert!(st.uffd_remap >= 1 && st.pswpout > before.pswpout, "{st:?}");
    assert!(st.resident_pages <= st.limit_pages, "{st:?}");
    drop(region);
    assert_eq!(plain.damaged(), 0, "dropping the region touched the mapping where the moved part was");
    for i in 0..new_pages {
        check_page(moved, i, 5);
    }
    let st = quiet_stats(&p);
    assert_eq!((slots_used(&p), st.resident_pages, st.swapcache_pages), (0, 0, 0), "{st:?}");
    plain.unmap();
    unmap(new, new_pages);
}

in_both_modes!(
    mremap_part_of_a_region(0) =>
    thread_mode_mremap_part_of_a_region,
    signal_mode_mremap_part_of_a_region
);

in_both_modes!(
    mremap_part_of_a_region(64) =>
    thread_mode_mremap_part_of_a_region_to_a_larger_size,
    signal_mode_mremap_part_of_a_region_to_a_larger_size
);

/// (f) `mremap` that shrinks a region in place: the tail is gone (its swap space freed),
/// the rest keeps paging, and memory mapped where the tail was is never touched.
fn mremap_shrinks_a_region_in_place(mode: FaultMode) {
    let _w = Watchdog::new("mremap_shrinks_a_region_in_place", 120);
    let p = new_pager(mode);
    let region = filled_region(&p);
    let base = region.as_ptr() as usize;
    let w = region.as_atomic_u64s();
    let keep = REGION_PAGES / 2;
    mremap_in_place(base, REGION_PAGES, keep);
    let tail = base + keep * PAGE_SIZE;
    let plain = PlainPages::map(tail, REGION_PAGES - keep, 13);
    let st = quiet_stats(&p);
    assert!(st.uffd_unmap >= 1, "{st:?}");
    // The tail's slots are free: what is left in use is at most the kept half.
    assert!(slots_used(&p) <= keep as u64, "{} slots in use: {st:?}", slots_used(&p));
    rewrite_twice(w, 0..keep);
    assert_eq!(plain.damaged(), 0, "reclaim wrote into the mapping where the tail was");
    drop(region);
    assert_eq!(plain.damaged(), 0, "dropping the region touched the mapping where the tail was");
    let st = quiet_stats(&p);
    assert_eq!((slots_used(&p), st.resident_pages), (0, 0), "{st:?}");
    plain.unmap();
}

in_both_modes!(
    mremap_shrinks_a_region_in_place() =>
    thread_mode_mremap_shrinks_a_region_in_place,
    signal_mode_mremap_shrinks_a_region_in_place
);

/// (g) Thread mode: a region shrunk and then grown back in place (the kernel sends no event
/// for a growth in place): the kept part keeps every byte and keeps paging, the grown part
/// is ordinary zero memory, and dropping the region leaves the grown part alone.
#[test]
fn thread_mode_mremap_grows_a_region_in_place() {
    let _w = Watchdog::new("thread_mode_mremap_grows_a_region_in_place", 120);
    let p = new_pager(FaultMode::Thread);
    let region = filled_region(&p);
    let base = region.as_ptr() as usize;
    let w = region.as_atomic_u64s();
    let keep = REGION_PAGES / 2;
    let grown = REGION_PAGES - keep;
    mremap_in_place(base, REGION_PAGES, keep);
    mremap_in_place(base, keep, REGION_PAGES);
    let tail = words_at(base + keep * PAGE_SIZE, grown);
    for i in 0..grown {
        check_page(tail, i, 0);
    }
    for i in 0..grown {
        write_page(tail, i, 7);
    }
    rewrite_twice(w, 0..keep);
    for i in 0..grown {
        check_page(tail, i, 7);
    }
    drop(region);
    for i in 0..grown {
        check_page(tail, i, 7);
    }
    let st = quiet_stats(&p);
    assert_eq!((slots_used(&p), st.resident_pages, st.fault_error), (0, 0, 0), "{st:?}");
    unmap(base + keep * PAGE_SIZE, grown);
}

/// Two copies of the region registry taken around a change (`uswap::MemoryOwners`) tell the
/// addresses of a region dropped meanwhile, and of one registered, from those of a region
/// that stayed: `uswap run`'s report of unmanaged memory counts a mapping only where nothing
/// changed while it scanned, so that it never counts a managed region's pages as the
/// program's own (a region dropped by `munmap` while its mapping was still listed).
#[test]
fn copies_of_the_registry_tell_which_addresses_changed_owner() {
    let _w = Watchdog::new("copies of the region registry", 30);
    let p = new_pager(FaultMode::Thread);
    let len = 64 * PAGE_SIZE;
    let kept = p.map(len).unwrap();
    let dropped = p.map(len).unwrap();
    let (k, d) = (kept.as_ptr() as usize, dropped.as_ptr() as usize);
    let first = uswap::memory_owners();
    drop(dropped);
    let second = uswap::memory_owners();
    assert!(first.changed_in(&second, d, d + len), "a region dropped between the copies");
    assert!(first.changed_in(&second, d + len - PAGE_SIZE, d + len + PAGE_SIZE), "its last page");
    assert!(!first.changed_in(&second, k, k + len), "a region that stayed");
    assert_eq!(second.owner(k, k + len), uswap::MemoryOwner::Managed);
    assert_ne!(second.owner(d, d + len), uswap::MemoryOwner::Managed);
    let new = p.map(len).unwrap();
    let n = new.as_ptr() as usize;
    let third = uswap::memory_owners();
    assert!(second.changed_in(&third, n, n + len), "a region registered between the copies");
    assert!(!second.changed_in(&third, k, k + len));
    assert!(!first.changed_in(&first, k.min(n), k.max(n) + len), "a copy against itself");
}
