//! `uswap bench`: the seeds' workloads over uswap and, side by side in the same sitting,
//! over the kernel's own swap; a table with ratios, JSON, plots.
//!
//! The pieces: [`workload`] (what runs, written once), [`engine`] (the names `--engines`
//! takes), [`worker`] (running a workload in this process or in workload processes),
//! [`kernel`] (the kernel engines' swap devices, memory cgroups and lock), [`results`]
//! (medians over runs), [`table`], [`plot`], [`progress`], [`interrupt`] (Ctrl-C). This
//! file parses the flags, checks them, and runs the engines one after another, `--runs`
//! times, interleaved.

pub mod args;
pub mod command;
pub mod engine;
pub mod error;
pub mod histogram;
pub mod interrupt;
pub mod kernel;
pub mod plot;
pub mod progress;
pub mod results;
pub mod table;
pub mod worker;
pub mod workload;

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Args;
use serde::Serialize;

use crate::meminfo::Meminfo;
use crate::size::{format_size, parse_size};
pub use args::{BackgroundArg, FaultModeArg, OnOff};
use engine::{Engine, EngineKind};
use error::BenchError;
use kernel::KernelSitting;
use results::{Context, EngineResult, EngineRun};
use worker::{Memory, NoHooks, UswapConfig, WorkerSpec};
use workload::{Control, Pattern, Progress, Verify, Workload, WorkloadSpec};

/// The smallest `--limit` the kernel engines take: the workload process's own memory
/// (stacks, heap) is charged to the cgroup too.
pub const KERNEL_MIN_LIMIT_BYTES: u64 = 8 << 20;
/// Pages a `combined` run needs at least.
pub const COMBINED_MIN_PAGES: u64 = 16;

#[derive(Debug, Clone, Args)]
pub struct BenchArgs {
    /// The workload: memtouch (probes/memtouch.c), usemem (vm-scalability), pmbench,
    /// combined (seed 001: sequential streams with random workers in the background).
    #[arg(long, value_enum, default_value_t = Workload::Memtouch)]
    pub workload: Workload,
    /// Engines to compare, comma-separated, run one after another: uswap-signal,
    /// uswap-thread (optionally @DEVICES with `+` between devices), kernel-zram,
    /// kernel-file (root), ram. Default: the uswap engine of --fault-mode.
    #[arg(long)]
    pub engines: Option<String>,
    /// Access pattern after the fill: random (alias uniform), seq, zipf, normal.
    #[arg(long, value_enum, default_value_t = Pattern::Random)]
    pub pattern: Pattern,
    /// Working-set size (e.g. 256MiB, 1GiB).
    #[arg(long, value_parser = parse_size, default_value = "256MiB")]
    pub wss: u64,
    /// Resident limit: uswap's pager limit, the kernel engines' memory cgroup limit.
    #[arg(long, value_parser = parse_size, default_value = "64MiB")]
    pub limit: u64,
    /// Number of timed accesses after the fill, split over the threads and processes
    /// (usemem: word accesses; combined: the random workers' accesses); 0..=10^12.
    #[arg(long, default_value_t = 200_000, value_parser = clap::value_parser!(u64).range(0..=MAX_ACCESSES))]
    pub accesses: u64,
    /// Percentage of accesses that only read (the rest write).
    #[arg(long, default_value_t = 80, value_parser = clap::value_parser!(u32).range(0..=100))]
    pub read_pct: u32,
    /// Application threads (combined: random workers).
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u64).range(1..=1024))]
    pub threads: u64,
    /// usemem: processes, each with its own share of --wss (and, for uswap, of --limit);
    /// the kernel engines put them all in the one cgroup.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u64).range(1..=256))]
    pub procs: u64,
    /// combined: sequential streams rewriting their range.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u64).range(1..=256))]
    pub seq_streams: u64,
    /// zipf pattern: the exponent, 0..=100 (0 is uniform; larger is more skewed).
    #[arg(long, default_value_t = 0.99, value_parser = parse_zipf_skew, allow_negative_numbers = true)]
    pub zipf_skew: f64,
    /// normal pattern: the standard deviation, as a fraction of the range (above 0, at most 100).
    #[arg(long, default_value_t = 0.125, value_parser = parse_normal_sd, allow_negative_numbers = true)]
    pub normal_sd: f64,
    /// How faults reach uswap when --engines is not given (the engine is then uswap-MODE).
    #[arg(long, value_enum)]
    pub fault_mode: Option<FaultModeArg>,
    /// Thread mode: fault-handler threads, 1..=1024 (default: one per CPU).
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..=1024))]
    pub handler_threads: Option<u64>,
    /// Thread mode: leave handler threads unpinned instead of one per CPU.
    #[arg(long)]
    pub unpinned_handlers: bool,
    /// When uswap's background reclaimer works: `idle` (only while no faults arrive),
    /// `always` (classic kswapd, from the high to the low watermark), `stage-two` (as `idle`,
    /// and it writes the pages the faults move out) or `auto` (the default: `always` with a
    /// file or Redis device, whose writes are slow; `stage-two` with a zstd pool first;
    /// `idle` otherwise).
    #[arg(long, value_enum, default_value_t = BackgroundArg::Auto)]
    pub background_reclaim: BackgroundArg,
    /// uswap's readahead (an engine named `uswap-MODE/ra-off` or `/ra-on` overrides it).
    #[arg(long, value_enum, default_value_t = OnOff::On)]
    pub readahead: OnOff,
    /// uswap's largest readahead window, in pages (1..=128; default 32).
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..=128))]
    pub readahead_max_pages: Option<u64>,
    /// Windows uswap reads ahead asynchronously on file devices (0..=4; 0 is off; default 2).
    #[arg(long, value_parser = clap::value_parser!(u64).range(0..=4))]
    pub readahead_async: Option<u64>,
    /// How long uswap's file devices poll for a completion before sleeping, in microseconds
    /// (default 100; 0: always sleep).
    #[arg(long, value_parser = clap::value_parser!(u32).range(0..=100_000))]
    pub file_poll_us: Option<u32>,
    /// uswap's swap devices, highest priority first, comma-separated: `ram[:SIZE]`,
    /// `zpool[:CAP][:lz4|zstd|zstd-N][:raw|reject][:unit=SIZE][:dict]`, `file:PATH[:SIZE]` (a directory gets an
    /// anonymous file), each optionally ending in `:cluster` (cluster readahead). Default:
    /// `ram`; with --command, `zpool` (the like-for-like match of kernel-zram).
    ///
    /// `redis://HOST:PORT[;HOST:PORT...][?replicas=N&size=SIZE&encrypt=off]` pages to a Redis
    /// primary (seeds separated by `;`); `redis://local` (or `redis://localK`) is the K-th
    /// primary --redis-local started, with its replicas as seeds.
    #[arg(long)]
    pub device: Option<String>,
    /// Start N local Redis primaries with M replicas each (`N` or `NxM`, e.g. `1x1`) on free
    /// 127.0.0.1 ports, in a temporary directory, for devices named `redis://local`; they are
    /// killed when the bench ends, Ctrl-C included. `NxM:cluster` makes them one Redis
    /// Cluster (`redis-cli --cluster create`), named `redis-cluster://local`. Needs
    /// `redis-server` (and, for a cluster, `redis-cli`) on PATH.
    #[arg(long, value_name = "N[xM][:cluster]")]
    pub redis_local: Option<String>,
    /// Capacity of a uswap device given without a size (default: the working set plus 32MiB).
    #[arg(long, value_parser = parse_size)]
    pub device_size: Option<u64>,
    /// Size of the kernel engines' swap (zram disksize, swap file size); default: the
    /// working set plus 64MiB, or for --command half the RAM (a swap file no more than half
    /// of what its file system has free).
    #[arg(long, value_parser = parse_size)]
    pub kernel_swap_size: Option<u64>,
    /// Where kernel-file creates its swap file (ext4 or xfs).
    #[arg(long, default_value = "/var/tmp")]
    pub swap_file_dir: PathBuf,
    /// What each access checks (`full` also checks every page once at the end).
    #[arg(long, value_enum, default_value_t = Verify::Index)]
    pub verify: Verify,
    /// Runs of every engine, interleaved (engine A, B, C, A, B, C, ...); figures are medians.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u64).range(1..=100))]
    pub runs: u64,
    /// The engine the ratio columns divide by (default: kernel-zram, when it runs).
    #[arg(long)]
    pub baseline: Option<String>,
    /// Seed of the access streams.
    #[arg(long, default_value_t = 88172645463325252)]
    pub seed: u64,
    /// Write the results as JSON (an array: one object per engine, and per side for combined).
    #[arg(long)]
    pub json: Option<PathBuf>,
    /// Write a latency CDF and a throughput chart (SVG) into this directory.
    #[arg(long)]
    pub plot: Option<PathBuf>,
    /// Print each engine's latency histogram as pmbench does (log2 buckets, 16 sub-buckets).
    #[arg(long)]
    pub histogram: bool,
    /// Wait for another uswap bench using the kernel engines instead of refusing to run.
    #[arg(long)]
    pub wait_lock: bool,
    /// Kernel engines: times a run the kernel's OOM killer ends is run again, 0..=100 (each
    /// one is counted in the results as `oom_kills`).
    #[arg(long, default_value_t = 2, value_parser = clap::value_parser!(u64).range(0..=100))]
    pub oom_retries: u64,
    /// Time this unmodified program under each engine instead of a workload: "CMD ARGS",
    /// split as a shell would (quotes, backslashes) but run without one. uswap engines run it
    /// as `uswap run` does; the kernel engines in their memory cgroup; `ram` plainly. Its
    /// stdout must be the same under every engine. The workload flags do not apply (refused).
    #[arg(long, value_name = "CMD ARGS")]
    pub command: Option<String>,
}

/// The most `--accesses` a run takes (days of accesses at a microsecond each).
pub const MAX_ACCESSES: u64 = 1_000_000_000_000;
/// The largest `--zipf-skew`: from about 50 on, every draw is the hottest page anyway.
pub const MAX_ZIPF_SKEW: f64 = 100.0;
/// The largest `--normal-sd` (a fraction of the range; far above 1 the pattern is uniform).
pub const MAX_NORMAL_SD: f64 = 100.0;

/// A finite float; NaN and infinities would make the samplers spin or collapse.
fn parse_finite(s: &str) -> Result<f64, String> {
    match s.trim().parse::<f64>() {
        Ok(v) if v.is_finite() => Ok(v),
        Ok(_) => Err("not a finite number".into()),
        Err(e) => Err(format!("not a number ({e})")),
    }
}

/// `--zipf-skew`: a finite exponent in `0..=MAX_ZIPF_SKEW`.
fn parse_zipf_skew(s: &str) -> Result<f64, String> {
    let range = format!("give a number from 0 to {MAX_ZIPF_SKEW} (0 is uniform)");
    match parse_finite(s) {
        Ok(v) if (0.0..=MAX_ZIPF_SKEW).contains(&v) => Ok(v),
        Ok(_) => Err(format!("out of range; {range}")),
        Err(why) => Err(format!("{why}; {range}")),
    }
}

/// `--normal-sd`: a finite fraction of the range, above 0 and at most `MAX_NORMAL_SD`.
fn parse_normal_sd(s: &str) -> Result<f64, String> {
    let range = format!("give a fraction of the range above 0 and at most {MAX_NORMAL_SD} (e.g. 0.125)");
    match parse_finite(s) {
        Ok(v) if v > 0.0 && v <= MAX_NORMAL_SD => Ok(v),
        Ok(_) => Err(format!("out of range; {range}")),
        Err(why) => Err(format!("{why}; {range}")),
    }
}

/// The engines of an invocation.
pub fn engines_of(args: &BenchArgs) -> Result<Vec<Engine>, BenchError> {
    match (&args.engines, args.fault_mode) {
        (Some(_), Some(_)) => Err(BenchError::FaultModeWithEngines),
        (Some(list), None) => Engine::parse_list(list),
        (None, mode) => {
            let mode = mode.unwrap_or(FaultModeArg::Thread);
            Engine::parse(&format!("uswap-{}", serde_plain(&mode))).map(|e| vec![e])
        }
    }
}

/// The baseline of the ratio columns.
pub fn baseline_of(args: &BenchArgs, engines: &[Engine]) -> Result<Option<String>, BenchError> {
    match &args.baseline {
        Some(b) if engines.iter().any(|e| &e.name == b) => Ok(Some(b.clone())),
        Some(b) => Err(BenchError::BaselineMissing { baseline: b.clone() }),
        None => Ok(engines.iter().find(|e| e.name == "kernel-zram").map(|e| e.name.clone())),
    }
}

/// Refuses what cannot run, before anything is set up.
pub fn validate(args: &BenchArgs, engines: &[Engine]) -> Result<(), BenchError> {
    let page = uswap::PAGE_SIZE as u64;
    let pages = args.wss / page;
    let min_pages = match args.workload {
        Workload::Combined => COMBINED_MIN_PAGES.max(2 * (args.threads + args.seq_streams)),
        Workload::Usemem => args.threads * args.procs,
        _ => args.procs,
    };
    if pages < min_pages {
        return Err(BenchError::WssTooSmall { min_pages, min_bytes: min_pages * page });
    }
    if args.procs > 1 && args.workload != Workload::Usemem {
        return Err(BenchError::ProcsNeedUsemem);
    }
    if args.workload == Workload::Combined && args.pattern == Pattern::Seq {
        return Err(BenchError::CombinedSeqPattern);
    }
    if engines.iter().any(Engine::is_limited) && args.limit > args.wss {
        return Err(BenchError::LimitAboveWss { limit: format_size(args.limit), wss: format_size(args.wss) });
    }
    if engines.iter().any(|e| matches!(e.kind, EngineKind::Uswap { .. })) {
        let each = args.limit / args.procs;
        if each < uswap::MIN_LIMIT_BYTES {
            if args.procs == 1 {
                return Err(uswap::Error::LimitTooSmall { limit_bytes: each, min_bytes: uswap::MIN_LIMIT_BYTES }.into());
            }
            return Err(BenchError::ProcsSplitTooSmall {
                procs: args.procs,
                what: "limit",
                each: format_size(each),
                min: format_size(uswap::MIN_LIMIT_BYTES),
            });
        }
    }
    if engines.iter().any(Engine::is_kernel) && args.limit < KERNEL_MIN_LIMIT_BYTES {
        return Err(BenchError::KernelLimitTooSmall {
            limit: format_size(args.limit),
            min: format_size(KERNEL_MIN_LIMIT_BYTES),
        });
    }
    baseline_of(args, engines)?;
    for e in engines {
        check_fits(args, e, &Meminfo::read())?;
    }
    Ok(())
}

/// Memory the swapped-out part of a uswap engine's working set takes: all of it on `ram`
/// devices, up to the cap on `zpool` devices (compressed), none on `file` devices, and
/// whatever no device has room for stays resident. A device list that does not parse is
/// left to the engine to refuse.
fn device_memory_bytes(devices: &str, swapped_bytes: u64, default_device_bytes: u64) -> u64 {
    let mut left = swapped_bytes;
    let mut memory = 0u64;
    for item in devices.split(',').map(str::trim) {
        if let Some(rest) = item.strip_prefix("redis://") {
            // Pages in a store on this machine take its memory; on another, none of ours.
            let local = rest.split(';').all(|a| a.starts_with("127.") || a.starts_with("localhost:"));
            let size = rest
                .split_once("size=")
                .and_then(|(_, v)| parse_size(v.split('&').next().unwrap_or("")).ok())
                .unwrap_or(default_device_bytes);
            let stored = left.min(size);
            if local {
                memory = memory.saturating_add(stored);
            }
            left -= stored;
            continue;
        }
        let size = item.split(':').skip(1).find_map(|t| parse_size(t).ok()).unwrap_or(default_device_bytes);
        // (pages it indexes, memory it may use), in bytes.
        let (capacity, memory_cap) = match item.split(':').next() {
            Some("ram") => (size, size),
            Some("zpool") => (size.saturating_mul(4).max(default_device_bytes), size),
            Some("file") => (size, 0),
            _ => (0, 0),
        };
        let stored = left.min(capacity);
        memory = memory.saturating_add(stored.min(memory_cap));
        left -= stored;
    }
    memory.saturating_add(left)
}

/// `25769803776` → `24.0 GiB`.
fn gib(bytes: u64) -> String {
    format!("{:.1} GiB", bytes as f64 / (1u64 << 30) as f64)
}

/// Refuses a run that cannot fit in this machine's memory before it starts, rather than
/// letting the kernel's OOM killer end it half-way.
fn check_fits(args: &BenchArgs, engine: &Engine, mem: &Meminfo) -> Result<(), BenchError> {
    let avail = mem.available_bytes;
    let (need, what, hint) = match &engine.kind {
        EngineKind::Uswap { devices, .. } => {
            let cfg = uswap_config(args, FaultModeArg::Thread, devices);
            let swapped = args.wss.saturating_sub(args.limit);
            let on_devices = device_memory_bytes(&cfg.devices, swapped, cfg.device_bytes);
            let what = format!(
                "--limit {} resident plus {} of swapped pages held in memory (devices {})",
                format_size(args.limit),
                gib(on_devices),
                cfg.devices
            );
            (args.limit.saturating_add(on_devices), what, " or --limit, or a file device (--device file:/var/tmp)")
        }
        EngineKind::Ram => (args.wss, format!("--wss {} in RAM", format_size(args.wss)), ""),
        EngineKind::Kernel(kind) => {
            // zram keeps what it swaps in RAM: only a swap file adds room.
            let swap = match kind {
                engine::KernelSwap::File => args.kernel_swap_size.unwrap_or(args.wss + (64 << 20)),
                engine::KernelSwap::Zram => 0,
            };
            let what = format!("--wss {} (with {} of swap)", format_size(args.wss), format_size(swap));
            (args.wss.saturating_sub(swap), what, " or a larger --kernel-swap-size")
        }
    };
    if need <= avail {
        return Ok(());
    }
    Err(BenchError::WontFit {
        engine: engine.name.clone(),
        detail: format!("{what} needs {} of memory, but this machine has {} available", gib(need), gib(avail)),
        hint,
    })
}

fn serde_plain<T: Serialize>(v: &T) -> String {
    serde_json::to_value(v).ok().and_then(|v| v.as_str().map(str::to_owned)).unwrap_or_default()
}

/// State that outlives one invocation of [`run`] (a report runs several): the kernel
/// engines' lock and checks, taken once.
#[derive(Default)]
pub struct Sitting {
    pub kernel: Option<KernelSitting>,
    /// `--redis-local`'s servers, killed when the sitting ends.
    pub redis: Option<uswap::backend::redis::LocalRedis>,
}

/// `--redis-local N[xM]` → (N, M).
pub fn parse_redis_local(s: &str) -> Result<(usize, usize, bool), BenchError> {
    let bad = |why: &str| BenchError::RedisLocalSyntax { given: s.to_string(), why: why.to_string() };
    let (nm, cluster) = match s.strip_suffix(":cluster") {
        Some(nm) => (nm, true),
        None => (s, false),
    };
    let (n, m) = nm.split_once('x').unwrap_or((nm, "0"));
    let n: usize = n.trim().parse().map_err(|_| bad("N is not a whole number"))?;
    let m: usize = m.trim().parse().map_err(|_| bad("M is not a whole number"))?;
    if !(1..=16).contains(&n) || m > 8 {
        return Err(bad("N must be 1..=16 and M 0..=8"));
    }
    if cluster && n < 3 {
        return Err(bad("a Redis Cluster needs 3 primaries at least"));
    }
    Ok((n, m, cluster))
}

/// Replaces `redis://local` and `redis://localK` in a device list with the addresses of
/// `--redis-local`'s primary K and its replicas.
pub fn resolve_redis_local(
    devices: &str,
    local: Option<&uswap::backend::redis::LocalRedis>,
    what: &str,
    primaries: usize,
) -> Result<String, BenchError> {
    let mut out = Vec::new();
    for item in devices.split(',') {
        let kind = |named, started, use_instead| BenchError::RedisLocalKind {
            what: what.to_string(),
            named,
            started,
            use_instead,
        };
        if let Some(rest) = item.trim().strip_prefix("redis-cluster://local") {
            let Some(local) = local else { return Err(BenchError::RedisLocalMissing { what: what.to_string() }) };
            if !local.is_cluster() {
                return Err(kind("redis-cluster://local", "standalone servers", "redis://local"));
            }
            out.push(format!("{}{rest}", local.cluster_url()));
            continue;
        }
        let Some(rest) = item.trim().strip_prefix("redis://local") else {
            out.push(item.to_string());
            continue;
        };
        let Some(local) = local else { return Err(BenchError::RedisLocalMissing { what: what.to_string() }) };
        if local.is_cluster() {
            return Err(kind("redis://local", "a cluster", "redis-cluster://local"));
        }
        let digits = rest.find(|c: char| !c.is_ascii_digit()).unwrap_or(rest.len());
        let index: usize = rest[..digits].parse().unwrap_or(0);
        if index >= primaries {
            return Err(BenchError::RedisLocalIndex { index, primaries });
        }
        out.push(format!("{}{}", local.url(index), &rest[digits..]));
    }
    Ok(out.join(","))
}

/// Starts `--redis-local`'s servers (once per sitting) and resolves `redis://local` in the
/// engines' device lists and in `--device`.
pub(crate) fn with_local_redis(
    args: &BenchArgs,
    engines: &mut [Engine],
    sitting: &mut Sitting,
) -> Result<BenchArgs, BenchError> {
    let mut args = args.clone();
    let primaries = match &args.redis_local {
        Some(spec) => {
            let (n, m, cluster) = parse_redis_local(spec)?;
            if sitting.redis.is_none() {
                let local = if cluster {
                    uswap::backend::redis::LocalRedis::start_cluster(n, m)
                } else {
                    uswap::backend::redis::LocalRedis::start(n, m, &[])
                };
                let local = local.map_err(|source| BenchError::RedisLocal { source })?;
                let urls = if cluster {
                    local.cluster_url()
                } else {
                    (0..n).map(|k| local.url(k)).collect::<Vec<_>>().join(", ")
                };
                eprintln!("uswap bench: local Redis: {urls} (logs in {})", local.dir().display());
                interrupt::remove_on_forced_exit(
                    (0..local.len()).filter_map(|k| local.pid(k)),
                    local.dir().to_path_buf(),
                );
                sitting.redis = Some(local);
            }
            n
        }
        None => 0,
    };
    let local = sitting.redis.as_ref();
    if let Some(d) = &args.device {
        args.device = Some(resolve_redis_local(d, local, "--device", primaries)?);
    }
    for e in engines.iter_mut() {
        if let EngineKind::Uswap { devices: Some(d), .. } = &mut e.kind {
            *d = resolve_redis_local(d, local, &format!("engine {}", e.name), primaries)?;
        }
    }
    Ok(args)
}

/// The workload as one process runs it (its share of the accesses, its own seed).
fn spec_for(args: &BenchArgs, proc_idx: u64) -> WorkloadSpec {
    let procs = args.procs;
    WorkloadSpec {
        workload: args.workload,
        pattern: args.pattern,
        accesses: args.accesses / procs + u64::from(proc_idx < args.accesses % procs),
        read_pct: args.read_pct,
        threads: args.threads as usize,
        seq_streams: args.seq_streams as usize,
        verify: args.verify,
        seed: args.seed ^ proc_idx.wrapping_mul(0x9E37_79B9_7F4A_7C15),
        zipf_skew: args.zipf_skew,
        normal_sd: args.normal_sd,
    }
}

/// Bytes of working set of each process.
fn wss_each(args: &BenchArgs) -> u64 {
    let page = uswap::PAGE_SIZE as u64;
    (args.wss / args.procs / page).max(1) * page
}

fn uswap_config(args: &BenchArgs, mode: FaultModeArg, devices: &Option<String>) -> UswapConfig {
    UswapConfig {
        fault_mode: mode,
        devices: devices.clone().or_else(|| args.device.clone()).unwrap_or_else(|| "ram".into()),
        device_bytes: args.device_size.unwrap_or(wss_each(args) + (32 << 20)),
        limit_bytes: args.limit / args.procs,
        handler_threads: args.handler_threads.map(|n| n as usize),
        pin_handlers: !args.unpinned_handlers,
        background: args.background_reclaim,
        readahead: args.readahead == OnOff::On,
        readahead_max_pages: args.readahead_max_pages,
        readahead_async_windows: args.readahead_async,
        file_poll_us: args.file_poll_us,
    }
}

/// One run of one engine.
fn run_engine(
    args: &BenchArgs,
    engine: &Engine,
    sitting: &mut Sitting,
    progress: &Progress,
) -> Result<EngineRun, BenchError> {
    let specs = |memory: Memory, cgroup_procs: Option<PathBuf>| -> Vec<WorkerSpec> {
        (0..args.procs)
            .map(|i| WorkerSpec {
                memory: memory.clone(),
                wss_bytes: wss_each(args),
                workload: spec_for(args, i),
                cgroup_procs: cgroup_procs.clone(),
            })
            .collect()
    };
    let no_oom = || 0;
    match &engine.kind {
        EngineKind::Uswap { mode, devices, readahead } => {
            let mut cfg = uswap_config(args, *mode, devices);
            if let Some(on) = readahead {
                cfg.readahead = *on;
            }
            let device = Some(cfg.devices.clone());
            let specs = specs(Memory::Uswap(cfg), None);
            let reports = if args.procs == 1 {
                let ctl = Control { progress, stop: interrupt::flag() };
                let _in_process = interrupt::InProcessRun::start();
                vec![worker::run_worker(&specs[0], ctl, &mut NoHooks)?]
            } else {
                worker::run_processes(&engine.name, &specs, progress, &no_oom)?
            };
            Ok(EngineRun::merge(reports, device))
        }
        EngineKind::Ram => {
            let before = kernel::vmstat::Vmstat::read();
            let reports = worker::run_processes(&engine.name, &specs(Memory::Plain, None), progress, &no_oom)?;
            let mut run = EngineRun::merge(reports, None);
            run.stats = kernel::vmstat::Vmstat::read().delta(&before);
            Ok(run)
        }
        EngineKind::Kernel(kind) => {
            let sitting = sitting.kernel.as_mut().expect("the kernel sitting is opened before kernel engines run");
            let swap_bytes = args.kernel_swap_size.unwrap_or(args.wss + (64 << 20));
            let run = sitting.start(*kind, swap_bytes, args.limit, &args.swap_file_dir)?;
            let specs = specs(Memory::Plain, run.procs_path());
            let device = match kind {
                engine::KernelSwap::Zram => format!("{} (lz4)", run.device()),
                engine::KernelSwap::File => run.device(),
            };
            let before = kernel::vmstat::Vmstat::read();
            let reports = worker::run_processes(&engine.name, &specs, progress, &|| run.oom_kills());
            let after = kernel::vmstat::Vmstat::read();
            let reports = match reports {
                Ok(r) => r,
                Err(e) => {
                    drop(run); // tears down, printing any problem
                    return Err(e);
                }
            };
            run.finish()?;
            let mut r = EngineRun::merge(reports, Some(device));
            r.stats = after.delta(&before);
            Ok(r)
        }
    }
}

/// Runs every engine `--runs` times, interleaved, and summarises.
pub fn run(args: &BenchArgs, sitting: &mut Sitting) -> Result<Vec<EngineResult>, BenchError> {
    let mut engines = engines_of(args)?;
    let args = &with_local_redis(args, &mut engines, sitting)?;
    validate(args, &engines)?;
    let kernel_engines: Vec<&Engine> = engines.iter().filter(|e| e.is_kernel()).collect();
    if !kernel_engines.is_empty() && sitting.kernel.is_none() {
        sitting.kernel = Some(KernelSitting::open(&kernel_engines, args.wait_lock)?);
    }
    let bar = progress::Bar::new();
    let mut runs: Vec<Vec<EngineRun>> = vec![vec![]; engines.len()];
    for r in 0..args.runs {
        for (e, engine) in engines.iter().enumerate() {
            if interrupt::interrupted() {
                bar.finish();
                return Err(BenchError::Interrupted);
            }
            let label =
                if args.runs > 1 { format!("{} {}/{}", engine.name, r + 1, args.runs) } else { engine.name.clone() };
            let mut oom_kills = 0;
            let mut run = loop {
                let progress = Progress::default();
                let tlb_before = kernel::interrupts::tlb_shootdowns();
                match bar.follow(&label, &progress, || run_engine(args, engine, sitting, &progress)) {
                    Ok(mut run) => {
                        kernel::interrupts::record_since(&mut run.stats, tlb_before);
                        break run;
                    }
                    Err(BenchError::OomKilled { .. }) if oom_kills < args.oom_retries => {
                        oom_kills += 1;
                        bar.println(&format!("{label}: the kernel's OOM killer ended the workload; running it again"));
                    }
                    Err(BenchError::OomKilled { engine, .. }) => {
                        bar.finish();
                        return Err(BenchError::OomKilled { engine, attempts: oom_kills + 1 });
                    }
                    Err(e) => {
                        bar.finish();
                        return Err(e);
                    }
                }
            };
            run.oom_kills = oom_kills;
            for s in &run.sides {
                bar.println(&format!(
                    "{label}: {} acc/s, fill {:.0} MB/s, p50 {:.2} µs, {} verify errors",
                    table::thousands(s.accesses as f64 / s.seconds.max(1e-9)),
                    run.fill_bytes as f64 / 1e6 / run.fill_seconds.max(1e-9),
                    s.latency.summary_us().p50,
                    s.verify_errors
                ));
            }
            runs[e].push(run);
        }
    }
    bar.finish();
    let spec = spec_for(args, 0);
    let ctx = Context { spec: &spec, wss_bytes: args.wss, limit_bytes: args.limit, procs: args.procs };
    Ok(engines.iter().zip(&runs).flat_map(|(e, r)| results::summarize(e, r, &ctx)).collect())
}

/// What a run is, in a few words (plot titles).
pub fn title(args: &BenchArgs) -> String {
    let w = serde_plain(&args.workload);
    match args.workload {
        Workload::Combined => format!("{w}: sequential streams + {} workers", args.pattern.name(args.workload)),
        _ => format!("{w} {}", args.pattern.name(args.workload)),
    }
}

/// Counters worth a line per engine under the table.
fn counters_line(r: &EngineResult) -> String {
    const KEYS: [&str; 12] = [
        "pgfault",
        "pgfault_zero",
        "pgfault_swapcache",
        "pgmajfault",
        "pswpin",
        "pswpout",
        "swap_ra",
        "swap_ra_hit",
        "pgsteal_direct",
        "pgsteal_background",
        "pgsteal_kswapd",
        "allocstall",
    ];
    let mut parts: Vec<String> =
        KEYS.iter().filter_map(|k| r.stats.get(*k).and_then(|v| v.as_u64()).map(|v| format!("{k} {v}"))).collect();
    if let Some(tlb) = r.stats.get("tlb_shootdowns").and_then(|v| v.as_u64()) {
        parts.push(format!("tlb_shootdowns {tlb}"));
    }
    if let Some(x) = kernel::interrupts::per_major_fault(&r.stats) {
        parts.push(format!("tlb_shootdowns/pgmajfault {x:.2}"));
    }
    format!("  {}: {}", r.engine, if parts.is_empty() { "-".into() } else { parts.join(", ") })
}

/// Prints the table and what goes with it.
pub fn print(args: &BenchArgs, results: &[EngineResult], baseline: Option<&str>) {
    let first = &results[0];
    println!(
        "uswap bench: {} {}, wss {}, limit {}, threads {}{}, read {}%, {} run{}",
        serde_plain(&first.workload),
        args.pattern.name(args.workload),
        format_size(args.wss),
        format_size(args.limit),
        args.threads,
        if args.procs > 1 { format!(", procs {}", args.procs) } else { String::new() },
        args.read_pct,
        args.runs,
        if args.runs > 1 { "s (medians)" } else { "" }
    );
    print!("{}", table::build(results, baseline).to_text());
    match baseline {
        Some(b) => println!("ratios: engine / {b} (above 1: faster than {b})"),
        None => println!("(no ratios: add kernel-zram to --engines, or give --baseline)"),
    }
    for r in results.iter().filter(|r| r.oom_kills > 0 && r.side != workload::Side::Random) {
        println!("note: {}: the kernel's OOM killer ended {} attempt(s), run again", r.engine, r.oom_kills);
    }
    println!("counters (median run):");
    for r in results.iter().filter(|r| r.side != workload::Side::Random) {
        println!("{}", counters_line(r));
    }
    for r in results {
        for e in &r.verify_error_samples {
            println!("  ERROR {}: {e}", plot::label(r));
        }
        if args.histogram {
            println!("latency histogram of {} (per {:?}):", plot::label(r), r.latency_unit);
            print!("{}", histogram::format_pmbench(&r.latency_histogram));
        }
    }
}

/// Says why `uswap bench` failed and returns its exit status: 130 interrupted (everything
/// set up is cleaned up by then), 3 the runs' outputs differed (a wrong result, as a read of
/// wrong data is), 2 anything else.
fn failure_exit(e: BenchError) -> ExitCode {
    match e {
        BenchError::Interrupted => {
            eprintln!("uswap bench: interrupted; everything it had set up is cleaned up");
            ExitCode::from(130)
        }
        e @ BenchError::OutputDiffers { .. } => {
            eprintln!("uswap bench: {e}");
            ExitCode::from(3)
        }
        e => {
            eprintln!("uswap bench: {e}");
            ExitCode::from(2)
        }
    }
}

/// Writes `results` to `--json`'s file, when it is given.
fn write_json(args: &BenchArgs, results: &impl Serialize) -> Result<(), BenchError> {
    let Some(path) = &args.json else { return Ok(()) };
    let text = serde_json::to_string_pretty(results).expect("plain data serialises");
    std::fs::write(path, text + "\n").map_err(|source| BenchError::Write { path: path.clone(), source })
}

/// `uswap bench`.
pub fn main(args: &BenchArgs) -> ExitCode {
    if let Err(e) = interrupt::install() {
        eprintln!("uswap bench: cannot catch Ctrl-C ({e}); an interrupted run may leave swap on");
    }
    if let Some(cmd) = &args.command {
        return command::main(args, cmd);
    }
    let mut sitting = Sitting::default();
    let result = run(args, &mut sitting);
    drop(sitting);
    let results = match result {
        Ok(r) => r,
        Err(e) => return failure_exit(e),
    };
    let baseline = engines_of(args).ok().and_then(|e| baseline_of(args, &e).ok().flatten());
    print(args, &results, baseline.as_deref());
    if let Err(e) = write_json(args, &results) {
        return failure_exit(e);
    }
    if let Some(dir) = &args.plot {
        match plot::write(dir, "", &results, &title(args)) {
            Ok(paths) => {
                for p in paths {
                    println!("plot: {}", p.display());
                }
            }
            Err(e) => {
                eprintln!("uswap bench: {e}");
                return ExitCode::from(2);
            }
        }
    }
    let errors: u64 = results.iter().map(|r| r.verify_errors).sum();
    if errors > 0 {
        eprintln!("uswap bench: {errors} accesses read wrong data");
        return ExitCode::from(3);
    }
    ExitCode::SUCCESS
}
