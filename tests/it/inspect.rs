//! `prep inspect`: counts, shards, lengths and one record, for people and as JSON.

use crate::common::*;

fn good() -> std::path::PathBuf {
    fixture("validate/good")
}

/// Runs `prep inspect --json` and checks the output against its schema.
fn inspect_json(t: &TestDir, dir: &std::path::Path, extra: &[&str]) -> serde_json::Value {
    let out = ok(t.prep().arg("inspect").arg("--json").args(extra).arg(dir));
    let value: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let schemas = root().join("schemas");
    let manifest_schema: serde_json::Value =
        serde_json::from_slice(&std::fs::read(schemas.join("manifest.schema.json")).unwrap())
            .unwrap();
    let mut schema: serde_json::Value =
        serde_json::from_slice(&std::fs::read(schemas.join("inspect.schema.json")).unwrap())
            .unwrap();
    // Resolve the one cross-file reference locally rather than over a network.
    schema["properties"]["manifest"] = manifest_schema;
    let validator = jsonschema::validator_for(&schema).unwrap();
    let errors: Vec<String> = validator
        .iter_errors(&value)
        .map(|e| e.to_string())
        .collect();
    assert!(
        errors.is_empty(),
        "inspect output does not match its schema: {errors:#?}"
    );
    value
}

#[test]
fn counts_lengths_and_overflow_agree_with_the_records() {
    let t = TestDir::new();
    let out = t.path("ds");
    // Documents of known lengths: n words + eos with a word tokenizer is n + 1 tokens.
    let lens = [0usize, 1, 5, 2047, 2048, 2049, 3000, 5000, 9000, 40000];
    let texts: Vec<String> = lens.iter().map(|&n| vec!["w"; n].join(" ")).collect();
    let refs: Vec<&str> = texts.iter().map(String::as_str).collect();
    let input = t.write("docs.jsonl", jsonl(&refs));
    let tok = word_level(
        &t,
        "w.tokenizer.json",
        &[("[UNK]", 0), ("<eos>", 1), ("w", 2)],
        &["<eos>"],
    );
    ok(t.prep()
        .args([
            "tokenize",
            "--quiet",
            "--eos",
            "<eos>",
            "--shard-size",
            "16KiB",
            "--tokenizer",
        ])
        .arg(&tok)
        .arg("--input")
        .arg(&input)
        .arg("--output")
        .arg(&out));
    let v = inspect_json(&t, &out, &[]);
    let n_tokens: u64 = lens.iter().map(|&n| n as u64 + 1).sum();
    assert_eq!(v["manifest"]["n_tokens"], n_tokens);
    let l = &v["lengths"];
    assert_eq!(l["min"], 1);
    assert_eq!(l["max"], 40001);
    // p50 of 10 records is the 5th shortest: 2048 tokens (2047 words + eos).
    let p50 = l["percentiles"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p[0] == 0.5)
        .unwrap()[1]
        .as_u64()
        .unwrap();
    assert!((2048..=2048 + 2048 / 100).contains(&p50), "p50 {p50}");
    let hist_total: u64 = l["histogram"]
        .as_array()
        .unwrap()
        .iter()
        .map(|b| b["records"].as_u64().unwrap())
        .sum();
    assert_eq!(hist_total, lens.len() as u64);
    let shard_tokens: u64 = v["shards"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["n_tokens"].as_u64().unwrap())
        .sum();
    assert_eq!(shard_tokens, n_tokens);
    // Longer than 2048: the documents of 2048, 2049, 3000, 5000, 9000, 40000 words.
    let over = |context: u64| {
        v["overflow"]
            .as_array()
            .unwrap()
            .iter()
            .find(|o| o["context"] == context)
            .unwrap()
            .clone()
    };
    assert_eq!(over(2048)["records"], 6);
    let share = (2049 + 2050 + 3001 + 5001 + 9001 + 40001) as f64 / n_tokens as f64;
    assert!((over(2048)["token_share"].as_f64().unwrap() - share).abs() < 1e-9);
    assert_eq!(over(32768)["records"], 1);

    let human = String::from_utf8(ok(t.prep().arg("inspect").arg(&out)).stdout).unwrap();
    for needle in [
        "kind        documents",
        "dtype       uint16",
        "records     10",
        "p50",
        "32768 tokens:",
    ] {
        assert!(human.contains(needle), "{needle:?} missing from:\n{human}");
    }
}

#[test]
fn a_record_is_shown_with_its_ids_and_decoded_text() {
    let t = TestDir::new();
    let out = t.path("ds");
    let input = t.write(
        "docs.jsonl",
        jsonl(&["Hello world", "Second document, with ünïcode ✓"]),
    );
    ok(&mut tokenize_cmd(&t, &[&input], &out));
    let v = inspect_json(&t, &out, &["--record", "1"]);
    let record = &v["record"];
    assert_eq!(record["index"], 1);
    let ids: Vec<u32> = record["ids"]
        .as_array()
        .unwrap()
        .iter()
        .map(|i| i.as_u64().unwrap() as u32)
        .collect();
    assert_eq!(ids, records(&out)[1]);
    assert_eq!(
        record["text"],
        "Second document, with ünïcode ✓<|endoftext|>"
    );

    // An explicit tokenizer works too; a record past the end is an error.
    let v = inspect_json(
        &t,
        &out,
        &["--record", "0", "--tokenizer", gpt2().to_str().unwrap()],
    );
    assert_eq!(v["record"]["text"], "Hello world<|endoftext|>");
    let err = fails(t.prep().args(["inspect", "--record", "2"]).arg(&out), 2);
    assert!(err.contains("record 2 does not exist"), "{err}");
}

#[test]
fn an_empty_dataset_and_a_broken_one() {
    let t = TestDir::new();
    let out = t.path("empty");
    let input = t.write("none.jsonl", "");
    ok(&mut tokenize_cmd(&t, &[&input], &out));
    let v = inspect_json(&t, &out, &[]);
    assert!(v["lengths"].is_null());
    assert_eq!(v["shards"].as_array().unwrap().len(), 0);
    let v = inspect_json(&t, &good(), &[]);
    assert_eq!(v["manifest"]["n_records"], 36);

    let err = fails(
        t.prep()
            .arg("inspect")
            .arg(fixture("validate/truncated_idx")),
        2,
    );
    assert!(
        err.contains("shard-00001.idx") && err.contains("prep validate"),
        "{err}"
    );
}

#[test]
fn a_packed_row_is_shown_with_its_pieces() {
    let t = TestDir::new();
    let docs = t.path("docs");
    ok(&mut tokenize_cmd(
        &t,
        &[fixture("corpus/debian-sample.jsonl.zst")],
        &docs,
    ));
    let packed = t.path("packed");
    ok(t.prep()
        .arg("pack")
        .arg(&docs)
        .arg(&packed)
        .args(["--seq-len", "512", "-q"]));
    let ds = prep::Dataset::open(&packed).unwrap();
    // A row that ends in padding, so that every field shows.
    let row = (0..ds.len())
        .find(|&i| ds.segments(i).unwrap().last().unwrap().end() < 512)
        .unwrap();
    let v = inspect_json(&t, &packed, &["--record", &row.to_string()]);
    let pieces = v["record"]["segments"].as_array().unwrap();
    let expected = ds.segments(row).unwrap();
    assert_eq!(pieces.len(), expected.len());
    for (p, e) in pieces.iter().zip(expected) {
        assert_eq!(p["doc"], e.doc);
        assert_eq!(p["start"], e.start);
        assert_eq!(p["length"], e.length);
    }
    let human = ok(t
        .prep()
        .arg("inspect")
        .arg(&packed)
        .args(["--record", &row.to_string()]));
    let human = String::from_utf8_lossy(&human.stdout);
    assert!(human.contains("Packed by bestfit"), "{human}");
    assert!(human.contains("padding"), "{human}");
}

/// A `.seg` entry that runs past its row (or leaves a gap, or is empty) is
/// refused by every reader when the row is read, with the file and the entry
/// named, instead of being handed to code that builds `cu_seqlens` from it;
/// the other rows still read, and `prep validate` reports the same row.
#[test]
fn seg_entry_past_its_row_is_refused_by_inspect_and_reader() {
    use prep::format::{FormatError, SegHeader, SEGMENT_BYTES};

    const SEQ_LEN: u32 = 33;
    let t = TestDir::new();
    let packed = t.path("packed");
    ok(t.prep().arg("pack").arg(good()).arg(&packed).args([
        "--seq-len",
        &SEQ_LEN.to_string(),
        "-q",
    ]));
    let seg_name = "shard-00000.seg";
    let seg_bytes = std::fs::read(packed.join(seg_name)).unwrap();
    let header = SegHeader::parse(std::path::Path::new(seg_name), &seg_bytes).unwrap();
    let ds = prep::Dataset::open(&packed).unwrap();
    assert_eq!(
        ds.n_shards(),
        1,
        "one shard: rows are numbered alike in it and globally"
    );
    // A row of several pieces, so that a broken entry can sit after sound ones.
    let row = (0..ds.len())
        .find(|&i| ds.segments(i).unwrap().len() >= 2)
        .expect("a row of two pieces or more");
    let pieces = ds.segments(row).unwrap().to_vec();
    let first = {
        let before: u64 = (0..row).map(|i| ds.segments(i).unwrap().len() as u64).sum();
        before
    };
    let last = first + pieces.len() as u64 - 1;
    drop(ds);

    // (what, entry patched, its new start and length, what the error says)
    let cases: [(&str, u64, u32, u32, String); 4] = [
        (
            "start 5000, length 4e9",
            first,
            5000,
            4_000_000_000,
            "starts at 5000".into(),
        ),
        (
            "the last piece runs past the row, its end past u32",
            last,
            pieces[pieces.len() - 1].start,
            u32::MAX,
            format!("past the row's {SEQ_LEN} tokens"),
        ),
        (
            "the last piece one token too long",
            last,
            pieces[pieces.len() - 1].start,
            SEQ_LEN - pieces[pieces.len() - 1].start + 1,
            format!("ends at {}, past the row's {SEQ_LEN} tokens", SEQ_LEN + 1),
        ),
        (
            "an empty piece",
            last,
            pieces[pieces.len() - 1].start,
            0,
            "is empty".into(),
        ),
    ];
    for (i, (what, entry, start, length, says)) in cases.into_iter().enumerate() {
        let dir = t.path(&format!("corrupt-{i}"));
        std::fs::create_dir_all(&dir).unwrap();
        for file in std::fs::read_dir(&packed).unwrap() {
            let file = file.unwrap();
            std::fs::copy(file.path(), dir.join(file.file_name())).unwrap();
        }
        let mut bytes = seg_bytes.clone();
        let at = header.segments_offset() + SEGMENT_BYTES * entry as usize;
        bytes[at + 16..at + 20].copy_from_slice(&start.to_le_bytes());
        bytes[at + 20..at + 24].copy_from_slice(&length.to_le_bytes());
        std::fs::write(dir.join(seg_name), &bytes).unwrap();

        // The Rust reader: opening stays cheap, reading the row is refused.
        let ds = prep::Dataset::open(&dir).unwrap_or_else(|e| panic!("{what}: {e}"));
        match ds.segments(row) {
            Err(FormatError::BadSegment {
                path,
                row: r,
                entry: e,
                message,
            }) => {
                assert_eq!(path, dir.join(seg_name), "{what}");
                assert_eq!((r, e), (row, entry), "{what}");
                assert!(message.contains(&says), "{what}: {message}");
            }
            other => panic!("{what}: {other:?}"),
        }
        for i in (0..ds.len()).filter(|&i| i != row) {
            let pieces = ds
                .segments(i)
                .unwrap_or_else(|e| panic!("{what}: row {i}: {e}"));
            assert!(pieces.last().unwrap().end() <= u64::from(SEQ_LEN));
        }

        // prep inspect: exit 2, the file and the entry named; nothing on stdout.
        for json in [false, true] {
            let mut cmd = t.prep();
            cmd.arg("inspect").args(["--record", &row.to_string()]);
            if json {
                cmd.arg("--json");
            }
            let out = run(cmd.arg(&dir));
            assert_eq!(out.status.code(), Some(2), "{what}");
            assert!(out.stdout.is_empty(), "{what}");
            let err = String::from_utf8_lossy(&out.stderr);
            assert!(
                err.contains(seg_name)
                    && err.contains(&format!("row {row}, entry {entry}"))
                    && err.contains(&says),
                "{what}: {err}"
            );
        }

        // prep validate finds the same row broken.
        let out = run(t.prep().args(["validate", "--quick", "--json"]).arg(&dir));
        assert_eq!(out.status.code(), Some(1), "{what}");
        let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        assert!(
            report["problems"].as_array().unwrap().iter().any(|p| {
                p["kind"] == "segments" && p["file"] == seg_name && p["record"] == row
            }),
            "{what}: {report:#}"
        );
    }
}
