//! Questions to the kernel's page table about this process's own memory: which pages are
//! present, which are exclusive to it (not shared with a fork child), and making one page
//! writable and exclusive; and which mappings it has (`/proc/self/maps`). Read-only except
//! `populate_write`, which changes no byte.

use std::io;
use std::ops::ControlFlow;

use crate::uffd::PAGE_SIZE;

/// Makes the page at `addr` (page-aligned) writable and exclusive to this process
/// (`MADV_POPULATE_WRITE`): a page it shares copy-on-write with a fork child is copied, as
/// a write fault would, without changing a byte of it. A page that is missing is faulted in
/// like any access (into userfaultfd, if the range is registered). Async-signal-safe.
pub fn populate_write(addr: usize) -> io::Result<()> {
    // SAFETY: madvise checks the range itself (ENOMEM if unmapped); POPULATE_WRITE faults
    // pages in for writing and never changes their contents or the mapping.
    let r = unsafe { libc::madvise(addr as *mut libc::c_void, PAGE_SIZE, libc::MADV_POPULATE_WRITE) };
    if r != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Whether the page at `addr` (page-aligned, in a mapping) is present in the page table.
/// Allocates nothing: safe in a signal handler.
pub fn page_present(addr: usize) -> bool {
    let mut v = 0u8;
    // SAFETY: mincore reads page tables and writes one byte, into `v`, for a one-page range;
    // an unmapped address gives ENOMEM, not undefined behaviour.
    let r = unsafe { libc::mincore(addr as *mut libc::c_void, PAGE_SIZE, &mut v) };
    r == 0 && v & 1 != 0
}

/// Calls `f(page)` for each page of `[addr, addr + nr_pages * PAGE_SIZE)` present in the
/// page table (`mincore(2)`, in chunks; in a shared mapping, present in the object, whichever
/// process brought it in). The range must be mapped, `addr` page-aligned.
pub fn for_each_present_page(addr: usize, nr_pages: usize, mut f: impl FnMut(usize)) -> io::Result<()> {
    const CHUNK_PAGES: usize = 4096;
    let mut vec = vec![0u8; CHUNK_PAGES];
    let mut first = 0;
    // Bounded: each round moves `first` on by at least one page.
    while first < nr_pages {
        let n = (nr_pages - first).min(CHUNK_PAGES);
        // SAFETY: mincore only reads page tables and writes `n` bytes into `vec`, which has
        // room for CHUNK_PAGES; an unmapped range gives ENOMEM, not undefined behaviour.
        let r =
            unsafe { libc::mincore((addr + first * PAGE_SIZE) as *mut libc::c_void, n * PAGE_SIZE, vec.as_mut_ptr()) };
        if r != 0 {
            return Err(io::Error::last_os_error());
        }
        for (i, b) in vec[..n].iter().enumerate() {
            if b & 1 != 0 {
                f(first + i);
            }
        }
        first += n;
    }
    Ok(())
}

/// Calls `f(i)` for each page `i` of the `nr_pages` at `addr` that is present and mapped by
/// this process alone (`/proc/self/pagemap`: bits 63 and 56, the latter since Linux 4.2; the
/// kernel's zero page never counts). Reads the entries in chunks with `pread`.
pub fn for_each_exclusive_page(addr: usize, nr_pages: usize, mut f: impl FnMut(usize)) -> io::Result<()> {
    const CHUNK_PAGES: usize = 512;
    const PRESENT: u64 = 1 << 63;
    const EXCLUSIVE: u64 = 1 << 56;
    use std::os::fd::AsRawFd;
    let pagemap = std::fs::File::open("/proc/self/pagemap")?;
    let mut entries = [0u64; CHUNK_PAGES];
    let mut first = 0;
    // Bounded: each round moves `first` on by at least one page, or fails.
    while first < nr_pages {
        let n = (nr_pages - first).min(CHUNK_PAGES);
        let offset = ((addr / PAGE_SIZE + first) * 8) as libc::off_t;
        // SAFETY: reads at most `n * 8` bytes into `entries`, which has room for CHUNK_PAGES
        // entries; the descriptor is open for as long as `pagemap` lives.
        let got = unsafe { libc::pread(pagemap.as_raw_fd(), entries.as_mut_ptr().cast(), n * 8, offset) };
        if got <= 0 {
            return Err(if got == 0 { io::ErrorKind::UnexpectedEof.into() } else { io::Error::last_os_error() });
        }
        let got = got as usize / 8;
        for (i, &e) in entries[..got].iter().enumerate() {
            if e & (PRESENT | EXCLUSIVE) == PRESENT | EXCLUSIVE {
                f(first + i);
            }
        }
        first += got;
    }
    Ok(())
}

/// Pages of `[addr, addr + len)` present in the page table, counted with `mincore(2)` in
/// chunks so the vector stays small. The range must be mapped, `addr` page-aligned; a
/// partial last page counts as a page.
pub fn mincore_pages(addr: usize, len: usize) -> io::Result<usize> {
    mincore_pages_where(addr, len, |_| true)
}

/// Which pages of `[addr, addr + len)` are present in the page table: bit `i % 64` of word
/// `i / 64` for page `i` (`mincore(2)` in chunks). Same contract as [`mincore_pages`].
pub fn mincore_bitmap(addr: usize, len: usize) -> io::Result<Vec<u64>> {
    let nr_pages = len.div_ceil(PAGE_SIZE);
    let mut bits = vec![0u64; nr_pages.div_ceil(64)];
    mincore_pages_where(addr, len, |i| {
        bits[i / 64] |= 1 << (i % 64);
        true
    })?;
    Ok(bits)
}

/// As [`mincore_pages`], counting only the pages whose index from `addr` `counted` accepts.
pub fn mincore_pages_where(addr: usize, len: usize, mut counted: impl FnMut(usize) -> bool) -> io::Result<usize> {
    const CHUNK_PAGES: usize = 4096;
    let mut vec = vec![0u8; CHUNK_PAGES];
    let mut total = 0;
    let mut off = 0;
    // Bounded: each round moves `off` on by at least a page (a partial last page included;
    // rounding down made a `len` that was not whole pages spin for ever on n = 0).
    while off < len {
        let n = (len - off).div_ceil(PAGE_SIZE).min(CHUNK_PAGES);
        // SAFETY: mincore only reads page tables and writes `n` bytes into `vec`, which has
        // room for CHUNK_PAGES; an unmapped range gives ENOMEM, not undefined behaviour.
        let r = unsafe { libc::mincore((addr + off) as *mut libc::c_void, n * PAGE_SIZE, vec.as_mut_ptr()) };
        if r != 0 {
            return Err(io::Error::last_os_error());
        }
        let first = off / PAGE_SIZE;
        total += vec[..n].iter().enumerate().filter(|&(i, &b)| b & 1 != 0 && counted(first + i)).count();
        off += n * PAGE_SIZE;
    }
    Ok(total)
}

/// One mapping of this process, as a line of `/proc/self/maps` gives it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MapsEntry {
    /// `[start, end)`, page-aligned.
    pub start: usize,
    pub end: usize,
    /// Whether its protection lets it be read.
    pub readable: bool,
    /// Whether it is an inaccessible private anonymous mapping (`---p`, no file): address
    /// space reserved, as `mmap(PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS)` makes it.
    pub reservation: bool,
}

/// This process's mappings, by address, from `/proc/self/maps` (a line that does not parse
/// is left out); none if the file cannot be read, or if the list cannot be allocated. Reads
/// the file a buffer at a time ([`for_each_maps_line`]) and grows the list fallibly: a
/// process at the system's limit of mappings (`vm.max_map_count`; stress-ng's brk stressor
/// reaches it) can get no new memory at all, and reading the whole file into a string, or
/// a list that must grow, aborted it. Not for a signal handler.
pub fn self_maps() -> Option<Vec<MapsEntry>> {
    let mut entries = Vec::new();
    let mut room = true;
    let read = for_each_maps_line::<MAPS_LINE_BYTES>(|line| {
        if let Some(entry) = maps_entry(maps_text(line)) {
            room = entries.try_reserve(1).is_ok();
            if room {
                entries.push(entry);
            }
        }
        if room {
            ControlFlow::Continue(())
        } else {
            ControlFlow::Break(())
        }
    });
    (read && room).then_some(entries)
}

/// A buffer that holds a line of `/proc/self/maps` whole but for a path of thousands of
/// bytes (the fields before the path take under a hundred).
pub const MAPS_LINE_BYTES: usize = 8192;

/// One line of `/proc/self/maps` as a [`MapsEntry`].
fn maps_entry(line: &str) -> Option<MapsEntry> {
    let mut fields = line.split_whitespace();
    let (range, perms) = (fields.next()?, fields.next()?);
    let (start, end) = range.split_once('-')?;
    let (start, end) = (usize::from_str_radix(start, 16).ok()?, usize::from_str_radix(end, 16).ok()?);
    // Offset, device, inode, then the path if there is one.
    let inode = fields.nth(2)?;
    let reservation = perms == "---p" && inode == "0" && fields.next().is_none();
    Some(MapsEntry { start, end, readable: perms.starts_with('r'), reservation })
}

/// The text of a line of `/proc/self/maps`: all of it, or, where its path is not UTF-8 (a
/// file name is any bytes), the line up to the path's first byte that is not; the fields
/// before the path are ASCII. A whole-file `read_to_string` failed on such a name, and every
/// reader of the file got nothing.
pub fn maps_text(line: &[u8]) -> &str {
    match std::str::from_utf8(line) {
        Ok(text) => text,
        Err(e) => std::str::from_utf8(&line[..e.valid_up_to()]).unwrap_or_default(),
    }
}

/// Calls `f(start, end)` for each mapping `/proc/self/maps` lists, by address, reading the
/// file a page at a time: allocation-free, for the system-call guard's slow path. See
/// [`for_each_maps_line`].
pub(super) fn for_each_self_mapping(mut f: impl FnMut(usize, usize)) -> bool {
    for_each_maps_line::<4096>(|line| {
        if let Some((start, end)) = maps_range(line) {
            f(start, end);
        }
        ControlFlow::Continue(())
    })
}

/// Calls `f(line)` for each line of `/proc/self/maps` (without its newline), by address,
/// until it says to stop, reading the file into a buffer of `N` bytes on the stack:
/// allocation-free. A line longer than the buffer is given cut to its first `N` bytes: its
/// range and fields come first, and with [`MAPS_LINE_BYTES`] only a path of thousands of
/// bytes is cut. `f` may change mappings: the kernel goes on from the address its listing
/// reached. False if the file cannot be opened or read (a listing cut short is not taken
/// for a whole one).
pub fn for_each_maps_line<const N: usize>(f: impl FnMut(&[u8]) -> ControlFlow<()>) -> bool {
    for_each_line_of::<N>(c"/proc/self/maps", f)
}

/// [`for_each_maps_line`] for the file at `path` (`/proc/self/smaps`).
pub fn for_each_line_of<const N: usize>(path: &std::ffi::CStr, f: impl FnMut(&[u8]) -> ControlFlow<()>) -> bool {
    // SAFETY: opens a file by a NUL-terminated path; the descriptor is closed below.
    let fd = unsafe { libc::open(path.as_ptr(), libc::O_RDONLY | libc::O_CLOEXEC) };
    if fd < 0 {
        return false;
    }
    // Bounded: each try reads, or fails with something other than an interruption.
    let read = |buf: &mut [u8]| loop {
        // SAFETY: reads into `buf`, of `buf.len()` bytes.
        let n = unsafe { libc::read(fd, buf.as_mut_ptr().cast(), buf.len()) };
        if n >= 0 || io::Error::last_os_error().kind() != io::ErrorKind::Interrupted {
            return n;
        }
    };
    let whole = for_each_line::<N>(read, f);
    // SAFETY: the descriptor opened above, closed once.
    unsafe { libc::close(fd) };
    whole
}

/// Splits what `read` gives into lines for `f`, through a buffer of `N` bytes, as
/// [`for_each_maps_line`] says: `read(buf)` fills the front of `buf` and returns how many
/// bytes it put there, 0 at the end, or a negative number on an error (then false). A last
/// line without a newline is given too.
fn for_each_line<const N: usize>(
    mut read: impl FnMut(&mut [u8]) -> isize,
    mut f: impl FnMut(&[u8]) -> ControlFlow<()>,
) -> bool {
    let mut buf = [0u8; N];
    // `skipping`: the rest of a line longer than the buffer, whose start was given.
    let (mut filled, mut skipping) = (0, false);
    // Bounded by what `read` gives: each pass takes at least a byte, or ends.
    loop {
        debug_assert!(filled < N);
        let n = read(&mut buf[filled..]);
        if n <= 0 {
            if n == 0 && filled > 0 && !skipping {
                let _ = f(&buf[..filled]);
            }
            return n == 0;
        }
        filled += n as usize;
        let mut consumed = 0;
        while let Some(nl) = buf[consumed..filled].iter().position(|&b| b == b'\n') {
            let flow = if skipping { ControlFlow::Continue(()) } else { f(&buf[consumed..consumed + nl]) };
            (skipping, consumed) = (false, consumed + nl + 1);
            if flow.is_break() {
                return true;
            }
        }
        if consumed == 0 && filled == N {
            // A line longer than the buffer: its first `N` bytes, then nothing until its end.
            if !skipping && f(&buf).is_break() {
                return true;
            }
            (skipping, consumed) = (true, filled);
        }
        buf.copy_within(consumed..filled, 0);
        filled -= consumed;
    }
}

/// `[start, end)` from a line of `/proc/self/maps` (`start-end perms ...`, in hex).
fn maps_range(line: &[u8]) -> Option<(usize, usize)> {
    let dash = line.iter().position(|&b| b == b'-')?;
    let space = dash + line[dash..].iter().position(|&b| b == b' ')?;
    let hex = |s: &[u8]| usize::from_str_radix(std::str::from_utf8(s).ok()?, 16).ok();
    Some((hex(&line[..dash])?, hex(&line[dash + 1..space])?))
}

#[cfg(test)]
mod tests {
    use std::os::fd::AsRawFd;

    use super::*;

    /// The buffer-at-a-time reader lists the mappings, a mapping with a path longer than its
    /// buffer included (its line is cut across reads). Other tests' threads map meanwhile:
    /// the list is checked for the test's own mapping and for well-formed ranges.
    #[test]
    fn each_mapping_is_read_once_in_order_long_lines_too() {
        let dir = std::env::temp_dir().join(format!("uswap-maps-{}-{}", std::process::id(), "d".repeat(200)));
        // A path of over 4,032 bytes (PATH_MAX is 4,096): its line is longer than the buffer.
        let mut deep = dir.clone();
        while deep.as_os_str().len() + 201 + "/mapped".len() < 4090 {
            deep.push("x".repeat(200));
        }
        std::fs::create_dir_all(&deep).unwrap();
        let file = deep.join("mapped");
        assert!(file.as_os_str().len() > 4096 - 64, "{}", file.as_os_str().len());
        std::fs::write(&file, [7u8; 4096]).unwrap();
        let f = std::fs::File::open(&file).unwrap();
        // SAFETY: a fresh read-only private mapping of the file, unmapped below.
        let p = unsafe { libc::mmap(std::ptr::null_mut(), 4096, libc::PROT_READ, libc::MAP_PRIVATE, f.as_raw_fd(), 0) };
        assert_ne!(p, libc::MAP_FAILED);
        // Room first: the reader must not see this vector's own mapping grow.
        let mut seen = Vec::with_capacity(1 << 16);
        assert!(for_each_self_mapping(|s, e| seen.push((s, e))));
        // SAFETY: the mapping made above.
        unsafe { libc::munmap(p, 4096) };
        std::fs::remove_dir_all(&dir).unwrap();
        assert!(seen.contains(&(p as usize, p as usize + 4096)), "the test's mapping is not listed: {seen:x?}");
        // Not disjoint: a mapping another test's merged with one already listed is listed
        // again, whole (the kernel goes on from the next mapping's start).
        assert!(seen.len() > 3 && seen.iter().all(|&(s, e)| s < e && s % 4096 == 0), "{seen:x?}");
    }
    /// A file whose name is not UTF-8 (a name is any bytes) leaves the list of mappings
    /// whole, the mapping of it listed: reading the file into a string failed on such a
    /// name, and every reader of the list got none.
    #[test]
    fn a_name_that_is_not_utf8_leaves_the_list_whole() {
        use std::os::unix::ffi::OsStrExt;
        let name = [b"uswap-maps-\xff\xfe-".as_slice(), std::process::id().to_string().as_bytes()].concat();
        let file = std::env::temp_dir().join(std::ffi::OsStr::from_bytes(&name));
        std::fs::write(&file, [7u8; 4096]).unwrap();
        let f = std::fs::File::open(&file).unwrap();
        // SAFETY: a fresh read-only private mapping of the file, unmapped below.
        let p = unsafe { libc::mmap(std::ptr::null_mut(), 4096, libc::PROT_READ, libc::MAP_PRIVATE, f.as_raw_fd(), 0) };
        assert_ne!(p, libc::MAP_FAILED);
        let maps = self_maps();
        // SAFETY: the mapping made above.
        unsafe { libc::munmap(p, 4096) };
        std::fs::remove_file(&file).unwrap();
        let maps = maps.expect("the list of mappings");
        let entry = maps.iter().find(|m| m.start == p as usize);
        assert_eq!(entry.map(|m| (m.end, m.readable, m.reservation)), Some((p as usize + 4096, true, false)));
        let line = b"7f00a000-7f00b000 r--p 00000000 fe:00 7 /tmp/a\xffb";
        assert_eq!(maps_text(line), "7f00a000-7f00b000 r--p 00000000 fe:00 7 /tmp/a");
    }
    /// The lines of what a reader gives, `chunk` bytes at a time, through a buffer of 8
    /// bytes, until `f` stops at a line equal to `stop`.
    fn lines_of(text: &[u8], chunk: usize, stop: &[u8]) -> (bool, Vec<Vec<u8>>) {
        let mut at = 0;
        let read = |buf: &mut [u8]| {
            let n = chunk.min(buf.len()).min(text.len() - at);
            buf[..n].copy_from_slice(&text[at..at + n]);
            at += n;
            n as isize
        };
        let mut lines = Vec::new();
        let whole = for_each_line::<8>(read, |line| {
            lines.push(line.to_vec());
            if line == stop {
                ControlFlow::Break(())
            } else {
                ControlFlow::Continue(())
            }
        });
        (whole, lines)
    }

    /// Lines shorter than, as long as and longer than the buffer (cut to it, given once),
    /// read in chunks of every size, a last line without a newline, a stop on a line cut,
    /// and a reader that fails.
    #[test]
    fn lines_are_given_once_each_cut_to_the_buffer() {
        let text = b"a\n12345678\n123456789\n12345678901234567\n\nend";
        let want: Vec<&[u8]> = vec![b"a", b"12345678", b"12345678", b"12345678", b"", b"end"];
        for chunk in 1..=10 {
            let (whole, lines) = lines_of(text, chunk, b"-");
            assert!(whole, "chunk {chunk}");
            assert_eq!(lines, want, "chunk {chunk}");
        }
        let (whole, lines) = lines_of(text, 3, b"12345678");
        assert!(whole);
        assert_eq!(lines, vec![b"a".to_vec(), b"12345678".to_vec()], "stopped at its first cut line");
        assert!(!for_each_line::<8>(|_| -1, |_| ControlFlow::Continue(())), "a failed read is not a whole file");
    }
}
