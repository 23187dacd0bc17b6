//! `prep import`: another trainer's token files into a prep dataset.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Instant;

use clap::Parser;

use super::write_flags::WriteFlags;

use prep::engine::{token_arg, LoadedTokenizer, Readings};
use prep::interop::{self, Format, ImportConfig};

/// Read token files of another trainer into a prep dataset (shards,
/// checksums, manifest).
///
/// megatron and datatrove inputs are path prefixes (OUT of prep export, or
/// their own), and each sequence or document becomes a record. nanogpt
/// files and llm.c shards (a directory, or shard files) keep no document
/// boundaries: --eos ID ends a record after each end-of-text token (before
/// each, with --eot-first, the token then moving to the record's end);
/// without --eos each input is one record. Inputs are read in the order given.
#[derive(Debug, Parser)]
#[command(
    after_help = sizes_then!("Exit codes: 0 success, 2 usage error or a file that is not what its format says.")
)]
pub(crate) struct Args {
    /// The format of the inputs.
    #[arg(value_enum, value_name = "FORMAT")]
    format: ImportFormat,

    /// Inputs, then the output dataset directory. (Counted in `run`, not by
    /// clap: a minimum here would make clap refuse options between paths.)
    #[arg(value_name = "PATH", required = true)]
    paths: Vec<PathBuf>,

    /// A tokenizer.json (or .json.zst/.gz) to copy into the dataset; the
    /// vocabulary size and dtype come from it. [default: the largest id + 1]
    #[arg(long, value_name = "FILE")]
    tokenizer: Option<PathBuf>,

    /// The end-of-text token: an id (a whole number is always an id), or a
    /// token string of --tokenizer (token:TEXT for a token whose text is digits).
    /// nanogpt, llmc: a record ends after each (before each with
    /// --eot-first); every format: the manifest records it.
    #[arg(long, value_name = "TOKEN")]
    eos: Option<String>,

    /// llmc: the end-of-text token comes before each document.
    #[arg(long, requires = "eos")]
    eot_first: bool,

    #[command(flatten)]
    write: WriteFlags,
}

/// The formats prep reads back: every export format but olmo-core, whose
/// files (label masks beside ids) have no import, so that clap refuses it
/// with the list of what is accepted rather than the run failing later.
#[derive(Debug, Clone, Copy, clap::ValueEnum)]
enum ImportFormat {
    /// Megatron-LM / NeMo indexed dataset (.bin + .idx).
    Megatron,
    /// nanoGPT flat uint16 file.
    Nanogpt,
    /// llm.c token shards.
    Llmc,
    /// datatrove / nanotron (.ds, .ds.index, .ds.metadata).
    Datatrove,
}

impl ImportFormat {
    fn format(self) -> Format {
        match self {
            ImportFormat::Megatron => Format::Megatron,
            ImportFormat::Nanogpt => Format::NanoGpt,
            ImportFormat::Llmc => Format::Llmc,
            ImportFormat::Datatrove => Format::Datatrove,
        }
    }
}

pub(crate) fn run(mut args: Args) -> anyhow::Result<ExitCode> {
    if args.paths.len() < 2 {
        anyhow::bail!("give at least one input and then the output directory");
    }
    let output = args.paths.pop().expect("two paths");
    let eos = match (&args.eos, &args.tokenizer) {
        (None, _) => None,
        (Some(value), Some(path)) => {
            let (tok, _) = LoadedTokenizer::load_with_fast(path, Readings::Fast)?;
            Some(tok.resolve("--eos", value)?)
        }
        (Some(value), None) => Some(token_arg("--eos", value, None, None).map_err(|mut e| {
            e.why += " (pass --tokenizer to give a token string)";
            e
        })?),
    };
    let config = ImportConfig {
        format: args.format.format(),
        inputs: args.paths,
        output,
        tokenizer: args.tokenizer,
        eos,
        eot_first: args.eot_first,
        writing: args.write.writing(),
    };
    let started = Instant::now();
    let m = interop::import(&config)?;
    if !args.write.quiet {
        let secs = started.elapsed().as_secs_f64().max(1e-9);
        let bytes: u64 = m.shards.iter().map(|s| s.bin_bytes).sum();
        eprintln!(
            "Imported {} records ({} tokens, {}) from {} files of {} in {:.1}s ({:.0} MB/s) into {}.",
            m.n_records,
            m.n_tokens,
            m.dtype,
            m.provenance.inputs.len(),
            config.format.name(),
            secs,
            bytes as f64 / 1e6 / secs,
            config.output.display()
        );
    }
    Ok(ExitCode::SUCCESS)
}

#[cfg(test)]
mod tests {
    use clap::error::ErrorKind;
    use clap::Parser;

    use super::super::Cli;

    #[test]
    fn olmo_core_is_refused_when_the_command_line_is_parsed() {
        let err = Cli::try_parse_from(["prep", "import", "olmo-core", "in", "out"]).unwrap_err();
        assert_eq!(err.kind(), ErrorKind::InvalidValue, "{err}");
        let text = err.to_string();
        assert!(text.contains("olmo-core"), "{text}");
        assert!(
            text.contains("megatron") && text.contains("datatrove"),
            "{text}"
        );
        for format in ["megatron", "nanogpt", "llmc", "datatrove"] {
            Cli::try_parse_from(["prep", "import", format, "in", "out"])
                .unwrap_or_else(|e| panic!("{format}: {e}"));
        }
    }
}
