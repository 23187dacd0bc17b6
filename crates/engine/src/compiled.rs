//! A tokenizer's compiled form: what the engine builds from a
//! `tokenizer.json`, written once and read back on later runs without
//! parsing the file again.
//!
//! Reading a large `tokenizer.json` is most of a short run: Gemma 3's
//! 262,144 tokens and 514,906 merges are half a second of JSON and string
//! lookups before the first document. The compiled form holds the built
//! tables (the merges as id pairs, the characters' ids, the tries and word
//! lists) as flat little-endian arrays, and the file's small parts (the
//! normalizer, the pre-tokenizer, the post-processor) as the JSON they came
//! from, which the engine reads again with the code that read them first.
//!
//! A compiled form is trusted only when everything in its header matches:
//! the magic, the format, the hash of the engine's own source that wrote it
//! (`build.rs`), the XXH3 of the `tokenizer.json` it was made from, and the
//! XXH3 of its payload. Anything else, and any payload that does not read
//! back to its last byte, is [`Stale`]: the caller builds from the JSON
//! again and writes a fresh one. A damaged or stale file can cost time,
//! never change an id.
//!
//! Compiled forms live in a cache directory ([`cache_dir`]), one file per
//! `tokenizer.json` and engine, named by their hashes, written to a temporary name and
//! renamed into place, so that concurrent runs (a thousand `--part` tasks
//! starting at once) each read a whole file or none.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use memmap2::Mmap;

use foldhash::fast::FixedState;
use xxhash_rust::xxh3::xxh3_64;

/// The first bytes of a compiled tokenizer.
const MAGIC: &[u8; 16] = b"prep-tokenizer\0\x01";

/// The hash of the engine's source files (build.rs), which decide what a compiled form
/// means: a form written by another engine is stale.
const ENGINE: u64 = {
    match u64::from_str_radix(env!("PREP_ENGINE_SOURCE_HASH"), 16) {
        Ok(hash) => hash,
        Err(_) => panic!("build.rs writes a hex hash"),
    }
};

/// The header: magic, engine, source XXH3, payload length, payload XXH3. A
/// multiple of 8, so that the payload's words lie aligned in a mapping.
pub(crate) const HEADER: usize = 16 + 8 + 8 + 8 + 8;

/// Why a compiled form was not used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct Stale(pub String);

fn stale<T>(why: impl Into<String>) -> Result<T, Stale> {
    Err(Stale(why.into()))
}

/// The environment variable naming the cache directory, or `off`.
pub const CACHE_ENV: &str = "PREP_TOKENIZER_CACHE";

/// Where compiled forms are kept: `$PREP_TOKENIZER_CACHE` (`off`: nowhere),
/// else `$XDG_CACHE_HOME/prep/tokenizers`, else
/// `$HOME/.cache/prep/tokenizers`.
pub fn cache_dir() -> Option<PathBuf> {
    let nonempty = |name| std::env::var_os(name).filter(|v| !v.is_empty());
    if let Some(dir) = nonempty(CACHE_ENV) {
        return (dir != "off").then(|| PathBuf::from(dir));
    }
    let base = match nonempty("XDG_CACHE_HOME") {
        Some(dir) => PathBuf::from(dir),
        None => PathBuf::from(nonempty("HOME")?).join(".cache"),
    };
    Some(base.join("prep").join("tokenizers"))
}

/// The compiled form of the `tokenizer.json` whose XXH3 is `source`, as
/// this engine writes it: named by the engine's hash too, so that two
/// versions of prep sharing a cache (the command and an older pip package)
/// each keep their own form instead of rewriting each other's.
pub fn cache_file(dir: &Path, source: u64) -> PathBuf {
    dir.join(format!("{source:016x}-{ENGINE:016x}.tok"))
}

/// A compiled form of `payload`, made from the file whose XXH3 is `source`.
pub(crate) fn seal(source: u64, payload: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(HEADER + payload.len());
    out.extend_from_slice(MAGIC);
    for word in [ENGINE, source, payload.len() as u64, xxh3_64(payload)] {
        out.extend_from_slice(&word.to_le_bytes());
    }
    out.extend_from_slice(payload);
    out
}

/// The payload of a compiled form, if its header says it is whole, made by
/// this engine, and made from the file whose XXH3 is `source`.
pub(crate) fn open(bytes: &[u8], source: u64) -> Result<&[u8], Stale> {
    if bytes.len() < HEADER || bytes[..16] != MAGIC[..] {
        return stale("not a compiled tokenizer of this format");
    }
    let word = |i: usize| {
        let at = 16 + 8 * i;
        u64::from_le_bytes(bytes[at..at + 8].try_into().expect("8 bytes"))
    };
    if word(0) != ENGINE {
        return stale("written by another version of the engine");
    }
    if word(1) != source {
        return stale("made from another tokenizer.json");
    }
    let payload = &bytes[HEADER..];
    if word(2) != payload.len() as u64 {
        return stale(format!(
            "{} payload bytes where the header says {}",
            payload.len(),
            word(2)
        ));
    }
    if word(3) != xxh3_64(payload) {
        return stale("the payload does not match its checksum");
    }
    Ok(payload)
}

/// Writes `compiled` as `path`, whole or not at all: a temporary file in
/// the same directory, renamed into place.
pub(crate) fn store(path: &Path, compiled: &[u8]) -> std::io::Result<()> {
    let dir = path.parent().unwrap_or(Path::new("."));
    std::fs::create_dir_all(dir)?;
    // A name no other writer uses: other processes differ in pid, other
    // threads of this one (two Python threads loading one file) in `n`.
    static WRITES: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let n = WRITES.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let tmp = dir.join(format!(
        ".{}.{}.{n}.tmp",
        path.file_name().and_then(|n| n.to_str()).unwrap_or("tok"),
        std::process::id()
    ));
    let written = std::fs::write(&tmp, compiled).and_then(|()| std::fs::rename(&tmp, path));
    if written.is_err() {
        // Only the temporary file this call made.
        let _ = std::fs::remove_file(&tmp);
    }
    written
}

/// Appends values to a payload, little-endian, lengths before contents.
#[derive(Default)]
pub(crate) struct Writer {
    pub(crate) buf: Vec<u8>,
}

impl Writer {
    pub(crate) fn u8(&mut self, v: u8) {
        self.buf.push(v);
    }
    pub(crate) fn bool(&mut self, v: bool) {
        self.u8(u8::from(v));
    }
    pub(crate) fn u32(&mut self, v: u32) {
        self.buf.extend_from_slice(&v.to_le_bytes());
    }
    pub(crate) fn u64(&mut self, v: u64) {
        self.buf.extend_from_slice(&v.to_le_bytes());
    }
    pub(crate) fn f64(&mut self, v: f64) {
        self.u64(v.to_bits());
    }
    pub(crate) fn len(&mut self, n: usize) {
        self.u64(n as u64);
    }
    pub(crate) fn bytes(&mut self, v: &[u8]) {
        self.len(v.len());
        self.buf.extend_from_slice(v);
    }
    pub(crate) fn str(&mut self, v: &str) {
        self.bytes(v.as_bytes());
    }
    pub(crate) fn u32s(&mut self, v: &[u32]) {
        self.len(v.len());
        for x in v {
            self.u32(*x);
        }
    }
    pub(crate) fn u64s(&mut self, v: &[u64]) {
        self.len(v.len());
        for x in v {
            self.u64(*x);
        }
    }
    /// Words to be read in place from a mapping ([`Reader::words`]): the
    /// count, zeros up to a multiple of 8 bytes from the payload's start,
    /// then the words.
    pub(crate) fn words(&mut self, v: &[u64]) {
        self.len(v.len());
        while !self.buf.len().is_multiple_of(8) {
            self.buf.push(0);
        }
        for x in v {
            self.u64(*x);
        }
    }
    /// `Some` as 1 and the value, `None` as 0.
    pub(crate) fn opt<T>(&mut self, v: Option<&T>, mut f: impl FnMut(&mut Self, &T)) {
        self.bool(v.is_some());
        if let Some(v) = v {
            f(self, v);
        }
    }
    /// A map of texts to ids, in its own order.
    pub(crate) fn vocab<K: AsRef<[u8]>>(&mut self, v: &HashMap<K, u32, FixedState>) {
        let mut text = Vec::new();
        let mut ends = Vec::with_capacity(v.len());
        let mut ids = Vec::with_capacity(v.len());
        for (k, &id) in v {
            text.extend_from_slice(k.as_ref());
            ends.push(text.len() as u64);
            ids.push(id);
        }
        self.bytes(&text);
        self.u64s(&ends);
        self.u32s(&ids);
    }
}

/// Words of a compiled form: in place in its mapping, or in memory (built
/// from the JSON, or copied out where the mapping cannot be used in place).
pub(crate) enum Words {
    Owned(Vec<u64>),
    /// `len` words at byte `at` of `map`, 8-aligned, little-endian.
    Mapped {
        map: Arc<Mmap>,
        at: usize,
        len: usize,
    },
}

impl std::ops::Deref for Words {
    type Target = [u64];
    #[inline(always)]
    fn deref(&self) -> &[u64] {
        match self {
            Words::Owned(v) => v,
            // SAFETY: `Reader::words` makes this only for words inside the
            // mapping, 8-aligned, on a little-endian machine; the mapping is
            // read-only and lives as long as `self`. (A compiled form is
            // replaced by a rename, never rewritten in place.)
            Words::Mapped { map, at, len } => unsafe {
                std::slice::from_raw_parts(map.as_ptr().add(*at).cast::<u64>(), *len)
            },
        }
    }
}

/// Reads a payload back, failing on anything short or out of place.
pub(crate) struct Reader<'a> {
    buf: &'a [u8],
    /// How far into the payload `buf` starts.
    read: usize,
    /// The mapped file the payload lies in, at [`HEADER`].
    map: Option<&'a Arc<Mmap>>,
}

impl<'a> Reader<'a> {
    /// A reader of a payload in memory.
    pub(crate) fn new(buf: &'a [u8]) -> Reader<'a> {
        Reader {
            buf,
            read: 0,
            map: None,
        }
    }
    /// A reader of the payload of the mapped compiled form `map`, whose
    /// header [`open`] has checked.
    pub(crate) fn mapped(map: &'a Arc<Mmap>) -> Reader<'a> {
        Reader {
            buf: &map[HEADER..],
            read: 0,
            map: Some(map),
        }
    }
    pub(crate) fn take(&mut self, n: usize) -> Result<&'a [u8], Stale> {
        if n > self.buf.len() {
            return stale("the payload ends early");
        }
        let (head, rest) = self.buf.split_at(n);
        self.buf = rest;
        self.read += n;
        Ok(head)
    }
    /// Words written by [`Writer::words`]: in place in the mapping where
    /// they lie aligned on a little-endian machine, else copied out.
    pub(crate) fn words(&mut self) -> Result<Words, Stale> {
        let n = self.u64()?;
        self.take((8 - self.read % 8) % 8)?;
        let n = usize::try_from(n)
            .ok()
            .filter(|n| n.checked_mul(8).is_some());
        let n = n.ok_or(Stale("a length runs past the payload".into()))?;
        let at = HEADER + self.read;
        let raw = self.take(n * 8)?;
        match self.map {
            Some(map) if cfg!(target_endian = "little") && raw.as_ptr().align_offset(8) == 0 => {
                Ok(Words::Mapped {
                    map: Arc::clone(map),
                    at,
                    len: n,
                })
            }
            _ => Ok(Words::Owned(
                raw.chunks_exact(8)
                    .map(|c| u64::from_le_bytes(c.try_into().expect("8")))
                    .collect(),
            )),
        }
    }
    pub(crate) fn u8(&mut self) -> Result<u8, Stale> {
        Ok(self.take(1)?[0])
    }
    pub(crate) fn bool(&mut self) -> Result<bool, Stale> {
        match self.u8()? {
            0 => Ok(false),
            1 => Ok(true),
            _ => stale("a flag is neither 0 nor 1"),
        }
    }
    pub(crate) fn u32(&mut self) -> Result<u32, Stale> {
        Ok(u32::from_le_bytes(self.take(4)?.try_into().expect("4")))
    }
    pub(crate) fn u64(&mut self) -> Result<u64, Stale> {
        Ok(u64::from_le_bytes(self.take(8)?.try_into().expect("8")))
    }
    pub(crate) fn f64(&mut self) -> Result<f64, Stale> {
        Ok(f64::from_bits(self.u64()?))
    }
    pub(crate) fn len(&mut self) -> Result<usize, Stale> {
        let n = self.u64()?;
        // No length can exceed what is left to read.
        match usize::try_from(n) {
            Ok(n) if n <= self.buf.len() => Ok(n),
            _ => stale("a length runs past the payload"),
        }
    }
    pub(crate) fn bytes(&mut self) -> Result<&'a [u8], Stale> {
        let n = self.len()?;
        self.take(n)
    }
    pub(crate) fn str(&mut self) -> Result<&'a str, Stale> {
        std::str::from_utf8(self.bytes()?).or_else(|_| stale("a text is not UTF-8"))
    }
    /// An array written as its length and then `W` little-endian bytes an
    /// element.
    fn array<T, const W: usize>(&mut self, from: fn([u8; W]) -> T) -> Result<Vec<T>, Stale> {
        let n = self.len()?;
        let raw = self.take(n.checked_mul(W).ok_or(Stale("too long".into()))?)?;
        Ok(raw
            .chunks_exact(W)
            .map(|c| from(c.try_into().expect("W bytes")))
            .collect())
    }
    pub(crate) fn u32s(&mut self) -> Result<Vec<u32>, Stale> {
        self.array(u32::from_le_bytes)
    }
    pub(crate) fn u64s(&mut self) -> Result<Vec<u64>, Stale> {
        self.array(u64::from_le_bytes)
    }
    /// Exactly `N` ids.
    pub(crate) fn table<const N: usize>(&mut self) -> Result<Box<[u32; N]>, Stale> {
        let v = self.u32s()?;
        v.into_boxed_slice()
            .try_into()
            .or_else(|_| stale("a table has the wrong length"))
    }
    pub(crate) fn opt<T>(
        &mut self,
        mut f: impl FnMut(&mut Self) -> Result<T, Stale>,
    ) -> Result<Option<T>, Stale> {
        Ok(if self.bool()? { Some(f(self)?) } else { None })
    }
    /// A map written by [`Writer::vocab`], as `(text, id)` pairs.
    pub(crate) fn pairs(&mut self) -> Result<Vec<(&'a [u8], u32)>, Stale> {
        let text = self.bytes()?;
        let ends = self.u64s()?;
        let ids = self.u32s()?;
        if ends.len() != ids.len() {
            return stale("a word list's ids do not match its words");
        }
        let mut start = 0usize;
        let mut out = Vec::with_capacity(ids.len());
        for (&end, &id) in ends.iter().zip(&ids) {
            let end = usize::try_from(end).unwrap_or(usize::MAX);
            if end < start || end > text.len() {
                return stale("a word list's ends are out of order");
            }
            out.push((&text[start..end], id));
            start = end;
        }
        Ok(out)
    }
    /// A map written by [`Writer::vocab`] whose keys are UTF-8.
    pub(crate) fn vocab(&mut self) -> Result<super::Vocab, Stale> {
        let pairs = self.pairs()?;
        let mut map = HashMap::with_capacity_and_hasher(pairs.len(), FixedState::default());
        for (text, id) in pairs {
            let text = std::str::from_utf8(text).or_else(|_| stale("a token is not UTF-8"))?;
            map.insert(text.to_owned(), id);
        }
        Ok(map)
    }
    /// A map written by [`Writer::vocab`] whose keys are bytes.
    pub(crate) fn byte_map(&mut self) -> Result<HashMap<Box<[u8]>, u32, FixedState>, Stale> {
        let pairs = self.pairs()?;
        let mut map = HashMap::with_capacity_and_hasher(pairs.len(), FixedState::default());
        for (text, id) in pairs {
            map.insert(Box::from(text), id);
        }
        Ok(map)
    }
    /// Whether every byte was read.
    pub(crate) fn finish(self) -> Result<(), Stale> {
        match self.buf.len() {
            0 => Ok(()),
            n => stale(format!("{n} bytes after the payload's end")),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_sealed_payload_opens_only_whole_and_for_its_source() {
        let sealed = seal(7, b"payload");
        assert_eq!(open(&sealed, 7).unwrap(), b"payload");
        assert!(open(&sealed, 8)
            .unwrap_err()
            .0
            .contains("another tokenizer.json"));
        for at in 0..sealed.len() {
            let mut bad = sealed.clone();
            bad[at] ^= 0x20;
            assert!(open(&bad, 7).is_err(), "a flip at byte {at} went unseen");
        }
        for cut in 0..sealed.len() {
            assert!(open(&sealed[..cut], 7).is_err(), "cut at {cut} went unseen");
        }
    }

    #[test]
    fn a_reader_refuses_what_runs_past_its_payload() {
        let mut w = Writer::default();
        w.u32s(&[1, 2, 3]);
        let mut r = Reader::new(&w.buf[..w.buf.len() - 1]);
        assert!(r.u32s().is_err());
        let mut long = Writer::default();
        long.u64(u64::MAX);
        assert!(Reader::new(&long.buf).bytes().is_err());
        let mut r = Reader::new(&w.buf);
        assert_eq!(r.u32s().unwrap(), [1, 2, 3]);
        r.finish().unwrap();
    }
}
