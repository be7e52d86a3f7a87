//! The program `uswap run` starts: found as `execvp` finds it, and judged as the kernel would
//! start it (a dynamic ELF, a `#!` script by its interpreter, a text file by `/bin/sh`), so
//! that what uswap cannot manage (a static program) is refused before anything starts.

use std::io::Read;
use std::path::{Path, PathBuf};

use super::error::RunError;

/// Finds `name` as execvp would: a path if it has a slash, else the first executable file
/// on PATH.
pub fn find_program(name: &std::ffi::OsStr) -> Result<PathBuf, RunError> {
    let p = Path::new(name);
    if name.as_encoded_bytes().contains(&b'/') {
        return Ok(p.to_path_buf());
    }
    let path = std::env::var_os("PATH").unwrap_or_else(|| "/usr/local/bin:/usr/bin:/bin".into());
    for dir in std::env::split_paths(&path) {
        let cand = dir.join(p);
        if is_executable_file(&cand) {
            return Ok(cand);
        }
    }
    Err(RunError::NotFound(name.to_string_lossy().into_owned()))
}

fn is_executable_file(p: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(p).map(|m| m.is_file() && m.permissions().mode() & 0o111 != 0).unwrap_or(false)
}

/// How a program that `check_runnable` accepted is started.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Runnable {
    /// By the kernel: a dynamic ELF, or a `#!` script whose interpreter is one.
    Program,
    /// A text file without `#!`, which the kernel refuses (ENOEXEC): by `/bin/sh`, as the C
    /// library's `execvp` (and so `env`, `timeout`, `nohup`) and the shells run it.
    ShellScript,
}

/// The shell a [`Runnable::ShellScript`] is run with, as the C library's `execvp` does.
pub(super) const SHELL_FOR_SCRIPTS: &str = "/bin/sh";

/// How the kernel would start `path`: an ELF with a dynamic loader is fine; a script is
/// judged by its interpreter (one level, and `/usr/bin/env NAME`); a static ELF is refused;
/// a file that is neither ELF nor `#!` script is run by `/bin/sh` (judged as it).
pub fn check_runnable(path: &Path, depth: u32) -> Result<Runnable, RunError> {
    let not_runnable = |why: String| RunError::NotRunnable { path: path.to_path_buf(), why, missing: false };
    if !is_executable_file(path) {
        let meta = std::fs::metadata(path);
        let missing = matches!(&meta, Err(e) if e.kind() == std::io::ErrorKind::NotFound);
        let why = match meta {
            Err(_) if missing => "no such file".into(),
            Err(e) => e.to_string(),
            Ok(m) if m.is_dir() => "a directory, not a program".into(),
            Ok(_) => "not an executable file (no execute permission)".into(),
        };
        return Err(RunError::NotRunnable { path: path.to_path_buf(), why, missing });
    }
    let head = head_of(path).map_err(|e| not_runnable(e.to_string()))?;
    if head.starts_with(b"#!") {
        if depth > 2 {
            return Err(not_runnable("too many levels of script interpreters".into()));
        }
        let line = head[2..].split(|&b| b == b'\n').next().unwrap_or(&[]);
        let line = String::from_utf8_lossy(line);
        let mut words = line.split_whitespace();
        let interp = words.next().ok_or_else(|| not_runnable("empty #! line".into()))?;
        let interp = PathBuf::from(interp);
        let env_prog = interp.file_name().is_some_and(|f| f == "env").then(|| words.find(|w| !w.starts_with('-')));
        let interp = match env_prog.flatten() {
            Some(prog) => find_program(prog.as_ref())?,
            None => interp,
        };
        // The kernel does not run a script as another's interpreter.
        return match check_runnable(&interp, depth + 1)? {
            Runnable::Program => Ok(Runnable::Program),
            Runnable::ShellScript => {
                Err(not_runnable(format!("its interpreter {} is not a program", interp.display())))
            }
        };
    }
    if is_text_script(&head) {
        // Text the kernel refuses; `/bin/sh` must be one uswap can manage.
        return match check_runnable(Path::new(SHELL_FOR_SCRIPTS), depth + 1)? {
            Runnable::Program => Ok(Runnable::ShellScript),
            Runnable::ShellScript => Err(not_runnable(format!("{SHELL_FOR_SCRIPTS} is not a program"))),
        };
    }
    if !head.starts_with(b"\x7fELF") {
        // Another binary format: the kernel's (binfmt_misc may run it through an
        // interpreter, which then loads the library; or the exec fails, 126).
        return Ok(Runnable::Program);
    }
    match elf_has_interpreter(&head) {
        Some(true) if elf_needs_no_library(path, &head) => Err(RunError::NoLibrary(path.to_path_buf())),
        Some(true) if runs_securely(path) => Err(RunError::SetId(path.to_path_buf())),
        Some(true) => Ok(Runnable::Program),
        // The dynamic loader run as a program (`ld.so PROGRAM`, as wrappers that pick a
        // loader do) has no interpreter of its own, and preloads the library for PROGRAM.
        Some(false) if is_the_dynamic_loader(path) => Ok(Runnable::Program),
        Some(false) => Err(RunError::Static(path.to_path_buf())),
        None => Err(not_runnable("not a 64-bit x86 ELF executable".into())),
    }
}

/// Whether the loader would run `path` securely for this process, ignoring `LD_PRELOAD`: its
/// set-user-ID or set-group-ID bit changes the effective user or group, or it has file
/// capabilities and the user is not root; unless the process may gain no privileges
/// (`PR_SET_NO_NEW_PRIVS`) or the file lies on a `nosuid` mount. (The library judges the
/// programs the tree execs the same way, `uswap-preload/src/escape.rs`, and names them.)
/// Run as the command itself, such a program ran outside the budget with nothing said, and
/// `--strict` passed.
fn runs_securely(path: &Path) -> bool {
    use std::os::unix::ffi::OsStrExt;
    use std::os::unix::fs::MetadataExt;
    let Ok(meta) = std::fs::metadata(path) else { return false };
    // SAFETY: these only read the process's credentials and flags.
    let (uid, gid, no_new_privs) =
        unsafe { (libc::getuid(), libc::getgid(), libc::prctl(libc::PR_GET_NO_NEW_PRIVS, 0, 0, 0, 0) == 1) };
    let mode = meta.mode();
    let set_uid = mode & libc::S_ISUID != 0 && meta.uid() != uid;
    let set_gid = mode & libc::S_ISGID != 0 && mode & libc::S_IXGRP != 0 && meta.gid() != gid;
    let Ok(c_path) = std::ffi::CString::new(path.as_os_str().as_bytes()) else { return false };
    // SAFETY: a size query (no buffer) of a NUL-terminated attribute of a NUL-terminated path.
    let caps = uid != 0
        && unsafe { libc::getxattr(c_path.as_ptr(), c"security.capability".as_ptr(), std::ptr::null_mut(), 0) } > 0;
    // SAFETY: `statvfs` is plain data that the call fills in for a NUL-terminated path.
    let mut fs: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: as above.
    let nosuid = unsafe { libc::statvfs(c_path.as_ptr(), &mut fs) } == 0 && fs.f_flag & libc::ST_NOSUID != 0;
    (set_uid || set_gid || caps) && !no_new_privs && !nosuid
}

/// Whether `path` is the dynamic loader this process was started by: the file mapped at
/// its base (`AT_BASE`), by device and inode, as `/proc/self/maps` names it.
fn is_the_dynamic_loader(path: &Path) -> bool {
    use std::os::unix::fs::MetadataExt;
    // SAFETY: getauxval reads the auxiliary vector; it has no failure mode but 0.
    let base = unsafe { libc::getauxval(libc::AT_BASE) } as u64;
    let (Ok(meta), Ok(maps)) = (std::fs::metadata(path), std::fs::read_to_string("/proc/self/maps")) else {
        return false;
    };
    let dev = format!("{:02x}:{:02x}", libc::major(meta.dev()), libc::minor(meta.dev()));
    // "start-end perms offset major:minor inode path"
    maps.lines().any(|line| {
        let f: Vec<&str> = line.split_whitespace().take(5).collect();
        let start = f.first().and_then(|r| r.split('-').next()).and_then(|s| u64::from_str_radix(s, 16).ok());
        base != 0
            && start == Some(base)
            && f.get(3) == Some(&dev.as_str())
            && f.get(4) == Some(&meta.ino().to_string().as_str())
    })
}

/// Whether a file that starts with `head` is a script for `/bin/sh` as `execvp` runs one:
/// neither ELF nor `#!`, and text (no NUL byte in its first line, as the shells judge).
fn is_text_script(head: &[u8]) -> bool {
    let first_line = head.split(|&b| b == b'\n').next().unwrap_or(&[]);
    !head.starts_with(b"\x7fELF") && !head.starts_with(b"#!") && !first_line.contains(&0)
}

/// The shell to run `path` with, where it is a script without `#!` (see [`is_text_script`]):
/// for the runs of `uswap bench --command` without uswap, which start the program as the
/// kernel would.
pub fn shell_for(path: &Path) -> Option<&'static str> {
    is_text_script(&head_of(path).ok()?).then_some(SHELL_FOR_SCRIPTS)
}

/// The first bytes of `path`, what the kernel and the shells judge a program by.
fn head_of(path: &Path) -> std::io::Result<Vec<u8>> {
    let mut head = vec![0u8; 4096];
    let n = std::fs::File::open(path)?.read(&mut head)?;
    head.truncate(n);
    Ok(head)
}

/// Whether a 64-bit little-endian ELF has a `PT_INTERP` program header (is dynamically
/// linked); `None` if it is not such an ELF or its headers lie beyond `head`.
fn elf_has_interpreter(head: &[u8]) -> Option<bool> {
    const PT_INTERP: u32 = 3;
    if head.len() < 64 || &head[..4] != b"\x7fELF" || head[4] != 2 || head[5] != 1 {
        return None;
    }
    let u16_at = |o: usize| u16::from_le_bytes([head[o], head[o + 1]]) as usize;
    let phoff = u64::from_le_bytes(head[32..40].try_into().ok()?) as usize;
    let (phentsize, phnum) = (u16_at(54), u16_at(56));
    let end = phoff.checked_add(phentsize.checked_mul(phnum)?)?;
    if phentsize < 4 || end > head.len() {
        return None;
    }
    Some((0..phnum).any(|i| {
        let o = phoff + i * phentsize;
        u32::from_le_bytes([head[o], head[o + 1], head[o + 2], head[o + 3]]) == PT_INTERP
    }))
}

/// Whether a 64-bit ELF that starts with `head` (its program headers in it, as
/// [`elf_has_interpreter`] found them) has a dynamic section without `DT_NEEDED`: it needs
/// no shared library, so it never calls the C library where the preloaded one could see it
/// (a Go program built without cgo as a position-independent executable). `false` where
/// the file cannot tell.
fn elf_needs_no_library(path: &Path, head: &[u8]) -> bool {
    use std::os::unix::fs::FileExt;
    const PT_DYNAMIC: u32 = 2;
    const DT_NULL: u64 = 0;
    const DT_NEEDED: u64 = 1;
    /// Most bytes of a dynamic section read (linkers write a few dozen 16-byte entries).
    const MAX_DYNAMIC_BYTES: u64 = 64 << 10;
    let u64_at = |b: &[u8], o: usize| b.get(o..o + 8).and_then(|s| s.try_into().ok()).map(u64::from_le_bytes);
    let u16_at = |o: usize| head.get(o..o + 2).map_or(0, |b| u16::from_le_bytes([b[0], b[1]]) as usize);
    let Some(phoff) = u64_at(head, 32) else { return false };
    let (phentsize, phnum) = (u16_at(54), u16_at(56));
    let dynamic = (0..phnum)
        .map(|i| phoff as usize + i * phentsize)
        .find(|&o| head.get(o..o + 4).is_some_and(|t| u32::from_le_bytes([t[0], t[1], t[2], t[3]]) == PT_DYNAMIC));
    let (Some(offset), Some(size)) =
        (dynamic.and_then(|o| u64_at(head, o + 8)), dynamic.and_then(|o| u64_at(head, o + 32)))
    else {
        return false;
    };
    let mut section = vec![0u8; size.min(MAX_DYNAMIC_BYTES) as usize];
    let Ok(n) = std::fs::File::open(path).and_then(|f| f.read_at(&mut section, offset)) else { return false };
    for entry in section[..n].chunks_exact(16) {
        match u64_at(entry, 0) {
            Some(DT_NEEDED) => return false,
            Some(DT_NULL) => return true,
            _ => {}
        }
    }
    // No end seen in what was read: not told.
    false
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dynamic_and_static_elves_are_told_apart() {
        let dynamic = find_program("sh".as_ref()).expect("sh on PATH");
        assert_eq!(check_runnable(&dynamic, 0).expect("/bin/sh is dynamically linked"), Runnable::Program);
        let mut head = std::fs::read(&dynamic).expect("read sh");
        head.truncate(4096);
        assert_eq!(elf_has_interpreter(&head), Some(true));
        assert!(!elf_needs_no_library(&dynamic, &head), "/bin/sh needs the C library");
        assert_eq!(elf_has_interpreter(b"#!/bin/sh\n"), None);
    }

    /// The dynamic loader run as a program loads the library for the program it runs: not
    /// refused as static, while a static program still is.
    #[test]
    fn the_dynamic_loader_is_a_program_it_runs_and_static_programs_are_not() {
        let loader = std::fs::read_to_string("/proc/self/maps")
            .unwrap()
            .lines()
            .filter_map(|l| l.split_whitespace().nth(5).map(str::to_string))
            .find(|p| p.contains("/ld-linux"))
            .expect("this test's own dynamic loader in its maps");
        assert_eq!(check_runnable(Path::new(&loader), 0).expect("the loader is runnable"), Runnable::Program);
        assert!(is_the_dynamic_loader(Path::new(&loader)));
        let sh = find_program("sh".as_ref()).expect("sh on PATH");
        assert!(!is_the_dynamic_loader(&sh));
    }

    #[test]
    fn a_missing_program_is_named() {
        let e = find_program("no-such-program-uswap".as_ref()).unwrap_err().to_string();
        assert!(e.contains("no-such-program-uswap") && e.contains("not found"), "{e}");
        // A path: said for what it is.
        let e = check_runnable("/no-such-dir-uswap/prog".as_ref(), 0).unwrap_err().to_string();
        assert!(e.contains("no such file"), "{e}");
        let e = check_runnable("/tmp".as_ref(), 0).unwrap_err().to_string();
        assert!(e.contains("a directory"), "{e}");
    }

    #[test]
    fn a_script_without_a_hashbang_is_run_by_the_shell() {
        use std::os::unix::fs::PermissionsExt;
        let dir = std::env::temp_dir().join(format!("uswap-noshebang-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let script = dir.join("script");
        std::fs::write(&script, "echo hello\n").unwrap();
        std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).unwrap();
        assert_eq!(check_runnable(&script, 0).unwrap(), Runnable::ShellScript);
        // A script naming it as its interpreter is not run (the kernel refuses it too).
        let outer = dir.join("outer");
        std::fs::write(&outer, format!("#!{}\n", script.display())).unwrap();
        std::fs::set_permissions(&outer, std::fs::Permissions::from_mode(0o755)).unwrap();
        let e = check_runnable(&outer, 0).unwrap_err().to_string();
        assert!(e.contains("is not a program"), "{e}");
        let _ = std::fs::remove_dir_all(&dir);
    }
}
