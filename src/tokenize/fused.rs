//! `prep tokenize --shuffle-seed S`: tokenize, then shuffle, as one command.
//!
//! The documents are tokenized into a hidden dataset inside the output
//! directory (`.tokenized`, resumable like any tokenize run), which is then
//! shuffled into the output directory (resumable like any shuffle) and
//! removed. The shards are therefore byte-identical to `prep tokenize` then
//! `prep shuffle --seed S` with the same shard size; the manifest records the
//! run as a tokenize, with its raw inputs and the seed among its options.
//! The token data is written and read once more than a single pass would
//! need, which costs little next to tokenizing it.

use std::time::Instant;

use super::{Progress, TokenizeConfig, TokenizeError, TokenizeReport};
use crate::format::{InputInfo, Manifest, Provenance, MANIFEST_FILE};
use crate::shuffle::{self, ShuffleConfig};

/// The tokenized dataset's folder inside the output directory.
const STAGE: &str = ".tokenized";

/// What the fused run records, decided before any work.
pub(super) struct Plan {
    pub inputs: Vec<InputInfo>,
    pub options: serde_json::Value,
    pub fingerprint: String,
    pub eos_note: String,
    pub engine_note: String,
    pub threads: usize,
    pub seed: u64,
}

pub(super) fn run(
    config: &TokenizeConfig,
    plan: Plan,
    started: Instant,
    progress: &dyn Progress,
) -> Result<TokenizeReport, TokenizeError> {
    let dir = &config.output;
    let stage = dir.join(STAGE);
    let io = |path: &std::path::Path| {
        let path = path.to_path_buf();
        move |e| TokenizeError::Io { path, source: e }
    };
    if config.overwrite && dir.exists() {
        std::fs::remove_dir_all(dir).map_err(io(dir))?;
    }
    if dir.join(MANIFEST_FILE).exists() {
        let manifest = Manifest::read(dir)?;
        if manifest.provenance.fingerprint != plan.fingerprint {
            return Err(TokenizeError::OutputExists {
                dir: dir.clone(),
                why: "holds a dataset made from other inputs or options (pass --overwrite to replace it)".into(),
            });
        }
        // A run stopped between the shuffle and this cleanup.
        if stage.exists() {
            std::fs::remove_dir_all(&stage).map_err(io(&stage))?;
        }
        progress.note("the dataset is already complete; nothing to do");
        return Ok(report(manifest, true, &plan, started, None));
    }

    // Refuse foreign files now, not after hours of tokenizing.
    if dir.exists() {
        let ours = |name: &str| {
            [
                STAGE,
                ".prep-journal.json",
                ".shuffle-tmp",
                "tokenizer.json",
            ]
            .contains(&name)
                || (name.starts_with("shard-")
                    && [".bin", ".idx", ".tmp"].iter().any(|e| name.ends_with(e)))
        };
        let foreign = std::fs::read_dir(dir)
            .map_err(io(dir))?
            .filter_map(Result::ok)
            .any(|e| !ours(&e.file_name().to_string_lossy()));
        if foreign {
            return Err(TokenizeError::OutputExists {
                dir: dir.clone(),
                why: "is not empty (choose an empty or new directory, or pass --overwrite)".into(),
            });
        }
    }
    let mut tokenize = config.clone();
    tokenize.output = stage.clone();
    tokenize.shuffle_seed = None;
    tokenize.overwrite = false;
    let tokenized = super::run(&tokenize, progress)?;
    let documents = tokenized.manifest.provenance.documents;

    let mut shuffle_config = ShuffleConfig::new(vec![stage.clone()], dir, plan.seed);
    shuffle_config.memory = config.shuffle_memory;
    shuffle_config.shard_size = config.shard_size;
    shuffle_config.threads = config.threads;
    shuffle_config.keep = vec![STAGE.into()];
    // The shuffle stamps its own time of writing on it.
    shuffle_config.record_as = Some(Provenance::new(
        "tokenize",
        plan.inputs.clone(),
        plan.options.clone(),
        documents,
        plan.fingerprint.clone(),
    ));
    progress.note(&format!("shuffling with seed {}", plan.seed));
    let shuffled = shuffle::run(&shuffle_config, progress)?;
    std::fs::remove_dir_all(&stage).map_err(io(&stage))?;
    Ok(report(
        shuffled.manifest,
        false,
        &plan,
        started,
        Some(tokenized),
    ))
}

fn report(
    manifest: Manifest,
    already_complete: bool,
    plan: &Plan,
    started: Instant,
    tokenized: Option<TokenizeReport>,
) -> TokenizeReport {
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
}
