//! Byte sizes on the command line: `4096`, `64KiB`, `256MiB`, `1GiB`, `1.5GiB`.
//!
//! `KiB`, `MiB`, `GiB`, `TiB` and the one-letter forms `K`, `M`, `G`, `T` (either case) are
//! powers of 1024; no unit (or `B`) means bytes; `MB` and the like are refused as ambiguous.
//! Parsing is `uswap::parse_size`, shared with device lists.

use std::fmt;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SizeError(String);

impl fmt::Display for SizeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for SizeError {}

/// Parses a size for clap (the library's parser, with the argument named in the error).
pub fn parse_size(s: &str) -> Result<u64, SizeError> {
    uswap::parse_size(s).map_err(|why| SizeError(format!("cannot parse size {s:?}: {why}")))
}

/// `268435456` → `256MiB` (exact units only, else bytes).
pub fn format_size(bytes: u64) -> String {
    for (unit, m) in [("TiB", 1u64 << 40), ("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)] {
        if bytes >= m && bytes % m == 0 {
            return format!("{}{unit}", bytes / m);
        }
    }
    format!("{bytes}B")
}

/// A measured amount for a person to read: `format_size` where it is exact, else one
/// decimal of the largest unit it reaches (`29935792` → `28.5MiB`, not `29935792B`).
pub fn format_amount(bytes: u64) -> String {
    for (unit, m) in [("TiB", 1u64 << 40), ("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)] {
        if bytes >= m {
            return if bytes % m == 0 {
                format!("{}{unit}", bytes / m)
            } else {
                format!("{:.1}{unit}", bytes as f64 / m as f64)
            };
        }
    }
    format!("{bytes}B")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_units() {
        assert_eq!(parse_size("4096"), Ok(4096));
        assert_eq!(parse_size("256MiB"), Ok(256 << 20));
        assert_eq!(parse_size("1GiB"), Ok(1 << 30));
        assert_eq!(parse_size("1G"), Ok(1 << 30));
        assert_eq!(parse_size("1.5GiB"), Ok(3 << 29));
        assert_eq!(parse_size(" 64KiB "), Ok(64 << 10));
    }

    #[test]
    fn rejects_garbage_with_a_hint() {
        for bad in ["", "MiB", "12XB", "1..2GiB", "-1GiB", "2MB"] {
            let e = parse_size(bad).unwrap_err().to_string();
            assert!(e.contains("cannot parse size"), "{bad}: {e}");
        }
    }

    #[test]
    fn formats_exact_units() {
        assert_eq!(format_size(256 << 20), "256MiB");
        assert_eq!(format_size(1 << 30), "1GiB");
        assert_eq!(format_size(1000), "1000B");
    }

    #[test]
    fn formats_measured_amounts_to_one_decimal() {
        assert_eq!(format_amount(29_935_792), "28.5MiB");
        assert_eq!(format_amount(379_280), "370.4KiB");
        assert_eq!(format_amount(96 << 20), "96MiB");
        assert_eq!(format_amount(0), "0B");
    }
}
