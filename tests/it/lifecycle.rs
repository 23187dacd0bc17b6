//! The output lifecycle every stage shares (src/output.rs): one writer per
//! directory, refusal of what is not prep's, `--overwrite` that removes only
//! prep's files, journals that lag no shard, nothing left by a failed run.
//! Each test is named after the defect it pins.

use std::path::Path;
use std::process::Stdio;

use crate::common::*;

/// The fixture corpus tokenized with GPT-2 into `out`, with small shards.
fn tokenized(t: &TestDir, out: &Path) {
    ok(
        tokenize_cmd(t, &[fixture("corpus/debian-sample.jsonl.zst")], out)
            .args(["--shard-size", "64KiB"]),
    );
}

fn names(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    names
}

#[test]
fn fused_overwrite_keeps_the_input_and_foreign_files() {
    let t = TestDir::new();
    let dir = t.path("work");
    let input = t.write(
        "in.jsonl",
        jsonl(&["one document", "another one", "a third"]),
    );
    // An output that holds its input is refused, --overwrite or not.
    let inside = t.write("work/in.jsonl", jsonl(&["one document"]));
    let err = fails(
        tokenize_with(&t, &gpt2(), &[&inside], &dir).args(["--overwrite", "--shuffle-seed", "1"]),
        2,
    );
    assert!(err.contains("holds the input"), "{err}");
    std::fs::remove_file(&inside).unwrap();
    let notes = t.write("work/notes.txt", "not prep's");
    std::fs::create_dir_all(dir.join("mine")).unwrap();
    t.write("work/mine/keep.txt", "a folder of the user's");
    ok(tokenize_with(&t, &gpt2(), &[&input], &dir).args(["--overwrite", "--shuffle-seed", "1"]));
    assert_eq!(std::fs::read_to_string(&notes).unwrap(), "not prep's");
    assert!(input.is_file(), "the input must survive --overwrite");
    assert!(dir.join("mine/keep.txt").is_file());
    assert_eq!(records(&dir).len(), 3);
    // And again over its own output: still only prep's files replaced.
    ok(tokenize_with(&t, &gpt2(), &[&input], &dir).args(["--overwrite", "--shuffle-seed", "2"]));
    assert!(input.is_file() && notes.is_file());
    assert!(!dir.join(".tokenized").exists());
    ok(t.prep().arg("validate").arg(&dir));
}

#[test]
fn concurrent_runs_into_one_directory_exactly_one_proceeds() {
    let t = TestDir::new();
    let out = t.path("out");
    let sizes = ["4KiB", "3KiB", "5KiB", "6KiB"];
    let children: Vec<_> = sizes
        .iter()
        .map(|size| {
            tokenize_cmd(&t, &[fixture("corpus/debian-sample.jsonl.zst")], &out)
                .args(["--shard-size", size])
                .stdout(Stdio::null())
                .stderr(Stdio::piped())
                .spawn()
                .unwrap()
        })
        .collect();
    let outcomes: Vec<_> = children
        .into_iter()
        .map(|c| c.wait_with_output().unwrap())
        .collect();
    let winners = outcomes.iter().filter(|o| o.status.success()).count();
    assert_eq!(winners, 1, "exactly one run proceeds");
    for o in outcomes.iter().filter(|o| !o.status.success()) {
        assert_eq!(o.status.code(), Some(2));
        let err = String::from_utf8_lossy(&o.stderr);
        // Refused at the lock while the winner runs, or by its finished dataset.
        assert!(
            err.contains("another prep run (pid ")
                || err.contains("made from other inputs or options"),
            "{err}"
        );
    }
    ok(t.prep().arg("validate").arg(&out));
    assert!(
        !out.join(".prep-lock").exists(),
        "the winner releases its lock"
    );
}

#[test]
fn a_second_run_is_refused_naming_the_holders_pid() {
    let t = TestDir::new();
    let out = t.path("out");
    let held = prep::output::Output::lock(&out, false).unwrap();
    let err = fails(
        &mut tokenize_cmd(&t, &[fixture("corpus/debian-sample.jsonl.zst")], &out),
        2,
    );
    assert!(
        err.contains(&format!("another prep run (pid {})", std::process::id())),
        "{err}"
    );
    assert!(err.contains(&out.display().to_string()), "{err}");
    drop(held);
    ok(&mut tokenize_cmd(
        &t,
        &[fixture("corpus/debian-sample.jsonl.zst")],
        &out,
    ));
}

#[test]
fn a_killed_run_leaves_no_lock_that_blocks_the_next() {
    let t = TestDir::new();
    let input = t.path("docs");
    tokenized(&t, &input);
    let out = t.path("packed");
    let pack = |out: &Path| {
        let mut cmd = t.prep();
        cmd.args(["pack", "--seq-len", "64", "--shard-size", "32KiB", "-q"])
            .arg(&input)
            .arg(out);
        cmd
    };
    kill_after_shards(pack(&out), &out, 3);
    assert!(
        out.join(".prep-lock").exists(),
        "the killed run's lock file stays"
    );
    ok(&mut pack(&out));
    assert!(!out.join(".prep-lock").exists());
    ok(t.prep().arg("validate").arg(&out));
}

#[test]
fn pack_journals_every_shard_as_it_completes() {
    let t = TestDir::new();
    let input = t.path("docs");
    tokenized(&t, &input);
    let out = t.path("packed");
    let mut cmd = t.prep();
    cmd.args(["pack", "--seq-len", "64", "--shard-size", "32KiB", "-q"])
        .arg(&input)
        .arg(&out);
    kill_after_shards(cmd, &out, 5);
    // Complete shards have their .seg in place; every one but the shard
    // being journaled at the kill must be in the journal.
    let complete = names(&out).iter().filter(|n| n.ends_with(".seg")).count();
    let journaled = journaled_shards(&std::fs::read(out.join(".prep-journal.json")).unwrap());
    assert!(
        complete <= journaled + 1,
        "{complete} complete shards on disk, {journaled} journaled"
    );
    // The re-run resumes from them and ends as an uninterrupted run does.
    let again = ok(t
        .prep()
        .args(["pack", "--seq-len", "64", "--shard-size", "32KiB"])
        .arg(&input)
        .arg(&out));
    let stderr = String::from_utf8_lossy(&again.stderr);
    assert!(stderr.contains("resuming: kept"), "{stderr}");
    let whole = t.path("whole");
    ok(t.prep()
        .args(["pack", "--seq-len", "64", "--shard-size", "32KiB", "-q"])
        .arg(&input)
        .arg(&whole));
    assert_eq!(snapshot(&out), snapshot(&whole));
}

#[test]
fn a_failed_run_leaves_nothing_in_a_new_directory() {
    let t = TestDir::new();
    let bad = t.write("bad.jsonl", "{\"text\": \"fine\"}\n{not json\n");
    let out = t.path("new/out");
    fails(&mut tokenize_cmd(&t, &[&bad], &out), 2);
    assert!(
        !t.path("new").exists(),
        "no tokenizer.json, journal or directory left behind"
    );
    // In an existing directory: nothing of prep's left behind either.
    let existing = t.path("existing");
    std::fs::create_dir_all(&existing).unwrap();
    fails(&mut tokenize_cmd(&t, &[&bad], &existing), 2);
    assert!(names(&existing).is_empty(), "{:?}", names(&existing));
}

#[test]
fn skip_bad_that_skips_every_document_fails() {
    let t = TestDir::new();
    let input = t.write(
        "in.jsonl",
        "{\"body\": \"a\", \"id\": 1}\n{\"body\": \"b\", \"id\": 2}\n",
    );
    let out = t.path("out");
    let err = fails(
        tokenize_cmd(&t, &[&input], &out).args(["--skip-bad", "--text-key", "text"]),
        2,
    );
    assert!(err.contains("every one of the 2 documents"), "{err}");
    assert!(!out.join("manifest.json").exists());
}

#[test]
fn a_stage_refuses_a_directory_with_foreign_files_and_names_one() {
    let t = TestDir::new();
    let input = t.path("docs");
    tokenized(&t, &input);
    let out = t.path("out");
    t.write("out/precious.txt", "x");
    let err = fails(
        t.prep()
            .args(["shuffle", "--seed", "1"])
            .arg(&input)
            .arg(&out),
        2,
    );
    assert!(err.contains("precious.txt"), "{err}");
    ok(t.prep()
        .args(["shuffle", "--seed", "1", "--overwrite", "-q"])
        .arg(&input)
        .arg(&out));
    assert!(out.join("precious.txt").is_file());
    ok(t.prep().arg("validate").arg(&out));
}

#[test]
fn overwrite_keeps_files_prep_did_not_write_and_refuses_those_in_its_way() {
    let t = TestDir::new();
    let out = t.path("out");
    // A dataset of two shards.
    ok(
        tokenize_cmd(&t, &[fixture("corpus/debian-sample.jsonl.zst")], &out)
            .args(["--shard-size", "1MiB"]),
    );
    let mine = [
        ("draft.tmp", "a draft of the user's"),
        ("notes.txt", "notes of the user's"),
    ];
    for (name, text) in mine {
        t.write(&format!("out/{name}"), text);
    }
    let again = |t: &TestDir| {
        let mut cmd = tokenize_cmd(t, &[fixture("corpus/debian-sample.jsonl.zst")], &out);
        cmd.args(["--shard-size", "512KiB", "--overwrite"]);
        cmd
    };
    ok(&mut again(&t));
    for (name, text) in mine {
        assert_eq!(
            std::fs::read_to_string(out.join(name)).unwrap(),
            text,
            "{name}"
        );
    }
    ok(t.prep().arg("validate").arg(&out));
    // A shard file no record of prep's lists is someone else's, and in the
    // way of a run that writes shards: refused by name, nothing touched.
    t.write("out/shard-00007.bin", "a file of the user's");
    let before = snapshot(&out);
    let err = fails(&mut again(&t), 2);
    assert!(err.contains("shard-00007.bin"), "{err}");
    assert_eq!(snapshot(&out), before);
}

#[test]
fn a_foreign_manifest_or_tokenizer_is_refused_by_name_and_kept() {
    for (name, text) in [
        ("manifest.json", "{\"project\": \"the user's own\"}"),
        ("tokenizer.json", "{\"model\": \"the user's own\"}"),
    ] {
        let t = TestDir::new();
        let out = t.path("out");
        t.write(&format!("out/{name}"), text);
        for overwrite in [false, true] {
            let mut cmd = tokenize_cmd(&t, &[fixture("corpus/debian-sample.jsonl.zst")], &out);
            if overwrite {
                cmd.arg("--overwrite");
            }
            let err = fails(&mut cmd, 2);
            assert!(err.contains(name), "{name}, --overwrite {overwrite}: {err}");
            assert_eq!(names(&out), [name]);
            assert_eq!(std::fs::read_to_string(out.join(name)).unwrap(), text);
        }
    }
}
