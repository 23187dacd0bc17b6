//! `prep tokenize --part I/N` and `prep merge`: the parts of a partitioned
//! run, merged, are record for record the dataset one run makes.

use crate::common;

use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::common::{fails, ok, records, tokenize_cmd, write_parquet, xorshift, TestDir};
use prep::format::Manifest;

/// Texts of varied length, some repeated (for --dedup), some empty.
fn texts(seed: u64, n: usize) -> Vec<String> {
    let mut next = xorshift(seed);
    let words = [
        "alpha",
        "beta",
        "γάμμα",
        "delta",
        "日本",
        "e\u{301}",
        "\"q\"",
        "x\ty",
        "42",
    ];
    (0..n)
        .map(|i| match next() % 13 {
            0 => String::new(),
            1 => "a repeated document".to_owned(),
            2 => format!("repeat {}", next() % 4),
            _ => (0..(next() % 40 + (i % 3) as u64))
                .map(|_| words[(next() % words.len() as u64) as usize])
                .collect::<Vec<_>>()
                .join(" "),
        })
        .collect()
}

/// JSONL lines with blank lines and CRLF endings mixed in.
fn jsonl_messy(texts: &[String], seed: u64) -> String {
    let mut next = xorshift(seed);
    let mut out = String::new();
    for t in texts {
        if next().is_multiple_of(7) {
            out += "\n   \n";
        }
        out += &serde_json::json!({ "id": next() % 1000, "text": t }).to_string();
        out += if next().is_multiple_of(5) {
            "\r\n"
        } else {
            "\n"
        };
    }
    out
}

fn gzip(data: &[u8]) -> Vec<u8> {
    let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
    e.write_all(data).unwrap();
    e.finish().unwrap()
}

/// A corpus of every input kind: plain JSONL (one much larger than the
/// rest, so parts cut through it), gzip, zstd, and Parquet with many row groups.
fn corpus(t: &TestDir) -> PathBuf {
    let all = texts(7, 900);
    t.write("in/a.jsonl", jsonl_messy(&all[0..60], 1));
    t.write(
        "in/b.jsonl.gz",
        gzip(jsonl_messy(&all[60..150], 2).as_bytes()),
    );
    t.write("in/c.jsonl", jsonl_messy(&all[150..500], 3));
    let column: arrow::array::ArrayRef = Arc::new(arrow::array::StringArray::from(
        all[500..700].iter().map(String::as_str).collect::<Vec<_>>(),
    ));
    write_parquet(&t.path("in/d.parquet"), vec![("text", column)], 17);
    t.write(
        "in/e.jsonl.zst",
        zstd::encode_all(jsonl_messy(&all[700..760], 4).as_bytes(), 3).unwrap(),
    );
    t.write("in/f.jsonl", jsonl_messy(&all[760..], 5));
    t.write("in/g.jsonl", "");
    t.path("in")
}

/// Runs parts 0..n of tokenize into `run/part-I` and merges them into `run`.
fn tokenize_parts(t: &TestDir, input: &Path, run: &Path, n: u64, extra: &[&str]) {
    for i in 0..n {
        ok(tokenize_cmd(t, &[input], &run.join(format!("part-{i:05}")))
            .args(["--part", &format!("{i}/{n}"), "--shard-size", "2KB"])
            .args(extra));
    }
    // Given in reverse: merge orders by the recorded part numbers.
    let mut cmd = t.prep();
    cmd.arg("merge").arg("--quiet");
    for i in (0..n).rev() {
        cmd.arg(run.join(format!("part-{i:05}")));
    }
    ok(cmd.arg(run));
}

#[test]
fn merged_parts_equal_one_run_for_any_part_count() {
    let t = TestDir::new();
    let input = corpus(&t);
    let one = t.path("one");
    ok(tokenize_cmd(&t, &[&input], &one).args(["--shard-size", "2KB"]));
    let want = records(&one);
    let want_manifest = Manifest::read(&one).unwrap();
    for n in [1u64, 2, 3, 7, 13] {
        let run = t.path(&format!("run{n}"));
        tokenize_parts(&t, &input, &run, n, &[]);
        assert_eq!(records(&run), want, "{n} parts");
        let m = Manifest::read(&run).unwrap();
        assert_eq!(m.partition, None);
        assert_eq!(m.provenance.documents, want_manifest.provenance.documents);
        assert_eq!(
            m.provenance.fingerprint,
            want_manifest.provenance.fingerprint
        );
        assert_eq!(m.provenance.inputs, want_manifest.provenance.inputs);
        assert_eq!(m.provenance.merged.len(), n as usize);
        ok(t.prep().arg("validate").arg(&run));
        // Every shard is used in place: no token data was copied.
        assert!(m.shards.iter().all(|s| s.bin.starts_with("part-")));
    }
}

#[test]
fn dedup_across_parts_drops_what_one_run_drops() {
    let t = TestDir::new();
    let input = corpus(&t);
    let one = t.path("one");
    ok(tokenize_cmd(&t, &[&input], &one).args(["--dedup", "--shard-size", "2KB"]));
    let want_manifest = Manifest::read(&one).unwrap();
    assert!(want_manifest.provenance.documents.deduplicated > 20);
    for n in [2u64, 3, 7] {
        let run = t.path(&format!("run{n}"));
        tokenize_parts(&t, &input, &run, n, &["--dedup"]);
        let part0 = Manifest::read(&run.join("part-00000")).unwrap();
        assert!(part0.partition.unwrap().hashes.is_some());
        assert_eq!(records(&run), records(&one), "{n} parts");
        let m = Manifest::read(&run).unwrap();
        assert_eq!(m.provenance.documents, want_manifest.provenance.documents);
        ok(t.prep().arg("validate").arg(&run));
    }
}

#[test]
fn one_large_file_spreads_over_every_part() {
    let t = TestDir::new();
    let all = texts(3, 400);
    let input = t.write("big.jsonl", jsonl_messy(&all, 9));
    let one = t.path("one");
    ok(&mut tokenize_cmd(&t, &[&input], &one));
    let run = t.path("run");
    tokenize_parts(&t, &input, &run, 5, &[]);
    for i in 0..5 {
        let m = Manifest::read(&run.join(format!("part-{i:05}"))).unwrap();
        assert!(m.n_records > 40, "part {i} has {} records", m.n_records);
    }
    assert_eq!(records(&run), records(&one));
}

#[test]
fn parquet_row_groups_spread_over_parts() {
    let t = TestDir::new();
    let all = texts(5, 300);
    let column: arrow::array::ArrayRef = Arc::new(arrow::array::StringArray::from(
        all.iter().map(String::as_str).collect::<Vec<_>>(),
    ));
    let input = t.path("d.parquet");
    write_parquet(&input, vec![("text", column)], 10);
    let one = t.path("one");
    ok(&mut tokenize_cmd(&t, &[&input], &one));
    let run = t.path("run");
    tokenize_parts(&t, &input, &run, 4, &[]);
    for i in 0..4 {
        let m = Manifest::read(&run.join(format!("part-{i:05}"))).unwrap();
        assert!(m.n_records >= 30, "part {i} has {} records", m.n_records);
    }
    assert_eq!(records(&run), records(&one));
}

#[test]
fn a_part_run_again_writes_the_same_bytes() {
    let t = TestDir::new();
    let input = corpus(&t);
    let a = t.path("a");
    let b = t.path("b");
    for (dir, threads) in [(&a, "1"), (&b, "3")] {
        ok(tokenize_cmd(&t, &[&input], dir).args(["--part", "1/3", "--threads", threads]));
    }
    for name in ["shard-00000.bin", "shard-00000.idx"] {
        assert_eq!(
            std::fs::read(a.join(name)).unwrap(),
            std::fs::read(b.join(name)).unwrap()
        );
    }
    // Run again in place (an engine's retry): complete already, untouched.
    let before = std::fs::metadata(a.join("manifest.json"))
        .unwrap()
        .modified()
        .unwrap();
    ok(tokenize_cmd(&t, &[&input], &a).args(["--part", "1/3"]));
    let after = std::fs::metadata(a.join("manifest.json"))
        .unwrap()
        .modified()
        .unwrap();
    assert_eq!(before, after);
    // Another part's output is not this part's.
    let err = fails(tokenize_cmd(&t, &[&input], &b).args(["--part", "2/3"]), 2);
    assert!(err.contains("other inputs or options"), "{err}");
}

#[test]
fn a_bad_line_in_a_later_part_is_named_by_its_line_in_the_file() {
    let t = TestDir::new();
    let mut lines: Vec<String> = (0..200)
        .map(|i| serde_json::json!({ "text": format!("document {i}") }).to_string())
        .collect();
    lines[150] = "{\"text\": broken".to_owned();
    let input = t.write("bad.jsonl", lines.join("\n") + "\n");
    let err = fails(
        tokenize_cmd(&t, &[&input], &t.path("p")).args(["--part", "2/3"]),
        2,
    );
    assert!(err.contains("bad.jsonl: line 151:"), "{err}");
}

#[test]
fn merge_refuses_incomplete_mixed_or_whole_datasets() {
    let t = TestDir::new();
    let input = corpus(&t);
    let run = t.path("run");
    for i in 0..3 {
        ok(tokenize_cmd(&t, &[&input], &run.join(format!("p{i}")))
            .args(["--part", &format!("{i}/3")]));
    }
    ok(tokenize_cmd(&t, &[&input], &t.path("other/p0")).args(["--part", "0/3", "--no-eos"]));
    ok(&mut tokenize_cmd(&t, &[&input], &t.path("whole")));

    let err = fails(
        t.prep()
            .arg("merge")
            .arg(run.join("p0"))
            .arg(run.join("p2"))
            .arg(&run),
        2,
    );
    assert!(
        err.contains("has 3 parts and 2 were given; missing part 1"),
        "{err}"
    );
    let err = fails(
        t.prep()
            .arg("merge")
            .args([
                run.join("p0"),
                run.join("p0"),
                run.join("p1"),
                run.join("p2"),
            ])
            .arg(&run),
        2,
    );
    assert!(err.contains("given twice"), "{err}");
    let err = fails(
        t.prep()
            .arg("merge")
            .args([t.path("other/p0"), run.join("p1"), run.join("p2")])
            .arg(&run),
        2,
    );
    assert!(err.contains("differ"), "{err}");
    let err = fails(
        t.prep()
            .arg("merge")
            .arg(t.path("whole"))
            .arg(t.path("out")),
        2,
    );
    assert!(err.contains("not a partial dataset"), "{err}");
    // A manifest claiming a part number past the run's count.
    let path = run.join("p2/manifest.json");
    let mut m: serde_json::Value = serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
    m["partition"]["part"] = 5.into();
    std::fs::write(&path, m.to_string()).unwrap();
    let err = fails(
        t.prep()
            .arg("merge")
            .args([run.join("p0"), run.join("p1"), run.join("p2")])
            .arg(&run),
        2,
    );
    assert!(
        err.contains("part 5 of a run of 3 parts does not exist"),
        "{err}"
    );
    assert!(!run.join("manifest.json").exists());
    assert!(!t.path("out/manifest.json").exists());
}

#[test]
fn parts_outside_the_output_are_linked_or_copied() {
    let t = TestDir::new();
    let input = corpus(&t);
    let parts: Vec<PathBuf> = (0..3).map(|i| t.path(&format!("parts/p{i}"))).collect();
    for (i, p) in parts.iter().enumerate() {
        ok(tokenize_cmd(&t, &[&input], p).args(["--part", &format!("{i}/3")]));
    }
    let one = t.path("one");
    ok(&mut tokenize_cmd(&t, &[&input], &one));
    for (out, copy) in [(t.path("linked"), false), (t.path("copied"), true)] {
        let mut cmd = t.prep();
        cmd.arg("merge").args(&parts).arg(&out);
        if copy {
            cmd.arg("--copy");
        }
        ok(&mut cmd);
        assert_eq!(records(&out), records(&one));
        ok(t.prep().arg("validate").arg(&out));
        let m = Manifest::read(&out).unwrap();
        let first = Manifest::read(&parts[0]).unwrap();
        use std::os::unix::fs::MetadataExt;
        let ino = |p: PathBuf| std::fs::metadata(p).unwrap().ino();
        let same = ino(out.join(&m.shards[0].bin)) == ino(parts[0].join(&first.shards[0].bin));
        assert_eq!(same, !copy, "hard link exactly when not copying");
        // The merge is recognised when run again; the parts can then go
        // (the linked or copied files are the dataset's own).
        let again = ok(t.prep().arg("merge").args(&parts).arg(&out));
        assert!(String::from_utf8_lossy(&again.stderr).contains("already"));
    }
    std::fs::remove_dir_all(t.path("parts")).unwrap();
    assert_eq!(records(&t.path("linked")), records(&one));
    ok(t.prep().arg("validate").arg(t.path("copied")));
}

/// `prep merge` over every part in `dir` named `prefix*`.
fn merge_all(t: &TestDir, dir: &Path, prefix: &str) {
    let mut parts: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.file_name().unwrap().to_string_lossy().starts_with(prefix))
        .collect();
    parts.sort();
    ok(t.prep().arg("merge").arg("--quiet").args(&parts).arg(dir));
}

/// Rows and their segments, for comparing packed datasets.
fn rows_and_segments(dir: &Path) -> Vec<(Vec<u32>, Vec<prep::format::Segment>)> {
    let ds = prep::Dataset::open(dir).unwrap();
    (0..ds.len())
        .map(|i| {
            (
                ds.record(i).unwrap().to_vec(),
                ds.segments(i).unwrap().to_vec(),
            )
        })
        .collect()
}

#[test]
fn the_whole_pipeline_as_tasks_equals_one_machine() {
    let t = TestDir::new();
    let input = corpus(&t);
    let one = t.path("one");
    ok(&mut tokenize_cmd(&t, &[&input], &one.join("tokenized")));
    ok(t.prep()
        .arg("shuffle")
        .arg(one.join("tokenized"))
        .arg(one.join("shuffled"))
        .args(["--seed", "5", "-q"]));
    for (mode, extra) in [
        ("bestfit", vec!["--window", "90"]),
        ("concat", vec!["--seed", "2"]),
    ] {
        ok(t.prep()
            .arg("pack")
            .arg(one.join("shuffled"))
            .arg(one.join(mode))
            .args(["--seq-len", "64", "--mode", mode, "-q"])
            .args(&extra));
    }
    for (n, b) in [(3u64, 4u64), (7, 2)] {
        let run = t.path(&format!("run-{n}-{b}"));
        tokenize_parts(&t, &input, &run.join("tokenized"), n, &[]);
        for i in 0..n {
            ok(t.prep()
                .arg("shuffle")
                .arg(run.join("tokenized"))
                .arg(run.join("scatter"))
                .args([
                    "--seed",
                    "5",
                    "--scatter",
                    "--part",
                    &format!("{i}/{n}"),
                    "--buckets",
                    &b.to_string(),
                    "-q",
                ]));
        }
        for j in 0..b {
            ok(t.prep()
                .arg("shuffle")
                .arg(run.join("scatter"))
                .arg(run.join(format!("shuffled/bucket-{j:05}")))
                .args(["--gather", "--bucket", &j.to_string(), "-q"]));
        }
        merge_all(&t, &run.join("shuffled"), "bucket-");
        assert_eq!(
            records(&run.join("shuffled")),
            records(&one.join("shuffled"))
        );
        for (mode, extra) in [
            ("bestfit", vec!["--window", "90"]),
            ("concat", vec!["--seed", "2"]),
        ] {
            let out = run.join(mode);
            for i in 0..n {
                ok(t.prep()
                    .arg("pack")
                    .arg(run.join("shuffled"))
                    .arg(out.join(format!("part-{i:05}")))
                    .args([
                        "--seq-len",
                        "64",
                        "--mode",
                        mode,
                        "--part",
                        &format!("{i}/{n}"),
                        "-q",
                    ])
                    .args(&extra));
            }
            merge_all(&t, &out, "part-");
            assert_eq!(
                rows_and_segments(&out),
                rows_and_segments(&one.join(mode)),
                "{mode}, {n} parts"
            );
            let (a, b) = (
                Manifest::read(&out).unwrap(),
                Manifest::read(&one.join(mode)).unwrap(),
            );
            assert_eq!(a.packing, b.packing, "{mode}");
            assert_eq!(a.provenance.documents, b.provenance.documents, "{mode}");
            ok(t.prep().arg("validate").arg(&out));
        }
    }
}

#[test]
fn a_killed_part_resumes_to_the_same_bytes_and_hashes() {
    let t = TestDir::new();
    let input = corpus(&t);
    let args = [
        "--part",
        "1/2",
        "--dedup",
        "--shard-size",
        "1KB",
        "--threads",
        "1",
    ];
    let whole = t.path("whole");
    ok(tokenize_cmd(&t, &[&input], &whole).args(args));
    let killed = t.path("killed");
    let mut cmd = tokenize_cmd(&t, &[&input], &killed);
    cmd.args(args);
    common::kill_after_shards(cmd, &killed, 3);
    ok(tokenize_cmd(&t, &[&input], &killed).args(args));
    let m = Manifest::read(&whole).unwrap();
    assert!(m.shards.len() > 4, "{} shards", m.shards.len());
    let names = m
        .shards
        .iter()
        .flat_map(|s| [s.bin.clone(), s.idx.clone()])
        .chain(["hashes.bin".to_owned()]);
    for name in names {
        let (a, b) = (whole.join(&name), killed.join(&name));
        assert_eq!(
            std::fs::read(a).unwrap(),
            std::fs::read(b).unwrap(),
            "{name}"
        );
    }
    assert_eq!(Manifest::read(&killed).unwrap().partition, m.partition);
}

/// Issue 51: merge lists each part's shards in its manifest, linked,
/// copied or referenced in place, so it checks each before vouching for
/// it: a part with a flipped byte is refused by its file and chunk, and
/// nothing is committed, whether the part lies outside the output or in it.
#[test]
fn a_damaged_part_is_refused_by_name_and_nothing_is_committed() {
    let t = TestDir::new();
    let input = common::fixture("validate/good");
    for inside in [false, true] {
        let run = t.path(if inside { "inside" } else { "outside" });
        let parts = if inside { run.clone() } else { t.path("parts") };
        for i in 0..2 {
            ok(t.prep()
                .arg("pack")
                .arg(&input)
                .arg(parts.join(format!("p{i}")))
                .args(["--seq-len", "8", "--quiet", "--part", &format!("{i}/2")]));
        }
        let bin = parts.join("p1/shard-00000.bin");
        let mut bytes = std::fs::read(&bin).unwrap();
        bytes[3] ^= 0x10;
        std::fs::write(&bin, &bytes).unwrap();
        let out = if inside {
            run.clone()
        } else {
            t.path("merged")
        };
        common::damage::refused(
            t.prep()
                .args(["merge", "--quiet"])
                .arg(parts.join("p0"))
                .arg(parts.join("p1"))
                .arg(&out),
            "p1/shard-00000.bin",
            "XXH3",
            &out,
        );
        // Taken again without the damage: the merge goes through.
        bytes[3] ^= 0x10;
        std::fs::write(&bin, &bytes).unwrap();
        ok(t.prep()
            .args(["merge", "--quiet"])
            .arg(parts.join("p0"))
            .arg(parts.join("p1"))
            .arg(&out));
    }
}
