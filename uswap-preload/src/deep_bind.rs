//! Libraries loaded with `RTLD_DEEPBIND`, loaded without it.
//!
//! A library that a program loads with `dlopen(..., RTLD_DEEPBIND)` (PHP loads every
//! extension so) binds its own references to its own dependencies first: its `malloc` and
//! `free` are the C library's, past this library's interposed ones. Its blocks and the
//! program's then cross: PHP's pdo.so frees a block the program's `malloc` (uswap's heap)
//! gave, the C library's `free` takes it for its own, and the process aborts ("double free
//! or corruption"). So while this library's heap serves the program, `dlopen` clears
//! `RTLD_DEEPBIND`, as a program built with a sanitizer must do (AddressSanitizer refuses
//! the flag outright): the library's references resolve in the global scope, as every other
//! library's do. Said once per process: under `uswap run` by a note in the run's directory
//! (`uswap::shared_charge::DEEP_BIND_PREFIX`), which the run sums up at the end; by hand
//! on stderr.
//!
//! `dlopen` is a stub that jumps to the C library's with the caller's return address still
//! on the stack: the C library reads it to search the calling object's `RUNPATH` and
//! namespace for a bare name, which a call from here would replace with this library's.
//! `dlmopen` into a namespace of its own is not seen: the preload library is not in that
//! namespace at all.

use std::ffi::{c_char, c_int, c_void, CStr};
use std::os::unix::fs::OpenOptionsExt;
use std::sync::atomic::{AtomicBool, AtomicPtr, Ordering};

/// The C library's `dlopen`.
static REAL_DLOPEN: AtomicPtr<c_void> = AtomicPtr::new(std::ptr::null_mut());
/// Set once this process said (or noted) that it cleared the flag.
static SAID: AtomicBool = AtomicBool::new(false);

/// `dlopen`, interposed: [`dlopen_target`] gives the C library's function and notes a
/// `RTLD_DEEPBIND` it will clear (the arguments kept across the call), the flag is cleared
/// when the heap serves the program, and the stub jumps to the C library's `dlopen`.
///
/// # Safety
/// As the C function of this name.
#[no_mangle]
#[unsafe(naked)]
pub unsafe extern "C" fn dlopen(file: *const c_char, mode: c_int) -> *mut c_void {
    std::arch::naked_asm!(
        // At entry rsp is 8 past a 16-byte boundary; three pushes make the call aligned.
        "push rdi",
        "push rsi",
        "sub rsp, 8",
        "call {target}",
        "add rsp, 8",
        "pop rsi",
        "pop rdi",
        // rax: the C library's dlopen; rdx (free across the call): the flags to clear.
        "not edx",
        "and esi, edx",
        "jmp rax",
        target = sym dlopen_target,
    )
}

/// What the [`dlopen`] stub calls: the C library's `dlopen` in the first register returned,
/// and in the second the mode bits to clear (`RTLD_DEEPBIND`, or none).
extern "C" fn dlopen_target(file: *const c_char, mode: c_int) -> Target {
    let real = crate::real::next_symbol(&REAL_DLOPEN, c"dlopen");
    let clear = if mode & libc::RTLD_DEEPBIND != 0 && crate::heap::serves_the_program() {
        say_once(file);
        libc::RTLD_DEEPBIND
    } else {
        0
    };
    Target { real, clear: clear as u64 }
}

/// Two values returned in rax and rdx (the System V ABI's pair of integer registers).
#[repr(C)]
struct Target {
    real: *mut c_void,
    clear: u64,
}

/// In a fork child: a process of its own, which says (or notes) it again.
pub fn forget_in_fork_child() {
    SAID.store(false, Ordering::Relaxed);
}

/// Says, once per process, that a library was loaded without `RTLD_DEEPBIND`.
fn say_once(file: *const c_char) {
    if SAID.swap(true, Ordering::AcqRel) {
        return;
    }
    let _g = crate::own_code::Guard::enter();
    let lib = if file.is_null() {
        "(the program itself)".into()
    } else {
        // SAFETY: dlopen's first argument, a NUL-terminated string when not null.
        unsafe { CStr::from_ptr(file) }.to_string_lossy().into_owned()
    };
    let exe = std::fs::read_link("/proc/self/exe").map(|p| p.display().to_string()).unwrap_or_default();
    let Some(dir) = crate::config().and_then(|c| c.stats_dir.as_ref()) else {
        crate::real::say_of_this_process(&format!(
            "loads {lib} without RTLD_DEEPBIND, which would bind its malloc and free to the C library's, past \
             uswap's"
        ));
        return;
    };
    let path = dir.join(format!("{}{}.txt", uswap::shared_charge::DEEP_BIND_PREFIX, crate::file_tag()));
    // An earlier image of this pid noted it already: one note is enough.
    let _ = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(&path)
        .and_then(|mut f| std::io::Write::write_all(&mut f, format!("{exe} loading {lib}\n").as_bytes()));
}
