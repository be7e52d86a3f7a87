//! Records the compiler version for `uswap report`'s machine description, and links GCC's
//! unwinder into the command (as into the preloaded libraries): `libgcc_s`'s constructor,
//! a dozen `cpuid`s that each trap to the hypervisor in a virtual machine, was a sixth of
//! `uswap run -- true`'s own time.

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
    link_unwinder_statically("uswap-cli/build.rs", "link-arg-bins");
    println!("cargo:rerun-if-changed=../uswap-preload/unwinder.rs");
}

// The preload library's (uswap-preload/build.rs).
include!("../uswap-preload/unwinder.rs");
