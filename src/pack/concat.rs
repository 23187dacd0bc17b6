//! Concatenation: the documents end to end as one token stream, cut every
//! `L` tokens. Row `r` is the stream's tokens `r*L .. (r+1)*L`, so any row is
//! found from its number alone: rows can be written in input order or in any
//! permuted order without holding the stream.

use super::bestfit::Piece;
use crate::format::Dataset;

/// The input documents as one stream, with an optional separator token after
/// each document.
pub(crate) struct Stream<'a> {
    ds: &'a Dataset,
    /// 1 when a separator follows every document.
    sep: u64,
    /// Stream position of each shard's first token, and one past the end.
    shard_pos: Vec<u64>,
}

impl<'a> Stream<'a> {
    pub(crate) fn new(ds: &'a Dataset, sep: bool) -> Stream<'a> {
        let sep = u64::from(sep);
        let mut shard_pos = Vec::with_capacity(ds.n_shards() + 1);
        let mut pos = 0u64;
        for s in 0..ds.n_shards() {
            shard_pos.push(pos);
            let offsets = ds.shard_offsets(s);
            let records = offsets.len() as u64 - 1;
            pos += offsets[offsets.len() - 1] + records * sep;
        }
        shard_pos.push(pos);
        Stream { ds, sep, shard_pos }
    }

    /// Tokens in the stream.
    pub(crate) fn len(&self) -> u64 {
        *self.shard_pos.last().expect("one entry past the end")
    }

    /// The length of document `doc` in the stream (separator included).
    pub(crate) fn doc_len(&self, s: usize, local: usize) -> u64 {
        let o = self.ds.shard_offsets(s);
        o[local + 1] - o[local] + self.sep
    }

    /// The document holding stream position `pos < len()`: its shard, its
    /// number within the shard, and the offset of `pos` inside it.
    fn locate(&self, pos: u64) -> (usize, usize, u64) {
        // The last shard starting at or before `pos` (shards of empty
        // documents share a start with the next one and are passed over).
        let s = self.shard_pos.partition_point(|&p| p <= pos) - 1;
        let o = self.ds.shard_offsets(s);
        let rel = pos - self.shard_pos[s];
        // The last document starting at or before `rel`: empty documents
        // share a start with the next one and are passed over in the same way.
        let records = o.len() - 1;
        let start = |i: usize| o[i] + i as u64 * self.sep;
        let mut lo = 0usize;
        let mut hi = records;
        while hi - lo > 1 {
            let mid = (lo + hi) / 2;
            if start(mid) <= rel {
                lo = mid;
            } else {
                hi = mid;
            }
        }
        (s, lo, rel - start(lo))
    }

    /// The pieces of row `row` of `seq_len` tokens: fewer than `seq_len`
    /// tokens only for the last row of a stream that does not divide evenly.
    pub(crate) fn row(&self, row: u64, seq_len: u32, out: &mut Vec<Piece>) {
        out.clear();
        let l = u64::from(seq_len);
        let begin = row * l;
        let end = (begin + l).min(self.len());
        if begin >= end {
            return;
        }
        let (mut s, mut local, mut offset) = self.locate(begin);
        let mut pos = begin;
        while pos < end {
            let records = self.ds.shard_offsets(s).len() - 1;
            if local == records {
                s += 1;
                local = 0;
                continue;
            }
            let n = self.doc_len(s, local);
            let take = (n - offset).min(end - pos);
            if take > 0 {
                out.push(Piece {
                    doc: self.ds.shard_first_record(s) + local as u64,
                    offset,
                    len: take as u32,
                });
            }
            pos += take;
            local += 1;
            offset = 0;
        }
    }
}

/// Counts over the whole stream, from document lengths alone.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub(crate) struct ConcatCounts {
    pub documents: u64,
    pub cut: u64,
    pub pieces: u64,
}

/// Counts for a stream of documents of `lengths` (separator included) of
/// which the first `written` tokens are kept, cut every `seq_len`: a document
/// is cut when it crosses a row boundary (the boundary before a dropped tail
/// included); it has a piece in every written row it touches.
pub(crate) fn counts(
    lengths: impl Iterator<Item = u64>,
    seq_len: u32,
    written: u64,
) -> ConcatCounts {
    let l = u64::from(seq_len);
    let mut c = ConcatCounts::default();
    let mut pos = 0u64;
    for n in lengths {
        if n == 0 {
            continue;
        }
        c.documents += 1;
        let end = pos + n;
        if pos / l != (end - 1) / l {
            c.cut += 1;
        }
        if pos < written {
            c.pieces += (end.min(written) - 1) / l - pos / l + 1;
        }
        pos = end;
    }
    c
}
