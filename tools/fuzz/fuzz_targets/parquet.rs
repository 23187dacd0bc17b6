//! Any bytes as a `.parquet` file read by prep's input reader, for a text
//! column, a nested one and whole rows (chat mode): documents or a typed
//! error naming the file, never a panic. The footer is the same bytes a
//! remote file's ranged GETs bring, parsed by the same code.
#![no_main]

use libfuzzer_sys::fuzz_target;
use prep::input::{InputFile, InputKind, Reader, TextKey};

fuzz_target!(|data: &[u8]| {
    let dir = tempfile::tempdir().expect("a temporary folder");
    let path = dir.path().join("data.parquet");
    std::fs::write(&path, data).expect("written");
    for key in [TextKey::parse("text"), TextKey::parse("meta.text"), TextKey::whole_row()] {
        let file = InputFile { path: path.clone(), kind: InputKind::Parquet, bytes: data.len() as u64, version: None };
        let mut reader = Reader::new(vec![file], key);
        // A bounded number of batches: a footer may claim many rows.
        for _ in 0..64 {
            match reader.next_batch(1 << 20, 4096) {
                Ok(Some(_)) => {}
                Ok(None) | Err(_) => break,
            }
        }
    }
});
