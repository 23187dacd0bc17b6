//! The special tokens prep chooses and resolves: the default end-of-document
//! token is always the tokenizer's own *special* token (checked against the
//! real tokenizer.json files of ten model families), the post-processor's
//! additions are reported rather than dropped, and `--eos`, `--bos`, `--pad`
//! and `--sep` read a whole number as an id in every subcommand.

use std::path::{Path, PathBuf};

use crate::common::*;
use prep::engine::{
    token_arg, LoadedTokenizer, PostProcessorTokens, Readings, TokenNames, EOS_NAMES,
};

/// DeepSeek V3: the token "0" is id 18; id 0 is `<｜begin▁of▁sentence｜>`.
const DEEPSEEK_DIGIT_ZERO: u32 = 18;

fn deepseek() -> PathBuf {
    fixture("tokenizers/deepseek-v3.tokenizer.json.zst")
}

/// What each known tokenizer must give: its default eos, and what its
/// post-processor adds before and after a sequence.
struct Expected {
    file: &'static str,
    eos: (&'static str, u32),
    before: &'static [u32],
    after: &'static [u32],
}

const EXPECTED: &[Expected] = &[
    Expected {
        file: "gpt2",
        eos: ("<|endoftext|>", 50256),
        before: &[],
        after: &[],
    },
    Expected {
        file: "deepseek-v3",
        eos: ("<｜end▁of▁sentence｜>", 1),
        before: &[],
        after: &[],
    },
    Expected {
        file: "gpt-neox-20b",
        eos: ("<|endoftext|>", 0),
        before: &[],
        after: &[],
    },
    Expected {
        file: "falcon",
        eos: ("<|endoftext|>", 11),
        before: &[],
        after: &[],
    },
    // Phi-3's </s> (id 2) is an ordinary token; its end of text is special.
    Expected {
        file: "phi-3-mini",
        eos: ("<|endoftext|>", 32000),
        before: &[],
        after: &[],
    },
    Expected {
        file: "mistral-7b-v0.1",
        eos: ("</s>", 2),
        before: &[1],
        after: &[],
    },
    // Gemma 3 (SentencePiece-style BPE, 262,144 ids): bos first, nothing after.
    Expected {
        file: "gemma3",
        eos: ("<eos>", 1),
        before: &[2],
        after: &[],
    },
    Expected {
        file: "t5-small",
        eos: ("</s>", 1),
        before: &[],
        after: &[1],
    },
    // RoBERTa's vocabulary has a plain "<|endoftext|>" (id 50260): not it.
    Expected {
        file: "roberta-base",
        eos: ("</s>", 2),
        before: &[0],
        after: &[2],
    },
    // No end-of-document name: the special token the template appends.
    Expected {
        file: "bert-base-uncased",
        eos: ("[SEP]", 102),
        before: &[101],
        after: &[102],
    },
    Expected {
        file: "minilm-wordpiece",
        eos: ("[SEP]", 102),
        before: &[101],
        after: &[102],
    },
];

/// `(id, special)` of the added token with this text, read straight from
/// the JSON: a check that does not go through the code under test.
fn added_token(path: &Path, text: &str) -> Option<(u32, bool)> {
    let json = zstd::decode_all(std::fs::File::open(path).unwrap()).unwrap();
    let json: serde_json::Value = serde_json::from_slice(&json).unwrap();
    json["added_tokens"]
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["content"] == text)
        .map(|t| {
            (
                t["id"].as_u64().unwrap() as u32,
                t["special"].as_bool().unwrap(),
            )
        })
}

/// The default eos, the post-processor's tokens and the notes, from HF
/// tokenizers' reading of every real file and from the fast engine's (which
/// a fast run uses, without reading the file with HF at all).
#[test]
fn default_eos_is_the_special_end_of_document_token_of_every_real_tokenizer() {
    let files = tokenizer_files();
    assert!(files.len() >= 10, "the fixtures hold ten tokenizers");
    check_defaults_of(&files);
}

/// As above, for the one real file the repository may not ship.
#[test]
#[cfg_attr(
    not(prep_external_data),
    ignore = "needs PREP_EXTERNAL_DATA (tokenizers/gemma3.tokenizer.json.zst)"
)]
fn default_eos_of_gemma3() {
    check_defaults_of(&[external("tokenizers/gemma3.tokenizer.json.zst")]);
}

fn check_defaults_of(files: &[PathBuf]) {
    let results: Vec<_> = std::thread::scope(|scope| {
        let handles: Vec<_> = files
            .iter()
            .map(|path| {
                scope.spawn(move || {
                    let hf = LoadedTokenizer::load(path).unwrap();
                    let (fast, engine) =
                        LoadedTokenizer::load_with_fast(path, Readings::Fast).unwrap();
                    let engine = engine.unwrap().map(|e| e.describe());
                    (path, hf, fast, engine)
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    for (path, hf, fast, engine) in results {
        let name = path.file_name().unwrap().to_string_lossy();
        let Ok(described) = engine else {
            panic!("{name}: the fast engine runs every real file")
        };
        described_in_words(&name, path, &described);
        assert!(
            !fast.hf_is_read(),
            "{name}: a fast load reads no HF tokenizer"
        );
        for (tok, reading) in [(&hf, "HF"), (&fast, "fast")] {
            let name = format!("{name} ({reading} reading)");
            check_defaults(path, &name, tok);
        }
        same_names(&name, path, &hf, &fast);
        assert!(!fast.hf_is_read(), "{name}: the names came without HF");
    }
}

/// A run's summary names the engine's stages in words: it ends with the
/// file's model, and carries none of Rust's debug spelling.
fn described_in_words(name: &str, path: &Path, described: &str) {
    let json = zstd::decode_all(std::fs::File::open(path).unwrap()).unwrap();
    let json: serde_json::Value = serde_json::from_slice(&json).unwrap();
    // A file may leave its model untagged; HF then tells it by its fields.
    let model = match json["model"]["type"].as_str() {
        Some(model) => model,
        None if json["model"]["merges"].is_array() => "BPE",
        None if json["model"]["max_input_chars_per_word"].is_number() => "WordPiece",
        None if json["model"]["vocab"].is_array() => "Unigram",
        None => panic!("{name}: an untagged model of no known kind"),
    };
    assert!(
        described.ends_with(model),
        "{name}: {described:?} names no {model}"
    );
    for debug in ["{", "}", "Some(", "(\"", "Sequence(", "fold:"] {
        assert!(
            !described.contains(debug),
            "{name}: {described:?} has {debug:?}"
        );
    }
}

fn check_defaults(path: &Path, name: &str, tok: &LoadedTokenizer) {
    let expected = EXPECTED
        .iter()
        .find(|e| {
            path.file_name().unwrap().to_string_lossy() == format!("{}.tokenizer.json.zst", e.file)
        })
        .unwrap_or_else(|| panic!("{name}: no expected eos; add it to EXPECTED"));
    let eos = tok
        .default_eos()
        .unwrap_or_else(|| panic!("{name}: no default eos"));
    assert_eq!((eos.token.as_str(), eos.id), expected.eos, "{name}");
    assert_eq!(
        added_token(path, &eos.token),
        Some((eos.id, true)),
        "{name}: the default eos must be a special added token"
    );
    assert_eq!(
        tok.post_processor_tokens(),
        PostProcessorTokens {
            before: expected.before.to_vec(),
            after: expected.after.to_vec(),
        },
        "{name}"
    );
    // Whatever the post-processor adds that a default run does not is
    // named in a note; nothing else is.
    let notes = tok.post_processor_notes(None, Some(eos.id));
    assert_eq!(
        notes.len(),
        usize::from(!expected.before.is_empty()),
        "{name}: {notes:?}"
    );
    for &id in expected.before {
        let bos = tok.token(id);
        assert!(
            notes[0].contains(&format!("pass --bos '{bos}' to prepend it")),
            "{name}: {notes:?}"
        );
    }
}

/// The fast reading names every token as HF's does: the vocabulary size,
/// every added token and every thousandth vocabulary entry both ways, ids
/// past the end, and what `--eos`/`--bos` values resolve to.
fn same_names(name: &str, path: &Path, hf: &LoadedTokenizer, fast: &LoadedTokenizer) {
    assert_eq!(hf.vocab_size, fast.vocab_size, "{name}: vocabulary size");
    let json = zstd::decode_all(std::fs::File::open(path).unwrap()).unwrap();
    let json: serde_json::Value = serde_json::from_slice(&json).unwrap();
    let added = json["added_tokens"].as_array().unwrap();
    let mut texts: Vec<String> = added
        .iter()
        .map(|t| t["content"].as_str().unwrap().to_owned())
        .collect();
    texts.extend(EOS_NAMES.iter().map(|&t| t.to_owned()));
    texts.extend(["a", "Ġthe", "▁the", "the", "[UNK]", "", "no such token"].map(String::from));
    let ids = (0..hf.vocab_size as u32 + 2)
        .step_by(997)
        .chain([hf.vocab_size as u32 - 1]);
    texts.extend(ids.clone().filter_map(|id| hf.id_to_token(id)));
    for text in &texts {
        assert_eq!(
            hf.token_to_id(text),
            fast.token_to_id(text),
            "{name}: {text:?}"
        );
        for value in [text.clone(), format!("token:{text}")] {
            assert_eq!(
                hf.resolve("--eos", &value),
                fast.resolve("--eos", &value),
                "{name}: {value:?}"
            );
        }
    }
    for id in ids.chain(added.iter().map(|t| t["id"].as_u64().unwrap() as u32)) {
        assert_eq!(hf.id_to_token(id), fast.id_to_token(id), "{name}: id {id}");
        assert_eq!(
            hf.resolve("--bos", &id.to_string()),
            fast.resolve("--bos", &id.to_string()),
            "{name}: {id}"
        );
    }
    let pp = hf.post_processor_tokens();
    let some = |ids: &[u32]| ids.first().copied();
    for (bos, eos) in [
        (None, None),
        (some(&pp.before), some(&pp.after)),
        (Some(0), Some(1)),
    ] {
        assert_eq!(
            hf.post_processor_notes(bos, eos),
            fast.post_processor_notes(bos, eos),
            "{name}: notes with bos {bos:?}, eos {eos:?}"
        );
    }
}

/// A Gemma-like tokenizer.json: `</s>` (id 5) is an ordinary vocabulary
/// token, `<eos>` (id 1) the special end-of-document token, and the
/// post-processor prepends `<bos>` (id 2). With `</s>` tried by name first
/// and no look at `special`, prep used to append id 5 and call it the
/// tokenizer's end-of-text token.
fn gemma_like(t: &TestDir, name: &str, with_eos: bool) -> PathBuf {
    let mut vocab = serde_json::json!({
        "<pad>": 0, "<eos>": 1, "<bos>": 2, "<unk>": 3, "hello": 4, "</s>": 5, "world": 6
    });
    let mut specials = vec!["<pad>", "<eos>", "<bos>", "<unk>"];
    if !with_eos {
        vocab.as_object_mut().unwrap().remove("<eos>");
        specials.retain(|&s| s != "<eos>");
    }
    let added: Vec<serde_json::Value> = specials
        .iter()
        .map(|&s| {
            serde_json::json!({"id": vocab[s], "content": s, "single_word": false, "lstrip": false,
                               "rstrip": false, "normalized": false, "special": true})
        })
        .collect();
    let json = serde_json::json!({
        "version": "1.0", "truncation": null, "padding": null, "added_tokens": added,
        "normalizer": null, "pre_tokenizer": {"type": "WhitespaceSplit"},
        "post_processor": {
            "type": "TemplateProcessing",
            "single": [{"SpecialToken": {"id": "<bos>", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}],
            "pair": [{"SpecialToken": {"id": "<bos>", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}},
                     {"Sequence": {"id": "B", "type_id": 1}}],
            "special_tokens": {"<bos>": {"id": "<bos>", "ids": [2], "tokens": ["<bos>"]}}
        },
        "decoder": null,
        "model": {"type": "WordLevel", "vocab": vocab, "unk_token": "<unk>"}
    });
    t.write(name, json.to_string())
}

#[test]
fn default_eos_is_special_not_a_plain_token() {
    let t = TestDir::new();
    let path = gemma_like(&t, "gemma.json", true);
    let tok = LoadedTokenizer::load(&path).unwrap();
    let eos = tok.default_eos().expect("a default eos");
    assert_eq!((eos.token.as_str(), eos.id), ("<eos>", 1));
    assert!(!eos.from_post_processor);
    assert_eq!(tok.post_processor_tokens().before, [2]);

    let input = t.write("in.jsonl", jsonl(&["hello </s> world", "world"]));
    let out = t.path("out");
    ok(&mut tokenize_with(&t, &path, &[&input], &out));
    let m = prep::Dataset::open(&out).unwrap().manifest().clone();
    assert_eq!(m.special_tokens.eos, Some(1));
    assert_eq!(m.special_tokens.bos, None);
    // The text's own "</s>" is an ordinary token (5) inside the document.
    assert_eq!(records(&out), [vec![4, 5, 6, 1], vec![6, 1]]);

    // Not quiet: the run says which token it chose and why, and that the
    // post-processor's <bos> is not added.
    let loud = t.path("loud");
    let mut cmd = t.prep();
    cmd.args(["tokenize", "--tokenizer"])
        .arg(&path)
        .arg("--input")
        .arg(&input)
        .arg("--output")
        .arg(&loud);
    let stderr = String::from_utf8(ok(&mut cmd).stderr.clone()).unwrap();
    for part in [
        r#"eos "<eos>" (id 1): the tokenizer's special end-of-document token"#,
        r#"the tokenizer's post-processor adds "<bos>" at the start of a sequence; prep does not: pass --bos '<bos>' to prepend it"#,
    ] {
        assert!(stderr.contains(part), "expected {part:?} in: {stderr}");
    }
    // With --bos <bos>, nothing is left unsaid, and each record starts with it.
    let with_bos = t.path("with-bos");
    let mut cmd = t.prep();
    cmd.args(["tokenize", "--bos", "<bos>", "--tokenizer"])
        .arg(&path)
        .arg("--input")
        .arg(&input)
        .arg("--output")
        .arg(&with_bos);
    let stderr = String::from_utf8(ok(&mut cmd).stderr.clone()).unwrap();
    assert!(!stderr.contains("post-processor"), "{stderr}");
    assert_eq!(records(&with_bos), [vec![2, 4, 5, 6, 1], vec![2, 6, 1]]);

    // Without a special end-of-document token there is no default eos: the
    // plain </s> is still not taken.
    let path = gemma_like(&t, "no-eos.json", false);
    assert_eq!(LoadedTokenizer::load(&path).unwrap().default_eos(), None);
    let out = t.path("no-eos");
    ok(&mut tokenize_with(&t, &path, &[&input], &out));
    let m = prep::Dataset::open(&out).unwrap().manifest().clone();
    assert_eq!(m.special_tokens.eos, None);
    assert!(!m.eos_appended);
}

/// An llm.c shard of uint16 tokens (header magic 20240520, version 1).
fn llmc_shard(t: &TestDir, name: &str, tokens: &[u16]) -> PathBuf {
    let mut bytes = vec![0u8; 1024];
    bytes[0..4].copy_from_slice(&20240520i32.to_le_bytes());
    bytes[4..8].copy_from_slice(&1i32.to_le_bytes());
    bytes[8..12].copy_from_slice(&(tokens.len() as i32).to_le_bytes());
    for token in tokens {
        bytes.extend_from_slice(&token.to_le_bytes());
    }
    t.write(name, bytes)
}

fn manifest_json(dir: &Path) -> serde_json::Value {
    serde_json::from_slice(&std::fs::read(dir.join("manifest.json")).unwrap()).unwrap()
}

/// `--eos 0` is id 0, not the token "0" (id 18 in DeepSeek's vocabulary),
/// in tokenize, import and pack alike; `token:0` names the digit token.
#[test]
fn numeric_eos_is_an_id_not_a_digit_token() {
    let tok = LoadedTokenizer::load(&deepseek()).unwrap();
    assert_eq!(tok.token_to_id("0"), Some(DEEPSEEK_DIGIT_ZERO));
    let vocab = Some(tok.vocab_size);
    let resolve = |value: &str| token_arg("--eos", value, Some(&tok), vocab);
    assert_eq!(resolve("0"), Ok(0));
    assert_eq!(resolve("token:0"), Ok(DEEPSEEK_DIGIT_ZERO));
    assert_eq!(resolve("<｜end▁of▁sentence｜>"), Ok(1));
    assert_eq!(resolve("token:<｜end▁of▁sentence｜>"), Ok(1));
    let err = resolve("129280").unwrap_err();
    assert_eq!(
        err.to_string(),
        r#"--eos "129280": id 129280 is not below the vocabulary size 129280"#
    );
    let err = resolve("99999999999").unwrap_err();
    assert!(err.why.contains("whole number"), "{err}");
    assert!(resolve("token:no such token")
        .unwrap_err()
        .why
        .contains("has no token"));
    // Without a tokenizer only ids resolve.
    assert_eq!(token_arg("--eos", "7", None, None), Ok(7));
    assert!(token_arg("--eos", "token:0", None, None).is_err());
    assert!(token_arg("--eos", "<s>", None, None).is_err());

    let t = TestDir::new();
    // import: llm.c shards keep no boundaries; --eos 0 splits after each 0.
    let shard = llmc_shard(&t, "in_train_000001.bin", &[5, 0, 18, 7, 0]);
    for (value, records_expected) in [
        ("0", vec![vec![5, 0], vec![18, 7, 0]]),
        ("token:0", vec![vec![5, 0, 18], vec![7, 0]]),
    ] {
        let out = t.path(&format!("import-{value}"));
        let mut cmd = t.prep();
        cmd.args(["import", "llmc", "--quiet", "--eos", value, "--tokenizer"])
            .arg(deepseek())
            .arg(&shard)
            .arg(&out);
        ok(&mut cmd);
        assert_eq!(records(&out), records_expected, "--eos {value}");
    }

    // tokenize, then pack with --pad: the same rule.
    let input = t.write("in.jsonl", jsonl(&["0 1 2", "x"]));
    for (value, id) in [("0", 0), ("token:0", DEEPSEEK_DIGIT_ZERO)] {
        let out = t.path(&format!("tokenize-{value}"));
        ok(tokenize_with(&t, &deepseek(), &[&input], &out).args(["--eos", value]));
        assert_eq!(
            manifest_json(&out)["special_tokens"]["eos"],
            id,
            "--eos {value}"
        );
        assert!(records(&out).iter().all(|r| r.last() == Some(&id)));

        let packed = t.path(&format!("packed-{value}"));
        let mut cmd = t.prep();
        cmd.arg("pack")
            .arg(&out)
            .arg(&packed)
            .args(["--seq-len", "64", "--pad", value, "--quiet"]);
        ok(&mut cmd);
        assert_eq!(
            manifest_json(&packed)["special_tokens"]["pad"],
            id,
            "--pad {value}"
        );
    }
}
