//! The tokenize stage: its plan, then the streaming write loop (read,
//! tokenize in parallel, write in input order).

use std::collections::{BTreeMap, HashSet};
use std::path::PathBuf;
use std::sync::mpsc::{self, Receiver, SyncSender};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use tokenizers::Tokenizer;
use xxhash_rust::xxh3::xxh3_128;

use super::journal::Checkpoint;
use super::{
    fingerprinted, input_infos, options_json, Eos, Progress, ProgressSnapshot, TokenizeConfig,
    TokenizeError, TokenizeReport, MAX_BATCH_DOCS, MAX_WARNINGS,
};
use crate::engine::{
    EncodeState, EngineChoice, FastTokenizer, LoadedTokenizer, Readings, Unsupported,
};
use crate::format::{
    checksum_hex, ChatCounts, DatasetWriter, DocumentCounts, Dtype, FileInfo, InputInfo, Manifest,
    ShardInfo, SpecialTokens, TokenizerInfo,
};
use crate::input::{self, DocError, InputError, Location, Payload, RawDoc, Reader, TextKey};
use crate::output::{Done, Journal, Output, OutputError, Start, HASHES_FILE, TOKENIZER_FILE};
use crate::partition::Part;
use crate::run::Identity;

/// What the workers share: read-only settings and the encoder.
struct Shared {
    encoder: Encoder,
    /// Token buffers of written batches, for the next batches: a fresh
    /// buffer costs a page fault per 4 KiB, more than filling it.
    spare: Mutex<Vec<Vec<u32>>>,
    key: TextKey,
    bos: Option<u32>,
    eos: Option<u32>,
    dedup: bool,
    /// Documents before this position were written by an earlier run: they
    /// are only hashed (for `--dedup`), not tokenized.
    replay_until: u64,
    /// Chat mode: rows are conversations, each with a loss mask.
    chat: Option<crate::chat::Chat>,
    /// Chat mode's `--max-tokens`.
    max_tokens: Option<(usize, crate::chat::Overlong)>,
}

/// The engine that turns text into ids; both give the same ids.
enum Encoder {
    /// One clone per worker thread: the BPE cache inside a tokenizer sits
    /// behind a lock, so sharing one across threads would serialise them.
    Hf(Vec<Mutex<Tokenizer>>),
    /// One tokenizer for all, and one cache per worker thread.
    Fast(Box<FastTokenizer>, Vec<Mutex<EncodeState>>),
}

impl Encoder {
    /// HF tokenizers, one clone per worker thread.
    fn hf(tok: &LoadedTokenizer, threads: usize) -> Result<Encoder, TokenizeError> {
        let hf = tok.hf()?;
        Ok(Encoder::Hf(
            (0..threads).map(|_| Mutex::new(hf.clone())).collect(),
        ))
    }
}

/// Picks the engine `--engine` asks for: the fast one where it supports the
/// tokenizer (required with `fast`), else HF tokenizers.
fn choose_engine(
    config: &TokenizeConfig,
    tok: &LoadedTokenizer,
    fast: Option<Result<FastTokenizer, Unsupported>>,
    threads: usize,
) -> Result<(Encoder, &'static str, String), TokenizeError> {
    let hf = || Encoder::hf(tok, threads);
    let Some(fast) = fast else {
        return Ok((
            hf()?,
            "hf",
            "engine hf (HF tokenizers), as --engine asks".into(),
        ));
    };
    match (fast, config.engine) {
        (Ok(fast), _) => {
            let note = format!(
                "engine fast ({}; ids identical to HF tokenizers)",
                fast.describe()
            );
            let states = (0..threads).map(|_| Mutex::new(EncodeState::default())).collect();
            Ok((Encoder::Fast(Box::new(fast), states), "fast", note))
        }
        (Err(why), EngineChoice::Fast) => Err(TokenizeError::Tokenizer {
            path: config.tokenizer.clone(),
            message: format!(
                "--engine fast cannot run this tokenizer ({why}); use --engine auto or hf"
            ),
        }),
        (Err(why), _) => Ok((hf()?, "hf", format!("engine hf (HF tokenizers): the fast engine does not support this tokenizer ({why})"))),
    }
}

/// One document's fate, as a worker saw it.
enum Outcome {
    /// Tokenized: `len` ids in the batch's token buffer (and, in chat
    /// mode, as many bytes in its mask buffer, `trainable` of them 1).
    Doc {
        len: usize,
        hash: u128,
        text_bytes: usize,
        trainable: u64,
        truncated: bool,
        /// Chat mode: HF tokenizers placed its mask (fast engine runs).
        placed_by_hf: bool,
    },
    /// A conversation not written, counted by why: no token of it is
    /// trained on, or it is over `--max-tokens`.
    Unused { too_long: bool },
    /// Written by an earlier run; its hash when deduplicating.
    Replay { hash: Option<u128> },
    /// Could not be read or tokenized.
    Bad {
        file: u32,
        loc: Location,
        error: Bad,
    },
}

enum Bad {
    Doc(DocError),
    Encode(String),
    Chat(crate::chat::RowError),
}

/// A tokenized batch: all ids back to back, and one outcome per document.
struct BatchOut {
    tokens: Vec<u32>,
    /// Chat mode: one loss-mask byte per token, back to back.
    masks: Vec<u8>,
    docs: Vec<Outcome>,
}

type Message = (u64, Result<BatchOut, InputError>);

/// The eos and bos ids a run adds, and a note that says which and why, and
/// what the tokenizer's post-processor would add that the run does not.
fn special_tokens(
    config: &TokenizeConfig,
    tok: &LoadedTokenizer,
) -> Result<(Option<u32>, Option<u32>, String), TokenizeError> {
    let (eos, mut note) = match &config.eos {
        Eos::Off => (None, "no eos (--no-eos)".to_owned()),
        Eos::Token(value) => {
            let id = tok.resolve("--eos", value)?;
            (Some(id), format!("eos {:?} (id {id})", tok.token(id)))
        }
        Eos::Auto => match tok.default_eos() {
            Some(default) => (
                Some(default.id),
                format!(
                    "eos {:?} (id {}): {}, since --eos was not given",
                    default.token,
                    default.id,
                    default.why()
                ),
            ),
            None => (
                None,
                "no eos: the tokenizer has no special end-of-document token (such as \
                 <|endoftext|>, </s> or <eos>) and its post-processor appends none; pass --eos \
                 TOKEN to add one"
                    .to_owned(),
            ),
        },
    };
    let bos = config
        .bos
        .as_deref()
        .map(|b| tok.resolve("--bos", b))
        .transpose()?;
    for extra in tok.post_processor_notes(bos, eos) {
        note += "; ";
        note += &extra;
    }
    Ok((eos, bos, note))
}

/// What a run will do and record, decided before the output directory is
/// touched: the tokenizer and engine, the special tokens, the inputs and
/// the options and fingerprint the manifest records.
pub(crate) struct Plan {
    tok: LoadedTokenizer,
    /// The ids' type: the narrowest that holds the tokenizer's vocabulary.
    dtype: Dtype,
    encoder: Encoder,
    eos: Option<u32>,
    bos: Option<u32>,
    files: Vec<input::InputFile>,
    /// The options as the manifest records them (a part's `"part"` is
    /// added by [`Identity::provenance`]).
    pub options: serde_json::Value,
    /// The run's inputs, its job's and its own fingerprints.
    pub identity: Identity,
    /// The eos token and how it was chosen.
    pub eos_note: String,
    /// The engine and why.
    pub engine_note: String,
    /// How long the tokenizer took to load, and from what.
    pub load_note: String,
    /// Worker threads.
    pub threads: usize,
    /// Chat mode's template and rules.
    chat: Option<crate::chat::Chat>,
}

impl Plan {
    /// The plan of a command that runs this tokenize as its first stage and
    /// records itself as a tokenize with one more option `key` (the
    /// tokenize-then-shuffle's seed): the option joins the recorded
    /// options and the fingerprint.
    pub(crate) fn with_option(mut self, key: &str, value: serde_json::Value) -> Plan {
        assert!(
            self.identity.part().is_none(),
            "a partitioned run is not composed"
        );
        self.options[key] = value;
        let inputs = self.identity.inputs().to_vec();
        self.identity = identity(&self.options, self.tok.xxh3, inputs, None);
        self
    }
}

/// Loads the tokenizer, resolves the special tokens, lists the inputs and
/// picks the engine: everything a run decides before it writes.
pub(crate) fn plan(config: &TokenizeConfig) -> Result<Plan, TokenizeError> {
    // One level of parallelism: ours. The tokenizer must not start its own.
    tokenizers::utils::parallelism::set_parallelism(false);
    let mut chat = match &config.chat {
        Some(chat) => Some(chat_plan(config, chat)?),
        None => None,
    };
    // Chat mode reads HF's beside the engine's: it places the masks of
    // conversations the engine cannot (and the engine's, by HF's offsets).
    let readings = match (config.engine, &chat) {
        (EngineChoice::Hf, _) => Readings::Hf,
        (_, Some(_)) => Readings::Both,
        (_, None) => Readings::Fast,
    };
    let loading = Instant::now();
    let (tok, fast) = LoadedTokenizer::load_with_fast(&config.tokenizer, readings)?;
    let load_note = match &tok.compiled {
        Some(compiled) => format!(
            "tokenizer ready in {} ms: {compiled}",
            loading.elapsed().as_millis()
        ),
        None => format!(
            "tokenizer ready in {} ms (HF tokenizers' reading)",
            loading.elapsed().as_millis()
        ),
    };
    let (eos, bos, eos_note) = match &chat {
        Some(chat) => (
            None,
            None,
            format!(
                "no bos or eos of prep's own: the chat template writes them; loss mask {}",
                chat.options["loss_mask"].as_str().unwrap_or("")
            ),
        ),
        None => special_tokens(config, &tok)?,
    };
    crate::run::refuse_overlap_patterns(&config.output, &config.inputs, "the input")?;
    let files = input::expand(&config.inputs)?;
    let inputs = input_infos(&files);
    let threads = crate::util::thread_count(config.threads);
    let (encoder, engine, engine_note) = match &mut chat {
        Some(chat) => chat_engine(config, &tok, fast, chat, threads)?,
        None => choose_engine(config, &tok, fast, threads)?,
    };
    let dtype = Dtype::for_vocab_size(tok.vocab_size);
    let mut options = options_json(config, eos, bos, dtype, chat.as_ref());
    options["engine"] = engine.into();
    let identity = identity(&options, tok.xxh3, inputs, config.part);
    Ok(Plan {
        tok,
        dtype,
        encoder,
        eos,
        bos,
        files,
        options,
        identity,
        eos_note,
        engine_note,
        load_note,
        threads,
        chat,
    })
}

/// Chat mode's engine: the fast one where it can place the loss mask
/// (byte-level or SentencePiece-style BPE, whose tokens stand for fixed
/// bytes: `engine::offsets`), with HF tokenizers for the conversations it
/// cannot place; else HF tokenizers, which gives every token's offsets.
fn chat_engine(
    config: &TokenizeConfig,
    tok: &LoadedTokenizer,
    fast: Option<Result<FastTokenizer, Unsupported>>,
    chat: &mut crate::chat::Chat,
    threads: usize,
) -> Result<(Encoder, &'static str, String), TokenizeError> {
    let hf = Encoder::hf(tok, threads)?;
    let why_not = match fast {
        None => "as --engine asks".to_owned(),
        Some(Err(why)) => format!("the fast engine does not support this tokenizer ({why})"),
        Some(Ok(fast)) => match crate::engine::offsets::Offsets::new(tok.hf()?) {
            None => "chat mode's loss masks need each token's place in the text, and this                      tokenizer's post-processor moves offsets in a way the fast engine does not                      restate"
                .to_owned(),
            Some(offsets) => {
                let note = format!(
                    "engine fast ({}; ids identical to HF tokenizers; a conversation whose tokens                      are not its text byte for byte is placed by HF tokenizers' offsets)",
                    fast.describe()
                );
                chat.use_fast(fast, offsets, threads);
                return Ok((hf, "fast", note));
            }
        },
    };
    if config.engine == EngineChoice::Fast {
        return Err(TokenizeError::Usage(format!(
            "--engine fast cannot run --chat with this tokenizer: {why_not}; use --engine auto or hf"
        )));
    }
    Ok((hf, "hf", format!("engine hf (HF tokenizers): {why_not}")))
}

/// Chat mode's template, and the flags it does not take.
fn chat_plan(
    config: &TokenizeConfig,
    chat: &crate::chat::ChatConfig,
) -> Result<crate::chat::Chat, TokenizeError> {
    let refuse = |flag: &str| {
        Err(TokenizeError::Usage(format!(
            "{flag} is not taken with --chat: the chat template writes every special token of a \
             conversation, and prep adds none of its own"
        )))
    };
    if matches!(config.eos, super::Eos::Token(_)) {
        return refuse("--eos");
    }
    if config.bos.is_some() {
        return refuse("--bos");
    }
    Ok(crate::chat::Chat::load(chat, &config.tokenizer)?)
}

/// A tokenize run's identity: the options that shape its bytes
/// ([`fingerprinted`]: the tokenizer by its checksum) over its inputs. A
/// part's fingerprint is its own; the job's is what every part shares and
/// what the merged dataset carries.
fn identity(
    options: &serde_json::Value,
    tokenizer_xxh3: u64,
    inputs: Vec<InputInfo>,
    part: Option<Part>,
) -> Identity {
    Identity::new(
        "tokenize",
        &fingerprinted(options, tokenizer_xxh3),
        inputs,
        part,
    )
}

pub(super) fn run(
    config: &TokenizeConfig,
    progress: &dyn Progress,
) -> Result<TokenizeReport, TokenizeError> {
    let started = Instant::now();
    let plan = plan(config)?;
    let output = Output::lock(&config.output, config.writing.single_writer)?;
    write(config, plan, output, started, progress)
}

/// Tokenizes into `output`, locked by the caller, as `plan` says: start or
/// resume, stream the inputs through the workers into shards, then the
/// manifest.
pub(crate) fn write(
    config: &TokenizeConfig,
    plan: Plan,
    mut output: Output,
    started: Instant,
    progress: &dyn Progress,
) -> Result<TokenizeReport, TokenizeError> {
    let Plan {
        tok,
        dtype,
        encoder,
        eos,
        bos,
        files,
        options,
        identity,
        eos_note,
        engine_note,
        load_note,
        threads,
        chat,
    } = plan;
    let report = |manifest, already_complete, kept, ran: Ran| TokenizeReport {
        manifest,
        already_complete,
        resumed_shards: kept,
        elapsed: started.elapsed(),
        text_bytes: ran.text_bytes,
        tokens: ran.tokens,
        documents: ran.documents,
        threads,
        eos_note: eos_note.clone(),
        engine_note: engine_note.clone(),
        warnings: ran.warnings,
    };
    let dir = output.dir().to_path_buf();
    let journal =
        match output.start::<(), Checkpoint>(&identity.fingerprint, config.writing.overwrite)? {
            Start::Complete(manifest) => {
                let skipped = manifest.provenance.documents.skipped;
                refuse_skipped(&dir, skipped, config.skip_bad, "made")?;
                progress.note("the dataset is already complete; nothing to do");
                return Ok(report(*manifest, true, 0, Ran::default()));
            }
            Start::Resume(journal) => {
                let skipped = journal.shards.last().map_or(0, |k| k.at.documents.skipped);
                refuse_skipped(&dir, skipped, config.skip_bad, "started")?;
                journal
            }
            Start::Fresh(journal) => journal,
        };
    let kept = journal.shards.len();
    progress.note(&eos_note);
    progress.note(&engine_note);
    progress.note(&format!(
        "{load_note}; the first document is read {} ms after the run began",
        started.elapsed().as_millis()
    ));
    if kept > 0 {
        progress.note(&format!(
            "resuming: kept {kept} complete shards of an interrupted run"
        ));
    }
    if let Some(chat) = &chat {
        progress.note(&format!("chat mode: {}", chat.source));
    }
    let masked = chat.is_some();
    let workers = Workers {
        encoder,
        bos,
        eos,
        dtype,
        threads,
        chat,
    };
    let read = files.clone();
    let mut ran = stream(config, workers, files, &mut output, journal, progress)?;
    // Each input is still the version the run's identity names: a file
    // written to while it was read would give a dataset of two versions.
    for file in &read {
        file.still_the_same()?;
    }
    let mut partition = identity.partition();
    if let (Some(partition), Some(hashes)) = (&mut partition, &ran.hashes) {
        partition.hashes = Some(write_hashes(&output, hashes)?);
    }
    let counts = ran.counts;
    if counts.read > 0 && counts.written == 0 && counts.skipped == counts.read {
        return Err(TokenizeError::Usage(format!(
            "every one of the {} documents read was bad and skipped (--skip-bad), so the dataset \
             would be empty; the first: {}",
            counts.read,
            ran.warnings
                .first()
                .map_or("(none recorded)", String::as_str)
        )));
    }
    output.put(TOKENIZER_FILE, &tok.json)?;
    let mut provenance = identity.provenance(options, counts);
    provenance.chat = masked.then_some(ran.chat);
    let manifest = Manifest::documents(
        dtype,
        tok.vocab_size,
        TokenizerInfo {
            file: Some(TOKENIZER_FILE.into()),
            xxh3: checksum_hex(tok.xxh3),
        },
        std::mem::take(&mut ran.shards),
        provenance,
    )
    .with_specials(
        SpecialTokens {
            bos,
            eos,
            pad: None,
        },
        bos.is_some(),
        eos.is_some(),
    )
    .with_partition(partition);
    output.commit(&manifest)?;
    progress.finish();
    Ok(report(manifest, false, kept, ran))
}

/// What the workers need of the plan.
struct Workers {
    encoder: Encoder,
    bos: Option<u32>,
    eos: Option<u32>,
    dtype: Dtype,
    threads: usize,
    chat: Option<crate::chat::Chat>,
}

/// What a run wrote, for its manifest and its report.
#[derive(Default)]
struct Ran {
    /// Every shard of the dataset, kept ones first.
    shards: Vec<ShardInfo>,
    /// Documents read, written and skipped, resumed shards included.
    counts: DocumentCounts,
    /// Chat mode's counts, resumed shards included.
    chat: ChatCounts,
    /// A deduplicating part's record hashes, in order.
    hashes: Option<Vec<u128>>,
    /// The first bad documents skipped, described.
    warnings: Vec<String>,
    /// Text bytes, tokens and documents of this run alone.
    text_bytes: u64,
    tokens: u64,
    documents: u64,
}

/// The write loop: one thread reads batches of documents from `files` (this
/// part's share of them) and hands each to the pool; the calling thread
/// writes the tokenized batches in input order into shards, journaling
/// each, from where `journal` left off.
fn stream(
    config: &TokenizeConfig,
    workers: Workers,
    files: Vec<input::InputFile>,
    output: &mut Output,
    journal: Journal<(), Checkpoint>,
    progress: &dyn Progress,
) -> Result<Ran, TokenizeError> {
    let threads = workers.threads;
    let pool =
        crate::run::thread_pool(threads, "tokenize").map_err(|e| TokenizeError::Threads {
            threads,
            message: e.to_string(),
        })?;
    let checkpoint = journal.shards.last().map(|k| k.at).unwrap_or_default();
    let shared = Arc::new(Shared {
        encoder: workers.encoder,
        // Chat mode reads whole rows: a conversation is more than one field.
        key: match config.chat {
            Some(_) => TextKey::whole_row(),
            None => TextKey::parse(&config.text_key),
        },
        bos: workers.bos,
        eos: workers.eos,
        dedup: config.dedup,
        replay_until: checkpoint.position,
        spare: Mutex::new(Vec::new()),
        max_tokens: config.chat.as_ref().and_then(|c| c.max_tokens),
        chat: workers.chat,
    });
    let masked = shared.chat.is_some();
    let shares = shares(config.part, files)?;
    let paths: Vec<PathBuf> = shares.iter().map(|s| s.file.path.clone()).collect();
    let input_total: u64 = shares.iter().map(|s| s.file.bytes).sum();
    let mut reader = Reader::from_shares(shares, shared.key.clone());
    let input_done = reader.progress();

    let window = threads * config.window_per_thread.max(1);
    let (permit_tx, permit_rx) = mpsc::sync_channel::<()>(window);
    for _ in 0..window {
        permit_tx.send(()).expect("the receiver is alive");
    }
    let (result_tx, result_rx) = mpsc::channel::<Message>();
    let dir = output.dir().to_path_buf();
    let mut state = WriteState {
        writer: DatasetWriter::new(
            &dir,
            workers.dtype,
            config.writing.shard_size,
            journal.shard_infos(),
        )
        .masked(masked),
        chat: checkpoint.chat,
        output,
        journal,
        counts: checkpoint.documents,
        text_bytes: checkpoint.text_bytes,
        seen: HashSet::new(),
        hashes: (config.dedup && config.part.is_some()).then(Vec::new),
        position: 0,
        dedup: config.dedup,
        skip_bad: config.skip_bad,
        paths,
        warnings: Vec::new(),
        run_text_bytes: 0,
        run_tokens: 0,
        run_documents: 0,
    };

    let batch_bytes = config.batch_bytes.max(1);
    let writer_side = Arc::clone(&shared);
    let written = std::thread::scope(|scope| {
        let shared = Arc::clone(&shared);
        let pool = &pool;
        scope.spawn(move || {
            read_batches(
                &mut reader,
                pool,
                &shared,
                &permit_rx,
                &result_tx,
                batch_bytes,
            )
        });
        write_in_order(
            &mut state,
            result_rx,
            permit_tx,
            progress,
            &input_done,
            input_total,
            &writer_side.spare,
        )
    });
    written?;
    Ok(Ran {
        shards: state.writer.finish()?,
        counts: state.counts,
        chat: state.chat,
        hashes: state.hashes,
        warnings: state.warnings,
        text_bytes: state.run_text_bytes,
        tokens: state.run_tokens,
        documents: state.run_documents,
    })
}

/// This run's share of the input files: all of each, or for a part the
/// share [`fn@input::share`] gives it.
fn shares(
    part: Option<Part>,
    files: Vec<input::InputFile>,
) -> Result<Vec<input::Share>, TokenizeError> {
    Ok(match part {
        Some(part) => input::share(&files, part)?,
        None => files
            .into_iter()
            .map(|file| input::Share {
                file,
                slice: input::Slice::Whole,
            })
            .collect(),
    })
}

/// The reading side of the write loop: batches of documents, each handed
/// to the pool with its number, until the input ends or fails.
fn read_batches(
    reader: &mut Reader,
    pool: &rayon::ThreadPool,
    shared: &Arc<Shared>,
    permits: &Receiver<()>,
    results: &mpsc::Sender<Message>,
    batch_bytes: usize,
) {
    let mut seq = 0u64;
    let mut first = 0u64;
    // Each batch needs a permit, returned once it is written: at most
    // `window` batches are read, tokenized or waiting to be written.
    while permits.recv().is_ok() {
        match reader.next_batch(batch_bytes, MAX_BATCH_DOCS) {
            Ok(Some(docs)) => {
                let n = docs.len() as u64;
                let (tx, shared) = (results.clone(), Arc::clone(shared));
                pool.spawn(move || {
                    let out = process(&shared, first, docs);
                    // The writer has stopped only if it failed; then nobody waits.
                    let _ = tx.send((seq, Ok(out)));
                });
                seq += 1;
                first += n;
            }
            Ok(None) => break,
            Err(e) => {
                let _ = results.send((seq, Err(e)));
                break;
            }
        }
    }
}

/// Writes a part's record hashes (16 bytes each, little-endian) to
/// [`HASHES_FILE`] and describes the file for the manifest.
fn write_hashes(output: &Output, hashes: &[u128]) -> Result<FileInfo, TokenizeError> {
    let bytes: Vec<u8> = hashes.iter().flat_map(|h| h.to_le_bytes()).collect();
    output.put(HASHES_FILE, &bytes)?;
    Ok(FileInfo {
        file: HASHES_FILE.into(),
        bytes: bytes.len() as u64,
        xxh3: checksum_hex(xxhash_rust::xxh3::xxh3_64(&bytes)),
    })
}

/// A dataset that skipped bad documents is this run's output only if this
/// run skips them too.
fn refuse_skipped(
    dir: &std::path::Path,
    skipped: u64,
    skip_bad: bool,
    what: &str,
) -> Result<(), TokenizeError> {
    if skipped > 0 && !skip_bad {
        return Err(TokenizeError::Output(OutputError::Refused {
            dir: dir.into(),
            why: format!(
                "holds a run {what} with --skip-bad that skipped {skipped} bad documents; \
                 pass --skip-bad to go on with it, or --overwrite to start over"
            ),
        }));
    }
    Ok(())
}

/// Parses and tokenizes one batch on a worker thread.
fn process(shared: &Shared, first: u64, docs: Vec<RawDoc>) -> BatchOut {
    let slot = rayon::current_thread_index().unwrap_or(0);
    let mut encoder = match &shared.encoder {
        Encoder::Hf(tokenizers) => Worker::Hf(
            tokenizers[slot % tokenizers.len()]
                .lock()
                .unwrap_or_else(|e| e.into_inner()),
        ),
        Encoder::Fast(fast, states) => Worker::Fast(
            fast,
            states[slot % states.len()]
                .lock()
                .unwrap_or_else(|e| e.into_inner()),
        ),
    };
    let mut out = BatchOut {
        // About one token per three bytes of text at most on real corpora:
        // a buffer of a written batch, grown once, not a growing buffer's
        // page faults on every batch.
        tokens: {
            let mut tokens = shared
                .spare
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .pop()
                .unwrap_or_default();
            tokens.reserve(
                docs.iter()
                    .map(|d| match &d.payload {
                        Payload::Json(line) => line.len() / 3 + 2,
                        Payload::Text(text) => text.len() / 3 + 2,
                        Payload::Bad(_) => 0,
                    })
                    .sum(),
            );
            tokens
        },
        masks: Vec::new(),
        docs: Vec::with_capacity(docs.len()),
    };
    if let (Some(chat), Worker::Hf(tokenizer)) = (&shared.chat, &encoder) {
        for (i, doc) in docs.into_iter().enumerate() {
            let replay = first + (i as u64) < shared.replay_until;
            let start = out.tokens.len();
            let mut outcome = chat_row(shared, chat, tokenizer, doc, replay, &mut out);
            if replay {
                // Encoded again only to learn whether it was written, and its hash.
                out.tokens.truncate(start);
                out.masks.truncate(start);
                outcome = Outcome::Replay {
                    hash: match outcome {
                        Outcome::Doc { hash, .. } => Some(hash),
                        Outcome::Replay { hash } => hash,
                        _ => None,
                    },
                };
            }
            out.docs.push(outcome);
        }
        return out;
    }
    for (i, doc) in docs.into_iter().enumerate() {
        let replay = first + (i as u64) < shared.replay_until;
        let text = match &doc.payload {
            Payload::Json(line) => input::extract_text(line, &shared.key),
            Payload::Text(text) => Ok(std::borrow::Cow::Borrowed(text.as_str())),
            Payload::Bad(e) => Err(e.clone()),
        };
        let text = match text {
            Ok(text) => text,
            Err(e) => {
                out.docs.push(if replay {
                    Outcome::Replay { hash: None }
                } else {
                    Outcome::Bad {
                        file: doc.file,
                        loc: doc.loc,
                        error: Bad::Doc(e),
                    }
                });
                continue;
            }
        };
        let hash = if shared.dedup {
            xxh3_128(text.as_bytes())
        } else {
            0
        };
        if replay {
            out.docs.push(Outcome::Replay {
                hash: shared.dedup.then_some(hash),
            });
            continue;
        }
        let start = out.tokens.len();
        out.tokens.extend(shared.bos);
        let encoded = match &mut encoder {
            Worker::Hf(tokenizer) => tokenizer
                .encode_fast(text.as_ref(), false)
                .map(|encoding| out.tokens.extend_from_slice(encoding.get_ids()))
                .map_err(|e| e.to_string()),
            // Straight into the batch's buffer.
            Worker::Fast(fast, state) => {
                fast.encode(&text, state, &mut out.tokens);
                Ok(())
            }
        };
        match encoded {
            Ok(()) => {
                out.tokens.extend(shared.eos);
                out.docs.push(Outcome::Doc {
                    len: out.tokens.len() - start,
                    hash,
                    text_bytes: text.len(),
                    trainable: 0,
                    truncated: false,
                    placed_by_hf: false,
                });
            }
            Err(message) => {
                out.tokens.truncate(start);
                out.docs.push(Outcome::Bad {
                    file: doc.file,
                    loc: doc.loc,
                    error: Bad::Encode(message),
                })
            }
        }
    }
    out
}

/// One chat row: rendered, tokenized and masked into `out`, or why not.
/// A row's hash (for `--dedup`) is of its rendered text: the same
/// conversation in two rows is one, whatever else the rows hold (an id,
/// key order). A row an earlier run wrote is encoded again only when
/// deduplicating, to learn whether it was written and its hash (the
/// caller then takes it out of `out`).
fn chat_row(
    shared: &Shared,
    chat: &crate::chat::Chat,
    tokenizer: &Tokenizer,
    doc: RawDoc,
    replay: bool,
    out: &mut BatchOut,
) -> Outcome {
    let bad = |error: Bad| Outcome::Bad {
        file: doc.file,
        loc: doc.loc,
        error,
    };
    // The reader hands chat mode every row as JSON (see TextKey::whole_row).
    let line = match &doc.payload {
        Payload::Json(line) => line,
        Payload::Bad(e) => return bad(Bad::Doc(e.clone())),
        Payload::Text(_) => unreachable!("whole rows come as JSON"),
    };
    if replay && !shared.dedup {
        return Outcome::Replay { hash: None };
    }
    let row = match std::str::from_utf8(line) {
        Ok(row) => row,
        Err(e) => {
            return bad(Bad::Doc(DocError::InvalidUtf8 {
                offset: e.valid_up_to(),
            }))
        }
    };
    let start = out.tokens.len();
    let encoded = match chat.encode(row, tokenizer, &mut out.tokens, &mut out.masks) {
        Ok(encoded) => encoded,
        Err(e) => return bad(Bad::Chat(e)),
    };
    let mut len = out.tokens.len() - start;
    let mut trainable = encoded.trainable;
    let mut truncated = false;
    if let Some((max, overlong)) = shared.max_tokens.filter(|&(max, _)| len > max) {
        match overlong {
            crate::chat::Overlong::Drop => {
                out.tokens.truncate(start);
                out.masks.truncate(start);
                return Outcome::Unused { too_long: true };
            }
            crate::chat::Overlong::Truncate => {
                out.tokens.truncate(start + max);
                out.masks.truncate(start + max);
                trainable = out.masks[start..].iter().map(|&m| u64::from(m)).sum();
                len = max;
                truncated = true;
            }
        }
    }
    if trainable == 0 {
        out.tokens.truncate(start);
        out.masks.truncate(start);
        return Outcome::Unused { too_long: false };
    }
    Outcome::Doc {
        len,
        hash: encoded.text_hash,
        text_bytes: encoded.text_bytes,
        trainable,
        truncated,
        placed_by_hf: encoded.placed_by_hf,
    }
}

/// A worker's hold on the encoder for one batch.
enum Worker<'a> {
    Hf(std::sync::MutexGuard<'a, Tokenizer>),
    Fast(&'a FastTokenizer, std::sync::MutexGuard<'a, EncodeState>),
}

/// The writing side's state.
struct WriteState<'a> {
    writer: DatasetWriter,
    output: &'a mut Output,
    journal: Journal<(), Checkpoint>,
    counts: DocumentCounts,
    /// Chat mode's counts.
    chat: ChatCounts,
    text_bytes: u64,
    seen: HashSet<u128>,
    /// A deduplicating part keeps the text hash of every record it writes,
    /// in order, so that `prep merge` can drop duplicates across parts.
    hashes: Option<Vec<u128>>,
    /// Input documents seen so far, in reading order.
    position: u64,
    dedup: bool,
    skip_bad: bool,
    paths: Vec<PathBuf>,
    warnings: Vec<String>,
    run_text_bytes: u64,
    run_tokens: u64,
    run_documents: u64,
}

/// Receives batches in any order and writes them in input order.
fn write_in_order(
    state: &mut WriteState,
    results: Receiver<Message>,
    permits: SyncSender<()>,
    progress: &dyn Progress,
    input_done: &std::sync::atomic::AtomicU64,
    input_total: u64,
    spare: &Mutex<Vec<Vec<u32>>>,
) -> Result<(), TokenizeError> {
    let mut pending = BTreeMap::new();
    let mut next = 0u64;
    for (seq, batch) in results {
        pending.insert(seq, batch);
        while let Some(batch) = pending.remove(&next) {
            next += 1;
            let mut tokens = write_batch(state, batch?, progress)?;
            tokens.clear();
            spare.lock().unwrap_or_else(|e| e.into_inner()).push(tokens);
            // The reader may have finished; then a permit is not needed.
            let _ = permits.send(());
            // Rates are of this run's work: shards kept from an interrupted
            // run are not counted as if tokenized now.
            progress.update(&ProgressSnapshot {
                input_bytes: input_done.load(std::sync::atomic::Ordering::Relaxed),
                input_total,
                documents: state.run_documents,
                text_bytes: state.run_text_bytes,
                tokens: state.run_tokens,
            });
        }
    }
    Ok(())
}

/// Counts a bad chat row by its kind.
fn count_row_error(counts: &mut ChatCounts, error: &crate::chat::RowError) {
    use crate::chat::RowError;
    match error {
        RowError::Malformed(_) => counts.malformed += 1,
        RowError::Refused(_) => counts.refused += 1,
        RowError::Unverifiable(_) => counts.unverifiable += 1,
    }
}

/// Writes a batch; hands back its token buffer for reuse.
fn write_batch(
    state: &mut WriteState,
    batch: BatchOut,
    progress: &dyn Progress,
) -> Result<Vec<u32>, TokenizeError> {
    let mut cursor = 0usize;
    for outcome in batch.docs {
        let position = state.position;
        state.position += 1;
        match outcome {
            Outcome::Replay { hash } => {
                // A replayed document was written by the earlier run exactly
                // when its hash is new (bad ones have none).
                if let Some(hash) = hash {
                    let written = state.seen.insert(hash);
                    if let Some(hashes) = state.hashes.as_mut().filter(|_| written) {
                        hashes.push(hash);
                    }
                }
            }
            Outcome::Unused { too_long } => {
                state.counts.read += 1;
                if too_long {
                    state.chat.too_long += 1;
                } else {
                    state.chat.no_trainable_token += 1;
                }
            }
            Outcome::Bad { file, loc, error } => {
                if let Bad::Chat(e) = &error {
                    count_row_error(&mut state.chat, e);
                }
                if state.skip_bad {
                    state.counts.read += 1;
                    state.counts.skipped += 1;
                    // Past the warnings shown, a skipped document is only
                    // counted: its message (and the line count a part's
                    // location may need) is never made.
                    if state.warnings.len() >= MAX_WARNINGS {
                        continue;
                    }
                }
                let path = state.paths[file as usize].clone();
                let loc = input::resolve_location(&path, loc);
                let error = match error {
                    Bad::Doc(error) => TokenizeError::BadDocument { path, loc, error },
                    Bad::Encode(message) => TokenizeError::Encode { path, loc, message },
                    Bad::Chat(error) => TokenizeError::BadConversation { path, loc, error },
                };
                if !state.skip_bad {
                    return Err(error);
                }
                let text = error.to_string();
                let text = text
                    .trim_end_matches(" (pass --skip-bad to skip bad documents)")
                    .to_owned();
                progress.note(&format!("skipped: {text}"));
                state.warnings.push(text);
            }
            Outcome::Doc {
                len,
                hash,
                text_bytes,
                trainable,
                truncated,
                placed_by_hf,
            } => {
                let tokens = &batch.tokens[cursor..cursor + len];
                let mask = batch.masks.get(cursor..cursor + len);
                cursor += len;
                // Of every conversation tokenized, duplicates included: what
                // a merge of --dedup parts can sum exactly.
                state.chat.truncated += u64::from(truncated);
                state.chat.placed_by_hf += u64::from(placed_by_hf);
                if state.dedup && !state.seen.insert(hash) {
                    state.counts.read += 1;
                    state.counts.deduplicated += 1;
                    continue;
                }
                if let Some(hashes) = state.hashes.as_mut() {
                    hashes.push(hash);
                }
                // The checkpoint of a shard completed to make room for this
                // document: everything before it, nothing of it.
                let before = Checkpoint {
                    position,
                    documents: state.counts,
                    text_bytes: state.text_bytes,
                    chat: state.chat,
                };
                let sealed = match mask {
                    Some(mask) if state.writer.is_masked() => {
                        state.writer.push_masked(tokens, mask)?
                    }
                    _ => state.writer.push(tokens)?,
                };
                if let Some(sealed) = sealed {
                    state.journal.shards.push(Done {
                        shard: sealed.clone(),
                        at: before,
                    });
                    state.output.save(&state.journal)?;
                }
                state.counts.read += 1;
                state.counts.written += 1;
                state.counts.empty += u64::from(text_bytes == 0);
                state.chat.trainable_tokens += trainable;
                state.text_bytes += text_bytes as u64;
                state.run_text_bytes += text_bytes as u64;
                state.run_tokens += len as u64;
                state.run_documents += 1;
            }
        }
    }
    Ok(batch.tokens)
}
