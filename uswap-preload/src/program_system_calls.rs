//! Programs that make all their system calls themselves: an executable that needs no shared
//! library still names the dynamic loader (a Go program built without cgo as a
//! position-independent executable, `go build -buildmode=pie`; code linked with
//! `-nostdlib`), so the loader preloads this library and runs its constructor, but the
//! program never calls the C library. Its memory comes from its own `mmap` system calls,
//! which this library never sees, and its signal handlers from its own `rt_sigaction`,
//! which would replace uswap's. In such a process the library stands aside, as with
//! `USWAP_DISABLE`, and the process is named as outside the budget (docs/cli.md,
//! "Statically linked programs"): before, `uswap run --limit 64MiB` let such a Go program
//! hold 200 MiB and reported an unmanaged peak of 0 bytes.
//!
//! A program that links the C library, even if it makes some calls itself (a Go program
//! built with cgo, whose runtime maps its heap and installs its handlers through the C
//! library), is not judged here. From the constructor only.

use std::ffi::{c_int, c_void};

/// `DT_NULL` and `DT_NEEDED`: the tags that end the dynamic section and name a needed
/// shared library.
const DT_NULL: i64 = 0;
const DT_NEEDED: i64 = 1;
/// Most dynamic entries looked at (linkers write a few dozen; a bound on the loop).
const MAX_DYNAMIC_ENTRIES: usize = 4096;

/// An entry of a 64-bit dynamic section (`Elf64_Dyn`).
#[repr(C)]
struct DynamicEntry {
    tag: i64,
    value: u64,
}

/// Whether the program's executable needs no shared library: its dynamic section has no
/// `DT_NEEDED` entry. The executable is the first object `dl_iterate_phdr` visits (also when
/// the dynamic loader was run as a program: it is then the program it loaded). `false`
/// where that cannot be told.
pub fn program_needs_no_library() -> bool {
    extern "C" fn first(info: *mut libc::dl_phdr_info, _size: usize, data: *mut c_void) -> c_int {
        // SAFETY: dl_iterate_phdr passes a valid info for the call; `data` is the answer
        // below, alive for the iteration.
        let (info, answer) = unsafe { (&*info, &mut *(data as *mut Option<bool>)) };
        *answer = needs_no_library(info);
        // The executable alone: stop at the first object.
        1
    }
    let mut answer: Option<bool> = None;
    // SAFETY: the callback only reads the headers and dynamic section it is given, and
    // writes `answer`.
    unsafe { libc::dl_iterate_phdr(Some(first), (&mut answer as *mut Option<bool>).cast()) };
    answer == Some(true)
}

/// Whether the object `info` describes has a dynamic section without `DT_NEEDED` before
/// its `DT_NULL`; `None` if it has no dynamic section (it then did not load this library
/// through the loader) or no end within its size (the loader reads to `DT_NULL` whatever
/// the size says: not told, so not stood aside for).
fn needs_no_library(info: &libc::dl_phdr_info) -> Option<bool> {
    if info.dlpi_phdr.is_null() {
        return None;
    }
    // SAFETY: dlpi_phdr points at dlpi_phnum program headers of a loaded object.
    let phdrs = unsafe { std::slice::from_raw_parts(info.dlpi_phdr, info.dlpi_phnum as usize) };
    let dynamic = phdrs.iter().find(|h| h.p_type == libc::PT_DYNAMIC)?;
    let first = (info.dlpi_addr as usize).wrapping_add(dynamic.p_vaddr as usize) as *const DynamicEntry;
    let nr_entries = (dynamic.p_memsz as usize / std::mem::size_of::<DynamicEntry>()).min(MAX_DYNAMIC_ENTRIES);
    for i in 0..nr_entries {
        // SAFETY: the object's dynamic section, mapped (a loadable segment covers it) and
        // `nr_entries` entries long; read only.
        let tag = unsafe { (*first.add(i)).tag };
        match tag {
            DT_NEEDED => return Some(false),
            DT_NULL => return Some(true),
            _ => {}
        }
    }
    None
}

/// The program needs no shared library ([`program_needs_no_library`]): the library stands
/// aside in this process (its children load it again) and notes the process as outside the
/// budget for `uswap run` to name (or, used without `uswap run`, says so on stderr).
pub fn stand_aside() {
    if crate::config().is_some_and(|c| c.stats_dir.is_some()) {
        crate::escape::note_this_process(crate::escape::Why::NoLibrary);
        return;
    }
    crate::real::say_of_this_process(
        "runs outside the budget: its executable needs no shared library and makes its system calls itself \
         (a Go program built without cgo, say), so uswap's library never sees its memory",
    );
}
