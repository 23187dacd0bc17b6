//! Concatenation: the documents end to end as one token stream, cut every
//! `L` tokens. Row `r` is the stream's tokens `r*L .. (r+1)*L`, so any row is
//! found from its number alone: rows can be written in input order or in any
//! permuted order without holding the stream.

use std::ops::Range;

use rayon::prelude::*;

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

/// Counts over a stream, from document lengths alone.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub(crate) struct ConcatCounts {
    /// Documents counted, empty ones included.
    pub records: u64,
    /// Documents counted with at least one token.
    pub documents: u64,
    /// Of those, the ones that cross a row boundary.
    pub cut: u64,
    /// Document pieces in the rows counted.
    pub pieces: u64,
}

/// Counts for a stream of documents of `lengths` (separator included) of
/// which the first `written` tokens are kept, cut every `seq_len`.
///
/// Documents are counted when their first stream position lies in `owned`
/// (an empty document sits at the position of the next one): a document is
/// cut when it crosses a row boundary (the boundary before a dropped tail
/// included). Pieces are counted in the stream rows `rows`: a document has a
/// piece in every written row it touches. `owned` and `rows` covering
/// everything (`0..u64::MAX`) give the counts of the whole stream; the shares
/// of a partitioned run tile both, so their counts add up to those.
pub(crate) fn counts(
    lengths: impl Iterator<Item = u64>,
    seq_len: u32,
    written: u64,
    owned: Range<u64>,
    rows: Range<u64>,
) -> ConcatCounts {
    let l = u64::from(seq_len);
    let lo = rows.start.saturating_mul(l).min(written);
    let hi = rows.end.saturating_mul(l).min(written);
    let mut c = ConcatCounts::default();
    let mut pos = 0u64;
    for n in lengths {
        let end = pos + n;
        if owned.contains(&pos) {
            c.records += 1;
            if n > 0 {
                c.documents += 1;
                if pos / l != (end - 1) / l {
                    c.cut += 1;
                }
            }
        }
        let (a, b) = (pos.max(lo), end.min(hi));
        if a < b {
            c.pieces += (b - 1) / l - a / l + 1;
        }
        pos = end;
    }
    c
}

/// Pieces in the stream rows `rows`, each found alone: for the rows of a
/// part of a seeded run, which lie scattered over the stream.
pub(crate) fn pieces_in(
    stream: &Stream,
    rows: impl ParallelIterator<Item = u64>,
    seq_len: u32,
) -> u64 {
    rows.map_init(Vec::new, |pieces, r| {
        stream.row(r, seq_len, pieces);
        pieces.len() as u64
    })
    .sum()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Counts of every share of a partitioned stream add up to the whole.
    #[test]
    fn shares_add_up_to_the_whole() {
        let lengths = [5u64, 0, 3, 17, 1, 0, 8, 9, 2, 30, 4, 0];
        let total: u64 = lengths.iter().sum();
        for l in [1u32, 3, 4, 7, 16, 100] {
            let lu = u64::from(l);
            for written in [total - total % lu, total] {
                let rows = written.div_ceil(lu);
                let whole = counts(
                    lengths.iter().copied(),
                    l,
                    written,
                    0..u64::MAX,
                    0..u64::MAX,
                );
                assert_eq!(whole.records, lengths.len() as u64);
                for n in 1..=5u64 {
                    let mut sum = ConcatCounts::default();
                    for i in 0..n {
                        let part = crate::partition::Part::new(i, n).unwrap();
                        let share = part.range(rows);
                        let owned_end = if part.is_last() {
                            u64::MAX
                        } else {
                            share.end * lu
                        };
                        let c = counts(
                            lengths.iter().copied(),
                            l,
                            written,
                            share.start * lu..owned_end,
                            share,
                        );
                        sum.records += c.records;
                        sum.documents += c.documents;
                        sum.cut += c.cut;
                        sum.pieces += c.pieces;
                    }
                    assert_eq!(sum, whole, "L={l} written={written} N={n}");
                }
            }
        }
    }
}
