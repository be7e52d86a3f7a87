//! `uswap stat PID`: the live counters of the pagers of a running process.
//!
//! Each pager serves its counters on the abstract unix socket `uswap.<pid>.<n>` (see
//! `uswap::stats_server`); this command finds the sockets of PID in `/proc/net/unix`, reads
//! each, and prints one block per pager (or their sum), once or every `--interval`, as a
//! table, JSON lines or the Prometheus text format (`format.rs`).
//!
//! Nothing here is shared between threads; Ctrl-C only sets a flag the interval loop reads.

mod format;

use std::io::Write;
use std::os::unix::ffi::OsStrExt;
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use clap::Args;
use uswap::stats_server::{self, QueryError};
use uswap::Stats;

#[derive(Debug, Args)]
pub struct StatArgs {
    /// The process whose pagers to read.
    pub pid: u32,
    /// Print again every SECONDS (fractions allowed) until Ctrl-C or until the process (or its
    /// last pager) goes away.
    #[arg(long, value_name = "SECONDS", value_parser = parse_interval)]
    pub interval: Option<f64>,
    /// The Prometheus text exposition format (for node_exporter's textfile collector).
    #[arg(long, conflicts_with = "json")]
    pub prometheus: bool,
    /// One JSON document per line: `{"pid", "pagers": [{"socket", "pager", "stats"}]}`, or with
    /// `--sum` `{"pid", "sockets", "stats"}`.
    #[arg(long)]
    pub json: bool,
    /// One block with the sum of every pager of the process instead of one per pager.
    #[arg(long)]
    pub sum: bool,
    /// How long to wait for a pager's answer, in seconds.
    #[arg(long, value_name = "SECONDS", default_value_t = 5.0, value_parser = parse_interval)]
    pub timeout: f64,
}

fn parse_interval(s: &str) -> Result<f64, String> {
    match s.parse::<f64>() {
        Ok(v) if v.is_finite() && v > 0.0 && v <= 86_400.0 => Ok(v),
        _ => Err(format!("{s:?} is not a number of seconds above 0 and at most 86400")),
    }
}

#[derive(Debug, thiserror::Error)]
pub enum StatError {
    #[error("no process {pid}: check the PID (ps -p {pid})")]
    NoProcess { pid: u32 },
    #[error("process {pid} has exited (a zombie its parent has not reaped): its counters went with it")]
    Exited { pid: u32 },
    #[error(
        "process {pid} publishes no uswap counters: no socket @uswap.{pid}.* in /proc/net/unix. Either it runs \
         no pager, its pagers were built with publish_stats(false), or it runs in another network namespace \
         (then run uswap stat inside it: nsenter -t {pid} -n uswap stat {pid})"
    )]
    NoPager { pid: u32 },
    #[error(
        "process {pid} runs under uswap run but has no pager yet: a process gets one when its heap and its own \
         mappings pass --start-after (a sixteenth of the limit by default), when its tree's charge reaches half \
         the limit, at its first large mapping it cannot defer or at its first thread (lazy start); until then \
         its memory is the kernel's, charged to the tree past 16 MiB"
    )]
    Waiting { pid: u32 },
    #[error("process {pid} runs under uswap run without a pager, and will not get one: {why}")]
    Refused { pid: u32, why: String },
    #[error("reading /proc/net/unix to find the sockets of process {pid}: {source}")]
    ListSockets { pid: u32, source: std::io::Error },
    #[error("process {pid}: {source}")]
    Query { pid: u32, source: QueryError },
    #[error("installing the Ctrl-C handler: {0}")]
    Signals(std::io::Error),
    #[error("writing the output: {0}")]
    Output(std::io::Error),
}

/// Why `pid` answers no query: a process of a `uswap run` tree (the run's directory in the
/// environment it started with) that waits for its pager, or one with no pager at all.
/// A process whose pager was refused says so in the run's directory (`refused-PID.txt`, see
/// the preload's `note_refusal`): it never gets one, and "no pager yet" misled.
fn no_pager(pid: u32) -> StatError {
    let env = std::fs::read(format!("/proc/{pid}/environ")).unwrap_or_default();
    let Some(dir) = env.split(|&b| b == 0).find_map(|e| e.strip_prefix(b"USWAP_STATS_DIR=")) else {
        return StatError::NoPager { pid };
    };
    let dir = std::path::Path::new(std::ffi::OsStr::from_bytes(dir));
    let refusal = dir.join(format!("{}{pid}.txt", uswap::shared_charge::REFUSAL_PREFIX));
    match crate::tree_files::read_note(&refusal) {
        Ok(why) => StatError::Refused { pid, why: why.trim_end().to_string() },
        Err(_) => StatError::Waiting { pid },
    }
}

/// How the counters are printed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    Table,
    Json,
    Prometheus,
}

/// One pager's answer.
pub struct PagerStats {
    /// The socket name, `uswap.<pid>.<n>`.
    pub socket: String,
    /// `n`, the pager's number in its process.
    pub pager: u64,
    pub stats: Stats,
}

/// What one round of queries found.
pub enum Round {
    Pagers(Vec<PagerStats>),
    ProcessGone,
    NoPager,
}

pub fn main(args: &StatArgs) -> ExitCode {
    match run(args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("uswap stat: {e}");
            ExitCode::from(1)
        }
    }
}

/// Whether `pid` is a live process (a zombie has exited: its sockets are closed, its memory
/// freed).
pub(crate) fn process_exists(pid: u32) -> bool {
    !matches!(process_state(pid).as_deref(), Some("Z" | "X") | None)
}

/// The state letter of `/proc/PID/stat` (`R`, `S`, `Z`, ...), if the process is there.
fn process_state(pid: u32) -> Option<String> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The state follows the command name, which is in parentheses and may contain anything.
    stat.rsplit_once(')').and_then(|(_, rest)| rest.split_whitespace().next()).map(str::to_owned)
}

/// The error for a PID with no live process: none at all, or one that exited and waits to
/// be reaped (`ps` still lists it, so "no process" misled).
fn gone(pid: u32) -> StatError {
    match process_state(pid).as_deref() {
        Some("Z" | "X") => StatError::Exited { pid },
        _ => StatError::NoProcess { pid },
    }
}

/// Reads every pager of `pid`. A socket that vanished between the listing and the end of the
/// query is a pager dropped meanwhile: skipped.
fn query_round(pid: u32, timeout: Duration) -> Result<Round, StatError> {
    let names = stats_server::socket_names(pid).map_err(|source| StatError::ListSockets { pid, source })?;
    let mut pagers = Vec::with_capacity(names.len());
    for socket in names {
        match stats_server::query(&socket, timeout) {
            Ok(stats) => {
                let pager = stats_server::parse_socket_name(&socket).map_or(0, |(_, n)| n);
                pagers.push(PagerStats { socket, pager, stats });
            }
            Err(QueryError::Gone { .. }) => {}
            Err(source) => {
                // A pager that went away while answering (its process exiting) is gone, not
                // an error; the socket is unlisted by then.
                let listed =
                    stats_server::socket_names(pid).map_err(|source| StatError::ListSockets { pid, source })?;
                if listed.contains(&socket) {
                    return Err(StatError::Query { pid, source });
                }
            }
        }
    }
    if !pagers.is_empty() {
        return Ok(Round::Pagers(pagers));
    }
    Ok(if process_exists(pid) { Round::NoPager } else { Round::ProcessGone })
}

/// Whether `pid` is a `uswap run` (its command line `... run ...` from a `uswap` executable),
/// whose one socket serves its tree's counters added up.
fn is_uswap_run(pid: u32) -> bool {
    let Ok(cmdline) = std::fs::read(format!("/proc/{pid}/cmdline")) else { return false };
    let mut args = cmdline.split(|&b| b == 0);
    let program = args.next().unwrap_or_default();
    let name = program.rsplit(|&b| b == b'/').next().unwrap_or_default();
    name.starts_with(b"uswap") && args.next() == Some(b"run".as_slice())
}

fn run(args: &StatArgs) -> Result<(), StatError> {
    let pid = args.pid;
    let timeout = Duration::from_secs_f64(args.timeout);
    let format = if args.prometheus {
        Format::Prometheus
    } else if args.json {
        Format::Json
    } else {
        Format::Table
    };
    let subject = if is_uswap_run(pid) { format::Subject::RunTree } else { format::Subject::Process };
    let print = |pagers: &[PagerStats], elapsed: Option<Duration>| -> Result<(), StatError> {
        let text = format::render(pid, subject, pagers, args.sum, format, elapsed);
        let mut out = std::io::stdout().lock();
        out.write_all(text.as_bytes()).and_then(|()| out.flush()).map_err(StatError::Output)
    };
    let Some(interval) = args.interval else {
        return match query_round(pid, timeout)? {
            Round::Pagers(p) => print(&p, None),
            Round::ProcessGone => Err(gone(pid)),
            Round::NoPager => Err(no_pager(pid)),
        };
    };
    let stop = Arc::new(AtomicBool::new(false));
    for sig in [signal_hook::consts::SIGINT, signal_hook::consts::SIGTERM] {
        signal_hook::flag::register(sig, stop.clone()).map_err(StatError::Signals)?;
    }
    let interval = Duration::from_secs_f64(interval);
    let start = Instant::now();
    let mut rounds = 0u64;
    loop {
        match query_round(pid, timeout)? {
            Round::Pagers(p) => print(&p, Some(start.elapsed()))?,
            // Before the first answer, a PID without pagers is the user's mistake; after it,
            // the end of what we were watching.
            Round::ProcessGone if rounds == 0 => return Err(gone(pid)),
            Round::NoPager if rounds == 0 => return Err(no_pager(pid)),
            Round::ProcessGone => {
                eprintln!("uswap stat: process {pid} exited");
                return Ok(());
            }
            Round::NoPager => {
                // A process that exits closes its sockets a moment before it is a zombie.
                std::thread::sleep(Duration::from_millis(100));
                if process_exists(pid) {
                    eprintln!("uswap stat: process {pid} has no pager any more");
                } else {
                    eprintln!("uswap stat: process {pid} exited");
                }
                return Ok(());
            }
        }
        rounds += 1;
        // Sleep in short steps so that Ctrl-C ends the wait at once.
        let next = start + interval.mul_f64(rounds as f64);
        while Instant::now() < next {
            if stop.load(Ordering::Relaxed) {
                eprintln!("uswap stat: interrupted after {rounds} reports");
                return Ok(());
            }
            std::thread::sleep((next - Instant::now().min(next)).min(Duration::from_millis(50)));
        }
        if stop.load(Ordering::Relaxed) {
            eprintln!("uswap stat: interrupted after {rounds} reports");
            return Ok(());
        }
    }
}
