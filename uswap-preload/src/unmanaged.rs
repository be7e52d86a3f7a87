//! The program's memory that uswap does not manage, measured so that a budget that does not
//! hold is said aloud (`uswap run`'s summary, `--strict`).
//!
//! Every mapping of `/proc/self/maps` outside a managed region, the engine's own mappings
//! (`uswap::memory_owner`: its stacks and mappings) and the brk heap (the C library's malloc,
//! which serves only uswap once it runs) is counted from `/proc/self/pagemap`: its private
//! anonymous pages (present, not file or shared memory: what smaps calls `Anonymous`), and
//! the resident pages of shared anonymous memory (`MAP_SHARED|MAP_ANONYMOUS`, memfd, SysV
//! shared memory). Each mapping left gets the reason it is not managed, from what `/proc`
//! says of it. The scan runs on the report thread (every second) and at exit, never on the
//! program's threads.
//!
//! Why not `/proc/self/smaps`: it walks the page tables of every mapping, the managed
//! regions' too (pmbench's 1 GiB: 36 ms of a CPU every second), and while it runs the
//! report thread keeps the process's address space live on a second CPU, so that every
//! `UFFDIO_MOVE` of the faulting thread meanwhile flushes that CPU with an IPI. pagemap is
//! read only where it is wanted. One difference: a page of the kernel's shared zero page
//! (read, never written) counts here, where smaps leaves it out; so the figure is an upper
//! bound.

use std::io::Read;
use std::os::unix::fs::FileExt;

/// One unmanaged mapping: where, how much of it is resident, and why uswap leaves it alone.
#[derive(Debug, Clone)]
pub struct Mapping {
    pub start: usize,
    pub len: usize,
    pub bytes: u64,
    pub why: &'static str,
}

/// What a scan found: the total, and the largest mappings (at most [`LARGEST`]).
#[derive(Debug, Default, Clone)]
pub struct Unmanaged {
    pub bytes: u64,
    pub largest: Vec<Mapping>,
}

/// Mappings named in a report.
pub const LARGEST: usize = 4;

/// The line of a mapping in maps (and its header in smaps): `start-end perms offset dev inode [path]`.
struct Header<'a> {
    start: usize,
    end: usize,
    perms: &'a str,
    path: &'a str,
}

fn parse_header(line: &str) -> Option<Header<'_>> {
    let mut f = line.splitn(6, ' ');
    let (s, e) = f.next()?.split_once('-')?;
    let start = usize::from_str_radix(s, 16).ok()?;
    let end = usize::from_str_radix(e, 16).ok()?;
    let perms = f.next()?;
    let (_off, _dev, _inode) = (f.next()?, f.next()?, f.next()?);
    Some(Header { start, end, perms, path: f.next().unwrap_or("").trim() })
}

fn is_shared_anonymous(path: &str) -> bool {
    path.starts_with("/dev/zero") || path.starts_with("/memfd:") || path.starts_with("/SYSV") || path == "[anon_shmem]"
}

/// Why a mapping with resident memory is not managed, from what `/proc` says of it.
fn why(h: &Header<'_>, min_size_bytes: usize) -> &'static str {
    let shared = h.perms.as_bytes().get(3) == Some(&b's');
    if shared && is_shared_anonymous(h.path) {
        return "shared memory (MAP_SHARED|MAP_ANONYMOUS, memfd, SysV): not paged by uswap (docs/cli.md)";
    }
    match h.path {
        "[stack]" => "the main thread's stack",
        _ if h.perms.contains('x') => "executable memory (a JIT's code cache)",
        p if p.starts_with('/') => "written pages of a file mapping",
        _ if h.end - h.start < min_size_bytes => "smaller than --min-size",
        _ => "mapped where uswap does not see it: inside the C library (thread stacks, its own allocations) or by a raw system call",
    }
}

/// Scans `/proc/self/maps` and `/proc/self/pagemap`. `None` if they cannot be read.
pub fn measure(min_size_bytes: usize) -> Option<Unmanaged> {
    let mut maps = String::new();
    std::fs::File::open("/proc/self/maps").ok()?.read_to_string(&mut maps).ok()?;
    let pagemap = std::fs::File::open("/proc/self/pagemap").ok()?;
    let mut out = Unmanaged::default();
    let mut buf = vec![0u8; PAGEMAP_CHUNK_PAGES * 8];
    for h in maps.lines().filter_map(parse_header) {
        let shared_anon = h.perms.as_bytes().get(3) == Some(&b's') && is_shared_anonymous(h.path);
        let private = h.perms.as_bytes().get(3) == Some(&b'p');
        // The brk heap is the C library's malloc, which serves only uswap once it runs
        // (the program's malloc is the managed heap; see `crate::start`).
        if !(private || shared_anon)
            || h.path == "[heap]"
            || uswap::memory_owner(h.start, h.end) != uswap::MemoryOwner::Other
        {
            continue;
        }
        let bytes = resident_bytes(&pagemap, h.start, h.end, shared_anon, &mut buf)?;
        if bytes == 0 {
            continue;
        }
        out.bytes += bytes;
        out.largest.push(Mapping { start: h.start, len: h.end - h.start, bytes, why: why(&h, min_size_bytes) });
        out.largest.sort_by_key(|m| std::cmp::Reverse(m.bytes));
        out.largest.truncate(LARGEST);
    }
    Some(out)
}

/// Pagemap entries read at once (a 4 KiB read: 2 MiB of address space).
const PAGEMAP_CHUNK_PAGES: usize = 512;
/// pagemap's bits (Documentation/admin-guide/mm/pagemap.rst): the page is present; it is a
/// file page or shared anonymous memory.
const PM_PRESENT: u64 = 1 << 63;
const PM_FILE_OR_SHARED: u64 = 1 << 61;

/// The bytes of `start..end` that count: present pages that are private anonymous ones, or,
/// in shared anonymous memory, every present page. Bounded: one read per chunk of the range.
fn resident_bytes(pagemap: &std::fs::File, start: usize, end: usize, shared_anon: bool, buf: &mut [u8]) -> Option<u64> {
    let page = uswap::PAGE_SIZE;
    let mut nr_counted = 0u64;
    let mut addr = start;
    while addr < end {
        let len = ((end - addr) / page * 8).min(buf.len());
        let got = pagemap.read_at(&mut buf[..len], (addr / page * 8) as u64).ok()?;
        if got < 8 {
            // The end of user space ([vsyscall] lies beyond it): nothing more to read.
            break;
        }
        let counts = |e: &u64| e & PM_PRESENT != 0 && (shared_anon || e & PM_FILE_OR_SHARED == 0);
        nr_counted += buf[..got - got % 8]
            .chunks_exact(8)
            .map(|b| u64::from_ne_bytes([b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7]]))
            .filter(counts)
            .count() as u64;
        addr += got / 8 * page;
    }
    Some(nr_counted * page as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn headers_parse_with_and_without_a_path() {
        let h = parse_header("7f00a000-7f00c000 rw-p 00000000 00:00 0 ").unwrap();
        assert_eq!((h.start, h.end, h.perms, h.path), (0x7f00a000, 0x7f00c000, "rw-p", ""));
        let h = parse_header("55d0-55e0 rw-s 00000000 00:01 12 /memfd:pool (deleted)").unwrap();
        assert_eq!(h.path, "/memfd:pool (deleted)");
        assert!(why(&h, 1 << 16).starts_with("shared memory"));
        assert!(parse_header("Rss:                 4 kB").is_none());
    }

    /// Memory the scan must see: a private anonymous mapping outside every region, touched.
    /// (Mapped with the raw system call: this library's own `mmap`, started in the test
    /// binary by its constructor, would make it a managed region.)
    #[test]
    fn a_touched_private_mapping_is_counted_with_its_reason() {
        let len = 8 << 20;
        let flags = libc::MAP_PRIVATE | libc::MAP_ANONYMOUS;
        let p = crate::real::sys_mmap(std::ptr::null_mut(), len, libc::PROT_READ | libc::PROT_WRITE, flags, -1, 0);
        assert_ne!(p, libc::MAP_FAILED);
        // SAFETY: writes inside the mapping just made.
        unsafe { std::ptr::write_bytes(p as *mut u8, 1, len) };
        let u = measure(64 << 10).expect("maps and pagemap");
        assert!(u.bytes >= len as u64, "{u:?}");
        // The kernel may have merged it with a neighbour: the mapping holding it.
        let a = p as usize;
        assert!(u.largest.iter().any(|m| m.start <= a && a < m.start + m.len && m.bytes >= len as u64), "{u:?}");
        crate::real::sys_munmap(p, len);
    }

    /// Shared anonymous memory counts by its resident pages, exactly the ones touched, and
    /// names its reason; the untouched rest of it counts nothing.
    #[test]
    fn shared_anonymous_memory_counts_the_pages_touched() {
        let len = 4 << 20;
        let touched = 1 << 20;
        let flags = libc::MAP_SHARED | libc::MAP_ANONYMOUS;
        let p = crate::real::sys_mmap(std::ptr::null_mut(), len, libc::PROT_READ | libc::PROT_WRITE, flags, -1, 0);
        assert_ne!(p, libc::MAP_FAILED);
        // SAFETY: writes inside the mapping just made.
        unsafe { std::ptr::write_bytes(p as *mut u8, 1, touched) };
        let u = measure(64 << 10).expect("maps and pagemap");
        let m = u.largest.iter().find(|m| m.start == p as usize);
        let m = m.unwrap_or_else(|| panic!("the shared mapping at {p:?} is not among the largest: {u:?}"));
        assert_eq!((m.len, m.bytes), (len, touched as u64), "{u:?}");
        assert!(m.why.starts_with("shared memory"), "{m:?}");
        crate::real::sys_munmap(p, len);
    }
}
