//! One resident limit for several processes: a charge in a shared file.
//!
//! `uswap run` gives a program and everything it starts one budget, as a memory cgroup
//! does. Each process has its own pager (page tables and userfaultfd are per process), so
//! the budget is a [`SharedCharge`] that every pager charges as well as its own counter
//! ([`PagerBuilder::shared_charge`](crate::PagerBuilder::shared_charge)): a page comes in
//! only while the sum stays within the limit. Reclaim stays per process: a pager cannot
//! move another process's pages (memcg would reclaim the coldest pages of the whole tree).
//! So above the high watermark the pagers that hold at least an average share of the charge
//! (its pages over `nr_processes`; every pager, for a charge made by hand) reclaim their
//! own pages, in their faults or in the background while idle, and so does a pager whose
//! application took no fault for a few seconds, whatever it holds. A small process that
//! faults (a shell, a load generator) is not made to evict its own few pages, which it uses
//! all the time; at the limit itself everyone reclaims, or waits for the others.
//!
//! The segment is a file mapped `MAP_SHARED` by every process: a header, the charge, and a
//! table of [`MAX_PROCESSES`] slots, one per live pager, holding its pid and its own charge.
//! A process that dies without giving its charge back (killed, or replaced by exec) is found
//! by pid: an exec'd image claims its own pid's old slot and returns the old charge; a
//! dead pid's slot is returned by [`ChargeSegment::sweep_dead`], which every process runs
//! at start and periodically. All fields are atomics; there is no lock.
//!
//! The segment also adds up the compressed pools of the tree ([`PoolShare`]): memory outside
//! the limit, which the tree's figures (`uswap run`'s `pool_peak_bytes`) must not count once
//! per process at different moments, and which stays within the pool's cap for the tree as a
//! whole. The same goes for the storage of the first [`TREE_DEVICES`] devices
//! ([`DeviceShare`]): a device's size is the tree's, not each process's. A slot keeps its
//! process's share of each, returned with the charge. A table of shared memory objects
//! says which process counts each in the tree's unmanaged memory
//! ([`ChargeSegment::count_shared_object`]), so that a page mapped by many processes is
//! counted once.

use std::fs::OpenOptions;
use std::io;
use std::os::unix::fs::OpenOptionsExt;
use std::os::unix::io::AsRawFd;
use std::path::Path;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

/// A resident charge several pagers share (see [`crate::PagerBuilder::shared_charge`]): plain
/// atomics in a `#[repr(C)]` block, so that it can live in memory shared between processes.
#[repr(C)]
#[derive(Debug, Default)]
pub struct SharedCharge {
    /// Pages charged by all the pagers together.
    pub resident_pages: AtomicUsize,
    /// Their common limit, in pages.
    pub limit_pages: AtomicUsize,
    /// The most `resident_pages` has been.
    pub resident_peak_pages: AtomicUsize,
    /// Memory the pagers' compressed pools hold together (see [`PoolShare`]).
    pub pool_bytes: AtomicU64,
    /// The most `pool_bytes` has been.
    pub pool_peak_bytes: AtomicU64,
    /// Processes that hold a slot of a [`ChargeSegment`] (0 for a charge made by hand): what
    /// a pager compares its own charge with, to tell whether it holds a share of the tree's
    /// memory worth reclaiming for the tree (see the module's comment).
    pub nr_processes: AtomicUsize,
    /// The tree's memory stalls: some thread of some process stalled (`crate::pressure`).
    pub stall: crate::pressure::StallClock,
    /// Bytes of each of the first [`TREE_DEVICES`] devices (by their place in the device
    /// list, which every process of a tree shares) that the tree's processes hold together:
    /// whole clusters of slots that hold data (see [`DeviceShare`]).
    pub device_bytes: [AtomicU64; TREE_DEVICES],
    /// The most `device_bytes` has been, per device.
    pub device_peak_bytes: [AtomicU64; TREE_DEVICES],
    /// Anonymous memory of the tree's processes that no pager manages, as each last measured
    /// it (`uswap run`'s preload, once a second and at exit, when it gives its share back):
    /// the tree's at one moment, where summing each process's own peak counted short-lived
    /// processes that never lived at once.
    pub unmanaged_bytes: AtomicU64,
    /// The most `unmanaged_bytes` has been.
    pub unmanaged_peak_bytes: AtomicU64,
    /// Where an automatic budget is about to lower `limit_pages` to (0: nowhere): the
    /// pagers' background reclaimers bring the charge down to it first, so that the
    /// programs' faults do not reclaim for the probe (memcg's `memory.high` set below
    /// `memory.max`; see `uswap run --auto`).
    pub goal_pages: AtomicUsize,
    /// What the idle aging scans of the tree's processes found, together: what `--auto`'s
    /// law reads to follow a working set that shrank (`crate::budget::Budget`).
    pub idle_sample: crate::budget::IdleSample,
}

impl SharedCharge {
    /// Sets the process's share of the tree's unmanaged memory (kept in `own`, its slot's)
    /// to `bytes`, and the tree's sum and peak with it.
    pub fn note_unmanaged(&self, own: &AtomicU64, bytes: u64) {
        let old = own.swap(bytes, Ordering::AcqRel);
        if bytes >= old {
            let now = self.unmanaged_bytes.fetch_add(bytes - old, Ordering::AcqRel) + (bytes - old);
            self.unmanaged_peak_bytes.fetch_max(now, Ordering::AcqRel);
        } else {
            self.unmanaged_bytes.fetch_sub(old - bytes, Ordering::AcqRel);
        }
    }

    /// Sets the charge a process keeps in `own` (its slot's) to `pages`, and the tree's sum
    /// and peak with it: for memory a process holds with no pager to charge it page by page
    /// (`uswap run`'s preload charges the heap of a process waiting for its pager).
    pub fn set_charge_without_pager(&self, own: &AtomicUsize, pages: usize) {
        let old = own.swap(pages, Ordering::AcqRel);
        if pages >= old {
            let now = self.resident_pages.fetch_add(pages - old, Ordering::AcqRel) + (pages - old);
            self.resident_peak_pages.fetch_max(now, Ordering::AcqRel);
        } else {
            self.resident_pages.fetch_sub(old - pages, Ordering::AcqRel);
        }
    }

    /// What the background reclaimers reclaim towards: the limit, or a goal below it.
    pub fn reclaim_goal_pages(&self) -> usize {
        let limit = self.limit_pages.load(Ordering::Acquire);
        match self.goal_pages.load(Ordering::Acquire) {
            0 => limit,
            goal => goal.min(limit),
        }
    }
}

/// Devices of a tree whose size is the tree's (the first ones of the device list); a
/// device after them is sized per process.
pub const TREE_DEVICES: usize = 4;

/// Where a compressed pool reports the memory it takes and gives back: the tree's total
/// (and its peak) in a [`SharedCharge`], and the process's own share, if it has a slot to
/// keep it in. Only the process that made the pool reports: a fork child's copy of its
/// parent's pool (read, never grown) stays silent. Called when a pool takes or frees a
/// whole chunk (64 KiB): no lock, no allocation, safe in a signal handler.
#[derive(Debug, Clone, Copy)]
pub struct PoolShare {
    bytes: TreeBytes,
}

impl PoolShare {
    pub fn new(tree: &'static SharedCharge, own: Option<&'static AtomicU64>) -> PoolShare {
        PoolShare { bytes: TreeBytes::new(&tree.pool_bytes, &tree.pool_peak_bytes, own) }
    }

    pub fn grow(&self, bytes: u64) {
        self.bytes.try_grow(bytes, u64::MAX);
    }

    /// What the tree's pools hold now (0 in a fork child's copy, which reports nothing).
    pub fn tree_bytes(&self) -> u64 {
        self.bytes.tree_now()
    }

    /// Takes `bytes` more for the pool if the tree's pools stay within `cap_bytes` (the
    /// pool's own cap, the same in every process of the tree: the cap is the tree's);
    /// false, taking nothing, if they would not.
    pub fn try_grow(&self, bytes: u64, cap_bytes: u64) -> bool {
        self.bytes.try_grow(bytes, cap_bytes)
    }

    pub fn shrink(&self, bytes: u64) {
        self.bytes.shrink(bytes);
    }
}

/// A sum of the tree's (bytes of its pools, or of one device) with its peak, and the
/// process's own share of it, kept in its slot if it has one. Only the process that made
/// the share reports: a fork child's copy of its parent's pool or device (read, never
/// grown) stays silent. No lock, no allocation: safe in a signal handler.
#[derive(Debug, Clone, Copy)]
struct TreeBytes {
    tree: &'static AtomicU64,
    peak: &'static AtomicU64,
    own: Option<&'static AtomicU64>,
    pid: u32,
}

impl TreeBytes {
    fn new(tree: &'static AtomicU64, peak: &'static AtomicU64, own: Option<&'static AtomicU64>) -> TreeBytes {
        TreeBytes { tree, peak, own, pid: std::process::id() }
    }

    fn reports(&self) -> bool {
        // SAFETY: getpid has no preconditions and is async-signal-safe.
        (unsafe { libc::getpid() }) as u32 == self.pid
    }

    fn tree_now(&self) -> u64 {
        if !self.reports() {
            return 0;
        }
        self.tree.load(Ordering::Relaxed)
    }

    /// Adds `bytes` if the tree's sum stays within `cap_bytes`; false, adding nothing, if it
    /// would not. A copy that does not report takes them (true).
    fn try_grow(&self, bytes: u64, cap_bytes: u64) -> bool {
        if !self.reports() {
            return true;
        }
        let now = self.tree.fetch_add(bytes, Ordering::Relaxed) + bytes;
        if now > cap_bytes {
            self.tree.fetch_sub(bytes, Ordering::Relaxed);
            return false;
        }
        self.peak.fetch_max(now, Ordering::Relaxed);
        if let Some(own) = self.own {
            own.fetch_add(bytes, Ordering::Relaxed);
        }
        true
    }

    fn shrink(&self, bytes: u64) {
        if !self.reports() {
            return;
        }
        if let Some(own) = self.own {
            own.fetch_sub(bytes, Ordering::Relaxed);
        }
        self.tree.fetch_sub(bytes, Ordering::Relaxed);
    }
}

/// Where a device reports the storage its slots take, against the tree's capacity for it:
/// one device of a `uswap run` tree is one device for all its processes, as one swap file
/// is for the kernel. Each process has a device of its own (a sparse file, a pool, a Redis
/// key space), as large as the device's size, so no process is refused for lack of room
/// the tree has; what the processes hold together stays within that size. The unit is 16
/// slots of a cluster (`swap::cluster_allocator`), from its first slot to the cluster's
/// discard (a file device punches the cluster out then), so the disk a file device takes
/// is at most the units charged here. Called with the allocator's cluster lock held: no lock, no allocation,
/// safe in a signal handler. A fork child's copy of its parent's device (read, never
/// grown) stays silent, as for [`PoolShare`].
#[derive(Debug, Clone, Copy)]
pub struct DeviceShare {
    bytes: TreeBytes,
    cap_bytes: u64,
}

impl DeviceShare {
    /// The share of device `index` of the list (none past [`TREE_DEVICES`]) of `cap_bytes`.
    pub fn new(
        tree: &'static SharedCharge,
        index: usize,
        own: Option<&'static [AtomicU64; TREE_DEVICES]>,
        cap_bytes: u64,
    ) -> Option<DeviceShare> {
        (index < TREE_DEVICES).then(|| DeviceShare {
            bytes: TreeBytes::new(&tree.device_bytes[index], &tree.device_peak_bytes[index], own.map(|o| &o[index])),
            cap_bytes,
        })
    }

    /// Takes `bytes` if the tree stays within the device's size; false, taking nothing, if
    /// it would not.
    pub fn try_grow(&self, bytes: u64) -> bool {
        self.bytes.try_grow(bytes, self.cap_bytes)
    }

    pub fn shrink(&self, bytes: u64) {
        self.bytes.shrink(bytes);
    }

    /// Whether the tree holds more than half the device (the kernel's `vm_swap_full`).
    pub fn over_half(&self) -> bool {
        self.bytes.tree_now() > self.cap_bytes / 2
    }
}

/// A process's slot in a segment: its own charge, and its share of the tree's pools.
#[derive(Debug, Clone, Copy)]
pub struct OwnSlot {
    pub pages: &'static AtomicUsize,
    pub pool_bytes: &'static AtomicU64,
    pub device_bytes: &'static [AtomicU64; TREE_DEVICES],
    /// Its share of the tree's unmanaged memory ([`SharedCharge::note_unmanaged`]).
    pub unmanaged_bytes: &'static AtomicU64,
    /// Its place in the segment's table of slots: who counts a shared object
    /// ([`ChargeSegment::count_shared_object`]).
    pub index: usize,
}

/// A pager's own charge: its own counter, or one in memory it shares with others.
pub(crate) enum ChargeCell {
    Own(AtomicUsize),
    Shared(&'static AtomicUsize),
}

impl std::ops::Deref for ChargeCell {
    type Target = AtomicUsize;
    fn deref(&self) -> &AtomicUsize {
        match self {
            ChargeCell::Own(a) => a,
            ChargeCell::Shared(a) => a,
        }
    }
}

/// The segment's file name in a `uswap run` directory (`USWAP_STATS_DIR`).
pub const SEGMENT_FILE: &str = "charge";

/// The start of the name of the file a process of the tree that could not be managed leaves
/// beside the segment (`refused-<pid>.txt`, holding what it said on stderr): `uswap run` fails
/// when it finds one, even if the process was one whose exit status nobody reads.
pub const REFUSAL_PREFIX: &str = "refused-";

/// The start of the name of the file a process of the tree leaves when it execs (or spawns)
/// an image that will not load the preload library (`escaped-<pid>.txt`: the path, and why):
/// a process outside the budget, which `uswap run` names once the program ended.
pub const ESCAPE_PREFIX: &str = "escaped-";

/// The start of the name of the file a process of the tree leaves when it asked to load a
/// library with `RTLD_DEEPBIND`, which the preload library loads without it
/// (`deep-bind-<pid>.txt`: the program and the library): said once by `uswap run`.
pub const DEEP_BIND_PREFIX: &str = "deep-bind-";

/// Processes that can hold a slot at once; more run under their own limit only.
pub const MAX_PROCESSES: usize = 4096;

const MAGIC: u64 = u64::from_le_bytes(*b"uswapchg");
const VERSION: u64 = 11;

/// This process's pid namespace: the low 32 bits of `/proc/self/ns/pid`'s inode (0 where
/// `/proc` is not mounted), read once per process and kept with the pid it was read in (a
/// fork child, maybe of another namespace after `unshare -p`, reads its own), so that a
/// `/proc` that goes later (a chroot) does not change a process's key or file names. A stat
/// of a literal path and two atomics: no allocation, no lock (`leave` runs in `_exit`).
fn own_pid_namespace() -> u64 {
    static READ_IN_PID: AtomicU64 = AtomicU64::new(0);
    static NS: AtomicU64 = AtomicU64::new(0);
    // SAFETY: getpid has no failure mode.
    let pid = unsafe { libc::getpid() } as u64;
    if READ_IN_PID.load(Ordering::Acquire) == pid {
        return NS.load(Ordering::Acquire);
    }
    let mut st = std::mem::MaybeUninit::<libc::stat>::zeroed();
    // SAFETY: stat of a NUL-terminated path into a buffer of its size.
    let ns = if unsafe { libc::stat(c"/proc/self/ns/pid".as_ptr(), st.as_mut_ptr()) } != 0 {
        0
    } else {
        // SAFETY: stat filled it (and it was zeroed before).
        unsafe { st.assume_init() }.st_ino & 0xffff_ffff
    };
    // Two threads reading at once store the same value.
    NS.store(ns, Ordering::Release);
    READ_IN_PID.store(pid, Ordering::Release);
    ns
}

/// The key a slot holds for process `pid` of this process's pid namespace: a tree may span
/// namespaces (`unshare -p -f`, bubblewrap), where two processes have the same pid, and a
/// pid means another process, or none, to a process of another namespace.
fn slot_key(pid: u32) -> u64 {
    own_pid_namespace() << 32 | pid as u64
}

#[repr(C)]
struct Slot {
    /// 0: free; `u64::MAX`: being given back; else [`slot_key`] of its process.
    pid: AtomicU64,
    own_pages: AtomicUsize,
    own_pool_bytes: AtomicU64,
    own_device_bytes: [AtomicU64; TREE_DEVICES],
    own_unmanaged_bytes: AtomicU64,
}

#[repr(C)]
struct Segment {
    magic: AtomicU64,
    version: AtomicU64,
    /// The pid namespace of the process that made it (`uswap run`'s): see [`ChargeSegment::file_tag`].
    creator_pid_namespace: AtomicU64,
    charge: SharedCharge,
    slots: [Slot; MAX_PROCESSES],
    shared_objects: [SharedObject; SHARED_OBJECTS],
}

/// Shared memory objects the tree counts once (see [`ChargeSegment::count_shared_object`]).
pub const SHARED_OBJECTS: usize = 128;

/// One shared memory object of the tree's processes, and who counts it.
#[repr(C)]
struct SharedObject {
    /// 0: free; else the object's identity (its device and inode, see
    /// [`ChargeSegment::count_shared_object`]). Set when the entry is taken, free or from
    /// an object no process counts any more.
    object: AtomicU64,
    /// 1 + the index of the slot of the process that counts it; 0: nobody (its counter
    /// let go of it, or left the tree).
    counter: AtomicUsize,
    /// The most resident bytes a process measured of it since its counter last read this.
    bytes_seen: AtomicU64,
}

/// A mapped charge segment. Mapped for the life of the process (pagers hold `'static`
/// references into it), so it is never unmapped.
pub struct ChargeSegment {
    seg: &'static Segment,
}

/// Gives the new segment file its blocks now. A page of a shared file mapping gets its
/// block when it is first written, and on a full file system that write is a SIGBUS: a
/// program that filled `/tmp` for a moment (stress-ng's resources stressor, huge
/// `fallocate`s) died of SIGBUS when one of its processes took a slot on a page of the
/// segment not written before. Written as zeros where the file system has no
/// `fallocate`.
fn allocate_blocks(f: &std::fs::File, len: usize) -> io::Result<()> {
    // Bounded: only EINTR repeats, and each one is a signal delivered to this thread.
    loop {
        // SAFETY: fallocate on our open descriptor, mode 0: allocates, changes no byte.
        if unsafe { libc::fallocate(f.as_raw_fd(), 0, 0, len as libc::off_t) } == 0 {
            return Ok(());
        }
        let e = io::Error::last_os_error();
        match e.raw_os_error() {
            Some(libc::EINTR) => continue,
            // No fallocate in this file system (or a sandbox forbids the call).
            Some(libc::EOPNOTSUPP | libc::ENOSYS) => break,
            _ => return Err(e),
        }
    }
    use std::os::unix::fs::FileExt;
    f.write_all_at(&vec![0u8; len], 0)
}

fn map(path: &Path, create_limit_bytes: Option<u64>) -> io::Result<&'static Segment> {
    let mut opts = OpenOptions::new();
    opts.read(true).write(true).mode(0o600);
    if create_limit_bytes.is_some() {
        opts.create_new(true);
    }
    let f = opts.open(path)?;
    let len = std::mem::size_of::<Segment>();
    if create_limit_bytes.is_some() {
        // Readable and writable by its owner whatever the umask (0277 left it 0400, and
        // no process of the tree could open it).
        use std::os::unix::fs::PermissionsExt;
        f.set_permissions(std::fs::Permissions::from_mode(0o600))?;
        f.set_len(len as u64)?;
        allocate_blocks(&f, len)?;
    } else if f.metadata()?.len() < len as u64 {
        return Err(io::Error::new(io::ErrorKind::InvalidData, "charge segment too short"));
    }
    // SAFETY: maps `len` bytes of the file shared; the kernel picks the address. The mapping
    // is never unmapped, so the 'static reference below stays valid; every field of
    // Segment is an atomic, valid for any bytes (a new file reads as zeros).
    let p = unsafe {
        libc::mmap(std::ptr::null_mut(), len, libc::PROT_READ | libc::PROT_WRITE, libc::MAP_SHARED, f.as_raw_fd(), 0)
    };
    if p == libc::MAP_FAILED {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: see above: a live, suitably aligned (page-aligned) mapping of a Segment.
    Ok(unsafe { &*(p as *const Segment) })
}

impl ChargeSegment {
    /// Creates the segment file (it must not exist) with the common limit.
    pub fn create(path: &Path, limit_bytes: u64) -> io::Result<ChargeSegment> {
        let seg = map(path, Some(limit_bytes))?;
        seg.charge.limit_pages.store((limit_bytes / crate::PAGE_SIZE as u64) as usize, Ordering::Release);
        seg.creator_pid_namespace.store(own_pid_namespace(), Ordering::Release);
        seg.version.store(VERSION, Ordering::Release);
        seg.magic.store(MAGIC, Ordering::Release);
        Ok(ChargeSegment { seg })
    }

    /// What names process `pid`'s files in the tree's directory (its record, its notes):
    /// the pid, as the segment's maker sees pids; with the pid namespace after it
    /// (`PID.nsNS`) for a process of another namespace, where another process of the tree
    /// may have the same pid.
    pub fn file_tag(&self, pid: u32) -> String {
        let ns = own_pid_namespace();
        if ns == self.seg.creator_pid_namespace.load(Ordering::Acquire) {
            pid.to_string()
        } else {
            format!("{pid}.ns{ns}")
        }
    }

    /// Opens a segment another process created.
    pub fn open(path: &Path) -> io::Result<ChargeSegment> {
        let seg = map(path, None)?;
        if seg.magic.load(Ordering::Acquire) != MAGIC || seg.version.load(Ordering::Acquire) != VERSION {
            return Err(io::Error::new(io::ErrorKind::InvalidData, "not a uswap charge segment (or another version)"));
        }
        Ok(ChargeSegment { seg })
    }

    pub fn charge(&self) -> &'static SharedCharge {
        &self.seg.charge
    }

    /// The most pages resident at once over all the processes.
    pub fn resident_peak_pages(&self) -> usize {
        self.seg.charge.resident_peak_pages.load(Ordering::Acquire)
    }

    /// The most memory the tree's compressed pools held at once.
    pub fn pool_peak_bytes(&self) -> u64 {
        self.seg.charge.pool_peak_bytes.load(Ordering::Acquire)
    }

    /// Seconds during which some thread of some process of the tree stalled on memory
    /// (`crate::pressure`), up to now.
    pub fn stall_seconds(&self) -> f64 {
        self.seg.charge.stall.total_us(crate::pressure::now_us()) as f64 / 1e6
    }

    /// Gives a slot's charge (and its share of the pools) back.
    fn release(&self, slot: &Slot) {
        let own = slot.own_pages.swap(0, Ordering::AcqRel);
        self.seg.charge.resident_pages.fetch_sub(own, Ordering::AcqRel);
        let pool = slot.own_pool_bytes.swap(0, Ordering::AcqRel);
        self.seg.charge.pool_bytes.fetch_sub(pool, Ordering::AcqRel);
        for (own, tree) in slot.own_device_bytes.iter().zip(&self.seg.charge.device_bytes) {
            tree.fetch_sub(own.swap(0, Ordering::AcqRel), Ordering::AcqRel);
        }
        self.seg.charge.note_unmanaged(&slot.own_unmanaged_bytes, 0);
        let index = (slot as *const Slot as usize - self.seg.slots.as_ptr() as usize) / std::mem::size_of::<Slot>();
        for o in &self.seg.shared_objects {
            let _ = o.counter.compare_exchange(index + 1, 0, Ordering::AcqRel, Ordering::Acquire);
        }
    }

    /// How much of a shared memory object this process is to count in the tree's
    /// unmanaged memory, given that it has `bytes` of it resident: the most any process of
    /// the tree has had resident since the last call, if this process is the one that
    /// counts the object; 0 if another live process of the tree counts it. A page shared by
    /// every process that maps it was counted by each (PostgreSQL's shared buffers, once
    /// per process of the server: 121 MiB said for 18), where the kernel charges it once.
    ///
    /// `object` names it by device and inode (not 0). The first process to meet an object
    /// counts it until it no longer maps it ([`Self::let_go_of_shared_objects`]) or leaves
    /// the tree; then the next to meet it does. With every entry of the table counted by
    /// some process ([`SHARED_OBJECTS`] objects mapped at once), every process counts what
    /// it maps, as before. No lock. A process lets go of an object only after its
    /// share without it is in the tree's sum, and its claims go with its slot only after
    /// its share went, and of two processes that meet an object at once one takes it: the
    /// sum never holds an object twice (its peak would keep that for good).
    pub fn count_shared_object(&self, own: &OwnSlot, object: u64, bytes: u64) -> u64 {
        assert_ne!(object, 0, "0 marks a free entry");
        let me = own.index + 1;
        let Some(o) = self.shared_object_entry(object, me) else { return bytes };
        o.bytes_seen.fetch_max(bytes, Ordering::AcqRel);
        let counter = o.counter.load(Ordering::Acquire);
        let taken = counter == me
            || ((counter == 0 || !self.slot_live(counter - 1))
                && o.counter.compare_exchange(counter, me, Ordering::AcqRel, Ordering::Acquire).is_ok());
        if !taken {
            return 0;
        }
        o.bytes_seen.swap(bytes, Ordering::AcqRel).max(bytes)
    }

    /// Lets go of the shared objects this process counted that are not in `mapped` (it
    /// unmapped them): the next process of the tree to meet one counts it.
    pub fn let_go_of_shared_objects(&self, own: &OwnSlot, mapped: &[u64]) {
        for o in &self.seg.shared_objects {
            if o.counter.load(Ordering::Acquire) == own.index + 1 && !mapped.contains(&o.object.load(Ordering::Acquire))
            {
                let _ = o.counter.compare_exchange(own.index + 1, 0, Ordering::AcqRel, Ordering::Acquire);
            }
        }
    }

    /// The table's entry for `object`, taken if it has none: a free one, or else one that
    /// no process counts (its object unmapped by all, most likely: PostgreSQL makes a new
    /// `/dev/shm` segment for every parallel query), taken over already claimed by `me`.
    /// `None` with every entry counted by someone.
    fn shared_object_entry(&self, object: u64, me: usize) -> Option<&SharedObject> {
        for o in &self.seg.shared_objects {
            match o.object.load(Ordering::Acquire) {
                k if k == object => return Some(o),
                0 => match o.object.compare_exchange(0, object, Ordering::AcqRel, Ordering::Acquire) {
                    Ok(_) => return Some(o),
                    Err(k) if k == object => return Some(o),
                    Err(_) => continue,
                },
                _ => continue,
            }
        }
        // Claimed first, so that no other process takes it over at once; one that looked
        // the old object up meanwhile sees it counted (for at most its next measure).
        let o = self.seg.shared_objects.iter().find(|o| {
            o.counter.load(Ordering::Acquire) == 0
                && o.counter.compare_exchange(0, me, Ordering::AcqRel, Ordering::Acquire).is_ok()
        })?;
        o.bytes_seen.store(0, Ordering::Release);
        o.object.store(object, Ordering::Release);
        Some(o)
    }

    /// Whether `own` is the slot of process `pid` (not a parent's, which a fork child
    /// without a pager of its own still has noted).
    pub fn held_by(&self, own: &OwnSlot, pid: u32) -> bool {
        self.seg.slots.get(own.index).is_some_and(|s| s.pid.load(Ordering::Acquire) == slot_key(pid))
    }

    /// Whether the slot at `index` is held by a process. One being given back still is:
    /// its claims go only once its share of the unmanaged memory went (`release`), so that
    /// no other process counts an object while the sum still holds it (the peak would keep
    /// the double count for good).
    fn slot_live(&self, index: usize) -> bool {
        self.seg.slots.get(index).is_some_and(|s| s.pid.load(Ordering::Acquire) != 0)
    }

    /// The most unmanaged memory the tree's processes held at once (as they measured it).
    pub fn unmanaged_peak_bytes(&self) -> u64 {
        self.seg.charge.unmanaged_peak_bytes.load(Ordering::Acquire)
    }

    /// The most each of the first [`TREE_DEVICES`] devices held for the tree at once.
    pub fn device_peak_bytes(&self) -> [u64; TREE_DEVICES] {
        self.seg.charge.device_peak_bytes.each_ref().map(|b| b.load(Ordering::Acquire))
    }

    /// A slot for process `pid`'s own charge. A slot already holding `pid` is what an
    /// earlier image of this process left before it exec'd: its charge is given back and
    /// the slot reused. `None` when every slot is taken.
    pub fn claim(&self, pid: u32) -> Option<OwnSlot> {
        let pid = slot_key(pid);
        let own = |index: usize, s: &'static Slot| OwnSlot {
            pages: &s.own_pages,
            pool_bytes: &s.own_pool_bytes,
            device_bytes: &s.own_device_bytes,
            unmanaged_bytes: &s.own_unmanaged_bytes,
            index,
        };
        for (i, s) in self.seg.slots.iter().enumerate() {
            if s.pid.load(Ordering::Acquire) == pid {
                self.release(s);
                return Some(own(i, s));
            }
        }
        for (i, s) in self.seg.slots.iter().enumerate() {
            if s.pid.compare_exchange(0, pid, Ordering::AcqRel, Ordering::Acquire).is_ok() {
                self.seg.charge.nr_processes.fetch_add(1, Ordering::AcqRel);
                return Some(own(i, s));
            }
        }
        None
    }

    /// Gives back the slot of process `pid` (a live process that leaves the tree: it ends
    /// holding no pager), with its charge and shares; a no-op if it holds none.
    pub fn leave(&self, pid: u32) {
        let pid = slot_key(pid);
        for s in &self.seg.slots {
            if s.pid.compare_exchange(pid, u64::MAX, Ordering::AcqRel, Ordering::Acquire).is_ok() {
                self.release(s);
                s.pid.store(0, Ordering::Release);
                self.seg.charge.nr_processes.fetch_sub(1, Ordering::AcqRel);
                return;
            }
        }
    }

    /// Returns the charge of processes that died holding a slot (killed, or ended with
    /// `_exit`); returns how many slots it freed.
    pub fn sweep_dead(&self) -> usize {
        let mut freed = 0;
        let ns = own_pid_namespace();
        for s in &self.seg.slots {
            let pid = s.pid.load(Ordering::Acquire);
            // Free, being given back, or of another pid namespace, whose pids mean other
            // processes here (left to its own processes; at worst held until the run ends).
            if pid == 0 || pid == u64::MAX || pid >> 32 != ns {
                continue;
            }
            // SAFETY: kill with signal 0 only checks that the process exists.
            let gone = unsafe { libc::kill((pid & 0xffff_ffff) as libc::pid_t, 0) } != 0
                && io::Error::last_os_error().raw_os_error() == Some(libc::ESRCH);
            if gone && s.pid.compare_exchange(pid, u64::MAX, Ordering::AcqRel, Ordering::Acquire).is_ok() {
                self.release(s);
                s.pid.store(0, Ordering::Release);
                self.seg.charge.nr_processes.fetch_sub(1, Ordering::AcqRel);
                freed += 1;
            }
        }
        freed
    }

    /// The processes of this process's pid namespace that hold a slot and are alive (after
    /// [`Self::sweep_dead`]): those still under the budget.
    pub fn live_pids(&self) -> Vec<u32> {
        self.sweep_dead();
        let ns = own_pid_namespace();
        let pids = self.seg.slots.iter().map(|s| s.pid.load(Ordering::Acquire));
        pids.filter(|&p| p != 0 && p != u64::MAX && p >> 32 == ns).map(|p| (p & 0xffff_ffff) as u32).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn segment(name: &str) -> ChargeSegment {
        let path = std::env::temp_dir().join(format!("uswap-charge-test.{}.{name}", std::process::id()));
        let _ = std::fs::remove_file(&path);
        let seg = ChargeSegment::create(&path, 64 << 20).expect("create the segment");
        std::fs::remove_file(&path).expect("remove the segment file");
        seg
    }

    /// Every block of a new segment is allocated (see `allocate_blocks`): a page of it first
    /// written on a full file system would be a SIGBUS in the process writing it.
    #[test]
    fn a_new_segment_has_all_its_blocks() {
        use std::os::unix::fs::MetadataExt;
        let path = std::env::temp_dir().join(format!("uswap-charge-test.{}.blocks", std::process::id()));
        let _ = std::fs::remove_file(&path);
        let _seg = ChargeSegment::create(&path, 64 << 20).expect("create the segment");
        let meta = std::fs::metadata(&path).expect("the segment file");
        std::fs::remove_file(&path).expect("remove the segment file");
        let len = std::mem::size_of::<Segment>() as u64;
        assert!(meta.blocks() * 512 >= len, "{} bytes allocated for a segment of {len}", meta.blocks() * 512);
    }

    #[test]
    fn pools_add_up_with_a_peak_and_a_dead_process_gives_its_share_back() {
        let seg = segment("pools");
        let (a, b) = (seg.claim(1_000_001).expect("a slot"), seg.claim(1_000_002).expect("a slot"));
        assert_eq!(seg.charge().nr_processes.load(Ordering::Relaxed), 2);
        let (sa, sb) =
            (PoolShare::new(seg.charge(), Some(a.pool_bytes)), PoolShare::new(seg.charge(), Some(b.pool_bytes)));
        sa.grow(3 << 16);
        sb.grow(2 << 16);
        sa.shrink(1 << 16);
        assert_eq!(seg.charge().pool_bytes.load(Ordering::Relaxed), 4 << 16);
        assert_eq!(seg.pool_peak_bytes(), 5 << 16, "the peak is the sum at one moment");
        assert_eq!((a.pool_bytes.load(Ordering::Relaxed), b.pool_bytes.load(Ordering::Relaxed)), (2 << 16, 2 << 16));
        // An exec'd image of the first process claims its slot again: the old share goes.
        let a2 = seg.claim(1_000_001).expect("the same slot");
        assert_eq!(a2.pool_bytes.load(Ordering::Relaxed), 0);
        assert_eq!(seg.charge().nr_processes.load(Ordering::Relaxed), 2, "an exec'd image is the same process");
        assert_eq!(seg.charge().pool_bytes.load(Ordering::Relaxed), 2 << 16);
        assert_eq!(seg.pool_peak_bytes(), 5 << 16);
        // Neither pid runs: both slots are swept, their shares and the count go with them.
        assert_eq!(seg.sweep_dead(), 2);
        assert_eq!(seg.charge().nr_processes.load(Ordering::Relaxed), 0);
        assert_eq!(seg.charge().pool_bytes.load(Ordering::Relaxed), 0);
    }

    #[test]
    fn a_charge_without_a_pager_moves_both_ways_keeps_its_peak_and_leaves_with_its_slot() {
        let seg = segment("waiting");
        let own = seg.claim(1_000_004).expect("a slot");
        let tree = seg.charge();
        tree.set_charge_without_pager(own.pages, 300);
        tree.set_charge_without_pager(own.pages, 500);
        tree.set_charge_without_pager(own.pages, 200);
        assert_eq!(own.pages.load(Ordering::Relaxed), 200);
        assert_eq!(tree.resident_pages.load(Ordering::Relaxed), 200);
        assert_eq!(seg.resident_peak_pages(), 500, "the peak is the most at one moment");
        // A pager's start claims the same slot: the charge without a pager is given back.
        let again = seg.claim(1_000_004).expect("the same slot");
        assert_eq!((again.pages.load(Ordering::Relaxed), tree.resident_pages.load(Ordering::Relaxed)), (0, 0));
        tree.set_charge_without_pager(again.pages, 64);
        seg.leave(1_000_004);
        assert_eq!(tree.resident_pages.load(Ordering::Relaxed), 0);
        assert_eq!(tree.nr_processes.load(Ordering::Relaxed), 0);
        seg.leave(1_000_004);
        assert_eq!(tree.nr_processes.load(Ordering::Relaxed), 0, "leaving twice is a no-op");
    }

    #[test]
    fn a_shared_object_is_counted_by_one_process_at_its_largest_until_that_one_lets_go() {
        let seg = segment("shared");
        let (a, b) = (seg.claim(1_000_005).expect("a slot"), seg.claim(1_000_006).expect("a slot"));
        assert!(seg.held_by(&a, 1_000_005) && !seg.held_by(&a, 1_000_006));
        let object = 0x42;
        // The first to meet it counts it; the other's larger share reaches the counter's
        // next measure, once.
        assert_eq!(seg.count_shared_object(&a, object, 10), 10);
        assert_eq!(seg.count_shared_object(&b, object, 30), 0);
        assert_eq!(seg.count_shared_object(&a, object, 10), 30);
        assert_eq!(seg.count_shared_object(&a, object, 10), 10);
        // The counter unmapped it: the other counts it from its next measure.
        seg.let_go_of_shared_objects(&a, &[]);
        assert_eq!(seg.count_shared_object(&b, object, 30), 30);
        assert_eq!(seg.count_shared_object(&a, object, 10), 0);
        // The counter leaves the tree: its claim goes with its slot.
        seg.leave(1_000_006);
        assert_eq!(seg.count_shared_object(&a, object, 10), 30, "what the one that left saw last");
        assert_eq!(seg.count_shared_object(&a, object, 10), 10);
        // A full table: every process counts what it maps, as without a table.
        for o in 1..=SHARED_OBJECTS as u64 {
            seg.count_shared_object(&a, 0x1000 + o, 1);
        }
        let c = seg.claim(1_000_007).expect("a slot");
        assert_eq!(seg.count_shared_object(&c, 0x42_0000, 7), 7);
        assert_eq!(seg.count_shared_object(&a, 0x42_0000, 7), 7);
        assert_eq!(seg.count_shared_object(&c, object, 10), 0, "a known object is still counted once");
        // The objects a process no longer maps free their entries for new ones.
        seg.let_go_of_shared_objects(&a, &[object]);
        assert_eq!(seg.count_shared_object(&c, 0x43_0000, 5), 5);
        assert_eq!(seg.count_shared_object(&a, 0x43_0000, 5), 0, "the new object is counted once");
        assert_eq!(seg.count_shared_object(&c, 0x43_0000, 5), 5, "nothing of the entry's old object");
    }

    #[test]
    fn a_copy_of_a_pool_in_another_process_reports_nothing() {
        let seg = segment("fork");
        let own = seg.claim(1_000_003).expect("a slot");
        // What a fork child's copy of its parent's pool holds: the parent's pid.
        let mut copy = PoolShare::new(seg.charge(), Some(own.pool_bytes));
        copy.bytes.pid = std::process::id() + 1;
        copy.grow(1 << 16);
        copy.shrink(1 << 16);
        assert_eq!(seg.charge().pool_bytes.load(Ordering::Relaxed), 0);
        assert_eq!(seg.pool_peak_bytes(), 0);
        assert_eq!(own.pool_bytes.load(Ordering::Relaxed), 0);
    }
}
