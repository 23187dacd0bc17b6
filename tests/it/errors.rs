//! Every error prints its cause once: each of prep's error variants either
//! prints its cause or returns it as a source, never both, and the command
//! line prints the chain. A cause printed twice (`x: No such file: No such
//! file`) fails here.
//!
//! And no message leaves the user guessing: Ctrl-C and SIGTERM say how to
//! go on (and the re-run does), a file of another tool says whose it is
//! not, a full disk says what prep left on it.

use std::path::Path;
use std::process::{Command, Output};
use std::time::{Duration, Instant};

use crate::common::{fails, fixture, gpt2, journaled_shards, ok, snapshot, tokenize_cmd, TestDir};

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

/// Starts `cmd`, waits until the journal in `dir` lists `shards` completed
/// shards, sends it `signal`, and returns how it ended.
fn signal_after_shards(mut cmd: Command, dir: &Path, shards: usize, signal: i32) -> Output {
    let child = cmd
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let journal = dir.join(".prep-journal.json");
    let deadline = Instant::now() + Duration::from_secs(120);
    while std::fs::read(&journal).map_or(0, |b| journaled_shards(&b)) < shards {
        assert!(Instant::now() < deadline, "no progress");
        std::thread::sleep(Duration::from_millis(2));
    }
    let pid = i32::try_from(child.id()).unwrap();
    // SAFETY: kill(2) on the pid of a child this test started and has not
    // waited for, so the pid is still that child's.
    assert_eq!(unsafe { libc::kill(pid, signal) }, 0);
    let out = child.wait_with_output().unwrap();
    assert!(
        !dir.join("manifest.json").exists(),
        "the run ended before the signal: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

/// Checks that an interrupted run ended with `code` and the one line that
/// says to re-run it.
fn interrupted(out: &Output, code: i32) {
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(code), "{stderr}");
    assert_eq!(
        stderr.trim_end(),
        "prep: interrupted: re-run the same command to resume"
    );
}

#[test]
fn ctrl_c_says_to_re_run_and_the_re_run_resumes_to_the_same_bytes() {
    let t = TestDir::new();
    let corpus = fixture("corpus/debian-sample.jsonl.zst");
    let args = ["--threads", "1", "--shard-size", "64KiB"];
    let tokenize = |out: &Path| {
        let mut cmd = tokenize_cmd(&t, &[&corpus], out);
        cmd.args(args);
        cmd
    };
    let whole = t.path("whole");
    ok(&mut tokenize(&whole));
    let out = t.path("interrupted");
    interrupted(
        &signal_after_shards(tokenize(&out), &out, 3, libc::SIGINT),
        130,
    );
    ok(&mut tokenize(&out));
    assert_eq!(snapshot(&out), snapshot(&whole));
}

#[test]
fn sigterm_says_to_re_run_and_the_re_run_resumes_to_the_same_bytes() {
    let t = TestDir::new();
    let docs = t.path("docs");
    ok(
        tokenize_cmd(&t, &[fixture("corpus/debian-sample.jsonl.zst")], &docs)
            .args(["--shard-size", "64KiB"]),
    );
    let pack = |out: &Path| {
        let mut cmd = t.prep();
        cmd.args(["pack", "--seq-len", "64", "--shard-size", "32KiB", "-q"])
            .arg(&docs)
            .arg(out);
        cmd
    };
    let whole = t.path("whole");
    ok(&mut pack(&whole));
    let out = t.path("interrupted");
    interrupted(
        &signal_after_shards(pack(&out), &out, 3, libc::SIGTERM),
        143,
    );
    ok(&mut pack(&out));
    assert_eq!(snapshot(&out), snapshot(&whole));
}

/// A small tmpfs mounted at a folder of the test's, unmounted on drop.
struct SmallDisk {
    dir: std::path::PathBuf,
}

impl SmallDisk {
    /// Mounts `bytes` of tmpfs at `dir`. Built only where the build had
    /// CAP_SYS_ADMIN (`cfg(prep_can_mount)`, build.rs), so a mount that
    /// fails here fails the test.
    fn mount(dir: &Path, bytes: u64) -> SmallDisk {
        std::fs::create_dir_all(dir).unwrap();
        let out = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={bytes}"), "tmpfs"])
            .arg(dir)
            .output()
            .unwrap_or_else(|e| panic!("no mount command: {e}"));
        assert!(
            out.status.success(),
            "cannot mount a tmpfs at {}, though the build had CAP_SYS_ADMIN: {}",
            dir.display(),
            String::from_utf8_lossy(&out.stderr).trim()
        );
        SmallDisk { dir: dir.into() }
    }

    fn resize(&self, bytes: u64) {
        let remount = Command::new("mount")
            .args(["-o", &format!("remount,size={bytes}")])
            .arg(&self.dir)
            .status()
            .unwrap();
        assert!(remount.success());
    }
}

impl Drop for SmallDisk {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(&self.dir).status();
    }
}

/// A shuffle whose disk fills up after its first pass says where its
/// scratch folder is, how large, and that a re-run resumes; given space,
/// the re-run does, to the bytes of a run that never ran out. Needs a small
/// file system to fill: a tmpfs, which only root may mount (CI runs as
/// root); elsewhere the test framework reports it skipped, and the
/// message's making is tested in src/shuffle
/// (`a_full_disk_names_the_scratch_folder_left_on_it`).
#[test]
#[cfg_attr(
    not(prep_can_mount),
    ignore = "needs CAP_SYS_ADMIN (root) to mount the small tmpfs it fills; CI runs as root"
)]
fn a_shuffle_on_a_full_disk_names_its_scratch_and_resumes() {
    let t = TestDir::new();
    let docs = t.path("docs");
    ok(
        tokenize_cmd(&t, &[fixture("corpus/debian-sample.jsonl.zst")], &docs)
            .args(["--shard-size", "64KiB"]),
    );
    let ds = prep::Dataset::open(&docs).unwrap();
    let tokens = ds.n_tokens() * 2; // u16 ids
    let documents = ds.len();
    // Two buckets of half the documents each: the memory every document
    // and its 32 bytes of bookkeeping need.
    let memory = (tokens + documents * 32).to_string();
    let shuffle = |out: &Path| {
        let mut cmd = t.prep();
        cmd.args([
            "shuffle",
            "--seed",
            "3",
            "--shard-size",
            "16KiB",
            "--memory",
        ])
        .arg(&memory)
        .arg(&docs)
        .arg(out)
        .arg("-q");
        cmd
    };
    let whole = t.path("whole");
    ok(&mut shuffle(&whole));

    // Room for the bucket files (the tokens and 24 bytes a document) and a
    // quarter of the shards: the first bucket's shards fill the disk while
    // both buckets are still there.
    let scratch_bytes = tokens + documents * 24;
    let disk = SmallDisk::mount(&t.path("disk"), scratch_bytes + tokens / 4 + (64 << 10));
    let out = disk.dir.join("out");
    let err = fails(&mut shuffle(&out), 2);
    let scratch = out.join(".shuffle-tmp");
    for part in [
        "No space left on device",
        &format!("the shuffle's scratch folder {} holds", scratch.display()),
        "the same command run again once there is space resumes",
    ] {
        assert!(err.contains(part), "{part:?} not in {err}");
    }
    assert!(scratch.is_dir(), "{err}");

    disk.resize(4 * scratch_bytes + (1 << 20));
    ok(&mut shuffle(&out));
    assert!(!scratch.exists());
    assert_eq!(snapshot(&out), snapshot(&whole));
}

/// A `manifest.json` of another tool's (no `"format": "prep"`) says the
/// directory is not a prep dataset and what prep reads, when prep reads the
/// directory; when prep would write into it, the run is refused naming the
/// file prep did not write, and how to go on.
#[test]
fn a_foreign_manifest_says_the_directory_is_not_a_prep_dataset() {
    let t = TestDir::new();
    for (name, manifest, found) in [
        (
            "other",
            r#"{"format": "mds", "version": 2, "shards": []}"#,
            r#"its "format" is "mds""#,
        ),
        (
            "none",
            r#"{"version": 1, "files": ["a.bin"]}"#,
            r#"it has no "format" field"#,
        ),
    ] {
        t.write(&format!("{name}/manifest.json"), manifest);
        let dir = t.path(name);
        let out = t.path(&format!("{name}-packed"));
        let input = t.write("in.jsonl", crate::common::jsonl(&["text"]));
        let mut inspect = t.prep();
        inspect.arg("inspect").arg(&dir);
        let mut validate = t.prep();
        validate.arg("validate").arg(&dir);
        let mut pack = t.prep();
        pack.arg("pack")
            .arg(&dir)
            .arg(&out)
            .args(["--seq-len", "8", "-q"]);
        let mut tokenize = tokenize_cmd(&t, &[&input], &dir);
        let err = fails(&mut tokenize, 2);
        for part in [
            "\"manifest.json\", which prep did not write",
            "choose another directory",
        ] {
            assert!(err.contains(part), "{part:?} not in {err}");
        }
        for mut cmd in [inspect, validate, pack] {
            let err = fails(&mut cmd, 2);
            for part in [
                &format!("{}: ", dir.join("manifest.json").display()),
                "this manifest.json is not prep's",
                found,
                "not a prep dataset",
                "prep import",
            ] {
                assert!(err.contains(part), "{part:?} not in {err}");
            }
        }
        assert_eq!(
            std::fs::read_to_string(dir.join("manifest.json")).unwrap(),
            manifest,
            "the other tool's file is left as it was"
        );
    }
}
