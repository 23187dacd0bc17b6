//! A task's share of the inputs (`prep tokenize --part I/N`).
//!
//! The inputs, in their sorted order, are laid end to end as one line of
//! bytes (their sizes on disk); part `I` of `N` owns the bytes
//! `[floor(I*T/N), floor((I+1)*T/N))` of that line ([`Part::range`]). What a
//! part reads follows from the bytes it owns:
//!
//! - a plain JSONL file is split anywhere: a part reads the lines that
//!   *start* in its bytes, so every line belongs to exactly one part however
//!   the boundaries fall, and one huge file spreads over many parts;
//! - a compressed JSONL file cannot be entered in the middle: it belongs
//!   whole to the part owning its first byte;
//! - a Parquet file is split by row group: row group `g` is placed at
//!   `start + D_g * size / D` where `D_g` is the compressed data of the
//!   groups before it and `D` all of it (the footer gives the sizes), and
//!   belongs to the part owning that byte: the groups spread over every part
//!   whose bytes the file spans, its footer included.
//!
//! Parts therefore read contiguous, disjoint runs of documents that together
//! are the inputs in order: part 0's documents, then part 1's, and so on, is
//! exactly the order one machine reads. The share depends only on the file
//! list, the sizes and the Parquet footers, so every task computes the same
//! one with no coordination.

use std::fs::File;
use std::io::{BufRead, BufReader, Read, Seek, SeekFrom};
use std::ops::Range;
use std::path::Path;

use ::parquet::file::reader::{FileReader, SerializedFileReader};

use super::{Compression, InputError, InputFile, InputKind};
use crate::partition::Part;

/// The part of one file a task reads.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Slice {
    /// All of it.
    Whole,
    /// Plain JSONL: the lines that start at a byte offset in this range.
    Bytes(Range<u64>),
    /// Parquet: these row groups, by index in the file.
    RowGroups(Range<usize>),
}

/// One file of a task's share and the slice of it to read. `file.bytes` is
/// the size of the share (the bytes the part owns), for progress.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Share {
    /// The file, with `bytes` set to the part's share of it.
    pub file: InputFile,
    /// What to read of it.
    pub slice: Slice,
}

/// The share of `files` that part `part` reads, in reading order. Files the
/// part does not touch are left out.
///
/// # Errors
/// [`InputError::ParquetOpen`] when the footer of a Parquet file that the
/// part's bytes cut through cannot be read (the whole job would fail on it
/// anyway).
pub fn share(files: &[InputFile], part: Part) -> Result<Vec<Share>, InputError> {
    let total: u64 = files.iter().map(|f| f.bytes).sum();
    let mine = part.range(total);
    let owner = |x: u64| Part::holding(x, part.count, total);
    let mut out = Vec::new();
    let mut base = 0u64;
    for file in files {
        let (start, end) = (base, base + file.bytes);
        base = end;
        // Entirely inside this part's bytes (an empty file counts where it
        // starts), or compressed and starting in them: read it all.
        let first_mine = owner(start) == part.index;
        // Arrow IPC is read whole too: its record batches are found only by
        // reading the stream from its start; and so is a file that is one
        // JSON array, whose elements are found from its `[` on.
        let whole_only = matches!(file.kind, InputKind::Jsonl(c) if c != Compression::None)
            || file.kind == InputKind::Arrow
            || (file.kind == InputKind::Jsonl(Compression::None)
                && (end > mine.start && start < mine.end || first_mine)
                && super::jsonl::is_array_file(&file.path)?);
        if first_mine && (file.bytes == 0 || end <= mine.end || whole_only) {
            out.push(whole(file));
            continue;
        }
        if end <= mine.start || start >= mine.end {
            continue;
        }
        match file.kind {
            // An array starting in another part's bytes: that part reads it.
            InputKind::Jsonl(Compression::None) if whole_only => {}
            InputKind::Jsonl(Compression::None) => {
                let from = mine.start.max(start) - start;
                let to = mine.end.min(end) - start;
                out.push(Share {
                    file: InputFile {
                        bytes: to - from,
                        ..file.clone()
                    },
                    slice: Slice::Bytes(from..to),
                });
            }
            // Compressed and starting in another part's bytes: that part reads it.
            InputKind::Jsonl(_) | InputKind::Arrow => {}
            InputKind::Parquet => {
                // Row group g sits at its share of the file: the data
                // before it, scaled to the whole file (footer included), so
                // that the groups spread over every part the file spans.
                let groups = group_sizes(&file.path)?;
                let data: u64 = groups.iter().sum();
                let mut before = 0u64;
                let mut first = None;
                let mut last = 0;
                let mut bytes = 0;
                for (g, size) in groups.iter().enumerate() {
                    let at = (u128::from(before) * u128::from(file.bytes) / u128::from(data.max(1)))
                        as u64;
                    if owner(start + at) == part.index {
                        first.get_or_insert(g);
                        last = g + 1;
                        bytes += size;
                    }
                    before += size;
                }
                if let Some(first) = first {
                    out.push(Share {
                        file: InputFile {
                            bytes,
                            ..file.clone()
                        },
                        slice: Slice::RowGroups(first..last),
                    });
                }
            }
        }
    }
    Ok(out)
}

fn whole(file: &InputFile) -> Share {
    Share {
        file: file.clone(),
        slice: Slice::Whole,
    }
}

/// Compressed sizes of a Parquet file's row groups, from its footer.
fn group_sizes(path: &Path) -> Result<Vec<u64>, InputError> {
    let parquet_error = |source| InputError::ParquetOpen {
        path: path.to_owned(),
        cause: source,
    };
    let metadata = match super::remote(path)? {
        Some((object, size)) => {
            SerializedFileReader::new(crate::input::remote_parquet::RemoteFile::new(object, size))
                .map_err(parquet_error)?
                .metadata()
                .clone()
        }
        None => {
            let file = File::open(path).map_err(|source| InputError::Open {
                path: path.to_owned(),
                cause: source,
            })?;
            SerializedFileReader::new(file)
                .map_err(parquet_error)?
                .metadata()
                .clone()
        }
    };
    Ok(metadata
        .row_groups()
        .iter()
        .map(|g| u64::try_from(g.compressed_size()).unwrap_or(0))
        .collect())
}

/// Moves `reader` (positioned at byte 0 of a plain file) to the first line
/// that starts at or after byte `from`, and returns that line's offset.
///
/// A line starts at 0 or right after a `\n`; the line that straddles `from`
/// belongs to the part before.
pub(crate) fn seek_to_line(file: &mut File, from: u64) -> std::io::Result<u64> {
    if from == 0 {
        return Ok(0);
    }
    file.seek(SeekFrom::Start(from - 1))?;
    let mut reader = BufReader::with_capacity(64 << 10, &mut *file);
    let mut skipped = Vec::new();
    // Reads the rest of the line that holds byte from-1: nothing but its
    // `\n` when from-1 ends a line.
    let n = reader.read_until(b'\n', &mut skipped)? as u64;
    let at = from - 1 + n;
    drop(reader);
    file.seek(SeekFrom::Start(at))?;
    Ok(at)
}

/// The 1-based number of the line that starts at byte `at` of a plain file:
/// one more than the `\n` bytes before it. Reads the file up to `at`; used
/// only to name a line in an error, never on the hot path.
pub(crate) fn line_number_at(path: &Path, at: u64) -> std::io::Result<u64> {
    let mut reader = File::open(path)?.take(at);
    let mut buf = vec![0u8; 1 << 20];
    let mut lines = 1u64;
    loop {
        let n = reader.read(&mut buf)?;
        if n == 0 {
            return Ok(lines);
        }
        lines += buf[..n].iter().filter(|&&b| b == b'\n').count() as u64;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn plain(name: &str, bytes: u64) -> InputFile {
        InputFile {
            path: name.into(),
            kind: InputKind::Jsonl(Compression::None),
            bytes,
            version: None,
        }
    }

    fn packed(name: &str, bytes: u64) -> InputFile {
        InputFile {
            path: name.into(),
            kind: InputKind::Jsonl(Compression::Zstd),
            bytes,
            version: None,
        }
    }

    proptest! {
        /// Plain bytes tile each file over the parts; compressed files go
        /// whole to exactly one part; the parts' shares are in file order.
        #[test]
        fn shares_tile_the_inputs(
            sizes in proptest::collection::vec((0u64..500, any::<bool>()), 0..8),
            n in 1u64..9,
        ) {
            let files: Vec<InputFile> = sizes
                .iter()
                .enumerate()
                .map(|(i, &(b, z))| if z { packed(&format!("{i}.jsonl.zst"), b) } else { plain(&format!("{i}.jsonl"), b) })
                .collect();
            let mut covered: Vec<Vec<(u64, u64)>> = vec![Vec::new(); files.len()];
            let mut order = Vec::new();
            for i in 0..n {
                for s in share(&files, Part::new(i, n).unwrap()).unwrap() {
                    let k = files.iter().position(|f| f.path == s.file.path).unwrap();
                    order.push(k);
                    match s.slice {
                        Slice::Whole => covered[k].push((0, files[k].bytes)),
                        Slice::Bytes(r) => {
                            prop_assert_eq!(s.file.bytes, r.end - r.start);
                            covered[k].push((r.start, r.end));
                        }
                        Slice::RowGroups(_) => unreachable!(),
                    }
                }
            }
            prop_assert!(order.windows(2).all(|w| w[0] <= w[1]), "{:?}", order);
            for (k, mut ranges) in covered.into_iter().enumerate() {
                ranges.sort();
                let mut next = 0;
                for (a, b) in &ranges {
                    prop_assert_eq!(*a, next);
                    next = *b;
                }
                prop_assert_eq!(next, files[k].bytes);
                if matches!(files[k].kind, InputKind::Jsonl(Compression::Zstd)) {
                    prop_assert_eq!(ranges.len(), 1);
                }
            }
        }
    }

    #[test]
    fn seeking_lands_on_line_starts_and_numbers_lines() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("a.jsonl");
        let text = b"ab\ncde\n\nf\n";
        std::fs::write(&path, text).unwrap();
        let starts = [0u64, 3, 7, 8];
        for from in 0..=text.len() as u64 {
            let mut f = File::open(&path).unwrap();
            let at = seek_to_line(&mut f, from).unwrap();
            let want = starts
                .iter()
                .copied()
                .find(|&s| s >= from)
                .unwrap_or(text.len() as u64);
            assert_eq!(at, want, "from {from}");
            let mut rest = Vec::new();
            f.read_to_end(&mut rest).unwrap();
            assert_eq!(rest, &text[want as usize..]);
        }
        for (i, &s) in starts.iter().enumerate() {
            assert_eq!(line_number_at(&path, s).unwrap(), i as u64 + 1);
        }
    }
}
