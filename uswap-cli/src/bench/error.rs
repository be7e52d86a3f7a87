//! Everything `uswap bench` can refuse or fail with. Each message says what went wrong and
//! what to do about it.

use std::io;
use std::path::PathBuf;

use super::args::ENGINE_NAMES;

#[derive(Debug, thiserror::Error)]
pub enum BenchError {
    #[error(
        "--limit {limit} is larger than --wss {wss}: nothing would be swapped; give a limit below the working set"
    )]
    LimitAboveWss { limit: String, wss: String },

    #[error("--wss must be at least {min_pages} pages ({min_bytes} bytes) for this workload; give a larger --wss")]
    WssTooSmall { min_pages: u64, min_bytes: u64 },

    #[error(
        "--limit {limit} is too small for the kernel engines: the workload process itself (stacks, heap) is \
         charged to the memory cgroup; give at least {min}"
    )]
    KernelLimitTooSmall { limit: String, min: String },

    #[error("engine {engine}: {detail} (MemAvailable in /proc/meminfo); give a smaller --wss{hint}")]
    WontFit { engine: String, detail: String, hint: &'static str },

    #[error("--procs applies to --workload usemem only; for the other workloads use --threads")]
    ProcsNeedUsemem,

    #[error(
        "--procs {procs} splits --{what} into pieces of {each}, below the minimum of {min}; give fewer --procs or a larger --{what}"
    )]
    ProcsSplitTooSmall { procs: u64, what: &'static str, each: String, min: String },

    #[error(
        "--workload combined always runs sequential streams; --pattern sets its random workers' pattern: \
         give random, zipf or normal"
    )]
    CombinedSeqPattern,

    #[error("unknown engine {name:?}; known engines: {ENGINE_NAMES}")]
    UnknownEngine { name: String },

    #[error("engine {name} is named twice in --engines; name each engine once (use --runs N to repeat runs)")]
    DuplicateEngine { name: String },

    #[error("--engines is empty; name at least one engine ({ENGINE_NAMES})")]
    NoEngines,

    #[error(
        "--fault-mode picks the engine when --engines is not given; with --engines, name the mode in the \
         engine instead (uswap-signal, uswap-thread)"
    )]
    FaultModeWithEngines,

    #[error("--baseline {baseline} is not one of --engines; add it to --engines or pick another baseline")]
    BaselineMissing { baseline: String },

    #[error(
        "the kernel engines ({engines}) need root: they turn swap on and create a memory cgroup. Run with sudo, \
         or leave them out of --engines"
    )]
    NotRoot { engines: String },

    #[error("no memory cgroup controller: {detail}")]
    NoMemoryCgroup { detail: String },

    #[error(
        "kernel-zram needs /sys/block/zram0, which does not exist: load the zram module (`modprobe zram`), or \
         leave kernel-zram out of --engines"
    )]
    ZramMissing,

    #[error(
        "zram0 cannot compress with lz4 (it offers: {available}): load the lz4 module (`modprobe lz4`), or \
         leave kernel-zram out of --engines"
    )]
    ZramNoLz4 { available: String },

    #[error(
        "/dev/zram0 is in use (disksize {disksize} bytes): something else set it up. Free it (`echo 1 > \
         /sys/block/zram0/reset` once nothing uses it), or leave kernel-zram out of --engines"
    )]
    ZramBusy { disksize: u64 },

    #[error(
        "this machine already has swap in use ({devices}): the kernel engines must own the system's swap to \
         measure it. Turn it off first (`swapoff -a`), or leave the kernel engines out of --engines"
    )]
    SwapInUse { devices: String },

    #[error(
        "another uswap bench holds {path} ({holder}): kernel-engine runs take turns. Wait for it to finish, or \
         pass --wait-lock to wait for it"
    )]
    LockHeld { path: PathBuf, holder: String },

    #[error("cannot lock {path}: {source}; run as root (the lock lives in /run/lock)")]
    Lock { path: PathBuf, source: io::Error },

    #[error("cannot run {tool}: {source}; install util-linux (it provides mkswap)")]
    ToolMissing { tool: String, source: io::Error },

    #[error("`{cmd}` failed ({status}): {stderr}")]
    Command { cmd: String, status: String, stderr: String },

    #[error("{what} ({path}): {source}")]
    System { what: String, path: PathBuf, source: io::Error },

    #[error(
        "the swap file needs {need} in {dir} but only {avail} is free: free space, or give --swap-file-dir on \
         another file system (ext4 or xfs), or a smaller --kernel-swap-size"
    )]
    SwapFileSpace { dir: PathBuf, need: String, avail: String },

    #[error("cannot start the workload process ({exe}): {source}")]
    Spawn { exe: PathBuf, source: io::Error },

    #[error("engine {engine}: the workload process failed: {message}")]
    Worker { engine: String, message: String },

    #[error("engine {engine}: the workload process {status}{stderr}")]
    WorkerDied { engine: String, status: String, stderr: String },

    #[error(
        "engine {engine}: the kernel's OOM killer ended the workload process {attempts} time(s): its memory \
         cgroup ran out of memory. At small limits the kernel's cgroup reclaim sometimes gives up with swap \
         still free (probes/kernel_baseline.sh shows it too). Give a larger --limit, more --oom-retries, \
         or a larger --kernel-swap-size if the swap was full"
    )]
    OomKilled { engine: String, attempts: u64 },

    #[error("interrupted")]
    Interrupted,

    #[error(
        "--redis-local {given:?}: {why}; give N primaries and M replicas each as N or NxM, e.g. --redis-local 1x1 (3x1:cluster for a Redis Cluster)"
    )]
    RedisLocalSyntax { given: String, why: String },

    #[error("{what} names redis://local but --redis-local is not given; add --redis-local 1 (or 1x1), or give the store's address")]
    RedisLocalMissing { what: String },

    #[error("{what} names {named}, but --redis-local started {started}; name {use_instead}")]
    RedisLocalKind { what: String, named: &'static str, started: &'static str, use_instead: &'static str },

    #[error("redis://local{index} names primary {index}, but --redis-local started {primaries}; use local0..local{last}", last = .primaries - 1)]
    RedisLocalIndex { index: usize, primaries: usize },

    #[error("--redis-local: starting local Redis servers failed: {source}")]
    RedisLocal { source: io::Error },

    #[error("--command {command:?}: {why}; give the program and its arguments as a shell would, e.g. --command \"sort -S 1G input.txt\"")]
    CommandSyntax { command: String, why: String },

    #[error(
        "engine {engine} cannot run a --command: {why}; leave it out of --engines (or drop the /ra-off, /ra-on \
         suffix)"
    )]
    CommandEngine { engine: String, why: &'static str },

    #[error(
        "{flag} shapes uswap bench's own workload and engines, and does not apply to a --command (run as uswap run \
         runs it); leave it out"
    )]
    CommandFlag { flag: &'static str },

    #[error(transparent)]
    Launch(#[from] crate::run::RunError),

    #[error("engine {engine}: the program {status}{stderr}")]
    ProgramFailed { engine: String, status: String, stderr: String },

    #[error(
        "the program's output differs between {first} and {second}: {detail}. Its stdout must not depend on the \
         engine (print no pids, times or addresses); fix the program, or send what varies to stderr"
    )]
    OutputDiffers { first: String, second: String, detail: String },

    #[error(
        "engine {engine}: the program ended but processes it started still hold its stdout after {seconds} s; \
         they were killed. Make it wait for its children"
    )]
    StrayProcesses { engine: String, seconds: u64 },

    #[error(transparent)]
    Engine(#[from] uswap::Error),

    #[error("writing {path}: {source}")]
    Write { path: PathBuf, source: io::Error },

    #[error(
        "cleaning up after the kernel engines failed; the machine is not as it was. Fix by hand: {}",
        problems.join("; ")
    )]
    Teardown { problems: Vec<String> },
}

impl BenchError {
    pub fn system(what: impl Into<String>, path: impl Into<PathBuf>, source: io::Error) -> BenchError {
        BenchError::System { what: what.into(), path: path.into(), source }
    }
}
