//! The `uswap` Python package's native module (`uswap._uswap`): pagers, regions that export
//! the buffer protocol, and a numpy data-memory handler (NEP 49), over the engine crate.
//!
//! Python objects hold a pager's cell (`pager_cell`: its `uswap::Pager` and the handles of
//! its regions, which a fork child replaces with its own, `fork`), and a `Region` holds the
//! cell too, so a pager outlives its regions whatever order Python frees them in. The GIL is
//! released around engine work that can take long (building a pager, mapping, releasing a region,
//! lowering the limit); faults never need it, since in thread mode they are served by the
//! engine's own threads.
//!
//! Locking: none of its own beyond what each module states (`pager_cell`'s tables).
//! Invariant: engine errors reach Python only as `uswap.Error` subclasses carrying the
//! engine's message (`errors`).

mod errors;
mod fork;
mod numpy_alloc;
mod pager_cell;
mod region;

use std::sync::atomic::Ordering;
use std::sync::Arc;

use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList, PyString};

use crate::errors::{invalid_argument, to_py};
use crate::numpy_alloc::{Counters, NumpyAllocator, DEFAULT_THRESHOLD_BYTES};
use crate::pager_cell::{Owner, PagerCell};
use crate::region::PyRegion;

/// A size argument: an int of bytes, or a string such as `"2GiB"`, `"512MiB"`, `"1.5G"`.
fn size_arg(value: &Bound<'_, PyAny>, what: &str) -> PyResult<u64> {
    if value.is_instance_of::<pyo3::types::PyBool>() {
        return Err(invalid_argument(format!(
            "{what}: expected a size (an int or a string such as \"2GiB\"), got a bool"
        )));
    }
    if let Ok(s) = value.cast::<PyString>() {
        let s = s.to_str()?;
        return uswap::parse_size(s).map_err(|e| invalid_argument(format!("{what} {s:?}: {e}")));
    }
    if let Ok(n) = value.extract::<i128>() {
        return u64::try_from(n).map_err(|_| {
            invalid_argument(if n < 0 {
                format!("{what}: {n} bytes: a size cannot be negative")
            } else {
                format!("{what}: {n} bytes is more than any machine's memory (at most {} bytes)", u64::MAX)
            })
        });
    }
    Err(invalid_argument(format!(
        "{what}: expected a size (an int of bytes or a string such as \"2GiB\"), got {}",
        value.get_type().name()?
    )))
}

/// `auto=`: a share of wall time (`0.01`) or a string as `uswap run --auto=` takes it (`"1%"`).
fn auto_arg(value: &Bound<'_, PyAny>) -> PyResult<f64> {
    if let Ok(s) = value.cast::<PyString>() {
        return uswap::budget::parse_target(s.to_str()?).map_err(|e| invalid_argument(format!("auto: {e}")));
    }
    match value.extract::<f64>() {
        Ok(share) if !value.is_instance_of::<pyo3::types::PyBool>() => Ok(share),
        _ => Err(invalid_argument(format!(
            "auto: expected a share of wall time (0.01) or a string such as \"1%\", got {}",
            value.get_type().name()?
        ))),
    }
}

/// `idle_age=`: seconds (`120`, `float("inf")` to only count idle pages, `0` off) or a string
/// as `uswap run --idle-age` takes it (`"90s"`, `"2m"`, `"never"`, `"off"`).
fn idle_age_arg(value: &Bound<'_, PyAny>) -> PyResult<uswap::IdleAging> {
    if let Ok(s) = value.cast::<PyString>() {
        return uswap::IdleAging::parse(s.to_str()?).map_err(|e| invalid_argument(format!("idle_age: {e}")));
    }
    let secs = match value.extract::<f64>() {
        Ok(secs) if !value.is_instance_of::<pyo3::types::PyBool>() => secs,
        _ => {
            return Err(invalid_argument(format!(
                "idle_age: expected seconds or a string such as \"90s\", got {}",
                value.get_type().name()?
            )))
        }
    };
    uswap::IdleAging::from_secs(secs).ok_or_else(|| {
        invalid_argument(format!(
            "idle_age={secs}: expected seconds, from 1 to a year (31536000), float(\"inf\") to only count \
             idle pages, or 0 for off"
        ))
    })
}

/// `tier_age=`: seconds (`30`) or a string as `uswap run --tier-age` takes it (`"30s"`, `"2m"`).
fn tier_age_arg(value: &Bound<'_, PyAny>) -> PyResult<std::time::Duration> {
    if let Ok(s) = value.cast::<PyString>() {
        return uswap::parse_tier_age(s.to_str()?).map_err(|e| invalid_argument(format!("tier_age: {e}")));
    }
    let secs = value.extract::<f64>().ok().filter(|_| !value.is_instance_of::<pyo3::types::PyBool>());
    match secs.and_then(uswap::tier_age_from_secs) {
        Some(age) => Ok(age),
        None => Err(invalid_argument(format!(
            "tier_age: expected seconds from 1 to a year (31536000) or a string such as \"30s\", got {}",
            value.repr()?
        ))),
    }
}

/// A user-space swap engine: managed memory whose resident size is capped at `limit`,
/// paged through userfaultfd to the swap devices `devices`.
///
/// `limit` and sizes everywhere are ints (bytes) or strings such as `"2GiB"`. `devices` is
/// a comma-separated list, highest priority first, as `uswap bench --device` takes it:
/// `ram[:SIZE]`, `zpool[:SIZE][:lz4|zstd|zstd-LEVEL][:raw|reject][:unit=SIZE][:dict]`, `file:PATH[:SIZE]`
/// (PATH a directory, a file or a block device). A device given without a size gets
/// `device_size` (default: half the machine's RAM, as `uswap run`). `fault_mode` is
/// `"thread"` (default; faults inside system calls are served, which numpy and BLAS need) or
/// `"signal"`; `syscall_guard=True` makes signal mode's system calls (a socket's `recv_into`,
/// a file's `readinto`) on managed memory that is out bring it in first instead of failing
/// with `EFAULT`, if the first pager asking for it is made while the process has one thread
/// (see the Rust `PagerBuilder::syscall_guard`). `auto=0.01` moves the limit by itself to the smallest that keeps memory
/// stalls under 1 % of wall time (`limit` is then the ceiling; the `limit` property says where it is;
/// `stats()["stall"]` has the stall figures). `idle_age=120` (or `"2m"`) writes out pages
/// untouched for 120 s without waiting for the limit (`float("inf")` or `"never"`: only count them; `stats()["idle"]`
/// says how much memory has been untouched for 1 s, 10 s, 1 min and 10 min). `tier_age=30` (or
/// `"30s"`) moves pages out of RAM that long untouched down a tier (with
/// `devices="zpool,zpool:zstd-1"`, recompressed with zstd; see the Rust `PagerBuilder::tier_age`).
#[pyclass(module = "uswap", name = "Pager", frozen)]
struct PyPager {
    cell: Arc<PagerCell>,
    numpy: Arc<Counters>,
}

fn fault_mode_name(mode: uswap::FaultMode) -> &'static str {
    match mode {
        uswap::FaultMode::Thread => "thread",
        uswap::FaultMode::Signal => "signal",
    }
}

#[pymethods]
impl PyPager {
    #[new]
    // One parameter per Python keyword argument: the signature is the Python API.
    #[allow(clippy::too_many_arguments)]
    #[pyo3(signature = (limit, devices = "zpool", fault_mode = "thread", *, device_size = None, handler_threads = None, readahead = true, auto = None, idle_age = None, tier_age = None, syscall_guard = false))]
    fn new(
        py: Python<'_>,
        limit: &Bound<'_, PyAny>,
        devices: &str,
        fault_mode: &str,
        device_size: Option<&Bound<'_, PyAny>>,
        // Signed, so that a negative count is refused by us (InvalidArgumentError, a
        // ValueError) rather than by the conversion (a bare OverflowError).
        handler_threads: Option<i128>,
        readahead: bool,
        auto: Option<&Bound<'_, PyAny>>,
        idle_age: Option<&Bound<'_, PyAny>>,
        tier_age: Option<&Bound<'_, PyAny>>,
        syscall_guard: bool,
    ) -> PyResult<PyPager> {
        let limit_bytes = size_arg(limit, "limit")?;
        let device_bytes = match device_size {
            Some(v) => size_arg(v, "device_size")?,
            None => uswap::DeviceConfig::default_capacity_bytes(),
        };
        let mode = match fault_mode {
            "thread" => uswap::FaultMode::Thread,
            "signal" => uswap::FaultMode::Signal,
            other => {
                return Err(invalid_argument(format!(
                    "fault_mode {other:?}: expected \"thread\" (the default) or \"signal\""
                )))
            }
        };
        if let Some(n) = handler_threads.filter(|&n| n < 1) {
            return Err(invalid_argument(format!(
                "handler_threads={n} cannot serve faults; pass at least 1, or None for one per CPU"
            )));
        }
        let handler_threads = handler_threads.map(|n| usize::try_from(n).unwrap_or(usize::MAX));
        if let Some(n) = handler_threads.filter(|&n| n > uswap::MAX_HANDLER_THREADS) {
            return Err(invalid_argument(format!(
                "handler_threads={n}: a pager starts at most {}; pass fewer, or None for one per CPU",
                uswap::MAX_HANDLER_THREADS
            )));
        }
        let list = uswap::DeviceConfig::parse_list(devices, device_bytes).map_err(to_py)?;
        let mut builder = uswap::Pager::builder()
            .resident_limit(limit_bytes)
            .fault_mode(mode)
            .readahead(readahead)
            .syscall_guard(syscall_guard);
        if let Some(n) = handler_threads {
            builder = builder.handler_threads(n);
        }
        if let Some(target) = auto {
            // `auto=0.01` or `"1%"`: the limit moves by itself, `limit` its ceiling (see the
            // Rust `PagerBuilder::auto_budget`); a target out of range is refused by `build`.
            builder = builder.auto_budget(auto_arg(target)?);
        }
        if let Some(age) = idle_age {
            builder = builder.idle_aging(idle_age_arg(age)?);
        }
        if let Some(age) = tier_age {
            builder = builder.tier_age(tier_age_arg(age)?);
        }
        // A fork child opens devices of its own: not a named swap file or a block device, which
        // the parent's device holds exclusively (a directory gives each process a file of its own).
        let rearmable = list.iter().all(|d| d.file_path().is_none_or(std::path::Path::is_dir));
        for d in list {
            builder = builder.device(d);
        }
        // Opening file devices and starting the threads takes a while.
        let auto = auto.is_some();
        let cell = py.detach(move || fork::build(builder, auto, rearmable)).map_err(to_py)?;
        Ok(PyPager { cell, numpy: Arc::new(Counters::default()) })
    }

    /// Maps a managed region of `size` bytes (rounded up to whole pages), zero-filled. The
    /// region supports the buffer protocol (writable, zero-copy: `memoryview(r)`,
    /// `np.frombuffer(r, dtype=...)`) and is unmapped when it and every view of it are gone,
    /// or by `release()`.
    fn map(&self, py: Python<'_>, size: &Bound<'_, PyAny>) -> PyResult<PyRegion> {
        let bytes = size_arg(size, "size")?;
        let len = usize::try_from(bytes)
            .map_err(|_| invalid_argument(format!("size: {bytes} bytes does not fit this machine's address space")))?;
        let cell = &self.cell;
        cell.check_owner().map_err(invalid_argument)?;
        let (key, _, len) = py.detach(|| cell.map(len, Owner::Region)).map_err(to_py)?;
        Ok(PyRegion::new(cell.clone(), key, len))
    }

    /// A context manager that puts numpy's array data in managed memory while it is active:
    /// `with pager.numpy(): b = np.zeros(...)`. Arrays of at least `threshold` bytes (default
    /// 1 MiB) get a region each; smaller ones use the C library's malloc. Arrays stay valid
    /// after the block and are freed through the pager when numpy frees them. Applies to the
    /// thread (and asyncio task) that enters it. Needs numpy >= 1.22, imported on entry.
    #[pyo3(signature = (threshold = None))]
    fn numpy(&self, threshold: Option<&Bound<'_, PyAny>>) -> PyResult<NumpyAllocator> {
        let threshold_bytes = match threshold {
            Some(t) => usize::try_from(size_arg(t, "threshold")?).unwrap_or(usize::MAX),
            None => DEFAULT_THRESHOLD_BYTES,
        };
        Ok(NumpyAllocator::new(self.cell.clone(), threshold_bytes, self.numpy.clone()))
    }

    /// The pager's counters as a dict, under the names `uswap bench` and `uswap stat` use
    /// (`pswpin`, `pswpout`, `pgfault`, `resident_pages`, `limit_pages`, `devices`, ...),
    /// plus the numpy handler's: `numpy_blocks` and `numpy_bytes` (in managed memory now),
    /// `numpy_allocs` (ever), `numpy_fallbacks` (large blocks the engine refused, served by
    /// malloc).
    fn stats<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        // In a fork child whose pager this is not, the engine's tables are the parent's, partly
        // absent (`MADV_DONTFORK`), and its locks may have been held by its threads.
        self.cell.check_owner().map_err(invalid_argument)?;
        let stats = self.cell.pager().stats();
        let value = serde_json::to_value(&stats)
            .map_err(|e| errors::Kind::Io.err(format!("cannot serialize the counters: {e}")))?;
        let obj = json_to_py(py, &value)?;
        let dict = obj.cast_into::<PyDict>()?;
        let c = &self.numpy;
        dict.set_item("numpy_blocks", c.blocks.load(Ordering::Relaxed))?;
        dict.set_item("numpy_bytes", c.bytes.load(Ordering::Relaxed))?;
        dict.set_item("numpy_allocs", c.allocs.load(Ordering::Relaxed))?;
        dict.set_item("numpy_fallbacks", c.fallbacks.load(Ordering::Relaxed))?;
        Ok(dict)
    }

    /// Changes the resident limit (an int or a string such as `"1GiB"`). A lower limit takes
    /// effect at once: pages are swapped out before this returns (the GIL is released
    /// meanwhile). Raises `uswap.LimitError` if the devices are full or every page stays
    /// busy; the new limit is in place all the same.
    fn set_limit(&self, py: Python<'_>, limit: &Bound<'_, PyAny>) -> PyResult<()> {
        let bytes = size_arg(limit, "limit")?;
        self.cell.check_owner().map_err(invalid_argument)?;
        let pager = self.cell.pager();
        py.detach(|| pager.set_resident_limit(bytes)).map_err(to_py)
    }

    /// The resident limit in bytes.
    #[getter]
    fn limit(&self) -> u64 {
        self.cell.pager().resident_limit()
    }

    /// `"thread"` or `"signal"`.
    #[getter]
    fn fault_mode(&self) -> &'static str {
        fault_mode_name(self.cell.pager().fault_mode())
    }

    /// Whether a child made by `fork()` (`os.fork`, `multiprocessing`) inherits this pager's
    /// regions, paged by a pager of its own: true for the first pager made while no other
    /// such pager lives, unless its devices include a named swap file or a block device (a
    /// child could not open them); the regions of any other pager are not in the child.
    #[getter]
    fn regions_survive_fork(&self) -> bool {
        fork::is_rearmed(&self.cell)
    }

    /// The abstract unix socket `uswap stat` reads this pager's counters from, or None.
    #[getter]
    fn stats_socket(&self) -> Option<String> {
        self.cell.pager().stats_socket().map(str::to_string)
    }

    fn __repr__(&self) -> String {
        let pager = self.cell.pager();
        format!(
            "<uswap.Pager limit={} bytes fault_mode={:?}>",
            pager.resident_limit(),
            fault_mode_name(pager.fault_mode())
        )
    }
}

/// A JSON value (the engine's serialized counters) as Python objects.
fn json_to_py<'py>(py: Python<'py>, v: &serde_json::Value) -> PyResult<Bound<'py, PyAny>> {
    use serde_json::Value;
    Ok(match v {
        Value::Null => py.None().into_bound(py),
        Value::Bool(b) => pyo3::types::PyBool::new(py, *b).to_owned().into_any(),
        Value::Number(n) => match (n.as_u64(), n.as_i64(), n.as_f64()) {
            (Some(u), _, _) => u.into_pyobject(py)?.into_any(),
            (None, Some(i), _) => i.into_pyobject(py)?.into_any(),
            (None, None, f) => f.unwrap_or(f64::NAN).into_pyobject(py)?.into_any(),
        },
        Value::String(s) => PyString::new(py, s).into_any(),
        Value::Array(items) => {
            let list = PyList::empty(py);
            for item in items {
                list.append(json_to_py(py, item)?)?;
            }
            list.into_any()
        }
        Value::Object(map) => {
            let dict = PyDict::new(py);
            for (k, item) in map {
                dict.set_item(k, json_to_py(py, item)?)?;
            }
            dict.into_any()
        }
    })
}

/// The native module; `uswap/__init__.py` re-exports it.
#[pymodule]
fn _uswap(m: &Bound<'_, PyModule>) -> PyResult<()> {
    errors::register(m)?;
    fork::start().map_err(pyo3::exceptions::PyRuntimeError::new_err)?;
    m.add_class::<PyPager>()?;
    m.add_class::<PyRegion>()?;
    m.add_class::<NumpyAllocator>()?;
    m.add("PAGE_SIZE", uswap::PAGE_SIZE)?;
    m.add("MIN_LIMIT_BYTES", uswap::MIN_LIMIT_BYTES)?;
    m.add("DEFAULT_NUMPY_THRESHOLD", DEFAULT_THRESHOLD_BYTES)?;
    Ok(())
}
