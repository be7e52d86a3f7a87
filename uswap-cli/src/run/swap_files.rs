//! The named swap files of a run's file devices (`file:PATH`): their paths made absolute
//! before the tree gets the device list, the files the run makes before its program starts,
//! and their erasure (and removal, for those the run made) when it ends. Also the rewrite of
//! a device list's items that `run` uses for Redis sessions too (here, below `run`, so that
//! the import graph has no cycle: `uswap/tests/layers.rs`).

use super::dir;

/// The device list with each file device's relative path made absolute from the working
/// directory of `uswap run`: each process's pager resolved it from its own (a program that
/// changed directory before its first pager put its swap file elsewhere, and the run's end
/// neither erased nor removed it). Left as given where the working directory cannot be
/// written into the list (a `,` in it, or none).
pub(super) fn absolute_file_devices(devices: &str) -> String {
    let Some(cwd) = std::env::current_dir().ok().and_then(|d| d.to_str().map(str::to_string)) else {
        return devices.to_string();
    };
    if cwd.contains(',') {
        return devices.to_string();
    }
    rewrite_devices(devices, |t| {
        let rest = t.strip_prefix("file:").filter(|rest| !rest.starts_with('/') && !rest.is_empty())?;
        Some(format!("file:{}", std::path::Path::new(&cwd).join(rest).display()))
    })
}

/// The device list `devices` with each item (trimmed) that `rewrite` gives a new spelling
/// for replaced by it; the others stay as given.
pub(super) fn rewrite_devices(devices: &str, rewrite: impl Fn(&str) -> Option<String>) -> String {
    let items: Vec<String> =
        devices.split(',').map(|item| rewrite(item.trim()).unwrap_or_else(|| item.to_string())).collect();
    items.join(",")
}

/// A named swap file that did not exist when the run began: removed when the run ends.
/// `dev_ino`: the file the run made, removed (and erased) only while the path still names
/// it; `None` under root, where the first pager makes it (below).
pub(super) struct CreatedSwapFile {
    path: std::path::PathBuf,
    dev_ino: Option<(u64, u64)>,
}

/// The named swap files of the run's devices that do not exist yet. The run makes each one
/// itself, empty and exactly 0600, before the program starts (the pager that opens one takes
/// it as it is, and grows it), so that it removes only the files it made when it ends
/// (`erase_swap_files`), as it found the directory: the run left an emptied file of half the
/// RAM's apparent size behind. Under root the first pager makes it, as before: a tree whose
/// processes change user (`runuser`) must be able to make it theirs.
pub(super) fn swap_files_to_create(device: &str, limit_bytes: u64) -> Vec<CreatedSwapFile> {
    use std::os::unix::fs::{MetadataExt, OpenOptionsExt, PermissionsExt};
    let Ok(list) = uswap::DeviceConfig::parse_list(device, limit_bytes) else { return Vec::new() };
    let mut created = Vec::new();
    for path in list.iter().filter_map(uswap::DeviceConfig::file_path) {
        if std::fs::symlink_metadata(path).is_ok() {
            continue;
        }
        if dir::shared_with_other_users() {
            created.push(CreatedSwapFile { path: path.to_path_buf(), dev_ino: None });
            continue;
        }
        let mut opts = std::fs::OpenOptions::new();
        opts.write(true).create_new(true).mode(0o600).custom_flags(libc::O_NOFOLLOW);
        // Exactly 0600 whatever the umask (the device refuses other modes).
        let made = opts.open(path).and_then(|f| {
            f.set_permissions(std::fs::Permissions::from_mode(0o600))?;
            f.metadata()
        });
        // Not made (it cannot be): the pager says what it finds.
        if let Ok(meta) = made {
            created.push(CreatedSwapFile { path: path.to_path_buf(), dev_ino: Some((meta.dev(), meta.ino())) });
        }
    }
    created
}

/// Removes the swap files the run made, where the run ends before its program ran.
pub(super) fn remove_made_swap_files(created: &[CreatedSwapFile]) {
    for c in created.iter().filter(|c| c.dev_ino.is_some() && names_file(c)) {
        let _ = std::fs::remove_file(&c.path);
    }
}

/// Whether `c`'s path names a regular file, the one the run made if it made one.
fn names_file(c: &CreatedSwapFile) -> bool {
    use std::os::unix::fs::MetadataExt;
    std::fs::symlink_metadata(&c.path)
        .is_ok_and(|m| m.is_file() && c.dev_ino.is_none_or(|dev_ino| (m.dev(), m.ino()) == dev_ino))
}

/// Empties the named swap files of the run's devices, which its processes left full of
/// their swapped-out memory (a process's pager is not dropped at exit: the kernel takes
/// its memory, and a file keeps what was written), and removes those that did not exist
/// when the run began (`created`). A file the run made whose path names another file now is
/// left alone. Said when a file could not be erased or removed.
pub(super) fn erase_swap_files(device: &str, limit_bytes: u64, created: &[CreatedSwapFile]) {
    let Ok(list) = uswap::DeviceConfig::parse_list(device, limit_bytes) else { return };
    for d in &list {
        let made = d.file_path().and_then(|p| created.iter().find(|c| c.path == p));
        if made.is_some_and(|c| !names_file(c)) {
            continue;
        }
        let Some((path, what)) = d.erase_after_exit() else { continue };
        if matches!(what, Ok(uswap::backend::file::Erased::Yes)) && made.is_some() {
            if let Err(e) = std::fs::remove_file(&path) {
                say!("uswap run: could not remove swap file {}, which the run created: {e}", path.display());
            }
        }
        match what {
            Ok(uswap::backend::file::Erased::InUse) => say!(
                "uswap run: swap file {} is still in use (a process of the program outlives it): not erased; it \
                 holds swapped-out memory until that process ends, then delete it (or empty it, \
                 `truncate -s 0`, to use it again: uswap refuses a file that holds data)",
                path.display()
            ),
            Err(e) => say!(
                "uswap run: could not erase swap file {}: {e}; it may hold swapped-out memory: delete it",
                path.display()
            ),
            Ok(_) => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::absolute_file_devices;

    #[test]
    fn file_devices_get_absolute_paths_and_others_stay() {
        let cwd = std::env::current_dir().unwrap();
        let cwd = cwd.to_str().unwrap();
        assert_eq!(
            absolute_file_devices("zpool:64MiB,file:swap:1GiB,file:/var/tmp,redis://h:1"),
            format!("zpool:64MiB,file:{cwd}/swap:1GiB,file:/var/tmp,redis://h:1")
        );
        assert_eq!(absolute_file_devices("zpool"), "zpool");
        assert_eq!(absolute_file_devices("file:"), "file:", "an empty path is the parser's to refuse");
    }
}
