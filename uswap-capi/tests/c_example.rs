//! The C API from C: `examples/example.c` compiled with the system C compiler against
//! `include/uswap.h` and `libuswap.so`, run in both fault modes against the real kernel, its
//! output and exit status checked (a datagram received into a page that was out included:
//! in signal mode, through the system-call guard).
//!
//! Getting `libuswap.so`: `cargo test` does not build a cdylib-only library for integration
//! tests (it only builds libraries it can link into them), so this test runs
//! `cargo build -p uswap-capi` itself, into a target directory of its own under cargo's
//! `CARGO_TARGET_TMPDIR`: the outer `cargo test` holds the lock on its own target directory
//! until the tests finish, and a cargo waiting for it would wait forever. The first run
//! builds the engine once more there (about half a minute); later runs are incremental.
//!
//! Every child (cargo, cc, the example) runs under a timeout; on expiry its process group is
//! killed and the test fails saying which step stuck. Skipped (SKIPPED on stderr) only when
//! this process may not open a userfaultfd.

use std::io::Read;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};
use uswap_testkit::skipped;

const MIB: u64 = 1 << 20;
/// The example's region: four times its 16 MiB limit.
const REGION_BYTES: u64 = 64 * MIB;

fn workspace_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("uswap-capi is inside the workspace").to_path_buf()
}

fn scratch_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("uswap-capi")
}

/// Why uswap cannot run here, if it cannot: the only reason this test skips.
fn userfaultfd_unusable() -> Option<String> {
    let built = engine::Pager::builder()
        .resident_limit(engine::MIN_LIMIT_BYTES)
        .device(engine::DeviceConfig::ram(4 * MIB))
        .handler_threads(1)
        .build();
    match built {
        Err(
            e @ (engine::Error::UserfaultfdDenied { .. }
            | engine::Error::UserfaultfdUnsupported { .. }
            | engine::Error::KernelTooOld { .. }),
        ) => Some(e.to_string()),
        Err(e) => panic!("a minimal pager failed for a reason other than userfaultfd access: {e}"),
        Ok(_) => None,
    }
}

#[derive(Debug)]
struct Finished {
    status: ExitStatus,
    stdout: String,
    stderr: String,
}

/// Runs `cmd` in its own process group with stdout and stderr captured in files, killing the
/// group if it is not done within `timeout`. `what` names the step in failures.
fn run(mut cmd: Command, what: &str, timeout: Duration) -> Finished {
    let dir = scratch_dir().join("output");
    std::fs::create_dir_all(&dir).unwrap_or_else(|e| panic!("creating {}: {e}", dir.display()));
    let tag = format!("{}-{:?}", std::process::id(), std::thread::current().id()).replace(['(', ')'], "");
    let (out_path, err_path) = (dir.join(format!("{tag}.out")), dir.join(format!("{tag}.err")));
    let file = |p: &Path| std::fs::File::create(p).unwrap_or_else(|e| panic!("creating {}: {e}", p.display()));
    cmd.stdin(Stdio::null()).stdout(file(&out_path)).stderr(file(&err_path)).process_group(0);
    let mut child = cmd.spawn().unwrap_or_else(|e| panic!("{what}: cannot start {cmd:?}: {e}"));
    let deadline = Instant::now() + timeout;
    let status = loop {
        match child.try_wait() {
            Ok(Some(status)) => break Some(status),
            Ok(None) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(20)),
            Ok(None) => break None,
            Err(e) => panic!("{what}: waiting for the child: {e}"),
        }
    };
    let read = |p: &Path| {
        let mut s = String::new();
        let _ = std::fs::File::open(p).and_then(|mut f| f.read_to_string(&mut s));
        let _ = std::fs::remove_file(p);
        s
    };
    let Some(status) = status else {
        let pgid = child.id() as libc::pid_t;
        // SAFETY: kill(2) with a negative pid signals the process group the child leads
        // (process_group(0) made it its own); no memory is involved.
        unsafe { libc::kill(-pgid, libc::SIGKILL) };
        let _ = child.wait();
        panic!(
            "{what} did not finish within {} s and was killed: it is stuck there. stdout so far:\n{}\nstderr so far:\n{}",
            timeout.as_secs(),
            read(&out_path),
            read(&err_path)
        );
    };
    Finished { status, stdout: read(&out_path), stderr: read(&err_path) }
}

/// The directory holding a freshly built `libuswap.so` (built once per test binary).
fn libuswap_dir() -> &'static Path {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let target_dir = scratch_dir().join("target");
        let cargo = std::env::var_os("CARGO").unwrap_or_else(|| env!("CARGO").into());
        let mut cmd = Command::new(cargo);
        cmd.arg("build")
            .arg("-p")
            .arg("uswap-capi")
            .arg("--manifest-path")
            .arg(workspace_dir().join("Cargo.toml"))
            .arg("--target-dir")
            .arg(&target_dir)
            // A host build whatever the caller's environment names: the library is loaded here.
            .env_remove("CARGO_BUILD_TARGET");
        let built = run(cmd, "cargo build -p uswap-capi (for libuswap.so)", Duration::from_secs(900));
        assert!(built.status.success(), "cargo build -p uswap-capi failed ({}):\n{}", built.status, built.stderr);
        let dir = target_dir.join("debug");
        assert!(
            dir.join("libuswap.so").is_file(),
            "cargo build succeeded but made no {}",
            dir.join("libuswap.so").display()
        );
        dir
    })
}

/// `examples/example.c` compiled against the header and the library (once per test binary).
fn example_binary() -> &'static Path {
    static BIN: OnceLock<PathBuf> = OnceLock::new();
    BIN.get_or_init(|| {
        let lib_dir = libuswap_dir();
        let crate_dir = Path::new(env!("CARGO_MANIFEST_DIR"));
        let out = scratch_dir().join("example");
        let cc = std::env::var_os("CC").unwrap_or_else(|| "cc".into());
        let mut cmd = Command::new(&cc);
        cmd.args(["-std=c11", "-Wall", "-Wextra", "-Werror", "-pedantic", "-O2", "-I"])
            .arg(crate_dir.join("include"))
            .arg(crate_dir.join("examples/example.c"))
            .arg("-L")
            .arg(lib_dir)
            .arg("-luswap")
            .arg(format!("-Wl,-rpath,{}", lib_dir.display()))
            .arg("-o")
            .arg(&out);
        let compiled = run(cmd, "compiling examples/example.c", Duration::from_secs(120));
        assert!(
            compiled.status.success(),
            "{cc:?} could not compile examples/example.c against include/uswap.h ({}):\n{}{}",
            compiled.status,
            compiled.stdout,
            compiled.stderr
        );
        out
    })
}

/// Runs the example in `mode` and checks everything it prints.
fn run_example(mode: &str, devices: &str) {
    if let Some(why) = userfaultfd_unusable() {
        skipped(&format!("this process may not open a userfaultfd: {why}"));
        return;
    }
    let mut cmd = Command::new(example_binary());
    cmd.arg(mode)
        .arg(devices)
        // The library the example was linked with, not one cargo's test environment names.
        .env("LD_LIBRARY_PATH", libuswap_dir());
    let ran = run(cmd, &format!("the C example in {mode} mode"), Duration::from_secs(120));
    let out = &ran.stdout;
    let context = format!("stdout:\n{out}\nstderr:\n{}", ran.stderr);
    assert_eq!(ran.status.code(), Some(0), "the example exited with {}.\n{context}", ran.status);
    assert!(
        out.contains(&format!("mode {mode}, devices {devices}: region of {REGION_BYTES} bytes")),
        "the region line is missing.\n{context}"
    );
    assert!(out.contains(&format!("verified {REGION_BYTES} bytes, 0 wrong")), "not every byte read back.\n{context}");
    assert!(out.contains("recv into a page that was out: 4096 bytes, right"), "the datagram was lost.\n{context}");

    let counter = |name: &str| -> u64 {
        let line =
            out.lines().find(|l| l.starts_with("stats: ")).unwrap_or_else(|| panic!("no stats line.\n{context}"));
        line.split_whitespace()
            .find_map(|kv| kv.strip_prefix(&format!("{name}=")))
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| panic!("no {name}= in the stats line.\n{context}"))
    };
    let region_pages = REGION_BYTES / 4096;
    let limit_bytes = counter("limit_bytes");
    assert_eq!(limit_bytes, 16 * MIB, "{context}");
    // Writing 4x the limit pushed at least the 3/4 that does not fit out; reading it back
    // brought pages back in.
    assert!(counter("pswpout") >= region_pages / 2, "pswpout too low.\n{context}");
    assert!(counter("pswpin") >= region_pages / 4, "pswpin too low.\n{context}");
    assert!(counter("pgfault") > 0 && counter("pgmajfault") > 0, "{context}");
    assert!(counter("resident_bytes") <= limit_bytes + 32 * 4096, "resident above the bound.\n{context}");

    for (call, message) in [
        ("uswap_config_set_devices(\"floppy:1GiB\") = -1 (invalid argument)", "unknown device kind \"floppy\""),
        ("uswap_map(0 bytes) = -1 (invalid argument)", "cannot map a region of zero bytes"),
        ("uswap_set_resident_limit(4096) = -1 (invalid argument)", "give the pager at least 1048576 bytes"),
        ("uswap_pager_destroy(with a region mapped) = -7 (busy)", "1 region(s) of this pager are still mapped"),
        ("uswap_unmap(already unmapped) = -1 (invalid argument)", "is not a live uswap region"),
    ] {
        let line = format!("refused as expected: {call}: ");
        let found =
            out.lines().find(|l| l.starts_with(&line)).unwrap_or_else(|| panic!("no line {line:?}.\n{context}"));
        assert!(found.contains(message), "the message of {call} lacks {message:?}: {found}");
    }
    assert!(out.contains("after lowering the limit: "), "{context}");
    assert_eq!(out.lines().last(), Some("OK"), "{context}");
}

#[test]
fn c_example_thread_mode_on_a_ram_device() {
    run_example("thread", "ram:128MiB");
}

#[test]
fn c_example_signal_mode_on_a_pool_then_ram() {
    run_example("signal", "zpool:8MiB,ram");
}

#[test]
fn libuswap_exports_exactly_the_functions_the_header_declares() {
    let lib = libuswap_dir().join("libuswap.so");
    let mut cmd = Command::new("nm");
    cmd.args(["-D", "--defined-only", "--format=posix"]).arg(&lib);
    let listed = run(cmd, "nm -D libuswap.so", Duration::from_secs(60));
    assert!(listed.status.success(), "nm failed on {}: {}", lib.display(), listed.stderr);
    // posix format: "NAME TYPE VALUE [SIZE]"; functions are T.
    let mut exported: Vec<&str> = listed
        .stdout
        .lines()
        .filter_map(|l| l.split_once(' '))
        .filter(|(_, rest)| rest.starts_with("T "))
        .map(|(n, _)| n)
        .collect();
    exported.sort_unstable();
    let header = std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("include/uswap.h"))
        .expect("reading include/uswap.h");
    let mut declared: Vec<&str> = header
        .lines()
        .filter(|l| {
            !l.starts_with(' ') && !l.starts_with('*') && !l.starts_with('#') && l.contains("uswap_") && l.contains('(')
        })
        .filter_map(|l| l.split('(').next()?.rsplit([' ', '*']).next())
        .collect();
    declared.sort_unstable();
    assert!(declared.len() >= 17, "found only {declared:?} in the header");
    assert_eq!(exported, declared, "libuswap.so's exported functions differ from include/uswap.h's");
}

#[test]
fn a_stuck_child_is_killed_and_the_failure_names_the_step() {
    let mut cmd = Command::new("sh");
    cmd.args(["-c", "echo started; sleep 30"]);
    let started = Instant::now();
    let failure =
        std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| run(cmd, "a sleeping shell", Duration::from_secs(1))))
            .expect_err("a child that outlives its timeout fails the test");
    let message = failure.downcast_ref::<String>().cloned().unwrap_or_default();
    assert!(message.contains("a sleeping shell did not finish within 1 s"), "{message}");
    assert!(message.contains("started"), "the output so far is shown: {message}");
    assert!(started.elapsed() < Duration::from_secs(10), "the group (sleep included) was killed, not waited for");
}
