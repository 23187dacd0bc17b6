//! The fast engine's SentencePiece-style BPE against HF tokenizers:
//! identical ids or the test fails.
//!
//! Every test encodes the same text with `prep::engine::FastTokenizer` and
//! with the `tokenizers` crate (`encode(text, false)`, truncation and padding
//! off, as `prep tokenize` runs it). The tokenizers are Mistral 7B and
//! Phi-3 mini as shipped (fixtures/tokenizers), edits of them that cover
//! the options the shipped files leave out (byte fallback off with and
//! without an unknown token, `fuse_unk` off, `ignore_merges`, each
//! `prepend_scheme`, `split: true`, added tokens in the middle of words,
//! merges that break the proof that lets the engine cut a word), and a
//! small tokenizer built here. The texts are the committed corpus excerpt,
//! long runs (the heap path and the cuts inside a long piece), fixed edge
//! cases and generated adversarial text; with `make test-by-hand`, in release, the
//! whole shared corpus, and a speed comparison that prints MB/s.
//!
//! The `tokenizers` crate is the code the Python package runs;
//! `python_package_agrees` checks that on these files when the reference
//! venv is built.

use crate::common;

use crate::common::engine::{offsets_agree, placed_counts, read_zst, texts, Pair};

use std::io::BufRead;

use prep::engine::offsets::Offsets;
use prep::engine::{EncodeState, FastTokenizer};
use proptest::prelude::*;
use serde_json::{json, Value};

/// A SentencePiece-style tokenizer file committed in fixtures/tokenizers.
fn shipped(name: &str) -> Value {
    serde_json::from_slice(&read_zst(&common::tokenizer(name))).unwrap()
}

/// Gemma 3's, which the repository may not ship (`PREP_EXTERNAL_DATA`).
fn gemma3() -> Value {
    serde_json::from_slice(&read_zst(&common::external(
        "tokenizers/gemma3.tokenizer.json.zst",
    )))
    .unwrap()
}

fn metaspace(prepend_scheme: &str, split: bool) -> Value {
    json!({"type": "Metaspace", "replacement": "\u{2581}", "prepend_scheme": prepend_scheme, "split": split})
}

fn added(id: u64, content: &str, normalized: bool, special: bool, rstrip: bool) -> Value {
    json!({"id": id, "content": content, "single_word": false, "lstrip": false,
        "rstrip": rstrip, "normalized": normalized, "special": special})
}

/// Adds `token` to a model's vocabulary with the next id, and the merge
/// `left right` (making it) last.
fn add_merge(j: &mut Value, left: &str, right: &str) {
    let vocab = j["model"]["vocab"].as_object_mut().unwrap();
    let next = vocab.values().filter_map(Value::as_u64).max().unwrap() + 1;
    vocab.insert(format!("{left}{right}"), next.into());
    j["model"]["merges"]
        .as_array_mut()
        .unwrap()
        .push(format!("{left} {right}").into());
}

/// A small SentencePiece-style tokenizer, committed as code: single
/// characters, the 256 byte tokens, runs of `▁`, and merges that make
/// words, equal neighbours (`a a` on `aaaa`: leftmost first) and merges of
/// merges.
fn mini() -> Value {
    let mut vocab = serde_json::Map::new();
    let mut push = |t: &str| {
        let id = vocab.len() as u64;
        vocab.entry(t.to_owned()).or_insert(id.into());
    };
    for t in ["<unk>", "<s>", "</s>"] {
        push(t);
    }
    for b in 0..=255u8 {
        push(&format!("<0x{b:02X}>"));
    }
    for c in "\u{2581}abcdefghijklmnopqrstuvwxyzTHE.,'0123456789éд中".chars() {
        push(&c.to_string());
    }
    let merges = [
        "\u{2581} \u{2581}",
        "\u{2581}\u{2581} \u{2581}\u{2581}",
        "\u{2581}\u{2581} \u{2581}",
        "t h",
        "th e",
        "\u{2581} the",
        "a a",
        "aa a",
        "aa aa",
        "i n",
        "in g",
        "\u{2581} in",
        "e r",
        "\u{2581} a",
        "\u{2581}a n",
        "\u{2581}an d",
        "o n",
        "\u{2581} on",
        "\u{2581}on e",
        "é t",
        "д д",
        "中 中",
        "1 2",
        "12 3",
        "T H",
        "TH E",
        "\u{2581} TH",
    ];
    for m in merges {
        let (a, b) = m.split_once(' ').unwrap();
        push(a);
        push(b);
        push(&format!("{a}{b}"));
    }
    json!({
        "version": "1.0",
        "truncation": null,
        "padding": null,
        "added_tokens": [
            added(0, "<unk>", false, true, false),
            added(1, "<s>", false, true, false),
            added(2, "</s>", false, true, false),
        ],
        "normalizer": null,
        "pre_tokenizer": metaspace("first", false),
        "post_processor": null,
        "decoder": null,
        "model": {
            "type": "BPE", "dropout": null, "unk_token": "<unk>",
            "continuing_subword_prefix": null, "end_of_word_suffix": null,
            "fuse_unk": true, "byte_fallback": true, "ignore_merges": false,
            "vocab": vocab, "merges": merges,
        }
    })
}

/// Gives the added tokens the ids HF gives them: a token of the model's
/// vocabulary keeps its id there, the others take the next ids from the
/// vocabulary's size on (HF ignores the file's ids; an edit that changes
/// the vocabulary's size moves them).
fn hf_added_ids(j: &mut Value) {
    let vocab = j["model"]["vocab"].as_object().unwrap().clone();
    let mut next = vocab.len() as u64;
    for t in j["added_tokens"].as_array_mut().unwrap() {
        t["id"] = match vocab.get(t["content"].as_str().unwrap()) {
            Some(id) => id.clone(),
            None => {
                next += 1;
                (next - 1).into()
            }
        };
    }
}

/// The tokenizers of one base, as shipped and edited.
fn variants(name: &str, base: &Value) -> Vec<(String, Value)> {
    let edit = |what: &str, change: &dyn Fn(&mut Value)| {
        let mut j = base.clone();
        change(&mut j);
        hf_added_ids(&mut j);
        (format!("{name}+{what}"), j)
    };
    let model = |j: &mut Value, key: &str, value: Value| j["model"][key] = value;
    vec![
        (name.to_owned(), base.clone()),
        edit("no-byte-fallback", &|j: &mut Value| {
            model(j, "byte_fallback", false.into())
        }),
        edit("no-byte-fallback-no-fuse", &|j: &mut Value| {
            model(j, "byte_fallback", false.into());
            model(j, "fuse_unk", false.into());
        }),
        edit("no-byte-fallback-no-unk", &|j: &mut Value| {
            model(j, "byte_fallback", false.into());
            model(j, "unk_token", Value::Null);
        }),
        edit("some-bytes-missing-no-fuse", &|j: &mut Value| {
            // Characters whose bytes are all there fall back; the others
            // are unknown, pushed after the bytes of later characters.
            let vocab = j["model"]["vocab"].as_object_mut().unwrap();
            for b in ["<0xE4>", "<0xF0>", "<0x09>"] {
                vocab.remove(b);
            }
            model(j, "fuse_unk", false.into());
        }),
        edit("some-bytes-missing-no-unk", &|j: &mut Value| {
            let vocab = j["model"]["vocab"].as_object_mut().unwrap();
            for b in ["<0xE4>", "<0xF0>", "<0x09>"] {
                vocab.remove(b);
            }
            model(j, "unk_token", Value::Null);
        }),
        edit("ignore-merges", &|j: &mut Value| {
            model(j, "ignore_merges", true.into())
        }),
        edit("prepend-always", &|j: &mut Value| {
            j["normalizer"] = Value::Null;
            j["pre_tokenizer"] = metaspace("always", false);
        }),
        edit("prepend-never", &|j: &mut Value| {
            j["normalizer"] = Value::Null;
            j["pre_tokenizer"] = metaspace("never", false);
        }),
        edit("split", &|j: &mut Value| {
            j["normalizer"] = Value::Null;
            j["pre_tokenizer"] = metaspace("first", true);
        }),
        edit("added-in-words", &|j: &mut Value| {
            // Tokens inside text, of both passes: the text after one does
            // not start the input (Metaspace's `first`).
            // (Their ids are set by `hf_added_ids`.)
            let list = j["added_tokens"].as_array_mut().unwrap();
            list.push(added(0, "<|im_start|>", false, true, false));
            list.push(added(0, "ing the", true, false, false));
            list.push(added(0, "<sep>", false, true, true));
        }),
        edit("merges-across-words", &|j: &mut Value| {
            // Merges that join a letter to a following `▁` and a `▁` to
            // a letter before it: those junctions lose their cut.
            add_merge(j, "o", "\u{2581}");
            add_merge(j, "e", "\u{2581}the");
            add_merge(j, "<0x0A>", "\u{2581}");
            add_merge(j, "<0x0A>", "<0x0A>");
        }),
        edit("two-texts-one-id", &|j: &mut Value| {
            // An id with two texts: the engine keeps every word whole.
            let vocab = j["model"]["vocab"].as_object_mut().unwrap();
            let id = vocab["\u{2581}the"].clone();
            vocab.insert("\u{2581}thé-alias".into(), id);
        }),
    ]
}

fn all_pairs() -> Vec<Pair> {
    let mut list = variants("mini", &mini());
    for name in ["mistral-7b-v0.1", "phi-3-mini"] {
        list.extend(variants(name, &shipped(name)));
    }
    list.into_iter()
        .map(|(name, j)| Pair::new(&name, &serde_json::to_vec(&j).unwrap()))
        .collect()
}

fn excerpt() -> Vec<String> {
    texts(&read_zst(&common::fixture(
        "corpus/debian-sample.jsonl.zst",
    )))
}

/// Edge cases each named in the task: spaces, `▁` itself, whitespace only,
/// added tokens at the start, in the middle and at the end.
const EDGES: &[&str] = &[
    "",
    " ",
    "  ",
    "\n",
    " \n \t ",
    "\t\t\n\n\r\n",
    "hello",
    " hello",
    "   hello   world   ",
    "hello world",
    "\u{2581}",
    "\u{2581}\u{2581}\u{2581}",
    "\u{2581}hello",
    "a\u{2581}b \u{2581} c\u{2581}\u{2581}",
    " \u{2581}",
    "<s>",
    "<s>hello",
    "<s> hello",
    "hello<s>world",
    "hello <s> world",
    "hello</s>  world</s>",
    "</s>",
    " </s> ",
    "<unk>x<unk>",
    "<|user|>\nhi<|end|>\n<|assistant|>   ok",
    "<|endoftext|><|endoftext|>",
    "xx<|im_start|>yy<sep>   zz",
    "doing the thing<sep>",
    "the the the",
    "aaaa aaaaa aaaaaa",
    "THE THETHE",
    "123123 1234",
    "ééé étét дддд 中中中",
    "\u{fffd}\u{0}\u{1}\u{7f}\u{85}",
    "😀👩\u{200d}💻🇩🇪",
    "\u{e000}\u{10ffff}",
    "e\u{301}\u{301}a\u{300}\u{323}",
    "𝔘𝔫𝔦𝔠𝔬𝔡𝔢",
    "don't 'tis o'clock ''",
    "\u{3000}\u{a0}\u{2028}\u{feff}",
];

#[test]
fn edge_cases_identical() {
    let mut failures = Vec::new();
    for pair in all_pairs() {
        let mut state = EncodeState::default();
        for text in EDGES {
            if let Err(e) = pair.check(text, &mut state) {
                failures.push(e);
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn corpus_excerpt_identical() {
    let texts = excerpt();
    let mut failures = Vec::new();
    for (n, pair) in all_pairs().iter().enumerate() {
        let mut state = EncodeState::default();
        // The shipped files see every document, the edits a part (a debug
        // build of HF is slow).
        let take = if pair.name.contains('+') {
            60
        } else {
            texts.len()
        };
        for text in texts.iter().skip(n % 7 * 40).take(take) {
            if let Err(e) = pair.check(text, &mut state) {
                failures.push(e);
                break;
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// Long words go through the heap merge, and a long piece is cut inside.
#[test]
fn long_runs_identical() {
    let mut texts = vec![
        " ".repeat(5000),
        " ".repeat(3000) + "x" + &" ".repeat(37),
        "\u{2581}".repeat(1000),
        "a".repeat(3000),
        "\n".repeat(2000),
        "\t \n".repeat(700),
        "the ".repeat(2000),
        "中".repeat(2000),
        "中文数据获取一个日本語のテキスト".repeat(100),
        "supercalifragilistic".repeat(200),
        "0123456789".repeat(300),
        "😀".repeat(500),
        "<s>".repeat(300) + &"x ".repeat(300),
    ];
    let mut next = common::xorshift(11);
    texts.push(
        (0..20000)
            .map(|_| char::from(b"abcdefgh ijk\nTHE."[(next() % 17) as usize]))
            .collect(),
    );
    let mut failures = Vec::new();
    for pair in all_pairs() {
        let mut state = EncodeState::default();
        for text in &texts {
            if let Err(e) = pair.check(text, &mut state) {
                failures.push(e);
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// Fragments that meet every branch: scripts, marks, spaces, `▁`, added
/// tokens, characters no vocabulary has.
fn fragment() -> impl Strategy<Value = String> {
    let words = proptest::sample::select(vec![
        "the",
        " the",
        "The",
        "THE",
        "ing",
        "ing the",
        "aaa",
        "one",
        "and",
        "in",
        "\u{2581}",
        "\u{2581}\u{2581}",
        "\u{2581}the",
        "<s>",
        "</s>",
        "<unk>",
        "<|user|>",
        "<|end|>",
        "<|endoftext|>",
        "<|im_start|>",
        "<sep>",
        "<0x0A>",
        "école",
        "Straße",
        "中文",
        "数据",
        "日本語の",
        "한국어",
        "русский",
        "ддд",
        "ελληνικά",
        "עברית",
        "العربية",
        "हिन्दी",
        "ไทย",
        "e\u{301}",
        "\u{301}",
        "\u{200b}",
        "\u{200d}",
        "👩\u{200d}💻",
        "😀",
        "🇩🇪",
        "\u{fffd}",
        "\u{0}",
        "\u{1b}",
        "\u{e000}",
        "𝔘",
        "don't",
        "'",
        "''",
        "123",
        "١٢٣",
        "http://example.org/a?b=c",
        "/usr/share/doc",
        "...",
    ]);
    prop_oneof![
        4 => words.prop_map(str::to_owned),
        2 => (proptest::sample::select(vec![" ", "\n", "\t", "\r\n", "\u{a0}", "\u{3000}", "\u{2581}"]), 1..20usize)
            .prop_map(|(s, n)| s.repeat(n)),
        1 => "[a-zA-Z0-9 .,;:!?'\"()\\-]{1,12}",
        1 => any::<char>().prop_map(String::from),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(300))]
    #[test]
    fn adversarial_text_identical(parts in proptest::collection::vec(fragment(), 0..24)) {
        let text = parts.concat();
        thread_local! {
            static PAIRS: Vec<Pair> = all_pairs();
        }
        PAIRS
            .with(|pairs| common::engine::check_all(pairs, &text))
            .map_err(TestCaseError::fail)?;
    }
}

/// Options the engine does not run exactly are refused (HF then runs).
#[test]
fn unsupported_options_are_refused() {
    type Change = Box<dyn Fn(&mut Value)>;
    let cases: Vec<(&str, Change)> = vec![
        ("dropout", Box::new(|j| j["model"]["dropout"] = 0.1.into())),
        (
            "continuing_subword_prefix",
            Box::new(|j| j["model"]["continuing_subword_prefix"] = "##".into()),
        ),
        (
            "end_of_word_suffix",
            Box::new(|j| j["model"]["end_of_word_suffix"] = "</w>".into()),
        ),
        (
            "unk_token not in the vocabulary",
            Box::new(|j| j["model"]["unk_token"] = "<nope>".into()),
        ),
        (
            "merge of unknown tokens",
            Box::new(|j| {
                j["model"]["merges"]
                    .as_array_mut()
                    .unwrap()
                    .push("qq zz".into())
            }),
        ),
    ];
    for (name, change) in cases {
        let mut j = mini();
        change(&mut j);
        let refused = FastTokenizer::from_json(&serde_json::to_vec(&j).unwrap());
        assert!(refused.is_err(), "{name}: accepted");
    }
    // Dropout 0 is no dropout, in HF as here.
    let mut j = mini();
    j["model"]["dropout"] = 0.0.into();
    Pair::new("mini+dropout-0", &serde_json::to_vec(&j).unwrap())
        .check("the aaaa", &mut EncodeState::default())
        .unwrap();
}

/// The Python package (what `prep tokenize --engine hf` users compare
/// with) gives the `tokenizers` crate's ids on these files: run when the
/// reference venv (`make target/venv/.installed`, or `PREP_REFERENCE_PYTHON`)
/// is there.
#[test]
fn python_package_agrees() {
    let Some(python) = common::reference_python() else {
        return;
    };
    let dir = common::TestDir::new();
    let mut texts: Vec<String> = EDGES.iter().map(|s| s.to_string()).collect();
    texts.extend(excerpt().into_iter().take(40));
    texts.push(" ".repeat(300) + "a  b");
    let lines: String = texts
        .iter()
        .map(|t| json!({ "text": t }).to_string() + "\n")
        .collect();
    let input = dir.write("texts.jsonl", lines);
    let mut bases = vec![("mini".to_owned(), mini())];
    for name in ["mistral-7b-v0.1", "phi-3-mini"] {
        bases.push((name.to_owned(), shipped(name)));
    }
    for (name, base) in bases {
        let file = dir.write(&format!("{name}.json"), serde_json::to_vec(&base).unwrap());
        let script = "import json, sys\n\
            from tokenizers import Tokenizer\n\
            t = Tokenizer.from_file(sys.argv[1])\n\
            t.no_truncation(); t.no_padding()\n\
            for line in open(sys.argv[2], encoding='utf-8'):\n\
            \x20   print(json.dumps(t.encode(json.loads(line)['text'], add_special_tokens=False).ids))\n";
        let out = std::process::Command::new(&python)
            .args(["-c", script])
            .arg(&file)
            .arg(&input)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let pair = Pair::new(&name, &serde_json::to_vec(&base).unwrap());
        let got: Vec<Vec<u32>> = out
            .stdout
            .as_slice()
            .lines()
            .map(|l| serde_json::from_str(&l.unwrap()).unwrap())
            .collect();
        assert_eq!(got.len(), texts.len());
        for (text, ids) in texts.iter().zip(got) {
            assert_eq!(ids, pair.hf_ids(text), "{name}: on {text:?}");
        }
    }
}

/// The whole corpus (tens of MB; run by `make test-by-hand`, in release, with
/// `PREP_EXTERNAL_DATA`): the files as shipped, Gemma 3's among them (its
/// pre-tokenizer never splits, so each document reaches the model whole).
#[test]
#[cfg(prep_by_hand)]
fn shared_corpus_identical() {
    let gemma = Pair::new("gemma3", &serde_json::to_vec(&gemma3()).unwrap());
    common::engine::shared_corpus_identical(
        all_pairs()
            .into_iter()
            .filter(|pair| !pair.name.contains('+'))
            .chain([gemma])
            .collect(),
    );
}

/// Every pair with its offset table (the SentencePiece files as shipped
/// and edited).
fn offset_pairs() -> Vec<(Pair, Offsets)> {
    let list: Vec<(String, Value)> = all_pairs()
        .into_iter()
        .map(|p| (p.name.clone(), serde_json::from_slice(&p.json).unwrap()))
        .collect();
    with_offsets(list)
}

/// Each named tokenizer.json with its pair and offset table.
fn with_offsets(list: Vec<(String, Value)>) -> Vec<(Pair, Offsets)> {
    list.into_iter()
        .map(|(name, j)| {
            let pair = Pair::new(&name, &serde_json::to_vec(&j).unwrap());
            let table = Offsets::new(&pair.hf).unwrap_or_else(|| panic!("{name}: no offset table"));
            (pair, table)
        })
        .collect()
}

/// Where a pair must place every plain text: the files whose steps only
/// mark spaces and whose every byte has a token (no unknown token standing
/// for text), with no token spelled as a byte token plus more (merges
/// across words) and no id spelled two ways.
fn must_place(pair: &Pair) -> bool {
    ![
        "no-byte-fallback",
        "some-bytes-missing",
        "added-in-words",
        "merges-across-words",
        "two-texts-one-id",
    ]
    .iter()
    .any(|edit| pair.name.contains(edit))
}

/// The edge cases and part of the excerpt, then generated adversarial
/// texts, through every offset pair: one test, so that the pairs (the slow
/// part) are built once.
#[test]
fn offsets_are_hf_offsets() {
    check_offsets(&offset_pairs());
}

/// As above, for Gemma 3's file as released, which the repository may not
/// ship.
#[test]
#[cfg_attr(
    not(prep_external_data),
    ignore = "needs PREP_EXTERNAL_DATA (tokenizers/gemma3.tokenizer.json.zst)"
)]
fn gemma3_offsets_are_hf_offsets() {
    check_offsets(&with_offsets(vec![("gemma3".into(), gemma3())]));
}

fn check_offsets(pairs: &[(Pair, Offsets)]) {
    let texts: Vec<String> = EDGES
        .iter()
        .map(|s| s.to_string())
        .chain(excerpt().into_iter().take(40))
        .collect();
    placed_counts(pairs, &texts);
    // Texts with no `▁` of their own and no added token that takes spaces.
    let plain: Vec<&String> = texts
        .iter()
        .filter(|t| !t.contains('\u{2581}') && !t.contains("<|") && !t.contains("</s>"))
        .collect();
    for (pair, table) in pairs {
        if !must_place(pair) {
            continue;
        }
        let mut out = Vec::new();
        for text in &plain {
            let ids = pair.hf.encode(text.as_str(), false).unwrap();
            assert!(
                table.of(ids.get_ids(), text, &mut out),
                "{} does not place {text:?}",
                pair.name
            );
        }
    }
    let mut runner = proptest::test_runner::TestRunner::new(ProptestConfig::with_cases(64));
    runner
        .run(&proptest::collection::vec(fragment(), 0..24), |parts| {
            offsets_agree(pairs, &parts.concat()).map_err(TestCaseError::fail)?;
            Ok(())
        })
        .unwrap();
}
