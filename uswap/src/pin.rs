//! Pins: the managed memory a system call is about to use, which reclaim leaves in place
//! until the call returns, as the kernel's own I/O holds the pages it pins.
//!
//! Signal mode brings a call's memory in before the call (`user_access`). Under a tight
//! limit the pages brought in first could go out again while the rest come in (this
//! thread's own reclaim, in the faults that bring them in; another thread's; the background
//! reclaimer), and the call would fail with `EFAULT` however often it was made again: a
//! shell's `execve`, whose strings lie on many pages, failed that way in a tree of twenty
//! processes under 16 MiB. A [`Pin`] publishes the call's ranges in a slot of a static table
//! before their pages are looked at; reclaim checks each victim against the table once it
//! owns it ([`hold_of`]) and leaves a pinned one resident.
//!
//! Ordering. The pinner stores its range, then a `SeqCst` fence, then reads the pages'
//! words; reclaim sets a victim's busy bit, then a `SeqCst` fence, then reads the table.
//! Either reclaim sees the range, or the pinner sees the page busy and brings it back in as
//! a fault would, after which reclaim sees the range.
//!
//! Locking: none. A slot belongs to the pin that claimed it (compare-and-swap of `owned`)
//! until the pin is released. Allocation-free and lock-free: a pin is taken in signal
//! handlers. Invariants: a slot holds at most [`MAX_RANGES`] ranges; a range that overlaps
//! or touches one is merged into it (a range only grows, so a reader that sees half an
//! update still sees the old range inside it), one more that does not is left unpinned (it
//! is never merged across a gap: a `readv` blocked for hours on scattered buffers would pin
//! all the heap between them); a pin covers at most [`MAX_PIN_BYTES`]. What is left unpinned
//! (the rest of a larger buffer, ranges past the slot's) is prepared as before pins, and an
//! `EFAULT` on it is retried: a pin may hold a call's pages over the limit, but not without
//! bound. With every slot taken, a call is prepared unpinned (counted in
//! `syscall_unpinned`).
//!
//! Not the memory of the calls made by the engine itself, nor of calls the preload does not
//! see (see `syscall_guard`). Pages the kernel pins itself (a `process_vm_readv` reading
//! them, in this process or another; `O_DIRECT` I/O in thread mode) are seen only when
//! `UFFDIO_MOVE` refuses them: in a process that never forked, [`note_refused`] keeps each
//! such page in for a while, a lossy table beside this one, so that reclaim looks at others
//! rather than ask again and again (after a fork a refused page may be shared instead, and
//! `reclaim::cow` makes it exclusive).

use std::cell::Cell;
use std::sync::atomic::{fence, AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering};

use crate::uffd::PAGE_SIZE;

/// Calls that can hold a pin at once, over every thread of the process.
const NR_SLOTS: usize = 64;
/// Ranges one pin holds apart (those of a call with many buffers: `execve`'s strings, a
/// vector of iovecs).
const MAX_RANGES: usize = 16;
/// The most memory one call pins: its buffers beyond this are brought in unpinned (and
/// transfers go on in windows, see `syscall_guard::complete`).
pub const MAX_PIN_BYTES: usize = 4 << 20;

struct Slot {
    owned: AtomicBool,
    /// The thread that owns it (see [`release_pins_of_dead_threads`]).
    tid: AtomicU32,
    nr_ranges: AtomicUsize,
    /// `[start, end)` page-aligned, the first `nr_ranges` of them valid.
    ranges: [[AtomicUsize; 2]; MAX_RANGES],
}

impl Slot {
    const fn new() -> Slot {
        Slot {
            owned: AtomicBool::new(false),
            tid: AtomicU32::new(0),
            nr_ranges: AtomicUsize::new(0),
            ranges: [const { [AtomicUsize::new(0), AtomicUsize::new(0)] }; MAX_RANGES],
        }
    }

    fn covers(&self, addr: usize) -> bool {
        let n = self.nr_ranges.load(Ordering::Relaxed).min(MAX_RANGES);
        self.ranges[..n].iter().any(|[s, e]| (s.load(Ordering::Relaxed)..e.load(Ordering::Relaxed)).contains(&addr))
    }
}

static SLOTS: [Slot; NR_SLOTS] = [const { Slot::new() }; NR_SLOTS];

thread_local! {
    /// This thread's id, noted where the thread starts ([`note_thread_start`]): `gettid` is
    /// a system call (about 200 ns here), too dear for every call that pins. 0 where it was
    /// not noted. Const-initialised, no destructor: read in signal handlers.
    static THREAD_ID: Cell<u32> = const { Cell::new(0) };
}

/// Notes the calling thread's id for its pins. Called where each application thread starts,
/// and in a fork child (whose copy of the thread-local is its parent's thread's).
pub fn note_thread_start() {
    THREAD_ID.set(gettid());
}

fn gettid() -> u32 {
    // SAFETY: gettid takes no arguments and cannot fail.
    unsafe { libc::syscall(libc::SYS_gettid) as u32 }
}

/// One past the highest slot ever owned: reclaim looks no further (a call claims the lowest
/// free slot, so this is the most calls that ever held pins at once; no shared counter is
/// written per call).
static SLOTS_HIGH: AtomicUsize = AtomicUsize::new(0);

/// The pins of one system call (see the module's comment). Claims a slot on its first
/// range; [`Pin::release`] gives it back. Not on drop: a pin lives in the frames of a call
/// that `pthread_cancel` may end by unwinding them without running destructors (and a
/// destructor in those `extern "C"` frames would turn the unwinding into an abort). The
/// slot of a thread that ended holding one is given back by
/// [`release_pins_of_dead_threads`].
#[derive(Default)]
#[must_use = "a pin holds its pages in until it is released"]
pub struct Pin {
    slot: Option<&'static Slot>,
    /// Claiming found every slot taken: this call goes unpinned.
    no_slot: bool,
    /// Claim under the kernel's thread id, not the noted one (see [`Pin::for_exec`]).
    fresh_tid: bool,
    /// Claim under no thread: released by another thread (see [`Pin::for_handoff`]).
    handoff: bool,
    pinned_bytes: usize,
}

impl Pin {
    pub fn new() -> Pin {
        Pin::default()
    }

    /// A pin that pins nothing: for a call that may wait long and touches its memory only
    /// as it starts (`futex`: the word is read once, when the wait begins). Pinned, every
    /// idle thread of a pool would hold a slot for as long as it sleeps, and reclaim would
    /// look through all of them for every victim.
    pub fn none() -> Pin {
        Pin { no_slot: true, ..Pin::default() }
    }

    /// A pin for a call that does not return when it succeeds (`execve`): its slot is
    /// claimed under the thread id the kernel gives, so that a `vfork` child's (whose
    /// thread-locals are its parent's) is known as the child's and given back once the
    /// child's memory is no longer ours (see [`release_pins_of_dead_threads`]).
    pub fn for_exec() -> Pin {
        Pin { fresh_tid: true, ..Pin::default() }
    }

    /// A pin taken by one thread and released by another (a new thread's stack, pinned by
    /// its creator until the new thread has its alternate signal stack): its slot is claimed
    /// under no thread id, so that [`release_pins_of_dead_threads`] never frees it when the
    /// creator ends first (which would unpin the stack too early, and let the new thread's
    /// release free a slot another call had claimed since).
    pub fn for_handoff() -> Pin {
        Pin { handoff: true, ..Pin::default() }
    }

    /// Pins `[start, end)` (rounded out to pages), as much of it as the call's allowance
    /// leaves, and orders the pin before the caller's reads of the pages' words.
    pub(crate) fn add(&mut self, start: usize, end: usize) {
        let start = start & !(PAGE_SIZE - 1);
        let end = end.next_multiple_of(PAGE_SIZE).min(start + (MAX_PIN_BYTES - self.pinned_bytes));
        if end <= start {
            return;
        }
        let Some(slot) = self.slot() else { return };
        let n = slot.nr_ranges.load(Ordering::Relaxed);
        for [s, e] in &slot.ranges[..n] {
            let (s_addr, e_addr) = (s.load(Ordering::Relaxed), e.load(Ordering::Relaxed));
            if s_addr <= start && end <= e_addr {
                return; // a retry pins what it pinned before
            }
            if start <= e_addr && s_addr <= end {
                // Overlaps or touches: grown, never shrunk (see the module's invariants).
                self.pinned_bytes += (e_addr.max(end) - s_addr.min(start)) - (e_addr - s_addr);
                s.fetch_min(start, Ordering::Relaxed);
                e.fetch_max(end, Ordering::Relaxed);
                fence(Ordering::SeqCst);
                return;
            }
        }
        if n == MAX_RANGES {
            return; // left unpinned: see the module's invariants
        }
        self.pinned_bytes += end - start;
        slot.ranges[n][0].store(start, Ordering::Relaxed);
        slot.ranges[n][1].store(end, Ordering::Relaxed);
        slot.nr_ranges.store(n + 1, Ordering::Relaxed);
        fence(Ordering::SeqCst);
    }

    /// The slot, claimed on first use.
    fn slot(&mut self) -> Option<&'static Slot> {
        if self.slot.is_none() && !self.no_slot {
            self.slot = claim(self.fresh_tid, self.handoff);
            self.no_slot = self.slot.is_none();
        }
        self.slot
    }
}

impl Pin {
    /// Gives the pinned ranges back to reclaim (once the call returned).
    pub fn release(mut self) {
        if let Some(slot) = self.slot.take() {
            free(slot);
        }
    }
}

fn free(slot: &Slot) {
    slot.nr_ranges.store(0, Ordering::Relaxed);
    slot.tid.store(0, Ordering::Relaxed);
    slot.owned.store(false, Ordering::Release);
}

/// Gives back the slots of threads that ended holding a pin (cancelled in a blocking call:
/// see [`Pin`]); returns how many. Called now and then by a thread of the engine's.
pub fn release_pins_of_dead_threads() -> usize {
    // SAFETY: getpid takes no arguments and cannot fail.
    let pid = unsafe { libc::getpid() };
    let high = SLOTS_HIGH.load(Ordering::Relaxed).min(NR_SLOTS);
    let mut freed = 0;
    for slot in &SLOTS[..high] {
        let tid = slot.tid.load(Ordering::Acquire);
        if !slot.owned.load(Ordering::Acquire) || tid == 0 {
            continue;
        }
        if !owner_gone(pid, tid) {
            continue;
        }
        if slot.tid.compare_exchange(tid, 0, Ordering::AcqRel, Ordering::Relaxed).is_ok() {
            free(slot);
            freed += 1;
        }
    }
    freed
}

fn claim(fresh_tid: bool, handoff: bool) -> Option<&'static Slot> {
    // Bounded: one attempt per slot.
    for (i, slot) in SLOTS.iter().enumerate() {
        if slot.owned.compare_exchange(false, true, Ordering::Acquire, Ordering::Relaxed).is_ok() {
            debug_assert_eq!(slot.nr_ranges.load(Ordering::Relaxed), 0);
            // The noted id, or the kernel's for a pin taken with `Pin::for_exec` (a `vfork`
            // child shares its parent's thread-locals) or on a thread nobody noted.
            // None for a hand-off: the sweeper leaves a slot of tid 0 alone.
            let noted = THREAD_ID.get();
            let tid = match (handoff, noted == 0 || fresh_tid) {
                (true, _) => 0,
                (false, true) => gettid(),
                (false, false) => noted,
            };
            slot.tid.store(tid, Ordering::Release);
            if SLOTS_HIGH.load(Ordering::Relaxed) <= i {
                SLOTS_HIGH.fetch_max(i + 1, Ordering::Relaxed);
            }
            return Some(slot);
        }
    }
    crate::stats::note_syscall(crate::stats::SyscallEvent::Unpinned);
    None
}

/// Whether the owner `tid` of a slot in this process's table (`pid`) can no longer use it:
/// it is no thread of ours and no process that shares our memory. A child made with
/// `vfork` (or `posix_spawn`'s `clone(CLONE_VM)`) shares the table and pins its `execve`'s
/// strings in it; its slot is its own until its `execve` succeeds (then its memory is no
/// longer ours), and a failed attempt releases it as any call does.
fn owner_gone(pid: libc::pid_t, tid: u32) -> bool {
    let esrch = || std::io::Error::last_os_error().raw_os_error() == Some(libc::ESRCH);
    // SAFETY: tgkill with signal 0 only checks that the thread exists.
    if unsafe { libc::syscall(libc::SYS_tgkill, pid, tid, 0) } == 0 || !esrch() {
        return false;
    }
    // SAFETY: kill with signal 0 only checks that the process (or thread) exists.
    if unsafe { libc::kill(tid as libc::pid_t, 0) } != 0 && esrch() {
        return true;
    }
    const KCMP_VM: libc::c_long = 1;
    // SAFETY: kcmp compares two processes' kernel objects; it reads and writes no memory.
    let r = unsafe { libc::syscall(libc::SYS_kcmp, pid, tid, KCMP_VM, 0, 0) };
    // 0: same memory. Unknown (no kcmp, not permitted): kept, as if shared.
    r > 0
}

/// Whether this process has forked: set by every `Pager` fork preparation and, for forks
/// without a pager or made inside uswap's own code, by the preload ([`note_fork`]); never
/// cleared, as a page stays shared after the child exits until written (a fork child
/// inherits it set). Until then nothing of the process is shared with a fork child, and a
/// page `UFFDIO_MOVE` refuses with `EBUSY` is pinned by a system call under way, until that
/// call returns. After, a refused page may be shared instead, and `reclaim::cow` makes it
/// exclusive. (A fork made some other way, a raw `clone` from the program's own assembly,
/// is not seen here: its shared pages are held as pinned for a while at a time, and still
/// made exclusive by `reclaim::cow`.)
static FORKED: AtomicBool = AtomicBool::new(false);

/// Notes that the process forks (see [`FORKED`]): from now on a page `UFFDIO_MOVE`
/// refuses may be shared with a fork child. `Pager::prepare_fork` calls it; call it too
/// before a fork made without a pager (its pages may be managed later) or without
/// `prepare_fork`. Lock-free, allocation-free.
pub fn note_fork() {
    FORKED.store(true, Ordering::Relaxed);
}

/// Whether a page `UFFDIO_MOVE` refuses is pinned by a system call under way, rather than
/// maybe shared with a fork child (see [`FORKED`]).
pub(crate) fn refusals_are_pins() -> bool {
    !FORKED.load(Ordering::Relaxed)
}

/// How long a page the kernel refused to move is taken for pinned by a system call under
/// way: a thread-mode `process_vm_readv` held its pages for 32 ms under pressure.
const REFUSED_HOLD_NS: u64 = 100_000_000;
/// Pages the kernel refused lately, by page number (lossy: a page whose slot another took
/// is tried again; as many as a charge passes, `reclaim::direct`'s `MAX_HELD_PAGES`), and
/// when.
const NR_REFUSED: usize = 1 << 13;
static REFUSED_ADDR: [AtomicUsize; NR_REFUSED] = [const { AtomicUsize::new(0) }; NR_REFUSED];
static REFUSED_NS: [AtomicU64; NR_REFUSED] = [const { AtomicU64::new(0) }; NR_REFUSED];

/// Notes that `UFFDIO_MOVE` refused the page at `addr` with `EBUSY`: in a process that
/// never forked the kernel pins it, and [`hold_of`] keeps it in for [`REFUSED_HOLD_NS`], so
/// that reclaim looks at other pages rather than ask again and again. Returns whether it is
/// held so. Lock-free, allocation-free.
pub(crate) fn note_refused(addr: usize, now_ns: u64) -> bool {
    if !refusals_are_pins() {
        return false;
    }
    let i = (addr / PAGE_SIZE) % NR_REFUSED;
    REFUSED_ADDR[i].store(addr, Ordering::Relaxed);
    REFUSED_NS[i].store(now_ns, Ordering::Relaxed);
    true
}

/// Whether the page at `addr` was refused within [`REFUSED_HOLD_NS`].
fn refused_lately(addr: usize) -> bool {
    let i = (addr / PAGE_SIZE) % NR_REFUSED;
    REFUSED_ADDR[i].load(Ordering::Relaxed) == addr
        && refusals_are_pins()
        && crate::clock::now_ns().saturating_sub(REFUSED_NS[i].load(Ordering::Relaxed)) < REFUSED_HOLD_NS
}

/// What keeps a resident page in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Hold {
    /// The program locked it (`crate::mlock`): it leaves the LRU until unlocked.
    Locked,
    /// A system call pinned it: it stays until the call returns.
    Pinned,
}

/// Whether a lock or a pin keeps the page at `addr` in. Called by reclaim after it set the
/// page's busy bit: one fence orders that store before the reads of both tables.
pub(crate) fn hold_of(addr: usize) -> Option<Hold> {
    fence(Ordering::SeqCst);
    if crate::mlock::covers(addr) {
        return Some(Hold::Locked);
    }
    (pinned(addr) || refused_lately(addr)).then_some(Hold::Pinned)
}

/// Whether a call pins the page at `addr` (see [`hold_of`] for the ordering).
#[cfg(test)]
fn is_pinned(addr: usize) -> bool {
    fence(Ordering::SeqCst);
    pinned(addr)
}

fn pinned(addr: usize) -> bool {
    let high = SLOTS_HIGH.load(Ordering::Relaxed).min(NR_SLOTS);
    SLOTS[..high].iter().any(|s| s.owned.load(Ordering::Relaxed) && s.covers(addr))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn nr_unpinned() -> u64 {
        crate::stats::syscall_events()[crate::stats::SyscallEvent::Unpinned as usize]
    }

    // One test: the table is the process's, and the test threads share it.
    #[test]
    fn a_pin_covers_its_ranges_until_released_within_its_allowance() {
        let base = 0x7000_0000_0000usize;
        let mut pin = Pin::new();
        assert!(!is_pinned(base));
        pin.add(base + 10, base + 20);
        assert!(is_pinned(base) && is_pinned(base + PAGE_SIZE - 1) && !is_pinned(base + PAGE_SIZE));
        // A range that touches one is merged into it, taking no slot range of its own.
        pin.add(base + PAGE_SIZE, base + 2 * PAGE_SIZE);
        assert!(is_pinned(base + PAGE_SIZE) && !is_pinned(base + 2 * PAGE_SIZE));
        // More ranges apart than a slot holds: the first MAX_RANGES are pinned, the rest not,
        // and nothing between them.
        for i in 1..=MAX_RANGES + 2 {
            pin.add(base + 4 * i * PAGE_SIZE, base + (4 * i + 1) * PAGE_SIZE);
        }
        for i in 1..=MAX_RANGES + 2 {
            assert_eq!(is_pinned(base + 4 * i * PAGE_SIZE), i < MAX_RANGES, "range {i}");
            assert!(!is_pinned(base + (4 * i + 2) * PAGE_SIZE), "between ranges {i}");
        }
        pin.release();
        assert!(!is_pinned(base));
        // The allowance: nothing past MAX_PIN_BYTES in all.
        let far = base + (1 << 30);
        let mut pin = Pin::new();
        pin.add(far, far + 2 * MAX_PIN_BYTES);
        assert!(is_pinned(far));
        assert!(!is_pinned(far + MAX_PIN_BYTES));
        pin.release();
        assert!(!is_pinned(far));
        // A pin that pins nothing takes no slot and is not counted as unpinned.
        let before = nr_unpinned();
        let mut none = Pin::none();
        none.add(base, base + PAGE_SIZE);
        assert!(!is_pinned(base) && none.slot.is_none());
        assert_eq!(nr_unpinned(), before);
        none.release();
        // Every slot taken: a call goes unpinned, and says so.
        let before = nr_unpinned();
        let mut pins: Vec<Pin> = (0..NR_SLOTS).map(|_| Pin::new()).collect();
        for (i, p) in pins.iter_mut().enumerate() {
            p.add(base + i * PAGE_SIZE, base + (i + 1) * PAGE_SIZE);
        }
        let mut extra = Pin::new();
        extra.add(far, far + PAGE_SIZE);
        assert!(!is_pinned(far));
        assert_eq!(nr_unpinned(), before + 1);
        extra.release();
        pins.into_iter().for_each(Pin::release);
        assert!(SLOTS.iter().all(|s| !s.owned.load(Ordering::Relaxed)));
        // A thread that ends holding a pin (cancelled): its slot is given back.
        std::thread::spawn(move || {
            // Ends holding it, unreleased.
            let mut p = Pin::new();
            p.add(base, base + PAGE_SIZE);
        })
        .join()
        .unwrap();
        assert!(is_pinned(base));
        // `join` returns once the thread cleared its tid; the kernel lets go of the task a
        // moment later (until then `tgkill` still finds it).
        let mut freed = 0;
        for _ in 0..100 {
            freed += release_pins_of_dead_threads();
            if freed > 0 {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        assert_eq!(freed, 1);
        assert!(!is_pinned(base));
        // A live thread keeps its pin; a live process that no longer shares our memory (a
        // vfork child after its exec; here a fork child) does not.
        let mut mine = Pin::new();
        mine.add(base, base + PAGE_SIZE);
        assert_eq!(release_pins_of_dead_threads(), 0);
        // SAFETY: the child only sleeps and exits (async-signal-safe calls).
        let child = unsafe { libc::fork() };
        if child == 0 {
            // SAFETY: sleep and _exit are async-signal-safe.
            unsafe {
                libc::sleep(5);
                libc::_exit(0)
            };
        }
        mine.slot.expect("a slot").tid.store(child as u32, Ordering::Release);
        assert_eq!(release_pins_of_dead_threads(), 1, "a process that does not share our memory");
        assert!(!is_pinned(base));
        // SAFETY: kill and waitpid of our own child.
        unsafe {
            libc::kill(child, libc::SIGKILL);
            libc::waitpid(child, std::ptr::null_mut(), 0);
        }
    }
}
