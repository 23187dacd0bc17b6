//! `{% generation %}...{% endgeneration %}`, transformers' tag around the
//! assistant's text, which minijinja does not know.
//!
//! Each tag is rewritten in place to a filter block (`{%- generation %}` to
//! `{%- filter __prep_generation %}`, its end to `{% endfilter %}`), keeping
//! its delimiters and their `-`/`+` markers, so that the whitespace around it
//! is trimmed exactly as Jinja2 trims it around the original tag. The filter
//! wraps the block's output in two reserved characters, [`START`] and
//! [`END`], which [`extract_spans`] removes after rendering, noting where
//! they stood.
//!
//! transformers reports a block at `len(output so far)`, the length of the
//! top-level output already produced when the block ends. Inside a macro, a
//! call block, a filter block, a `{% set %}` block or a recursive loop,
//! Jinja2 buffers output, and that length is not where the block lands.
//! prep does not copy those offsets: a generation block there is rewritten to
//! a filter that fails ([`BUFFERED_FILTER`]). A generation block inside
//! another is reported as transformers reports it (see [`extract_spans`]).

use std::ops::Range;

/// Opens a generation block's output in the rendered text.
pub const START: char = '\u{FDD0}';
/// Closes a generation block's output in the rendered text.
pub const END: char = '\u{FDD1}';

/// The filter a top-level generation block becomes.
pub(crate) const FILTER: &str = "__prep_generation";
/// The filter a generation block inside buffered output becomes.
pub(crate) const BUFFERED_FILTER: &str = "__prep_generation_buffered";

/// A template source with its generation tags rewritten.
pub(crate) struct Rewritten {
    /// The source minijinja compiles.
    pub source: String,
    /// Whether there was any `{% generation %}` tag.
    pub has_generation: bool,
}

/// The open blocks that matter: loops (buffered when recursive) and the
/// blocks whose output Jinja2 always buffers.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Block {
    For { recursive: bool },
    Buffered(&'static str),
}

/// Rewrites the generation tags of `source` (see the module docs).
pub(crate) fn rewrite(source: &str) -> Result<Rewritten, String> {
    let mut out = String::with_capacity(source.len() + 64);
    let mut stack: Vec<Block> = Vec::new();
    let mut has_generation = false;
    let mut pos = 0;
    let bytes = source.as_bytes();
    while let Some(off) = source[pos..].find('{') {
        let open = pos + off;
        match bytes.get(open + 1) {
            Some(b'#') => {
                let end = source[open + 2..]
                    .find("#}")
                    .map(|i| open + 2 + i + 2)
                    .ok_or_else(|| "unterminated comment".to_owned())?;
                out.push_str(&source[pos..end]);
                pos = end;
            }
            Some(b'{') => {
                let end = tag_end(source, open + 2, "}}")?;
                out.push_str(&source[pos..end]);
                pos = end;
            }
            Some(b'%') => {
                let end = tag_end(source, open + 2, "%}")?;
                let (inner_start, inner_end) = tag_inner(source, open, end);
                let inner = &source[inner_start..inner_end];
                let words: Vec<&str> = inner.split_whitespace().collect();
                out.push_str(&source[pos..inner_start]);
                match words.first().copied().unwrap_or("") {
                    "raw" => {
                        // Jinja2 does not apply trim_blocks to the newline
                        // after `{% raw %}`: `+%}` keeps it in minijinja.
                        let raw_end = find_endraw(source, end)?;
                        out.push_str(&source[inner_start..inner_end]);
                        out.push_str(if &source[inner_end..end] == "%}" {
                            "+%}"
                        } else {
                            &source[inner_end..end]
                        });
                        out.push_str(&source[end..raw_end]);
                        pos = raw_end;
                        continue;
                    }
                    "generation" | "generation:" if is_bare(&words, "generation") => {
                        has_generation = true;
                        let buffered = stack.iter().any(|b| {
                            matches!(b, Block::Buffered(_) | Block::For { recursive: true })
                        });
                        let filter = if buffered { BUFFERED_FILTER } else { FILTER };
                        out.push_str(&format!(" filter {filter} "));
                    }
                    "endgeneration" if words.len() == 1 => out.push_str(" endfilter "),
                    first => {
                        track(&mut stack, first, &words, inner);
                        out.push_str(inner);
                    }
                }
                out.push_str(&source[inner_end..end]);
                pos = end;
            }
            _ => {
                out.push_str(&source[pos..open + 1]);
                pos = open + 1;
            }
        }
    }
    out.push_str(&source[pos..]);
    Ok(Rewritten {
        source: out,
        has_generation,
    })
}

/// Whether a tag's words are `generation` alone (Jinja2 also takes a colon).
fn is_bare(words: &[&str], name: &str) -> bool {
    match words {
        [w] => *w == name || w.strip_suffix(':') == Some(name),
        [w, ":"] => *w == name,
        _ => false,
    }
}

/// Keeps the stack of open blocks whose output Jinja2 buffers.
fn track(stack: &mut Vec<Block>, first: &str, words: &[&str], inner: &str) {
    match first {
        "for" => stack.push(Block::For {
            recursive: words.last() == Some(&"recursive"),
        }),
        "macro" => stack.push(Block::Buffered("macro")),
        "call" | "call(" => stack.push(Block::Buffered("call")),
        "filter" => stack.push(Block::Buffered("filter")),
        // `{% set x %}...{% endset %}` captures; `{% set x = ... %}` does not.
        "set" if !has_assignment(inner) => stack.push(Block::Buffered("set")),
        "endfor" => pop(stack, |b| matches!(b, Block::For { .. })),
        "endmacro" => pop(stack, |b| b == Block::Buffered("macro")),
        "endcall" => pop(stack, |b| b == Block::Buffered("call")),
        "endfilter" => pop(stack, |b| b == Block::Buffered("filter")),
        "endset" => pop(stack, |b| b == Block::Buffered("set")),
        _ => {}
    }
}

fn pop(stack: &mut Vec<Block>, is: impl Fn(Block) -> bool) {
    if stack.last().is_some_and(|&b| is(b)) {
        stack.pop();
    }
}

/// Whether a `set` tag assigns (`=` outside strings, not part of `==`,
/// `!=`, `<=` or `>=`).
fn has_assignment(inner: &str) -> bool {
    let b = inner.as_bytes();
    let mut quote = None;
    let mut i = 0;
    while i < b.len() {
        let c = b[i];
        match quote {
            Some(q) => {
                if c == b'\\' {
                    i += 1;
                } else if c == q {
                    quote = None;
                }
            }
            None => match c {
                b'\'' | b'"' => quote = Some(c),
                b'=' => {
                    let prev = i.checked_sub(1).map(|j| b[j]);
                    let next = b.get(i + 1).copied();
                    if next != Some(b'=') && !matches!(prev, Some(b'=' | b'!' | b'<' | b'>')) {
                        return true;
                    }
                    if next == Some(b'=') {
                        i += 1;
                    }
                }
                _ => {}
            },
        }
        i += 1;
    }
    false
}

/// The end (after `close`) of a tag whose content starts at `from`: the
/// first `close` outside string literals and open brackets, as Jinja2's
/// lexer finds it.
fn tag_end(source: &str, from: usize, close: &str) -> Result<usize, String> {
    let b = source.as_bytes();
    let mut depth = 0usize;
    let mut i = from;
    while i < b.len() {
        if depth == 0 && source[i..].starts_with(close) {
            return Ok(i + close.len());
        }
        let c = b[i];
        match c {
            b'\'' | b'"' => {
                i += 1;
                while i < b.len() && b[i] != c {
                    if b[i] == b'\\' {
                        i += 1;
                    }
                    i += 1;
                }
            }
            b'(' | b'[' | b'{' => depth += 1,
            b')' | b']' | b'}' => depth = depth.saturating_sub(1),
            _ => {}
        }
        i += 1;
    }
    Err(format!("a tag opened at byte {} is never closed", from - 2))
}

/// The content of the tag `source[open..end]` without its delimiters and
/// their `-`/`+` markers.
fn tag_inner(source: &str, open: usize, end: usize) -> (usize, usize) {
    let mut start = open + 2;
    let mut stop = end - 2;
    if start < stop && matches!(source.as_bytes()[start], b'-' | b'+') {
        start += 1;
    }
    if stop > start && matches!(source.as_bytes()[stop - 1], b'-' | b'+') {
        stop -= 1;
    }
    (start, stop)
}

/// The end of the `{% endraw %}` tag after a `{% raw %}` tag ending at `from`.
fn find_endraw(source: &str, from: usize) -> Result<usize, String> {
    let mut pos = from;
    while let Some(off) = source[pos..].find("{%") {
        let open = pos + off;
        let Some(close) = source[open..].find("%}").map(|i| open + i + 2) else {
            break;
        };
        let (s, e) = tag_inner(source, open, close);
        if source[s..e].trim() == "endraw" {
            return Ok(close);
        }
        pos = open + 2;
    }
    Err("a {% raw %} block is never closed".to_owned())
}

/// Removes the markers from `text` and returns the spans transformers
/// reports for the generation blocks, as byte ranges of the text without
/// them, in the order transformers lists them (a block inside another comes
/// first, when it ends).
///
/// A top-level block's span is its output. For a block inside another,
/// transformers counts from where the outermost block starts (all it has of
/// the output so far) and runs for the inner block's length; that is copied.
pub(crate) fn extract_spans(text: &str) -> Result<(String, Vec<Range<usize>>), String> {
    let mut out = String::with_capacity(text.len());
    // Spans in characters first, as Python counts them.
    let mut chars = 0usize;
    let mut open: Vec<usize> = Vec::new();
    let mut spans: Vec<(usize, usize)> = Vec::new();
    for c in text.chars() {
        match c {
            START => open.push(chars),
            END => {
                let start = open
                    .pop()
                    .ok_or_else(|| "a generation block closes that never opened".to_owned())?;
                let len = chars - start;
                let base = open.first().copied().unwrap_or(start);
                spans.push((base, base + len));
            }
            c => {
                out.push(c);
                chars += 1;
            }
        }
    }
    if !open.is_empty() {
        return Err("a generation block never closes".to_owned());
    }
    // Characters to bytes, in one pass over the text (spans may overlap).
    let mut offsets: Vec<usize> = out.char_indices().map(|(i, _)| i).collect();
    offsets.push(out.len());
    let spans = spans
        .into_iter()
        .map(|(s, e)| offsets[s]..offsets[e])
        .collect();
    Ok((out, spans))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rewrites_only_real_tags() {
        let src = "{#- {% generation %} -#}{{ '{% generation %}' }}{%- generation -%}x{%+ endgeneration +%}{% raw %}{% generation %}{% endraw %}";
        let r = rewrite(src).unwrap();
        assert_eq!(
            r.source,
            "{#- {% generation %} -#}{{ '{% generation %}' }}{%- filter __prep_generation -%}x{%+ endfilter +%}{% raw +%}{% generation %}{% endraw %}"
        );
        assert!(r.has_generation);
        assert!(!rewrite("{{ {'a': {'b': 1}} }}").unwrap().has_generation);
    }

    #[test]
    fn generation_in_buffered_output_is_marked() {
        for src in [
            "{% macro m() %}{% generation %}x{% endgeneration %}{% endmacro %}",
            "{% set x %}{% generation %}x{% endgeneration %}{% endset %}",
            "{% for a in b recursive %}{% generation %}x{% endgeneration %}{% endfor %}",
        ] {
            assert!(
                rewrite(src).unwrap().source.contains(BUFFERED_FILTER),
                "{src}"
            );
        }
        for src in [
            "{% set x = 1 %}{% generation %}x{% endgeneration %}",
            "{% for a in b %}{% generation %}x{% endgeneration %}{% endfor %}",
            "{% set x %}y{% endset %}{% generation %}x{% endgeneration %}",
        ] {
            assert!(
                !rewrite(src).unwrap().source.contains(BUFFERED_FILTER),
                "{src}"
            );
        }
    }

    #[test]
    fn spans_as_transformers_counts_them() {
        let text = format!("ab{START}cé{END}d{START}x{START}yz{END}w{END}");
        let (out, spans) = extract_spans(&text).unwrap();
        assert_eq!(out, "abcédxyzw");
        // Outer block "xyzw" starts at char 5; the inner one is reported
        // from there for its length of 2, before the outer one.
        assert_eq!(spans, vec![2..5, 6..8, 6..10]);
    }
}
