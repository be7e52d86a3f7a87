//! What `/proc/meminfo` says of the machine's memory: the sizes `uswap run` and `uswap bench`
//! default to and check against. A leaf: imports nothing of the crate.

/// What `/proc/meminfo` says is free, in bytes (0 where it cannot be read: then nothing fits
/// and the message says so by its numbers).
#[derive(Debug, Clone, Copy, Default)]
pub struct Meminfo {
    pub available_bytes: u64,
    pub total_bytes: u64,
}

impl Meminfo {
    pub fn read() -> Meminfo {
        let text = std::fs::read_to_string("/proc/meminfo").unwrap_or_default();
        let kib = |key: &str| {
            text.lines()
                .find_map(|l| l.strip_prefix(key)?.strip_prefix(':'))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
                .unwrap_or(0)
        };
        Meminfo { available_bytes: kib("MemAvailable") * 1024, total_bytes: kib("MemTotal") * 1024 }
    }
}
