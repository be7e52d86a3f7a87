//! From runs to results: one [`EngineResult`] per engine (and per side, for `combined`),
//! the JSON object `--json` writes. With `--runs N`, throughput and latency percentiles are
//! medians over the runs, the histogram holds every run's accesses, counters come from the
//! median run, and verification errors are the sum over all runs: a wrong byte is reported,
//! never averaged away.

use serde::Serialize;
use uswap::Histogram;

use super::args::FaultModeArg;
use super::engine::{Engine, EngineKind};
use super::workload::{LatencyUnit, Side, SideReport, Workload, WorkloadSpec, MAX_ERROR_SAMPLES};

/// One run of one engine (all its processes merged).
#[derive(Debug, Clone)]
pub struct EngineRun {
    pub fill_seconds: f64,
    pub fill_bytes: u64,
    pub sides: Vec<SideReport>,
    pub stats: serde_json::Value,
    /// The swap device as the engine names it.
    pub device: Option<String>,
    /// Attempts of this run the kernel's OOM killer ended before one completed.
    pub oom_kills: u64,
}

impl EngineRun {
    /// Merges the reports of the processes of one run: counts add up, times are the
    /// slowest process's.
    pub fn merge(reports: Vec<super::worker::WorkerReport>, device: Option<String>) -> EngineRun {
        let mut run = EngineRun {
            fill_seconds: 0.0,
            fill_bytes: 0,
            sides: vec![],
            stats: serde_json::Value::Null,
            device,
            oom_kills: 0,
        };
        let mut stats = vec![];
        for r in reports {
            run.fill_seconds = run.fill_seconds.max(r.fill_seconds);
            run.fill_bytes += r.fill_bytes;
            if run.sides.is_empty() {
                run.sides = r.sides;
            } else {
                for (a, b) in run.sides.iter_mut().zip(r.sides) {
                    a.accesses += b.accesses;
                    a.bytes += b.bytes;
                    a.writes += b.writes;
                    a.seconds = a.seconds.max(b.seconds);
                    a.latency.merge(&b.latency);
                    a.verify_errors += b.verify_errors;
                    let room = MAX_ERROR_SAMPLES.saturating_sub(a.errors.len());
                    a.errors.extend(b.errors.into_iter().take(room));
                }
            }
            stats.push(r.stats);
        }
        run.stats = match stats.len() {
            0 => serde_json::Value::Null,
            1 => stats.remove(0),
            _ => sum_stats(stats),
        };
        run
    }
}

/// Several processes' uswap stats: top-level counters added up, each process's full stats
/// under `per_process`.
fn sum_stats(stats: Vec<serde_json::Value>) -> serde_json::Value {
    if stats.iter().all(serde_json::Value::is_null) {
        return serde_json::Value::Null;
    }
    let mut sum = serde_json::Map::new();
    for s in &stats {
        if let Some(o) = s.as_object() {
            for (k, v) in o {
                if let Some(n) = v.as_u64() {
                    let prev = sum.get(k).and_then(serde_json::Value::as_u64).unwrap_or(0);
                    sum.insert(k.clone(), (prev + n).into());
                }
            }
        }
    }
    sum.insert("per_process".into(), serde_json::Value::Array(stats));
    serde_json::Value::Object(sum)
}

#[derive(Debug, Clone, Serialize)]
pub struct LatencyUs {
    pub p50: f64,
    pub p90: f64,
    pub p99: f64,
    pub p999: f64,
    pub mean: f64,
    pub max: f64,
}

/// What `--json` writes for one engine (and side).
#[derive(Debug, Clone, Serialize)]
pub struct EngineResult {
    /// The name given in `--engines`.
    pub engine: String,
    pub workload: Workload,
    pub pattern: String,
    pub side: Side,
    pub fault_mode: Option<FaultModeArg>,
    pub device: Option<String>,
    pub wss_bytes: u64,
    /// None for `ram` (no limit).
    pub limit_bytes: Option<u64>,
    pub threads: u64,
    pub procs: u64,
    pub read_pct: u32,
    pub runs: usize,
    pub accesses: u64,
    pub seconds: f64,
    pub accesses_per_sec: f64,
    pub mb_per_sec: f64,
    pub fill_seconds: f64,
    pub fill_mb_per_sec: f64,
    pub latency_unit: LatencyUnit,
    pub latency_us: LatencyUs,
    /// swap_ra_hit / swap_ra, in percent; None when nothing was read ahead.
    pub ra_hit_pct: Option<f64>,
    /// Pages swapped in and out (pswpin, pswpout) in MB/s over the fill and access phases
    /// of the median run (the seeds' swap-in/swap-out throughput).
    pub swapin_mb_per_sec: Option<f64>,
    pub swapout_mb_per_sec: Option<f64>,
    pub verify_errors: u64,
    pub verify_error_samples: Vec<String>,
    /// Attempts the kernel's OOM killer ended (and that were run again), over all runs.
    pub oom_kills: u64,
    pub runs_accesses_per_sec: Vec<f64>,
    pub runs_fill_mb_per_sec: Vec<f64>,
    /// pmbench's log2 histogram with 16 sub-buckets, all runs together.
    #[serde(with = "crate::bench::histogram::log2")]
    pub latency_histogram: Histogram,
    /// uswap's counters, or the kernel's /proc/vmstat deltas (pswpin, pswpout, swap_ra,
    /// swap_ra_hit, ...), of the median run.
    pub stats: serde_json::Value,
}

/// What the summary needs to know about the invocation.
pub struct Context<'a> {
    pub spec: &'a WorkloadSpec,
    pub wss_bytes: u64,
    pub limit_bytes: u64,
    pub procs: u64,
}

pub fn median(v: &[f64]) -> f64 {
    let mut s = v.to_vec();
    s.sort_by(f64::total_cmp);
    match s.len() {
        0 => 0.0,
        n if n % 2 == 1 => s[n / 2],
        n => (s[n / 2 - 1] + s[n / 2]) / 2.0,
    }
}

/// Index of the run whose value is the median (the lower middle one for an even count).
pub fn median_index(v: &[f64]) -> usize {
    let mut idx: Vec<usize> = (0..v.len()).collect();
    idx.sort_by(|&a, &b| v[a].total_cmp(&v[b]));
    idx[(v.len().max(1) - 1) / 2]
}

fn rate(n: u64, seconds: f64) -> f64 {
    n as f64 / seconds.max(1e-9)
}

/// Summarises the runs of one engine into one result per side.
pub fn summarize(engine: &Engine, runs: &[EngineRun], ctx: &Context) -> Vec<EngineResult> {
    let nr_sides = runs.first().map_or(0, |r| r.sides.len());
    let fill: Vec<f64> = runs.iter().map(|r| r.fill_bytes as f64 / 1e6 / r.fill_seconds.max(1e-9)).collect();
    (0..nr_sides)
        .map(|s| {
            let sides: Vec<&SideReport> = runs.iter().map(|r| &r.sides[s]).collect();
            let aps: Vec<f64> = sides.iter().map(|x| rate(x.accesses, x.seconds)).collect();
            let mbs: Vec<f64> = sides.iter().map(|x| x.bytes as f64 / 1e6 / x.seconds.max(1e-9)).collect();
            let m = median_index(&aps);
            let mid = sides[m];
            let summaries: Vec<_> = sides.iter().map(|x| x.latency.summary_us()).collect();
            let pct = |f: fn(&uswap::LatencySummary) -> f64| median(&summaries.iter().map(f).collect::<Vec<_>>());
            let mut hist = Histogram::new();
            let mut errors = vec![];
            for x in &sides {
                hist.merge(&x.latency);
                let room = MAX_ERROR_SAMPLES.saturating_sub(errors.len());
                errors.extend(x.errors.iter().take(room).cloned());
            }
            let stats = runs[m].stats.clone();
            let ra = stats.get("swap_ra").and_then(serde_json::Value::as_u64).unwrap_or(0);
            let ra_hit = stats.get("swap_ra_hit").and_then(serde_json::Value::as_u64).unwrap_or(0);
            let window = runs[m].fill_seconds + mid.seconds;
            let swap_rate = |key: &str| {
                stats
                    .get(key)
                    .and_then(serde_json::Value::as_u64)
                    .map(|p| (p * uswap::PAGE_SIZE as u64) as f64 / 1e6 / window.max(1e-9))
            };
            let (fault_mode, device) = match &engine.kind {
                EngineKind::Uswap { mode, .. } => (Some(*mode), runs[m].device.clone()),
                _ => (None, runs[m].device.clone()),
            };
            EngineResult {
                engine: engine.name.clone(),
                workload: ctx.spec.workload,
                pattern: mid.pattern.name(ctx.spec.workload).to_string(),
                side: mid.side,
                fault_mode,
                device,
                wss_bytes: ctx.wss_bytes,
                limit_bytes: engine.is_limited().then_some(ctx.limit_bytes),
                threads: match mid.side {
                    Side::Seq => ctx.spec.seq_streams as u64,
                    _ => ctx.spec.threads as u64,
                },
                procs: ctx.procs,
                read_pct: if mid.side == Side::Seq { 0 } else { ctx.spec.read_pct },
                runs: runs.len(),
                accesses: mid.accesses,
                seconds: mid.seconds,
                accesses_per_sec: median(&aps),
                mb_per_sec: median(&mbs),
                fill_seconds: runs[m].fill_seconds,
                fill_mb_per_sec: median(&fill),
                latency_unit: mid.latency_unit,
                latency_us: LatencyUs {
                    p50: pct(|l| l.p50),
                    p90: pct(|l| l.p90),
                    p99: pct(|l| l.p99),
                    p999: pct(|l| l.p999),
                    mean: pct(|l| l.mean),
                    max: pct(|l| l.max),
                },
                ra_hit_pct: (ra > 0).then(|| 100.0 * ra_hit as f64 / ra as f64),
                swapin_mb_per_sec: swap_rate("pswpin"),
                swapout_mb_per_sec: swap_rate("pswpout"),
                verify_errors: sides.iter().map(|x| x.verify_errors).sum(),
                verify_error_samples: errors,
                oom_kills: runs.iter().map(|r| r.oom_kills).sum(),
                runs_accesses_per_sec: aps,
                runs_fill_mb_per_sec: fill.clone(),
                latency_histogram: hist,
                stats,
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bench::workload::{Pattern, Verify};

    fn side(accesses: u64, seconds: f64, errors: u64, lat_ns: u64) -> SideReport {
        let mut latency = Histogram::new();
        latency.record_n(lat_ns, accesses);
        SideReport {
            side: Side::All,
            pattern: Pattern::Random,
            latency_unit: LatencyUnit::Access,
            accesses,
            bytes: accesses * 8,
            writes: 0,
            seconds,
            latency,
            verify_errors: errors,
            errors: (0..errors).map(|i| format!("e{i}")).collect(),
        }
    }

    fn run(accesses: u64, seconds: f64, errors: u64, lat_ns: u64, pswpin: u64) -> EngineRun {
        EngineRun {
            fill_seconds: 1.0,
            fill_bytes: 100_000_000,
            sides: vec![side(accesses, seconds, errors, lat_ns)],
            stats: serde_json::json!({ "pswpin": pswpin, "swap_ra": 4, "swap_ra_hit": 3 }),
            device: None,
            oom_kills: 0,
        }
    }

    #[test]
    fn medians_over_runs_and_errors_summed() {
        let engine = Engine::parse("kernel-zram").unwrap();
        let spec = WorkloadSpec {
            workload: Workload::Pmbench,
            pattern: Pattern::Random,
            accesses: 1000,
            read_pct: 80,
            threads: 1,
            seq_streams: 1,
            verify: Verify::Index,
            seed: 1,
            zipf_skew: 1.0,
            normal_sd: 0.1,
        };
        let ctx = Context { spec: &spec, wss_bytes: 1 << 30, limit_bytes: 1 << 28, procs: 1 };
        let runs = [run(1000, 1.0, 0, 1000, 11), run(1000, 0.5, 1, 3000, 22), run(1000, 2.0, 2, 2000, 33)];
        let r = summarize(&engine, &runs, &ctx);
        assert_eq!(r.len(), 1);
        let r = &r[0];
        assert_eq!(r.accesses_per_sec, 1000.0);
        assert_eq!(r.runs_accesses_per_sec, [1000.0, 2000.0, 500.0]);
        assert_eq!(r.stats["pswpin"], 11, "counters of the median run");
        assert_eq!(r.verify_errors, 3, "errors of every run add up");
        assert_eq!(r.verify_error_samples.len(), 3);
        assert_eq!(r.latency_histogram.count(), 3000);
        // Median of the runs' p50 (1, 3, 2 µs, each within the histogram's 6.25 %).
        assert!((r.latency_us.p50 - 2.0).abs() < 0.13, "{}", r.latency_us.p50);
        assert_eq!(r.ra_hit_pct, Some(75.0));
        // 11 pages in over 1 s of fill and 1 s of access.
        assert_eq!(r.swapin_mb_per_sec, Some(11.0 * 4096.0 / 1e6 / 2.0));
        assert_eq!(r.swapout_mb_per_sec, None, "no pswpout counter given");
        assert_eq!(r.pattern, "uniform");
        assert_eq!(r.limit_bytes, Some(1 << 28));
        assert_eq!(r.fill_mb_per_sec, 100.0);
    }

    #[test]
    fn processes_merge() {
        let a = super::super::worker::WorkerReport {
            fill_seconds: 2.0,
            fill_bytes: 10,
            sides: vec![side(100, 1.0, 1, 500)],
            stats: serde_json::json!({"pswpin": 5, "fault_latency_us": {"p50": 1.0}}),
        };
        let b = super::super::worker::WorkerReport {
            fill_seconds: 3.0,
            fill_bytes: 20,
            sides: vec![side(200, 4.0, 0, 500)],
            stats: serde_json::json!({"pswpin": 7, "fault_latency_us": {"p50": 2.0}}),
        };
        let m = EngineRun::merge(vec![a, b], None);
        assert_eq!((m.fill_seconds, m.fill_bytes), (3.0, 30));
        assert_eq!((m.sides[0].accesses, m.sides[0].seconds, m.sides[0].verify_errors), (300, 4.0, 1));
        assert_eq!(m.stats["pswpin"], 12);
        assert_eq!(m.stats["per_process"].as_array().unwrap().len(), 2);
    }
}
