//! Any UTF-8 text through the fast engine and through HF tokenizers: the ids
//! must be identical, for GPT-2, DeepSeek V3, GPT-2's vocabulary under the
//! cl100k and o200k split patterns, and GPT-2's first 3,000 merges under a
//! split pattern, behavior, normalizer and added tokens the input's first
//! four bytes pick from pieces (the pattern runs on the fast engine's lazy
//! DFA).
//! Invalid UTF-8 is not a text (prep refuses it before encoding).
#![no_main]

use std::collections::HashMap;
use std::io::Read;
use std::sync::{Mutex, OnceLock};

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

/// Alternatives of split patterns, each unable to match the empty string.
const PIECES: [&str; 16] = [
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)",
    r"[^\r\n\p{L}\p{N}]?\p{L}+",
    r"\p{N}",
    r" ?[^\s\p{L}\p{N}]+[\r\n]*",
    r"\s*[\r\n]+",
    r"\s+(?!\S)",
    r"\s+",
    r"[\p{L}\p{M}&&[^\p{Han}]]+",
    r"\p{Han}+",
    r"\w+?",
    r"[[:punct:]]{1,3}",
    r"\d{2,}",
    r"(?i:k)",
    r"\p{Lu}\p{Ll}*",
    r"[ \t]+(?=\S)",
    r".",
];

/// Merges of GPT-2's kept for the picked tokenizers: the first of them, with
/// the 256 byte symbols and the tokens they make (ids 0 to 3,255, GPT-2's
/// own), then `<|endoftext|>` as the next id. Building a tokenizer is most
/// of an input's time under the sanitizer, and a 3,000-merge vocabulary
/// builds in a fraction of the 50,000's; the four fixed tokenizers keep the
/// whole vocabularies.
const PICKED_MERGES: usize = 3000;

/// GPT-2's tokenizer with its vocabulary cut to the first [`PICKED_MERGES`]
/// merges, parsed once.
fn small_gpt2() -> &'static Value {
    static SMALL: OnceLock<Value> = OnceLock::new();
    SMALL.get_or_init(|| {
        let mut j: Value = serde_json::from_slice(&fixture("gpt2.tokenizer.json.zst")).unwrap();
        let merges: Vec<Value> = j["model"]["merges"].as_array().unwrap()[..PICKED_MERGES].to_vec();
        let made: std::collections::HashSet<String> = merges
            .iter()
            .map(|m| format!("{}{}", m[0].as_str().unwrap(), m[1].as_str().unwrap()))
            .collect();
        let vocab = j["model"]["vocab"].as_object().unwrap();
        let mut kept: serde_json::Map<String, Value> = vocab
            .iter()
            .filter(|(token, id)| id.as_u64().unwrap() < 256 || made.contains(*token))
            .map(|(token, id)| (token.clone(), id.clone()))
            .collect();
        let next = kept.len() as u64;
        assert!(kept.values().all(|id| id.as_u64().unwrap() < next), "ids 0..n");
        kept.insert("<|endoftext|>".into(), json!(next));
        j["model"]["vocab"] = Value::Object(kept);
        j["model"]["merges"] = Value::Array(merges);
        j["added_tokens"][0]["id"] = json!(next);
        j
    })
}

/// GPT-2's first merges ([`small_gpt2`]) under a pre-tokenizer, normalizer
/// and added tokens chosen by `pick`.
fn picked(pick: [u8; 4]) -> Vec<u8> {
    let mut j = small_gpt2().clone();
    let next = j["added_tokens"][0]["id"].as_u64().unwrap() + 1;
    let mut alternatives: Vec<&str> = pick[1..].iter().map(|&b| PIECES[(b & 15) as usize]).collect();
    alternatives.dedup();
    let behavior = ["Isolated", "Removed", "MergedWithPrevious", "MergedWithNext", "Contiguous"]
        [(pick[0] % 5) as usize];
    j["pre_tokenizer"] = json!({"type": "Sequence", "pretokenizers": [
        {"type": "Split", "pattern": {"Regex": alternatives.join("|")}, "behavior": behavior,
         "invert": pick[0] & 8 != 0},
        {"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": false}]});
    j["normalizer"] = match (pick[0] >> 4) & 3 {
        0 => Value::Null,
        1 => json!({"type": "Sequence", "normalizers": [{"type": "NFC"}, {"type": "Lowercase"}]}),
        2 => json!({"type": "Replace", "pattern": {"Regex": "\\s+"}, "content": " "}),
        _ => json!({"type": "NFKC"}),
    };
    if pick[0] & 64 != 0 {
        let added = j["added_tokens"].as_array_mut().unwrap();
        for (id, content, normalized) in [(next, "<|im_start|>", false), (next + 1, "ing the", true)] {
            added.push(json!({"id": id, "content": content, "single_word": false, "lstrip": false,
                "rstrip": pick[0] & 128 != 0, "normalized": normalized, "special": !normalized}));
        }
    }
    serde_json::to_vec(&j).unwrap()
}

fn check(both: &Both, text: &str, state: &mut EncodeState) {
    let want = both.hf.encode_fast(text, false).unwrap().get_ids().to_vec();
    let mut got = Vec::new();
    both.fast.encode(text, state, &mut got);
    assert_eq!(got, want, "{text:?}");
}

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let mut state = EncodeState::default();
    if let [a, b, c, d, ..] = *data {
        // Building a tokenizer is most of an input's time: keyed by what
        // `picked` reads of the bytes, so that inputs picking the same one
        // share it.
        let pick = [a, b & 15, c & 15, d & 15];
        static PICKED: OnceLock<Mutex<HashMap<[u8; 4], Both>>> = OnceLock::new();
        let mut cache = PICKED.get_or_init(Default::default).lock().unwrap();
        if cache.len() > 128 {
            cache.clear();
        }
        let both = cache.entry(pick).or_insert_with(|| {
            let json = picked(pick);
            Both {
                hf: Tokenizer::from_bytes(&json).unwrap(),
                fast: FastTokenizer::from_json(&json).unwrap(),
            }
        });
        check(both, text, &mut state);
    }
    for both in tokenizers() {
        check(both, text, &mut state);
    }
});
