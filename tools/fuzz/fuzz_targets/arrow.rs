//! Any bytes as a `.arrow` file (IPC stream or file) read by prep's input
//! reader, for text and as whole rows (chat mode): documents or a typed
//! error naming the file, never a panic.
#![no_main]

use libfuzzer_sys::fuzz_target;
use prep::input::{InputFile, InputKind, Reader, TextKey};

fuzz_target!(|data: &[u8]| {
    let dir = tempfile::tempdir().expect("a temporary folder");
    let path = dir.path().join("data.arrow");
    std::fs::write(&path, data).expect("written");
    for key in [TextKey::parse("text"), TextKey::whole_row()] {
        let file = InputFile { path: path.clone(), kind: InputKind::Arrow, bytes: data.len() as u64, version: None };
        let mut reader = Reader::new(vec![file], key);
        // A bounded number of batches: a file may claim many rows.
        for _ in 0..64 {
            match reader.next_batch(1 << 20, 4096) {
                Ok(Some(_)) => {}
                Ok(None) | Err(_) => break,
            }
        }
    }
});
