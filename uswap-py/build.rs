//! Puts the `uswap` command and its two preloaded libraries into the Python package
//! (`python/uswap/_bin/`), so that a wheel runs `python -m uswap run -- PROGRAM` with no
//! Rust checkout beside it (`uswap/__main__.py` starts the command found there, which finds
//! the libraries next to itself).
//!
//! Only when maturin builds the package (it sets `PYO3_BUILD_EXTENSION_MODULE`): a plain
//! `cargo build --workspace` builds both anyway, in its own target directory, and must not
//! pay for a second build. The command and the library are built by a second cargo, into a
//! target directory of their own (the outer cargo holds its own), with the outer build's
//! profile.

use std::path::{Path, PathBuf};
use std::process::Command;

fn main() {
    println!("cargo:rerun-if-env-changed=PYO3_BUILD_EXTENSION_MODULE");
    if std::env::var_os("PYO3_BUILD_EXTENSION_MODULE").is_none() {
        return;
    }
    let manifest_dir = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR").expect("cargo sets CARGO_MANIFEST_DIR"));
    let root = manifest_dir.parent().expect("uswap-py lies in the workspace").to_path_buf();
    for dir in ["uswap/src", "uswap-cli/src", "uswap-preload/src", "uswap-shim/src", "uswap-escape/src", "Cargo.lock"] {
        println!("cargo:rerun-if-changed={}", root.join(dir).display());
    }
    let out_dir = PathBuf::from(std::env::var("OUT_DIR").expect("cargo sets OUT_DIR"));
    let target_dir = out_dir.join("tools");
    let release = std::env::var("PROFILE").is_ok_and(|p| p == "release");
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let mut cmd = Command::new(cargo);
    cmd.current_dir(&root)
        .args(["build", "--locked", "-p", "uswap-cli", "-p", "uswap-preload", "-p", "uswap-shim", "--target-dir"])
        .arg(&target_dir)
        // Flags meant for the extension module (maturin's) are not the command's.
        .env_remove("CARGO_ENCODED_RUSTFLAGS")
        .env_remove("RUSTFLAGS")
        .env_remove("CARGO_TARGET_DIR");
    if release {
        cmd.arg("--release");
    }
    let status = cmd.status().unwrap_or_else(|e| panic!("cannot run cargo to build the uswap command: {e}"));
    assert!(status.success(), "building the uswap command and its preload library failed ({status})");
    let built = target_dir.join(if release { "release" } else { "debug" });
    let bin = manifest_dir.join("python/uswap/_bin");
    std::fs::create_dir_all(&bin).unwrap_or_else(|e| panic!("cannot create {}: {e}", bin.display()));
    for name in ["uswap", "libuswap_preload.so", "libuswap_shim.so"] {
        copy(&built.join(name), &bin.join(name));
    }
}

/// Copies `from` to `to` through a temporary name, so that a `uswap` running from the
/// package is never overwritten in place (a busy executable cannot be written).
fn copy(from: &Path, to: &Path) {
    let tmp = to.with_extension("new");
    std::fs::copy(from, &tmp).unwrap_or_else(|e| panic!("cannot copy {} to {}: {e}", from.display(), tmp.display()));
    std::fs::rename(&tmp, to).unwrap_or_else(|e| panic!("cannot rename {} to {}: {e}", tmp.display(), to.display()));
}
