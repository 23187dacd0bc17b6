//! The engine tests' differential harness: one text through prep's HF path
//! (HF tokenizers as `prep tokenize --engine hf` loads it, whose ids are the
//! Python package's) and through the fast engine, and the first difference
//! named.

use std::io::{BufRead, BufReader, Read};
use std::path::Path;

use prep::engine::offsets::Offsets;
use prep::engine::{EncodeState, FastTokenizer, LoadedTokenizer};
use tokenizers::Tokenizer;

/// A zstd file's bytes.
pub fn read_zst(path: &Path) -> Vec<u8> {
    let mut out = Vec::new();
    zstd::Decoder::new(std::fs::File::open(path).unwrap())
        .unwrap()
        .read_to_end(&mut out)
        .unwrap();
    out
}

/// Texts of a JSONL file's `text` fields.
pub fn texts(jsonl: &[u8]) -> Vec<String> {
    BufReader::new(jsonl)
        .lines()
        .map(|line| {
            let v: serde_json::Value = serde_json::from_str(&line.unwrap()).unwrap();
            v["text"].as_str().unwrap().to_owned()
        })
        .collect()
}

/// A tokenizer in prep's HF path and in the fast engine, which must take it:
/// the engine read from the JSON, and read back from its compiled form.
pub struct Pair {
    pub name: String,
    pub json: Vec<u8>,
    pub hf: Tokenizer,
    pub fast: FastTokenizer,
    /// The engine as a later run reads it: from the compiled form of the
    /// same file, which must give the same ids as `fast` on every text.
    pub compiled: FastTokenizer,
    /// The compiled one's state, apart from the callers', whose caches
    /// would otherwise be emptied at every switch.
    compiled_state: std::sync::Mutex<EncodeState>,
}

impl Pair {
    pub fn new(name: &str, json: &[u8]) -> Pair {
        let source = xxhash_rust::xxh3::xxh3_64(json);
        let (fast, sealed) = FastTokenizer::compile(json, source)
            .unwrap_or_else(|e| panic!("{name}: the fast engine refuses it: {e}"));
        let dir = tempfile::tempdir().unwrap();
        // Mapped from a file, as a run reads it: the merge table in place.
        let form = dir.path().join("compiled.tok");
        std::fs::write(&form, &sealed).unwrap();
        let compiled = FastTokenizer::from_compiled_path(&form, source)
            .unwrap()
            .unwrap_or_else(|e| panic!("{name}: its compiled form does not read back: {e}"));
        let path = dir.path().join("tokenizer.json");
        std::fs::write(&path, json).unwrap();
        let hf = LoadedTokenizer::load(&path)
            .and_then(LoadedTokenizer::into_hf)
            .unwrap_or_else(|e| panic!("{name}: HF tokenizers refuses it: {e}"));
        Pair {
            name: name.into(),
            json: json.to_vec(),
            hf,
            fast,
            compiled,
            compiled_state: Default::default(),
        }
    }

    /// The reference ids.
    pub fn hf_ids(&self, text: &str) -> Vec<u32> {
        self.hf.encode_fast(text, false).unwrap().get_ids().to_vec()
    }

    /// The fast engine's ids.
    pub fn fast_ids(&self, text: &str, state: &mut EncodeState) -> Vec<u32> {
        let mut got = Vec::new();
        self.fast.encode(text, state, &mut got);
        got
    }

    /// Encodes `text` with the fast engine and compares with `want`; a
    /// message naming the first difference.
    pub fn compare(&self, text: &str, want: &[u32], state: &mut EncodeState) -> Result<(), String> {
        let got = self.fast_ids(text, state);
        if got == want {
            let mut compiled = Vec::new();
            let mut own = self
                .compiled_state
                .lock()
                .unwrap_or_else(|e| e.into_inner());
            self.compiled.encode(text, &mut own, &mut compiled);
            if compiled != got {
                return Err(format!(
                    "{}: the compiled form's ids differ from the JSON's on {:?}",
                    self.name,
                    text.chars().take(200).collect::<String>()
                ));
            }
            return Ok(());
        }
        let at = got.iter().zip(want).take_while(|(a, b)| a == b).count();
        let token = |id: &u32| self.hf.id_to_token(*id).unwrap_or_default();
        let around = |ids: &[u32]| -> Vec<String> {
            ids[at.saturating_sub(3)..(at + 4).min(ids.len())]
                .iter()
                .map(token)
                .collect()
        };
        Err(format!(
            "{}: ids differ at {at} on {:?}\n  hf:   {:?}\n  fast: {:?}",
            self.name,
            text.chars().take(200).collect::<String>(),
            around(want),
            around(&got),
        ))
    }

    /// Encodes `text` with both.
    pub fn check(&self, text: &str, state: &mut EncodeState) -> Result<(), String> {
        self.compare(text, &self.hf_ids(text), state)
    }
}

/// Checks `text` with every pair, one state for all (as a worker's state
/// moves between tokenizers).
pub fn check_all(pairs: &[Pair], text: &str) -> Result<(), String> {
    let mut state = EncodeState::default();
    pairs
        .iter()
        .try_for_each(|pair| pair.check(text, &mut state))
}

/// The whole-corpus check of the by-hand tests (`make test-by-hand`): every document of
/// debian-docs.jsonl.zst (under `PREP_EXTERNAL_DATA`, [`super::external`])
/// through each pair, the pairs in parallel (HF's encoding is the slow
/// side); panics naming the first differences, or when the corpus is not
/// there.
pub fn shared_corpus_identical(pairs: Vec<Pair>) {
    use rayon::prelude::*;
    let path = super::external("debian-docs.jsonl.zst");
    let texts = texts(&read_zst(&path));
    let failures: Vec<String> = pairs
        .par_iter()
        .flat_map_iter(|pair| {
            let mut state = EncodeState::default();
            let mut failures = Vec::new();
            let mut bad = 0;
            for text in &texts {
                if let Err(e) = pair.check(text, &mut state) {
                    bad += 1;
                    if bad <= 3 {
                        failures.push(e);
                    }
                }
            }
            eprintln!(
                "{}: {} documents compared, {bad} differ",
                pair.name,
                texts.len()
            );
            if bad > 0 {
                failures.push(format!("{}: {bad} documents differ", pair.name));
            }
            failures
        })
        .collect();
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// `Offsets::of` against HF's own offsets: where it places a text's
/// tokens, every token lies where HF puts it (an error naming the first
/// that does not). Returns whether each pair placed the text.
pub fn offsets_agree(pairs: &[(Pair, Offsets)], text: &str) -> Result<Vec<bool>, String> {
    let mut out = Vec::new();
    pairs
        .iter()
        .map(|(pair, table)| {
            let encoding = pair.hf.encode(text, false).unwrap();
            let placed = table.of(encoding.get_ids(), text, &mut out);
            if placed && out != encoding.get_offsets() {
                let at = out
                    .iter()
                    .zip(encoding.get_offsets())
                    .take_while(|(a, b)| a == b)
                    .count();
                return Err(format!(
                    "{}: offsets differ at token {at} ({:?}) on {text:?}: ours {:?}, HF {:?}",
                    pair.name,
                    pair.hf.id_to_token(encoding.get_ids()[at]),
                    out.get(at),
                    encoding.get_offsets().get(at)
                ));
            }
            Ok(placed)
        })
        .collect()
}

/// [`offsets_agree`] over `texts`, panicking on the first disagreement:
/// how many texts each pair placed (printed too).
pub fn placed_counts(pairs: &[(Pair, Offsets)], texts: &[String]) -> Vec<usize> {
    let mut placed = vec![0usize; pairs.len()];
    for text in texts {
        let got = offsets_agree(pairs, text).unwrap_or_else(|e| panic!("{e}"));
        for (n, p) in placed.iter_mut().zip(got) {
            *n += usize::from(p);
        }
    }
    for ((pair, _), n) in pairs.iter().zip(&placed) {
        eprintln!("{}: {n} of {} texts placed", pair.name, texts.len());
    }
    placed
}
