//! `prep shuffle`: a permutation, the one the seed names, uniform over
//! seeds, independent of memory and threads, in bounded memory.

use std::path::{Path, PathBuf};

use crate::common::*;
use prep::format::Dtype;
use prep::shuffle::{self, ShuffleConfig};
use prep::tokenize::NoProgress;

/// The demo corpus tokenized with GPT-2, once per test.
fn tokenized(t: &TestDir, name: &str) -> PathBuf {
    let out = t.path(name);
    ok(
        tokenize_cmd(t, &[fixture("corpus/debian-sample.jsonl.zst")], &out)
            .args(["--shard-size", "512KiB"]),
    );
    out
}

fn shuffled(
    inputs: &[&Path],
    out: &Path,
    seed: u64,
    memory: u64,
    threads: usize,
) -> shuffle::ShuffleReport {
    let mut config =
        ShuffleConfig::new(inputs.iter().map(|p| p.to_path_buf()).collect(), out, seed);
    config.memory = memory;
    config.threads = threads;
    config.writing.shard_size = 256 << 10;
    shuffle::run(&config, &NoProgress).unwrap()
}

/// Every shard file's name and XXH3 (a mismatch prints names, not megabytes).
fn bin_files(dir: &Path) -> Vec<(String, u64)> {
    let ds = prep::Dataset::open(dir).unwrap();
    ds.manifest()
        .shards
        .iter()
        .flat_map(|s| [s.bin.clone(), s.idx.clone()])
        .map(|name| {
            let bytes = std::fs::read(dir.join(&name)).unwrap();
            (name, xxhash_rust::xxh3::xxh3_64(&bytes))
        })
        .collect()
}

#[test]
fn the_output_is_the_permutation_the_seed_names() {
    let t = TestDir::new();
    let input = tokenized(&t, "in");
    let out = t.path("out");
    let report = shuffled(&[&input], &out, 42, 4 << 30, 2);
    assert_eq!(report.buckets, 0, "this fits in memory");
    let before = records(&input);
    let after = records(&out);
    let order = shuffle::permutation(42, before.len() as u64);
    assert_eq!(after.len(), before.len());
    for (i, &g) in order.iter().enumerate() {
        assert_eq!(
            after[i], before[g as usize],
            "output record {i} should be input record {g}"
        );
    }
    assert_ne!(
        after, before,
        "a shuffle of 539 documents left them in order"
    );
    let m = prep::Dataset::open(&out).unwrap();
    let m = m.manifest();
    assert_eq!(m.provenance.command, "shuffle");
    assert_eq!(m.provenance.options["seed"], 42);
    assert!(
        m.provenance.inputs[0].xxh3.is_some(),
        "inputs are recorded with their checksums"
    );
    assert!(out.join("tokenizer.json").is_file());
}

#[test]
fn memory_and_threads_do_not_change_the_output() {
    let t = TestDir::new();
    let input = tokenized(&t, "in");
    // Four copies: 9 MB, so a 64 KiB budget needs more than 256 buckets and
    // the buckets are split again on the next bits of the key.
    let inputs = [input.as_path(); 4];
    let in_memory = shuffled(&inputs, &t.path("a"), 7, 4 << 30, 1);
    let out_of_core = shuffled(&inputs, &t.path("b"), 7, 1 << 20, 3);
    let split_again = shuffled(&inputs, &t.path("c"), 7, 64 << 10, 2);
    assert_eq!(in_memory.buckets, 0);
    assert!(out_of_core.buckets > 1);
    assert_eq!(split_again.buckets, 256);
    assert_eq!(bin_files(&t.path("a")), bin_files(&t.path("b")));
    assert_eq!(bin_files(&t.path("a")), bin_files(&t.path("c")));
    assert!(
        !t.path("c").join(".shuffle-tmp").exists(),
        "bucket files are removed"
    );
    // The mixture holds every document of every input exactly once.
    let mut expected: Vec<Vec<u32>> = records(&input).into_iter().cycle().take(4 * 539).collect();
    let mut got = records(&t.path("c"));
    expected.sort();
    got.sort();
    assert_eq!(got, expected);
}

#[test]
fn another_seed_gives_another_order() {
    let t = TestDir::new();
    let input = tokenized(&t, "in");
    shuffled(&[&input], &t.path("a"), 1, 1 << 20, 2);
    shuffled(&[&input], &t.path("b"), 2, 1 << 20, 2);
    assert_ne!(records(&t.path("a")), records(&t.path("b")));
}

/// Each document's position is uniform over seeds: a chi-square test on the
/// document-by-position table of n = 10 documents over 5,000 fixed seeds, at
/// significance 0.001 (critical value 126.1 for (n-1)^2 = 81 degrees of
/// freedom, Wilson-Hilferty). The seeds are fixed, so the outcome is stable.
#[test]
fn positions_are_uniform_over_seeds() {
    const N: usize = 10;
    const SEEDS: u64 = 5000;
    let mut counts = [[0u64; N]; N];
    for seed in 0..SEEDS {
        for (pos, &doc) in shuffle::permutation(seed, N as u64).iter().enumerate() {
            counts[doc as usize][pos] += 1;
        }
    }
    let expected = SEEDS as f64 / N as f64;
    let chi2: f64 = counts
        .iter()
        .flatten()
        .map(|&c| (c as f64 - expected).powi(2) / expected)
        .sum();
    assert!(
        chi2 < 126.1,
        "chi-square {chi2:.1} over 81 degrees of freedom: positions are not uniform"
    );
    // And not suspiciously perfect either (p = 0.001 lower tail: 46.3).
    assert!(
        chi2 > 46.3,
        "chi-square {chi2:.1} is too small to be random"
    );
}

#[test]
fn datasets_of_different_tokenizers_are_not_mixed() {
    let t = TestDir::new();
    let gpt2 = tokenized(&t, "gpt2");
    let input = t.write("w.jsonl", jsonl(&["a b", "b a"]));
    let tok = word_level(&t, "w.json", &[("[UNK]", 0), ("a", 1), ("b", 2)], &[]);
    let words = t.path("words");
    ok(&mut tokenize_with(&t, &tok, &[&input], &words));
    let err = fails(
        t.prep()
            .args(["shuffle", "--seed", "1"])
            .arg(&gpt2)
            .arg(&words)
            .arg(t.path("out")),
        2,
    );
    assert!(err.contains("tokenizers differ"), "{err}");
    assert!(!t.path("out").join("manifest.json").exists());
}

#[test]
fn the_command_line_shuffles_and_refuses_a_full_directory() {
    let t = TestDir::new();
    let input = tokenized(&t, "in");
    let out = t.path("out");
    let run = ok(t
        .prep()
        .args(["shuffle", "--seed", "9", "--memory", "1MiB"])
        .arg(&input)
        .arg(&out));
    let summary = String::from_utf8_lossy(&run.stderr);
    assert!(
        summary.contains("Shuffled 539 documents") && summary.contains("out of core"),
        "{summary}"
    );
    let valid = run_validate(&t, &out);
    assert!(valid, "the shuffled dataset must validate");
    // The same run again: the dataset is complete, nothing to do.
    let again = ok(t
        .prep()
        .args(["shuffle", "--seed", "9"])
        .arg(&input)
        .arg(&out));
    let said = String::from_utf8_lossy(&again.stderr);
    assert!(said.contains("already complete"), "{said}");
    assert!(
        !said.contains("Shuffled"),
        "a run that did nothing reports work: {said}"
    );
    // Another seed: refused without --overwrite.
    let err = fails(
        t.prep()
            .args(["shuffle", "--seed", "10"])
            .arg(&input)
            .arg(&out),
        2,
    );
    assert!(
        err.contains("other inputs or options") && err.contains("--overwrite"),
        "{err}"
    );
    ok(t.prep()
        .args(["shuffle", "--seed", "10", "--overwrite", "--quiet"])
        .arg(&input)
        .arg(&out));
    // The input is never the output, even with --overwrite.
    let err = fails(
        t.prep()
            .args(["shuffle", "--seed", "10", "--overwrite"])
            .arg(&input)
            .arg(&input),
        2,
    );
    assert!(err.contains("is the input"), "{err}");
    assert!(run_validate(&t, &input), "the input is intact");
}

fn run_validate(t: &TestDir, dir: &Path) -> bool {
    run(t.prep().arg("validate").arg(dir)).status.success()
}

#[test]
fn memory_stays_within_the_budget_on_an_input_8_times_larger() {
    const BUDGET: u64 = 16 << 20;
    // What the process needs besides the budget: code, allocator pools, read
    // and write buffers, the mapped indexes. Measured: 34 MiB from a shell
    // on a 1 GiB dataset, about 50 MiB here, where the forked test process
    // counts too.
    const CONSTANT: u64 = 48 << 20;
    let t = TestDir::new();
    let input = t.path("big");
    std::fs::create_dir(&input).unwrap();
    let mut next = xorshift(0x2545_f491_4f6c_dd1du64);
    // 128 MiB of uint16 tokens in records of up to 16k tokens, written as
    // they are made: the child's peak is measured from a fork of this
    // process, so this process must stay small.
    let mut writer = prep::format::DatasetWriter::new(&input, Dtype::U16, 32 << 20, Vec::new());
    let mut total = 0u64;
    let mut record = Vec::new();
    while total < 128 << 20 {
        let len = 1 + (next() % 16384) as usize;
        record.clear();
        record.extend((0..len).map(|_| (next() % 50000) as u32));
        writer.push(&record).unwrap();
        total += len as u64 * 2;
    }
    let shards = writer.finish().unwrap();
    prep::format::atomic_write(
        &input.join("manifest.json"),
        manifest(Dtype::U16, shards).to_json().as_bytes(),
    )
    .unwrap();
    let out = t.path("out");
    let peak = peak_from_summary(
        t.prep()
            .args([
                "shuffle",
                "--seed",
                "3",
                "--memory",
                "16MiB",
                "--threads",
                "2",
            ])
            .arg(&input)
            .arg(&out),
    );
    eprintln!(
        "peak RSS {} MiB shuffling {} MiB with a {} MiB budget",
        peak >> 20,
        total >> 20,
        BUDGET >> 20
    );
    assert!(peak < BUDGET + CONSTANT, "peak RSS {} MiB", peak >> 20);
    assert_eq!(prep::Dataset::open(&out).unwrap().n_tokens() * 2, total);
}

#[test]
fn a_killed_shuffle_resumes_even_with_another_memory_budget() {
    let t = TestDir::new();
    let input = tokenized(&t, "in");
    let args = |seed: &str, memory: &str| {
        let mut cmd = t.prep();
        cmd.args([
            "shuffle",
            "--seed",
            seed,
            "--memory",
            memory,
            "--shard-size",
            "16KiB",
        ]);
        cmd
    };
    ok(args("5", "64KiB")
        .arg(&input)
        .arg(&input)
        .arg(t.path("whole"))
        .arg("--quiet"));

    let out = t.path("resumed");
    let mut first = args("5", "64KiB");
    first.arg(&input).arg(&input).arg(&out).arg("--quiet");
    kill_after_shards(first, &out, 5);
    // The order does not depend on the budget, so a resume may use another.
    let run = ok(args("5", "1MiB").arg(&input).arg(&input).arg(&out));
    let stderr = String::from_utf8_lossy(&run.stderr);
    assert!(stderr.contains("resuming: kept"), "{stderr}");
    assert_eq!(bin_files(&t.path("whole")), bin_files(&out));
    assert!(!out.join(".shuffle-tmp").exists() && !out.join(".prep-journal.json").exists());
}

#[test]
fn a_shuffle_killed_while_scattering_starts_over() {
    let t = TestDir::new();
    let input = tokenized(&t, "in");
    let out = t.path("out");
    // What a run killed in its first pass leaves: a journal and part of the buckets.
    let args = [
        "shuffle",
        "--quiet",
        "--seed",
        "5",
        "--memory",
        "64KiB",
        "--shard-size",
        "256KiB",
    ];
    let mut child = t.prep().args(args).arg(&input).arg(&out).spawn().unwrap();
    while !out.join(".shuffle-tmp").exists() {
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
    child.kill().unwrap();
    child.wait().unwrap();
    ok(t.prep().args(args).arg(&input).arg(&out));
    shuffled(&[&input], &t.path("whole"), 5, 64 << 10, 1);
    assert_eq!(bin_files(&t.path("whole")), bin_files(&out));
}

/// `prep tokenize --shuffle-seed` with the demo corpus, into `out`.
fn fused(t: &TestDir, out: &Path, seed: &str) -> std::process::Command {
    let mut cmd = tokenize_cmd(t, &[fixture("corpus/debian-sample.jsonl.zst")], out);
    cmd.args([
        "--shard-size",
        "256KiB",
        "--shuffle-seed",
        seed,
        "--memory",
        "256KiB",
    ]);
    cmd
}

#[test]
fn tokenize_with_a_shuffle_seed_equals_tokenize_then_shuffle() {
    let t = TestDir::new();
    let input = tokenized(&t, "in");
    shuffled(&[&input], &t.path("two-steps"), 11, 1 << 20, 2);
    let out = t.path("fused");
    ok(&mut fused(&t, &out, "11"));
    assert_eq!(bin_files(&out), bin_files(&t.path("two-steps")));
    let entries: Vec<String> = std::fs::read_dir(&out)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with('.'))
        .collect();
    assert!(entries.is_empty(), "working files left behind: {entries:?}");
    let ds = prep::Dataset::open(&out).unwrap();
    let p = &ds.manifest().provenance;
    assert_eq!(p.command, "tokenize");
    assert_eq!(p.options["shuffle_seed"], 11);
    assert!(p.inputs[0].path.ends_with("debian-sample.jsonl.zst"));
    assert_eq!(p.documents.written, 539);
    assert!(run(t.prep().arg("validate").arg(&out)).status.success());

    // Run again: complete, nothing rewritten. Another seed: refused.
    let written = std::fs::metadata(out.join("manifest.json"))
        .unwrap()
        .modified()
        .unwrap();
    ok(&mut fused(&t, &out, "11"));
    assert_eq!(
        std::fs::metadata(out.join("manifest.json"))
            .unwrap()
            .modified()
            .unwrap(),
        written
    );
    let err = fails(&mut fused(&t, &out, "12"), 2);
    assert!(err.contains("other inputs or options"), "{err}");
}

#[test]
fn a_killed_tokenize_with_a_shuffle_seed_resumes() {
    let t = TestDir::new();
    let whole = t.path("whole");
    ok(&mut fused(&t, &whole, "4"));
    let out = t.path("resumed");
    let mut first = fused(&t, &out, "4");
    first.args(["--threads", "1"]);
    // Killed while tokenizing: the hidden stage dataset has completed shards.
    kill_after_shards(first, &out.join(".tokenized"), 2);
    ok(&mut fused(&t, &out, "4"));
    assert_eq!(bin_files(&whole), bin_files(&out));
}

/// Issue 51: a shuffle of a damaged input (a flipped byte, an id past the
/// vocabulary) wrote fresh checksums over the bad tokens and exited 0. It
/// is refused now, by the input's name and chunk, in memory and through
/// bucket files alike, and nothing is committed.
#[test]
fn a_damaged_input_is_refused_by_name_and_nothing_is_committed() {
    let t = TestDir::new();
    for (name, file, why) in damage::DAMAGED {
        let input = damage::fixture_copy(&t, name);
        for memory in ["4GiB", "64KiB"] {
            let out = t.path(&format!("{name}-{memory}"));
            damage::refused(
                t.prep()
                    .args(["shuffle", "--quiet", "--seed", "1", "--memory", memory])
                    .arg(&input)
                    .arg(&out),
                &format!("{name}/{file}"),
                why,
                &out,
            );
        }
    }
}
