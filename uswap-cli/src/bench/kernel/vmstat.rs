//! `/proc/vmstat` snapshots: the kernel engines' counters are the deltas around a run.

use std::collections::BTreeMap;

/// The counters reported for the kernel engines, named as uswap's own where both exist.
pub const KEYS: [&str; 10] = [
    "pswpin",
    "pswpout",
    "swap_ra",
    "swap_ra_hit",
    "pgfault",
    "pgmajfault",
    "pgsteal_kswapd",
    "pgsteal_direct",
    "workingset_refault_anon",
    "oom_kill",
];

#[derive(Debug, Clone, Default)]
pub struct Vmstat(BTreeMap<String, u64>);

impl Vmstat {
    /// Reads `/proc/vmstat` (an empty snapshot where it cannot be read: the deltas are then
    /// zero, which the report shows).
    pub fn read() -> Vmstat {
        Vmstat::parse(&std::fs::read_to_string("/proc/vmstat").unwrap_or_default())
    }

    pub fn parse(text: &str) -> Vmstat {
        Vmstat(
            text.lines()
                .filter_map(|l| {
                    let (k, v) = l.split_once(' ')?;
                    Some((k.to_string(), v.trim().parse().ok()?))
                })
                .collect(),
        )
    }

    /// `self - before` for [`KEYS`] present in both, as a JSON object.
    pub fn delta(&self, before: &Vmstat) -> serde_json::Value {
        let mut m = serde_json::Map::new();
        for k in KEYS {
            if let (Some(a), Some(b)) = (self.0.get(k), before.0.get(k)) {
                m.insert(k.to_string(), a.saturating_sub(*b).into());
            }
        }
        serde_json::Value::Object(m)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn deltas_of_the_swap_counters() {
        let a = Vmstat::parse("pswpin 10\npswpout 20\nswap_ra 5\nswap_ra_hit 4\nnr_free_pages 99\n");
        let b = Vmstat::parse("pswpin 15\npswpout 120\nswap_ra 9\nswap_ra_hit 7\nnr_free_pages 1\n");
        let d = b.delta(&a);
        assert_eq!(d["pswpin"], 5);
        assert_eq!(d["pswpout"], 100);
        assert_eq!(d["swap_ra"], 4);
        assert_eq!(d["swap_ra_hit"], 3);
        assert!(d.get("nr_free_pages").is_none());
        assert!(d.get("pgfault").is_none(), "absent keys stay absent");
    }
}
