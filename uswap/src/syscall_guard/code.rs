//! The C library's code as the rewrite sees it, and the few ways it is written: its
//! executable segments, the jump that replaces a window, the layout of a trampoline slot and
//! of its dispatch, and the one write into code that is executable and read-only. Shared by
//! the rewrite ([`super::patch`]) and the image it keeps for the tree ([`super::image`]).

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
