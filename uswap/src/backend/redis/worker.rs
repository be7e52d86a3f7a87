//! The device threads of the Redis tier: connections, round trips, failover, deletes.
//!
//! # Job
//!
//! Each thread owns one connection to the current primary. It takes jobs posted by callers
//! (`jobs.rs`) and does each in one round trip: a read (a readahead window, or an
//! asynchronous window) is one `MGET`; a write batch is one pipeline of `MSET` and, with
//! `replicas=N`, `WAIT N`. Between jobs it deletes freed keys in batches (`DEL` of many keys).
//!
//! On a connection error (refused, reset, timed out) or an answer saying the server is no
//! longer the primary (`READONLY`, `LOADING`, `MASTERDOWN`), the thread looks among the seeds
//! for the one whose `INFO replication` says `role:master`, and retries the job there, until
//! the job's failover deadline; then the job fails with [`BackendError::Remote`]. It never
//! answers a read with data that did not pass its check.
//!
//! # Locking rules
//!
//! No locks: the threads share the [`Shared`] state through atomics and lock-free queues;
//! each connection belongs to one thread. Threads allocate freely (they never run in a
//! signal handler); the errors they hand back to callers do not own heap memory, since a
//! caller in a signal handler drops them.
//!
//! # Invariants
//!
//! * A job's work is bounded in time: every socket operation has a timeout and every retry
//!   loop a deadline, so a caller waiting on a job is always woken.
//! * `gens[slot]` names the only key of a slot that may be read; every key a thread deletes
//!   is one no read will ask for again (an older generation, or a write that failed), so a
//!   delete never races with a write of the same slot.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use redis::{Connection, RedisError};

use super::jobs::{futex_wait, Work};
use super::routing::ClusterView;
use super::{Shared, MAX_DELETE_BATCH};
use crate::backend::{AlignedPage, BackendError, ReadReq, RejectReason, WriteReq};
use crate::clock::now_ns;
use crate::uffd::PAGE_SIZE;

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
            .and_then(|reply| super::cluster::SlotMap::from_cluster_slots(&reply).ok());
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

pub(super) struct Worker {
    pub(super) sh: Arc<Shared>,
    /// On a Redis Cluster: this thread's slot map and its connections to the nodes.
    pub(super) cluster: ClusterView,
    /// The connection's socket, registered as the engine's descriptor (see [`keep_socket`]);
    /// declared before `con`, so that it is let go of before the socket closes.
    kept: Option<crate::fd::Kept>,
    /// The seed index the connection is to, and the connection.
    con: Option<(usize, Connection)>,
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

impl Worker {
    pub(super) fn new(sh: Arc<Shared>) -> Worker {
        let cluster = ClusterView::new(sh.cluster_map.clone());
        Worker { sh, cluster, kept: None, con: None }
    }

    /// Replaces the connection, registering the new one's socket.
    fn set_con(&mut self, con: Option<(usize, Connection)>) {
        self.kept = None;
        self.con = con;
        if let Some((_, c)) = &self.con {
            self.kept = keep_socket(c, self.sh.io_timeout());
        }
    }

    pub(super) fn run(mut self) {
        let sh = Arc::clone(&self.sh);
        loop {
            sh.direct.maintain(&sh, false);
            let bell = sh.jobs.doorbell.load(Ordering::Acquire);
            if let Some((i, work)) = sh.jobs.take() {
                // A bug here must not leave a caller waiting forever: its requests fail.
                let done = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| self.execute(work)));
                if done.is_err() {
                    self.set_con(None);
                    fail_work(work);
                }
                sh.jobs.finish(i);
                continue;
            }
            if !sh.deletes.is_empty() {
                self.flush_deletes();
                continue;
            }
            if sh.shutdown.load(Ordering::Acquire) {
                return;
            }
            // Poll a little before sleeping: faults come in bursts, and a sleeping thread
            // takes tens of microseconds to wake.
            if sh.poll_ns > 0 {
                let until = now_ns() + sh.poll_ns;
                while !sh.jobs.pending() && now_ns() < until {
                    for _ in 0..64 {
                        std::hint::spin_loop();
                    }
                }
                if sh.jobs.pending() {
                    continue;
                }
            }
            futex_wait(&sh.jobs.doorbell, bell, 50_000_000);
        }
    }

    fn execute(&mut self, work: Work) {
        match work {
            Work::None => {}
            Work::Read { reqs, n } => {
                // SAFETY: the caller's requests stay alive and untouched until the job is
                // DONE (jobs.rs invariants); only this thread accesses them meanwhile.
                let reqs = unsafe { std::slice::from_raw_parts_mut(reqs, n) };
                let mut runs: Vec<(u64, &mut [AlignedPage], &mut Result<(), BackendError>)> =
                    reqs.iter_mut().map(|r: &mut ReadReq<'_>| (r.slot, &mut *r.buf, &mut r.result)).collect();
                self.read(&mut runs);
            }
            Work::AsyncRead { runs, n, buf, buf_pages, results } => {
                // SAFETY: the reader's runs, buffer and results stay alive and untouched
                // until the job is DONE (the reader hands nothing out while in flight).
                let (runs, buf, results) = unsafe {
                    (
                        std::slice::from_raw_parts(runs, n),
                        std::slice::from_raw_parts_mut(buf, buf_pages),
                        std::slice::from_raw_parts_mut(results, n),
                    )
                };
                let mut rest: &mut [AlignedPage] = buf;
                let mut at = 0;
                let mut items = Vec::with_capacity(n);
                for (run, res) in runs.iter().zip(results.iter_mut()) {
                    // `start` checked that runs are sorted, disjoint and inside the buffer.
                    if run.first_page < at || run.first_page + run.nr_pages > at + rest.len() {
                        *res = Err(BackendError::OutOfRange { slot: run.slot, nr_slots: self.sh.nr_slots });
                        continue;
                    }
                    let (_, tail) = std::mem::take(&mut rest).split_at_mut(run.first_page - at);
                    let (pages, tail) = tail.split_at_mut(run.nr_pages);
                    rest = tail;
                    at = run.first_page + run.nr_pages;
                    items.push((run.slot, pages, res));
                }
                self.read(&mut items);
            }
            Work::Write { reqs, n } => {
                // SAFETY: as for reads.
                let reqs = unsafe { std::slice::from_raw_parts_mut(reqs, n) };
                self.write(reqs);
            }
        }
    }

    /// Runs `f` on a connection to the primary, following a failover until `deadline_ns`.
    pub(super) fn round_trip<T>(
        &mut self,
        deadline_ns: u64,
        mut f: impl FnMut(&mut Connection) -> Result<T, RedisError>,
    ) -> Result<T, Failure> {
        // Bounded: each round either returns or waits for a failover that ends at the deadline.
        loop {
            let want = self.sh.primary.load(Ordering::Acquire);
            if !matches!(&self.con, Some((i, _)) if *i == want) {
                let con = connect(&self.sh.seeds[want], self.sh.connect_timeout(), self.sh.io_timeout()).ok();
                self.set_con(con.map(|c| (want, c)));
            }
            let err = match &mut self.con {
                Some((_, con)) => match f(con) {
                    Ok(v) => return Ok(v),
                    Err(e) if e.code() == Some("OOM") => return Err(Failure::Full),
                    Err(e) if is_failover_error(&e) => Some(e),
                    Err(e) => {
                        self.sh.note(format!("the primary refused a request: {e}"));
                        return Err(Failure::Refused);
                    }
                },
                None => None,
            };
            self.set_con(None);
            if !self.find_primary(deadline_ns, err) {
                return Err(Failure::Unavailable);
            }
        }
    }

    /// Looks among the seeds for the primary until `deadline_ns`; true if one answered.
    fn find_primary(&mut self, deadline_ns: u64, cause: Option<RedisError>) -> bool {
        let sh = Arc::clone(&self.sh);
        let old = sh.primary.load(Ordering::Acquire);
        let cause = cause.map_or_else(|| "cannot connect".to_string(), |e| e.to_string());
        if sh.failovers_noted.swap(true, Ordering::AcqRel) {
            // Another thread already said so for this episode.
        } else {
            sh.note(format!("lost the primary {} ({cause}); looking for the primary among the seeds", sh.seeds[old]));
        }
        let short = Duration::from_millis(250);
        // Bounded by the deadline (each connect and INFO has a timeout).
        loop {
            for (i, addr) in sh.seeds.iter().enumerate() {
                let Ok(mut con) = connect(addr, short, short) else { continue };
                let Ok(inf) = info(&mut con, "replication") else { continue };
                if info_field(&inf, "role") == Some("master") {
                    con.set_read_timeout(Some(sh.io_timeout())).ok();
                    con.set_write_timeout(Some(sh.io_timeout())).ok();
                    if sh.primary.swap(i, Ordering::AcqRel) != i {
                        sh.failovers.fetch_add(1, Ordering::Relaxed);
                        sh.note(format!("following the primary at {addr}"));
                    }
                    sh.failovers_noted.store(false, Ordering::Release);
                    self.set_con(Some((i, con)));
                    return true;
                }
            }
            if now_ns() >= deadline_ns || sh.shutdown.load(Ordering::Acquire) {
                return false;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    fn read(&mut self, items: &mut [(u64, &mut [AlignedPage], &mut Result<(), BackendError>)]) {
        let sh = Arc::clone(&self.sh);
        let mut keys = Vec::new();
        // (item, page in item, generation) of each key.
        let mut wanted = Vec::new();
        for (k, (slot, pages, res)) in items.iter_mut().enumerate() {
            let end = slot.checked_add(pages.len() as u64);
            if end.is_none_or(|e| e > sh.nr_slots) {
                **res = Err(BackendError::OutOfRange { slot: *slot, nr_slots: sh.nr_slots });
                continue;
            }
            **res = Ok(());
            for p in 0..pages.len() {
                let s = *slot + p as u64;
                let generation = sh.gens[s as usize].load(Ordering::Acquire);
                if generation == 0 {
                    **res = Err(BackendError::Empty { slot: s });
                    break;
                }
                keys.push(sh.key(s, generation));
                wanted.push((k, p, generation));
            }
        }
        if keys.is_empty() {
            return;
        }
        let deadline = now_ns() + sh.failover_timeout_ns;
        let mget = |w: &mut Worker| {
            let got = w
                .on_keys(deadline, &keys, |con, r| redis::cmd("MGET").arg(&keys[r]).query::<Vec<Option<Vec<u8>>>>(con));
            got.map(|groups| {
                let whole = groups.iter().all(|(r, v)| r.len() == v.len());
                (whole, groups.into_iter().flat_map(|(_, v)| v).collect::<Vec<_>>())
            })
        };
        let mut got = mget(self);
        if self.cluster.is_cluster() && got.as_ref().is_ok_and(|(_, v)| v.iter().any(Option::is_none)) {
            // A node without the key may be one that does not know yet that it lost its
            // slots (a primary back after its replica was promoted): read the map again
            // and ask once more before calling the page missing.
            self.refresh_map();
            got = mget(self);
        }
        let values = match got {
            Ok((true, v)) if v.len() == keys.len() => v,
            Ok(_) | Err(Failure::Refused) | Err(Failure::Full) => {
                fail_items(items, &wanted, "the primary answered the read with an error");
                return;
            }
            Err(Failure::Unavailable) => {
                fail_items(items, &wanted, "no primary among the seeds answered within the failover timeout");
                return;
            }
        };
        sh.counters.reads.fetch_add(1, Ordering::Relaxed);
        for (&(k, p, generation), value) in wanted.iter().zip(values) {
            let (slot, pages, res) = &mut items[k];
            if res.is_err() {
                continue;
            }
            let s = *slot + p as u64;
            match value {
                None => {
                    sh.counters.missing.fetch_add(1, Ordering::Relaxed);
                    **res = Err(BackendError::Remote {
                        slot: s,
                        why: "the page is missing from the store (lost with a primary that had no up-to-date replica)",
                    });
                }
                Some(v) => {
                    if sh.sealer.open(s, generation, &v, &mut pages[p].0).is_err() {
                        sh.counters.corrupt.fetch_add(1, Ordering::Relaxed);
                        **res = Err(BackendError::Corrupt { slot: s });
                    }
                }
            }
        }
    }

    fn write(&mut self, reqs: &mut [WriteReq<'_>]) {
        let sh = Arc::clone(&self.sh);
        let nr_pages: usize = reqs.iter().map(|r| r.data.nr_pages()).sum();
        // Each page's key, its sealed value (`value_bytes` each, one after another in one
        // buffer), and its (slot, generation), in order.
        let value_bytes = sh.sealer.value_bytes();
        let mut keys = Vec::with_capacity(nr_pages);
        let mut values: Vec<u8> = Vec::with_capacity(nr_pages * value_bytes);
        let mut written = Vec::with_capacity(nr_pages);
        let mut page = vec![0u8; PAGE_SIZE];
        for r in reqs.iter_mut() {
            let nr = r.data.nr_pages() as u64;
            if r.slot.checked_add(nr).is_none_or(|e| e > sh.nr_slots) {
                r.result = Err(BackendError::OutOfRange { slot: r.slot, nr_slots: sh.nr_slots });
                continue;
            }
            r.result = Ok(());
            for p in 0..nr {
                let s = r.slot + p;
                let generation = sh.next_gen.fetch_add(1, Ordering::Relaxed);
                r.data.copy_page_to(p as usize, &mut page);
                // Each generation is sealed once: it is the value's nonce (see `codec`).
                sh.sealer.seal(s, generation, &page, &mut values);
                keys.push(sh.key(s, generation));
                debug_assert_eq!(values.len(), keys.len() * value_bytes);
                written.push((s, generation));
            }
        }
        if written.is_empty() {
            return;
        }
        let deadline = now_ns() + sh.failover_timeout_ns;
        let replicas = sh.replicas;
        let wait_ms = sh.wait_timeout_ms;
        // One `MSET` (and `WAIT`) per group of keys sharing a hash slot on a cluster, one in
        // all on a standalone primary; the write counts as done once each was acknowledged.
        let outcome = self
            .on_keys(deadline, &keys, |con, r| {
                let mut mset = redis::cmd("MSET");
                for i in r {
                    mset.arg(&keys[i]).arg(&values[i * value_bytes..(i + 1) * value_bytes]);
                }
                if replicas == 0 {
                    mset.query::<()>(con).map(|_| replicas as i64)
                } else {
                    let mut pipe = redis::pipe();
                    pipe.add_command(mset).ignore().cmd("WAIT").arg(replicas).arg(wait_ms);
                    pipe.query::<(i64,)>(con).map(|(acked,)| acked)
                }
            })
            .map(|groups| groups.iter().map(|(_, acked)| *acked).min().unwrap_or(replicas as i64));
        let why = match outcome {
            Ok(acked) if acked >= replicas as i64 => None,
            Ok(_) => {
                sh.counters.wait_short.fetch_add(1, Ordering::Relaxed);
                Some(Err("fewer replicas than replicas=N acknowledged the write in time (WAIT)"))
            }
            Err(Failure::Full) => Some(Ok(())),
            Err(Failure::Refused) => Some(Err("the primary refused the write")),
            Err(Failure::Unavailable) => Some(Err("no primary among the seeds answered within the failover timeout")),
        };
        match why {
            None => {
                sh.counters.writes.fetch_add(1, Ordering::Relaxed);
                for &(s, generation) in &written {
                    let old = sh.gens[s as usize].swap(generation, Ordering::AcqRel);
                    if old == 0 {
                        sh.counters.stored_pages.fetch_add(1, Ordering::Relaxed);
                    } else {
                        sh.delete_later(s, old);
                    }
                }
            }
            Some(how) => {
                // The new keys may exist (a write whose WAIT fell short, or whose answer was
                // lost): none will ever be read, so they are deleted.
                for &(s, generation) in &written {
                    sh.delete_later(s, generation);
                }
                for r in reqs.iter_mut().filter(|r| r.result.is_ok()) {
                    r.result = Err(match how {
                        Ok(()) => BackendError::Rejected { slot: r.slot, reason: RejectReason::PoolFull },
                        Err(why) => BackendError::Remote { slot: r.slot, why },
                    });
                }
                // A full store takes no pages for a while: they go to the next device or
                // stay in RAM at once, instead of every reclaim being refused again. Other
                // failures (a `WAIT` short of replicas, no primary) degrade the device in
                // the swap layer until a probe write succeeds (`swap::health`).
                if how.is_ok() {
                    sh.counters.reject_full.fetch_add(reqs.len() as u64, Ordering::Relaxed);
                    sh.declining_until_ns.store(now_ns() + super::FULL_BACKOFF_NS, Ordering::Release);
                    if !sh.full_said.swap(true, Ordering::Relaxed) {
                        sh.note(
                            "the store is full (OOM: maxmemory reached); pages go to the next device or stay in RAM, \
                             over the limit if need be (reject_pool_full; said once)"
                                .into(),
                        );
                    }
                }
            }
        }
    }

    /// Deletes queued keys, up to a few batches (one `DEL` each). Best effort: keys that
    /// cannot be deleted are counted (they are never read; the store keeps them).
    fn flush_deletes(&mut self) {
        let sh = Arc::clone(&self.sh);
        for _ in 0..4 {
            let mut keys = Vec::new();
            while keys.len() < MAX_DELETE_BATCH {
                let Some((slot, generation)) = sh.deletes.pop() else { break };
                keys.push(sh.key(slot, generation));
            }
            if keys.is_empty() {
                return;
            }
            let deadline = now_ns() + sh.failover_timeout_ns;
            match self.on_keys(deadline, &keys, |con, r| redis::cmd("DEL").arg(&keys[r]).query::<i64>(con)) {
                Ok(_) => sh.counters.deletes.fetch_add(keys.len() as u64, Ordering::Relaxed),
                Err(_) => sh.counters.delete_errors.fetch_add(keys.len() as u64, Ordering::Relaxed),
            };
        }
    }
}

/// Fails every request of `work` (after a panic in the device thread).
fn fail_work(work: Work) {
    let why = "the device thread failed (a bug; its panic message is on stderr)";
    match work {
        Work::None => {}
        Work::Read { reqs, n } => {
            // SAFETY: as in `execute`: the caller's requests are ours until the job is DONE.
            for r in unsafe { std::slice::from_raw_parts_mut(reqs, n) } {
                r.result = Err(BackendError::Remote { slot: r.slot, why });
            }
        }
        Work::Write { reqs, n } => {
            // SAFETY: as above.
            for r in unsafe { std::slice::from_raw_parts_mut(reqs, n) } {
                r.result = Err(BackendError::Remote { slot: r.slot, why });
            }
        }
        Work::AsyncRead { runs, n, results, .. } => {
            // SAFETY: as in `execute`: the reader's runs and results are ours until DONE.
            let (runs, results) =
                unsafe { (std::slice::from_raw_parts(runs, n), std::slice::from_raw_parts_mut(results, n)) };
            for (run, r) in runs.iter().zip(results) {
                *r = Err(BackendError::Remote { slot: run.slot, why });
            }
        }
    }
}

/// Fails every item that has keys in `wanted` and is not failed yet.
fn fail_items(
    items: &mut [(u64, &mut [AlignedPage], &mut Result<(), BackendError>)],
    wanted: &[(usize, usize, u64)],
    why: &'static str,
) {
    for &(k, _, _) in wanted {
        let (slot, _, res) = &mut items[k];
        if res.is_ok() {
            **res = Err(BackendError::Remote { slot: *slot, why });
        }
    }
}
