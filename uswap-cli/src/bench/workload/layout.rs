//! The page layout every workload writes and checks, so that any wrong byte is seen.
//!
//! Word 0 of page `i` holds `i` (the index word), word 1 counts the writes made to the page
//! (the counter word), words 2..256 hold a pseudo-random pattern derived from `(i, k)` and
//! words 256..512 are zero: half random, half zero, as `probes/memtouch.c` fills its
//! pages, so that compressing devices (zram) see the same data whoever runs the workload.
//!
//! Contents are a pure function of the page and word index, except the counter word. A read
//! checks the words it reads (and always the index word); a write increments the counter
//! and stores the expected value back into the words it writes. Lost writes are caught at
//! the end by [`check_range`], which compares the sum of the counters with the number of
//! writes made.

use std::sync::atomic::{AtomicU64, Ordering};

use super::options::Verify;

/// Verification errors described per side (the count is always exact).
pub const MAX_ERROR_SAMPLES: usize = 8;

pub const PAGE_WORDS: usize = uswap::PAGE_SIZE / 8;
/// Words `2..PATTERN_END` carry the pattern; the rest of the page is zero.
pub const PATTERN_END: usize = PAGE_WORDS / 2;
pub const INDEX_WORD: usize = 0;
pub const COUNTER_WORD: usize = 1;

/// The pattern word `k` (2 ≤ k < 256) of page `i`: a splitmix64 of (i, k).
#[inline]
pub fn pattern_word(i: u64, k: usize) -> u64 {
    let mut z = i.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ (k as u64).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// What word `k` of page `i` must hold; `None` for the counter word.
#[inline]
pub fn expected_word(i: u64, k: usize) -> Option<u64> {
    match k {
        INDEX_WORD => Some(i),
        COUNTER_WORD => None,
        k if k < PATTERN_END => Some(pattern_word(i, k)),
        _ => Some(0),
    }
}

/// The words of page `i` (a `PAGE_WORDS` slice of the region).
#[inline]
pub fn page(words: &[AtomicU64], i: u64) -> &[AtomicU64] {
    let i = i as usize;
    &words[i * PAGE_WORDS..(i + 1) * PAGE_WORDS]
}

/// First write of a page: index, a zero counter, the pattern. The zero half stays as mapped.
pub fn fill_page(page: &[AtomicU64], i: u64) {
    page[INDEX_WORD].store(i, Ordering::Relaxed);
    page[COUNTER_WORD].store(0, Ordering::Relaxed);
    for (k, w) in page.iter().enumerate().take(PATTERN_END).skip(2) {
        w.store(pattern_word(i, k), Ordering::Relaxed);
    }
}

/// Checks words `lo..hi` of page `i`; describes the first that differs.
#[inline]
pub fn check_words(page: &[AtomicU64], i: u64, lo: usize, hi: usize) -> Option<String> {
    for (k, w) in page.iter().enumerate().take(hi).skip(lo) {
        if let Some(want) = expected_word(i, k) {
            let got = w.load(Ordering::Relaxed);
            if got != want {
                return Some(if k == INDEX_WORD {
                    format!("page {i}: index word is {got:#x}")
                } else {
                    format!("page {i}: word {k} is {got:#x}, expected {want:#x}")
                });
            }
        }
    }
    None
}

/// One access to page `i` touching words `lo..hi` (an empty range touches only the index
/// word). A write increments the counter and stores the expected values of `lo..hi` back;
/// a read checks them. Both check the index word, and the whole page with `Verify::Full`.
#[inline]
pub fn touch(page: &[AtomicU64], i: u64, lo: usize, hi: usize, write: bool, verify: Verify) -> Option<String> {
    if write {
        page[COUNTER_WORD].fetch_add(1, Ordering::Relaxed);
        for (k, w) in page.iter().enumerate().take(hi).skip(lo.max(2)) {
            if let Some(v) = expected_word(i, k) {
                w.store(v, Ordering::Relaxed);
            }
        }
    } else if let Some(e) = check_words(page, i, lo, hi) {
        return Some(e);
    }
    match verify {
        Verify::Full => check_words(page, i, 0, PAGE_WORDS),
        Verify::Index => check_words(page, i, INDEX_WORD, INDEX_WORD + 1),
    }
}

/// Checks every page of `lo..hi` and that their counters add up to `writes`. Returns the
/// number of errors (bad pages, plus the writes missing or extra) and the first few described.
pub fn check_range(words: &[AtomicU64], lo: u64, hi: u64, writes: u64) -> (u64, Vec<String>) {
    let mut bad = 0;
    let mut errors = vec![];
    let mut counted: u64 = 0;
    for i in lo..hi {
        let p = page(words, i);
        counted = counted.wrapping_add(p[COUNTER_WORD].load(Ordering::Relaxed));
        if let Some(e) = check_words(p, i, 0, PAGE_WORDS) {
            bad += 1;
            if errors.len() < MAX_ERROR_SAMPLES {
                errors.push(e);
            }
        }
    }
    if counted != writes {
        bad += counted.abs_diff(writes);
        errors.push(format!(
            "pages {lo}..{hi}: write counters add up to {counted}, but {writes} writes were made (writes lost or duplicated)"
        ));
    }
    (bad, errors)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn region(pages: usize) -> uswap::PlainRegion {
        let r = uswap::PlainRegion::new(pages * uswap::PAGE_SIZE).unwrap();
        for i in 0..pages as u64 {
            fill_page(page(r.as_atomic_u64s(), i), i);
        }
        r
    }

    #[test]
    fn writes_keep_the_page_checkable_and_are_counted() {
        let r = region(4);
        let w = r.as_atomic_u64s();
        assert_eq!(touch(page(w, 2), 2, 0, PAGE_WORDS, true, Verify::Full), None);
        assert_eq!(touch(page(w, 2), 2, 7, 8, true, Verify::Index), None);
        assert_eq!(touch(page(w, 3), 3, 300, 301, false, Verify::Index), None);
        assert_eq!(page(w, 2)[COUNTER_WORD].load(Ordering::Relaxed), 2);
        assert_eq!(check_range(w, 0, 4, 2), (0, vec![]));
    }

    #[test]
    fn wrong_bytes_and_lost_writes_are_reported() {
        let r = region(8);
        let w = r.as_atomic_u64s();
        // A flipped bit in the zero half of page 5.
        page(w, 5)[400].fetch_xor(1 << 9, Ordering::Relaxed);
        let e = touch(page(w, 5), 5, 400, 401, false, Verify::Index).unwrap();
        assert!(e.starts_with("page 5: word 400 is 0x200"), "{e}");
        // A read of another word misses it unless the whole page is verified.
        assert_eq!(touch(page(w, 5), 5, 3, 4, false, Verify::Index), None);
        assert!(touch(page(w, 5), 5, 3, 4, false, Verify::Full).is_some());
        // A page swapped in at the wrong place.
        page(w, 6)[INDEX_WORD].store(9, Ordering::Relaxed);
        assert_eq!(touch(page(w, 6), 6, 0, 0, true, Verify::Index).unwrap(), "page 6: index word is 0x9");
        // One write recorded on page 6 above, three claimed: two lost, plus two bad pages.
        let (bad, errors) = check_range(w, 0, 8, 3);
        assert_eq!(bad, 4, "{errors:?}");
        assert!(errors.last().unwrap().contains("add up to 1, but 3 writes"), "{errors:?}");
    }
}
