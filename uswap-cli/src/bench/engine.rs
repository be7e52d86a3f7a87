//! The engines `uswap bench` compares, by the names `--engines` takes:
//!
//! - `uswap-signal`, `uswap-thread`: uswap in that fault mode, on the devices of `--device`,
//!   or on its own devices with `uswap-MODE@DEVICES` (devices separated by `+`, since `,`
//!   separates engines: `uswap-signal@ram:2GiB`); `uswap-MODE/ra-off` (or `/ra-on`) overrides
//!   `--readahead` for that engine, so one run can put readahead on and off side by side;
//! - `kernel-zram`, `kernel-file`: the kernel's swap to zram (lz4) or to a swap file, with
//!   the workload process in a memory cgroup limited to `--limit` (root only);
//! - `ram`: an ordinary mapping and no limit: the upper bound.

use std::fmt;

use serde::Serialize;

use super::args::FaultModeArg;
use super::error::BenchError;

/// The kernel's swap device kinds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum KernelSwap {
    Zram,
    File,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EngineKind {
    /// `devices`: `None` for the `--device` list.
    Uswap {
        mode: FaultModeArg,
        devices: Option<String>,
        /// `None`: as `--readahead` says.
        readahead: Option<bool>,
    },
    Kernel(KernelSwap),
    Ram,
}

/// An engine as named on the command line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Engine {
    pub name: String,
    pub kind: EngineKind,
}

impl Engine {
    pub fn parse(name: &str) -> Result<Engine, BenchError> {
        let name = name.trim();
        let bad = || BenchError::UnknownEngine { name: name.to_string() };
        let (base, devices) = match name.split_once('@') {
            Some((b, d)) if !d.is_empty() => (b, Some(d.replace('+', ","))),
            Some(_) => return Err(bad()),
            None => (name, None),
        };
        let (base, readahead) = match base.split_once('/') {
            Some((b, "ra-off")) => (b, Some(false)),
            Some((b, "ra-on")) => (b, Some(true)),
            Some(_) => return Err(bad()),
            None => (base, None),
        };
        let kind = match (base, &devices) {
            ("uswap-signal", _) => EngineKind::Uswap { mode: FaultModeArg::Signal, devices, readahead },
            ("uswap-thread", _) => EngineKind::Uswap { mode: FaultModeArg::Thread, devices, readahead },
            ("kernel-zram", None) => EngineKind::Kernel(KernelSwap::Zram),
            ("kernel-file", None) => EngineKind::Kernel(KernelSwap::File),
            ("ram", None) => EngineKind::Ram,
            _ => return Err(bad()),
        };
        Ok(Engine { name: name.to_string(), kind })
    }

    /// A comma-separated list, each engine once.
    pub fn parse_list(list: &str) -> Result<Vec<Engine>, BenchError> {
        let mut out: Vec<Engine> = vec![];
        for item in list.split(',').filter(|s| !s.trim().is_empty()) {
            let e = Engine::parse(item)?;
            if out.iter().any(|o| o.name == e.name) {
                return Err(BenchError::DuplicateEngine { name: e.name });
            }
            out.push(e);
        }
        if out.is_empty() {
            return Err(BenchError::NoEngines);
        }
        Ok(out)
    }

    pub fn is_kernel(&self) -> bool {
        matches!(self.kind, EngineKind::Kernel(_))
    }

    /// Whether the engine keeps the working set under `--limit`.
    pub fn is_limited(&self) -> bool {
        !matches!(self.kind, EngineKind::Ram)
    }
}

impl fmt::Display for Engine {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.name)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_parse_and_bad_ones_are_refused() {
        let e = Engine::parse_list("uswap-signal, uswap-thread@ram:1GiB+ram,kernel-zram,kernel-file,ram").unwrap();
        assert_eq!(e.len(), 5);
        assert_eq!(e[0].kind, EngineKind::Uswap { mode: FaultModeArg::Signal, devices: None, readahead: None });
        assert_eq!(
            e[1].kind,
            EngineKind::Uswap { mode: FaultModeArg::Thread, devices: Some("ram:1GiB,ram".into()), readahead: None }
        );
        let r = Engine::parse("uswap-signal/ra-off@zpool").unwrap();
        assert_eq!(
            r.kind,
            EngineKind::Uswap { mode: FaultModeArg::Signal, devices: Some("zpool".into()), readahead: Some(false) }
        );
        assert_eq!(e[1].name, "uswap-thread@ram:1GiB+ram");
        let r = Engine::parse("uswap-signal@zpool+redis://127.0.0.1:6379;127.0.0.1:6380?replicas=1").unwrap();
        let devices = Some("zpool,redis://127.0.0.1:6379;127.0.0.1:6380?replicas=1".into());
        assert_eq!(r.kind, EngineKind::Uswap { mode: FaultModeArg::Signal, devices, readahead: None });
        assert!(e[2].is_kernel() && e[3].is_kernel() && !e[4].is_limited());
        for bad in ["uswap", "kernel-zram@ram", "uswap-signal@", "zram", "uswap-signal/ra"] {
            let err = Engine::parse_list(bad).unwrap_err().to_string();
            assert!(err.contains("known engines"), "{bad}: {err}");
        }
        assert!(Engine::parse_list("ram,ram").unwrap_err().to_string().contains("twice"));
        assert!(Engine::parse_list(" , ").is_err());
    }
}
