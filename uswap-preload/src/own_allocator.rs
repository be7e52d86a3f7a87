//! Programs that bring their own allocator: an executable that defines the C library's
//! `malloc` (rustc links jemalloc so), or a sanitizer's runtime that `uswap run` preloads
//! before this library (it must come first), is searched before this library, so its allocator,
//! not uswap's heap, serves the C library, the dynamic loader and the Rust runtime inside
//! this library, in memory uswap would page. In such a process the library stands aside,
//! as with `USWAP_DISABLE`, and the process is named as outside the budget (docs/cli.md,
//! "Programs that bring their own malloc").
//!
//! From the constructor only: allocates, calls `dlsym` and `dladdr`.

use std::ffi::c_void;

/// The first of the C library's allocation functions that another object of the process
/// defines ahead of this library (the executable: it comes first in the dynamic linker's
/// search, as rustc's does with jemalloc's `malloc` and `free`), if one does. Then every
/// `malloc` of the C library (a thread's dynamic TLS vector, `pthread_getattr_np`), of the
/// dynamic loader and of the Rust runtime's threads goes to that allocator, whose chunks
/// come from the program's `mmap` (managed memory): a SIGBUS handler reading its thread's
/// TLS vector faulted again, for good (SIGSEGV), and in thread mode a handler thread
/// waited, starting, for the allocator's lock that a thread faulting on its metadata held.
/// Told by the object that defines the symbol found first, not by the address this
/// library's code sees for its own function (which is the first definition's too).
/// From the constructor (`dlsym` may allocate).
pub fn program_allocator() -> Option<&'static str> {
    // Where the first stage loaded this library, its stubs are the first definitions, and
    // they lead here.
    let own_base =
        crate::first_stage::library_base().or_else(|| object_base(program_allocator as *const () as *mut c_void))?;
    [("malloc", c"malloc"), ("free", c"free"), ("calloc", c"calloc"), ("realloc", c"realloc")].into_iter().find_map(
        |(name, symbol)| {
            // SAFETY: dlsym with RTLD_DEFAULT and a NUL-terminated name: the first definition
            // in the process's global search order, or null.
            let first = unsafe { libc::dlsym(libc::RTLD_DEFAULT, symbol.as_ptr()) };
            let elsewhere = !first.is_null() && object_base(first) != Some(own_base);
            (elsewhere && defines(first)).then_some(name)
        },
    )
}

/// Whether the process runs under valgrind: its core's preloaded object is loaded (valgrind
/// puts `vgpreload_core-<platform>.so` first in the program's `LD_PRELOAD`). Its tool serves
/// `malloc` by redirection, not by a symbol `program_allocator` would find, and emulates
/// every system call; uswap's heap, a reservation of up to half the machine's memory that
/// the tool takes as the program's, made memcheck's leak check at exit scan it for minutes
/// (`uswap run -- valgrind /bin/true` ran past 120 s, against 0.6 s alone).
pub fn under_valgrind() -> bool {
    extern "C" fn each(info: *mut libc::dl_phdr_info, _size: usize, data: *mut c_void) -> libc::c_int {
        // SAFETY: dl_iterate_phdr passes a valid info for the call; `data` is the answer
        // below, alive for the iteration.
        let (info, found) = unsafe { (&*info, &mut *(data as *mut bool)) };
        if info.dlpi_name.is_null() {
            return 0;
        }
        // SAFETY: the loader's NUL-terminated name of the object.
        let name = unsafe { std::ffi::CStr::from_ptr(info.dlpi_name) }.to_bytes();
        let file = name.rsplit(|&b| b == b'/').next().unwrap_or(name);
        *found = file.starts_with(b"vgpreload_core-");
        i32::from(*found)
    }
    let mut found = false;
    // SAFETY: the callback only reads the names it is given and writes `found`.
    unsafe { libc::dl_iterate_phdr(Some(each), (&mut found as *mut bool).cast()) };
    found
}

/// The load address of the object that holds `addr` (`dladdr`'s `dli_fbase`).
fn object_base(addr: *mut c_void) -> Option<usize> {
    uswap_escape::objects::object_of(addr as usize).map(|o| o.map_start).filter(|&start| start != 0)
}

/// Whether the symbol at `addr` (a `dlsym` answer) is a definition: not a non-PIE
/// executable's canonical PLT entry for a function it takes the address of (node's
/// `malloc`: an undefined symbol with the entry's address as its value, which `dlsym`
/// answers with, so that function pointers compare equal, and which calls the real one).
fn defines(addr: *mut c_void) -> bool {
    extern "C" {
        fn dladdr1(
            addr: *const c_void,
            info: *mut libc::Dl_info,
            extra: *mut *mut c_void,
            flags: libc::c_int,
        ) -> libc::c_int;
    }
    /// `RTLD_DL_SYMENT`: `extra` receives the matching `ElfW(Sym)`.
    const RTLD_DL_SYMENT: libc::c_int = 1;
    // SAFETY: `Dl_info` is plain data; all-zero is a valid value of it.
    let mut info: libc::Dl_info = unsafe { std::mem::zeroed() };
    let mut sym: *mut c_void = std::ptr::null_mut();
    // SAFETY: dladdr1 fills `info` and, with RTLD_DL_SYMENT, `sym` with a pointer to the
    // loader's symbol table entry (valid while the object is loaded), or leaves it null.
    let found = unsafe { dladdr1(addr, &mut info, &mut sym, RTLD_DL_SYMENT) } != 0;
    if !found || sym.is_null() {
        return true;
    }
    // SAFETY: `sym` points to an `Elf64_Sym` of a loaded object's dynamic symbol table.
    let sym = unsafe { &*(sym as *const libc::Elf64_Sym) };
    /// `SHN_UNDEF`: the section index of an undefined symbol.
    const SHN_UNDEF: u16 = 0;
    sym.st_shndx != SHN_UNDEF
}

/// The program's executable defines `name` of the C library's allocator
/// ([`program_allocator`]): the library stands aside in this process, as with
/// `USWAP_DISABLE` (its children load it again), and notes the process as outside the
/// budget for `uswap run` to name (or, used without `uswap run`, says so on stderr).
pub fn stand_aside(name: &str) {
    if crate::config().is_some_and(|c| c.stats_dir.is_some()) {
        // Under `uswap run`, which names it at the end: not a line from each of a build's
        // thousand compiler processes.
        crate::escape::note_this_process(crate::escape::Why::OwnAllocator);
        return;
    }
    crate::real::say_of_this_process(&format!(
        "runs outside the budget: its {name} is not uswap's (its executable's own, or an allocator or a \
         sanitizer's runtime preloaded first), the allocator the C library and uswap's own threads would then use in memory uswap pages"
    ));
}

/// The process runs under valgrind ([`under_valgrind`]): the library stands aside in it,
/// as in [`stand_aside`].
pub fn stand_aside_under_valgrind() {
    if crate::config().is_some_and(|c| c.stats_dir.is_some()) {
        crate::escape::note_this_process(crate::escape::Why::Valgrind);
        return;
    }
    crate::real::say_of_this_process(
        "runs outside the budget: it runs under valgrind, which serves its malloc and emulates its system calls",
    );
}
