//! The fast engine's WordPiece against HF tokenizers: identical ids or no
//! fast engine.
//!
//! Each test encodes the same text with `prep::engine::FastTokenizer` and
//! with the `tokenizers` crate (`encode(text, false)`, truncation and padding
//! off, as `prep tokenize` runs it) and requires the same ids. The
//! tokenizers are MiniLM and BERT base uncased (both committed in
//! fixtures/) as shipped, and MiniLM edited to
//! cover what they do not: cased, accents stripped or kept whatever the
//! case, no Chinese-character handling and no cleaning, another subword
//! prefix, a small `max_input_chars_per_word`, normalized added tokens and
//! the BERT steps inside sequences. The texts are the committed corpus
//! excerpt and golden texts, generated adversarial text and, with
//! `make test-by-hand` and `PREP_EXTERNAL_DATA`, the whole corpus. The Rust crate is the reference
//! because `python_reference_agrees` checks, where the reference venv is
//! there, that the Python package gives the same ids on the same texts, and
//! the golden MiniLM ids (written by the Python package) are checked too.

use crate::common;

use crate::common::engine::{read_zst, texts, Pair};

use std::io::{BufRead, BufReader};

use prep::engine::{EncodeState, FastTokenizer};
use proptest::prelude::*;
use proptest::strategy::ValueTree;
use serde_json::{json, Value};

fn minilm_json() -> Value {
    serde_json::from_slice(&read_zst(&common::fixture(
        "tokenizers/minilm-wordpiece.tokenizer.json.zst",
    )))
    .unwrap()
}

/// BERT base uncased (fixtures/tokenizers).
fn bert_json() -> Vec<u8> {
    read_zst(&common::tokenizer("bert-base-uncased"))
}

/// MiniLM with its BertNormalizer's flags set (`strip_accents` may be null).
fn minilm_normalizer(clean: bool, chinese: bool, strip: Value, lowercase: bool) -> Value {
    let mut j = minilm_json();
    j["normalizer"] = json!({"type": "BertNormalizer", "clean_text": clean,
        "handle_chinese_chars": chinese, "strip_accents": strip, "lowercase": lowercase});
    j
}

/// Tokenizers edited from MiniLM: the options the shipped files do not
/// cover between them, each checked against HF.
fn edited() -> Vec<(String, Value)> {
    let mut out = vec![
        (
            "cased".into(),
            minilm_normalizer(true, true, Value::Null, false),
        ),
        (
            "cased+strip-accents".into(),
            minilm_normalizer(true, true, true.into(), false),
        ),
        (
            "uncased+keep-accents".into(),
            minilm_normalizer(true, true, false.into(), true),
        ),
        (
            "no-chinese-chars-no-clean".into(),
            minilm_normalizer(false, false, Value::Null, true),
        ),
    ];

    // Another prefix: every `##` token renamed, so the ids stay the same
    // tokens and a wrong prefix shows.
    let mut prefixed = minilm_json();
    let vocab = prefixed["model"]["vocab"].as_object_mut().unwrap();
    let renamed: serde_json::Map<String, Value> = std::mem::take(vocab)
        .into_iter()
        .map(|(k, v)| match k.strip_prefix("##") {
            Some(rest) => (format!("@@{rest}"), v),
            None => (k, v),
        })
        .collect();
    *vocab = renamed;
    prefixed["model"]["continuing_subword_prefix"] = "@@".into();
    out.push(("prefix-@@".into(), prefixed));

    let mut short = minilm_json();
    short["model"]["max_input_chars_per_word"] = 6.into();
    out.push(("max-6-chars".into(), short));

    // Added tokens the normalizer sees (found in the lowercased text, so
    // also inside words) beside MiniLM's special ones, and one special
    // token that is not normalized.
    let mut added = minilm_json();
    let list = added["added_tokens"].as_array_mut().unwrap();
    for (id, content, normalized) in [
        (30522, "ZQXJ", true),
        (30523, "ing the", true),
        (30524, "<|endoftext|>", false),
        (30525, "É", true),
    ] {
        list.push(json!({"id": id, "content": content, "single_word": false,
            "lstrip": false, "rstrip": false, "normalized": normalized, "special": !normalized}));
    }
    out.push(("added-tokens".into(), added));

    // The BERT steps inside sequences, beside other steps: the general
    // path, not the fast one.
    let mut sequences = minilm_json();
    sequences["normalizer"] = json!({"type": "Sequence", "normalizers": [
        {"type": "NFC"},
        sequences["normalizer"].clone(),
    ]});
    sequences["pre_tokenizer"] = json!({"type": "Sequence", "pretokenizers": [
        {"type": "BertPreTokenizer"},
        {"type": "Digits", "individual_digits": true},
    ]});
    out.push(("in-sequences+digits".into(), sequences));
    out
}

fn pairs() -> Vec<Pair> {
    let mut pairs = vec![Pair::new(
        "minilm",
        &serde_json::to_vec(&minilm_json()).unwrap(),
    )];
    pairs.push(Pair::new("bert-base-uncased", &bert_json()));
    for (name, j) in edited() {
        pairs.push(Pair::new(&name, &serde_json::to_vec(&j).unwrap()));
    }
    pairs
}

/// The committed texts: the corpus excerpt and the golden edge cases.
fn committed_texts() -> Vec<String> {
    let mut all = texts(&read_zst(&common::fixture(
        "corpus/debian-sample.jsonl.zst",
    )));
    all.extend(texts(&read_zst(&common::fixture("golden/texts.jsonl.zst"))));
    all
}

#[test]
fn corpus_excerpt_identical() {
    let texts = committed_texts();
    let mut failures = Vec::new();
    for pair in pairs() {
        let mut state = EncodeState::default();
        for text in &texts {
            if let Err(e) = pair.check(text, &mut state) {
                failures.push(e);
                break;
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// The golden ids, written by the Python package, for MiniLM.
#[test]
fn golden_minilm_ids_identical() {
    let texts = texts(&read_zst(&common::fixture("golden/texts.jsonl.zst")));
    let ids = read_zst(&common::fixture("golden/minilm-wordpiece.ids.jsonl.zst"));
    let want: Vec<Vec<u32>> = BufReader::new(&ids[..])
        .lines()
        .map(|l| serde_json::from_str(&l.unwrap()).unwrap())
        .collect();
    assert_eq!(texts.len(), want.len());
    let minilm = Pair::new("minilm", &serde_json::to_vec(&minilm_json()).unwrap());
    let mut state = EncodeState::default();
    for (text, want) in texts.iter().zip(&want) {
        if let Err(e) = minilm.compare(text, want, &mut state) {
            panic!("{e}");
        }
    }
}

/// The Python package (the contract) gives the Rust crate's ids on every
/// tokenizer here, on the committed texts and the adversarial ones below:
/// so the crate can stand in for it in the other tests. Runs where the
/// reference venv is (`make target/venv/.installed`, or `PREP_REFERENCE_PYTHON`
/// naming a python with tokenizers 0.23.2).
#[test]
fn python_reference_agrees() {
    let Some(python) = common::reference_python() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    // The golden edge cases but its 3 MB document, and the adversarial
    // texts: what the other tests run, at a cost a debug build can pay.
    let mut texts: Vec<String> = texts(&read_zst(&common::fixture("golden/texts.jsonl.zst")))
        .into_iter()
        .filter(|t| t.len() < 100_000)
        .collect();
    texts.extend(fixed_adversarial());
    let mut runner = proptest::test_runner::TestRunner::deterministic();
    for _ in 0..300 {
        let parts = proptest::collection::vec(fragment(), 0..24)
            .new_tree(&mut runner)
            .unwrap()
            .current();
        texts.push(parts.concat());
    }
    std::fs::write(
        dir.path().join("texts.json"),
        serde_json::to_vec(&texts).unwrap(),
    )
    .unwrap();
    let pairs = pairs();
    for (i, pair) in pairs.iter().enumerate() {
        std::fs::write(dir.path().join(format!("{i}.json")), &pair.json).unwrap();
    }
    let script = r#"
import json, sys
from tokenizers import Tokenizer, __version__
assert __version__ == "0.23.2", __version__
d, n = sys.argv[1], int(sys.argv[2])
texts = json.load(open(f"{d}/texts.json", encoding="utf-8"))
out = []
for i in range(n):
    t = Tokenizer.from_file(f"{d}/{i}.json")
    t.no_truncation()
    t.no_padding()
    out.append([e.ids for e in t.encode_batch(texts, add_special_tokens=False)])
json.dump(out, open(f"{d}/ids.json", "w"))
"#;
    let status = std::process::Command::new(&python)
        .arg("-c")
        .arg(script)
        .arg(dir.path())
        .arg(pairs.len().to_string())
        .status()
        .unwrap();
    assert!(status.success(), "the reference script failed");
    let ids: Vec<Vec<Vec<u32>>> =
        serde_json::from_slice(&std::fs::read(dir.path().join("ids.json")).unwrap()).unwrap();
    let mut failures = Vec::new();
    for (pair, want) in pairs.iter().zip(&ids) {
        let mut state = EncodeState::default();
        for (text, want) in texts.iter().zip(want) {
            if pair.hf_ids(text) != *want {
                failures.push(format!(
                    "{}: the Rust crate and Python differ on {text:?}",
                    pair.name
                ));
                break;
            }
            if let Err(e) = pair.compare(text, want, &mut state) {
                failures.push(e);
                break;
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// The whole corpus (tens of MB; run by `make test-by-hand`, in release, with
/// `PREP_EXTERNAL_DATA`).
#[test]
#[cfg(prep_by_hand)]
fn shared_corpus_identical() {
    common::engine::shared_corpus_identical(pairs());
}

/// Texts for the cases no fragment mix reaches reliably: words at and
/// around the length limits, and long runs.
fn fixed_adversarial() -> Vec<String> {
    let mut texts = vec![
        String::new(),
        " ".into(),
        "\n\n\t \r\n".into(),
        "\u{0}\u{1}\u{7f}\u{fffd}".into(),
        "a\u{0}b c\u{fffd}d e\u{200b}f g\u{feff}h".into(),
        "x".repeat(100),
        "x".repeat(101),
        "é".repeat(100),
        "é".repeat(101),
        "e\u{301}".repeat(50),
        "e\u{301}".repeat(51),
        "abcdef abcdefg 中文字符 ab中cd".into(),
        "unaffable unbelievably antidisestablishmentarianism".into(),
        "[CLS] [SEP] [sep] a[SEP]b [MASK]x [UNK] [PAD]".into(),
        "ZQXJ zqxj xzqxjx thing the thing thethinging the".into(),
        "É é E\u{301} ÉCOLE école".into(),
        "@@ing ##ing ## @@ #".into(),
        "İstanbul ΣΊΣΥΦΟΣ ǅ ß ﬃ Ⅻ".into(),
        "a\u{301}\u{1}\u{316}b a\u{1d165}\u{0}\u{1d166}\u{301}c".into(),
        " ".repeat(3000) + "x",
        "supercalifragilistic".repeat(200),
        "中".repeat(2000),
    ];
    let mut next = common::xorshift(11);
    texts.push(
        (0..20000)
            .map(|_| char::from(b"abcdefgh ijk.,'"[(next() % 15) as usize]))
            .collect(),
    );
    texts
}

#[test]
fn fixed_adversarial_identical() {
    let mut failures = Vec::new();
    for pair in pairs() {
        let mut state = EncodeState::default();
        for text in fixed_adversarial() {
            if let Err(e) = pair.check(&text, &mut state) {
                failures.push(e);
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// Fragments that meet every branch of the normalizer, the pre-tokenizer
/// and the model.
fn fragment() -> impl Strategy<Value = String> {
    let words = proptest::sample::select(vec![
        "the",
        "The",
        "THE",
        "unaffable",
        "ing",
        "ing the",
        "zqxj",
        "ZQXJ",
        "[SEP]",
        "[sep]",
        "[CLS]",
        "[MASK]",
        "[UNK]",
        "<|endoftext|>",
        "##",
        "##ing",
        "@@ing",
        "don't",
        "DON'T",
        "'s",
        "''",
        "école",
        "ÉCOLE",
        "É",
        "Straße",
        "İstanbul",
        "ΣΊΣΥΦΟΣ",
        "naïve",
        "mañana",
        "中文",
        "日本語の",
        "カタカナ・",
        "한국어",
        "русский",
        "ελληνικά",
        "עברית",
        "العربية",
        "हिन्दी",
        "ไทย",
        "𠀀𪜀",
        "丽",
        "e\u{301}",
        "a\u{300}\u{323}",
        "\u{301}",
        "\u{1d165}\u{1d166}",
        "\u{200b}",
        "\u{feff}",
        "\u{200d}",
        "\u{ad}",
        "\u{e000}",
        "\u{0}",
        "\u{1}",
        "\u{7f}",
        "\u{85}",
        "\u{fffd}",
        "\u{2581}",
        "▁the",
        "👩\u{200d}💻",
        "😀",
        "🇩🇪",
        "ǅ",
        "ﬃ",
        "Ⅻ",
        "½",
        "http://example.org/a?b=c",
        "$x+y^z",
        "...",
        "¿¡",
        "«»",
        "—",
        "€",
        "٣",
        "१२",
    ]);
    prop_oneof![
        3 => words.prop_map(str::to_owned),
        2 => (proptest::sample::select(vec![" ", "\n", "\t", "\r\n", "\r", "\u{a0}", "\u{3000}", "\u{2028}", "\u{b}", "\u{c}", "\u{1c}"]), 1..6usize)
            .prop_map(|(s, n)| s.repeat(n)),
        1 => (proptest::sample::select(vec!["0", "7", "123", "٣", "²"]), 1..9usize)
            .prop_map(|(s, n)| s.repeat(n)),
        1 => "[a-zA-Z0-9 .,;:!?'\"()\\-#@]{1,12}",
        1 => any::<char>().prop_map(String::from),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(400))]
    #[test]
    fn adversarial_text_identical(parts in proptest::collection::vec(fragment(), 0..24)) {
        let text = parts.concat();
        thread_local! {
            static PAIRS: Vec<Pair> = pairs();
        }
        PAIRS
            .with(|pairs| common::engine::check_all(pairs, &text))
            .map_err(TestCaseError::fail)?;
    }
}

/// What the fast engine must refuse (HF then runs, or fails as it would):
/// each with its reason.
#[test]
fn unsupported_wordpiece_files_are_refused() {
    type Change = Box<dyn Fn(&mut Value)>;
    let cases: Vec<(&str, Change)> = vec![
        (
            "unknown token not in the vocabulary",
            Box::new(|j| j["model"]["unk_token"] = "<unk>".into()),
        ),
        (
            "no max_input_chars_per_word",
            Box::new(|j| {
                j["model"]
                    .as_object_mut()
                    .unwrap()
                    .remove("max_input_chars_per_word");
            }),
        ),
        (
            "BertNormalizer without lowercase",
            Box::new(|j| {
                j["normalizer"].as_object_mut().unwrap().remove("lowercase");
            }),
        ),
    ];
    for (name, change) in cases {
        let mut j = minilm_json();
        change(&mut j);
        let refused = FastTokenizer::from_json(&serde_json::to_vec(&j).unwrap());
        assert!(refused.is_err(), "{name}: accepted");
    }
}
