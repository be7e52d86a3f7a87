//! Tests of the file device as a whole (discard, reopening, block devices, a benchmark) and
//! the helpers the tests of every part share.

use super::*;
use crate::backend::AlignedPage;
use crate::backend::SWAPFILE_CLUSTER;
use crate::mapping::{MapOptions, Mapping};
use arrayvec::ArrayVec;
use open::fstat;
use std::fs;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt, PermissionsExt};
use std::sync::atomic::AtomicUsize;

pub(super) const MIB: u64 = 1 << 20;

/// A fresh directory under the temporary directory (ext4 on these machines), removed
/// with its contents on drop.
pub(super) struct TestDir(PathBuf);

impl TestDir {
    pub(super) fn new(tag: &str) -> TestDir {
        static N: AtomicUsize = AtomicUsize::new(0);
        let p = std::env::temp_dir().join(format!(
            "uswap-file-{tag}-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        ));
        fs::create_dir(&p).unwrap();
        TestDir(p)
    }
    pub(super) fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for TestDir {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.0);
    }
}

/// A file only its owner may read and write, as a regular-file device must be.
pub(super) fn write_private(path: &Path, bytes: &[u8]) {
    fs::write(path, bytes).unwrap();
    fs::set_permissions(path, fs::Permissions::from_mode(0o600)).unwrap();
}

pub(super) fn opts(queue_depth: u32, rings: usize) -> FileOptions {
    FileOptions { queue_depth, rings, ..FileOptions::default() }
}

/// xorshift64*: deterministic randomness without a dependency.
pub(super) struct Rng(pub(super) u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    pub(super) fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
    pub(super) fn shuffle<T>(&mut self, v: &mut [T]) {
        for i in (1..v.len()).rev() {
            v.swap(i, self.below(i as u64 + 1) as usize);
        }
    }
}

/// The contents of `slot` at generation `gen`: every byte depends on both and on its
/// position, so a page read from the wrong slot, generation or offset is caught.
pub(super) fn page_bytes(slot: u64, gen: u64) -> [u8; PAGE_SIZE] {
    let mut p = [0u8; PAGE_SIZE];
    for (k, w) in p.chunks_exact_mut(8).enumerate() {
        let mut z =
            slot << 32 ^ gen.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ (k as u64 + 1).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        w.copy_from_slice(&(z ^ (z >> 27)).to_le_bytes());
    }
    p
}

/// A staging area holding, at page `slot`, the contents of `slot` at generation `gen`.
pub(super) fn staging(nr_slots: u64) -> Mapping {
    Mapping::anonymous(nr_slots as usize * PAGE_SIZE, MapOptions { no_huge_pages: true, dont_fork: false }).unwrap()
}

pub(super) fn stage(src: &Mapping, slot: u64, nr: u64, gen: u64) {
    for s in slot..slot + nr {
        src.write(s as usize * PAGE_SIZE, &page_bytes(s, gen));
    }
}

pub(super) fn zero_pages(n: usize) -> Vec<AlignedPage> {
    vec![AlignedPage([0; PAGE_SIZE]); n]
}

/// Random non-overlapping runs `(first slot, pages)` covering part of `[lo, hi)`.
pub(super) fn random_runs(rng: &mut Rng, lo: u64, hi: u64, max_run: u64) -> Vec<(u64, u64)> {
    let mut runs = Vec::new();
    let mut s = lo + rng.below(4);
    while s < hi {
        let n = (1 + rng.below(max_run)).min(hi - s);
        runs.push((s, n));
        s += n + rng.below(4);
    }
    runs
}

/// Writes `runs` (at generation `gens[i]`) in one call; every result must be Ok.
pub(super) fn write_runs(b: &FileBackend, src: &Mapping, runs: &[(u64, u64)], gens: &[u64]) {
    for (&(s, n), &g) in runs.iter().zip(gens) {
        stage(src, s, n, g);
    }
    let mut reqs: Vec<WriteReq<'_>> =
        runs.iter().map(|&(s, n)| WriteReq::new(s, src.pages(s as usize * PAGE_SIZE, n as usize))).collect();
    b.write(&mut reqs);
    for r in &reqs {
        if let Err(e) = &r.result {
            panic!("write of slot {} failed: {e}", r.slot);
        }
    }
}

/// Reads `runs` in one call and checks every byte against generation `gens[i]`.
pub(super) fn read_and_verify(b: &FileBackend, runs: &[(u64, u64)], gens: &[u64]) {
    let total: u64 = runs.iter().map(|r| r.1).sum();
    let mut buf = zero_pages(total as usize);
    let mut reqs = Vec::new();
    let mut rest = &mut buf[..];
    for &(s, n) in runs {
        let (head, tail) = rest.split_at_mut(n as usize);
        reqs.push(ReadReq::new(s, head));
        rest = tail;
    }
    b.read(&mut reqs);
    for r in &reqs {
        if let Err(e) = &r.result {
            panic!("read of slot {} failed: {e}", r.slot);
        }
    }
    drop(reqs);
    let mut off = 0;
    for (&(s, n), &g) in runs.iter().zip(gens) {
        for i in 0..n {
            assert!(buf[off].0 == page_bytes(s + i, g), "slot {} (generation {g}) read back wrong", s + i);
            off += 1;
        }
    }
}

fn blocks(path_or_fd: &OwnedFd) -> u64 {
    fstat(path_or_fd.as_raw_fd()).unwrap().st_blocks as u64
}

#[test]
fn discard_punches_a_hole_that_reads_back_as_zero() {
    for preallocate in [true, false] {
        let dir = TestDir::new("discard");
        let b = FileBackend::open(dir.path(), 4 * MIB, FileOptions { preallocate, ..opts(8, 1) }).unwrap();
        let cluster = SWAPFILE_CLUSTER as u64;
        let src = staging(b.nr_slots());
        let runs: Vec<(u64, u64)> = (0..2 * cluster / 32).map(|i| (i * 32, 32)).collect();
        let gens = vec![5; runs.len()];
        write_runs(&b, &src, &runs, &gens);
        let full = blocks(&b.file);
        assert!(full >= 2 * CLUSTER_BYTES / 512, "written file holds {full} blocks of 512 bytes");
        b.discard(cluster, cluster);
        let after = blocks(&b.file);
        assert!(
            full - after >= CLUSTER_BYTES / 512,
            "discard of one cluster freed only {} blocks (preallocate {preallocate})",
            full - after
        );
        assert_eq!(fstat(b.file.as_raw_fd()).unwrap().st_size as u64, 4 * MIB, "the size is kept");
        let mut buf = zero_pages(cluster as usize);
        buf.iter_mut().for_each(|p| p.0.fill(0xAA));
        let mut r = [ReadReq::new(cluster, &mut buf)];
        b.read(&mut r);
        assert!(r[0].result.is_ok());
        assert!(buf.iter().all(|p| p.0.iter().all(|&x| x == 0)), "a discarded slot reads back zero");
        // The other cluster is untouched.
        read_and_verify(&b, &runs[..runs.len() / 2], &gens[..runs.len() / 2]);
        assert_eq!(b.discard_errors(), 0);
        b.discard(2 * cluster - 1, 2);
        b.discard(u64::MAX, 2);
        assert_eq!(b.discard_errors(), 2, "out-of-range discards are counted, not performed");
        assert_eq!(b.stats().discards, 3);
    }
}

#[test]
fn a_kept_file_is_emptied_on_drop_by_punching_or_by_writing_zeros() {
    let dir = TestDir::new("scrub");
    let path = dir.path().join("kept");
    write_private(&path, b"");
    let b = FileBackend::open(&path, 4 * MIB, opts(4, 1)).unwrap();
    let src = staging(b.nr_slots());
    // Slots in both clusters; none discarded.
    write_runs(&b, &src, &[(0, 3), (700, 5), (1023, 1)], &[1, 2, 3]);
    drop(b);
    let bytes = fs::read(&path).unwrap();
    assert_eq!(bytes.len() as u64, 4 * MIB, "the file keeps its size");
    assert!(bytes.iter().all(|&x| x == 0), "punched out on drop");
    assert!(fs::metadata(&path).unwrap().blocks() < 64, "and deallocated");

    // The fallback where holes cannot be punched: zeros over the whole range, not past it.
    fs::write(&path, vec![0xa5u8; 3 * MIB as usize]).unwrap();
    let f = fs::OpenOptions::new().write(true).custom_flags(libc::O_DIRECT).open(&path).unwrap();
    write_zeros(f.as_raw_fd(), 2 * MIB + PAGE_SIZE as u64).unwrap();
    let bytes = fs::read(&path).unwrap();
    let cut = 2 * MIB as usize + PAGE_SIZE;
    assert!(bytes[..cut].iter().all(|&x| x == 0), "zeroed");
    assert!(bytes[cut..].iter().all(|&x| x == 0xa5), "bytes past the device are left alone");
}

#[test]
fn a_closed_device_can_be_reopened_at_once() {
    let dir = TestDir::new("reopen");
    let path = dir.path().join("swapfile");
    write_private(&path, b"");
    for _ in 0..20 {
        let b = FileBackend::open(&path, 2 * MIB, opts(4, 2)).unwrap();
        let src = staging(b.nr_slots());
        write_runs(&b, &src, &[(1, 2)], &[1]);
    }
    let backing = dir.path().join("backing");
    fs::write(&backing, vec![0u8; 2 * MIB as usize]).unwrap();
    let Some(lo) = attach_loop(&backing) else {
        uswap_testkit::skipped("the block device part: no loop device available here");
        return;
    };
    for _ in 0..20 {
        let b = FileBackend::open(&lo.path, 2 * MIB, opts(4, 2)).unwrap();
        let src = staging(b.nr_slots());
        write_runs(&b, &src, &[(1, 2)], &[1]);
    }
}

pub(super) fn open_err(path: &Path, capacity: u64, options: FileOptions) -> FileDeviceError {
    let e = FileBackend::open(path, capacity, options).err().expect("open should fail");
    let msg = e.to_string();
    assert!(msg.contains(&*path.to_string_lossy()), "message does not name the path: {msg}");
    e
}

/// A loop device over a file of `len` bytes, detached automatically when its last
/// descriptor closes (LO_FLAGS_AUTOCLEAR), so that a crashed test leaks nothing.
struct Loop {
    _fd: fs::File,
    path: PathBuf,
}

#[repr(C)]
struct LoopInfo64 {
    device: u64,
    inode: u64,
    rdevice: u64,
    offset: u64,
    sizelimit: u64,
    number: u32,
    encrypt_type: u32,
    encrypt_key_size: u32,
    flags: u32,
    file_name: [u8; 64],
    crypt_name: [u8; 64],
    encrypt_key: [u8; 32],
    init: [u64; 2],
}

#[repr(C)]
struct LoopConfig {
    fd: u32,
    block_size: u32,
    info: LoopInfo64,
    reserved: [u64; 8],
}

const LOOP_CTL_GET_FREE: libc::c_ulong = 0x4C82;
const LOOP_CONFIGURE: libc::c_ulong = 0x4C0A;
const LO_FLAGS_AUTOCLEAR: u32 = 4;

fn attach_loop(backing: &Path) -> Option<Loop> {
    let ctl = fs::File::open("/dev/loop-control").ok()?;
    let file = fs::OpenOptions::new().read(true).write(true).open(backing).ok()?;
    for _ in 0..10 {
        // SAFETY: LOOP_CTL_GET_FREE takes no argument and returns a device number.
        let n = unsafe { libc::ioctl(ctl.as_raw_fd(), LOOP_CTL_GET_FREE) };
        if n < 0 {
            return None;
        }
        let path = PathBuf::from(format!("/dev/loop{n}"));
        let dev = fs::OpenOptions::new().read(true).write(true).open(&path).ok()?;
        // SAFETY: plain data, all zeroes is a valid value.
        let mut cfg: LoopConfig = unsafe { std::mem::zeroed() };
        cfg.fd = file.as_raw_fd() as u32;
        cfg.info.flags = LO_FLAGS_AUTOCLEAR;
        // SAFETY: LOOP_CONFIGURE reads one loop_config, which `cfg` is (same layout).
        if unsafe { libc::ioctl(dev.as_raw_fd(), LOOP_CONFIGURE, &cfg as *const LoopConfig) } == 0 {
            return Some(Loop { _fd: dev, path });
        }
        // EBUSY: someone else took it in between; try the next free one.
    }
    None
}

#[test]
fn block_device_round_trip_size_check_and_discard() {
    let dir = TestDir::new("blk");
    let backing = dir.path().join("backing");
    fs::write(&backing, b"").unwrap();
    fs::OpenOptions::new().write(true).open(&backing).unwrap().set_len(4 * MIB).unwrap();
    let Some(lo) = attach_loop(&backing) else {
        uswap_testkit::skipped("no loop device available here (needs root and /dev/loop-control)");
        return;
    };
    let e = open_err(&lo.path, 8 * MIB, FileOptions::default());
    assert!(
        matches!(e, FileDeviceError::LargerThanDevice { capacity_bytes, device_bytes, .. }
            if capacity_bytes == 8 * MIB && device_bytes == 4 * MIB),
        "{e}"
    );
    assert!(e.to_string().contains("give at most 4194304 bytes"), "{e}");
    let b = FileBackend::open(&lo.path, 4 * MIB, opts(8, 1)).unwrap();
    assert!(b.is_block_device());
    assert_eq!(b.nr_slots(), 1024);
    // Opened exclusively: a second device on it is refused.
    let e = open_err(&lo.path, 4 * MIB, FileOptions::default());
    assert!(matches!(e, FileDeviceError::Busy { .. }), "{e}");
    let src = staging(b.nr_slots());
    let runs: Vec<(u64, u64)> = (0..32).map(|i| (i * 32, 32)).collect();
    let gens: Vec<u64> = (0..32).collect();
    write_runs(&b, &src, &runs, &gens);
    read_and_verify(&b, &runs, &gens);
    b.discard(512, 512);
    assert_eq!(b.discard_errors(), 0, "BLKDISCARD on a loop device");
    read_and_verify(&b, &runs[..16], &gens[..16]);
}

/// Rough throughput figures (not a test): `cargo test --release -p uswap -- --ignored
/// --nocapture bench_file_backend`.
#[test]
#[ignore]
fn bench_file_backend() {
    let dir = TestDir::new("bench");
    let capacity = 64 * MIB;
    for rings in [1, 0] {
        let b = FileBackend::open(dir.path(), capacity, opts(64, rings)).unwrap();
        let nr = b.nr_slots();
        let src = staging(nr);
        let label = if rings > 0 { "io_uring qd 64" } else { "pread/pwrite  " };
        // Write everything once, so that later writes overwrite allocated, written blocks.
        // This first pass writes into preallocated (unwritten) extents, as a write after
        // a discard does: ext4 converts them at completion.
        let all: Vec<(u64, u64)> = (0..nr / 32).map(|i| (i * 32, 32)).collect();
        let t = std::time::Instant::now();
        for c in all.chunks(64) {
            write_runs(&b, &src, c, &vec![0; c.len()]);
        }
        println!(
            "{label} {:<38} {:>9.0} pages/s",
            "first write: 64 x 32 pages (unwritten)",
            nr as f64 / t.elapsed().as_secs_f64()
        );
        let mut rng = Rng(42);
        let secs = 0.7;
        let run = |what: &str, pages_per_call: u64, f: &mut dyn FnMut()| {
            let t = std::time::Instant::now();
            let mut calls = 0u64;
            while t.elapsed().as_secs_f64() < secs {
                f();
                calls += 1;
            }
            let el = t.elapsed().as_secs_f64();
            println!(
                "{label} {what:<38} {:>9.0} pages/s  ({:.1} us per call)",
                (calls * pages_per_call) as f64 / el,
                el * 1e6 / calls as f64
            );
        };
        run("write: 1 request of 32 pages", 32, &mut || {
            let s = rng.below(nr / 32) * 32;
            let mut w = [WriteReq::new(s, src.pages(s as usize * PAGE_SIZE, 32))];
            b.write(&mut w);
            assert!(w[0].result.is_ok());
        });
        run("write: 32 requests of 1 page (random)", 32, &mut || {
            let mut w: ArrayVec<WriteReq<'_>, 32> = (0..32)
                .map(|_| {
                    let s = rng.below(nr);
                    WriteReq::new(s, src.pages(s as usize * PAGE_SIZE, 1))
                })
                .collect();
            // (Random slots may repeat within a batch; harmless for a benchmark.)
            b.write(&mut w);
        });
        let mut buf = zero_pages(32);
        run("read: 1 page (random)", 1, &mut || {
            let mut r = [ReadReq::new(rng.below(nr), &mut buf[..1])];
            b.read(&mut r);
            assert!(r[0].result.is_ok());
        });
        run("read: 32 requests of 1 page (random)", 32, &mut || {
            let mut r: ArrayVec<ReadReq<'_>, 32> = buf.chunks_mut(1).map(|c| ReadReq::new(rng.below(nr), c)).collect();
            b.read(&mut r);
        });
        run("read: 1 request of 32 pages", 32, &mut || {
            let mut r = [ReadReq::new(rng.below(nr / 32) * 32, &mut buf[..])];
            b.read(&mut r);
            assert!(r[0].result.is_ok());
        });
    }
}
