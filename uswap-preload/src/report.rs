//! The counters a process leaves for `uswap run`: at `exit()`, the pager's [`uswap::Stats`]
//! as JSON in `$USWAP_STATS_DIR/<pid>.json`. `_exit` and `_Exit` are interposed to write it
//! too. A process killed by a signal, or an image replaced by exec, writes nothing at its
//! end; a thread rewrites the file every [`PUBLISH_INTERVAL_MS`] so that its counters
//! survive up to the last interval. (An exec does not write the record first: `execve` may
//! be called from a signal handler, where the record's lock and allocations could deadlock
//! the thread.)
//!
//! A record already under the name when a process starts publishing is an earlier image's
//! of the same process (it exec'd: both had pagers) or an ended process's whose pid came
//! back: it is kept under `<pid>.<n>.json` ([`keep_predecessor`]), so that the summary
//! counts both (before, the new image's records replaced the old one's counters).
//!
//! `managed_peak_pages` counts pages that hold the program's data: mapped, or stored on a
//! device (a staged page counts once, by its slot). It is sampled at each publication.

use std::path::PathBuf;
use std::sync::OnceLock;

use crate::own_code::Guard;

pub const PUBLISH_INTERVAL_MS: u64 = 200;

static DIR: OnceLock<PathBuf> = OnceLock::new();

/// The most pages the program kept under management (resident or on a device), sampled at
/// every publication: an approximation from below, unlike the engine's exact resident peak.
static MANAGED_PEAK_PAGES: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

pub fn start(dir: Option<PathBuf>) {
    START_PID.store(std::process::id(), std::sync::atomic::Ordering::Relaxed);
    let Some(dir) = dir else { return };
    keep_predecessor(&dir, &crate::file_tag());
    let _ = DIR.set(dir);
    spawn_publisher();
}

/// Most names tried for a predecessor's record (a bound on the loop: a pid comes back that
/// many times in one run only on a machine that runs out of pids).
const MAX_PREDECESSORS: u32 = 10_000;

/// Keeps the record already under `<pid>.json`, an earlier image's or an ended process's
/// (see the module documentation), as `<pid>.<n>.json`. Called before this process's first
/// record, by the thread that starts its publisher: nothing of this process writes it yet.
/// `pid` is the process's file tag (`crate::file_tag`).
fn keep_predecessor(dir: &std::path::Path, pid: &str) {
    let record = dir.join(format!("{pid}.json"));
    if !record.exists() {
        return;
    }
    for n in 0..MAX_PREDECESSORS {
        let kept = dir.join(format!("{pid}.{n}.json"));
        // Hard link, then unlink: never over another kept record.
        match std::fs::hard_link(&record, &kept) {
            Ok(()) => {
                let _ = std::fs::remove_file(&record);
                return;
            }
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
            // No hard links here, or no room: renamed over nothing, or left to be replaced.
            Err(_) => {
                let _ = std::fs::rename(&record, &kept);
                return;
            }
        }
    }
}

/// A fork child with a pager of its own (see `fork`) leaves a record of its own: under its
/// pid, from a publisher thread of its own (the parent's is not in the child).
pub fn start_in_fork_child() {
    START_PID.store(std::process::id(), std::sync::atomic::Ordering::Relaxed);
    MANAGED_PEAK_PAGES.store(0, std::sync::atomic::Ordering::Relaxed);
    // The parent's peak is the parent's: the child's first measurement replaces its
    // mappings (no lock taken here: a thread of the parent may have held it at the fork).
    UNMANAGED_OWN_PEAK_BYTES.store(0, std::sync::atomic::Ordering::Relaxed);
    if let Some(dir) = DIR.get() {
        keep_predecessor(dir, &crate::file_tag());
        spawn_publisher();
    }
}

fn spawn_publisher() {
    let mut tick = 0u64;
    let spawned = uswap::spawn_engine_thread("uswap-report".into(), move || loop {
        std::thread::sleep(std::time::Duration::from_millis(PUBLISH_INTERVAL_MS));
        if crate::is_unmanaged_fork_child() {
            return;
        }
        if FINAL_WRITTEN.load(std::sync::atomic::Ordering::Acquire) {
            return;
        }
        tick += 1;
        if tick % MEASURE_EVERY_TICKS == 0 {
            measure_unmanaged();
            // A thread cancelled in a blocking call leaves its pin (see `uswap::Pin`).
            uswap::release_pins_of_dead_threads();
        }
        if let Some(seg) = crate::segment() {
            // Charges of processes that died without giving them back.
            seg.sweep_dead();
        }
        write(false);
        crate::last_thread::end_if_no_thread_left();
    });
    if let (Err(e), Some(dir)) = (spawned, DIR.get()) {
        // The record is still written at exit; `uswap stat` of the tree misses it until then.
        crate::real::say_of_this_process(&format!(
            "cannot start the thread that leaves its counters in {} every {PUBLISH_INTERVAL_MS} ms ({e}): \
             they are left at its exit only",
            dir.display()
        ));
    }
}

/// The unmanaged memory is measured every this many records (once a second).
const MEASURE_EVERY_TICKS: u64 = 5;

/// What the last measurement named (its largest unmanaged mappings, its totals by reason),
/// for the record.
static UNMANAGED_NAMED: spin::Mutex<crate::unmanaged::Named> = spin::Mutex::new(crate::unmanaged::Named::new());
/// What the measurement that found the most (the process's peak) named, and that most: what
/// a report of the peak names, rather than mappings of a later moment (a database's shared
/// buffers, gone by its exit).
static UNMANAGED_PEAK_NAMED: spin::Mutex<crate::unmanaged::Named> = spin::Mutex::new(crate::unmanaged::Named::new());
static UNMANAGED_OWN_PEAK_BYTES: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// In a fork child (its one thread, before it runs): the lists of what measurements named
/// are free. The parent's publisher may have held one at the fork, a thread the child does not
/// have: the child's publisher and its exit (`write_final`) waited for it for good (stress-ng's
/// unshare stressor left such children hanging). What a list held is left as it was, not
/// freed: the fork may have come in the middle of its replacement.
pub fn forget_locks_in_fork_child() {
    for list in [&UNMANAGED_NAMED, &UNMANAGED_PEAK_NAMED] {
        if list.is_locked() {
            // SAFETY: the holder was a thread of the parent's, not in this process; this
            // thread is the child's only one.
            unsafe { list.force_unlock() };
            std::mem::forget(std::mem::take(&mut *list.lock()));
        }
    }
}

/// Measures the process's unmanaged memory (see `unmanaged`) and publishes it in the
/// pager's counters.
fn measure_unmanaged() {
    let min_size = crate::config().map_or(crate::config::DEFAULT_MIN_SIZE_BYTES, |c| c.min_size_bytes);
    if let Some(mut u) = crate::unmanaged::measure(min_size) {
        static ASYNC_IO_SEEN: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
        // An io_uring is the program's only through a descriptor the engine does not keep (a
        // file device's rings are uswap's).
        let programs =
            || u.aio_mapped || (u.io_uring_mapped && crate::io_uring_descriptor(|fd| !uswap::fd::is_kept(fd)));
        if !ASYNC_IO_SEEN.load(std::sync::atomic::Ordering::Relaxed)
            && crate::pager().is_some_and(|p| p.fault_mode() == uswap::FaultMode::Signal)
            && programs()
            && !ASYNC_IO_SEEN.swap(true, std::sync::atomic::Ordering::Relaxed)
        {
            // Set up where the system-call guard did not see it (liburing makes its own
            // system calls): counted and said as when it is seen, once.
            uswap::syscall_guard::note_async_kernel_access_found(b"io_uring or Linux AIO");
        }
        let mapped = u.shared_objects();
        count_shared_once(&mut u);
        uswap::stats::note_unmanaged(u.bytes);
        note_tree_unmanaged(u.bytes);
        // After the tree's sum is without them: another process takes them over. Without
        // the list (no memory for it), none is let go of until a scan that has it.
        if let Some(mapped) = mapped {
            let_go_of_shared_objects(&mapped);
        }
        if u.bytes >= UNMANAGED_OWN_PEAK_BYTES.fetch_max(u.bytes, std::sync::atomic::Ordering::Relaxed) {
            *UNMANAGED_PEAK_NAMED.lock() = u.named.clone();
        }
        *UNMANAGED_NAMED.lock() = u.named;
    }
}

/// Adds the shared memory `u` found to its total, each object counted by one process of
/// the tree (see `uswap::shared_charge::ChargeSegment::count_shared_object`); outside a
/// tree, all of it.
fn count_shared_once(u: &mut crate::unmanaged::Unmanaged) {
    match (crate::segment(), crate::own_slot()) {
        (Some(seg), Some(own)) => u.count_shared(|object, bytes| seg.count_shared_object(&own, object, bytes)),
        _ => u.count_shared(|_, bytes| bytes),
    }
}

/// Lets go of the shared objects this process counted for the tree and no longer maps
/// (all of them, with `&[]`): the next process of the tree that meets one counts it.
fn let_go_of_shared_objects(mapped: &[u64]) {
    if let (Some(seg), Some(own)) = (crate::segment(), crate::own_slot()) {
        seg.let_go_of_shared_objects(&own, mapped);
    }
}

/// Sets this process's share of the tree's unmanaged memory (see
/// `uswap::shared_charge::SharedCharge::note_unmanaged`).
fn note_tree_unmanaged(bytes: u64) {
    if let (Some(seg), Some(own)) = (crate::segment(), crate::own_slot()) {
        seg.charge().note_unmanaged(own.unmanaged_bytes, bytes);
    }
}

/// Processes that found every slot of the shared charge taken and run under their own
/// limit only (reported in their record).
static UNSHARED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

pub fn note_unshared() {
    UNSHARED.store(true, std::sync::atomic::Ordering::Relaxed);
}

/// The record a process leaves: its pager's counters and what this library adds.
fn record() -> Option<serde_json::Value> {
    let pager = crate::pager()?;
    let stats = pager.stats();
    let stored_pages: u64 = stats.devices.iter().map(|d| d.slots_used).sum();
    let managed = stats.resident_pages - stats.swapcache_pages.min(stats.resident_pages) + stored_pages;
    let managed_peak = MANAGED_PEAK_PAGES.fetch_max(managed, std::sync::atomic::Ordering::Relaxed).max(managed);
    let mut v = serde_json::to_value(&stats).ok()?;
    if let Some(o) = v.as_object_mut() {
        o.insert("managed_peak_pages".into(), managed_peak.into());
        o.insert("pid".into(), std::process::id().into());
        o.insert("outside_shared_charge".into(), u64::from(UNSHARED.load(std::sync::atomic::Ordering::Relaxed)).into());
        o.insert("mmap_managed_bytes".into(), (crate::mmap::managed_bytes() as u64).into());
        o.insert("mmap_unmanaged".into(), crate::mmap::UNMANAGED.load(std::sync::atomic::Ordering::Relaxed).into());
        o.insert("unmanaged_scans_without_memory".into(), crate::unmanaged::scans_without_memory().into());
        for (moment, list) in [("", &UNMANAGED_NAMED), ("peak_", &UNMANAGED_PEAK_NAMED)] {
            let named = list.lock();
            let largest: Vec<serde_json::Value> = named
                .largest
                .iter()
                .map(|m| serde_json::json!({"addr": format!("{:#x}", m.start), "len": m.len, "bytes": m.bytes, "why": m.why}))
                .collect();
            let by_reason: Vec<serde_json::Value> = named
                .by_reason
                .iter()
                .map(|r| {
                    let (start, bytes) = r.largest;
                    let largest = serde_json::json!({"addr": format!("{start:#x}"), "bytes": bytes});
                    serde_json::json!({"why": r.why, "bytes": r.bytes, "mappings": r.mappings, "largest": largest})
                })
                .collect();
            o.insert(format!("unmanaged_{moment}largest"), largest.into());
            o.insert(format!("unmanaged_{moment}by_reason"), by_reason.into());
        }
    }
    Some(v)
}

/// Set once the exit path wrote the last record: the publisher writes no more after it.
static FINAL_WRITTEN: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Writes the record whole, then renames it into place. Each writing thread has a scratch
/// file of its own: the publisher and the exit path may write at the same moment, and two
/// writers of one scratch file (each truncating it) could leave a tail of the longer
/// record after the shorter, which no JSON parser takes. Once the exit path has written
/// (`last`), the publisher's record, older, is not renamed over it.
fn write(last: bool) {
    let _g = Guard::enter();
    let (Some(dir), Some(rec)) = (DIR.get(), record()) else { return };
    let pid = crate::file_tag();
    let tid = crate::this_thread_id();
    let tmp = dir.join(format!(".{pid}.{tid}.json.tmp"));
    let dst = dir.join(format!("{pid}.json"));
    let written = write_new(&tmp, rec.to_string().as_bytes());
    if !last && FINAL_WRITTEN.load(std::sync::atomic::Ordering::Acquire) {
        let _ = std::fs::remove_file(&tmp);
        return;
    }
    let Err(e) = written.and_then(|()| std::fs::rename(&tmp, &dst)) else { return };
    let _ = std::fs::remove_file(&tmp);
    // The publisher's records are replaced every 200 ms: one that fails is the next one's to
    // make up. The last is not, unless the run is over (its directory gone with it: a process
    // that outlives the run).
    if last && e.kind() != std::io::ErrorKind::NotFound {
        say_record_lost(dir, &e.to_string());
    }
}

/// Says that a process's last counters did not reach the run's directory (no room, no
/// descriptors): the run's summary has only what an earlier record said of the process, and
/// without this line nothing would say why.
fn say_record_lost(dir: &std::path::Path, why: &str) {
    static SAID: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
    if !SAID.swap(true, std::sync::atomic::Ordering::Relaxed) {
        crate::real::say_of_this_process(&format!(
            "cannot leave its counters in {} ({why}): the run's summary has only those it left before, if any",
            dir.display()
        ));
    }
}

/// Leaves `text` at `path` for `uswap run` as a symbolic link whose target is the text: a
/// note written when no file can be (the process is out of descriptors, which is why some
/// pagers are refused), since `symlink` takes none. `uswap run` reads such a note with
/// `readlink` (its `tree_files::read_note`), following nothing. The text is cut at
/// [`MAX_LINK_NOTE_BYTES`].
pub(crate) fn link_note(path: &std::path::Path, text: &str) -> std::io::Result<()> {
    let mut end = text.trim_end().len().min(MAX_LINK_NOTE_BYTES);
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    let target = match &text[..end] {
        "" => "(no text)",
        t => t,
    };
    let _ = std::fs::remove_file(path);
    std::os::unix::fs::symlink(target, path)
}

/// Most bytes of a note left as a link: under `PATH_MAX` (4,096 with its NUL).
pub(crate) const MAX_LINK_NOTE_BYTES: usize = 4000;

/// Writes `bytes` to `path` as a new file (what a crash left there goes first): never through
/// a link or into a file another user put there, in a tree's directory that processes which
/// changed user share (see `uswap-cli`'s `run/dir.rs`).
pub(crate) fn write_new(path: &std::path::Path, bytes: &[u8]) -> std::io::Result<()> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let _ = std::fs::remove_file(path);
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o644)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(path)?;
    f.write_all(bytes)
}

/// The pid the library started in: a `vfork` child (same memory, no atfork handlers) has
/// another, and must not write the parent's pager's record as its own.
static START_PID: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);

pub fn write_final() {
    if START_PID.load(std::sync::atomic::Ordering::Relaxed) == std::process::id() {
        // A program shorter than a measuring interval is measured once, here.
        let _g = Guard::enter();
        measure_unmanaged();
        FINAL_WRITTEN.store(true, std::sync::atomic::Ordering::Release);
        write(true);
        // Its memory goes with it: the tree's figure at the next moment is without it.
        crate::give_back_unmanaged();
    }
}

/// `_exit` and `_Exit`, interposed: shells (dash) and many programs end with them, skipping
/// `exit()`'s destructors, and their counters would be lost.
#[no_mangle]
pub extern "C" fn _exit(status: i32) -> ! {
    // Under the program's seccomp filter, no call it did not expect (see `program_seccomp`).
    if !crate::program_seccomp::filtered() {
        write_final();
        crate::waiting_charge::leave();
    }
    // SAFETY: exit_group ends the process; it does not return.
    unsafe { libc::syscall(libc::SYS_exit_group, status) };
    unreachable!("exit_group returned")
}

#[no_mangle]
pub extern "C" fn _Exit(status: i32) -> ! {
    _exit(status)
}

#[cfg(test)]
mod tests {
    /// A child forked while another thread holds a list's lock takes it at once after
    /// `forget_locks_in_fork_child` (it waited for good before), and finds the list empty.
    #[test]
    fn a_fork_child_takes_the_lists_its_parent_held() {
        super::UNMANAGED_NAMED.lock().largest.push(crate::unmanaged::Mapping {
            start: 0x1000,
            len: 4096,
            bytes: 4096,
            why: "a test",
        });
        let (held_tx, held_rx) = std::sync::mpsc::channel();
        let (done_tx, done_rx) = std::sync::mpsc::channel::<()>();
        let holder = std::thread::spawn(move || {
            let _g = super::UNMANAGED_NAMED.lock();
            held_tx.send(()).unwrap();
            done_rx.recv().unwrap();
        });
        held_rx.recv().unwrap();
        // SAFETY: the child makes only the calls below (atomics, a lock, _exit).
        let pid = unsafe { libc::fork() };
        if pid == 0 {
            super::forget_locks_in_fork_child();
            let empty = super::UNMANAGED_NAMED.lock().largest.is_empty();
            // SAFETY: ends the child at once.
            unsafe { libc::_exit(if empty { 0 } else { 3 }) };
        }
        assert!(pid > 0, "fork failed");
        let mut status = 0;
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        // Bounded: ends by the deadline.
        let ended = loop {
            // SAFETY: waits for our own child, without blocking.
            if unsafe { libc::waitpid(pid, &mut status, libc::WNOHANG) } == pid {
                break true;
            }
            if std::time::Instant::now() > deadline {
                // SAFETY: our own child, stuck.
                unsafe { libc::kill(pid, libc::SIGKILL) };
                break false;
            }
            std::thread::sleep(std::time::Duration::from_millis(10));
        };
        done_tx.send(()).unwrap();
        holder.join().unwrap();
        assert!(ended, "the child waited for a lock its parent's thread held");
        assert!(libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0, "child status {status:#x}");
    }
}
