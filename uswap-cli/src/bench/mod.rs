//! `uswap bench`: one workload over a managed region, with a readable summary and a JSON
//! record.

pub mod workload;

use std::path::PathBuf;

use clap::Args;
use serde::Serialize;

use crate::size::{format_size, parse_size};
use workload::{AccessConfig, Pattern, Verify};

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum FaultModeArg {
    Thread,
    Signal,
}

impl From<FaultModeArg> for uswap::FaultMode {
    fn from(m: FaultModeArg) -> Self {
        match m {
            FaultModeArg::Thread => uswap::FaultMode::Thread,
            FaultModeArg::Signal => uswap::FaultMode::Signal,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum BackgroundArg {
    Idle,
    Always,
}

#[derive(Debug, Clone, Args)]
pub struct BenchArgs {
    /// Access pattern after the fill.
    #[arg(long, value_enum, default_value_t = Pattern::Random)]
    pub pattern: Pattern,
    /// Working-set size (e.g. 256MiB, 1GiB).
    #[arg(long, value_parser = parse_size, default_value = "256MiB")]
    pub wss: u64,
    /// Resident limit of the pager.
    #[arg(long, value_parser = parse_size, default_value = "64MiB")]
    pub limit: u64,
    /// Number of timed accesses after the fill (split over the threads).
    #[arg(long, default_value_t = 200_000)]
    pub accesses: u64,
    /// Percentage of accesses that only read (the rest increment a counter word).
    #[arg(long, default_value_t = 80, value_parser = clap::value_parser!(u32).range(0..=100))]
    pub read_pct: u32,
    /// Application threads.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u64).range(1..=1024))]
    pub threads: u64,
    /// How faults reach the engine.
    #[arg(long, value_enum, default_value_t = FaultModeArg::Thread)]
    pub fault_mode: FaultModeArg,
    /// Thread mode: fault-handler threads (default: one per CPU).
    #[arg(long)]
    pub handler_threads: Option<usize>,
    /// Thread mode: leave handler threads unpinned instead of one per CPU.
    #[arg(long)]
    pub unpinned_handlers: bool,
    /// When the background reclaimer works: `idle` (only while no faults arrive; the default)
    /// or `always` (classic kswapd, from the high to the low watermark).
    #[arg(long, value_enum, default_value_t = BackgroundArg::Idle)]
    pub background_reclaim: BackgroundArg,
    /// Swap devices, highest priority first: `ram` or `ram:SIZE`, comma-separated.
    #[arg(long, default_value = "ram")]
    pub device: String,
    /// Capacity of a device given without a size (default: the working set plus 32MiB).
    #[arg(long, value_parser = parse_size)]
    pub device_size: Option<u64>,
    /// What each access checks (`full` also checks every page once at the end).
    #[arg(long, value_enum, default_value_t = Verify::Index)]
    pub verify: Verify,
    /// Seed of the access stream.
    #[arg(long, default_value_t = 88172645463325252)]
    pub seed: u64,
    /// Write the result as JSON to this file.
    #[arg(long)]
    pub json: Option<PathBuf>,
}

#[derive(Debug, Serialize)]
pub struct LatencyUs {
    pub p50: f64,
    pub p90: f64,
    pub p99: f64,
    pub p999: f64,
    pub mean: f64,
    pub max: f64,
}

#[derive(Debug, Serialize)]
pub struct BenchResult {
    pub engine: String,
    pub workload: String,
    pub pattern: Pattern,
    pub fault_mode: FaultModeArg,
    pub device: String,
    pub wss_bytes: u64,
    pub limit_bytes: u64,
    pub threads: u64,
    pub read_pct: u32,
    pub accesses: u64,
    pub seconds: f64,
    pub accesses_per_sec: f64,
    pub fill_seconds: f64,
    pub fill_mb_per_sec: f64,
    pub latency_us: LatencyUs,
    pub verify_errors: u64,
    pub verify_error_samples: Vec<String>,
    pub stats: uswap::Stats,
}

#[derive(Debug, thiserror::Error)]
pub enum BenchError {
    #[error(
        "--limit {limit} is larger than --wss {wss}: nothing would be swapped; give a limit below the working set"
    )]
    LimitAboveWss { limit: String, wss: String },
    #[error("--wss must be at least one page ({page} bytes)")]
    WssTooSmall { page: usize },
    #[error(transparent)]
    Engine(#[from] uswap::Error),
    #[error("writing {path}: {source}")]
    Json { path: PathBuf, source: std::io::Error },
}

pub fn run(args: &BenchArgs) -> Result<BenchResult, BenchError> {
    if args.wss < uswap::PAGE_SIZE as u64 {
        return Err(BenchError::WssTooSmall { page: uswap::PAGE_SIZE });
    }
    if args.limit > args.wss {
        return Err(BenchError::LimitAboveWss { limit: format_size(args.limit), wss: format_size(args.wss) });
    }
    let device_bytes = args.device_size.unwrap_or(args.wss + (32 << 20));
    let mut builder = uswap::Pager::builder()
        .resident_limit(args.limit)
        .fault_mode(args.fault_mode.into())
        .pin_handlers(!args.unpinned_handlers)
        .background_reclaim(match args.background_reclaim {
            BackgroundArg::Idle => uswap::BackgroundReclaim::WhenIdle,
            BackgroundArg::Always => uswap::BackgroundReclaim::Always,
        });
    if let Some(n) = args.handler_threads {
        builder = builder.handler_threads(n);
    }
    for d in uswap::DeviceConfig::parse_list(&args.device, device_bytes)? {
        builder = builder.device(d);
    }
    let pager = builder.build()?;
    let region = pager.map(args.wss as usize)?;
    let words = region.as_atomic_u64s();
    let fill_seconds = workload::fill(words, args.threads as usize);
    let cfg = AccessConfig {
        pattern: args.pattern,
        accesses: args.accesses,
        read_pct: args.read_pct,
        threads: args.threads as usize,
        verify: args.verify,
        seed: args.seed,
    };
    let mut r = workload::access(words, &cfg);
    if args.verify == Verify::Full {
        // A last pass over every page: nothing written may have been lost anywhere.
        let (bad, errors) = workload::verify_all(words);
        r.verify_errors += bad;
        r.errors.extend(errors);
    }
    let stats = pager.stats();
    let lat = r.latency.summary_us();
    let result = BenchResult {
        engine: format!("uswap-{}", serde_plain(&args.fault_mode)),
        workload: "memtouch".into(),
        pattern: args.pattern,
        fault_mode: args.fault_mode,
        device: args.device.clone(),
        wss_bytes: args.wss,
        limit_bytes: args.limit,
        threads: args.threads,
        read_pct: args.read_pct,
        accesses: r.accesses,
        seconds: r.seconds,
        accesses_per_sec: r.accesses as f64 / r.seconds.max(1e-9),
        fill_seconds,
        fill_mb_per_sec: args.wss as f64 / 1e6 / fill_seconds.max(1e-9),
        latency_us: LatencyUs {
            p50: lat.p50,
            p90: lat.p90,
            p99: lat.p99,
            p999: lat.p999,
            mean: lat.mean,
            max: lat.max,
        },
        verify_errors: r.verify_errors,
        verify_error_samples: r.errors,
        stats,
    };
    if let Some(path) = &args.json {
        let text = serde_json::to_string_pretty(&result).expect("plain data serialises");
        std::fs::write(path, text + "\n").map_err(|source| BenchError::Json { path: path.clone(), source })?;
    }
    Ok(result)
}

fn serde_plain<T: Serialize>(v: &T) -> String {
    serde_json::to_value(v).ok().and_then(|v| v.as_str().map(str::to_owned)).unwrap_or_default()
}

pub fn print_summary(r: &BenchResult) {
    let s = &r.stats;
    println!(
        "{} memtouch {}: wss {} limit {} threads {} read {}%",
        r.engine,
        serde_plain(&r.pattern),
        format_size(r.wss_bytes),
        format_size(r.limit_bytes),
        r.threads,
        r.read_pct
    );
    println!("  fill     {:>10.1} MB/s   ({:.2} s)", r.fill_mb_per_sec, r.fill_seconds);
    println!("  access   {:>10.0} acc/s  ({} in {:.2} s)", r.accesses_per_sec, r.accesses, r.seconds);
    println!(
        "  latency  p50 {:.2} us  p90 {:.2} us  p99 {:.2} us  p99.9 {:.2} us",
        r.latency_us.p50, r.latency_us.p90, r.latency_us.p99, r.latency_us.p999
    );
    println!("  verify   {} errors", r.verify_errors);
    println!(
        "  faults   {} (zero {}, swap cache {}, device {})  pswpin {}  pswpout {}",
        s.pgfault, s.pgfault_zero, s.pgfault_swapcache, s.pgmajfault, s.pswpin, s.pswpout
    );
    println!(
        "  reclaim  background {}  direct {} (stalls {})  second chances {}  zero {}",
        s.pgsteal_background, s.pgsteal_direct, s.allocstall, s.pgactivate, s.swpout_zero
    );
    println!(
        "  fault service p50 {:.2} us  p99 {:.2} us;  resident {} pages, swap cache {}",
        s.fault_latency_us.p50, s.fault_latency_us.p99, s.resident_pages, s.swapcache_pages
    );
    for e in &r.verify_error_samples {
        println!("  ERROR {e}");
    }
}
