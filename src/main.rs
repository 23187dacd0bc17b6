use std::process::ExitCode;

// The command line lives in the binary, not the library: the library's API
// is the configs and stages it calls, without clap, anyhow or indicatif.
mod cli;

// Tokenization allocates small strings and vectors at a high rate on every
// worker thread; see the commit that introduced this for the measurement.
// Its settings are in cli::allocator, shared with the Python extension.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> ExitCode {
    cli::allocator::configure();
    cli::run()
}
