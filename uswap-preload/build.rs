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
    // Only where the C compiler that links (rustc's default linker, `cc`) has the archive;
    // elsewhere the library loads `libgcc_s` as any Rust library does.
    let archive = std::process::Command::new("cc")
        .arg("-print-file-name=libgcc_eh.a")
        .output()
        .ok()
        .and_then(|o| String::from_utf8(o.stdout).ok())
        .map(|s| std::path::PathBuf::from(s.trim()))
        .filter(|p| p.is_absolute() && p.exists());
    let Some(archive) = archive else {
        println!("cargo:warning=libgcc_eh.a not found by `cc`: the preload library loads libgcc_s.so at each exec");
        return;
    };
    let out_dir = std::path::PathBuf::from(std::env::var_os("OUT_DIR").expect("cargo sets OUT_DIR"));
    let script =
        format!("/* uswap-preload/build.rs: the unwinder, linked statically */\nINPUT({})\n", archive.display());
    std::fs::write(out_dir.join("libgcc_s.so"), script).expect("write the linker script into OUT_DIR");
    // For the library's own link only (GNU ld applies every -L to every -l, wherever given).
    println!("cargo:rustc-cdylib-link-arg=-L{}", out_dir.display());
    println!("cargo:rustc-cdylib-link-arg=-static-libgcc");
}
