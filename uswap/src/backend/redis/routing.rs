//! How a device thread sends a command about some keys: to the primary (standalone), or,
//! on a Redis Cluster, to the node serving the keys' hash slot, following redirections.
//!
//! A batch's keys are made in slot order, and the keys of one swap cluster share a hash tag
//! (`cluster::slot_tag`), so they fall into a few contiguous *groups* of one hash slot each.
//! A cluster refuses a multi-key command across hash slots (`CROSSSLOT`), so each group is
//! one command, on the node that [`SlotMap`] names for it:
//!
//! * `MOVED`: the slot has moved (a resharding finished, a replica was promoted): the map
//!   is updated and the command sent to the new node;
//! * `ASK`: the slot is migrating and this key is on the target already: `ASKING`, then the
//!   command, on the target, once; the map stays;
//! * a connection error, `CLUSTERDOWN`, `TRYAGAIN`, `LOADING`: the node died or the cluster
//!   is electing: the map is read again from any node that answers (`CLUSTER SLOTS`), until
//!   the failover deadline, or sooner the end of the failover episode of that node (of the
//!   whole cluster for `CLUSTERDOWN`), which began with the first request it failed and
//!   ends with its first answer (`Shared::node_lost`): the requests that queue behind one
//!   that found a node gone share its timeout instead of each waiting one of their own.
//!
//! [`ClusterView`] holds a device thread's map and connections and sends the commands; the
//! thread (`worker.rs`) owns one and hands it the device's state (`shared.rs`) and the
//! faulting threads' connections (`sync_read.rs`, which learn of every map it reads). This
//! module imports those, `cluster.rs` and `conn.rs`, and nothing that imports it.
//!
//! Locking: none; each device thread owns its map and its connections (one per node).

use std::collections::HashMap;
use std::ops::Range;
use std::sync::atomic::Ordering;
use std::time::Duration;

use redis::{Connection, RedisError};

use super::cluster::{hash_slot, Redirect, SlotMap};
use super::conn::{connect, is_failover_error, keep_socket, Failure};
use super::shared::Shared;
use super::sync_read::SyncReader;
use crate::clock::now_ns;

/// A device thread's view of a cluster: its map and a connection per node it talked to.
#[derive(Default)]
pub(super) struct ClusterView {
    map: Option<SlotMap>,
    /// Per node `HOST:PORT`: the socket kept as the engine's, then the connection.
    cons: HashMap<String, (Option<crate::fd::Kept>, Connection)>,
}

impl ClusterView {
    pub fn new(map: Option<SlotMap>) -> ClusterView {
        ClusterView { map, cons: HashMap::new() }
    }

    pub fn is_cluster(&self) -> bool {
        self.map.is_some()
    }
}

/// The first error among a pipeline's replies (the `MOVED` of an `MSET` sent with its
/// `WAIT`), or `e` itself when it is not a pipeline's.
fn unpipelined(e: RedisError) -> RedisError {
    match e.clone().into_server_errors() {
        Some(items) if !items.is_empty() => RedisError::from(items[0].1.clone()),
        _ => e,
    }
}

/// The contiguous runs of `keys` that share a hash slot, with the slot.
pub(super) fn slot_groups(keys: &[String]) -> Vec<(Range<usize>, u16)> {
    let mut out: Vec<(Range<usize>, u16)> = Vec::new();
    for (i, k) in keys.iter().enumerate() {
        let hs = hash_slot(k.as_bytes());
        match out.last_mut() {
            Some((r, s)) if *s == hs => r.end = i + 1,
            _ => out.push((i..i + 1, hs)),
        }
    }
    out
}

impl ClusterView {
    /// Runs `f` on each group of `keys` sharing a hash slot (given as its range in `keys`),
    /// on the node serving it. Returns each group's range with what `f` returned, in order;
    /// the first failure fails all.
    pub(super) fn on_groups<T>(
        &mut self,
        sh: &Shared,
        sync_read: &SyncReader,
        deadline_ns: u64,
        keys: &[String],
        mut f: impl FnMut(&mut Connection, Range<usize>) -> Result<T, RedisError>,
    ) -> Result<Vec<(Range<usize>, T)>, Failure> {
        let mut out = Vec::new();
        for (r, hs) in slot_groups(keys) {
            let v = self.on_slot(sh, sync_read, deadline_ns, hs, |con| f(con, r.clone()))?;
            out.push((r, v));
        }
        Ok(out)
    }

    /// Runs `f` on the node serving `hs`, following redirections and failovers until
    /// `deadline_ns`, or sooner the end of the failover episode of the node (or of the
    /// whole cluster) that failed it (`Shared::node_lost`). Bounded: each round either
    /// returns, or follows a redirection (at most a few in a row before the map is read
    /// again), or waits 50 ms towards the deadline; past it, the map is read once more
    /// (a failover may have finished since the episode's deadline) before it gives up.
    fn on_slot<T>(
        &mut self,
        sh: &Shared,
        sync_read: &SyncReader,
        deadline_ns: u64,
        hs: u16,
        mut f: impl FnMut(&mut Connection) -> Result<T, RedisError>,
    ) -> Result<T, Failure> {
        let mut redirects = 0;
        let mut read_past_deadline = false;
        loop {
            let Some(addr) = self.map.as_ref().map(|m| m.nodes[m.node_of(hs)].clone()) else {
                return Err(Failure::Unavailable);
            };
            let err = match self.node(sh, &addr) {
                Some(con) => match f(con) {
                    Ok(v) => {
                        sh.node_answered(&addr);
                        return Ok(v);
                    }
                    Err(e) => unpipelined(e),
                },
                None => RedisError::from(std::io::Error::from(std::io::ErrorKind::ConnectionRefused)),
            };
            if !is_failover_error(&err) {
                sh.node_answered(&addr);
            }
            match Redirect::of(&err) {
                Some(Redirect::Moved { hash_slot, addr }) if redirects < 5 => {
                    redirects += 1;
                    sh.counters.redirects.fetch_add(1, Ordering::Relaxed);
                    if let Some(m) = self.map.as_mut() {
                        m.moved(hash_slot, &addr);
                    }
                    sync_read.publish_slot(hash_slot, &addr);
                    continue;
                }
                Some(Redirect::Ask { addr, .. }) if redirects < 5 => {
                    redirects += 1;
                    sh.counters.redirects.fetch_add(1, Ordering::Relaxed);
                    if let Some(con) = self.node(sh, &addr) {
                        if redis::cmd("ASKING").query::<()>(con).is_ok() {
                            match f(con).map_err(unpipelined) {
                                Ok(v) => {
                                    sh.node_answered(&addr);
                                    return Ok(v);
                                }
                                Err(e) if Redirect::of(&e).is_some() || is_failover_error(&e) => {}
                                Err(e) => return Err(refused(sh, e)),
                            }
                        }
                    }
                    continue;
                }
                Some(_) => {}
                None if err.code() == Some("OOM") => return Err(Failure::Full),
                None if is_failover_error(&err) => {
                    self.cons.remove(&addr);
                }
                None => return Err(refused(sh, err)),
            }
            // Too many redirections, or the node is gone: read the map again.
            redirects = 0;
            let until_ns = episode_deadline(sh, &addr, &err, deadline_ns);
            if sh.shutdown.load(Ordering::Acquire) || (now_ns() >= until_ns && read_past_deadline) {
                return Err(Failure::Unavailable);
            }
            if now_ns() >= until_ns {
                read_past_deadline = true;
            } else {
                std::thread::sleep(Duration::from_millis(50));
            }
            self.refresh_map(sh, sync_read);
        }
    }

    /// The connection to `addr`, made if need be (`None` if it cannot be).
    fn node(&mut self, sh: &Shared, addr: &str) -> Option<&mut Connection> {
        if !self.cons.contains_key(addr) {
            let io = sh.io_timeout();
            let con = connect(addr, sh.connect_timeout(), io).ok()?;
            let kept = keep_socket(&con, io);
            self.cons.insert(addr.to_string(), (kept, con));
        }
        self.cons.get_mut(addr).map(|(_, c)| c)
    }

    /// Reads the slot map again from the first node that answers (the known primaries
    /// first, then the seeds), and publishes it for the faulting threads' synchronous reads. A
    /// map whose primaries changed counts as a failover (once for the device, whichever
    /// thread saw it first).
    pub(super) fn refresh_map(&mut self, sh: &Shared, sync_read: &SyncReader) {
        let short = Duration::from_millis(250);
        let mut candidates: Vec<String> = self.map.as_ref().map(|m| m.nodes.clone()).unwrap_or_default();
        candidates.extend(sh.seeds.iter().cloned());
        for addr in candidates {
            let Ok(mut con) = connect(&addr, short, short) else { continue };
            let Ok(reply) = redis::cmd("CLUSTER").arg("SLOTS").query::<redis::Value>(&mut con) else { continue };
            let Ok(map) = SlotMap::from_cluster_slots(&reply) else { continue };
            let mut new = map.nodes.clone();
            new.sort();
            let changed = sh.cluster_primaries.lock().is_ok_and(|mut said| {
                let changed = *said != new;
                *said = new;
                changed
            });
            if changed {
                sh.forget_lost_nodes_but(&map.nodes);
                sh.failovers.fetch_add(1, Ordering::Relaxed);
                sh.note(format!("the cluster's primaries are now {}", map.nodes.join(", ")));
            }
            sync_read.publish(&map);
            self.map = Some(map);
            return;
        }
    }
}

/// How long a request that `addr` failed with `err` may go on: `deadline_ns`, or sooner
/// the end of the failover episode that `err` starts or continues, the whole cluster's for
/// `CLUSTERDOWN` (every node says it), else the node's. A redirection continues none, nor
/// does `TRYAGAIN` (a slot migrating: the node serves). Starting an episode is said, once.
fn episode_deadline(sh: &Shared, addr: &str, err: &RedisError, deadline_ns: u64) -> u64 {
    if !is_failover_error(err) || err.code() == Some("TRYAGAIN") {
        return deadline_ns;
    }
    if err.code() == Some("CLUSTERDOWN") {
        if sh.start_failover_episode() {
            sh.note(format!("the cluster is down ({err}); reading its map again until the failover timeout"));
        }
        return sh.failover_deadline(deadline_ns);
    }
    let (node_ns, started) = sh.node_lost(addr);
    if started {
        sh.note(format!("lost the cluster node {addr} ({err}); reading the map again until the failover timeout"));
    }
    sh.failover_deadline(deadline_ns).min(node_ns)
}

/// A cluster node refused a request (an error reply that is neither a redirection nor a
/// failover's): said, and the request fails.
fn refused(sh: &Shared, e: RedisError) -> Failure {
    sh.note(format!("a cluster node refused a request: {e}"));
    Failure::Refused
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_group_by_hash_slot_in_order() {
        let keys: Vec<String> = ["a{x}1", "a{x}2", "a{y}3", "a{y}4", "a{x}5"].iter().map(|s| s.to_string()).collect();
        let g = slot_groups(&keys);
        assert_eq!(g.iter().map(|(r, _)| r.clone()).collect::<Vec<_>>(), vec![0..2, 2..4, 4..5]);
        assert_eq!(g[0].1, g[2].1);
        assert!(slot_groups(&[]).is_empty());
    }
}
