//! Pre-tokenizer scanners: the split patterns of the byte-level BPE families,
//! each written out as the choices the regex engine makes, with no regex.
//!
//! A pattern is an alternation tried left to right at each position; the
//! first alternative that matches wins, and within it the greedy quantifiers
//! backtrack as Oniguruma's do. Every function below names the alternative it
//! stands for. Character classes come from [`super::unicode`], a table made
//! from onig itself.
//!
//! The GPT-2, cl100k and o200k patterns match every character, so a text is
//! cut into consecutive matches. DeepSeek's three `Isolated` splits can leave
//! characters no alternative matches; like HF's `Split`, those runs become
//! pieces of their own.

use super::unicode::{class, eq_ignore_case, L, LO, M, N, P, S, UP, WS};

/// A split pattern the fast engine runs.
///
/// Each of the three one-pattern families comes in the variants tokenizer
/// files ship: GPT-2's with its contractions case-insensitive or not, and
/// cl100k's and o200k's with any bound on a run of numbers (`\p{N}` alone in
/// Qwen2, 2.5 and 3, `\p{N}{1,3}` in cl100k_base, Llama 3 and o200k_base).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Pattern {
    /// `'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+`
    /// (HF's `ByteLevel` with `use_regex`); with `fold`, the contractions
    /// inside `(?i:...)`.
    Gpt2 {
        /// Whether the contractions match in any case.
        fold: bool,
    },
    /// [`CL100K`] with `\p{N}{1,numbers}`: cl100k_base and Llama 3 (3),
    /// Qwen2 to 3 (1).
    Cl100k {
        /// The most numbers one piece takes.
        numbers: u8,
    },
    /// [`O200K`] with `\p{N}{1,numbers}`: o200k_base (3).
    O200k {
        /// The most numbers one piece takes.
        numbers: u8,
    },
    /// DeepSeek V3's `\p{N}{1,3}`, CJK and [`DEEPSEEK`] splits, in sequence.
    DeepSeek,
}

/// In words, for a run's summary: the family, and how this variant
/// differs from the family's usual one.
impl std::fmt::Display for Pattern {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let bound = |f: &mut std::fmt::Formatter<'_>, family: &str, n: u8| match n {
            3 => write!(f, "{family}'s split pattern"),
            n => write!(f, "{family}'s split pattern with runs of up to {n} numbers"),
        };
        match *self {
            Pattern::Gpt2 { fold: false } => write!(f, "GPT-2's split pattern"),
            Pattern::Gpt2 { fold: true } => {
                write!(f, "GPT-2's split pattern with contractions in any case")
            }
            Pattern::Cl100k { numbers } => bound(f, "cl100k", numbers),
            Pattern::O200k { numbers } => bound(f, "o200k", numbers),
            Pattern::DeepSeek => write!(f, "DeepSeek V3's split patterns"),
        }
    }
}

/// The bounds on a run of numbers the scanners are recognised with.
pub(crate) const NUMBER_BOUNDS: std::ops::RangeInclusive<u8> = 1..=9;

/// GPT-2's contractions.
const CONTRACTIONS: &str = "'s|'t|'re|'ve|'m|'ll|'d";
/// HF's built-in `ByteLevel` pattern, also seen as an explicit `Split`.
pub(crate) const GPT2: &str =
    r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+";
/// cl100k_base and Llama 3; the others of its family differ in the bound
/// of `\p{N}{1,3}`.
pub(crate) const CL100K: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
/// o200k_base.
pub(crate) const O200K: &str = r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+";
/// DeepSeek V3's splits, in order.
pub(crate) const DEEPSEEK_DIGITS: &str = r"\p{N}{1,3}";
/// The kana and CJK ideograph runs DeepSeek isolates.
pub(crate) const DEEPSEEK_CJK: &str = "[一-龥\u{3040}-ゟ゠-ヿ]+";
/// DeepSeek V3's last split.
pub(crate) const DEEPSEEK: &str = r##"[!"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~][A-Za-z]+|[^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+| ?[\p{P}\p{S}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"##;

impl Pattern {
    /// Calls `piece` with each piece of `text`, in order; the pieces are
    /// consecutive and cover `text`.
    #[inline]
    pub fn split<'t>(self, text: &'t str, piece: &mut impl FnMut(&'t str)) {
        match self {
            Pattern::Gpt2 { fold } => consecutive(text, |s, i| gpt2(s, i, fold), piece),
            Pattern::Cl100k { numbers } => consecutive(text, |s, i| cl100k(s, i, numbers), piece),
            Pattern::O200k { numbers } => consecutive(text, |s, i| o200k(s, i, numbers), piece),
            Pattern::DeepSeek => deepseek(text, piece),
        }
    }

    /// The pattern's text as its family's constant spells it; `None` for
    /// DeepSeek's sequence of three.
    pub(crate) fn text(self) -> Option<String> {
        let numbers = |family: &str, bound: u8| {
            let run = match bound {
                1 => r"\p{N}".to_string(),
                n => format!(r"\p{{N}}{{1,{n}}}"),
            };
            family.replacen(r"\p{N}{1,3}", &run, 1)
        };
        match self {
            Pattern::Gpt2 { fold: false } => Some(GPT2.into()),
            Pattern::Gpt2 { fold: true } => {
                Some(GPT2.replacen(CONTRACTIONS, &format!("(?i:{CONTRACTIONS})"), 1))
            }
            Pattern::Cl100k { numbers: n } => Some(numbers(CL100K, n)),
            Pattern::O200k { numbers: n } => Some(numbers(O200K, n)),
            Pattern::DeepSeek => None,
        }
    }

    /// Every one-pattern scanner the engine recognises a split by.
    pub(crate) fn family() -> impl Iterator<Item = Pattern> {
        [false, true]
            .map(|fold| Pattern::Gpt2 { fold })
            .into_iter()
            .chain(NUMBER_BOUNDS.map(|numbers| Pattern::Cl100k { numbers }))
            .chain(NUMBER_BOUNDS.map(|numbers| Pattern::O200k { numbers }))
    }
}

/// One split pattern the scanners run, as a step of a general pre-tokenizer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Known {
    /// A pattern that matches at every character, with its scanner.
    Whole(Pattern),
    /// [`DEEPSEEK_DIGITS`]
    Digits3,
    /// [`DEEPSEEK_CJK`]
    Cjk,
    /// [`DEEPSEEK`]
    DeepSeek,
}

impl Known {
    /// Every known pattern with its text.
    pub(crate) fn all() -> impl Iterator<Item = (Known, String)> {
        Pattern::family()
            .map(|p| (Known::Whole(p), p.text().expect("one pattern")))
            .chain([
                (Known::Digits3, DEEPSEEK_DIGITS.into()),
                (Known::Cjk, DEEPSEEK_CJK.into()),
                (Known::DeepSeek, DEEPSEEK.into()),
            ])
    }

    /// The end of the match onig finds starting at `i`, if one starts there.
    #[inline]
    pub(crate) fn match_at(self, s: &str, i: usize) -> Option<usize> {
        match self {
            Known::Whole(Pattern::Gpt2 { fold }) => Some(gpt2(s, i, fold)),
            Known::Whole(Pattern::Cl100k { numbers }) => Some(cl100k(s, i, numbers)),
            Known::Whole(Pattern::O200k { numbers }) => Some(o200k(s, i, numbers)),
            Known::Whole(Pattern::DeepSeek) => unreachable!("DeepSeek is three splits"),
            Known::Digits3 => (class_at(s, i) & N != 0).then(|| numbers(s, i, 3)),
            Known::Cjk => {
                let end = run_cjk(s, i);
                (end > i).then_some(end)
            }
            Known::DeepSeek => deepseek_match(s, i),
        }
    }

    /// Whether a match starts at every character, so that the matches cover
    /// the text and an `Isolated` split equals a `Removed` inverted one.
    pub(crate) fn covers(self) -> bool {
        matches!(self, Known::Whole(_))
    }

    /// The scanner of the same pattern alone, where there is one.
    pub(crate) fn pattern(self) -> Option<Pattern> {
        match self {
            Known::Whole(p) => Some(p),
            _ => None,
        }
    }
}

/// The character at byte `i` and its length in bytes.
#[inline(always)]
fn at(s: &str, i: usize) -> Option<(char, usize)> {
    let b = *s.as_bytes().get(i)?;
    if b < 0x80 {
        return Some((b as char, 1));
    }
    let c = s[i..].chars().next()?;
    Some((c, c.len_utf8()))
}

/// The class bits of the character at `i`, 0 past the end.
#[inline(always)]
fn class_at(s: &str, i: usize) -> u8 {
    at(s, i).map_or(0, |(c, _)| class(c))
}

/// End of the run of characters from `i` whose class meets `mask`.
#[inline(always)]
fn run(s: &str, mut i: usize, mask: u8) -> usize {
    while let Some((c, n)) = at(s, i) {
        if class(c) & mask == 0 {
            break;
        }
        i += n;
    }
    i
}

/// End of the run of characters from `i` whose class misses `mask`.
#[inline(always)]
fn run_not(s: &str, mut i: usize, mask: u8) -> usize {
    while let Some((c, n)) = at(s, i) {
        if class(c) & mask != 0 {
            break;
        }
        i += n;
    }
    i
}

/// End of `\p{N}{1,max}` at `i`, whose character is a number.
#[inline]
fn numbers(s: &str, mut i: usize, max: u8) -> usize {
    for _ in 0..max {
        match at(s, i) {
            Some((c, n)) if class(c) & N != 0 => i += n,
            _ => break,
        }
    }
    i
}

/// End of the run of ASCII bytes from `i` that `keep` accepts.
#[inline(always)]
fn run_bytes(s: &str, mut i: usize, keep: impl Fn(u8) -> bool) -> usize {
    let b = s.as_bytes();
    while i < b.len() && keep(b[i]) {
        i += 1;
    }
    i
}

fn is_newline(b: u8) -> bool {
    b == b'\r' || b == b'\n'
}

/// `'s|'t|'re|'ve|'m|'ll|'d` at `i` (which holds `'`), case-insensitive when
/// `fold`: the end of the match.
#[inline]
fn contraction(s: &str, i: usize, fold: bool) -> Option<usize> {
    let is = |c: char, x: u8| {
        if fold {
            eq_ignore_case(c, x)
        } else {
            c as u32 == u32::from(x)
        }
    };
    let (c1, n1) = at(s, i + 1)?;
    if [b's', b't', b'm', b'd'].iter().any(|&x| is(c1, x)) {
        return Some(i + 1 + n1);
    }
    let second = [(b'r', b'e'), (b'v', b'e'), (b'l', b'l')]
        .iter()
        .find(|&&(x, _)| is(c1, x))?
        .1;
    let (c2, n2) = at(s, i + 1 + n1)?;
    is(c2, second).then_some(i + 1 + n1 + n2)
}

/// The whitespace alternatives at `i`, whose character is whitespace:
/// `\s*[\r\n]+` when `newlines`, then `\s+(?!\S)`, then `\s+`.
#[inline]
fn whitespace(s: &str, i: usize, newlines: bool) -> usize {
    let mut end = i;
    let mut last_start = i;
    let mut chars = 0usize;
    let mut last_newline = None;
    while let Some((c, n)) = at(s, end) {
        if class(c) & WS == 0 {
            break;
        }
        if c == '\r' || c == '\n' {
            last_newline = Some(end);
        }
        last_start = end;
        end += n;
        chars += 1;
    }
    debug_assert!(chars > 0, "whitespace() at a non-space");
    if chars == 0 {
        // Unreachable by the callers' logic; still make progress.
        return i + at(s, i).map_or(1, |(_, n)| n);
    }
    // `\s*` backtracks to the last newline of the run; `[\r\n]+` takes it.
    if newlines {
        if let Some(p) = last_newline {
            return p + 1;
        }
    }
    // `\s+(?!\S)`: all of a run that ends the text, else all but its last
    // character (which then starts the next piece); one character alone
    // before a non-space is `\s+`.
    if end == s.len() || chars == 1 {
        end
    } else {
        last_start
    }
}

/// Cuts `text` into consecutive matches of a pattern that matches every
/// character.
#[inline(always)]
fn consecutive<'t>(
    text: &'t str,
    next: impl Fn(&str, usize) -> usize,
    piece: &mut impl FnMut(&'t str),
) {
    let mut i = 0;
    while i < text.len() {
        let end = next(text, i);
        piece(&text[i..end]);
        i = end;
    }
}

/// One match of [`GPT2`] at `i`, its contractions case-insensitive when
/// `fold`.
#[inline(always)]
fn gpt2(s: &str, i: usize, fold: bool) -> usize {
    let b = s.as_bytes();
    if b[i] == b'\'' {
        if let Some(end) = contraction(s, i, fold) {
            return end;
        }
    }
    // ` ?\p{L}+`, ` ?\p{N}+`, ` ?[^\s\p{L}\p{N}]+`: with the space if what
    // follows it fits, else without (where a space never fits).
    let j = if b[i] == b' ' && i + 1 < b.len() {
        i + 1
    } else {
        i
    };
    let k = class_at(s, j);
    if k & L != 0 {
        return run(s, j, L);
    }
    if k & N != 0 {
        return run(s, j, N);
    }
    if k & WS == 0 {
        return run_not(s, j, WS | L | N);
    }
    whitespace(s, i, false)
}

/// One match of [`CL100K`] at `i`, with `\p{N}{1,numbers}`.
#[inline(always)]
fn cl100k(s: &str, i: usize, numbers: u8) -> usize {
    let b = s.as_bytes();
    if b[i] == b'\'' {
        if let Some(end) = contraction(s, i, true) {
            return end;
        }
    }
    let (c, n) = at(s, i).expect("i is inside s");
    let k = class(c);
    // `[^\r\n\p{L}\p{N}]?\p{L}+`
    if k & L != 0 {
        return run(s, i, L);
    }
    if !is_newline(b[i]) && k & N == 0 && class_at(s, i + n) & L != 0 {
        return run(s, i + n, L);
    }
    // `\p{N}{1,numbers}`
    if k & N != 0 {
        return self::numbers(s, i, numbers);
    }
    // ` ?[^\s\p{L}\p{N}]+[\r\n]*`
    let j = if c == ' ' { i + 1 } else { i };
    if j < s.len() && class_at(s, j) & (WS | L | N) == 0 {
        let end = run_not(s, j, WS | L | N);
        return run_bytes(s, end, is_newline);
    }
    whitespace(s, i, true)
}

/// `[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+` then the
/// optional contraction, from `p`.
#[inline]
fn o200k_lower(s: &str, p: usize) -> Option<usize> {
    // The greedy upper run gives back characters until a lower-run one
    // follows it: start the lower run at the last such position.
    let mut q = p;
    let mut last_lower = None;
    while let Some((c, n)) = at(s, q) {
        let k = class(c);
        if k & UP == 0 {
            break;
        }
        if k & LO != 0 {
            last_lower = Some(q);
        }
        q += n;
    }
    let start = if class_at(s, q) & LO != 0 {
        q
    } else {
        last_lower?
    };
    Some(o200k_contraction(s, run(s, start, LO)))
}

/// `[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*` then the
/// optional contraction, from `p`.
#[inline]
fn o200k_upper(s: &str, p: usize) -> Option<usize> {
    let q = run(s, p, UP);
    (q > p).then(|| o200k_contraction(s, run(s, q, LO)))
}

#[inline]
fn o200k_contraction(s: &str, end: usize) -> usize {
    if s.as_bytes().get(end) == Some(&b'\'') {
        contraction(s, end, true).unwrap_or(end)
    } else {
        end
    }
}

/// One match of [`O200K`] at `i`, with `\p{N}{1,numbers}`.
#[inline(always)]
fn o200k(s: &str, i: usize, numbers: u8) -> usize {
    let (c, n) = at(s, i).expect("i is inside s");
    let k = class(c);
    // The optional `[^\r\n\p{L}\p{N}]` is tried taken, then not.
    let prefix = !is_newline(s.as_bytes()[i]) && k & (L | N) == 0;
    for word in [o200k_lower, o200k_upper] {
        if prefix {
            if let Some(end) = word(s, i + n) {
                return end;
            }
        }
        if let Some(end) = word(s, i) {
            return end;
        }
    }
    if k & N != 0 {
        return self::numbers(s, i, numbers);
    }
    // ` ?[^\s\p{L}\p{N}]+[\r\n/]*`
    let j = if c == ' ' { i + 1 } else { i };
    if j < s.len() && class_at(s, j) & (WS | L | N) == 0 {
        let end = run_not(s, j, WS | L | N);
        return run_bytes(s, end, |b| is_newline(b) || b == b'/');
    }
    whitespace(s, i, true)
}

/// DeepSeek's three splits in sequence: numbers by three, then kana and CJK
/// runs, then [`DEEPSEEK`] with the unmatched runs as pieces.
fn deepseek<'t>(text: &'t str, piece: &mut impl FnMut(&'t str)) {
    isolate(
        text,
        // A number is an ASCII digit or starts with a lead byte.
        |b| b.is_ascii_digit() || b >= 0xC0,
        |s, i| (class_at(s, i) & N != 0).then(|| numbers(s, i, 3)),
        &mut |part| {
            isolate(
                part,
                // U+3040 to U+30FF start with E3, U+4E00 to U+9FA5 with E4 to E9.
                |b| (0xE3..=0xE9).contains(&b),
                |s, i| {
                    let end = run_cjk(s, i);
                    (end > i).then_some(end)
                },
                &mut |part| isolate(part, |_| true, deepseek_match, piece),
            )
        },
    );
}

/// HF's `Split` with `Isolated`: the matches of `find` (tried at each
/// character, left to right) and the runs between them, in order. `find`
/// is tried only where `may_start` accepts the byte, which must accept
/// the first byte of every character a match can start with and refuse
/// every UTF-8 continuation byte (0x80 to 0xBF), so that the scan steps
/// over the bytes of other text one at a time and stops only at
/// character boundaries.
#[inline(always)]
fn isolate<'t>(
    text: &'t str,
    may_start: impl Fn(u8) -> bool,
    find: impl Fn(&str, usize) -> Option<usize>,
    piece: &mut impl FnMut(&'t str),
) {
    let bytes = text.as_bytes();
    let mut gap = 0;
    let mut i = 0;
    while i < bytes.len() {
        if !may_start(bytes[i]) {
            i += 1;
            continue;
        }
        match find(text, i) {
            Some(end) => {
                if gap < i {
                    piece(&text[gap..i]);
                }
                piece(&text[i..end]);
                i = end;
                gap = end;
            }
            None => i += at(text, i).map_or(1, |(_, n)| n),
        }
    }
    if gap < text.len() {
        piece(&text[gap..]);
    }
}

/// End of the run of `[一-龥\u{3040}-ゟ゠-ヿ]` from `i`.
#[inline]
fn run_cjk(s: &str, mut i: usize) -> usize {
    while let Some((c, n)) = at(s, i) {
        if !matches!(c, '\u{4E00}'..='\u{9FA5}' | '\u{3040}'..='\u{30FF}') {
            break;
        }
        i += n;
    }
    i
}

/// One match of [`DEEPSEEK`] at `i`, if any starts there.
fn deepseek_match(s: &str, i: usize) -> Option<usize> {
    let (c, n) = at(s, i)?;
    let k = class(c);
    // `[!"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~][A-Za-z]+`
    if c.is_ascii_punctuation() {
        let end = run_bytes(s, i + 1, |b| b.is_ascii_alphabetic());
        if end > i + 1 {
            return Some(end);
        }
    }
    // `[^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+`
    if !is_newline(s.as_bytes()[i]) && k & (L | P | S) == 0 {
        let end = run(s, i + n, L | M);
        if end > i + n {
            return Some(end);
        }
    }
    if k & (L | M) != 0 {
        return Some(run(s, i, L | M));
    }
    // ` ?[\p{P}\p{S}]+[\r\n]*`
    let j = if c == ' ' { i + 1 } else { i };
    if class_at(s, j) & (P | S) != 0 {
        let end = run(s, j, P | S);
        return Some(run_bytes(s, end, is_newline));
    }
    (k & WS != 0).then(|| whitespace(s, i, true))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pieces(p: Pattern, text: &str) -> Vec<&str> {
        let mut out = Vec::new();
        p.split(text, &mut |s| out.push(s));
        out
    }

    /// The pieces onig gives for `pattern` as an `Isolated` split.
    fn onig_pieces<'t>(pattern: &str, text: &'t str) -> Vec<&'t str> {
        let re = onig::Regex::new(pattern).unwrap();
        let mut out = Vec::new();
        let mut last = 0;
        for (start, end) in re.find_iter(text) {
            if last < start {
                out.push(&text[last..start]);
            }
            out.push(&text[start..end]);
            last = end;
        }
        if last < text.len() {
            out.push(&text[last..]);
        }
        out
    }

    fn onig_deepseek(text: &str) -> Vec<&str> {
        let mut out = Vec::new();
        for a in onig_pieces(DEEPSEEK_DIGITS, text) {
            for b in onig_pieces(DEEPSEEK_CJK, a) {
                out.extend(onig_pieces(DEEPSEEK, b));
            }
        }
        out
    }

    const SAMPLES: &[&str] = &[
        "Hello world, it's 2024!  Don't   stop\n\n\tnow.",
        "\t\t'sfu \n\n\t/sys/kernel 'S 'Re 'ſ 'LL",
        "数字 12345 和 日本語のテキスト・カタカナ゠ー",
        "  leading and trailing  ",
        "x\u{300}\u{301}y Ǆǅǆ ʰʱ 𝔘𝔫𝔦 ١٢٣٤ ²³ \u{a0}\u{3000}a",
        "(hello) [world] {x}\r\n\r\n  \r  a//b///c\n",
        "camelCaseWord HTTPServer don'T they'LL ÉCOLE école",
        "\u{0}\u{1}a\u{200b} b\u{feff}",
        "!!!abc ...\n\n---xyz",
    ];

    /// Each family with and without folding, and with the bounds real
    /// files use (3, and Qwen's 1) and one more.
    const ALL: [Pattern; 8] = [
        Pattern::Gpt2 { fold: false },
        Pattern::Gpt2 { fold: true },
        Pattern::Cl100k { numbers: 3 },
        Pattern::Cl100k { numbers: 1 },
        Pattern::Cl100k { numbers: 2 },
        Pattern::O200k { numbers: 3 },
        Pattern::O200k { numbers: 1 },
        Pattern::DeepSeek,
    ];

    /// The pieces onig gives for the pattern `p` stands for.
    fn reference(p: Pattern, text: &str) -> Vec<&str> {
        match p.text() {
            Some(pattern) => onig_pieces(&pattern, text),
            None => onig_deepseek(text),
        }
    }

    /// The family's texts are spelled as the files spell them.
    #[test]
    fn family_texts_are_the_files_patterns() {
        assert_eq!(Pattern::Cl100k { numbers: 3 }.text().unwrap(), CL100K);
        assert_eq!(Pattern::O200k { numbers: 3 }.text().unwrap(), O200K);
        assert_eq!(
            Pattern::Cl100k { numbers: 1 }.text().unwrap(),
            r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
        );
        assert!(Pattern::Gpt2 { fold: true }
            .text()
            .unwrap()
            .starts_with("(?i:'s|'t|'re|'ve|'m|'ll|'d)| ?"));
    }

    #[test]
    fn scanners_match_onig_on_samples() {
        for text in SAMPLES {
            for p in ALL {
                assert_eq!(pieces(p, text), reference(p, text), "{p:?} {text:?}");
            }
        }
    }

    use proptest::prelude::*;

    /// Characters that exercise every branch of the patterns.
    fn tricky_char() -> impl Strategy<Value = char> {
        prop_oneof![
            4 => proptest::sample::select(vec![
                ' ', ' ', '\t', '\n', '\r', '\'', 's', 'S', 't', 'r', 'e', 'v', 'l', 'L', 'd', 'm',
                'ſ', 'a', 'Z', '1', '9', '/', '.', '-', '!', '(', '\u{a0}', '\u{3000}', '\u{2028}',
                '\u{300}', '\u{301}', 'é', 'É', 'ǅ', 'ʰ', '中', '日', 'の', 'カ', '・', '゠', 'ー',
                '゛', '\u{3099}', '٣', '²', 'Ⅻ', '€', '😀', '\u{200b}', '\u{0}', '\u{7f}', '\u{85}',
                '\u{b}', '\u{c}', 'ß', 'İ', 'K', '\u{fe0f}',
            ]),
            1 => any::<char>(),
        ]
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(3000))]
        #[test]
        fn scanners_match_onig(chars in proptest::collection::vec(tricky_char(), 0..40)) {
            let text: String = chars.into_iter().collect();
            for p in ALL {
                prop_assert_eq!(pieces(p, &text), reference(p, &text), "{:?}", p);
            }
        }
    }
}
