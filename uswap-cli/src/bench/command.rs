//! `uswap bench --command "CMD ARGS"`: one unmodified program, timed under each engine with
//! the same `--limit`. uswap engines start it as `uswap run` does ([`crate::run::Launch`]: the
//! preload library in its environment, devices `zpool` unless named); the kernel engines put it
//! in the memory cgroup that [`super::kernel`] sets up around each run, with the kernel's swap
//! on zram or a swap file; `ram` runs it plainly. A run is timed from spawn to exit (wall
//! seconds); `--runs` repeats the engines interleaved (A, B, C, A, B, C, ...) so that drift in
//! the machine hits all of them alike, and the table shows medians with the speed against
//! `kernel-zram`.
//!
//! One program runs at a time, started from the main thread (its `PR_SET_PDEATHSIG` follows
//! the thread that forked it); helper threads only read its pipes and reap it. Invariants:
//! every engine runs the same argv; every program started is reaped (its process group killed
//! first on Ctrl-C) before the next one starts; its stdout is the same byte for byte under
//! every engine and run (compared by a hash of all of it, with the first bytes kept for the
//! message), else the bench stops with an error naming the two engines.

use std::ffi::{CString, OsString};
use std::hash::Hasher;
use std::io::Read;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode, ExitStatus, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use serde::Serialize;
use serde_json::Value;

use super::engine::{Engine, EngineKind, KernelSwap};
use super::error::BenchError;
use super::kernel::vmstat::Vmstat;
use super::kernel::{swapdev, KernelSitting};
use super::results::{median, median_index};
use super::table::{thousands, Table};
use super::{baseline_of, engines_of, failure_exit, interrupt, write_json, BenchArgs, Sitting, KERNEL_MIN_LIMIT_BYTES};
use crate::meminfo::Meminfo;
use crate::run::{Launch, LaunchConfig};
use crate::size::{format_amount, format_size};

/// uswap engines' devices when neither `@DEVICES` nor `--device` names them: the compressed
/// pool, the like-for-like match of kernel-zram.
pub const DEFAULT_DEVICE: &str = "zpool";
/// Bytes of stdout kept to show where two engines' outputs differ.
const HEAD_BYTES: usize = 64 << 10;
/// Bytes of stderr kept to show why a program failed.
const STDERR_TAIL_BYTES: usize = 4 << 10;
/// How long processes the program left behind may keep its stdout open after it exits.
const STRAY_WAIT: Duration = Duration::from_secs(2);

/// What one engine's runs came to, as `--json` writes it.
#[derive(Debug, Clone, Serialize)]
pub struct CommandResult {
    pub engine: String,
    /// The swap device(s): uswap's device list, `/dev/zram0 (lz4)`, the swap file, or none.
    pub device: Option<String>,
    pub command: Vec<String>,
    pub limit_bytes: Option<u64>,
    pub runs: u64,
    /// Median wall time over the runs.
    pub wall_seconds: f64,
    pub runs_wall_seconds: Vec<f64>,
    pub baseline: Option<String>,
    /// The baseline's median wall time over this engine's (above 1: faster).
    pub speed_vs_baseline: Option<f64>,
    /// Faults that waited for a swap device, in the median run: uswap's counter, the kernel
    /// cgroup's `memory.stat`, or the program's own (`ram`, from `getrusage`).
    pub pgmajfault: Option<u64>,
    /// Pages swapped in and out in the median run: uswap's counters, or `/proc/vmstat`'s
    /// deltas for the kernel engines (the swap is theirs alone during the run).
    pub pswpin: Option<u64>,
    pub pswpout: Option<u64>,
    /// The program's largest resident set (`getrusage` `ru_maxrss` of it and the children it
    /// waited for), in the median run. For uswap it includes the in-process compressed pool.
    pub rss_peak_bytes: u64,
    /// The most memory the limit counted at once in the median run: uswap's resident peak of
    /// managed pages over every process, or the kernel cgroup's peak charge (page cache
    /// included); none for `ram`.
    pub charged_peak_bytes: Option<u64>,
    /// The swap device's own peak memory in the median run, outside what the limit counts:
    /// zram's `mem_used_max` (compressed pages and its allocator's overhead; not in the
    /// cgroup's charge), or uswap's compressed pools' `pool_peak_bytes` (summed over the
    /// tree's processes; it lives in the program, so it is in the RSS peak too; 0 on a
    /// device with no pool). None for a swap file, which takes no memory of its own.
    pub swap_device_peak_bytes: Option<u64>,
    pub stdout_bytes: u64,
    /// Always true in a result: a difference stops the bench with an error.
    pub stdout_identical: bool,
    pub oom_kills: u64,
    /// Every counter of the median run: uswap's summed counters, or the vmstat deltas.
    pub stats: Value,
}

/// What one run of the program gave.
#[derive(Debug, Clone)]
struct Outcome {
    wall_seconds: f64,
    status: ExitStatus,
    rss_peak_bytes: u64,
    majflt: u64,
    stdout: Digest,
    stderr_tail: String,
}

/// One engine's run, with its counters.
#[derive(Debug, Clone)]
struct CommandRun {
    outcome: Outcome,
    device: Option<String>,
    pgmajfault: Option<u64>,
    pswpin: Option<u64>,
    pswpout: Option<u64>,
    charged_peak_bytes: Option<u64>,
    swap_device_peak_bytes: Option<u64>,
    stats: Value,
}

/// All of a stdout, by its size and hash, and its first bytes.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Digest {
    bytes: u64,
    hash: u64,
    head: Vec<u8>,
}

fn digest(mut r: impl Read) -> std::io::Result<Digest> {
    // `DefaultHasher::new` has fixed keys: the same bytes give the same hash every time.
    let mut h = std::hash::DefaultHasher::new();
    let (mut bytes, mut head) = (0u64, vec![]);
    let mut buf = vec![0u8; 64 << 10];
    loop {
        let n = match r.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        };
        h.write(&buf[..n]);
        bytes += n as u64;
        let keep = (HEAD_BYTES - head.len()).min(n);
        head.extend_from_slice(&buf[..keep]);
    }
    Ok(Digest { bytes, hash: h.finish(), head })
}

fn tail(mut r: impl Read) -> String {
    let mut all = vec![];
    let mut buf = vec![0u8; 16 << 10];
    loop {
        match r.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => {
                all.extend_from_slice(&buf[..n]);
                if all.len() > 2 * STDERR_TAIL_BYTES {
                    all.drain(..all.len() - STDERR_TAIL_BYTES);
                }
            }
        }
    }
    let from = all.len().saturating_sub(STDERR_TAIL_BYTES);
    String::from_utf8_lossy(&all[from..]).trim().to_string()
}

/// Where two outputs differ, in words.
fn difference(first: &str, a: &Digest, second: &str, b: &Digest) -> String {
    let sizes = format!("{first} printed {} bytes, {second} {} bytes", a.bytes, b.bytes);
    let common = a.head.iter().zip(&b.head).take_while(|(x, y)| x == y).count();
    let within = common < a.head.len().min(b.head.len()) || (a.head.len() != b.head.len() && a.bytes != b.bytes);
    if !within {
        return format!("{sizes}; the first {} bytes are the same", a.head.len().min(b.head.len()));
    }
    let line_no = a.head[..common].iter().filter(|&&c| c == b'\n').count() + 1;
    let start = a.head[..common].iter().rposition(|&c| c == b'\n').map_or(0, |p| p + 1);
    let line = |h: &[u8]| {
        let rest = &h[start.min(h.len())..];
        let end = rest.iter().position(|&c| c == b'\n').unwrap_or(rest.len()).min(200);
        String::from_utf8_lossy(&rest[..end]).into_owned()
    };
    format!("{sizes}; line {line_no} is {:?} under {first} but {:?} under {second}", line(&a.head), line(&b.head))
}

/// The program and its arguments, split as a shell would (no shell runs them).
pub fn parse_command(command: &str) -> Result<Vec<OsString>, BenchError> {
    let bad = |why: String| BenchError::CommandSyntax { command: command.to_string(), why };
    let words = shell_words::split(command).map_err(|e| bad(e.to_string()))?;
    if words.is_empty() {
        return Err(bad("it names no program".into()));
    }
    Ok(words.into_iter().map(OsString::from).collect())
}

/// A flag that shapes `uswap bench`'s own workload or engine, given with `--command`, which
/// runs the program as `uswap run` does (none of them applies there): taken and ignored
/// before, where an engine's `/ra-off` was refused.
fn workload_flag_given(args: &BenchArgs) -> Option<&'static str> {
    use super::{BackgroundArg, OnOff, Pattern, Verify};
    [
        ("--handler-threads", args.handler_threads.is_some()),
        ("--unpinned-handlers", args.unpinned_handlers),
        ("--background-reclaim", args.background_reclaim != BackgroundArg::Auto),
        ("--readahead", args.readahead == OnOff::Off),
        ("--readahead-max-pages", args.readahead_max_pages.is_some()),
        ("--readahead-async", args.readahead_async.is_some()),
        ("--file-poll-us", args.file_poll_us.is_some()),
        ("--threads", args.threads != 1),
        ("--procs", args.procs != 1),
        ("--seq-streams", args.seq_streams != 1),
        ("--pattern", args.pattern != Pattern::Random),
        ("--verify", args.verify != Verify::Index),
        ("--histogram", args.histogram),
    ]
    .into_iter()
    .find_map(|(flag, given)| given.then_some(flag))
}

/// Refuses what cannot run, before anything starts; returns where the program is.
fn validate(args: &BenchArgs, engines: &[Engine], argv: &[OsString]) -> Result<PathBuf, BenchError> {
    if let Some(flag) = workload_flag_given(args) {
        return Err(BenchError::CommandFlag { flag });
    }
    let mut uswap = false;
    for e in engines {
        match &e.kind {
            EngineKind::Uswap { readahead: Some(_), .. } => {
                return Err(BenchError::CommandEngine {
                    engine: e.name.clone(),
                    why: "uswap run has no readahead switch, so /ra-off and /ra-on cannot apply",
                })
            }
            EngineKind::Uswap { .. } => uswap = true,
            _ => {}
        }
    }
    if uswap {
        uswap::check_limit(args.limit)?;
    }
    if engines.iter().any(Engine::is_kernel) && args.limit < KERNEL_MIN_LIMIT_BYTES {
        return Err(BenchError::KernelLimitTooSmall {
            limit: format_size(args.limit),
            min: format_size(KERNEL_MIN_LIMIT_BYTES),
        });
    }
    baseline_of(args, engines)?;
    let path = crate::run::find_program(&argv[0])?;
    if uswap {
        // What `uswap run` would refuse (a static program, no preload library), refused now.
        crate::run::check_runnable(&path, 0)?;
        crate::run::find_preload()?;
    }
    Ok(path)
}

/// Waits for `pid` (not through `Child`, to get its resource usage), retrying on EINTR.
fn wait4(pid: libc::pid_t) -> std::io::Result<(ExitStatus, libc::rusage)> {
    loop {
        let mut status: libc::c_int = 0;
        // SAFETY: rusage is plain data that wait4 fills in; all zeroes is a valid value.
        let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
        // SAFETY: wait4 writes only through the two pointers, which point at our locals.
        let r = unsafe { libc::wait4(pid, &mut status, 0, &mut usage) };
        if r == pid {
            return Ok((ExitStatus::from_raw(status), usage));
        }
        let e = std::io::Error::last_os_error();
        if e.kind() != std::io::ErrorKind::Interrupted {
            return Err(e);
        }
    }
}

fn kill_group(pgid: libc::pid_t) {
    // SAFETY: kill(2) on the process group of a child we started (its own group, led by it)
    // whose members have not all been reaped, so the id is still theirs.
    unsafe { libc::kill(-pgid, libc::SIGKILL) };
}

/// Starts `cmd` (in `cgroup_procs`' cgroup when given) and waits for it, timing it from just
/// before the spawn to the moment it is reaped.
fn spawn_timed(engine: &str, cmd: &mut Command, cgroup_procs: Option<&Path>) -> Result<Outcome, BenchError> {
    let exe = PathBuf::from(cmd.get_program());
    let spawn_err = |source| BenchError::Spawn { exe: exe.clone(), source };
    let procs = match cgroup_procs {
        Some(p) => Some(CString::new(p.as_os_str().as_bytes()).map_err(|_| {
            BenchError::system("joining the memory cgroup", p, std::io::Error::other("path holds a NUL byte"))
        })?),
        None => None,
    };
    cmd.stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::piped()).process_group(0);
    // SAFETY: runs in the child between fork and exec, so it only makes async-signal-safe
    // system calls (prctl, open, write, close) on data made before the fork, and allocates
    // nothing (io::Error::last_os_error reads errno into a plain value).
    unsafe {
        cmd.pre_exec(move || {
            // Dies with the bench even if it is killed too hard to kill it.
            libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
            if let Some(p) = &procs {
                // "0" moves the writer itself (cgroup v1 and v2), before the program starts,
                // so everything it allocates and every process it starts is charged there.
                let fd = libc::open(p.as_ptr(), libc::O_WRONLY | libc::O_CLOEXEC);
                if fd < 0 {
                    return Err(std::io::Error::last_os_error());
                }
                let wrote = libc::write(fd, b"0".as_ptr().cast(), 1);
                let err = std::io::Error::last_os_error();
                libc::close(fd);
                if wrote != 1 {
                    return Err(err);
                }
            }
            Ok(())
        });
    }
    let start = Instant::now();
    let mut child = cmd.spawn().map_err(spawn_err)?;
    let pid = child.id() as libc::pid_t;
    let (stdout, stderr) = (child.stdout.take(), child.stderr.take());
    // Reaped by wait4 below; `Child` neither waits nor kills on drop.
    drop(child);
    let (out_tx, out_rx) = mpsc::channel();
    std::thread::spawn(move || {
        let _ = out_tx.send(stdout.map(digest).transpose());
    });
    let (err_tx, err_rx) = mpsc::channel();
    std::thread::spawn(move || {
        let _ = err_tx.send(stderr.map(tail).unwrap_or_default());
    });
    let (exit_tx, exit_rx) = mpsc::channel();
    std::thread::spawn(move || {
        let r = wait4(pid);
        let _ = exit_tx.send((r, Instant::now()));
    });
    let (waited, end) = loop {
        if interrupt::interrupted() {
            kill_group(pid);
            let _ = exit_rx.recv_timeout(Duration::from_secs(10));
            return Err(BenchError::Interrupted);
        }
        match exit_rx.recv_timeout(Duration::from_millis(50)) {
            Ok(v) => break v,
            Err(mpsc::RecvTimeoutError::Timeout) => {}
            Err(mpsc::RecvTimeoutError::Disconnected) => {
                return Err(spawn_err(std::io::Error::other("the thread waiting for the program died")))
            }
        }
    };
    let (status, usage) = waited.map_err(spawn_err)?;
    let wall_seconds = end.duration_since(start).as_secs_f64();
    let stdout = match out_rx.recv_timeout(STRAY_WAIT) {
        Ok(r) => r.map_err(spawn_err)?.unwrap_or(Digest { bytes: 0, hash: 0, head: vec![] }),
        Err(_) => {
            // Something it started still holds the pipe, so its group is still alive.
            kill_group(pid);
            return Err(BenchError::StrayProcesses { engine: engine.to_string(), seconds: STRAY_WAIT.as_secs() });
        }
    };
    let stderr_tail = err_rx.recv_timeout(STRAY_WAIT).unwrap_or_default();
    Ok(Outcome {
        wall_seconds,
        status,
        rss_peak_bytes: (usage.ru_maxrss.max(0) as u64) * 1024,
        majflt: usage.ru_majflt.max(0) as u64,
        stdout,
        stderr_tail,
    })
}

/// What every run of one invocation shares.
struct Plan<'a> {
    args: &'a BenchArgs,
    argv: Vec<OsString>,
    path: PathBuf,
    /// zram's disksize.
    zram_bytes: u64,
    /// The swap file's size.
    file_bytes: u64,
}

impl Plan<'_> {
    fn plain_command(&self) -> Command {
        // A script without `#!` runs under `/bin/sh`, as under `uswap run` and `execvp`.
        let mut c = match crate::run::shell_for(&self.path) {
            Some(shell) => {
                let mut c = Command::new(shell);
                c.arg(&self.path);
                c
            }
            None => {
                let mut c = Command::new(&self.path);
                c.arg0(&self.argv[0]);
                c
            }
        };
        c.args(&self.argv[1..]);
        c
    }
}

fn u64_of(v: &Value, k: &str) -> Option<u64> {
    v.get(k).and_then(Value::as_u64)
}

/// One run of the program under one engine.
fn run_engine(plan: &Plan, engine: &Engine, sitting: &mut Sitting) -> Result<CommandRun, BenchError> {
    let args = plan.args;
    match &engine.kind {
        EngineKind::Uswap { mode, devices, .. } => {
            let device = devices.clone().or_else(|| args.device.clone()).unwrap_or_else(|| DEFAULT_DEVICE.to_string());
            let cfg = LaunchConfig {
                limit_bytes: args.limit,
                device: device.clone(),
                fault_mode: (*mode).into(),
                min_size_bytes: crate::run::DEFAULT_MIN_SIZE_BYTES,
                start_after_bytes: None,
                idle_aging: uswap::IdleAging::Off,
                tier_age: None,
            };
            let mut launch = Launch::prepare(&plan.argv, &cfg)?;
            let outcome = spawn_timed(&engine.name, &mut launch.command, None)?;
            let stats = launch.summary();
            Ok(CommandRun {
                device: Some(device),
                pgmajfault: u64_of(&stats, "pgmajfault"),
                pswpin: u64_of(&stats, "pswpin"),
                pswpout: u64_of(&stats, "pswpout"),
                charged_peak_bytes: u64_of(&stats, "resident_peak_bytes"),
                swap_device_peak_bytes: u64_of(&stats, "pool_peak_bytes"),
                stats,
                outcome,
            })
        }
        EngineKind::Ram => {
            let before = Vmstat::read();
            let outcome = spawn_timed(&engine.name, &mut plan.plain_command(), None)?;
            let stats = Vmstat::read().delta(&before);
            Ok(CommandRun {
                device: None,
                pgmajfault: Some(outcome.majflt),
                pswpin: None,
                pswpout: None,
                charged_peak_bytes: None,
                swap_device_peak_bytes: None,
                stats,
                outcome,
            })
        }
        EngineKind::Kernel(kind) => {
            let sitting = sitting.kernel.as_mut().expect("the kernel sitting is opened before kernel engines run");
            let swap_bytes = match kind {
                KernelSwap::Zram => plan.zram_bytes,
                KernelSwap::File => plan.file_bytes,
            };
            let run = sitting.start(*kind, swap_bytes, args.limit, &args.swap_file_dir)?;
            let device = match kind {
                KernelSwap::Zram => format!("{} (lz4)", run.device()),
                KernelSwap::File => run.device(),
            };
            let procs = run.procs_path();
            let before = Vmstat::read();
            let outcome = spawn_timed(&engine.name, &mut plan.plain_command(), procs.as_deref());
            let stats = Vmstat::read().delta(&before);
            let (pgmajfault, peak, oom) = (run.memcg_stat("pgmajfault"), run.memcg_peak_bytes(), run.oom_kills());
            let swap_device_peak_bytes = run.zram_used_peak_bytes();
            // Torn down before any error is returned: nothing of this run outlives it.
            run.finish()?;
            let outcome = outcome?;
            // Whatever the exit status: in a pipeline (`sh -c 'xz ... | wc -c'`) the status
            // is the last command's, and a killed `xz` left `wc` to count a truncated
            // stream and exit 0. Such a run was taken as the kernel's time (0.98 s for a job
            // of 7 s) and its kill went uncounted.
            if oom > 0 {
                return Err(BenchError::OomKilled { engine: engine.name.clone(), attempts: 1 });
            }
            Ok(CommandRun {
                device: Some(device),
                pgmajfault: pgmajfault.or(Some(outcome.majflt)),
                pswpin: u64_of(&stats, "pswpin"),
                pswpout: u64_of(&stats, "pswpout"),
                charged_peak_bytes: peak,
                swap_device_peak_bytes,
                stats,
                outcome,
            })
        }
    }
}

/// The kernel engines' swap sizes, zram's and the swap file's: `--kernel-swap-size`, or half
/// the RAM, which is what `uswap run`'s zpool may grow to. zram's disksize is only an upper
/// bound, but a swap file is allocated whole, so without `--kernel-swap-size` it is cut to
/// half of what its file system has free (a small root file system must not fail a bench
/// whose program swaps far less than half the RAM); the cut is said.
fn swap_sizes(args: &BenchArgs, engines: &[Engine]) -> Result<(u64, u64), BenchError> {
    if let Some(bytes) = args.kernel_swap_size {
        return Ok((bytes, bytes));
    }
    let half_ram = (Meminfo::read().total_bytes / 2).max(MIN_SWAP_BYTES);
    if !engines.iter().any(|e| matches!(e.kind, EngineKind::Kernel(KernelSwap::File))) {
        return Ok((half_ram, half_ram));
    }
    // Half of what is free: the file is made again for every run, and the program and the
    // other engines write to the same file system in between.
    let room = swapdev::free_bytes(&args.swap_file_dir)?.saturating_sub(swapdev::SWAP_FILE_SPARE_BYTES) / 2;
    let file = room.clamp(MIN_SWAP_BYTES, half_ram);
    if file < half_ram {
        eprintln!(
            "kernel-file: a swap file of {} (half of what {} has free; half the RAM would be {}); \
             --kernel-swap-size sets it",
            format_amount(file),
            args.swap_file_dir.display(),
            format_amount(half_ram)
        );
    }
    Ok((half_ram, file))
}

/// The smallest swap the kernel engines get.
const MIN_SWAP_BYTES: u64 = 64 << 20;

/// Runs every engine `--runs` times, interleaved, checking the outputs agree. An engine
/// under which the program fails (a non-zero exit, a signal) is dropped from later runs and
/// its error returned beside the others' results, so one failing engine (signal mode's
/// `EFAULT` on a buffered write, say) does not hide the comparison of the rest; only when
/// every engine failed is the run an error.
pub fn run(
    args: &BenchArgs,
    command: &str,
    sitting: &mut Sitting,
) -> Result<(Vec<CommandResult>, Vec<BenchError>), BenchError> {
    let argv = parse_command(command)?;
    let mut engines = engines_of(args)?;
    let args = &super::with_local_redis(args, &mut engines, sitting)?;
    let path = validate(args, &engines, &argv)?;
    let kernel_engines: Vec<&Engine> = engines.iter().filter(|e| e.is_kernel()).collect();
    if !kernel_engines.is_empty() && sitting.kernel.is_none() {
        sitting.kernel = Some(KernelSitting::open(&kernel_engines, args.wait_lock)?);
    }
    let (zram_bytes, file_bytes) = swap_sizes(args, &engines)?;
    let plan = Plan { args, argv, path, zram_bytes, file_bytes };
    let mut runs: Vec<Vec<CommandRun>> = vec![vec![]; engines.len()];
    let mut oom_kills = vec![0u64; engines.len()];
    let mut reference: Option<(String, Digest)> = None;
    let mut failed: Vec<Option<BenchError>> = engines.iter().map(|_| None).collect();
    for r in 0..args.runs {
        for (e, engine) in engines.iter().enumerate() {
            if interrupt::interrupted() {
                return Err(BenchError::Interrupted);
            }
            if failed[e].is_some() {
                continue;
            }
            let label = format!("{} {}/{}", engine.name, r + 1, args.runs);
            let mut attempts = 0;
            let run = loop {
                let tlb_before = super::kernel::interrupts::tlb_shootdowns();
                match run_engine(&plan, engine, sitting) {
                    Ok(mut run) => {
                        super::kernel::interrupts::record_since(&mut run.stats, tlb_before);
                        break Some(run);
                    }
                    Err(BenchError::OomKilled { .. }) if attempts < args.oom_retries => {
                        attempts += 1;
                        eprintln!("{label}: the kernel's OOM killer ended the program; running it again");
                    }
                    Err(BenchError::OomKilled { engine, .. }) => {
                        // Killed on every try: the engine leaves the table and says so, and
                        // the others go on (that a program finishes under uswap and not
                        // under the kernel is a result of its own).
                        attempts += 1;
                        let err = BenchError::OomKilled { engine, attempts };
                        eprintln!("{label}: {err}\n{label}: going on without {}", engine_name(&err));
                        failed[e] = Some(err);
                        break None;
                    }
                    Err(e) => return Err(e),
                }
            };
            oom_kills[e] += attempts;
            let Some(run) = run else { continue };
            let o = &run.outcome;
            if !o.status.success() {
                let stderr = if o.stderr_tail.is_empty() {
                    String::new()
                } else {
                    format!("; its last words:\n{}", o.stderr_tail)
                };
                let err = BenchError::ProgramFailed {
                    engine: engine.name.clone(),
                    status: super::worker::describe(o.status),
                    stderr,
                };
                eprintln!("{label}: {err}\n{label}: going on without {}", engine.name);
                failed[e] = Some(err);
                continue;
            }
            match &reference {
                None => reference = Some((label.clone(), o.stdout.clone())),
                Some((first, d)) if d.hash != o.stdout.hash || d.bytes != o.stdout.bytes => {
                    return Err(BenchError::OutputDiffers {
                        first: first.clone(),
                        second: label.clone(),
                        detail: difference(first, d, &label, &o.stdout),
                    });
                }
                Some(_) => {}
            }
            eprintln!(
                "{label}: {:.3} s, major faults {}, pswpout {}",
                o.wall_seconds,
                run.pgmajfault.map_or("-".into(), |v| v.to_string()),
                run.pswpout.map_or("-".into(), |v| v.to_string())
            );
            runs[e].push(run);
        }
    }
    let failures: Vec<BenchError> = failed.into_iter().flatten().collect();
    if failures.len() == engines.len() {
        // Every engine failed: nothing to compare. The first engine's error says why.
        return Err(failures.into_iter().next().expect("at least one engine"));
    }
    let baseline = baseline_of(args, &engines)?;
    let walls: Vec<Vec<f64>> = runs.iter().map(|r| r.iter().map(|x| x.outcome.wall_seconds).collect()).collect();
    // No ratios against a baseline engine that failed.
    let base_wall = baseline
        .as_ref()
        .and_then(|b| engines.iter().position(|e| &e.name == b))
        .filter(|&i| !walls[i].is_empty())
        .map(|i| median(&walls[i]));
    let command: Vec<String> = plan.argv.iter().map(|a| a.to_string_lossy().into_owned()).collect();
    let results = engines
        .iter()
        .zip(runs)
        .zip(walls)
        .zip(oom_kills)
        .filter(|((_, runs), _)| !runs.is_empty())
        .map(|(((engine, runs), walls), oom_kills)| {
            let m = &runs[median_index(&walls)];
            let wall = median(&walls);
            CommandResult {
                engine: engine.name.clone(),
                device: m.device.clone(),
                command: command.clone(),
                limit_bytes: engine.is_limited().then_some(args.limit),
                runs: walls.len() as u64,
                wall_seconds: wall,
                runs_wall_seconds: walls,
                baseline: baseline.clone(),
                speed_vs_baseline: base_wall.filter(|_| wall > 0.0).map(|b| b / wall),
                pgmajfault: m.pgmajfault,
                pswpin: m.pswpin,
                pswpout: m.pswpout,
                rss_peak_bytes: m.outcome.rss_peak_bytes,
                charged_peak_bytes: m.charged_peak_bytes,
                swap_device_peak_bytes: m.swap_device_peak_bytes,
                stdout_bytes: m.outcome.stdout.bytes,
                stdout_identical: true,
                oom_kills,
                stats: m.stats.clone(),
            }
        })
        .collect();
    Ok((results, failures))
}

fn opt_count(v: Option<u64>) -> String {
    v.map_or("-".into(), |v| thousands(v as f64))
}

fn mib(bytes: u64) -> String {
    format!("{:.1} MiB", bytes as f64 / (1u64 << 20) as f64)
}

/// The results table.
pub fn table(results: &[CommandResult]) -> Table {
    let runs = results.iter().map(|r| r.runs).max().unwrap_or(1);
    let baseline = results.iter().find_map(|r| r.baseline.clone());
    let bname = match baseline.as_deref() {
        Some("kernel-zram") => "zram".to_string(),
        Some(b) => b.to_string(),
        None => "base".to_string(),
    };
    let wall = if runs > 1 { format!("wall s (median of {runs})") } else { "wall s".to_string() };
    let mut cols: Vec<(String, bool)> = vec![("engine".into(), false), ("device".into(), false), (wall, true)];
    if baseline.is_some() {
        cols.push((format!("×{bname}"), true));
    }
    for c in ["majflt", "pswpout", "TLB/majflt", "RSS peak", "charged peak", "device peak"] {
        cols.push((c.into(), true));
    }
    let rows = results
        .iter()
        .map(|r| {
            let mut row = vec![r.engine.clone(), r.device.clone().unwrap_or_else(|| "-".into())];
            row.push(format!("{:.3}", r.wall_seconds));
            if baseline.is_some() {
                row.push(r.speed_vs_baseline.map_or("-".into(), |s| format!("{s:.2}")));
            }
            row.push(opt_count(r.pgmajfault));
            row.push(opt_count(r.pswpout));
            row.push(super::kernel::interrupts::per_major_fault(&r.stats).map_or("-".into(), |x| format!("{x:.2}")));
            row.push(mib(r.rss_peak_bytes));
            row.push(r.charged_peak_bytes.map_or("-".into(), mib));
            row.push(r.swap_device_peak_bytes.map_or("-".into(), mib));
            row
        })
        .collect();
    let (headers, numeric) = cols.into_iter().unzip();
    Table { headers, rows, numeric }
}

pub fn print(args: &BenchArgs, results: &[CommandResult]) {
    let first = &results[0];
    println!(
        "uswap bench --command: {}, limit {}, {} run{}",
        shell_words::join(&first.command),
        format_size(args.limit),
        args.runs,
        if args.runs > 1 { "s each, interleaved (medians)" } else { "" }
    );
    print!("{}", table(results).to_text());
    match &first.baseline {
        Some(b) => println!("×: {b}'s wall time / the engine's (above 1: faster than {b})"),
        None => println!("(no ratios: add kernel-zram to --engines, or give --baseline)"),
    }
    println!("TLB/majflt: TLB shootdowns (/proc/interrupts, machine-wide) per major fault of the median run");
    println!(
        "charged peak: the most the limit counted at once; device peak: the swap device's own memory outside \
         it (zram's mem_used_max, uswap's compressed pool)"
    );
    println!("output: the same {} bytes under every engine and run", first.stdout_bytes);
    for r in results.iter().filter(|r| r.oom_kills > 0) {
        println!("note: {}: the kernel's OOM killer ended {} attempt(s), run again", r.engine, r.oom_kills);
    }
}

/// The engine an engine's failure names.
fn engine_name(e: &BenchError) -> &str {
    match e {
        BenchError::ProgramFailed { engine, .. } | BenchError::OomKilled { engine, .. } => engine.as_str(),
        _ => "?",
    }
}

/// `uswap bench --command`.
pub fn main(args: &BenchArgs, command: &str) -> ExitCode {
    let mut sitting = Sitting::default();
    let result = run(args, command, &mut sitting);
    drop(sitting);
    let (results, failures) = match result {
        Ok(r) => r,
        Err(e) => return failure_exit(e),
    };
    print(args, &results);
    if let Err(e) = write_json(args, &results) {
        return failure_exit(e);
    }
    // The engines that failed, after the others' table; the exit status says it (2).
    let failed: Vec<&str> = failures.iter().map(engine_name).collect();
    if !failed.is_empty() {
        println!("failed, so not in the table (why: on stderr): {}", failed.join(", "));
    }
    for e in &failures {
        eprintln!("uswap bench: {e}");
    }
    if failures.is_empty() {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(2)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn commands_split_as_a_shell_would() {
        let argv = parse_command(r#"sort -S 64M "my file.txt" 'a b' c\ d"#).unwrap();
        assert_eq!(argv, ["sort", "-S", "64M", "my file.txt", "a b", "c d"].map(OsString::from));
        let e = parse_command("sort 'unclosed").unwrap_err().to_string();
        assert!(e.contains("--command") && e.contains("quote"), "{e}");
        assert!(parse_command("   ").unwrap_err().to_string().contains("names no program"));
    }

    #[test]
    fn digests_keep_the_size_and_the_head_and_tell_outputs_apart() {
        let big: Vec<u8> = (0..200_000u32).flat_map(|i| format!("{i}\n").into_bytes()).collect();
        let a = digest(&big[..]).unwrap();
        assert_eq!(a.bytes, big.len() as u64);
        assert_eq!(a.head, big[..HEAD_BYTES]);
        assert_eq!(a, digest(&big[..]).unwrap());
        let mut other = big.clone();
        *other.last_mut().unwrap() = b'x';
        let b = digest(&other[..]).unwrap();
        assert_ne!(a.hash, b.hash, "a difference past the head still changes the hash");
        let d = difference("ram 1/1", &a, "uswap-thread 1/1", &b);
        assert!(d.contains("the first 65536 bytes are the same"), "{d}");
        let c = digest(&b"1\n2\npid 42\n"[..]).unwrap();
        let e = digest(&b"1\n2\npid 43\n"[..]).unwrap();
        let d = difference("ram 1/1", &c, "kernel-zram 1/1", &e);
        assert!(d.contains(r#"line 3 is "pid 42" under ram 1/1 but "pid 43" under kernel-zram 1/1"#), "{d}");
    }
}
