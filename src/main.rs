use std::process::ExitCode;

fn main() -> ExitCode {
    prep::cli::run()
}
