//! Synchronous reads, by the faulting thread itself: a readahead window's `MGET` on a
//! connection of the device's, without the hand-off to a device thread, to the primary or,
//! on a Redis Cluster, to the node serving the window's hash slot. (The name is the kernel's:
//! a swap-in from a fast device skips the swap cache and reads synchronously,
//! `SWP_SYNCHRONOUS_IO`; "direct" is direct reclaim's word, `crate::reclaim::direct`.)
//!
//! # Job
//!
//! Through a device thread a read costs two cross-CPU wake-ups on top of Redis's own round
//! trip: the fault wakes the thread, the thread wakes the fault. On these VMs (a woken vCPU
//! leaves `hlt`) that was a third of a random fault's 56 µs (BENCHMARKS.md, "The Redis
//! tier"). [`SyncReader::read`] does the round trip on the faulting thread: it try-locks one of
//! [`SYNC_READ_CONNECTIONS`] connections to the primary, writes `MGET` with the keys formatted
//! in place, reads the reply until it is whole and opens each value into its page.
//!
//! On a cluster the device threads publish their slot maps into `owners` (each hash slot's
//! primary, as a packed IPv4 address), and keep [`CONNECTIONS_PER_NODE`] connections to each
//! of the first [`MAX_SYNC_READ_NODES`] primaries. A window within one swap cluster (one hash
//! tag, so one hash slot) is read on a connection to its slot's primary. A map that is out
//! of date costs nothing wrong: the node answers `MOVED` or `ASK` (an error reply: given
//! back), or, a primary back after its replica was promoted, has no key for the window's
//! generations (a null: given back too, unlike on a standalone store, where it means the
//! page is lost); the device threads then follow the cluster and publish the new map.
//!
//! It speaks RESP by hand rather than through the `redis` crate because the crate allocates,
//! and this runs inside a SIGBUS handler in signal mode: each connection's command and reply
//! buffers are allocated when it is made, and the only calls are `write`, `read` and `close`,
//! which are async-signal-safe. The protocol needed is small: one command, whose reply is an
//! array of bulk strings or nulls.
//!
//! Anything unexpected (no free connection, a connection to a former primary, an error
//! reply, a timeout, a reply that does not parse or does not fit) gives the read back to the
//! device threads (`read` returns false), which follow failovers and report errors. A
//! connection that failed is closed, since its stream may be out of step, and marked for a
//! device thread to make again ([`SyncReader::maintain`]).
//!
//! # Locking rules
//!
//! Each connection is a [`SpinLock`] of class `DeviceChannel` (`crate::sync`), only ever
//! try-locked, and held across its `write` and `read`s (the class's exception to the no
//! system call rule): a reader that finds every connection busy uses the device threads.
//!
//! # Invariants
//!
//! * A connection in the table is in step: no reply is pending on it. A round trip that did
//!   not end with a whole reply closes it.
//! * A connection is used only while it is to the current primary (`Shared::primary`), or
//!   on a cluster to the primary `owners` names for the window's hash slot.
//! * A value is opened only under the generation its key names, so a node never gives a
//!   page another generation's contents, whatever map the read went by.

use std::io::{ErrorKind, Read, Write};
use std::net::{TcpStream, ToSocketAddrs};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use crossbeam_utils::CachePadded;

use super::cluster::{hash_slot, slot_tag, SlotMap, NR_HASH_SLOTS};
use super::seal::VALUE_BYTES;
use super::shared::Shared;
use crate::backend::{BackendError, ReadReq};
use crate::clock::now_ns;
use crate::readahead::MAX_WINDOW_PAGES;
use crate::sync::{LockClass, SpinLock};

/// Connections for reads by faulting threads (more threads than this at once use the
/// device threads).
pub const SYNC_READ_CONNECTIONS: usize = 4;
/// On a cluster: connections to each primary read synchronously...
pub const CONNECTIONS_PER_NODE: usize = 2;
/// ...and how many primaries are (a larger cluster's others are read by the device threads).
pub const MAX_SYNC_READ_NODES: usize = 8;
/// The longest key: `uswap:` + a session (at most 64) + `.` + 16 hex digits + `:` (the
/// prefix), on a cluster the hash tag `{` + 16 hex digits + `.` + a decimal u64 + `}:`,
/// then two decimal u64s and a `:`.
const MAX_KEY_BYTES: usize = 88 + 40 + 2 * 20 + 1;
/// Room for one key in a command: `$LEN\r\nKEY\r\n`.
const KEY_ARG_BYTES: usize = MAX_KEY_BYTES + 8;
/// Room for one value in a reply: `$LEN\r\nVALUE\r\n`.
const VALUE_REPLY_BYTES: usize = VALUE_BYTES + 16;
/// How often device threads try to make missing connections again.
const RECONNECT_PERIOD_NS: u64 = 200_000_000;

struct Conn {
    /// Where it is connected to (a seed index on a standalone store, a node's packed address
    /// on a cluster: [`pack`]), and the stream; `None` after a failure.
    stream: Option<(u64, Stream)>,
    /// The command and reply buffers, allocated with the first connection (empty before).
    cmd: Box<[u8]>,
    reply: Box<[u8]>,
}

impl Conn {
    /// Takes `stream` to `to`, allocating the buffers the first time. Allocates: device
    /// threads and fork children only.
    fn open(&mut self, to: u64, stream: Option<Stream>) {
        if self.cmd.is_empty() {
            self.cmd = vec![0u8; 32 + MAX_WINDOW_PAGES * KEY_ARG_BYTES].into_boxed_slice();
            self.reply = vec![0u8; 32 + MAX_WINDOW_PAGES * VALUE_REPLY_BYTES].into_boxed_slice();
        }
        self.stream = stream.map(|s| (to, s));
    }

    fn is_to(&self, to: u64) -> bool {
        matches!(&self.stream, Some((t, _)) if *t == to)
    }
}

/// What a round trip came to.
#[derive(Debug, PartialEq, Eq)]
enum Trip {
    /// Every request's result is set.
    Done,
    /// Nothing set, and the connection is in step: the device threads should read (a
    /// cluster node without a key: a stale map, or a stale primary).
    GiveBack,
    /// Nothing set, and the connection may be out of step: close it.
    Broken,
}

/// An IPv4 `HOST:PORT` packed into a non-zero u64 (the top bit set, the address, the port),
/// so that a faulting thread can read a hash slot's primary with one atomic load; 0 for
/// anything else (a name, IPv6: read by the device threads).
fn pack(addr: &str) -> u64 {
    match addr.parse::<std::net::SocketAddr>() {
        Ok(std::net::SocketAddr::V4(a)) => 1 << 63 | u64::from(u32::from(*a.ip())) << 16 | u64::from(a.port()),
        _ => 0,
    }
}

fn unpack(packed: u64) -> std::net::SocketAddr {
    let ip = std::net::Ipv4Addr::from((packed >> 16) as u32);
    std::net::SocketAddr::from((ip, packed as u16))
}

/// A connection's socket, registered as the engine's descriptor (`crate::fd`) so that a
/// program closing every descriptor, or `dup2`ing over it, leaves it alone.
struct Stream {
    /// Dropped first: unregistered before the socket closes.
    _kept: crate::fd::Kept,
    tcp: TcpStream,
}

pub(super) struct SyncReader {
    conns: Box<[CachePadded<SpinLock<Conn>>]>,
    /// On a cluster: each hash slot's primary, packed ([`pack`]; 0: not read synchronously), as
    /// the device threads last saw it. Empty on a standalone store.
    owners: Box<[AtomicU64]>,
    /// In a fork child: the connections it made its own (one bit each); the others were
    /// held by a parent's thread at the fork and stay locked for good.
    usable_in_child: AtomicU64,
    /// Some connection is missing or to a former primary (or, on a cluster, the primaries
    /// changed).
    stale: AtomicBool,
    /// When a device thread last tried to make connections ([`now_ns`]).
    last_try_ns: AtomicU64,
}

/// How a reply parses so far.
#[derive(Debug, PartialEq, Eq)]
enum Parse {
    /// Whole: this many bytes.
    Done(usize),
    /// Not yet whole.
    More,
    /// Not an array of `n` bulk strings or nulls of at most the expected size (an error
    /// reply among them).
    Bad,
}

impl SyncReader {
    /// The connections for a standalone store, or for `cluster` with its map as read at
    /// start. None is connected yet ([`SyncReader::maintain`] makes them).
    pub(super) fn new(cluster: Option<&SlotMap>) -> SyncReader {
        let nr = if cluster.is_some() { MAX_SYNC_READ_NODES * CONNECTIONS_PER_NODE } else { SYNC_READ_CONNECTIONS };
        let conns = (0..nr)
            .map(|_| {
                let conn = Conn { stream: None, cmd: Box::default(), reply: Box::default() };
                CachePadded::new(SpinLock::new(LockClass::DeviceChannel, conn))
            })
            .collect();
        let owners = match cluster {
            Some(_) => (0..NR_HASH_SLOTS).map(|_| AtomicU64::new(0)).collect(),
            None => Box::default(),
        };
        let d = SyncReader {
            conns,
            owners,
            usable_in_child: AtomicU64::new(0),
            stale: AtomicBool::new(true),
            last_try_ns: AtomicU64::new(0),
        };
        if let Some(map) = cluster {
            d.publish(map);
        }
        d
    }

    /// On a cluster: a device thread's map is the one faulting threads read by from now on.
    pub(super) fn publish(&self, map: &SlotMap) {
        if self.owners.is_empty() {
            return;
        }
        let packed: Vec<u64> = map.nodes.iter().map(|n| pack(n)).collect();
        for (hs, owner) in self.owners.iter().enumerate() {
            owner.store(packed[map.node_of(hs as u16)], Ordering::Release);
        }
        self.stale.store(true, Ordering::Release);
    }

    /// On a cluster, after a `MOVED`: `hash_slot` is served by `addr` now.
    pub(super) fn publish_slot(&self, hash_slot: u16, addr: &str) {
        let Some(owner) = self.owners.get(hash_slot as usize) else { return };
        let packed = pack(addr);
        if owner.swap(packed, Ordering::AcqRel) != packed {
            self.stale.store(true, Ordering::Release);
        }
    }

    /// Where connection `i` should be to: the primary's seed index (standalone), or one of
    /// the first [`MAX_SYNC_READ_NODES`] primaries in `owners` ([`pack`]ed); `None`: nowhere.
    fn targets(&self, sh: &Shared) -> Vec<Option<u64>> {
        if self.owners.is_empty() {
            let primary = sh.primary.load(Ordering::Acquire) as u64;
            return vec![Some(primary); self.conns.len()];
        }
        let mut nodes: Vec<u64> = Vec::with_capacity(MAX_SYNC_READ_NODES);
        for o in self.owners.iter().map(|o| o.load(Ordering::Acquire)) {
            if o != 0 && !nodes.contains(&o) && nodes.len() < MAX_SYNC_READ_NODES {
                nodes.push(o);
            }
        }
        (0..self.conns.len()).map(|i| nodes.get(i / CONNECTIONS_PER_NODE).copied()).collect()
    }

    /// Makes the missing connections (or those to a former primary). Device threads only
    /// (it allocates); at most every [`RECONNECT_PERIOD_NS`] unless `now`.
    pub(super) fn maintain(&self, sh: &Shared, now: bool) {
        if !self.stale.load(Ordering::Acquire) {
            return;
        }
        let t = now_ns();
        let last = self.last_try_ns.load(Ordering::Relaxed);
        if !now && t < last + RECONNECT_PERIOD_NS {
            return;
        }
        if self.last_try_ns.compare_exchange(last, t, Ordering::AcqRel, Ordering::Relaxed).is_err() {
            return; // another device thread is at it
        }
        // Cleared before the targets are read: a change published meanwhile sets it again.
        self.stale.store(false, Ordering::SeqCst);
        for (c, want) in self.conns.iter().zip(self.targets(sh)) {
            let Some(mut c) = c.try_lock() else { continue };
            let Some(to) = want else {
                c.stream = None;
                continue;
            };
            if c.is_to(to) {
                continue;
            }
            c.stream = None;
            let addr = if self.owners.is_empty() {
                sh.seeds[to as usize].to_socket_addrs().ok().and_then(|mut a| a.next())
            } else {
                Some(unpack(to))
            };
            c.open(to, addr.and_then(|sa| connect(&sa, sh.io_timeout())));
            if c.stream.is_none() {
                self.stale.store(true, Ordering::Release);
            }
        }
    }

    /// Where a read of `reqs` goes: the primary's seed index, or on a cluster the packed
    /// primary of their hash slot; `None` when the pages are not all of one swap cluster's
    /// hash tag, or the primary is not read synchronously.
    fn destination(&self, sh: &Shared, reqs: &[ReadReq<'_>]) -> Option<u64> {
        if self.owners.is_empty() {
            return Some(sh.primary.load(Ordering::Acquire) as u64);
        }
        let tag = slot_tag(reqs.first()?.slot);
        if reqs.iter().any(|r| slot_tag(r.slot) != tag || slot_tag(r.slot + r.buf.len() as u64 - 1) != tag) {
            return None;
        }
        let mut buf = [0u8; 48];
        let mut w = Cursor { buf: &mut buf, at: 0 };
        w.hash_tag(sh.tag_id.as_bytes(), reqs[0].slot)?;
        let len = w.at;
        let hs = hash_slot(&buf[..len]);
        Some(self.owners[hs as usize].load(Ordering::Acquire)).filter(|&o| o != 0)
    }

    /// Reads `reqs` on the calling thread. True if it did (each request's `result` set, as the
    /// device threads would set it); false if the device threads should (nothing changed).
    /// Async-signal-safe: no allocation, only `write`, `read` and `close`.
    pub(super) fn read(&self, sh: &Shared, reqs: &mut [ReadReq<'_>]) -> bool {
        let mut gens = [0u64; MAX_WINDOW_PAGES];
        let mut n = 0;
        for r in reqs.iter() {
            let nr = r.buf.len();
            if nr == 0 || n + nr > MAX_WINDOW_PAGES || r.slot.checked_add(nr as u64).is_none_or(|e| e > sh.nr_slots) {
                return false;
            }
            for p in 0..nr {
                let generation = sh.gens[(r.slot + p as u64) as usize].load(Ordering::Acquire);
                if generation == 0 {
                    return false; // the device threads say which slot is empty
                }
                gens[n] = generation;
                n += 1;
            }
        }
        let Some(to) = self.destination(sh, reqs).filter(|_| n > 0) else { return false };
        let mut busy = false;
        for c in self.conns.iter() {
            let Some(mut c) = c.try_lock() else {
                busy = true; // perhaps one to `to`
                continue;
            };
            if !c.is_to(to) {
                if self.owners.is_empty() && c.stream.is_some() {
                    c.stream = None; // to a former primary
                    self.stale.store(true, Ordering::Release);
                }
                continue;
            }
            let conn = &mut *c;
            match round_trip(sh, conn, reqs, &gens[..n]) {
                Trip::Done => return true,
                Trip::GiveBack => return false,
                Trip::Broken => {
                    conn.stream = None;
                    self.stale.store(true, Ordering::Release);
                    return false;
                }
            }
        }
        if !busy {
            self.stale.store(true, Ordering::Release); // none is to `to`
        }
        false
    }
}

impl SyncReader {
    /// In a fork child (one thread, allocation allowed): replaces every connection by one of
    /// the child's own to the primary. The copies it inherited are the parent's sockets, on
    /// which the parent's threads have requests in flight; closing a copy leaves the
    /// parent's alone. A connection a parent's thread held at the fork stays locked for
    /// good in the child, and unused.
    /// The address is the one the parent resolved at open (a name lookup in a fork child
    /// of a threaded process could wait for a lock no thread will release).
    pub(super) fn reconnect_in_fork_child(&self, sh: &Shared) {
        let primary = sh.primary.load(Ordering::Acquire);
        let mut usable = 0;
        for (i, c) in self.conns.iter().enumerate() {
            if let Some(mut c) = c.try_lock() {
                c.stream = None;
                c.open(primary as u64, sh.seed_addrs[primary].and_then(|sa| connect(&sa, sh.io_timeout())));
                usable |= 1 << i;
            }
        }
        self.usable_in_child.store(usable, Ordering::Relaxed);
    }

    /// In a fork child: whether a connection of the child's may still serve (busy with
    /// another of its threads, or connected).
    fn child_may_read(&self) -> bool {
        let usable = self.usable_in_child.load(Ordering::Relaxed);
        self.conns
            .iter()
            .enumerate()
            .any(|(i, c)| usable & (1 << i) != 0 && c.try_lock().is_none_or(|c| c.stream.is_some()))
    }

    /// Reads `reqs` in a fork child, where no device thread serves: on the child's own
    /// connections, waiting (bounded by the I/O timeout) while all are busy. A read that
    /// cannot be made (no connection left, a slot the parent held nothing in) fails each
    /// request. Async-signal-safe, as [`SyncReader::read`].
    pub(super) fn read_in_fork_child(&self, sh: &Shared, reqs: &mut [ReadReq<'_>]) {
        if reqs.is_empty() {
            return;
        }
        let deadline = now_ns() + sh.io_timeout().as_nanos() as u64;
        // Bounded by the deadline; each pass tries every connection once.
        while now_ns() < deadline && self.child_may_read() {
            if self.read(sh, reqs) {
                return;
            }
            if reqs.iter().any(|r| (r.slot..r.slot + r.buf.len() as u64).any(|s| !has_page(sh, s))) {
                break;
            }
            // SAFETY: plain system call; async-signal-safe.
            unsafe { libc::sched_yield() };
        }
        for r in reqs.iter_mut() {
            r.result = Err(BackendError::Remote { slot: r.slot, why: "a fork child could not read its parent's page" });
        }
    }
}

/// Whether the slot holds a page (as this process's copy of the device knows it).
fn has_page(sh: &Shared, slot: u64) -> bool {
    sh.gens.get(slot as usize).is_some_and(|g| g.load(Ordering::Acquire) != 0)
}

/// How long one `read` of a synchronous-read connection blocks: a reply that takes longer is waited
/// for in slices, between which a stop signal may end the process (see `round_trip`).
const READ_SLICE: Duration = Duration::from_millis(100);

/// Connects to `sa` for synchronous reads: no Nagle, socket timeouts (a read that times out, in
/// slices, gives the request back), the socket moved out of the program's way and
/// registered.
fn connect(sa: &std::net::SocketAddr, io_timeout: Duration) -> Option<Stream> {
    let s = TcpStream::connect_timeout(sa, Duration::from_millis(250)).ok()?;
    let s = TcpStream::from(crate::fd::relocate(std::os::fd::OwnedFd::from(s)));
    s.set_nodelay(true).ok()?;
    s.set_read_timeout(Some(READ_SLICE.min(io_timeout))).ok()?;
    s.set_write_timeout(Some(io_timeout)).ok()?;
    use std::os::fd::AsRawFd;
    Some(Stream { _kept: crate::fd::keep(s.as_raw_fd()), tcp: s })
}

/// One `MGET` of the pages of `reqs` (generations `gens`, in order) on `conn`, which is in
/// step.
fn round_trip(sh: &Shared, conn: &mut Conn, reqs: &mut [ReadReq<'_>], gens: &[u64]) -> Trip {
    let Some((_, Stream { tcp: stream, .. })) = conn.stream.as_mut() else { return Trip::Broken };
    let tag_id = sh.cluster_map.as_ref().map(|_| sh.tag_id.as_bytes());
    let keys = KeyForm { prefix: sh.prefix.as_bytes(), tag_id };
    let Some(cmd_len) = mget_command(&mut conn.cmd, &keys, reqs, gens) else { return Trip::GiveBack };
    if stream.write_all(&conn.cmd[..cmd_len]).is_err() {
        return Trip::Broken;
    }
    let value_len = sh.sealer.value_bytes();
    let deadline_ns = now_ns() + sh.io_timeout().as_nanos() as u64;
    let len = match read_reply(stream, &mut conn.reply, gens.len(), value_len, deadline_ns) {
        Ok(len) => len,
        Err(trip) => return trip,
    };
    let reply = &conn.reply[..len];
    if keys.tag_id.is_some() {
        // On a cluster a key missing from the node the map named may be on another: the
        // device threads read the map again and ask once more (`worker.rs`).
        let mut nulls = 0;
        parse_mget(reply, gens.len(), value_len, |_, v| nulls += usize::from(v.is_none()));
        if nulls > 0 {
            return Trip::GiveBack;
        }
    }
    open_values(sh, reply, reqs, gens, value_len);
    sh.counters.reads.fetch_add(1, Ordering::Relaxed);
    sh.counters.sync_reads.fetch_add(1, Ordering::Relaxed);
    // A store that answers: an outage the device threads saw is over (a read-mostly program
    // may make no other request), so that the next outage gets its own failover timeout.
    sh.end_failover_episode();
    Trip::Done
}

/// Reads the reply to an `MGET` of `n` keys (values of `value_len` bytes) into `reply`
/// until it is whole, by `deadline_ns`. Its length, or `Broken` when the connection is out
/// of step (a bad or overlong reply, a closed or failed socket, the deadline passed).
fn read_reply(
    stream: &mut TcpStream,
    reply: &mut [u8],
    n: usize,
    value_len: usize,
    deadline_ns: u64,
) -> Result<usize, Trip> {
    let mut len = 0;
    // Bounded: each pass reads at least one byte into the fixed buffer, or waits one slice
    // until the deadline, or fails.
    let whole = loop {
        match parse_mget(&reply[..len], n, value_len, |_, _| {}) {
            Parse::Done(l) => break l,
            Parse::Bad => return Err(Trip::Broken),
            Parse::More if len == reply.len() => return Err(Trip::Broken),
            Parse::More => {}
        }
        match stream.read(&mut reply[len..]) {
            Ok(0) => return Err(Trip::Broken),
            Ok(got) => len += got,
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) && now_ns() < deadline_ns => {
                // A store slow to answer (or stopped): the faulting thread may be asked to
                // end meanwhile.
                crate::uffd::sigbus::let_stop_signals_through();
            }
            Err(_) => return Err(Trip::Broken),
        }
    };
    debug_assert!(len <= reply.len() && whole <= len, "a whole reply lies in what was read");
    if whole != len {
        return Err(Trip::Broken); // more than the reply: out of step
    }
    Ok(len)
}

/// Opens each value of the whole `MGET` reply `reply` into its page of `reqs` (generations
/// `gens`, in order), setting each request's result: `Ok`, or the first missing or corrupt
/// page's error.
fn open_values(sh: &Shared, reply: &[u8], reqs: &mut [ReadReq<'_>], gens: &[u64], value_len: usize) {
    // Where each value goes: (request, page in request, generation).
    let mut at = [(0u32, 0u32); MAX_WINDOW_PAGES];
    let mut i = 0;
    for (k, r) in reqs.iter_mut().enumerate() {
        r.result = Ok(());
        for p in 0..r.buf.len() {
            at[i] = (k as u32, p as u32);
            i += 1;
        }
    }
    // `SyncReader::read` counted the pages into `gens`, at most a window's.
    assert_eq!(i, gens.len(), "a generation for each page read");
    parse_mget(reply, gens.len(), value_len, |i, value| {
        let (k, p) = (at[i].0 as usize, at[i].1 as usize);
        let r = &mut reqs[k];
        if r.result.is_err() {
            return;
        }
        let slot = r.slot + p as u64;
        match value {
            None => {
                sh.counters.missing.fetch_add(1, Ordering::Relaxed);
                r.result = Err(BackendError::Remote {
                    slot,
                    why: "the page is missing from the store (lost with a primary that had no up-to-date replica)",
                });
            }
            Some(v) => {
                if sh.sealer.open(slot, gens[i], v, &mut r.buf[p].0).is_err() {
                    sh.counters.corrupt.fetch_add(1, Ordering::Relaxed);
                    r.result = Err(BackendError::Corrupt { slot });
                }
            }
        }
    });
}

/// How keys are spelled (`Shared::key`): the prefix, and on a cluster the pager's id that
/// begins each key's hash tag.
struct KeyForm<'a> {
    prefix: &'a [u8],
    tag_id: Option<&'a [u8]>,
}

/// Writes `*N\r\n$4\r\nMGET\r\n` and one `$LEN\r\nKEY\r\n` per page into `buf`; the length,
/// or None if it does not fit.
fn mget_command(buf: &mut [u8], keys: &KeyForm<'_>, reqs: &[ReadReq<'_>], gens: &[u64]) -> Option<usize> {
    let mut w = Cursor { buf, at: 0 };
    w.put(b"*")?;
    w.decimal(gens.len() as u64 + 1)?;
    w.put(b"\r\n$4\r\nMGET\r\n")?;
    let mut i = 0;
    for r in reqs {
        for p in 0..r.buf.len() as u64 {
            let (slot, generation) = (r.slot + p, gens[i]);
            let tag_len = keys.tag_id.map_or(0, |id| id.len() + decimal_len(slot_tag(slot)) + 4);
            let key_len = keys.prefix.len() + tag_len + decimal_len(slot) + 1 + decimal_len(generation);
            w.put(b"$")?;
            w.decimal(key_len as u64)?;
            w.put(b"\r\n")?;
            w.put(keys.prefix)?;
            if let Some(id) = keys.tag_id {
                w.hash_tag(id, slot)?;
                w.put(b":")?;
            }
            w.decimal(slot)?;
            w.put(b":")?;
            w.decimal(generation)?;
            w.put(b"\r\n")?;
            i += 1;
        }
    }
    Some(w.at)
}

struct Cursor<'a> {
    buf: &'a mut [u8],
    at: usize,
}

impl Cursor<'_> {
    fn put(&mut self, bytes: &[u8]) -> Option<()> {
        let end = self.at.checked_add(bytes.len()).filter(|&e| e <= self.buf.len())?;
        self.buf[self.at..end].copy_from_slice(bytes);
        self.at = end;
        Some(())
    }

    /// A key's hash tag on a cluster, `{ID.C}` (as `Shared::key` spells it): the pager's
    /// id and slot `slot`'s swap cluster.
    fn hash_tag(&mut self, id: &[u8], slot: u64) -> Option<()> {
        self.put(b"{")?;
        self.put(id)?;
        self.put(b".")?;
        self.decimal(slot_tag(slot))?;
        self.put(b"}")
    }

    fn decimal(&mut self, v: u64) -> Option<()> {
        let mut digits = [0u8; 20];
        let n = decimal_len(v);
        let mut x = v;
        for d in digits[..n].iter_mut().rev() {
            *d = b'0' + (x % 10) as u8;
            x /= 10;
        }
        self.put(&digits[..n])
    }
}

fn decimal_len(v: u64) -> usize {
    v.checked_ilog10().map_or(1, |l| l as usize + 1)
}

/// Parses an `MGET` reply of `n` values, each a bulk string of exactly `value_len` bytes or
/// a null, calling `each(i, value)` for every value once the reply is whole (nothing is
/// called otherwise).
fn parse_mget(buf: &[u8], n: usize, value_len: usize, mut each: impl FnMut(usize, Option<&[u8]>)) -> Parse {
    // First pass checks, second calls: `each` sees nothing of a reply that is not whole.
    for call in [false, true] {
        let mut at = match line(buf, 0, b'*') {
            Line::Int(count, next) if count == n as i64 => next,
            Line::Int(..) | Line::Bad => return Parse::Bad,
            Line::More => return Parse::More,
        };
        for i in 0..n {
            match line(buf, at, b'$') {
                Line::Int(-1, next) => {
                    if call {
                        each(i, None);
                    }
                    at = next;
                }
                Line::Int(l, next) if l == value_len as i64 => {
                    let end = next + value_len;
                    if buf.len() < end + 2 {
                        return Parse::More;
                    }
                    if &buf[end..end + 2] != b"\r\n" {
                        return Parse::Bad;
                    }
                    if call {
                        each(i, Some(&buf[next..end]));
                    }
                    at = end + 2;
                }
                // A value of another size is no page of ours: let the device threads say so.
                Line::Int(..) | Line::Bad => return Parse::Bad,
                Line::More => return Parse::More,
            }
        }
        if call {
            return Parse::Done(at);
        }
    }
    Parse::Bad
}

enum Line {
    /// The integer and where the next line starts.
    Int(i64, usize),
    More,
    /// Another type than `kind` (an error reply), or not a number.
    Bad,
}

/// Reads a `KIND<integer>\r\n` line at `at`.
fn line(buf: &[u8], at: usize, kind: u8) -> Line {
    let Some(&first) = buf.get(at) else { return Line::More };
    if first != kind {
        return Line::Bad;
    }
    let mut i = at + 1;
    let neg = buf.get(i) == Some(&b'-');
    if neg {
        i += 1;
    }
    let start = i;
    let mut v: i64 = 0;
    // Bounded: 19 digits at most.
    while let Some(&b) = buf.get(i) {
        if !b.is_ascii_digit() || i - start >= 19 {
            break;
        }
        v = v * 10 + i64::from(b - b'0');
        i += 1;
    }
    match (buf.get(i), buf.get(i + 1)) {
        (None, _) | (Some(b'\r'), None) => Line::More,
        (Some(b'\r'), Some(b'\n')) if i > start => Line::Int(if neg { -v } else { v }, i + 2),
        _ => Line::Bad,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn collect(buf: &[u8], n: usize, len: usize) -> (Parse, Vec<Option<Vec<u8>>>) {
        let mut out = Vec::new();
        let p = parse_mget(buf, n, len, |i, v| {
            assert_eq!(i, out.len());
            out.push(v.map(<[u8]>::to_vec));
        });
        (p, out)
    }

    #[test]
    fn mget_replies_parse_only_when_whole_and_as_asked() {
        let reply = b"*3\r\n$3\r\nabc\r\n$-1\r\n$3\r\nxyz\r\n";
        let (p, v) = collect(reply, 3, 3);
        assert_eq!(p, Parse::Done(reply.len()));
        assert_eq!(v, vec![Some(b"abc".to_vec()), None, Some(b"xyz".to_vec())]);
        // Every proper prefix wants more, and calls nothing.
        for cut in 0..reply.len() {
            let (p, v) = collect(&reply[..cut], 3, 3);
            assert_eq!(p, Parse::More, "cut at {cut}");
            assert!(v.is_empty());
        }
        // Another count, another value size, an error reply, a broken terminator: refused.
        assert_eq!(collect(reply, 2, 3).0, Parse::Bad);
        assert_eq!(collect(reply, 3, 4).0, Parse::Bad);
        assert_eq!(collect(b"-READONLY You can't write\r\n", 3, 3).0, Parse::Bad);
        assert_eq!(collect(b"*1\r\n$3\r\nabcXY", 1, 3).0, Parse::Bad);
        assert_eq!(collect(b"*1\r\n$x\r\n", 1, 3).0, Parse::Bad);
    }

    #[test]
    fn mget_commands_name_every_key_and_refuse_what_does_not_fit() {
        let mut pages = vec![crate::backend::AlignedPage([0; crate::uffd::PAGE_SIZE]); 3];
        let (a, b) = pages.split_at_mut(2);
        let reqs = [ReadReq::new(9, a), ReadReq::new(100, b)];
        let mut buf = vec![0u8; 256];
        let plain = KeyForm { prefix: b"uswap:ab:", tag_id: None };
        let n = mget_command(&mut buf, &plain, &reqs, &[7, 12345, 1]).unwrap();
        assert_eq!(
            std::str::from_utf8(&buf[..n]).unwrap(),
            "*4\r\n$4\r\nMGET\r\n$12\r\nuswap:ab:9:7\r\n$17\r\nuswap:ab:10:12345\r\n$14\r\nuswap:ab:100:1\r\n"
        );
        assert!(mget_command(&mut buf[..40], &plain, &reqs, &[7, 12345, 1]).is_none());
        // On a cluster each key carries its swap cluster's hash tag (as `Shared::key`).
        let tagged = KeyForm { prefix: b"uswap:ab:", tag_id: Some(b"f00d") };
        let reqs = [ReadReq::new(1030, a)];
        let n = mget_command(&mut buf, &tagged, &reqs, &[7, 8]).unwrap();
        let key = |s: u64, g: u64| format!("uswap:ab:{{f00d.{}}}:{s}:{g}", slot_tag(s));
        let (k1, k2) = (key(1030, 7), key(1031, 8));
        let want = format!("*3\r\n$4\r\nMGET\r\n${}\r\n{k1}\r\n${}\r\n{k2}\r\n", k1.len(), k2.len());
        assert_eq!(std::str::from_utf8(&buf[..n]).unwrap(), want);
        assert_eq!(pack("127.0.0.1:7000") & !(1 << 63), 0x7f00_0001 << 16 | 7000);
        assert_eq!(unpack(pack("10.1.2.3:6379")), "10.1.2.3:6379".parse().unwrap());
        assert_eq!((pack("localhost:6379"), pack("[::1]:6379")), (0, 0), "names and IPv6 go by the device threads");
        assert_eq!(decimal_len(0), 1);
        assert_eq!(decimal_len(u64::MAX), 20);
    }
}
