//! An idle pager leaves the machine alone: its background reclaimer wakes a few times a
//! second, not hundreds. A timer wake-up is not free on a busy machine (a sleeping vCPU
//! woken, the program's threads moved between CPUs): the reclaimer's 5 ms tick, kept while
//! it found nothing to do, cost sqlite3 driven through a pipe 15 % of its query rate on
//! 2 vCPUs. Alone in its binary: the count is of every reclaimer thread of the process.

mod common;

use std::time::Duration;

use common::*;
use uswap::{FaultMode, PAGE_SIZE};

/// Voluntary context switches of this process's background reclaimers (`uswap-reclaim`),
/// each a wake-up from a sleep.
fn reclaimer_wakeups() -> u64 {
    let mut total = 0;
    for task in std::fs::read_dir("/proc/self/task").expect("/proc/self/task") {
        let dir = task.expect("a task entry").path();
        let comm = std::fs::read_to_string(dir.join("comm")).unwrap_or_default();
        if comm.trim_end() != "uswap-reclaim" {
            continue;
        }
        let status = std::fs::read_to_string(dir.join("status")).unwrap_or_default();
        let line = status.lines().find(|l| l.starts_with("voluntary_ctxt_switches:"));
        total += line.and_then(|l| l.split_whitespace().nth(1)).and_then(|n| n.parse::<u64>().ok()).unwrap_or(0);
    }
    total
}

/// A pager under its limit, in each fault mode, its pages written and then left alone
/// for 3 s: its background reclaimer wakes at most 15 times a second (its idle period is
/// 100 ms; 200 a second with the old 5 ms tick).
#[test]
fn an_idle_pager_wakes_a_few_times_a_second() {
    for mode in [FaultMode::Thread, FaultMode::Signal] {
        let p = pager(mode, 64 * MIB, 256 * MIB);
        let region = p.map((16 * MIB) as usize).unwrap();
        let words = region.as_atomic_u64s();
        write_every_page(words);
        // The period backs off from 5 ms to 100 ms over the first idle ticks.
        std::thread::sleep(Duration::from_millis(500));
        let before = reclaimer_wakeups();
        std::thread::sleep(Duration::from_secs(3));
        let woken = reclaimer_wakeups() - before;
        assert!(woken > 0, "{mode:?}: no background reclaimer found in /proc/self/task");
        assert!(
            woken <= 45,
            "{mode:?}: the background reclaimer woke {woken} times in 3 s of idleness (at most 45 expected)"
        );
        for i in 0..region.len() / PAGE_SIZE {
            check_page(words, i, 1);
        }
    }
}
