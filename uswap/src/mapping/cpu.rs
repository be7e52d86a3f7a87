//! The CPUs: which one a thread runs on, how many there are, which a thread may use, and
//! pinning a thread to one.

use std::io;

/// The CPU the calling thread runs on (`sched_getcpu`, a vDSO call; async-signal-safe).
pub fn current_cpu() -> usize {
    // SAFETY: no arguments, returns -1 on failure.
    let c = unsafe { libc::sched_getcpu() };
    if c < 0 {
        0
    } else {
        c as usize
    }
}

/// Number of CPUs the system is configured with (an upper bound for `current_cpu`).
pub fn nr_cpus_configured() -> usize {
    // SAFETY: sysconf has no memory effects.
    let n = unsafe { libc::sysconf(libc::_SC_NPROCESSORS_CONF) };
    if n < 1 {
        1
    } else {
        n as usize
    }
}

/// The CPUs this thread may run on (its affinity mask), in ascending order.
pub fn allowed_cpus() -> Vec<usize> {
    // SAFETY: cpu_set_t is plain data; sched_getaffinity fills it.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        if libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut set) != 0 {
            return (0..nr_cpus_configured()).collect();
        }
        (0..libc::CPU_SETSIZE as usize).filter(|&c| libc::CPU_ISSET(c, &set)).collect()
    }
}

/// Pins the calling thread to one CPU.
pub fn pin_current_thread(cpu: usize) -> io::Result<()> {
    // SAFETY: cpu_set_t is plain data; sched_setaffinity reads it.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(cpu, &mut set);
        if libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set) != 0 {
            return Err(io::Error::last_os_error());
        }
    }
    Ok(())
}
