//! `prep._native.Tokenizer`: prep's fast engine for Python, under
//! `prep.Tokenizer` (python/prep/tokenizer.py). The ids are those of
//! `tokenizers.Tokenizer.encode(text, add_special_tokens=False).ids`; with
//! special tokens, the post-processor's before and after them. A file the
//! fast engine does not run is encoded by HF tokenizers itself.

use std::path::PathBuf;
use std::sync::Mutex;

use pyo3::exceptions::{PyOSError, PyValueError};
use pyo3::prelude::*;
use pyo3::pybacked::PyBackedStr;
use pyo3::sync::PyOnceLock;
use pyo3::types::{PyBytes, PyInt, PyList};
use rayon::prelude::*;

use prep::engine::{EncodeState, FastTokenizer, LoadedTokenizer, PostProcessorTokens, Readings};

/// A tokenizer.json loaded for encoding. Its parts are boxed: some are
/// aligned beyond the 16 bytes Python allocates objects at.
#[pyclass(module = "prep._native", frozen)]
pub struct Tokenizer(Box<Inner>);

struct Inner {
    loaded: LoadedTokenizer,
    /// The fast engine, where it runs the file, with one state per thread.
    fast: Option<(FastTokenizer, Vec<Mutex<EncodeState>>)>,
    /// Why the fast engine does not run the file.
    why_not: Option<String>,
    /// What the post-processor puts around a text's ids.
    special: PostProcessorTokens,
    /// Whether `special` is exactly what the post-processor does (checked
    /// on probe texts by HF tokenizers, at the first encoding that asks for
    /// special tokens); else special tokens are added by HF.
    special_exact: std::sync::OnceLock<bool>,
    pool: rayon::ThreadPool,
    path: PathBuf,
    /// A Python int for each id below `vocab_size` (at most [`MAX_INTS`]),
    /// made at the first list of ids: a list then holds references to
    /// them (a reference count raised each) instead of a new int object per
    /// id, which was most of the time `encode_batch` spent holding the GIL.
    ints: PyOnceLock<Vec<Py<PyInt>>>,
}

/// The most ids [`Inner::ints`] keeps an int for: 32 MiB of ints at most,
/// far above every real vocabulary (Gemma 3's 262,144: 8 MiB).
const MAX_INTS: u64 = 1 << 20;

impl Inner {
    /// Whether the post-processor only wraps a text's ids in `special`.
    fn special_exact(&self) -> bool {
        *self
            .special_exact
            .get_or_init(|| special_is_exact(&self.loaded, &self.special))
    }

    /// The ids of `text`, appended to `out`.
    fn encode_into(&self, text: &str, special: bool, out: &mut Vec<u32>) -> Result<(), String> {
        // HF tokenizers: for a file the fast engine does not run, and for
        // special tokens where the post-processor does more than wrap.
        let fast = self
            .fast
            .as_ref()
            .filter(|_| !special || self.special_exact());
        let Some((fast, states)) = fast else {
            let encoding = self
                .loaded
                .hf()
                .map_err(|e| e.to_string())?
                .encode_fast(text, special)
                .map_err(|e| e.to_string())?;
            out.extend_from_slice(encoding.get_ids());
            return Ok(());
        };
        if special {
            out.extend_from_slice(&self.special.before);
        }
        let slot = rayon::current_thread_index().unwrap_or(states.len() - 1) % states.len();
        let mut state = states[slot].lock().unwrap_or_else(|e| e.into_inner());
        fast.encode(text, &mut state, out);
        if special {
            out.extend_from_slice(&self.special.after);
        }
        Ok(())
    }

    /// `ids` as a Python list of ints.
    fn list<'py>(&self, py: Python<'py>, ids: &[u32]) -> PyResult<Bound<'py, PyList>> {
        let ints = self.ints.get_or_init(py, || {
            let n = self.loaded.vocab_size.min(MAX_INTS) as u32;
            (0..n)
                .map(|id| id.into_pyobject(py).unwrap().unbind())
                .collect()
        });
        PyList::new(
            py,
            ids.iter().map(|&id| match ints.get(id as usize) {
                Some(int) => int.bind(py).clone(),
                None => id.into_pyobject(py).unwrap(),
            }),
        )
    }

    /// Every text's ids as a list of lists, the lists made on the calling
    /// thread (which holds the GIL) while the pool encodes the texts after
    /// them: the texts go out in chunks, and each chunk's lists are made as
    /// soon as it and every chunk before it are back. The GIL is released
    /// while a chunk is awaited.
    fn encode_lists<'py>(
        &self,
        py: Python<'py>,
        texts: &[PyBackedStr],
        special: bool,
    ) -> PyResult<Vec<Bound<'py, PyList>>> {
        if texts.is_empty() {
            return Ok(Vec::new());
        }
        let threads = self.pool.current_num_threads();
        // Enough chunks to keep every thread busy and the lists close
        // behind, few enough that a chunk outweighs its hand-over.
        let size = texts.len().div_ceil(threads * 16).clamp(16, 4096);
        let chunks: Vec<&[PyBackedStr]> = texts.chunks(size).collect();
        let (done, results) = std::sync::mpsc::channel();
        // Shared with the closure that waits without the GIL, which must be Send.
        let results = Mutex::new(results);
        self.pool.in_place_scope(|scope| {
            for (k, chunk) in chunks.iter().enumerate() {
                let done = done.clone();
                scope.spawn(move |_| {
                    let ids = chunk
                        .iter()
                        .map(|t| {
                            let t: &str = t;
                            let mut ids = Vec::with_capacity(t.len() / 3 + 2);
                            self.encode_into(t, special, &mut ids).map(|()| ids)
                        })
                        .collect::<Result<Vec<_>, String>>();
                    // The receiver is gone only after an error, when the
                    // rest is not wanted.
                    let _ = done.send((k, ids));
                });
            }
            drop(done);
            let mut lists = Vec::with_capacity(texts.len());
            let mut waiting = std::collections::BTreeMap::new();
            let mut next = 0;
            while next < chunks.len() {
                let (k, ids) = match waiting.remove(&next) {
                    Some(ids) => (next, ids),
                    // Every chunk reports unless its thread panicked.
                    None => py
                        .detach(|| results.lock().expect("one waiter").recv())
                        .map_err(|_| PyValueError::new_err("a tokenizer thread failed"))?,
                };
                if k != next {
                    waiting.insert(k, ids);
                    continue;
                }
                for ids in ids.map_err(PyValueError::new_err)? {
                    lists.push(self.list(py, &ids)?);
                }
                next += 1;
            }
            Ok(lists)
        })
    }

    /// Every text's ids, in order, encoded on the pool.
    fn encode_each(&self, texts: &[PyBackedStr], special: bool) -> Result<Vec<Vec<u32>>, String> {
        self.pool.install(|| {
            texts
                .par_iter()
                .with_min_len(16)
                .map(|t| {
                    let t: &str = t;
                    let mut ids = Vec::with_capacity(t.len() / 3 + 2);
                    self.encode_into(t, special, &mut ids).map(|()| ids)
                })
                .collect()
        })
    }
}

/// Whether putting `special` around the fast ids gives what HF's
/// post-processor gives, on texts that meet its branches.
fn special_is_exact(loaded: &LoadedTokenizer, special: &PostProcessorTokens) -> bool {
    let Ok(hf) = loaded.hf() else {
        return false;
    };
    ["", "a", " hello world ", "\n\n", "é中😀"]
        .iter()
        .all(|text| {
            let (Ok(plain), Ok(full)) = (hf.encode(*text, false), hf.encode(*text, true)) else {
                return false;
            };
            let mut want = special.before.clone();
            want.extend_from_slice(plain.get_ids());
            want.extend_from_slice(&special.after);
            want == full.get_ids()
        })
}

#[pymethods]
impl Tokenizer {
    /// Loads `path`: a tokenizer.json (also .zst or .gz), or a directory
    /// holding one. `threads`: the encoding threads of `encode_batch`
    /// (default: every core). The fast engine's reading comes from the
    /// compiled tokenizer cache where it can; HF tokenizers reads the file
    /// only when first needed (decoding, special tokens, or a file the
    /// engine does not run).
    #[new]
    #[pyo3(signature = (path, threads=None))]
    fn new(py: Python<'_>, path: PathBuf, threads: Option<usize>) -> PyResult<Tokenizer> {
        py.detach(|| {
            let file = prep::engine::tokenizer_file(&path)
                .map_err(|e| PyOSError::new_err(format!("{}: {e}", path.display())))?;
            let (loaded, fast) = LoadedTokenizer::load_with_fast(&file, Readings::Fast)
                .map_err(|e| PyValueError::new_err(e.to_string()))?;
            let threads = threads
                .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()))
                .max(1);
            let pool = rayon::ThreadPoolBuilder::new()
                .num_threads(threads)
                .thread_name(|i| format!("prep-tokenizer-{i}"))
                .build()
                .map_err(|e| PyOSError::new_err(format!("cannot start {threads} threads: {e}")))?;
            let (fast, why_not) = match fast {
                Some(Ok(fast)) => {
                    // One state per pool thread, and one for the caller's.
                    let states = (0..=threads)
                        .map(|_| Mutex::new(EncodeState::default()))
                        .collect();
                    (Some((fast, states)), None)
                }
                Some(Err(why)) => (None, Some(why.to_string())),
                None => (None, None),
            };
            let special = loaded.post_processor_tokens();
            Ok(Tokenizer(Box::new(Inner {
                loaded,
                fast,
                why_not,
                special,
                special_exact: std::sync::OnceLock::new(),
                pool,
                path: file,
                ints: PyOnceLock::new(),
            })))
        })
    }

    /// "fast" (prep's engine) or "hf" (HF tokenizers, for a file the
    /// engine does not run).
    #[getter]
    fn engine(&self) -> &'static str {
        if self.0.fast.is_some() {
            "fast"
        } else {
            "hf"
        }
    }

    /// What runs the file, or why the fast engine does not.
    #[getter]
    fn description(&self) -> String {
        match (&self.0.fast, &self.0.why_not) {
            (Some((fast, _)), _) => fast.describe(),
            (None, Some(why)) => format!("HF tokenizers (the fast engine: {why})"),
            (None, None) => "HF tokenizers".into(),
        }
    }

    /// One more than the largest id.
    #[getter]
    fn vocab_size(&self) -> u64 {
        self.0.loaded.vocab_size
    }

    /// The tokenizer.json read.
    #[getter]
    fn path(&self) -> PathBuf {
        self.0.path.clone()
    }

    /// The ids of `text`.
    #[pyo3(signature = (text, add_special_tokens=false))]
    fn encode<'py>(
        &self,
        py: Python<'py>,
        text: PyBackedStr,
        add_special_tokens: bool,
    ) -> PyResult<Bound<'py, PyList>> {
        let mut ids = Vec::with_capacity(text.len() / 3 + 2);
        py.detach(|| self.0.encode_into(&text, add_special_tokens, &mut ids))
            .map_err(PyValueError::new_err)?;
        self.0.list(py, &ids)
    }

    /// The ids of every text, encoded on every thread with the GIL
    /// released: a list of lists. The texts are borrowed from their Python
    /// strings (UTF-8 as Python keeps it), not copied.
    #[pyo3(signature = (texts, add_special_tokens=false))]
    fn encode_batch<'py>(
        &self,
        py: Python<'py>,
        texts: Vec<PyBackedStr>,
        add_special_tokens: bool,
    ) -> PyResult<Bound<'py, PyList>> {
        let lists = self.0.encode_lists(py, &texts, add_special_tokens)?;
        PyList::new(py, lists)
    }

    /// [`Tokenizer::encode_batch`] as two byte strings for numpy: every
    /// id back to back (little-endian uint32), and where each text's ids
    /// end (uint64).
    #[pyo3(signature = (texts, add_special_tokens=false))]
    fn encode_batch_flat<'py>(
        &self,
        py: Python<'py>,
        texts: Vec<PyBackedStr>,
        add_special_tokens: bool,
    ) -> PyResult<(Bound<'py, PyBytes>, Bound<'py, PyBytes>)> {
        let each = py
            .detach(|| self.0.encode_each(&texts, add_special_tokens))
            .map_err(PyValueError::new_err)?;
        let total: usize = each.iter().map(Vec::len).sum();
        let ids = PyBytes::new_with(py, total * 4, |buf| {
            for (slot, id) in buf.chunks_exact_mut(4).zip(each.iter().flatten()) {
                slot.copy_from_slice(&id.to_le_bytes());
            }
            Ok(())
        })?;
        let ends = PyBytes::new_with(py, each.len() * 8, |buf| {
            let mut end = 0u64;
            for (slot, one) in buf.chunks_exact_mut(8).zip(&each) {
                end += one.len() as u64;
                slot.copy_from_slice(&end.to_le_bytes());
            }
            Ok(())
        })?;
        Ok((ids, ends))
    }

    /// The text of `ids`, by HF tokenizers.
    #[pyo3(signature = (ids, skip_special_tokens=false))]
    fn decode(&self, py: Python<'_>, ids: Vec<u32>, skip_special_tokens: bool) -> PyResult<String> {
        py.detach(|| {
            let hf = self.0.loaded.hf().map_err(|e| e.to_string())?;
            hf.decode(&ids, skip_special_tokens)
                .map_err(|e| e.to_string())
        })
        .map_err(|e| PyValueError::new_err(e.to_string()))
    }
}

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<Tokenizer>()
}
