use std::process::ExitCode;

// The command line lives in the binary, not the library: the library's API
// is the configs and stages it calls, without clap, anyhow or indicatif.
mod cli;

// Tokenization allocates small strings and vectors at a high rate on every
// worker thread; see the commit that introduced this for the measurement.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// mimalloc's option number for `purge_delay` (`mi_option_purge_delay` in
/// its header; the Rust bindings do not name it).
const MI_OPTION_PURGE_DELAY: libmimalloc_sys::mi_option_t = 15;

fn main() -> ExitCode {
    // By default mimalloc gives freed pages back to the OS after 10 ms and
    // takes fresh ones on the next allocation, each a page fault that
    // zeroes memory (2 MiB at a time under transparent huge pages). The
    // tokenizer's workers free and allocate at a steady rate, so that
    // churn cost a third of the CPU time of a SentencePiece run. Never
    // purging keeps the pages for reuse; prep's memory is bounded by what
    // it holds at once, which this does not change. MIMALLOC_PURGE_DELAY,
    // when set, still decides.
    if std::env::var_os("MIMALLOC_PURGE_DELAY").is_none() {
        // SAFETY: sets an option mimalloc reads on each purge decision;
        // no allocation is made or freed by the call.
        unsafe { libmimalloc_sys::mi_option_set(MI_OPTION_PURGE_DELAY, -1) };
    }
    cli::run()
}
