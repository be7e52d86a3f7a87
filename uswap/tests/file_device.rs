//! A regular file as the swap device: who may read it, what happens to a path that does not
//! exist, and what is left in a file the user keeps once the pager is gone.

use std::fs;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};

use uswap::backend::file::FileDeviceError;
use uswap::{DeviceConfig, Error, FaultMode, Pager, PAGE_SIZE};

mod common;
use common::*;

/// A fresh directory under the temporary directory (ext4 here: O_DIRECT and hole punching),
/// removed with its contents on drop.
struct TestDir(PathBuf);

impl TestDir {
    fn new(tag: &str) -> TestDir {
        static N: AtomicUsize = AtomicUsize::new(0);
        let p = std::env::temp_dir().join(format!(
            "uswap-filedev-{tag}-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        ));
        fs::create_dir(&p).unwrap();
        TestDir(p)
    }
}

impl Drop for TestDir {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.0);
    }
}

fn build(mode: FaultMode, path: &Path, bytes: u64) -> Result<Pager, Error> {
    Pager::builder().resident_limit(2 * MIB).fault_mode(mode).device(DeviceConfig::file(path, bytes)).build()
}

/// Pages of `path` holding any non-zero byte (the whole file is read).
fn nonzero_pages(path: &Path) -> Vec<u64> {
    let bytes = fs::read(path).unwrap();
    bytes.chunks(PAGE_SIZE).enumerate().filter(|(_, p)| p.iter().any(|&b| b != 0)).map(|(i, _)| i as u64).collect()
}

#[test]
fn a_file_other_users_may_read_is_refused_with_the_chmod_to_run() {
    let dir = TestDir::new("mode");
    let path = dir.0.join("swapfile");
    for mode in [0o644, 0o640, 0o604, 0o620, 0o602] {
        fs::write(&path, b"").unwrap();
        fs::set_permissions(&path, fs::Permissions::from_mode(mode)).unwrap();
        let e = build(FaultMode::Thread, &path, 8 * MIB).expect_err("a readable swap file must be refused");
        match &e {
            Error::FileDevice(FileDeviceError::OthersMayAccess { mode: m, .. }) => assert_eq!(*m, mode, "{e}"),
            other => panic!("mode {mode:o}: {other}"),
        }
        let msg = e.to_string();
        assert!(msg.contains(&format!("chmod 600 {}", path.display())), "{msg}");
        assert!(msg.contains(&format!("{mode:04o}")), "{msg}");
        assert_eq!(fs::metadata(&path).unwrap().len(), 0, "a refused file is not touched");
        assert_eq!(fs::metadata(&path).unwrap().mode() & 0o777, mode, "nor its mode");
    }
    // What the message says to do works.
    fs::set_permissions(&path, fs::Permissions::from_mode(0o600)).unwrap();
    let p = build(FaultMode::Thread, &path, 8 * MIB).unwrap();
    let r = p.map(4 * MIB as usize).unwrap();
    rewrite_and_check(r.as_atomic_u64s(), 2);
    assert!(p.stats().pswpout > 0);
}

#[test]
fn a_path_that_does_not_exist_is_created_with_mode_0600() {
    let dir = TestDir::new("create");
    let path = dir.0.join("new-swapfile");
    let p = build(FaultMode::Signal, &path, 8 * MIB).unwrap();
    let meta = fs::metadata(&path).expect("the swap file is created at the path given");
    assert!(meta.is_file());
    assert_eq!(meta.mode() & 0o7777, 0o600, "only its owner may read it");
    assert_eq!(meta.len(), 8 * MIB, "sized to the capacity");
    let r = p.map(4 * MIB as usize).unwrap();
    rewrite_and_check(r.as_atomic_u64s(), 2);
    assert!(p.stats().pswpout > 0);
    // A missing directory on the way is still an error that says what to give.
    let e = build(FaultMode::Thread, &dir.0.join("no/such/dir/swapfile"), 8 * MIB).expect_err("no parent directory");
    assert!(matches!(e, Error::FileDevice(FileDeviceError::NotFound { .. })), "{e}");
    assert!(e.to_string().contains("existing directory"), "{e}");
}

/// Swaps a region of 4x the limit through a kept file, with rewrites (so slots are freed
/// while the pager runs), then drops region and pager and reads the whole file.
fn kept_file_is_scrubbed(mode: FaultMode) {
    let dir = TestDir::new("scrub");
    let path = dir.0.join("kept");
    fs::write(&path, b"").unwrap();
    fs::set_permissions(&path, fs::Permissions::from_mode(0o600)).unwrap();
    let p = build(mode, &path, 32 * MIB).unwrap();
    let r = p.map(8 * MIB as usize).unwrap();
    let words = r.as_atomic_u64s();
    let pages = r.len() / PAGE_SIZE;
    write_every_page(words);
    let mut rng = Rng(0x5eed);
    for _ in 0..4000 {
        let i = (rng.next() % pages as u64) as usize;
        write_page(words, i, 2);
        check_page(words, i, 2);
    }
    let st = p.stats();
    assert!(st.pswpout > 1000, "the workload swapped: {st:?}");
    assert!(!nonzero_pages(&path).is_empty(), "swapped pages are in the file while the pager runs");
    drop(r);
    drop(p);
    let left = nonzero_pages(&path);
    assert!(
        left.is_empty(),
        "{mode:?}: {} pages of swapped data left in the kept file after the pager was dropped (first: {:?})",
        left.len(),
        &left[..left.len().min(8)]
    );
    assert_eq!(fs::metadata(&path).unwrap().len(), 32 * MIB, "the file keeps its size");
    // The lock is gone with the device: the file can be used again at once.
    let p = build(mode, &path, 32 * MIB).unwrap();
    drop(p);
}

#[test]
fn a_kept_swap_file_holds_no_swapped_data_after_the_pager_is_dropped_thread_mode() {
    kept_file_is_scrubbed(FaultMode::Thread);
}

#[test]
fn a_kept_swap_file_holds_no_swapped_data_after_the_pager_is_dropped_signal_mode() {
    kept_file_is_scrubbed(FaultMode::Signal);
}

/// A small tmpfs mounted for one test (root only), unmounted with its contents on drop.
struct SmallFs(TestDir);

impl SmallFs {
    /// `None` (said) where it cannot be mounted (not root).
    fn mount(tag: &str, size_mib: u64) -> Option<SmallFs> {
        let dir = TestDir::new(tag);
        let ok = std::process::Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size_mib}m"), "tmpfs"])
            .arg(&dir.0)
            .status()
            .is_ok_and(|s| s.success());
        if !ok {
            skipped("cannot mount a tmpfs to fill up (mount -t tmpfs needs root)");
            return None;
        }
        Some(SmallFs(dir))
    }

    /// Writes a file until the file system is full. Returns its path.
    fn fill(&self) -> PathBuf {
        use std::io::Write;
        let path = self.0 .0.join("filler");
        let mut f = fs::File::create(&path).unwrap();
        let chunk = vec![0x5au8; 64 * 1024];
        // Bounded by the file system's size.
        while f.write_all(&chunk).is_ok() {}
        let _ = f.flush();
        path
    }
}

impl Drop for SmallFs {
    fn drop(&mut self) {
        let _ = std::process::Command::new("umount").arg(&self.0 .0).status();
    }
}

/// Waits up to 10 s for `cond` on the pager's stats, or fails saying what was awaited.
fn wait_for(p: &Pager, what: &str, cond: impl Fn(&uswap::Stats) -> bool) -> uswap::Stats {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    loop {
        let st = p.stats();
        if cond(&st) {
            return st;
        }
        assert!(std::time::Instant::now() < deadline, "waited 10 s for {what}: {st:?}");
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
}

/// A file device whose file system fills up: its first region's clusters are punched out
/// when it is unmapped, another program then takes the space, and the next region's writes
/// fail with `ENOSPC`. The device degrades: the run goes on at the speed of RAM, pages kept
/// over the limit (counted), every byte right. Once space is freed a probe write succeeds
/// and paging resumes, back under the limit.
fn full_file_system(mode: FaultMode) {
    let Some(fs_) = SmallFs::mount("full", 24) else { return };
    let limit = 2 * MIB;
    let p = Pager::builder()
        .resident_limit(limit)
        .fault_mode(mode)
        .device(DeviceConfig::file(&fs_.0 .0, 16 * MIB))
        .build()
        .unwrap();
    let first = p.map(16 * MIB as usize).unwrap();
    for i in 0..first.len() / PAGE_SIZE {
        write_page(first.as_atomic_u64s(), i, 1);
    }
    drop(first);
    wait_for(&p, "the first region's clusters punched out", |st| st.devices[0].clusters_discarded >= 6);
    let filler = fs_.fill();
    let started = std::time::Instant::now();
    let region = p.map(16 * MIB as usize).unwrap();
    let words = region.as_atomic_u64s();
    let nr_pages = region.len() / PAGE_SIZE;
    for v in 1..=3 {
        for i in 0..nr_pages {
            write_page(words, i, v);
        }
    }
    let st = p.stats();
    assert!(started.elapsed() < std::time::Duration::from_secs(5), "stalled: {:?}; {st:?}", started.elapsed());
    assert!(st.devices[0].degraded && st.devices[0].degraded_episodes >= 1, "{st:?}");
    assert!(st.limit_overrun > 0 && st.resident_pages * PAGE_SIZE as u64 > limit, "{st:?}");
    for i in 0..nr_pages {
        check_page(words, i, 3);
    }
    fs::remove_file(filler).unwrap();
    let before = st.pswpout;
    // Faults make the pressure that the recovered device relieves.
    let st = wait_for(&p, "the device to recover and page out again", |st| {
        for i in 0..nr_pages {
            check_page(words, i, 3);
        }
        !st.devices[0].degraded && st.pswpout > before + 1000
    });
    assert_eq!((st.fault_error, st.checksum_errors), (0, 0), "{st:?}");
    for i in 0..nr_pages {
        check_page(words, i, 3);
    }
}

in_both_modes!(full_file_system() => a_full_file_system_degrades_the_device_then_recovers_thread_mode, a_full_file_system_degrades_the_device_then_recovers_signal_mode);
