//! A program under `uswap run` that dies with a core dump has, in the dump, every byte it
//! had out of RAM, as under the kernel's swap: the kernel writes a core without waiting on a
//! userfaultfd, and each page out was a hole a debugger read as zeros (12,513 of 16,384 pages
//! of the buffer below, before).

#[allow(dead_code)]
mod common;

use std::os::unix::fs::FileExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use common::{compile, preload, run_timed, skipped, tmpdir};

/// The words `coredump.c` fills its buffer with.
fn splitmix64(i: u64) -> u64 {
    let mut x = i.wrapping_add(0x9e37_79b9_7f4a_7c15);
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^ (x >> 31)
}

/// A core file's loaded segments: (address, length in the file, offset in the file).
fn core_segments(core: &std::fs::File) -> Vec<(u64, u64, u64)> {
    let mut header = [0u8; 64];
    core.read_exact_at(&mut header, 0).unwrap();
    assert_eq!(&header[..4], b"\x7fELF", "not an ELF core");
    assert_eq!(u16::from_le_bytes([header[16], header[17]]), 4, "not an ET_CORE file");
    let u64_at = |b: &[u8], at: usize| u64::from_le_bytes(b[at..at + 8].try_into().unwrap());
    let ph_offset = u64_at(&header, 0x20);
    let ph_size = u16::from_le_bytes([header[0x36], header[0x37]]) as u64;
    let ph_count = u16::from_le_bytes([header[0x38], header[0x39]]) as u64;
    let mut segments = Vec::new();
    for i in 0..ph_count {
        let mut ph = [0u8; 56];
        core.read_exact_at(&mut ph, ph_offset + i * ph_size).unwrap();
        if u32::from_le_bytes(ph[..4].try_into().unwrap()) == 1 {
            // PT_LOAD: p_offset, p_vaddr, p_filesz.
            segments.push((u64_at(&ph, 16), u64_at(&ph, 32), u64_at(&ph, 8)));
        }
    }
    segments
}

/// Checks every word of the buffer at `addr` in the core `path`: returns the pages wrong
/// and the pages missing from the dump.
fn check_core(path: &Path, addr: u64, nr_words: u64) -> (u64, u64) {
    let core = std::fs::File::open(path).unwrap();
    let segments = core_segments(&core);
    let (mut wrong, mut missing) = (0, 0);
    let mut page = vec![0u8; 4096];
    for page_index in 0..nr_words / 512 {
        let at = addr + page_index * 4096;
        let Some(&(start, _, offset)) = segments.iter().find(|&&(s, len, _)| s <= at && at + 4096 <= s + len) else {
            missing += 1;
            continue;
        };
        core.read_exact_at(&mut page, offset + (at - start)).unwrap();
        let ok = page
            .chunks(8)
            .enumerate()
            .all(|(k, w)| u64::from_le_bytes(w.try_into().unwrap()) == splitmix64(page_index * 512 + k as u64));
        wrong += u64::from(!ok);
    }
    (wrong, missing)
}

/// Where a core of a process in `dir` is written, if the kernel writes one there: a
/// `core_pattern` without a directory or a pipe (`core`, `core.%p`, ...).
fn core_in(dir: &Path) -> Option<PathBuf> {
    std::fs::read_dir(dir)
        .ok()?
        .flatten()
        .map(|e| e.path())
        .find(|p| p.file_name().and_then(|n| n.to_str()).is_some_and(|n| n.starts_with("core") && !n.ends_with(".c")))
}

/// Abort, a fault, and a fault whose handler puts the default back (as Python's faulthandler
/// does), in both modes: 64 MiB under a limit of 16 MiB, every page of the buffer in the
/// dump with its bytes; the program saw the default action of the signal it died of.
#[test]
fn a_core_dump_holds_the_pages_that_were_out() {
    let pattern = std::fs::read_to_string("/proc/sys/kernel/core_pattern").unwrap_or_default();
    if pattern.starts_with('|') || pattern.contains('/') {
        return skipped(&format!("core dumps go elsewhere here (core_pattern {})", pattern.trim()));
    }
    let dir = tmpdir("core-dump");
    let prog = compile("coredump", &dir, &[]);
    for mode in ["signal", "thread"] {
        for (how, sig) in [("abort", libc::SIGABRT), ("segv", libc::SIGSEGV), ("handler", libc::SIGSEGV)] {
            let cwd = dir.join(format!("{mode}-{how}"));
            let _ = std::fs::remove_dir_all(&cwd);
            std::fs::create_dir_all(&cwd).unwrap();
            let mut cmd = Command::new(env!("CARGO_BIN_EXE_uswap"));
            cmd.env("USWAP_PRELOAD_LIB", preload()).current_dir(&cwd);
            cmd.args(["run", "--limit", "16MiB", "--fault-mode", mode, "--"]).arg(&prog).args(["64", how]);
            // SAFETY: setrlimit is async-signal-safe; it changes only the child's limit.
            unsafe {
                cmd.pre_exec(|| {
                    let unlimited = libc::rlimit { rlim_cur: libc::RLIM_INFINITY, rlim_max: libc::RLIM_INFINITY };
                    if libc::setrlimit(libc::RLIMIT_CORE, &unlimited) != 0 {
                        return Err(std::io::Error::last_os_error());
                    }
                    Ok(())
                })
            };
            let o = run_timed(&mut cmd, Duration::from_secs(120));
            let (out, err) = (String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr));
            let what = format!("{mode} {how}: {}: {out}{err}", o.status);
            assert_eq!(o.status.code(), Some(128 + sig), "{what}");
            let mut lines = out.lines();
            let first = lines.next().unwrap_or_default();
            let addr =
                first.strip_prefix("buf=0x").and_then(|r| r.split(' ').next()).unwrap_or_else(|| panic!("{what}"));
            let addr = u64::from_str_radix(addr, 16).unwrap();
            let nr_words: u64 = first.rsplit("words=").next().unwrap().parse().unwrap();
            assert_eq!(lines.next(), Some("default"), "the program saw uswap's stand-in: {what}");
            let core = core_in(&cwd).unwrap_or_else(|| panic!("no core written: {what}"));
            let (wrong, missing) = check_core(&core, addr, nr_words);
            assert_eq!((wrong, missing), (0, 0), "pages of 16384 wrong, missing from the dump: {what}");
            assert!(!err.contains("could not be brought back"), "{what}");
            // Without uswap's reservations and pool: far below the tens of GiB reserved.
            let apparent = std::fs::metadata(&core).unwrap().len();
            assert!(apparent < 1 << 30, "a core of {apparent} bytes: {what}");
            std::fs::remove_file(&core).unwrap();
        }
    }
}
