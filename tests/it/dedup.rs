//! `prep dedup`: near-duplicates found at the rate the banding formula
//! gives, against the exact Jaccard similarity of every planted pair; the
//! same output for any thread count and memory budget; resumed after a
//! kill; refused inputs.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};

use prep::dedup::minhash::{candidate_probability, jaccard, Params};
use prep::format::Dtype;

use crate::common::*;

/// A document of `n` random ids from a vocabulary of 50,000.
fn random_doc(next: &mut impl FnMut() -> u64, n: usize) -> Vec<u32> {
    (0..n).map(|_| (next() % 50_000) as u32).collect()
}

/// `doc` with an edit of kind `kind` and size `size`: substitutions,
/// insertions, deletions, a changed header, or two halves swapped.
fn edited(doc: &[u32], kind: u64, size: usize, next: &mut impl FnMut() -> u64) -> Vec<u32> {
    let mut d = doc.to_vec();
    match kind {
        0 => {
            for _ in 0..size {
                let at = (next() % d.len() as u64) as usize;
                d[at] = (next() % 50_000) as u32;
            }
        }
        1 => {
            for _ in 0..size {
                let at = (next() % d.len() as u64) as usize;
                d.insert(at, (next() % 50_000) as u32);
            }
        }
        2 => {
            for _ in 0..size {
                let at = (next() % d.len() as u64) as usize;
                d.remove(at);
            }
        }
        3 => {
            // A new header of `4 * size` tokens in place of the old one.
            let header = (4 * size).min(d.len() / 2);
            for x in &mut d[..header] {
                *x = (next() % 50_000) as u32;
            }
        }
        _ => {
            // Paragraphs swapped: the document cut in `size + 1` pieces, rotated.
            let cut = d.len() * (size % 7 + 1) / 8;
            d.rotate_left(cut);
        }
    }
    d
}

/// A corpus of unrelated documents with planted near-duplicates, in a
/// mixed order: the records, and each planted pair `(a, b)`, `a < b`.
fn planted(seed: u64, bases: usize, copies: usize) -> (Vec<Vec<u32>>, Vec<(u64, u64)>) {
    let mut next = xorshift(seed);
    let mut docs: Vec<(u64, Vec<u32>, Option<usize>)> = Vec::new();
    for i in 0..bases {
        let len = 150 + (next() % 250) as usize;
        let doc = random_doc(&mut next, len);
        if i < copies {
            let kind = next() % 5;
            let size = 1 + (next() % 30) as usize;
            docs.push((next(), edited(&doc, kind, size, &mut next), Some(i)));
        }
        docs.push((next(), doc, Some(i).filter(|&i| i < copies)));
    }
    // A random order: a copy often comes before its original.
    docs.sort_by_key(|d| d.0);
    let mut at: HashMap<usize, Vec<u64>> = HashMap::new();
    for (g, d) in docs.iter().enumerate() {
        if let Some(i) = d.2 {
            at.entry(i).or_default().push(g as u64);
        }
    }
    let pairs = at.values().map(|p| (p[0], p[1])).collect();
    (docs.into_iter().map(|d| d.1).collect(), pairs)
}

/// `docs` written as the dataset `docs` of `t`.
fn dataset(t: &TestDir, dtype: Dtype, docs: &[Vec<u32>]) -> PathBuf {
    let dir = t.path("docs");
    std::fs::create_dir_all(&dir).unwrap();
    write_dataset(&dir, dtype, 1 << 20, docs);
    dir
}

/// `docs` written as the uint32 dataset `name` of `t`.
fn dataset_named(t: &TestDir, name: &str, docs: &[Vec<u32>]) -> PathBuf {
    let dir = t.path(name);
    std::fs::create_dir_all(&dir).unwrap();
    write_dataset(&dir, Dtype::U32, 1 << 20, docs);
    dir
}

fn dedup(t: &TestDir, input: &Path, out: &Path) -> std::process::Command {
    let mut cmd = t.prep();
    cmd.arg("dedup").arg(input).arg(out).arg("-q");
    cmd
}

/// The report: removed document to the one kept for it.
fn report(out: &Path) -> BTreeMap<u64, u64> {
    let text = std::fs::read_to_string(out.join("duplicates.jsonl")).unwrap();
    text.lines()
        .map(|l| {
            let v: serde_json::Value = serde_json::from_str(l).unwrap();
            (v["doc"].as_u64().unwrap(), v["kept"].as_u64().unwrap())
        })
        .collect()
}

#[test]
fn planted_pairs_are_found_at_the_rate_the_banding_formula_gives() {
    let t = TestDir::new();
    let (docs, pairs) = planted(11, 3000, 2000);
    let input = dataset(&t, Dtype::U32, &docs);
    let out = t.path("out");
    ok(&mut dedup(&t, &input, &out));
    let removed = report(&out);
    let params = Params::default();

    // Every removed document is one of a planted pair, removed for its
    // partner, which comes first: nothing unrelated is ever a duplicate.
    let partner: HashMap<u64, u64> = pairs.iter().map(|&(a, b)| (b, a)).collect();
    for (doc, kept) in &removed {
        assert_eq!(partner.get(doc), Some(kept), "{doc} removed for {kept}");
    }
    // Found pairs per bin of true similarity against the formula's
    // expectation, within four standard deviations (and one pair).
    let mut bins = vec![(0u64, 0f64, 0f64, 0u64); 10];
    for &(a, b) in &pairs {
        let s = jaccard(&docs[a as usize], &docs[b as usize], params.ngram);
        let p = candidate_probability(s, &params);
        let bin = &mut bins[((s * 10.0) as usize).min(9)];
        bin.0 += 1;
        bin.1 += p;
        bin.2 += p * (1.0 - p);
        bin.3 += u64::from(removed.get(&b) == Some(&a));
    }
    let mut table = String::new();
    for (i, (n, expected, variance, found)) in bins.iter().enumerate() {
        table += &format!(
            "  s in [{:.1}, {:.1}): {n} pairs, {found} found, {expected:.1} expected\n",
            i as f64 / 10.0,
            (i + 1) as f64 / 10.0
        );
        assert!(
            (*found as f64 - expected).abs() <= 4.0 * variance.sqrt() + 1.0,
            "bin {i}: {found} found, {expected:.1} expected\n{table}"
        );
    }
    eprintln!("{table}");
    // The planted similarities span the threshold, so both sides are tested.
    let low: u64 = bins[..6].iter().map(|b| b.0).sum();
    let high: u64 = bins[8..].iter().map(|b| b.0).sum();
    assert!(low > 200 && high > 200, "{table}");

    // The output is the input without the removed documents, in order.
    let expected: Vec<Vec<u32>> = docs
        .iter()
        .enumerate()
        .filter(|(g, _)| !removed.contains_key(&(*g as u64)))
        .map(|(_, d)| d.clone())
        .collect();
    assert_eq!(records(&out), expected);
    ok(t.prep().arg("validate").arg(&out));
    let m: serde_json::Value =
        serde_json::from_slice(&std::fs::read(out.join("manifest.json")).unwrap()).unwrap();
    let counts = &m["provenance"]["documents"];
    assert_eq!(counts["deduplicated"], removed.len() as u64);
    assert_eq!(counts["written"], (docs.len() - removed.len()) as u64);
    assert_eq!(m["provenance"]["report"]["file"], "duplicates.jsonl");
}

#[test]
fn clusters_keep_their_first_document_and_chains_join() {
    let t = TestDir::new();
    let mut next = xorshift(5);
    let a = random_doc(&mut next, 400);
    // b is a near copy of a, c of b: one cluster of three.
    let b = edited(&a, 0, 2, &mut next);
    let c = edited(&b, 0, 2, &mut next);
    let other = random_doc(&mut next, 400);
    let docs = vec![other.clone(), c, a, Vec::new(), b, Vec::new(), other];
    let input = dataset(&t, Dtype::U32, &docs);
    let out = t.path("out");
    ok(&mut dedup(&t, &input, &out));
    // Empty documents are never duplicates of each other.
    assert_eq!(report(&out), BTreeMap::from([(2, 1), (4, 1), (6, 0)]));
    ok(t.prep().arg("validate").arg(&out));

    // validate checks the report the manifest lists, as it checks shards.
    let path = out.join("duplicates.jsonl");
    let text = std::fs::read_to_string(&path).unwrap();
    std::fs::write(&path, text.replace("\"kept\":0", "\"kept\":5")).unwrap();
    let said = run(t.prep().arg("validate").arg(&out));
    assert_eq!(said.status.code(), Some(1));
    let said = String::from_utf8_lossy(&said.stdout);
    assert!(
        said.contains("duplicates.jsonl") && said.contains("XXH3"),
        "{said}"
    );
    std::fs::remove_file(&path).unwrap();
    let said = run(t.prep().arg("validate").arg(&out));
    assert_eq!(said.status.code(), Some(1));
    let said = String::from_utf8_lossy(&said.stdout);
    assert!(said.contains("the report is missing"), "{said}");
}

#[test]
fn the_output_is_the_same_for_any_thread_count_and_memory_budget() {
    let t = TestDir::new();
    let (docs, _) = planted(3, 1200, 600);
    let narrow: Vec<Vec<u32>> = docs
        .iter()
        .map(|d| d.iter().map(|x| x % 65_000).collect())
        .collect();
    let input = dataset(&t, Dtype::U16, &narrow);
    let base = t.path("base");
    ok(dedup(&t, &input, &base).args(["--threads", "1"]));
    let spilled = t.path("spilled");
    let run = ok(t.prep().arg("dedup").arg(&input).arg(&spilled).args([
        "--threads",
        "3",
        "--memory",
        "1KiB",
    ]));
    let stderr = String::from_utf8_lossy(&run.stderr);
    assert!(stderr.contains("sorted runs spilled"), "{stderr}");
    assert_eq!(snapshot(&base), snapshot(&spilled));
    assert!(!spilled.join(".dedup-tmp").exists());
    // Another seed draws other hash functions: another output.
    let seeded = t.path("seeded");
    ok(dedup(&t, &input, &seeded).args(["--seed", "2"]));
    assert_ne!(
        std::fs::read(base.join("manifest.json")).unwrap(),
        std::fs::read(seeded.join("manifest.json")).unwrap()
    );
    // Run again: already complete, nothing rewritten.
    let kept = t.held_inode(&base.join("shard-00000.bin"));
    ok(dedup(&t, &input, &base).args(["--threads", "1"]));
    assert_eq!(t.held_inode(&base.join("shard-00000.bin")), kept);
}

fn killed_run(t: &TestDir) -> (PathBuf, PathBuf, PathBuf) {
    let (docs, _) = planted(8, 600, 400);
    let input = dataset(t, Dtype::U32, &docs);
    let whole = t.path("whole");
    ok(dedup(t, &input, &whole).args(KILLED_ARGS));
    let out = t.path("resumed");
    let mut first = dedup(t, &input, &out);
    first.args(KILLED_ARGS);
    kill_after_shards(first, &out, 5);
    (input, whole, out)
}

/// The flags of [`killed_run`]'s runs: small shards, one thread.
const KILLED_ARGS: [&str; 4] = ["--shard-size", "4KiB", "--threads", "1"];

/// The killed run run again, not quiet: its stderr.
fn run_again(t: &TestDir, input: &Path, out: &Path) -> String {
    let mut again = t.prep();
    again.arg("dedup").arg(input).arg(out).args(KILLED_ARGS);
    String::from_utf8_lossy(&ok(&mut again).stderr).into_owned()
}

#[test]
fn a_killed_run_resumes_from_its_clusters_and_last_shard() {
    let t = TestDir::new();
    let (input, whole, out) = killed_run(&t);
    let kept = t.held_inode(&out.join("shard-00000.bin"));
    let stderr = run_again(&t, &input, &out);
    assert!(stderr.contains("clusters are already made"), "{stderr}");
    assert!(stderr.contains("already in complete shards"), "{stderr}");
    assert_eq!(t.held_inode(&out.join("shard-00000.bin")), kept);
    assert_eq!(snapshot(&whole), snapshot(&out));
}

#[test]
fn a_damaged_work_file_is_made_again_and_changes_nothing() {
    let t = TestDir::new();
    let (input, whole, out) = killed_run(&t);
    let removed = out.join(".dedup-tmp/removed.bin");
    let mut bytes = std::fs::read(&removed).unwrap();
    bytes[3] ^= 0x40;
    std::fs::write(&removed, bytes).unwrap();
    let stderr = run_again(&t, &input, &out);
    assert!(!stderr.contains("already made"), "{stderr}");
    assert_eq!(snapshot(&whole), snapshot(&out));
}

#[test]
fn exact_dedup_first_then_near_dedup() {
    let t = TestDir::new();
    let words: Vec<String> = (0..400).map(|i| format!("w{i}")).collect();
    let vocab: Vec<(&str, u32)> = words
        .iter()
        .enumerate()
        .map(|(i, w)| (w.as_str(), i as u32))
        .collect();
    let tokenizer = word_level(&t, "words.json", &vocab, &[]);
    let mut next = xorshift(9);
    let text = |next: &mut dyn FnMut() -> u64| -> Vec<String> {
        (0..120)
            .map(|_| words[(next() % 400) as usize].clone())
            .collect()
    };
    let a = text(&mut next);
    let mut near = a.clone();
    near[60] = "w1".into();
    let b = text(&mut next);
    let texts = [a.join(" "), b.join(" "), a.join(" "), near.join(" ")];
    let refs: Vec<&str> = texts.iter().map(String::as_str).collect();
    let raw = t.write("raw/docs.jsonl", jsonl(&refs));
    let tok = t.path("tok");
    ok(tokenize_with(&t, &tokenizer, &[&raw], &tok).arg("--dedup"));
    assert_eq!(
        records(&tok).len(),
        3,
        "the exact copy is dropped by tokenize"
    );
    let out = t.path("out");
    ok(&mut dedup(&t, &tok, &out));
    assert_eq!(report(&out), BTreeMap::from([(2, 0)]));
    assert_eq!(records(&out).len(), 2);
}

#[test]
fn refused_inputs_and_options_exit_2_and_write_nothing() {
    let t = TestDir::new();
    let (docs, _) = planted(2, 50, 10);
    let input = dataset(&t, Dtype::U32, &docs);
    for args in [["--bands", "0"], ["--rows", "0"], ["--ngram", "0"]] {
        let err = fails(dedup(&t, &input, &t.path("out")).args(args), 2);
        assert!(err.contains(args[0]), "{err}");
        assert!(!t.path("out").exists());
    }
    let err = fails(
        dedup(&t, &input, &input.join("out")).args(["--bands", "2"]),
        2,
    );
    assert!(err.contains("input"), "{err}");
    // A packed dataset holds rows, not documents.
    let packed = t.path("packed");
    ok(t.prep()
        .args([
            "pack",
            "--seq-len",
            "64",
            "--mode",
            "concat",
            "--no-sep",
            "-q",
        ])
        .arg(&input)
        .arg(&packed));
    let err = fails(&mut dedup(&t, &packed, &t.path("out")), 2);
    assert!(err.contains("documents"), "{err}");
    assert!(!t.path("out").exists());
    // A file that is not prep's in the output is never removed.
    let foreign = t.write("busy/notes.txt", "mine");
    let err = fails(&mut dedup(&t, &input, &t.path("busy")), 2);
    assert!(
        err.contains("notes.txt") || err.contains("not prep"),
        "{err}"
    );
    ok(dedup(&t, &input, &t.path("busy")).arg("--overwrite"));
    assert_eq!(std::fs::read_to_string(foreign).unwrap(), "mine");
}

/// `prep dedup IN --work WORK --signatures --part I/N` and the like.
fn task(t: &TestDir, args: &[&str]) -> std::process::Command {
    let mut cmd = t.prep();
    cmd.arg("dedup").args(args).arg("-q");
    cmd
}

#[test]
fn signature_and_bucket_tasks_remove_what_one_machine_removes() {
    let t = TestDir::new();
    let (docs, _) = planted(4, 700, 450);
    let input = dataset(&t, Dtype::U32, &docs);
    let one = t.path("one");
    ok(dedup(&t, &input, &one).args(["--shard-size", "16KiB"]));
    assert!(!report(&one).is_empty());
    let inp = input.to_str().unwrap();
    for (n, b, m) in [(3u64, 2u64, 1u64), (7, 5, 3)] {
        let work = t.path(&format!("work-{n}-{b}"));
        let w = work.to_str().unwrap();
        for i in 0..n {
            let part = format!("{i}/{n}");
            ok(&mut task(
                &t,
                &[inp, "--work", w, "--signatures", "--part", &part],
            ));
        }
        // Bucket tasks in another order than their numbers.
        for j in (0..b).rev() {
            let part = format!("{j}/{b}");
            ok(&mut task(&t, &["--work", w, "--buckets", "--part", &part]));
        }
        let out = t.path(&format!("out-{n}-{b}-{m}"));
        let o = out.to_str().unwrap();
        if m == 1 {
            ok(&mut task(
                &t,
                &[inp, o, "--work", w, "--shard-size", "16KiB"],
            ));
            // The same dataset as one machine's, byte for byte.
            assert_eq!(snapshot(&one), snapshot(&out));
            continue;
        }
        let mut merge = t.prep();
        merge.arg("merge").arg("-q");
        for k in 0..m {
            let dir = out.join(format!("part-{k}"));
            let d = dir.to_str().unwrap();
            let part = format!("{k}/{m}");
            ok(&mut task(&t, &[inp, d, "--work", w, "--part", &part]));
            merge.arg(&dir);
        }
        ok(merge.arg(&out));
        assert_eq!(records(&out), records(&one));
        assert_eq!(
            std::fs::read(out.join("duplicates.jsonl")).unwrap(),
            std::fs::read(one.join("duplicates.jsonl")).unwrap()
        );
        ok(t.prep().arg("validate").arg(&out));
        let counts = |dir: &Path| {
            let m: serde_json::Value =
                serde_json::from_slice(&std::fs::read(dir.join("manifest.json")).unwrap()).unwrap();
            m["provenance"]["documents"].clone()
        };
        assert_eq!(counts(&out), counts(&one));
    }
}

#[test]
fn tasks_are_skipped_when_done_and_refuse_damaged_or_foreign_work() {
    let t = TestDir::new();
    let (docs, _) = planted(6, 300, 200);
    let input = dataset(&t, Dtype::U32, &docs);
    let (inp, work) = (input.to_str().unwrap(), t.path("work"));
    let w = work.to_str().unwrap();
    let sign = |i: u64| {
        let part = format!("{i}/2");
        task(&t, &[inp, "--work", w, "--signatures", "--part", &part])
    };
    ok(&mut sign(0));
    // A bucket task before every signature part has finished.
    let err = fails(
        &mut task(&t, &["--work", w, "--buckets", "--part", "0/1"]),
        2,
    );
    assert!(
        err.contains("1 of the 2 signature parts have not finished"),
        "{err}"
    );
    ok(&mut sign(1));
    // Run again: nothing to do, nothing rewritten.
    let data = work.join("signatures-00001/entries.bin");
    let kept = t.held_inode(&data);
    let mut again = t.prep();
    again.args(["dedup", inp, "--work", w, "--signatures", "--part", "1/2"]);
    let said = String::from_utf8_lossy(&ok(&mut again).stderr).into_owned();
    assert!(said.contains("already complete"), "{said}");
    assert_eq!(t.held_inode(&data), kept);
    // A damaged chunk is refused by the bucket task that reads it.
    let mut bytes = std::fs::read(&data).unwrap();
    let at = bytes.len() / 2;
    bytes[at] ^= 1;
    std::fs::write(&data, &bytes).unwrap();
    let err = fails(
        &mut task(&t, &["--work", w, "--buckets", "--part", "0/1"]),
        2,
    );
    assert!(
        err.contains("entries.bin") && err.contains("run signature part 1/2 again"),
        "{err}"
    );
    bytes[at] ^= 1;
    std::fs::write(&data, &bytes).unwrap();
    ok(&mut task(&t, &["--work", w, "--buckets", "--part", "0/1"]));
    // The dataset written from work made with other parameters is refused.
    let out = t.path("out");
    let o = out.to_str().unwrap();
    let err = fails(&mut task(&t, &[inp, o, "--work", w, "--seed", "2"]), 2);
    assert!(
        err.contains("buckets.json") && err.contains("parameters"),
        "{err}"
    );
    assert!(!out.exists());
    // A signature part of another run in the same work directory.
    let other = dataset_named(&t, "other", &docs[..100]);
    let o_in = other.to_str().unwrap();
    let err = fails(
        &mut task(&t, &[o_in, "--work", w, "--signatures", "--part", "1/2"]),
        2,
    );
    assert!(err.contains("another run"), "{err}");
    ok(&mut task(&t, &[inp, o, "--work", w]));
    assert_eq!(report(&out).len(), {
        let one = t.path("one");
        ok(&mut dedup(&t, &input, &one));
        report(&one).len()
    });
}
