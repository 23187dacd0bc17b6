//! `prep export` and `prep import`: a round trip through every format gives
//! the same records; the edge cases each format has (empty, one document,
//! the largest ids) and its refusals; corrupt files are errors naming the
//! file. tests/python/test_interop.py reads the exports with readers written
//! from the formats' own facts.

use std::path::Path;

use crate::common::*;
use prep::format::{Dtype, Manifest, MANIFEST_FILE};

/// Writes `docs` as a dataset whose manifest says its documents end with
/// `eos` and whose vocabulary is `vocab`.
fn write_docs(dir: &Path, dtype: Dtype, docs: &[Vec<u32>], vocab: u64, eos: Option<u32>) {
    write_docs_sharded(dir, dtype, docs, vocab, eos, 1 << 16);
}

/// [`write_docs`] with shards of at most `shard_size` bytes.
fn write_docs_sharded(
    dir: &Path,
    dtype: Dtype,
    docs: &[Vec<u32>],
    vocab: u64,
    eos: Option<u32>,
    shard_size: u64,
) {
    std::fs::create_dir_all(dir).unwrap();
    write_dataset(dir, dtype, shard_size, docs);
    let mut m = Manifest::read(dir).unwrap();
    m.vocab_size = vocab;
    m.special_tokens.eos = eos;
    m.eos_appended = eos.is_some();
    prep::format::atomic_write(&dir.join(MANIFEST_FILE), m.to_json().as_bytes()).unwrap();
}

/// Export `input` to each format and import it back; every round trip
/// must give the input's records.
fn round_trips(t: &TestDir, input: &Path, eos: Option<u32>, formats: &[&str]) {
    let expected = records(input);
    for &format in formats {
        let out = t.path(&format!("{format}-out"));
        let back = t.path(&format!("{format}-back"));
        let target = match format {
            "nanogpt" => out.join("train.bin"),
            _ => out.join("x"),
        };
        let mut export = t.prep();
        export
            .arg("export")
            .arg(input)
            .args(["--to", format])
            .arg(&target)
            .arg("-q");
        if format == "llmc" {
            export.args(["--shard-tokens", "1000", "--val-tokens", "777"]);
        }
        ok(&mut export);
        let mut import = t.prep();
        import
            .arg("import")
            .arg(format)
            .arg(&target)
            .arg(&back)
            .arg("-q");
        if let Some(eos) = eos {
            import.args(["--eos", &eos.to_string()]);
        }
        ok(&mut import);
        assert_eq!(records(&back), expected, "{format}");
        assert!(
            run(t.prep().arg("validate").arg(&back)).status.success(),
            "{format}: the import validates"
        );
    }
}

const ALL: &[&str] = &["megatron", "nanogpt", "llmc", "datatrove"];

#[test]
fn every_format_round_trips_the_demo_corpus() {
    let t = TestDir::new();
    let input = t.path("docs");
    ok(
        tokenize_cmd(&t, &[fixture("corpus/debian-sample.jsonl.zst")], &input)
            .args(["--shard-size", "256KiB"]),
    );
    round_trips(&t, &input, Some(50256), ALL);
    // The import says what it knows: eos, and that every record ends with it.
    let m = Manifest::read(&t.path("megatron-back")).unwrap();
    assert_eq!(m.special_tokens.eos, Some(50256));
    assert!(m.eos_appended);
    assert_eq!(m.provenance.command, "import");
}

#[test]
fn llmc_eot_first_moves_each_eos_to_the_front_and_back() {
    let t = TestDir::new();
    let input = t.path("docs");
    let docs: Vec<Vec<u32>> = vec![vec![5, 6, 9], vec![9], vec![7, 8, 8, 9]];
    write_docs(&input, Dtype::U16, &docs, 100, Some(9));
    let out = t.path("llmc");
    ok(t.prep()
        .arg("export")
        .arg(&input)
        .args(["--to", "llmc", "--eot-first", "--shard-tokens", "3"])
        .arg(&out)
        .arg("-q"));
    let mut stream = Vec::new();
    for n in 1..=3 {
        let bytes = std::fs::read(out.join(format!("prep_train_{n:06}.bin"))).unwrap();
        assert_eq!(&bytes[..4], &20240520i32.to_le_bytes());
        assert_eq!(
            i32::from_le_bytes(bytes[8..12].try_into().unwrap()) as usize,
            (bytes.len() - 1024) / 2
        );
        stream.extend(
            bytes[1024..]
                .chunks(2)
                .map(|c| u16::from_le_bytes([c[0], c[1]])),
        );
    }
    assert_eq!(stream, [9, 5, 6, 9, 9, 7, 8, 8]);
    let back = t.path("back");
    ok(t.prep()
        .args(["import", "llmc"])
        .arg(&out)
        .arg(&back)
        .args(["--eos", "9", "--eot-first", "-q"]));
    assert_eq!(records(&back), docs);
}

#[test]
fn edge_cases_empty_single_and_largest_ids() {
    let t = TestDir::new();
    // Empty, one document, and the largest uint16 ids.
    let cases: Vec<(&str, Dtype, Vec<Vec<u32>>, u64)> = vec![
        ("empty", Dtype::U16, vec![], 10),
        ("single", Dtype::U16, vec![vec![1, 2, 3]], 10),
        (
            "u16max",
            Dtype::U16,
            vec![vec![65535, 0, 65534], vec![65535]],
            65536,
        ),
        (
            "i32max",
            Dtype::U32,
            vec![vec![2_147_483_647, 0], vec![70_000]],
            1 << 31,
        ),
    ];
    for (name, dtype, docs, vocab) in cases {
        let input = t.path(name);
        write_docs(&input, dtype, &docs, vocab, None);
        let formats: &[&str] = match dtype {
            Dtype::U16 => &["megatron", "nanogpt", "llmc", "datatrove"],
            Dtype::U32 => &["megatron", "llmc", "datatrove"],
        };
        let sub = TestDir::new();
        // Without --eos a flat format imports as one record: compare the
        // record-keeping formats record by record, the others as streams.
        let expected = records(&input);
        for &format in formats {
            let target = sub.path(&format!("{name}-{format}/x"));
            ok(sub
                .prep()
                .arg("export")
                .arg(&input)
                .args(["--to", format])
                .arg(&target)
                .arg("-q"));
            let back = sub.path(&format!("{name}-{format}-back"));
            ok(sub
                .prep()
                .arg("import")
                .arg(format)
                .arg(&target)
                .arg(&back)
                .arg("-q"));
            let got = records(&back);
            match format {
                "megatron" | "datatrove" => assert_eq!(got, expected, "{name} {format}"),
                _ => assert_eq!(got.concat(), expected.concat(), "{name} {format}"),
            }
        }
    }
    // Ids past int32 cannot go to Megatron, uint32 datasets not to nanoGPT.
    let big = t.path("big");
    write_docs(&big, Dtype::U32, &[vec![1 << 31]], 1 << 32, None);
    let err = fails(
        t.prep()
            .arg("export")
            .arg(&big)
            .args(["--to", "megatron"])
            .arg(t.path("m")),
        2,
    );
    assert!(err.contains("int32"), "{err}");
    let err = fails(
        t.prep()
            .arg("export")
            .arg(&big)
            .args(["--to", "nanogpt"])
            .arg(t.path("n.bin")),
        2,
    );
    assert!(err.contains("uint16"), "{err}");
    assert!(!t.path("m.bin").exists() && !t.path("m.idx").exists());
}

#[test]
fn corrupt_inputs_are_errors_that_name_the_file() {
    let t = TestDir::new();
    let input = t.path("docs");
    write_docs(&input, Dtype::U16, &[vec![1, 2, 3], vec![4, 5]], 10, None);
    for format in ["megatron", "llmc", "datatrove"] {
        ok(t.prep()
            .arg("export")
            .arg(&input)
            .args(["--to", format])
            .arg(t.path(&format!("{format}/x")))
            .arg("-q"));
    }
    let damage = |path: &Path, at: usize, byte: u8| {
        let mut bytes = std::fs::read(path).unwrap();
        bytes[at] = byte;
        std::fs::write(path, bytes).unwrap();
    };
    // (format, input to import, how to break it, what the error says)
    type Case<'a> = (&'a str, std::path::PathBuf, Box<dyn Fn()>, &'a str);
    let cases: Vec<Case> = vec![
        (
            "megatron",
            t.path("megatron/x"),
            {
                let p = t.path("megatron/x.bin");
                Box::new(move || std::fs::write(&p, [0u8; 4]).unwrap())
            },
            "x.bin",
        ),
        (
            "megatron",
            t.path("megatron/x"),
            {
                let p = t.path("megatron/x.idx");
                Box::new(move || damage(&p, 0, b'X'))
            },
            "bad magic",
        ),
        (
            "llmc",
            t.path("llmc/x"),
            {
                let p = t.path("llmc/x/prep_train_000001.bin");
                Box::new(move || damage(&p, 8, 99))
            },
            "tokens need",
        ),
        (
            "datatrove",
            t.path("datatrove/x"),
            {
                let p = t.path("datatrove/x.ds.index");
                Box::new(move || damage(&p, 0, 200))
            },
            "ends at token",
        ),
    ];
    for (i, (format, target, broken, needle)) in cases.into_iter().enumerate() {
        broken();
        let out = t.path(&format!("back{i}"));
        let err = fails(t.prep().arg("import").arg(format).arg(&target).arg(&out), 2);
        assert!(err.contains(needle), "{format}: {err}");
        let left: Vec<_> = std::fs::read_dir(&out).map_or(vec![], |d| d.collect());
        assert!(
            left.is_empty(),
            "{format}: a bad input leaves nothing behind"
        );
    }
}

#[test]
fn exports_refuse_to_replace_files_without_overwrite() {
    let t = TestDir::new();
    let input = t.path("docs");
    write_docs(&input, Dtype::U16, &[vec![1, 2]], 10, None);
    let target = t.path("out.bin");
    std::fs::write(&target, "keep").unwrap();
    let err = fails(
        t.prep()
            .arg("export")
            .arg(&input)
            .args(["--to", "nanogpt"])
            .arg(&target),
        2,
    );
    assert!(err.contains("--overwrite"), "{err}");
    assert_eq!(std::fs::read_to_string(&target).unwrap(), "keep");
    ok(t.prep()
        .arg("export")
        .arg(&input)
        .args(["--to", "nanogpt", "--overwrite", "-q"])
        .arg(&target));
    assert_eq!(std::fs::read(&target).unwrap(), [1, 0, 2, 0]);
}

/// Past every 32-bit limit: 2^32 + 18 uint16 tokens (8 GiB) in three
/// records, exported to Megatron (byte offsets past 4 GiB, lengths at the
/// int32 limit) and datatrove, and imported back. Writes about 17 GiB, so it
/// is not part of `make test`: `make test-by-hand` runs it.
#[test]
#[cfg(prep_by_hand)]
fn a_dataset_past_4_gib_round_trips() {
    let t = TestDir::new();
    let input = t.path("big");
    std::fs::create_dir_all(&input).unwrap();
    let max = (1u64 << 31) - 1;
    let lengths = [max, max, 20];
    let n_tokens: u64 = lengths.iter().sum();
    let markers = [(max - 1, 11u16), (max, 22), (n_tokens - 1, 33)];
    write_sparse_u16(&input, &lengths, &markers);
    for format in ["megatron", "datatrove"] {
        let target = t.path(&format!("{format}/x"));
        ok(t.prep()
            .arg("export")
            .arg(&input)
            .args(["--to", format])
            .arg(&target)
            .arg("-q"));
        let back = t.path(&format!("{format}-back"));
        ok(t.prep()
            .arg("import")
            .arg(format)
            .arg(&target)
            .arg(&back)
            .arg("-q"));
        let ds = prep::format::Dataset::open(&back).unwrap();
        assert_eq!(ds.record_lengths().collect::<Vec<_>>(), lengths, "{format}");
        for (token, value) in markers {
            let span: Vec<u32> = ds
                .tokens(token..token + 1)
                .unwrap()
                .flat_map(|s| s.to_vec())
                .collect();
            assert_eq!(span, [u32::from(value)], "{format}: token {token}");
        }
        std::fs::remove_dir_all(t.path(format)).unwrap();
        std::fs::remove_dir_all(&back).unwrap();
    }
}

/// Every file under `dir` (recursively), relative to it, sorted.
fn files_under(dir: &Path) -> Vec<String> {
    let mut out = Vec::new();
    let Ok(entries) = std::fs::read_dir(dir) else {
        return out;
    };
    for e in entries {
        let path = e.unwrap().path();
        let name = path.file_name().unwrap().to_string_lossy().into_owned();
        if path.is_dir() {
            out.extend(
                files_under(&path)
                    .into_iter()
                    .map(|f| format!("{name}/{f}")),
            );
        }
        out.push(name);
    }
    out.sort();
    out
}

/// Export target of `format` inside `dir`, a directory the export makes.
fn target(dir: &Path, format: &str) -> std::path::PathBuf {
    match format {
        "nanogpt" => dir.join("made/train.bin"),
        _ => dir.join("made/x"),
    }
}

#[test]
fn export_refuses_flipped_byte_and_out_of_range_id() {
    let t = TestDir::new();
    // Four shards of 8 tokens; the damage is in the third, so llm.c shards
    // of 5 tokens before it are complete when it is found.
    let docs: Vec<Vec<u32>> = (0..16).map(|i| vec![i % 7 + 1, 9]).collect();
    let input = t.path("docs");
    write_docs_sharded(&input, Dtype::U16, &docs, 10, Some(9), 16);
    let m = Manifest::read(&input).unwrap();
    assert_eq!(m.shards.len(), 4);
    let third = input.join(&m.shards[2].bin);
    let mut bytes = std::fs::read(&third).unwrap();
    bytes[2] ^= 0x01; // id 9 becomes 8: still in the vocabulary
    std::fs::write(&third, &bytes).unwrap();
    // A flip that also makes an id out of range is named as damage too.
    let high = t.path("high");
    write_docs_sharded(&high, Dtype::U16, &docs, 10, Some(9), 16);
    let mut bytes = std::fs::read(high.join(&m.shards[2].bin)).unwrap();
    bytes[3] ^= 0x01;
    std::fs::write(high.join(&m.shards[2].bin), &bytes).unwrap();

    // An id at the vocabulary size, with checksums that match: the
    // manifest's vocabulary is smaller than the data.
    let wide = t.path("wide");
    write_docs_sharded(&wide, Dtype::U16, &docs, 10, Some(9), 16);
    let mut m = Manifest::read(&wide).unwrap();
    m.vocab_size = 8;
    prep::format::atomic_write(&wide.join(MANIFEST_FILE), m.to_json().as_bytes()).unwrap();

    for format in ALL {
        for (dataset, needle) in [
            (&input, "XXH3"),
            (&high, "XXH3"),
            (&wide, "id 9, not below the vocabulary size 8"),
        ] {
            let out = t.path(&format!("{format}-out"));
            let mut cmd = t.prep();
            cmd.arg("export")
                .arg(dataset)
                .args(["--to", format])
                .arg(target(&out, format));
            if *format == "llmc" {
                cmd.args(["--shard-tokens", "5", "--eot-first"]);
            }
            let err = fails(&mut cmd, 2);
            assert!(err.contains(needle), "{format}: {err}");
            let shard = if needle == "XXH3" {
                &m.shards[2].bin
            } else {
                &m.shards[0].bin
            };
            assert!(
                err.contains(shard.as_str()),
                "{format}: names the shard: {err}"
            );
            assert_eq!(
                files_under(&out),
                Vec::<String>::new(),
                "{format}: nothing is left, not even the directory the export made"
            );
        }
    }
    // The same shards, undamaged, export.
    let good = t.path("good");
    write_docs_sharded(&good, Dtype::U16, &docs, 10, Some(9), 16);
    for format in ALL {
        ok(t.prep()
            .arg("export")
            .arg(&good)
            .args(["--to", format, "-q"])
            .arg(target(&t.path(&format!("{format}-good")), format)));
    }
}

/// Megatron's `.idx` as `IndexedDatasetBuilder` writes it: `sequences`
/// (lengths in tokens) grouped into documents by `doc_indices`.
fn megatron_idx(code: u8, size: usize, sequences: &[u32], doc_indices: &[i64]) -> Vec<u8> {
    let mut idx = b"MMIDIDX\0\0".to_vec();
    idx.extend(1u64.to_le_bytes());
    idx.push(code);
    idx.extend((sequences.len() as u64).to_le_bytes());
    idx.extend((doc_indices.len() as u64).to_le_bytes());
    for &len in sequences {
        idx.extend((len as i32).to_le_bytes());
    }
    let mut offset = 0i64;
    for &len in sequences {
        idx.extend(offset.to_le_bytes());
        offset += i64::from(len) * size as i64;
    }
    for &d in doc_indices {
        idx.extend(d.to_le_bytes());
    }
    idx
}

#[test]
fn megatron_import_keeps_documents_of_several_sequences() {
    let t = TestDir::new();
    // --split-sentences: five sentences in three documents (2, 1, 2).
    let sentences: Vec<Vec<u16>> = vec![vec![1, 2], vec![3], vec![4, 5, 6], vec![7], vec![8, 0]];
    let bin: Vec<u8> = sentences
        .concat()
        .iter()
        .flat_map(|t| t.to_le_bytes())
        .collect();
    let lengths: Vec<u32> = sentences.iter().map(|s| s.len() as u32).collect();
    t.write("m/x.bin", bin);
    t.write("m/x.idx", megatron_idx(8, 2, &lengths, &[0, 2, 3, 5]));
    let back = t.path("back");
    ok(t.prep()
        .args(["import", "megatron"])
        .arg(t.path("m/x"))
        .arg(&back)
        .arg("-q"));
    assert_eq!(
        records(&back),
        [vec![1, 2, 3], vec![4, 5, 6], vec![7, 8, 0]],
        "one record per document, not per sentence"
    );
    assert!(run(t.prep().arg("validate").arg(&back)).status.success());
    // Document indices that do not run from 0 to the sequence count, or go
    // back, are refused.
    for (name, docs) in [
        ("start", vec![1i64, 5]),
        ("back", vec![0, 3, 2, 5]),
        ("past", vec![0, 9, 5]),
    ] {
        t.write(
            &format!("{name}/x.bin"),
            std::fs::read(t.path("m/x.bin")).unwrap(),
        );
        t.write(
            &format!("{name}/x.idx"),
            megatron_idx(8, 2, &lengths, &docs),
        );
        let err = fails(
            t.prep()
                .args(["import", "megatron"])
                .arg(t.path(&format!("{name}/x")))
                .arg(t.path(&format!("{name}-back"))),
            2,
        );
        assert!(
            err.contains("x.idx") && err.contains("document ind"),
            "{name}: {err}"
        );
    }
}

#[test]
fn llmc_eot_first_refuses_a_packed_dataset() {
    let t = TestDir::new();
    let input = t.path("docs");
    let docs: Vec<Vec<u32>> = vec![vec![5, 6, 9], vec![7, 8, 8, 9], vec![1, 9]];
    write_docs(&input, Dtype::U16, &docs, 100, Some(9));
    let packed = t.path("packed");
    ok(t.prep()
        .arg("pack")
        .arg(&input)
        .arg(&packed)
        .args(["--seq-len", "4", "-q"]));
    let out = t.path("llmc");
    let err = fails(
        t.prep()
            .arg("export")
            .arg(&packed)
            .args(["--to", "llmc", "--eot-first"])
            .arg(&out),
        2,
    );
    assert!(err.contains("packed"), "{err}");
    assert!(!out.exists(), "nothing is written");
}

#[test]
fn llmc_shards_stay_within_what_llmc_can_read() {
    let t = TestDir::new();
    let input = t.path("docs");
    let docs: Vec<Vec<u32>> = (0..10).map(|i| vec![i, i + 1, 9]).collect(); // 30 tokens
    write_docs(&input, Dtype::U16, &docs, 100, Some(9));
    let export = |out: &str, extra: &[&str]| {
        let mut cmd = t.prep();
        cmd.arg("export")
            .arg(&input)
            .args(["--to", "llmc"])
            .arg(t.path(out))
            .args(extra)
            .arg("-q");
        cmd
    };
    // The C loader seeks with a 32-bit int: every byte of a uint16 shard
    // must lie below 2^31.
    let err = fails(&mut export("big", &["--shard-tokens", "1073741312"]), 2);
    assert!(err.contains("1073741311"), "{err}");
    ok(&mut export("edge", &["--shard-tokens", "1073741311"]));

    // With --batch-tokens 7 every shard holds at least 8 tokens: the last
    // of 12 + 12 + 6 takes two from the one before it.
    ok(&mut export(
        "batch",
        &["--shard-tokens", "12", "--batch-tokens", "7"],
    ));
    let counts: Vec<i32> = (1..=3)
        .map(|n| {
            let b = std::fs::read(t.path(&format!("batch/prep_train_{n:06}.bin"))).unwrap();
            i32::from_le_bytes(b[8..12].try_into().unwrap())
        })
        .collect();
    assert_eq!(counts, [12, 10, 8]);
    // Too few tokens for one batch, in the train shards or the val shard.
    let err = fails(&mut export("few", &["--batch-tokens", "40"]), 2);
    assert!(err.contains("--batch-tokens 40"), "{err}");
    let err = fails(
        &mut export("val", &["--val-tokens", "5", "--batch-tokens", "7"]),
        2,
    );
    assert!(err.contains("--val-tokens 5"), "{err}");
    assert!(!t.path("few").exists() && !t.path("val").exists());
}

/// An llm.c shard as `write_datafile` writes it.
fn llmc_shard(magic: i32, version: i32, tokens: &[u8], size: usize) -> Vec<u8> {
    let mut bytes = vec![0u8; 1024];
    bytes[0..4].copy_from_slice(&magic.to_le_bytes());
    bytes[4..8].copy_from_slice(&version.to_le_bytes());
    bytes[8..12].copy_from_slice(&((tokens.len() / size) as i32).to_le_bytes());
    bytes.extend_from_slice(tokens);
    bytes
}

#[test]
fn uint32_ids_from_2_31_are_not_read_as_negative() {
    let t = TestDir::new();
    let big = 1u32 << 31;
    let ids = [5u32, big, u32::MAX, 7];
    let tokens: Vec<u8> = ids.iter().flat_map(|i| i.to_le_bytes()).collect();
    t.write(
        "llmc/s_train_000001.bin",
        llmc_shard(20240801, 7, &tokens, 4),
    );
    t.write("dt/x.ds", &tokens);
    t.write(
        "dt/x.ds.index",
        [2u64, 4]
            .iter()
            .flat_map(|e| e.to_le_bytes())
            .collect::<Vec<u8>>(),
    );
    t.write("dt/x.ds.metadata", "t|4\n4\n4");
    ok(t.prep()
        .args(["import", "llmc"])
        .arg(t.path("llmc"))
        .arg(t.path("from-llmc"))
        .arg("-q"));
    ok(t.prep()
        .args(["import", "datatrove"])
        .arg(t.path("dt/x"))
        .arg(t.path("from-dt"))
        .arg("-q"));
    assert_eq!(records(&t.path("from-llmc")), [ids.to_vec()]);
    assert_eq!(
        records(&t.path("from-dt")),
        [vec![5, big], vec![u32::MAX, 7]]
    );
    for back in ["from-llmc", "from-dt"] {
        assert!(
            run(t.prep().arg("validate").arg(t.path(back)))
                .status
                .success(),
            "{back}"
        );
    }
    // Megatron has int32 only: the export is refused, the file unwritten.
    let err = fails(
        t.prep()
            .arg("export")
            .arg(t.path("from-dt"))
            .args(["--to", "megatron"])
            .arg(t.path("m/x")),
        2,
    );
    assert!(
        err.contains("token id 4294967295") && err.contains("int32"),
        "{err}"
    );
    assert!(!t.path("m").exists());
    // And a Megatron int32 file with the sign bit set is a negative id.
    t.write("neg/x.bin", &tokens);
    t.write("neg/x.idx", megatron_idx(4, 4, &[4], &[0, 1]));
    let err = fails(
        t.prep()
            .args(["import", "megatron"])
            .arg(t.path("neg/x"))
            .arg(t.path("nb")),
        2,
    );
    assert!(err.contains("negative token id -2147483648"), "{err}");
}

#[test]
fn datatrove_import_without_metadata_takes_the_token_size_from_the_index() {
    let t = TestDir::new();
    for (size, ids) in [(2usize, vec![3u32, 4, 5, 70]), (4, vec![3, 70_000, 5, 6])] {
        let tokens: Vec<u8> = ids
            .iter()
            .flat_map(|&i| match size {
                2 => (i as u16).to_le_bytes().to_vec(),
                _ => i.to_le_bytes().to_vec(),
            })
            .collect();
        // TokenizedFile alone: .ds and .ds.index, no .ds.metadata.
        t.write(&format!("d{size}/x.ds"), &tokens);
        t.write(
            &format!("d{size}/x.ds.index"),
            [1u64, 4]
                .iter()
                .flat_map(|e| e.to_le_bytes())
                .collect::<Vec<u8>>(),
        );
        let back = t.path(&format!("back{size}"));
        ok(t.prep()
            .args(["import", "datatrove"])
            .arg(t.path(&format!("d{size}/x")))
            .arg(&back)
            .arg("-q"));
        assert_eq!(
            records(&back),
            [ids[..1].to_vec(), ids[1..].to_vec()],
            "{size}"
        );
        assert_eq!(Manifest::read(&back).unwrap().dtype.size(), size);
    }
    // A length that is neither 2 nor 4 bytes a token says so.
    t.write("odd/x.ds", [0u8; 12]);
    t.write("odd/x.ds.index", 4u64.to_le_bytes());
    let err = fails(
        t.prep()
            .args(["import", "datatrove"])
            .arg(t.path("odd/x"))
            .arg(t.path("ob")),
        2,
    );
    assert!(
        err.contains("x.ds:") && err.contains("neither 2 nor 4"),
        "{err}"
    );
}

#[test]
fn import_takes_options_before_the_output() {
    let t = TestDir::new();
    let tokens: Vec<u8> = [1u16, 2, 9, 3, 9]
        .iter()
        .flat_map(|i| i.to_le_bytes())
        .collect();
    t.write("train.bin", tokens);
    let back = t.path("back");
    ok(t.prep()
        .args(["import", "nanogpt"])
        .arg(t.path("train.bin"))
        .args(["--eos", "9"])
        .arg(&back)
        .arg("-q"));
    assert_eq!(records(&back), [vec![1, 2, 9], vec![3, 9]]);
    let err = fails(
        t.prep()
            .args(["import", "nanogpt", "--eos", "9"])
            .arg(t.path("train.bin")),
        2,
    );
    assert!(err.contains("output"), "{err}");
}
