//! The kernel's swap devices for the kernel engines: zram0 with lz4, or a swap file. Each is
//! set up for one run and torn down after it (swapoff, then zram reset or file removal).

use std::ffi::CString;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;

use crate::bench::error::BenchError;
use crate::size::format_size;

pub const ZRAM_DEV: &str = "/dev/zram0";
pub const ZRAM_SYS: &str = "/sys/block/zram0";

/// Devices in `/proc/swaps` (first column).
pub fn active_swaps() -> Vec<String> {
    parse_swaps(&std::fs::read_to_string("/proc/swaps").unwrap_or_default())
}

pub fn parse_swaps(text: &str) -> Vec<String> {
    text.lines().skip(1).filter_map(|l| l.split_whitespace().next()).map(str::to_string).collect()
}

fn cpath(p: &Path) -> CString {
    CString::new(p.as_os_str().as_bytes()).unwrap_or_default()
}

fn sys_write(path: &str, value: &str, what: &str) -> Result<(), BenchError> {
    std::fs::write(path, value).map_err(|e| BenchError::system(what.to_string(), path, e))
}

/// Checks that zram0 exists, is unused and offers lz4.
pub fn check_zram() -> Result<(), BenchError> {
    check_zram_at(Path::new(ZRAM_SYS))
}

/// [`check_zram`] on the sysfs directory `sys` of a zram device.
pub fn check_zram_at(sys: &Path) -> Result<(), BenchError> {
    if !sys.exists() {
        return Err(BenchError::ZramMissing);
    }
    let algos = std::fs::read_to_string(sys.join("comp_algorithm")).unwrap_or_default();
    if !algos.split_whitespace().any(|a| a.trim_matches(|c| c == '[' || c == ']') == "lz4") {
        return Err(BenchError::ZramNoLz4 { available: algos.trim().to_string() });
    }
    let disksize: u64 =
        std::fs::read_to_string(sys.join("disksize")).ok().and_then(|s| s.trim().parse().ok()).unwrap_or(0);
    if disksize != 0 {
        return Err(BenchError::ZramBusy { disksize });
    }
    Ok(())
}

fn mkswap(target: &Path) -> Result<(), BenchError> {
    let out = Command::new("mkswap")
        .arg(target)
        .output()
        .map_err(|source| BenchError::ToolMissing { tool: "mkswap".into(), source })?;
    if !out.status.success() {
        return Err(BenchError::Command {
            cmd: format!("mkswap {}", target.display()),
            status: out.status.to_string(),
            stderr: String::from_utf8_lossy(&out.stderr).trim().to_string(),
        });
    }
    Ok(())
}

fn swapon(target: &Path) -> Result<(), BenchError> {
    // SAFETY: swapon(2) with a NUL-terminated path.
    if unsafe { libc::swapon(cpath(target).as_ptr(), 0) } != 0 {
        let e = std::io::Error::last_os_error();
        let hint = if e.raw_os_error() == Some(libc::EINVAL) {
            " (the file system may not support swap files: use --swap-file-dir on ext4 or xfs)"
        } else {
            ""
        };
        return Err(BenchError::system(format!("swapon{hint}"), target, e));
    }
    Ok(())
}

/// swapoff if `target` is active; a description of the failure with the manual fix.
pub fn swapoff_if_active(target: &Path) -> Result<(), String> {
    let name = target.to_string_lossy();
    if !active_swaps().iter().any(|d| *d == name) {
        return Ok(());
    }
    // SAFETY: swapoff(2) with a NUL-terminated path.
    if unsafe { libc::swapoff(cpath(target).as_ptr()) } != 0 {
        let e = std::io::Error::last_os_error();
        return Err(format!("swapoff {name} failed ({e}): `swapoff {name}`"));
    }
    Ok(())
}

/// Turns zram0 into an lz4 swap device of `bytes` (uncompressed) and swaps on it.
/// The caller records `zram` before calling: a failure part way leaves something to reset.
pub fn zram_on(bytes: u64) -> Result<(), BenchError> {
    sys_write(&format!("{ZRAM_SYS}/reset"), "1", "resetting zram0")?;
    sys_write(&format!("{ZRAM_SYS}/comp_algorithm"), "lz4", "choosing lz4 for zram0")?;
    sys_write(&format!("{ZRAM_SYS}/disksize"), &bytes.to_string(), "sizing zram0")?;
    mkswap(Path::new(ZRAM_DEV))?;
    swapon(Path::new(ZRAM_DEV))
}

/// swapoff zram0 (if on) and reset it.
pub fn zram_off() -> Result<(), String> {
    swapoff_if_active(Path::new(ZRAM_DEV))?;
    let reset = format!("{ZRAM_SYS}/reset");
    std::fs::write(&reset, "1").map_err(|e| format!("resetting zram0 failed ({e}): `echo 1 > {reset}`"))
}

/// The swap file a run uses in `dir`.
pub fn swap_file_path(dir: &Path) -> PathBuf {
    dir.join(format!("uswap-bench-{}.swap", std::process::id()))
}

/// Room a swap file leaves free on its file system, so the run's own files still fit.
pub const SWAP_FILE_SPARE_BYTES: u64 = 256 << 20;

/// Bytes free to an unprivileged writer on the file system that holds `dir`.
pub fn free_bytes(dir: &Path) -> Result<u64, BenchError> {
    let c = cpath(dir);
    // SAFETY: `statvfs` is plain data, for which all-zero bytes are a valid value.
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: `c` is a NUL-terminated path that outlives the call; `st` is ours to fill.
    if unsafe { libc::statvfs(c.as_ptr(), &mut st) } != 0 {
        return Err(BenchError::system(
            "checking free space for the swap file (give --swap-file-dir an existing directory)",
            dir,
            std::io::Error::last_os_error(),
        ));
    }
    Ok(st.f_bavail as u64 * st.f_frsize as u64)
}

/// Checks that `dir` has room for a swap file of `bytes` (plus `SWAP_FILE_SPARE_BYTES`).
pub fn check_space(dir: &Path, bytes: u64) -> Result<(), BenchError> {
    let avail = free_bytes(dir)?;
    let need = bytes + SWAP_FILE_SPARE_BYTES;
    if avail < need {
        return Err(BenchError::SwapFileSpace {
            dir: dir.to_path_buf(),
            need: format_size(need),
            avail: format!("{} MiB", avail >> 20),
        });
    }
    Ok(())
}

/// Creates a swap file of `bytes` at `path` (mode 0600, allocated) and swaps on it.
pub fn file_on(path: &Path, bytes: u64) -> Result<(), BenchError> {
    let f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)
        .map_err(|e| BenchError::system("creating the swap file", path, e))?;
    use std::os::fd::AsRawFd;
    // SAFETY: fallocate on a file we just created.
    if unsafe { libc::fallocate(f.as_raw_fd(), 0, 0, bytes as libc::off_t) } != 0 {
        let e = std::io::Error::last_os_error();
        if e.raw_os_error() != Some(libc::EOPNOTSUPP) {
            return Err(BenchError::system("allocating the swap file", path, e));
        }
        // No fallocate on this file system: write zeros.
        use std::io::Write;
        let zeros = vec![0u8; 1 << 20];
        let mut w = std::io::BufWriter::new(&f);
        let mut left = bytes;
        while left > 0 {
            let n = left.min(zeros.len() as u64) as usize;
            w.write_all(&zeros[..n]).map_err(|e| BenchError::system("writing the swap file", path, e))?;
            left -= n as u64;
        }
        w.flush().map_err(|e| BenchError::system("writing the swap file", path, e))?;
    }
    drop(f);
    mkswap(path)?;
    swapon(path)
}

/// swapoff the file (if on) and remove it.
pub fn file_off(path: &Path) -> Result<(), String> {
    swapoff_if_active(path)?;
    match std::fs::remove_file(path) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(format!("removing {} failed ({e}): `rm {}`", path.display(), path.display())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn zram_problems_are_named() {
        let dir = std::env::temp_dir().join(format!("uswap-zram-test-{}", std::process::id()));
        let e = check_zram_at(&dir).unwrap_err().to_string();
        assert!(e.contains("/sys/block/zram0, which does not exist") && e.contains("modprobe zram"), "{e}");
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("comp_algorithm"), "[lzo-rle] lzo lz4hc\n").unwrap();
        std::fs::write(dir.join("disksize"), "0\n").unwrap();
        let e = check_zram_at(&dir).unwrap_err().to_string();
        assert!(e.contains("cannot compress with lz4 (it offers: [lzo-rle] lzo lz4hc)"), "{e}");
        std::fs::write(dir.join("comp_algorithm"), "lzo-rle [lz4]\n").unwrap();
        assert!(check_zram_at(&dir).is_ok());
        std::fs::write(dir.join("disksize"), "1073741824\n").unwrap();
        let e = check_zram_at(&dir).unwrap_err().to_string();
        assert!(e.contains("/dev/zram0 is in use (disksize 1073741824 bytes)"), "{e}");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn proc_swaps_lists_devices() {
        assert!(parse_swaps("Filename\t\t\t\tType\t\tSize\t\tUsed\t\tPriority\n").is_empty());
        let t = "Filename Type Size Used Priority\n/dev/zram0 partition 1048572 0 -2\n/var/tmp/x.swap file 1024 0 -3\n";
        assert_eq!(parse_swaps(t), ["/dev/zram0", "/var/tmp/x.swap"]);
    }
}
