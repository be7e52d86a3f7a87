//! Why a fault's service failed ([`FaultError`]), and what the SIGBUS report says of it:
//! the error fault service (`crate::fault_service`, `crate::swapin`) returns to fault
//! delivery (`crate::fault`). How the fault came in is [`super::route`]'s. Also the page
//! errors the program can read ([`PageError`], `Pager::recent_errors`): one failed attempt
//! each, retried.
//!
//! Locking: none; plain values.

/// What went wrong with a page.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PageErrorKind {
    /// The device failed to read it.
    ReadFailed,
    /// The device returned data that did not match the page's checksum.
    ChecksumMismatch,
    /// The fault waited too long for the page's busy bit (its owner never finished).
    BusyTimeout,
}

/// A page the engine failed to bring back on one attempt (it retries; `Stats` counts).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PageError {
    /// Address of the page in its region.
    pub addr: usize,
    pub device: usize,
    pub slot: u64,
    pub kind: PageErrorKind,
    /// What the device said, when it said something (`BackendError::cause`); empty if not.
    pub cause: &'static str,
}

impl std::fmt::Display for PageError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let what = match self.kind {
            PageErrorKind::ReadFailed => "device read failed",
            PageErrorKind::ChecksumMismatch => "checksum mismatch",
            PageErrorKind::BusyTimeout => "gave up waiting for the page's owner",
        };
        write!(f, "page {:#x} (device {} slot {}): {what}", self.addr, self.device, self.slot)?;
        if !self.cause.is_empty() {
            write!(f, ": {}", self.cause)?;
        }
        Ok(())
    }
}

/// Why a fault could not be served.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum FaultError {
    /// The device read failed, or returned data that failed its checksum, on every attempt;
    /// the page is still on the device. With what the device said of the last attempt
    /// (`BackendError::cause`; empty when it said nothing, as on a checksum mismatch).
    Device(PageErrorKind, &'static str),
    /// An ioctl failed with this errno (`EAGAIN`: an event is pending; try again).
    Ioctl(i32),
    /// The page stayed busy past `BUSY_WAIT_LIMIT_NS`: its owner is not making progress
    /// (most likely the faulting thread itself, interrupted while it owned the page).
    BusyTimeout,
    /// No bounce buffer came free within `sync::POP_WAIT_LIMIT_NS`: every one stayed lent
    /// to threads that made no progress (a hung device read). The page is still on its device.
    BounceTimeout,
    /// The address is not the region's any more (the application unmapped or moved it).
    Gone,
    /// The page was mapped for a racing fault, and by the time this (stale) fault was
    /// served the application had unmapped it: no mapping is registered there any more
    /// (`ENOENT`), and the `UNMAP` event that says so is not applied yet. Nothing is lost.
    Unmapped,
}

impl FaultError {
    /// What the device said of a read that failed (empty when nothing, or not a read).
    pub(crate) fn device_cause(self) -> &'static str {
        match self {
            FaultError::Device(_, cause) => cause,
            _ => "",
        }
    }

    /// The end of the line `report_lost_page` writes before SIGBUS: why the page could not
    /// be brought back and where its contents are, in two parts, around where what the
    /// device said goes ([`device_cause`](Self::device_cause), after a colon). Static
    /// strings: the signal-mode path allocates nothing.
    pub(crate) fn why_lost(self) -> [&'static str; 2] {
        let whole = match self {
            FaultError::Device(PageErrorKind::ChecksumMismatch, _) => {
                "read back from its swap device with a checksum mismatch on every attempt; its slot is kept"
            }
            FaultError::Device(..) => {
                return ["could not be read from its swap device (I/O error on every attempt", "); its slot is kept"]
            }
            FaultError::BusyTimeout => {
                "stayed busy for 10 s: its owner made no progress (most likely this very thread, interrupted while it owned the page); its contents are kept"
            }
            FaultError::BounceTimeout => {
                "could not be read: no bounce buffer came free for 10 s (every one held by a thread that made no progress, e.g. a hung device read); its slot is kept"
            }
            FaultError::Ioctl(libc::EPERM | libc::EACCES | libc::ENOSYS) => {
                "could not be mapped: the kernel refused this thread's userfaultfd ioctl on every attempt (a seccomp filter or sandbox that forbids ioctl(2)? then run the program with --fault-mode thread, whose handlers are uswap's threads); its contents are kept"
            }
            FaultError::Ioctl(libc::EBADF) => {
                "could not be mapped: the pager's userfaultfd is closed, or its number names another file now (the program closed descriptors it did not open, with close_range, closefrom or a close loop, after the pager was made: make the pager after that, or run the program under uswap run); its contents are kept"
            }
            FaultError::Ioctl(_) => "could not be mapped (a userfaultfd ioctl failed on every attempt); its contents are kept",
            FaultError::Gone | FaultError::Unmapped => "is no longer part of a managed region",
        };
        [whole, ""]
    }
}
