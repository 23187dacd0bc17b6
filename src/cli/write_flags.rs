//! The flags of every command that writes shards (tokenize, shuffle, pack,
//! mix, split, import), declared once and flattened into each.
//!
//! `--threads` and `--part` are not here: what a thread does and what a
//! part divides differ by command, and each command's help says which.

use prep::run::Writing;
use prep::size::parse_size;

/// `--shard-size`, `--overwrite`, `--quiet`, `--single-writer`.
#[derive(Debug, clap::Args)]
pub(crate) struct WriteFlags {
    /// Largest .bin per output shard.
    #[arg(long, value_name = "SIZE", default_value = "1GiB", value_parser = parse_size)]
    pub(crate) shard_size: u64,

    /// Replace what is in the output directory (only prep's own files are removed).
    #[arg(long)]
    pub(crate) overwrite: bool,

    /// No progress bar or summary; warnings and errors are still printed.
    #[arg(long, short = 'q')]
    pub(crate) quiet: bool,

    /// You guarantee this run is the output's only writer: write to an object
    /// store that does not honour conditional writes, where prep's lock locks
    /// nothing (refused without it); the manifest records it.
    #[arg(long)]
    pub(crate) single_writer: bool,
}

impl WriteFlags {
    /// The library's options for these flags.
    pub(crate) fn writing(&self) -> Writing {
        Writing {
            shard_size: self.shard_size,
            overwrite: self.overwrite,
            single_writer: self.single_writer,
        }
    }
}
