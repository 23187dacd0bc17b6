//! `prep inspect`: what a dataset holds, for people and for machines.
//!
//! Everything is computed from the manifest and the record offsets, in one
//! pass over the indexes and in memory that does not grow with the dataset:
//! record lengths go into a log-linear histogram (exact below 256 tokens,
//! within 1% above), from which the percentiles are read. A dataset in
//! object storage is read in place: its manifest and indexes, streamed, and
//! for `--record` only that record's index entries and tokens.

use std::path::{Path, PathBuf};

use serde::Serialize;

use crate::format::{Dataset, Files, ReadError};
use crate::format::{FormatError, Manifest};

/// The error printed with a hint after it: its cause is in its message,
/// not returned as a source as well.
impl From<FormatError> for InspectError {
    fn from(e: FormatError) -> InspectError {
        InspectError::Open(e)
    }
}

impl From<ReadError> for InspectError {
    /// What breaks the format is [`InspectError::Open`], wherever the
    /// dataset lies; a failure to read it is [`InspectError::Read`].
    fn from(e: ReadError) -> InspectError {
        match e {
            ReadError::Format(e) => InspectError::Open(e),
            e => InspectError::Read(e),
        }
    }
}

/// Context lengths whose overflow `inspect` reports.
pub const CONTEXT_LENGTHS: [u64; 4] = [2048, 4096, 8192, 32768];
/// Percentiles reported.
pub const PERCENTILES: [f64; 5] = [0.10, 0.50, 0.90, 0.99, 0.999];

/// Why `inspect` could not run.
#[derive(Debug, thiserror::Error)]
pub enum InspectError {
    /// The dataset cannot be opened (missing, or it fails the quick checks),
    /// or the record's segment entries break the rules of their row.
    #[error("{0} (prep validate tells every problem)")]
    Open(FormatError),
    /// A dataset in object storage could not be read: a missing bucket or
    /// manifest, refused credentials, a dropped connection (the message
    /// names the object).
    #[error(transparent)]
    Read(ReadError),
    /// `--record` past the end.
    #[error("record {index} does not exist: the dataset has {len} records")]
    NoRecord {
        /// Asked for.
        index: u64,
        /// Records in the dataset.
        len: u64,
    },
    /// The tokenizer for decoding cannot be loaded.
    #[error("tokenizer {}: {message}", path.display())]
    Tokenizer {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        message: String,
    },
}

/// One shard's row in the table.
#[derive(Debug, Clone, Serialize)]
pub struct ShardRow {
    /// Token file.
    pub bin: String,
    /// Records.
    pub n_records: u64,
    /// Tokens.
    pub n_tokens: u64,
    /// Bytes of `.bin` and `.idx` together.
    pub bytes: u64,
}

/// One bar of the length histogram: records of `min..=max` tokens.
#[derive(Debug, Clone, Serialize)]
pub struct Bucket {
    /// Shortest length in the bucket.
    pub min: u64,
    /// Longest length in the bucket.
    pub max: u64,
    /// Records in it.
    pub records: u64,
}

/// Record lengths in tokens.
#[derive(Debug, Clone, Serialize)]
pub struct Lengths {
    /// Shortest record.
    pub min: u64,
    /// Longest record.
    pub max: u64,
    /// Mean length.
    pub mean: f64,
    /// `(p, length)`: `p` of the records are at most `length` tokens long
    /// (exact below 256 tokens, within 1% above).
    pub percentiles: Vec<(f64, u64)>,
    /// Power-of-two buckets, from 0 up to the longest record.
    pub histogram: Vec<Bucket>,
}

/// Tokens in records longer than a context length.
#[derive(Debug, Clone, Serialize)]
pub struct Overflow {
    /// The context length.
    pub context: u64,
    /// Records longer than it.
    pub records: u64,
    /// Share of all tokens that sit in such records.
    pub token_share: f64,
}

/// One record, shown.
#[derive(Debug, Clone, Serialize)]
pub struct RecordView {
    /// Its index.
    pub index: u64,
    /// Its ids.
    pub ids: Vec<u32>,
    /// Its text, when a tokenizer was found.
    pub text: Option<String>,
    /// A packed row's document pieces (null for a documents dataset).
    pub segments: Option<Vec<crate::format::Segment>>,
    /// Its loss mask, a 0 or 1 per id (absent for a dataset without masks).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub loss_mask: Option<Vec<u8>>,
}

/// Everything `prep inspect` reports; its JSON form is described by
/// schemas/inspect.schema.json.
#[derive(Debug, Clone, Serialize)]
pub struct Inspection {
    /// The dataset directory (or its object-storage address).
    pub dataset: String,
    /// The manifest, as read.
    pub manifest: Manifest,
    /// One row per shard.
    pub shards: Vec<ShardRow>,
    /// Record lengths (absent for an empty dataset).
    pub lengths: Option<Lengths>,
    /// Overflow of common context lengths (documents datasets).
    pub overflow: Vec<Overflow>,
    /// The record asked for with `--record`.
    pub record: Option<RecordView>,
}

/// Lengths histogram: exact below 256, then 128 sub-buckets per power of two.
struct LogLinear {
    counts: Vec<u64>,
}

impl LogLinear {
    const EXACT: u64 = 256;
    const SUB: u64 = 128;

    fn new() -> LogLinear {
        LogLinear {
            counts: vec![0; (Self::EXACT + 56 * Self::SUB) as usize],
        }
    }

    fn index(len: u64) -> usize {
        if len < Self::EXACT {
            return len as usize;
        }
        let e = 63 - u64::from(len.leading_zeros()); // >= 8
        let sub = (len >> (e - 7)) & (Self::SUB - 1);
        (Self::EXACT + (e - 8) * Self::SUB + sub) as usize
    }

    /// The largest length that falls in bucket `i`.
    fn upper(i: usize) -> u64 {
        let i = i as u64;
        if i < Self::EXACT {
            return i;
        }
        let (e, sub) = (
            8 + (i - Self::EXACT) / Self::SUB,
            (i - Self::EXACT) % Self::SUB,
        );
        // In u128: the top bucket's bound is 2^64 - 1.
        ((u128::from(Self::SUB + sub + 1) << (e - 7)) - 1).min(u128::from(u64::MAX)) as u64
    }

    fn add(&mut self, len: u64) {
        self.counts[Self::index(len)] += 1;
    }

    /// The smallest length that at least `p` of the `n` records do not exceed.
    fn quantile(&self, p: f64, n: u64, max: u64) -> u64 {
        let rank = ((p * n as f64).ceil() as u64).clamp(1, n);
        let mut seen = 0;
        for (i, &c) in self.counts.iter().enumerate() {
            seen += c;
            if seen >= rank {
                return Self::upper(i).min(max);
            }
        }
        max
    }
}

/// Inspects the dataset in `dir` (a directory, or an object-storage address
/// read in place); with `record`, also shows that record, decoded with
/// `tokenizer` (or the dataset's own copy) when one loads.
pub fn inspect(
    dir: &Path,
    record: Option<u64>,
    tokenizer: Option<&Path>,
) -> Result<Inspection, InspectError> {
    let ds = Dataset::open_in(Files::new(dir).map_err(ReadError::from)?)?;
    let m = ds.manifest().clone();
    let shards = shard_rows(&m);
    let scan = LengthScan::of(&ds)?;
    let lengths = scan.lengths(&m);
    let overflow = scan.overflow(&m);
    let n = m.n_records;
    let record = match record {
        None => None,
        Some(index) if index >= n => return Err(InspectError::NoRecord { index, len: n }),
        Some(index) => Some(record_view(&ds, &m, index, tokenizer)?),
    };
    Ok(Inspection {
        dataset: dir.display().to_string(),
        manifest: m,
        shards,
        lengths,
        overflow,
        record,
    })
}

/// The table of shards: one row per shard of the manifest.
fn shard_rows(m: &Manifest) -> Vec<ShardRow> {
    m.shards
        .iter()
        .map(|s| ShardRow {
            bin: s.bin.clone(),
            n_records: s.n_records,
            n_tokens: s.n_tokens,
            bytes: s.bin_bytes + s.idx_bytes,
        })
        .collect()
}

/// What one pass over the record lengths gathers.
struct LengthScan {
    hist: LogLinear,
    min: u64,
    max: u64,
    /// Per context length: records longer than it, and their tokens.
    over: [(u64, u64); CONTEXT_LENGTHS.len()],
}

impl LengthScan {
    /// Every record length of `ds`, read from its indexes.
    fn of(ds: &Dataset<Files>) -> Result<LengthScan, ReadError> {
        let mut scan = LengthScan {
            hist: LogLinear::new(),
            min: u64::MAX,
            max: 0,
            over: [(0, 0); CONTEXT_LENGTHS.len()],
        };
        ds.for_each_length(|len| {
            scan.hist.add(len);
            scan.min = scan.min.min(len);
            scan.max = scan.max.max(len);
            for (k, &c) in CONTEXT_LENGTHS.iter().enumerate() {
                if len > c {
                    scan.over[k].0 += 1;
                    scan.over[k].1 += len;
                }
            }
        })?;
        Ok(scan)
    }

    /// Min, max, mean, percentiles and the histogram (none for an empty dataset).
    fn lengths(&self, m: &Manifest) -> Option<Lengths> {
        let n = m.n_records;
        (n > 0).then(|| Lengths {
            min: self.min,
            max: self.max,
            mean: m.n_tokens as f64 / n as f64,
            percentiles: PERCENTILES
                .iter()
                .map(|&p| (p, self.hist.quantile(p, n, self.max)))
                .collect(),
            histogram: self.power_of_two_buckets(),
        })
    }

    /// The histogram's power-of-two buckets, from 0 up to the longest record.
    fn power_of_two_buckets(&self) -> Vec<Bucket> {
        let mut histogram = Vec::new();
        let mut lo = 0u64;
        while lo <= self.max {
            let hi = if lo == 0 { 0 } else { lo * 2 - 1 };
            let records = self
                .hist
                .counts
                .iter()
                .enumerate()
                .filter(|(i, _)| {
                    let u = LogLinear::upper(*i);
                    u >= lo && u <= hi
                })
                .map(|(_, c)| c)
                .sum();
            histogram.push(Bucket {
                min: lo,
                max: hi,
                records,
            });
            lo = if lo == 0 { 1 } else { lo * 2 };
        }
        histogram
    }

    /// Overflow of each context length, for a documents dataset (none for others).
    fn overflow(&self, m: &Manifest) -> Vec<Overflow> {
        if m.kind != "documents" {
            return Vec::new();
        }
        CONTEXT_LENGTHS
            .iter()
            .zip(self.over)
            .map(|(&context, (records, tokens))| Overflow {
                context,
                records,
                token_share: if m.n_tokens == 0 {
                    0.0
                } else {
                    tokens as f64 / m.n_tokens as f64
                },
            })
            .collect()
    }
}

/// Record `index` (which exists): its ids, its text when a tokenizer
/// loads, and a packed row's pieces.
fn record_view(
    ds: &Dataset<Files>,
    m: &Manifest,
    index: u64,
    tokenizer: Option<&Path>,
) -> Result<RecordView, InspectError> {
    let ids = ds.record_ids(index)?;
    let text = match tokenizer_json(ds, tokenizer)? {
        Some((path, json)) => Some(decode(&path, &json, &ids)?),
        None => None,
    };
    let segments = match m.kind.as_str() {
        "packed" => Some(ds.segments(index)?),
        _ => None,
    };
    let loss_mask = ds.loss_mask(index)?.map(|m| m.into_owned());
    Ok(RecordView {
        index,
        ids,
        text,
        segments,
        loss_mask,
    })
}

/// The tokenizer.json to decode with, and where it came from: `tokenizer`
/// when given, else the dataset's own copy, if it has one.
fn tokenizer_json(
    ds: &Dataset<Files>,
    tokenizer: Option<&Path>,
) -> Result<Option<(PathBuf, Vec<u8>)>, InspectError> {
    match tokenizer {
        Some(path) => {
            let json =
                crate::engine::read_tokenizer_bytes(path).map_err(|e| InspectError::Tokenizer {
                    path: path.into(),
                    message: e.to_string(),
                })?;
            Ok(Some((path.to_path_buf(), json)))
        }
        None => Ok(ds.tokenizer_copy()?),
    }
}

/// `json` (a tokenizer.json, from `path`) decoding `ids`.
fn decode(path: &Path, json: &[u8], ids: &[u32]) -> Result<String, InspectError> {
    let bad = |message: String| InspectError::Tokenizer {
        path: path.into(),
        message,
    };
    let tokenizer = tokenizers::Tokenizer::from_bytes(json).map_err(|e| bad(e.to_string()))?;
    tokenizer.decode(ids, false).map_err(|e| bad(e.to_string()))
}

#[cfg(test)]
mod tests {
    use super::LogLinear;

    #[test]
    fn buckets_are_exact_below_256_and_within_one_percent_above() {
        for len in [
            0u64,
            1,
            255,
            256,
            257,
            1000,
            4096,
            123_456,
            1 << 40,
            u64::MAX,
        ] {
            let i = LogLinear::index(len);
            let upper = LogLinear::upper(i);
            assert!(upper >= len, "{len}: upper {upper}");
            if len < 256 {
                assert_eq!(upper, len);
            } else {
                assert!(
                    (upper - len) as f64 <= len as f64 / 100.0,
                    "{len}: upper {upper}"
                );
            }
            if i > 0 {
                assert!(
                    LogLinear::upper(i - 1) < len,
                    "{len} belongs to an earlier bucket"
                );
            }
        }
    }

    #[test]
    fn quantiles() {
        let mut h = LogLinear::new();
        for len in 1..=100u64 {
            h.add(len);
        }
        assert_eq!(h.quantile(0.5, 100, 100), 50);
        assert_eq!(h.quantile(0.9, 100, 100), 90);
        assert_eq!(h.quantile(1.0, 100, 100), 100);
        assert_eq!(h.quantile(0.001, 100, 100), 1);
    }
}
