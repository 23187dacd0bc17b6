//! `prep mix`: each source's share of the tokens to within one document, the
//! same bytes for any thread count and on a resume, documents without
//! replacement within a pass, the global order of `prep shuffle`.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use crate::common::*;
use prep::format::Dtype;

/// A synthetic source of `n` documents of 1 to 200 tokens: the first token
/// of each is `tag * 100_000 + its index`, so every output record names its
/// source and its document; the rest are `tag`.
fn source(t: &TestDir, name: &str, tag: u32, n: u32, dtype: Dtype) -> PathBuf {
    let dir = t.path(name);
    std::fs::create_dir_all(&dir).unwrap();
    let mut next = xorshift(u64::from(tag) + 1);
    let records: Vec<Vec<u32>> = (0..n)
        .map(|i| {
            let len = 1 + next() % 200;
            let mut r = vec![tag; len as usize];
            r[0] = tag * 100_000 + i;
            r
        })
        .collect();
    write_dataset(&dir, dtype, 64 << 10, &records);
    dir
}

fn longest(dir: &Path) -> u64 {
    prep::Dataset::open(dir)
        .unwrap()
        .record_lengths()
        .max()
        .unwrap()
}

fn mix(t: &TestDir, out: &Path, sources: &[(&Path, &str)], tokens: &str) -> std::process::Command {
    mix_seed(t, out, sources, tokens, "11")
}

fn mix_seed(
    t: &TestDir,
    out: &Path,
    sources: &[(&Path, &str)],
    tokens: &str,
    seed: &str,
) -> std::process::Command {
    let mut cmd = t.prep();
    cmd.arg("mix")
        .arg(out)
        .args(["--tokens", tokens, "--seed", seed, "--quiet"]);
    for (dir, weight) in sources {
        cmd.arg("--source")
            .arg(format!("{}:{weight}", dir.display()));
    }
    cmd
}

fn manifest_json(dir: &Path) -> serde_json::Value {
    serde_json::from_slice(&std::fs::read(dir.join("manifest.json")).unwrap()).unwrap()
}

#[test]
fn two_sources_at_07_and_03_hold_their_shares_within_one_document() {
    let t = TestDir::new();
    let a = source(&t, "a", 1, 600, Dtype::U32);
    let b = source(&t, "b", 2, 400, Dtype::U32);
    let out = t.path("mix");
    let n = 40_000u64;
    ok(&mut mix(
        &t,
        &out,
        &[(&a, "0.7"), (&b, "0.3")],
        &n.to_string(),
    ));

    // Tokens and documents of each source, counted from the records.
    let mut tokens = [0u64; 3];
    let mut docs = [0u64; 3];
    for r in records(&out) {
        let tag = (r[0] / 100_000) as usize;
        tokens[tag] += r.len() as u64;
        docs[tag] += 1;
    }
    let doc = longest(&a).max(longest(&b));
    assert!(tokens[1].abs_diff(n * 7 / 10) <= doc, "{tokens:?}");
    assert!(tokens[2].abs_diff(n * 3 / 10) <= doc, "{tokens:?}");
    assert!(
        (tokens[1] + tokens[2]).abs_diff(n) <= doc / 2 + 1,
        "{tokens:?}"
    );

    // The manifest's recipe says the same and adds up.
    let m = manifest_json(&out);
    assert_eq!(m["provenance"]["command"], "mix");
    let recipe = m["provenance"]["options"]["recipe"].as_array().unwrap();
    assert_eq!(recipe.len(), 2);
    for (i, s) in recipe.iter().enumerate() {
        assert_eq!(s["tokens"].as_u64().unwrap(), tokens[i + 1]);
        assert_eq!(s["documents"].as_u64().unwrap(), docs[i + 1]);
        assert!(s["epochs"].as_f64().unwrap() < 1.0);
    }
    assert_eq!(recipe[0]["weight"], 0.7);
    let sum = |field: &str| -> u64 { recipe.iter().map(|s| s[field].as_u64().unwrap()).sum() };
    assert_eq!(sum("tokens"), m["n_tokens"].as_u64().unwrap());
    assert_eq!(sum("documents"), m["n_records"].as_u64().unwrap());

    // No document twice in one pass, and the dataset is valid.
    let mut seen = std::collections::HashSet::new();
    assert!(records(&out).iter().all(|r| seen.insert(r[0])));
    ok(t.prep().arg("validate").arg(&out));

    // inspect shows the recipe.
    let shown = ok(t.prep().arg("inspect").arg(&out));
    let shown = String::from_utf8_lossy(&shown.stdout);
    assert!(shown.contains("Mixed from 2 sources"), "{shown}");
    assert!(shown.contains(&a.display().to_string()), "{shown}");
}

#[test]
fn reruns_write_the_same_bytes_for_one_and_two_threads() {
    let t = TestDir::new();
    let a = source(&t, "a", 1, 600, Dtype::U32);
    let b = source(&t, "b", 2, 400, Dtype::U32);
    let run = |out: &str, threads: &str| {
        let out = t.path(out);
        ok(mix(&t, &out, &[(&a, "0.7"), (&b, "0.3")], "30000").args([
            "--threads",
            threads,
            "--shard-size",
            "8KiB",
        ]));
        snapshot(&out)
    };
    let one = run("one", "1");
    assert!(one.keys().filter(|k| k.ends_with(".bin")).count() > 3);
    assert_eq!(one, run("two", "2"));
    assert_eq!(one, run("again", "1"));
    // Into the finished directory again: recognised, left alone.
    assert_eq!(one, run("one", "2"));
    // Another seed draws and orders otherwise.
    let other = t.path("other");
    ok(
        mix_seed(&t, &other, &[(&a, "0.7"), (&b, "0.3")], "30000", "12")
            .args(["--shard-size", "8KiB"]),
    );
    assert_ne!(records(&t.path("one")), records(&other));
}

#[test]
fn a_one_source_mixture_of_every_token_is_prep_shuffle() {
    let t = TestDir::new();
    let input = t.path("in");
    ok(
        tokenize_cmd(&t, &[fixture("corpus/debian-sample.jsonl.zst")], &input)
            .args(["--shard-size", "256KiB"]),
    );
    let n_tokens = prep::Dataset::open(&input).unwrap().n_tokens();
    let mixed = t.path("mixed");
    ok(mix(&t, &mixed, &[(&input, "1")], &n_tokens.to_string()).args(["--shard-size", "64KiB"]));
    let shuffled = t.path("shuffled");
    ok(t.prep().arg("shuffle").arg(&input).arg(&shuffled).args([
        "--seed",
        "11",
        "--shard-size",
        "64KiB",
        "--quiet",
    ]));
    let files = |dir: &Path| -> Vec<(String, Vec<u8>)> {
        snapshot(dir)
            .into_iter()
            .filter(|(name, _)| name.starts_with("shard-"))
            .collect()
    };
    assert_eq!(files(&mixed), files(&shuffled));
    assert_eq!(
        std::fs::read(mixed.join("tokenizer.json")).unwrap(),
        std::fs::read(input.join("tokenizer.json")).unwrap()
    );
}

#[test]
fn a_source_short_of_its_share_names_the_epochs_it_needs() {
    let t = TestDir::new();
    let a = source(&t, "a", 1, 50, Dtype::U32);
    let has = prep::Dataset::open(&a).unwrap().n_tokens();
    let out = t.path("mix");
    let want = (has * 5 / 2).to_string(); // two and a half passes
    let err = fails(&mut mix(&t, &out, &[(&a, "1")], &want), 2);
    assert!(
        err.contains("takes 3 epochs") && err.contains("--max-epochs 3"),
        "{err}"
    );
    assert!(!out.exists(), "nothing is written");

    ok(mix(&t, &out, &[(&a, "1")], &want).args(["--max-epochs", "3"]));
    let mut count: HashMap<u32, u32> = HashMap::new();
    for r in records(&out) {
        *count.entry(r[0]).or_default() += 1;
    }
    // Without replacement within a pass: every document two or three times.
    assert_eq!(count.len(), 50);
    assert!(count.values().all(|&c| c == 2 || c == 3), "{count:?}");
    let epochs = manifest_json(&out)["provenance"]["options"]["recipe"][0]["epochs"]
        .as_f64()
        .unwrap();
    assert!((epochs - 2.5).abs() < 0.1, "{epochs}");
}

#[test]
fn sources_that_read_differently_are_refused() {
    let t = TestDir::new();
    let a = source(&t, "a", 1, 50, Dtype::U32);
    let b = source(&t, "b", 0, 50, Dtype::U16);
    let out = t.path("mix");
    let err = fails(&mut mix(&t, &out, &[(&a, "1"), (&b, "1")], "1000"), 2);
    assert!(err.contains("dtypes differ") && err.contains("b"), "{err}");
    let err = fails(&mut mix(&t, &out, &[(&a, "-1")], "1000"), 2);
    assert!(err.contains("not a positive number"), "{err}");
    let err = fails(&mut mix(&t, &a.join("x"), &[(&a, "1")], "1000"), 2);
    assert!(err.contains("inside it"), "{err}");
    assert!(!out.exists() && !a.join("x").exists());
}

#[test]
fn a_killed_mix_resumes_to_the_same_bytes() {
    let t = TestDir::new();
    let a = source(&t, "a", 1, 1500, Dtype::U32);
    let b = source(&t, "b", 2, 1500, Dtype::U32);
    let cmd = |out: &Path| {
        let mut c = mix(&t, out, &[(&a, "2"), (&b, "1")], "150000");
        c.args(["--shard-size", "3KiB"]);
        c
    };
    ok(&mut cmd(&t.path("whole")));
    let out = t.path("resumed");
    kill_after_shards(cmd(&out), &out, 5);
    assert!(out.join(".prep-journal.json").exists());
    ok(cmd(&out).args(["--threads", "1"]));
    assert_eq!(snapshot(&t.path("whole")), snapshot(&out));
    assert!(!out.join(".prep-journal.json").exists());
}

#[test]
fn parts_merged_are_the_whole_mixture() {
    let t = TestDir::new();
    let a = source(&t, "a", 1, 600, Dtype::U32);
    let b = source(&t, "b", 2, 400, Dtype::U32);
    let whole = t.path("whole");
    ok(mix(&t, &whole, &[(&a, "0.7"), (&b, "0.3")], "30000").args(["--shard-size", "8KiB"]));
    let out = t.path("merged");
    for i in 0..3 {
        ok(mix(
            &t,
            &out.join(format!("part-{i}")),
            &[(&a, "0.7"), (&b, "0.3")],
            "30000",
        )
        .args(["--shard-size", "8KiB", "--part", &format!("{i}/3")]));
    }
    let mut merge = t.prep();
    merge.arg("merge").arg("--quiet");
    for i in [2, 0, 1] {
        merge.arg(out.join(format!("part-{i}")));
    }
    ok(merge.arg(&out));
    assert_eq!(records(&whole), records(&out));
    let m = manifest_json(&out);
    assert_eq!(
        m["provenance"]["fingerprint"],
        manifest_json(&whole)["provenance"]["fingerprint"]
    );
    assert_eq!(
        m["provenance"]["options"]["recipe"],
        manifest_json(&whole)["provenance"]["options"]["recipe"]
    );
}

/// Issue 51: a mixture that draws from a damaged source is refused by the
/// source's file and chunk, and nothing is committed.
#[test]
fn a_damaged_source_is_refused_by_name_and_nothing_is_committed() {
    let t = TestDir::new();
    let good = damage::fixture_copy(&t, "good");
    for (name, file, why) in damage::DAMAGED {
        let input = damage::fixture_copy(&t, name);
        let out = t.path(&format!("{name}-out"));
        damage::refused(
            &mut mix_seed(&t, &out, &[(&good, "1"), (&input, "1")], "600", "3"),
            &format!("{name}/{file}"),
            why,
            &out,
        );
    }
}
