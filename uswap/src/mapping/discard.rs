//! Dropping engine-owned pages in batches: one TLB flush for a batch of ranges instead of
//! one per range (`process_madvise` on the process itself), as the kernel's reclaim flushes
//! once per batch (`try_to_unmap_flush`). Allocation-free, async-signal-safe.

use std::io;

/// Ranges of engine-owned mappings to drop (`MADV_DONTNEED`) together.
///
/// Why: each `madvise` that drops a page of this process flushes the TLB of every other CPU
/// running one of its threads (an IPI each). Staging pages leave the swap cache one run of
/// consecutive slots at a time, and under random access a run is mostly one page long, so
/// dropping them one call per run cost about one shootdown per major fault with two
/// application threads. `process_madvise(PIDFD_SELF_THREAD, …)` drops a whole batch with
/// one flush (Linux 6.13 allows any advice on the caller's own process; 6.15 added the
/// sentinel, which names the caller's own memory even in a fork child). Where the kernel
/// refuses it, the ranges are dropped one `madvise` each, as before.
///
/// The batch must be flushed before the pages it names may be reused (the caller's rule,
/// as for `discard`); dropping it flushes what is left. Allocation-free: a fixed array on
/// the caller's stack, usable in a SIGBUS handler.
pub struct DiscardBatch<const N: usize> {
    ranges: arrayvec::ArrayVec<(*mut libc::c_void, usize), N>,
}

/// `PIDFD_SELF_THREAD` (include/uapi/linux/pidfd.h): the calling thread, whose memory is
/// the process's.
const PIDFD_SELF_THREAD: libc::c_int = -10000;

/// Whether `process_madvise` on ourselves works here: 0 not tried yet, 1 yes, 2 no.
pub(super) static PROCESS_MADVISE_SELF: std::sync::atomic::AtomicU8 = std::sync::atomic::AtomicU8::new(0);

impl<const N: usize> Default for DiscardBatch<N> {
    fn default() -> Self {
        Self::new()
    }
}

impl<const N: usize> DiscardBatch<N> {
    pub const fn new() -> Self {
        DiscardBatch { ranges: arrayvec::ArrayVec::new_const() }
    }

    /// Adds `[addr, addr + len)` (a range of an engine-owned mapping the caller checked),
    /// flushing the batch first if it is full.
    pub(super) fn add(&mut self, addr: *mut libc::c_void, len: usize) {
        if self.ranges.is_full() {
            self.flush();
        }
        self.ranges.push((addr, len));
    }

    /// Drops every range added so far (one TLB flush where the kernel allows it).
    pub fn flush(&mut self) {
        use std::sync::atomic::Ordering;
        if self.ranges.is_empty() {
            return;
        }
        let total: usize = self.ranges.iter().map(|r| r.1).sum();
        if self.ranges.len() > 1 && PROCESS_MADVISE_SELF.load(Ordering::Relaxed) != 2 {
            let mut iov = [libc::iovec { iov_base: std::ptr::null_mut(), iov_len: 0 }; N];
            for (v, &(base, len)) in iov.iter_mut().zip(&self.ranges) {
                *v = libc::iovec { iov_base: base, iov_len: len };
            }
            // SAFETY: every range lies inside a mapping the engine owns (`discard_later`
            // checked it) and names pages the caller owns and may drop, as for `discard`;
            // `iov` holds `ranges.len()` valid entries. The kernel reads the array only.
            let r = unsafe {
                libc::syscall(
                    libc::SYS_process_madvise,
                    PIDFD_SELF_THREAD,
                    iov.as_ptr(),
                    self.ranges.len(),
                    libc::MADV_DONTNEED,
                    0,
                )
            };
            if r >= 0 && r as usize == total {
                PROCESS_MADVISE_SELF.store(1, Ordering::Relaxed);
                self.ranges.clear();
                return;
            }
            let refused = r < 0
                && matches!(
                    io::Error::last_os_error().raw_os_error(),
                    Some(libc::EBADF | libc::EINVAL | libc::ENOSYS | libc::EPERM | libc::ESRCH)
                );
            if refused && PROCESS_MADVISE_SELF.load(Ordering::Relaxed) == 0 {
                // Refused by an older kernel (no sentinel, or no MADV_DONTNEED there): never
                // tried again. A partial drop or another failure falls back for this batch
                // only; dropping a range twice is harmless.
                PROCESS_MADVISE_SELF.store(2, Ordering::Relaxed);
            }
        }
        for &(base, len) in &self.ranges {
            // SAFETY: as above; one range per call.
            unsafe { libc::madvise(base, len, libc::MADV_DONTNEED) };
        }
        self.ranges.clear();
    }
}

impl<const N: usize> Drop for DiscardBatch<N> {
    fn drop(&mut self) {
        self.flush();
    }
}

/// Drops `ranges` of the program's registered memory (`MADV_DONTNEED`) with one
/// `process_madvise`, so one TLB flush: reclaim's clean victims, whose slots hold them, on a
/// regions' descriptor that asks for no `REMOVE` events (the kernel would otherwise send one
/// per range and wait for each to be read). Made directly, never through the system-call
/// guard, which would take it for the program's own discard. Returns how many of the ranges,
/// from the first, were dropped whole; `None` where the kernel cannot do it in one call
/// (before Linux 6.15: the caller moves the pages out as before). Async-signal-safe.
pub fn drop_in_place(ranges: &[(usize, usize)]) -> Option<usize> {
    use std::sync::atomic::Ordering;
    const MAX_RANGES: usize = 64;
    assert!(ranges.len() <= MAX_RANGES, "uswap invariant: {} ranges in one drop", ranges.len());
    if ranges.is_empty() {
        return Some(0);
    }
    if PROCESS_MADVISE_SELF.load(Ordering::Relaxed) == 2 {
        return None;
    }
    let mut iov = [libc::iovec { iov_base: std::ptr::null_mut(), iov_len: 0 }; MAX_RANGES];
    for (v, &(addr, len)) in iov.iter_mut().zip(ranges) {
        *v = libc::iovec { iov_base: addr as *mut libc::c_void, iov_len: len };
    }
    let args = [PIDFD_SELF_THREAD as u64, iov.as_ptr() as u64, ranges.len() as u64, libc::MADV_DONTNEED as u64, 0, 0];
    // SAFETY: the ranges are pages of registered regions the caller owns (their busy bits)
    // and may drop: their contents are in their slots. The kernel reads `iov` only.
    let r = unsafe { syscall6(libc::SYS_process_madvise, args) };
    if r < 0 {
        // Refused the first time (an older kernel): never tried again. Later failures (a
        // range unmapped meanwhile) fall back for this round only.
        let refused = matches!(-r as i32, libc::EBADF | libc::EINVAL | libc::ENOSYS | libc::EPERM | libc::ESRCH);
        if refused && PROCESS_MADVISE_SELF.load(Ordering::Relaxed) == 0 {
            PROCESS_MADVISE_SELF.store(2, Ordering::Relaxed);
            return None;
        }
        return Some(0);
    }
    PROCESS_MADVISE_SELF.store(1, Ordering::Relaxed);
    // The kernel counts whole ranges, in order.
    let mut left_bytes = r as usize;
    Some(
        ranges
            .iter()
            .take_while(|&&(_, len)| {
                len <= left_bytes && {
                    left_bytes -= len;
                    true
                }
            })
            .count(),
    )
}

/// Makes system call `nr` with `args` directly: not through the C library, whose calls the
/// system-call guard may route (`crate::syscall_guard`). Returns the kernel's result
/// (`-errno` on failure).
///
/// # Safety
/// What the call does to memory is the caller's contract, as for the call itself.
pub unsafe fn syscall6(nr: libc::c_long, args: [u64; 6]) -> libc::c_long {
    let ret: libc::c_long;
    // SAFETY: the caller's contract; `syscall` changes only rax, rcx and r11.
    unsafe {
        std::arch::asm!(
            "syscall",
            inlateout("rax") nr => ret,
            in("rdi") args[0], in("rsi") args[1], in("rdx") args[2], in("r10") args[3], in("r8") args[4], in("r9") args[5],
            lateout("rcx") _, lateout("r11") _,
            options(nostack),
        );
    }
    ret
}
