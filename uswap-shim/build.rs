//! Generates the first stage's exported entry points (`stubs.rs` in `OUT_DIR`) and their
//! names and indices (`names.rs`) from [`SYMBOLS`], and links GCC's unwinder statically, as
//! the preload library does.
//!
//! Each entry point is an indirect jump through a slot of its own (`uswap_shim_slots`). A
//! slot starts at the entry point's watch stub, which saves the argument registers, asks a
//! Rust function what to do (`src/watch.rs`: serve the call itself, or a function to jump to
//! with the arguments as they came), and restores them before the jump; once the preload
//! library is loaded, every slot holds its function of the same name. A jump keeps the
//! caller's return address and stack arguments as they were: `dlopen` reads the former to
//! find its caller's namespace, `clone` and `syscall` take the latter.

/// How an entry point behaves before the preload library is loaded.
#[derive(Clone, Copy, PartialEq)]
enum Kind {
    /// Passed on to the C library's function (the preload library does nothing with it while
    /// a process has no pager): the slot is set to it on first use.
    Forward,
    /// Loads the preload library, then jumps to its function: what the call does needs the
    /// engine (a thread, the program's own break, `mlockall`, a coroutine's stack).
    Load,
    /// Asks `watch::<name>` (the watch list below).
    Watch,
}

const SYMBOLS: &[(&str, Kind)] = {
    use Kind::*;
    &[
        ("_Exit", Forward),
        ("_exit", Forward),
        ("_Fork", Forward),
        ("__sigaction", Forward),
        ("__sysv_signal", Forward),
        ("bsd_signal", Forward),
        ("close", Forward),
        ("close_range", Forward),
        ("closefrom", Forward),
        ("dup2", Forward),
        ("dup3", Forward),
        ("duplocale", Forward),
        ("getrlimit", Forward),
        ("getrlimit64", Forward),
        ("madvise", Forward),
        ("mlock", Forward),
        ("mlock2", Forward),
        ("mprotect", Forward),
        ("mremap", Forward),
        ("munlock", Forward),
        ("munlockall", Forward),
        ("munmap", Forward),
        ("newlocale", Forward),
        ("pkey_mprotect", Forward),
        ("process_vm_readv", Forward),
        ("process_vm_writev", Forward),
        ("pthread_exit", Forward),
        ("pthread_sigmask", Forward),
        ("setlocale", Forward),
        ("sigaction", Forward),
        ("sigignore", Forward),
        ("signal", Forward),
        ("sigprocmask", Forward),
        ("sigset", Forward),
        ("ssignal", Forward),
        ("sysv_signal", Forward),
        ("brk", Load),
        ("makecontext", Load),
        ("mlockall", Load),
        ("pthread_create", Load),
        ("sbrk", Load),
        ("uswap_run_library", Load),
        ("__libc_calloc", Watch),
        ("__libc_free", Watch),
        ("__libc_malloc", Watch),
        ("__libc_memalign", Watch),
        ("__libc_pvalloc", Watch),
        ("__libc_realloc", Watch),
        ("__libc_valloc", Watch),
        ("aligned_alloc", Watch),
        ("calloc", Watch),
        ("cfree", Watch),
        ("clone", Watch),
        ("dlopen", Watch),
        ("execv", Watch),
        ("execve", Watch),
        ("execvp", Watch),
        ("execvpe", Watch),
        ("free", Watch),
        ("ioctl", Watch),
        ("malloc", Watch),
        ("malloc_usable_size", Watch),
        ("memalign", Watch),
        ("mmap", Watch),
        ("mmap64", Watch),
        ("posix_memalign", Watch),
        ("posix_spawn", Watch),
        ("posix_spawnp", Watch),
        ("prctl", Watch),
        ("prlimit", Watch),
        ("prlimit64", Watch),
        ("pvalloc", Watch),
        ("realloc", Watch),
        ("reallocarray", Watch),
        ("setrlimit", Watch),
        ("setrlimit64", Watch),
        ("syscall", Watch),
        ("valloc", Watch),
    ]
};

fn main() {
    let mut asm = String::new();
    let mut operands = String::new();
    let mut rust = String::new();
    let mut names = String::new();
    for (i, (name, kind)) in SYMBOLS.iter().enumerate() {
        let watcher = match kind {
            Kind::Forward => format!("forward_{i}"),
            Kind::Load => format!("load_{i}"),
            Kind::Watch => format!("watch_{name}"),
        };
        // Exported from Rust (a naked function): rustc's version script hides every other
        // global of the library.
        rust += &format!(
            "#[no_mangle]\n#[unsafe(naked)]\npub unsafe extern \"C\" fn {name}() {{\n    \
             std::arch::naked_asm!(\"jmp qword ptr [rip + uswap_shim_slots + {off}]\")\n}}\n",
            off = 8 * i
        );
        asm += &format!(
            "    .p2align 4\nuswap_shim_watch_{i}:\n    push rax\n    push rdi\n    push rsi\n    \
             push rdx\n    push rcx\n    push r8\n    push r9\n    call {{w{i}}}\n    test rdx, rdx\n    \
             jnz 2f\n    add rsp, 56\n    ret\n2:\n    mov r11, rdx\n    pop r9\n    pop r8\n    pop rcx\n    \
             pop rdx\n    pop rsi\n    pop rdi\n    pop rax\n    jmp r11\n\n"
        );
        operands += &format!("    w{i} = sym {watcher},\n");
        match kind {
            Kind::Forward => {
                rust += &format!("extern \"C\" fn forward_{i}() -> Decision {{\n    crate::watch::forward({i})\n}}\n")
            }
            Kind::Load => {
                rust += &format!("extern \"C\" fn load_{i}() -> Decision {{\n    crate::watch::load_then({i})\n}}\n")
            }
            Kind::Watch => rust += &format!("use crate::watch::{name} as watch_{name};\n"),
        }
        names += &format!("#[allow(non_upper_case_globals, dead_code)]\npub const I_{name}: usize = {i};\n");
    }
    asm += "    .pushsection .data.rel.local.uswap_shim_slots,\"aw\",@progbits\n    .p2align 3\n    \
            .globl uswap_shim_slots\n    .hidden uswap_shim_slots\nuswap_shim_slots:\n";
    for i in 0..SYMBOLS.len() {
        asm += &format!("    .quad uswap_shim_watch_{i}\n");
    }
    asm += "    .popsection\n";
    let name_list: Vec<String> = SYMBOLS.iter().map(|(n, _)| format!("c\"{n}\"")).collect();
    let stubs = format!(
        "// Generated by build.rs from its SYMBOLS.\n\nuse crate::watch::Decision;\n\n{rust}\n\
         std::arch::global_asm!(\n    r#\"\n{asm}\"#,\n{operands});\n"
    );
    let names = format!(
        "// Generated by build.rs from its SYMBOLS.\n\n{names}\n\
         /// The entry points' names, by index.\npub const NAMES: [&std::ffi::CStr; {n}] = [{list}];\n",
        n = SYMBOLS.len(),
        list = name_list.join(", "),
    );
    let out_dir = std::path::PathBuf::from(std::env::var_os("OUT_DIR").expect("cargo sets OUT_DIR"));
    std::fs::write(out_dir.join("stubs.rs"), stubs).expect("write stubs.rs into OUT_DIR");
    std::fs::write(out_dir.join("names.rs"), names).expect("write names.rs into OUT_DIR");
    link_unwinder_statically("uswap-shim/build.rs", "cdylib-link-arg");
    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo:rerun-if-changed=../uswap-preload/unwinder.rs");
}

// The preload library's (uswap-preload/build.rs).
include!("../uswap-preload/unwinder.rs");
