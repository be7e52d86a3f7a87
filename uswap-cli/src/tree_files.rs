//! What the processes of a `uswap run` tree leave in its directory, read by `uswap run` and
//! `uswap stat`: a directory that processes of the tree which changed user may write into,
//! so a file there is read only if regular (no link followed, no FIFO waited on) and up to a
//! bound, and a note left as a symbolic link (by a process out of descriptors) is read by
//! its target.

use std::path::Path;

/// A note's text: a regular file's ([`read_tree_file`]), or the target of the symbolic link
/// that a process out of descriptors leaves instead (the preload's `report::link_note`),
/// read with `readlink`: nothing followed.
pub(crate) fn read_note(path: &Path) -> std::io::Result<String> {
    match std::fs::symlink_metadata(path)?.file_type().is_symlink() {
        true => Ok(std::fs::read_link(path)?.to_string_lossy().into_owned()),
        false => read_tree_file(path),
    }
}

/// Most bytes read of a record or a note: far above a real one (a record is a few KiB).
const MAX_FILE_BYTES: u64 = 1 << 20;

/// The text of a record or note in the tree's directory, which processes of the tree that
/// changed user may write into (see `run/dir.rs`): a regular file only (no link followed, no
/// FIFO waited on), read up to [`MAX_FILE_BYTES`].
pub(crate) fn read_tree_file(path: &Path) -> std::io::Result<String> {
    use std::io::Read;
    use std::os::unix::fs::OpenOptionsExt;
    let f = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_CLOEXEC)
        .open(path)?;
    if !f.metadata()?.is_file() {
        return Err(std::io::Error::new(std::io::ErrorKind::InvalidData, "not a regular file"));
    }
    let mut text = String::new();
    f.take(MAX_FILE_BYTES).read_to_string(&mut text)?;
    Ok(text)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What a process of the tree that changed user may put in the tree's directory is
    /// read only as a regular file: a link to another file is not followed, a FIFO not
    /// waited on.
    #[test]
    fn files_of_the_trees_directory_are_read_only_when_regular() {
        let dir = std::env::temp_dir().join(format!("uswap-tree-file-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let plain = dir.join("1.json");
        std::fs::write(&plain, "{}").unwrap();
        assert_eq!(read_tree_file(&plain).unwrap(), "{}");
        let link = dir.join("2.json");
        std::os::unix::fs::symlink(&plain, &link).unwrap();
        assert!(read_tree_file(&link).is_err(), "a link was followed");
        let fifo = dir.join("3.json");
        let c = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
        // SAFETY: mkfifo with a NUL-terminated path.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
        assert!(read_tree_file(&fifo).is_err(), "a FIFO was read");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
