//! Which loaded object holds an address, from the loader's list of objects
//! (`dl_iterate_phdr`): the object's load address and the path it was loaded under. A leaf.
//!
//! Why not `dladdr`: it also looks for the symbol nearest the address, a walk over every
//! symbol of the object, and in the C library (some 3,000 of them) that cost each process
//! about as much as the rest of this library's start-up; only the object is needed here.

use std::ffi::{c_char, c_int, c_void};

/// The loader maps segments at page boundaries (4 KiB on x86-64).
const PAGE_BYTES: usize = 4096;

/// A loaded object: the start of its first mapping (`dladdr`'s `dli_fbase`), and the path
/// it was loaded under (the loader's string, kept for the life of the object; empty for the
/// program itself).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Object {
    pub map_start: usize,
    pub path: *const c_char,
}

/// The object one of whose loaded segments holds `addr`, if any.
pub fn object_of(addr: usize) -> Option<Object> {
    struct Search {
        addr: usize,
        found: Option<Object>,
    }
    extern "C" fn each(info: *mut libc::dl_phdr_info, _size: usize, data: *mut c_void) -> c_int {
        // SAFETY: dl_iterate_phdr passes a valid info; `data` is the `Search` below.
        let (info, search) = unsafe { (&*info, &mut *(data as *mut Search)) };
        let base = info.dlpi_addr as usize;
        // SAFETY: the loader's program headers of the object, `dlpi_phnum` of them.
        let phdrs = unsafe { std::slice::from_raw_parts(info.dlpi_phdr, usize::from(info.dlpi_phnum)) };
        let loads = || phdrs.iter().filter(|p| p.p_type == libc::PT_LOAD);
        let holds = loads().any(|p| {
            let start = base.wrapping_add(p.p_vaddr as usize);
            (start..start.wrapping_add(p.p_memsz as usize)).contains(&search.addr)
        });
        if holds {
            let first_vaddr = loads().map(|p| p.p_vaddr as usize).min().unwrap_or(0);
            let map_start = base.wrapping_add(first_vaddr) & !(PAGE_BYTES - 1);
            search.found = Some(Object { map_start, path: info.dlpi_name });
        }
        c_int::from(holds)
    }
    let mut search = Search { addr, found: None };
    // SAFETY: the callback reads the objects it is given and writes `search`.
    unsafe { libc::dl_iterate_phdr(Some(each), (&mut search as *mut Search).cast()) };
    search.found
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
