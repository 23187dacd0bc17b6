//! `prep tokenize` as a whole: determinism, the manifest schema, resuming,
//! re-runs, and bounded memory.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

use crate::common::*;
use prep::tokenize::{self, NoProgress, TokenizeConfig};

fn corpus() -> PathBuf {
    fixture("corpus/debian-sample.jsonl.zst")
}

fn assert_same_dataset(a: &Path, b: &Path) {
    let (sa, sb) = (snapshot(a), snapshot(b));
    assert_eq!(
        sa.keys().collect::<Vec<_>>(),
        sb.keys().collect::<Vec<_>>(),
        "file lists differ"
    );
    for (name, bytes) in &sa {
        assert!(
            bytes == &sb[name],
            "{name} differs between {} and {}",
            a.display(),
            b.display()
        );
    }
}

#[test]
fn output_is_byte_identical_for_any_thread_count() {
    let t = TestDir::new();
    for threads in ["1", "2", "3"] {
        let out = t.path(&format!("t{threads}"));
        ok(tokenize_cmd(&t, &[&corpus()], &out).args([
            "--threads",
            threads,
            "--shard-size",
            "300KiB",
        ]));
    }
    assert!(
        prep::Dataset::open(t.path("t1"))
            .unwrap()
            .manifest()
            .shards
            .len()
            > 3
    );
    assert_same_dataset(&t.path("t1"), &t.path("t2"));
    assert_same_dataset(&t.path("t1"), &t.path("t3"));
}

#[test]
fn tiny_batches_and_windows_do_not_change_the_output() {
    // Many small batches in flight and finishing out of order exercise the
    // reorder window far more than the default 1 MiB batches do.
    let t = TestDir::new();
    let run = |name: &str, threads: usize, batch_bytes: usize, window: usize| {
        let mut config =
            TokenizeConfig::new(gpt2(), vec![corpus().display().to_string()], t.path(name));
        config.threads = threads;
        config.batch_bytes = batch_bytes;
        config.window_per_thread = window;
        config.writing.shard_size = 200 << 10;
        tokenize::run(&config, &NoProgress).unwrap();
    };
    run("reference", 1, 1 << 20, 4);
    run("small", 4, 2 << 10, 8);
    run("narrow", 3, 16 << 10, 1);
    assert_same_dataset(&t.path("reference"), &t.path("small"));
    assert_same_dataset(&t.path("reference"), &t.path("narrow"));
}

#[test]
fn manifest_matches_the_schema_and_the_files() {
    let t = TestDir::new();
    let out = t.path("ds");
    ok(tokenize_cmd(&t, &[&corpus()], &out).args(["--shard-size", "1MiB", "--dedup"]));
    let schema: serde_json::Value = serde_json::from_slice(
        &std::fs::read(root().join("schemas/manifest.schema.json")).unwrap(),
    )
    .unwrap();
    let manifest: serde_json::Value =
        serde_json::from_slice(&std::fs::read(out.join("manifest.json")).unwrap()).unwrap();
    let validator = jsonschema::validator_for(&schema).expect("the schema compiles");
    let errors: Vec<String> = validator
        .iter_errors(&manifest)
        .map(|e| e.to_string())
        .collect();
    assert!(
        errors.is_empty(),
        "manifest does not match its schema: {errors:#?}"
    );

    // The manifest's sizes and checksums are those of the files.
    let ds = prep::Dataset::open(&out).unwrap();
    for shard in &ds.manifest().shards {
        for (name, bytes, sum) in [
            (&shard.bin, shard.bin_bytes, &shard.bin_xxh3),
            (&shard.idx, shard.idx_bytes, &shard.idx_xxh3),
        ] {
            let data = std::fs::read(out.join(name)).unwrap();
            assert_eq!(data.len() as u64, bytes, "{name}");
            assert_eq!(
                &format!("{:016x}", xxhash_rust::xxh3::xxh3_64(&data)),
                sum,
                "{name}"
            );
        }
    }
    let tokenizer = std::fs::read(out.join("tokenizer.json")).unwrap();
    let original = zstd::decode_all(std::fs::File::open(gpt2()).unwrap()).unwrap();
    assert_eq!(
        tokenizer, original,
        "the dataset carries the tokenizer it was made with"
    );
    assert_eq!(
        format!("{:016x}", xxhash_rust::xxh3::xxh3_64(&tokenizer)),
        ds.manifest().tokenizer.xxh3
    );
    let total: u64 = ds.records().map(|r| r.len() as u64).sum();
    assert_eq!(total, ds.n_tokens());
}

#[test]
fn a_killed_run_resumes_and_equals_an_uninterrupted_one() {
    let t = TestDir::new();
    let args = ["--threads", "1", "--shard-size", "64KiB"];
    ok(tokenize_cmd(&t, &[&corpus()], &t.path("whole")).args(args));

    let out = t.path("resumed");
    let mut first = tokenize_cmd(&t, &[&corpus()], &out);
    first.args(args);
    kill_after_shards(first, &out, 3);
    let kept = t.held_inode(&out.join("shard-00000.bin"));

    let run = ok(t
        .prep()
        .args(["tokenize", "--tokenizer"])
        .arg(gpt2())
        .arg("--input")
        .arg(corpus())
        .arg("--output")
        .arg(&out)
        .args(args));
    let stderr = String::from_utf8_lossy(&run.stderr);
    assert!(stderr.contains("resuming: kept"), "{stderr}");
    assert_eq!(
        t.held_inode(&out.join("shard-00000.bin")),
        kept,
        "a complete shard was rewritten instead of kept"
    );
    assert!(!out.join(".prep-journal.json").exists());
    assert_same_dataset(&t.path("whole"), &out);
}

#[test]
fn a_damaged_shard_is_made_again_on_resume() {
    let t = TestDir::new();
    let args = ["--threads", "2", "--shard-size", "64KiB", "--dedup"];
    ok(tokenize_cmd(&t, &[&corpus()], &t.path("whole")).args(args));

    let out = t.path("resumed");
    let mut first = tokenize_cmd(&t, &[&corpus()], &out);
    first.args(args);
    kill_after_shards(first, &out, 4);
    // Damage shard 1: shards 0 is kept, 1 and everything after are made again.
    let victim = out.join("shard-00001.bin");
    let mut bytes = std::fs::read(&victim).unwrap();
    bytes[10] ^= 0xff;
    std::fs::write(&victim, bytes).unwrap();
    std::fs::write(out.join("shard-00007.bin.tmp"), b"left over").unwrap();

    ok(tokenize_cmd(&t, &[&corpus()], &out).args(args));
    assert_same_dataset(&t.path("whole"), &out);
}

#[test]
fn a_finished_dataset_is_left_alone_and_other_options_are_refused() {
    let t = TestDir::new();
    let out = t.path("ds");
    ok(&mut tokenize_cmd(&t, &[&corpus()], &out));
    let before = snapshot(&out);
    let manifest_time = std::fs::metadata(out.join("manifest.json"))
        .unwrap()
        .modified()
        .unwrap();

    let again = ok(t
        .prep()
        .args(["tokenize", "--tokenizer"])
        .arg(gpt2())
        .arg("-i")
        .arg(corpus())
        .arg("-o")
        .arg(&out));
    assert!(String::from_utf8_lossy(&again.stderr).contains("already complete"));
    assert_eq!(
        std::fs::metadata(out.join("manifest.json"))
            .unwrap()
            .modified()
            .unwrap(),
        manifest_time
    );
    assert_eq!(snapshot(&out), before);

    let err = fails(
        tokenize_cmd(&t, &[&corpus()], &out).args(["--bos", "<|endoftext|>"]),
        2,
    );
    assert!(
        err.contains("other inputs or options") && err.contains("--overwrite"),
        "{err}"
    );
    assert_eq!(
        snapshot(&out),
        before,
        "a refused run must not touch the dataset"
    );

    ok(tokenize_cmd(&t, &[&corpus()], &out).args(["--bos", "<|endoftext|>", "--overwrite"]));
    let ds = prep::Dataset::open(&out).unwrap();
    assert_eq!(ds.record(0).unwrap().get(0), Some(50256));
}

/// A word tokenizer over `words` with `<eos>`: fast, so that a test can push
/// hundreds of megabytes through the pipeline.
fn word_tokenizer(t: &TestDir, words: &[String]) -> PathBuf {
    let mut vocab = vec![("[UNK]", 0), ("<eos>", 1)];
    vocab.extend(
        words
            .iter()
            .enumerate()
            .map(|(i, w)| (w.as_str(), i as u32 + 2)),
    );
    word_level(t, "words.tokenizer.json", &vocab, &["<eos>"])
}

#[test]
fn memory_stays_bounded_on_an_input_far_larger_than_the_bound() {
    const INPUT_BYTES: usize = 256 << 20;
    // Bounded means flat: the peak on 256 MiB of input is that on its first
    // 64 MiB, within the slack of the allocator's reuse pool (mimalloc keeps
    // freed segments) and of timing (how many batches are in flight when the
    // peak is taken). A leak of even 1 byte per input byte would add 192 MiB,
    // six times the slack.
    const SLACK: u64 = 32 << 20;
    // And the bound the README states for a small tokenizer on 2 threads.
    const BOUND: u64 = 192 << 20;
    let t = TestDir::new();
    let words: Vec<String> = (0..2000).map(|i| format!("w{i:x}")).collect();
    let tokenizer = word_tokenizer(&t, &words);
    let mut next = xorshift(0x9e37_79b9_7f4a_7c15u64);
    // 4 MiB of random words; documents of 1 to 64 KiB are slices of it, so
    // generating hundreds of megabytes costs little more than writing them.
    let mut pool = String::new();
    while pool.len() < 4 << 20 {
        pool.push_str(&words[(next() % words.len() as u64) as usize]);
        pool.push(' ');
    }
    let path = t.path("big.jsonl");
    let small = t.path("small.jsonl");
    {
        use std::io::Write;
        let mut out = std::io::BufWriter::new(std::fs::File::create(&path).unwrap());
        let mut first = std::io::BufWriter::new(std::fs::File::create(&small).unwrap());
        let mut written = 0;
        while written < INPUT_BYTES {
            let len = 1024 + (next() % (64 << 10)) as usize;
            let start = (next() % (pool.len() - len) as u64) as usize;
            let start = start + pool[start..].find(' ').unwrap() + 1;
            let text = &pool[start..start + len];
            let end = text.rfind(' ').unwrap();
            // Whole lines only: the first quarter is a valid JSONL file too.
            let into_first = written < INPUT_BYTES / 4;
            for part in [
                b"{\"text\": \"".as_slice(),
                &text.as_bytes()[..end],
                b"\"}\n",
            ] {
                out.write_all(part).unwrap();
                if into_first {
                    first.write_all(part).unwrap();
                }
                written += part.len();
            }
        }
    }
    let run = |input: &std::path::Path, out: &std::path::Path| {
        peak_from_summary(
            t.prep()
                .args([
                    "tokenize",
                    "--threads",
                    "2",
                    "--eos",
                    "<eos>",
                    "--shard-size",
                    "64MiB",
                    "--tokenizer",
                ])
                .arg(&tokenizer)
                .arg("--input")
                .arg(input)
                .arg("--output")
                .arg(out),
        )
    };
    // Each peak is the smaller of two runs: a leak adds to both, while a
    // peak caught at a bad moment (the allocator's pool not yet given back,
    // more batches in flight) is seldom caught twice. One run of each
    // measured 175 MiB against 125 MiB in a CI run; 134 to 144 MiB against
    // 139 to 143 MiB alone here.
    let peak_small = run(&small, &t.path("small-ds")).min(run(&small, &t.path("small-ds-2")));
    let first = t.path("ds-1");
    let peak_first = run(&path, &first);
    std::fs::remove_dir_all(&first).unwrap();
    let out = t.path("ds");
    let peak = run(&path, &out).min(peak_first);
    let ds = prep::Dataset::open(&out).unwrap();
    assert!(
        ds.n_tokens() > 40_000_000,
        "the input must be large: {} tokens",
        ds.n_tokens()
    );
    eprintln!(
        "peak RSS {} MiB for {} MiB of input, {} MiB for its first quarter",
        peak >> 20,
        INPUT_BYTES >> 20,
        peak_small >> 20
    );
    assert!(
        peak < peak_small + SLACK,
        "peak RSS grew with the input: {} MiB for {} MiB, {} MiB for a quarter of it",
        peak >> 20,
        INPUT_BYTES >> 20,
        peak_small >> 20
    );
    assert!(
        peak < BOUND,
        "peak RSS {} MiB exceeds the bound of {} MiB",
        peak >> 20,
        BOUND >> 20
    );
}

#[test]
fn a_run_stopped_by_a_bad_line_resumes_with_skip_bad_as_its_error_suggests() {
    let t = TestDir::new();
    // 1,500 good lines, then a malformed one, then more good lines.
    let mut text = String::new();
    for i in 0..2000 {
        if i == 1500 {
            text.push_str("{\"text\": oops}\n");
        } else {
            text.push_str(&format!(
                "{{\"text\": \"document {i} says hello to the tokenizer\"}}\n"
            ));
        }
    }
    let input = t.write("late.jsonl", text);
    let args = ["--shard-size", "16KiB", "--threads", "2"];
    let out = t.path("ds");
    let err = fails(tokenize_cmd(&t, &[&input], &out).args(args), 2);
    assert!(
        err.contains("line 1501") && err.contains("--skip-bad"),
        "{err}"
    );
    let leftovers: Vec<_> = std::fs::read_dir(&out)
        .unwrap()
        .filter_map(|e| e.ok().map(|e| e.file_name().to_string_lossy().into_owned()))
        .filter(|n| n.ends_with(".tmp"))
        .collect();
    assert!(
        leftovers.is_empty(),
        "a failed run left temporary files: {leftovers:?}"
    );
    assert!(
        out.join(".prep-journal.json").exists(),
        "completed shards are kept for a resume"
    );

    let resumed = ok(t
        .prep()
        .args(["tokenize", "--tokenizer"])
        .arg(gpt2())
        .arg("--input")
        .arg(&input)
        .arg("--output")
        .arg(&out)
        .args(args)
        .arg("--skip-bad"));
    assert!(String::from_utf8_lossy(&resumed.stderr).contains("resuming: kept"));
    ok(tokenize_cmd(&t, &[&input], &t.path("fresh"))
        .args(args)
        .arg("--skip-bad"));
    assert_same_dataset(&t.path("fresh"), &out);
    let ds = prep::Dataset::open(&out).unwrap();
    assert_eq!(ds.manifest().provenance.documents.skipped, 1);

    // The dataset skipped a document: without --skip-bad it is not this run's output.
    let err = fails(tokenize_cmd(&t, &[&input], &out).args(args), 2);
    assert!(err.contains("skipped 1 bad documents"), "{err}");
}

/// Both engines write the same shards for any thread count; only the
/// manifest's record of the engine differs, and the fingerprint does not,
/// so a run may resume with the other engine.
#[test]
fn engines_write_the_same_bytes_and_the_manifest_says_which_ran() {
    let t = TestDir::new();
    let mut datasets = Vec::new();
    for (engine, threads) in [("hf", "2"), ("fast", "1"), ("fast", "3"), ("auto", "2")] {
        let out = t.path(&format!("{engine}-{threads}"));
        let mut cmd = tokenize_cmd(&t, &[&corpus()], &out);
        cmd.args([
            "--engine",
            engine,
            "--threads",
            threads,
            "--shard-size",
            "300KiB",
        ]);
        ok(&mut cmd);
        datasets.push((engine, out));
    }
    let manifest = |dir: &Path| -> serde_json::Value {
        serde_json::from_slice(&std::fs::read(dir.join("manifest.json")).unwrap()).unwrap()
    };
    let (_, first) = &datasets[0];
    for (engine, dir) in &datasets {
        let ran = if *engine == "hf" { "hf" } else { "fast" };
        let mut m = manifest(dir);
        assert_eq!(m["provenance"]["options"]["engine"], ran, "{engine}");
        let (mut a, mut b) = (snapshot(first), snapshot(dir));
        a.remove("manifest.json");
        b.remove("manifest.json");
        assert!(a == b, "--engine {engine}: shards differ from --engine hf");
        let mut reference = manifest(first);
        for v in [&mut m, &mut reference] {
            v["provenance"]["options"]["engine"] = serde_json::Value::Null;
            v["provenance"]["created"] = serde_json::Value::Null;
        }
        assert_eq!(
            m, reference,
            "--engine {engine}: manifests differ beyond the engine"
        );
    }
}

/// With `SOURCE_DATE_EPOCH` set, tokenize, shuffle and pack write
/// byte-identical directories, manifests included, whatever the thread
/// count and the wall clock; a malformed value is refused before any work.
#[test]
fn source_date_epoch_makes_every_byte_of_a_run_reproducible() {
    let t = TestDir::new();
    let texts: Vec<String> = (0..40)
        .map(|i| format!("document {i} {}", "words ".repeat(i)))
        .collect();
    let texts: Vec<&str> = texts.iter().map(String::as_str).collect();
    let input = t.write("in.jsonl", jsonl(&texts));
    let epoch = "1798761599";
    // Both runs write in the same place: manifests record their inputs' paths.
    let dir = t.path("run");
    let run = |threads: &str| -> BTreeMap<String, Vec<u8>> {
        let (tok, shuffled, packed) = (dir.join("tok"), dir.join("shuffled"), dir.join("packed"));
        let stage = |mut cmd: Command| {
            ok(cmd
                .env("SOURCE_DATE_EPOCH", epoch)
                .args(["--threads", threads]));
        };
        stage(tokenize_cmd(&t, &[&input], &tok));
        let mut shuffle = t.prep();
        shuffle
            .arg("shuffle")
            .arg(&tok)
            .arg(&shuffled)
            .args(["--seed", "3", "-q"]);
        stage(shuffle);
        let mut pack = t.prep();
        pack.arg("pack")
            .arg(&shuffled)
            .arg(&packed)
            .args(["--seq-len", "16", "-q"]);
        stage(pack);
        let mut files = BTreeMap::new();
        for stage in [&tok, &shuffled, &packed] {
            for e in std::fs::read_dir(stage).unwrap() {
                let path = e.unwrap().path();
                let name = path.strip_prefix(&dir).unwrap().display().to_string();
                files.insert(name, std::fs::read(&path).unwrap());
            }
        }
        std::fs::remove_dir_all(&dir).unwrap();
        files
    };
    let (a, b) = (run("1"), run("3"));
    assert_eq!(a.keys().collect::<Vec<_>>(), b.keys().collect::<Vec<_>>());
    let differ: Vec<&String> = a.keys().filter(|name| a[*name] != b[*name]).collect();
    assert!(differ.is_empty(), "the two runs differ in {differ:?}");
    for stage in ["tok", "shuffled", "packed"] {
        let manifest: serde_json::Value =
            serde_json::from_slice(&a[&format!("{stage}/manifest.json")]).unwrap();
        assert_eq!(
            manifest["provenance"]["created"], "2026-12-31T23:59:59Z",
            "{stage}"
        );
    }
    let out = t.path("refused");
    let mut cmd = tokenize_cmd(&t, &[&input], &out);
    let err = fails(cmd.env("SOURCE_DATE_EPOCH", "yesterday"), 2);
    assert!(err.contains("SOURCE_DATE_EPOCH is \"yesterday\""), "{err}");
    assert!(!out.exists(), "a refused run wrote {}", out.display());
}

#[test]
fn engine_fast_refuses_a_tokenizer_it_does_not_support_and_auto_falls_back() {
    let t = TestDir::new();
    let input = t.write("in.jsonl", jsonl(&["hello world", "two words"]));
    // MiniLM naming an unknown token its vocabulary lacks: HF loads it (and
    // fails only on a word that needs it), the fast engine refuses it.
    let mut json: serde_json::Value = serde_json::from_slice(
        &zstd::decode_all(
            std::fs::File::open(fixture("tokenizers/minilm-wordpiece.tokenizer.json.zst")).unwrap(),
        )
        .unwrap(),
    )
    .unwrap();
    json["model"]["unk_token"] = "<unk>".into();
    let wordpiece = t.write(
        "minilm-no-unk.tokenizer.json",
        serde_json::to_vec(&json).unwrap(),
    );
    let out = t.path("fast");
    let err = fails(
        tokenize_with(&t, &wordpiece, &[&input], &out).args(["--engine", "fast"]),
        2,
    );
    assert!(
        err.contains("--engine fast cannot run this tokenizer"),
        "{err}"
    );
    assert!(
        err.contains("minilm-no-unk"),
        "the message names the file: {err}"
    );
    assert!(!out.join("manifest.json").exists());

    let auto = t.path("auto");
    let mut loud = t.prep();
    loud.arg("tokenize")
        .arg("--tokenizer")
        .arg(&wordpiece)
        .arg("--input")
        .arg(&input)
        .arg("--output")
        .arg(&auto);
    let stderr = String::from_utf8_lossy(&ok(&mut loud).stderr).into_owned();
    assert!(
        stderr.contains("engine hf"),
        "the summary names the engine: {stderr}"
    );
    assert!(stderr.contains("does not support"), "and why: {stderr}");
    let m: serde_json::Value =
        serde_json::from_slice(&std::fs::read(auto.join("manifest.json")).unwrap()).unwrap();
    assert_eq!(m["provenance"]["options"]["engine"], "hf");

    let err = fails(
        tokenize_with(&t, &wordpiece, &[&input], &t.path("x")).args(["--engine", "turbo"]),
        2,
    );
    assert!(err.contains("auto, hf or fast"), "{err}");
}

/// The fixture corpus as plain JSONL at `rel` in `t`, so that a test can
/// edit it in place as a user would.
fn plain_corpus(t: &TestDir, rel: &str) -> PathBuf {
    t.write(
        rel,
        zstd::decode_all(std::fs::File::open(corpus()).unwrap()).unwrap(),
    )
}

/// The XXH3-64 of each file in `dir`, by name, but the lock's (which
/// says who holds the directory).
fn sums(dir: &Path) -> BTreeMap<String, String> {
    std::fs::read_dir(dir)
        .unwrap()
        .filter(|e| e.as_ref().unwrap().file_name() != ".prep-lock")
        .map(|e| {
            let e = e.unwrap();
            let bytes = std::fs::read(e.path()).unwrap();
            (
                e.file_name().to_string_lossy().into_owned(),
                format!("{:016x}", xxhash_rust::xxh3::xxh3_64(&bytes)),
            )
        })
        .collect()
}

/// What `sed -i 's/FROM/TO/g'` does to `path` (FROM and TO of one length:
/// the file keeps its size).
fn sed_in_place(path: &Path, from: &str, to: &str) {
    assert_eq!(from.len(), to.len());
    let text = std::fs::read_to_string(path).unwrap();
    assert!(text.contains(from), "{from:?} is not in {}", path.display());
    let before = std::fs::metadata(path).unwrap().len();
    std::fs::write(path, text.replace(from, to)).unwrap();
    assert_eq!(std::fs::metadata(path).unwrap().len(), before);
}

#[test]
fn an_input_edited_in_place_to_the_same_size_is_made_from_other_inputs_not_complete() {
    let t = TestDir::new();
    let input = t.write(
        "a.jsonl",
        jsonl(&[
            "Configure the build first.",
            "Then run it.",
            "Configure again.",
        ]),
    );
    let out = t.path("tok");
    ok(&mut tokenize_cmd(&t, &[&input], &out));
    let made = std::fs::read(out.join("manifest.json")).unwrap();
    sed_in_place(&input, "Configure", "Konfigure");
    let err = fails(&mut tokenize_cmd(&t, &[&input], &out), 2);
    assert!(err.contains("made from other inputs"), "{err}");
    assert!(!err.contains("already complete"), "{err}");
    assert_eq!(std::fs::read(out.join("manifest.json")).unwrap(), made);
    // --overwrite is the way on: the dataset of the text as it is now.
    ok(tokenize_cmd(&t, &[&input], &out).arg("--overwrite"));
    ok(&mut tokenize_cmd(&t, &[&input], &t.path("fresh")));
    assert_same_dataset(&t.path("fresh"), &out);
}

#[test]
fn an_input_whose_modification_time_alone_changed_is_another_input() {
    let t = TestDir::new();
    let input = t.write("a.jsonl", jsonl(&["one", "two"]));
    let out = t.path("tok");
    ok(&mut tokenize_cmd(&t, &[&input], &out));
    let was = std::fs::metadata(&input).unwrap().modified().unwrap();
    let file = std::fs::File::options().write(true).open(&input).unwrap();
    file.set_modified(was + std::time::Duration::from_nanos(1_000))
        .unwrap();
    drop(file);
    let err = fails(&mut tokenize_cmd(&t, &[&input], &out), 2);
    assert!(err.contains("made from other inputs"), "{err}");
    // The manifest records which version of the input it was made from.
    let manifest: serde_json::Value =
        serde_json::from_slice(&std::fs::read(out.join("manifest.json")).unwrap()).unwrap();
    let recorded = manifest["provenance"]["inputs"][0]["version"]
        .as_str()
        .unwrap();
    assert!(recorded.starts_with("mtime:"), "{recorded}");
}

#[test]
fn a_run_killed_then_its_input_edited_is_not_resumed_onto_the_new_text() {
    let t = TestDir::new();
    let input = plain_corpus(&t, "raw/docs.jsonl");
    let args = ["--threads", "1", "--shard-size", "64KiB"];
    let out = t.path("tok");
    let mut first = tokenize_cmd(&t, &[&input], &out);
    first.args(args);
    kill_after_shards(first, &out, 3);
    let kept = sums(&out);
    sed_in_place(&input, "the ", "THE ");
    let err = fails(tokenize_cmd(&t, &[&input], &out).args(args), 2);
    assert!(err.contains("other inputs"), "{err}");
    assert_eq!(sums(&out), kept, "a refused run changed the directory");
    // Started over, it is the dataset of the new text, every shard of it.
    ok(tokenize_cmd(&t, &[&input], &out)
        .args(args)
        .arg("--overwrite"));
    ok(tokenize_cmd(&t, &[&input], &t.path("fresh")).args(args));
    assert_same_dataset(&t.path("fresh"), &out);
}

#[test]
fn an_edited_journal_line_is_dropped_and_its_shard_made_again() {
    let t = TestDir::new();
    let args = ["--threads", "1", "--shard-size", "64KiB"];
    ok(tokenize_cmd(&t, &[&corpus()], &t.path("whole")).args(args));
    let out = t.path("resumed");
    let mut first = tokenize_cmd(&t, &[&corpus()], &out);
    first.args(args);
    kill_after_shards(first, &out, 3);
    // The second shard's line: its records count changed, still JSON.
    let path = out.join(".prep-journal.json");
    let text = std::fs::read_to_string(&path).unwrap();
    let mut lines: Vec<String> = text.split('\n').map(str::to_owned).collect();
    let line = &mut lines[2];
    let at = line.find("\"n_records\":").unwrap() + "\"n_records\":".len();
    line.insert(at, '1');
    serde_json::from_str::<serde_json::Value>(line).unwrap();
    std::fs::write(&path, lines.join("\n")).unwrap();
    let (first_shard, second_shard) = (
        t.held_inode(&out.join("shard-00000.bin")),
        t.held_inode(&out.join("shard-00001.bin")),
    );
    ok(tokenize_cmd(&t, &[&corpus()], &out).args(args));
    assert_eq!(
        t.held_inode(&out.join("shard-00000.bin")),
        first_shard,
        "kept"
    );
    assert_ne!(
        t.held_inode(&out.join("shard-00001.bin")),
        second_shard,
        "made again"
    );
    ok(t.prep().arg("validate").arg(&out));
    assert_same_dataset(&t.path("whole"), &out);
}

#[test]
fn an_output_inside_an_input_is_refused() {
    let t = TestDir::new();
    let input = t.write("raw/a.jsonl", jsonl(&["one", "two"]));
    let raw = t.path("raw");
    // A directory input, and globs that would reach the output.
    let globs = [
        format!("{}/*", raw.display()),
        format!("{}/**/*.json", raw.display()),
    ];
    let patterns = [
        raw.display().to_string(),
        globs[0].clone(),
        globs[1].clone(),
    ];
    for pattern in patterns {
        let err = fails(&mut tokenize_cmd(&t, &[&pattern], &raw.join("tok")), 2);
        assert!(
            err.contains("raw/tok") && err.contains("inside"),
            "{pattern}: {err}"
        );
        assert!(!raw.join("tok").exists(), "{pattern}");
        fails(
            tokenize_cmd(&t, &[&pattern], &raw.join("tok")).arg("--overwrite"),
            2,
        );
    }
    // A file input inside the output, even with --overwrite.
    let err = fails(tokenize_cmd(&t, &[&input], &raw).arg("--overwrite"), 2);
    assert!(err.contains("holds the input"), "{err}");
    assert_eq!(std::fs::read_dir(&raw).unwrap().count(), 1);
    // Beside the input (not inside it, not holding it) is fine.
    ok(&mut tokenize_cmd(&t, &[&input], &t.path("tok")));
    ok(&mut tokenize_cmd(
        &t,
        &[format!("{}/*.jsonl", raw.display())],
        &raw.join("tok"),
    ));
}

#[test]
fn an_input_written_to_while_it_is_read_is_refused_before_the_commit() {
    let t = TestDir::new();
    let input = plain_corpus(&t, "docs.jsonl");
    let out = t.path("tok");
    let mut child = tokenize_cmd(&t, &[&input], &out)
        .args(["--threads", "1", "--shard-size", "64KiB"])
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let journal = out.join(".prep-journal.json");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(120);
    while std::fs::read(&journal).map_or(0, |b| journaled_shards(&b)) < 1 {
        assert!(child.try_wait().unwrap().is_none(), "ended too soon");
        assert!(std::time::Instant::now() < deadline, "no progress");
        std::thread::sleep(std::time::Duration::from_millis(2));
    }
    // Another program writes the file while prep reads it.
    let was = std::fs::metadata(&input).unwrap().modified().unwrap();
    let file = std::fs::File::options().write(true).open(&input).unwrap();
    file.set_modified(was + std::time::Duration::from_secs(1))
        .unwrap();
    drop(file);
    let done = child.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&done.stderr);
    assert_eq!(done.status.code(), Some(2), "{err}");
    assert!(err.contains("changed while it was read"), "{err}");
    assert!(!out.join("manifest.json").exists());
}
