//! Sanitizers' runtimes, which must come first in the process's library list.
//!
//! AddressSanitizer's runtime (`libasan.so`, clang's `libclang_rt.asan`) checks at start-up,
//! before any constructor of a preloaded library runs, that it is the first library after
//! the executable, and aborts otherwise ("ASan runtime does not come first in initial
//! library list"); HWASan's and ThreadSanitizer's runtimes intercept `malloc` and must be
//! found before any other definition. With uswap's library first in `LD_PRELOAD`, a
//! program built with `-fsanitize=address` did not start. So the program's own sanitizer
//! runtimes (its `DT_NEEDED`), and those the user preloads, go before uswap's library: the
//! sanitizer keeps its allocator and its checks, and uswap's library, finding `malloc`
//! defined before its own, stands aside in that process, which the run names as outside
//! the budget (`uswap-preload`'s `own_allocator`).
//!
//! Only the program `uswap run` starts is read (its executable, not a script's
//! interpreter); a sanitized program that another process of the tree execs gets the
//! environment that process gives it (docs/cli.md). The runtimes added from the executable
//! are named in [`ENV_ADDED`] and taken out again in the program's process, so that its
//! children get the user's own list.
//! Locking: none (plain reads of the program file).

use std::ffi::{OsStr, OsString};
use std::fs::File;
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::os::unix::fs::FileExt;
use std::path::Path;

/// File names of the runtimes that must come first (prefixes: `libasan.so.8`,
/// `libclang_rt.asan-x86_64.so`).
const FIRST_RUNTIMES: [&[u8]; 8] = [
    b"libasan.so",
    b"libhwasan.so",
    b"libtsan.so",
    b"liblsan.so",
    b"libclang_rt.asan",
    b"libclang_rt.hwasan",
    b"libclang_rt.tsan",
    b"libclang_rt.lsan",
];

/// Names the entries `uswap run` added to the program's `LD_PRELOAD` from its executable,
/// which the preloaded library takes out of its process's environment at start-up
/// (`uswap-preload`'s `sanitizer_env`): they were that program's own, and its children (a
/// shell, `ls`) would otherwise load a sanitizer's runtime they never linked.
pub const ENV_ADDED: &str = "USWAP_SANITIZER_PRELOAD";

/// Most program headers and dynamic entries read: larger tables are not looked at.
const MAX_PHDRS: usize = 256;
const MAX_DYNAMIC_BYTES: u64 = 1 << 20;
/// Longest library name read from the string table.
const MAX_NAME_BYTES: usize = 256;

/// Whether `entry` (a path or a bare name) is a runtime that must come first.
fn is_first_runtime(entry: &[u8]) -> bool {
    let base = entry.rsplit(|&b| b == b'/').next().unwrap_or(entry);
    FIRST_RUNTIMES.iter().any(|r| base.starts_with(r))
}

/// What `uswap run` gives the program at `program` (`None`: a shell script run by
/// `/bin/sh`) for `LD_PRELOAD`, with `preload` uswap's library and `user` the user's own
/// value: the sanitizer runtimes its executable needs (unless the user preloads one) and
/// the user's preloaded runtimes first, then `preload`, then the rest of the user's list, in
/// order. Also the entries added from the executable, if any, for [`ENV_ADDED`].
pub fn ld_preload(preload: &Path, user: Option<&OsStr>, program: Option<&Path>) -> (OsString, Option<OsString>) {
    let user_entries: Vec<&[u8]> = user
        .map(|v| v.as_bytes().split(|&b| b == b':' || b == b' ').filter(|e| !e.is_empty()).collect())
        .unwrap_or_default();
    let user_runtimes: Vec<&[u8]> = user_entries.iter().copied().filter(|e| is_first_runtime(e)).collect();
    // A runtime the user preloads is the one to use: adding the executable's by its bare
    // name could load a second copy, from another file.
    let needed = if user_runtimes.is_empty() { program.map(needed_libraries).unwrap_or_default() } else { Vec::new() };
    let added: Vec<&[u8]> = needed.iter().map(Vec::as_slice).filter(|n| is_first_runtime(n)).collect();
    let mut entries: Vec<&[u8]> = added.iter().copied().chain(user_runtimes).collect();
    entries.push(preload.as_os_str().as_bytes());
    entries.extend(user_entries.iter().copied().filter(|e| !is_first_runtime(e)));
    let added = (!added.is_empty()).then(|| OsString::from_vec(added.join(&b':')));
    (OsString::from_vec(entries.join(&b':')), added)
}

fn u16_at(b: &[u8], at: usize) -> u16 {
    u16::from_le_bytes([b[at], b[at + 1]])
}

fn u64_at(b: &[u8], at: usize) -> u64 {
    let mut w = [0u8; 8];
    w.copy_from_slice(&b[at..at + 8]);
    u64::from_le_bytes(w)
}

/// The `DT_NEEDED` names of a 64-bit little-endian ELF at `path`, in order; empty when it
/// is no such file or its tables cannot be read (nothing is then put first).
fn needed_libraries(path: &Path) -> Vec<Vec<u8>> {
    read_needed(path).unwrap_or_default()
}

fn read_needed(path: &Path) -> Option<Vec<Vec<u8>>> {
    const PT_LOAD: u32 = 1;
    const PT_DYNAMIC: u32 = 2;
    const PHDR_BYTES: usize = 56;
    let f = File::open(path).ok()?;
    let mut eh = [0u8; 64];
    f.read_exact_at(&mut eh, 0).ok()?;
    if &eh[..4] != b"\x7fELF" || eh[4] != 2 || eh[5] != 1 {
        return None;
    }
    let (phoff, phentsize, phnum) = (u64_at(&eh, 32), u16_at(&eh, 54) as usize, u16_at(&eh, 56) as usize);
    if phentsize != PHDR_BYTES || phnum == 0 || phnum > MAX_PHDRS {
        return None;
    }
    let mut ph = vec![0u8; phnum * PHDR_BYTES];
    f.read_exact_at(&mut ph, phoff).ok()?;
    // (virtual address, file offset, bytes in the file) of each loaded segment.
    let mut loads = Vec::new();
    let mut dynamic = None;
    for p in ph.chunks_exact(PHDR_BYTES) {
        let kind = u32::from_le_bytes([p[0], p[1], p[2], p[3]]);
        let (offset, vaddr, filesz) = (u64_at(p, 8), u64_at(p, 16), u64_at(p, 32));
        match kind {
            PT_LOAD => loads.push((vaddr, offset, filesz)),
            PT_DYNAMIC => dynamic = Some((offset, filesz)),
            _ => {}
        }
    }
    let (offset, size) = dynamic?;
    if size > MAX_DYNAMIC_BYTES {
        return None;
    }
    let mut dy = vec![0u8; size as usize];
    f.read_exact_at(&mut dy, offset).ok()?;
    let (names, strtab) = dynamic_entries(&dy);
    let strtab = strtab?;
    let (vaddr, offset, _) = loads.iter().find(|&&(v, _, n)| strtab >= v && strtab - v < n)?;
    let strtab_offset = (strtab - vaddr).checked_add(*offset)?;
    Some(names.iter().filter_map(|&at| read_name(&f, strtab_offset.checked_add(at)?)).collect())
}

/// The string-table offsets of the `DT_NEEDED` entries, and `DT_STRTAB`'s address.
fn dynamic_entries(dy: &[u8]) -> (Vec<u64>, Option<u64>) {
    const DT_NULL: u64 = 0;
    const DT_NEEDED: u64 = 1;
    const DT_STRTAB: u64 = 5;
    let (mut names, mut strtab) = (Vec::new(), None);
    for d in dy.chunks_exact(16) {
        match (u64_at(d, 0), u64_at(d, 8)) {
            (DT_NULL, _) => break,
            (DT_NEEDED, at) => names.push(at),
            (DT_STRTAB, addr) => strtab = Some(addr),
            _ => {}
        }
    }
    (names, strtab)
}

fn read_name(f: &File, at: u64) -> Option<Vec<u8>> {
    let mut b = [0u8; MAX_NAME_BYTES];
    let n = f.read_at(&mut b, at).ok()?;
    let end = b[..n].iter().position(|&c| c == 0)?;
    Some(b[..end].to_vec())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sanitizer_runtimes_go_before_the_library_and_the_rest_after() {
        let lib = Path::new("/opt/uswap/libuswap_preload.so");
        assert_eq!(ld_preload(lib, None, None), (OsString::from("/opt/uswap/libuswap_preload.so"), None));
        let user = OsStr::new("libjemalloc.so.2 /usr/lib/x86_64-linux-gnu/libasan.so.8:libfoo.so");
        assert_eq!(
            ld_preload(lib, Some(user), None),
            (
                OsString::from(
                    "/usr/lib/x86_64-linux-gnu/libasan.so.8:/opt/uswap/libuswap_preload.so:libjemalloc.so.2:libfoo.so"
                ),
                None
            )
        );
        assert!(is_first_runtime(b"libclang_rt.asan-x86_64.so"));
        assert!(!is_first_runtime(b"libubsan.so.1"));
        assert!(!is_first_runtime(b"/usr/lib/libasan_helper/libc.so.6"));
    }

    /// A real executable's `DT_NEEDED`: this test's own names the C library; a file that is
    /// no ELF names nothing.
    #[test]
    fn needed_libraries_are_read_from_the_dynamic_section() {
        let exe = std::env::current_exe().unwrap();
        let needed = needed_libraries(&exe);
        assert!(needed.iter().any(|n| n.starts_with(b"libc.so")), "{needed:?}");
        assert!(needed_libraries(Path::new("/etc/passwd")).is_empty());
        assert!(needed_libraries(Path::new("/nonexistent")).is_empty());
    }
}
