//! Links the preloaded library so that the code inside it (mimalloc, the engine, the Rust
//! runtime) maps memory with the system call itself, not through the library's own `mmap`
//! (`src/mmap.rs`), which is the program's: mimalloc maps its page map and its metadata
//! from the program's threads (in its constructor, under its page-map lock), and those
//! mappings are the allocator's own, never managed memory, nor a reason to start a pager.
fn main() {
    println!("cargo:rustc-cdylib-link-arg=-Wl,--wrap=mmap");
    println!("cargo:rerun-if-changed=build.rs");
}
