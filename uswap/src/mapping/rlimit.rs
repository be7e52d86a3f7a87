//! The sizes memory is sized to: the process's address-space limit, against which every
//! reservation of the engine counts, and the machine's RAM.

/// Which limit bounds the process's reservations (see [`address_space_limit`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AddressSpaceLimit {
    /// `RLIMIT_AS`, `ulimit -v`: every mapping counts.
    AddressSpace,
    /// `RLIMIT_DATA`, `ulimit -d`: private writable mappings count, which every reservation
    /// of uswap's is (the heap, a pool's arena, the staging areas).
    Data,
}

/// The room the process's reservations must fit in, and which limit sets it: the lower of
/// `RLIMIT_AS` and `RLIMIT_DATA`, `None` where neither is set. Reservations count against
/// them whether or not they are touched.
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
