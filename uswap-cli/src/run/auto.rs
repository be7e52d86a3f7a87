//! `uswap run --auto[=TARGET]`: the tree's limit moved by the automatic budget's law
//! (`uswap::budget::Budget`, docs/auto-budget.md), in a thread of `uswap run`.
//!
//! Locking: none; the thread reads and writes the shared charge's atomics, and stops (it is
//! joined) before the segment it moves is let go of.

/// `--auto` for a tree: a thread of `uswap run` that moves the tree's limit (the shared
/// charge's, which every pager of the tree reclaims to) by the law of
/// [`uswap::budget::Budget`], on the tree's stall clock (the union of its processes'
/// stalls, kept in the segment). The processes' own limits stay at the ceiling.
pub(super) struct TreeBudget {
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    thread: std::thread::JoinHandle<u64>,
}

impl TreeBudget {
    /// How often the thread looks (the law moves once a second).
    const POLL: std::time::Duration = std::time::Duration::from_millis(100);

    pub(super) fn start(
        tree: &'static uswap::shared_charge::SharedCharge,
        target: f64,
        ceiling_bytes: u64,
    ) -> TreeBudget {
        use std::sync::atomic::Ordering;
        let page = uswap::PAGE_SIZE as u64;
        let floor = (uswap::MIN_LIMIT_BYTES / page) as usize;
        let mut law = uswap::budget::Budget::new(target, floor, ((ceiling_bytes / page) as usize).max(floor));
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let stopped = stop.clone();
        let thread = std::thread::spawn(move || {
            // A lower limit is first a goal the pagers' background reclaimers bring the tree
            // down to, and the limit once they have (or a second later): the programs'
            // faults do not reclaim for a probe, whose cost is then what it measures, the
            // pages it took that are in use (with the limit lowered at once, a 23 MiB probe
            // of redis-server cost 40-80 ms of its faults reclaiming, every probe undone).
            let mut pending: Option<(usize, u64)> = None;
            // Bounded: ends when `stop` is set (by `stop`, before the segment goes).
            while !stopped.load(Ordering::Acquire) {
                std::thread::sleep(Self::POLL);
                let now = uswap::pressure::now_us();
                if let Some((goal, since_us)) = pending {
                    if tree.resident_pages.load(Ordering::Acquire) <= goal || now >= since_us + 1_000_000 {
                        tree.limit_pages.store(goal, Ordering::Release);
                        tree.goal_pages.store(0, Ordering::Release);
                        pending = None;
                    }
                }
                let limit = tree.limit_pages.load(Ordering::Acquire);
                let resident = tree.resident_pages.load(Ordering::Acquire);
                let idle = tree.idle_sample.total();
                let Some(next) = law.tick(tree.stall.total_us(now), now, limit, resident, idle) else { continue };
                if next < limit {
                    tree.goal_pages.store(next, Ordering::Release);
                    pending = Some((next, now));
                } else {
                    tree.goal_pages.store(0, Ordering::Release);
                    tree.limit_pages.store(next, Ordering::Release);
                    pending = None;
                }
            }
            // No goal outlives the budget: processes that outlive `uswap run` would wait on it.
            tree.goal_pages.store(0, Ordering::Release);
            tree.limit_pages.load(Ordering::Acquire) as u64 * page
        });
        TreeBudget { stop, thread }
    }

    /// Stops the thread; the limit it held last, in bytes.
    pub(super) fn stop(self) -> u64 {
        self.stop.store(true, std::sync::atomic::Ordering::Release);
        self.thread.join().unwrap_or(0)
    }
}
