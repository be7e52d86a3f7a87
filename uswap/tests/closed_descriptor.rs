//! A program that closes a pager's userfaultfd (daemonizing code's `close_range(3, ~0U, 0)`,
//! after the pager was made through the library) must not go on reading zeros where its
//! pages were out of RAM, and the threads that wait on the descriptor must not spin: the
//! engine's keeper thread holds the file in a descriptor table of its own (the regions stay
//! registered), and the first fault that needs the descriptor ends the process with a
//! message naming it and what to do, nothing read wrong before. A process that closes its
//! descriptors and then only exits (or execs, as `subprocess` does in a child that made a
//! pager) is not ended. `uswap run` keeps its descriptors open (its interposed
//! `close_range`), so this is the library's case.
//!
//! Each test re-runs this binary as a child that makes a pager, pushes pages out, closes
//! every descriptor above 2, and then reads its pages back or exits; the test judges how
//! the child ended.

use std::io::Read;
use std::process::{Command, Stdio};
use std::sync::atomic::Ordering;
use std::time::Duration;

use uswap::{FaultMode, PAGE_SIZE};

mod common;
use common::*;

const LIMIT: u64 = 4 * MIB;
const REGION_BYTES: usize = 16 << 20;
/// What the child writes on stdout when it read every page back right, and when it read a
/// wrong one and went on: neither may be seen.
const FINISHED: &str = "child: every page read back";
const WRONG: &str = "child: wrong page";
/// What the child that only exits writes first: the CPU time its threads took while it
/// slept after the close.
const SLEPT: &str = "child: slept, cpu ms";
/// The child takes about a second; a child alive after this is a hang.
const BOUND: Duration = Duration::from_secs(60);

/// This process's CPU time so far, in milliseconds (all threads).
fn cpu_ms() -> u64 {
    // SAFETY: getrusage fills one rusage struct we own.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: as above.
    unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut ru) };
    let ms = |t: libc::timeval| t.tv_sec as u64 * 1000 + t.tv_usec as u64 / 1000;
    ms(ru.ru_utime) + ms(ru.ru_stime)
}

/// In the child: fills a region four times the limit, waits until its pages are out,
/// closes every descriptor above 2 (with `reopen`, then puts a file of its own under the
/// engine's numbers, as `dup2` or new files do), and checks every page (`touch`) or sleeps
/// and exits.
fn child(mode: FaultMode, touch: bool, reopen: bool) -> ! {
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
    let (numbers, n) = uswap::fd::kept();
    // Stdout is a pipe the parent reads: keep it (its number is 1), close the rest.
    // SAFETY: closes this process's descriptors from 3 up, the pager's among them: what the
    // test is about. Nothing here uses the closed ones but the pager.
    assert_eq!(unsafe { libc::syscall(libc::SYS_close_range, 3u32, !0u32, 0u32) }, 0);
    if reopen {
        // SAFETY: opens a file of the program's and copies it over the numbers the close freed.
        unsafe {
            let fd = libc::open(c"/dev/null".as_ptr(), libc::O_RDWR);
            for &k in &numbers[..n] {
                libc::dup2(fd, k);
            }
        }
    }
    if !touch {
        let before = cpu_ms();
        std::thread::sleep(Duration::from_millis(300));
        println!("{SLEPT} {}", cpu_ms() - before);
        // SAFETY: ends the process at once, as an exec would end its threads.
        unsafe { libc::_exit(0) };
    }
    for i in 0..pages {
        let right = (0..WORDS).all(|k| w[i * WORDS + k].load(Ordering::Relaxed) == word(i, 1, k));
        if !right {
            println!("{WRONG} {i}");
        }
    }
    println!("{FINISHED}");
    std::process::exit(0)
}

/// In the child: a pager with pages out, then every descriptor above 2 closed and the
/// engine's numbers reused for the write end of a pipe of the program's (as `dup2` or
/// new files do). With `unmap_after`, the region is unmapped after that (the kernel's
/// unmap event needs the descriptor: the process must end with the message); otherwise
/// before, and then the pager is dropped: prints how many of those numbers are still open,
/// and how many bytes the pager wrote into the pipe.
fn child_reusing_numbers(mode: FaultMode, unmap_after: bool) -> ! {
    let p = pager(mode, LIMIT, 64 * MIB);
    let r = p.map(REGION_BYTES).expect("region");
    for i in 0..REGION_BYTES / PAGE_SIZE {
        write_page(r.as_atomic_u64s(), i, 1);
    }
    let _ = quiet_stats(&p);
    let (numbers, n) = uswap::fd::kept();
    let r = if unmap_after { Some(r) } else { None };
    println!("child: {} pages out, closing", p.stats().pswpout);
    // SAFETY: closes this process's descriptors from 3 up (the test's point), then makes a
    // pipe and copies its write end over the engine's numbers; all plain system calls.
    let read_end = unsafe {
        libc::syscall(libc::SYS_close_range, 3u32, !0u32, 0u32);
        let mut fds = [0; 2];
        assert_eq!(libc::pipe2(fds.as_mut_ptr(), libc::O_NONBLOCK), 0);
        for &fd in &numbers[..n] {
            libc::dup2(fds[1], fd);
        }
        fds[0]
    };
    drop(r);
    drop(p);
    // SAFETY: F_GETFD reads a descriptor's flags, failing for one that is not open.
    let open = numbers[..n].iter().filter(|&&fd| unsafe { libc::fcntl(fd, libc::F_GETFD) } >= 0).count();
    let mut buf = [0u8; 64];
    // SAFETY: reads at most 64 bytes into `buf` from the pipe's read end (non-blocking).
    let written = unsafe { libc::read(read_end, buf.as_mut_ptr().cast(), buf.len()) }.max(0);
    println!("child: reused {n}, still open {open}, bytes written {written}");
    println!("{FINISHED}");
    std::process::exit(0)
}

/// Runs the child of `test` with `action` (`touch` or `exit`) in `mode`, bounded; its exit
/// status and stdout plus stderr, read while it runs.
fn run_child(test: &str, mode: FaultMode, action: &str) -> (std::process::ExitStatus, String) {
    let mut c = Command::new(std::env::current_exe().unwrap())
        .args(["--exact", test, "--nocapture", "--test-threads", "1"])
        .env("USWAP_TEST_CLOSED_DESCRIPTOR_CHILD", format!("{mode:?} {action}"))
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("child test process");
    let pid = c.id();
    let (mut out, mut err) = (c.stdout.take().unwrap(), c.stderr.take().unwrap());
    let readers = [
        std::thread::spawn(move || {
            let mut s = String::new();
            let _ = out.read_to_string(&mut s);
            s
        }),
        std::thread::spawn(move || {
            let mut s = String::new();
            let _ = err.read_to_string(&mut s);
            s
        }),
    ];
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(c.wait());
    });
    let Ok(status) = rx.recv_timeout(BOUND) else {
        // SAFETY: kill(2) on our own child, not reaped yet (its waiter still waits).
        unsafe { libc::kill(pid as libc::pid_t, libc::SIGKILL) };
        panic!("the child in {mode:?} mode ({action}) still runs after {BOUND:?}: a spin or a hang");
    };
    let status = status.expect("wait for the child");
    let text: String = readers.into_iter().map(|r| r.join().unwrap()).collect();
    (status, text)
}

/// The child's part, when this process is one (`USWAP_TEST_CLOSED_DESCRIPTOR_CHILD`).
fn be_the_child_if_asked() {
    if let Ok(m) = std::env::var("USWAP_TEST_CLOSED_DESCRIPTOR_CHILD") {
        let mode = if m.starts_with("Thread") { FaultMode::Thread } else { FaultMode::Signal };
        if m.contains("reuse") {
            child_reusing_numbers(mode, m.ends_with("unmap"));
        }
        child(mode, m.ends_with("touch"), m.contains("reopen"));
    }
}

/// A child that touches its pages after the close ends by `signal` with `says` on stderr,
/// having read no page wrong.
fn check_touch(test: &str, mode: FaultMode, signal: i32, says: &str) {
    be_the_child_if_asked();
    let (status, out) = run_child(test, mode, "touch");
    use std::os::unix::process::ExitStatusExt;
    assert!(out.contains("pages out, closing"), "the child got as far as the close:\n{out}");
    assert!(!out.contains(FINISHED), "the child went on as if nothing happened ({status:?}):\n{out}");
    assert!(!out.contains(WRONG), "the child read pages wrong before it ended:\n{out}");
    assert_eq!(status.signal(), Some(signal), "how the child ended:\n{out}");
    assert!(out.contains(says), "stderr says why, with what to do:\n{out}");
}

/// Thread mode: the handler that finds the descriptor closed parks, and the keeper ends
/// the process at the fault (before, a handler spun on a CPU and the pages that were out
/// read as zeros).
#[test]
fn thread_mode_program_closing_the_pager_descriptor_is_ended_with_a_message() {
    let test = "thread_mode_program_closing_the_pager_descriptor_is_ended_with_a_message";
    check_touch(test, FaultMode::Thread, libc::SIGABRT, "the program closed descriptor");
}

/// Signal mode: the first touch of a page that was out finds the descriptor closed and ends
/// with SIGBUS and the cause.
#[test]
fn signal_mode_program_closing_the_pager_descriptor_is_ended_with_a_message() {
    let test = "signal_mode_program_closing_the_pager_descriptor_is_ended_with_a_message";
    check_touch(test, FaultMode::Signal, libc::SIGBUS, "the pager's userfaultfd is closed");
}

/// Signal mode: as above, but the program opened files of its own under the closed numbers:
/// the first attempt's failed ioctl (sent to a file of the program's) finds the number no
/// longer the userfaultfd's, and the child ends at once saying so (it took every attempt,
/// each sending ioctls to the program's files, and blamed a failed ioctl).
#[test]
fn signal_mode_program_reusing_the_pager_descriptor_number_is_ended_with_a_message() {
    be_the_child_if_asked();
    let test = "signal_mode_program_reusing_the_pager_descriptor_number_is_ended_with_a_message";
    let (status, out) = run_child(test, FaultMode::Signal, "reopen-touch");
    use std::os::unix::process::ExitStatusExt;
    assert!(out.contains("pages out, closing") && !out.contains(FINISHED) && !out.contains(WRONG), "{out}");
    assert_eq!(status.signal(), Some(libc::SIGBUS), "how the child ended:\n{out}");
    assert!(out.contains("its number names another file now"), "stderr says why, with what to do:\n{out}");
}

/// In both modes, a child that closes its descriptors and then only sleeps and exits (as
/// one that execs) exits 0, its threads idle meanwhile (well under the 300 ms it slept).
#[test]
fn a_program_closing_the_pager_descriptor_then_exiting_is_not_ended() {
    be_the_child_if_asked();
    let test = "a_program_closing_the_pager_descriptor_then_exiting_is_not_ended";
    for mode in [FaultMode::Thread, FaultMode::Signal] {
        let (status, out) = run_child(test, mode, "exit");
        assert!(status.success(), "{mode:?}: {status:?}\n{out}");
        let cpu: u64 = out
            .lines()
            .find_map(|l| l.strip_prefix(SLEPT))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or_else(|| panic!("{mode:?}: the child says its CPU time:\n{out}"));
        assert!(cpu < 100, "{mode:?}: the child's threads took {cpu} ms of CPU in 300 ms after the close:\n{out}");
    }
}

/// In both modes, once the program has reused the numbers of the pager's descriptors for
/// files of its own, dropping the pager (its regions unmapped before) closes none of them
/// and writes nothing into them (it used to close the program's file under the
/// userfaultfd's number and ring 8 bytes into the one under the doorbell's), and the drop
/// ends (its threads asleep in `poll` are woken through the keeper's own doorbell).
#[test]
fn dropping_a_pager_after_the_program_reused_its_numbers_leaves_them_alone() {
    be_the_child_if_asked();
    let test = "dropping_a_pager_after_the_program_reused_its_numbers_leaves_them_alone";
    for mode in [FaultMode::Thread, FaultMode::Signal] {
        let (status, out) = run_child(test, mode, "reuse");
        assert!(status.success(), "{mode:?}: {status:?}\n{out}");
        let line = out.lines().find(|l| l.starts_with("child: reused")).unwrap_or_else(|| panic!("{mode:?}:\n{out}"));
        let nums: Vec<u64> = line.split(|c: char| !c.is_ascii_digit()).filter_map(|w| w.parse().ok()).collect();
        assert!(nums.len() == 3 && nums[0] >= 2, "{mode:?}: the userfaultfd's and the doorbell's numbers: {line}");
        assert_eq!(nums[1], nums[0], "{mode:?}: every reused number is still open: {line}");
        assert_eq!(nums[2], 0, "{mode:?}: nothing written into the program's pipe: {line}");
    }
}

/// In both modes, a region unmapped after the program reused the pager's numbers (the
/// unmap waits for the pager to read the kernel's event, which no thread of the process's
/// table can) goes through, through the keeper, which finds the number reused within its
/// period and reads the descriptor in its own table; then dropping the pager leaves the
/// program's files alone, as above.
#[test]
fn unmapping_after_the_program_reused_the_pager_numbers_goes_through() {
    be_the_child_if_asked();
    let test = "unmapping_after_the_program_reused_the_pager_numbers_goes_through";
    for mode in [FaultMode::Thread, FaultMode::Signal] {
        let (status, out) = run_child(test, mode, "reuse-unmap");
        assert!(status.success() && out.contains(FINISHED), "{mode:?}: {status:?}\n{out}");
        assert!(out.contains("bytes written 0"), "{mode:?}: nothing written into the program's pipe:\n{out}");
    }
}
