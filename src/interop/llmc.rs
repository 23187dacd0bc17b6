//! llm.c token shards: a 1,024-byte header of 256 little-endian int32,
//! then the tokens. `h[0]` is the magic and `h[1]` the version: 20240520
//! and 1 for uint16 tokens, 20240801 and 7 for uint32 tokens; `h[2]` is the
//! number of tokens, below 2^31; the rest is zero. llm.c's loader checks
//! that the file is `1024 + count * token size` bytes.
//!
//! An export is a directory of `NAME_train_NNNNNN.bin` shards, numbered
//! from 1, each of at most `shard_tokens` tokens (documents run across
//! shard boundaries, as llm.c's own preparation scripts cut them), and,
//! with `val_tokens`, a `NAME_val_000000.bin` holding the first
//! `val_tokens` tokens of the stream.
//!
//! llm.c's C loader (`llmc/dataloader.h`) reads uint16 shards only, seeks
//! within them with a 32-bit `int` (so a shard ends below byte 2^31:
//! [`MAX_U16_SHARD_TOKENS`]) and aborts on a shard of no more than one
//! batch (`batch_tokens`); uint32 shards are read by the Python loader of
//! llm.c's `train_llama3.py`.
//!
//! llm.c puts the end-of-text token *before* each document; prep keeps it
//! at the end. `eot_first` moves each record's last token (its eos) to its
//! front on export, and back on import, so that a model trained on the
//! export sees documents as llm.c's scripts prepare them.

use std::path::{Path, PathBuf};

use super::{
    bad, io, ExportConfig, ExportReport, ImportConfig, InteropError, RecordSink, Splitter, TmpFile,
};
use crate::format::{Dataset, Dtype, MappedFile};

const HEADER: usize = 1024;

fn magic(dtype: Dtype) -> (i32, i32) {
    match dtype {
        Dtype::U16 => (20240520, 1),
        Dtype::U32 => (20240801, 7),
    }
}

fn header(dtype: Dtype, count: u64) -> [u8; HEADER] {
    let mut h = [0u8; HEADER];
    let (m, v) = magic(dtype);
    h[0..4].copy_from_slice(&m.to_le_bytes());
    h[4..8].copy_from_slice(&v.to_le_bytes());
    h[8..12].copy_from_slice(&(count as i32).to_le_bytes());
    h
}

/// Writes the token stream into shards whose sizes are fixed in advance.
/// A full shard is closed but keeps its temporary name until
/// [`Shards::commit`], so that a damaged shard of the dataset found later
/// leaves no llm.c shard behind.
struct Shards<'a> {
    config: &'a ExportConfig,
    dtype: Dtype,
    /// (path, tokens) of every shard, in stream order.
    plan: Vec<(PathBuf, u64)>,
    next: usize,
    current: Option<(TmpFile, u64)>,
    full: Vec<TmpFile>,
    bytes: u64,
}

impl Shards<'_> {
    fn write(&mut self, mut tokens: &[u8]) -> Result<(), InteropError> {
        let size = self.dtype.size();
        while !tokens.is_empty() {
            if self.current.is_none() {
                let (path, count) = self.plan[self.next].clone();
                self.next += 1;
                let mut file = TmpFile::create(&path, self.config.overwrite)?;
                file.write(&header(self.dtype, count))?;
                self.current = Some((file, count));
            }
            let (file, left) = self.current.as_mut().expect("opened above");
            let take = ((*left as usize) * size).min(tokens.len());
            file.write(&tokens[..take])?;
            *left -= (take / size) as u64;
            tokens = &tokens[take..];
            if *left == 0 {
                let (mut file, _) = self.current.take().expect("open");
                file.close()?;
                self.bytes += file.bytes();
                self.full.push(file);
            }
        }
        Ok(())
    }

    /// Renames every shard into place, once all are written and checked.
    fn commit(self) -> Result<Vec<PathBuf>, InteropError> {
        self.full.into_iter().map(TmpFile::commit).collect()
    }
}

/// The most tokens of one uint16 shard llm.c's C loader can read to its
/// end: it seeks with a 32-bit `int`, so every byte of the shard must lie
/// below 2^31.
pub const MAX_U16_SHARD_TOKENS: u64 = (i32::MAX as u64 - HEADER as u64) / 2;

/// The most tokens of one shard: the header counts them in an int32.
pub const MAX_SHARD_TOKENS: u64 = i32::MAX as u64;

/// The shard plan: (path, tokens) of the validation shard, then of every
/// train shard, in stream order.
fn plan(
    config: &ExportConfig,
    dtype: Dtype,
    total: u64,
) -> Result<Vec<(PathBuf, u64)>, InteropError> {
    let limit = match dtype {
        Dtype::U16 => MAX_U16_SHARD_TOKENS,
        Dtype::U32 => MAX_SHARD_TOKENS,
    };
    if config.shard_tokens == 0 || config.shard_tokens > limit {
        let why = match dtype {
            Dtype::U16 => "llm.c's C loader seeks within a uint16 shard with a 32-bit int",
            Dtype::U32 => "llm.c counts a shard's tokens in an int32",
        };
        return Err(InteropError::Unsupported(format!(
            "--shard-tokens {}: {why}; choose 1 to {limit}",
            config.shard_tokens
        )));
    }
    if config.val_tokens > 0 && config.val_tokens >= total && total > 0 {
        return Err(InteropError::Unsupported(format!(
            "--val-tokens {} takes all {total} tokens and leaves none to train on",
            config.val_tokens
        )));
    }
    if config.val_tokens > limit {
        return Err(InteropError::Unsupported(format!(
            "--val-tokens {}: one shard holds at most {limit} tokens",
            config.val_tokens
        )));
    }
    let dir = &config.output;
    let val = config.val_tokens.min(total);
    let mut counts = Vec::new();
    let mut left = total - val;
    while left > 0 {
        let count = left.min(config.shard_tokens);
        counts.push(count);
        left -= count;
    }
    // llm.c's loader needs more than one batch in every shard: a short
    // last shard takes what it lacks from the one before it.
    let need = config.batch_tokens.map(|b| b + 1);
    if let Some(need) = need {
        if val > 0 && val < need {
            return Err(InteropError::Unsupported(format!(
                "--val-tokens {val}: llm.c needs more than --batch-tokens {} tokens in every shard",
                need - 1
            )));
        }
        let n = counts.len();
        if n >= 2 && counts[n - 1] < need && counts[n - 2] + counts[n - 1] >= 2 * need {
            let lack = need - counts[n - 1];
            counts[n - 2] -= lack;
            counts[n - 1] = need;
        }
        if let Some(short) = counts.iter().find(|&&c| c < need) {
            return Err(InteropError::Unsupported(format!(
                "a train shard of {short} tokens: llm.c needs more than --batch-tokens {} tokens in every shard \
                 ({} train tokens in all, --shard-tokens {})",
                need - 1,
                total - val,
                config.shard_tokens
            )));
        }
    }
    let mut plan = Vec::new();
    if val > 0 {
        plan.push((dir.join(format!("{}_val_000000.bin", config.name)), val));
    }
    for (i, count) in counts.into_iter().enumerate() {
        let n = i + 1;
        plan.push((dir.join(format!("{}_train_{n:06}.bin", config.name)), count));
    }
    Ok(plan)
}

pub(crate) fn export(ds: &Dataset, config: &ExportConfig) -> Result<ExportReport, InteropError> {
    if config.eot_first {
        let m = ds.manifest();
        if m.kind != "documents" || m.packing.is_some() {
            return Err(InteropError::Unsupported(
                "--eot-first moves each document's final eos to its front, but this dataset is packed: \
                 its rows end mid-document. Export the documents dataset it was packed from"
                    .into(),
            ));
        }
        if !m.eos_appended || m.special_tokens.eos.is_none() {
            return Err(InteropError::Unsupported(
                "--eot-first moves each document's final eos to its front, but this dataset's documents do not end with eos".into(),
            ));
        }
    }
    let total = ds.n_tokens();
    let plan = plan(config, ds.dtype(), total)?;
    let dir = &config.output;
    std::fs::create_dir_all(dir).map_err(io(dir))?;
    if plan.is_empty() {
        // An empty dataset still gives llm.c a (valid, empty) train shard.
        let path = dir.join(format!("{}_train_000001.bin", config.name));
        let mut file = TmpFile::create(&path, config.overwrite)?;
        file.write(&header(ds.dtype(), 0))?;
        let bytes = file.bytes();
        return Ok(ExportReport {
            files: vec![file.commit()?],
            records: 0,
            tokens: 0,
            bytes,
        });
    }
    let mut shards = Shards {
        config,
        dtype: ds.dtype(),
        plan,
        next: 0,
        current: None,
        full: Vec::new(),
        bytes: 0,
    };
    let checked = ds.verified()?;
    if config.eot_first {
        let size = ds.dtype().size();
        for r in 0..ds.len() {
            let bytes = checked.record_bytes(r)?;
            if bytes.is_empty() {
                continue;
            }
            let (body, eos) = bytes.split_at(bytes.len() - size);
            shards.write(eos)?;
            shards.write(body)?;
        }
    } else {
        const SPAN: u64 = 4 << 20;
        let mut at = 0;
        while at < total {
            let end = (at + SPAN).min(total);
            for span in checked.tokens(at..end)? {
                shards.write(span.as_bytes())?;
            }
            at = end;
        }
    }
    let bytes = shards.bytes;
    Ok(ExportReport {
        files: shards.commit()?,
        records: ds.len(),
        tokens: total,
        bytes,
    })
}

/// The shard files of an input: the file itself, or a directory's `*.bin`
/// files, validation shards first, each group in name order.
fn shard_files(input: &Path) -> Result<Vec<PathBuf>, InteropError> {
    if !input.is_dir() {
        return Ok(vec![input.into()]);
    }
    let mut files: Vec<PathBuf> = std::fs::read_dir(input)
        .map_err(io(input))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "bin"))
        .collect();
    files.sort_by_key(|p| {
        let name = p
            .file_name()
            .unwrap_or_default()
            .to_string_lossy()
            .into_owned();
        (!name.contains("_val_"), name)
    });
    if files.is_empty() {
        return Err(bad(input, "no .bin shards in this directory"));
    }
    Ok(files)
}

/// Checks one shard's header and size; returns the token size and count.
fn check(path: &Path, bytes: &[u8]) -> Result<(usize, usize), InteropError> {
    let head = bytes.get(..HEADER).ok_or_else(|| {
        bad(
            path,
            format!("{} bytes, shorter than the 1,024-byte header", bytes.len()),
        )
    })?;
    let int = |i: usize| i32::from_le_bytes(head[4 * i..4 * i + 4].try_into().expect("4 bytes"));
    let size = match (int(0), int(1)) {
        (20240520, 1) => 2,
        (20240801, 7) => 4,
        (m, v) => {
            return Err(bad(
                path,
                format!("magic {m} version {v}: not an llm.c token shard"),
            ))
        }
    };
    let count = usize::try_from(int(2))
        .map_err(|_| bad(path, format!("a negative token count {}", int(2))))?;
    if bytes.len() != HEADER + count * size {
        return Err(bad(
            path,
            format!(
                "{} bytes, but the header's {count} tokens need {}",
                bytes.len(),
                HEADER + count * size
            ),
        ));
    }
    Ok((size, count))
}

pub(crate) fn token_size(input: &Path) -> Result<usize, InteropError> {
    let first = shard_files(input)?.remove(0);
    let map = MappedFile::open(&first)?;
    Ok(check(&first, map.bytes())?.0)
}

/// Reads the shards of every input, in order, as one stream (llm.c cuts
/// shards without regard to documents), split into records at `--eos`;
/// without it, each shard file is one record.
pub(crate) fn import(
    inputs: &[PathBuf],
    config: &ImportConfig,
    sink: &mut impl RecordSink,
) -> Result<Vec<PathBuf>, InteropError> {
    let mut files = Vec::new();
    for input in inputs {
        files.extend(shard_files(input)?);
    }
    let mut size = None;
    let maps = files
        .iter()
        .map(|f| {
            let map = MappedFile::open(f)?;
            let (s, _) = check(f, map.bytes())?;
            if size.is_some_and(|prev| prev != s) {
                return Err(bad(f, "its token size differs from the shards before it"));
            }
            size = Some(s);
            Ok(map)
        })
        .collect::<Result<Vec<_>, InteropError>>()?;
    let size = size.unwrap_or(2);
    if config.eos.is_none() {
        for map in &maps {
            sink.record(&map.bytes()[HEADER..], size)?;
        }
        return Ok(files);
    }
    let mut split = Splitter::new(sink, size, config.eos, config.eot_first)?;
    for map in &maps {
        split.push(&map.bytes()[HEADER..])?;
    }
    split.finish()?;
    Ok(files)
}
