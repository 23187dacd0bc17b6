//! `prep._native.Stream`: prep::stream for Python. python/prep/streaming.py
//! builds `prep.StreamingDataset` on it; nothing of the order, the fetching
//! or the cache is written again in Python.

use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use pyo3::exceptions::{PyOSError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyByteArray, PyBytes};

use prep::stream::{Share, StreamConfig, StreamError, StreamReader, StreamState};

/// Refusals of arguments and states are ValueError; failures to read the
/// dataset or the cache (naming the file or URL) are OSError.
fn to_py(e: StreamError) -> PyErr {
    match e {
        StreamError::CacheTooSmall { .. }
        | StreamError::State(_)
        | StreamError::NotPacked { .. }
        | StreamError::Order { .. } => PyValueError::new_err(e.to_string()),
        _ => PyOSError::new_err(e.to_string()),
    }
}

/// A packed dataset opened for streaming (prep::stream::Stream).
#[pyclass(module = "prep._native", frozen)]
pub struct Stream {
    /// Shared with the batch loaders made over it (device.rs).
    pub(crate) inner: Arc<prep::stream::Stream>,
}

#[pymethods]
impl Stream {
    #[new]
    #[allow(clippy::too_many_arguments)]
    #[pyo3(signature = (location, cache_dir, cache_limit, seed, block_bytes, window, streams, in_flight, local_ranks, world, state=None))]
    fn new(
        py: Python<'_>,
        location: String,
        cache_dir: PathBuf,
        cache_limit: u64,
        seed: u64,
        block_bytes: Option<u64>,
        window: Option<u64>,
        streams: Option<u64>,
        in_flight: Option<usize>,
        local_ranks: u64,
        world: u64,
        state: Option<String>,
    ) -> PyResult<Stream> {
        let state: Option<StreamState> = state
            .map(|s| serde_json::from_str(&s))
            .transpose()
            .map_err(|e| PyValueError::new_err(format!("resume state refused: {e}")))?;
        let mut config = StreamConfig::new(cache_dir, cache_limit);
        // None: chosen by prep::stream for the cache (its plan), the one
        // place that choice is made.
        config.seed = seed;
        config.block_bytes = block_bytes;
        config.window = window;
        config.streams = streams;
        config.in_flight = in_flight.unwrap_or(config.in_flight);
        config.local_ranks = local_ranks.max(1);
        config.world = world.max(1);
        let inner = py
            .detach(|| prep::stream::Stream::open(&location, config, state.as_ref()))
            .map_err(to_py)?;
        Ok(Stream {
            inner: Arc::new(inner),
        })
    }

    /// Whether the dataset is a local directory (its rows can be read in
    /// place, in this order).
    #[getter]
    fn local(&self) -> bool {
        self.inner.local_dir().is_some()
    }

    /// The dataset indices at global positions `positions` (little-endian
    /// u64 bytes) of `epoch`, as little-endian u64 bytes: the order alone,
    /// for a reader of the rows in place.
    fn at<'py>(
        &self,
        py: Python<'py>,
        epoch: u64,
        positions: &[u8],
    ) -> PyResult<Bound<'py, PyBytes>> {
        let order = self.inner.order(epoch).map_err(to_py)?;
        let n = self.inner.len();
        let mut out = Vec::with_capacity(positions.len());
        for g in positions.chunks_exact(8) {
            let g = u64::from_le_bytes(g.try_into().expect("8 bytes"));
            if g >= n {
                return Err(PyValueError::new_err(format!(
                    "position {g} outside an epoch of {n} rows"
                )));
            }
            out.extend_from_slice(&order.get(g).to_le_bytes());
        }
        Ok(PyBytes::new(py, &out))
    }

    /// Rows in the dataset.
    #[getter]
    fn n_records(&self) -> u64 {
        self.inner.len()
    }

    /// "uint16" or "uint32".
    #[getter]
    fn dtype(&self) -> &'static str {
        self.inner.manifest().dtype.name()
    }

    /// Tokens per row.
    #[getter]
    fn seq_len(&self) -> u64 {
        self.inner.manifest().seq_len.unwrap_or(0)
    }

    /// The order's (block rows, window blocks, streams): chosen for the
    /// cache at the job's first start, or its state's.
    #[getter]
    fn plan(&self) -> (u64, u64, u64) {
        let p = self.inner.plan();
        (p.block, p.window, p.streams)
    }

    /// Bytes of cache the ranks of one node need in a world of `world`.
    fn cache_need(&self, world: u64) -> u64 {
        self.inner.cache_need(world)
    }

    /// Raises ValueError, with the numbers, when the limit is below the need.
    fn check_cache(&self, world: u64) -> PyResult<()> {
        self.inner.check_cache(world).map_err(to_py)
    }

    /// The state at `position` of `epoch`, as JSON.
    fn state_json(&self, epoch: u64, position: u64) -> String {
        serde_json::to_string(&self.inner.state(epoch, position)).expect("a state serialises")
    }

    /// The dataset indices rank `rank` of `world` reads from `start`, as
    /// little-endian u64 bytes.
    fn indices<'py>(
        &self,
        py: Python<'py>,
        epoch: u64,
        start: u64,
        rank: u64,
        world: u64,
    ) -> PyResult<Bound<'py, PyBytes>> {
        if world == 0 || rank >= world {
            return Err(PyValueError::new_err(format!(
                "rank {rank} of world_size {world}"
            )));
        }
        let order = self.inner.order(epoch).map_err(to_py)?;
        let bytes: Vec<u8> = order
            .positions(start, rank, world)
            .flat_map(|g| order.get(g).to_le_bytes())
            .collect();
        Ok(PyBytes::new(py, &bytes))
    }

    /// A reader of this share of `epoch` from global position `start`.
    #[allow(clippy::too_many_arguments)]
    fn reader(
        &self,
        epoch: u64,
        start: u64,
        rank: u64,
        world: u64,
        worker: u64,
        workers: u64,
        batch: u64,
    ) -> PyResult<Reader> {
        if world == 0 || rank >= world || workers == 0 || worker >= workers || batch == 0 {
            return Err(PyValueError::new_err(format!(
                "rank {rank} of {world}, worker {worker} of {workers}, batch {batch}"
            )));
        }
        let share = Share {
            rank,
            world,
            worker,
            workers,
            batch,
        };
        let reader = self.inner.reader(epoch, start, share).map_err(to_py)?;
        let manifest = self.inner.manifest();
        Ok(Reader {
            inner: Mutex::new(Some(reader)),
            row_bytes: manifest.seq_len.unwrap_or(0) as usize * manifest.dtype.size(),
        })
    }
}

/// One share's rows: an iterator of (dataset index, row), each row a
/// `bytearray`: the one copy out of the cache, which numpy then views as a
/// writable array (torch's collate warns on read-only ones).
#[pyclass(module = "prep._native")]
pub struct Reader {
    /// Taken by `Drop`.
    inner: Mutex<Option<StreamReader>>,
    /// Bytes of a row.
    row_bytes: usize,
}

impl Drop for Reader {
    /// Dropping a StreamReader waits for its fetches in flight; that wait
    /// must not hold the GIL, which the process's other threads (a store
    /// client in Python, a DataLoader's pin-memory thread) may need.
    fn drop(&mut self) {
        let reader = self
            .inner
            .get_mut()
            .unwrap_or_else(|e| e.into_inner())
            .take();
        Python::attach(|py| py.detach(move || drop(reader)));
    }
}

#[pymethods]
impl Reader {
    fn __iter__(slf: PyRef<'_, Self>) -> PyRef<'_, Self> {
        slf
    }

    fn __next__<'py>(&self, py: Python<'py>) -> PyResult<Option<(u64, Bound<'py, PyByteArray>)>> {
        let mut guard = self.inner.lock().expect("no panic while held");
        let Some(reader) = guard.as_mut() else {
            return Ok(None);
        };
        // Most rows are in a block already mapped: those are read with the
        // GIL held, a copy of one row, rather than paying its release.
        let next = if reader.may_wait() {
            py.detach(|| reader.next())
        } else {
            reader.next()
        };
        match next {
            None => Ok(None),
            Some(Err(e)) => Err(to_py(e)),
            Some(Ok(row)) => Ok(Some((row.index, PyByteArray::new(py, row.bytes())))),
        }
    }

    /// The next `n` rows (fewer at the end; `None` when none is left) in
    /// one call: (their dataset indices as little-endian u64 bytes, the
    /// rows one after the other in one `bytearray`). The rows are copied
    /// once, from the cache straight into the `bytearray`, with the GIL
    /// released, so a batch costs one crossing, not `n`.
    fn next_batch<'py>(
        &self,
        py: Python<'py>,
        n: usize,
    ) -> PyResult<Option<(Bound<'py, PyBytes>, Bound<'py, PyByteArray>)>> {
        let mut guard = self.inner.lock().expect("no panic while held");
        let Some(reader) = guard.as_mut() else {
            return Ok(None);
        };
        let row_bytes = self.row_bytes;
        let rows = PyByteArray::new_with(py, n * row_bytes, |_| Ok(()))?;
        // SAFETY: the bytearray was made just above and nothing else holds
        // it, so no Python code can resize or read it while it is filled,
        // with or without the GIL.
        let buf: &mut [u8] = unsafe { rows.as_bytes_mut() };
        let gathered = py.detach(|| {
            let mut indices = Vec::with_capacity(n * 8);
            for slot in buf.chunks_exact_mut(row_bytes.max(1)).take(n) {
                match reader.next() {
                    None => break,
                    Some(Err(e)) => return Err(e),
                    Some(Ok(row)) => {
                        indices.extend_from_slice(&row.index.to_le_bytes());
                        slot.copy_from_slice(row.bytes());
                    }
                }
            }
            Ok(indices)
        });
        let indices = gathered.map_err(to_py)?;
        let got = indices.len() / 8;
        if got == 0 {
            return Ok(None);
        }
        if got < n {
            rows.resize(got * row_bytes)?;
        }
        Ok(Some((PyBytes::new(py, &indices), rows)))
    }

    fn __len__(&self) -> usize {
        let guard = self.inner.lock().expect("no panic while held");
        guard.as_ref().map_or(0, |r| r.len() as usize)
    }
}

/// Adds the classes to the module.
pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<Stream>()?;
    m.add_class::<Reader>()?;
    Ok(())
}
