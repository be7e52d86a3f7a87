//! `--plot DIR`: two SVG charts a person can open in a browser, written by hand (a few
//! lines of SVG need no plotting library): the latency CDF of every engine (log scale), and
//! the throughput of every engine (access and fill, with the spread of the runs).

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use super::error::BenchError;
use super::results::EngineResult;
use super::workload::Side;

const COLORS: [&str; 8] = ["#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#17becf"];
const W: f64 = 760.0;
const H: f64 = 440.0;
const LEFT: f64 = 70.0;
const RIGHT: f64 = 200.0;
const TOP: f64 = 40.0;
const BOTTOM: f64 = 50.0;

fn esc(s: &str) -> String {
    s.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;").replace('"', "&quot;")
}

pub fn label(r: &EngineResult) -> String {
    match r.side {
        Side::All => r.engine.clone(),
        s => format!("{} ({})", r.engine, format!("{s:?}").to_lowercase()),
    }
}

/// One colour per engine (both sides of `combined` share it).
fn color_of(results: &[EngineResult], r: &EngineResult) -> &'static str {
    let mut engines: Vec<&str> = vec![];
    for x in results {
        if !engines.contains(&x.engine.as_str()) {
            engines.push(&x.engine);
        }
    }
    let i = engines.iter().position(|e| *e == r.engine).unwrap_or(0);
    COLORS[i % COLORS.len()]
}

fn header(title: &str) -> String {
    format!(
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{W}\" height=\"{H}\" viewBox=\"0 0 {W} {H}\" \
         font-family=\"sans-serif\" font-size=\"12\">\n<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n\
         <text x=\"{}\" y=\"22\" text-anchor=\"middle\" font-size=\"15\">{}</text>\n",
        W / 2.0,
        esc(title)
    )
}

/// Cumulative fraction of accesses at or below each bucket's upper end, in µs.
pub fn cdf_points(r: &EngineResult) -> Vec<(f64, f64)> {
    let total = r.latency_histogram.count().max(1) as f64;
    let mut seen = 0u64;
    r.latency_histogram
        .buckets()
        .map(|(lo, w, c)| {
            seen += c;
            ((lo + w) as f64 / 1000.0, seen as f64 / total)
        })
        .collect()
}

/// One line of the CDF chart.
struct Series {
    name: String,
    points: Vec<(f64, f64)>,
    color: &'static str,
    /// The random side of `combined`.
    dashed: bool,
}

/// The latency CDF chart.
pub fn latency_cdf(results: &[EngineResult], title: &str) -> String {
    let series: Vec<Series> = results
        .iter()
        .map(|r| Series {
            name: label(r),
            points: cdf_points(r),
            color: color_of(results, r),
            dashed: r.side == Side::Random,
        })
        .collect();
    let xs = series.iter().flat_map(|s| s.points.iter().map(|q| q.0));
    let (mut lo, mut hi) = (f64::MAX, 0f64);
    for x in xs {
        lo = lo.min(x);
        hi = hi.max(x);
    }
    if lo > hi {
        (lo, hi) = (0.1, 10.0);
    }
    let d0 = lo.max(1e-3).log10().floor();
    let d1 = hi.max(lo * 10.0).log10().ceil().max(d0 + 1.0);
    let pw = W - LEFT - RIGHT;
    let ph = H - TOP - BOTTOM;
    let x = |v: f64| LEFT + (v.max(1e-3).log10() - d0) / (d1 - d0) * pw;
    let y = |f: f64| TOP + (1.0 - f) * ph;
    let mut s = header(title);
    // Grid and axes.
    for d in (d0 as i32)..=(d1 as i32) {
        let v = 10f64.powi(d);
        let _ = writeln!(
            s,
            "<line x1=\"{0:.1}\" y1=\"{TOP}\" x2=\"{0:.1}\" y2=\"{1:.1}\" stroke=\"#ddd\"/>\
             <text x=\"{0:.1}\" y=\"{2:.1}\" text-anchor=\"middle\">{3}</text>",
            x(v),
            TOP + ph,
            TOP + ph + 16.0,
            if v >= 1.0 { format!("{v:.0}") } else { format!("{v}") }
        );
    }
    for q in [0.0, 0.25, 0.5, 0.75, 0.9, 1.0] {
        let pct = (q * 100.0_f64).round();
        let _ = writeln!(
            s,
            "<line x1=\"{LEFT}\" y1=\"{0:.1}\" x2=\"{1:.1}\" y2=\"{0:.1}\" stroke=\"#ddd\"/>\
             <text x=\"{2:.1}\" y=\"{3:.1}\" text-anchor=\"end\">{pct}%</text>",
            y(q),
            LEFT + pw,
            LEFT - 6.0,
            y(q) + 4.0,
        );
    }
    let _ = writeln!(
        s,
        "<rect x=\"{LEFT}\" y=\"{TOP}\" width=\"{pw}\" height=\"{ph}\" fill=\"none\" stroke=\"#333\"/>\n\
         <text x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"middle\">latency (µs, log scale; per access, per page on sequential sides)</text>\n\
         <text x=\"16\" y=\"{:.1}\" text-anchor=\"middle\" transform=\"rotate(-90 16 {:.1})\">accesses at or below</text>",
        LEFT + pw / 2.0,
        H - 12.0,
        TOP + ph / 2.0,
        TOP + ph / 2.0
    );
    for (i, Series { name, points: pts, color, dashed }) in series.iter().enumerate() {
        let dash = if *dashed { " stroke-dasharray=\"6 3\"" } else { "" };
        let mut path = String::new();
        let mut prev = 0.0;
        for (j, &(vx, f)) in pts.iter().enumerate() {
            // A step: the fraction rises at the bucket's end.
            if j == 0 {
                let _ = write!(path, "{:.1},{:.1} ", x(vx), y(0.0));
            } else {
                let _ = write!(path, "{:.1},{:.1} ", x(vx), y(prev));
            }
            let _ = write!(path, "{:.1},{:.1} ", x(vx), y(f));
            prev = f;
        }
        let _ = writeln!(
            s,
            "<polyline fill=\"none\" stroke=\"{color}\" stroke-width=\"2\"{dash} points=\"{}\"><title>{}</title></polyline>",
            path.trim_end(),
            esc(name)
        );
        let ly = TOP + 10.0 + i as f64 * 18.0;
        let lx = LEFT + pw + 14.0;
        let _ = writeln!(
            s,
            "<line x1=\"{lx}\" y1=\"{ly}\" x2=\"{:.1}\" y2=\"{ly}\" stroke=\"{color}\" stroke-width=\"3\"{dash}/>\
             <text x=\"{:.1}\" y=\"{:.1}\">{}</text>",
            lx + 20.0,
            lx + 26.0,
            ly + 4.0,
            esc(name)
        );
    }
    s.push_str("</svg>\n");
    s
}

/// Horizontal bars: `(label, value, min, max, color)`; min/max draw the spread of the runs.
fn bars(s: &mut String, top: f64, height: f64, title: &str, items: &[(String, f64, f64, f64, &str)]) {
    let pw = W - LEFT - RIGHT - 60.0;
    let left = LEFT + 120.0;
    let max = items.iter().map(|i| i.3.max(i.1)).fold(0.0, f64::max).max(1e-9);
    let _ = writeln!(s, "<text x=\"{LEFT}\" y=\"{:.1}\" font-weight=\"bold\">{}</text>", top + 12.0, esc(title));
    let row = (height - 20.0) / items.len().max(1) as f64;
    let bh = (row * 0.7).min(22.0);
    for (i, (name, v, lo, hi, color)) in items.iter().enumerate() {
        let yy = top + 20.0 + i as f64 * row;
        let w = v / max * pw;
        let _ = writeln!(
            s,
            "<text x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"end\">{}</text>\
             <rect x=\"{left:.1}\" y=\"{yy:.1}\" width=\"{w:.1}\" height=\"{bh:.1}\" fill=\"{color}\"/>\
             <text x=\"{:.1}\" y=\"{:.1}\">{}</text>",
            left - 6.0,
            yy + bh / 2.0 + 4.0,
            esc(name),
            left + (hi / max * pw).max(w) + 6.0,
            yy + bh / 2.0 + 4.0,
            super::table::thousands(*v)
        );
        if hi > lo {
            let (x0, x1, ym) = (left + lo / max * pw, left + hi / max * pw, yy + bh / 2.0);
            let _ = writeln!(
                s,
                "<line x1=\"{x0:.1}\" y1=\"{ym:.1}\" x2=\"{x1:.1}\" y2=\"{ym:.1}\" stroke=\"#000\"/>\
                 <line x1=\"{x0:.1}\" y1=\"{:.1}\" x2=\"{x0:.1}\" y2=\"{:.1}\" stroke=\"#000\"/>\
                 <line x1=\"{x1:.1}\" y1=\"{:.1}\" x2=\"{x1:.1}\" y2=\"{:.1}\" stroke=\"#000\"/>",
                ym - 4.0,
                ym + 4.0,
                ym - 4.0,
                ym + 4.0
            );
        }
    }
}

fn spread(v: &[f64], mid: f64) -> (f64, f64) {
    let lo = v.iter().copied().fold(f64::MAX, f64::min);
    let hi = v.iter().copied().fold(0.0, f64::max);
    if v.is_empty() {
        (mid, mid)
    } else {
        (lo, hi)
    }
}

/// The throughput chart: accesses/s (per side) above, fill MB/s (per engine) below.
pub fn throughput(results: &[EngineResult], title: &str) -> String {
    let access: Vec<_> = results
        .iter()
        .map(|r| {
            let (lo, hi) = spread(&r.runs_accesses_per_sec, r.accesses_per_sec);
            (label(r), r.accesses_per_sec, lo, hi, color_of(results, r))
        })
        .collect();
    let mut fill = vec![];
    for r in results.iter().filter(|r| r.side != Side::Random) {
        let (lo, hi) = spread(&r.runs_fill_mb_per_sec, r.fill_mb_per_sec);
        fill.push((r.engine.clone(), r.fill_mb_per_sec, lo, hi, color_of(results, r)));
    }
    let mut s = header(title);
    let half = (H - TOP - 20.0) / 2.0;
    let runs = results.iter().map(|r| r.runs).max().unwrap_or(1);
    let note = if runs > 1 { format!(" (median of {runs} runs, whiskers: min to max)") } else { String::new() };
    bars(&mut s, TOP, half, &format!("accesses per second{note}"), &access);
    bars(&mut s, TOP + half + 10.0, half, "fill (first touch, swap-out) MB/s", &fill);
    s.push_str("</svg>\n");
    s
}

/// Writes `{prefix}latency-cdf.svg` and `{prefix}throughput.svg` into `dir`.
pub fn write(dir: &Path, prefix: &str, results: &[EngineResult], title: &str) -> Result<Vec<PathBuf>, BenchError> {
    std::fs::create_dir_all(dir).map_err(|source| BenchError::Write { path: dir.to_path_buf(), source })?;
    let mut out = vec![];
    for (name, svg) in [
        ("latency-cdf.svg", latency_cdf(results, &format!("{title}: latency CDF"))),
        ("throughput.svg", throughput(results, &format!("{title}: throughput"))),
    ] {
        let path = dir.join(format!("{prefix}{name}"));
        std::fs::write(&path, svg).map_err(|source| BenchError::Write { path: path.clone(), source })?;
        out.push(path);
    }
    Ok(out)
}
