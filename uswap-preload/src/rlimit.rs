//! Address-space and data limits a managed program sets on itself (`ulimit -v` and
//! `ulimit -d` in a shell, `setrlimit(RLIMIT_AS)` and `setrlimit(RLIMIT_DATA)`): the program
//! gets the room it asked for, and uswap's own reservations come on top. (A data limit
//! counts private writable mappings: uswap's pools and staging areas are such.)
//!
//! Why: the kernel counts every mapping against `RLIMIT_AS`, uswap's reservations included
//! (the managed heap, a compressed pool's arena and its staging area: tens of GiB of address
//! space, none of it committed). A shell under `uswap run` that ran `ulimit -v 2000000` had
//! a limit far below what it already held; from then on every new mapping failed, and the
//! next allocation of one of uswap's threads aborted the shell ("memory allocation of
//! 131072 bytes failed"), while its fork children could not build a pager of their own.
//!
//! So, once the pager runs, a limit the program sets on itself reaches the kernel raised by
//! [`reserve_bytes`]; `getrlimit` and `prlimit` report the limit the program set. An
//! `execve` (and `execv`, `execvp`, `execvpe`) carries the limits the program set in
//! `USWAP_ADDRESS_SPACE_LIMIT` and `USWAP_DATA_LIMIT`, and the new image's library sizes its
//! reservations to them (`config`), then raises the kernel's limits by its own reservations
//! only ([`refit`]). A program started another way (`posix_spawn`, `execl`), or one that is
//! not managed, runs under the raised limits.
//!
//! State: per limit, the one the program set and the one given to the kernel, two pairs of
//! atomics written by the program's calls (a process sets its limits from one thread at a time in
//! practice; a race only makes `getrlimit` report the kernel's value). A fork child
//! inherits both with the limit.

use std::ffi::{c_char, c_int, c_void};
use std::sync::atomic::{AtomicPtr, AtomicU64, Ordering};

/// Carries the address-space limit the program set across `execve`:
/// `SOFT:HARD:GIVEN_SOFT:GIVEN_HARD`.
pub const ENV_ADDRESS_SPACE_LIMIT: &str = "USWAP_ADDRESS_SPACE_LIMIT";
/// Carries the data limit the program set across `execve`, as the address-space limit.
pub const ENV_DATA_LIMIT: &str = "USWAP_DATA_LIMIT";

/// Room for what uswap's threads allocate from the C library's malloc (its `brk` heap) after
/// the limit is set.
const THREADS_SLACK_BYTES: u64 = 512 << 20;

const NONE: u64 = 0;

/// One limit uswap's reservations count against, as the program set it and as the kernel
/// was given it (every field `NONE` until the program set one).
struct Limit {
    resource: c_int,
    set_soft: AtomicU64,
    set_hard: AtomicU64,
    given_soft: AtomicU64,
    given_hard: AtomicU64,
}

impl Limit {
    const fn new(resource: c_int) -> Limit {
        Limit {
            resource,
            set_soft: AtomicU64::new(NONE),
            set_hard: AtomicU64::new(NONE),
            given_soft: AtomicU64::new(NONE),
            given_hard: AtomicU64::new(NONE),
        }
    }
}

/// `RLIMIT_AS`: every mapping counts.
static ADDRESS_SPACE: Limit = Limit::new(libc::RLIMIT_AS as c_int);
/// `RLIMIT_DATA`: private writable mappings count, which uswap's pools and staging areas are.
/// A program that set it with a pager running got allocation failures where it had room
/// without uswap.
static DATA: Limit = Limit::new(libc::RLIMIT_DATA as c_int);

/// The limits carried across exec, each with the variable that carries it.
const CARRIED: [(&Limit, &str); 2] = [(&ADDRESS_SPACE, ENV_ADDRESS_SPACE_LIMIT), (&DATA, ENV_DATA_LIMIT)];

/// Address space uswap reserved besides its heap and the engine's mappings: the program's
/// own break's reservation (`program_break`, which notes it here). Inaccessible until used,
/// so no data; what the break uses counts against the program's data limit.
static OTHER_RESERVED_BYTES: AtomicU64 = AtomicU64::new(0);

/// Notes `bytes` of address space reserved for the program's own break, which an
/// address-space limit the program sets gets on top (see [`reserve_bytes`]).
pub fn note_reserved_address_space(bytes: u64) {
    OTHER_RESERVED_BYTES.fetch_add(bytes, Ordering::Relaxed);
}

/// What uswap adds to limit `l` when the program sets it: its managed heap, twice the
/// engine's own mappings (a fork child builds devices of its own while it still holds its
/// copy of the parent's), room for its threads' allocations, and for the address space
/// what [`note_reserved_address_space`] noted.
fn reserve_bytes(l: &Limit) -> u64 {
    let heap_bytes = crate::config().map_or(0, |c| c.heap_bytes as u64);
    let own = heap_bytes + 2 * uswap::engine_reserved_bytes() + THREADS_SLACK_BYTES;
    match l.resource == ADDRESS_SPACE.resource {
        true => own + OTHER_RESERVED_BYTES.load(Ordering::Relaxed),
        false => own,
    }
}

fn raised(limit: u64, by: u64) -> u64 {
    if limit == libc::RLIM_INFINITY {
        limit
    } else {
        limit.saturating_add(by).min(libc::RLIM_INFINITY - 1)
    }
}

fn sys_prlimit(pid: libc::pid_t, resource: c_int, new: *const libc::rlimit, old: *mut libc::rlimit) -> c_int {
    // SAFETY: the prlimit64 system call; `new` and `old` are null or point at an rlimit
    // (the caller's, or ours on the stack), which the kernel checks.
    unsafe { libc::syscall(libc::SYS_prlimit64, pid, resource, new, old) as c_int }
}

/// The kernel's limit now.
fn kernel_limit(l: &Limit) -> Option<libc::rlimit> {
    let mut lim = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    (sys_prlimit(0, l.resource, std::ptr::null(), &mut lim) == 0).then_some(lim)
}

/// Gives the kernel `set` raised by `by_bytes` (within the hard limit it has, which only
/// root may raise), and remembers both.
fn give(l: &Limit, set: libc::rlimit, by_bytes: u64) -> c_int {
    let mut given = libc::rlimit { rlim_cur: raised(set.rlim_cur, by_bytes), rlim_max: raised(set.rlim_max, by_bytes) };
    if let Some(now) = kernel_limit(l) {
        if given.rlim_max > now.rlim_max && set.rlim_max <= now.rlim_max {
            // Not root: the hard limit can only come down; keep what it is.
            given.rlim_max = now.rlim_max;
            given.rlim_cur = given.rlim_cur.min(now.rlim_max);
        }
    }
    let r = sys_prlimit(0, l.resource, &given, std::ptr::null_mut());
    if r == 0 {
        l.set_soft.store(set.rlim_cur, Ordering::Relaxed);
        l.set_hard.store(set.rlim_max, Ordering::Relaxed);
        l.given_soft.store(given.rlim_cur, Ordering::Relaxed);
        l.given_hard.store(given.rlim_max, Ordering::Relaxed);
    }
    r
}

/// The limit the program set, if the kernel still has what it was given for it.
fn set_limit(l: &Limit) -> Option<libc::rlimit> {
    let soft = l.set_soft.load(Ordering::Relaxed);
    if soft == NONE {
        return None;
    }
    let now = kernel_limit(l)?;
    (now.rlim_cur == l.given_soft.load(Ordering::Relaxed) && now.rlim_max == l.given_hard.load(Ordering::Relaxed))
        .then(|| libc::rlimit { rlim_cur: soft, rlim_max: l.set_hard.load(Ordering::Relaxed) })
}

/// The soft limit the program has on `resource` (`RLIMIT_AS` or `RLIMIT_DATA`): the one it
/// set, or the kernel's if it set none; `RLIM_INFINITY` when there is none or the kernel
/// cannot tell.
pub fn program_soft_limit(resource: c_int) -> u64 {
    let Some(l) = [&ADDRESS_SPACE, &DATA].into_iter().find(|l| l.resource == resource) else {
        return libc::RLIM_INFINITY;
    };
    match set_limit(l) {
        Some(set) => set.rlim_cur,
        None => kernel_limit(l).map_or(libc::RLIM_INFINITY, |now| now.rlim_cur),
    }
}

/// At start-up, before the configuration is read: takes over the limits a managed parent
/// set before it exec'd this image (`USWAP_ADDRESS_SPACE_LIMIT`, `USWAP_DATA_LIMIT`), each
/// if the kernel still has what that parent gave it, so that the reservations are sized to
/// the program's limits.
pub fn inherit() -> crate::config::SetInside {
    crate::config::SetInside {
        address_space: inherit_one(&ADDRESS_SPACE, ENV_ADDRESS_SPACE_LIMIT),
        data: inherit_one(&DATA, ENV_DATA_LIMIT),
    }
}

fn inherit_one(l: &Limit, var: &str) -> bool {
    let Ok(Some(v)) = crate::first_stage::var(var) else { return false };
    let f: Vec<u64> = v.split(':').filter_map(|x| x.parse().ok()).collect();
    let (Some(now), &[set_soft, set_hard, given_soft, given_hard]) = (kernel_limit(l), &f[..]) else { return false };
    if now.rlim_cur != given_soft || now.rlim_max != given_hard || set_soft == NONE {
        return false;
    }
    l.set_soft.store(set_soft, Ordering::Relaxed);
    l.set_hard.store(set_hard, Ordering::Relaxed);
    l.given_soft.store(given_soft, Ordering::Relaxed);
    l.given_hard.store(given_hard, Ordering::Relaxed);
    true
}

/// Once the pager and its heap are built: the kernel's limits become the program's plus
/// this process's own reservations (the parent's were larger or smaller).
pub fn refit() {
    for (l, _) in CARRIED {
        if let Some(set) = set_limit(l) {
            give(l, set, reserve_bytes(l));
        }
    }
}

/// `setrlimit` and `prlimit` on this process's limit `l` once the pager runs.
fn set_own(l: &Limit, new: &libc::rlimit, old: *mut libc::rlimit) -> c_int {
    if !old.is_null() {
        let r = get_own(l, old);
        if r != 0 {
            return r;
        }
    }
    give(l, *new, reserve_bytes(l))
}

fn get_own(l: &Limit, out: *mut libc::rlimit) -> c_int {
    if let Some(set) = set_limit(l) {
        // SAFETY: `out` is the caller's non-null rlimit.
        unsafe { *out = set };
        return 0;
    }
    sys_prlimit(0, l.resource, std::ptr::null(), out)
}

/// The limit uswap's reservations count against that a call on `resource` of `pid` is
/// about, if it is one (this process's `RLIMIT_AS` or `RLIMIT_DATA`).
fn own_limit(pid: libc::pid_t, resource: c_int) -> Option<&'static Limit> {
    let limit = [&ADDRESS_SPACE, &DATA].into_iter().find(|l| l.resource == resource)?;
    // SAFETY: getpid has no memory effects.
    (pid == 0 || pid == unsafe { libc::getpid() }).then_some(limit)
}

/// # Safety
/// As the C library's `prlimit`.
#[no_mangle]
pub unsafe extern "C" fn prlimit64(
    pid: libc::pid_t,
    resource: c_int,
    new: *const libc::rlimit,
    old: *mut libc::rlimit,
) -> c_int {
    let Some(l) = own_limit(pid, resource) else {
        let r = sys_prlimit(pid, resource, new, old);
        // SAFETY: getpid has no memory effects.
        let own = (pid == 0 || pid == unsafe { libc::getpid() }) && crate::own_process::is_own_process();
        if r == 0 && own && resource == libc::RLIMIT_CORE as c_int && !new.is_null() && crate::pager().is_some() {
            // A limit raised now may let a dump be written: see `core_dump`.
            crate::core_dump::start();
        }
        return r;
    };
    if new.is_null() {
        return if old.is_null() { 0 } else { get_own(l, old) };
    }
    // A process waiting for its pager starts it first: the limit must leave room for the
    // pager's own reservations, which are known only once it runs.
    crate::start_if_waiting(crate::StartCause::AddressSpaceLimit);
    if crate::pager().is_none() {
        return sys_prlimit(pid, resource, new, old);
    }
    // SAFETY: `new` is the caller's non-null rlimit.
    set_own(l, unsafe { &*new }, old)
}

/// # Safety
/// As the C library's `prlimit`.
#[no_mangle]
pub unsafe extern "C" fn prlimit(
    pid: libc::pid_t,
    resource: c_int,
    new: *const libc::rlimit,
    old: *mut libc::rlimit,
) -> c_int {
    // SAFETY: the same contract.
    unsafe { prlimit64(pid, resource, new, old) }
}

/// # Safety
/// As the C library's `setrlimit`.
#[no_mangle]
pub unsafe extern "C" fn setrlimit(resource: c_int, new: *const libc::rlimit) -> c_int {
    // SAFETY: the same contract, for this process.
    unsafe { prlimit64(0, resource, new, std::ptr::null_mut()) }
}

/// # Safety
/// As the C library's `setrlimit64`.
#[no_mangle]
pub unsafe extern "C" fn setrlimit64(resource: c_int, new: *const libc::rlimit) -> c_int {
    // SAFETY: the same contract, for this process.
    unsafe { prlimit64(0, resource, new, std::ptr::null_mut()) }
}

/// # Safety
/// As the C library's `getrlimit`.
#[no_mangle]
pub unsafe extern "C" fn getrlimit(resource: c_int, out: *mut libc::rlimit) -> c_int {
    // SAFETY: the same contract, for this process.
    unsafe { prlimit64(0, resource, std::ptr::null(), out) }
}

/// # Safety
/// As the C library's `getrlimit64`.
#[no_mangle]
pub unsafe extern "C" fn getrlimit64(resource: c_int, out: *mut libc::rlimit) -> c_int {
    // SAFETY: the same contract, for this process.
    unsafe { prlimit64(0, resource, std::ptr::null(), out) }
}

// ---- exec: the limit the program set goes with the new image ----

extern "C" {
    static environ: *const *const c_char;
}

/// At most this many environment strings are carried with the limit (on the stack: an
/// `execve` may run in a `vfork` child, where nothing may be allocated); a larger
/// environment goes unchanged and the new image runs under the raised limit.
const MAX_ENV: usize = 256;

/// Runs `exec` with `envp`, plus `USWAP_ADDRESS_SPACE_LIMIT` and `USWAP_DATA_LIMIT` for the
/// limits the program set.
fn with_limit_in_env(envp: *const *const c_char, exec: impl FnOnce(*const *const c_char) -> c_int) -> c_int {
    // The heap a waiting process charged goes with the image (the new one joins on its own
    // if it must; after a failed exec, at this one's next commit).
    crate::waiting_charge::leave();
    crate::give_back_unmanaged();
    let set = CARRIED.map(|(l, _)| set_limit(l));
    let r = if set.iter().all(Option::is_none) { exec(envp) } else { exec_with_limits(envp, set, exec) };
    // Returned: the exec failed, and this image goes on.
    crate::waiting_charge::exec_failed();
    r
}

/// [`with_limit_in_env`] once a limit was set: a function of its own, so that only this
/// rare path pays for the 2 KiB copy on the stack (an `execve` from a small stack in a
/// process that set no limit takes the other path).
#[inline(never)]
fn exec_with_limits(
    envp: *const *const c_char,
    set: [Option<libc::rlimit>; 2],
    exec: impl FnOnce(*const *const c_char) -> c_int,
) -> c_int {
    if envp.is_null() {
        return exec(envp);
    }
    let mut vars = [[0u8; 128]; 2];
    let mut texts: [*const c_char; 2] = [std::ptr::null(); 2];
    let mut nr_texts = 0;
    for (((l, name), set), var) in CARRIED.iter().zip(set).zip(vars.iter_mut()) {
        if let Some(set) = set {
            texts[nr_texts] = format_var(var, name, l, set);
            nr_texts += 1;
        }
    }
    let mut out: [*const c_char; MAX_ENV + 3] = [std::ptr::null(); MAX_ENV + 3];
    let mut n = 0;
    // Bounded: an environment of more than MAX_ENV strings (ours aside) goes unchanged, and
    // `out` is used only once the array's NULL was seen, so nothing is ever cut off.
    for i in 0..=2 * MAX_ENV {
        // SAFETY: `envp` is a NULL-terminated array of strings (execve's contract); `i`
        // stays within it, since the loop stops at its NULL.
        let s = unsafe { *envp.add(i) };
        if s.is_null() {
            out[n..n + nr_texts].copy_from_slice(&texts[..nr_texts]);
            return exec(out.as_ptr());
        }
        // SAFETY: `s` is a NUL-terminated string of the caller's.
        let entry = unsafe { std::ffi::CStr::from_ptr(s) }.to_bytes();
        if !CARRIED.iter().any(|(_, name)| entry.starts_with(name.as_bytes())) {
            if n == MAX_ENV {
                return exec(envp);
            }
            out[n] = s;
            n += 1;
        }
    }
    exec(envp)
}

/// Writes `NAME=SOFT:HARD:GIVEN_SOFT:GIVEN_HARD\0` into `buf`, without allocating.
fn format_var(buf: &mut [u8; 128], name: &str, l: &Limit, set: libc::rlimit) -> *const c_char {
    use std::io::Write;
    let given = [l.given_soft.load(Ordering::Relaxed), l.given_hard.load(Ordering::Relaxed)];
    let mut w = std::io::Cursor::new(&mut buf[..]);
    // 128 bytes hold the name and four 20-digit numbers; a failed write leaves the buffer
    // zeroed after the name, an empty value that `inherit` ignores.
    let _ = write!(w, "{name}={}:{}:{}:{}", set.rlim_cur, set.rlim_max, given[0], given[1]);
    let end = (w.position() as usize).min(buf.len() - 1);
    buf[end] = 0;
    buf.as_ptr().cast()
}

type ExecveFn = unsafe extern "C" fn(*const c_char, *const *const c_char, *const *const c_char) -> c_int;
static REAL_EXECVE: AtomicPtr<c_void> = AtomicPtr::new(std::ptr::null_mut());
static REAL_EXECVPE: AtomicPtr<c_void> = AtomicPtr::new(std::ptr::null_mut());

fn real(slot: &AtomicPtr<c_void>, name: &std::ffi::CStr) -> ExecveFn {
    let p = crate::real::next_symbol(slot, name);
    // SAFETY: `p` is the C library's execve or execvpe, both of this type.
    unsafe { std::mem::transmute::<*mut c_void, ExecveFn>(p) }
}

/// # Safety
/// As the C library's `execve`.
#[no_mangle]
pub unsafe extern "C" fn execve(path: *const c_char, argv: *const *const c_char, envp: *const *const c_char) -> c_int {
    let f = real(&REAL_EXECVE, c"execve");
    // SAFETY: a NUL-terminated path of the caller's, when not null (execve's contract).
    let image = (!path.is_null()).then(|| unsafe { std::ffi::CStr::from_ptr(path) });
    let noted = crate::escape::note_before_exec(image, false, envp);
    // SAFETY: the caller's arguments, passed on.
    let r = with_limit_in_env(envp, |envp| unsafe { f(path, argv, envp) });
    crate::escape::take_back(noted);
    r
}

/// # Safety
/// As the C library's `execvpe`.
#[no_mangle]
pub unsafe extern "C" fn execvpe(file: *const c_char, argv: *const *const c_char, envp: *const *const c_char) -> c_int {
    let f = real(&REAL_EXECVPE, c"execvpe");
    // SAFETY: a NUL-terminated name of the caller's, when not null (execvpe's contract).
    let name = (!file.is_null()).then(|| unsafe { std::ffi::CStr::from_ptr(file) });
    let noted = crate::escape::note_before_exec(name, true, envp);
    // SAFETY: the caller's arguments, passed on.
    let r = with_limit_in_env(envp, |envp| unsafe { f(file, argv, envp) });
    crate::escape::take_back(noted);
    r
}

/// # Safety
/// As the C library's `execv`.
#[no_mangle]
pub unsafe extern "C" fn execv(path: *const c_char, argv: *const *const c_char) -> c_int {
    // SAFETY: the caller's arguments and the process's environment.
    unsafe { execve(path, argv, environ) }
}

/// # Safety
/// As the C library's `execvp`.
#[no_mangle]
pub unsafe extern "C" fn execvp(file: *const c_char, argv: *const *const c_char) -> c_int {
    // SAFETY: the caller's arguments and the process's environment.
    unsafe { execvpe(file, argv, environ) }
}
