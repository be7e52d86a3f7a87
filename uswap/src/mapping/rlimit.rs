//! The process's address-space limit, against which every reservation of the engine counts.

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
