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
