//! `prep merge`: the partial datasets of a partitioned run (`--part I/N` of
//! tokenize or pack, or the buckets of a distributed shuffle) into one
//! dataset.
//!
//! Parts are put in the order of the part number their manifests record,
//! never the order given (a shell sorts `part-10` before `part-2`), and must
//! be every part of one run: same stage, same job fingerprint, numbers
//! `0..N` each once. They must read the same way: tokenizer, dtype,
//! vocabulary, special tokens, kind, and for packed parts the row length and
//! packing mode.
//!
//! Token data is not copied. A part that lies inside the output directory
//! (the usual layout, `OUT/part-00003`) has its shards listed in the merged
//! manifest in place (`part-00003/shard-00000.bin`); a part elsewhere has
//! its shard files hard-linked into the output directory, which needs the
//! same file system; `--copy` copies them instead. The merged manifest is
//! written last, so a merge that stops half-way leaves no dataset, and
//! running it again finishes it.
//!
//! ## `--dedup` across parts
//!
//! A tokenize run with `--dedup` drops every document whose text was seen
//! earlier in the inputs. A part can only see its own share, so it drops
//! the duplicates within the share and records the XXH3-128 of the text of
//! every record it writes (`hashes.bin`, 16 bytes per record). The merge
//! walks the records in order with one set of hashes and drops each record
//! whose hash an earlier part already wrote: exactly the records the
//! one-machine run drops. Shards that lose records are rewritten into the
//! output directory (only those: the others stay in place); memory is the
//! set of distinct hashes, as for a one-machine `--dedup`.

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use xxhash_rust::xxh3::{xxh3_128, xxh3_64};

use crate::fetch::Local;
use crate::format::{
    checksum_hex, ChatCounts, Dataset, DatasetWriter, DocumentCounts, FileInfo, FormatError,
    InputInfo, Manifest, Packing, Partition, ShardInfo, ShardWriter, Verified, MANIFEST_FILE,
};
use crate::output::{Output, OutputError, Start};
use crate::progress::{Progress, ProgressSnapshot};

/// What `prep merge` is asked to do.
#[derive(Debug, Clone)]
pub struct MergeConfig {
    /// The partial datasets, in any order.
    pub parts: Vec<PathBuf>,
    /// The merged dataset's directory (it may hold the parts).
    pub output: PathBuf,
    /// Copy shard files that are not inside the output directory instead of
    /// hard-linking them.
    pub copy: bool,
    /// Replace a different dataset found in the output directory.
    pub overwrite: bool,
    /// The user guarantees a single writer ([`crate::run::Writing::single_writer`]).
    pub single_writer: bool,
}

impl MergeConfig {
    /// Merge `parts` into `output`, linking what lies outside it.
    pub fn new(parts: Vec<PathBuf>, output: impl Into<PathBuf>) -> MergeConfig {
        MergeConfig {
            parts,
            output: output.into(),
            copy: false,
            overwrite: false,
            single_writer: false,
        }
    }
}

/// Every way `prep merge` can fail.
#[derive(Debug, thiserror::Error)]
pub enum MergeError {
    /// A part or the output could not be read or written.
    #[error(transparent)]
    Format(#[from] FormatError),
    /// The output overlaps an input.
    #[error(transparent)]
    Overlap(#[from] crate::run::Overlap),
    /// No part given.
    #[error("no partial dataset given")]
    NoInput,
    /// A dataset without a `partition` in its manifest.
    #[error(
        "{}: not a partial dataset (its manifest has no partition); prep merge joins the parts \
         of one run made with --part (or the buckets of prep shuffle --gather)",
        dir.display()
    )]
    NotAPart {
        /// The dataset.
        dir: PathBuf,
    },
    /// Two inputs that cannot be taken together.
    #[error(transparent)]
    Incompatible(#[from] Box<crate::run::Incompatible>),
    /// Parts missing or given twice.
    #[error("{0}")]
    Parts(String),
    /// A part's report does not match its manifest, or some parts have
    /// one and others not.
    #[error("{}: {why}", path.display())]
    Report {
        /// The part's report, or the part.
        path: PathBuf,
        /// What is wrong.
        why: String,
    },
    /// A part's `hashes.bin` does not match its manifest.
    #[error("{}: {why}", path.display())]
    Hashes {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        why: String,
    },
    /// The output directory was refused or is held by another run.
    #[error(transparent)]
    Output(#[from] OutputError),
    /// A part in object storage could not be fetched.
    #[error(transparent)]
    Fetch(#[from] crate::fetch::FetchError),
    /// A shard file outside the output directory could not be hard-linked.
    #[error(
        "cannot hard-link {} to {}: {source}; pass --copy to copy it, or write the parts inside \
         the output directory so they are used in place",
        from.display(),
        to.display()
    )]
    Link {
        /// The part's file.
        from: PathBuf,
        /// The link that was to be made.
        to: PathBuf,
        /// The underlying error.
        source: std::io::Error,
    },
}

fn io(path: &Path) -> impl Fn(std::io::Error) -> MergeError + '_ {
    move |source| MergeError::Format(crate::format::FormatError::io(path, source))
}

/// What a run did.
#[derive(Debug, Clone)]
pub struct MergeReport {
    /// The manifest written (or found).
    pub manifest: Manifest,
    /// The output was already this merge: nothing was done.
    pub already_complete: bool,
    /// Parts joined.
    pub parts: usize,
    /// Shards used where they lie, inside the output directory.
    pub referenced: usize,
    /// Shards hard-linked into the output directory.
    pub linked: usize,
    /// Shards copied (`--copy`).
    pub copied: usize,
    /// Shards rewritten without the records `--dedup` drops across parts.
    pub rewritten: usize,
    /// Token and index bytes written (copies and rewrites).
    pub bytes_written: u64,
    /// Wall time.
    pub elapsed: Duration,
}

/// One part, opened.
struct Part {
    /// The part as the user named it (a directory or an object-storage
    /// address); its files are read from `ds.dir()`.
    dir: PathBuf,
    ds: Dataset,
    /// Where it is read: a part in object storage, fetched.
    _local: Local,
    partition: Partition,
    /// XXH3-64 of its manifest.json.
    manifest_xxh3: String,
}

/// Runs `prep merge`: opens and checks the parts, starts the output (or
/// finds it complete), lists, links, copies or rewrites every shard in
/// order, and commits the merged manifest.
pub fn run(config: &MergeConfig, progress: &dyn Progress) -> Result<MergeReport, MergeError> {
    let started = Instant::now();
    if config.parts.is_empty() {
        return Err(MergeError::NoInput);
    }
    // Parts may lie inside the output (their shards are then used where
    // they lie), but the output may not be a part or lie inside one.
    crate::run::refuse_inside(&config.output, &config.parts, "the part")?;
    let parts = open_parts(&config.parts)?;
    let first = &parts[0];
    let base = first.ds.manifest().clone();
    let job = first.partition.job.clone();
    let merged = merged_inputs(&config.output, &parts);
    let mut report = MergeReport {
        manifest: base.clone(),
        already_complete: false,
        parts: parts.len(),
        referenced: 0,
        linked: 0,
        copied: 0,
        rewritten: 0,
        bytes_written: 0,
        elapsed: Duration::ZERO,
    };
    let mut output = lock_output(&config.output, &parts, config.single_writer)?;
    let identity = crate::format::identity(&job, &merged);
    // Where the shards go: the output directory, or its staging folder.
    let out = &output.dir().to_path_buf();
    if let Some(done) = start(&mut output, &identity, config.overwrite)? {
        progress.note("the merged dataset is already complete; nothing to do");
        report.manifest = done;
        report.already_complete = true;
        report.elapsed = started.elapsed();
        return Ok(report);
    }

    let dedup = first.partition.stage == "tokenize"
        && base.provenance.options.get("dedup") == Some(&serde_json::Value::Bool(true));
    let total_bytes: u64 = merged.iter().map(|m| m.bytes).sum();
    let to = Destination {
        out,
        output: &config.output,
        copy: config.copy,
    };
    let (shards, documents, dropped_trainable) =
        merge_shards(&parts, &to, dedup, total_bytes, &mut report, progress)?;

    output.copy_tokenizer(base.tokenizer.file.as_deref(), first.ds.dir())?;
    let mut manifest = merged_manifest(&base, &parts, shards, documents, job, merged);
    if let Some(chat) = manifest.provenance.chat.as_mut() {
        chat.trainable_tokens -= dropped_trainable;
    }
    manifest.provenance.report = merged_report(&parts, &output)?;
    output.commit(&manifest)?;
    progress.finish();
    report.manifest = manifest;
    report.elapsed = started.elapsed();
    Ok(report)
}

/// Opens every part, sorted by its part number, and checks that they are
/// every part of one run.
fn open_parts(dirs: &[PathBuf]) -> Result<Vec<Part>, MergeError> {
    let mut parts = Vec::with_capacity(dirs.len());
    for dir in dirs {
        parts.push(open_part(dir)?);
    }
    parts.sort_by_key(|p| p.partition.part);
    check_parts(&parts)?;
    Ok(parts)
}

/// Opens one part: its dataset, its partition and its manifest's checksum.
fn open_part(dir: &Path) -> Result<Part, MergeError> {
    let local = Local::of(dir)?;
    let ds = Dataset::open(local.dir())?;
    let partition = ds
        .manifest()
        .partition
        .clone()
        .ok_or_else(|| MergeError::NotAPart {
            dir: dir.to_path_buf(),
        })?;
    let path = ds.dir().join(MANIFEST_FILE);
    let bytes = std::fs::read(&path).map_err(io(&path))?;
    Ok(Part {
        dir: dir.to_path_buf(),
        ds,
        _local: local,
        partition,
        manifest_xxh3: checksum_hex(xxh3_64(&bytes)),
    })
}

/// The parts as the merged manifest lists them: each one's path (relative
/// to the output when inside it), its data bytes and its manifest's checksum.
fn merged_inputs(out: &Path, parts: &[Part]) -> Vec<InputInfo> {
    parts
        .iter()
        .map(|p| InputInfo {
            path: relative_to(out, &p.dir).unwrap_or_else(|| p.dir.display().to_string()),
            bytes: p
                .ds
                .manifest()
                .shards
                .iter()
                .map(ShardInfo::total_bytes)
                .sum(),
            xxh3: Some(p.manifest_xxh3.clone()),
            version: None,
        })
        .collect()
}

/// Locks the output directory, keeping the parts that lie inside it.
fn lock_output(out: &Path, parts: &[Part], single_writer: bool) -> Result<Output, MergeError> {
    // The parts inside the output directory are the caller's, kept whatever
    // happens to prep's files around them.
    let mut output = Output::lock(out, single_writer)?;
    for part in parts {
        if let Some(top) =
            relative_to(out, &part.dir).and_then(|r| r.split('/').next().map(String::from))
        {
            output = output.keeping(top);
        }
    }
    Ok(output)
}

/// Starts the output afresh, or returns its manifest when it already holds
/// this merge, complete.
fn start(
    output: &mut Output,
    identity: &str,
    overwrite: bool,
) -> Result<Option<Manifest>, MergeError> {
    match output.start::<(), ()>(identity, overwrite)? {
        Start::Complete(done) => Ok(Some(*done)),
        Start::Fresh(_) => Ok(None),
        // A merge is redone in full: it links or references, it copies little.
        Start::Resume(_) => {
            output.restart::<(), ()>(identity)?;
            Ok(None)
        }
    }
}

/// Where the merged shards go, and how those of parts outside it get there.
struct Destination<'a> {
    /// The directory the shards are written in: the output directory, or
    /// its staging folder.
    out: &'a Path,
    /// The output directory as given, against which a part is inside it.
    output: &'a Path,
    /// Copy shard files instead of hard-linking them.
    copy: bool,
}

/// Takes every part's shards in order, each referenced in place, linked,
/// copied, or (with `dedup`) rewritten without the records an earlier part
/// wrote; returns the merged shards, the summed document counts, and the
/// trained-on tokens of the records dropped.
fn merge_shards(
    parts: &[Part],
    to: &Destination,
    dedup: bool,
    total_bytes: u64,
    report: &mut MergeReport,
    progress: &dyn Progress,
) -> Result<(Vec<ShardInfo>, DocumentCounts, u64), MergeError> {
    let mut seen: HashSet<u128> = HashSet::new();
    let mut dropped_trainable = 0u64;
    let mut documents = DocumentCounts::default();
    let mut shards: Vec<ShardInfo> = Vec::new();
    let mut done_bytes = 0u64;
    for part in parts {
        let m = part.ds.manifest();
        add_counts(&mut documents, &m.provenance.documents);
        let hashes = if dedup {
            Some(read_hashes(part)?)
        } else {
            None
        };
        let inside = relative_to(to.output, &part.dir);
        // The merged manifest vouches for every shard it lists: each is
        // checked as it is rewritten, or whole before it is taken as it is.
        let checked = part.ds.verified()?;
        for (s, shard) in m.shards.iter().enumerate() {
            let first_record = part.ds.shard_first_record(s);
            // Records of this shard an earlier part already wrote.
            let drop: Vec<bool> = match &hashes {
                Some(h) => (0..shard.n_records)
                    .map(|r| !seen.insert(h[(first_record + r) as usize]))
                    .collect(),
                None => Vec::new(),
            };
            let stem = DatasetWriter::shard_stem(shards.len());
            if drop.iter().any(|&d| d) {
                let hashes = hashes.as_deref().expect("drops come from hashes");
                let info = rewrite_shard(
                    &checked,
                    first_record,
                    &drop,
                    hashes,
                    to.out,
                    &stem,
                    &mut documents,
                    &mut dropped_trainable,
                )?;
                report.rewritten += 1;
                report.bytes_written += info.total_bytes();
                shards.push(info);
            } else if let Some(prefix) = &inside {
                checked.check_shard(s)?;
                report.referenced += 1;
                shards.push(shard.within(prefix));
            } else {
                checked.check_shard(s)?;
                shards.push(place_shard(part, shard, to, &stem)?);
                if to.copy {
                    report.copied += 1;
                    report.bytes_written += shard.total_bytes();
                } else {
                    report.linked += 1;
                }
            }
            done_bytes += shard.total_bytes();
            progress.update(&ProgressSnapshot {
                input_bytes: done_bytes,
                input_total: total_bytes,
                documents: 0,
                text_bytes: 0,
                tokens: 0,
            });
        }
    }
    Ok((shards, documents, dropped_trainable))
}

/// Rewrites the shard of `part` whose records start at `first_record` as
/// `stem` in `out`, without the records `drop` marks, taking those off the
/// counts as deduplicated (and their trained-on tokens into
/// `dropped_trainable`).
#[allow(clippy::too_many_arguments)] // one call site; the counts it keeps are the merge's
fn rewrite_shard(
    part: &Verified<'_>,
    first_record: u64,
    drop: &[bool],
    hashes: &[u128],
    out: &Path,
    stem: &str,
    documents: &mut DocumentCounts,
    dropped_trainable: &mut u64,
) -> Result<ShardInfo, MergeError> {
    let empty_text = xxh3_128(b"");
    let manifest = part.dataset().manifest();
    let mut writer = if manifest.has_loss_mask() {
        ShardWriter::create_masked(out, stem, manifest.dtype)?
    } else {
        ShardWriter::create(out, stem, manifest.dtype)?
    };
    for (r, &dropped) in drop.iter().enumerate() {
        let index = first_record + r as u64;
        if dropped {
            documents.written -= 1;
            documents.deduplicated += 1;
            let hash = hashes[index as usize];
            documents.empty -= u64::from(hash == empty_text && documents.empty > 0);
            if let Some(mask) = part.loss_mask(index)? {
                *dropped_trainable += mask.iter().map(|&m| u64::from(m)).sum::<u64>();
            }
            continue;
        }
        let bytes = part.record_bytes(index)?;
        match part.loss_mask(index)? {
            Some(mask) => writer.push_raw_masked(bytes, mask)?,
            None => writer.push_raw(bytes)?,
        }
    }
    Ok(writer.finish()?)
}

/// Hard-links (or copies) the files of a shard of a part outside the output
/// into it, named `stem`.
fn place_shard(
    part: &Part,
    shard: &ShardInfo,
    to: &Destination,
    stem: &str,
) -> Result<ShardInfo, MergeError> {
    let place = |name: &str, ext: &str| -> Result<String, MergeError> {
        let to_name = format!("{stem}.{ext}");
        place_file(&part.ds.dir().join(name), &to.out.join(&to_name), to.copy)?;
        Ok(to_name)
    };
    Ok(ShardInfo {
        bin: place(&shard.bin, "bin")?,
        idx: place(&shard.idx, "idx")?,
        seg: shard
            .seg
            .as_ref()
            .map(|seg| place(seg, "seg"))
            .transpose()?,
        sum: shard
            .sum
            .as_ref()
            .map(|sum| place(sum, "sum"))
            .transpose()?,
        mask: shard
            .mask
            .as_ref()
            .map(|mask| place(mask, "mask"))
            .transpose()?,
        ..shard.clone()
    })
}

/// The merged manifest: the first part's, with the merged shards, the
/// parts' counts and packing summed, and the job's fingerprint.
fn merged_manifest(
    base: &Manifest,
    parts: &[Part],
    shards: Vec<ShardInfo>,
    documents: DocumentCounts,
    job: String,
    merged: Vec<InputInfo>,
) -> Manifest {
    let n_tokens: u64 = shards.iter().map(|s| s.n_tokens).sum();
    let packing = base.packing.as_ref().map(|_| {
        let mut sum = parts
            .iter()
            .filter_map(|p| p.ds.manifest().packing.clone())
            .reduce(add_packing)
            .expect("packed parts have packing");
        sum.pad_share = if n_tokens == 0 {
            0.0
        } else {
            sum.pad_tokens as f64 / n_tokens as f64
        };
        sum
    });
    let mut options = base.provenance.options.clone();
    if let Some(map) = options.as_object_mut() {
        map.remove("part");
    }
    let mut manifest = base.derived(
        shards,
        crate::format::Provenance {
            created: crate::util::created_time(),
            options,
            documents,
            fingerprint: job,
            merged,
            chat: parts
                .iter()
                .filter_map(|p| p.ds.manifest().provenance.chat)
                .reduce(add_chat),
            // A part written without a working lock is part of the whole.
            single_writer: parts
                .iter()
                .any(|p| p.ds.manifest().provenance.single_writer),
            report: None,
            ..base.provenance.clone()
        },
    );
    manifest.packing = packing;
    manifest
}

/// The parts' reports (`prep dedup`'s), each checked against its part's
/// manifest, joined in part order into the merged dataset's: a report
/// is JSON Lines about its part's records in record order, so the parts'
/// in order are the whole run's. `None` when the parts have none.
fn merged_report(parts: &[Part], output: &Output) -> Result<Option<FileInfo>, MergeError> {
    let listed = |p: &Part| p.ds.manifest().provenance.report.clone();
    let Some(first) = listed(&parts[0]) else {
        if let Some(p) = parts.iter().find(|p| listed(p).is_some()) {
            return Err(MergeError::Report {
                path: p.dir.clone(),
                why: "has a report and the first part has none".into(),
            });
        }
        return Ok(None);
    };
    let mut joined = Vec::new();
    for p in parts {
        let Some(r) = listed(p) else {
            return Err(MergeError::Report {
                path: p.dir.clone(),
                why: "has no report and the first part has one".into(),
            });
        };
        let path = p.ds.dir().join(&r.file);
        let bytes = std::fs::read(&path).map_err(|e| FormatError::io(&path, e))?;
        if bytes.len() as u64 != r.bytes || checksum_hex(xxh3_64(&bytes)) != r.xxh3 {
            return Err(MergeError::Report {
                path,
                why: "its size or XXH3 is not the one its manifest lists".into(),
            });
        }
        joined.extend_from_slice(&bytes);
    }
    output.put(&first.file, &joined)?;
    Ok(Some(FileInfo {
        file: first.file,
        bytes: joined.len() as u64,
        xxh3: checksum_hex(xxh3_64(&joined)),
    }))
}

/// Every part of one run, each once, all readable the same way.
fn check_parts(parts: &[Part]) -> Result<(), MergeError> {
    let first = &parts[0];
    let (a, pa) = (first.ds.manifest(), &first.partition);
    for p in &parts[1..] {
        let (b, pb) = (p.ds.manifest(), &p.partition);
        let differ = |what, x: String, y: String| {
            Err(MergeError::from(Box::new(crate::run::Incompatible {
                verb: "merge",
                first: first.dir.clone(),
                other: p.dir.clone(),
                what,
                a: x,
                b: y,
            })))
        };
        if pa.stage != pb.stage {
            return differ("stages", pa.stage.clone(), pb.stage.clone());
        }
        if pa.parts != pb.parts {
            return differ("part counts", pa.parts.to_string(), pb.parts.to_string());
        }
        if pa.job != pb.job {
            return differ(
                "runs (job fingerprints: other inputs or options)",
                pa.job.clone(),
                pb.job.clone(),
            );
        }
        if let Some((what, x, y)) = a.reading_difference(b) {
            return differ(what, x, y);
        }
    }
    // Parts are sorted by number: a repeat sits next to its twin.
    if let Some(w) = parts
        .windows(2)
        .find(|w| w[0].partition.part == w[1].partition.part)
    {
        return Err(MergeError::Parts(format!(
            "part {} of the {} run is given twice: {} and {}",
            w[0].partition.part,
            pa.stage,
            w[0].dir.display(),
            w[1].dir.display()
        )));
    }
    let n = pa.parts;
    if let Some(p) = parts.iter().find(|p| p.partition.part >= n) {
        return Err(MergeError::Parts(format!(
            "{}: part {} of a run of {n} parts does not exist",
            p.dir.display(),
            p.partition.part
        )));
    }
    if parts.len() as u64 != n {
        let mut given = parts.iter().map(|p| p.partition.part).peekable();
        let missing: Vec<String> = (0..n)
            .filter(|&i| given.next_if_eq(&i).is_none())
            .take(20)
            .map(|i| i.to_string())
            .collect();
        let more = n - parts.len() as u64 > missing.len() as u64;
        return Err(MergeError::Parts(format!(
            "the {} run has {n} parts and {} were given; missing part{} {}{}",
            pa.stage,
            parts.len(),
            if missing.len() == 1 { "" } else { "s" },
            missing.join(", "),
            if more { ", ..." } else { "" }
        )));
    }
    Ok(())
}

/// `dir` relative to `out` when it lies inside it, with `/` separators
/// (for object-storage addresses, when `dir`'s address continues `out`'s).
fn relative_to(out: &Path, dir: &Path) -> Option<String> {
    let url = |p: &Path| {
        p.to_str()
            .filter(|s| crate::store::is_url(s))
            .map(str::to_owned)
    };
    if let (Some(out), Some(dir)) = (url(out), url(dir)) {
        let rel = dir
            .trim_end_matches('/')
            .strip_prefix(&format!("{}/", out.trim_end_matches('/')))?;
        let plain = rel
            .split('/')
            .all(|c| !c.is_empty() && c != "." && c != "..");
        return plain.then(|| rel.to_owned());
    }
    let out = std::fs::canonicalize(out).ok()?;
    let dir = std::fs::canonicalize(dir).ok()?;
    let rel = dir.strip_prefix(&out).ok()?;
    let parts: Vec<String> = rel
        .components()
        .map(|c| c.as_os_str().to_str().map(str::to_owned))
        .collect::<Option<_>>()?;
    (!parts.is_empty()).then(|| parts.join("/"))
}

/// Hard-links (or with `copy`, copies) `from` to `to`, replacing `to`.
fn place_file(from: &Path, to: &Path, copy: bool) -> Result<(), MergeError> {
    let tmp = to.with_extension(format!(
        "{}.tmp",
        to.extension().and_then(|e| e.to_str()).unwrap_or("")
    ));
    let _ = std::fs::remove_file(&tmp);
    if copy {
        std::fs::copy(from, &tmp).map_err(io(&tmp))?;
        std::fs::File::open(&tmp)
            .and_then(|f| f.sync_all())
            .map_err(io(&tmp))?;
    } else {
        std::fs::hard_link(from, &tmp).map_err(|source| MergeError::Link {
            from: from.into(),
            to: to.into(),
            source,
        })?;
    }
    std::fs::rename(&tmp, to).map_err(io(to))
}

/// A deduplicating part's record hashes, checked against its manifest.
fn read_hashes(part: &Part) -> Result<Vec<u128>, MergeError> {
    let info = part.partition.hashes.as_ref().ok_or_else(|| MergeError::Hashes {
        path: part.dir.join(MANIFEST_FILE),
        why: "a --dedup part without record hashes (partition.hashes); make the part again with this prep".into(),
    })?;
    let path = part.ds.dir().join(&info.file);
    if !crate::format::is_safe_relative(&info.file) {
        return Err(MergeError::Hashes {
            path,
            why: "the hashes file name is not a plain relative path".into(),
        });
    }
    let bytes = std::fs::read(&path).map_err(io(&path))?;
    let want = part.ds.len().checked_mul(16);
    if want != Some(bytes.len() as u64) || info.bytes != bytes.len() as u64 {
        return Err(MergeError::Hashes {
            path,
            why: format!(
                "{} bytes, but {} records need {} (16 each) and the manifest says {}",
                bytes.len(),
                part.ds.len(),
                part.ds.len() * 16,
                info.bytes
            ),
        });
    }
    if checksum_hex(xxh3_64(&bytes)) != info.xxh3 {
        return Err(MergeError::Hashes {
            path,
            why: "checksum differs from the manifest's: the file is damaged".into(),
        });
    }
    Ok(bytes
        .chunks_exact(16)
        .map(|c| u128::from_le_bytes(c.try_into().expect("16 bytes")))
        .collect())
}

fn add_counts(sum: &mut DocumentCounts, c: &DocumentCounts) {
    sum.read += c.read;
    sum.written += c.written;
    sum.skipped += c.skipped;
    sum.deduplicated += c.deduplicated;
    sum.empty += c.empty;
}

/// Two parts' chat counts added.
fn add_chat(a: ChatCounts, b: ChatCounts) -> ChatCounts {
    ChatCounts {
        trainable_tokens: a.trainable_tokens + b.trainable_tokens,
        no_trainable_token: a.no_trainable_token + b.no_trainable_token,
        malformed: a.malformed + b.malformed,
        refused: a.refused + b.refused,
        unverifiable: a.unverifiable + b.unverifiable,
        too_long: a.too_long + b.too_long,
        placed_by_hf: a.placed_by_hf + b.placed_by_hf,
        truncated: a.truncated + b.truncated,
    }
}

/// Two parts' packing counts added (mode, seed, window and separator are equal).
fn add_packing(a: Packing, b: Packing) -> Packing {
    Packing {
        rows: a.rows + b.rows,
        pad_tokens: a.pad_tokens + b.pad_tokens,
        documents: a.documents + b.documents,
        documents_cut: a.documents_cut + b.documents_cut,
        pieces: a.pieces + b.pieces,
        tokens_dropped: a.tokens_dropped + b.tokens_dropped,
        ..a
    }
}
