//! BPE over characters, SentencePiece style (Llama 2, Mistral, Phi-3):
//! merges by rank over the characters of each word, with byte fallback.
//!
//! The ids are HF tokenizers' (`models/bpe`): a word becomes one symbol per
//! character (its token; else, with `byte_fallback`, one `<0xNN>` token per
//! UTF-8 byte when the vocabulary has all of them; else the unknown token,
//! fused with its neighbours under `fuse_unk`; else nothing), then the
//! lowest-ranked adjacent pair is merged, leftmost first, until none is
//! left. HF pushes an unknown token only when the next character with a
//! token of its own (or the end) comes, so bytes of a later character can
//! come before it; that order is kept here too.
//!
//! # Whole documents as one word
//!
//! The SentencePiece files give the model whole texts as one word (Mistral's
//! `Metaspace` with `split: false`, Phi-3's normalizer and no
//! pre-tokenizer). HF merges such a word in one heap run that no cache
//! helps. Here the word is cut where the vocabulary proves that no merge
//! can ever join the two sides, each piece is merged alone, and pieces are
//! cached. The proof, made once per file at load ([`Cuts`]):
//!
//! - a symbol's token text is the concatenation of the texts of the
//!   symbols it was merged from (HF merges `a b` into the token `a` + `b`;
//!   the vocabulary must give each id one text for this to hold), so a merge
//!   across the cut between characters `x` and `y` joins a left part whose
//!   text ends with `tail(x)` to a right part whose text starts with
//!   `head(y)` (the character itself when it has a token, `>` and `<` for
//!   byte tokens, the unknown token's ends);
//! - so if no merge `a b` has `a` ending with `tail(x)` and `b` starting
//!   with `head(y)`, no pair across the cut ever has a merge, never enters
//!   HF's heap, and the lowest-ranked pair of the whole word is always the
//!   lowest-ranked pair of the piece it lies in: the pieces merged alone give
//!   the same ids in the same order;
//! - the symbols before merging must cut there too: not beside a character
//!   that yields nothing, and, where an unknown token can arise, beside a
//!   character that has a token (which pushes any pending unknown token).
//!
//! The cuts tried are before each `▁` (in Llama 2, Mistral and Phi-3 only
//! all-`▁` tokens merge with a `▁` on their right, so every word start but
//! one inside a run of spaces is a cut), then, in a piece too long to cache,
//! at every junction the proof allows (most of CJK text). A vocabulary
//! where the proof fails somewhere loses only those cuts; one whose ids do
//! not each have one text keeps the whole-word path.
//!
//! # Memory
//!
//! [`State`] caches the ids of pieces of up to [`CACHE_BYTES`] bytes in a
//! [`PieceCache`] (at most about 9 MiB a worker), plus the merge buffers, which
//! grow to the longest piece merged.

use std::collections::{HashMap, HashSet};

use foldhash::fast::FixedState;
use serde_json::Value;

use super::bpe::{self, Merge};
use super::cache::PieceCache;
use super::compiled::{Reader, Stale, Writer};
use super::{MergeLine, Unsupported, Vocab};

/// The character SentencePiece marks a word's start with.
const MARK: char = '\u{2581}';
/// Its UTF-8 bytes.
const MARK_UTF8: &[u8] = "\u{2581}".as_bytes();
/// No token (a character with none, or the end of a list).
const NONE: u32 = u32::MAX;
/// Pieces of at most this many symbols merge by scanning; longer ones
/// through the heap.
const SCAN_MAX: usize = 48;
/// Pieces of at most this many bytes are cached; longer ones are cut at
/// every proven junction and their parts cached.
pub(crate) const CACHE_BYTES: usize = 64;

/// The model, ready to encode.
pub(crate) struct Model {
    /// The id of each character below U+10000 that is a token; [`NONE`]
    /// for the others.
    bmp: Box<[u32]>,
    /// The characters above U+FFFF that are tokens.
    astral: HashMap<char, u32, FixedState>,
    /// With `byte_fallback`, the id of each `<0xNN>` token ([`NONE`] where
    /// the vocabulary lacks it).
    bytes: Option<Box<[u32; 256]>>,
    unk: Option<u32>,
    fuse_unk: bool,
    /// `(left << 32 | right)` to the merge.
    merges: bpe::MergeTable,
    /// The vocabulary, with `ignore_merges` (a word that is a token is it).
    whole: Option<Vocab>,
    /// Where words may be cut; `None` keeps every word whole.
    cuts: Option<Cuts>,
}

/// What a character becomes before merging.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Token(u32),
    Bytes,
    Unk,
    Nothing,
}

/// The junctions no merge crosses, proven from the merges (see the
/// module's docs).
struct Cuts {
    /// `tail << 32 | head` of every merge: the last character of its left
    /// part, the first of its right.
    joins: HashSet<u64, FixedState>,
    /// The first and last characters of the unknown token.
    unk_ends: (char, char),
    /// Whether an unknown token can be pending at a junction.
    pending_unk: bool,
    /// Whether the proof allows a cut between each ASCII character and a
    /// mark after it.
    before_mark: [bool; 128],
}

/// One worker's buffers and cache of merged pieces; nothing in it changes
/// the ids.
#[derive(Default)]
pub(crate) struct State {
    cache: PieceCache,
    ids: Vec<u32>,
    syms: Vec<(u32, Merge)>,
    heap: bpe::HeapMerge,
}

#[inline(always)]
fn pair(left: u32, right: u32) -> u64 {
    u64::from(left) << 32 | u64::from(right)
}

/// The fields of a BPE `model` object that HF reads.
#[derive(serde::Deserialize)]
struct Json<'a> {
    #[serde(default)]
    dropout: Value,
    #[serde(default)]
    unk_token: Value,
    #[serde(default)]
    continuing_subword_prefix: Value,
    #[serde(default)]
    end_of_word_suffix: Value,
    #[serde(default)]
    fuse_unk: Value,
    #[serde(default)]
    byte_fallback: Value,
    #[serde(default)]
    ignore_merges: Value,
    vocab: Vocab,
    #[serde(borrow)]
    merges: Vec<MergeLine<'a>>,
}

/// A flag HF reads as `Option<bool>`: absent or null is `false`.
fn flag(value: &Value, key: &str) -> Result<bool, Unsupported> {
    match value {
        Value::Null => Ok(false),
        Value::Bool(b) => Ok(*b),
        other => Err(Unsupported(format!("model: {key} is {other}"))),
    }
}

impl Model {
    /// Writes the model's tables for [`Model::read`].
    pub(crate) fn write(&self, w: &mut Writer) {
        w.u32s(&self.bmp);
        let astral: Vec<u64> = self
            .astral
            .iter()
            .map(|(&c, &id)| u64::from(c as u32) << 32 | u64::from(id))
            .collect();
        w.u64s(&astral);
        w.opt(self.bytes.as_deref(), |w, b| w.u32s(b));
        w.opt(self.unk.as_ref(), |w, &u| w.u32(u));
        w.bool(self.fuse_unk);
        self.merges.write(w);
        w.opt(self.whole.as_ref(), |w, whole| w.vocab(whole));
        w.opt(self.cuts.as_ref(), |w, cuts| {
            w.u64s(&cuts.joins.iter().copied().collect::<Vec<_>>());
            w.u32(cuts.unk_ends.0 as u32);
            w.u32(cuts.unk_ends.1 as u32);
            w.bool(cuts.pending_unk);
            for &b in &cuts.before_mark {
                w.bool(b);
            }
        });
    }

    /// The model [`Model::write`] wrote.
    pub(crate) fn read(r: &mut Reader) -> Result<Model, Stale> {
        let char_of = |c: u32| char::from_u32(c).ok_or_else(|| Stale("not a character".into()));
        let bmp = r.u32s()?.into_boxed_slice();
        if bmp.len() != 0x10000 {
            return Err(Stale("the character table has the wrong length".into()));
        }
        let mut astral = HashMap::default();
        for v in r.u64s()? {
            astral.insert(char_of((v >> 32) as u32)?, v as u32);
        }
        Ok(Model {
            bmp,
            astral,
            bytes: r.opt(|r| r.table())?,
            unk: r.opt(|r| r.u32())?,
            fuse_unk: r.bool()?,
            merges: bpe::MergeTable::read(r)?,
            whole: r.opt(|r| r.vocab())?,
            cuts: r.opt(|r| {
                let joins = r.u64s()?.into_iter().collect();
                let unk_ends = (char_of(r.u32()?)?, char_of(r.u32()?)?);
                let pending_unk = r.bool()?;
                let mut before_mark = [false; 128];
                for b in &mut before_mark {
                    *b = r.bool()?;
                }
                Ok(Cuts {
                    joins,
                    unk_ends,
                    pending_unk,
                    before_mark,
                })
            })?,
        })
    }
    /// Reads the `model` object of a `tokenizer.json`, with its
    /// vocabulary (for the added tokens' ids), or says why it is refused.
    ///
    /// One piece (about 120 lines): the check of each field of the model
    /// object in turn, each refusal beside the field it is about.
    pub(crate) fn from_json(model: &str) -> Result<(Model, Vocab), Unsupported> {
        let unsupported = |what: String| Err(Unsupported(format!("model: {what}")));
        let m: Json =
            serde_json::from_str(model).map_err(|e| Unsupported(format!("model: {e}")))?;
        if !(m.dropout.is_null() || m.dropout.as_f64() == Some(0.0)) {
            return unsupported("dropout".into());
        }
        for (key, value) in [
            ("continuing_subword_prefix", &m.continuing_subword_prefix),
            ("end_of_word_suffix", &m.end_of_word_suffix),
        ] {
            // An empty one changes nothing in HF either.
            if !(value.is_null() || value == "") {
                return unsupported(format!("{key} is set"));
            }
        }
        let fuse_unk = flag(&m.fuse_unk, "fuse_unk")?;
        let byte_fallback = flag(&m.byte_fallback, "byte_fallback")?;
        let ignore_merges = flag(&m.ignore_merges, "ignore_merges")?;
        let vocab = m.vocab;
        let unk = match &m.unk_token {
            Value::Null => None,
            Value::String(t) => match vocab.get(t) {
                Some(&id) => Some((t.clone(), id)),
                // HF fails on the first character without a token.
                None => return unsupported(format!("unk_token {t:?} is not in the vocabulary")),
            },
            other => return unsupported(format!("unk_token is {other}")),
        };

        let mut bmp = vec![NONE; 0x10000].into_boxed_slice();
        let mut astral = HashMap::default();
        for (token, &id) in &vocab {
            let mut chars = token.chars();
            if let (Some(c), None) = (chars.next(), chars.next()) {
                match bmp.get_mut(c as usize) {
                    Some(slot) => *slot = id,
                    None => {
                        astral.insert(c, id);
                    }
                }
            }
        }
        let bytes = byte_fallback.then(|| {
            let mut ids = Box::new([NONE; 256]);
            for (b, id) in ids.iter_mut().enumerate() {
                // HF's spelling: `<{b:#04X}>`, as in `<0x0A>`.
                *id = vocab.get(&format!("<{b:#04X}>")).copied().unwrap_or(NONE);
            }
            ids
        });

        let mut merges = bpe::MergeTableBuilder::with_capacity(m.merges.len());
        let mut joins = HashSet::default();
        let mut joined = String::new();
        for (rank, line) in m.merges.iter().enumerate() {
            let Some((a, b)) = line.pair() else {
                return unsupported(format!("merge {rank} is not a pair"));
            };
            joined.clear();
            joined.push_str(a);
            joined.push_str(b);
            let id = |t: &str| vocab.get(t).copied();
            let (Some(left), Some(right), Some(new)) = (id(a), id(b), id(&joined)) else {
                return unsupported(format!("merge {rank} names tokens not in the vocabulary"));
            };
            // As in HF, a pair listed twice keeps its last rank.
            let merge = Merge {
                rank: rank as u32,
                id: new,
            };
            if !merges.insert(pair(left, right), merge) {
                return unsupported(format!("merge {rank} joins two tokens of id {}", u32::MAX));
            }
            if let (Some(tail), Some(head)) = (a.chars().next_back(), b.chars().next()) {
                joins.insert(pair(tail as u32, head as u32));
            }
        }

        // The proof needs one text per id, and an unknown token with ends.
        let mut ids: Vec<u32> = vocab.values().copied().collect();
        ids.sort_unstable();
        let one_text_per_id = ids.windows(2).all(|w| w[0] != w[1]);
        let unk_ends = match &unk {
            Some((t, _)) => t.chars().next().zip(t.chars().next_back()),
            None => Some((MARK, MARK)),
        };
        let cuts = match unk_ends {
            Some(unk_ends) if one_text_per_id => Some(Cuts {
                joins,
                unk_ends,
                // Without a complete byte fallback a character can be unknown.
                pending_unk: unk.is_some() && bytes.as_ref().is_none_or(|b| b.contains(&NONE)),
                before_mark: [false; 128],
            }),
            _ => None,
        };

        let mut model = Model {
            bmp,
            astral,
            bytes,
            unk: unk.map(|(_, id)| id),
            fuse_unk,
            merges: merges.finish(),
            whole: ignore_merges.then(|| vocab.clone()),
            cuts,
        };
        if let Some(cuts) = &model.cuts {
            let before_mark = std::array::from_fn(|b| model.cuttable(cuts, b as u8 as char, MARK));
            if let Some(cuts) = &mut model.cuts {
                cuts.before_mark = before_mark;
            }
        }
        Ok((model, vocab))
    }

    #[inline(always)]
    fn token(&self, c: char) -> u32 {
        match self.bmp.get(c as usize) {
            Some(&id) => id,
            None => self.astral.get(&c).copied().unwrap_or(NONE),
        }
    }

    #[inline(always)]
    fn merge(&self, left: u32, right: u32) -> Option<Merge> {
        self.merges.get(pair(left, right))
    }

    /// The byte tokens of `c`, when the vocabulary has all of them.
    fn byte_tokens(&self, c: char) -> Option<impl Iterator<Item = u32> + '_> {
        let ids = self.bytes.as_ref()?;
        let mut buf = [0u8; 4];
        let utf8 = c.encode_utf8(&mut buf).as_bytes();
        if utf8.iter().any(|&b| ids[b as usize] == NONE) {
            return None;
        }
        let (len, buf) = (utf8.len(), buf);
        Some((0..len).map(move |i| ids[buf[i] as usize]))
    }

    fn kind(&self, c: char) -> Kind {
        match self.token(c) {
            NONE if self.byte_tokens(c).is_some() => Kind::Bytes,
            NONE if self.unk.is_some() => Kind::Unk,
            NONE => Kind::Nothing,
            id => Kind::Token(id),
        }
    }

    /// Whether the proof allows cutting between `x` and `y`, adjacent.
    fn cuttable(&self, cuts: &Cuts, x: char, y: char) -> bool {
        let ends = |k: Kind, c: char| match k {
            Kind::Token(_) => Some((c, c)),
            Kind::Bytes => Some(('<', '>')),
            Kind::Unk => Some(cuts.unk_ends),
            Kind::Nothing => None,
        };
        let (kx, ky) = (self.kind(x), self.kind(y));
        let (Some((_, tail)), Some((head, _))) = (ends(kx, x), ends(ky, y)) else {
            return false;
        };
        if cuts.pending_unk && !matches!(kx, Kind::Token(_)) && !matches!(ky, Kind::Token(_)) {
            return false;
        }
        !cuts.joins.contains(&pair(tail as u32, head as u32))
    }

    /// Appends the ids of one pre-tokenized word.
    pub(crate) fn encode(&self, word: &str, state: &mut State, out: &mut Vec<u32>) {
        if word.is_empty() {
            return;
        }
        if let Some(id) = self.whole.as_ref().and_then(|v| v.get(word)) {
            out.push(*id);
            return;
        }
        let Some(cuts) = &self.cuts else {
            return self.encode_piece(word, false, state, out);
        };
        // Each mark, found by its first byte: words are short, and a byte
        // loop beats a search started per word.
        let bytes = word.as_bytes();
        let mut start = 0;
        let mut i = 1;
        while i + 2 < bytes.len() {
            if bytes[i] != MARK_UTF8[0] || bytes[i..i + 3] != *MARK_UTF8 {
                i += 1;
                continue;
            }
            let cut = match bytes[i - 1] {
                b @ 0..0x80 => cuts.before_mark[b as usize],
                _ => {
                    let x = word[..i].chars().next_back().expect("a character before");
                    self.cuttable(cuts, x, MARK)
                }
            };
            if cut && start < i {
                self.encode_piece(&word[start..i], true, state, out);
                start = i;
            }
            i += 3;
        }
        self.encode_piece(&word[start..], true, state, out);
    }

    /// Appends the ids of a piece that merges alone, through the cache;
    /// one too long to cache is cut at every proven junction when `cut`.
    fn encode_piece(&self, piece: &str, cut: bool, state: &mut State, out: &mut Vec<u32>) {
        if piece.len() > CACHE_BYTES {
            if let (true, Some(cuts)) = (cut, &self.cuts) {
                let mut start = 0;
                let mut chars = piece.char_indices();
                let mut before = chars.next().map(|(_, c)| c);
                for (i, y) in chars {
                    let x = before.replace(y).expect("a character before");
                    if self.cuttable(cuts, x, y) {
                        self.encode_piece(&piece[start..i], false, state, out);
                        start = i;
                    }
                }
                return self.encode_piece(&piece[start..], false, state, out);
            }
            return self.merge_piece(piece, state, out);
        }
        if state.cache.get(piece.as_bytes(), out) {
            return;
        }
        let before = out.len();
        self.merge_piece(piece, state, out);
        state.cache.insert(piece.as_bytes(), &out[before..]);
    }

    /// HF's `merge_word`: the symbols of `piece`, merged.
    fn merge_piece(&self, piece: &str, state: &mut State, out: &mut Vec<u32>) {
        let ids = &mut state.ids;
        ids.clear();
        // The unknown token HF has not pushed yet.
        let mut pending: Option<u32> = None;
        for c in piece.chars() {
            let id = self.token(c);
            if id != NONE {
                if let Some(unk) = pending.take() {
                    ids.push(unk);
                }
                ids.push(id);
                continue;
            }
            if let Some(bytes) = self.byte_tokens(c) {
                // Before any pending unknown token, as HF has it.
                ids.extend(bytes);
                continue;
            }
            if let Some(unk) = self.unk {
                if pending.is_some() && !self.fuse_unk {
                    ids.push(unk);
                }
                pending = Some(unk);
            }
        }
        ids.extend(pending);
        if ids.len() <= SCAN_MAX {
            self.merge_scan(state);
            out.extend(state.syms.iter().map(|&(id, _)| id));
        } else {
            self.merge_heap(state, out);
        }
    }

    /// Merging on a small array of (id, rank of the pair it starts):
    /// lowest rank, leftmost first; each merge looks up only the two pairs
    /// it changes.
    fn merge_scan(&self, state: &mut State) {
        let syms = &mut state.syms;
        syms.clear();
        syms.extend(state.ids.iter().map(|&id| (id, bpe::NO_MERGE)));
        bpe::merge_scan(syms, |left, right| self.merge(left, right));
    }

    /// Heap merging over a linked list, as HF does it.
    fn merge_heap(&self, state: &mut State, out: &mut Vec<u32>) {
        let State { ids, heap, .. } = state;
        heap.merge(
            ids.iter().copied(),
            |left, right| self.merge(left, right),
            out,
        );
    }
}
