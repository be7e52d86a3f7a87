//! The processes of a `uswap run` tree once the program ended: finding the ones still
//! running, and ending them when the run was stopped.
//!
//! A process belongs to the tree when it inherited the run's directory (`USWAP_STATS_DIR` in
//! the environment it was started with, read from `/proc/PID/environ`: processes refused a
//! pager and static programs have no slot in the charge segment but have that) or holds a
//! slot of its charge segment. A process that left the run's session (`setsid`: a daemon,
//! on purpose) is not ended when the run is stopped: it keeps the documented behaviour of
//! processes that outlive the program.

use std::path::Path;
use std::time::{Duration, Instant};

/// How long the processes of a stopped run have, after SIGTERM, to end before SIGKILL: a
/// program that handles SIGTERM (xz, a server) deletes its partial output or flushes in
/// well under this.
pub(super) const TERM_GRACE: Duration = Duration::from_secs(3);
/// Most processes scanned in `/proc` (a bound on the loop, far above any real machine's).
const MAX_PROCS_SCANNED: usize = 1 << 22;

/// The running processes (not zombies) of the tree whose directory is `dir`, besides the
/// program `program_pid` and this process, in this process's session.
fn running_in_session(dir: &Path, slot_pids: &[u32], program_pid: u32) -> Vec<u32> {
    // SAFETY: getsid(0) only reads this process's session id.
    let our_session = unsafe { libc::getsid(0) };
    let mut pids = running(dir, slot_pids, program_pid);
    // SAFETY: getsid reads a process's session id (-1 for one that is gone).
    pids.retain(|&pid| unsafe { libc::getsid(pid as libc::pid_t) } == our_session);
    pids
}

/// The running processes (not zombies) of the tree whose directory is `dir`, besides the
/// program `program_pid` and this process, in any session: those with a pager (a slot of
/// the charge, `slot_pids`) and those waiting for one (lazy start: known by their
/// environment only).
pub(super) fn running(dir: &Path, slot_pids: &[u32], program_pid: u32) -> Vec<u32> {
    let mut marker = format!("{ENV_STATS_DIR}=").into_bytes();
    marker.extend_from_slice(dir.as_os_str().as_encoded_bytes());
    marker.push(0);
    let me = std::process::id();
    let my_start = start_ticks("self").unwrap_or(0);
    // A slot's pid counts only for a process that started after this one: the segment is
    // open to the tree's processes, which may have changed user (see `dir`), and a forged
    // slot must not name a process this run did not start (its login shell).
    let slot = |pid: u32| slot_pids.contains(&pid) && start_ticks(&pid.to_string()).is_some_and(|t| t >= my_start);
    let mut pids: Vec<u32> = std::fs::read_dir("/proc")
        .into_iter()
        .flatten()
        .flatten()
        .take(MAX_PROCS_SCANNED)
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter(|&pid| pid != me && pid != program_pid)
        .filter(|&pid| slot(pid) || environ_has(pid, &marker))
        .filter(|&pid| is_running(pid))
        .collect();
    pids.sort_unstable();
    pids
}

/// The variable that names the run's directory to the preload in every process of the tree.
pub(super) const ENV_STATS_DIR: &str = "USWAP_STATS_DIR";

/// Whether the environment `pid` was started with holds `marker` (`NAME=VALUE\0`) as a whole
/// entry.
fn environ_has(pid: u32, marker: &[u8]) -> bool {
    let Ok(env) = std::fs::read(format!("/proc/{pid}/environ")) else { return false };
    env.split(|&b| b == 0).any(|entry| entry.len() + 1 == marker.len() && marker.starts_with(entry))
}

/// When process `pid` (or `self`) started, in clock ticks since boot (`/proc/PID/stat`'s
/// 22nd field).
fn start_ticks(pid: &str) -> Option<u64> {
    stat_from_state(pid)?.split(' ').nth(22 - 3)?.parse().ok()
}

/// `/proc/PID/stat` from its 3rd field (the state) on: after the command's name, which may
/// hold spaces and parentheses.
fn stat_from_state(pid: &str) -> Option<String> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    Some(stat.rsplit_once(") ")?.1.to_string())
}

/// A process that is not a zombie (ended, not yet reaped) nor gone.
pub(super) fn is_running(pid: u32) -> bool {
    stat_from_state(&pid.to_string()).is_some_and(|rest| !rest.starts_with('Z') && !rest.starts_with('X'))
}

/// Rounds of SIGTERM and SIGKILL a stopped run's tree gets at most (see [`end_in_session`]).
const END_ROUNDS: usize = 4;

/// Ends the running processes of the tree in this process's session (see
/// [`running_in_session`]; `slot_pids` read afresh each round), looking for them again after
/// each round of [`end`], up to [`END_ROUNDS`]: a process of the tree may start one more (a
/// subshell forking its `sleep` after the first look) before it is killed. Returns every
/// process ended, and how many needed SIGKILL.
pub(super) fn end_in_session(dir: &Path, slot_pids: impl Fn() -> Vec<u32>, program_pid: u32) -> (Vec<u32>, usize) {
    let (mut pids, mut killed) = (Vec::new(), 0);
    for _ in 0..END_ROUNDS {
        let found = running_in_session(dir, &slot_pids(), program_pid);
        if found.is_empty() {
            break;
        }
        killed += end(&found);
        for pid in found {
            if !pids.contains(&pid) {
                pids.push(pid);
            }
        }
    }
    (pids, killed)
}

/// How long the processes of the tree still running when the program ended have to end by
/// themselves before they are said to outlive it: those that end with the program (Python's
/// resource tracker, which exits once the program's end closes its pipe, 15-35 ms after it;
/// a pipeline's last command) then count in the summary and are not named.
pub(super) const EXIT_GRACE: Duration = Duration::from_millis(500);

/// Waits, at most [`EXIT_GRACE`], for the processes of the tree that were running when
/// the program ended (see [`running`]) to end; returns at once when there are none.
pub(super) fn wait_for_ending(dir: &Path, slot_pids: &[u32], program_pid: u32) {
    let pids = running(dir, slot_pids, program_pid);
    let deadline = Instant::now() + EXIT_GRACE;
    // Bounded by the deadline.
    while Instant::now() < deadline && pids.iter().any(|&p| is_running(p)) {
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// Ends `pids` (the processes of a stopped run that outlived its program): SIGTERM, then
/// SIGKILL for those still running after [`TERM_GRACE`]. Returns how many needed SIGKILL.
fn end(pids: &[u32]) -> usize {
    for &pid in pids {
        // SAFETY: kill(2) sends a signal; the pid was running in our session an instant ago
        // (a pid reused since would have to be a new process of our own session).
        unsafe { libc::kill(pid as libc::pid_t, libc::SIGTERM) };
    }
    let deadline = Instant::now() + TERM_GRACE;
    // Bounded by the deadline.
    while Instant::now() < deadline && pids.iter().any(|&p| is_running(p)) {
        std::thread::sleep(Duration::from_millis(20));
    }
    let left: Vec<u32> = pids.iter().copied().filter(|&p| is_running(p)).collect();
    for &pid in &left {
        // SAFETY: as above.
        unsafe { libc::kill(pid as libc::pid_t, libc::SIGKILL) };
    }
    left.len()
}
