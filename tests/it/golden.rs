//! Golden tests: `prep tokenize` gives exactly the reference ids.
//!
//! The reference is the Python `tokenizers` package at the version of the Rust
//! crate prep links; `tools/gen_golden.py` wrote its ids for every text of
//! `fixtures/golden/texts.jsonl.zst` (see `fixtures/golden/README.md`). Each
//! test runs the built binary on those texts in a fresh temporary directory,
//! opens the result with the library reader and compares every record with
//! `[bos] + ids + [eos]`.

use std::fs::File;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::Command;

use prep::format::{Dataset, Dtype};

/// One tokenizer of `fixtures/tokenizers/` and what the tests expect of it.
struct Case {
    name: &'static str,
    eos: &'static str,
    eos_id: u32,
    /// The bos token of the `--bos` test and its id.
    bos: (&'static str, u32),
    dtype: Dtype,
    vocab_size: u64,
}

const GPT2: Case = Case {
    name: "gpt2",
    eos: "<|endoftext|>",
    eos_id: 50256,
    // GPT-2 has one special token; training code uses it as bos too.
    bos: ("<|endoftext|>", 50256),
    dtype: Dtype::U16,
    vocab_size: 50257,
};

const DEEPSEEK_V3: Case = Case {
    name: "deepseek-v3",
    eos: "<｜end▁of▁sentence｜>",
    eos_id: 1,
    // Id 0: a bos that is the smallest id there is.
    bos: ("<｜begin▁of▁sentence｜>", 0),
    // Its ids pass 65,535.
    dtype: Dtype::U32,
    vocab_size: 129280,
};

const MINILM: Case = Case {
    name: "minilm-wordpiece",
    eos: "[SEP]",
    eos_id: 102,
    bos: ("[CLS]", 101),
    dtype: Dtype::U16,
    vocab_size: 30522,
};

/// How many differing records a failure describes before it stops.
const MAX_REPORTED: usize = 5;
/// Ids shown on each side of the first difference.
const WINDOW: usize = 8;

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures")
}

/// The lines of a zstd-compressed file.
fn zst_lines(path: &Path) -> Vec<String> {
    let file = File::open(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let decoder = zstd::stream::read::Decoder::new(file).unwrap();
    BufReader::new(decoder)
        .lines()
        .map(|line| line.unwrap_or_else(|e| panic!("{}: {e}", path.display())))
        .collect()
}

fn golden_text_count() -> usize {
    zst_lines(&fixtures().join("golden/texts.jsonl.zst")).len()
}

/// The reference ids of every golden text, without bos or eos.
fn golden_ids(name: &str) -> Vec<Vec<u32>> {
    let path = fixtures().join(format!("golden/{name}.ids.jsonl.zst"));
    zst_lines(&path)
        .iter()
        .enumerate()
        .map(|(i, line)| {
            serde_json::from_str(line)
                .unwrap_or_else(|e| panic!("{}:{}: {e}", path.display(), i + 1))
        })
        .collect()
}

/// Runs `prep tokenize` on the golden texts; returns the dataset directory.
fn tokenize(case: &Case, bos: Option<&str>, engine: &str, tmp: &Path) -> PathBuf {
    let fixtures = fixtures();
    let out = tmp.join("ds");
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_prep"));
    cmd.current_dir(tmp)
        .arg("tokenize")
        .arg("--tokenizer")
        .arg(fixtures.join(format!("tokenizers/{}.tokenizer.json.zst", case.name)))
        .arg("--input")
        .arg(fixtures.join("golden/texts.jsonl.zst"))
        .arg("--output")
        .arg(&out)
        .args(["--eos", case.eos]);
    if let Some(bos) = bos {
        cmd.args(["--bos", bos]);
    }
    cmd.args(["--threads", "2", "--quiet", "--engine", engine]);
    let output = cmd.output().expect("running prep");
    assert!(
        output.status.success(),
        "{cmd:?} failed with {}\nstdout:\n{}\nstderr:\n{}",
        output.status,
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr),
    );
    out
}

/// `ids[at - WINDOW .. at + WINDOW]`, with the position of its first id.
fn window(ids: &[u32], at: usize) -> String {
    let start = at.saturating_sub(WINDOW);
    let end = (at + WINDOW).min(ids.len());
    format!("[{start}..{end}] {:?}", &ids[start.min(end)..end])
}

/// Tokenizes the golden texts with the default engine and compares every
/// record with the reference.
fn check(case: &Case, with_bos: bool) {
    // The fast engine runs every golden tokenizer (byte-level BPE and
    // WordPiece); auto picks it.
    check_engine(case, with_bos, "auto", "fast");
}

/// The same with `--engine engine`, which must record `ran` in the manifest.
fn check_engine(case: &Case, with_bos: bool, engine: &str, ran: &str) {
    let tmp = tempfile::tempdir().unwrap();
    let bos = with_bos.then_some(case.bos);
    let dir = tokenize(case, bos.map(|b| b.0), engine, tmp.path());
    let ds = Dataset::open(&dir).unwrap_or_else(|e| panic!("opening {}: {e}", dir.display()));
    assert_eq!(
        ds.manifest().provenance.options["engine"],
        ran,
        "{}: --engine {engine} ran",
        case.name
    );

    let golden = golden_ids(case.name);
    let n_texts = golden_text_count();
    assert_eq!(
        golden.len(),
        n_texts,
        "{}: golden ids and texts differ in length",
        case.name
    );
    assert_eq!(ds.dtype(), case.dtype, "{}: dtype", case.name);
    let manifest = ds.manifest();
    assert_eq!(
        manifest.special_tokens.eos,
        Some(case.eos_id),
        "{}: manifest eos",
        case.name
    );
    assert_eq!(
        manifest.special_tokens.bos,
        bos.map(|b| b.1),
        "{}: manifest bos",
        case.name
    );
    assert_eq!(
        manifest.vocab_size, case.vocab_size,
        "{}: manifest vocab_size",
        case.name
    );
    // The empty documents give records too, holding only bos and eos.
    assert_eq!(
        ds.len(),
        n_texts as u64,
        "{}: one record per golden text",
        case.name
    );

    let mut expected_tokens = 0u64;
    let mut failures = Vec::new();
    let mut n_failed = 0;
    for (i, ids) in golden.iter().enumerate() {
        let mut expected = Vec::with_capacity(ids.len() + 2);
        expected.extend(bos.map(|b| b.1));
        expected.extend_from_slice(ids);
        expected.push(case.eos_id);
        expected_tokens += expected.len() as u64;

        let got = ds
            .record(i as u64)
            .unwrap_or_else(|e| panic!("{}: record {i}: {e}", case.name))
            .to_vec();
        if got == expected {
            continue;
        }
        n_failed += 1;
        if failures.len() < MAX_REPORTED {
            let at = expected
                .iter()
                .zip(&got)
                .take_while(|(a, b)| a == b)
                .count();
            failures.push(format!(
                "document {i}: {} ids expected, {} found; first difference at position {at}\n  \
                 expected {}\n  found    {}",
                expected.len(),
                got.len(),
                window(&expected, at),
                window(&got, at),
            ));
        }
    }
    assert!(
        n_failed == 0,
        "{}{}: {n_failed} of {} records differ from the reference \
         (fixtures/golden/README.md):\n{}",
        case.name,
        if with_bos { " with --bos" } else { "" },
        golden.len(),
        failures.join("\n"),
    );
    assert_eq!(
        ds.n_tokens(),
        expected_tokens,
        "{}: total tokens",
        case.name
    );
}

#[test]
fn golden_gpt2() {
    check(&GPT2, false);
}

#[test]
fn golden_deepseek_v3() {
    check(&DEEPSEEK_V3, false);
}

#[test]
fn golden_minilm_wordpiece() {
    check(&MINILM, false);
}

#[test]
fn golden_gpt2_with_bos() {
    check(&GPT2, true);
}

#[test]
fn golden_deepseek_v3_with_bos() {
    check(&DEEPSEEK_V3, true);
}

#[test]
fn golden_minilm_wordpiece_with_bos() {
    check(&MINILM, true);
}

#[test]
fn golden_gpt2_hf_engine() {
    check_engine(&GPT2, false, "hf", "hf");
}

#[test]
fn golden_deepseek_v3_hf_engine() {
    check_engine(&DEEPSEEK_V3, true, "hf", "hf");
}

#[test]
fn golden_deepseek_v3_fast_engine() {
    check_engine(&DEEPSEEK_V3, false, "fast", "fast");
}
