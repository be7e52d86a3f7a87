//! The program's `mremap`, interposed ([`mremap`]): managed memory is resized or moved by
//! the library. A shrink unmaps the tail through `crate::munmap`; a grow in place maps the
//! tail through `crate::mmap`'s rules (`MAP_FIXED_NOREPLACE`); a move maps the new place so,
//! copies, and unmaps the old place (or, with `MREMAP_DONTUNMAP`, empties it). Everything
//! else goes to the kernel.
//!
//! Locking: none of its own; the table of managed mappings is `crate::mmap`'s. Above both
//! `crate::mmap` and `crate::munmap` in the preload's import graph.

use std::ffi::c_void;
use std::ops::ControlFlow;

use crate::mmap::{config, map, overlaps_managed, page_round_up, user_space_top, Config};
use crate::munmap::unmap;
use crate::own_code::{in_uswap, Guard};
use crate::real::{self, errno, set_errno};

/// Whether the kernel's first checks of `mremap` pass its new length (and address, when
/// one is given): more than nothing once rounded up to pages, and below the top of user
/// space (`check_mremap_params`). A call they refuse (`EINVAL`) changes nothing; moved by
/// uswap, `mremap(p, 1 << 62, 1 << 62, MREMAP_MAYMOVE)` succeeded. Allocation-free.
fn mremap_lengths_accepted(new_len: usize, flags: i32, new_addr: usize) -> bool {
    let top = user_space_top();
    let new_addr = if flags & (libc::MREMAP_FIXED | libc::MREMAP_DONTUNMAP) != 0 { new_addr } else { 0 };
    page_round_up(new_len).is_some_and(|len| len > 0 && len <= top && new_addr <= top - len)
}

/// `mremap(old, old_len, new_len, flags, ...)`. The fifth argument is variadic in C; on the
/// x86-64 and AArch64 Linux ABIs a variadic pointer argument travels in the same register as
/// a fixed one, so declaring it fixed reads the caller's value when it passed one
/// (`MREMAP_FIXED`/`MREMAP_DONTUNMAP`) and is ignored otherwise.
///
/// On managed memory the move is done here, as the kernel would do it, in managed memory:
/// the new place is mapped through [`map`] (a new region, or pages of the region it lands
/// in: `MREMAP_FIXED` onto a reservation), the contents are copied (each page comes in
/// through the engine and goes out again under the limit), and the old range is unmapped
/// or, with `MREMAP_DONTUNMAP`, emptied (it reads zero). The kernel's own `mremap` of part
/// of a region would leave the moved part unmanaged (see `uswap/src/events.rs`).
#[no_mangle]
pub extern "C" fn mremap(
    old: *mut c_void,
    old_len: usize,
    new_len: usize,
    flags: i32,
    new_addr: *mut c_void,
) -> *mut c_void {
    if in_uswap() || uswap::is_engine_thread() || !mremap_lengths_accepted(new_len, flags, new_addr as usize) {
        return real::sys_mremap(old, old_len, new_len, flags, new_addr);
    }
    let onto = match flags & libc::MREMAP_FIXED {
        0 => true,
        _ => crate::waiting_charge::start_if_deferred(new_addr as usize, new_len),
    };
    if !crate::waiting_charge::start_if_deferred(old as usize, old_len) || !onto {
        // The start was put off: moved or resized as the kernel's; what it touched of the
        // deferred mappings is no longer noted, and stays ordinary memory.
        return real::sys_mremap(old, old_len, new_len, flags, new_addr);
    }
    let Some(cfg) = config() else {
        return real::sys_mremap(old, old_len, new_len, flags, new_addr);
    };
    let _g = Guard::enter();
    let start = old as usize;
    let (Some(old_len_r), Some(new_len_r)) = (page_round_up(old_len), page_round_up(new_len)) else {
        return real::sys_mremap(old, old_len, new_len, flags, new_addr);
    };
    let Some(end) = start.checked_add(old_len_r).filter(|&end| end <= user_space_top()) else {
        // An old range past the top of user space: the kernel refuses the unmap of its
        // tail or its move (`EINVAL`), and nothing changes.
        return real::sys_mremap(old, old_len, new_len, flags, new_addr);
    };
    if start % uswap::PAGE_SIZE != 0 || old_len == 0 || !overlaps_managed(start, end) {
        return real::sys_mremap(old, old_len, new_len, flags, new_addr);
    }
    match remap_managed(&cfg, start, old_len_r, new_len_r, flags, new_addr as usize) {
        Ok(p) => p as *mut c_void,
        Err(errno) => {
            set_errno(errno);
            libc::MAP_FAILED
        }
    }
}

/// [`mremap`] of managed memory: `Ok(new address)` or `Err(errno)`, with the kernel's
/// checks and errors.
fn remap_managed(
    cfg: &Config,
    start: usize,
    old_len: usize,
    new_len: usize,
    flags: i32,
    dst: usize,
) -> Result<usize, i32> {
    let known = libc::MREMAP_MAYMOVE | libc::MREMAP_FIXED | libc::MREMAP_DONTUNMAP;
    let may_move = flags & libc::MREMAP_MAYMOVE != 0;
    let fixed = flags & libc::MREMAP_FIXED != 0;
    let dont_unmap = flags & libc::MREMAP_DONTUNMAP != 0;
    if flags & !known != 0 || new_len == 0 || ((fixed || dont_unmap) && !may_move) || (dont_unmap && new_len != old_len)
    {
        return Err(libc::EINVAL);
    }
    if fixed && (dst % uswap::PAGE_SIZE != 0 || (dst < start + old_len && start < dst.saturating_add(new_len))) {
        return Err(libc::EINVAL);
    }
    if !fixed && !dont_unmap && new_len <= old_len {
        // Shrink in place: the tail goes (the engine handles the UNMAP event).
        if new_len < old_len && unmap((start + new_len) as *mut c_void, old_len - new_len) != 0 {
            return Err(errno());
        }
        return Ok(start);
    }
    // What the kernel checks first: the old range is mapped whole (`EFAULT` otherwise), and
    // what it keeps: each part's protection (a `PROT_NONE` reservation stays one).
    let pieces = protections(start, start + old_len)?;
    if !may_move {
        // Grow in place where the address space after it is free, as the kernel would.
        let tail = (start + old_len) as *mut c_void;
        let flags = libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_FIXED_NOREPLACE;
        let p = map(cfg, tail, new_len - old_len, libc::PROT_READ | libc::PROT_WRITE, flags, -1, 0);
        if p == libc::MAP_FAILED || p != tail {
            if p != libc::MAP_FAILED {
                // An old kernel took the address as a hint only.
                unmap(p, new_len - old_len);
            }
            return Err(libc::ENOMEM);
        }
        protect_as(&pieces, start, start, start + new_len);
        return Ok(start);
    }
    let (hint, map_flags) = if fixed {
        (dst as *mut c_void, libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_FIXED)
    } else {
        (std::ptr::null_mut(), libc::MAP_PRIVATE | libc::MAP_ANONYMOUS)
    };
    let new = map(cfg, hint, new_len, libc::PROT_READ | libc::PROT_WRITE, map_flags, -1, 0);
    if new == libc::MAP_FAILED {
        return Err(errno());
    }
    // Parts the program cannot read are read through a readable view for the copy.
    let copy_len = old_len.min(new_len);
    for &(s, e, prot) in pieces.iter().filter(|p| p.2 & libc::PROT_READ == 0) {
        real::sys_mprotect(s as *mut c_void, e - s, prot | libc::PROT_READ);
    }
    // Locked before the copy: the pages it writes stay in, as the kernel's move keeps them
    // (copied unlocked under a limit the locked old range filled, each went out again at
    // once: 16 MiB took 13 s).
    carry_lock(start, new as usize, new_len);
    copy_pages(start, new as usize, copy_len);
    protect_as(&pieces, start, new as usize, new as usize + new_len);
    carry_advice(start, old_len.min(new_len), new as usize);
    if dont_unmap {
        // The old range stays mapped and reads zero, as after the kernel's DONTUNMAP.
        for &(s, e, prot) in pieces.iter().filter(|p| p.2 & libc::PROT_READ == 0) {
            real::sys_mprotect(s as *mut c_void, e - s, prot);
        }
        real::sys_madvise(start as *mut c_void, old_len, libc::MADV_DONTNEED);
    } else {
        unmap(start as *mut c_void, old_len);
    }
    Ok(new as usize)
}

/// What the kernel's move keeps and a fresh mapping lacks, first the program's lock
/// (`mlock`: moved unlocked, its pages went out to the devices, and `smaps` said `Locked:
/// 0`). A lock held at the old range's first page holds for the whole new range; the
/// kernel's is taken on fault (`MLOCK_ONFAULT`), so that it brings nothing in itself.
fn carry_lock(old: usize, new: usize, new_len: usize) {
    let kind = uswap::mlock::LockKind::Program;
    if uswap::mlock::covered_by(kind, old) && crate::mlock::lock_if_managed(kind, new, new + new_len) {
        const MLOCK_ONFAULT: usize = 1;
        // SAFETY: mlock2 takes an address range and flags by value; the range is ours.
        unsafe { libc::syscall(libc::SYS_mlock2, new, new_len, MLOCK_ONFAULT) };
    }
}

/// ...then its fork advice (`MADV_DONTFORK`, `MADV_WIPEONFORK`: a fork child read the moved
/// memory it was not to see), on the `len` bytes moved.
fn carry_advice(old: usize, len: usize, new: usize) {
    for (s, e, advice) in uswap::fork_advice_in(old, old + len) {
        let (to, len) = (new + (s - old), e - s);
        if real::sys_madvise(to as *mut c_void, len, advice) == 0 {
            uswap::note_madvise(to, len, advice);
        }
    }
}

/// Copies `len` bytes (whole pages) from `from` to the fresh mapping at `to`, but for the
/// pages that read zero: those are left to read zero in place. A reservation moved (a
/// `PROT_NONE` range the program never touched) would otherwise be brought in whole at its
/// new place, where reclaim cannot move pages out of it.
fn copy_pages(from: usize, to: usize, len: usize) {
    const WORDS: usize = uswap::PAGE_SIZE / 8;
    for offset in (0..len).step_by(uswap::PAGE_SIZE) {
        // SAFETY: `[from, from + len)` is mapped whole and readable (`protections` found no
        // hole, and the caller made every part readable), and `[to, to + len)` is a fresh
        // writable mapping that does not overlap it (checked for MREMAP_FIXED; a fresh
        // mapping otherwise); both are page-aligned, so each page is whole `u64`s. Reading
        // old pages faults them in through the engine; writing new ones faults them in.
        unsafe {
            let src = std::slice::from_raw_parts((from + offset) as *const u64, WORDS);
            if src.iter().any(|&w| w != 0) {
                std::ptr::copy_nonoverlapping(src.as_ptr(), (to + offset) as *mut u64, WORDS);
            }
        }
    }
}

/// The protection of each mapping in `[start, end)`, in order, from `/proc/self/maps`:
/// `Err(EFAULT)` where part of it is not mapped, as the kernel's `mremap` says. Before, a
/// move copied from the old range without looking: a `PROT_NONE` reservation, or a range
/// with a hole, killed the program with SIGSEGV inside uswap.
fn protections(start: usize, end: usize) -> Result<Vec<(usize, usize, i32)>, i32> {
    let mut pieces: Vec<(usize, usize, i32)> = Vec::new();
    let (mut covered, mut found) = (start, Err(libc::EFAULT));
    // A buffer at a time, and the list grown fallibly: `ENOMEM` where memory cannot be had
    // (a process at the system's limit of mappings), not an abort.
    let read = uswap::for_each_maps_line::<{ uswap::MAPS_LINE_BYTES }>(|line| {
        let Some(h) = crate::unmanaged::parse_header(uswap::maps_text(line)) else { return ControlFlow::Continue(()) };
        let (s, e) = (h.start, h.end);
        if e <= covered || s >= end {
            return ControlFlow::Continue(());
        }
        if s > covered {
            // A hole: `found` stays EFAULT.
            return ControlFlow::Break(());
        }
        if pieces.try_reserve(1).is_err() {
            found = Err(libc::ENOMEM);
            return ControlFlow::Break(());
        }
        let bits = h.perms.as_bytes();
        let prot = [(b'r', libc::PROT_READ), (b'w', libc::PROT_WRITE), (b'x', libc::PROT_EXEC)]
            .iter()
            .zip(bits)
            .filter(|((letter, _), b)| *b == letter)
            .fold(libc::PROT_NONE, |prot, ((_, bit), _)| prot | bit);
        pieces.push((covered, e.min(end), prot));
        covered = e.min(end);
        if covered < end {
            return ControlFlow::Continue(());
        }
        found = Ok(());
        ControlFlow::Break(())
    });
    match read {
        true => found.map(|()| pieces),
        false => Err(libc::ENOMEM),
    }
}

/// Gives `[to, to_end)` the protection of `pieces` (parts of the old range at `from`), the
/// part past them that of the last: as the kernel's move or growth keeps the mapping's
/// protection. Read-write parts are as mapped already.
fn protect_as(pieces: &[(usize, usize, i32)], from: usize, to: usize, to_end: usize) {
    let rw = libc::PROT_READ | libc::PROT_WRITE;
    for (i, &(s, e, prot)) in pieces.iter().enumerate() {
        let e = if i + 1 == pieces.len() { to_end - to + from } else { e };
        let (dst, dst_end) = (to + (s - from), (to + (e - from)).min(to_end));
        if prot != rw && dst < dst_end {
            real::sys_mprotect(dst as *mut c_void, dst_end - dst, prot);
        }
    }
}
