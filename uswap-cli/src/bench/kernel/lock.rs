//! The machine-wide lock of the kernel engines (`flock` on `/run/lock/uswap-bench.lock`), so
//! that two runs never fight over zram0 and the system's swap, and the record kept in it of
//! what the holder has set up. A run killed too hard to clean up (SIGKILL, a crash) leaves
//! its record behind; the next run that takes the lock undoes what it lists.

use std::fs::File;
use std::io::{Read, Seek, SeekFrom, Write};
use std::os::fd::AsRawFd;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::bench::error::BenchError;
use crate::bench::interrupt;

pub const LOCK_PATH: &str = "/run/lock/uswap-bench.lock";

/// What the holder of the lock has changed on the machine.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Record {
    pub pid: u32,
    /// zram0 was configured (and maybe swapped on).
    #[serde(default)]
    pub zram: bool,
    #[serde(default)]
    pub swap_file: Option<PathBuf>,
    #[serde(default)]
    pub cgroup: Option<PathBuf>,
    /// The memory controller was enabled in this cgroup v2 `cgroup.subtree_control` by us.
    #[serde(default)]
    pub enabled_memory_in: Option<PathBuf>,
}

impl Record {
    pub fn is_empty(&self) -> bool {
        !self.zram && self.swap_file.is_none() && self.cgroup.is_none() && self.enabled_memory_in.is_none()
    }
}

/// The lock, held until dropped (the kernel releases it if the process dies).
#[derive(Debug)]
pub struct BenchLock {
    file: File,
    path: PathBuf,
    record: Record,
}

impl BenchLock {
    /// Takes the lock at [`LOCK_PATH`]; with `wait`, waits for the holder (interruptibly).
    /// Returns the lock and the record a dead holder left behind, if any.
    pub fn acquire(wait: bool) -> Result<(BenchLock, Option<Record>), BenchError> {
        BenchLock::acquire_at(Path::new(LOCK_PATH), wait)
    }

    pub fn acquire_at(path: &Path, wait: bool) -> Result<(BenchLock, Option<Record>), BenchError> {
        let lock_err = |source| BenchError::Lock { path: path.to_path_buf(), source };
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir).map_err(lock_err)?;
        }
        let mut file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .mode(0o644)
            .open(path)
            .map_err(lock_err)?;
        let mut told = false;
        loop {
            // SAFETY: flock on a descriptor we own.
            if unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } == 0 {
                break;
            }
            let e = std::io::Error::last_os_error();
            if e.raw_os_error() != Some(libc::EWOULDBLOCK) {
                return Err(lock_err(e));
            }
            let holder = match read_record(&mut file) {
                Some(r) => format!("pid {}", r.pid),
                None => "pid unknown".to_string(),
            };
            if !wait {
                return Err(BenchError::LockHeld { path: path.to_path_buf(), holder });
            }
            if !told {
                eprintln!("uswap bench: another uswap bench holds {} ({holder}); waiting for it", path.display());
                told = true;
            }
            if interrupt::interrupted() {
                return Err(BenchError::Interrupted);
            }
            std::thread::sleep(Duration::from_millis(200));
        }
        let left = read_record(&mut file).filter(|r| !r.is_empty() && r.pid != std::process::id());
        let mut lock = BenchLock { file, path: path.to_path_buf(), record: Record::default() };
        // Keep the dead holder's record until its leftovers are gone.
        lock.record = left.clone().unwrap_or_default();
        lock.record.pid = std::process::id();
        lock.save()?;
        Ok((lock, left))
    }

    pub fn record(&self) -> &Record {
        &self.record
    }

    /// Changes the record and writes it down before the change is made on the machine.
    pub fn update(&mut self, f: impl FnOnce(&mut Record)) -> Result<(), BenchError> {
        f(&mut self.record);
        self.save()
    }

    fn save(&mut self) -> Result<(), BenchError> {
        let text = serde_json::to_string(&self.record).expect("plain data serialises");
        let r = self
            .file
            .set_len(0)
            .and_then(|_| self.file.seek(SeekFrom::Start(0)))
            .and_then(|_| self.file.write_all(text.as_bytes()))
            .and_then(|_| self.file.flush());
        r.map_err(|source| BenchError::Lock { path: self.path.clone(), source })
    }
}

impl Drop for BenchLock {
    fn drop(&mut self) {
        if self.record.is_empty() {
            let _ = self.file.set_len(0);
        }
        // Closing the file releases the lock.
    }
}

fn read_record(file: &mut File) -> Option<Record> {
    let mut s = String::new();
    file.seek(SeekFrom::Start(0)).ok()?;
    file.read_to_string(&mut s).ok()?;
    serde_json::from_str(&s).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn second_holder_is_refused_and_a_dead_holders_record_is_handed_over() {
        let dir = std::env::temp_dir().join(format!("uswap-lock-test-{}", std::process::id()));
        let path = dir.join("bench.lock");
        let (mut lock, left) = BenchLock::acquire_at(&path, false).unwrap();
        assert_eq!(left, None);
        lock.update(|r| r.zram = true).unwrap();
        // A second open file description conflicts, even in the same process.
        let err = BenchLock::acquire_at(&path, false).unwrap_err().to_string();
        assert!(
            err.contains("another uswap bench holds") && err.contains(&format!("pid {}", std::process::id())),
            "{err}"
        );
        drop(lock);
        // Pretend a dead process left a record.
        let dead = Record { pid: 999_999_999, zram: true, cgroup: Some("/x".into()), ..Default::default() };
        std::fs::write(&path, serde_json::to_string(&dead).unwrap()).unwrap();
        let (mut lock, left) = BenchLock::acquire_at(&path, false).unwrap();
        assert_eq!(left, Some(dead));
        assert!(lock.record().zram, "kept until cleaned");
        lock.update(|r| *r = Record { pid: r.pid, ..Default::default() }).unwrap();
        drop(lock);
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "", "a clean holder leaves an empty lock file");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
