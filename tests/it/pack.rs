//! `prep pack`: concat rows are the input stream cut every L tokens; bestfit
//! writes every token of every document exactly once and never splits a
//! document that fits a row; the segment index agrees with the rows; the
//! output depends on the seed, never on the thread count.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use crate::common::*;
use prep::format::{atomic_write, Dataset, Dtype, Manifest, Segment, MANIFEST_FILE};
use prep::pack::{self, PackConfig, PackMode};
use prep::tokenize::NoProgress;
use proptest::prelude::*;

/// Writes `docs` as a documents dataset whose manifest says each ends with
/// `eos` (when given).
fn write_docs(dir: &Path, docs: &[Vec<u32>], eos: Option<u32>, shard_size: u64) {
    std::fs::create_dir_all(dir).unwrap();
    write_dataset(dir, Dtype::U16, shard_size, docs);
    let mut m = Manifest::read(dir).unwrap();
    m.vocab_size = 1000;
    m.special_tokens.eos = eos;
    m.eos_appended = eos.is_some();
    atomic_write(&dir.join(MANIFEST_FILE), m.to_json().as_bytes()).unwrap();
}

/// Documents of the given lengths with recognisable tokens (never 0, which
/// the tests use as the pad and separator), each ending with `eos` if given.
fn docs_of(lengths: &[u64], eos: Option<u32>) -> Vec<Vec<u32>> {
    lengths
        .iter()
        .enumerate()
        .map(|(i, &n)| {
            let mut d: Vec<u32> = (0..n)
                .map(|j| 1 + ((i as u32 * 7 + j as u32) % 900))
                .collect();
            if let (Some(e), Some(last)) = (eos, d.last_mut()) {
                *last = e;
            }
            d
        })
        .collect()
}

/// A packed dataset read back: rows, each row's pieces, and the manifest.
struct Packed {
    rows: Vec<Vec<u32>>,
    segments: Vec<Vec<Segment>>,
    manifest: Manifest,
}

fn read_packed(dir: &Path) -> Packed {
    let ds = Dataset::open(dir).unwrap();
    Packed {
        rows: ds.records().map(|r| r.to_vec()).collect(),
        segments: (0..ds.len())
            .map(|i| ds.segments(i).unwrap().to_vec())
            .collect(),
        manifest: ds.manifest().clone(),
    }
}

/// Checks what holds in both modes: rows of L, pieces that tile each row
/// from 0 and hold the tokens of their document at their offset, padding
/// after them, and the manifest's counts. Returns each document's pieces.
fn check_rows(p: &Packed, docs: &[Vec<u32>], l: usize, pad: u32) -> BTreeMap<u64, Vec<(u64, u32)>> {
    let mut by_doc: BTreeMap<u64, Vec<(u64, u32)>> = BTreeMap::new();
    let mut padding = 0u64;
    for (r, (row, segs)) in p.rows.iter().zip(&p.segments).enumerate() {
        assert_eq!(row.len(), l, "row {r}");
        let mut at = 0usize;
        for s in segs {
            assert_eq!(s.start as usize, at, "row {r}: pieces tile the row");
            assert!(s.length > 0);
            let doc = &docs[s.doc as usize];
            let from = s.doc_offset as usize;
            let to = from + s.length as usize;
            assert_eq!(
                &row[at..at + s.length as usize],
                &doc[from..to],
                "row {r}: piece of document {} at {from}",
                s.doc
            );
            by_doc
                .entry(s.doc)
                .or_default()
                .push((s.doc_offset, s.length));
            at += s.length as usize;
        }
        assert!(
            row[at..].iter().all(|&t| t == pad),
            "row {r}: padding after {at}"
        );
        padding += (l - at) as u64;
    }
    let packing = p.manifest.packing.as_ref().unwrap();
    assert_eq!(p.manifest.kind, "packed");
    assert_eq!(p.manifest.seq_len, Some(l as u64));
    assert_eq!(packing.rows, p.rows.len() as u64);
    assert_eq!(packing.pad_tokens, padding);
    assert_eq!(
        packing.pieces,
        p.segments.iter().map(|s| s.len() as u64).sum::<u64>()
    );
    assert_eq!(
        packing.documents,
        docs.iter().filter(|d| !d.is_empty()).count() as u64
    );
    by_doc
}

/// The bestfit guarantees: every token of every document exactly once, a
/// document of at most L tokens in one piece, a longer one in pieces of L
/// in order and one remainder; and only those are counted as cut.
fn check_bestfit(p: &Packed, docs: &[Vec<u32>], l: usize, pad: u32) {
    let by_doc = check_rows(p, docs, l, pad);
    for (i, doc) in docs.iter().enumerate() {
        let mut pieces = by_doc.get(&(i as u64)).cloned().unwrap_or_default();
        pieces.sort_unstable();
        let mut at = 0u64;
        for (k, &(offset, len)) in pieces.iter().enumerate() {
            assert_eq!(offset, at, "document {i}: no gap, no overlap");
            if k + 1 < pieces.len() {
                assert_eq!(
                    len as usize, l,
                    "document {i}: only the last piece is short"
                );
            }
            at += u64::from(len);
        }
        assert_eq!(at, doc.len() as u64, "document {i}: every token once");
        if doc.len() <= l {
            assert!(pieces.len() <= 1, "document {i} fits a row but was split");
        }
    }
    let cut = docs.iter().filter(|d| d.len() > l).count() as u64;
    assert_eq!(p.manifest.packing.as_ref().unwrap().documents_cut, cut);
}

/// The token stream of concat: documents end to end.
fn stream(docs: &[Vec<u32>]) -> Vec<u32> {
    docs.concat()
}

fn config(input: &Path, output: &Path, l: u32, mode: PackMode) -> PackConfig {
    let mut c = PackConfig::new(input, output, l);
    c.mode = mode;
    c.writing.shard_size = 64 << 10;
    c
}

/// The demo corpus tokenized with GPT-2 in small shards.
fn tokenized(t: &TestDir) -> PathBuf {
    let out = t.path("docs");
    ok(
        tokenize_cmd(t, &[fixture("corpus/debian-sample.jsonl.zst")], &out)
            .args(["--shard-size", "256KiB"]),
    );
    out
}

#[test]
fn concat_rows_are_the_stream_cut_every_l_tokens() {
    let t = TestDir::new();
    let input = tokenized(&t);
    let docs = records(&input);
    let all = stream(&docs);
    for l in [7usize, 512, 2048] {
        let out = t.path(&format!("concat-{l}"));
        let o = ok(t.prep().arg("pack").arg(&input).arg(&out).args([
            "--seq-len",
            &l.to_string(),
            "--mode",
            "concat",
            "--shard-size",
            "300KiB",
        ]));
        let summary = String::from_utf8_lossy(&o.stderr);
        assert!(summary.contains("Documents cut"), "{summary}");
        let p = read_packed(&out);
        let expected: Vec<&[u32]> = all.chunks_exact(l).collect();
        assert_eq!(p.rows.len(), expected.len(), "L={l}");
        for (r, row) in p.rows.iter().enumerate() {
            assert_eq!(row.as_slice(), expected[r], "L={l} row {r}");
        }
        let by_doc = check_rows(&p, &docs, l, u32::MAX);
        let packing = p.manifest.packing.as_ref().unwrap();
        assert_eq!(packing.tokens_dropped, (all.len() % l) as u64);
        assert_eq!(packing.pad_tokens, 0);
        // A document is cut when it lies in more than one row or runs into
        // the dropped tail.
        let written = all.len() - all.len() % l;
        let mut at = 0usize;
        let mut cut = 0;
        for (i, d) in docs.iter().enumerate() {
            let whole =
                by_doc.get(&(i as u64)).map_or(0, |p| p.len()) == 1 && at + d.len() <= written;
            if !whole && at < written {
                cut += 1;
            }
            at += d.len();
        }
        assert_eq!(packing.documents_cut, cut, "L={l}");
        assert!(
            run(t.prep().arg("validate").arg(&out)).status.success(),
            "validate L={l}"
        );
    }
}

#[test]
fn concat_pad_last_keeps_every_token_and_a_seed_permutes_rows() {
    let t = TestDir::new();
    let input = tokenized(&t);
    let docs = records(&input);
    let all = stream(&docs);
    let l = 1000;
    let plain = t.path("plain");
    let seeded = t.path("seeded");
    for (out, seed) in [(&plain, None), (&seeded, Some("5"))] {
        let mut cmd = t.prep();
        cmd.arg("pack").arg(&input).arg(out).args([
            "--seq-len",
            "1000",
            "--mode",
            "concat",
            "--pad-last",
            "--pad",
            "!", // id 0 in GPT-2 (the string "0" is a token of its own)
            "-q",
        ]);
        if let Some(seed) = seed {
            cmd.args(["--seed", seed]);
        }
        ok(&mut cmd);
    }
    let p = read_packed(&plain);
    check_rows(&p, &docs, l, 0);
    let last = p.rows.last().unwrap();
    let kept: Vec<u32> = p.rows.concat()[..all.len()].to_vec();
    assert_eq!(kept, all, "nothing lost, in order");
    assert!(last[all.len() % l..].iter().all(|&t| t == 0));
    assert_eq!(p.manifest.packing.as_ref().unwrap().tokens_dropped, 0);

    let s = read_packed(&seeded);
    check_rows(&s, &docs, l, 0);
    assert_ne!(s.rows, p.rows, "the seed changes the order");
    let mut a = p.rows.clone();
    let mut b = s.rows.clone();
    a.sort();
    b.sort();
    assert_eq!(a, b, "the same rows");
    assert!(run(t.prep().arg("validate").arg(&seeded)).status.success());
}

#[test]
fn bestfit_keeps_documents_whole_and_barely_pads_on_real_text() {
    let t = TestDir::new();
    let input = tokenized(&t);
    let docs = records(&input);
    let eos = 50256;
    for l in [512usize, 2048] {
        let out = t.path(&format!("bestfit-{l}"));
        ok(t.prep()
            .arg("pack")
            .arg(&input)
            .arg(&out)
            .args(["--seq-len", &l.to_string(), "-q"]));
        let p = read_packed(&out);
        check_bestfit(&p, &docs, l, eos);
        let packing = p.manifest.packing.as_ref().unwrap();
        assert_eq!(packing.mode, "bestfit");
        assert_eq!(packing.seed, Some(0));
        assert_eq!(
            p.manifest.special_tokens.pad,
            Some(eos),
            "pad defaults to eos"
        );
        // Best fit wastes little: within 2% of the rows concat needs.
        let total: usize = docs.iter().map(Vec::len).sum();
        let concat_rows = total / l;
        assert!(
            (p.rows.len() as f64) < concat_rows as f64 * 1.02 + 1.0,
            "L={l}: {} rows for {concat_rows} concat rows",
            p.rows.len()
        );
        assert!(run(t.prep().arg("validate").arg(&out)).status.success());
    }
}

#[test]
fn output_is_the_same_for_any_thread_count_and_changes_with_the_seed() {
    let t = TestDir::new();
    let input = tokenized(&t);
    let run_with = |name: &str, threads: &str, seed: &str| {
        let out = t.path(name);
        ok(t.prep().arg("pack").arg(&input).arg(&out).args([
            "--seq-len",
            "300",
            "--window",
            "50",
            "--shard-size",
            "64KiB",
            "--threads",
            threads,
            "--seed",
            seed,
            "-q",
        ]));
        snapshot(&out)
    };
    let one = run_with("t1", "1", "9");
    assert!(one.iter().any(|(n, _)| n.ends_with(".seg")));
    assert_eq!(one, run_with("t2", "2", "9"));
    assert_eq!(one, run_with("t3", "3", "9"));
    assert_ne!(one, run_with("s10", "2", "10"));
}

#[test]
fn a_separator_is_added_when_the_input_has_no_eos() {
    let t = TestDir::new();
    let input = t.path("docs");
    let docs = docs_of(&[3, 0, 5, 9, 1, 4], None);
    write_docs(&input, &docs, None, 1 << 20);

    let refused = fails(
        t.prep()
            .arg("pack")
            .arg(&input)
            .arg(t.path("none"))
            .args(["--seq-len", "4"]),
        2,
    );
    assert!(refused.contains("--sep"), "{refused}");
    assert!(!t.path("none/manifest.json").exists());

    let out = t.path("sep");
    ok(t.prep().arg("pack").arg(&input).arg(&out).args([
        "--seq-len",
        "4",
        "--mode",
        "concat",
        "--sep",
        "999",
        "-q",
    ]));
    let with_sep: Vec<Vec<u32>> = docs
        .iter()
        .map(|d| d.iter().copied().chain([999]).collect())
        .collect();
    let p = read_packed(&out);
    let all = stream(&with_sep);
    assert_eq!(p.rows.concat(), all[..all.len() - all.len() % 4]);
    check_rows(&p, &with_sep, 4, u32::MAX);
    assert_eq!(p.manifest.special_tokens.eos, Some(999));
    assert!(p.manifest.eos_appended);
    assert!(run(t.prep().arg("validate").arg(&out)).status.success());

    let bare = t.path("bare");
    ok(t.prep().arg("pack").arg(&input).arg(&bare).args([
        "--seq-len",
        "4",
        "--no-sep",
        "--pad",
        "0",
        "-q",
    ]));
    check_bestfit(&read_packed(&bare), &docs, 4, 0);
}

#[test]
fn bad_options_are_refused_with_exit_2_and_no_output() {
    let t = TestDir::new();
    let input = t.path("docs");
    write_docs(&input, &docs_of(&[3, 5], Some(7)), Some(7), 1 << 20);
    let cases: &[(&[&str], &str)] = &[
        (&["--seq-len", "0"], "at least 1"),
        (&["--seq-len", "8", "--pad-last"], "--pad-last"),
        (
            &["--seq-len", "8", "--mode", "concat", "--window", "5"],
            "--window",
        ),
        (&["--seq-len", "8", "--pad", "1000"], "vocabulary"),
        (&["--seq-len", "8", "--pad", "<nope>"], "<nope>"),
        (&["--seq-len", "8", "--sep", "3"], "already end with eos"),
    ];
    for (i, (args, needle)) in cases.iter().enumerate() {
        let out = t.path(&format!("out{i}"));
        let err = fails(t.prep().arg("pack").arg(&input).arg(&out).args(*args), 2);
        assert!(err.contains(needle), "{args:?}: {err}");
        assert!(!out.join(MANIFEST_FILE).exists(), "{args:?}");
    }
    // The input is never the output, even with --overwrite.
    for out in [
        input.clone(),
        input.join("sub"),
        input.join("..").join("docs"),
    ] {
        let err = fails(
            t.prep()
                .arg("pack")
                .arg(&input)
                .arg(&out)
                .args(["--seq-len", "4", "--overwrite"]),
            2,
        );
        assert!(err.contains("or lies inside it"), "{err}");
    }
    assert!(Dataset::open(&input).is_ok(), "the input is intact");
    // --overwrite replaces prep's files and leaves others be; one of
    // someone else's under a name prep writes is refused by name and kept.
    let mixed = t.path("mixed");
    t.write("mixed/notes.txt", "mine");
    t.write("mixed/shard-00007.seg", "stale");
    let pack_over = |t: &TestDir| {
        let mut cmd = t.prep();
        cmd.arg("pack")
            .arg(&input)
            .arg(&mixed)
            .args(["--seq-len", "4", "--overwrite", "-q"]);
        cmd
    };
    let err = fails(&mut pack_over(&t), 2);
    assert!(err.contains("shard-00007.seg"), "{err}");
    assert_eq!(
        std::fs::read_to_string(mixed.join("shard-00007.seg")).unwrap(),
        "stale"
    );
    std::fs::remove_file(mixed.join("shard-00007.seg")).unwrap();
    ok(&mut pack_over(&t));
    ok(&mut pack_over(&t));
    assert_eq!(
        std::fs::read_to_string(mixed.join("notes.txt")).unwrap(),
        "mine"
    );
    assert!(run(t.prep().arg("validate").arg(&mixed)).status.success());
    // A packed dataset is not packed again, nor read as documents by any
    // stage that reads documents: shuffled or mixed, its rows would make a
    // packed dataset without its segment index. Each names itself and the
    // input, and writes nothing.
    let packed = t.path("packed");
    ok(t.prep()
        .arg("pack")
        .arg(&input)
        .arg(&packed)
        .args(["--seq-len", "4", "-q"]));
    let mix_source = format!("{}:1", packed.display());
    let again = t.path("again");
    let stages: [(&str, Vec<&std::ffi::OsStr>); 4] = [
        (
            "pack",
            vec![
                packed.as_ref(),
                again.as_ref(),
                "--seq-len".as_ref(),
                "4".as_ref(),
            ],
        ),
        (
            "shuffle",
            vec![
                packed.as_ref(),
                again.as_ref(),
                "--seed".as_ref(),
                "1".as_ref(),
            ],
        ),
        (
            "split",
            vec![
                packed.as_ref(),
                again.as_ref(),
                "--val".as_ref(),
                "0.1".as_ref(),
                "--seed".as_ref(),
                "1".as_ref(),
            ],
        ),
        (
            "mix",
            vec![
                "--source".as_ref(),
                mix_source.as_ref(),
                "--tokens".as_ref(),
                "8".as_ref(),
                "--seed".as_ref(),
                "1".as_ref(),
                again.as_ref(),
            ],
        ),
    ];
    for (stage, args) in stages {
        let err = fails(t.prep().arg(stage).args(args), 2);
        let said = format!(
            "{} is a packed dataset; {stage} takes documents datasets",
            packed.display()
        );
        assert!(err.contains(&said), "{stage}: {err}");
        assert!(!again.exists(), "{stage} wrote {}", again.display());
    }
    // Re-running is a no-op; other options on the same output are refused.
    ok(t.prep()
        .arg("pack")
        .arg(&input)
        .arg(&packed)
        .args(["--seq-len", "4", "-q"]));
    let err = fails(
        t.prep()
            .arg("pack")
            .arg(&input)
            .arg(&packed)
            .args(["--seq-len", "5"]),
        2,
    );
    assert!(err.contains("--overwrite"), "{err}");
}

#[test]
fn a_killed_pack_resumes_and_ends_identical() {
    let t = TestDir::new();
    let input = t.path("docs");
    let mut next = xorshift(11);
    let lengths: Vec<u64> = (0..2_000).map(|_| 1 + next() % 300).collect();
    write_docs(&input, &docs_of(&lengths, Some(999)), Some(999), 1 << 20);
    let args = |out: &Path| -> Vec<std::ffi::OsString> {
        vec![
            "pack".into(),
            input.clone().into(),
            out.into(),
            "--seq-len".into(),
            "64".into(),
            "--window".into(),
            "300".into(),
            "--shard-size".into(),
            "2KiB".into(),
            "-q".into(),
        ]
    };
    let whole = t.path("whole");
    ok(t.prep().args(args(&whole)));
    let resumed = t.path("resumed");
    let mut cmd = t.prep();
    cmd.args(args(&resumed));
    kill_after_shards(cmd, &resumed, 20);
    let kept = t.held_inode(&resumed.join("shard-00003.seg"));
    ok(t.prep().args(args(&resumed)));
    assert_eq!(snapshot(&whole), snapshot(&resumed));
    assert_eq!(
        kept,
        t.held_inode(&resumed.join("shard-00003.seg")),
        "finished shards are kept, not rewritten"
    );
}

#[test]
fn validate_finds_broken_segments_and_padding() {
    let t = TestDir::new();
    let input = t.path("docs");
    write_docs(
        &input,
        &docs_of(&[5, 9, 2, 30], Some(999)),
        Some(999),
        1 << 20,
    );
    let out = t.path("packed");
    ok(t.prep()
        .arg("pack")
        .arg(&input)
        .arg(&out)
        .args(["--seq-len", "10", "--pad", "0", "-q"]));
    let report = |dir: &Path| -> String {
        let o = run(t.prep().arg("validate").arg(dir));
        assert_eq!(
            o.status.code(),
            Some(1),
            "{}",
            String::from_utf8_lossy(&o.stdout)
        );
        String::from_utf8_lossy(&o.stdout).into_owned()
    };
    // A piece that does not start where the previous one ended.
    let broken = t.path("broken-seg");
    copy_dir(&out, &broken);
    let seg = broken.join("shard-00000.seg");
    let mut bytes = std::fs::read(&seg).unwrap();
    let p = Dataset::open(&out).unwrap();
    let rows = p.len() as usize;
    let first_entry = 32 + 8 * (rows + 1);
    bytes[first_entry + 16] = 1; // start of the first piece of row 0
    std::fs::write(&seg, &bytes).unwrap();
    let r = report(&broken);
    assert!(r.contains("segments") && r.contains("checksum"), "{r}");
    // A padding token replaced by a real one.
    let broken = t.path("broken-pad");
    copy_dir(&out, &broken);
    let padded = (0..p.len())
        .find(|&i| p.segments(i).unwrap().last().unwrap().end() < 10)
        .unwrap();
    let bin = broken.join("shard-00000.bin");
    let mut bytes = std::fs::read(&bin).unwrap();
    let at = (padded as usize * 10 + 9) * 2;
    bytes[at] = 5;
    std::fs::write(&bin, &bytes).unwrap();
    let r = report(&broken);
    assert!(r.contains("padding"), "{r}");
}

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for e in std::fs::read_dir(from).unwrap() {
        let p = e.unwrap().path();
        std::fs::copy(&p, to.join(p.file_name().unwrap())).unwrap();
    }
}

/// Lengths that matter for a row of L: 0, 1, L-1, L, L+1, 10L, and any.
fn length(l: u64) -> impl Strategy<Value = u64> {
    prop_oneof![
        Just(0),
        Just(1),
        Just(l - 1),
        Just(l),
        Just(l + 1),
        Just(10 * l),
        0..3 * l,
    ]
}

fn lengths_and_l() -> impl Strategy<Value = (u32, Vec<u64>)> {
    prop_oneof![Just(1u32), Just(2), 3u32..40].prop_flat_map(|l| {
        (
            Just(l),
            proptest::collection::vec(length(u64::from(l).max(2)), 0..60),
        )
    })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 40, ..ProptestConfig::default() })]

    #[test]
    fn any_document_lengths_pack_correctly(
        (l, lengths) in lengths_and_l(),
        window in 1u64..80,
        seed in 0u64..4,
    ) {
        let t = TestDir::new();
        let input = t.path("docs");
        let docs = docs_of(&lengths, None);
        write_docs(&input, &docs, None, 256);

        let out = t.path("bestfit");
        let mut c = config(&input, &out, l, PackMode::BestFit);
        c.no_sep = true;
        c.pad = Some("0".into());
        c.window = window;
        c.seed = Some(seed);
        c.threads = 2;
        pack::run(&c, &NoProgress).unwrap();
        check_bestfit(&read_packed(&out), &docs, l as usize, 0);

        let out = t.path("concat");
        let mut c = config(&input, &out, l, PackMode::Concat);
        c.no_sep = true;
        pack::run(&c, &NoProgress).unwrap();
        let p = read_packed(&out);
        let all = stream(&docs);
        let rows: Vec<&[u32]> = all.chunks_exact(l as usize).collect();
        prop_assert_eq!(p.rows.len(), rows.len());
        for (a, b) in p.rows.iter().zip(rows) {
            prop_assert_eq!(a.as_slice(), b);
        }
        check_rows(&p, &docs, l as usize, u32::MAX);
    }
}

#[test]
fn no_pad_token_is_refused_before_anything_is_written() {
    let t = TestDir::new();
    let input = t.path("docs");
    // No eos, no pad: nothing to pad a short row with.
    write_docs(&input, &docs_of(&[3, 5], None), None, 1 << 20);
    for args in [
        &["--seq-len", "4", "--no-sep"][..],
        &[
            "--seq-len",
            "3",
            "--no-sep",
            "--mode",
            "concat",
            "--pad-last",
        ][..],
    ] {
        let out = t.path("out");
        let err = fails(t.prep().arg("pack").arg(&input).arg(&out).args(args), 2);
        assert!(err.contains("--pad"), "{err}");
        assert!(!out.exists(), "{args:?}: nothing written");
    }
    // concat without --pad-last pads nothing and needs no pad token.
    ok(t.prep().arg("pack").arg(&input).arg(t.path("ok")).args([
        "--seq-len",
        "4",
        "--no-sep",
        "--mode",
        "concat",
        "-q",
    ]));
}

/// Issue 51: pack copied a damaged input's tokens into rows under fresh
/// checksums (exit 0); an id past the vocabulary went through too. Every
/// mode refuses such an input by its file and chunk now, and nothing is
/// committed.
#[test]
fn a_damaged_input_is_refused_by_name_in_every_mode() {
    let t = TestDir::new();
    for (name, file, why) in damage::DAMAGED {
        let input = damage::fixture_copy(&t, name);
        for (k, mode) in [
            &["--mode", "concat"][..],
            &["--mode", "concat", "--seed", "4"],
            &["--mode", "bestfit", "--window", "5"],
        ]
        .iter()
        .enumerate()
        {
            let out = t.path(&format!("{name}-{k}"));
            let mut cmd = t.prep();
            cmd.arg("pack")
                .arg(&input)
                .arg(&out)
                .args(["--seq-len", "16", "--quiet"])
                .args(*mode);
            damage::refused(&mut cmd, &format!("{name}/{file}"), why, &out);
        }
    }
}

/// Issue 51: an id past GPT-2's vocabulary (65,471) in a freshly tokenized
/// input, its checksums rewritten to match, is refused by pack and shuffle
/// by the input's name, as export and validate refuse it.
#[test]
fn an_id_past_the_vocabulary_is_refused_by_pack_and_shuffle() {
    let t = TestDir::new();
    let input = tokenized(&t);
    let m = Manifest::read(&input).unwrap();
    let info = &m.shards[0];
    let bin = input.join(&info.bin);
    let mut bytes = std::fs::read(&bin).unwrap();
    bytes[100..102].copy_from_slice(&65471u16.to_le_bytes());
    std::fs::write(&bin, &bytes).unwrap();
    // The checksums made to match: only the id rule is left to catch it.
    let mut m = m.clone();
    m.shards[0].bin_xxh3 = prep::format::checksum_hex(xxhash_rust::xxh3::xxh3_64(&bytes));
    m.shards[0].sum = None;
    m.shards[0].sum_bytes = None;
    m.shards[0].sum_xxh3 = None;
    atomic_write(&input.join(MANIFEST_FILE), m.to_json().as_bytes()).unwrap();
    let why = "is id 65471, not below the vocabulary size 50257";
    let out = t.path("packed");
    damage::refused(
        t.prep()
            .arg("pack")
            .arg(&input)
            .arg(&out)
            .args(["--seq-len", "64", "--quiet"]),
        &info.bin,
        why,
        &out,
    );
    let out = t.path("shuffled");
    damage::refused(
        t.prep()
            .args(["shuffle", "--quiet", "--seed", "2"])
            .arg(&input)
            .arg(&out),
        &info.bin,
        why,
        &out,
    );
}

/// Issue 51: a mask byte of 2 in the input made pack fail with an error
/// that named the output's `.mask`. It names the input's now, with the
/// byte and its record, and nothing is committed; shuffle says the same.
#[test]
fn a_mask_byte_of_2_is_named_in_the_input() {
    let t = TestDir::new();
    let (input, mask) = damage::mask_byte_of_2(&t, "masked");
    let mask = mask.display().to_string();
    let why = "loss mask byte 5 (record 0) is 2";
    for mode in ["concat", "bestfit"] {
        let out = t.path(&format!("packed-{mode}"));
        let err = damage::refused(
            t.prep().arg("pack").arg(&input).arg(&out).args([
                "--seq-len",
                "8",
                "--quiet",
                "--mode",
                mode,
            ]),
            &mask,
            why,
            &out,
        );
        assert!(!err.contains(&*out.to_string_lossy()), "{err}");
    }
    let out = t.path("shuffled");
    damage::refused(
        t.prep()
            .args(["shuffle", "--quiet", "--seed", "2"])
            .arg(&input)
            .arg(&out),
        &mask,
        why,
        &out,
    );
}
