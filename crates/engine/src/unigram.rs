//! Unigram (T5, mT5, XLM-R): the best segmentation of each word by the
//! vocabulary's scores, exactly as HF tokenizers' `Unigram` finds it.
//!
//! - **Viterbi** over the word's bytes, starting only at character
//!   boundaries: the best score ending at each position is
//!   `best[start] + score(piece)`, with the starts taken left to right and
//!   a candidate replacing the best only when strictly greater, so of equal
//!   sums the one with the earliest start wins. The sums are HF's, in HF's
//!   order, so the rounding is the same too.
//! - **Scores as the Python package reads them.** `tokenizers` parses the
//!   scores with serde_json's default number parser, which is not correctly
//!   rounded (`-2.0122928619384766` becomes the double below it). prep
//!   links serde_json with `float_roundtrip` (through jsonschema), so its
//!   own HF tokenizers reads the exact doubles, and on sums that nearly tie
//!   (`▁-------` in T5) the two builds choose different segmentations.
//!   [`python_score`] is serde_json's default parser, and both this engine
//!   and prep's HF path ([`python_model`]) use it, so both give Python's
//!   ids.
//! - **Unknown characters**: where no piece of one character starts, an
//!   unknown piece of that character scores `min_score - 10`; consecutive
//!   unknown pieces are fused into one, whose id is its text's if the
//!   vocabulary has it, else its bytes' `<0xXX>` pieces under
//!   `byte_fallback` (when every byte has one), else `unk_id`.
//! - **State**: the ids of words of up to [`CACHE_WORD_BYTES`] bytes in a
//!   [`PieceCache`], whose table grows only as far as stays fast to look
//!   up, since on a long run its lookups, not the Viterbi passes of its
//!   misses, are what costs (at most about 9 MiB a worker); plus the
//!   Viterbi buffers, which grow to the longest word seen (28 bytes per
//!   byte of it).
//!
//! A model without `unk_id` is refused: HF fails on the first unknown
//! character, and prep would rather run HF and report that than guess.

use std::sync::LazyLock;

use foldhash::fast::FixedState;
use serde_json::value::RawValue;

use super::cache::PieceCache;
use super::compiled::{Reader, Stale, Writer};
use super::{Unsupported, Vocab};

/// HF's penalty below the lowest score for an unknown character.
const UNK_PENALTY: f64 = 10.0;

/// Words longer than this (in bytes) are not cached.
pub(crate) const CACHE_WORD_BYTES: usize = 48;

/// No token ends at this trie node; no start reaches this position yet.
const NONE: u32 = u32::MAX;

/// The model, ready to encode.
pub(crate) struct Model {
    /// The pieces, with their scores.
    trie: Trie,
    /// Text to id (the last id of a text listed twice, as HF).
    vocab: Vocab,
    unk_id: u32,
    unk_score: f64,
    /// `<0xXX>`'s id by byte, under `byte_fallback`.
    byte_ids: Option<Box<[u32; 256]>>,
}

/// One worker's buffers and cache.
#[derive(Default)]
pub(crate) struct State {
    best: Vec<Best>,
    /// The best path's pieces, last first: (start, end, id).
    path: Vec<(u32, u32, u32)>,
    cache: PieceCache,
}

/// The best path ending at a position.
#[derive(Clone, Copy)]
struct Best {
    score: f64,
    start: u32,
    id: u32,
}

/// The `model` object of a Unigram `tokenizer.json`, with each score's
/// text as written.
#[derive(serde::Deserialize)]
struct Json<'a> {
    #[serde(rename = "type", default)]
    kind: Option<String>,
    #[serde(borrow)]
    vocab: Vec<(String, &'a RawValue)>,
    #[serde(default)]
    unk_id: Option<usize>,
    #[serde(default)]
    byte_fallback: bool,
}

/// A Unigram model's settings as the Python package reads them: the
/// pieces with their scores, `unk_id` and `byte_fallback`.
pub(crate) type PythonModel = (Vec<(String, f64)>, Option<usize>, bool);

/// Reads a Unigram `model` object as the Python package does (the scores
/// by [`python_score`]), for HF's `Unigram::from`.
pub(crate) fn python_model(model: &str) -> Result<PythonModel, Unsupported> {
    let json: Json = serde_json::from_str(model).map_err(|e| Unsupported(format!("model: {e}")))?;
    if json.kind.as_deref().is_some_and(|k| k != "Unigram") {
        return Err(Unsupported("model: not Unigram".into()));
    }
    let mut vocab = Vec::with_capacity(json.vocab.len());
    for (piece, raw) in json.vocab {
        let Some(score) = python_score(raw.get()) else {
            return Err(Unsupported(format!(
                "model: the score of {piece:?} is not a number"
            )));
        };
        vocab.push((piece, score));
    }
    Ok((vocab, json.unk_id, json.byte_fallback))
}

/// Powers of ten as serde_json's parser keeps them: `1e0` to `1e308`,
/// each the double nearest it.
static POW10: LazyLock<Vec<f64>> = LazyLock::new(|| {
    (0..=308)
        .map(|e| format!("1e{e}").parse().expect("a valid float"))
        .collect()
});

/// A JSON number as serde_json (without `float_roundtrip`, as the Python
/// package is built) reads it into an `f64`: the decimal digits as a
/// `u64` (digits past its range dropped, those of the integer part
/// counted into the exponent), converted to `f64`, then multiplied or
/// divided once by a power of ten. Not always the nearest double; that is
/// the point. `None` for text that is not a JSON number, or one serde_json
/// refuses (out of range).
///
/// One piece (about 140 lines) on purpose: it follows serde_json's number
/// parser step by step (sign, integer digits, fraction, exponent, the one
/// scaling), so that each step reads against that reference.
pub(crate) fn python_score(text: &str) -> Option<f64> {
    let b = text.trim().as_bytes();
    let (positive, b) = match b.split_first()? {
        (b'-', rest) => (false, rest),
        _ => (true, b),
    };
    let digit = |c: u8| c.is_ascii_digit().then(|| u64::from(c - b'0'));
    let mut i = 0;
    let mut significand: u64 = 0;
    let mut exponent: i32 = 0;
    // The integer part: one leading zero at most.
    match b.first() {
        Some(b'0') => {
            i = 1;
            if b.get(1).is_some_and(u8::is_ascii_digit) {
                return None;
            }
        }
        Some(c) if c.is_ascii_digit() => {
            // Past the first digit that overflows, each counts only into
            // the exponent.
            let mut overflowed = false;
            while let Some(d) = b.get(i).and_then(|&c| digit(c)) {
                match significand.checked_mul(10).and_then(|s| s.checked_add(d)) {
                    Some(s) if !overflowed => significand = s,
                    _ => {
                        overflowed = true;
                        exponent += 1;
                    }
                }
                i += 1;
            }
        }
        _ => return None,
    }
    let mut float = false;
    if b.get(i) == Some(&b'.') {
        float = true;
        i += 1;
        let digits = i;
        // serde_json keeps adding fraction digits after an integer part
        // that overflowed, and drops them all from the first that does.
        let mut overflowed = false;
        while let Some(d) = b.get(i).and_then(|&c| digit(c)) {
            if !overflowed {
                match significand.checked_mul(10).and_then(|s| s.checked_add(d)) {
                    Some(s) => {
                        significand = s;
                        exponent -= 1;
                    }
                    None => overflowed = true,
                }
            }
            i += 1;
        }
        if i == digits {
            return None;
        }
    }
    if matches!(b.get(i), Some(b'e' | b'E')) {
        float = true;
        i += 1;
        let positive_exp = match b.get(i) {
            Some(b'+') => {
                i += 1;
                true
            }
            Some(b'-') => {
                i += 1;
                false
            }
            _ => true,
        };
        let start = i;
        let mut exp: i32 = 0;
        let mut exp_overflow = false;
        while let Some(d) = b.get(i).and_then(|&c| digit(c)) {
            match exp.checked_mul(10).and_then(|e| e.checked_add(d as i32)) {
                Some(e) => exp = e,
                None => exp_overflow = true,
            }
            i += 1;
        }
        if i == start {
            return None;
        }
        if exp_overflow {
            if significand != 0 && positive_exp {
                return None;
            }
            return (i == b.len()).then_some(if positive { 0.0 } else { -0.0 });
        }
        exponent = if positive_exp {
            exponent.saturating_add(exp)
        } else {
            exponent.saturating_sub(exp)
        };
    }
    if i != b.len() {
        return None;
    }
    if !float && exponent == 0 {
        // An integer: u64 or i64, converted as `as f64` converts it.
        return Some(if positive {
            significand as f64
        } else if significand == 0 || significand > i64::MAX as u64 + 1 {
            -(significand as f64)
        } else {
            (significand as i64).wrapping_neg() as f64
        });
    }
    let mut f = significand as f64;
    loop {
        match POW10.get(exponent.unsigned_abs() as usize) {
            Some(&pow) => {
                if exponent >= 0 {
                    f *= pow;
                    if f.is_infinite() {
                        return None;
                    }
                } else {
                    f /= pow;
                }
                break;
            }
            None => {
                if f == 0.0 {
                    break;
                }
                if exponent >= 0 {
                    return None;
                }
                f /= 1e308;
                exponent += 308;
            }
        }
    }
    Some(if positive { f } else { -f })
}

impl Model {
    /// Writes the model's tables for [`Model::read`].
    pub(crate) fn write(&self, w: &mut Writer) {
        let t = &self.trie;
        w.u32s(&t.root[..]);
        w.len(t.nodes.len());
        for n in &t.nodes {
            w.f64(n.score);
            w.u32(n.id);
            w.u32(n.first);
            w.u32(n.count);
        }
        w.bytes(&t.labels);
        w.vocab(&self.vocab);
        w.u32(self.unk_id);
        w.f64(self.unk_score);
        w.opt(self.byte_ids.as_deref(), |w, b| w.u32s(b));
    }

    /// The model [`Model::write`] wrote.
    pub(crate) fn read(r: &mut Reader) -> Result<Model, Stale> {
        let root = r.table()?;
        let count = r.len()?;
        let mut nodes = Vec::with_capacity(count.min(1 << 24));
        for _ in 0..count {
            nodes.push(Node {
                score: r.f64()?,
                id: r.u32()?,
                first: r.u32()?,
                count: r.u32()?,
            });
        }
        let labels = r.bytes()?.to_vec();
        // A link outside the trie would stop the encoder with a panic.
        let inside = |first: u32, count: u32| {
            (first as usize)
                .checked_add(count as usize)
                .is_some_and(|end| end <= nodes.len())
        };
        let linked = root
            .iter()
            .all(|&i| i == NONE || (i as usize) < nodes.len())
            && nodes.iter().all(|n| inside(n.first, n.count));
        if !linked || labels.len() != nodes.len() {
            return Err(Stale("the trie's links run outside it".into()));
        }
        Ok(Model {
            trie: Trie {
                root,
                nodes,
                labels,
            },
            vocab: r.vocab()?,
            unk_id: r.u32()?,
            unk_score: r.f64()?,
            byte_ids: r.opt(|r| r.table())?,
        })
    }

    /// Reads the `model` object of a `tokenizer.json`, with its
    /// vocabulary (for the added tokens' ids), or says why it is refused.
    pub(crate) fn from_json(model: &str) -> Result<(Model, Vocab), Unsupported> {
        let (pieces, unk_id, byte_fallback) = python_model(model)?;
        let unsupported = |what: &str| Err(Unsupported(format!("model: {what}")));
        let Some(unk_id) = unk_id else {
            return unsupported("Unigram without unk_id (HF fails on an unknown character)");
        };
        if unk_id >= pieces.len() {
            return unsupported("unk_id is not below the vocabulary's size");
        }
        if u32::try_from(pieces.len()).is_err() {
            return unsupported("more than 2^32 pieces");
        }
        let mut vocab = Vocab::with_capacity_and_hasher(pieces.len(), FixedState::default());
        let mut scores = Vec::with_capacity(pieces.len());
        let mut min_score = f64::INFINITY;
        for (id, (piece, score)) in pieces.into_iter().enumerate() {
            // HF's minimum: `<` skips NaN, as here.
            if score < min_score {
                min_score = score;
            }
            scores.push(score);
            vocab.insert(piece, id as u32);
        }
        let byte_ids = if byte_fallback {
            let mut ids = Box::new([NONE; 256]);
            for (b, id) in ids.iter_mut().enumerate() {
                if let Some(&i) = vocab.get(&format!("<0x{b:02X}>")) {
                    *id = i;
                }
            }
            Some(ids)
        } else {
            None
        };
        let trie = Trie::new(&vocab, &scores);
        Ok((
            Model {
                trie,
                unk_id: unk_id as u32,
                unk_score: min_score - UNK_PENALTY,
                byte_ids,
                vocab: vocab.clone(),
            },
            vocab,
        ))
    }

    /// Appends the ids of one pre-tokenized word.
    pub(crate) fn encode(&self, word: &str, state: &mut State, out: &mut Vec<u32>) {
        if word.is_empty() {
            return;
        }
        if word.len() > CACHE_WORD_BYTES {
            self.viterbi(word, state);
            self.emit(word, &state.path, out);
            return;
        }
        if state.cache.get(word.as_bytes(), out) {
            return;
        }
        let from = out.len();
        self.viterbi(word, state);
        self.emit(word, &state.path, out);
        state.cache.insert(word.as_bytes(), &out[from..]);
    }

    /// Leaves the best path's pieces in `state.path`, last first.
    fn viterbi(&self, word: &str, state: &mut State) {
        let bytes = word.as_bytes();
        let n = bytes.len();
        let best = &mut state.best;
        best.clear();
        best.resize(
            n + 1,
            Best {
                score: 0.0,
                start: NONE,
                id: 0,
            },
        );
        let mut start = 0;
        while start < n {
            let here = best[start].score;
            let char_len = utf8_len(bytes[start]);
            let mut single = false;
            self.trie.prefixes(&bytes[start..], |len, id, score| {
                let end = start + len;
                let candidate = score + here;
                let target = &mut best[end];
                if target.start == NONE || candidate > target.score {
                    *target = Best {
                        score: candidate,
                        start: start as u32,
                        id,
                    };
                }
                single |= len == char_len;
            });
            if !single {
                let target = &mut best[start + char_len];
                let candidate = self.unk_score + here;
                if target.start == NONE || candidate > target.score {
                    *target = Best {
                        score: candidate,
                        start: start as u32,
                        id: self.unk_id,
                    };
                }
            }
            start += char_len;
        }
        state.path.clear();
        let mut end = n;
        while end > 0 {
            let b = best[end];
            state.path.push((b.start, end as u32, b.id));
            end = b.start as usize;
        }
    }

    /// Appends the ids of the path's pieces, consecutive unknown pieces
    /// fused into one.
    fn emit(&self, word: &str, path: &[(u32, u32, u32)], out: &mut Vec<u32>) {
        let mut i = path.len();
        while i > 0 {
            i -= 1;
            let (start, end, id) = path[i];
            if id != self.unk_id {
                out.push(id);
                continue;
            }
            let mut stop = end;
            while i > 0 && path[i - 1].2 == self.unk_id {
                i -= 1;
                stop = path[i].1;
            }
            let text = &word[start as usize..stop as usize];
            if let Some(&id) = self.vocab.get(text) {
                out.push(id);
                continue;
            }
            if let Some(bytes) = &self.byte_ids {
                if text.bytes().all(|b| bytes[b as usize] != NONE) {
                    out.extend(text.bytes().map(|b| bytes[b as usize]));
                    continue;
                }
            }
            out.push(self.unk_id);
        }
    }
}

/// The length of the UTF-8 character that starts with `lead`.
#[inline]
fn utf8_len(lead: u8) -> usize {
    match lead {
        0x00..=0x7F => 1,
        0xC0..=0xDF => 2,
        0xE0..=0xEF => 3,
        _ => 4,
    }
}

/// The pieces' bytes as a trie, laid out for few cache misses per byte:
/// each node (its piece's id and score, and where its children are) is
/// one record, a node's children are consecutive records, and their labels
/// lie in the same order in `labels`; the root's children are a table.
struct Trie {
    root: Box<[u32; 256]>,
    nodes: Vec<Node>,
    /// Per node: the byte that leads to it.
    labels: Vec<u8>,
}

/// A trie node.
#[derive(Clone, Copy)]
struct Node {
    /// The score of the piece ending here.
    score: f64,
    /// The id of the piece ending here, or [`NONE`].
    id: u32,
    /// Its children: `nodes[first..first + count]`.
    first: u32,
    count: u32,
}

impl Trie {
    fn new(vocab: &Vocab, scores: &[f64]) -> Trie {
        let mut pieces: Vec<(&[u8], u32)> = vocab
            .iter()
            .filter(|(p, _)| !p.is_empty())
            .map(|(p, &id)| (p.as_bytes(), id))
            .collect();
        pieces.sort_unstable();
        let mut trie = Trie {
            root: Box::new([NONE; 256]),
            nodes: Vec::new(),
            labels: Vec::new(),
        };
        // Nodes to fill in: (node, its pieces, which share `depth` bytes).
        let mut todo = std::collections::VecDeque::new();
        for (label, range) in groups(&pieces, 0) {
            trie.root[label as usize] = trie.push(label);
            todo.push_back((trie.nodes.len() - 1, range, 1));
        }
        while let Some((node, range, depth)) = todo.pop_front() {
            let mut group = &pieces[range.clone()];
            let mut start = range.start;
            // Sorted, so a piece of exactly `depth` bytes comes first.
            if let Some(&(p, id)) = group.first() {
                if p.len() == depth {
                    trie.nodes[node].id = id;
                    trie.nodes[node].score = scores[id as usize];
                    group = &group[1..];
                    start += 1;
                }
            }
            let children = groups(group, depth);
            trie.nodes[node].first = trie.nodes.len() as u32;
            trie.nodes[node].count = children.len() as u32;
            for (label, r) in children {
                let child = trie.push(label);
                todo.push_back((child as usize, start + r.start..start + r.end, depth + 1));
            }
        }
        trie
    }

    /// A new node reached by `label`, with no piece and no children yet.
    fn push(&mut self, label: u8) -> u32 {
        self.nodes.push(Node {
            score: 0.0,
            id: NONE,
            first: 0,
            count: 0,
        });
        self.labels.push(label);
        (self.nodes.len() - 1) as u32
    }

    /// Calls `found(length, id, score)` for each piece that is a prefix of
    /// `bytes`, shortest first.
    #[inline]
    fn prefixes(&self, bytes: &[u8], mut found: impl FnMut(usize, u32, f64)) {
        let Some(&b0) = bytes.first() else {
            return;
        };
        let mut node = self.root[b0 as usize];
        if node == NONE {
            return;
        }
        let mut len = 1;
        loop {
            let n = self.nodes[node as usize];
            if n.id != NONE {
                found(len, n.id, n.score);
            }
            let Some(&b) = bytes.get(len) else {
                return;
            };
            let (lo, hi) = (n.first as usize, (n.first + n.count) as usize);
            let labels = &self.labels[lo..hi];
            let k = if labels.len() <= 8 {
                match labels.iter().position(|&l| l == b) {
                    Some(k) => k,
                    None => return,
                }
            } else {
                match labels.binary_search(&b) {
                    Ok(k) => k,
                    Err(_) => return,
                }
            };
            node = (lo + k) as u32;
            len += 1;
        }
    }
}

/// The runs of `pieces` (sorted, each longer than `depth` bytes) by their
/// byte at `depth`: (that byte, the run's range).
fn groups(pieces: &[(&[u8], u32)], depth: usize) -> Vec<(u8, std::ops::Range<usize>)> {
    let mut out = Vec::new();
    let mut i = 0;
    while i < pieces.len() {
        let label = pieces[i].0[depth];
        let j = i + pieces[i..].partition_point(|p| p.0[depth] == label);
        out.push((label, i..j));
        i = j;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn python_score_is_serde_jsons_default_parse() {
        // The nearest double, and the one serde_json's default parser
        // gives (T5's score of "▁").
        let exact: f64 = "-2.0122928619384766".parse().unwrap();
        let python = python_score("-2.0122928619384766").unwrap();
        assert_ne!(exact, python);
        assert_eq!(python, -(20122928619384766u64 as f64 / 1e16));
        for (text, value) in [
            ("0.0", 0.0),
            ("-0.5", -0.5),
            ("0", 0.0),
            ("-3", -3.0),
            ("1e2", 100.0),
            ("-1.5E-1", -0.15),
        ] {
            assert_eq!(python_score(text), Some(value), "{text}");
        }
        for bad in ["", "-", "01", "1.", ".5", "1e", "abc", "1e999"] {
            assert_eq!(python_score(bad), None, "{bad}");
        }
    }

    fn model(pieces: &[(&str, f64)], unk: usize, byte_fallback: bool) -> Model {
        let vocab: Vec<String> = pieces
            .iter()
            .map(|(p, s)| format!("[{},{s:?}]", serde_json::to_string(p).unwrap()))
            .collect();
        let json = format!(
            r#"{{"type":"Unigram","unk_id":{unk},"byte_fallback":{byte_fallback},"vocab":[{}]}}"#,
            vocab.join(",")
        );
        Model::from_json(&json).unwrap().0
    }

    fn ids(m: &Model, word: &str) -> Vec<u32> {
        let mut out = Vec::new();
        m.encode(word, &mut State::default(), &mut out);
        out
    }

    #[test]
    fn best_segmentation_and_fused_unknowns() {
        // HF's own example: "abcdacdxx" is abcd, a, cd, xx (xx one unknown).
        let m = model(
            &[
                ("<unk>", 0.0),
                ("a", 0.0),
                ("b", 0.0),
                ("c", 0.0),
                ("d", 0.0),
                ("cd", 1.0),
                ("ab", 2.0),
                ("abc", 5.0),
                ("abcd", 10.0),
            ],
            0,
            false,
        );
        assert_eq!(ids(&m, "abcdacdxx"), [8, 1, 5, 0]);
    }

    #[test]
    fn byte_fallback_spells_unknowns_in_bytes() {
        let m = model(
            &[
                ("<unk>", 0.0),
                ("a", -1.0),
                ("<0xC3>", -1.0),
                ("<0xA9>", -1.0),
            ],
            0,
            true,
        );
        assert_eq!(ids(&m, "aéa"), [1, 2, 3, 1]);
        // A byte without its piece: the whole unknown run is unk.
        assert_eq!(ids(&m, "aü"), [1, 0]);
    }

    #[test]
    fn cached_ids_are_the_ids() {
        let m = model(
            &[("<unk>", 0.0), ("a", -1.0), ("b", -1.0), ("ab", -1.5)],
            0,
            false,
        );
        // Short with few ids, short with more ids than the table holds,
        // long, too long to cache, and many words sharing sets.
        let mut words: Vec<String> = ["ab", "abab", "a", "baaaaaaaa", &"ab".repeat(10)]
            .iter()
            .map(|w| w.to_string())
            .collect();
        words.push("ab".repeat(30));
        for n in 0..3 * super::super::cache::MIN_SETS {
            words.push(format!("{n:b}").replace('0', "a").replace('1', "b"));
        }
        let mut state = State::default();
        for round in 0..3 {
            for w in &words {
                let mut got = Vec::new();
                m.encode(w, &mut state, &mut got);
                assert_eq!(got, ids(&m, w), "{w}, round {round}");
            }
        }
    }
}
