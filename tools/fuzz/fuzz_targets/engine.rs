//! Any UTF-8 text through the fast engine and through HF tokenizers: the ids
//! must be identical, for GPT-2, DeepSeek V3, and GPT-2's vocabulary under
//! the cl100k and o200k split patterns. Invalid UTF-8 is not a text (prep
//! refuses it before encoding).
#![no_main]

use std::io::Read;
use std::sync::OnceLock;

use libfuzzer_sys::fuzz_target;
use prep::engine::{EncodeState, FastTokenizer};
use serde_json::{json, Value};
use tokenizers::Tokenizer;

const CL100K: &str = "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
const O200K: &str = "[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]*[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?|[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]+[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n/]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";

fn fixture(name: &str) -> Vec<u8> {
    let path = format!("{}/../../fixtures/tokenizers/{name}", env!("CARGO_MANIFEST_DIR"));
    let mut out = Vec::new();
    zstd::Decoder::new(std::fs::File::open(&path).expect(&path))
        .unwrap()
        .read_to_end(&mut out)
        .unwrap();
    out
}

fn with_split(gpt2: &[u8], pattern: &str) -> Vec<u8> {
    let mut j: Value = serde_json::from_slice(gpt2).unwrap();
    j["pre_tokenizer"] = json!({"type": "Sequence", "pretokenizers": [
        {"type": "Split", "pattern": {"Regex": pattern}, "behavior": "Isolated", "invert": false},
        {"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": false}]});
    serde_json::to_vec(&j).unwrap()
}

struct Both {
    hf: Tokenizer,
    fast: FastTokenizer,
}

fn tokenizers() -> &'static Vec<Both> {
    static ALL: OnceLock<Vec<Both>> = OnceLock::new();
    ALL.get_or_init(|| {
        let gpt2 = fixture("gpt2.tokenizer.json.zst");
        let files = [
            with_split(&gpt2, CL100K),
            with_split(&gpt2, O200K),
            fixture("deepseek-v3.tokenizer.json.zst"),
            gpt2,
        ];
        files
            .iter()
            .map(|json| Both {
                hf: Tokenizer::from_bytes(json).unwrap(),
                fast: FastTokenizer::from_json(json).unwrap(),
            })
            .collect()
    })
}

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let mut state = EncodeState::default();
    for both in tokenizers() {
        let want = both.hf.encode_fast(text, false).unwrap().get_ids().to_vec();
        let mut got = Vec::new();
        both.fast.encode(text, &mut state, &mut got);
        assert_eq!(got, want, "{text:?}");
    }
});
