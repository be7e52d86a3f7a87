//! `uswap.Region`: a managed region as a Python object exporting the buffer protocol.
//!
//! Views (memoryviews, numpy arrays made with `np.frombuffer`) point straight into the
//! region's memory, so the region must stay mapped while any view exists. Each exported
//! buffer holds a reference to the Python object (the buffer's `obj`), so the object, and with
//! it the mapping, lives until the last view is released: dropping every reference unmaps
//! the region. `release()` unmaps it at once and refuses, with `BufferError`, while views are
//! exported, as `memoryview.release()` and `mmap.close()` do.
//!
//! The engine's handle of the region is in its pager's table (`pager_cell`), where a fork
//! child puts its own pager's in its place; the object holds the table and the region's key
//! there, and asks the table where the region is (it follows the program's own `mremap`).
//!
//! Locking: the object is only touched with the GIL held (or Python's per-object lock on a
//! free-threaded build); `exports` is atomic because `__releasebuffer__` takes `&self`.
//! Invariants: `open` while the region is mapped (the table holds it at `key`); `exports`
//! counts buffers handed out and not yet released, and `release()` only unmaps when it is
//! zero.

use std::ffi::c_int;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use pyo3::exceptions::{PyBufferError, PyValueError};
use pyo3::ffi;
use pyo3::prelude::*;

use crate::pager_cell::{Owner, PagerCell};

/// A managed memory region, zero-filled at first, paged by its pager.
#[pyclass(module = "uswap", name = "Region")]
pub struct PyRegion {
    cell: Arc<PagerCell>,
    /// The region's key in the cell's table (see `pager_cell`).
    key: usize,
    len_bytes: usize,
    open: bool,
    exports: AtomicUsize,
}

impl PyRegion {
    /// The object for the region `cell` mapped under `key` (`len_bytes`, whole pages).
    pub fn new(cell: Arc<PagerCell>, key: usize, len_bytes: usize) -> PyRegion {
        PyRegion { cell, key, len_bytes, open: true, exports: AtomicUsize::new(0) }
    }

    /// Where the region is now.
    fn start(&self) -> PyResult<usize> {
        self.check_open()?;
        self.cell.start_of(self.key).ok_or_else(|| PyValueError::new_err("operation on a released uswap.Region"))
    }

    fn check_open(&self) -> PyResult<()> {
        if self.open {
            Ok(())
        } else {
            Err(PyValueError::new_err("operation on a released uswap.Region"))
        }
    }
}

impl Drop for PyRegion {
    fn drop(&mut self) {
        if std::mem::take(&mut self.open) {
            self.cell.unmap(self.key, Owner::Region);
        }
    }
}

#[pymethods]
impl PyRegion {
    /// # Safety
    ///
    /// `view` is the `Py_buffer` Python asks us to fill (valid for writes, per the protocol).
    unsafe fn __getbuffer__(slf: Bound<'_, Self>, view: *mut ffi::Py_buffer, flags: c_int) -> PyResult<()> {
        let (ptr, len) = {
            let this = slf.borrow();
            if !this.open {
                return Err(PyBufferError::new_err("cannot export a released uswap.Region"));
            }
            // A fork child's copy of a pager it did not re-arm: its pages that were out are
            // missing here, and a read of one killed the child with SIGSEGV.
            this.cell.check_owner().map_err(PyBufferError::new_err)?;
            let start = this.start().map_err(|e| PyBufferError::new_err(e.to_string()))?;
            (start as *mut u8, this.len_bytes)
        };
        let len = isize::try_from(len).map_err(|_| PyBufferError::new_err("region too large for a buffer"))?;
        // SAFETY: `view` is valid per the protocol; `ptr` is `len` mapped, writable bytes that
        // stay mapped while the buffer lives, because FillInfo stores a new reference to the
        // object in `view.obj` and the object unmaps only when it is dropped or released,
        // which `release` refuses while `exports` (incremented below) is nonzero.
        let rc = unsafe { ffi::PyBuffer_FillInfo(view, slf.as_ptr(), ptr.cast(), len, 0, flags) };
        if rc != 0 {
            return Err(PyErr::fetch(slf.py()));
        }
        slf.borrow().exports.fetch_add(1, Ordering::AcqRel);
        Ok(())
    }

    /// # Safety
    ///
    /// Called by Python once per buffer `__getbuffer__` filled.
    unsafe fn __releasebuffer__(&self, _view: *mut ffi::Py_buffer) {
        self.exports.fetch_sub(1, Ordering::AcqRel);
    }

    /// Unmaps the region now: its memory and swap space are freed. Raises `BufferError`
    /// while views of it are exported (delete the numpy arrays and memoryviews first).
    /// Releasing twice is allowed. Without it, the region is unmapped when the object and
    /// every view of it are gone.
    fn release(slf: &Bound<'_, Self>) -> PyResult<()> {
        let (cell, key) = {
            let mut this = slf.borrow_mut();
            let n = this.exports.load(Ordering::Acquire);
            if n > 0 {
                return Err(PyBufferError::new_err(format!(
                    "cannot release a uswap.Region with {n} exported buffer(s): numpy arrays or memoryviews still \
                     point into it; delete them (or call memoryview.release()) first"
                )));
            }
            if !std::mem::take(&mut this.open) {
                return Ok(());
            }
            (this.cell.clone(), this.key)
        };
        // Freeing a large region's swap slots takes a while; other threads may run, and
        // use the object meanwhile (it is released already: no borrow is held across).
        slf.py().detach(|| cell.unmap(key, Owner::Region));
        Ok(())
    }

    fn __enter__(slf: PyRef<'_, Self>) -> PyResult<PyRef<'_, Self>> {
        slf.check_open()?;
        Ok(slf)
    }

    /// Releases the region (see `release`); raises `BufferError` if views remain.
    fn __exit__(
        slf: &Bound<'_, Self>,
        _exc_type: Option<&Bound<'_, PyAny>>,
        _exc: Option<&Bound<'_, PyAny>>,
        _tb: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<bool> {
        Self::release(slf)?;
        Ok(false)
    }

    /// Length in bytes (the size asked for, rounded up to whole pages).
    fn __len__(&self) -> usize {
        self.len_bytes
    }

    /// Length in bytes (the size asked for, rounded up to whole pages).
    #[getter]
    fn nbytes(&self) -> usize {
        self.len_bytes
    }

    /// Whether `release()` was called.
    #[getter]
    fn released(&self) -> bool {
        !self.open
    }

    /// Address of the first byte (for ctypes and C extensions); raises `ValueError` once
    /// released.
    #[getter]
    fn address(&self) -> PyResult<usize> {
        self.start()
    }

    /// Pages of the region in RAM right now, measured with `mincore(2)`.
    fn mapped_pages(&self) -> PyResult<usize> {
        self.check_open()?;
        self.cell.check_owner().map_err(crate::errors::invalid_argument)?;
        match self.cell.mapped_pages(self.key) {
            Some(pages) => pages.map_err(|e| crate::errors::Kind::Io.err(format!("mincore: {e}"))),
            None => Err(PyValueError::new_err("operation on a released uswap.Region")),
        }
    }

    fn __repr__(&self) -> String {
        if self.open {
            format!("<uswap.Region {} bytes at {:#x}>", self.len_bytes, self.start().unwrap_or(self.key))
        } else {
            format!("<uswap.Region {} bytes, released>", self.len_bytes)
        }
    }
}
