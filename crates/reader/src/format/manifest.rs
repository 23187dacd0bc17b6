//! `manifest.json`: what a dataset is, its shards, and how it was made.

use std::path::{Component, Path};

use serde::{Deserialize, Serialize};

use super::{Dtype, FormatError};

/// The manifest's file name inside a dataset directory.
pub const MANIFEST_FILE: &str = "manifest.json";
/// The value of the manifest's `format` field.
pub const FORMAT_NAME: &str = "prep";
/// The newest manifest version this build reads and writes. A dataset
/// without loss masks is written as version 1, which every reader knows;
/// one with them as [`MASKED_VERSION`], which a reader that cannot apply the
/// masks refuses instead of training on every token.
pub const FORMAT_VERSION: u64 = 2;
/// The version of a dataset whose shards carry loss masks (`.mask` files).
pub const MASKED_VERSION: u64 = 2;
/// The version of a dataset without loss masks.
pub const PLAIN_VERSION: u64 = 1;
/// The largest `manifest.json` a reader accepts (FORMAT.md, "Limits"):
/// larger ones are refused before parsing. A real one is a few hundred
/// bytes per shard, so 256 MiB holds about a million shards. The Python
/// reader (python/prep/reader.py) refuses above the same value.
pub const MAX_MANIFEST_BYTES: u64 = 256 << 20;

/// The contents of `manifest.json` (see FORMAT.md for every field).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Manifest {
    /// Always `"prep"`.
    pub format: String,
    /// Format version: 1, or 2 when the shards carry loss masks.
    pub version: u64,
    /// `"documents"` (one record per document) or `"packed"`.
    pub kind: String,
    /// Token type of every shard.
    pub dtype: Dtype,
    /// Every token id is below this.
    pub vocab_size: u64,
    /// Records in the dataset.
    pub n_records: u64,
    /// Tokens in the dataset.
    pub n_tokens: u64,
    /// Ids of the special tokens, or null.
    pub special_tokens: SpecialTokens,
    /// Every record starts with `special_tokens.bos`.
    pub bos_prepended: bool,
    /// Every record ends with `special_tokens.eos`.
    pub eos_appended: bool,
    /// The tokenizer the ids came from.
    pub tokenizer: TokenizerInfo,
    /// The shards, in record order.
    pub shards: Vec<ShardInfo>,
    /// Tokens per row of a packed dataset (absent for documents).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub seq_len: Option<u64>,
    /// How a packed dataset was packed (absent for documents).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub packing: Option<Packing>,
    /// How the dataset was made.
    pub provenance: Provenance,
    /// A partial dataset made by one task of a partitioned run (`--part
    /// I/N`); absent for whole datasets. `prep merge` joins the parts.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub partition: Option<Partition>,
}

/// Which share of a partitioned run a partial dataset holds.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Partition {
    /// The stage that wrote it: `"tokenize"`, `"shuffle"` or `"pack"`.
    pub stage: String,
    /// 0-based part number.
    pub part: u64,
    /// Parts in the run.
    pub parts: u64,
    /// The fingerprint of the whole run (inputs and options, the part left
    /// out): equal in every part of one run, and the merged dataset's
    /// `provenance.fingerprint`.
    pub job: String,
    /// Per-record XXH3-128 of the document text, for `--dedup` across parts:
    /// 16 bytes per record, little-endian, in record order.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hashes: Option<FileInfo>,
}

/// A file of a dataset besides its shards: name, size and checksum.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FileInfo {
    /// Relative to the dataset directory.
    pub file: String,
    /// Size in bytes.
    pub bytes: u64,
    /// XXH3-64 of its bytes, 16 hex digits.
    pub xxh3: String,
}

/// What `prep pack` did: the mode, and counts of rows, padding and cuts.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Packing {
    /// `"concat"` or `"bestfit"`.
    pub mode: String,
    /// The seed of the row order, or null when the rows keep the input order.
    pub seed: Option<u64>,
    /// Documents per best-fit window (null for concat).
    pub window: Option<u64>,
    /// The separator added after every document (`--sep`), or null.
    pub separator: Option<u32>,
    /// Rows written; equals `n_records`.
    pub rows: u64,
    /// Padding tokens among the rows' `n_tokens`.
    pub pad_tokens: u64,
    /// `pad_tokens / n_tokens` (0 for an empty dataset).
    pub pad_share: f64,
    /// Non-empty documents read from the input.
    pub documents: u64,
    /// Documents split over more than one row, or partly dropped.
    pub documents_cut: u64,
    /// Document pieces written, one segment each.
    pub pieces: u64,
    /// Document tokens not written: concat's last partial row.
    pub tokens_dropped: u64,
}

/// Special token ids of a dataset.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SpecialTokens {
    /// Beginning of a document.
    pub bos: Option<u32>,
    /// End of a document.
    pub eos: Option<u32>,
    /// Padding (packed datasets).
    pub pad: Option<u32>,
}

/// Which tokenizer made the ids.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TokenizerInfo {
    /// The copy of `tokenizer.json` in the dataset directory, relative to it.
    pub file: Option<String>,
    /// XXH3-64 of the tokenizer JSON's bytes, 16 hex digits.
    pub xxh3: String,
}

/// One shard: a `.bin` of tokens, its `.idx`, its chunk checksums (`.sum`)
/// and, packed, its segment index (`.seg`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ShardInfo {
    /// Token file, relative to the dataset directory.
    pub bin: String,
    /// Index file, relative to the dataset directory.
    pub idx: String,
    /// Records in the shard.
    pub n_records: u64,
    /// Tokens in the shard.
    pub n_tokens: u64,
    /// Size of the `.bin` in bytes.
    pub bin_bytes: u64,
    /// Size of the `.idx` in bytes.
    pub idx_bytes: u64,
    /// XXH3-64 of the `.bin`, 16 hex digits.
    pub bin_xxh3: String,
    /// XXH3-64 of the `.idx`, 16 hex digits.
    pub idx_xxh3: String,
    /// The segment index of a packed shard, relative to the dataset directory.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub seg: Option<String>,
    /// Size of the `.seg` in bytes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub seg_bytes: Option<u64>,
    /// XXH3-64 of the `.seg`, 16 hex digits.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub seg_xxh3: Option<String>,
    /// The `.bin`'s chunk checksums, relative to the dataset directory;
    /// absent in a dataset written by a prep from before them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sum: Option<String>,
    /// Size of the `.sum` in bytes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sum_bytes: Option<u64>,
    /// XXH3-64 of the `.sum`, 16 hex digits.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sum_xxh3: Option<String>,
    /// The loss mask, one byte per token of the `.bin` (1 trainable, 0
    /// not), relative to the dataset directory; version 2 datasets only.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mask: Option<String>,
    /// Size of the `.mask` in bytes (equal to `n_tokens`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mask_bytes: Option<u64>,
    /// XXH3-64 of the `.mask`, 16 hex digits.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mask_xxh3: Option<String>,
}

/// One file of a shard as its manifest entry lists it (see [`ShardInfo::files`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ShardFile<'a> {
    /// Relative to the dataset directory.
    pub name: &'a str,
    /// Its size in bytes, when listed.
    pub bytes: Option<u64>,
    /// Its XXH3-64, 16 hex digits, when listed.
    pub xxh3: Option<&'a str>,
}

impl ShardInfo {
    /// Every file of the shard the entry names, in order: `.bin`, `.idx`,
    /// then `.seg`, `.sum` and `.mask` when it names them (an optional file is
    /// included when its name is listed, its size and checksum as far as
    /// they are). The one list of a shard's files: whatever copies,
    /// uploads, keeps or checks a shard's files takes them from here.
    pub fn files(&self) -> impl Iterator<Item = ShardFile<'_>> {
        fn optional<'a>(
            name: &'a Option<String>,
            bytes: Option<u64>,
            xxh3: &'a Option<String>,
        ) -> Option<ShardFile<'a>> {
            name.as_deref().map(|name| ShardFile {
                name,
                bytes,
                xxh3: xxh3.as_deref(),
            })
        }
        [
            Some(ShardFile {
                name: &self.bin,
                bytes: Some(self.bin_bytes),
                xxh3: Some(&self.bin_xxh3),
            }),
            Some(ShardFile {
                name: &self.idx,
                bytes: Some(self.idx_bytes),
                xxh3: Some(&self.idx_xxh3),
            }),
            optional(&self.seg, self.seg_bytes, &self.seg_xxh3),
            optional(&self.sum, self.sum_bytes, &self.sum_xxh3),
            optional(&self.mask, self.mask_bytes, &self.mask_xxh3),
        ]
        .into_iter()
        .flatten()
    }

    /// The bytes of all the shard's files, as listed.
    pub fn total_bytes(&self) -> u64 {
        self.files().filter_map(|f| f.bytes).sum()
    }

    /// The same shard with every file name prefixed by `prefix/` (a part's
    /// shard as a merged dataset names it, in the part's folder).
    pub fn within(&self, prefix: &str) -> ShardInfo {
        let put = |name: &str| format!("{prefix}/{name}");
        ShardInfo {
            bin: put(&self.bin),
            idx: put(&self.idx),
            seg: self.seg.as_deref().map(put),
            sum: self.sum.as_deref().map(put),
            mask: self.mask.as_deref().map(put),
            ..self.clone()
        }
    }
}

/// How a dataset was made.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Provenance {
    /// Version of prep that wrote it.
    pub prep_version: String,
    /// The subcommand that wrote it, e.g. `tokenize`.
    pub command: String,
    /// When the manifest was written, RFC 3339 UTC.
    pub created: String,
    /// The inputs, in the order read.
    pub inputs: Vec<InputInfo>,
    /// The options that shape the output.
    pub options: serde_json::Value,
    /// What happened to the documents read.
    pub documents: DocumentCounts,
    /// XXH3-64 of the options and inputs; equal fingerprints mean equal output.
    pub fingerprint: String,
    /// The partial datasets `prep merge` joined into this one, in order
    /// (path and size of each, and the XXH3 of its manifest).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub merged: Vec<InputInfo>,
    /// What chat mode (`prep tokenize --chat`) did with the conversations:
    /// tokens trained on, conversations skipped by reason, truncated ones.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub chat: Option<ChatCounts>,
    /// Written to an object store whose conditional writes failed prep's
    /// check, so that its lock locked nothing, on the user's word that the
    /// run was the output's only writer (`--single-writer`).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub single_writer: bool,
    /// A file the command wrote beside the shards for its user to read:
    /// `prep dedup`'s `duplicates.jsonl`, every removed document and the
    /// one it duplicates.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub report: Option<FileInfo>,
}

/// The conversations of a chat-mode run, counted.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChatCounts {
    /// Tokens whose mask byte is 1.
    pub trainable_tokens: u64,
    /// Conversations skipped because no token of theirs is trained on.
    pub no_trainable_token: u64,
    /// Rows that are no conversation (bad; skipped with `--skip-bad`).
    pub malformed: u64,
    /// Conversations the template refused (bad; skipped with `--skip-bad`).
    pub refused: u64,
    /// Conversations whose mask could not be verified (bad; skipped with `--skip-bad`).
    pub unverifiable: u64,
    /// Conversations over `--max-tokens`, dropped.
    pub too_long: u64,
    /// Conversations over `--max-tokens`, truncated (of those tokenized:
    /// duplicates `--dedup` then drops included).
    pub truncated: u64,
    /// Conversations tokenized by a run on the fast engine whose tokens
    /// were not their text byte for byte, so HF tokenizers placed their
    /// mask (duplicates `--dedup` then drops included; absent in manifests
    /// of preps before it).
    #[serde(default)]
    pub placed_by_hf: u64,
}

impl Provenance {
    /// A run of `command` by this prep, written now, merging nothing.
    pub fn new(
        command: &str,
        inputs: Vec<InputInfo>,
        options: serde_json::Value,
        documents: DocumentCounts,
        fingerprint: String,
    ) -> Provenance {
        Provenance {
            prep_version: env!("CARGO_PKG_VERSION").into(),
            command: command.into(),
            created: crate::time::created_time(),
            inputs,
            options,
            documents,
            fingerprint,
            merged: Vec::new(),
            chat: None,
            single_writer: false,
            report: None,
        }
    }
}

/// The version a dataset of these shards is written as: masked shards make
/// a version 2 dataset, others version 1 (which older readers know).
fn version_of(shards: &[ShardInfo]) -> u64 {
    if !shards.is_empty() && shards.iter().all(|s| s.mask.is_some()) {
        MASKED_VERSION
    } else {
        PLAIN_VERSION
    }
}

/// One input file of a run.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct InputInfo {
    /// The path as read.
    pub path: String,
    /// Its size in bytes.
    pub bytes: u64,
    /// XXH3-64 of an input dataset's manifest.json, which names the checksum
    /// of every shard: one checksum for the whole input (datasets read by
    /// `prep shuffle`; raw text inputs have none).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub xxh3: Option<String>,
    /// Which version of a raw input file was read, beside its size: a
    /// local file's modification time (`mtime:` and nanoseconds since the
    /// Unix epoch), an object's version id (`version:`) or ETag (`etag:`).
    /// Absent for a dataset (its `xxh3` says it all) and where none is known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub version: Option<String>,
}

impl InputInfo {
    /// A dataset read as an input, as provenance records it: its path as
    /// the user gave it (`shown`: a directory or an object-storage
    /// address), the bytes of its shards, and the XXH3 of its manifest (which
    /// names every shard's checksum: one checksum for the whole input), read
    /// from `dir` (the same directory, or a verified local copy).
    pub fn of_dataset(
        shown: &Path,
        dir: &Path,
        manifest: &Manifest,
    ) -> Result<InputInfo, FormatError> {
        let path = dir.join(MANIFEST_FILE);
        let bytes = std::fs::read(&path).map_err(|e| FormatError::io(&path, e))?;
        Ok(InputInfo {
            path: shown.display().to_string(),
            bytes: manifest
                .shards
                .iter()
                .map(|s| s.bin_bytes + s.idx_bytes)
                .sum(),
            xxh3: Some(super::checksum_hex(xxhash_rust::xxh3::xxh3_64(&bytes))),
            version: None,
        })
    }
}

/// Counts of the documents a run read.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct DocumentCounts {
    /// Documents read from the inputs.
    pub read: u64,
    /// Documents written as records.
    pub written: u64,
    /// Bad documents skipped (`--skip-bad`).
    pub skipped: u64,
    /// Exact duplicates dropped (`--dedup`).
    pub deduplicated: u64,
    /// Written documents whose text was empty.
    pub empty: u64,
}

impl DocumentCounts {
    /// `n` documents read and all written (stages after tokenize).
    pub fn all_written(n: u64) -> DocumentCounts {
        DocumentCounts {
            read: n,
            written: n,
            ..DocumentCounts::default()
        }
    }
}

/// A file of a dataset besides its shards, as its manifest lists it (see
/// [`Manifest::other_files`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OtherFile<'a> {
    /// What it is, for messages: `the tokenizer copy`, `the record
    /// hashes`, `the report`.
    pub what: &'static str,
    /// Relative to the dataset directory.
    pub name: &'a str,
    /// Its size in bytes, when listed (the tokenizer copy's is not).
    pub bytes: Option<u64>,
    /// Its XXH3-64, 16 hex digits.
    pub xxh3: &'a str,
}

impl Manifest {
    /// Every file the manifest lists besides the shards and itself: the
    /// tokenizer copy, a part's record hashes, a report. The one list of
    /// them: whatever copies, keeps or checks a dataset's files takes them
    /// from here (and a shard's from [`ShardInfo::files`]).
    pub fn other_files(&self) -> Vec<OtherFile<'_>> {
        let mut files = Vec::new();
        if let Some(name) = &self.tokenizer.file {
            files.push(OtherFile {
                what: "the tokenizer copy",
                name,
                bytes: None,
                xxh3: &self.tokenizer.xxh3,
            });
        }
        let hashes = self.partition.as_ref().and_then(|p| p.hashes.as_ref());
        for (what, f) in [
            ("the record hashes", hashes),
            ("the report", self.provenance.report.as_ref()),
        ] {
            if let Some(f) = f {
                files.push(OtherFile {
                    what,
                    name: &f.file,
                    bytes: Some(f.bytes),
                    xxh3: &f.xxh3,
                });
            }
        }
        files
    }

    /// A documents dataset of `shards` (its counts are theirs) with ids of
    /// `dtype` below `vocab_size` from `tokenizer`, no special tokens (see
    /// [`Manifest::with_specials`]), whole (not a partition).
    pub fn documents(
        dtype: Dtype,
        vocab_size: u64,
        tokenizer: TokenizerInfo,
        shards: Vec<ShardInfo>,
        provenance: Provenance,
    ) -> Manifest {
        Manifest {
            format: FORMAT_NAME.into(),
            version: version_of(&shards),
            kind: "documents".into(),
            dtype,
            vocab_size,
            n_records: shards.iter().map(|s| s.n_records).sum(),
            n_tokens: shards.iter().map(|s| s.n_tokens).sum(),
            special_tokens: SpecialTokens::default(),
            bos_prepended: false,
            eos_appended: false,
            tokenizer,
            shards,
            seq_len: None,
            packing: None,
            provenance,
            partition: None,
        }
    }

    /// A dataset that reads as `self` does (kind, dtype, vocabulary, special
    /// tokens, tokenizer, packing) with other `shards` (its counts are
    /// theirs) made by `provenance`, whole (not a partition).
    pub fn derived(&self, shards: Vec<ShardInfo>, provenance: Provenance) -> Manifest {
        Manifest {
            version: version_of(&shards),
            n_records: shards.iter().map(|s| s.n_records).sum(),
            n_tokens: shards.iter().map(|s| s.n_tokens).sum(),
            shards,
            provenance,
            partition: None,
            ..self.clone()
        }
    }

    /// The same dataset with these special tokens, and whether every
    /// record starts with bos and ends with eos.
    pub fn with_specials(
        mut self,
        special: SpecialTokens,
        bos_prepended: bool,
        eos_appended: bool,
    ) -> Manifest {
        self.special_tokens = special;
        self.bos_prepended = bos_prepended;
        self.eos_appended = eos_appended;
        self
    }

    /// The same dataset as a packed one: rows of `seq_len`, `packing`'s counts.
    pub fn with_packing(mut self, seq_len: u64, packing: Packing) -> Manifest {
        self.kind = "packed".into();
        self.seq_len = Some(seq_len);
        self.packing = Some(packing);
        self
    }

    /// The same dataset as one part of a partitioned run.
    pub fn with_partition(mut self, partition: Option<Partition>) -> Manifest {
        self.partition = partition;
        self
    }

    /// Whether the shards carry loss masks (a version 2 dataset).
    pub fn has_loss_mask(&self) -> bool {
        self.version >= MASKED_VERSION
    }

    /// Refuses a dataset with loss masks for `command`, which cannot carry
    /// them into its output yet: writing its tokens without their masks
    /// would silently train on every token.
    pub fn refuse_loss_mask(&self, dir: &Path, command: &str) -> Result<(), FormatError> {
        if !self.has_loss_mask() {
            return Ok(());
        }
        Err(FormatError::BadManifest {
            path: dir.join(MANIFEST_FILE),
            message: format!(
                "the dataset carries loss masks (version {MASKED_VERSION}), which {command} \
                 does not carry into its output yet; its tokens without their masks would \
                 train on every token"
            ),
        })
    }

    /// Which run made this dataset, as an output directory's lifecycle
    /// compares it: the fingerprint, and for a merged dataset also the
    /// checksums of the parts it joined (a merge of other parts of the same
    /// job is another dataset).
    pub fn identity(&self) -> String {
        identity(&self.provenance.fingerprint, &self.provenance.merged)
    }

    /// Reads and checks `DIR/manifest.json`: its JSON, `format`, `version`,
    /// the shard paths, and that the shard counts add up to the totals.
    pub fn read(dir: &Path) -> Result<Manifest, FormatError> {
        let path = dir.join(MANIFEST_FILE);
        let meta = match std::fs::metadata(&path) {
            Ok(meta) => meta,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                return Err(FormatError::NoManifest { dir: dir.into() })
            }
            Err(e) => return Err(FormatError::io(&path, e)),
        };
        if meta.len() > MAX_MANIFEST_BYTES {
            return Err(FormatError::BadManifest {
                path,
                message: format!("{} bytes, more than any manifest needs", meta.len()),
            });
        }
        let bytes = std::fs::read(&path).map_err(|e| FormatError::io(&path, e))?;
        Self::parse(&path, &bytes)
    }

    /// Parses and checks manifest bytes; `path` only names the file in errors.
    pub fn parse(path: &Path, bytes: &[u8]) -> Result<Manifest, FormatError> {
        let bad = |message: String| FormatError::BadManifest {
            path: path.into(),
            message,
        };
        // Look at format and version before the full parse, so a newer
        // manifest is refused by its version rather than by a missing field.
        let value: serde_json::Value =
            serde_json::from_slice(bytes).map_err(|e| bad(e.to_string()))?;
        Self::check_format(path, &value)?;
        match value.get("version").and_then(|v| v.as_u64()) {
            Some(v) if v > FORMAT_VERSION => {
                return Err(FormatError::UnsupportedVersion {
                    path: path.into(),
                    found: v,
                    supported: FORMAT_VERSION,
                })
            }
            Some(v) if v >= 1 => {}
            _ => return Err(bad("`version` is not a positive integer".into())),
        }
        let manifest: Manifest = serde_json::from_value(value).map_err(|e| bad(e.to_string()))?;
        manifest.check(path)?;
        Ok(manifest)
    }

    /// Refuses a manifest that does not say `"format": "prep"`: another
    /// tool's, so the directory is no prep dataset (the error says so, and
    /// what prep reads instead).
    pub fn check_format(path: &Path, value: &serde_json::Value) -> Result<(), FormatError> {
        if value.get("format").and_then(|f| f.as_str()) == Some(FORMAT_NAME) {
            return Ok(());
        }
        Err(FormatError::BadManifest {
            path: path.into(),
            message: not_prep(value),
        })
    }

    /// Internal consistency: safe shard paths and totals that add up.
    fn check(&self, path: &Path) -> Result<(), FormatError> {
        match self.consistency_problems().into_iter().next() {
            None => Ok(()),
            Some(message) => Err(FormatError::BadManifest {
                path: path.into(),
                message,
            }),
        }
    }

    /// Everything internally inconsistent: a known kind, shard paths that
    /// stay inside the dataset (every file's: a `.seg` or `.sum` path is
    /// written to by `prep fetch` as much as a `.bin`'s), an optional
    /// file's name, size and checksum listed together, and totals equal to
    /// the sums over shards.
    pub fn consistency_problems(&self) -> Vec<String> {
        let mut problems = Vec::new();
        if self.kind != "documents" && self.kind != "packed" {
            problems.push(format!("unknown kind {:?}", self.kind));
        }
        let (mut records, mut tokens) = (Some(0u64), Some(0u64));
        for (i, shard) in self.shards.iter().enumerate() {
            for file in shard.files() {
                let name = file.name;
                if !is_safe_relative(name) {
                    problems.push(format!(
                        "shard {i}: path {name:?} is not a plain relative path"
                    ));
                }
            }
            let listed = [
                shard.sum.is_some(),
                shard.sum_bytes.is_some(),
                shard.sum_xxh3.is_some(),
            ];
            if listed.contains(&true) && listed.contains(&false) {
                problems.push(format!(
                    "shard {i}: sum, sum_bytes and sum_xxh3 go together (one is missing)"
                ));
            }
            let masked = [
                shard.mask.is_some(),
                shard.mask_bytes.is_some(),
                shard.mask_xxh3.is_some(),
            ];
            let wanted = self.version >= MASKED_VERSION;
            if masked.iter().any(|&m| m != wanted) {
                problems.push(if wanted {
                    format!("shard {i}: a version {MASKED_VERSION} dataset lists mask, mask_bytes and mask_xxh3 for every shard")
                } else {
                    format!("shard {i}: lists a loss mask, which only a version {MASKED_VERSION} dataset has")
                });
            } else if shard.mask_bytes.is_some_and(|b| b != shard.n_tokens) {
                problems.push(format!(
                    "shard {i}: mask_bytes is {}, but a mask has one byte per token ({})",
                    shard.mask_bytes.unwrap_or(0),
                    shard.n_tokens
                ));
            }
            records = records.and_then(|r| r.checked_add(shard.n_records));
            tokens = tokens.and_then(|t| t.checked_add(shard.n_tokens));
        }
        match records {
            Some(r) if r == self.n_records => {}
            Some(r) => problems.push(format!(
                "n_records is {} but the shards hold {r}",
                self.n_records
            )),
            None => problems.push("the shards' record counts overflow".into()),
        }
        match tokens {
            Some(t) if t == self.n_tokens => {}
            Some(t) => problems.push(format!(
                "n_tokens is {} but the shards hold {t}",
                self.n_tokens
            )),
            None => problems.push("the shards' token counts overflow".into()),
        }
        problems
    }

    /// The first way `other` reads differently from this dataset, as (what,
    /// this value, the other's): tokenizer, dtype, vocabulary, kind, special
    /// tokens and their placement, row length and packing, loss masks or
    /// none. Datasets that
    /// differ in none of these can be mixed or joined.
    pub fn reading_difference(&self, other: &Manifest) -> Option<(&'static str, String, String)> {
        let specials = |m: &Manifest| {
            format!(
                "{:?} bos_prepended={} eos_appended={}",
                m.special_tokens, m.bos_prepended, m.eos_appended
            )
        };
        let shape = |m: &Manifest| {
            let packing = m.packing.as_ref();
            format!(
                "seq_len={:?} {:?}",
                m.seq_len,
                packing.map(|p| (&p.mode, p.seed, p.window, p.separator))
            )
        };
        let masks = |m: &Manifest| {
            if m.has_loss_mask() {
                "loss masks".to_owned()
            } else {
                "no loss masks".to_owned()
            }
        };
        let pairs: [(&'static str, String, String); 7] = [
            (
                "tokenizers",
                self.tokenizer.xxh3.clone(),
                other.tokenizer.xxh3.clone(),
            ),
            ("dtypes", self.dtype.to_string(), other.dtype.to_string()),
            (
                "vocabulary sizes",
                self.vocab_size.to_string(),
                other.vocab_size.to_string(),
            ),
            ("kinds", self.kind.clone(), other.kind.clone()),
            ("special tokens", specials(self), specials(other)),
            ("packings", shape(self), shape(other)),
            ("loss masks", masks(self), masks(other)),
        ];
        pairs.into_iter().find(|(_, a, b)| a != b)
    }

    /// The manifest as written: pretty JSON with a final newline.
    pub fn to_json(&self) -> String {
        let mut s = serde_json::to_string_pretty(self).expect("a manifest always serializes");
        s.push('\n');
        s
    }
}

/// A relative path that stays inside the dataset directory.
/// [`Manifest::identity`] of a dataset with this fingerprint that merges
/// `merged` (empty for every dataset but a merge's).
pub fn identity(fingerprint: &str, merged: &[InputInfo]) -> String {
    if merged.is_empty() {
        return fingerprint.into();
    }
    let sums: Vec<&str> = merged
        .iter()
        .map(|m| m.xxh3.as_deref().unwrap_or(""))
        .collect();
    let key = format!("{fingerprint} merged {}", sums.join(" "));
    super::checksum_hex(xxhash_rust::xxh3::xxh3_64(key.as_bytes()))
}

/// Why a `manifest.json` that does not say `"format": "prep"` is not read,
/// and what to give prep instead: such a file is another tool's (Mosaic
/// streaming, a Hugging Face cache and others write a manifest.json too).
fn not_prep(value: &serde_json::Value) -> String {
    let found = match value.get("format") {
        None => "it has no \"format\" field".to_owned(),
        Some(format) => {
            // The value as found, cut short: it may be anything.
            let shown: String = format.to_string().chars().take(40).collect();
            format!("its \"format\" is {shown}")
        }
    };
    format!(
        "this manifest.json is not prep's ({found}; a prep dataset's says \"format\": \"prep\"): \
         the directory holds another tool's files, not a prep dataset, and prep reads and writes \
         into only directories that prep made (prep import turns Megatron-LM, nanoGPT, llm.c and \
         datatrove token files into one)"
    )
}

/// Whether `name` is a relative path that stays inside the dataset (no
/// root, no `..`): what a manifest may name.
pub fn is_safe_relative(name: &str) -> bool {
    let p = Path::new(name);
    !name.is_empty()
        && !name.contains('\\')
        && p.components().all(|c| matches!(c, Component::Normal(_)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn safe_paths() {
        assert!(is_safe_relative("shard-00000.bin"));
        assert!(is_safe_relative("part-1/shard-00000.bin"));
        assert!(!is_safe_relative("../x.bin"));
        assert!(!is_safe_relative("/etc/passwd"));
        assert!(!is_safe_relative("a/../../b"));
        assert!(!is_safe_relative(""));
    }
}
