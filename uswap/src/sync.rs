//! A spin lock that is safe to take in a signal handler, and the per-thread count of engine
//! locks held that lets the signal-mode fault path know when it must not take any; the
//! futex waits and [`Doze`], the sleep of the engine's own threads between their rounds.
//!
//! Why not `std::sync::Mutex` or `parking_lot`: in signal mode the fault path runs inside a
//! SIGBUS handler on the application's thread. `parking_lot` allocates per-thread parking
//! data lazily; a futex mutex would be fine but gains nothing for critical sections that are
//! a few dozen instructions long. Every critical section guarded by a [`SpinLock`] is short
//! and bounded, allocates nothing, and nests only as the hierarchy below says.
//!
//! # The lock hierarchy (the one place it is written)
//!
//! Every lock of the engine, outermost first. A thread holding one may take only locks
//! further down the list, and only in the order given; "try" means it may only `try_lock`
//! (and does something else on failure), so it never waits.
//!
//! 0. **Event reader lock** (`events::EventState::reader`, a std mutex, engine threads only):
//!    held across a read of the regions' userfaultfd and the application of the events it
//!    returned, so that events are applied in the order the kernel sent them. Its holder
//!    waits for page busy bits (1) and takes the take-out list's std mutex (a leaf, held by
//!    `events::run_take_outs` across device reads and ioctls that never wait on an event);
//!    no owner of a busy bit ever waits for either.
//! 1. **Page busy bits** (`page_table::Pte`, one per page): ownership of a page, taken by a
//!    compare-and-swap. Faults, reclaim and the async-readahead starter hold them; a holder
//!    may take further busy bits only with `try_lock`. The only waits on a busy bit are a
//!    fault waiting for its own page while holding nothing else (bounded:
//!    `fault_service::BUSY_WAIT_LIMIT_NS`, counted in `fault_busy_timeout`). May be held across
//!    system calls and device I/O.
//! 2. **Async-readahead context lock** (`async_readahead::Context::io`, a [`SpinLock`]):
//!    held while starting, waiting for and mapping from a context's reads, and across
//!    `SwapDevices::free` of the pages it maps (which takes 5, and 4 too: the per-CPU free
//!    batch it may flush holds slots of any device, a compressed pool's among them, whose
//!    `invalidate` takes that pool's locks). Never two at once. Taken
//!    with `lock` only by a fault that owns its page (1) and wants that context's data, and
//!    with "try" by the starter; its holder only try-locks pages. **Exception to the no
//!    system call rule**: held across the context's reads (io_uring, ~250 µs on a file
//!    device), because the waiter needs exactly that data; never taken on the lock-free
//!    fault route.
//! 3. **Device I/O channel locks**: one [`SpinLock`] per io_uring of a file device
//!    (`backend::file`) and per direct-read connection of a Redis device
//!    (`backend::redis::direct`). "Try" only, never waited on (a caller that finds every
//!    ring busy, or holds any engine lock, uses `pread`/`pwrite`; one that finds every
//!    connection busy hands its read to a device thread). **Exception to the no system call
//!    rule**: held across `io_uring_enter`, and a connection's `write` and `read`s; harmless
//!    since nobody spins behind them.
//! 4. **Compressed pool**: a size class's lock, then the arena (free chunks) lock.
//!    Leaves: nothing else is taken under them; no system call.
//! 5. **Swap slots**: the per-CPU free batch lock (`swap::SwapDevices`), a leaf released
//!    before its batch is freed; then, for allocation and frees, the per-CPU cluster lock
//!    (its holder may "try" other CPUs' per-CPU locks) → a cluster lock → the device's list
//!    lock (`swap::cluster_allocator`). No system call: a cluster's discard runs after the
//!    per-CPU lock is dropped.
//! 6. **`std::sync::Mutex`es**, never on a fault path: the region registry's writer lock
//!    (`mapping::registry`, `Pager::map` and a region's drop; released before anything
//!    else is taken), the pager's thread list (build and drop), and a fork record's pipe
//!    end (`swap::fork_refs`, a leaf: fork preparation and the background reclaimer's sweep;
//!    a fork child only try-locks it).
//!
//! **The order is asserted.** Every [`SpinLock`] has a [`LockClass`], one per lock of levels
//! 2 to 5 in the order listed (async-readahead context, device I/O channel, size class, arena,
//! per-CPU free batch, per-CPU cluster, cluster, device list). Each thread keeps a count of
//! the locks it holds per class; [`SpinLock::lock`] panics, in release builds too, with
//! "uswap invariant: lock order: taking X while holding Y" if the thread holds a lock of the
//! same class or a later one, since waiting there is how a deadlock starts. `try_lock` never
//! waits and so may take any class ("try" above); it is counted like a held lock. Levels 0,
//! 1 and 6 are not `SpinLock`s and are not checked. The unit tests in this module check the
//! check; every other test of the crate runs with it on, so `cargo test -p uswap` passing is
//! the evidence that the engine keeps this order on the paths those tests take.
//!
//! Under every [`SpinLock`]: no allocation, no blocking on anything but a lower lock, and no
//! system call except the two exceptions above (and `sched_yield` while *waiting*, see
//! [`Relax`]). In signal mode a fault taken by a thread that holds any [`SpinLock`] takes
//! none ([`locks_held_by_this_thread`], the lock-free route), and engine calls made by the
//! application that hold busy bits or locks block its asynchronous signals
//! (`uffd::AsyncSignalsBlocked`), so no signal handler runs, and faults, on top of them.
//!
//! The per-thread count: a signal handler of the application (say SIGALRM) may touch
//! managed memory while its thread is inside an engine call that holds a spin lock. The
//! nested SIGBUS must then not take any engine lock, or the thread would wait on itself.
//! [`locks_held_by_this_thread`] (the sum of the per-class counts) tells the fault path to
//! take its lock-free route. A lock is counted from before its wait until after its release,
//! so a signal arriving while the thread waits for a lock, or just after it let one go, sees
//! it as held. A handler taking the ordinary route starts from a count of zero and leaves it
//! there, so the check never sees an interrupted thread's locks from inside a handler.
//!
//! Pools of pre-allocated objects (bounce buffers, the compressed pool's workspaces and
//! zstd contexts) lend them without a lock: [`pop_spinning`] takes one from a lock-free
//! queue, spinning with backoff while all are lent out (for up to [`POP_WAIT_LIMIT_NS`], then
//! the caller fails its operation), and the borrower pushes it back.

use std::cell::Cell;
use std::marker::PhantomData;
use std::ops::{Deref, DerefMut};
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

use crossbeam_queue::ArrayQueue;
use crossbeam_utils::Backoff;

/// The class of a [`SpinLock`]: its place in the lock hierarchy above (levels 2 to 5),
/// outermost first. A thread may `lock` only a class later than every class it holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
#[repr(u8)]
pub enum LockClass {
    /// 2: `async_readahead::Context::io`.
    AsyncReadaheadContext = 0,
    /// 3: one I/O channel of a device: an io_uring of a file device (`backend::file`), a
    /// direct-read connection of a Redis device (`backend::redis::direct`); only ever
    /// try-locked.
    DeviceChannel,
    /// 4: a compressed pool's size class (`backend::zpool`).
    ZpoolSizeClass,
    /// 4: a compressed pool's arena of free chunks (`backend::zpool`).
    ZpoolArena,
    /// 5: a per-CPU batch of slots waiting to be freed (`swap::SwapDevices`).
    SwapFreeBatch,
    /// 5: a CPU's current cluster (`swap::cluster_allocator`).
    SwapPerCpuCluster,
    /// 5: one cluster's allocation bitmap (`swap::cluster_allocator`).
    SwapCluster,
    /// 5: a device's cluster lists (`swap::cluster_allocator`).
    SwapDeviceLists,
}

/// Bits per class in the per-thread count of locks held: a thread may hold up to 255 locks
/// of one class (only `try_lock` takes a second one of a class).
const CLASS_BITS: u32 = 8;
const CLASS_MASK: u64 = (1 << CLASS_BITS) - 1;
const _: () = assert!((LockClass::SwapDeviceLists as u32 + 1) * CLASS_BITS <= u64::BITS);

impl LockClass {
    const ALL: [LockClass; 8] = [
        LockClass::AsyncReadaheadContext,
        LockClass::DeviceChannel,
        LockClass::ZpoolSizeClass,
        LockClass::ZpoolArena,
        LockClass::SwapFreeBatch,
        LockClass::SwapPerCpuCluster,
        LockClass::SwapCluster,
        LockClass::SwapDeviceLists,
    ];

    /// The name the lock hierarchy above gives it, for the violation message.
    pub const fn name(self) -> &'static str {
        match self {
            LockClass::AsyncReadaheadContext => "the async-readahead context lock",
            LockClass::DeviceChannel => "a device I/O channel lock (file-device ring, Redis connection)",
            LockClass::ZpoolSizeClass => "a compressed-pool size class lock",
            LockClass::ZpoolArena => "the compressed-pool arena lock",
            LockClass::SwapFreeBatch => "a swap-slot per-CPU free batch lock",
            LockClass::SwapPerCpuCluster => "a per-CPU cluster lock",
            LockClass::SwapCluster => "a cluster lock",
            LockClass::SwapDeviceLists => "a device list lock",
        }
    }

    /// What one lock of this class adds to the per-thread count ([`HELD`]).
    const fn unit(self) -> u64 {
        1 << (self as u32 * CLASS_BITS)
    }

    /// The latest class with a lock in `held` (a non-zero count), for the violation message.
    fn latest_held(held: u64) -> LockClass {
        let mut latest = LockClass::AsyncReadaheadContext;
        for c in LockClass::ALL {
            if held & (CLASS_MASK * c.unit()) != 0 {
                latest = c;
            }
        }
        latest
    }
}

/// Waits for a [`SpinLock`] of each class (a `lock` that found it held), in this process
/// since it started, by `LockClass` index. Relaxed: a count for the reader, ordering nothing.
static LOCK_WAITS: [AtomicU64; LockClass::ALL.len()] = [const { AtomicU64::new(0) }; LockClass::ALL.len()];

/// How many times a thread of this process waited for another's [`SpinLock`], per class:
/// (the class's name, the waits). Faulting threads are meant to wait for one another only
/// on the same page (its busy bit, which is not a `SpinLock`); a count here is a wait
/// across pages.
pub fn lock_waits() -> [(&'static str, u64); LockClass::ALL.len()] {
    LockClass::ALL.map(|c| (c.name(), LOCK_WAITS[c as usize].load(Ordering::Relaxed)))
}

thread_local! {
    // const-initialised and without a destructor: plain TLS slots, no lazy registration, so a
    // SIGBUS handler may use them.
    //
    // HELD: the calling thread's count of SpinLocks held (or being waited for) per class,
    // CLASS_BITS bits per class, class 0 in the lowest bits, so "a lock of this class or a
    // later one" is one mask.
    static HELD: Cell<u64> = const { Cell::new(0) };
    static SPINS: Cell<u32> = const { Cell::new(0) };
}

/// Number of [`SpinLock`]s the calling thread holds right now (or is waiting for in
/// [`SpinLock::lock`]: a signal arriving while it waits must not take engine locks either).
pub fn locks_held_by_this_thread() -> u32 {
    HELD.with(|h| h.get().to_le_bytes().iter().map(|&n| n as u32).sum())
}

/// Spin with a pause instruction; every 64th round give the CPU away (`sched_yield`, which
/// is async-signal-safe), since on a small VM the holder may be waiting for our vCPU.
///
/// A wait for a [`SpinLock`] ends because of the hierarchy above: a holder takes only lower
/// locks, never waits for a higher one, and is never interrupted by a handler that takes
/// the same lock (the lock-free route, `uffd::AsyncSignalsBlocked`).
pub struct Relax;

impl spin::RelaxStrategy for Relax {
    fn relax() {
        let n = SPINS.with(|s| {
            let n = s.get().wrapping_add(1);
            s.set(n);
            n
        });
        if n % 64 == 0 {
            std::thread::yield_now();
        } else {
            std::hint::spin_loop();
        }
    }
}

/// How long [`pop_spinning`] waits for an object to come back before giving up. Lenders
/// hold an object for one page's (de)compression or one swap-in's device read; ten seconds
/// (as `fault_service::BUSY_WAIT_LIMIT_NS`) is beyond any legitimate wait, and a caller that gives
/// up fails its operation (counted) where waiting would hang its thread for good.
pub const POP_WAIT_LIMIT_NS: u64 = if cfg!(test) { 200_000_000 } else { 10_000_000_000 };

/// Takes an object from a pool of pre-allocated ones, spinning (with backoff) until one is
/// given back if all are lent out, for up to `limit_ns`; None when none came back in time
/// (the caller fails its operation and counts it). Takes no lock and allocates nothing
/// (`clock_gettime` is async-signal-safe): a SIGBUS handler may call it.
pub fn pop_spinning<T>(pool: &ArrayQueue<T>, limit_ns: u64) -> Option<T> {
    let backoff = Backoff::new();
    let mut since: Option<u64> = None;
    loop {
        if let Some(x) = pool.pop() {
            return Some(x);
        }
        // The clock is read only once the pool was found empty: the common case costs a pop.
        let now = crate::clock::now_ns();
        if now.saturating_sub(*since.get_or_insert(now)) > limit_ns {
            return None;
        }
        backoff.snooze();
    }
}

/// A spin lock of a [`LockClass`] that keeps the per-thread count of locks held and asserts
/// the lock hierarchy on every blocking [`lock`](SpinLock::lock).
pub struct SpinLock<T> {
    lock: spin::mutex::SpinMutex<T, Relax>,
    class: LockClass,
}

impl<T> SpinLock<T> {
    pub const fn new(class: LockClass, value: T) -> Self {
        SpinLock { lock: spin::mutex::SpinMutex::new(value), class }
    }

    /// Waits for the lock. Panics (in release builds too) if this thread holds a lock of the
    /// same class or a later one: waiting there could deadlock, the hierarchy forbids it.
    pub fn lock(&self) -> SpinGuard<'_, T> {
        let unit = self.class.unit();
        HELD.with(|h| {
            let held = h.get();
            // `unit.wrapping_neg()` is every bit from this class's up: this class and later.
            assert!(
                held & unit.wrapping_neg() == 0,
                "uswap invariant: lock order: taking {} while holding {}; see sync.rs's lock hierarchy",
                self.class.name(),
                LockClass::latest_held(held).name()
            );
            // Counted before waiting: a signal arriving during the wait takes the lock-free
            // route as if the lock were held.
            h.set(held + unit);
        });
        let guard = match self.lock.try_lock() {
            Some(g) => g,
            None => {
                // Another thread holds it: this one waits (counted per class, for
                // `lock_waits`; the shared counter is touched only on contention).
                LOCK_WAITS[self.class as usize].fetch_add(1, Ordering::Relaxed);
                self.lock.lock()
            }
        };
        SpinGuard { guard: Some(guard), unit, _same_thread: PhantomData }
    }

    /// Takes the lock if it is free, never waiting, so any class may be tried whatever the
    /// thread holds (the hierarchy's "try"); the hold counts like a [`lock`](SpinLock::lock).
    pub fn try_lock(&self) -> Option<SpinGuard<'_, T>> {
        let unit = self.class.unit();
        HELD.with(|h| {
            let held = h.get();
            assert!(
                held & (CLASS_MASK * unit) != CLASS_MASK * unit,
                "uswap invariant: lock order: more than {CLASS_MASK} of {} held by one thread",
                self.class.name()
            );
            h.set(held + unit);
        });
        match self.lock.try_lock() {
            Some(g) => Some(SpinGuard { guard: Some(g), unit, _same_thread: PhantomData }),
            None => {
                HELD.with(|h| h.set(h.get() - unit));
                None
            }
        }
    }
}

pub struct SpinGuard<'a, T> {
    // An Option only so that Drop can release the lock *before* lowering the count: a signal
    // arriving in between must still see the lock as held by this thread.
    guard: Option<spin::mutex::SpinMutexGuard<'a, T>>,
    // What the lock added to HELD (its class's unit).
    unit: u64,
    // Not Send: dropped on another thread, it would lower that thread's count.
    _same_thread: PhantomData<*const ()>,
}

impl<T> Deref for SpinGuard<'_, T> {
    type Target = T;
    fn deref(&self) -> &T {
        self.guard.as_ref().expect("guard is Some until drop")
    }
}

impl<T> DerefMut for SpinGuard<'_, T> {
    fn deref_mut(&mut self) -> &mut T {
        self.guard.as_mut().expect("guard is Some until drop")
    }
}

impl<T> Drop for SpinGuard<'_, T> {
    fn drop(&mut self) {
        drop(self.guard.take());
        HELD.with(|h| h.set(h.get() - self.unit));
    }
}

/// Sleeps while `*word == expected`, at most `timeout_ns` as the kernel measures it (a
/// relative `FUTEX_WAIT`). Async-signal-safe (one system call); spurious returns are fine,
/// callers re-check.
pub(crate) fn futex_wait(word: &AtomicU32, expected: u32, timeout_ns: u64) {
    let ts = libc::timespec {
        tv_sec: (timeout_ns / 1_000_000_000).min(libc::time_t::MAX as u64) as libc::time_t,
        tv_nsec: (timeout_ns % 1_000_000_000) as libc::c_long,
    };
    // SAFETY: FUTEX_WAIT on a live, aligned u32 (an AtomicU32) with a valid relative timeout.
    unsafe {
        libc::syscall(
            libc::SYS_futex,
            word.as_ptr(),
            libc::FUTEX_WAIT | libc::FUTEX_PRIVATE_FLAG,
            expected,
            &ts as *const libc::timespec,
        )
    };
}

/// Wakes up to `n` threads sleeping on `word`. Async-signal-safe.
pub(crate) fn futex_wake(word: &AtomicU32, n: i32) {
    // SAFETY: FUTEX_WAKE on a live, aligned u32; no memory is accessed through the pointer.
    unsafe { libc::syscall(libc::SYS_futex, word.as_ptr(), libc::FUTEX_WAKE | libc::FUTEX_PRIVATE_FLAG, n) };
}

/// One engine thread's sleep between rounds (the background reclaimer's, a dormant fault
/// handler's), and the wake-up that ends it early. Not `std::thread::park_timeout`: std
/// turns the timeout into a deadline read from `clock_gettime` as the process binds it,
/// which a preloaded fake clock (libfaketime) puts years ahead (the thread slept until
/// woken: no idle reclaim, no aging, no `--auto`) or in the past (it spun). The timeout here
/// is the kernel's. A wake-up given while the thread is awake ends its next sleep at once,
/// as a park token does. Lock-free; [`Doze::wake`] is async-signal-safe (a swap and at most
/// one system call).
pub struct Doze {
    /// 1: a wake-up is pending.
    token: AtomicU32,
}

impl Doze {
    pub const fn new() -> Doze {
        Doze { token: AtomicU32::new(0) }
    }

    /// Sleeps until woken or `timeout` has passed (or spuriously: callers re-check).
    pub fn sleep(&self, timeout: std::time::Duration) {
        if self.token.swap(0, Ordering::Acquire) == 1 {
            return;
        }
        futex_wait(&self.token, 0, u64::try_from(timeout.as_nanos()).unwrap_or(u64::MAX));
        // The wake-up that ended the sleep is taken; one given after this ends the next.
        self.token.swap(0, Ordering::Acquire);
    }

    pub fn wake(&self) {
        if self.token.swap(1, Ordering::Release) == 0 {
            futex_wake(&self.token, 1);
        }
    }
}

impl Default for Doze {
    fn default() -> Doze {
        Doze::new()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A doze ends when woken from another thread, long before its timeout; a wake-up given
    /// first ends the next sleep at once; without one it lasts its timeout, timed by the
    /// kernel.
    #[test]
    fn a_doze_ends_when_woken_or_when_its_time_is_up() {
        use std::time::{Duration, Instant};
        let doze = std::sync::Arc::new(Doze::new());
        let d = doze.clone();
        let sleeper = std::thread::spawn(move || {
            let t0 = Instant::now();
            d.sleep(Duration::from_secs(30));
            t0.elapsed()
        });
        std::thread::sleep(Duration::from_millis(50));
        doze.wake();
        let slept = sleeper.join().expect("sleeper");
        assert!(slept < Duration::from_secs(10), "woken after {slept:?}");
        doze.wake();
        let t0 = Instant::now();
        doze.sleep(Duration::from_secs(30));
        assert!(t0.elapsed() < Duration::from_secs(10), "a pending wake-up was lost");
        let t0 = Instant::now();
        doze.sleep(Duration::from_millis(100));
        let slept = t0.elapsed();
        assert!(slept >= Duration::from_millis(90) && slept < Duration::from_secs(10), "slept {slept:?}");
    }
    use std::sync::Arc;

    #[test]
    fn counts_nested_locks_and_excludes_other_threads() {
        let a = SpinLock::new(LockClass::SwapPerCpuCluster, 0u32);
        let b = SpinLock::new(LockClass::SwapCluster, 0u32);
        assert_eq!(locks_held_by_this_thread(), 0);
        {
            let _ga = a.lock();
            let _gb = b.lock();
            assert_eq!(locks_held_by_this_thread(), 2);
            assert!(a.try_lock().is_none());
            assert_eq!(locks_held_by_this_thread(), 2, "a failed try_lock left a count behind");
        }
        assert_eq!(locks_held_by_this_thread(), 0);

        let counter = Arc::new(SpinLock::new(LockClass::SwapDeviceLists, 0u64));
        let threads: Vec<_> = (0..4)
            .map(|_| {
                let c = counter.clone();
                std::thread::spawn(move || {
                    for _ in 0..10_000 {
                        *c.lock() += 1;
                    }
                    locks_held_by_this_thread()
                })
            })
            .collect();
        for t in threads {
            assert_eq!(t.join().unwrap(), 0);
        }
        assert_eq!(*counter.lock(), 40_000);
    }

    #[test]
    fn every_class_taken_in_hierarchy_order_nests() {
        let locks: Vec<SpinLock<u8>> = LockClass::ALL.iter().map(|&c| SpinLock::new(c, c as u8)).collect();
        assert!(LockClass::ALL.windows(2).all(|w| w[0] < w[1]), "LockClass::ALL out of order");
        let mut guards = Vec::new();
        for (i, l) in locks.iter().enumerate() {
            let g = l.lock();
            assert_eq!(*g, i as u8);
            guards.push(g);
            assert_eq!(locks_held_by_this_thread(), i as u32 + 1);
        }
        assert_eq!(HELD.with(|h| h.get()), 0x0101_0101_0101_0101, "one lock of each class");
        // Released in any order (not only innermost first), the counts stay exact.
        guards.swap(0, 5);
        while let Some(g) = guards.pop() {
            drop(g);
            assert_eq!(locks_held_by_this_thread(), guards.len() as u32);
        }
        assert_eq!(HELD.with(|h| h.get()), 0);
        // And after a release, an earlier class may be waited for again.
        let _g = locks[7].lock();
        drop(_g);
        let _g0 = locks[0].lock();
    }

    #[test]
    #[should_panic(
        expected = "uswap invariant: lock order: taking a per-CPU cluster lock while holding a cluster lock; see sync.rs's lock hierarchy"
    )]
    fn waiting_for_an_earlier_class_while_holding_a_later_one_panics() {
        let percpu = SpinLock::new(LockClass::SwapPerCpuCluster, ());
        let cluster = SpinLock::new(LockClass::SwapCluster, ());
        let _c = cluster.lock();
        // Free, so without the check this would not even wait: the order alone is the bug.
        let _p = percpu.lock();
    }

    #[test]
    #[should_panic(
        expected = "uswap invariant: lock order: taking a compressed-pool size class lock while holding a compressed-pool size class lock; see sync.rs's lock hierarchy"
    )]
    fn waiting_for_a_second_lock_of_a_held_class_panics() {
        let a = SpinLock::new(LockClass::ZpoolSizeClass, ());
        let b = SpinLock::new(LockClass::ZpoolSizeClass, ());
        let _a = a.lock();
        let _b = b.lock();
    }

    #[test]
    fn try_lock_takes_any_class_and_counts_it() {
        let own = SpinLock::new(LockClass::SwapPerCpuCluster, 1u32);
        let others: Vec<_> = (2..5u32).map(|v| SpinLock::new(LockClass::SwapPerCpuCluster, v)).collect();
        let lists = SpinLock::new(LockClass::SwapDeviceLists, 9u32);
        let ring = SpinLock::new(LockClass::DeviceChannel, 0u32);
        let _own = own.lock();
        let _lists = lists.lock();
        // Same class and earlier classes are tried, never waited for: allowed.
        let tried: Vec<_> = others.iter().map(|l| l.try_lock().expect("free lock")).collect();
        assert_eq!(tried.iter().map(|g| **g).sum::<u32>(), 2 + 3 + 4);
        let _ring = ring.try_lock().expect("free lock");
        assert_eq!(locks_held_by_this_thread(), 6);
        let held = HELD.with(|h| h.get());
        assert_eq!((held / LockClass::SwapPerCpuCluster.unit()) & CLASS_MASK, 4);
        assert_eq!((held / LockClass::DeviceChannel.unit()) & CLASS_MASK, 1);
        // A held one fails and counts nothing.
        assert!(others[0].try_lock().is_none());
        assert_eq!(locks_held_by_this_thread(), 6);
        drop(tried);
        assert_eq!(locks_held_by_this_thread(), 3);
    }

    #[test]
    fn another_thread_holding_the_lock_is_waited_for() {
        // The count is per thread: a lock of a class this thread does not hold is waited for
        // while another thread holds it.
        let l = Arc::new(SpinLock::new(LockClass::SwapCluster, 0u32));
        let (held_tx, held_rx) = std::sync::mpsc::channel();
        let (release_tx, release_rx) = std::sync::mpsc::channel::<()>();
        let holder = {
            let l = l.clone();
            std::thread::spawn(move || {
                let mut g = l.lock();
                held_tx.send(()).unwrap();
                release_rx.recv_timeout(std::time::Duration::from_secs(10)).expect("never told to release");
                *g = 7;
            })
        };
        held_rx.recv_timeout(std::time::Duration::from_secs(10)).expect("holder stuck taking a free lock");
        assert_eq!(locks_held_by_this_thread(), 0);
        release_tx.send(()).unwrap();
        assert_eq!(*l.lock(), 7);
        holder.join().unwrap();
        assert_eq!(locks_held_by_this_thread(), 0);
    }

    #[test]
    fn pop_spinning_waits_until_an_object_is_given_back() {
        let pool = Arc::new(ArrayQueue::new(1));
        pool.push(7u32).unwrap();
        // The borrower takes the one object, then spins on the empty pool until this thread
        // pushes another. It runs on its own thread so that a hang fails the test here.
        let (tx, rx) = std::sync::mpsc::channel();
        let borrower = {
            let pool = pool.clone();
            std::thread::spawn(move || {
                for _ in 0..2 {
                    tx.send(pop_spinning(&pool, POP_WAIT_LIMIT_NS * 50)).unwrap();
                }
            })
        };
        let timeout = std::time::Duration::from_secs(10);
        let first = rx.recv_timeout(timeout).expect("stuck in pop_spinning on a pool holding an object");
        assert_eq!(first, Some(7));
        std::thread::sleep(std::time::Duration::from_millis(20));
        assert!(rx.try_recv().is_err(), "took an object from an empty pool");
        pool.push(9).unwrap();
        let second = rx.recv_timeout(timeout).expect("stuck in pop_spinning: the object given back was not taken");
        assert_eq!(second, Some(9));
        borrower.join().unwrap();
        assert!(pool.is_empty());
    }

    /// A pool whose objects never come back (every lender stuck) makes the borrower give up
    /// after the bound instead of spinning forever.
    #[test]
    fn pop_spinning_gives_up_on_a_pool_exhausted_past_the_bound() {
        let pool: Arc<ArrayQueue<u32>> = Arc::new(ArrayQueue::new(1));
        let (tx, rx) = std::sync::mpsc::channel();
        let borrower = {
            let pool = pool.clone();
            std::thread::spawn(move || {
                let t0 = std::time::Instant::now();
                let r = pop_spinning(&pool, POP_WAIT_LIMIT_NS);
                tx.send((r, t0.elapsed())).unwrap();
            })
        };
        let (r, waited) = rx
            .recv_timeout(std::time::Duration::from_secs(10))
            .expect("stuck in pop_spinning on a pool exhausted for good: the wait has no bound");
        assert_eq!(r, None);
        assert!(waited.as_nanos() as u64 >= POP_WAIT_LIMIT_NS, "gave up after {waited:?}");
        borrower.join().unwrap();
        // An object given back later is still there for the next borrower.
        pool.push(3).unwrap();
        assert_eq!(pop_spinning(&pool, POP_WAIT_LIMIT_NS), Some(3));
    }
}
