//! The compressed pool's unit tests: every kind of page, the cap and writeback, size
//! classes sharing chunks, memory given back, compaction under concurrent readers.

use super::*;
use crate::backend::AlignedPage;
use crate::mapping::PageRun;

fn page_of(kind: u32, seed: u64) -> AlignedPage {
    let mut p = AlignedPage([0; PAGE_SIZE]);
    let mut x = seed | 1;
    for (k, w) in p.0.chunks_exact_mut(8).enumerate() {
        let v = match kind {
            0 => 0,                            // zero page
            1 => 0xdead_beef_0000_0000 | seed, // one repeated word
            2 if k < 128 => {
                // compressible: quarter random
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                x
            }
            2 => 0,
            _ => {
                // incompressible
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                x
            }
        };
        w.copy_from_slice(&v.to_ne_bytes());
    }
    p
}

fn store(z: &ZpoolBackend, slot: u64, p: &AlignedPage) -> Result<(), BackendError> {
    let pages = std::slice::from_ref(p);
    let mut req = [WriteReq::new(slot, PageRun::from_pages(pages))];
    z.write(&mut req);
    std::mem::replace(&mut req[0].result, Ok(()))
}

fn load(z: &ZpoolBackend, slot: u64) -> Result<AlignedPage, BackendError> {
    let mut buf = [AlignedPage([0xaa; PAGE_SIZE])];
    let mut req = [ReadReq::new(slot, &mut buf)];
    z.read(&mut req);
    std::mem::replace(&mut req[0].result, Ok(())).map(|_| buf[0])
}

#[test]
fn every_kind_of_page_round_trips_and_is_counted() {
    for compressor in [Compressor::Lz4, Compressor::Zstd { level: 3 }] {
        let mut cfg = ZpoolConfig::new(8 << 20, 4096);
        cfg.compressor = compressor;
        let z = ZpoolBackend::new(cfg).unwrap();
        let pages: Vec<AlignedPage> = (0..400).map(|i| page_of(i % 4, i as u64 + 1)).collect();
        for (i, p) in pages.iter().enumerate() {
            store(&z, i as u64, p).unwrap();
        }
        for (i, p) in pages.iter().enumerate() {
            assert_eq!(load(&z, i as u64).unwrap().0, p.0, "slot {i} with {compressor:?}");
        }
        let st = z.stats().unwrap();
        assert_eq!(st.stored_pages, 400);
        assert_eq!(st.same_filled_pages, 200);
        assert_eq!(st.incompressible_pages, 100);
        assert!(st.compression_ratio > 1.0, "{st:?}");
        // Each object holds its data and header, rounded up to its class (16 bytes apart,
        // or a class at most a quarter larger); the chunks hold the objects.
        let with_headers = st.compressed_bytes + 4 * (st.stored_pages - st.same_filled_pages);
        assert!(st.object_bytes >= with_headers && st.object_bytes <= with_headers * 5 / 4 + 16 * 200, "{st:?}");
        assert!(st.object_bytes <= st.pool_bytes, "{st:?}");
        for i in 0..400 {
            z.invalidate(i);
        }
        let st = z.stats().unwrap();
        assert_eq!((st.stored_pages, st.pool_bytes, st.compressed_bytes, st.object_bytes), (0, 0, 0, 0), "{st:?}");
        assert!(matches!(load(&z, 3), Err(BackendError::Empty { slot: 3 })));
    }
}

fn page_filled_with(word: u64) -> AlignedPage {
    let mut p = AlignedPage([0; PAGE_SIZE]);
    for w in p.0.chunks_exact_mut(8) {
        w.copy_from_slice(&word.to_ne_bytes());
    }
    p
}

/// Words a page may be filled with: zero (should one reach the device), all ones, a
/// word of distinct bytes, a memset byte, and one bit.
const WORDS: [u64; 5] = [0, u64::MAX, 0x0123_4567_89ab_cdef, 0xabab_abab_abab_abab, 1 << 63];

#[test]
fn same_filled_word_compares_words_and_bails_at_the_first_difference() {
    for w in WORDS {
        assert_eq!(same_filled_word(&page_filled_with(w).0), Some(w), "{w:#x}");
        // One byte different anywhere: the first, a middle one, the last.
        for at in [0, 1, PAGE_SIZE / 2 + 3, PAGE_SIZE - 8, PAGE_SIZE - 1] {
            let mut p = page_filled_with(w);
            p.0[at] ^= 0x10;
            assert_eq!(same_filled_word(&p.0), None, "{w:#x}, byte {at} changed");
        }
    }
    // A page whose bytes repeat with a period that is not a word's.
    let mut p = AlignedPage([0; PAGE_SIZE]);
    for (i, b) in p.0.iter_mut().enumerate() {
        *b = (i % 3) as u8;
    }
    assert_eq!(same_filled_word(&p.0), None);
}

#[test]
fn same_filled_pages_keep_no_pool_memory_and_read_back_exactly() {
    for compressor in [Compressor::Lz4, Compressor::Zstd { level: 3 }] {
        let mut cfg = ZpoolConfig::new(4 << 20, 1024);
        cfg.compressor = compressor;
        let z = ZpoolBackend::new(cfg).unwrap();
        // Slots 0..5: same-filled pages, many times over (slots 5.. hold more of them).
        let same: Vec<AlignedPage> = (0..200).map(|i| page_filled_with(WORDS[i % 5] ^ (i / 5) as u64)).collect();
        for (i, p) in same.iter().enumerate() {
            store(&z, i as u64, p).unwrap();
        }
        let st = z.stats().unwrap();
        assert_eq!((st.stored_pages, st.same_filled_pages, st.same_filled_stores), (200, 200, 200), "{st:?}");
        assert_eq!((st.pool_bytes, st.pool_peak_bytes, st.compressed_bytes), (0, 0, 0), "{st:?}");
        assert_eq!(st.compression_ratio, 0.0, "no pool memory, no ratio: {st:?}");
        assert!(!z.prepare(), "no arena populated for a pool of same-filled pages alone");
        for (i, p) in same.iter().enumerate() {
            assert_eq!(load(&z, i as u64).unwrap().0, p.0, "slot {i} with {compressor:?}");
        }
        // Not same-filled: the last byte differs. Compressed, in the pool.
        let mut almost = page_filled_with(0x0123_4567_89ab_cdef);
        almost.0[PAGE_SIZE - 1] = 0;
        store(&z, 300, &almost).unwrap();
        let st = z.stats().unwrap();
        assert_eq!((st.stored_pages, st.same_filled_pages, st.same_filled_stores), (201, 200, 200), "{st:?}");
        assert_eq!(st.pool_bytes, CHUNK_BYTES as u64, "{st:?}");
        assert!(st.compressed_bytes > 0 && st.compressed_bytes < 100, "{st:?}");
        assert_eq!(
            st.compression_ratio,
            (201 * PAGE_SIZE) as f64 / CHUNK_BYTES as f64,
            "same-filled pages count as stored pages: {st:?}"
        );
        assert_eq!(load(&z, 300).unwrap().0, almost.0);
        let compressed_bytes = st.compressed_bytes;

        // Overwrites (each after an invalidation, as the engine does): a same-filled slot
        // gets a compressed page and a raw page, the compressed slot a same-filled page.
        let (zs, rs) = (page_of(2, 5), page_of(3, 6));
        z.invalidate(0);
        store(&z, 0, &zs).unwrap();
        z.invalidate(1);
        store(&z, 1, &rs).unwrap();
        z.invalidate(300);
        store(&z, 300, &page_filled_with(7)).unwrap();
        let st = z.stats().unwrap();
        assert_eq!((st.stored_pages, st.same_filled_pages, st.same_filled_stores), (201, 199, 201), "{st:?}");
        assert_eq!(st.incompressible_pages, 1, "{st:?}");
        assert_eq!(load(&z, 0).unwrap().0, zs.0);
        assert_eq!(load(&z, 1).unwrap().0, rs.0);
        assert_eq!(load(&z, 300).unwrap().0, page_filled_with(7).0);
        assert_ne!(st.compressed_bytes, compressed_bytes);
        // And back: the compressed and raw slots same-filled again, their objects freed.
        z.invalidate(0);
        store(&z, 0, &same[0]).unwrap();
        z.invalidate(1);
        store(&z, 1, &same[1]).unwrap();
        let st = z.stats().unwrap();
        assert_eq!((st.stored_pages, st.same_filled_pages, st.same_filled_stores), (201, 201, 203), "{st:?}");
        assert_eq!((st.pool_bytes, st.compressed_bytes, st.incompressible_pages), (0, 0, 0), "{st:?}");
        for (i, p) in same.iter().enumerate() {
            assert_eq!(load(&z, i as u64).unwrap().0, p.0, "slot {i} with {compressor:?}");
        }
        // Freeing same-filled pages frees nothing from the pool; the cumulative count stays.
        for i in (0..200).chain([300]) {
            z.invalidate(i);
        }
        let st = z.stats().unwrap();
        assert_eq!((st.stored_pages, st.same_filled_pages, st.same_filled_stores), (0, 0, 203), "{st:?}");
        assert_eq!((st.pool_bytes, st.compressed_bytes), (0, 0), "{st:?}");
        assert!(matches!(load(&z, 0), Err(BackendError::Empty { slot: 0 })));
        // A slot freed twice (the engine does not, but invalidate tolerates an empty slot).
        z.invalidate(0);
        assert_eq!(z.stats().unwrap().stored_pages, 0);
    }
}

#[test]
fn cap_with_hysteresis_and_writeback_sheds_whole_chunks() {
    let z = ZpoolBackend::new(ZpoolConfig::new(1 << 20, 8192)).unwrap();
    let mut stored = 0u64;
    loop {
        match store(&z, stored, &page_of(3, stored + 7)) {
            Ok(()) => stored += 1,
            Err(BackendError::Rejected { reason: RejectReason::PoolFull, .. }) => break,
            Err(e) => panic!("{e}"),
        }
        assert!(stored < 8192, "the cap never bit");
    }
    assert!(!z.accepting());
    assert!(z.pool_bytes() >= 1 << 20 && z.pool_bytes() <= (1 << 20) + CHUNK_BYTES as u64);
    // Same-filled pages cost nothing and are still taken.
    store(&z, stored, &page_of(0, 0)).unwrap();
    let mut out = [0u64; 64];
    let n = z.writeback_candidates(&mut out);
    assert!(n > 0 && n <= 15, "one chunk of page-sized objects at a time: {n}");
    assert!(out[..n].iter().all(|&s| s < stored), "{:?}", &out[..n]);
    // Writing them back (invalidating) empties that chunk: memory is returned.
    let before = z.pool_bytes();
    for &slot in &out[..n] {
        z.invalidate(slot);
    }
    assert_eq!(z.pool_bytes(), before - CHUNK_BYTES as u64);
    // Drain below the accept threshold (90 %): accepting again.
    let mut freed = 0;
    while !z.accepting() {
        z.invalidate(freed);
        freed += 1;
    }
    assert!(z.pool_bytes() < (1 << 20) * 9 / 10);
    store(&z, stored + 1, &page_of(3, 99)).unwrap();
    assert_eq!(load(&z, stored + 1).unwrap().0, page_of(3, 99).0);
}

#[test]
fn trim_gives_free_chunks_back_beyond_a_reserve_and_they_serve_again() {
    let z = ZpoolBackend::new(ZpoolConfig::new(64 << 20, 8192)).unwrap();
    // 4,000 raw pages: 17.5 MiB of chunks, every page of them written.
    let nr = 4000u64;
    for slot in 0..nr {
        store(&z, slot, &page_of(3, slot + 1)).unwrap();
    }
    let used = z.pool_bytes();
    assert!(used >= 15 << 20, "{used}");
    // All but the last chunk's unused tail.
    let resident_full = z.alloc.arena_resident_bytes();
    assert!(resident_full + CHUNK_BYTES as u64 >= used, "{resident_full} resident, {used} in use");
    // Nothing to give back while every chunk is in use.
    assert_eq!(z.trim(), 0);
    // Three quarters freed: their chunks are free but still resident until trimmed.
    for slot in 0..nr * 3 / 4 {
        z.invalidate(slot);
    }
    let in_use = z.pool_bytes();
    assert!(in_use <= used / 4 + CHUNK_BYTES as u64, "{in_use} of {used}");
    assert_eq!(z.alloc.arena_resident_bytes(), resident_full, "freed chunks stay resident before a trim");
    let released = z.trim();
    let reserve = allocator::TRIM_RESERVE_MIN_CHUNKS as u64 * CHUNK_BYTES as u64;
    assert!(released >= used - in_use - reserve, "{released} given back of {}", used - in_use);
    assert_eq!(z.trim(), 0, "nothing more beyond the reserve");
    let resident = z.alloc.arena_resident_bytes();
    assert!(resident <= in_use + reserve, "resident {resident}, in use {in_use}");
    // The trimmed chunks serve new pages (zero-filled again on first use), and the pages
    // kept read back unchanged.
    for slot in 0..nr * 3 / 4 {
        store(&z, slot, &page_of(2, slot + 9)).unwrap();
    }
    for slot in 0..nr {
        let want = if slot < nr * 3 / 4 { page_of(2, slot + 9) } else { page_of(3, slot + 1) };
        assert_eq!(load(&z, slot).unwrap().0, want.0, "slot {slot}");
    }
    assert!(z.pool_bytes() <= used, "{} after reuse, {used} before", z.pool_bytes());
    z.alloc.check_invariants();
}

/// A page of `random_bytes` random bytes then zeros: it compresses to a little more
/// than that.
fn page_compressing_to(random_bytes: usize, seed: u64) -> AlignedPage {
    let mut p = AlignedPage([0; PAGE_SIZE]);
    let mut x = seed | 1;
    for b in &mut p.0[..random_bytes] {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        *b = x as u8;
    }
    p
}

#[test]
fn pages_over_many_size_classes_share_chunks() {
    let z = ZpoolBackend::new(ZpoolConfig::new(64 << 20, 8192)).unwrap();
    // 200 classes in use, 5 pages each: a chunk per class would be 200 chunks.
    let pages: Vec<AlignedPage> = (0..1000).map(|i| page_compressing_to(64 + (i % 200) * 16, i as u64 + 1)).collect();
    for (i, p) in pages.iter().enumerate() {
        store(&z, i as u64, p).unwrap();
    }
    let chunks = z.pool_bytes() / CHUNK_BYTES as u64;
    let s = z.stats().unwrap();
    assert!(chunks <= 60, "{chunks} chunks for {} bytes compressed", s.compressed_bytes);
    assert!(s.pool_bytes < 3 * s.compressed_bytes, "{s:?}");
    assert_eq!(s.pool_peak_bytes, s.pool_bytes);
    for (i, p) in pages.iter().enumerate() {
        assert_eq!(load(&z, i as u64).unwrap().0, p.0, "page {i}");
    }
    // Freed in any order, every chunk goes back.
    for i in (0..1000).rev().step_by(2).chain((0..1000).step_by(2)) {
        z.invalidate(i);
    }
    assert_eq!(z.pool_bytes(), 0);
    assert_eq!(z.stats().unwrap().pool_peak_bytes, chunks * CHUNK_BYTES as u64);
}

/// Stores `nr` pages of about `random_bytes` compressed each at slots `0..nr`, then
/// invalidates all but every `keep_every`th: chunks a fraction full, spread over a few
/// classes.
fn fragmented_pool(nr: u64, random_bytes: usize, keep_every: u64) -> (ZpoolBackend, Vec<u64>) {
    let z = ZpoolBackend::new(ZpoolConfig::new(64 << 20, 32768)).unwrap();
    for slot in 0..nr {
        store(&z, slot, &page_at(slot, random_bytes)).unwrap();
    }
    let kept: Vec<u64> = (0..nr).filter(|s| s % keep_every == 0).collect();
    for slot in (0..nr).filter(|s| s % keep_every != 0) {
        z.invalidate(slot);
    }
    (z, kept)
}

fn page_at(slot: u64, random_bytes: usize) -> AlignedPage {
    page_compressing_to(random_bytes + (slot % 5) as usize * 16, slot + 1)
}

#[test]
fn compaction_empties_sparse_chunks_and_keeps_every_page() {
    let (z, kept) = fragmented_pool(24000, 900, 3);
    let before = z.stats().unwrap();
    // A third of the objects in chunks that were full: two thirds of the pool is room.
    assert!(before.pool_bytes > 2 * before.object_bytes, "{before:?}");
    for _ in 0..50 {
        z.compact();
    }
    z.alloc.check_invariants();
    let after = z.stats().unwrap();
    assert_eq!(after.object_bytes, before.object_bytes, "objects move, they are not freed");
    assert!(after.compacted_chunks > 0, "{after:?}");
    assert_eq!(
        after.pool_bytes,
        before.pool_bytes - after.compacted_chunks * CHUNK_BYTES as u64,
        "every chunk compaction freed is out of the pool: {after:?}"
    );
    // Compacted until the room left is within the bound.
    let room_bytes = after.pool_bytes - after.object_bytes;
    assert!(room_bytes < COMPACT_MIN_ROOM_BYTES.max(after.pool_bytes / COMPACT_ROOM_DIVISOR), "{after:?}");
    for &slot in &kept {
        assert_eq!(load(&z, slot).unwrap().0, page_at(slot, 900).0, "slot {slot}");
    }
    // A compacted pool empties to nothing.
    for &slot in &kept {
        z.invalidate(slot);
    }
    assert_eq!(z.pool_bytes(), 0);
}

#[test]
fn a_read_that_loaded_the_entry_before_its_object_moved_reads_the_new_place() {
    let (z, kept) = fragmented_pool(6000, 900, 3);
    // Every kept slot's entry as a reader would have loaded it before compaction.
    let entries: Vec<u64> = kept.iter().map(|&s| z.slots[2 * s as usize].load(Ordering::Acquire)).collect();
    for _ in 0..50 {
        z.compact();
    }
    z.trim();
    let st = z.stats().unwrap();
    assert!(st.compacted_chunks > 0, "{st:?}");
    // The chunks compaction emptied were given back (they read as zero now) or hold
    // other objects: the old entries' bytes are gone.
    let mut moved = 0;
    let mut ws = z.codecs.take_workspace().unwrap();
    for (&slot, &e) in kept.iter().zip(&entries) {
        moved += (z.slots[2 * slot as usize].load(Ordering::Relaxed) != e) as usize;
        let mut dst = AlignedPage([0xaa; PAGE_SIZE]);
        z.load_page_from(slot, e, &mut dst.0, &mut ws.out.0).unwrap_or_else(|err| panic!("slot {slot}: {err}"));
        assert_eq!(dst.0, page_at(slot, 900).0, "slot {slot}");
    }
    z.codecs.put_workspace(ws);
    assert!(moved > kept.len() / 4, "{moved} of {} moved", kept.len());
}

#[test]
fn pages_read_and_invalidated_while_compaction_moves_them_are_exact() {
    let (z, kept) = fragmented_pool(6000, 700, 4);
    let z = std::sync::Arc::new(z);
    let stop = std::sync::Arc::new(AtomicBool::new(false));
    let compactor = {
        let (z, stop) = (z.clone(), stop.clone());
        std::thread::spawn(move || {
            let mut rounds = 0u64;
            while !stop.load(Ordering::Relaxed) && rounds < 1_000_000 {
                z.compact();
                z.alloc.trim();
                rounds += 1;
            }
        })
    };
    // A third owner churns slots of its own (stores, then frees two of three, then the
    // rest): the pool stays fragmented and the compactor busy.
    let churn = {
        let (z, stop) = (z.clone(), stop.clone());
        std::thread::spawn(move || {
            let slots = 10_000..16_000u64;
            for round in 0..1000u64 {
                if stop.load(Ordering::Relaxed) {
                    break;
                }
                for slot in slots.clone() {
                    store(&z, slot, &page_at(slot + round, 700)).unwrap();
                }
                for slot in slots.clone().filter(|s| s % 3 != 0) {
                    z.invalidate(slot);
                }
                // The third kept is read back while the compactor moves it.
                for slot in slots.clone().filter(|s| s % 3 == 0) {
                    assert_eq!(load(&z, slot).unwrap().0, page_at(slot + round, 700).0, "slot {slot}");
                    z.invalidate(slot);
                }
            }
        })
    };
    // Two owners, each of its half of the kept slots: read every page, and now and then
    // invalidate one and store a new page there, while the compactor moves them.
    let owners: Vec<_> = (0..2usize)
        .map(|t| {
            let z = z.clone();
            let mine: Vec<u64> = kept.iter().copied().filter(|s| (s / 4) as usize % 2 == t).collect();
            std::thread::spawn(move || {
                let mut version = vec![0u64; mine.len()];
                let want = |slot: u64, v: u64| page_at(slot + v * 100_000, 700);
                // A second of reads, at least 5 rounds (bounded).
                let start = std::time::Instant::now();
                for round in 0..10_000u64 {
                    if round >= 5 && start.elapsed() > std::time::Duration::from_secs(1) {
                        break;
                    }
                    for (i, &slot) in mine.iter().enumerate() {
                        let got = load(&z, slot).unwrap_or_else(|e| panic!("slot {slot} round {round}: {e}"));
                        assert_eq!(got.0, want(slot, version[i]).0, "slot {slot} round {round}");
                        if (i as u64 + round) % 7 == 0 {
                            z.invalidate(slot);
                            version[i] += 1;
                            store(&z, slot, &want(slot, version[i])).unwrap();
                        }
                    }
                }
            })
        })
        .collect();
    for o in owners {
        o.join().unwrap();
    }
    stop.store(true, Ordering::Relaxed);
    compactor.join().unwrap();
    churn.join().unwrap();
    let st = z.stats().unwrap();
    assert!(st.compacted_chunks > 10, "the compactor ran while the owners read: {st:?}");
    assert_eq!(st.stored_pages, kept.len() as u64, "{st:?}");
    // Nothing leaked or freed twice: the lists agree with the chunks, and the pool
    // empties to nothing.
    z.alloc.check_invariants();
    for &slot in &kept {
        z.invalidate(slot);
    }
    let st = z.stats().unwrap();
    assert_eq!((st.pool_bytes, st.object_bytes, st.compressed_bytes), (0, 0, 0), "{st:?}");
    z.alloc.check_invariants();
}

#[test]
fn incompressible_pages_can_be_passed_on() {
    let mut cfg = ZpoolConfig::new(4 << 20, 1024);
    cfg.incompressible = Incompressible::Reject;
    let z = ZpoolBackend::new(cfg).unwrap();
    let e = store(&z, 5, &page_of(3, 1)).unwrap_err();
    assert!(matches!(e, BackendError::Rejected { slot: 5, reason: RejectReason::Incompressible }), "{e}");
    assert!(matches!(load(&z, 5), Err(BackendError::Empty { .. })), "a rejected page leaves nothing");
    store(&z, 6, &page_of(2, 1)).unwrap();
    assert_eq!(z.stats().unwrap().reject_incompressible, 1);
}

#[test]
fn a_failed_page_in_a_run_stores_nothing_of_the_run() {
    let mut cfg = ZpoolConfig::new(4 << 20, 1024);
    cfg.incompressible = Incompressible::Reject;
    let z = ZpoolBackend::new(cfg).unwrap();
    let run = [page_of(2, 1), page_of(1, 2), page_of(3, 3)];
    let mut req = [WriteReq::new(10, PageRun::from_pages(&run))];
    z.write(&mut req);
    assert!(req[0].result.is_err());
    let st = z.stats().unwrap();
    assert_eq!((st.stored_pages, st.same_filled_pages, st.same_filled_stores), (0, 0, 0), "{st:?}");
    assert_eq!(z.pool_bytes(), 0);
}

#[test]
fn concurrent_stores_and_invalidations_on_distinct_slots() {
    let z = std::sync::Arc::new(ZpoolBackend::new(ZpoolConfig::new(32 << 20, 16384)).unwrap());
    let threads: Vec<_> = (0..4u64)
        .map(|t| {
            let z = z.clone();
            std::thread::spawn(move || {
                for round in 0..5u64 {
                    for i in 0..500u64 {
                        let slot = t * 4096 + i;
                        store(&z, slot, &page_of(((i + round) % 4) as u32, slot * 31 + round)).unwrap();
                    }
                    for i in 0..500u64 {
                        let slot = t * 4096 + i;
                        let want = page_of(((i + round) % 4) as u32, slot * 31 + round);
                        assert_eq!(load(&z, slot).unwrap().0, want.0);
                        z.invalidate(slot);
                    }
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    let st = z.stats().unwrap();
    assert_eq!((st.stored_pages, st.pool_bytes), (0, 0), "{st:?}");
}

fn unit_pool(unit_pages: usize, nr_slots: u64) -> ZpoolBackend {
    let mut cfg = ZpoolConfig::new(64 << 20, nr_slots);
    cfg.compressor = Compressor::Zstd { level: 1 };
    cfg.unit_pages = unit_pages;
    ZpoolBackend::new(cfg).unwrap()
}

fn store_run(z: &ZpoolBackend, slot: u64, pages: &[AlignedPage]) -> Result<(), BackendError> {
    let mut req = [WriteReq::new(slot, PageRun::from_pages(pages))];
    z.write(&mut req);
    std::mem::replace(&mut req[0].result, Ok(()))
}

fn load_run(z: &ZpoolBackend, slot: u64, nr: usize) -> Result<Vec<AlignedPage>, BackendError> {
    let mut buf = vec![AlignedPage([0xaa; PAGE_SIZE]); nr];
    let mut req = [ReadReq::new(slot, &mut buf)];
    z.read(&mut req);
    std::mem::replace(&mut req[0].result, Ok(())).map(|_| buf)
}

/// Runs of pages stored in units read back exactly, one page or a run at a time; a unit's
/// object is freed with its last page, whatever the order; a slot freed out of a live unit
/// is written again.
#[test]
fn units_round_trip_and_free_with_their_last_page() {
    let z = unit_pool(4, 4096);
    let pages: Vec<AlignedPage> = (0..400u64).map(|i| page_compressing_to(256, i + 1)).collect();
    for run in 0..50u64 {
        store_run(&z, run * 8, &pages[run as usize * 8..][..8]).unwrap();
    }
    let st = z.stats().unwrap();
    assert_eq!((st.stored_pages, st.units, st.unit_pages, st.unit_fallbacks), (400, 100, 400, 0), "{st:?}");
    assert!(st.compressed_bytes < 400 * 300, "{st:?}");
    for (i, p) in pages.iter().enumerate() {
        assert_eq!(load(&z, i as u64).unwrap().0, p.0, "slot {i}");
    }
    for run in 0..50u64 {
        let got = load_run(&z, run * 8, 8).unwrap();
        for (k, g) in got.iter().enumerate() {
            assert_eq!(g.0, pages[run as usize * 8 + k].0, "run {run} page {k}");
        }
    }
    // Three pages of each first unit: no unit is freed.
    let pool_bytes = z.pool_bytes();
    for run in 0..50u64 {
        [0, 2, 3].iter().for_each(|k| z.invalidate(run * 8 + k));
    }
    let st = z.stats().unwrap();
    assert_eq!((st.units, st.unit_pages, st.stored_pages), (100, 250, 250), "{st:?}");
    assert_eq!(z.pool_bytes(), pool_bytes, "a unit stays while a page of it is stored");
    // The freed slots written again while their unit lives: a row at one of them is free
    // but for the first (the head of the unit that lives).
    for run in 0..50u64 {
        store_run(&z, run * 8 + 2, &pages[398..]).unwrap();
        store(&z, run * 8, &pages[397]).unwrap();
        for (k, want) in [(0, 397), (1, run as usize * 8 + 1), (2, 398), (3, 399), (4, run as usize * 8 + 4)] {
            assert_eq!(load(&z, run * 8 + k).unwrap().0, pages[want].0, "run {run} page {k}");
        }
    }
    for slot in (0..400).rev() {
        z.invalidate(slot);
    }
    let st = z.stats().unwrap();
    assert_eq!((st.stored_pages, st.units, st.unit_pages), (0, 0, 0), "{st:?}");
    assert_eq!((st.pool_bytes, st.compressed_bytes, st.object_bytes), (0, 0, 0), "{st:?}");
    z.alloc.check_invariants();
}

/// A run with a same-filled page keeps it as its word; pages that do not fit one unit
/// whole go in halves, then alone, and every page reads back.
#[test]
fn units_that_do_not_fit_are_halved_then_stored_page_by_page() {
    let z = unit_pool(4, 4096);
    // Per run of 10: compressible pages, a same-filled one at 3, an incompressible one at 7.
    let page = |i: u64| match i % 10 {
        3 => page_of(1, i + 1),
        7 => page_of(3, i + 1),
        _ => page_compressing_to(256, i + 1),
    };
    let pages: Vec<AlignedPage> = (0..400u64).map(page).collect();
    for run in 0..40u64 {
        store_run(&z, run * 10, &pages[run as usize * 10..][..10]).unwrap();
    }
    // A run whose last page is same-filled: the pages gathered before it are stored too
    // (they were left out, and read as empty slots, under CPython's exit).
    let tail: Vec<AlignedPage> =
        [2, 2, 1].iter().map(|&k| if k == 1 { page_of(1, 7) } else { page_compressing_to(256, k) }).collect();
    store_run(&z, 500, &tail).unwrap();
    for (k, p) in tail.iter().enumerate() {
        assert_eq!(load(&z, 500 + k as u64).unwrap().0, p.0, "slot {}", 500 + k);
    }
    (500..503).for_each(|slot| z.invalidate(slot));
    let st = z.stats().unwrap();
    assert_eq!((st.stored_pages, st.same_filled_pages, st.incompressible_pages), (400, 40, 40), "{st:?}");
    // The first run: [0 1 2 4] a unit, [5 6 7 8] not, [5 6] a unit, [7 8] not, then alone.
    assert!(st.units >= 40 && st.unit_fallbacks >= 2, "{st:?}");
    assert!(st.unit_pages >= 2 * st.units && st.unit_pages <= 4 * st.units, "{st:?}");
    for (i, p) in pages.iter().enumerate() {
        assert_eq!(load(&z, i as u64).unwrap().0, p.0, "slot {i}");
    }
    (0..400).for_each(|slot| z.invalidate(slot));
    let st = z.stats().unwrap();
    assert_eq!((st.stored_pages, st.pool_bytes, st.units), (0, 0, 0), "{st:?}");
}

/// Units fit in less memory than their pages alone when the pages share content.
#[test]
fn units_of_pages_that_share_content_are_denser() {
    // Pages of one "program": the same 256-byte records, shuffled per page.
    let record = page_compressing_to(256, 99);
    let mk = |i: u64| {
        let mut p = AlignedPage([0; PAGE_SIZE]);
        for (k, c) in p.0.chunks_exact_mut(256).enumerate() {
            let r = (k as u64 * 7 + i) % 16;
            c.copy_from_slice(&record.0[..256]);
            c[..8].copy_from_slice(&(r ^ i).to_ne_bytes());
        }
        p
    };
    let pages: Vec<AlignedPage> = (0..256).map(mk).collect();
    let (single, units) = (unit_pool(1, 1024), unit_pool(4, 1024));
    for z in [&single, &units] {
        for run in 0..32u64 {
            store_run(z, run * 8, &pages[run as usize * 8..][..8]).unwrap();
        }
    }
    let (a, b) = (single.stats().unwrap(), units.stats().unwrap());
    assert_eq!(b.unit_pages, 256, "{b:?}");
    assert!(b.compressed_bytes * 2 < a.compressed_bytes, "units {b:?} against pages {a:?}");
    for (i, p) in pages.iter().enumerate() {
        assert_eq!(load(&units, i as u64).unwrap().0, p.0, "slot {i}");
    }
}

/// Units read, freed and stored again while compaction moves their objects: every page
/// exact, nothing leaked.
#[test]
fn units_read_and_freed_while_compaction_moves_them_are_exact() {
    let z = std::sync::Arc::new(unit_pool(4, 32768));
    fn want(slot: u64, v: u64) -> AlignedPage {
        page_at(slot + v * 100_000, 300)
    }
    fn run_of(first: u64, v: u64) -> Vec<AlignedPage> {
        (first..first + 4).map(|s| want(s, v)).collect()
    }
    // Fragment: units at 0, 4, 8...; two of three freed.
    for first in (0..16_000u64).step_by(4) {
        store_run(&z, first, &run_of(first, 0)).unwrap();
    }
    for first in (0..16_000u64).step_by(4).filter(|f| f % 12 != 0) {
        (first..first + 4).for_each(|s| z.invalidate(s));
    }
    let stop = std::sync::Arc::new(AtomicBool::new(false));
    let compactor = {
        let (z, stop) = (z.clone(), stop.clone());
        std::thread::spawn(move || {
            for _ in 0..1_000_000 {
                if stop.load(Ordering::Relaxed) {
                    break;
                }
                z.compact();
            }
        })
    };
    let owners: Vec<_> = (0..2u64)
        .map(|t| {
            let z = z.clone();
            std::thread::spawn(move || {
                let mine: Vec<u64> = (0..16_000u64).step_by(12).filter(|f| (f / 12) % 2 == t).collect();
                let mut version = vec![0u64; mine.len()];
                let start = std::time::Instant::now();
                for round in 0..10_000u64 {
                    if round >= 5 && start.elapsed() > std::time::Duration::from_secs(1) {
                        break;
                    }
                    for (i, &first) in mine.iter().enumerate() {
                        let got = load_run(&z, first, 4).unwrap_or_else(|e| panic!("unit {first}: {e}"));
                        for (k, g) in got.iter().enumerate() {
                            assert_eq!(
                                g.0,
                                want(first + k as u64, version[i]).0,
                                "slot {} round {round}",
                                first + k as u64
                            );
                        }
                        if (i as u64 + round) % 5 == 0 {
                            (first..first + 4).rev().for_each(|s| z.invalidate(s));
                            version[i] += 1;
                            store_run(&z, first, &run_of(first, version[i])).unwrap();
                        }
                    }
                }
            })
        })
        .collect();
    for o in owners {
        o.join().unwrap();
    }
    stop.store(true, Ordering::Relaxed);
    compactor.join().unwrap();
    let st = z.stats().unwrap();
    assert!(st.compacted_chunks > 0, "the compactor ran while the owners read: {st:?}");
    assert_eq!((st.units, st.unit_pages), (16_000 / 12 + 1, 4 * (16_000 / 12 + 1)), "{st:?}");
    z.alloc.check_invariants();
    (0..16_000).for_each(|s| z.invalidate(s));
    let st = z.stats().unwrap();
    assert_eq!((st.pool_bytes, st.object_bytes, st.compressed_bytes, st.units), (0, 0, 0, 0), "{st:?}");
}

/// Pages of text as programs hold it: records from a few hundred templates (field names,
/// keywords) with numbers that vary, so that a page shares more with other pages than with
/// itself.
pub(super) fn text_pages(nr_pages: usize, seed: u32) -> Vec<u8> {
    const WORDS: [&str; 16] = [
        "select", "index", "value", "key", "table", "row", "name", "count", "node", "left", "right", "order", "page",
        "cache", "swap", "entry",
    ];
    let mut x = seed | 1;
    let mut out = Vec::with_capacity(nr_pages * PAGE_SIZE + 128);
    // Bounded: each line adds bytes.
    while out.len() < nr_pages * PAGE_SIZE {
        x ^= x << 13;
        x ^= x >> 17;
        x ^= x << 5;
        let t = (x >> 20) as usize % 300;
        let w = |k: usize| WORDS[(t * 7 + k * 5 + t / 16) % 16];
        let line = format!("<{} {}=\"{}_{}\" {}={}>{}</{}>\n", w(0), w(1), w(2), t, w(3), x % 1000, w(4), w(0));
        out.extend_from_slice(line.as_bytes());
    }
    out.truncate(nr_pages * PAGE_SIZE);
    out
}

/// A pool with `dict` trains its dictionary on its first pages once the background thread
/// calls `trim` (not before the samples are in), compresses with it from then on (fewer
/// bytes for pages like those it learnt from), counts it in its bytes, and reads back every
/// page, written before or after, byte for byte; in units too.
#[test]
fn a_pool_with_a_dictionary_trains_it_and_reads_every_page_back() {
    use super::dictionary::{NR_SAMPLES, SAMPLE_EVERY};
    let before = NR_SAMPLES * SAMPLE_EVERY as usize;
    let data = text_pages(2 * before, 11);
    let pages: Vec<AlignedPage> =
        data.chunks_exact(PAGE_SIZE).map(|p| AlignedPage(p.try_into().expect("a page"))).collect();
    for unit_pages in [1, 4] {
        let mut cfg = ZpoolConfig::new(64 << 20, 4 * before as u64);
        (cfg.compressor, cfg.unit_pages, cfg.dictionary) = (Compressor::Zstd { level: 1 }, unit_pages, true);
        let z = ZpoolBackend::new(cfg).unwrap();
        let store_half = |half: usize| {
            for first in (half * before..(half + 1) * before).step_by(unit_pages) {
                store_run(&z, first as u64, &pages[first..first + unit_pages]).expect("stored");
            }
        };
        store_run(&z, 0, &pages[..unit_pages]).unwrap();
        z.trim();
        assert_eq!(z.stats().unwrap().dictionary_bytes, 0, "trained before its samples were in");
        for i in 0..unit_pages as u64 {
            z.invalidate(i);
        }
        store_half(0);
        let without = z.stats().unwrap().compressed_bytes;
        let sampling = z.stats().unwrap().codec_bytes;
        z.trim();
        let st = z.stats().unwrap();
        assert!(st.dictionary_bytes > 64 << 10 && st.dictionary_failures == 0, "{st:?}");
        assert_eq!(st.pool_bytes, z.alloc.pool_bytes() + st.dictionary_bytes);
        // The codecs' memory: every sample while they were taken (freed by training), then
        // the dictionary's contexts, one per workspace, each larger than a page.
        let sizes = super::codec::Sizes::of_pager();
        let (workspaces, zstd) = (sizes.workspaces as u64, sizes.zstd as u64);
        let fixed = sampling - (NR_SAMPLES * PAGE_SIZE) as u64;
        assert!(fixed >= workspaces * 4 * PAGE_SIZE as u64 + zstd * 32 * PAGE_SIZE as u64, "{fixed} bytes fixed");
        assert!(st.codec_bytes > fixed + zstd * 8 * PAGE_SIZE as u64, "{} bytes after training", st.codec_bytes);
        store_half(1);
        let with = z.stats().unwrap().compressed_bytes - without;
        assert!(with < without * 9 / 10, "units of {unit_pages}: {with} bytes with the dictionary, {without} without");
        for (i, p) in pages.iter().enumerate() {
            assert_eq!(load(&z, i as u64).unwrap().0, p.0, "units of {unit_pages}: page {i}");
        }
        for first in (0..pages.len()).step_by(8) {
            let got = load_run(&z, first as u64, 8).unwrap();
            assert!(got.iter().zip(&pages[first..]).all(|(g, p)| g.0 == p.0), "units of {unit_pages}: run {first}");
        }
    }
    let mut cfg = ZpoolConfig::new(64 << 20, 4096);
    cfg.dictionary = true;
    assert!(matches!(ZpoolBackend::new(cfg), Err(ZpoolError::DictionaryNeedsZstd)), "lz4 takes no dictionary");
}

/// A dictionary that costs bytes is turned off: one trained on records of words, given
/// lines of hexadecimal keys (GNU sort's buffer in `bench/density`), compresses them into
/// more bytes than none; the pool checks, stops using it, and reads every page back.
#[test]
fn a_dictionary_that_costs_bytes_is_turned_off() {
    use super::dictionary::{NR_SAMPLES, SAMPLE_EVERY};
    let before = NR_SAMPLES * SAMPLE_EVERY as usize;
    let mut data = text_pages(before, 5);
    let mut x = 1u64;
    // Bounded: each line adds bytes.
    while data.len() < 3 * before * PAGE_SIZE {
        x += 1;
        data.extend_from_slice(format!("{:08x} {x}\n", x.wrapping_mul(2_654_435_761) % (1 << 32)).as_bytes());
    }
    data.truncate(3 * before * PAGE_SIZE);
    let mut cfg = ZpoolConfig::new(64 << 20, 4 * before as u64);
    (cfg.compressor, cfg.dictionary) = (Compressor::Zstd { level: 1 }, true);
    let z = ZpoolBackend::new(cfg).unwrap();
    let pages: Vec<AlignedPage> =
        data.chunks_exact(PAGE_SIZE).map(|p| AlignedPage(p.try_into().expect("a page"))).collect();
    for (i, p) in pages.iter().enumerate() {
        store(&z, i as u64, p).unwrap();
        if i + 1 == before {
            z.trim();
            assert!(z.stats().unwrap().dictionary_bytes > 0, "trained");
        }
    }
    let st = z.stats().unwrap();
    assert!(st.dictionary_in_use == 0 && st.dictionary_turned_off >= 1, "{st:?}");
    for (i, p) in pages.iter().enumerate() {
        assert_eq!(load(&z, i as u64).unwrap().0, p.0, "page {i}");
    }
}
