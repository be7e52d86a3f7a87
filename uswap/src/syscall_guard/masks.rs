//! The signal masks a program's calls set, in signal mode: SIGBUS is kept out of each while
//! uswap's SIGBUS handler is installed (see [`keep_sigbus_deliverable`]). Part of the slow
//! path (`entry`): runs on the program's thread, allocates nothing, takes no lock; the masks
//! are read with [`read_user`], so a bad pointer is the kernel's `EFAULT`, not a crash here.

use libc::c_long;

use super::raw::read_user;

/// The bit of SIGBUS in a kernel `sigset_t` (x86-64: one word).
const SIGBUS_BIT: u64 = 1 << (libc::SIGBUS - 1);

/// A kernel `sigset_t`'s bytes on x86-64: one word.
const KERNEL_SIGSET_BYTES: u64 = 8;

/// `io_pgetevents` on x86-64 (the `libc` crate names it for other targets only).
const SYS_IO_PGETEVENTS: c_long = 333;

/// Signal mode: a mask the program sets through the C library (`sigprocmask`,
/// `pthread_sigmask`, glibc's own around `pthread_create` and `fork`, a handler's `sa_mask`
/// in `sigaction`) never holds SIGBUS while uswap's SIGBUS handler is installed: a blocked
/// SIGBUS on a fault kills the process (the kernel forces it to its default action), so
/// the call is made with a copy of the mask, in `copy`, without it. What the program asked
/// for otherwise stands; an `oldset` it reads back says SIGBUS is not blocked, which is
/// true. `a` is changed to point at the copy. The same for the masks a call sets while it
/// waits (`sigsuspend`, `ppoll`, `pselect`, `epoll_pwait`, `io_pgetevents`): a handler that
/// ends the wait runs under that mask, and `sigsuspend` with every signal but one blocked
/// is how many daemons wait; a fault in that handler killed the process.
pub(super) fn keep_sigbus_deliverable(nr: c_long, a: &mut [u64; 6], copy: &mut [u64; 4]) {
    if !crate::uffd::sigbus::installed() {
        return;
    }
    // Where the call's mask is: (argument of its pointer, argument of its size), or for
    // `pselect6` and `io_pgetevents` the argument of a pointer to a {mask, size} pair.
    match nr {
        libc::SYS_rt_sigprocmask if a[0] == libc::SIG_BLOCK as u64 || a[0] == libc::SIG_SETMASK as u64 => {
            strip_mask_at(a, 1, 3, copy);
        }
        libc::SYS_rt_sigaction => {
            // `struct kernel_sigaction` on x86-64: handler, flags, restorer, mask.
            if a[3] != KERNEL_SIGSET_BYTES {
                return;
            }
            let Some(act) = read_user::<[u64; 4]>(&mut crate::pin::Pin::none(), a[1]) else { return };
            if act[3] & SIGBUS_BIT != 0 {
                *copy = act;
                copy[3] &= !SIGBUS_BIT;
                a[1] = copy.as_ptr() as u64;
            }
        }
        libc::SYS_rt_sigsuspend => strip_mask_at(a, 0, 1, copy),
        libc::SYS_ppoll => strip_mask_at(a, 3, 4, copy),
        libc::SYS_epoll_pwait | libc::SYS_epoll_pwait2 => strip_mask_at(a, 4, 5, copy),
        libc::SYS_pselect6 | SYS_IO_PGETEVENTS => {
            // `{ const sigset_t *mask; size_t size; }`: the call gets a copy of the pair, in
            // `copy[0..2]`, that points at a copy of the mask, in `copy[2]`.
            let Some([mask_at, size]) = read_user::<[u64; 2]>(&mut crate::pin::Pin::none(), a[5]) else { return };
            if let Some(mask) = without_sigbus(mask_at, size) {
                copy[2] = mask;
                copy[0] = std::ptr::addr_of!(copy[2]) as u64;
                copy[1] = size;
                a[5] = copy.as_ptr() as u64;
            }
        }
        _ => {}
    }
}

/// Points `a[at]` at a copy of the mask it points to, in `copy[0]`, without SIGBUS, if that
/// mask is a kernel `sigset_t` (`a[size_at]` bytes) holding it.
fn strip_mask_at(a: &mut [u64; 6], at: usize, size_at: usize, copy: &mut [u64; 4]) {
    if let Some(mask) = without_sigbus(a[at], a[size_at]) {
        copy[0] = mask;
        a[at] = copy.as_ptr() as u64;
    }
}

/// The mask at `mask_at` (`size` bytes) without SIGBUS, if it is a kernel `sigset_t` that
/// holds it; `None` otherwise (no mask, another size, unreadable, SIGBUS not in it).
fn without_sigbus(mask_at: u64, size: u64) -> Option<u64> {
    if mask_at == 0 || size != KERNEL_SIGSET_BYTES {
        return None;
    }
    let set = read_user::<u64>(&mut crate::pin::Pin::none(), mask_at)?;
    (set & SIGBUS_BIT != 0).then_some(set & !SIGBUS_BIT)
}
