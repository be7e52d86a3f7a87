// The unwinder, linked into what every run or every exec of a run loads: included by
// uswap-preload/build.rs, uswap-shim/build.rs (the libraries) and uswap-cli/build.rs (the
// command).

/// Links GCC's unwinder (`libgcc_eh.a`) into the library instead of loading `libgcc_s.so`
/// beside it: every process of a run loads the library at `execve`, and `libgcc_s`'s
/// constructor alone (`__cpu_indicator_init`, a dozen `cpuid` instructions, each a trap to
/// the hypervisor in a virtual machine: 6 µs apiece measured) cost more than the rest of the
/// load of a C library. The Rust runtime asks for `-lgcc_s` by name; a linker script of that
/// name, found first, gives the static archive (as `gcc -static-libgcc` does for C).
/// `link_arg`: the cargo instruction's kind for the artifact linked, `cdylib-link-arg` for a
/// library, `link-arg-bins` for a command.
fn link_unwinder_statically(what: &str, link_arg: &str) {
    println!("cargo:rerun-if-env-changed=RUSTC_LINKER");
    let Some(archive) = libgcc_eh() else {
        println!("cargo:warning=libgcc_eh.a not found: {what}: libgcc_s.so is loaded at each start");
        return;
    };
    // A GCC upgrade moves the archive: the script below names it.
    println!("cargo:rerun-if-changed={}", archive.display());
    let out_dir = std::path::PathBuf::from(std::env::var_os("OUT_DIR").expect("cargo sets OUT_DIR"));
    let script =
        format!("/* {what}: the unwinder, linked statically */\nINPUT(\"{}\")\n", archive.display());
    std::fs::write(out_dir.join("libgcc_s.so"), script).expect("write the linker script into OUT_DIR");
    // For the library's own link only (GNU ld applies every -L to every -l, wherever given).
    println!("cargo:rustc-{link_arg}=-L{}", out_dir.display());
    println!("cargo:rustc-{link_arg}=-static-libgcc");
}

/// Where the C compiler that links the library (rustc's linker: `RUSTC_LINKER` if cargo
/// was given one, else `cc`) has `libgcc_eh.a`; only for a native GNU/Linux build (a cross
/// build's linker is another compiler, and its archive another target's).
fn libgcc_eh() -> Option<std::path::PathBuf> {
    let var = |name: &str| std::env::var(name).ok();
    let native = var("TARGET").is_some() && var("TARGET") == var("HOST");
    if !native || var("CARGO_CFG_TARGET_OS")? != "linux" || var("CARGO_CFG_TARGET_ENV")? != "gnu" {
        return None;
    }
    let linker = var("RUSTC_LINKER").unwrap_or_else(|| "cc".into());
    let out = std::process::Command::new(linker).arg("-print-file-name=libgcc_eh.a").output().ok()?;
    let path = std::path::PathBuf::from(String::from_utf8(out.stdout).ok()?.trim());
    (path.is_absolute() && path.exists()).then_some(path)
}
