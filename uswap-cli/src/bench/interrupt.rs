//! Ctrl-C and friends: SIGINT, SIGTERM and SIGHUP set one flag instead of killing the
//! process, so that a run with the kernel engines always reaches its cleanup (swapoff, zram
//! reset, swap file and cgroup removal). Workloads look at the flag between chunks of
//! accesses; the runner kills workload processes when it sees it.
//!
//! A uswap engine's workload runs in this very process (one process: `--procs 1`), and a
//! thread of it may wait in a fault for a device that does not answer (a Redis primary
//! that stopped, reads retried until their failover deadlines run out): it never gets
//! back to the flag. So while such a run is under way ([`InProcessRun`]), a watchdog
//! ends the process [`EXIT_GRACE`] after an interrupt the run did not act on, with exit
//! status 130 as an orderly interrupt has. Nothing is left behind: what a uswap engine
//! sets up ends with the process (its userfaultfd, its mappings, its anonymous swap
//! files), and the local Redis servers (`--redis-local`), registered here, are killed and
//! their directory removed first.

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

/// How long an interrupted in-process run has to reach its own cleanup.
const EXIT_GRACE: Duration = Duration::from_millis(1500);

static FLAG: OnceLock<Arc<AtomicBool>> = OnceLock::new();
/// Set while a uswap engine's workload runs in this process.
static IN_PROCESS: AtomicBool = AtomicBool::new(false);
/// What a forced exit removes: server processes and directories (`--redis-local`).
static LEFT_BEHIND: Mutex<(Vec<u32>, Vec<PathBuf>)> = Mutex::new((Vec::new(), Vec::new()));

fn shared() -> &'static Arc<AtomicBool> {
    FLAG.get_or_init(|| Arc::new(AtomicBool::new(false)))
}

/// Routes SIGINT, SIGTERM and SIGHUP to the flag, and starts the watchdog. Idempotent.
pub fn install() -> std::io::Result<()> {
    static INSTALLED: OnceLock<()> = OnceLock::new();
    if INSTALLED.get().is_some() {
        return Ok(());
    }
    for sig in [signal_hook::consts::SIGINT, signal_hook::consts::SIGTERM, signal_hook::consts::SIGHUP] {
        signal_hook::flag::register(sig, Arc::clone(shared()))?;
    }
    std::thread::Builder::new().name("uswap-interrupt".into()).spawn(watchdog)?;
    let _ = INSTALLED.set(());
    Ok(())
}

/// The flag itself, for workloads.
pub fn flag() -> &'static AtomicBool {
    shared()
}

pub fn interrupted() -> bool {
    shared().load(Ordering::Relaxed)
}

/// Held while a uswap engine's workload runs in this process (see the module doc).
pub struct InProcessRun(());

impl InProcessRun {
    pub fn start() -> InProcessRun {
        IN_PROCESS.store(true, Ordering::Release);
        InProcessRun(())
    }
}

impl Drop for InProcessRun {
    fn drop(&mut self) {
        IN_PROCESS.store(false, Ordering::Release);
    }
}

/// Local servers a forced exit kills, and their directory, which it removes.
pub fn remove_on_forced_exit(pids: impl IntoIterator<Item = u32>, dir: PathBuf) {
    if let Ok(mut l) = LEFT_BEHIND.lock() {
        l.0.extend(pids);
        l.1.push(dir);
    }
}

/// Waits for an interrupt; then, if an in-process run is still under way after
/// [`EXIT_GRACE`], ends the process (see the module doc).
fn watchdog() {
    // Bounded by the process: it ends with it.
    loop {
        while !interrupted() {
            std::thread::sleep(Duration::from_millis(50));
        }
        std::thread::sleep(EXIT_GRACE);
        if IN_PROCESS.load(Ordering::Acquire) {
            forced_exit();
        }
        // The run was not in this process, or reached its cleanup: the normal path ends it.
        std::thread::sleep(Duration::from_millis(500));
    }
}

fn forced_exit() -> ! {
    // A stuck thread may hold the lock: then the servers die with this process anyway
    // (PR_SET_PDEATHSIG) and only their directory stays.
    if let Ok(l) = LEFT_BEHIND.try_lock() {
        for &pid in &l.0 {
            // SAFETY: kill(2) of a server process this program started.
            unsafe { libc::kill(pid as libc::pid_t, libc::SIGKILL) };
        }
        // Reaped, so that they are gone (their ports closed) when this process is; a
        // killed process dies at once, and this waits half a second at most.
        for &pid in &l.0 {
            for _ in 0..50 {
                // SAFETY: waitpid(2) of our own child, no status wanted.
                let r = unsafe { libc::waitpid(pid as libc::pid_t, std::ptr::null_mut(), libc::WNOHANG) };
                if r != 0 {
                    break; // reaped, or not ours to reap (already reaped elsewhere)
                }
                std::thread::sleep(Duration::from_millis(10));
            }
        }
        for dir in &l.1 {
            let _ = std::fs::remove_dir_all(dir);
        }
    }
    let msg = b"uswap bench: interrupted while the workload waited for a device that does not answer; \
                ended without waiting for it (nothing it had set up is left)\n";
    // SAFETY: write(2) of our own buffer to stderr, then _exit(2): no lock is taken (a
    // thread stuck in a fault may hold stderr's or stdout's), no destructor runs.
    unsafe {
        libc::write(2, msg.as_ptr().cast(), msg.len());
        libc::_exit(130)
    }
}
