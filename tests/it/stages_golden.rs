//! Golden bytes of every stage: each stage, run on the committed fixtures
//! with fixed flags, writes data files whose XXH3-64 are those recorded in
//! `fixtures/golden/stages.json`.
//!
//! The record was written by the binary of an earlier release and is kept
//! as it is while the code around the stages is reorganised: a change that
//! alters one byte of a shard, an index, a segment file or an exported file
//! fails here, naming the stage, the flags and the file. Manifests are left
//! out (they carry fingerprints and times, which are not data); the shard
//! checksums they list are the data files' own, checked here directly.
//!
//! Covered: tokenize on the HF and the fast engine (u16 and u32 ids,
//! JSONL and Parquet), `--dedup`, `--shuffle-seed` (in memory and out of
//! core), `--part` runs merged; shuffle in memory, out of core, and
//! scattered and gathered; pack in both modes, and `--part` runs merged;
//! mix, and `--part` runs merged; split, and `--part` runs merged; export
//! to every format.
//!
//! To record a deliberate change of output: `PREP_BLESS=1 cargo test --test it
//! stages_golden::`, then say why in the commit.

use crate::common;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use crate::common::{fixture, ok, TestDir};

type Files = BTreeMap<String, String>;

fn record_path() -> PathBuf {
    fixture("golden/stages.json")
}

/// XXH3-64 of every file below `dir` but manifests, by relative path.
fn data_files(dir: &Path) -> Files {
    let mut out = Files::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for entry in std::fs::read_dir(&d).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                stack.push(path);
                continue;
            }
            let rel = path
                .strip_prefix(dir)
                .unwrap()
                .to_string_lossy()
                .into_owned();
            if path.file_name().is_some_and(|n| n == "manifest.json") {
                continue;
            }
            let bytes = std::fs::read(&path).unwrap();
            out.insert(rel, format!("{:016x}", xxhash_rust::xxh3::xxh3_64(&bytes)));
        }
    }
    out
}

/// The GPT-2 tokenization of the JSONL excerpt, made in the test's own
/// directory (a dataset kept for the process's life outlived it on disk:
/// nextest runs each test as a process of its own, and nothing dropped it).
fn base(t: &TestDir) -> PathBuf {
    let out = t.path("base");
    ok(tokenize(t, &out).args(["--engine", "fast", "--threads", "2"]));
    out
}

fn tokenize(t: &TestDir, out: &Path) -> std::process::Command {
    let mut cmd = common::tokenize_cmd(t, &[fixture("corpus/debian-sample.jsonl.zst")], out);
    cmd.args(["--shard-size", "256KiB"]);
    cmd
}

/// Compares (or, with PREP_BLESS=1, records) the data files of each
/// `(case, dir)`.
fn check(cases: &[(&str, &Path)]) {
    let bless = std::env::var_os("PREP_BLESS").is_some_and(|v| v == "1");
    let path = record_path();
    if bless {
        // Cases run in parallel: one writer at a time.
        static LOCK: std::sync::Mutex<()> = std::sync::Mutex::new(());
        let _guard = LOCK.lock().unwrap_or_else(|e| e.into_inner());
        let mut all: BTreeMap<String, Files> = std::fs::read(&path)
            .ok()
            .map(|b| serde_json::from_slice(&b).unwrap())
            .unwrap_or_default();
        for (case, dir) in cases {
            all.insert(case.to_string(), data_files(dir));
        }
        let text = serde_json::to_string_pretty(&all).unwrap() + "\n";
        std::fs::write(&path, text).unwrap();
        return;
    }
    let all: BTreeMap<String, Files> =
        serde_json::from_slice(&std::fs::read(&path).expect("fixtures/golden/stages.json"))
            .unwrap();
    let mut failures = Vec::new();
    for (case, dir) in cases {
        let Some(want) = all.get(*case) else {
            failures.push(format!(
                "{case}: no record (run with PREP_BLESS=1 to add it)"
            ));
            continue;
        };
        let got = data_files(dir);
        for (file, hash) in want {
            match got.get(file) {
                None => failures.push(format!("{case}: {file} is missing")),
                Some(h) if h != hash => {
                    failures.push(format!("{case}: {file} differs ({h}, recorded {hash})"))
                }
                Some(_) => {}
            }
        }
        for file in got.keys().filter(|f| !want.contains_key(*f)) {
            failures.push(format!("{case}: {file} was not written before"));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

fn merge(t: &TestDir, parts: &[PathBuf], out: &Path) {
    ok(t.prep().arg("merge").args(parts).arg(out).arg("--quiet"));
}

#[test]
fn tokenize_both_engines_dedup_and_parquet() {
    let t = TestDir::new();
    let base = base(&t);
    let hf = t.path("hf");
    ok(tokenize(&t, &hf).args(["--engine", "hf", "--threads", "2"]));
    let dedup = t.path("dedup");
    ok(tokenize(&t, &dedup).args(["--dedup", "--threads", "1"]));
    let parquet = t.path("parquet");
    ok(
        common::tokenize_cmd(&t, &[fixture("corpus/debian-sample.parquet")], &parquet)
            .args(["--shard-size", "256KiB"]),
    );
    let u32_ids = t.path("deepseek");
    ok(common::tokenize_with(
        &t,
        &fixture("tokenizers/deepseek-v3.tokenizer.json.zst"),
        &[fixture("corpus/debian-sample.jsonl.zst")],
        &u32_ids,
    )
    .args(["--shard-size", "512KiB", "--engine", "fast"]));
    check(&[
        ("tokenize-fast", &base),
        ("tokenize-hf", &hf),
        ("tokenize-dedup", &dedup),
        ("tokenize-parquet", &parquet),
        ("tokenize-deepseek-fast", &u32_ids),
    ]);
}

#[test]
fn tokenize_shuffled_and_partitioned() {
    let t = TestDir::new();
    let shuffled = t.path("shuffled");
    ok(tokenize(&t, &shuffled).args(["--shuffle-seed", "7"]));
    let out_of_core = t.path("shuffled-ooc");
    ok(tokenize(&t, &out_of_core).args(["--shuffle-seed", "7", "--memory", "256KiB"]));
    let parts: Vec<PathBuf> = (0..3)
        .map(|i| {
            let out = t.path(&format!("part-{i}"));
            ok(tokenize(&t, &out).args(["--part", &format!("{i}/3")]));
            out
        })
        .collect();
    let merged = t.path("merged");
    merge(&t, &parts, &merged);
    check(&[
        ("tokenize-shuffle-seed", &shuffled),
        ("tokenize-shuffle-seed-out-of-core", &out_of_core),
        ("tokenize-part-0", &parts[0]),
        ("tokenize-parts-merged", &merged),
    ]);
}

#[test]
fn shuffle_in_memory_out_of_core_and_scattered() {
    let t = TestDir::new();
    let base = base(&t);
    let shuffle = |out: &Path, extra: &[&str]| {
        ok(t.prep()
            .arg("shuffle")
            .arg(&base)
            .arg(out)
            .args(["--seed", "3", "--shard-size", "256KiB", "--quiet"])
            .args(extra));
    };
    let in_memory = t.path("in-memory");
    shuffle(&in_memory, &[]);
    let out_of_core = t.path("out-of-core");
    shuffle(&out_of_core, &["--memory", "256KiB", "--threads", "1"]);
    let work = t.path("work");
    for i in 0..2 {
        ok(t.prep().arg("shuffle").arg(&base).arg(&work).args([
            "--quiet",
            "--scatter",
            "--seed",
            "3",
            "--buckets",
            "3",
            "--part",
            &format!("{i}/2"),
        ]));
    }
    let buckets: Vec<PathBuf> = (0..3)
        .map(|j| {
            let out = t.path(&format!("bucket-{j}"));
            ok(t.prep().arg("shuffle").arg(&work).arg(&out).args([
                "--quiet",
                "--gather",
                "--bucket",
                &j.to_string(),
            ]));
            out
        })
        .collect();
    let merged = t.path("gathered");
    merge(&t, &buckets, &merged);
    check(&[
        ("shuffle-in-memory", &in_memory),
        ("shuffle-out-of-core", &out_of_core),
        ("shuffle-gathered-merged", &merged),
    ]);
}

#[test]
fn pack_both_modes_and_partitioned() {
    let t = TestDir::new();
    let base = base(&t);
    let pack = |out: &Path, extra: &[&str]| {
        ok(t.prep()
            .arg("pack")
            .arg(&base)
            .arg(out)
            .args(["--seq-len", "512", "--shard-size", "256KiB", "--quiet"])
            .args(extra));
    };
    let bestfit = t.path("bestfit");
    pack(&bestfit, &["--seed", "5"]);
    let concat = t.path("concat");
    pack(&concat, &["--mode", "concat", "--pad-last"]);
    let parts: Vec<PathBuf> = (0..2)
        .map(|i| {
            let out = t.path(&format!("part-{i}"));
            pack(&out, &["--mode", "concat", "--part", &format!("{i}/2")]);
            out
        })
        .collect();
    let merged = t.path("merged");
    merge(&t, &parts, &merged);
    check(&[
        ("pack-bestfit", &bestfit),
        ("pack-concat", &concat),
        ("pack-concat-parts-merged", &merged),
    ]);
}

#[test]
fn mix_and_split_whole_and_partitioned() {
    let t = TestDir::new();
    let base = base(&t);
    let other = t.path("parquet");
    ok(
        common::tokenize_cmd(&t, &[fixture("corpus/debian-sample.parquet")], &other)
            .args(["--shard-size", "256KiB"]),
    );
    let mix = |out: &Path, extra: &[&str]| {
        ok(t.prep()
            .arg("mix")
            .arg(out)
            .arg("--source")
            .arg(format!("{}:0.7", base.display()))
            .arg("--source")
            .arg(format!("{}:0.3", other.display()))
            .args([
                "--tokens",
                "400000",
                "--seed",
                "11",
                "--shard-size",
                "256KiB",
                "--quiet",
            ])
            .args(extra));
    };
    let mixed = t.path("mixed");
    mix(&mixed, &["--max-epochs", "2"]);
    let mix_parts: Vec<PathBuf> = (0..2)
        .map(|i| {
            let out = t.path(&format!("mix-part-{i}"));
            mix(&out, &["--max-epochs", "2", "--part", &format!("{i}/2")]);
            out
        })
        .collect();
    let mix_merged = t.path("mix-merged");
    merge(&t, &mix_parts, &mix_merged);

    let split = |out: &Path, extra: &[&str]| {
        ok(t.prep()
            .arg("split")
            .arg(&base)
            .arg(out)
            .args(["--val", "0.1", "--test", "0.05", "--seed", "2"])
            .args(["--shard-size", "256KiB", "--quiet"])
            .args(extra));
    };
    let sides = t.path("split");
    split(&sides, &[]);
    let split_parts: Vec<PathBuf> = (0..2)
        .map(|i| {
            let out = t.path(&format!("split-part-{i}"));
            split(&out, &["--part", &format!("{i}/2")]);
            out
        })
        .collect();
    let train_merged = t.path("train-merged");
    merge(
        &t,
        &split_parts
            .iter()
            .map(|p| p.join("train"))
            .collect::<Vec<_>>(),
        &train_merged,
    );
    check(&[
        ("mix", &mixed),
        ("mix-parts-merged", &mix_merged),
        ("split", &sides),
        ("split-parts-train-merged", &train_merged),
    ]);
}

#[test]
fn export_to_every_format() {
    let t = TestDir::new();
    let base = base(&t);
    let mut cases = Vec::new();
    for format in ["megatron", "nanogpt", "llmc", "datatrove"] {
        // A path prefix (megatron, datatrove), a file (nanogpt) or a
        // directory (llmc), inside a directory of its own.
        let out = t.path(format);
        let target = match format {
            "nanogpt" => out.join("train.bin"),
            _ => out.join("x"),
        };
        ok(t.prep()
            .arg("export")
            .arg(&base)
            .args(["--to", format])
            .arg(&target)
            .args(["--shard-tokens", "200000", "--quiet"]));
        cases.push((format!("export-{format}"), out));
    }
    let cases: Vec<(&str, &Path)> = cases
        .iter()
        .map(|(c, p)| (c.as_str(), p.as_path()))
        .collect();
    check(&cases);
}
