//! Ctrl-C and SIGTERM: one line that says what to do next, then the exit
//! status a shell gives a process the signal ended (128 + its number: 130
//! for SIGINT, 143 for SIGTERM), so scripts see the same status as before.
//!
//! Ending the process at once is as safe as a kill, which every writing
//! command already survives: shards and small files are written under a
//! temporary name and renamed into place, a journal is written whole the
//! same way or appended a line at a time (a line cut short is read as not
//! written), the manifest is written last, and the kernel drops the
//! output's lock with the process. A re-run of the same command resumes
//! after the last journaled shard, byte-identical to an uninterrupted run.

use std::io::{IsTerminal, Write};

use signal_hook::consts::{SIGINT, SIGTERM};
use signal_hook::iterator::Signals;

/// Handles SIGINT and SIGTERM for the rest of the process's life: the first
/// one that arrives prints `prep: interrupted` and `advice` after it (when
/// there is any) to stderr, and ends the process with 128 + the signal's
/// number. Only for a process that is the command line: a library caller
/// keeps its own handlers (Python's KeyboardInterrupt among them).
///
/// A failure to set the handlers (no file descriptor left for the pipe
/// they wake the thread through) leaves the signals' default action,
/// which also ends the process, only without the line.
pub(crate) fn handle(advice: &'static str) {
    let Ok(mut signals) = Signals::new([SIGINT, SIGTERM]) else {
        return;
    };
    // The thread owns the handlers; were it not started (no memory or
    // threads left, when the command could not run anyway), dropping them
    // here would leave the signals caught and ignored, so the process ends.
    let spawned = std::thread::Builder::new()
        .name("prep-signals".into())
        .spawn(move || {
            if let Some(signal) = signals.forever().next() {
                let mut err = std::io::stderr().lock();
                // A terminal shows `^C` (or a progress bar) where the
                // cursor is: the line starts on a line of its own.
                let newline = if err.is_terminal() { "\n" } else { "" };
                let _ = writeln!(err, "{newline}{}", message(advice));
                let _ = err.flush();
                std::process::exit(128 + signal);
            }
        });
    if let Err(e) = spawned {
        eprintln!("prep: error: cannot start a thread: {e}");
        std::process::exit(i32::from(super::EXIT_ERROR));
    }
}

/// The line printed on an interrupt.
fn message(advice: &str) -> String {
    if advice.is_empty() {
        "prep: interrupted".to_owned()
    } else {
        format!("prep: interrupted: {advice}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_line_says_interrupted_and_what_to_do() {
        assert_eq!(message(""), "prep: interrupted");
        assert_eq!(
            message("re-run the same command to resume"),
            "prep: interrupted: re-run the same command to resume"
        );
    }
}
