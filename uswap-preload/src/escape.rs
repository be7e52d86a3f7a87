//! Processes that leave the budget at exec: an `execve` (or `posix_spawn`) whose new image
//! will not load this library runs outside the tree's limit, its memory neither limited nor
//! counted. It happens when the new environment has no `LD_PRELOAD` naming this library or
//! no `USWAP_STATS_DIR` (`env -i`, `env -u LD_PRELOAD`, a program that builds a clean
//! environment), when the program is statically linked (no dynamic loader reads
//! `LD_PRELOAD`) or is a 32-bit one (the loader skips a 64-bit library), and when it is
//! set-user-ID or set-group-ID to someone else (the loader runs it securely and ignores a
//! preload named by path). uswap cannot follow such a program; it makes sure that the run
//! says so: the exec is noted as `escaped-<pid>.txt` in the run's directory (the path and
//! why), which `uswap run` reads when the program has ended.
//!
//! Only under `uswap run` (the run's directory is known): the library used by hand has no
//! one to tell. A `#!` script is judged by nothing: its interpreter is almost always a
//! dynamic program. Not seen: `execl`, `execlp`, `execle` and `fexecve` (the C library calls
//! its own `execve` for them), and system calls made without the C library.
//!
//! Nothing here allocates or takes a lock: an exec may run in a `vfork` child, or in a fork
//! child of a threaded program, where either could hang. Paths and the note are built on
//! the stack. An exec that fails takes its note back.

use std::ffi::{c_char, c_int, c_void, CStr};
use std::sync::atomic::AtomicPtr;

use uswap::shared_charge::ESCAPE_PREFIX;

/// Why an image will not load this library.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Why {
    /// The environment it gets has no `LD_PRELOAD` naming this library.
    NoPreload,
    /// The environment it gets has no `USWAP_STATS_DIR`: the library would load unconfigured.
    NoConfig,
    /// No `PT_INTERP`: no dynamic loader runs, so nothing is preloaded.
    Static,
    /// A 32-bit ELF: the loader cannot load a 64-bit library into it.
    Elf32,
    /// Set-user-ID or set-group-ID to another user or group: the loader ignores a preload
    /// given by path.
    SetId,
}

impl Why {
    fn text(self) -> &'static str {
        match self {
            Why::NoPreload => "its environment has no LD_PRELOAD naming uswap's library (cleared or replaced)",
            Why::NoConfig => "its environment has no USWAP_STATS_DIR (cleared)",
            Why::Static => "statically linked (no dynamic loader preloads uswap's library)",
            Why::Elf32 => "a 32-bit program (uswap's library is 64-bit)",
            Why::SetId => "set-user-ID or set-group-ID (the loader ignores LD_PRELOAD for it)",
        }
    }
}

/// The preloaded library's file name, looked for in `LD_PRELOAD`.
const LIBRARY_NAME: &[u8] = b"libuswap_preload";
/// Most environment strings looked at (a bound on the loop; past it nothing is judged).
const MAX_ENV: usize = 1 << 16;
/// Room for a path built on the stack.
const PATH_BYTES: usize = 4096;

/// Why the image `path` started with `envp` will not load this library, if it will not;
/// `None` too when that cannot be told (a path too long, a file that cannot be read: the
/// exec then fails or runs as the kernel decides).
pub fn judge(path: &CStr, envp: *const *const c_char) -> Option<Why> {
    if let Some(why) = judge_env(envp) {
        return Some(why);
    }
    judge_image(path)
}

fn judge_env(envp: *const *const c_char) -> Option<Why> {
    if envp.is_null() {
        return Some(Why::NoPreload);
    }
    let (mut preload, mut config) = (false, false);
    for i in 0..MAX_ENV {
        // SAFETY: `envp` is a NULL-terminated array of strings (execve's contract); the loop
        // stops at its NULL.
        let s = unsafe { *envp.add(i) };
        if s.is_null() {
            return match (preload, config) {
                (false, _) => Some(Why::NoPreload),
                (true, false) => Some(Why::NoConfig),
                (true, true) => None,
            };
        }
        // SAFETY: a NUL-terminated string of the caller's.
        let entry = unsafe { CStr::from_ptr(s) }.to_bytes();
        if let Some(value) = entry.strip_prefix(b"LD_PRELOAD=") {
            preload = value.windows(LIBRARY_NAME.len()).any(|w| w == LIBRARY_NAME);
        } else if entry.starts_with(b"USWAP_STATS_DIR=") {
            config = true;
        }
    }
    None
}

/// ELF header fields (64-bit little-endian layout) that tell the loader apart.
const EI_CLASS: usize = 4;
const ELFCLASS32: u8 = 1;
const PT_INTERP: u32 = 3;
/// Most program headers read (on the stack); an image with more is not judged.
const MAX_PHDRS: usize = 64;
const PHDR_BYTES: usize = 56;
/// Bytes read from the start of an image: the ELF header and its program headers, which
/// linkers place right after it.
const HEAD_BYTES: usize = 1024;

fn judge_image(path: &CStr) -> Option<Why> {
    // SAFETY: `path` is NUL-terminated; open has no other memory effects.
    let fd = unsafe { libc::open(path.as_ptr(), libc::O_RDONLY | libc::O_CLOEXEC) };
    if fd < 0 {
        return None;
    }
    let why = judge_open_image(fd);
    // SAFETY: the descriptor opened above, closed once.
    unsafe { libc::close(fd) };
    why
}

fn judge_open_image(fd: libc::c_int) -> Option<Why> {
    // SAFETY: `stat` is plain data; fstat fills it in.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: `fd` is open and `st` writable.
    if unsafe { libc::fstat(fd, &mut st) } != 0 {
        return None;
    }
    // SAFETY: geteuid and getegid only read the process's credentials.
    let (euid, egid) = unsafe { (libc::geteuid(), libc::getegid()) };
    let set_uid = st.st_mode & libc::S_ISUID != 0 && st.st_uid != euid;
    let set_gid = st.st_mode & libc::S_ISGID != 0 && st.st_mode & libc::S_IXGRP != 0 && st.st_gid != egid;
    if set_uid || set_gid {
        return Some(Why::SetId);
    }
    // One read for the header and, where linkers put them, the program headers: every
    // system call here is one more in every exec of the tree.
    let mut head = [0u8; HEAD_BYTES];
    // SAFETY: `head` is writable for its length.
    let n = unsafe { libc::pread(fd, head.as_mut_ptr().cast(), HEAD_BYTES, 0) };
    if n < 64 || &head[..4] != b"\x7fELF" {
        return None;
    }
    if head[EI_CLASS] == ELFCLASS32 {
        return Some(Why::Elf32);
    }
    let phoff = u64::from_le_bytes(head[32..40].try_into().ok()?);
    let phentsize = u16::from_le_bytes([head[54], head[55]]) as usize;
    let phnum = u16::from_le_bytes([head[56], head[57]]) as usize;
    if phentsize != PHDR_BYTES || phnum == 0 || phnum > MAX_PHDRS {
        return None;
    }
    let mut far = [0u8; MAX_PHDRS * PHDR_BYTES];
    let phdrs_end = phoff.checked_add((phnum * PHDR_BYTES) as u64)?;
    let phdrs: &[u8] = if phdrs_end <= n as u64 {
        &head[phoff as usize..phdrs_end as usize]
    } else {
        let far = &mut far[..phnum * PHDR_BYTES];
        if !read_exact_at(fd, far, phoff) {
            return None;
        }
        far
    };
    let interp = phdrs.chunks_exact(PHDR_BYTES).any(|ph| u32::from_le_bytes([ph[0], ph[1], ph[2], ph[3]]) == PT_INTERP);
    (!interp).then_some(Why::Static)
}

/// Fills `buf` from `fd` at `offset`; false if the file is shorter or the read fails.
fn read_exact_at(fd: libc::c_int, buf: &mut [u8], offset: u64) -> bool {
    // SAFETY: `buf` is writable for its length.
    let n = unsafe { libc::pread(fd, buf.as_mut_ptr().cast(), buf.len(), offset as libc::off_t) };
    n >= 0 && n as usize == buf.len()
}

/// A path on the stack, NUL-terminated.
pub struct StackPath {
    bytes: [u8; PATH_BYTES],
    len: usize,
}

impl StackPath {
    fn new() -> StackPath {
        StackPath { bytes: [0; PATH_BYTES], len: 0 }
    }

    /// Appends `part`; false (and nothing appended) if it does not fit with the NUL.
    fn push(&mut self, part: &[u8]) -> bool {
        if self.len + part.len() >= PATH_BYTES {
            return false;
        }
        self.bytes[self.len..self.len + part.len()].copy_from_slice(part);
        self.len += part.len();
        self.bytes[self.len] = 0;
        true
    }

    /// `path` itself, if it fits.
    fn of(path: &CStr) -> Option<StackPath> {
        let mut p = StackPath::new();
        p.push(path.to_bytes()).then_some(p)
    }

    pub fn as_cstr(&self) -> &CStr {
        // The buffer holds a NUL at `len` (set by `push`, or the zeroed buffer's first byte).
        CStr::from_bytes_until_nul(&self.bytes[..=self.len]).unwrap_or(c"")
    }
}

/// Where `execvp` would find `file`: itself when it names a path (has a `/`), otherwise
/// the first executable regular file of that name in `PATH` (the C library's default,
/// `/bin:/usr/bin`, when unset). `None` when not found.
pub fn resolve(file: &CStr) -> Option<StackPath> {
    let name = file.to_bytes();
    let mut out = StackPath::new();
    if name.is_empty() {
        return None;
    }
    if name.contains(&b'/') {
        return StackPath::of(file);
    }
    // SAFETY: getenv reads the process's environment without allocating; the string it
    // returns is read at once.
    let path_var = unsafe { libc::getenv(c"PATH".as_ptr()) };
    let dirs: &[u8] = if path_var.is_null() {
        b"/bin:/usr/bin"
    } else {
        // SAFETY: a NUL-terminated string of the environment's.
        unsafe { CStr::from_ptr(path_var) }.to_bytes()
    };
    for dir in dirs.split(|&b| b == b':') {
        out.len = 0;
        let dir: &[u8] = if dir.is_empty() { b"." } else { dir };
        if !(out.push(dir) && out.push(b"/") && out.push(name)) {
            continue;
        }
        if is_executable_file(out.as_cstr()) {
            return Some(out);
        }
    }
    None
}

fn is_executable_file(path: &CStr) -> bool {
    // SAFETY: `stat` is plain data; stat fills it in from a NUL-terminated path.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: as above.
    let found = unsafe { libc::stat(path.as_ptr(), &mut st) } == 0 && st.st_mode & libc::S_IFMT == libc::S_IFREG;
    // SAFETY: access reads a NUL-terminated path.
    found && unsafe { libc::access(path.as_ptr(), libc::X_OK) } == 0
}

/// The note of process `pid` in the run's directory `dir`: `dir/escaped-<pid>.txt`.
fn note_path(dir: &[u8], pid: libc::pid_t) -> Option<StackPath> {
    let mut digits = [0u8; 20];
    let mut file = StackPath::new();
    let made = file.push(dir)
        && file.push(b"/")
        && file.push(ESCAPE_PREFIX.as_bytes())
        && file.push(decimal(&mut digits, pid.max(0) as u64))
        && file.push(b".txt");
    made.then_some(file)
}

/// Leaves `escaped-<pid>.txt` in the run's directory `dir`: `path: why`. Returns whether
/// it was written (to take it back after an exec that failed).
pub fn note(dir: &[u8], pid: libc::pid_t, path: &CStr, why: Why) -> bool {
    let Some(file) = note_path(dir, pid) else { return false };
    let flags = libc::O_WRONLY | libc::O_CREAT | libc::O_TRUNC | libc::O_CLOEXEC | libc::O_NOFOLLOW;
    // SAFETY: a NUL-terminated path; open has no other memory effects.
    let fd = unsafe { libc::open(file.as_cstr().as_ptr(), flags, 0o600 as libc::c_uint) };
    if fd < 0 {
        return false;
    }
    for part in [path.to_bytes(), b": ", why.text().as_bytes(), b"\n"] {
        // SAFETY: `part` is readable for its length. A short write leaves a shorter note,
        // which still counts the process.
        unsafe { libc::write(fd, part.as_ptr().cast(), part.len()) };
    }
    // SAFETY: the descriptor opened above, closed once.
    unsafe { libc::close(fd) };
    true
}

/// Takes back the note of process `pid` (its exec failed: it runs on under the budget).
pub fn unnote(dir: &[u8], pid: libc::pid_t) {
    if let Some(file) = note_path(dir, pid) {
        // SAFETY: a NUL-terminated path.
        unsafe { libc::unlink(file.as_cstr().as_ptr()) };
    }
}

/// The run's directory, under `uswap run`.
fn run_dir() -> Option<&'static [u8]> {
    use std::os::unix::ffi::OsStrExt;
    crate::config().and_then(|c| c.stats_dir.as_deref()).map(|d| d.as_os_str().as_bytes())
}

/// Runs `exec` (an exec of `image` with `envp`) with the process noted first when the new
/// image will leave the budget (see the module documentation); a failed exec takes the
/// note back, with the caller's errno kept.
pub fn noted_exec(image: Option<&CStr>, envp: *const *const c_char, exec: impl FnOnce() -> c_int) -> c_int {
    let (Some(dir), Some(image)) = (run_dir(), image) else { return exec() };
    let Some(why) = judge(image, envp) else { return exec() };
    // SAFETY: getpid is a plain system call (the child's own pid in a vfork child).
    let pid = unsafe { libc::getpid() };
    let noted = note(dir, pid, image, why);
    let r = exec();
    if noted {
        let e = crate::real::errno();
        unnote(dir, pid);
        crate::real::set_errno(e);
    }
    r
}

/// Runs `spawn` (the C library's `posix_spawn` or `posix_spawnp`, given where to put the
/// child's pid), then notes the child if it started an image, `image()`, that leaves the
/// budget. The caller's `pid` gets the child's pid as from the C library.
fn spawn_noted(
    pid: *mut libc::pid_t,
    envp: *const *mut c_char,
    spawn: impl FnOnce(*mut libc::pid_t) -> c_int,
    image: impl FnOnce() -> Option<StackPath>,
) -> c_int {
    let mut child: libc::pid_t = 0;
    let r = spawn(&mut child);
    if r != 0 {
        return r;
    }
    if let Some(dir) = run_dir() {
        if let Some(image) = image() {
            if let Some(why) = judge(image.as_cstr(), envp.cast()) {
                note(dir, child, image.as_cstr(), why);
            }
        }
    }
    if !pid.is_null() {
        // SAFETY: the caller's out-pointer (non-null).
        unsafe { *pid = child };
    }
    r
}

type PosixSpawnFn = unsafe extern "C" fn(
    *mut libc::pid_t,
    *const c_char,
    *const libc::posix_spawn_file_actions_t,
    *const libc::posix_spawnattr_t,
    *const *mut c_char,
    *const *mut c_char,
) -> c_int;
static REAL_POSIX_SPAWN: AtomicPtr<c_void> = AtomicPtr::new(std::ptr::null_mut());
static REAL_POSIX_SPAWNP: AtomicPtr<c_void> = AtomicPtr::new(std::ptr::null_mut());

fn real_spawn(slot: &AtomicPtr<c_void>, name: &CStr) -> PosixSpawnFn {
    let p = crate::real::next_symbol(slot, name);
    // SAFETY: `p` is the C library's posix_spawn or posix_spawnp, both of this type.
    unsafe { std::mem::transmute::<*mut c_void, PosixSpawnFn>(p) }
}

/// `posix_spawn` (whose exec the C library makes itself): the child is noted once started,
/// if its image leaves the budget.
///
/// # Safety
/// As the C library's `posix_spawn`.
#[no_mangle]
pub unsafe extern "C" fn posix_spawn(
    pid: *mut libc::pid_t,
    path: *const c_char,
    actions: *const libc::posix_spawn_file_actions_t,
    attr: *const libc::posix_spawnattr_t,
    argv: *const *mut c_char,
    envp: *const *mut c_char,
) -> c_int {
    let f = real_spawn(&REAL_POSIX_SPAWN, c"posix_spawn");
    spawn_noted(
        pid,
        envp,
        // SAFETY: the caller's arguments, passed on, the child's pid to a local first.
        |child| unsafe { f(child, path, actions, attr, argv, envp) },
        // SAFETY: a NUL-terminated path of the caller's, when not null (a path without a
        // `/` is relative to the working directory here, not looked for on PATH).
        || (!path.is_null()).then(|| StackPath::of(unsafe { CStr::from_ptr(path) })).flatten(),
    )
}

/// `posix_spawnp`: as [`posix_spawn`], the program found on `PATH` as the C library finds it.
///
/// # Safety
/// As the C library's `posix_spawnp`.
#[no_mangle]
pub unsafe extern "C" fn posix_spawnp(
    pid: *mut libc::pid_t,
    file: *const c_char,
    actions: *const libc::posix_spawn_file_actions_t,
    attr: *const libc::posix_spawnattr_t,
    argv: *const *mut c_char,
    envp: *const *mut c_char,
) -> c_int {
    let f = real_spawn(&REAL_POSIX_SPAWNP, c"posix_spawnp");
    spawn_noted(
        pid,
        envp,
        // SAFETY: the caller's arguments, passed on, the child's pid to a local first.
        |child| unsafe { f(child, file, actions, attr, argv, envp) },
        // SAFETY: a NUL-terminated name of the caller's, when not null.
        || (!file.is_null()).then(|| resolve(unsafe { CStr::from_ptr(file) })).flatten(),
    )
}

/// `n` in decimal, in `buf`.
fn decimal(buf: &mut [u8; 20], mut n: u64) -> &[u8] {
    let mut at = buf.len();
    // Bounded: a u64 has at most 20 digits.
    loop {
        at -= 1;
        buf[at] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 {
            return &buf[at..];
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn environments_without_the_library_or_its_directory_escape() {
        let env = |v: &[&CStr]| v.iter().map(|s| s.as_ptr()).chain([std::ptr::null()]).collect::<Vec<_>>();
        let ok = env(&[c"LD_PRELOAD=/x/libuswap_preload.so:/y/libz.so", c"USWAP_STATS_DIR=/tmp/r"]);
        assert_eq!(judge_env(ok.as_ptr()), None);
        assert_eq!(judge_env(env(&[c"USWAP_STATS_DIR=/tmp/r"]).as_ptr()), Some(Why::NoPreload));
        let other = env(&[c"LD_PRELOAD=/y/libz.so", c"USWAP_STATS_DIR=/tmp/r"]);
        assert_eq!(judge_env(other.as_ptr()), Some(Why::NoPreload));
        assert_eq!(judge_env(env(&[c"LD_PRELOAD=libuswap_preload.so"]).as_ptr()), Some(Why::NoConfig));
        assert_eq!(judge_env(std::ptr::null()), Some(Why::NoPreload));
    }

    #[test]
    fn images_are_judged_by_their_headers() {
        assert_eq!(judge_image(c"/bin/sh"), None, "a dynamic program");
        assert_eq!(judge_image(c"/nonexistent"), None, "nothing to judge");
        let script = std::env::temp_dir().join(format!("uswap-escape-{}.sh", std::process::id()));
        std::fs::write(&script, "#!/bin/sh\n").unwrap();
        let c = std::ffi::CString::new(script.to_str().unwrap()).unwrap();
        assert_eq!(judge_image(&c), None, "a script");
        std::fs::remove_file(&script).unwrap();
    }

    #[test]
    fn programs_are_found_as_execvp_finds_them() {
        let sh = resolve(c"sh").expect("sh is on PATH");
        assert!(sh.as_cstr().to_bytes().ends_with(b"/sh"), "{:?}", sh.as_cstr());
        assert_eq!(resolve(c"/bin/sh").unwrap().as_cstr(), c"/bin/sh");
        assert!(resolve(c"no-such-program-anywhere").is_none());
        assert_eq!(decimal(&mut [0; 20], 0), b"0");
        assert_eq!(decimal(&mut [0; 20], u64::MAX), b"18446744073709551615");
    }
}
