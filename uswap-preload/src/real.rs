//! The C library's own allocator and memory system calls, for everything that must not live in
//! managed memory: uswap's engine (its threads would wait on themselves if their data were
//! swapped out), this library's tables, and allocations made before the managed heap exists.
//!
//! The functions are found with `dlsym` on the C library's handle on first use once the C
//! library has started (not `RTLD_NEXT`: see `resolve`), at the latest in this library's
//! constructor. `dlsym` may itself allocate (its error buffer), and the dynamic loader
//! allocates before the C library starts (under an `LD_AUDIT` auditor, while it relocates
//! itself, when it cannot be called back): those calls are served from a small static bootstrap area, which is never freed (a few
//! hundred bytes in practice; [`BOOTSTRAP_BYTES`] bounds it and running out is fatal with a
//! message). Memory system calls go straight to the kernel with `syscall(2)`: the library
//! interposes `mmap`, `munmap` and `mremap`, and must not call itself.
//!
//! Invariant: a pointer is from the bootstrap area, from the C library's malloc, or from the
//! managed heap (`heap::in_arena`); `free` tells them apart by address.

use std::ffi::{c_int, c_void};
use std::sync::atomic::{AtomicBool, AtomicPtr, AtomicUsize, Ordering};

type MallocFn = unsafe extern "C" fn(usize) -> *mut c_void;
type FreeFn = unsafe extern "C" fn(*mut c_void);
type CallocFn = unsafe extern "C" fn(usize, usize) -> *mut c_void;
type ReallocFn = unsafe extern "C" fn(*mut c_void, usize) -> *mut c_void;
type MemalignFn = unsafe extern "C" fn(usize, usize) -> *mut c_void;
type UsableFn = unsafe extern "C" fn(*mut c_void) -> usize;

static MALLOC: AtomicPtr<c_void> = AtomicPtr::new(std::ptr::null_mut());
static FREE: AtomicPtr<c_void> = AtomicPtr::new(std::ptr::null_mut());
static CALLOC: AtomicPtr<c_void> = AtomicPtr::new(std::ptr::null_mut());
static REALLOC: AtomicPtr<c_void> = AtomicPtr::new(std::ptr::null_mut());
static MEMALIGN: AtomicPtr<c_void> = AtomicPtr::new(std::ptr::null_mut());
static USABLE: AtomicPtr<c_void> = AtomicPtr::new(std::ptr::null_mut());

/// 0: not resolved; 1: resolving (nested calls use the bootstrap area); 2: resolved.
static STATE: AtomicUsize = AtomicUsize::new(0);

const BOOTSTRAP_BYTES: usize = 64 << 10;
#[repr(C, align(64))]
struct Bootstrap([u8; BOOTSTRAP_BYTES]);
static mut BOOTSTRAP: Bootstrap = Bootstrap([0; BOOTSTRAP_BYTES]);
static BOOTSTRAP_USED: AtomicUsize = AtomicUsize::new(0);

fn bootstrap_base() -> usize {
    std::ptr::addr_of!(BOOTSTRAP) as usize
}

/// Whether `p` came from the bootstrap area, this library's or the first stage's (never
/// freed).
pub fn is_bootstrap(p: *mut c_void) -> bool {
    let a = p as usize;
    (a >= bootstrap_base() && a < bootstrap_base() + BOOTSTRAP_BYTES)
        || crate::first_stage::bootstrap_block(p).is_some()
}

/// Size of a bootstrap allocation (stored in the 16 bytes before it, in both areas).
pub fn bootstrap_size(p: *mut c_void) -> usize {
    // SAFETY: `p` is a bootstrap allocation (caller checked `is_bootstrap`), whose 16-byte
    // header holds its size.
    unsafe { *((p as usize - 16) as *const usize) }
}

fn bootstrap_alloc(size: usize, align: usize) -> *mut c_void {
    let align = align.max(16);
    let mut used = BOOTSTRAP_USED.load(Ordering::Relaxed);
    loop {
        let start = (bootstrap_base() + used + 16).next_multiple_of(align);
        let end = start + size;
        if end > bootstrap_base() + BOOTSTRAP_BYTES {
            fatal(b"uswap: the bootstrap allocator ran out (64 KiB before libc's malloc was found)\n");
        }
        match BOOTSTRAP_USED.compare_exchange(used, end - bootstrap_base(), Ordering::AcqRel, Ordering::Relaxed) {
            Ok(_) => {
                // SAFETY: [start - 16, end) lies in BOOTSTRAP and was just reserved for us alone.
                unsafe { *((start - 16) as *mut usize) = size };
                return start as *mut c_void;
            }
            Err(u) => used = u,
        }
    }
}

/// The C library's function `name` (the next definition after this library, its default
/// version), looked up once and kept in `slot`. For interposed functions that pass on to the
/// C library's (`threads`, `signals`); the malloc family has its own bootstrap (`resolve`).
/// A C library without it ends the process (status 2, as `fatal`).
pub fn next_symbol(slot: &AtomicPtr<c_void>, name: &std::ffi::CStr) -> *mut c_void {
    let mut p = slot.load(Ordering::Acquire);
    if p.is_null() {
        // dlsym may allocate: from the C library's malloc, never the managed heap.
        let _g = crate::own_code::Guard::enter();
        // From this library loaded by the first stage, not in the global scope, RTLD_NEXT
        // would find the first stage's stubs: the first stage looks it up from itself.
        // SAFETY: dlsym with RTLD_NEXT and a NUL-terminated name.
        p = crate::first_stage::next_symbol(name)
            .unwrap_or_else(|| unsafe { libc::dlsym(libc::RTLD_NEXT, name.as_ptr()) });
        if p.is_null() {
            fatal(b"uswap: a function of the C library was not found (dlsym RTLD_NEXT)\n");
        }
        slot.store(p, Ordering::Release);
    }
    p
}

/// Writes `msg` to standard error, best effort (async-signal-safe, no allocation).
pub fn write_stderr(msg: &[u8]) {
    // SAFETY: write(2) is async-signal-safe; the buffer is valid for its length.
    unsafe { libc::write(2, msg.as_ptr().cast(), msg.len()) };
}

/// "uswap: COMM (process PID) WHAT" on stderr: a word about this process as a whole (the
/// mode `auto` chose, a library that stands aside). Allocates: from the constructor.
pub fn say_of_this_process(what: &str) {
    let pid = std::process::id();
    // A process out of descriptors (what some of these lines are about) reads no comm.
    let line = match std::fs::read_to_string("/proc/self/comm") {
        Ok(comm) if !comm.trim_end().is_empty() => format!("uswap: {} (process {pid}) {what}\n", comm.trim_end()),
        _ => format!("uswap: process {pid} {what}\n"),
    };
    write_stderr(line.as_bytes());
}

/// The calling thread's errno.
pub fn errno() -> c_int {
    // SAFETY: __errno_location returns the calling thread's errno slot.
    unsafe { *libc::__errno_location() }
}

/// Sets the calling thread's errno (what an interposed call leaves for its caller).
pub fn set_errno(e: c_int) {
    // SAFETY: __errno_location returns the calling thread's errno slot.
    unsafe { *libc::__errno_location() = e };
}

/// Writes `msg` to stderr and exits with status 2 (the status `uswap run` uses for "could not
/// manage the program"). Allocation-free.
pub fn fatal(msg: &[u8]) -> ! {
    // SAFETY: write(2) and _exit(2) are async-signal-safe; the buffer is valid for its length.
    unsafe {
        libc::write(2, msg.as_ptr().cast(), msg.len());
        libc::_exit(2)
    }
}

fn resolve() -> bool {
    match STATE.compare_exchange(0, 1, Ordering::AcqRel, Ordering::Acquire) {
        Ok(_) => {}
        Err(2) => return true,
        Err(_) => {
            // Another thread is resolving, or this one is (nested in dlsym): the caller falls
            // back to the bootstrap area, as every caller does until resolution is done.
            return false;
        }
    }
    let names: [(&[u8], &AtomicPtr<c_void>); 6] = [
        (b"malloc\0", &MALLOC),
        (b"free\0", &FREE),
        (b"calloc\0", &CALLOC),
        (b"realloc\0", &REALLOC),
        (b"memalign\0", &MEMALIGN),
        (b"malloc_usable_size\0", &USABLE),
    ];
    // The C library's own functions, looked up in it: the next definition after this
    // library is another allocator's when the user preloads one after uswap's
    // (`LD_PRELOAD=libjemalloc.so`), whose chunks come from the program's `mmap`, managed
    // memory, where uswap's engine must never allocate. RTLD_NEXT where the C library is
    // not `libc.so.6`.
    // SAFETY: dlopen of an already loaded library by its soname, RTLD_NOLOAD: it loads
    // nothing, and returns its handle or null.
    let libc_handle = unsafe { libc::dlopen(c"libc.so.6".as_ptr(), libc::RTLD_NOLOAD | libc::RTLD_LAZY) };
    let handle = if libc_handle.is_null() { libc::RTLD_NEXT } else { libc_handle };
    for (name, slot) in names {
        // SAFETY: dlsym with a library handle (or RTLD_NEXT) and a NUL-terminated name; it
        // returns the C library's definition or null.
        let f = unsafe { libc::dlsym(handle, name.as_ptr().cast()) };
        if f.is_null() {
            fatal(b"uswap: the C library's malloc was not found (dlsym)\n");
        }
        slot.store(f, Ordering::Release);
    }
    STATE.store(2, Ordering::Release);
    true
}

fn ready() -> bool {
    if STATE.load(Ordering::Acquire) == 2 {
        return true;
    }
    if !c_library_started() && BOOTSTRAP_USED.load(Ordering::Relaxed) < BOOTSTRAP_BYTES / 2 {
        // The dynamic loader allocating before the C library's start-up: with `LD_AUDIT`
        // (sotruss, latrace; glibc 2.34 to 2.40) it does while relocating itself, when a
        // call back into it (`dlopen`, `dlsym`) runs through its own PLT, not yet bound, and
        // crashed every such process. Its few early blocks come from the bootstrap area
        // instead, while half of it is left for the allocations nested in `dlsym`.
        return false;
    }
    resolve()
}

/// Set once the C library is known to have started: by this library's constructor, or
/// when its `__environ` was first seen set.
static C_LIBRARY_STARTED: AtomicBool = AtomicBool::new(false);

/// Finds the C library's allocator now, from this library's constructor: the loader is
/// done, whatever the environment (a constructor that ran before this one may have
/// cleared it: `clearenv` sets `__environ` to null).
pub fn find_c_library_allocator() {
    C_LIBRARY_STARTED.store(true, Ordering::Release);
    let _ = resolve();
}

/// Whether the C library has started: its start-up code sets `__environ` (the variable it
/// writes; `environ` is a weak alias that a program defining its own binds elsewhere);
/// until then only the dynamic loader runs.
fn c_library_started() -> bool {
    if C_LIBRARY_STARTED.load(Ordering::Acquire) {
        return true;
    }
    #[allow(non_upper_case_globals)]
    extern "C" {
        static __environ: *const *const std::ffi::c_char;
    }
    // SAFETY: a read of the C library's pointer, volatile since setenv and clearenv rewrite
    // it (a stale value only sends a block to the bootstrap area).
    let set = !unsafe { std::ptr::read_volatile(std::ptr::addr_of!(__environ)) }.is_null();
    if set {
        C_LIBRARY_STARTED.store(true, Ordering::Release);
    }
    set
}

macro_rules! real_fn {
    ($slot:ident, $ty:ty) => {{
        let p = $slot.load(Ordering::Acquire);
        // SAFETY: only called after `ready()`: the slot holds the C library's function of
        // this type, found by dlsym.
        #[allow(unused_unsafe)]
        let f = unsafe { std::mem::transmute::<*mut c_void, $ty>(p) };
        f
    }};
}

pub fn malloc(size: usize) -> *mut c_void {
    if !ready() {
        return bootstrap_alloc(size, 16);
    }
    // SAFETY: the C library's malloc.
    unsafe { real_fn!(MALLOC, MallocFn)(size) }
}

pub fn calloc(n: usize, size: usize) -> *mut c_void {
    if !ready() {
        // The bootstrap area is static, hence zeroed, and never reused.
        return match n.checked_mul(size) {
            Some(total) => bootstrap_alloc(total, 16),
            None => std::ptr::null_mut(),
        };
    }
    // SAFETY: the C library's calloc.
    unsafe { real_fn!(CALLOC, CallocFn)(n, size) }
}

pub fn memalign(align: usize, size: usize) -> *mut c_void {
    if !ready() {
        return bootstrap_alloc(size, align);
    }
    // SAFETY: the C library's memalign.
    unsafe { real_fn!(MEMALIGN, MemalignFn)(align, size) }
}

/// Frees a C-library (or bootstrap) pointer.
/// # Safety
/// `p` is null or a live block from the C library's malloc or the bootstrap area.
pub unsafe fn free(p: *mut c_void) {
    if p.is_null() || is_bootstrap(p) {
        return;
    }
    // A non-bootstrap pointer exists only once resolution finished.
    // SAFETY: `p` came from the C library's malloc family (see the module invariant).
    unsafe { real_fn!(FREE, FreeFn)(p) }
}

/// Reallocates a C-library (or bootstrap) pointer within the C library's heap.
/// # Safety
/// `p` is null or a live block from the C library's malloc or the bootstrap area.
pub unsafe fn realloc(p: *mut c_void, size: usize) -> *mut c_void {
    if p.is_null() {
        return malloc(size);
    }
    if is_bootstrap(p) {
        // SAFETY: `is_bootstrap` checked; the header holds the size.
        let n = malloc(size);
        if !n.is_null() {
            // SAFETY: both are valid for the smaller of the two sizes and do not overlap.
            unsafe { std::ptr::copy_nonoverlapping(p as *const u8, n as *mut u8, bootstrap_size(p).min(size)) };
        }
        return n;
    }
    // SAFETY: `p` came from the C library's malloc family.
    unsafe { real_fn!(REALLOC, ReallocFn)(p, size) }
}

/// # Safety
/// `p` is null or a live block from the C library's malloc or the bootstrap area.
pub unsafe fn usable_size(p: *mut c_void) -> usize {
    if p.is_null() {
        return 0;
    }
    if is_bootstrap(p) {
        return bootstrap_size(p);
    }
    // SAFETY: `p` came from the C library's malloc family; its usable size is read from its
    // header where that agrees with the C library's (each `malloc` and `free` counts it
    // while the process waits, `heap`).
    unsafe { uswap_escape::c_block::usable_bytes(p, |q| real_fn!(USABLE, UsableFn)(q)) }
}

/// The allocator of this library's Rust code (and so of the uswap engine inside it): the C
/// library's malloc, never the managed heap.
pub struct LibcAllocator;

// SAFETY: every method forwards to the C library's allocator with a size and alignment it
// honours (memalign for alignments above malloc's 16 bytes); pointers are returned to the same
// allocator they came from.
unsafe impl std::alloc::GlobalAlloc for LibcAllocator {
    unsafe fn alloc(&self, layout: std::alloc::Layout) -> *mut u8 {
        if layout.align() <= 16 {
            malloc(layout.size()).cast()
        } else {
            memalign(layout.align(), layout.size()).cast()
        }
    }

    unsafe fn alloc_zeroed(&self, layout: std::alloc::Layout) -> *mut u8 {
        if layout.align() <= 16 {
            calloc(1, layout.size()).cast()
        } else {
            let p = memalign(layout.align(), layout.size());
            if !p.is_null() {
                // SAFETY: `p` is valid for `layout.size()` bytes.
                unsafe { std::ptr::write_bytes(p as *mut u8, 0, layout.size()) };
            }
            p.cast()
        }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, _layout: std::alloc::Layout) {
        // SAFETY: `ptr` came from this allocator (GlobalAlloc's contract).
        unsafe { free(ptr.cast()) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: std::alloc::Layout, new_size: usize) -> *mut u8 {
        if layout.align() <= 16 {
            // SAFETY: `ptr` came from this allocator (GlobalAlloc's contract).
            return unsafe { realloc(ptr.cast(), new_size).cast() };
        }
        let n = memalign(layout.align(), new_size);
        if !n.is_null() {
            // SAFETY: both are valid for the smaller size and distinct allocations.
            unsafe {
                std::ptr::copy_nonoverlapping(ptr, n as *mut u8, layout.size().min(new_size));
                free(ptr.cast());
            }
        }
        n.cast()
    }
}

/// Raw `mmap(2)`, bypassing this library's own `mmap`.
pub fn sys_mmap(addr: *mut c_void, len: usize, prot: i32, flags: i32, fd: i32, off: i64) -> *mut c_void {
    // SAFETY: the mmap system call; the kernel validates every argument.
    unsafe { libc::syscall(libc::SYS_mmap, addr as usize, len, prot, flags, fd, off) as *mut c_void }
}

/// Raw `munmap(2)`.
pub fn sys_munmap(addr: *mut c_void, len: usize) -> i32 {
    // SAFETY: the munmap system call; the kernel validates the range. Unmapping memory the
    // caller still uses is the caller's contract, as for munmap itself.
    unsafe { libc::syscall(libc::SYS_munmap, addr as usize, len) as i32 }
}

/// Raw `mprotect(2)`.
pub fn sys_mprotect(addr: *mut c_void, len: usize, prot: i32) -> i32 {
    // SAFETY: the mprotect system call; the kernel validates the range. What the new
    // protection means for the caller's memory is the caller's contract, as for mprotect.
    unsafe { libc::syscall(libc::SYS_mprotect, addr as usize, len, prot) as i32 }
}

/// Raw `madvise(2)`.
pub fn sys_madvise(addr: *mut c_void, len: usize, advice: i32) -> i32 {
    // SAFETY: the madvise system call; the kernel validates the range. What the advice does
    // to the caller's memory is the caller's contract, as for madvise itself.
    unsafe { libc::syscall(libc::SYS_madvise, addr as usize, len, advice) as i32 }
}

/// Raw `mremap(2)`.
pub fn sys_mremap(old: *mut c_void, old_len: usize, new_len: usize, flags: i32, new_addr: *mut c_void) -> *mut c_void {
    // SAFETY: the mremap system call; the kernel validates every argument.
    unsafe { libc::syscall(libc::SYS_mremap, old as usize, old_len, new_len, flags, new_addr as usize) as *mut c_void }
}

/// The extent `[base, end)` of the loaded object whose load address is `base`: up to the end
/// of its last loadable segment; none if no object loads there.
pub fn loaded_extent(base: usize) -> Option<(usize, usize)> {
    extern "C" fn each(info: *mut libc::dl_phdr_info, _size: usize, data: *mut c_void) -> i32 {
        // SAFETY: dl_iterate_phdr passes a valid info for the call; `data` is the
        // `(base, end)` pair below, alive for the iteration.
        let (info, found) = unsafe { (&*info, &mut *(data as *mut (usize, usize))) };
        if info.dlpi_addr as usize != found.0 || info.dlpi_phdr.is_null() {
            return 0;
        }
        // SAFETY: dlpi_phdr points at dlpi_phnum program headers.
        let phdrs = unsafe { std::slice::from_raw_parts(info.dlpi_phdr, info.dlpi_phnum as usize) };
        let end = phdrs.iter().filter(|h| h.p_type == libc::PT_LOAD).map(|h| (h.p_vaddr + h.p_memsz) as usize).max();
        found.1 = found.0 + end.unwrap_or(0);
        1
    }
    if base == 0 {
        return None;
    }
    let mut found = (base, 0usize);
    // SAFETY: the callback only reads the headers it is given and writes `found`.
    unsafe { libc::dl_iterate_phdr(Some(each), (&mut found as *mut (usize, usize)).cast()) };
    (found.1 > base).then_some(found)
}

static SIGACTION: AtomicPtr<c_void> = AtomicPtr::new(std::ptr::null_mut());

/// The C library's `sigaction`, past this library's (`signals`, `core_dump`).
///
/// # Safety
/// As `sigaction(2)`.
pub unsafe fn sigaction(sig: c_int, act: *const libc::sigaction, old: *mut libc::sigaction) -> c_int {
    type ActionFn = unsafe extern "C" fn(c_int, *const libc::sigaction, *mut libc::sigaction) -> c_int;
    // SAFETY: the C library's sigaction, found by dlsym, has this type; the caller's arguments.
    unsafe {
        let real = std::mem::transmute::<*mut c_void, ActionFn>(next_symbol(&SIGACTION, c"sigaction"));
        real(sig, act, old)
    }
}
