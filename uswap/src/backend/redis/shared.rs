//! The state a Redis device shares between the backend (its callers), its device threads
//! and its asynchronous readers: [`Shared`], and the device's counters.
//!
//! A leaf below the device's parts: the device threads (`worker.rs`, `routing.rs`), the
//! faulting threads' synchronous reads (`sync_read.rs`) and the device (`mod.rs`) all read
//! it; it imports the types it holds (`seal.rs`, `jobs.rs`, `cluster.rs`) and the connection
//! helpers (`conn.rs`), none of which imports it back. The faulting threads' connections
//! (`sync_read::SyncReader`) are not in it but beside it, held by the backend and each
//! device thread, since they read this state.
//!
//! # Locking rules
//!
//! Callers, device threads and readers share it through atomics, lock-free queues (`jobs`,
//! `deletes`) and futexes; the two mutexes (`last_note`, `cluster_primaries`) are taken by
//! engine threads only, never on the read path.
//!
//! # Invariants
//!
//! * `gens[slot]` is 0 for a slot holding nothing, else the generation of its only readable
//!   key (see `mod.rs`).
//! * Each generation is drawn once from `next_gen`, so a key (and a value's nonce) is never
//!   reused.

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::Duration;

use crossbeam_queue::ArrayQueue;

use super::cluster::{slot_tag, SlotMap};
use super::conn::{connect, info, info_field, primaries_of};
use super::jobs::Jobs;
use super::seal::Sealer;
use crate::clock::now_ns;

/// The device's live counters, read as `RedisStats` (`mod.rs`).
#[derive(Default)]
pub(super) struct Counters {
    pub(super) reads: AtomicU64,
    pub(super) writes: AtomicU64,
    pub(super) stored_pages: AtomicU64,
    pub(super) missing: AtomicU64,
    pub(super) corrupt: AtomicU64,
    pub(super) wait_short: AtomicU64,
    pub(super) reject_full: AtomicU64,
    pub(super) deletes: AtomicU64,
    pub(super) delete_errors: AtomicU64,
    pub(super) sync_reads: AtomicU64,
    pub(super) redirects: AtomicU64,
}

/// A cluster node lost, in [`Shared::lost_nodes`].
pub(super) struct LostNode {
    addr: String,
    deadline_ns: u64,
    last_failed_ns: u64,
}

/// State shared by the backend, its threads and its asynchronous readers.
pub(super) struct Shared {
    pub(super) name: String,
    pub(super) seeds: Vec<String>,
    /// The seeds' addresses, resolved at open (for a fork child, which must not look names
    /// up: `sync_read::SyncReader::reconnect_in_fork_child`).
    pub(super) seed_addrs: Vec<Option<std::net::SocketAddr>>,
    pub(super) prefix: String,
    pub(super) sealer: Sealer,
    pub(super) jobs: Jobs,
    pub(super) nr_slots: u64,
    pub(super) gens: Box<[AtomicU64]>,
    pub(super) next_gen: AtomicU64,
    pub(super) deletes: ArrayQueue<(u64, u64)>,
    pub(super) shutdown: AtomicBool,
    /// Seed index of the primary.
    pub(super) primary: AtomicUsize,
    pub(super) failovers: AtomicU64,
    /// While the primary is lost (a failover episode, from the first request that found it
    /// gone to the first answer from a primary): when its failover timeout ends; 0 when
    /// none is under way. Requests that come later, or wait behind others, look among the
    /// seeds once and fail rather than each waiting a timeout of its own: the documented
    /// timeout bounds the episode.
    /// On a Redis Cluster, the same for the whole cluster: from a node's `CLUSTERDOWN` to
    /// the first answer from any node.
    pub(super) episode_deadline_ns: AtomicU64,
    /// On a Redis Cluster, the nodes lost (a connection error, `LOADING`, ...): each one's
    /// failover episode, from the first request that found it gone to its first answer to
    /// a device thread, or to a map that no longer names it: the address, when the
    /// episode's failover timeout ends, and when a request last found the node gone.
    /// Requests for its hash slots that come later wait for the map to move them until
    /// then, not each for a timeout of its own; the other nodes' are served meanwhile. An
    /// episode no request has continued for a failover timeout is over too (the node may
    /// have answered only the faulting threads' reads, which take no lock). Device threads
    /// only (`routing.rs`); `nr_lost_nodes` lets an answer skip the lock when none is lost.
    pub(super) lost_nodes: Mutex<Vec<LostNode>>,
    pub(super) nr_lost_nodes: AtomicUsize,
    pub(super) declining_until_ns: AtomicU64,
    /// That the store is full was said (once a device).
    pub(super) full_said: AtomicBool,
    pub(super) replicas: u32,
    pub(super) wait_timeout_ms: u64,
    pub(super) failover_timeout_ns: u64,
    pub(super) poll_ns: u64,
    pub(super) counters: Counters,
    /// The last thing the device threads had to say (failovers, errors), also on stderr.
    pub(super) last_note: Mutex<String>,
    /// Set in a fork child's copy of the parent's device: reads on the child's own
    /// synchronous-read connections only (the device threads are the parent's).
    pub(super) forked: AtomicBool,
    /// A fork child still reads the keys: the drop leaves them (see `Backend::outlived_by_children`).
    pub(super) keep_keys: AtomicBool,
    /// On a Redis Cluster: the slot map read at start (each device thread keeps its own
    /// copy up to date), and the pager's id, which each key's hash tag begins with.
    pub(super) cluster_map: Option<SlotMap>,
    pub(super) tag_id: String,
    /// The cluster's primaries (sorted) as last said: each device thread reads the map
    /// itself, and a change is counted and said once.
    pub(super) cluster_primaries: Mutex<Vec<String>>,
}

impl Shared {
    /// Starts a failover episode unless one is under way; true if this call started it (and
    /// is the one to say so).
    pub(super) fn start_failover_episode(&self) -> bool {
        let deadline_ns = (now_ns() + self.failover_timeout_ns).max(1);
        self.episode_deadline_ns.compare_exchange(0, deadline_ns, Ordering::AcqRel, Ordering::Acquire).is_ok()
    }

    /// `own_deadline_ns`, or the failover episode's deadline if one is under way and sooner.
    pub(super) fn failover_deadline(&self, own_deadline_ns: u64) -> u64 {
        match self.episode_deadline_ns.load(Ordering::Acquire) {
            0 => own_deadline_ns,
            episode_ns => own_deadline_ns.min(episode_ns),
        }
    }

    /// A primary answered a request: the next loss starts a new episode (said, with its own
    /// deadline). Async-signal-safe (faulting threads' reads call it): atomics only.
    pub(super) fn end_failover_episode(&self) {
        if self.episode_deadline_ns.load(Ordering::Relaxed) != 0 {
            self.episode_deadline_ns.store(0, Ordering::Release);
        }
    }

    /// The cluster node `addr` failed a request (`conn::is_failover_error`): starts its
    /// failover episode unless one is under way. When the episode's timeout ends, and
    /// whether this call started it (and is the one to say so).
    pub(super) fn node_lost(&self, addr: &str) -> (u64, bool) {
        let Ok(mut lost) = self.lost_nodes.lock() else {
            // Poisoned (a device thread panicked holding it): no episode, each request
            // waits its own timeout, as before episodes.
            return (u64::MAX, false);
        };
        let now = now_ns();
        let timeout_ns = self.failover_timeout_ns;
        if let Some(n) = lost.iter_mut().find(|n| n.addr == addr) {
            if now.saturating_sub(n.last_failed_ns) <= timeout_ns {
                n.last_failed_ns = now;
                return (n.deadline_ns, false);
            }
            // Not found gone for a timeout: a new outage.
            *n = LostNode { addr: addr.to_string(), deadline_ns: now + timeout_ns, last_failed_ns: now };
            return (n.deadline_ns, true);
        }
        lost.push(LostNode { addr: addr.to_string(), deadline_ns: now + timeout_ns, last_failed_ns: now });
        self.nr_lost_nodes.store(lost.len(), Ordering::Release);
        (now + timeout_ns, true)
    }

    /// The cluster node `addr` answered a request (an error it chose is an answer): its
    /// episode is over, and the cluster's, since a node serves.
    pub(super) fn node_answered(&self, addr: &str) {
        self.end_failover_episode();
        if self.nr_lost_nodes.load(Ordering::Acquire) == 0 {
            return;
        }
        self.forget_lost_nodes(|a| a == addr);
    }

    /// The cluster's map changed: a lost node it no longer names serves nothing that is
    /// waited for, and if it comes back and is named again, its next loss is a new episode.
    pub(super) fn forget_lost_nodes_but(&self, nodes: &[String]) {
        if self.nr_lost_nodes.load(Ordering::Acquire) > 0 {
            self.forget_lost_nodes(|a| !nodes.iter().any(|n| n == a));
        }
    }

    fn forget_lost_nodes(&self, forget: impl Fn(&str) -> bool) {
        if let Ok(mut lost) = self.lost_nodes.lock() {
            lost.retain(|n| !forget(&n.addr));
            self.nr_lost_nodes.store(lost.len(), Ordering::Release);
        }
    }

    /// Why a request failed for want of a store that answers, in the topology's words.
    pub(super) fn unavailable(&self) -> &'static str {
        if self.cluster_map.is_some() {
            "no node serving the pages' hash slots answered within the failover timeout"
        } else {
            "no primary among the seeds answered within the failover timeout"
        }
    }

    pub(super) fn key(&self, slot: u64, generation: u64) -> String {
        if self.cluster_map.is_some() {
            // The pages of one swap cluster share a hash slot (see `cluster.rs`).
            format!("{}{{{}.{}}}:{slot}:{generation}", self.prefix, self.tag_id, slot_tag(slot))
        } else {
            format!("{}{slot}:{generation}", self.prefix)
        }
    }

    pub(super) fn connect_timeout(&self) -> Duration {
        Duration::from_millis(1000)
    }

    pub(super) fn io_timeout(&self) -> Duration {
        Duration::from_millis(2000 + self.wait_timeout_ms)
    }

    /// Queues a key no read will ask for again. Lock-free, no allocation.
    pub(super) fn delete_later(&self, slot: u64, generation: u64) {
        if self.deletes.push((slot, generation)).is_err() {
            self.counters.delete_errors.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// On a cluster: the primaries (by the map read now) with fewer than `replicas` replicas
    /// online. Short timeouts; engine threads only.
    pub(super) fn shards_short_of_replicas(&self) -> Result<Vec<String>, &'static str> {
        let short = Duration::from_millis(250);
        let mut candidates = self.cluster_primaries.lock().map(|p| p.clone()).unwrap_or_default();
        candidates.extend(self.seeds.iter().cloned());
        let primaries = primaries_of(&candidates, true, short);
        if primaries.is_empty() {
            return Err("no cluster node answered with a full slot map");
        }
        let online = |addr: &str| -> Option<u32> {
            let mut con = connect(addr, short, short).ok()?;
            let inf = info(&mut con, "replication").ok()?;
            let replicas = inf.lines().filter(|l| l.starts_with("slave") && l.contains("state=online")).count();
            (info_field(&inf, "role") == Some("master")).then_some(replicas as u32)
        };
        Ok(primaries.into_iter().filter(|n| online(n).is_none_or(|r| r < self.replicas)).collect())
    }

    /// Device threads only.
    pub(super) fn note(&self, what: String) {
        eprintln!("uswap: {}: {what}", self.name);
        if let Ok(mut n) = self.last_note.lock() {
            *n = what;
        }
    }
}
