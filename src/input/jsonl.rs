//! JSON Lines input.
//!
//! Reading ([`JsonlSource`]) only splits lines; parsing ([`extract_text`])
//! runs later, on the worker threads, and builds no JSON tree: it walks the
//! top-level object with a visitor that skips every field but the wanted one
//! and captures that one as raw JSON text.

use std::borrow::Cow;
use std::fmt;
use std::fs::File;
use std::io::{BufRead, BufReader, Read};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use serde::de::{self, Deserializer as _, IgnoredAny, MapAccess, Visitor};
use serde::Deserialize;
use serde_json::value::RawValue;

use super::{Compression, DocError, InputError, Location, Payload, TextKey};

/// Read buffer size: large reads keep the decompressors and syscalls cheap.
const BUF_SIZE: usize = 1 << 20;

/// Above this capacity the line buffer is given back after a long line, so
/// that one huge line does not pin its memory for the rest of the file.
const KEEP_LINE_CAPACITY: usize = 4 << 20;

/// An open JSONL file, handing out its non-blank lines one at a time.
pub(crate) struct JsonlSource {
    path: PathBuf,
    reader: BufReader<Box<dyn Read + Send>>,
    /// Number of lines read so far, blank ones included.
    line: u64,
    /// Reused between lines; each document gets an exact-size copy, so a
    /// batch's memory is its payload bytes, not a doubling buffer's capacity.
    scratch: Vec<u8>,
}

impl JsonlSource {
    /// Opens `path`, decompressing as `compression` says; compressed bytes
    /// read from disk are added to `progress`.
    pub(crate) fn open(
        path: &Path,
        compression: Compression,
        progress: Arc<AtomicU64>,
    ) -> Result<JsonlSource, InputError> {
        let open_error = |source| InputError::Open {
            path: path.to_owned(),
            source,
        };
        let file = File::open(path).map_err(open_error)?;
        let counted = CountingReader {
            inner: file,
            progress,
        };
        let decoded: Box<dyn Read + Send> = match compression {
            Compression::None => Box::new(counted),
            // Multi-member: `cat a.gz b.gz` and bgzip files are valid gzip.
            Compression::Gzip => Box::new(flate2::read::MultiGzDecoder::new(counted)),
            Compression::Zstd => {
                Box::new(zstd::stream::read::Decoder::new(counted).map_err(open_error)?)
            }
        };
        Ok(JsonlSource {
            path: path.to_owned(),
            reader: BufReader::with_capacity(BUF_SIZE, decoded),
            line: 0,
            scratch: Vec::new(),
        })
    }

    /// The next non-blank line, without its `\n` or `\r\n`, or `None` at the
    /// end of the file. Lines holding only JSON whitespace are not documents:
    /// they are skipped, but still counted in the line numbers.
    pub(crate) fn next_doc(&mut self) -> Result<Option<(Location, Payload)>, InputError> {
        loop {
            self.scratch.clear();
            if self.scratch.capacity() > KEEP_LINE_CAPACITY {
                self.scratch = Vec::new();
            }
            let read = self
                .reader
                .read_until(b'\n', &mut self.scratch)
                .map_err(|source| InputError::Read {
                    path: self.path.clone(),
                    line: self.line + 1,
                    source,
                })?;
            if read == 0 {
                return Ok(None);
            }
            self.line += 1;
            let mut line = self.scratch.as_slice();
            if let Some(rest) = line.strip_suffix(b"\n") {
                line = rest;
            }
            if let Some(rest) = line.strip_suffix(b"\r") {
                line = rest;
            }
            if line.iter().all(|&b| is_json_whitespace(b)) {
                continue;
            }
            return Ok(Some((
                Location::Line(self.line),
                Payload::Json(line.to_vec()),
            )));
        }
    }
}

/// Counts the bytes read from the file itself, before decompression.
struct CountingReader<R> {
    inner: R,
    progress: Arc<AtomicU64>,
}

impl<R: Read> Read for CountingReader<R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.progress.fetch_add(n as u64, Ordering::Relaxed);
        Ok(n)
    }
}

/// The four bytes JSON allows between tokens.
fn is_json_whitespace(b: u8) -> bool {
    matches!(b, b' ' | b'\t' | b'\r' | b'\n')
}

/// See [`super::extract_text`].
pub(crate) fn extract_text<'a>(line: &'a [u8], key: &TextKey) -> Result<Cow<'a, str>, DocError> {
    let text = std::str::from_utf8(line).map_err(|e| DocError::InvalidUtf8 {
        offset: e.valid_up_to(),
    })?;
    let first = text.bytes().find(|&b| !is_json_whitespace(b));
    if first != Some(b'{') {
        // Rare, so it is fine to parse twice: once to tell a malformed line
        // from a well-formed non-object, which get different messages.
        return Err(match serde_json::from_str::<IgnoredAny>(text) {
            Err(e) => malformed(&e, 0),
            Ok(_) => DocError::NotAnObject {
                found: kind_of(first.unwrap_or(b'n')),
            },
        });
    }

    let dotted = key.as_str();
    let parts = key.parts();
    // The object being searched, and where it starts in the line (for columns).
    let mut object = text;
    let mut offset = 0;
    // Where the not-yet-followed part of the dotted key starts.
    let mut rest_start = 0;
    for (depth, head) in parts.iter().enumerate() {
        let rest = &dotted[rest_start..];
        let is_last = depth + 1 == parts.len();
        let head = (!is_last).then_some(head.as_str());
        let mut de = serde_json::Deserializer::from_str(object);
        let found = de
            .deserialize_map(FieldsVisitor { whole: rest, head })
            .and_then(|found| de.end().map(|()| found))
            .map_err(|e| malformed(&e, offset))?;
        if let Some(value) = found.whole {
            return leaf(value, text, key);
        }
        let (Some(head), Some(value)) = (head, found.head) else {
            return Err(DocError::MissingField {
                key: dotted.to_owned(),
            });
        };
        let field_end = rest_start + head.len();
        let first = value.get().as_bytes().first().copied().unwrap_or(b'n');
        if first != b'{' {
            return Err(DocError::NotAnObjectField {
                field: dotted[..field_end].to_owned(),
                key: dotted.to_owned(),
                found: kind_of(first),
            });
        }
        object = value.get();
        offset = offset_in(text, object);
        rest_start = field_end + 1;
    }
    // The last part is always looked up as `whole`, so the loop returns.
    Err(DocError::MissingField {
        key: dotted.to_owned(),
    })
}

/// Turns the raw JSON value found at the key into its text.
fn leaf<'a>(value: &'a RawValue, line: &'a str, key: &TextKey) -> Result<Cow<'a, str>, DocError> {
    let raw = value.get();
    match raw.as_bytes().first().copied().unwrap_or(b'n') {
        b'"' => {}
        b'n' => {
            return Err(DocError::Null {
                key: key.as_str().to_owned(),
            })
        }
        other => {
            return Err(DocError::NotAString {
                key: key.as_str().to_owned(),
                found: kind_of(other),
            })
        }
    }
    let mut de = serde_json::Deserializer::from_str(raw);
    StrCow::deserialize(&mut de).map(|s| s.0).map_err(|e| {
        // The skipping pass already checked the string's syntax except for
        // surrogate pairing, which only decoding it checks.
        let offset = offset_in(line, raw);
        let message = e.to_string();
        if message.contains("surrogate") || message.contains("hex escape") {
            DocError::LoneSurrogate {
                column: offset + e.column(),
            }
        } else {
            malformed(&e, offset)
        }
    })
}

/// Byte offset of `inner`, a slice of `outer`, within it.
fn offset_in(outer: &str, inner: &str) -> usize {
    (inner.as_ptr() as usize).saturating_sub(outer.as_ptr() as usize)
}

/// A serde_json error as a [`DocError::Malformed`], its column counted from
/// the start of the line rather than of the slice parsed (`offset` bytes in).
fn malformed(e: &serde_json::Error, offset: usize) -> DocError {
    // serde_json's message carries its own position; we report ours instead.
    let full = e.to_string();
    let suffix = format!(" at line {} column {}", e.line(), e.column());
    let message = full.strip_suffix(&suffix).unwrap_or(&full).to_owned();
    DocError::Malformed {
        message,
        column: offset + e.column(),
    }
}

/// What a JSON value is, from its first byte, for messages: `a number`.
fn kind_of(first: u8) -> &'static str {
    match first {
        b'{' => "an object",
        b'[' => "an array",
        b'"' => "a string",
        b't' | b'f' => "a boolean",
        b'n' => "null",
        _ => "a number",
    }
}

/// The raw values of the fields sought in one object.
struct Found<'a> {
    /// The field named by the whole remaining key.
    whole: Option<&'a RawValue>,
    /// The field named by the first part of the remaining key.
    head: Option<&'a RawValue>,
}

/// Walks one object, capturing the wanted fields and skipping the rest.
/// A later occurrence of a key replaces an earlier one.
struct FieldsVisitor<'k> {
    whole: &'k str,
    head: Option<&'k str>,
}

impl<'de> Visitor<'de> for FieldsVisitor<'_> {
    type Value = Found<'de>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a JSON object")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Found<'de>, A::Error> {
        let mut found = Found {
            whole: None,
            head: None,
        };
        while let Some(name) = map.next_key::<StrCow<'de>>()? {
            if name.0 == self.whole {
                found.whole = Some(map.next_value()?);
            } else if Some(&*name.0) == self.head {
                found.head = Some(map.next_value()?);
            } else {
                map.next_value::<IgnoredAny>()?;
            }
        }
        Ok(found)
    }
}

/// A JSON string, borrowed from the input when it has no escapes.
/// (`Cow<str>`'s own `Deserialize` always allocates.)
struct StrCow<'a>(Cow<'a, str>);

impl<'de> Deserialize<'de> for StrCow<'de> {
    fn deserialize<D: de::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct StrCowVisitor;

        impl<'de> Visitor<'de> for StrCowVisitor {
            type Value = StrCow<'de>;

            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a string")
            }

            fn visit_borrowed_str<E: de::Error>(self, v: &'de str) -> Result<StrCow<'de>, E> {
                Ok(StrCow(Cow::Borrowed(v)))
            }

            fn visit_str<E: de::Error>(self, v: &str) -> Result<StrCow<'de>, E> {
                Ok(StrCow(Cow::Owned(v.to_owned())))
            }

            fn visit_string<E: de::Error>(self, v: String) -> Result<StrCow<'de>, E> {
                Ok(StrCow(Cow::Owned(v)))
            }
        }

        deserializer.deserialize_str(StrCowVisitor)
    }
}

