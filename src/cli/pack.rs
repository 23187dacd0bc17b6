//! `prep pack`: flags to a [`PackConfig`], then the summary.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, ValueEnum};

use super::write_flags::WriteFlags;

use prep::pack::{self, PackConfig, PackMode, DEFAULT_WINDOW};
use prep::partition::Part;
use prep::size::format_bytes;

/// Pack the documents of a dataset into rows of exactly --seq-len tokens.
///
/// bestfit (the default) cuts only documents longer than a row and packs
/// whole documents into rows by best-fit decreasing, padding the rest of each
/// row; concat lays documents end to end and cuts every --seq-len tokens.
/// Every shard gets a segment index (.seg) saying where each document piece
/// starts in each row. Interrupted runs resume after their last complete
/// shard when started again with the same arguments.
///
/// With --part I/N, task I of N writes its share of the rows (concat) or of
/// the windows (bestfit); prep merge joins parts 0..N-1 into exactly the
/// dataset one run without --part writes.
#[derive(Debug, Parser)]
#[command(
    after_help = sizes_then!("Exit codes: 0 success, 2 usage, input or I/O error.")
)]
pub(crate) struct Args {
    /// The documents dataset to pack (from prep tokenize or prep shuffle).
    #[arg(value_name = "IN")]
    input: PathBuf,

    /// The packed dataset to write.
    #[arg(value_name = "OUT")]
    output: PathBuf,

    /// Tokens per row. For a model of context C trained on shifted targets
    /// within a row, use C + 1.
    #[arg(long, value_name = "L")]
    seq_len: u32,

    /// How documents become rows.
    #[arg(long, value_enum, default_value_t = Mode::Bestfit)]
    mode: Mode,

    /// Token filling the rest of a row: a token string or an id.
    /// [default: the input's pad token, else its eos]
    #[arg(long, value_name = "TOKEN")]
    pad: Option<String>,

    /// Token to add after every document, for an input whose documents do
    /// not end with eos.
    #[arg(long, value_name = "TOKEN")]
    sep: Option<String>,

    /// Pack an input without eos as it is, with nothing between documents.
    #[arg(long, conflicts_with = "sep")]
    no_sep: bool,

    /// Seed of the row order. concat keeps the input order without it;
    /// bestfit always shuffles each window's rows. [default for bestfit: 0]
    #[arg(long, value_name = "S")]
    seed: Option<u64>,

    /// bestfit: documents packed together in one window; larger windows pad
    /// a little less and take more memory (about 40 bytes per piece).
    #[arg(long, value_name = "N")]
    window: Option<u64>,

    /// concat: pad the last partial row instead of dropping it.
    #[arg(long)]
    pad_last: bool,

    #[command(flatten)]
    write: WriteFlags,

    /// Threads for planning bestfit windows; 0 uses every core. The output is
    /// the same for any value.
    #[arg(long, short = 't', value_name = "N", default_value_t = 0)]
    threads: usize,

    /// Write only part I of N (0 <= I < N) into OUT, for prep merge to join:
    /// concat splits the rows, bestfit the windows of --window documents
    /// (so at most that many parts have work; the others write an empty
    /// dataset).
    #[arg(long, value_name = "I/N")]
    part: Option<Part>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Mode {
    /// End to end, cut every L tokens (Megatron-LM, nanoGPT, llm.c).
    Concat,
    /// Whole documents by best-fit decreasing, rows padded.
    Bestfit,
}

pub(crate) fn run(args: Args) -> anyhow::Result<ExitCode> {
    let mut config = PackConfig::new(args.input, args.output, args.seq_len);
    config.mode = match args.mode {
        Mode::Concat => PackMode::Concat,
        Mode::Bestfit => PackMode::BestFit,
    };
    if args.mode == Mode::Concat && args.window.is_some() {
        anyhow::bail!("--window applies to --mode bestfit");
    }
    config.pad = args.pad;
    config.sep = args.sep;
    config.no_sep = args.no_sep;
    config.seed = args.seed;
    config.window = args.window.unwrap_or(DEFAULT_WINDOW);
    config.pad_last = args.pad_last;
    config.writing = args.write.writing();
    config.threads = args.threads;
    config.part = args.part;
    let bar = super::progress::Bar::new(args.write.quiet);
    let r = pack::run(&config, &bar)?;
    if !args.write.quiet && !r.already_complete {
        let m = &r.manifest;
        let p = m.packing.as_ref().expect("pack writes packing");
        let secs = r.elapsed.as_secs_f64().max(1e-9);
        let part = args.part.map_or(String::new(), |p| format!(" (part {p})"));
        let order = match p.seed {
            None => "in input order".to_owned(),
            Some(s) => format!("in an order shuffled with seed {s}"),
        };
        eprintln!(
            "Packed{part} {} documents into {} rows of {} tokens ({}, {order}) in {:.1}s: {:.1}M tokens/s.\n\
             Padding: {} tokens ({:.2}%). Documents cut: {} ({:.2}%). Pieces: {}. Tokens dropped: {}.\n\
             Wrote {} in {} ({}).{}",
            p.documents,
            p.rows,
            config.seq_len,
            p.mode,
            secs,
            m.n_tokens as f64 / 1e6 / secs,
            p.pad_tokens,
            p.pad_share * 100.0,
            p.documents_cut,
            if p.documents == 0 { 0.0 } else { p.documents_cut as f64 * 100.0 / p.documents as f64 },
            p.pieces,
            p.tokens_dropped,
            config.output.display(),
            super::count(m.shards.len() as u64, "shard"),
            format_bytes(m.shards.iter().map(|s| s.bin_bytes).sum()),
            prep::util::peak_rss_bytes()
                .map_or(String::new(), |b| format!(" Peak memory {}.", format_bytes(b))),
        );
    }
    Ok(ExitCode::SUCCESS)
}
