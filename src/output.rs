//! The one owner of an output directory's lifecycle.
//!
//! Every command that writes a dataset (tokenize, shuffle and its scatter and
//! gather tasks, pack, merge, import, the tokenize-then-shuffle pipeline) goes
//! through an [`Output`], so that the rules below hold everywhere and are
//! written once:
//!
//! 1. **One writer.** [`Output::lock`] takes an exclusive advisory lock on
//!    `DIR/.prep-lock` for the whole run (an OS lock: a killed run never
//!    leaves a stale one). A second run into the same directory is refused at
//!    once with the holder's pid.
//! 2. **Refusal.** [`Output::start`] refuses a directory that holds another
//!    run's dataset or journal, or any file prep did not write, unless
//!    `--overwrite`; and, `--overwrite` or not, one where a file prep did
//!    not write has a name the run writes (a foreign `manifest.json`, a
//!    `shard-00007.bin` no record of prep's lists), naming that file.
//! 3. **Overwrite removes only prep's files**: those the records prep keeps
//!    in the directory say are its own (the files its manifest lists; while
//!    a journal is there, the files under the names prep gives a run's,
//!    [`is_prep_file`]), its journal and lock, and its private working
//!    folders; never an input, a foreign file or a folder the caller keeps,
//!    whatever its name.
//! 4. **Resume.** A run under way keeps a journal ([`JOURNAL_FILE`]) with an
//!    entry per completed shard, saved as soon as the shard is in place: a
//!    line appended per shard (JSON Lines: the run's fingerprint and state
//!    first, then one line per shard, each line with its checksum; the
//!    journal ends at the first line that fails it, torn by a crash or
//!    edited since), so a run of many shards writes its journal once, not
//!    once per shard. A run with the same fingerprint (which covers each
//!    input's version: [`crate::run::job_fingerprint`]) keeps the longest
//!    prefix of journaled shards that are still intact ([`shard_intact`])
//!    and removes the rest.
//! 5. **Commit last.** [`Output::commit`] writes the manifest atomically and
//!    only then removes the journal and the lock: a reader sees the old state
//!    or the whole new dataset.
//! 6. **Nothing half-written.** An [`Output`] dropped without a commit (an
//!    error on any path) removes its temporary files, and, when nothing worth
//!    resuming was written into a directory it created, the directory too.
//!
//! The primitives the rules need of the storage (read, put, remove and list
//! small files, tell which journaled shards are intact, make a staged file
//! part of the dataset, let go) are the [`storage`] trait's: on disk, the
//! directory itself and its OS lock; in object storage (`s3://bucket/prefix`
//! and the other addresses of [`crate::store`]), [`remote`]'s store, on the
//! store's own primitives (a leased lock taken by conditional writes, each
//! shard uploaded whole once journaled, the manifest last). Every rule above
//! holds for both; the stage writes into a local directory (for a store, a
//! staging folder) and never knows the difference.

mod remote;
mod storage;

pub use remote::{input_copy_for, staging_for, LEASE_VAR, STAGING_VAR};
pub use storage::shard_intact;

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

use crate::format::{Files, ReadError};
use crate::format::{FormatError, Manifest, ShardInfo, MANIFEST_FILE, TMP_SUFFIX};
use crate::store::StoreError;
use remote::Store;
use storage::{local_entries, remove_file, Disk, Storage};

/// The journal's file name inside an output directory.
pub const JOURNAL_FILE: &str = ".prep-journal.json";
/// The lock's file name inside an output directory (present while a run holds it).
pub const LOCK_FILE: &str = ".prep-lock";
/// The tokenizer's copy inside a dataset.
pub const TOKENIZER_FILE: &str = "tokenizer.json";
/// A partitioned tokenize part's record hashes, for `prep merge --dedup`.
pub const HASHES_FILE: &str = "hashes.bin";
/// A report a stage writes beside the shards (`prep dedup`'s removed
/// documents), listed in the manifest's `provenance.report`.
pub const REPORT_FILE: &str = "duplicates.jsonl";
/// The extensions of the files of a shard prep writes.
pub const SHARD_EXTENSIONS: [&str; 5] = [".bin", ".idx", ".seg", ".sum", ".mask"];
/// prep's private working folders inside an output directory: the
/// shuffle's bucket files, the tokenize-then-shuffle pipeline's stage and
/// the dedup's sorted runs.
pub const WORK_FOLDERS: [&str; 3] = [".shuffle-tmp", ".tokenized", ".dedup-tmp"];

/// The names prep gives the files of a run in an output directory: a
/// shard's files as prep numbers them (`shard-` and five or more digits,
/// then one of [`SHARD_EXTENSIONS`]), the manifest, the journal (and in
/// object storage the objects its lines are appended in), the lock, the
/// tokenizer copy, a part's `hashes.bin` and a report, and each of these names with
/// [`TMP_SUFFIX`] (the file being written under it).
///
/// A name alone never makes a file prep's: only the journal, the lock and
/// its parts are prep's by name; the others are prep's where a record of
/// prep's in the directory says so (see [`Output::start`]). These are
/// also the names a run would replace, so a file of someone else's under
/// one of them is in the run's way.
pub fn is_prep_file(name: &str) -> bool {
    let named = |n: &str| {
        is_shard_name(n)
            || remote::journal_part(n).is_some()
            || [
                MANIFEST_FILE,
                JOURNAL_FILE,
                LOCK_FILE,
                TOKENIZER_FILE,
                HASHES_FILE,
                REPORT_FILE,
            ]
            .contains(&n)
    };
    named(name) || name.strip_suffix(TMP_SUFFIX).is_some_and(named)
}

/// True for the name of a shard's file as prep numbers shards
/// (`shard-00042.bin`), not for any name that starts with `shard-`.
pub fn is_shard_name(name: &str) -> bool {
    let Some(rest) = name.strip_prefix("shard-") else {
        return false;
    };
    SHARD_EXTENSIONS.iter().any(|ext| {
        rest.strip_suffix(ext)
            .is_some_and(|n| n.len() >= 5 && n.bytes().all(|b| b.is_ascii_digit()))
    })
}

/// True for the names prep's own records (the journal, the lock) have,
/// which are prep's wherever they are found.
fn is_record_name(name: &str) -> bool {
    let named = |n: &str| n == JOURNAL_FILE || n == LOCK_FILE || remote::journal_part(n).is_some();
    named(name) || name.strip_suffix(TMP_SUFFIX).is_some_and(named)
}

/// Every way an output directory can be refused.
#[derive(Debug, thiserror::Error)]
pub enum OutputError {
    /// The directory holds something this run must not replace.
    #[error("output directory {}: {why}", dir.display())]
    Refused {
        /// The directory.
        dir: PathBuf,
        /// Why, and what to do.
        why: String,
    },
    /// Another run holds the directory's lock.
    #[error(
        "output directory {}: another prep run ({holder}) is writing to it; wait for it to end or stop it",
        dir.display()
    )]
    Locked {
        /// The directory.
        dir: PathBuf,
        /// The holder as its lock file names it, e.g. `pid 4242`.
        holder: String,
    },
    /// Reading or writing the directory failed.
    #[error(transparent)]
    Format(#[from] FormatError),
    /// A request to the object store that holds the output failed.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// A file the output copies (a tokenizer) could not be read.
    #[error(transparent)]
    Read(#[from] ReadError),
}

/// A completed shard in a journal, and where the run stood after it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Done<C> {
    /// The shard as the manifest will list it.
    pub shard: ShardInfo,
    /// The stage's own checkpoint (where to go on reading), `()` when the
    /// shard's position says it all.
    pub at: C,
}

/// The journal of a run under way: its fingerprint, the stage's own state
/// (`S`, e.g. the shuffle's bucket files) and the shards completed so far,
/// each with the stage's checkpoint (`C`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Journal<S, C> {
    /// The run's fingerprint: equal fingerprints write equal bytes.
    pub fingerprint: String,
    /// The stage's own state.
    pub state: S,
    /// Completed shards, in order.
    pub shards: Vec<Done<C>>,
}

impl<S: Default, C> Journal<S, C> {
    /// A run just started: nothing done.
    pub fn new(fingerprint: &str) -> Journal<S, C> {
        Journal {
            fingerprint: fingerprint.into(),
            state: S::default(),
            shards: Vec::new(),
        }
    }
}

impl<S, C> Journal<S, C> {
    /// The completed shards' entries, in order.
    pub fn shard_infos(&self) -> Vec<ShardInfo> {
        self.shards.iter().map(|d| d.shard.clone()).collect()
    }
}

/// The first line of a journal file: the run, without its shards.
#[derive(Serialize, Deserialize)]
struct JournalHead<F, S> {
    fingerprint: F,
    state: S,
}

impl<S: Serialize, C: Serialize> Journal<S, C> {
    /// The journal as its file holds it: the head line, then a line per
    /// completed shard, each with its checksum ([`checked_line`]).
    pub fn to_lines(&self) -> Vec<u8> {
        let mut text = checked_line(&JournalHead {
            fingerprint: self.fingerprint.as_str(),
            state: &self.state,
        });
        for done in &self.shards {
            text.extend(shard_line(done));
        }
        text
    }
}

/// A completed shard's line of the journal file.
fn shard_line<C: Serialize>(done: &Done<C>) -> Vec<u8> {
    checked_line(done)
}

/// The key of a journal line's checksum: the line's first member.
const LINE_SUM: &str = "{\"xxh3\":\"";

/// A line of the journal file: `value`'s JSON object with the XXH3-64 of
/// that JSON (as serialized, without this member) put first as `"xxh3"`,
/// then a newline. The line is still one JSON object, and a change to any
/// byte of it is seen.
fn checked_line<T: Serialize>(value: &T) -> Vec<u8> {
    let json = serde_json::to_vec(value).expect("a journal always serializes");
    let sum = crate::format::checksum_hex(xxhash_rust::xxh3::xxh3_64(&json));
    let rest = &json[1..]; // after the object's `{`
    let mut line = format!("{LINE_SUM}{sum}\"").into_bytes();
    if rest != b"}" {
        line.push(b',');
    }
    line.extend_from_slice(rest);
    line.push(b'\n');
    line
}

/// The JSON a journal line carries, when its checksum holds ([`checked_line`]).
fn verified_line(line: &[u8]) -> Option<Vec<u8>> {
    let rest = line.strip_prefix(LINE_SUM.as_bytes())?;
    let (hex, rest) = (rest.get(..16)?, rest.get(16..)?);
    let rest = rest.strip_prefix(b"\"")?;
    let rest = rest.strip_prefix(b",").unwrap_or(rest);
    let mut json = Vec::with_capacity(rest.len() + 1);
    json.push(b'{');
    json.extend_from_slice(rest);
    let sum = crate::format::checksum_hex(xxhash_rust::xxh3::xxh3_64(&json));
    (sum.as_bytes() == hex).then_some(json)
}

impl<S: DeserializeOwned, C: DeserializeOwned> Journal<S, C> {
    /// Reads a journal file: JSON Lines, a head, then a line per shard,
    /// each with its checksum ([`checked_line`]). The journal ends at the
    /// first shard line whose checksum or content does not hold (a line
    /// cut short by a crash mid-append, or one edited since): that shard
    /// and those after it count as not journaled, and a resume makes them
    /// again. `None` when the head does not hold, which is also what a
    /// journal of a prep from before these checksums reads as.
    pub fn parse(bytes: &[u8]) -> Option<Journal<S, C>> {
        let mut lines = bytes.split(|&b| b == b'\n');
        let head: JournalHead<String, S> =
            serde_json::from_slice(&verified_line(lines.next()?)?).ok()?;
        let shards = lines
            .map_while(|line| serde_json::from_slice::<Done<C>>(&verified_line(line)?).ok())
            .collect();
        Some(Journal {
            fingerprint: head.fingerprint,
            state: head.state,
            shards,
        })
    }
}

/// What the journal file holds, as this run last wrote it.
struct Journaled {
    /// The run's fingerprint in its head.
    fingerprint: String,
    /// Shards it lists.
    shards: usize,
    /// The state in its head, serialized.
    state: Vec<u8>,
    /// Its whole content (for a store, which has no append).
    text: Vec<u8>,
}

/// What a run finds in its (locked) output directory.
pub enum Start<S, C> {
    /// Nothing to keep: write from the beginning (the journal is saved).
    Fresh(Journal<S, C>),
    /// An interrupted run with the same fingerprint: its intact shards, in
    /// order (files past them are removed).
    Resume(Journal<S, C>),
    /// The finished dataset of this very run: nothing to do.
    Complete(Box<Manifest>),
}

/// An output directory held by this run. See the [module docs](self).
pub struct Output {
    /// The directory the stage writes into: the output itself, or the
    /// staging folder of one in object storage.
    dir: PathBuf,
    /// Where the dataset is kept; `None` once let go.
    storage: Option<Box<dyn Storage>>,
    /// Folders inside the directory that belong to the caller: never
    /// removed, never counted as foreign (the parts of a merge, the
    /// pipeline's stage).
    keep: Vec<String>,
    /// File names a stage writes besides [`is_prep_file`]'s (a scatter
    /// part's data and index).
    own: &'static [&'static str],
    /// The outermost folder of the path that this run made, if any.
    created: Option<PathBuf>,
    /// [`Output::start`] gave this run the directory's contents (a fresh
    /// start or a resume): only then may a failed run tidy them.
    owned: bool,
    /// A shard is journaled or in place: a failed run leaves it for a resume.
    progressed: bool,
    /// The journal file as this run last wrote it, to append to.
    journaled: Option<Journaled>,
    /// What prep's records in the directory say is prep's.
    records: Records,
}

/// What the records prep keeps in an output directory say is prep's, the
/// one source of "this file is prep's" (a name alone never is): the
/// files a manifest of prep's lists, the manifest itself among them; and,
/// while a journal is there (or a stage's own file that only prep writes,
/// such as a scatter part's), every file under a name prep gives a run's
/// files ([`is_prep_file`]). A run's journal is saved before it writes
/// anything else, in a directory where no such name was anyone else's,
/// so what appears under those names while it is there is the run's.
#[derive(Debug, Default)]
struct Records {
    /// Files a manifest of prep's lists.
    listed: HashSet<String>,
    /// A journal (or a stage's own file) is there.
    run: bool,
}

impl Output {
    /// Creates `dir` if needed and takes its lock. A `dir` that is an
    /// object-storage address ([`crate::store::is_url`]) takes the store's
    /// lock, and the stage writes into the local staging folder
    /// [`staging_for`] gives, which [`Output::dir`] returns; with
    /// `single_writer` (the user's word that this run is the output's only
    /// writer) a store whose conditional writes fail the check is written
    /// to all the same, and the manifest says so.
    pub fn lock(dir: &Path, single_writer: bool) -> Result<Output, OutputError> {
        let url = dir.to_str().filter(|d| crate::store::is_url(d));
        let local = url.map_or_else(|| dir.to_path_buf(), staging_for);
        let (disk, created) = claim(&local)?;
        let storage: Box<dyn Storage> = match url {
            None => Box::new(disk),
            Some(url) => match Store::acquire(url, disk, single_writer) {
                Ok(store) => Box::new(store),
                Err(e) => {
                    remove_created(&local, created.as_deref());
                    return Err(e);
                }
            },
        };
        Ok(Output {
            dir: local,
            storage: Some(storage),
            keep: Vec::new(),
            own: &[],
            created,
            owned: false,
            progressed: false,
            journaled: None,
            records: Records::default(),
        })
    }

    /// Keeps the folder `name` inside the directory: never removed, never
    /// foreign.
    pub fn keeping(mut self, name: impl Into<String>) -> Output {
        self.keep.push(name.into());
        self
    }

    /// Also counts these file names as this stage's own.
    pub fn owning(mut self, names: &'static [&'static str]) -> Output {
        self.own = names;
        self
    }

    /// The directory the stage writes into (for an output in object
    /// storage, its local staging folder).
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The output as the user named it, for messages: the directory, or the
    /// object-storage address.
    pub fn shown(&self) -> PathBuf {
        self.storage().shown()
    }

    fn storage(&self) -> &dyn Storage {
        self.storage.as_deref().expect("held until commit or drop")
    }

    /// Decides what the run does with the directory, by the rules of the
    /// [module docs](self): a finished dataset of this run (`Complete`), an
    /// interrupted one (`Resume`, trimmed to its intact shards), or a fresh
    /// start (`Fresh`, with `overwrite` after removing prep's files).
    /// `identity` is the run's fingerprint as [`Manifest::identity`] gives it
    /// for the dataset this run writes.
    pub fn start<S, C>(
        &mut self,
        identity: &str,
        overwrite: bool,
    ) -> Result<Start<S, C>, OutputError>
    where
        S: Default + Serialize + DeserializeOwned,
        C: Serialize + DeserializeOwned,
    {
        let manifest_bytes = self.storage().read(MANIFEST_FILE)?;
        let journal_bytes = self.storage().read(JOURNAL_FILE)?;
        // A manifest that prep cannot read as one of its own is not prep's:
        // never taken for a dataset, never removed, never replaced.
        let manifest = manifest_bytes
            .as_deref()
            .and_then(|b| Manifest::parse(&self.shown().join(MANIFEST_FILE), b).ok());
        let mut entries = self.storage().entries()?;
        entries.sort();
        self.records = Records {
            listed: manifest.as_ref().map_or_else(HashSet::new, listed_files),
            run: journal_bytes.is_some()
                || entries
                    .iter()
                    .any(|(name, is_dir)| !is_dir && self.own.contains(&name.as_str())),
        };
        let foreign: Vec<String> = entries
            .into_iter()
            .filter(|(name, is_dir)| !(self.is_ours(name, *is_dir) || self.keep.contains(name)))
            .map(|(name, _)| name)
            .collect();
        // A file of someone else's under a name this run writes: neither
        // removed nor replaced, even with --overwrite.
        let in_the_way = foreign.iter().find(|n| self.in_the_way(n)).map(|name| {
            refused(
                &self.shown(),
                &format!(
                    "holds {name:?}, which prep did not write and which this run would replace \
                     (move it away or choose another directory; --overwrite removes only the \
                     files prep wrote)"
                ),
            )
        });
        if overwrite {
            if let Some(refusal) = in_the_way {
                return Err(refusal);
            }
            self.remove_ours(|_| true)?;
            return self.fresh(identity);
        }
        if let Some(manifest) = manifest {
            return self.complete_found(identity, manifest);
        }
        if let Some(refusal) = in_the_way {
            return Err(refusal);
        }
        if let Some(bytes) = journal_bytes {
            return match Journal::<S, C>::parse(&bytes) {
                Some(journal) if journal.fingerprint == identity => self.resume(journal),
                Some(_) => Err(refused(
                    &self.shown(),
                    "holds an interrupted run with other inputs or options (pass --overwrite to start over)",
                )),
                None => Err(refused(
                    &self.shown(),
                    &format!(
                        "holds an interrupted run whose journal ({JOURNAL_FILE}) prep cannot read: \
                         damaged, or written by another version of prep (pass --overwrite to start over)"
                    ),
                )),
            };
        }
        if let Some(name) = foreign.first() {
            return Err(refused(
                &self.shown(),
                &format!(
                    "is not empty: it holds {name:?}, which prep did not write (choose an empty or new \
                     directory, or pass --overwrite to replace prep's files in it)"
                ),
            ));
        }
        // Only prep's leftovers (its lock, a journal's temporary): tidy them.
        self.remove_ours(|_| true)?;
        self.fresh(identity)
    }

    /// The output holds a manifest of prep's: this run's dataset, finished,
    /// with every shard file in place, or a refusal.
    fn complete_found<S, C>(
        &mut self,
        identity: &str,
        manifest: Manifest,
    ) -> Result<Start<S, C>, OutputError> {
        let shown = self.shown();
        if manifest.identity() != identity {
            return Err(refused(
                &shown,
                "holds a dataset made from other inputs or options (pass --overwrite to replace it)",
            ));
        }
        let files: Vec<(&str, u64)> = manifest
            .shards
            .iter()
            .flat_map(|s| shard_files(s).map(|(name, bytes, _)| (name, bytes)))
            .collect();
        if let Some(name) = self.storage().first_missing(&files)? {
            return Err(refused(
                &shown,
                &format!(
                    "holds this dataset, finished, but {name} is missing or has the wrong size \
                     (pass --overwrite to make it again)"
                ),
            ));
        }
        // A crash between the manifest and the journal's removal.
        self.storage().remove(JOURNAL_FILE)?;
        self.progressed = true;
        Ok(Start::Complete(Box::new(manifest)))
    }

    /// Resumes the interrupted run of `journal`: its intact shards are kept,
    /// the rest and unfinished files removed.
    fn resume<S, C>(&mut self, mut journal: Journal<S, C>) -> Result<Start<S, C>, OutputError>
    where
        S: Serialize,
        C: Serialize,
    {
        let shards: Vec<&ShardInfo> = journal.shards.iter().map(|d| &d.shard).collect();
        let intact = self.storage().intact_prefix(&shards)?;
        journal.shards.truncate(intact);
        let keep: Vec<String> = journal
            .shards
            .iter()
            .flat_map(|d| shard_files(&d.shard).map(|(n, _, _)| n.to_owned()))
            .collect();
        // Shards past the intact prefix, and unfinished files.
        self.remove_ours(|name| {
            (name.starts_with("shard-") || name.ends_with(TMP_SUFFIX))
                && !keep.iter().any(|k| k == name)
        })?;
        self.progressed = !journal.shards.is_empty();
        self.save(&journal)?;
        self.owned = true;
        Ok(Start::Resume(journal))
    }

    fn fresh<S, C>(&mut self, identity: &str) -> Result<Start<S, C>, OutputError>
    where
        S: Default + Serialize + DeserializeOwned,
        C: Serialize + DeserializeOwned,
    {
        // Saved at once: a run stopped before its first shard is recognised
        // as this run's and resumed, not refused as foreign. Written whole:
        // whatever journal file there was is gone or another run's.
        self.journaled = None;
        let journal = Journal::new(identity);
        self.save(&journal)?;
        self.records = Records {
            listed: HashSet::new(),
            run: true,
        };
        self.owned = true;
        Ok(Start::Fresh(journal))
    }

    /// Saves the journal atomically; call it as soon as a shard is in place.
    /// For an output in object storage, the journaled shards not yet there
    /// are uploaded first (each checked against its recorded size and
    /// XXH3-64, then removed from the staging folder).
    ///
    /// The shards past those the file lists are appended, one line each;
    /// the file is written whole only when the run's state changed or its
    /// shards were cut back (a resume).
    pub fn save<S: Serialize, C: Serialize>(
        &mut self,
        journal: &Journal<S, C>,
    ) -> Result<(), OutputError> {
        let state = serde_json::to_vec(&journal.state).expect("a journal always serializes");
        let appendable = self
            .journaled
            .as_ref()
            .filter(|j| {
                j.fingerprint == journal.fingerprint
                    && j.state == state
                    && j.shards <= journal.shards.len()
            })
            .map(|j| j.shards);
        let new = &journal.shards[appendable.unwrap_or(0)..];
        for done in new {
            for (name, bytes, sum) in shard_files(&done.shard) {
                self.storage().publish(name, sum.map(|sum| (bytes, sum)))?;
            }
        }
        match (appendable, self.journaled.take()) {
            (Some(_), Some(mut file)) => {
                let lines: Vec<u8> = new.iter().flat_map(shard_line).collect();
                if !lines.is_empty() {
                    file.text.extend_from_slice(&lines);
                    self.storage().append(JOURNAL_FILE, &lines, &file.text)?;
                }
                file.shards = journal.shards.len();
                self.journaled = Some(file);
            }
            _ => {
                let text = journal.to_lines();
                self.put(JOURNAL_FILE, &text)?;
                self.journaled = Some(Journaled {
                    fingerprint: journal.fingerprint.clone(),
                    shards: journal.shards.len(),
                    state,
                    text,
                });
            }
        }
        self.progressed |= !journal.shards.is_empty();
        Ok(())
    }

    /// Marks the run as having work worth resuming that the journal does not
    /// show (the shuffle's complete bucket files).
    pub fn progressed(&mut self) {
        self.progressed = true;
    }

    /// Writes a small file of the dataset atomically.
    pub fn put(&self, name: &str, bytes: &[u8]) -> Result<(), OutputError> {
        self.storage().put(name, bytes)
    }

    /// Copies the tokenizer file `file` (relative) of dataset `from` (a
    /// directory, or a folder in object storage) into the output, when
    /// `from` has it.
    pub fn copy_tokenizer(&self, file: Option<&str>, from: &Path) -> Result<(), OutputError> {
        let Some(file) = file else {
            return Ok(());
        };
        let Some(copy) = Files::new(from)?.open(file)? else {
            return Ok(());
        };
        let bytes = copy.read(0..copy.len())?;
        self.put(file, &bytes)
    }

    /// Removes prep's files and working folders so the run can start over
    /// (a task that is redone in full rather than resumed), and saves a new
    /// journal.
    pub fn restart<S, C>(&mut self, identity: &str) -> Result<Journal<S, C>, OutputError>
    where
        S: Default + Serialize + DeserializeOwned,
        C: Serialize + DeserializeOwned,
    {
        self.remove_ours(|_| true)?;
        self.progressed = false;
        match self.fresh(identity)? {
            Start::Fresh(j) => Ok(j),
            _ => unreachable!("fresh starts fresh"),
        }
    }

    /// Removes one of prep's working folders ([`WORK_FOLDERS`]) inside the
    /// directory, kept or not, once its work is done.
    pub fn remove_work_folder(&self, name: &str) -> Result<(), FormatError> {
        assert!(
            WORK_FOLDERS.contains(&name),
            "{name} is not a working folder of prep's"
        );
        let path = self.dir.join(name);
        match std::fs::remove_dir_all(&path) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(FormatError::io(&path, e)),
            _ => Ok(()),
        }
    }

    /// Removes everything this output holds of prep's (a failed run that is
    /// redone, not resumed: nothing of it is worth keeping).
    pub fn discard(&mut self) -> Result<(), OutputError> {
        self.progressed = false;
        self.journaled = None;
        self.remove_ours(|_| true)
    }

    /// Completes the dataset: the manifest, written atomically and last,
    /// then the journal and the lock go. A crash in between leaves a
    /// complete dataset that the next run recognises.
    pub fn commit(self, manifest: &Manifest) -> Result<(), OutputError> {
        let mut manifest = manifest.clone();
        manifest.provenance.single_writer |= self.storage().unlocked();
        let expect = manifest
            .shards
            .iter()
            .flat_map(|s| shard_files(s).filter_map(|(n, b, sum)| Some((n.to_owned(), (b, sum?)))))
            .collect();
        self.complete(MANIFEST_FILE, manifest.to_json().as_bytes(), &expect)
    }

    /// [`Output::commit`] for an output whose last file is not a manifest (a
    /// scatter part's `scatter.json`).
    pub fn commit_file(self, name: &str, bytes: &[u8]) -> Result<(), OutputError> {
        self.complete(name, bytes, &HashMap::new())
    }

    /// Writes the file `name` that completes the output, after every other
    /// file of the stage's is in place (in object storage: uploaded, and
    /// checked against `expect`'s size and XXH3-64 where it names the file).
    fn complete(
        mut self,
        name: &str,
        bytes: &[u8],
        expect: &HashMap<String, (u64, u64)>,
    ) -> Result<(), OutputError> {
        for (file, is_dir) in local_entries(&self.dir)? {
            let pending = !is_dir
                && self.is_ours(&file, false)
                && !file.ends_with(TMP_SUFFIX)
                && ![JOURNAL_FILE, LOCK_FILE, name].contains(&file.as_str());
            if pending {
                self.storage().publish(&file, expect.get(&file).copied())?;
            }
        }
        self.put(name, bytes)?;
        self.progressed = true;
        self.storage().remove(JOURNAL_FILE)?;
        if let Some(storage) = self.storage.take() {
            storage.release(true);
        }
        Ok(())
    }

    /// Whether the entry `name` is prep's, by the directory's records
    /// ([`Records`]): prep's working folders, its journal and lock, the
    /// files a manifest of prep's lists, and while a run's journal is there
    /// the files under the names prep gives a run's files (and this stage's
    /// own), with their temporaries.
    fn is_ours(&self, name: &str, is_dir: bool) -> bool {
        if is_dir {
            return WORK_FOLDERS.contains(&name);
        }
        let listed = |n: &str| self.records.listed.contains(n);
        is_record_name(name)
            || listed(name)
            || name.strip_suffix(TMP_SUFFIX).is_some_and(listed)
            || (self.records.run && self.in_the_way(name))
    }

    /// Whether a file named `name` would be replaced by this run: a name
    /// prep gives a run's files, or one of this stage's own.
    fn in_the_way(&self, name: &str) -> bool {
        let own = |n: &str| self.own.contains(&n);
        is_prep_file(name) || own(name) || name.strip_suffix(TMP_SUFFIX).is_some_and(own)
    }

    /// Removes the entries prep wrote (files, and its working folders unless
    /// kept) whose names `doomed` picks; never the lock, never a kept folder,
    /// never anything else: first in the directory the stage writes into,
    /// then in the storage (for an output in object storage, its objects).
    fn remove_ours(&self, doomed: impl Fn(&str) -> bool) -> Result<(), OutputError> {
        let spared = |name: &str, is_dir: bool| {
            name == LOCK_FILE
                || self.keep.iter().any(|k| k == name)
                || !self.is_ours(name, is_dir)
                || !doomed(name)
        };
        // The records go last, the journal after the manifest: a run
        // stopped part-way leaves them naming what is left, which stays
        // prep's to remove.
        let last = |name: &str| match name {
            MANIFEST_FILE => 1,
            _ if is_record_name(name) => 2,
            _ => 0,
        };
        let mut local = local_entries(&self.dir)?;
        local.sort_by_key(|(name, _)| last(name));
        for (name, is_dir) in local {
            if spared(&name, is_dir) {
                continue;
            }
            let path = self.dir.join(&name);
            if is_dir {
                std::fs::remove_dir_all(&path).map_err(|e| FormatError::io(&path, e))?;
            } else {
                remove_file(&path)?;
            }
        }
        // prep never uploads a folder: only files are its own there.
        let mut stored = self.storage().entries()?;
        stored.sort_by_key(|(name, _)| last(name));
        for (name, is_dir) in stored {
            if !is_dir && !spared(&name, false) {
                self.storage().remove(&name)?;
            }
        }
        Ok(())
    }
}

impl Drop for Output {
    /// A run that ends without a commit (any error) removes its unfinished
    /// files; one that wrote nothing worth resuming removes its journal and
    /// its other files too, and the folders it created. A run refused by
    /// [`Output::start`] touches nothing.
    fn drop(&mut self) {
        if self.storage.is_none() {
            return;
        }
        if self.owned {
            let _ = self.remove_ours(|name| name.ends_with(TMP_SUFFIX));
            if !self.progressed {
                let _ = self.remove_ours(|_| true);
            }
        }
        if let Some(storage) = self.storage.take() {
            storage.release(false);
        }
        if !self.progressed {
            remove_created(&self.dir, self.created.as_deref());
        }
    }
}

/// Creates `dir` if needed and takes its lock: the directory, held, and the
/// outermost folder of its path that this call made.
fn claim(dir: &Path) -> Result<(Disk, Option<PathBuf>), OutputError> {
    if dir.exists() && !dir.is_dir() {
        return Err(refused(dir, "is a file, not a directory"));
    }
    // The outermost folder this run creates, so that a run that leaves
    // nothing removes what it made and no more.
    let mut created = None;
    let mut ancestor = dir;
    while !ancestor.as_os_str().is_empty() && !ancestor.exists() {
        created = Some(ancestor.to_path_buf());
        match ancestor.parent() {
            Some(parent) => ancestor = parent,
            None => break,
        }
    }
    if created.is_some() {
        std::fs::create_dir_all(dir).map_err(|e| FormatError::io(dir, e))?;
    }
    match Disk::lock(dir) {
        Ok(disk) => Ok((disk, created)),
        Err(e) => {
            remove_created(dir, created.as_deref());
            Err(e)
        }
    }
}

/// Removes `dir` and its parents up to `created`, each only if empty: the
/// folders a run made and left nothing in (one already gone counts as
/// removed).
fn remove_created(dir: &Path, created: Option<&Path>) {
    let Some(top) = created else {
        return;
    };
    let mut at = Some(dir);
    while let Some(folder) = at {
        let gone = match std::fs::remove_dir(folder) {
            Ok(()) => true,
            Err(e) => e.kind() == std::io::ErrorKind::NotFound,
        };
        if !gone || folder == top {
            break;
        }
        at = folder.parent();
    }
}

/// The files of a dataset that its manifest lists by a name in its
/// directory: the manifest, each shard's files, the tokenizer copy, a
/// part's record hashes and a report (a merged dataset's files inside its
/// parts' folders are the parts').
fn listed_files(manifest: &Manifest) -> HashSet<String> {
    let shards = manifest
        .shards
        .iter()
        .flat_map(|s| s.files().map(|f| f.name.to_owned()));
    let others = manifest
        .other_files()
        .into_iter()
        .map(|f| f.name.to_owned());
    shards
        .chain(others)
        .chain([MANIFEST_FILE.to_owned()])
        .collect()
}

fn refused(dir: &Path, why: &str) -> OutputError {
    OutputError::Refused {
        dir: dir.into(),
        why: why.into(),
    }
}

/// A shard's files ([`ShardInfo::files`]) with their recorded sizes and
/// XXH3-64 (when the entry has a readable one); an optional file listed
/// without its size is left out.
fn shard_files(s: &ShardInfo) -> impl Iterator<Item = (&str, u64, Option<u64>)> {
    let sum = |hex: &str| u64::from_str_radix(hex, 16).ok();
    s.files()
        .filter_map(move |f| Some((f.name, f.bytes?, f.xxh3.and_then(sum))))
}

#[cfg(test)]
mod tests {
    use super::*;

    type J = Journal<(), ()>;

    #[test]
    fn second_lock_is_refused_with_the_holders_pid() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("out");
        let first = Output::lock(&dir, false).unwrap();
        let Err(OutputError::Locked { holder, .. }) = Output::lock(&dir, false) else {
            panic!("a second lock must be refused");
        };
        assert_eq!(holder, format!("pid {}", std::process::id()));
        drop(first);
        // Released (and the empty directory it created removed).
        assert!(!dir.exists());
        let _again = Output::lock(&dir, false).unwrap();
    }

    fn names(dir: &Path) -> Vec<String> {
        let mut left: Vec<_> = std::fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        left.sort();
        left
    }

    /// A finished dataset of one shard in `dir`, as a run of fingerprint
    /// `f` leaves it.
    fn finished(dir: &Path, f: &str) {
        let mut out = Output::lock(dir, false).unwrap();
        let Start::Fresh(mut journal) = out.start::<(), ()>(f, false).unwrap() else {
            panic!("fresh");
        };
        let mut w =
            crate::format::ShardWriter::create(dir, "shard-00000", crate::format::Dtype::U16)
                .unwrap();
        w.push(&[1, 2, 3]).unwrap();
        let shard = w.finish().unwrap();
        journal.shards.push(Done {
            shard: shard.clone(),
            at: (),
        });
        out.save(&journal).unwrap();
        out.put(TOKENIZER_FILE, b"{}").unwrap();
        let manifest = Manifest::documents(
            crate::format::Dtype::U16,
            10,
            crate::format::TokenizerInfo {
                file: Some(TOKENIZER_FILE.into()),
                xxh3: crate::format::checksum_hex(xxhash_rust::xxh3::xxh3_64(b"{}")),
            },
            vec![shard],
            crate::format::Provenance::new(
                "test",
                Vec::new(),
                serde_json::json!({}),
                Default::default(),
                f.into(),
            ),
        );
        out.commit(&manifest).unwrap();
    }

    #[test]
    fn overwrite_removes_only_what_the_records_say_prep_wrote() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path();
        finished(dir, "f");
        for name in ["in.jsonl", "notes.txt", "draft.tmp", "shard-7.bin"] {
            std::fs::write(dir.join(name), b"x").unwrap();
        }
        std::fs::create_dir(dir.join(".shuffle-tmp")).unwrap();
        std::fs::create_dir(dir.join("parts")).unwrap();
        let mut out = Output::lock(dir, false).unwrap();
        assert!(matches!(
            out.start::<(), ()>("g", true).unwrap(),
            Start::Fresh(_)
        ));
        assert_eq!(
            names(dir),
            [
                ".prep-journal.json",
                ".prep-lock",
                "draft.tmp",
                "in.jsonl",
                "notes.txt",
                "parts",
                "shard-7.bin"
            ]
        );
    }

    #[test]
    fn a_file_of_someone_elses_under_a_name_prep_writes_is_refused_even_with_overwrite() {
        let refusal = |dir: &Path, overwrite: bool| match Output::lock(dir, false)
            .unwrap()
            .start::<(), ()>("g", overwrite)
        {
            Err(e) => e.to_string(),
            Ok(_) => panic!("must be refused"),
        };
        // In a directory prep has no record in.
        for name in [
            "shard-00007.bin",
            TOKENIZER_FILE,
            MANIFEST_FILE,
            "shard-00000.bin.tmp",
            HASHES_FILE,
        ] {
            let tmp = tempfile::tempdir().unwrap();
            let path = tmp.path().join(name);
            std::fs::write(&path, b"{\"mine\": true}").unwrap();
            for overwrite in [false, true] {
                let err = refusal(tmp.path(), overwrite);
                assert!(err.contains(name), "{name}, --overwrite {overwrite}: {err}");
                assert_eq!(names(tmp.path()), [name], "{name}");
            }
        }
        // Beside a dataset of prep's that does not list it.
        let tmp = tempfile::tempdir().unwrap();
        finished(tmp.path(), "f");
        std::fs::write(tmp.path().join("shard-00007.bin"), b"x").unwrap();
        let before = names(tmp.path());
        let err = refusal(tmp.path(), true);
        assert!(err.contains("shard-00007.bin"), "{err}");
        assert_eq!(names(tmp.path()), before);
    }

    #[test]
    fn a_run_that_did_nothing_leaves_nothing_and_a_refused_one_touches_nothing() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("a/b/out");
        let mut out = Output::lock(&dir, false).unwrap();
        out.start::<(), ()>("f", false).unwrap();
        out.put(TOKENIZER_FILE, b"{}").unwrap();
        drop(out);
        assert!(!tmp.path().join("a").exists());

        // Another run's finished dataset is refused and left as it was.
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join(MANIFEST_FILE), b"{}").unwrap();
        std::fs::write(dir.join(TOKENIZER_FILE), b"{}").unwrap();
        let mut out = Output::lock(&dir, false).unwrap();
        assert!(out.start::<(), ()>("f", false).is_err());
        drop(out);
        assert!(dir.join(MANIFEST_FILE).exists() && dir.join(TOKENIZER_FILE).exists());
    }

    #[test]
    fn foreign_files_are_refused_and_named() {
        let tmp = tempfile::tempdir().unwrap();
        std::fs::write(tmp.path().join("mine.txt"), b"x").unwrap();
        let mut out = Output::lock(tmp.path(), false).unwrap();
        let err = match out.start::<(), ()>("f", false) {
            Err(e) => e.to_string(),
            Ok(_) => panic!("a foreign file must be refused"),
        };
        assert!(err.contains("mine.txt"), "{err}");
        drop(out);
        assert!(tmp.path().join("mine.txt").exists());
    }

    /// A shard entry as a stage journals it (its files need not exist: a
    /// local output publishes nothing).
    fn shard(i: usize) -> ShardInfo {
        ShardInfo {
            bin: format!("shard-{i:05}.bin"),
            idx: format!("shard-{i:05}.idx"),
            n_records: 1000,
            n_tokens: 250_000,
            bin_bytes: 500_000,
            idx_bytes: 8040,
            bin_xxh3: format!("{:016x}", i * 7919),
            idx_xxh3: format!("{:016x}", i * 104_729),
            seg: None,
            seg_bytes: None,
            seg_xxh3: None,
            sum: Some(format!("shard-{i:05}.sum")),
            sum_bytes: Some(16),
            sum_xxh3: Some(format!("{:016x}", i * 31)),
            mask: None,
            mask_bytes: None,
            mask_xxh3: None,
        }
    }

    fn done(i: usize) -> Done<u64> {
        Done {
            shard: shard(i),
            at: i as u64 * 1000,
        }
    }

    #[test]
    fn the_journal_is_appended_a_line_per_shard_and_read_back_whole() {
        use std::os::unix::fs::MetadataExt;
        let tmp = tempfile::tempdir().unwrap();
        let mut out = Output::lock(tmp.path(), false).unwrap();
        let Start::Fresh(mut journal) = out.start::<Vec<u32>, u64>("f", false).unwrap() else {
            panic!("a fresh start");
        };
        let path = tmp.path().join(JOURNAL_FILE);
        let inode = std::fs::metadata(&path).unwrap().ino();
        // 20,000 shards, saved one by one as a stage does: each save adds
        // its shard's line to the same file.
        const SHARDS: usize = 20_000;
        let mut rewritten_whole = 0u64; // what saving the whole journal each time would write
        for i in 0..SHARDS {
            journal.shards.push(done(i));
            let before = std::fs::metadata(&path).unwrap().len();
            out.save(&journal).unwrap();
            let after = std::fs::metadata(&path).unwrap();
            assert_eq!(after.ino(), inode, "shard {i}: appended, not replaced");
            assert_eq!(after.len() - before, shard_line(&done(i)).len() as u64);
            rewritten_whole += after.len();
        }
        let written = std::fs::metadata(&path).unwrap().len();
        eprintln!(
            "{SHARDS} shards: the journal's writes {written} bytes in all, where rewriting it whole at each shard would write {rewritten_whole}"
        );
        let read: Journal<Vec<u32>, u64> = Journal::parse(&std::fs::read(&path).unwrap()).unwrap();
        assert_eq!(read, journal);
        // A changed state rewrites the file once; appends go on after it.
        journal.state = vec![1, 2, 3];
        out.save(&journal).unwrap();
        journal.shards.push(done(SHARDS));
        out.save(&journal).unwrap();
        let read: Journal<Vec<u32>, u64> = Journal::parse(&std::fs::read(&path).unwrap()).unwrap();
        assert_eq!(read, journal);
    }

    #[test]
    fn a_torn_or_edited_line_ends_the_journal_and_the_old_format_is_not_read() {
        let journal = Journal {
            fingerprint: "f".to_string(),
            state: (),
            shards: (0..3).map(done).collect(),
        };
        let text = journal.to_lines();
        let parse = |b: &[u8]| Journal::<(), u64>::parse(b);
        assert_eq!(parse(&text).unwrap(), journal);
        // Cut anywhere inside the last line: the first two shards. (Cut
        // only before its newline, the line is whole: three. A resume
        // writes the journal whole before anything is appended to it.)
        let last = text[..text.len() - 1]
            .iter()
            .rposition(|&b| b == b'\n')
            .unwrap()
            + 1;
        for cut in last..text.len() - 1 {
            let read = parse(&text[..cut]).unwrap();
            assert_eq!(read.shards, journal.shards[..2], "cut at {cut}");
        }
        assert_eq!(parse(&text[..text.len() - 1]).unwrap(), journal);
        // An edited line ends the journal there, though it is still JSON:
        // the shard's records count changed.
        let second = text
            .windows(b"\"n_records\":1000".len())
            .enumerate()
            .filter(|(_, w)| *w == b"\"n_records\":1000")
            .nth(1)
            .unwrap()
            .0;
        let mut edited = text.clone();
        edited[second + "\"n_records\":".len()] = b'2';
        let line = edited.split(|&b| b == b'\n').nth(2).unwrap();
        assert!(serde_json::from_slice::<serde_json::Value>(line).is_ok());
        assert_eq!(parse(&edited).unwrap().shards, journal.shards[..1]);
        // The head edited: no journal of this run at all.
        let mut head = text.clone();
        head[LINE_SUM.len() + 20] ^= 1;
        assert!(parse(&head).is_none());
        // What prep wrote before checksums: one JSON object, or lines
        // without them.
        assert!(parse(&serde_json::to_vec_pretty(&journal).unwrap()).is_none());
        let mut plain = serde_json::to_vec(&JournalHead {
            fingerprint: "f",
            state: (),
        })
        .unwrap();
        plain.push(b'\n');
        assert!(parse(&plain).is_none());
    }

    #[test]
    fn a_journal_of_another_run_is_refused_and_the_same_run_resumes() {
        let tmp = tempfile::tempdir().unwrap();
        let mut out = Output::lock(tmp.path(), false).unwrap();
        let Start::Fresh(j) = out.start::<(), ()>("run-a", false).unwrap() else {
            panic!("fresh");
        };
        let _: J = j;
        // Killed after some work: its journal stays.
        out.progressed();
        drop(out);
        let mut out = Output::lock(tmp.path(), false).unwrap();
        assert!(out.start::<(), ()>("run-b", false).is_err());
        assert!(matches!(
            out.start::<(), ()>("run-a", false).unwrap(),
            Start::Resume(_)
        ));
    }
}
