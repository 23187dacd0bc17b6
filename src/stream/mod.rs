//! Training straight from object storage: a packed dataset read in blocks
//! of rows through a bounded local cache, in the order of
//! [`BlockOrder`], each rank reading its share, with a resume state that
//! loads on any number of ranks.
//!
//! ```text
//! Stream::open(url, config)      the manifest; the order's parameters
//!   .reader(epoch, share)        one rank's (or DataLoader worker's) records
//!     └─ fetch threads           blocks ahead of the consumer, each once per node
//!          └─ BlockCache         cache_dir: whole, checked blocks under cache_limit
//! ```
//!
//! # Blocks
//!
//! A block is `block` consecutive rows of the dataset (the order's block),
//! with `block = max(1, block_bytes / row_bytes)`. It is fetched as one
//! ranged GET per shard it touches (one, or two at a shard's end), widened
//! to the whole chunks of the shard's `.sum` (FORMAT.md) and checked
//! against them; a range that fails its check is fetched once more, then
//! it is an error naming the object. Only packed datasets stream: their
//! rows have one length, so a block's place in a shard is known without
//! reading its index.
//!
//! # The cache it needs
//!
//! A reader holds at most the window it reads and the next, of each stream
//! it reads: [`BlockOrder::cache_blocks`]. Ranks on one node that share a
//! `cache_dir` need that each, and DataLoader workers of one rank share
//! their rank's blocks; a cache that holds the whole dataset needs no more
//! ([`plan`] has the formula). The block, window and streams a job leaves
//! open are chosen at its first start so that the need fits its
//! `cache_limit` ([`plan::Job::plan`]); a limit no plan fits, or one below
//! what a resumed job's recorded plan needs, is refused when the stream or
//! the reader is made, with the number, instead of thrashing or waiting.

mod cache;
mod fetch;
pub mod plan;
mod reader;

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

pub use cache::{BlockCache, CacheError, CachedBlock, TRAILER_BYTES};
pub use plan::{Plan, DEFAULT_BLOCK_BYTES, DEFAULT_WINDOW};
pub use reader::{Share, StreamReader, StreamRecord};

use crate::format::{Files, FormatError, Manifest, ReadError};
use crate::sampler::{BlockOrder, OrderError};

/// Blocks fetched at once by one reader.
pub const DEFAULT_IN_FLIGHT: usize = 4;

/// Why streaming failed.
#[derive(Debug, thiserror::Error)]
pub enum StreamError {
    /// The dataset's files could not be read (names the file or URL).
    #[error(transparent)]
    Read(#[from] ReadError),
    /// A file's bytes break the format.
    #[error(transparent)]
    Format(#[from] FormatError),
    /// The cache directory failed.
    #[error(transparent)]
    Cache(#[from] CacheError),
    /// The order's parameters do not fit the dataset.
    #[error("{location}: {source}")]
    Order {
        /// The dataset.
        location: String,
        /// Why.
        #[source]
        source: OrderError,
    },
    /// Only packed datasets stream.
    #[error(
        "{location}: a {kind} dataset; streaming reads packed datasets (fixed-length rows, \
         from `prep pack`)"
    )]
    NotPacked {
        /// The dataset.
        location: String,
        /// Its kind.
        kind: String,
    },
    /// A fetched range failed its check twice.
    #[error("{url}: corrupt: {what}")]
    Corrupt {
        /// The object.
        url: String,
        /// Which chunk, or what checksum.
        what: String,
    },
    /// The cache limit is below what the readers sharing it need: with
    /// the plan a resumed job recorded, or the parameters the caller
    /// fixed, or, when prep chose them, the smallest plan there is.
    #[error(
        "cache_limit {limit} bytes is below the {need} bytes {what} needs in {dir}: \
         {local_ranks} rank(s) x 2 windows x {window} block(s) x {streams_read} stream(s) read \
         a rank x {block_bytes} bytes a block, or the whole dataset's {whole} bytes if less; \
         raise cache_limit{hint}"
    )]
    CacheTooSmall {
        /// Which plan: "this job's plan", "the smallest plan".
        what: &'static str,
        /// What else would help, after "raise cache_limit".
        hint: &'static str,
        /// The cache directory.
        dir: PathBuf,
        /// The limit given.
        limit: u64,
        /// The bytes needed.
        need: u64,
        /// Ranks sharing the directory.
        local_ranks: u64,
        /// Blocks per window.
        window: u64,
        /// Streams each rank reads.
        streams_read: u64,
        /// Bytes a block takes in the cache.
        block_bytes: u64,
        /// Bytes the whole dataset takes in the cache.
        whole: u64,
    },
    /// A resume state that belongs to another dataset or seed, or is not
    /// a state.
    #[error("resume state refused: {0}")]
    State(String),
}

/// How a job streams a dataset.
#[derive(Debug, Clone)]
pub struct StreamConfig {
    /// The cache directory (shared by the ranks of a node).
    pub cache_dir: PathBuf,
    /// Bytes the cache directory may hold.
    pub cache_limit: u64,
    /// The shuffle seed.
    pub seed: u64,
    /// Target bytes of rows per block; `None`: chosen ([`plan`]).
    pub block_bytes: Option<u64>,
    /// Blocks per window; `None`: chosen.
    pub window: Option<u64>,
    /// Streams; `None`: chosen. Like the block and the window, fixed when
    /// the job first starts: a resume takes the state's.
    pub streams: Option<u64>,
    /// Blocks a reader fetches at once.
    pub in_flight: usize,
    /// Ranks sharing `cache_dir` (the ranks of one node).
    pub local_ranks: u64,
    /// Ranks in the job when it first starts, for the choice of the plan
    /// (the readers say their own world when they are made).
    pub world: u64,
    /// Pass the blocks of a local dataset through `cache_dir` as a remote
    /// one's are. Off: a local dataset's blocks are read and checked into
    /// memory (the same bound, in memory rather than on disk), which saves
    /// writing every byte into the cache and mapping it again.
    pub cache_local: bool,
}

impl StreamConfig {
    /// The defaults, with the cache at `cache_dir` under `cache_limit` bytes.
    pub fn new(cache_dir: impl Into<PathBuf>, cache_limit: u64) -> StreamConfig {
        StreamConfig {
            cache_dir: cache_dir.into(),
            cache_limit,
            seed: 0,
            block_bytes: None,
            window: None,
            streams: None,
            in_flight: DEFAULT_IN_FLIGHT,
            local_ranks: 1,
            world: 1,
            cache_local: false,
        }
    }
}

/// Where a job stands, as a small plain value: what a checkpoint saves and
/// a resumed job, on any number of ranks, starts from. The order's
/// parameters are in it, so the resumed job reads the same order.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StreamState {
    /// Always `"prep-stream"`.
    pub format: String,
    /// 1.
    pub version: u64,
    /// The dataset's identity: the XXH3-64 of its `manifest.json`.
    pub dataset: String,
    /// The shuffle seed.
    pub seed: u64,
    /// The epoch.
    pub epoch: u64,
    /// Global positions of the epoch consumed by the whole job.
    pub position: u64,
    /// Streams of the order.
    pub streams: u64,
    /// Rows per block.
    pub block: u64,
    /// Blocks per window.
    pub window: u64,
}

/// A packed dataset opened for streaming: its manifest, the order's
/// parameters and the cache.
#[derive(Debug)]
pub struct Stream {
    location: String,
    identity: String,
    manifest: Manifest,
    source: std::sync::Arc<fetch::Source>,
    cache: BlockCache,
    config: StreamConfig,
    row_bytes: u64,
    plan: Plan,
    /// Whether the plan is a state's (a resumed job's).
    resumed: bool,
}

impl Stream {
    /// Opens the dataset at `location` (an object-storage URL or a local
    /// directory). With `state`, the order's parameters are the state's,
    /// and a state of another dataset or seed is refused.
    ///
    /// # Errors
    /// The manifest cannot be read; the dataset is not packed; the order
    /// does not fit it; [`StreamError::State`].
    pub fn open(
        location: &str,
        config: StreamConfig,
        state: Option<&StreamState>,
    ) -> Result<Stream, StreamError> {
        let files = Files::new(std::path::Path::new(location)).map_err(ReadError::from)?;
        let Some(bytes) = files.manifest_bytes("")? else {
            return Err(files.no_manifest().into());
        };
        let manifest_path = files.path_of(crate::format::MANIFEST_FILE);
        let manifest = Manifest::parse(&manifest_path, &bytes)?;
        let identity = crate::format::checksum_hex(xxhash_rust::xxh3::xxh3_64(&bytes));
        let Some(seq_len) = manifest.seq_len.filter(|_| manifest.kind == "packed") else {
            return Err(StreamError::NotPacked {
                location: location.to_owned(),
                kind: manifest.kind.clone(),
            });
        };
        let row_bytes = seq_len * manifest.dtype.size() as u64;
        let job = plan::Job {
            rows: manifest.n_records,
            row_bytes,
            local_ranks: config.local_ranks.max(1),
            world: config.world.max(1),
        };
        let plan = match state {
            Some(s) => {
                check_state(s, &identity, config.seed)?;
                Plan {
                    block: s.block,
                    window: s.window,
                    streams: s.streams,
                }
            }
            None => job
                .plan(
                    config.cache_limit,
                    config.block_bytes,
                    config.window,
                    config.streams,
                )
                .map_err(|smallest| {
                    let fixed = config.block_bytes.is_some()
                        || config.window.is_some()
                        || config.streams.is_some();
                    too_small(
                        &config,
                        &job,
                        smallest,
                        if fixed {
                            "the smallest plan with the block_bytes, window and streams given"
                        } else {
                            "the smallest plan"
                        },
                        if fixed {
                            ", or leave block_bytes, window and streams to prep"
                        } else {
                            ""
                        },
                    )
                })?,
        };
        let cache = BlockCache::open(&config.cache_dir, config.cache_limit)?;
        let source = fetch::Source::new(files, &manifest, row_bytes);
        let stream = Stream {
            location: location.to_owned(),
            identity,
            manifest,
            source: std::sync::Arc::new(source),
            cache,
            config,
            row_bytes,
            plan,
            resumed: state.is_some(),
        };
        stream.order(0)?;
        Ok(stream)
    }

    /// The dataset's address, as given to [`Stream::open`].
    pub fn location(&self) -> &str {
        &self.location
    }

    /// The dataset's directory, when it is a local one (not in object
    /// storage): a reader may then read its rows in place, in this order.
    pub fn local_dir(&self) -> Option<&std::path::Path> {
        (!self.source.is_remote()).then(|| std::path::Path::new(&self.location))
    }

    /// The manifest.
    pub fn manifest(&self) -> &Manifest {
        &self.manifest
    }

    /// Records (rows) in an epoch.
    pub fn len(&self) -> u64 {
        self.manifest.n_records
    }

    /// True when the dataset has no row.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Rows per block.
    pub fn block(&self) -> u64 {
        self.plan.block
    }

    /// The order's block, window and streams: chosen for the cache when
    /// the job first started, or its state's.
    pub fn plan(&self) -> Plan {
        self.plan
    }

    /// The order of epoch `epoch`.
    ///
    /// # Errors
    /// [`StreamError::Order`] when the parameters do not fit the dataset.
    pub fn order(&self, epoch: u64) -> Result<BlockOrder, StreamError> {
        BlockOrder::new(
            self.manifest.n_records,
            self.plan.block,
            self.plan.window,
            self.plan.streams,
            self.config.seed,
            epoch,
        )
        .map_err(|source| StreamError::Order {
            location: self.location.clone(),
            source,
        })
    }

    /// The state of a job at `position` of epoch `epoch`.
    pub fn state(&self, epoch: u64, position: u64) -> StreamState {
        StreamState {
            format: STATE_FORMAT.to_owned(),
            version: 1,
            dataset: self.identity.clone(),
            seed: self.config.seed,
            epoch,
            position,
            streams: self.plan.streams,
            block: self.plan.block,
            window: self.plan.window,
        }
    }

    /// Bytes the cache directory needs for ranks of a world of `world`
    /// (see the [module docs](self)).
    pub fn cache_need(&self, world: u64) -> u64 {
        self.job(world).need(self.plan).bytes
    }

    fn job(&self, world: u64) -> plan::Job {
        plan::Job {
            rows: self.manifest.n_records,
            row_bytes: self.row_bytes,
            local_ranks: self.config.local_ranks.max(1),
            world: world.max(1),
        }
    }

    /// Refuses a cache limit below [`Stream::cache_need`] for `world` ranks.
    ///
    /// # Errors
    /// [`StreamError::CacheTooSmall`], with the numbers.
    pub fn check_cache(&self, world: u64) -> Result<(), StreamError> {
        let job = self.job(world);
        if self.config.cache_limit < job.need(self.plan).bytes {
            let what = if self.resumed {
                "the plan this job recorded in its state"
            } else {
                "this job's plan"
            };
            return Err(too_small(&self.config, &job, self.plan, what, ""));
        }
        Ok(())
    }

    /// The cache.
    pub fn cache(&self) -> &BlockCache {
        &self.cache
    }

    /// A reader of `share` of epoch `epoch` from global position `start`.
    ///
    /// # Errors
    /// [`StreamError::CacheTooSmall`]; the order's error.
    pub fn reader(
        &self,
        epoch: u64,
        start: u64,
        share: Share,
    ) -> Result<StreamReader, StreamError> {
        // Rows stream as tokens alone: masks would be dropped. (The order
        // alone serves any packed dataset: a mapped one with its masks is
        // read in it.)
        let dir = std::path::Path::new(&self.location);
        self.manifest
            .refuse_loss_mask(dir, "streaming from storage")?;
        self.check_cache(share.world)?;
        let order = self.order(epoch)?;
        Ok(StreamReader::new(
            order,
            start,
            share,
            reader::Fetching {
                source: std::sync::Arc::clone(&self.source),
                cache: self.cache.clone(),
                name: format!("{}-{}", &self.identity, self.plan.block),
                block: self.plan.block,
                rows: self.manifest.n_records,
                row_bytes: self.row_bytes,
                in_flight: self.config.in_flight.max(1),
                window_blocks: self.plan.window
                    * self.job(share.world).need(self.plan).streams_read,
                cached: self.source.is_remote() || self.config.cache_local,
            },
        ))
    }
}

const STATE_FORMAT: &str = "prep-stream";

/// The refusal of `config`'s limit for `plan` on `job`.
fn too_small(
    config: &StreamConfig,
    job: &plan::Job,
    plan: Plan,
    what: &'static str,
    hint: &'static str,
) -> StreamError {
    let need = job.need(plan);
    StreamError::CacheTooSmall {
        what,
        hint,
        dir: config.cache_dir.clone(),
        limit: config.cache_limit,
        need: need.bytes,
        local_ranks: job.local_ranks,
        window: plan.window,
        streams_read: need.streams_read,
        block_bytes: need.block_bytes,
        whole: need.whole,
    }
}

fn check_state(s: &StreamState, identity: &str, seed: u64) -> Result<(), StreamError> {
    if s.format != STATE_FORMAT || s.version != 1 {
        return Err(StreamError::State(format!(
            "not a prep stream state of version 1 (format {:?}, version {})",
            s.format, s.version
        )));
    }
    if s.dataset != identity {
        return Err(StreamError::State(format!(
            "it was taken on dataset {} and this one is {identity}",
            s.dataset
        )));
    }
    if s.seed != seed {
        return Err(StreamError::State(format!(
            "it was taken with seed {} and this reader has seed {seed}",
            s.seed
        )));
    }
    if s.block == 0 || s.window == 0 || s.streams == 0 {
        return Err(StreamError::State(
            "block, window and streams must be at least 1".to_owned(),
        ));
    }
    Ok(())
}
