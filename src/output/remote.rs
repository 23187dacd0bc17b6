//! An output directory in object storage: the store's side of [`crate::output::Output`].
//!
//! A stage writes its files into a local staging folder
//! ([`staging_for`]) exactly as into a local output directory; the
//! [`crate::output::Output`] carries them up as the rules of the [module docs](super)
//! require, on the store's own primitives:
//!
//! - **One writer**: a lease ([`Lease`]) on `URL/.prep-lock`, taken with a
//!   conditional write (`If-None-Match: *`) and renewed by a heartbeat with
//!   `If-Match` on the version it last wrote. A killed run stops renewing;
//!   once its lease has run out ([`LEASE_VAR`], 60 s by default, by the
//!   store's clock) the next run takes the lock over, again conditionally,
//!   so two runs never both win. A run whose renewal fails (another run took
//!   the lock after a stall longer than the lease) stops before its next
//!   write.
//! - **Each shard whole**: a shard's files are uploaded (in parts, for
//!   large ones) once the stage journals it, checked against the size and
//!   XXH3-64 it was recorded with while they are sent, and only then is the
//!   journal written. An upload is atomic: a shard object in the store is
//!   the whole file. The local copy is removed once it is up, so the
//!   staging folder holds about one shard whatever the dataset's size.
//! - **Intact on resume**: a journaled shard whose objects are listed with
//!   their recorded sizes (each went up only after its checksum matched).
//! - **Manifest last**: every other file goes up before it.
//! - **A journal appended to**: a store has no append, and rewriting the
//!   journal whole at each shard would send O(shards²) bytes over a run.
//!   Each append is an object of its own beside the journal
//!   ([`journal_part`]: `.prep-journal.json.GEN.N`, `GEN` the XXH3-64 of the
//!   journal object it follows, `N` from 1), put in one request; the journal
//!   reads back as that object, then its parts `1, 2, …` in order. Parts of
//!   another version (left by a crash between a rewrite and their removal)
//!   are not read, and go with the next rewrite or the journal.

use std::collections::{HashMap, HashSet};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use super::storage::{Disk, Storage};
use super::{shard_files, OutputError, JOURNAL_FILE, LOCK_FILE};
use crate::format::checksum_hex;
use crate::format::ShardInfo;
use crate::store::{Object, StoreError, Tag};

/// The variable that sets the lease of an object-storage lock, in seconds
/// (tests use a short one to take over a killed run's lock quickly).
pub const LEASE_VAR: &str = "PREP_LOCK_LEASE_SECS";
/// The variable by which a user who guarantees a single writer themselves
/// lets prep write to a store that does not honour conditional writes (set
/// to 1), as `--single-writer` does. Without either such a store is
/// refused: its lock would lock nothing.
pub const SINGLE_WRITER_VAR: &str = "PREP_STORE_SINGLE_WRITER";

/// The lease of an object-storage lock unless [`LEASE_VAR`] says otherwise.
const LEASE_SECS: u64 = 60;
/// The variable that names the folder under which runs writing to object
/// storage stage their files (default: the system's temporary folder).
pub const STAGING_VAR: &str = "PREP_STAGING_DIR";

/// The local folder where a run writing to `url` stages its files: one per
/// address, so that a run resumed on the same machine finds its work (the
/// shuffle's bucket files) where it left it.
pub fn staging_for(url: &str) -> PathBuf {
    staging_base().join(checksum_hex(url_key(url)))
}

/// The local folder where this process keeps its verified copy of the
/// dataset at `url`, read as an input (removed when the run is done with
/// it; see [`crate::fetch::Local`]).
pub fn input_copy_for(url: &str) -> PathBuf {
    staging_base().join(format!(
        "{}-input-{}",
        checksum_hex(url_key(url)),
        std::process::id()
    ))
}

fn staging_base() -> PathBuf {
    std::env::var_os(STAGING_VAR)
        .map(PathBuf::from)
        .unwrap_or_else(|| std::env::temp_dir().join("prep-staging"))
}

fn url_key(url: &str) -> u64 {
    xxhash_rust::xxh3::xxh3_64(url.trim_end_matches('/').as_bytes())
}

/// An output in object storage, held: the store's lease, the objects this
/// run has put or found intact, and the local staging folder the stage
/// writes into.
pub(super) struct Store {
    root: Object,
    lease: Lease,
    /// The store let a second conditional create through, and the user
    /// guaranteed a single writer: the lock locks nothing.
    unlocked: bool,
    /// Names of the objects in place (uploaded by this run, or found
    /// intact on resume): never sent again.
    uploaded: Mutex<HashSet<String>>,
    /// The journal as this run last put it whole: its version (`GEN`) and
    /// how many parts have been appended to it since.
    journal: Mutex<Option<(String, u64)>>,
    staging: Disk,
}

/// The journal part `name` is (see the [module docs](self)): its version
/// and number, or `None` when it is not one.
pub(super) fn journal_part(name: &str) -> Option<(&str, u64)> {
    let rest = name.strip_prefix(JOURNAL_FILE)?.strip_prefix('.')?;
    let (version, n) = rest.split_once('.')?;
    let hex = |s: &str| s.len() == 16 && s.bytes().all(|b| b.is_ascii_hexdigit());
    let digits = !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit());
    (hex(version) && digits).then_some(())?;
    Some((version, n.parse().ok()?))
}

/// The name of part `n` of the journal whose whole object is version
/// `version`.
fn journal_part_name(version: &str, n: u64) -> String {
    format!("{JOURNAL_FILE}.{version}.{n:06}")
}

/// The version (`GEN`) of a journal object's bytes.
fn journal_version(bytes: &[u8]) -> String {
    checksum_hex(xxhash_rust::xxh3::xxh3_64(bytes))
}

impl Store {
    /// Takes the lock of the output at `url`; the stage writes into
    /// `staging` (held). On failure the staging folder's lock is let go.
    pub(super) fn acquire(
        url: &str,
        staging: Disk,
        single_writer: bool,
    ) -> Result<Store, OutputError> {
        let held = Object::at(url.trim_end_matches('/'))
            .map_err(OutputError::from)
            .and_then(|root| Ok((Lease::acquire(&root, single_writer)?, root)));
        match held {
            Ok(((lease, unlocked), root)) => Ok(Store {
                root,
                lease,
                unlocked,
                uploaded: Mutex::new(HashSet::new()),
                journal: Mutex::new(None),
                staging,
            }),
            Err(e) => {
                Box::new(staging).release(false);
                Err(e)
            }
        }
    }

    /// Every object of the output with its size.
    fn listing(&self) -> Result<HashMap<String, u64>, OutputError> {
        Ok(self.root.list_below()?.into_iter().collect())
    }

    fn uploaded(&self) -> std::sync::MutexGuard<'_, HashSet<String>> {
        self.uploaded.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn journal(&self) -> std::sync::MutexGuard<'_, Option<(String, u64)>> {
        self.journal.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The journal's parts in the store, of every version: name, version,
    /// number.
    fn journal_parts(&self) -> Result<Vec<(String, String, u64)>, OutputError> {
        Ok(self
            .listing()?
            .into_keys()
            .filter_map(|name| {
                let (version, n) = journal_part(&name).map(|(v, n)| (v.to_owned(), n))?;
                Some((name, version, n))
            })
            .collect())
    }

    /// Removes every part of the journal (whatever its version).
    fn remove_journal_parts(&self) -> Result<(), OutputError> {
        for (name, _, _) in self.journal_parts()? {
            self.root.child(&name)?.delete()?;
        }
        Ok(())
    }

    /// Refuses to write once another run has taken the lock over.
    fn check(&self) -> Result<(), OutputError> {
        if self.lease.lost.load(Ordering::SeqCst) {
            return Err(OutputError::Locked {
                dir: self.root.url().into(),
                holder: "it took the lock over after this run failed to renew its lease".into(),
            });
        }
        Ok(())
    }
}

impl Storage for Store {
    fn shown(&self) -> PathBuf {
        self.root.url().into()
    }

    /// The object `name`; for the journal, followed by the parts of its
    /// version in order, up to the first one missing.
    fn read(&self, name: &str) -> Result<Option<Vec<u8>>, OutputError> {
        let object = self.root.child(name)?;
        let mut bytes = match object.get_all() {
            Ok(bytes) => bytes.to_vec(),
            Err(StoreError::NotFound { .. }) => return Ok(None),
            Err(e) => return Err(e.into()),
        };
        if name == JOURNAL_FILE {
            let version = journal_version(&bytes);
            let mut parts: Vec<(u64, String)> = self
                .journal_parts()?
                .into_iter()
                .filter(|(_, v, _)| *v == version)
                .map(|(name, _, n)| (n, name))
                .collect();
            parts.sort();
            for (expected, (n, part)) in (1..).zip(parts) {
                if n != expected {
                    break;
                }
                bytes.extend_from_slice(&self.root.child(&part)?.get_all()?);
            }
        }
        Ok(Some(bytes))
    }

    /// Puts the small file `name` (a single request: atomic). The journal's
    /// parts go after it: it holds their lines now.
    fn put(&self, name: &str, bytes: &[u8]) -> Result<(), OutputError> {
        self.check()?;
        self.root.child(name)?.put(bytes)?;
        self.uploaded().insert(name.to_owned());
        if name == JOURNAL_FILE {
            self.remove_journal_parts()?;
            *self.journal() = Some((journal_version(bytes), 0));
        }
        Ok(())
    }

    /// Object stores have no append: the journal's new lines go up as its
    /// next part (one request: atomic, so never torn). Any other file, or a
    /// journal this run has not put whole, goes up whole again.
    fn append(&self, name: &str, bytes: &[u8], whole: &[u8]) -> Result<(), OutputError> {
        let next = (name == JOURNAL_FILE)
            .then(|| self.journal().clone())
            .flatten()
            .map(|(version, n)| journal_part_name(&version, n + 1));
        let Some(next) = next else {
            return self.put(name, whole);
        };
        self.check()?;
        self.root.child(&next)?.put(bytes)?;
        if let Some((_, n)) = &mut *self.journal() {
            *n += 1;
        }
        Ok(())
    }

    /// Removes the object `name`; for the journal, its parts after it (a
    /// crash in between leaves parts that no journal reads, which the next
    /// run tidies as prep's).
    fn remove(&self, name: &str) -> Result<(), OutputError> {
        self.root.child(name)?.delete()?;
        self.uploaded().remove(name);
        if name == JOURNAL_FILE {
            self.remove_journal_parts()?;
            *self.journal() = None;
        }
        Ok(())
    }

    /// The store's objects; one below a `/` counts as its first folder.
    fn entries(&self) -> Result<Vec<(String, bool)>, OutputError> {
        let mut out: Vec<(String, bool)> = self
            .listing()?
            .into_keys()
            .map(|name| match name.split_once('/') {
                Some((folder, _)) => (folder.to_owned(), true),
                None => (name, false),
            })
            .collect();
        out.sort();
        out.dedup();
        Ok(out)
    }

    fn first_missing<'a>(&self, files: &[(&'a str, u64)]) -> Result<Option<&'a str>, OutputError> {
        let sizes = self.listing()?;
        Ok(files
            .iter()
            .find(|(name, bytes)| sizes.get(*name) != Some(bytes))
            .map(|(name, _)| *name))
    }

    /// A journaled shard is intact when each of its objects is listed with
    /// its recorded size (each went up only after its bytes matched the
    /// recorded checksum, and an upload is atomic).
    fn intact_prefix(&self, shards: &[&ShardInfo]) -> Result<usize, OutputError> {
        let sizes = self.listing()?;
        let intact = shards
            .iter()
            .take_while(|s| {
                shard_files(s)
                    .all(|(name, bytes, sum)| sum.is_some() && sizes.get(name) == Some(&bytes))
            })
            .count();
        let mut uploaded = self.uploaded();
        for s in &shards[..intact] {
            uploaded.extend(shard_files(s).map(|(name, _, _)| name.to_owned()));
        }
        Ok(intact)
    }

    /// Uploads the staged file `name` (once), checked against `expect`
    /// while it is sent, and removes the local copy.
    fn publish(&self, name: &str, expect: Option<(u64, u64)>) -> Result<(), OutputError> {
        if self.uploaded().contains(name) {
            return Ok(());
        }
        self.check()?;
        let path = self.staging.dir().join(name);
        self.root.child(name)?.upload(&path, expect)?;
        self.uploaded().insert(name.to_owned());
        let _ = std::fs::remove_file(&path);
        Ok(())
    }

    fn unlocked(&self) -> bool {
        self.unlocked
    }

    /// Lets the lease go, then the staging folder's lock; after a commit
    /// the staging folder holds nothing the dataset needs and goes, else
    /// it goes only when empty.
    fn release(self: Box<Self>, committed: bool) {
        let store = *self;
        store.lease.release(&store.root);
        let dir = store.staging.dir().to_path_buf();
        Box::new(store.staging).release(committed);
        if committed {
            let _ = std::fs::remove_dir_all(&dir);
        } else {
            let _ = std::fs::remove_dir(&dir);
        }
    }
}

struct Lease {
    /// The version this run last wrote, shared with the heartbeat.
    tag: Arc<Mutex<Tag>>,
    lost: Arc<AtomicBool>,
    stop: Option<mpsc::Sender<()>>,
    heartbeat: Option<std::thread::JoinHandle<()>>,
}

impl Lease {
    /// Takes the lock; also whether it locks nothing (see
    /// [`verify_conditional_writes`]).
    fn acquire(root: &Object, single_writer: bool) -> Result<(Lease, bool), OutputError> {
        let object = root.child(LOCK_FILE)?;
        let lease = lease_secs();
        let body = holder_text(lease);
        let tag = match object.put_if(body.as_bytes(), None)? {
            Some(tag) => tag,
            None => {
                // Held, or left by a run that died: taken over only once
                // its lease has run out, and only from that very version.
                let Some(head) = object.head()? else {
                    // Released between the two requests: try once more.
                    return match object.put_if(body.as_bytes(), None)? {
                        Some(tag) => {
                            let (tag, unlocked) = verify_conditional_writes(
                                root,
                                &object,
                                body.as_bytes(),
                                tag,
                                single_writer,
                            )?;
                            Ok((Lease::start(object, tag, lease), unlocked))
                        }
                        None => Err(locked(root, &object)),
                    };
                };
                let now = SystemTime::now()
                    .duration_since(UNIX_EPOCH)
                    .map_or(0, |d| d.as_secs() as i64);
                let held_for = holder_lease(&object).unwrap_or(LEASE_SECS) as i64;
                if now - head.modified <= held_for {
                    return Err(locked(root, &object));
                }
                match object.put_if(body.as_bytes(), Some(&head.tag))? {
                    Some(tag) => tag,
                    None => return Err(locked(root, &object)),
                }
            }
        };
        let (tag, unlocked) =
            verify_conditional_writes(root, &object, body.as_bytes(), tag, single_writer)?;
        Ok((Lease::start(object, tag, lease), unlocked))
    }

    fn start(object: Object, tag: Tag, lease: u64) -> Lease {
        let tag = Arc::new(Mutex::new(tag));
        let lost = Arc::new(AtomicBool::new(false));
        let (stop, stopped) = mpsc::channel::<()>();
        let every = Duration::from_millis(lease * 1000 / 3).max(Duration::from_millis(200));
        let heartbeat = {
            let (tag, lost) = (Arc::clone(&tag), Arc::clone(&lost));
            std::thread::Builder::new()
                .name("prep-lease".into())
                .spawn(move || {
                    while let Err(mpsc::RecvTimeoutError::Timeout) = stopped.recv_timeout(every) {
                        let mut held = tag.lock().unwrap_or_else(|e| e.into_inner());
                        match object.put_if(holder_text(lease).as_bytes(), Some(&held)) {
                            Ok(Some(new)) => *held = new,
                            Ok(None) => {
                                lost.store(true, Ordering::SeqCst);
                                return;
                            }
                            // A failed request is retried at the next beat;
                            // the lease outlasts two of them.
                            Err(_) => {}
                        }
                    }
                })
                .ok()
        };
        Lease {
            tag,
            lost,
            stop: Some(stop),
            heartbeat,
        }
    }

    /// Stops the heartbeat and removes the lock object if it is still the
    /// version this run wrote.
    fn release(mut self, root: &Object) {
        drop(self.stop.take());
        if let Some(beat) = self.heartbeat.take() {
            let _ = beat.join();
        }
        if self.lost.load(Ordering::SeqCst) {
            return;
        }
        let Ok(object) = root.child(LOCK_FILE) else {
            return;
        };
        let ours = self.tag.lock().unwrap_or_else(|e| e.into_inner()).clone();
        if matches!(object.head(), Ok(Some(head)) if head.tag == ours) {
            let _ = object.delete();
        }
    }
}

/// Proves, once per run, that the store honours the condition the lock
/// rests on: the lock object now exists (this run just wrote it), so a
/// second conditional create of it must fail. A store that accepts it
/// (some S3-compatible stores ignore `If-None-Match`) would let two runs
/// both take the lock: it is refused, unless `single_writer` (or
/// [`SINGLE_WRITER_VAR`]) says the user guarantees one writer. Returns the
/// lock's current version (the probe's, where the store let it through),
/// and whether the lock locks nothing.
fn verify_conditional_writes(
    root: &Object,
    object: &Object,
    body: &[u8],
    tag: Tag,
    single_writer: bool,
) -> Result<(Tag, bool), OutputError> {
    let Some(overwritten) = object.put_if(body, None)? else {
        return Ok((tag, false)); // refused, as it must be
    };
    if single_writer || std::env::var(SINGLE_WRITER_VAR).is_ok_and(|v| v == "1") {
        return Ok((overwritten, true));
    }
    let _ = object.delete();
    Err(OutputError::Refused {
        dir: root.url().into(),
        why: format!(
            "the store accepted a conditional write (PUT If-None-Match: *) of {}, which exists, so its lock cannot keep two runs from writing here at once; if you guarantee a single writer yourself, pass --single-writer (or set {SINGLE_WRITER_VAR}=1)",
            object.url()
        ),
    })
}

fn lease_secs() -> u64 {
    std::env::var(LEASE_VAR)
        .ok()
        .and_then(|v| v.parse::<u64>().ok())
        .filter(|&s| s > 0)
        .unwrap_or(LEASE_SECS)
}

/// What the lock object says: who holds it and for how long a silence
/// means it is gone.
fn holder_text(lease: u64) -> String {
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .or_else(|| std::env::var("HOSTNAME").ok())
        .map(|h| h.trim().to_owned())
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "an unknown host".into());
    format!("pid {} on {host}, lease {lease} s", std::process::id())
}

/// The lease the holder wrote into the lock object.
fn holder_lease(object: &Object) -> Option<u64> {
    let bytes = object.get_all().ok()?;
    let text = std::str::from_utf8(&bytes).ok()?;
    let secs = text.rsplit_once("lease ")?.1.strip_suffix(" s")?;
    secs.parse().ok()
}

fn locked(root: &Object, object: &Object) -> OutputError {
    let holder = object
        .get_all()
        .ok()
        .and_then(|b| String::from_utf8(b.to_vec()).ok())
        .map(|t| t.trim().to_owned())
        .filter(|t| !t.is_empty())
        .unwrap_or_else(|| "holder unknown".into());
    OutputError::Locked {
        dir: root.url().into(),
        holder,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_journal_part_is_named_by_its_version_and_number_and_is_prep_s() {
        let version = journal_version(b"{\"fingerprint\":\"f\"}\n");
        let name = journal_part_name(&version, 7);
        assert_eq!(journal_part(&name), Some((version.as_str(), 7)));
        assert!(super::super::is_prep_file(&name));
        for other in [
            JOURNAL_FILE.to_string(),
            format!("{JOURNAL_FILE}.{version}"),
            format!("{JOURNAL_FILE}.{version}."),
            format!("{JOURNAL_FILE}.{}.1", &version[1..]),
            format!("{JOURNAL_FILE}.{}x.1", &version[1..]),
            format!("{JOURNAL_FILE}.{version}.1a"),
            format!("x{JOURNAL_FILE}.{version}.1"),
        ] {
            assert_eq!(journal_part(&other), None, "{other}");
        }
        assert!(!super::super::is_prep_file(&format!(
            "{JOURNAL_FILE}.{version}.notes"
        )));
    }
}
