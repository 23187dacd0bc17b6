//! `prep._native.CudaLoader`: prep's batch loader (prep::loader with the
//! CUDA backend) for Python. python/prep/device.py builds
//! `prep.DeviceLoader` on it; the ring, the order and the copies are the
//! Rust loader's, nothing is written again here.
//!
//! A batch reaches Python as a [`DeviceBatch`] with
//! `__cuda_array_interface__` (version 3), which `torch.as_tensor` takes
//! without a copy. The hand-off keeps the loader's stream rules
//! (prep::loader::cuda::DeviceView):
//! - `next(stream)` makes the consumer's stream wait, on the device, for
//!   the batch's copy, and the interface says `stream: None` (nothing left
//!   for the consumer to synchronise).
//! - The batch goes back to the ring when the DeviceBatch is dropped (torch
//!   drops it with the last tensor over its memory) or released: with an
//!   event recorded on that same stream, so the next copy into the buffer
//!   waits, on the device, for the work queued on it, as torch's own
//!   allocator orders a freed block's reuse.
//! - A consumer holding every batch of the ring would wait forever for the
//!   next: `next` refuses instead, naming the depth.

use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use pyo3::exceptions::{PyOSError, PyRuntimeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::PyDict;

use prep::format::Dataset;
use prep::loader::cuda::{CUstream, CudaBackend};
use prep::loader::{
    Backend, Batch, Gather, Loader, LoaderConfig, LoaderError, Order, Position, Widen,
};

/// Usage errors are ValueError; a dataset that cannot be read is OSError;
/// a CUDA failure (no driver, no such device) is RuntimeError.
fn to_py(e: LoaderError) -> PyErr {
    match e {
        LoaderError::Usage(_) => PyValueError::new_err(e.to_string()),
        LoaderError::Backend(_) => PyRuntimeError::new_err(e.to_string()),
        _ => PyOSError::new_err(e.to_string()),
    }
}

/// The loader of one rank of a packed dataset into one GPU's memory.
#[pyclass(module = "prep._native", frozen)]
pub struct CudaLoader {
    loader: Mutex<Loader<CudaBackend>>,
    /// Batches handed out and not yet given back.
    held: Arc<AtomicUsize>,
    depth: usize,
    device: usize,
}

#[pymethods]
impl CudaLoader {
    #[new]
    #[allow(clippy::too_many_arguments)]
    #[pyo3(signature = (path, device, batch_rows, depth, seed, rank, world_size, epoch, position, end_epoch, threads, widen, gather="host"))]
    fn new(
        py: Python<'_>,
        path: PathBuf,
        device: usize,
        batch_rows: usize,
        depth: usize,
        seed: u64,
        rank: u64,
        world_size: u64,
        epoch: u64,
        position: u64,
        end_epoch: Option<u64>,
        threads: usize,
        widen: &str,
        gather: &str,
    ) -> PyResult<CudaLoader> {
        let widen: Widen = widen.parse().map_err(to_py)?;
        let gather: Gather = gather.parse().map_err(to_py)?;
        if batch_rows == 0 || depth == 0 {
            return Err(PyValueError::new_err(
                "batch_size and depth must be at least 1",
            ));
        }
        let loader = py
            .detach(|| {
                let dataset = Arc::new(Dataset::open(&path).map_err(LoaderError::from)?);
                let backend = CudaBackend::new(device, dataset.dtype(), widen)?
                    .gather_with(gather, dataset.clone())?;
                let backend = Arc::new(backend);
                let config = LoaderConfig {
                    batch_rows,
                    depth,
                    order: Order {
                        seed,
                        rank,
                        world_size,
                    },
                    start: Position { epoch, position },
                    end_epoch,
                    threads,
                };
                Loader::new(dataset, backend, config)
            })
            .map_err(to_py)?;
        Ok(CudaLoader {
            loader: Mutex::new(loader),
            held: Arc::new(AtomicUsize::new(0)),
            depth,
            device,
        })
    }

    /// The next batch, with `stream` (a `CUstream` handle of the device's
    /// primary context; 0 the legacy default stream) made to wait for its
    /// copy on the device; None once `end_epoch` is reached.
    fn next(&self, py: Python<'_>, stream: u64) -> PyResult<Option<DeviceBatch>> {
        if self.held.load(Ordering::SeqCst) >= self.depth {
            return Err(PyRuntimeError::new_err(format!(
                "all {} batches of the loader's ring are still held (tensors over them are alive): \
                 the next batch can only be copied into one given back; drop or clone what you keep, \
                 or raise depth",
                self.depth
            )));
        }
        let batch = py
            .detach(|| {
                let mut loader = self.loader.lock().map_err(|_| {
                    LoaderError::Backend("the loader was poisoned by a panic".into())
                })?;
                loader.next_batch()
            })
            .map_err(to_py)?;
        let Some(batch) = batch else {
            return Ok(None);
        };
        let view = batch.device_view();
        // SAFETY: the batch is held (this DeviceBatch owns it), and the
        // caller gives a live stream of the device's primary context, the
        // context the loader's backend uses (cudarc's CudaContext::new).
        unsafe { view.order_stream(stream as CUstream) }.map_err(to_py)?;
        self.held.fetch_add(1, Ordering::SeqCst);
        Ok(Some(DeviceBatch {
            epoch: batch.epoch(),
            position: batch.position(),
            rows: batch.rows(),
            resume: batch.resume_at(),
            ptr: view.ptr,
            shape: view.shape,
            typestr: view.dtype.typestr(),
            device: view.device,
            stream,
            batch: Mutex::new(Some(batch)),
            held: self.held.clone(),
        }))
    }

    /// The device ordinal.
    #[getter]
    fn device(&self) -> usize {
        self.device
    }

    /// Tokens per row.
    #[getter]
    fn row_tokens(&self) -> usize {
        self.loader.lock().map(|l| l.row_tokens()).unwrap_or(0)
    }

    /// Batches handed out and not yet given back.
    #[getter]
    fn held(&self) -> usize {
        self.held.load(Ordering::SeqCst)
    }
}

/// One batch in device memory, until it is dropped or released.
#[pyclass(module = "prep._native", frozen)]
pub struct DeviceBatch {
    batch: Mutex<Option<Batch<CudaBackend>>>,
    /// The ids' device address, shape and type (DeviceView's, without the
    /// event handle, which stays with the batch).
    ptr: u64,
    shape: [i64; 2],
    typestr: &'static str,
    device: usize,
    /// The consumer's stream the batch was handed to.
    stream: u64,
    epoch: u64,
    position: u64,
    rows: usize,
    resume: Position,
    held: Arc<AtomicUsize>,
}

impl DeviceBatch {
    /// Gives the batch back to the ring, after the work queued so far on
    /// the consumer's stream; the second call does nothing.
    fn give_back(&self) -> Result<(), LoaderError> {
        let Some(batch) = self.batch.lock().ok().and_then(|mut b| b.take()) else {
            return Ok(());
        };
        self.held.fetch_sub(1, Ordering::SeqCst);
        let backend = batch.backend().clone();
        let done = backend.fence().and_then(|event| {
            // SAFETY: the event is live and of the loader's context; the
            // stream is the consumer's, live while it uses the batch.
            unsafe { prep::loader::cuda::record_on(&event, self.stream as CUstream) }
                .map(|()| event)
        });
        match done {
            Ok(event) => {
                batch.release(Some(event));
                Ok(())
            }
            Err(e) => {
                // The consumer's work could not be fenced: wait for it on
                // the host before the buffer is reused.
                // SAFETY: as above.
                let _ = unsafe { prep::loader::cuda::synchronize(self.stream as CUstream) };
                batch.release(None);
                Err(e)
            }
        }
    }
}

impl Drop for DeviceBatch {
    fn drop(&mut self) {
        let _ = self.give_back();
    }
}

#[pymethods]
impl DeviceBatch {
    /// The ids in device memory: (rows, tokens per row), C order.
    #[getter]
    fn __cuda_array_interface__<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let live = self.batch.lock().map(|b| b.is_some()).unwrap_or(false);
        if !live {
            return Err(PyRuntimeError::new_err(
                "this batch was released: its memory holds another batch now",
            ));
        }
        let d = PyDict::new(py);
        d.set_item("shape", (self.shape[0], self.shape[1]))?;
        d.set_item("typestr", self.typestr)?;
        d.set_item("data", (self.ptr, false))?;
        d.set_item("version", 3)?;
        d.set_item("strides", py.None())?;
        // The consumer's stream already waits for the copy (`next`).
        d.set_item("stream", py.None())?;
        Ok(d)
    }

    /// The epoch the rows belong to.
    #[getter]
    fn epoch(&self) -> u64 {
        self.epoch
    }

    /// The sampler position of the first row within the epoch.
    #[getter]
    fn position(&self) -> u64 {
        self.position
    }

    /// Rows in the batch (fewer than the batch size at an epoch's end).
    #[getter]
    fn rows(&self) -> usize {
        self.rows
    }

    /// (epoch, position) where a run resumes once this batch is consumed.
    #[getter]
    fn resume_at(&self) -> (u64, u64) {
        (self.resume.epoch, self.resume.position)
    }

    /// The device ordinal.
    #[getter]
    fn device(&self) -> usize {
        self.device
    }

    /// Gives the batch back now, after the work queued on its stream; the
    /// memory must not be read after.
    fn release(&self) -> PyResult<()> {
        self.give_back().map_err(to_py)
    }
}

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<CudaLoader>()?;
    m.add_class::<DeviceBatch>()?;
    Ok(())
}
