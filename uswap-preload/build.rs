//! Links the preloaded library so that the code inside it (mimalloc, the engine, the Rust
//! runtime) maps memory with the system call itself, not through the library's own `mmap`
//! (`src/mmap.rs`), which is the program's: mimalloc maps its page map and its metadata
//! from the program's threads (in its constructor, under its page-map lock), and those
//! mappings are the allocator's own, never managed memory, nor a reason to start a pager;
//! and with GCC's unwinder inside it (`link_unwinder_statically`), so that the library
//! needs no shared library but the C library's.
fn main() {
    println!("cargo:rustc-cdylib-link-arg=-Wl,--wrap=mmap");
    link_unwinder_statically("uswap-preload/build.rs", "cdylib-link-arg");
    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo:rerun-if-changed=unwinder.rs");
}

// Shared with the first stage's build (uswap-shim/build.rs).
include!("unwinder.rs");
