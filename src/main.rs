use std::process::ExitCode;

// Tokenization allocates small strings and vectors at a high rate on every
// worker thread; see the commit that introduced this for the measurement.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> ExitCode {
    prep::cli::run()
}
