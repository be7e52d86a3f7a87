//! Signal mode through the library: the program's signal masks, checked after the fact.
//!
//! In signal mode a fault on memory that is out is a SIGBUS the faulting thread serves. The
//! kernel cannot deliver it while the thread blocks SIGBUS: `force_sig_fault` resets a
//! blocked SIGBUS to its default action and the process dies, with nothing in user space to
//! catch it (kernel/signal.c, `force_sig_info_to_task`). `uswap run`'s library interposes
//! `sigprocmask`, `pthread_sigmask` and `sigaction` and keeps SIGBUS out of every mask as it
//! is set. A program that uses the library directly has no interposer, so the background
//! reclaimer looks, every [`GUARD_PERIOD`]:
//! * a handler whose `sa_mask` holds SIGBUS (every thread running it would block SIGBUS) gets
//!   SIGBUS taken out of its mask, said once per signal on stderr. The action is read and
//!   written back with one `sigaction` call that also returns the action it replaced: if the
//!   program installed another meanwhile, that one is put back (with SIGBUS out of its
//!   mask too), so the guard never undoes the program's own call;
//! * a thread that blocks SIGBUS (`SigBlk` in `/proc/self/task/TID/status`) cannot be
//!   changed from another thread: it is named on stderr, once, with what to do, so that the
//!   death a fault of its would bring does not come without a line saying why. Only once
//!   two looks in a row saw it so, each in every one of [`STEADY_SAMPLES`] readings a
//!   little apart: a thread blocks every signal for a moment when it creates a thread or
//!   forks (glibc's `pthread_create` and `fork` do), and was named for that.
//!
//! Not run where the program's signal calls are interposed ([`note_signal_calls_interposed`]),
//! but for one quiet pass over the handlers installed before the interposition began.
//! Locking: none; the process's pagers share the guard's state through atomics, and one
//! look a period is claimed by a compare-and-swap on its time. A thread id reused after
//! its thread exited is not named again.

use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

/// How often the masks are looked at: a handler set after the pager is fixed within this, a
/// thread that blocks SIGBUS is named within two of these. A fault in that window still kills
/// the process, with no line from uswap (`PagerBuilder::syscall_guard` closes the window).
pub const GUARD_PERIOD: Duration = Duration::from_secs(1);

/// Threads named at most once each, and at most this many in all (a program that starts
/// thousands of threads that block SIGBUS gets one line saying the rest are not named).
const MAX_THREADS_NAMED: usize = 64;
/// Readings of a thread's mask that must all show SIGBUS blocked for a look to count it,
/// [`STEADY_GAP`] apart: a thread creating threads in a loop has it blocked about half the
/// time, so ten readings and two looks leave about one chance in a million of naming it.
const STEADY_SAMPLES: usize = 10;
const STEADY_GAP: Duration = Duration::from_micros(200);
/// `/proc/self/task` entries one look reads at most (bounds the look's cost).
const MAX_THREADS_SCANNED: usize = 8192;

static INTERPOSED: AtomicBool = AtomicBool::new(false);

/// What the process's guards share, so that several signal-mode pagers look once a period
/// between them and say each thing once: when the last look began (ns of the monotonic
/// clock), the signals whose handlers were fixed (bit `n - 1`), the threads named.
static LAST_LOOK_NS: AtomicU64 = AtomicU64::new(0);
static SIGNALS_FIXED: AtomicU64 = AtomicU64::new(0);
static THREADS_NAMED: [AtomicU32; MAX_THREADS_NAMED] = [const { AtomicU32::new(0) }; MAX_THREADS_NAMED];
static NR_THREADS_NAMED: AtomicUsize = AtomicUsize::new(0);
/// The threads the last look saw blocking SIGBUS and did not name (0: an empty place).
static SUSPECTS: [AtomicU32; MAX_THREADS_NAMED] = [const { AtomicU32::new(0) }; MAX_THREADS_NAMED];

/// Says that the program's `sigprocmask`, `pthread_sigmask` and `sigaction` calls are
/// interposed and keep SIGBUS deliverable (`uswap run`'s library, from the moment its
/// signal-mode pager starts): the guard has nothing more to do. Handlers the program installed
/// before that moment (a lazily started pager comes long after `main` set up its handlers)
/// are fixed here, once and without a word, as the interposed `sigaction` would have: one
/// with SIGBUS in its `sa_mask` killed the program at its first fault on memory that was out.
/// The caller interposes first, so no handler installed meanwhile is missed. Irrevocable.
pub fn note_signal_calls_interposed() {
    take_sigbus_out_of_handler_masks(false);
    INTERPOSED.store(true, Ordering::Release);
}

/// Looks at the handlers and the threads' masks if no guard of the process did for
/// [`GUARD_PERIOD`] and uswap's SIGBUS handler is installed (a signal-mode pager lives).
/// Called by every signal-mode pager's background reclaimer, every tick.
pub fn tick() {
    if INTERPOSED.load(Ordering::Acquire) || !super::sigbus::installed() {
        return;
    }
    let now_ns = crate::clock::now_ns();
    let last = LAST_LOOK_NS.load(Ordering::Relaxed);
    if now_ns.saturating_sub(last) < GUARD_PERIOD.as_nanos() as u64
        || LAST_LOOK_NS.compare_exchange(last, now_ns, Ordering::AcqRel, Ordering::Relaxed).is_err()
    {
        return;
    }
    take_sigbus_out_of_handler_masks(true);
    name_threads_blocking_sigbus();
}

/// Fixes every handler whose mask holds SIGBUS; `say`: names each signal fixed, once.
fn take_sigbus_out_of_handler_masks(say: bool) {
    for sig in 1..=libc::SIGRTMAX() {
        if matches!(sig, libc::SIGKILL | libc::SIGSTOP | libc::SIGBUS) {
            continue;
        }
        let bit = 1u64 << (sig - 1);
        let fixed = fix_handler_mask(sig) == Some(true);
        if say && fixed && SIGNALS_FIXED.fetch_or(bit, Ordering::Relaxed) & bit == 0 {
            eprintln!(
                "uswap: the handler of signal {sig} blocked SIGBUS while it runs (its sa_mask): a fault of its on \
                 memory that is out would kill the process in signal mode; SIGBUS was taken out of its mask"
            );
        }
    }
}

fn name_threads_blocking_sigbus() {
    let Ok(dir) = std::fs::read_dir("/proc/self/task") else { return };
    let mut suspects = [0u32; MAX_THREADS_NAMED];
    let mut nr_suspects = 0;
    for entry in dir.flatten().take(MAX_THREADS_SCANNED) {
        let Some(tid) = entry.file_name().to_str().and_then(|s| s.parse::<u32>().ok()) else { continue };
        let named = NR_THREADS_NAMED.load(Ordering::Relaxed).min(MAX_THREADS_NAMED);
        if THREADS_NAMED[..named].iter().any(|t| t.load(Ordering::Relaxed) == tid)
            || !thread_blocks_sigbus(tid)
            || is_io_worker(tid)
            || !blocks_sigbus_steadily(tid)
        {
            continue;
        }
        if !SUSPECTS.iter().any(|t| t.load(Ordering::Relaxed) == tid) {
            // Seen once: maybe a moment inside pthread_create or fork; named at the next look.
            if nr_suspects < MAX_THREADS_NAMED {
                suspects[nr_suspects] = tid;
                nr_suspects += 1;
            }
            continue;
        }
        name_thread(tid);
    }
    // One look at a time (`tick`'s compare-and-swap): no other writer.
    for (s, &tid) in SUSPECTS.iter().zip(suspects.iter()) {
        s.store(tid, Ordering::Relaxed);
    }
}

/// Whether thread `tid` blocks SIGBUS in each of [`STEADY_SAMPLES`] readings (a look's
/// cost: about 2 ms, only for a thread seen blocking it).
fn blocks_sigbus_steadily(tid: u32) -> bool {
    (0..STEADY_SAMPLES).all(|_| {
        std::thread::sleep(STEADY_GAP);
        thread_blocks_sigbus(tid)
    })
}

/// Says on stderr, once, that thread `tid` blocks SIGBUS, with what to do.
fn name_thread(tid: u32) {
    let slot = NR_THREADS_NAMED.fetch_add(1, Ordering::Relaxed);
    if slot >= MAX_THREADS_NAMED {
        if slot == MAX_THREADS_NAMED {
            eprintln!("uswap: more threads block SIGBUS; they are not named one by one");
        }
        return;
    }
    THREADS_NAMED[slot].store(tid, Ordering::Relaxed);
    let name = std::fs::read_to_string(format!("/proc/self/task/{tid}/comm")).unwrap_or_default();
    eprintln!(
        "uswap: thread {tid} ({}) blocks SIGBUS: in signal mode a fault of its on memory that is out kills \
         the process (the kernel cannot deliver the signal uswap serves it with); unblock SIGBUS in it \
         (pthread_sigmask), run the program under `uswap run` (which keeps SIGBUS out of every mask), or use \
         thread mode",
        name.trim()
    );
}

/// Takes SIGBUS out of the mask of `sig`'s handler, if it has a handler with SIGBUS in its
/// mask. `Some(true)` if a mask was changed, `Some(false)` if none needed it, `None` if the
/// action could not be read.
fn fix_handler_mask(sig: libc::c_int) -> Option<bool> {
    // SAFETY: a query (null new action) into a zeroed struct of ours.
    let mut cur: libc::sigaction = unsafe { std::mem::zeroed() };
    // SAFETY: as above.
    if unsafe { libc::sigaction(sig, std::ptr::null(), &mut cur) } != 0 {
        return None;
    }
    let mut changed = false;
    // Bounded: each round either finds nothing to fix or writes once; a program racing the
    // guard three times in a row keeps its last action, fixed at the next look.
    for _ in 0..3 {
        if !needs_fix(&cur) {
            return Some(changed);
        }
        let mut fixed = cur;
        // SAFETY: our copy of the action's mask.
        unsafe { libc::sigdelset(&mut fixed.sa_mask, libc::SIGBUS) };
        // SAFETY: zeroed plain data, written by the call below.
        let mut replaced: libc::sigaction = unsafe { std::mem::zeroed() };
        // SAFETY: installs the program's own action with one signal less in its mask, and
        // reads the action it replaced in the same call.
        if unsafe { libc::sigaction(sig, &fixed, &mut replaced) } != 0 {
            return None;
        }
        changed = true;
        if same_action(&replaced, &cur) {
            return Some(true);
        }
        // The program installed another action between the read and the write: put it back
        // (fixed too, if it needs it, by the next round).
        cur = replaced;
        // SAFETY: the program's action, as it set it.
        if unsafe { libc::sigaction(sig, &cur, std::ptr::null_mut()) } != 0 {
            return None;
        }
    }
    Some(changed)
}

/// Whether `a` runs a handler of the program's with SIGBUS in its mask.
fn needs_fix(a: &libc::sigaction) -> bool {
    let handler = a.sa_sigaction;
    // SAFETY: reads a mask of ours.
    handler != libc::SIG_DFL && handler != libc::SIG_IGN && unsafe { libc::sigismember(&a.sa_mask, libc::SIGBUS) } == 1
}

fn same_action(a: &libc::sigaction, b: &libc::sigaction) -> bool {
    // SAFETY: a sigset_t is plain data of its size, read as bytes for as long as `s` lives.
    let mask_bytes = |s: &libc::sigset_t| unsafe {
        std::slice::from_raw_parts((s as *const libc::sigset_t).cast::<u8>(), std::mem::size_of::<libc::sigset_t>())
    };
    a.sa_sigaction == b.sa_sigaction && a.sa_flags == b.sa_flags && mask_bytes(&a.sa_mask) == mask_bytes(&b.sa_mask)
}

/// Whether thread `tid` of this process blocks SIGBUS (`SigBlk`, a hexadecimal mask whose
/// bit `n - 1` is signal `n`). False when unknown (the thread exited).
fn thread_blocks_sigbus(tid: u32) -> bool {
    let Ok(status) = std::fs::read_to_string(format!("/proc/self/task/{tid}/status")) else { return false };
    let Some(hex) = status.lines().find_map(|l| l.strip_prefix("SigBlk:")) else { return false };
    u64::from_str_radix(hex.trim(), 16).is_ok_and(|mask| mask & (1 << (libc::SIGBUS - 1)) != 0)
}

/// Whether thread `tid` is one of the kernel's io_uring workers (`PF_IO_WORKER` in the flags
/// of its `stat`): they block every signal, and never run the program's code.
fn is_io_worker(tid: u32) -> bool {
    const PF_IO_WORKER: u64 = 0x10;
    let Ok(stat) = std::fs::read_to_string(format!("/proc/self/task/{tid}/stat")) else { return false };
    // The command name (field 2) may hold spaces and parentheses: count from its end. The
    // flags are field 9, the seventh after it.
    let flags = stat.rfind(')').and_then(|i| stat[i + 1..].split_whitespace().nth(6)?.parse::<u64>().ok());
    flags.is_some_and(|f| f & PF_IO_WORKER != 0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_thread_that_blocks_sigbus_is_seen_in_its_status() {
        let (tx, rx) = std::sync::mpsc::channel();
        let (done_tx, done_rx) = std::sync::mpsc::channel::<()>();
        let t = std::thread::spawn(move || {
            // SAFETY: a one-signal set of ours added to this thread's mask.
            unsafe {
                let mut set: libc::sigset_t = std::mem::zeroed();
                libc::sigemptyset(&mut set);
                libc::sigaddset(&mut set, libc::SIGBUS);
                libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut());
            }
            // SAFETY: gettid has no arguments.
            tx.send(unsafe { libc::gettid() } as u32).unwrap();
            let _ = done_rx.recv_timeout(Duration::from_secs(10));
        });
        let tid = rx.recv_timeout(Duration::from_secs(10)).unwrap();
        assert!(thread_blocks_sigbus(tid));
        // SAFETY: gettid has no arguments.
        assert!(!thread_blocks_sigbus(unsafe { libc::gettid() } as u32));
        done_tx.send(()).unwrap();
        t.join().unwrap();
    }
}
