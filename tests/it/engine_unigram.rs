//! Unigram (T5) in the fast engine and in prep's HF path, against the Python
//! package's ids.
//!
//! The reference is `tokenizers` for Python (`encode(text,
//! add_special_tokens=False)`). The Rust crate of the same version differs
//! from it on Unigram: it reads the scores with another float parser (see
//! `crates/engine/src/unigram.rs`), so on near ties it segments differently. Here:
//!
//! - prep's HF path (`LoadedTokenizer`) gives Python's ids on the `-------`
//!   family (committed ids the Python package wrote, by
//!   `tools/unigram_reference.py`), on a committed five-piece vocabulary that
//!   shows the defect in a few pieces, and on T5 (fixtures/tokenizers);
//! - the fast engine gives the HF path's ids on the corpus excerpt,
//!   adversarial text (proptest) and runs of every repeated character, for
//!   T5 as shipped and edited (byte fallback, every Metaspace setting, no
//!   normalizer);
//! - with the reference venv built (`make target/venv/.installed`), both
//!   are compared with Python itself on the corpus excerpt.

use crate::common;

use crate::common::engine::{read_zst, texts, Pair};

use std::path::PathBuf;

use prep::engine::{EncodeState, FastTokenizer};
use proptest::prelude::*;
use serde_json::{json, Value};
use tokenizers::Tokenizer;

/// T5's tokenizer.json (fixtures/tokenizers).
fn t5_path() -> PathBuf {
    common::tokenizer("t5-small")
}

fn t5_json() -> Value {
    serde_json::from_slice(&read_zst(&t5_path())).unwrap()
}

fn edited(t5: &Value) -> Vec<(String, Vec<u8>)> {
    let mut out = Vec::new();
    let mut with = |name: &str, edit: &dyn Fn(&mut Value)| {
        let mut j = t5.clone();
        edit(&mut j);
        out.push((name.to_owned(), serde_json::to_vec(&j).unwrap()));
    };
    with("t5", &|_| {});
    with("t5-byte-fallback", &|j| {
        let vocab = j["model"]["vocab"].as_array_mut().unwrap();
        for b in 0..=255u8 {
            vocab.push(json!([format!("<0x{b:02X}>"), -20.0]));
        }
        j["model"]["byte_fallback"] = json!(true);
    });
    with("t5-byte-fallback-partial", &|j| {
        // Only some bytes have a piece: a run needing another is unk.
        let vocab = j["model"]["vocab"].as_array_mut().unwrap();
        for b in (0x80..=0xFFu8).step_by(2) {
            vocab.push(json!([format!("<0x{b:02X}>"), -20.0]));
        }
        j["model"]["byte_fallback"] = json!(true);
    });
    for (scheme, split) in [
        ("first", true),
        ("never", true),
        ("always", false),
        ("first", false),
    ] {
        with(&format!("t5-metaspace-{scheme}-split-{split}"), &|j| {
            j["pre_tokenizer"] = json!({"type": "Metaspace", "replacement": "▁",
                "prepend_scheme": scheme, "split": split});
        });
    }
    with("t5-no-normalizer", &|j| j["normalizer"] = Value::Null);
    out
}

fn pairs() -> Vec<Pair> {
    edited(&t5_json())
        .iter()
        .map(|(name, json)| Pair::new(name, json))
        .collect()
}

/// `c` repeated 1 to 40 times: the near ties of the lattice.
fn runs() -> Vec<String> {
    let mut out = Vec::new();
    for c in [
        '-', '=', '.', '*', '_', '~', '#', '!', 'a', 'e', 'x', '0', '1', ' ', '\n', '▁', 'ー',
        '中', '😀', '\u{301}',
    ] {
        for n in 1..=40 {
            out.push(c.to_string().repeat(n));
        }
    }
    out.push("-- --- ---- -----".into());
    out.push("a-------b".into());
    out
}

/// The committed five-piece vocabulary (T5's scores for ▁, -, ▁-- and ---,
/// as T5 writes them) on which the Rust crate and Python disagree.
fn dashes_json() -> Vec<u8> {
    std::fs::read(common::fixture("engine/unigram-dashes.tokenizer.json")).unwrap()
}

/// Python's ids for `-` repeated 1 to 40 times, as a file holds them.
fn python_dash_ids(fixture: &str) -> Vec<Vec<u32>> {
    let text = std::fs::read_to_string(common::fixture(fixture)).unwrap();
    text.lines()
        .map(|l| serde_json::from_str::<Value>(l).unwrap())
        .map(|v| serde_json::from_value(v["ids"].clone()).unwrap())
        .collect()
}

/// The defect: the Rust crate reads Unigram scores exactly while the Python
/// package reads some a double off, so "-------" gave [▁, -, ---, ---] in
/// prep's HF path and [▁, ---, ---, -] in Python.
#[test]
fn unigram_scores_read_as_python_reads_them() {
    let want = python_dash_ids("engine/unigram-dashes.python-ids.jsonl");
    assert_eq!(want.len(), 40);
    assert_eq!(want[6], [1, 4, 4, 2], "Python's ids for -------");
    let json = dashes_json();
    let pair = Pair::new("dashes", &json);
    let fast = &pair.fast;
    let mut state = EncodeState::default();
    for (n, want) in (1..=40).zip(&want) {
        let text = "-".repeat(n);
        assert_eq!(&pair.hf_ids(&text), want, "HF path, {n} dashes");
        let mut got = Vec::new();
        fast.encode(&text, &mut state, &mut got);
        assert_eq!(&got, want, "fast engine, {n} dashes");
    }
    // The crate as it stands (scores read exactly) is what differed.
    let crate_ids = Tokenizer::from_bytes(&json)
        .unwrap()
        .encode_fast("-------", false)
        .unwrap()
        .get_ids()
        .to_vec();
    assert_eq!(crate_ids, [1, 2, 4, 4]);
}

#[test]
fn t5_dash_runs_are_pythons() {
    let path = t5_path();
    let want = python_dash_ids("engine/t5-dashes.python-ids.jsonl");
    let json = read_zst(&path);
    let pair = Pair::new("t5", &json);
    let mut state = EncodeState::default();
    for (n, want) in (1..=40).zip(&want) {
        let text = "-".repeat(n);
        assert_eq!(&pair.hf_ids(&text), want, "HF path, {n} dashes");
        assert_eq!(&pair.fast_ids(&text, &mut state), want, "fast, {n} dashes");
    }
}

#[test]
fn runs_of_every_character_identical() {
    let mut failures = Vec::new();
    for pair in pairs() {
        let mut state = EncodeState::default();
        for text in runs() {
            if let Err(e) = pair.check(&text, &mut state) {
                failures.push(e);
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn corpus_excerpt_identical() {
    let corpus = read_zst(&common::fixture("corpus/debian-sample.jsonl.zst"));
    let mut failures = Vec::new();
    for pair in pairs() {
        let mut state = EncodeState::default();
        let mut bad = 0;
        for text in texts(&corpus) {
            if let Err(e) = pair.check(&text, &mut state) {
                bad += 1;
                if bad <= 2 {
                    failures.push(e);
                }
            }
        }
        if bad > 0 {
            failures.push(format!("{}: {bad} documents differ", pair.name));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// prep's HF path and the fast engine against the Python package itself,
/// on the corpus excerpt and the runs.
#[test]
fn corpus_excerpt_is_pythons() {
    let path = t5_path();
    let Some(python) = common::reference_python() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let corpus = read_zst(&common::fixture("corpus/debian-sample.jsonl.zst"));
    let mut all: Vec<String> = texts(&corpus);
    all.extend(runs());
    let mut jsonl = String::new();
    for t in &all {
        jsonl.push_str(&json!({ "text": t }).to_string());
        jsonl.push('\n');
    }
    let input = dir.path().join("texts.jsonl");
    let output = dir.path().join("ids.jsonl");
    std::fs::write(&input, jsonl).unwrap();
    let status = std::process::Command::new(python)
        .arg(common::root().join("tools/unigram_reference.py"))
        .args([&path, &input, &output])
        .status()
        .unwrap();
    assert!(status.success());
    let want: Vec<Vec<u32>> = std::fs::read_to_string(&output)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_value(serde_json::from_str::<Value>(l).unwrap()["ids"].clone()))
        .collect::<Result<_, _>>()
        .unwrap();
    assert_eq!(want.len(), all.len());
    let pair = Pair::new("t5", &read_zst(&path));
    let mut state = EncodeState::default();
    let (mut hf_bad, mut fast_bad) = (0, 0);
    for (text, want) in all.iter().zip(&want) {
        hf_bad += usize::from(pair.hf_ids(text) != *want);
        fast_bad += usize::from(pair.fast_ids(text, &mut state) != *want);
    }
    assert_eq!(
        (hf_bad, fast_bad),
        (0, 0),
        "texts whose ids differ from Python's (HF path, fast) of {}",
        all.len()
    );
}

/// The whole corpus (run by `make test-by-hand`, in release, with `PREP_EXTERNAL_DATA`).
#[test]
#[cfg(prep_by_hand)]
fn shared_corpus_identical() {
    common::engine::shared_corpus_identical(pairs().into_iter().take(1).collect());
}

/// Fragments for the adversarial texts.
fn fragment() -> impl Strategy<Value = String> {
    let words = proptest::sample::select(vec![
        "the",
        "The",
        "ing",
        "zqxj",
        "don't",
        "'s",
        "'",
        "école",
        "ÉCOLE",
        "Straße",
        "naïve",
        "中文",
        "日本語の",
        "カタカナ・",
        "ｶﾀｶﾅ",
        "한국어",
        "русский",
        "ελληνικά",
        "العربية",
        "हिन्दी",
        "ไทย",
        "e\u{301}",
        "a\u{300}\u{323}",
        "\u{301}",
        "\u{200b}",
        "\u{feff}",
        "\u{200d}",
        "👩\u{200d}💻",
        "😀",
        "🇩🇪",
        "\u{fffd}",
        "▁",
        "▁▁",
        "a▁b",
        "</s>",
        "<pad>",
        "<extra_id_0>",
        "x</s>y",
        "™",
        "ﬁ",
        "①",
        "㍿",
        "Ⅻ",
        "½",
        "---",
        "...",
        "\u{0}",
        "\u{7}",
        "\u{1b}",
        "\u{7f}",
        "\u{85}",
    ]);
    prop_oneof![
        3 => words.prop_map(str::to_owned),
        2 => (proptest::sample::select(vec![" ", "\n", "\t", "\r\n", "\r", "\u{a0}", "\u{3000}", "\u{2028}", "\u{b}"]), 1..8usize)
            .prop_map(|(s, n)| s.repeat(n)),
        1 => (proptest::sample::select(vec!["0", "7", "123", "٣", "²"]), 1..6usize)
            .prop_map(|(s, n)| s.repeat(n)),
        1 => "[a-zA-Z0-9 .,;:!?'\"()\\-]{1,12}",
        1 => any::<char>().prop_map(String::from),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(300))]
    #[test]
    fn adversarial_text_identical(parts in proptest::collection::vec(fragment(), 0..20)) {
        let text = parts.concat();
        thread_local! {
            static PAIRS: Vec<Pair> = pairs();
        }
        PAIRS
            .with(|pairs| common::engine::check_all(pairs, &text))
            .map_err(TestCaseError::fail)?;
    }
}

/// Files the fast engine must leave to HF, with the reason.
#[test]
fn unigram_without_unk_id_is_refused() {
    let mut j: Value = serde_json::from_slice(&dashes_json()).unwrap();
    j["model"]["unk_id"] = Value::Null;
    let err = FastTokenizer::from_json(&serde_json::to_vec(&j).unwrap())
        .err()
        .expect("refused");
    assert!(err.0.contains("unk_id"), "{err}");
}

/// Standard base64 with padding, and back (what `precompiled_charsmap`
/// holds).
const B64: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

fn to_base64(bytes: &[u8]) -> String {
    let mut out = String::new();
    for chunk in bytes.chunks(3) {
        let mut b = [0u8; 3];
        b[..chunk.len()].copy_from_slice(chunk);
        let n = u32::from_be_bytes([0, b[0], b[1], b[2]]);
        for k in 0..4 {
            if k <= chunk.len() {
                out.push(B64[(n >> (18 - 6 * k) & 63) as usize] as char);
            } else {
                out.push('=');
            }
        }
    }
    out
}

fn from_base64(text: &str) -> Vec<u8> {
    let digits: Vec<u32> = text
        .bytes()
        .filter(|&c| c != b'=')
        .map(|c| B64.iter().position(|&d| d == c).unwrap() as u32)
        .collect();
    let mut out = Vec::new();
    for chunk in digits.chunks(4) {
        let n = chunk
            .iter()
            .enumerate()
            .fold(0, |n, (k, &d)| n | d << (18 - 6 * k));
        out.extend_from_slice(&n.to_be_bytes()[1..chunk.len()]);
    }
    out
}

/// A malformed `precompiled_charsmap` (on which the crate HF calls would
/// fail to parse, or index out of bounds) is refused with a reason, not a
/// panic, by the fast engine.
#[test]
fn malformed_charsmap_is_refused() {
    let t5 = t5_json();
    let map = from_base64(t5["normalizer"]["precompiled_charsmap"].as_str().unwrap());
    assert_eq!(to_base64(&map), t5["normalizer"]["precompiled_charsmap"]);
    let size = u32::from_le_bytes(map[..4].try_into().unwrap()) as usize;
    let mut root_out = map.clone();
    root_out[6] = 0xFF;
    root_out[7] = 0x7F;
    let garbage: Vec<u8> = (0..=255u8).cycle().take(3000).collect();
    let mut big_trie = map.clone();
    big_trie[..4].copy_from_slice(&(map.len() as u32 * 2).to_le_bytes());
    for (name, charsmap) in [
        ("not base64", "!!!not base64!!!".to_owned()),
        ("garbage", to_base64(&garbage)),
        ("truncated", to_base64(&map[..map.len() / 2])),
        ("trie larger than the map", to_base64(&big_trie)),
        ("empty trie", to_base64(&[0, 0, 0, 0, b'a', 0])),
        ("root offset out of the trie", to_base64(&root_out)),
        ("replacements cut short", to_base64(&map[..4 + size + 10])),
    ] {
        let mut j = t5.clone();
        j["normalizer"]["precompiled_charsmap"] = json!(charsmap);
        let json = serde_json::to_vec(&j).unwrap();
        let result = std::panic::catch_unwind(|| FastTokenizer::from_json(&json));
        let err = result
            .unwrap_or_else(|_| panic!("{name}: the fast engine panics"))
            .err()
            .unwrap_or_else(|| panic!("{name}: accepted"));
        assert!(err.0.contains("Precompiled"), "{name}: {err}");
        // prep itself, on either engine: exit 2 naming the file and the
        // map, not HF's panic, and no dataset.
        let t = common::TestDir::new();
        let tok = t.write("broken.tokenizer.json", &json);
        let input = t.write("in.jsonl", common::jsonl(&["one text", "two"]));
        for engine in ["auto", "hf"] {
            let out = t.path(&format!("out-{engine}"));
            let stderr = common::fails(
                t.prep()
                    .args([
                        "tokenize",
                        "--engine",
                        engine,
                        "--eos",
                        "</s>",
                        "--tokenizer",
                    ])
                    .arg(&tok)
                    .arg("--input")
                    .arg(&input)
                    .arg("--output")
                    .arg(&out),
                2,
            );
            for part in ["broken.tokenizer.json", "Precompiled"] {
                assert!(stderr.contains(part), "{name}, {engine}: {stderr}");
            }
            assert!(!out.join("manifest.json").exists(), "{name}, {engine}");
        }
    }
}
