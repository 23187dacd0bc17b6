//! `prep fetch`: flags to a [`FetchConfig`], a one-line summary to stderr.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Parser;

use prep::fetch::{self, FetchConfig};
use prep::size::format_bytes;

/// Bring a dataset down from object storage, verifying it on the way.
///
/// Every file the manifest lists is checked against its size and XXH3-64 as
/// it arrives and renamed into place only then; the manifest comes last, so
/// a directory with a manifest is a complete, verified dataset. A fetch that
/// was stopped resumes from the shards already verified. Credentials and
/// endpoints come from the environment (AWS_ACCESS_KEY_ID,
/// AWS_SECRET_ACCESS_KEY, AWS_REGION, AWS_ENDPOINT_URL, AWS_ALLOW_HTTP;
/// GOOGLE_APPLICATION_CREDENTIALS; AZURE_STORAGE_*).
#[derive(Debug, Parser)]
#[command(
    after_help = "Exit codes: 0 success, 2 usage error, an object missing, corrupt or unreadable, or a refused directory."
)]
pub(crate) struct Args {
    /// The dataset: s3://bucket/prefix (or gs://, az://, https://), the
    /// folder holding manifest.json.
    #[arg(value_name = "URL")]
    source: String,

    /// The local directory to write.
    #[arg(value_name = "DIR")]
    dest: PathBuf,

    /// Replace prep's files in a directory that holds another dataset.
    #[arg(long)]
    overwrite: bool,
}

pub(crate) fn run(args: Args) -> anyhow::Result<ExitCode> {
    let config = FetchConfig {
        source: args.source,
        dest: args.dest,
        overwrite: args.overwrite,
    };
    let summary = fetch::fetch(&config)?;
    if summary.complete {
        eprintln!(
            "{}: already holds this dataset, complete",
            config.dest.display()
        );
    } else {
        eprintln!(
            "fetched {} files, {} into {} (verified){}",
            summary.files,
            format_bytes(summary.bytes),
            config.dest.display(),
            if summary.resumed_shards > 0 {
                format!("; {} shards were already in place", summary.resumed_shards)
            } else {
                String::new()
            }
        );
    }
    Ok(ExitCode::SUCCESS)
}
