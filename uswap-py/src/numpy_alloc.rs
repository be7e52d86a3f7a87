//! `pager.numpy()`: a NEP 49 data-memory handler that puts numpy's array data in managed
//! memory.
//!
//! numpy asks its *current handler* (a capsule named `mem_handler` holding a
//! `PyDataMem_Handler`, set per thread and per asyncio task through a context variable by
//! `PyDataMem_SetHandler`) for the data of every array it creates, and remembers in each
//! array which handler allocated it, so the array is freed through the same handler whenever
//! it dies, inside the `with` block or long after. Our handler:
//!
//! * serves a block of at least `threshold_bytes` as a region of its own (`Pager::map`):
//!   zero-filled without being touched (`np.zeros` costs nothing until written), freed with
//!   all its swap slots the moment numpy frees the array;
//! * serves smaller blocks, and large ones the engine refuses (out of region slots or
//!   address space; counted in `numpy_fallbacks`), with the C library's `malloc`, as numpy's
//!   default handler does;
//! * on `realloc`, moves a block between the two when its new size crosses the threshold
//!   (numpy grows arrays this way in `np.fromiter` and `np.loadtxt`).
//!
//! numpy's C API is reached at run time through its `_ARRAY_API` capsule, so numpy is needed
//! only by `pager.numpy()`, and any numpy >= 1.22 (the first with NEP 49) works.
//!
//! Locking: the blocks are in the pager's table (`pager_cell`, whose locking applies), never
//! locked across a copy. The handler's functions may be called from any thread, with or
//! without the GIL, and touch no Python object. Invariants: a pointer is a numpy block of the
//! table iff it is the start of a live region a handler of this pager mapped for numpy;
//! every other non-null pointer the handler is given came from the C library's allocator.
//! The capsule owns the handler (and so the pager's table); numpy keeps the capsule alive
//! while any array allocated through it lives.

use std::ffi::{c_char, c_uint, c_void, CStr};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use pyo3::exceptions::{PyImportError, PyRuntimeError};
use pyo3::ffi;
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::PyTuple;

use crate::pager_cell::{Owner, PagerCell};

/// Default smallest block served from managed memory: below it, an array is too small to
/// matter to the budget and a region of its own would cost more (a mapping, a registration
/// and a slot of the process's regions) than it saves.
pub const DEFAULT_THRESHOLD_BYTES: usize = 1 << 20;

/// numpy's capsule name for data-memory handlers (NEP 49).
const HANDLER_CAPSULE_NAME: &CStr = c"mem_handler";
/// Indices in numpy's C-API table (`__multiarray_api.h`, stable across numpy 1.22 to 2.x).
const API_GET_FEATURE_VERSION: usize = 211;
const API_SET_HANDLER: usize = 304;
/// `NPY_1_22_API_VERSION`: the first C-API feature version with `PyDataMem_SetHandler`.
const NPY_1_22_API_VERSION: c_uint = 0x0f;

/// numpy's `PyDataMemAllocator` (version 1).
#[repr(C)]
struct DataMemAllocator {
    ctx: *mut c_void,
    malloc: unsafe extern "C" fn(*mut c_void, usize) -> *mut c_void,
    calloc: unsafe extern "C" fn(*mut c_void, usize, usize) -> *mut c_void,
    realloc: unsafe extern "C" fn(*mut c_void, *mut c_void, usize) -> *mut c_void,
    free: unsafe extern "C" fn(*mut c_void, *mut c_void, usize),
}

/// numpy's `PyDataMem_Handler`.
#[repr(C)]
struct DataMemHandler {
    name: [c_char; 127],
    version: u8,
    allocator: DataMemAllocator,
}

/// Counters of a pager's numpy handlers (all of them), reported by `pager.stats()`.
#[derive(Debug, Default)]
pub struct Counters {
    /// Blocks in managed memory now.
    pub blocks: AtomicU64,
    /// Their bytes (whole pages).
    pub bytes: AtomicU64,
    /// Blocks ever placed in managed memory.
    pub allocs: AtomicU64,
    /// Blocks at or above the threshold that the engine refused (out of region slots or
    /// address space) and the C library's malloc served instead.
    pub fallbacks: AtomicU64,
}

/// The state behind one handler: the pager whose table holds its managed blocks.
struct ManagedHeap {
    cell: Arc<PagerCell>,
    threshold_bytes: usize,
    counters: Arc<Counters>,
}

impl ManagedHeap {
    /// A managed block of `size` bytes (zero-filled), or `None` if the engine refused one.
    fn map(&self, size: usize) -> Option<*mut c_void> {
        match self.cell.map(size, Owner::Numpy) {
            // numpy frees a block by its address: one keyed elsewhere (a region the program
            // moved away from there still has the key) could not be found again.
            Ok((key, start, _)) if key != start => {
                self.cell.unmap(key, Owner::Numpy);
                self.counters.fallbacks.fetch_add(1, Ordering::Relaxed);
                None
            }
            Ok((_, start, len)) => {
                self.counters.blocks.fetch_add(1, Ordering::Relaxed);
                self.counters.bytes.fetch_add(len as u64, Ordering::Relaxed);
                self.counters.allocs.fetch_add(1, Ordering::Relaxed);
                Some(start as *mut c_void)
            }
            Err(_) => {
                self.counters.fallbacks.fetch_add(1, Ordering::Relaxed);
                None
            }
        }
    }

    fn alloc(&self, size: usize, zeroed: bool) -> *mut c_void {
        if size >= self.threshold_bytes && size > 0 {
            if let Some(p) = self.map(size) {
                return p;
            }
        }
        let size = size.max(1);
        if zeroed {
            // SAFETY: plain C library allocation; the block is this handler's to hand out.
            unsafe { libc::calloc(1, size) }
        } else {
            // SAFETY: as above.
            unsafe { libc::malloc(size) }
        }
    }

    /// Length of the managed block at `p`, if `p` is one.
    fn managed_len(&self, p: *mut c_void) -> Option<usize> {
        self.cell.len_of(p as usize, Owner::Numpy)
    }

    /// Frees `p`, a block of this handler (or null).
    fn free(&self, p: *mut c_void) {
        if p.is_null() {
            return;
        }
        match self.cell.unmap(p as usize, Owner::Numpy) {
            Some(len) => {
                self.counters.blocks.fetch_sub(1, Ordering::Relaxed);
                self.counters.bytes.fetch_sub(len as u64, Ordering::Relaxed);
            }
            // SAFETY: not managed, so the C library's (module invariant).
            None => unsafe { libc::free(p) },
        }
    }

    fn realloc(&self, p: *mut c_void, new_size: usize) -> *mut c_void {
        if p.is_null() {
            return self.alloc(new_size, false);
        }
        let new_size = new_size.max(1);
        let old_size = match self.managed_len(p) {
            // Shrinking by less than half stays in place (the region keeps its pages).
            Some(len) if new_size <= len && new_size > len / 2 => return p,
            Some(len) => len,
            // SAFETY: not managed, so a live block of the C library's (module invariant).
            None if new_size < self.threshold_bytes => return unsafe { libc::realloc(p, new_size) },
            // SAFETY: as above.
            None => unsafe { libc::malloc_usable_size(p) },
        };
        let n = self.alloc(new_size, false);
        if n.is_null() {
            return n; // the old block stays valid, as realloc(3) leaves it
        }
        // SAFETY: `p` is valid for `old_size` bytes (a whole region, or the C library's usable
        // size), `n` for `new_size`; they are distinct live blocks. Reading a managed block
        // may fault pages back in, which the engine serves on any thread.
        unsafe { std::ptr::copy_nonoverlapping(p as *const u8, n as *mut u8, old_size.min(new_size)) };
        self.free(p);
        n
    }
}

/// Runs `f`, turning a panic into `fallback`: no unwinding may cross into numpy.
fn no_unwind<T>(fallback: T, f: impl FnOnce() -> T) -> T {
    catch_unwind(AssertUnwindSafe(f)).unwrap_or(fallback)
}

/// # Safety
///
/// `ctx` is the `ManagedHeap` of a live handler (numpy passes back the ctx we gave it, and
/// holds the capsule that owns it while it calls).
unsafe fn heap<'a>(ctx: *mut c_void) -> &'a ManagedHeap {
    // SAFETY: the caller's contract.
    unsafe { &*(ctx as *const ManagedHeap) }
}

unsafe extern "C" fn handler_malloc(ctx: *mut c_void, size: usize) -> *mut c_void {
    // SAFETY: numpy passes the ctx of the handler it calls.
    no_unwind(std::ptr::null_mut(), || unsafe { heap(ctx) }.alloc(size, false))
}

unsafe extern "C" fn handler_calloc(ctx: *mut c_void, nelem: usize, elsize: usize) -> *mut c_void {
    no_unwind(std::ptr::null_mut(), || match nelem.checked_mul(elsize) {
        // SAFETY: as handler_malloc.
        Some(size) => unsafe { heap(ctx) }.alloc(size, true),
        None => std::ptr::null_mut(),
    })
}

unsafe extern "C" fn handler_realloc(ctx: *mut c_void, p: *mut c_void, new_size: usize) -> *mut c_void {
    // SAFETY: as handler_malloc; `p` is null or a block of this handler (numpy frees and
    // reallocates an array's data through the handler that allocated it).
    no_unwind(std::ptr::null_mut(), || unsafe { heap(ctx) }.realloc(p, new_size))
}

unsafe extern "C" fn handler_free(ctx: *mut c_void, p: *mut c_void, _size: usize) {
    // SAFETY: as handler_realloc.
    no_unwind((), || unsafe { heap(ctx) }.free(p))
}

/// What the capsule owns: the handler numpy reads, then the state its ctx points to.
#[repr(C)]
struct HandlerBox {
    handler: DataMemHandler,
    heap: ManagedHeap,
}

unsafe extern "C" fn destroy_handler(capsule: *mut ffi::PyObject) {
    // SAFETY: called once by Python when the capsule dies; its pointer is the Box made in
    // `new_handler_capsule`, and nothing uses the handler afterwards (numpy holds the capsule
    // while any array it allocated lives, and the context variable holds it while current).
    unsafe {
        let p = ffi::PyCapsule_GetPointer(capsule, HANDLER_CAPSULE_NAME.as_ptr());
        if !p.is_null() {
            drop(Box::from_raw(p as *mut HandlerBox));
        }
    }
}

fn new_handler_capsule(py: Python<'_>, heap: ManagedHeap) -> PyResult<Py<PyAny>> {
    let mut name = [0 as c_char; 127];
    for (dst, src) in name.iter_mut().zip(c"uswap".to_bytes()) {
        *dst = *src as c_char;
    }
    let raw = Box::into_raw(Box::new(HandlerBox {
        handler: DataMemHandler {
            name,
            version: 1,
            allocator: DataMemAllocator {
                ctx: std::ptr::null_mut(),
                malloc: handler_malloc,
                calloc: handler_calloc,
                realloc: handler_realloc,
                free: handler_free,
            },
        },
        heap,
    }));
    // SAFETY: `raw` is the live, unaliased box just made; the ctx numpy passes back points
    // into it, which stays put until the capsule frees it.
    unsafe { (*raw).handler.allocator.ctx = (&raw mut (*raw).heap).cast() };
    // SAFETY: `raw` is a live HandlerBox whose first field is the handler numpy reads; the
    // capsule owns it from here and `destroy_handler` frees it.
    let capsule = unsafe { ffi::PyCapsule_New(raw.cast(), HANDLER_CAPSULE_NAME.as_ptr(), Some(destroy_handler)) };
    if capsule.is_null() {
        // SAFETY: the capsule was not made, so the box is still ours.
        drop(unsafe { Box::from_raw(raw) });
        return Err(PyErr::fetch(py));
    }
    // SAFETY: PyCapsule_New returned a new reference.
    Ok(unsafe { Bound::from_owned_ptr(py, capsule) }.unbind())
}

type SetHandlerFn = unsafe extern "C" fn(*mut ffi::PyObject) -> *mut ffi::PyObject;

/// numpy's `PyDataMem_SetHandler`, importing numpy if needed.
fn numpy_set_handler(py: Python<'_>) -> PyResult<SetHandlerFn> {
    let module = py
        .import("numpy._core._multiarray_umath")
        .or_else(|_| py.import("numpy.core._multiarray_umath"))
        .map_err(|e| PyImportError::new_err(format!("pager.numpy() needs numpy >= 1.22 (pip install numpy): {e}")))?;
    let api = module.getattr("_ARRAY_API")?;
    // SAFETY: `api` is a live object; PyCapsule_GetPointer checks that it is a capsule with
    // no name (numpy's) and sets an exception otherwise.
    let table = unsafe { ffi::PyCapsule_GetPointer(api.as_ptr(), std::ptr::null()) } as *const *const c_void;
    if table.is_null() {
        return Err(PyErr::take(py).unwrap_or_else(|| PyRuntimeError::new_err("numpy's _ARRAY_API is empty")));
    }
    // SAFETY: numpy's C-API table lives as long as numpy (never unloaded); entry 211 has been
    // `unsigned int PyArray_GetNDArrayCFeatureVersion(void)` since numpy 1.4.
    let feature_version = unsafe {
        let f: unsafe extern "C" fn() -> c_uint = std::mem::transmute(*table.add(API_GET_FEATURE_VERSION));
        f()
    };
    if feature_version < NPY_1_22_API_VERSION {
        return Err(PyImportError::new_err(format!(
            "pager.numpy() needs numpy >= 1.22 (NEP 49 data-memory handlers); this numpy's C API is version \
             {feature_version:#x}: pip install -U numpy"
        )));
    }
    // SAFETY: with feature version >= 1.22, entry 304 is `PyObject *PyDataMem_SetHandler(PyObject *)`.
    Ok(unsafe { std::mem::transmute::<*const c_void, SetHandlerFn>(*table.add(API_SET_HANDLER)) })
}

/// Makes numpy's array data go to managed memory inside a `with` block.
///
/// Entering installs the handler for the current thread (and asyncio task); leaving puts
/// back the one that was current. Arrays allocated inside keep living in managed memory
/// after the block, and are freed through the pager whenever numpy frees them. Blocks of
/// at least `threshold` bytes are managed; smaller ones use the C library's malloc.
#[pyclass(module = "uswap", name = "NumpyAllocator")]
pub struct NumpyAllocator {
    cell: Arc<PagerCell>,
    threshold_bytes: usize,
    counters: Arc<Counters>,
    /// Our handler capsule, made on first entry.
    capsule: Option<Py<PyAny>>,
}

impl NumpyAllocator {
    pub fn new(cell: Arc<PagerCell>, threshold_bytes: usize, counters: Arc<Counters>) -> NumpyAllocator {
        NumpyAllocator { cell, threshold_bytes, counters, capsule: None }
    }
}

/// The handlers that were current at each (nested) entry of any `NumpyAllocator`, innermost
/// last, each with the allocator entered: a tuple of `(allocator, previous handler)` pairs
/// in a context variable of its own. numpy keeps its current handler in a context variable,
/// so each thread and each asyncio task has its own; the saved ones must follow the same
/// contexts. Kept per thread, two tasks on one thread popped each other's entries and one
/// went on allocating into a pager it had never entered.
fn saved_handlers(py: Python<'_>) -> PyResult<&Bound<'_, PyAny>> {
    static VAR: PyOnceLock<Py<PyAny>> = PyOnceLock::new();
    VAR.get_or_try_init(py, || {
        let var = py.import("contextvars")?.getattr("ContextVar")?.call1(("uswap_numpy_saved_handlers",))?;
        Ok::<_, PyErr>(var.unbind())
    })
    .map(|v| v.bind(py))
}

/// The context's saved handlers (see [`saved_handlers`]).
fn saved_in_context<'py>(var: &Bound<'py, PyAny>) -> PyResult<Bound<'py, PyTuple>> {
    Ok(var.call_method1("get", (PyTuple::empty(var.py()),))?.cast_into::<PyTuple>()?)
}

/// Calls `set` with `handler` and returns the handler it replaced.
fn swap_handler(py: Python<'_>, set: SetHandlerFn, handler: &Py<PyAny>) -> PyResult<Py<PyAny>> {
    // SAFETY: `handler` is a live `mem_handler` capsule (ours, or one numpy returned); the
    // GIL is held; SetHandler returns a new reference to the previous handler, or NULL with
    // an exception set.
    let old = unsafe { set(handler.as_ptr()) };
    if old.is_null() {
        return Err(PyErr::take(py).unwrap_or_else(|| PyRuntimeError::new_err("PyDataMem_SetHandler failed")));
    }
    // SAFETY: a new reference (see above).
    Ok(unsafe { Bound::from_owned_ptr(py, old) }.unbind())
}

#[pymethods]
impl NumpyAllocator {
    /// Makes this allocator numpy's handler in this thread or task, saving the one it
    /// replaces for `__exit__`.
    fn __enter__<'py>(slf: Bound<'py, Self>) -> PyResult<Bound<'py, Self>> {
        let py = slf.py();
        let set = numpy_set_handler(py)?;
        let capsule = {
            let mut this = slf.borrow_mut();
            match &this.capsule {
                Some(c) => c.clone_ref(py),
                None => {
                    let heap = ManagedHeap {
                        cell: this.cell.clone(),
                        threshold_bytes: this.threshold_bytes,
                        counters: this.counters.clone(),
                    };
                    let c = new_handler_capsule(py, heap)?;
                    this.capsule = Some(c.clone_ref(py));
                    c
                }
            }
        };
        let var = saved_handlers(py)?;
        let saved = saved_in_context(var)?;
        let old = swap_handler(py, set, &capsule)?;
        let mut entries: Vec<Bound<'py, PyAny>> = saved.iter().collect();
        entries.push(PyTuple::new(py, [slf.as_any(), old.bind(py)])?.into_any());
        var.call_method1("set", (PyTuple::new(py, entries)?,))?;
        Ok(slf)
    }

    /// Puts back the handler that was current when this allocator was entered, in this
    /// thread or task; the innermost entry must be this allocator's (exits in the reverse
    /// order of entries, as `with` blocks do).
    fn __exit__(
        slf: &Bound<'_, Self>,
        _exc_type: Option<&Bound<'_, PyAny>>,
        _exc: Option<&Bound<'_, PyAny>>,
        _tb: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<bool> {
        let py = slf.py();
        let var = saved_handlers(py)?;
        let saved = saved_in_context(var)?;
        let innermost = saved.len().checked_sub(1).map(|i| saved.get_item(i)).transpose()?;
        let Some(entry) = innermost else {
            return Err(PyRuntimeError::new_err(
                "NumpyAllocator.__exit__ without a matching __enter__ in this thread or task",
            ));
        };
        if !entry.get_item(0)?.is(slf) {
            return Err(PyRuntimeError::new_err(
                "NumpyAllocator.__exit__ out of order: another allocator entered after this one is still entered in \
                 this thread or task; exit it first (with blocks do)",
            ));
        }
        let set = numpy_set_handler(py)?;
        swap_handler(py, set, &entry.get_item(1)?.unbind())?;
        var.call_method1("set", (saved.get_slice(0, saved.len() - 1),))?;
        Ok(false)
    }

    /// The smallest block, in bytes, placed in managed memory.
    #[getter]
    fn threshold(&self) -> usize {
        self.threshold_bytes
    }
}
