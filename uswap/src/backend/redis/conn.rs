//! Connections to Redis through the `redis` crate, as the device threads, the start-up
//! checks and session deletion make them: connecting with the device's socket timeouts,
//! `INFO` and its fields, a cluster's primaries, which errors mean "talk to another server",
//! and registering a connection's socket as the engine's descriptor.
//!
//! A leaf of the folder's graph: it imports only `cluster.rs` (the slot map); the device
//! threads (`worker.rs`, `routing.rs`), the device (`mod.rs`, `shared.rs`), `session.rs` and
//! `local.rs` all connect through it.
//!
//! Locking: none; each connection belongs to its caller. Everything here allocates: engine
//! threads only (never a SIGBUS handler; the faulting threads' own connections are
//! `sync_read.rs`'s).

use std::sync::atomic::Ordering;
use std::time::Duration;

use redis::{Connection, RedisError};

use super::cluster::SlotMap;

/// Why a round trip did not succeed.
pub(super) enum Failure {
    /// No primary answered within the deadline.
    Unavailable,
    /// The store is full (`OOM` reply under `noeviction`).
    Full,
    /// Any other error reply.
    Refused,
}

/// Connects to `addr` (HOST:PORT) with the socket timeouts every connection gets.
pub(super) fn connect(addr: &str, timeout: Duration, io_timeout: Duration) -> Result<Connection, RedisError> {
    let client = redis::Client::open(format!("redis://{addr}/"))?;
    let con = client.get_connection_with_timeout(timeout)?;
    con.set_read_timeout(Some(io_timeout))?;
    con.set_write_timeout(Some(io_timeout))?;
    Ok(con)
}

/// One `INFO` section as `field:value` lines.
pub(super) fn info(con: &mut Connection, section: &str) -> Result<String, RedisError> {
    redis::cmd("INFO").arg(section).query::<String>(con)
}

/// The value of `field` in an `INFO` answer.
pub(super) fn info_field<'a>(info: &'a str, field: &str) -> Option<&'a str> {
    info.lines().find_map(|l| l.strip_prefix(field).and_then(|r| r.strip_prefix(':'))).map(str::trim)
}

/// The primaries of the cluster `seeds` belong to (the first seed that answers tells), or
/// the seeds themselves if they are not a cluster's.
pub(super) fn primaries_of(seeds: &[String], cluster: bool, timeout: Duration) -> Vec<String> {
    if !cluster {
        return seeds.to_vec();
    }
    for addr in seeds {
        let map = connect(addr, timeout, timeout)
            .and_then(|mut c| redis::cmd("CLUSTER").arg("SLOTS").query::<redis::Value>(&mut c))
            .ok()
            .and_then(|reply| SlotMap::from_cluster_slots(&reply).ok());
        if let Some(m) = map {
            return m.nodes;
        }
    }
    Vec::new()
}

/// Whether an error means "talk to another server" rather than "this request is wrong".
pub(super) fn is_failover_error(e: &RedisError) -> bool {
    e.is_io_error()
        || e.is_connection_dropped()
        || e.is_connection_refusal()
        || e.is_timeout()
        || matches!(e.code(), Some("READONLY" | "LOADING" | "MASTERDOWN" | "TRYAGAIN" | "CLUSTERDOWN"))
}

/// Finds the descriptor of `con`'s socket and registers it as the engine's (`crate::fd`), so
/// that a program closing every descriptor, or `dup2`ing over it, leaves it alone: without
/// that the connection would die, and a number the program reused would receive the device's
/// commands. The `redis` crate does not say which descriptor a connection has, so the socket
/// is marked with a read timeout no other socket has (tens of milliseconds apart: the kernel
/// keeps timeouts in jiffies), found in `/proc/self/fd`, and given its timeout back.
/// `None` if it cannot be found (the connection works, unprotected). Device threads only.
pub(super) fn keep_socket(con: &Connection, io_timeout: Duration) -> Option<crate::fd::Kept> {
    use std::sync::atomic::AtomicU64;
    static NEXT_MARK: AtomicU64 = AtomicU64::new(0);
    let mark =
        Duration::from_secs(3600) + Duration::from_millis(20 * (NEXT_MARK.fetch_add(1, Ordering::Relaxed) % 10_000));
    con.set_read_timeout(Some(mark)).ok()?;
    let found = std::fs::read_dir("/proc/self/fd").ok().and_then(|dir| {
        dir.filter_map(|e| e.ok()?.file_name().to_str()?.parse::<i32>().ok()).find(|&fd| {
            let mut tv = libc::timeval { tv_sec: 0, tv_usec: 0 };
            let mut len = std::mem::size_of::<libc::timeval>() as libc::socklen_t;
            // SAFETY: reads one timeval into `tv`; a descriptor that is not a socket (or is
            // closed by now) gives an error and is skipped.
            let r = unsafe {
                libc::getsockopt(
                    fd,
                    libc::SOL_SOCKET,
                    libc::SO_RCVTIMEO,
                    (&mut tv as *mut libc::timeval).cast(),
                    &mut len,
                )
            };
            let got = Duration::from_secs(tv.tv_sec as u64) + Duration::from_micros(tv.tv_usec as u64);
            r == 0 && got.abs_diff(mark) < Duration::from_millis(10)
        })
    });
    con.set_read_timeout(Some(io_timeout)).ok()?;
    found.map(crate::fd::keep)
}
