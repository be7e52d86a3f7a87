//! The kernel engines' machine state: everything `kernel-zram` and `kernel-file` need
//! checked before a run (root, the memory controller, zram, no swap already in use, the
//! lock), one run's setup (swap device on, memory cgroup with the limit) and its teardown,
//! which always happens: on success, on error (drop guards) and on Ctrl-C (the runner stops
//! and returns through the same path). A run killed with SIGKILL leaves a record in the lock
//! file; the next run cleans up after it.

pub mod cgroup;
pub mod interrupts;
pub mod lock;
pub mod swapdev;
pub mod vmstat;

use std::path::{Path, PathBuf};

use cgroup::{Hierarchy, Memcg};
use lock::{BenchLock, Record};

use super::engine::{Engine, KernelSwap};
use super::error::BenchError;

/// Held for the whole sitting that uses kernel engines.
#[derive(Debug)]
pub struct KernelSitting {
    lock: BenchLock,
    hierarchy: Hierarchy,
}

pub fn is_root() -> bool {
    // SAFETY: geteuid cannot fail.
    unsafe { libc::geteuid() == 0 }
}

impl KernelSitting {
    /// Checks what `engines` need and takes the lock (waiting for it with `wait_lock`).
    pub fn open(engines: &[&Engine], wait_lock: bool) -> Result<KernelSitting, BenchError> {
        let names: Vec<&str> = engines.iter().map(|e| e.name.as_str()).collect();
        if !is_root() {
            return Err(BenchError::NotRoot { engines: names.join(", ") });
        }
        let zram = engines.iter().any(|e| e.kind == super::engine::EngineKind::Kernel(KernelSwap::Zram));
        if zram && !Path::new(swapdev::ZRAM_SYS).exists() {
            return Err(BenchError::ZramMissing);
        }
        let hierarchy = Hierarchy::detect()?;
        let (mut lock, left) = BenchLock::acquire(wait_lock)?;
        if let Some(left) = left {
            recover(&mut lock, &left)?;
        }
        let swaps = swapdev::active_swaps();
        if !swaps.is_empty() {
            return Err(BenchError::SwapInUse { devices: swaps.join(", ") });
        }
        if zram {
            swapdev::check_zram()?;
        }
        if let Hierarchy::V2 { root, enable: true } = &hierarchy {
            lock.update(|r| r.enabled_memory_in = Some(root.clone()))?;
            cgroup::set_subtree_memory(root, true)?;
        }
        Ok(KernelSitting { lock, hierarchy })
    }

    /// Sets up one run: the swap device (`swap_bytes`, in `swap_dir` for a file) and the
    /// memory cgroup limited to `limit_bytes`.
    pub fn start(
        &mut self,
        kind: KernelSwap,
        swap_bytes: u64,
        limit_bytes: u64,
        swap_dir: &Path,
    ) -> Result<KernelRun<'_>, BenchError> {
        let mut run = KernelRun { sitting: self, kind, swap_file: None, memcg: None, finished: false };
        match kind {
            KernelSwap::Zram => {
                run.sitting.lock.update(|r| r.zram = true)?;
                swapdev::zram_on(swap_bytes)?;
            }
            KernelSwap::File => {
                swapdev::check_space(swap_dir, swap_bytes)?;
                let path = swapdev::swap_file_path(swap_dir);
                run.sitting.lock.update(|r| r.swap_file = Some(path.clone()))?;
                run.swap_file = Some(path.clone());
                swapdev::file_on(&path, swap_bytes)?;
            }
        }
        let dir = Memcg::dir_for(&run.sitting.hierarchy);
        run.sitting.lock.update(|r| r.cgroup = Some(dir))?;
        run.memcg = Some(Memcg::create(&run.sitting.hierarchy, limit_bytes)?);
        Ok(run)
    }
}

impl Drop for KernelSitting {
    fn drop(&mut self) {
        if let Some(root) = self.lock.record().enabled_memory_in.clone() {
            match cgroup::set_subtree_memory(&root, false) {
                Ok(()) => {
                    let _ = self.lock.update(|r| r.enabled_memory_in = None);
                }
                Err(e) => eprintln!("uswap bench: {e}; disable it by hand: `echo -memory > {}`", root.display()),
            }
        }
    }
}

/// One kernel-engine run's swap device and cgroup; [`KernelRun::finish`] tears them down
/// and reports problems, dropping it unfinished tears down and prints them.
#[derive(Debug)]
pub struct KernelRun<'a> {
    sitting: &'a mut KernelSitting,
    kind: KernelSwap,
    swap_file: Option<PathBuf>,
    memcg: Option<Memcg>,
    finished: bool,
}

impl KernelRun<'_> {
    /// What the workload process writes its pid into.
    pub fn procs_path(&self) -> Option<PathBuf> {
        self.memcg.as_ref().map(Memcg::procs_path)
    }

    pub fn oom_kills(&self) -> u64 {
        self.memcg.as_ref().map_or(0, Memcg::oom_kills)
    }

    /// A counter of the run's cgroup `memory.stat`.
    pub fn memcg_stat(&self, key: &str) -> Option<u64> {
        self.memcg.as_ref()?.stat(key)
    }

    /// The run's cgroup's peak charge (see [`Memcg::peak_bytes`]).
    pub fn memcg_peak_bytes(&self) -> Option<u64> {
        self.memcg.as_ref()?.peak_bytes()
    }

    /// zram's peak memory in this run (`mm_stat`'s `mem_used_max`: compressed pages and the
    /// allocator's overhead), read before the device is reset; none for a swap file.
    pub fn zram_used_peak_bytes(&self) -> Option<u64> {
        if self.kind != KernelSwap::Zram {
            return None;
        }
        let mm_stat = std::fs::read_to_string(format!("{}/mm_stat", swapdev::ZRAM_SYS)).ok()?;
        mm_stat.split_whitespace().nth(4)?.parse().ok()
    }

    /// The swap device, as `/proc/swaps` names it.
    pub fn device(&self) -> String {
        match (&self.kind, &self.swap_file) {
            (KernelSwap::File, Some(p)) => p.display().to_string(),
            _ => swapdev::ZRAM_DEV.to_string(),
        }
    }

    pub fn finish(mut self) -> Result<(), BenchError> {
        let problems = self.teardown();
        if problems.is_empty() {
            Ok(())
        } else {
            Err(BenchError::Teardown { problems })
        }
    }

    fn teardown(&mut self) -> Vec<String> {
        if self.finished {
            return vec![];
        }
        self.finished = true;
        let mut problems = vec![];
        if let Some(mut cg) = self.memcg.take() {
            match cg.remove() {
                Ok(()) => {
                    let _ = self.sitting.lock.update(|r| r.cgroup = None);
                }
                Err(e) => problems.push(e),
            }
        } else {
            let _ = self.sitting.lock.update(|r| r.cgroup = None);
        }
        match self.kind {
            KernelSwap::Zram => match swapdev::zram_off() {
                Ok(()) => {
                    let _ = self.sitting.lock.update(|r| r.zram = false);
                }
                Err(e) => problems.push(e),
            },
            KernelSwap::File => {
                if let Some(p) = self.swap_file.take() {
                    match swapdev::file_off(&p) {
                        Ok(()) => {
                            let _ = self.sitting.lock.update(|r| r.swap_file = None);
                        }
                        Err(e) => problems.push(e),
                    }
                }
            }
        }
        problems
    }
}

impl Drop for KernelRun<'_> {
    fn drop(&mut self) {
        for p in self.teardown() {
            eprintln!("uswap bench: cleanup: {p}");
        }
    }
}

/// Undoes what a dead run recorded.
fn recover(lock: &mut BenchLock, left: &Record) -> Result<(), BenchError> {
    let mut done = vec![];
    let mut problems = vec![];
    if let Some(cg) = &left.cgroup {
        match cgroup::remove_dir(cg) {
            Ok(()) => done.push(format!("removed cgroup {}", cg.display())),
            Err(e) => problems.push(e),
        }
    }
    if let Some(f) = &left.swap_file {
        match swapdev::file_off(f) {
            Ok(()) => done.push(format!("swapoff and removed {}", f.display())),
            Err(e) => problems.push(e),
        }
    }
    if left.zram {
        match swapdev::zram_off() {
            Ok(()) => done.push("swapoff and reset zram0".to_string()),
            Err(e) => problems.push(e),
        }
    }
    if let Some(root) = &left.enabled_memory_in {
        match cgroup::set_subtree_memory(root, false) {
            Ok(()) => done.push(format!("disabled the memory controller in {}", root.display())),
            Err(e) => problems.push(e.to_string()),
        }
    }
    eprintln!(
        "uswap bench: a uswap bench (pid {}) died without cleaning up; undone: {}",
        left.pid,
        if done.is_empty() { "nothing".to_string() } else { done.join(", ") }
    );
    if !problems.is_empty() {
        return Err(BenchError::Teardown { problems });
    }
    lock.update(|r| *r = Record { pid: r.pid, ..Default::default() })
}
