//! The errors a user of the library can see. Each message says what went wrong and what to
//! do about it.

use std::io;

use thiserror::Error;

use crate::backend::BackendError;

#[derive(Debug, Error)]
pub enum Error {
    #[error(
        "cannot open a userfaultfd: the userfaultfd(2) system call said \"{syscall}\" and \
         /dev/userfaultfd said \"{dev}\". Run as root, or grant access: \
         `sysctl vm.unprivileged_userfaultfd=1` (signal mode needs no sysctl on Linux >= 5.11), \
         give the process CAP_SYS_PTRACE, or make /dev/userfaultfd readable and writable by \
         your user (e.g. a udev rule or `chmod 0666 /dev/userfaultfd`)"
    )]
    UserfaultfdDenied { syscall: io::Error, dev: io::Error },

    #[error(
        "cannot open a userfaultfd even for faults from user mode, which the kernel grants every \
         user (Linux >= 5.11): the system call said \"{syscall}\", so a seccomp filter or a security \
         module forbids it here (Docker's default profile allows userfaultfd only to a container \
         started with --cap-add SYS_PTRACE), and /dev/userfaultfd said \"{dev}\". Allow the \
         userfaultfd system call, or run outside the container"
    )]
    UserfaultfdFiltered { syscall: io::Error, dev: io::Error },

    #[error(
        "this kernel has no userfaultfd ({source}); uswap needs Linux >= 6.8 built with CONFIG_USERFAULTFD=y \
         (or the process runs under an emulator of system calls, such as valgrind, that has none)"
    )]
    UserfaultfdUnsupported { source: io::Error },

    #[error(
        "kernel {release} lacks userfaultfd features uswap needs ({missing}); \
         UFFDIO_MOVE arrived in Linux 6.8: run uswap on Linux >= 6.8"
    )]
    KernelTooOld { release: String, missing: String },

    #[error("resident limit of {limit_bytes} bytes is below the minimum of {min_bytes} bytes; give the pager at least {min_bytes} bytes")]
    LimitTooSmall { limit_bytes: u64, min_bytes: u64 },

    #[error(
        "resident limit of {limit_bytes} bytes is above the most a pager takes, {max_bytes} bytes; give a smaller \
         one (a limit above the machine's memory is never reached, whatever its size)"
    )]
    LimitTooLarge { limit_bytes: u64, max_bytes: u64 },

    #[error(
        "a stall target of {target} is not a share of wall time between 0 and 0.5 (1 % is 0.01); give one such as 0.01"
    )]
    BadStallTarget { target: f64 },

    #[error("an idle age of {age_ms} ms is too short to tell an idle page from a busy one; give 1 s or more")]
    BadIdleAge { age_ms: u64 },

    #[error("a tier age of {age_ms} ms is out of range: give 1 s to a year (8760h)")]
    BadTierAge { age_ms: u64 },

    #[error(
        "a tier age moves pages down to a device of lower priority, and the {nr_devices} device(s) given have one \
         priority: give a tier below, such as the devices zpool,zpool:zstd-1 (an lz4 pool over a zstd pool)"
    )]
    NoTierBelow { nr_devices: usize },

    #[error("this pager was built by process {owner_pid}, and process {pid} is a fork child of it: the engine's threads and userfaultfd stayed with the parent, and its regions are not the child's (not mapped in it where the regions do not survive a fork, as the C API's; copies without their swapped-out pages otherwise); build a new pager in the child")]
    ForkChild { owner_pid: u32, pid: u32 },

    #[error("this process runs under `uswap run`, whose library (loaded through LD_PRELOAD) already pages its memory; a pager of uswap's library API cannot run beside it, each taking the other's memory for the program's: run the program without `uswap run` (its pagers then page its memory), or with USWAP_DISABLE=1 in its environment (the library then stands aside in it), or without making a pager")]
    UnderUswapRun,

    #[error("{given} fault-handler threads asked for; a pager starts at most {max} (a backlog brings up at most half the CPUs): give fewer, or none for one per CPU")]
    TooManyHandlerThreads { given: usize, max: usize },

    #[error("an automatic budget moves the limit of one pager; under a shared charge the tree's budget is moved by whoever owns it (uswap run --auto)")]
    AutoBudgetShared,

    #[error("cannot map a region of zero bytes; ask for at least one page ({page_size} bytes)")]
    ZeroLengthMap { page_size: usize },

    #[error(
        "cannot map a region aligned to {align_bytes} bytes: an alignment is a power of two from a page \
         ({page_size} bytes) to MAX_REGION_BYTES"
    )]
    BadAlignment { align_bytes: u64, page_size: usize },

    #[error("cannot map {len_bytes} bytes: a region holds at most {max_bytes} bytes (MAX_REGION_BYTES); split it into several regions")]
    MapTooLarge { len_bytes: u64, max_bytes: u64 },

    #[error("all {max} region slots of this process are in use; drop regions you no longer need")]
    TooManyRegions { max: usize },

    #[error(
        "no swap device configured; add one (PagerBuilder::device, uswap_config_set_devices in C, devices= in Python)"
    )]
    NoDevice,

    #[error("swap device {name}: {why}")]
    Device { name: String, why: String },

    #[error("bad device {spec:?}: {why}")]
    BadDeviceSpec { spec: String, why: String },

    #[error("at most {max} swap devices per pager, {given} given")]
    TooManyDevices { given: usize, max: usize },

    #[error("swap device {name}: capacity of {capacity_bytes} bytes is below one cluster ({min_bytes} bytes); give it at least {min_bytes} bytes")]
    DeviceTooSmall { name: String, capacity_bytes: u64, min_bytes: u64 },

    #[error(
        "cannot map {what} ({len_bytes} bytes): {source}; lower the size or raise the address-space limit (ulimit -v)"
    )]
    OutOfAddressSpace { what: String, len_bytes: u64, source: io::Error },

    #[error(
        "could not reclaim down to the new limit of {limit_bytes} bytes ({resident_bytes} bytes \
         still resident): the swap devices are full, or their writes fail (see the device's \
         message on stderr). The limit is in place; add or enlarge a device, free memory, or \
         mend the device"
    )]
    LimitNotReached { resident_bytes: u64, limit_bytes: u64 },

    #[error(
        "could not reclaim down to the new limit of {limit_bytes} bytes ({resident_bytes} bytes \
         still resident) within {waited_ms} ms: every page reclaim found was busy (in a fault or \
         a device write) while other threads kept faulting. The limit is in place and faults \
         keep to it; call again once the other threads are quieter"
    )]
    LimitBusy { resident_bytes: u64, limit_bytes: u64, waited_ms: u64 },

    #[error(
        "signal mode: this thread blocks SIGBUS, so a fault on a managed page in it would kill \
         the process (the kernel forces a blocked SIGBUS to its default action). Unblock SIGBUS \
         (pthread_sigmask) in every thread that touches managed memory and keep it out of the \
         sa_mask of signal handlers that do, or use thread mode (the default: FaultMode::Thread, \
         USWAP_FAULT_MODE_THREAD in C, fault_mode=\"thread\" in Python)"
    )]
    SigbusBlocked,

    #[error(
        "signal mode: the process's SIGBUS handler is no longer uswap's (SIGBUS was given a new \
         handler after the first signal-mode pager was built), so faults on managed pages would \
         reach that handler instead of being served. Install your SIGBUS handler before building \
         the first signal-mode pager (uswap passes it every SIGBUS that is not for a managed \
         page), or use thread mode (the default: FaultMode::Thread, USWAP_FAULT_MODE_THREAD in C, \
         fault_mode=\"thread\" in Python)"
    )]
    SigbusHandlerReplaced,

    #[error(
        "signal mode: the system-call guard (PagerBuilder::syscall_guard, \
         uswap_config_set_syscall_guard in C, syscall_guard=True in Python) rewrites the C \
         library's code, which is safe only while the process has one thread, and it has \
         {threads}. Build the first pager that asks for it at the start of main, before any \
         thread starts, or use thread mode (the default: FaultMode::Thread, \
         USWAP_FAULT_MODE_THREAD in C, fault_mode=\"thread\" in Python), whose faults in \
         system calls need no guard"
    )]
    SyscallGuardThreads { threads: usize },

    #[error(
        "signal mode: cannot route the C library's system calls through uswap: {why}; use thread \
         mode (FaultMode::Thread, USWAP_FAULT_MODE_THREAD in C, fault_mode=\"thread\" in Python)"
    )]
    SyscallGuard { why: String },

    #[error("{context}: {source}")]
    Io { context: String, source: io::Error },

    #[error("swap device failed: {0}")]
    Backend(#[from] BackendError),

    #[error(transparent)]
    FileDevice(#[from] crate::backend::file::FileDeviceError),

    #[error(transparent)]
    RedisDevice(#[from] crate::backend::redis::RedisDeviceError),
}

/// What kind of failure an [`Error`] is, for callers that act on the kind rather than the
/// message: the C ABI's status codes and the Python package's exception classes are both
/// chosen from it, so the two cannot classify an error differently.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ErrorKind {
    /// The process may not open a userfaultfd (see the message for the ways to allow it).
    Permission,
    /// The kernel has no userfaultfd, or lacks a feature uswap needs.
    Unsupported,
    /// An argument or a configuration is invalid; the message says which and what is allowed.
    InvalidArgument,
    /// No room: region slots or address space ran out.
    OutOfMemory,
    /// A swap device failed, or could not be set up.
    Device,
    /// A lowered resident limit could not be reached (pages stayed in use).
    LimitNotReached,
    /// The resident limit is being changed by another caller.
    LimitBusy,
    /// Signal fault mode cannot serve faults (SIGBUS blocked, or its handler replaced).
    Signal,
    /// A system call failed.
    Io,
}

impl Error {
    pub(crate) fn io(context: impl Into<String>, source: io::Error) -> Error {
        Error::Io { context: context.into(), source }
    }

    /// This error's kind.
    pub fn kind(&self) -> ErrorKind {
        use Error::*;
        // Exhaustive on purpose: a new error must be given a kind here, not fall into a
        // catch-all.
        match self {
            UserfaultfdDenied { .. } | UserfaultfdFiltered { .. } => ErrorKind::Permission,
            UserfaultfdUnsupported { .. } | KernelTooOld { .. } => ErrorKind::Unsupported,
            LimitTooSmall { .. }
            | LimitTooLarge { .. }
            | BadStallTarget { .. }
            | BadIdleAge { .. }
            | BadTierAge { .. }
            | NoTierBelow { .. }
            | TooManyHandlerThreads { .. }
            | ForkChild { .. }
            | UnderUswapRun
            | AutoBudgetShared
            | ZeroLengthMap { .. }
            | BadAlignment { .. }
            | MapTooLarge { .. }
            | NoDevice
            | BadDeviceSpec { .. }
            | TooManyDevices { .. }
            | DeviceTooSmall { .. } => ErrorKind::InvalidArgument,
            FileDevice(e) if e.is_bad_argument() => ErrorKind::InvalidArgument,
            TooManyRegions { .. } | OutOfAddressSpace { .. } => ErrorKind::OutOfMemory,
            Device { .. } | Backend(_) | FileDevice(_) | RedisDevice(_) => ErrorKind::Device,
            LimitNotReached { .. } => ErrorKind::LimitNotReached,
            LimitBusy { .. } => ErrorKind::LimitBusy,
            SigbusBlocked | SigbusHandlerReplaced | SyscallGuardThreads { .. } | SyscallGuard { .. } => {
                ErrorKind::Signal
            }
            Io { .. } => ErrorKind::Io,
        }
    }
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_error_has_the_kind_callers_act_on() {
        let denied = || io::Error::from_raw_os_error(libc::EPERM);
        let cases = [
            (Error::UserfaultfdDenied { syscall: denied(), dev: denied() }, ErrorKind::Permission),
            (Error::UserfaultfdFiltered { syscall: denied(), dev: denied() }, ErrorKind::Permission),
            (Error::KernelTooOld { release: "6.1".into(), missing: "UFFDIO_MOVE".into() }, ErrorKind::Unsupported),
            (Error::LimitTooSmall { limit_bytes: 4096, min_bytes: 1 << 20 }, ErrorKind::InvalidArgument),
            (Error::NoDevice, ErrorKind::InvalidArgument),
            (Error::UnderUswapRun, ErrorKind::InvalidArgument),
            (Error::BadAlignment { align_bytes: 3, page_size: 4096 }, ErrorKind::InvalidArgument),
            (Error::TooManyRegions { max: 4096 }, ErrorKind::OutOfMemory),
            (Error::Device { name: "file".into(), why: "full".into() }, ErrorKind::Device),
            // A file device below one cluster is a bad argument, as `ram:1MiB` is; one the
            // file refuses is a device error.
            (
                Error::FileDevice(crate::backend::file::FileDeviceError::TooSmall {
                    path: "/f".into(),
                    capacity_bytes: 1,
                    min_bytes: 2,
                }),
                ErrorKind::InvalidArgument,
            ),
            (
                Error::FileDevice(crate::backend::file::FileDeviceError::ReadOnly { path: "/f".into() }),
                ErrorKind::Device,
            ),
            (Error::LimitNotReached { resident_bytes: 2, limit_bytes: 1 }, ErrorKind::LimitNotReached),
            (Error::LimitBusy { resident_bytes: 2, limit_bytes: 1, waited_ms: 5 }, ErrorKind::LimitBusy),
            (Error::SigbusBlocked, ErrorKind::Signal),
            (Error::io("mmap", io::Error::from_raw_os_error(libc::ENOMEM)), ErrorKind::Io),
        ];
        for (e, kind) in cases {
            assert_eq!(e.kind(), kind, "{e}");
        }
    }
}
