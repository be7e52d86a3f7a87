//! Live counters for other processes: each pager serves its [`Stats`] on an abstract unix
//! socket, which `uswap stat PID` finds and reads.
//!
//! **Transport.** A pager listens on the abstract unix stream socket `uswap.<pid>.<n>`, where
//! `n` counts the process's published pagers from 0 ([`next_socket_name`]). Abstract names
//! live in the network namespace, not the file system: nothing to create, nothing left behind
//! when the process dies, and every socket of a process is listed in `/proc/net/unix` (as
//! `@uswap.<pid>.<n>`), which is how [`socket_names`] finds them. A client connects and reads
//! until end of file: the server writes one JSON document (a [`Stats`]) and closes. There is no
//! request. Abstract sockets have no file permissions, so the server checks the peer's
//! credentials (`SO_PEERCRED`): only a process of the same user, or root, gets an answer; any
//! other peer's connection is closed unanswered and counted (`PublishStats::peers_refused`).
//! The client checks the other way round that the socket is served by the process its name
//! says (the listener's pid, also from `SO_PEERCRED`).
//!
//! **Threads and bounds.** One server thread per socket, started with the engine's signal
//! mask (asynchronous signals blocked, so it never runs an application handler), answering one
//! client at a time. It waits in `poll(2)` on the socket and on an eventfd that
//! [`StatsServer`]'s drop rings, then joins it; the socket closes with the thread. An answer
//! is the snapshot function's result, serialized and sent with a send timeout
//! ([`SEND_TIMEOUT`]): a client that does not read costs the server at most that long, never
//! the application. For a pager the snapshot reads the engine's atomic counters and takes the
//! short spin locks [`crate::Pager::stats`] takes, with nothing allocated under them; it does
//! not flush the per-CPU batches of freed slots (the fault path's), so the per-device slot
//! counts it reports may lag by those batches.
//!
//! **Aggregation.** [`serve`] publishes any snapshot function under any name: a supervisor can
//! [`query`] the pagers of its children, sum them with [`Stats::add`] and serve the sum under
//! its own pid with `serve(&next_socket_name(), ...)`.
//!
//! Locking: the server's counters are atomics; nothing here is shared with the fault path.

use std::io::{self, Read};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::linux::net::SocketAddrExt;
use std::os::unix::net::{SocketAddr, UnixListener, UnixStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use crate::fd::ClosedIfStillOurs;
use crate::stats::{PublishStats, Stats};

/// How long the server waits for a client to take an answer before it gives up on it.
pub const SEND_TIMEOUT: Duration = Duration::from_secs(1);

/// Longest answer a client accepts (a pager's stats are a few KiB).
const MAX_ANSWER_BYTES: u64 = 16 << 20;

/// Prefix of every stats socket name.
const NAME_PREFIX: &str = "uswap.";

static NEXT_SEQUENCE: AtomicU64 = AtomicU64::new(0);

/// The next stats socket name of this process: `uswap.<pid>.<n>`, `n` counting from 0.
pub fn next_socket_name() -> String {
    socket_name(std::process::id(), NEXT_SEQUENCE.fetch_add(1, Ordering::Relaxed))
}

/// The name of stats socket `n` of process `pid`.
pub fn socket_name(pid: u32, n: u64) -> String {
    format!("{NAME_PREFIX}{pid}.{n}")
}

/// `(pid, n)` of a stats socket name, `None` for any other name.
pub fn parse_socket_name(name: &str) -> Option<(u32, u64)> {
    let (pid, n) = name.strip_prefix(NAME_PREFIX)?.split_once('.')?;
    let digits = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
    if !digits(pid) || !digits(n) {
        return None;
    }
    Some((pid.parse().ok()?, n.parse().ok()?))
}

#[derive(Default)]
struct Counters {
    queries: AtomicU64,
    peers_refused: AtomicU64,
    send_errors: AtomicU64,
}

/// A running stats socket. Dropping it stops the server thread and closes the socket.
pub struct StatsServer {
    name: String,
    counters: Arc<Counters>,
    /// Rung to stop the thread, if its number still names it (the program may close the
    /// engine's descriptors and reuse the numbers, see `crate::fd`).
    stop: Arc<ClosedIfStillOurs<OwnedFd>>,
    /// Read by the thread at least once a second: stops it where `stop` cannot be rung.
    stopping: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl std::fmt::Debug for StatsServer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StatsServer").field("name", &self.name).finish()
    }
}

impl StatsServer {
    /// The abstract socket name (without the leading NUL).
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The server's own figures, as they appear in the snapshots it serves.
    pub fn publish_stats(&self) -> PublishStats {
        self.counters.publish_stats(&self.name)
    }
}

impl Counters {
    fn publish_stats(&self, name: &str) -> PublishStats {
        PublishStats {
            socket: Some(name.to_string()),
            error: None,
            queries: self.queries.load(Ordering::Relaxed),
            peers_refused: self.peers_refused.load(Ordering::Relaxed),
            send_errors: self.send_errors.load(Ordering::Relaxed),
        }
    }
}

impl Drop for StatsServer {
    fn drop(&mut self) {
        self.stopping.store(true, Ordering::Release);
        self.stop.ring_if_still_ours();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Serves `snapshot()` on the abstract unix socket `name` until the returned handle is
/// dropped. The snapshot's `publish` field is filled with the server's own figures. Fails if
/// the name is taken (`AddrInUse`) or no socket or thread can be had.
pub fn serve<F>(name: &str, snapshot: F) -> io::Result<StatsServer>
where
    F: Fn() -> Stats + Send + 'static,
{
    let listener = UnixListener::bind_addr(&SocketAddr::from_abstract_name(name.as_bytes())?)?;
    // Out of the program's way, like every descriptor of the engine (see `crate::fd`).
    let listener = UnixListener::from(crate::fd::relocate(OwnedFd::from(listener)));
    // Non-blocking: poll said a client is there, but it may have gone before accept.
    listener.set_nonblocking(true)?;
    let listener = ClosedIfStillOurs::new(listener);
    // SAFETY: eventfd(2) returns a new descriptor or -1; no memory is touched.
    let fd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC | libc::EFD_NONBLOCK) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: a fresh descriptor owned by nobody else.
    let stop = Arc::new(ClosedIfStillOurs::new(crate::fd::relocate(unsafe { OwnedFd::from_raw_fd(fd) })));
    let kept = [crate::fd::keep(listener.get().as_raw_fd()), crate::fd::keep(stop.get().as_raw_fd())];
    let stopping = Arc::new(AtomicBool::new(false));
    let counters = Arc::new(Counters::default());
    let thread = {
        let (stop, stopping, counters, name) = (stop.clone(), stopping.clone(), counters.clone(), name.to_string());
        crate::mapping::spawn_engine_thread("uswap-stats".into(), move || {
            let stop_fd = stop.get().as_raw_fd();
            server_loop(listener.get(), (stop_fd, &stopping), &counters, &name, &snapshot);
            // Unregistered before the listener and the eventfd close.
            drop(kept);
        })?
    };
    Ok(StatsServer { name: name.to_string(), counters, stop, stopping, thread: Some(thread) })
}

/// How long the server sleeps at most between looks at its stop flag.
const STOP_CHECK_MS: i32 = 1000;

fn server_loop(
    listener: &UnixListener,
    (stop, stopping): (RawFd, &AtomicBool),
    counters: &Counters,
    name: &str,
    snapshot: &dyn Fn() -> Stats,
) {
    // SAFETY: geteuid cannot fail and touches no memory.
    let my_uid = unsafe { libc::geteuid() };
    while !stopping.load(Ordering::Acquire) {
        let mut fds = [
            libc::pollfd { fd: listener.as_raw_fd(), events: libc::POLLIN, revents: 0 },
            libc::pollfd { fd: stop, events: libc::POLLIN, revents: 0 },
        ];
        // SAFETY: poll reads and writes the two pollfds of a live array of that length.
        let r = unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, STOP_CHECK_MS) };
        if r < 0 {
            let e = io::Error::last_os_error();
            if e.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            // Nothing else can fail for two valid descriptors; stop rather than spin.
            return;
        }
        // Rung, or a number the program closed (`POLLNVAL`): the server stops, rather than
        // wake at once for ever.
        if fds[1].revents != 0 || fds[0].revents & libc::POLLNVAL != 0 {
            return;
        }
        if r == 0 {
            continue;
        }
        let stream = match listener.accept() {
            Ok((s, _)) => s,
            Err(e) if matches!(e.kind(), io::ErrorKind::WouldBlock | io::ErrorKind::Interrupted) => continue,
            // Out of descriptors or memory: the client stays queued, so poll would wake at
            // once again; wait a little instead of spinning.
            Err(e) if matches!(e.raw_os_error(), Some(libc::EMFILE | libc::ENFILE | libc::ENOBUFS | libc::ENOMEM)) => {
                std::thread::sleep(Duration::from_millis(10));
                continue;
            }
            // The number names another file now (the program reused it): stop serving.
            Err(_) => return,
        };
        match peer_cred(&stream) {
            Ok(cred) if cred.uid == my_uid || cred.uid == 0 => {}
            _ => {
                counters.peers_refused.fetch_add(1, Ordering::Relaxed);
                continue;
            }
        }
        counters.queries.fetch_add(1, Ordering::Relaxed);
        let mut stats = snapshot();
        stats.publish = counters.publish_stats(name);
        let sent =
            serde_json::to_vec(&stats).map_err(io::Error::other).and_then(|doc| send_all(&stream, &doc, SEND_TIMEOUT));
        if sent.is_err() {
            counters.send_errors.fetch_add(1, Ordering::Relaxed);
        }
    }
}

/// Sends `buf` with `MSG_NOSIGNAL` (a peer that left must not raise SIGPIPE in a process
/// that may not ignore it), all of it within `timeout` (a peer reading a byte at a time
/// cannot hold the server longer).
fn send_all(stream: &UnixStream, mut buf: &[u8], timeout: Duration) -> io::Result<()> {
    let deadline = std::time::Instant::now() + timeout;
    stream.set_nonblocking(false)?;
    while !buf.is_empty() {
        let left = deadline.saturating_duration_since(std::time::Instant::now());
        if left.is_zero() {
            return Err(io::ErrorKind::TimedOut.into());
        }
        stream.set_write_timeout(Some(left))?;
        // SAFETY: sends from a live slice of buf.len() bytes on a socket we own.
        let n = unsafe { libc::send(stream.as_raw_fd(), buf.as_ptr().cast(), buf.len(), libc::MSG_NOSIGNAL) };
        if n < 0 {
            let e = io::Error::last_os_error();
            if e.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            return Err(e);
        }
        buf = &buf[n as usize..];
    }
    Ok(())
}

/// The credentials of a connected unix socket's peer: for a server, the client's at
/// `connect`; for a client, the listener's at `listen`.
fn peer_cred(stream: &UnixStream) -> io::Result<libc::ucred> {
    let mut cred = libc::ucred { pid: 0, uid: 0, gid: 0 };
    let mut len = std::mem::size_of::<libc::ucred>() as libc::socklen_t;
    // SAFETY: getsockopt writes at most `len` bytes into `cred`, a live ucred of that size.
    let r = unsafe {
        libc::getsockopt(
            stream.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_PEERCRED,
            (&mut cred as *mut libc::ucred).cast(),
            &mut len,
        )
    };
    if r != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(cred)
}

/// The stats socket names of process `pid`, in order of `n`, read from `/proc/net/unix` (the
/// sockets of this network namespace). Empty when the process publishes none.
pub fn socket_names(pid: u32) -> io::Result<Vec<String>> {
    let table = std::fs::read_to_string("/proc/net/unix")?;
    let mut found: Vec<(u64, String)> = table
        .lines()
        .skip(1)
        // The path is the eighth column; abstract names are printed with a leading '@'.
        .filter_map(|line| line.split_whitespace().nth(7)?.strip_prefix('@'))
        .filter_map(|name| match parse_socket_name(name) {
            Some((p, n)) if p == pid => Some((n, name.to_string())),
            _ => None,
        })
        .collect();
    // Accepted connections show the listener's name too.
    found.sort();
    found.dedup();
    Ok(found.into_iter().map(|(_, name)| name).collect())
}

/// Why a stats socket gave no counters.
#[derive(Debug, thiserror::Error)]
pub enum QueryError {
    #[error("nothing listens on @{name} any more (its pager or process has gone)")]
    Gone { name: String },
    #[error("cannot connect to @{name}: {source}")]
    Connect { name: String, source: io::Error },
    #[error(
        "@{name} closed the connection without answering: a pager answers only its own user and \
         root; run this as the user that owns the process (uid {owner_uid}) or as root"
    )]
    Refused { name: String, owner_uid: u32 },
    #[error("@{name} is served by process {served_by}, not by process {expected} as its name says; not reading it")]
    WrongProcess { name: String, expected: u32, served_by: i32 },
    #[error(
        "@{name} did not answer within {timeout:?} (the process may be stopped, or a child forked \
         from it holds the socket); try again, or check the process"
    )]
    Timeout { name: String, timeout: Duration },
    #[error("reading @{name}: {source}")]
    Read { name: String, source: io::Error },
    #[error("@{name} sent something that is not uswap stats ({source}); is it an incompatible uswap version?")]
    Malformed { name: String, source: serde_json::Error },
}

/// Reads the stats served on abstract socket `name`, waiting at most `timeout` for each step.
/// A name of the form `uswap.<pid>.<n>` must be served by process `pid`.
pub fn query(name: &str, timeout: Duration) -> Result<Stats, QueryError> {
    let addr = SocketAddr::from_abstract_name(name.as_bytes())
        .map_err(|source| QueryError::Connect { name: name.into(), source })?;
    let mut stream = UnixStream::connect_addr(&addr).map_err(|source| match source.kind() {
        io::ErrorKind::ConnectionRefused | io::ErrorKind::NotFound => QueryError::Gone { name: name.into() },
        _ => QueryError::Connect { name: name.into(), source },
    })?;
    let listener = peer_cred(&stream).map_err(|source| QueryError::Connect { name: name.into(), source })?;
    if let Some((pid, _)) = parse_socket_name(name) {
        if listener.pid != pid as i32 {
            return Err(QueryError::WrongProcess { name: name.into(), expected: pid, served_by: listener.pid });
        }
    }
    stream.set_read_timeout(Some(timeout)).map_err(|source| QueryError::Read { name: name.into(), source })?;
    let mut doc = Vec::new();
    if let Err(source) = (&mut stream).take(MAX_ANSWER_BYTES).read_to_end(&mut doc) {
        return Err(match source.kind() {
            io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut => QueryError::Timeout { name: name.into(), timeout },
            // The listener closed with our connection still queued: the pager went away.
            io::ErrorKind::ConnectionReset => QueryError::Gone { name: name.into() },
            _ => QueryError::Read { name: name.into(), source },
        });
    }
    if doc.is_empty() {
        return Err(QueryError::Refused { name: name.into(), owner_uid: listener.uid });
    }
    serde_json::from_slice(&doc).map_err(|source| QueryError::Malformed { name: name.into(), source })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn socket_names_parse_back() {
        assert_eq!(parse_socket_name(&socket_name(4242, 7)), Some((4242, 7)));
        for bad in ["uswap.12", "uswap..3", "uswap.12.x", "uswap.-1.0", "other.1.2", "uswap.1.2.3"] {
            assert_eq!(parse_socket_name(bad), None, "{bad}");
        }
    }

    #[test]
    fn a_served_snapshot_reads_back_and_the_name_is_gone_after_drop() {
        let name = format!("uswap-test.{}.{}", std::process::id(), line!());
        let server = serve(&name, || Stats { pswpout: 42, limit_pages: 256, ..Stats::default() }).unwrap();
        for round in 1..=3 {
            let got = query(&name, Duration::from_secs(5)).unwrap();
            assert_eq!((got.pswpout, got.limit_pages), (42, 256));
            assert_eq!(got.publish.socket.as_deref(), Some(name.as_str()));
            assert_eq!(got.publish.queries, round);
            assert_eq!(got.publish.peers_refused, 0);
        }
        assert_eq!(server.publish_stats().queries, 3);
        // The name is taken while the server runs.
        let again = serve(&name, Stats::default).unwrap_err();
        assert_eq!(again.kind(), io::ErrorKind::AddrInUse);
        drop(server);
        assert!(matches!(query(&name, Duration::from_secs(5)), Err(QueryError::Gone { .. })));
    }

    #[test]
    fn clients_that_never_read_do_not_hold_up_the_next() {
        let name = format!("uswap-test.{}.{}", std::process::id(), line!());
        let server = serve(&name, || Stats { pswpin: 7, ..Stats::default() }).unwrap();
        let addr = SocketAddr::from_abstract_name(name.as_bytes()).unwrap();
        // Connected and never read: each answer is sent (into the socket buffer) and closed.
        let idle: Vec<UnixStream> = (0..8).map(|_| UnixStream::connect_addr(&addr).unwrap()).collect();
        let t0 = std::time::Instant::now();
        let got = query(&name, Duration::from_secs(10)).unwrap();
        assert_eq!(got.pswpin, 7);
        assert!(t0.elapsed() < SEND_TIMEOUT, "waited {:?} behind idle clients", t0.elapsed());
        assert_eq!(got.publish.queries, 9, "the idle clients were answered first");
        drop(idle);
        assert_eq!(server.publish_stats().send_errors, 0);
    }
}
