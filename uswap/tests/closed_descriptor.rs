//! A program that closes a pager's userfaultfd (daemonizing code's `close_range(3, ~0U, 0)`,
//! after the pager was made through the library) must not go on reading zeros where its
//! pages were out of RAM, and the thread that waits on the descriptor must not spin: the
//! process ends, and stderr names the descriptor and what to do. `uswap run` keeps its
//! descriptors open (its interposed `close_range`), so this is the library's case.
//!
//! In thread mode a thread touching such a page in the instant between the descriptor's
//! release and the abort may read zeros (the kernel unregistered the regions with the last
//! reference to the file), so the child's reads are not judged, only how it ends.
//!
//! Each test re-runs this binary as a child that makes a pager, pushes pages out, closes
//! every descriptor above 2 and reads its pages back, and judges how the child ended.

use std::io::Read;
use std::process::{Command, Stdio};
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use uswap::{FaultMode, PAGE_SIZE};

mod common;
use common::*;

const LIMIT: u64 = 4 * MIB;
const REGION_BYTES: usize = 16 << 20;
/// What the child writes on stdout when it read every page back right, and when it read a
/// wrong one and went on: neither may be seen.
const FINISHED: &str = "child: every page read back";
const WRONG: &str = "child: wrong page";
/// The child takes about a second; a child alive after this is a hang.
const BOUND: Duration = Duration::from_secs(60);

/// In the child: fills a region four times the limit, waits until its pages are out,
/// closes every descriptor above 2, and checks every page.
fn child(mode: FaultMode) -> ! {
    let p = pager(mode, LIMIT, 64 * MIB);
    let r = p.map(REGION_BYTES).expect("region");
    let w = r.as_atomic_u64s();
    let pages = REGION_BYTES / PAGE_SIZE;
    for i in 0..pages {
        write_page(w, i, 1);
    }
    let s = quiet_stats(&p);
    assert!(s.pswpout > 0, "pages went out before the close: {s:?}");
    println!("child: {} pages out, closing", s.pswpout);
    // SAFETY: closes this process's descriptors from 3 up, the pager's among them: what the
    // test is about. Nothing here uses the closed ones but the pager.
    assert_eq!(unsafe { libc::syscall(libc::SYS_close_range, 3u32, !0u32, 0u32) }, 0);
    for i in 0..pages {
        let right = (0..WORDS).all(|k| w[i * WORDS + k].load(Ordering::Relaxed) == word(i, 1, k));
        if !right {
            println!("{WRONG} {i}");
        }
    }
    println!("{FINISHED}");
    std::process::exit(0)
}

/// Runs the child of `test` in `mode`, bounded; its exit status and stdout plus stderr.
fn run_child(test: &str, mode: FaultMode) -> (std::process::ExitStatus, String) {
    let mut c = Command::new(std::env::current_exe().unwrap())
        .args(["--exact", test, "--nocapture", "--test-threads", "1"])
        .env("USWAP_TEST_CLOSED_DESCRIPTOR_CHILD", format!("{mode:?}"))
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("child test process");
    let t0 = Instant::now();
    let status = loop {
        if let Some(s) = c.try_wait().expect("wait for the child") {
            break s;
        }
        if t0.elapsed() > BOUND {
            let _ = c.kill();
            let mut err = String::new();
            let _ = c.stderr.take().unwrap().read_to_string(&mut err);
            panic!("the child in {mode:?} mode still runs after {BOUND:?} (a spin or a hang); its stderr:\n{err}");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let mut out = String::new();
    c.stdout.take().unwrap().read_to_string(&mut out).unwrap();
    c.stderr.take().unwrap().read_to_string(&mut out).unwrap();
    (status, out)
}

fn check(test: &str, mode: FaultMode, signal: i32, says: &str) {
    if let Ok(m) = std::env::var("USWAP_TEST_CLOSED_DESCRIPTOR_CHILD") {
        child(if m == "Thread" { FaultMode::Thread } else { FaultMode::Signal });
    }
    let (status, out) = run_child(test, mode);
    use std::os::unix::process::ExitStatusExt;
    assert!(out.contains("pages out, closing"), "the child got as far as the close:\n{out}");
    assert!(!out.contains(FINISHED), "the child went on as if nothing happened ({status:?}):\n{out}");
    assert_eq!(status.signal(), Some(signal), "how the child ended:\n{out}");
    assert!(out.contains(says), "stderr says why, with what to do:\n{out}");
}

/// Thread mode: the handler thread finds the descriptor closed and ends the process with
/// its number (before, it spun on a CPU and the pages out read as zeros).
#[test]
fn thread_mode_program_closing_the_pager_descriptor_is_ended_with_a_message() {
    let test = "thread_mode_program_closing_the_pager_descriptor_is_ended_with_a_message";
    check(test, FaultMode::Thread, libc::SIGABRT, "the program closed descriptor");
}

/// Signal mode: the first touch of a page that was out finds the descriptor closed (its
/// event thread still holds the file, so the regions stay registered) and ends with SIGBUS
/// and the cause.
#[test]
fn signal_mode_program_closing_the_pager_descriptor_is_ended_with_a_message() {
    let test = "signal_mode_program_closing_the_pager_descriptor_is_ended_with_a_message";
    check(test, FaultMode::Signal, libc::SIGBUS, "the pager's userfaultfd is closed");
}
