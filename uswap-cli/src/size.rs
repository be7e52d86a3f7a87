//! Byte sizes on the command line: `4096`, `64KiB`, `256MiB`, `1GiB`, `1.5GiB`.
//!
//! `KiB`, `MiB`, `GiB`, `TiB` and the one-letter forms `K`, `M`, `G`, `T` are powers of 1024;
//! `KB`, `MB`, `GB`, `TB` are powers of 1000; no unit (or `B`) means bytes.

use std::fmt;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SizeError(String);

impl fmt::Display for SizeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for SizeError {}

pub fn parse_size(s: &str) -> Result<u64, SizeError> {
    let t = s.trim();
    let split = t.find(|c: char| !(c.is_ascii_digit() || c == '.')).unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let mult: u64 = match unit.trim() {
        "" | "B" => 1,
        "K" | "KiB" | "k" => 1 << 10,
        "M" | "MiB" => 1 << 20,
        "G" | "GiB" => 1 << 30,
        "T" | "TiB" => 1 << 40,
        "KB" | "kB" => 1_000,
        "MB" => 1_000_000,
        "GB" => 1_000_000_000,
        "TB" => 1_000_000_000_000,
        u => {
            return Err(SizeError(format!(
                "cannot parse size {s:?}: unknown unit {u:?} (use B, KiB, MiB, GiB, TiB, e.g. 256MiB)"
            )))
        }
    };
    if num.is_empty() {
        return Err(SizeError(format!("cannot parse size {s:?}: expected a number, e.g. 256MiB")));
    }
    let v: f64 = num.parse().map_err(|_| SizeError(format!("cannot parse size {s:?}: {num:?} is not a number")))?;
    let bytes = v * mult as f64;
    if !bytes.is_finite() || bytes >= u64::MAX as f64 {
        return Err(SizeError(format!("size {s:?} is too large")));
    }
    Ok(bytes.round() as u64)
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
        assert_eq!(parse_size("2MB"), Ok(2_000_000));
        assert_eq!(parse_size(" 64KiB "), Ok(64 << 10));
    }

    #[test]
    fn rejects_garbage_with_a_hint() {
        for bad in ["", "MiB", "12XB", "1..2GiB", "-1GiB"] {
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
}
