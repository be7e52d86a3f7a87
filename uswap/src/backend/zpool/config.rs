//! The compressed pool's configuration and errors: which codec, what to do with a page that
//! does not compress, the cap and its hysteresis, and why a pool could not be created.
//!
//! A leaf of the folder: the allocator (`allocator.rs`), the codecs (`codec.rs`) and the
//! pool (`mod.rs`) all read these types, and this module imports none of theirs.
//!
//! Locking: none (plain values, copied into the pool at creation).

use crate::uffd::PAGE_SIZE;

/// How pages are compressed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Compressor {
    /// lz4 (`lz4_flex`): the fastest; the default, as in zswap.
    Lz4,
    /// zstd at the given level: smaller, slower.
    Zstd { level: i32 },
}

/// What to do with a page that does not compress below the threshold.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Incompressible {
    /// Keep it uncompressed in the pool (zswap since 6.17).
    StoreRaw,
    /// Decline it: the engine writes it to the next device.
    Reject,
}

/// Configuration of a compressed pool.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ZpoolConfig {
    /// Memory the pool may use for compressed data (its footprint in chunks).
    pub cap_bytes: u64,
    /// Pages the pool can index (its slots).
    pub nr_slots: u64,
    pub compressor: Compressor,
    pub incompressible: Incompressible,
    /// A page compressing to this many bytes or more counts as incompressible.
    pub incompressible_threshold_bytes: usize,
    /// After reaching the cap, accept pages again below this percentage of it.
    pub accept_threshold_percent: u8,
    /// Pages compressed together as one object, at most (1: page by page). See `mod.rs`,
    /// "Units"; from 1 to [`MAX_UNIT_PAGES`].
    pub unit_pages: usize,
    /// zstd only: train a dictionary on the pool's first pages and compress with it from
    /// then on (`dictionary.rs`).
    pub dictionary: bool,
}

impl ZpoolConfig {
    pub fn new(cap_bytes: u64, nr_slots: u64) -> ZpoolConfig {
        ZpoolConfig {
            cap_bytes,
            nr_slots,
            compressor: Compressor::Lz4,
            incompressible: Incompressible::StoreRaw,
            incompressible_threshold_bytes: PAGE_SIZE - PAGE_SIZE / 8,
            accept_threshold_percent: 90,
            unit_pages: 1,
            dictionary: false,
        }
    }
}

/// The zstd levels a pool takes (zstd's own range, less its fast negative levels).
pub const ZSTD_LEVELS: std::ops::RangeInclusive<i32> = 1..=22;

/// The most pages a unit holds (32 KiB): at 64 KiB zstd stored no fewer bytes per page of
/// real programs than at 16 KiB and took 3-4 times as long to give one page back
/// (docs/bench/design-measurements.md, "Units of neighbouring pages"); lz4's hash table
/// (16-bit positions) takes inputs under 64 KiB.
pub const MAX_UNIT_PAGES: usize = 8;

/// Why the pool could not be created.
#[derive(Debug, thiserror::Error)]
pub enum ZpoolError {
    #[error("compressed pool cap of {cap_bytes} bytes is below one chunk ({min_bytes} bytes)")]
    CapTooSmall { cap_bytes: u64, min_bytes: u64 },
    #[error("compressed pool cap of {cap_bytes} bytes is above the most one pool can index ({max_bytes} bytes): give a smaller size")]
    CapTooLarge { cap_bytes: u64, max_bytes: u64 },
    #[error("cannot map the compressed pool's arena ({bytes} bytes): {source}")]
    Map { bytes: u64, source: std::io::Error },
    #[error("zstd level {level} is out of range ({}..={})", ZSTD_LEVELS.start(), ZSTD_LEVELS.end())]
    ZstdLevel { level: i32 },
    #[error("a unit of {unit_pages} pages is out of range: units hold 1 to {MAX_UNIT_PAGES} pages (unit=4KiB to unit=32KiB)")]
    UnitPages { unit_pages: usize },
    #[error("a pool of {nr_slots} slots is too large for units: give a smaller size, or no unit")]
    UnitSlots { nr_slots: u64 },
    #[error("a dictionary is zstd's: give zstd or zstd-LEVEL with dict")]
    DictionaryNeedsZstd,
    #[error("cannot set up a zstd context: {what}")]
    Zstd { what: String },
}
