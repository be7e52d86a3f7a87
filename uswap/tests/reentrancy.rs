//! Re-entrancy: an application signal handler that touches managed memory while its thread
//! is inside an engine call. `set_resident_limit` reclaims in the caller and holds the busy
//! bits of the pages it moves out; a handler touching one of them must not wait for its own
//! thread forever (signal mode: the nested SIGBUS spins on the busy bit; thread mode: the
//! handler thread waits for the bit, the interrupted thread waits for the handler thread).
//!
//! A watchdog aborts the binary with the phase it stuck in: this file holds only these
//! tests so that an abort takes nothing else with it.

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use uswap::{DeviceConfig, FaultMode, Pager, PAGE_SIZE};

mod common;
use common::*;

/// The region the signal handler reads (address, pages), and what it found.
static REGION_ADDR: AtomicUsize = AtomicUsize::new(0);
static REGION_PAGES: AtomicUsize = AtomicUsize::new(0);
static HANDLER_READS: AtomicU64 = AtomicU64::new(0);
static HANDLER_BAD: AtomicU64 = AtomicU64::new(0);
static NEXT: AtomicU64 = AtomicU64::new(1);

/// SIGUSR1: reads the first word of a pseudo-random page of the region (async-signal-safe:
/// atomics and a memory read only) and checks it.
extern "C" fn touch_a_page(_: libc::c_int) {
    let addr = REGION_ADDR.load(Ordering::Acquire);
    let pages = REGION_PAGES.load(Ordering::Acquire);
    if addr == 0 || pages == 0 {
        return;
    }
    let n = NEXT.fetch_add(0x9E37_79B9, Ordering::Relaxed);
    // The oldest pages the main thread rewrote (0, 3, 6, ...): the first victims of the
    // next shrink, so often in flight to the device when the signal arrives.
    let i = 3 * ((n.wrapping_mul(0x2545_F491_4F6C_DD1D) >> 20) as usize % 64) % pages;
    // SAFETY: the region outlives the signal source (both stop before it is dropped); the
    // word is aligned and inside it.
    let got = unsafe { std::ptr::read_volatile((addr + i * PAGE_SIZE) as *const u64) };
    HANDLER_READS.fetch_add(1, Ordering::Relaxed);
    if got != word(i, 1, 0) {
        HANDLER_BAD.fetch_add(1, Ordering::Relaxed);
    }
}

fn run(mode: FaultMode) {
    let phase = std::sync::Arc::new(AtomicUsize::new(0));
    let done = std::sync::Arc::new(AtomicBool::new(false));
    {
        let (phase, done) = (phase.clone(), done.clone());
        std::thread::spawn(move || {
            let deadline = Instant::now() + Duration::from_secs(20);
            while !done.load(Ordering::Acquire) {
                if Instant::now() > deadline {
                    let at = ["setup", "shrinking the limit", "raising the limit", "reading back"]
                        [phase.load(Ordering::Relaxed)];
                    eprintln!("reentrancy ({mode:?}): stuck for 20 s while {at} with SIGUSR1 touching pages");
                    std::process::abort();
                }
                std::thread::sleep(Duration::from_millis(50));
            }
        });
    }
    let p: Pager = Pager::builder()
        .resident_limit(4 * MIB)
        .fault_mode(mode)
        .device(DeviceConfig::file("/var/tmp", 64 * MIB).poll_us(0))
        .build()
        .expect("pager");
    let region = p.map(8 * MIB as usize).expect("map");
    let words = region.as_atomic_u64s();
    let nr_pages = region.len() / PAGE_SIZE;
    write_every_page(words);
    HANDLER_READS.store(0, Ordering::Relaxed);
    HANDLER_BAD.store(0, Ordering::Relaxed);
    REGION_PAGES.store(nr_pages, Ordering::Release);
    REGION_ADDR.store(region.as_ptr() as usize, Ordering::Release);
    // SAFETY: installs a SIGUSR1 handler (no other user in this binary) with an empty mask.
    unsafe {
        let mut sa: libc::sigaction = std::mem::zeroed();
        sa.sa_sigaction = touch_a_page as extern "C" fn(libc::c_int) as usize;
        sa.sa_flags = libc::SA_RESTART;
        assert_eq!(libc::sigaction(libc::SIGUSR1, &sa, std::ptr::null_mut()), 0);
    }
    // SAFETY: the calling thread's id, valid while it lives (it outlives the signaller).
    let me = unsafe { libc::pthread_self() };
    let stop = AtomicBool::new(false);
    std::thread::scope(|s| {
        s.spawn(|| {
            while !stop.load(Ordering::Relaxed) {
                // SAFETY: `me` is alive until `stop` is set and this thread joined.
                unsafe { libc::pthread_kill(me, libc::SIGUSR1) };
                std::thread::sleep(Duration::from_micros(20));
            }
        });
        let until = Instant::now() + Duration::from_secs(3);
        let mut rounds = 0;
        while Instant::now() < until || rounds < 5 {
            phase.store(1, Ordering::Relaxed);
            p.set_resident_limit(MIB).expect("shrink");
            phase.store(2, Ordering::Relaxed);
            p.set_resident_limit(4 * MIB).expect("raise");
            // The other engine calls that take locks in the caller, under the same signals.
            let scratch = p.map(64 << 10).expect("map");
            scratch.as_atomic_u64s()[0].store(1, Ordering::Relaxed);
            drop(scratch);
            assert_eq!(p.stats().fault_busy_timeout, 0);
            phase.store(3, Ordering::Relaxed);
            // Bring pages back dirty (same contents) so the next shrink writes them out,
            // holding their busy bits while the device works.
            for i in (0..nr_pages).step_by(3) {
                check_page(words, i, 1);
                write_page(words, i, 1);
            }
            rounds += 1;
        }
        stop.store(true, Ordering::Relaxed);
    });
    REGION_ADDR.store(0, Ordering::Release);
    done.store(true, Ordering::Release);
    for i in 0..nr_pages {
        check_page(words, i, 1);
    }
    assert!(HANDLER_READS.load(Ordering::Relaxed) > 100, "the handler ran: {}", HANDLER_READS.load(Ordering::Relaxed));
    assert_eq!(HANDLER_BAD.load(Ordering::Relaxed), 0, "the handler read wrong data");
    let st = p.stats();
    assert!(st.pswpout > 0 && st.pswpin > 0, "{st:?}");
    assert_eq!((st.fault_error, st.fault_busy_timeout), (0, 0), "{st:?}");
}

/// Both modes in one test, one after the other: they share the handler's statics.
#[test]
fn a_signal_handler_touching_managed_pages_during_set_resident_limit_is_served() {
    run(FaultMode::Thread);
    run(FaultMode::Signal);
}
