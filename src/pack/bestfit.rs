//! Best-fit-decreasing packing of one window of documents into rows.
//!
//! A document of more than `L` tokens is cut into pieces of `L` (each a row
//! of its own) and a remainder; those are the only cuts. The remainders and
//! the documents of at most `L` tokens are then placed, longest first, each
//! into the open row with the least room that still holds it, or into a new
//! row. Finding that row is a successor query over remaining capacities
//! `0..=L`: a 64-ary tree of bitsets (the segment tree of Ding et al., 2024,
//! with 64-way nodes) answers it in `O(log_64 L)` word operations, and a
//! list of rows per capacity hands out one of them. Sorting by length is a
//! counting sort over `1..L`, so a window of `n` pieces packs in
//! `O(n log L + L)` time.

/// One piece of a document: `len` tokens from `offset` of document `doc`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Piece {
    /// The document's record number in the input.
    pub doc: u64,
    /// Where the piece starts in the document.
    pub offset: u64,
    /// Tokens in the piece, 1 to `L`.
    pub len: u32,
}

/// The rows of one window, in packing order (rows of whole `L`-token pieces
/// first, then best-fit rows in the order they were opened).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct WindowPlan {
    /// The pieces of every row, row after row; within a row in document order.
    pub pieces: Vec<Piece>,
    /// Row `r` holds `pieces[row_start[r]..row_start[r + 1]]`.
    pub row_start: Vec<usize>,
    /// Documents of more than `L` tokens (the only ones cut).
    pub cut: u64,
    /// Documents with at least one token.
    pub documents: u64,
    /// Tokens of all pieces.
    pub tokens: u64,
}

impl WindowPlan {
    /// Rows in the window.
    pub fn n_rows(&self) -> usize {
        self.row_start.len().saturating_sub(1)
    }

    /// The pieces of row `r`.
    pub fn row(&self, r: usize) -> &[Piece] {
        &self.pieces[self.row_start[r]..self.row_start[r + 1]]
    }
}

const NONE: u32 = u32::MAX;

/// Packs documents `first_doc, first_doc + 1, ...` of the given lengths
/// (separator included) into rows of `seq_len` tokens. Empty documents are
/// skipped.
///
/// `lengths` is walked three times and never copied, and the work is done
/// per document, with no list of pieces before the last step: a document's
/// pieces follow from its length, so the passes keep 4 bytes per document
/// (its place in the order, the row of its remainder) and only the plan
/// itself holds pieces. A window is planned once per run, in memory that is
/// new to the process, and that memory costs more than the work.
pub fn plan<I>(first_doc: u64, lengths: I, seq_len: u32) -> WindowPlan
where
    I: IntoIterator<Item = u64>,
    I::IntoIter: Clone,
{
    let lengths = lengths.into_iter();
    let l = u64::from(seq_len.max(1));
    let mut plan = WindowPlan::default();
    // Remainders counted by length; full rows numbered in document order.
    let mut count = vec![0usize; l as usize];
    let mut full_rows = 0u64;
    let mut n_docs = 0usize;
    for n in lengths.clone() {
        n_docs += 1;
        if n == 0 {
            continue;
        }
        plan.documents += 1;
        plan.tokens += n;
        plan.cut += u64::from(n > l);
        full_rows += n / l;
        count[(n % l) as usize] += 1;
    }
    let full_rows = u32::try_from(full_rows).expect("a window of fewer than 2^32 rows");

    // Remainders by decreasing length, ties in document order: a counting
    // sort of the documents' numbers in the window. `first[len]` is where
    // the remainders of `len` tokens begin in `order`.
    let mut first = vec![0usize; l as usize + 1];
    let mut at = 0;
    for len in (1..l as usize).rev() {
        first[len] = at;
        at += count[len];
    }
    let mut order = vec![0u32; at];
    let mut slot = first.clone();
    for (i, n) in lengths.clone().enumerate() {
        let rem = (n % l) as usize;
        if rem > 0 {
            order[slot[rem]] = i as u32;
            slot[rem] += 1;
        }
    }

    // Best fit, longest first. `row_of[i]` is the best-fit row (from 0)
    // of document `i`'s remainder.
    let mut row_of = vec![0u32; n_docs];
    let mut open = OpenRows::new(l as usize);
    for len in (1..l as usize).rev() {
        for &i in &order[first[len]..first[len] + count[len]] {
            row_of[i as usize] = open.place(len);
        }
    }
    drop(order);

    // The rows: full rows first, one piece each, then the best-fit rows,
    // each row's pieces in document order.
    let fitted = open.n_rows();
    let rows = full_rows as usize + fitted;
    // Row r < full_rows starts at piece r.
    let mut start: Vec<usize> = (0..=full_rows as usize).collect();
    start.resize(rows + 1, 0);
    for (n, &r) in lengths.clone().zip(&row_of) {
        if n % l > 0 {
            start[full_rows as usize + r as usize + 1] += 1;
        }
    }
    for r in full_rows as usize..rows {
        start[r + 1] += start[r];
    }
    let mut fill = start[full_rows as usize..rows].to_vec();
    let n_pieces = start[rows];
    let mut pieces = vec![
        Piece {
            doc: 0,
            offset: 0,
            len: 0
        };
        n_pieces
    ];
    let mut full = 0usize;
    for (i, (n, &r)) in lengths.zip(&row_of).enumerate() {
        let doc = first_doc + i as u64;
        for k in 0..n / l {
            pieces[full] = Piece {
                doc,
                offset: k * l,
                len: l as u32,
            };
            full += 1;
        }
        if n % l > 0 {
            let at = &mut fill[r as usize];
            pieces[*at] = Piece {
                doc,
                offset: n - n % l,
                len: (n % l) as u32,
            };
            *at += 1;
        }
    }
    plan.pieces = pieces;
    plan.row_start = start;
    plan
}

/// The rows being filled, by the room each has left: rows with room `c`
/// are listed under `c`, and the tree finds the smallest `c` that holds a
/// piece.
struct OpenRows {
    capacities: Capacities,
    /// The first row with room `c`, or [`NONE`].
    head: Vec<u32>,
    /// The next row with the same room as row `r`, or [`NONE`].
    next: Vec<u32>,
}

impl OpenRows {
    fn new(seq_len: usize) -> OpenRows {
        OpenRows {
            capacities: Capacities::new(seq_len),
            head: vec![NONE; seq_len + 1],
            next: Vec::new(),
        }
    }

    /// Places a piece of `len` tokens in the open row with the least room
    /// that holds it, or in a new row; returns the row, numbered in the
    /// order rows were opened.
    fn place(&mut self, len: usize) -> u32 {
        let (row, room) = match self.capacities.first_at_least(len) {
            Some(c) => {
                let row = self.head[c];
                self.head[c] = self.next[row as usize];
                if self.head[c] == NONE {
                    self.capacities.remove(c);
                }
                (row, c - len)
            }
            None => {
                self.next.push(NONE);
                (self.next.len() as u32 - 1, self.head.len() - 1 - len)
            }
        };
        if room > 0 {
            self.next[row as usize] = self.head[room];
            if self.head[room] == NONE {
                self.capacities.insert(room);
            }
            self.head[room] = row;
        }
        row
    }

    /// Rows opened.
    fn n_rows(&self) -> usize {
        self.next.len()
    }
}

/// A set of capacities `0..=max`, answering "the smallest member at least
/// `x`": a 64-ary tree of bitsets, one bit per member at the bottom and one
/// bit per non-empty word on each level above.
#[derive(Debug, Clone)]
pub struct Capacities {
    levels: Vec<Vec<u64>>,
}

impl Capacities {
    /// The empty set over `0..=max`.
    pub fn new(max: usize) -> Capacities {
        let mut levels = Vec::new();
        let mut n = max + 1;
        loop {
            let words = n.div_ceil(64);
            levels.push(vec![0u64; words]);
            if words == 1 {
                return Capacities { levels };
            }
            n = words;
        }
    }

    /// Adds `x`.
    pub fn insert(&mut self, mut x: usize) {
        for level in &mut self.levels {
            let word = &mut level[x / 64];
            let was_empty = *word == 0;
            *word |= 1 << (x % 64);
            if !was_empty {
                return;
            }
            x /= 64;
        }
    }

    /// Removes `x`.
    pub fn remove(&mut self, mut x: usize) {
        for level in &mut self.levels {
            let word = &mut level[x / 64];
            *word &= !(1 << (x % 64));
            if *word != 0 {
                return;
            }
            x /= 64;
        }
    }

    /// The smallest member at least `x`, if any.
    pub fn first_at_least(&self, x: usize) -> Option<usize> {
        self.successor(0, x)
    }

    fn successor(&self, level: usize, x: usize) -> Option<usize> {
        let words = &self.levels[level];
        let w = x / 64;
        let here = *words.get(w)? & (u64::MAX << (x % 64));
        if here != 0 {
            return Some(w * 64 + here.trailing_zeros() as usize);
        }
        if level + 1 == self.levels.len() {
            return None;
        }
        let w = self.successor(level + 1, w + 1)?;
        Some(w * 64 + words[w].trailing_zeros() as usize)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::BTreeSet;

    /// The plan as it was first written, a list of pieces at a time: the
    /// plan must stay exactly this one, or packed outputs would change.
    fn reference_plan(first_doc: u64, lengths: &[u64], seq_len: u32) -> WindowPlan {
        let l = u64::from(seq_len.max(1));
        // Every piece in document order; full rows get their number at once.
        let mut pieces = Vec::with_capacity(lengths.len());
        let mut row_of: Vec<u32> = Vec::with_capacity(lengths.len());
        let mut full_rows = 0u32;
        let mut plan = WindowPlan::default();
        for (i, &n) in lengths.iter().enumerate() {
            if n == 0 {
                continue;
            }
            plan.documents += 1;
            plan.tokens += n;
            if n > l {
                plan.cut += 1;
            }
            let doc = first_doc + i as u64;
            for k in 0..n / l {
                pieces.push(Piece {
                    doc,
                    offset: k * l,
                    len: l as u32,
                });
                row_of.push(full_rows);
                full_rows += 1;
            }
            if n % l > 0 {
                pieces.push(Piece {
                    doc,
                    offset: n - n % l,
                    len: (n % l) as u32,
                });
                row_of.push(NONE);
            }
        }

        // Remainders by decreasing length, ties in document order: a counting sort.
        let mut count = vec![0usize; l as usize + 1];
        for (p, &r) in pieces.iter().zip(&row_of) {
            if r == NONE {
                count[p.len as usize] += 1;
            }
        }
        let mut at = 0;
        for len in (1..=l as usize).rev() {
            let c = count[len];
            count[len] = at;
            at += c;
        }
        let mut order = vec![0u32; at];
        for (i, (p, &r)) in pieces.iter().zip(&row_of).enumerate() {
            if r == NONE {
                let slot = &mut count[p.len as usize];
                order[*slot] = i as u32;
                *slot += 1;
            }
        }

        // Best fit.
        let mut open = OpenRows::new(l as usize);
        for &i in &order {
            row_of[i as usize] = full_rows + open.place(pieces[i as usize].len as usize);
        }
        let rows = full_rows + open.n_rows() as u32;

        // Group the pieces by row, each row's in document order.
        let mut start = vec![0usize; rows as usize + 1];
        for &r in &row_of {
            start[r as usize + 1] += 1;
        }
        for r in 0..rows as usize {
            start[r + 1] += start[r];
        }
        let mut fill = start.clone();
        let mut grouped = vec![
            Piece {
                doc: 0,
                offset: 0,
                len: 0
            };
            pieces.len()
        ];
        for (p, &r) in pieces.iter().zip(&row_of) {
            grouped[fill[r as usize]] = *p;
            fill[r as usize] += 1;
        }
        plan.pieces = grouped;
        plan.row_start = start;
        plan
    }

    proptest! {
        #[test]
        fn capacities_match_a_btreeset(
            max in 1usize..5000,
            ops in proptest::collection::vec((any::<bool>(), 0usize..5000), 0..300),
        ) {
            let mut tree = Capacities::new(max);
            let mut set = BTreeSet::new();
            for (add, x) in ops {
                let x = x % (max + 1);
                if add { tree.insert(x); set.insert(x); } else { tree.remove(x); set.remove(&x); }
                for q in [0, x, x + 1, max / 2, max] {
                    prop_assert_eq!(tree.first_at_least(q), set.range(q..).next().copied());
                }
            }
        }

        #[test]
        fn every_token_once_and_short_documents_whole(
            seq_len in 1u32..64,
            lengths in proptest::collection::vec(0u64..200, 0..200),
        ) {
            let plan = plan(100, lengths.iter().copied(), seq_len);
            let l = u64::from(seq_len);
            // Rows fit, pieces are non-empty.
            for r in 0..plan.n_rows() {
                let row = plan.row(r);
                prop_assert!(!row.is_empty());
                prop_assert!(row.iter().map(|p| u64::from(p.len)).sum::<u64>() <= l);
            }
            // Each document is covered exactly, in pieces of L and one remainder.
            let mut pieces = plan.pieces.clone();
            pieces.sort_by_key(|p| (p.doc, p.offset));
            let mut at = vec![0u64; lengths.len()];
            for p in &pieces {
                let i = (p.doc - 100) as usize;
                prop_assert_eq!(p.offset, at[i]);
                at[i] += u64::from(p.len);
                if at[i] < lengths[i] {
                    prop_assert_eq!(u64::from(p.len), l, "only the last piece is short");
                }
            }
            prop_assert_eq!(&at, &lengths);
            let short = lengths.iter().filter(|&&n| n > 0 && n <= l).count();
            let single = pieces.iter().filter(|p| p.offset == 0 && lengths[(p.doc - 100) as usize] <= l).count();
            prop_assert_eq!(short, single, "a document of at most L tokens is one piece");
            prop_assert_eq!(plan.cut as usize, lengths.iter().filter(|&&n| n > l).count());
        }

        #[test]
        fn the_plan_is_the_reference_plan(
            seq_len in 1u32..80,
            first_doc in 0u64..1000,
            lengths in proptest::collection::vec(
                prop_oneof![0u64..80, 0u64..400, Just(0u64)], 0..300),
        ) {
            prop_assert_eq!(
                plan(first_doc, lengths.iter().copied(), seq_len),
                reference_plan(first_doc, &lengths, seq_len)
            );
        }

        #[test]
        fn at_most_one_row_is_half_empty(
            seq_len in 2u32..50,
            lengths in proptest::collection::vec(1u64..50, 1..100),
        ) {
            // A row is opened only for a piece that fits no open row. If two
            // rows ended at most half full, the later one's first (longest)
            // piece, at most L/2, would have fitted the earlier one.
            let plan = plan(0, lengths.iter().copied(), seq_len);
            let l = u64::from(seq_len);
            let used: Vec<u64> = (0..plan.n_rows())
                .map(|r| plan.row(r).iter().map(|p| u64::from(p.len)).sum())
                .collect();
            let total: u64 = lengths.iter().sum();
            prop_assert!(plan.n_rows() as u64 >= total.div_ceil(l));
            let half_empty = used.iter().filter(|&&u| u * 2 <= l).count();
            prop_assert!(half_empty <= 1, "{:?}", used);
        }
    }

    #[test]
    fn best_fit_picks_the_tightest_row() {
        // 6 and 5 open two rows of 10 (rooms 4 and 5); 4 goes to room 4 (tightest),
        // then 5 to room 5.
        let plan = plan(0, [6, 5, 4, 5], 10);
        assert_eq!(plan.n_rows(), 2);
        let docs = |r: usize| plan.row(r).iter().map(|p| p.doc).collect::<Vec<_>>();
        assert_eq!(docs(0), vec![0, 2]);
        assert_eq!(docs(1), vec![1, 3]);
    }

    #[test]
    fn long_documents_become_full_rows_and_a_remainder() {
        let plan = plan(7, [25, 0, 3], 10);
        assert_eq!(plan.cut, 1);
        assert_eq!(plan.documents, 2);
        assert_eq!(plan.n_rows(), 3, "two full rows, then 5 + 3 in one");
        assert_eq!(
            plan.row(0),
            &[Piece {
                doc: 7,
                offset: 0,
                len: 10
            }]
        );
        assert_eq!(
            plan.row(1),
            &[Piece {
                doc: 7,
                offset: 10,
                len: 10
            }]
        );
        assert_eq!(
            plan.row(2),
            &[
                Piece {
                    doc: 7,
                    offset: 20,
                    len: 5
                },
                Piece {
                    doc: 9,
                    offset: 0,
                    len: 3
                }
            ]
        );
    }
}
