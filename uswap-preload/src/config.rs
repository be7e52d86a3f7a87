//! The environment `uswap run` passes to the library (a user may also set it by hand with
//! `LD_PRELOAD`). Every variable is optional; bad values stop the program with a message
//! naming the variable rather than run it with a budget it did not ask for.
//!
//! | variable | meaning | default |
//! |---|---|---|
//! | `USWAP_LIMIT` | resident limit, a size (`512MiB`) | 1 GiB |
//! | `USWAP_DEVICE` | device list, as `uswap bench --device` | `zpool` of half the RAM |
//! | `USWAP_FAULT_MODE` | `thread` or `signal` | `thread` |
//! | `USWAP_MIN_SIZE` | smallest `mmap` managed | 64 KiB |
//! | `USWAP_STATS_DIR` | where each process writes its final counters | none |
//! | `USWAP_DISABLE` | set: the library does nothing | unset |

use uswap::{parse_size, DeviceConfig, FaultMode, PagerBuilder};

pub const ENV_LIMIT: &str = "USWAP_LIMIT";
pub const ENV_DEVICE: &str = "USWAP_DEVICE";
pub const ENV_FAULT_MODE: &str = "USWAP_FAULT_MODE";
pub const ENV_MIN_SIZE: &str = "USWAP_MIN_SIZE";
pub const ENV_STATS_DIR: &str = "USWAP_STATS_DIR";
pub const ENV_DISABLE: &str = "USWAP_DISABLE";

/// The heap region is never smaller than this (mimalloc's smallest arena is 32 MiB).
const MIN_HEAP_BYTES: u64 = 256 << 20;
/// Nor larger: address space is plentiful, but the page table is 8 bytes per 4 KiB page.
const MAX_HEAP_BYTES: u64 = 1 << 40;

pub struct Config {
    pub limit_bytes: u64,
    pub devices: Vec<DeviceConfig>,
    pub fault_mode: FaultMode,
    pub min_size_bytes: usize,
    pub stats_dir: Option<std::path::PathBuf>,
    /// Size of the managed heap region: everything the program can keep, in RAM or on the
    /// devices (limit plus device capacity).
    pub heap_bytes: usize,
}

fn size_var(name: &str, default: u64) -> Result<u64, String> {
    match std::env::var(name) {
        Ok(v) => parse_size(&v).map_err(|e| format!("{name}={v:?}: {e}")),
        Err(std::env::VarError::NotPresent) => Ok(default),
        Err(e) => Err(format!("{name}: {e}")),
    }
}

impl Config {
    pub fn from_env() -> Result<Config, String> {
        let limit_bytes = size_var(ENV_LIMIT, 1 << 30)?;
        let default_capacity = DeviceConfig::default_capacity_bytes();
        let spec = std::env::var(ENV_DEVICE).unwrap_or_else(|_| "zpool".into());
        let devices = DeviceConfig::parse_list(&spec, default_capacity).map_err(|e| format!("{ENV_DEVICE}: {e}"))?;
        let fault_mode = match std::env::var(ENV_FAULT_MODE).as_deref() {
            Ok("thread") | Err(_) => FaultMode::Thread,
            Ok("signal") => FaultMode::Signal,
            Ok(other) => return Err(format!("{ENV_FAULT_MODE}={other:?}: expected thread or signal")),
        };
        let min_size_bytes = size_var(ENV_MIN_SIZE, 64 << 10)? as usize;
        let stats_dir = std::env::var_os(ENV_STATS_DIR).map(Into::into);
        let capacity: u64 = devices.iter().map(DeviceConfig::capacity_bytes).sum();
        let heap = limit_bytes.saturating_add(capacity).clamp(MIN_HEAP_BYTES, MAX_HEAP_BYTES);
        let heap_bytes = heap.next_multiple_of(32 << 20) as usize;
        Ok(Config { limit_bytes, devices, fault_mode, min_size_bytes, stats_dir, heap_bytes })
    }

    pub fn builder(&self) -> PagerBuilder {
        let mut b = uswap::Pager::builder().resident_limit(self.limit_bytes).fault_mode(self.fault_mode);
        for d in &self.devices {
            b = b.device(d.clone());
        }
        b
    }
}
