//! mimalloc's settings for the command, wherever it runs: the binary
//! (src/main.rs) and the Python extension (python/native) each declare
//! mimalloc their global allocator and call [`configure`] before the
//! command line runs.

/// mimalloc's option number for `purge_delay` (`mi_option_purge_delay` in
/// its header; the Rust bindings do not name it).
const MI_OPTION_PURGE_DELAY: libmimalloc_sys::mi_option_t = 15;

/// Asks mimalloc never to give freed pages back to the OS, unless
/// MIMALLOC_PURGE_DELAY is set. Process-wide for the mimalloc this crate
/// links; calling it again changes nothing.
pub fn configure() {
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
}
