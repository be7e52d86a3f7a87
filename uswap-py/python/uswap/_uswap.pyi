"""Type stubs for uswap's native module (re-exported by ``uswap``)."""

from types import TracebackType
from typing import Any, Dict, Literal, Optional, Type, Union

Size = Union[int, str]
"""A size: an int of bytes, or a string such as ``"2GiB"``, ``"512MiB"``, ``"1.5G"``."""

PAGE_SIZE: int
"""The page size uswap works in, in bytes."""
MIN_LIMIT_BYTES: int
"""The smallest resident limit a pager accepts, in bytes."""
DEFAULT_NUMPY_THRESHOLD: int
"""Default smallest numpy block placed in managed memory by ``Pager.numpy()`` (1 MiB)."""

class Error(Exception):
    """Base class of every uswap error; the message is the engine's."""

class UserfaultfdError(Error):
    """userfaultfd cannot be used: no permission, or the kernel lacks it or UFFDIO_MOVE."""

class InvalidArgumentError(Error, ValueError):
    """Also a ``ValueError``. A size or device list that does not parse, a limit below the minimum, a zero size; or a
    call this process cannot make (a pager under ``uswap run``, a fork child's call on its
    parent's pager)."""

class OutOfMemoryError(Error, MemoryError):
    """Out of address space, or every region slot of the process (65,536) is in use. Also a
    ``MemoryError``."""

class DeviceError(Error, OSError):
    """A swap device could not be opened, or failed. Also an ``OSError``."""

class LimitError(Error):
    """A lower limit could not be reached (devices full, pages busy); it is in place anyway."""

class SignalModeError(Error):
    """Signal fault mode cannot serve faults: SIGBUS blocked or its handler replaced."""

class IoError(Error, OSError):
    """A system call failed. Also an ``OSError``."""

class Region:
    """A managed memory region, zero-filled at first, paged by its pager.

    Supports the buffer protocol (writable, zero-copy). Unmapped when the object and every
    view of it are gone, or by ``release()``, which raises ``BufferError`` while views exist.
    """

    def release(self) -> None:
        """Unmaps the region now; raises ``BufferError`` while views of it are exported."""
    def __enter__(self) -> "Region": ...
    def __exit__(
        self,
        exc_type: Optional[Type[BaseException]],
        exc: Optional[BaseException],
        tb: Optional[TracebackType],
    ) -> bool: ...
    def __len__(self) -> int: ...
    def __buffer__(self, flags: int) -> memoryview: ...
    @property
    def nbytes(self) -> int:
        """Length in bytes (whole pages)."""
    @property
    def released(self) -> bool:
        """Whether ``release()`` was called."""
    @property
    def address(self) -> int:
        """Address of the first byte; ``ValueError`` once released."""
    def mapped_pages(self) -> int:
        """Pages of the region in RAM now, measured with ``mincore(2)``."""

class NumpyAllocator:
    """Context manager from ``Pager.numpy()``: numpy array data goes to managed memory inside.

    Applies to the thread (and asyncio task) that enters it. Arrays allocated inside stay
    valid after the block and are freed through the pager when numpy frees them.
    """

    def __enter__(self) -> "NumpyAllocator": ...
    def __exit__(
        self,
        exc_type: Optional[Type[BaseException]],
        exc: Optional[BaseException],
        tb: Optional[TracebackType],
    ) -> bool: ...
    @property
    def threshold(self) -> int:
        """The smallest block, in bytes, placed in managed memory."""

class Pager:
    """A user-space swap engine: managed memory capped at ``limit`` resident bytes.

    ``devices`` is a comma-separated list, highest priority first: ``ram[:SIZE]``,
    ``zpool[:SIZE][:lz4|zstd|zstd-LEVEL][:raw|reject]``, ``file:PATH[:SIZE]``; a device
    without a size gets ``device_size`` (default: half the RAM). ``fault_mode`` is
    ``"thread"`` (default) or ``"signal"``. ``syscall_guard=True``: in signal mode, system
    calls on managed memory that is out (``recv_into``, ``readinto``) bring it in first
    instead of failing with ``EFAULT``; the first pager asking for it must be made while the
    process has one thread.

    A child made by ``fork()`` (``os.fork``, ``multiprocessing``'s ``fork`` start method)
    inherits the regions of one pager, the first made while no other such pager lives and not
    on a named swap file or a block device (``regions_survive_fork``): it reads every byte and pages them under a pager of its own,
    with the same arguments. The regions of any other pager are not in the child.
    """

    def __init__(
        self,
        limit: Size,
        devices: str = "zpool",
        fault_mode: Literal["thread", "signal"] = "thread",
        *,
        device_size: Optional[Size] = None,
        handler_threads: Optional[int] = None,
        readahead: bool = True,
        auto: Optional[Union[float, str]] = None,
        idle_age: Optional[Union[float, str]] = None,
        syscall_guard: bool = False,
    ) -> None: ...
    def map(self, size: Size) -> Region:
        """Maps a zero-filled managed region of ``size`` bytes (rounded up to pages)."""
    def numpy(self, threshold: Optional[Size] = None) -> NumpyAllocator:
        """Context manager putting numpy arrays of at least ``threshold`` bytes (default 1 MiB) in managed memory."""
    def stats(self) -> Dict[str, Any]:
        """The counters, under the names ``uswap bench`` and ``uswap stat`` use, plus ``numpy_*``."""
    def set_limit(self, limit: Size) -> None:
        """Changes the resident limit; a lower one is reached before this returns."""
    @property
    def limit(self) -> int:
        """The resident limit in bytes."""
    @property
    def fault_mode(self) -> Literal["thread", "signal"]:
        """``"thread"`` or ``"signal"``."""
    @property
    def regions_survive_fork(self) -> bool:
        """Whether ``fork()`` children inherit this pager's regions (see the class doc)."""
    @property
    def stats_socket(self) -> Optional[str]:
        """The abstract unix socket ``uswap stat`` reads, or None."""
