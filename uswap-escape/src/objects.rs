//! Which loaded object holds an address: the start of its mapping and the path it was loaded
//! under, from the dynamic loader's `_dl_find_object` (glibc 2.35; the standard library linked
//! into both of uswap's preloaded libraries needs it already). A leaf, shared by the first
//! stage (its own path and base, whose `malloc` comes next or first) and the preload library
//! (its own path, a program's own allocator).
//!
//! Why not `dladdr`: it also looks for the symbol nearest the address, a walk over every
//! symbol of the object, and in the C library (some 3,000 of them) that cost each process
//! about as much as the rest of the first stage's start-up; only the object is needed here.
//! `_dl_find_object` takes no lock, is async-signal-safe, and lives in the loader, where a
//! sanitizer's runtime preloaded before uswap's library does not intercept it (they intercept
//! `dladdr` and `dl_iterate_phdr`).

use std::ffi::{c_char, c_int, c_void};

/// A loaded object: the start of its mapping (`dladdr`'s `dli_fbase`, the loader's
/// `l_map_start`), and the path it was loaded under (the loader's string, kept for the life
/// of the object; empty for the program itself).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Object {
    pub map_start: usize,
    pub path: *const c_char,
}

/// glibc's `struct dl_find_object` on x86-64 (`<dlfcn.h>`: no `dlfo_eh_dbase` or
/// `dlfo_eh_count` there), with room to spare past its reserved words.
#[repr(C)]
struct DlFindObject {
    flags: u64,
    map_start: *mut c_void,
    map_end: *mut c_void,
    link_map: *const LinkMapHead,
    eh_frame: *mut c_void,
    reserved: [u64; 16],
}

/// The public head of the loader's `struct link_map` (`<link.h>`).
#[repr(C)]
struct LinkMapHead {
    addr: usize,
    name: *const c_char,
}

extern "C" {
    fn _dl_find_object(address: *mut c_void, result: *mut DlFindObject) -> c_int;
}

/// The object whose mapping holds `addr`, if any.
pub fn object_of(addr: usize) -> Option<Object> {
    let mut found = DlFindObject {
        flags: 0,
        map_start: std::ptr::null_mut(),
        map_end: std::ptr::null_mut(),
        link_map: std::ptr::null(),
        eh_frame: std::ptr::null_mut(),
        reserved: [0; 16],
    };
    // SAFETY: `found` is writable and at least as large as the loader's structure; the call
    // only reads the loader's tables and fills it.
    if unsafe { _dl_find_object(addr as *mut c_void, &mut found) } != 0 || found.link_map.is_null() {
        return None;
    }
    // SAFETY: the loader's link map of a loaded object, valid while it stays loaded (the
    // objects asked about here are never unloaded: the C library, uswap's libraries, the
    // program).
    let path = unsafe { (*found.link_map).name };
    Some(Object { map_start: found.map_start as usize, path })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What `dladdr` says of `addr`: the start of its object's first mapping and its path.
    fn dladdr_of(addr: usize) -> Option<(usize, *const c_char)> {
        // SAFETY: `Dl_info` is plain data; dladdr fills it for an address.
        let mut info: libc::Dl_info = unsafe { std::mem::zeroed() };
        // SAFETY: as above.
        let found = unsafe { libc::dladdr(addr as *const c_void, &mut info) } != 0;
        found.then_some((info.dli_fbase as usize, info.dli_fname))
    }

    #[test]
    fn finds_the_object_dladdr_finds_and_nothing_outside_one() {
        for addr in [libc::getenv as *const () as usize, object_of as *const () as usize] {
            let object = object_of(addr).expect("a function's object");
            let (fbase, fname) = dladdr_of(addr).expect("dladdr knows it too");
            assert_eq!(object.map_start, fbase);
            // The loader names the program itself with an empty string, where dladdr gives
            // its command name: only a library's path is compared.
            if addr == libc::getenv as *const () as usize {
                assert_eq!(object.path, fname);
            }
        }
        assert_ne!(object_of(libc::getenv as *const () as usize), object_of(object_of as *const () as usize));
        let on_the_stack = 0u64;
        assert!(object_of(&on_the_stack as *const u64 as usize).is_none());
        assert!(object_of(0).is_none());
    }
}
