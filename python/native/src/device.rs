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

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use pyo3::exceptions::{PyOSError, PyRuntimeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyByteArray, PyDict};

use prep::format::Dataset;
use prep::loader::cuda::{CUstream, CudaBackend};
use prep::loader::{
    Backend, Batch, Gather, HostBackend, Loader, LoaderConfig, LoaderError, Order, Position, Widen,
};

use crate::stream::Stream;

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
    loader: Held<CudaBackend>,
    /// Batches handed out and not yet given back.
    held: Arc<AtomicUsize>,
    depth: usize,
    device: usize,
}

/// A loader owned by a Python object. Dropping a loader stops its
/// producer and waits for it, and the producer may be waiting for a fetch
/// that needs the GIL (a store served from this process, a client's
/// callback): the drop releases the GIL first, as the stream's readers do.
pub(crate) struct Held<B: Backend>(Mutex<Option<Loader<B>>>);

impl<B: Backend> Held<B> {
    fn with<T>(
        &self,
        f: impl FnOnce(&mut Loader<B>) -> Result<T, LoaderError>,
    ) -> Result<T, LoaderError> {
        let mut guard = self
            .0
            .lock()
            .map_err(|_| LoaderError::Backend("the loader was poisoned by a panic".into()))?;
        f(guard.as_mut().expect("held until dropped"))
    }
}

impl<B: Backend> Drop for Held<B> {
    fn drop(&mut self) {
        let loader = self.0.get_mut().unwrap_or_else(|e| e.into_inner()).take();
        Python::attach(|py| py.detach(move || drop(loader)));
    }
}

/// The loader of `config`'s rank over `stream`'s dataset, in the stream's
/// order: a local directory's rows read in place (any gather), a remote
/// one's through the stream's cache (gathered on the host). `backend`
/// makes the backend, given the mapped dataset where there is one.
pub(crate) fn open_loader<B: Backend>(
    stream: &Arc<prep::stream::Stream>,
    config: LoaderConfig,
    backend: impl FnOnce(Option<Arc<Dataset>>) -> Result<B, LoaderError>,
) -> Result<Loader<B>, LoaderError> {
    if config.batch_rows == 0 || config.depth == 0 {
        return Err(LoaderError::Usage(
            "batch_size and depth must be at least 1".into(),
        ));
    }
    match stream.local_dir() {
        Some(dir) => {
            let dataset = Arc::new(Dataset::open(dir).map_err(LoaderError::from)?);
            let backend = Arc::new(backend(Some(dataset.clone()))?);
            Loader::with_stream_order(dataset, Arc::clone(stream), backend, config)
        }
        None => Loader::from_stream(Arc::clone(stream), Arc::new(backend(None)?), config),
    }
}

/// The loader's settings from the Python arguments.
#[allow(clippy::too_many_arguments)]
pub(crate) fn loader_config(
    batch_rows: usize,
    depth: usize,
    rank: u64,
    world_size: u64,
    epoch: u64,
    position: u64,
    end_epoch: Option<u64>,
    threads: usize,
) -> LoaderConfig {
    LoaderConfig {
        batch_rows,
        depth,
        // The stream's seed orders the rows; this one is not read.
        order: Order {
            seed: 0,
            rank,
            world_size,
        },
        start: Position { epoch, position },
        end_epoch,
        threads,
    }
}

#[pymethods]
impl CudaLoader {
    /// The loader of rank `rank` of `world_size` over `stream` (a
    /// `prep._native.Stream`), from global position `position` of `epoch`
    /// (a stream state's).
    #[new]
    #[allow(clippy::too_many_arguments)]
    #[pyo3(signature = (stream, device, batch_rows, depth, rank, world_size, epoch, position, end_epoch, threads, widen, gather="host"))]
    fn new(
        py: Python<'_>,
        stream: PyRef<'_, Stream>,
        device: usize,
        batch_rows: usize,
        depth: usize,
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
        let stream = Arc::clone(&stream.inner);
        let config = loader_config(
            batch_rows, depth, rank, world_size, epoch, position, end_epoch, threads,
        );
        let loader = py
            .detach(|| {
                open_loader(&stream, config, |dataset| {
                    let backend = CudaBackend::new(device, stream.manifest().dtype, widen)?;
                    match dataset {
                        Some(dataset) => backend.gather_with(gather, dataset),
                        None if gather == Gather::Host => Ok(backend),
                        None => Err(LoaderError::Usage(format!(
                            "{}: gather={gather:?} reads a local dataset's files in place; \
                             a dataset in object storage is gathered on the host",
                            stream.location()
                        ))),
                    }
                })
            })
            .map_err(to_py)?;
        Ok(CudaLoader {
            loader: Held(Mutex::new(Some(loader))),
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
            .detach(|| self.loader.with(|loader| loader.next_batch()))
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
        self.loader.with(|l| Ok(l.row_tokens())).unwrap_or(0)
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

/// The same loader into host memory (`prep.DeviceLoader(device="cpu")`):
/// the order, positions and resume states of the GPU loader, for training
/// on the CPU and for checking a job where no GPU is.
#[pyclass(module = "prep._native", frozen)]
pub struct HostLoader {
    loader: Held<HostBackend>,
    row_bytes: usize,
}

#[pymethods]
impl HostLoader {
    /// As CudaLoader's, without the device's arguments.
    #[new]
    #[allow(clippy::too_many_arguments)]
    #[pyo3(signature = (stream, batch_rows, depth, rank, world_size, epoch, position, end_epoch, threads))]
    fn new(
        py: Python<'_>,
        stream: PyRef<'_, Stream>,
        batch_rows: usize,
        depth: usize,
        rank: u64,
        world_size: u64,
        epoch: u64,
        position: u64,
        end_epoch: Option<u64>,
        threads: usize,
    ) -> PyResult<HostLoader> {
        let stream = Arc::clone(&stream.inner);
        let config = loader_config(
            batch_rows, depth, rank, world_size, epoch, position, end_epoch, threads,
        );
        let loader = py
            .detach(|| open_loader(&stream, config, |_| Ok(HostBackend)))
            .map_err(to_py)?;
        let manifest = stream.manifest();
        Ok(HostLoader {
            row_bytes: manifest.seq_len.unwrap_or(0) as usize * manifest.dtype.size(),
            loader: Held(Mutex::new(Some(loader))),
        })
    }

    /// The next batch as (epoch, position, (resume epoch, resume
    /// position), the rows one after the other in a `bytearray`); None
    /// once `end_epoch` is reached.
    #[allow(clippy::type_complexity)]
    fn next<'py>(
        &self,
        py: Python<'py>,
    ) -> PyResult<Option<(u64, u64, (u64, u64), Bound<'py, PyByteArray>)>> {
        let batch = py
            .detach(|| self.loader.with(|loader| loader.next_batch()))
            .map_err(to_py)?;
        let Some(batch) = batch else {
            return Ok(None);
        };
        let rows = PyByteArray::new(py, &batch.target()[..batch.rows() * self.row_bytes]);
        let resume = batch.resume_at();
        let out = (
            batch.epoch(),
            batch.position(),
            (resume.epoch, resume.position),
            rows,
        );
        batch.release(None);
        Ok(Some(out))
    }
}

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<HostLoader>()?;
    m.add_class::<CudaLoader>()?;
    m.add_class::<DeviceBatch>()?;
    Ok(())
}
