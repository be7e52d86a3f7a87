//! The C library's own allocator and memory system calls, for everything that must not live in
//! managed memory: uswap's engine (its threads would wait on themselves if their data were
//! swapped out), this library's tables, and allocations made before the managed heap exists.
//!
//! The allocator is `uswap_escape::c_allocator`'s, shared with the first stage: the C
//! library's own functions once it has started (at the latest from this library's
//! constructor), a static bootstrap area of [`BOOTSTRAP_BYTES`] before (the dynamic loader
//! allocating while it relocates under `LD_AUDIT`, the look-up's own allocations). Blocks of
//! the first stage's bootstrap area, handed over with the process, are told by the range the
//! hand-off gives. Memory system calls go straight to the kernel with `syscall(2)`: the
//! library interposes `mmap`, `munmap` and `mremap`, and must not call itself.
//!
//! Invariant: a pointer is from a bootstrap area, from the C library's malloc, or from the
//! managed heap (`heap::in_arena`); `free` tells them apart by address.

use std::ffi::{c_int, c_void};
use std::sync::atomic::{AtomicPtr, Ordering};

use uswap_escape::c_allocator::{CAllocator, OtherArea};

/// The bootstrap area's size: a few hundred bytes are used in practice.
const BOOTSTRAP_BYTES: usize = 64 << 10;

/// The first stage's bootstrap area, whose blocks the program may free here.
struct FirstStageArea;

impl OtherArea for FirstStageArea {
    #[inline]
    fn size_of(p: *mut c_void) -> Option<usize> {
        crate::first_stage::bootstrap_block(p)
    }
}

static C: CAllocator<BOOTSTRAP_BYTES, FirstStageArea> = CAllocator::new();

/// Whether `p` came from a bootstrap area, this library's or the first stage's (never
/// freed).
pub fn is_bootstrap(p: *mut c_void) -> bool {
    C.is_bootstrap(p)
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
    uswap_escape::c_allocator::fatal(msg)
}

/// Finds the C library's allocator now, from this library's constructor: the loader is
/// done, whatever the environment.
pub fn find_c_library_allocator() {
    C.c_library_started_now();
}

pub fn malloc(size: usize) -> *mut c_void {
    C.malloc(size)
}

pub fn calloc(n: usize, size: usize) -> *mut c_void {
    C.calloc(n, size)
}

pub fn memalign(align: usize, size: usize) -> *mut c_void {
    C.memalign(align, size)
}

/// Frees a C-library (or bootstrap) pointer.
/// # Safety
/// `p` is null or a live block from the C library's malloc or a bootstrap area.
pub unsafe fn free(p: *mut c_void) {
    // SAFETY: the caller's contract.
    unsafe { C.free(p) }
}

/// Reallocates a C-library (or bootstrap) pointer within the C library's heap.
/// # Safety
/// As [`free`].
pub unsafe fn realloc(p: *mut c_void, size: usize) -> *mut c_void {
    // SAFETY: the caller's contract.
    unsafe { C.realloc(p, size) }
}

/// # Safety
/// As [`free`].
pub unsafe fn usable_size(p: *mut c_void) -> usize {
    // SAFETY: the caller's contract; a C library block's size is read from its header where
    // that agrees with the C library's (each `malloc` and `free` counts it while the process
    // waits, `heap`).
    unsafe { C.usable_size(p) }
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
