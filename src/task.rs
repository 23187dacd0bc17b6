//! Tasks of a partitioned job that write into a shared work directory
//! rather than a dataset (the shuffle's scatter parts, dedup's signature
//! and bucket parts): the rules they share, written once.
//!
//! Task `I` of `N` writes the folder `WORK/PREFIX-IIIII` (`I` zero-padded
//! to 5 digits): its data files, then last and atomically its description
//! (a small JSON file, [`Described::FILE`]), which names the job, the
//! part and the data files' sizes. A folder without a description is
//! unfinished.
//!
//! - **Retries.** Every task is a function of its inputs and options: run
//!   again, it writes the same bytes. A task whose folder holds its own
//!   finished description with whole data files does nothing
//!   ([`finished_task`]); one interrupted (its journal names the same
//!   task) or damaged is done again from the start ([`start_afresh`]),
//!   which costs one task's work; a folder of another job is refused
//!   unless `overwrite`, and then only prep's own files are removed.
//! - **Reading the parts.** The next stage takes every part of one job,
//!   `0..N` and nothing else, each finished ([`read_parts`]): a missing or
//!   unfinished part, a part numbered past `N` and a part of another job
//!   are each refused by name.

use std::path::{Path, PathBuf};

use serde::de::DeserializeOwned;
use serde::Serialize;

use crate::format::{Files, ReadError};
use crate::output::{Output, OutputError, Start};
use crate::partition::Part;

/// The description of one finished task: what the next stage reads to
/// find it and to check that it belongs with the others.
pub trait Described: Serialize + DeserializeOwned {
    /// The folder's name before the part number: `scatter` gives
    /// `scatter-00003`.
    const PREFIX: &'static str;
    /// The description's file name inside the folder.
    const FILE: &'static str;
    /// Its `format` field.
    const FORMAT: &'static str;
    /// The version this build writes and the newest it reads.
    const VERSION: u64;
    /// A larger description is refused before parsing.
    const MAX_BYTES: u64;
    /// The task in messages: `scatter part`.
    const WHAT: &'static str;
    /// The command line that runs one, before `--part I/N`.
    const RUN: &'static str;
    /// What the next stage does with the parts: `gather`.
    const NEXT: &'static str;

    /// The job's fingerprint: equal in every part of one run.
    fn job(&self) -> &str;
    /// This part's number.
    fn part(&self) -> u64;
    /// Parts in the job.
    fn parts(&self) -> u64;
    /// What is wrong with the description on its own, if anything.
    fn inconsistency(&self) -> Option<String>;
    /// True when the folder `dir`'s data files have the sizes described.
    fn intact(&self, dir: &Path) -> bool;
    /// How a part of another job differs from `first`, in words.
    fn differs(&self, first: &Self) -> String;
}

/// Every way reading or starting a task's folder can fail.
#[derive(Debug, thiserror::Error)]
pub enum TaskError {
    /// A description cannot be read, is not one, or contradicts itself.
    #[error("{}: {why}", path.display())]
    Bad {
        /// The file or folder.
        path: PathBuf,
        /// What is wrong.
        why: String,
    },
    /// Parts of the job have not finished: their description is missing.
    #[error("{}: {} of the {parts} {what}s have not finished (parts {}); run them ({run} --part I/{parts}) before {next}", path.display(), missing.len(), list(missing))]
    MissingParts {
        /// The first missing part's description.
        path: PathBuf,
        /// The numbers of the missing parts.
        missing: Vec<u64>,
        /// Parts in the job.
        parts: u64,
        /// [`Described::WHAT`].
        what: &'static str,
        /// [`Described::RUN`].
        run: &'static str,
        /// [`Described::NEXT`], as "before gathering" says it.
        next: String,
    },
    /// A part of another job than the others in the same work directory.
    #[error("{} is of another run than {}: {why}; remove it, or {next} from a directory that holds one run", path.display(), first.display())]
    OtherRun {
        /// Its description (or its folder, unfinished).
        path: PathBuf,
        /// The first part's description.
        first: PathBuf,
        /// What differs.
        why: String,
        /// [`Described::NEXT`].
        next: &'static str,
    },
    /// The folder could not be read.
    #[error(transparent)]
    Read(#[from] ReadError),
    /// The work directory's object store could not be reached.
    #[error(transparent)]
    Store(#[from] crate::store::StoreError),
    /// The folder was refused or is held by another run.
    #[error(transparent)]
    Output(#[from] OutputError),
}

/// `1, 2, 5`; long lists cut after ten numbers.
pub fn list(numbers: &[u64]) -> String {
    let mut shown: Vec<String> = numbers.iter().take(10).map(u64::to_string).collect();
    if numbers.len() > 10 {
        shown.push(format!("and {} more", numbers.len() - 10));
    }
    shown.join(", ")
}

/// The folder task `part` of kind `D` writes inside the work directory.
pub fn part_dir<D: Described>(work: &Path, part: u64) -> PathBuf {
    work.join(format!("{}-{part:05}", D::PREFIX))
}

/// The finished description in `dir`, if there is one: checked for its
/// format, version and consistency.
pub fn finished_part<D: Described>(dir: &Path) -> Result<Option<D>, TaskError> {
    let source = Files::new(dir)?;
    let path = source.path_of(D::FILE);
    let bad = |why: String| TaskError::Bad {
        path: path.clone(),
        why,
    };
    let Some(file) = source.open(D::FILE)? else {
        return Ok(None);
    };
    if file.len() > D::MAX_BYTES {
        return Err(bad(format!(
            "{} bytes, more than any {} needs",
            file.len(),
            D::FILE
        )));
    }
    let bytes = file.read(0..file.len())?;
    let value: serde_json::Value =
        serde_json::from_slice(&bytes).map_err(|e| bad(e.to_string()))?;
    if value.get("format").and_then(|f| f.as_str()) != Some(D::FORMAT) {
        return Err(bad(format!("`format` is not {:?}", D::FORMAT)));
    }
    match value.get("version").and_then(|v| v.as_u64()) {
        Some(v) if v > D::VERSION => {
            return Err(bad(format!(
                "version {v} was written by a newer prep (this one reads up to {}); \
                 {} with that prep, or run the {}s again with this one",
                D::VERSION,
                D::NEXT,
                D::WHAT
            )))
        }
        Some(v) if v >= 1 => {}
        _ => return Err(bad("`version` is not a positive integer".into())),
    }
    let info: D = serde_json::from_value(value).map_err(|e| bad(e.to_string()))?;
    if let Some(why) = info.inconsistency() {
        return Err(bad(why));
    }
    Ok(Some(info))
}

/// The part already finished in `dir` when it is this very task's and its
/// data files are whole; refuses a part of another job.
pub fn finished_task<D: Described>(
    dir: &Path,
    job: &str,
    part: Part,
) -> Result<Option<D>, TaskError> {
    let Some(done) = finished_part::<D>(dir)? else {
        return Ok(None);
    };
    if done.job() == job && done.part() == part.index && done.intact(dir) {
        return Ok(Some(done));
    }
    if done.job() != job || done.part() != part.index {
        return Err(TaskError::Output(OutputError::Refused {
            dir: dir.to_path_buf(),
            why: format!(
                "holds a {} of another run (other inputs, options or parts; \
                 pass --overwrite to replace it)",
                D::WHAT
            ),
        }));
    }
    // This very task, but its data is damaged: done again.
    Ok(None)
}

/// Starts the task's journal from nothing (a task interrupted or damaged
/// is done again in full); refuses a folder that holds a dataset.
pub fn start_afresh<D: Described>(
    output: &mut Output,
    task: &str,
    overwrite: bool,
    dir: &Path,
) -> Result<(), OutputError> {
    match output.start::<(), ()>(task, overwrite)? {
        Start::Complete(_) => Err(OutputError::Refused {
            dir: dir.to_path_buf(),
            why: format!(
                "holds a dataset, not a {} (pass --overwrite to replace it)",
                D::WHAT
            ),
        }),
        Start::Fresh(_) | Start::Resume(_) => {
            output.restart::<(), ()>(task)?;
            Ok(())
        }
    }
}

/// Every part of the job in `work`, in part order, checked to be finished
/// and of one job: parts `0..N` and nothing else.
pub fn read_parts<D: Described>(work: &Path) -> Result<Vec<(PathBuf, D)>, TaskError> {
    let mut parts: Vec<(PathBuf, D)> = Vec::new();
    let mut unfinished = Vec::new();
    for (i, dir) in part_dirs::<D>(work)? {
        match finished_part::<D>(&dir)? {
            Some(info) => {
                if info.part() != i {
                    return Err(TaskError::Bad {
                        path: dir.join(D::FILE),
                        why: format!("describes part {}, not part {i}", info.part()),
                    });
                }
                parts.push((dir, info));
            }
            None => unfinished.push((i, dir)),
        }
    }
    let Some((first_dir, first)) = parts.first() else {
        return Err(none_finished::<D>(work, &unfinished));
    };
    let first_file = first_dir.join(D::FILE);
    for (dir, info) in &parts[1..] {
        if info.job() != first.job() {
            return Err(TaskError::OtherRun {
                path: dir.join(D::FILE),
                first: first_file.clone(),
                why: info.differs(first),
                next: D::NEXT,
            });
        }
    }
    check_part_numbers(work, &parts, &unfinished, first_file)?;
    Ok(parts)
}

/// The names of the work directory's folders: its entries on disk, or the
/// first names of the objects under its prefix in object storage.
fn work_folders(work: &Path) -> Result<Vec<String>, TaskError> {
    let io = |e| TaskError::Read(crate::format::FormatError::io(work, e).into());
    let source = Files::new(work)?;
    let mut folders: Vec<String> = Vec::new();
    if source.is_remote() {
        for file in source.files()? {
            if let Some((folder, _)) = file.split_once('/') {
                folders.push(folder.to_owned());
            }
        }
        folders.dedup();
    } else {
        for entry in std::fs::read_dir(work).map_err(io)? {
            let entry = entry.map_err(io)?;
            if entry.path().is_dir() {
                folders.push(entry.file_name().to_string_lossy().into_owned());
            }
        }
    }
    Ok(folders)
}

/// The part folders of kind `D` in the work directory with their part
/// numbers, in part order.
fn part_dirs<D: Described>(work: &Path) -> Result<Vec<(u64, PathBuf)>, TaskError> {
    let mut found: Vec<(u64, PathBuf)> = Vec::new();
    for name in work_folders(work)? {
        // Only what a task names so (PREFIX-IIIII, a directory); anything
        // else in the work directory is not ours to judge.
        let part = name
            .strip_prefix(D::PREFIX)
            .and_then(|n| n.strip_prefix('-'))
            .filter(|n| n.bytes().all(|b| b.is_ascii_digit()))
            .and_then(|n| n.parse::<u64>().ok());
        if let Some(i) = part {
            if part_dir::<D>(work, i) == work.join(&name) {
                found.push((i, work.join(&name)));
            }
        }
    }
    found.sort();
    Ok(found)
}

/// The error when no part has finished, naming the unfinished ones.
fn none_finished<D: Described>(work: &Path, unfinished: &[(u64, PathBuf)]) -> TaskError {
    TaskError::Bad {
        path: unfinished
            .first()
            .map_or(work.into(), |(_, dir)| dir.join(D::FILE)),
        why: format!(
            "no {} has finished{}; run them first ({} --part I/N)",
            D::WHAT,
            if unfinished.is_empty() {
                String::new()
            } else {
                format!(
                    " (unfinished: {})",
                    list(&unfinished.iter().map(|(i, _)| *i).collect::<Vec<_>>())
                )
            },
            D::RUN
        ),
    }
}

/// Refuses a part numbered past the job's parts, finished or not, and a job
/// whose parts `0..N` have not all finished.
fn check_part_numbers<D: Described>(
    work: &Path,
    parts: &[(PathBuf, D)],
    unfinished: &[(u64, PathBuf)],
    first_file: PathBuf,
) -> Result<(), TaskError> {
    let n = parts[0].1.parts();
    if let Some((i, dir)) = parts
        .iter()
        .map(|(d, info)| (info.part(), d))
        .chain(unfinished.iter().map(|(i, d)| (*i, d)))
        .find(|&(i, _)| i >= n)
    {
        return Err(TaskError::OtherRun {
            path: dir.clone(),
            first: first_file,
            why: format!("part {i}, but the run has {n} parts (0 to {})", n - 1),
            next: D::NEXT,
        });
    }
    let have: std::collections::HashSet<u64> = parts.iter().map(|(_, i)| i.part()).collect();
    let missing: Vec<u64> = (0..n).filter(|i| !have.contains(i)).collect();
    if let Some(&i) = missing.first() {
        return Err(TaskError::MissingParts {
            path: part_dir::<D>(work, i).join(D::FILE),
            missing,
            parts: n,
            what: D::WHAT,
            run: D::RUN,
            next: gerund(D::NEXT),
        });
    }
    Ok(())
}

/// "gather" as "gathering": how [`TaskError::MissingParts`] says what waits.
fn gerund(verb: &str) -> String {
    match verb.strip_suffix('e') {
        Some(stem) => format!("{stem}ing"),
        None => format!("{verb}ing"),
    }
}
