//! The block cache of a streaming reader: a directory of whole, checked
//! blocks that the processes of one node share, never above a byte limit.
//!
//! - **Whole blocks only.** A block is written as `NAME.part`, then renamed
//!   to `NAME.blk`: a reader sees a whole block or none. The file ends with
//!   a trailer holding the XXH3-64 of its bytes, checked whenever a process
//!   takes a block it did not write (a block left by an earlier run, or by
//!   another process), so a block torn by a crash is fetched again, never
//!   read.
//! - **Each block fetched once per node.** A process fetches a block while
//!   holding an exclusive `flock` on the block's lock file; a process that
//!   wants the same block waits on that lock and then finds the block
//!   there. The kernel drops the lock of a killed process, so nothing
//!   waits forever on a dead one. Lock files are striped
//!   ([`LOCK_STRIPES`] files, by a hash of the block's name) so that the
//!   directory holds a bounded number of them whatever the dataset's size.
//! - **The limit.** Space is reserved before a fetch: under the directory's
//!   budget lock, blocks are evicted least recently used first (a block's
//!   modification time is set each time a process starts reading it) until
//!   the new block fits, and the `.part` file is created at its full size.
//!   So the sum of the sizes of the files in the directory never exceeds
//!   the limit. Removing a block another process has mapped is safe: its
//!   mapping stays valid until it lets the block go.
//!
//! No shared memory and no daemon: everything the processes agree on is in
//! the directory.

use std::fs::{File, OpenOptions};
use std::io::Write;
use std::os::fd::AsFd;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant, SystemTime};

use xxhash_rust::xxh3::xxh3_64;

use crate::format::MappedFile;

/// Lock files a cache directory holds at most.
pub const LOCK_STRIPES: u64 = 256;

/// Bytes after a block's data: the magic, then the XXH3-64 of the data.
pub const TRAILER_BYTES: u64 = 16;
const TRAILER_MAGIC: &[u8; 8] = b"PREPBLK\0";

/// How long a fetch waits for others' downloads to make room before it
/// gives up (only possible when several processes share a directory whose
/// limit is below what they need together).
const ROOM_WAIT: Duration = Duration::from_secs(120);

/// Why the cache failed.
#[derive(Debug, thiserror::Error)]
pub enum CacheError {
    /// A file of the cache could not be created, read, locked or renamed.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The failure.
        #[source]
        source: std::io::Error,
    },
    /// The other processes' blocks filled the directory for too long.
    #[error(
        "{dir}: no room for a block of {need} bytes under the cache limit of {limit} bytes \
         after {waited:?}: the processes sharing this cache need more than its limit; \
         raise cache_limit or give each its own cache_dir"
    )]
    Full {
        /// The cache directory.
        dir: PathBuf,
        /// The block's size with its trailer.
        need: u64,
        /// The limit.
        limit: u64,
        /// How long the fetch waited.
        waited: Duration,
    },
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> CacheError + '_ {
    move |source| CacheError::Io {
        path: path.to_path_buf(),
        source,
    }
}

/// A block in the cache, mapped: its data, without the trailer.
#[derive(Debug)]
pub struct CachedBlock {
    data: BlockData,
}

/// Where a block's bytes are.
#[derive(Debug)]
enum BlockData {
    /// A block file of the cache directory, mapped (its data, then the
    /// trailer).
    Mapped { map: MappedFile, len: usize },
    /// Read into memory, not cached: a block of a local dataset.
    Memory(Vec<u8>),
}

impl CachedBlock {
    /// A block held in memory rather than in the cache directory.
    pub fn in_memory(bytes: Vec<u8>) -> CachedBlock {
        CachedBlock {
            data: BlockData::Memory(bytes),
        }
    }

    /// The block's bytes.
    pub fn bytes(&self) -> &[u8] {
        match &self.data {
            BlockData::Mapped { map, len } => &map.bytes()[..*len],
            BlockData::Memory(bytes) => bytes,
        }
    }
}

/// A cache directory and its limit (see the [module docs](self)).
#[derive(Debug, Clone)]
pub struct BlockCache {
    dir: PathBuf,
    limit: u64,
}

impl BlockCache {
    /// The cache in `dir`, holding at most `limit` bytes of files; the
    /// directory is created when the first block is stored.
    ///
    /// # Errors
    /// None now; kept fallible for the caches that check more at open.
    pub fn open(dir: &Path, limit: u64) -> Result<BlockCache, CacheError> {
        // The directory is made when the first lock is taken (a block is
        // stored): a job that reads only local rows leaves no trace there.
        Ok(BlockCache {
            dir: dir.to_path_buf(),
            limit,
        })
    }

    /// The directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The limit in bytes.
    pub fn limit(&self) -> u64 {
        self.limit
    }

    /// The block `name`, from the cache when it holds it whole, else
    /// fetched by `fetch` (which returns exactly `len` bytes) and stored.
    /// At most one process of those sharing the directory fetches a given
    /// block at a time; the others wait for it and take its file.
    ///
    /// # Errors
    /// The cache's own failures, or `fetch`'s error, converted.
    pub fn get_or_fetch<E: From<CacheError>>(
        &self,
        name: &str,
        len: u64,
        fetch: impl FnOnce() -> Result<Vec<u8>, E>,
    ) -> Result<CachedBlock, E> {
        let path = self.dir.join(format!("{name}.blk"));
        if let Some(block) = self.take(&path, len)? {
            return Ok(block);
        }
        let _lock = self.lock(name)?;
        // Whoever held the lock before may have stored it meanwhile.
        if let Some(block) = self.take(&path, len)? {
            return Ok(block);
        }
        let part = self.dir.join(format!("{name}.part"));
        let mut file = self.reserve(&part, len + TRAILER_BYTES)?;
        let stored = (|| {
            let bytes = fetch()?;
            assert_eq!(
                bytes.len() as u64,
                len,
                "a fetch returns the block's length"
            );
            file.write_all(&bytes).map_err(io(&part))?;
            let mut trailer = [0u8; TRAILER_BYTES as usize];
            trailer[..8].copy_from_slice(TRAILER_MAGIC);
            trailer[8..].copy_from_slice(&xxh3_64(&bytes).to_le_bytes());
            file.write_all(&trailer).map_err(io(&part))?;
            drop(file);
            // Under the budget lock, so that a listing made under it never
            // sees the block under both names, or under neither; and mapped
            // before the lock is let go, so that no eviction comes between.
            // The bytes were checked as fetched and hashed for the trailer
            // just now: not hashed a third time.
            let _budget = self.budget()?;
            std::fs::rename(&part, &path).map_err(io(&path))?;
            let map = map(&path)?;
            Ok::<_, E>(CachedBlock {
                data: BlockData::Mapped {
                    map,
                    len: len as usize,
                },
            })
        })();
        if stored.is_err() {
            let _ = std::fs::remove_file(&part);
        }
        stored
    }

    /// The block at `path` when it is there, whole and of `len` bytes
    /// (its recency renewed); a block that fails its check is removed.
    fn take(&self, path: &Path, len: u64) -> Result<Option<CachedBlock>, CacheError> {
        let file = match File::open(path) {
            Ok(f) => f,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(io(path)(e)),
        };
        let _ = file.set_modified(SystemTime::now());
        let map = map(path)?;
        let bytes = map.bytes();
        let whole = bytes.len() as u64 == len + TRAILER_BYTES && {
            let (data, trailer) = bytes.split_at(len as usize);
            trailer[..8] == TRAILER_MAGIC[..] && trailer[8..] == xxh3_64(data).to_le_bytes()
        };
        if !whole {
            // A block torn by a crash, or damaged on disk: fetched again.
            let _ = std::fs::remove_file(path);
            return Ok(None);
        }
        Ok(Some(CachedBlock {
            data: BlockData::Mapped {
                map,
                len: len as usize,
            },
        }))
    }

    /// The exclusive lock of block `name`'s stripe, held while the guard lives.
    fn lock(&self, name: &str) -> Result<File, CacheError> {
        let path = self.stripe(name);
        let file = open_lock(&path)?;
        flock(&file, &path, true)?;
        Ok(file)
    }

    fn stripe(&self, name: &str) -> PathBuf {
        let stripe = xxh3_64(name.as_bytes()) % LOCK_STRIPES;
        self.dir.join(".locks").join(format!("{stripe:03}.lock"))
    }

    /// The directory's budget lock, held while the guard lives: taken to
    /// reserve space, to rename a block into place and to count the bytes.
    fn budget(&self) -> Result<File, CacheError> {
        let path = self.dir.join(".locks").join("budget.lock");
        let file = open_lock(&path)?;
        flock(&file, &path, true)?;
        Ok(file)
    }

    /// Makes room for `need` bytes and creates `part` at that size.
    fn reserve(&self, part: &Path, need: u64) -> Result<File, CacheError> {
        let started = Instant::now();
        loop {
            {
                let _budget = self.budget()?;
                if self.evict_for(need, part)? {
                    let file = OpenOptions::new()
                        .write(true)
                        .create(true)
                        .truncate(true)
                        .open(part)
                        .map_err(io(part))?;
                    file.set_len(need).map_err(io(part))?;
                    return Ok(file);
                }
            }
            if started.elapsed() > ROOM_WAIT {
                return Err(CacheError::Full {
                    dir: self.dir.clone(),
                    need,
                    limit: self.limit,
                    waited: started.elapsed(),
                });
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Evicts blocks, least recently used first, until `need` more bytes
    /// fit; removes `.part` files whose fetch died with its process. False
    /// when the rest is all downloads in progress.
    fn evict_for(&self, need: u64, part: &Path) -> Result<bool, CacheError> {
        let mut blocks = Vec::new();
        let mut used = 0u64;
        for entry in std::fs::read_dir(&self.dir).map_err(io(&self.dir))? {
            let entry = entry.map_err(io(&self.dir))?;
            let path = entry.path();
            let Ok(meta) = entry.metadata() else { continue };
            if !meta.is_file() {
                continue;
            }
            let name = entry.file_name().to_string_lossy().into_owned();
            if let Some(stem) = name.strip_suffix(".part") {
                // A stale part (its stripe free, so no fetch holds it), or
                // the one this fetch is about to reuse.
                if path == part || self.stripe_free(stem)? {
                    let _ = std::fs::remove_file(&path);
                    continue;
                }
            } else if name.ends_with(".blk") {
                let at = meta.modified().unwrap_or(SystemTime::UNIX_EPOCH);
                blocks.push((at, meta.len(), path.clone()));
            }
            used += meta.len();
        }
        blocks.sort();
        let mut oldest = blocks.into_iter();
        while used + need > self.limit {
            let Some((_, len, path)) = oldest.next() else {
                return Ok(false);
            };
            match std::fs::remove_file(&path) {
                Ok(()) => used -= len,
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => used -= len,
                Err(e) => return Err(io(&path)(e)),
            }
        }
        Ok(true)
    }

    /// Whether nobody holds the lock of block `name`'s stripe.
    fn stripe_free(&self, name: &str) -> Result<bool, CacheError> {
        let path = self.stripe(name);
        let file = open_lock(&path)?;
        flock(&file, &path, false)
    }

    /// Bytes of the files in the directory now (its lock files are empty),
    /// counted under the budget lock.
    ///
    /// # Errors
    /// The directory cannot be listed.
    pub fn used(&self) -> Result<u64, CacheError> {
        let _budget = self.budget()?;
        let mut used = 0;
        for entry in std::fs::read_dir(&self.dir).map_err(io(&self.dir))? {
            let entry = entry.map_err(io(&self.dir))?;
            if let Ok(meta) = entry.metadata() {
                if meta.is_file() {
                    used += meta.len();
                }
            }
        }
        Ok(used)
    }
}

/// The file at `path`, mapped.
fn map(path: &Path) -> Result<MappedFile, CacheError> {
    MappedFile::open(path).map_err(|e| CacheError::Io {
        path: path.to_path_buf(),
        source: std::io::Error::other(e.to_string()),
    })
}

fn open_lock(path: &Path) -> Result<File, CacheError> {
    if let Some(locks) = path.parent() {
        std::fs::create_dir_all(locks).map_err(io(locks))?;
    }
    OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(path)
        .map_err(io(path))
}

/// An exclusive `flock` on `file`: waiting for it (`wait`), or tried once,
/// returning whether it was taken.
fn flock(file: &File, path: &Path, wait: bool) -> Result<bool, CacheError> {
    use rustix::fs::FlockOperation;
    let op = if wait {
        FlockOperation::LockExclusive
    } else {
        FlockOperation::NonBlockingLockExclusive
    };
    loop {
        match rustix::fs::flock(file.as_fd(), op) {
            Ok(()) => return Ok(true),
            Err(rustix::io::Errno::INTR) => continue,
            Err(rustix::io::Errno::WOULDBLOCK) if !wait => return Ok(false),
            Err(e) => return Err(io(path)(e.into())),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bytes(seed: u8, len: usize) -> Vec<u8> {
        (0..len)
            .map(|i| (i as u8).wrapping_mul(31) ^ seed)
            .collect()
    }

    #[test]
    fn a_block_is_fetched_once_and_then_read_from_disk() {
        let dir = tempfile::tempdir().unwrap();
        let cache = BlockCache::open(dir.path(), 1 << 20).unwrap();
        let mut fetches = 0;
        for _ in 0..3 {
            let block = cache
                .get_or_fetch::<CacheError>("a-0", 1000, || {
                    fetches += 1;
                    Ok(bytes(1, 1000))
                })
                .unwrap();
            assert_eq!(block.bytes(), &bytes(1, 1000)[..]);
        }
        assert_eq!(fetches, 1);
        assert_eq!(cache.used().unwrap(), 1000 + TRAILER_BYTES);
    }

    #[test]
    fn the_directory_stays_under_its_limit_evicting_the_least_recent() {
        let dir = tempfile::tempdir().unwrap();
        let limit = 3 * (1000 + TRAILER_BYTES);
        let cache = BlockCache::open(dir.path(), limit).unwrap();
        for i in 0..10u8 {
            let name = format!("a-{i}");
            cache
                .get_or_fetch::<CacheError>(&name, 1000, || Ok(bytes(i, 1000)))
                .unwrap();
            assert!(cache.used().unwrap() <= limit);
            // Block 0 is used again and again: the most recent, never evicted.
            std::thread::sleep(Duration::from_millis(5));
            cache
                .get_or_fetch::<CacheError>("a-0", 1000, || Ok(bytes(0, 1000)))
                .unwrap();
            std::thread::sleep(Duration::from_millis(5));
        }
        assert!(dir.path().join("a-0.blk").exists());
        assert!(dir.path().join("a-9.blk").exists());
        assert!(!dir.path().join("a-5.blk").exists());
    }

    #[test]
    fn a_torn_or_damaged_block_is_fetched_again() {
        let dir = tempfile::tempdir().unwrap();
        let cache = BlockCache::open(dir.path(), 1 << 20).unwrap();
        cache
            .get_or_fetch::<CacheError>("a-0", 100, || Ok(bytes(0, 100)))
            .unwrap();
        let path = dir.path().join("a-0.blk");
        let mut on_disk = std::fs::read(&path).unwrap();
        on_disk[7] ^= 1;
        std::fs::write(&path, &on_disk).unwrap();
        // A stale part left by a killed fetch is not a block, and goes.
        std::fs::write(dir.path().join("a-1.part"), [0u8; 50]).unwrap();
        let mut fetched = false;
        let block = cache
            .get_or_fetch::<CacheError>("a-0", 100, || {
                fetched = true;
                Ok(bytes(0, 100))
            })
            .unwrap();
        assert!(fetched);
        assert_eq!(block.bytes(), &bytes(0, 100)[..]);
        assert!(!dir.path().join("a-1.part").exists());
    }

    #[test]
    fn a_failed_fetch_leaves_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let cache = BlockCache::open(dir.path(), 1 << 20).unwrap();
        let err = cache
            .get_or_fetch::<CacheError>("a-0", 100, || {
                Err(CacheError::Io {
                    path: "x".into(),
                    source: std::io::Error::other("gone"),
                })
            })
            .unwrap_err();
        assert!(err.to_string().contains("gone"));
        assert_eq!(cache.used().unwrap(), 0);
    }

    #[test]
    fn threads_wanting_one_block_fetch_it_once() {
        let dir = tempfile::tempdir().unwrap();
        let cache = BlockCache::open(dir.path(), 1 << 20).unwrap();
        let fetches = std::sync::atomic::AtomicUsize::new(0);
        std::thread::scope(|s| {
            for _ in 0..8 {
                s.spawn(|| {
                    let block = cache
                        .get_or_fetch::<CacheError>("a-0", 5000, || {
                            fetches.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                            std::thread::sleep(Duration::from_millis(50));
                            Ok(bytes(3, 5000))
                        })
                        .unwrap();
                    assert_eq!(block.bytes(), &bytes(3, 5000)[..]);
                });
            }
        });
        assert_eq!(fetches.into_inner(), 1);
    }
}
