//! The program's memory that uswap does not manage, measured so that a budget that does not
//! hold is said aloud (`uswap run`'s summary, `--strict`).
//!
//! Read from `/proc/self/smaps`: every mapping's private anonymous pages (`Anonymous`), and
//! the resident pages of shared anonymous memory (`MAP_SHARED|MAP_ANONYMOUS`, memfd, SysV
//! shared memory), less what lies in a managed region or in the engine's own mappings
//! (`uswap::memory_owner`: its stacks and mappings) or in the brk heap (the C library's
//! malloc, which serves only uswap once it runs). Each mapping left gets the reason it is
//! not managed, from what
//! `/proc` says of it. The scan runs on the report thread (every second) and at exit, never
//! on the program's threads.

use std::io::BufRead;

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

/// The header line of a mapping in smaps: `start-end perms offset dev inode [path]`.
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

/// Scans `/proc/self/smaps`. `None` if it cannot be read.
pub fn measure(min_size_bytes: usize) -> Option<Unmanaged> {
    let f = std::fs::File::open("/proc/self/smaps").ok()?;
    let mut out = Unmanaged::default();
    let mut cur: Option<(usize, usize, &'static str, bool)> = None;
    let mut shared_anon = false;
    let flush = |cur: Option<(usize, usize, &'static str, bool)>, bytes: u64, out: &mut Unmanaged| {
        let Some((start, end, why, counted)) = cur else { return };
        if !counted || bytes == 0 || uswap::memory_owner(start, end) != uswap::MemoryOwner::Other {
            return;
        }
        out.bytes += bytes;
        out.largest.push(Mapping { start, len: end - start, bytes, why });
        out.largest.sort_by_key(|m| std::cmp::Reverse(m.bytes));
        out.largest.truncate(LARGEST);
    };
    let mut bytes = 0u64;
    for line in std::io::BufReader::new(f).lines() {
        let line = line.ok()?;
        if let Some(h) = parse_header(&line) {
            flush(cur.take(), bytes, &mut out);
            bytes = 0;
            shared_anon = h.perms.as_bytes().get(3) == Some(&b's') && is_shared_anonymous(h.path);
            let private = h.perms.as_bytes().get(3) == Some(&b'p');
            // The brk heap is the C library's malloc, which serves only uswap once it runs
            // (the program's malloc is the managed heap; see `crate::start`).
            let uswaps = h.path == "[heap]";
            cur = Some((h.start, h.end, why(&h, min_size_bytes), (private || shared_anon) && !uswaps));
            continue;
        }
        let field = if shared_anon { "Rss:" } else { "Anonymous:" };
        if let Some(kb) = line.strip_prefix(field) {
            bytes = kb.trim().trim_end_matches("kB").trim().parse::<u64>().unwrap_or(0) * 1024;
        }
    }
    flush(cur.take(), bytes, &mut out);
    Some(out)
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
        let u = measure(64 << 10).expect("smaps");
        assert!(u.bytes >= len as u64, "{u:?}");
        // The kernel may have merged it with a neighbour: the mapping holding it.
        let a = p as usize;
        assert!(u.largest.iter().any(|m| m.start <= a && a < m.start + m.len && m.bytes >= len as u64), "{u:?}");
        crate::real::sys_munmap(p, len);
    }
}
