//! Progress reports from long-running stages, drawn by the CLI.

/// Where a run stands, for a progress display.
#[derive(Debug, Clone, Copy, Default)]
pub struct ProgressSnapshot {
    /// On-disk input bytes consumed.
    pub input_bytes: u64,
    /// Total on-disk input bytes.
    pub input_total: u64,
    /// Documents done by this run.
    pub documents: u64,
    /// Text bytes of the documents done by this run (0 where there is no text).
    pub text_bytes: u64,
    /// Tokens written by this run.
    pub tokens: u64,
}

/// Receives progress; the CLI draws a bar, tests and libraries pass [`NoProgress`].
pub trait Progress: Sync {
    /// Called often (after each batch), from the writing thread.
    fn update(&self, snapshot: &ProgressSnapshot);
    /// A line for the user (which eos was chosen, a skipped document).
    fn note(&self, message: &str);
    /// Called once at the end of a successful run.
    fn finish(&self);
}

/// Progress that goes nowhere.
pub struct NoProgress;

impl Progress for NoProgress {
    fn update(&self, _: &ProgressSnapshot) {}
    fn note(&self, _: &str) {}
    fn finish(&self) {}
}
