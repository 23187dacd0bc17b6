//! `prep inspect`: what a dataset holds.

use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;

use clap::Parser;

use prep::format::{Packing, Segment};
use prep::inspect::{self, Inspection, Lengths, Overflow, RecordView, ShardRow};
use prep::size::format_bytes;

/// Show what a dataset holds: its kind, dtype, tokenizer, special tokens,
/// counts, shards, the distribution of record lengths, and how many tokens
/// sit in documents longer than common context lengths.
#[derive(Debug, Parser)]
#[command(
    after_help = "Exit codes: 0 success, 2 the dataset cannot be opened or the record does not exist."
)]
pub(crate) struct Args {
    /// The dataset directory, or an object-storage address
    /// (s3://bucket/prefix, gs://, az://, https://) read in place: the
    /// manifest, the indexes, and only the ranges --record needs.
    #[arg(value_name = "DIR")]
    dir: PathBuf,

    /// Print as JSON (schemas/inspect.schema.json).
    #[arg(long)]
    json: bool,

    /// Also print record K: its ids, and its text when a tokenizer is found.
    #[arg(long, value_name = "K")]
    record: Option<u64>,

    /// Tokenizer to decode --record with. [default: the dataset's tokenizer.json]
    #[arg(long, value_name = "FILE")]
    tokenizer: Option<PathBuf>,
}

pub(crate) fn run(args: Args) -> anyhow::Result<ExitCode> {
    let inspection = inspect::inspect(&args.dir, args.record, args.tokenizer.as_deref())?;
    let mut out = std::io::stdout().lock();
    if args.json {
        serde_json::to_writer_pretty(&mut out, &inspection)?;
        writeln!(out)?;
    } else {
        write!(out, "{}", human(&inspection))?;
    }
    out.flush()?;
    Ok(ExitCode::SUCCESS)
}

/// Ids of a record shown in the human form (and 20 times as many characters of text).
const SHOWN: usize = 64;

/// The human form of an inspection: the manifest's summary, the table of
/// shards, a mixture's recipe, the histogram, the packing, the overflow of
/// context lengths, and the record asked for.
fn human(i: &Inspection) -> String {
    let m = &i.manifest;
    let mut s = summary(i);
    s += &shard_table(&i.shards);
    s += &recipe(m);
    if let Some(l) = &i.lengths {
        s += &length_histogram(l);
    }
    if let (Some(p), Some(l)) = (&m.packing, m.seq_len) {
        s += &packing(p, l);
    }
    if !i.overflow.is_empty() && m.n_records > 0 {
        s += &context_overflow(&i.overflow);
    }
    if let Some(r) = &i.record {
        s += &record(r);
    }
    s
}

/// The dataset and what its manifest says: kind, dtype, tokenizer, special
/// tokens, counts, shards and their size.
fn summary(i: &Inspection) -> String {
    let m = &i.manifest;
    let special = |id: Option<u32>| id.map_or("none".to_owned(), |id| id.to_string());
    let mut s = format!("{}\n", i.dataset);
    s += &format!("  kind        {}\n", m.kind);
    s += &format!("  dtype       {}\n", m.dtype);
    s += &format!("  vocab_size  {}\n", m.vocab_size);
    s += &format!(
        "  tokenizer   {} (xxh3 {})\n",
        m.tokenizer.file.as_deref().unwrap_or("not copied"),
        m.tokenizer.xxh3
    );
    s += &format!(
        "  special     bos {}{}, eos {}{}, pad {}\n",
        special(m.special_tokens.bos),
        if m.bos_prepended { " (prepended)" } else { "" },
        special(m.special_tokens.eos),
        if m.eos_appended { " (appended)" } else { "" },
        special(m.special_tokens.pad)
    );
    s += &format!(
        "  records     {}\n  tokens      {}\n",
        m.n_records, m.n_tokens
    );
    let bytes: u64 = i.shards.iter().map(|r| r.bytes).sum();
    s += &format!(
        "  shards      {} ({})\n",
        i.shards.len(),
        format_bytes(bytes)
    );
    s
}

/// One line per shard under a header; nothing for a dataset without shards.
fn shard_table(shards: &[ShardRow]) -> String {
    let mut s = String::new();
    if shards.is_empty() {
        return s;
    }
    s += &format!(
        "\n  {:<24} {:>12} {:>14} {:>12}\n",
        "shard", "records", "tokens", "size"
    );
    for r in shards {
        s += &format!(
            "  {:<24} {:>12} {:>14} {:>12}\n",
            r.bin,
            r.n_records,
            r.n_tokens,
            format_bytes(r.bytes)
        );
    }
    s
}

/// Record lengths: min, mean, max, the percentiles, and a bar per bucket.
fn length_histogram(l: &Lengths) -> String {
    let mut s = format!(
        "\nRecord length in tokens: min {}, mean {:.1}, max {}\n  ",
        l.min, l.mean, l.max
    );
    let ps: Vec<String> = l
        .percentiles
        .iter()
        .map(|(p, v)| format!("p{} {v}", p * 100.0))
        .collect();
    s += &ps.join(", ");
    s += "\n";
    let top = l
        .histogram
        .iter()
        .map(|b| b.records)
        .max()
        .unwrap_or(1)
        .max(1);
    let total: u64 = l.histogram.iter().map(|b| b.records).sum();
    for b in &l.histogram {
        let range = if b.min == b.max {
            b.min.to_string()
        } else {
            format!("{}-{}", b.min, b.max)
        };
        let bar = "#".repeat(((b.records as f64 / top as f64) * 40.0).round() as usize);
        s += &format!(
            "  {range:>15} {:>10} {:>6.2}% {bar}\n",
            b.records,
            100.0 * b.records as f64 / total.max(1) as f64
        );
    }
    s
}

/// How a packed dataset was packed into rows of `l` tokens: documents,
/// pieces, cuts, padding and tokens dropped.
fn packing(p: &Packing, l: u64) -> String {
    let share = |n: u64, of: u64| 100.0 * n as f64 / of.max(1) as f64;
    let mut s = format!(
        "\nPacked by {} into rows of {l} tokens, {}{}:\n",
        p.mode,
        p.seed.map_or("in input order".to_owned(), |s| format!(
            "rows shuffled with seed {s}"
        )),
        p.window
            .map_or(String::new(), |w| format!(", windows of {w} documents")),
    );
    s += &format!(
        "  documents   {} in {} pieces ({:.2} per row), {} cut ({:.2}%)\n",
        p.documents,
        p.pieces,
        p.pieces as f64 / p.rows.max(1) as f64,
        p.documents_cut,
        share(p.documents_cut, p.documents)
    );
    s += &format!(
        "  padding     {} tokens ({:.3}%)\n  dropped     {} tokens\n",
        p.pad_tokens,
        100.0 * p.pad_share,
        p.tokens_dropped
    );
    s
}

/// Documents longer than each context length, and their share of the tokens.
fn context_overflow(overflow: &[Overflow]) -> String {
    let mut s = "\nDocuments longer than a context length:\n".to_owned();
    for o in overflow {
        s += &format!(
            "  > {:>6} tokens: {:>10} documents, {:>6.2}% of all tokens\n",
            o.context,
            o.records,
            100.0 * o.token_share
        );
    }
    s
}

/// The record asked for: its first ids, its text (or why there is none),
/// and a packed row's pieces and padding.
fn record(r: &RecordView) -> String {
    let mut s = format!(
        "\nRecord {} ({} tokens):\n  ids: {:?}{}\n",
        r.index,
        r.ids.len(),
        &r.ids[..r.ids.len().min(SHOWN)],
        if r.ids.len() > SHOWN {
            format!(" ... ({} more; --json shows all)", r.ids.len() - SHOWN)
        } else {
            String::new()
        }
    );
    match &r.text {
        Some(text) if text.chars().count() > 20 * SHOWN => {
            let head: String = text.chars().take(20 * SHOWN).collect();
            s += &format!("  text: {head:?} ... (--json shows all)\n");
        }
        Some(text) => s += &format!("  text: {text:?}\n"),
        None => s += "  text: (no tokenizer found; pass --tokenizer to decode)\n",
    }
    if let Some(mask) = &r.loss_mask {
        let trained = mask.iter().filter(|&&m| m == 1).count();
        s += &format!(
            "  loss mask: {trained} of {} tokens trained on\n",
            mask.len()
        );
    }
    if let Some(segments) = &r.segments {
        s += &pieces(segments, r.ids.len());
    }
    s
}

/// A packed row's pieces, one line each, then its padding, if any, up to
/// `row_len`.
fn pieces(segments: &[Segment], row_len: usize) -> String {
    let mut s = "  pieces:\n".to_owned();
    for p in segments {
        s += &format!(
            "    row[{}..{}]  document {} from token {}{}\n",
            p.start,
            p.end(),
            p.doc,
            p.doc_offset,
            if p.doc_offset == 0 {
                ""
            } else {
                " (continued)"
            }
        );
    }
    let used = segments.last().map_or(0, |p| p.end());
    if (used as usize) < row_len {
        s += &format!("    row[{used}..{row_len}]  padding\n");
    }
    s
}

/// A mixture's recipe (`prep mix` records it in the provenance's options),
/// one line per source; nothing for other datasets.
fn recipe(m: &prep::format::Manifest) -> String {
    let options = &m.provenance.options;
    let Some(sources) = options["recipe"].as_array() else {
        return String::new();
    };
    let mut s = format!(
        "\nMixed from {} sources, {} tokens asked, seed {}, at most {} epochs each:\n",
        sources.len(),
        options["tokens"],
        options["seed"],
        options["max_epochs"]
    );
    for source in sources {
        s += &format!(
            "  {}  weight {} ({:.2}%): {} tokens, {} documents, {:.3} epochs\n",
            source["source"].as_str().unwrap_or("?"),
            source["weight"],
            100.0 * source["share"].as_f64().unwrap_or(0.0),
            source["tokens"],
            source["documents"],
            source["epochs"].as_f64().unwrap_or(0.0)
        );
    }
    s
}
