//! `prep._native`, the compiled part of the pip package prep-llm: the
//! `prep` command line, which the console script `prep`
//! (python/prep/_cli.py) runs; the streaming reader (stream.rs) under
//! `prep.StreamingDataset`; the GPU loader (device.rs) under
//! `prep.DeviceLoader`; the fast tokenizer engine (tokenizer.rs) under
//! `prep.Tokenizer`. pyproject.toml builds it with maturin.

use std::ffi::OsString;
use std::panic::{self, AssertUnwindSafe};

use pyo3::prelude::*;

mod device;
mod stream;
mod tokenizer;

// The command line is the binary's own source, compiled into this crate, so
// `prep` from the wheel and `prep` from `cargo install` are one program. It
// sits at this crate's root as at the binary's, so its `crate::cli::...`
// paths resolve alike. dead_code: the binary's entry points (`run`,
// `run_from`) are unused here; the binary's build still lints all of it.
#[allow(dead_code)]
#[path = "../../../src/cli/mod.rs"]
mod cli;

// The binary's allocator (see src/main.rs); its settings are applied by
// `main`, as the binary's `main` applies them.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// The exit status of a command that panicked, as Rust's runtime gives a
/// binary whose main thread panics.
const EXIT_PANIC: u8 = 101;

/// Runs the `prep` command line `argv` (`argv[0]` the program's name, as in
/// `sys.argv`) and returns its exit status: 0 success, 1 a check found
/// problems, 2 a usage, input or I/O error, 101 a panic. The command writes
/// to the process's stdout and stderr (file descriptors 1 and 2, not
/// `sys.stdout`) and runs with the GIL released.
///
/// With `handle_signals` (the console script, a process that is only the
/// command), SIGINT and SIGTERM end the process as they end the binary:
/// a line saying what to do next, exit status 130 or 143; the handlers
/// stay for the rest of the process. Without, the process's handlers are
/// left alone, and Python's SIGINT handler runs only when the command
/// returns.
#[pyfunction]
#[pyo3(signature = (argv, handle_signals = false))]
fn main(py: Python<'_>, argv: Vec<OsString>, handle_signals: bool) -> u8 {
    let signals = if handle_signals {
        cli::Signals::Handle
    } else {
        cli::Signals::Leave
    };
    py.detach(|| {
        cli::allocator::configure();
        // A panic's message is printed by the panic hook, as in the binary;
        // nothing the command holds is used after it.
        panic::catch_unwind(AssertUnwindSafe(|| cli::run_code(argv, signals))).unwrap_or(EXIT_PANIC)
    })
}

/// Bytes from a size string as the command line reads it ("20GiB",
/// "512MB", "4096", "1.5GB"): prep's one parser (src/size.rs), so that a
/// size means the same from Python as on the command line. A string it
/// refuses raises ValueError with its message.
#[pyfunction]
fn parse_size(text: &str) -> PyResult<u64> {
    prep::size::parse_size(text).map_err(pyo3::exceptions::PyValueError::new_err)
}

/// prep's Rust code for the pip package prep-llm (the `prep` command line,
/// the streaming reader, the GPU loader and the tokenizer).
#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    m.add_function(wrap_pyfunction!(main, m)?)?;
    m.add_function(wrap_pyfunction!(parse_size, m)?)?;
    stream::register(m)?;
    device::register(m)?;
    tokenizer::register(m)?;
    Ok(())
}
