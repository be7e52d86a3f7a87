//! Helpers shared by the CLI's integration tests.

use std::io::Read;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

/// Why the kernel engines cannot run here (they need root, zram, a memory controller and
/// no swap in use), or `None`.
pub fn kernel_unavailable() -> Option<String> {
    // SAFETY: geteuid cannot fail.
    if unsafe { libc::geteuid() } != 0 {
        return Some("not root".into());
    }
    if !Path::new("/sys/block/zram0").exists() {
        return Some("no /sys/block/zram0 (modprobe zram)".into());
    }
    let mounts = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    let v1 = mounts.lines().any(|l| l.contains(" - cgroup ") && l.contains("memory"));
    let v2 = mounts.lines().filter(|l| l.contains(" - cgroup2 ")).any(|l| {
        let mnt = l.split(' ').nth(4).unwrap_or("");
        std::fs::read_to_string(Path::new(mnt).join("cgroup.controllers")).is_ok_and(|c| c.contains("memory"))
    });
    if !v1 && !v2 {
        return Some("no memory cgroup controller".into());
    }
    let swaps = swaps();
    if !swaps.is_empty() {
        // Someone else's (a bench would refuse to run; these tests check it does elsewhere).
        return Some(format!("the machine already has swap in use: {swaps:?}"));
    }
    None
}

/// Active swap areas (`/proc/swaps` without its header).
pub fn swaps() -> Vec<String> {
    std::fs::read_to_string("/proc/swaps").unwrap().lines().skip(1).map(str::to_string).collect()
}

/// Runs `cmd` to completion in its own process group, stdin closed, stdout and stderr read
/// to the end. A command still running after `limit` has its group killed and fails the
/// test, naming the command and showing its stderr.
pub fn run_timed(cmd: &mut Command, limit: Duration) -> Output {
    run_timed_with(cmd, limit, |_| {})
}

/// [`run_timed`], calling `during` with the child's pid once it runs (to signal it, or to
/// act while it runs).
pub fn run_timed_with(cmd: &mut Command, limit: Duration, during: impl FnOnce(u32)) -> Output {
    let what = format!("{cmd:?}");
    let mut child = cmd
        .process_group(0)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("cannot start {what}: {e}"));
    let (out, err) = (read_all(child.stdout.take().unwrap()), read_all(child.stderr.take().unwrap()));
    during(child.id());
    let deadline = Instant::now() + limit;
    let status = loop {
        if let Some(st) = child.try_wait().unwrap() {
            break st;
        }
        if Instant::now() >= deadline {
            // SAFETY: kill(2) on the child's own process group; no memory is involved.
            unsafe { libc::kill(-(child.id() as i32), libc::SIGKILL) };
            child.wait().unwrap();
            let e = err.wait(OUTPUT_GRACE).unwrap_or_else(|partial| partial);
            panic!("{what} still running after {limit:?}; stderr:\n{}", String::from_utf8_lossy(&e));
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    // A process the command left behind (in another group) may hold its output open: fail,
    // rather than wait for it for ever.
    let ended = |pipe: PipeReader, which: &str| {
        pipe.wait(OUTPUT_GRACE).unwrap_or_else(|partial| {
            panic!(
                "{what} ended ({status}), but its {which} was still open {OUTPUT_GRACE:?} later: a process it left \
                 holds it; its {which} so far:\n{}",
                String::from_utf8_lossy(&partial)
            )
        })
    };
    Output { status, stdout: ended(out, "stdout"), stderr: ended(err, "stderr") }
}

/// How long a command's output may stay open after it ended.
const OUTPUT_GRACE: Duration = Duration::from_secs(30);

/// What a thread reading one of a child's pipes has read, and whether it reached the end
/// (signalled on the condition variable).
type PipeRead = (std::sync::Mutex<(Vec<u8>, bool)>, std::sync::Condvar);

/// The reading side of a pipe read to its end on a thread of its own.
struct PipeReader {
    read: std::sync::Arc<PipeRead>,
}

impl PipeReader {
    /// The whole output once the pipe's end is reached within `limit`; what was read so far
    /// otherwise (to show why a test failed).
    fn wait(self, limit: Duration) -> Result<Vec<u8>, Vec<u8>> {
        let (lock, ended) = &*self.read;
        let guard = lock.lock().unwrap();
        let (mut guard, _) = ended.wait_timeout_while(guard, limit, |(_, at_end)| !*at_end).unwrap();
        let (bytes, at_end) = &mut *guard;
        if *at_end {
            Ok(std::mem::take(bytes))
        } else {
            Err(bytes.clone())
        }
    }
}

/// Reads `pipe` to its end on a thread of its own.
fn read_all(mut pipe: impl Read + Send + 'static) -> PipeReader {
    let read = std::sync::Arc::new((std::sync::Mutex::new((Vec::new(), false)), std::sync::Condvar::new()));
    let shared = read.clone();
    std::thread::spawn(move || {
        let mut chunk = [0u8; 4096];
        loop {
            let n = match pipe.read(&mut chunk) {
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                // A read error ends the output, as the end of the pipe does.
                r => r.unwrap_or(0),
            };
            let mut guard = shared.0.lock().unwrap();
            if n == 0 {
                guard.1 = true;
                shared.1.notify_all();
                return;
            }
            guard.0.extend_from_slice(&chunk[..n]);
        }
    });
    PipeReader { read }
}

/// `uswap run --limit LIMIT_MIB MiB OPTS -- PROG` with the tests' preload library, under five
/// minutes; its output and its counters (`--stats-json`, in `dir`, named after the program;
/// `Null` if it wrote none: a stale file of an earlier run is removed first).
pub fn uswap_run(limit_mib: u64, opts: &[&str], prog: &[&str], dir: &Path) -> (Output, serde_json::Value) {
    let stats = dir.join(format!("stats-{}.json", prog[0].rsplit('/').next().unwrap()));
    let _ = std::fs::remove_file(&stats);
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_uswap"));
    cmd.env("USWAP_PRELOAD_LIB", preload())
        .arg("run")
        .arg("--limit")
        .arg(format!("{limit_mib}MiB"))
        .args(opts)
        .arg("--stats-json")
        .arg(&stats)
        .arg("--")
        .args(prog);
    let out = run_timed(&mut cmd, Duration::from_secs(300));
    let v = std::fs::read(&stats).ok().and_then(|b| serde_json::from_slice(&b).ok());
    (out, v.unwrap_or(serde_json::Value::Null))
}

/// Counter `k` of a summary, which must have it.
pub fn counter(v: &serde_json::Value, k: &str) -> u64 {
    v.get(k).and_then(serde_json::Value::as_u64).unwrap_or_else(|| panic!("no counter {k} in {v}"))
}

/// The one way a test says it could not run (see `uswap_testkit`).
#[allow(unused_imports)]
pub use uswap_testkit::skipped;

/// A copy of the `uswap` binary that any user may run (the build directory may be one that
/// other users cannot enter, as a clone under /root is), for tests that run it as `nobody`.
/// One per test process, shared by its tests; the copies of test processes that are gone are
/// removed here (80 MB each, and a copy outlives its process).
pub fn uswap_for_nobody() -> std::path::PathBuf {
    use std::os::unix::fs::PermissionsExt;
    let tmp = std::env::temp_dir();
    for e in std::fs::read_dir(&tmp).into_iter().flatten().flatten() {
        let name = e.file_name();
        let pid = name.to_str().and_then(|n| n.strip_prefix("uswap-nobody-")).and_then(|p| p.parse::<u32>().ok());
        if pid.is_some_and(|pid| !Path::new(&format!("/proc/{pid}")).exists()) {
            let _ = std::fs::remove_dir_all(e.path());
        }
    }
    let dir = tmp.join(format!("uswap-nobody-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let exe = dir.join("uswap");
    if !exe.exists() {
        // Copied under another name and renamed: tests of one binary may race here.
        let part = dir.join(format!("uswap.{:?}", std::thread::current().id()));
        std::fs::copy(env!("CARGO_BIN_EXE_uswap"), &part).unwrap();
        std::fs::set_permissions(&part, std::fs::Permissions::from_mode(0o755)).unwrap();
        std::fs::rename(&part, &exe).unwrap();
    }
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).unwrap();
    exe
}

/// A test's scratch directory (its compiled programs, stats files), removed when the test
/// ends, passed or failed: the tests ran thousands of times on one machine.
pub struct TmpDir(pub PathBuf);

impl std::ops::Deref for TmpDir {
    type Target = Path;
    fn deref(&self) -> &Path {
        &self.0
    }
}

impl AsRef<std::ffi::OsStr> for TmpDir {
    fn as_ref(&self) -> &std::ffi::OsStr {
        self.0.as_os_str()
    }
}

impl AsRef<Path> for TmpDir {
    fn as_ref(&self) -> &Path {
        &self.0
    }
}

impl Drop for TmpDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

pub fn tmpdir(name: &str) -> TmpDir {
    let d = std::env::temp_dir().join(format!("uswap-run-test-{}-{name}", std::process::id()));
    std::fs::create_dir_all(&d).unwrap();
    TmpDir(d)
}

/// The preload library cargo built for these tests (uswap-preload is a dev-dependency):
/// next to the test executable, in target/<profile>/deps.
pub fn preload() -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    let p = exe.parent().unwrap().join("libuswap_preload.so");
    assert!(p.is_file(), "{} missing: cargo should have built it for the tests", p.display());
    p
}

/// Copies the preload library and the first stage beside it (`uswap run` preloads the
/// latter, which loads the former from its own directory) into `dir`; the preload
/// library's copy, for `USWAP_PRELOAD_LIB`.
pub fn copy_libraries(dir: &Path) -> PathBuf {
    let lib = dir.join("libuswap_preload.so");
    std::fs::copy(preload(), &lib).unwrap();
    std::fs::copy(preload().with_file_name("libuswap_shim.so"), dir.join("libuswap_shim.so")).unwrap();
    lib
}

/// Compiles tests/programs/NAME.c into `dir`.
pub fn compile(name: &str, dir: &Path, extra: &[&str]) -> PathBuf {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/programs").join(format!("{name}.c"));
    let out = dir.join(name);
    let o = run_timed(
        Command::new("cc").args(["-O2", "-Wall", "-pthread", "-o"]).arg(&out).arg(&src).args(extra),
        Duration::from_secs(120),
    );
    assert!(o.status.success(), "cc {name}.c failed:\n{}", String::from_utf8_lossy(&o.stderr));
    out
}
