//! Shared by the integration tests: a fresh directory per test and a command
//! for the built `prep` binary.
#![allow(dead_code)]

pub mod damage;
pub mod engine;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::{Duration, Instant};

use prep::format::{
    atomic_write, DatasetWriter, DocumentCounts, Dtype, Manifest, Provenance, ShardInfo,
    SpecialTokens, TokenizerInfo, MANIFEST_FILE,
};

/// The repository root, where fixtures/ lives.
pub fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// The Cargo target directory the tests were built in (`CARGO_TARGET_DIR`,
/// else target/): the directory above the profile's one, which holds `prep`.
pub fn target_dir() -> PathBuf {
    Path::new(env!("CARGO_BIN_EXE_prep"))
        .ancestors()
        .nth(2)
        .expect("the prep binary is in <target>/<profile>/")
        .to_path_buf()
}

/// The Python with the reference `tokenizers` package: `PREP_REFERENCE_PYTHON`,
/// else the venv `make test` builds (<target>/venv); `None`, saying so, where
/// it is not there. `make test` and `make check` build it and set
/// `PREP_REQUIRE_REFERENCE`: there a missing reference fails the test that
/// compares with it rather than letting it pass unchecked.
pub fn reference_python() -> Option<PathBuf> {
    let python = std::env::var_os("PREP_REFERENCE_PYTHON")
        .map(PathBuf::from)
        .unwrap_or_else(|| target_dir().join("venv/bin/python"));
    if python.exists() {
        return Some(python);
    }
    let why = format!(
        "no reference Python at {} (make target/venv/.installed, or PREP_REFERENCE_PYTHON)",
        python.display()
    );
    assert!(
        std::env::var_os("PREP_REQUIRE_REFERENCE").is_none(),
        "{why}, and PREP_REQUIRE_REFERENCE is set"
    );
    eprintln!("skipped: {why}");
    None
}

/// A fixture path.
pub fn fixture(rel: &str) -> PathBuf {
    root().join("fixtures").join(rel)
}

/// The environment variable naming the directory of what the repository
/// may not ship (fixtures/README.md): `tokenizers/gemma3.tokenizer.json.zst`
/// (Gemma's terms of use), the Llama and Gemma chat templates under `chat/`
/// and `debian-docs.jsonl.zst` (the whole corpus, 15 MB). CI points it at
/// ../shared/corpora.
pub const EXTERNAL_DATA: &str = "PREP_EXTERNAL_DATA";

/// A file under [`EXTERNAL_DATA`]. A test that needs one is marked
/// `#[cfg_attr(not(prep_external_data), ignore = "...")]`, so that where the
/// variable was not set at build time the test framework reports it skipped,
/// with its reason; where it is set, a missing file fails the test.
pub fn external(rel: &str) -> PathBuf {
    let dir = std::env::var_os(EXTERNAL_DATA)
        .unwrap_or_else(|| panic!("{EXTERNAL_DATA} is not set, and this test needs {rel} from it"));
    let path = PathBuf::from(dir).join(rel);
    assert!(
        path.is_file(),
        "{} is not there ({EXTERNAL_DATA} names {})",
        path.display(),
        PathBuf::from(std::env::var_os(EXTERNAL_DATA).unwrap()).display()
    );
    path
}

/// A real tokenizer file committed in fixtures/tokenizers (`gpt2`,
/// `mistral-7b-v0.1`, ...).
pub fn tokenizer(name: &str) -> PathBuf {
    fixture(&format!("tokenizers/{name}.tokenizer.json.zst"))
}

/// Every tokenizer file committed in fixtures/tokenizers, sorted.
pub fn tokenizer_files() -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(fixture("tokenizers"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.to_string_lossy().ends_with(".tokenizer.json.zst"))
        .collect();
    files.sort();
    files
}

/// The GPT-2 tokenizer fixture.
pub fn gpt2() -> PathBuf {
    fixture("tokenizers/gpt2.tokenizer.json.zst")
}

/// A test's own temporary directory, removed when dropped.
pub struct TestDir {
    pub dir: tempfile::TempDir,
}

impl TestDir {
    pub fn new() -> TestDir {
        TestDir {
            dir: tempfile::Builder::new()
                .prefix("prep-test-")
                .tempdir()
                .expect("a temp dir"),
        }
    }

    pub fn path(&self, rel: &str) -> PathBuf {
        self.dir.path().join(rel)
    }

    /// Writes a file and returns its path.
    pub fn write(&self, rel: &str, bytes: impl AsRef<[u8]>) -> PathBuf {
        let path = self.path(rel);
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent).unwrap();
        }
        std::fs::write(&path, bytes).unwrap();
        path
    }

    /// `path`'s inode number, held: a hard link under this directory keeps
    /// the inode allocated, so a file written again under the same name
    /// cannot be given the same number (file systems reuse freed ones at
    /// once). Two held numbers are equal exactly when the file was kept.
    pub fn held_inode(&self, path: &Path) -> u64 {
        use std::os::unix::fs::MetadataExt;
        let held = self.path("held");
        std::fs::create_dir_all(&held).unwrap();
        let n = std::fs::read_dir(&held).unwrap().count();
        std::fs::hard_link(path, held.join(n.to_string())).unwrap();
        std::fs::metadata(path).unwrap().ino()
    }

    /// A `prep` command running in this directory, its compiled tokenizers
    /// kept under the target directory rather than the user's cache.
    pub fn prep(&self) -> Command {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_prep"));
        cmd.current_dir(self.dir.path()).env(
            prep::engine::compiled::CACHE_ENV,
            target_dir().join("tmp/tokenizer-cache"),
        );
        cmd
    }
}

/// `prep tokenize` with `tokenizer`, quiet, on `inputs`, into `out`.
pub fn tokenize_with<P: AsRef<Path>>(
    t: &TestDir,
    tokenizer: &Path,
    inputs: &[P],
    out: &Path,
) -> Command {
    let mut cmd = t.prep();
    cmd.arg("tokenize")
        .arg("--tokenizer")
        .arg(tokenizer)
        .arg("--output")
        .arg(out)
        .arg("--quiet");
    for input in inputs {
        cmd.arg("--input").arg(input.as_ref());
    }
    cmd
}

/// `prep tokenize` with the GPT-2 fixture, quiet, on `inputs`, into `out`.
pub fn tokenize_cmd<P: AsRef<Path>>(t: &TestDir, inputs: &[P], out: &Path) -> Command {
    tokenize_with(t, &gpt2(), inputs, out)
}

/// A WordLevel tokenizer.json that splits on whitespace, with exactly this
/// vocabulary; the `special` words are added (special) tokens. Tiny and fast:
/// for tests that need known ids or push much text through.
pub fn word_level(t: &TestDir, name: &str, vocab: &[(&str, u32)], special: &[&str]) -> PathBuf {
    let ids: serde_json::Map<String, serde_json::Value> = vocab
        .iter()
        .map(|&(word, id)| (word.to_owned(), id.into()))
        .collect();
    let added: Vec<serde_json::Value> = special
        .iter()
        .map(|word| {
            serde_json::json!({"id": ids[*word], "content": word, "single_word": false, "lstrip": false,
                               "rstrip": false, "normalized": false, "special": true})
        })
        .collect();
    let json = serde_json::json!({
        "version": "1.0", "truncation": null, "padding": null, "added_tokens": added,
        "normalizer": null, "pre_tokenizer": {"type": "WhitespaceSplit"}, "post_processor": null, "decoder": null,
        "model": {"type": "WordLevel", "vocab": ids, "unk_token": "[UNK]"}
    });
    t.write(name, json.to_string())
}

/// Runs a command and returns its output, whatever the exit status.
pub fn run(cmd: &mut Command) -> Output {
    cmd.output().expect("prep runs")
}

/// Runs a command that must succeed, and returns its output.
pub fn ok(cmd: &mut Command) -> Output {
    let out = run(cmd);
    assert!(
        out.status.success(),
        "command failed ({}):\nstdout: {}\nstderr: {}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

/// Runs a command that must fail with `code`, and returns its stderr.
pub fn fails(cmd: &mut Command, code: i32) -> String {
    let out = run(cmd);
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert_eq!(
        out.status.code(),
        Some(code),
        "expected exit {code}; stderr: {stderr}"
    );
    stderr
}

/// Every file at the top of a dataset directory with its bytes, the
/// manifest's creation time left out: two runs that should write the same
/// dataset compare equal. Folders (part directories, work folders) are skipped.
pub fn snapshot(dir: &Path) -> std::collections::BTreeMap<String, Vec<u8>> {
    let mut files = std::collections::BTreeMap::new();
    for entry in std::fs::read_dir(dir).unwrap() {
        let entry = entry.unwrap();
        if !entry.file_type().unwrap().is_file() {
            continue;
        }
        let name = entry.file_name().to_string_lossy().into_owned();
        let mut bytes = std::fs::read(entry.path()).unwrap();
        if name == MANIFEST_FILE {
            let mut m: serde_json::Value = serde_json::from_slice(&bytes).unwrap();
            m["provenance"]["created"] = serde_json::Value::Null;
            bytes = serde_json::to_vec(&m).unwrap();
        }
        files.insert(name, bytes);
    }
    files
}

/// Every record of the dataset in `dir`, widened to u32.
pub fn records(dir: &Path) -> Vec<Vec<u32>> {
    let ds = prep::Dataset::open(dir).expect("the dataset opens");
    ds.records().map(|r| r.to_vec()).collect()
}

/// JSONL with one `{"text": ...}` per text.
pub fn jsonl(texts: &[&str]) -> String {
    texts
        .iter()
        .map(|t| serde_json::json!({ "text": t }).to_string() + "\n")
        .collect()
}

/// A manifest for `shards` written by a test, with placeholder provenance.
pub fn manifest(dtype: Dtype, shards: Vec<ShardInfo>) -> Manifest {
    Manifest {
        format: "prep".into(),
        version: 1,
        kind: "documents".into(),
        dtype,
        vocab_size: 1 << 32,
        n_records: shards.iter().map(|s| s.n_records).sum(),
        n_tokens: shards.iter().map(|s| s.n_tokens).sum(),
        special_tokens: SpecialTokens::default(),
        bos_prepended: false,
        eos_appended: false,
        tokenizer: TokenizerInfo {
            file: None,
            xxh3: "0000000000000000".into(),
        },
        shards,
        seq_len: None,
        packing: None,
        partition: None,
        provenance: Provenance {
            prep_version: "test".into(),
            command: "test".into(),
            created: "2026-01-01T00:00:00Z".into(),
            inputs: vec![],
            options: serde_json::json!({}),
            documents: DocumentCounts::default(),
            fingerprint: "0000000000000000".into(),
            merged: Vec::new(),
            chat: None,
            single_writer: false,
            report: None,
        },
    }
}

/// Writes `records` as a dataset in `dir` through the library, manifest included.
pub fn write_dataset(
    dir: &Path,
    dtype: Dtype,
    shard_size: u64,
    records: &[Vec<u32>],
) -> Vec<ShardInfo> {
    let mut writer = DatasetWriter::new(dir, dtype, shard_size, Vec::new());
    for r in records {
        writer.push(r).unwrap();
    }
    let shards = writer.finish().unwrap();
    atomic_write(
        &dir.join(MANIFEST_FILE),
        manifest(dtype, shards.clone()).to_json().as_bytes(),
    )
    .unwrap();
    shards
}

/// Writes a one-shard uint16 dataset with records of `lengths` tokens whose
/// `.bin` is sparse: zeros but for `markers` (token position, value), so a
/// dataset of many GiB takes almost no disk. Vocabulary 65,536.
pub fn write_sparse_u16(dir: &Path, lengths: &[u64], markers: &[(u64, u16)]) {
    use std::os::unix::fs::FileExt;
    let n_tokens: u64 = lengths.iter().sum();
    let bin = std::fs::File::create(dir.join("big.bin")).unwrap();
    bin.set_len(n_tokens * 2).unwrap();
    for (token, value) in markers {
        bin.write_all_at(&value.to_le_bytes(), token * 2).unwrap();
    }
    let mut idx = prep::format::IdxHeader {
        dtype: Dtype::U16,
        n_records: lengths.len() as u64,
        n_tokens,
    }
    .encode()
    .to_vec();
    let mut offset = 0u64;
    idx.extend_from_slice(&offset.to_le_bytes());
    for len in lengths {
        offset += len;
        idx.extend_from_slice(&offset.to_le_bytes());
    }
    std::fs::write(dir.join("big.idx"), &idx).unwrap();
    let shard = ShardInfo {
        bin: "big.bin".into(),
        idx: "big.idx".into(),
        n_records: lengths.len() as u64,
        n_tokens,
        bin_bytes: n_tokens * 2,
        idx_bytes: idx.len() as u64,
        bin_xxh3: "0000000000000000".into(),
        idx_xxh3: "0000000000000000".into(),
        seg: None,
        seg_bytes: None,
        seg_xxh3: None,
        sum: None,
        sum_bytes: None,
        sum_xxh3: None,
        mask: None,
        mask_bytes: None,
        mask_xxh3: None,
    };
    let mut m = manifest(Dtype::U16, vec![shard]);
    m.vocab_size = 65536;
    atomic_write(&dir.join(MANIFEST_FILE), m.to_json().as_bytes()).unwrap();
}

/// Runs `cmd` (a prep command that prints its summary) and returns prep's
/// own peak resident memory in bytes, as the summary reports it (Linux
/// VmHWM at the end of the run). This is the process's peak since exec:
/// unlike wait4's ru_maxrss it does not count the test process it was
/// forked from, which may be large when tests run as threads of one process.
pub fn peak_from_summary(cmd: &mut Command) -> u64 {
    let out = ok(cmd);
    let stderr = String::from_utf8_lossy(&out.stderr);
    let at = stderr
        .find("Peak memory ")
        .unwrap_or_else(|| panic!("no peak in the summary: {stderr}"));
    let mut words = stderr[at + "Peak memory ".len()..].split_whitespace();
    let value: f64 = words.next().unwrap().parse().unwrap();
    let unit = words.next().unwrap().trim_end_matches('.');
    let scale = match unit {
        "B" => 1.0,
        "KiB" => 1024.0,
        "MiB" => 1024.0 * 1024.0,
        "GiB" => 1024.0 * 1024.0 * 1024.0,
        other => panic!("unknown unit {other:?} in {stderr}"),
    };
    (value * scale) as u64
}

/// The shards a journal file lists: its lines after the first that are
/// whole (a line being appended may be cut short).
pub fn journaled_shards(journal: &[u8]) -> usize {
    journal
        .split(|&b| b == b'\n')
        .skip(1)
        .filter(|line| {
            serde_json::from_slice::<serde_json::Value>(line)
                .is_ok_and(|v| v.get("shard").is_some())
        })
        .count()
}

/// Starts a run, waits until its journal lists `shards` completed shards, and kills it.
pub fn kill_after_shards(mut cmd: std::process::Command, dir: &Path, shards: usize) {
    let mut child = cmd.spawn().unwrap();
    let journal = dir.join(".prep-journal.json");
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let done = std::fs::read(&journal).map_or(0, |b| journaled_shards(&b));
        if done >= shards {
            break;
        }
        assert!(
            child.try_wait().unwrap().is_none(),
            "the run ended before it could be killed"
        );
        assert!(Instant::now() < deadline, "no progress");
        std::thread::sleep(Duration::from_millis(2));
    }
    child.kill().unwrap(); // SIGKILL: no chance to clean up
    child.wait().unwrap();
    assert!(
        !dir.join("manifest.json").exists(),
        "the killed run must not have finished"
    );
}

/// Writes `columns` as a Parquet file with row groups of at most `group_rows` rows.
pub fn write_parquet(path: &Path, columns: Vec<(&str, arrow::array::ArrayRef)>, group_rows: usize) {
    let batch = arrow::record_batch::RecordBatch::try_from_iter(columns).unwrap();
    let props = parquet::file::properties::WriterProperties::builder()
        .set_max_row_group_row_count(Some(group_rows))
        .build();
    let file = std::fs::File::create(path).unwrap();
    let mut writer =
        parquet::arrow::ArrowWriter::try_new(file, batch.schema(), Some(props)).unwrap();
    writer.write(&batch).unwrap();
    writer.close().unwrap();
}

/// A xorshift64 generator: fixed-seed pseudo-random numbers for test data.
pub fn xorshift(seed: u64) -> impl FnMut() -> u64 {
    let mut state = seed;
    move || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state
    }
}
