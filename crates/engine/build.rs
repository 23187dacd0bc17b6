//! Gives the engine a hash of its own source (`PREP_ENGINE_SOURCE_HASH`, a
//! 64-bit FNV-1a: no build dependency for one hash), which every compiled
//! tokenizer records: a compiled form made by an
//! engine whose source differs in any byte is stale, so no change to how
//! the engine builds its tables can be read back through an old file.
use std::path::Path;

fn main() {
    let src = Path::new("src");
    println!("cargo::rerun-if-changed=src");
    let mut files: Vec<_> = std::fs::read_dir(src)
        .expect("the engine's src directory")
        .map(|e| e.expect("a directory entry").path())
        .filter(|p| p.is_file())
        .collect();
    files.sort();
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    let mut eat = |bytes: &[u8]| {
        for &b in bytes {
            hash = (hash ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3);
        }
    };
    for path in files {
        let name = path.file_name().expect("a file name").to_string_lossy();
        eat(name.as_bytes());
        eat(&[0]);
        eat(&std::fs::read(&path).expect("a source file"));
        eat(&[0]);
    }
    println!("cargo::rustc-env=PREP_ENGINE_SOURCE_HASH={hash:016x}");
}
