//! The fast engine against HF tokenizers: identical ids or no fast engine.
//!
//! Every test encodes the same text with `prep::engine::FastTokenizer` and
//! with the `tokenizers` crate (`encode(text, false)`, truncation and padding
//! off, as `prep tokenize` runs it) and requires the same ids. The texts are
//! the committed corpus excerpt, generated adversarial text (runs of spaces
//! and newlines, digits, mixed scripts, combining marks, JSON escapes,
//! special-token strings inside words), and, with `PREP_EXTERNAL_DATA`, the
//! whole real corpus (`make test-by-hand`, in release). The tokenizers are every
//! byte-level file in fixtures/tokenizers as shipped, and GPT-2's vocabulary under the
//! cl100k / Llama 3 and o200k split patterns, with and without
//! `ignore_merges` and extra added tokens, so each scanner and each
//! added-token pass is checked against the reference.

use crate::common;

use crate::common::engine::{offsets_agree, placed_counts, read_zst, texts, Pair};

use prep::engine::offsets::Offsets;
use prep::engine::{EncodeState, FastTokenizer, Pattern};
use proptest::prelude::*;
use serde_json::{json, Value};
use tokenizers::Tokenizer;

fn gpt2_json() -> Value {
    serde_json::from_slice(&read_zst(&common::fixture(
        "tokenizers/gpt2.tokenizer.json.zst",
    )))
    .unwrap()
}

fn deepseek_json() -> Vec<u8> {
    read_zst(&common::fixture(
        "tokenizers/deepseek-v3.tokenizer.json.zst",
    ))
}

/// GPT-2's vocabulary behind `Split(pattern)` then `ByteLevel` (as Llama 3
/// and o200k tokenizer.json files have it), with added tokens of both kinds
/// that overlap each other and ordinary words.
fn gpt2_with_split(pattern: &str, ignore_merges: bool) -> Vec<u8> {
    let mut j = gpt2_json();
    j["pre_tokenizer"] = json!({
        "type": "Sequence",
        "pretokenizers": [
            {"type": "Split", "pattern": {"Regex": pattern}, "behavior": "Isolated", "invert": false},
            {"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": false}
        ]
    });
    j["model"]["ignore_merges"] = ignore_merges.into();
    let added = j["added_tokens"].as_array_mut().unwrap();
    for (id, content, normalized) in [
        (50257, "<|im_start|>", false),
        (50258, "<|im_end|>", false),
        (50259, "<|im", true),
        (50260, "ing the", true),
    ] {
        added.push(
            json!({"id": id, "content": content, "single_word": false, "lstrip": false,
            "rstrip": false, "normalized": normalized, "special": !normalized}),
        );
    }
    serde_json::to_vec(&j).unwrap()
}

/// Whether a pre-tokenizer has a `ByteLevel` step: the files the fast
/// engine must take.
fn is_byte_level(pre: &Value) -> bool {
    pre["type"] == "ByteLevel"
        || pre["pretokenizers"]
            .as_array()
            .is_some_and(|steps| steps.iter().any(is_byte_level))
}

/// Every byte-level tokenizer file in fixtures/tokenizers, by name.
fn byte_level_files() -> Vec<(String, Vec<u8>)> {
    let mut files = std::collections::BTreeMap::new();
    for path in common::tokenizer_files() {
        let name = path.file_name().unwrap().to_string_lossy().into_owned();
        let name = name.strip_suffix(".tokenizer.json.zst").unwrap().to_owned();
        let json = read_zst(&path);
        let v: Value = serde_json::from_slice(&json).unwrap();
        if is_byte_level(&v["pre_tokenizer"]) {
            files.insert(name, json);
        }
    }
    files.into_iter().collect()
}

/// GPT-2 with its pre-tokenizer and normalizer replaced.
fn gpt2_with(normalizer: Value, pre_tokenizer: Value) -> Vec<u8> {
    let mut j = gpt2_json();
    j["normalizer"] = normalizer;
    j["pre_tokenizer"] = pre_tokenizer;
    serde_json::to_vec(&j).unwrap()
}

fn byte_level(prefix: bool, regex: bool) -> Value {
    json!({"type": "ByteLevel", "add_prefix_space": prefix, "trim_offsets": true, "use_regex": regex})
}

fn split(pattern: &str, behavior: &str, invert: bool) -> Value {
    json!({"type": "Split", "pattern": {"Regex": pattern}, "behavior": behavior, "invert": invert})
}

/// GPT-2's vocabulary with the spellings a `continuing_subword_prefix` and
/// an `end_of_word_suffix` need: every byte with the prefix, the suffix or
/// both, and the first merges again with them (ranked after GPT-2's own), so
/// that both affixes change which merges apply.
fn gpt2_with_affixes(prefix: &str, suffix: &str) -> Value {
    let mut j = gpt2_json();
    let model = j["model"].as_object_mut().unwrap();
    let mut vocab: std::collections::BTreeMap<String, u64> =
        serde_json::from_value(model["vocab"].clone()).unwrap();
    let mut next = vocab.values().max().unwrap() + 1;
    let mut add = |vocab: &mut std::collections::BTreeMap<String, u64>, t: String| {
        vocab.entry(t).or_insert_with(|| {
            next += 1;
            next - 1
        });
    };
    let bytes: Vec<String> = vocab
        .iter()
        .filter(|(_, &id)| id < 256)
        .map(|(t, _)| t.clone())
        .collect();
    for b in &bytes {
        add(&mut vocab, format!("{prefix}{b}"));
        add(&mut vocab, format!("{b}{suffix}"));
        add(&mut vocab, format!("{prefix}{b}{suffix}"));
    }
    let merges = model["merges"].as_array().unwrap().clone();
    let mut extra = Vec::new();
    for m in merges.iter().take(3000) {
        let (a, b) = (m[0].as_str().unwrap(), m[1].as_str().unwrap());
        let (p, x) = (!prefix.is_empty(), !suffix.is_empty());
        let pairs = [
            (p, a.to_owned(), format!("{prefix}{b}")),
            (x, a.to_owned(), format!("{prefix}{b}{suffix}")),
            (p, format!("{prefix}{a}"), format!("{prefix}{b}")),
            (
                p && x,
                format!("{prefix}{a}"),
                format!("{prefix}{b}{suffix}"),
            ),
        ];
        for (left, right) in pairs.into_iter().filter(|p| p.0).map(|p| (p.1, p.2)) {
            let right_rest = right.strip_prefix(prefix).unwrap_or(&right).to_owned();
            add(&mut vocab, left.clone());
            add(&mut vocab, right.clone());
            add(&mut vocab, format!("{left}{right_rest}"));
            extra.push(json!([left, right]));
        }
    }
    // HF strips the prefix from the right token of every merge.
    let mut all = if prefix.is_empty() {
        merges
    } else {
        Vec::new()
    };
    all.extend(extra);
    model.insert("merges".into(), all.into());
    model.insert("vocab".into(), serde_json::to_value(vocab).unwrap());
    if !prefix.is_empty() {
        model.insert("continuing_subword_prefix".into(), prefix.into());
    }
    if !suffix.is_empty() {
        model.insert("end_of_word_suffix".into(), suffix.into());
    }
    j
}

/// Tokenizers made by editing real ones: the stages the shipped files do
/// not cover between them, each checked against HF.
fn edited() -> Vec<(String, Vec<u8>)> {
    let seq = |steps: Vec<Value>| json!({"type": "Sequence", "pretokenizers": steps});
    let norms = |list: Vec<Value>| json!({"type": "Sequence", "normalizers": list});
    let mut with_flags = gpt2_json();
    let added = with_flags["added_tokens"].as_array_mut().unwrap();
    for (id, content, flags) in [
        (50257, "<mask>", ["lstrip"].as_slice()),
        (50258, "<sep>", &["rstrip"]),
        (50259, "zqxj", &["single_word"]),
        (50260, "<both>", &["lstrip", "rstrip"]),
    ] {
        let mut t = json!({"id": id, "content": content, "single_word": false, "lstrip": false,
            "rstrip": false, "normalized": false, "special": true});
        for f in flags {
            t[*f] = true.into();
        }
        added.push(t);
    }
    let mut clip = gpt2_with_affixes("", "</w>");
    clip["normalizer"] = norms(vec![
        json!({"type": "NFC"}),
        json!({"type": "Replace", "pattern": {"Regex": "\\s+"}, "content": " "}),
        json!({"type": "Lowercase"}),
    ]);
    clip["pre_tokenizer"] = seq(vec![split(CLIP, "Removed", true), byte_level(false, false)]);
    let mut prefixed = gpt2_with_affixes("##", "");
    prefixed["pre_tokenizer"] = seq(vec![
        split(QWEN, "Isolated", false),
        byte_level(false, false),
    ]);
    let mut both = gpt2_with_affixes("##", "</w>");
    both["pre_tokenizer"] = seq(vec![
        split(MADE_UP[0], "Isolated", false),
        byte_level(false, false),
    ]);
    let mut patterns = Vec::new();
    // Each pattern Isolated and Removed inverted (its two shapes in the
    // wild), and one other behavior each, so that every behavior meets a
    // pattern on the DFA.
    let others = [
        ("MergedWithPrevious", false),
        ("MergedWithNext", true),
        ("Contiguous", false),
        ("Removed", false),
        ("MergedWithPrevious", true),
        ("Contiguous", true),
        ("MergedWithNext", false),
    ];
    let named = [("qwen", QWEN), ("clip-pattern", CLIP), ("kimi", KIMI)]
        .into_iter()
        .chain(MADE_UP.iter().map(|p| ("made-up", *p)));
    for (n, (name, pattern)) in named.enumerate() {
        for (behavior, invert) in [("Isolated", false), ("Removed", true), others[n]] {
            patterns.push((
                format!(
                    "{name}-{n}-{behavior}{}",
                    if invert { "-inverted" } else { "" }
                ),
                gpt2_with(
                    Value::Null,
                    seq(vec![
                        split(pattern, behavior, invert),
                        byte_level(false, false),
                    ]),
                ),
            ));
        }
    }
    patterns.extend([
        ("clip".to_owned(), serde_json::to_vec(&clip).unwrap()),
        ("qwen+subword-prefix".to_owned(), serde_json::to_vec(&prefixed).unwrap()),
        ("made-up+prefix+suffix".to_owned(), serde_json::to_vec(&both).unwrap()),
        (
            "gpt2+regex-replace-normalizer".to_owned(),
            gpt2_with(
                norms(vec![
                    json!({"type": "Replace", "pattern": {"Regex": "(?i)the|\\p{N}+"}, "content": "#"}),
                    json!({"type": "Replace", "pattern": {"Regex": "\\s+(?!\\S)"}, "content": ""}),
                ]),
                byte_level(false, true),
            ),
        ),
    ]);
    patterns.into_iter().chain(vec![
        (
            "gpt2+added-token-flags".into(),
            serde_json::to_vec(&with_flags).unwrap(),
        ),
        (
            "gpt2-pattern-respelled".into(),
            gpt2_with(
                Value::Null,
                seq(vec![
                    split(
                        r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{Letter}+| ?\p{Number}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+",
                        "Isolated",
                        false,
                    ),
                    byte_level(false, false),
                ]),
            ),
        ),
        (
            "cl100k-literal-newlines-removed-inverted".into(),
            gpt2_with(
                Value::Null,
                seq(vec![
                    split(
                        &CL100K.replace("\\r", "\r").replace("\\n", "\n"),
                        "Removed",
                        true,
                    ),
                    byte_level(false, false),
                ]),
            ),
        ),
        (
            "o200k-removed-inverted".into(),
            gpt2_with(
                Value::Null,
                seq(vec![
                    split(O200K, "Removed", true),
                    byte_level(false, false),
                ]),
            ),
        ),
        (
            "gpt2+nfkc-lowercase-replace-strip".into(),
            gpt2_with(
                norms(vec![
                    json!({"type": "NFKC"}),
                    json!({"type": "Replace", "pattern": {"String": "  "}, "content": " "}),
                    json!({"type": "Lowercase"}),
                    json!({"type": "Strip", "strip_left": true, "strip_right": true}),
                ]),
                byte_level(false, true),
            ),
        ),
        (
            "gpt2+nfd-strip-accents-prepend+prefix-space".into(),
            gpt2_with(
                norms(vec![
                    json!({"type": "NFD"}),
                    json!({"type": "StripAccents"}),
                    json!({"type": "Prepend", "prepend": "\u{2581}"}),
                ]),
                byte_level(true, true),
            ),
        ),
        (
            "gpt2+nfkd-digits-punctuation".into(),
            gpt2_with(
                json!({"type": "NFKD"}),
                seq(vec![
                    json!({"type": "Digits", "individual_digits": true}),
                    json!({"type": "Punctuation", "behavior": "MergedWithNext"}),
                    byte_level(true, true),
                ]),
            ),
        ),
        (
            "gpt2+whitespace-steps".into(),
            gpt2_with(
                Value::Null,
                seq(vec![
                    json!({"type": "WhitespaceSplit"}),
                    json!({"type": "Punctuation", "behavior": "MergedWithPrevious"}),
                    byte_level(false, false),
                    json!({"type": "Whitespace"}),
                ]),
            ),
        ),
        (
            "gpt2+unknown-split-patterns".into(),
            gpt2_with(
                Value::Null,
                seq(vec![
                    split("[0-9][0-9]|[.,;:]+", "Contiguous", false),
                    split("[a-z]+", "MergedWithNext", true),
                    byte_level(false, true),
                    split("[0-9]", "Removed", false),
                ]),
            ),
        ),
    ]).collect()
}

/// Qwen2, 2.5 and 3.
const QWEN: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
/// CLIP (`Removed`, inverted).
const CLIP: &str = r"'s|'t|'re|'ve|'m|'ll|'d|[\p{L}]+|[\p{N}]|[^\s\p{L}\p{N}]+";
/// Kimi K2: class intersections and `\p{Han}`.
const KIMI: &str = r"[\p{Han}]+|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]*[\p{Ll}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]+[\p{Ll}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
/// Patterns no tokenizer ships, mixing Perl and POSIX classes, `(?i)`,
/// anchors, lazy repeats and lookaheads.
const MADE_UP: [&str; 4] = [
    r"(?i:kel)|\d+|\w+?x|[[:punct:]]+|\s+(?=\S)|\s",
    r"^\w+|\s+$|\p{Lu}\p{Ll}*|[\p{Han}\p{Hiragana}]{2,}|.",
    r"\S+\n?|[ \t]{1,4}(?![ \t])|\s",
    r"\p{L}+(?:'\p{L}+)?| ?\p{N}{1,2}|[^\s\w]| +(?!\S)|\s+",
];

fn pairs() -> Vec<Pair> {
    let gpt2 = serde_json::to_vec(&gpt2_json()).unwrap();
    let mut pairs = vec![
        Pair::new("gpt2", &gpt2),
        Pair::new("deepseek-v3", &deepseek_json()),
        Pair::new("cl100k", &gpt2_with_split(CL100K, false)),
        Pair::new("cl100k+ignore_merges", &gpt2_with_split(CL100K, true)),
        Pair::new("o200k", &gpt2_with_split(O200K, false)),
        Pair::new("gpt2-as-split", &gpt2_with_split(GPT2, true)),
    ];
    for (name, json) in byte_level_files().into_iter().chain(edited()) {
        pairs.push(Pair::new(&name, &json));
    }
    pairs
}

const GPT2: &str = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+";
const CL100K: &str = "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
const O200K: &str = "[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]*[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?|[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]+[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n/]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";

/// The split patterns the fast engine recognises by meaning: the first six
/// of `pairs()` and three spellings of `edited()`, built on the fast side
/// alone (the other tests compare them with HF).
#[test]
fn recognised_patterns() {
    let fast = |json: &[u8]| FastTokenizer::from_json(json).unwrap().pattern();
    let gpt2 = serde_json::to_vec(&gpt2_json()).unwrap();
    let patterns = [
        fast(&gpt2),
        fast(&deepseek_json()),
        fast(&gpt2_with_split(CL100K, false)),
        fast(&gpt2_with_split(CL100K, true)),
        fast(&gpt2_with_split(O200K, false)),
        fast(&gpt2_with_split(GPT2, true)),
    ];
    assert_eq!(
        patterns,
        [
            Pattern::Gpt2 { fold: false },
            Pattern::DeepSeek,
            Pattern::Cl100k { numbers: 3 },
            Pattern::Cl100k { numbers: 3 },
            Pattern::O200k { numbers: 3 },
            Pattern::Gpt2 { fold: false }
        ]
        .map(Some)
    );
    // Spelled otherwise, or `Removed` and inverted, they still take the
    // scanners' path.
    let edited = edited();
    let by_name = |name: &str| fast(&edited.iter().find(|(n, _)| n == name).unwrap().1);
    assert_eq!(
        by_name("gpt2-pattern-respelled"),
        Some(Pattern::Gpt2 { fold: false })
    );
    assert_eq!(
        by_name("cl100k-literal-newlines-removed-inverted"),
        Some(Pattern::Cl100k { numbers: 3 })
    );
    assert_eq!(
        by_name("o200k-removed-inverted"),
        Some(Pattern::O200k { numbers: 3 })
    );
    // Qwen's pattern is cl100k's with one number a piece: its scanner, in
    // both of its shapes.
    for name in ["qwen-0-Isolated", "qwen-0-Removed-inverted"] {
        assert_eq!(
            by_name(name),
            Some(Pattern::Cl100k { numbers: 1 }),
            "{name}"
        );
    }
}

/// The golden texts (fixtures/golden/README.md) but the long one through
/// every pair: the edge cases and the small corpus documents.
#[test]
fn corpus_excerpt_identical() {
    corpus_identical(|text| text.len() < LONG_DOCUMENT);
}

/// The golden texts' long document (about 3 MB of 16 languages) through
/// every pair: nine tenths of the golden bytes, so of the time, and nothing
/// the other texts do not have but its length; run by `make test-slow`
/// (tests/tiers.txt). `golden::*` runs it through the shipped tokenizers in
/// every `make test`.
#[test]
fn corpus_long_document_identical() {
    corpus_identical(|text| text.len() >= LONG_DOCUMENT);
}

/// Where `corpus_excerpt_identical` ends and `corpus_long_document_identical`
/// starts: the golden texts' one long document is far above it, every other
/// far below.
const LONG_DOCUMENT: usize = 1 << 20;

fn corpus_identical(keep: impl Fn(&str) -> bool) {
    let corpus = read_zst(&common::fixture("golden/texts.jsonl.zst"));
    let texts: Vec<String> = texts(&corpus).into_iter().filter(|t| keep(t)).collect();
    assert!(!texts.is_empty());
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

/// The whole corpus (tens of MB; run by `make test-by-hand`, in release, with
/// `PREP_EXTERNAL_DATA`).
#[test]
#[cfg(prep_by_hand)]
fn shared_corpus_identical() {
    common::engine::shared_corpus_identical(pairs());
}

/// Fragments that meet every branch of the patterns and the added tokens.
fn fragment() -> impl Strategy<Value = String> {
    let words = proptest::sample::select(vec![
        "the",
        " the",
        "The",
        "ing",
        "ing the",
        "zqxj",
        "<mask>",
        " <mask> ",
        "<sep>",
        "<both>",
        "HTTPServer",
        "camelCase",
        "don't",
        "DON'T",
        "they'll",
        "'s",
        "'S",
        "'ſ",
        "'re",
        "'Ve",
        "'ll",
        "'d",
        "'m",
        "''",
        "'x",
        "école",
        "ÉCOLE",
        "Straße",
        "İstanbul",
        "naïve",
        "mañana",
        "中文",
        "日本語の",
        "カタカナ・",
        "ー",
        "한국어",
        "русский",
        "ελληνικά",
        "עברית",
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
        "ǅ",
        "ʰ",
        "<|endoftext|>",
        "<|im_start|>",
        "<|im_end|>",
        "<|im",
        "<|endoftext",
        "<｜end▁of▁sentence｜>",
        "<｜begin▁of▁sentence｜>",
        "\\n",
        "\\\"",
        "\\u00e9",
        "\\t",
        "{\"a\": 1}",
        "//",
        "///",
        "://",
        "http://example.org/a?b=c",
        "$x",
        "#!",
        "...",
        "!!",
        "?!",
        "--",
        "==",
        "**",
        "(",
        ")",
        "[",
        "]",
        "€",
        "£",
        "±",
        "²",
        "٣",
        "१२",
        "Ⅻ",
        "½",
    ]);
    prop_oneof![
        3 => words.prop_map(str::to_owned),
        2 => (proptest::sample::select(vec![" ", "\n", "\t", "\r\n", "\r", "\u{a0}", "\u{3000}", "\u{85}", "\u{2028}", "\u{b}"]), 1..12usize)
            .prop_map(|(s, n)| s.repeat(n)),
        1 => (proptest::sample::select(vec!["0", "7", "123", "٣", "²"]), 1..9usize)
            .prop_map(|(s, n)| s.repeat(n)),
        1 => "[a-zA-Z0-9 .,;:!?'\"()\\-]{1,12}",
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

/// Long runs go through the heap merge; they must agree too.
#[test]
fn long_pieces_identical() {
    let mut texts = vec![
        "=".repeat(5000),
        "a".repeat(3000),
        " ".repeat(4000) + "x",
        "\n".repeat(2000),
        "ab".repeat(1500),
        "supercalifragilistic".repeat(200),
        "0123456789".repeat(300),
        "中".repeat(2000),
    ];
    let mut next = common::xorshift(7);
    texts.push(
        (0..20000)
            .map(|_| char::from(b"abcdefgh ijk"[(next() % 12) as usize]))
            .collect(),
    );
    let mut failures = Vec::new();
    for pair in pairs() {
        let mut state = EncodeState::default();
        for text in &texts {
            if let Err(e) = pair.check(text, &mut state) {
                failures.push(e);
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// What the fast engine must refuse (HF then runs): each with its reason.
#[test]
fn unsupported_tokenizers_are_refused() {
    type Change = Box<dyn Fn(&mut Value)>;
    let cases: Vec<(&str, Change)> = vec![
        (
            "regex Replace normalizer with a backreference",
            Box::new(|j| {
                j["normalizer"] =
                    json!({"type": "Replace", "pattern": {"Regex": "(a)\\1"}, "content": " "})
            }),
        ),
        ("dropout", Box::new(|j| j["model"]["dropout"] = 0.1.into())),
        (
            "byte_fallback",
            Box::new(|j| j["model"]["byte_fallback"] = true.into()),
        ),
        (
            "WordPiece",
            Box::new(|j| j["model"]["type"] = "WordPiece".into()),
        ),
        (
            "Metaspace beside ByteLevel",
            Box::new(|j| {
                j["pre_tokenizer"] = json!({"type": "Sequence", "pretokenizers": [
                {"type": "Metaspace"},
                {"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": false}]});
            }),
        ),
        (
            "unknown split",
            Box::new(|j| {
                j["pre_tokenizer"] = json!({"type": "Sequence", "pretokenizers": [
                {"type": "Split", "pattern": {"Regex": "(?<=\\w)\\s"}, "behavior": "Isolated", "invert": false},
                {"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": false}]});
            }),
        ),
        (
            "missing byte",
            Box::new(|j| {
                // Without an unknown token HF drops such a byte, as the engine
                // does; with one, the engine leaves the file to HF.
                j["model"]["vocab"].as_object_mut().unwrap().remove("Ġ");
                j["model"]["unk_token"] = "<|endoftext|>".into();
            }),
        ),
    ];
    for (name, change) in cases {
        let mut j = gpt2_json();
        change(&mut j);
        let refused = FastTokenizer::from_json(&serde_json::to_vec(&j).unwrap());
        assert!(refused.is_err(), "{name}: accepted");
    }
}

/// A split pattern the fast engine cannot run exactly is refused with the
/// construct named, so a user knows why prep falls back to HF.
#[test]
fn refused_split_patterns_name_the_construct() {
    for (pattern, named) in [
        (r"(\w)\1", "backreference"),
        (r"(?<=\w)\s", "lookbehind"),
        (r"(?>\w+)", "atomic group"),
        (r"\w++", "possessive"),
        (r"\bthe\b", "word boundary"),
        (r"(?!\s)\w+", "lookahead"),
        (r"a(?i)b|c", "isolated flag"),
        (r"(?i)ss|\w", "multi-character case fold"),
        (r"\w*", "empty string"),
    ] {
        let json = gpt2_with(
            Value::Null,
            json!({"type": "Sequence", "pretokenizers": [split(pattern, "Isolated", false), byte_level(false, false)]}),
        );
        // HF takes every one of them.
        Tokenizer::from_bytes(&json).unwrap_or_else(|e| panic!("{pattern}: HF refuses it: {e}"));
        match FastTokenizer::from_json(&json) {
            Ok(_) => panic!("{pattern}: accepted"),
            Err(e) => assert!(e.0.contains(named), "{pattern}: {e}"),
        }
    }
}

/// The pairs with HF's offset trim on: every pair's post-processor
/// replaced by a trimming `ByteLevel`, with and without a prefix space
/// (RoBERTa's and GPT-NeoX's files trim as shipped).
fn trimming_pairs() -> Vec<Pair> {
    let mut pairs = Vec::new();
    for (name, json) in [
        ("gpt2".to_owned(), serde_json::to_vec(&gpt2_json()).unwrap()),
        ("cl100k".to_owned(), gpt2_with_split(CL100K, false)),
    ] {
        for prefix in [false, true] {
            let mut j: Value = serde_json::from_slice(&json).unwrap();
            j["post_processor"] = json!({"type": "Sequence", "processors": [
                {"type": "ByteLevel", "add_prefix_space": prefix, "trim_offsets": true, "use_regex": true},
                {"type": "TemplateProcessing", "single": [{"Sequence": {"id": "A", "type_id": 0}}],
                 "pair": [{"Sequence": {"id": "A", "type_id": 0}}], "special_tokens": {}}
            ]});
            pairs.push(Pair::new(
                &format!("{name}+trim(prefix {prefix})"),
                &serde_json::to_vec(&j).unwrap(),
            ));
        }
    }
    pairs
}

/// The pairs whose offsets are checked, with their tables: the split
/// patterns, every real byte-level file, the trimming pairs, the
/// vocabularies spelled with a prefix or suffix, and the normalizers.
fn offset_pairs() -> Vec<(Pair, Offsets)> {
    let gpt2 = serde_json::to_vec(&gpt2_json()).unwrap();
    let mut pairs = vec![
        Pair::new("gpt2", &gpt2),
        Pair::new("deepseek-v3", &deepseek_json()),
        Pair::new("cl100k", &gpt2_with_split(CL100K, false)),
        Pair::new("o200k", &gpt2_with_split(O200K, false)),
    ];
    let affixed = ["clip", "qwen+subword-prefix", "made-up+prefix+suffix"];
    let edited = edited()
        .into_iter()
        .filter(|(name, _)| affixed.contains(&name.as_str()) || name.starts_with("gpt2+nfkc"));
    for (name, json) in byte_level_files().into_iter().chain(edited) {
        let real = !name.contains('+') && !name.contains("-Isolated") && !name.contains("-Removed");
        let new = !pairs.iter().any(|p| p.name == name);
        if new && (real || affixed.contains(&name.as_str()) || name.starts_with("gpt2+nfkc")) {
            pairs.push(Pair::new(&name, &json));
        }
    }
    pairs
        .into_iter()
        .chain(trimming_pairs())
        .map(|pair| {
            let table =
                Offsets::new(&pair.hf).unwrap_or_else(|| panic!("{}: no offset table", pair.name));
            (pair, table)
        })
        .collect()
}

/// Whether `Offsets::of` must place every text for this pair: all but
/// the tokenizers that change or drop text (Falcon's vocabulary lacks a
/// few control bytes, which HF drops; GPT-NeoX normalizes to NFC; CLIP and
/// the normalizer variant lowercase; RoBERTa's `<mask>` takes the spaces
/// before it).
fn must_place(pair: &Pair) -> bool {
    !(["falcon", "gpt-neox-20b", "clip", "roberta-base"].contains(&pair.name.as_str())
        || pair.name.starts_with("gpt2+nfkc"))
}

/// The golden texts under 4 KiB (185 of 211: the edge cases and the short
/// documents of every script; HF's offsets in a debug build are the cost),
/// then generated adversarial texts (proptest's fragments), through every
/// offset pair: one test, so that the pairs are built once.
#[test]
fn offsets_are_hf_offsets() {
    let corpus = read_zst(&common::fixture("golden/texts.jsonl.zst"));
    let texts: Vec<String> = texts(&corpus)
        .into_iter()
        .filter(|t| t.len() < 4096)
        .collect();
    let pairs = offset_pairs();
    let placed = placed_counts(&pairs, &texts);
    for ((pair, _), n) in pairs.iter().zip(&placed) {
        if must_place(pair) {
            assert_eq!(*n, texts.len(), "{} places every text", pair.name);
        }
    }
    let mut runner = proptest::test_runner::TestRunner::new(ProptestConfig::with_cases(64));
    runner
        .run(&proptest::collection::vec(fragment(), 0..24), |parts| {
            let text = parts.concat();
            let placed = offsets_agree(&pairs, &text).map_err(TestCaseError::fail)?;
            for ((pair, _), p) in pairs.iter().zip(placed) {
                prop_assert!(
                    p || !must_place(pair),
                    "{} does not place {text:?}",
                    pair.name
                );
            }
            Ok(())
        })
        .unwrap();
}
