//! Two stages composed: `prep tokenize --shuffle-seed S`, tokenize then
//! shuffle as one command.
//!
//! The documents are tokenized into a hidden dataset inside the output
//! directory (`.tokenized`, resumable like any tokenize run), which is then
//! shuffled into the output directory (resumable like any shuffle) and
//! removed. The shards are therefore byte-identical to `prep tokenize` then
//! `prep shuffle --seed S` with the same shard size; the manifest records the
//! run as a tokenize, with its raw inputs and the seed among its options.
//! The token data is written and read once more than a single pass would
//! need, which costs little next to tokenizing it.
//!
//! The output directory is locked and checked (refused if foreign, replaced
//! with `--overwrite`) before the first document is read, and stays locked
//! until the shuffle commits, through one [`Output`].

use std::time::Instant;

use crate::format::FormatError;
use crate::output::{Output, OutputError, Start, WORK_FOLDERS};
use crate::progress::Progress;
use crate::shuffle::{self, ShuffleConfig, ShuffleError};
use crate::tokenize::{self, TokenizeConfig, TokenizeError, TokenizeReport};

/// The tokenized dataset's folder inside the output directory.
const STAGE: &str = WORK_FOLDERS[1];

/// Every way the composed run can fail: a stage's error, as that stage
/// says it.
#[derive(Debug, thiserror::Error)]
pub enum PipelineError {
    /// The tokenize stage failed.
    #[error(transparent)]
    Tokenize(#[from] TokenizeError),
    /// The shuffle stage failed.
    #[error(transparent)]
    Shuffle(#[from] ShuffleError),
    /// The output directory was refused or is held by another run.
    #[error(transparent)]
    Output(#[from] OutputError),
    /// Removing the finished stage failed.
    #[error(transparent)]
    Format(#[from] FormatError),
}

/// What `prep tokenize --shuffle-seed S` is asked to do.
#[derive(Debug, Clone)]
pub struct TokenizeThenShuffle {
    /// The tokenize stage, as `prep tokenize` without a seed would run it
    /// (its output is the composed run's output).
    pub tokenize: TokenizeConfig,
    /// The seed of the shuffle: the output is identical to tokenize then
    /// `prep shuffle --seed` with it.
    pub seed: u64,
    /// Memory budget of the shuffle.
    pub memory: u64,
}

impl TokenizeThenShuffle {
    /// The composed run with the CLI's default shuffle memory (4 GiB).
    pub fn new(tokenize: TokenizeConfig, seed: u64) -> TokenizeThenShuffle {
        TokenizeThenShuffle {
            tokenize,
            seed,
            memory: 4 << 30,
        }
    }
}

/// Runs tokenize then shuffle (see the [module docs](self)).
pub fn run(
    composed: &TokenizeThenShuffle,
    progress: &dyn Progress,
) -> Result<TokenizeReport, PipelineError> {
    let (config, seed) = (&composed.tokenize, composed.seed);
    if config.part.is_some() {
        return Err(TokenizeError::Usage(
            "--part and --shuffle-seed do not go together: shuffle a partitioned run with \
             prep shuffle --scatter/--gather after prep merge"
                .into(),
        )
        .into());
    }
    let started = Instant::now();
    let plan = tokenize::plan(config)?.with_option("shuffle_seed", seed.into());
    let dir = &config.output;
    let mut output = Output::lock(dir, config.writing.single_writer)?.keeping(STAGE);
    // In the output directory, or in its staging folder when the output is
    // in object storage: the stage itself never leaves this machine.
    let stage = output.dir().join(STAGE);
    // Refuse foreign files, or find the finished dataset, before hours of
    // tokenizing; the shuffle's own journal is checked when it starts.
    let report = |manifest, already_complete, tokenized: Option<TokenizeReport>| {
        let t = tokenized.as_ref();
        TokenizeReport {
            manifest,
            already_complete,
            resumed_shards: t.map_or(0, |t| t.resumed_shards),
            elapsed: started.elapsed(),
            text_bytes: t.map_or(0, |t| t.text_bytes),
            tokens: t.map_or(0, |t| t.tokens),
            documents: t.map_or(0, |t| t.documents),
            threads: plan.threads,
            eos_note: plan.eos_note.clone(),
            engine_note: plan.engine_note.clone(),
            warnings: t.map_or_else(Vec::new, |t| t.warnings.clone()),
        }
    };
    let start = output.start::<shuffle::JournalState, shuffle::Checkpoint>(
        &plan.identity.fingerprint,
        config.writing.overwrite,
    )?;
    if config.writing.overwrite {
        // prep's own stage goes with prep's other files; inputs and foreign
        // files stay.
        output.remove_work_folder(STAGE)?;
    }
    if let Start::Complete(manifest) = start {
        // A run stopped between the shuffle's commit and this cleanup.
        output.remove_work_folder(STAGE)?;
        progress.note("the dataset is already complete; nothing to do");
        return Ok(report(*manifest, true, None));
    }

    let mut tokenize_config = config.clone();
    tokenize_config.output = stage.clone();
    tokenize_config.writing.overwrite = false;
    let tokenized = tokenize::run(&tokenize_config, progress)?;
    let documents = tokenized.manifest.provenance.documents;

    let mut shuffle_config = ShuffleConfig::new(vec![stage.clone()], dir, seed);
    shuffle_config.memory = composed.memory;
    shuffle_config.writing.shard_size = config.writing.shard_size;
    shuffle_config.threads = config.threads;
    // The output is this command's; the shuffle stamps its own time of
    // writing on the provenance.
    let recorded = plan.identity.provenance(plan.options.clone(), documents);
    progress.note(&format!("shuffling with seed {seed}"));
    let shuffled = shuffle::run_in(&shuffle_config, &recorded, output, progress)?;
    // (Gone already when the output is in object storage: its staging
    // folder goes with the commit.)
    match std::fs::remove_dir_all(&stage) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
            return Err(FormatError::io(&stage, e).into())
        }
        _ => {}
    }
    Ok(report(shuffled.manifest, false, Some(tokenized)))
}
