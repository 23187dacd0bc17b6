//! Pre-tokenizers in general: any sequence of `Split`, `ByteLevel`,
//! `Digits`, `Punctuation`, `Whitespace` and `WhitespaceSplit`, each applied
//! to every piece the previous one made, as HF tokenizers does.
//!
//! Each step finds its matches the way HF's does (characters one by one for
//! the character classes, the regex crate for the patterns HF itself runs
//! with it, the scanners of [`super::scan`] for the split patterns they know,
//! the regex crate for split patterns whose meaning does not depend on
//! the regex engine, and [`super::dfa`] for any other), then cuts the piece by the step's `behavior` exactly as
//! HF's `NormalizedString::split` does. Steps after `ByteLevel` see the
//! text in the byte-level alphabet, as they do in HF.

use std::sync::OnceLock;

use regex_automata::meta::{Cache as RegexCache, Regex};
use regex_automata::Input;
use regex_syntax::ast::{self, Ast};
use regex_syntax::hir::{Hir, HirKind};
use serde_json::Value;

use super::dfa::Automaton;
use super::scan::{Known, Pattern};
use super::Unsupported;

/// What a split does with the matches of its pattern.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Behavior {
    Removed,
    Isolated,
    MergedWithPrevious,
    MergedWithNext,
    Contiguous,
}

/// How a split finds its matches.
#[derive(Debug)]
pub(crate) enum Matcher {
    /// Every character of the class is a match of its own.
    Char(CharClass),
    /// A pattern the scanners run.
    Known(Known),
    /// A pattern the regex crate's engine runs with onig's meaning (or
    /// HF's own regex-crate pattern); each worker's search cache is its
    /// own ([`Level`]), not taken from the regex's shared pool per piece.
    Regex(Regex),
    /// Any other pattern, on a lazy DFA with onig's meaning.
    Dfa(Automaton),
}

/// One pre-tokenizer step.
#[derive(Debug)]
pub(crate) enum Step {
    Split {
        matcher: Matcher,
        behavior: Behavior,
        invert: bool,
    },
    ByteLevel {
        prefix_space: bool,
        regex: bool,
    },
    /// SentencePiece's word marks: spaces become `replacement`, which is
    /// put before a text that does not start with it as `prepend` says,
    /// and with `split` each mark starts a piece.
    Metaspace {
        replacement: char,
        prepend: Prepend,
        split: bool,
    },
    /// HF's `BertPreTokenizer`: `WhitespaceSplit` then `Punctuation`
    /// (isolated), in one pass ([`super::bert::words`]).
    Bert,
}

/// When `Metaspace` puts its mark before a text.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Prepend {
    Always,
    /// Only before the text that starts where the whole text does.
    First,
    Never,
}

/// A whole pre-tokenizer as steps: for byte-level BPE, exactly one of
/// them is `ByteLevel`; for the other models, none.
#[derive(Debug)]
pub(crate) struct Steps(pub Vec<Step>);

/// A class of characters, with its members below U+0800 (one or two
/// UTF-8 bytes: ASCII, and every character of the byte-level alphabet) in
/// a table.
#[derive(Debug)]
pub(crate) struct CharClass {
    low: Box<[bool; 0x800]>,
    is: fn(char) -> bool,
}

impl CharClass {
    fn new(is: fn(char) -> bool) -> CharClass {
        CharClass {
            low: Box::new(std::array::from_fn(|cp| {
                char::from_u32(cp as u32).is_some_and(is)
            })),
            is,
        }
    }

    #[inline(always)]
    fn contains(&self, c: char) -> bool {
        match self.low.get(c as usize) {
            Some(&is) => is,
            None => (self.is)(c),
        }
    }
}

/// HF's `Punctuation` test: ASCII punctuation or Unicode's P categories.
fn is_punc(c: char) -> bool {
    use unicode_categories::UnicodeCategories;
    /// The answer for each character below U+10000, one bit each (the
    /// categories' table is a binary search per character).
    static BMP: std::sync::LazyLock<Box<[u64; 1024]>> = std::sync::LazyLock::new(|| {
        let mut bits = Box::new([0u64; 1024]);
        for (cp, c) in (0..0x10000u32).filter_map(|cp| Some((cp, char::from_u32(cp)?))) {
            if c.is_ascii_punctuation() || c.is_punctuation() {
                bits[cp as usize / 64] |= 1 << (cp % 64);
            }
        }
        bits
    });
    match c as u32 {
        cp @ 0..0x10000 => BMP[cp as usize / 64] >> (cp % 64) & 1 == 1,
        _ => c.is_punctuation(),
    }
}

/// In words, for a run's summary: each step, in order.
impl std::fmt::Display for Steps {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.0.is_empty() {
            return write!(f, "no pre-tokenizer");
        }
        let step = |s: &Step| match s {
            Step::Split { matcher, .. } => match matcher {
                Matcher::Known(Known::Whole(p)) => p.to_string(),
                Matcher::Known(Known::Digits3) => "DeepSeek V3's digit split".into(),
                Matcher::Known(Known::Cjk) => "DeepSeek V3's CJK split".into(),
                Matcher::Known(Known::DeepSeek) => "DeepSeek V3's split pattern".into(),
                Matcher::Char(_) => "a split on a class of characters".into(),
                Matcher::Regex(_) | Matcher::Dfa(_) => "a split on a pattern".into(),
            },
            Step::ByteLevel { regex: true, .. } => "byte-level with GPT-2's split pattern".into(),
            Step::ByteLevel { regex: false, .. } => "byte-level".into(),
            Step::Metaspace { replacement, .. } => format!("Metaspace ({replacement})"),
            Step::Bert => "BERT's words".into(),
        };
        let steps: Vec<String> = self.0.iter().map(step).collect();
        write!(f, "pre-tokenizer: {}", steps.join(", then "))
    }
}

impl Steps {
    /// Reads a pre-tokenizer, or says which part the engine cannot run.
    pub(crate) fn from_json(p: &Value) -> Result<Steps, Unsupported> {
        let mut steps = Vec::new();
        if !p.is_null() {
            push_steps(p, &mut steps)?;
        }
        Ok(Steps(steps))
    }

    /// Whether there is a `ByteLevel` step (the model is then byte-level).
    pub(crate) fn byte_level(&self) -> bool {
        self.0.iter().any(|s| matches!(s, Step::ByteLevel { .. }))
    }

    /// These steps, for a byte-level model: one `ByteLevel` and no
    /// `Metaspace`.
    pub(crate) fn checked_byte_level(self) -> Result<Steps, Unsupported> {
        let count = |is: fn(&Step) -> bool| self.0.iter().filter(|s| is(s)).count();
        let byte_levels = count(|s| matches!(s, Step::ByteLevel { .. }));
        if byte_levels != 1 {
            return Err(Unsupported(format!(
                "pre-tokenizer: {byte_levels} ByteLevel steps (byte-level BPE needs one)"
            )));
        }
        if count(|s| matches!(s, Step::Metaspace { .. })) > 0 {
            return Err(Unsupported(
                "pre-tokenizer: Metaspace beside ByteLevel".into(),
            ));
        }
        Ok(self)
    }

    /// Calls `word` with each pre-token of `text` for a model that is not
    /// byte-level (there is no `ByteLevel` step); `first` says whether
    /// `text` starts where the whole text does.
    pub(crate) fn run_words(
        &self,
        text: &str,
        first: bool,
        scratch: &mut Scratch,
        word: &mut dyn FnMut(&str),
    ) {
        if let [Step::Bert] = &self.0[..] {
            return super::bert::words(text, word);
        }
        self.walk(0, text, first, scratch.levels(self.0.len()), word)
    }

    /// Runs steps `k..` over `text` depth first, calling `leaf` with each
    /// piece the last step makes, in order: what HF gets running each step
    /// over every piece of the one before. Each step's cuts and rewritten
    /// text live in `levels[0]` (step `k`'s own; the deeper steps' follow),
    /// reused from piece to piece, so nothing is allocated or moved per
    /// piece once the buffers have grown.
    fn walk(
        &self,
        k: usize,
        text: &str,
        at_start: bool,
        levels: &mut [Level],
        leaf: &mut dyn FnMut(&str),
    ) {
        let (Some(step), [level, deeper @ ..]) = (self.0.get(k), levels) else {
            return leaf(text);
        };
        level.cuts.clear();
        // Whether the pieces are cut from `level.text` (the step rewrote
        // the text) rather than from `text`.
        let mut rewritten = false;
        match step {
            Step::Metaspace {
                replacement,
                prepend,
                split,
            } => {
                rewritten = true;
                let put = match prepend {
                    Prepend::Always => true,
                    Prepend::First => at_start,
                    Prepend::Never => false,
                };
                let mark = *replacement;
                let marked = &mut level.text;
                marked.clear();
                if put && !text.starts_with(' ') && !text.starts_with(mark) {
                    marked.push(mark);
                }
                // A byte loop: spaces are frequent, and a search started
                // per space costs more than the bytes between.
                let mut last = 0;
                for (i, &b) in text.as_bytes().iter().enumerate() {
                    if b == b' ' {
                        marked.push_str(&text[last..i]);
                        marked.push(mark);
                        last = i + 1;
                    }
                }
                marked.push_str(&text[last..]);
                if *split {
                    let mut start = 0;
                    for (i, _) in marked.match_indices(mark) {
                        if i > start {
                            level.cuts.push((start, i));
                        }
                        start = i;
                    }
                    if start < marked.len() {
                        level.cuts.push((start, marked.len()));
                    }
                } else {
                    level.cuts.push((0, marked.len()));
                }
            }
            Step::ByteLevel {
                prefix_space,
                regex,
            } => {
                rewritten = true;
                let Level {
                    text: out,
                    spaced,
                    cuts,
                    ..
                } = level;
                out.clear();
                let source = if *prefix_space && !text.starts_with(' ') {
                    spaced.clear();
                    spaced.push(' ');
                    spaced.push_str(text);
                    &spaced[..]
                } else {
                    text
                };
                let mut push = |s: &str| {
                    let start = out.len();
                    out.extend(s.bytes().map(|b| BYTE_CHARS[b as usize]));
                    cuts.push((start, out.len()));
                };
                if *regex {
                    Pattern::Gpt2 { fold: false }.split(source, &mut push);
                } else {
                    push(source);
                }
            }
            Step::Bert => {
                let base = text.as_ptr() as usize;
                let cuts = &mut level.cuts;
                super::bert::words(text, &mut |s| {
                    let start = s.as_ptr() as usize - base;
                    cuts.push((start, start + s.len()));
                })
            }
            Step::Split {
                matcher,
                behavior,
                invert,
            } => split_into(text, matcher, *behavior, *invert, level),
        }
        for &(a, b) in level.cuts.iter().filter(|(a, b)| a < b) {
            let source = if rewritten { &level.text[..] } else { text };
            self.walk(k + 1, &source[a..b], at_start && a == 0, deeper, leaf);
        }
    }

    /// The one scanner that does the work of all the steps, with whether a
    /// space is prepended to the text first, where there is one.
    pub(crate) fn scanner(&self) -> Option<(Pattern, bool)> {
        let isolates = |s: &Step| match s {
            Step::Split {
                matcher: Matcher::Known(k),
                behavior,
                invert,
            } => {
                let isolated = *behavior == Behavior::Isolated && !*invert;
                // Where every character starts a match there are no gaps:
                // inverted, every part is a non-match, and `Removed` keeps
                // them all; `Isolated` ignores what is a match.
                let same = k.covers()
                    && (*behavior == Behavior::Isolated
                        || *behavior == Behavior::Removed && *invert);
                (isolated || same).then_some(*k)
            }
            _ => None,
        };
        match &self.0[..] {
            [Step::ByteLevel {
                prefix_space,
                regex: true,
            }] => Some((Pattern::Gpt2 { fold: false }, *prefix_space)),
            [split, Step::ByteLevel {
                prefix_space: false,
                regex: false,
            }] => Some((isolates(split)?.pattern()?, false)),
            [a, b, c, Step::ByteLevel {
                prefix_space: false,
                regex: false,
            }] => (isolates(a)? == Known::Digits3
                && isolates(b)? == Known::Cjk
                && isolates(c)? == Known::DeepSeek)
                .then_some((Pattern::DeepSeek, false)),
            _ => None,
        }
    }

    /// Calls `piece` with the bytes of each pre-token of `text`, in order,
    /// for a byte-level model.
    pub(crate) fn run(&self, text: &str, scratch: &mut Scratch, piece: &mut dyn FnMut(&[u8])) {
        let mut bytes = std::mem::take(&mut scratch.bytes);
        let levels = scratch.levels(self.0.len());
        self.walk(0, text, true, levels, &mut |p| {
            bytes.clear();
            bytes.extend(p.chars().map(from_byte_char));
            piece(&bytes)
        });
        scratch.bytes = bytes;
    }
}

/// One worker's buffers for running [`Steps`]; nothing in them changes
/// what the steps make.
#[derive(Default)]
pub(crate) struct Scratch {
    /// By step.
    levels: Vec<Level>,
    /// A byte-level piece as bytes.
    bytes: Vec<u8>,
}

impl Scratch {
    /// A level for each of `steps` steps.
    fn levels(&mut self, steps: usize) -> &mut [Level] {
        if self.levels.len() < steps {
            self.levels.resize_with(steps, Level::default);
        }
        &mut self.levels[..steps]
    }
}

/// One step's buffers.
#[derive(Default)]
struct Level {
    /// The text as the step rewrote it (`Metaspace`, `ByteLevel`).
    text: String,
    /// The text with a space put before it (`ByteLevel`).
    spaced: String,
    /// The pieces the step made, as byte ranges of the text it cut.
    cuts: Vec<(usize, usize)>,
    /// A split's matches and gaps.
    parts: Vec<(usize, usize, bool)>,
    /// A `Regex` split's search cache.
    regex: Option<RegexCache>,
}

fn push_steps(p: &Value, steps: &mut Vec<Step>) -> Result<(), Unsupported> {
    let unsupported = |what: String| Err(Unsupported(format!("pre-tokenizer: {what}")));
    let behavior = |v: &Value, default: Behavior| match v.as_str() {
        None => Some(default),
        Some("Removed") => Some(Behavior::Removed),
        Some("Isolated") => Some(Behavior::Isolated),
        Some("MergedWithPrevious") => Some(Behavior::MergedWithPrevious),
        Some("MergedWithNext") => Some(Behavior::MergedWithNext),
        Some("Contiguous") => Some(Behavior::Contiguous),
        Some(_) => None,
    };
    let step = match p["type"].as_str() {
        Some("Sequence") => {
            for s in p["pretokenizers"].as_array().map_or(&[][..], Vec::as_slice) {
                push_steps(s, steps)?;
            }
            return Ok(());
        }
        Some("Metaspace") => {
            let replacement = p["replacement"].as_str().unwrap_or("\u{2581}");
            let mut chars = replacement.chars();
            let (Some(replacement), None) = (chars.next(), chars.next()) else {
                return unsupported(format!("Metaspace replacement {replacement:?}"));
            };
            // Files older than `prepend_scheme` say `add_prefix_space`.
            let prepend = match (
                p["prepend_scheme"].as_str(),
                p["add_prefix_space"].as_bool(),
            ) {
                (Some("always"), _) | (None, Some(true) | None) => Prepend::Always,
                (Some("first"), _) => Prepend::First,
                (Some("never"), _) | (None, Some(false)) => Prepend::Never,
                (Some(other), _) => {
                    return unsupported(format!("Metaspace prepend_scheme {other}"))
                }
            };
            Step::Metaspace {
                replacement,
                prepend,
                split: p["split"].as_bool().unwrap_or(true),
            }
        }
        Some("ByteLevel") => Step::ByteLevel {
            prefix_space: p["add_prefix_space"].as_bool().unwrap_or(true),
            regex: p["use_regex"].as_bool().unwrap_or(true),
        },
        Some("Split") => {
            let Some(behavior) = behavior(&p["behavior"], Behavior::Isolated) else {
                return unsupported(format!("Split behavior {}", p["behavior"]));
            };
            let matcher = match (
                p["pattern"]["Regex"].as_str(),
                p["pattern"]["String"].as_str(),
            ) {
                (Some(re), _) => recognise(re)?,
                (None, Some(s)) if !s.is_empty() => Matcher::Regex(
                    Regex::new(&regex::escape(s)).expect("an escaped string is a regex"),
                ),
                _ => return unsupported(format!("Split pattern {}", p["pattern"])),
            };
            Step::Split {
                matcher,
                behavior,
                invert: p["invert"].as_bool().unwrap_or(false),
            }
        }
        Some("Digits") => Step::Split {
            matcher: Matcher::Char(CharClass::new(char::is_numeric)),
            behavior: if p["individual_digits"] == true {
                Behavior::Isolated
            } else {
                Behavior::Contiguous
            },
            invert: false,
        },
        Some("Punctuation") => {
            let Some(behavior) = behavior(&p["behavior"], Behavior::Isolated) else {
                return unsupported(format!("Punctuation behavior {}", p["behavior"]));
            };
            Step::Split {
                matcher: Matcher::Char(CharClass::new(is_punc)),
                behavior,
                invert: false,
            }
        }
        Some("BertPreTokenizer") => Step::Bert,
        Some("WhitespaceSplit") => Step::Split {
            matcher: Matcher::Char(CharClass::new(char::is_whitespace)),
            behavior: Behavior::Removed,
            invert: false,
        },
        // HF runs this one with the regex crate, so the same crate is exact.
        Some("Whitespace") => Step::Split {
            matcher: Matcher::Regex(Regex::new(r"\w+|[^\w\s]+").expect("a valid regex")),
            behavior: Behavior::Removed,
            invert: true,
        },
        _ => return unsupported(format!("{} is not supported", p["type"])),
    };
    steps.push(step);
    Ok(())
}

/// Cuts `text` as HF's `NormalizedString::split` does, into `cuts`: the
/// byte range of each part kept, in order, after those already there
/// (empty parts are kept: the caller drops them).
///
/// One piece (about 120 lines) on purpose: the hot loop of every Split
/// pre-tokenizer. Each matcher's arm fills the same `parts` in place, then
/// one pass applies `behavior`, as HF's `find_matches` then `split` do.
fn split_into(text: &str, matcher: &Matcher, behavior: Behavior, invert: bool, level: &mut Level) {
    let Level {
        parts,
        cuts,
        regex: cache,
        ..
    } = level;
    // (start, end, is a match) covering the text, as HF's `find_matches`.
    parts.clear();
    let push_match = |parts: &mut Vec<(usize, usize, bool)>, gap: usize, start, end| {
        if gap < start {
            parts.push((gap, start, false));
        }
        parts.push((start, end, true));
    };
    let mut gap = 0;
    match matcher {
        Matcher::Char(class) => {
            let bytes = text.as_bytes();
            let mut i = 0;
            while i < bytes.len() {
                let b = bytes[i];
                let (is, len) = if b < 0x80 {
                    (class.low[b as usize], 1)
                } else {
                    let c = text[i..].chars().next().expect("a character at a boundary");
                    (class.contains(c), c.len_utf8())
                };
                if is {
                    push_match(parts, gap, i, i + len);
                    gap = i + len;
                }
                i += len;
            }
        }
        Matcher::Known(k) => {
            let mut i = 0;
            while i < text.len() {
                match k.match_at(text, i) {
                    Some(end) => {
                        push_match(parts, gap, i, end);
                        gap = end;
                        i = end;
                    }
                    None => i += text[i..].chars().next().map_or(1, char::len_utf8),
                }
            }
        }
        Matcher::Regex(re) => {
            let cache = cache.get_or_insert_with(|| re.create_cache());
            let mut at = 0;
            while at < text.len() {
                let input = Input::new(text).range(at..);
                let Some(m) = re.search_with(cache, &input) else {
                    break;
                };
                push_match(parts, gap, m.start(), m.end());
                gap = m.end();
                // No pattern here matches the empty string (refused).
                at = m.end().max(at + 1);
                while !text.is_char_boundary(at) {
                    at += 1;
                }
            }
        }
        Matcher::Dfa(automaton) => automaton.find_iter(text, &mut |start, end| {
            push_match(parts, gap, start, end);
            gap = end;
        }),
    }
    if gap < text.len() {
        parts.push((gap, text.len(), false));
    }
    // A part is kept unless it is a match (a gap, inverted) that
    // `Removed` drops; the merging behaviors join a match to its neighbour.
    let first = cuts.len();
    let mut previous = false;
    match behavior {
        Behavior::Isolated => cuts.extend(parts.iter().map(|&(a, b, _)| (a, b))),
        Behavior::Removed => cuts.extend(
            parts
                .iter()
                .filter(|&&(_, _, is_match)| is_match == invert)
                .map(|&(a, b, _)| (a, b)),
        ),
        Behavior::Contiguous => {
            for &(a, b, is_match) in parts.iter() {
                let is_match = is_match != invert;
                match cuts[first..].last_mut() {
                    Some(last) if is_match == previous => last.1 = b,
                    _ => cuts.push((a, b)),
                }
                previous = is_match;
            }
        }
        Behavior::MergedWithPrevious => {
            for &(a, b, is_match) in parts.iter() {
                let is_match = is_match != invert;
                match cuts[first..].last_mut() {
                    Some(last) if is_match && !previous => last.1 = b,
                    _ => cuts.push((a, b)),
                }
                previous = is_match;
            }
        }
        Behavior::MergedWithNext => {
            for &(a, b, is_match) in parts.iter().rev() {
                let is_match = is_match != invert;
                match cuts[first..].last_mut() {
                    Some(last) if is_match && !previous => last.0 = a,
                    _ => cuts.push((a, b)),
                }
                previous = is_match;
            }
            cuts[first..].reverse();
        }
    }
}

/// Each byte as GPT-2's byte-level character.
static BYTE_CHARS: std::sync::LazyLock<[char; 256]> = std::sync::LazyLock::new(super::byte_chars);

/// The byte a byte-level character stands for.
fn from_byte_char(c: char) -> u8 {
    /// By code point: every byte-level character is below U+0144.
    static BYTES: std::sync::LazyLock<[u8; 0x144]> = std::sync::LazyLock::new(|| {
        let mut bytes = [0; 0x144];
        for (b, &c) in BYTE_CHARS.iter().enumerate() {
            bytes[c as usize] = b as u8;
        }
        bytes
    });
    BYTES[c as usize]
}

/// How a split pattern runs: a scanner when it means what a known pattern
/// means, the regex crate when its meaning does not depend on the engine,
/// otherwise a lazy DFA with onig's meaning; where none runs it exactly, the
/// construct that stops it is named.
pub(crate) fn recognise(pattern: &str) -> Result<Matcher, Unsupported> {
    if let Some(known) = known_meaning(pattern) {
        return Ok(Matcher::Known(known));
    }
    let refuse = |why: String| Err(Unsupported(format!("split pattern {pattern:?}: {why}")));
    // What regex-syntax does not parse (lookaheads) the DFA may still run.
    let Ok(ast) = ast::parse::Parser::new().parse(pattern) else {
        return Automaton::new(pattern).map(Matcher::Dfa).or_else(refuse);
    };
    if engine_free(&ast).is_err() {
        return Automaton::new(pattern).map(Matcher::Dfa).or_else(refuse);
    }
    let hir = match regex_syntax::parse(pattern) {
        Ok(hir) => hir,
        Err(e) => return refuse(e.to_string()),
    };
    if hir.properties().minimum_len() == Some(0) {
        return refuse("it can match the empty string".into());
    }
    match Regex::new(pattern) {
        Ok(re) => Ok(Matcher::Regex(re)),
        Err(e) => refuse(e.to_string()),
    }
}

/// Whether `ast` means the same under onig and the regex crate: literals,
/// classes of literal characters and ranges, groups without flags,
/// alternation and repetition. Both engines then report the same leftmost
/// match, preferring earlier alternatives and greedy repeats (the regex
/// crate's leftmost-first semantics are a backtracking engine's). Property
/// and Perl classes (their tables differ), anchors (onig's `^` and `$` see
/// lines), flags and set operations are not.
fn engine_free(ast: &Ast) -> Result<(), String> {
    match ast {
        Ast::Empty(_) | Ast::Literal(_) | Ast::Dot(_) => Ok(()),
        Ast::Flags(f) => Err(format!("the flags {:?}", f.flags.items)),
        Ast::ClassUnicode(_) => Err("a Unicode property class".into()),
        Ast::ClassPerl(_) => Err(r"a Perl class (\s, \d, \w)".into()),
        Ast::Assertion(_) => Err("an anchor or word boundary".into()),
        Ast::ClassBracketed(c) => class_free(&c.kind),
        Ast::Repetition(r) => engine_free(&r.ast),
        Ast::Group(g) => match &g.kind {
            ast::GroupKind::NonCapturing(flags) if !flags.items.is_empty() => {
                Err(format!("a group with flags {:?}", flags.items))
            }
            _ => engine_free(&g.ast),
        },
        Ast::Alternation(a) => a.asts.iter().try_for_each(engine_free),
        Ast::Concat(c) => c.asts.iter().try_for_each(engine_free),
    }
}

fn class_free(set: &ast::ClassSet) -> Result<(), String> {
    match set {
        ast::ClassSet::BinaryOp(_) => Err("a class set operation".into()),
        ast::ClassSet::Item(item) => item_free(item),
    }
}

fn item_free(item: &ast::ClassSetItem) -> Result<(), String> {
    match item {
        ast::ClassSetItem::Empty(_)
        | ast::ClassSetItem::Literal(_)
        | ast::ClassSetItem::Range(_) => Ok(()),
        ast::ClassSetItem::Ascii(_) => Err("a POSIX class".into()),
        ast::ClassSetItem::Unicode(_) => Err("a Unicode property class".into()),
        ast::ClassSetItem::Perl(_) => Err(r"a Perl class (\s, \d, \w)".into()),
        ast::ClassSetItem::Bracketed(b) => class_free(&b.kind),
        ast::ClassSetItem::Union(u) => u.items.iter().try_for_each(item_free),
    }
}

/// The lookahead the known patterns use, which regex-syntax does not parse:
/// it stands in as a character no pattern uses before comparing.
const LOOKAHEAD: &str = r"(?!\S)";
const STAND_IN: char = '\u{10FFFD}';

/// The known pattern `pattern` means, compared as parsed structures: the
/// same classes however spelled (`\p{L}`, `\p{Letter}`, `\pL`), characters
/// escaped or not, groups capturing or not, `(?i:s)` or `[sSſ]`.
fn known_meaning(pattern: &str) -> Option<Known> {
    /// Each known pattern's text and structure, made once.
    static KNOWN: OnceLock<Vec<(Known, String, Option<Hir>)>> = OnceLock::new();
    let known = KNOWN.get_or_init(|| {
        Known::all()
            .map(|(k, text)| {
                let parsed = structure(&text);
                (k, text, parsed)
            })
            .collect()
    });
    let canonical = pattern.replace('\r', r"\r").replace('\n', r"\n");
    if let Some((k, _, _)) = known.iter().find(|(_, text, _)| *text == canonical) {
        return Some(*k);
    }
    let parsed = structure(pattern)?;
    known
        .iter()
        .find(|(_, _, s)| s.as_ref() == Some(&parsed))
        .map(|(k, _, _)| *k)
}

/// A pattern's structure with captures removed, or `None` where it does not
/// parse (or uses the stand-in character itself).
fn structure(pattern: &str) -> Option<Hir> {
    if pattern.contains(STAND_IN) || short_property(pattern) {
        return None;
    }
    let text = pattern.replace(LOOKAHEAD, &STAND_IN.to_string());
    regex_syntax::parse(&text)
        .ok()
        .map(|h| without_captures(&h))
}

/// Whether the pattern writes a property without braces (`\pL`): a class
/// to regex-syntax, the letters `pL` to onig.
fn short_property(pattern: &str) -> bool {
    let mut chars = pattern.chars();
    while let Some(c) = chars.next() {
        if c == '\\' {
            match chars.next() {
                Some('p' | 'P') if chars.clone().next() != Some('{') => return true,
                _ => {}
            }
        }
    }
    false
}

fn without_captures(h: &Hir) -> Hir {
    match h.kind() {
        HirKind::Capture(c) => without_captures(&c.sub),
        HirKind::Concat(xs) => Hir::concat(xs.iter().map(without_captures).collect()),
        HirKind::Alternation(xs) => Hir::alternation(xs.iter().map(without_captures).collect()),
        HirKind::Repetition(r) => Hir::repetition(regex_syntax::hir::Repetition {
            sub: Box::new(without_captures(&r.sub)),
            ..r.clone()
        }),
        _ => h.clone(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spellings_of_known_patterns_are_recognised() {
        let cases = [
            (
                r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{Letter}+| ?\p{Number}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+",
                Known::Whole(Pattern::Gpt2 { fold: false }),
            ),
            (
                r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+",
                Known::Whole(Pattern::Gpt2 { fold: false }),
            ),
            (
                r"(?i:'s|'t|'re|'ve|'m|'ll|'d)| ?\p{Letter}+| ?\p{Number}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+",
                Known::Whole(Pattern::Gpt2 { fold: true }),
            ),
            // Qwen2, 2.5 and 3, as their files spell it, and respelled.
            (
                r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+",
                Known::Whole(Pattern::Cl100k { numbers: 1 }),
            ),
            (
                r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{Letter}\p{Number}]?\p{Letter}+|\p{Number}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+",
                Known::Whole(Pattern::Cl100k { numbers: 1 }),
            ),
            (
                r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{Letter}\p{Number}]?\p{Letter}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+",
                Known::Whole(Pattern::Cl100k { numbers: 3 }),
            ),
            (
                "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\r\n]*|\\s*[\r\n]+|\\s+(?!\\S)|\\s+",
                Known::Whole(Pattern::Cl100k { numbers: 3 }),
            ),
            (r"(\p{N}{1,3})", Known::Digits3),
        ];
        for (text, want) in cases {
            assert!(
                matches!(recognise(text), Ok(Matcher::Known(k)) if k == want),
                "{text}"
            );
        }
    }

    /// onig reads `\pN` as the letters `pN`, regex-syntax as `\p{N}`: the
    /// same structure to one is another pattern to the other.
    #[test]
    fn short_property_escape_is_not_taken_for_a_class() {
        let text = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\pN+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+";
        assert!(recognise(text).is_err());
        let onig = onig::Regex::new(r"\pN+").unwrap();
        assert_eq!(onig.find("12 pN"), Some((3, 5)));
    }

    /// Patterns whose meaning depends on the engine run on the lazy DFA
    /// with onig's meaning; those free of it still on the regex crate.
    #[test]
    fn patterns_whose_meaning_depends_on_the_engine_run_on_the_dfa() {
        for text in [
            r"\w+",
            r"^a",
            r"(?i)abc",
            r"\p{L}+",
            r"[[:alpha:]]",
            r"\s+(?!\S)|x",
        ] {
            assert!(
                matches!(recognise(text), Ok(Matcher::Dfa(_))),
                "{text}: {:?}",
                recognise(text)
            );
        }
        for text in ["[0-9][0-9][0-9]", "[一-龥]+|abc", r"\.\.\.|x+"] {
            assert!(matches!(recognise(text), Ok(Matcher::Regex(_))), "{text}");
        }
        for text in [r"a*", r"(a)\1", r"(?<=a)b", r"\w*"] {
            assert!(recognise(text).is_err(), "{text}");
        }
    }
}
