//! How long the fast engine takes to be ready for each tokenizer file given,
//! from its JSON and from its compiled form, in one process: each step's
//! median over `--rounds` rounds (default 5), in milliseconds.
//!
//!     cargo run --release -p prep-engine --example load_time -- FILE...
//!
//! Steps: `read` (the file's bytes, decompressed), `xxh3` (the cache key),
//! `json` (the engine built from the JSON), `compiled` (the compiled form
//! mapped from the cache, checked and built from), `ids` (whether both readings
//! give the same ids for a sample text).
use std::path::PathBuf;
use std::time::Instant;

use prep_engine::{compiled, EncodeState, FastTokenizer};

fn ms(f: impl FnOnce()) -> f64 {
    let t = Instant::now();
    f();
    t.elapsed().as_secs_f64() * 1e3
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn main() {
    let mut args: Vec<String> = std::env::args().skip(1).collect();
    let mut rounds = 5;
    if let Some(at) = args.iter().position(|a| a == "--rounds") {
        rounds = args[at + 1].parse().expect("--rounds N");
        args.drain(at..at + 2);
    }
    let dir = std::env::temp_dir().join(format!("prep-load-time-{}", std::process::id()));
    println!("file\tread_ms\txxh3_ms\tjson_ms\tcompiled_ms\tcompiled_bytes\tsame_ids");
    for file in args.iter().map(PathBuf::from) {
        let (mut read, mut hash, mut json, mut comp) = (vec![], vec![], vec![], vec![]);
        let mut same = true;
        let mut size = 0;
        for _ in 0..rounds {
            let mut bytes = Vec::new();
            read.push(ms(|| {
                bytes = prep_engine::read_tokenizer_bytes(&file).expect("a file")
            }));
            let mut key = 0;
            hash.push(ms(|| key = xxhash_rust::xxh3::xxh3_64(&bytes)));
            let mut built = None;
            json.push(ms(|| built = Some(FastTokenizer::compile(&bytes, key))));
            let (from_json, sealed) = built.unwrap().expect("a tokenizer the engine runs");
            let path = compiled::cache_file(&dir, key);
            std::fs::create_dir_all(&dir).expect("a scratch directory");
            std::fs::write(&path, &sealed).expect("the compiled form written");
            size = sealed.len();
            let mut back = None;
            comp.push(ms(|| {
                back =
                    Some(FastTokenizer::from_compiled_path(&path, key).expect("the compiled form"));
            }));
            let from_cache = back.unwrap().expect("a whole compiled form");
            let text = "Hello, world! Ünïcödé 中文 😀 <eos> don't   stop\n\tnow 12345";
            let (mut a, mut b) = (Vec::new(), Vec::new());
            from_json.encode(text, &mut EncodeState::default(), &mut a);
            from_cache.encode(text, &mut EncodeState::default(), &mut b);
            same &= a == b;
        }
        println!(
            "{}\t{:.1}\t{:.1}\t{:.1}\t{:.1}\t{}\t{}",
            file.file_name().unwrap().to_string_lossy(),
            median(read),
            median(hash),
            median(json),
            median(comp),
            size,
            same
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
}
