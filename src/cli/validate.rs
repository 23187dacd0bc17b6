//! `prep validate`: flags to a [`ValidateConfig`], the report to stdout.

use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;

use clap::Parser;

use prep::size::format_bytes;
use prep::validate::{self, Report, ValidateConfig};

/// Check a dataset: everything a reader relies on.
///
/// The manifest against its schema; every listed file present with its size
/// and checksum, and no unlisted shard; each index header against the
/// manifest and its .bin; offsets from 0, never decreasing, ending at the
/// token count; every id below vocab_size; eos (bos) at the end (start) of
/// every record when the manifest says they were added. Every problem is
/// reported with its file and position, up to a number per kind.
#[derive(Debug, Parser)]
#[command(
    after_help = "Exit codes: 0 valid, 1 problems found, 2 could not run (no such directory, unreadable manifest; for a dataset in object storage also a missing bucket, refused credentials, a dropped connection)."
)]
pub(crate) struct Args {
    /// The dataset directory, or an object-storage address
    /// (s3://bucket/prefix, gs://, az://, https://) checked in place: each
    /// object is streamed through the checks by ranged GETs, never held whole.
    #[arg(value_name = "DIR")]
    dir: PathBuf,

    /// Print the report as JSON (schemas/validate-report.schema.json), also
    /// when the dataset cannot be checked at all (then with an "error").
    #[arg(long)]
    json: bool,

    /// Skip the checksums; every other check still runs.
    #[arg(long)]
    quick: bool,

    /// Worker threads; 0 uses every core.
    #[arg(long, short = 't', value_name = "N", default_value_t = 0)]
    threads: usize,

    /// Problems listed per kind; the rest are counted.
    #[arg(long, value_name = "N", default_value_t = 20)]
    max_per_kind: usize,
}

pub(crate) fn run(args: Args) -> anyhow::Result<ExitCode> {
    let mut config = ValidateConfig::new(args.dir);
    config.quick = args.quick;
    config.threads = args.threads;
    config.max_per_kind = args.max_per_kind;
    let report = match validate::validate(&config) {
        Ok(report) => report,
        // A script reading --json gets a report even now; the error still
        // goes to stderr and the exit code stays 2 (could not run).
        Err(e) if args.json => {
            print_json(&Report::could_not_run(&config, &e))?;
            return Err(e.into());
        }
        Err(e) => return Err(e.into()),
    };
    if args.json {
        print_json(&report)?;
    } else {
        let mut out = std::io::stdout().lock();
        write!(out, "{}", human(&report))?;
        out.flush()?;
    }
    Ok(if report.valid {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    })
}

fn print_json(report: &Report) -> anyhow::Result<()> {
    let mut out = std::io::stdout().lock();
    serde_json::to_writer_pretty(&mut out, report)?;
    writeln!(out)?;
    out.flush()?;
    Ok(())
}

/// The report for people: a verdict, one line per problem, what was checked.
fn human(r: &Report) -> String {
    let mut s = String::new();
    let c = &r.checked;
    if r.valid {
        s += &format!("{}: valid\n", r.dataset);
    } else {
        s += &format!(
            "{}: INVALID, {}\n",
            r.dataset,
            super::count(r.total_problems(), "problem")
        );
        for p in &r.problems {
            let mut at = Vec::new();
            if let Some(shard) = p.shard {
                at.push(format!("shard {shard}"));
            }
            if let Some(file) = &p.file {
                at.push(file.clone());
            }
            if let Some(record) = p.record {
                at.push(format!("record {record}"));
            }
            if let Some(token) = p.token {
                at.push(format!("token {token}"));
            }
            let kind = serde_json::to_value(p.kind).expect("a kind serializes");
            s += &format!(
                "  {}: {}: {}\n",
                kind.as_str().unwrap_or("problem"),
                at.join(", "),
                p.message
            );
        }
        for (kind, n) in &r.omitted {
            let kind = serde_json::to_value(kind).expect("a kind serializes");
            s += &format!(
                "  ... and {n} more {} problems\n",
                kind.as_str().unwrap_or("other")
            );
        }
    }
    for note in &r.notes {
        s += &format!("  note: {}: {}\n", note.file, note.message);
    }
    s += &format!(
        "Checked {}, {} records, {} tokens, {} ({}) in {:.2}s: {:.0} MB/s.\n",
        super::count(c.shards, "shard"),
        c.records,
        c.tokens,
        format_bytes(c.bytes),
        if c.checksums {
            "checksums verified"
        } else {
            "checksums skipped, --quick"
        },
        c.seconds,
        c.bytes as f64 / 1e6 / c.seconds.max(1e-9),
    );
    s
}
