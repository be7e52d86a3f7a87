//! Helpers shared by the CLI's integration tests.

use std::path::Path;

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
