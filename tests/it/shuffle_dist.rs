//! `prep shuffle --scatter` and `--gather`: the buckets gathered in order are
//! the one-machine shuffle, record for record, for any number of parts and
//! buckets; every task can be run again; damaged or mixed work is refused.

use std::path::{Path, PathBuf};
use std::process::Command;

use crate::common::*;
use prep::format::Dtype;

/// `n` records of pseudo-random lengths 0..40 (some empty), their tokens
/// telling them apart: record `i` starts with `base + i`.
fn records_of(n: usize, base: u32, seed: u64) -> Vec<Vec<u32>> {
    let mut next = xorshift(seed);
    (0..n)
        .map(|i| {
            let len = (next() % 40) as usize;
            let mut r: Vec<u32> = (0..len).map(|_| (next() % 60_000) as u32).collect();
            if let Some(first) = r.first_mut() {
                *first = base + i as u32;
            }
            r
        })
        .collect()
}

/// A uint16 dataset of `records` in shards of at most `shard_size` bytes.
fn dataset(t: &TestDir, name: &str, records: &[Vec<u32>], shard_size: u64) -> PathBuf {
    let dir = t.path(name);
    std::fs::create_dir_all(&dir).unwrap();
    write_dataset(&dir, Dtype::U16, shard_size, records);
    dir
}

fn scatter_cmd(
    t: &TestDir,
    inputs: &[&Path],
    work: &Path,
    seed: u64,
    part: &str,
    buckets: u64,
) -> Command {
    let mut cmd = t.prep();
    cmd.arg("shuffle")
        .args(inputs)
        .arg(work)
        .args([
            "--quiet",
            "--scatter",
            "--seed",
            &seed.to_string(),
            "--part",
            part,
        ])
        .args(["--buckets", &buckets.to_string()]);
    cmd
}

fn gather_cmd(t: &TestDir, work: &Path, out: &Path, bucket: u64) -> Command {
    let mut cmd = t.prep();
    cmd.arg("shuffle").arg(work).arg(out).args([
        "--quiet",
        "--gather",
        "--bucket",
        &bucket.to_string(),
    ]);
    cmd
}

/// Runs every scatter task of `parts` parts into `work`.
fn scatter_all(t: &TestDir, inputs: &[&Path], work: &Path, seed: u64, parts: u64, buckets: u64) {
    for i in 0..parts {
        ok(&mut scatter_cmd(
            t,
            inputs,
            work,
            seed,
            &format!("{i}/{parts}"),
            buckets,
        ));
    }
}

/// Runs every gather task into `{prefix}-J`, with `extra` arguments;
/// returns the outputs in bucket order.
fn gather_all(
    t: &TestDir,
    work: &Path,
    prefix: &str,
    buckets: u64,
    extra: &[&str],
) -> Vec<PathBuf> {
    (0..buckets)
        .map(|j| {
            let out = t.path(&format!("{prefix}-{j}"));
            ok(gather_cmd(t, work, &out, j).args(extra));
            out
        })
        .collect()
}

/// The records of `outs`, one after the other.
fn concatenated(outs: &[PathBuf]) -> Vec<Vec<u32>> {
    outs.iter().flat_map(|o| records(o)).collect()
}

/// The one-machine shuffle of `inputs`, into `out`.
fn one_machine(t: &TestDir, inputs: &[&Path], out: &Path, seed: u64) -> Vec<Vec<u32>> {
    ok(t.prep().arg("shuffle").args(inputs).arg(out).args([
        "--quiet",
        "--seed",
        &seed.to_string(),
    ]));
    records(out)
}

/// Every file of a directory (names sorted) with its bytes.
fn files(dir: &Path) -> Vec<(String, Vec<u8>)> {
    let mut all: Vec<(String, Vec<u8>)> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap())
        .filter(|e| e.file_type().unwrap().is_file())
        .map(|e| {
            (
                e.file_name().to_string_lossy().into_owned(),
                std::fs::read(e.path()).unwrap(),
            )
        })
        .collect();
    all.sort();
    all
}

/// The shard files of a dataset with their bytes (the manifest has a time stamp).
fn shard_files(dir: &Path) -> Vec<(String, Vec<u8>)> {
    files(dir)
        .into_iter()
        .filter(|(name, _)| name.starts_with("shard-"))
        .collect()
}

fn validates(t: &TestDir, dir: &Path) {
    let out = run(t.prep().arg("validate").arg(dir));
    assert!(
        out.status.success(),
        "{} does not validate: {}{}",
        dir.display(),
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn gathered_buckets_in_order_are_the_one_machine_shuffle() {
    let t = TestDir::new();
    let docs = records_of(60, 1, 0x9e37_79b9_7f4a_7c15);
    // Small shards, so that parts start and end inside and across shards.
    let input = dataset(&t, "in", &docs, 200);
    let expected = one_machine(&t, &[&input], &t.path("whole"), 17);
    assert_ne!(expected, docs, "60 documents left in order");
    for parts in [1u64, 2, 3, 7] {
        for buckets in [1u64, 2, 5] {
            let work = t.path(&format!("work-{parts}-{buckets}"));
            scatter_all(&t, &[&input], &work, 17, parts, buckets);
            let outs = gather_all(&t, &work, &format!("out-{parts}-{buckets}"), buckets, &[]);
            assert_eq!(
                concatenated(&outs),
                expected,
                "{parts} parts, {buckets} buckets"
            );
            for (j, out) in outs.iter().enumerate() {
                let ds = prep::Dataset::open(out).unwrap();
                let p = ds.manifest().partition.as_ref().expect("a partition block");
                assert_eq!(
                    (p.stage.as_str(), p.part, p.parts),
                    ("shuffle", j as u64, buckets)
                );
            }
        }
    }
}

#[test]
fn more_buckets_than_documents_and_empty_inputs() {
    let t = TestDir::new();
    let docs = records_of(3, 1, 7);
    let input = dataset(&t, "in", &docs, 1 << 20);
    let expected = one_machine(&t, &[&input], &t.path("whole"), 5);
    let work = t.path("work");
    scatter_all(&t, &[&input], &work, 5, 5, 8);
    let outs = gather_all(&t, &work, "out", 8, &[]);
    assert_eq!(concatenated(&outs), expected);
    let empty = outs.iter().filter(|o| records(o).is_empty()).count();
    assert!(empty >= 5, "3 documents fill at most 3 of 8 buckets");
    for out in &outs {
        validates(&t, out);
    }

    // No document at all: every part and every bucket is empty.
    let none = dataset(&t, "none", &[], 1 << 20);
    let work = t.path("work-none");
    scatter_all(&t, &[&none], &work, 5, 2, 3);
    let outs = gather_all(&t, &work, "none-out", 3, &[]);
    assert!(concatenated(&outs).is_empty());
    assert!(one_machine(&t, &[&none], &t.path("none-whole"), 5).is_empty());
    for out in &outs {
        validates(&t, out);
    }
}

#[test]
fn several_inputs_are_numbered_as_one_machine_numbers_them() {
    let t = TestDir::new();
    let a = dataset(&t, "a", &records_of(25, 1, 1), 100);
    let b = dataset(&t, "b", &records_of(0, 1000, 2), 100);
    let c = dataset(&t, "c", &records_of(31, 2000, 3), 1 << 20);
    let inputs = [a.as_path(), b.as_path(), c.as_path()];
    let expected = one_machine(&t, &inputs, &t.path("whole"), 99);
    let work = t.path("work");
    scatter_all(&t, &inputs, &work, 99, 3, 4);
    let outs = gather_all(&t, &work, "out", 4, &[]);
    assert_eq!(concatenated(&outs), expected);
    let ds = prep::Dataset::open(&outs[0]).unwrap();
    let p = &ds.manifest().provenance;
    assert_eq!(p.command, "shuffle");
    assert_eq!(p.inputs.len(), 3);
    assert_eq!(
        (p.options["seed"].as_u64(), p.options["buckets"].as_u64()),
        (Some(99), Some(4))
    );
    assert_eq!(p.documents.written, ds.len());
}

#[test]
fn threads_and_reruns_give_the_same_bytes() {
    let t = TestDir::new();
    let input = dataset(&t, "in", &records_of(2000, 1, 11), 1 << 20);
    let work = t.path("work");
    scatter_all(&t, &[&input], &work, 3, 3, 2);
    // Scatter again elsewhere, from scratch and with the smallest write
    // buffers: the same files, byte for byte.
    let again = t.path("again");
    for i in 0..3 {
        ok(scatter_cmd(&t, &[&input], &again, 3, &format!("{i}/3"), 2).args(["--memory", "16KiB"]));
    }
    let err = fails(
        scatter_cmd(&t, &[&input], &t.path("tight"), 3, "0/3", 100).args(["--memory", "64KiB"]),
        2,
    );
    assert!(err.contains("100 buckets need at least"), "{err}");
    for i in 0..3 {
        let name = format!("scatter-{i:05}");
        assert_eq!(
            files(&work.join(&name)),
            files(&again.join(&name)),
            "{name}"
        );
    }
    // A complete part run again does nothing.
    let data = work.join("scatter-00001").join("buckets.bin");
    let written = std::fs::metadata(&data).unwrap().modified().unwrap();
    let rerun = ok(&mut scatter_cmd(&t, &[&input], &work, 3, "1/3", 2));
    assert!(
        rerun.stderr.is_empty(),
        "{}",
        String::from_utf8_lossy(&rerun.stderr)
    );
    assert_eq!(
        std::fs::metadata(&data).unwrap().modified().unwrap(),
        written
    );

    // Small shards, so the sort's output spans several.
    let one = gather_all(
        &t,
        &work,
        "t1",
        2,
        &["--threads", "1", "--shard-size", "4KiB"],
    );
    let three = gather_all(
        &t,
        &work,
        "t3",
        2,
        &["--threads", "3", "--shard-size", "4KiB"],
    );
    for (a, b) in one.iter().zip(&three) {
        assert!(shard_files(a).len() > 2, "several shards");
        assert_eq!(shard_files(a), shard_files(b));
        validates(&t, a);
    }
    // A complete gather run again does nothing: even the manifest is untouched.
    let before = files(&one[0]);
    ok(gather_cmd(&t, &work, &one[0], 0).args(["--shard-size", "4KiB"]));
    assert_eq!(files(&one[0]), before);
    // Another bucket into it is refused, and replaces it with --overwrite.
    let err = fails(&mut gather_cmd(&t, &work, &one[0], 1), 2);
    assert!(err.contains("--overwrite"), "{err}");
    ok(gather_cmd(&t, &work, &one[0], 1).args(["--overwrite", "--shard-size", "4KiB"]));
    assert_eq!(shard_files(&one[0]), shard_files(&one[1]));
}

#[test]
fn an_unfinished_scatter_part_is_done_again() {
    let t = TestDir::new();
    let input = dataset(&t, "in", &records_of(50, 1, 5), 1 << 20);
    let work = t.path("work");
    scatter_all(&t, &[&input], &work, 8, 2, 3);
    let part = work.join("scatter-00001");
    let complete = files(&part);
    // A damaged data file under a complete scatter.json: the part is done again.
    let data = part.join("buckets.bin");
    let len = std::fs::metadata(&data).unwrap().len();
    std::fs::OpenOptions::new()
        .write(true)
        .open(&data)
        .unwrap()
        .set_len(len - 1)
        .unwrap();
    ok(&mut scatter_cmd(&t, &[&input], &work, 8, "1/2", 3));
    assert_eq!(files(&part), complete);
}

#[test]
fn a_missing_part_is_named() {
    let t = TestDir::new();
    let input = dataset(&t, "in", &records_of(30, 1, 9), 1 << 20);
    let work = t.path("work");
    for part in ["0/3", "2/3"] {
        ok(&mut scatter_cmd(&t, &[&input], &work, 1, part, 2));
    }
    let err = fails(&mut gather_cmd(&t, &work, &t.path("out"), 0), 2);
    assert!(
        err.contains("scatter-00001") && err.contains("scatter.json"),
        "{err}"
    );
    assert!(
        err.contains("1 of the 3 scatter parts") && err.contains("parts 1)"),
        "{err}"
    );
    assert!(!t.path("out").join("manifest.json").exists());

    // Started but not finished: the same.
    std::fs::create_dir(work.join("scatter-00001")).unwrap();
    let err = fails(&mut gather_cmd(&t, &work, &t.path("out"), 0), 2);
    assert!(err.contains("scatter-00001"), "{err}");
    // Finished, and the bucket past the last is refused.
    ok(&mut scatter_cmd(&t, &[&input], &work, 1, "1/3", 2));
    let err = fails(&mut gather_cmd(&t, &work, &t.path("out"), 2), 2);
    assert!(err.contains("bucket 2 does not exist"), "{err}");
    ok(&mut gather_cmd(&t, &work, &t.path("out"), 1));
}

#[test]
fn a_corrupted_region_is_named() {
    let t = TestDir::new();
    let input = dataset(&t, "in", &records_of(40, 1, 13), 1 << 20);
    let work = t.path("work");
    scatter_all(&t, &[&input], &work, 2, 2, 3);
    let part = work.join("scatter-00001");
    let info: serde_json::Value =
        serde_json::from_slice(&std::fs::read(part.join("scatter.json")).unwrap()).unwrap();
    let region = &info["regions"][1];
    assert!(region["records"].as_u64().unwrap() > 0);
    // Flip one token byte in the middle of bucket 1's region.
    let data = part.join("buckets.bin");
    let mut bytes = std::fs::read(&data).unwrap();
    let at = (region["offset"].as_u64().unwrap() + region["bytes"].as_u64().unwrap() / 2) as usize;
    bytes[at] ^= 0x40;
    std::fs::write(&data, &bytes).unwrap();
    let err = fails(&mut gather_cmd(&t, &work, &t.path("out-1"), 1), 2);
    assert!(err.contains(&data.display().to_string()), "{err}");
    assert!(err.contains("bucket 1"), "{err}");
    assert!(!t.path("out-1").join("manifest.json").exists());
    // The other buckets' regions are intact.
    ok(&mut gather_cmd(&t, &work, &t.path("out-0"), 0));
    ok(&mut gather_cmd(&t, &work, &t.path("out-2"), 2));

    // A truncated data file is named too.
    std::fs::write(&data, &bytes[..bytes.len() - 3]).unwrap();
    let err = fails(&mut gather_cmd(&t, &work, &t.path("out-0b"), 0), 2);
    assert!(err.contains(&data.display().to_string()), "{err}");
}

#[test]
fn parts_of_different_runs_are_not_gathered_together() {
    let t = TestDir::new();
    let input = dataset(&t, "in", &records_of(30, 1, 21), 1 << 20);
    let work = t.path("work");
    ok(&mut scatter_cmd(&t, &[&input], &work, 1, "0/2", 2));
    ok(&mut scatter_cmd(&t, &[&input], &work, 2, "1/2", 2));
    let err = fails(&mut gather_cmd(&t, &work, &t.path("out"), 0), 2);
    assert!(
        err.contains("scatter-00001/scatter.json")
            && err.contains("another run")
            && err.contains("seed 2, not 1"),
        "{err}"
    );
    // A part of the first run in the directory of another's: refused...
    let err = fails(&mut scatter_cmd(&t, &[&input], &work, 1, "1/2", 2), 2);
    assert!(
        err.contains("scatter-00001") && err.contains("--overwrite"),
        "{err}"
    );
    // ...unless replaced; then the run is whole.
    ok(scatter_cmd(&t, &[&input], &work, 1, "1/2", 2).arg("--overwrite"));
    let outs = gather_all(&t, &work, "out", 2, &[]);
    assert_eq!(
        concatenated(&outs),
        one_machine(&t, &[&input], &t.path("whole"), 1)
    );

    // A leftover part past the run's last.
    ok(&mut scatter_cmd(&t, &[&input], &work, 1, "2/3", 2));
    let err = fails(&mut gather_cmd(&t, &work, &t.path("out-x"), 0), 2);
    assert!(
        err.contains("scatter-00002") && err.contains("another run"),
        "{err}"
    );
}

#[test]
fn a_tokenized_input_gathers_into_valid_datasets_with_the_tokenizer() {
    let t = TestDir::new();
    let text: Vec<String> = (0..40).map(|i| "a b ".repeat(i % 7 + 1) + "c").collect();
    let text: Vec<&str> = text.iter().map(String::as_str).collect();
    let corpus = t.write("c.jsonl", jsonl(&text));
    let tok = word_level(
        &t,
        "w.json",
        &[("[UNK]", 0), ("a", 1), ("b", 2), ("c", 3)],
        &[],
    );
    let input = t.path("in");
    ok(&mut tokenize_with(&t, &tok, &[&corpus], &input));
    let work = t.path("work");
    scatter_all(&t, &[&input], &work, 4, 2, 2);
    assert!(work.join("scatter-00000").join("tokenizer.json").is_file());
    let outs = gather_all(&t, &work, "out", 2, &[]);
    assert_eq!(
        concatenated(&outs),
        one_machine(&t, &[&input], &t.path("whole"), 4)
    );
    let whole = prep::Dataset::open(t.path("whole")).unwrap();
    for out in &outs {
        validates(&t, out);
        assert_eq!(
            std::fs::read(out.join("tokenizer.json")).unwrap(),
            std::fs::read(input.join("tokenizer.json")).unwrap()
        );
        let ds = prep::Dataset::open(out).unwrap();
        let (m, w) = (ds.manifest(), whole.manifest());
        assert_eq!(m.kind, "documents");
        assert_eq!(
            (m.dtype, m.vocab_size, &m.tokenizer),
            (w.dtype, w.vocab_size, &w.tokenizer)
        );
        assert_eq!(
            (m.special_tokens, m.eos_appended),
            (w.special_tokens, w.eos_appended)
        );
    }
    // The job is one fingerprint for the whole run, in every bucket.
    let job = |o: &Path| {
        prep::Dataset::open(o)
            .unwrap()
            .manifest()
            .partition
            .clone()
            .unwrap()
            .job
    };
    assert_eq!(job(&outs[0]), job(&outs[1]));
}

#[test]
fn flags_that_make_no_sense_together_are_refused() {
    let t = TestDir::new();
    let input = dataset(&t, "in", &records_of(5, 1, 1), 1 << 20);
    let (w, o) = (t.path("work"), t.path("out"));
    let shuffle = |args: &[&str], dirs: &[&PathBuf]| {
        let mut cmd = t.prep();
        cmd.arg("shuffle").args(dirs).args(args);
        cmd
    };
    for (args, dirs) in [
        (
            &["--gather", "--bucket", "0", "--part", "0/2"][..],
            &[&w, &o][..],
        ),
        (&["--gather", "--bucket", "0", "--seed", "1"], &[&w, &o]),
        (&["--gather"], &[&w, &o]),
        (
            &["--scatter", "--seed", "1", "--part", "0/2"],
            &[&input, &w],
        ),
        (
            &["--scatter", "--seed", "1", "--buckets", "2"],
            &[&input, &w],
        ),
        (
            &["--scatter", "--part", "0/2", "--buckets", "2"],
            &[&input, &w],
        ),
        (
            &[
                "--scatter",
                "--seed",
                "1",
                "--part",
                "0/2",
                "--buckets",
                "0",
            ],
            &[&input, &w],
        ),
        (
            &[
                "--scatter",
                "--seed",
                "1",
                "--part",
                "2/2",
                "--buckets",
                "2",
            ],
            &[&input, &w],
        ),
        (
            &[
                "--scatter",
                "--gather",
                "--seed",
                "1",
                "--part",
                "0/2",
                "--buckets",
                "2",
            ],
            &[&input, &w],
        ),
        (
            &[
                "--scatter",
                "--seed",
                "1",
                "--part",
                "0/2",
                "--buckets",
                "2",
                "--shard-size",
                "1MiB",
            ],
            &[&input, &w],
        ),
        (&["--seed", "1", "--buckets", "2"], &[&input, &o]),
        (&["--seed", "1", "--bucket", "0"], &[&input, &o]),
        (
            &["--seed", "1", "--part", "0/2", "--shard-size", "1MiB"],
            &[&input, &o],
        ),
        (
            &["--seed", "1", "--buckets", "2", "--shard-size", "1MiB"],
            &[&input, &o],
        ),
        (&["--gather", "--bucket", "0"], &[&input, &w, &o]),
    ] {
        let err = fails(&mut shuffle(args, dirs), 2);
        assert!(!err.is_empty(), "{args:?}");
    }
    assert!(!w.exists() && !o.exists(), "nothing was written");
}

/// Issue 51: a scatter task reads its inputs through their checks, as the
/// one-machine shuffle does: a damaged input is refused by name and chunk,
/// and the part does not finish (no scatter.json for a gather to take).
#[test]
fn a_scatter_of_a_damaged_input_is_refused_by_name() {
    let t = TestDir::new();
    let input = damage::fixture_copy(&t, "flipped_bin");
    let work = t.path("work");
    let err = fails(&mut scatter_cmd(&t, &[&input], &work, 3, "0/1", 4), 2);
    assert!(err.contains("flipped_bin/shard-00001.bin"), "{err}");
    assert!(err.contains("chunk 0"), "{err}");
    let finished: Vec<_> = walkdir(&work)
        .into_iter()
        .filter(|p| p.ends_with("scatter.json"))
        .collect();
    assert!(finished.is_empty(), "{finished:?}");
}

/// Every file under `dir` (none when it does not exist).
fn walkdir(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let Ok(entries) = std::fs::read_dir(dir) else {
        return out;
    };
    for e in entries.flatten() {
        if e.file_type().unwrap().is_dir() {
            out.extend(walkdir(&e.path()));
        } else {
            out.push(e.path());
        }
    }
    out
}
