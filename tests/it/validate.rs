//! `prep validate` on the family of broken datasets in fixtures/validate/
//! (made by tools/make_validate_fixtures.py from fixtures/validate/good), and
//! the library reader refusing the same corruptions.

use std::path::PathBuf;

use crate::common::*;

fn case(name: &str) -> PathBuf {
    fixture(&format!("validate/{name}"))
}

/// Runs `prep validate --json` and returns (exit code, report).
fn validate(dir: &std::path::Path, extra: &[&str]) -> (i32, serde_json::Value) {
    let t = TestDir::new();
    let out = run(t.prep().arg("validate").arg("--json").args(extra).arg(dir));
    let report: serde_json::Value = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("not JSON ({e}): {}", String::from_utf8_lossy(&out.stdout)));
    let schema: serde_json::Value = serde_json::from_slice(
        &std::fs::read(root().join("schemas/validate-report.schema.json")).unwrap(),
    )
    .unwrap();
    let validator = jsonschema::validator_for(&schema).unwrap();
    let errors: Vec<String> = validator
        .iter_errors(&report)
        .map(|e| e.to_string())
        .collect();
    assert!(
        errors.is_empty(),
        "report does not match its schema: {errors:#?}"
    );
    (out.status.code().unwrap(), report)
}

/// A problem as (kind, file, shard, record, token).
type Found = (String, String, Option<u64>, Option<u64>, Option<u64>);

/// The report's problems, sorted.
fn problems(report: &serde_json::Value) -> Vec<Found> {
    let mut out: Vec<_> = report["problems"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| {
            (
                p["kind"].as_str().unwrap().to_owned(),
                p["file"].as_str().unwrap_or("").to_owned(),
                p["shard"].as_u64(),
                p["record"].as_u64(),
                p["token"].as_u64(),
            )
        })
        .collect();
    out.sort();
    out
}

type Expected<'a> = &'a [(&'a str, &'a str, Option<u64>, Option<u64>, Option<u64>)];

fn assert_problems(name: &str, expected: Expected) {
    let (code, report) = validate(&case(name), &[]);
    assert_eq!(code, 1, "{name}: {report:#}");
    assert_eq!(report["valid"], false);
    let mut expected: Vec<_> = expected
        .iter()
        .map(|(k, f, s, r, t)| ((*k).to_owned(), (*f).to_owned(), *s, *r, *t))
        .collect();
    expected.sort();
    assert_eq!(problems(&report), expected, "{name}: {report:#}");
}

#[test]
fn the_good_dataset_is_valid() {
    let (code, report) = validate(&case("good"), &[]);
    assert_eq!(code, 0, "{report:#}");
    assert_eq!(report["valid"], true);
    assert_eq!(report["checked"]["shards"], 4);
    assert_eq!(report["checked"]["records"], 36);
    assert_eq!(report["checked"]["checksums"], true);
    prep::Dataset::open(case("good")).unwrap();
}

#[test]
fn truncated_bin() {
    assert_problems(
        "truncated_bin",
        &[
            ("file_size", "shard-00001.bin", Some(1), None, None),
            ("bin_size", "shard-00001.bin", Some(1), None, None),
            ("checksum", "shard-00001.bin", Some(1), None, None),
        ],
    );
}

#[test]
fn truncated_idx() {
    assert_problems(
        "truncated_idx",
        &[
            ("file_size", "shard-00001.idx", Some(1), None, None),
            ("idx_header", "shard-00001.idx", Some(1), None, None),
            ("checksum", "shard-00001.idx", Some(1), None, None),
        ],
    );
}

#[test]
fn flipped_byte_in_bin() {
    assert_problems(
        "flipped_bin",
        &[
            ("checksum", "shard-00001.bin", Some(1), None, None),
            ("chunk_checksum", "shard-00001.bin", Some(1), None, None),
        ],
    );
    // --quick skips only the checksums: this dataset then passes.
    let (code, report) = validate(&case("flipped_bin"), &["--quick"]);
    assert_eq!(code, 0, "{report:#}");
    assert_eq!(report["checked"]["checksums"], false);
}

#[test]
fn flipped_byte_in_idx() {
    assert_problems(
        "flipped_idx",
        &[
            ("idx_header", "shard-00001.idx", Some(1), None, None),
            ("checksum", "shard-00001.idx", Some(1), None, None),
        ],
    );
}

#[test]
fn decreasing_offsets() {
    assert_problems(
        "decreasing_offsets",
        &[("offsets", "shard-00001.idx", Some(1), Some(2), None)],
    );
}

#[test]
fn token_id_not_below_vocab_size() {
    assert_problems(
        "token_out_of_range",
        &[(
            "token_out_of_range",
            "shard-00002.bin",
            Some(2),
            Some(0),
            Some(10),
        )],
    );
}

#[test]
fn wrong_dtype_in_a_header() {
    assert_problems(
        "wrong_dtype",
        &[
            ("dtype_mismatch", "shard-00000.idx", Some(0), None, None),
            ("bin_size", "shard-00000.bin", Some(0), None, None),
        ],
    );
}

#[test]
fn missing_shard() {
    assert_problems(
        "missing_shard",
        &[
            ("missing_file", "shard-00001.bin", Some(1), None, None),
            ("missing_file", "shard-00001.idx", Some(1), None, None),
            ("missing_file", "shard-00001.sum", Some(1), None, None),
        ],
    );
}

#[test]
fn extra_shard() {
    assert_problems(
        "extra_shard",
        &[
            ("unlisted_file", "shard-00004.bin", None, None, None),
            ("unlisted_file", "shard-00004.idx", None, None, None),
            ("unlisted_file", "shard-00004.sum", None, None, None),
        ],
    );
}

#[test]
fn manifest_count_edited() {
    assert_problems(
        "manifest_count_edited",
        &[("manifest_counts", "manifest.json", None, None, None)],
    );
}

#[test]
fn missing_eos() {
    assert_problems(
        "missing_eos",
        &[("missing_eos", "shard-00000.bin", Some(0), Some(0), Some(20))],
    );
}

#[test]
fn manifest_not_of_the_schema() {
    assert_problems(
        "bad_schema",
        &[("manifest_schema", "manifest.json", None, None, None)],
    );
}

/// The one problem of `name`'s report, which must be a chunk checksum
/// problem of shard `shard`'s `.bin`: its chunk and message.
fn the_chunk_problem(dir: &std::path::Path, shard: u64) -> (u64, String) {
    let (code, report) = validate(dir, &[]);
    assert_eq!(code, 1, "{report:#}");
    let problems = report["problems"].as_array().unwrap();
    assert_eq!(problems.len(), 1, "{report:#}");
    let p = &problems[0];
    assert_eq!(p["kind"], "chunk_checksum", "{report:#}");
    assert_eq!(p["shard"], shard, "{report:#}");
    assert_eq!(
        p["file"],
        format!("shard-{shard:05}.bin"),
        "the chunk is of the .bin"
    );
    (
        p["chunk"].as_u64().expect("the chunk is named"),
        p["message"].as_str().unwrap().to_owned(),
    )
}

/// A changed byte of a `.bin` whose whole-file checksum was made to match:
/// only the chunk checksums tell, and the report names the chunk.
#[test]
fn a_flipped_byte_under_a_fixed_checksum_is_found_by_its_chunk() {
    let (chunk, message) = the_chunk_problem(&case("flipped_chunk"), 1);
    assert_eq!(chunk, 0);
    assert!(
        message.starts_with("chunk 0 (bytes 0..192 of the shard's .bin): XXH3 is "),
        "{message}"
    );
    // --quick skips the chunks' checksums with the others.
    let (code, report) = validate(&case("flipped_chunk"), &["--quick"]);
    assert_eq!(code, 0, "{report:#}");
}

/// A flipped bit of a checksum in a `.sum` (whose own checksum was made to
/// match): the `.bin` and its `.sum` disagree on that chunk.
#[test]
fn a_flipped_byte_in_a_sum_is_found_by_its_chunk() {
    let (chunk, message) = the_chunk_problem(&case("flipped_sum"), 1);
    assert_eq!(chunk, 0);
    assert!(message.contains("the .sum lists"), "{message}");
}

#[test]
fn a_sum_header_with_chunks_of_zero_bytes() {
    assert_problems(
        "zero_chunk_bytes",
        &[("chunk_sums", "shard-00001.sum", Some(1), None, None)],
    );
    let (_, report) = validate(&case("zero_chunk_bytes"), &[]);
    let message = report["problems"][0]["message"].as_str().unwrap();
    assert!(message.contains("chunk size 0"), "{message}");
}

/// A dataset written before `.sum` files: nothing lists them, and it is
/// valid; the chunk checksums are checked where they are listed only.
#[test]
fn a_dataset_without_sums_is_valid() {
    let (code, report) = validate(&case("no_sums"), &[]);
    assert_eq!(code, 0, "{report:#}");
    assert_eq!(report["checked"]["records"], 36);
    let manifest = std::fs::read_to_string(case("no_sums").join("manifest.json")).unwrap();
    assert!(!manifest.contains("\"sum"), "{manifest}");
    prep::Dataset::open(case("no_sums")).unwrap();
}

/// A shard of several chunks: a byte changed in chunk 2 under a fixed
/// `bin_xxh3`, then a byte of chunk 3's checksum in the `.sum` under a
/// fixed `sum_xxh3`; each time the report names that chunk and its bytes.
#[test]
fn a_corrupt_chunk_of_a_large_shard_is_named() {
    let t = TestDir::new();
    let dir = t.path("ds");
    std::fs::create_dir(&dir).unwrap();
    // 3.5 MiB of uint16 tokens in one shard: chunks 0..3 of 1 MiB, the last a half.
    let records: Vec<Vec<u32>> = (0..7u32)
        .map(|r| (0..(1u32 << 18)).map(|t| (t * 7 + r) % 60_000).collect())
        .collect();
    let shards = write_dataset(&dir, prep::format::Dtype::U16, u64::MAX, &records);
    let (code, report) = validate(&dir, &[]);
    assert_eq!(code, 0, "{report:#}");
    let edit_manifest = |key: &str, value: String| {
        let path = dir.join("manifest.json");
        let mut m: serde_json::Value =
            serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
        m["shards"][0][key] = value.into();
        std::fs::write(&path, m.to_string()).unwrap();
    };
    let xxh3 = |path: &std::path::Path| {
        format!(
            "{:016x}",
            xxhash_rust::xxh3::xxh3_64(&std::fs::read(path).unwrap())
        )
    };

    let bin = dir.join(&shards[0].bin);
    let good_bin = std::fs::read(&bin).unwrap();
    let mut bytes = good_bin.clone();
    bytes[(5 << 19) + 3] ^= 0x02;
    std::fs::write(&bin, &bytes).unwrap();
    edit_manifest("bin_xxh3", xxh3(&bin));
    let (chunk, message) = the_chunk_problem(&dir, 0);
    assert_eq!(chunk, 2);
    assert!(
        message.starts_with("chunk 2 (bytes 2097152..3145728 of the shard's .bin)"),
        "{message}"
    );

    std::fs::write(&bin, &good_bin).unwrap();
    edit_manifest("bin_xxh3", shards[0].bin_xxh3.clone());
    let sum = dir.join(shards[0].sum.as_deref().unwrap());
    let mut bytes = std::fs::read(&sum).unwrap();
    bytes[32 + 3 * 8] ^= 0x01;
    std::fs::write(&sum, &bytes).unwrap();
    edit_manifest("sum_xxh3", xxh3(&sum));
    let (chunk, message) = the_chunk_problem(&dir, 0);
    assert_eq!(chunk, 3);
    assert!(
        message.starts_with("chunk 3 (bytes 3145728..3670016 of the shard's .bin)"),
        "{message}"
    );
}

#[test]
fn the_human_report_names_file_and_position() {
    let t = TestDir::new();
    let out = run(t.prep().arg("validate").arg(case("token_out_of_range")));
    assert_eq!(out.status.code(), Some(1));
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("INVALID, 1 problem"), "{text}");
    assert!(
        text.contains("token_out_of_range: shard 2, shard-00002.bin, record 0, token 10: token id 47 is not below vocab_size 42"),
        "{text}"
    );
}

#[test]
fn could_not_run_is_exit_code_2() {
    let t = TestDir::new();
    let err = fails(t.prep().arg("validate").arg(t.path("nowhere")), 2);
    assert!(err.contains("no such directory"), "{err}");
    std::fs::create_dir(t.path("empty")).unwrap();
    let err = fails(t.prep().arg("validate").arg(t.path("empty")), 2);
    assert!(err.contains("no manifest.json"), "{err}");
    t.write("garbled/manifest.json", "{ not json");
    let err = fails(t.prep().arg("validate").arg(t.path("garbled")), 2);
    assert!(err.contains("not JSON"), "{err}");
    t.write(
        "future/manifest.json",
        r#"{"format": "prep", "version": 9}"#,
    );
    let err = fails(t.prep().arg("validate").arg(t.path("future")), 2);
    assert!(
        err.contains("version 9") && err.contains("upgrade prep"),
        "{err}"
    );
}

/// `prep validate --json` on a dataset it cannot check at all: still one
/// report on stdout (of the schema: not valid, no problems, an `error` of
/// `kind` about `path`), the error on stderr, and exit code 2 as without
/// --json. Returns the report's `error`.
fn could_not_run_json(
    dir: &std::path::Path,
    kind: &str,
    path: &std::path::Path,
) -> serde_json::Value {
    let (code, report) = validate(dir, &[]);
    assert_eq!(code, 2, "{report:#}");
    assert_eq!(report["valid"], false, "{report:#}");
    assert_eq!(report["problems"], serde_json::json!([]), "{report:#}");
    assert_eq!(report["dataset"], dir.display().to_string());
    let error = &report["error"];
    assert_eq!(error["kind"], kind, "{report:#}");
    assert_eq!(error["path"], path.display().to_string(), "{report:#}");
    // The same words a person sees without --json.
    let t = TestDir::new();
    let stderr = fails(t.prep().arg("validate").arg("--json").arg(dir), 2);
    let message = error["message"].as_str().unwrap();
    assert!(stderr.contains(message), "{message:?} not in {stderr}");
    error.clone()
}

#[test]
fn validate_json_reports_unreadable_manifest() {
    let t = TestDir::new();
    let manifest = t.write("garbled/manifest.json", "{ not json");
    let error = could_not_run_json(&t.path("garbled"), "bad_manifest", &manifest);
    assert!(
        error["message"].as_str().unwrap().contains("not JSON"),
        "{error}"
    );
}

#[test]
fn validate_json_reports_newer_manifest_version() {
    let t = TestDir::new();
    let manifest = t.write(
        "future/manifest.json",
        r#"{"format": "prep", "version": 9}"#,
    );
    let error = could_not_run_json(&t.path("future"), "unsupported_version", &manifest);
    let message = error["message"].as_str().unwrap();
    assert!(
        message.contains("version 9") && message.contains("upgrade prep"),
        "{error}"
    );
}

#[test]
fn validate_json_reports_missing_directory() {
    let t = TestDir::new();
    let nowhere = t.path("nowhere");
    let error = could_not_run_json(&nowhere, "no_directory", &nowhere);
    assert!(
        error["message"]
            .as_str()
            .unwrap()
            .contains("no such directory"),
        "{error}"
    );
}

#[test]
fn validate_json_reports_missing_manifest() {
    let t = TestDir::new();
    let empty = t.path("empty");
    std::fs::create_dir(&empty).unwrap();
    let error = could_not_run_json(&empty, "no_manifest", &empty.join("manifest.json"));
    assert!(
        error["message"]
            .as_str()
            .unwrap()
            .contains("no manifest.json"),
        "{error}"
    );
}

/// The schema tells a report that could not run from one that found
/// problems: an `error` goes with `valid: false` and no problems only.
#[test]
fn the_report_schema_keeps_error_apart_from_problems() {
    let schema: serde_json::Value = serde_json::from_slice(
        &std::fs::read(root().join("schemas/validate-report.schema.json")).unwrap(),
    )
    .unwrap();
    let validator = jsonschema::validator_for(&schema).unwrap();
    let t = TestDir::new();
    t.write("garbled/manifest.json", "{ not json");
    let (_, mut report) = validate(&t.path("garbled"), &[]);
    assert!(validator.is_valid(&report));
    report["valid"] = true.into();
    assert!(!validator.is_valid(&report), "an error with valid: true");
    report["valid"] = false.into();
    report["problems"] = serde_json::json!([{"kind": "checksum", "message": "x"}]);
    assert!(!validator.is_valid(&report), "an error beside problems");
    report["problems"] = serde_json::json!([]);
    report["error"]["kind"] = "elsewhere".into();
    assert!(!validator.is_valid(&report), "an unknown error kind");
}

#[test]
fn many_problems_are_capped_per_kind_and_counted() {
    // Every token of a copy pushed out of range: far more problems than the cap.
    let t = TestDir::new();
    let dir = t.path("ds");
    copy_dir(&case("good"), &dir);
    let mut manifest: serde_json::Value =
        serde_json::from_slice(&std::fs::read(dir.join("manifest.json")).unwrap()).unwrap();
    manifest["vocab_size"] = 1.into();
    std::fs::write(dir.join("manifest.json"), manifest.to_string()).unwrap();
    let (code, report) = validate(&dir, &["--max-per-kind", "5"]);
    assert_eq!(code, 1);
    let listed = report["problems"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|p| p["kind"] == "token_out_of_range")
        .count();
    assert_eq!(listed, 5);
    let omitted = report["omitted"]["token_out_of_range"].as_u64().unwrap();
    // Every token but ids 0 is out of range; eos (1) is too.
    assert_eq!(
        listed as u64 + omitted,
        report["checked"]["tokens"].as_u64().unwrap()
    );
}

/// The reader runs the quick structural checks: it refuses what would make it
/// read out of bounds, and opens what only a checksum or a scan can tell.
#[test]
fn the_reader_refuses_the_same_structural_corruptions() {
    for name in [
        "truncated_bin",
        "truncated_idx",
        "flipped_idx",
        "decreasing_offsets",
        "wrong_dtype",
        "missing_shard",
        "manifest_count_edited",
        "bad_schema",
    ] {
        let err = prep::Dataset::open(case(name)).err();
        assert!(err.is_some(), "{name}: the reader opened a corrupt dataset");
    }
    for name in [
        "flipped_bin",
        "token_out_of_range",
        "missing_eos",
        "extra_shard",
        "flipped_chunk",
        "flipped_sum",
        "zero_chunk_bytes",
        "no_sums",
    ] {
        prep::Dataset::open(case(name)).unwrap_or_else(|e| panic!("{name}: {e}"));
    }
}

fn copy_dir(from: &std::path::Path, to: &std::path::Path) {
    std::fs::create_dir_all(to).unwrap();
    for entry in std::fs::read_dir(from).unwrap() {
        let entry = entry.unwrap();
        std::fs::copy(entry.path(), to.join(entry.file_name())).unwrap();
    }
}

#[test]
fn a_stray_file_beside_a_dataset_is_a_note_not_a_problem() {
    let t = TestDir::new();
    let ds = t.path("ds");
    ok(&mut tokenize_cmd(
        &t,
        &[fixture("corpus/debian-sample.jsonl.zst")],
        &ds,
    ));
    t.write("ds/work.seg", "the user's own segments");
    let (code, report) = validate(&ds, &[]);
    assert_eq!(code, 0, "{report:#}");
    assert_eq!(report["valid"], true);
    assert_eq!(report["notes"][0]["file"], "work.seg", "{report:#}");
    let out = ok(t.prep().arg("validate").arg(&ds));
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(
        said.contains("valid") && said.contains("note: work.seg"),
        "{said}"
    );
}
