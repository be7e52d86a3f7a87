//! Signal mode: a SIGBUS handler installed after the pager, which does not chain to uswap's,
//! would receive uswap's faults (and the program would die or misbehave). `Pager::map`,
//! `Pager::check_signal_delivery` and `PagerBuilder::build` notice and say what to do. Its
//! own test binary: it replaces the process's SIGBUS handler.

use std::sync::atomic::{AtomicUsize, Ordering};

use uswap::{DeviceConfig, Error, FaultMode, Pager, PAGE_SIZE};

static APP_HITS: AtomicUsize = AtomicUsize::new(0);

extern "C" fn app_handler(_sig: libc::c_int) {
    APP_HITS.fetch_add(1, Ordering::SeqCst);
}

fn signal_pager() -> Result<Pager, Error> {
    Pager::builder().resident_limit(1 << 20).fault_mode(FaultMode::Signal).device(DeviceConfig::ram(16 << 20)).build()
}

#[test]
fn sigbus_handler_replaced_after_the_pager_is_detected() {
    let p = signal_pager().expect("pager");
    let region = p.map(4 << 20).expect("map while uswap's handler is in place");
    p.check_signal_delivery().expect("uswap's handler is in place");

    // The program installs its own SIGBUS handler, without chaining.
    // SAFETY: sigaction is plain data; all zeros is a valid value.
    let mut uswap_action: libc::sigaction = unsafe { std::mem::zeroed() };
    // SAFETY: a zeroed sigaction with a one-argument handler; the old one is saved to restore.
    unsafe {
        let mut sa: libc::sigaction = std::mem::zeroed();
        sa.sa_sigaction = app_handler as *const () as usize;
        libc::sigemptyset(&mut sa.sa_mask);
        assert_eq!(libc::sigaction(libc::SIGBUS, &sa, &mut uswap_action), 0);
    }
    let m = p.map(1 << 20).map(|_| ());
    assert!(matches!(m, Err(Error::SigbusHandlerReplaced)), "map: {m:?}");
    let c = p.check_signal_delivery();
    assert!(matches!(c, Err(Error::SigbusHandlerReplaced)), "check: {c:?}");
    let b = signal_pager().map(|_| ());
    assert!(matches!(b, Err(Error::SigbusHandlerReplaced)), "build: {b:?}");
    let msg = Error::SigbusHandlerReplaced.to_string();
    assert!(msg.contains("before building") && msg.contains("FaultMode::Thread"), "{msg}");

    // Back to uswap's handler: everything works again, and the program's handler saw nothing.
    // SAFETY: restoring the action saved above.
    unsafe { assert_eq!(libc::sigaction(libc::SIGBUS, &uswap_action, std::ptr::null_mut()), 0) };
    p.check_signal_delivery().expect("uswap's handler is back");
    let mut r2 = p.map(1 << 20).expect("map");
    let w = region.as_atomic_u64s();
    for i in 0..region.len() / PAGE_SIZE {
        w[i * PAGE_SIZE / 8].store(i as u64 + 1, Ordering::Relaxed);
    }
    r2.as_mut_slice()[0] = 9;
    for i in 0..region.len() / PAGE_SIZE {
        assert_eq!(w[i * PAGE_SIZE / 8].load(Ordering::Relaxed), i as u64 + 1, "page {i}");
    }
    assert!(p.stats().pswpin > 0);
    assert_eq!(APP_HITS.load(Ordering::SeqCst), 0);
}
