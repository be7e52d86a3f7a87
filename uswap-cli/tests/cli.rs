//! Drives the real `uswap` binary: the uswap engines and `ram` everywhere the tests run;
//! the kernel engines (zram, swap file, memory cgroup) where the tests run as root with
//! zram and a memory controller, which CI does. Tests that cannot run say so on stderr.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use serde_json::Value;

// Each test binary uses some of the helpers.
#[allow(dead_code)]
mod common;
use common::{kernel_unavailable, run_timed, skipped, swaps, uswap_for_nobody};

fn uswap() -> Command {
    Command::new(env!("CARGO_BIN_EXE_uswap"))
}

fn tmpdir(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("uswap-cli-{}-{name}", std::process::id()));
    std::fs::create_dir_all(&d).unwrap();
    d
}

fn run_ok(args: &[&str]) -> (String, String) {
    let out = uswap().args(args).output().unwrap();
    let (o, e) = (String::from_utf8_lossy(&out.stdout).to_string(), String::from_utf8_lossy(&out.stderr).to_string());
    assert!(out.status.success(), "{args:?} failed ({}):\n{o}\n{e}", out.status);
    (o, e)
}

fn json(path: &Path) -> Vec<Value> {
    let v: Value = serde_json::from_slice(&std::fs::read(path).unwrap()).unwrap();
    v.as_array().expect("--json writes an array").clone()
}

/// The keys of «Engine core», in every object.
fn assert_engine_core_keys(v: &Value) {
    for key in [
        "engine",
        "workload",
        "pattern",
        "accesses",
        "seconds",
        "accesses_per_sec",
        "fill_mb_per_sec",
        "verify_errors",
        "stats",
        "latency_us",
        "latency_histogram",
    ] {
        assert!(v.get(key).is_some(), "missing {key}: {v}");
    }
    for p in ["p50", "p90", "p99", "p999"] {
        assert!(v["latency_us"][p].as_f64().unwrap() > 0.0, "{v}");
    }
    assert_eq!(v["verify_errors"], 0, "{v}");
    assert!(v["accesses_per_sec"].as_f64().unwrap() > 0.0 && v["fill_mb_per_sec"].as_f64().unwrap() > 0.0);
    // The pmbench histogram holds every timed step.
    let hist: u64 = v["latency_histogram"].as_array().unwrap().iter().map(|b| b["count"].as_u64().unwrap()).sum();
    let subs: u64 = v["latency_histogram"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|b| b["sub_buckets"].as_array().unwrap().iter().map(|c| c.as_u64().unwrap()))
        .sum();
    assert_eq!(hist, subs, "sub-buckets add up to their bucket: {v}");
    if v["latency_unit"] == "access" {
        // Every run's accesses (each run makes the same number).
        assert_eq!(hist, v["accesses"].as_u64().unwrap() * v["runs"].as_u64().unwrap(), "{v}");
    }
}

#[test]
fn bench_writes_the_json_keys_and_verifies_every_access() {
    for mode in ["thread", "signal"] {
        let dir = tmpdir(mode);
        let json_path = dir.join("out.json");
        let (stdout, _) = run_ok(&[
            "bench",
            "--wss",
            "32MiB",
            "--limit",
            "8MiB",
            "--accesses",
            "20000",
            "--threads",
            "2",
            "--fault-mode",
            mode,
            "--verify",
            "full",
            "--json",
            json_path.to_str().unwrap(),
        ]);
        assert!(stdout.contains("acc/s"), "{stdout}");
        assert!(stdout.contains(&format!("uswap-{mode} ")), "one row for the engine: {stdout}");
        let all = json(&json_path);
        assert_eq!(all.len(), 1, "one engine, one object");
        let v = &all[0];
        assert_engine_core_keys(v);
        assert_eq!(v["engine"], format!("uswap-{mode}"));
        assert_eq!((v["workload"].as_str(), v["pattern"].as_str()), (Some("memtouch"), Some("random")));
        assert_eq!(v["accesses"], 20000);
        let stats = &v["stats"];
        for key in [
            "pswpin",
            "pswpout",
            "pgfault_zero",
            "pgfault_swapcache",
            "pgmajfault",
            "resident_pages",
            "swapcache_pages",
        ] {
            assert!(stats.get(key).is_some(), "missing stats.{key}: {stats}");
        }
        assert!(stats["pswpout"].as_u64().unwrap() > 0, "{stats}");
        assert!(stats["devices"][0]["slots_used"].as_u64().is_some(), "{stats}");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}

#[test]
fn file_devices_run_from_the_command_line_with_their_flags() {
    // Each engine gets its own anonymous file in `dir`; polling off and readahead windows
    // read asynchronously, so both waiting paths run. Every page is checked at the end.
    let dir = tmpdir("file-device");
    let j = dir.join("f.json");
    let engines = format!("uswap-signal@file:{d},uswap-thread@file:{d}", d = dir.display());
    run_ok(&[
        "bench",
        "--pattern",
        "seq",
        "--wss",
        "32MiB",
        "--limit",
        "8MiB",
        "--accesses",
        "16384",
        "--engines",
        &engines,
        "--file-poll-us",
        "0",
        "--readahead-async",
        "2",
        "--verify",
        "full",
        "--json",
        j.to_str().unwrap(),
    ]);
    let all = json(&j);
    assert_eq!(all.len(), 2);
    for v in &all {
        assert_eq!(v["verify_errors"], 0, "{v}");
        let st = &v["stats"];
        assert_eq!(st["devices"][0]["name"], format!("file:{}", dir.display()), "{st}");
        assert!(st["swap_ra_async"].as_u64().unwrap() > 0, "windows were read asynchronously: {st}");
        assert!(st["pswpin"].as_u64().unwrap() > 0 && st["pswpout"].as_u64().unwrap() > 0, "{st}");
        assert!(st["swap_ra"].as_u64().unwrap() > 0, "a sequential re-read reads ahead: {st}");
        assert_eq!(st["checksum_errors"], 0, "{st}");
    }
    let out = uswap().args(["bench", "--file-poll-us", "100001"]).output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && err.contains("--file-poll-us"), "{err}");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn bad_input_is_refused_with_a_reason() {
    let cases: &[(&[&str], &str)] = &[
        (&["bench", "--wss", "8MiB", "--limit", "16MiB"], "larger than --wss"),
        (&["bench", "--wss", "12XB"], "unknown size unit"),
        (&["bench", "--limit", "lots"], "cannot parse size"),
        (&["bench", "--kernel-swap-size", "1.2.3G"], "cannot parse size"),
        (&["bench", "--wss", "8MiB", "--limit", "4KiB"], "below the minimum"),
        (&["bench", "--read-pct", "150"], "150"),
        (&["bench", "--engines", "uswap-signal,zswap"], "unknown engine \"zswap\"; known engines"),
        (&["bench", "--engines", "ram,ram"], "named twice"),
        (&["bench", "--engines", "ram", "--fault-mode", "signal"], "name the mode in the engine"),
        (&["bench", "--engines", "ram", "--wss", "8MiB", "--limit", "9MiB"], "no error: ram has no limit"),
        (&["bench", "--engines", "ram,kernel-zram", "--wss", "8MiB", "--limit", "9MiB"], "larger than --wss"),
        (
            &["bench", "--engines", "kernel-zram", "--wss", "64MiB", "--limit", "4MiB"],
            "too small for the kernel engines",
        ),
        (&["bench", "--procs", "2"], "--procs applies to --workload usemem"),
        (&["bench", "--workload", "combined", "--pattern", "seq"], "random workers' pattern"),
        (&["bench", "--workload", "combined", "--wss", "32KiB", "--limit", "16KiB"], "at least 16 pages"),
        (&["bench", "--engines", "ram", "--baseline", "kernel-zram"], "not one of --engines"),
        (&["bench", "--workload", "usemem", "--procs", "64", "--limit", "32MiB"], "splits --limit"),
        (&["bench", "--engines", "uswap-signal@disk"], "unknown device kind"),
    ];
    for (args, needle) in cases {
        let out = uswap().args(*args).args(["--accesses", "1000"]).output().unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        if needle.starts_with("no error") {
            assert!(out.status.success(), "{args:?}: {err}");
            continue;
        }
        assert!(!out.status.success(), "{args:?} succeeded");
        assert!(err.contains(needle), "{args:?}: {err}");
    }
}

/// Runs `uswap ARGS` under [`run_timed`]: a run that does not end (stuck instead of refusing
/// its input) is a failure naming the arguments, not a hung test.
fn run_with_timeout(args: &[&str], limit: Duration) -> Output {
    run_timed(uswap().args(args), limit)
}

#[test]
fn numeric_flags_out_of_range_are_refused_at_parse_time() {
    // Each must end at once with clap's usage error (status 2) naming the flag and the
    // range it takes; before, a NaN or infinite skew made the zipf sampler spin forever.
    let cases: &[(&[&str], &str)] = &[
        (&["--pattern", "zipf", "--zipf-skew", "nan"], "from 0 to 100"),
        (&["--pattern", "zipf", "--zipf-skew", "inf"], "from 0 to 100"),
        (&["--pattern", "zipf", "--zipf-skew", "-1"], "from 0 to 100"),
        (&["--pattern", "zipf", "--zipf-skew", "101"], "from 0 to 100"),
        (&["--pattern", "normal", "--normal-sd", "-1"], "above 0 and at most 100"),
        (&["--pattern", "normal", "--normal-sd", "nan"], "above 0 and at most 100"),
        (&["--pattern", "normal", "--normal-sd", "0"], "above 0 and at most 100"),
        (&["--pattern", "normal", "--normal-sd", "inf"], "above 0 and at most 100"),
        (&["--handler-threads", "0"], "1..=1024"),
        (&["--accesses", "2000000000000"], "0..=1000000000000"),
        (&["--oom-retries", "1000"], "0..=100"),
        (&["--threads", "0"], "1..=1024"),
        (&["--runs", "0"], "1..=100"),
    ];
    for (flags, needle) in cases {
        let mut args = vec!["bench", "--wss", "16MiB", "--limit", "4MiB"];
        args.extend_from_slice(flags);
        let out = run_with_timeout(&args, Duration::from_secs(60));
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{flags:?}: {err}");
        let flag = flags[flags.len() - 2];
        assert!(err.contains(flag) && err.contains(needle), "{flags:?} should name {flag} and {needle:?}: {err}");
    }
    // The edges of each range are taken.
    for flags in [["--zipf-skew", "0"], ["--zipf-skew", "100"], ["--normal-sd", "100"]] {
        let pattern = if flags[0] == "--zipf-skew" { "zipf" } else { "normal" };
        let mut args = vec!["bench", "--wss", "16MiB", "--limit", "4MiB", "--accesses", "2000", "--pattern", pattern];
        args.extend_from_slice(&flags);
        let out = run_with_timeout(&args, Duration::from_secs(120));
        assert!(out.status.success(), "{flags:?}: {}", String::from_utf8_lossy(&out.stderr));
    }
}

#[test]
fn a_working_set_larger_than_memory_is_refused_before_it_starts() {
    // Before, the run was started and the kernel's OOM killer ended it half-way.
    for engines in ["uswap-thread", "uswap-signal@ram", "ram"] {
        let args = ["bench", "--wss", "1TiB", "--limit", "64MiB", "--accesses", "1000", "--engines", engines];
        let out = run_with_timeout(&args, Duration::from_secs(60));
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{engines}: {err}");
        assert!(err.contains("1024.0 GiB of memory") && err.contains("GiB available"), "{engines}: {err}");
        assert!(err.contains("MemAvailable") && err.contains("give a smaller --wss"), "{engines}: {err}");
    }
    // A resident limit larger than memory, on a device outside memory.
    let args = ["bench", "--wss", "1TiB", "--limit", "900GiB", "--accesses", "1000", "--device", "file:/var/tmp"];
    let out = run_with_timeout(&args, Duration::from_secs(60));
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains("--limit 900GiB resident") && err.contains("or --limit"), "{err}");
}

#[test]
fn workloads_report_every_engine_and_side() {
    let dir = tmpdir("workloads");
    let j = dir.join("w.json");
    let p = j.to_str().unwrap();
    let common = ["--wss", "32MiB", "--limit", "8MiB", "--verify", "full", "--json", p];
    // usemem in two processes (each its own pager) and in threads.
    run_ok(
        &[
            &["bench", "--workload", "usemem", "--pattern", "seq", "--procs", "2", "--accesses", "2000000"][..],
            &["--engines", "uswap-signal,uswap-thread,ram"],
            &common,
        ]
        .concat(),
    );
    let all = json(&j);
    assert_eq!(
        all.iter().map(|v| v["engine"].as_str().unwrap()).collect::<Vec<_>>(),
        ["uswap-signal", "uswap-thread", "ram"]
    );
    for v in &all {
        assert_engine_core_keys(v);
        assert_eq!((v["procs"].as_u64(), v["latency_unit"].as_str()), (Some(2), Some("page")));
        assert_eq!(v["accesses"], 2_000_000, "word accesses of both processes");
        assert!(v["mb_per_sec"].as_f64().unwrap() > 0.0);
    }
    assert!(all[0]["stats"]["pswpout"].as_u64().unwrap() > 0, "both pagers swapped");
    assert_eq!(all[0]["stats"]["per_process"].as_array().unwrap().len(), 2);
    assert!(all[2]["limit_bytes"].is_null(), "ram has no limit");
    // pmbench zipf, with the histogram printed as pmbench does.
    let (out, _) = run_ok(
        &[
            &[
                "bench",
                "--workload",
                "pmbench",
                "--pattern",
                "zipf",
                "--zipf-skew",
                "1.2",
                "--accesses",
                "30000",
                "--histogram",
            ][..],
            &["--engines", "uswap-thread,ram"],
            &common,
        ]
        .concat(),
    );
    assert!(out.contains("latency histogram of uswap-thread") && out.contains(" ns: "), "{out}");
    let all = json(&j);
    assert_eq!(all.len(), 2);
    for v in &all {
        assert_engine_core_keys(v);
        assert_eq!(v["pattern"], "zipf");
    }
    run_ok(
        &[
            &["bench", "--workload", "pmbench", "--pattern", "normal", "--accesses", "30000"][..],
            &["--engines", "uswap-signal"],
            &common,
        ]
        .concat(),
    );
    assert_eq!(json(&j)[0]["pattern"], "normal");
    // combined: both sides, for each engine, with two runs.
    let plots = dir.join("plots");
    let (out, _) = run_ok(
        &[
            &[
                "bench",
                "--workload",
                "combined",
                "--accesses",
                "20000",
                "--runs",
                "2",
                "--plot",
                plots.to_str().unwrap(),
            ][..],
            &["--engines", "uswap-signal,ram", "--baseline", "ram"],
            &common,
        ]
        .concat(),
    );
    assert!(out.contains("×ram") && out.contains("random") && out.contains("seq"), "{out}");
    let all = json(&j);
    let rows: Vec<(&str, &str, &str)> = all
        .iter()
        .map(|v| (v["engine"].as_str().unwrap(), v["side"].as_str().unwrap(), v["pattern"].as_str().unwrap()))
        .collect();
    assert_eq!(
        rows,
        [
            ("uswap-signal", "seq", "seq"),
            ("uswap-signal", "random", "random"),
            ("ram", "seq", "seq"),
            ("ram", "random", "random")
        ]
    );
    for v in &all {
        assert_engine_core_keys(v);
        assert_eq!(v["runs_accesses_per_sec"].as_array().unwrap().len(), 2);
    }
    assert_eq!(all[1]["accesses"], 20000);
    assert!(all[0]["accesses"].as_u64().unwrap() > 0, "the stream ran alongside");
    for f in ["latency-cdf.svg", "throughput.svg"] {
        let svg = std::fs::read_to_string(plots.join(f)).unwrap();
        assert!(svg.starts_with("<svg") && svg.trim_end().ends_with("</svg>"), "{f}");
        assert!(svg.contains("uswap-signal (random)") && svg.contains("ram (seq)"), "{f} names every series");
    }
    let cdf = std::fs::read_to_string(plots.join("latency-cdf.svg")).unwrap();
    assert_eq!(cdf.matches("<polyline").count(), 4, "one line per engine and side");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn report_rewrites_only_the_generated_blocks() {
    let dir = tmpdir("report");
    let md = dir.join("BENCHMARKS.md");
    let begin =
        |id: &str| format!("<!-- BEGIN GENERATED {id}: written by `uswap report`, edit outside the markers -->");
    let end = |id: &str| format!("<!-- END GENERATED {id} -->");
    std::fs::write(
        &md,
        format!(
            "# Benchmarks\n\nHand-written intro.\n\n## Engine core\n\n{}\nold figures\n{}\n\nReading: kept.\n\n## Design\n\nAlso kept.\n",
            begin("engine-core"),
            end("engine-core")
        ),
    )
    .unwrap();
    let (list, _) = run_ok(&["report", "--list"]);
    assert!(list.lines().count() >= 6 && list.contains("combined: uswap bench --workload combined"), "{list}");
    run_ok(&[
        "report",
        "--out",
        md.to_str().unwrap(),
        "--only",
        "engine-core,combined",
        "--engines",
        "uswap-signal,ram",
        "--shrink",
        "64",
        "--runs",
        "1",
    ]);
    let doc = std::fs::read_to_string(&md).unwrap();
    for kept in ["Hand-written intro.", "Reading: kept.", "## Design\n\nAlso kept."] {
        assert!(doc.contains(kept), "{kept:?} lost:\n{doc}");
    }
    assert!(!doc.contains("old figures"), "{doc}");
    assert!(doc.contains("**Machine:**") && doc.contains(&begin("machine")), "{doc}");
    assert!(doc.contains("sudo uswap bench --workload memtouch --pattern random --wss 16MiB"), "{doc}");
    assert!(doc.contains("| uswap-signal | seq |"), "combined appended with its sides:\n{doc}");
    assert_eq!(doc.matches(&begin("combined")).count(), 1);
    assert!(doc.find("Reading: kept.").unwrap() < doc.find(&begin("combined")).unwrap(), "new sections go last");
    for f in ["engine-core-latency-cdf.svg", "engine-core-throughput.svg", "combined-throughput.svg"] {
        assert!(dir.join("docs/bench").join(f).exists(), "{f}");
        assert!(doc.contains(&format!("(docs/bench/{f})")) || f.contains("combined-throughput"), "{f} linked");
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

/// An entry whose bench fails (here: a file device in a directory that does not exist) keeps
/// its section's earlier figures, and the report goes on to the next entry; the exit status
/// says something failed, and which entries to run again.
#[test]
fn report_goes_on_past_an_entry_that_fails() {
    let dir = tmpdir("report-fails");
    let md = dir.join("BENCHMARKS.md");
    let block = "<!-- BEGIN GENERATED engine-core: written by `uswap report`, edit outside the markers -->\nold figures\n<!-- END GENERATED engine-core -->";
    std::fs::write(&md, format!("# Benchmarks\n\n## Engine core\n\n{block}\n")).unwrap();
    let out = uswap()
        .args(["report", "--out", md.to_str().unwrap(), "--only", "engine-core,readahead-random"])
        .args(["--engines", "uswap-signal@file:/nonexistent-uswap-dir/swap", "--shrink", "64", "--runs", "1"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    for id in ["engine-core", "readahead-random"] {
        assert!(
            err.contains(&format!("suite entry {id}: swap device /nonexistent-uswap-dir/swap")),
            "{id} not tried:\n{err}"
        );
    }
    assert!(err.contains("rerun them with --only engine-core,readahead-random"), "{err}");
    let doc = std::fs::read_to_string(&md).unwrap();
    assert!(doc.contains(block), "the failed entry's figures were not kept:\n{doc}");
    assert!(doc.contains("**Machine:**"), "{doc}");
    std::fs::remove_dir_all(&dir).unwrap();
}

// ---------------------------------------------------------------------------------------
// Kernel engines: root, zram, a memory controller; they change the machine's swap.
// ---------------------------------------------------------------------------------------

/// One kernel-engine test at a time in this process (others wait on the bench's own lock).
static KERNEL: Mutex<()> = Mutex::new(());

macro_rules! kernel_test {
    () => {{
        let guard = KERNEL.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(why) = kernel_unavailable() {
            skipped(&format!("kernel engines need root, zram, a memory controller, swap off: {why}"));
            return;
        }
        guard
    }};
}

fn cgroup_dirs(pid: u32) -> Vec<PathBuf> {
    ["/sys/fs/cgroup/memory", "/sys/fs/cgroup/unified", "/sys/fs/cgroup"]
        .iter()
        .map(|r| Path::new(r).join(format!("uswap-bench-{pid}")))
        .collect()
}

/// What the issue asks: no swap active, no cgroup, no swap file, zram reset.
fn assert_machine_as_found(pid: u32) {
    assert_eq!(swaps(), Vec::<String>::new(), "swap left on");
    for d in cgroup_dirs(pid) {
        assert!(!d.exists(), "cgroup {} left", d.display());
    }
    let file = PathBuf::from(format!("/var/tmp/uswap-bench-{pid}.swap"));
    assert!(!file.exists(), "{} left", file.display());
    assert_eq!(std::fs::read_to_string("/sys/block/zram0/disksize").unwrap().trim(), "0", "zram0 not reset");
}

/// Waits until bench `pid` has its workload running in its cgroup, with swap on.
fn wait_until_running(pid: u32, child: &mut std::process::Child) {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let running = cgroup_dirs(pid)
            .iter()
            .any(|d| std::fs::read_to_string(d.join("cgroup.procs")).is_ok_and(|p| !p.trim().is_empty()));
        if running && !swaps().is_empty() {
            // Let it get into the fill and access phases.
            std::thread::sleep(Duration::from_millis(1500));
            return;
        }
        if let Some(st) = child.try_wait().unwrap() {
            panic!("bench ended early: {st}");
        }
        assert!(Instant::now() < deadline, "bench {pid} never started its kernel engine");
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn kernel_engines_run_side_by_side_and_leave_no_trace() {
    let _g = kernel_test!();
    let dir = tmpdir("kernel");
    let j = dir.join("k.json");
    let child = uswap()
        .args(["bench", "--workload", "combined", "--wss", "64MiB", "--limit", "48MiB", "--accesses", "30000"])
        .args(["--engines", "uswap-signal,kernel-zram,kernel-file,ram", "--verify", "full", "--wait-lock"])
        .args(["--json", j.to_str().unwrap()])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let pid = child.id();
    let out = child.wait_with_output().unwrap();
    let (o, e) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "{o}\n{e}");
    assert!(o.contains("×zram"), "ratio columns against kernel-zram: {o}");
    let all = json(&j);
    assert_eq!(all.len(), 8, "four engines, two sides each");
    for v in &all {
        assert_engine_core_keys(v);
        if v["engine"].as_str().unwrap().starts_with("kernel-") {
            for k in ["pswpin", "pswpout", "swap_ra", "swap_ra_hit"] {
                assert!(v["stats"][k].is_u64(), "{k}: {v}");
            }
            assert!(v["stats"]["pswpout"].as_u64().unwrap() > 0, "the kernel swapped: {v}");
            assert!(v["swapout_mb_per_sec"].as_f64().unwrap() > 0.0, "{v}");
            assert_eq!(v["limit_bytes"], 48 << 20);
        }
    }
    let zram = all.iter().find(|v| v["engine"] == "kernel-zram").unwrap();
    assert_eq!(zram["device"], "/dev/zram0 (lz4)");
    assert_machine_as_found(pid);
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn an_interrupted_kernel_run_cleans_up() {
    let _g = kernel_test!();
    for engine in ["kernel-file", "kernel-zram"] {
        let mut child = uswap()
            .args(["bench", "--wss", "64MiB", "--limit", "48MiB", "--accesses", "1000000000", "--wait-lock"])
            .args(["--engines", engine])
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let pid = child.id();
        wait_until_running(pid, &mut child);
        // SAFETY: kill(2) on our own child.
        unsafe { libc::kill(pid as i32, libc::SIGINT) };
        let out: Output = child.wait_with_output().unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(130), "{engine}: {err}");
        assert!(err.contains("interrupted; everything it had set up is cleaned up"), "{err}");
        assert_machine_as_found(pid);
        assert_eq!(std::fs::read_to_string("/run/lock/uswap-bench.lock").unwrap(), "", "the lock's record is empty");
    }
}

/// Stops the bench (SIGSTOP) at a moment its swap device is on. Between attempts (an OOM
/// kill is retried) the bench tears the device down and sets it up again; killing it there
/// would test nothing.
fn stop_with_swap_on(pid: u32, child: &mut std::process::Child) {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        // SAFETY: kill(2) on our own child.
        unsafe { libc::kill(pid as i32, libc::SIGSTOP) };
        // The stop is delivered asynchronously: wait (bounded) until /proc says "T".
        let stopped = || {
            let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
            stat.rsplit_once(") ").is_some_and(|(_, rest)| rest.starts_with('T'))
        };
        for _ in 0..1000 {
            if stopped() {
                break;
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        assert!(stopped(), "bench {pid} did not stop on SIGSTOP");
        if swaps().len() == 1 {
            return;
        }
        // SAFETY: as above.
        unsafe { libc::kill(pid as i32, libc::SIGCONT) };
        if let Some(st) = child.try_wait().unwrap() {
            panic!("bench ended early: {st}");
        }
        assert!(Instant::now() < deadline, "bench {pid} never had its swap device on when stopped");
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn a_killed_run_is_cleaned_up_by_the_next() {
    let _g = kernel_test!();
    let mut child = uswap()
        .args(["bench", "--wss", "64MiB", "--limit", "48MiB", "--accesses", "1000000000", "--wait-lock"])
        .args(["--engines", "kernel-file"])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let pid = child.id();
    wait_until_running(pid, &mut child);
    stop_with_swap_on(pid, &mut child);
    child.kill().unwrap();
    let out = child.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(swaps().len(), 1, "SIGKILL leaves the swap file on; the bench said: {err}");
    let record = std::fs::read_to_string("/run/lock/uswap-bench.lock").unwrap();
    assert!(record.contains(&format!("uswap-bench-{pid}.swap")), "{record}");
    // The next run (without kernel engines failing) finds the record and undoes it.
    let out = uswap()
        .args([
            "bench",
            "--wss",
            "32MiB",
            "--limit",
            "16MiB",
            "--accesses",
            "2000",
            "--engines",
            "kernel-zram",
            "--wait-lock",
        ])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    assert!(err.contains(&format!("a uswap bench (pid {pid}) died without cleaning up")), "{err}");
    assert!(err.contains("swapoff and removed") && err.contains("removed cgroup"), "{err}");
    assert_machine_as_found(pid);
}

#[test]
fn kernel_engines_refuse_clearly() {
    let _g = kernel_test!();
    let bench = ["bench", "--wss", "32MiB", "--limit", "16MiB", "--accesses", "2000", "--engines", "kernel-zram,ram"];
    // Not root.
    let exe = uswap_for_nobody();
    let out = Command::new("setpriv")
        .args(["--reuid=65534", "--regid=65534", "--clear-groups"])
        .arg(&exe)
        .args(bench)
        .output()
        .expect("setpriv (util-linux) runs");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{err}");
    assert!(err.contains("kernel engines (kernel-zram) need root") && err.contains("sudo"), "{err}");
    // Another bench holds the lock.
    let lock = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open("/run/lock/uswap-bench.lock")
        .unwrap();
    use std::os::fd::AsRawFd;
    // Wait our turn like a bench would, then hold it.
    // SAFETY: flock on our descriptor.
    assert_eq!(unsafe { libc::flock(lock.as_raw_fd(), libc::LOCK_EX) }, 0);
    let out = uswap().args(bench).output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        err.contains("another uswap bench holds /run/lock/uswap-bench.lock") && err.contains("--wait-lock"),
        "{err}"
    );
    // With --wait-lock it waits, then runs.
    let waiter = uswap()
        .args(bench)
        .arg("--wait-lock")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_millis(700));
    // Swap already in use: refused once the lock is free (a second swap file of ours).
    let f = PathBuf::from(format!("/var/tmp/uswap-cli-test-{}.swap", std::process::id()));
    drop(lock);
    let out = waiter.wait_with_output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(String::from_utf8_lossy(&out.stderr).contains("waiting for it"));
    let sh = |c: &str| assert!(Command::new("sh").arg("-c").arg(c).status().unwrap().success(), "{c}");
    sh(&format!("fallocate -l 16M {0} && chmod 600 {0} && mkswap {0} >/dev/null && swapon {0}", f.display()));
    let out = uswap().args(bench).arg("--wait-lock").output().unwrap();
    sh(&format!("swapoff {0} && rm -f {0}", f.display()));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(err.contains("already has swap in use") && err.contains(&f.display().to_string()), "{err}");
    assert_eq!(swaps(), Vec::<String>::new());
}

/// The `HOST:PORT`s of the servers `--redis-local` said it started (stderr), and their
/// directory.
fn local_redis_of(stderr: &str) -> (Vec<String>, PathBuf) {
    let line =
        stderr.lines().find_map(|l| l.strip_prefix("uswap bench: local Redis: ")).unwrap_or_else(|| panic!("{stderr}"));
    let (urls, dir) = line.split_once(" (logs in ").unwrap();
    let addrs = urls
        .split(", ")
        .flat_map(|u| u.trim_start_matches("redis-cluster://").trim_start_matches("redis://").split(';'))
        .map(str::to_string)
        .collect();
    (addrs, PathBuf::from(dir.trim_end_matches(')')))
}

/// Every server is gone (nothing listens on its port) and its directory removed.
fn assert_local_redis_gone(stderr: &str) {
    let (addrs, dir) = local_redis_of(stderr);
    assert!(addrs.len() >= 2, "{addrs:?}");
    for a in &addrs {
        let addr: std::net::SocketAddr = a.parse().unwrap();
        let refused = std::net::TcpStream::connect_timeout(&addr, Duration::from_secs(1)).is_err();
        assert!(refused, "redis-server on {a} still runs after the bench ended");
    }
    assert!(!dir.exists(), "{} left behind", dir.display());
}

fn redis_server_missing() -> bool {
    let missing = Command::new("redis-server").arg("--version").output().is_err();
    if missing {
        skipped("redis-server is not installed (apt-get install redis-server)");
    }
    missing
}

/// `uswap bench --redis-local LOCAL --engines ENGINES` (two engines) with every access
/// verified: each run read back every byte, paged both ways through a last device whose
/// name starts with `device`, with no checksum error and no failed fault; and the servers
/// and their directory are gone after.
fn bench_on_local_redis(dir: &Path, local: &str, engines: &str, device: &str) {
    let j = dir.join("r.json");
    let out = run_timed(
        uswap()
            .args(["bench", "--redis-local", local, "--engines", engines, "--wss", "32MiB", "--limit", "8MiB"])
            .args(["--accesses", "16384", "--verify", "full", "--json", j.to_str().unwrap()]),
        Duration::from_secs(300),
    );
    let err = String::from_utf8_lossy(&out.stderr).to_string();
    assert!(out.status.success(), "{err}");
    let all = json(&j);
    assert_eq!(all.len(), 2);
    for v in &all {
        assert_eq!(v["verify_errors"], 0, "{v}");
        let st = &v["stats"];
        let dev = st["devices"].as_array().unwrap().last().unwrap();
        assert!(dev["name"].as_str().unwrap().starts_with(device), "{st}");
        assert!(st["pswpin"].as_u64().unwrap() > 0 && st["pswpout"].as_u64().unwrap() > 0, "{st}");
        assert_eq!((st["checksum_errors"].as_u64(), st["fault_error"].as_u64()), (Some(0), Some(0)), "{st}");
    }
    assert_local_redis_gone(&err);
}

#[test]
fn the_redis_tier_runs_from_bench_on_local_servers_that_bench_stops() {
    if redis_server_missing() {
        return;
    }
    let dir = tmpdir("redis");
    let engines = "uswap-signal@redis://local?replicas=1,uswap-thread@zpool:4MiB+redis://local?encrypt=off";
    bench_on_local_redis(&dir, "1x1", engines, "redis://127.0.0.1:");

    // Ctrl-C: the run stops, cleans up, and the servers are killed.
    let out = common::run_timed_with(
        uswap().args(["bench", "--redis-local", "1x1", "--engines", "uswap-signal@redis://local"]).args([
            "--wss",
            "64MiB",
            "--limit",
            "8MiB",
            "--accesses",
            "1000000000",
        ]),
        Duration::from_secs(120),
        |pid| {
            std::thread::sleep(Duration::from_millis(2500));
            // SAFETY: kill(2) on our own child.
            unsafe { libc::kill(pid as i32, libc::SIGINT) };
        },
    );
    let err = String::from_utf8_lossy(&out.stderr).to_string();
    assert_eq!(out.status.code(), Some(130), "{err}");
    assert_local_redis_gone(&err);

    for (args, needle) in [
        (&["--engines", "uswap-signal@redis://local"][..], "names redis://local but --redis-local is not given"),
        (&["--engines", "uswap-signal@redis://127.0.0.1"][..], "needs a port"),
        (&["--engines", "uswap-signal@redis://127.0.0.1:6379?replica=1"][..], "unknown option \"replica\""),
        (&["--redis-local", "2y3"][..], "--redis-local \"2y3\""),
    ] {
        let out = run_timed(uswap().arg("bench").args(args).args(["--accesses", "1000"]), Duration::from_secs(60));
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success() && err.contains(needle), "{args:?}: {err}");
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

/// Whether process `pid` has a thread named `name`.
fn has_thread(pid: u32, name: &str) -> bool {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else { return false };
    tasks.flatten().any(|t| std::fs::read_to_string(t.path().join("comm")).is_ok_and(|c| c.trim() == name))
}

/// The `redis-server` processes whose parent is `pid` (`--redis-local`'s servers).
fn redis_children_of(pid: u32) -> Vec<libc::pid_t> {
    let mut out = vec![];
    for e in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(stat) = std::fs::read_to_string(e.path().join("stat")) else { continue };
        // pid (comm) state ppid ...
        let Some((head, rest)) = stat.rsplit_once(") ") else { continue };
        let ppid = rest.split(' ').nth(1).and_then(|v| v.parse::<u32>().ok());
        if head.contains("(redis-server") && ppid == Some(pid) {
            out.extend(e.file_name().to_str().and_then(|s| s.parse::<libc::pid_t>().ok()));
        }
    }
    out
}

/// `uswap bench` on local servers that stop answering (SIGSTOP, both of them: every read
/// waits out its failover deadline, in a fault of the bench's own workload thread): SIGTERM
/// ends it within two seconds, status 130, and the servers and their directory are gone,
/// in both fault modes. Before, the bench ran on for 116 s (signal mode) and 235 s
/// (thread mode) until a read failed for good and it died of SIGBUS.
#[test]
fn sigterm_ends_a_bench_whose_device_stopped_answering_within_two_seconds() {
    if redis_server_missing() {
        return;
    }
    for engine in ["uswap-signal@redis://local", "uswap-thread@redis://local"] {
        let mut stopped_at = None;
        let out = common::run_timed_with(
            uswap().args(["bench", "--redis-local", "1x1", "--engines", engine]).args([
                "--wss",
                "64MiB",
                "--limit",
                "8MiB",
                "--accesses",
                "1000000000",
            ]),
            Duration::from_secs(120),
            |pid| {
                // The servers are in sync and the workload pages once the pager's threads
                // run (the replica's first synchronisation takes a few seconds).
                let until = Instant::now() + Duration::from_secs(60);
                while !has_thread(pid, "uswap-reclaim") && Instant::now() < until {
                    std::thread::sleep(Duration::from_millis(50));
                }
                std::thread::sleep(Duration::from_millis(1500));
                let servers = redis_children_of(pid);
                assert_eq!(servers.len(), 2, "{engine}: the local servers: {servers:?}");
                for s in servers {
                    // SAFETY: kill(2) of a server the bench under test started.
                    unsafe { libc::kill(s, libc::SIGSTOP) };
                }
                std::thread::sleep(Duration::from_millis(1500));
                stopped_at = Some(Instant::now());
                // SAFETY: kill(2) of our own child.
                unsafe { libc::kill(pid as i32, libc::SIGTERM) };
            },
        );
        let took = stopped_at.unwrap().elapsed();
        let err = String::from_utf8_lossy(&out.stderr).to_string();
        assert_eq!(out.status.code(), Some(130), "{engine}: {err}");
        assert!(took < Duration::from_secs(2), "{engine}: SIGTERM took {took:?}: {err}");
        assert_local_redis_gone(&err);
    }
}

/// `--redis-local 3x1:cluster` starts a local Redis Cluster, `redis-cluster://local` names
/// it: a run through it in each fault mode verifies every access, and the servers and
/// their directory are gone after. Naming the other kind is refused, saying which to name.
#[test]
fn the_cluster_device_runs_from_bench_on_a_local_cluster_that_bench_stops() {
    if redis_server_missing() {
        return;
    }
    let dir = tmpdir("redis-cluster");
    let engines = "uswap-signal@redis-cluster://local?replicas=1,uswap-thread@redis-cluster://local";
    bench_on_local_redis(&dir, "3x1:cluster", engines, "redis-cluster://127.0.0.1:");
    for (local, engine, needle) in [
        ("3x1:cluster", "uswap-signal@redis://local", "name redis-cluster://local"),
        ("1x1", "uswap-signal@redis-cluster://local", "name redis://local"),
        ("2x1:cluster", "uswap-signal@redis-cluster://local", "needs 3 primaries at least"),
    ] {
        let out = run_timed(
            uswap().args(["bench", "--redis-local", local, "--engines", engine, "--accesses", "1000"]),
            Duration::from_secs(120),
        );
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success() && err.contains(needle), "{local} {engine}: {err}");
    }
    std::fs::remove_dir_all(&dir).unwrap();
}
