//! The run's directory (`$TMPDIR/uswap-run.PID.N`): made with its lock taken, held for the
//! run's life; directories of runs killed before they could remove their own are removed by
//! a later run once nothing of theirs is left. Inside it, the tree's directory
//! (`tree-<32 random hex digits>`, `USWAP_STATS_DIR`): where every process of the tree finds
//! the shared charge segment and leaves its records and notes.
//!
//! Processes of a tree started by root may change user (`su`, `runuser`, a server that drops
//! its privileges) and stay in the tree, as in a memory cgroup: they must still open the
//! charge segment and write their records. So under root the run's directory is searchable
//! by all (0711: no one else can list it; its lock file 0600) and the tree's directory,
//! whose name only the tree's environment holds, is writable by all and sticky (01777, as
//! `/tmp`: no one removes or replaces another user's files; the segment 0666). Every file
//! root's processes create there is created new (`O_EXCL`, no link followed), and what
//! `uswap run` reads there it reads as regular files, bounded (`tree_files::read_tree_file`): a
//! process that dropped its privileges cannot turn root's writes or reads elsewhere. The run's
//! directory then goes in `$TMPDIR` only if every user can reach it (a private one, as
//! pam_tmpdir makes, would shut them out), else in `/tmp`. Under any other user both are
//! 0700: such a tree changes user only through set-user-ID programs, which the loader runs
//! without the library anyway (`escape`).
//!
//! Invariant: a directory is removed here only when its run's lock is free (the run is
//! dead: the kernel released it) and no process of its tree is found running.

use std::io;
use std::path::{Path, PathBuf};
use std::time::Duration;

use super::tree;

/// The lock a live run holds in its directory (`flock`, exclusive, for its whole life):
/// what tells a later run that the directory is not a dead run's, whatever the pid in its
/// name means in that run's pid namespace.
const RUN_LOCK_FILE: &str = "run.lock";

/// Names tried for a run's directory (`.0`, `.1`, ...).
const MAX_NAMES: u32 = 100;

/// What starts the name of the tree's directory inside the run's.
const TREE_DIR_PREFIX: &str = "tree-";

/// A run's directory, made by [`make`].
pub(super) struct RunDir {
    /// `$TMPDIR/uswap-run.PID.N`, removed whole when the run ends.
    pub run: PathBuf,
    /// The tree's directory inside it (`USWAP_STATS_DIR`).
    pub tree: PathBuf,
    /// The run's lock (see [`RUN_LOCK_FILE`]), held as long as this lives.
    pub lock: std::fs::File,
}

/// Whether the tree's processes may change user (this process is root): see the module's
/// comment.
pub(super) fn shared_with_other_users() -> bool {
    // SAFETY: geteuid has no failure mode and touches no memory.
    unsafe { libc::geteuid() == 0 }
}

/// Makes the run's directory and the tree's in it, with the run's lock taken.
pub(super) fn make() -> io::Result<RunDir> {
    use std::os::unix::fs::DirBuilderExt;
    let base = base_dir();
    remove_stale(&base);
    for i in 0..MAX_NAMES {
        let dir = base.join(format!("uswap-run.{}.{i}", std::process::id()));
        match std::fs::DirBuilder::new().mode(0o700).create(&dir) {
            Ok(()) => {
                // Writable by its owner whatever the umask (0277 made it 0500, and the run
                // failed with "Permission denied"); `fill` sets its final mode.
                use std::os::unix::fs::PermissionsExt;
                let made = std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700));
                return made.and_then(|()| fill(&dir)).inspect_err(|_| {
                    let _ = std::fs::remove_dir_all(&dir);
                });
            }
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => continue,
            Err(e) => return Err(e),
        }
    }
    Err(io::Error::other(format!("{MAX_NAMES} names taken")))
}

/// Where runs' directories go: `$TMPDIR` (or `/tmp`), but `/tmp` under root when every user
/// cannot reach `$TMPDIR` (see the module's comment).
fn base_dir() -> PathBuf {
    // Absolute and canonical: every process of the tree finds the directory by this name,
    // whatever its working directory (a relative `TMPDIR=tmp` named a different one in
    // each), and a later run finds a tree's processes by it (`remove_stale`). An empty
    // `TMPDIR` is no directory (as for mktemp).
    let temp = std::env::temp_dir();
    let temp = if temp.as_os_str().is_empty() { PathBuf::from("/tmp") } else { temp };
    let temp = std::fs::canonicalize(&temp).or_else(|_| std::path::absolute(&temp)).unwrap_or(temp);
    if !shared_with_other_users() || reachable_by_all(&temp) {
        return temp;
    }
    PathBuf::from("/tmp")
}

/// Whether every user may search `dir` and each directory above it.
fn reachable_by_all(dir: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    let Ok(dir) = std::fs::canonicalize(dir) else { return false };
    dir.ancestors().all(|d| std::fs::metadata(d).is_ok_and(|m| m.permissions().mode() & 0o001 != 0))
}

/// Takes the lock of the run's directory `run`, just made, and makes the tree's in it.
fn fill(run: &Path) -> io::Result<RunDir> {
    use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
    // 0600: a user who could open it could hold its lock after the run died.
    let lock = std::fs::OpenOptions::new().write(true).create_new(true).mode(0o600).open(run.join(RUN_LOCK_FILE))?;
    lock_file(&lock, false)?;
    let mut secret = [0u8; 16];
    getrandom::fill(&mut secret).map_err(io::Error::other)?;
    let name: String = secret.iter().map(|b| format!("{b:02x}")).collect();
    let tree = run.join(format!("{TREE_DIR_PREFIX}{name}"));
    std::fs::create_dir(&tree)?;
    // Set after making, whatever the umask.
    let (run_mode, tree_mode) = if shared_with_other_users() { (0o711, 0o1777) } else { (0o700, 0o700) };
    std::fs::set_permissions(&tree, std::fs::Permissions::from_mode(tree_mode))?;
    std::fs::set_permissions(run, std::fs::Permissions::from_mode(run_mode))?;
    Ok(RunDir { run: run.to_path_buf(), tree, lock })
}

/// The tree's directory inside the run's directory `run`, if it has one (a run of an older
/// uswap, or one being made this instant, may not).
fn tree_dir_of(run: &Path) -> Option<PathBuf> {
    std::fs::read_dir(run)
        .ok()?
        .flatten()
        .find(|e| e.file_name().to_string_lossy().starts_with(TREE_DIR_PREFIX))
        .map(|e| e.path())
}

/// Most entries of the temporary directory looked at for runs' directories left behind.
const MAX_TEMP_ENTRIES_SCANNED: usize = 1 << 16;

/// `flock` on `f`: exclusive, waiting or (`try_only`) not. Whether it was taken.
fn lock_file(f: &std::fs::File, try_only: bool) -> io::Result<bool> {
    use std::os::fd::AsRawFd;
    let op = libc::LOCK_EX | if try_only { libc::LOCK_NB } else { 0 };
    // SAFETY: flock on a descriptor this function borrows; no memory is passed.
    if unsafe { libc::flock(f.as_raw_fd(), op) } == 0 {
        return Ok(true);
    }
    let e = io::Error::last_os_error();
    if try_only && e.raw_os_error() == Some(libc::EWOULDBLOCK) {
        return Ok(false);
    }
    Err(e)
}

/// Age past which a free run lock is a dead run's: between its creation and its `flock` a
/// live run's lock is free for an instant.
const RUN_LOCK_SETTLE: Duration = Duration::from_secs(5);

/// Age past which a directory without a lock file (made by an older uswap, or being made
/// this instant by another run) may be a dead run's.
const UNLOCKED_DIR_AGE: Duration = Duration::from_secs(60);

/// Whether the file or directory `meta` describes was last modified over `age` ago.
fn older_than(meta: &std::fs::Metadata, age: Duration) -> bool {
    meta.modified().ok().and_then(|t| t.elapsed().ok()).is_some_and(|a| a > age)
}

/// Whether the run whose directory is `dir` (its `uswap run` was `pid` in its own pid
/// namespace) is dead: its lock is free and settled (see [`RUN_LOCK_FILE`]); without one,
/// the directory is older than [`UNLOCKED_DIR_AGE`] and `pid` is gone.
fn run_is_dead(dir: &Path, dir_meta: &std::fs::Metadata, pid: u32) -> bool {
    use std::os::unix::fs::OpenOptionsExt;
    // Not following a link, not blocking (a FIFO put there by a program of that run).
    let lock = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
        .open(dir.join(RUN_LOCK_FILE));
    match lock {
        // Held by the run for as long as it lives; released by the kernel when it dies.
        // A lock made an instant ago may not be taken yet: only an older one tells.
        Ok(f) => {
            f.metadata().is_ok_and(|m| m.is_file() && older_than(&m, RUN_LOCK_SETTLE))
                && lock_file(&f, true).unwrap_or(false)
        }
        Err(_) => older_than(dir_meta, UNLOCKED_DIR_AGE) && !tree::is_running(pid),
    }
}

/// Removes the directories of earlier runs that were killed before they could remove their
/// own (SIGKILL, a crash): `uswap-run.PID.N` of this user whose run is dead
/// ([`run_is_dead`]) and no process of whose tree still runs (found by the environment it
/// started with: one whose environment cannot be read is not seen).
fn remove_stale(base: &Path) {
    use std::os::unix::fs::MetadataExt;
    // SAFETY: getuid has no failure mode and touches no memory.
    let uid = unsafe { libc::getuid() };
    for entry in std::fs::read_dir(base).into_iter().flatten().flatten().take(MAX_TEMP_ENTRIES_SCANNED) {
        let name = entry.file_name().to_string_lossy().into_owned();
        let Some((pid, seq)) = name.strip_prefix("uswap-run.").and_then(|r| r.split_once('.')) else { continue };
        let (Ok(pid), Ok(_)) = (pid.parse::<u32>(), seq.parse::<u32>()) else { continue };
        let dir = entry.path();
        let Ok(meta) = std::fs::symlink_metadata(&dir) else { continue };
        if !meta.is_dir() || meta.uid() != uid || pid == std::process::id() {
            continue;
        }
        let tree_dir = tree_dir_of(&dir).unwrap_or_else(|| dir.clone());
        if run_is_dead(&dir, &meta, pid) && tree::running(&tree_dir, &[], 0).is_empty() {
            let _ = std::fs::remove_dir_all(&dir);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    /// Under root the tree's directory is shared but sticky and unlisted, the lock private;
    /// under another user everything is the user's alone.
    #[test]
    fn a_runs_directory_is_shared_only_as_far_as_a_tree_that_changes_user_needs() {
        let made = make().expect("the run's directory");
        let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o7777;
        assert!(made.tree.starts_with(&made.run), "{}", made.tree.display());
        let name = made.tree.file_name().unwrap().to_string_lossy().into_owned();
        assert_eq!(name.len(), TREE_DIR_PREFIX.len() + 32, "{name}");
        let expected = if shared_with_other_users() { (0o711, 0o1777) } else { (0o700, 0o700) };
        assert_eq!((mode(&made.run), mode(&made.tree)), expected);
        assert_eq!(mode(&made.run.join(RUN_LOCK_FILE)) & 0o077, 0, "the lock is the run's alone");
        std::fs::remove_dir_all(&made.run).unwrap();
    }
}
