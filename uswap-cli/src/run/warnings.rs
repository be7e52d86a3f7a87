//! What `uswap run` says about a run besides its counters: a limit that did not hold (no
//! device took pages), a run that mostly waited for memory (thrash), and anonymous memory
//! of the tree that uswap does not manage, with its largest mappings and why each is not
//! managed. Each is judged from the summed counters or the processes' records, and worded
//! to tell the user what to do. No state: functions of what they are given.

use std::path::Path;

use super::records::record_paths;
use crate::size::{format_amount, format_size};
use crate::tree_files::read_tree_file;

/// The tree's unmanaged memory is reported once it passes 1/10 of the limit.
pub(super) const UNMANAGED_SHARE_DIVISOR: u64 = 10;

/// The tree's memory that uswap does not manage, from the processes' records: the total,
/// and what it was by reason, most bytes first.
#[derive(Debug)]
pub(super) struct Unmanaged {
    pub(super) bytes: u64,
    /// Which of the records' measurements `by_reason` sums.
    pub(super) moment: Moment,
    pub(super) by_reason: Vec<Reason>,
    /// Measurements given up because the process could not allocate their lists (a process
    /// at the system's limit of mappings), and the processes that gave some up.
    pub(super) scans_without_memory: u64,
    pub(super) processes_without_memory: u64,
}

/// One reason memory of the tree was not managed, summed over its processes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Reason {
    pub(super) why: String,
    pub(super) bytes: u64,
    pub(super) mappings: u64,
    /// The largest such mapping: its process, address and bytes.
    pub(super) largest: (u64, String, u64),
}

/// Which of a record's measurements [`unmanaged_in`] sums by reason.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Moment {
    /// The process's last measurement.
    Now,
    /// The measurement in which the process found the most (its own peak).
    Peak,
}

/// Reasons said; the others are summed in one line.
const REASONS_SAID: usize = 5;

/// The tree's unmanaged memory now, from the processes' last records, by reason as each
/// process measured it at the `moment` asked for.
pub(super) fn unmanaged_in(dir: &Path, moment: Moment) -> Unmanaged {
    let (reasons, mappings) = match moment {
        Moment::Now => ("unmanaged_by_reason", "unmanaged_largest"),
        Moment::Peak => ("unmanaged_peak_by_reason", "unmanaged_peak_largest"),
    };
    let mut u =
        Unmanaged { bytes: 0, moment, by_reason: Vec::new(), scans_without_memory: 0, processes_without_memory: 0 };
    for path in record_paths(dir) {
        let Ok(text) = read_tree_file(&path) else { continue };
        let Ok(rec) = serde_json::from_str::<serde_json::Value>(&text) else { continue };
        let pid = rec.get("pid").and_then(|v| v.as_u64()).unwrap_or(0);
        u.bytes += rec.get("unmanaged_bytes").and_then(|v| v.as_u64()).unwrap_or(0);
        let without_memory = rec.get("unmanaged_scans_without_memory").and_then(|v| v.as_u64()).unwrap_or(0);
        u.scans_without_memory += without_memory;
        u.processes_without_memory += u64::from(without_memory > 0);
        for r in reasons_in(&rec, reasons, mappings, pid) {
            match u.by_reason.iter_mut().find(|have| have.why == r.why) {
                Some(have) => {
                    have.bytes += r.bytes;
                    have.mappings += r.mappings;
                    if r.largest.2 > have.largest.2 {
                        have.largest = r.largest;
                    }
                }
                None => u.by_reason.push(r),
            }
        }
    }
    u.by_reason.sort_by_key(|r| std::cmp::Reverse(r.bytes));
    u
}

/// A record's reasons (its list `reasons`), or, from a library that wrote none, its largest
/// `mappings`, each a reason of its own.
fn reasons_in(rec: &serde_json::Value, reasons: &str, mappings: &str, pid: u64) -> Vec<Reason> {
    let text = |v: &serde_json::Value, k: &str| v.get(k).and_then(|v| v.as_str()).unwrap_or("?").to_string();
    let number = |v: &serde_json::Value, k: &str| v.get(k).and_then(|v| v.as_u64()).unwrap_or(0);
    let list = |k: &str| rec.get(k).and_then(|v| v.as_array()).cloned();
    if let Some(list) = list(reasons) {
        let reason = |r: &serde_json::Value| {
            let largest = r.get("largest").cloned().unwrap_or_default();
            let (why, bytes, mappings) = (text(r, "why"), number(r, "bytes"), number(r, "mappings"));
            Reason { why, bytes, mappings, largest: (pid, text(&largest, "addr"), number(&largest, "bytes")) }
        };
        return list.iter().map(reason).collect();
    }
    let mapping = |m: &serde_json::Value| {
        let (why, bytes) = (text(m, "why"), number(m, "bytes"));
        Reason { why, bytes, mappings: 1, largest: (pid, text(m, "addr"), bytes) }
    };
    // An older record of a peak may have only its last measurement's list.
    list(mappings).or_else(|| list("unmanaged_largest")).unwrap_or_default().iter().map(mapping).collect()
}

/// What a shell says of a job a signal ended ("Segmentation fault (core dumped)"): `uswap
/// run` exits with 128+N rather than die of the signal, so the shell that ran it says
/// nothing, and a crash went by with only the summary line. Not for SIGINT and SIGPIPE, of
/// which shells say nothing either (the user's own Ctrl-C; a reader that went away).
pub(super) fn ended_by_signal_message(status: std::process::ExitStatus) -> Option<String> {
    use std::os::unix::process::ExitStatusExt;
    let sig = status.signal().filter(|&s| s != libc::SIGINT && s != libc::SIGPIPE)?;
    // SAFETY: strsignal returns a NUL-terminated string the C library owns, read at once,
    // before any other call on this thread could reuse its buffer.
    let name = unsafe { std::ffi::CStr::from_ptr(libc::strsignal(sig)) }.to_string_lossy().into_owned();
    let core = if status.core_dumped() { ", core dumped" } else { "" };
    Some(format!("the program was ended by signal {sig} ({name}){core}"))
}

/// What to say when the managed memory went over the limit by more than a twentieth: the
/// charges that went over it (`limit_overrun`) and why, from the counters that say what
/// reclaim met: devices that took no pages (full, or failing their writes), pages the
/// kernel would not move out (shared with fork children, or pinned), pages system calls
/// held in, victims every one busy. Each cause comes with what the user can do.
/// `core_dumped`: the program's process dumped core, for which every page it had out was
/// brought back in (docs/cli.md, "Core dumps"): that is the cause, said first.
pub(super) fn overrun_message(s: &serde_json::Value, core_dumped: bool) -> Option<String> {
    let g = |k: &str| s.get(k).and_then(|v| v.as_u64()).unwrap_or(0);
    let (limit, peak) = (g("limit_bytes"), g("resident_peak_bytes"));
    if peak <= limit + limit / 20 {
        return None;
    }
    let mut causes = Vec::new();
    if core_dumped {
        causes.push("the program dumped core, and every page it had out came back in to be written to the dump");
    }
    if g("limit_overrun") == 0 && !core_dumped {
        // Over the limit with no charge counted over it: charges that reclaim does not
        // answer, made while a fork held it (a fork child of 300 MiB that forked again went
        // to 300 MiB under 16 MiB, said nowhere), or by processes still without a pager.
        causes.push(
            "pages brought in for a fork, while reclaim waited (a fork child that forks again brings in every page \
             it still reads from its parent; they go out again once its own child exits or execs), or heaps of \
             processes that had not started their pagers yet",
        );
    }
    if g("swap_alloc_fail") + g("swpout_error") > 0 {
        causes.push(
            "no device took pages: full, failing its writes, or declining them (`zpool:reject` with pages that \
             do not compress); give the devices room, or add a device after them",
        );
    }
    if g("move_refused") + g("cow_broken") > 0 {
        causes.push(
            "the kernel refused to move pages out: shared with fork children until they exit or exec, locked, or \
             pinned for I/O (io_uring's registered buffers, O_DIRECT, a process_vm_readv of its own or another \
             process's)",
        );
    }
    if g("reclaim_pinned") > 0 {
        causes.push(
            "system calls in progress held their memory in (it goes once they return), or the program locked it \
             (mlock, MAP_LOCKED: it stays in until unlocked, as without uswap)",
        );
    }
    if g("limit_overrun_busy") > 0 {
        causes.push("every page reclaim chose was busy, faulting in on another thread (a limit this small is below what the program's threads use at once; give a larger --limit)");
    }
    if causes.is_empty() {
        causes.push("reclaim found nothing to move out, and no counter says why (give a larger --limit)");
    }
    Some(format!(
        "the limit of {} did not hold: resident peak {} ({} charges went over it: {})",
        format_size(limit),
        format_amount(peak),
        g("limit_overrun"),
        causes.join("; ")
    ))
}

/// Runs at least this long are judged for thrash (a short run's stall share is noise).
const THRASH_MIN_WALL_SECONDS: f64 = 1.0;
/// Some thread of the program waited for memory at least this share of the run.
const THRASH_STALL_SHARE: f64 = 0.5;

/// What to say when the program spent most of its run waiting for memory: its working set
/// is far over the limit, and the run goes at the speed of the device, not of the program.
/// (`uswap stat PID` shows the same share over the last 10, 60 and 300 s while it runs.)
/// Unless the program ended by SIGBUS, which is how a fault uswap could not serve ends it
/// (before its last counters are out; `fault_error` counts attempts, retried ones too): then
/// the wait may have been a failing device's. `devices` is the `--device` list: a faster
/// device first is advised only where the first is not in memory already.
pub(super) fn thrash_message(s: &serde_json::Value, ended_by_sigbus: bool, devices: &str) -> Option<String> {
    let f = |k: &str| s.get(k).and_then(|v| v.as_f64()).unwrap_or(0.0);
    let (stalled, wall) = (f("stall_seconds_total"), f("wall_seconds"));
    if wall < THRASH_MIN_WALL_SECONDS || stalled < THRASH_STALL_SHARE * wall {
        return None;
    }
    let g = |k: &str| s.get(k).and_then(|v| v.as_u64()).unwrap_or(0);
    let majors = g("pgmajfault");
    let device = match g("device_read_us") {
        0 => String::new(),
        us => format!(", the device's reads {:.0} us of each", us as f64 / majors.max(1) as f64),
    };
    let share = (stalled / wall * 100.0).min(100.0);
    if ended_by_sigbus {
        // A fault that ended in SIGBUS waited out the device's retries: no larger limit
        // would have spared that wait.
        return Some(format!(
            "the program waited for memory {share:.0} % of its run (some thread stalled {stalled:.1} s of \
             {wall:.1} s, {majors} major faults{device}), perhaps on a swap device that failed: it ended by \
             SIGBUS, as a fault uswap cannot serve ends it; if uswap said so above, make the device answer, or \
             put one that does first in --device"
        ));
    }
    let first = devices.split(',').next().unwrap_or_default().trim();
    let advice = if first.starts_with("zpool") || first.starts_with("ram") {
        "a larger --limit would let it run at its own speed"
    } else {
        "a larger --limit, or a faster device first in --device (the pool, zpool, before a file or Redis), would \
         let it run at its own speed"
    };
    Some(format!(
        "the program waited for memory {share:.0} % of its run (some thread stalled {stalled:.1} s of {wall:.1} s, \
         {majors} major faults{device}): its working set is far over the limit of {}; {advice}",
        format_size(g("limit_bytes")),
    ))
}

/// What to say of the tree's unmanaged memory `u` (at the moment `when` names): the total
/// against the limit, then each reason with its bytes, its mappings and the largest of them
/// (a program that holds its memory in thousands of small mappings has no large one).
pub(super) fn unmanaged_message(u: &Unmanaged, limit_bytes: u64, when: &str) -> String {
    let mut msg = format!(
        "the limit of {} does not hold for {} of anonymous memory uswap does not manage ({}, {} % of the limit)",
        format_size(limit_bytes),
        format_amount(u.bytes),
        when,
        u.bytes * 100 / limit_bytes.max(1)
    );
    if u.by_reason.is_empty() {
        return msg;
    }
    msg.push_str(match u.moment {
        Moment::Now => "; by reason:",
        Moment::Peak => "; by reason, each process at its own peak:",
    });
    for r in u.by_reason.iter().take(REASONS_SAID) {
        let (pid, addr, largest_bytes) = &r.largest;
        let (amount, largest) = (format_amount(r.bytes), format_amount(*largest_bytes));
        match r.mappings {
            1 => msg.push_str(&format!("\n  {amount} in 1 mapping (process {pid}, at {addr}): {}", r.why)),
            n => msg.push_str(&format!(
                "\n  {amount} in {n} mappings, the largest {largest} (process {pid}, at {addr}): {}",
                r.why
            )),
        }
    }
    let rest = &u.by_reason[u.by_reason.len().min(REASONS_SAID)..];
    if !rest.is_empty() {
        let bytes: u64 = rest.iter().map(|r| r.bytes).sum();
        let reasons = if rest.len() == 1 { "reason" } else { "reasons" };
        msg.push_str(&format!("\n  {} for {} other {reasons}", format_amount(bytes), rest.len()));
    }
    msg
}

/// What to say of the measurements of unmanaged memory that processes gave up for want of
/// memory: the figures of unmanaged memory may be low. `None` if none was given up.
pub(super) fn scans_without_memory_message(u: &Unmanaged) -> Option<String> {
    if u.scans_without_memory == 0 {
        return None;
    }
    Some(format!(
        "{} measurement(s) of the anonymous memory uswap does not manage were given up, in {} process(es): \
         the process could not allocate memory for them (its mappings at the system's limit, vm.max_map_count, \
         or its memory exhausted), so the unmanaged figures may be low",
        u.scans_without_memory, u.processes_without_memory
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scans_given_up_are_said_with_their_processes() {
        let mut u = Unmanaged {
            bytes: 0,
            moment: Moment::Peak,
            by_reason: Vec::new(),
            scans_without_memory: 0,
            processes_without_memory: 0,
        };
        assert_eq!(scans_without_memory_message(&u), None);
        (u.scans_without_memory, u.processes_without_memory) = (5, 2);
        let msg = scans_without_memory_message(&u).expect("said");
        assert!(
            msg.starts_with(
                "5 measurement(s) of the anonymous memory uswap does not manage were given up, in 2 process(es)"
            ),
            "{msg}"
        );
        assert!(msg.contains("vm.max_map_count"), "{msg}");
    }

    /// A crash is said as a shell says it; an exit, Ctrl-C and a closed pipe are not.
    #[test]
    fn a_program_ended_by_a_signal_is_said() {
        use std::os::unix::process::ExitStatusExt;
        use std::process::ExitStatus;
        // Wait statuses: the signal in the low 7 bits, 0x80 when a core was dumped.
        let segv_core = ExitStatus::from_raw(libc::SIGSEGV | 0x80);
        let msg = ended_by_signal_message(segv_core).unwrap();
        assert!(msg.starts_with("the program was ended by signal 11 (") && msg.ends_with("), core dumped"), "{msg}");
        assert_eq!(
            ended_by_signal_message(ExitStatus::from_raw(libc::SIGTERM)).as_deref(),
            Some("the program was ended by signal 15 (Terminated)")
        );
        for quiet in [libc::SIGINT, libc::SIGPIPE, 3 << 8] {
            assert_eq!(ended_by_signal_message(ExitStatus::from_raw(quiet)), None, "{quiet}");
        }
    }

    #[test]
    fn an_overrun_is_said_only_past_a_twentieth_of_the_limit() {
        let s = |peak: u64, overrun: u64| serde_json::json!({"limit_bytes": 100 << 20, "resident_peak_bytes": peak << 20, "limit_overrun": overrun});
        assert_eq!(overrun_message(&s(105, 9), false), None);
        let msg = overrun_message(&s(400, 0), false).expect("said with no charge counted over");
        assert!(msg.contains("did not hold") && msg.contains("for a fork") && !msg.contains("no counter"), "{msg}");
        let msg = overrun_message(&s(400, 9), false).expect("said");
        assert!(msg.contains("did not hold") && msg.contains("9 charges") && msg.contains("no counter"), "{msg}");
        let mut full = s(400, 9);
        full["swap_alloc_fail"] = 3.into();
        let msg = overrun_message(&full, false).expect("said");
        assert!(msg.contains("no device took pages") && !msg.contains("busy"), "{msg}");
        let mut pinned = s(400, 9);
        pinned["reclaim_pinned"] = 60155.into();
        pinned["move_refused"] = 2.into();
        let msg = overrun_message(&pinned, false).expect("said");
        assert!(msg.contains("system calls") && msg.contains("refused") && !msg.contains("no device"), "{msg}");
        // A core dump brings every page in: that is the cause, not a fork.
        let msg = overrun_message(&s(400, 0), true).expect("said");
        assert!(msg.contains("dumped core") && !msg.contains("for a fork"), "{msg}");
    }

    /// Reasons are summed over the tree's processes, each with its largest mapping; a record
    /// of a library that wrote only its largest mappings gives each as a reason.
    #[test]
    fn unmanaged_memory_is_said_by_reason_summed_over_the_tree() {
        let dir = std::env::temp_dir().join(format!("uswap-unmanaged-reasons-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("a directory for the records");
        let small = "smaller than --min-size";
        let reason = |why: &str, bytes: u64, mappings: u64, addr: &str, largest: u64| serde_json::json!({"why": why, "bytes": bytes, "mappings": mappings, "largest": {"addr": addr, "bytes": largest}});
        let records = [
            serde_json::json!({"pid": 7, "unmanaged_bytes": 60 << 20, "unmanaged_peak_by_reason": [
                reason(small, 58 << 20, 15_000, "0x7f0000", 61_440), reason("shared memory", 2 << 20, 1, "0x7f1000", 2 << 20)]}),
            serde_json::json!({"pid": 8, "unmanaged_bytes": 5 << 20, "unmanaged_peak_by_reason": [
                reason(small, 4 << 20, 900, "0x7f2000", 65_024)]}),
            serde_json::json!({"pid": 9, "unmanaged_bytes": 1 << 20, "unmanaged_peak_largest": [
                {"addr": "0x5000", "len": 1 << 20, "bytes": 1 << 20, "why": "the main thread's stack"}]}),
        ];
        for (i, rec) in records.iter().enumerate() {
            std::fs::write(dir.join(format!("{i}.json")), rec.to_string()).expect("a record written");
        }
        let u = unmanaged_in(&dir, Moment::Peak);
        std::fs::remove_dir_all(&dir).expect("the records removed");
        assert_eq!(u.bytes, 66 << 20);
        let whys: Vec<&str> = u.by_reason.iter().map(|r| r.why.as_str()).collect();
        assert_eq!(whys, [small, "shared memory", "the main thread's stack"], "most bytes first");
        let first =
            Reason { why: small.into(), bytes: 62 << 20, mappings: 15_900, largest: (8, "0x7f2000".into(), 65_024) };
        assert_eq!(u.by_reason[0], first);
        let msg = unmanaged_message(&u, 64 << 20, "at its peak");
        for said in [
            "does not hold for 66MiB of anonymous memory uswap does not manage (at its peak, 103 % of the limit); by reason, each process at its own peak:",
            "\n  62MiB in 15900 mappings, the largest 63.5KiB (process 8, at 0x7f2000): smaller than --min-size",
            "\n  2MiB in 1 mapping (process 7, at 0x7f1000): shared memory",
            "\n  1MiB in 1 mapping (process 9, at 0x5000): the main thread's stack",
        ] {
            assert!(msg.contains(said), "{said:?} not in:\n{msg}");
        }
        let many = Unmanaged { by_reason: vec![first; 7], ..u };
        assert!(unmanaged_message(&many, 64 << 20, "now").ends_with("\n  124MiB for 2 other reasons"));
    }

    #[test]
    fn a_run_that_mostly_waited_for_memory_is_said_as_thrash() {
        let s = |stalled: f64, wall: f64| serde_json::json!({"limit_bytes": 128 << 20, "stall_seconds_total": stalled, "wall_seconds": wall, "pgmajfault": 7});
        assert_eq!(thrash_message(&s(0.4, 1.0), false, "zpool"), None, "under half the run");
        assert_eq!(thrash_message(&s(0.6, 0.9), false, "zpool"), None, "too short to judge");
        let msg = thrash_message(&s(45.0, 60.0), false, "zpool").expect("said");
        assert!(msg.contains("75 %") && msg.contains("128MiB") && msg.contains("7 major faults"), "{msg}");
        assert!(!msg.contains("faster device"), "the pool is first already: {msg}");
        let mut with_device = s(45.0, 60.0);
        with_device["device_read_us"] = 350.into();
        let msg = thrash_message(&with_device, false, "file:/var/tmp,zpool").expect("said");
        assert!(msg.contains("7 major faults, the device's reads 50 us of each"), "{msg}");
        assert!(msg.contains("faster device first"), "{msg}");
        // A device that failed, not the limit: no advice to raise the limit.
        let msg = thrash_message(&s(45.0, 60.0), true, "zpool").expect("said");
        assert!(msg.contains("ended by SIGBUS") && !msg.contains("--limit"), "{msg}");
    }
}
