//! What each entry point does while the engine is not loaded (`build.rs` generates the
//! entry points; its `SYMBOLS` say which are watched here): a watcher gets the call's
//! arguments as the C function does and returns a [`Decision`], either the call served here
//! or a function to jump to with the arguments as they came (the C library's, or, once a
//! watcher loaded it, the engine's).
//!
//! Counted here: the usable bytes of the C library's live blocks the program got (the
//! engine's lazy start brings mimalloc up past them, so the engine is loaded before they pass
//! [`handoff::heap_threshold_bytes`]; the count is handed to the engine, `handoff`), and the
//! bytes of small anonymous mappings (which only decide when to load it: the engine counts
//! its own from its load on).

use std::ffi::{c_char, c_int, c_long, c_ulong, c_void, CStr};
use std::sync::atomic::{AtomicUsize, Ordering};

use crate::c_library::{c_library_fn, set_errno};
use crate::names::*;
use crate::{alloc, engine, handoff};

/// A watcher's answer, returned in `rax:rdx`: `target` 0, the call returns `value`;
/// otherwise the entry point jumps to `target` with its arguments.
#[repr(C)]
pub struct Decision {
    value: usize,
    target: usize,
}

fn value(v: usize) -> Decision {
    Decision { value: v, target: 0 }
}

fn jump(target: usize) -> Decision {
    debug_assert!(target != 0);
    Decision { value: 0, target }
}

/// Where entry point `i` goes once the engine is loaded.
fn engine_fn(i: usize) -> usize {
    engine::slot(i).load(Ordering::Acquire)
}

/// An entry point passed on to the C library: its slot goes straight there from now on
/// (unless the engine took it meanwhile).
pub fn forward(i: usize) -> Decision {
    if engine::loaded() {
        return jump(engine_fn(i));
    }
    let f = c_library_fn(i);
    let watch = engine::slot(i).load(Ordering::Acquire);
    // A slot read after a load began may already be the engine's (a load stores them before
    // it says it is done): it is kept then.
    if engine::never_began() {
        let _ = engine::slot(i).compare_exchange(watch, f, Ordering::AcqRel, Ordering::Acquire);
    }
    jump(f)
}

/// An entry point that needs the engine: loaded, then its function.
pub fn load_then(i: usize) -> Decision {
    if engine::load(NAMES[i].to_str().unwrap_or("a call")) {
        return jump(engine_fn(i));
    }
    jump(c_library_fn(i))
}

/// Loads the engine for `cause` unless this thread is loading it; then entry point `i`'s
/// function, if it is loaded.
fn engine_for(i: usize, cause: &str) -> Option<Decision> {
    if engine::loaded() {
        return Some(jump(engine_fn(i)));
    }
    (!engine::loading_here() && engine::load(cause)).then(|| jump(engine_fn(i)))
}

// ---- The heap ----

/// An allocation of `size` more bytes of entry point `i`: the engine's, if it is loaded or
/// the heap would pass the threshold.
fn heap_engine(i: usize, size: usize) -> Option<Decision> {
    if engine::loaded() {
        return Some(jump(engine_fn(i)));
    }
    let live = handoff::c_heap_live_bytes().max(0) as usize;
    if live.saturating_add(size) <= handoff::heap_threshold_bytes() {
        return None;
    }
    engine_for(i, "its heap")
}

/// Counts block `p`, just allocated (null, or a bootstrap block, counts nothing).
fn count(p: *mut c_void) -> usize {
    if !engine::loading_here() {
        // SAFETY: null or a live block of this allocator, just returned.
        let bytes = unsafe { alloc::counted_bytes(p) };
        if bytes > 0 {
            handoff::add_c_heap_bytes(bytes as isize);
        }
    }
    p as usize
}

/// The counted size of block `p`, about to be freed or resized (0 for a bootstrap one).
fn counted(p: *mut c_void) -> usize {
    // SAFETY: null or a live block of this allocator (the caller's contract).
    unsafe { alloc::counted_bytes(p) }
}

pub extern "C" fn malloc(size: usize) -> Decision {
    heap_engine(I_malloc, size).unwrap_or_else(|| value(count(alloc::malloc(size))))
}

pub extern "C" fn __libc_malloc(size: usize) -> Decision {
    heap_engine(I___libc_malloc, size).unwrap_or_else(|| value(count(alloc::malloc(size))))
}

pub extern "C" fn calloc(n: usize, size: usize) -> Decision {
    let bytes = n.saturating_mul(size);
    heap_engine(I_calloc, bytes).unwrap_or_else(|| value(count(alloc::calloc(n, size))))
}

pub extern "C" fn __libc_calloc(n: usize, size: usize) -> Decision {
    let bytes = n.saturating_mul(size);
    heap_engine(I___libc_calloc, bytes).unwrap_or_else(|| value(count(alloc::calloc(n, size))))
}

fn realloc_in(i: usize, p: *mut c_void, size: usize) -> Decision {
    let old = counted(p);
    if let Some(d) = heap_engine(i, size.saturating_sub(old)) {
        return d;
    }
    // SAFETY: the caller's block, of the C library's malloc or the bootstrap area (the
    // engine is not loaded, so no other allocator served it).
    let n = unsafe { alloc::realloc(p, size) };
    if size == 0 || !n.is_null() {
        handoff::add_c_heap_bytes(-(old as isize));
        return value(count(n));
    }
    value(0)
}

pub extern "C" fn realloc(p: *mut c_void, size: usize) -> Decision {
    realloc_in(I_realloc, p, size)
}

pub extern "C" fn __libc_realloc(p: *mut c_void, size: usize) -> Decision {
    realloc_in(I___libc_realloc, p, size)
}

pub extern "C" fn reallocarray(p: *mut c_void, n: usize, size: usize) -> Decision {
    match n.checked_mul(size) {
        // A jump to the engine's reallocarray takes the call as it came.
        Some(bytes) => realloc_in(I_reallocarray, p, bytes),
        None => {
            set_errno(libc::ENOMEM);
            value(0)
        }
    }
}

fn free_in(i: usize, p: *mut c_void) -> Decision {
    if engine::loaded() {
        return jump(engine_fn(i));
    }
    let old = counted(p);
    handoff::add_c_heap_bytes(-(old as isize));
    // SAFETY: the caller's block (see `realloc_in`).
    unsafe { alloc::free(p) };
    value(0)
}

pub extern "C" fn free(p: *mut c_void) -> Decision {
    free_in(I_free, p)
}

pub extern "C" fn cfree(p: *mut c_void) -> Decision {
    free_in(I_cfree, p)
}

pub extern "C" fn __libc_free(p: *mut c_void) -> Decision {
    free_in(I___libc_free, p)
}

pub extern "C" fn malloc_usable_size(p: *mut c_void) -> Decision {
    if engine::loaded() {
        return jump(engine_fn(I_malloc_usable_size));
    }
    // SAFETY: the caller's block (see `realloc_in`).
    value(unsafe { alloc::usable_size(p) })
}

fn aligned_in(i: usize, align: usize, size: usize) -> Decision {
    heap_engine(i, size).unwrap_or_else(|| value(count(alloc::memalign(align, size))))
}

pub extern "C" fn memalign(align: usize, size: usize) -> Decision {
    aligned_in(I_memalign, align, size)
}

pub extern "C" fn __libc_memalign(align: usize, size: usize) -> Decision {
    aligned_in(I___libc_memalign, align, size)
}

pub extern "C" fn aligned_alloc(align: usize, size: usize) -> Decision {
    aligned_in(I_aligned_alloc, align, size)
}

fn page_bytes() -> usize {
    // SAFETY: sysconf reads a constant.
    unsafe { libc::sysconf(libc::_SC_PAGESIZE) }.max(4096) as usize
}

pub extern "C" fn valloc(size: usize) -> Decision {
    aligned_in(I_valloc, page_bytes(), size)
}

pub extern "C" fn __libc_valloc(size: usize) -> Decision {
    aligned_in(I___libc_valloc, page_bytes(), size)
}

pub extern "C" fn pvalloc(size: usize) -> Decision {
    let page = page_bytes();
    aligned_in(I_pvalloc, page, size.max(1).next_multiple_of(page))
}

pub extern "C" fn __libc_pvalloc(size: usize) -> Decision {
    let page = page_bytes();
    aligned_in(I___libc_pvalloc, page, size.max(1).next_multiple_of(page))
}

pub extern "C" fn posix_memalign(out: *mut *mut c_void, align: usize, size: usize) -> Decision {
    if let Some(d) = heap_engine(I_posix_memalign, size) {
        return d;
    }
    if align % std::mem::size_of::<usize>() != 0 || !align.is_power_of_two() {
        return value(libc::EINVAL as usize);
    }
    let p = count(alloc::memalign(align, size));
    if p == 0 {
        return value(libc::ENOMEM as usize);
    }
    // SAFETY: the caller's out-pointer (posix_memalign's contract).
    unsafe { *out = p as *mut c_void };
    value(0)
}

/// `dlopen` with `RTLD_DEEPBIND`: the engine clears the flag (its `deep_bind`), or the
/// library's `free` would be the C library's once mimalloc serves the program; loaded for it.
pub extern "C" fn dlopen(_file: *const c_char, flags: c_int) -> Decision {
    if flags & libc::RTLD_DEEPBIND != 0 {
        if let Some(d) = engine_for(I_dlopen, "a library loaded with RTLD_DEEPBIND") {
            return d;
        }
    }
    through(I_dlopen)
}

// ---- Mappings, threads, limits ----

/// Small anonymous mappings' bytes (not less when unmapped: the engine is loaded early, never
/// late).
static SMALL_MAPPING_BYTES: AtomicUsize = AtomicUsize::new(0);

/// An anonymous mapping (private or shared: the engine manages the one, and starts a pager
/// to measure the other as unmanaged) of `--min-size` or more loads the engine first.
fn mmap_in(i: usize, len: usize, flags: c_int) -> Decision {
    if flags & libc::MAP_ANONYMOUS != 0 && !engine::loaded() {
        let cause = if len >= handoff::min_size_bytes() {
            Some("a mapping it would manage")
        } else {
            let small = SMALL_MAPPING_BYTES.fetch_add(len, Ordering::Relaxed).saturating_add(len);
            (small >= handoff::start_after_bytes()).then_some("its small mappings")
        };
        if let Some(d) = cause.and_then(|cause| engine_for(i, cause)) {
            return d;
        }
    }
    if engine::loaded() {
        return jump(engine_fn(i));
    }
    jump(c_library_fn(i))
}

pub extern "C" fn mmap(_addr: *mut c_void, len: usize, _prot: c_int, flags: c_int) -> Decision {
    mmap_in(I_mmap, len, flags)
}

pub extern "C" fn mmap64(_addr: *mut c_void, len: usize, _prot: c_int, flags: c_int) -> Decision {
    mmap_in(I_mmap64, len, flags)
}

/// The C library's `clone(fn, stack, flags, arg, ...)`: a thread (`CLONE_VM`) needs the
/// engine; a fork-like child of a process without a pager has nothing out.
pub extern "C" fn clone(_f: *mut c_void, _stack: *mut c_void, flags: c_int) -> Decision {
    if flags & libc::CLONE_VM != 0 {
        if let Some(d) = engine_for(I_clone, "a thread") {
            return d;
        }
    }
    through(I_clone)
}

/// Entry point `i`'s function: the engine's if loaded, the C library's otherwise.
fn through(i: usize) -> Decision {
    if engine::loaded() {
        return jump(engine_fn(i));
    }
    jump(c_library_fn(i))
}

/// Whether `request` is one of userfaultfd's ioctls (`UFFDIO_*`, type 0xAA).
fn is_uffdio(request: c_ulong) -> bool {
    (request >> 8) & 0xff == 0xaa
}

/// `syscall(n, ...)`: the calls the engine takes apart (the program's break, its own
/// userfaultfd) load it; a seccomp filter installed this way is noted.
pub extern "C" fn syscall(n: c_long, a1: c_long, a2: c_long, a3: c_long, a4: c_long, a5: c_long) -> Decision {
    if engine::loaded() {
        return jump(engine_fn(I_syscall));
    }
    let cause = match n {
        libc::SYS_brk => Some("its own break"),
        libc::SYS_ioctl if is_uffdio(a2 as c_ulong) => Some("its own userfaultfd"),
        _ => None,
    };
    if let Some(d) = cause.and_then(|cause| engine_for(I_syscall, cause)) {
        return d;
    }
    if n == libc::SYS_prctl || n == libc::SYS_seccomp {
        type SyscallFn = unsafe extern "C" fn(c_long, c_long, c_long, c_long, c_long, c_long) -> c_long;
        // Not `libc::syscall`: that name is this library's own entry point, which would come
        // back here.
        // SAFETY: the C library's syscall, with the program's system call and arguments
        // (prctl takes five, seccomp three).
        let r = unsafe { std::mem::transmute::<usize, SyscallFn>(c_library_fn(I_syscall))(n, a1, a2, a3, a4, a5) };
        note_filter(n, a1, a2, r);
        return value(r as usize);
    }
    jump(c_library_fn(I_syscall))
}

pub extern "C" fn ioctl(_fd: c_int, request: c_ulong) -> Decision {
    if is_uffdio(request) {
        if let Some(d) = engine_for(I_ioctl, "its own userfaultfd") {
            return d;
        }
    }
    through(I_ioctl)
}

type PrctlFn = unsafe extern "C" fn(c_int, c_ulong, c_ulong, c_ulong, c_ulong) -> c_int;

pub extern "C" fn prctl(op: c_int, a2: c_ulong, a3: c_ulong, a4: c_ulong, a5: c_ulong) -> Decision {
    if engine::loaded() {
        return jump(engine_fn(I_prctl));
    }
    // SAFETY: the C library's prctl, with the program's arguments.
    let r = unsafe { std::mem::transmute::<usize, PrctlFn>(c_library_fn(I_prctl))(op, a2, a3, a4, a5) };
    note_filter(libc::SYS_prctl, c_long::from(op), a2 as c_long, c_long::from(r));
    value(r as usize)
}

/// After a `prctl` or `seccomp` call that installed a filter (or strict mode), the engine is
/// never loaded: its start's calls and threads would be the filter's (the preload library's
/// `program_seccomp`).
fn note_filter(n: c_long, a1: c_long, a2: c_long, ret: c_long) {
    const PR_SET_SECCOMP: c_long = 22;
    let installs = match n {
        libc::SYS_prctl => a1 == PR_SET_SECCOMP && (a2 == 1 || a2 == 2),
        libc::SYS_seccomp => a1 == 0 || a1 == 1,
        _ => false,
    };
    if installs && ret >= 0 {
        engine::never_after_filter();
    }
}

/// An address-space or data limit the program sets on itself: the engine fits its
/// reservations around it (the preload library's `rlimit`).
fn limit_engine(i: usize, resource: c_int, setting: bool) -> Decision {
    if setting && (resource == libc::RLIMIT_AS as c_int || resource == libc::RLIMIT_DATA as c_int) {
        if let Some(d) = engine_for(i, "an address-space or data limit") {
            return d;
        }
    }
    through(i)
}

pub extern "C" fn setrlimit(resource: c_int) -> Decision {
    limit_engine(I_setrlimit, resource, true)
}

pub extern "C" fn setrlimit64(resource: c_int) -> Decision {
    limit_engine(I_setrlimit64, resource, true)
}

fn own_pid(pid: libc::pid_t) -> bool {
    // SAFETY: getpid is a plain system call.
    pid == 0 || pid == unsafe { libc::getpid() }
}

pub extern "C" fn prlimit(pid: libc::pid_t, resource: c_int, new: *const c_void) -> Decision {
    limit_engine(I_prlimit, resource, !new.is_null() && own_pid(pid))
}

pub extern "C" fn prlimit64(pid: libc::pid_t, resource: c_int, new: *const c_void) -> Decision {
    limit_engine(I_prlimit64, resource, !new.is_null() && own_pid(pid))
}

// ---- Execs ----

type ExecveFn = unsafe extern "C" fn(*const c_char, *const *const c_char, *const *const c_char) -> c_int;

extern "C" {
    static __environ: *const *const c_char;
}

/// An exec of `path` (with `search`, a name looked for on `PATH`) through entry point `i`,
/// made by the C library's `execve` (or `execvpe`) entry point `c`: the engine's `i` where
/// it is loaded; otherwise judged first (an image that leaves the budget is noted; the note
/// taken back if the exec returns).
fn exec_in(
    i: usize,
    c: usize,
    path: *const c_char,
    argv: *const *const c_char,
    envp: *const *const c_char,
) -> Decision {
    if engine::loaded() {
        return jump(engine_fn(i));
    }
    // SAFETY: a NUL-terminated path of the caller's, when not null (execve's contract).
    let image = (!path.is_null()).then(|| unsafe { CStr::from_ptr(path) });
    let noted = uswap_escape::note_before_exec(image, c == I_execvpe, envp);
    // SAFETY: the C library's function of this type, with the caller's arguments.
    let r = unsafe { std::mem::transmute::<usize, ExecveFn>(c_library_fn(c))(path, argv, envp) };
    uswap_escape::take_back(noted);
    value(r as usize)
}

pub extern "C" fn execve(path: *const c_char, argv: *const *const c_char, envp: *const *const c_char) -> Decision {
    exec_in(I_execve, I_execve, path, argv, envp)
}

pub extern "C" fn execvpe(file: *const c_char, argv: *const *const c_char, envp: *const *const c_char) -> Decision {
    exec_in(I_execvpe, I_execvpe, file, argv, envp)
}

pub extern "C" fn execv(path: *const c_char, argv: *const *const c_char) -> Decision {
    // SAFETY: the process's environment, as execv passes it.
    exec_in(I_execv, I_execve, path, argv, unsafe { __environ })
}

pub extern "C" fn execvp(file: *const c_char, argv: *const *const c_char) -> Decision {
    // SAFETY: as in `execv`.
    exec_in(I_execvp, I_execvpe, file, argv, unsafe { __environ })
}

pub extern "C" fn posix_spawn(
    pid: *mut libc::pid_t,
    path: *const c_char,
    actions: *const libc::posix_spawn_file_actions_t,
    attr: *const libc::posix_spawnattr_t,
    argv: *const *mut c_char,
    envp: *const *mut c_char,
) -> Decision {
    spawn_in(I_posix_spawn, false, pid, path, actions, attr, argv, envp)
}

pub extern "C" fn posix_spawnp(
    pid: *mut libc::pid_t,
    file: *const c_char,
    actions: *const libc::posix_spawn_file_actions_t,
    attr: *const libc::posix_spawnattr_t,
    argv: *const *mut c_char,
    envp: *const *mut c_char,
) -> Decision {
    spawn_in(I_posix_spawnp, true, pid, file, actions, attr, argv, envp)
}

#[allow(clippy::too_many_arguments)]
fn spawn_in(
    i: usize,
    search: bool,
    pid: *mut libc::pid_t,
    path: *const c_char,
    actions: *const libc::posix_spawn_file_actions_t,
    attr: *const libc::posix_spawnattr_t,
    argv: *const *mut c_char,
    envp: *const *mut c_char,
) -> Decision {
    if engine::loaded() {
        return jump(engine_fn(i));
    }
    // SAFETY: the C library's posix_spawn or posix_spawnp.
    let real = unsafe { std::mem::transmute::<usize, uswap_escape::PosixSpawnFn>(c_library_fn(i)) };
    // SAFETY: the caller's arguments, as the C library's function takes them.
    let r = unsafe { uswap_escape::spawn(real, search, pid, path, actions, attr, argv, envp) };
    value(r as usize)
}
