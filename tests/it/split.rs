//! `prep split`: sides disjoint as documents, together the input, copies of
//! one text on one side, shares close to the fractions, resumable, and each
//! side exports to nanoGPT's flat files.

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};

use crate::common::*;
use prep::format::Dtype;

/// 20,000 documents: 4,000 distinct texts of 1 to 60 tokens, each 5 times,
/// scattered.
fn input(t: &TestDir) -> PathBuf {
    let dir = t.path("in");
    std::fs::create_dir_all(&dir).unwrap();
    let mut next = xorshift(3);
    let texts: Vec<Vec<u32>> = (0..4000u32)
        .map(|i| {
            let len = 1 + next() % 60;
            (0..len as u32).map(|j| i * 7 + j).collect()
        })
        .collect();
    let mut records: Vec<Vec<u32>> = (0..20_000).map(|i| texts[i % 4000].clone()).collect();
    // A fixed shuffle, so that copies are far apart.
    for i in (1..records.len()).rev() {
        records.swap(i, (next() % (i as u64 + 1)) as usize);
    }
    write_dataset(&dir, Dtype::U32, 32 << 10, &records);
    dir
}

fn split(t: &TestDir, input: &Path, out: &Path) -> std::process::Command {
    let mut cmd = t.prep();
    cmd.arg("split")
        .arg(input)
        .arg(out)
        .args(["--val", "0.1", "--seed", "5", "--quiet"]);
    cmd
}

/// True when `part` is `whole` with some records left out, in order.
fn subsequence(part: &[Vec<u32>], whole: &[Vec<u32>]) -> bool {
    let mut it = whole.iter();
    part.iter().all(|r| it.any(|w| w == r))
}

#[test]
fn a_val_split_of_01_is_disjoint_complete_and_within_001() {
    let t = TestDir::new();
    let input = input(&t);
    let out = t.path("out");
    ok(&mut split(&t, &input, &out));
    assert!(!out.join("test").exists());
    let all = records(&input);
    let train = records(&out.join("train"));
    let val = records(&out.join("val"));

    // The union is the input as a multiset.
    let mut union: Vec<Vec<u32>> = train.iter().chain(&val).cloned().collect();
    let mut sorted = all.clone();
    union.sort();
    sorted.sort();
    assert_eq!(union, sorted);
    // Disjoint as documents: no text on both sides, so every copy of a text
    // is on one side.
    let train_texts: HashSet<&Vec<u32>> = train.iter().collect();
    assert!(val.iter().all(|r| !train_texts.contains(r)));
    let mut copies: HashMap<&Vec<u32>, usize> = HashMap::new();
    for r in &val {
        *copies.entry(r).or_default() += 1;
    }
    assert!(
        copies.values().all(|&c| c == 5),
        "a text split across sides"
    );
    // Each side keeps the input's order.
    assert!(subsequence(&train, &all) && subsequence(&val, &all));
    let share = val.len() as f64 / all.len() as f64;
    assert!((share - 0.1).abs() < 0.01, "{share}");

    for side in ["train", "val"] {
        ok(t.prep().arg("validate").arg(out.join(side)));
        let m: serde_json::Value =
            serde_json::from_slice(&std::fs::read(out.join(side).join("manifest.json")).unwrap())
                .unwrap();
        assert_eq!(m["provenance"]["command"], "split");
        assert_eq!(m["provenance"]["options"]["side"], side);
        assert_eq!(m["provenance"]["documents"]["read"], 20_000);
    }
}

#[test]
fn a_test_side_takes_its_share_and_the_three_cover_the_input() {
    let t = TestDir::new();
    let input = input(&t);
    let out = t.path("out");
    ok(split(&t, &input, &out).args(["--test", "0.05"]));
    let n = records(&input).len();
    let sizes: Vec<usize> = ["train", "val", "test"]
        .iter()
        .map(|s| records(&out.join(s)).len())
        .collect();
    assert_eq!(sizes.iter().sum::<usize>(), n);
    assert!(
        (sizes[2] as f64 / n as f64 - 0.05).abs() < 0.01,
        "{sizes:?}"
    );
    // The val side is the one of a split without --test: the hash decides.
    let plain = t.path("plain");
    ok(&mut split(&t, &input, &plain));
    assert_eq!(records(&out.join("val")), records(&plain.join("val")));
}

#[test]
fn reruns_write_the_same_bytes_and_a_finished_split_is_left_alone() {
    let t = TestDir::new();
    let input = input(&t);
    let (a, b) = (t.path("a"), t.path("b"));
    ok(split(&t, &input, &a).args(["--shard-size", "8KiB"]));
    ok(split(&t, &input, &b).args(["--shard-size", "8KiB"]));
    for side in ["train", "val"] {
        assert_eq!(snapshot(&a.join(side)), snapshot(&b.join(side)));
    }
    let before = snapshot(&a.join("train"));
    ok(split(&t, &input, &a).args(["--shard-size", "8KiB"]));
    assert_eq!(before, snapshot(&a.join("train")));
    // Other options are another dataset: refused without --overwrite.
    let err = fails(split(&t, &input, &a).args(["--shard-size", "4KiB"]), 2);
    assert!(err.contains("--overwrite"), "{err}");
}

#[test]
fn a_killed_split_resumes_to_the_same_bytes() {
    let t = TestDir::new();
    let input = input(&t);
    let cmd = |out: &Path| {
        let mut c = split(&t, &input, out);
        c.args(["--shard-size", "8KiB"]);
        c
    };
    let whole = t.path("whole");
    ok(&mut cmd(&whole));
    let out = t.path("resumed");
    kill_after_shards(cmd(&out), &out.join("train"), 5);
    ok(&mut cmd(&out));
    for side in ["train", "val"] {
        assert_eq!(snapshot(&whole.join(side)), snapshot(&out.join(side)));
    }
}

#[test]
fn bad_shares_and_an_output_inside_the_input_are_refused_with_nothing_written() {
    let t = TestDir::new();
    let input = input(&t);
    let out = t.path("out");
    let err = fails(
        t.prep()
            .arg("split")
            .arg(&input)
            .arg(&out)
            .args(["--val", "0.6", "--test", "0.5", "--seed", "1"]),
        2,
    );
    assert!(err.contains("together below 1"), "{err}");
    let err = fails(
        t.prep()
            .arg("split")
            .arg(&input)
            .arg(input.join("parts"))
            .args(["--val", "0.1", "--seed", "1"]),
        2,
    );
    assert!(err.contains("inside it"), "{err}");
    assert!(!out.exists() && !input.join("parts").exists());
}

#[test]
fn export_of_each_side_gives_nanogpt_train_and_val_bin() {
    let t = TestDir::new();
    let input = t.path("in");
    ok(&mut tokenize_cmd(
        &t,
        &[fixture("corpus/debian-sample.jsonl.zst")],
        &input,
    ));
    let out = t.path("out");
    ok(&mut split(&t, &input, &out));
    for (side, file) in [("train", "train.bin"), ("val", "val.bin")] {
        let bin = t.path(file);
        ok(t.prep()
            .args(["export", "--to", "nanogpt"])
            .arg(out.join(side))
            .arg(&bin)
            .arg("--quiet"));
        let tokens: Vec<u32> = std::fs::read(&bin)
            .unwrap()
            .chunks_exact(2)
            .map(|c| u32::from(u16::from_le_bytes([c[0], c[1]])))
            .collect();
        let want: Vec<u32> = records(&out.join(side)).concat();
        assert!(!want.is_empty());
        assert_eq!(tokens, want, "{side}");
    }
}

#[test]
fn parts_merged_per_side_are_the_whole_runs_sides() {
    let t = TestDir::new();
    let input = input(&t);
    let whole = t.path("whole");
    ok(split(&t, &input, &whole).args(["--test", "0.05"]));
    let parts = t.path("parts");
    for i in 0..3 {
        ok(split(&t, &input, &parts.join(format!("part-{i}"))).args([
            "--test",
            "0.05",
            "--part",
            &format!("{i}/3"),
        ]));
    }
    for side in ["train", "val", "test"] {
        let merged = t.path(&format!("merged-{side}"));
        let mut merge = t.prep();
        merge.arg("merge").arg("--quiet");
        for i in [1, 2, 0] {
            merge.arg(parts.join(format!("part-{i}")).join(side));
        }
        ok(merge.arg(&merged));
        assert_eq!(records(&merged), records(&whole.join(side)), "{side}");
        let fingerprint = |dir: &Path| {
            let m: serde_json::Value =
                serde_json::from_slice(&std::fs::read(dir.join("manifest.json")).unwrap()).unwrap();
            (
                m["provenance"]["fingerprint"].clone(),
                m["provenance"]["documents"]["read"].clone(),
            )
        };
        assert_eq!(
            fingerprint(&merged),
            fingerprint(&whole.join(side)),
            "{side}"
        );
    }
    // A part run again finds itself complete; another part's directory is refused.
    ok(split(&t, &input, &parts.join("part-1")).args(["--test", "0.05", "--part", "1/3"]));
    let err = fails(
        split(&t, &input, &parts.join("part-1")).args(["--test", "0.05", "--part", "2/3"]),
        2,
    );
    assert!(err.contains("other inputs or options"), "{err}");
}

/// Issue 51: a split of a damaged input is refused by the input's name and
/// chunk before a side is committed.
#[test]
fn a_damaged_input_is_refused_by_name_and_no_side_is_committed() {
    let t = TestDir::new();
    for (name, file, why) in damage::DAMAGED {
        let input = damage::fixture_copy(&t, name);
        let out = t.path(&format!("{name}-out"));
        let err = damage::refused(
            &mut split(&t, &input, &out),
            &format!("{name}/{file}"),
            why,
            &out,
        );
        for side in ["train", "val"] {
            assert!(
                !out.join(side).join(prep::format::MANIFEST_FILE).exists(),
                "{side}: {err}"
            );
        }
    }
}
