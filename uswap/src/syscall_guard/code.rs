//! The C library's code as the rewrite sees it, and the few ways it is written: its
//! executable segments, the jump that replaces a window, the layout of a trampoline slot and
//! of its dispatch, the one write into code that is executable and read-only, and the check
//! that nothing on this thread will resume inside a window the write replaces. Shared by the
//! rewrite ([`super::patch`]) and the image it keeps for the tree ([`super::image`]).

use std::ffi::c_void;

use super::sys::sys_mprotect;

/// The bytes of a `jmp rel32`.
pub(super) const JMP_BYTES: usize = 5;
/// Room for one trampoline: the displaced instructions (up to 2 × 3 × 15 bytes, re-encoded
/// longer at worst), the dispatch and the jump back.
pub(super) const TRAMPOLINE_BYTES: usize = 192;
/// Where a dispatch's two absolute addresses lie, from its first byte (`dispatch_bytes` in
/// [`super::patch`]): the class table's, and the slow entry's.
pub(super) const CLASS_TABLE_AT: usize = 5;
pub(super) const SLOW_ENTRY_AT: usize = 27;

/// How far (bytes) from the code trampolines may be: a `jmp rel32` reaches ±2 GiB.
pub(super) const REACH_BYTES: usize = 1 << 30;

/// One executable segment of a loaded object: `[start, start + len)`, loaded at `base`
/// from the file `path`.
#[derive(Clone)]
pub(super) struct Segment {
    pub(super) start: usize,
    pub(super) len: usize,
    pub(super) base: usize,
    pub(super) path: std::path::PathBuf,
}

/// The bytes that replace a window of `len` bytes at `from`: a `jmp rel32` to `to`, then
/// `int3`s, so that a jump into the rest of the window (one the scan could not see) stops the
/// program rather than run something else.
pub(super) fn jump(from: usize, to: usize, len: usize) -> Vec<u8> {
    debug_assert!(len >= JMP_BYTES);
    let rel = (to as i64 - (from as i64 + JMP_BYTES as i64)) as i32;
    let mut bytes = vec![0xcc; len];
    bytes[0] = 0xe9;
    bytes[1..JMP_BYTES].copy_from_slice(&rel.to_le_bytes());
    bytes
}

/// Writes each `(at, bytes)` of `writes` in code that is executable and read-only: the pages
/// from the first to the last write are made writable for the moment (and executable all
/// along: this very code may live on the same pages), with one `mprotect` each way. (One
/// pair per window split and merged the mapping some 500 times per process start.)
///
/// # Safety
/// No other thread runs; every range is code whose old bytes nothing executes until the
/// writes are done.
pub(super) unsafe fn write_code(writes: &[(usize, Vec<u8>)]) -> Result<(), String> {
    let page = crate::uffd::PAGE_SIZE;
    let (Some(lo), Some(hi)) =
        (writes.iter().map(|(at, _)| *at).min(), writes.iter().map(|(at, b)| at + b.len()).max())
    else {
        return Ok(());
    };
    let first = lo & !(page - 1);
    let len = hi.next_multiple_of(page) - first;
    let rwx = libc::PROT_READ | libc::PROT_WRITE | libc::PROT_EXEC;
    if sys_mprotect(first as *mut c_void, len, rwx) != 0 {
        return Err(format!("cannot make the C library's code writable: {}", std::io::Error::last_os_error()));
    }
    for (at, bytes) in writes {
        // SAFETY: the range is mapped and now writable (above); the caller's contract says
        // nothing runs it meanwhile.
        unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), *at as *mut u8, bytes.len()) };
    }
    if sys_mprotect(first as *mut c_void, len, libc::PROT_READ | libc::PROT_EXEC) != 0 {
        return Err(format!("cannot make the C library's code read-only again: {}", std::io::Error::last_os_error()));
    }
    Ok(())
}

/// The most words of the calling thread's stack [`resume_points`] reads (64 MiB): a larger
/// run of memory around the stack pointer (a coroutine's stack inside a heap) cannot be
/// told apart from a stack, and is not read.
const MAX_STACK_WORDS: usize = 8 << 20;

/// The words on the calling thread's stack, from `from` (its stack pointer if none, or if
/// `from` is not above it on the same stack) up to the stack's top, that point into `[lo,
/// hi)` (the code about to be rewritten), sorted; or, as `Err`, the stack pointer of a stack
/// whose extent cannot be told ([`stack_end`]).
///
/// `from` is where the caller's own frames end (the program's stack pointer when it called
/// into the caller's library): below it, the slots those frames never wrote may still hold
/// what a returned signal handler's frame left, and reading them would refuse the rewrite
/// for nothing.
///
/// Such a word may be where this thread resumes once the code is rewritten: the program
/// counter a signal frame saved when the kernel interrupted the C library (a handler
/// running now, on this stack, that interrupted a `read` goes back right after its
/// `syscall`, or to the `syscall` itself to restart it), found at its place in the signal
/// frame ([`SIGFRAME_RIP_WORDS`]). Only those inside a window past its first byte matter
/// ([`inside_window`]). Not seen: a handler on an
/// alternate signal stack (the caller must not rewrite on one: `uswap run`'s library puts
/// its pager's start off there), and contexts a program saved on other stacks (a green
/// thread switched away from inside a handler).
pub(super) fn resume_points(lo: usize, hi: usize, from: Option<usize>) -> Result<Vec<usize>, usize> {
    let here = 0usize;
    let here = std::ptr::addr_of!(here) as usize & !7;
    let end = stack_end(here).ok_or(here)?;
    let sp = from.filter(|&f| (here..end).contains(&f)).map_or(here, |f| f & !7);
    let nr_words = (end - sp) / 8;
    // SAFETY: `[sp, end)` is readable memory this thread's stack pointer lies in
    // (`stack_end`), 8-aligned; read, never written.
    let word = |i: usize| unsafe { std::ptr::read_volatile((sp + 8 * i) as *const usize) };
    let restorers = super::sys::sys_signal_restorers();
    let mut points: Vec<usize> = (SIGFRAME_RIP_WORDS..nr_words)
        .filter(|&i| (lo..hi).contains(&word(i)) && restorers.contains(&word(i - SIGFRAME_RIP_WORDS)))
        .map(word)
        .collect();
    points.sort_unstable();
    Ok(points)
}

/// Where an interrupted context's instruction pointer lies in the signal frame the kernel
/// pushes (x86-64 `struct rt_sigframe`: the return address into the handler's restorer,
/// then the `ucontext`, whose `uc_mcontext.rip` is 168 bytes in), in words from the frame's
/// start. Only a word with a handler's restorer this far below it is a resume point: others
/// in range are stale (a register spilled after a `syscall`, which leaves the address past
/// it in `rcx`, made the rewrite refuse a Python process's pager in one `.ci/run`).
const SIGFRAME_RIP_WORDS: usize = 22;

/// The first of `points` (sorted) inside a window `(start, len)` past its first byte: the
/// window's jump would send the thread into the middle of an instruction (`int3`s or the
/// jump's own bytes). A window's first byte is safe: the jump starts there. Return addresses
/// never lie inside a window (a window holds no `call`), so a hit is an interrupted context,
/// or a stale word in a live frame; both make the rewrite wait.
pub(super) fn inside_window(points: &[usize], windows: impl Iterator<Item = (usize, usize)>) -> Option<usize> {
    windows.into_iter().find_map(|(start, len)| {
        let i = points.partition_point(|&p| p <= start);
        points.get(i).copied().filter(|&p| p < start + len)
    })
}

/// The top of the stack `sp` lies in: the end of the run of readable mappings, each
/// starting where the one before ends, from the one holding `sp` (a stack that part of was
/// locked or advised is several mappings; the guard page of the next thread's stack, or a
/// gap, ends it). None if `/proc/self/maps` cannot be read, holds no such mapping, or the run
/// is more than [`MAX_STACK_WORDS`] above `sp`.
fn stack_end(sp: usize) -> Option<usize> {
    let mut end: Option<usize> = None;
    for m in crate::mapping::self_maps()? {
        match end {
            None if (m.start..m.end).contains(&sp) && m.readable => end = Some(m.end),
            Some(e) if m.start == e && m.readable => end = Some(m.end),
            Some(_) => break,
            None => {}
        }
    }
    end.filter(|&e| (e - sp) / 8 <= MAX_STACK_WORDS)
}
