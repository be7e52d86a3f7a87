//! `include/uswap.h` is what cbindgen makes of the crate's source today. The header is
//! checked in so that C users need no Rust tool to read it; this test keeps it honest.
//!
//! Regenerate: `uswap-capi/gen-header.sh` (which runs this test with
//! `USWAP_REGENERATE_HEADER=1`: it then writes the header instead of comparing).

use std::path::{Path, PathBuf};

const REGENERATE: &str = "uswap-capi/gen-header.sh";

fn crate_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// The header as cbindgen generates it from `src/lib.rs` (following its modules) and
/// `cbindgen.toml`.
fn generated() -> String {
    let dir = crate_dir();
    let config = cbindgen::Config::from_file(dir.join("cbindgen.toml"))
        .unwrap_or_else(|e| panic!("reading {}: {e}", dir.join("cbindgen.toml").display()));
    // with_src, not with_crate: with_crate runs `cargo metadata`, a cargo inside cargo test.
    let bindings = cbindgen::Builder::new()
        .with_config(config)
        .with_src(dir.join("src/lib.rs"))
        .generate()
        .unwrap_or_else(|e| panic!("cbindgen could not generate the header: {e}"));
    let mut out = Vec::new();
    bindings.write(&mut out);
    String::from_utf8(out).expect("cbindgen writes UTF-8")
}

fn first_difference(a: &str, b: &str) -> String {
    for (i, (x, y)) in a.lines().zip(b.lines()).enumerate() {
        if x != y {
            return format!("line {}:\n  checked in: {x}\n  generated:  {y}", i + 1);
        }
    }
    format!("one is a prefix of the other ({} lines checked in, {} generated)", a.lines().count(), b.lines().count())
}

#[test]
fn header_is_current() {
    let path: PathBuf = crate_dir().join("include/uswap.h");
    let fresh = generated();
    if std::env::var_os("USWAP_REGENERATE_HEADER").is_some() {
        std::fs::write(&path, &fresh).unwrap_or_else(|e| panic!("writing {}: {e}", path.display()));
        eprintln!("wrote {}", path.display());
        return;
    }
    let checked_in = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("reading {}: {e}; generate it with {REGENERATE}", path.display()));
    assert!(
        checked_in == fresh,
        "{} is out of date with the Rust source ({}).\nRegenerate it with {REGENERATE} and commit it.",
        Path::new("uswap-capi/include/uswap.h").display(),
        first_difference(&checked_in, &fresh)
    );
}

#[test]
fn header_declares_every_exported_function() {
    let header = generated();
    let source = std::fs::read_to_string(crate_dir().join("src/lib.rs")).expect("reading src/lib.rs");
    let exported: Vec<&str> =
        source.split("#[no_mangle]").skip(1).filter_map(|rest| rest.split("fn ").nth(1)?.split('(').next()).collect();
    assert!(exported.len() >= 17, "found only {exported:?}");
    for name in exported {
        // A declaration line, not a mention in a comment.
        let declared = header.lines().any(|l| {
            let l = l.trim_start();
            !l.starts_with('*') && !l.starts_with("/*") && l.contains(&format!("{name}("))
        });
        assert!(declared, "{name} is exported but not declared in the header");
    }
}
