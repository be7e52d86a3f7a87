//! Sessions: the keys of every pager of one `uswap run`, named `uswap:SESSION.ID:...`
//! ([`super::RedisOptions::session`]), and their deletion after the run, from the primary
//! or from every primary of a cluster (its processes may have exited without dropping their
//! pagers). Also the SCAN + DEL a device's drop uses for its own keys.
//!
//! Locking: none; each call makes its own connections.

use std::time::Duration;

use super::cluster::hash_slot;
use super::conn::{connect, info, info_field, primaries_of};
use crate::clock::now_ns;

/// A fresh session name for [`RedisOptions::session`]: 16 random hex digits.
pub fn new_session_id() -> std::io::Result<String> {
    let mut id = [0u8; 8];
    getrandom::fill(&mut id).map_err(std::io::Error::other)?;
    Ok(id.iter().map(|b| format!("{b:02x}")).collect())
}

/// Whether `name` may be a session name (it becomes part of keys and of a SCAN pattern).
pub fn valid_session(name: &str) -> bool {
    (1..=64).contains(&name.len()) && name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
}

/// Deletes every key of session `session` from the primary among `seeds` (after the run
/// ended: its processes may have exited without dropping their pagers), giving up once
/// `within` has passed (a store that does not answer). Returns the keys deleted.
pub fn delete_session(seeds: &[String], cluster: bool, session: &str, within: Duration) -> Result<u64, String> {
    if !valid_session(session) {
        return Err(format!("{session:?} is not a session name"));
    }
    let deadline_ns = now_ns() + within.as_nanos() as u64;
    let pattern = format!("uswap:{session}.*");
    if cluster {
        return delete_on_primaries(seeds, &pattern, deadline_ns);
    }
    let mut why = Vec::new();
    for addr in seeds {
        let left_ns = deadline_ns.saturating_sub(now_ns());
        if left_ns == 0 {
            why.push(format!("{addr}: not tried, {within:?} had passed"));
            continue;
        }
        // Each step of the connection (connect, a reply) may take this long.
        let timeout = Duration::from_nanos((left_ns / 2).clamp(1_000_000, 2_000_000_000));
        let mut con = match connect(addr, timeout, timeout) {
            Ok(c) => c,
            Err(e) => {
                why.push(format!("{addr}: {e}"));
                continue;
            }
        };
        match info(&mut con, "replication") {
            Ok(i) if info_field(&i, "role") == Some("master") => {}
            Ok(_) => continue,
            Err(e) => {
                why.push(format!("{addr}: {e}"));
                continue;
            }
        }
        return scan_delete(&mut con, &pattern, deadline_ns, false)
            .map_err(|e| format!("{addr}: deleting keys within {within:?}: {e}"));
    }
    Err(format!("no seed is a reachable primary ({})", why.join("; ")))
}

/// Deletes the keys matching `pattern` from every primary of the cluster `seeds` belong to,
/// until `deadline_ns`. Returns the keys deleted, or the primaries that failed: the others
/// are cleaned all the same (a node that died takes only its own keys out of reach).
pub(super) fn delete_on_primaries(seeds: &[String], pattern: &str, deadline_ns: u64) -> Result<u64, String> {
    // Each step (connect, a reply) may take this share of what is left: a primary that does
    // not answer leaves time for the others.
    let timeout = |nr_left: usize| {
        let left_ns = deadline_ns.saturating_sub(now_ns()) / (2 * nr_left.max(1) as u64);
        Duration::from_nanos(left_ns.clamp(1_000_000, 2_000_000_000))
    };
    let primaries = primaries_of(seeds, true, timeout(1));
    if primaries.is_empty() {
        return Err("no seed answered with the cluster's slot map".into());
    }
    let mut deleted = 0;
    let mut failed = Vec::new();
    for (k, addr) in primaries.iter().enumerate() {
        let t = timeout(primaries.len() - k);
        match connect(addr, t, t).map(|mut con| scan_delete(&mut con, pattern, deadline_ns, true)) {
            Ok(Ok(n)) => deleted += n,
            Ok(Err(e)) => failed.push(format!("{addr}: deleting keys: {e}")),
            Err(e) => failed.push(format!("{addr}: {e}")),
        }
    }
    let nr_done = primaries.len() - failed.len();
    match (failed.is_empty(), nr_done) {
        (true, _) => Ok(deleted),
        (false, 0) => Err(failed.join("; ")),
        (false, _) => Err(format!("{} (the {nr_done} other primaries answered)", failed.join("; "))),
    }
}

/// Deletes the keys matching `pattern` (SCAN + DEL) until `deadline_ns`. The error says
/// why it could not finish: the store's own error (a cluster whose state is `fail` answers
/// `CLUSTERDOWN` to every key command, whichever node holds the key), or the deadline. A
/// cluster node refuses a `DEL` across hash slots, so there each slot's keys go in a `DEL`
/// of their own.
pub(super) fn scan_delete(
    con: &mut redis::Connection,
    pattern: &str,
    deadline_ns: u64,
    cluster: bool,
) -> Result<u64, String> {
    let mut cursor: u64 = 0;
    let mut deleted = 0;
    let failed = |what: &str, deleted: u64, e: redis::RedisError| {
        // A store's error as it wrote it (`CLUSTERDOWN The cluster is down`), else the client's.
        let said = match (e.code(), e.detail()) {
            (Some(code), detail) => format!("{code} {}", detail.unwrap_or_default()),
            (None, _) => e.to_string(),
        };
        format!("{what} failed after {deleted} keys deleted: {}", said.trim_end())
    };
    // Bounded by the deadline and by SCAN's cursor returning to 0.
    loop {
        let (next, mut keys): (u64, Vec<Vec<u8>>) = redis::cmd("SCAN")
            .arg(cursor)
            .arg("MATCH")
            .arg(pattern)
            .arg("COUNT")
            .arg(1000)
            .query(con)
            .map_err(|e| failed("SCAN", deleted, e))?;
        let slot = |k: &[u8]| if cluster { hash_slot(k) } else { 0 };
        keys.sort_by_key(|k| slot(k));
        for group in keys.chunk_by(|a, b| slot(a) == slot(b)) {
            deleted += redis::cmd("DEL").arg(group).query::<u64>(con).map_err(|e| failed("DEL", deleted, e))?;
        }
        cursor = next;
        if cursor == 0 {
            return Ok(deleted);
        }
        if now_ns() >= deadline_ns {
            return Err(format!("the time given had passed after {deleted} keys deleted"));
        }
    }
}
