//! Resuming: what a run has finished, kept in `DIR/.prep-journal.json`, and
//! what a new run finds in its output directory.

use std::path::Path;

use serde::{Deserialize, Serialize};

use super::TokenizeError;
use crate::format::{
    atomic_write, hash_file, DocumentCounts, FormatError, Manifest, ShardInfo, MANIFEST_FILE,
    TMP_SUFFIX,
};

/// The journal's file name inside the output directory.
pub(crate) const JOURNAL_FILE: &str = ".prep-journal.json";
/// The tokenizer's copy inside a dataset.
pub(crate) const TOKENIZER_FILE: &str = "tokenizer.json";

/// Where the input stands after a completed shard.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Checkpoint {
    /// Input documents (in reading order, bad and duplicate ones included)
    /// consumed before the first record of the next shard.
    pub position: u64,
    /// Counts up to `position`.
    pub documents: DocumentCounts,
    /// UTF-8 bytes of the text written up to `position`.
    pub text_bytes: u64,
}

/// A completed shard and the checkpoint right after it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct JournalShard {
    /// The shard as the manifest will list it.
    pub shard: ShardInfo,
    /// Where a resumed run starts reading.
    pub checkpoint: Checkpoint,
}

/// The journal of a run under way.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Journal {
    /// Fingerprint of the run's inputs and options.
    pub fingerprint: String,
    /// Completed shards, in order.
    pub shards: Vec<JournalShard>,
}

impl Journal {
    /// Writes the journal atomically.
    pub(crate) fn save(&self, dir: &Path) -> Result<(), FormatError> {
        let json = serde_json::to_vec_pretty(self).expect("a journal always serializes");
        atomic_write(&dir.join(JOURNAL_FILE), &json)
    }
}

/// What a run finds in its output directory.
pub(crate) enum Start {
    /// Nothing to keep.
    Fresh,
    /// An interrupted run with the same fingerprint: these shards are intact.
    Resume(Vec<JournalShard>),
    /// A finished dataset with the same fingerprint.
    Complete(Box<Manifest>),
}

/// Inspects (and creates or tidies) the output directory.
///
/// - A finished dataset with the same fingerprint is left alone (`Complete`).
/// - An interrupted run with the same fingerprint keeps the longest prefix
///   of its shards whose sizes and checksums still match (`Resume`).
/// - Anything else of prep's is removed only with `overwrite`; a directory
///   holding other files is refused unless `overwrite` (and even then only
///   prep's own files are removed).
pub(crate) fn prepare(
    dir: &Path,
    fingerprint: &str,
    overwrite: bool,
) -> Result<Start, TokenizeError> {
    let io = |e| TokenizeError::Io {
        path: dir.into(),
        source: e,
    };
    if !dir.exists() {
        std::fs::create_dir_all(dir).map_err(io)?;
        return Ok(Start::Fresh);
    }
    if !dir.is_dir() {
        return Err(TokenizeError::OutputExists {
            dir: dir.into(),
            why: "is a file, not a directory".into(),
        });
    }
    let refuse = |why: &str| TokenizeError::OutputExists {
        dir: dir.into(),
        why: why.into(),
    };
    if overwrite {
        clean(dir)?;
        return Ok(Start::Fresh);
    }
    if dir.join(MANIFEST_FILE).exists() {
        let manifest = Manifest::read(dir)?;
        if manifest.provenance.fingerprint != fingerprint {
            return Err(refuse(
                "holds a dataset made from other inputs or options (pass --overwrite to replace it)",
            ));
        }
        for shard in &manifest.shards {
            for (name, bytes) in [(&shard.bin, shard.bin_bytes), (&shard.idx, shard.idx_bytes)] {
                let len = std::fs::metadata(dir.join(name)).map(|m| m.len()).ok();
                if len != Some(bytes) {
                    return Err(refuse(&format!(
                        "holds this dataset, finished, but {name} is missing or has the wrong size \
                         (pass --overwrite to make it again)"
                    )));
                }
            }
        }
        // A crash between writing the manifest and removing the journal
        // leaves a stale journal behind.
        let _ = std::fs::remove_file(dir.join(JOURNAL_FILE));
        return Ok(Start::Complete(Box::new(manifest)));
    }
    let journal_path = dir.join(JOURNAL_FILE);
    if journal_path.exists() {
        let bytes = std::fs::read(&journal_path).map_err(|e| TokenizeError::Io {
            path: journal_path.clone(),
            source: e,
        })?;
        let journal: Option<Journal> = serde_json::from_slice(&bytes).ok();
        match journal {
            Some(j) if j.fingerprint == fingerprint => {
                let kept = intact_prefix(dir, j.shards)?;
                clean_beyond(dir, &kept)?;
                return Ok(Start::Resume(kept));
            }
            _ => {
                return Err(refuse(
                    "holds an interrupted run with other inputs or options (pass --overwrite to start over)",
                ))
            }
        }
    }
    let foreign = std::fs::read_dir(dir)
        .map_err(io)?
        .filter_map(Result::ok)
        .any(|e| !is_ours(&e.file_name().to_string_lossy()));
    if foreign {
        return Err(refuse(
            "is not empty (choose an empty or new directory, or pass --overwrite)",
        ));
    }
    clean(dir)?;
    Ok(Start::Fresh)
}

/// The shards whose files still have their recorded sizes and checksums, up
/// to the first that does not.
fn intact_prefix(
    dir: &Path,
    shards: Vec<JournalShard>,
) -> Result<Vec<JournalShard>, TokenizeError> {
    let mut kept = Vec::with_capacity(shards.len());
    for js in shards {
        let s = &js.shard;
        let ok = [
            (&s.bin, s.bin_bytes, &s.bin_xxh3),
            (&s.idx, s.idx_bytes, &s.idx_xxh3),
        ]
        .into_iter()
        .all(|(name, bytes, sum)| match hash_file(&dir.join(name)) {
            Ok((hash, len)) => len == bytes && crate::format::checksum_hex(hash) == *sum,
            Err(_) => false,
        });
        if !ok {
            break;
        }
        kept.push(js);
    }
    Ok(kept)
}

/// Removes prep's files that are not among the `kept` shards.
fn clean_beyond(dir: &Path, kept: &[JournalShard]) -> Result<(), TokenizeError> {
    let keep: std::collections::HashSet<&str> = kept
        .iter()
        .flat_map(|k| [k.shard.bin.as_str(), k.shard.idx.as_str()])
        .collect();
    remove_files(dir, |name| {
        (is_shard_file(name) || name.ends_with(TMP_SUFFIX)) && !keep.contains(name)
    })
}

/// Removes prep's own files from `dir`.
fn clean(dir: &Path) -> Result<(), TokenizeError> {
    remove_files(dir, is_ours)
}

/// Removes the plain files of `dir` whose names `doomed` picks.
fn remove_files(dir: &Path, doomed: impl Fn(&str) -> bool) -> Result<(), TokenizeError> {
    let io = |e| TokenizeError::Io {
        path: dir.into(),
        source: e,
    };
    for entry in std::fs::read_dir(dir).map_err(io)? {
        let entry = entry.map_err(io)?;
        let name = entry.file_name().to_string_lossy().into_owned();
        if doomed(&name) && entry.path().is_file() {
            remove(&entry.path())?;
        }
    }
    Ok(())
}

fn remove(path: &Path) -> Result<(), TokenizeError> {
    std::fs::remove_file(path).map_err(|e| TokenizeError::Io {
        path: path.into(),
        source: e,
    })
}

fn is_shard_file(name: &str) -> bool {
    name.starts_with("shard-") && crate::format::is_prep_file(name)
}

/// Files prep writes into a dataset directory.
fn is_ours(name: &str) -> bool {
    crate::format::is_prep_file(name)
}
