//! `prep tokenize` on bad input: every failure exits 2, names the file and the
//! place in it (`line N` of a JSONL file, `row group G, row R` of a Parquet
//! file) and what is wrong, and leaves no `manifest.json` behind; with
//! `--skip-bad` the same bad documents are counted and skipped instead.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;

use crate::common::*;
use arrow::array::{ArrayRef, Int64Array, StringArray, StructArray};
use arrow::datatypes::{DataType, Field};

/// Runs `cmd`, which must fail with exit 2; checks that stderr is a
/// `prep: error:` line holding each of `parts`, and that `out` holds no
/// manifest. Returns stderr.
fn refused(cmd: &mut Command, out: &Path, parts: &[&str]) -> String {
    let stderr = fails(cmd, 2);
    assert!(
        stderr.contains("prep: error: "),
        "no `prep: error:` in: {stderr}"
    );
    for part in parts {
        assert!(stderr.contains(part), "expected {part:?} in: {stderr}");
    }
    assert_no_manifest(out);
    stderr
}

fn assert_no_manifest(out: &Path) {
    assert!(
        !out.join("manifest.json").exists(),
        "a failed run left {}",
        out.join("manifest.json").display()
    );
}

/// The manifest of a finished dataset, as JSON.
fn manifest(out: &Path) -> serde_json::Value {
    let bytes = std::fs::read(out.join("manifest.json")).expect("a manifest");
    serde_json::from_slice(&bytes).expect("the manifest is JSON")
}

/// `prep tokenize` on one input file, into `out`.
fn tokenize_one(t: &TestDir, input: &Path, out: &Path) -> Command {
    tokenize_cmd(t, &[input], out)
}

/// Five JSONL lines, the third of which is given.
fn five_lines_with_third(third: &[u8]) -> Vec<u8> {
    let mut bytes = Vec::new();
    for (i, text) in ["one", "two"].iter().enumerate() {
        bytes.extend_from_slice(jsonl(&[&format!("{text} {i}")]).as_bytes());
    }
    bytes.extend_from_slice(third);
    bytes.push(b'\n');
    bytes.extend_from_slice(jsonl(&["four", "five"]).as_bytes());
    bytes
}

/// Deterministic, poorly compressible JSONL: `n` lines of pseudo-random words.
fn noisy_jsonl(n: usize) -> Vec<u8> {
    let mut next = xorshift(0x2545_f491_4f6c_dd1du64);
    let mut out = String::new();
    for i in 0..n {
        let mut text = format!("doc {i}:");
        for _ in 0..20 {
            text.push_str(&format!(" w{:x}", next() % 100_000));
        }
        out.push_str(&jsonl(&[&text]));
    }
    out.into_bytes()
}

fn zstd_bytes(data: &[u8]) -> Vec<u8> {
    let mut encoder = zstd::stream::write::Encoder::new(Vec::new(), 3).unwrap();
    // With the checksum, damage to literal bytes is detected too.
    encoder.include_checksum(true).unwrap();
    encoder.write_all(data).unwrap();
    encoder.finish().unwrap()
}

fn gzip_bytes(data: &[u8]) -> Vec<u8> {
    let mut encoder = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
    encoder.write_all(data).unwrap();
    encoder.finish().unwrap()
}

#[test]
fn malformed_json_on_line_3_of_5() {
    let t = TestDir::new();
    let input = t.write(
        "in.jsonl",
        five_lines_with_third(br#"{"text": "unterminated"#),
    );
    let out = t.path("out");
    refused(
        &mut tokenize_one(&t, &input, &out),
        &out,
        &["in.jsonl", "line 3", "malformed JSON", "--skip-bad"],
    );
}

/// A wrong `--text-key` is the usual cause: the error lists the fields the
/// line does have, so the right key can be read off it.
#[test]
fn missing_text_field_lists_the_fields_the_line_has() {
    let t = TestDir::new();
    let input = t.write(
        "in.jsonl",
        five_lines_with_third(br#"{"id": 3, "body": "no text here", "meta": {"lang": "en"}}"#),
    );
    let out = t.path("out");
    refused(
        &mut tokenize_one(&t, &input, &out),
        &out,
        &[
            "in.jsonl",
            "line 3",
            r#"no field "text"; the document has fields "id", "body", "meta""#,
        ],
    );
    // Nested: the fields of the object where the key was not found.
    refused(
        tokenize_one(&t, &input, &out).args(["--text-key", "meta.body"]),
        &out,
        &["in.jsonl", "line 1", r#"no field "meta.body""#],
    );
}

#[test]
fn text_field_that_is_a_number() {
    let t = TestDir::new();
    let input = t.write("in.jsonl", five_lines_with_third(br#"{"text": 42}"#));
    let out = t.path("out");
    refused(
        &mut tokenize_one(&t, &input, &out),
        &out,
        &[
            "in.jsonl",
            "line 3",
            r#"field "text" is a number, expected a string"#,
        ],
    );
}

#[test]
fn text_field_that_is_null() {
    let t = TestDir::new();
    let input = t.write("in.jsonl", five_lines_with_third(br#"{"text": null}"#));
    let out = t.path("out");
    refused(
        &mut tokenize_one(&t, &input, &out),
        &out,
        &["in.jsonl", "line 3", r#"field "text" is null"#],
    );
}

#[test]
fn invalid_utf8_in_a_line() {
    let t = TestDir::new();
    let input = t.write(
        "in.jsonl",
        five_lines_with_third(b"{\"text\": \"caf\xe9 au lait\"}"),
    );
    let out = t.path("out");
    refused(
        &mut tokenize_one(&t, &input, &out),
        &out,
        &["in.jsonl", "line 3", "invalid UTF-8"],
    );
}

#[test]
fn parquet_text_column_of_another_type() {
    let t = TestDir::new();
    let input = t.path("ints.parquet");
    let ints: ArrayRef = Arc::new(Int64Array::from_iter_values(0..5));
    write_parquet(&input, vec![("text", ints)], 1000);
    let out = t.path("out");
    refused(
        &mut tokenize_one(&t, &input, &out),
        &out,
        &[
            "ints.parquet",
            r#"column "text" has type Int64"#,
            "expected a string column",
        ],
    );
}

/// As for JSONL, a wrong `--text-key` on Parquet names the columns there
/// are, at the level where the lookup failed.
#[test]
fn parquet_without_the_column_lists_the_columns_it_has() {
    let t = TestDir::new();
    let input = t.path("body.parquet");
    let body: ArrayRef = Arc::new(StringArray::from_iter_values(["a", "b"]));
    write_parquet(&input, vec![("body", body)], 1000);
    let out = t.path("out");
    refused(
        &mut tokenize_one(&t, &input, &out),
        &out,
        &[
            "body.parquet",
            r#"no column "text""#,
            "available columns: body",
        ],
    );
    let nested = t.path("nested.parquet");
    let inner = StructArray::from(vec![
        (
            Arc::new(Field::new("lang", DataType::Utf8, false)),
            Arc::new(StringArray::from_iter_values(["en", "de"])) as ArrayRef,
        ),
        (
            Arc::new(Field::new("body", DataType::Utf8, false)),
            Arc::new(StringArray::from_iter_values(["a", "b"])) as ArrayRef,
        ),
    ]);
    write_parquet(&nested, vec![("meta", Arc::new(inner) as ArrayRef)], 1000);
    refused(
        tokenize_one(&t, &nested, &out).args(["--text-key", "meta.text"]),
        &out,
        &[
            "nested.parquet",
            r#"no column "meta.text""#,
            "available columns: meta.lang, meta.body",
        ],
    );
}

#[test]
fn parquet_null_text_names_row_group_and_row() {
    let t = TestDir::new();
    let input = t.path("nulls.parquet");
    // Row groups of 3: index 4 is row group 1, row 1.
    let texts: Vec<Option<&str>> = vec![
        Some("a0"),
        Some("a1"),
        Some("a2"),
        Some("b0"),
        None,
        Some("b2"),
        Some("c0"),
    ];
    let column: ArrayRef = Arc::new(StringArray::from(texts.clone()));
    write_parquet(&input, vec![("text", column)], 3);
    let out = t.path("out");
    refused(
        &mut tokenize_one(&t, &input, &out),
        &out,
        &[
            "nulls.parquet",
            "row group 1, row 1",
            r#"field "text" is null"#,
        ],
    );

    // With --skip-bad the null is one counted skip.
    let skipped = t.path("skipped");
    ok(tokenize_one(&t, &input, &skipped).arg("--skip-bad"));
    let docs = &manifest(&skipped)["provenance"]["documents"];
    assert_eq!(docs["skipped"], 1, "{docs}");
    assert_eq!(docs["written"], 6, "{docs}");
    assert_eq!(docs["read"], 7, "{docs}");
    let good: Vec<&str> = texts.iter().flatten().copied().collect();
    let reference_input = t.write("good.jsonl", jsonl(&good));
    let reference = t.path("reference");
    ok(&mut tokenize_one(&t, &reference_input, &reference));
    assert_eq!(records(&skipped), records(&reference));
}

#[test]
fn zst_with_bytes_flipped_in_the_middle() {
    let t = TestDir::new();
    let mut bytes = zstd_bytes(&noisy_jsonl(2000));
    let middle = bytes.len() / 2;
    for b in &mut bytes[middle..middle + 16] {
        *b ^= 0xa5;
    }
    let input = t.write("corrupt.jsonl.zst", &bytes);
    let out = t.path("out");
    let stderr = refused(
        &mut tokenize_one(&t, &input, &out),
        &out,
        &["corrupt.jsonl.zst", "line "],
    );
    assert!(stderr.contains("reading failed at line"), "{stderr}");
}

#[test]
fn truncated_zst() {
    let t = TestDir::new();
    let bytes = zstd_bytes(&noisy_jsonl(2000));
    let input = t.write("cut.jsonl.zst", &bytes[..bytes.len() * 2 / 3]);
    let out = t.path("out");
    refused(
        &mut tokenize_one(&t, &input, &out),
        &out,
        &["cut.jsonl.zst", "reading failed at line"],
    );
}

#[test]
fn truncated_gz() {
    let t = TestDir::new();
    let bytes = gzip_bytes(&noisy_jsonl(2000));
    let input = t.write("cut.jsonl.gz", &bytes[..bytes.len() * 2 / 3]);
    let out = t.path("out");
    refused(
        &mut tokenize_one(&t, &input, &out),
        &out,
        &["cut.jsonl.gz", "reading failed at line"],
    );
    // A damaged file is not a bad document: --skip-bad does not hide it.
    refused(
        tokenize_one(&t, &input, &out).arg("--skip-bad"),
        &out,
        &["cut.jsonl.gz", "reading failed at line"],
    );
}

#[test]
fn missing_input_file() {
    let t = TestDir::new();
    let input = t.path("nowhere.jsonl");
    let out = t.path("out");
    refused(
        &mut tokenize_one(&t, &input, &out),
        &out,
        &["nowhere.jsonl", "No such file or directory"],
    );
}

#[test]
fn glob_that_matches_nothing() {
    let t = TestDir::new();
    t.write("data/notes.txt", "not an input");
    let pattern = t.path("data/*.jsonl");
    let out = t.path("out");
    refused(
        &mut tokenize_one(&t, &pattern, &out),
        &out,
        &["data/*.jsonl", "matched no file"],
    );
}

#[test]
fn tokenizer_file_that_does_not_exist() {
    let t = TestDir::new();
    let input = t.write("in.jsonl", jsonl(&["hello"]));
    let tokenizer = t.path("absent.tokenizer.json");
    let out = t.path("out");
    refused(
        &mut tokenize_with(&t, &tokenizer, &[&input], &out),
        &out,
        &["tokenizer", "absent.tokenizer.json", "No such file"],
    );
}

#[test]
fn tokenizer_file_that_is_not_a_tokenizer_names_what_it_lacks() {
    let t = TestDir::new();
    let input = t.write("in.jsonl", jsonl(&["hello"]));
    let tokenizer = t.write("fake.tokenizer.json", r#"{"hello": "world"}"#);
    let out = t.path("out");
    refused(
        &mut tokenize_with(&t, &tokenizer, &[&input], &out),
        &out,
        &[
            "tokenizer",
            "fake.tokenizer.json",
            "not a HuggingFace tokenizer.json",
            r#"no "model" field (its fields: "hello")"#,
        ],
    );
}

/// Valid JSON of the wrong shape is not a tokenizer.json, and the message
/// says what is wrong with it; it is no JSON syntax error. A file that is
/// not JSON at all says that, with the line and column.
#[test]
fn tokenizer_json_of_the_wrong_shape_is_not_a_syntax_error() {
    let t = TestDir::new();
    let input = t.write("in.jsonl", jsonl(&["hello"]));
    let out = t.path("out");
    let cases: [(&str, &str, &[&str]); 8] = [
        (
            "array.json",
            "[]",
            &["the file holds an array, not a JSON object"],
        ),
        (
            "number.json",
            r#"{"model": 3}"#,
            &[r#""model" is a number, not an object"#],
        ),
        (
            "list.json",
            r#"{"model": [1, 2]}"#,
            &[r#""model" is an array, not an object"#],
        ),
        // A model type nobody reads is named, with the ones prep reads
        // (not serde's "untagged enum ModelUntagged").
        (
            "foo.json",
            r#"{"model": {"type": "Foo", "vocab": {}}}"#,
            &[
                r#"model type "Foo" is unknown"#,
                "BPE, WordPiece, WordLevel, Unigram",
            ],
        ),
        (
            "typeless.json",
            r#"{"model": {"vocabulary": {}}}"#,
            &[r#"the model has no "type""#, "BPE, WordPiece"],
        ),
        (
            "typed.json",
            r#"{"model": {"type": 7}}"#,
            &[r#"the model's "type" is a number, not a string"#],
        ),
        // The shape is right as far as prep looks: HF tokenizers' own reason.
        (
            "wordlevel.json",
            r#"{"model": {"type": "WordLevel", "vocab": 3}}"#,
            &[],
        ),
        (
            "syntax.json",
            "{\"model\": {\n\"type\": ,}}",
            &["not valid JSON", "line 2 column"],
        ),
    ];
    for (name, json, parts) in cases {
        let tokenizer = t.write(name, json);
        let stderr = refused(
            &mut tokenize_with(&t, &tokenizer, &[&input], &out),
            &out,
            &[&["tokenizer", name][..], parts].concat(),
        );
        let shape = name != "syntax.json";
        assert_eq!(
            stderr.contains("not a HuggingFace tokenizer.json"),
            shape,
            "{name}: {stderr}"
        );
        assert_eq!(
            stderr.contains("not valid JSON"),
            !shape,
            "{name}: {stderr}"
        );
        assert!(!stderr.contains("untagged"), "{name}: {stderr}");
    }
}

#[test]
fn unknown_eos_token() {
    let t = TestDir::new();
    let input = t.write("in.jsonl", jsonl(&["hello"]));
    let out = t.path("out");
    refused(
        tokenize_one(&t, &input, &out).args(["--eos", "<|no-such-token|>"]),
        &out,
        &[
            "--eos",
            r#""<|no-such-token|>""#,
            "neither an id nor a token",
        ],
    );
}

#[test]
fn unknown_bos_token() {
    let t = TestDir::new();
    let input = t.write("in.jsonl", jsonl(&["hello"]));
    let out = t.path("out");
    refused(
        tokenize_one(&t, &input, &out).args(["--bos", "<s>"]),
        &out,
        &["--bos", r#""<s>""#, "neither an id nor a token"],
    );
    // An id past the vocabulary is unknown too.
    refused(
        tokenize_one(&t, &input, &out).args(["--bos", "50257"]),
        &out,
        &[
            "--bos",
            r#""50257""#,
            "id 50257 is not below the vocabulary size 50257",
        ],
    );
    // A negative number is an id too, and no id is negative.
    refused(
        tokenize_one(&t, &input, &out).arg("--bos=-1"),
        &out,
        &["--bos", r#""-1""#, "an id is a whole number"],
    );
}

#[test]
fn invalid_shard_size() {
    let t = TestDir::new();
    let input = t.write("in.jsonl", jsonl(&["hello"]));
    let out = t.path("out");
    // A usage error, reported by the argument parser before any work.
    let stderr = fails(
        tokenize_one(&t, &input, &out).args(["--shard-size", "12XB"]),
        2,
    );
    for part in ["error:", "--shard-size", "12XB", "unknown unit"] {
        assert!(stderr.contains(part), "expected {part:?} in: {stderr}");
    }
    assert_no_manifest(&out);
    assert!(!out.exists(), "a usage error created {}", out.display());
}

#[test]
fn output_directory_with_foreign_files_is_refused() {
    let t = TestDir::new();
    let input = t.write("in.jsonl", jsonl(&["hello"]));
    let foreign = t.write("out/thesis.tex", "years of work");
    let out = t.path("out");
    refused(
        &mut tokenize_one(&t, &input, &out),
        &out,
        &["output directory", "out", "is not empty"],
    );
    assert_eq!(std::fs::read(&foreign).unwrap(), b"years of work");
    let names: Vec<_> = std::fs::read_dir(&out)
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(
        names,
        ["thesis.tex"],
        "the refused run wrote into the directory"
    );
}

/// A JSONL file mixing good lines with one of each kind of bad line.
/// Returns the file and the good texts in order.
fn mixed_input(t: &TestDir) -> (PathBuf, Vec<&'static str>) {
    let lines: [&[u8]; 10] = [
        br#"{"text": "alpha"}"#,
        br#"{"text": "unterminated"#,
        br#"{"text": "beta beta"}"#,
        br#"{"body": "no text"}"#,
        br#"{"text": 7}"#,
        br#"{"text": null}"#,
        b"{\"text\": \"bad \xff byte\"}",
        br#"{"text": "gamma, the third"}"#,
        br#"[1, 2]"#,
        br#"{"text": "delta"}"#,
    ];
    let mut bytes = Vec::new();
    for line in lines {
        bytes.extend_from_slice(line);
        bytes.push(b'\n');
    }
    let good = vec!["alpha", "beta beta", "gamma, the third", "delta"];
    (t.write("mixed.jsonl", bytes), good)
}

#[test]
fn without_skip_bad_the_first_bad_line_stops_the_run() {
    let t = TestDir::new();
    let (input, _) = mixed_input(&t);
    let out = t.path("out");
    refused(
        &mut tokenize_one(&t, &input, &out),
        &out,
        &["mixed.jsonl", "line 2", "malformed JSON"],
    );
}

#[test]
fn skip_bad_counts_bad_lines_and_keeps_the_good_ones() {
    let t = TestDir::new();
    let (input, good) = mixed_input(&t);
    let out = t.path("out");
    let mut cmd = t.prep();
    cmd.arg("tokenize")
        .arg("--tokenizer")
        .arg(gpt2())
        .arg("--input")
        .arg(&input)
        .arg("--output")
        .arg(&out)
        .arg("--skip-bad");
    let stderr = String::from_utf8_lossy(&ok(&mut cmd).stderr).into_owned();
    // Each skip is described with its file and line.
    for line in ["line 2", "line 4", "line 5", "line 6", "line 7", "line 9"] {
        assert!(
            stderr.contains(&format!("mixed.jsonl: {line}:")),
            "no warning for {line}: {stderr}"
        );
    }

    let docs = &manifest(&out)["provenance"]["documents"];
    assert_eq!(docs["skipped"], 6, "{docs}");
    assert_eq!(docs["written"], good.len(), "{docs}");
    assert_eq!(docs["read"], 10, "{docs}");

    let reference_input = t.write("good.jsonl", jsonl(&good));
    let reference = t.path("reference");
    ok(&mut tokenize_one(&t, &reference_input, &reference));
    assert_eq!(records(&out), records(&reference));
}
