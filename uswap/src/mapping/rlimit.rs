//! The sizes memory is sized to: the process's address-space limit, against which every
//! reservation of the engine counts, and the machine's RAM.

/// Which limit bounds the process's reservations (see [`address_space_limit`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AddressSpaceLimit {
    /// `RLIMIT_AS`, `ulimit -v`: every mapping counts.
    AddressSpace,
    /// `RLIMIT_DATA`, `ulimit -d`: private writable mappings count, which every reservation
    /// of uswap's becomes as it is used (the heap as mimalloc is handed it, a pool's arena
    /// and the staging areas window by window): they are sized to fit as if whole.
    Data,
}

/// The room the process's reservations must fit in, and which limit sets it: the lower of
/// `RLIMIT_AS` and `RLIMIT_DATA`, `None` where neither is set. Reservations count against
/// them whether or not they are touched (against `RLIMIT_DATA`, once made writable).
pub fn address_space_limit() -> Option<(u64, AddressSpaceLimit)> {
    [(libc::RLIMIT_AS, AddressSpaceLimit::AddressSpace), (libc::RLIMIT_DATA, AddressSpaceLimit::Data)]
        .into_iter()
        .filter_map(|(resource, which)| {
            let mut lim = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
            // SAFETY: getrlimit writes the limit into `lim`, which lives for the call.
            let ok = unsafe { libc::getrlimit(resource, &mut lim) } == 0;
            (ok && lim.rlim_cur != libc::RLIM_INFINITY).then_some((lim.rlim_cur, which))
        })
        .min_by_key(|&(bytes, _)| bytes)
}

/// The bytes of [`address_space_limit`].
pub fn address_space_limit_bytes() -> Option<u64> {
    address_space_limit().map(|(bytes, _)| bytes)
}

/// The machine's RAM (`MemTotal`), from `sysinfo(2)`; `None` if it fails. Not read from
/// `/proc/meminfo`: the kernel sums its per-CPU counters to print that file, 40 µs of every
/// managed process's start measured, for the one line wanted here.
pub fn ram_bytes() -> Option<u64> {
    // SAFETY: sysinfo fills the struct it is given, which lives for the call; all-zero is a
    // valid value of it.
    let mut info: libc::sysinfo = unsafe { std::mem::zeroed() };
    // SAFETY: see above.
    if unsafe { libc::sysinfo(&mut info) } != 0 {
        return None;
    }
    (info.totalram as u64).checked_mul(u64::from(info.mem_unit.max(1)))
}

/// The memory the machine can give without swapping (`MemAvailable` of `/proc/meminfo`),
/// in bytes; `None` if it cannot be read. Read with the system calls alone, into a buffer on
/// the stack: called from a fatal signal's handler (`core_dump`). Allocation-free.
pub fn mem_available_bytes() -> Option<u64> {
    let mut buf = [0u8; 512];
    let text = read_small_file(c"/proc/meminfo", &mut buf)?;
    parse_mem_available_kib(text).and_then(|kib| kib.checked_mul(1024))
}

/// The room left under the memory limits of this process's cgroup and its ancestors (v2's
/// `memory.max` less `memory.current`, or v1's `memory.limit_in_bytes` less
/// `memory.usage_in_bytes`), the least of them, in bytes; `None` where none is set or none
/// can be read. Each level of the path is looked at from the hierarchy's mount point down
/// (in a container without a cgroup namespace the mount point is the container's own
/// cgroup, and the host's path below it is not found). Allocation-free, as
/// [`mem_available_bytes`].
pub fn cgroup_room_bytes() -> Option<u64> {
    let mut buf = [0u8; 4096];
    let text = read_small_file(c"/proc/self/cgroup", &mut buf)?;
    // Whole lines only: a file longer than the buffer ends in a cut one.
    let whole = &text[..text.iter().rposition(|&c| c == b'\n').map_or(0, |i| i + 1)];
    let mut least: Option<u64> = None;
    for line in whole.split(|&c| c == b'\n') {
        // `0::/path` (v2) or `N:memory,...:/path` (v1).
        let mut parts = line.splitn(3, |&c| c == b':');
        let (Some(_), Some(controllers), Some(path)) = (parts.next(), parts.next(), parts.next()) else { continue };
        let files: (&[u8], &[u8], &[u8]) = if controllers.is_empty() {
            (b"/sys/fs/cgroup", b"memory.max", b"memory.current")
        } else if controllers.split(|&c| c == b',').any(|c| c == b"memory") {
            (b"/sys/fs/cgroup/memory", b"memory.limit_in_bytes", b"memory.usage_in_bytes")
        } else {
            continue;
        };
        // The mount point itself, then each level of the path: `/a`, `/a/b`, ...
        let ends = std::iter::once(0).chain((1..=path.len()).filter(|&i| i == path.len() || path[i] == b'/'));
        for end in ends {
            if let Some(room) = room_at(files, &path[..end]) {
                least = Some(least.map_or(room, |l| l.min(room)));
            }
        }
    }
    least
}

/// The room under the limit of the cgroup at `dir` below the mount point `files.0`, whose
/// limit and usage are the files `files.1` and `files.2`; `None` without a limit or a file.
fn room_at(files: (&[u8], &[u8], &[u8]), dir: &[u8]) -> Option<u64> {
    let mut values = [0u64; 2];
    for (value, file) in values.iter_mut().zip([files.1, files.2]) {
        let mut path = [0u8; 512];
        let parts: [&[u8]; 4] = [files.0, dir, b"/", file];
        let len: usize = parts.iter().map(|p| p.len()).sum();
        if len >= path.len() {
            return None;
        }
        let mut at = 0;
        for p in parts {
            path[at..at + p.len()].copy_from_slice(p);
            at += p.len();
        }
        let name = std::ffi::CStr::from_bytes_until_nul(&path[..=len]).ok()?;
        let mut number = [0u8; 32];
        // "max" (v2's no limit) does not parse.
        *value = parse_decimal(read_small_file(name, &mut number)?)?;
    }
    // v1's "no limit" is a number near 2^63. Usage past a limit lowered under it: no room.
    (values[0] < 1 << 62).then(|| values[0].saturating_sub(values[1]))
}

/// The leading decimal number of `text` (spaces skipped).
fn parse_decimal(text: &[u8]) -> Option<u64> {
    let mut digits = text.iter().skip_while(|c| **c == b' ').take_while(|c| c.is_ascii_digit()).peekable();
    digits.peek()?;
    digits.try_fold(0u64, |n, c| n.checked_mul(10)?.checked_add(u64::from(c - b'0')))
}

/// Reads the start of the file at `path` into `buf` with the system calls alone (no
/// allocation: safe in a signal handler); the bytes read, or `None` if it cannot be opened
/// or read.
pub fn read_small_file<'b>(path: &std::ffi::CStr, buf: &'b mut [u8]) -> Option<&'b [u8]> {
    // SAFETY: a NUL-terminated path; the descriptor is ours and closed below.
    let fd = unsafe { libc::open(path.as_ptr(), libc::O_RDONLY | libc::O_CLOEXEC) };
    if fd < 0 {
        return None;
    }
    // SAFETY: reads into the caller's buffer, at most its length; closes our descriptor.
    let n = unsafe {
        let n = libc::read(fd, buf.as_mut_ptr().cast(), buf.len());
        libc::close(fd);
        n
    };
    buf.get(..usize::try_from(n).ok()?)
}

/// `MemAvailable:   123456 kB` in `/proc/meminfo`'s text: the number of KiB.
fn parse_mem_available_kib(text: &[u8]) -> Option<u64> {
    const KEY: &[u8] = b"MemAvailable:";
    let at = text.windows(KEY.len()).position(|w| w == KEY)? + KEY.len();
    // Bounded by the buffer; a number too long for u64 is no reading.
    parse_decimal(&text[at..])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mem_available_is_read_from_meminfo() {
        let text = b"MemTotal:       24576000 kB\nMemFree:        100 kB\nMemAvailable:   2048 kB\nBuffers: 1 kB\n";
        assert_eq!(parse_mem_available_kib(text), Some(2048));
        assert_eq!(parse_mem_available_kib(b"MemTotal: 5 kB\n"), None);
        let now = mem_available_bytes().expect("this machine's /proc/meminfo");
        assert!(now > 0 && now <= ram_bytes().unwrap(), "{now}");
        assert_eq!(parse_decimal(b"max\n"), None);
        assert_eq!(parse_decimal(b"1234\n"), Some(1234));
        // Whatever this machine's cgroup, a room is below its RAM... or there is no limit.
        if let Some(room) = cgroup_room_bytes() {
            assert!(room <= 1 << 62, "{room}");
        }
    }
}
