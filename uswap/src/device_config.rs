//! Swap device configuration: what a pager is given, how the `uswap` command spells it, and
//! how a configuration becomes a [`Backend`].
//!
//! Kinds: `ram` (uncompressed pages in memory), `zpool` (compressed pool with a memory cap,
//! written back to the next device when full), `file` (a file or block device, O_DIRECT
//! through io_uring), and `redis` (a Redis primary with replicas, pages encrypted). Any
//! device can be wrapped
//! in fault injection for tests, and can keep a per-page checksum that is checked on every
//! read (on by default for devices outside memory).

use std::path::{Path, PathBuf};

use crate::backend::failing::{FailingBackend, FaultInjection};
use crate::backend::file::{FileBackend, FileOptions};
use crate::backend::ram::RamBackend;
use crate::backend::redis::{RedisBackend, RedisOptions};
use crate::backend::zpool::{Compressor, Incompressible, ZpoolBackend, ZpoolConfig};
use crate::backend::Backend;
use crate::error::{Error, Result};
use crate::swap::{ReadaheadPolicy, SWAPFILE_CLUSTER};
use crate::uffd::PAGE_SIZE;

const CLUSTER_BYTES: u64 = (SWAPFILE_CLUSTER * PAGE_SIZE) as u64;

#[derive(Debug, Clone)]
enum DeviceKind {
    Ram { capacity_bytes: u64 },
    Zpool { cap_bytes: u64, capacity_bytes: Option<u64>, zpool: ZpoolOptions },
    File { path: PathBuf, capacity_bytes: u64, queue_depth: u32, poll_us: u32 },
    Redis { opts: RedisOptions, capacity_bytes: u64 },
}

#[derive(Debug, Clone, Copy)]
struct ZpoolOptions {
    compressor: Compressor,
    incompressible: Incompressible,
    accept_threshold_percent: u8,
    unit_pages: usize,
    dictionary: bool,
}

/// A swap device to give a pager.
#[derive(Debug, Clone)]
pub struct DeviceConfig {
    kind: DeviceKind,
    priority: i32,
    checksum: Option<bool>,
    fault_injection: Option<FaultInjection>,
    readahead: ReadaheadPolicy,
    clean_readahead: Option<bool>,
    async_reads: bool,
}

impl DeviceConfig {
    fn new(kind: DeviceKind) -> DeviceConfig {
        DeviceConfig {
            kind,
            priority: 0,
            checksum: None,
            fault_injection: None,
            readahead: ReadaheadPolicy::Vma,
            clean_readahead: None,
            async_reads: true,
        }
    }

    /// Bytes of pages the device can hold (its slots; for a pool, uncompressed bytes).
    pub fn capacity_bytes(&self) -> u64 {
        match &self.kind {
            DeviceKind::Ram { capacity_bytes }
            | DeviceKind::File { capacity_bytes, .. }
            | DeviceKind::Redis { capacity_bytes, .. } => *capacity_bytes,
            DeviceKind::Zpool { cap_bytes, capacity_bytes, .. } => {
                capacity_bytes.unwrap_or(cap_bytes.saturating_mul(4))
            }
        }
    }

    /// Uncompressed RAM storage of `capacity_bytes` (rounded down to whole 2 MiB clusters).
    pub fn ram(capacity_bytes: u64) -> DeviceConfig {
        DeviceConfig::new(DeviceKind::Ram { capacity_bytes })
    }

    /// A compressed RAM pool using at most `cap_bytes` of memory (lz4; pages filled with one
    /// repeated word stored as that word; incompressible pages stored as they are). It
    /// indexes four times its cap in pages unless [`DeviceConfig::capacity`] says otherwise.
    /// When full it stops taking pages until it drains below 90 % of the cap, and its oldest
    /// pages are written back to the next device.
    pub fn zpool(cap_bytes: u64) -> DeviceConfig {
        DeviceConfig::new(DeviceKind::Zpool {
            cap_bytes,
            capacity_bytes: None,
            zpool: ZpoolOptions {
                compressor: Compressor::Lz4,
                incompressible: Incompressible::StoreRaw,
                accept_threshold_percent: 90,
                unit_pages: 1,
                dictionary: false,
            },
        })
    }

    /// A file device: `path` is a directory (uswap creates an anonymous 0600 file in it,
    /// unlinked at once, so nothing is left behind), a regular file only its owner may read
    /// and write (a path that does not exist is created, mode 0600; the file is kept, and
    /// emptied when the device is dropped), or a block device. I/O is `O_DIRECT` through
    /// io_uring; freed clusters are punched out. Pages carry a crc32c checked on every read,
    /// unless [`DeviceConfig::checksum`] turns it off.
    ///
    /// The file is sparse: nothing is reserved at open, its blocks are allocated as pages are
    /// written, and the disk it takes is the clusters that hold pages. A file system that
    /// fills up shows as failed writes: the device degrades (said on stderr), its pages go
    /// to the next device or stay in RAM over the limit (`limit_overrun`), and it is tried
    /// again every second (`swap::health`). (`FileBackend::open` with
    /// `FileOptions::preallocate` reserves the whole size at open instead.)
    pub fn file(path: impl Into<PathBuf>, capacity_bytes: u64) -> DeviceConfig {
        DeviceConfig::new(DeviceKind::File {
            path: path.into(),
            capacity_bytes,
            queue_depth: 64,
            poll_us: crate::backend::file::DEFAULT_POLL_US,
        })
    }

    /// A Redis device: pages in the primary among `seeds` (`HOST:PORT`, the primary and its
    /// replicas in any order), up to `capacity_bytes` of pages. Each page is stored under a
    /// key with a prefix random per pager, encrypted and authenticated (AES-256-GCM,
    /// a key generated per pager and kept in memory) unless [`DeviceConfig::redis_options`]
    /// says otherwise. The server must use `maxmemory-policy noeviction` (a full store
    /// declines pages: they stay in RAM or go to the next device); Redis Cluster is refused.
    /// When the primary fails, requests look for the seed that says it is the new primary
    /// (after a Sentinel or operator promotion) for up to 10 s, then fail: a read then ends
    /// in SIGBUS for the thread that needs the page, never in wrong data.
    pub fn redis(seeds: Vec<String>, capacity_bytes: u64) -> DeviceConfig {
        DeviceConfig::new(DeviceKind::Redis { opts: RedisOptions::new(seeds), capacity_bytes })
    }

    /// All options of a Redis device (replicas, encryption, timeouts); ignored by other
    /// kinds.
    pub fn redis_options(mut self, o: RedisOptions) -> DeviceConfig {
        if let DeviceKind::Redis { opts, .. } = &mut self.kind {
            *opts = o;
        }
        self
    }

    /// The options of a Redis device, if this is one.
    pub fn redis_opts(&self) -> Option<&RedisOptions> {
        match &self.kind {
            DeviceKind::Redis { opts, .. } => Some(opts),
            _ => None,
        }
    }

    /// io_uring queue depth of a file device (ignored by other kinds).
    pub fn queue_depth(mut self, depth: u32) -> DeviceConfig {
        if let DeviceKind::File { queue_depth, .. } = &mut self.kind {
            *queue_depth = depth;
        }
        self
    }

    /// How long a file device's reads and writes poll for their completions before the
    /// thread sleeps, in microseconds (default 100; 0: always sleep). Polling saves the
    /// 10-20 µs a vCPU takes to wake up (BENCHMARKS.md) at the price of a busy CPU while the
    /// device works. Ignored by other kinds.
    pub fn poll_us(mut self, us: u32) -> DeviceConfig {
        if let DeviceKind::File { poll_us, .. } = &mut self.kind {
            *poll_us = us;
        }
        self
    }

    /// Devices with higher priority are used first; equal priorities take turns.
    pub fn priority(mut self, priority: i32) -> DeviceConfig {
        self.priority = priority;
        self
    }

    /// Pages the device can index, in bytes of uncompressed data (for the pool, which
    /// otherwise indexes four times its cap; for other kinds, the size).
    pub fn capacity(mut self, bytes: u64) -> DeviceConfig {
        match &mut self.kind {
            DeviceKind::Ram { capacity_bytes }
            | DeviceKind::File { capacity_bytes, .. }
            | DeviceKind::Redis { capacity_bytes, .. } => *capacity_bytes = bytes,
            DeviceKind::Zpool { capacity_bytes, .. } => *capacity_bytes = Some(bytes),
        }
        self
    }

    /// The pool's compressor (ignored by other kinds).
    pub fn compressor(mut self, c: Compressor) -> DeviceConfig {
        if let DeviceKind::Zpool { zpool, .. } = &mut self.kind {
            zpool.compressor = c;
        }
        self
    }

    /// What the pool does with pages that do not compress (ignored by other kinds).
    pub fn incompressible(mut self, i: Incompressible) -> DeviceConfig {
        if let DeviceKind::Zpool { zpool, .. } = &mut self.kind {
            zpool.incompressible = i;
        }
        self
    }

    /// zstd only: the pool trains a dictionary on its first pages and compresses with it
    /// from then on (docs/devices.md, "A dictionary"). Checked when the pool is made.
    /// Ignored by other kinds.
    pub fn dictionary(mut self, on: bool) -> DeviceConfig {
        if let DeviceKind::Zpool { zpool, .. } = &mut self.kind {
            zpool.dictionary = on;
        }
        self
    }

    /// Pages the pool compresses together as one object, at most (1, the default: page by
    /// page; up to `zpool::MAX_UNIT_PAGES`): see docs/devices.md, "Units of pages". Checked
    /// when the pool is made. Ignored by other kinds.
    pub fn unit_pages(mut self, nr_pages: usize) -> DeviceConfig {
        if let DeviceKind::Zpool { zpool, .. } = &mut self.kind {
            zpool.unit_pages = nr_pages;
        }
        self
    }

    /// After filling up, the pool takes pages again below this percentage of its cap.
    pub fn accept_threshold_percent(mut self, percent: u8) -> DeviceConfig {
        if let DeviceKind::Zpool { zpool, .. } = &mut self.kind {
            zpool.accept_threshold_percent = percent.clamp(1, 100);
        }
        self
    }

    /// Keep a crc32c of every page written and check it on every read: a mismatch is
    /// counted, reported with the page's address, and the page is never mapped.
    pub fn checksum(mut self, on: bool) -> DeviceConfig {
        self.checksum = Some(on);
        self
    }

    /// How the device picks pages to read ahead (default [`ReadaheadPolicy::Vma`]).
    pub fn readahead(mut self, policy: ReadaheadPolicy) -> DeviceConfig {
        self.readahead = policy;
        self
    }

    pub(crate) fn readahead_policy(&self) -> ReadaheadPolicy {
        self.readahead
    }

    /// Map read-ahead pages clean: write-protected and keeping their slot, so that reclaim
    /// drops them without writing if they stay unwritten, at the price of a write-protect
    /// fault (about 4 µs) on the first write to each. Default: on for file devices, where a
    /// write is I/O; off for memory devices, where rewriting a page costs 0.3-0.7 µs.
    pub fn clean_readahead(mut self, on: bool) -> DeviceConfig {
        self.clean_readahead = Some(on);
        self
    }

    pub(crate) fn clean_readahead_enabled(&self) -> bool {
        self.clean_readahead.unwrap_or(matches!(self.kind, DeviceKind::File { .. } | DeviceKind::Redis { .. }))
    }

    /// Asynchronous reads (default on), where the device is slow enough for them to pay
    /// (file devices; elsewhere the setting does nothing): the next windows of a sequential
    /// stream are read while the application works through the current one (see
    /// [`crate::PagerBuilder::readahead_async_windows`]). Off: every read waits for the
    /// device.
    pub fn async_reads(mut self, on: bool) -> DeviceConfig {
        self.async_reads = on;
        self
    }

    pub(crate) fn async_reads_enabled(&self) -> bool {
        self.async_reads
    }

    /// Make the device fail on purpose (tests).
    pub fn inject_faults(mut self, f: FaultInjection) -> DeviceConfig {
        self.fault_injection = Some(f);
        self
    }

    /// The size a device given without one gets when a process is managed from outside
    /// (`uswap run`, the Python package): half the machine's RAM (`MemTotal`, from
    /// `sysinfo(2)`; 4 GiB when it cannot be read), at least 64 MiB (4 MiB under an
    /// address-space limit, where it is a sixteenth of the limit at most). A cap, not a
    /// reservation; in a container, the host's RAM (LXCFS rewrites `/proc/meminfo`, not
    /// `sysinfo`): a pool there is best given its size (`zpool:SIZE`).
    pub fn default_capacity_bytes() -> u64 {
        /// A pool's cap under an address-space limit, at least: its slots (four times the
        /// cap) fill 8 clusters.
        const MIN_FITTED_CAPACITY_BYTES: u64 = 4 << 20;
        let mem_total_bytes = crate::mapping::ram_bytes().unwrap_or(4 << 30);
        // Under an address-space limit (`ulimit -v`) every reservation counts in full: the
        // pool's arena (the cap), and the staging area of its slots (4 times the cap). A
        // sixteenth of the limit for the cap keeps those to 5/16 of it, and the program's
        // heap (the preload's config) to a third.
        // The floor is lower there (8 clusters of slots), so that a limit of a few hundred MiB
        // leaves the program room.
        match crate::mapping::address_space_limit_bytes() {
            Some(as_bytes) => (mem_total_bytes / 2).min(as_bytes / 16).max(MIN_FITTED_CAPACITY_BYTES),
            None => (mem_total_bytes / 2).max(64 << 20),
        }
    }

    /// Parses a device list as the `uswap` command takes it: comma-separated devices, highest
    /// priority first (each gets a lower priority than the one before). Forms:
    ///
    /// * `ram` or `ram:SIZE`;
    /// * `zpool` followed by options separated by `:` in any order: a size (the memory cap),
    ///   `lz4`, `zstd` or `zstd-LEVEL`, `raw` or `reject` (incompressible pages), `unit=SIZE`
    ///   (pages compressed together, 4 KiB to 32 KiB), `dict` (zstd: a dictionary trained on
    ///   the pool's first pages);
    /// * `file:PATH` or `file:PATH:SIZE` (a path containing `:` must be followed by a size);
    /// * `redis://HOST:PORT[;HOST:PORT...][?replicas=N&size=SIZE&encrypt=off&key=FILE&failover_ms=MS&wait_ms=MS]`
    ///   (`;` between seeds, since `,` and `+` separate devices and engines);
    /// * `redis-cluster://HOST:PORT[;HOST:PORT...][?OPTIONS]`: nodes of a Redis Cluster, the
    ///   same options (`replicas=N` is `WAIT N` on the node a batch goes to).
    ///
    /// Any device may end in `:cluster` for cluster readahead (neighbouring slots) instead of
    /// the default readahead by address.
    ///
    /// `default_capacity_bytes` is the size of a device given without one. Sizes take `KiB`,
    /// `MiB`, `GiB`, `TiB` (or `K`, `M`, `G`, `T`), or plain bytes.
    pub fn parse_list(spec: &str, default_capacity_bytes: u64) -> Result<Vec<DeviceConfig>> {
        let mut out = Vec::new();
        for (i, item) in spec.split(',').map(str::trim).enumerate() {
            let bad = |why: String| Error::BadDeviceSpec { spec: item.to_string(), why };
            let (item, cluster) = match item.strip_suffix(":cluster") {
                Some(rest) => (rest, true),
                None => (item, false),
            };
            let policy = if cluster { ReadaheadPolicy::Cluster } else { ReadaheadPolicy::Vma };
            let dev = parse_one(item, default_capacity_bytes).map_err(bad)?;
            out.push(dev.priority(-(i as i32)).readahead(policy));
        }
        Ok(out)
    }

    pub(crate) fn priority_value(&self) -> i32 {
        self.priority
    }

    fn name(&self) -> &'static str {
        match self.kind {
            DeviceKind::Ram { .. } => "ram",
            DeviceKind::Zpool { .. } => "zpool",
            DeviceKind::File { .. } => "file",
            DeviceKind::Redis { .. } => "redis",
        }
    }

    /// Whether pages on this device carry a checksum: by default only on devices outside
    /// memory, where corruption is a real possibility.
    pub(crate) fn checksum_enabled(&self) -> bool {
        self.checksum.unwrap_or(matches!(self.kind, DeviceKind::File { .. } | DeviceKind::Redis { .. }))
    }

    fn whole_clusters(&self, capacity_bytes: u64) -> Result<u64> {
        let nr_clusters = capacity_bytes / CLUSTER_BYTES;
        if nr_clusters == 0 {
            return Err(Error::DeviceTooSmall { name: self.name().into(), capacity_bytes, min_bytes: CLUSTER_BYTES });
        }
        Ok(nr_clusters * SWAPFILE_CLUSTER as u64)
    }

    /// Checks, without making the device, what would keep it from opening: its size (one
    /// cluster at least; a pool's cap, one chunk), a file device's path (see
    /// [`crate::backend::file::check_path`]), a Redis device's servers. `uswap run` calls it
    /// before the program runs: the pagers that open the devices start later, in each
    /// process that needs one, and would each fail there.
    pub fn check_usable(&self) -> Result<()> {
        self.whole_clusters(self.capacity_bytes())?;
        match &self.kind {
            DeviceKind::File { path, .. } => Ok(crate::backend::file::check_path(path)?),
            DeviceKind::Redis { opts, .. } => Ok(RedisBackend::check(opts)?),
            DeviceKind::Zpool { cap_bytes, .. } => crate::backend::zpool::check_cap(*cap_bytes)
                .map_err(|e| Error::Device { name: "zpool".into(), why: e.to_string() }),
            DeviceKind::Ram { .. } => Ok(()),
        }
    }

    /// A file device's path (a directory, a regular file, a block device, or a file the
    /// device will create); `None` for the other kinds.
    pub fn file_path(&self) -> Option<&std::path::Path> {
        match &self.kind {
            DeviceKind::File { path, .. } => Some(path),
            _ => None,
        }
    }

    /// Empties a named swap file once the processes that used it exited without dropping
    /// their pagers (`uswap run`'s program; a dropped device scrubs its file itself): the
    /// file's path and what was done, for a file device naming a regular file; `None` for
    /// the others (a pool's memory, a directory's anonymous files and a process's Redis
    /// keys go with the process).
    pub fn erase_after_exit(&self) -> Option<(PathBuf, std::io::Result<crate::backend::file::Erased>)> {
        match &self.kind {
            DeviceKind::File { path, .. } => Some((path.clone(), crate::backend::file::erase_swap_file(path))),
            _ => None,
        }
    }

    pub(crate) fn open(&self) -> Result<Box<dyn Backend>> {
        let backend: Box<dyn Backend> = match &self.kind {
            DeviceKind::Ram { capacity_bytes } => {
                let nr_slots = self.whole_clusters(*capacity_bytes)?;
                Box::new(RamBackend::new(nr_slots).map_err(|e| Error::OutOfAddressSpace {
                    what: "RAM swap device".into(),
                    len_bytes: *capacity_bytes,
                    source: e,
                })?)
            }
            DeviceKind::Zpool { cap_bytes, capacity_bytes, zpool } => {
                let nr_slots = self.whole_clusters(capacity_bytes.unwrap_or(cap_bytes.saturating_mul(4)))?;
                let mut cfg = ZpoolConfig::new(*cap_bytes, nr_slots);
                cfg.compressor = zpool.compressor;
                cfg.incompressible = zpool.incompressible;
                cfg.accept_threshold_percent = zpool.accept_threshold_percent;
                cfg.unit_pages = zpool.unit_pages;
                cfg.dictionary = zpool.dictionary;
                Box::new(
                    ZpoolBackend::new(cfg).map_err(|e| Error::Device { name: "zpool".into(), why: e.to_string() })?,
                )
            }
            DeviceKind::File { path, capacity_bytes, queue_depth, poll_us } => {
                // Sparse: blocks are allocated as pages are written (see `DeviceConfig::file`).
                let opts = FileOptions {
                    queue_depth: *queue_depth,
                    poll_us: *poll_us,
                    preallocate: false,
                    ..FileOptions::default()
                };
                Box::new(FileBackend::open(path, *capacity_bytes, opts)?)
            }
            DeviceKind::Redis { opts, capacity_bytes } => {
                let nr_slots = self.whole_clusters(*capacity_bytes)?;
                Box::new(RedisBackend::open(opts, nr_slots)?)
            }
        };
        Ok(match self.fault_injection {
            Some(f) => Box::new(FailingBackend::new(backend, f)),
            None => backend,
        })
    }
}

/// One device of a [`DeviceConfig::parse_list`] spec, its `:cluster` suffix taken off; why
/// not, for the error naming the whole item.
fn parse_one(item: &str, default_capacity_bytes: u64) -> std::result::Result<DeviceConfig, String> {
    if let Some(rest) = item.strip_prefix("redis://") {
        return parse_redis(rest, default_capacity_bytes, false);
    }
    if let Some(rest) = item.strip_prefix("redis-cluster://") {
        return parse_redis(rest, default_capacity_bytes, true);
    }
    if let Some(rest) = item.strip_prefix("file:") {
        let (path, size) = match rest.rsplit_once(':') {
            Some((p, sz)) if parse_size(sz).is_ok() => (p, parse_size(sz)?),
            // `file:/tmp:8GB` was a swap file named `/tmp:8GB`: what looks like a size and
            // is not one is said, unless the whole is a path that exists.
            Some((_, sz)) if looks_like_a_size(sz) && !Path::new(rest).exists() => {
                let why = parse_size(sz).err().unwrap_or_default();
                return Err(format!("{sz:?} is not a size ({why}); file:PATH[:SIZE], e.g. file:/var/tmp:8GiB"));
            }
            _ => (rest, default_capacity_bytes),
        };
        if path.is_empty() {
            return Err("file needs a path: file:PATH[:SIZE]".into());
        }
        return Ok(DeviceConfig::file(path, size));
    }
    let mut parts = item.split(':');
    let kind = parts.next().unwrap_or("");
    let opts: Vec<&str> = parts.collect();
    match kind {
        "ram" => match opts.as_slice() {
            [] => Ok(DeviceConfig::ram(default_capacity_bytes)),
            [size] => Ok(DeviceConfig::ram(parse_size(size)?)),
            _ => Err("expected ram or ram:SIZE".into()),
        },
        "zpool" => parse_zpool(&opts, default_capacity_bytes),
        "" => Err("empty device name".into()),
        other => Err(format!(
            "unknown device kind {other:?}; known: ram, zpool, file, redis://HOST:PORT, redis-cluster://HOST:PORT"
        )),
    }
}

/// Whether `s` was meant as a size, right or wrong: a number (a sign, digits and dots, an
/// exponent) and at most three letters of a unit's (`8GB`, `-1`, `1e3`, `4 kib`), not the
/// tail of a file name with a colon in it (`run.2024-01-01T10:30Z`).
fn looks_like_a_size(s: &str) -> bool {
    let t = s.trim();
    let digits_end = t.find(|c: char| !(c.is_ascii_digit() || "+-.".contains(c))).unwrap_or(t.len());
    let (number, rest) = t.split_at(digits_end);
    let rest = rest.strip_prefix(['e', 'E']).map_or(rest, |r| r.trim_start_matches(|c: char| c.is_ascii_digit()));
    let unit = rest.trim_start();
    number.chars().any(|c| c.is_ascii_digit())
        && unit.len() <= 3
        && unit.chars().all(|c| "KMGTPEkmgtpeIiBb".contains(c))
}

/// A `zpool` device's options (a size, `lz4`, `zstd`, `zstd-LEVEL`, `raw`, `reject`,
/// `unit=SIZE`, `dict`), each
/// checked here, so that a list that cannot work is refused before any program runs.
fn parse_zpool(opts: &[&str], default_capacity_bytes: u64) -> std::result::Result<DeviceConfig, String> {
    let (mut cap, mut size_given, mut codec, mut incompressible, mut unit) = (None, None, None, None, None);
    let mut dictionary = None;
    let mut d = DeviceConfig::zpool(0);
    let once = |seen: &mut Option<String>, what: &str, o: &str| match seen.replace(o.to_string()) {
        Some(before) => Err(format!("{what} given twice ({before} and {o}); give one")),
        None => Ok(()),
    };
    for &o in opts {
        d = match o {
            "lz4" | "zstd" => {
                once(&mut codec, "a compressor", o)?;
                d.compressor(if o == "lz4" { Compressor::Lz4 } else { Compressor::Zstd { level: 3 } })
            }
            "raw" | "reject" => {
                once(&mut incompressible, "what to do with incompressible pages", o)?;
                d.incompressible(if o == "raw" { Incompressible::StoreRaw } else { Incompressible::Reject })
            }
            z if z.starts_with("zstd-") => {
                once(&mut codec, "a compressor", o)?;
                let levels = crate::backend::zpool::ZSTD_LEVELS;
                match z[5..].parse::<i32>() {
                    Ok(level) if levels.contains(&level) => d.compressor(Compressor::Zstd { level }),
                    _ => {
                        return Err(format!(
                            "bad zstd level in {z:?}: levels are {}..={}",
                            levels.start(),
                            levels.end()
                        ))
                    }
                }
            }
            u if u.starts_with("unit=") => {
                once(&mut unit, "a unit", o)?;
                d.unit_pages(parse_unit(&u[5..])?)
            }
            "dict" => {
                once(&mut dictionary, "dict", o)?;
                d.dictionary(true)
            }
            size => {
                let bytes = parse_size(size).map_err(|e| {
                    format!("{e}; zpool options are a size, lz4, zstd, zstd-LEVEL, raw, reject, unit=SIZE, dict")
                })?;
                crate::backend::zpool::check_cap(bytes).map_err(|e| e.to_string())?;
                once(&mut size_given, "a size", size)?;
                cap = Some(bytes);
                d
            }
        };
    }
    if dictionary.is_some() && !codec.as_deref().is_some_and(|c| c.starts_with("zstd")) {
        return Err("dict is zstd's: give zstd or zstd-LEVEL with it (zpool:zstd-1:dict)".into());
    }
    let cap = cap.unwrap_or(default_capacity_bytes);
    if let DeviceKind::Zpool { cap_bytes, .. } = &mut d.kind {
        *cap_bytes = cap;
    }
    // The pages it can hold: four times its memory, or the default capacity where that is
    // more (pages that compress well; a pool given a size still holds to that memory).
    Ok(d.capacity(cap.saturating_mul(4).max(default_capacity_bytes)))
}

/// The pages of a `unit=SIZE` option: a multiple of the page size, up to
/// `zpool::MAX_UNIT_PAGES` pages.
fn parse_unit(size: &str) -> std::result::Result<usize, String> {
    let max_pages = crate::backend::zpool::MAX_UNIT_PAGES;
    let bad = |why: String| {
        format!("bad unit={size}: {why}; a unit is 4KiB (page by page) to {}KiB, in pages of 4KiB", max_pages * 4)
    };
    let bytes = parse_size(size).map_err(bad)?;
    let page = crate::PAGE_SIZE as u64;
    if bytes == 0 || bytes % page != 0 || bytes / page > max_pages as u64 {
        return Err(bad(format!("{bytes} bytes")));
    }
    Ok((bytes / page) as usize)
}

/// Parses what follows `redis://` (`redis-cluster://`: `cluster`) in a device list.
fn parse_redis(rest: &str, default_capacity_bytes: u64, cluster: bool) -> std::result::Result<DeviceConfig, String> {
    let (addrs, query) = rest.split_once('?').unwrap_or((rest, ""));
    let mut seeds = Vec::new();
    for a in addrs.split(';').map(str::trim) {
        let Some((host, port)) = a.rsplit_once(':') else {
            return Err(format!("seed {a:?} needs a port: HOST:PORT, e.g. redis://127.0.0.1:6379"));
        };
        if host.is_empty() || port.parse::<u16>().map_or(true, |p| p == 0) {
            return Err(format!("seed {a:?} is not HOST:PORT with a port in 1..=65535"));
        }
        seeds.push(a.to_string());
    }
    let mut opts = RedisOptions::new(seeds);
    opts.cluster = cluster;
    let mut size = default_capacity_bytes;
    for kv in query.split('&').filter(|s| !s.is_empty()) {
        let (k, v) = kv.split_once('=').ok_or_else(|| format!("option {kv:?} needs a value (NAME=VALUE)"))?;
        let num = |v: &str| v.parse::<u64>().map_err(|_| format!("{k}={v:?}: not a whole number"));
        match k {
            "replicas" => opts.replicas = num(v)? as u32,
            "size" => size = parse_size(v)?,
            "encrypt" => {
                opts.encrypt = match v {
                    "on" => true,
                    "off" => false,
                    _ => return Err(format!("encrypt={v:?}: use on or off")),
                }
            }
            "key" => opts.key_file = Some(PathBuf::from(v)),
            "failover_ms" => opts.failover_timeout_ms = num(v)?,
            "wait_ms" => opts.wait_timeout_ms = num(v)?,
            "connections" => opts.connections = num(v)?.clamp(1, 64) as usize,
            "poll_us" => opts.poll_us = num(v)?.min(100_000) as u32,
            "session" if crate::backend::redis::valid_session(v) => opts.session = Some(v.to_string()),
            "session" => return Err(format!("session={v:?}: use 1 to 64 letters, digits, - or _")),
            _ => {
                return Err(format!(
                    "unknown option {k:?}; redis options: replicas=N, size=SIZE, encrypt=off, key=FILE, \
                     failover_ms=MS, wait_ms=MS, connections=N, poll_us=US, session=NAME"
                ))
            }
        }
    }
    Ok(DeviceConfig::redis(Vec::new(), size).redis_options(opts))
}

/// Parses `256MiB`, `1GiB`, `4096`, `1.5G`, `512m`: binary units (`KiB`..`TiB`, and `K`..`T`
/// in either case, as the kernel's `memparse`, Docker's `-m` and Java's `-Xmx` read them), or
/// bytes. `MB` and the like are refused: some read them as powers of ten.
pub fn parse_size(s: &str) -> std::result::Result<u64, String> {
    let t = s.trim();
    if t.starts_with('-') {
        return Err(format!("{t:?}: a size cannot be negative (e.g. 256MiB)"));
    }
    let split = t.find(|c: char| !(c.is_ascii_digit() || c == '.')).unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let mult: u64 = match unit.trim() {
        "" | "B" | "b" => 1,
        "K" | "k" | "KiB" => 1 << 10,
        "M" | "m" | "MiB" => 1 << 20,
        "G" | "g" | "GiB" => 1 << 30,
        "T" | "t" | "TiB" => 1 << 40,
        u @ ("KB" | "kB" | "kb" | "MB" | "mb" | "GB" | "gb" | "TB" | "tb") => {
            return Err(format!(
                "size unit {u:?} is ambiguous (a power of ten or of two): use {}iB, which uswap means (e.g. 256MiB)",
                u[..1].to_ascii_uppercase()
            ))
        }
        u => return Err(format!("unknown size unit {u:?} (use B, KiB, MiB, GiB, TiB, e.g. 256MiB)")),
    };
    // Whole numbers exactly (a byte count past 2^53 is not an f64), and without the float
    // parser: every process of a `uswap run` tree parses its limit at start.
    if !num.is_empty() && num.bytes().all(|b| b.is_ascii_digit()) {
        return num
            .parse::<u64>()
            .ok()
            .and_then(|n| n.checked_mul(mult))
            .filter(|&bytes| bytes < u64::MAX)
            .ok_or_else(|| format!("size {s:?} is out of range"));
    }
    let v: f64 = num.parse().map_err(|_| format!("{num:?} is not a number (e.g. 256MiB)"))?;
    let bytes = v * mult as f64;
    if !bytes.is_finite() || bytes < 0.0 || bytes >= u64::MAX as f64 {
        return Err(format!("size {s:?} is out of range"));
    }
    Ok(bytes.round() as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Device lists that cannot work are refused when parsed, before any program runs,
    /// saying why: each used to be taken as something else or found only by a pager.
    #[test]
    fn device_options_that_cannot_work_are_refused_when_parsed() {
        let why = |spec: &str| DeviceConfig::parse_list(spec, 1 << 30).unwrap_err().to_string();
        // Was a swap file named "/tmp:8GB".
        assert!(why("file:/tmp:8GB").contains("\"8GB\" is not a size"), "{}", why("file:/tmp:8GB"));
        assert!(why("file:/tmp:-1").contains("is not a size"));
        assert!(why("file:/tmp:1e3").contains("is not a size"));
        // A file name with a colon and digits in it is a path.
        let d = DeviceConfig::parse_list("file:/var/tmp/run.2024-01-01T10:30Z", 1 << 30).unwrap();
        assert_eq!(d[0].file_path(), Some(Path::new("/var/tmp/run.2024-01-01T10:30Z")));
        // Was found by the pager of each process, after the program ran.
        assert!(why("zpool:zstd-30").contains("levels are 1..=22"), "{}", why("zpool:zstd-30"));
        assert!(why("zpool:zstd-0").contains("levels are 1..=22"));
        // Four times the cap overflowed into a pool of no slots, and the error said that.
        assert!(why("zpool:4194304T").contains("above the most one pool can index"), "{}", why("zpool:4194304T"));
        // The last one won, silently.
        assert!(why("zpool:raw:reject").contains("given twice (raw and reject)"), "{}", why("zpool:raw:reject"));
        assert!(why("zpool:lz4:zstd-3").contains("a compressor given twice"));
        assert!(why("zpool:unit=6KiB").contains("bad unit=6KiB"), "{}", why("zpool:unit=6KiB"));
        assert!(why("zpool:unit=64KiB").contains("4KiB (page by page) to 32KiB"));
        assert!(why("zpool:unit=0").contains("bad unit=0"));
        assert!(why("zpool:unit=4KiB:unit=8KiB").contains("a unit given twice"));
        assert!(why("zpool:dict").contains("dict is zstd's"), "{}", why("zpool:dict"));
        assert!(why("zpool:lz4:dict").contains("dict is zstd's"));
        assert!(why("zpool:zstd:dict:dict").contains("dict given twice"));
        assert!(why("zpool:64MiB:32MiB").contains("a size given twice"));
        // What stays accepted: a path with a colon and no size, every option once.
        let d = DeviceConfig::parse_list("file:/var/tmp/a:b,zpool:64MiB:zstd-3:reject", 1 << 30).unwrap();
        assert_eq!(d.len(), 2);
        assert_eq!(d[1].capacity_bytes(), 1 << 30, "a pool's pages: four times its memory or the default");
        let d = DeviceConfig::parse_list("zpool,zpool:zstd-1:unit=16KiB", 1 << 30).unwrap();
        let unit_pages = |d: &DeviceConfig| match &d.kind {
            DeviceKind::Zpool { zpool, .. } => zpool.unit_pages,
            _ => 0,
        };
        assert_eq!((unit_pages(&d[0]), unit_pages(&d[1])), (1, 4));
    }

    #[test]
    fn redis_urls_parse_with_their_options_and_bad_ones_say_why() {
        let d = DeviceConfig::parse_list(
            "zpool:4MiB, redis://10.0.0.1:6379;db2:6380?replicas=1&size=1GiB&encrypt=off&failover_ms=500&wait_ms=200",
            64 << 20,
        )
        .unwrap();
        assert_eq!(d.len(), 2);
        let o = d[1].redis_opts().expect("a redis device");
        assert_eq!(o.seeds, vec!["10.0.0.1:6379".to_string(), "db2:6380".to_string()]);
        assert_eq!((o.replicas, o.encrypt, o.failover_timeout_ms, o.wait_timeout_ms), (1, false, 500, 200));
        assert_eq!(d[1].capacity_bytes(), 1 << 30);
        assert!(d[1].checksum_enabled() && d[1].clean_readahead_enabled());
        assert!(d[0].priority_value() > d[1].priority_value());
        let plain = &DeviceConfig::parse_list("redis://127.0.0.1:1:cluster", 64 << 20).unwrap()[0];
        assert_eq!(plain.redis_opts().unwrap().seeds, vec!["127.0.0.1:1".to_string()]);
        assert!(plain.redis_opts().unwrap().encrypt, "encrypted unless encrypt=off");
        assert_eq!(plain.readahead_policy(), ReadaheadPolicy::Cluster);
        for (bad, why) in [
            ("redis://127.0.0.1", "needs a port"),
            ("redis://127.0.0.1:0", "port in 1..=65535"),
            ("redis://:6379", "not HOST:PORT"),
            ("redis://h:1?replicas=x", "replicas=\"x\": not a whole number"),
            ("redis://h:1?encrypt=no", "use on or off"),
            ("redis://h:1?size=1XB", "unknown size unit"),
            ("redis://h:1?replica=1", "unknown option \"replica\"; redis options: replicas=N"),
            ("redis://h:1?replicas", "needs a value"),
            ("redis://h:1?session=a.b", "use 1 to 64 letters, digits, - or _"),
        ] {
            let e = DeviceConfig::parse_list(bad, 64 << 20).unwrap_err().to_string();
            assert!(e.contains(why), "{bad}: {e}");
        }
        let e = parse_size("-5MiB").unwrap_err();
        assert!(e.contains("cannot be negative"), "{e}");
    }

    #[test]
    fn sizes_take_binary_units_in_the_spellings_other_tools_use_and_refuse_ambiguous_ones() {
        for (text, bytes) in [
            ("4096", 4096),
            ("4096B", 4096),
            ("512k", 512 << 10),
            ("256MiB", 256 << 20),
            ("256M", 256 << 20),
            ("512m", 512 << 20),
            ("1.5G", 3 << 29),
            ("2g", 2 << 30),
            ("1TiB", 1 << 40),
            ("1t", 1 << 40),
            // Exactly, past what an f64 holds.
            ("9007199254740993", (1 << 53) + 1),
            (" 64GiB ", 64 << 30),
        ] {
            assert_eq!(parse_size(text), Ok(bytes), "{text}");
        }
        let e = parse_size("64MB").unwrap_err();
        assert!(e.contains("ambiguous") && e.contains("use MiB"), "{e}");
        let e = parse_size("1kB").unwrap_err();
        assert!(e.contains("use KiB"), "{e}");
        assert!(parse_size("64XB").unwrap_err().contains("unknown size unit"));
        assert!(parse_size("17179869184GiB").unwrap_err().contains("out of range"));
        assert!(parse_size("99999999999999999999").unwrap_err().contains("out of range"));
        assert!(parse_size("1e3").unwrap_err().contains("unknown size unit"));
    }
}
