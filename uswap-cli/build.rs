//! Records the compiler version for `uswap report`'s machine description.

fn main() {
    let rustc = std::env::var("RUSTC").unwrap_or_else(|_| "rustc".into());
    let version = std::process::Command::new(rustc)
        .arg("--version")
        .output()
        .ok()
        .and_then(|o| String::from_utf8(o.stdout).ok())
        .map(|s| s.trim().to_string())
        .unwrap_or_else(|| "unknown".into());
    println!("cargo:rustc-env=USWAP_RUSTC_VERSION={version}");
    println!("cargo:rerun-if-env-changed=RUSTC");
}
