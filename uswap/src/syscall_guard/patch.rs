//! Rewriting the C library's `syscall` instructions so that each one goes through
//! [`super::entry`] first (the approach of syscall_intercept, which ExtMem builds on).
//!
//! For every `syscall` instruction in the C library's code, a *window* of whole instructions
//! around it, at least the 5 bytes of a `jmp rel32`, is replaced by a jump to a trampoline of
//! its own, mapped within ±2 GiB of the library. The trampoline runs the window's other
//! instructions, relocated (iced-x86's block encoder fixes RIP-relative operands and
//! branches), and in place of the `syscall` a short dispatch:
//!
//! ```text
//!     movzwl %ax, %ecx              ; the system call's number (rcx and r11 are the
//!     movabs $CLASS, %r11           ;   instruction's own scratch registers)
//!     movzbl (%r11,%rcx), %ecx      ; does it take memory the kernel will touch?
//!     jrcxz  plain                  ; no flags read or written on the way
//!     lea    -128(%rsp), %rsp       ; yes: below the red zone, call the slow path, which
//!     movabs $SLOW, %rcx            ;   saves every other register, makes the memory
//!     call   *%rcx                  ;   ready, and makes the call
//!     lea    128(%rsp), %rsp
//!     jmp    after
//! plain:
//!     syscall                       ; no stack touched: clone, vfork and rt_sigreturn
//! after:                            ;   behave as in place
//! ```
//!
//! A window never contains a branch target other than its first byte (targets of every
//! direct branch and call in the code are collected first); its instructions before the
//! `syscall` are plain ones, and only its last may be a branch or a return. The bytes of a
//! window after the jump are `int3`, so a jump into them that the scan could not see (an
//! indirect one) stops the program rather than run something else.
//!
//! The patch is made once, while the process has one thread; the code pages are made
//! writable for the moment it takes and executable again after. It is made only if nothing
//! on that thread's stack points inside a window past its first byte (`code::resume_points`):
//! a signal handler running now that interrupted a `read` would return into the middle of
//! the jump. So it can be made when a pager starts (in `uswap run`, when a process first
//! needs one), not only before `main`.
//!
//! Finding the windows decodes the whole library (about 10 ms, most of what signal mode
//! added to a process's start). Under `uswap run` the first process of the tree writes the
//! windows it chose to the run's directory ([`WindowCache`]), keyed by the library file's
//! identity, and the others read them: each cached window is decoded again and must hold
//! exactly one `syscall`, or the cache is ignored and the library scanned. Quicker still, the
//! trampolines themselves are kept ([`super::image`]) and copied by the next process that can
//! place them at the same distance from the code, after a byte-for-byte check of the code.

use std::ffi::{c_void, CStr};

use iced_x86::{
    BlockEncoder, BlockEncoderOptions, Code, Decoder, DecoderOptions, FlowControl, Instruction, InstructionBlock,
};

use super::code::{
    inside_window, jump, resume_points, write_code, Segment, CLASS_TABLE_AT, JMP_BYTES, REACH_BYTES, SLOW_ENTRY_AT,
    TRAMPOLINE_BYTES,
};
use super::image::{Built, ImageCache, PlacedWindow};
use super::sys::{sys_block_async_signals, sys_mmap, sys_mprotect, sys_munmap, sys_set_mask};
use super::PatchError;

/// The most instructions a window takes on either side of its `syscall`.
const MAX_SIDE_INSTRUCTIONS: usize = 3;

/// What the patch did.
#[derive(Debug, Default, Clone, Copy)]
pub struct PatchReport {
    /// `syscall` instructions found in the library's code.
    pub sites: usize,
    /// Of those, the ones now going through the dispatch.
    pub patched: usize,
}

/// The executable segments of the loaded object whose file name ends with `name`.
fn executable_segments(name: &[u8]) -> Vec<Segment> {
    struct Search<'a> {
        name: &'a [u8],
        found: Vec<Segment>,
    }
    extern "C" fn visit(info: *mut libc::dl_phdr_info, _size: usize, data: *mut c_void) -> libc::c_int {
        // SAFETY: dl_iterate_phdr passes a valid info for the call, and `data` is the
        // `Search` handed to it below.
        let (info, search) = unsafe { (&*info, &mut *(data as *mut Search)) };
        if info.dlpi_name.is_null() {
            return 0;
        }
        // SAFETY: a NUL-terminated name owned by the dynamic linker.
        let path = unsafe { CStr::from_ptr(info.dlpi_name) }.to_bytes();
        if !path.ends_with(search.name) {
            return 0;
        }
        for i in 0..info.dlpi_phnum as usize {
            // SAFETY: `dlpi_phdr` has `dlpi_phnum` entries.
            let ph = unsafe { &*info.dlpi_phdr.add(i) };
            if ph.p_type == libc::PT_LOAD && ph.p_flags & libc::PF_X != 0 {
                let base = info.dlpi_addr as usize;
                let start = base + ph.p_vaddr as usize;
                let path =
                    std::path::PathBuf::from(<std::ffi::OsStr as std::os::unix::ffi::OsStrExt>::from_bytes(path));
                search.found.push(Segment { start, len: ph.p_memsz as usize, base, path });
            }
        }
        1
    }
    let mut search = Search { name, found: Vec::new() };
    // SAFETY: `visit` matches the callback type and only reads what it is given.
    unsafe { libc::dl_iterate_phdr(Some(visit), &mut search as *mut Search as *mut c_void) };
    search.found
}

/// A `syscall` instruction and the plain instructions just before it.
struct Site {
    /// Up to [`MAX_SIDE_INSTRUCTIONS`] instructions before the `syscall`, oldest first.
    before: Vec<Instruction>,
    syscall: Instruction,
}

/// One linear pass over `seg`: every branch target and every `syscall` site.
fn scan(seg: &Segment) -> (Vec<u64>, Vec<Site>) {
    // SAFETY: an executable segment of a loaded object: mapped and readable for its length.
    let code = unsafe { std::slice::from_raw_parts(seg.start as *const u8, seg.len) };
    let mut decoder = Decoder::with_ip(64, code, seg.start as u64, DecoderOptions::NONE);
    let mut targets = Vec::new();
    let mut sites = Vec::new();
    let mut recent: Vec<Instruction> = Vec::with_capacity(MAX_SIDE_INSTRUCTIONS + 1);
    let mut ins = Instruction::default();
    while decoder.can_decode() {
        decoder.decode_out(&mut ins);
        if matches!(
            ins.flow_control(),
            FlowControl::UnconditionalBranch | FlowControl::ConditionalBranch | FlowControl::Call
        ) && ins.near_branch_target() != 0
        {
            targets.push(ins.near_branch_target());
        }
        if ins.code() == Code::Syscall {
            sites.push(Site { before: recent.clone(), syscall: ins });
            recent.clear();
            continue;
        }
        if ins.flow_control() != FlowControl::Next || ins.is_invalid() {
            recent.clear();
            continue;
        }
        if recent.len() == MAX_SIDE_INSTRUCTIONS {
            recent.remove(0);
        }
        recent.push(ins);
    }
    targets.sort_unstable();
    targets.dedup();
    (targets, sites)
}

/// A chosen window: `before` + `syscall` + `after`, from `start` for `len` bytes.
struct Window {
    start: u64,
    len: usize,
    before: Vec<Instruction>,
    after: Vec<Instruction>,
}

/// Up to [`MAX_SIDE_INSTRUCTIONS`] instructions after `site`'s `syscall`, stopping after the
/// first that is not plain.
fn following(seg: &Segment, site: &Site) -> Vec<Instruction> {
    let from = site.syscall.next_ip() as usize;
    let end = seg.start + seg.len;
    // SAFETY: inside the segment, as `scan` read it.
    let code = unsafe { std::slice::from_raw_parts(from as *const u8, end - from) };
    let mut decoder = Decoder::with_ip(64, code, from as u64, DecoderOptions::NONE);
    let mut out = Vec::new();
    while decoder.can_decode() && out.len() < MAX_SIDE_INSTRUCTIONS {
        let ins = decoder.decode();
        if ins.is_invalid() || ins.code() == Code::Syscall || ins.flow_control() == FlowControl::Call {
            break;
        }
        let last = ins.flow_control() != FlowControl::Next;
        out.push(ins);
        if last {
            break;
        }
    }
    out
}

/// The smallest window around `site` that holds a `jmp rel32` and has no branch target
/// inside it after its first byte.
fn choose_window(seg: &Segment, site: &Site, targets: &[u64]) -> Option<Window> {
    let is_target = |ip: u64| targets.binary_search(&ip).is_ok();
    let after_all = following(seg, site);
    let mut best: Option<(usize, usize)> = None;
    for nb in 0..=site.before.len() {
        for na in 0..=after_all.len() {
            let before = &site.before[site.before.len() - nb..];
            let after = &after_all[..na];
            // Only the last instruction of the window may leave it.
            if after[..na.saturating_sub(1)].iter().any(|i| i.flow_control() != FlowControl::Next) {
                continue;
            }
            let len: usize = before.iter().map(|i| i.len()).sum::<usize>()
                + site.syscall.len()
                + after.iter().map(|i| i.len()).sum::<usize>();
            if len < JMP_BYTES {
                continue;
            }
            let inner =
                before.iter().skip(1).chain(std::iter::once(&site.syscall).skip(usize::from(nb == 0))).chain(after);
            if inner.map(|i| i.ip()).any(is_target) {
                continue;
            }
            if best.is_none_or(|(b, a)| nb + na < b + a) {
                best = Some((nb, na));
            }
        }
    }
    let (nb, na) = best?;
    let before = site.before[site.before.len() - nb..].to_vec();
    let after = after_all[..na].to_vec();
    let start = before.first().map_or(site.syscall.ip(), |i| i.ip());
    let end = after.last().map_or(site.syscall.next_ip(), |i| i.next_ip());
    Some(Window { start, len: (end - start) as usize, before, after })
}

/// Re-encodes `instrs` to run from `rip`.
fn relocate(instrs: &[Instruction], rip: u64) -> Option<Vec<u8>> {
    if instrs.is_empty() {
        return Some(Vec::new());
    }
    let block = InstructionBlock::new(instrs, rip);
    BlockEncoder::encode(64, block, BlockEncoderOptions::NONE).ok().map(|r| r.code_buffer)
}

/// The dispatch in place of the `syscall` (see the module's comment); position-independent.
fn dispatch_bytes(class_table: u64, slow_entry: u64) -> Vec<u8> {
    let mut b = Vec::with_capacity(64);
    b.extend_from_slice(&[0x0f, 0xb7, 0xc8]); // movzwl %ax,%ecx
    b.extend_from_slice(&[0x49, 0xbb]); // movabs $class_table,%r11
    b.extend_from_slice(&class_table.to_le_bytes());
    b.extend_from_slice(&[0x41, 0x0f, 0xb6, 0x0c, 0x0b]); // movzbl (%r11,%rcx,1),%ecx
    let slow: Vec<u8> = {
        let mut s = Vec::new();
        s.extend_from_slice(&[0x48, 0x8d, 0x64, 0x24, 0x80]); // lea -0x80(%rsp),%rsp
        s.extend_from_slice(&[0x48, 0xb9]); // movabs $slow_entry,%rcx
        s.extend_from_slice(&slow_entry.to_le_bytes());
        s.extend_from_slice(&[0xff, 0xd1]); // call *%rcx
        s.extend_from_slice(&[0x48, 0x8d, 0xa4, 0x24, 0x80, 0x00, 0x00, 0x00]); // lea 0x80(%rsp),%rsp
        s.extend_from_slice(&[0xeb, 0x02]); // jmp over the syscall
        s
    };
    b.push(0xe3); // jrcxz plain
    b.push(slow.len() as u8);
    b.extend_from_slice(&slow);
    b.extend_from_slice(&[0x0f, 0x05]); // plain: syscall
    debug_assert_eq!(b[CLASS_TABLE_AT..CLASS_TABLE_AT + 8], class_table.to_le_bytes());
    debug_assert_eq!(b[SLOW_ENTRY_AT..SLOW_ENTRY_AT + 8], slow_entry.to_le_bytes());
    b
}

/// A trampoline for `w`, to be placed at `at`, and where its dispatch starts in it.
fn trampoline(w: &Window, at: u64, class_table: u64, slow_entry: u64) -> Option<(Vec<u8>, usize)> {
    let mut code = relocate(&w.before, at)?;
    let dispatch_at = code.len();
    code.extend_from_slice(&dispatch_bytes(class_table, slow_entry));
    let after_at = at + code.len() as u64;
    code.extend_from_slice(&relocate(&w.after, after_at)?);
    // Back to the first byte after the window (unreached if it ended in a branch).
    let back = w.start + w.len as u64;
    let from = at + code.len() as u64 + JMP_BYTES as u64;
    let rel = i32::try_from(back as i64 - from as i64).ok()?;
    code.push(0xe9);
    code.extend_from_slice(&rel.to_le_bytes());
    (code.len() <= TRAMPOLINE_BYTES).then_some((code, dispatch_at))
}

/// Maps `len` bytes for trampolines within [`REACH_BYTES`] of `[lo, hi)`: in the free gap
/// nearest to it that `/proc/self/maps` shows (the kernel's own choice for a hint that is
/// taken is the top of the address space, out of reach).
fn map_near(lo: usize, hi: usize, len: usize) -> Option<usize> {
    let mut ranges: Vec<(usize, usize)> = crate::mapping::self_maps()?.iter().map(|m| (m.start, m.end)).collect();
    ranges.sort_unstable();
    // Candidates: just below each mapping and just above it, keeping a page free on each side.
    let page = crate::uffd::PAGE_SIZE;
    let free = |at: usize| ranges.iter().all(|&(s, e)| at + len + page <= s || e + page <= at);
    let mut candidates: Vec<usize> = ranges
        .iter()
        .flat_map(|&(s, e)| [s.checked_sub(len + page), Some(e + page)])
        .flatten()
        .filter(|&at| at >= 1 << 20 && at.abs_diff(lo).max((at + len).abs_diff(hi)) < REACH_BYTES && free(at))
        .collect();
    candidates.sort_unstable_by_key(|&at| at.abs_diff(lo));
    // Bounded by the candidates; a gap taken meanwhile (another thread: none at start-up)
    // only moves on to the next.
    for at in candidates {
        let p = sys_mmap(
            at as *mut c_void,
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_FIXED_NOREPLACE,
            -1,
            0,
        );
        if p != libc::MAP_FAILED {
            return Some(p as usize);
        }
    }
    None
}

/// The windows chosen for one segment, kept in a file for the processes that load the same
/// library file after (see the module's comment). Best effort both ways: a cache that
/// cannot be written or read only costs the next process a scan.
struct WindowCache {
    path: std::path::PathBuf,
}

/// The first line of a cache file; the number of `syscall` sites follows it.
const CACHE_MAGIC: &str = "uswap-syscall-windows-1";

impl WindowCache {
    /// The cache of `seg` in `dir`: a file named by the segment's file's device, inode, size
    /// and modification time, and the segment's place in it.
    fn for_segment(dir: &std::path::Path, seg: &Segment) -> Option<WindowCache> {
        use std::os::unix::fs::MetadataExt;
        let m = std::fs::metadata(&seg.path).ok()?;
        let name = format!(
            "libc-{:x}-{:x}-{}-{}.{}-{:x}-{:x}",
            m.dev(),
            m.ino(),
            m.size(),
            m.mtime(),
            m.mtime_nsec(),
            seg.start - seg.base,
            seg.len
        );
        Some(WindowCache { path: dir.join(name) })
    }

    /// The cached sites count and windows of `seg`, each decoded again from the code; none
    /// if there is no cache or any window does not decode to exactly one `syscall` within
    /// its bytes.
    fn load(&self, seg: &Segment) -> Option<(usize, Vec<Window>)> {
        let text = std::fs::read_to_string(&self.path).ok()?;
        let mut lines = text.lines();
        let nr_sites: usize = lines.next()?.strip_prefix(CACHE_MAGIC)?.trim().parse().ok()?;
        let mut windows = Vec::new();
        for line in lines {
            let (off, len) = line.split_once(' ')?;
            let (off, len): (usize, usize) = (off.parse().ok()?, len.parse().ok()?);
            if off.checked_add(len)? > seg.len || windows.len() >= nr_sites {
                return None;
            }
            windows.push(decode_window(seg.start + off, len)?);
        }
        Some((nr_sites, windows))
    }

    /// Writes `seg`'s windows (to a file of this process's, renamed into place whole).
    fn store(&self, seg: &Segment, nr_sites: usize, windows: &[Window]) {
        let mut text = format!("{CACHE_MAGIC} {nr_sites}\n");
        for w in windows {
            text.push_str(&format!("{} {}\n", w.start as usize - seg.start, w.len));
        }
        let tmp = self.path.with_extension(format!("tmp{}", std::process::id()));
        if std::fs::write(&tmp, text).is_err() || std::fs::rename(&tmp, &self.path).is_err() {
            let _ = std::fs::remove_file(&tmp);
        }
    }
}

/// The window of `len` bytes at `start`: its instructions before the `syscall`, the
/// `syscall`, and those after; none unless it holds exactly one `syscall`, its instructions
/// before it are plain ones, only its last may leave it, and it ends on an instruction's
/// end.
fn decode_window(start: usize, len: usize) -> Option<Window> {
    // SAFETY: inside an executable segment of a loaded object (checked by the caller).
    let code = unsafe { std::slice::from_raw_parts(start as *const u8, len) };
    let mut decoder = Decoder::with_ip(64, code, start as u64, DecoderOptions::NONE);
    let (mut before, mut after, mut syscall) = (Vec::new(), Vec::new(), None);
    while decoder.can_decode() {
        let ins = decoder.decode();
        if ins.is_invalid() || after.last().is_some_and(|i: &Instruction| i.flow_control() != FlowControl::Next) {
            return None;
        }
        match (ins.code() == Code::Syscall, syscall.is_some()) {
            (true, false) => syscall = Some(ins),
            (true, true) => return None,
            (false, false) if ins.flow_control() != FlowControl::Next => return None,
            (false, false) => before.push(ins),
            (false, true) => after.push(ins),
        }
    }
    let end = after.last().or(syscall.as_ref()).map(|i| i.next_ip())?;
    (syscall.is_some() && end == (start + len) as u64).then_some(Window { start: start as u64, len, before, after })
}

/// Sends every `syscall` instruction of the C library (`libc.so.6`) through the dispatch,
/// unless this thread's stack from `program_sp` up (see [`resume_points`]) says it would
/// resume inside a window.
///
/// # Safety
/// Called once, while the process has one thread.
pub unsafe fn patch_c_library(
    class_table: u64,
    slow_entry: u64,
    cache_dir: Option<&std::path::Path>,
    program_sp: Option<usize>,
) -> Result<PatchReport, PatchError> {
    let segments = executable_segments(b"/libc.so.6");
    if segments.is_empty() {
        return Err(PatchError::Failed("the C library (libc.so.6) is not loaded: a static program?".into()));
    }
    let lo = segments.iter().map(|s| s.start).min().unwrap_or(0);
    let hi = segments.iter().map(|s| s.start + s.len).max().unwrap_or(0);
    // Read once, before anything is written. The C library has one executable segment; a
    // second one refused after the first was patched would leave the first patched, which
    // is harmless (a patched window makes the same call) but not `started`.
    let points = resume_points(lo, hi, program_sp).map_err(|sp| PatchError::StackUnknown { sp })?;
    // The program's handlers must not run while windows are half written: the rewrite is
    // made after `main` now, when the program may have timers and handlers.
    let mask = sys_block_async_signals();
    let mut report = PatchReport::default();
    for seg in &segments {
        // SAFETY: the caller's contract; the segment is the C library's code.
        let done = unsafe { patch_segment(seg, class_table, slow_entry, cache_dir, &points) };
        let (sites, patched) = match done {
            Ok(done) => done,
            Err(e) => {
                sys_set_mask(&mask);
                return Err(e);
            }
        };
        // Both the code and its trampolines are uswap's doing: not the program's unmanaged
        // memory (`crate::unmanaged`).
        crate::mapping::note_engine_memory(seg.start, seg.len);
        report.sites += sites;
        report.patched += patched;
    }
    sys_set_mask(&mask);
    Ok(report)
}

/// Reserves the place of the trampolines of the image kept in `cache_dir` for the C
/// library, if there is one (see `ImageCache::reserve_place`).
pub(super) fn reserve_image_place(cache_dir: &std::path::Path) {
    for seg in executable_segments(b"/libc.so.6") {
        if let Some(cache) = WindowCache::for_segment(cache_dir, &seg) {
            ImageCache::beside(&cache.path).reserve_place(&seg);
        }
    }
}

/// Sends the `syscall` instructions of `seg` through the dispatch: (sites found, patched).
/// The windows come from `cache_dir`'s cache of `seg` when it has a good one, else from a
/// scan, which is then kept there. Nothing is changed if one of `points` (where this thread
/// may resume, sorted) lies inside a window past its first byte.
///
/// # Safety
/// No other thread runs; `seg` is mapped code.
unsafe fn patch_segment(
    seg: &Segment,
    class_table: u64,
    slow_entry: u64,
    cache_dir: Option<&std::path::Path>,
    points: &[usize],
) -> Result<(usize, usize), PatchError> {
    let cache = cache_dir.and_then(|dir| WindowCache::for_segment(dir, seg));
    let image = cache.as_ref().map(|c| ImageCache::beside(&c.path));
    if let Some(image) = &image {
        // SAFETY: the caller's contract.
        if let Some(done) = unsafe { image.apply(seg, class_table, slow_entry, points)? } {
            return Ok(done);
        }
        // Not applied: the place it reserved is no use to the trampolines made below.
        super::image::release_reservation();
    }
    let (nr_sites, windows) = match cache.as_ref().and_then(|c| c.load(seg)) {
        Some(found) => found,
        None => {
            let (targets, sites) = scan(seg);
            let windows: Vec<Window> = sites.iter().filter_map(|s| choose_window(seg, s, &targets)).collect();
            if let Some(c) = &cache {
                c.store(seg, sites.len(), &windows);
            }
            (sites.len(), windows)
        }
    };
    if let Some(at) = inside_window(points, windows.iter().map(|w| (w.start as usize, w.len))) {
        return Err(PatchError::Interrupted { at });
    }
    let area_len = (windows.len() * TRAMPOLINE_BYTES).next_multiple_of(crate::uffd::PAGE_SIZE);
    if area_len == 0 {
        return Ok((nr_sites, 0));
    }
    let area = map_near(seg.start, seg.start + seg.len, area_len)
        .ok_or_else(|| PatchError::Failed("no room for trampolines within 1 GiB of the code".into()))?;
    crate::mapping::note_engine_memory(area, area_len);
    let mut jumps = Vec::with_capacity(windows.len());
    let mut placed = Vec::with_capacity(windows.len());
    for (i, w) in windows.iter().enumerate() {
        let at = area + i * TRAMPOLINE_BYTES;
        let off = w.start as usize - seg.start;
        let Some((code, dispatch_at)) = trampoline(w, at as u64, class_table, slow_entry) else {
            placed.push(PlacedWindow { off, len: w.len, dispatch_at: None });
            continue;
        };
        placed.push(PlacedWindow { off, len: w.len, dispatch_at: Some(dispatch_at) });
        // SAFETY: the area is ours, mapped read-write above, TRAMPOLINE_BYTES a slot.
        unsafe { std::ptr::copy_nonoverlapping(code.as_ptr(), at as *mut u8, code.len()) };
        jumps.push((w.start as usize, jump(w.start as usize, at, w.len)));
    }
    if sys_mprotect(area as *mut c_void, area_len, libc::PROT_READ | libc::PROT_EXEC) != 0 {
        let e = std::io::Error::last_os_error();
        crate::mapping::forget_engine_memory(area);
        sys_munmap(area as *mut c_void, area_len);
        return Err(PatchError::Failed(format!("cannot make the trampolines executable: {e}")));
    }
    // Before the jumps are written: the image keeps the windows' code as it was.
    if let Some(image) = &image {
        image.store(seg, nr_sites, &placed, &Built { area, area_len, class_table, slow_entry });
    }
    // SAFETY: one thread (the caller's contract); the windows are this segment's code.
    unsafe { write_code(&jumps)? };
    if let Some(image) = &image {
        image.store_text(seg);
    }
    Ok((nr_sites, jumps.len()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::syscall_guard::sys::sys_munmap;

    use crate::syscall_guard::serialised;

    /// Maps `code` read-write-execute; returns its segment.
    /// The page lies in the middle of 64 MiB left free around it: other tests of this
    /// process reserve tens of GiB, and a page the kernel put between two of them had no
    /// room for trampolines within reach (a C library at start-up has the address space
    /// around it to itself).
    fn map_code(code: &[u8]) -> Segment {
        let len = crate::uffd::PAGE_SIZE;
        let room = 64 << 20;
        let anon = libc::MAP_PRIVATE | libc::MAP_ANONYMOUS;
        let base = sys_mmap(std::ptr::null_mut(), room, libc::PROT_NONE, anon | libc::MAP_NORESERVE, -1, 0);
        assert_ne!(base, libc::MAP_FAILED);
        let at = base as usize + room / 2;
        assert_eq!(sys_munmap(base, room / 2), 0);
        assert_eq!(sys_munmap((at + len) as *mut c_void, room / 2 - len), 0);
        let rwx = libc::PROT_READ | libc::PROT_WRITE | libc::PROT_EXEC;
        let p = sys_mmap(at as *mut c_void, len, rwx, anon | libc::MAP_FIXED, -1, 0);
        assert_eq!(p as usize, at);
        // SAFETY: a fresh private mapping of one page; `code` is smaller.
        unsafe { std::ptr::copy_nonoverlapping(code.as_ptr(), p as *mut u8, code.len()) };
        Segment { start: p as usize, len: code.len(), base: p as usize, path: "/proc/self/exe".into() }
    }

    /// `mov $39, %eax; syscall; ret` (getpid) and `mov $0, %eax; syscall; ret` (read):
    /// windows, then the patched code run, fast path and slow path.
    #[test]
    fn patched_calls_return_what_the_kernel_returns() {
        let _g = serialised();
        const GETPID: &[u8] = &[0xb8, 39, 0, 0, 0, 0x0f, 0x05, 0xc3];
        const READ: &[u8] = &[0xb8, 0, 0, 0, 0, 0x0f, 0x05, 0xc3];
        let mut code = GETPID.to_vec();
        code.extend_from_slice(READ);
        let seg = map_code(&code);
        let (targets, sites) = scan(&seg);
        assert_eq!(sites.len(), 2);
        let w = choose_window(&seg, &sites[0], &targets).expect("a window");
        assert_eq!((w.start, w.len), (seg.start as u64, 7), "mov + syscall: the smallest window");
        // SAFETY: this test's own code, run by no other thread.
        let (found, patched) = unsafe {
            patch_segment(
                &seg,
                super::super::table::CLASS.as_ptr() as u64,
                super::super::entry::slow_entry(),
                None,
                &[],
            )
        }
        .unwrap();
        assert_eq!((found, patched), (2, 2));
        // SAFETY: the bytes are code following the C calling convention (arguments unused
        // by getpid; read's are rdi, rsi, rdx as for a call).
        let getpid: extern "C" fn() -> i64 = unsafe { std::mem::transmute(seg.start) };
        // SAFETY: as above.
        let read: extern "C" fn(i32, *mut u8, usize) -> i64 = unsafe { std::mem::transmute(seg.start + GETPID.len()) };
        assert_eq!(getpid(), std::process::id() as i64);
        let f = std::fs::File::open("/dev/zero").unwrap();
        let mut buf = vec![7u8; 100];
        use std::os::fd::AsRawFd;
        assert_eq!(read(f.as_raw_fd(), buf.as_mut_ptr(), 100), 100);
        assert!(buf.iter().all(|&b| b == 0));
        assert_eq!(read(-1, buf.as_mut_ptr(), 100), -(libc::EBADF as i64));
    }

    /// The next process patches from the image the first one kept: at the same distance from
    /// the code, its calls return what the kernel returns; code that differs from what the
    /// image was made from is not patched from it.
    #[test]
    fn a_second_process_patches_from_the_image_and_its_calls_work() {
        let _g = serialised();
        const GETPID: &[u8] = &[0xb8, 39, 0, 0, 0, 0x0f, 0x05, 0xc3];
        const READ: &[u8] = &[0xb8, 0, 0, 0, 0, 0x0f, 0x05, 0xc3];
        let code = [GETPID, READ].concat();
        let (class, slow) = (super::super::table::CLASS.as_ptr() as u64, super::super::entry::slow_entry());
        let dir = std::env::temp_dir().join(format!("uswap-image-cache-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let first = map_code(&code);
        // SAFETY: this test's own code, run by no other thread.
        assert_eq!(unsafe { patch_segment(&first, class, slow, Some(&dir), &[]) }.unwrap(), (2, 2));
        // The first "process" goes: its code and trampolines are unmapped.
        let image = ImageCache::beside(&WindowCache::for_segment(&dir, &first).unwrap().path);
        let bytes = std::fs::read(&image.path).expect("the image was kept");
        let word = |i: usize| i64::from_le_bytes(bytes[16 + 8 * i..24 + 8 * i].try_into().unwrap());
        let (area, area_len) = ((first.start as i64 + word(2)) as usize, word(3) as usize);
        assert_eq!(sys_munmap(area as *mut c_void, area_len), 0);
        assert_eq!(sys_munmap(first.start as *mut c_void, crate::uffd::PAGE_SIZE), 0);
        // The second maps the same code at the same place, so the image's place is free.
        let rwx = libc::PROT_READ | libc::PROT_WRITE | libc::PROT_EXEC;
        let flags = libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_FIXED_NOREPLACE;
        let p = sys_mmap(first.start as *mut c_void, crate::uffd::PAGE_SIZE, rwx, flags, -1, 0);
        assert_eq!(p as usize, first.start);
        // SAFETY: a fresh page of ours, larger than `code`.
        unsafe { std::ptr::copy_nonoverlapping(code.as_ptr(), p as *mut u8, code.len()) };
        let second = Segment { start: p as usize, ..first.clone() };
        // As a process does as it loads: the place reserved, then mapped over.
        image.reserve_place(&second);
        let place = |area| crate::mapping::self_maps().unwrap().into_iter().find(|m| m.start <= area && area < m.end);
        assert!(place(area).is_some_and(|m| m.reservation), "the place is reserved");
        // SAFETY: as above.
        assert_eq!(unsafe { image.apply(&second, class, slow, &[]) }.unwrap(), Some((2, 2)), "patched from the image");
        assert!(place(area).is_some_and(|m| m.readable && !m.reservation), "the trampolines lie in the place");
        // SAFETY: the bytes are code following the C calling convention.
        let getpid: extern "C" fn() -> i64 = unsafe { std::mem::transmute(second.start) };
        // SAFETY: as above.
        let read: extern "C" fn(i32, *mut u8, usize) -> i64 =
            unsafe { std::mem::transmute(second.start + GETPID.len()) };
        assert_eq!(getpid(), std::process::id() as i64);
        let mut buf = vec![7u8; 64];
        use std::os::fd::AsRawFd;
        let f = std::fs::File::open("/dev/zero").unwrap();
        assert_eq!(read(f.as_raw_fd(), buf.as_mut_ptr(), 64), 64);
        assert!(buf.iter().all(|&b| b == 0));
        // Other code (another system call number in a window): not from this image.
        let other = map_code(&[GETPID, &[0xb8, 1, 0, 0, 0, 0x0f, 0x05, 0xc3]].concat());
        // SAFETY: as above.
        assert_eq!(unsafe { image.apply(&other, class, slow, &[]) }.unwrap(), None);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// A thread that would resume inside a window (a signal frame's saved program counter
    /// right after the `syscall`) keeps the code as it was, from a scan and from an image
    /// alike; one at a window's first byte (here the `syscall`, where a restart resumes), or
    /// right after the window, does not. The code is `read`'s: `xor %eax,%eax; syscall;
    /// cmp $-4095,%rax; ret`, whose window is the `syscall` and the `cmp`.
    #[test]
    fn no_window_is_rewritten_under_a_context_that_resumes_inside_it() {
        let _g = serialised();
        const READ: &[u8] = &[0x31, 0xc0, 0x0f, 0x05, 0x48, 0x3d, 0x01, 0xf0, 0xff, 0xff, 0xc3];
        let (class, slow) = (super::super::table::CLASS.as_ptr() as u64, super::super::entry::slow_entry());
        let dir = std::env::temp_dir().join(format!("uswap-interrupted-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let seg = map_code(READ);
        let (targets, sites) = scan(&seg);
        let w = choose_window(&seg, &sites[0], &targets).expect("a window");
        assert_eq!((w.start, w.len), (seg.start as u64 + 2, 8), "syscall + cmp");
        // SAFETY: the segment's bytes, mapped above.
        let code = || unsafe { std::slice::from_raw_parts(seg.start as *const u8, READ.len()) }.to_vec();
        // Right after the `syscall` (a return), inside the `cmp`.
        for at in [seg.start + 4, seg.start + 7] {
            // SAFETY: this test's own code, run by no other thread.
            let r = unsafe { patch_segment(&seg, class, slow, Some(&dir), &[seg.start - 64, at]) };
            assert_eq!(r, Err(PatchError::Interrupted { at }));
            assert_eq!(code(), READ, "nothing written");
        }
        // SAFETY: as above; the window's first byte, and the `ret` after it.
        let r = unsafe { patch_segment(&seg, class, slow, Some(&dir), &[seg.start + 2, seg.start + 10]) };
        assert_eq!(r, Ok((1, 1)));
        assert_eq!(code()[2], 0xe9, "the jump written");
        // The image the scan kept, on a fresh copy of the code: refused the same way.
        let image = ImageCache::beside(&WindowCache::for_segment(&dir, &seg).unwrap().path);
        let copy = map_code(READ);
        let copy = Segment { path: seg.path.clone(), ..copy };
        // SAFETY: as above.
        let r = unsafe { image.apply(&copy, class, slow, &[copy.start + 4]) };
        assert_eq!(r, Err(PatchError::Interrupted { at: copy.start + 4 }));
        // SAFETY: the copy's bytes, mapped above.
        assert_eq!(unsafe { std::slice::from_raw_parts(copy.start as *const u8, READ.len()) }, READ);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// What `resume_points` reads: a context's instruction pointer in a signal frame this
    /// thread holds (the handler's restorer 22 words below it), not a bare word in range, and
    /// nothing outside the range asked for.
    #[test]
    fn resume_points_are_the_stacks_words_in_the_range() {
        // A handler of the process's, for a restorer the kernel would push below a context.
        extern "C" fn nothing(_: libc::c_int) {}
        // SAFETY: a handler that does nothing, for a signal the tests never send.
        unsafe { libc::signal(libc::SIGUSR2, nothing as extern "C" fn(libc::c_int) as libc::sighandler_t) };
        let restorer = *crate::syscall_guard::sys::sys_signal_restorers().first().expect("a handler's restorer");
        // A signal frame's start and its context's instruction pointer, 22 words apart; then
        // a word in range with no frame below it (a stale register).
        let mut frame = [0usize; 24];
        (frame[0], frame[22], frame[23]) = (restorer, 0x5a5a_0000_1234, 0x5a5a_0000_1238);
        let marker = 0x5a5a_0000_5678usize;
        // In memory, in this frame, while the stack is read.
        std::hint::black_box((&frame, &marker));
        let points = resume_points(0x5a5a_0000_0000, 0x5a5a_0000_2000, None).expect("the stack is found");
        assert!(points.contains(&0x5a5a_0000_1234), "{points:x?}");
        assert!(!points.contains(&0x5a5a_0000_1238), "no signal frame below it: {points:x?}");
        assert!(!points.contains(&0x5a5a_0000_5678), "out of range: {points:x?}");
        assert!(points.windows(2).all(|p| p[0] <= p[1]), "sorted");
        std::hint::black_box((&frame, &marker));
    }

    /// A branch to the `syscall` itself: the window may not start before it.
    #[test]
    fn a_window_never_has_a_branch_target_inside() {
        let _g = serialised();
        // mov $39,%eax; syscall; cmp $-4095,%rax; jae -> syscall (a retry loop); ret
        const LOOP: &[u8] = &[0xb8, 39, 0, 0, 0, 0x0f, 0x05, 0x48, 0x3d, 0x01, 0xf0, 0xff, 0xff, 0x73, 0xf6, 0xc3];
        let seg = map_code(LOOP);
        let (targets, sites) = scan(&seg);
        assert_eq!(targets, vec![seg.start as u64 + 5]);
        let w = choose_window(&seg, &sites[0], &targets).expect("a window");
        assert_eq!((w.start, w.len), (seg.start as u64 + 5, 8), "syscall + cmp, from the branch target");
    }

    /// The windows a process stores are the ones the next one loads, instruction for
    /// instruction; a cache that does not match the code is not used.
    #[test]
    fn cached_windows_are_the_scanned_ones_and_a_wrong_cache_is_refused() {
        let _g = serialised();
        const LOOP: &[u8] = &[0xb8, 39, 0, 0, 0, 0x0f, 0x05, 0x48, 0x3d, 0x01, 0xf0, 0xff, 0xff, 0x73, 0xf6, 0xc3];
        let seg = map_code(LOOP);
        let dir = std::env::temp_dir().join(format!("uswap-window-cache-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let cache = WindowCache::for_segment(&dir, &seg).expect("the segment's file exists");
        assert!(cache.load(&seg).is_none(), "nothing cached yet");
        let (targets, sites) = scan(&seg);
        let windows: Vec<Window> = sites.iter().filter_map(|s| choose_window(&seg, s, &targets)).collect();
        cache.store(&seg, sites.len(), &windows);
        let (nr_sites, loaded) = cache.load(&seg).expect("the cache just written");
        assert_eq!(nr_sites, 1);
        let shape = |w: &Window| (w.start, w.len, w.before.clone(), w.after.clone());
        assert_eq!(loaded.iter().map(shape).collect::<Vec<_>>(), windows.iter().map(shape).collect::<Vec<_>>());
        // A window that cuts an instruction, or holds no syscall: the whole cache is refused.
        let path = cache.path.clone();
        for bad in ["1 8", "0 5", "7 6", "5 100"] {
            std::fs::write(&path, format!("{CACHE_MAGIC} 1\n{bad}\n")).unwrap();
            assert!(cache.load(&seg).is_none(), "{bad}");
        }
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
