//! What `uswap run` refuses or fails at, and the exit status each gives.

use std::path::PathBuf;

use crate::size::format_size;

/// The preload library's file name, looked for next to the `uswap` binary.
pub const PRELOAD_LIB: &str = "libuswap_preload.so";
/// Overrides where the preload library is.
pub const ENV_PRELOAD_LIB: &str = "USWAP_PRELOAD_LIB";
/// The first stage's file name, beside the preload library: what `LD_PRELOAD` names (it
/// loads the preload library when a process first needs a pager).
pub const SHIM_LIB: &str = "libuswap_shim.so";

/// Exit status for "uswap could not run the program as asked".
const EXIT_CANNOT_RUN: u8 = 2;
/// The command does not exist (`env`'s status for it).
const EXIT_NOT_FOUND: u8 = 127;
/// The command exists but cannot be executed (`env`'s status for it).
const EXIT_NOT_EXECUTABLE: u8 = 126;

#[derive(Debug, thiserror::Error)]
pub enum RunError {
    #[error("{0}: command not found on PATH")]
    NotFound(String),
    #[error("{path}: cannot run it: {why}")]
    NotRunnable { path: PathBuf, why: String, missing: bool },
    #[error(
        "{0}: statically linked; uswap run manages a program through a preloaded library, which a static \
         program never loads. Link it dynamically, or use the uswap library (or its C API) in the program"
    )]
    Static(PathBuf),
    #[error(
        "{0}: set-user-ID, set-group-ID or with file capabilities, so the dynamic loader runs it without \
         preloaded libraries and uswap could not manage it. Run it without uswap run, or as the user it runs as"
    )]
    SetId(PathBuf),
    #[error(
        "{0}: needs no shared library, so it makes its system calls itself (a Go program built without cgo as a \
         position-independent executable, say); uswap run manages a program through a preloaded library, whose \
         C library calls such a program never makes. Build it with cgo (CGO_ENABLED=1 and -linkmode=external \
         for Go), or use the uswap library (or its C API) in the program"
    )]
    NoLibrary(PathBuf),
    #[error(
        "cannot find {PRELOAD_LIB} next to {exe}, nor in ../lib/uswap/ from it, nor at ${ENV_PRELOAD_LIB}: \
         install uswap with ./install.sh [PREFIX] from its source (`cargo install` copies the command alone), \
         or build it with `cargo build --release`, which puts both in target/release"
    )]
    NoPreload { exe: PathBuf },
    #[error(
        "${ENV_PRELOAD_LIB} names {lib}, which is not a file: point it at {PRELOAD_LIB}, or unset it to use the \
         library next to the command or in ../lib/uswap/ from it"
    )]
    NoPreloadLib { lib: PathBuf },
    #[error(
        "{SHIM_LIB} is not beside {} under that name: uswap run preloads it, and it loads {PRELOAD_LIB} from its own \
         directory. Install both with ./install.sh [PREFIX], or build both with `cargo build --release`",
        preload.display()
    )]
    NoShim { preload: PathBuf },
    #[error(
        "uswap's library is at {}, a path with a space or a colon, which LD_PRELOAD cannot carry (the dynamic \
         loader splits it there), and no link to it could be made in the run's directory ({source}): install \
         uswap under a path without them",
        path.display()
    )]
    PreloadPath { path: PathBuf, source: std::io::Error },
    #[error(
        "a limit of {} is below the least a pager takes, {}: give it at least that",
        format_size(*limit_bytes),
        format_size(uswap::MIN_LIMIT_BYTES)
    )]
    LimitTooSmall { limit_bytes: u64 },
    #[error(
        "a limit of {} is above the most a pager takes, {}: a limit above the machine's memory is never reached, \
         whatever its size, so give one of at most that",
        format_size(*limit_bytes),
        format_size(uswap::MAX_LIMIT_BYTES)
    )]
    LimitTooLarge { limit_bytes: u64 },
    #[error(
        "cannot page the program {}: {source}",
        if *thread_mode {
            "in thread mode (--fault-mode thread; the default, auto, runs most programs in signal mode, which needs no permission)"
        } else {
            "here"
        }
    )]
    Userfaultfd { thread_mode: bool, source: uswap::Error },
    #[error("--device: {0}")]
    Device(uswap::Error),

    #[error("--tier-age: {0}")]
    TierAge(uswap::Error),
    #[error("cannot make a directory for the counters: {0}")]
    StatsDir(std::io::Error),
    #[error("cannot draw a random session name for the Redis devices (getrandom): {0}")]
    RedisSession(std::io::Error),
    #[error("cannot start {path}: {source}")]
    Spawn { path: PathBuf, source: std::io::Error },
    #[error("cannot write {path}: {source}")]
    WriteStats { path: PathBuf, source: std::io::Error },
}

impl RunError {
    /// 127 when the command (or its script's interpreter) does not exist and 126 when it
    /// cannot be executed, as `env`, `nohup` and `timeout` exit (POSIX's convention for
    /// utilities that run a command), so that a script tells a mistyped command from a
    /// failure of uswap's own ([`EXIT_CANNOT_RUN`]).
    pub(super) fn exit_status(&self) -> u8 {
        match self {
            RunError::NotFound(_) | RunError::NotRunnable { missing: true, .. } => EXIT_NOT_FOUND,
            RunError::NotRunnable { .. } => EXIT_NOT_EXECUTABLE,
            RunError::Spawn { source, .. } if source.kind() == std::io::ErrorKind::NotFound => EXIT_NOT_FOUND,
            RunError::Spawn { source, .. }
                if source.kind() == std::io::ErrorKind::PermissionDenied
                    || source.raw_os_error() == Some(libc::ENOEXEC) =>
            {
                EXIT_NOT_EXECUTABLE
            }
            _ => EXIT_CANNOT_RUN,
        }
    }
}
