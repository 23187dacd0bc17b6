//! Character classes of the pre-tokenizer patterns, exactly as the regex
//! engine HF tokenizers runs (Oniguruma) defines them.
//!
//! `unicode.bin` holds one class byte per code point, generated from onig
//! itself by the test below (`PREP_WRITE_UNICODE_TABLE=src/unicode.bin cargo
//! test --workspace --lib unicode`, the path relative to crates/engine, where
//! the test runs), so the scanners agree with the reference on
//! every code point of the Unicode version onig knows, not the one Rust or a
//! crate knows. The same test checks the committed table against onig on every
//! run. Layout: 8,704 little-endian `u16` block numbers (one per 128 code
//! points), then the distinct 128-byte blocks.

/// `\p{L}`
pub(crate) const L: u8 = 1;
/// `\p{N}`
pub(crate) const N: u8 = 2;
/// `\p{M}`
pub(crate) const M: u8 = 4;
/// `\p{P}`
pub(crate) const P: u8 = 8;
/// `\p{S}`
pub(crate) const S: u8 = 16;
/// `\s`
pub(crate) const WS: u8 = 32;
/// `[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]` (o200k's upper-case run)
pub(crate) const UP: u8 = 64;
/// `[\p{Ll}\p{Lm}\p{Lo}\p{M}]` (o200k's lower-case run)
pub(crate) const LO: u8 = 128;

const BLOCK: usize = 128;
const BLOCKS: usize = 0x11_0000 / BLOCK;

static TABLE: &[u8] = include_bytes!("unicode.bin");

/// The first block, ASCII, on its own: one load instead of two for the
/// characters most text is made of.
static ASCII: [u8; 128] = {
    let bytes: &[u8] = include_bytes!("unicode.bin");
    let block = u16::from_le_bytes([bytes[0], bytes[1]]) as usize;
    let mut out = [0u8; 128];
    let mut i = 0;
    while i < 128 {
        out[i] = bytes[BLOCKS * 2 + block * BLOCK + i];
        i += 1;
    }
    out
};

/// The class bits of `c`.
#[inline]
pub(crate) fn class(c: char) -> u8 {
    let cp = c as usize;
    if cp < 128 {
        return ASCII[cp];
    }
    let hi = cp / BLOCK;
    let block = u16::from_le_bytes([TABLE[2 * hi], TABLE[2 * hi + 1]]) as usize;
    TABLE[BLOCKS * 2 + block * BLOCK + cp % BLOCK]
}

/// Whether `c` matches `(?i:x)` for a lower-case ASCII letter `x` of the
/// contractions (`'s 't 're 've 'm 'll 'd`). Oniguruma folds case by Unicode
/// rules, under which LATIN SMALL LETTER LONG S (U+017F) is an `s`.
#[inline]
pub(crate) fn eq_ignore_case(c: char, x: u8) -> bool {
    (c as u32) < 128 && (c as u8).to_ascii_lowercase() == x || (x == b's' && c == '\u{17F}')
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The class byte of every code point, asked of onig.
    fn from_onig() -> Vec<u8> {
        let patterns = [
            (L, r"\p{L}"),
            (N, r"\p{N}"),
            (M, r"\p{M}"),
            (P, r"\p{P}"),
            (S, r"\p{S}"),
            (WS, r"\s"),
            (UP, r"[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]"),
            (LO, r"[\p{Ll}\p{Lm}\p{Lo}\p{M}]"),
        ];
        let regexes: Vec<(u8, onig::Regex)> = patterns
            .iter()
            .map(|&(bit, p)| (bit, onig::Regex::new(&format!(r"\A{p}\z")).unwrap()))
            .collect();
        let mut buf = [0u8; 4];
        (0..0x11_0000u32)
            .map(|cp| match char::from_u32(cp) {
                Some(c) => {
                    let s = c.encode_utf8(&mut buf);
                    regexes
                        .iter()
                        .filter(|(_, r)| r.is_match(s))
                        .fold(0, |acc, (bit, _)| acc | bit)
                }
                None => 0,
            })
            .collect()
    }

    fn build(classes: &[u8]) -> Vec<u8> {
        let mut index = Vec::with_capacity(BLOCKS * 2);
        let mut blocks: Vec<&[u8]> = Vec::new();
        for chunk in classes.chunks(BLOCK) {
            let n = match blocks.iter().position(|b| *b == chunk) {
                Some(n) => n,
                None => {
                    blocks.push(chunk);
                    blocks.len() - 1
                }
            };
            index.extend_from_slice(&(n as u16).to_le_bytes());
        }
        index.extend(blocks.concat());
        index
    }

    #[test]
    fn table_matches_onig_on_every_code_point() {
        let expected = from_onig();
        if let Ok(path) = std::env::var("PREP_WRITE_UNICODE_TABLE") {
            std::fs::write(path, build(&expected)).unwrap();
            return;
        }
        for (cp, &want) in expected.iter().enumerate() {
            if let Some(c) = char::from_u32(cp as u32) {
                assert_eq!(class(c), want, "U+{cp:04X}");
            }
        }
    }

    #[test]
    fn case_folding_matches_onig() {
        let mut buf = [0u8; 4];
        for x in *b"stmdrvel" {
            let r = onig::Regex::new(&format!(r"\A(?i:{})\z", x as char)).unwrap();
            for c in (0..0x11_0000u32).filter_map(char::from_u32) {
                assert_eq!(
                    eq_ignore_case(c, x),
                    r.is_match(c.encode_utf8(&mut buf)),
                    "(?i:{}) on U+{:04X}",
                    x as char,
                    c as u32
                );
            }
        }
    }
}
