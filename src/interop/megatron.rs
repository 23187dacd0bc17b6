//! Megatron-LM / NeMo indexed datasets: `PREFIX.bin` + `PREFIX.idx`.
//!
//! `.bin` holds the tokens, no header. `.idx` is little-endian and
//! unaligned: the 9 magic bytes `MMIDIDX\0\0`; u64 version 1; u8 dtype code
//! (1 u8, 2 i8, 3 i16, 4 i32, 5 i64, 6 f64, 7 f32, 8 u16); u64 `S`, the
//! number of sequences; u64 `D`, the number of document-index entries; then
//! i32\[S\] sequence lengths in tokens, i64\[S\] sequence byte offsets into
//! `.bin` (the running sum of length × item size, from 0), and i64\[D\]
//! document indices; the file is `34 + 12 S + 8 D` bytes.
//!
//! The document indices group sequences into documents: they start at 0,
//! never decrease and end at `S`, and document `j` is sequences
//! `doc[j]..doc[j + 1]`. Megatron's `IndexedDatasetBuilder` adds one entry
//! per `end_document()`, so a file made with `--split-sentences` has several
//! sequences (sentences) per document. prep writes one sequence per record
//! (`D = S + 1`, indices `0, 1, ..., S`) and imports one record per
//! document, its sequences back to back.
//!
//! There is no u32 code: uint32 datasets are written as int32 (code 4),
//! and an id that does not fit int32 is refused (on import, an int32 id
//! below 0 is). Megatron's own preprocessing picks int32 from 65,500 ids,
//! prep from 65,537: either is read.

use std::path::{Path, PathBuf};

use super::{bad, io, ExportConfig, ExportReport, InteropError, RecordSink, TmpFile};
use crate::format::{Dataset, Dtype, MappedFile};

const MAGIC: &[u8; 9] = b"MMIDIDX\0\0";
const HEADER: usize = 9 + 8 + 1 + 8 + 8;
const CODE_U16: u8 = 8;
const CODE_I32: u8 = 4;

/// `PREFIX.bin` and `PREFIX.idx` for a prefix given with or without either extension.
fn paths(prefix: &Path) -> (PathBuf, PathBuf) {
    let s = prefix.to_string_lossy();
    let stem = s
        .strip_suffix(".bin")
        .or_else(|| s.strip_suffix(".idx"))
        .unwrap_or(&s);
    (
        PathBuf::from(format!("{stem}.bin")),
        PathBuf::from(format!("{stem}.idx")),
    )
}

pub(crate) fn export(ds: &Dataset, config: &ExportConfig) -> Result<ExportReport, InteropError> {
    let code = match ds.dtype() {
        Dtype::U16 => CODE_U16,
        Dtype::U32 => {
            if let Some(id) = super::id_above(ds, i32::MAX as u64)? {
                return Err(InteropError::Unsupported(format!(
                    "token id {id} does not fit Megatron's int32 (it has no uint32 dtype)"
                )));
            }
            CODE_I32
        }
    };
    let size = ds.dtype().size() as u64;
    let s = ds.len();
    let (bin_path, idx_path) = paths(&config.output);
    let mut idx = TmpFile::create(&idx_path, config.overwrite)?;
    let mut bin = TmpFile::create(&bin_path, config.overwrite)?;
    idx.write(MAGIC)?;
    idx.write(&1u64.to_le_bytes())?;
    idx.write(&[code])?;
    idx.write(&s.to_le_bytes())?;
    idx.write(&(s + 1).to_le_bytes())?;
    for (i, len) in ds.record_lengths().enumerate() {
        let len = i32::try_from(len).map_err(|_| {
            InteropError::Unsupported(format!(
                "record {i} has {len} tokens, more than Megatron's int32 lengths hold"
            ))
        })?;
        idx.write(&len.to_le_bytes())?;
    }
    let mut offset = 0u64;
    for len in ds.record_lengths() {
        idx.write(&(offset as i64).to_le_bytes())?;
        offset += len * size;
    }
    for d in 0..=s {
        idx.write(&(d as i64).to_le_bytes())?;
    }
    debug_assert_eq!(idx.bytes(), 34 + 12 * s + 8 * (s + 1));
    super::write_all_tokens(ds, &mut bin)?;
    let mask = match ds.manifest().has_loss_mask() {
        true => Some(super::mask_file(&bin_path, ds, config.overwrite)?),
        false => None,
    };
    let bytes = bin.bytes() + idx.bytes() + mask.as_ref().map_or(0, TmpFile::bytes);
    let mut files = vec![bin.commit()?, idx.commit()?];
    files.extend(mask.map(TmpFile::commit).transpose()?);
    Ok(ExportReport {
        files,
        records: s,
        tokens: ds.n_tokens(),
        bytes,
    })
}

/// The token size of a Megatron dataset, from its `.idx` header.
pub(crate) fn token_size(prefix: &Path) -> Result<usize, InteropError> {
    let (_, idx_path) = paths(prefix);
    let bytes = std::fs::read(&idx_path).map_err(io(&idx_path))?;
    Ok(parse_header(&idx_path, &bytes)?.0)
}

/// Checks the header: magic, version, dtype code; returns the token size, `S` and `D`.
fn parse_header(path: &Path, bytes: &[u8]) -> Result<(usize, u64, u64), InteropError> {
    let head = bytes.get(..HEADER).ok_or_else(|| {
        bad(
            path,
            format!(
                "{} bytes, shorter than the {HEADER}-byte header",
                bytes.len()
            ),
        )
    })?;
    if &head[..9] != MAGIC {
        return Err(bad(path, "not a Megatron index (bad magic bytes)"));
    }
    let word = |i: usize| u64::from_le_bytes(head[i..i + 8].try_into().expect("8 bytes"));
    if word(9) != 1 {
        return Err(bad(
            path,
            format!("version {}, only version 1 is read", word(9)),
        ));
    }
    let size = match head[17] {
        CODE_U16 => 2,
        CODE_I32 => 4,
        code => {
            return Err(bad(
                path,
                format!("dtype code {code}: prep reads token files of uint16 (8) or int32 (4)"),
            ))
        }
    };
    Ok((size, word(18), word(26)))
}

/// Reads `PREFIX.idx` and `PREFIX.bin`, checking everything Megatron checks
/// and the sizes, and hands each sequence to `sink`; returns the files read.
pub(crate) fn import(
    prefix: &Path,
    sink: &mut impl RecordSink,
) -> Result<Vec<PathBuf>, InteropError> {
    let (bin_path, idx_path) = paths(prefix);
    let idx = MappedFile::open(&idx_path)?;
    let bytes = idx.bytes();
    let (size, s, d) = parse_header(&idx_path, bytes)?;
    let expected = s
        .checked_mul(12)
        .and_then(|x| d.checked_mul(8).and_then(|y| x.checked_add(y)))
        .and_then(|x| x.checked_add(HEADER as u64));
    if expected != Some(bytes.len() as u64) {
        return Err(bad(
            &idx_path,
            format!(
                "{} bytes, but {s} sequences and {d} document entries need {}",
                bytes.len(),
                expected.map_or("more than a u64".into(), |e| e.to_string())
            ),
        ));
    }
    let s = s as usize;
    let lengths_at = HEADER;
    let offsets_at = lengths_at + 4 * s;
    let length = |i: usize| {
        i32::from_le_bytes(
            bytes[lengths_at + 4 * i..lengths_at + 4 * i + 4]
                .try_into()
                .expect("4"),
        )
    };
    let offset = |i: usize| {
        i64::from_le_bytes(
            bytes[offsets_at + 8 * i..offsets_at + 8 * i + 8]
                .try_into()
                .expect("8"),
        )
    };
    let doc_at = offsets_at + 8 * s;
    let doc = |j: usize| {
        i64::from_le_bytes(
            bytes[doc_at + 8 * j..doc_at + 8 * j + 8]
                .try_into()
                .expect("8"),
        )
    };
    let d = d as usize;
    if d == 0 || doc(0) != 0 || doc(d - 1) != s as i64 {
        return Err(bad(
            &idx_path,
            format!(
                "the document indices run from {:?} to {:?}, not from 0 to the number of sequences {s}",
                (d > 0).then(|| doc(0)),
                (d > 0).then(|| doc(d - 1)),
            ),
        ));
    }
    let bin = MappedFile::open(&bin_path)?;
    let data = bin.bytes();
    // Where each sequence starts in `.bin`, checked against the offsets.
    let mut starts = Vec::with_capacity(s + 1);
    let mut at = 0u64;
    for i in 0..s {
        let len = u64::try_from(length(i)).map_err(|_| {
            bad(
                &idx_path,
                format!("sequence {i} has a negative length {}", length(i)),
            )
        })?;
        if offset(i) != at as i64 {
            return Err(bad(
                &idx_path,
                format!("sequence {i} starts at byte {}, expected {at}", offset(i)),
            ));
        }
        starts.push(at);
        at += len * size as u64;
    }
    starts.push(at);
    if at != data.len() as u64 {
        return Err(bad(
            &bin_path,
            format!("{} bytes, but the sequences cover {at}", data.len()),
        ));
    }
    // One record per document: its sequences lie back to back.
    for j in 0..d - 1 {
        let (first, end) = (doc(j), doc(j + 1));
        if end < first || end > s as i64 {
            return Err(bad(
                &idx_path,
                format!(
                    "document index {} is {end}: below the one before it ({first}) or past the {s} sequences",
                    j + 1
                ),
            ));
        }
        let record = &data[starts[first as usize] as usize..starts[end as usize] as usize];
        sink.record(record, size)?;
    }
    Ok(vec![bin_path, idx_path])
}
