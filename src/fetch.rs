//! `prep fetch`: a dataset in object storage brought down to a local
//! directory, for training code that maps its shards.
//!
//! The manifest is read first and is the contract: every file it lists (each
//! shard's `.bin`, `.idx`, `.seg` and `.sum`, the tokenizer copy, a part's hashes, a report)
//! is streamed to `NAME.tmp` while its size and XXH3-64 are computed, checked
//! against the manifest, and only then renamed into place. The directory goes
//! through the output lifecycle ([`crate::output::Output`]): it is locked,
//! a directory holding something else is refused, a fetch that was stopped
//! resumes from the shards it already verified, and the manifest is written
//! last, byte for byte as the store holds it. A local dataset with a
//! manifest is therefore always complete and verified.

use std::fs::File;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};

use xxhash_rust::xxh3::Xxh3;

use crate::format::{
    checksum_hex, FormatError, Manifest, ShardInfo, MANIFEST_FILE, MAX_MANIFEST_BYTES, TMP_SUFFIX,
};
use crate::output::{Done, Output, OutputError, Start};
use crate::store::{Object, StoreError};

/// What to fetch, and where.
#[derive(Debug, Clone)]
pub struct FetchConfig {
    /// The dataset's address: `s3://bucket/prefix` (or `gs://`, `az://`,
    /// `https://`), the folder that holds `manifest.json`.
    pub source: String,
    /// The local directory to write.
    pub dest: PathBuf,
    /// Replace prep's files in a directory that holds another dataset.
    pub overwrite: bool,
}

/// What a fetch did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FetchSummary {
    /// Files downloaded and verified by this run.
    pub files: u64,
    /// Their bytes.
    pub bytes: u64,
    /// Shards already in place from an earlier, interrupted fetch.
    pub resumed_shards: u64,
    /// The directory already held this very dataset, complete.
    pub complete: bool,
}

/// Every way a fetch can fail.
#[derive(Debug, thiserror::Error)]
pub enum FetchError {
    /// The dataset's address is not one of object storage's.
    #[error("{url:?}: not an object-storage address (s3://, gs://, az://, https://)")]
    NotAUrl {
        /// The address as given.
        url: String,
    },
    /// An object could not be found or read.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// The transfer of an object failed part way.
    #[error("{url}: reading failed after {at} bytes: {cause}")]
    Read {
        /// The object.
        url: String,
        /// Bytes received before the failure.
        at: u64,
        /// The underlying error.
        cause: std::io::Error,
    },
    /// An object's bytes are not those the manifest lists.
    #[error(
        "{url}: does not match the manifest: {found_bytes} bytes with XXH3 {found_xxh3}, \
         the manifest lists {bytes} bytes with XXH3 {xxh3}; the object is corrupt or was \
         changed after the manifest was written (nothing of it was kept)"
    )]
    Corrupt {
        /// The object.
        url: String,
        /// Size the manifest lists.
        bytes: u64,
        /// Checksum the manifest lists.
        xxh3: String,
        /// Size received.
        found_bytes: u64,
        /// Checksum of the bytes received.
        found_xxh3: String,
    },
    /// The manifest itself is not a readable prep manifest, or a local file
    /// could not be written.
    #[error(transparent)]
    Format(#[from] FormatError),
    /// The local directory was refused or is locked.
    #[error(transparent)]
    Output(#[from] OutputError),
}

/// One file to fetch: its name in the dataset and what the manifest says
/// of it (the size may be unknown: the tokenizer copy's is not listed).
struct Wanted<'a> {
    name: &'a str,
    bytes: Option<u64>,
    xxh3: &'a str,
}

/// Brings the dataset at `config.source` down to `config.dest`, verifying
/// every file against the manifest as it arrives. See the [module
/// docs](self).
///
/// # Errors
/// [`FetchError::Corrupt`] for an object whose size or checksum differs
/// from the manifest's (the shards verified before it stay, for a resume),
/// [`FetchError::Store`] and [`FetchError::Read`] for the store's failures,
/// [`FetchError::Output`] for a refused or locked directory.
pub fn fetch(config: &FetchConfig) -> Result<FetchSummary, FetchError> {
    if !crate::store::is_url(&config.source) {
        return Err(FetchError::NotAUrl {
            url: config.source.clone(),
        });
    }
    let root = Object::at(config.source.trim_end_matches('/'))?;
    let manifest_object = root.child(MANIFEST_FILE)?;
    let size = manifest_object.size()?;
    if size > MAX_MANIFEST_BYTES {
        return Err(FormatError::BadManifest {
            path: PathBuf::from(manifest_object.url()),
            message: format!("{size} bytes, more than any manifest needs"),
        }
        .into());
    }
    let manifest_bytes = manifest_object.get_all()?;
    let manifest = Manifest::parse(Path::new(manifest_object.url()), &manifest_bytes)?;

    let mut output = Output::lock(&config.dest, false)?;
    let mut summary = FetchSummary {
        files: 0,
        bytes: 0,
        resumed_shards: 0,
        complete: false,
    };
    let mut journal = match output.start::<(), ()>(&manifest.identity(), config.overwrite)? {
        Start::Complete(_) => {
            summary.complete = true;
            return Ok(summary);
        }
        Start::Resume(journal) | Start::Fresh(journal) => journal,
    };
    summary.resumed_shards = journal.shards.len() as u64;
    let dir = output.dir().to_path_buf();

    for shard in &manifest.shards[journal.shards.len()..] {
        for wanted in shard_files(shard) {
            fetch_file(&root, &dir, &wanted, &mut summary)?;
        }
        journal.shards.push(Done {
            shard: shard.clone(),
            at: (),
        });
        output.save(&journal)?;
    }
    // The small files besides the shards, each verified the same way.
    let extras: Vec<Wanted> = manifest
        .other_files()
        .into_iter()
        .map(|f| Wanted {
            name: f.name,
            bytes: f.bytes,
            xxh3: f.xxh3,
        })
        .collect();
    for wanted in &extras {
        fetch_file(&root, &dir, wanted, &mut summary)?;
    }
    output.commit_file(MANIFEST_FILE, &manifest_bytes)?;
    Ok(summary)
}

/// A dataset a stage reads, as a local directory it can map: the path
/// itself, or for an object-storage address a copy fetched and verified as
/// `prep fetch` does (every file against the manifest's size and XXH3-64)
/// into a folder of this process's ([`crate::output::input_copy_for`]),
/// removed when the `Local` is dropped.
#[derive(Debug)]
pub struct Local {
    dir: PathBuf,
    copy: bool,
}

impl Local {
    /// The dataset at `path`, local or fetched.
    ///
    /// # Errors
    /// [`fetch`]'s, for a dataset in object storage.
    pub fn of(path: &Path) -> Result<Local, FetchError> {
        let Some(url) = path.to_str().filter(|p| crate::store::is_url(p)) else {
            return Ok(Local {
                dir: path.to_path_buf(),
                copy: false,
            });
        };
        let dest = crate::output::input_copy_for(url);
        let local = Local {
            dir: dest.clone(),
            copy: true,
        };
        fetch(&FetchConfig {
            source: url.to_owned(),
            dest,
            overwrite: true,
        })?;
        Ok(local)
    }

    /// The local directory to read.
    pub fn dir(&self) -> &Path {
        &self.dir
    }
}

impl Drop for Local {
    fn drop(&mut self) {
        if self.copy {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }
}

/// A shard's files as the manifest lists them ([`ShardInfo::files`]); an
/// optional file listed without its size and checksum is left out.
fn shard_files(s: &ShardInfo) -> Vec<Wanted<'_>> {
    s.files()
        .filter_map(|f| {
            Some(Wanted {
                name: f.name,
                bytes: Some(f.bytes?),
                xxh3: f.xxh3?,
            })
        })
        .collect()
}

/// Streams one object to `dir/NAME.tmp`, checks it, and renames it into
/// place; a file that fails the check is removed.
fn fetch_file(
    root: &Object,
    dir: &Path,
    wanted: &Wanted<'_>,
    summary: &mut FetchSummary,
) -> Result<(), FetchError> {
    let object = root.child(wanted.name)?;
    let size = object.size()?;
    let path = dir.join(wanted.name);
    // A merged dataset names its parts' shards where they lie: in folders.
    if let Some(parent) = path.parent() {
        std::fs::create_dir_all(parent).map_err(|e| FormatError::io(parent, e))?;
    }
    let mut tmp_name = path.clone().into_os_string();
    tmp_name.push(TMP_SUFFIX);
    let tmp = PathBuf::from(tmp_name);
    let checked = copy_checked(&object, size, wanted, &tmp);
    if let Err(e) = checked {
        let _ = std::fs::remove_file(&tmp);
        return Err(e);
    }
    std::fs::rename(&tmp, &path).map_err(|e| FormatError::io(&path, e))?;
    summary.files += 1;
    summary.bytes += size;
    Ok(())
}

fn copy_checked(
    object: &Object,
    size: u64,
    wanted: &Wanted<'_>,
    tmp: &Path,
) -> Result<(), FetchError> {
    let corrupt = |found_bytes: u64, found_xxh3: String| FetchError::Corrupt {
        url: object.url().to_owned(),
        bytes: wanted.bytes.unwrap_or(found_bytes),
        xxh3: wanted.xxh3.to_owned(),
        found_bytes,
        found_xxh3,
    };
    // A size that differs is known before a byte is read.
    if wanted.bytes.is_some_and(|bytes| bytes != size) {
        return Err(corrupt(size, "(not read)".to_owned()));
    }
    let mut file = File::create(tmp).map_err(|e| FormatError::io(tmp, e))?;
    let mut reader = object.reader(0, size);
    let mut hasher = Xxh3::new();
    let mut buf = vec![0u8; 1 << 20];
    let mut at = 0u64;
    loop {
        let n = match reader.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(source) => {
                return Err(FetchError::Read {
                    url: object.url().to_owned(),
                    at,
                    cause: source,
                })
            }
        };
        hasher.update(&buf[..n]);
        file.write_all(&buf[..n])
            .map_err(|e| FormatError::io(tmp, e))?;
        at += n as u64;
    }
    file.sync_all().map_err(|e| FormatError::io(tmp, e))?;
    let found = checksum_hex(hasher.digest());
    if found != wanted.xxh3 || wanted.bytes.is_some_and(|bytes| bytes != at) {
        return Err(corrupt(at, found));
    }
    Ok(())
}
