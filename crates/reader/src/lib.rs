//! prep-reader: prep's dataset format, its reader and writer, and the
//! orders training reads it in, for Rust training code that depends on
//! this crate alone (no command line, no tokenizers, no Arrow or Parquet).
//!
//! - [`mod@format`]: the on-disk format (specified in its documentation),
//!   [`Dataset`] mapping a local dataset and handing out records with no
//!   copy, the checks that judge a shard intact, and the writer;
//! - [`sampler`]: [`sampler::Sampler`], one rank's share of a seeded full
//!   permutation per epoch, and [`sampler::BlockOrder`], the order every
//!   training reader of prep reads (blocks permuted, dealt to streams read
//!   round-robin, rows shuffled within windows): the same rows in the same
//!   order from a local directory, from object storage and into GPU memory;
//! - [`permute`]: the keyed Feistel permutation both build on.
//!
//! With the feature `store`, datasets in object storage (`s3://`, `gs://`,
//! `az://`, `https://`) are read too ([`store`], and `format::Files`); the
//! `prep` crate turns it on. Without it the crate builds with serde,
//! memmap2, xxhash-rust and thiserror alone.
//!
//! ```
//! use prep_reader::sampler::{BlockOrder, Sampler};
//! use prep_reader::Dataset;
//!
//! let ds = Dataset::open("../../fixtures/validate/good")?;
//! let (rank, world) = (1, 2);
//! // The full permutation of epoch 0, this rank's share.
//! for i in Sampler::new(ds.len(), 1234, 0, rank, world).iter() {
//!     let tokens = ds.record(i)?; // a view of the mapped shard: no copy
//!     assert!(!tokens.is_empty());
//! }
//! // The order prep's training readers read (`prep.StreamingDataset`,
//! // `PackedDataset`, `DeviceLoader`): blocks of 4 rows, windows of 2 blocks,
//! // 3 streams, as a reader's state records them.
//! let order = BlockOrder::new(ds.len(), 4, 2, 3, 1234, 0).expect("a valid order");
//! let mine: Vec<u64> = order.positions(0, rank, world).map(|g| order.get(g)).collect();
//! assert_eq!(mine.len() as u64, ds.len() / 2);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
#![deny(missing_docs)]

pub mod format;
pub mod permute;
pub mod sampler;
#[cfg(feature = "store")]
pub mod store;
pub mod time;

pub use format::{Dataset, Dtype, FormatError, Manifest, Tokens};
