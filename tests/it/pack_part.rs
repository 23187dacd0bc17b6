//! `prep pack --part I/N`: the parts' rows and segments, joined in part
//! order, are the one-machine output row for row, and their counts add up to
//! its counts; every part is a valid dataset on its own, is the same on every
//! run, and resumes when interrupted.

use std::path::{Path, PathBuf};

use crate::common::*;
use prep::format::{atomic_write, Dataset, Dtype, Manifest, Packing, Segment, MANIFEST_FILE};

/// The part counts every case is split into.
const PARTS: [u64; 4] = [1, 2, 3, 7];

/// A documents dataset of `n` documents of 0 to `max_len` tokens (a few
/// empty), each ending with eos 999, in several input shards.
fn input(t: &TestDir, n: usize, max_len: u64) -> PathBuf {
    let dir = t.path("docs");
    std::fs::create_dir_all(&dir).unwrap();
    let mut next = xorshift(5);
    let docs: Vec<Vec<u32>> = (0..n)
        .map(|i| {
            let len = if i % 97 == 3 { 0 } else { 1 + next() % max_len };
            let mut d: Vec<u32> = (0..len)
                .map(|j| 1 + ((i as u64 * 7 + j) % 900) as u32)
                .collect();
            if let Some(last) = d.last_mut() {
                *last = 999;
            }
            d
        })
        .collect();
    write_dataset(&dir, Dtype::U16, 32 << 10, &docs);
    let mut m = Manifest::read(&dir).unwrap();
    m.vocab_size = 1000;
    m.special_tokens.eos = Some(999);
    m.eos_appended = true;
    atomic_write(&dir.join(MANIFEST_FILE), m.to_json().as_bytes()).unwrap();
    dir
}

/// `prep pack IN OUT`, quiet, with rows of 64 tokens, shards of 256 rows,
/// and `args`.
fn pack(t: &TestDir, input: &Path, out: &Path, args: &[&str]) -> std::process::Command {
    let mut cmd = pack_in_shards(t, input, out, "32KiB", args);
    cmd.arg("-q");
    cmd
}

/// `prep pack IN OUT` with rows of 64 tokens, shards of `shard_size`, and `args`.
fn pack_in_shards(
    t: &TestDir,
    input: &Path,
    out: &Path,
    shard_size: &str,
    args: &[&str],
) -> std::process::Command {
    let mut cmd = t.prep();
    cmd.arg("pack")
        .arg(input)
        .arg(out)
        .args(["--seq-len", "64", "--shard-size", shard_size])
        .args(args);
    cmd
}

/// A packed dataset read back.
struct Packed {
    rows: Vec<Vec<u32>>,
    segments: Vec<Vec<Segment>>,
    manifest: Manifest,
}

fn read(dir: &Path) -> Packed {
    let ds = Dataset::open(dir).unwrap();
    Packed {
        rows: ds.records().map(|r| r.to_vec()).collect(),
        segments: (0..ds.len())
            .map(|i| ds.segments(i).unwrap().to_vec())
            .collect(),
        manifest: ds.manifest().clone(),
    }
}

/// Packs `input` with `args` on one machine and in `n` parts for every `n`
/// of [`PARTS`], and checks that the parts join into the one-machine output.
/// Returns the one-machine counts and the row counts of the parts, per `n`.
fn parts_join_into_the_whole(
    t: &TestDir,
    input: &Path,
    name: &str,
    args: &[&str],
) -> (Packing, Vec<Vec<u64>>) {
    let whole_dir = t.path(&format!("{name}-whole"));
    ok(&mut pack(t, input, &whole_dir, args));
    let whole = read(&whole_dir);
    let w = whole.manifest.packing.clone().unwrap();
    assert!(whole.manifest.partition.is_none(), "{name}");
    let mut shares = Vec::new();
    for n in PARTS {
        let mut rows = Vec::new();
        let mut segments = Vec::new();
        let mut sum = [0u64; 8];
        let mut fingerprints = Vec::new();
        let mut share = Vec::new();
        for i in 0..n {
            let dir = t.path(&format!("{name}-{n}-{i}"));
            ok(pack(t, input, &dir, args).args(["--part", &format!("{i}/{n}")]));
            let o = run(t.prep().arg("validate").arg(&dir));
            assert!(
                o.status.success(),
                "{name} part {i}/{n} does not validate: {}",
                String::from_utf8_lossy(&o.stdout)
            );
            let p = read(&dir);
            let m = &p.manifest;
            let partition = m.partition.as_ref().expect("a part says which it is");
            assert_eq!(
                (partition.stage.as_str(), partition.part, partition.parts),
                ("pack", i, n),
                "{name}"
            );
            assert_eq!(
                partition.job, whole.manifest.provenance.fingerprint,
                "{name}: the job is the one-machine fingerprint"
            );
            // A part records the options of the whole run and which part it is.
            let mut options = m.provenance.options.clone();
            let named = options.as_object_mut().unwrap().remove("part");
            assert_eq!(named, Some(format!("{i}/{n}").into()), "{name}");
            assert_eq!(options, whole.manifest.provenance.options);
            fingerprints.push(m.provenance.fingerprint.clone());
            let k = m.packing.as_ref().unwrap();
            let d = &m.provenance.documents;
            for (s, x) in sum.iter_mut().zip([
                k.rows,
                k.pad_tokens,
                k.documents,
                k.documents_cut,
                k.pieces,
                k.tokens_dropped,
                d.read,
                d.written,
            ]) {
                *s += x;
            }
            share.push(k.rows);
            rows.extend(p.rows);
            segments.extend(p.segments);
        }
        assert_eq!(rows, whole.rows, "{name}: rows of {n} parts");
        assert_eq!(segments, whole.segments, "{name}: segments of {n} parts");
        let d = &whole.manifest.provenance.documents;
        assert_eq!(
            sum,
            [
                w.rows,
                w.pad_tokens,
                w.documents,
                w.documents_cut,
                w.pieces,
                w.tokens_dropped,
                d.read,
                d.written
            ],
            "{name}: counts of {n} parts (rows, pad, documents, cut, pieces, dropped, read, written)"
        );
        fingerprints.push(whole.manifest.provenance.fingerprint.clone());
        fingerprints.sort();
        fingerprints.dedup();
        assert_eq!(
            fingerprints.len() as u64,
            n + 1,
            "{name}: every part its own fingerprint"
        );
        shares.push(share);
    }
    (w, shares)
}

#[test]
fn concat_parts_join_into_the_one_machine_output() {
    let t = TestDir::new();
    let input = input(&t, 600, 300);
    for (name, args) in [
        ("plain", &["--mode", "concat"][..]),
        ("seeded", &["--mode", "concat", "--seed", "7"]),
        ("pad-last", &["--mode", "concat", "--pad-last"]),
        (
            "pad-last-seeded",
            &["--mode", "concat", "--pad-last", "--seed", "3"],
        ),
    ] {
        let (whole, shares) = parts_join_into_the_whole(&t, &input, name, args);
        // The dropped tail and the padded last row are both exercised.
        if name.starts_with("pad-last") {
            assert!(whole.pad_tokens > 0 && whole.tokens_dropped == 0, "{name}");
        } else {
            assert!(whole.pad_tokens == 0 && whole.tokens_dropped > 0, "{name}");
        }
        // Rows are split evenly, whatever the documents.
        for share in shares {
            let (lo, hi) = (share.iter().min().unwrap(), share.iter().max().unwrap());
            assert!(hi - lo <= 1, "{name}: {share:?}");
        }
    }
}

#[test]
fn bestfit_parts_join_into_the_one_machine_output() {
    let t = TestDir::new();
    let input = input(&t, 600, 300);
    // 12 windows: every part has work.
    let (_, shares) =
        parts_join_into_the_whole(&t, &input, "windows", &["--window", "50", "--seed", "4"]);
    assert!(shares.iter().flatten().all(|&rows| rows > 0));
    // 3 windows for up to 7 parts: the parts past them write empty datasets.
    let (_, shares) = parts_join_into_the_whole(&t, &input, "few", &["--window", "250"]);
    let seven = shares.last().unwrap();
    assert_eq!(
        seven.iter().filter(|&&rows| rows > 0).count(),
        3,
        "{seven:?}"
    );
}

#[test]
fn more_parts_than_rows_write_empty_valid_datasets() {
    let t = TestDir::new();
    let input = input(&t, 4, 40);
    let (whole, _) =
        parts_join_into_the_whole(&t, &input, "tiny", &["--mode", "concat", "--pad-last"]);
    assert!(whole.rows > 0 && whole.rows < 7, "{}", whole.rows);
}

#[test]
fn a_part_is_the_same_on_every_run_and_for_any_thread_count() {
    let t = TestDir::new();
    let input = input(&t, 600, 300);
    for args in [
        &["--mode", "concat", "--seed", "9"][..],
        &["--window", "50"],
    ] {
        let part = ["--part", "1/3"];
        let first = t.path("first");
        let again = t.path("again");
        ok(pack(&t, &input, &first, args).args(part).args(["-t", "1"]));
        ok(pack(&t, &input, &again, args).args(part).args(["-t", "3"]));
        assert_eq!(snapshot(&first), snapshot(&again), "{args:?}");
        // Run again into its own directory: already complete, left alone.
        let before = std::fs::read(first.join(MANIFEST_FILE)).unwrap();
        ok(pack(&t, &input, &first, args).args(part));
        assert_eq!(std::fs::read(first.join(MANIFEST_FILE)).unwrap(), before);
        // Another part into the same directory is refused.
        let err = fails(pack(&t, &input, &first, args).args(["--part", "2/3"]), 2);
        assert!(err.contains("other inputs or options"), "{err}");
        std::fs::remove_dir_all(&first).unwrap();
        std::fs::remove_dir_all(&again).unwrap();
    }
}

#[test]
fn an_interrupted_part_resumes_and_ends_identical() {
    let t = TestDir::new();
    let input = input(&t, 600, 300);
    for args in [
        &["--mode", "concat", "--seed", "2"][..],
        &["--window", "50"],
    ] {
        let part = ["--part", "1/2"];
        let done = t.path("done");
        ok(pack_in_shards(&t, &input, &done, "8KiB", args).args(part));
        // What a run killed after three shards leaves: their files, a journal
        // naming them, a half-written fourth, and no manifest.
        let cut = t.path("cut");
        copy_dir(&done, &cut);
        let m = Manifest::read(&cut).unwrap();
        assert!(m.shards.len() > 4, "{args:?}: too few shards to interrupt");
        std::fs::remove_file(cut.join(MANIFEST_FILE)).unwrap();
        for s in &m.shards[3..] {
            for f in [&s.bin, &s.idx, s.seg.as_ref().unwrap()] {
                std::fs::remove_file(cut.join(f)).unwrap();
            }
        }
        std::fs::write(cut.join(&m.shards[3].bin), b"partial").unwrap();
        let journal = prep::output::Journal {
            fingerprint: m.provenance.fingerprint.clone(),
            state: (),
            shards: m.shards[..3]
                .iter()
                .map(|s| prep::output::Done {
                    shard: s.clone(),
                    at: (),
                })
                .collect(),
        };
        std::fs::write(cut.join(".prep-journal.json"), journal.to_lines()).unwrap();
        let o = ok(pack_in_shards(&t, &input, &cut, "8KiB", args).args(part));
        let said = String::from_utf8_lossy(&o.stderr);
        assert!(said.contains("kept 3 complete shards"), "{args:?}: {said}");
        assert_eq!(snapshot(&done), snapshot(&cut), "{args:?}");
        std::fs::remove_dir_all(&done).unwrap();
        std::fs::remove_dir_all(&cut).unwrap();
    }
}

#[test]
fn a_bad_part_is_refused_with_exit_2() {
    let t = TestDir::new();
    let input = input(&t, 20, 300);
    for bad in ["3/3", "1/0", "x/2", "2", "-1/2", "1/2/3", ""] {
        let out = t.path("out");
        let flag = format!("--part={bad}");
        let err = fails(&mut pack(&t, &input, &out, &[&flag]), 2);
        assert!(err.contains("part"), "{bad:?}: {err}");
        assert!(!out.join(MANIFEST_FILE).exists());
    }
}

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for e in std::fs::read_dir(from).unwrap() {
        let e = e.unwrap();
        std::fs::copy(e.path(), to.join(e.file_name())).unwrap();
    }
}
