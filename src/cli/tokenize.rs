//! `prep tokenize`: flags to a [`TokenizeConfig`], then the summary.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Parser;

use super::write_flags::WriteFlags;

use prep::size::{format_bytes, parse_size};
use prep::tokenize::{self, Eos, TokenizeConfig, TokenizeReport};
use prep::tokenize_then_shuffle::TokenizeThenShuffle;

/// Tokenize raw documents into a sharded token dataset.
///
/// Reads JSONL (plain, .gz or .zst), Parquet and Arrow (.arrow files, as a
/// Hugging Face `datasets` cache holds them), tokenizes every document with
/// a HuggingFace tokenizer.json exactly as the Python `tokenizers` package's
/// `encode(text, add_special_tokens=False)` does, appends an end-of-document
/// token, and writes DIR/manifest.json with shards DIR/shard-NNNNN.bin + .idx.
/// Interrupted runs resume where they stopped when started again with the
/// same arguments.
#[derive(Debug, Parser)]
#[command(
    after_help = sizes_then!("Exit codes: 0 success, 2 usage, input or I/O error.")
)]
// The doc comments are the command's --help, where token strings such as
// <eos> are text, not HTML.
#[allow(rustdoc::invalid_html_tags)]
pub(crate) struct Args {
    /// HuggingFace tokenizer.json (may be .zst or .gz compressed), or a
    /// directory holding one (a save_pretrained folder, a hub cache snapshot).
    /// Truncation and padding in the file are ignored.
    #[arg(long, value_name = "FILE")]
    tokenizer: PathBuf,

    /// Input files, directories (searched recursively) or globs: several
    /// after one --input (a glob the shell expanded), or --input repeated.
    /// Documents are read in the sorted order of the paths. A .json file
    /// is JSON Lines or one JSON array of documents.
    #[arg(long = "input", short = 'i', value_name = "PATH", required = true, num_args = 1..)]
    inputs: Vec<String>,

    /// Field holding the text; a dotted path such as `meta.body` reaches
    /// nested objects (or struct columns in Parquet).
    #[arg(long, value_name = "KEY", default_value = "text")]
    text_key: String,

    /// Output dataset directory.
    #[arg(long, short = 'o', value_name = "DIR")]
    output: PathBuf,

    /// Token appended to every document: an id (a whole number is always an
    /// id), a token string, or token:TEXT for a token whose text is digits.
    /// [default: the tokenizer's special end-of-document token, such as
    /// <|endoftext|>, </s> or <eos>, else the special token its
    /// post-processor appends, if any]
    #[arg(long, value_name = "TOKEN", conflicts_with = "no_eos")]
    eos: Option<String>,

    /// Append no end-of-document token.
    #[arg(long)]
    no_eos: bool,

    /// Token prepended to every document: an id, a token string, or
    /// token:TEXT. [default: none; the run notes a bos the tokenizer's
    /// post-processor would add]
    #[arg(long, value_name = "TOKEN")]
    bos: Option<String>,

    /// Worker threads; 0 uses every core. The output is the same for any value.
    #[arg(long, short = 't', value_name = "N", default_value_t = 0)]
    threads: usize,

    #[command(flatten)]
    write: WriteFlags,

    /// Drop documents whose exact text was seen before (XXH3-128 of the
    /// bytes); costs about 50 bytes of memory per unique document.
    #[arg(long)]
    dedup: bool,

    /// Skip bad documents (malformed JSON, missing or non-string text,
    /// invalid UTF-8), count them in the manifest, and warn, instead of
    /// stopping at the first.
    #[arg(long)]
    skip_bad: bool,

    /// Shuffle the documents with this seed: the output is identical to
    /// prep tokenize then prep shuffle --seed S (same shard size).
    #[arg(long, value_name = "S")]
    shuffle_seed: Option<u64>,

    /// Memory budget of the shuffle (with --shuffle-seed); larger outputs are
    /// shuffled out of core.
    #[arg(long, value_name = "SIZE", default_value = "4GiB", value_parser = parse_size, requires = "shuffle_seed")]
    memory: u64,

    /// Be task I of N of a partitioned run: read only this part's share of
    /// the inputs (whole files, byte ranges of plain JSONL files, row groups
    /// of Parquet files) and write a partial dataset; `prep merge` joins the
    /// N parts into exactly the dataset a run without --part makes.
    #[arg(long, value_name = "I/N", conflicts_with = "shuffle_seed")]
    part: Option<prep::partition::Part>,

    /// Encoding engine: `fast` is prep's own, `hf` is HF tokenizers; both
    /// give identical ids. `auto` runs `fast` when it supports the tokenizer
    /// (every byte-level BPE, SentencePiece-style BPE, Unigram and WordPiece
    /// file but the few constructs the guide lists) and `hf` otherwise;
    /// `fast` refuses a tokenizer it does not support, naming the construct.
    #[arg(long, value_name = "ENGINE", default_value = "auto", value_parser = parse_engine)]
    engine: tokenize::EngineChoice,

    #[command(flatten)]
    chat: ChatFlags,
}

/// Chat mode's flags (docs/chat.md).
#[derive(Debug, clap::Args)]
struct ChatFlags {
    /// Rows are conversations (OpenAI messages, ShareGPT, Alpaca): render
    /// each with the chat template exactly as transformers'
    /// apply_chat_template does, tokenize the text with no special token of
    /// prep's own, and write a loss mask (shard-NNNNN.mask) beside the tokens.
    #[arg(long, conflicts_with = "text_key")]
    chat: bool,

    /// The chat template: a .jinja file, a tokenizer_config.json (its
    /// chat_template and special tokens) or chat_template.json, or a model
    /// folder holding them. [default: the tokenizer's folder]
    #[arg(long, value_name = "PATH", requires = "chat")]
    chat_template: Option<PathBuf>,

    /// Which template of a list of named ones. [default: "default", and
    /// "tool_use" for rows with tools where the list has one]
    #[arg(long, value_name = "NAME", requires = "chat")]
    chat_template_name: Option<String>,

    /// How rows hold their conversation: auto (each row by its fields),
    /// messages, sharegpt or alpaca.
    #[arg(long, value_name = "SHAPE", default_value = "auto", value_parser = parse_shape, requires = "chat")]
    chat_shape: prep::chat::Shape,

    /// Which tokens are trained on: assistant (every assistant turn, its
    /// end-of-turn tokens included), last (the last assistant turn) or all.
    #[arg(long, value_name = "POLICY", default_value = "assistant", value_parser = parse_policy, requires = "chat")]
    loss_mask: prep::chat::MaskPolicy,

    /// The date the template's strftime_now gives, recorded in the manifest
    /// so that runs are reproducible.
    #[arg(long, value_name = "YYYY-MM-DD", default_value = prep::chat::DEFAULT_DATE, requires = "chat")]
    chat_date: String,

    /// A template variable, KEY=VALUE (repeatable): VALUE is read as JSON
    /// when it is JSON (true, 3, null, a list), else as text. Overrides the
    /// config's bos_token, eos_token, ...
    #[arg(long, value_name = "KEY=VALUE", value_parser = parse_var, requires = "chat")]
    chat_var: Vec<(String, serde_json::Value)>,

    /// The longest conversation, in tokens; longer ones are handled as
    /// --overlong says and counted.
    #[arg(long, value_name = "N", requires = "chat")]
    max_tokens: Option<usize>,

    /// What to do with a conversation over --max-tokens: drop it, or
    /// truncate it (its first N tokens and their mask).
    #[arg(long, value_name = "WHAT", default_value = "drop", value_parser = parse_overlong, requires = "max_tokens")]
    overlong: prep::chat::Overlong,
}

impl ChatFlags {
    /// The library's chat config, when chat mode is on.
    fn config(self) -> Option<prep::chat::ChatConfig> {
        self.chat.then(|| prep::chat::ChatConfig {
            template: self.chat_template,
            template_name: self.chat_template_name,
            shape: self.chat_shape,
            policy: self.loss_mask,
            date: self.chat_date,
            vars: self.chat_var,
            max_tokens: self.max_tokens.map(|n| (n, self.overlong)),
        })
    }
}

fn parse_shape(s: &str) -> Result<prep::chat::Shape, String> {
    use prep::chat::Shape;
    [Shape::Auto, Shape::Messages, Shape::ShareGpt, Shape::Alpaca]
        .into_iter()
        .find(|shape| shape.name() == s)
        .ok_or_else(|| "expected auto, messages, sharegpt or alpaca".into())
}

fn parse_policy(s: &str) -> Result<prep::chat::MaskPolicy, String> {
    use prep::chat::MaskPolicy;
    [MaskPolicy::Assistant, MaskPolicy::Last, MaskPolicy::All]
        .into_iter()
        .find(|p| p.name() == s)
        .ok_or_else(|| "expected assistant, last or all".into())
}

fn parse_overlong(s: &str) -> Result<prep::chat::Overlong, String> {
    match s {
        "drop" => Ok(prep::chat::Overlong::Drop),
        "truncate" => Ok(prep::chat::Overlong::Truncate),
        _ => Err("expected drop or truncate".into()),
    }
}

fn parse_var(s: &str) -> Result<(String, serde_json::Value), String> {
    let (key, value) = s
        .split_once('=')
        .filter(|(k, _)| !k.is_empty())
        .ok_or("expected KEY=VALUE")?;
    let value = serde_json::from_str(value).unwrap_or_else(|_| serde_json::Value::from(value));
    Ok((key.to_owned(), value))
}

pub(crate) fn run(args: Args) -> anyhow::Result<ExitCode> {
    let mut config = TokenizeConfig::new(args.tokenizer, args.inputs, args.output);
    config.text_key = args.text_key;
    config.eos = match (args.no_eos, args.eos) {
        (true, _) => Eos::Off,
        (false, Some(token)) => Eos::Token(token),
        (false, None) => Eos::Auto,
    };
    config.bos = args.bos;
    config.threads = args.threads;
    config.writing = args.write.writing();
    config.dedup = args.dedup;
    config.skip_bad = args.skip_bad;
    config.part = args.part;
    config.engine = args.engine;
    config.chat = args.chat.config();
    let bar = super::progress::Bar::new(args.write.quiet);
    let report = match args.shuffle_seed {
        None => tokenize::run(&config, &bar)?,
        Some(seed) => {
            let mut composed = TokenizeThenShuffle::new(config.clone(), seed);
            composed.memory = args.memory;
            prep::tokenize_then_shuffle::run(&composed, &bar)?
        }
    };
    if !args.write.quiet {
        eprintln!("{}", summary(&config, args.shuffle_seed, &report));
    }
    if report.manifest.n_records == 0 {
        let read = report.manifest.provenance.documents.read;
        eprintln!("prep: warning: {}", empty_warning(&config, read));
    }
    Ok(ExitCode::SUCCESS)
}

/// Said when a run read no document, even with --quiet: an empty dataset is
/// valid (a part of a partitioned run may have nothing to read, and its
/// merge still needs it), so the run succeeds, but an input that is empty
/// by mistake should not pass unnoticed.
fn empty_warning(config: &TokenizeConfig, read: u64) -> String {
    let out = config.output.display();
    if read > 0 {
        return format!(
            "none of the {read} documents read became a record, so {out} is an empty dataset \
             (0 records)"
        );
    }
    let inputs = match config.part {
        Some(part) => format!("part {part} of the inputs holds"),
        None => "the inputs hold".to_owned(),
    };
    format!(
        "{inputs} no documents, so {out} is an empty dataset (0 records); check that --input \
         names the files meant and that they are not empty"
    )
}

fn parse_engine(s: &str) -> Result<tokenize::EngineChoice, String> {
    match s {
        "auto" => Ok(tokenize::EngineChoice::Auto),
        "hf" => Ok(tokenize::EngineChoice::Hf),
        "fast" => Ok(tokenize::EngineChoice::Fast),
        _ => Err("expected auto, hf or fast".into()),
    }
}

/// The one-paragraph summary printed at the end.
fn summary(config: &TokenizeConfig, shuffle_seed: Option<u64>, r: &TokenizeReport) -> String {
    let m = &r.manifest;
    let docs = &m.provenance.documents;
    if r.already_complete {
        return format!(
            "{} is already complete: {} records, {} tokens in {}. Nothing to do.",
            config.output.display(),
            m.n_records,
            m.n_tokens,
            super::count(m.shards.len() as u64, "shard")
        );
    }
    let secs = r.elapsed.as_secs_f64().max(1e-9);
    let mut s = format!(
        "Tokenized {} documents ({} of text) into {} tokens in {:.1}s on {}: {:.2} MB/s, {:.0} tokens/s, {:.0} documents/s.",
        r.documents,
        format_bytes(r.text_bytes),
        r.tokens,
        secs,
        super::count(r.threads as u64, "thread"),
        r.text_bytes as f64 / 1e6 / secs,
        r.tokens as f64 / secs,
        r.documents as f64 / secs,
    );
    s += &format!(" Encoded by the {}.", r.engine_note);
    if let Some(seed) = shuffle_seed {
        s += &format!(" Documents shuffled with seed {seed}.");
    }
    if r.resumed_shards > 0 {
        s += &format!(
            " Resumed after {} of an interrupted run.",
            super::count(r.resumed_shards as u64, "complete shard")
        );
    }
    s += &format!(
        " Wrote {}: {} records, {} tokens, {}, vocab {}, in {} ({}); {}.",
        config.output.display(),
        m.n_records,
        m.n_tokens,
        m.dtype,
        m.vocab_size,
        super::count(m.shards.len() as u64, "shard"),
        format_bytes(m.shards.iter().map(|s| s.bin_bytes + s.idx_bytes).sum()),
        r.eos_note,
    );
    if let Some(chat) = &m.provenance.chat {
        s += &format!(
            " Chat: {} tokens trained on; skipped {} conversations with no trained token{}.",
            chat.trainable_tokens,
            chat.no_trainable_token,
            [
                (chat.malformed, "not conversations"),
                (chat.refused, "refused by the template"),
                (chat.unverifiable, "with unverifiable masks"),
                (chat.too_long, "over --max-tokens, dropped"),
                (chat.truncated, "over --max-tokens, truncated"),
            ]
            .iter()
            .filter(|(n, _)| *n > 0)
            .map(|(n, what)| format!(", {n} {what}"))
            .collect::<String>()
        );
    }
    if docs.skipped + docs.deduplicated + docs.empty > 0 {
        s += &format!(
            " Skipped {} bad, dropped {} duplicate and kept {} empty documents.",
            docs.skipped, docs.deduplicated, docs.empty
        );
    }
    if let Some(peak) = prep::util::peak_rss_bytes() {
        s += &format!(" Peak memory {}.", format_bytes(peak));
    }
    s
}
