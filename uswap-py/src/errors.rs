//! The exceptions Python sees: `uswap.Error` and one subclass per kind of failure, each
//! carrying the engine's message (what went wrong and what to do about it). Where a kind is
//! also one of Python's own, the class derives from both, so that code written for any
//! library catches it: `InvalidArgumentError` is a `ValueError`, `OutOfMemoryError` a
//! `MemoryError`, `DeviceError` and `IoError` are `OSError`s.
//!
//! State: one class object per kind, made once when the module is loaded (`register`) and
//! read under the GIL. Invariant: every engine error maps to exactly one class; the match
//! below is exhaustive on purpose, so a new engine error does not compile until it is given
//! one (as in the C API's status codes).

use pyo3::create_exception;
use pyo3::exceptions::{PyException, PyMemoryError, PyOSError, PyValueError};
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::{PyDict, PyTuple, PyType};

create_exception!(uswap, Error, PyException, "Base class of every uswap error; the message is the engine's.");

/// The kinds of failure Python can tell apart, each a class of its own.
#[derive(Clone, Copy, Debug)]
pub enum Kind {
    Userfaultfd,
    InvalidArgument,
    OutOfMemory,
    Device,
    Limit,
    SignalMode,
    Io,
}

const KINDS: [Kind; 7] = [
    Kind::Userfaultfd,
    Kind::InvalidArgument,
    Kind::OutOfMemory,
    Kind::Device,
    Kind::Limit,
    Kind::SignalMode,
    Kind::Io,
];

static CLASSES: [PyOnceLock<Py<PyType>>; 7] = [const { PyOnceLock::new() }; 7];

impl Kind {
    fn name(self) -> &'static str {
        match self {
            Kind::Userfaultfd => "UserfaultfdError",
            Kind::InvalidArgument => "InvalidArgumentError",
            Kind::OutOfMemory => "OutOfMemoryError",
            Kind::Device => "DeviceError",
            Kind::Limit => "LimitError",
            Kind::SignalMode => "SignalModeError",
            Kind::Io => "IoError",
        }
    }

    fn doc(self) -> &'static str {
        match self {
            Kind::Userfaultfd => {
                "userfaultfd cannot be used here: no permission to open one, or the kernel lacks it or UFFDIO_MOVE."
            }
            Kind::InvalidArgument => {
                "A bad argument (also a ValueError): a size that does not parse or is out of range, a device \
                 list that does not parse, a limit below the minimum; or a call this process cannot make (a \
                 pager under `uswap run`, a fork child's call on its parent's pager)."
            }
            Kind::OutOfMemory => {
                "Out of address space, or every region slot of the process is in use (also a MemoryError)."
            }
            Kind::Device => "A swap device could not be opened, or failed (also an OSError).",
            Kind::Limit => {
                "A lower resident limit could not be reached (devices full, or every page busy); the new limit \
                 is in place."
            }
            Kind::SignalMode => {
                "Signal fault mode cannot serve faults here: SIGBUS is blocked, or its handler was replaced."
            }
            Kind::Io => "A system call failed; the message names it and the reason (also an OSError).",
        }
    }

    /// Python's own class this kind also is, if any.
    fn builtin_base(self, py: Python<'_>) -> Option<Bound<'_, PyType>> {
        match self {
            Kind::InvalidArgument => Some(py.get_type::<PyValueError>()),
            Kind::OutOfMemory => Some(py.get_type::<PyMemoryError>()),
            Kind::Device | Kind::Io => Some(py.get_type::<PyOSError>()),
            Kind::Userfaultfd | Kind::Limit | Kind::SignalMode => None,
        }
    }

    /// Makes the class: `class Name(Error[, builtin]): "doc"`, in module `uswap`.
    fn make_class(self, py: Python<'_>) -> PyResult<Py<PyType>> {
        let mut bases = vec![py.get_type::<Error>()];
        bases.extend(self.builtin_base(py));
        let namespace = PyDict::new(py);
        namespace.set_item("__doc__", self.doc())?;
        namespace.set_item("__module__", "uswap")?;
        let class = py.get_type::<PyType>().call1((self.name(), PyTuple::new(py, bases)?, namespace))?;
        Ok(class.cast_into::<PyType>()?.unbind())
    }

    /// The exception of this kind with `msg`. Falls back to `uswap.Error` only if the module
    /// was never registered, which cannot happen for an error raised through it.
    pub fn err(self, msg: impl Into<String>) -> PyErr {
        let msg = msg.into();
        Python::attach(|py| match CLASSES[self as usize].get(py) {
            Some(class) => PyErr::from_type(class.bind(py).clone(), msg),
            None => Error::new_err(msg),
        })
    }
}

/// The Python exception for an engine error, with the engine's message.
pub fn to_py(e: uswap::Error) -> PyErr {
    use uswap::ErrorKind::*;
    let kind = match e.kind() {
        Permission | Unsupported => Kind::Userfaultfd,
        InvalidArgument => Kind::InvalidArgument,
        OutOfMemory => Kind::OutOfMemory,
        Device => Kind::Device,
        LimitNotReached | LimitBusy => Kind::Limit,
        Signal => Kind::SignalMode,
        Io => Kind::Io,
    };
    kind.err(e.to_string())
}

/// Shorthand for the error most calls raise.
pub fn invalid_argument(msg: impl Into<String>) -> PyErr {
    Kind::InvalidArgument.err(msg)
}

/// Makes the exception classes and adds them to the module.
pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    let py = m.py();
    m.add("Error", py.get_type::<Error>())?;
    for kind in KINDS {
        let class = CLASSES[kind as usize].get_or_try_init(py, || kind.make_class(py))?;
        m.add(kind.name(), class.bind(py))?;
    }
    Ok(())
}
