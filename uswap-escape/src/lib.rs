//! Processes that leave the budget at exec: an `execve` (or `posix_spawn`) whose new image
//! will not load uswap's preloaded library runs outside the tree's limit, its memory neither limited nor
//! counted. It happens when the new environment has no `LD_PRELOAD` naming this library, no
//! `USWAP_STATS_DIR`, or `USWAP_DISABLE` (`env -i`, `env -u LD_PRELOAD`, a program that
//! builds a clean environment), when the program is statically linked (no dynamic loader
//! reads `LD_PRELOAD`) or is a 32-bit one (the loader skips a 64-bit library), when the
//! loader runs it securely and ignores a preload named by path (set-user-ID or
//! set-group-ID to someone else, or file capabilities for a user who is not root); and when
//! the user it runs as cannot read the library (a process that changed user). A process in
//! which the library loads and stands aside (its executable needs no shared library or
//! brings its own `malloc`, or it runs under valgrind) notes itself
//! ([`note_this_process`]; under valgrind only where the exec of its static tool was not
//! noted). uswap
//! cannot follow such a program; it makes sure that the run says so: the exec is noted as
//! `escaped-<pid>.txt` (`escaped-<pid>.<n>.txt` for a pid's later notes) in the run's
//! directory (the path and why), which `uswap run` reads when the program has ended. An
//! exec is judged before it happens and its note taken back if it fails; a `posix_spawn`
//! once its child started.
//!
//! Only under `uswap run` (the run's directory is known): the library used by hand has no
//! one to tell. A `#!` script is judged by nothing: its interpreter is almost always a
//! dynamic program. Not seen: `execl`, `execlp`, `execle` and `fexecve` (the C library calls
//! its own `execve` for them), and system calls made without the C library.
//!
//! Shared by the two libraries that interpose the exec calls: the first stage (`uswap-shim`,
//! what `uswap run` preloads) in a process that never needed a pager, and the preload library
//! (`uswap-preload`, the engine) once loaded. "This library" below is the one `LD_PRELOAD`
//! names ([`init`]).
//!
//! Nothing here allocates or takes a lock (but what [`note_this_process`] does, from a
//! constructor): an exec may
//! run in a `vfork` child, in a fork child of a threaded program, or in a signal handler.
//! Paths and the note are built on the stack, in small buffers, and released before the
//! exec itself runs (it may run on a small alternate signal stack).

// Leaves both preloaded libraries share besides the exec judgment: the C library's own
// allocator with its bootstrap area, its blocks' sizes and their count, and which loaded
// object holds an address.
pub mod c_allocator;
pub mod c_block;
pub mod objects;

use std::ffi::{c_char, c_int, CStr};
use std::sync::atomic::{AtomicPtr, AtomicUsize, Ordering};

/// The notes' file names begin so in the run's directory (`uswap::shared_charge`'s
/// `ESCAPE_PREFIX`, which `uswap run` reads; a test of the preload library holds them equal).
pub const ESCAPE_PREFIX: &str = "escaped-";
/// The file names of a refusal's note (`uswap::shared_charge`'s `REFUSAL_PREFIX`): a process
/// that could not be managed, which fails the run.
pub const REFUSAL_PREFIX: &str = "refused-";

fn errno() -> c_int {
    // SAFETY: the calling thread's errno, always valid.
    unsafe { *libc::__errno_location() }
}

fn set_errno(e: c_int) {
    // SAFETY: as in `errno`.
    unsafe { *libc::__errno_location() = e };
}

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
    /// Set-user-ID or set-group-ID to another user or group, or with file capabilities: the
    /// loader ignores a preload given by path.
    SetId,
    /// `USWAP_DISABLE` in its environment: the library loads and stands aside.
    Disabled,
    /// The user it runs as (a process of the tree that changed user: `su`, `runuser`) cannot
    /// read this library: the loader skips it.
    Unreadable,
    /// The process execs holding every descriptor its `RLIMIT_NOFILE` allows, none of them
    /// closed by the exec (`FD_CLOEXEC`): the image could not be judged, and the loader,
    /// which needs a descriptor to open this library, skips it.
    NoDescriptor,
    /// Another object defines the C library's allocator (`malloc`, ...) before this library:
    /// its executable, an allocator preloaded first (`LD_PRELOAD=libtcmalloc.so:...`), or a
    /// sanitizer's runtime. The C library, the dynamic
    /// loader and uswap's own threads then allocate from it: the library stands aside
    /// (`own_allocator::program_allocator`).
    OwnAllocator,
    /// Its executable needs no shared library (a Go program built without cgo as a
    /// position-independent executable): the library loads but never sees the program's
    /// system calls, and stands aside (`program_system_calls`).
    NoLibrary,
    /// It runs under valgrind, whose tool serves its `malloc` and emulates its system calls
    /// (`own_allocator::under_valgrind`).
    Valgrind,
}

impl Why {
    fn text(self) -> &'static str {
        match self {
            Why::NoPreload => "its environment has no LD_PRELOAD naming uswap's library (cleared or replaced)",
            Why::NoConfig => "its environment has no USWAP_STATS_DIR (cleared)",
            Why::Static => "statically linked (no dynamic loader preloads uswap's library)",
            Why::Elf32 => "a 32-bit program (uswap's library is 64-bit)",
            Why::SetId => "set-user-ID, set-group-ID or with file capabilities (the loader ignores LD_PRELOAD for it)",
            Why::Disabled => "USWAP_DISABLE in its environment (uswap's library stands aside)",
            Why::Unreadable => {
                "it cannot read uswap's library at its path (another user: put uswap where every user of the tree \
                 may read it; or a chroot)"
            }
            Why::NoDescriptor => {
                "it was started holding every descriptor its limit (RLIMIT_NOFILE) allows, none closed by the \
                 exec: the loader has no descriptor to open uswap's library with"
            }
            Why::NoLibrary => {
                "its executable needs no shared library and makes its system calls itself (a Go program built \
                 without cgo, say): uswap's library never sees its memory, and stands aside"
            }
            Why::Valgrind => {
                "it runs under valgrind, which serves its malloc and emulates its system calls: uswap's library \
                 stands aside"
            }
            Why::OwnAllocator => {
                "its malloc is not uswap's (an allocator preloaded before uswap's library, its executable's own, as \
                 rustc's jemalloc, or a sanitizer's runtime, which must come first), and the C library, the dynamic loader and uswap's own threads would allocate from it \
                 in memory uswap pages: uswap's library stands aside"
            }
        }
    }
}

/// The file name this library was loaded under (as `LD_PRELOAD` named it: `uswap run`
/// gives its canonical path, or a link to it in the run's directory for a path the loader
/// would split), set at start-up ([`init`]); the loader owns the string.
static LIBRARY_PATH: AtomicPtr<c_char> = AtomicPtr::new(std::ptr::null_mut());
/// What `LD_PRELOAD` is searched for before [`init`] ran, or when the loader gave no name:
/// the file names of the first stage and of the preload library.
const LIBRARY_NAMES: [&[u8]; 2] = [b"libuswap_shim", b"libuswap_preload"];

/// The run's directory (`USWAP_STATS_DIR`), set by [`init`]: its bytes and length.
static RUN_DIR: AtomicPtr<u8> = AtomicPtr::new(std::ptr::null_mut());
static RUN_DIR_LEN: AtomicUsize = AtomicUsize::new(0);

/// At start-up: remembers the path of the library `LD_PRELOAD` named (`library`: the
/// loader's copy of the name, which an `LD_PRELOAD` passed on must name; a renamed or linked
/// library is not told by its file name) and the run's directory `run_dir` (under `uswap
/// run` only; without one nothing is judged). Both live as long as the process.
pub fn init(library: *const c_char, run_dir: Option<&'static [u8]>) {
    if !library.is_null() {
        LIBRARY_PATH.store(library.cast_mut(), Ordering::Release);
    }
    if let Some(dir) = run_dir {
        RUN_DIR_LEN.store(dir.len(), Ordering::Relaxed);
        RUN_DIR.store(dir.as_ptr().cast_mut(), Ordering::Release);
    }
}

/// The path of the loaded object that holds address `addr` (only compared, never read), as
/// the loader named it (the loader's string, valid while the object is loaded), for
/// [`init`]; null where no object holds it.
pub fn object_path(addr: usize) -> *const c_char {
    objects::object_of(addr).map_or(std::ptr::null(), |o| o.path)
}

/// Whether an `LD_PRELOAD` value names this library (an entry of it, `:` or space
/// separated, is its path).
fn names_this_library(value: &[u8]) -> bool {
    let own = LIBRARY_PATH.load(Ordering::Acquire);
    if own.is_null() {
        return LIBRARY_NAMES.iter().any(|name| value.windows(name.len()).any(|w| w == *name));
    }
    // SAFETY: the loader's NUL-terminated name of this library, set by `init`.
    let own = unsafe { CStr::from_ptr(own) }.to_bytes();
    preload_entries(value).any(|entry| entry == own)
}

/// The entries of an `LD_PRELOAD` value, as the dynamic loader splits it (`:` or space).
pub fn preload_entries(value: &[u8]) -> impl Iterator<Item = &[u8]> {
    value.split(|&b| b == b':' || b == b' ').filter(|e| !e.is_empty())
}
/// Most environment strings looked at (a bound on the loop; past it nothing is judged).
const MAX_ENV: usize = 1 << 16;
/// Room for a path built on the stack: a program found on `PATH`, or a note's name in the
/// run's directory. Longer ones are not judged or noted (kept small: see [`HEAD_BYTES`]).
const PATH_BYTES: usize = 256;

/// Why the image `path` started with `envp` will not load this library, if it will not;
/// `None` too when that cannot be told (a path too long, a file that cannot be read: the
/// exec then fails or runs as the kernel decides).
pub fn judge(path: &CStr, envp: *const *const c_char) -> Option<Why> {
    if let Some(why) = judge_env(envp) {
        return Some(why);
    }
    judge_image(path).or_else(library_unreadable)
}

/// Whether this process, with the credentials it execs with, cannot read this library: one
/// of a tree that changed user (`su`, `runuser`), the library in a directory only the
/// tree's first user may enter. The loader then skips it with a message of its own.
fn library_unreadable() -> Option<Why> {
    let own = LIBRARY_PATH.load(Ordering::Acquire);
    if own.is_null() {
        return None;
    }
    // Opened as the loader opens it, with the credentials the exec keeps (not faccessat with
    // AT_EACCESS, whose system call a container's seccomp profile may refuse with EPERM).
    // SAFETY: the loader's NUL-terminated name of this library, set by `init`.
    let fd = unsafe { libc::open(own, libc::O_RDONLY | libc::O_CLOEXEC) };
    if fd < 0 {
        return match errno() {
            // Out of descriptors: so is the loader of the new image, unless the exec closes
            // some (`O_CLOEXEC`), which cannot be told apart from here cheaply for a large
            // limit: said only where none is.
            libc::EMFILE if closes_some_at_exec() => None,
            libc::EMFILE | libc::ENFILE => Some(Why::NoDescriptor),
            _ => Some(Why::Unreadable),
        };
    }
    // SAFETY: the descriptor just opened, closed once.
    unsafe { libc::close(fd) };
    None
}

/// Most descriptors looked at by [`closes_some_at_exec`]: a process with a larger limit that
/// holds all of them is taken to close none (said as [`Why::NoDescriptor`]).
const MAX_DESCRIPTORS_LOOKED_AT: c_int = 1 << 16;

/// Whether some descriptor of this process is closed by an exec (`FD_CLOEXEC`): the loader
/// of the new image then has one to open this library with. Bounded by
/// [`MAX_DESCRIPTORS_LOOKED_AT`] `fcntl` calls, made only when the process is out of them.
fn closes_some_at_exec() -> bool {
    let mut limit = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: getrlimit fills the struct it is given.
    let known = unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) } == 0;
    let end =
        if known { limit.rlim_cur.min(MAX_DESCRIPTORS_LOOKED_AT as u64) as c_int } else { MAX_DESCRIPTORS_LOOKED_AT };
    // SAFETY: F_GETFD reads a descriptor's flags; an unused number gives -1.
    (0..end).any(|fd| unsafe { libc::fcntl(fd, libc::F_GETFD) } & libc::FD_CLOEXEC > 0)
}

fn judge_env(envp: *const *const c_char) -> Option<Why> {
    if envp.is_null() {
        return Some(Why::NoPreload);
    }
    let (mut preload, mut config, mut disabled) = (false, false, false);
    for i in 0..MAX_ENV {
        // SAFETY: `envp` is a NULL-terminated array of strings (execve's contract); the loop
        // stops at its NULL.
        let s = unsafe { *envp.add(i) };
        if s.is_null() {
            return match (preload, config, disabled) {
                (false, _, _) => Some(Why::NoPreload),
                (true, false, _) => Some(Why::NoConfig),
                (true, true, true) => Some(Why::Disabled),
                (true, true, false) => None,
            };
        }
        // SAFETY: a NUL-terminated string of the caller's.
        let entry = unsafe { CStr::from_ptr(s) }.to_bytes();
        if let Some(value) = entry.strip_prefix(b"LD_PRELOAD=") {
            preload = names_this_library(value);
        } else if entry.starts_with(b"USWAP_STATS_DIR=") {
            config = true;
        } else if entry.starts_with(b"USWAP_DISABLE=") {
            disabled = true;
        }
    }
    None
}

/// ELF header fields (64-bit little-endian layout) that tell the loader apart.
const EI_CLASS: usize = 4;
const ELFCLASS32: u8 = 1;
const PT_INTERP: u32 = 3;
/// Most program headers looked at; an image with more is not judged.
const MAX_PHDRS: usize = 128;
const PHDR_BYTES: usize = 56;
/// Program headers read at a time past the first read.
const PHDRS_PER_READ: usize = 4;
/// Bytes read from the start of an image: the ELF header and its first program headers,
/// which linkers place right after it. Kept small: an exec may run on a small stack (a
/// thread's, an alternate signal stack), and each frame here is on it.
const HEAD_BYTES: usize = 256;

/// Why the image at `path` will not load this library, judged by the file: its set-ID bits
/// and capabilities, then its ELF headers. Only a regular file is opened (a FIFO's writer or
/// a terminal's lines are left alone), without blocking.
#[inline(never)]
fn judge_image(path: &CStr) -> Option<Why> {
    // SAFETY: `stat` is plain data, filled from a NUL-terminated path.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: as above.
    if unsafe { libc::stat(path.as_ptr(), &mut st) } != 0 || st.st_mode & libc::S_IFMT != libc::S_IFREG {
        return None;
    }
    // Before the open: a program that is executable but not readable (mode 4711) still has
    // its set-ID bits.
    if changes_credentials(&st, path) {
        return Some(Why::SetId);
    }
    let flags = libc::O_RDONLY | libc::O_CLOEXEC | libc::O_NONBLOCK | libc::O_NOCTTY;
    // SAFETY: `path` is NUL-terminated; open has no other memory effects.
    let fd = unsafe { libc::open(path.as_ptr(), flags) };
    if fd < 0 {
        return None;
    }
    let why = match elf_interpreter(fd) {
        Some(Interp::Elf32) => Some(Why::Elf32),
        // The dynamic loader run as a program (`ldd`, `ld.so PROGRAM`) loads the library.
        Some(Interp::None) if is_the_dynamic_loader(&st) => None,
        Some(Interp::None) => Some(Why::Static),
        Some(Interp::Some) if has_file_capabilities(fd, path) => Some(Why::SetId),
        Some(Interp::Some) | None => None,
    };
    // SAFETY: the descriptor opened above, closed once.
    unsafe { libc::close(fd) };
    why
}

/// Whether running `st` as a program makes the loader run it securely: the new effective
/// user or group (set-user-ID or set-group-ID bits) differs from the real one, or already
/// does; unless the process may gain no privileges (`PR_SET_NO_NEW_PRIVS`: containers,
/// `setpriv`) or the file is on a `nosuid` mount.
fn changes_credentials(st: &libc::stat, path: &CStr) -> bool {
    // SAFETY: these only read the process's credentials.
    let (uid, euid, gid, egid) = unsafe { (libc::getuid(), libc::geteuid(), libc::getgid(), libc::getegid()) };
    let new_euid = if st.st_mode & libc::S_ISUID != 0 { st.st_uid } else { euid };
    let set_gid = st.st_mode & libc::S_ISGID != 0 && st.st_mode & libc::S_IXGRP != 0;
    let new_egid = if set_gid { st.st_gid } else { egid };
    (new_euid != uid || new_egid != gid) && may_gain_privileges(path)
}

/// Whether an exec of `path` could give this process privileges (see
/// [`changes_credentials`]).
fn may_gain_privileges(path: &CStr) -> bool {
    // SAFETY: PR_GET_NO_NEW_PRIVS takes no pointer.
    if unsafe { libc::prctl(libc::PR_GET_NO_NEW_PRIVS, 0, 0, 0, 0) } == 1 {
        return false;
    }
    // SAFETY: `statvfs` is plain data that statvfs fills in (from the kernel's statfs
    // flags: no allocation, no file read) for a NUL-terminated path.
    let mut fs: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: as above.
    let ok = unsafe { libc::statvfs(path.as_ptr(), &mut fs) } == 0;
    !(ok && fs.f_flag & libc::ST_NOSUID != 0)
}

/// Whether the file `fd` has capabilities (`security.capability`), which make the loader run
/// it securely for a user whose real uid is not root.
fn has_file_capabilities(fd: libc::c_int, path: &CStr) -> bool {
    // SAFETY: getuid only reads the process's credentials.
    if unsafe { libc::getuid() } == 0 {
        return false;
    }
    // SAFETY: a size query (no buffer) of a NUL-terminated attribute name.
    let n = unsafe { libc::fgetxattr(fd, c"security.capability".as_ptr(), std::ptr::null_mut(), 0) };
    n > 0 && may_gain_privileges(path)
}

/// What an image's ELF headers say of its loader.
enum Interp {
    /// A `PT_INTERP`: the dynamic loader runs it.
    Some,
    /// None: nothing loads a library into it (static), unless it is the loader itself.
    None,
    /// A 32-bit image.
    Elf32,
}

/// Reads the ELF header and program headers of `fd`; `None` when it is no 64-bit or
/// 32-bit ELF this can read (a script, a file too short).
#[inline(never)]
fn elf_interpreter(fd: libc::c_int) -> Option<Interp> {
    let mut head = [0u8; HEAD_BYTES];
    // SAFETY: `head` is writable for its length.
    let n = unsafe { libc::pread(fd, head.as_mut_ptr().cast(), HEAD_BYTES, 0) };
    if n < 64 || &head[..4] != b"\x7fELF" {
        return None;
    }
    if head[EI_CLASS] == ELFCLASS32 {
        return Some(Interp::Elf32);
    }
    let phoff = u64::from_le_bytes(head[32..40].try_into().ok()?);
    let phentsize = u16::from_le_bytes([head[54], head[55]]) as usize;
    let phnum = u16::from_le_bytes([head[56], head[57]]) as usize;
    if phentsize != PHDR_BYTES || phnum == 0 || phnum > MAX_PHDRS {
        return None;
    }
    let is_interp = |ph: &[u8]| u32::from_le_bytes([ph[0], ph[1], ph[2], ph[3]]) == PT_INTERP;
    let mut chunk = [0u8; PHDRS_PER_READ * PHDR_BYTES];
    // Bounded: MAX_PHDRS headers, a few at a time.
    for first in (0..phnum).step_by(PHDRS_PER_READ) {
        let nr = (phnum - first).min(PHDRS_PER_READ);
        let at = phoff.checked_add((first * PHDR_BYTES) as u64)?;
        let end = at.checked_add((nr * PHDR_BYTES) as u64)?;
        let phdrs: &[u8] = if end <= n as u64 {
            &head[at as usize..end as usize]
        } else if read_exact_at(fd, &mut chunk[..nr * PHDR_BYTES], at) {
            &chunk[..nr * PHDR_BYTES]
        } else {
            return None;
        };
        if phdrs.chunks_exact(PHDR_BYTES).any(is_interp) {
            return Some(Interp::Some);
        }
    }
    Some(Interp::None)
}

/// Whether `st` is the dynamic loader this process was started by (its `PT_INTERP`, read
/// from the program headers in memory). Asked only of images without one: rare.
fn is_the_dynamic_loader(st: &libc::stat) -> bool {
    // SAFETY: getauxval reads the auxiliary vector; AT_PHDR and AT_PHNUM are the running
    // program's headers, mapped for the process's life.
    let (phdr, phnum) = unsafe { (libc::getauxval(libc::AT_PHDR), libc::getauxval(libc::AT_PHNUM)) };
    if phdr == 0 || phnum == 0 || phnum > MAX_PHDRS as u64 {
        return false;
    }
    // SAFETY: as above: `phnum` program headers at `phdr`.
    let phdrs = unsafe { std::slice::from_raw_parts(phdr as *const libc::Elf64_Phdr, phnum as usize) };
    let Some(own) = phdrs.iter().find(|p| p.p_type == libc::PT_PHDR) else { return false };
    let bias = phdr.wrapping_sub(own.p_vaddr);
    let Some(interp) = phdrs.iter().find(|p| p.p_type == PT_INTERP && p.p_filesz > 0 && p.p_filesz < 4096) else {
        return false;
    };
    // SAFETY: the interpreter's path, `p_filesz` bytes of the program's image that the kernel
    // read to start it (it lies in the first loaded segment, which stays mapped).
    let bytes =
        unsafe { std::slice::from_raw_parts(bias.wrapping_add(interp.p_vaddr) as *const u8, interp.p_filesz as usize) };
    let Ok(path) = CStr::from_bytes_until_nul(bytes) else { return false };
    // SAFETY: `stat` is plain data, filled from a NUL-terminated path.
    let mut loader: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: as above.
    let found = unsafe { libc::stat(path.as_ptr(), &mut loader) } == 0;
    found && loader.st_dev == st.st_dev && loader.st_ino == st.st_ino
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

    /// Appends as much of `part` as fits with the NUL.
    fn push_cut(&mut self, part: &[u8]) {
        let room = PATH_BYTES - 1 - self.len;
        self.push(&part[..part.len().min(room)]);
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
#[inline(never)]
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
            // Too long to judge: not another file than the one `execvp` would run.
            return None;
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

/// Notes one process may leave under one pid (a pid that came back, an exec that failed
/// and was taken back leaves none).
const MAX_NOTES_PER_PID: u64 = 16;

/// The `n`th note of process `pid` in the run's directory `dir`: `dir/escaped-<pid>.txt`,
/// then `dir/escaped-<pid>.<n>.txt`.
fn note_path(dir: &[u8], pid: libc::pid_t, n: u64) -> Option<StackPath> {
    named_note_path(dir, ESCAPE_PREFIX, pid, n)
}

/// `dir/<prefix><pid>.txt`, then `dir/<prefix><pid>.<n>.txt`.
fn named_note_path(dir: &[u8], prefix: &str, pid: libc::pid_t, n: u64) -> Option<StackPath> {
    let (mut digits, mut n_digits) = ([0u8; 20], [0u8; 20]);
    let mut file = StackPath::new();
    let made = file.push(dir)
        && file.push(b"/")
        && file.push(prefix.as_bytes())
        && file.push(decimal(&mut digits, pid.max(0) as u64))
        && (n == 0 || (file.push(b".") && file.push(decimal(&mut n_digits, n))))
        && file.push(b".txt");
    made.then_some(file)
}

/// Leaves a note in the run's directory `dir`: `path: why`, in a file of its own (an earlier
/// process with the same pid keeps its note). Returns the note's number, to take it back
/// after an exec that failed.
#[inline(never)]
pub fn note(dir: &[u8], pid: libc::pid_t, path: &CStr, why: Why) -> Option<u64> {
    let flags = libc::O_WRONLY | libc::O_CREAT | libc::O_EXCL | libc::O_CLOEXEC | libc::O_NOFOLLOW;
    // Bounded: MAX_NOTES_PER_PID names.
    let opened = (0..MAX_NOTES_PER_PID).find_map(|n| {
        let file = note_path(dir, pid, n)?;
        // SAFETY: a NUL-terminated path; open has no other memory effects.
        let fd = unsafe { libc::open(file.as_cstr().as_ptr(), flags, 0o600 as libc::c_uint) };
        match fd >= 0 {
            true => Some(Ok((n, fd))),
            false if errno() == libc::EEXIST => None,
            false => Some(Err(())),
        }
    });
    let Some(Ok((n, fd))) = opened else { return note_as_link(dir, pid, path, why) };
    for part in [path.to_bytes(), b": ", why.text().as_bytes(), b"\n"] {
        // SAFETY: `part` is readable for its length. A short write leaves a shorter note,
        // which still counts the process.
        unsafe { libc::write(fd, part.as_ptr().cast(), part.len()) };
    }
    // SAFETY: the descriptor opened above, closed once.
    unsafe { libc::close(fd) };
    Some(n)
}

/// Leaves `msg` as this process's refusal in the run's directory (`refused-<pid>.txt`,
/// which fails the run), under `uswap run`: a process that could not get its pager and runs
/// on unmanaged. Allocation-free.
pub fn note_refusal(msg: &[u8]) {
    let Some(dir) = run_dir() else { return };
    // SAFETY: getpid is a plain system call.
    let pid = unsafe { libc::getpid() };
    let flags = libc::O_WRONLY | libc::O_CREAT | libc::O_EXCL | libc::O_CLOEXEC | libc::O_NOFOLLOW;
    // Bounded: MAX_NOTES_PER_PID names.
    for n in 0..MAX_NOTES_PER_PID {
        let Some(file) = named_note_path(dir, REFUSAL_PREFIX, pid, n) else { return };
        // SAFETY: a NUL-terminated path; open has no other memory effects.
        let fd = unsafe { libc::open(file.as_cstr().as_ptr(), flags, 0o600 as libc::c_uint) };
        if fd >= 0 {
            // SAFETY: `msg` is readable for its length; the descriptor just opened, closed once.
            unsafe {
                libc::write(fd, msg.as_ptr().cast(), msg.len());
                libc::close(fd);
            }
            return;
        }
        match errno() {
            libc::EEXIST => continue,
            // Out of descriptors (what such a process may be refused for): a link takes none.
            libc::EMFILE | libc::ENFILE => return link_refusal(dir, pid, msg),
            _ => return,
        }
    }
}

/// [`note_refusal`] as a symbolic link whose target is the message (cut to a
/// [`StackPath`]), which `uswap run` reads as it reads a note's.
fn link_refusal(dir: &[u8], pid: libc::pid_t, msg: &[u8]) {
    let mut text = StackPath::new();
    text.push_cut(msg.strip_suffix(b"\n").unwrap_or(msg));
    // Bounded: MAX_NOTES_PER_PID names.
    for n in 0..MAX_NOTES_PER_PID {
        let Some(file) = named_note_path(dir, REFUSAL_PREFIX, pid, n) else { return };
        // SAFETY: two NUL-terminated paths; symlink has no other memory effects.
        if unsafe { libc::symlink(text.as_cstr().as_ptr(), file.as_cstr().as_ptr()) } == 0 || errno() != libc::EEXIST {
            return;
        }
    }
}

/// Leaves the note as a symbolic link whose target is its text, where no file could be
/// opened for it (the process holds every descriptor its limit allows): `symlink` takes no
/// descriptor, and `uswap run` reads the target. A note longer than a [`StackPath`] is cut.
fn note_as_link(dir: &[u8], pid: libc::pid_t, path: &CStr, why: Why) -> Option<u64> {
    let mut text = StackPath::new();
    for part in [path.to_bytes(), b": ", why.text().as_bytes()] {
        text.push_cut(part);
    }
    // Bounded: MAX_NOTES_PER_PID names.
    for n in 0..MAX_NOTES_PER_PID {
        let file = note_path(dir, pid, n)?;
        // SAFETY: two NUL-terminated paths; symlink has no other memory effects.
        if unsafe { libc::symlink(text.as_cstr().as_ptr(), file.as_cstr().as_ptr()) } == 0 {
            return Some(n);
        }
        if errno() != libc::EEXIST {
            return None;
        }
    }
    None
}

/// Takes back the `n`th note of process `pid` (its exec failed: it runs on under the
/// budget).
pub fn unnote(dir: &[u8], pid: libc::pid_t, n: u64) {
    if let Some(file) = note_path(dir, pid, n) {
        // SAFETY: a NUL-terminated path.
        unsafe { libc::unlink(file.as_cstr().as_ptr()) };
    }
}

/// Notes this process itself as outside the budget for `why` (its library stands aside),
/// under `uswap run`. Not under valgrind where the exec of its tool was noted already: the
/// tool is a static program, and the program it runs, in the same process, loads this
/// library (one process, one note). From the constructor: allocates.
pub fn note_this_process(why: Why) {
    use std::os::unix::ffi::OsStrExt;
    let Some(dir) = run_dir() else { return };
    // SAFETY: getpid takes no arguments and cannot fail.
    let pid = unsafe { libc::getpid() };
    if why == Why::Valgrind && noted_static(dir, pid) {
        return;
    }
    let path = program_name().or_else(|| {
        let exe = std::fs::read_link("/proc/self/exe").unwrap_or_else(|_| "(its executable)".into());
        std::ffi::CString::new(exe.as_os_str().as_bytes()).ok()
    });
    let Some(path) = path else { return };
    note(dir, pid, &path, why);
}

/// Whether a note of process `pid` in the run's directory `dir` says that it started a
/// static image (valgrind's tool; a note of an earlier process with the same pid would
/// say so too, which takes a run long enough for pids to wrap).
fn noted_static(dir: &[u8], pid: libc::pid_t) -> bool {
    let static_text = Why::Static.text().as_bytes();
    (0..MAX_NOTES_PER_PID).filter_map(|n| note_path(dir, pid, n)).any(|file| {
        use std::os::unix::ffi::OsStrExt;
        let path = std::ffi::OsStr::from_bytes(file.as_cstr().to_bytes());
        std::fs::read(path).is_ok_and(|note| note.windows(static_text.len()).any(|w| w == static_text))
    })
}

/// The program's path as given to the dynamic loader where the loader was run as a program
/// (`ld.so PROGRAM`: `/proc/self/exe` is then the loader, and the kernel, which started no
/// interpreter, gave no `AT_BASE`); the loader has made it the program's `argv[0]`. `None`
/// where the kernel started the program.
fn program_name() -> Option<std::ffi::CString> {
    extern "C" {
        static program_invocation_name: *const c_char;
    }
    // SAFETY: getauxval reads the auxiliary vector; it has no failure mode but 0.
    if unsafe { libc::getauxval(libc::AT_BASE) } != 0 {
        return None;
    }
    // SAFETY: the C library's copy of `argv[0]`, set before any constructor runs; read once.
    let name = unsafe { program_invocation_name };
    // SAFETY: non-null, a NUL-terminated string of the C library's.
    (!name.is_null()).then(|| unsafe { CStr::from_ptr(name) }.to_owned())
}

/// The run's directory, under `uswap run` ([`init`]).
fn run_dir() -> Option<&'static [u8]> {
    let dir = RUN_DIR.load(Ordering::Acquire);
    // SAFETY: set by `init` from a slice that lives as long as the process, with its length.
    (!dir.is_null()).then(|| unsafe { std::slice::from_raw_parts(dir, RUN_DIR_LEN.load(Ordering::Relaxed)) })
}

/// A note left before an exec, taken back if the exec fails ([`take_back`]).
pub struct Noted {
    pid: libc::pid_t,
    n: u64,
}

/// Before an exec of `path` (a path, or with `search` a name looked for on `PATH` as
/// `execvp` does) with `envp`: notes this process if the new image will leave the budget
/// (see the module documentation). Not inlined, and nothing of it is on the stack once it
/// returns: the exec that follows may run on a small stack (a thread's, an alternate
/// signal stack) and needs it for the C library's own `execvp` and the kernel's call.
#[inline(never)]
pub fn note_before_exec(path: Option<&CStr>, search: bool, envp: *const *const c_char) -> Option<Noted> {
    let (dir, path) = (run_dir()?, path?);
    if search {
        return note_found(dir, path, envp);
    }
    note_image(dir, path, envp)
}

/// [`note_before_exec`] for a name looked for on `PATH`: the path found is on the stack
/// only here.
#[inline(never)]
fn note_found(dir: &[u8], name: &CStr, envp: *const *const c_char) -> Option<Noted> {
    let found = resolve(name)?;
    note_image(dir, found.as_cstr(), envp)
}

fn note_image(dir: &[u8], image: &CStr, envp: *const *const c_char) -> Option<Noted> {
    let why = judge(image, envp)?;
    // SAFETY: getpid is a plain system call (the child's own pid in a vfork child).
    let pid = unsafe { libc::getpid() };
    note(dir, pid, image, why).map(|n| Noted { pid, n })
}

/// After an exec that returned (it failed): takes its note back, the caller's errno kept.
pub fn take_back(noted: Option<Noted>) {
    let (Some(noted), Some(dir)) = (noted, run_dir()) else { return };
    let e = errno();
    unnote(dir, noted.pid, noted.n);
    set_errno(e);
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

/// The C library's `posix_spawn` and `posix_spawnp`.
pub type PosixSpawnFn = unsafe extern "C" fn(
    *mut libc::pid_t,
    *const c_char,
    *const libc::posix_spawn_file_actions_t,
    *const libc::posix_spawnattr_t,
    *const *mut c_char,
    *const *mut c_char,
) -> c_int;

/// `posix_spawn` (with `search`, `posix_spawnp`) made by `real`, the C library's (whose
/// exec the C library makes itself): the child is noted once started, if its image leaves
/// the budget; `posix_spawnp`'s program is found on `PATH` as the C library finds it.
///
/// # Safety
/// As the C library's `posix_spawn`, `real` being it or `posix_spawnp`.
#[allow(clippy::too_many_arguments)]
pub unsafe fn spawn(
    real: PosixSpawnFn,
    search: bool,
    pid: *mut libc::pid_t,
    path: *const c_char,
    actions: *const libc::posix_spawn_file_actions_t,
    attr: *const libc::posix_spawnattr_t,
    argv: *const *mut c_char,
    envp: *const *mut c_char,
) -> c_int {
    spawn_noted(
        pid,
        envp,
        // SAFETY: the caller's arguments, passed on, the child's pid to a local first.
        |child| unsafe { real(child, path, actions, attr, argv, envp) },
        || {
            // SAFETY: a NUL-terminated path or name of the caller's, when not null (a path
            // without a `/` is relative to the working directory for `posix_spawn`).
            let path = (!path.is_null()).then(|| unsafe { CStr::from_ptr(path) })?;
            if search {
                resolve(path)
            } else {
                StackPath::of(path)
            }
        },
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
