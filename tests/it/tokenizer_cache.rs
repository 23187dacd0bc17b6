//! The compiled tokenizer cache: a run reads a tokenizer's compiled form
//! when it is whole and current, and rebuilds it from the JSON when it is
//! stale or damaged; in every case the dataset is the one the JSON gives,
//! byte for byte. Every committed tokenizer file (each model family) and
//! every kind of damage is run.

use std::path::Path;

use crate::common::*;
use prep::engine::compiled;
use prep::engine::{LoadedTokenizer, Readings, TokenNames};

/// What was done to a compiled form before the next run.
#[derive(Clone, Copy, Debug)]
enum Damage {
    /// One bit flipped in the payload.
    FlippedPayload,
    /// One bit flipped in the header's engine hash.
    OtherEngine,
    /// The first half only.
    Truncated,
    /// An empty file.
    Empty,
    /// Bytes after the end.
    Appended,
    /// Another tokenizer's compiled form under this one's name.
    OtherTokenizer,
}

const DAMAGES: [Damage; 6] = [
    Damage::FlippedPayload,
    Damage::OtherEngine,
    Damage::Truncated,
    Damage::Empty,
    Damage::Appended,
    Damage::OtherTokenizer,
];

/// The first documents of the committed corpus sample, and text that meets
/// the added tokens and the normalizers' cases.
fn input(t: &TestDir) -> std::path::PathBuf {
    let sample = read_zst(&fixture("corpus/debian-sample.jsonl.zst"));
    let mut lines: Vec<String> = String::from_utf8(sample)
        .unwrap()
        .lines()
        .take(40)
        .map(str::to_owned)
        .collect();
    for text in [
        "<|endoftext|> <s></s> [CLS] x [SEP] <eos><bos> <pad>",
        "Ünïcödé Ｆｕｌｌｗｉｄｔｈ 中文 😀 \u{2581}mark\ttabs   and\r\nlines",
        "don't  stop—now 12345 ½ ﬁ",
    ] {
        lines.push(serde_json::json!({ "text": text }).to_string());
    }
    t.write("in.jsonl", lines.join("\n") + "\n")
}

fn read_zst(path: &Path) -> Vec<u8> {
    zstd::decode_all(std::fs::File::open(path).unwrap()).unwrap()
}

/// `prep tokenize` of `input` with `tokenizer` into `out`, with the cache
/// in `cache` (`off` for none); its stderr (not quiet: the summary's notes
/// say where the tokenizer came from).
fn tokenize(t: &TestDir, tokenizer: &Path, input: &Path, out: &str, cache: &str) -> String {
    let mut cmd = t.prep();
    cmd.args(["tokenize", "--threads", "2", "--output", out])
        .arg("--tokenizer")
        .arg(tokenizer)
        .arg("--input")
        .arg(input)
        .env(compiled::CACHE_ENV, cache);
    String::from_utf8(ok(&mut cmd).stderr).unwrap()
}

/// The one compiled form in `dir`.
fn compiled_form(dir: &Path) -> std::path::PathBuf {
    let forms: Vec<_> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "tok"))
        .collect();
    assert_eq!(
        forms.len(),
        1,
        "one compiled form in {}: {forms:?}",
        dir.display()
    );
    forms.into_iter().next().unwrap()
}

fn damage(path: &Path, how: Damage, other: &[u8]) {
    let mut bytes = std::fs::read(path).unwrap();
    match how {
        Damage::FlippedPayload => {
            let at = bytes.len() * 2 / 3;
            bytes[at] ^= 0x10;
        }
        Damage::OtherEngine => bytes[17] ^= 0x01,
        Damage::Truncated => bytes.truncate(bytes.len() / 2),
        Damage::Empty => bytes.clear(),
        Damage::Appended => bytes.extend_from_slice(b"more"),
        Damage::OtherTokenizer => bytes = other.to_vec(),
    }
    std::fs::write(path, bytes).unwrap();
}

#[test]
fn a_stale_or_damaged_compiled_tokenizer_is_rebuilt_with_the_same_ids() {
    let t = TestDir::new();
    let input = input(&t);
    let files = tokenizer_files();
    assert!(files.len() >= 10, "every family's fixture is there");
    // Any other tokenizer's compiled form: the one of the last file.
    let other_cache = t.path("other-cache");
    let other = files.last().unwrap();
    tokenize(&t, other, &input, "other", other_cache.to_str().unwrap());
    let other_form = std::fs::read(compiled_form(&other_cache)).unwrap();
    for (i, file) in files.iter().enumerate() {
        let name = file.file_name().unwrap().to_string_lossy();
        let cache = t.path(&format!("cache-{i}"));
        let cache = cache.to_str().unwrap();
        let reference = format!("reference-{i}");
        let err = tokenize(&t, file, &input, &reference, "off");
        assert!(err.contains("no compiled form kept"), "{name}: {err}");
        let want = snapshot(&t.path(&reference));

        let err = tokenize(&t, file, &input, &format!("first-{i}"), cache);
        assert!(err.contains("compiled form written"), "{name}: {err}");
        assert_eq!(snapshot(&t.path(&format!("first-{i}"))), want, "{name}");
        let form = compiled_form(Path::new(cache));
        let good = std::fs::read(&form).unwrap();

        let err = tokenize(&t, file, &input, &format!("read-{i}"), cache);
        assert!(err.contains("compiled form read from"), "{name}: {err}");
        assert_eq!(snapshot(&t.path(&format!("read-{i}"))), want, "{name}");

        // Two kinds of damage per file, so that every kind meets several
        // families.
        for how in [DAMAGES[i % DAMAGES.len()], DAMAGES[(i + 3) % DAMAGES.len()]] {
            if matches!(how, Damage::OtherTokenizer) && file == other {
                continue;
            }
            damage(&form, how, &other_form);
            let out = format!("after-{how:?}-{i}");
            let err = tokenize(&t, file, &input, &out, cache);
            assert!(
                err.contains("stale or damaged") && err.contains("compiled form written"),
                "{name}, {how:?}: {err}"
            );
            assert_eq!(snapshot(&t.path(&out)), want, "{name}, {how:?}");
            assert_eq!(
                std::fs::read(&form).unwrap(),
                good,
                "{name}, {how:?}: the rebuilt compiled form is the one first written"
            );
        }
    }
}

/// What a run asks of a tokenizer beside its ids (its size, its tokens by
/// name and id, its end-of-document token, what its post-processor adds)
/// is the same read from the compiled form as from the JSON.
#[test]
fn a_compiled_tokenizer_names_its_tokens_as_the_json_does() {
    let t = TestDir::new();
    for file in tokenizer_files() {
        let name = file.file_name().unwrap().to_string_lossy().into_owned();
        let cache = t.path(&name);
        let load = || LoadedTokenizer::load_cached(&file, Readings::Fast, Some(&cache)).unwrap();
        let (from_json, _) = load();
        assert!(
            matches!(
                from_json.compiled,
                Some(prep::engine::Compiled::Written { .. })
            ),
            "{name}: {:?}",
            from_json.compiled
        );
        let (from_form, _) = load();
        assert!(
            matches!(from_form.compiled, Some(prep::engine::Compiled::Read(_))),
            "{name}: {:?}",
            from_form.compiled
        );
        assert_eq!(from_form.vocab_size, from_json.vocab_size, "{name}");
        assert_eq!(from_form.xxh3, from_json.xxh3, "{name}");
        assert_eq!(from_form.default_eos(), from_json.default_eos(), "{name}");
        assert_eq!(
            from_form.post_processor_tokens(),
            from_json.post_processor_tokens(),
            "{name}"
        );
        let hf = LoadedTokenizer::load(&file).unwrap();
        // Every id's text, and every text's id, as HF has them (a sample
        // of the vocabulary, with both ends and every added token).
        let size = from_json.vocab_size as u32;
        let step = (size / 500).max(1);
        for id in (0..size).step_by(step as usize).chain([size - 1]) {
            let text = hf.id_to_token(id);
            assert_eq!(from_form.id_to_token(id), text, "{name}: id {id}");
            if let Some(text) = text {
                assert_eq!(
                    from_form.token_to_id(&text),
                    hf.token_to_id(&text),
                    "{name}: {text:?}"
                );
            }
        }
    }
}
