//! `prep export`: a prep dataset in a format another trainer loads.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Instant;

use clap::{Parser, ValueEnum};

use prep::interop::{self, ExportConfig, Format};
use prep::size::format_bytes;

/// Write a dataset in the token-file format of another trainer.
///
/// megatron: OUT.bin + OUT.idx (Megatron-LM / NeMo MMIDIDX; uint32 datasets
/// as int32). nanogpt: OUT, one flat file of uint16 tokens. llmc: the
/// directory OUT of llm.c shards NAME_train_NNNNNN.bin (and NAME_val_000000.bin
/// with --val-tokens). datatrove: OUT.ds + OUT.ds.index + OUT.ds.metadata.
/// olmo-core: the directory OUT of token_ids_part_NNNN.npy,
/// labels_mask_part_NNNN.npy and token_ids_part_NNNN.csv.gz (OLMo-core's
/// fine-tuning input, as open-instruct writes it). Records are written in dataset order; packed datasets export row by row.
#[derive(Debug, Parser)]
#[command(
    after_help = "Exit codes: 0 success, 2 usage error, a dataset that cannot be read, or one the format cannot hold."
)]
pub(crate) struct Args {
    /// The prep dataset.
    #[arg(value_name = "DIR")]
    dir: PathBuf,

    /// The format to write.
    #[arg(long = "to", value_enum)]
    to: FormatArg,

    /// Output: a path prefix (megatron, datatrove), a file (nanogpt) or a
    /// directory (llmc, olmo-core).
    #[arg(value_name = "OUT")]
    output: PathBuf,

    /// llmc: shard name prefix.
    #[arg(long, default_value = "prep")]
    name: String,

    /// llmc: tokens per shard, at most (uint16 shards: up to 1073741311,
    /// what llm.c's C loader can seek within).
    #[arg(long, value_name = "N", default_value_t = 100_000_000)]
    shard_tokens: u64,

    /// llmc: B × T × processes of the llm.c run; every shard is made to
    /// hold more tokens than that (llm.c aborts at start-up otherwise), or
    /// the export is refused.
    #[arg(long, value_name = "N")]
    batch_tokens: Option<u64>,

    /// llmc: tokens of a validation shard split off the start (0: none).
    #[arg(long, value_name = "N", default_value_t = 0)]
    val_tokens: u64,

    /// llmc: put each document's end-of-text token before it, as llm.c's
    /// scripts do (prep keeps it after). Documents datasets only.
    #[arg(long)]
    eot_first: bool,

    /// datatrove: the tokenizer name written in the metadata.
    #[arg(long, default_value = "prep")]
    tokenizer_name: String,

    /// Replace existing output files.
    #[arg(long)]
    overwrite: bool,

    /// No summary.
    #[arg(long, short = 'q')]
    quiet: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub(crate) enum FormatArg {
    /// Megatron-LM / NeMo indexed dataset (.bin + .idx).
    Megatron,
    /// nanoGPT flat uint16 file.
    Nanogpt,
    /// llm.c token shards.
    Llmc,
    /// datatrove / nanotron (.ds, .ds.index, .ds.metadata).
    Datatrove,
    /// OLMo-core fine-tuning files (token ids, label masks, document
    /// boundaries), as open-instruct writes them.
    OlmoCore,
}

impl FormatArg {
    pub(crate) fn format(self) -> Format {
        match self {
            FormatArg::Megatron => Format::Megatron,
            FormatArg::Nanogpt => Format::NanoGpt,
            FormatArg::Llmc => Format::Llmc,
            FormatArg::Datatrove => Format::Datatrove,
            FormatArg::OlmoCore => Format::OlmoCore,
        }
    }
}

pub(crate) fn run(args: Args) -> anyhow::Result<ExitCode> {
    let format = args.to.format();
    let mut config = ExportConfig::new(args.dir, format, args.output);
    config.name = args.name;
    config.shard_tokens = args.shard_tokens;
    config.val_tokens = args.val_tokens;
    config.eot_first = args.eot_first;
    config.batch_tokens = args.batch_tokens;
    config.tokenizer_name = args.tokenizer_name;
    config.overwrite = args.overwrite;
    if format != Format::Llmc
        && (config.eot_first || config.val_tokens > 0 || config.batch_tokens.is_some())
    {
        anyhow::bail!("--eot-first, --val-tokens and --batch-tokens apply to --to llmc");
    }
    let started = Instant::now();
    let r = interop::export(&config)?;
    if !args.quiet {
        let secs = started.elapsed().as_secs_f64().max(1e-9);
        eprintln!(
            "Exported {} records ({} tokens) as {} in {:.1}s ({:.0} MB/s): {} in {} files, from {} to {}.",
            r.records,
            r.tokens,
            format.name(),
            secs,
            r.bytes as f64 / 1e6 / secs,
            format_bytes(r.bytes),
            r.files.len(),
            r.files.first().map_or(String::new(), |f| f.display().to_string()),
            r.files.last().map_or(String::new(), |f| f.display().to_string()),
        );
    }
    Ok(ExitCode::SUCCESS)
}
