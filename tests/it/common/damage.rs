//! Damaged input datasets, and the one outcome every stage owes them:
//! exit 2, an error naming the input file and its chunk, and no manifest
//! in the output (nothing committed).

use std::path::{Path, PathBuf};
use std::process::Command;

use super::{fails, fixture, TestDir};

/// A copy of the dataset fixture `fixtures/validate/NAME` in the test's
/// directory, as `NAME`: the stage may refuse it, never change it.
pub fn fixture_copy(t: &TestDir, name: &str) -> PathBuf {
    let from = fixture(&format!("validate/{name}"));
    let to = t.path(name);
    std::fs::create_dir_all(&to).unwrap();
    for entry in std::fs::read_dir(&from).unwrap() {
        let entry = entry.unwrap();
        std::fs::copy(entry.path(), to.join(entry.file_name())).unwrap();
    }
    to
}

/// The damaged fixtures and the input file each must be refused by name:
/// a byte flipped under the `.sum` (and the manifest's XXH3), a byte
/// flipped with the manifest's XXH3 rewritten to match (only the `.sum`
/// catches it), and an id past the vocabulary with every checksum
/// rewritten to match (only the id rule catches it).
pub const DAMAGED: [(&str, &str, &str); 3] = [
    ("flipped_bin", "shard-00001.bin", "XXH3"),
    ("flipped_chunk", "shard-00001.bin", "XXH3"),
    (
        "token_out_of_range",
        "shard-00002.bin",
        "not below the vocabulary size 42",
    ),
];

/// Runs `cmd`, which must fail with exit 2 naming `file` (a path ending
/// so), its chunk and `why`, and checks that `out` holds no manifest.
/// Returns the error.
pub fn refused(cmd: &mut Command, file: &str, why: &str, out: &Path) -> String {
    let err = fails(cmd, 2);
    assert!(err.contains(file), "names the input file {file}: {err}");
    assert!(err.contains("chunk "), "names the chunk: {err}");
    assert!(err.contains(why), "says {why:?}: {err}");
    assert!(
        !out.join(prep::format::MANIFEST_FILE).exists(),
        "nothing is committed in {}: {err}",
        out.display()
    );
    err
}

/// A documents dataset with loss masks (version 2) whose first `.mask`
/// holds a byte of 2 at the position of token 5, its checksum in the
/// manifest rewritten to match: only the rule that a mask byte is 0 or 1
/// catches it. Returns the dataset and the damaged `.mask`.
pub fn mask_byte_of_2(t: &TestDir, name: &str) -> (PathBuf, PathBuf) {
    use prep::format::{atomic_write, checksum_hex, DatasetWriter, Dtype, MANIFEST_FILE};
    let dir = t.path(name);
    std::fs::create_dir_all(&dir).unwrap();
    let mut writer = DatasetWriter::new(&dir, Dtype::U16, 1 << 20, Vec::new()).masked(true);
    for i in 0..20u32 {
        let tokens: Vec<u32> = (0..5 + i % 7)
            .map(|k| 2 + (i + k) % 30)
            .chain([1])
            .collect();
        let mask: Vec<u8> = (0..tokens.len()).map(|k| u8::from(k % 2 == 1)).collect();
        writer.push_masked(&tokens, &mask).unwrap();
    }
    let shards = writer.finish().unwrap();
    let mut m = super::manifest(Dtype::U16, shards);
    m.version = prep::format::MASKED_VERSION;
    m.vocab_size = 40;
    m.special_tokens.eos = Some(1);
    m.eos_appended = true;
    let mask = dir.join(m.shards[0].mask.as_deref().expect("a masked shard"));
    let mut bytes = std::fs::read(&mask).unwrap();
    bytes[5] = 2;
    std::fs::write(&mask, &bytes).unwrap();
    m.shards[0].mask_xxh3 = Some(checksum_hex(xxhash_rust::xxh3::xxh3_64(&bytes)));
    atomic_write(&dir.join(MANIFEST_FILE), m.to_json().as_bytes()).unwrap();
    (dir, mask)
}
