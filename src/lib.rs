//! prep: offline dataset preparation for LLM pretraining.
//!
//! prep turns raw text (JSONL, plain or compressed, Parquet and Arrow) into token
//! datasets that training code maps without copying. The work flows one way:
//! [`input`] reads documents, [`tokenize`] turns them into ids with a
//! HuggingFace tokenizer, and [`mod@format`] writes and reads the shards; the
//! format itself is specified in [`mod@format`]'s documentation.
//!
//! Everything the `prep` binary does can be done from Rust: each subcommand
//! builds a config (for example [`tokenize::TokenizeConfig`]) and calls the
//! library.
#![deny(missing_docs)]

pub mod chat;
pub mod dedup;
pub mod fetch;
pub mod input;
pub mod inspect;
pub mod interop;
pub mod loader;
pub mod merge;
pub mod mix;
pub mod output;
pub mod pack;
pub mod partition;
pub mod progress;
pub mod run;
pub mod shuffle;
pub mod size;
pub mod split;
pub mod stream;
pub mod task;
pub mod tokenize;
pub mod tokenize_then_shuffle;
pub mod util;
pub mod validate;

/// The dataset format, its reader and writer, the training orders and object
/// storage: the crate `prep_reader` (crates/reader), a crate of its own so
/// that Rust training code reads prep datasets without building the rest.
pub use prep_reader::{format, permute, sampler, store};

pub use format::{Dataset, Dtype, FormatError, Manifest, Tokens};

/// The fast encoding engine, and the loading of a `tokenizer.json` every stage
/// shares: the crate `prep_engine` (crates/engine), a crate of its own so that
/// the dev profile builds it optimised.
pub use prep_engine as engine;

/// The README's code blocks: any Rust among them compiles (`cargo test --doc`).
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeExamples;

/// The guide's Rust examples compile too: one include per page of docs/
/// that holds a Rust code block.
#[cfg(doctest)]
#[doc = include_str!("../docs/reading.md")]
struct GuideReading;

/// The streaming page's Rust example compiles too.
#[cfg(doctest)]
#[doc = include_str!("../docs/streaming.md")]
struct GuideStreaming;
