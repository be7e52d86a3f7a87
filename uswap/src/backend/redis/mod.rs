//! The Redis tier: pages in a Redis primary (standalone, with replicas) or spread over a
//! Redis Cluster, so that a pager can swap beyond one machine's RAM and disk and survive
//! losing a node.
//!
//! # Job
//!
//! [`RedisBackend`] stores slot `n`'s page under the key `uswap:PREFIX:n:GEN`, where PREFIX is
//! random per pager (two pagers, or two machines, can share a store) and GEN the write's
//! generation (unique per write: an older version of a slot, say on a replica that missed
//! the last write, is never read by mistake). Values are sealed by `seal.rs`: encrypted and
//! authenticated (AES-256-GCM, key per pager in memory or derived from a file's), or in clear
//! with a crc32c. Every read checks its value; a mismatch is a checksum error.
//!
//! * `shared.rs`: `Shared`, the state the backend, its device threads and
//!   its asynchronous readers share, and the device's counters;
//! * `conn.rs`: connections through the `redis` crate (timeouts, `INFO`, a cluster's
//!   primaries, which errors mean a failover, the socket kept as the engine's);
//! * `sync_read.rs`: synchronous reads, by the faulting thread itself, on a connection it
//!   try-locks (no hand-off; anything unexpected goes to the device threads);
//! * `jobs.rs`: how callers hand requests to the device threads without allocating or
//!   locking (the read path may run in a SIGBUS handler);
//! * `worker.rs`: the device threads: one round trip per batch (`MGET` per readahead window,
//!   `MSET` + `WAIT` per write batch), failover to the seed that says it is the primary, and
//!   batched deletes of freed keys;
//! * `cluster.rs` and `routing.rs`: on a Redis Cluster (`redis-cluster://`), keys tagged so
//!   that a swap cluster's pages share a hash slot (`uswap:PREFIX:{ID.C}:n:GEN`), and each
//!   command sent to the node serving its keys, following `MOVED`, `ASK` and failovers;
//! * `session.rs`: the keys of one `uswap run`, and their deletion after it;
//! * `local.rs`: [`LocalRedis`], local servers (and clusters) for `uswap bench
//!   --redis-local` and tests;
//! * this module: options, start-up checks (refuses `maxmemory-policy` other than
//!   `noeviction`, a cluster node named as a standalone primary and the reverse, too few
//!   replicas), the [`Backend`] impl and the [`AsyncReader`].
//!
//! Imports run one way: this module imports its children, and none imports it. Below it,
//! `worker.rs` imports `routing.rs`; both, and `sync_read.rs`, import `shared.rs`;
//! `shared.rs` imports the types it holds (`seal.rs`, `jobs.rs`, `cluster.rs`) and `conn.rs`,
//! which imports only `cluster.rs`. The faulting threads' connections
//! (`sync_read::SyncReader`) are held beside the shared state (by the backend and each device
//! thread), not in it, since they read it.
//!
//! # Locking rules
//!
//! On the caller side `read`, `write`, `invalidate` and the asynchronous reader use atomics,
//! lock-free queues and futexes, and allocate nothing (see `jobs.rs`); `read` first
//! try-locks a synchronous-read connection (`sync_read.rs`, the only lock). The device
//! threads own their connections.
//!
//! # Invariants
//!
//! * `gens[slot]` is 0 for a slot holding nothing, else the generation of its only readable
//!   key. It changes only after a write succeeded (including `WAIT` with `replicas=N`) and on
//!   `invalidate`; the key it replaced is queued for deletion.
//! * A failed write leaves `gens[slot]` as it was, so the slot's previous page stays
//!   readable, and the engine keeps the pages it tried to write.
//! * Drop stops the threads (each finishes its job first), then deletes every key of this
//!   pager from the store.

pub mod cluster;
mod conn;
mod jobs;
mod local;
mod routing;
mod seal;
mod session;
mod shared;
mod sync_read;
mod worker;

pub use local::{redis_server_available, LocalRedis};
use session::{delete_on_primaries, scan_delete};
pub use session::{delete_session, new_session_id, valid_session};

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use crossbeam_queue::ArrayQueue;
use thiserror::Error;

use self::cluster::SlotMap;
use self::conn::{connect, info, info_field};
use self::jobs::{Jobs, Work};
use self::seal::Sealer;
use self::shared::{Counters, Shared};
use self::sync_read::SyncReader;
use self::worker::{Worker, MAX_DELETE_BATCH};
use super::{AlignedPage, AsyncReader, AsyncRun, Backend, BackendError, BackendStats, ReadReq, WriteReq};
use crate::clock::now_ns;
use crate::uffd::PAGE_SIZE;

/// Freed keys waiting for deletion; beyond that, keys are left in the store (counted).
const DELETE_QUEUE: usize = 1 << 16;
/// Requests in flight at once (callers beyond wait for a free one).
const NR_JOBS: usize = 256;

/// Options of a Redis device (see [`crate::DeviceConfig::redis`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RedisOptions {
    /// Seeds, `HOST:PORT`: the primary and its replicas, in any order.
    pub seeds: Vec<String>,
    /// A write batch counts as written once this many replicas acknowledged it (`WAIT`).
    pub replicas: u32,
    /// How long `WAIT` waits for the replicas, in milliseconds.
    pub wait_timeout_ms: u64,
    /// Encrypt pages (AES-256-GCM). Off: clear pages with a crc32c.
    pub encrypt: bool,
    /// A file holding the 32-byte key (raw, or 64 hex digits); `None`: a random key per
    /// pager, kept only in memory.
    pub key_file: Option<PathBuf>,
    /// How long a request keeps looking for a primary before it fails, in milliseconds.
    pub failover_timeout_ms: u64,
    /// Device threads, each with its own connection.
    pub connections: usize,
    /// How long callers and device threads poll for each other before sleeping, in
    /// microseconds (default 0: always sleep). Polling saves wake-ups where cores are to
    /// spare; on a 2-vCPU machine shared with a local `redis-server` it costs more than it
    /// saves (random 4 KiB faults: 12,078 accesses/s at 0, 9,593 at 50, 4,942 at 200).
    pub poll_us: u32,
    /// A name shared by the pagers of one run (`uswap run` gives every process it starts
    /// the same): keys are then `uswap:SESSION.ID:...`, and [`delete_session`] removes every
    /// key of the run once it has ended, whether or not its processes dropped their pagers.
    pub session: Option<String>,
    /// The seeds are nodes of a Redis Cluster (`redis-cluster://`): keys are spread over its
    /// hash slots, one tag per swap cluster, and each command goes to the node serving its
    /// keys (see `routing.rs`).
    pub cluster: bool,
}

impl RedisOptions {
    pub fn new(seeds: Vec<String>) -> RedisOptions {
        RedisOptions {
            seeds,
            replicas: 0,
            wait_timeout_ms: 1000,
            encrypt: true,
            key_file: None,
            failover_timeout_ms: 10_000,
            connections: 4,
            poll_us: 0,
            session: None,
            cluster: false,
        }
    }
}

/// Why a Redis device could not start. Each message names the store and says what to do.
#[derive(Debug, Error)]
pub enum RedisDeviceError {
    #[error("redis device: no seed address given; give HOST:PORT, e.g. redis://127.0.0.1:6379")]
    NoSeeds,
    #[error(
        "redis device {seeds}: no seed is a reachable primary ({why}); start the server, check \
         the addresses, or promote a replica (REPLICAOF NO ONE)"
    )]
    NoPrimary { seeds: String, why: String },
    #[error(
        "redis device {addr}: maxmemory-policy is {policy}, which evicts keys when the store is \
         full: evicted pages would be lost. Set `maxmemory-policy noeviction` (CONFIG SET \
         maxmemory-policy noeviction, or in redis.conf): a full store then declines pages, which \
         stay in RAM or go to the next device"
    )]
    Evicting { addr: String, policy: String },
    #[error(
        "redis device {addr}: the server is a Redis Cluster node; name the cluster's nodes as \
         redis-cluster://{addr}[;HOST:PORT...] (redis:// is for a standalone primary with replicas)"
    )]
    Cluster { addr: String },
    #[error(
        "redis device {addr}: replicas={wanted} but the primary has {connected} connected \
         replica(s): no write could ever be acknowledged. Start the replicas (and wait for them \
         to connect), or lower replicas="
    )]
    TooFewReplicas { addr: String, wanted: u32, connected: u32 },
    #[error("redis device: key file {}: {why}", .path.display())]
    KeyFile { path: PathBuf, why: String },
    #[error("redis device: {what}: {source}")]
    Io { what: &'static str, source: std::io::Error },
    #[error("redis device: cannot set up the page encryption: {0}")]
    Sealer(#[from] seal::SealerError),
}

/// Counters of a Redis device (monotonic unless said otherwise).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RedisStats {
    /// Read round trips (`MGET`s) and write round trips (`MSET`s) that succeeded.
    pub reads: u64,
    /// Of `reads`, those the faulting thread made itself (`sync_read.rs`).
    pub sync_reads: u64,
    pub writes: u64,
    /// Pages stored now.
    pub stored_pages: u64,
    /// Reads of a key the store did not have (lost in a failover).
    pub missing_pages: u64,
    /// Values that failed their check (authentication tag or crc32c).
    pub corrupt_pages: u64,
    /// Write batches not acknowledged by enough replicas in time.
    pub wait_short: u64,
    /// Pages declined because the store was full (`OOM`).
    pub rejected_full: u64,
    /// Keys deleted, and keys that could not be deleted.
    pub deleted_keys: u64,
    pub delete_errors: u64,
    /// Times the device switched to another primary.
    pub failovers: u64,
    /// On a cluster: commands a node sent elsewhere (`MOVED`, `ASK`) and that were followed.
    pub redirects: u64,
}

/// A swap device in Redis. See the module documentation.
pub struct RedisBackend {
    sh: Arc<Shared>,
    /// Connections for reads by the faulting threads (the device threads keep them).
    sync_read: Arc<SyncReader>,
    threads: Vec<JoinHandle<()>>,
}

fn read_key(path: &std::path::Path) -> Result<[u8; 32], RedisDeviceError> {
    let bad = |why: String| RedisDeviceError::KeyFile { path: path.to_path_buf(), why };
    let bytes = std::fs::read(path).map_err(|e| bad(format!("cannot read it: {e}")))?;
    if bytes.len() == 32 {
        let mut k = [0u8; 32];
        k.copy_from_slice(&bytes);
        return Ok(k);
    }
    let text = std::str::from_utf8(&bytes).map(str::trim).unwrap_or("");
    if text.len() == 64 && text.bytes().all(|b| b.is_ascii_hexdigit()) {
        let mut k = [0u8; 32];
        for (i, byte) in k.iter_mut().enumerate() {
            *byte = u8::from_str_radix(&text[2 * i..2 * i + 2], 16).unwrap_or(0);
        }
        return Ok(k);
    }
    Err(bad(format!(
        "holds {} bytes; it must hold the 32-byte key, raw or as 64 hex digits (e.g. `head -c 32 /dev/urandom > FILE`)",
        bytes.len()
    )))
}

impl RedisBackend {
    /// What [`RedisBackend::open`] checks before it starts anything: the seeds answer, one is
    /// a primary with the replicas asked for (or the cluster has its slot map), and the
    /// page key can be made. `uswap run` checks its devices with this before the program
    /// runs, since its pagers start later.
    pub fn check(opts: &RedisOptions) -> Result<(), RedisDeviceError> {
        if opts.seeds.is_empty() {
            return Err(RedisDeviceError::NoSeeds);
        }
        if opts.cluster {
            open_cluster(opts)?;
        }
        let (primary, inf) = find_primary(opts, &opts.seeds.join(";"))?;
        if !opts.cluster {
            check_primary(&opts.seeds[primary], &inf, opts.replicas)?;
        }
        new_sealer(opts).map(drop)
    }

    /// Connects to the seeds, checks the primary, and starts the device threads.
    pub fn open(opts: &RedisOptions, nr_slots: u64) -> Result<RedisBackend, RedisDeviceError> {
        if opts.seeds.is_empty() {
            return Err(RedisDeviceError::NoSeeds);
        }
        let seeds_str = opts.seeds.join(";");
        let cluster_map = if opts.cluster { Some(open_cluster(opts)?) } else { None };
        let (primary, inf) = find_primary(opts, &seeds_str)?;
        if cluster_map.is_none() {
            check_primary(&opts.seeds[primary], &inf, opts.replicas)?;
        }
        let (sealer, prefix, id) = new_sealer(opts)?;
        let sync_read = Arc::new(SyncReader::new(cluster_map.as_ref()));
        let sh = Arc::new(Shared {
            name: format!("{}://{seeds_str}", if opts.cluster { "redis-cluster" } else { "redis" }),
            seeds: opts.seeds.clone(),
            seed_addrs: opts
                .seeds
                .iter()
                .map(|a| std::net::ToSocketAddrs::to_socket_addrs(a).ok().and_then(|mut it| it.next()))
                .collect(),
            sealer,
            prefix,
            jobs: Jobs::new(NR_JOBS),
            nr_slots,
            gens: (0..nr_slots).map(|_| AtomicU64::new(0)).collect(),
            next_gen: AtomicU64::new(1),
            deletes: ArrayQueue::new(DELETE_QUEUE),
            shutdown: AtomicBool::new(false),
            primary: AtomicUsize::new(primary),
            failovers: AtomicU64::new(0),
            episode_deadline_ns: AtomicU64::new(0),
            lost_nodes: Mutex::new(Vec::new()),
            nr_lost_nodes: AtomicUsize::new(0),
            declining_until_ns: AtomicU64::new(0),
            full_said: AtomicBool::new(false),
            replicas: opts.replicas,
            wait_timeout_ms: opts.wait_timeout_ms,
            failover_timeout_ns: opts.failover_timeout_ms.saturating_mul(1_000_000),
            poll_ns: u64::from(opts.poll_us) * 1000,
            counters: Counters::default(),
            last_note: Mutex::new(String::new()),
            forked: AtomicBool::new(false),
            keep_keys: AtomicBool::new(false),
            cluster_primaries: Mutex::new(cluster_map.as_ref().map_or_else(Vec::new, |m| {
                let mut n = m.nodes.clone();
                n.sort();
                n
            })),
            cluster_map,
            tag_id: id,
        });
        sync_read.maintain(&sh, true);
        start_threads(sh, sync_read, opts.connections)
    }

    /// The prefix of every key of this device (`uswap:PREFIX:`).
    pub fn key_prefix(&self) -> &str {
        &self.sh.prefix
    }

    /// The key generation `generation` of slot `slot`'s page is kept under (on a cluster,
    /// its hash tag names the slot's swap cluster).
    pub fn key_of(&self, slot: u64, generation: u64) -> String {
        self.sh.key(slot, generation)
    }

    /// The address of the primary the device talks to now.
    pub fn primary(&self) -> &str {
        &self.sh.seeds[self.sh.primary.load(Ordering::Acquire)]
    }

    /// What the device threads last reported (a failover, an error), or "".
    pub fn last_note(&self) -> String {
        self.sh.last_note.lock().map(|n| n.clone()).unwrap_or_default()
    }

    pub fn redis_stats(&self) -> RedisStats {
        let c = &self.sh.counters;
        let l = |a: &AtomicU64| a.load(Ordering::Relaxed);
        RedisStats {
            reads: l(&c.reads),
            sync_reads: l(&c.sync_reads),
            writes: l(&c.writes),
            stored_pages: l(&c.stored_pages),
            missing_pages: l(&c.missing),
            corrupt_pages: l(&c.corrupt),
            wait_short: l(&c.wait_short),
            rejected_full: l(&c.reject_full),
            deleted_keys: l(&c.deletes),
            delete_errors: l(&c.delete_errors),
            failovers: self.sh.failovers.load(Ordering::Relaxed),
            redirects: l(&c.redirects),
        }
    }

    /// Posts `work` and waits for it; false if no job came free within the failover timeout.
    /// Async-signal-safe.
    fn call(&self, work: Work) -> bool {
        let Some(i) = claim(&self.sh) else { return false };
        self.sh.jobs.post(i, work);
        self.sh.jobs.wait_and_free(i, self.sh.poll_ns);
        true
    }
}

/// The standalone primary `addr` (its `INFO`: `inf`) keeps every key (`noeviction`) and has
/// the `replicas` connected replicas asked for.
fn check_primary(addr: &str, inf: &str, replicas: u32) -> Result<(), RedisDeviceError> {
    let policy = info_field(inf, "maxmemory_policy").unwrap_or("unknown").to_string();
    if policy != "noeviction" {
        return Err(RedisDeviceError::Evicting { addr: addr.to_string(), policy });
    }
    let connected: u32 = info_field(inf, "connected_slaves").and_then(|v| v.parse().ok()).unwrap_or(0);
    if connected < replicas {
        return Err(RedisDeviceError::TooFewReplicas { addr: addr.to_string(), wanted: replicas, connected });
    }
    Ok(())
}

/// The seed that is the primary (with `cluster`, any node of the cluster), and its `INFO`.
fn find_primary(opts: &RedisOptions, seeds_str: &str) -> Result<(usize, String), RedisDeviceError> {
    let timeout = Duration::from_millis(2000);
    let mut why = Vec::new();
    for (i, addr) in opts.seeds.iter().enumerate() {
        let inf = connect(addr, timeout, timeout).and_then(|mut c| info(&mut c, "everything"));
        match inf {
            Ok(inf) if opts.cluster && info_field(&inf, "cluster_enabled") == Some("1") => return Ok((i, inf)),
            Ok(inf) if info_field(&inf, "cluster_enabled") == Some("1") => {
                return Err(RedisDeviceError::Cluster { addr: addr.clone() })
            }
            Ok(_) if opts.cluster => why.push(format!("{addr} is not a cluster node (cluster_enabled:0)")),
            Ok(inf) if info_field(&inf, "role") == Some("master") => return Ok((i, inf)),
            Ok(inf) => {
                why.push(format!("{addr} is a {}", info_field(&inf, "role").unwrap_or("server of unknown role")))
            }
            Err(e) => why.push(format!("{addr}: {e}")),
        }
    }
    Err(RedisDeviceError::NoPrimary { seeds: seeds_str.to_string(), why: why.join("; ") })
}

/// The device's sealer: its key (read from the key file, random, or none without
/// encryption) and a random salt, bound to the device's random key prefix. Returns the
/// sealer, the prefix and the pager's id in it.
fn new_sealer(opts: &RedisOptions) -> Result<(Sealer, String, String), RedisDeviceError> {
    let key = match (&opts.key_file, opts.encrypt) {
        (_, false) => None,
        (Some(path), true) => Some(read_key(path)?),
        (None, true) => {
            let mut k = [0u8; 32];
            getrandom::fill(&mut k)
                .map_err(|e| RedisDeviceError::Io { what: "random key", source: std::io::Error::other(e) })?;
            Some(k)
        }
    };
    let mut id = [0u8; 8];
    getrandom::fill(&mut id)
        .map_err(|e| RedisDeviceError::Io { what: "random key prefix", source: std::io::Error::other(e) })?;
    let id: String = id.iter().map(|b| format!("{b:02x}")).collect();
    let prefix = match &opts.session {
        Some(session) => format!("uswap:{session}.{id}:"),
        None => format!("uswap:{id}:"),
    };
    let mut salt = [0u8; seal::SALT_BYTES];
    getrandom::fill(&mut salt)
        .map_err(|e| RedisDeviceError::Io { what: "random key salt", source: std::io::Error::other(e) })?;
    let sealer = Sealer::new(key, &salt, prefix.as_bytes())?;
    Ok((sealer, prefix, id))
}

/// Starts the device's `connections` threads (at least one), each with its connection.
fn start_threads(
    sh: Arc<Shared>,
    sync_read: Arc<SyncReader>,
    connections: usize,
) -> Result<RedisBackend, RedisDeviceError> {
    let mut threads = Vec::new();
    for i in 0..connections.max(1) {
        let w = Worker::new(Arc::clone(&sh), Arc::clone(&sync_read));
        // An engine thread: signals blocked, and served by ordinary memory where an
        // allocator serves the application from managed memory (the threads allocate).
        let t = crate::mapping::spawn_engine_thread(format!("uswap-redis-{i}"), move || w.run())
            .map_err(|e| RedisDeviceError::Io { what: "starting a device thread", source: e });
        match t {
            Ok(t) => threads.push(t),
            Err(e) => {
                let _ = RedisBackend { sh, sync_read, threads };
                return Err(e);
            }
        }
    }
    debug_assert_eq!(threads.len(), connections.max(1), "every device thread started");
    Ok(RedisBackend { sh, sync_read, threads })
}

/// A Redis Cluster's slot map, read from the first seed that answers, with each primary
/// checked as a standalone primary is (`noeviction`, `replicas=N` connected replicas).
fn open_cluster(opts: &RedisOptions) -> Result<SlotMap, RedisDeviceError> {
    let timeout = Duration::from_millis(2000);
    let mut why = Vec::new();
    for addr in &opts.seeds {
        let map = connect(addr, timeout, timeout)
            .and_then(|mut c| redis::cmd("CLUSTER").arg("SLOTS").query::<redis::Value>(&mut c))
            .map_err(|e| e.to_string())
            .and_then(|reply| SlotMap::from_cluster_slots(&reply));
        match map {
            Ok(map) => {
                for node in &map.nodes {
                    let inf = connect(node, timeout, timeout).and_then(|mut c| info(&mut c, "everything"));
                    let inf = inf.map_err(|e| RedisDeviceError::NoPrimary {
                        seeds: node.clone(),
                        why: format!("a primary of the cluster does not answer: {e}"),
                    })?;
                    check_primary(node, &inf, opts.replicas)?;
                }
                return Ok(map);
            }
            Err(e) => why.push(format!("{addr}: {e}")),
        }
    }
    Err(RedisDeviceError::NoPrimary { seeds: opts.seeds.join(";"), why: why.join("; ") })
}

/// Claims a job, waiting (nanosleep: async-signal-safe) up to the failover timeout.
fn claim(sh: &Shared) -> Option<u32> {
    let hint = crate::mapping::current_cpu() * 7;
    let deadline = now_ns() + sh.failover_timeout_ns;
    // Bounded by the deadline.
    loop {
        if let Some(i) = sh.jobs.claim(hint) {
            return Some(i);
        }
        if now_ns() >= deadline {
            return None;
        }
        let ts = libc::timespec { tv_sec: 0, tv_nsec: 100_000 };
        // SAFETY: nanosleep reads one timespec; a null remainder is allowed.
        unsafe { libc::nanosleep(&ts, std::ptr::null_mut()) };
    }
}

impl Drop for RedisBackend {
    fn drop(&mut self) {
        self.sh.shutdown.store(true, Ordering::Release);
        self.sh.jobs.doorbell.fetch_add(1, Ordering::Release);
        crate::sync::futex_wake(&self.sh.jobs.doorbell, i32::MAX);
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
        if self.sh.keep_keys.load(Ordering::Relaxed) {
            eprintln!(
                "uswap: {}: this pager's keys ({}*) are left in the store for the fork children that still read them; \
                 delete them once those have ended (uswap run does)",
                self.sh.name, self.sh.prefix
            );
            return;
        }
        self.delete_all();
    }
}

impl RedisBackend {
    /// Deletes every key of this pager (SCAN + DEL), within the failover timeout. Best
    /// effort: the store may be gone.
    fn delete_all(&self) {
        let sh = &self.sh;
        if sh.counters.writes.load(Ordering::Relaxed) == 0 && sh.counters.wait_short.load(Ordering::Relaxed) == 0 {
            return;
        }
        let deadline = now_ns() + sh.failover_timeout_ns.max(1_000_000_000);
        if sh.cluster_map.is_some() {
            if let Err(e) = delete_on_primaries(&sh.seeds, &format!("{}*", sh.prefix), deadline) {
                eprintln!(
                    "uswap: {}: could not delete this pager's keys ({}*): {e}; delete them by hand",
                    sh.name, sh.prefix
                );
            }
            return;
        }
        let addr = &sh.seeds[sh.primary.load(Ordering::Acquire)];
        let Ok(mut con) = connect(addr, sh.connect_timeout(), sh.io_timeout()) else {
            eprintln!(
                "uswap: {}: could not connect to delete this pager's keys ({}*); delete them by hand",
                sh.name, sh.prefix
            );
            return;
        };
        if let Err(e) = scan_delete(&mut con, &format!("{}*", sh.prefix), deadline, false) {
            eprintln!(
                "uswap: {}: could not delete all of this pager's keys ({}*): {e}; delete them by hand",
                sh.name, sh.prefix
            );
        }
    }
}

impl Backend for RedisBackend {
    fn name(&self) -> String {
        self.sh.name.clone()
    }

    fn nr_slots(&self) -> u64 {
        self.sh.nr_slots
    }

    fn slow_writes(&self) -> bool {
        true
    }

    fn write(&self, reqs: &mut [WriteReq<'_>]) {
        if reqs.is_empty() {
            return;
        }
        let work = Work::Write { reqs: reqs.as_mut_ptr().cast(), n: reqs.len() };
        if !self.call(work) {
            for r in reqs.iter_mut() {
                r.result =
                    Err(BackendError::Remote { slot: r.slot, why: "every request slot of the device stayed busy" });
            }
        }
    }

    fn read(&self, reqs: &mut [ReadReq<'_>]) {
        if self.sh.forked.load(Ordering::Relaxed) {
            self.sync_read.read_in_fork_child(&self.sh, reqs);
            return;
        }
        if reqs.is_empty() || self.sync_read.read(&self.sh, reqs) {
            return;
        }
        let work = Work::Read { reqs: reqs.as_mut_ptr().cast(), n: reqs.len() };
        if !self.call(work) {
            for r in reqs.iter_mut() {
                r.result =
                    Err(BackendError::Remote { slot: r.slot, why: "every request slot of the device stayed busy" });
            }
        }
    }

    /// The child reads the parent's keys on connections of its own: every key of the parent
    /// stays until the parent frees its slot, which it holds while the child may read it.
    /// Not on a cluster yet (the child's reads would go to one node): there every page comes
    /// in before a fork.
    fn shared_with_fork_children(&self) -> bool {
        self.sh.cluster_map.is_none()
    }

    /// Makes the child's own synchronous-read connections (its copies of the parent's are the
    /// same sockets as the parent's); from now on reads use only them.
    fn enter_fork_child(&self) {
        self.sh.forked.store(true, Ordering::Relaxed);
        self.sync_read.reconnect_in_fork_child(&self.sh);
    }

    fn outlived_by_children(&self) {
        self.sh.keep_keys.store(true, Ordering::Relaxed);
    }

    fn invalidate(&self, slot: u64) {
        let Some(g) = self.sh.gens.get(slot as usize) else { return };
        let old = g.swap(0, Ordering::AcqRel);
        if old != 0 {
            self.sh.counters.stored_pages.fetch_sub(1, Ordering::Relaxed);
            self.sh.delete_later(slot, old);
            if self.sh.deletes.len() >= MAX_DELETE_BATCH {
                self.sh.jobs.doorbell.fetch_add(1, Ordering::Release);
                crate::sync::futex_wake(&self.sh.jobs.doorbell, 1);
            }
        }
    }

    fn accepting(&self) -> bool {
        now_ns() >= self.sh.declining_until_ns.load(Ordering::Acquire)
    }

    /// On a cluster with `replicas=N`: every primary has N replicas online (`INFO
    /// replication`), by the map read now from any node that answers. A standalone store's
    /// probe write says it all (its `WAIT` is the primary's).
    fn writable(&self) -> Result<(), BackendError> {
        if self.sh.cluster_map.is_none() || self.sh.replicas == 0 {
            return Ok(());
        }
        let why = match self.sh.shards_short_of_replicas() {
            Ok(short) if short.is_empty() => return Ok(()),
            Ok(_) => "a cluster shard has fewer replicas online than replicas=N",
            Err(why) => why,
        };
        Err(BackendError::Remote { slot: 0, why })
    }

    fn stats(&self) -> Option<BackendStats> {
        let s = self.redis_stats();
        Some(BackendStats {
            stored_pages: s.stored_pages,
            compressed_bytes: s.stored_pages * self.sh.sealer.value_bytes() as u64,
            reject_pool_full: s.rejected_full,
            discard_errors: s.delete_errors,
            failovers: s.failovers,
            redirects: s.redirects,
            remote_read_errors: s.missing_pages + s.corrupt_pages,
            ..BackendStats::default()
        })
    }

    fn async_reader(&self, nr_pages: usize) -> Option<Box<dyn AsyncReader>> {
        let nr_pages = nr_pages.max(1);
        Some(Box::new(RedisAsyncReader {
            sh: Arc::clone(&self.sh),
            buf: vec![AlignedPage([0; PAGE_SIZE]); nr_pages].into_boxed_slice(),
            runs: vec![AsyncRun { slot: 0, first_page: 0, nr_pages: 0 }; nr_pages].into_boxed_slice(),
            results: (0..nr_pages).map(|_| Ok(())).collect(),
            nr_runs: 0,
            job: None,
        }))
    }
}

/// Asynchronous readahead on the Redis device: one `MGET` of the window's runs, done by a
/// device thread into a buffer of the reader's own while the application works.
///
/// Soundness: a device thread writes into `buf`, `runs` and `results` only while `job` is
/// `Some` (posted and not yet waited for); every accessor refuses while it is, and `Drop`
/// waits for it.
pub struct RedisAsyncReader {
    sh: Arc<Shared>,
    buf: Box<[AlignedPage]>,
    runs: Box<[AsyncRun]>,
    results: Box<[Result<(), BackendError>]>,
    nr_runs: usize,
    job: Option<u32>,
}

impl AsyncReader for RedisAsyncReader {
    fn capacity_pages(&self) -> usize {
        self.buf.len()
    }

    fn start(&mut self, runs: &[AsyncRun]) -> bool {
        let stopping = self.sh.shutdown.load(Ordering::Acquire);
        if stopping || self.job.is_some() || runs.is_empty() || runs.len() > self.runs.len() {
            return false;
        }
        let mut end = 0;
        for r in runs {
            let in_dev = r.slot.checked_add(r.nr_pages as u64).is_some_and(|e| e <= self.sh.nr_slots);
            if r.nr_pages == 0 || r.first_page < end || r.first_page + r.nr_pages > self.buf.len() || !in_dev {
                return false;
            }
            end = r.first_page + r.nr_pages;
        }
        let Some(i) = self.sh.jobs.claim(crate::mapping::current_cpu() * 7) else { return false };
        self.runs[..runs.len()].copy_from_slice(runs);
        self.nr_runs = runs.len();
        for r in self.results[..runs.len()].iter_mut() {
            *r = Ok(());
        }
        self.job = Some(i);
        self.sh.jobs.post(
            i,
            Work::AsyncRead {
                runs: self.runs.as_ptr(),
                n: runs.len(),
                buf: self.buf.as_mut_ptr(),
                buf_pages: self.buf.len(),
                results: self.results.as_mut_ptr(),
            },
        );
        true
    }

    fn in_flight(&self) -> bool {
        self.job.is_some()
    }

    fn wait(&mut self, results: &mut [Result<(), BackendError>]) {
        if let Some(i) = self.job.take() {
            self.sh.jobs.wait_and_free(i, self.sh.poll_ns);
        }
        for (out, r) in results.iter_mut().zip(self.results[..self.nr_runs].iter_mut()) {
            *out = std::mem::replace(r, Ok(()));
        }
    }

    fn pages(&self) -> Option<&[AlignedPage]> {
        self.job.is_none().then_some(&self.buf[..])
    }

    fn pages_mut(&mut self) -> Option<&mut [AlignedPage]> {
        if self.job.is_none() {
            Some(&mut self.buf[..])
        } else {
            None
        }
    }
}

impl Drop for RedisAsyncReader {
    fn drop(&mut self) {
        if let Some(i) = self.job.take() {
            self.sh.jobs.wait_and_free(i, 0);
        }
    }
}
