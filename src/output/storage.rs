//! Where an output's dataset is kept: the primitives the rules of
//! [`Output`](super::Output) need of it, and their local implementation.
//!
//! [`Output`](super::Output) owns the rules (one writer, refusal, resume,
//! commit last, nothing half-written) and asks a [`Storage`] only for
//! primitives: read, write atomically, remove and list small files, tell
//! which journaled shards are intact, make a staged file part of the
//! dataset, and let the output go. [`Disk`] keeps the dataset in the
//! directory the stage writes into; [`super::remote::Store`] keeps it in
//! object storage and the stage's directory is only a staging folder.

use std::fs::File;
use std::io::{Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};

use super::{OutputError, LOCK_FILE};
use crate::format::{atomic_write, checksum_hex, hash_file, FormatError, ShardInfo};

/// The primitives an output's storage provides. Names are relative to the
/// output; a name may lie in a folder of it (a merge's parts).
pub(super) trait Storage: Send + Sync {
    /// The output as the user named it, for messages: the directory, or
    /// the object-storage address.
    fn shown(&self) -> PathBuf;

    /// The bytes of the small file `name`, or `None` when there is none.
    fn read(&self, name: &str) -> Result<Option<Vec<u8>>, OutputError>;

    /// Writes the small file `name` atomically.
    fn put(&self, name: &str, bytes: &[u8]) -> Result<(), OutputError>;

    /// Adds `bytes` at the end of the small file `name` (the journal),
    /// durably, whose whole content is then `whole`. A crash may leave part
    /// of `bytes` at the end; readers of such files tolerate a torn last
    /// line.
    fn append(&self, name: &str, bytes: &[u8], whole: &[u8]) -> Result<(), OutputError>;

    /// Removes the file `name` (no error when there is none).
    fn remove(&self, name: &str) -> Result<(), OutputError>;

    /// Names and kinds (folder or not) of the output's entries.
    fn entries(&self) -> Result<Vec<(String, bool)>, OutputError>;

    /// The first of `files` (name, size) that is missing or has another
    /// size, if any.
    fn first_missing<'a>(&self, files: &[(&'a str, u64)]) -> Result<Option<&'a str>, OutputError>;

    /// How many of `shards`, from the first, are intact: the resume keeps
    /// them and makes the rest again.
    fn intact_prefix(&self, shards: &[&ShardInfo]) -> Result<usize, OutputError>;

    /// Makes the file `name` that the stage wrote into its directory part
    /// of the dataset, checked against `expect` (size, XXH3-64) when given.
    fn publish(&self, name: &str, expect: Option<(u64, u64)>) -> Result<(), OutputError>;

    /// Whether the output's lock locks nothing: a store that does not honour
    /// conditional writes, written on the user's word that this run is its
    /// only writer.
    fn unlocked(&self) -> bool {
        false
    }

    /// Lets the output go: its lock, and after a `committed` run whatever
    /// the stage's directory held only on the way to the storage.
    fn release(self: Box<Self>, committed: bool);
}

/// An output kept in a local directory, the one the stage writes into.
pub(super) struct Disk {
    dir: PathBuf,
    lock: Lock,
}

impl Disk {
    /// Takes the lock of the directory `dir`, which exists.
    pub(super) fn lock(dir: &Path) -> Result<Disk, OutputError> {
        Ok(Disk {
            dir: dir.into(),
            lock: Lock::acquire(dir)?,
        })
    }

    /// The directory.
    pub(super) fn dir(&self) -> &Path {
        &self.dir
    }
}

impl Storage for Disk {
    fn shown(&self) -> PathBuf {
        self.dir.clone()
    }

    fn read(&self, name: &str) -> Result<Option<Vec<u8>>, OutputError> {
        let path = self.dir.join(name);
        match std::fs::read(&path) {
            Ok(bytes) => Ok(Some(bytes)),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(FormatError::io(&path, e).into()),
        }
    }

    fn put(&self, name: &str, bytes: &[u8]) -> Result<(), OutputError> {
        Ok(atomic_write(&self.dir.join(name), bytes)?)
    }

    /// Appends and syncs the data: one write of the new bytes, not of the
    /// file.
    fn append(&self, name: &str, bytes: &[u8], _whole: &[u8]) -> Result<(), OutputError> {
        let path = self.dir.join(name);
        let io = |e| FormatError::io(&path, e);
        let mut file = std::fs::OpenOptions::new()
            .append(true)
            .open(&path)
            .map_err(io)?;
        file.write_all(bytes).map_err(io)?;
        file.sync_data().map_err(io)?;
        Ok(())
    }

    fn remove(&self, name: &str) -> Result<(), OutputError> {
        Ok(remove_file(&self.dir.join(name))?)
    }

    fn entries(&self) -> Result<Vec<(String, bool)>, OutputError> {
        Ok(local_entries(&self.dir)?)
    }

    fn first_missing<'a>(&self, files: &[(&'a str, u64)]) -> Result<Option<&'a str>, OutputError> {
        let size = |name: &str| std::fs::metadata(self.dir.join(name)).ok().map(|m| m.len());
        Ok(files
            .iter()
            .find(|(name, bytes)| size(name) != Some(*bytes))
            .map(|(name, _)| *name))
    }

    fn intact_prefix(&self, shards: &[&ShardInfo]) -> Result<usize, OutputError> {
        Ok(shards
            .iter()
            .take_while(|s| shard_intact(&self.dir, s))
            .count())
    }

    fn publish(&self, _: &str, _: Option<(u64, u64)>) -> Result<(), OutputError> {
        // Written in place: already part of the dataset.
        Ok(())
    }

    fn release(self: Box<Self>, _committed: bool) {
        self.lock.release();
    }
}

/// Names and kinds of the entries of the local directory `dir`.
pub(super) fn local_entries(dir: &Path) -> Result<Vec<(String, bool)>, FormatError> {
    let io = |e| FormatError::io(dir, e);
    let mut out = Vec::new();
    for entry in std::fs::read_dir(dir).map_err(io)? {
        let entry = entry.map_err(io)?;
        let kind = entry.file_type().map_err(io)?;
        out.push((
            entry.file_name().to_string_lossy().into_owned(),
            kind.is_dir(),
        ));
    }
    Ok(out)
}

/// Removes the file at `path`; no error when there is none.
pub(super) fn remove_file(path: &Path) -> Result<(), FormatError> {
    match std::fs::remove_file(path) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(FormatError::io(path, e)),
    }
}

/// The rule for an intact shard, the one every resume uses: each of its
/// files ([`ShardInfo::files`]: `.bin`, `.idx`, and `.seg` and `.sum` when
/// the entry names them) has the recorded size and XXH3-64.
pub fn shard_intact(dir: &Path, s: &ShardInfo) -> bool {
    s.files().all(|f| {
        let (Some(bytes), Some(sum)) = (f.bytes, f.xxh3) else {
            return false;
        };
        hash_file(&dir.join(f.name)).is_ok_and(|(h, len)| len == bytes && checksum_hex(h) == sum)
    })
}

/// An exclusive advisory lock on `DIR/.prep-lock`, held for a run.
///
/// The OS releases it when the process dies, so a killed run never blocks
/// the next. The file names the holder's pid for the message a second run
/// prints. On release the file is removed while still locked; a run that
/// opened it before the removal notices (its file is no longer the one at
/// the path) and tries again.
struct Lock {
    file: File,
    path: PathBuf,
}

impl Lock {
    fn acquire(dir: &Path) -> Result<Lock, OutputError> {
        let path = dir.join(LOCK_FILE);
        let io = |e| FormatError::io(&path, e);
        loop {
            let mut file = std::fs::OpenOptions::new()
                .read(true)
                .write(true)
                .create(true)
                .truncate(false)
                .open(&path)
                .map_err(io)?;
            match file.try_lock() {
                Ok(()) => {}
                Err(std::fs::TryLockError::WouldBlock) => {
                    let mut holder = String::new();
                    let _ = file.read_to_string(&mut holder);
                    let holder = holder.trim();
                    return Err(OutputError::Locked {
                        dir: dir.into(),
                        holder: if holder.is_empty() {
                            "pid unknown".into()
                        } else {
                            holder.into()
                        },
                    });
                }
                Err(std::fs::TryLockError::Error(e)) => return Err(io(e).into()),
            }
            if !same_file(&file, &path) {
                // Released and removed by its last holder after we opened it.
                continue;
            }
            file.set_len(0).map_err(io)?;
            file.seek(SeekFrom::Start(0)).map_err(io)?;
            write!(file, "pid {}", std::process::id()).map_err(io)?;
            return Ok(Lock { file, path });
        }
    }

    fn release(self) {
        let _ = std::fs::remove_file(&self.path);
        let _ = self.file.unlock();
    }
}

#[cfg(unix)]
fn same_file(file: &File, path: &Path) -> bool {
    use std::os::unix::fs::MetadataExt;
    match (file.metadata(), std::fs::metadata(path)) {
        (Ok(a), Ok(b)) => a.dev() == b.dev() && a.ino() == b.ino(),
        _ => false,
    }
}

#[cfg(not(unix))]
fn same_file(_: &File, path: &Path) -> bool {
    path.exists()
}
