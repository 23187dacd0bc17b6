//! Any split (or `Replace`) pattern HF accepts, run with Oniguruma's meaning
//! on a lazy DFA instead of a backtracking engine.
//!
//! HF compiles these patterns with onig and reports its matches left to
//! right. A backtracking engine's match at a position is the first
//! alternative that matches there, with greedy and lazy repeats tried in
//! their order; for a pattern with no lookaround and no backreference that is
//! exactly what a DFA with leftmost-first semantics reports when anchored at
//! that position. So a pattern is parsed (regex-syntax's parser), translated
//! to a `Hir` by hand with every class replaced by the set onig itself gives
//! it, and run on regex-automata's hybrid DFA at each position in turn.
//!
//! - **Classes** (`\p{..}`, `\s \d \w`, POSIX, brackets with `&&`, `.`) and
//!   letters under `(?i)` are asked of onig: the class's own text is run
//!   over a string of every code point, and the runs it matches are the set.
//!   So a class means here what it means to onig, at onig's Unicode version.
//! - **Lookahead** is taken where the patterns in the wild put it: closing a
//!   top-level alternative as `X+(?!Y)` / `X*(?=Y)` (any repeat, greedy) with
//!   `X` and `Y` single classes. The alternatives before and after it run as
//!   DFAs, in order; that one is computed by scanning: the longest run of
//!   `X`, backed off one character at a time while the lookahead fails.
//! - **Anchors** `^ $` are onig's line anchors (`\n`), `\A \z` the text's.
//! - Everything else that differs, or that no DFA can run exactly, is
//!   refused with the construct named: backreferences, lookbehind, other
//!   lookaheads, atomic groups, possessive repeats, word boundaries, onig's
//!   isolated flags inside an alternative, flags other than `i`,
//!   `(?i)` text onig may match with a multi-character case fold (`ss` and
//!   `ß`), and patterns that can match the empty string.

use std::collections::HashMap;
use std::panic::{RefUnwindSafe, UnwindSafe};
use std::sync::{Arc, LazyLock, Mutex};

use regex_automata::hybrid::dfa::{Cache, DFA};
use regex_automata::nfa::thompson::{self, WhichCaptures};
use regex_automata::util::pool::Pool;
use regex_automata::{Anchored, Input, MatchKind};
use regex_syntax::ast::{self, Ast};
use regex_syntax::hir::{self, ClassUnicode, ClassUnicodeRange, Hir, Look};

/// A pattern compiled to run with onig's meaning.
pub(crate) struct Automaton {
    /// The top-level alternatives, in order, grouped: runs of plain ones
    /// share one DFA, each lookahead one is scanned.
    segments: Vec<Segment>,
    /// One cache per DFA segment, per thread.
    caches: Pool<Vec<Cache>, CacheMaker>,
}

type CacheMaker = Box<dyn Fn() -> Vec<Cache> + Send + Sync + UnwindSafe + RefUnwindSafe>;

impl std::fmt::Debug for Automaton {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Automaton({} segments)", self.segments.len())
    }
}

enum Segment {
    /// Alternatives with no lookaround, leftmost-first, anchored; the index
    /// of its cache.
    Dfa(Box<DFA>, usize),
    /// `X{min,max}` then a lookahead on one character.
    Ahead(Ahead),
}

struct Ahead {
    repeated: Set,
    min: usize,
    max: Option<usize>,
    next: Set,
    /// `(?!Y)` rather than `(?=Y)`.
    negative: bool,
}

/// A set of characters: a bitmap for ASCII, sorted ranges for the rest.
#[derive(Clone)]
struct Set {
    ascii: u128,
    ranges: Vec<(u32, u32)>,
}

impl Set {
    fn new(class: &ClassUnicode) -> Set {
        let ranges: Vec<(u32, u32)> = class
            .ranges()
            .iter()
            .map(|r| (r.start() as u32, r.end() as u32))
            .collect();
        let ascii = (0..128u32)
            .filter(|&b| ranges.iter().any(|&(a, z)| a <= b && b <= z))
            .fold(0u128, |bits, b| bits | 1 << b);
        Set { ascii, ranges }
    }

    #[inline]
    fn contains(&self, c: char) -> bool {
        let cp = c as u32;
        if cp < 128 {
            return self.ascii >> cp & 1 != 0;
        }
        self.ranges
            .binary_search_by(|&(a, b)| {
                if b < cp {
                    std::cmp::Ordering::Less
                } else if a > cp {
                    std::cmp::Ordering::Greater
                } else {
                    std::cmp::Ordering::Equal
                }
            })
            .is_ok()
    }
}

impl Ahead {
    /// The end of this alternative's match at `i`, as a backtracking engine
    /// finds it.
    fn match_at(&self, text: &str, i: usize) -> Option<usize> {
        let mut end = i;
        let mut n = 0;
        for c in text[i..].chars() {
            if self.max == Some(n) || !self.repeated.contains(c) {
                break;
            }
            end += c.len_utf8();
            n += 1;
        }
        loop {
            if n < self.min {
                return None;
            }
            let ok = match text[end..].chars().next() {
                Some(c) => self.next.contains(c) != self.negative,
                None => self.negative,
            };
            if ok {
                return Some(end);
            }
            if n == 0 {
                return None;
            }
            end -= 1;
            while !text.is_char_boundary(end) {
                end -= 1;
            }
            n -= 1;
        }
    }
}

impl Automaton {
    /// Compiles `pattern`, or says which construct stops it.
    pub(crate) fn new(pattern: &str) -> Result<Automaton, String> {
        let (text, lookaheads) = stand_ins(pattern)?;
        let ast = ast::parse::ParserBuilder::new()
            .build()
            .parse(&text)
            .map_err(|e| format!("{} (not a pattern prep can parse)", e.kind()))?;
        let t = Translator {
            text: &text,
            lookaheads,
        };
        let mut segments = Vec::new();
        let mut plain: Vec<Hir> = Vec::new();
        let mut dfas = Vec::new();
        let flush = |plain: &mut Vec<Hir>, segments: &mut Vec<Segment>, dfas: &mut Vec<DFA>| {
            if plain.is_empty() {
                return Ok::<(), String>(());
            }
            let dfa = compile(alternation(std::mem::take(plain)))?;
            segments.push(Segment::Dfa(Box::new(dfa.clone()), dfas.len()));
            dfas.push(dfa);
            Ok(())
        };
        for (items, fold) in branches(&ast, false)? {
            match t.lookahead_branch(items, fold)? {
                Some(ahead) => {
                    flush(&mut plain, &mut segments, &mut dfas)?;
                    segments.push(Segment::Ahead(ahead));
                }
                None => {
                    let h = t.concat(items, fold)?;
                    if h.properties().minimum_len() == Some(0) {
                        return Err("it can match the empty string".into());
                    }
                    plain.push(h);
                }
            }
        }
        flush(&mut plain, &mut segments, &mut dfas)?;
        let caches: CacheMaker = Box::new(move || dfas.iter().map(DFA::create_cache).collect());
        Ok(Automaton {
            segments,
            caches: Pool::new(caches),
        })
    }

    /// Calls `each(start, end)` for every match, left to right and not
    /// overlapping, as onig's `find_iter` reports them (no match is empty).
    pub(crate) fn find_iter(&self, text: &str, each: &mut dyn FnMut(usize, usize)) {
        let mut caches = self.caches.get();
        let mut i = 0;
        while i < text.len() {
            match self.match_at(text, i, &mut caches) {
                Some(end) => {
                    each(i, end);
                    i = end;
                }
                None => i += text[i..].chars().next().map_or(1, char::len_utf8),
            }
        }
    }

    #[inline]
    fn match_at(&self, text: &str, i: usize, caches: &mut [Cache]) -> Option<usize> {
        for segment in &self.segments {
            let end = match segment {
                Segment::Dfa(dfa, k) => {
                    let input = Input::new(text).range(i..).anchored(Anchored::Yes);
                    dfa.try_search_fwd(&mut caches[*k], &input)
                        // No quit bytes (word boundaries are refused) and no
                        // limit on cache clears: the search cannot give up.
                        .expect("the lazy DFA has no way to give up")
                        .map(|m| m.offset())
                }
                Segment::Ahead(a) => a.match_at(text, i),
            };
            if end.is_some() {
                return end;
            }
        }
        None
    }
}

/// An alternation that keeps its branches as written. `Hir::alternation`
/// lifts a prefix its branches share (`\s*A|\s*B` becomes `\s*(?:A|B)`),
/// which changes what a backtracking engine reports: on "  a1", onig takes
/// `\s*\W\s` as "  " where the lifted form gives "  a1". Each branch goes in
/// a group of its own, which the lifting does not look into (the NFA keeps
/// no captures).
fn alternation(branches: Vec<Hir>) -> Hir {
    Hir::alternation(
        branches
            .into_iter()
            .enumerate()
            .map(|(i, sub)| {
                Hir::capture(regex_syntax::hir::Capture {
                    index: i as u32 + 1,
                    name: None,
                    sub: Box::new(sub),
                })
            })
            .collect(),
    )
}

fn compile(hir: Hir) -> Result<DFA, String> {
    let nfa = thompson::Compiler::new()
        .configure(
            thompson::Config::new()
                .which_captures(WhichCaptures::None)
                .shrink(false),
        )
        .build_from_hir(&hir)
        .map_err(|e| e.to_string())?;
    DFA::builder()
        .configure(DFA::config().match_kind(MatchKind::LeftmostFirst))
        .build_from_nfa(nfa)
        .map_err(|e| e.to_string())
}

/// The first of the private-use characters that stand in for lookaheads,
/// which regex-syntax does not parse.
const STAND_IN: u32 = 0x10_FF00;

/// One lookahead: `(?!Y)` when negative, and Y's text.
struct Lookahead {
    negative: bool,
    inner: String,
}

/// The pattern with each lookahead replaced by a stand-in character, or the
/// onig construct no DFA runs exactly.
///
/// One piece (about 120 lines) on purpose: a single left-to-right scan whose
/// state (inside a class or not, the open groups) lives in its locals; each
/// construct is a few lines of the one loop.
fn stand_ins(pattern: &str) -> Result<(String, Vec<Lookahead>), String> {
    if pattern
        .chars()
        .any(|c| (STAND_IN..STAND_IN + 0x100).contains(&(c as u32)))
    {
        return Err("it uses a private-use character prep reserves".into());
    }
    let chars: Vec<char> = pattern.chars().collect();
    let mut out = String::with_capacity(pattern.len());
    let mut lookaheads = Vec::new();
    let mut class = 0usize;
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        if c == '\\' {
            let Some(&e) = chars.get(i + 1) else {
                return Err("it ends with a backslash".into());
            };
            if class == 0 {
                let named = match e {
                    '1'..='9' | 'k' => Some("a backreference"),
                    'g' => Some(r"a subexpression call \g"),
                    'G' => Some(r"the \G anchor"),
                    'K' => Some(r"\K (keep)"),
                    'R' => Some(r"\R (any line break)"),
                    'X' => Some(r"\X (a grapheme cluster)"),
                    'Z' => Some(r"\Z (end or before a final newline)"),
                    'y' | 'Y' => Some(r"a grapheme boundary \y"),
                    'b' | 'B' => Some(r"a word boundary \b"),
                    'h' | 'H' => Some(r"onig's \h (a hexadecimal digit)"),
                    'O' => Some(r"\O (any character)"),
                    _ => None,
                };
                if let Some(what) = named {
                    return Err(format!("{what} is not run by the fast engine"));
                }
            } else if matches!(e, 'h' | 'H') {
                return Err(
                    r"onig's \h (a hexadecimal digit) is not run by the fast engine".into(),
                );
            }
            if matches!(e, 'p' | 'P') && chars.get(i + 2) != Some(&'{') {
                return Err(format!(
                    r"\{e} without braces, which onig reads as the letter {e}"
                ));
            }
            out.push(c);
            out.push(e);
            i += 2;
            continue;
        }
        if class > 0 {
            match c {
                '[' => class += 1,
                ']' => class -= 1,
                _ => {}
            }
            out.push(c);
            i += 1;
            continue;
        }
        match c {
            '[' => {
                class = 1;
                out.push(c);
                // A `]` (or `^]`) first in a class is a literal.
                i += 1;
                if chars.get(i) == Some(&'^') {
                    out.push('^');
                    i += 1;
                }
                if chars.get(i) == Some(&']') {
                    out.push(']');
                    i += 1;
                }
                continue;
            }
            '*' | '+' | '?' if chars.get(i + 1) == Some(&'+') => {
                return Err("a possessive repeat (*+, ++, ?+) is not run by the fast engine".into())
            }
            '(' if chars.get(i + 1) == Some(&'?') => {
                let rest: String = chars[i + 2..].iter().take(2).collect();
                let what = if rest.starts_with("<=") || rest.starts_with("<!") {
                    Some("a lookbehind")
                } else if rest.starts_with('>') {
                    Some("an atomic group (?>")
                } else if rest.starts_with('~') {
                    Some("an absent operator (?~")
                } else if rest.starts_with('#') {
                    Some("a comment group (?#")
                } else if rest.starts_with('(') {
                    Some("a conditional (?(")
                } else {
                    None
                };
                if let Some(what) = what {
                    return Err(format!("{what} is not run by the fast engine"));
                }
                if rest.starts_with('=') || rest.starts_with('!') {
                    let (inner, end) = group_body(&chars, i + 3)?;
                    if lookaheads.len() == 0x100 {
                        return Err("it has too many lookaheads".into());
                    }
                    out.push(
                        char::from_u32(STAND_IN + lookaheads.len() as u32)
                            .expect("a private-use character"),
                    );
                    lookaheads.push(Lookahead {
                        negative: rest.starts_with('!'),
                        inner,
                    });
                    i = end + 1;
                    continue;
                }
            }
            _ => {}
        }
        out.push(c);
        i += 1;
    }
    Ok((out, lookaheads))
}

/// The text of a group whose body starts at `from`, and the index of its
/// closing parenthesis.
fn group_body(chars: &[char], from: usize) -> Result<(String, usize), String> {
    let (mut depth, mut class) = (1usize, 0usize);
    let mut i = from;
    while i < chars.len() {
        match chars[i] {
            '\\' => i += 1,
            '[' => class += 1,
            ']' if class > 0 => class -= 1,
            '(' if class == 0 => depth += 1,
            ')' if class == 0 => {
                depth -= 1;
                if depth == 0 {
                    return Ok((chars[from..i].iter().collect(), i));
                }
            }
            _ => {}
        }
        i += 1;
    }
    Err("a lookahead is not closed".into())
}

struct Translator<'p> {
    text: &'p str,
    lookaheads: Vec<Lookahead>,
}

impl Translator<'_> {
    /// `Some` for an alternative that ends in a lookahead, which must be
    /// `X{m,n}(?!Y)` or `X{m,n}(?=Y)` with single classes.
    fn lookahead_branch(&self, items: &[Ast], fold: bool) -> Result<Option<Ahead>, String> {
        if !items.iter().any(|a| self.has_stand_in(a)) {
            return Ok(None);
        }
        let refuse = || {
            Err(
                "a lookahead other than X+(?!Y) or X*(?=Y) closing a top-level alternative, \
                 with X and Y single classes, is not run by the fast engine"
                    .into(),
            )
        };
        let [Ast::Repetition(r), Ast::Literal(l)] = items else {
            return refuse();
        };
        let Some(k) = self.stand_in(l.c) else {
            return refuse();
        };
        if !r.greedy || self.has_stand_in(&r.ast) {
            return refuse();
        }
        let Some(repeated) = self.class_of(&r.ast, fold)? else {
            return refuse();
        };
        let (min, max) = bounds(&r.op.kind);
        if min == 0 {
            return Err("it can match the empty string".into());
        }
        let look = &self.lookaheads[k];
        let inner = ast::parse::Parser::new()
            .parse(&look.inner)
            .map_err(|e| format!("a lookahead: {}", e.kind()))?;
        let sub = Translator {
            text: &look.inner,
            lookaheads: Vec::new(),
        };
        let Some(next) = sub.class_of(&inner, fold)? else {
            return refuse();
        };
        Ok(Some(Ahead {
            repeated: Set::new(&repeated),
            min: min as usize,
            max: max.map(|m| m as usize),
            next: Set::new(&next),
            negative: look.negative,
        }))
    }

    fn stand_in(&self, c: char) -> Option<usize> {
        let k = (c as u32).checked_sub(STAND_IN)? as usize;
        (k < self.lookaheads.len()).then_some(k)
    }

    fn has_stand_in(&self, ast: &Ast) -> bool {
        match ast {
            Ast::Literal(l) => self.stand_in(l.c).is_some(),
            Ast::Repetition(r) => self.has_stand_in(&r.ast),
            Ast::Group(g) => self.has_stand_in(&g.ast),
            Ast::Alternation(a) => a.asts.iter().any(|a| self.has_stand_in(a)),
            Ast::Concat(c) => c.asts.iter().any(|a| self.has_stand_in(a)),
            _ => false,
        }
    }

    /// The set of a single-character item (a class, a dot, a letter), onig's.
    fn class_of(&self, ast: &Ast, fold: bool) -> Result<Option<ClassUnicode>, String> {
        let span = match ast {
            Ast::Literal(l) if self.stand_in(l.c).is_none() => {
                return Ok(Some(literal_class(l.c, fold)?))
            }
            Ast::Dot(_) => {
                let mut all = ClassUnicode::new([ClassUnicodeRange::new('\0', char::MAX)]);
                all.difference(&ClassUnicode::new([ClassUnicodeRange::new('\n', '\n')]));
                return Ok(Some(all));
            }
            Ast::ClassBracketed(c) => c.span,
            Ast::ClassPerl(c) => c.span,
            Ast::ClassUnicode(c) => c.span,
            Ast::Group(g) => {
                let fold = match &g.kind {
                    ast::GroupKind::NonCapturing(flags) => fold_of(flags, fold)?,
                    _ => fold,
                };
                return self.class_of(&g.ast, fold);
            }
            _ => return Ok(None),
        };
        let text = &self.text[span.start.offset..span.end.offset];
        let negated = match ast {
            Ast::ClassBracketed(c) => c.negated,
            Ast::ClassPerl(c) => c.negated,
            Ast::ClassUnicode(c) => c.is_negated(),
            _ => false,
        };
        onig_class(text, fold, negated).map(Some)
    }

    fn hir(&self, ast: &Ast, fold: bool) -> Result<Hir, String> {
        Ok(match ast {
            Ast::Empty(_) => Hir::empty(),
            Ast::Flags(_) => {
                return Err(
                    "an isolated flag group inside an alternative (onig applies it to the \
                     rest of the group, alternatives included)"
                        .into(),
                )
            }
            Ast::Literal(l) if self.stand_in(l.c).is_some() => {
                return Err(
                    "a lookahead other than X+(?!Y) or X*(?=Y) closing a top-level \
                     alternative is not run by the fast engine"
                        .into(),
                )
            }
            Ast::Literal(l) if !fold => Hir::literal(l.c.encode_utf8(&mut [0; 4]).as_bytes()),
            Ast::Literal(_)
            | Ast::Dot(_)
            | Ast::ClassBracketed(_)
            | Ast::ClassPerl(_)
            | Ast::ClassUnicode(_) => Hir::class(hir::Class::Unicode(
                self.class_of(ast, fold)?.expect("a single-character item"),
            )),
            Ast::Assertion(a) => Hir::look(match a.kind {
                ast::AssertionKind::StartLine => Look::StartLF,
                ast::AssertionKind::EndLine => Look::EndLF,
                ast::AssertionKind::StartText => Look::Start,
                ast::AssertionKind::EndText => Look::End,
                _ => return Err("a word boundary is not run by the fast engine".into()),
            }),
            Ast::Repetition(r) => {
                let (min, max) = bounds(&r.op.kind);
                if matches!(
                    r.op.kind,
                    ast::RepetitionKind::Range(ast::RepetitionRange::Exactly(_))
                ) && !r.greedy
                {
                    return Err("{n}? (onig reads it as an optional {n})".into());
                }
                let sub = self.hir(&r.ast, fold)?;
                if sub.properties().minimum_len() == Some(0) && max != Some(1) {
                    return Err("a repeat of something that can match the empty string".into());
                }
                Hir::repetition(hir::Repetition {
                    min,
                    max,
                    greedy: r.greedy,
                    sub: Box::new(sub),
                })
            }
            Ast::Group(g) => {
                let fold = match &g.kind {
                    ast::GroupKind::NonCapturing(flags) => fold_of(flags, fold)?,
                    _ => fold,
                };
                alternation(
                    branches(&g.ast, fold)?
                        .into_iter()
                        .map(|(items, fold)| self.concat(items, fold))
                        .collect::<Result<_, _>>()?,
                )
            }
            Ast::Alternation(a) => alternation(
                a.asts
                    .iter()
                    .map(|a| self.hir(a, fold))
                    .collect::<Result<_, _>>()?,
            ),
            Ast::Concat(c) => self.concat(&c.asts, fold)?,
        })
    }

    fn concat(&self, items: &[Ast], fold: bool) -> Result<Hir, String> {
        if fold {
            no_multi_fold(items)?;
        }
        Ok(Hir::concat(
            items
                .iter()
                .map(|a| self.hir(a, fold))
                .collect::<Result<_, _>>()?,
        ))
    }
}

/// A group's alternatives as sequences of items, each with whether it is
/// case-insensitive. An isolated `(?i)` starting an alternative holds to
/// the end of the group, later alternatives included, in onig and in
/// regex-syntax alike; anywhere else onig reads it otherwise
/// (`a(?i)b|c` is `a(?i:b|c)`), and [`Translator::hir`] refuses it.
fn branches(body: &Ast, mut fold: bool) -> Result<Vec<(&[Ast], bool)>, String> {
    let all: Vec<&Ast> = match body {
        Ast::Alternation(a) => a.asts.iter().collect(),
        other => vec![other],
    };
    let mut out = Vec::with_capacity(all.len());
    for branch in all {
        let mut items: &[Ast] = match branch {
            Ast::Concat(c) => &c.asts,
            other => std::slice::from_ref(other),
        };
        if let Some(Ast::Flags(f)) = items.first() {
            fold = fold_of(&f.flags, fold)?;
            items = &items[1..];
        }
        out.push((items, fold));
    }
    Ok(out)
}

/// The case-insensitivity `flags` leave, or the flag onig reads otherwise.
fn fold_of(flags: &ast::Flags, mut fold: bool) -> Result<bool, String> {
    let mut on = true;
    for item in &flags.items {
        match &item.kind {
            ast::FlagsItemKind::Negation => on = false,
            ast::FlagsItemKind::Flag(ast::Flag::CaseInsensitive) => fold = on,
            ast::FlagsItemKind::Flag(f) => {
                return Err(format!(
                    "the flag {f:?} (onig's flags other than i mean other things or nothing)"
                ))
            }
        }
    }
    Ok(fold)
}

fn bounds(kind: &ast::RepetitionKind) -> (u32, Option<u32>) {
    match kind {
        ast::RepetitionKind::ZeroOrOne => (0, Some(1)),
        ast::RepetitionKind::ZeroOrMore => (0, None),
        ast::RepetitionKind::OneOrMore => (1, None),
        ast::RepetitionKind::Range(ast::RepetitionRange::Exactly(n)) => (*n, Some(*n)),
        ast::RepetitionKind::Range(ast::RepetitionRange::AtLeast(n)) => (*n, None),
        ast::RepetitionKind::Range(ast::RepetitionRange::Bounded(m, n)) => (*m, Some(*n)),
    }
}

/// The string a character folds to when that is more than one character
/// (`ß` to `ss`, `ﬁ` to `fi`), which onig matches under `(?i)`.
fn multi_fold(c: char) -> Option<String> {
    let up: String = c.to_uppercase().collect();
    let low: String = c.to_lowercase().collect();
    if up.chars().count() > 1 {
        return Some(up.to_lowercase());
    }
    if low.chars().count() > 1 {
        return Some(low);
    }
    let l = low.chars().next()?;
    let up_of_low: String = l.to_uppercase().collect();
    (up_of_low.chars().count() > 1).then(|| up_of_low.to_lowercase())
}

/// Every multi-character fold, lower-cased.
static MULTI_FOLDS: LazyLock<Vec<String>> = LazyLock::new(|| {
    let mut all: Vec<String> = (0..=char::MAX as u32)
        .filter_map(char::from_u32)
        .filter_map(multi_fold)
        .collect();
    all.sort();
    all.dedup();
    all
});

/// Refuses case-insensitive letters onig may match with a multi-character
/// fold: a letter that folds to several (`ß`), or letters in a row that are
/// one's fold (`ss`, `st`).
fn no_multi_fold(items: &[Ast]) -> Result<(), String> {
    let mut run = String::new();
    let check = |run: &str| {
        let lower = run.to_lowercase();
        match MULTI_FOLDS.iter().find(|f| lower.contains(f.as_str())) {
            Some(f) => Err(format!(
                "(?i) letters {run:?} that onig's multi-character case fold {f:?} may match as one character"
            )),
            None => Ok(()),
        }
    };
    for item in items {
        match item {
            Ast::Literal(l) => {
                if multi_fold(l.c).is_some() {
                    return Err(format!(
                        "(?i) {:?}, which onig's multi-character case fold may match as several characters",
                        l.c
                    ));
                }
                run.push(l.c);
            }
            _ => {
                check(&run)?;
                run.clear();
            }
        }
    }
    check(&run)
}

/// The set of one character under `fold`, onig's.
fn literal_class(c: char, fold: bool) -> Result<ClassUnicode, String> {
    if !fold {
        return Ok(ClassUnicode::new([ClassUnicodeRange::new(c, c)]));
    }
    if multi_fold(c).is_some() {
        return Err(format!(
            "(?i) {c:?}, which onig's multi-character case fold may match as several characters"
        ));
    }
    onig_class(&format!(r"\x{{{:x}}}", c as u32), true, true)
}

/// Every code point in order: onig's matches of a class over it are the
/// class's runs.
static EVERY_CHAR: LazyLock<String> =
    LazyLock::new(|| (0..=char::MAX as u32).filter_map(char::from_u32).collect());

type SetCache = Mutex<HashMap<(String, bool), Arc<ClassUnicode>>>;
static SETS: LazyLock<SetCache> = LazyLock::new(Default::default);

/// The set onig gives the class written `text` (case-insensitive when
/// `fold`). A class that folds to strings is refused where it may (a
/// negated class cannot: onig adds strings only to positive ones).
fn onig_class(text: &str, fold: bool, negated: bool) -> Result<ClassUnicode, String> {
    let key = (text.to_owned(), fold);
    if let Some(set) = SETS.lock().expect("no panic holds the lock").get(&key) {
        return Ok((**set).clone());
    }
    let flag = if fold { "i" } else { "-i" };
    let re = onig::Regex::new(&format!("(?{flag}:{text})+"))
        .map_err(|e| format!("onig refuses the class {text}: {e}"))?;
    let all: &str = &EVERY_CHAR;
    let mut ranges = Vec::new();
    for (start, end) in re.find_iter(all) {
        let first = all[start..].chars().next().expect("a match is not empty");
        let last = all[..end]
            .chars()
            .next_back()
            .expect("a match is not empty");
        ranges.push(ClassUnicodeRange::new(first, last));
    }
    let set = ClassUnicode::new(ranges);
    if fold && !negated {
        if let Some(c) = set
            .ranges()
            .iter()
            .flat_map(|r| r.start()..=r.end())
            .find(|&c| multi_fold(c).is_some())
        {
            return Err(format!(
                "the (?i) class {text} holds {c:?}, which onig's multi-character case fold may match as several characters"
            ));
        }
    }
    SETS.lock()
        .expect("no panic holds the lock")
        .insert(key, Arc::new(set.clone()));
    Ok(set)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// Patterns from tokenizers in the wild, and made-up ones that mix the
    /// constructs the engine takes.
    pub(crate) const PATTERNS: &[&str] = &[
        // Qwen2 / 2.5 / 3
        r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+",
        // CLIP
        r"'s|'t|'re|'ve|'m|'ll|'d|[\p{L}]+|[\p{N}]|[^\s\p{L}\p{N}]+",
        // Kimi K2
        r"[\p{Han}]+|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]*[\p{Ll}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]+[\p{Ll}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+",
        r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+",
        r"(?i:kel)|\d+|\w+?x|[[:punct:]]+|\s+(?=\S)|\s",
        r"(?i)kel|\d+|[[:punct:]]+|\s+(?=\S)|\s",
        r"^\w+|\s+$|\p{Lu}\p{Ll}*|[\p{Han}\p{Hiragana}]{2,}|.",
        r"\S+\n?|[ \t]{1,4}(?![ \t])|\s",
        r"(?:ab|a)(?:bc|b)?c*|[^\sa-c]+|[[:space:]]",
        r"\W+|\D{2}|\d",
        r"(?i:[a-z]+)|[^[:alnum:]]",
    ];

    /// Strings of characters where the engines could part: case folds,
    /// every kind of space, marks, scripts, digits of other systems.
    fn tricky() -> impl Strategy<Value = String> {
        let chars = proptest::sample::select(vec![
            "a", "A", "b", "c", "x", "k", "K", "\u{212a}", "s", "S", "\u{17f}", "l", "L", "e", "r",
            "v", "t", "d", "m", "'", " ", "  ", "\n", "\r", "\r\n", "\t", "\u{a0}", "\u{3000}",
            "\u{85}", "\u{2028}", "\u{b}", "1", "7", "\u{663}", "\u{b2}", "\u{2160}", "中", "ー",
            "カ", "の", "é", "\u{301}", "ǅ", "ʰ", "ß", "ẞ", "!", ".", "_", "-", "/", "😀",
            "\u{200d}", "\u{feff}", "İ", "ﬁ", "ẗ", "ﬆ",
        ]);
        proptest::collection::vec(chars, 0..40).prop_map(|v| v.concat())
    }

    fn ours(pattern: &str, text: &str) -> Vec<(usize, usize)> {
        let a = Automaton::new(pattern).unwrap_or_else(|e| panic!("{pattern}: {e}"));
        let mut out = Vec::new();
        a.find_iter(text, &mut |s, e| out.push((s, e)));
        out
    }

    fn onigs(pattern: &str, text: &str) -> Vec<(usize, usize)> {
        onig::Regex::new(pattern).unwrap().find_iter(text).collect()
    }

    /// A random pattern from pieces: alternatives of classes with repeats,
    /// an optional space or class before, sometimes a lookahead after.
    fn random_pattern() -> impl Strategy<Value = String> {
        let class = proptest::sample::select(vec![
            r"\p{L}",
            r"\p{N}",
            r"\s",
            r"\S",
            r"\d",
            r"\w",
            r"\W",
            r"[^\s\p{L}\p{N}]",
            r"[\r\n]",
            r"\p{Lu}",
            r"\p{Ll}",
            r"\p{Han}",
            r"[[:alpha:]]",
            r"[a-z]",
            r"[^\r\n\p{L}\p{N}]",
            r"[\p{L}\p{M}&&[^\p{Han}]]",
            r"(?i:k)",
            r"(?i:[a-m])",
            r".",
            r"'",
            r"\p{P}",
        ]);
        let quant = proptest::sample::select(vec!["", "+", "{1,3}", "+?", "{2,}", "*", "?"]);
        let before = proptest::sample::select(vec!["", " ?", r"\s*", r"[^\S\n]?"]);
        let ahead = proptest::sample::select(vec!["", "", r"(?!\S)", r"(?=\S)", r"(?!\p{L})"]);
        let alternative =
            (before, class.clone(), quant, class, ahead).prop_map(|(before, c, q, c2, ahead)| {
                if ahead.is_empty() {
                    // The second class keeps the alternative from matching
                    // the empty string.
                    format!("{before}{c}{q}{c2}")
                } else {
                    format!("{c}+{ahead}")
                }
            });
        proptest::collection::vec(alternative, 1..5).prop_map(|v| v.join("|"))
    }

    /// regex-syntax lifts a prefix shared by every alternative out of the
    /// alternation, which a backtracking engine does not: onig matches the
    /// first alternative of these on "  a1" as "  " (then "a1"), the lifted
    /// pattern the whole text at once.
    #[test]
    fn a_prefix_shared_by_the_alternatives_stays_in_each() {
        for (pattern, text) in [
            (r"\s*\W\s|\s*\p{L}\S", "  a1"),
            (r"\s*\W\s|\s*\p{L}\S|\s*\d", "  a1 \t 2"),
            (r" ?[a-z]+ |  ?[a-z]+\d", " ab1 cd "),
        ] {
            assert_eq!(
                ours(pattern, text),
                onigs(pattern, text),
                "{pattern} on {text:?}"
            );
        }
        assert_eq!(ours(r"\s*\W\s|\s*\p{L}\S", "  a1"), [(0, 2), (2, 4)]);
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(300))]
        #[test]
        fn patterns_match_as_onig(text in tricky()) {
            for pattern in PATTERNS {
                prop_assert_eq!(ours(pattern, &text), onigs(pattern, &text), "{} on {:?}", pattern, text);
            }
        }

        #[test]
        fn random_patterns_match_as_onig(pattern in random_pattern(), texts in proptest::collection::vec(tricky(), 8)) {
            for text in &texts {
                prop_assert_eq!(ours(&pattern, text), onigs(&pattern, text), "{} on {:?}", pattern, text);
            }
        }
    }

    /// The sets asked of onig hold exactly the characters onig's class
    /// matches, on every code point.
    #[test]
    fn class_sets_match_onig_on_every_code_point() {
        let mut buf = [0u8; 4];
        for (class, fold) in [
            (r"[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]", false),
            (r"\w", false),
            (r"[[:alpha:]]", false),
            (r"\P{N}", true),
            (r"\x{6b}", true),
        ] {
            let set = Set::new(&onig_class(class, fold, class.starts_with(r"\P")).unwrap());
            let flag = if fold { "i" } else { "-i" };
            let re = onig::Regex::new(&format!(r"\A(?{flag}:{class})\z")).unwrap();
            for c in (0..=char::MAX as u32).filter_map(char::from_u32) {
                assert_eq!(
                    set.contains(c),
                    re.is_match(c.encode_utf8(&mut buf)),
                    "{class} on U+{:04X}",
                    c as u32
                );
            }
        }
    }

    /// onig folds by Unicode rules: `(?i:s)` is also LATIN SMALL LETTER
    /// LONG S, `(?i:k)` also KELVIN SIGN.
    #[test]
    fn case_insensitive_letters_fold_as_onig() {
        assert_eq!(ours("(?i:s)", "sSſx"), [(0, 1), (1, 2), (2, 4)]);
        assert_eq!(ours("(?i)k", "kK\u{212a}"), [(0, 1), (1, 2), (2, 5)]);
    }

    #[test]
    fn refused_constructs_are_named() {
        for (pattern, named) in [
            (r"(a)\1", "backreference"),
            (r"(?<=a)b", "lookbehind"),
            (r"(?<!a)b", "lookbehind"),
            (r"(?>ab)c", "atomic group"),
            (r"a++", "possessive"),
            (r"\bword\b", "word boundary"),
            (r"(?=a)b", "lookahead"),
            (r"a(?!b)c", "lookahead"),
            (r"(?:\s+(?!\S))x", "lookahead"),
            (r"a(?i)b|c", "isolated flag"),
            (r"(?m)a.", "flag"),
            (r"(?x)a b", "flag"),
            (r"a|\s*", "empty string"),
            (r"(?i)ss", "multi-character case fold"),
            (r"(?i:ß)", "multi-character case fold"),
            (r"\pL+", "without braces"),
            (r"x{2}?", "{n}?"),
            (r"\h+", r"\h"),
            (r"a\Z", r"\Z"),
            (r"(?:a*)*b", "empty string"),
        ] {
            match Automaton::new(pattern) {
                Ok(_) => panic!("{pattern} is taken"),
                Err(e) => assert!(e.contains(named), "{pattern}: {e}"),
            }
        }
    }
}
