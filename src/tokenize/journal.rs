//! Resuming: where the input stands after each completed shard, the
//! checkpoint a tokenize run keeps in its journal (see [`crate::output`]).

use serde::{Deserialize, Serialize};

use crate::format::{ChatCounts, DocumentCounts};

/// Where the input stands after a completed shard.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Checkpoint {
    /// Input documents (in reading order, bad and duplicate ones included)
    /// consumed before the first record of the next shard.
    pub position: u64,
    /// Counts up to `position`.
    pub documents: DocumentCounts,
    /// UTF-8 bytes of the text written up to `position`.
    pub text_bytes: u64,
    /// Chat mode's counts up to `position` (absent in other runs' journals).
    #[serde(default)]
    pub chat: ChatCounts,
}
