//! The values `uswap bench`'s options take that the other bench modules share: the fault
//! mode, the background reclaimer's policy, on/off switches, and the engines it knows. A
//! leaf of the bench folder: its modules import it, it imports none of them.

use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum FaultModeArg {
    Thread,
    Signal,
}

impl From<FaultModeArg> for crate::run::RunFaultMode {
    fn from(m: FaultModeArg) -> Self {
        match m {
            FaultModeArg::Thread => crate::run::RunFaultMode::Thread,
            FaultModeArg::Signal => crate::run::RunFaultMode::Signal,
        }
    }
}

impl From<FaultModeArg> for uswap::FaultMode {
    fn from(m: FaultModeArg) -> Self {
        match m {
            FaultModeArg::Thread => uswap::FaultMode::Thread,
            FaultModeArg::Signal => uswap::FaultMode::Signal,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum OnOff {
    On,
    Off,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum BackgroundArg {
    Auto,
    Idle,
    Always,
    StageTwo,
}

/// The engines `--engines` takes, as an error message lists them.
pub const ENGINE_NAMES: &str = "uswap-signal, uswap-thread (optionally /ra-off or /ra-on, and @DEVICES, e.g. \
     uswap-signal/ra-off@ram:2GiB), kernel-zram, kernel-file, ram";
