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
//! [`Worker`] is one thread; on a cluster its commands go through its [`ClusterView`]
//! (`routing.rs`). It imports the state it shares (`shared.rs`), the faulting threads'
//! connections it maintains (`sync_read.rs`), the job table (`jobs.rs`), `routing.rs` and the
//! connection helpers (`conn.rs`); the device (`mod.rs`) starts the threads.
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

use std::ops::Range;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use redis::{Connection, RedisError};

use super::conn::{connect, info, info_field, is_failover_error, keep_socket, Failure};
use super::jobs::Work;
use super::routing::ClusterView;
use super::shared::Shared;
use super::sync_read::SyncReader;
use crate::backend::{AlignedPage, BackendError, ReadReq, RejectReason, WriteReq};
use crate::clock::now_ns;
use crate::sync::futex_wait;
use crate::uffd::PAGE_SIZE;

/// Keys deleted with one `DEL`.
pub(super) const MAX_DELETE_BATCH: usize = 1024;
/// After the store answers `OOM`, the device takes no pages for this long.
const FULL_BACKOFF_NS: u64 = 200_000_000;

/// A device thread: its connection to the primary, and on a cluster its view of it.
pub(super) struct Worker {
    sh: Arc<Shared>,
    /// The faulting threads' connections, which this thread makes and keeps up to date.
    sync_read: Arc<SyncReader>,
    /// On a Redis Cluster: this thread's slot map and its connections to the nodes.
    cluster: ClusterView,
    /// The connection's socket, registered as the engine's descriptor (see [`keep_socket`]);
    /// declared before `con`, so that it is let go of before the socket closes.
    kept: Option<crate::fd::Kept>,
    /// The seed index the connection is to, and the connection.
    con: Option<(usize, Connection)>,
}

impl Worker {
    pub(super) fn new(sh: Arc<Shared>, sync_read: Arc<SyncReader>) -> Worker {
        let cluster = ClusterView::new(sh.cluster_map.clone());
        Worker { sh, sync_read, cluster, kept: None, con: None }
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
            self.sync_read.maintain(&sh, false);
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

    /// Runs `f` on each group of `keys` sharing a hash slot (given as its range in `keys`),
    /// on the node serving it (a cluster: see `routing.rs`), or once on all of them on the
    /// primary (standalone). Returns each group's range with what `f` returned, in order;
    /// the first failure fails all.
    fn on_keys<T>(
        &mut self,
        deadline_ns: u64,
        keys: &[String],
        mut f: impl FnMut(&mut Connection, Range<usize>) -> Result<T, RedisError>,
    ) -> Result<Vec<(Range<usize>, T)>, Failure> {
        if !self.cluster.is_cluster() {
            let v = self.round_trip(deadline_ns, |con| f(con, 0..keys.len()))?;
            return Ok(vec![(0..keys.len(), v)]);
        }
        self.cluster.on_groups(&self.sh, &self.sync_read, deadline_ns, keys, f)
    }

    /// Runs `f` on a connection to the primary, following a failover until `deadline_ns` or
    /// the failover episode's deadline, whichever is sooner.
    fn round_trip<T>(
        &mut self,
        deadline_ns: u64,
        mut f: impl FnMut(&mut Connection) -> Result<T, RedisError>,
    ) -> Result<T, Failure> {
        // Bounded: each failed try is followed by a look for the primary, and the tries end
        // one after the deadline (so that a store back by then is found).
        let mut tries = 0u32;
        loop {
            if tries >= 2 {
                // A primary found that fails again (still LOADING): not a busy loop.
                std::thread::sleep(Duration::from_millis(50));
            }
            let want = self.sh.primary.load(Ordering::Acquire);
            let mut not_connected = None;
            if !matches!(&self.con, Some((i, _)) if *i == want) {
                match connect(&self.sh.seeds[want], self.sh.connect_timeout(), self.sh.io_timeout()) {
                    Ok(c) => self.set_con(Some((want, c))),
                    // Kept for the note of the failover it starts (a refused password, a
                    // refused connection), whatever its kind: it is no answer to a request.
                    Err(e) => {
                        self.set_con(None);
                        not_connected = Some(e);
                    }
                }
            }
            let answered = match (&mut self.con, not_connected) {
                (Some((_, con)), _) => f(con),
                (None, Some(e)) => Err(e),
                (None, None) => {
                    Err(RedisError::from(std::io::Error::new(std::io::ErrorKind::NotConnected, "cannot connect")))
                }
            };
            let err = match answered {
                Err(e) if self.con.is_none() || is_failover_error(&e) => e,
                // The primary answered (an error it chose is an answer): the episode is over.
                answered => {
                    self.sh.end_failover_episode();
                    return answered.map_err(|e| {
                        if e.code() == Some("OOM") {
                            return Failure::Full;
                        }
                        self.sh.note(format!("the primary refused a request: {e}"));
                        Failure::Refused
                    });
                }
            };
            self.set_con(None);
            let past_deadline = now_ns() >= self.sh.failover_deadline(deadline_ns);
            if (past_deadline && tries > 0) || !self.find_primary(deadline_ns, err) {
                return Err(Failure::Unavailable);
            }
            tries += 1;
        }
    }

    /// Looks among the seeds for the primary until `deadline_ns`, or the failover episode's
    /// deadline if sooner (every seed is asked once in any case); true if one answered.
    /// Starts the episode (says so) if none is under way; only an answer to a request ends it.
    fn find_primary(&mut self, deadline_ns: u64, cause: RedisError) -> bool {
        let sh = Arc::clone(&self.sh);
        let old = sh.primary.load(Ordering::Acquire);
        if sh.start_failover_episode() {
            sh.note(format!("lost the primary {} ({cause}); looking for the primary among the seeds", sh.seeds[old]));
        }
        let deadline_ns = sh.failover_deadline(deadline_ns);
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
        let (keys, wanted) = keys_to_read(&sh, items);
        if keys.is_empty() {
            return;
        }
        let values = match self.mget(&keys) {
            Ok(values) => values,
            Err(why) => {
                fail_items(items, &wanted, why);
                return;
            }
        };
        sh.counters.reads.fetch_add(1, Ordering::Relaxed);
        open_values(&sh, items, &wanted, values);
    }

    /// Reads `keys` (`MGET`, per hash slot on a cluster), following a failover until the
    /// failover timeout. The values, one per key in order (`None`: no such key), or why not.
    fn mget(&mut self, keys: &[String]) -> Result<Vec<Option<Vec<u8>>>, &'static str> {
        let deadline = now_ns() + self.sh.failover_timeout_ns;
        let mget = |w: &mut Worker| {
            let got =
                w.on_keys(deadline, keys, |con, r| redis::cmd("MGET").arg(&keys[r]).query::<Vec<Option<Vec<u8>>>>(con));
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
            self.cluster.refresh_map(&self.sh, &self.sync_read);
            got = mget(self);
        }
        match got {
            Ok((true, v)) if v.len() == keys.len() => Ok(v),
            Ok(_) | Err(Failure::Refused) | Err(Failure::Full) => Err("the primary answered the read with an error"),
            Err(Failure::Unavailable) => Err(self.sh.unavailable()),
        }
    }

    fn write(&mut self, reqs: &mut [WriteReq<'_>]) {
        let sh = Arc::clone(&self.sh);
        let sealed = seal_pages(&sh, reqs);
        if sealed.written.is_empty() {
            return;
        }
        let outcome = self.mset(&sealed);
        match write_failure(&sh, outcome) {
            None => committed(&sh, &sealed.written),
            Some(how) => not_written(&sh, reqs, &sealed.written, how),
        }
    }

    /// Stores the sealed pages (`MSET`, and with `replicas=N` a `WAIT`), following a failover
    /// until the failover timeout. The fewest replicas that acknowledged a part, or why not.
    fn mset(&mut self, sealed: &Sealed) -> Result<i64, Failure> {
        let deadline = now_ns() + self.sh.failover_timeout_ns;
        let replicas = self.sh.replicas;
        let wait_ms = self.sh.wait_timeout_ms;
        let (keys, values, value_bytes) = (&sealed.keys, &sealed.values, sealed.value_bytes);
        // One `MSET` (and `WAIT`) per group of keys sharing a hash slot on a cluster, one in
        // all on a standalone primary; the write counts as done once each was acknowledged.
        self.on_keys(deadline, keys, |con, r| {
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
        .map(|groups| groups.iter().map(|(_, acked)| *acked).min().unwrap_or(replicas as i64))
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

/// The keys a read asks for (each page's current generation), with (item, page in item,
/// generation) for each. Items out of range, or with a page the store holds nothing for,
/// fail here.
fn keys_to_read(
    sh: &Shared,
    items: &mut [(u64, &mut [AlignedPage], &mut Result<(), BackendError>)],
) -> (Vec<String>, Vec<(usize, usize, u64)>) {
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
    debug_assert_eq!(keys.len(), wanted.len(), "a key for each page wanted");
    (keys, wanted)
}

/// Opens each value read (`values`, in the order of `wanted`) into its page, under the
/// generation its key named; a missing or corrupt value fails its item.
fn open_values(
    sh: &Shared,
    items: &mut [(u64, &mut [AlignedPage], &mut Result<(), BackendError>)],
    wanted: &[(usize, usize, u64)],
    values: Vec<Option<Vec<u8>>>,
) {
    // `mget` returns one value per key asked for, or fails.
    assert_eq!(values.len(), wanted.len(), "a value for each key read");
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

/// A write batch's pages sealed: each page's key, its sealed value (`value_bytes` each, one
/// after another in one buffer), and its (slot, generation), in order.
struct Sealed {
    keys: Vec<String>,
    values: Vec<u8>,
    value_bytes: usize,
    written: Vec<(u64, u64)>,
}

/// Seals the pages of `reqs`, each under a generation of its own. Requests out of range
/// fail here; the others are `Ok` until the write says otherwise.
fn seal_pages(sh: &Shared, reqs: &mut [WriteReq<'_>]) -> Sealed {
    let nr_pages: usize = reqs.iter().map(|r| r.data.nr_pages()).sum();
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
            // Each generation is sealed once: it is the value's nonce (see `seal`).
            sh.sealer.seal(s, generation, &page, &mut values);
            keys.push(sh.key(s, generation));
            debug_assert_eq!(values.len(), keys.len() * value_bytes);
            written.push((s, generation));
        }
    }
    Sealed { keys, values, value_bytes, written }
}

/// Why a write did not count as done: `None` if it did; `Some(Ok(()))` if the store is
/// full (the pages are declined); `Some(Err(why))` if it failed.
fn write_failure(sh: &Shared, outcome: Result<i64, Failure>) -> Option<Result<(), &'static str>> {
    match outcome {
        Ok(acked) if acked >= sh.replicas as i64 => None,
        Ok(_) => {
            sh.counters.wait_short.fetch_add(1, Ordering::Relaxed);
            Some(Err("fewer replicas than replicas=N acknowledged the write in time (WAIT)"))
        }
        Err(Failure::Full) => Some(Ok(())),
        Err(Failure::Refused) => Some(Err("the primary refused the write")),
        Err(Failure::Unavailable) => Some(Err(sh.unavailable())),
    }
}

/// The pages `written` (slot, generation) are stored: each slot's generation moves to its
/// new key, and the key it replaced is queued for deletion.
fn committed(sh: &Shared, written: &[(u64, u64)]) {
    sh.counters.writes.fetch_add(1, Ordering::Relaxed);
    for &(s, generation) in written {
        let old = sh.gens[s as usize].swap(generation, Ordering::AcqRel);
        if old == 0 {
            sh.counters.stored_pages.fetch_add(1, Ordering::Relaxed);
        } else {
            sh.delete_later(s, old);
        }
    }
}

/// The write of `written` did not count (`how`: `Ok(())` the store is full, `Err(why)` it
/// failed): the slots keep their previous generations, the new keys are deleted, and each
/// request not failed yet fails (declined, or with `why`).
fn not_written(sh: &Shared, reqs: &mut [WriteReq<'_>], written: &[(u64, u64)], how: Result<(), &'static str>) {
    // The new keys may exist (a write whose WAIT fell short, or whose answer was lost):
    // none will ever be read, so they are deleted.
    for &(s, generation) in written {
        sh.delete_later(s, generation);
    }
    for r in reqs.iter_mut().filter(|r| r.result.is_ok()) {
        r.result = Err(match how {
            Ok(()) => BackendError::Rejected { slot: r.slot, reason: RejectReason::PoolFull },
            Err(why) => BackendError::Remote { slot: r.slot, why },
        });
    }
    // A full store takes no pages for a while: they go to the next device or stay in RAM at
    // once, instead of every reclaim being refused again. Other failures (a `WAIT` short of
    // replicas, no primary) degrade the device in the swap layer until a probe write
    // succeeds (`swap::health`).
    if how.is_ok() {
        sh.counters.reject_full.fetch_add(reqs.len() as u64, Ordering::Relaxed);
        sh.declining_until_ns.store(now_ns() + FULL_BACKOFF_NS, Ordering::Release);
        if !sh.full_said.swap(true, Ordering::Relaxed) {
            sh.note(
                "the store is full (OOM: maxmemory reached); pages go to the next device or stay in RAM, \
                 over the limit if need be (reject_pool_full; said once)"
                    .into(),
            );
        }
    }
}
