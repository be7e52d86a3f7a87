"""uswap: user-space swap for Python.

A :class:`Pager` caps the resident size of the memory it manages and pages the rest out to
swap devices (a compressed pool in RAM, files), through userfaultfd:

* ``pager.map(n)`` gives a managed region that supports the buffer protocol
  (``np.frombuffer(region, dtype=...)``, ``memoryview(region)``), zero-copy and writable;
* ``with pager.numpy():`` makes numpy allocate array data in managed memory (NEP 49);
* ``pager.stats()`` returns the counters under the names ``uswap bench`` prints;
* ``pager.set_limit("1GiB")`` changes the budget at once.

Errors are :class:`Error` subclasses carrying the engine's message. Needs Linux >= 6.8; thread
mode (the default) needs permission to open a userfaultfd (root, ``CAP_SYS_PTRACE``,
``vm.unprivileged_userfaultfd=1``, or access to ``/dev/userfaultfd``), ``fault_mode="signal"``
does not.
"""

from ._uswap import (
    DEFAULT_NUMPY_THRESHOLD,
    MIN_LIMIT_BYTES,
    PAGE_SIZE,
    DeviceError,
    Error,
    InvalidArgumentError,
    IoError,
    LimitError,
    NumpyAllocator,
    OutOfMemoryError,
    Pager,
    Region,
    SignalModeError,
    UserfaultfdError,
)

__all__ = [
    "DEFAULT_NUMPY_THRESHOLD",
    "MIN_LIMIT_BYTES",
    "PAGE_SIZE",
    "DeviceError",
    "Error",
    "InvalidArgumentError",
    "IoError",
    "LimitError",
    "NumpyAllocator",
    "OutOfMemoryError",
    "Pager",
    "Region",
    "SignalModeError",
    "UserfaultfdError",
]
