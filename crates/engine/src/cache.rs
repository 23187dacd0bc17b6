//! A worker's cache of the ids of the pieces it has seen.
//!
//! On a long run most pieces are found in the cache, so what a lookup
//! costs decides the speed. A lookup in a hash map is two misses to memory
//! (control bytes, then the entry) and its growth copies every entry; here
//! short pieces go in a table of sets of two entries, one 64-byte line
//! each, so a lookup touches one line.
//!
//! The table starts at [`MIN_SETS`] sets (256 KiB, well inside a core's L2
//! cache) and grows fourfold each time it has taken twice as many pieces
//! as it has sets, up to [`MAX_SETS`] (4 MiB): a text with few distinct
//! pieces keeps a small table, a large corpus one that holds most of its
//! frequent pieces. (On the debian-docs corpus with GPT-2, one thread, 4
//! MiB took 7% off the run against a fixed 1 MiB; 16 MiB gained nothing
//! more, its lookups missing the L2 cache.) The pieces it loses are merged
//! (or segmented) again. Nothing in it changes the ids.
//!
//! An entry is a piece of 1 to 15 bytes as one `u128` ([`key`]) and up to
//! [`IDS`] ids inline. A set keeps its most recently used entry first; a
//! new entry replaces the other. [`PieceCache`] puts the pieces the table
//! does not take (longer, or with more ids) in a map of at most
//! [`LONG_PIECES`] pieces and [`LONG_IDS`] ids, emptied when full: with
//! keys of up to 64 bytes, under 5 MiB. Every model's cache is a
//! [`PieceCache`]: at most about 9 MiB a worker.

use std::collections::HashMap;

use foldhash::fast::FixedState;

/// The sets of a new table: two entries each...
pub(crate) const MIN_SETS: usize = 1 << 12;

/// ...and of the largest.
pub(crate) const MAX_SETS: usize = 1 << 16;

/// The most ids an entry holds.
pub(crate) const IDS: usize = 4;

/// After an entry's last id.
const END: u32 = u32::MAX;

/// The most pieces in the map of those the table does not take...
pub(crate) const LONG_PIECES: usize = 1 << 15;

/// ...and the most ids.
pub(crate) const LONG_IDS: usize = 1 << 18;

/// The ids of pieces: short ones in the table, the others in a map whose
/// entries point into `arena`.
#[derive(Default)]
pub(crate) struct PieceCache {
    short: ShortCache,
    long: HashMap<Box<[u8]>, (u32, u32), FixedState>,
    arena: Vec<u32>,
}

impl PieceCache {
    /// Appends the ids cached for `piece` and says whether there were any.
    #[inline(always)]
    pub(crate) fn get(&mut self, piece: &[u8], out: &mut Vec<u32>) -> bool {
        if key(piece).is_some_and(|key| self.short.get(key, out)) {
            return true;
        }
        // Short pieces with more ids than the table holds are here too.
        match self.long.get(piece) {
            Some(&(start, len)) => {
                out.extend_from_slice(&self.arena[start as usize..(start + len) as usize]);
                true
            }
            None => false,
        }
    }

    /// Caches the ids of `piece`.
    pub(crate) fn insert(&mut self, piece: &[u8], ids: &[u32]) {
        if key(piece).is_some_and(|key| self.short.insert(key, ids)) {
            return;
        }
        if self.arena.len() + ids.len() > LONG_IDS || self.long.len() >= LONG_PIECES {
            self.long.clear();
            self.arena.clear();
        }
        let entry = (self.arena.len() as u32, ids.len() as u32);
        self.arena.extend_from_slice(ids);
        self.long.insert(piece.into(), entry);
    }
}

/// The table; empty until the first insert.
#[derive(Default)]
struct ShortCache {
    sets: Vec<Set>,
    /// `64 - log2(sets.len())`: the shift that takes a hash to a set.
    shift: u32,
    /// Pieces taken since the table last grew.
    taken: usize,
}

/// Two entries whose keys hash alike, the most recently used first.
#[derive(Clone, Copy, Default)]
#[repr(C, align(64))]
struct Set([Entry; 2]);

/// A cached piece: its key (0 where none) and its ids, [`END`] after the
/// last.
#[derive(Clone, Copy, Default)]
#[repr(C)]
struct Entry {
    key: u128,
    ids: [u32; IDS],
}

/// The bytes of a piece of at most 15 bytes as one little-endian integer,
/// zero above them. Read with at most two overlapping loads: copying the
/// bytes into a buffer and reading it back as an integer stalls that read
/// until the copy's stores drain.
#[inline(always)]
pub(crate) fn pack(p: &[u8]) -> u128 {
    let n = p.len();
    debug_assert!(n <= 15);
    let word = |at: usize| u64::from_le_bytes(p[at..at + 8].try_into().expect("8 bytes"));
    let half = |at: usize| {
        u64::from(u32::from_le_bytes(
            p[at..at + 4].try_into().expect("4 bytes"),
        ))
    };
    let (lo, hi) = match n {
        0 => (0, 0),
        // The first, middle and last bytes: all of them, overlapping.
        1..=3 => {
            let byte = |i: usize| u64::from(p[i]) << (8 * i);
            (byte(0) | byte(n / 2) | byte(n - 1), 0)
        }
        4..=7 => (half(0) | half(n - 4) << (8 * (n - 4)), 0),
        8 => (word(0), 0),
        _ => (word(0), word(n - 8) >> (8 * (16 - n))),
    };
    u128::from(lo) | u128::from(hi) << 64
}

/// A piece of 1 to 15 bytes as one integer: its bytes, and its length in
/// the top byte (so never 0, and `a` and `a\0` differ); `None` for others.
#[inline(always)]
pub(crate) fn key(piece: &[u8]) -> Option<u128> {
    (1..=15)
        .contains(&piece.len())
        .then(|| pack(piece) | (piece.len() as u128) << 120)
}

/// The set of a key in a table of `64 - shift` bits of sets.
#[inline(always)]
fn set_of(key: u128, shift: u32) -> usize {
    let folded = (key as u64) ^ ((key >> 64) as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    (folded.wrapping_mul(0xD6E8_FEB8_6659_FD93) >> shift) as usize
}

impl ShortCache {
    /// Appends the ids cached for `key` and says whether there were any.
    #[inline(always)]
    fn get(&mut self, key: u128, out: &mut Vec<u32>) -> bool {
        let Some(set) = self.sets.get_mut(set_of(key, self.shift)) else {
            return false;
        };
        if set.0[1].key == key {
            set.0.swap(0, 1);
        }
        if set.0[0].key != key {
            return false;
        }
        let ids = &set.0[0].ids;
        let n = ids.iter().position(|&id| id == END).unwrap_or(IDS);
        // All four, then the unused cut off: a copy of a fixed 16 bytes,
        // where one of `n` ids is a call to memcpy.
        let len = out.len();
        out.extend_from_slice(ids);
        out.truncate(len + n);
        true
    }

    /// Caches `ids` for `key`, if they are at most [`IDS`]; says whether
    /// it did.
    fn insert(&mut self, key: u128, ids: &[u32]) -> bool {
        if ids.len() > IDS {
            return false;
        }
        if self.sets.is_empty() {
            self.resize(MIN_SETS);
        } else if self.taken >= 2 * self.sets.len() && self.sets.len() < MAX_SETS {
            self.resize(self.sets.len() * 4);
        }
        let mut entry = Entry {
            key,
            ids: [END; IDS],
        };
        entry.ids[..ids.len()].copy_from_slice(ids);
        self.put(entry);
        self.taken += 1;
        true
    }

    /// Puts `entry` first in its set; the set's other entry goes.
    #[inline(always)]
    fn put(&mut self, entry: Entry) {
        let set = &mut self.sets[set_of(entry.key, self.shift)];
        set.0[1] = set.0[0];
        set.0[0] = entry;
    }

    /// Moves the entries to a table of `sets` sets, the older of each set
    /// first so that the newer stays first where both land together.
    #[cold]
    fn resize(&mut self, sets: usize) {
        debug_assert!(sets.is_power_of_two());
        let old = std::mem::replace(&mut self.sets, vec![Set::default(); sets]);
        self.shift = 64 - sets.trailing_zeros();
        self.taken = 0;
        for slot in [1, 0] {
            for set in &old {
                if set.0[slot].key != 0 {
                    self.put(set.0[slot]);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pack_is_the_bytes_zero_extended() {
        let bytes: Vec<u8> = (1..=15).map(|b| b * 17).collect();
        for n in 0..=15 {
            let mut want = [0u8; 16];
            want[..n].copy_from_slice(&bytes[..n]);
            assert_eq!(pack(&bytes[..n]), u128::from_le_bytes(want), "{n} bytes");
        }
    }

    #[test]
    fn keys_tell_pieces_apart() {
        assert_eq!(key(b""), None);
        assert_eq!(key(&[b'a'; 16]), None);
        assert_ne!(key(b"a"), key(b"a\0"));
        assert_ne!(key(b"\0"), Some(0));
    }

    #[test]
    fn pieces_of_every_kind_are_found_as_cached() {
        let mut cache = PieceCache::default();
        let long = "x".repeat(40);
        let pieces: [(&[u8], Vec<u32>); 4] = [
            (b"ab", vec![7]),
            (b"abcdef", vec![1, 2, 3, 4, 5, 6]),
            (long.as_bytes(), vec![9, 9]),
            (b"", vec![3]),
        ];
        for (piece, ids) in &pieces {
            cache.insert(piece, ids);
        }
        for (piece, ids) in &pieces {
            let mut out = vec![0];
            assert!(cache.get(piece, &mut out));
            assert_eq!(out[1..], ids[..]);
        }
        // Past its limit, the map is emptied, never wrong.
        for n in 0..LONG_PIECES + 10 {
            cache.insert(format!("{n:040}").as_bytes(), &[n as u32]);
        }
        let mut out = Vec::new();
        assert!(cache.get(format!("{:040}", LONG_PIECES + 9).as_bytes(), &mut out));
        assert_eq!(out, [(LONG_PIECES + 9) as u32]);
    }

    #[test]
    fn what_is_found_is_what_was_cached() {
        let mut cache = ShortCache::default();
        let mut out = Vec::new();
        assert!(!cache.get(key(b"x").unwrap(), &mut out));
        assert!(!cache.insert(key(b"x").unwrap(), &[1, 2, 3, 4, 5]));
        // Many more pieces than entries: each one found is right, and the
        // most recent of each set is always found.
        let pieces: Vec<String> = (0..4 * MAX_SETS).map(|n| format!("p{n}")).collect();
        for (n, p) in pieces.iter().enumerate() {
            let ids: Vec<u32> = (0..(n % (IDS + 1)) as u32).collect();
            cache.insert(key(p.as_bytes()).unwrap(), &ids);
            out.clear();
            assert!(cache.get(key(p.as_bytes()).unwrap(), &mut out));
            assert_eq!(out, ids);
        }
        for (n, p) in pieces.iter().enumerate() {
            out.clear();
            if cache.get(key(p.as_bytes()).unwrap(), &mut out) {
                assert_eq!(out, (0..(n % (IDS + 1)) as u32).collect::<Vec<_>>(), "{p}");
            }
        }
    }
}
