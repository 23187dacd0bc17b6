//! `prep export` and `prep import`: the token files other trainers load
//! (Megatron-LM/NeMo, nanoGPT, llm.c, datatrove, and OLMo-core's
//! fine-tuning files), written from a prep dataset and read back into one
//! (all but OLMo-core's, which are written only).
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
pub mod olmocore;

use std::path::{Path, PathBuf};

use serde_json::json;

use crate::format::{
    checksum_hex, AtomicFile, Dataset, DatasetWriter, DocumentCounts, Dtype, FormatError,
    InputInfo, Manifest, Provenance, SpecialTokens, TokenizerInfo,
};
use crate::output::{Output, OutputError, Start, TOKENIZER_FILE};

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
    /// OLMo-core's fine-tuning files (ids, label masks, document
    /// boundaries), as open-instruct writes them; export only.
    OlmoCore,
}

impl Format {
    /// The name on the command line.
    pub fn name(self) -> &'static str {
        match self {
            Format::Megatron => "megatron",
            Format::NanoGpt => "nanogpt",
            Format::Llmc => "llmc",
            Format::Datatrove => "datatrove",
            Format::OlmoCore => "olmo-core",
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
    /// The output directory was refused or is held by another run.
    #[error(transparent)]
    Output(#[from] OutputError),
    /// An input dataset in object storage could not be fetched.
    #[error(transparent)]
    Fetch(#[from] crate::fetch::FetchError),
    /// Writing the exported files to object storage failed.
    #[error(transparent)]
    Store(#[from] crate::store::StoreError),
}

pub(crate) fn io(path: &Path) -> impl Fn(std::io::Error) -> InteropError + '_ {
    move |source| InteropError::Format(crate::format::FormatError::io(path, source))
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
    /// llmc: tokens per shard, at most: 1 to 1,073,741,311 for uint16
    /// shards (what llm.c's C loader can seek within), to 2^31 − 1 for
    /// uint32 shards.
    pub shard_tokens: u64,
    /// llmc: tokens of the validation shard (`NAME_val_000000.bin`), taken
    /// from the start of the stream; 0 for none.
    pub val_tokens: u64,
    /// llmc: put each document's end-of-text token before it, as llm.c does
    /// (documents datasets only: a packed row does not end with its eos).
    pub eot_first: bool,
    /// llmc: B × T × processes of the llm.c run that reads the export. Its
    /// loader aborts at start-up on a shard of no more than that many
    /// tokens, so every shard must hold more: a short last train shard takes
    /// what it lacks from the one before it, and what cannot be made to fit
    /// is refused. `None`: no such check.
    pub batch_tokens: Option<u64>,
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
            batch_tokens: None,
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
///
/// Every chunk of every shard (its checksum, every id below the vocabulary
/// size, every mask byte 0 or 1) is checked as the tokens are read, before
/// they are copied ([`Dataset::verified`]); the output files keep temporary
/// names until all of them are complete and checked, so an error (a damaged
/// shard, an id out of range, a full disk) leaves no output behind, and no
/// directory the export made.
pub fn export(config: &ExportConfig) -> Result<ExportReport, InteropError> {
    if let Some(url) = config.output.to_str().filter(|o| crate::store::is_url(o)) {
        return export_to_store(config, url);
    }
    let local = crate::fetch::Local::of(&config.input)?;
    let ds = match config.format {
        Format::OlmoCore | Format::Megatron | Format::NanoGpt => Dataset::open(local.dir())?,
        _ => Dataset::open_unmasked(local.dir(), "prep export")?,
    };
    let dir = match config.format {
        Format::Llmc | Format::OlmoCore => config.output.as_path(),
        _ => config.output.parent().unwrap_or(Path::new("")),
    };
    let made: Vec<PathBuf> = dir
        .ancestors()
        .filter(|d| !d.as_os_str().is_empty() && !d.exists())
        .map(Path::to_path_buf)
        .collect();
    let result = match config.format {
        Format::Megatron => megatron::export(&ds, config),
        Format::NanoGpt => nanogpt::export(&ds, config),
        Format::Llmc => llmc::export(&ds, config),
        Format::Datatrove => datatrove::export(&ds, config),
        Format::OlmoCore => olmocore::export(&ds, config),
    };
    if result.is_err() {
        // Deepest first; `remove_dir` leaves a directory that is not empty.
        for d in &made {
            let _ = std::fs::remove_dir(d);
        }
    }
    result
}

/// [`export`] to object storage: the files are written, complete and
/// checked, into a staging folder of this run's, then uploaded (the index
/// and metadata files after the data they describe); an existing object is
/// refused unless `--overwrite`, before anything is sent. A failed upload
/// removes the objects this run already sent: no reader sees half an export.
fn export_to_store(config: &ExportConfig, url: &str) -> Result<ExportReport, InteropError> {
    let url = url.trim_end_matches('/');
    let (base, name) = url.rsplit_once('/').unwrap_or((url, ""));
    let staging = crate::output::staging_for(&format!("{url} (export)"));
    let _ = std::fs::remove_dir_all(&staging);
    struct Tidy<'a>(&'a Path);
    impl Drop for Tidy<'_> {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(self.0);
        }
    }
    let _tidy = Tidy(&staging);
    let mut local = config.clone();
    local.output = staging.join(if name.is_empty() { "export" } else { name });
    local.overwrite = true;
    let mut report = export(&local)?;

    let mut targets = Vec::new();
    for file in &report.files {
        let rel = file
            .strip_prefix(&staging)
            .expect("the export writes inside its staging folder");
        let rel = rel.to_string_lossy().replace('\\', "/");
        targets.push((
            file.clone(),
            crate::store::Object::at(&format!("{base}/{rel}"))?,
        ));
    }
    if !config.overwrite {
        for (_, object) in &targets {
            if object.head()?.is_some() {
                return Err(InteropError::Exists(object.url().into()));
            }
        }
    }
    // Data first, then what describes it.
    let describes = |o: &crate::store::Object| {
        [".idx", ".index", ".metadata"]
            .iter()
            .any(|e| o.url().ends_with(e))
    };
    targets.sort_by_key(|(_, o)| describes(o));
    let mut sent: Vec<&crate::store::Object> = Vec::new();
    for (file, object) in &targets {
        if let Err(e) = object.upload(file, None) {
            for done in sent {
                let _ = done.delete();
            }
            return Err(e.into());
        }
        sent.push(object);
    }
    report.files = targets
        .iter()
        .map(|(_, o)| PathBuf::from(o.url()))
        .collect();
    Ok(report)
}

/// An export's output file: [`AtomicFile`] (temporary name, fsync, rename,
/// removed on drop), refused when the file exists and `--overwrite` was not
/// given, its parent folders made.
pub(crate) struct TmpFile {
    path: PathBuf,
    file: AtomicFile,
}

impl TmpFile {
    pub(crate) fn create(path: &Path, overwrite: bool) -> Result<TmpFile, InteropError> {
        if path.exists() && !overwrite {
            return Err(InteropError::Exists(path.into()));
        }
        if let Some(parent) = path.parent().filter(|p| !p.as_os_str().is_empty()) {
            std::fs::create_dir_all(parent).map_err(io(parent))?;
        }
        Ok(TmpFile {
            path: path.into(),
            file: AtomicFile::create(path)?,
        })
    }

    pub(crate) fn write(&mut self, bytes: &[u8]) -> Result<(), InteropError> {
        Ok(self.file.write(bytes)?)
    }

    pub(crate) fn bytes(&self) -> u64 {
        self.file.bytes()
    }

    /// Flushes, syncs and closes the file, which keeps its temporary name
    /// (and is still removed on drop) until [`TmpFile::commit`].
    pub(crate) fn close(&mut self) -> Result<(), InteropError> {
        Ok(self.file.close()?)
    }

    /// Closes the file if open and renames it into place; returns the final path.
    pub(crate) fn commit(self) -> Result<PathBuf, InteropError> {
        self.file.commit()?;
        Ok(self.path)
    }
}

/// Writes every token of `ds` (records back to back) to `out`, in large
/// spans straight from the mapping, each read through the dataset's checks
/// ([`Dataset::verified`]): a damaged shard or an id past the vocabulary
/// stops the export before its bytes are written.
pub(crate) fn write_all_tokens(ds: &Dataset, out: &mut TmpFile) -> Result<(), InteropError> {
    const SPAN: u64 = 4 << 20;
    let checked = ds.verified()?;
    let mut at = 0;
    while at < ds.n_tokens() {
        let end = (at + SPAN).min(ds.n_tokens());
        for span in checked.tokens(at..end)? {
            out.write(span.as_bytes())?;
        }
        at = end;
    }
    Ok(())
}

/// The loss mask file beside the token file `tokens` of an export whose
/// format has no place for masks (megatron, nanogpt): `NAME.mask` for
/// `NAME.bin` (else the name with `.mask` added), a byte per token of the
/// token file, 1 where trained on, and nothing else. The trainers do not
/// read it; training code of one's own maps it beside the tokens.
pub(crate) fn mask_file(
    tokens: &Path,
    ds: &Dataset,
    overwrite: bool,
) -> Result<TmpFile, InteropError> {
    let name = tokens.to_string_lossy();
    let path = match name.strip_suffix(".bin") {
        Some(stem) => PathBuf::from(format!("{stem}.mask")),
        None => PathBuf::from(format!("{name}.mask")),
    };
    let mut out = TmpFile::create(&path, overwrite)?;
    write_all_masks(ds, &mut out)?;
    out.close()?;
    Ok(out)
}

/// Writes every record's loss mask, a byte per token in the order of the
/// token stream, into `out`, each read through the dataset's checks: the
/// mask file an export writes beside tokens whose format has no place for
/// one.
pub(crate) fn write_all_masks(ds: &Dataset, out: &mut TmpFile) -> Result<(), InteropError> {
    let checked = ds.verified()?;
    for r in 0..ds.len() {
        out.write(checked.loss_mask(r)?.unwrap_or(&[]))?;
    }
    Ok(())
}

/// The largest id of a dataset, scanning (through the dataset's checks)
/// only when the vocabulary does not already bound it below `limit`;
/// `None` when every id is at most `limit`.
pub(crate) fn id_above(ds: &Dataset, limit: u64) -> Result<Option<u64>, InteropError> {
    if ds.manifest().vocab_size <= limit + 1 {
        return Ok(None);
    }
    let mut max = 0u64;
    for span in ds.verified()?.tokens(0..ds.n_tokens())? {
        max = max.max(span.iter().map(u64::from).max().unwrap_or(0));
    }
    Ok((max > limit).then_some(max))
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
    /// Shard size and whether to replace what the output holds.
    pub writing: crate::run::Writing,
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
    /// 4-byte source tokens are int32 (Megatron), not uint32.
    signed: bool,
    max_id: u64,
    records: u64,
    eos: Option<u32>,
    all_end_with_eos: bool,
    scratch: Vec<u8>,
    path: PathBuf,
}

impl RecordSink for ImportWriter {
    fn record(&mut self, bytes: &[u8], size: usize) -> Result<(), InteropError> {
        // One pass over the ids: the largest (negative ones, where the
        // source is int32), the last.
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
                // Megatron's code 4 is int32: the sign bit makes a negative
                // id. llm.c and datatrove write uint32: every bit is the id.
                let mut top = 0u32;
                for c in bytes.chunks_exact(4) {
                    top = top.max(u32::from_le_bytes([c[0], c[1], c[2], c[3]]));
                }
                if self.signed && top > i32::MAX as u32 {
                    let negative = bytes
                        .chunks_exact(4)
                        .map(|c| i32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                        .min()
                        .unwrap_or(0);
                    return Err(bad(
                        &self.path,
                        format!("a negative token id {negative} (int32 tokens)"),
                    ));
                }
                max = u64::from(top);
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
/// The output directory's lifecycle is [`Output`]'s: locked, refused or
/// overwritten as for any stage, the manifest last; on an error the shards
/// written so far are removed again (an import is redone, not resumed), so a
/// bad input leaves no half-made dataset behind.
pub fn import(config: &ImportConfig) -> Result<Manifest, InteropError> {
    if config.format == Format::OlmoCore {
        return Err(InteropError::Unsupported(
            "prep import reads megatron, nanogpt, llmc and datatrove files; olmo-core is an \
             export format only"
                .into(),
        ));
    }
    let options = json!({
        "format": config.format.name(),
        "eos": config.eos,
        "eot_first": config.eot_first,
        "shard_size": config.writing.shard_size,
    });
    let given: Vec<InputInfo> = config
        .inputs
        .iter()
        .map(|p| {
            let meta = std::fs::metadata(p).ok();
            InputInfo {
                path: p.display().to_string(),
                bytes: meta.as_ref().map_or(0, |m| m.len()),
                xxh3: None,
                version: meta.as_ref().and_then(crate::input::version_of),
            }
        })
        .collect();
    let fingerprint = crate::run::job_fingerprint("import", &options, &given);
    let mut output = Output::lock(&config.output, config.writing.single_writer)?;
    match output.start::<(), ()>(&fingerprint, config.writing.overwrite)? {
        Start::Complete(manifest) => return Ok(*manifest),
        Start::Fresh(_) => {}
        Start::Resume(_) => {
            output.restart::<(), ()>(&fingerprint)?;
        }
    }
    let manifest = import_into(config, &output, options, fingerprint);
    if manifest.is_err() {
        // Nothing of a failed import is worth keeping.
        output.discard()?;
    }
    let manifest = manifest?;
    output.commit(&manifest)?;
    Ok(manifest)
}

fn import_into(
    config: &ImportConfig,
    output: &Output,
    options: serde_json::Value,
    fingerprint: String,
) -> Result<Manifest, InteropError> {
    let out = output.dir();
    let tokenizer = match &config.tokenizer {
        Some(path) => {
            // Its size and its copy are all an import needs: the engine's
            // reading, from the compiled cache where it can.
            let read =
                crate::engine::LoadedTokenizer::load_with_fast(path, crate::engine::Readings::Fast);
            Some(read.map_err(|e| bad(path, e.to_string()))?.0)
        }
        None => None,
    };
    let source_size = source_token_size(config)?;
    let dtype = match &tokenizer {
        Some(t) => Dtype::for_vocab_size(t.vocab_size),
        None => Dtype::from_size(source_size as u8).expect("2 or 4"),
    };
    let mut sink = ImportWriter {
        writer: DatasetWriter::new(out, dtype, config.writing.shard_size, Vec::new()),
        dtype,
        signed: config.format == Format::Megatron,
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
            Format::OlmoCore => unreachable!("refused above"),
        };
        for f in files {
            let meta = std::fs::metadata(&f).map_err(io(&f))?;
            inputs.push(InputInfo {
                path: f.display().to_string(),
                bytes: meta.len(),
                xxh3: None,
                version: crate::input::version_of(&meta),
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
            output.put(TOKENIZER_FILE, &t.json)?;
            TokenizerInfo {
                file: Some(TOKENIZER_FILE.into()),
                xxh3: checksum_hex(t.xxh3),
            }
        }
        None => TokenizerInfo {
            file: None,
            xxh3: checksum_hex(0),
        },
    };
    Ok(Manifest::documents(
        dtype,
        vocab_size,
        tokenizer_info,
        shards,
        Provenance::new(
            "import",
            inputs,
            options,
            DocumentCounts::all_written(records),
            fingerprint,
        ),
    )
    .with_specials(
        SpecialTokens {
            bos: None,
            eos: config.eos,
            pad: None,
        },
        false,
        all_eos,
    ))
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
            Format::OlmoCore => unreachable!("refused by import"),
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
