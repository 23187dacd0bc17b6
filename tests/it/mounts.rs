//! Partitioned tasks that see their input at different paths (other mount
//! points, symlinks) are parts of one job: for every stage that takes
//! `--part`, parts whose tasks read the input through different paths
//! merge, into exactly what tasks reading one path make.

use std::path::{Path, PathBuf};

use crate::common::{fixture, ok, records, TestDir};

/// A directory `real` holding `what`, and `link`, a symlink to `real`:
/// the same files at two paths, as two machines mounting one share.
fn two_mounts(t: &TestDir) -> (PathBuf, PathBuf) {
    let real = t.path("mnt-a/share");
    std::fs::create_dir_all(&real).unwrap();
    let link = t.path("mnt-b");
    std::fs::create_dir_all(&link).unwrap();
    std::os::unix::fs::symlink(&real, link.join("share")).unwrap();
    (real, link.join("share"))
}

/// Merges `parts` into `out`, then checks its records equal `want`'s.
fn merged_equals(t: &TestDir, parts: &[PathBuf], out: &Path, want: &Path) {
    ok(t.prep().arg("merge").args(parts).arg(out).arg("-q"));
    assert_eq!(records(out), records(want));
}

/// The GPT-2 tokenization of the JSONL excerpt in `dir`, one shard a part.
fn tokenized(t: &TestDir, dir: &Path) -> PathBuf {
    let out = dir.join("tok");
    ok(
        crate::common::tokenize_cmd(t, &[fixture("corpus/debian-sample.jsonl.zst")], &out)
            .args(["--shard-size", "256KiB"]),
    );
    out
}

#[test]
fn tokenize_parts_read_through_two_mounts_merge() {
    let t = TestDir::new();
    let (a, b) = two_mounts(&t);
    std::fs::copy(
        fixture("corpus/debian-sample.jsonl.zst"),
        a.join("docs.jsonl.zst"),
    )
    .unwrap();
    let part = |root: &Path, i: u64| {
        let out = t.path(&format!("part-{i}"));
        ok(
            crate::common::tokenize_cmd(&t, &[root.join("docs.jsonl.zst")], &out)
                .args(["--part", &format!("{i}/2")]),
        );
        out
    };
    let parts = [part(&a, 0), part(&b, 1)];
    let whole = t.path("whole");
    ok(&mut crate::common::tokenize_cmd(
        &t,
        &[a.join("docs.jsonl.zst")],
        &whole,
    ));
    merged_equals(&t, &parts, &t.path("merged"), &whole);
}

#[test]
fn pack_mix_and_split_parts_read_through_two_mounts_merge() {
    let t = TestDir::new();
    let (a, b) = two_mounts(&t);
    let input = tokenized(&t, &a);
    let seen_from = |root: &Path| root.join("tok");

    let pack = |root: &Path, out: &Path, part: Option<&str>| {
        let mut cmd = t.prep();
        cmd.arg("pack").arg(seen_from(root)).arg(out);
        cmd.args(["--seq-len", "256", "--mode", "concat", "-q"]);
        if let Some(p) = part {
            cmd.args(["--part", p]);
        }
        ok(&mut cmd);
    };
    let whole = t.path("pack-whole");
    pack(&a, &whole, None);
    let parts = [t.path("pack-0"), t.path("pack-1")];
    pack(&a, &parts[0], Some("0/2"));
    pack(&b, &parts[1], Some("1/2"));
    merged_equals(&t, &parts, &t.path("pack-merged"), &whole);

    let mix = |root: &Path, out: &Path, part: Option<&str>| {
        let mut cmd = t.prep();
        cmd.arg("mix").arg(out);
        cmd.arg("--source")
            .arg(format!("{}:1", seen_from(root).display()));
        cmd.args(["--tokens", "200000", "--seed", "4", "-q"]);
        if let Some(p) = part {
            cmd.args(["--part", p]);
        }
        ok(&mut cmd);
    };
    let whole = t.path("mix-whole");
    mix(&a, &whole, None);
    let parts = [t.path("mix-0"), t.path("mix-1")];
    mix(&a, &parts[0], Some("0/2"));
    mix(&b, &parts[1], Some("1/2"));
    merged_equals(&t, &parts, &t.path("mix-merged"), &whole);

    let split = |root: &Path, out: &Path, part: Option<&str>| {
        let mut cmd = t.prep();
        cmd.arg("split").arg(seen_from(root)).arg(out);
        cmd.args(["--val", "0.2", "--seed", "6", "-q"]);
        if let Some(p) = part {
            cmd.args(["--part", p]);
        }
        ok(&mut cmd);
    };
    let whole = t.path("split-whole");
    split(&a, &whole, None);
    let parts = [t.path("split-0"), t.path("split-1")];
    split(&a, &parts[0], Some("0/2"));
    split(&b, &parts[1], Some("1/2"));
    for side in ["train", "val"] {
        let sides: Vec<PathBuf> = parts.iter().map(|p| p.join(side)).collect();
        merged_equals(
            &t,
            &sides,
            &t.path(&format!("split-merged-{side}")),
            &whole.join(side),
        );
    }
    assert!(!records(&input).is_empty());
}

#[test]
fn scatter_tasks_read_through_two_mounts_gather_and_merge() {
    let t = TestDir::new();
    let (a, b) = two_mounts(&t);
    tokenized(&t, &a);
    let work = t.path("work");
    for (i, root) in [&a, &b].into_iter().enumerate() {
        ok(t.prep()
            .arg("shuffle")
            .arg(root.join("tok"))
            .arg(&work)
            .args([
                "-q",
                "--scatter",
                "--seed",
                "8",
                "--buckets",
                "2",
                "--part",
                &format!("{i}/2"),
            ]));
    }
    let buckets: Vec<PathBuf> = (0..2)
        .map(|j| {
            let out = t.path(&format!("bucket-{j}"));
            ok(t.prep().arg("shuffle").arg(&work).arg(&out).args([
                "-q",
                "--gather",
                "--bucket",
                &j.to_string(),
            ]));
            out
        })
        .collect();
    let whole = t.path("whole");
    ok(t.prep()
        .arg("shuffle")
        .arg(a.join("tok"))
        .arg(&whole)
        .args(["-q", "--seed", "8"]));
    merged_equals(&t, &buckets, &t.path("merged"), &whole);
}
