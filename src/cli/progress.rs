//! The progress bar on stderr: documents/s, MB/s, tokens/s and an ETA.

use std::time::Instant;

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

use prep::progress::{Progress, ProgressSnapshot};

/// A bar over input bytes, or nothing with `--quiet`.
pub(crate) struct Bar {
    bar: Option<ProgressBar>,
    quiet: bool,
    started: Instant,
}

impl Bar {
    pub(crate) fn new(quiet: bool) -> Bar {
        let bar = (!quiet && super::stderr_is_terminal()).then(|| {
            let bar = ProgressBar::with_draw_target(Some(0), ProgressDrawTarget::stderr());
            bar.set_style(
                ProgressStyle::with_template("{bar:30} {percent:>3}% {msg} ETA {eta}")
                    .expect("a valid template"),
            );
            bar
        });
        Bar {
            bar,
            quiet,
            started: Instant::now(),
        }
    }
}

impl Progress for Bar {
    fn update(&self, s: &ProgressSnapshot) {
        let Some(bar) = &self.bar else { return };
        bar.set_length(s.input_total.max(1));
        bar.set_position(s.input_bytes.min(s.input_total));
        let secs = self.started.elapsed().as_secs_f64().max(1e-3);
        bar.set_message(format!(
            "{} docs ({:.0}/s) | {:.1} MB/s | {:.2}M tokens/s",
            s.documents,
            s.documents as f64 / secs,
            s.text_bytes as f64 / 1e6 / secs,
            s.tokens as f64 / 1e6 / secs,
        ));
    }

    fn note(&self, message: &str) {
        if self.quiet {
            return;
        }
        match &self.bar {
            Some(bar) => bar.println(format!("prep: {message}")),
            None => eprintln!("prep: {message}"),
        }
    }

    fn finish(&self) {
        if let Some(bar) = &self.bar {
            bar.finish_and_clear();
        }
    }
}
