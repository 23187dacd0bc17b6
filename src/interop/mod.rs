//! `prep export` and `prep import`: the token files other trainers load
//! (Megatron-LM/NeMo, nanoGPT, llm.c, datatrove), written from a prep
//! dataset and read back into one.
//!
//! Every layout is specified in its module, from the facts the trainers'
//! loaders check. Exports write each file under a temporary name and rename
//! it when complete; imports write an ordinary prep dataset (shards,
//! checksums, manifest last). A round trip prep → format → prep gives the
//! same records (for nanoGPT and llm.c, which keep no document boundaries,
//! by splitting at the end-of-text token: `--eos`).

pub mod datatrove;
pub mod llmc;
pub mod megatron;
pub mod nanogpt;

use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};

use serde_json::json;

use crate::format::{
    atomic_write, checksum_hex, Dataset, DatasetWriter, DocumentCounts, Dtype, FormatError,
    InputInfo, Manifest, Provenance, SpecialTokens, TokenizerInfo, FORMAT_NAME, FORMAT_VERSION,
    MANIFEST_FILE,
};

/// The formats `prep export` writes and `prep import` reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    /// Megatron-LM / NeMo indexed dataset: `PREFIX.bin` + `PREFIX.idx` (MMIDIDX).
    Megatron,
    /// nanoGPT: one flat file of uint16 tokens.
    NanoGpt,
    /// llm.c: shards with a 1,024-byte header.
    Llmc,
    /// datatrove / nanotron: `PREFIX.ds` + `.ds.index` + `.ds.metadata`.
    Datatrove,
}

impl Format {
    /// The name on the command line.
    pub fn name(self) -> &'static str {
        match self {
            Format::Megatron => "megatron",
            Format::NanoGpt => "nanogpt",
            Format::Llmc => "llmc",
            Format::Datatrove => "datatrove",
        }
    }
}

/// Every way an export or import can fail.
#[derive(Debug, thiserror::Error)]
pub enum InteropError {
    /// Reading or writing a prep dataset failed.
    #[error(transparent)]
    Format(#[from] FormatError),
    /// A file of another format is not what that format says.
    #[error("{}: {message}", path.display())]
    Bad {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        message: String,
    },
    /// The dataset cannot be written in the format asked for.
    #[error("{0}")]
    Unsupported(String),
    /// An output exists and `--overwrite` was not given.
    #[error("{}: exists (pass --overwrite to replace it)", .0.display())]
    Exists(PathBuf),
    /// An I/O error.
    #[error("{}: {source}", path.display())]
    Io {
        /// The file.
        path: PathBuf,
        /// The underlying error.
        source: std::io::Error,
    },
}

pub(crate) fn io(path: &Path) -> impl Fn(std::io::Error) -> InteropError + '_ {
    move |source| InteropError::Io {
        path: path.into(),
        source,
    }
}

pub(crate) fn bad(path: &Path, message: impl Into<String>) -> InteropError {
    InteropError::Bad {
        path: path.into(),
        message: message.into(),
    }
}

/// What `prep export` is asked to do.
#[derive(Debug, Clone)]
pub struct ExportConfig {
    /// The prep dataset.
    pub input: PathBuf,
    /// The format.
    pub format: Format,
    /// megatron, datatrove: the path prefix; nanogpt: the file; llmc: the directory.
    pub output: PathBuf,
    /// llmc: shard names are `NAME_train_NNNNNN.bin`.
    pub name: String,
    /// llmc: tokens per shard, at most.
    pub shard_tokens: u64,
    /// llmc: tokens of the validation shard (`NAME_val_000000.bin`), taken
    /// from the start of the stream; 0 for none.
    pub val_tokens: u64,
    /// llmc: put each document's end-of-text token before it, as llm.c does.
    pub eot_first: bool,
    /// datatrove: the tokenizer name written in the metadata.
    pub tokenizer_name: String,
    /// Replace existing output files.
    pub overwrite: bool,
}

impl ExportConfig {
    /// A config with the CLI's defaults.
    pub fn new(input: impl Into<PathBuf>, format: Format, output: impl Into<PathBuf>) -> Self {
        ExportConfig {
            input: input.into(),
            format,
            output: output.into(),
            name: "prep".into(),
            shard_tokens: 100_000_000,
            val_tokens: 0,
            eot_first: false,
            tokenizer_name: "prep".into(),
            overwrite: false,
        }
    }
}

/// What an export wrote.
#[derive(Debug, Clone)]
pub struct ExportReport {
    /// The files written, in order.
    pub files: Vec<PathBuf>,
    /// Records written.
    pub records: u64,
    /// Tokens written.
    pub tokens: u64,
    /// Bytes written.
    pub bytes: u64,
}

/// Runs `prep export`.
pub fn export(config: &ExportConfig) -> Result<ExportReport, InteropError> {
    let ds = Dataset::open(&config.input)?;
    match config.format {
        Format::Megatron => megatron::export(&ds, config),
        Format::NanoGpt => nanogpt::export(&ds, config),
        Format::Llmc => llmc::export(&ds, config),
        Format::Datatrove => datatrove::export(&ds, config),
    }
}

/// A file written under `NAME.tmp` and renamed into place by [`TmpFile::commit`].
pub(crate) struct TmpFile {
    path: PathBuf,
    tmp: PathBuf,
    out: Option<BufWriter<File>>,
    bytes: u64,
}

impl TmpFile {
    pub(crate) fn create(path: &Path, overwrite: bool) -> Result<TmpFile, InteropError> {
        if path.exists() && !overwrite {
            return Err(InteropError::Exists(path.into()));
        }
        if let Some(parent) = path.parent().filter(|p| !p.as_os_str().is_empty()) {
            std::fs::create_dir_all(parent).map_err(io(parent))?;
        }
        let mut name = path.file_name().expect("a file name").to_os_string();
        name.push(".tmp");
        let tmp = path.with_file_name(name);
        let file = File::create(&tmp).map_err(io(&tmp))?;
        Ok(TmpFile {
            path: path.into(),
            tmp,
            out: Some(BufWriter::with_capacity(1 << 20, file)),
            bytes: 0,
        })
    }

    pub(crate) fn write(&mut self, bytes: &[u8]) -> Result<(), InteropError> {
        self.bytes += bytes.len() as u64;
        let tmp = &self.tmp;
        self.out
            .as_mut()
            .expect("open until committed")
            .write_all(bytes)
            .map_err(io(tmp))
    }

    pub(crate) fn bytes(&self) -> u64 {
        self.bytes
    }

    /// Flushes, syncs and renames into place; returns the final path.
    pub(crate) fn commit(mut self) -> Result<PathBuf, InteropError> {
        let out = self.out.take().expect("open until committed");
        let file = out.into_inner().map_err(|e| InteropError::Io {
            path: self.tmp.clone(),
            source: e.into_error(),
        })?;
        file.sync_all().map_err(io(&self.tmp))?;
        std::fs::rename(&self.tmp, &self.path).map_err(io(&self.path))?;
        Ok(self.path.clone())
    }
}

impl Drop for TmpFile {
    fn drop(&mut self) {
        if self.out.is_some() {
            let _ = std::fs::remove_file(&self.tmp);
        }
    }
}

/// Writes every token of `ds` (records back to back) to `out`, in large
/// spans straight from the mapping.
pub(crate) fn write_all_tokens(ds: &Dataset, out: &mut TmpFile) -> Result<(), InteropError> {
    const SPAN: u64 = 4 << 20;
    let mut at = 0;
    while at < ds.n_tokens() {
        let end = (at + SPAN).min(ds.n_tokens());
        for span in ds.tokens(at..end)? {
            out.write(span.as_bytes())?;
        }
        at = end;
    }
    Ok(())
}

/// The largest id of a dataset, scanning only when the vocabulary does not
/// already bound it below `limit`; `None` when every id is at most `limit`.
pub(crate) fn id_above(ds: &Dataset, limit: u64) -> Option<u64> {
    if ds.manifest().vocab_size <= limit + 1 {
        return None;
    }
    let mut max = 0u64;
    for span in ds.tokens(0..ds.n_tokens()).ok()? {
        max = max.max(span.iter().map(u64::from).max().unwrap_or(0));
    }
    (max > limit).then_some(max)
}

/// What `prep import` is asked to do.
#[derive(Debug, Clone)]
pub struct ImportConfig {
    /// The format of the inputs.
    pub format: Format,
    /// The inputs, read in order: megatron and datatrove path prefixes,
    /// nanoGPT files, llm.c directories or shard files.
    pub inputs: Vec<PathBuf>,
    /// The prep dataset to write.
    pub output: PathBuf,
    /// A tokenizer.json to copy into the dataset and take the vocabulary from.
    pub tokenizer: Option<PathBuf>,
    /// nanoGPT, llm.c: end a record after each of these ids (before each,
    /// with `eot_first`); without it, each input is one record.
    pub eos: Option<u32>,
    /// llm.c: the end-of-text token comes before each document; the record
    /// gets it at its end, as prep keeps it.
    pub eot_first: bool,
    /// Largest `.bin` per output shard.
    pub shard_size: u64,
    /// Replace an existing dataset.
    pub overwrite: bool,
}

/// A token stream's records as they are read: the token size of the
/// source, then records.
pub(crate) trait RecordSink {
    /// One record, as little-endian tokens of `size` bytes each.
    fn record(&mut self, bytes: &[u8], size: usize) -> Result<(), InteropError>;
}

/// Writes imported records into a prep dataset and keeps what the manifest needs.
struct ImportWriter {
    writer: DatasetWriter,
    dtype: Dtype,
    max_id: u64,
    records: u64,
    eos: Option<u32>,
    all_end_with_eos: bool,
    scratch: Vec<u8>,
    path: PathBuf,
}

impl RecordSink for ImportWriter {
    fn record(&mut self, bytes: &[u8], size: usize) -> Result<(), InteropError> {
        // One pass over the ids: the largest, negative int32 ids, the last.
        let mut max = 0u64;
        let last;
        match size {
            2 => {
                for c in bytes.chunks_exact(2) {
                    max = max.max(u64::from(u16::from_le_bytes([c[0], c[1]])));
                }
                last = bytes
                    .len()
                    .checked_sub(2)
                    .map(|i| u64::from(u16::from_le_bytes([bytes[i], bytes[i + 1]])));
            }
            _ => {
                let mut min = 0i64;
                for c in bytes.chunks_exact(4) {
                    let v = i64::from(i32::from_le_bytes([c[0], c[1], c[2], c[3]]));
                    min = min.min(v);
                    max = max.max(v.max(0) as u64);
                }
                if min < 0 {
                    return Err(bad(&self.path, format!("a negative token id {min}")));
                }
                last = bytes.len().checked_sub(4).map(|i| {
                    u64::from(u32::from_le_bytes(
                        bytes[i..i + 4].try_into().expect("4 bytes"),
                    ))
                });
            }
        }
        self.max_id = self.max_id.max(max);
        if last.is_none() || self.eos.map(u64::from) != last {
            self.all_end_with_eos = false;
        }
        self.records += 1;
        let out = self.dtype.size();
        if out == size {
            self.writer.push_raw(bytes)?;
            return Ok(());
        }
        if out == 2 && max > u64::from(u16::MAX) {
            return Err(bad(
                &self.path,
                format!("token id {max} does not fit the tokenizer's uint16"),
            ));
        }
        self.scratch.clear();
        for c in bytes.chunks_exact(size) {
            let id = if size == 2 {
                u32::from(u16::from_le_bytes([c[0], c[1]]))
            } else {
                u32::from_le_bytes([c[0], c[1], c[2], c[3]])
            };
            if out == 2 {
                self.scratch.extend_from_slice(&(id as u16).to_le_bytes());
            } else {
                self.scratch.extend_from_slice(&id.to_le_bytes());
            }
        }
        let scratch = std::mem::take(&mut self.scratch);
        self.writer.push_raw(&scratch)?;
        self.scratch = scratch;
        Ok(())
    }
}

/// Runs `prep import`: reads the inputs in order and writes a prep dataset.
///
/// On an error, the shards written so far are removed again: a bad input
/// leaves no half-made dataset behind.
pub fn import(config: &ImportConfig) -> Result<Manifest, InteropError> {
    let created = !config.output.join(MANIFEST_FILE).exists();
    let result = import_into(config);
    if result.is_err() && created && config.output.is_dir() {
        let _ = crate::format::remove_prep_files(&config.output);
    }
    result
}

fn import_into(config: &ImportConfig) -> Result<Manifest, InteropError> {
    let out = &config.output;
    if out.join(MANIFEST_FILE).exists() && !config.overwrite {
        return Err(InteropError::Exists(out.clone()));
    }
    std::fs::create_dir_all(out).map_err(io(out))?;
    if config.overwrite {
        crate::format::remove_prep_files(out)?;
    }
    let tokenizer = match &config.tokenizer {
        Some(path) => {
            Some(crate::engine::LoadedTokenizer::load(path).map_err(|e| bad(path, e.to_string()))?)
        }
        None => None,
    };
    let source_size = source_token_size(config)?;
    let dtype = match &tokenizer {
        Some(t) => t.dtype,
        None => Dtype::from_size(source_size as u8).expect("2 or 4"),
    };
    let mut sink = ImportWriter {
        writer: DatasetWriter::new(out, dtype, config.shard_size, Vec::new()),
        dtype,
        max_id: 0,
        records: 0,
        eos: config.eos,
        all_end_with_eos: true,
        scratch: Vec::new(),
        path: config.inputs.first().cloned().unwrap_or_default(),
    };
    let mut inputs = Vec::new();
    // llm.c shards of all inputs are one stream; the other formats are read
    // input by input.
    let groups: Vec<Vec<PathBuf>> = match config.format {
        Format::Llmc => vec![config.inputs.clone()],
        _ => config.inputs.iter().map(|i| vec![i.clone()]).collect(),
    };
    for group in &groups {
        let input = &group[0];
        sink.path = input.clone();
        let files = match config.format {
            Format::Megatron => megatron::import(input, &mut sink)?,
            Format::Datatrove => datatrove::import(input, &mut sink)?,
            Format::NanoGpt => nanogpt::import(input, config, &mut sink)?,
            Format::Llmc => llmc::import(group, config, &mut sink)?,
        };
        for f in files {
            let bytes = std::fs::metadata(&f).map_err(io(&f))?.len();
            inputs.push(InputInfo {
                path: f.display().to_string(),
                bytes,
                xxh3: None,
            });
        }
    }
    let records = sink.records;
    let all_eos = sink.all_end_with_eos && records > 0 && config.eos.is_some();
    let max_id = sink.max_id;
    let shards = sink.writer.finish()?;
    let vocab_size = match &tokenizer {
        Some(t) if config.eos.is_some_and(|e| u64::from(e) >= t.vocab_size) => {
            return Err(InteropError::Unsupported(format!(
                "--eos {} is not below the tokenizer's vocabulary size {}",
                config.eos.unwrap_or(0),
                t.vocab_size
            )));
        }
        Some(t) => {
            if records > 0 && max_id >= t.vocab_size {
                return Err(InteropError::Unsupported(format!(
                    "token id {max_id} is not below the tokenizer's vocabulary size {}",
                    t.vocab_size
                )));
            }
            t.vocab_size
        }
        // The vocabulary covers every id seen, and the eos named.
        None => max_id.max(config.eos.map_or(0, u64::from)) + 1,
    };
    let tokenizer_info = match &tokenizer {
        Some(t) => {
            atomic_write(&out.join("tokenizer.json"), &t.json)?;
            TokenizerInfo {
                file: Some("tokenizer.json".into()),
                xxh3: checksum_hex(t.xxh3),
            }
        }
        None => TokenizerInfo {
            file: None,
            xxh3: checksum_hex(0),
        },
    };
    let options = json!({
        "format": config.format.name(),
        "eos": config.eos,
        "eot_first": config.eot_first,
        "shard_size": config.shard_size,
    });
    let fingerprint = checksum_hex(xxhash_rust::xxh3::xxh3_64(
        json!({ "command": "import", "options": options, "inputs": inputs })
            .to_string()
            .as_bytes(),
    ));
    let manifest = Manifest {
        format: FORMAT_NAME.into(),
        version: FORMAT_VERSION,
        kind: "documents".into(),
        dtype,
        vocab_size,
        n_records: shards.iter().map(|s| s.n_records).sum(),
        n_tokens: shards.iter().map(|s| s.n_tokens).sum(),
        special_tokens: SpecialTokens {
            bos: None,
            eos: config.eos,
            pad: None,
        },
        bos_prepended: false,
        eos_appended: all_eos,
        tokenizer: tokenizer_info,
        shards,
        seq_len: None,
        packing: None,
        partition: None,
        provenance: Provenance::new(
            "import",
            inputs,
            options,
            DocumentCounts::all_written(records),
            fingerprint,
        ),
    };
    atomic_write(&out.join(MANIFEST_FILE), manifest.to_json().as_bytes())?;
    Ok(manifest)
}

/// The token size of the first input, which every input must share.
fn source_token_size(config: &ImportConfig) -> Result<usize, InteropError> {
    let mut size = None;
    for input in &config.inputs {
        let s = match config.format {
            Format::Megatron => megatron::token_size(input)?,
            Format::Datatrove => datatrove::token_size(input)?,
            Format::NanoGpt => 2,
            Format::Llmc => llmc::token_size(input)?,
        };
        if size.is_some_and(|prev| prev != s) {
            return Err(bad(
                input,
                format!(
                    "{s}-byte tokens, but the inputs before it have {}",
                    size.unwrap_or(0)
                ),
            ));
        }
        size = Some(s);
    }
    size.ok_or_else(|| InteropError::Unsupported("no input given".into()))
}

/// Splits a token stream into records: after each `eos`, or before each
/// (moving it to the record's end) with `eot_first`; one record for the
/// whole stream without `eos`.
pub(crate) struct Splitter<'a, S: RecordSink> {
    sink: &'a mut S,
    size: usize,
    eos: Option<u32>,
    eot_first: bool,
    current: Vec<u8>,
    /// eot_first: the current record began with the end-of-text token.
    open: bool,
}

impl<'a, S: RecordSink> Splitter<'a, S> {
    /// An error when `eos` does not fit the stream's tokens.
    pub(crate) fn new(
        sink: &'a mut S,
        size: usize,
        eos: Option<u32>,
        eot_first: bool,
    ) -> Result<Self, InteropError> {
        if let Some(eos) = eos {
            if size == 2 && eos > u32::from(u16::MAX) {
                return Err(InteropError::Unsupported(format!(
                    "--eos {eos} cannot occur in a file of uint16 tokens"
                )));
            }
        }
        Ok(Splitter {
            sink,
            size,
            eos,
            eot_first,
            current: Vec::new(),
            open: false,
        })
    }

    pub(crate) fn push(&mut self, bytes: &[u8]) -> Result<(), InteropError> {
        let Some(eos) = self.eos else {
            self.current.extend_from_slice(bytes);
            return Ok(());
        };
        let size = self.size;
        let eos_bytes = match size {
            2 => (eos as u16).to_le_bytes().to_vec(),
            _ => eos.to_le_bytes().to_vec(),
        };
        // Runs of tokens between end-of-text tokens are copied whole; the
        // tokens are compared as integers, not as byte slices.
        let ends: Vec<usize> = match size {
            2 => bytes
                .chunks_exact(2)
                .enumerate()
                .filter(|(_, c)| u32::from(u16::from_le_bytes([c[0], c[1]])) == eos)
                .map(|(i, _)| i * 2)
                .collect(),
            _ => bytes
                .chunks_exact(4)
                .enumerate()
                .filter(|(_, c)| u32::from_le_bytes([c[0], c[1], c[2], c[3]]) == eos)
                .map(|(i, _)| i * 4)
                .collect(),
        };
        let mut from = 0;
        for at in ends {
            if self.eot_first {
                self.current.extend_from_slice(&bytes[from..at]);
                if self.open || !self.current.is_empty() {
                    self.flush_eot_first(&eos_bytes)?;
                }
                self.open = true;
            } else if self.current.is_empty() {
                // The whole record is in this buffer: no copy.
                self.sink.record(&bytes[from..at + size], size)?;
            } else {
                self.current.extend_from_slice(&bytes[from..at + size]);
                self.sink.record(&self.current, size)?;
                self.current.clear();
            }
            from = at + size;
        }
        self.current
            .extend_from_slice(&bytes[from..bytes.len() - bytes.len() % size]);
        Ok(())
    }

    /// An eot-first record ends: its tokens, then the end-of-text token it
    /// began with.
    fn flush_eot_first(&mut self, eos_bytes: &[u8]) -> Result<(), InteropError> {
        if self.open {
            self.current.extend_from_slice(eos_bytes);
        }
        self.sink.record(&self.current, self.size)?;
        self.current.clear();
        self.open = false;
        Ok(())
    }

    /// The end of the stream: what is left is a last record (without eos).
    pub(crate) fn finish(mut self) -> Result<(), InteropError> {
        if self.eos.is_none() {
            return self.sink.record(&self.current, self.size);
        }
        if self.eot_first && (self.open || !self.current.is_empty()) {
            let eos = self.eos.expect("checked");
            let eos_bytes = match self.size {
                2 => (eos as u16).to_le_bytes().to_vec(),
                _ => eos.to_le_bytes().to_vec(),
            };
            return self.flush_eot_first(&eos_bytes);
        }
        if !self.current.is_empty() {
            let rest = std::mem::take(&mut self.current);
            self.sink.record(&rest, self.size)?;
        }
        Ok(())
    }
}
