//! Links the preloaded library so that the code inside it (mimalloc, the engine, the Rust
//! runtime) maps memory with the system call itself, not through the library's own `mmap`
//! (`src/mmap.rs`), which is the program's: mimalloc maps its page map and its metadata
//! from the program's threads (in its constructor, under its page-map lock), and those
//! mappings are the allocator's own, never managed memory, nor a reason to start a pager;
//! and with GCC's unwinder inside it (`link_unwinder_statically`), so that the library
//! needs no shared library but the C library's.
fn main() {
    println!("cargo:rustc-cdylib-link-arg=-Wl,--wrap=mmap");
    link_unwinder_statically();
    println!("cargo:rerun-if-changed=build.rs");
}

/// Links GCC's unwinder (`libgcc_eh.a`) into the library instead of loading `libgcc_s.so`
/// beside it: every process of a run loads the library at `execve`, and `libgcc_s`'s
/// constructor alone (`__cpu_indicator_init`, a dozen `cpuid` instructions, each a trap to
/// the hypervisor in a virtual machine: 6 µs apiece measured) cost more than the rest of the
/// load of a C library. The Rust runtime asks for `-lgcc_s` by name; a linker script of that
/// name, found first, gives the static archive (as `gcc -static-libgcc` does for C).
fn link_unwinder_statically() {
    println!("cargo:rerun-if-env-changed=RUSTC_LINKER");
    let Some(archive) = libgcc_eh() else {
        println!("cargo:warning=libgcc_eh.a not found: the preload library loads libgcc_s.so at each exec");
        return;
    };
    // A GCC upgrade moves the archive: the script below names it.
    println!("cargo:rerun-if-changed={}", archive.display());
    let out_dir = std::path::PathBuf::from(std::env::var_os("OUT_DIR").expect("cargo sets OUT_DIR"));
    let script =
        format!("/* uswap-preload/build.rs: the unwinder, linked statically */\nINPUT(\"{}\")\n", archive.display());
    std::fs::write(out_dir.join("libgcc_s.so"), script).expect("write the linker script into OUT_DIR");
    // For the library's own link only (GNU ld applies every -L to every -l, wherever given).
    println!("cargo:rustc-cdylib-link-arg=-L{}", out_dir.display());
    println!("cargo:rustc-cdylib-link-arg=-static-libgcc");
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
