//! The trampolines one process of a `uswap run` tree built for a library's code, kept for the
//! next ones: the area's bytes, where it lay relative to the code, and the windows it serves.
//!
//! Why: with the windows cached ([`super::patch`]'s `WindowCache`), a process still decoded
//! every window again and re-encoded its instructions, about 2.5 ms of the 4 that signal mode
//! added to every process's start (a build starts thousands). Trampolines placed at the same
//! distance from the code are the same bytes: every relative jump and RIP-relative operand
//! in them points into the same library at the same distance. Only the two absolute
//! addresses of each dispatch (the class table and the slow entry, in this library, which
//! loads elsewhere in each process) differ, and they lie at known places of the dispatch.
//!
//! So a process maps its area at the cached distance (only where nothing is mapped, or over
//! the place it reserved for it as it loaded, [`ImageCache::reserve_place`]), copies the bytes, sets the two addresses of each trampoline, and writes the
//! jumps, after checking that every window's code is, byte for byte, what the cache was made
//! from. When the place is taken (another program's libraries lie there) or anything does
//! not match, nothing is changed and the process patches as before, then keeps its own
//! layout for the next ones (a build's compilers share one).

use std::ffi::c_void;
use std::sync::atomic::{AtomicUsize, Ordering};

use super::code::{
    inside_window, jump, write_code, Segment, CLASS_TABLE_AT, REACH_BYTES, SLOW_ENTRY_AT, TRAMPOLINE_BYTES,
};
use super::sys::{sys_mmap, sys_mprotect, sys_munmap};
use super::PatchError;

const MAGIC: &[u8; 16] = b"uswap-tramp-v1\0\0";
/// Header words after the magic: sites, windows, area offset, area length, and the class
/// table and slow entry the trampolines were built with.
const HEADER_WORDS: usize = 6;

/// One window as the image keeps it: its place in the segment and, if it got a trampoline,
/// where that trampoline's dispatch starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct PlacedWindow {
    pub(super) off: usize,
    pub(super) len: usize,
    pub(super) dispatch_at: Option<usize>,
}

/// Trampolines a process built: their area, and the two addresses every dispatch holds.
#[derive(Debug, Clone, Copy)]
pub(super) struct Built {
    pub(super) area: usize,
    pub(super) area_len: usize,
    pub(super) class_table: u64,
    pub(super) slow_entry: u64,
}

pub(super) struct ImageCache {
    pub(super) path: std::path::PathBuf,
}

/// What a stored image holds.
struct Image {
    nr_sites: usize,
    windows: Vec<PlacedWindow>,
    /// The windows' code, one after another, as the image was made from it.
    code: Vec<u8>,
    area_off: isize,
    area: Vec<u8>,
    class_then: u64,
    slow_then: u64,
}

fn words(bytes: &[u8]) -> impl Iterator<Item = u64> + '_ {
    bytes.chunks_exact(8).map(|w| u64::from_le_bytes(w.try_into().expect("8 bytes")))
}

/// The most a stored image's trampolines may take (the C library has about a thousand
/// windows, 64 bytes of trampoline each).
const MAX_AREA_BYTES: usize = 16 << 20;

/// The place [`ImageCache::reserve_place`] reserved: its start (0: none) and length. Set
/// once, by the constructor's thread; taken by the rewrite, which runs on one thread.
static RESERVED_AT: AtomicUsize = AtomicUsize::new(0);
static RESERVED_LEN: AtomicUsize = AtomicUsize::new(0);

/// Maps `len` bytes read-write at `area` for trampolines: over this process's reservation
/// of the place when it is exactly that and still there, else only where nothing is mapped.
fn map_area(area: usize, len: usize) -> bool {
    let rw = libc::PROT_READ | libc::PROT_WRITE;
    let place = match take_reservation() {
        Some(r) if r == (area, len) => libc::MAP_FIXED,
        Some((at, n)) => {
            sys_munmap(at as *mut c_void, n);
            libc::MAP_FIXED_NOREPLACE
        }
        None => libc::MAP_FIXED_NOREPLACE,
    };
    if !map_exactly(area, len, rw, place) {
        return false;
    }
    crate::mapping::note_engine_memory(area, len);
    true
}

/// Maps `len` bytes of private anonymous memory with `prot` at exactly `area` (`place`:
/// `MAP_FIXED_NOREPLACE`, or `MAP_FIXED` over a mapping of this module's own); false, with
/// nothing mapped, where that cannot be done.
fn map_exactly(area: usize, len: usize, prot: i32, place: i32) -> bool {
    let p = sys_mmap(area as *mut c_void, len, prot, libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | place, -1, 0);
    if p == libc::MAP_FAILED {
        return false;
    }
    if p as usize != area {
        // An older kernel that took the flag for a hint.
        sys_munmap(p, len);
        return false;
    }
    true
}

/// The header words of a stored image (see [`HEADER_WORDS`]), after its magic.
fn header_words(bytes: &[u8]) -> Option<[u64; HEADER_WORDS]> {
    let rest = bytes.strip_prefix(MAGIC.as_slice())?;
    let mut head = [0u64; HEADER_WORDS];
    for (h, w) in head.iter_mut().zip(words(rest.get(..HEADER_WORDS * 8)?)) {
        *h = w;
    }
    Some(head)
}

/// Takes the reservation of the place: `Some((start, len))` if there was one and it is still
/// there whole (`/proc/self/maps`: inaccessible private anonymous memory over all of it; the
/// kernel may have merged it with a neighbour of the same kind): only then may it be mapped
/// over or unmapped. A mapping of the program's put over it, in whole or in part, fails the
/// check unless it is of the same kind (`PROT_NONE` anonymous memory itself), which the
/// program could only have put there with `MAP_FIXED` at an address the kernel never gave
/// it. Called with one thread (the rewrite's), so nothing maps there between the check and
/// the use.
fn take_reservation() -> Option<(usize, usize)> {
    let at = RESERVED_AT.swap(0, Ordering::AcqRel);
    let len = RESERVED_LEN.swap(0, Ordering::AcqRel);
    if at == 0 {
        return None;
    }
    let end = at + len;
    let maps = crate::mapping::self_maps()?;
    let overlapping = maps.iter().filter(|m| m.start < end && m.end > at);
    let (mut covered, mut all_reserved) = (0, true);
    for m in overlapping {
        covered += m.end.min(end) - m.start.max(at);
        all_reserved &= m.reservation;
    }
    (covered == len && all_reserved).then_some((at, len))
}

/// Gives back the place reserved for the trampolines, if it was not used: the rewrite
/// was done without it, or will not be (a pager in thread mode).
pub(super) fn release_reservation() {
    if let Some((at, len)) = take_reservation() {
        sys_munmap(at as *mut c_void, len);
    }
}

impl ImageCache {
    /// The image kept beside the window cache `windows_path`.
    pub(super) fn beside(windows_path: &std::path::Path) -> ImageCache {
        let mut path = windows_path.as_os_str().to_owned();
        path.push(".image");
        ImageCache { path: path.into() }
    }

    fn load(&self, seg: &Segment) -> Option<Image> {
        let b = std::fs::read(&self.path).ok()?;
        let rest = b.strip_prefix(MAGIC.as_slice())?;
        let [nr_sites, nr_windows, area_off, area_len, class_then, slow_then] = header_words(&b)?;
        let (nr_windows, area_len) = (usize::try_from(nr_windows).ok()?, usize::try_from(area_len).ok()?);
        let table_end = HEADER_WORDS * 8 + nr_windows.checked_mul(24)?;
        let mut windows = Vec::with_capacity(nr_windows);
        for w in rest.get(HEADER_WORDS * 8..table_end)?.chunks_exact(24) {
            let v: Vec<u64> = words(w).collect();
            let (off, len) = (usize::try_from(v[0]).ok()?, usize::try_from(v[1]).ok()?);
            let dispatch_at = (v[2] != u64::MAX).then(|| usize::try_from(v[2]).ok()).flatten();
            if off.checked_add(len)? > seg.len || dispatch_at.is_some_and(|d| d + SLOW_ENTRY_AT + 8 > TRAMPOLINE_BYTES)
            {
                return None;
            }
            windows.push(PlacedWindow { off, len, dispatch_at });
        }
        let code_len: usize = windows.iter().map(|w| w.len).sum();
        let code = rest.get(table_end..table_end + code_len)?.to_vec();
        let area = rest.get(table_end + code_len..)?.to_vec();
        if area.len() != area_len || windows.len() * TRAMPOLINE_BYTES > area_len {
            return None;
        }
        let nr_sites = usize::try_from(nr_sites).ok()?;
        Some(Image { nr_sites, windows, code, area_off: area_off as i64 as isize, area, class_then, slow_then })
    }

    /// Patches `seg` from the image, if there is a good one and its place is free: (sites,
    /// patched). `Ok(None)`: nothing was changed; patch as without it. Nothing is changed
    /// either if one of `points` (where this thread may resume, sorted) lies inside a window
    /// past its first byte ([`PatchError::Interrupted`]).
    ///
    /// # Safety
    /// As `patch_segment`: no other thread runs; `seg` is mapped code, not yet patched.
    pub(super) unsafe fn apply(
        &self,
        seg: &Segment,
        class_table: u64,
        slow_entry: u64,
        points: &[usize],
    ) -> Result<Option<(usize, usize)>, PatchError> {
        let Some(img) = self.load(seg) else { return Ok(None) };
        // The code must be what the image was made from, window by window.
        // SAFETY: every window lies inside the mapped segment (checked by `load`).
        let live = |w: &PlacedWindow| unsafe { std::slice::from_raw_parts((seg.start + w.off) as *const u8, w.len) };
        let mut at = 0;
        for w in &img.windows {
            if live(w) != &img.code[at..at + w.len] {
                return Ok(None);
            }
            at += w.len;
        }
        // Every window, with a trampoline or not: one without is not written, but the
        // scan that `Ok(None)` would lead to does not know that yet.
        if let Some(at) = inside_window(points, img.windows.iter().map(|w| (seg.start + w.off, w.len))) {
            return Err(PatchError::Interrupted { at });
        }
        let Some(area) = seg.start.checked_add_signed(img.area_off) else { return Ok(None) };
        if !map_area(area, img.area.len()) {
            return Ok(None);
        }
        let mut bytes = img.area;
        let mut jumps = Vec::with_capacity(img.windows.len());
        for (i, w) in img.windows.iter().enumerate() {
            let Some(d) = w.dispatch_at else { continue };
            let t = i * TRAMPOLINE_BYTES + d;
            for (at, then, now) in
                [(CLASS_TABLE_AT, img.class_then, class_table), (SLOW_ENTRY_AT, img.slow_then, slow_entry)]
            {
                let field = &mut bytes[t + at..t + at + 8];
                // The image's own check: the address it was built with is where it says.
                if field != then.to_le_bytes() {
                    crate::mapping::forget_engine_memory(area);
                    sys_munmap(area as *mut c_void, bytes.len());
                    return Ok(None);
                }
                field.copy_from_slice(&now.to_le_bytes());
            }
            let start = seg.start + w.off;
            jumps.push((start, jump(start, area + i * TRAMPOLINE_BYTES, w.len)));
        }
        // SAFETY: the area was just mapped read-write for `bytes.len()` bytes.
        unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), area as *mut u8, bytes.len()) };
        if sys_mprotect(area as *mut c_void, bytes.len(), libc::PROT_READ | libc::PROT_EXEC) != 0 {
            let e = std::io::Error::last_os_error();
            crate::mapping::forget_engine_memory(area);
            sys_munmap(area as *mut c_void, bytes.len());
            return Err(PatchError::Failed(format!("cannot make the trampolines executable: {e}")));
        }
        // SAFETY: the caller's contract (one thread, the segment's own code).
        if !unsafe { self.map_text(seg, &jumps) } {
            // SAFETY: as above.
            unsafe { write_code(&jumps)? };
        }
        Ok(Some((img.nr_sites, jumps.len())))
    }

    /// Reserves, inaccessible, the place where the stored image's trampolines lie relative
    /// to `seg`, if nothing is there, for this process's pager to map them at if it starts
    /// in signal mode ([`map_area`]): a program maps its own libraries and files before its
    /// pager starts, and often took the place (measured: the image applied in 1-8 of 10
    /// lazily started processes against 8-9 of 10 that started before `main`; each miss
    /// decodes the windows again and writes the jumps, about 3 ms and 170 private pages).
    /// Reads the image's header only.
    pub(super) fn reserve_place(&self, seg: &Segment) {
        use std::io::Read;
        let mut head = [0u8; MAGIC.len() + HEADER_WORDS * 8];
        let read = std::fs::File::open(&self.path).and_then(|mut f| f.read_exact(&mut head));
        let Some(w) = read.ok().and_then(|()| header_words(&head)) else { return };
        let (Some(area), Ok(len)) = (seg.start.checked_add_signed(w[2] as i64 as isize), usize::try_from(w[3])) else {
            return;
        };
        // A header that is not what `store` writes (a damaged or foreign file) must not
        // reserve more than trampolines take, nor out of a jump's reach.
        let most = usize::try_from(w[1]).ok().and_then(|n| n.checked_mul(TRAMPOLINE_BYTES));
        let fits = most.is_some_and(|most| len <= most.next_multiple_of(crate::uffd::PAGE_SIZE).min(MAX_AREA_BYTES));
        let near = (w[2] as i64).unsigned_abs() < REACH_BYTES as u64;
        if len == 0 || len % crate::uffd::PAGE_SIZE != 0 || !fits || !near || RESERVED_AT.load(Ordering::Acquire) != 0 {
            return;
        }
        if !map_exactly(area, len, libc::PROT_NONE, libc::MAP_NORESERVE | libc::MAP_FIXED_NOREPLACE) {
            return;
        }
        RESERVED_LEN.store(len, Ordering::Release);
        RESERVED_AT.store(area, Ordering::Release);
    }

    /// Where the patched code a process kept for the next ones lies ([`ImageCache::store_text`]).
    fn text_path(&self) -> std::path::PathBuf {
        let mut path = self.path.as_os_str().to_owned();
        path.push(".text");
        path.into()
    }

    /// The pages of `seg` whole: the code is mapped, and so replaced, a page at a time.
    fn text_pages(seg: &Segment) -> (usize, usize) {
        let page = crate::uffd::PAGE_SIZE;
        let first = seg.start & !(page - 1);
        (first, (seg.start + seg.len).next_multiple_of(page) - first)
    }

    /// Keeps the pages of `seg`, now patched, for the next process whose trampolines lie at
    /// the same distance: it maps them over its own code instead of writing the jumps, so its
    /// code pages stay shared with the file instead of each becoming a private copy (about
    /// 170 pages of the C library: as many page faults, each a page copied, and 700 KiB of
    /// memory per process). Best effort, written whole and renamed into place.
    pub(super) fn store_text(&self, seg: &Segment) {
        let (first, len) = Self::text_pages(seg);
        // SAFETY: the segment's pages are mapped code, readable.
        let bytes = unsafe { std::slice::from_raw_parts(first as *const u8, len) };
        let path = self.text_path();
        let mut tmp = path.as_os_str().to_owned();
        tmp.push(format!(".tmp{}", std::process::id()));
        let tmp = std::path::PathBuf::from(tmp);
        if std::fs::write(&tmp, bytes).is_err() || std::fs::rename(&tmp, &path).is_err() {
            let _ = std::fs::remove_file(&tmp);
        }
    }

    /// Maps the kept patched pages over `seg` if they hold exactly the `jumps` this process
    /// would write (the code around them is the library file's, the same in every process).
    /// False, with nothing changed, when there are none, they do not match, or the file
    /// system refuses to map them executable (`noexec`).
    ///
    /// # Safety
    /// As [`ImageCache::apply`]; `jumps` are the writes that patch `seg`.
    unsafe fn map_text(&self, seg: &Segment, jumps: &[(usize, Vec<u8>)]) -> bool {
        let Ok(file) = std::fs::File::open(self.text_path()) else { return false };
        let (first, len) = Self::text_pages(seg);
        if file.metadata().map(|m| m.len()).ok() != Some(len as u64) {
            return false;
        }
        use std::os::fd::AsRawFd;
        let fd = file.as_raw_fd();
        let check = sys_mmap(std::ptr::null_mut(), len, libc::PROT_READ, libc::MAP_PRIVATE, fd, 0);
        if check == libc::MAP_FAILED {
            return false;
        }
        // SAFETY: `check` maps `len` readable bytes of the file.
        let kept = unsafe { std::slice::from_raw_parts(check as *const u8, len) };
        let same = jumps.iter().all(|(at, b)| kept.get(at - first..at - first + b.len()) == Some(b.as_slice()));
        sys_munmap(check, len);
        if !same {
            return false;
        }
        // Made directly, not through the C library's `syscall`: its own `syscall` instruction
        // lies in a window these pages rewrite, and the call would return into the jump.
        // SAFETY: replaces the segment's pages with the same code, patched (checked above);
        // one thread (the caller's contract). A refusal (`noexec`) is made before anything is
        // unmapped, and leaves the code as it was.
        let r = unsafe {
            super::raw::raw(
                libc::SYS_mmap,
                [
                    first as u64,
                    len as u64,
                    (libc::PROT_READ | libc::PROT_EXEC) as u64,
                    (libc::MAP_PRIVATE | libc::MAP_FIXED) as u64,
                    fd as u64,
                    0,
                ],
            )
        };
        r as usize == first
    }

    /// Keeps the trampolines this process built for `seg` (read back from their area), for
    /// the next process. Best effort, written whole and renamed into place.
    pub(super) fn store(&self, seg: &Segment, nr_sites: usize, windows: &[PlacedWindow], built: &Built) {
        let Built { area, area_len, class_table, slow_entry } = *built;
        let mut b = MAGIC.to_vec();
        let area_off = area as i64 - seg.start as i64;
        for w in [nr_sites as u64, windows.len() as u64, area_off as u64, area_len as u64, class_table, slow_entry] {
            b.extend_from_slice(&w.to_le_bytes());
        }
        for w in windows {
            for v in [w.off as u64, w.len as u64, w.dispatch_at.map_or(u64::MAX, |d| d as u64)] {
                b.extend_from_slice(&v.to_le_bytes());
            }
        }
        for w in windows {
            // SAFETY: the window lies inside the mapped segment; its bytes as they were
            // (the caller stores before writing the jumps).
            b.extend_from_slice(unsafe { std::slice::from_raw_parts((seg.start + w.off) as *const u8, w.len) });
        }
        // SAFETY: the area is mapped and readable for `area_len` bytes.
        b.extend_from_slice(unsafe { std::slice::from_raw_parts(area as *const u8, area_len) });
        let mut tmp = self.path.as_os_str().to_owned();
        tmp.push(format!(".tmp{}", std::process::id()));
        let tmp = std::path::PathBuf::from(tmp);
        if std::fs::write(&tmp, b).is_err() || std::fs::rename(&tmp, &self.path).is_err() {
            let _ = std::fs::remove_file(&tmp);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Whether `[at, at + len)` is mapped, inaccessible (the reservation, merged with the
    /// test's own address space around it).
    fn reserved(at: usize, len: usize) -> bool {
        let maps = crate::mapping::self_maps().expect("/proc/self/maps");
        maps.iter().any(|m| m.start <= at && m.end >= at + len && !m.readable)
    }

    /// The place of the kept trampolines, reserved as the library loads, is given back when
    /// the rewrite does not use it; a mapping the program put over it meanwhile, whole or in
    /// part, is left alone; a header that asks for more than trampolines take reserves nothing.
    #[test]
    fn the_reserved_place_is_given_back_but_never_a_mapping_of_the_programs() {
        let _g = crate::syscall_guard::serialised();
        let page = crate::uffd::PAGE_SIZE;
        let (room, len) = (64 << 20, 4 * page);
        let anon = libc::MAP_PRIVATE | libc::MAP_ANONYMOUS;
        // Address space of the test's own around the place, but for the place itself.
        let base = sys_mmap(std::ptr::null_mut(), room, libc::PROT_NONE, anon | libc::MAP_NORESERVE, -1, 0);
        assert_ne!(base, libc::MAP_FAILED);
        let (code, area) = (base as usize + (16 << 20), base as usize + (32 << 20));
        assert_eq!(sys_munmap(area as *mut c_void, len), 0);
        let seg = Segment { start: code, len: page, base: code, path: "/proc/self/exe".into() };
        let dir = std::env::temp_dir().join(format!("uswap-image-place-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let image = ImageCache { path: dir.join("libc.image") };
        let header = |windows: u64, len: usize| {
            let mut head = MAGIC.to_vec();
            for w in [1, windows, (area - code) as u64, len as u64, 0, 0] {
                head.extend_from_slice(&u64::to_le_bytes(w));
            }
            std::fs::write(&image.path, &head).unwrap();
        };
        let rw = libc::PROT_READ | libc::PROT_WRITE;
        let program_maps = |at: usize, n: usize| {
            let p = sys_mmap(at as *mut c_void, n, rw, anon | libc::MAP_FIXED, -1, 0);
            assert_eq!(p as usize, at, "the program maps over the place");
            // SAFETY: the page was just mapped read-write.
            unsafe { std::ptr::write_volatile(at as *mut u64, 0x5eed) };
        };
        // SAFETY: a read of a word the test wrote, in a mapping that must still be there.
        let still_there = |at: usize| unsafe { std::ptr::read_volatile(at as *const u64) } == 0x5eed;

        header(len as u64 / 64, len);
        image.reserve_place(&seg);
        assert!(reserved(area, len), "the place is reserved, inaccessible");
        release_reservation();
        assert!(!reserved(area, len), "and given back");

        image.reserve_place(&seg);
        program_maps(area, len);
        release_reservation();
        assert!(still_there(area), "the program's mapping over the whole place stays");
        assert_eq!(sys_munmap(area as *mut c_void, len), 0);

        image.reserve_place(&seg);
        program_maps(area + page, page);
        release_reservation();
        assert!(still_there(area + page), "the program's page inside the place stays");
        assert!(reserved(area, page), "and so does the rest of the reservation (left, not unmapped)");
        assert_eq!(sys_munmap(area as *mut c_void, len), 0);

        header(1, len);
        image.reserve_place(&seg);
        assert!(!reserved(area, len), "more than one trampoline's page for one window: nothing reserved");
        assert_eq!(sys_munmap(base, room), 0);
        let _ = std::fs::remove_dir_all(&dir);
    }
}
