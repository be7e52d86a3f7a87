//! Running a workload: in this process on a uswap region, or in workload processes (the
//! kernel engines, `ram`, and `--procs N`) that `uswap bench` starts by re-executing itself
//! as `uswap __workload --spec JSON`.
//!
//! A workload process joins its memory cgroup before it allocates anything, maps its memory
//! (an ordinary anonymous mapping, or a uswap region for uswap engines with `--procs`), and
//! talks to the bench over its stdin and stdout, one JSON object per line:
//!
//! ```text
//! worker → {"event":"ready"}                 memory mapped, waiting
//! bench  → go                                (once every process is ready)
//! worker → {"event":"progress",...}          every 100 ms
//! worker → {"event":"filled","fill_seconds":..}
//! bench  → go                                (once every process has filled)
//! worker → {"event":"result","report":{..}}  or {"event":"error","message":..}
//! ```
//!
//! The two barriers keep the fill and access phases of several processes aligned. A workload
//! process dies with the bench (`PR_SET_PDEATHSIG`) and sits in its own process group, so a
//! Ctrl-C reaches only the bench, which kills it and cleans up.

use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::PathBuf;
use std::process::{Child, ChildStdin, Command, ExitCode, ExitStatus, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::args::{BackgroundArg, FaultModeArg};
use super::error::BenchError;
use super::interrupt;
use super::workload::{self, Control, Phase, Progress, SideReport, WorkloadSpec};

/// How a uswap pager is built (the same for the in-process engine and workload processes).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct UswapConfig {
    pub fault_mode: FaultModeArg,
    /// A device list for `uswap::DeviceConfig::parse_list`.
    pub devices: String,
    /// Capacity of a device given without a size.
    pub device_bytes: u64,
    pub limit_bytes: u64,
    pub handler_threads: Option<usize>,
    pub pin_handlers: bool,
    pub background: BackgroundArg,
    /// Readahead on swap-in.
    #[serde(default = "default_true")]
    pub readahead: bool,
    /// Largest readahead window in pages (`None`: the library's default).
    #[serde(default)]
    pub readahead_max_pages: Option<u64>,
    /// Windows read ahead asynchronously (`None`: the library's default).
    #[serde(default)]
    pub readahead_async_windows: Option<u64>,
    /// Completion polling of file devices, in microseconds (`None`: the library's default).
    #[serde(default)]
    pub file_poll_us: Option<u32>,
}

fn default_true() -> bool {
    true
}

impl UswapConfig {
    pub fn build(&self) -> Result<uswap::Pager, BenchError> {
        let mut b = uswap::Pager::builder()
            .resident_limit(self.limit_bytes)
            .fault_mode(self.fault_mode.into())
            .pin_handlers(self.pin_handlers)
            .background_reclaim(match self.background {
                BackgroundArg::Auto => uswap::BackgroundReclaim::Auto,
                BackgroundArg::Idle => uswap::BackgroundReclaim::WhenIdle,
                BackgroundArg::Always => uswap::BackgroundReclaim::Always,
                BackgroundArg::StageTwo => uswap::BackgroundReclaim::StageTwo,
            });
        if let Some(n) = self.handler_threads {
            b = b.handler_threads(n);
        }
        b = b.readahead(self.readahead);
        if let Some(n) = self.readahead_max_pages {
            b = b.readahead_max_pages(n as usize);
        }
        if let Some(n) = self.readahead_async_windows {
            b = b.readahead_async_windows(n as usize);
        }
        for mut d in uswap::DeviceConfig::parse_list(&self.devices, self.device_bytes)? {
            if let Some(us) = self.file_poll_us {
                d = d.poll_us(us);
            }
            b = b.device(d);
        }
        Ok(b.build()?)
    }
}

/// The memory a workload runs over.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "lowercase")]
pub enum Memory {
    /// An ordinary anonymous mapping (`uswap::PlainRegion`): the kernel manages it.
    Plain,
    /// A region of a uswap pager.
    Uswap(UswapConfig),
}

/// Everything one workload process (or the in-process run) needs.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct WorkerSpec {
    pub memory: Memory,
    pub wss_bytes: u64,
    pub workload: WorkloadSpec,
    /// `cgroup.procs` of the memory cgroup to join first.
    pub cgroup_procs: Option<PathBuf>,
}

/// What one process measured.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct WorkerReport {
    pub fill_seconds: f64,
    pub fill_bytes: u64,
    pub sides: Vec<SideReport>,
    /// uswap's `Stats` for uswap memory; null for plain memory.
    pub stats: serde_json::Value,
}

/// The two synchronisation points of a run.
pub trait Hooks {
    fn ready(&mut self) -> Result<(), BenchError>;
    fn filled(&mut self, fill_seconds: f64) -> Result<(), BenchError>;
}

/// In-process: nothing to wait for.
pub struct NoHooks;

impl Hooks for NoHooks {
    fn ready(&mut self) -> Result<(), BenchError> {
        Ok(())
    }

    fn filled(&mut self, _: f64) -> Result<(), BenchError> {
        Ok(())
    }
}

/// Runs the workload of `spec`: join the cgroup, map, fill, access.
pub fn run_worker(spec: &WorkerSpec, ctl: Control, hooks: &mut dyn Hooks) -> Result<WorkerReport, BenchError> {
    ctl.progress.set_phase(Phase::Setup, 0);
    if let Some(p) = &spec.cgroup_procs {
        std::fs::write(p, std::process::id().to_string())
            .map_err(|e| BenchError::system("joining the memory cgroup", p, e))?;
    }
    let len = spec.wss_bytes as usize;
    match &spec.memory {
        Memory::Plain => {
            let region = uswap::PlainRegion::new(len)?;
            body(region.as_atomic_u64s(), spec, ctl, hooks, &|| serde_json::Value::Null)
        }
        Memory::Uswap(c) => {
            let pager = c.build()?;
            let region = pager.map(len)?;
            let stats = || serde_json::to_value(pager.stats()).unwrap_or_default();
            body(region.as_atomic_u64s(), spec, ctl, hooks, &stats)
        }
    }
}

fn body(
    words: &[std::sync::atomic::AtomicU64],
    spec: &WorkerSpec,
    ctl: Control,
    hooks: &mut dyn Hooks,
    stats: &dyn Fn() -> serde_json::Value,
) -> Result<WorkerReport, BenchError> {
    hooks.ready()?;
    let fill_seconds = workload::fill(words, spec.workload.fill_threads(), ctl);
    if ctl.stopped() {
        return Err(BenchError::Interrupted);
    }
    hooks.filled(fill_seconds)?;
    let sides = workload::access(words, &spec.workload, ctl);
    if ctl.stopped() {
        return Err(BenchError::Interrupted);
    }
    ctl.progress.set_phase(Phase::Done, 0);
    Ok(WorkerReport { fill_seconds, fill_bytes: words.len() as u64 * 8, sides, stats: stats() })
}

/// One line of the protocol.
#[derive(Debug, Serialize, Deserialize)]
#[serde(tag = "event", rename_all = "lowercase")]
pub enum Event {
    Ready,
    Progress { phase: Phase, done: u64, total: u64 },
    Filled { fill_seconds: f64 },
    Result { report: Box<WorkerReport> },
    Error { message: String },
}

fn emit(e: &Event) {
    let line = serde_json::to_string(e).expect("plain data serialises");
    let mut out = std::io::stdout().lock();
    // The bench is gone if this fails; PR_SET_PDEATHSIG ends us anyway.
    let _ = writeln!(out, "{line}").and_then(|_| out.flush());
}

struct ChildHooks;

impl ChildHooks {
    fn wait_go(&self) -> Result<(), BenchError> {
        let mut line = String::new();
        match std::io::stdin().lock().read_line(&mut line) {
            Ok(_) if line.trim() == "go" => Ok(()),
            _ => Err(BenchError::Interrupted),
        }
    }
}

impl Hooks for ChildHooks {
    fn ready(&mut self) -> Result<(), BenchError> {
        emit(&Event::Ready);
        self.wait_go()
    }

    fn filled(&mut self, fill_seconds: f64) -> Result<(), BenchError> {
        emit(&Event::Filled { fill_seconds });
        self.wait_go()
    }
}

/// `uswap __workload --spec JSON`: the workload process.
pub fn child_main(spec_json: &str) -> ExitCode {
    // SAFETY: prctl with constant arguments.
    unsafe { libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) };
    let spec: WorkerSpec = match serde_json::from_str(spec_json) {
        Ok(s) => s,
        Err(e) => {
            emit(&Event::Error { message: format!("bad workload spec ({e}); this is a bug in uswap bench") });
            return ExitCode::from(2);
        }
    };
    let progress = Progress::default();
    let stop = AtomicBool::new(false);
    let finished = AtomicBool::new(false);
    let ctl = Control { progress: &progress, stop: &stop };
    let result = std::thread::scope(|s| {
        s.spawn(|| {
            while !finished.load(Ordering::Acquire) {
                std::thread::sleep(Duration::from_millis(100));
                let (phase, done, total) = progress.get();
                emit(&Event::Progress { phase, done, total });
            }
        });
        let r = run_worker(&spec, ctl, &mut ChildHooks);
        finished.store(true, Ordering::Release);
        r
    });
    match result {
        Ok(report) => {
            emit(&Event::Result { report: Box::new(report) });
            ExitCode::SUCCESS
        }
        Err(e) => {
            emit(&Event::Error { message: e.to_string() });
            ExitCode::from(2)
        }
    }
}

/// The bench's side of a set of workload processes: killed and reaped on drop.
struct Proc {
    child: Child,
    stdin: Option<ChildStdin>,
    stderr: Arc<Mutex<String>>,
    stage: u8,
    eof: bool,
    phase: Phase,
    done: u64,
    total: u64,
    report: Option<WorkerReport>,
}

struct Procs(Vec<Proc>);

impl Drop for Procs {
    fn drop(&mut self) {
        for p in &mut self.0 {
            let _ = p.child.kill();
            let _ = p.child.wait();
        }
    }
}

pub fn describe(status: ExitStatus) -> String {
    match (status.code(), status.signal()) {
        (Some(c), _) => format!("exited with status {c}"),
        (None, Some(9)) => "was killed by SIGKILL".to_string(),
        (None, Some(s)) => format!("was killed by signal {s}"),
        _ => status.to_string(),
    }
}

/// Runs one workload process per spec and returns their reports, in order. `oom_kills`
/// tells whether the kernel's OOM killer struck (then the error is `OomKilled`).
pub fn run_processes(
    engine: &str,
    specs: &[WorkerSpec],
    progress: &Progress,
    oom_kills: &dyn Fn() -> u64,
) -> Result<Vec<WorkerReport>, BenchError> {
    let exe = std::env::current_exe().map_err(|source| BenchError::Spawn { exe: "uswap".into(), source })?;
    let (tx, rx) = mpsc::channel::<(usize, Option<Event>)>();
    let mut procs = Procs(vec![]);
    for (i, spec) in specs.iter().enumerate() {
        let json = serde_json::to_string(spec).expect("plain data serialises");
        let mut child = Command::new(&exe)
            .arg("__workload")
            .arg("--spec")
            .arg(json)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .process_group(0)
            .spawn()
            .map_err(|source| BenchError::Spawn { exe: exe.clone(), source })?;
        let stdout = child.stdout.take().expect("piped");
        let mut err_pipe = child.stderr.take().expect("piped");
        let stderr = Arc::new(Mutex::new(String::new()));
        let tx = tx.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                let ev = serde_json::from_str(&line)
                    .unwrap_or_else(|_| Event::Error { message: format!("unexpected output: {line}") });
                if tx.send((i, Some(ev))).is_err() {
                    return;
                }
            }
            let _ = tx.send((i, None));
        });
        let sink = Arc::clone(&stderr);
        std::thread::spawn(move || {
            let mut s = String::new();
            let _ = err_pipe.read_to_string(&mut s);
            if let Ok(mut g) = sink.lock() {
                *g = s;
            }
        });
        procs.0.push(Proc {
            stdin: child.stdin.take(),
            child,
            stderr,
            stage: 0,
            eof: false,
            phase: Phase::Setup,
            done: 0,
            total: 0,
            report: None,
        });
    }
    drop(tx);
    let mut released = 0u8;
    loop {
        if interrupt::interrupted() {
            return Err(BenchError::Interrupted);
        }
        match rx.recv_timeout(Duration::from_millis(50)) {
            Ok((i, Some(ev))) => {
                let p = &mut procs.0[i];
                match ev {
                    Event::Ready => p.stage = p.stage.max(1),
                    Event::Progress { phase, done, total } => (p.phase, p.done, p.total) = (phase, done, total),
                    Event::Filled { .. } => p.stage = p.stage.max(2),
                    Event::Result { report } => {
                        p.stage = 3;
                        p.report = Some(*report);
                    }
                    Event::Error { message } => return Err(BenchError::Worker { engine: engine.to_string(), message }),
                }
            }
            Ok((i, None)) => {
                let p = &mut procs.0[i];
                p.eof = true;
                if p.stage < 3 {
                    let status =
                        p.child.wait().map(describe).unwrap_or_else(|e| format!("could not be waited for: {e}"));
                    // Let the stderr reader finish.
                    std::thread::sleep(Duration::from_millis(50));
                    let stderr = p.stderr.lock().map(|s| s.trim().to_string()).unwrap_or_default();
                    if oom_kills() > 0 {
                        return Err(BenchError::OomKilled { engine: engine.to_string(), attempts: 1 });
                    }
                    let tail: String = stderr
                        .lines()
                        .rev()
                        .take(10)
                        .collect::<Vec<_>>()
                        .into_iter()
                        .rev()
                        .collect::<Vec<_>>()
                        .join("\n");
                    let stderr = if tail.is_empty() { String::new() } else { format!("; its last words:\n{tail}") };
                    return Err(BenchError::WorkerDied { engine: engine.to_string(), status, stderr });
                }
            }
            Err(mpsc::RecvTimeoutError::Timeout) => {}
            Err(mpsc::RecvTimeoutError::Disconnected) => break,
        }
        // Barriers: release every process once all reached the stage.
        let min_stage = procs.0.iter().map(|p| p.stage).min().unwrap_or(3);
        while released < min_stage.min(2) {
            released += 1;
            for p in &mut procs.0 {
                if let Some(stdin) = p.stdin.as_mut() {
                    let _ = stdin.write_all(b"go\n").and_then(|_| stdin.flush());
                }
            }
        }
        let phase = procs.0.iter().map(|p| p.phase).min().unwrap_or(Phase::Done);
        let same: Vec<&Proc> = procs.0.iter().filter(|p| p.phase == phase).collect();
        progress.set(phase, same.iter().map(|p| p.done).sum(), same.iter().map(|p| p.total).sum());
        if procs.0.iter().all(|p| p.stage == 3 && p.eof) {
            break;
        }
    }
    let mut reports = vec![];
    for p in &mut procs.0 {
        let status = p.child.wait().map_err(|source| BenchError::Spawn { exe: exe.clone(), source })?;
        if !status.success() {
            return Err(BenchError::WorkerDied {
                engine: engine.to_string(),
                status: describe(status),
                stderr: String::new(),
            });
        }
        match p.report.take() {
            Some(r) => reports.push(r),
            None => {
                return Err(BenchError::Worker { engine: engine.to_string(), message: "no result reported".into() })
            }
        }
    }
    Ok(reports)
}
