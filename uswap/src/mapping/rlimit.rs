//! The sizes memory is sized to: the process's address-space limit, against which every
//! reservation of the engine counts, and the machine's RAM.

/// The process's address-space limit (`RLIMIT_AS`, `ulimit -v`), `None` where there is none.
/// Reservations count against it whether or not they are touched.
pub fn address_space_limit_bytes() -> Option<u64> {
    let mut lim = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: getrlimit writes the limit into `lim`, which lives for the call.
    if unsafe { libc::getrlimit(libc::RLIMIT_AS, &mut lim) } != 0 || lim.rlim_cur == libc::RLIM_INFINITY {
        return None;
    }
    Some(lim.rlim_cur)
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
