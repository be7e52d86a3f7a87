//! The machine description at the top of BENCHMARKS.md: what the figures were measured on,
//! including the kernel settings that change what the kernel engines do.

use crate::bench::kernel::cgroup::Hierarchy;

fn read(path: &str) -> Option<String> {
    std::fs::read_to_string(path).ok().map(|s| s.trim().to_string())
}

/// The bracketed choice of a sysfs list (`always [madvise] never` → `madvise`).
fn chosen(s: &str) -> String {
    s.split_whitespace()
        .find(|w| w.starts_with('['))
        .map(|w| w.trim_matches(|c| c == '[' || c == ']').to_string())
        .unwrap_or_else(|| s.to_string())
}

fn git(args: &[&str]) -> Option<String> {
    let out = std::process::Command::new("git").args(args).output().ok()?;
    out.status.success().then(|| String::from_utf8_lossy(&out.stdout).trim().to_string())
}

/// Markdown lines describing this machine, the build and the sources.
pub fn describe() -> Vec<String> {
    let cpuinfo = read("/proc/cpuinfo").unwrap_or_default();
    let model = cpuinfo
        .lines()
        .find_map(|l| l.strip_prefix("model name").and_then(|r| r.split_once(':')).map(|(_, m)| m.trim().to_string()))
        .unwrap_or_else(|| "unknown CPU".into());
    let vm = cpuinfo.lines().any(|l| l.starts_with("flags") && l.split_whitespace().any(|f| f == "hypervisor"));
    let cpus = std::thread::available_parallelism().map_or(0, |n| n.get());
    let mem_gib = read("/proc/meminfo")
        .and_then(|m| {
            m.lines().find_map(|l| {
                l.strip_prefix("MemTotal:").and_then(|v| v.trim().trim_end_matches(" kB").parse::<u64>().ok())
            })
        })
        .map_or("?".into(), |kb| format!("{:.0}", kb as f64 / (1 << 20) as f64));
    let kernel = read("/proc/sys/kernel/osrelease").unwrap_or_else(|| "?".into());
    let product = read("/sys/class/dmi/id/product_name").filter(|s| !s.is_empty());
    let thp = read("/sys/kernel/mm/transparent_hugepage/enabled").map_or("?".into(), |s| chosen(&s));
    let zswap = read("/sys/module/zswap/parameters/enabled").unwrap_or_else(|| "absent".into());
    let page_cluster = read("/proc/sys/vm/page-cluster").unwrap_or_else(|| "?".into());
    let swappiness = read("/proc/sys/vm/swappiness").unwrap_or_else(|| "?".into());
    let vma_ra = read("/sys/kernel/mm/swap/vma_ra_enabled").unwrap_or_else(|| "?".into());
    let memcg = match Hierarchy::detect() {
        Ok(h) => format!("cgroup v{} at {}", h.version(), h.root().display()),
        Err(_) => "none".into(),
    };
    let commit = git(&["rev-parse", "--short", "HEAD"]).unwrap_or_else(|| "unknown".into());
    let dirty = git(&["status", "--porcelain", "--untracked-files=no"]).is_some_and(|s| !s.is_empty());
    let profile = if cfg!(debug_assertions) {
        "a **debug** build: these figures mean nothing, rebuild with `--release`"
    } else {
        "`cargo build --release`"
    };
    vec![
        format!(
            "**Machine:** {}{model}, {cpus} CPUs, {mem_gib} GiB RAM, Linux {kernel}.",
            match (vm, &product) {
                (_, Some(p)) => format!("{p}, "),
                (true, None) => "virtual machine, ".into(),
                (false, None) => String::new(),
            }
        ),
        format!(
            "**Kernel swap settings:** memory controller {memcg}; vm.swappiness {swappiness}, vm.page-cluster \
             {page_cluster}, VMA readahead {vma_ra}, zswap {zswap}, transparent huge pages {thp} (the workloads \
             ask for none)."
        ),
        format!(
            "**Build:** {profile} ({}), sources at commit {commit}{}.",
            env!("USWAP_RUSTC_VERSION"),
            if dirty { " with local changes" } else { "" }
        ),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sysfs_choices() {
        assert_eq!(chosen("always [madvise] never"), "madvise");
        assert_eq!(chosen("[lzo-rle] lzo lz4"), "lzo-rle");
        assert_eq!(chosen("Y"), "Y");
    }

    #[test]
    fn description_names_the_kernel_and_the_build() {
        let d = describe().join("\n");
        assert!(d.contains("**Machine:**") && d.contains("CPUs") && d.contains("Linux "), "{d}");
        assert!(d.contains("rustc "), "{d}");
    }
}
