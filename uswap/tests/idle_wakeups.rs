//! An idle pager leaves the machine alone: its threads wake a few times a second, not
//! hundreds. A timer wake-up is not free on a busy machine (a sleeping vCPU woken, the
//! program's threads moved between CPUs): the background reclaimer's 5 ms tick, kept while
//! it found nothing to do, cost sqlite3 driven through a pipe 15 % of its query rate on
//! 2 vCPUs. Alone in its binary: the count is of every engine thread of the process.

mod common;

use std::time::Duration;

use common::*;
use uswap::{FaultMode, PAGE_SIZE};

/// Voluntary context switches of this process's engine threads (names `uswap-*`), each a
/// wake-up from a sleep.
fn engine_wakeups() -> u64 {
    let mut total = 0;
    for task in std::fs::read_dir("/proc/self/task").expect("/proc/self/task") {
        let dir = task.expect("a task entry").path();
        let comm = std::fs::read_to_string(dir.join("comm")).unwrap_or_default();
        if !comm.starts_with("uswap-") {
            continue;
        }
        let status = std::fs::read_to_string(dir.join("status")).unwrap_or_default();
        let line = status.lines().find(|l| l.starts_with("voluntary_ctxt_switches:"));
        total += line.and_then(|l| l.split_whitespace().nth(1)).and_then(|n| n.parse::<u64>().ok()).unwrap_or(0);
    }
    total
}

/// A pager under its limit, in each fault mode, its pages written and then left alone
/// for 3 s: its engine threads wake at most 20 times a second in all (the background
/// reclaimer's idle period is 100 ms, a dormant fault handler's 100 ms).
#[test]
fn an_idle_pager_wakes_a_few_times_a_second() {
    for mode in [FaultMode::Thread, FaultMode::Signal] {
        let p = pager(mode, 64 * MIB, 256 * MIB);
        let region = p.map((16 * MIB) as usize).unwrap();
        let words = region.as_atomic_u64s();
        for i in 0..region.len() / PAGE_SIZE {
            write_page(words, i, 1);
        }
        // The period backs off from 5 ms to 100 ms over the first idle ticks.
        std::thread::sleep(Duration::from_millis(500));
        let before = engine_wakeups();
        std::thread::sleep(Duration::from_secs(3));
        let woken = engine_wakeups() - before;
        assert!(woken <= 60, "{mode:?}: engine threads woke {woken} times in 3 s of idleness (at most 60 expected)");
        for i in 0..region.len() / PAGE_SIZE {
            check_page(words, i, 1);
        }
    }
}
