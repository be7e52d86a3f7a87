//! `uswap run` with real, unmodified programs: C programs compiled here with the system
//! compiler (tests/programs/*.c), `sort`, and Python with numpy (installed by the test in a
//! virtual environment). Each runs with a working set at least four times the limit, its
//! output is compared byte for byte with a run without uswap, and the summed counters must
//! show paging (`pswpout > 0`) within the limit plus the documented slack.
//!
//! `uswap bench --command` runs one of them under several engines (the kernel ones where the
//! tests run as root with zram, else they say SKIPPED) and must report every engine, the same
//! output everywhere, and paging; a program whose output changes between runs is an error.
//!
//! Every child runs in its own process group under a timeout; a timeout kills the group and
//! fails naming the command.

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

// Each test binary uses some of the helpers.
#[allow(dead_code)]
mod common;
use common::{compile, copy_libraries, counter, kernel_unavailable, preload, run_timed, skipped, tmpdir, uswap_run};

const LIMIT_MIB: u64 = 16;
/// Working sets are this many times the limit.
const WSS_MIB: u64 = 4 * LIMIT_MIB;
/// The documented slack over the limit: a charge racing others under the shared charge may
/// pass it by one readahead window (128 KiB) per thread faulting at that moment.
const SLACK_BYTES: u64 = 8 * (128 << 10);

/// Compiles test program `name` and runs it with a working set of `wss_mib` under `uswap
/// run`, once in each fault mode; `check` gets the mode, the command line and the run.
fn run_in_both_modes(name: &str, wss_mib: u64, check: impl FnMut(&str, &[&str], &(Output, Value))) {
    run_in_modes(name, wss_mib, &["signal", "thread"], check)
}

/// [`run_in_both_modes`] in the fault modes `modes` only.
fn run_in_modes(name: &str, wss_mib: u64, modes: &[&str], mut check: impl FnMut(&str, &[&str], &(Output, Value))) {
    let dir = tmpdir(name);
    let p = compile(name, &dir, &[]);
    let wss = wss_mib.to_string();
    let prog = [p.to_str().unwrap(), &wss];
    for &mode in modes {
        let r = uswap_run(LIMIT_MIB, &["--fault-mode", mode], &prog, &dir);
        check(mode, &prog, &r);
    }
}

/// `uswap ARGS` with the tests' preload library (and `TMPDIR`, where `uswap run` makes its
/// directory, if given), under a minute's timeout.
fn uswap(args: &[&str], tmp: Option<&Path>) -> Output {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_uswap"));
    cmd.env("USWAP_PRELOAD_LIB", preload()).args(args);
    if let Some(tmp) = tmp {
        cmd.env("TMPDIR", tmp);
    }
    run_timed(&mut cmd, Duration::from_secs(60))
}

/// Runs `script` with `sh -c`, its `$0` this build's `uswap`: for what the caller's shell does
/// around `uswap run` (its traps, redirections, closed descriptors).
fn uswap_from_sh(script: &str) -> Output {
    let mut cmd = Command::new("sh");
    cmd.env("USWAP_PRELOAD_LIB", preload()).args(["-c", script, env!("CARGO_BIN_EXE_uswap")]);
    run_timed(&mut cmd, Duration::from_secs(60))
}

fn plain(prog: &[&str]) -> Output {
    let o = run_timed(Command::new(prog[0]).args(&prog[1..]), Duration::from_secs(300));
    assert!(o.status.success(), "{prog:?} without uswap failed:\n{}", String::from_utf8_lossy(&o.stderr));
    o
}

/// The program's output under uswap equals the plain run's; it paged; it stayed within the
/// limit plus the slack.
fn assert_same_and_paged(prog: &[&str], under: &(Output, Value), limit_mib: u64) {
    let (o, v) = under;
    let expect = plain(prog);
    assert!(
        o.status.success(),
        "{prog:?} under uswap run failed ({}):\n{}",
        o.status,
        String::from_utf8_lossy(&o.stderr)
    );
    assert_eq!(
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&expect.stdout),
        "{prog:?}: output differs under uswap run"
    );
    assert!(counter(v, "pswpout") > 0, "{prog:?}: nothing was swapped out: {v}");
    let peak = counter(v, "resident_peak_bytes");
    assert!(peak > 0 && peak <= (limit_mib << 20) + SLACK_BYTES, "{prog:?}: resident peak {peak} over the limit: {v}");
}

/// Two threads map and unmap arenas of 1 MiB while the pager starts (`arenachurn.c`):
/// every arena keeps its bytes, in both fault modes, with threads uswap sees start and with
/// threads it does not (`thrd_create`: the process then waits for its pager with deferred
/// mappings until they pass `--start-after`, 4 MiB here, on one of the churning threads). Before, one thread's `munmap` of a
/// managed arena unmapped its range twice (the region's drop, then the program's call),
/// and the second took the arena another thread had just been given there: 2 to 5 runs of
/// 6 failed. Each case runs four times: it is a race.
#[test]
fn arenas_mapped_and_unmapped_by_threads_keep_every_byte() {
    let dir = tmpdir("arenachurn");
    let p = compile("arenachurn", &dir, &[]);
    for (how, opts) in
        [("pthread", &["--fault-mode", "signal"][..]), ("pthread", &["--fault-mode", "thread"]), ("c11", &[])]
    {
        for run in 0..4 {
            let (o, v) = uswap_run(64, opts, &[p.to_str().unwrap(), how, "30", "64"], &dir);
            assert_printed_ok(&format!("{how} {opts:?}, run {run}"), &o);
            assert!(counter(&v, "pswpout") > 0, "{how} {opts:?}: nothing was paged: {v}");
        }
    }
}

/// A fork while other threads fault (`forkfault.c`: 96 MiB under 32 MiB, two threads
/// rewriting random words, 20 forks whose children check every word): every child and the
/// parent find every word, and the run ends. Before, in signal mode, a child read the
/// parent's pool with the parent's codec workspaces as copied at the fork, one of them
/// mid-way through being taken by another thread: the child spun in its SIGBUS handler for
/// good (4 runs of 4 hung).
#[test]
fn forks_while_other_threads_fault_keep_every_byte_and_end() {
    let dir = tmpdir("forkfault");
    let p = compile("forkfault", &dir, &[]);
    for mode in ["signal", "signal", "thread"] {
        let (o, v) = uswap_run(32, &["--fault-mode", mode], &[p.to_str().unwrap(), "96", "2", "20"], &dir);
        assert_printed_ok(mode, &o);
        assert!(counter(&v, "pswpout") > 0, "{mode}: nothing was paged: {v}");
    }
}

/// A program that ignores SIGBUS and is sent one (`sigbusign.c`, by `kill` and `raise`)
/// goes on as it would without uswap: the signal is dropped, and its managed memory keeps
/// faulting back (96 MiB under 32 MiB, every word checked). Before, signal mode's handler
/// set the default action back, and the next fault killed the program (status 135).
#[test]
fn a_program_that_ignores_sigbus_survives_one_sent_to_it() {
    let dir = tmpdir("sigbusign");
    let p = compile("sigbusign", &dir, &[]);
    let (o, v) = uswap_run(32, &["--fault-mode", "signal"], &[p.to_str().unwrap(), "96"], &dir);
    assert_printed_ok("sigbusign", &o);
    assert!(counter(&v, "pswpin") > 0, "nothing came back through faults: {v}");
}

/// A SIGBUS handler installed with `SA_RESETHAND` runs once, and the action reads back as
/// the default after it, as the kernel does it (`sigbusreset.c`: 96 MiB under 32 MiB, every
/// word checked, then a second SIGBUS kills the program). Before, signal mode's chain kept
/// the program's handler, which ran for every SIGBUS.
#[test]
fn a_sigbus_handler_with_sa_resethand_runs_once() {
    let dir = tmpdir("sigbusreset");
    let p = compile("sigbusreset", &dir, &[]);
    let (o, v) = uswap_run(32, &["--fault-mode", "signal"], &[p.to_str().unwrap(), "96"], &dir);
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(String::from_utf8_lossy(&o.stdout), "OK\n", "{err}");
    assert_eq!(o.status.code(), Some(128 + libc::SIGBUS), "the second SIGBUS did not kill it: {err}");
    assert!(counter(&v, "pswpout") > 0, "nothing was paged: {v}");
}

/// A program whose own SIGBUS handler leaves with `siglongjmp` (past the end of a mapped
/// file: `sigbusjmp.c`) goes on using its managed memory: every word of 96 MiB under 32 MiB
/// holds, and `read(2)` into memory that is out fills it. Before, uswap's handler depth
/// stayed raised after the jump, and 66 of 96 reads failed with `EFAULT`.
#[test]
fn a_program_that_jumps_out_of_its_sigbus_handler_keeps_its_memory() {
    let dir = tmpdir("sigbusjmp");
    let p = compile("sigbusjmp", &dir, &[]);
    let file = dir.join("past-the-end");
    let (o, v) = uswap_run(32, &["--fault-mode", "signal"], &[p.to_str().unwrap(), "96", file.to_str().unwrap()], &dir);
    assert_printed_ok("sigbusjmp", &o);
    assert!(counter(&v, "pswpin") > 0, "nothing came back through faults: {v}");
}

/// SIGBUS handlers installed without the C library's `sigaction` symbol (`sigset`,
/// `sysv_signal`, `bsd_signal`, `sigignore`, a raw `rt_sigaction`: `sigolder.c`) are the
/// program's, as with `sigaction`: every word of 96 MiB under 32 MiB holds after each, each
/// handler gets a real SIGBUS, and each call reports the handler before it. Before, each
/// replaced uswap's handler in signal mode: the program's got uswap's faults, and `sigignore`
/// or a raw `SIG_DFL` killed the program at its next fault.
#[test]
fn sigbus_handlers_installed_the_older_ways_are_the_programs() {
    let dir = tmpdir("sigolder");
    let p = compile("sigolder", &dir, &[]);
    let file = dir.join("past-the-end");
    for mode in ["signal", "thread"] {
        let (o, v) = uswap_run(32, &["--fault-mode", mode], &[p.to_str().unwrap(), "96", file.to_str().unwrap()], &dir);
        assert_printed_ok("sigolder", &o);
        assert!(counter(&v, "pswpin") > 0, "{mode}: nothing came back through faults: {v}");
    }
}

/// `memalign` and `aligned_alloc` with an alignment that is not a power of two (or 0)
/// succeed as in the C library, the alignment rounded up (`memalign.c`), with a pager and
/// without one; before, uswap's allocator returned NULL (EINVAL) for them.
#[test]
fn odd_alignments_are_rounded_up_as_the_c_library_does() {
    let dir = tmpdir("memalign");
    let p = compile("memalign", &dir, &[]);
    for start_after in ["0", "64MiB"] {
        let (o, _) = uswap_run(64, &["--start-after", start_after], &[p.to_str().unwrap()], &dir);
        let out = String::from_utf8_lossy(&o.stdout);
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        // (A C library from 2.38 on refuses aligned_alloc's odd alignments; uswap's does not.)
        assert!(out.lines().count() == 5 && !out.contains("failed"), "start after {start_after}: {out}");
    }
}

/// Waits that set a mask with every signal but one blocked (`sigwaits.c`: `sigsuspend`,
/// `ppoll`, `pselect`, `epoll_pwait`) leave SIGBUS deliverable: the handler that ends each
/// reads every word of 96 MiB under 32 MiB. Before, in signal mode, its first fault killed
/// the program (the wait's mask blocked SIGBUS).
#[test]
fn handlers_that_end_a_wait_with_a_full_mask_take_faults() {
    let dir = tmpdir("sigwaits");
    let p = compile("sigwaits", &dir, &["-pthread"]);
    for mode in ["signal", "thread"] {
        let (o, v) = uswap_run(32, &["--fault-mode", mode], &[p.to_str().unwrap(), "96"], &dir);
        assert_printed_ok("sigwaits", &o);
        assert!(counter(&v, "pswpin") > 0, "{mode}: nothing came back through faults: {v}");
    }
}

/// An alternate signal stack too small for a signal's frame (`altsmall.c`: `MINSIGSTKSZ`,
/// 2,048 bytes, on the main thread and a thread) does not take signal mode's faults: uswap's
/// own stays in its place, said once, and every word of 96 MiB under 32 MiB holds with
/// nothing written below either stack. Before, the program died of SIGSEGV (a frame of 3 KiB
/// spun for good).
#[test]
fn an_alternate_stack_too_small_for_a_signal_frame_is_replaced_and_said() {
    let dir = tmpdir("altsmall");
    let p = compile("altsmall", &dir, &["-pthread"]);
    for mode in ["signal", "thread"] {
        let (o, v) = uswap_run(32, &["--fault-mode", mode], &[p.to_str().unwrap(), "96"], &dir);
        assert_printed_ok("altsmall", &o);
        assert!(counter(&v, "pswpin") > 0, "{mode}: nothing came back through faults: {v}");
        let said = String::from_utf8_lossy(&o.stderr).contains("too small for a signal's frame");
        assert_eq!(said, mode == "signal", "{mode}: {}", String::from_utf8_lossy(&o.stderr));
    }
}

/// The C library's own names for its allocator (`__libc_malloc`, `__libc_realloc`, ...),
/// mixed with the standard ones (`libcnames.c`), serve one heap, with a pager in both modes
/// and while the process waits for one: before, `__libc_realloc` of a block from `malloc`
/// aborted the program.
#[test]
fn the_c_librarys_own_allocator_names_serve_the_same_heap() {
    let dir = tmpdir("libcnames");
    let p = compile("libcnames", &dir, &[]);
    for how in [["--fault-mode", "signal"], ["--fault-mode", "thread"], ["--start-after", "256MiB"]] {
        let (o, _) = uswap_run(16, &how, &[p.to_str().unwrap(), "48"], &dir);
        assert_printed_ok("libcnames", &o);
    }
}

/// Blocks aligned to 128 KiB to 4 MiB (`largealign.c`: x264 asks 2 MiB for a frame it wants
/// in one huge page) are served, aligned, and keep every byte while paged, in both modes:
/// mimalloc serves alignments up to 64 KiB from its arenas and asks the system for the
/// rest, which uswap's heap forbids it, so `posix_memalign` failed and ffmpeg could not
/// open its encoder under `uswap run`. They are managed mappings of their own now, also
/// when the first comes while the process waits for its pager (which it then starts).
#[test]
fn blocks_aligned_past_the_heaps_arenas_are_served_and_paged() {
    let dir = tmpdir("largealign");
    let p = compile("largealign", &dir, &[]);
    let wss = WSS_MIB.to_string();
    let prog = [p.to_str().unwrap(), &wss];
    for how in
        [["--fault-mode", "signal"], ["--fault-mode", "thread"], ["--start-after", "0"], ["--start-after", "256MiB"]]
    {
        let r = uswap_run(LIMIT_MIB, &how, &prog, &dir);
        assert_same_and_paged(&prog, &r, LIMIT_MIB);
        let managed = counter(&r.1, "managed_peak_bytes");
        assert!(managed >= (WSS_MIB << 20) * 3 / 4, "{how:?}: the blocks are managed: {}", r.1);
    }
}

/// Threads on stacks the program gives them (`pthread_attr_setstack`, from `malloc` and from
/// `mmap`) start and run while those stacks are out, in both modes (`userstack.c`, every byte
/// checked). In signal mode a new thread's first frames went to a page that was out before it
/// had an alternate signal stack, and it died of SIGSEGV (status 139 every time).
#[test]
fn threads_on_stacks_the_program_gives_start_while_those_stacks_are_out() {
    run_in_both_modes("userstack", WSS_MIB, |_, prog, r| assert_same_and_paged(prog, r, LIMIT_MIB));
}

/// `uswap run` exits with its program's status also when its own stderr cannot be written
/// (a full device here; a pipe whose reader left, as in `uswap run -- make 2>&1 | head`):
/// before, its summary line panicked and the run ended with status 101.
#[test]
fn the_programs_status_stands_when_stderr_cannot_be_written() {
    let script = "\"$0\" run --limit 64MiB -- sh -c 'exit 3' 2>/dev/full; echo status $?";
    let o = uswap_from_sh(script);
    assert_eq!(String::from_utf8_lossy(&o.stdout), "status 3\n", "{}", String::from_utf8_lossy(&o.stderr));
}

/// Under `uswap run` a program's own pager (here `uswap bench`'s, which links the engine) is
/// refused, saying why: its library took that engine's memory for the program's, and the
/// second engine crashed on the first page it moved out.
#[test]
fn a_pager_of_the_library_api_under_uswap_run_is_refused_saying_why() {
    let me = env!("CARGO_BIN_EXE_uswap");
    let args = ["run", "--limit", "64MiB", "--", me, "bench", "--wss", "8MiB", "--limit", "4MiB", "--runs", "1"];
    let o = uswap(&args, None);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success(), "{}: {err}", o.status);
    assert!(err.contains("this process runs under `uswap run`"), "{err}");
    // With the library standing aside in it (as the message says), the program's pager runs.
    let aside =
        ["run", "--limit", "64MiB", "--", "env", "USWAP_DISABLE=1", me, "bench", "--wss", "8MiB", "--limit", "4MiB"];
    let o = uswap(&[&aside[..], &["--runs", "1"]].concat(), None);
    assert!(o.status.success(), "{}: {}", o.status, String::from_utf8_lossy(&o.stderr));
}

/// A test program that checks its own bytes ended well: status 0 and "OK" alone on stdout.
fn assert_printed_ok(what: &str, o: &Output) {
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(o.status.success() && out == "OK\n", "{what}: {}: {out}\n{}", o.status, String::from_utf8_lossy(&o.stderr));
}

#[test]
fn c_program_allocating_from_threads_with_malloc_and_mmap() {
    let dir = tmpdir("threads");
    let p = compile("threads", &dir, &[]);
    let prog = [p.to_str().unwrap(), &WSS_MIB.to_string(), "4"];
    let r = uswap_run(LIMIT_MIB, &["--fault-mode", "thread"], &prog, &dir);
    assert_same_and_paged(&prog, &r, LIMIT_MIB);
    assert_eq!(counter(&r.1, "processes"), 1, "{}", r.1);
    // Signal mode, several times: a new thread's DTV used to be allocated in the managed
    // heap, and the SIGBUS handler's thread-local accesses read it through __tls_get_addr;
    // when its page was out, that second SIGBUS (blocked in its own handler) killed the
    // process, about one run in eight (uswap-preload/src/threads.rs).
    for round in 0..12 {
        let r = uswap_run(LIMIT_MIB, &["--fault-mode", "signal"], &prog, &dir);
        assert!(
            r.0.status.success(),
            "signal mode, run {round}: {}\n{}",
            r.0.status,
            String::from_utf8_lossy(&r.0.stderr)
        );
        assert_same_and_paged(&prog, &r, LIMIT_MIB);
    }
}

/// A program's own signal masks and handlers (a thread blocking every signal, SIGBUS handlers
/// installed with `sigaction` and `signal`, a handler with a full `sa_mask`, `sigprocmask` of
/// everything) do not turn faults into crashes in either mode, and a real bus error still
/// reaches the program's own SIGBUS handler. Signal mode died with SIGBUS (status 135) at
/// the first step before `uswap-preload/src/signals.rs`.
#[test]
fn program_signal_masks_and_sigbus_handlers_in_both_modes() {
    let dir = tmpdir("sigmasks");
    let p = compile("sigmasks", &dir, &[]);
    let prog = [p.to_str().unwrap(), &WSS_MIB.to_string()];
    for mode in ["signal", "thread"] {
        let r = uswap_run(LIMIT_MIB, &["--fault-mode", mode], &prog, &dir);
        assert!(r.0.status.success(), "{mode}: {}\n{}", r.0.status, String::from_utf8_lossy(&r.0.stderr));
        assert!(String::from_utf8_lossy(&r.0.stdout).ends_with("own SIGBUS handler: a real bus error\n"), "{mode}");
        assert_same_and_paged(&prog, &r, LIMIT_MIB);
    }
}

/// A program's own alternate signal stacks in managed memory (malloc'd) hold every frame the
/// kernel writes there, its handler's and uswap's SIGBUS frames, however much was swapped
/// out meanwhile: on the main thread, a second thread, and in a fork child that inherited
/// one (whose pages it shares with its parent, write-protected). Before they were locked,
/// the program died of SIGBUS in signal mode at its first signal.
#[test]
fn program_alternate_signal_stacks_in_managed_memory_in_both_modes() {
    run_in_both_modes("altstack", WSS_MIB, |mode, prog, r| {
        assert!(
            String::from_utf8_lossy(&r.0.stdout).ends_with("done\n"),
            "{mode}: {}",
            String::from_utf8_lossy(&r.0.stderr)
        );
        // With a fork child: the limit plus the parent's pages it shares (docs/cli.md, "fork").
        assert_same_and_paged(prog, r, 2 * LIMIT_MIB);
        assert_eq!(counter(&r.1, "syscall_efault"), 0, "{mode}: {}", r.1);
    });
}

/// Memory the program locks stays resident under the limit (`mlock`, `mlock2` on fault),
/// and the calls succeed as without uswap: in signal mode `mlock` of managed memory failed
/// with ENOMEM (the kernel populates it with write faults it cannot wait for), and in both
/// modes reclaim tried to move locked pages out, which the kernel refuses. Locked pages
/// leave the LRU (reclaim takes each once) and the resident peak stays within the limit.
#[test]
fn locked_memory_stays_resident_and_mlock_succeeds_in_both_modes() {
    run_in_both_modes("mlock", WSS_MIB, |mode, prog, r| {
        let out = String::from_utf8_lossy(&r.0.stdout);
        assert!(out.starts_with("mlock 0\nmlock2 onfault 0\n"), "{mode}: {out}");
        assert!(out.contains("resident throughout: yes\n") && out.contains("child same\n"), "{mode}: {out}");
        // With a fork child: the limit plus the parent's pages it shares (docs/cli.md, "fork").
        assert_same_and_paged(prog, r, 2 * LIMIT_MIB);
        for c in ["mlock_unhonoured", "syscall_efault"] {
            assert_eq!(counter(&r.1, c), 0, "{mode}: {c}: {}", r.1);
        }
        // 256 locked pages in the parent, at most as many again in the fork child.
        assert!(counter(&r.1, "reclaim_pinned") <= 512, "{mode}: locked pages taken again and again: {}", r.1);
    });
}

/// `mlockall(MCL_CURRENT | MCL_FUTURE)` locks the program's memory, not uswap's
/// reservations (`lockall.c`, both modes): the kernel's own call brings in every page of
/// every mapping, and brought in the compressed pool's arena (12.9 GB in 19 s under
/// `--limit 96MiB`: stress-ng's `--mlock`); with `MCL_FUTURE` in force before the pager
/// started, each of the pager's mappings was brought in as it was made. Every word kept;
/// a mapping made after the call is locked by the kernel as it is touched.
#[test]
fn mlockall_locks_the_programs_memory_not_uswaps_reservations() {
    run_in_both_modes("lockall", WSS_MIB, |mode, _prog, r| {
        let out = String::from_utf8_lossy(&r.0.stdout);
        if out.starts_with("mlockall refused") {
            return skipped(&format!("mlockall needs CAP_IPC_LOCK or a larger RLIMIT_MEMLOCK here: {out}"));
        }
        assert!(r.0.status.success(), "{mode}: {}\n{out}{}", r.0.status, String::from_utf8_lossy(&r.0.stderr));
        for line in ["late mlockall 0", "new mapping locked: yes", "late wrong words: 0", "munlockall 0"] {
            assert!(out.lines().any(|l| l == line), "{mode}: no line {line:?} in\n{out}");
        }
        for line in ["early mlockall 0", "early wrong words: 0"] {
            assert!(out.lines().any(|l| l == line), "{mode}: no line {line:?} in\n{out}");
        }
        let measured = |who: &str, key: &str| -> f64 {
            let mut lines = out.lines().filter(|l| l.starts_with(&format!("measured {who} ")));
            let value = lines.find_map(|l| l.split_whitespace().skip_while(|w| *w != key).nth(1));
            value.and_then(|v| v.parse().ok()).unwrap_or_else(|| panic!("{mode}: no {who} {key} in\n{out}"))
        };
        // The engine's threads' stacks and the library's own data are locked with the
        // program's (about 20 MiB in all); the heap's pages that are out stay out.
        assert!(measured("late", "seconds") < 5.0, "{mode}: {out}");
        assert!(measured("late", "brought_in_mib") < 64.0, "{mode}: {out}");
        let early = (measured("early", "seconds"), measured("early", "fill_seconds"));
        assert!(early.0 < 5.0 && early.1 < 10.0, "{mode}: {out}");
        assert!(measured("early", "rss_mib") < (WSS_MIB + 64) as f64, "{mode}: {out}");
    });
}

/// Calls the kernel refuses change nothing, and a lock of more than the limit ends
/// (`refused.c`, both modes): `munmap(p, 1 << 62)` released every region above `p` before
/// the kernel said `EINVAL` (the program died of SIGSEGV), `mremap` to a length past the
/// top of user space succeeded, `mlock(p, 1 << 62)` (ENOMEM at the first hole, nothing
/// populated) brought every managed page above `p` in, the heap's untouched reservation
/// included (2.5 GiB in 60 s), and `mlock` of 64 MiB under 16 MiB brought about 100 pages a
/// second in (each charge scanned the heap's page table, found only locked pages, and
/// napped). Output as without uswap; the resident peak is the locked mapping, not more.
#[test]
fn calls_the_kernel_refuses_change_nothing_and_a_large_lock_ends() {
    run_in_both_modes("refused", WSS_MIB, |mode, prog, r| {
        let expect = plain(prog);
        let out = String::from_utf8_lossy(&r.0.stdout);
        assert!(r.0.status.success(), "{mode}: {}\n{}", r.0.status, String::from_utf8_lossy(&r.0.stderr));
        assert_eq!(out, String::from_utf8_lossy(&expect.stdout), "{mode}: output differs from the plain run");
        assert!(out.contains("munmap(p, 2^62): -1 Invalid argument\n"), "{mode}: {out}");
        assert!(out.contains("mlock(p, len): ok\n") && out.contains("wrong words after: 0\n"), "{mode}: {out}");
        assert!(counter(&r.1, "pswpout") > 0, "{mode}: nothing was paged out: {}", r.1);
        let peak = counter(&r.1, "resident_peak_bytes");
        assert!(peak <= ((WSS_MIB + LIMIT_MIB) << 20), "{mode}: resident peak {peak}: {}", r.1);
        let wall_s = r.1["wall_seconds"].as_f64().unwrap_or(f64::MAX);
        assert!(wall_s < 20.0, "{mode}: {wall_s} s: {}", String::from_utf8_lossy(&r.0.stderr));
    });
}

/// Managed memory made read-only is let go of (the kernel refuses to move a page out of a
/// read-only mapping: reclaim met 159k refusals and the 16 MiB limit peaked at 31 MB) and
/// reported as unmanaged, with its reason; a `MAP_LOCKED` mapping stays resident (its pages
/// went out); a `MAP_32BIT` one lies below 2 GiB (it was mapped anywhere). Both modes.
#[test]
fn read_only_memory_is_let_go_of_and_the_limit_holds() {
    run_in_both_modes("readonly", WSS_MIB, |mode, prog, r| {
        let out = String::from_utf8_lossy(&r.0.stdout);
        assert!(out.ends_with("below 2 GiB: yes, locked mapping resident throughout: yes\n"), "{mode}: {out}");
        assert_same_and_paged(prog, r, LIMIT_MIB);
        assert!(counter(&r.1, "unmanaged_peak_bytes") >= 16 << 20, "{mode}: {}", r.1);
        assert_eq!(counter(&r.1, "move_refused"), 0, "{mode}: {}", r.1);
        let err = String::from_utf8_lossy(&r.0.stderr);
        assert!(err.contains("read-only memory (mprotect)"), "{mode}: {err}");
    });
}

/// Memory let go of when it was made read-only, then made writable again, stays the
/// kernel's, and the report still says why (before, it blamed the C library or a raw system
/// call); the rest of the program's memory is not counted with it.
#[test]
fn memory_let_go_of_and_made_writable_again_is_named() {
    let dir = tmpdir("unseal");
    let p = compile("readonly", &dir, &[]);
    let wss = WSS_MIB.to_string();
    let prog = [p.to_str().unwrap(), &wss, "unseal"];
    for mode in ["signal", "thread"] {
        let r = uswap_run(LIMIT_MIB, &["--fault-mode", mode], &prog, &dir);
        assert_same_and_paged(&prog, &r, LIMIT_MIB);
        let unmanaged = counter(&r.1, "unmanaged_peak_bytes");
        assert!(((16 << 20)..(24 << 20)).contains(&unmanaged), "{mode}: unmanaged peak {unmanaged}: {}", r.1);
        let err = String::from_utf8_lossy(&r.0.stderr);
        assert!(err.contains("made read-only or executable by the program (mprotect)"), "{mode}: {err}");
    }
}

/// Memory held in thousands of one-page mappings (`pagemaps.c`: 24 MiB under 16 MiB, as
/// stress-ng's mmap stressor holds its 256 MiB) is reported by its reason, with how many
/// mappings and the largest: the report named only the four largest mappings of the tree,
/// 2.2 MiB of shared memory, for 98 MiB outside the budget. Three fork children read all
/// of it meanwhile: the pages they share with their parent count once (they counted in
/// each child as well: 97 MiB).
#[test]
fn memory_in_many_small_mappings_is_said_by_reason() {
    let dir = tmpdir("pagemaps");
    let p = compile("pagemaps", &dir, &[]);
    let (o, v) = uswap_run(16, &[], &[p.to_str().unwrap(), "24", "3"], &dir);
    assert_printed_ok("pagemaps", &o);
    let unmanaged = counter(&v, "unmanaged_peak_bytes");
    assert!(((24 << 20)..(32 << 20)).contains(&unmanaged), "unmanaged peak {unmanaged}: {v}");
    let err = String::from_utf8_lossy(&o.stderr);
    let line =
        err.lines().find(|l| l.contains("smaller than --min-size")).unwrap_or_else(|| panic!("not said:\n{err}"));
    // `  24.0MiB in 6144 mappings, the largest 4KiB (process ...`: the program's pages (and a
    // few of the program's own small mappings).
    let words: Vec<&str> = line.split_whitespace().collect();
    let mappings: u64 = words.get(2).and_then(|w| w.parse().ok()).unwrap_or(0);
    assert!(words[0].starts_with("24") && (6144..6200).contains(&mappings), "{line}");
    assert!(words[3] == "mappings," && line.contains("the largest"), "{line}");
}

/// A traced fork child whose uswap threads a group stop holds while its tracer resumes only
/// the thread it traces unmaps its whole address space (`unmapall.c`, as stress-ng's vm-segv
/// stressor does), and dies of SIGSEGV in both modes, as without uswap: its `munmap` waited
/// for good for an event that uswap's stopped threads would read.
#[test]
fn a_traced_child_that_unmaps_everything_dies_of_sigsegv() {
    run_in_both_modes("unmapall", 2 * LIMIT_MIB, |mode, _, r| assert_printed_ok(mode, &r.0));
}

/// Forks the C library's `fork` does not make, which run no fork handler
/// (`syscall(SYS_fork)`, `syscall(SYS_clone)`, `syscall(SYS_clone3)`, `clone` with a stack
/// and an argument of its own and no `CLONE_VM`, `_Fork`; `rawfork.c`): each child reads
/// every byte of a buffer four times the limit as written, and allocates, advises and uses
/// memory of its own, in both modes; and so in a process whose buffer is too small to start
/// a pager. Their copies read zeros where pages were out before, and the children went on.
#[test]
fn forks_made_without_the_c_librarys_fork_keep_every_byte_in_both_modes() {
    let want = "rawfork: fork same, SYS_fork same, SYS_clone same, SYS_clone3 same, clone same, _Fork same, \
                parent same\n";
    run_in_both_modes("rawfork", WSS_MIB, |mode, _, r| {
        let (stdout, stderr) = (String::from_utf8_lossy(&r.0.stdout), String::from_utf8_lossy(&r.0.stderr));
        assert_eq!(stdout, want, "{mode}: {}\n{stderr}", r.0.status);
        assert!(r.0.status.success(), "{mode}: {}\n{stderr}", r.0.status);
        assert!(counter(&r.1, "pswpout") > 0, "{mode}: nothing was swapped out: {}", r.1);
    });
    let dir = tmpdir("rawfork-waiting");
    let prog = compile("rawfork", &dir, &[]);
    let (o, _) = uswap_run(256, &[], &[prog.to_str().unwrap(), "1"], &dir);
    let (stdout, stderr) = (String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr));
    assert_eq!(stdout, want, "without a pager: {}\n{stderr}", o.status);
}

/// Code running on stacks the program made in managed memory (64 coroutines of
/// `makecontext`, a thread of `pthread_attr_setstack`, both from `malloc`) while a timer's
/// handler, installed without `SA_ONSTACK`, has its frames written onto them
/// (`signalstacks.c`): every frame and byte as written, in both modes. In signal mode the
/// kernel could not write such a frame onto a page that was out or never touched, and the
/// program died of SIGSEGV at once; there the stacks are let go of, and said.
#[test]
fn signals_taken_on_the_programs_own_stacks_are_delivered_in_both_modes() {
    run_in_both_modes("signalstacks", WSS_MIB, |mode, _, r| {
        let (stdout, stderr) = (String::from_utf8_lossy(&r.0.stdout), String::from_utf8_lossy(&r.0.stderr));
        assert!(r.0.status.success(), "{mode}: {}\n{stdout}\n{stderr}", r.0.status);
        assert_eq!(stdout, "signalstacks: coroutines ok, thread ok, buffer ok, ticks yes\n", "{mode}: {stderr}");
        assert!(counter(&r.1, "pswpout") > 0, "{mode}: nothing was swapped out: {}", r.1);
        let said = stderr.contains("a stack the program runs code on (makecontext, pthread_attr_setstack)");
        assert_eq!(said, mode == "signal", "{mode}: the stacks let go of are said in signal mode only:\n{stderr}");
    });
}

/// `MADV_POPULATE_WRITE`/`_READ` over managed memory whose pages are out succeed in both
/// modes (in signal mode they failed with EFAULT: the kernel populates with faults of its
/// own), and every byte is as written. `MAP_POPULATE` with an address hint keeps to the
/// limit (the kernel populated all of it before the pager adopted it: twice the limit).
#[test]
fn populating_managed_memory_succeeds_in_both_modes() {
    run_in_both_modes("populate", WSS_MIB / 2, |mode, prog, r| {
        let out = String::from_utf8_lossy(&r.0.stdout);
        assert!(out.starts_with("populate write 0 (errno 0), read 0 (0), write 0 (0)"), "{mode}: {out}");
        assert_same_and_paged(prog, r, LIMIT_MIB);
    });
}

/// `mremap` of a `PROT_NONE` reservation moves and grows it, still `PROT_NONE`, and of a
/// range with a hole says `EFAULT` and keeps its data (`remapnone.c`), in both modes, as
/// without uswap. Before, uswap's move copied from the old range without looking, and the
/// program died of SIGSEGV inside `mremap`. A locked range moved stays locked (it went out
/// to the devices), and one marked `MADV_WIPEONFORK` reads zero in a fork child (it did
/// not).
#[test]
fn mremap_of_a_reservation_or_a_range_with_a_hole_answers_as_the_kernel() {
    run_in_both_modes("remapnone", WSS_MIB, |mode, prog, r| {
        let out = String::from_utf8_lossy(&r.0.stdout);
        let want = "remapnone: moved 1, segv 1, hole efault 1, locked resident 1024 of 1024, wiped 1, bad 0";
        assert!(out.starts_with(want), "{mode}: {out}");
        // The 4 MiB locked stays in over the limit, as the program asked: said, not held.
        assert!(r.0.status.success() && counter(&r.1, "pswpout") > 0, "{mode}: {}", r.1);
        let _ = prog;
    });
}

/// A SIGSEGV sent to the process runs the program's handler on the program's own thread,
/// in both modes (`killsegv.c`: the only thread that leaves it unblocked; the handler reads
/// managed memory). uswap's threads left it unblocked: most of the signals ran the handler
/// there, and in thread mode the program hung (a handler thread waiting in the fault it was
/// to serve); in signal mode a page stayed busy and the program died of SIGBUS.
#[test]
fn a_sigsegv_sent_to_the_process_runs_on_the_programs_thread() {
    run_in_both_modes("killsegv", WSS_MIB, |mode, _prog, (o, v)| {
        let out = String::from_utf8_lossy(&o.stdout);
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(out.starts_with("killsegv: handled 1, wrong thread 0, bad 0"), "{mode}: {out}{err}");
        assert!(o.status.success() && counter(v, "pswpout") > 0, "{mode}: {err}");
    });
}

/// Guard regions over managed memory whose pages are out (`guards.c`): a touch there is
/// SIGSEGV, and once removed they read zero in both modes. Before, the pages that were out
/// came back with their old contents (the kernel zaps guarded pages without telling
/// userfaultfd, so the engine kept their slots).
#[test]
fn guard_regions_over_pages_that_are_out_read_zero_once_removed() {
    run_in_both_modes("guards", WSS_MIB, |mode, _prog, (o, v)| {
        let out = String::from_utf8_lossy(&o.stdout);
        if o.status.code() == Some(77) {
            // A kernel before 6.13 has no guard regions: nothing to compare.
            return uswap_testkit::skipped(&format!("this kernel has no MADV_GUARD_INSTALL: {out}"));
        }
        let quarter_pages = WSS_MIB * 256 / 4;
        let want = format!("guards: segv 1, zero {quarter_pages}, old 0, other 0, bad 0");
        assert!(out.starts_with(&want), "{mode}: {out}{}", String::from_utf8_lossy(&o.stderr));
        assert!(o.status.success() && counter(v, "pswpout") > 0, "{mode}: {v}");
    });
}

/// A program that sets a data limit on itself with room for what it allocates next
/// (`datalimit.c`: 200 MiB held under 64 MiB, a limit of 360 MiB, then 100 mappings of 1 MiB
/// written) gets them, and `getrlimit` gives back the limit it set. Before, the kernel
/// counted uswap's pool against the limit and the first mapping failed.
#[test]
fn a_data_limit_set_inside_the_run_leaves_room_for_uswap() {
    let dir = tmpdir("datalimit");
    let p = compile("datalimit", &dir, &[]);
    for mode in ["signal", "thread"] {
        let (o, v) = uswap_run(64, &["--fault-mode", mode], &[p.to_str().unwrap(), "200"], &dir);
        assert_printed_ok(mode, &o);
        assert!(counter(&v, "pswpout") > 0, "{mode}: nothing was paged: {v}");
    }
}

/// Under an address-space limit (`ulimit -v`, 2 GB) a process is managed with reservations
/// sized to fit, and says so: the pool's arena (12 GiB here by default) made every such
/// process fail to start its pager, and `uswap run` ran nothing.
#[test]
fn an_address_space_limit_is_fitted_and_said() {
    let dir = tmpdir("ulimit");
    let p = compile("grow", &dir, &[]);
    let wss = WSS_MIB.to_string();
    let prog = ["sh", "-c", "ulimit -v 2000000 && exec \"$0\" \"$1\"", p.to_str().unwrap(), &wss];
    let r = uswap_run(LIMIT_MIB, &[], &prog, &dir);
    assert_same_and_paged(&prog, &r, LIMIT_MIB);
    let err = String::from_utf8_lossy(&r.0.stderr);
    assert!(err.contains("address-space limit (ulimit -v) of 1953 MiB"), "{err}");
    // A data limit counts every reservation too (each is private and writable): before, the
    // heap's reservation failed ("cannot reserve the heap") and every process was refused.
    let prog = ["sh", "-c", "ulimit -d 2000000 && exec \"$0\" \"$1\"", p.to_str().unwrap(), &wss];
    let r = uswap_run(LIMIT_MIB, &[], &prog, &dir);
    assert_same_and_paged(&prog, &r, LIMIT_MIB);
    let err = String::from_utf8_lossy(&r.0.stderr);
    assert!(err.contains("a data limit (ulimit -d) of 1953 MiB"), "{err}");
    // A small limit: the heap's floor (256 MiB) and the pool's (64 MiB, slots four times
    // that) did not fit 512 MiB, and the pager could not start ("cannot map swap staging
    // area (0 bytes)"); under 256 MiB no process started at all.
    let prog = ["sh", "-c", "ulimit -v 524288 && exec \"$0\" \"$1\"", p.to_str().unwrap(), &wss];
    let r = uswap_run(LIMIT_MIB, &[], &prog, &dir);
    assert_same_and_paged(&prog, &r, LIMIT_MIB);
    let err = String::from_utf8_lossy(&r.0.stderr);
    assert!(err.contains("(ulimit -v) of 512 MiB") && err.contains("its managed heap is 256 MiB"), "{err}");
    let prog = ["sh", "-c", "ulimit -v 262144 && exec true"];
    let r = uswap_run(LIMIT_MIB, &[], &prog, &dir);
    assert!(r.0.status.success(), "{}", String::from_utf8_lossy(&r.0.stderr));
}

/// A limit a managed shell sets on itself (`ulimit -v` inside the run) leaves uswap room:
/// its reservations were far above the limit, so the shell's fork children could not build
/// a pager (the run failed) and the shell aborted when one of uswap's threads next
/// allocated. Now the shell goes on, `ulimit -v` reports the limit that was set, and each
/// program it runs sizes its reservations to that limit and says so. The same for a data
/// limit (`ulimit -d`), carried to the programs as the address-space limit is.
#[test]
fn an_address_space_limit_set_inside_the_run_leaves_room_for_uswap() {
    let dir = tmpdir("ulimit-inside");
    let p = compile("grow", &dir, &[]);
    let wss = WSS_MIB.to_string();
    for (flag, said) in [
        ("-v", "address-space limit (ulimit -v) of 1953 MiB, set inside the run"),
        ("-d", "data limit (ulimit -d) of 1953 MiB, set inside the run"),
    ] {
        // The sleeps give uswap's threads in the shell time to run under the new limit.
        let script = format!(
            "ulimit {flag} 2000000 && ulimit {flag} && sleep 0.2 && \"$0\" \"$1\" && sleep 0.2 && exec \"$0\" \"$1\""
        );
        let prog = ["sh", "-c", &script, p.to_str().unwrap(), &wss];
        let r = uswap_run(LIMIT_MIB, &[], &prog, &dir);
        assert_same_and_paged(&prog, &r, LIMIT_MIB);
        assert!(String::from_utf8_lossy(&r.0.stdout).starts_with("2000000\n"), "ulimit {flag} said otherwise");
        let err = String::from_utf8_lossy(&r.0.stderr);
        // Each program the shell runs after the limit: two sleeps and two grows.
        assert_eq!(err.matches(said).count(), 4, "each program sizes its reservations to the limit set:\n{err}");
    }
}

#[test]
fn realloc_growth_keeps_every_byte() {
    let dir = tmpdir("grow");
    let p = compile("grow", &dir, &[]);
    let prog = [p.to_str().unwrap(), &WSS_MIB.to_string()];
    let r = uswap_run(LIMIT_MIB, &[], &prog, &dir);
    assert_same_and_paged(&prog, &r, LIMIT_MIB);
}

/// The tree's pool peak is the most its processes' compressed pools held at once: two
/// processes paging one after the other peak about as high as one alone, where the sum of
/// each one's peak would count both.
#[test]
fn the_trees_pool_peak_counts_its_processes_at_one_moment() {
    let dir = tmpdir("poolpeak");
    let p = compile("grow", &dir, &[]);
    let (p, wss) = (p.to_str().unwrap(), WSS_MIB.to_string());
    let one = uswap_run(LIMIT_MIB, &[], &[p, &wss], &dir);
    assert_same_and_paged(&[p, &wss], &one, LIMIT_MIB);
    let one_peak = counter(&one.1, "pool_peak_bytes");
    assert!(one_peak > 0, "nothing in the pool: {}", one.1);
    let twice = ["sh", "-c", "\"$0\" \"$1\" && \"$0\" \"$1\"", p, &wss];
    let (o, v) = uswap_run(LIMIT_MIB, &[], &twice, &dir);
    assert!(o.status.success(), "{}\n{}", o.status, String::from_utf8_lossy(&o.stderr));
    // The two `grow`s (the shell never needs a pager of its own).
    assert!(counter(&v, "processes") >= 2, "{v}");
    let two_peak = counter(&v, "pool_peak_bytes");
    assert!(
        two_peak >= one_peak / 2 && two_peak < one_peak * 3 / 2,
        "one run's pool peaked at {one_peak} bytes, two in a row at {two_peak}: {v}"
    );
}

#[test]
fn freed_memory_reads_back_as_zeros_and_gives_its_slots_back() {
    let dir = tmpdir("zeros");
    let p = compile("zeros", &dir, &[]);
    let prog = [p.to_str().unwrap(), &WSS_MIB.to_string()];
    let r = uswap_run(LIMIT_MIB, &[], &prog, &dir);
    assert_same_and_paged(&prog, &r, LIMIT_MIB);
    // MADV_DONTNEED and MADV_FREE reached the engine as REMOVE events, munmap as a dropped
    // region; the pages freed that way were on the device, so their slots came back.
    assert!(counter(&r.1, "uffd_remove") >= 2, "{}", r.1);
}

/// The heap gives what the program frees back while it runs (mimalloc's purges reach the
/// engine as REMOVE events; none at exit, where the library skips mimalloc's collection).
/// mimalloc, started by the library rather than by its own constructor
/// (`uswap-preload/src/heap.rs`), purges only if its whole start ran: with `mi_process_init`
/// alone it stayed "preloading" and this run saw no REMOVE (54 with the whole start).
#[test]
fn the_heap_gives_freed_blocks_back() {
    let dir = tmpdir("heapfree");
    let p = compile("heapfree", &dir, &[]);
    let prog = [p.to_str().unwrap(), &WSS_MIB.to_string(), "4"];
    let r = uswap_run(LIMIT_MIB, &[], &prog, &dir);
    assert_same_and_paged(&prog, &r, LIMIT_MIB);
    assert!(counter(&r.1, "uffd_remove") >= 1, "{}", r.1);
}

/// A program that reads every page of the mapping its heap lies in (as stress-ng's
/// `--fork-vm` children read all of `/proc/self/maps`) reads what mimalloc was handed, not the
/// heap's whole reservation (the limit plus the devices' capacity, tens of GiB): the rest is
/// `PROT_NONE` (docs/cli.md, "What is managed"). Before, the read took 12 s in thread mode
/// and over 100 s in signal mode (a SIGBUS per page), and the mapping was 48 GiB.
#[test]
fn a_program_reading_its_heaps_mapping_reads_only_what_was_handed_out() {
    run_in_both_modes("readheap", WSS_MIB, |mode, _, r| {
        let readable_mib = readable_mib_of_a_run_that_ended_ok(mode, &r.0);
        // The first arena (256 MiB) holds the working set; never more than one doubling.
        assert!(readable_mib <= 512, "{mode}: {readable_mib} MiB of the heap's mapping readable");
        assert!(counter(&r.1, "pswpout") > 0, "{mode}: the working set was paged: {}", r.1);
    });
}

/// What `readheap` and `readmaps` print they read ("readable MiB N"), from a run that ended
/// well and printed "ok".
fn readable_mib_of_a_run_that_ended_ok(mode: &str, o: &Output) -> u64 {
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(
        o.status.success() && out.ends_with("ok\n"),
        "{mode}: {}: {out}\n{}",
        o.status,
        String::from_utf8_lossy(&o.stderr)
    );
    out.lines()
        .find_map(|l| l.strip_prefix("readable MiB "))
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("{mode}: no size in {out}"))
}

/// A program that reads every page of every readable mapping it has meets uswap's own
/// mappings: it reads them as zeros and goes on, and reads only what uswap has used of them.
/// A staging area's empty page used to kill it with SIGBUS (registered for missing faults),
/// and the staging areas and the pool's arena were readable whole (60 GiB on a 24 GiB machine).
#[test]
fn a_program_reading_its_whole_address_space_reads_uswaps_mappings_as_zeros() {
    let ram_mib = std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|m| {
            m.lines().find_map(|l| l.strip_prefix("MemTotal:")?.trim().strip_suffix(" kB")?.parse::<u64>().ok())
        })
        .expect("MemTotal in /proc/meminfo")
        >> 10;
    run_in_both_modes("readmaps", WSS_MIB, |mode, _, r| {
        let readable_mib = readable_mib_of_a_run_that_ended_ok(mode, &r.0);
        // What stays readable: the heap's first arena, the tables sized by the devices'
        // slots (a few per cent of the RAM), a window of the arena and of the staging area.
        assert!(readable_mib < 1024 + ram_mib / 8, "{mode}: {readable_mib} MiB readable with {ram_mib} MiB of RAM");
        assert!(counter(&r.1, "pswpout") > 0, "{mode}: the working set was paged: {}", r.1);
    });
}

/// A thread that keeps reading every readable anonymous mapping (uswap's staging area among
/// them: it maps the kernel's zero page in empty staging slots) while the program pages:
/// every word comes back as written, and reclaim drops those zero pages before it moves
/// pages into the slots (a zero page taken for a moved page would store zeros).
#[test]
fn pages_stay_intact_while_a_thread_reads_uswaps_staging_area() {
    let dir = tmpdir("readrace");
    let p = compile("readrace", &dir, &[]);
    for mode in ["signal", "thread"] {
        let (o, v) = uswap_run(LIMIT_MIB, &["--fault-mode", mode], &[p.to_str().unwrap(), "40", "2"], &dir);
        let out = String::from_utf8_lossy(&o.stdout);
        assert!(
            o.status.success() && out == "bad 0\n",
            "{mode}: {}: {out}\n{}",
            o.status,
            String::from_utf8_lossy(&o.stderr)
        );
        assert!(counter(&v, "pswpout") > 0, "{mode}: {v}");
        assert!(counter(&v, "staging_foreign_drops") > 0, "{mode}: the reader never met a slot reclaim used: {v}");
    }
}

#[test]
fn fork_child_reads_the_parents_memory_as_it_was() {
    let dir = tmpdir("fork");
    let p = compile("forkread", &dir, &[]);
    let prog = [p.to_str().unwrap(), &WSS_MIB.to_string()];
    // Both modes: in signal mode the parent's final printf used to be lost (its stdio
    // buffer's page could be out when exit() wrote it: EFAULT), before system calls on
    // managed memory were routed through uswap (`uswap/src/syscall_guard`).
    let expect = plain(&prog);
    for mode in ["thread", "signal"] {
        let (o, v) = uswap_run(LIMIT_MIB, &["--fault-mode", mode], &prog, &dir);
        assert!(o.status.success(), "{mode}: {}\n{}", o.status, String::from_utf8_lossy(&o.stderr));
        assert_eq!(o.stdout, expect.stdout, "{mode}: child or parent read different bytes");
        assert!(counter(&v, "pswpout") > 0, "{v}");
        assert_eq!(counter(&v, "syscall_efault"), 0, "{mode}: {v}");
        // The fork brings nothing in from the pool (the child reads the pages that were out
        // from its copy of it): the bound is the limit, plus the parent's resident pages the
        // child shares while it lives (docs/cli.md, "fork"). It used to be the whole working set.
        let peak = counter(&v, "resident_peak_bytes");
        assert!(peak <= ((2 * LIMIT_MIB) << 20) + SLACK_BYTES, "{mode}: peak {peak}: {v}");
    }
}

/// `MADV_WIPEONFORK` and `MADV_DONTFORK` on managed memory whose pages are out at the fork:
/// the child reads zeros in the first (it read its parent's bytes from the parent's pool)
/// and does not have the second (it was registered and paged as the child's, and the child
/// died of SIGBUS); `MADV_KEEPONFORK` undoes the first on half of it. Both modes.
#[test]
fn fork_advice_on_managed_memory_is_honoured_in_both_modes() {
    run_in_both_modes("forkadvice", WSS_MIB, |mode, prog, r| {
        let out = String::from_utf8_lossy(&r.0.stdout);
        assert!(out.ends_with("child status 0\n"), "{mode}: {out}\n{}", String::from_utf8_lossy(&r.0.stderr));
        // With a fork child: the limit plus the parent's pages it shares (docs/cli.md, "fork").
        assert_same_and_paged(prog, r, 2 * LIMIT_MIB);
    });
}

/// Memory discarded with `MADV_DONTNEED`, its pages out, reads zero in a fork child made
/// right after (`discardfork.c`, eight rounds, both modes). The `madvise` returns once its
/// event is read, not applied; the fork's record of the pages now waits for reads begun to
/// be applied (`events::settle_reads`), where it could find a discarded page still at its
/// slot and the child read its old bytes from its copy of the pool. A race: not seen to
/// fail before the wait (40 rounds of 128 and 512 MiB in each mode), it keeps the rule.
#[test]
fn discarded_memory_reads_zero_in_a_fork_child_made_at_once() {
    run_in_both_modes("discardfork", WSS_MIB, |mode, _prog, (o, v)| {
        let out = String::from_utf8_lossy(&o.stdout);
        assert!(o.status.success(), "{mode}: {}\n{out}\n{}", o.status, String::from_utf8_lossy(&o.stderr));
        assert!(out.ends_with("0 of 8 rounds: discarded memory not zero in the child\n"), "{mode}: {out}");
        assert!(counter(v, "pswpout") > 0, "{mode}: nothing went out before the discards: {v}");
    });
}

/// Mappings the kernel places in the holes of a managed mapping the program unmapped in
/// part (`holes.c`): one at the mapping's own start, so that two managed mappings start at
/// one address, and one in its middle. Through pressure, a fork (the child re-arms both
/// and unmaps the one at the shared start) and the parent's unmaps, every byte stays, in
/// both modes, and nothing leaves the budget. A child that gave the two mappings each
/// other's regions (a table matching them by start alone) let the larger one's pages go
/// when it unmapped the smaller: 14 MiB unmanaged, and in thread mode 273,357 wrong bytes.
#[test]
fn mappings_in_the_holes_of_a_managed_mapping_keep_their_own_pages() {
    run_in_both_modes("holes", WSS_MIB, |mode, prog, r| {
        assert_same_and_paged(prog, r, 2 * LIMIT_MIB);
        let unmanaged = counter(&r.1, "unmanaged_peak_bytes");
        assert!(unmanaged < 4 << 20, "{mode}: {unmanaged} bytes unmanaged at the peak: {}", r.1);
    });
}

/// Ruby's heap pages (`alignpages.c`): each page of 16 KiB is what is left of a mapping of
/// 32 KiB whose first half the program unmapped, and the kernel places the next mapping over
/// that hole. Under `--min-size 16KiB` every page is a managed mapping: every byte is kept,
/// in both modes, nothing leaves the budget, and the table of managed mappings trims an
/// entry to what the program kept (`managed_table::Table::trim`). Before, each entry kept
/// its 32 KiB, overlapped the next, and every page unmapped scanned all of them against
/// each other: 49 s for these 128 MiB (8,192 pages) under 16 MiB against 2.4 s now, and
/// Ruby itself (a hash of 600,000 entries, `--limit 4GiB`) 69 s against 4.9 s, 4.2 s plain.
#[test]
fn heap_pages_cut_from_larger_mappings_are_managed_without_a_scan_of_them_all() {
    let dir = tmpdir("alignpages");
    let p = compile("alignpages", &dir, &[]);
    let mib = (2 * WSS_MIB).to_string();
    let prog = [p.to_str().unwrap(), &mib];
    for mode in ["signal", "thread"] {
        let t0 = Instant::now();
        let r = uswap_run(LIMIT_MIB, &["--fault-mode", mode, "--min-size", "16KiB"], &prog, &dir);
        let took = t0.elapsed();
        assert_same_and_paged(&prog, &r, LIMIT_MIB);
        let unmanaged = counter(&r.1, "unmanaged_peak_bytes");
        assert!(unmanaged < 4 << 20, "{mode}: {unmanaged} bytes unmanaged at the peak: {}", r.1);
        assert!(took < Duration::from_secs(30), "{mode}: took {took:?} (a scan of every mapping per unmap?): {}", r.1);
    }
}

/// GHC's runtime (`hugereserve.c`): a reservation of 1 TiB, discarded whole at start, then
/// committed 1 MiB at a time with `mmap(MAP_FIXED)`, and forks. Every byte is kept, in both
/// modes, the children's included; the process's peak resident memory stays near what it
/// holds, since a discard leaves the page table's words past the touched part unwritten
/// (`RegionInner::touched_end`); and a fork reads none of the table's words
/// (`gone_scan_pages`), since the pages each commit's `UNMAP` made `Gone` are counted back
/// when the commit adopts them. Before, the discard wrote a word for each of the
/// reservation's 268 M pages (2.2 GB resident for these 128 MiB, pandoc 2.4 GB for its 710
/// MB), and each fork read them all (the program's slowest fork and wait: 839 ms against
/// 62-85 ms after and 25 ms plain, on 2 vCPUs).
#[test]
fn a_reservation_of_a_tebibyte_costs_only_what_the_program_touches() {
    // Restarted after each mode's checks: what it measures is that mode's run (and, for the
    // first, the program's compilation).
    let mut t0 = Instant::now();
    run_in_both_modes("hugereserve", 2 * WSS_MIB, |mode, prog, r| {
        let took = t0.elapsed();
        assert_same_and_paged(prog, r, LIMIT_MIB);
        let stderr = String::from_utf8_lossy(&r.0.stderr);
        let hwm_kib: u64 = stderr
            .lines()
            .find_map(|l| l.strip_prefix("hwm_kib "))
            .and_then(|n| n.trim().parse().ok())
            .unwrap_or_else(|| panic!("{mode}: no hwm_kib line: {stderr}"));
        // The limit, the pool (these words barely compress: about as much again as the
        // working set) and the engine's own: far from the 2 GiB of a table written whole.
        let bound_kib = (LIMIT_MIB + 2 * WSS_MIB + 256) << 10;
        assert!(hwm_kib < bound_kib, "{mode}: peak resident {hwm_kib} KiB, over {bound_kib}: {}", r.1);
        // Each fork would read the reservation's 268 M words if its pages still counted as
        // unmapped; the program's other regions may have a few.
        let scanned = counter(&r.1, "gone_scan_pages");
        assert!(scanned < 1 << 24, "{mode}: {scanned} page-table words read to find live pages: {}", r.1);
        assert!(took < Duration::from_secs(30), "{mode}: took {took:?}: {}", r.1);
        t0 = Instant::now();
    });
}

/// A program a debugger runs (`tracer.c`: `PTRACE_TRACEME` and exec, as gdb's `run`, every
/// signal let through) gets thread mode under the default `auto`, said on stderr: in signal
/// mode each of its faults is a SIGBUS that stops it in the debugger (155,481 stops for this
/// run before, each one a prompt in gdb). Every byte is kept and the limit holds.
#[test]
fn a_program_under_a_debugger_gets_thread_mode() {
    let dir = tmpdir("tracer");
    let tracer = compile("tracer", &dir, &[]);
    let randrw = compile("randrw", &dir, &[]);
    let prog = [tracer.to_str().unwrap(), randrw.to_str().unwrap(), &WSS_MIB.to_string(), "200000"];
    let r = uswap_run(LIMIT_MIB, &["--fault-mode", "auto"], &prog, &dir);
    assert_same_and_paged(&prog, &r, LIMIT_MIB);
    let stderr = String::from_utf8_lossy(&r.0.stderr);
    assert!(stderr.contains("sigbus_stops 0\n"), "the traced program stopped on SIGBUS: {stderr}");
    assert!(stderr.contains("runs in thread mode: a debugger or tracer follows it"), "{stderr}");
}

/// fork without exec, and both go on: while the child lives (and shares the parent's pages
/// copy-on-write, which cannot be moved out of the parent), the parent allocates and fills as
/// much again. Its faults charge over the limit at once instead of waiting for pages that
/// cannot go (each used to wait out the reclaim back-off, 100 ms, ending in
/// `limit_overrun_busy`; Python's multiprocessing pool stalled for minutes that way).
#[test]
fn fork_child_alive_while_the_parent_allocates_more() {
    let dir = tmpdir("forklive");
    let p = compile("forklive", &dir, &[]);
    let prog = [p.to_str().unwrap(), &WSS_MIB.to_string()];
    let t0 = std::time::Instant::now();
    let (o, v) = uswap_run(LIMIT_MIB, &["--fault-mode", "thread"], &prog, &dir);
    let took = t0.elapsed();
    let expect = plain(&prog);
    assert!(o.status.success(), "{}\n{}", o.status, String::from_utf8_lossy(&o.stderr));
    assert_eq!(o.stdout, expect.stdout, "child or parent read different bytes");
    assert!(counter(&v, "pswpout") > 0, "{v}");
    assert_eq!(counter(&v, "limit_overrun_busy"), 0, "faults waited for pages shared with the child: {v}");
    assert!(counter(&v, "move_refused") > 0, "the parent's pages were never shared with the child? {v}");
    // ... and, refused, they were made exclusive again and went out (see `reclaim::cow`).
    assert!(counter(&v, "cow_broken") > 0, "{v}");
    assert!(took < Duration::from_secs(120), "took {took:?}: {v}");
}

/// With a device far smaller than the program's need, pages it cannot take stay resident over
/// the limit, said, and the program's allocations succeed as they would without uswap: the
/// heap was sized by the limit and the devices, and under `--device ram:2MiB` `malloc`
/// failed at 256 MiB (CPython's `MemoryError`) on a machine with gigabytes free.
#[test]
fn a_full_small_device_leaves_pages_resident_and_malloc_succeeds() {
    let dir = tmpdir("smalldevice");
    let prog = ["python3", "-c", "import os; b = bytearray(os.urandom(300 << 20)); print(len(b), sum(b[::4096]) > 0)"];
    let (o, v) = uswap_run(LIMIT_MIB, &["--device", "ram:2MiB"], &prog, &dir);
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "{}\n{stderr}", o.status);
    assert_eq!(String::from_utf8_lossy(&o.stdout), "314572800 True\n", "{stderr}");
    assert!(stderr.contains("the limit of 16MiB did not hold"), "{stderr}");
    assert!(counter(&v, "limit_overrun") > 0, "{v}");
}

/// A program held at the system's limit of mappings (`vm.max_map_count`) while uswap scans
/// its memory every second runs to its end with every byte kept, and the run says that
/// measurements of its unmanaged memory were given up: at that limit no allocation can map
/// new memory, and the scan's list of mappings (and its read of `/proc/self/maps` whole)
/// aborted the process ("memory allocation of 786432 bytes failed"; stress-ng's brk
/// stressor died so).
#[test]
fn a_program_at_the_limit_of_mappings_runs_and_the_scans_given_up_are_said() {
    let max: u64 =
        std::fs::read_to_string("/proc/sys/vm/max_map_count").ok().and_then(|s| s.trim().parse().ok()).unwrap_or(0);
    if max > 2_000_000 {
        return skipped(&format!("vm.max_map_count is {max}: the program would map {} GiB to reach it", max >> 17));
    }
    let dir = tmpdir("maplimit");
    let prog = compile("maplimit", &dir, &[]);
    let (o, _) = uswap_run(32, &[], &[prog.to_str().unwrap(), "64", "3"], &dir);
    let (stdout, stderr) = (String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr));
    assert!(o.status.success(), "{}\n{stdout}\n{stderr}", o.status);
    assert!(stdout.starts_with("ok ") && stdout.ends_with(" 1\n"), "{stdout}\n{stderr}");
    assert!(
        stderr.contains("of the anonymous memory uswap does not manage were given up, in 1 process(es)"),
        "{stderr}"
    );
    // Under --strict the limit is not shown to hold: the run fails, the program's work done.
    let (o, _) = uswap_run(32, &["--strict"], &[prog.to_str().unwrap(), "64", "3"], &dir);
    let (stdout, stderr) = (String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr));
    assert_eq!(o.status.code(), Some(2), "{stdout}\n{stderr}");
    assert!(stdout.starts_with("ok ") && stderr.contains("--strict: the limit is not shown to hold"), "{stderr}");
}

/// A process that ends out of descriptors cannot leave its last counters for the run's
/// summary: it says so, naming the directory and the reason, and the run still ends with the
/// program's status (the summary was short of them without a word before).
#[test]
fn a_process_ending_out_of_descriptors_says_its_counters_are_missing() {
    let dir = tmpdir("emfile");
    let script = "import os, resource\n\
                  b = bytearray(os.urandom(48 << 20))\n\
                  resource.setrlimit(resource.RLIMIT_NOFILE, (64, 64))\n\
                  fds = []\n\
                  try:\n    while True: fds.append(os.open('/dev/null', os.O_RDONLY))\n\
                  except OSError as e: print(e.errno)\n\
                  print(sum(b[::4096]) > 0)\n";
    let prog = ["python3", "-c", script];
    let (o, _) = uswap_run(LIMIT_MIB, &[], &prog, &dir);
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "{}\n{stderr}", o.status);
    assert_eq!(String::from_utf8_lossy(&o.stdout), format!("{}\nTrue\n", libc::EMFILE), "{stderr}");
    assert!(stderr.contains("cannot leave its counters in") && stderr.contains("os error 24"), "{stderr}");
}

/// Blocks larger than the heap's first arena (256 MiB), than mimalloc's default largest
/// arena object (2 GiB; a 3 GiB malloc used to fail) and than its largest arena (16 GiB;
/// a managed mapping of its own), through malloc, calloc, realloc both ways and free.
#[test]
fn blocks_larger_than_an_arena_allocate_as_with_glibc() {
    let dir = tmpdir("bigalloc");
    let p = compile("bigalloc", &dir, &[]);
    let prog = [p.to_str().unwrap(), &WSS_MIB.to_string()];
    let r = uswap_run(LIMIT_MIB, &[], &prog, &dir);
    assert_same_and_paged(&prog, &r, LIMIT_MIB);
}

/// fork without exec, and the child pages too: it gets a pager of its own (re-armed in the
/// fork's child handler), writes half of what it inherited (each first write a
/// write-protect fault that charges the page to it) and allocates and fills as much again;
/// both processes leave their counters, and both page. In both modes.
#[test]
fn fork_child_gets_a_pager_of_its_own_and_pages_too() {
    let dir = tmpdir("forkpage");
    let p = compile("forkpage", &dir, &[]);
    let prog = [p.to_str().unwrap(), &WSS_MIB.to_string()];
    let expect = plain(&prog);
    for mode in ["thread", "signal"] {
        let (o, v) = uswap_run(LIMIT_MIB, &["--fault-mode", mode], &prog, &dir);
        assert!(o.status.success(), "{mode}: {}\n{}", o.status, String::from_utf8_lossy(&o.stderr));
        assert_eq!(o.stdout, expect.stdout, "{mode}: child or parent read different bytes");
        assert_eq!(counter(&v, "processes"), 2, "{mode}: the child left no record of its own pager: {v}");
        // The child touched all it inherited: a page resident at the fork takes a
        // write-protect fault on its first write (unless the parent let go of it first: the
        // child then took it over, `shared_adopted`), one that was out is read from the
        // child's copy of the parent's pool (a major fault).
        let pages = (WSS_MIB << 20) / 4096;
        let touched = counter(&v, "pgfault_wp") + counter(&v, "shared_adopted") + counter(&v, "pswpin");
        assert!(touched >= pages, "{mode}: {v}");
        // Each process paged its working set of 4x the limit: more than one would alone.
        assert!(counter(&v, "pswpout") > 2 * (WSS_MIB << 20) / 4096, "{mode}: {v}");
        // Nothing came in for the fork: within the limit plus the parent's resident pages
        // the child shares (docs/cli.md, "fork"); the whole working set before.
        let peak = counter(&v, "resident_peak_bytes");
        assert!(peak <= ((2 * LIMIT_MIB) << 20) + SLACK_BYTES, "{mode}: peak {peak}: {v}");
    }
}

#[test]
fn sort_with_a_buffer_larger_than_the_limit() {
    let dir = tmpdir("sort");
    let input = dir.join("input.txt");
    {
        use std::io::Write;
        let mut f = std::io::BufWriter::new(std::fs::File::create(&input).unwrap());
        let mut x: u64 = 0x2545F4914F6CDD1D;
        // About 3x the limit of text, sorted in one in-memory buffer (-S) 4x the limit.
        for i in 0..((3 * LIMIT_MIB) << 20) / 28 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            writeln!(f, "{x:016x} {i:010}").unwrap();
        }
    }
    let s = format!("-S{}M", WSS_MIB);
    let prog = ["sort", s.as_str(), input.to_str().unwrap()];
    let r = uswap_run(LIMIT_MIB, &[], &prog, &dir);
    assert_same_and_paged(&prog, &r, LIMIT_MIB);
}

/// A virtual environment with numpy in it, made once per target directory (pip from PyPI).
fn numpy_python() -> PathBuf {
    let venv = Path::new(env!("CARGO_TARGET_TMPDIR")).join("numpy-venv");
    let py = venv.join("bin/python");
    let ok =
        |py: &Path| run_timed(Command::new(py).args(["-c", "import numpy"]), Duration::from_secs(60)).status.success();
    if py.is_file() && ok(&py) {
        return py;
    }
    let o = run_timed(Command::new("python3").args(["-m", "venv"]).arg(&venv), Duration::from_secs(120));
    assert!(o.status.success(), "python3 -m venv failed:\n{}", String::from_utf8_lossy(&o.stderr));
    let o = run_timed(
        Command::new(&py).args(["-m", "pip", "install", "--quiet", "--disable-pip-version-check", "numpy"]),
        Duration::from_secs(600),
    );
    assert!(o.status.success(), "pip install numpy failed:\n{}", String::from_utf8_lossy(&o.stderr));
    py
}

#[test]
fn python_numpy_sums_an_array_four_times_the_limit() {
    let dir = tmpdir("numpy");
    let py = numpy_python();
    let script = format!(
        "import numpy as np\n\
         a = np.arange({n}, dtype=np.int64)\n\
         a *= 3\n\
         print(int(a.sum()), int(a[::4096].sum()), int(a[-1]))\n",
        n = (WSS_MIB << 20) / 8
    );
    let prog = [py.to_str().unwrap(), "-c", script.as_str()];
    let r = uswap_run(LIMIT_MIB, &[], &prog, &dir);
    assert_same_and_paged(&prog, &r, LIMIT_MIB);
}

/// Python's multiprocessing pool (fork without exec): the workers hash the parent's data,
/// which they share with it copy-on-write, while the parent's threads go on faulting. This
/// stalled for minutes before a charge stopped waiting for pages shared with a child.
#[test]
fn python_multiprocessing_pool_hashes_data_four_times_the_limit() {
    let dir = tmpdir("mppool");
    let script = format!(
        "import hashlib, multiprocessing as mp\n\
         data = [bytes([i % 251]) * 65536 for i in range({n})]\n\
         def work(k):\n\
         \x20   h = hashlib.sha256()\n\
         \x20   for j in range(k, len(data), 4):\n\
         \x20       h.update(data[j])\n\
         \x20   return h.hexdigest()\n\
         if __name__ == '__main__':\n\
         \x20   with mp.get_context('fork').Pool(4) as p:\n\
         \x20       print(p.map(work, range(4)))\n",
        n = (WSS_MIB << 20) / 65536
    );
    let script_path = dir.join("mppool.py");
    std::fs::write(&script_path, script).unwrap();
    let prog = ["python3", script_path.to_str().unwrap()];
    let (o, v) = uswap_run(LIMIT_MIB, &["--fault-mode", "thread"], &prog, &dir);
    let expect = plain(&prog);
    assert!(o.status.success(), "{}\n{}", o.status, String::from_utf8_lossy(&o.stderr));
    assert_eq!(o.stdout, expect.stdout, "the workers hashed different bytes");
    assert!(counter(&v, "pswpout") > 0, "{v}");
    assert_eq!(counter(&v, "limit_overrun_busy"), 0, "faults waited for pages shared with the workers: {v}");
}

#[test]
fn exit_status_is_the_programs() {
    let dir = tmpdir("status");
    let (o, _) = uswap_run(LIMIT_MIB, &[], &["sh", "-c", "exit 7"], &dir);
    assert_eq!(o.status.code(), Some(7));
    let (o, _) = uswap_run(LIMIT_MIB, &[], &["sh", "-c", "kill -TERM $$"], &dir);
    assert_eq!(o.status.code(), Some(128 + libc::SIGTERM));
    // Children forked and exec'd by a shell are managed and counted: with a pager from the
    // start, the shell and the two programs it forks and execs each leave their counters
    // (the shell ends with _exit); waiting for a pager they need (the default), none does.
    let ls = ["sh", "-c", "ls / > /dev/null; ls / > /dev/null; exit 0"];
    let (o, v) = uswap_run(LIMIT_MIB, &["--start-after", "0"], &ls, &dir);
    assert!(o.status.success());
    assert_eq!(counter(&v, "processes"), 3, "{v}");
    // (Under 256 MiB, whose `--start-after` is 16 MiB; `ls` commits about 1 MiB of heap.)
    let (o, v) = uswap_run(256, &[], &ls, &dir);
    assert!(o.status.success());
    assert_eq!(counter(&v, "processes"), 0, "no process of a shell running ls needs a pager: {v}");
}

/// A set-user-ID program as the command, whose set-ID changes the user: the loader ignores
/// `LD_PRELOAD` for it, and it ran outside the budget with nothing said, `--strict` passing.
/// Refused as a static program is (root can give a copy of a program to another owner).
fn refused_when_set_user_id(dir: &Path) {
    use std::os::unix::fs::PermissionsExt;
    // SAFETY: geteuid only reads the process's credentials.
    if unsafe { libc::geteuid() } != 0 {
        return skipped("a set-user-ID program of another owner needs root to make");
    }
    let suid = dir.join("suid-true");
    std::fs::copy("/bin/true", &suid).unwrap();
    std::os::unix::fs::chown(&suid, Some(65534), None).unwrap();
    std::fs::set_permissions(&suid, std::fs::Permissions::from_mode(0o4755)).unwrap();
    let path = std::ffi::CString::new(dir.to_str().unwrap()).unwrap();
    // SAFETY: plain data, filled by statvfs for a NUL-terminated path.
    let mut fs: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: as above.
    if unsafe { libc::statvfs(path.as_ptr(), &mut fs) } == 0 && fs.f_flag & libc::ST_NOSUID != 0 {
        // The set-ID bit does nothing there, and the program is managed as any.
        return skipped(&format!("{} lies on a nosuid mount", dir.display()));
    }
    let (o, _) = uswap_run(LIMIT_MIB, &["--strict"], &[suid.to_str().unwrap()], dir);
    let e = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(2), "{e}");
    assert!(e.contains("set-user-ID") && e.lines().count() == 1, "{e}");
}

#[test]
fn programs_that_cannot_be_run_or_managed_are_refused_with_their_status() {
    let dir = tmpdir("refuse");
    // As `env` and `timeout`: 127 for a command not found.
    let (o, _) = uswap_run(LIMIT_MIB, &[], &["no-such-program-uswap"], &dir);
    assert_eq!(o.status.code(), Some(127));
    assert!(String::from_utf8_lossy(&o.stderr).contains("not found"), "{}", String::from_utf8_lossy(&o.stderr));
    let stat = compile("grow", &dir, &["-static"]);
    let (o, _) = uswap_run(LIMIT_MIB, &[], &[stat.to_str().unwrap(), "1"], &dir);
    let e = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(2), "{e}");
    assert!(e.contains("statically linked"), "{e}");
    refused_when_set_user_id(&dir);
    use std::os::unix::fs::PermissionsExt;
    let foreign = dir.join("foreign-elf");
    std::fs::write(&foreign, b"\x7fELF\x01\x01\x01").unwrap();
    std::fs::set_permissions(&foreign, std::fs::Permissions::from_mode(0o755)).unwrap();
    // An ELF this machine cannot run: 126, as `env` and `timeout` for a file they cannot
    // execute.
    let (o, _) = uswap_run(LIMIT_MIB, &[], &[foreign.to_str().unwrap()], &dir);
    assert_eq!(o.status.code(), Some(126), "{}", String::from_utf8_lossy(&o.stderr));
    // Text without `#!`: run by /bin/sh, as execvp (env, timeout) runs it, managed.
    let text = dir.join("no-hashbang");
    std::fs::write(&text, "echo \"from sh: $0 $1\"; exit 7\n").unwrap();
    std::fs::set_permissions(&text, std::fs::Permissions::from_mode(0o755)).unwrap();
    let (o, _) = uswap_run(LIMIT_MIB, &[], &[text.to_str().unwrap(), "arg"], &dir);
    assert_eq!(o.status.code(), Some(7), "{}", String::from_utf8_lossy(&o.stderr));
    assert_eq!(String::from_utf8_lossy(&o.stdout), format!("from sh: {} arg\n", text.display()));
}

// ---------------------------------------------------------------------------------------
// `uswap bench --command`: the same program under several engines, timed and compared.
// ---------------------------------------------------------------------------------------

fn bench_command(args: &[&str], dir: &Path) -> (Output, Vec<Value>) {
    let json = dir.join("bench.json");
    let _ = std::fs::remove_file(&json);
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_uswap"));
    cmd.env("USWAP_PRELOAD_LIB", preload()).arg("bench").args(args).arg("--json").arg(&json);
    let out = run_timed(&mut cmd, Duration::from_secs(540));
    let v = std::fs::read(&json)
        .ok()
        .and_then(|b| serde_json::from_slice::<Value>(&b).ok())
        .and_then(|v| v.as_array().cloned())
        .unwrap_or_default();
    (out, v)
}

#[test]
fn bench_command_times_one_program_under_every_engine() {
    let dir = tmpdir("bench-command");
    let p = compile("seqstream", &dir, &[]);
    let program = [p.to_str().unwrap(), &WSS_MIB.to_string(), "1"];
    let expect = plain(&program).stdout;
    let mut engines = vec!["uswap-thread", "uswap-signal", "ram"];
    match kernel_unavailable() {
        None => engines.extend(["kernel-zram", "kernel-file"]),
        Some(why) => {
            skipped(&format!("the kernel engines (they need root, zram, a memory controller, swap off): {why}"))
        }
    }
    let list = engines.join(",");
    let command = format!("{} {} 1", p.display(), WSS_MIB);
    let limit = format!("{LIMIT_MIB}MiB");
    let (out, all) = bench_command(
        &["--command", &command, "--engines", &list, "--limit", &limit, "--runs", "2", "--wait-lock"],
        &dir,
    );
    let (o, e) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "{}\n{o}\n{e}", out.status);
    assert!(o.contains(&format!("the same {} bytes under every engine and run", expect.len())), "{o}");
    assert_eq!(all.len(), engines.len(), "one object per engine: {all:?}");
    let zram = engines.contains(&"kernel-zram");
    for (v, name) in all.iter().zip(&engines) {
        assert_eq!(v["engine"], *name, "{v}");
        assert!(o.lines().any(|l| l.starts_with(name)), "a row for {name}: {o}");
        assert_eq!(v["runs"], 2, "{v}");
        let walls = v["runs_wall_seconds"].as_array().unwrap();
        assert_eq!(walls.len(), 2, "{v}");
        assert!(walls.iter().all(|w| w.as_f64().unwrap() > 0.0), "{v}");
        let median = v["wall_seconds"].as_f64().unwrap();
        let (a, b) = (walls[0].as_f64().unwrap(), walls[1].as_f64().unwrap());
        assert!((median - (a + b) / 2.0).abs() < 1e-9, "the median of two runs is their mean: {v}");
        assert_eq!(v["stdout_identical"], true, "{v}");
        assert_eq!(v["stdout_bytes"], expect.len() as u64, "{v}");
        assert!(v["rss_peak_bytes"].as_u64().unwrap() > 0, "{v}");
        assert_eq!(v["speed_vs_baseline"].is_f64(), zram, "ratios only against kernel-zram: {v}");
        let charged = v["charged_peak_bytes"].as_u64();
        if name.starts_with("uswap-") {
            assert_eq!(v["device"], "zpool", "the default device of a command bench: {v}");
            assert!(v["pswpout"].as_u64().unwrap() > 0, "{name} paged: {v}");
            assert!(v["pgmajfault"].is_u64(), "{v}");
            let peak = charged.unwrap();
            assert!(peak > 0 && peak <= (LIMIT_MIB << 20) + SLACK_BYTES, "{name} within the limit: {v}");
        } else if name.starts_with("kernel-") {
            assert!(v["pswpout"].as_u64().unwrap() > 0, "{name} swapped: {v}");
            assert!(charged.unwrap() <= LIMIT_MIB << 20, "the cgroup's peak within its limit: {v}");
            assert_eq!(v["limit_bytes"], LIMIT_MIB << 20);
        } else {
            assert!(v["pswpout"].is_null() && v["limit_bytes"].is_null() && charged.is_none(), "{v}");
            assert!(v["rss_peak_bytes"].as_u64().unwrap() >= WSS_MIB << 20, "ram holds it all: {v}");
        }
    }
    if zram {
        let z = all.iter().find(|v| v["engine"] == "kernel-zram").unwrap();
        assert_eq!(z["speed_vs_baseline"], 1.0, "{z}");
        assert_eq!(z["device"], "/dev/zram0 (lz4)");
        // zram's own memory, which its cgroup does not charge: compressed pages at least.
        let zram_peak = z["swap_device_peak_bytes"].as_u64().unwrap_or(0);
        assert!(zram_peak > 0 && zram_peak < WSS_MIB << 20, "{z}");
        // uswap's compressed pool, counted beside the limit as zram is; a swap file and the
        // plain run take none.
        for v in all.iter().filter(|v| v["engine"] != "kernel-zram") {
            let uswap = v["engine"].as_str().is_some_and(|e| e.starts_with("uswap"));
            assert_eq!(v["swap_device_peak_bytes"].as_u64().is_some_and(|b| b > 0), uswap, "{v}");
        }
        assert!(o.contains("×zram") && o.contains("device peak"), "{o}");
        let swaps = std::fs::read_to_string("/proc/swaps").unwrap();
        assert_eq!(swaps.lines().count(), 1, "swap left on: {swaps}");
        assert_eq!(std::fs::read_to_string("/sys/block/zram0/disksize").unwrap().trim(), "0", "zram0 not reset");
    }
}

#[test]
fn bench_command_reports_output_that_differs_between_engines() {
    let dir = tmpdir("bench-differs");
    // The shell's pid is new in every run: the bench must stop and name the engines.
    let (out, all) = bench_command(&["--command", "sh -c 'echo pid $$'", "--engines", "ram,uswap-thread"], &dir);
    let e = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(3), "{e}");
    assert!(e.contains("the program's output differs between ram 1/1 and uswap-thread 1/1"), "{e}");
    assert!(e.contains("line 1 is \"pid "), "where it differs: {e}");
    assert!(all.is_empty(), "no results written for a run that failed: {all:?}");
}

/// An engine under which the program fails is reported and left out; the others are still
/// compared, and the exit status (2) says that one failed.
#[test]
fn bench_command_goes_on_without_an_engine_whose_program_fails() {
    let dir = tmpdir("bench-goon");
    let cmd = r#"sh -c '[ "$USWAP_FAULT_MODE" = signal ] && { echo failing on purpose >&2; exit 9; }; echo same'"#;
    let (out, json) =
        bench_command(&["--command", cmd, "--engines", "ram,uswap-signal,uswap-thread", "--runs", "2"], &dir);
    let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert_eq!(out.status.code(), Some(2), "{stdout}\n{stderr}");
    let rows: Vec<&str> = stdout.lines().filter(|l| l.starts_with("ram ") || l.starts_with("uswap-")).collect();
    assert_eq!(rows.len(), 2, "ram and uswap-thread in the table, not uswap-signal:\n{stdout}");
    assert!(rows[1].starts_with("uswap-thread "), "{stdout}");
    assert!(stdout.contains("failed, so not in the table (why: on stderr): uswap-signal"), "{stdout}");
    assert!(stderr.contains("engine uswap-signal: the program exited with status 9"), "{stderr}");
    assert!(stderr.contains("failing on purpose"), "its last words: {stderr}");
    assert_eq!(stderr.matches("uswap-signal 2/2").count(), 0, "a failed engine is not run again: {stderr}");
    let engines: Vec<&str> = json.iter().filter_map(|r| r["engine"].as_str()).collect();
    assert_eq!(engines, ["ram", "uswap-thread"], "--json has the engines that ran");
}

#[test]
fn bench_command_refuses_what_it_cannot_run() {
    let dir = tmpdir("bench-refuse");
    let cases: [(&[&str], &str); 7] = [
        (&["--command", "sort 'unclosed"], "--command \"sort 'unclosed\""),
        (&["--command", "  "], "names no program"),
        (&["--command", "no-such-program-uswap", "--engines", "ram"], "not found"),
        (&["--command", "true", "--engines", "uswap-signal/ra-off"], "no readahead switch"),
        // Flags of the workload, taken and ignored before.
        (&["--command", "true", "--engines", "uswap-signal", "--readahead", "off"], "--readahead shapes"),
        (&["--command", "true", "--engines", "ram", "--handler-threads", "3"], "--handler-threads shapes"),
        (&["--command", "sh -c 'exit 5'", "--engines", "ram"], "the program exited with status 5"),
    ];
    for (args, want) in cases {
        let (out, _) = bench_command(args, &dir);
        let e = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {e}");
        assert!(e.contains(want), "{args:?}: {e}");
    }
    // Without root the kernel engines are refused as the workload benches refuse them.
    // SAFETY: geteuid cannot fail.
    if unsafe { libc::geteuid() } != 0 {
        let (out, _) = bench_command(&["--command", "true", "--engines", "kernel-zram,ram"], &dir);
        let e = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{e}");
        assert!(e.contains("kernel engines (kernel-zram) need root") && e.contains("sudo"), "{e}");
        return;
    }
    if !Path::new("/usr/bin/setpriv").is_file() {
        skipped("the not-root case: no /usr/bin/setpriv to run the binary as nobody");
        return;
    }
    let o = run_timed(
        Command::new("/usr/bin/setpriv")
            .args(["--reuid=65534", "--regid=65534", "--clear-groups"])
            .arg(common::uswap_for_nobody())
            .args(["bench", "--command", "true", "--engines", "kernel-zram,ram"]),
        Duration::from_secs(60),
    );
    let e = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(2), "{e}");
    assert!(e.contains("kernel engines (kernel-zram) need root") && e.contains("sudo"), "{e}");
}

/// Pids of processes whose command line is exactly `argv`.
fn pids_running(argv: &[&str]) -> Vec<u32> {
    let want: Vec<u8> = argv.iter().flat_map(|a| a.bytes().chain([0])).collect();
    std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| std::fs::read(format!("/proc/{pid}/cmdline")).is_ok_and(|c| c == want))
        .collect()
}

#[test]
fn bench_command_interrupted_kills_the_program_and_cleans_up() {
    use std::io::Read;
    let mut engines = vec!["ram"];
    match kernel_unavailable() {
        None => engines.push("kernel-zram"),
        Some(why) => skipped(&format!("the kernel engine (it needs root, zram, a memory controller, swap off): {why}")),
    }
    // A sleep no one else runs, so that finding it finds ours.
    let secs = format!("{}.{}", 300, std::process::id());
    for engine in engines {
        let mut child = Command::new(env!("CARGO_BIN_EXE_uswap"))
            .args(["bench", "--command", &format!("sleep {secs}"), "--engines", engine, "--wait-lock"])
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let deadline = Instant::now() + Duration::from_secs(60);
        while pids_running(&["sleep", &secs]).is_empty() {
            assert!(Instant::now() < deadline, "{engine}: the program never started");
            assert!(child.try_wait().unwrap().is_none(), "{engine}: the bench ended before its program started");
            std::thread::sleep(Duration::from_millis(20));
        }
        // SAFETY: kill(2) on our own child.
        unsafe { libc::kill(child.id() as i32, libc::SIGINT) };
        let deadline = Instant::now() + Duration::from_secs(60);
        let status = loop {
            if let Some(st) = child.try_wait().unwrap() {
                break st;
            }
            if Instant::now() >= deadline {
                child.kill().unwrap();
                child.wait().unwrap();
                panic!("{engine}: the bench did not stop within 60 s of SIGINT");
            }
            std::thread::sleep(Duration::from_millis(20));
        };
        let mut err = String::new();
        child.stderr.take().unwrap().read_to_string(&mut err).unwrap();
        assert_eq!(status.code(), Some(130), "{engine}: {err}");
        assert!(err.contains("interrupted; everything it had set up is cleaned up"), "{engine}: {err}");
        assert_eq!(pids_running(&["sleep", &secs]), Vec::<u32>::new(), "{engine}: the program outlived the bench");
        if engine.starts_with("kernel-") {
            let swaps = std::fs::read_to_string("/proc/swaps").unwrap();
            assert_eq!(swaps.lines().count(), 1, "swap left on: {swaps}");
        }
    }
}

/// The number of keys of the Redis server at `addr` (`DBSIZE` as an inline command; the
/// answer is `:N`).
fn dbsize(addr: &str) -> u64 {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    s.write_all(b"DBSIZE\r\n").unwrap();
    let mut buf = [0u8; 64];
    let n = s.read(&mut buf).unwrap();
    let answer = String::from_utf8_lossy(&buf[..n]).to_string();
    answer.trim().strip_prefix(':').and_then(|v| v.parse().ok()).unwrap_or_else(|| panic!("DBSIZE: {answer:?}"))
}

/// A program paging to a Redis store (a real `redis-server` on 127.0.0.1): same output as
/// without uswap, in both fault modes, and once it has ended none of its keys are left in
/// the store (its processes exit without dropping their pagers; `uswap run` deletes the
/// run's session). The same for three fork children reading a working set 4x the limit
/// from the parent's keys while the parent rewrites it: the fork brings nothing back in.
/// And for a daemon-style program that closes every descriptor above 2: the device's
/// connections are the engine's descriptors and survive (before, the closed sockets'
/// numbers were reused and the device read replies that were not its own: "the primary
/// refused a request: ... Parse error", "lost the primary").
#[test]
fn a_program_pages_to_redis_and_leaves_no_key_behind() {
    use uswap::backend::redis::{redis_server_available, LocalRedis};
    if !redis_server_available() {
        skipped("redis-server is not installed (apt-get install redis-server)");
        return;
    }
    let redis = LocalRedis::start(1, 0, &[]).expect("a local redis-server starts");
    let dir = tmpdir("redis");
    let p = compile("threads", &dir, &[]);
    let prog = [p.to_str().unwrap(), &WSS_MIB.to_string(), "4"];
    let device = format!("{}?size=256MiB", redis.url(0));
    let keys = || dbsize(&redis.addr(0));
    for mode in ["thread", "signal"] {
        let r = uswap_run(LIMIT_MIB, &["--fault-mode", mode, "--device", &device], &prog, &dir);
        assert_same_and_paged(&prog, &r, LIMIT_MIB);
        assert_eq!(counter(&r.1, "fault_error"), 0, "{}", r.1);
        assert_eq!(keys(), 0, "{mode}: the run's keys were deleted after it");
    }
    let p = compile("forkreaders", &dir, &[]);
    let prog = [p.to_str().unwrap(), &WSS_MIB.to_string(), "3"];
    let expect = plain(&prog);
    for mode in ["thread", "signal"] {
        let (o, v) = uswap_run(LIMIT_MIB, &["--fault-mode", mode, "--device", &device], &prog, &dir);
        assert!(o.status.success(), "{mode}: {}\n{}", o.status, String::from_utf8_lossy(&o.stderr));
        assert_eq!(o.stdout, expect.stdout, "{mode}: a child or the parent read different bytes");
        assert_eq!(counter(&v, "processes"), 4, "{mode}: {v}");
        // 26 MiB alone; up to 41.7 MiB with two more runs of this test on the 2 vCPUs (the
        // session-start build of 2026-11-26 too): pages the children share copy-on-write
        // cannot be moved out (`move_refused`), and a starved background reclaimer lets
        // the rest pile up to the limit. 4.1x the limit when each fork brought it all in.
        let peak = counter(&v, "resident_peak_bytes");
        assert!(peak <= ((3 * LIMIT_MIB) << 20) + SLACK_BYTES, "{mode}: peak {peak}: {v}");
        assert_eq!(counter(&v, "fault_error"), 0, "{mode}: {v}");
        assert_eq!(keys(), 0, "{mode}: the run's keys were deleted after it");
    }
    let p = compile("daemon", &dir, &[]);
    for mode in ["thread", "signal"] {
        for how in ["close_range", "close_loop"] {
            let prog = [p.to_str().unwrap(), &WSS_MIB.to_string(), how];
            let r = uswap_run(LIMIT_MIB, &["--fault-mode", mode, "--device", &device], &prog, &dir);
            assert_same_and_paged(&prog, &r, LIMIT_MIB);
            let stderr = String::from_utf8_lossy(&r.0.stderr);
            assert!(!stderr.contains("refused") && !stderr.contains("lost the primary"), "{mode} {how}: {stderr}");
            assert_eq!(keys(), 0, "{mode} {how}: the run's keys were deleted after it");
        }
    }
}

/// A daemon-style program closes (or `dup2`s `/dev/null` over) every descriptor above 2 at
/// start, in each of the ways programs do, then allocates 4x the limit: the pager's
/// descriptors survive, so the budget holds and every byte comes back. Before, thread mode
/// ran to the end with nothing paged (the closed userfaultfd had unregistered the heap) and
/// signal mode died of SIGBUS.
#[test]
fn daemons_that_close_every_descriptor_keep_their_budget() {
    let dir = tmpdir("daemon");
    let p = compile("daemon", &dir, &[]);
    for mode in ["thread", "signal"] {
        for how in ["close_range", "closefrom", "close_loop", "dup2", "syscall"] {
            let prog = [p.to_str().unwrap(), &WSS_MIB.to_string(), how];
            let r = uswap_run(LIMIT_MIB, &["--fault-mode", mode], &prog, &dir);
            assert_same_and_paged(&prog, &r, LIMIT_MIB);
            assert_eq!(counter(&r.1, "processes"), 1, "{mode} {how}: {}", r.1);
        }
    }
}

/// What runtimes do with reserved address space (tests/programs/reserve.c): a `PROT_NONE`
/// reservation committed by `mmap(MAP_FIXED)` and by `mprotect`, uncommitted and
/// recommitted (zeros), `mremap(MREMAP_FIXED)` onto it and `MREMAP_DONTUNMAP`, and a
/// swapped-out mapping made executable (its pages put back, then let go of), every byte
/// checked by the program, all of it managed (4x the limit paged).
#[test]
fn reservations_commits_and_mremap_behave_as_without_uswap() {
    let dir = tmpdir("reserve");
    let p = compile("reserve", &dir, &[]);
    let prog = [p.to_str().unwrap(), &(2 * LIMIT_MIB).to_string()];
    for mode in ["thread", "signal"] {
        let r = uswap_run(LIMIT_MIB, &["--fault-mode", mode], &prog, &dir);
        assert_same_and_paged(&prog, &r, LIMIT_MIB);
        assert!(counter(&r.1, "pswpout") > ((2 * LIMIT_MIB) << 20) / 4096, "{mode}: {}", r.1);
    }
}

/// Fault-around stops where a mapping ends: a write stream up to a runtime's `PROT_NONE`
/// reservation filled 31 pages of it (the kernel's fill ioctls do not look at the
/// protection), charged pages no move could take out (`UFFDIO_MOVE` needs equal protections),
/// in both modes. Now none of it is present, and no move is refused.
#[test]
fn fault_around_stops_at_a_prot_none_reservation() {
    run_in_both_modes("protedge", 2 * LIMIT_MIB, |mode, _, r| {
        let out = String::from_utf8_lossy(&r.0.stdout);
        assert!(
            r.0.status.success() && out.ends_with("ok\n"),
            "{mode}: {out}\n{}",
            String::from_utf8_lossy(&r.0.stderr)
        );
        assert!(out.contains("present in the PROT_NONE half: 0\n"), "{mode}: {out}");
        assert!(counter(&r.1, "pswpout") > 0, "{mode}: the written half was paged: {}", r.1);
        assert_eq!(counter(&r.1, "move_refused"), 0, "{mode}: {}", r.1);
    });
}

/// Whether `tool` runs here. Missing, it fails the test in CI (`.ci/run` installs it) and
/// says SKIPPED elsewhere.
fn have(tool: &str, why: &str) -> bool {
    let found = Command::new(tool).arg("--version").stdout(Stdio::null()).stderr(Stdio::null()).status().is_ok();
    if !found {
        assert!(std::env::var_os("CI").is_none(), "{tool} is missing in CI: .ci/run installs it ({why})");
        skipped(&format!("{tool} is not installed ({why})"));
    }
    found
}

/// The program's largest resident set as the kernel measured it (`rss_peak_bytes`,
/// `getrusage` of `uswap run`'s children): text, file mappings and all.
fn rss_peak(v: &Value) -> u64 {
    counter(v, "rss_peak_bytes")
}

/// Runs `prog` with a working set 4x the limit under `uswap run` on a file device (so that
/// swapped pages are not in the process, as the compressed pool would be) and checks it as
/// [`assert_same_and_paged`] does, and its peak RSS from outside: within the limit plus what
/// the same program keeps with almost no data (`small`, its code, file mappings and the
/// memory uswap does not manage), plus 32 MiB of margin for the runtime's own growth.
fn assert_runtime_paged(prog: &[&str], small: &[&str], dir: &Path, limit_mib: u64) {
    let device = format!("file:{}:1GiB", dir.display());
    let opts = ["--device", device.as_str()];
    let base = uswap_run(limit_mib, &opts, small, dir);
    assert!(base.0.status.success(), "{small:?}: {}\n{}", base.0.status, String::from_utf8_lossy(&base.0.stderr));
    let r = uswap_run(limit_mib, &opts, prog, dir);
    assert_same_and_paged(prog, &r, limit_mib);
    let (peak, base_peak) = (rss_peak(&r.1), rss_peak(&base.1));
    assert!(
        peak <= (limit_mib << 20) + base_peak + (32 << 20),
        "{prog:?}: peak RSS {peak} over the limit plus the runtime's own {base_peak}: {}",
        r.1
    );
}

/// HotSpot reserves its heap with `mmap(PROT_NONE)` and commits it with `mmap(MAP_FIXED)`;
/// before reservations were managed, a heap 5x the limit ran entirely in RAM. G1 and
/// Parallel, with and without `-XX:+AlwaysPreTouch`, Serial and Shenandoah are paged. ZGC's
/// heap is a memfd mapped at several addresses, shared memory that uswap does not page:
/// the run names it, with its size, as outside the limit.
#[test]
fn java_heap_is_paged_under_its_collectors() {
    if !have("javac", "Debian: apt-get install openjdk-17-jdk-headless") {
        return;
    }
    let dir = tmpdir("java");
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/programs/Heap.java");
    let o = run_timed(Command::new("javac").arg("-d").arg(&dir).arg(&src), Duration::from_secs(120));
    assert!(o.status.success(), "javac failed:\n{}", String::from_utf8_lossy(&o.stderr));
    let cp = dir.to_str().unwrap();
    let limit_mib = 64;
    let data = (4 * limit_mib).to_string();
    let java = |gc: &str, touch: &str, mib: &str| {
        ["java", "-Xmx640m", "-Xms320m", gc, touch, "-cp", cp, "Heap", mib].map(String::from)
    };
    let runs = [
        ("-XX:+UseG1GC", "-XX:-AlwaysPreTouch"),
        ("-XX:+UseG1GC", "-XX:+AlwaysPreTouch"),
        ("-XX:+UseParallelGC", "-XX:-AlwaysPreTouch"),
        ("-XX:+UseParallelGC", "-XX:+AlwaysPreTouch"),
        ("-XX:+UseSerialGC", "-XX:-AlwaysPreTouch"),
        ("-XX:+UseShenandoahGC", "-XX:-AlwaysPreTouch"),
    ];
    for (gc, touch) in runs {
        let (prog, small) = (java(gc, touch, &data), java(gc, touch, "1"));
        let prog: Vec<&str> = prog.iter().map(String::as_str).collect();
        let small: Vec<&str> = small.iter().map(String::as_str).collect();
        assert_runtime_paged(&prog, &small, &dir, limit_mib);
    }
    let prog = java("-XX:+UseZGC", "-XX:-AlwaysPreTouch", &data);
    let prog: Vec<&str> = prog.iter().map(String::as_str).collect();
    let expect = plain(&prog).stdout;
    let (o, v) = uswap_run(limit_mib, &[], &prog, &dir);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "ZGC: {}: {err}", o.status);
    assert_eq!(o.stdout, expect, "ZGC: {err}");
    assert!(
        err.contains("does not hold for") && err.contains("shared memory (MAP_SHARED"),
        "ZGC's heap not named: {err}"
    );
    assert!(counter(&v, "unmanaged_peak_bytes") > (limit_mib << 20), "ZGC's heap not counted: {v}");
}

/// V8 reserves a cage for its heap and commits pages in it with `mprotect`; Buffers live
/// outside it. Both are paged.
#[test]
fn node_heap_and_buffers_are_paged() {
    if !have("node", "Debian: apt-get install nodejs") {
        return;
    }
    let dir = tmpdir("node");
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/programs/heap.js");
    let limit_mib = 64;
    let data = (2 * limit_mib).to_string();
    let prog = ["node", "--max-old-space-size=2048", script.to_str().unwrap(), data.as_str()];
    let small = ["node", "--max-old-space-size=2048", script.to_str().unwrap(), "1"];
    assert_runtime_paged(&prog, &small, &dir, limit_mib);
}

/// V8 makes each 256 KiB page of its heap a mapping of its own (reserved `PROT_NONE`,
/// advised `MADV_DONTFORK`, trimmed, made read-write): Node.js 20 with two worker threads had
/// some 10,000 at once. Past 4,000 a process's mappings stayed ordinary memory, outside the
/// limit (1.4 GiB over a 256 MiB one), and their fork advice filled uswap's table ("more
/// than 4096 ranges"). Now 6,000 such mappings are managed and paged, every byte reads back,
/// the fork child (which has none of them) runs, and no table is said to be full.
#[test]
fn thousands_of_small_mappings_as_v8_makes_them_are_managed() {
    let dir = tmpdir("v8pages");
    let p = compile("v8pages", &dir, &[]);
    let prog = [p.to_str().unwrap(), "6000", "16"];
    for mode in ["signal", "thread"] {
        let (o, v) = uswap_run(LIMIT_MIB, &["--fault-mode", mode, "--min-size", "32KiB"], &prog, &dir);
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(o.status.success(), "{mode}: {} {err}", o.status);
        assert_eq!(String::from_utf8_lossy(&o.stdout), "ok 6000\n", "{mode}: {err}");
        let complaints = ["managed mappings", "ranges of managed memory", "runs unmanaged"];
        assert!(!complaints.iter().any(|c| err.contains(c)), "{mode}: {err}");
        assert_eq!(counter(&v, "mmap_unmanaged"), 0, "{mode}: {v}");
        assert!(counter(&v, "pswpout") > 0, "{mode}: the pages were not paged: {v}");
    }
}

/// Shared anonymous memory is not paged (docs/cli.md: userfaultfd's shmem support is not used):
/// it is measured as unmanaged, and a tree whose unmanaged memory passes 10 % of the limit
/// is told so on exit, naming the mapping and why; `--strict` ends it with status 2 as soon
/// as it is measured, without waiting for the program.
#[test]
fn unmanaged_memory_is_reported_and_strict_fails_early() {
    let dir = tmpdir("shared");
    let p = compile("shared", &dir, &[]);
    let data = WSS_MIB.to_string();
    let prog = [p.to_str().unwrap(), data.as_str(), "1"];
    let (o, v) = uswap_run(LIMIT_MIB, &[], &prog, &dir);
    assert!(o.status.success(), "{}\n{}", o.status, String::from_utf8_lossy(&o.stderr));
    assert_eq!(String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&plain(&prog).stdout));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("does not hold") && err.contains("shared memory"), "no report on stderr:\n{err}");
    assert!(counter(&v, "unmanaged_peak_bytes") >= WSS_MIB << 20, "{v}");
    // Mapped by four processes, each with all of it resident, it is still one copy in
    // memory: counted once (four times before, as PostgreSQL's shared buffers were, once
    // per backend), and named once.
    let readers = [p.to_str().unwrap(), data.as_str(), "3", "3"];
    let (o, v) = uswap_run(LIMIT_MIB, &[], &readers, &dir);
    assert!(o.status.success(), "{}\n{}", o.status, String::from_utf8_lossy(&o.stderr));
    assert_eq!(String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&plain(&prog).stdout));
    let peak = counter(&v, "unmanaged_peak_bytes");
    let one_copy = WSS_MIB << 20;
    assert!((one_copy..one_copy * 3 / 2).contains(&peak), "the shared object counted {peak} bytes: {v}");
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(err.matches("shared memory (MAP_SHARED").count(), 1, "named more than once:\n{err}");
    let slow = [p.to_str().unwrap(), data.as_str(), "60"];
    let t0 = Instant::now();
    let (o, _) = uswap_run(LIMIT_MIB, &["--strict"], &slow, &dir);
    assert_eq!(o.status.code(), Some(2), "--strict: {}\n{}", o.status, String::from_utf8_lossy(&o.stderr));
    assert!(t0.elapsed() < Duration::from_secs(20), "--strict waited {:?} for the program", t0.elapsed());
    assert!(String::from_utf8_lossy(&o.stderr).contains("--strict"), "{}", String::from_utf8_lossy(&o.stderr));
}

/// A program whose memory is all managed reports next to no unmanaged memory (uswap's own
/// memory is not counted as the program's), and `--strict` lets it finish.
#[test]
fn managed_programs_report_little_unmanaged_memory_and_pass_strict() {
    let dir = tmpdir("strictok");
    let p = compile("daemon", &dir, &[]);
    let prog = [p.to_str().unwrap(), &WSS_MIB.to_string(), "close_range"];
    let r = uswap_run(LIMIT_MIB, &["--strict"], &prog, &dir);
    assert_same_and_paged(&prog, &r, LIMIT_MIB);
    let unmanaged = counter(&r.1, "unmanaged_peak_bytes");
    assert!(unmanaged < (LIMIT_MIB << 20) / 10, "unmanaged peak {unmanaged}: {}", r.1);
}

/// A `newc` cpio archive (what the kernel unpacks as an initramfs) holding `/init` (the
/// file at `init`, executable) and an empty `/proc`.
fn initramfs(init: &Path, out: &Path) {
    fn entry(buf: &mut Vec<u8>, ino: u32, name: &str, mode: u32, data: &[u8]) {
        let fields = [ino, mode, 0, 0, 1, 0, data.len() as u32, 0, 0, 0, 0, name.len() as u32 + 1, 0];
        buf.extend_from_slice(b"070701");
        for f in fields {
            buf.extend_from_slice(format!("{f:08x}").as_bytes());
        }
        buf.extend_from_slice(name.as_bytes());
        buf.push(0);
        buf.resize(buf.len().next_multiple_of(4), 0);
        buf.extend_from_slice(data);
        buf.resize(buf.len().next_multiple_of(4), 0);
    }
    let mut buf = Vec::new();
    entry(&mut buf, 1, "init", 0o100755, &std::fs::read(init).unwrap());
    entry(&mut buf, 2, "proc", 0o040755, &[]);
    entry(&mut buf, 0, "TRAILER!!!", 0, &[]);
    std::fs::write(out, buf).unwrap();
}

/// QEMU with TCG boots Debian's kernel with a small initramfs the test builds, whose
/// `/init` (tests/programs/guestmem.c) writes and verifies 4x the limit in the guest. QEMU
/// reserves guest RAM and maps it `MAP_FIXED` inside the reservation: before reservations
/// were managed it ran entirely in RAM. Thread mode: QEMU reads its firmware into guest RAM
/// with `read(2)`, which signal mode cannot serve on a page that is not resident.
#[test]
fn qemu_guest_ram_is_paged() {
    if !have("qemu-system-x86_64", "Debian: apt-get install qemu-system-x86") {
        return;
    }
    let mut kernels: Vec<PathBuf> = std::fs::read_dir("/boot")
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.file_name().is_some_and(|n| n.to_string_lossy().starts_with("vmlinuz-")))
        .filter(|p| std::fs::File::open(p).is_ok())
        .collect();
    kernels.sort();
    let Some(kernel) = kernels.pop() else {
        assert!(
            std::env::var_os("CI").is_none(),
            "no readable /boot/vmlinuz-* in CI: .ci/run installs linux-image-amd64"
        );
        skipped("no readable /boot/vmlinuz-* (Debian: apt-get install linux-image-amd64)");
        return;
    };
    let dir = tmpdir("qemu");
    let init = compile("guestmem", &dir, &["-static"]);
    let cpio = dir.join("init.cpio");
    initramfs(&init, &cpio);
    let limit_mib = 64;
    let qemu = |mib: u64| -> Vec<String> {
        let append = format!("console=ttyS0 quiet panic=-1 rdinit=/init guestmem.mib={mib}");
        let args = ["qemu-system-x86_64", "-accel", "tcg", "-m", "512M", "-nographic", "-no-reboot", "-kernel"];
        let mut v: Vec<String> = args.iter().map(|s| s.to_string()).collect();
        v.extend([
            kernel.display().to_string(),
            "-initrd".into(),
            cpio.display().to_string(),
            "-append".into(),
            append,
        ]);
        v
    };
    let guest_line = |o: &Output| -> String {
        let out = String::from_utf8_lossy(&o.stdout).to_string();
        out.find("guestmem: ").map(|i| out[i..].lines().next().unwrap_or("").to_string()).unwrap_or_default()
    };
    let (big, small) = (qemu(4 * limit_mib), qemu(1));
    let big: Vec<&str> = big.iter().map(String::as_str).collect();
    let small: Vec<&str> = small.iter().map(String::as_str).collect();
    let expect = guest_line(&plain(&big));
    assert!(expect.contains("verified"), "the guest without uswap: {expect:?}");
    let device = format!("file:{}:1GiB", dir.display());
    // Both modes: signal mode used to stop at the firmware, which QEMU reads into guest RAM
    // with read(2) (EFAULT), before the C library's system calls were routed through uswap.
    for mode in ["thread", "signal"] {
        let opts = ["--device", device.as_str(), "--fault-mode", mode];
        let base = uswap_run(limit_mib, &opts, &small, &dir);
        let (o, v) = uswap_run(limit_mib, &opts, &big, &dir);
        assert!(
            o.status.success(),
            "{mode}: qemu under uswap run: {}\n{}",
            o.status,
            String::from_utf8_lossy(&o.stderr)
        );
        assert_eq!(guest_line(&o), expect, "{mode}: the guest's output differs under uswap run");
        assert!(counter(&v, "pswpout") > ((2 * limit_mib) << 20) / 4096, "{mode}: guest RAM was not paged: {v}");
        let peak = counter(&v, "resident_peak_bytes");
        assert!(peak <= (limit_mib << 20) + SLACK_BYTES, "{mode}: resident peak {peak}: {v}");
        assert_eq!(counter(&v, "syscall_efault"), 0, "{mode}: {v}");
        // The TCG code buffer (mapped read-write, then made executable) was let go of, not
        // left for reclaim to be refused on every round (240,000 refusals before).
        assert!(counter(&v, "move_refused") < 10_000, "{mode}: {v}");
        let (rss, base_rss) = (rss_peak(&v), rss_peak(&base.1));
        assert!(
            rss <= (limit_mib << 20) + base_rss + (32 << 20),
            "{mode}: peak RSS {rss} over the limit plus QEMU's own {base_rss}: {v}"
        );
    }
}

/// A tree of many processes of the same size, each holding less than 1/16 of the limit:
/// every one holds an average share, so each reclaims its own pages for the tree's charge
/// (a rule by fixed share left such a tree with nobody reclaiming ahead of the limit). Twenty
/// processes each work over 1/4 of the limit at random (5x the limit in all): every output is
/// the plain run's, the tree pages, and its resident peak stays within the limit plus one
/// readahead window per process.
#[test]
fn a_tree_of_twenty_equal_processes_keeps_its_budget() {
    let dir = tmpdir("twenty");
    let p = compile("randrw", &dir, &[]);
    let each_mib = LIMIT_MIB / 4;
    let nr = 20;
    // Each child's status is waited for by its pid: a plain `wait` would hide one that died.
    let script = format!(
        "pids=; for i in $(seq {nr}); do {} {each_mib} 20000 $i & pids=\"$pids $!\"; done; \
         for p in $pids; do wait $p || echo \"process $p: status $?\"; done",
        p.display()
    );
    let sorted = |o: &[u8]| {
        let mut lines: Vec<String> = String::from_utf8_lossy(o).lines().map(str::to_string).collect();
        lines.sort();
        lines
    };
    let expect = sorted(&plain(&["sh", "-c", &script]).stdout);
    assert_eq!(expect.len(), nr, "{expect:?}");
    for mode in ["thread", "signal"] {
        let (o, v) = uswap_run(LIMIT_MIB, &["--fault-mode", mode], &["sh", "-c", &script], &dir);
        assert!(o.status.success(), "{mode}: {}\n{}", o.status, String::from_utf8_lossy(&o.stderr));
        assert_eq!(
            sorted(&o.stdout),
            expect,
            "{mode}: a process read different bytes or failed:\n{}\n{v}",
            String::from_utf8_lossy(&o.stderr)
        );
        assert!(counter(&v, "pswpout") > 0, "{mode}: {v}");
        let peak = counter(&v, "resident_peak_bytes");
        assert!(peak <= (LIMIT_MIB << 20) + nr as u64 * (128 << 10), "{mode}: peak {peak}: {v}");
    }
}

/// fork without exec, three times: a working set 4x the limit, children that each read and
/// check all of it while the parent rewrites and checks its own copy. The fork brings
/// nothing in from the pool (each child reads what was out from its copy of the parent's
/// pool), so the tree's resident peak stays within the limit plus the parent's resident
/// pages the children share (measured: 1.4-1.9x the limit), instead of the whole working
/// set per fork (4.1x before). Both modes, and the same with a swap file, which the
/// children read where it is while the parent holds the slots they have not read yet.
/// The bound is 3x: debug builds in signal mode with the swap file peaked at 2.6-2.9x in
/// about one run in seven (42-46 MB; the children charge pages while the parent's moves of
/// the pages they share are refused), which a bound of 2.5x failed.
#[test]
fn fork_children_read_all_of_it_within_the_budget() {
    let dir = tmpdir("forkreaders");
    let p = compile("forkreaders", &dir, &[]);
    let prog = [p.to_str().unwrap(), &WSS_MIB.to_string(), "3"];
    let expect = plain(&prog);
    let file = format!("file:/var/tmp:{}MiB", 4 * WSS_MIB);
    for (mode, device) in [("thread", "zpool"), ("signal", "zpool"), ("thread", &file), ("signal", &file)] {
        let (o, v) = uswap_run(LIMIT_MIB, &["--fault-mode", mode, "--device", device], &prog, &dir);
        let what = format!("{mode}, {device}");
        assert!(o.status.success(), "{what}: {}\n{}", o.status, String::from_utf8_lossy(&o.stderr));
        assert_eq!(o.stdout, expect.stdout, "{what}: a child or the parent read different bytes");
        assert_eq!(counter(&v, "processes"), 4, "{what}: {v}");
        assert!(counter(&v, "pswpout") > 0, "{what}: {v}");
        let peak = counter(&v, "resident_peak_bytes");
        assert!(peak <= (3 * LIMIT_MIB) << 20, "{what}: peak {peak}: {v}");
        // The swap file's rings are uswap's, not the program's io_uring.
        assert_eq!(counter(&v, "syscall_async_kernel_access"), 0, "{what}: {v}");
    }
}

/// Signal mode: signal handlers that touch managed memory, run in the middle of system calls
/// whose memory the preparation is bringing in (SIGUSR1 every 20 us to four threads copying
/// pages three times the limit through pipes). The handler entered the engine again while
/// the interrupted preparation held a busy page or a codec's workspace: the program hung, or
/// died of SIGBUS 10 s later, in every run; with `SA_ONSTACK | SA_RESTART` too.
#[test]
fn signal_handlers_touching_managed_memory_during_system_calls_neither_hang_nor_die() {
    let dir = tmpdir("sigcopy");
    let p = compile("sigcopy", &dir, &[]);
    for flags in ["0", "0x18000000"] {
        let prog = [p.to_str().unwrap(), "48", "3", flags];
        let (o, v) = uswap_run(LIMIT_MIB, &["--fault-mode", "signal"], &prog, &dir);
        let stderr = String::from_utf8_lossy(&o.stderr);
        let stdout = String::from_utf8_lossy(&o.stdout);
        assert!(o.status.success(), "sa_flags {flags}: {}: {stdout}\n{stderr}", o.status);
        assert!(stdout.ends_with(" signalled yes bad 0\n"), "sa_flags {flags}: {stdout}\n{stderr}");
        assert!(counter(&v, "pswpin") > 1_000, "sa_flags {flags}: the copies must meet pages that are out: {v}");
    }
}

/// Signal mode: system calls on pages that are out while another thread discards memory of
/// its own (`madvise(MADV_DONTNEED)`, whose event makes the kernel refuse every userfaultfd
/// ioctl until the engine reads it). The preparation served such a page once and let the call
/// meet it still out: 600-700 `EFAULT`s reached the program in 4 s, in every run. Pipe copies
/// of pages of a buffer three times the limit, every page's bytes checked.
#[test]
fn system_calls_beside_a_threads_discards_get_no_efault() {
    let dir = tmpdir("discardio");
    let p = compile("discardio", &dir, &[]);
    let prog = [p.to_str().unwrap(), "48", "4"];
    let (o, v) = uswap_run(LIMIT_MIB, &["--fault-mode", "signal"], &prog, &dir);
    let stderr = String::from_utf8_lossy(&o.stderr);
    let stdout = String::from_utf8_lossy(&o.stdout);
    assert!(o.status.success(), "{}: {stdout}\n{stderr}", o.status);
    assert!(stdout.ends_with(" efault 0 bad 0\n"), "{stdout}\n{stderr}");
    assert!(counter(&v, "pswpin") > 1_000, "the copies must meet pages that are out: {v}");
    assert_eq!(counter(&v, "syscall_efault"), 0, "{v}");
}

/// Forks while another thread unmaps managed memory: a fork between the kernel's unmap and
/// the engine's reading of its UNMAP event gives the child a region with a hole. The child
/// adopts what is mapped; its pager used to fail (`mincore`: ENOMEM), the child ran
/// unmanaged and the run exited 2, in 8-16 of 200 forks. Both modes, every child's bytes
/// checked.
#[test]
fn fork_children_beside_a_threads_unmaps_get_their_pagers() {
    let dir = tmpdir("forkunmap");
    let p = compile("forkunmap", &dir, &[]);
    let prog = [p.to_str().unwrap(), "200"];
    for mode in ["thread", "signal"] {
        let (o, v) = uswap_run(64, &["--fault-mode", mode], &prog, &dir);
        let stderr = String::from_utf8_lossy(&o.stderr);
        assert!(o.status.success(), "{mode}: {}\n{stderr}", o.status);
        assert_eq!(String::from_utf8_lossy(&o.stdout), "forks 200 bad 0\n", "{mode}: {stderr}");
        assert!(!stderr.contains("runs unmanaged"), "{mode}: {stderr}");
        assert_eq!(counter(&v, "processes"), 201, "{mode}: {v}");
    }
}

/// Signal mode: system calls that read or write managed memory that is out (swapped out,
/// never touched) behave as without uswap. They used to fail with `EFAULT` (the kernel does
/// not wait for a page a system call touches in that mode): a datagram was lost, stdio's
/// flush failed. Every byte is checked, and no call's `EFAULT` reached the program.
#[test]
fn system_calls_on_memory_that_is_out_work_in_signal_mode() {
    let dir = tmpdir("syscalls");
    let p = compile("syscalls", &dir, &[]);
    let prog = [p.to_str().unwrap(), &WSS_MIB.to_string(), dir.to_str().unwrap()];
    let expect = plain(&prog);
    for mode in ["signal", "thread"] {
        let (o, v) = uswap_run(LIMIT_MIB, &["--fault-mode", mode], &prog, &dir);
        assert!(
            o.status.success(),
            "{mode}: {}\n{}{}",
            o.status,
            String::from_utf8_lossy(&o.stdout),
            String::from_utf8_lossy(&o.stderr)
        );
        assert_eq!(o.stdout, expect.stdout, "{mode}");
        assert!(counter(&v, "pswpout") > 0, "{mode}: {v}");
        assert_eq!(counter(&v, "syscall_efault"), 0, "{mode}: an EFAULT of uswap's reached the program: {v}");
        if mode == "signal" {
            assert!(counter(&v, "syscall_prepared") > 100, "{mode}: no call's memory was brought in first: {v}");
        } else {
            assert_eq!(counter(&v, "syscall_prepared"), 0, "thread mode needs no preparing: {v}");
        }
    }
}

/// Signal mode runs what the default mode runs: a shell pipeline (bash reading its script,
/// grep and awk reading their input into fresh buffers) and CPython importing modules while
/// most of its heap is out. All of them failed with `EFAULT` before system calls were
/// routed through uswap.
#[test]
fn shells_and_python_run_in_signal_mode() {
    let dir = tmpdir("signal-programs");
    let script = dir.join("pipeline.sh");
    std::fs::write(
        &script,
        "seq 1 400000 | grep 7 | awk '{ s += $1 } END { print s }'\nseq 1 50000 | sort -r | head -3\n",
    )
    .unwrap();
    let bash = ["bash", script.to_str().unwrap()];
    // Each process gets a pager once its heap passes 64 KiB (by default only heaps past a
    // sixteenth of the limit do, and none of these has one that large).
    let (o, v) = uswap_run(LIMIT_MIB, &["--fault-mode", "signal", "--start-after", "64KiB"], &bash, &dir);
    assert!(o.status.success(), "{}\n{}", o.status, String::from_utf8_lossy(&o.stderr));
    assert_eq!(o.stdout, plain(&bash).stdout);
    assert_eq!(counter(&v, "syscall_efault"), 0, "{v}");
    if !have("python3", "CPython importing modules in signal mode") {
        return;
    }
    // 64 MiB of records (4x the limit), then imports whose files are read into buffers on
    // the managed heap, then the records checked.
    let py = "import sys\n\
              rows = [('row-%d' % i, i, [i] * 8) for i in range(250000)]\n\
              import json, email.parser, xml.dom.minidom, decimal, fractions, statistics, csv, sqlite3\n\
              print(sum(r[1] for r in rows), json.dumps(rows[12345]), statistics.mean(r[1] for r in rows[:1000]))\n";
    let prog = ["python3", "-c", py];
    let (o, v) = uswap_run(LIMIT_MIB, &["--fault-mode", "signal"], &prog, &dir);
    assert!(o.status.success(), "{}\n{}", o.status, String::from_utf8_lossy(&o.stderr));
    assert_eq!(o.stdout, plain(&prog).stdout);
    assert!(counter(&v, "pswpout") > 0, "{v}");
    assert_eq!(counter(&v, "syscall_efault"), 0, "{v}");
}

/// Signal mode needs no privilege: its userfaultfd handles user-mode faults only
/// (`UFFD_USER_MODE_ONLY`, which the kernel allows every user), and the faults system calls
/// take are the preload library's to serve. As an ordinary user (nobody, when the tests run
/// as root), with no sysctl and no permission on `/dev/userfaultfd`, a program whose system
/// calls read and write memory that is out runs within the limit and every byte checks.
#[test]
fn signal_mode_runs_as_an_ordinary_user() {
    let dir = tmpdir("unprivileged");
    // Everything the user runs or writes lives in one directory it may use.
    let p = compile("syscalls", &dir, &[]);
    let uswap = dir.join("uswap");
    std::fs::copy(env!("CARGO_BIN_EXE_uswap"), &uswap).unwrap();
    let lib = copy_libraries(&dir);
    use std::os::unix::fs::PermissionsExt;
    for f in [&*dir, &*p, &*uswap, &*lib, &*lib.with_file_name("libuswap_shim.so")] {
        std::fs::set_permissions(f, std::fs::Permissions::from_mode(0o777)).unwrap();
    }
    let stats = dir.join("stats-unprivileged.json");
    let args: Vec<String> =
        [uswap.to_str().unwrap(), "run", "--limit", &format!("{LIMIT_MIB}MiB"), "--fault-mode", "signal"]
            .iter()
            .map(|s| s.to_string())
            .chain(["--stats-json".into(), stats.display().to_string(), "--".into()])
            .chain([p.display().to_string(), WSS_MIB.to_string(), dir.display().to_string()])
            .collect();
    // SAFETY: geteuid cannot fail.
    let root = unsafe { libc::geteuid() } == 0;
    let mut cmd = if root {
        let mut c = Command::new("setpriv");
        c.args(["--reuid=65534", "--regid=65534", "--clear-groups", "--"]).args(&args);
        c
    } else {
        let mut c = Command::new(&args[0]);
        c.args(&args[1..]);
        c
    };
    cmd.env("USWAP_PRELOAD_LIB", &lib).current_dir(&dir);
    let o = run_timed(&mut cmd, Duration::from_secs(300));
    assert!(
        o.status.success(),
        "as uid 65534: {}\n{}{}",
        o.status,
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    assert!(String::from_utf8_lossy(&o.stdout).starts_with("ok "), "{}", String::from_utf8_lossy(&o.stdout));
    let v: Value = serde_json::from_slice(&std::fs::read(&stats).unwrap()).unwrap();
    let v = v.get("stats").cloned().unwrap_or(v);
    assert!(counter(&v, "pswpout") > 0, "{v}");
    assert_eq!(counter(&v, "syscall_efault"), 0, "{v}");
    let peak = counter(&v, "resident_peak_bytes");
    assert!(peak <= (LIMIT_MIB << 20) + SLACK_BYTES, "resident peak {peak}: {v}");
    thread_mode_is_refused_before_the_program_starts(&dir, &uswap, &lib, root);
}

/// Thread mode needs a userfaultfd the kernel's own faults reach, which an ordinary user
/// may not open here: `uswap run` says so and fails before it starts the program (which
/// would otherwise run unmanaged, and the run fail only at its end).
fn thread_mode_is_refused_before_the_program_starts(dir: &Path, uswap: &Path, lib: &Path, root: bool) {
    let sysctl = std::fs::read_to_string("/proc/sys/vm/unprivileged_userfaultfd").unwrap_or_default();
    use std::os::unix::fs::PermissionsExt;
    let dev_mode = std::fs::metadata("/dev/userfaultfd").map(|m| m.permissions().mode()).unwrap_or(0);
    if !root || sysctl.trim() != "0" || dev_mode & 0o006 == 0o006 {
        skipped("thread mode refused to an ordinary user: this machine lets every user open a userfaultfd, or the tests do not run as root");
        return;
    }
    let marker = dir.join("started-in-thread-mode");
    let o = run_timed(
        Command::new("setpriv")
            .args(["--reuid=65534", "--regid=65534", "--clear-groups", "--"])
            .arg(uswap)
            .args(["run", "--limit", "64MiB", "--fault-mode", "thread", "--", "touch"])
            .arg(&marker)
            .env("USWAP_PRELOAD_LIB", lib)
            .current_dir(dir),
        Duration::from_secs(60),
    );
    let e = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(2), "{e}");
    assert!(e.contains("in thread mode (--fault-mode thread") && e.contains("unprivileged_userfaultfd"), "{e}");
    assert!(!marker.exists(), "the program ran though its run was refused: {e}");
}

/// A read of memory never written maps the kernel's zero page: nothing charged, nothing to
/// evict, as under the kernel's own accounting, in both modes (signal mode without
/// fault-around, see `fault::zero_fill`). A read-only sweep of 4x the limit, twice, heap and
/// mmap, leaves the resident peak near 0 and swaps nothing out; writes afterwards are charged
/// and paged as usual, and every byte reads back right.
#[test]
fn reads_of_never_written_memory_are_not_charged() {
    let dir = tmpdir("readzero");
    let p = compile("readzero", &dir, &[]);
    let wss = (4 * WSS_MIB).to_string();
    for mode in ["thread", "signal"] {
        let read_only = [p.to_str().unwrap(), wss.as_str(), "read"];
        let (o, v) = uswap_run(LIMIT_MIB, &["--fault-mode", mode], &read_only, &dir);
        assert!(o.status.success(), "{mode}: {}\n{}", o.status, String::from_utf8_lossy(&o.stderr));
        assert!(counter(&v, "pgfault_zero") > 1000, "{mode}: {v}");
        let peak = counter(&v, "resident_peak_bytes");
        assert!(peak < 1 << 20, "{mode}: reading zeros charged {peak} bytes: {v}");
        assert_eq!(counter(&v, "pswpout") + counter(&v, "swpout_zero"), 0, "{mode}: zero pages were evicted: {v}");
        let then_written = [p.to_str().unwrap(), wss.as_str()];
        let r = uswap_run(LIMIT_MIB, &["--fault-mode", mode], &then_written, &dir);
        assert_same_and_paged(&then_written, &r, LIMIT_MIB);
    }
}

/// Signal mode, two processes under one limit: CPython writing records to a pipe while a
/// neighbour fills memory. The locale data CPython's `setlocale` allocates used to live in
/// the managed heap and be swapped out at once (the neighbour needed the room); a thread
/// starting then reads it before it unblocks its signals (`uswap-preload/src/locale.rs`),
/// and the process died of SIGBUS in about half the runs. With that fixed, the pipe still
/// came out 10 or 4,116 bytes short in about 3 runs in 10: reclaim took a page of the
/// write's buffer out while the write was blocked on the full pipe, the write returned
/// short, and CPython's buffered writer drops the rest of a short write (it does without
/// uswap too, when a signal cuts a write). Now such a write is continued for the rest
/// (`uswap/src/syscall_guard/complete.rs`). Every run must finish, and every byte go
/// through the pipe.
#[test]
fn signal_mode_threads_start_while_the_locale_data_is_out() {
    if !have("python3", "CPython under a neighbour's memory pressure") {
        return;
    }
    let dir = tmpdir("locale");
    let hog =
        "b = [bytearray(1 << 20) for _ in range(96)]\nfor r in range(20):\n    for x in b:\n        x[r * 100] = 1\n";
    let gen = "import sys\nv = 'x' * 4096\nfor i in range(30000):\n    sys.stdout.write('%08d %s\\n' % (i, v))\n";
    let script = format!("python3 -c {} & python3 -c {} | cksum; wait", shell_quote(hog), shell_quote(gen));
    let prog = ["sh", "-c", script.as_str()];
    let expect = plain(&prog);
    for round in 0..4 {
        let (o, v) = uswap_run(LIMIT_MIB, &["--fault-mode", "signal"], &prog, &dir);
        assert!(o.status.success(), "run {round}: {}\n{}", o.status, String::from_utf8_lossy(&o.stderr));
        assert_eq!(o.stdout, expect.stdout, "run {round}: bytes lost or changed in the pipe");
        assert_eq!(counter(&v, "syscall_efault"), 0, "{v}");
    }
}

/// A write to a blocking pipe and a read of a regular file are whole, in both modes, as
/// under the kernel's own swap, though each one's buffer (12 MiB) is most of the limit and
/// a neighbour takes memory meanwhile: the program fails on a short count. In signal mode
/// the buffer is never in whole at once (its `EFAULT` reached the program) and its pages
/// are taken out while the write waits for the reader (a short count): such calls are
/// made in windows of the buffer and continued for the rest.
#[test]
fn blocking_writes_and_file_reads_are_whole_under_pressure() {
    let dir = tmpdir("wholewrite");
    let p = compile("wholewrite", &dir, &[]);
    let p = p.to_str().unwrap();
    let file = dir.join("big.dat");
    let o = plain(&["sh", "-c", &format!("{p} 12 1 > {}", file.display())]);
    assert!(o.status.success());
    let write = format!("{p} 96 hog & {p} 12 6 | cksum; wait");
    let read = format!("{p} 96 hog & {p} 12 read {}; wait", file.display());
    for script in [write, read] {
        let prog = ["sh", "-c", script.as_str()];
        let expect = plain(&prog);
        for mode in ["thread", "signal"] {
            let (o, v) = uswap_run(LIMIT_MIB, &["--fault-mode", mode], &prog, &dir);
            let stderr = String::from_utf8_lossy(&o.stderr);
            assert!(o.status.success(), "{mode}, {script}: {}\n{stderr}", o.status);
            assert!(!stderr.contains("returned"), "{mode}, {script}: a short count:\n{stderr}");
            assert_eq!(o.stdout, expect.stdout, "{mode}, {script}: bytes lost or changed");
            assert!(counter(&v, "pswpout") > 0, "{mode}: nothing was paged: {v}");
            assert_eq!(counter(&v, "syscall_efault"), 0, "{mode}: {v}");
        }
    }
}

/// Threads made by the C library's `pthread_create` itself (jemalloc's background threads
/// find it with `dlsym`): their DTV, which `__tls_get_addr` reads on every access to a
/// shared library's thread-local (uswap's own, in its SIGBUS handler and system-call entry),
/// was allocated in the managed heap. Once it was swapped out, redis-server died of SIGBUS.
/// The dynamic linker's allocations stay in the C library's heap now.
#[test]
fn threads_the_c_library_makes_keep_their_dtv_out_of_the_managed_heap() {
    let dir = tmpdir("libcthread");
    let p = compile("libcthread", &dir, &[]);
    let direct = [p.to_str().unwrap(), "64"];
    // Run by the dynamic linker itself too (`ld.so PROGRAM`: no AT_BASE to find it by).
    let by_rtld = format!("/lib64/ld-linux-x86-64.so.2 {} 64", p.display());
    let by_rtld = ["sh", "-c", by_rtld.as_str()];
    for (mode, prog) in [("thread", &direct[..]), ("signal", &direct[..]), ("signal", &by_rtld[..])] {
        let (o, v) = uswap_run(LIMIT_MIB, &["--fault-mode", mode], prog, &dir);
        let stdout = String::from_utf8_lossy(&o.stdout);
        let stderr = String::from_utf8_lossy(&o.stderr);
        assert!(o.status.success(), "{mode}: {}\n{stdout}\n{stderr}", o.status);
        assert!(!stderr.contains("cannot"), "{mode}, {prog:?}: {stderr}");
        assert_eq!(stdout.matches(": dtv heap").count(), 4, "{mode}: a DTV in managed memory:\n{stdout}");
        assert!(stdout.ends_with("ok\n"), "{mode}: {stdout}");
        assert!(counter(&v, "pswpout") > 0, "{mode}: nothing was paged: {v}");
    }
}

/// io_uring, Linux AIO and a KVM guest's RAM make the kernel touch memory on its own,
/// outside any system call signal mode can prepare: in signal mode each is counted and said
/// once on stderr, with the way out (thread mode); in thread mode, where the kernel waits for
/// a fault wherever it takes it, nothing is said.
#[test]
fn asynchronous_kernel_access_in_signal_mode_is_said() {
    let dir = tmpdir("asyncio");
    let p = compile("asyncio", &dir, &[]);
    let prog = [p.to_str().unwrap()];
    let expect = plain(&prog);
    let kvm = String::from_utf8_lossy(&expect.stdout).contains("\nkvm");
    if !kvm {
        skipped("the KVM memory region: /dev/kvm cannot be opened here");
    }
    for mode in ["signal", "thread"] {
        // A pager from the start: the program's buffers are small, and a process that waits
        // for its pager sets its rings up unseen (`lazy_start_...` covers that case).
        let (o, v) = uswap_run(LIMIT_MIB, &["--fault-mode", mode, "--start-after", "0"], &prog, &dir);
        let stderr = String::from_utf8_lossy(&o.stderr);
        assert!(o.status.success(), "{mode}: {}\n{stderr}", o.status);
        assert_eq!(o.stdout, expect.stdout, "{mode}");
        let said = stderr.matches("run this program with --fault-mode thread").count();
        let counted = counter(&v, "syscall_async_kernel_access");
        if mode == "signal" {
            assert_eq!(said, 1, "said once:\n{stderr}");
            assert!(stderr.contains("uswap: io_uring in signal mode"), "{stderr}");
            assert_eq!(counted, 2 + u64::from(kvm), "io_uring, AIO and the KVM region: {v}");
        } else {
            assert_eq!((said, counted), (0, 0), "thread mode:\n{stderr}\n{v}");
        }
    }
}

/// An io_uring set up without the C library (liburing 2 makes its own system calls; loaded
/// with `dlopen`, `auto` does not see it before the program runs) is found by its mapped
/// rings and said in signal mode, once, within a second; thread mode says nothing. Its
/// completions into pages that were out failed with `EFAULT` without a word before.
#[test]
fn io_uring_set_up_by_its_own_system_calls_is_said_in_signal_mode() {
    let dir = tmpdir("rawuring");
    let p = compile("rawuring", &dir, &[]);
    let prog = [p.to_str().unwrap(), "2"];
    for mode in ["signal", "thread"] {
        let (o, v) = uswap_run(LIMIT_MIB, &["--fault-mode", mode, "--start-after", "0"], &prog, &dir);
        let stderr = String::from_utf8_lossy(&o.stderr);
        assert!(o.status.success(), "{mode}: {}\n{stderr}", o.status);
        if String::from_utf8_lossy(&o.stdout).starts_with("io_uring refused") {
            skipped("io_uring is refused here (a seccomp profile, kernel.io_uring_disabled)");
            return;
        }
        assert_eq!(String::from_utf8_lossy(&o.stdout), "rings mapped\n", "{mode}: {stderr}");
        let said = stderr.matches("run this program with --fault-mode thread").count();
        let counted = counter(&v, "syscall_async_kernel_access");
        let expected = if mode == "signal" { (1, 1) } else { (0, 0) };
        assert_eq!((said, counted), expected, "{mode}:\n{stderr}\n{v}");
    }
}

/// Memory the kernel pins for I/O (an io_uring's registered buffers, 24 MiB under a limit of
/// 16 MiB) is refused by every move out: the background reclaimer, woken by each refusal it
/// queued for a copy-on-write break, went round again at once and used a whole CPU while the
/// program slept (3.0 s of CPU in 3 s). The program's bytes are all there, the overrun is
/// said with its cause, and its idle CPU stays under a third of the sleep. Thread mode, as
/// `auto` gives programs that link liburing.
#[test]
fn pinned_buffers_over_the_limit_leave_the_reclaimer_idle() {
    let dir = tmpdir("pinned");
    let p = compile("pinned", &dir, &[]);
    let prog = [p.to_str().unwrap(), "24", "16", "3"];
    let (o, _) = uswap_run(LIMIT_MIB, &["--fault-mode", "thread"], &prog, &dir);
    let stderr = String::from_utf8_lossy(&o.stderr);
    let stdout = String::from_utf8_lossy(&o.stdout);
    if stdout.starts_with("io_uring refused") {
        return skipped("io_uring is refused here (a seccomp profile, kernel.io_uring_disabled)");
    }
    assert!(o.status.success(), "{}: {stdout}\n{stderr}", o.status);
    assert!(stdout.ends_with("ok\n"), "{stdout}\n{stderr}");
    assert!(stderr.contains("pinned for I/O (io_uring's registered buffers"), "{stderr}");
    let idle_cpu_ms: u64 = stdout
        .lines()
        .find_map(|l| l.strip_prefix("idle cpu_ms "))
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no idle CPU time: {stdout}"));
    assert!(idle_cpu_ms < 1000, "{idle_cpu_ms} ms of CPU while the program slept 3 s: {stderr}");
}

/// `--fault-mode auto`, the default, runs a process in thread mode when it links an
/// asynchronous I/O library (its reads complete into its buffers on the kernel's own time),
/// and says so; a process that does not is in signal mode (so io_uring set up by hand is
/// said as in signal mode).
#[test]
fn auto_mode_picks_thread_mode_for_programs_linking_asynchronous_io() {
    let dir = tmpdir("automode");
    let libdir = Path::new("/usr/lib/x86_64-linux-gnu");
    let lib = ["liburing.so.2", "libaio.so.1"].into_iter().find(|l| libdir.join(l).exists());
    let Some(lib) = lib else {
        panic!("neither liburing.so.2 nor libaio.so.1 is installed (qemu-system-x86 brings both): install liburing2")
    };
    let linked = compile("asyncio", &dir, &["-Wl,--no-as-needed", &format!("-l:{lib}")]);
    let linked_bin = dir.join("asyncio-linked");
    std::fs::rename(&linked, &linked_bin).unwrap();
    let plain_bin = compile("asyncio", &dir, &[]);
    for (bin, thread) in [(&linked_bin, true), (&plain_bin, false)] {
        let prog = [bin.to_str().unwrap()];
        let (o, v) = uswap_run(LIMIT_MIB, &["--start-after", "0"], &prog, &dir);
        let stderr = String::from_utf8_lossy(&o.stderr);
        assert!(o.status.success(), "{}: {}\n{stderr}", prog[0], o.status);
        let counted = counter(&v, "syscall_async_kernel_access");
        if thread {
            let said = format!("runs in thread mode: it links {}", lib.split(".so").next().unwrap());
            assert!(stderr.contains(&said), "said which mode and why:\n{stderr}");
            assert_eq!(counted, 0, "thread mode: {v}");
        } else {
            assert!(!stderr.contains("runs in thread mode"), "{stderr}");
            assert!(stderr.contains("uswap: io_uring in signal mode"), "signal mode:\n{stderr}");
            assert!(counted >= 2, "{v}");
        }
    }
}

/// A process that `auto` gives thread mode (it links liburing) and that drops root before
/// its pager starts (`dropuser.c`, as mariadbd with `user=mysql` does) may no longer open
/// thread mode's userfaultfd: it takes signal mode, says so, and is paged. Before, it ran
/// wholly outside the budget and the run failed at its end.
#[test]
fn a_server_that_drops_root_before_its_pager_starts_is_paged_in_signal_mode() {
    // SAFETY: geteuid cannot fail.
    if unsafe { libc::geteuid() } != 0 {
        return uswap_testkit::skipped("a_server_that_drops_root... needs root to change user");
    }
    let dir = tmpdir("dropuser");
    let p = compile("dropuser", &dir, &["-Wl,--no-as-needed", "-l:liburing.so.2"]);
    let prog = [p.to_str().unwrap(), "64"];
    let (o, v) = uswap_run(LIMIT_MIB, &[], &prog, &dir);
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert_eq!(String::from_utf8_lossy(&o.stdout), "dropuser: uid 65534, bad 0\n", "{stderr}");
    assert!(o.status.success(), "{}: {stderr}", o.status);
    assert!(stderr.contains("runs in signal mode: thread mode, which `auto` chose for it"), "{stderr}");
    assert!(counter(&v, "pswpout") > 0, "paged: {v}");
    // Asked for, thread mode stays, and the pager is refused: the run fails, and `uswap stat`
    // of the process says it will not get one (it said "no pager yet").
    let mut run = Command::new(env!("CARGO_BIN_EXE_uswap"));
    run.env("USWAP_PRELOAD_LIB", preload()).env("TMPDIR", &dir);
    run.args(["run", "--limit", "16MiB", "--fault-mode", "thread", "--"]).args([prog[0], "64", "4"]);
    let mut child = run.stdout(Stdio::null()).stderr(Stdio::null()).spawn().expect("uswap run starts");
    std::thread::sleep(Duration::from_secs(2));
    let program = std::fs::read_to_string(format!("/proc/{}/task/{0}/children", child.id())).unwrap_or_default();
    let pid = program.split_whitespace().next().expect("the program runs").to_string();
    let stat = uswap(&["stat", &pid], None);
    let status = child.wait().expect("uswap run ends");
    let said = String::from_utf8_lossy(&stat.stderr);
    assert!(said.contains("without a pager, and will not get one: ") && said.contains("userfaultfd"), "{said}");
    assert_eq!(status.code(), Some(2), "a process refused its pager fails the run");
}

/// `process_vm_readv` as MPI's single-copy transfers use it: a process reads its own memory
/// and a child's, 48 MiB each under a limit of 16 MiB, every word checked. Thread mode
/// serves both; signal mode serves the caller's own memory (the system-call guard makes it
/// ready: it failed with `EFAULT` before), not the other process's pages out of RAM, which
/// the reader is told once, with the way out. `--fault-mode auto` picks thread mode for a
/// program that links an MPI library (here a stand-in named `libmpi.so.40`).
#[test]
fn another_processs_memory_is_read_in_thread_mode_and_the_failure_said_in_signal_mode() {
    let dir = tmpdir("vmread");
    let stub = dir.join("stub.c");
    std::fs::write(&stub, "int uswap_test_mpi_stub(void) { return 0; }\n").unwrap();
    let lib = dir.join("libmpi.so.40");
    let o = run_timed(
        Command::new("cc").args(["-shared", "-fPIC", "-Wl,-soname,libmpi.so.40", "-o"]).arg(&lib).arg(&stub),
        Duration::from_secs(60),
    );
    assert!(o.status.success(), "cc stub: {}", String::from_utf8_lossy(&o.stderr));
    let rpath = format!("-Wl,-rpath,{}", dir.display());
    let mpi = compile("vmread", &dir, &["-Wl,--no-as-needed", lib.to_str().unwrap(), &rpath]);
    let mpi_bin = dir.join("vmread-mpi");
    std::fs::rename(&mpi, &mpi_bin).unwrap();
    let bin = compile("vmread", &dir, &[]);
    let all_read =
        "self: 48 MiB read, 0 bad words\nself whole: 48 MiB read, 0 bad words\nchild: 48 MiB read, 0 bad words\n";
    // A first MiB partly in RAM comes back short ("moved D of N bytes"), else EFAULT.
    let said = ": if it runs under uswap in signal mode, its pages out of RAM cannot be reached";
    for (prog, mode) in [(&bin, "thread"), (&bin, "signal"), (&mpi_bin, "auto")] {
        let (o, _) =
            uswap_run(LIMIT_MIB, &["--fault-mode", mode, "--start-after", "0"], &[prog.to_str().unwrap(), "48"], &dir);
        let (stdout, stderr) = (String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr));
        assert!(o.status.success(), "{mode}: {}\n{stdout}\n{stderr}", o.status);
        if mode == "signal" {
            let selves = "self: 48 MiB read, 0 bad words\nself whole: 48 MiB read, 0 bad words\n";
            assert!(stdout.starts_with(&format!("{selves}child: short at MiB ")), "{stdout}\n{stderr}");
            assert_eq!(stderr.matches(said).count(), 1, "said once:\n{stderr}");
        } else {
            assert_eq!(stdout, all_read, "{mode}:\n{stderr}");
            assert!(!stderr.contains(said), "{mode}:\n{stderr}");
        }
        if mode == "auto" {
            assert!(stderr.contains("runs in thread mode: it links libmpi.so (MPI: "), "{stderr}");
        }
    }
}

/// A process reading and writing its own memory through its memory file (`/proc/self/mem`
/// and `/proc/thread-self/mem`, as a careful `memcpy` or a debugger inside the process does):
/// 48 MiB under a limit of 16 MiB, `pread`, `read`, `pwrite` and `write` at odd addresses and
/// of up to 8 MiB (one `read` of 4 MiB whose first page is in RAM, not looped), then every
/// byte checked. The kernel reaches those pages with a remote access, which cannot wait for
/// a userfaultfd: at a page out of RAM each call failed with `EIO` or stopped short. In
/// signal mode the system-call guard makes the range ready and makes the call again for the
/// rest, as the kernel goes on without uswap.
#[test]
fn a_process_reads_and_writes_its_own_memory_file() {
    let dir = tmpdir("memfile");
    let bin = compile("memfile", &dir, &[]);
    let (o, v) =
        uswap_run(LIMIT_MIB, &["--fault-mode", "signal", "--start-after", "0"], &[bin.to_str().unwrap(), "48"], &dir);
    let (stdout, stderr) = (String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr));
    assert!(o.status.success(), "{}\n{stdout}\n{stderr}", o.status);
    assert_eq!(stdout, "memfile: 18874491 bytes read, 6291456 written, 0 bad bytes\n", "{stderr}");
    assert!(counter(&v, "syscall_continued") > 0, "no call on the memory file met a page out of RAM: {v}");
}

/// A process whose memory is all outside what uswap would manage (mappings smaller than
/// `--min-size`, its own break) starts its pager once that memory passes the lazy start's
/// threshold, so that the run measures it: 48 MiB held so under 16 MiB ran with no pager,
/// the run said "unmanaged peak 0B" and `--strict` passed.
#[test]
fn memory_in_small_mappings_or_the_break_is_named_and_fails_strict() {
    let dir = tmpdir("smallmaps");
    let p = compile("smallmaps", &dir, &[]);
    for what in ["maps", "break"] {
        let prog = [p.to_str().unwrap(), what, "48"];
        let (o, _) = uswap_run(LIMIT_MIB, &[], &prog, &dir);
        let stderr = String::from_utf8_lossy(&o.stderr);
        assert!(o.status.success(), "{what}: {}\n{stderr}", o.status);
        assert_eq!(String::from_utf8_lossy(&o.stdout), "smallmaps: 48 MiB checked\n", "{what}");
        assert!(stderr.contains("does not hold for"), "{what}: no word of the memory outside the budget:\n{stderr}");
        let (o, _) = uswap_run(LIMIT_MIB, &["--strict"], &prog, &dir);
        let stderr = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(2), "{what}: --strict passed:\n{stderr}");
    }
}

/// An executable that defines the C library's allocator (rustc does, with jemalloc) comes
/// before the preloaded library in the dynamic linker's search, so the C library, the
/// dynamic loader and uswap's own threads allocate from it, in memory uswap pages: managed,
/// rustc ended in SIGSEGV in signal mode (a SIGBUS handler faulting on its thread's TLS
/// vector) and hung in thread mode (a handler thread waiting for jemalloc's lock). uswap's
/// library stands aside in such a process, the run names it among the processes outside
/// the budget, and `--strict` fails; the real rustc compiles under a small limit.
#[test]
fn a_program_that_brings_its_own_malloc_runs_outside_the_budget_and_is_named() {
    let dir = tmpdir("ownmalloc");
    let p = compile("ownmalloc", &dir, &[]);
    let prog = [p.to_str().unwrap(), "32"];
    for mode in ["signal", "thread"] {
        let (o, v) = uswap_run(LIMIT_MIB, &["--fault-mode", mode, "--start-after", "0"], &prog, &dir);
        let (stdout, stderr) = (String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr));
        assert!(o.status.success(), "{mode}: {}\n{stderr}", o.status);
        let all_its_own =
            "ownmalloc: 32 MiB checked, the C library used its malloc: yes, reallocarray used its realloc: yes\n";
        assert_eq!(stdout, all_its_own, "{mode}:\n{stderr}");
        assert!(stderr.contains("1 process(es) of the program ran outside the budget"), "{mode}:\n{stderr}");
        assert!(stderr.contains("its malloc is not uswap's"), "{mode}:\n{stderr}");
        assert_eq!(counter(&v, "escaped_processes"), 1, "{mode}: {v}");
    }
    let (o, _) = uswap_run(LIMIT_MIB, &["--strict"], &prog, &dir);
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(2), "--strict: {stderr}");
    assert!(stderr.contains("its malloc is not uswap's"), "--strict: {stderr}");
    // rustc (the toolchain's, not rustup's proxy) links jemalloc so, unless built without
    // it (a distribution's): then it is managed as any program, which the compile shows too.
    let sysroot = run_timed(Command::new("rustc").args(["--print", "sysroot"]), Duration::from_secs(60));
    let real_rustc = Path::new(String::from_utf8_lossy(&sysroot.stdout).trim()).join("bin/rustc");
    let exports =
        run_timed(Command::new("nm").args(["-D", "--defined-only"]).arg(&real_rustc), Duration::from_secs(60));
    let own_malloc = String::from_utf8_lossy(&exports.stdout).lines().any(|l| l.ends_with(" T malloc"));
    let src = dir.join("hello.rs");
    std::fs::write(
        &src,
        "fn main() { let v: Vec<u64> = (0..1000).collect(); println!(\"{}\", v.iter().sum::<u64>()); }\n",
    )
    .unwrap();
    let out = dir.join("hello");
    let rustc = ["rustc", "--edition", "2021", "-O", "-o", out.to_str().unwrap(), src.to_str().unwrap()];
    let (o, _) = uswap_run(LIMIT_MIB, &[], &rustc, &dir);
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "rustc: {}\n{stderr}", o.status);
    assert_eq!(stderr.contains("rustc: its malloc is not uswap's"), own_malloc, "{stderr}");
    let ran = run_timed(&mut Command::new(&out), Duration::from_secs(30));
    assert_eq!(String::from_utf8_lossy(&ran.stdout), "499500\n");
}

/// AddressSanitizer's runtime aborts a program in whose library list it is not first ("ASan
/// runtime does not come first"): with uswap's library first in `LD_PRELOAD`, a program
/// built with `-fsanitize=address` did not start. Its runtime now goes first; the program
/// runs with its checks (an overflow is caught), and, its `malloc` being the sanitizer's,
/// it is named as outside the budget. Its children do not inherit the runtime.
#[test]
fn a_program_built_with_address_sanitizer_runs_with_its_checks() {
    let dir = tmpdir("asan");
    let p = compile("asan", &dir, &["-fsanitize=address", "-O1"]);
    let (o, v) = uswap_run(LIMIT_MIB, &[], &[p.to_str().unwrap(), "ok"], &dir);
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "{}\n{stderr}", o.status);
    assert_eq!(String::from_utf8_lossy(&o.stdout), "asan: checked, children preload the runtime: no\n", "{stderr}");
    assert!(stderr.contains("asan: its malloc is not uswap's"), "{stderr}");
    assert_eq!(counter(&v, "escaped_processes"), 1, "{v}");
    let (o, _) = uswap_run(LIMIT_MIB, &[], &[p.to_str().unwrap(), "overflow"], &dir);
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success(), "the overflow was not caught: {stderr}");
    assert!(stderr.contains("AddressSanitizer: heap-buffer-overflow"), "{stderr}");
}

/// `s` quoted for `sh`.
fn shell_quote(s: &str) -> String {
    format!("'{}'", s.replace('\'', r"'\''"))
}

/// A process the program leaves running (a background job of a shell that exits, a daemon)
/// outlives `uswap run`: it is said on stderr with its pid (it stays under the budget, but
/// its counters from then on are in no summary), and the run's directory is gone once it
/// ends (it used to be left behind when a record was written while it was being removed).
/// One that ends within half a second of the program is waited for and not named.
#[test]
fn processes_that_outlive_the_program_are_said_and_leave_nothing_behind() {
    let dir = tmpdir("outlive");
    let tmp = dir.join("tmp");
    std::fs::create_dir_all(&tmp).unwrap();
    // The shell lingers half a second: a process is seen once its pager has taken its slot
    // of the tree's budget, and one started just as the program ends may not have yet (under
    // `.ci/run`'s load the sleeper once had not; said in the note of issue 27's session).
    let o = uswap(&["run", "--limit", "64MiB", "--", "sh", "-c", "sleep 2 & echo $!; sleep 0.5"], Some(&tmp));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "{}: {err}", o.status);
    let sleeper = String::from_utf8_lossy(&o.stdout).trim().to_string();
    assert!(
        err.contains("1 process(es) of the program outlive it") && err.contains(&format!("({sleeper})")),
        "{sleeper}: {err}"
    );
    // The sleeper ends, writing its last record; then nothing of the run is left.
    std::thread::sleep(Duration::from_millis(2500));
    let left: Vec<_> = std::fs::read_dir(&tmp).unwrap().map(|e| e.unwrap().file_name()).collect();
    assert!(left.is_empty(), "left behind: {left:?}");
    // A program that waits for its children is not said to leave any.
    let o = uswap(&["run", "--limit", "64MiB", "--", "sh", "-c", "sleep 0.2 & wait"], None);
    assert!(o.status.success() && !String::from_utf8_lossy(&o.stderr).contains("outlive"), "{o:?}");
    // Nor is one that ends a moment after it (Python's resource tracker, 15-35 ms after the
    // program): the run waits for it a little (`EXIT_GRACE`, half a second). The program
    // gives it a quarter of a second to start first (under `.ci/run`'s load a `sleep 0.1`
    // started as the program ended was once still loading half a second later).
    let o = uswap(&["run", "--limit", "64MiB", "--", "sh", "-c", "sleep 0.3 & sleep 0.25"], None);
    assert!(o.status.success() && !String::from_utf8_lossy(&o.stderr).contains("outlive"), "{o:?}");
}

/// Threads cancelled (`pthread_cancel`) while blocked in a system call on managed memory,
/// and as they start (some while their `read`'s buffer is brought in), both modes: the
/// program goes on and ends as without uswap. In signal mode the call runs in the preload's
/// frames, which the cancellation unwinds: a destructor there (a pin released on drop)
/// made that an abort, and so did a cancellation while a page was brought in (now put off
/// to the call itself).
#[test]
fn threads_cancelled_in_blocking_calls_end_cleanly() {
    let dir = tmpdir("cancel");
    let p = compile("cancel", &dir, &[]);
    let prog = [p.to_str().unwrap(), &WSS_MIB.to_string()];
    let expect = plain(&prog);
    let want = format!("cancelled 4 of 4, {WSS_MIB} MiB checked, then 50 of 50 as they started");
    assert_eq!(String::from_utf8_lossy(&expect.stdout).trim(), want);
    for mode in ["signal", "thread"] {
        let (o, v) = uswap_run(LIMIT_MIB, &["--fault-mode", mode], &prog, &dir);
        assert!(o.status.success(), "{mode}: {}\n{}", o.status, String::from_utf8_lossy(&o.stderr));
        assert_eq!(o.stdout, expect.stdout, "{mode}");
        assert!(counter(&v, "pswpout") > 0, "{mode}: {v}");
    }
}

/// A limit below what a pager takes, or above (1 PiB), is refused before the program starts
/// (it used to start it, and every process failed on its own); one far above the machine's
/// memory within that runs (`8TiB` was refused, the default pool's cap taken for 8 TiB); a
/// `uswap run` under another says that its program's budget is its own, outside the outer
/// one; both runs serve their counters.
#[test]
fn tiny_limits_are_refused_and_nested_runs_are_said() {
    let o = uswap(&["run", "--limit", "4KiB", "--", "echo", "ran"], None);
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(2), "{err}");
    assert!(o.stdout.is_empty() && err.contains("below the least a pager takes, 1MiB"), "{err}");
    let o = uswap(&["run", "--limit", "2048TiB", "--", "echo", "ran"], None);
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(2), "{err}");
    assert!(o.stdout.is_empty() && err.contains("above the most a pager takes, 1024TiB"), "{err}");
    let o = uswap(&["run", "--limit", "8TiB", "--start-after", "0", "--", "echo", "ran"], None);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success() && String::from_utf8_lossy(&o.stdout).trim() == "ran", "{err}");
    let inner = env!("CARGO_BIN_EXE_uswap");
    let o = uswap(&["run", "--limit", "64MiB", "--", inner, "run", "--limit", "32MiB", "--", "echo", "ran"], None);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success() && String::from_utf8_lossy(&o.stdout).trim() == "ran", "{err}");
    assert!(err.contains("under another uswap run (limit 64MiB)") && err.contains("32MiB"), "{err}");
    assert!(!err.contains("will not be served"), "{err}");
}

/// SIGTERM sent to `uswap run` alone (a supervisor's `kill`, `timeout`) goes on to the
/// program, which ends as it chooses; `uswap run` waits for it, exits with its status and
/// leaves nothing behind. It used to die at once, leaving the program running and its
/// directory in place.
#[test]
fn sigterm_to_uswap_run_goes_on_to_the_program() {
    let dir = tmpdir("sigterm");
    let tmp = dir.join("tmp");
    std::fs::create_dir_all(&tmp).unwrap();
    let script = "trap 'echo got TERM; exit 7' TERM; echo ready; while :; do sleep 0.05; done";
    let mut child = Command::new(env!("CARGO_BIN_EXE_uswap"))
        .env("USWAP_PRELOAD_LIB", preload())
        .env("TMPDIR", &tmp)
        .args(["run", "--limit", "64MiB", "--", "sh", "-c", script])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut out = child.stdout.take().unwrap();
    let mut first = [0u8; 6];
    std::io::Read::read_exact(&mut out, &mut first).unwrap();
    assert_eq!(&first, b"ready\n");
    // SAFETY: kill(2) of the child we started.
    assert_eq!(unsafe { libc::kill(child.id() as i32, libc::SIGTERM) }, 0);
    let deadline = Instant::now() + Duration::from_secs(20);
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        assert!(Instant::now() < deadline, "uswap run did not end after SIGTERM");
        std::thread::sleep(Duration::from_millis(20));
    };
    let mut rest = String::new();
    std::io::Read::read_to_string(&mut out, &mut rest).unwrap();
    assert_eq!(status.code(), Some(7), "the program's own status: {status}");
    assert_eq!(rest, "got TERM\n");
    let left: Vec<_> = std::fs::read_dir(&tmp).unwrap().map(|e| e.unwrap().file_name()).collect();
    assert!(left.is_empty(), "left behind: {left:?}");
}

/// A handler the program installs with `SA_ONSTACK` while it sets no alternate stack of its
/// own runs on the one uswap gives each thread in signal mode, where without uswap it runs on
/// the thread's stack: a frame of 512 KiB there (`onstack.c`, on the main thread and on a
/// second one) runs as it does plain. With 64 KiB alternate stacks it died of SIGSEGV.
#[test]
fn a_handler_on_the_alternate_stack_has_room_for_a_large_frame() {
    let dir = tmpdir("onstack");
    let p = compile("onstack", &dir, &[]);
    let prog = [p.to_str().unwrap()];
    let expect = plain(&prog);
    for mode in ["signal", "thread"] {
        let (o, _) = uswap_run(64, &["--fault-mode", mode, "--start-after", "0"], &prog, &dir);
        assert!(o.status.success(), "{mode}: {}: {}", o.status, String::from_utf8_lossy(&o.stderr));
        assert_eq!(o.stdout, expect.stdout, "{mode}");
    }
}

/// Signals `uswap run` was started with ignored stay ignored in the program, as they would
/// without it (`nohup uswap run ...`): the signals it forwards were caught before the program
/// started, and an exec resets caught signals to their default action, so `nohup`'s SIGHUP
/// killed the program.
#[test]
fn signals_ignored_by_whoever_started_uswap_run_stay_ignored_in_the_program() {
    // SIGPIPE too, which the Rust runtime ignores for itself and its spawn resets for children.
    let script = "trap '' HUP TERM USR1 PIPE; exec \"$0\" run --limit 64MiB -- grep SigIgn /proc/self/status";
    let o = uswap_from_sh(script);
    let out = String::from_utf8_lossy(&o.stdout);
    let mask = out.trim().strip_prefix("SigIgn:").map(|m| u64::from_str_radix(m.trim(), 16).unwrap());
    let bit = |sig: libc::c_int| 1u64 << (sig - 1);
    let want = bit(libc::SIGHUP) | bit(libc::SIGTERM) | bit(libc::SIGUSR1) | bit(libc::SIGPIPE);
    assert_eq!(mask.map(|m| m & want), Some(want), "{out} {}", String::from_utf8_lossy(&o.stderr));
    // Not ignored by the caller: the program gets the default action, as before.
    assert_eq!(mask.map(|m| m & bit(libc::SIGUSR2)), Some(0), "{out}");
    let o = uswap(&["run", "--limit", "64MiB", "--", "grep", "SigIgn", "/proc/self/status"], None);
    let out = String::from_utf8_lossy(&o.stdout);
    let mask = out.trim().strip_prefix("SigIgn:").map(|m| u64::from_str_radix(m.trim(), 16).unwrap());
    assert_eq!(mask.map(|m| m & bit(libc::SIGPIPE)), Some(0), "{out}");
}

/// A standard descriptor the caller closed is closed in the program too, as with `env` or
/// `timeout`: the Rust runtime opens `/dev/null` on it before `main`, and `uswap run -- echo
/// hi >&-` exited 0, its output thrown away, where `echo` alone fails with `EBADF`.
#[test]
fn standard_descriptors_the_caller_closed_stay_closed_in_the_program() {
    let script = "exec \"$0\" run --limit 64MiB -- sh -c 'echo hi; echo \"echo: $?\" >&2' >&-";
    let o = uswap_from_sh(script);
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert!(stderr.contains("echo: 1"), "the program's stdout was open:\n{stderr}");
    let script = "exec \"$0\" run --limit 64MiB -- sh -c 'test -e /proc/self/fd/0 || echo closed' <&-";
    let o = uswap_from_sh(script);
    assert_eq!(String::from_utf8_lossy(&o.stdout), "closed\n", "{}", String::from_utf8_lossy(&o.stderr));
}

/// The library preloaded by hand refuses a configuration it cannot keep, naming the
/// variable, before `main`: a limit out of range ran the program with no budget and status
/// 0, and a value that is not UTF-8 was taken as unset (`USWAP_FAULT_MODE=sig\xffnal` ran in
/// thread mode).
#[test]
fn bad_variables_stop_a_process_preloaded_by_hand() {
    use std::os::unix::ffi::OsStrExt;
    let bad: [(&str, &[u8]); 5] = [
        ("USWAP_LIMIT", b"512KiB"),
        ("USWAP_LIMIT", b"99999TiB"),
        ("USWAP_FAULT_MODE", b"sig\xffnal"),
        ("USWAP_DEVICE", b"ram:\xff"),
        ("USWAP_IDLE_AGE", b"\xff"),
    ];
    for (name, value) in bad {
        let mut cmd = Command::new("/bin/echo");
        cmd.arg("ran").env("LD_PRELOAD", preload()).env(name, std::ffi::OsStr::from_bytes(value));
        let o = run_timed(&mut cmd, Duration::from_secs(60));
        let stderr = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(2), "{name}: {stderr}");
        assert!(o.stdout.is_empty() && stderr.contains(name), "{name}: {stderr}");
    }
}

/// A device list that does not parse, a file device that cannot be opened, a Redis server
/// that does not answer, a device too small for one cluster (or a pool's cap for one chunk),
/// a zstd level out of range, a file device's size that is not one, and a `--stats-json`
/// that cannot be written, are refused before the program starts (the first was said by
/// every process of the tree; the devices were found out when a pager first started, which
/// with lazy start may be after the program's work, and the run then failed; the last once
/// the program had run).
#[test]
fn bad_devices_and_stats_paths_are_refused_before_the_program_starts() {
    for (opts, said) in [
        (&["--device", "bogus"][..], "--device: bad device \"bogus\""),
        (&["--device", "file:/nonexistent/dir/swap"][..], "swap device /nonexistent/dir/swap: no such file"),
        (&["--device", "zpool,file:/dev/null"][..], "swap device /dev/null: it is a character device"),
        (&["--device", "redis://127.0.0.1:1"][..], "redis device 127.0.0.1:1: no seed is a reachable primary"),
        (&["--device", "ram:1MiB"][..], "swap device ram: capacity of 1048576 bytes is below one cluster"),
        (&["--device", "file:/var/tmp:4KiB"][..], "swap device file: capacity of 4096 bytes is below one cluster"),
        (&["--device", "zpool:1KiB"][..], "bad device \"zpool:1KiB\": compressed pool cap of 1024 bytes is below one"),
        // Found by each process's pager, after the program ran.
        (&["--device", "zpool:zstd-30"][..], "bad device \"zpool:zstd-30\": bad zstd level"),
        // A swap file named "/var/tmp:8GB", which each process after the first found in use.
        (&["--device", "file:/var/tmp:8GB"][..], "\"8GB\" is not a size"),
        (&["--stats-json", "/nonexistent/dir/stats.json"][..], "cannot write /nonexistent/dir/stats.json"),
    ] {
        let o = uswap(&[&["run", "--limit", "64MiB"], opts, &["--", "echo", "ran"]].concat(), None);
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(2), "{opts:?}: {err}");
        assert!(o.stdout.is_empty(), "{opts:?}: the program ran");
        assert!(err.contains(said) && err.lines().count() == 1, "{opts:?}: {err}");
    }
}

/// `uswap run` of `randrw` (built at `p`) over 64 MiB under 8 MiB, paging to `device` in
/// fault mode `mode`, for longer than any test waits: the tests stop or kill its store.
fn randrw_paging_to(device: &str, mode: &str, p: &Path) -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_uswap"));
    cmd.env("USWAP_PRELOAD_LIB", preload())
        .args(["run", "--limit", "8MiB", "--fault-mode", mode, "--device", device, "--"])
        .args([p.to_str().unwrap(), "64", "1000000000"]);
    cmd
}

/// A program paging to a Redis store that stops answering (the server stopped with
/// SIGSTOP: connections are accepted, nothing is answered, reads wait out their failover
/// deadlines): SIGTERM to `uswap run` ends the run within two seconds in both fault modes,
/// key deletion included (before: 121 s in signal mode, where uswap's SIGBUS handler kept
/// SIGTERM blocked while a read waited, and then the deletion waited 2 s a step).
#[test]
fn sigterm_ends_a_run_whose_redis_store_stopped_answering_within_two_seconds() {
    use uswap::backend::redis::{redis_server_available, LocalRedis};
    if !redis_server_available() {
        skipped("redis-server is not installed (apt-get install redis-server)");
        return;
    }
    let dir = tmpdir("stalled");
    let p = compile("randrw", &dir, &[]);
    for mode in ["signal", "thread"] {
        let redis = LocalRedis::start(1, 0, &[]).expect("a local redis-server starts");
        let server = redis.pid(0).expect("the server runs") as libc::pid_t;
        let mut cmd = randrw_paging_to(&redis.url(0), mode, &p);
        let mut stopped_at = None;
        let out = common::run_timed_with(&mut cmd, Duration::from_secs(120), |pid| {
            std::thread::sleep(Duration::from_millis(2500));
            // SAFETY: kill(2) of the server this test started, then of the run it started.
            unsafe { libc::kill(server, libc::SIGSTOP) };
            std::thread::sleep(Duration::from_millis(1500));
            stopped_at = Some(Instant::now());
            // SAFETY: as above.
            unsafe { libc::kill(pid as libc::pid_t, libc::SIGTERM) };
        });
        let took = stopped_at.unwrap().elapsed();
        // SAFETY: kill(2) of the server this test started (stopped: let it die on drop).
        unsafe { libc::kill(server, libc::SIGCONT) };
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(128 + libc::SIGTERM), "{mode}: {err}");
        assert!(took < Duration::from_secs(2), "{mode}: SIGTERM took {took:?} to end the run: {err}");
    }
}

/// `uswap run` of `randrw` (built at `p`) paging to `device` (with `failover_ms=2000`) in
/// fault mode `mode`, with `server`, a Redis server the store needs, SIGKILLed 2.5 s in:
/// the run ends in SIGBUS on a page it cannot read back, within 8 s of the kill (the 2 s
/// timeout, then the deletion of the keys, which waits as long again). Its stderr.
fn sigbus_once_the_store_dies(device: &str, mode: &str, p: &Path, server: libc::pid_t) -> String {
    let mut cmd = randrw_paging_to(device, mode, p);
    let mut killed_at = None;
    let out = common::run_timed_with(&mut cmd, Duration::from_secs(120), |_| {
        std::thread::sleep(Duration::from_millis(2500));
        // SAFETY: kill(2) of a server the calling test started.
        unsafe { libc::kill(server, libc::SIGKILL) };
        killed_at = Some(Instant::now());
    });
    let took = killed_at.expect("the server was killed").elapsed();
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    assert_eq!(out.status.code(), Some(128 + libc::SIGBUS), "{mode}: {err}");
    assert!(err.contains("could not be read from its swap device"), "{mode}: {err}");
    assert!(took < Duration::from_secs(8), "{mode}: the run ended {took:?} after the kill: {err}");
    err
}

/// A program paging to a Redis store that dies (SIGKILL, no replica): its next fault on a page
/// out there ends in SIGBUS within about the failover timeout, said on stderr, in both fault
/// modes, and the run's advice names the device, not the limit. Before, every request queued
/// behind others and every read attempt waited a failover timeout of its own: 90 s after the
/// kill for the default 10 s.
#[test]
fn a_redis_store_that_dies_fails_the_program_within_its_failover_timeout() {
    use uswap::backend::redis::{redis_server_available, LocalRedis};
    if !redis_server_available() {
        skipped("redis-server is not installed (apt-get install redis-server)");
        return;
    }
    let dir = tmpdir("died");
    let p = compile("randrw", &dir, &[]);
    for mode in ["signal", "thread"] {
        let redis = LocalRedis::start(1, 0, &[]).expect("a local redis-server starts");
        let server = redis.pid(0).expect("the server runs") as libc::pid_t;
        let device = format!("{}?failover_ms=2000", redis.url(0));
        let err = sigbus_once_the_store_dies(&device, mode, &p, server);
        // Said when the program stalled most of its run (it usually did).
        if let Some(advice) = err.lines().find(|l| l.contains("waited for memory")) {
            assert!(advice.contains("ended by SIGBUS") && !advice.contains("--limit"), "{mode}: {advice}");
        }
    }
}

/// Signal mode bets that a page a read fault brings back leaves again unwritten (clean:
/// write-protected, keeping its slot, dropped by reclaim without being compressed again),
/// while the bet wins (`uswap/src/state/clean_bets.rs`): a program that only reads its
/// pages back has most of them dropped clean; one that writes every page it reads loses its
/// first bets and stops betting, so that few of its writes take a write-protect fault (a
/// SIGBUS round trip each). `randrw` checks every byte.
#[test]
fn signal_mode_keeps_pages_read_back_clean_while_the_bet_wins() {
    let dir = tmpdir("clean-bets");
    let p = compile("randrw", &dir, &[]);
    for writes in ["0", "256"] {
        let prog = [p.to_str().unwrap(), "64", "200000", "1", writes];
        let (o, v) = uswap_run(16, &["--fault-mode", "signal"], &prog, &dir);
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(o.status.success(), "writes {writes}/256: {}\n{err}", o.status);
        assert_eq!(o.stdout, plain(&prog).stdout, "writes {writes}/256: {err}");
        let (majflt, clean, wp) = (counter(&v, "pgmajfault"), counter(&v, "swpout_clean"), counter(&v, "pgfault_wp"));
        assert!(majflt > 100_000, "writes {writes}/256: {v}");
        if writes == "0" {
            assert!(clean >= majflt / 2, "reads only: {clean} pages dropped clean for {majflt} major faults: {v}");
        } else {
            assert!(wp <= majflt / 8, "every page written: {wp} write-protect faults for {majflt} major faults: {v}");
        }
    }
}

/// A program paging to a Redis Cluster whose node dies (three primaries, no replica, one
/// SIGKILLed): its next fault on a page of that node's slots ends in SIGBUS within about
/// the failover timeout, in both fault modes, as on a single store (the requests for that
/// node's slots share its failover episode: before, each waited a timeout of its own, and
/// the run ended 18 s after the kill for a timeout of 2 s). The run's keys are deleted from
/// the nodes that live, and the one that died is named. A node that has marked the dead
/// one failed by then (the node timeout, 2 s, races the run's end) answers `CLUSTERDOWN`
/// to every key command: its keys stay, and the report must name it with that reason
/// (it said "failed or took too long" before, and this test failed on the race).
#[test]
fn a_redis_cluster_node_that_dies_fails_the_program_within_its_failover_timeout() {
    use uswap::backend::redis::{redis_server_available, LocalRedis};
    if !redis_server_available() {
        skipped("redis-server is not installed (apt-get install redis-server)");
        return;
    }
    let dir = tmpdir("cluster-died");
    let p = compile("randrw", &dir, &[]);
    for mode in ["signal", "thread"] {
        let redis = LocalRedis::start_cluster(3, 0).expect("a local redis cluster starts");
        let dead = redis.primary_index(0);
        let server = redis.pid(dead).expect("the node runs") as libc::pid_t;
        let device = format!("{}?failover_ms=2000", redis.cluster_url());
        let err = sigbus_once_the_store_dies(&device, mode, &p, server);
        assert!(err.contains(&format!("lost the cluster node {}", redis.addr(dead))), "{mode}: {err}");
        let not_deleted = err.lines().find(|l| l.contains("could not delete")).unwrap_or_default();
        assert!(not_deleted.contains("redis-cluster://") && not_deleted.contains(&redis.addr(dead)), "{mode}: {err}");
        for k in (0..redis.len()).filter(|&k| k != dead) {
            let (addr, nr_keys) = (redis.addr(k), dbsize(&redis.addr(k)));
            let said = format!("{addr}: deleting keys: ");
            let down = not_deleted.split("; ").any(|part| part.contains(&said) && part.contains("CLUSTERDOWN"));
            assert!(nr_keys == 0 || down, "{mode}: {nr_keys} keys left on {addr}, not said why: {err}");
        }
    }
}

/// A program paging to a Redis Cluster (`redis-cluster://`, three primaries with a replica
/// each, created on 127.0.0.1): same output as without uswap in both fault modes, and no
/// key left on any node once it has ended (`uswap run` deletes the run's session from
/// every primary).
#[test]
fn a_program_pages_to_a_redis_cluster_and_leaves_no_key_behind() {
    use uswap::backend::redis::{redis_server_available, LocalRedis};
    if !redis_server_available() {
        skipped("redis-server is not installed (apt-get install redis-server)");
        return;
    }
    let redis = LocalRedis::start_cluster(3, 1).expect("a local redis cluster starts");
    let dir = tmpdir("redis-cluster");
    let p = compile("threads", &dir, &[]);
    let prog = [p.to_str().unwrap(), &WSS_MIB.to_string(), "4"];
    let device = format!("{}?replicas=1&size=256MiB", redis.cluster_url());
    for mode in ["thread", "signal"] {
        let r = uswap_run(LIMIT_MIB, &["--fault-mode", mode, "--device", &device], &prog, &dir);
        assert_same_and_paged(&prog, &r, LIMIT_MIB);
        assert_eq!(counter(&r.1, "fault_error"), 0, "{}", r.1);
        for k in 0..redis.len() {
            assert_eq!(dbsize(&redis.addr(k)), 0, "{mode}: keys left on {}", redis.addr(k));
        }
    }
}

/// Lazy start (issue 43): the processes of a tree that never need a pager (a shell, its
/// `true`s) run without one, and a program whose heap passes `--start-after` gets one then:
/// the pages it wrote before are taken over and paged like the others (`grow` checks every
/// byte). A process that waits for its pager costs little more CPU to start than the
/// library loaded and switched off (`USWAP_DISABLE`); one that builds its pager before
/// `main` (`--start-after 0`) costs milliseconds more, which is what this test would catch.
#[test]
fn processes_start_their_pager_only_when_they_need_one() {
    let dir = tmpdir("lazy");
    let p = compile("grow", &dir, &[]);
    let script = format!("for i in $(seq 50); do /bin/true; done; '{}' 64", p.display());
    let prog = ["sh", "-c", script.as_str()];
    let (o, v) = uswap_run(LIMIT_MIB, &[], &prog, &dir);
    assert!(o.status.success(), "{}\n{}", o.status, String::from_utf8_lossy(&o.stderr));
    assert_eq!(o.stdout, plain(&prog).stdout);
    assert_eq!(counter(&v, "processes"), 1, "only grow needs a pager: {v}");
    // A lazy start outside any signal handler keeps signal mode (the rewrite's check of the
    // stack finds nothing to resume inside the code it replaces).
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert!(!stderr.contains("thread mode"), "{stderr}");
    assert!(counter(&v, "pswpout") > 0, "{v}");
    assert!(counter(&v, "resident_peak_bytes") <= LIMIT_MIB << 20, "{v}");
    // Start-up, in CPU time (what the processes spent, whatever else shares the machine):
    // a shell running /bin/true 60 times, with the library in every process.
    const RUNS: u32 = 60;
    let loop_of_trues = format!("i=0; while [ $i -lt {RUNS} ]; do /bin/true; i=$((i+1)); done");
    let batch_cpu_ms = |env: &[(&str, &str)]| -> f64 {
        let mut cmd = Command::new("sh");
        cmd.args(["-c", &loop_of_trues]).env("LD_PRELOAD", preload()).env("USWAP_LIMIT", format!("{LIMIT_MIB}MiB"));
        for (k, val) in env {
            cmd.env(k, val);
        }
        let (status, cpu_ms) = cpu_time_of(&mut cmd, Duration::from_secs(60));
        assert!(status == 0, "the loop of /bin/true failed: wait status {status:#x}");
        cpu_ms
    };
    let least = |env: &[(&str, &str)]| (0..3).map(|_| batch_cpu_ms(env)).fold(f64::INFINITY, f64::min);
    let off = least(&[("USWAP_DISABLE", "1")]);
    // Signal mode, `uswap run`'s default: its rewrite of the C library comes with the pager.
    let waiting = least(&[("USWAP_FAULT_MODE", "signal")]);
    let eager = least(&[("USWAP_FAULT_MODE", "signal"), ("USWAP_START_AFTER", "0")]);
    let (over_ms, eager_ms) = ((waiting - off) / f64::from(RUNS), (eager - off) / f64::from(RUNS));
    assert!(
        // (0.17 ms on a quiet machine, 0.67 ms beside the other tests; before `main`: 3.5-4 ms)
        over_ms <= 1.0 && over_ms * 3.0 < eager_ms,
        "a process that needs no pager spent {over_ms:.2} ms of CPU more than with the library switched off \
         (one that builds its pager before main: {eager_ms:.2} ms)"
    );
}

/// Runs `cmd` to its end (killed after `limit`) and returns its wait status and the CPU
/// time, user and system, that it and the children it waited for spent, in ms. Reaped by
/// `wait4`, which reports that time, not by `Child::wait`.
#[allow(clippy::zombie_processes)]
fn cpu_time_of(cmd: &mut Command, limit: Duration) -> (i32, f64) {
    let child = cmd.stdin(Stdio::null()).spawn().expect("spawn");
    let pid = child.id() as libc::pid_t;
    let (done_tx, done_rx) = std::sync::mpsc::channel::<()>();
    let watchdog = std::thread::spawn(move || {
        if done_rx.recv_timeout(limit).is_err() {
            // SAFETY: kill sends a signal; the child is not reaped yet, so its pid is ours.
            unsafe { libc::kill(pid, libc::SIGKILL) };
            panic!("{pid} ran past {limit:?}");
        }
    });
    let mut status = 0;
    // SAFETY: an all-zero rusage is a valid value for wait4 to fill.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: waits for our own child, writing `status` and `ru`.
    let r = unsafe { libc::wait4(pid, &mut status, 0, &mut ru) };
    let _ = done_tx.send(());
    let _ = watchdog.join();
    assert_eq!(r, pid, "wait4: {}", std::io::Error::last_os_error());
    let ms = |t: libc::timeval| t.tv_sec as f64 * 1e3 + t.tv_usec as f64 / 1e3;
    (status, ms(ru.ru_utime) + ms(ru.ru_stime))
}

/// A signal handler that allocates past `--start-after` while the program waits in
/// `read(2)`, in signal mode: the rewrite of the C library's code that a signal-mode pager's
/// start makes would send the `read`'s return into rewritten bytes (SIGILL). The stack holds
/// the interrupted call's address, so the pager starts there in thread mode, which rewrites
/// nothing (said on stderr), and the pages the handler writes are paged under the limit
/// (every byte checked). The program's child sends the signal once the program sleeps.
#[test]
fn a_pager_started_in_a_signal_handler_leaves_the_interrupted_call_whole() {
    let dir = tmpdir("handler-start");
    let p = compile("handlerstart", &dir, &[]);
    let prog = [p.to_str().unwrap(), "48"];
    let (o, v) = uswap_run(LIMIT_MIB, &["--fault-mode", "signal"], &prog, &dir);
    assert!(o.status.success(), "{}\n{}", o.status, String::from_utf8_lossy(&o.stderr));
    assert_eq!(o.stdout, plain(&prog).stdout);
    assert!(counter(&v, "processes") >= 1, "{v}");
    assert!(counter(&v, "pswpout") > 0, "the handler's pages were not paged: {v}");
    assert_eq!(counter(&v, "syscall_efault"), 0, "{v}");
    assert!(counter(&v, "resident_peak_bytes") <= LIMIT_MIB << 20, "{v}");
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert!(stderr.contains("runs in thread mode: its pager starts where a signal handler may have"), "{stderr}");
}

/// Signal mode's rewrite of the C library: after the first processes of a tree, a process
/// maps the patched code the first ones kept (its C library's code is that file's pages,
/// shared, not a private copy of each page a jump was written to), and runs as before. The
/// rewrite comes with a pager: each grep starts one as its heap passes `--start-after` (64
/// KiB: its buffer; the default, a sixteenth of the 16 MiB limit, is more heap than grep
/// has), or before `main` with `--start-after 0`.
#[test]
fn processes_of_a_tree_map_the_patched_c_library_the_first_ones_kept() {
    for start_after in [Some("64KiB"), Some("0")] {
        processes_map_the_patched_c_library(start_after);
    }
}

fn processes_map_the_patched_c_library(start_after: Option<&str>) {
    let dir = tmpdir("patched-text");
    let script = "for i in 1 2 3 4 5 6 7 8 9 10; do grep -c 'image\\.text' /proc/self/maps || true; done";
    let prog = ["sh", "-c", script];
    let mut opts = vec!["--fault-mode", "signal"];
    opts.extend(start_after.iter().flat_map(|s| ["--start-after", s]));
    let (o, _) = uswap_run(LIMIT_MIB, &opts, &prog, &dir);
    assert!(o.status.success(), "{}\n{}", o.status, String::from_utf8_lossy(&o.stderr));
    let out = String::from_utf8_lossy(&o.stdout);
    let counts: Vec<&str> = out.lines().collect();
    assert_eq!(counts.len(), 10, "one line per grep: {out}");
    assert!(counts.iter().all(|c| *c == "0" || *c == "1"), "{out}");
    // A process maps the kept code only where its trampolines fit at the distance the image
    // was made for: where the libraries around the C library lie moves with the gap the
    // loader leaves below a 2 MiB-aligned one, and a process whose place is taken patches as
    // the first one did and keeps its own layout. A lazily started process reserves the
    // place as the library loads, before the program maps its own files (without that, 1 to
    // 8 of 10 fit, in two sittings); 8-9 of 10 fit in the runs seen, either way.
    let mapped = counts.iter().filter(|c| **c == "1").count();
    assert!(mapped >= 5, "{mapped} of 10 processes mapped the kept code: {out}");
}

/// A named swap file keeps none of the program's memory once `uswap run` ends (docs/devices.md:
/// "emptied ... so no swapped memory stays in it"): its processes exit without dropping their
/// pagers, so `uswap run` erases the file. The program swapped to it (its output is the plain
/// run's), and afterwards every byte of the file reads zero and no block of it is allocated.
/// A file that was there before the run stays, emptied; one the run created is removed (it
/// left a file of half the RAM's apparent size behind).
#[test]
fn a_named_swap_file_is_erased_when_the_run_ends() {
    let dir = tmpdir("namedswap");
    let p = compile("randrw", &dir, &[]);
    let prog = [p.to_str().unwrap(), "64", "20000"];
    let expect = plain(&prog).stdout;
    let swap_run = |swap: &Path| {
        let device = format!("file:{}:256MiB", swap.display());
        let (o, v) = uswap_run(16, &["--device", device.as_str()], &prog, &dir);
        assert!(o.status.success(), "{}\n{}", o.status, String::from_utf8_lossy(&o.stderr));
        assert_eq!(o.stdout, expect, "{}", String::from_utf8_lossy(&o.stderr));
        assert!(counter(&v, "pswpout") > 1000, "the program did not swap to the file: {v}");
        String::from_utf8_lossy(&o.stderr).into_owned()
    };
    // There before the run (as the device asks: only its owner may read and write it).
    let swap = dir.join("swapfile");
    let _ = std::fs::remove_file(&swap);
    use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
    std::fs::OpenOptions::new().write(true).create_new(true).mode(0o600).open(&swap).unwrap();
    let stderr = swap_run(&swap);
    let meta = std::fs::metadata(&swap).expect("the swap file stays, emptied");
    assert_eq!(meta.blocks(), 0, "{} blocks of the swap file still allocated: {stderr}", meta.blocks());
    let bytes = std::fs::read(&swap).unwrap();
    assert!(bytes.iter().all(|&b| b == 0), "the swap file still holds data");
    // Not there before the run: the pager creates it, the run removes it.
    let created = dir.join("swapfile-new");
    let _ = std::fs::remove_file(&created);
    let stderr = swap_run(&created);
    assert!(!created.exists(), "the swap file the run created is left behind: {stderr}");
}

/// A process of the tree that cannot see the run's directory (a sandbox's private `/tmp`;
/// made here as root by a mount namespace with a file system mounted over `uswap run`'s
/// `TMPDIR`, otherwise by an environment naming a directory that is not there) pages under a
/// limit of its own and says so on stderr, with what to do: neither its notes nor its
/// record can reach the run, whose figures leave it out. With `TMPDIR` set to a directory
/// the sandbox shares, as the message advises, it is one of the tree again.
#[test]
fn a_process_that_cannot_see_its_runs_directory_says_so() {
    let dir = tmpdir("outofreach");
    let p = compile("randrw", &dir, &[]);
    let prog = [p.to_str().unwrap(), "64", "20000"];
    let expect = plain(&prog).stdout;
    // SAFETY: geteuid cannot fail.
    let root = unsafe { libc::geteuid() } == 0;
    let hidden = dir.join("hidden-tmp");
    std::fs::create_dir_all(&hidden).unwrap();
    // Searchable by all, or `uswap run` under root passes TMPDIR over for /tmp (`dir`).
    use std::os::unix::fs::PermissionsExt;
    for d in [&*dir, &*hidden] {
        std::fs::set_permissions(d, std::fs::Permissions::from_mode(0o755)).unwrap();
    }
    let namespaces = root && Command::new("unshare").args(["-m", "true"]).status().is_ok_and(|s| s.success());
    let script = r#"mount -t tmpfs uswap-test "$1" && shift && exec "$@""#;
    let run = |tmp: &Path, sandbox: bool| {
        let stats = dir.join("stats-outofreach.json");
        let _ = std::fs::remove_file(&stats);
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_uswap"));
        cmd.env("USWAP_PRELOAD_LIB", preload()).env("TMPDIR", tmp).args(["run", "--limit", "16MiB", "--stats-json"]);
        cmd.arg(&stats).arg("--");
        match (sandbox, namespaces) {
            (false, _) => cmd.args(prog),
            (true, true) => cmd.args(["unshare", "-m", "sh", "-c", script, "sh"]).arg(&hidden).args(prog),
            (true, false) => cmd.args(["env", "USWAP_STATS_DIR=/nonexistent-uswap-run/tree-0"]).args(prog),
        };
        let o = run_timed(&mut cmd, Duration::from_secs(300));
        let v: Value = std::fs::read(&stats).ok().and_then(|b| serde_json::from_slice(&b).ok()).unwrap_or(Value::Null);
        (o, v)
    };
    let (o, v) = run(&hidden, true);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "{}: {err}", o.status);
    assert_eq!(o.stdout, expect, "{err}");
    assert_eq!(err.matches("cannot reach its run's directory").count(), 1, "{err}");
    let named = if namespaces { hidden.display().to_string() } else { "/nonexistent-uswap-run/tree-0".into() };
    assert!(err.contains(&format!("directory {named}")), "{err}");
    assert!(err.contains("a limit of its own, 16 MiB") && err.contains("give uswap run a TMPDIR"), "{err}");
    assert_eq!(counter(&v, "processes"), 0, "the run counted a process it cannot see: {v}");
    if !namespaces {
        skipped("a sandbox's private /tmp (a mount namespace, unshare -m) needs root: the out-of-reach directory was only named");
        return;
    }
    // The advice followed: uswap run's directory in one the sandbox shares (the test's).
    let (o, v) = run(&dir, true);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "{}: {err}", o.status);
    assert_eq!(o.stdout, expect, "{err}");
    assert!(!err.contains("cannot reach"), "{err}");
    assert!(counter(&v, "pswpout") > 1000, "the sandboxed program was not paged for the tree: {v}");
}

/// Paths the tree must survive: uswap's library installed under a path with a space (a
/// virtual environment in "My Project"), which the dynamic loader would split in
/// `LD_PRELOAD` (it is named through a link in the run's directory), and a relative
/// `TMPDIR`, which named another directory for each process that changed its working
/// directory (it is made absolute). Both times the program is paged for the tree.
#[test]
fn a_library_path_with_a_space_and_a_relative_tmpdir_keep_the_tree() {
    let dir = tmpdir("oddpaths");
    let p = compile("randrw", &dir, &[]);
    let expect = plain(&[p.to_str().unwrap(), "64", "20000"]).stdout;
    let spaced = dir.join("My Project");
    std::fs::create_dir_all(&spaced).unwrap();
    let lib = copy_libraries(&spaced);
    std::fs::create_dir_all(dir.join("tmp")).unwrap();
    let stats = dir.join("stats-oddpaths.json");
    let script = r#"cd / && printf '%s\n' "$LD_PRELOAD" >&2 && exec "$@""#;
    for (library, tmp) in [(&lib, std::env::temp_dir()), (&preload(), PathBuf::from("tmp"))] {
        let _ = std::fs::remove_file(&stats);
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_uswap"));
        cmd.env("USWAP_PRELOAD_LIB", library).env("TMPDIR", &tmp).current_dir(&dir);
        cmd.args(["run", "--limit", "16MiB", "--stats-json"]).arg(&stats).args(["--", "sh", "-c", script, "sh"]);
        let o = run_timed(cmd.arg(&p).args(["64", "20000"]), Duration::from_secs(300));
        let err = String::from_utf8_lossy(&o.stderr);
        let what = format!("library {}, TMPDIR {}", library.display(), tmp.display());
        assert!(o.status.success(), "{what}: {}: {err}", o.status);
        assert_eq!(o.stdout, expect, "{what}: {err}");
        assert!(!err.contains("cannot be preloaded") && !err.contains("cannot reach"), "{what}: {err}");
        let first = err.lines().next().unwrap_or_default();
        assert!(first.starts_with('/') && !first.contains(' '), "{what}: LD_PRELOAD {first:?}");
        let v: Value = serde_json::from_slice(&std::fs::read(&stats).unwrap()).unwrap();
        assert!(counter(&v, "pswpout") > 1000, "{what}: the program was not paged: {v}");
    }
}

/// A program run under a library that fakes the clock (libfaketime, `faketime '2020-01-01'`:
/// test suites that fix the date) is paged in both modes, every byte kept. Its
/// `clock_gettime`, which every caller in the process binds, returned a monotonic clock of
/// the faked date's seconds, whose epochs overflowed a slot's stamp: the first page out
/// ended the program. The engine reads the C library's own clock.
#[test]
fn a_program_under_a_faked_clock_is_paged() {
    let dir = tmpdir("fakeclock");
    let lib = compile("fakeclock", &dir, &["-shared", "-fPIC", "-ldl"]);
    let p = compile("randrw", &dir, &[]);
    let prog = [p.to_str().unwrap(), "64", "20000"];
    let expect = plain(&prog).stdout;
    let stats = dir.join("stats-fakeclock.json");
    for mode in ["signal", "thread"] {
        let _ = std::fs::remove_file(&stats);
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_uswap"));
        cmd.env("USWAP_PRELOAD_LIB", preload()).env("LD_PRELOAD", &lib);
        cmd.args(["run", "--limit", "16MiB", "--fault-mode", mode, "--idle-age", "2s", "--stats-json"]);
        let o = run_timed(cmd.arg(&stats).arg("--").args(prog), Duration::from_secs(300));
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(o.status.success(), "{mode}: {}: {err}", o.status);
        assert_eq!(o.stdout, expect, "{mode}: {err}");
        let v: Value = serde_json::from_slice(&std::fs::read(&stats).unwrap()).unwrap();
        assert!(counter(&v, "pswpout") > 1000, "{mode}: the program was not paged: {v}");
    }
    // The background reclaimer's ticks, timed by the kernel (std's timed park read the faked
    // clock and slept for decades): without pressure, only its aging scan sends out the 56
    // MiB a program leaves alone for 10 s under `--idle-age 2s` (all of it in 3 runs of 3;
    // over 6 s, 19-41 MiB, and the bound of 32 failed now and then, with or without the
    // faked clock).
    let phases = compile("phases", &dir, &[]);
    let _ = std::fs::remove_file(&stats);
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_uswap"));
    cmd.env("USWAP_PRELOAD_LIB", preload()).env("LD_PRELOAD", &lib);
    cmd.args(["run", "--limit", "512MiB", "--idle-age", "2s", "--stats-json"]).arg(&stats).arg("--");
    let o = run_timed(cmd.arg(&phases).args(["64", "8", "10"]), Duration::from_secs(300));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "idle aging: {}: {err}", o.status);
    let v: Value = serde_json::from_slice(&std::fs::read(&stats).unwrap()).unwrap();
    assert!(counter(&v, "swpout_idle") * 4096 >= 32 << 20, "idle pages not sent out: {v}");
}

/// A program run with an rtld-audit library (`LD_AUDIT`: sotruss, latrace) starts and is
/// paged, every byte kept. With an auditor the dynamic loader allocates while it relocates
/// itself, before the C library starts; uswap's allocator then looked up the C library's
/// `malloc` through the loader (`dlopen`), whose own PLT was not bound yet: every such
/// process died of SIGSEGV before `main`, with `USWAP_DISABLE` too (on glibc 2.34 to 2.40;
/// from 2.41 the loader relocates itself before it uses the program's `malloc`). The
/// auditor says it was loaded: the loader runs a program without one it could not load.
#[test]
fn a_program_under_an_rtld_auditor_runs_and_is_paged() {
    let dir = tmpdir("audit");
    let auditor = compile("audit", &dir, &["-shared", "-fPIC"]);
    let p = compile("randrw", &dir, &[]);
    let prog = [p.to_str().unwrap(), "64", "20000"];
    let expect = plain(&prog).stdout;
    let stats = dir.join("stats-audit.json");
    let _ = std::fs::remove_file(&stats);
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_uswap"));
    cmd.env("USWAP_PRELOAD_LIB", preload()).env("LD_AUDIT", &auditor);
    cmd.args(["run", "--limit", "16MiB", "--stats-json"]).arg(&stats).arg("--").args(prog);
    let o = run_timed(&mut cmd, Duration::from_secs(300));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "{}: {err}", o.status);
    assert_eq!(o.stdout, expect, "{err}");
    assert!(err.contains("test auditor loaded"), "the auditor was not loaded: {err}");
    let v: Value = serde_json::from_slice(&std::fs::read(&stats).unwrap()).unwrap();
    assert!(counter(&v, "pswpout") > 1000, "the program was not paged: {v}");
    // The library standing aside (`USWAP_DISABLE`) is loaded all the same, and so crashed.
    let o = run_timed(
        Command::new(&p)
            .args(["64", "20000"])
            .env("LD_AUDIT", &auditor)
            .env("LD_PRELOAD", preload())
            .env("USWAP_DISABLE", "1"),
        Duration::from_secs(120),
    );
    assert!(o.status.success(), "USWAP_DISABLE: {}: {}", o.status, String::from_utf8_lossy(&o.stderr));
    assert_eq!(o.stdout, expect);
    // Before uswap's constructor a library's clears the environment (the C library's
    // `__environ`, read to tell that it has started) and allocates 1 MiB, more than the
    // static area holds; the program defines an `environ` of its own.
    let lib = compile("earlyenv", &dir, &["-shared", "-fPIC", "-DLIB"]);
    std::fs::rename(&lib, dir.join("libearlyenv.so")).unwrap();
    let early = compile("earlyenv", &dir, &["-L", dir.to_str().unwrap(), "-learlyenv", "-Wl,-rpath,$ORIGIN"]);
    let (o, _) = uswap_run(16, &[], &[early.to_str().unwrap()], &dir);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "{}: {err}", o.status);
    assert_eq!(String::from_utf8_lossy(&o.stdout), "ok set 7\n", "{err}");
}

/// A library loaded with `RTLD_DEEPBIND` (PHP loads its extensions so) frees the program's
/// blocks and the program the library's, in both modes: the library is loaded without the
/// flag, said once at the end, and still found by a bare name through the program's
/// RUNPATH (the C library searches the calling object's, which the interposed `dlopen`
/// leaves the program's). Before, the library's `free` was the C library's, which aborted
/// on uswap's block ("double free or corruption").
#[test]
fn libraries_loaded_with_deep_binding_share_the_programs_heap() {
    let dir = tmpdir("deepbind");
    let lib = compile("deepbind", &dir, &["-shared", "-fPIC", "-DLIB"]);
    std::fs::rename(&lib, dir.join("libdeepbind.so")).unwrap();
    let prog = compile("deepbind", &dir, &["-ldl", "-Wl,-rpath,$ORIGIN", "-Wl,--enable-new-dtags"]);
    for mode in ["signal", "thread"] {
        let (o, v) = uswap_run(LIMIT_MIB, &["--fault-mode", mode], &[prog.to_str().unwrap(), "48"], &dir);
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(o.status.success(), "{mode}: {err}");
        assert_eq!(String::from_utf8_lossy(&o.stdout), "ok\n", "{mode}: {err}");
        assert_eq!(err.matches("without the RTLD_DEEPBIND they asked for").count(), 1, "{mode}: {err}");
        assert!(err.contains("libdeepbind.so"), "{mode}: {err}");
        assert!(counter(&v, "pswpout") > 0, "{mode}: the heap was not paged: {v}");
    }
}

/// `mincore` over a large range in signal mode makes ready only its vector, a byte a page:
/// before, the rule readied as many bytes as the range (64 MiB behind a vector of 16 KiB),
/// which brought in and charged 64 MiB of the heap the program never used. The answers are
/// the kernel's: the written part in RAM, the rest not (but the window that the writes'
/// fault-around mapped ahead).
#[test]
fn mincore_of_a_large_range_makes_only_its_vector_ready() {
    let dir = tmpdir("mincore");
    let p = compile("mincore", &dir, &[]);
    for mode in ["signal", "thread"] {
        let (o, v) = uswap_run(256, &["--fault-mode", mode], &[p.to_str().unwrap(), "64", "8"], &dir);
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(o.status.success(), "{mode}: {err}");
        let out = String::from_utf8_lossy(&o.stdout);
        let rest: u64 = out.trim().rsplit(' ').next().and_then(|n| n.parse().ok()).unwrap_or(u64::MAX);
        // Past the written part, only what a sequential stream's fault-around mapped ahead.
        assert!(out.starts_with("written part 2048 of 2048 pages in RAM") && rest <= 64, "{mode}: {out}");
        let peak = counter(&v, "resident_peak_bytes");
        assert!(peak <= 12 << 20, "{mode}: resident peak {peak} for 8 MiB written: {v}");
    }
}

/// A program that moves its own break (`sbrk`, `brk`, `syscall(SYS_brk)`) gets one of its
/// own, with what the kernel's promises: the C library's heap, which is the real break,
/// serves uswap's threads, and stress-ng's brk stressor, which sets its break back where it
/// began, cut their blocks (SIGSEGV, then "realloc(): invalid next size"). Before, the
/// program also grew its break past the data limit it set, which uswap had raised for its
/// own reservations. The program checks each promise, then moves its break a page at a
/// time for 3 s while its buffer, four times the limit, is paged; the break's memory is
/// named as the program's break in the report of unmanaged memory.
#[test]
fn programs_that_move_their_own_break_keep_it_and_every_byte() {
    run_in_both_modes("brk", WSS_MIB, |mode, _, (o, v)| {
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(o.status.success(), "{mode}: {err}");
        assert_eq!(String::from_utf8_lossy(&o.stdout), "ok\n", "{mode}: {err}");
        assert!(counter(v, "pswpout") > 0, "{mode}: the buffer was not paged: {v}");
        assert!(err.contains("the program's own break (brk, sbrk)"), "{mode}: {err}");
    });
}

/// A program that serves a mapping's faults with a userfaultfd of its own (a VMM restoring a
/// snapshot, CRIU, QEMU's postcopy) could not register it: uswap had, and a range has one
/// userfaultfd ("UFFDIO_REGISTER (errno 16)"). Now uswap lets go of the range and the
/// registration is made again: the program's thread serves every page of it, the rest of
/// its memory stays paged, and the report names the range.
#[test]
fn a_program_with_a_userfaultfd_of_its_own_serves_its_faults() {
    run_in_both_modes("ownuffd", WSS_MIB, |mode, _, (o, v)| {
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(o.status.success(), "{mode}: {err}");
        assert_eq!(String::from_utf8_lossy(&o.stdout), "ok 2048\n", "{mode}: {err}");
        assert!(counter(v, "pswpout") > 0, "{mode}: the buffer was not paged: {v}");
        assert!(
            err.contains("8MiB in 1 mapping (process ")
                && err.contains("): registered with the program's own userfaultfd"),
            "{mode}: {err}"
        );
    });
}

/// A sandboxed child (OpenSSH's, a browser's) installs a seccomp filter that allows only
/// `write`, `close` and `exit_group`, and ends with `_exit` or `exit`: uswap's report at
/// exit (`getpid`, `/proc/self/maps`, a new file) died of `SIGSYS` where the child exited 0.
/// Now a process with a filter ends with nothing but `exit_group`; the parent's memory is
/// still paged and every byte kept. Thread mode only: in signal mode the filtered thread's
/// own faults on pages that are out need calls of uswap's that the filter forbids
/// (docs/cli.md, "A program's own seccomp filter").
#[test]
fn a_child_under_its_own_seccomp_filter_exits_as_it_would_without_uswap() {
    run_in_modes("seccomp", WSS_MIB, &["thread"], |mode, _, (o, v)| {
        let err = String::from_utf8_lossy(&o.stderr);
        let out = String::from_utf8_lossy(&o.stdout);
        assert!(o.status.success(), "{mode}: {out}{err}");
        assert_eq!(out, "ok 8\n", "{mode}: {err}");
        assert!(counter(v, "pswpout") > 0, "{mode}: the buffer was not paged: {v}");
    });
}

/// Threads that map memory and unmap its head and tail to align it, as Erlang's allocators
/// do with their carriers: the addresses one thread frees go to another's next mapping at
/// once. The kernel sends a `munmap`'s event after it has freed the addresses, and the
/// engine applies it after that; applied to the new region made there meanwhile, it took
/// its pages, and in signal mode its first touch killed the process with SIGBUS (Erlang's
/// `erl` died so in most runs, even under a limit it never reached). Now every page of
/// every mapping and of the paged buffer reads back.
#[test]
fn addresses_unmapped_by_one_thread_and_mapped_by_another_stay_managed() {
    run_in_both_modes("carriers", WSS_MIB, |mode, _, (o, v)| {
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(o.status.success(), "{mode}: {} {err}", o.status);
        assert_eq!(String::from_utf8_lossy(&o.stdout), "ok\n", "{mode}: {err}");
        assert!(counter(v, "pswpout") > 0, "{mode}: the buffer was not paged: {v}");
        // The heads and tails went as events: the race was there to lose. (A wait that gave
        // up each time, as a count stuck above zero makes it, would take this run past its
        // timeout: a second for each of some 4,000 mappings.)
        assert!(counter(v, "uffd_unmap") > 0, "{mode}: no partial unmap reached the engine: {v}");
    });
}

/// Thread mode: datagrams between two heap buffers of 128 MiB under 16 MiB, then a copy of
/// one into the other with `process_vm_readv` on the process itself (`pvmself.c`). The
/// kernel pins up to 4 MiB of the pages the copy reads at a time, and `UFFDIO_MOVE` refuses
/// them (`EBUSY`). The datagrams left the source's readahead in its random mode, so those
/// pages came in one by one, first in line for reclaim. Each charge that met a refusal went
/// over the limit at once, and the refused pages were asked again and again: 22 MiB
/// resident and 199,000 refusals for 32,768 pages, and `uswap run` blamed fork children,
/// locks or io_uring, none of which the program uses. Now a refused page is kept in a
/// while (the kernel activates a page it cannot unmap) and the charge looks at others.
#[test]
fn thread_mode_holds_its_limit_while_the_kernel_pins_pages_it_copies() {
    const BUF_MIB: u64 = 128;
    run_in_modes("pvmself", BUF_MIB, &["thread"], |mode, _, (o, v)| {
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(o.status.success(), "{mode}: {} {err}", o.status);
        assert_eq!(String::from_utf8_lossy(&o.stdout), "ok\n", "{mode}: {err}");
        assert!(counter(v, "pswpout") > 0, "{mode}: the buffers were not paged: {v}");
        // At most what the kernel pins at once over the limit (seen: 17-18.6 MiB; 22-23 MiB
        // before).
        let peak = counter(v, "resident_peak_bytes");
        assert!(peak <= (LIMIT_MIB + 4) << 20, "{mode}: resident peak {peak}: {v}");
        let pages_copied = (BUF_MIB << 20) / 4096;
        assert!(counter(v, "move_refused") <= 2 * pages_copied, "{mode}: refused again and again: {v}");
    });
}

/// A main thread that ends with `pthread_exit` leaves the process to its other threads, and
/// glibc ends it with `exit(0)` when the last leaves; uswap's threads are glibc's too, so the
/// process never ended (and, its threads blocking every signal, not even on `SIGTERM`). Now
/// it ends with status 0 and its buffered output written, its worker's buffer paged.
#[test]
fn a_program_whose_main_thread_calls_pthread_exit_ends_with_its_last_thread() {
    run_in_both_modes("mainexit", WSS_MIB, |mode, _, (o, v)| {
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(o.status.success(), "{mode}: {err}");
        assert_eq!(String::from_utf8_lossy(&o.stdout), "ok\n", "{mode}: {err}");
        assert!(counter(v, "pswpout") > 0, "{mode}: the buffer was not paged: {v}");
    });
}
