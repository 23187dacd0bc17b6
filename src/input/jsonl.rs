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

/// The UTF-8 encoding of U+FEFF, the byte-order mark.
const UTF8_BOM: &[u8] = b"\xEF\xBB\xBF";

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
    /// Byte offset of the next line (plain files).
    pos: u64,
    /// Reading a slice of a plain file: lines starting at or past this
    /// offset belong to the next part.
    end: Option<u64>,
    /// The offset of the first line read when it is not the file's first:
    /// line numbers then count from it until an error needs them whole.
    first_line_at: Option<u64>,
    /// Where the reading stands in a file that is one JSON array of
    /// documents; `None` for JSON Lines.
    array: Option<ArrayState>,
}

/// Reading one JSON array of documents ([`JsonlSource::open`]).
#[derive(Debug, Default)]
struct ArrayState {
    /// Elements handed out so far.
    elements: u64,
    /// The closing `]` has been read (and nothing but whitespace after it).
    ended: bool,
}

impl JsonlSource {
    /// Opens `path`, decompressing as `compression` says; compressed bytes
    /// read from disk are added to `progress`.
    ///
    /// With `range` (plain files only), only the lines that start at a byte
    /// offset in it are read (see [`fn@super::share`]).
    ///
    /// A `.json` file (plain or compressed) whose first byte after a
    /// byte-order mark and whitespace is `[` is one JSON array whose
    /// elements are the documents, as Hugging Face `datasets`' json loader
    /// and the instruction-tuning files it reads (Alpaca, LLaMA-Factory)
    /// have it; it is read element by element, never whole. Any other file
    /// is JSON Lines, so a `.jsonl` line may still be a bare array of chat
    /// messages. [`fn@super::share`] never slices an array file.
    pub(crate) fn open(
        path: &Path,
        compression: Compression,
        range: Option<std::ops::Range<u64>>,
        progress: Arc<AtomicU64>,
    ) -> Result<JsonlSource, InputError> {
        let open_error = |source| InputError::Open {
            path: path.to_owned(),
            cause: source,
        };
        let mut pos = 0;
        let raw: Box<dyn Read + Send> = match super::remote(path)? {
            // An object in storage: ranged GETs from the slice's start, the
            // rest of the line that straddles it skipped as on disk.
            Some((object, size)) => {
                let from = range.as_ref().map_or(0, |r| r.start.min(size));
                let mut reader = object.reader(from.saturating_sub(1), size);
                if from > 0 {
                    pos = skip_line(&mut reader, from - 1).map_err(open_error)?;
                }
                Box::new(reader)
            }
            None => {
                let mut file = File::open(path).map_err(open_error)?;
                if let Some(range) = &range {
                    debug_assert_eq!(
                        compression,
                        Compression::None,
                        "only plain files are sliced"
                    );
                    pos = super::share::seek_to_line(&mut file, range.start).map_err(open_error)?;
                }
                Box::new(file)
            }
        };
        let counted = CountingReader {
            inner: raw,
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
        JsonlSource::over(path, decoded, pos, range.map(|r| r.end))
    }

    /// A source reading `decoded`, the file's text from byte `pos` on (up
    /// to the lines that start before `end`, for a slice).
    fn over(
        path: &Path,
        decoded: Box<dyn Read + Send>,
        pos: u64,
        end: Option<u64>,
    ) -> Result<JsonlSource, InputError> {
        let may_be_array = end.is_none() && pos == 0 && is_json_name(path);
        let (decoded, pos) = if may_be_array {
            let (decoded, bom) = skip_bom(decoded).map_err(|cause| InputError::Read {
                path: path.to_owned(),
                line: 1,
                cause,
            })?;
            (decoded, bom)
        } else {
            (decoded, pos)
        };
        let mut source = JsonlSource {
            path: path.to_owned(),
            reader: BufReader::with_capacity(BUF_SIZE, decoded),
            line: 0,
            scratch: Vec::new(),
            pos,
            end,
            first_line_at: (pos > 0 && !may_be_array).then_some(pos),
            array: None,
        };
        if may_be_array {
            source.start_array().map_err(|e| source.read_error(e))?;
        }
        Ok(source)
    }

    /// Reads past whitespace and, where a `[` follows, past it too, into
    /// array reading. Whatever is read is counted in the line numbers and
    /// offsets as JSON Lines reading would count it.
    fn start_array(&mut self) -> std::io::Result<()> {
        if self.skip_whitespace()? == Some(b'[') {
            self.reader.consume(1);
            self.pos += 1;
            self.array = Some(ArrayState::default());
        }
        Ok(())
    }

    /// Reads past JSON whitespace, counting lines, and returns the byte
    /// after it without reading it; `None` at the end of the file.
    fn skip_whitespace(&mut self) -> std::io::Result<Option<u8>> {
        loop {
            let buf = self.reader.fill_buf()?;
            if buf.is_empty() {
                return Ok(None);
            }
            let n = buf.iter().take_while(|&&b| is_json_whitespace(b)).count();
            let lines = buf[..n].iter().filter(|&&b| b == b'\n').count();
            let after = buf.get(n).copied();
            self.reader.consume(n);
            self.line += lines as u64;
            self.pos += n as u64;
            if after.is_some() {
                return Ok(after);
            }
        }
    }

    /// An error at the line being read.
    fn read_error(&self, cause: std::io::Error) -> InputError {
        InputError::Read {
            path: self.path.clone(),
            line: self.line + 1,
            cause,
        }
    }

    /// A malformed array, at the line being read.
    fn array_error(&self, what: String) -> InputError {
        InputError::JsonArray {
            path: self.path.clone(),
            line: self.line + 1,
            what,
        }
    }

    /// The next non-blank line, without its `\n` or `\r\n`, or `None` at the
    /// end of the file. Lines holding only JSON whitespace are not documents:
    /// they are skipped, but still counted in the line numbers.
    pub(crate) fn next_doc(&mut self) -> Result<Option<(Location, Payload)>, InputError> {
        if self.array.is_some() {
            return self.next_element();
        }
        loop {
            if self.end.is_some_and(|end| self.pos >= end) {
                return Ok(None);
            }
            self.scratch.clear();
            if self.scratch.capacity() > KEEP_LINE_CAPACITY {
                self.scratch = Vec::new();
            }
            let read = match self.reader.read_until(b'\n', &mut self.scratch) {
                Ok(read) => read,
                Err(source) => {
                    let line = match self.location(self.line + 1) {
                        Location::Line(line) => line,
                        other => super::resolve_location(&self.path, other).line_or(self.line + 1),
                    };
                    return Err(InputError::Read {
                        path: self.path.clone(),
                        line,
                        cause: source,
                    });
                }
            };
            if read == 0 {
                return Ok(None);
            }
            self.pos += read as u64;
            self.line += 1;
            let mut line = self.scratch.as_slice();
            if let Some(rest) = line.strip_suffix(b"\n") {
                line = rest;
            }
            if let Some(rest) = line.strip_suffix(b"\r") {
                line = rest;
            }
            // A UTF-8 byte-order mark (Windows tools write one) is not part
            // of the first document, as Python's utf-8-sig and most JSON
            // readers agree; only the file's first line can start with one.
            if self.line == 1 && self.first_line_at.is_none() {
                if let Some(rest) = line.strip_prefix(UTF8_BOM) {
                    line = rest;
                }
            }
            if line.iter().all(|&b| is_json_whitespace(b)) {
                continue;
            }
            return Ok(Some((
                self.location(self.line),
                Payload::Json(line.to_vec()),
            )));
        }
    }

    /// The next element of an array file, or `None` after its `]`.
    fn next_element(&mut self) -> Result<Option<(Location, Payload)>, InputError> {
        let state = self.array.as_ref().expect("reading an array");
        if state.ended {
            return Ok(None);
        }
        let elements = state.elements;
        let unclosed = || "the file ends inside its JSON array (no closing `]`)".to_owned();
        // Between elements: `,` before every element but the first, `]` at the end.
        let mut next = self.skip_whitespace().map_err(|e| self.read_error(e))?;
        match next {
            Some(b']') => {
                self.reader.consume(1);
                self.pos += 1;
                return self.end_array().map(|()| None);
            }
            Some(b',') if elements > 0 => {
                self.reader.consume(1);
                self.pos += 1;
                next = self.skip_whitespace().map_err(|e| self.read_error(e))?;
            }
            Some(_) if elements == 0 => {}
            Some(other) => {
                return Err(self.array_error(format!(
                    "expected `,` or `]` after element {} of the JSON array, found {}",
                    elements - 1,
                    shown(other)
                )))
            }
            None => return Err(self.array_error(unclosed())),
        }
        match next {
            None => return Err(self.array_error(unclosed())),
            Some(b @ (b',' | b']')) => {
                return Err(self.array_error(format!(
                    "expected element {elements} of the JSON array, found {}",
                    shown(b)
                )))
            }
            Some(_) => {}
        }
        let line = self.line + 1;
        self.scratch.clear();
        if self.scratch.capacity() > KEEP_LINE_CAPACITY {
            self.scratch = Vec::new();
        }
        let mut scan = ValueScan::default();
        loop {
            let buf = match self.reader.fill_buf() {
                Ok(buf) => buf,
                Err(cause) => return Err(self.read_error(cause)),
            };
            if buf.is_empty() {
                return Err(self.array_error(unclosed()));
            }
            let (end, lines) = scan.feed(buf, &mut self.scratch);
            let used = end.unwrap_or(buf.len());
            self.reader.consume(used);
            self.line += lines;
            self.pos += used as u64;
            if end.is_some() {
                break;
            }
        }
        self.array.as_mut().expect("reading an array").elements += 1;
        Ok(Some((
            Location::Element {
                line,
                index: elements,
            },
            Payload::Json(self.scratch.to_vec()),
        )))
    }

    /// After the array's `]`: only whitespace may follow.
    fn end_array(&mut self) -> Result<(), InputError> {
        let closed_on = self.line + 1;
        if let Some(b) = self.skip_whitespace().map_err(|e| self.read_error(e))? {
            return Err(self.array_error(format!(
                "{} after the JSON array that closes on line {closed_on}: a .json file \
                 holds one JSON array of documents, or one document a line \
                 (name it .jsonl to read each line as a document)",
                shown(b)
            )));
        }
        self.array.as_mut().expect("reading an array").ended = true;
        Ok(())
    }

    /// Where line `line` (counted from the first line read) is.
    fn location(&self, line: u64) -> Location {
        match self.first_line_at {
            None => Location::Line(line),
            Some(start) => Location::LineFrom { start, line },
        }
    }
}

/// Reads `reader`, positioned at byte `at`, up to and including the next
/// `\n` (or its end) one byte at a time, so that nothing past it is
/// consumed; returns the offset after it. Only the part of a line that a
/// slice boundary cuts is read this way.
fn skip_line(reader: &mut impl Read, at: u64) -> std::io::Result<u64> {
    let mut at = at;
    let mut byte = [0u8; 1];
    loop {
        if reader.read(&mut byte)? == 0 {
            return Ok(at);
        }
        at += 1;
        if byte[0] == b'\n' {
            return Ok(at);
        }
    }
}

/// `decoded` past a UTF-8 byte-order mark at its start, and the mark's
/// length (0 without one); the bytes read to look are given back otherwise.
fn skip_bom(mut decoded: Box<dyn Read + Send>) -> std::io::Result<(Box<dyn Read + Send>, u64)> {
    let mut first = [0u8; 3];
    let mut n = 0;
    while n < first.len() {
        match decoded.read(&mut first[n..]) {
            Ok(0) => break,
            Ok(k) => n += k,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    if first[..n] == *UTF8_BOM {
        return Ok((decoded, UTF8_BOM.len() as u64));
    }
    let given_back = std::io::Cursor::new(first[..n].to_vec());
    Ok((Box::new(given_back.chain(decoded)), 0))
}

/// Whether a file's name says JSON (`.json`, `.json.gz`, `.json.zst`, in
/// any case) rather than JSON Lines: only such a file may be one array.
fn is_json_name(path: &Path) -> bool {
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().to_ascii_lowercase())
        .unwrap_or_default();
    let stem = name
        .strip_suffix(".gz")
        .or_else(|| name.strip_suffix(".zst"))
        .unwrap_or(&name);
    stem.ends_with(".json")
}

/// Whether `path`, a plain file, is one JSON array of documents (see
/// [`JsonlSource::open`]): it is then read whole by one part of a
/// partitioned run, never from a line in its middle.
pub(crate) fn is_array_file(path: &Path) -> Result<bool, InputError> {
    if !is_json_name(path) {
        return Ok(false);
    }
    let source = JsonlSource::open(path, Compression::None, None, Arc::default())?;
    Ok(source.array.is_some())
}

/// A byte as an error message shows it: `\`x\``, or its value.
fn shown(b: u8) -> String {
    if b.is_ascii_graphic() {
        format!("`{}`", b as char)
    } else {
        format!("byte 0x{b:02x}")
    }
}

/// Finds where one JSON value ends in bytes that arrive in pieces, without
/// parsing it: strings (with their escapes) and the depth of brackets are
/// tracked, and the value is whatever lies up to the bracket or quote that
/// closes it (a bare number or word ends at whitespace, `,` or `]`).
/// Parsing it is left to [`extract_text`], as for a line.
#[derive(Debug, Default)]
struct ValueScan {
    depth: u32,
    in_string: bool,
    escaped: bool,
}

impl ValueScan {
    /// Appends to `out` the bytes of `bytes` that belong to the value,
    /// with each line break outside its strings made a space, so that the
    /// element reads as one line (JSON allows no raw line break inside a
    /// string; one there stays, and is malformed as it was). Returns where
    /// the value ended in `bytes` (`None`: it goes on) and the line breaks
    /// passed.
    fn feed(&mut self, bytes: &[u8], out: &mut Vec<u8>) -> (Option<usize>, u64) {
        let mut lines = 0;
        let mut breaks = Vec::new();
        let mut end = None;
        for (i, &b) in bytes.iter().enumerate() {
            if self.in_string {
                if b == b'\n' {
                    lines += 1;
                }
                if self.escaped {
                    self.escaped = false;
                } else if b == b'\\' {
                    self.escaped = true;
                } else if b == b'"' {
                    self.in_string = false;
                    if self.depth == 0 {
                        end = Some(i + 1);
                        break;
                    }
                }
                continue;
            }
            match b {
                b'"' => self.in_string = true,
                b'{' | b'[' => self.depth = self.depth.saturating_add(1),
                b'}' | b']' if self.depth > 0 => {
                    self.depth -= 1;
                    if self.depth == 0 {
                        end = Some(i + 1);
                        break;
                    }
                }
                // A bare number or word at the top ends before these.
                b'}' | b']' | b',' | b' ' | b'\t' | b'\r' | b'\n' if self.depth == 0 => {
                    end = Some(i);
                    break;
                }
                b'\n' | b'\r' => {
                    lines += u64::from(b == b'\n');
                    breaks.push(out.len() + i);
                }
                _ => {}
            }
        }
        out.extend_from_slice(&bytes[..end.unwrap_or(bytes.len())]);
        for at in breaks {
            out[at] = b' ';
        }
        (end, lines)
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
    let text = simdutf8::compat::from_utf8(line).map_err(|e| DocError::InvalidUtf8 {
        offset: e.valid_up_to(),
    })?;
    match extract_from_str(text, key) {
        // Python's json.dumps writes NaN and Infinity by default and its
        // json.loads reads them back; serde_json refuses them. Only on that
        // failure is the line rewritten and parsed again.
        Err(err @ DocError::Malformed { .. }) => match replace_non_finite(text) {
            Some(rewritten) => {
                extract_from_str(&rewritten, key).map(|t| Cow::Owned(t.into_owned()))
            }
            None => Err(err),
        },
        other => other,
    }
}

/// [`extract_text`] on a line already known to be UTF-8.
fn extract_from_str<'a>(text: &'a str, key: &TextKey) -> Result<Cow<'a, str>, DocError> {
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
                fields: field_names(object, &dotted[..rest_start]),
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
        fields: Vec::new(),
    })
}

/// The field names of `object` (already parsed once, so valid), each
/// dotted from the top with `prefix`, in the line's order without
/// repeats: what a missing text field's error lists. Runs only on that
/// error, so the search itself never collects names.
fn field_names(object: &str, prefix: &str) -> Vec<String> {
    struct Names;
    impl<'de> Visitor<'de> for Names {
        type Value = Vec<String>;
        fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str("a JSON object")
        }
        fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Vec<String>, A::Error> {
            let mut names: Vec<String> = Vec::new();
            while let Some(name) = map.next_key::<StrCow<'de>>()? {
                map.next_value::<IgnoredAny>()?;
                if !names.iter().any(|n| *n == name.0) {
                    names.push(name.0.into_owned());
                }
            }
            Ok(names)
        }
    }
    let mut de = serde_json::Deserializer::from_str(object);
    de.deserialize_map(Names)
        .unwrap_or_default()
        .into_iter()
        .map(|name| format!("{prefix}{name}"))
        .collect()
}

/// The line with each bare `NaN`, `Infinity` and `-Infinity` value (outside
/// strings, where JSON expects a value) replaced by a number of the same
/// width, `0` and spaces, so columns in later errors stay true; `None` when
/// there is none.
fn replace_non_finite(text: &str) -> Option<String> {
    const TOKENS: [&[u8]; 3] = [b"NaN", b"Infinity", b"-Infinity"];
    let bytes = text.as_bytes();
    let mut out = bytes.to_vec();
    let mut changed = false;
    let mut in_string = false;
    // The last byte outside strings that was not whitespace.
    let mut previous = None;
    let mut i = 0;
    while let Some(&b) = bytes.get(i) {
        if in_string {
            match b {
                b'\\' => i += 1,
                b'"' => in_string = false,
                _ => {}
            }
        } else if b == b'"' {
            in_string = true;
            previous = Some(b);
        } else if !is_json_whitespace(b) {
            let at_value = matches!(previous, None | Some(b':' | b'[' | b','));
            let token = TOKENS.iter().find(|t| bytes[i..].starts_with(t));
            if let (true, Some(token)) = (at_value, token) {
                out[i] = b'0';
                out[i + 1..i + token.len()].fill(b' ');
                changed = true;
                i += token.len() - 1;
            }
            previous = Some(b);
        }
        i += 1;
    }
    // Only ASCII bytes were replaced, by ASCII bytes: still UTF-8.
    changed.then(|| String::from_utf8(out).ok()).flatten()
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
    if let Some(text) = unescape(raw) {
        return Ok(text);
    }
    // A surrogate left unpaired: serde_json words the error.
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

/// The text of `raw`, a JSON string literal whose syntax serde_json's
/// skipping pass has checked (quotes, escapes, hex digits, no control
/// characters): borrowed when it has no escapes, else decoded into one
/// string of the literal's size. `None` where a `\u` escape leaves a UTF-16
/// surrogate unpaired, which that pass does not check.
///
/// serde_json's own decoding grows a scratch buffer by doubling and then
/// copies it into a new string; this finds the escapes with `memchr` and
/// copies each stretch between them once.
fn unescape(raw: &str) -> Option<Cow<'_, str>> {
    let body = raw.strip_prefix('"')?.strip_suffix('"')?;
    let Some(mut at) = memchr::memchr(b'\\', body.as_bytes()) else {
        return Some(Cow::Borrowed(body));
    };
    let mut out = String::with_capacity(body.len());
    let mut rest = body;
    loop {
        out.push_str(&rest[..at]);
        let mut next = at + 2;
        match *rest.as_bytes().get(at + 1)? {
            b'"' => out.push('"'),
            b'\\' => out.push('\\'),
            b'/' => out.push('/'),
            b'b' => out.push('\u{8}'),
            b'f' => out.push('\u{c}'),
            b'n' => out.push('\n'),
            b'r' => out.push('\r'),
            b't' => out.push('\t'),
            b'u' => {
                let hex = |from: usize| {
                    let digits = rest.get(from..from + 4)?;
                    digits
                        .bytes()
                        .all(|b| b.is_ascii_hexdigit())
                        .then(|| u32::from_str_radix(digits, 16).ok())?
                };
                let first = hex(at + 2)?;
                next = at + 6;
                let code = match first {
                    0xD800..=0xDBFF => {
                        if rest.as_bytes().get(next..next + 2)? != b"\\u" {
                            return None;
                        }
                        let second = hex(next + 2)?;
                        if !(0xDC00..=0xDFFF).contains(&second) {
                            return None;
                        }
                        next += 6;
                        0x1_0000 + ((first - 0xD800) << 10) + (second - 0xDC00)
                    }
                    0xDC00..=0xDFFF => return None,
                    _ => first,
                };
                out.push(char::from_u32(code)?);
            }
            _ => return None,
        }
        rest = &rest[next..];
        match memchr::memchr(b'\\', rest.as_bytes()) {
            Some(i) => at = i,
            None => {
                out.push_str(rest);
                return Some(Cow::Owned(out));
            }
        }
    }
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

#[cfg(test)]
mod tests {
    use std::io::Write;

    use proptest::prelude::*;

    use super::*;
    use crate::input::{InputFile, InputKind, RawDoc, Reader};

    fn text(line: &str, key: &str) -> Result<Cow<'static, str>, DocError> {
        let line: &'static [u8] = Box::leak(line.as_bytes().to_vec().into_boxed_slice());
        extract_text(line, &TextKey::parse(key))
    }

    #[test]
    fn plain_text_is_borrowed() {
        let got = text(
            r#"{"id": 1, "text": "hello", "x": [1, {"text": 2}]}"#,
            "text",
        )
        .unwrap();
        assert!(matches!(got, Cow::Borrowed("hello")));
    }

    /// JSON string literals, escapes of every kind among plain text, and
    /// some that are not valid (unpaired surrogates, bad escapes).
    fn literal() -> impl Strategy<Value = String> {
        let piece = prop_oneof![
            4 => "[a-z é中😀]{0,6}",
            1 => any::<char>().prop_map(|c| serde_json::to_string(&c.to_string()).unwrap()
                .trim_matches('"').to_owned()),
            1 => prop::sample::select(vec![
                r"\n", r"\t", r#"\""#, r"\\", r"\/", r"\b", r"\f", r"\r", r"\u00e9",
                r"\u0000", r"\ud83d\ude00", r"\ud83d", r"\ude00", r"\ud83d\u0041",
                r"\ud83d\n", r"\uDBFF\uDFFF", r"\u12", r"\x", r"\",
            ]).prop_map(str::to_owned),
        ];
        prop::collection::vec(piece, 0..12).prop_map(|p| format!("\"{}\"", p.concat()))
    }

    proptest! {
        /// Whatever serde_json makes of a literal it accepts, `unescape`
        /// makes too; what it refuses for a surrogate, `unescape` leaves
        /// to it.
        #[test]
        fn unescape_is_serde_jsons_decoding(raw in literal()) {
            // Only literals the skipping pass accepts reach `unescape`.
            prop_assume!(serde_json::from_str::<IgnoredAny>(&raw).is_ok());
            match serde_json::from_str::<String>(&raw) {
                Ok(want) => {
                    let got = unescape(&raw);
                    prop_assert_eq!(got.as_deref(), Some(want.as_str()));
                }
                Err(_) => prop_assert_eq!(unescape(&raw), None),
            }
        }

        /// Every string, written by serde_json, reads back.
        #[test]
        fn unescape_reads_back_every_string(text in any::<String>()) {
            let raw = serde_json::to_string(&text).unwrap();
            let got = unescape(&raw);
            prop_assert_eq!(got.as_deref(), Some(text.as_str()));
        }
    }

    #[test]
    fn escapes_decode_as_python_does() {
        // json.loads('{"text": "a\\nb\\u00e9\\ud83d\\ude00\\"\\\\\\/\\t"}')["text"]
        let got = text(r#"{"text": "a\nb\u00e9\ud83d\ude00\"\\\/\t"}"#, "text").unwrap();
        assert_eq!(got, "a\nb\u{e9}\u{1f600}\"\\/\t");
        assert!(matches!(got, Cow::Owned(_)));
    }

    #[test]
    fn escaped_key_matches() {
        assert_eq!(text(r#"{"te\u0078t": "x"}"#, "text").unwrap(), "x");
    }

    #[test]
    fn nested_key() {
        let line = r#"{"text": "top", "meta": {"a": [1, 2], "text": "inner"}}"#;
        assert_eq!(text(line, "meta.text").unwrap(), "inner");
        let deep = r#"{"a": {"b": {"c": "deep"}}}"#;
        assert_eq!(text(deep, "a.b.c").unwrap(), "deep");
    }

    #[test]
    fn literal_dotted_name_wins_over_nesting() {
        let line = r#"{"meta": {"text": "nested"}, "meta.text": "flat"}"#;
        assert_eq!(text(line, "meta.text").unwrap(), "flat");
        let line = r#"{"a": {"b.c": "flat", "b": {"c": "nested"}}}"#;
        assert_eq!(text(line, "a.b.c").unwrap(), "flat");
    }

    #[test]
    fn duplicate_key_last_wins() {
        assert_eq!(
            text(r#"{"text": "first", "text": "last"}"#, "text").unwrap(),
            "last"
        );
        let nested = r#"{"m": {"text": "first"}, "m": {"text": "last"}}"#;
        assert_eq!(text(nested, "m.text").unwrap(), "last");
        // The last occurrence wins even when it is the bad one.
        assert!(matches!(
            text(r#"{"text": "a", "text": 1}"#, "text"),
            Err(DocError::NotAString { .. })
        ));
    }

    #[test]
    fn nan_and_infinity_are_read_as_python_reads_them() {
        let line =
            r#"{"score": NaN, "text": "a\n", "x": [Infinity, -Infinity,NaN], "y": {"z":NaN}}"#;
        assert_eq!(text(line, "text").unwrap(), "a\n");
        let err = text(r#"{"text": NaN}"#, "text").unwrap_err();
        assert_eq!(
            err,
            DocError::NotAString {
                key: "text".into(),
                found: "a number"
            }
        );
        // Inside strings and glued to other tokens they stay what they were.
        assert_eq!(text(r#"{"text": "NaN"}"#, "text").unwrap(), "NaN");
        for line in [
            r#"{"a": 1NaN, "text": "x"}"#,
            r#"{"a": NaNa, "text": "x"}"#,
            r#"{"text": "NaN", "a": }"#,
        ] {
            assert!(
                matches!(text(line, "text"), Err(DocError::Malformed { .. })),
                "{line}"
            );
        }
        // Columns in errors still count the original line.
        let err = text(r#"{"a": NaN, "text": "x",}"#, "text").unwrap_err();
        assert_eq!(
            err,
            text(r#"{"a": 123, "text": "x",}"#, "text").unwrap_err()
        );
    }

    #[test]
    fn surrounding_whitespace_and_cr_are_fine() {
        assert_eq!(text(" \t{\"text\": \"x\"} \r", "text").unwrap(), "x");
    }

    #[test]
    fn lone_surrogate_elsewhere_is_ignored() {
        assert_eq!(
            text(r#"{"other": "\ud800", "text": "ok"}"#, "text").unwrap(),
            "ok"
        );
    }

    #[test]
    fn invalid_utf8() {
        let err = extract_text(b"{\"text\": \"\xff\"}", &TextKey::parse("text")).unwrap_err();
        assert_eq!(err, DocError::InvalidUtf8 { offset: 10 });
        assert_eq!(err.to_string(), "invalid UTF-8 at byte 10 of the document");
    }

    #[test]
    fn malformed() {
        let err = text(r#"{"text" "a"}"#, "text").unwrap_err();
        assert_eq!(err.to_string(), "malformed JSON: expected `:` at column 9");
        for line in [
            r#"{"text": "a""#,
            r#"{"text": "a",}"#,
            r#"{"text": "a"} x"#,
            "",
            "nope",
            "{\"text\": \"a\tb\"}",
        ] {
            let err = text(line, "text").unwrap_err();
            assert!(
                matches!(err, DocError::Malformed { .. }),
                "{line:?} gave {err:?}"
            );
        }
        let err = text(r#"{"text": "a"} x"#, "text").unwrap_err();
        assert_eq!(
            err.to_string(),
            "malformed JSON: trailing characters at column 15"
        );
    }

    #[test]
    fn deep_nesting_is_an_error_not_a_crash() {
        let line = format!(r#"{{"x": {}, "text": "a"}}"#, "[".repeat(100_000));
        assert!(matches!(
            text(&line, "text"),
            Err(DocError::Malformed { .. })
        ));
    }

    #[test]
    fn not_an_object() {
        for (line, found) in [
            ("[1, 2]", "an array"),
            (r#""s""#, "a string"),
            ("12", "a number"),
            ("null", "null"),
            ("true", "a boolean"),
        ] {
            assert_eq!(
                text(line, "text").unwrap_err(),
                DocError::NotAnObject { found }
            );
        }
        assert_eq!(
            text("[1]", "text").unwrap_err().to_string(),
            "not a JSON object (found an array)"
        );
    }

    #[test]
    fn missing_field_lists_the_fields_the_line_has() {
        let err = text(r#"{"id": 1, "body": "x", "id": 2}"#, "text").unwrap_err();
        assert_eq!(
            err.to_string(),
            r#"no field "text"; the document has fields "id", "body""#
        );
        // Nested: the fields of the object where the lookup failed.
        let err = text(r#"{"meta": {"id": 1, "b": {}}}"#, "meta.text").unwrap_err();
        assert_eq!(
            err,
            DocError::MissingField {
                key: "meta.text".into(),
                fields: vec!["meta.id".into(), "meta.b".into()],
            }
        );
        let err = text(r#"{"text": "a"}"#, "meta.text").unwrap_err();
        assert_eq!(
            err,
            DocError::MissingField {
                key: "meta.text".into(),
                fields: vec!["text".into()],
            }
        );
        let err = text(r#"{}"#, "text").unwrap_err();
        assert_eq!(
            err.to_string(),
            r#"no field "text"; the document has no fields"#
        );
    }

    #[test]
    fn not_a_string() {
        let err = text(r#"{"text": 5}"#, "text").unwrap_err();
        assert_eq!(
            err.to_string(),
            r#"field "text" is a number, expected a string"#
        );
        for (value, found) in [
            ("[]", "an array"),
            ("{}", "an object"),
            ("false", "a boolean"),
            ("-1e3", "a number"),
        ] {
            let err = text(&format!(r#"{{"text": {value}}}"#), "text").unwrap_err();
            assert_eq!(
                err,
                DocError::NotAString {
                    key: "text".into(),
                    found
                }
            );
        }
    }

    #[test]
    fn null_text() {
        let err = text(r#"{"text": null}"#, "text").unwrap_err();
        assert_eq!(err, DocError::Null { key: "text".into() });
        assert_eq!(err.to_string(), r#"field "text" is null"#);
    }

    #[test]
    fn nested_not_an_object() {
        let err = text(r#"{"meta": 5}"#, "meta.text").unwrap_err();
        assert_eq!(
            err.to_string(),
            r#"field "meta" is a number, not an object, cannot reach "meta.text""#
        );
        let err = text(r#"{"a": {"b": [1]}}"#, "a.b.c").unwrap_err();
        assert_eq!(
            err,
            DocError::NotAnObjectField {
                field: "a.b".into(),
                key: "a.b.c".into(),
                found: "an array"
            }
        );
    }

    #[test]
    fn lone_surrogates_are_refused() {
        for line in [
            r#"{"text": "a\ud800b"}"#,
            r#"{"text": "\ud800"}"#,
            r#"{"text": "\udc00"}"#,
            r#"{"text": "\ud800\u0041"}"#,
        ] {
            let err = text(line, "text").unwrap_err();
            assert!(
                matches!(err, DocError::LoneSurrogate { .. }),
                "{line} gave {err:?}"
            );
            assert!(err.to_string().contains("surrogate"));
        }
        let err = text(r#"{"m": {"text": "\udc00"}}"#, "m.text").unwrap_err();
        // Counted from the start of the line, not of the nested object.
        assert_eq!(err, DocError::LoneSurrogate { column: 22 });
    }

    proptest! {
        #[test]
        fn any_string_round_trips(s in any::<String>()) {
            let line = serde_json::to_string(&serde_json::json!({ "id": 7, "text": s })).unwrap();
            prop_assert_eq!(extract_text(line.as_bytes(), &TextKey::parse("text")).unwrap(), s);
        }

        #[test]
        fn any_bytes_give_a_result_not_a_panic(bytes in proptest::collection::vec(any::<u8>(), 0..64)) {
            let _ = extract_text(&bytes, &TextKey::parse("a.b"));
        }
    }

    /// Some lines: blank ones, CRLF, whitespace-only, no final newline.
    const CONTENT: &str = "{\"text\": \"one\"}\n\n{\"text\": \"two\"}\r\n  \t\r\n\r\n{\"text\": \"three\"}\n{\"text\": \"four\"}";

    fn write_all(dir: &Path, name: &str, content: &[u8]) -> InputFile {
        let path = dir.join(name);
        let mut file = File::create(&path).unwrap();
        match InputKind::from_path(&path) {
            Some(InputKind::Jsonl(Compression::Gzip)) => {
                let mut enc = flate2::write::GzEncoder::new(file, flate2::Compression::default());
                enc.write_all(content).unwrap();
                enc.finish().unwrap();
            }
            Some(InputKind::Jsonl(Compression::Zstd)) => {
                // With a checksum, as the zstd command line writes by default.
                let mut enc = zstd::stream::Encoder::new(file, 3).unwrap();
                enc.include_checksum(true).unwrap();
                enc.write_all(content).unwrap();
                enc.finish().unwrap();
            }
            _ => file.write_all(content).unwrap(),
        }
        let bytes = std::fs::metadata(&path).unwrap().len();
        InputFile {
            kind: InputKind::from_path(&path).unwrap(),
            path,
            bytes,
            version: None,
        }
    }

    fn read_all(files: Vec<InputFile>) -> Result<Vec<RawDoc>, InputError> {
        let mut reader = Reader::new(files, TextKey::parse("text"));
        let mut docs = Vec::new();
        while let Some(batch) = reader.next_batch(1 << 20, 1000)? {
            docs.extend(batch);
        }
        Ok(docs)
    }

    fn lines(docs: &[RawDoc]) -> Vec<(u32, Location, String)> {
        docs.iter()
            .map(|d| match &d.payload {
                Payload::Json(line) => (d.file, d.loc, String::from_utf8(line.clone()).unwrap()),
                other => panic!("not a JSON line: {other:?}"),
            })
            .collect()
    }

    #[test]
    fn line_numbers_count_blank_lines_and_crlf_is_stripped() {
        let dir = tempfile::tempdir().unwrap();
        let docs = read_all(vec![write_all(dir.path(), "a.jsonl", CONTENT.as_bytes())]).unwrap();
        let expected = vec![
            (0, Location::Line(1), r#"{"text": "one"}"#.to_owned()),
            (0, Location::Line(3), r#"{"text": "two"}"#.to_owned()),
            (0, Location::Line(6), r#"{"text": "three"}"#.to_owned()),
            (0, Location::Line(7), r#"{"text": "four"}"#.to_owned()),
        ];
        assert_eq!(lines(&docs), expected);
    }

    #[test]
    fn plain_gzip_and_zstd_give_the_same_documents() {
        let dir = tempfile::tempdir().unwrap();
        let plain =
            lines(&read_all(vec![write_all(dir.path(), "a.jsonl", CONTENT.as_bytes())]).unwrap());
        for name in ["a.jsonl.gz", "a.ndjson.zst", "a.JSON.GZ"] {
            let docs = read_all(vec![write_all(dir.path(), name, CONTENT.as_bytes())]).unwrap();
            assert_eq!(lines(&docs), plain, "{name}");
        }
    }

    #[test]
    fn concatenated_gzip_members_are_all_read() {
        let dir = tempfile::tempdir().unwrap();
        let mut both = Vec::new();
        for part in ["{\"text\": \"a\"}\n", "{\"text\": \"b\"}\n"] {
            let mut enc = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
            enc.write_all(part.as_bytes()).unwrap();
            both.extend(enc.finish().unwrap());
        }
        std::fs::write(dir.path().join("a.jsonl.gz"), &both).unwrap();
        let file = InputFile {
            path: dir.path().join("a.jsonl.gz"),
            kind: InputKind::Jsonl(Compression::Gzip),
            bytes: both.len() as u64,
            version: None,
        };
        assert_eq!(read_all(vec![file]).unwrap().len(), 2);
    }

    #[test]
    fn batch_limits_are_respected_across_files() {
        let dir = tempfile::tempdir().unwrap();
        // Each line is 10 bytes without its newline.
        let content: String = (0..7).map(|i| format!("{{\"t\":\"{i}\"}}\n")).collect();
        let files = vec![
            write_all(dir.path(), "a.jsonl", content.as_bytes()),
            write_all(dir.path(), "b.jsonl.zst", content.as_bytes()),
        ];
        let mut reader = Reader::new(files.clone(), TextKey::parse("t"));
        let mut sizes = Vec::new();
        while let Some(batch) = reader.next_batch(usize::MAX, 3).unwrap() {
            sizes.push(batch.len());
        }
        assert_eq!(sizes, [3, 3, 3, 3, 2]);

        let mut reader = Reader::new(files.clone(), TextKey::parse("t"));
        let first = reader.next_batch(25, 100).unwrap().unwrap();
        assert_eq!(
            first.len(),
            3,
            "stops at the first document that reaches 25 bytes"
        );
        let mut docs = first;
        while let Some(batch) = reader.next_batch(25, 100).unwrap() {
            assert!(batch.len() <= 3);
            docs.extend(batch);
        }
        assert_eq!(docs.len(), 14);
        assert_eq!((docs[6].file, docs[6].loc), (0, Location::Line(7)));
        assert_eq!((docs[7].file, docs[7].loc), (1, Location::Line(1)));
        assert!(
            reader.next_batch(25, 100).unwrap().is_none(),
            "stays finished"
        );

        // A zero limit still makes progress, one document at a time.
        let mut reader = Reader::new(files, TextKey::parse("t"));
        assert_eq!(reader.next_batch(0, 0).unwrap().unwrap().len(), 1);
    }

    #[test]
    fn progress_reaches_the_total_size() {
        let dir = tempfile::tempdir().unwrap();
        let content: String = (0..5000)
            .map(|i| format!("{{\"text\": \"document {i}\"}}\n"))
            .collect();
        let files = vec![
            write_all(dir.path(), "a.jsonl.gz", content.as_bytes()),
            write_all(dir.path(), "b.jsonl", content.as_bytes()),
        ];
        let total: u64 = files.iter().map(|f| f.bytes).sum();
        let mut reader = Reader::new(files, TextKey::parse("text"));
        let progress = reader.progress();
        let mut last = 0;
        while reader.next_batch(1000, 100).unwrap().is_some() {
            let now = progress.load(Ordering::Relaxed);
            assert!(now >= last && now <= total);
            last = now;
        }
        assert_eq!(progress.load(Ordering::Relaxed), total);
    }

    #[test]
    fn a_line_longer_than_the_buffer() {
        let dir = tempfile::tempdir().unwrap();
        let long = "x".repeat(5 * BUF_SIZE);
        let content = format!("{{\"text\": \"{long}\"}}\n{{\"text\": \"short\"}}\n");
        let docs = read_all(vec![write_all(
            dir.path(),
            "a.jsonl.zst",
            content.as_bytes(),
        )])
        .unwrap();
        let Payload::Json(line) = &docs[0].payload else {
            panic!()
        };
        assert_eq!(extract_text(line, &TextKey::parse("text")).unwrap(), long);
        assert_eq!(docs[1].loc, Location::Line(2));
    }

    /// Reads until the error, checking that every complete line before it was
    /// handed out first; returns the error.
    fn read_until_error(file: InputFile) -> InputError {
        let mut reader = Reader::new(vec![file], TextKey::parse("text"));
        let mut docs = 0;
        loop {
            match reader.next_batch(1 << 16, 100) {
                Ok(Some(batch)) => docs += batch.len() as u64,
                Ok(None) => panic!("no error after {docs} documents"),
                Err(err) => {
                    if let InputError::Read { line, .. } = err {
                        assert_eq!(docs, line - 1, "documents before the failed line");
                    }
                    return err;
                }
            }
        }
    }

    /// Several MiB, more than the read buffer: a decoder error surfaces while
    /// reading the line at the start of the buffer it could not fill.
    fn many_lines() -> String {
        (0..100_000)
            .map(|i| format!("{{\"text\": \"document number {i}\"}}\n"))
            .collect()
    }

    #[test]
    fn truncated_gzip_names_the_file_and_line() {
        let dir = tempfile::tempdir().unwrap();
        let mut file = write_all(dir.path(), "a.jsonl.gz", many_lines().as_bytes());
        let bytes = std::fs::read(&file.path).unwrap();
        std::fs::write(&file.path, &bytes[..bytes.len() / 2]).unwrap();
        file.bytes /= 2;
        let err = read_until_error(file);
        let InputError::Read { ref path, line, .. } = err else {
            panic!("{err:?}")
        };
        assert!(path.ends_with("a.jsonl.gz"));
        assert!(line > 1000, "line {line}");
        let message = err.to_string();
        assert!(
            message.contains("a.jsonl.gz") && message.contains(&format!("line {line}")),
            "{message}"
        );
    }

    #[test]
    fn corrupt_zstd_names_the_file_and_line() {
        let dir = tempfile::tempdir().unwrap();
        let file = write_all(dir.path(), "a.jsonl.zst", many_lines().as_bytes());
        let mut bytes = std::fs::read(&file.path).unwrap();
        let len = bytes.len();
        bytes[len / 2..len / 2 + 64].fill(0xff);
        std::fs::write(&file.path, &bytes).unwrap();
        let err = read_until_error(file.clone());
        assert!(
            matches!(err, InputError::Read { line, .. } if line > 1),
            "{err:?}"
        );

        std::fs::write(&file.path, &bytes[..len / 2]).unwrap();
        let err = read_until_error(file.clone());
        assert!(
            matches!(err, InputError::Read { line, .. } if line > 1),
            "{err:?}"
        );

        std::fs::write(&file.path, b"not zstd at all\n").unwrap();
        let err = read_until_error(file);
        assert!(matches!(err, InputError::Read { line: 1, .. }), "{err:?}");
    }

    #[test]
    fn a_file_that_vanished_is_an_open_error_and_reading_goes_on() {
        let dir = tempfile::tempdir().unwrap();
        let gone = write_all(dir.path(), "gone.jsonl", b"{}\n");
        std::fs::remove_file(&gone.path).unwrap();
        let kept = write_all(dir.path(), "kept.jsonl", b"{}\n");
        let mut reader = Reader::new(vec![gone, kept], TextKey::parse("text"));
        let err = reader.next_batch(100, 100).unwrap_err();
        assert!(matches!(err, InputError::Open { ref path, .. } if path.ends_with("gone.jsonl")));
        assert!(err.to_string().contains("gone.jsonl: cannot open"), "{err}");
        let batch = reader.next_batch(100, 100).unwrap().unwrap();
        assert_eq!(batch[0].file, 1);
    }

    /// Hands out its bytes `step` at a time, so that every boundary
    /// between the reader's buffers is met.
    struct Trickle {
        bytes: Vec<u8>,
        at: usize,
        step: usize,
    }

    impl Read for Trickle {
        fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
            let n = self.step.min(buf.len()).min(self.bytes.len() - self.at);
            buf[..n].copy_from_slice(&self.bytes[self.at..self.at + n]);
            self.at += n;
            Ok(n)
        }
    }

    /// Every document of `bytes`, read as the file `name`, `step` bytes at
    /// a time.
    fn documents(
        name: &str,
        bytes: &[u8],
        step: usize,
    ) -> Result<Vec<(Location, Vec<u8>)>, InputError> {
        let trickle = Trickle {
            bytes: bytes.to_vec(),
            at: 0,
            step,
        };
        let mut source = JsonlSource::over(Path::new(name), Box::new(trickle), 0, None)?;
        let mut out = Vec::new();
        while let Some((loc, payload)) = source.next_doc()? {
            let Payload::Json(bytes) = payload else {
                panic!("not JSON: {payload:?}")
            };
            out.push((loc, bytes));
        }
        Ok(out)
    }

    /// Any JSON value, strings full of what a scan must not be fooled by.
    fn json_value() -> impl Strategy<Value = serde_json::Value> {
        use serde_json::Value;
        let leaf = prop_oneof![
            Just(Value::Null),
            any::<bool>().prop_map(Value::Bool),
            any::<i64>().prop_map(Value::from),
            (-1e9f64..1e9).prop_map(Value::from),
            "[a-z\\[\\]{},:\"\\\\\n\r\t é😀]{0,12}".prop_map(Value::String),
        ];
        leaf.prop_recursive(3, 24, 4, |inner| {
            prop_oneof![
                prop::collection::vec(inner.clone(), 0..4).prop_map(Value::Array),
                prop::collection::btree_map("[a-z\\[\"{]{0,4}", inner, 0..4)
                    .prop_map(|m| Value::Object(m.into_iter().collect())),
            ]
        })
    }

    proptest! {
        /// A `.json` file that is one array gives its elements, whatever
        /// is in their strings, however it is laid out (compact, pretty,
        /// CRLF, a byte-order mark) and however the reads fall; each
        /// element is one line, and the line it starts on is counted.
        #[test]
        fn an_array_file_gives_its_elements(
            elements in prop::collection::vec(json_value(), 0..6),
            layout in 0..4usize,
            step in 1..9usize,
        ) {
            let array = serde_json::Value::Array(elements.clone());
            let text = match layout {
                0 => serde_json::to_string(&array).unwrap(),
                1 => serde_json::to_string_pretty(&array).unwrap(),
                2 => serde_json::to_string_pretty(&array).unwrap().replace('\n', "\r\n"),
                _ => format!("\u{feff}\n  {}\n\n", serde_json::to_string_pretty(&array).unwrap()),
            };
            for name in ["a.json", "a.JSON.gz"] {
                let got = documents(name, text.as_bytes(), step).unwrap();
                prop_assert_eq!(got.len(), elements.len());
                let mut last_line = 0;
                for ((loc, bytes), want) in got.iter().zip(&elements) {
                    let parsed: serde_json::Value = serde_json::from_slice(bytes).unwrap();
                    prop_assert_eq!(&parsed, want);
                    prop_assert!(!bytes.contains(&b'\n') && !bytes.contains(&b'\r'));
                    let Location::Element { line, .. } = *loc else { panic!("{loc:?}") };
                    prop_assert!(line >= last_line);
                    last_line = line;
                }
            }
        }
    }

    #[test]
    fn array_elements_are_numbered_and_placed_on_their_lines() {
        let text = "\u{feff}[\n  {\"text\": \"a\"},\n\n  {\"text\":\n    \"b\"}, 7\n]\n";
        let got = documents("a.json", text.as_bytes(), 3).unwrap();
        let locations: Vec<Location> = got.iter().map(|(loc, _)| *loc).collect();
        assert_eq!(
            locations,
            [
                Location::Element { line: 2, index: 0 },
                Location::Element { line: 4, index: 1 },
                Location::Element { line: 5, index: 2 },
            ]
        );
        assert_eq!(got[1].1, b"{\"text\":     \"b\"}");
        assert_eq!(
            Location::Element { line: 4, index: 1 }.to_string(),
            "line 4 (element 1 of its JSON array)"
        );
    }

    #[test]
    fn only_json_files_are_read_as_arrays() {
        // A JSON Lines file whose lines are bare arrays (chat messages).
        let lines = "[{\"role\": \"user\"}]\n[{\"role\": \"user\"}]\n";
        for name in ["a.jsonl", "a.ndjson.zst"] {
            let got = documents(name, lines.as_bytes(), 64).unwrap();
            assert_eq!(got.len(), 2, "{name}");
            assert_eq!(got[0].0, Location::Line(1));
        }
        // A .json file of JSON Lines objects is JSON Lines.
        let got = documents("a.json", b"\n{\"text\": 1}\n{\"text\": 2}\n", 64).unwrap();
        assert_eq!(
            got.iter().map(|(loc, _)| *loc).collect::<Vec<_>>(),
            [Location::Line(2), Location::Line(3)]
        );
    }

    #[test]
    fn a_malformed_array_names_the_line_and_what_is_wrong() {
        for (text, line, what) in [
            (
                "[{}\n{}]",
                2,
                "expected `,` or `]` after element 0 of the JSON array, found `{`",
            ),
            (
                "[{},\n]",
                2,
                "expected element 1 of the JSON array, found `]`",
            ),
            (
                "[,{}]",
                1,
                "expected element 0 of the JSON array, found `,`",
            ),
            (
                "[{},\n{\"a\": [1,",
                2,
                "the file ends inside its JSON array (no closing `]`)",
            ),
            (
                "[\n",
                2,
                "the file ends inside its JSON array (no closing `]`)",
            ),
            (
                "[{}]\n\n{}",
                3,
                "`{` after the JSON array that closes on line 1",
            ),
            (
                "[\"a]\"",
                1,
                "the file ends inside its JSON array (no closing `]`)",
            ),
        ] {
            let err = documents("bad.json", text.as_bytes(), 2).unwrap_err();
            let InputError::JsonArray { line: at, .. } = err else {
                panic!("{text:?}: {err:?}")
            };
            assert_eq!(at, line, "{text:?}: {err}");
            assert!(err.to_string().contains(what), "{text:?}: {err}");
            assert!(err.to_string().starts_with("bad.json: line "), "{err}");
        }
        // An empty array is no document.
        assert!(documents("empty.json", b" [ ] \n", 1).unwrap().is_empty());
    }
}
