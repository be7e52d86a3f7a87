//! `uswap run`: an unmodified program, with its anonymous memory paged by uswap under a limit.
//!
//! The program is started with the first stage, `libuswap_shim.so`, in `LD_PRELOAD` and its
//! configuration in `USWAP_*` variables (see the preload library's `config` module); every
//! process it starts inherits both, so children exec'd by it are managed too. The first stage
//! loads the preload library, `libuswap_preload.so` beside it, in a process that needs a
//! pager (`uswap-shim`'s doc). Each process writes its final counters
//! into a private directory; when the program ends, `uswap run` sums them (`--stats-json`,
//! or one line on stderr) and exits with the program's status (128+N for a signal N).
//!
//! What cannot work is refused before the program starts, with exit status 2: a program that
//! is not found or not executable, a statically linked one (it never loads a preloaded
//! library), a missing preload library, a userfaultfd this user may not open in the fault
//! mode asked for (`uswap::check_userfaultfd`).

use std::ffi::OsString;
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use clap::Args;

use crate::size::{format_size, parse_size};

/// `eprintln!` that cannot fail: `uswap run` exits with its program's status also when its
/// own stderr is closed, full, or a pipe whose reader left (`uswap run -- make 2>&1 | head`);
/// `eprintln!` panicked there, and the run ended with status 101.
macro_rules! say {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        let _ = writeln!(std::io::stderr(), $($arg)*);
    }};
}

mod as_given;
mod auto;
mod dir;
mod error;
mod program;
mod records;
mod sanitizer;
mod signals;
mod swap_files;
mod tree;
mod warnings;

pub use error::{RunError, ENV_PRELOAD_LIB, PRELOAD_LIB, SHIM_LIB};
use program::SHELL_FOR_SCRIPTS;
pub use program::{check_runnable, find_program, shell_for, Runnable};
use signals::{hold_forwarded_signals, stopped_by, ForwardSignals, IgnoreTerminalSignals};
use swap_files::{
    absolute_file_devices, erase_swap_files, remove_made_swap_files, rewrite_devices, swap_files_to_create,
};

use records::{children_rss_peak_bytes, record_paths, record_pid, serve_tree_stats, summarize, summary_line};
use warnings::{
    ended_by_signal_message, overrun_message, scans_without_memory_message, thrash_message, unmanaged_in,
    unmanaged_message, Moment, Unmanaged, UNMANAGED_SHARE_DIVISOR,
};

/// `--min-size`'s default, in bytes (as the preload library's own default).
pub const DEFAULT_MIN_SIZE_BYTES: u64 = 16 << 10;

/// `--start-after` under `--auto` when not given: its limit moves, and a process waiting for
/// its pager cannot follow it down. Otherwise the preload library's own default (a
/// sixteenth of the limit, also the most it takes).
const AUTO_START_AFTER_BYTES: u64 = 16 << 20;

#[derive(Debug, Args)]
pub struct RunArgs {
    /// Resident limit for the program and every process it starts (default 1GiB; with
    /// `--auto`, the ceiling, by default the machine's memory).
    #[arg(long, value_parser = parse_size)]
    pub limit: Option<u64>,
    /// Move the tree's limit by itself to the smallest that keeps its memory stalls (the
    /// share of wall time some thread waits on memory) under TARGET: `1%` (the default),
    /// `0.5%`, or a share such as `0.02`. `--limit` is then the ceiling.
    #[arg(long, value_name = "TARGET", num_args = 0..=1, default_missing_value = "1%", value_parser = uswap::budget::parse_target)]
    pub auto: Option<f64>,
    /// Idle aging: every process's pager tests its resident pages for use a few at a time
    /// (each once in 10 to 40 s); a page untouched for AGE (`120s`, `2m`) is sent to the
    /// first device without waiting for the limit, and down a tier after AGE again (1 s to
    /// a year). `never` only counts idle memory (`uswap stat`'s idle line), as `--auto` does
    /// by default; `off` (or `0`) turns aging off, `--auto`'s counting too.
    #[arg(long, value_name = "AGE", value_parser = uswap::IdleAging::parse)]
    pub idle_age: Option<uswap::IdleAging>,
    /// Pages out of RAM for AGE (`30s`, `2m`; 1 s to a year) without a touch move down a
    /// tier, off the fault path: with `--device zpool,zpool:zstd-1` an lz4 pool's cold pages
    /// are recompressed into the zstd pool below it (`zpool:zstd-1:unit=16KiB`: 16 KiB at a
    /// time); with a file or Redis device after a pool, written there. With `--auto` and any `--idle-age` (default: twice an idle age
    /// that sends pages out, never otherwise). Needs two devices or more.
    #[arg(long, value_name = "AGE", value_parser = uswap::parse_tier_age)]
    pub tier_age: Option<std::time::Duration>,
    /// Swap devices, as for `uswap bench --device` (default: a compressed pool).
    #[arg(long, default_value = "zpool")]
    pub device: String,
    /// How faults are served: by the faulting thread in a SIGBUS handler (`signal`, faster;
    /// the C library's system calls bring in the managed memory they touch first), by handler
    /// threads (`thread`: memory the kernel touches outside a call, io_uring's or a KVM
    /// guest's, needs it), or `auto`: signal, except for processes that link libaio, liburing
    /// or an MPI library, are QEMU with KVM, or are followed by a debugger (said on stderr).
    #[arg(long, value_enum, default_value = "auto")]
    pub fault_mode: RunFaultMode,
    /// Anonymous mappings smaller than this stay ordinary memory (the heap is managed but for
    /// its first blocks, up to 2 MiB, see `--start-after`).
    #[arg(long, default_value = "16KiB", value_parser = parse_size)]
    pub min_size: u64,
    /// A process's pager starts once its heap and its own anonymous mappings pass SIZE
    /// (at most a sixteenth of the limit, which is the default; with `--auto` the default is 16 MiB), at its
    /// first mapping of at least `--min-size` placed by the program, shared or reserved, or
    /// at its first thread, whichever comes first: the shells, compilers of
    /// small files and other short processes of a tree, and programs far below the limit,
    /// run at plain speed until then. Past 16 MiB a waiting process's heap is charged to the
    /// tree, and once the tree's charge is at half the limit each such process starts its
    /// pager when its heap next grows. A process's first blocks (up to 2 MiB, at most a
    /// quarter of SIZE) stay in the C library's malloc, outside the budget for good. `0`:
    /// every process builds its pager before its `main`.
    #[arg(long, value_name = "SIZE", value_parser = parse_size)]
    pub start_after: Option<u64>,
    /// Write the summed counters as JSON here when the program ends.
    #[arg(long)]
    pub stats_json: Option<PathBuf>,
    /// Fail (exit status 2, the tree killed) as soon as the tree's anonymous memory that uswap
    /// does not manage passes 10 % of the limit, and (exit status 2 at the end) when a
    /// process of the tree ran outside the budget (a static or set-user-ID program, or one
    /// whose environment lost LD_PRELOAD). Without it, both are reported on exit.
    #[arg(long)]
    pub strict: bool,
    /// The program and its arguments.
    #[arg(required = true, trailing_var_arg = true, allow_hyphen_values = true, value_name = "CMD")]
    pub command: Vec<OsString>,
}

pub fn main(args: &RunArgs) -> ExitCode {
    match run(args) {
        Ok(code) => ExitCode::from(code),
        Err(e) => {
            say!("uswap run: {e}");
            ExitCode::from(e.exit_status())
        }
    }
}

/// The preload library: `$USWAP_PRELOAD_LIB`, or next to this executable (a build tree), or
/// in `../lib/uswap/` from it (where `install.sh` puts it).
pub fn find_preload() -> Result<PathBuf, RunError> {
    if let Some(p) = std::env::var_os(ENV_PRELOAD_LIB) {
        let lib = PathBuf::from(p);
        if !lib.is_file() {
            return Err(RunError::NoPreloadLib { lib });
        }
        return Ok(lib);
    }
    let exe = std::env::current_exe().unwrap_or_else(|_| PathBuf::from("uswap"));
    let dir = exe.parent().map(Path::to_path_buf).unwrap_or_default();
    let installed = dir.join("../lib/uswap").join(PRELOAD_LIB);
    // Test binaries live one level down, in target/<profile>/deps.
    for cand in [dir.join(PRELOAD_LIB), installed, dir.join("..").join(PRELOAD_LIB)] {
        if cand.is_file() {
            return Ok(cand);
        }
    }
    Err(RunError::NoPreload { exe })
}

/// Whether the dynamic loader would split `path` if `LD_PRELOAD` named it: it splits the
/// variable at every space and colon, and has no way to quote them.
fn splits_in_ld_preload(path: &Path) -> bool {
    path.as_os_str().as_encoded_bytes().iter().any(|&b| b == b' ' || b == b':')
}

/// The first stage beside the preload library `preload`: what `LD_PRELOAD` names, and what
/// loads `preload` from its own directory in a process that needs a pager (`uswap-shim`).
/// The first stage loads that file name (`PRELOAD_LIB`) from its directory, so `preload`
/// must be named so (a link of another name is resolved first).
fn shim_beside(preload: &Path) -> Result<PathBuf, RunError> {
    let shim = preload.with_file_name(SHIM_LIB);
    match shim.is_file() && preload.file_name().is_some_and(|n| n == PRELOAD_LIB) {
        true => Ok(shim),
        false => Err(RunError::NoShim { preload: preload.to_path_buf() }),
    }
}

/// The name `LD_PRELOAD` gives the first stage at `shim`: its own path, or for libraries
/// installed under a path the loader would split (a virtual environment in "My Project",
/// a home directory with a space), a link to it in the run's directory `run_dir`, which
/// lives as long as the run, with a link to the preload library `preload` beside it (the
/// first stage loads the one in its own directory).
fn preload_for_env(shim: &Path, preload: &Path, run_dir: &Path) -> Result<PathBuf, RunError> {
    if !splits_in_ld_preload(shim) {
        return Ok(shim.to_path_buf());
    }
    let link = run_dir.join(SHIM_LIB);
    let err = |source| RunError::PreloadPath { path: shim.to_path_buf(), source };
    if splits_in_ld_preload(&link) {
        return Err(err(std::io::Error::other(format!("{} has one too", run_dir.display()))));
    }
    std::os::unix::fs::symlink(shim, &link).map_err(err)?;
    std::os::unix::fs::symlink(preload, run_dir.join(PRELOAD_LIB)).map_err(err)?;
    Ok(link)
}

/// The program dies with `uswap run` when `uswap run` is killed by a signal it cannot
/// forward (SIGKILL: `timeout -s KILL`, the OOM killer, a supervisor's last resort), as it
/// would have died run without uswap; before, it ran on with no one to wait for it. The
/// rest of its tree goes on, as without uswap.
fn die_with_parent(command: &mut std::process::Command) {
    let parent = std::process::id();
    // SAFETY: runs in the child between fork and exec: prctl and getppid only, on plain
    // values copied before the fork; nothing allocated (the error is a plain value).
    unsafe {
        command.pre_exec(move || {
            libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
            // Killed between the fork and the prctl: the program is not started at all.
            if libc::getppid() as u32 != parent {
                return Err(std::io::Error::from_raw_os_error(libc::ESRCH));
            }
            Ok(())
        });
    }
}

/// A program ready to start under uswap: its command, with the preload library and the
/// configuration in its environment, and the directory its processes write their counters
/// into (removed on drop). `uswap run` and `uswap bench --command` both start programs this way.
pub struct Launch {
    /// The program and its environment; the caller adds stdio, a process group, and spawns it.
    pub command: std::process::Command,
    /// Where the program was found.
    pub path: PathBuf,
    /// The tree's directory (`USWAP_STATS_DIR`), inside `run_dir`.
    stats_dir: PathBuf,
    /// The run's directory, removed on drop.
    run_dir: PathBuf,
    /// The run's lock in `run_dir`, held while the run lives (see `dir`).
    _run_lock: std::fs::File,
    segment: uswap::shared_charge::ChargeSegment,
    limit_bytes: u64,
    /// Each Redis device's seeds and the session its keys are under, deleted on drop.
    /// Redis devices' seeds, whether they are a cluster's, and the run's session on them.
    redis_sessions: RedisSessions,
}

/// The tree's charge segment in its directory `stats_dir`, open to the processes of the tree
/// that change user when the tree's directory is (see `dir`).
fn create_segment(stats_dir: &Path, limit_bytes: u64) -> std::io::Result<uswap::shared_charge::ChargeSegment> {
    use std::os::unix::fs::PermissionsExt;
    let path = stats_dir.join(uswap::shared_charge::SEGMENT_FILE);
    let segment = uswap::shared_charge::ChargeSegment::create(&path, limit_bytes)?;
    if dir::shared_with_other_users() {
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o666))?;
    }
    Ok(segment)
}

/// Gives every Redis device of a device list the session `session`: every process of the
/// program then keys its pages under it, and the run deletes them all once the program has
/// ended (a process that exits does not drop its pager).
fn with_redis_session(devices: &str, session: &str) -> String {
    rewrite_devices(devices, |t| {
        if !t.starts_with("redis://") && !t.starts_with("redis-cluster://") {
            return None;
        }
        let (body, suffix) = match t.strip_suffix(":cluster") {
            Some(b) => (b, ":cluster"),
            None => (t, ""),
        };
        let sep = if body.contains('?') { '&' } else { '?' };
        Some(format!("{body}{sep}session={session}{suffix}"))
    })
}

/// `uswap run --fault-mode`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum RunFaultMode {
    /// Signal mode, unless the process needs thread mode (decided in each process).
    Auto,
    /// Handler threads serve every fault; the kernel waits for a fault wherever it takes it.
    Thread,
    /// The faulting thread serves its own fault, in a SIGBUS handler.
    Signal,
}

impl RunFaultMode {
    /// The value of `USWAP_FAULT_MODE` that the preload library reads.
    fn env_value(self) -> &'static str {
        match self {
            RunFaultMode::Auto => "auto",
            RunFaultMode::Thread => "thread",
            RunFaultMode::Signal => "signal",
        }
    }
}

/// How `uswap run` manages a program.
#[derive(Debug, Clone)]
pub struct LaunchConfig {
    pub limit_bytes: u64,
    pub device: String,
    pub fault_mode: RunFaultMode,
    pub min_size_bytes: u64,
    /// `--start-after`: the heap a process may use before its pager starts (0: before `main`;
    /// none: the preload library's default).
    pub start_after_bytes: Option<u64>,
    pub idle_aging: uswap::IdleAging,
    /// `--tier-age` (`None`: the pager's default).
    pub tier_age: Option<std::time::Duration>,
}

/// `USWAP_IDLE_AGE`'s value for an aging (`None`: left unset, off).
fn idle_age_env(aging: uswap::IdleAging) -> Option<String> {
    match aging {
        uswap::IdleAging::Off => None,
        uswap::IdleAging::Observe => Some("never".into()),
        uswap::IdleAging::Evict(age) => Some(format!("{}s", age.as_secs_f64())),
    }
}

/// Each Redis store of a run: its seeds, whether it is a cluster, and the run's session.
type RedisSessions = Vec<(Vec<String>, bool, String)>;

/// The Redis devices of `devices` given one session for the run, so that its keys can be
/// deleted after it: the device list to hand the program, and its stores.
fn redis_sessions(devices: &str) -> Result<(String, RedisSessions), RunError> {
    let mut sessions = Vec::new();
    if !devices.split(',').any(|d| d.trim().starts_with("redis://") || d.trim().starts_with("redis-cluster://")) {
        return Ok((devices.to_string(), sessions));
    }
    let session = uswap::backend::redis::new_session_id().map_err(RunError::RedisSession)?;
    let devices = with_redis_session(devices, &session);
    for d in uswap::DeviceConfig::parse_list(&devices, 1 << 30).unwrap_or_default() {
        if let Some(o) = d.redis_opts() {
            sessions.push((o.seeds.clone(), o.cluster, session.clone()));
        }
    }
    Ok((devices, sessions))
}

/// What `uswap run` starts: the program itself, or a script without `#!` run by the shell
/// as `execvp` would (`/bin/sh PATH ARGS...`).
enum ProgramCommand<'a> {
    Program { path: &'a Path, arg0: &'a OsString },
    Script { path: &'a Path },
}

/// The environment the program gets besides its own.
struct ProgramEnv<'a> {
    ld_preload: OsString,
    /// Sanitizer runtimes put in front of uswap's library (`sanitizer`), if any.
    sanitizers_added: Option<OsString>,
    /// The device list, with Redis devices' sessions.
    device: &'a str,
    stats_dir: &'a Path,
}

/// The command that starts the program with uswap's library preloaded and its configuration
/// in the environment (every `USWAP_*` variable set or removed, never inherited as it was).
fn program_command(
    program: ProgramCommand,
    args: &[OsString],
    env: &ProgramEnv,
    cfg: &LaunchConfig,
) -> std::process::Command {
    let mut command = match program {
        ProgramCommand::Program { path, arg0 } => {
            let mut c = std::process::Command::new(path);
            c.arg0(arg0);
            c
        }
        ProgramCommand::Script { path } => {
            let mut c = std::process::Command::new(SHELL_FOR_SCRIPTS);
            c.arg(path);
            c
        }
    };
    command
        .args(args)
        .env("LD_PRELOAD", &env.ld_preload)
        .env_remove(sanitizer::ENV_ADDED)
        .env("USWAP_LIMIT", cfg.limit_bytes.to_string())
        .env("USWAP_DEVICE", env.device)
        .env("USWAP_FAULT_MODE", cfg.fault_mode.env_value())
        .env("USWAP_MIN_SIZE", cfg.min_size_bytes.to_string())
        .env(tree::ENV_STATS_DIR, env.stats_dir)
        .env_remove("USWAP_START_AFTER")
        .env_remove("USWAP_IDLE_AGE")
        .env_remove("USWAP_TIER_AGE")
        .env_remove("USWAP_DISABLE");
    if let Some(bytes) = cfg.start_after_bytes {
        command.env("USWAP_START_AFTER", bytes.to_string());
    }
    if let Some(age) = idle_age_env(cfg.idle_aging) {
        command.env("USWAP_IDLE_AGE", age);
    }
    if let Some(age) = cfg.tier_age {
        command.env("USWAP_TIER_AGE", format!("{}s", age.as_secs_f64()));
    }
    if let Some(added) = &env.sanitizers_added {
        command.env(sanitizer::ENV_ADDED, added);
    }
    die_with_parent(&mut command);
    command
}

impl Launch {
    /// Checks that `argv` can be run under uswap (found, dynamically linked, the preload
    /// library present) and prepares it; nothing is started yet.
    pub fn prepare(argv: &[OsString], cfg: &LaunchConfig) -> Result<Launch, RunError> {
        let name = &argv[0];
        let path = find_program(name)?;
        let runnable = check_runnable(&path, 0)?;
        let preload = find_preload()?;
        // A device list that does not parse, a file device's path that cannot be used and a
        // Redis server that does not answer are said once, here, rather than by every
        // process once its pager starts, after some of the program's work. With the default
        // size the processes give a device without one (half the RAM), not the limit: under
        // `--limit 8TiB` the default pool's cap was taken for 8 TiB and refused.
        let default_capacity_bytes = uswap::DeviceConfig::default_capacity_bytes();
        let devices = uswap::DeviceConfig::parse_list(&cfg.device, default_capacity_bytes).map_err(RunError::Device)?;
        for d in &devices {
            d.check_usable().map_err(RunError::Device)?;
        }
        if cfg.tier_age.is_some() {
            uswap::check_tier_below(&devices).map_err(RunError::TierAge)?;
        }
        // Before the run's directory is made, which an error here would leave behind.
        let (device, redis_sessions) = redis_sessions(&cfg.device)?;
        let preload = std::fs::canonicalize(&preload).unwrap_or(preload);
        let shim = shim_beside(&preload)?;
        let run_dir = dir::make().map_err(RunError::StatsDir)?;
        let preload = match preload_for_env(&shim, &preload, &run_dir.run) {
            Ok(p) => p,
            Err(e) => {
                let _ = std::fs::remove_dir_all(&run_dir.run);
                return Err(e);
            }
        };
        let stats_dir = run_dir.tree.clone();
        // One budget for the whole tree: every process's pager charges this segment too.
        let segment = match create_segment(&stats_dir, cfg.limit_bytes) {
            Ok(s) => s,
            Err(e) => {
                let _ = std::fs::remove_dir_all(&run_dir.run);
                return Err(RunError::StatsDir(e));
            }
        };
        // uswap's library first, but for sanitizers' runtimes, which must be (see `sanitizer`).
        let user_preload = std::env::var_os("LD_PRELOAD");
        let image = matches!(runnable, Runnable::Program).then_some(path.as_path());
        let (ld_preload, sanitizers_added) = sanitizer::ld_preload(&preload, user_preload.as_deref(), image);
        let program = match runnable {
            Runnable::Program => ProgramCommand::Program { path: &path, arg0: name },
            Runnable::ShellScript => ProgramCommand::Script { path: &path },
        };
        let env = ProgramEnv { ld_preload, sanitizers_added, device: &device, stats_dir: &stats_dir };
        let command = program_command(program, &argv[1..], &env, cfg);
        Ok(Launch {
            command,
            path,
            stats_dir,
            run_dir: run_dir.run,
            _run_lock: run_dir.lock,
            segment,
            limit_bytes: cfg.limit_bytes,
            redis_sessions,
        })
    }

    /// Processes of the program outlive it: their pages on Redis devices stay (deleting them
    /// would lose their memory); said, with the keys to delete once they end.
    pub fn keep_redis_pages(&mut self) {
        for (seeds, _, session) in self.redis_sessions.drain(..) {
            say!(
                "uswap run: their pages on redis://{} stay: delete the keys uswap:{session}.* once they end",
                seeds.join(";")
            );
        }
    }

    /// The counters of every process of the program, summed (call once it has ended).
    pub fn summary(&self) -> serde_json::Value {
        summarize(&self.stats_dir, self.limit_bytes, &self.segment)
    }
}

impl Drop for Launch {
    fn drop(&mut self) {
        // No record: no pager ever started (a device it could not reach), so no page can be
        // on a Redis device, and failing to reach it again is no news.
        let any_pager = record_paths(&self.stats_dir).next().is_some();
        // Processes that outlive the program write their records until they end: one that
        // writes while the directory is being removed leaves it non-empty, so try again.
        for _ in 0..5 {
            if std::fs::remove_dir_all(&self.run_dir).is_ok() || !self.run_dir.exists() {
                break;
            }
        }
        for (seeds, cluster, session) in &self.redis_sessions {
            // A run stopped by a signal ends within a second, whatever the store is doing.
            let within = if stopped_by().is_some() {
                std::time::Duration::from_millis(500)
            } else {
                std::time::Duration::from_secs(30)
            };
            let deleted = uswap::backend::redis::delete_session(seeds, *cluster, session, within);
            if let (Err(e), true) = (deleted, any_pager) {
                let scheme = if *cluster { "redis-cluster" } else { "redis" };
                say!(
                    "uswap run: could not delete the program's pages from {scheme}://{}: {e}; delete the keys \
                     uswap:{session}.* by hand",
                    seeds.join(";")
                );
            }
        }
    }
}

/// The limit without `--limit`.
const DEFAULT_LIMIT_BYTES: u64 = 1 << 30;

fn run(args: &RunArgs) -> Result<u8, RunError> {
    let cfg = checked_config(args)?;
    let (limit, device) = (cfg.limit_bytes, cfg.device.clone());
    // Before anything is made or started: a supervisor's SIGTERM that came while the program
    // was being started killed `uswap run` and left the program's tree running on its own.
    let mut forwarded = ForwardSignals::new();
    let started = std::time::Instant::now();
    let prepared = Launch::prepare(&args.command, &cfg);
    if let Some(code) = stopped_before_start(&prepared) {
        return Ok(code);
    }
    let mut launch = prepared?;
    // The program's standard descriptors are `uswap run`'s own (inherited).
    as_given::give_the_program_what_was_given(&mut launch.command);
    let created_swap_files = swap_files_to_create(&device, limit);
    let mut child = match launch.command.spawn() {
        Ok(child) => child,
        Err(source) => {
            remove_made_swap_files(&created_swap_files);
            return Err(RunError::Spawn { path: launch.path.clone(), source });
        }
    };
    forwarded.forward_to(child.id());
    // `uswap stat <this pid>` shows the tree's counters, summed from what every process
    // publishes (each also answers for itself under its own pid). Best effort: the program
    // runs the same without it.
    let _tree_stats = serve_tree_stats(&launch.stats_dir, launch.segment.charge());
    // A terminal's Ctrl-C goes to the whole foreground group: the program decides what to do
    // with it, and we wait for it to finish (as `time` does). Ignored only after the spawn:
    // an ignored signal stays ignored across exec.
    let _ignored = IgnoreTerminalSignals::new();
    let budget = args.auto.map(|target| auto::TreeBudget::start(launch.segment.charge(), target, limit));
    let status = match wait_for_program(args, &mut child, &launch, limit)? {
        Some(status) => status,
        None => {
            // `--strict` and the limit did not hold: nothing goes to its pid once it is
            // reaped; the clean-up runs with terminal signals still ignored.
            drop(forwarded);
            kill_tree(&mut child, &launch.stats_dir);
            hold_forwarded_signals();
            drop(launch);
            erase_swap_files(&device, limit, &created_swap_files);
            return Ok(2);
        }
    };
    // Reaped: its pid may be anyone's now.
    drop(forwarded);
    let tree_ended = stopped_by().is_some();
    if tree_ended {
        end_stopped_tree(&launch, child.id());
    } else {
        tree::wait_for_ending(&launch.stats_dir, &launch.segment.live_pids(), child.id());
    }
    // Before the segment it moves goes with `launch`.
    let auto_limit_bytes = budget.map(auto::TreeBudget::stop);
    let mut ended = EndedRun::collect(&launch);
    // A stop that came while the counters were read ends the tree all the same. From here on
    // a late signal waits (`hold_forwarded_signals`): it would interrupt a Redis device's
    // replies during the deletion of the run's keys.
    hold_forwarded_signals();
    if !tree_ended && stopped_by().is_some() {
        end_stopped_tree(&launch, child.id());
    }
    if say_outliving(&launch, child.id()) {
        launch.keep_redis_pages();
    }
    drop(launch);
    erase_swap_files(&device, limit, &created_swap_files);
    ended.add_run_figures(started.elapsed(), auto_limit_bytes.zip(args.auto));
    ended.say(args, status, limit)
}

/// The exit status when a stop came while the run was prepared (a Redis device's checks take
/// seconds, and the signal interrupts them): the program is not started only to be
/// signalled, and the stop, not an interrupted check, is what is said.
fn stopped_before_start(prepared: &Result<Launch, RunError>) -> Option<u8> {
    let sig = stopped_by()?;
    // What failed meanwhile may be more than the interrupted check (no such program).
    if let Err(e) = prepared {
        say!("uswap run: {e}");
    }
    say!("uswap run: stopped by signal {sig} before the program started; it was not started");
    Some(128u8.wrapping_add(sig as u8))
}

/// The run's configuration from its arguments, with what can be found out before the
/// program starts found out: a limit too small, a `--stats-json` file that cannot be
/// written, a userfaultfd this user may not open.
fn checked_config(args: &RunArgs) -> Result<LaunchConfig, RunError> {
    let limit = match (args.limit, args.auto) {
        (Some(l), _) => l,
        (None, Some(_)) => crate::meminfo::Meminfo::read().total_bytes.max(DEFAULT_LIMIT_BYTES),
        (None, None) => DEFAULT_LIMIT_BYTES,
    };
    if limit < uswap::MIN_LIMIT_BYTES {
        return Err(RunError::LimitTooSmall { limit_bytes: limit });
    }
    if limit > uswap::MAX_LIMIT_BYTES {
        return Err(RunError::LimitTooLarge { limit_bytes: limit });
    }
    say_if_nested(limit);
    if let Some(p) = &args.stats_json {
        // Found out now, not after the program ran; an existing file keeps what it holds
        // until the counters replace it.
        check_writable(p).map_err(|source| RunError::WriteStats { path: p.clone(), source })?;
    }
    // Found out before the program starts, not when each of its processes is refused a
    // pager (a server refused one after an hour's run, and the run failed only then). For
    // the mode asked for, as this user: a process that changes user, or one that auto mode
    // puts in thread mode (it links liburing), can still be refused, and is said then.
    let thread_mode = args.fault_mode == RunFaultMode::Thread;
    uswap::check_userfaultfd(thread_mode).map_err(|source| RunError::Userfaultfd { thread_mode, source })?;
    Ok(LaunchConfig {
        limit_bytes: limit,
        device: absolute_file_devices(&args.device),
        fault_mode: args.fault_mode,
        min_size_bytes: args.min_size,
        start_after_bytes: args.start_after.or(args.auto.map(|_| AUTO_START_AFTER_BYTES)),
        // `--auto` probes take the longest idle pages first once aging has found them.
        idle_aging: args.idle_age.unwrap_or(match args.auto {
            Some(_) => uswap::IdleAging::Observe,
            None => uswap::IdleAging::Off,
        }),
        tier_age: args.tier_age,
    })
}

/// Waits for the program to end and returns how it ended; `None` when, under `--strict`,
/// the memory uswap does not manage passed its share of the limit first (said here; the
/// caller ends the tree).
fn wait_for_program(
    args: &RunArgs,
    child: &mut std::process::Child,
    launch: &Launch,
    limit_bytes: u64,
) -> Result<Option<std::process::ExitStatus>, RunError> {
    let unmanaged_limit = limit_bytes / UNMANAGED_SHARE_DIVISOR;
    loop {
        let waited = if args.strict {
            let now = unmanaged_in(&launch.stats_dir, Moment::Now);
            if now.bytes > unmanaged_limit {
                say!("uswap run: --strict: {}", unmanaged_message(&now, limit_bytes, "now"));
                return Ok(None);
            }
            match child.try_wait() {
                Ok(None) => {
                    std::thread::sleep(std::time::Duration::from_millis(STRICT_POLL_MS));
                    continue;
                }
                other => other,
            }
        } else {
            child.wait().map(Some)
        };
        match waited {
            Ok(Some(status)) => return Ok(Some(status)),
            Ok(None) => {}
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(source) => return Err(RunError::Spawn { path: launch.path.clone(), source }),
        }
    }
}

/// What the tree's records say once the program has ended: its counters summed, the memory
/// uswap did not manage at its peak, and the processes refused a pager, run outside the
/// budget or that bound symbols deeply.
struct EndedRun {
    summary: serde_json::Value,
    unmanaged: Unmanaged,
    refused: Vec<(u32, String)>,
    escaped: Vec<(u32, String)>,
    deep_binds: Vec<(u32, String)>,
}

impl EndedRun {
    fn collect(launch: &Launch) -> Self {
        EndedRun {
            summary: launch.summary(),
            unmanaged: unmanaged_in(&launch.stats_dir, Moment::Peak),
            refused: records::refusals(&launch.stats_dir),
            escaped: records::escapes(&launch.stats_dir),
            deep_binds: records::deep_binds(&launch.stats_dir),
        }
    }

    /// Adds what the tree's records cannot know: the peak RSS of any process, the wall
    /// time, and under `--auto` its target and the limit it ended at.
    fn add_run_figures(&mut self, wall: std::time::Duration, auto_limit_and_target: Option<(u64, f64)>) {
        if let serde_json::Value::Object(m) = &mut self.summary {
            m.insert("rss_peak_bytes".into(), children_rss_peak_bytes().into());
            m.insert("wall_seconds".into(), wall.as_secs_f64().into());
            m.insert("escaped_processes".into(), self.escaped.len().into());
            if let Some((bytes, target)) = auto_limit_and_target {
                m.insert("auto_target".into(), target.into());
                m.insert("auto_limit_bytes".into(), bytes.into());
            }
        }
    }

    /// Says how the run went (the counters to `--stats-json` or a line on stderr, then every
    /// warning) and returns `uswap run`'s exit status: the program's (128+N for a signal N),
    /// or 2 where the budget did not hold as promised and the program said 0.
    fn say(self, args: &RunArgs, status: std::process::ExitStatus, limit_bytes: u64) -> Result<u8, RunError> {
        let code = match (status.code(), status.signal()) {
            (Some(c), _) => c as u8,
            (None, Some(sig)) => 128u8.wrapping_add(sig as u8),
            (None, None) => 1,
        };
        if let Some(msg) = ended_by_signal_message(status) {
            say!("uswap run: {msg}");
        }
        match &args.stats_json {
            Some(p) => {
                let text = serde_json::to_string_pretty(&self.summary).unwrap_or_default();
                std::fs::write(p, text + "\n").map_err(|source| RunError::WriteStats { path: p.clone(), source })?;
            }
            None => say!("{}", summary_line(&self.summary)),
        }
        // Said whether or not the counters went to a file: a limit that did not hold, a run
        // that mostly waited for memory.
        if let Some(msg) = overrun_message(&self.summary, status.core_dumped()) {
            say!("uswap run: {msg}");
        }
        if let Some(msg) = thrash_message(&self.summary, status.signal() == Some(libc::SIGBUS), &args.device) {
            say!("uswap run: {msg}");
        }
        if let Some(msg) = records::deep_bind_message(&self.deep_binds) {
            say!("uswap run: {msg}");
        }
        // A process outside the budget is said whatever else happened; under `--strict`,
        // where the limit must hold for all of the program's memory, it fails the run.
        if !self.escaped.is_empty() {
            say!("uswap run: {}", records::escape_message(&self.escaped));
        }
        let scans_given_up = scans_without_memory_message(&self.unmanaged);
        if let Some(msg) = &scans_given_up {
            say!("uswap run: {msg}");
        }
        let peak = self.summary.get("unmanaged_peak_bytes").and_then(|v| v.as_u64()).unwrap_or(0);
        if peak > limit_bytes / UNMANAGED_SHARE_DIVISOR {
            let at_peak = Unmanaged { bytes: peak, ..self.unmanaged };
            say!("uswap run: {}", unmanaged_message(&at_peak, limit_bytes, "at its peak"));
            if args.strict {
                return Ok(2);
            }
        }
        if args.strict && scans_given_up.is_some() {
            // What the scans given up did not see may have been over the limit.
            say!("uswap run: --strict: the limit is not shown to hold for the program's whole memory");
            return Ok(2);
        }
        // Last, so that it is the line a user reads: a process of the tree ran without the
        // budget's pager, or not at all, whatever the program's own status says.
        if !self.refused.is_empty() {
            say!("uswap run: {}", records::refusal_message(&self.refused));
            return Ok(if code == 0 { 2 } else { code });
        }
        if args.strict && !self.escaped.is_empty() {
            return Ok(if code == 0 { 2 } else { code });
        }
        Ok(code)
    }
}

/// Whether `path` can be written: an existing file, opened for writing without truncating
/// it, or a new one in a directory we may write to.
fn check_writable(path: &Path) -> std::io::Result<()> {
    if path.exists() {
        return std::fs::OpenOptions::new().write(true).open(path).map(drop);
    }
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    let c_dir = std::ffi::CString::new(dir.as_os_str().as_encoded_bytes()).map_err(std::io::Error::other)?;
    // SAFETY: access(2) reads the NUL-terminated path it is given.
    if unsafe { libc::access(c_dir.as_ptr(), libc::W_OK | libc::X_OK) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

/// Under another `uswap run` (its configuration is in the environment), this program's
/// tree gets a budget of its own, charged to this run's segment only: the outer limit
/// does not hold for it. Said, with both limits.
fn say_if_nested(limit_bytes: u64) {
    // Set by `uswap run` only (the others may be a user's, for the preload used directly).
    if std::env::var_os("USWAP_STATS_DIR").is_none() {
        return;
    }
    let outer = std::env::var("USWAP_LIMIT").ok().and_then(|s| parse_size(&s).ok()).map_or("?".into(), format_size);
    say!(
        "uswap run: running under another uswap run (limit {outer}): this program gets a budget of its own, \
         {}, which the outer limit does not count",
        format_size(limit_bytes)
    );
}

/// A run stopped by SIGTERM or SIGHUP ends its tree, not only its program: the processes
/// of the tree still running in its session (a pipeline's other commands, a shell's
/// background jobs) get SIGTERM, then SIGKILL after a grace period. A daemon that left the
/// session on purpose is left running (named by `say_outliving`).
fn end_stopped_tree(launch: &Launch, program_pid: u32) {
    let (pids, killed) = tree::end_in_session(&launch.stats_dir, || launch.segment.live_pids(), program_pid);
    if pids.is_empty() {
        return;
    }
    let shown: Vec<String> = pids.iter().take(8).map(u32::to_string).collect();
    say!(
        "uswap run: stopped: {} process(es) of the program still ran ({}{}): sent SIGTERM, and SIGKILL to {killed} \
         that did not end within {} s",
        pids.len(),
        shown.join(", "),
        if pids.len() > 8 { ", ..." } else { "" },
        tree::TERM_GRACE.as_secs()
    );
}

/// Says, once the program ended, which of its processes go on (started in the background
/// and left running, or daemonized): they keep the budget (they share its segment), but
/// what they do from now on is in no summary, and `uswap run` does not wait for them.
fn say_outliving(launch: &Launch, program_pid: u32) -> bool {
    let live = tree::running(&launch.stats_dir, &launch.segment.live_pids(), program_pid);
    let pids: Vec<String> = live.iter().map(|p| p.to_string()).collect();
    if pids.is_empty() {
        return false;
    }
    let shown = pids.iter().take(8).cloned().collect::<Vec<_>>().join(", ");
    let more = if pids.len() > 8 { format!(" and {} more", pids.len() - 8) } else { String::new() };
    say!(
        "uswap run: {} process(es) of the program outlive it ({shown}{more}): they stay under the limit, \
         but their counters from now on are in no summary (wait for them in the program to count them)",
        pids.len()
    );
    true
}

/// How often `--strict` reads the tree's records (each process rewrites its own every 200
/// ms and measures its memory every second).
const STRICT_POLL_MS: u64 = 200;

/// `--strict` gave up on the program: every process of the tree that left a record and is
/// still in our process group (a record's pid may since belong to another process), then
/// the program itself, are killed, and the program reaped.
fn kill_tree(child: &mut std::process::Child, dir: &Path) {
    // SAFETY: getpgid only reads a process's group id.
    let our_group = unsafe { libc::getpgid(0) };
    for path in record_paths(dir) {
        let Some(pid) = record_pid(&path) else { continue };
        // SAFETY: getpgid reads a group id (ESRCH for a pid that is gone); kill(2) sends a
        // signal to a process of our own group.
        unsafe {
            if libc::getpgid(pid) == our_group {
                libc::kill(pid, libc::SIGKILL);
            }
        }
    }
    let _ = child.kill();
    let _ = child.wait();
}

#[cfg(test)]
mod tests {
    use super::with_redis_session;

    #[test]
    fn redis_devices_get_the_session_and_others_stay() {
        assert_eq!(
            with_redis_session("zpool, redis://h:1?replicas=1:cluster,redis://h:2,file:x", "S"),
            "zpool,redis://h:1?replicas=1&session=S:cluster,redis://h:2?session=S,file:x"
        );
    }
}
