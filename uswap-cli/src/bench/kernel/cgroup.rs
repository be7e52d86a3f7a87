//! Memory cgroups for the kernel engines: finding the memory controller (cgroup v2 where its
//! root offers it, else a cgroup v1 hierarchy with it mounted), creating one cgroup per run
//! with the limit, and removing it (killing anything left in it first).

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use crate::bench::error::BenchError;

/// Where the memory controller lives on this machine.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Hierarchy {
    /// cgroup v2 mounted at `root`; `enable` when "memory" is offered in cgroup.controllers
    /// but not yet in cgroup.subtree_control (the run enables it, and disables it after).
    V2 { root: PathBuf, enable: bool },
    /// cgroup v1 hierarchy with the memory controller, mounted at `root`.
    V1 { root: PathBuf },
}

impl Hierarchy {
    pub fn version(&self) -> u8 {
        match self {
            Hierarchy::V2 { .. } => 2,
            Hierarchy::V1 { .. } => 1,
        }
    }

    pub fn root(&self) -> &Path {
        match self {
            Hierarchy::V2 { root, .. } | Hierarchy::V1 { root } => root,
        }
    }

    /// Finds the memory controller from `/proc/self/mountinfo`.
    pub fn detect() -> Result<Hierarchy, BenchError> {
        let mountinfo = std::fs::read_to_string("/proc/self/mountinfo")
            .map_err(|e| BenchError::system("reading the mount table", "/proc/self/mountinfo", e))?;
        Hierarchy::detect_in(&mountinfo, &|p: &Path| std::fs::read_to_string(p).ok())
    }

    /// `read` reads a control file (None: unreadable).
    pub fn detect_in(mountinfo: &str, read: &dyn Fn(&Path) -> Option<String>) -> Result<Hierarchy, BenchError> {
        let mut v2_roots = vec![];
        let mut v1_root = None;
        for line in mountinfo.lines() {
            let Some((pre, post)) = line.split_once(" - ") else { continue };
            let Some(mount_point) = pre.split(' ').nth(4) else { continue };
            let mut post = post.split(' ');
            let (fstype, _source, opts) = (post.next(), post.next(), post.next().unwrap_or(""));
            match fstype {
                Some("cgroup2") => v2_roots.push(PathBuf::from(mount_point)),
                Some("cgroup") if opts.split(',').any(|o| o == "memory") => {
                    v1_root.get_or_insert_with(|| PathBuf::from(mount_point));
                }
                _ => {}
            }
        }
        let has_memory = |s: Option<String>| s.is_some_and(|s| s.split_whitespace().any(|c| c == "memory"));
        for root in &v2_roots {
            if has_memory(read(&root.join("cgroup.controllers"))) {
                let enable = !has_memory(read(&root.join("cgroup.subtree_control")));
                return Ok(Hierarchy::V2 { root: root.clone(), enable });
            }
        }
        if let Some(root) = v1_root {
            return Ok(Hierarchy::V1 { root });
        }
        let v2 = match v2_roots.first() {
            Some(r) => format!("cgroup v2 at {} offers no memory controller", r.display()),
            None => "no cgroup v2 is mounted".to_string(),
        };
        Err(BenchError::NoMemoryCgroup {
            detail: format!(
                "{v2}, and no cgroup v1 hierarchy has the memory controller. Mount one (`mkdir -p \
                 /sys/fs/cgroup/memory && mount -t cgroup -o memory none /sys/fs/cgroup/memory`), or boot with \
                 cgroup v2 and the memory controller enabled, or leave the kernel engines out of --engines"
            ),
        })
    }
}

/// One run's memory cgroup. Removed by [`Memcg::remove`] (or on drop, best effort).
#[derive(Debug)]
pub struct Memcg {
    dir: PathBuf,
    version: u8,
    removed: bool,
}

fn write(path: &Path, value: &str, what: &str) -> Result<(), BenchError> {
    std::fs::write(path, value).map_err(|e| BenchError::system(what.to_string(), path, e))
}

impl Memcg {
    /// The cgroup a run would use (its name carries our pid).
    pub fn dir_for(h: &Hierarchy) -> PathBuf {
        h.root().join(format!("uswap-bench-{}", std::process::id()))
    }

    /// Creates the cgroup with its memory limit; swap stays unlimited so that it swaps
    /// rather than running out of memory.
    pub fn create(h: &Hierarchy, limit_bytes: u64) -> Result<Memcg, BenchError> {
        let dir = Memcg::dir_for(h);
        match std::fs::create_dir(&dir) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
            Err(e) => return Err(BenchError::system("creating the memory cgroup", &dir, e)),
        }
        let cg = Memcg { dir, version: h.version(), removed: false };
        match h {
            Hierarchy::V2 { .. } => {
                write(&cg.dir.join("memory.max"), &limit_bytes.to_string(), "setting the cgroup's memory.max")?;
                // Unlimited by default; the file is absent without swap accounting.
                let swap_max = cg.dir.join("memory.swap.max");
                if swap_max.exists() {
                    write(&swap_max, "max", "letting the cgroup swap (memory.swap.max)")?;
                }
            }
            Hierarchy::V1 { .. } => {
                write(
                    &cg.dir.join("memory.limit_in_bytes"),
                    &limit_bytes.to_string(),
                    "setting the cgroup's memory.limit_in_bytes",
                )?;
            }
        }
        Ok(cg)
    }

    /// The file a process writes its pid into to join.
    pub fn procs_path(&self) -> PathBuf {
        self.dir.join("cgroup.procs")
    }

    /// OOM kills inside the cgroup so far.
    pub fn oom_kills(&self) -> u64 {
        let file = if self.version == 2 { "memory.events" } else { "memory.oom_control" };
        std::fs::read_to_string(self.dir.join(file))
            .ok()
            .and_then(|s| s.lines().find_map(|l| l.strip_prefix("oom_kill ").and_then(|v| v.trim().parse().ok())))
            .unwrap_or(0)
    }

    /// A counter of the cgroup's `memory.stat` (`pgmajfault`, ...), for its own processes.
    pub fn stat(&self, key: &str) -> Option<u64> {
        let text = std::fs::read_to_string(self.dir.join("memory.stat")).ok()?;
        text.lines().find_map(|l| l.strip_prefix(key)?.strip_prefix(' ')?.trim().parse().ok())
    }

    /// The most memory charged to the cgroup at once so far (its resident pages and page
    /// cache): `memory.max_usage_in_bytes` (v1) or `memory.peak` (v2, Linux 5.19 on).
    pub fn peak_bytes(&self) -> Option<u64> {
        let file = if self.version == 2 { "memory.peak" } else { "memory.max_usage_in_bytes" };
        std::fs::read_to_string(self.dir.join(file)).ok()?.trim().parse().ok()
    }

    /// Kills whatever is left in the cgroup, then removes it.
    pub fn remove(&mut self) -> Result<(), String> {
        if self.removed {
            return Ok(());
        }
        remove_dir(&self.dir)?;
        self.removed = true;
        Ok(())
    }
}

impl Drop for Memcg {
    fn drop(&mut self) {
        if let Err(e) = self.remove() {
            eprintln!("uswap bench: {e}");
        }
    }
}

/// Kills the processes in cgroup `dir` and removes it; says what to do by hand if it cannot.
pub fn remove_dir(dir: &Path) -> Result<(), String> {
    if !dir.exists() {
        return Ok(());
    }
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let procs = std::fs::read_to_string(dir.join("cgroup.procs")).unwrap_or_default();
        let pids: Vec<i32> = procs.lines().filter_map(|l| l.trim().parse().ok()).collect();
        for &pid in &pids {
            // SAFETY: kill(2) on a pid read from the cgroup we created.
            unsafe { libc::kill(pid, libc::SIGKILL) };
        }
        if pids.is_empty() {
            match std::fs::remove_dir(dir) {
                Ok(()) => return Ok(()),
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
                Err(e) if Instant::now() >= deadline => {
                    return Err(format!("cannot remove cgroup {} ({e}): `rmdir {}`", dir.display(), dir.display()))
                }
                Err(_) => {}
            }
        } else if Instant::now() >= deadline {
            return Err(format!(
                "processes {pids:?} stay in cgroup {} after SIGKILL: kill them, then `rmdir {}`",
                dir.display(),
                dir.display()
            ));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Enables (`on`) or disables the memory controller for the children of a cgroup v2 root.
pub fn set_subtree_memory(root: &Path, on: bool) -> Result<(), BenchError> {
    write(
        &root.join("cgroup.subtree_control"),
        if on { "+memory" } else { "-memory" },
        "switching the memory controller in cgroup.subtree_control",
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    const V1_AND_V2: &str = "\
35 25 0:30 / /sys/fs/cgroup/unified rw,relatime shared:10 - cgroup2 cgroup2 rw
36 25 0:31 / /sys/fs/cgroup/cpu rw,relatime shared:11 - cgroup cgroup rw,cpu
38 25 0:33 / /sys/fs/cgroup/memory rw,relatime shared:13 - cgroup cgroup rw,memory
22 1 254:0 / / rw,relatime - ext4 /dev/vda rw";

    fn files(controllers: &'static str, subtree: &'static str) -> impl Fn(&Path) -> Option<String> {
        move |p: &Path| match p.file_name()?.to_str()? {
            "cgroup.controllers" => Some(controllers.to_string()),
            "cgroup.subtree_control" => Some(subtree.to_string()),
            _ => None,
        }
    }

    #[test]
    fn v1_memory_is_used_when_v2_has_no_memory_controller() {
        let h = Hierarchy::detect_in(V1_AND_V2, &files("", "")).unwrap();
        assert_eq!(h, Hierarchy::V1 { root: "/sys/fs/cgroup/memory".into() });
    }

    #[test]
    fn v2_memory_is_preferred_and_enabled_when_needed() {
        let h = Hierarchy::detect_in(V1_AND_V2, &files("cpu io memory pids\n", "cpu\n")).unwrap();
        assert_eq!(h, Hierarchy::V2 { root: "/sys/fs/cgroup/unified".into(), enable: true });
        let h = Hierarchy::detect_in(V1_AND_V2, &files("memory\n", "memory pids\n")).unwrap();
        assert_eq!(h, Hierarchy::V2 { root: "/sys/fs/cgroup/unified".into(), enable: false });
    }

    #[test]
    fn no_memory_controller_is_a_clear_error() {
        let only_v2 = "35 25 0:30 / /sys/fs/cgroup rw - cgroup2 cgroup2 rw";
        let e = Hierarchy::detect_in(only_v2, &files("cpu pids", "")).unwrap_err().to_string();
        assert!(e.contains("cgroup v2 at /sys/fs/cgroup offers no memory controller"), "{e}");
        assert!(e.contains("mount -t cgroup -o memory"), "{e}");
    }
}
