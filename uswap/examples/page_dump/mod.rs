//! What the page-dump examples (`page_units`, `page_dict`) share: the test the pool makes
//! for a same-filled page, and the percentiles of their timings.

/// A page of one repeated 8-byte word: the pool stores its word, not the page.
pub fn same_filled(page: &[u8]) -> bool {
    let first = &page[..8];
    page.chunks_exact(8).all(|w| w == first)
}

/// The `q` quantile of `v` (sorted in place); 0 for none.
pub fn percentile(v: &mut [f64], q: f64) -> f64 {
    v.sort_by(f64::total_cmp);
    v.get(((v.len().max(1) - 1) as f64 * q) as usize).copied().unwrap_or(0.0)
}
