//! Locales: what the C library allocates for a locale comes from its own malloc, never from
//! the managed heap.
//!
//! Why: a new thread reads the process's locale data in `start_thread` (`__ctype_init`)
//! before it restores its signal mask: glibc's `pthread_create` blocks every signal around
//! the `clone`, and the new thread unblocks them only after. In signal mode a fault there on
//! a swapped-out page is a SIGBUS the kernel cannot deliver to a thread that blocks it: it
//! kills the process. The data `setlocale(LC_ALL, "")` allocates (CPython calls it at
//! start) came from the program's malloc, the managed heap, and was swapped out as soon as
//! the rest of the tree needed the room: a CPython job died of SIGBUS when uswap's report
//! thread first ran, about one run in two, with a memory-hungry neighbour under the same
//! `uswap run`. In thread mode the same fault waits for a handler; it is still a swap-in the
//! program never asked for.
//!
//! So `setlocale`, `newlocale` and `duplocale` run the C library's with the calling thread
//! marked as uswap's own code (`heap::Guard`): their allocations come from the C library's
//! malloc, and `freelocale` (or the next `setlocale`) frees them there, since `free` routes
//! by address.

use std::ffi::{c_char, c_int, c_void};
use std::sync::atomic::AtomicPtr;

use crate::own_code;

type SetlocaleFn = unsafe extern "C" fn(c_int, *const c_char) -> *mut c_char;
type NewlocaleFn = unsafe extern "C" fn(c_int, *const c_char, libc::locale_t) -> libc::locale_t;
type DuplocaleFn = unsafe extern "C" fn(libc::locale_t) -> libc::locale_t;

static SETLOCALE: AtomicPtr<c_void> = AtomicPtr::new(std::ptr::null_mut());
static NEWLOCALE: AtomicPtr<c_void> = AtomicPtr::new(std::ptr::null_mut());
static DUPLOCALE: AtomicPtr<c_void> = AtomicPtr::new(std::ptr::null_mut());

/// `setlocale(3)`, the C library's, with its allocations kept out of the managed heap.
///
/// # Safety
/// As `setlocale(3)`.
#[no_mangle]
pub unsafe extern "C" fn setlocale(category: c_int, locale: *const c_char) -> *mut c_char {
    let p = crate::real::next_symbol(&SETLOCALE, c"setlocale");
    // SAFETY: `p` is the C library's setlocale, of this type.
    let real = unsafe { std::mem::transmute::<*mut c_void, SetlocaleFn>(p) };
    let _g = own_code::Guard::enter();
    // SAFETY: the caller's arguments, passed on unchanged.
    unsafe { real(category, locale) }
}

/// `newlocale(3)`, the C library's, with its allocations kept out of the managed heap.
///
/// # Safety
/// As `newlocale(3)`.
#[no_mangle]
pub unsafe extern "C" fn newlocale(mask: c_int, locale: *const c_char, base: libc::locale_t) -> libc::locale_t {
    let p = crate::real::next_symbol(&NEWLOCALE, c"newlocale");
    // SAFETY: `p` is the C library's newlocale, of this type.
    let real = unsafe { std::mem::transmute::<*mut c_void, NewlocaleFn>(p) };
    let _g = own_code::Guard::enter();
    // SAFETY: the caller's arguments, passed on unchanged.
    unsafe { real(mask, locale, base) }
}

/// `duplocale(3)`, the C library's, with its allocations kept out of the managed heap.
///
/// # Safety
/// As `duplocale(3)`.
#[no_mangle]
pub unsafe extern "C" fn duplocale(base: libc::locale_t) -> libc::locale_t {
    let p = crate::real::next_symbol(&DUPLOCALE, c"duplocale");
    // SAFETY: `p` is the C library's duplocale, of this type.
    let real = unsafe { std::mem::transmute::<*mut c_void, DuplocaleFn>(p) };
    let _g = own_code::Guard::enter();
    // SAFETY: the caller's argument, passed on unchanged.
    unsafe { real(base) }
}
