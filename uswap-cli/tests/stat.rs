//! `uswap stat` against real processes: this test binary runs itself as the helper (`--helper
//! MODE [EXIT_AFTER_MS]`: a pager, a region four times its limit written and checked, then
//! it waits), and the real `uswap` binary reads it. Its own `main` (no libtest): the helper
//! needs one, and the tests run one at a time so that no process sees another's pagers.
//! Every child runs under a timeout.

use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::process::CommandExt;
use std::process::{Child, ChildStdout, Command, ExitCode, Output, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use serde_json::Value;
use uswap::{DeviceConfig, FaultMode, Pager, PAGE_SIZE};

// The kernel-engine helpers there are for the bench tests, not these.
#[allow(dead_code)]
mod common;
use common::{run_timed, run_timed_with, skipped};

const LIMIT_BYTES: u64 = 1 << 20;
const HELPER_READY: Duration = Duration::from_secs(60);
const STAT_TIMEOUT: Duration = Duration::from_secs(30);

// ---------------------------------------------------------------------------------------
// The helper process
// ---------------------------------------------------------------------------------------

fn helper(args: &[String]) -> ExitCode {
    let mode = if args.first().map(String::as_str) == Some("signal") { FaultMode::Signal } else { FaultMode::Thread };
    let exit_after = args.get(1).and_then(|ms| ms.parse().ok()).map(Duration::from_millis);
    let pager =
        match Pager::builder().resident_limit(LIMIT_BYTES).fault_mode(mode).device(DeviceConfig::ram(32 << 20)).build()
        {
            Ok(p) => p,
            Err(e) => {
                eprintln!("helper: {e}");
                return ExitCode::from(2);
            }
        };
    let mut region = pager.map(4 * LIMIT_BYTES as usize).expect("helper: map");
    let bytes = region.as_mut_slice();
    let nr_pages = bytes.len() / PAGE_SIZE;
    for i in 0..nr_pages {
        bytes[i * PAGE_SIZE..(i + 1) * PAGE_SIZE].fill(i as u8 ^ 0x5a);
    }
    for i in 0..nr_pages {
        let page = &bytes[i * PAGE_SIZE..(i + 1) * PAGE_SIZE];
        assert!(page.iter().all(|&b| b == i as u8 ^ 0x5a), "helper: page {i} read back wrong");
    }
    println!("ready {}", pager.stats().pswpout);
    let _ = std::io::stdout().flush();
    match exit_after {
        Some(t) => std::thread::sleep(t),
        // Until the test closes our stdin (or dies).
        None => {
            let _ = std::io::stdin().read_to_end(&mut Vec::new());
        }
    }
    drop(region);
    ExitCode::SUCCESS
}

/// A running helper, killed and reaped when dropped.
struct Helper {
    child: Child,
    pid: u32,
    /// `pswpout` the helper saw once its region was written and checked.
    pswpout: u64,
    _stdout: BufReader<ChildStdout>,
}

impl Helper {
    fn start(mode: &str, exit_after_ms: Option<u64>) -> Helper {
        let mut cmd = Command::new(std::env::current_exe().unwrap());
        cmd.arg("--helper").arg(mode);
        if let Some(ms) = exit_after_ms {
            cmd.arg(ms.to_string());
        }
        let mut child = cmd.stdin(Stdio::piped()).stdout(Stdio::piped()).spawn().expect("spawning the helper");
        let pid = child.id();
        let mut stdout = BufReader::new(child.stdout.take().unwrap());
        let (tx, rx) = mpsc::channel();
        let reader = std::thread::spawn(move || {
            let mut line = String::new();
            let _ = stdout.read_line(&mut line);
            let _ = tx.send(line);
            stdout
        });
        let line = match rx.recv_timeout(HELPER_READY) {
            Ok(l) => l,
            Err(_) => {
                let _ = child.kill();
                panic!(
                    "the helper (pid {pid}) did not report ready within {HELPER_READY:?}: stuck mapping or touching"
                );
            }
        };
        let pswpout = line
            .strip_prefix("ready ")
            .and_then(|n| n.trim().parse().ok())
            .unwrap_or_else(|| panic!("helper said {line:?}, not \"ready N\""));
        Helper { child, pid, pswpout, _stdout: reader.join().unwrap() }
    }

    /// Waits for the helper to exit on its own, for at most `timeout`.
    fn wait(&mut self, timeout: Duration) {
        let t0 = Instant::now();
        while self.child.try_wait().unwrap().is_none() {
            assert!(t0.elapsed() < timeout, "helper {} did not exit within {timeout:?}", self.pid);
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Helper {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

// ---------------------------------------------------------------------------------------
// Running `uswap stat`
// ---------------------------------------------------------------------------------------

fn uswap() -> Command {
    Command::new(env!("CARGO_BIN_EXE_uswap"))
}

fn stat(args: &[&str]) -> Output {
    let mut cmd = uswap();
    cmd.arg("stat").args(args);
    run_timed(&mut cmd, STAT_TIMEOUT)
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

fn stat_ok(args: &[&str]) -> String {
    let out = stat(args);
    assert!(out.status.success(), "uswap stat {args:?}: {}\n{}\n{}", out.status, text(&out.stdout), text(&out.stderr));
    text(&out.stdout)
}

// ---------------------------------------------------------------------------------------
// Tests
// ---------------------------------------------------------------------------------------

/// Checks the Prometheus text format: every line a HELP, a TYPE or a sample of a declared
/// family, each family declared once with its samples together; returns the samples as
/// `(name with suffix, labels, value)` and the families' types.
/// A sample: metric name (with any suffix), labels, value.
type Sample = (String, String, f64);
/// A family: name, type.
type FamilyType = (String, String);

fn parse_prometheus(text: &str) -> (Vec<Sample>, Vec<FamilyType>) {
    assert!(text.ends_with('\n'), "no final newline");
    let mut families: Vec<FamilyType> = Vec::new();
    let mut samples = Vec::new();
    let mut help_of: Option<String> = None;
    for line in text.lines() {
        if let Some(rest) = line.strip_prefix("# HELP ") {
            let name = rest.split(' ').next().unwrap().to_string();
            assert!(!families.iter().any(|(n, _)| *n == name), "{name} declared twice");
            assert!(rest.len() > name.len() + 1, "{name} has an empty HELP");
            help_of = Some(name);
        } else if let Some(rest) = line.strip_prefix("# TYPE ") {
            let (name, kind) = rest.split_once(' ').unwrap();
            assert_eq!(help_of.take().as_deref(), Some(name), "TYPE {name} not right after its HELP");
            assert!(["counter", "gauge", "summary"].contains(&kind), "{line}");
            assert_eq!(kind == "counter", name.ends_with("_total"), "counters and only counters end in _total: {line}");
            families.push((name.to_string(), kind.to_string()));
        } else {
            assert!(!line.starts_with('#') && !line.is_empty(), "unexpected line {line:?}");
            let (metric, value) = line.rsplit_once(' ').unwrap();
            let value: f64 = value.parse().unwrap_or_else(|_| panic!("bad value in {line:?}"));
            let (name, labels) = match metric.split_once('{') {
                Some((n, l)) => (n, l.strip_suffix('}').unwrap_or_else(|| panic!("unclosed labels: {line:?}"))),
                None => (metric, ""),
            };
            assert!(name.starts_with("uswap_"), "{line}");
            assert!(name.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_'), "{line}");
            // Samples belong to the family declared last (summaries add _sum and _count).
            let (family, kind) = families.last().unwrap_or_else(|| panic!("sample before any TYPE: {line}"));
            let ok = name == family
                || (kind == "summary"
                    && [format!("{family}_sum"), format!("{family}_count")].contains(&name.to_string()));
            assert!(ok, "sample {name} not in its family's block (last declared {family})");
            for pair in labels.split("\",").filter(|p| !p.is_empty()) {
                let (k, v) = pair.split_once("=\"").unwrap_or_else(|| panic!("bad label {pair:?} in {line}"));
                assert!(k.bytes().all(|b| b.is_ascii_lowercase() || b == b'_'), "{line}");
                let _ = v;
            }
            samples.push((name.to_string(), labels.to_string(), value));
        }
    }
    (samples, families)
}

fn stat_reads_a_running_pager(mode: &str) {
    let h = Helper::start(mode, None);
    assert!(h.pswpout > 0, "the helper swapped nothing out");
    let pid = h.pid.to_string();

    // The table.
    let table = stat_ok(&[&pid]);
    assert!(table.contains(&format!("pid {pid} pager 0 (@uswap.{pid}.0)")), "{table}");
    assert!(table.contains("256 pages"), "the 1 MiB limit is 256 pages: {table}");
    let pswpout: u64 = table
        .split_whitespace()
        .skip_while(|w| *w != "pswpout")
        .nth(1)
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no pswpout in {table}"));
    assert!(pswpout >= h.pswpout, "table says {pswpout}, the helper saw {}", h.pswpout);
    assert!(table.contains("ram"), "the device: {table}");

    // JSON.
    let json = stat_ok(&[&pid, "--json"]);
    let v: Value = serde_json::from_str(&json).unwrap_or_else(|e| panic!("{e}: {json}"));
    assert_eq!(v["pid"], h.pid);
    let pagers = v["pagers"].as_array().unwrap();
    assert_eq!(pagers.len(), 1, "{json}");
    assert_eq!(pagers[0]["socket"], format!("uswap.{pid}.0"));
    let s = &pagers[0]["stats"];
    assert!(s["pswpout"].as_u64().unwrap() >= h.pswpout, "{json}");
    assert_eq!(s["limit_pages"], 256);
    assert!(s["resident_pages"].as_u64().unwrap() <= 256 + uswap::RECLAIM_BATCH_PAGES as u64, "{json}");
    assert!(s["pgfault"].as_u64().unwrap() > 0);
    assert_eq!(s["devices"][0]["name"], "ram");
    assert!(s["publish"]["queries"].as_u64().unwrap() >= 2, "the table and this: {json}");

    // Prometheus.
    let prom = stat_ok(&[&pid, "--prometheus"]);
    let (samples, families) = parse_prometheus(&prom);
    let kind = |n: &str| families.iter().find(|(f, _)| f == n).map(|(_, k)| k.as_str());
    assert_eq!(kind("uswap_pswpout_total"), Some("counter"));
    assert_eq!(kind("uswap_pgfault_total"), Some("counter"));
    assert_eq!(kind("uswap_resident_pages"), Some("gauge"));
    assert_eq!(kind("uswap_limit_pages"), Some("gauge"));
    assert_eq!(kind("uswap_device_slots_used"), Some("gauge"));
    assert_eq!(kind("uswap_fault_latency_seconds"), Some("summary"));
    let sample = |n: &str| samples.iter().find(|(s, _, _)| s == n).unwrap_or_else(|| panic!("no {n}: {prom}"));
    let (_, labels, out) = sample("uswap_pswpout_total");
    assert_eq!(labels, &format!("pid=\"{pid}\",pager=\"0\""));
    assert!(*out >= h.pswpout as f64 && *out > 0.0, "{prom}");
    assert_eq!(sample("uswap_limit_pages").2, 256.0);
    let (_, dev_labels, slots) = sample("uswap_device_nr_slots");
    assert_eq!(dev_labels, &format!("pid=\"{pid}\",pager=\"0\",device=\"0\",device_name=\"ram\""));
    assert_eq!(*slots, (32 << 20) as f64 / PAGE_SIZE as f64);
    assert!(sample("uswap_fault_latency_seconds_count").2 > 0.0);

    // The sum of one pager is that pager.
    let sum = stat_ok(&[&pid, "--json", "--sum"]);
    let v: Value = serde_json::from_str(&sum).unwrap();
    assert_eq!(v["sockets"], serde_json::json!([format!("uswap.{pid}.0")]));
    assert_eq!(v["stats"]["limit_pages"], 256);
    assert!(v["stats"]["pswpout"].as_u64().unwrap() >= h.pswpout);
    let summed = stat_ok(&[&pid, "--sum", "--prometheus"]);
    assert!(summed.contains(&format!("uswap_limit_pages{{pid=\"{pid}\"}} 256\n")), "{summed}");
}

fn stat_reads_a_thread_mode_pager() {
    stat_reads_a_running_pager("thread");
}

fn stat_reads_a_signal_mode_pager() {
    stat_reads_a_running_pager("signal");
}

fn stat_interval_ends_with_a_note_when_the_process_exits() {
    let mut h = Helper::start("thread", Some(1500));
    let pid = h.pid.to_string();
    let mut cmd = uswap();
    cmd.args(["stat", "--interval", "0.2", "--json", &pid]);
    // Reap the helper as soon as it exits, so that its pid is gone rather than a zombie.
    let reaper = std::thread::scope(|scope| {
        let waiter = scope.spawn(|| h.wait(Duration::from_secs(30)));
        let out = run_timed(&mut cmd, STAT_TIMEOUT);
        waiter.join().unwrap();
        out
    });
    let (stdout, stderr) = (text(&reaper.stdout), text(&reaper.stderr));
    assert!(reaper.status.success(), "{}: {stdout}\n{stderr}", reaper.status);
    assert!(stderr.contains(&format!("process {pid} exited")), "{stderr}");
    let reports: Vec<Value> = stdout.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    assert!(reports.len() >= 3, "1.5 s at 0.2 s: {} reports", reports.len());
    // Counters only grow from one report to the next; the socket answered each time.
    let q = |r: &Value| r["pagers"][0]["stats"]["publish"]["queries"].as_u64().unwrap();
    for w in reports.windows(2) {
        assert!(q(&w[1]) > q(&w[0]));
        assert!(w[1]["pagers"][0]["stats"]["pgfault"].as_u64() >= w[0]["pagers"][0]["stats"]["pgfault"].as_u64());
    }
}

fn stat_interval_stops_on_ctrl_c_with_status_0() {
    let h = Helper::start("thread", None);
    let mut cmd = uswap();
    cmd.args(["stat", "--interval", "0.2", &h.pid.to_string()]);
    let out = run_timed_with(&mut cmd, STAT_TIMEOUT, |pid| {
        std::thread::sleep(Duration::from_millis(700));
        // SAFETY: kill(2) sends a signal to our own child; no memory is involved.
        assert_eq!(unsafe { libc::kill(pid as i32, libc::SIGINT) }, 0);
    });
    let (stdout, stderr) = (text(&out.stdout), text(&out.stderr));
    assert!(out.status.success(), "{}: {stdout}\n{stderr}", out.status);
    assert!(stderr.contains("interrupted after"), "{stderr}");
    assert!(stdout.matches("--- ").count() >= 2, "reports every 0.2 s: {stdout}");
    assert!(stdout.matches(&format!("pid {} pager 0", h.pid)).count() >= 2, "{stdout}");
}

fn stat_of_a_pid_without_a_pager_fails_with_status_1() {
    // This process runs no pager.
    let me = std::process::id().to_string();
    let out = stat(&[&me]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out.stderr));
    assert!(text(&out.stderr).contains(&format!("process {me} publishes no uswap counters")), "{}", text(&out.stderr));
    assert!(out.stdout.is_empty());
    // With --interval too: nothing to watch is an error, not an empty watch.
    let out = stat(&[&me, "--interval", "0.1"]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out.stderr));
    // A process that does not exist (above the largest pid_max).
    let out = stat(&["4294967"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(text(&out.stderr).contains("no process 4294967"), "{}", text(&out.stderr));
    // A zombie: `ps` lists it, so "no process" misled; it says the process exited.
    let mut child = std::process::Command::new("true").spawn().expect("spawn true");
    let zombie = child.id().to_string();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while !std::fs::read_to_string(format!("/proc/{zombie}/stat")).is_ok_and(|s| s.contains(") Z ")) {
        assert!(std::time::Instant::now() < deadline, "true did not exit within 10 s");
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    let out = stat(&[&zombie]);
    child.wait().expect("reap true");
    assert_eq!(out.status.code(), Some(1));
    assert!(text(&out.stderr).contains(&format!("process {zombie} has exited (a zombie")), "{}", text(&out.stderr));
}

fn stat_refuses_other_users() {
    // SAFETY: geteuid cannot fail.
    if unsafe { libc::geteuid() } != 0 {
        skipped("stat_refuses_other_users needs root to run uswap stat as another user");
        return;
    }
    let h = Helper::start("thread", None);
    let pid = h.pid.to_string();
    // A copy of the binary another user can run (the build directory may be private).
    let dir = std::env::temp_dir().join(format!("uswap-stat-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let bin = dir.join("uswap");
    std::fs::copy(env!("CARGO_BIN_EXE_uswap"), &bin).unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).unwrap();
    std::fs::set_permissions(&bin, std::fs::Permissions::from_mode(0o755)).unwrap();
    let mut cmd = Command::new(&bin);
    cmd.args(["stat", &pid]).uid(65534).gid(65534);
    let out = run_timed(&mut cmd, STAT_TIMEOUT);
    let _ = std::fs::remove_dir_all(&dir);
    let stderr = text(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("answers only its own user and root"), "{stderr}");
    assert!(stderr.contains("uid 0"), "names the owner: {stderr}");
    assert!(out.stdout.is_empty());
    // The pager counted the refusal (root may read it).
    let v: Value = serde_json::from_str(&stat_ok(&[&pid, "--json"])).unwrap();
    assert_eq!(v["pagers"][0]["stats"]["publish"]["peers_refused"], 1);
}

// ---------------------------------------------------------------------------------------
// The runner
// ---------------------------------------------------------------------------------------

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.first().map(String::as_str) == Some("--helper") {
        return helper(&args[1..]);
    }
    let tests: [(&str, fn()); 6] = [
        ("stat_reads_a_thread_mode_pager", stat_reads_a_thread_mode_pager),
        ("stat_reads_a_signal_mode_pager", stat_reads_a_signal_mode_pager),
        (
            "stat_interval_ends_with_a_note_when_the_process_exits",
            stat_interval_ends_with_a_note_when_the_process_exits,
        ),
        ("stat_interval_stops_on_ctrl_c_with_status_0", stat_interval_stops_on_ctrl_c_with_status_0),
        ("stat_of_a_pid_without_a_pager_fails_with_status_1", stat_of_a_pid_without_a_pager_fails_with_status_1),
        ("stat_refuses_other_users", stat_refuses_other_users),
    ];
    if args.iter().any(|a| a == "--list") {
        for (name, _) in &tests {
            println!("{name}: test");
        }
        return ExitCode::SUCCESS;
    }
    // libtest's conventions, as far as they apply: name filters, and none of these is ignored.
    if args.iter().any(|a| a == "--ignored") {
        return ExitCode::SUCCESS;
    }
    let filters: Vec<&String> = args.iter().filter(|a| !a.starts_with('-')).collect();
    let selected: Vec<_> =
        tests.iter().filter(|(n, _)| filters.is_empty() || filters.iter().any(|f| n.contains(f.as_str()))).collect();
    println!("\nrunning {} tests", selected.len());
    let mut failed = Vec::new();
    for (name, test) in &selected {
        let ok = std::panic::catch_unwind(test).is_ok();
        println!("test {name} ... {}", if ok { "ok" } else { "FAILED" });
        if !ok {
            failed.push(*name);
        }
    }
    println!(
        "\ntest result: {}. {} passed; {} failed",
        if failed.is_empty() { "ok" } else { "FAILED" },
        selected.len() - failed.len(),
        failed.len()
    );
    if failed.is_empty() {
        ExitCode::SUCCESS
    } else {
        println!("failures: {failed:?}");
        ExitCode::FAILURE
    }
}
