//! The program's memory that uswap does not manage, measured so that a budget that does not
//! hold is said aloud (`uswap run`'s summary, `--strict`).
//!
//! Every mapping of `/proc/self/maps` outside a managed region, the engine's own mappings
//! (`uswap::memory_owners`: its stacks and mappings), this library's own image (its data and
//! `.bss`: the engine's tables, 4.4 MiB of region table alone, of which each process touches
//! about 300 KiB; counted as the program's, a tree of twenty small processes failed
//! `--strict`, [`own_image`]) and the brk heap (the C library's malloc,
//! which serves only uswap once mimalloc is up; the program's blocks from before are added,
//! at what they held then, bounded by the brk heap's resident pages) is counted with the `PAGEMAP_SCAN` ioctl on
//! `/proc/self/pagemap` (Linux 6.7): its private anonymous pages (present, neither file
//! pages nor the shared zero page), and the pages of shared memory in memory
//! (`MAP_SHARED|MAP_ANONYMOUS`, memfd, SysV, `/dev/shm`; by `mincore`, which asks the
//! object, whoever touched them, for writable mappings up to 1 GiB), which a tree counts once per
//! object, not once per process that maps it ([`Unmanaged::count_shared`]). Each mapping
//! left gets the reason it is not managed, from what `/proc` says of it (and, for memory
//! uswap let go of, from what the program asked: `crate::let_go`). A mapping whose
//! addresses a region took or left during the scan waits for the next one, and a scan that
//! a managed `munmap` overlapped is made again (`measure`). The scan runs on
//! the report thread (every second) and at exit, never on the program's threads.
//!
//! Why not `/proc/self/smaps`: it walks the page tables of every mapping, the managed
//! regions' too (pmbench's 1 GiB: 36 ms of a CPU every second), and while it runs the
//! report thread keeps the process's address space live on a second CPU, so that every
//! `UFFDIO_MOVE` of the faulting thread meanwhile flushes that CPU with an IPI.
//! `PAGEMAP_SCAN` walks only the ranges asked for, and skips their empty page tables (a
//! plain read of pagemap would produce 8 bytes per page of a reservation, however large).
//! Where it cannot be used (an older kernel, or a process that is not dumpable, whose
//! pagemap only root may open), smaps is read as before. Private `MAP_HUGETLB` pages count
//! here, where smaps put them apart from `Anonymous`: they are anonymous memory outside the
//! budget all the same.

use std::ops::ControlFlow;
use std::os::unix::io::AsRawFd;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

/// One unmanaged mapping: where, how much of it is resident, and why uswap leaves it alone.
#[derive(Debug, Clone)]
pub struct Mapping {
    pub start: usize,
    pub len: usize,
    pub bytes: u64,
    pub why: &'static str,
}

/// One reason a scan gave: the bytes of the mappings it was given for, and how many.
/// Programs that hold their memory in many small mappings (stress-ng's mmap stressor remaps
/// 256 MiB one page at a time: 31,000 mappings) are outside the budget for a reason that
/// the largest mappings alone do not show.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reason {
    pub why: &'static str,
    pub bytes: u64,
    pub mappings: u64,
    /// The largest of those mappings: its start and bytes.
    pub largest: (usize, u64),
}

/// What a record names of a measurement: its largest mappings (at most [`LARGEST`]) and
/// its totals by reason (one for each of `why`'s reasons at most), most bytes first.
#[derive(Debug, Default, Clone)]
pub struct Named {
    pub largest: Vec<Mapping>,
    pub by_reason: Vec<Reason>,
}

impl Named {
    /// Empty, for a static.
    pub const fn new() -> Self {
        Named { largest: Vec::new(), by_reason: Vec::new() }
    }
}

/// What a scan found: the total, and what it names of it ([`Named`]).
///
/// Shared anonymous memory is kept apart until [`Unmanaged::count_shared`]: a page of it is
/// one page for every process that maps it, which a tree must count once.
#[derive(Debug, Default, Clone)]
pub struct Unmanaged {
    pub bytes: u64,
    pub named: Named,
    /// The brk heap's extent, as the scan met it (`[heap]`; left out of `bytes`).
    brk_heap: Option<(usize, usize)>,
    /// Every mapping of shared anonymous memory, resident pages or not, with its object
    /// ([`object_key`]; 0 where `/proc` named none): not yet in `bytes` nor `named`.
    shared: Vec<(u64, Mapping)>,
    /// An io_uring instance's rings (`anon_inode:[io_uring]`) are mapped, the process's or
    /// the engine's (a file device's): the kernel accesses memory by itself, later.
    pub io_uring_mapped: bool,
    /// A Linux AIO context (`/[aio]`) is mapped (the engine makes none).
    pub aio_mapped: bool,
}

impl Unmanaged {
    /// Adds the shared anonymous memory to the total, each object once: `count(object,
    /// bytes)` says how much of an object this process counts, given the `bytes` of it it
    /// has resident (all of them outside a tree; in one, what
    /// `uswap::shared_charge::ChargeSegment::count_shared_object` says). An object mapped
    /// more than once counts its largest mapping's bytes (views of the same pages: the JDK's
    /// ZGC maps its heap's memfd three times), and is named by its first (lowest) mapping.
    ///
    /// Sorted in place, in time n log n in the mappings: stress-ng's `--mlock` maps
    /// thousands of shared pages (a search of the list for each of them took 39 % of the
    /// run's CPU time), and nothing the size of the list is allocated (a table of objects
    /// could abort a process at the system's limit of mappings, see
    /// [`SCANS_WITHOUT_MEMORY`]; `add`'s lists stay a few entries long).
    pub fn count_shared(&mut self, mut count: impl FnMut(u64, u64) -> u64) {
        let mut shared = std::mem::take(&mut self.shared);
        shared.sort_unstable_by_key(|(object, m)| (*object, m.start));
        // Each object's mappings together; every mapping of no known object apart.
        for group in shared.chunk_by(|(a, _), (b, _)| a == b && *a != 0) {
            let (object, first) = &group[0];
            let counted = match object {
                0 => first.bytes,
                _ => count(*object, group.iter().map(|(_, m)| m.bytes).max().unwrap_or(0)),
            };
            add(self, Mapping { bytes: counted, ..first.clone() });
        }
    }

    /// The shared objects the scan met (see [`object_key`]); `None` if their list cannot be
    /// allocated (see [`SCANS_WITHOUT_MEMORY`]).
    pub fn shared_objects(&self) -> Option<Vec<u64>> {
        let mut objects = Vec::new();
        objects.try_reserve_exact(self.shared.len()).ok()?;
        objects.extend(self.shared.iter().map(|(o, _)| *o).filter(|&o| o != 0));
        Some(objects)
    }
}

/// A shared memory object's identity, from its device (`MAJOR:MINOR`, hex) and inode as
/// `/proc/self/maps` gives them: the same in every process that maps it. 0 where either
/// is missing. A SysV segment's "inode" is its shmid, on the same internal device as the
/// inodes of memfds and `MAP_SHARED|MAP_ANONYMOUS` mappings: the top bit tells them apart.
fn object_key(dev: &str, inode: &str, path: &str) -> u64 {
    let Some((major, minor)) = dev.split_once(':') else { return 0 };
    let (Ok(major), Ok(minor), Ok(inode)) =
        (u64::from_str_radix(major, 16), u64::from_str_radix(minor, 16), inode.parse::<u64>())
    else {
        return 0;
    };
    if inode == 0 {
        return 0;
    }
    let sysv = if path.starts_with("/SYSV") { 1 << 63 } else { 0 };
    ((major << 20 | minor) << 40) ^ inode ^ sysv
}

/// Mappings named in a report.
pub const LARGEST: usize = 4;

// `why` names the table's size in words.
const _: () = assert!(crate::mmap::MAX_MAPPINGS == 65_000);

/// The line of a mapping in maps (and its header in smaps): `start-end perms offset dev inode [path]`.
pub(crate) struct Header<'a> {
    pub(crate) start: usize,
    pub(crate) end: usize,
    pub(crate) perms: &'a str,
    /// [`object_key`] of its device and inode.
    object: u64,
    path: &'a str,
}

pub(crate) fn parse_header(line: &str) -> Option<Header<'_>> {
    let mut f = line.splitn(6, ' ');
    let (s, e) = f.next()?.split_once('-')?;
    let start = usize::from_str_radix(s, 16).ok()?;
    let end = usize::from_str_radix(e, 16).ok()?;
    let perms = f.next()?;
    let (_off, dev, inode) = (f.next()?, f.next()?, f.next()?);
    let path = f.next().unwrap_or("").trim();
    Some(Header { start, end, perms, object: object_key(dev, inode, path), path })
}

/// Whether a shared mapping of `path` is memory, not a file on a disk: `MAP_SHARED|
/// MAP_ANONYMOUS` (`/dev/zero`), a memfd, a SysV segment, or a POSIX shared memory object
/// (`shm_open`, a file in `/dev/shm`: Python's `multiprocessing.shared_memory` and its
/// `Value`s and `Array`s, PostgreSQL's `dynamic_shared_memory_type=posix`).
fn is_shared_anonymous(path: &str) -> bool {
    path.starts_with("/dev/zero")
        || path.starts_with("/memfd:")
        || path.starts_with("/SYSV")
        || path.starts_with("/dev/shm/")
        || path == "[anon_shmem]"
}

/// Where the mapping before ended, and whether it was a file's writable data: an anonymous
/// mapping that starts there is that file's `.bss`.
#[derive(Clone, Copy, Default)]
struct Before {
    end: usize,
    file_data: bool,
}

impl Before {
    fn of(h: &Header<'_>) -> Before {
        Before { end: h.end, file_data: h.path.starts_with('/') && h.perms.as_bytes().get(1) == Some(&b'w') }
    }
}

/// Why a mapping with resident memory is not managed, from what `/proc` says of it and of
/// the mapping `before` it.
fn why(h: &Header<'_>, before: Before, min_size_bytes: usize) -> &'static str {
    let shared = h.perms.as_bytes().get(3) == Some(&b's');
    if shared && is_shared_anonymous(h.path) {
        return "shared memory (MAP_SHARED|MAP_ANONYMOUS, memfd, SysV, /dev/shm): not paged by uswap (docs/cli.md)";
    }
    match h.path {
        "[stack]" => "the main thread's stack",
        p if p.starts_with("/anon_hugepage") => "MAP_HUGETLB: not paged by uswap",
        _ if h.perms.contains('x') => "executable memory (a JIT's code cache, or a heap mapped executable)",
        _ if crate::program_break::overlaps(h.start, h.end) => "the program's own break (brk, sbrk): not paged by uswap",
        _ if crate::program_userfaultfd::overlaps(h.start, h.end) => {
            "registered with the program's own userfaultfd: let go of by uswap (a range has one userfaultfd)"
        }
        p if p.starts_with('/') => "written pages of a file mapping",
        _ if h.perms.as_bytes().get(1) != Some(&b'w') => {
            "read-only memory (mprotect): the kernel moves no page out of it, so uswap lets go of it"
        }
        _ if crate::program_stacks::let_go_of(h.start, h.end) => {
            "a stack the program runs code on (makecontext, pthread_attr_setstack): in signal mode uswap lets go of \
             it, since a signal's frame written there could not wait for a page (--fault-mode thread pages it)"
        }
        _ if crate::mmap::let_go_by_protection(h.start, h.end) => {
            "made read-only or executable by the program (mprotect): uswap let go of it, and does not take it back \
             when it is made writable again"
        }
        "" if before.file_data && before.end == h.start => {
            "the zero-filled part of a program's or library's static data (.bss), mapped by the kernel or the loader"
        }
        _ if h.end - h.start < min_size_bytes => {
            "smaller than --min-size (a smaller --min-size manages them, down to 4KiB, at some cost in faults)"
        }
        // Mappings the full table refused (V8's heap pages), most likely, when at least half
        // as much was refused so (a hint too: the count never goes down).
        _ if crate::mmap::TABLE_FULL_BYTES.load(std::sync::atomic::Ordering::Relaxed) >= (h.end - h.start) as u64 / 2 => {
            "past the 65,000 mappings uswap manages at once in a process, most likely (V8 makes each 256 KiB page of \
             its heap a mapping), or mapped inside the C library or by a raw system call"
        }
        // Merged neighbours, most likely, when the program made at least half as much in
        // small mappings (the count never goes down: a hint, not a proof).
        _ if crate::mmap::SMALL_MAPPED_BYTES.load(std::sync::atomic::Ordering::Relaxed) >= (h.end - h.start) as u64 / 2 => {
            "mappings smaller than --min-size that the kernel merged into one, most likely (a smaller --min-size, \
             down to 4KiB, manages them at some cost in faults), or mapped inside the C library or by a raw system call"
        }
        // The program's own stacks, most likely, when it mapped at least half as much so.
        _ if crate::mmap::STACK_MAPPED_BYTES.load(std::sync::atomic::Ordering::Relaxed) >= (h.end - h.start) as u64 / 2 => {
            "stacks the program mapped (MAP_STACK, MAP_GROWSDOWN): not paged by uswap, most likely, or mapped inside \
             the C library or by a raw system call"
        }
        _ => "mapped where uswap does not see it: inside the C library (thread stacks, its own allocations) or by a raw system call",
    }
}

/// Scans the process's mappings (see the module's comment). `None` if `/proc` cannot be
/// read, or if the scan's lists could not be allocated (counted: [`SCANS_WITHOUT_MEMORY`]).
pub fn measure(min_size_bytes: usize) -> Option<Unmanaged> {
    let pagemap = std::fs::File::open("/proc/self/pagemap").ok();
    // Bounded: MEASURE_TRIES scans, the last one kept whatever overlapped it.
    let mut tries = 0;
    let (mut out, by_scan) = loop {
        tries += 1;
        let (begun, ended) = crate::munmap::managed_unmaps();
        let scanned = pagemap.as_ref().map_or(Err(NoScan::Refused), |pm| measure_by_scan(pm, min_size_bytes));
        let by_scan = scanned.is_ok();
        let out = match scanned {
            Err(NoScan::Refused) => measure_by_smaps(min_size_bytes),
            scanned => scanned,
        };
        let out = match out {
            Ok(out) => out,
            Err(NoScan::NoMemory) => {
                SCANS_WITHOUT_MEMORY.fetch_add(1, Ordering::Relaxed);
                return None;
            }
            Err(NoScan::Refused) => return None,
        };
        // A managed unmap under way at the start or begun since may have left a region's
        // pages in a mapping no region owned while the scan read it (`settle` cannot tell).
        if (begun == ended && crate::munmap::managed_unmaps().0 == begun) || tries == MEASURE_TRIES {
            break (out, by_scan);
        }
    };
    add_c_library_heap(&mut out, pagemap.as_ref().filter(|_| by_scan));
    Some(out)
}

/// Scans [`measure`] makes while managed unmaps overlap them (CPython unmaps each arena it
/// empties): the last is kept, with what `settle` removed from it.
const MEASURE_TRIES: u32 = 3;

/// The program's first blocks, which the C library's malloc kept (`crate::heap`, "The C
/// library's heap first"), in the brk heap that the scan leaves out: what they held when
/// mimalloc came up, and no more than the brk heap's resident pages (with `PAGEMAP_SCAN`),
/// which hold uswap's own memory too: an upper bound. With no brk heap (the C library fell
/// back to mappings of its own) they lie in mappings the scan counted already.
fn add_c_library_heap(out: &mut Unmanaged, pagemap: Option<&std::fs::File>) {
    let counted = crate::heap::c_library_heap_bytes();
    if counted == 0 {
        return;
    }
    let Some((start, end)) = out.brk_heap else { return };
    let resident = pagemap.and_then(|pm| scan_resident_bytes(pm, start, end, false));
    let bytes = counted.min(resident.unwrap_or(counted));
    let why = "the program's first blocks, served by the C library's malloc before uswap's heap came up";
    add(out, Mapping { start, len: end - start, bytes, why });
}

/// Notes the brk heap's extent, for [`add_c_library_heap`], and the mappings of
/// asynchronous I/O ([`Unmanaged::io_uring_mapped`], [`Unmanaged::aio_mapped`]).
fn note_special_mappings(out: &mut Unmanaged, h: &Header<'_>) {
    if h.path == "[heap]" {
        out.brk_heap = Some((h.start, h.end));
    }
    out.io_uring_mapped |= h.path == "anon_inode:[io_uring]";
    out.aio_mapped |= h.path.starts_with("/[aio]");
}

/// Whether a mapping is counted at all, and if it is, whether it is shared anonymous memory.
fn counted(h: &Header<'_>) -> Option<bool> {
    let shared_anon = h.perms.as_bytes().get(3) == Some(&b's') && is_shared_anonymous(h.path);
    let private = h.perms.as_bytes().get(3) == Some(&b'p');
    // The brk heap is the C library's malloc, which serves only uswap once mimalloc is up
    // (the program's malloc is the managed heap; see `crate::heap`); the program's blocks
    // from before are added apart (`add_c_library_heap`).
    ((private || shared_anon) && h.path != "[heap]").then_some(shared_anon)
}

/// Whether no pager manages `[start, end)` and it is not the engine's own memory: by the
/// regions of the copy `owners` that are still registered, and this library's image.
fn unowned(owners: &uswap::MemoryOwners, start: usize, end: usize) -> bool {
    let (image_start, image_end) = own_image();
    owners.owner(start, end) == uswap::MemoryOwner::Other && !(image_start <= start && end <= image_end)
}

/// The addresses of this library's loaded image, from its first segment to the end of its
/// last one's memory (its `.bss`, which the loader maps anonymous after the file's data);
/// `(0, 0)` if the loader does not list it. Found once.
fn own_image() -> (usize, usize) {
    static IMAGE: std::sync::OnceLock<(usize, usize)> = std::sync::OnceLock::new();
    *IMAGE.get_or_init(|| {
        let mut found = (0usize, 0usize);
        // SAFETY: the loader calls `image_of_this_library` for each loaded object with a
        // valid `dl_phdr_info`, and `found` outlives the call.
        unsafe { libc::dl_iterate_phdr(Some(image_of_this_library), (&mut found as *mut (usize, usize)).cast()) };
        found
    })
}

/// `dl_iterate_phdr`'s callback: stops at the object one of whose loaded segments holds
/// this function, and writes its range into `data` (a `(usize, usize)`).
unsafe extern "C" fn image_of_this_library(
    info: *mut libc::dl_phdr_info,
    _size: libc::size_t,
    data: *mut libc::c_void,
) -> libc::c_int {
    let here = image_of_this_library as *const () as usize;
    // SAFETY: the loader's description of one object, valid during the callback; its
    // program headers are `dlpi_phnum` entries at `dlpi_phdr`.
    let (base, phdrs) = unsafe {
        let info = &*info;
        (info.dlpi_addr as usize, std::slice::from_raw_parts(info.dlpi_phdr, info.dlpi_phnum as usize))
    };
    let loads = || phdrs.iter().filter(|p| p.p_type == libc::PT_LOAD);
    let start = loads().map(|p| base + p.p_vaddr as usize).min().unwrap_or(0);
    let end = loads().map(|p| (base + (p.p_vaddr + p.p_memsz) as usize).next_multiple_of(4096)).max().unwrap_or(0);
    if !(start..end).contains(&here) {
        return 0;
    }
    // SAFETY: `data` is the `(usize, usize)` `own_image` passed.
    unsafe { *data.cast::<(usize, usize)>() = (start, end) };
    1
}

/// Adds a mapping with `bytes` counted to `out` (the caller checked that it is `unowned`).
fn add(out: &mut Unmanaged, m: Mapping) {
    if m.bytes == 0 {
        return;
    }
    out.bytes += m.bytes;
    let by_reason = &mut out.named.by_reason;
    match by_reason.iter_mut().find(|r| r.why == m.why) {
        Some(r) => {
            r.bytes += m.bytes;
            r.mappings += 1;
            if m.bytes > r.largest.1 {
                r.largest = (m.start, m.bytes);
            }
        }
        None => by_reason.push(Reason { why: m.why, bytes: m.bytes, mappings: 1, largest: (m.start, m.bytes) }),
    }
    by_reason.sort_by_key(|r| std::cmp::Reverse(r.bytes));
    let largest = &mut out.named.largest;
    largest.push(m);
    largest.sort_by_key(|m| std::cmp::Reverse(m.bytes));
    largest.truncate(LARGEST);
}

/// Why a scan of the mappings gave no figure.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum NoScan {
    /// `/proc` could not be read, or `PAGEMAP_SCAN` was refused (a kernel before 6.7).
    Refused,
    /// Its lists of mappings could not be allocated ([`SCANS_WITHOUT_MEMORY`]).
    NoMemory,
}

/// Scans given up because their lists of mappings could not be allocated: in a process at
/// the system's limit of mappings (`vm.max_map_count`) no allocation can map new memory,
/// and a list that grew with the mappings aborted the process on the report thread
/// (stress-ng's brk stressor, at 65,530 mappings). The scan waits for the next second;
/// its record says how many were given up, and `uswap run` says so.
static SCANS_WITHOUT_MEMORY: AtomicU64 = AtomicU64::new(0);

/// See [`SCANS_WITHOUT_MEMORY`].
pub fn scans_without_memory() -> u64 {
    SCANS_WITHOUT_MEMORY.load(Ordering::Relaxed)
}

/// Pushes `item` onto `list` if the memory for it can be had ([`NoScan::NoMemory`]).
fn push<T>(list: &mut Vec<T>, item: T) -> Result<(), NoScan> {
    list.try_reserve(1).map_err(|_| NoScan::NoMemory)?;
    list.push(item);
    Ok(())
}

/// `/proc/self/maps`, read a buffer at a time (nothing the size of the file is allocated),
/// each counted mapping measured with `PAGEMAP_SCAN`.
fn measure_by_scan(pagemap: &std::fs::File, min_size_bytes: usize) -> Result<Unmanaged, NoScan> {
    // Before `/proc` is read: see `settle`.
    let owners = uswap::memory_owners();
    let mut out = Unmanaged::default();
    let mut private = Vec::new();
    let mut before = Before::default();
    let mut scanned = Ok(());
    // One line's mapping: measured, and kept for `settle` if it counts.
    let mut scan_mapping = |h: &Header<'_>| -> Result<(), NoScan> {
        let b = std::mem::replace(&mut before, Before::of(h));
        note_special_mappings(&mut out, h);
        let Some(shared_anon) = counted(h) else { return Ok(()) };
        // `[vsyscall]` lies in the kernel's half (the top bit set), which the ioctl refuses.
        if h.start as u64 >= 1 << 63 || !unowned(&owners, h.start, h.end) {
            return Ok(());
        }
        let writable = h.perms.as_bytes().get(1) == Some(&b'w');
        let bytes = match shared_anon && writable && h.end - h.start <= MINCORE_MAX_BYTES {
            true => object_resident_bytes(h.start, h.end),
            false => None,
        };
        let bytes = bytes.or_else(|| scan_resident_bytes(pagemap, h.start, h.end, shared_anon));
        let bytes = bytes.ok_or(NoScan::Refused)?;
        let m = Mapping { start: h.start, len: h.end - h.start, bytes, why: why(h, b, min_size_bytes) };
        match shared_anon {
            true => push(&mut out.shared, (h.object, m)),
            // One with nothing resident adds nothing (`add`).
            false if m.bytes == 0 => Ok(()),
            false => push(&mut private, m),
        }
    };
    let read = uswap::for_each_maps_line::<{ uswap::MAPS_LINE_BYTES }>(|line| {
        if let Some(h) = parse_header(uswap::maps_text(line)) {
            scanned = scan_mapping(&h);
        }
        match scanned {
            Ok(()) => ControlFlow::Continue(()),
            Err(_) => ControlFlow::Break(()),
        }
    });
    match read {
        true => scanned.map(|()| settle(out, private, &owners)),
        false => Err(NoScan::Refused),
    }
}

/// `scanned` (its shared mappings) and its `private` ones, with the mappings left out whose
/// addresses changed owner during the scan: a mapping is counted only where no region of
/// its addresses was registered or dropped between `owners` (taken before `/proc` was read)
/// and now, and none owns it now. Otherwise the scan may have read a managed region's pages
/// as the program's own: a region registered at the addresses of a mapping listed before,
/// or dropped while its mapping was still listed (a program that mapped, wrote and unmapped
/// 128 MiB a few times under a 64 MiB limit was reported in some runs with 58 MiB of such
/// pages, 116 % of its limit, outside the budget). A region dropped before `owners` whose
/// memory is unmapped after it is in neither copy: [`measure`] scans again when a managed
/// unmap overlapped the scan. A mapping left out waits for the next scan, a second later.
fn settle(mut scanned: Unmanaged, private: Vec<Mapping>, owners: &uswap::MemoryOwners) -> Unmanaged {
    let now = uswap::memory_owners();
    let settled = |m: &Mapping| {
        let end = m.start + m.len;
        unowned(&now, m.start, end) && !owners.changed_in(&now, m.start, end)
    };
    scanned.shared.retain(|(_, m)| settled(m));
    for m in private.into_iter().filter(|m| settled(m)) {
        add(&mut scanned, m);
    }
    scanned
}

/// The bytes of the shared memory object that `[start, end)` maps which are in memory,
/// whoever brought them in: `mincore` asks the object (its page cache), not this process's
/// page tables, so every process that maps the same part of an object gets the same figure,
/// the pages all of them touched together (PostgreSQL's backends each touch some of the
/// shared buffers). `None` if `mincore` fails (`uswap::for_each_present_page`).
///
/// Only for writable mappings of at most [`MINCORE_MAX_BYTES`]: `mincore` says every page
/// of a file the caller may not write is resident (a read-only view of another user's
/// `/dev/shm` file would count whole), and it looks up every page of the range, mapped or
/// not, where the scan skips empty page tables. The others count their own resident pages.
fn object_resident_bytes(start: usize, end: usize) -> Option<u64> {
    let mut pages = 0u64;
    uswap::for_each_present_page(start, (end - start) / uswap::PAGE_SIZE, |_| pages += 1).ok()?;
    Some(pages * uswap::PAGE_SIZE as u64)
}

/// The largest shared mapping measured with `mincore` (see [`object_resident_bytes`]): 1 GiB,
/// 262,144 page lookups a second at most per mapping.
const MINCORE_MAX_BYTES: usize = 1 << 30;

/// `struct page_region` and `struct pm_scan_arg` of `<linux/fs.h>`.
#[repr(C)]
#[derive(Clone, Copy, Default)]
struct PageRegion {
    start: u64,
    end: u64,
    categories: u64,
}

#[repr(C)]
#[derive(Default)]
struct PmScanArg {
    size: u64,
    flags: u64,
    start: u64,
    end: u64,
    walk_end: u64,
    vec: u64,
    vec_len: u64,
    max_pages: u64,
    category_inverted: u64,
    category_mask: u64,
    category_anyof_mask: u64,
    return_mask: u64,
}

/// `_IOWR('f', 16, struct pm_scan_arg)`.
const PAGEMAP_SCAN: libc::c_ulong =
    (3 << 30) | ((std::mem::size_of::<PmScanArg>() as libc::c_ulong) << 16) | (0x66 << 8) | 16;
const PAGE_IS_FILE: u64 = 1 << 2;
const PAGE_IS_PRESENT: u64 = 1 << 3;
const PAGE_IS_PFNZERO: u64 = 1 << 5;
/// Regions the kernel may return per call.
const SCAN_REGIONS: usize = 64;

/// Set in a fork child (`fork`'s child handler): its private pages that it still shares
/// with its parent (copy-on-write, never written since the fork) are the parent's, which
/// counts them, and the kernel's memory cgroup charges them once. Counted in every child as
/// well, they made 67 children of stress-ng's mmapfork stressor, each with the 1.3 MiB of
/// its parent's written library data and `.bss`, report 89 MiB outside the budget. A page
/// a fork child writes, or maps anew, is its own (mapped once: `PM_MMAP_EXCLUSIVE`). Left
/// uncounted: pages a fork child made and then shared with a fork child of its own, while
/// both live (neither maps them alone).
static FORK_CHILD: AtomicBool = AtomicBool::new(false);

/// Notes that this process is a fork child (see [`FORK_CHILD`]); an exec starts afresh.
pub fn note_fork_child() {
    FORK_CHILD.store(true, Ordering::Relaxed);
}

/// `PM_MMAP_EXCLUSIVE` of a `/proc/self/pagemap` entry: the page is mapped once.
const PM_MMAP_EXCLUSIVE: u64 = 1 << 56;
/// Entries of `/proc/self/pagemap` read at a time (4 KiB).
const PAGEMAP_ENTRIES_PER_READ: usize = 512;

/// The pages of `[start, end)` (present ones, as the scan found them) that this process
/// maps alone, in bytes; `None` if pagemap cannot be read. Bounded: one read per
/// [`PAGEMAP_ENTRIES_PER_READ`] pages, each moving on or ending it.
fn exclusive_bytes(pagemap: &std::fs::File, start: u64, end: u64) -> Option<u64> {
    use std::os::unix::fs::FileExt;
    let page = uswap::PAGE_SIZE as u64;
    let mut buf = [0u8; PAGEMAP_ENTRIES_PER_READ * 8];
    let (mut at, mut exclusive) = (start / page, 0u64);
    while at < end / page {
        let n = ((end / page - at) as usize).min(PAGEMAP_ENTRIES_PER_READ);
        let got = pagemap.read_at(&mut buf[..n * 8], at * 8).ok()? / 8;
        if got == 0 {
            return None;
        }
        let entries = buf[..got * 8]
            .chunks_exact(8)
            .map(|e| u64::from_ne_bytes([e[0], e[1], e[2], e[3], e[4], e[5], e[6], e[7]]));
        exclusive += entries.filter(|e| e & PM_MMAP_EXCLUSIVE != 0).count() as u64;
        at += got as u64;
    }
    Some(exclusive * page)
}

/// The bytes of `[start, end)` that count: present private anonymous pages (not file pages,
/// not the shared zero page; in a fork child, those it maps alone: [`FORK_CHILD`]), or, in
/// shared anonymous memory, every present page. `None` if the ioctl fails. Bounded: every
/// call moves the walk on, or ends it.
fn scan_resident_bytes(pagemap: &std::fs::File, start: usize, end: usize, shared_anon: bool) -> Option<u64> {
    let mut regions = [PageRegion::default(); SCAN_REGIONS];
    let (mask, inverted) = if shared_anon {
        (PAGE_IS_PRESENT, 0)
    } else {
        (PAGE_IS_PRESENT | PAGE_IS_FILE | PAGE_IS_PFNZERO, PAGE_IS_FILE | PAGE_IS_PFNZERO)
    };
    let exclusive_only = !shared_anon && FORK_CHILD.load(Ordering::Relaxed);
    let mut bytes = 0u64;
    let mut from = start as u64;
    while from < end as u64 {
        let mut arg = PmScanArg {
            size: std::mem::size_of::<PmScanArg>() as u64,
            start: from,
            end: end as u64,
            vec: regions.as_mut_ptr() as u64,
            vec_len: SCAN_REGIONS as u64,
            category_inverted: inverted,
            category_mask: mask,
            return_mask: PAGE_IS_PRESENT,
            ..Default::default()
        };
        // SAFETY: PAGEMAP_SCAN reads `arg` and writes `arg.walk_end` and at most `vec_len`
        // regions into `regions`, both alive for the call; it changes no page (no
        // write-protect flag is set).
        let n = unsafe { libc::ioctl(pagemap.as_raw_fd(), PAGEMAP_SCAN, &mut arg as *mut PmScanArg) };
        if n < 0 {
            return None;
        }
        for r in &regions[..n as usize] {
            bytes += match exclusive_only {
                true => exclusive_bytes(pagemap, r.start, r.end)?,
                false => r.end - r.start,
            };
        }
        if arg.walk_end <= from {
            break;
        }
        from = arg.walk_end;
    }
    Some(bytes)
}

/// Scans `/proc/self/smaps` (the fallback, see the module's comment).
fn measure_by_smaps(min_size_bytes: usize) -> Result<Unmanaged, NoScan> {
    // Before `/proc` is read: see `settle`.
    let owners = uswap::memory_owners();
    let mut scan = SmapsScan {
        owners: &owners,
        min_size_bytes,
        out: Unmanaged::default(),
        private: Vec::new(),
        cur: None,
        before: Before::default(),
        bytes: 0,
        private_dirty: 0,
    };
    let mut scanned = Ok(());
    // A buffer at a time, as the maps: nothing the size of the file is allocated.
    let read = uswap::for_each_line_of::<{ uswap::MAPS_LINE_BYTES }>(c"/proc/self/smaps", |line| {
        scanned = scan.line(uswap::maps_text(line));
        match scanned {
            Ok(()) => ControlFlow::Continue(()),
            Err(_) => ControlFlow::Break(()),
        }
    });
    if !read {
        return Err(NoScan::Refused);
    }
    scanned?;
    scan.flush()?;
    Ok(settle(scan.out, scan.private, &owners))
}

/// [`measure_by_smaps`]'s state between lines.
struct SmapsScan<'a> {
    owners: &'a uswap::MemoryOwners,
    min_size_bytes: usize,
    out: Unmanaged,
    private: Vec<Mapping>,
    /// The mapping being read (its bytes still to come), and whether it is shared
    /// anonymous memory (with its object).
    cur: Option<(Mapping, Option<u64>)>,
    before: Before,
    bytes: u64,
    private_dirty: u64,
}

impl SmapsScan<'_> {
    /// One line of smaps: a mapping's header, or one of its fields.
    fn line(&mut self, line: &str) -> Result<(), NoScan> {
        if let Some(h) = parse_header(line) {
            self.flush()?;
            (self.bytes, self.private_dirty) = (0, 0);
            let b = std::mem::replace(&mut self.before, Before::of(&h));
            note_special_mappings(&mut self.out, &h);
            self.cur = counted(&h).map(|shared_anon| {
                let m =
                    Mapping { start: h.start, len: h.end - h.start, bytes: 0, why: why(&h, b, self.min_size_bytes) };
                (m, shared_anon.then_some(h.object))
            });
            return Ok(());
        }
        let Some((_, shared_anon)) = self.cur else { return Ok(()) };
        let kib = |kb: &str| kb.trim().trim_end_matches("kB").trim().parse::<u64>().unwrap_or(0) * 1024;
        // In a fork child, pages it maps alone ([`FORK_CHILD`]): smaps puts them in
        // `Private_Dirty` (before `Anonymous`), which also holds written file pages.
        if let (None, Some(kb)) = (shared_anon, line.strip_prefix("Private_Dirty:")) {
            self.private_dirty = kib(kb);
        }
        let field = if shared_anon.is_some() { "Rss:" } else { "Anonymous:" };
        if let Some(kb) = line.strip_prefix(field) {
            self.bytes = match shared_anon.is_none() && FORK_CHILD.load(Ordering::Relaxed) {
                true => kib(kb).min(self.private_dirty),
                false => kib(kb),
            };
        }
        Ok(())
    }

    /// Keeps the mapping read so far, if it counts, with its resident pages (`Rss`, as the
    /// scan counts a read-only or larger mapping; `Anonymous` for private memory).
    fn flush(&mut self) -> Result<(), NoScan> {
        match self.cur.take().filter(|(m, _)| unowned(self.owners, m.start, m.start + m.len)) {
            Some((m, Some(object))) => push(&mut self.out.shared, (object, Mapping { bytes: self.bytes, ..m })),
            Some((m, None)) => push(&mut self.private, Mapping { bytes: self.bytes, ..m }),
            None => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_shared_object_is_counted_once_per_process_and_named_by_its_first_mapping() {
        let h = parse_header("7f00a000-7f00c000 rw-s 00000000 00:01 2052 /dev/zero (deleted)").unwrap();
        assert_eq!(h.object, (1 << 40) ^ 2052);
        let sysv = parse_header("7f00a000-7f00c000 rw-s 00000000 00:01 2052 /SYSV0052e2c1 (deleted)").unwrap();
        assert_ne!(sysv.object, h.object, "a shmid is not an inode");
        let posix = parse_header("7f00a000-7f00c000 rw-s 00000000 00:19 7 /dev/shm/psm_5f1c2a (deleted)").unwrap();
        assert_eq!(counted(&posix), Some(true), "POSIX shared memory is shared memory");
        let file = parse_header("7f00a000-7f00c000 rw-s 00000000 fe:00 7 /var/lib/data.db").unwrap();
        assert_eq!(counted(&file), None, "a file on a disk is not");
        assert_eq!(parse_header("7f00a000-7f00c000 rw-p 00000000 00:00 0 ").unwrap().object, 0);
        let m = |start, bytes| Mapping { start, len: 1 << 20, bytes, why: "shared" };
        let mut u = Unmanaged { bytes: 5, ..Default::default() };
        u.shared = vec![(7, m(0x1000, 4096)), (0, m(0x2000, 100)), (7, m(0x3000, 8192)), (9, m(0x4000, 1))];
        assert_eq!(u.shared_objects(), Some(vec![7, 7, 9]));
        let mut asked = Vec::new();
        u.count_shared(|object, bytes| {
            asked.push((object, bytes));
            if object == 9 {
                0
            } else {
                bytes
            }
        });
        assert_eq!(asked, vec![(7, 8192), (9, 1)], "each object asked once, with its largest mapping's bytes");
        assert_eq!(u.bytes, 5 + 8192 + 100);
        let named: Vec<usize> = u.named.largest.iter().map(|m| m.start).collect();
        assert_eq!(named, vec![0x1000, 0x2000], "named by its first mapping; one counted elsewhere is not named");
        let shared = Reason { why: "shared", bytes: 8192 + 100, mappings: 2, largest: (0x1000, 8192) };
        assert_eq!(u.named.by_reason, vec![shared], "its reason counts what was counted, mapping by mapping");
    }

    /// Mappings of no known object are each counted apart; an object is asked once, with
    /// its largest mapping's bytes, and named by its lowest mapping, whatever the order of
    /// the objects' keys against their addresses.
    #[test]
    fn unknown_objects_count_apart_and_each_object_is_named_by_its_lowest_mapping() {
        let m = |start, bytes| Mapping { start, len: 4096, bytes, why: "shared" };
        let shared = vec![
            (9, m(0x1000, 10)),
            (0, m(0x2000, 20)),
            (3, m(0x3000, 30)),
            (0, m(0x4000, 40)),
            (9, m(0x5000, 50)),
            (3, m(0x6000, 5)),
        ];
        let mut u = Unmanaged { shared, ..Default::default() };
        let mut asked = Vec::new();
        u.count_shared(|object, bytes| {
            asked.push((object, bytes));
            bytes
        });
        asked.sort_unstable();
        assert_eq!(asked, vec![(3, 30), (9, 50)]);
        assert_eq!(u.bytes, 20 + 40 + 30 + 50);
        let mut named: Vec<(usize, u64)> = u.named.largest.iter().map(|m| (m.start, m.bytes)).collect();
        named.sort_unstable();
        assert_eq!(named, vec![(0x1000, 50), (0x2000, 20), (0x3000, 30), (0x4000, 40)]);
    }

    #[test]
    fn headers_parse_with_and_without_a_path() {
        let h = parse_header("7f00a000-7f00c000 rw-p 00000000 00:00 0 ").unwrap();
        assert_eq!((h.start, h.end, h.perms, h.path), (0x7f00a000, 0x7f00c000, "rw-p", ""));
        let h = parse_header("55d0-55e0 rw-s 00000000 00:01 12 /memfd:pool (deleted)").unwrap();
        assert_eq!(h.path, "/memfd:pool (deleted)");
        assert!(why(&h, Before::default(), 1 << 16).starts_with("shared memory"));
        assert!(parse_header("Rss:                 4 kB").is_none());
    }

    /// A non-PIE program's `.bss` (cc1's: 1 MiB after its data, at a low address) is named
    /// as such, not as memory mapped behind uswap's back.
    #[test]
    fn the_zero_filled_part_of_a_files_data_is_named() {
        let data =
            parse_header("023c6000-023cd000 rw-p 01fc5000 fe:00 4242 /usr/lib/gcc/x86_64-linux-gnu/12/cc1").unwrap();
        let bss = parse_header("023cd000-024d3000 rw-p 00000000 00:00 0 ").unwrap();
        assert!(why(&bss, Before::of(&data), 1 << 16).contains(".bss"));
        let apart = parse_header("023ce000-024d3000 rw-p 00000000 00:00 0 ").unwrap();
        assert!(!why(&apart, Before::of(&data), 1 << 16).contains(".bss"), "not next to the data");
        let text =
            parse_header("00400000-023cd000 r-xp 00000000 fe:00 4242 /usr/lib/gcc/x86_64-linux-gnu/12/cc1").unwrap();
        assert!(!why(&bss, Before::of(&text), 1 << 16).contains(".bss"), "after code, not data");
    }

    /// A read-write anonymous mapping of `len` bytes (`flags` says private or shared), its
    /// first `touched` bytes written. Mapped with the raw system call: this library's own
    /// `mmap`, started in the test binary by its constructor, would make it a managed region.
    fn touched_mapping(flags: libc::c_int, len: usize, touched: usize) -> *mut libc::c_void {
        let flags = flags | libc::MAP_ANONYMOUS;
        let p = crate::real::sys_mmap(std::ptr::null_mut(), len, libc::PROT_READ | libc::PROT_WRITE, flags, -1, 0);
        assert_ne!(p, libc::MAP_FAILED);
        assert!(touched <= len);
        // SAFETY: writes inside the mapping just made.
        unsafe { std::ptr::write_bytes(p as *mut u8, 1, touched) };
        p
    }

    /// Memory the scan must see: a private anonymous mapping outside every region, touched.
    #[test]
    fn a_touched_private_mapping_is_counted_with_its_reason() {
        let len = 8 << 20;
        let p = touched_mapping(libc::MAP_PRIVATE, len, len);
        let u = measure(64 << 10).expect("maps and pagemap");
        assert!(u.bytes >= len as u64, "{u:?}");
        // The kernel may have merged it with a neighbour: the mapping holding it.
        let a = p as usize;
        assert!(u.named.largest.iter().any(|m| m.start <= a && a < m.start + m.len && m.bytes >= len as u64), "{u:?}");
        crate::real::sys_munmap(p, len);
    }

    /// Shared anonymous memory counts by its resident pages, exactly the ones touched, and
    /// names its reason; the untouched rest of it counts nothing.
    #[test]
    fn shared_anonymous_memory_counts_the_pages_touched() {
        let len = 4 << 20;
        let touched = 1 << 20;
        let p = touched_mapping(libc::MAP_SHARED, len, touched);
        let mut u = measure(64 << 10).expect("maps and pagemap");
        let mut by_smaps = measure_by_smaps(64 << 10).expect("smaps");
        assert_eq!(u.shared_objects(), by_smaps.shared_objects(), "both name the same objects");
        u.count_shared(|_, bytes| bytes);
        by_smaps.count_shared(|_, bytes| bytes);
        assert!(
            by_smaps.named.largest.iter().any(|s| s.start == p as usize && s.bytes == touched as u64),
            "{by_smaps:?}"
        );
        let m = u.named.largest.iter().find(|m| m.start == p as usize);
        let m = m.unwrap_or_else(|| panic!("the shared mapping at {p:?} is not among the largest: {u:?}"));
        // (Shared memory may be backed by huge pages: at least what was touched, at most all.)
        assert!(m.len == len && (touched as u64..=len as u64).contains(&m.bytes), "{u:?}");
        assert!(m.why.starts_with("shared memory"), "{m:?}");
        crate::real::sys_munmap(p, len);
    }

    /// The scan (not the smaps fallback) runs here, and counts a private mapping's written
    /// pages exactly: pages only read (the shared zero page) and pages never touched count
    /// nothing. (Guard pages around it keep the kernel from merging it with a neighbour.)
    #[test]
    fn the_scan_counts_written_pages_not_read_ones() {
        let (guard, len, written) = (1 << 20, 4 << 20, 1 << 20);
        let flags = libc::MAP_PRIVATE | libc::MAP_ANONYMOUS;
        let base = crate::real::sys_mmap(std::ptr::null_mut(), len + 2 * guard, libc::PROT_NONE, flags, -1, 0);
        assert_ne!(base, libc::MAP_FAILED);
        let p = (base as usize + guard) as *mut u8;
        // SAFETY: the middle of the reservation just made: made read-write, kept out of
        // huge pages (so that what is written is what counts), read all through, written in
        // its first megabyte.
        unsafe {
            assert_eq!(libc::mprotect(p.cast(), len, libc::PROT_READ | libc::PROT_WRITE), 0);
            assert_eq!(libc::madvise(p.cast(), len, libc::MADV_NOHUGEPAGE), 0);
            for off in (0..len).step_by(uswap::PAGE_SIZE) {
                std::ptr::read_volatile(p.add(off));
            }
            std::ptr::write_bytes(p, 1, written);
        }
        let pagemap = std::fs::File::open("/proc/self/pagemap").expect("open /proc/self/pagemap");
        let u = measure_by_scan(&pagemap, 64 << 10).expect("PAGEMAP_SCAN (Linux 6.7 and later)");
        let m = u.named.largest.iter().find(|m| m.start == p as usize);
        assert_eq!(m.map(|m| (m.len, m.bytes)), Some((len, written as u64)), "{u:?}");
        crate::real::sys_munmap(base, len + 2 * guard);
    }
}
