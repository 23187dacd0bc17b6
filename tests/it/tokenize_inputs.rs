//! `prep tokenize` on its inputs: every format and compression gives the same
//! records, nested text keys, the ways of naming inputs, edge cases of
//! documents and vocabularies, the flags' help, and where shards are cut.

use std::io::Write;
use std::path::Path;
use std::sync::Arc;

use crate::common::*;
use arrow::array::{ArrayRef, Int64Array, LargeStringArray, StringArray, StructArray};
use arrow::datatypes::{DataType, Field};
use prep::{Dataset, Dtype};

/// GPT-2's `<|endoftext|>`.
const GPT2_EOS: u32 = 50256;

/// Texts that exercise escapes, non-ASCII, whitespace and length.
fn sample_texts() -> Vec<String> {
    let mut texts: Vec<String> = [
        "Hello, world!",
        "",
        "  leading and trailing spaces  ",
        "line one\nline two\r\nline three",
        "tabs\tand \"quotes\" and \\backslashes\\",
        "ünïcødé: naïve café, Straße, ÆØÅ",
        "日本語のテキストと中文文本",
        "emoji 😀🎉 and a ZWJ family 👨‍👩‍👧",
        "control \u{1} \u{1f} chars",
        "numbers 3.14159 and 1e-10 and -42",
        "<|endoftext|> is only text here",
        "{\"looks\": \"like json\"}",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    for i in 0..11 {
        texts.push(format!(
            "generated document {i}: {}",
            "lorem ipsum ".repeat(i * 7)
        ));
    }
    texts
}

fn refs(texts: &[String]) -> Vec<&str> {
    texts.iter().map(String::as_str).collect()
}

fn gzip_bytes(data: &[u8]) -> Vec<u8> {
    let mut encoder = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
    encoder.write_all(data).unwrap();
    encoder.finish().unwrap()
}

fn zstd_bytes(data: &[u8]) -> Vec<u8> {
    zstd::encode_all(data, 3).unwrap()
}

/// Row groups in a Parquet file.
fn row_groups(path: &Path) -> usize {
    let file = std::fs::File::open(path).unwrap();
    let reader = parquet::file::serialized_reader::SerializedFileReader::new(file).unwrap();
    parquet::file::reader::FileReader::metadata(&reader).num_row_groups()
}

fn open(out: &Path) -> Dataset {
    Dataset::open(out).unwrap_or_else(|e| panic!("{}: {e}", out.display()))
}

/// The `.bin` and the `.idx` bytes of every shard, in manifest order.
fn shard_files(out: &Path) -> Vec<(Vec<u8>, Vec<u8>)> {
    open(out)
        .manifest()
        .shards
        .iter()
        .map(|s| {
            (
                std::fs::read(out.join(&s.bin)).unwrap(),
                std::fs::read(out.join(&s.idx)).unwrap(),
            )
        })
        .collect()
}

#[test]
fn jsonl_gz_zst_and_parquet_give_identical_records() {
    let t = TestDir::new();
    let texts = sample_texts();
    let lines = jsonl(&refs(&texts));
    let mut inputs = vec![
        t.write("plain.jsonl", &lines),
        t.write("gzip.jsonl.gz", gzip_bytes(lines.as_bytes())),
        t.write("zstd.jsonl.zst", zstd_bytes(lines.as_bytes())),
    ];
    let utf8 = t.path("utf8.parquet");
    let column: ArrayRef = Arc::new(StringArray::from_iter_values(&texts));
    let ids: ArrayRef = Arc::new(Int64Array::from_iter_values(0..texts.len() as i64));
    write_parquet(&utf8, vec![("id", ids.clone()), ("text", column)], 4);
    let large = t.path("large.parquet");
    let column: ArrayRef = Arc::new(LargeStringArray::from_iter_values(&texts));
    write_parquet(&large, vec![("text", column), ("id", ids)], 5);
    assert!(row_groups(&utf8) > 1 && row_groups(&large) > 1);
    inputs.extend([utf8, large]);

    let reference = t.path("ref");
    ok(&mut tokenize_cmd(&t, &[&inputs[0]], &reference));
    let expected = records(&reference);
    assert_eq!(expected.len(), texts.len());
    let expected_files = shard_files(&reference);
    for input in &inputs[1..] {
        let name = input.file_name().unwrap().to_string_lossy().into_owned();
        let out = t.path(&format!("out-{name}"));
        ok(&mut tokenize_cmd(&t, &[input], &out));
        assert_eq!(records(&out), expected, "{name}");
        assert!(
            shard_files(&out) == expected_files,
            "{name}: shard bytes differ from plain JSONL's"
        );
    }
}

/// A `.json` file that is one JSON array of rows (as Alpaca's and
/// LLaMA-Factory's files are, and as `datasets` reads them), pretty-printed
/// or on one line, plain or compressed, gives the same records as the JSON
/// Lines of the same rows; a partitioned run reads an array file whole in
/// one part, and its parts merged are the one-machine dataset.
#[test]
fn a_json_array_file_gives_the_records_of_its_json_lines() {
    let t = TestDir::new();
    let texts = sample_texts();
    let rows: Vec<serde_json::Value> = texts
        .iter()
        .enumerate()
        .map(|(i, text)| serde_json::json!({"id": i, "text": text, "meta": {"tags": ["[", "]"]}}))
        .collect();
    let array = serde_json::Value::Array(rows);
    let pretty = serde_json::to_string_pretty(&array).unwrap();
    let compact = serde_json::to_string(&array).unwrap();
    let reference = t.path("ref");
    let lines = t.write("rows.jsonl", jsonl(&refs(&texts)));
    ok(&mut tokenize_cmd(&t, &[&lines], &reference));
    let expected_files = shard_files(&reference);
    let inputs = [
        t.write("pretty.json", &pretty),
        t.write("compact.json", &compact),
        t.write("pretty.json.gz", gzip_bytes(pretty.as_bytes())),
        t.write("compact.JSON.zst", zstd_bytes(compact.as_bytes())),
    ];
    for input in &inputs {
        let name = input.file_name().unwrap().to_string_lossy().into_owned();
        let out = t.path(&format!("out-{name}"));
        ok(&mut tokenize_cmd(&t, &[input], &out));
        assert!(
            shard_files(&out) == expected_files,
            "{name}: shard bytes differ from the JSON Lines'"
        );
    }
    // Three parts over an array file and the JSON Lines after it: the
    // array goes whole to the part owning its first byte.
    let both = [&inputs[0], &lines];
    let whole = t.path("whole");
    ok(tokenize_cmd(&t, &both, &whole).args(["--shard-size", "200B"]));
    let mut parts = Vec::new();
    for i in 0..3 {
        let part = t.path(&format!("part{i}"));
        ok(tokenize_cmd(&t, &both, &part).args([
            "--shard-size",
            "200B",
            "--part",
            &format!("{i}/3"),
        ]));
        parts.push(part);
    }
    let merged = t.path("merged");
    ok(t.prep().arg("merge").args(&parts).arg(&merged).arg("-q"));
    assert_eq!(records(&merged), records(&whole));
    assert_eq!(records(&whole).len(), 2 * texts.len());
}

/// A UTF-8 byte-order mark before the first line (Notepad and other
/// Windows tools write one) is skipped, as Python's `utf-8-sig` and most
/// JSON readers skip it, plain or compressed: the records equal those of
/// the file without it. A BOM-like sequence anywhere else is text.
#[test]
fn utf8_bom_at_the_start_of_a_jsonl_file_is_skipped() {
    let t = TestDir::new();
    let texts = ["\u{feff}inner marks are text", "second"];
    let lines = jsonl(&texts);
    let with_bom = [b"\xEF\xBB\xBF".as_slice(), lines.as_bytes()].concat();
    let reference = t.path("ref");
    ok(&mut tokenize_cmd(
        &t,
        &[t.write("plain.jsonl", &lines)],
        &reference,
    ));
    let expected = records(&reference);
    assert_eq!(expected.len(), 2);
    for (name, bytes) in [
        ("bom.jsonl", with_bom.clone()),
        ("bom.jsonl.gz", gzip_bytes(&with_bom)),
        ("bom.jsonl.zst", zstd_bytes(&with_bom)),
    ] {
        let out = t.path(&format!("out-{name}"));
        ok(&mut tokenize_cmd(&t, &[t.write(name, bytes)], &out));
        assert_eq!(records(&out), expected, "{name}");
    }
    // A BOM alone on the first line is a blank line, not a document.
    let blank = t.write(
        "blank.jsonl",
        [b"\xEF\xBB\xBF\n".as_slice(), lines.as_bytes()].concat(),
    );
    let out = t.path("out-blank");
    ok(&mut tokenize_cmd(&t, &[blank], &out));
    assert_eq!(records(&out), expected);
}

#[test]
fn nested_text_key_in_jsonl_and_in_a_parquet_struct_column() {
    let t = TestDir::new();
    let bodies = sample_texts();
    let reference = t.path("ref");
    let plain = t.write("plain.jsonl", jsonl(&refs(&bodies)));
    ok(&mut tokenize_cmd(&t, &[&plain], &reference));
    let expected = records(&reference);

    // A top-level "text" is there to be ignored.
    let nested: String = bodies
        .iter()
        .enumerate()
        .map(|(i, body)| {
            serde_json::json!({"text": "decoy", "meta": {"n": i, "body": body}}).to_string() + "\n"
        })
        .collect();
    let json_input = t.write("nested.jsonl", nested);
    let json_out = t.path("json");
    ok(tokenize_cmd(&t, &[&json_input], &json_out).args(["--text-key", "meta.body"]));
    assert_eq!(records(&json_out), expected);

    let parquet_input = t.path("nested.parquet");
    let n = bodies.len() as i64;
    let meta = StructArray::from(vec![
        (
            Arc::new(Field::new("n", DataType::Int64, false)),
            Arc::new(Int64Array::from_iter_values(0..n)) as ArrayRef,
        ),
        (
            Arc::new(Field::new("body", DataType::Utf8, false)),
            Arc::new(StringArray::from_iter_values(&bodies)) as ArrayRef,
        ),
    ]);
    let decoy: ArrayRef = Arc::new(StringArray::from_iter_values(
        bodies.iter().map(|_| "decoy"),
    ));
    write_parquet(
        &parquet_input,
        vec![("text", decoy), ("meta", Arc::new(meta))],
        6,
    );
    let parquet_out = t.path("parquet");
    ok(tokenize_cmd(&t, &[&parquet_input], &parquet_out).args(["--text-key", "meta.body"]));
    assert_eq!(records(&parquet_out), expected);
}

#[test]
fn directory_glob_and_shuffled_files_give_identical_shards_in_sorted_order() {
    let t = TestDir::new();
    let texts = |tag: &str| -> Vec<String> {
        (0..5)
            .map(|i| format!("file {tag}, document {i}: {}", "words ".repeat(i + 1)))
            .collect()
    };
    let (a, b, c, d) = (texts("a"), texts("b"), texts("c"), texts("d"));
    let fa = t.write("data/a.jsonl", jsonl(&refs(&a)));
    let fb = t.write("data/b.jsonl.zst", zstd_bytes(jsonl(&refs(&b)).as_bytes()));
    let fc = t.path("data/c.parquet");
    write_parquet(
        &fc,
        vec![(
            "text",
            Arc::new(StringArray::from_iter_values(&c)) as ArrayRef,
        )],
        2,
    );
    let fd = t.write("data/d.jsonl.gz", gzip_bytes(jsonl(&refs(&d)).as_bytes()));
    // Neither a directory walk nor `*` picks up a hidden file; were it read,
    // the run would fail.
    t.write("data/.hidden.jsonl", "not json\n");

    let by_dir = t.path("by-dir");
    ok(&mut tokenize_cmd(&t, &[&t.path("data")], &by_dir));
    let by_glob = t.path("by-glob");
    ok(&mut tokenize_cmd(&t, &[&t.path("data/*")], &by_glob));
    let by_files = t.path("by-files");
    ok(&mut tokenize_cmd(&t, &[&fd, &fb, &fa, &fc], &by_files));

    let expected = shard_files(&by_dir);
    assert!(!expected.is_empty());
    assert!(
        shard_files(&by_glob) == expected,
        "glob differs from directory"
    );
    assert!(
        shard_files(&by_files) == expected,
        "shuffled files differ from directory"
    );

    // The order is that of the sorted paths: a, b, c, d.
    let all: Vec<String> = [a, b, c, d].concat();
    let reference = t.path("ref");
    ok(&mut tokenize_cmd(
        &t,
        &[&t.write("all.jsonl", jsonl(&refs(&all)))],
        &reference,
    ));
    assert_eq!(records(&by_files), records(&reference));
    let listed: Vec<String> = open(&by_files)
        .manifest()
        .provenance
        .inputs
        .iter()
        .map(|i| i.path.clone())
        .collect();
    let sorted: Vec<String> = [&fa, &fb, &fc, &fd]
        .iter()
        .map(|p| p.display().to_string())
        .collect();
    assert_eq!(listed, sorted);
}

#[test]
fn an_empty_input_file_gives_an_empty_dataset() {
    let t = TestDir::new();
    for input in [
        t.write("empty.jsonl", ""),
        t.write("empty.jsonl.zst", zstd_bytes(b"")),
    ] {
        let out = t.path(&format!(
            "out-{}",
            input.file_name().unwrap().to_string_lossy()
        ));
        // Exit 0 (a part of a partitioned run may have nothing to read),
        // but said out loud, even with --quiet.
        let run = ok(&mut tokenize_cmd(&t, &[&input], &out));
        let stderr = String::from_utf8_lossy(&run.stderr);
        assert_eq!(
            stderr.trim_end(),
            format!(
                "prep: warning: the inputs hold no documents, so {} is an empty dataset \
                 (0 records); check that --input names the files meant and that they are not empty",
                out.display()
            )
        );
        let ds = open(&out);
        assert_eq!(ds.len(), 0);
        assert_eq!(ds.n_tokens(), 0);
        assert!(ds.is_empty());
        assert_eq!(ds.records().count(), 0);
        let m = ds.manifest();
        assert_eq!((m.n_records, m.n_tokens), (0, 0));
        assert!(m.shards.is_empty(), "{:?}", m.shards);
        assert_eq!(m.provenance.documents.read, 0);
    }
}

#[test]
fn a_run_that_reads_documents_gives_no_empty_input_warning() {
    let t = TestDir::new();
    let input = t.write("in.jsonl", jsonl(&["one", "two"]));
    let run = ok(&mut tokenize_cmd(&t, &[&input], &t.path("out")));
    assert!(
        run.stderr.is_empty(),
        "{}",
        String::from_utf8_lossy(&run.stderr)
    );
}

/// A string column stored with an Arrow dictionary type (pandas' category,
/// or `pa.array(...).dictionary_encode()`), its keys of any width and its
/// values of any string layout, reads as the plain column does; nulls in
/// it are null documents.
#[test]
fn a_dictionary_string_column_in_parquet_gives_the_plain_columns_records() {
    use arrow::array::{DictionaryArray, StringViewArray};
    use arrow::datatypes::{Int32Type, Int8Type, UInt16Type};
    let t = TestDir::new();
    // Repeated texts, as a dictionary column holds them.
    let texts: Vec<String> = sample_texts().into_iter().cycle().take(60).collect();
    let plain = t.path("plain.parquet");
    write_parquet(
        &plain,
        vec![("text", Arc::new(StringArray::from_iter_values(&texts)))],
        16,
    );
    let reference = t.path("ref");
    ok(&mut tokenize_cmd(&t, &[&plain], &reference));
    let expected = records(&reference);
    assert_eq!(expected.len(), texts.len());

    let strs: Vec<&str> = refs(&texts);
    let int32: DictionaryArray<Int32Type> = strs.iter().copied().collect();
    let int8: DictionaryArray<Int8Type> = strs.iter().copied().collect();
    let keys = int8.keys().clone();
    let large = DictionaryArray::<Int8Type>::new(
        keys.clone(),
        Arc::new(LargeStringArray::from_iter_values(
            int8.values()
                .as_any()
                .downcast_ref::<StringArray>()
                .unwrap()
                .iter()
                .flatten(),
        )),
    );
    let view = DictionaryArray::<UInt16Type>::new(
        arrow::array::UInt16Array::from_iter_values(keys.values().iter().map(|&k| k as u16)),
        Arc::new(StringViewArray::from_iter_values(
            int8.values()
                .as_any()
                .downcast_ref::<StringArray>()
                .unwrap()
                .iter()
                .flatten(),
        )),
    );
    let columns: [(&str, ArrayRef); 4] = [
        ("int32", Arc::new(int32)),
        ("int8", Arc::new(int8)),
        ("large", Arc::new(large)),
        ("view", Arc::new(view)),
    ];
    for (name, column) in columns {
        assert!(
            matches!(column.data_type(), DataType::Dictionary(..)),
            "{name}"
        );
        let input = t.path(&format!("{name}.parquet"));
        write_parquet(&input, vec![("text", column)], 16);
        // Read back as a dictionary, not the plain strings Parquet stores.
        let read = parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder::try_new(
            std::fs::File::open(&input).unwrap(),
        )
        .unwrap();
        assert!(
            matches!(read.schema().field(0).data_type(), DataType::Dictionary(..)),
            "{name}: {}",
            read.schema()
        );
        let out = t.path(&format!("out-{name}"));
        ok(&mut tokenize_cmd(&t, &[&input], &out));
        assert_eq!(records(&out), expected, "{name}");
    }

    // A null in a dictionary column is a null document, named as in a plain one.
    let with_null: DictionaryArray<Int32Type> = [Some("a"), None, Some("b")].into_iter().collect();
    let input = t.path("null.parquet");
    write_parquet(&input, vec![("text", Arc::new(with_null))], 16);
    let err = fails(&mut tokenize_cmd(&t, &[&input], &t.path("out-null")), 2);
    assert!(
        err.contains("row group 0, row 1") && err.contains(r#"field "text" is null"#),
        "{err}"
    );
}

#[test]
fn an_empty_document_holds_only_the_special_tokens() {
    let t = TestDir::new();
    let input = t.write("in.jsonl", jsonl(&["", "hi there"]));

    let with_eos = t.path("eos");
    ok(&mut tokenize_cmd(&t, &[&input], &with_eos));
    let recs = records(&with_eos);
    assert_eq!(recs[0], [GPT2_EOS]);
    assert_eq!(recs[1].last(), Some(&GPT2_EOS));
    assert_eq!(open(&with_eos).manifest().provenance.documents.empty, 1);
    let hi: Vec<u32> = recs[1][..recs[1].len() - 1].to_vec();
    assert!(!hi.is_empty());

    let no_eos = t.path("no-eos");
    ok(tokenize_cmd(&t, &[&input], &no_eos).arg("--no-eos"));
    assert_eq!(records(&no_eos), [vec![], hi.clone()]);
    let m = open(&no_eos).manifest().clone();
    assert!(!m.eos_appended);
    assert_eq!(m.special_tokens.eos, None);
    assert_eq!(m.shards.len(), 1);

    let bos_by_id = t.path("bos");
    ok(tokenize_cmd(&t, &[&input], &bos_by_id).args(["--bos", "50256"]));
    let mut bos_hi = vec![GPT2_EOS];
    bos_hi.extend(&hi);
    bos_hi.push(GPT2_EOS);
    assert_eq!(
        records(&bos_by_id),
        [vec![GPT2_EOS, GPT2_EOS], bos_hi.clone()]
    );
    let m = open(&bos_by_id).manifest().clone();
    assert!(m.bos_prepended && m.eos_appended);
    assert_eq!(m.special_tokens.bos, Some(GPT2_EOS));

    let bos_no_eos = t.path("bos-no-eos");
    ok(tokenize_cmd(&t, &[&input], &bos_no_eos).args(["--bos", "<|endoftext|>", "--no-eos"]));
    assert_eq!(
        records(&bos_no_eos),
        [vec![GPT2_EOS], bos_hi[..bos_hi.len() - 1].to_vec()]
    );
}

#[test]
fn dedup_drops_repeats_and_keeps_first_occurrences_in_order() {
    let t = TestDir::new();
    let input = t.write(
        "in.jsonl",
        jsonl(&[
            "first", "second", "first", "third", "second", "first", "fourth",
        ]),
    );
    let out = t.path("out");
    ok(tokenize_cmd(&t, &[&input], &out).arg("--dedup"));
    let reference = t.path("ref");
    let unique = t.write(
        "unique.jsonl",
        jsonl(&["first", "second", "third", "fourth"]),
    );
    ok(&mut tokenize_cmd(&t, &[&unique], &reference));
    assert_eq!(records(&out), records(&reference));
    let docs = open(&out).manifest().provenance.documents;
    assert_eq!(docs.deduplicated, 3);
    assert_eq!(docs.written, 4);
    assert_eq!(docs.read, 7);
    assert_eq!(docs.skipped, 0);

    // Without --dedup every repeat is a record.
    let all = t.path("all");
    ok(&mut tokenize_cmd(&t, &[&input], &all));
    assert_eq!(records(&all).len(), 7);
    assert_eq!(open(&all).manifest().provenance.documents.deduplicated, 0);
}

#[test]
fn eos_defaults_to_the_end_of_text_token_when_there_is_one() {
    let t = TestDir::new();
    let input = t.write("in.jsonl", jsonl(&["a b a", "b"]));

    let gpt2_out = t.path("gpt2");
    ok(&mut tokenize_cmd(&t, &[&input], &gpt2_out));
    let m = open(&gpt2_out).manifest().clone();
    assert!(m.eos_appended);
    assert_eq!(m.special_tokens.eos, Some(GPT2_EOS));
    assert!(records(&gpt2_out)
        .iter()
        .all(|r| r.last() == Some(&GPT2_EOS)));

    let words = word_level(&t, "words.json", &[("[UNK]", 0), ("a", 1), ("b", 2)], &[]);
    let words_out = t.path("words");
    ok(&mut tokenize_with(&t, &words, &[&input], &words_out));
    let m = open(&words_out).manifest().clone();
    assert!(!m.eos_appended);
    assert_eq!(m.special_tokens.eos, None);
    assert_eq!(m.vocab_size, 3);
    assert_eq!(records(&words_out), [vec![1, 2, 1], vec![2]]);
}

#[test]
fn ids_above_65535_are_stored_as_uint32() {
    let t = TestDir::new();
    let input = t.write("in.jsonl", jsonl(&["a big a", "big"]));
    let tokenizer = word_level(
        &t,
        "wide.json",
        &[("[UNK]", 0), ("a", 1), ("big", 70_000)],
        &[],
    );
    let out = t.path("out");
    ok(&mut tokenize_with(&t, &tokenizer, &[&input], &out));
    let ds = open(&out);
    assert_eq!(ds.dtype(), Dtype::U32);
    assert_eq!(ds.manifest().vocab_size, 70_001);
    assert_eq!(records(&out), [vec![1, 70_000, 1], vec![70_000]]);
    let bin = std::fs::read(out.join(&ds.manifest().shards[0].bin)).unwrap();
    let expected: Vec<u8> = [1u32, 70_000, 1, 70_000]
        .iter()
        .flat_map(|id| id.to_le_bytes())
        .collect();
    assert_eq!(bin, expected);
}

#[test]
fn a_largest_id_of_65535_is_stored_as_uint16() {
    let t = TestDir::new();
    let input = t.write("in.jsonl", jsonl(&["top a", "a"]));
    let tokenizer = word_level(
        &t,
        "full.json",
        &[("[UNK]", 0), ("a", 1), ("top", 65_535)],
        &[],
    );
    let out = t.path("out");
    ok(&mut tokenize_with(&t, &tokenizer, &[&input], &out));
    let ds = open(&out);
    assert_eq!(ds.dtype(), Dtype::U16);
    assert_eq!(ds.manifest().vocab_size, 65_536);
    assert_eq!(records(&out), [vec![65_535, 1], vec![1]]);
    let bin = std::fs::read(out.join(&ds.manifest().shards[0].bin)).unwrap();
    assert_eq!(bin, [0xff, 0xff, 1, 0, 1, 0]);
}

const FLAGS: [&str; 13] = [
    "--tokenizer",
    "--input",
    "--text-key",
    "--output",
    "--eos",
    "--no-eos",
    "--bos",
    "--threads",
    "--shard-size",
    "--dedup",
    "--skip-bad",
    "--overwrite",
    "--quiet",
];

fn help(args: &[&str]) -> String {
    let t = TestDir::new();
    let out = ok(t.prep().args(args));
    String::from_utf8(out.stdout).unwrap()
}

#[test]
fn help_names_the_subcommand_every_flag_and_the_defaults() {
    let top = help(&["--help"]);
    assert!(top.contains("tokenize"), "{top}");
    for args in [&["tokenize", "--help"][..], &["help", "tokenize"]] {
        let text = help(args);
        for flag in FLAGS {
            assert!(
                text.contains(flag),
                "`prep {}` lacks {flag}:\n{text}",
                args.join(" ")
            );
        }
        for default in ["[default: 1GiB]", "[default: text]"] {
            assert!(
                text.contains(default),
                "`prep {}` lacks {default}:\n{text}",
                args.join(" ")
            );
        }
    }
}

/// `n` documents of pseudo-random lengths (a few longer than a 4 KiB shard).
fn varied_texts(n: usize) -> Vec<String> {
    let mut next = xorshift(0x9e37_79b9_7f4a_7c15u64);
    (0..n)
        .map(|i| {
            let words = if i % 67 == 13 {
                2500
            } else {
                (next() % 400) as usize
            };
            let mut text = format!("doc {i}");
            for _ in 0..words {
                text.push_str(&format!(" w{}", next() % 5000));
            }
            text
        })
        .collect()
}

#[test]
fn shards_are_cut_between_records_as_late_as_the_size_allows() {
    const LIMIT: u64 = 4096;
    let t = TestDir::new();
    let input = t.write("in.jsonl", jsonl(&refs(&varied_texts(200))));
    let whole = t.path("whole");
    ok(&mut tokenize_cmd(&t, &[&input], &whole));
    let cut = t.path("cut");
    ok(tokenize_cmd(&t, &[&input], &cut).args(["--shard-size", "4KiB"]));

    let expected = records(&whole);
    let got = records(&cut);
    assert_eq!(got.len(), expected.len());
    for (i, (g, e)) in got.iter().zip(&expected).enumerate() {
        assert!(
            g == e,
            "record {i} differs between the cut and the whole run"
        );
    }
    let (ds, whole_ds) = (open(&cut), open(&whole));
    assert_eq!(ds.manifest().n_tokens, whole_ds.manifest().n_tokens);
    assert_eq!(ds.manifest().n_records, 200);
    assert_eq!(whole_ds.manifest().shards.len(), 1);

    let shards = &ds.manifest().shards;
    assert!(shards.len() > 10, "only {} shards", shards.len());
    let token_size = ds.dtype().size() as u64;
    let mut first = 0usize;
    let mut oversized = 0;
    for (s, shard) in shards.iter().enumerate() {
        let n = shard.n_records as usize;
        assert!(n >= 1, "shard {s} is empty");
        let tokens: u64 = got[first..first + n].iter().map(|r| r.len() as u64).sum();
        assert_eq!(shard.bin_bytes, tokens * token_size, "shard {s}");
        assert_eq!(
            std::fs::metadata(cut.join(&shard.bin)).unwrap().len(),
            shard.bin_bytes,
            "shard {s}"
        );
        if shard.bin_bytes > LIMIT {
            assert_eq!(n, 1, "shard {s} passes the limit with {n} records");
            oversized += 1;
        }
        first += n;
        if s + 1 < shards.len() {
            let next_bytes = got[first].len() as u64 * token_size;
            assert!(
                shard.bin_bytes + next_bytes > LIMIT,
                "shard {s} ({} bytes) was cut although the next record ({next_bytes} bytes) fits",
                shard.bin_bytes
            );
        }
    }
    assert_eq!(first, got.len());
    assert!(oversized >= 2, "no document was larger than a shard");
}

#[test]
fn several_paths_after_one_input_flag_are_the_same_run_as_one_flag_each() {
    let t = TestDir::new();
    let files: Vec<_> = ["part01", "part02", "part03"]
        .iter()
        .enumerate()
        .map(|(i, name)| {
            t.write(
                &format!("{name}.jsonl"),
                jsonl(&[&format!("document {i} one"), &format!("document {i} two")]),
            )
        })
        .collect();
    // As the shell passes `--input part0*.jsonl`: every path after one flag.
    let expanded = t.path("expanded");
    let mut cmd = t.prep();
    cmd.arg("tokenize")
        .arg("--tokenizer")
        .arg(gpt2())
        .arg("--input")
        .args(&files)
        .arg("--output")
        .arg(&expanded)
        .arg("--quiet");
    ok(&mut cmd);
    let flags = t.path("flags");
    ok(&mut tokenize_cmd(&t, &files, &flags));
    assert_eq!(records(&expanded).len(), 6);
    assert_eq!(snapshot(&expanded), snapshot(&flags));
}

/// A damaged Arrow file found by the arrow fuzz target: a record batch whose
/// buffer claims far more bytes than its message holds, on which the Arrow
/// IPC reader panics. prep reports it as a bad input, naming the file, and
/// prints no panic; in chat mode (whole rows) too.
#[test]
fn a_damaged_arrow_file_is_an_error_not_a_panic() {
    let t = TestDir::new();
    let input = t.path("damaged.arrow");
    std::fs::copy(fixture("arrow/damaged-buffer-length.arrow"), &input).unwrap();
    let err = fails(&mut tokenize_cmd(&t, &[&input], &t.path("out")), 2);
    assert!(
        err.contains("damaged.arrow") && err.contains("damaged"),
        "{err}"
    );
    assert!(!err.contains("panicked"), "{err}");
    assert!(!t.path("out").join("manifest.json").exists());
    let template = t.write("t.jinja", "{% for m in messages %}{{ m.role }}{% endfor %}");
    let err = fails(
        tokenize_cmd(&t, &[&input], &t.path("chat"))
            .arg("--chat")
            .arg("--chat-template")
            .arg(template),
        2,
    );
    assert!(
        err.contains("damaged.arrow") && !err.contains("panicked"),
        "{err}"
    );
}
