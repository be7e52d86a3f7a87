//! Latency histograms as pmbench reports them: log2 buckets (`[2^n, 2^(n+1))` ns), each split
//! into 16 linear sub-buckets, plus one bucket for everything below 16 ns. This is exactly
//! the layout of [`uswap::Histogram`]; this module gives it a JSON form (what `--json` writes
//! and what a workload process sends back to `uswap bench`) and the pmbench-style text.

use serde::{Deserialize, Deserializer, Serialize, Serializer};
use uswap::Histogram;

pub const SUB_BUCKETS: usize = 16;

/// One log2 bucket: `lo_ns..hi_ns`, its count and its 16 sub-bucket counts (each
/// `(hi_ns - lo_ns) / 16` wide).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Log2Bucket {
    pub lo_ns: u64,
    pub hi_ns: u64,
    pub count: u64,
    pub sub_buckets: [u64; SUB_BUCKETS],
}

/// Groups a histogram's buckets into log2 buckets (only the non-empty ones).
pub fn to_log2(h: &Histogram) -> Vec<Log2Bucket> {
    let mut out: Vec<Log2Bucket> = vec![];
    for (lo, _width, count) in h.buckets() {
        let (glo, ghi) = if lo < SUB_BUCKETS as u64 {
            (0, SUB_BUCKETS as u64)
        } else {
            let e = 63 - lo.leading_zeros();
            (1u64 << e, 2u64 << e)
        };
        let sub_width = (ghi - glo) / SUB_BUCKETS as u64;
        // The last bucket of the engine's histogram collects everything above its range.
        let sub = (((lo - glo) / sub_width.max(1)) as usize).min(SUB_BUCKETS - 1);
        match out.last_mut() {
            Some(b) if b.lo_ns == glo => {
                b.count += count;
                b.sub_buckets[sub] += count;
            }
            _ => {
                let mut sub_buckets = [0; SUB_BUCKETS];
                sub_buckets[sub] = count;
                out.push(Log2Bucket { lo_ns: glo, hi_ns: ghi, count, sub_buckets });
            }
        }
    }
    out
}

/// Rebuilds the histogram (bucket for bucket) from its log2 form.
pub fn from_log2(buckets: &[Log2Bucket]) -> Histogram {
    let mut h = Histogram::new();
    for b in buckets {
        let w = (b.hi_ns - b.lo_ns) / SUB_BUCKETS as u64;
        for (j, &c) in b.sub_buckets.iter().enumerate() {
            if c > 0 {
                h.record_n(b.lo_ns + j as u64 * w, c);
            }
        }
    }
    h
}

/// `#[serde(with = "crate::bench::histogram::log2")]` for `Histogram` fields.
pub mod log2 {
    use super::*;

    pub fn serialize<S: Serializer>(h: &Histogram, s: S) -> Result<S::Ok, S::Error> {
        to_log2(h).serialize(s)
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Histogram, D::Error> {
        Vec::<Log2Bucket>::deserialize(d).map(|b| from_log2(&b))
    }
}

/// pmbench-style text: one line per log2 bucket with its sub-bucket counts.
pub fn format_pmbench(h: &Histogram) -> String {
    let mut s = String::new();
    for b in to_log2(h) {
        let range = if b.lo_ns == 0 {
            "2^(0,4) ns".to_string()
        } else {
            let e = 63 - b.lo_ns.leading_zeros();
            format!("2^({e},{}) ns", e + 1)
        };
        let subs: Vec<String> = b.sub_buckets.iter().map(u64::to_string).collect();
        s.push_str(&format!("  {range:>14}: {:>10}   [{}]\n", b.count, subs.join(" ")));
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn log2_form_round_trips_and_groups_by_power_of_two() {
        let mut h = Histogram::new();
        for v in [0u64, 5, 15, 16, 31, 32, 1000, 1023, 1024, 5_000_000] {
            h.record(v);
        }
        let b = to_log2(&h);
        let los: Vec<u64> = b.iter().map(|b| b.lo_ns).collect();
        assert_eq!(los, [0, 16, 32, 512, 1024, 4_194_304]);
        assert_eq!(b[0].count, 3);
        assert_eq!(b[0].sub_buckets[15], 1);
        assert_eq!(b[1].sub_buckets, {
            let mut s = [0; 16];
            s[0] = 1;
            s[15] = 1;
            s
        });
        assert_eq!(b[3].count, 2, "1000 and 1023 share the 512..1024 bucket");
        assert_eq!(b.iter().map(|b| b.count).sum::<u64>(), 10);
        assert_eq!(from_log2(&b), h);
        let text = format_pmbench(&h);
        assert!(text.contains("2^(10,11) ns:          1"), "{text}");
        assert_eq!(text.lines().count(), 6);
    }
}
