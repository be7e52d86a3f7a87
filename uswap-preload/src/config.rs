//! The environment `uswap run` passes to the library (a user may also set it by hand with
//! `LD_PRELOAD`). Every variable is optional; bad values stop the program with a message
//! naming the variable rather than run it with a budget it did not ask for.
//!
//! | variable | meaning | default |
//! |---|---|---|
//! | `USWAP_LIMIT` | resident limit, a size (`512MiB`) | 1 GiB |
//! | `USWAP_DEVICE` | device list, as `uswap bench --device` | `zpool` of half the RAM |
//! | `USWAP_FAULT_MODE` | `auto`, `thread` or `signal` (see [`resolve_auto`]) | `thread` |
//! | `USWAP_MIN_SIZE` | smallest `mmap` managed | 16 KiB ([`DEFAULT_MIN_SIZE_BYTES`]) |
//! | `USWAP_STATS_DIR` | where each process writes its final counters | none |
//! | `USWAP_IDLE_AGE` | idle aging: an age (`120s`, `2m`), `never` (count idle pages only) or `off` | `off` |
//! | `USWAP_TIER_AGE` | how long a page stays out of RAM untouched before it moves down a tier (`30s`, `2m`; see `PagerBuilder::tier_age`) | twice an evicting `USWAP_IDLE_AGE`, never otherwise |
//! | `USWAP_START_AFTER` | the heap a process may use before its pager starts, a size, at most a sixteenth of the limit; `0`: before `main` (see the crate's doc, "Lazy start") | a sixteenth of the limit (16 MiB at most outside a `uswap run` tree, see `waiting_charge`) |
//! | `USWAP_DISABLE` | set: the library does nothing | unset |
//! | `USWAP_ADDRESS_SPACE_LIMIT` | set by the library itself at `execve`: the address-space limit a managed parent set (see `rlimit`) | unset |
//! | `USWAP_DATA_LIMIT` | likewise, the data limit a managed parent set | unset |

use uswap::{parse_size, parse_tier_age, DeviceConfig, FaultMode, IdleAging, PagerBuilder};

pub const ENV_LIMIT: &str = "USWAP_LIMIT";
pub const ENV_DEVICE: &str = "USWAP_DEVICE";
pub const ENV_FAULT_MODE: &str = "USWAP_FAULT_MODE";
pub const ENV_MIN_SIZE: &str = "USWAP_MIN_SIZE";
/// `USWAP_MIN_SIZE`'s default: Ruby's heap pages (16 KiB mappings) are managed; smaller
/// mappings, fewer and dearer to manage one by one, stay the kernel's (docs/cli.md, "Not
/// managed"). As `uswap run --min-size`'s.
pub const DEFAULT_MIN_SIZE_BYTES: usize = 16 << 10;
pub const ENV_STATS_DIR: &str = "USWAP_STATS_DIR";
pub const ENV_DISABLE: &str = "USWAP_DISABLE";
pub const ENV_IDLE_AGE: &str = "USWAP_IDLE_AGE";
pub const ENV_TIER_AGE: &str = "USWAP_TIER_AGE";
pub const ENV_START_AFTER: &str = "USWAP_START_AFTER";

/// The default and the most of `USWAP_START_AFTER`: a sixteenth of the limit. Under a
/// limit of 256 MiB or less, at most what a shell, `sed`, `cc1` on a small file or a test
/// runner's short process commits of heap; under a larger one, a program far below its
/// limit pays nothing for its pager (past 16 MiB its heap is charged to the tree all the
/// same, see `waiting_charge`).
pub fn start_after_most_bytes(limit_bytes: u64) -> u64 {
    limit_bytes / 16
}

/// The heap region is never smaller than this (mimalloc's smallest arena is 32 MiB)...
const MIN_HEAP_BYTES: u64 = 256 << 20;
/// ...but under an address-space limit, where it is fitted to a third of the limit (up to
/// half of a small one), at least one arena: under `ulimit -v 256M` a heap of 256 MiB
/// could not be reserved at all, and no program ran.
const MIN_FITTED_HEAP_BYTES: u64 = 32 << 20;
/// Nor larger: address space is plentiful, but the page table is 8 bytes per 4 KiB page.
const MAX_HEAP_BYTES: u64 = 1 << 40;

pub struct Config {
    pub limit_bytes: u64,
    pub devices: Vec<DeviceConfig>,
    pub fault_mode: FaultMode,
    /// `fault_mode` is what `auto` chose, not what the user asked for: the pager's start may
    /// still pick thread mode for a traced process (`fault_mode_now`).
    pub fault_mode_auto: bool,
    pub min_size_bytes: usize,
    pub stats_dir: Option<std::path::PathBuf>,
    pub idle_aging: IdleAging,
    /// How long a page stays out of RAM untouched before it moves down a tier (`None`: the
    /// pager's default).
    pub tier_age: Option<std::time::Duration>,
    /// Size of the managed heap region: everything the program can keep, in RAM or on the
    /// devices (limit plus device capacity).
    pub heap_bytes: usize,
    /// The heap bytes mimalloc may commit before the pager starts (see the crate's doc,
    /// "Lazy start"); 0: the pager starts before `main`. At most a sixteenth of the limit:
    /// what a process waiting for its pager holds cannot be paged (past 16 MiB it is
    /// charged to the tree, `waiting_charge`).
    pub start_after_bytes: usize,
}

fn size_var(name: &str, default: u64) -> Result<u64, String> {
    match text_var(name)? {
        Some(v) => parse_size(&v).map_err(|e| format!("{name}={v:?}: {e}")),
        None => Ok(default),
    }
}

/// Variable `name`, `None` if unset; one that is not UTF-8 is refused (it was taken as
/// unset: `USWAP_FAULT_MODE=sig\xffnal` ran in thread mode, a bad `USWAP_DEVICE` on the pool).
fn text_var(name: &str) -> Result<Option<String>, String> {
    match crate::first_stage::var(name).map_err(|e| e.to_string()) {
        Ok(v) => Ok(v),
        Err(e) => Err(format!("{name}: {e}")),
    }
}

impl Config {
    /// `set_inside`: the limits a managed parent set (`rlimit`): uswap's reservations come
    /// on top of them.
    pub fn from_env(set_inside: SetInside) -> Result<Config, String> {
        let limit_bytes = size_var(ENV_LIMIT, 1 << 30)?;
        // Here, not when a lazy pager starts: a limit out of range ran the program with no
        // budget at all (by hand, where no `uswap run` checked it first).
        uswap::check_limit(limit_bytes).map_err(|e| format!("{ENV_LIMIT}: {e}"))?;
        let default_capacity = DeviceConfig::default_capacity_bytes();
        let spec = text_var(ENV_DEVICE)?.unwrap_or_else(|| "zpool".into());
        let devices = DeviceConfig::parse_list(&spec, default_capacity).map_err(|e| format!("{ENV_DEVICE}: {e}"))?;
        let fault_mode_var = text_var(ENV_FAULT_MODE)?;
        let fault_mode_auto = fault_mode_var.as_deref() == Some("auto");
        let fault_mode = match fault_mode_var.as_deref() {
            Some("thread") | None => FaultMode::Thread,
            Some("signal") => FaultMode::Signal,
            Some("auto") => resolve_auto(),
            Some(other) => return Err(format!("{ENV_FAULT_MODE}={other:?}: expected auto, thread or signal")),
        };
        let min_size_bytes = size_var(ENV_MIN_SIZE, DEFAULT_MIN_SIZE_BYTES as u64)? as usize;
        let stats_dir = crate::first_stage::var_os(ENV_STATS_DIR).map(Into::into);
        let idle_aging = match text_var(ENV_IDLE_AGE)? {
            Some(v) => IdleAging::parse(&v).map_err(|e| format!("{ENV_IDLE_AGE}: {e}"))?,
            None => IdleAging::Off,
        };
        let tier_age = match text_var(ENV_TIER_AGE)? {
            Some(v) => Some(parse_tier_age(&v).map_err(|e| format!("{ENV_TIER_AGE}: {e}"))?),
            None => None,
        };
        let capacity: u64 = devices.iter().map(DeviceConfig::capacity_bytes).sum();
        // Room for the RAM as well as the limit: with every device full, pages stay resident
        // over the limit (said and counted), as the kernel's would with its swap full. Sized
        // by the limit and the devices alone, a heap under `--device ram:2MiB` ran out at
        // 256 MiB and `malloc` failed (`ENOMEM`) while the machine had gigabytes free.
        let room = limit_bytes.max(uswap::ram_bytes().unwrap_or(0));
        let mut heap = room.saturating_add(capacity).clamp(MIN_HEAP_BYTES, MAX_HEAP_BYTES);
        if let Some((as_bytes, which)) = uswap::address_space_limit() {
            // The heap's reservation counts in full against `ulimit -v`: a third of it at most
            // (the devices take 5/16 by default, see `DeviceConfig::default_capacity_bytes`;
            // the rest is the program's other mappings), said once.
            // Under a small limit, up to half of it: the program's malloc needs the room
            // more than the devices do.
            let fitted = (as_bytes / 3).max(MIN_HEAP_BYTES.min(as_bytes / 2));
            heap = heap.min((fitted / (32 << 20) * (32 << 20)).max(MIN_FITTED_HEAP_BYTES));
            let limit_set_inside = match which {
                uswap::AddressSpaceLimit::AddressSpace => set_inside.address_space,
                uswap::AddressSpaceLimit::Data => set_inside.data,
            };
            say_address_space_limit(as_bytes, which, heap, capacity, limit_set_inside);
        }
        let heap_bytes = heap.next_multiple_of(32 << 20) as usize;
        let start_after_bytes = size_var(ENV_START_AFTER, start_after_most_bytes(limit_bytes))?
            .min(start_after_most_bytes(limit_bytes)) as usize;
        Ok(Config {
            limit_bytes,
            devices,
            fault_mode,
            fault_mode_auto,
            min_size_bytes,
            stats_dir,
            idle_aging,
            tier_age,
            heap_bytes,
            start_after_bytes,
        })
    }

    pub fn builder(&self) -> PagerBuilder {
        let mut b = uswap::Pager::builder()
            .run_library_host()
            .resident_limit(self.limit_bytes)
            .fault_mode(self.fault_mode)
            .idle_aging(self.idle_aging);
        if let Some(age) = self.tier_age {
            b = b.tier_age(age);
        }
        for d in &self.devices {
            b = b.device(d.clone());
        }
        b
    }
}

/// Which limits a managed parent set before it exec'd this image (`rlimit::inherit`):
/// uswap's reservations come on top of them.
#[derive(Clone, Copy, Debug, Default)]
pub struct SetInside {
    pub address_space: bool,
    pub data: bool,
}

/// Says, once per process, how uswap's reservations were sized to an address-space limit.
fn say_address_space_limit(
    as_bytes: u64,
    which: uswap::AddressSpaceLimit,
    heap_bytes: u64,
    capacity_bytes: u64,
    limit_set_inside: bool,
) {
    let name = match which {
        uswap::AddressSpaceLimit::Data => "a data limit (ulimit -d)",
        uswap::AddressSpaceLimit::AddressSpace => "an address-space limit (ulimit -v)",
    };
    let whose = if limit_set_inside {
        "set inside the run: uswap's reservations come on top of it, and are sized to it"
    } else {
        "which uswap's reservations count against"
    };
    crate::real::write_stderr(
        format!(
            "uswap: process {} has {name} of {} MiB, {whose}: its managed heap is {} MiB \
         (the program's malloc can grow no further, and a single block less) and its swap devices hold at most {} MiB of pages\n",
            std::process::id(),
            as_bytes >> 20,
            heap_bytes >> 20,
            capacity_bytes >> 20
        )
        .as_bytes(),
    );
}

/// `auto`: signal mode (the faulting thread serves its own fault: faster), unless this
/// process gets the kernel to touch its memory on its own, outside any system call signal
/// mode can prepare: then thread mode, said once on stderr. Told by what the process is
/// made of, before it runs: it links `libaio` or `liburing` (asynchronous I/O into its
/// buffers), or an MPI library (Open MPI's `libmpi`, `libmpich`: ranks on one machine copy
/// each other's messages with `process_vm_readv`/`process_vm_writev`, which reach a
/// signal-mode process's pages out of RAM with `EFAULT`), or it is QEMU asked for KVM (a
/// guest's RAM). What this misses (a program making `io_uring_setup` itself, liburing
/// loaded with `dlopen`) is still said and counted when it happens, or when the rings are
/// found mapped (`syscall_async_kernel_access`, `report::measure_unmanaged`). A process a debugger follows
/// when its pager starts gets thread mode there (`fault_mode_now`).
fn resolve_auto() -> FaultMode {
    let why = if let Some((lib, whose)) = loaded_library_needing_thread_mode() {
        if lib.starts_with("libmpi") && !uswap::thread_mode_permitted() {
            // Without the permission thread mode fails the run; in signal mode an MPI whose
            // transport falls back (Open MPI's does) still runs, and its peers' failed
            // reads are said (`remote_access.rs`).
            crate::real::say_of_this_process(&format!(
                "stays in signal mode: it links {lib}{whose}, which needs thread mode, and this user may \
                 not open the userfaultfd thread mode takes (README, \"Requirements\")"
            ));
            return FaultMode::Signal;
        }
        format!("it links {lib}{whose}")
    } else if qemu_with_kvm() {
        "it is QEMU with KVM".to_string()
    } else {
        return FaultMode::Signal;
    };
    crate::real::say_of_this_process(&format!(
        "runs in thread mode: {why}, and the kernel's own accesses to managed memory need it"
    ));
    FaultMode::Thread
}

/// Libraries that get the kernel to touch a process's memory outside its own system calls,
/// with what to add to "it links ..." when the reason is not the process's own I/O.
const LIBS: [(&str, &str); 4] = [
    ("libaio.so", ""),
    ("liburing.so", ""),
    ("libmpi.so", " (MPI: its peers on this machine read and write its memory with process_vm_readv)"),
    ("libmpich.so", " (MPI: its peers on this machine read and write its memory with process_vm_readv)"),
];

/// The name of a loaded library of [`LIBS`] and what to add, if one is loaded.
fn loaded_library_needing_thread_mode() -> Option<(&'static str, &'static str)> {
    extern "C" fn visit(info: *mut libc::dl_phdr_info, _size: usize, data: *mut libc::c_void) -> libc::c_int {
        // SAFETY: dl_iterate_phdr passes a valid info for the call, and `data` is the
        // `Option<usize>` handed to it below.
        let (info, found) = unsafe { (&*info, &mut *(data as *mut Option<usize>)) };
        if info.dlpi_name.is_null() {
            return 0;
        }
        // SAFETY: a non-null dlpi_name is a NUL-terminated string for the call.
        let name = unsafe { std::ffi::CStr::from_ptr(info.dlpi_name) }.to_bytes();
        let file = name.rsplit(|&b| b == b'/').next().unwrap_or(name);
        match LIBS.iter().position(|(lib, _)| file.starts_with(lib.as_bytes())) {
            Some(i) => {
                *found = Some(i);
                1
            }
            None => 0,
        }
    }
    let mut found: Option<usize> = None;
    // SAFETY: `visit` matches dl_iterate_phdr's callback type and only reads the info it is
    // given; `found` outlives the call.
    unsafe { libc::dl_iterate_phdr(Some(visit), &mut found as *mut Option<usize> as *mut libc::c_void) };
    found.map(|i| LIBS[i])
}

/// Whether this process is `qemu-system-*` with KVM asked for (`-enable-kvm`, `-accel kvm`,
/// `accel=kvm`). From the arguments the C library hands the library's constructor, not
/// from `/proc/self/cmdline` (an open, a `statx`, two reads and a close in every exec).
fn qemu_with_kvm() -> bool {
    let mut args = std::env::args_os();
    let Some(exe) = args.next() else { return false };
    let exe = exe.as_encoded_bytes();
    let file = exe.rsplit(|&b| b == b'/').next().unwrap_or(exe);
    file.starts_with(b"qemu-system") && args.any(|a| a.as_encoded_bytes().windows(3).any(|w| w == b"kvm"))
}
