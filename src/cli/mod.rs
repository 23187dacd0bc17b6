//! The `prep` command line: flags become a library config, nothing more.
//!
//! Exit codes scripts can rely on: 0 success, 1 a check found problems
//! (`prep validate`), 2 a usage, input or I/O error; 130 and 143 when
//! Ctrl-C (SIGINT) or SIGTERM ended the command (see [`interrupt`]).

use std::ffi::OsString;
use std::io::{IsTerminal, Write};
use std::process::ExitCode;

use clap::{Parser, Subcommand};

/// The end of the help of a command that takes sizes: how a size is
/// written (the rule of `prep::size`, said once), then the command's exit
/// codes. A macro, since clap's attribute takes a literal built by
/// `concat!`; defined before the subcommands' modules, which use it.
macro_rules! sizes_then {
    ($exit_codes:literal) => {
        concat!(
            "Sizes are bytes or take a unit: KB, MB, GB (powers of 1000) or KiB, MiB, GiB \
             (powers of 1024).\n",
            $exit_codes
        )
    };
}

pub mod allocator;
mod bench_read;
mod dedup;
#[cfg(test)]
mod docs_check;
mod export;
mod fetch;
mod import;
mod inspect;
mod interrupt;
mod merge;
mod mix;
mod pack;
mod progress;
mod sample;
mod shuffle;
mod split;
mod tokenize;
mod validate;
mod write_flags;

/// Offline dataset preparation for LLM pretraining: tokenize raw text into
/// sharded, mmap-able token datasets.
#[derive(Debug, Parser)]
#[command(name = "prep", version, about, long_about = None, propagate_version = true)]
pub struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Tokenize JSONL (plain, .gz, .zst), Parquet or Arrow into a sharded token dataset.
    Tokenize(tokenize::Args),
    /// Shuffle documents into an exact, uniformly random order in bounded memory.
    Shuffle(shuffle::Args),
    /// Pack documents into rows of exactly --seq-len tokens (bestfit or concat).
    Pack(pack::Args),
    /// Mix datasets by weight into one shuffled dataset of an exact number of tokens.
    Mix(mix::Args),
    /// Split a dataset's documents into train, val (and test) by a hash of their ids.
    Split(split::Args),
    /// Remove near-duplicate documents (MinHash over token shingles), with a report.
    Dedup(dedup::Args),
    /// Join the partial datasets of a --part run (or shuffle buckets) into one dataset, without copying tokens.
    Merge(merge::Args),
    /// Write a dataset as Megatron-LM, nanoGPT, llm.c, datatrove or OLMo-core token files.
    Export(export::Args),
    /// Read Megatron-LM, nanoGPT, llm.c or datatrove token files into a dataset.
    Import(import::Args),
    Fetch(fetch::Args),
    /// Check a dataset: manifest, sizes, checksums, headers, offsets, ids, eos.
    Validate(validate::Args),
    /// Measure the batch loader: tokens/s to host memory or a GPU, copy bandwidth, waits per step.
    BenchRead(bench_read::Args),
    /// Print the record indices one rank reads in one epoch (the training sampler's order).
    Sample(sample::Args),
    /// Show what a dataset holds: counts, shards, record lengths, one record.
    Inspect(inspect::Args),
}

impl Command {
    /// What to do after an interrupt, printed after `prep: interrupted: `:
    /// a command that writes through a journal resumes when run again; an
    /// import starts over; an export's finished files are in place; a
    /// command that only reads has nothing to say.
    fn after_interrupt(&self) -> &'static str {
        match self {
            Command::Tokenize(_)
            | Command::Shuffle(_)
            | Command::Pack(_)
            | Command::Mix(_)
            | Command::Split(_)
            | Command::Dedup(_)
            | Command::Merge(_)
            | Command::Fetch(_) => "re-run the same command to resume",
            Command::Import(_) => "re-run the same command to start the import again",
            Command::Export(_) => {
                "re-run the same command with --overwrite to write the exported files again"
            }
            Command::Validate(_)
            | Command::BenchRead(_)
            | Command::Sample(_)
            | Command::Inspect(_) => "",
        }
    }
}

/// Exit code for usage, input and I/O errors.
pub const EXIT_ERROR: u8 = 2;

/// Parses the process's command line, runs the subcommand and maps the
/// outcome to an exit code.
pub fn run() -> ExitCode {
    run_from(std::env::args_os())
}

/// [`run`] on the given command line, `args[0]` the program's name (the
/// usage and clap's messages name the file it names).
pub fn run_from<I, T>(args: I) -> ExitCode
where
    I: IntoIterator<Item = T>,
    T: Into<OsString> + Clone,
{
    ExitCode::from(run_code(args, Signals::Handle))
}

/// Whether the command handles Ctrl-C and SIGTERM itself.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Signals {
    /// The process is the command line: a signal prints what to do next
    /// and ends it with 128 + the signal's number (130, 143).
    Handle,
    /// The caller's handlers stay as they are (a library's caller, whose
    /// Python KeyboardInterrupt must keep working after the command).
    // Chosen by the Python extension only.
    #[allow(dead_code)]
    Leave,
}

/// [`run_from`] with the exit status as a number, for a caller that is not
/// `main` and hands it on itself (the Python extension, python/native):
/// 0 success, 1 a check found problems, [`EXIT_ERROR`] anything else.
/// Ctrl-C and SIGTERM are handled as `signals` says. Stdout is flushed
/// before it returns: a process that does not end through Rust's `main`
/// would not flush it at exit.
pub fn run_code<I, T>(args: I, signals: Signals) -> u8
where
    I: IntoIterator<Item = T>,
    T: Into<OsString> + Clone,
{
    let code = dispatch(args, signals);
    // Errors are the ones the command already met or ignored (a closed
    // pipe is not an error), so the status stays.
    let _ = std::io::stdout().flush();
    code
}

fn dispatch<I, T>(args: I, signals: Signals) -> u8
where
    I: IntoIterator<Item = T>,
    T: Into<OsString> + Clone,
{
    let cli = match Cli::try_parse_from(args) {
        Ok(cli) => cli,
        Err(e) => {
            let code = if e.use_stderr() { EXIT_ERROR } else { 0 };
            let _ = e.print();
            return code;
        }
    };
    // Checked before any work, so that a run meant to be reproducible
    // does not write a manifest with the clock's time instead.
    if let Err(why) = prep::util::source_date_epoch() {
        eprintln!("prep: error: {why}");
        return EXIT_ERROR;
    }
    if signals == Signals::Handle {
        interrupt::handle(cli.command.after_interrupt());
    }
    let result = match cli.command {
        Command::Tokenize(args) => tokenize::run(args),
        Command::Shuffle(args) => shuffle::run(args),
        Command::Pack(args) => pack::run(args),
        Command::Mix(args) => mix::run(args),
        Command::Split(args) => split::run(args),
        Command::Dedup(args) => dedup::run(args),
        Command::Merge(args) => merge::run(args),
        Command::Validate(args) => validate::run(args),
        Command::Export(args) => export::run(args),
        Command::Import(args) => import::run(args),
        Command::Fetch(args) => fetch::run(args),
        Command::Inspect(args) => inspect::run(args),
        Command::Sample(args) => sample::run(args),
        Command::BenchRead(args) => bench_read::run(args),
    };
    match result {
        Ok(code) => status(code),
        Err(e) => {
            if is_broken_pipe(&e) {
                return 0;
            }
            eprintln!("prep: error: {}", describe(&e));
            EXIT_ERROR
        }
    }
}

/// The number an [`ExitCode`] stands for. The subcommands return
/// `ExitCode`, the type `main` returns, and std offers no way back to the
/// number; on every platform prep runs on, `ExitCode::from(n)` for the 256
/// values of a `u8` are distinct, so the search finds exactly one.
fn status(code: ExitCode) -> u8 {
    (0..=u8::MAX)
        .find(|&n| ExitCode::from(n) == code)
        .unwrap_or(EXIT_ERROR)
}

/// The error and its causes, joined by ": ". Each of prep's error
/// variants either prints its cause or returns it as a source, never both
/// (tests/it/errors.rs holds this for the errors users meet), so nothing repeats.
fn describe(e: &anyhow::Error) -> String {
    format!("{e:#}")
}

/// A closed stdout (`prep ... | head`) is not an error.
fn is_broken_pipe(e: &anyhow::Error) -> bool {
    e.chain().any(|c| {
        c.downcast_ref::<std::io::Error>()
            .is_some_and(|io| io.kind() == std::io::ErrorKind::BrokenPipe)
    })
}

/// True when stderr is a terminal a progress bar can be drawn on.
fn stderr_is_terminal() -> bool {
    std::io::stderr().is_terminal()
}

/// `n` with its noun, singular for one: "1 shard", "10 shards".
pub(crate) fn count(n: u64, noun: &str) -> String {
    match n {
        1 => format!("1 {noun}"),
        n => format!("{n} {noun}s"),
    }
}

/// " Peak memory X." when the platform tells, else nothing: the end of a
/// stage's summary.
pub(crate) fn peak() -> String {
    prep::util::peak_rss_bytes().map_or(String::new(), |p| {
        format!(" Peak memory {}.", prep::size::format_bytes(p))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn status_is_the_number_the_exit_code_was_made_from() {
        assert_eq!(status(ExitCode::SUCCESS), 0);
        assert_eq!(status(ExitCode::FAILURE), 1);
        for n in 0..=u8::MAX {
            assert_eq!(status(ExitCode::from(n)), n);
        }
    }
}
