//! Byte-level BPE: merges by rank over the bytes of one pre-token, with a
//! per-thread cache of the pieces already seen.
//!
//! HF tokenizers merges with a heap of (rank, position) and skips entries
//! made stale by earlier merges; that always merges the lowest-ranked
//! adjacent pair, leftmost first, which is what both paths here do: a scan of
//! a small array for short pieces, and a heap over a linked list for long
//! ones (long runs of one character or of code must not be quadratic).

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};

use foldhash::fast::FixedState;

use super::cache::PieceCache;
use super::compiled::{Reader, Stale, Words, Writer};

/// A merge: the rank of the pair and the id it makes.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Merge {
    pub rank: u32,
    pub id: u32,
}

/// No merge: what a symbol holds when the pair it starts has none.
pub(crate) const NO_MERGE: Merge = Merge {
    rank: NONE,
    id: NONE,
};

/// The model: byte ids and the merges between ids.
pub(crate) struct Bpe {
    /// The id of each single byte; [`NO_TOKEN`] for a byte the vocabulary
    /// lacks, which HF drops from the piece (when there is no unknown token).
    pub byte_ids: [u32; 256],
    /// `(left << 32 | right)` to the merge.
    pub merges: MergeTable,
    /// Whole pieces that are tokens, when the model has `ignore_merges`.
    pub whole: Option<HashMap<Box<[u8]>, u32, FixedState>>,
    /// The ids of bytes elsewhere than first in a piece, where the model has
    /// a `continuing_subword_prefix` or an `end_of_word_suffix`.
    pub affixed: Option<Box<Affixed>>,
}

/// The id of each byte by its place in a piece, as HF's `merge_word` spells
/// it: the prefix before every character but the first, the suffix after
/// the last ([`NO_TOKEN`] where the vocabulary lacks the spelling).
pub(crate) struct Affixed {
    /// Neither first nor last: prefix + byte.
    pub middle: [u32; 256],
    /// Last of several: prefix + byte + suffix.
    pub last: [u32; 256],
    /// A piece of one byte: byte + suffix.
    pub only: [u32; 256],
}

/// Pieces longer than this (in bytes) merge through the heap.
const SCAN_MAX: usize = 48;

/// One worker's reusable buffers and cache ([`PieceCache`]); nothing in it
/// changes the ids.
#[derive(Default)]
pub struct BpeState {
    cache: PieceCache,
    syms: Vec<(u32, Merge)>,
    heap: HeapMerge,
}

const NONE: u32 = u32::MAX;
/// The id of a byte with no token.
pub(crate) const NO_TOKEN: u32 = u32::MAX;

impl Bpe {
    #[inline(always)]
    fn merge(&self, left: u32, right: u32) -> Option<Merge> {
        self.merges.get(u64::from(left) << 32 | u64::from(right))
    }

    /// The ids of the bytes of `piece`, in order, without those the
    /// vocabulary lacks.
    #[inline]
    fn ids<'p>(&'p self, piece: &'p [u8]) -> impl Iterator<Item = u32> + Clone + 'p {
        let n = piece.len();
        piece
            .iter()
            .enumerate()
            .map(move |(i, &b)| match &self.affixed {
                None => self.byte_ids[b as usize],
                Some(a) if n == 1 => a.only[b as usize],
                Some(a) if i + 1 == n => a.last[b as usize],
                Some(a) if i > 0 => a.middle[b as usize],
                Some(_) => self.byte_ids[b as usize],
            })
            .filter(|&id| id != NO_TOKEN)
    }

    /// Appends the ids of `piece` to `out`.
    #[inline]
    pub(crate) fn encode(&self, piece: &[u8], state: &mut BpeState, out: &mut Vec<u32>) {
        if let [byte] = piece {
            let id = match &self.affixed {
                Some(a) => a.only[*byte as usize],
                None => self.byte_ids[*byte as usize],
            };
            if id != NO_TOKEN {
                out.push(id);
            }
            return;
        }
        // The cache first: a whole-token lookup (with `ignore_merges`) in
        // the large vocabulary map costs as much as a cache miss, and whole
        // tokens are cached too.
        if state.cache.get(piece, out) {
            return;
        }
        if let Some(whole) = &self.whole {
            if let Some(&id) = whole.get(piece) {
                out.push(id);
                state.cache.insert(piece, &[id]);
                return;
            }
        }
        let before = out.len();
        if piece.len() <= SCAN_MAX {
            self.merge_scan(piece, &mut state.syms);
            out.extend(state.syms.iter().map(|&(id, _)| id));
        } else {
            self.merge_heap(piece, state, out);
        }
        state.cache.insert(piece, &out[before..]);
    }

    /// Merging on a small array of (id, merge of the pair it starts): lowest
    /// rank, leftmost first; each merge looks up only the two pairs it
    /// changes.
    fn merge_scan(&self, piece: &[u8], syms: &mut Vec<(u32, Merge)>) {
        syms.clear();
        syms.extend(self.ids(piece).map(|id| (id, NO_MERGE)));
        merge_scan(syms, |left, right| self.merge(left, right));
    }

    /// Heap merging over a linked list, as HF does it.
    fn merge_heap(&self, piece: &[u8], state: &mut BpeState, out: &mut Vec<u32>) {
        state
            .heap
            .merge(self.ids(piece), |left, right| self.merge(left, right), out);
    }
}

/// The buffers of [`HeapMerge::merge`], kept by each worker.
#[derive(Default)]
pub(crate) struct HeapMerge {
    nodes: Vec<Node>,
    heap: BinaryHeap<Reverse<(u32, u32)>>,
}

/// A symbol in [`HeapMerge`]'s linked list.
#[derive(Clone, Copy)]
struct Node {
    id: u32,
    prev: u32,
    next: u32,
    alive: bool,
}

impl HeapMerge {
    /// Merges `ids` by `merge`'s ranks as HF does, with a heap of (rank,
    /// position) over a linked list, the entries made stale by earlier
    /// merges skipped: lowest rank, leftmost first, as [`merge_scan`] does,
    /// but not quadratic in a long piece. Pushes the ids left to `out`.
    /// Byte-level and SentencePiece-style BPE both merge this way.
    pub(crate) fn merge(
        &mut self,
        ids: impl Iterator<Item = u32>,
        merge: impl Fn(u32, u32) -> Option<Merge>,
        out: &mut Vec<u32>,
    ) {
        let HeapMerge { nodes, heap } = self;
        nodes.clear();
        heap.clear();
        nodes.extend(ids.enumerate().map(|(i, id)| Node {
            id,
            prev: if i == 0 { NONE } else { i as u32 - 1 },
            next: i as u32 + 1,
            alive: true,
        }));
        let Some(last) = nodes.last_mut() else {
            return;
        };
        last.next = NONE;
        for i in 0..nodes.len() - 1 {
            if let Some(m) = merge(nodes[i].id, nodes[i + 1].id) {
                heap.push(Reverse((m.rank, i as u32)));
            }
        }
        while let Some(Reverse((rank, pos))) = heap.pop() {
            let left = nodes[pos as usize];
            if !left.alive || left.next == NONE {
                continue;
            }
            let right = nodes[left.next as usize];
            // A stale entry: the pair at `pos` changed since it was pushed.
            let Some(m) = merge(left.id, right.id).filter(|m| m.rank == rank) else {
                continue;
            };
            nodes[pos as usize].id = m.id;
            nodes[pos as usize].next = right.next;
            nodes[left.next as usize].alive = false;
            if right.next != NONE {
                nodes[right.next as usize].prev = pos;
                if let Some(m) = merge(m.id, nodes[right.next as usize].id) {
                    heap.push(Reverse((m.rank, pos)));
                }
            }
            if left.prev != NONE {
                if let Some(m) = merge(nodes[left.prev as usize].id, m.id) {
                    heap.push(Reverse((m.rank, left.prev)));
                }
            }
        }
        let mut i = 0u32;
        while i != NONE {
            out.push(nodes[i as usize].id);
            i = nodes[i as usize].next;
        }
    }
}

/// Merges `syms`, a small array of (id, [`NO_MERGE`]), by `merge`'s ranks:
/// lowest rank, leftmost first; each merge looks up only the two pairs it
/// changes, and each symbol keeps the merge of the pair it starts, so the
/// merge taken is not looked up again. The symbols left are the ids.
/// Byte-level and SentencePiece-style BPE both merge this way.
#[inline]
pub(crate) fn merge_scan(syms: &mut Vec<(u32, Merge)>, merge: impl Fn(u32, u32) -> Option<Merge>) {
    let pair = |left: u32, right: u32| merge(left, right).unwrap_or(NO_MERGE);
    for i in 0..syms.len().saturating_sub(1) {
        syms[i].1 = pair(syms[i].0, syms[i + 1].0);
    }
    loop {
        let mut best = (NONE, 0);
        for (i, &(_, m)) in syms.iter().enumerate() {
            if m.rank < best.0 {
                best = (m.rank, i);
            }
        }
        if best.0 == NONE {
            break;
        }
        let i = best.1;
        let id = syms[i].1.id;
        syms[i].0 = id;
        syms.remove(i + 1);
        syms[i].1 = match syms.get(i + 1) {
            Some(&(next, _)) => pair(id, next),
            None => NO_MERGE,
        };
        if i > 0 {
            syms[i - 1].1 = pair(syms[i - 1].0, id);
        }
    }
}

impl Bpe {
    /// Writes the model's tables for [`Bpe::read`].
    pub(crate) fn write(&self, w: &mut Writer) {
        w.u32s(&self.byte_ids);
        self.merges.write(w);
        w.opt(self.whole.as_ref(), |w, whole| w.vocab(whole));
        w.opt(self.affixed.as_deref(), |w, a| {
            for table in [&a.middle, &a.last, &a.only] {
                w.u32s(table);
            }
        });
    }

    /// The model [`Bpe::write`] wrote.
    pub(crate) fn read(r: &mut Reader) -> Result<Bpe, Stale> {
        Ok(Bpe {
            byte_ids: *r.table()?,
            merges: MergeTable::read(r)?,
            whole: r.opt(|r| r.byte_map())?,
            affixed: r.opt(|r| {
                Ok(Box::new(Affixed {
                    middle: *r.table()?,
                    last: *r.table()?,
                    only: *r.table()?,
                }))
            })?,
        })
    }
}

/// The merges: `(left << 32 | right)` to the merge, in one flat table with
/// open addressing (linear probing, at most half full). A compiled form
/// holds the table as it lies in memory, and a later run uses it in place in
/// the mapped file: Gemma 3's 514,906 merges were 15 to 19 ms of half a
/// million inserts at random places in a fresh hash map before.
pub(crate) struct MergeTable {
    /// Two words a slot: the key, then `rank << 32 | id`; [`EMPTY`] keys
    /// mark free slots.
    slots: Words,
    /// 64 less the log2 of the slots: a key's home is its hash's top bits.
    shift: u32,
}

/// A free slot's key; no pair of ids is it (an id is below `u32::MAX`).
const EMPTY: u64 = u64::MAX;

/// The slots of a table for at most `n` merges.
fn slots_for(n: usize) -> usize {
    n.saturating_mul(2).next_power_of_two().max(16)
}

/// Where the probe for `key` starts in a table of `1 << (64 - shift)`
/// slots (Fibonacci hashing).
#[inline(always)]
fn home(key: u64, shift: u32) -> usize {
    (key.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> shift) as usize
}

/// A table being filled from a `tokenizer.json`.
pub(crate) struct MergeTableBuilder {
    slots: Vec<u64>,
    shift: u32,
}

impl MergeTableBuilder {
    /// An empty table for at most `n` merges.
    pub(crate) fn with_capacity(n: usize) -> MergeTableBuilder {
        let slots = slots_for(n);
        MergeTableBuilder {
            slots: vec![EMPTY; 2 * slots],
            shift: 64 - slots.trailing_zeros(),
        }
    }

    /// Sets `key`'s merge (a pair listed twice keeps the later one), or
    /// says `false` for the one key the table cannot hold (two ids of
    /// `u32::MAX`). At most the capacity asked for may be inserted.
    #[must_use]
    pub(crate) fn insert(&mut self, key: u64, merge: Merge) -> bool {
        if key == EMPTY {
            return false;
        }
        let mask = self.slots.len() / 2 - 1;
        let mut i = home(key, self.shift);
        while self.slots[2 * i] != EMPTY && self.slots[2 * i] != key {
            i = (i + 1) & mask;
        }
        self.slots[2 * i] = key;
        self.slots[2 * i + 1] = u64::from(merge.rank) << 32 | u64::from(merge.id);
        true
    }

    pub(crate) fn finish(self) -> MergeTable {
        MergeTable {
            slots: Words::Owned(self.slots),
            shift: self.shift,
        }
    }
}

impl MergeTable {
    /// `key`'s merge, if it has one.
    #[inline(always)]
    pub(crate) fn get(&self, key: u64) -> Option<Merge> {
        if key == EMPTY {
            return None;
        }
        let slots: &[u64] = &self.slots;
        let mask = slots.len() / 2 - 1;
        let mut i = home(key, self.shift);
        // At most every slot: a table is never full, but a probe must end
        // whatever a mapped file holds.
        for _ in 0..=mask {
            let k = slots[2 * i];
            if k == key {
                let v = slots[2 * i + 1];
                return Some(Merge {
                    rank: (v >> 32) as u32,
                    id: v as u32,
                });
            }
            if k == EMPTY {
                return None;
            }
            i = (i + 1) & mask;
        }
        None
    }

    /// How many merges it holds.
    #[cfg(test)]
    fn len(&self) -> usize {
        self.slots.chunks(2).filter(|s| s[0] != EMPTY).count()
    }

    /// Writes the slots as they lie, for [`MergeTable::read`].
    pub(crate) fn write(&self, w: &mut Writer) {
        w.words(&self.slots);
    }

    /// The table [`MergeTable::write`] wrote (a power of two of slots, two
    /// words each), in place where the compiled form is mapped.
    pub(crate) fn read(r: &mut Reader) -> Result<MergeTable, Stale> {
        let slots = r.words()?;
        let n = slots.len() / 2;
        if slots.len() % 2 != 0 || !n.is_power_of_two() || n < 16 {
            return Err(Stale("the merge table's size is not a power of two".into()));
        }
        Ok(MergeTable {
            slots,
            shift: 64 - n.trailing_zeros(),
        })
    }
}

#[cfg(test)]
mod merge_table_tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        /// The table answers as a map does: the last merge of each pair,
        /// none for the rest, built or read back from its compiled bytes.
        #[test]
        fn a_merge_table_is_a_map(
            pairs in proptest::collection::vec((0u32..300, 0u32..300, any::<u32>()), 0..400),
            probes in proptest::collection::vec((0u32..300, 0u32..300), 0..200),
        ) {
            let mut table = MergeTableBuilder::with_capacity(pairs.len());
            let mut map = HashMap::new();
            for (rank, &(l, r, id)) in pairs.iter().enumerate() {
                let key = u64::from(l) << 32 | u64::from(r);
                let merge = Merge { rank: rank as u32, id };
                prop_assert!(table.insert(key, merge));
                map.insert(key, merge);
            }
            let table = table.finish();
            let mut w = Writer::default();
            table.write(&mut w);
            let back = MergeTable::read(&mut Reader::new(&w.buf)).unwrap();
            prop_assert_eq!(table.len(), map.len());
            let keys = pairs.iter().map(|&(l, r, _)| (l, r)).chain(probes);
            for (l, r) in keys {
                let key = u64::from(l) << 32 | u64::from(r);
                let want = map.get(&key).map(|m| (m.rank, m.id));
                prop_assert_eq!(table.get(key).map(|m| (m.rank, m.id)), want);
                prop_assert_eq!(back.get(key).map(|m| (m.rank, m.id)), want);
            }
            prop_assert!(table.get(EMPTY).is_none());
        }
    }
}
