//! prep's integration tests, linked into one binary (`cargo test --test it`):
//! one module per area, each run against the built `prep` command and the
//! library. One binary instead of one per file: each links the whole
//! dependency tree, and linking dominated the test build.
//!
//! A module's tests: `cargo test --test it pack::` (or `cargo nextest run
//! -E 'test(/^pack::/)'`). The slow tests `make check` skips and the ones
//! only `make test-slow` runs are listed in tests/tiers.txt.

/// The allocator the command itself runs on (src/main.rs), here for the
/// tests that load and encode in this process: the engine's differential
/// tests spent about a third of their time in glibc's malloc and free.
/// (Memory bounds are measured in the child `prep` processes, from their
/// own summaries, whatever this process allocates with.)
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

mod common;

mod chat;
mod dedup;
mod engine;
mod engine_sentencepiece;
mod engine_unigram;
mod engine_wordpiece;
mod errors;
mod format;
mod golden;
mod gpu;
mod inspect;
mod interop;
mod lifecycle;
mod loader;
mod merge;
mod mix;
mod mounts;
mod pack;
mod pack_part;
mod reader;
mod shuffle;
mod shuffle_dist;
mod split;
mod stages_golden;
mod stream;
mod tokenize;
mod tokenize_errors;
mod tokenize_inputs;
mod tokenizer_cache;
mod tokenizer_defaults;
mod validate;
