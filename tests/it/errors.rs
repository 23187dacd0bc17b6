//! Every error prints its cause once: each of prep's error variants either
//! prints its cause or returns it as a source, never both, and the command
//! line prints the chain. A cause printed twice (`x: No such file: No such
//! file`) fails here.

use crate::common::{fails, fixture, gpt2, TestDir};

/// Fails `cmd` with exit 2 and checks its message: one line, holding
/// `expect`, with no clause (the text between ": ") repeated.
fn once(cmd: &mut std::process::Command, expect: &str) {
    let err = fails(cmd, 2);
    let line = err.trim_end();
    assert!(line.contains(expect), "{line:?} lacks {expect:?}");
    let clauses: Vec<&str> = line.split(": ").map(str::trim).collect();
    for (i, c) in clauses.iter().enumerate() {
        assert!(
            c.len() < 8 || !clauses[i + 1..].contains(c),
            "{c:?} is printed twice in {line:?}"
        );
    }
    assert_eq!(
        line.matches(expect).count(),
        1,
        "{expect:?} is printed more than once in {line:?}"
    );
}

#[test]
fn a_missing_input_or_tokenizer_is_named_once() {
    let t = TestDir::new();
    once(
        t.prep()
            .arg("tokenize")
            .arg("--tokenizer")
            .arg(gpt2())
            .args(["--input", "missing.jsonl", "--output", "out", "-q"]),
        "No such file or directory",
    );
    once(
        t.prep().arg("tokenize").args([
            "--tokenizer",
            "missing.json",
            "--input",
            "x.jsonl",
            "--output",
            "out",
            "-q",
        ]),
        "No such file or directory",
    );
}

#[test]
fn unreadable_dataset_files_are_named_once() {
    let t = TestDir::new();
    // A directory where the manifest should be: reading it fails.
    std::fs::create_dir_all(t.path("odd/manifest.json")).unwrap();
    once(t.prep().args(["inspect", "odd"]), "manifest.json");
    // A dataset whose shard is gone.
    let ds = t.path("ds");
    crate::common::ok(&mut crate::common::tokenize_cmd(
        &t,
        &[fixture("corpus/debian-sample.jsonl.zst")],
        &ds,
    ));
    let bin = std::fs::read_dir(&ds)
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| p.extension().is_some_and(|e| e == "bin"))
        .unwrap();
    std::fs::remove_file(&bin).unwrap();
    once(
        t.prep()
            .arg("pack")
            .arg(&ds)
            .arg(t.path("packed"))
            .args(["--seq-len", "64", "-q"]),
        "No such file or directory",
    );
    once(
        t.prep().arg("inspect").arg(&ds),
        "No such file or directory",
    );
}
