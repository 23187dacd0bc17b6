//! `prep shuffle`: an exact global shuffle of documents in bounded memory.
//!
//! # The algorithm
//!
//! Number the input documents `g = 0, 1, ...` across all inputs, in order.
//! Give each a key `k(g) = XXH3-64(g, seed)`; the output is the documents in
//! increasing `(k(g), g)` order. Sorting by independent uniform keys gives a
//! uniformly random permutation (every order of the keys is equally likely);
//! XXH3 stands in for the independent keys, and ties (probability below
//! n²/2⁶⁵) are broken by `g`. The order is a function of the seed and the
//! inputs alone: neither `--memory` nor `--threads` can change it.
//!
//! In memory (the documents and 32 bytes of bookkeeping each fit in half the
//! budget) the sort is direct. Otherwise every document is appended, with its
//! key, to one of `B = 2^b` bucket files chosen by the top `b` bits of its
//! key (`B` at most 256, so the open files stay few), and each bucket is then
//! read back, sorted by key and written out; concatenating the buckets in
//! order is the global key order, whatever `B` is. A bucket still larger than
//! the budget is split again on the next bits of the key. Inputs and buckets
//! are read and written sequentially in large blocks: two reads and two
//! writes of the data, a third of each only for a corpus more than 128 times
//! the budget.

use std::fs::File;
use std::io::{BufReader, BufWriter, Read, Write};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use serde_json::json;
use xxhash_rust::xxh3::xxh3_64_with_seed;

use crate::format::{
    atomic_write, checksum_hex, Dataset, DatasetWriter, DocumentCounts, FormatError, InputInfo,
    Manifest, Provenance, IDX_HEADER_LEN, MANIFEST_FILE,
};
use crate::progress::{Progress, ProgressSnapshot};

/// Bytes of bookkeeping per document: key, index, offset and length.
const ENTRY_BYTES: u64 = 32;
/// Bytes a document takes in a bucket file besides its tokens: key, index, length.
const BUCKET_HEADER: usize = 24;
/// Most bucket files open at once.
const MAX_BUCKETS: u64 = 256;
/// Read and write buffers.
const IO_BUFFER: usize = 1 << 20;

/// What `prep shuffle` is asked to do.
#[derive(Debug, Clone)]
pub struct ShuffleConfig {
    /// Input datasets, shuffled together as one mixture, in this order.
    pub inputs: Vec<PathBuf>,
    /// The dataset directory to write.
    pub output: PathBuf,
    /// The seed: the order is a function of it and the inputs alone.
    pub seed: u64,
    /// Memory budget in bytes for documents and bookkeeping.
    pub memory: u64,
    /// Largest `.bin` of an output shard.
    pub shard_size: u64,
    /// Worker threads for sorting; 0 means one per core. The output does not depend on it.
    pub threads: usize,
    /// Replace an existing dataset in the output directory.
    pub overwrite: bool,
}

impl ShuffleConfig {
    /// A config with the CLI's defaults: 4 GiB of memory, 1 GiB shards.
    pub fn new(inputs: Vec<PathBuf>, output: impl Into<PathBuf>, seed: u64) -> ShuffleConfig {
        ShuffleConfig {
            inputs,
            output: output.into(),
            seed,
            memory: 4 << 30,
            shard_size: 1 << 30,
            threads: 0,
            overwrite: false,
        }
    }
}

/// Every way `prep shuffle` can fail.
#[derive(Debug, thiserror::Error)]
pub enum ShuffleError {
    /// An input or the output could not be read or written.
    #[error(transparent)]
    Format(#[from] FormatError),
    /// Two inputs cannot be mixed.
    #[error("cannot shuffle {} with {}: {what} differ ({a} and {b})", first.display(), other.display())]
    Mismatch {
        /// The first input.
        first: PathBuf,
        /// The input that differs from it.
        other: PathBuf,
        /// What differs.
        what: &'static str,
        /// The first input's value.
        a: String,
        /// The other's.
        b: String,
    },
    /// The output directory holds something this run must not overwrite.
    #[error("output directory {}: {why}", dir.display())]
    OutputExists {
        /// The directory.
        dir: PathBuf,
        /// Why it was refused.
        why: String,
    },
    /// An I/O error on a temporary bucket file or the output directory.
    #[error("{}: {source}", path.display())]
    Io {
        /// The file.
        path: PathBuf,
        /// The underlying error.
        source: std::io::Error,
    },
    /// No input given.
    #[error("no input dataset given")]
    NoInput,
}

/// What a run did.
#[derive(Debug, Clone)]
pub struct ShuffleReport {
    /// The manifest written.
    pub manifest: Manifest,
    /// Bucket files used in the first pass (0: shuffled in memory).
    pub buckets: u64,
    /// Bytes of token data moved.
    pub bytes: u64,
    /// Wall time.
    pub elapsed: Duration,
}

/// The key of document `g`.
pub fn key(seed: u64, g: u64) -> u64 {
    xxh3_64_with_seed(&g.to_le_bytes(), seed)
}

/// The order of `n` documents under `seed`: element `i` is the input index of
/// output record `i`. Holds all `n` keys: for tests and small `n`; the
/// command itself never builds this array.
pub fn permutation(seed: u64, n: u64) -> Vec<u64> {
    let mut order: Vec<(u64, u64)> = (0..n).map(|g| (key(seed, g), g)).collect();
    order.sort_unstable();
    order.into_iter().map(|(_, g)| g).collect()
}

/// One document waiting to be written: its key and index decide its place.
struct Entry {
    key: u64,
    g: u64,
    offset: usize,
    len: usize,
}

/// Runs `prep shuffle`.
pub fn run(config: &ShuffleConfig, progress: &dyn Progress) -> Result<ShuffleReport, ShuffleError> {
    let started = Instant::now();
    let first = config.inputs.first().ok_or(ShuffleError::NoInput)?;
    let datasets = config
        .inputs
        .iter()
        .map(Dataset::open)
        .collect::<Result<Vec<_>, _>>()?;
    let base = datasets[0].manifest().clone();
    for (ds, path) in datasets.iter().zip(&config.inputs).skip(1) {
        compatible(first, &base, path, ds.manifest())?;
    }
    prepare_output(&config.output, config.overwrite)?;
    let dtype = base.dtype;
    let n_docs: u64 = datasets.iter().map(Dataset::len).sum();
    let token_bytes: u64 = datasets
        .iter()
        .map(|d| d.n_tokens() * dtype.size() as u64)
        .sum();
    let budget = config.memory.max(64 << 10);
    let need = token_bytes + n_docs * ENTRY_BYTES;
    let threads = if config.threads > 0 {
        config.threads
    } else {
        std::thread::available_parallelism().map_or(1, |n| n.get())
    };
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(threads)
        .build()
        .map_err(|e| ShuffleError::Io {
            path: config.output.clone(),
            source: std::io::Error::other(e),
        })?;

    let mut writer = DatasetWriter::new(&config.output, dtype, config.shard_size, Vec::new());
    let mut moved = Moved {
        bytes: 0,
        total: token_bytes * 2,
        docs: 0,
    };
    let buckets;
    if need <= budget / 2 {
        buckets = 0;
        let mut data = Vec::with_capacity(token_bytes as usize);
        let mut entries = Vec::with_capacity(n_docs as usize);
        for_each_document(&config.inputs, &datasets, |g, tokens| {
            entries.push(Entry {
                key: key(config.seed, g),
                g,
                offset: data.len(),
                len: tokens.len(),
            });
            data.extend_from_slice(tokens);
            Ok(())
        })?;
        moved.bytes += token_bytes;
        write_sorted(&pool, &mut writer, &data, entries, &mut moved, progress)?;
    } else {
        let b = (need.div_ceil(budget / 2))
            .next_power_of_two()
            .clamp(2, MAX_BUCKETS);
        buckets = b;
        let tmp = config.output.join(".shuffle-tmp");
        std::fs::create_dir_all(&tmp).map_err(|e| ShuffleError::Io {
            path: tmp.clone(),
            source: e,
        })?;
        let bits = b.trailing_zeros();
        let files = scatter_inputs(config, &datasets, &tmp, bits, budget, &mut moved, progress)?;
        for file in files {
            gather(
                &pool,
                &mut writer,
                &file,
                bits,
                budget,
                &mut moved,
                progress,
            )?;
        }
        std::fs::remove_dir_all(&tmp).map_err(|e| ShuffleError::Io {
            path: tmp,
            source: e,
        })?;
    }
    let shards = writer.finish()?;

    let inputs = config
        .inputs
        .iter()
        .zip(&datasets)
        .map(|(path, ds)| {
            let manifest =
                std::fs::read(path.join(MANIFEST_FILE)).map_err(|e| ShuffleError::Io {
                    path: path.join(MANIFEST_FILE),
                    source: e,
                })?;
            Ok(InputInfo {
                path: path.display().to_string(),
                bytes: ds
                    .manifest()
                    .shards
                    .iter()
                    .map(|s| s.bin_bytes + s.idx_bytes)
                    .sum(),
                xxh3: Some(checksum_hex(xxhash_rust::xxh3::xxh3_64(&manifest))),
            })
        })
        .collect::<Result<Vec<_>, ShuffleError>>()?;
    if let Some(file) = &base.tokenizer.file {
        let from = first.join(file);
        if from.is_file() {
            let bytes = std::fs::read(&from).map_err(|e| ShuffleError::Io {
                path: from,
                source: e,
            })?;
            atomic_write(&config.output.join(file), &bytes)?;
        }
    }
    let options = json!({ "seed": config.seed, "shard_size": config.shard_size });
    let fingerprint = checksum_hex(xxhash_rust::xxh3::xxh3_64(
        json!({ "prep_version": env!("CARGO_PKG_VERSION"), "options": options, "inputs": inputs })
            .to_string()
            .as_bytes(),
    ));
    let manifest = Manifest {
        n_records: shards.iter().map(|s| s.n_records).sum(),
        n_tokens: shards.iter().map(|s| s.n_tokens).sum(),
        shards,
        provenance: Provenance {
            prep_version: env!("CARGO_PKG_VERSION").into(),
            command: "shuffle".into(),
            created: crate::util::now_rfc3339(),
            inputs,
            options,
            documents: DocumentCounts {
                read: n_docs,
                written: n_docs,
                ..DocumentCounts::default()
            },
            fingerprint,
        },
        ..base
    };
    atomic_write(
        &config.output.join(MANIFEST_FILE),
        manifest.to_json().as_bytes(),
    )?;
    progress.finish();
    Ok(ShuffleReport {
        manifest,
        buckets,
        bytes: token_bytes,
        elapsed: started.elapsed(),
    })
}

/// Inputs shuffled together must read the same way: same tokenizer, dtype,
/// vocabulary and special tokens.
fn compatible(first: &Path, a: &Manifest, other: &Path, b: &Manifest) -> Result<(), ShuffleError> {
    let differ = |what, x: String, y: String| {
        Err(ShuffleError::Mismatch {
            first: first.into(),
            other: other.into(),
            what,
            a: x,
            b: y,
        })
    };
    if a.tokenizer.xxh3 != b.tokenizer.xxh3 {
        return differ(
            "tokenizers",
            a.tokenizer.xxh3.clone(),
            b.tokenizer.xxh3.clone(),
        );
    }
    if a.dtype != b.dtype {
        return differ("dtypes", a.dtype.to_string(), b.dtype.to_string());
    }
    if a.vocab_size != b.vocab_size {
        return differ(
            "vocabulary sizes",
            a.vocab_size.to_string(),
            b.vocab_size.to_string(),
        );
    }
    if a.kind != b.kind || a.kind != "documents" {
        return differ(
            "kinds (shuffle takes documents datasets)",
            a.kind.clone(),
            b.kind.clone(),
        );
    }
    let specials = |m: &Manifest| {
        format!(
            "{:?} bos_prepended={} eos_appended={}",
            m.special_tokens, m.bos_prepended, m.eos_appended
        )
    };
    if specials(a) != specials(b) {
        return differ("special tokens", specials(a), specials(b));
    }
    Ok(())
}

/// An output directory that is new, empty, or (with `overwrite`) emptied of prep's files.
fn prepare_output(dir: &Path, overwrite: bool) -> Result<(), ShuffleError> {
    let io = |e| ShuffleError::Io {
        path: dir.into(),
        source: e,
    };
    if dir.exists() {
        let has_entries = std::fs::read_dir(dir).map_err(io)?.next().is_some();
        if has_entries && !overwrite {
            return Err(ShuffleError::OutputExists {
                dir: dir.into(),
                why: "is not empty (choose a new directory, or pass --overwrite)".into(),
            });
        }
        if has_entries {
            for entry in std::fs::read_dir(dir).map_err(io)? {
                let path = entry.map_err(io)?.path();
                let r = if path.is_dir() {
                    std::fs::remove_dir_all(&path)
                } else {
                    std::fs::remove_file(&path)
                };
                r.map_err(|e| ShuffleError::Io { path, source: e })?;
            }
        }
        Ok(())
    } else {
        std::fs::create_dir_all(dir).map_err(io)
    }
}

/// Calls `f(g, bytes)` for every input document in order, reading each
/// shard's index and tokens sequentially (not through the mapping, so that
/// file pages do not count against the budget).
fn for_each_document(
    paths: &[PathBuf],
    datasets: &[Dataset],
    mut f: impl FnMut(u64, &[u8]) -> Result<(), ShuffleError>,
) -> Result<(), ShuffleError> {
    let mut g = 0u64;
    let mut record = Vec::new();
    for (dir, ds) in paths.iter().zip(datasets) {
        let size = ds.dtype().size();
        for shard in &ds.manifest().shards {
            let open = |name: &str| {
                let path = dir.join(name);
                File::open(&path)
                    .map(|f| BufReader::with_capacity(IO_BUFFER, f))
                    .map_err(|e| ShuffleError::Io { path, source: e })
            };
            let mut idx = open(&shard.idx)?;
            let mut bin = open(&shard.bin)?;
            let io = |name: &str| {
                let path = dir.join(name);
                move |e| ShuffleError::Io { path, source: e }
            };
            let mut skip = [0u8; IDX_HEADER_LEN + 8];
            idx.read_exact(&mut skip).map_err(io(&shard.idx))?;
            let mut prev = 0u64;
            for _ in 0..shard.n_records {
                let mut word = [0u8; 8];
                idx.read_exact(&mut word).map_err(io(&shard.idx))?;
                let end = u64::from_le_bytes(word);
                // Dataset::open checked the offsets: they never decrease.
                record.resize(((end - prev) as usize) * size, 0);
                bin.read_exact(&mut record).map_err(io(&shard.bin))?;
                f(g, &record)?;
                g += 1;
                prev = end;
            }
        }
    }
    Ok(())
}

/// Bytes moved so far, for progress.
struct Moved {
    bytes: u64,
    total: u64,
    docs: u64,
}

impl Moved {
    fn report(&self, progress: &dyn Progress) {
        progress.update(&ProgressSnapshot {
            input_bytes: self.bytes,
            input_total: self.total,
            documents: self.docs,
            text_bytes: 0,
            tokens: 0,
        });
    }
}

/// A bucket file being written: a buffered writer and its path.
struct Bucket {
    path: PathBuf,
    out: BufWriter<File>,
    bytes: u64,
}

fn open_buckets(
    dir: &Path,
    prefix: &str,
    n: u64,
    buffer: usize,
) -> Result<Vec<Bucket>, ShuffleError> {
    (0..n)
        .map(|i| {
            let path = dir.join(format!("{prefix}-{i:03}.bucket"));
            let file = File::create(&path).map_err(|e| ShuffleError::Io {
                path: path.clone(),
                source: e,
            })?;
            Ok(Bucket {
                path,
                out: BufWriter::with_capacity(buffer, file),
                bytes: 0,
            })
        })
        .collect()
}

fn put(bucket: &mut Bucket, key: u64, g: u64, tokens: &[u8]) -> Result<(), ShuffleError> {
    let mut head = [0u8; BUCKET_HEADER];
    head[..8].copy_from_slice(&key.to_le_bytes());
    head[8..16].copy_from_slice(&g.to_le_bytes());
    head[16..].copy_from_slice(&(tokens.len() as u64).to_le_bytes());
    let io = |e| ShuffleError::Io {
        path: bucket.path.clone(),
        source: e,
    };
    bucket.out.write_all(&head).map_err(io)?;
    bucket.out.write_all(tokens).map_err(io)?;
    bucket.bytes += (BUCKET_HEADER + tokens.len()) as u64;
    Ok(())
}

fn close(buckets: Vec<Bucket>) -> Result<Vec<(PathBuf, u64)>, ShuffleError> {
    buckets
        .into_iter()
        .map(|mut b| {
            b.out.flush().map_err(|e| ShuffleError::Io {
                path: b.path.clone(),
                source: e,
            })?;
            Ok((b.path, b.bytes))
        })
        .collect()
}

/// Write buffers for `n` buckets: a quarter of the budget between them.
fn bucket_buffer(budget: u64, n: u64) -> usize {
    (budget / 4 / n).clamp(64 << 10, 4 << 20) as usize
}

/// The first pass: every input document into the bucket of its key's top `bits` bits.
fn scatter_inputs(
    config: &ShuffleConfig,
    datasets: &[Dataset],
    tmp: &Path,
    bits: u32,
    budget: u64,
    moved: &mut Moved,
    progress: &dyn Progress,
) -> Result<Vec<(PathBuf, u64)>, ShuffleError> {
    let n = 1u64 << bits;
    let mut buckets = open_buckets(tmp, "b", n, bucket_buffer(budget, n))?;
    for_each_document(&config.inputs, datasets, |g, tokens| {
        let k = key(config.seed, g);
        put(&mut buckets[(k >> (64 - bits)) as usize], k, g, tokens)?;
        moved.bytes += tokens.len() as u64;
        if g % 4096 == 0 {
            moved.report(progress);
        }
        Ok(())
    })?;
    close(buckets)
}

/// The second pass over one bucket: sort it in memory and write it out, or,
/// if it is larger than the budget, split it on the next bits of the key.
#[allow(clippy::too_many_arguments)]
fn gather(
    pool: &rayon::ThreadPool,
    writer: &mut DatasetWriter,
    bucket: &(PathBuf, u64),
    bits: u32,
    budget: u64,
    moved: &mut Moved,
    progress: &dyn Progress,
) -> Result<(), ShuffleError> {
    let (path, bytes) = bucket;
    let io = |e| ShuffleError::Io {
        path: path.clone(),
        source: e,
    };
    if *bytes > budget / 2 && bits < 56 {
        // Split on the next bits: still in key order, bucket by bucket.
        let sub_bits = (bytes.div_ceil(budget / 2))
            .next_power_of_two()
            .clamp(2, MAX_BUCKETS)
            .trailing_zeros();
        let n = 1u64 << sub_bits;
        let prefix = path
            .file_stem()
            .expect("a bucket name")
            .to_string_lossy()
            .into_owned();
        let dir = path.parent().expect("in the temporary directory");
        let mut subs = open_buckets(dir, &prefix, n, bucket_buffer(budget, n))?;
        read_bucket(path, |k, g, tokens| {
            let i = (k << bits) >> (64 - sub_bits);
            put(&mut subs[i as usize], k, g, tokens)
        })?;
        std::fs::remove_file(path).map_err(io)?;
        for sub in close(subs)? {
            gather(pool, writer, &sub, bits + sub_bits, budget, moved, progress)?;
        }
        return Ok(());
    }
    let mut data = Vec::with_capacity(*bytes as usize);
    let mut entries = Vec::new();
    read_bucket(path, |key, g, tokens| {
        entries.push(Entry {
            key,
            g,
            offset: data.len(),
            len: tokens.len(),
        });
        data.extend_from_slice(tokens);
        Ok(())
    })?;
    std::fs::remove_file(path).map_err(io)?;
    write_sorted(pool, writer, &data, entries, moved, progress)
}

/// Reads a bucket file's documents in the order written.
fn read_bucket(
    path: &Path,
    mut f: impl FnMut(u64, u64, &[u8]) -> Result<(), ShuffleError>,
) -> Result<(), ShuffleError> {
    let io = |e| ShuffleError::Io {
        path: path.into(),
        source: e,
    };
    let mut r = BufReader::with_capacity(IO_BUFFER, File::open(path).map_err(io)?);
    let mut head = [0u8; BUCKET_HEADER];
    let mut tokens = Vec::new();
    loop {
        match r.read_exact(&mut head) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => return Ok(()),
            Err(e) => return Err(io(e)),
        }
        let word = |i: usize| u64::from_le_bytes(head[i..i + 8].try_into().expect("8 bytes"));
        tokens.resize(word(16) as usize, 0);
        r.read_exact(&mut tokens).map_err(io)?;
        f(word(0), word(8), &tokens)?;
    }
}

/// Sorts entries by (key, index) and writes their documents in that order.
fn write_sorted(
    pool: &rayon::ThreadPool,
    writer: &mut DatasetWriter,
    data: &[u8],
    mut entries: Vec<Entry>,
    moved: &mut Moved,
    progress: &dyn Progress,
) -> Result<(), ShuffleError> {
    // (key, g) pairs are unique, so an unstable parallel sort is deterministic.
    pool.install(|| {
        use rayon::slice::ParallelSliceMut;
        entries.par_sort_unstable_by_key(|e| (e.key, e.g));
    });
    for e in &entries {
        writer.push_raw(&data[e.offset..e.offset + e.len])?;
        moved.bytes += e.len as u64;
        moved.docs += 1;
        if moved.docs % 4096 == 0 {
            moved.report(progress);
        }
    }
    Ok(())
}
