//! The results table: one row per engine (and side), with ratio columns against a baseline
//! engine (`kernel-zram` unless `--baseline` says otherwise), as text for the terminal and
//! as Markdown for BENCHMARKS.md.

use super::results::EngineResult;
use super::workload::{LatencyUnit, Side};

pub struct Table {
    pub headers: Vec<String>,
    pub rows: Vec<Vec<String>>,
    /// Columns holding numbers (right-aligned).
    pub numeric: Vec<bool>,
}

/// `1234567.8` → `1,234,568`.
pub fn thousands(v: f64) -> String {
    let n = v.round() as i128;
    let s = n.unsigned_abs().to_string();
    let mut out = String::new();
    for (i, c) in s.chars().enumerate() {
        if i > 0 && (s.len() - i) % 3 == 0 {
            out.push(',');
        }
        out.push(c);
    }
    if n < 0 {
        out.insert(0, '-');
    }
    out
}

fn micros(v: f64) -> String {
    if v >= 100.0 {
        format!("{v:.0}")
    } else if v >= 10.0 {
        format!("{v:.1}")
    } else {
        format!("{v:.2}")
    }
}

fn ratio(v: f64, base: Option<f64>) -> String {
    match base {
        Some(b) if b > 0.0 => format!("{:.2}", v / b),
        _ => "-".to_string(),
    }
}

fn stat(r: &EngineResult, key: &str) -> String {
    r.stats.get(key).and_then(serde_json::Value::as_u64).map_or("-".into(), |v| thousands(v as f64))
}

/// Builds the table. `baseline`: the engine the ratio columns divide by.
pub fn build(results: &[EngineResult], baseline: Option<&str>) -> Table {
    let sides = results.iter().any(|r| r.side != Side::All);
    let mb = results.iter().any(|r| r.latency_unit == LatencyUnit::Page);
    let runs = results.iter().map(|r| r.runs).max().unwrap_or(1);
    let base_of = |r: &EngineResult| -> Option<&EngineResult> {
        let b = baseline?;
        results.iter().find(|x| x.engine == b && x.side == r.side)
    };
    let bname = match baseline {
        Some("kernel-zram") => "zram",
        Some(b) => b,
        None => "base",
    };
    let mut cols: Vec<(String, bool)> = vec![("engine".into(), false)];
    if sides {
        cols.push(("side".into(), false));
    }
    let med = if runs > 1 { format!(" (median of {runs})") } else { String::new() };
    cols.push((format!("acc/s{med}"), true));
    if baseline.is_some() {
        cols.push((format!("×{bname}"), true));
    }
    if mb {
        cols.push(("MB/s".into(), true));
    }
    cols.push(("fill MB/s".into(), true));
    if baseline.is_some() {
        cols.push((format!("fill ×{bname}"), true));
    }
    for c in ["p50 µs", "p99 µs", "pswpin", "pswpout", "majflt", "ra hit", "errors"] {
        cols.push((c.into(), true));
    }
    let mut rows = vec![];
    for r in results {
        let b = base_of(r);
        let mut row = vec![r.engine.clone()];
        if sides {
            row.push(format!("{:?}", r.side).to_lowercase());
        }
        row.push(thousands(r.accesses_per_sec));
        if baseline.is_some() {
            row.push(ratio(r.accesses_per_sec, b.map(|b| b.accesses_per_sec)));
        }
        if mb {
            // Bytes per second mean something for streams, not for scattered word accesses.
            row.push(if r.latency_unit == LatencyUnit::Page { format!("{:.0}", r.mb_per_sec) } else { "-".into() });
        }
        row.push(format!("{:.0}", r.fill_mb_per_sec));
        if baseline.is_some() {
            row.push(ratio(r.fill_mb_per_sec, b.map(|b| b.fill_mb_per_sec)));
        }
        row.push(micros(r.latency_us.p50));
        row.push(micros(r.latency_us.p99));
        row.push(stat(r, "pswpin"));
        row.push(stat(r, "pswpout"));
        // Faults that waited for a device read (uswap) or for swap I/O (the kernel), over
        // the whole run: readahead's effect in one number.
        row.push(stat(r, "pgmajfault"));
        row.push(r.ra_hit_pct.map_or("-".into(), |p| format!("{p:.0} %")));
        row.push(r.verify_errors.to_string());
        rows.push(row);
    }
    let (headers, numeric) = cols.into_iter().unzip();
    Table { headers, rows, numeric }
}

impl Table {
    pub fn to_text(&self) -> String {
        let widths: Vec<usize> = (0..self.headers.len())
            .map(|c| {
                self.rows
                    .iter()
                    .map(|r| r[c].chars().count())
                    .chain([self.headers[c].chars().count()])
                    .max()
                    .unwrap_or(0)
            })
            .collect();
        let line = |cells: &[String]| -> String {
            let parts: Vec<String> = cells
                .iter()
                .enumerate()
                .map(|(c, s)| {
                    let pad = widths[c] - s.chars().count();
                    if self.numeric[c] {
                        format!("{}{s}", " ".repeat(pad))
                    } else {
                        format!("{s}{}", " ".repeat(pad))
                    }
                })
                .collect();
            parts.join("  ").trim_end().to_string()
        };
        let mut out = line(&self.headers) + "\n";
        for r in &self.rows {
            out += &line(r);
            out.push('\n');
        }
        out
    }

    pub fn to_markdown(&self) -> String {
        let mut out = format!("| {} |\n", self.headers.join(" | "));
        let seps: Vec<&str> = self.numeric.iter().map(|&n| if n { "---:" } else { "---" }).collect();
        out += &format!("|{}|\n", seps.join("|"));
        for r in &self.rows {
            out += &format!("| {} |\n", r.join(" | "));
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn thousands_separators() {
        assert_eq!(thousands(113040.4), "113,040");
        assert_eq!(thousands(999.0), "999");
        assert_eq!(thousands(1_000.0), "1,000");
        assert_eq!(thousands(-1_234_567.0), "-1,234,567");
    }

    #[test]
    fn markdown_has_one_row_per_result_and_aligned_numbers() {
        let t = Table {
            headers: vec!["engine".into(), "acc/s".into()],
            rows: vec![vec!["ram".into(), "1,000".into()], vec!["kernel-zram".into(), "10".into()]],
            numeric: vec![false, true],
        };
        assert_eq!(t.to_markdown(), "| engine | acc/s |\n|---|---:|\n| ram | 1,000 |\n| kernel-zram | 10 |\n");
        assert_eq!(t.to_text(), "engine       acc/s\nram          1,000\nkernel-zram     10\n");
    }
}
