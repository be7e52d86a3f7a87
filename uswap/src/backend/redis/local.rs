//! Local Redis servers for measurements and tests: [`LocalRedis`] starts N primaries with M
//! replicas each on free 127.0.0.1 ports, in a temporary directory, and kills them all when
//! dropped.
//!
//! # Job
//!
//! Runs `redis-server` (found on `PATH`) with no persistence (`save ""`, no AOF), bound to
//! 127.0.0.1, `maxmemory-policy noeviction`; waits until every server answers and every
//! replica's link is up. Servers get `PR_SET_PDEATHSIG`: they die with the thread that
//! started them even if the process is killed outright, and a process group of their own (a
//! terminal's Ctrl-C reaches the program, which kills them once it has cleaned up).
//!
//! # Locking rules
//!
//! None (owned by one thread).
//!
//! # Invariants
//!
//! Every child started is killed and reaped on drop, and the directory removed.

use std::io;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use super::conn::{connect, info, info_field};

struct Server {
    port: u16,
    child: Option<Child>,
    /// What it was started as (its primary, its extra options), to start it again.
    primary: Option<u16>,
    extra: Vec<String>,
}

/// Local Redis servers; see the module documentation.
pub struct LocalRedis {
    dir: PathBuf,
    servers: Vec<Server>,
    replicas_per_primary: usize,
    /// Started by [`LocalRedis::start_cluster`].
    cluster: bool,
}

/// Whether `redis-server` can be run.
pub fn redis_server_available() -> bool {
    Command::new("redis-server")
        .arg("--version")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

fn free_port() -> io::Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

/// A free port whose cluster bus port (the port plus 10000, which a cluster node also
/// listens on) is free too. Bounded: tries 100 ports.
fn free_cluster_port() -> io::Result<u16> {
    for _ in 0..100 {
        let port = free_port()?;
        if port <= u16::MAX - 10_000 && std::net::TcpListener::bind(("127.0.0.1", port + 10_000)).is_ok() {
            return Ok(port);
        }
    }
    Err(io::Error::other("no free port with a free cluster bus port (port + 10000) in 100 tries"))
}

/// Timeouts of the connections made to see whether a server is ready.
const SHORT: Duration = Duration::from_millis(200);

/// Asks `ready` every 20 ms until it says yes; `what` (not yet true) at `until` is an error,
/// as is an error `ready` returns (a server that exited).
fn wait_until(until: Instant, what: &str, mut ready: impl FnMut() -> io::Result<bool>) -> io::Result<()> {
    // Bounded by `until`.
    while !ready()? {
        if Instant::now() > until {
            return Err(io::Error::new(io::ErrorKind::TimedOut, format!("{what}: not yet, and the time is up")));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    Ok(())
}

impl LocalRedis {
    /// Starts `primaries` primaries, each with `replicas_per_primary` replicas. `extra` are
    /// more `redis-server` options for every server (e.g. `["--maxmemory", "8mb"]`).
    ///
    /// A port found free can be taken by another program before the server binds it (test
    /// suites running side by side on one machine): a server that exits at start-up because
    /// its address is in use is started again, with every other, on new ports (3 tries).
    pub fn start(primaries: usize, replicas_per_primary: usize, extra: &[&str]) -> io::Result<LocalRedis> {
        let mut tries = 0;
        loop {
            match LocalRedis::start_once(primaries, replicas_per_primary, extra) {
                Err(e) if e.kind() == io::ErrorKind::AddrInUse && tries < 3 => tries += 1,
                r => return r,
            }
        }
    }

    fn start_once(primaries: usize, replicas_per_primary: usize, extra: &[&str]) -> io::Result<LocalRedis> {
        static SEQ: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
        let n = SEQ.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let dir = std::env::temp_dir().join(format!("uswap-redis-{}-{n}", std::process::id()));
        std::fs::create_dir_all(&dir)?;
        let mut me = LocalRedis { dir, servers: Vec::new(), replicas_per_primary, cluster: false };
        for _ in 0..primaries {
            let p = me.spawn(None, extra)?;
            for _ in 0..replicas_per_primary {
                me.spawn(Some(p), extra)?;
            }
        }
        me.wait_ready(Duration::from_secs(20))?;
        Ok(me)
    }

    /// Starts a Redis Cluster of `primaries` primaries with `replicas_per_primary` replicas
    /// each (`redis-cli --cluster create`, which spreads the hash slots evenly and picks
    /// each replica's primary), and waits until every node says `cluster_state:ok` and
    /// every replica's link is up. Node timeout 2 s, so that a failover takes seconds.
    /// Which server is a primary is the cluster's business: `CLUSTER SLOTS` tells.
    pub fn start_cluster(primaries: usize, replicas_per_primary: usize) -> io::Result<LocalRedis> {
        let opts = ["--cluster-enabled", "yes", "--cluster-node-timeout", "2000", "--repl-diskless-sync-delay", "0"];
        let mut me = LocalRedis::start(primaries * (replicas_per_primary + 1), 0, &opts)?;
        me.cluster = true;
        let addrs: Vec<String> = (0..me.len()).map(|k| me.addr(k)).collect();
        let out = Command::new("redis-cli")
            .arg("--cluster")
            .arg("create")
            .args(&addrs)
            .args(["--cluster-replicas", &replicas_per_primary.to_string(), "--cluster-yes"])
            .stdin(Stdio::null())
            .output()
            .map_err(|e| io::Error::new(e.kind(), format!("cannot run redis-cli ({e}); install redis-tools")))?;
        if !out.status.success() {
            return Err(io::Error::other(format!(
                "redis-cli --cluster create failed: {}",
                String::from_utf8_lossy(&out.stdout).lines().last().unwrap_or("")
            )));
        }
        me.wait_cluster_ok(Duration::from_secs(30))?;
        Ok(me)
    }

    /// Waits until every node says `cluster_state:ok` and every replica's link is up.
    fn wait_cluster_ok(&self, limit: Duration) -> io::Result<()> {
        let until = Instant::now() + limit;
        for k in 0..self.len() {
            let addr = self.addr(k);
            wait_until(until, &format!("cluster node {addr} ok"), || {
                Ok(connect(&addr, SHORT, SHORT).is_ok_and(|mut c| {
                    let state = redis::cmd("CLUSTER").arg("INFO").query::<String>(&mut c).unwrap_or_default();
                    let repl = info(&mut c, "replication").unwrap_or_default();
                    info_field(&state, "cluster_state") == Some("ok")
                        && (info_field(&repl, "role") == Some("master")
                            || info_field(&repl, "master_link_status") == Some("up"))
                }))
            })?;
        }
        Ok(())
    }

    /// Every server's address, `;`-separated: the seeds of a cluster device.
    pub fn all_seeds(&self) -> String {
        (0..self.len()).map(|k| self.addr(k)).collect::<Vec<_>>().join(";")
    }

    /// Whether the servers form a Redis Cluster ([`LocalRedis::start_cluster`]).
    pub fn is_cluster(&self) -> bool {
        self.cluster
    }

    /// `redis-cluster://SEED;SEED...` of a cluster.
    pub fn cluster_url(&self) -> String {
        format!("redis-cluster://{}", self.all_seeds())
    }

    fn spawn(&mut self, primary: Option<u16>, extra: &[&str]) -> io::Result<u16> {
        let port = if extra.contains(&"--cluster-enabled") { free_cluster_port()? } else { free_port()? };
        let child = self.command(port, primary, extra)?;
        let extra = extra.iter().map(|s| s.to_string()).collect();
        self.servers.push(Server { port, child: Some(child), primary, extra });
        Ok(port)
    }

    /// Starts server `k` again after [`LocalRedis::kill`], on its port and in its
    /// directory (a cluster node finds its `nodes.conf` there and rejoins), with no data.
    pub fn restart(&mut self, k: usize) -> io::Result<()> {
        self.kill(k);
        let (port, primary) = (self.servers[k].port, self.servers[k].primary);
        let extra: Vec<String> = self.servers[k].extra.clone();
        let extra: Vec<&str> = extra.iter().map(String::as_str).collect();
        self.servers[k].child = Some(self.command(port, primary, &extra)?);
        Ok(())
    }

    fn command(&self, port: u16, primary: Option<u16>, extra: &[&str]) -> io::Result<Child> {
        let sdir = self.dir.join(port.to_string());
        std::fs::create_dir_all(&sdir)?;
        let mut cmd = Command::new("redis-server");
        cmd.args(["--port", &port.to_string(), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"])
            .args(["--protected-mode", "no", "--daemonize", "no", "--maxmemory-policy", "noeviction"])
            .arg("--dir")
            .arg(&sdir)
            .arg("--logfile")
            .arg(sdir.join("log"));
        if let Some(p) = primary {
            cmd.args(["--replicaof", "127.0.0.1", &p.to_string()]);
        }
        cmd.args(extra).stdin(Stdio::null()).stdout(Stdio::null()).stderr(Stdio::null());
        // Its own process group: a terminal's Ctrl-C goes to the program that started it,
        // which stops the servers itself once its cleanup is done.
        // SAFETY: prctl and setpgid are async-signal-safe and touch no memory of the parent.
        unsafe {
            cmd.pre_exec(|| {
                libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
                libc::setpgid(0, 0);
                Ok(())
            })
        };
        cmd.spawn().map_err(|e| {
            io::Error::new(
                e.kind(),
                format!("cannot run redis-server ({e}); install it (apt-get install redis-server)"),
            )
        })
    }

    fn wait_ready(&mut self, limit: Duration) -> io::Result<()> {
        let until = Instant::now() + limit;
        for k in 0..self.servers.len() {
            let addr = self.addr(k);
            let is_replica = k % (self.replicas_per_primary + 1) != 0;
            let log = self.dir.join(self.servers[k].port.to_string()).join("log");
            let server = &mut self.servers[k];
            wait_until(until, &format!("redis-server on {addr} ready"), || {
                if let Some(Ok(Some(status))) = server.child.as_mut().map(|c| c.try_wait()) {
                    // The log goes with the directory when the servers are dropped: its last
                    // line is said here.
                    let text = std::fs::read_to_string(&log).unwrap_or_default();
                    let last = text.lines().last().unwrap_or("(empty log)");
                    let in_use = text.contains("Address already in use");
                    let kind = if in_use { io::ErrorKind::AddrInUse } else { io::ErrorKind::Other };
                    return Err(io::Error::new(kind, format!("redis-server on {addr} exited ({status}): {last}")));
                }
                Ok(connect(&addr, SHORT, SHORT)
                    .and_then(|mut c| info(&mut c, "replication"))
                    .is_ok_and(|i| !is_replica || info_field(&i, "master_link_status") == Some("up")))
            })?;
        }
        Ok(())
    }

    /// `127.0.0.1:PORT` of server `k` (servers are numbered primary, its replicas, next
    /// primary, ...).
    pub fn addr(&self, k: usize) -> String {
        format!("127.0.0.1:{}", self.servers[k].port)
    }

    /// Number of servers.
    pub fn len(&self) -> usize {
        self.servers.len()
    }

    pub fn is_empty(&self) -> bool {
        self.servers.is_empty()
    }

    /// Server index of primary `p`'s first server (the primary itself).
    pub fn primary_index(&self, p: usize) -> usize {
        p * (self.replicas_per_primary + 1)
    }

    /// The seeds of primary `p` (it and its replicas), as a device list names them.
    pub fn seeds(&self, p: usize) -> Vec<String> {
        let first = self.primary_index(p);
        (first..first + self.replicas_per_primary + 1).map(|k| self.addr(k)).collect()
    }

    /// `redis://SEED;SEED...` for primary `p`.
    pub fn url(&self, p: usize) -> String {
        format!("redis://{}", self.seeds(p).join(";"))
    }

    /// Process id of server `k`, while it runs.
    pub fn pid(&self, k: usize) -> Option<u32> {
        self.servers[k].child.as_ref().map(Child::id)
    }

    /// Kills server `k` with SIGKILL and reaps it.
    pub fn kill(&mut self, k: usize) {
        if let Some(mut c) = self.servers[k].child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Starts one more server, a replica of server `of` (with `extra` options), and waits
    /// until its link to `of` is up (full synchronisation done). Returns its number.
    pub fn add_replica(&mut self, of: usize, extra: &[&str]) -> io::Result<usize> {
        let port = self.servers[of].port;
        self.spawn(Some(port), extra)?;
        let k = self.servers.len() - 1;
        let addr = self.addr(k);
        wait_until(
            Instant::now() + Duration::from_secs(20),
            &format!("replica {addr} of 127.0.0.1:{port} in sync"),
            || {
                Ok(connect(&addr, SHORT, SHORT)
                    .and_then(|mut c| info(&mut c, "replication"))
                    .is_ok_and(|i| info_field(&i, "master_link_status") == Some("up")))
            },
        )?;
        Ok(k)
    }

    /// The temporary directory holding the servers' logs.
    pub fn dir(&self) -> &Path {
        &self.dir
    }
}

impl Drop for LocalRedis {
    fn drop(&mut self) {
        for k in 0..self.servers.len() {
            self.kill(k);
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
