//! datatrove / nanotron tokenized files: `PREFIX.ds` holds the tokens (no
//! header; uint16 when the vocabulary has at most 65,536 ids, else uint32,
//! as prep's own dtype rule), `PREFIX.ds.index` the exclusive end offset of
//! every document in tokens as little-endian u64 (the last equals the token
//! count), and `PREFIX.ds.metadata` the text
//! `tokenizer_name|token_size\n<count>\n<human count>`.
//!
//! datatrove's `TokenizedFile` writes `.ds` and `.ds.index` itself; the
//! metadata comes from the tokenizer step around it, so a file written by
//! the class alone has none. An import then takes the token count from the
//! index's last entry and the token size from `.ds`'s length divided by it
//! (2 or 4, nothing else); only a file with no tokens leaves the size open,
//! and it does not matter there. Tokens of 4 bytes are uint32.

use std::path::{Path, PathBuf};

use super::{bad, io, ExportConfig, ExportReport, InteropError, RecordSink, TmpFile};
use crate::format::{Dataset, MappedFile};

fn paths(prefix: &Path) -> (PathBuf, PathBuf, PathBuf) {
    let s = prefix.to_string_lossy();
    let stem = s
        .strip_suffix(".ds.metadata")
        .or_else(|| s.strip_suffix(".ds.index"))
        .or_else(|| s.strip_suffix(".ds"))
        .unwrap_or(&s);
    (
        PathBuf::from(format!("{stem}.ds")),
        PathBuf::from(format!("{stem}.ds.index")),
        PathBuf::from(format!("{stem}.ds.metadata")),
    )
}

/// A count as people read it: 1.23K, 45.6M, 7.89B.
fn human(n: u64) -> String {
    match n {
        0..=999 => n.to_string(),
        1_000..=999_999 => format!("{:.2}K", n as f64 / 1e3),
        1_000_000..=999_999_999 => format!("{:.2}M", n as f64 / 1e6),
        1_000_000_000..=999_999_999_999 => format!("{:.2}B", n as f64 / 1e9),
        _ => format!("{:.2}T", n as f64 / 1e12),
    }
}

pub(crate) fn export(ds: &Dataset, config: &ExportConfig) -> Result<ExportReport, InteropError> {
    let (data_path, index_path, meta_path) = paths(&config.output);
    let mut data = TmpFile::create(&data_path, config.overwrite)?;
    let mut index = TmpFile::create(&index_path, config.overwrite)?;
    let mut meta = TmpFile::create(&meta_path, config.overwrite)?;
    let mut end = 0u64;
    for len in ds.record_lengths() {
        end += len;
        index.write(&end.to_le_bytes())?;
    }
    super::write_all_tokens(ds, &mut data)?;
    let count = ds.n_tokens();
    meta.write(
        format!(
            "{}|{}\n{count}\n{}",
            config.tokenizer_name,
            ds.dtype().size(),
            human(count)
        )
        .as_bytes(),
    )?;
    let bytes = data.bytes() + index.bytes() + meta.bytes();
    let files = vec![data.commit()?, index.commit()?, meta.commit()?];
    Ok(ExportReport {
        files,
        records: ds.len(),
        tokens: count,
        bytes,
    })
}

/// The token size, from the metadata's first line or, without metadata,
/// from the sizes of `.ds` and `.ds.index`.
pub(crate) fn token_size(prefix: &Path) -> Result<usize, InteropError> {
    Ok(layout(prefix)?.0)
}

/// (token size, token count) of a datatrove file: from `.ds.metadata`
/// where there is one, else from the index's last entry and `.ds`'s length.
fn layout(prefix: &Path) -> Result<(usize, u64), InteropError> {
    let (data_path, index_path, meta_path) = paths(prefix);
    match std::fs::read_to_string(&meta_path) {
        Ok(text) => return parse_metadata(&meta_path, &text),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(io(&meta_path)(e)),
    }
    let index = MappedFile::open(&index_path)?;
    let ib = index.bytes();
    if ib.len() % 8 != 0 {
        return Err(bad(
            &index_path,
            format!("{} bytes: not whole u64 offsets", ib.len()),
        ));
    }
    let count = ib.len().checked_sub(8).map_or(0, |i| {
        u64::from_le_bytes(ib[i..].try_into().expect("8 bytes"))
    });
    let bytes = std::fs::metadata(&data_path).map_err(io(&data_path))?.len();
    if count == 0 {
        return Ok((2, 0));
    }
    match bytes.checked_div(count) {
        Some(size @ (2 | 4)) if size * count == bytes => Ok((size as usize, count)),
        _ => Err(bad(
            &data_path,
            format!(
                "{bytes} bytes for the {count} tokens {} ends at: neither 2 nor 4 bytes a token \
                 (there is no {} to say which)",
                index_path.display(),
                meta_path.display()
            ),
        )),
    }
}

/// (token size, token count) from the metadata.
fn parse_metadata(path: &Path, text: &str) -> Result<(usize, u64), InteropError> {
    let mut lines = text.lines();
    let first = lines.next().unwrap_or("");
    let size = first
        .rsplit_once('|')
        .and_then(|(_, s)| s.trim().parse::<usize>().ok())
        .filter(|s| *s == 2 || *s == 4)
        .ok_or_else(|| {
            bad(
                path,
                format!("first line {first:?}: expected `tokenizer|2` or `tokenizer|4`"),
            )
        })?;
    let count = lines
        .next()
        .and_then(|l| l.trim().parse::<u64>().ok())
        .ok_or_else(|| bad(path, "second line: expected the token count"))?;
    Ok((size, count))
}

pub(crate) fn import(
    prefix: &Path,
    sink: &mut impl RecordSink,
) -> Result<Vec<PathBuf>, InteropError> {
    let (data_path, index_path, meta_path) = paths(prefix);
    let (size, count) = layout(prefix)?;
    let data = MappedFile::open(&data_path)?;
    let bytes = data.bytes();
    if bytes.len() as u64 != count.saturating_mul(size as u64) {
        return Err(bad(
            &data_path,
            format!(
                "{} bytes, but the metadata's {count} tokens of {size} bytes need {}",
                bytes.len(),
                count.saturating_mul(size as u64)
            ),
        ));
    }
    let index = MappedFile::open(&index_path)?;
    let ib = index.bytes();
    if ib.len() % 8 != 0 {
        return Err(bad(
            &index_path,
            format!("{} bytes: not whole u64 offsets", ib.len()),
        ));
    }
    let mut start = 0u64;
    for (i, c) in ib.chunks_exact(8).enumerate() {
        let end = u64::from_le_bytes(c.try_into().expect("8 bytes"));
        if end < start || end > count {
            return Err(bad(
                &index_path,
                format!(
                    "document {i} ends at token {end}, after {start} and within {count} expected"
                ),
            ));
        }
        sink.record(&bytes[(start as usize) * size..(end as usize) * size], size)?;
        start = end;
    }
    if start != count {
        return Err(bad(
            &index_path,
            format!("the documents end at token {start}, but there are {count}"),
        ));
    }
    let mut files = vec![data_path, index_path];
    if meta_path.exists() {
        files.push(meta_path);
    }
    Ok(files)
}
