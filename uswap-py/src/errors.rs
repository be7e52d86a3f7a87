//! The exceptions Python sees: `uswap.Error` and one subclass per kind of failure, each
//! carrying the engine's message (what went wrong and what to do about it).
//!
//! No state and no locks. Invariant: every engine error maps to exactly one class; the match
//! below is exhaustive on purpose, so a new engine error does not compile until it is given
//! one (as in the C API's status codes).

use pyo3::create_exception;
use pyo3::exceptions::PyException;
use pyo3::prelude::*;

create_exception!(uswap, Error, PyException, "Base class of every uswap error; the message is the engine's.");
create_exception!(
    uswap,
    UserfaultfdError,
    Error,
    "userfaultfd cannot be used here: no permission to open one, or the kernel lacks it or UFFDIO_MOVE."
);
create_exception!(
    uswap,
    InvalidArgumentError,
    Error,
    "A bad argument: a size that does not parse or is out of range, a device list that does not parse, \
     a limit below the minimum; or a call this process cannot make (a pager under `uswap run`, a fork \
     child's call on its parent's pager)."
);
create_exception!(
    uswap,
    OutOfMemoryError,
    Error,
    "Out of address space, or every region slot of the process is in use."
);
create_exception!(uswap, DeviceError, Error, "A swap device could not be opened, or failed.");
create_exception!(
    uswap,
    LimitError,
    Error,
    "A lower resident limit could not be reached (devices full, or every page busy); the new limit is in place."
);
create_exception!(
    uswap,
    SignalModeError,
    Error,
    "Signal fault mode cannot serve faults here: SIGBUS is blocked, or its handler was replaced."
);
create_exception!(uswap, IoError, Error, "A system call failed; the message names it and the reason.");

/// The Python exception for an engine error, with the engine's message.
pub fn to_py(e: uswap::Error) -> PyErr {
    use uswap::ErrorKind::*;
    let msg = e.to_string();
    match e.kind() {
        Permission | Unsupported => UserfaultfdError::new_err(msg),
        InvalidArgument => InvalidArgumentError::new_err(msg),
        OutOfMemory => OutOfMemoryError::new_err(msg),
        Device => DeviceError::new_err(msg),
        LimitNotReached | LimitBusy => LimitError::new_err(msg),
        Signal => SignalModeError::new_err(msg),
        Io => IoError::new_err(msg),
    }
}

/// Adds the exception classes to the module.
pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    let py = m.py();
    m.add("Error", py.get_type::<Error>())?;
    m.add("UserfaultfdError", py.get_type::<UserfaultfdError>())?;
    m.add("InvalidArgumentError", py.get_type::<InvalidArgumentError>())?;
    m.add("OutOfMemoryError", py.get_type::<OutOfMemoryError>())?;
    m.add("DeviceError", py.get_type::<DeviceError>())?;
    m.add("LimitError", py.get_type::<LimitError>())?;
    m.add("SignalModeError", py.get_type::<SignalModeError>())?;
    m.add("IoError", py.get_type::<IoError>())?;
    Ok(())
}
