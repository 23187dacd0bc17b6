//! The order in which training streams a dataset from object storage: blocks
//! of consecutive records, dealt to a fixed number of streams, shuffled
//! within windows of blocks, and read round-robin across the streams.
//!
//! [`Sampler`](super::Sampler)'s order is a permutation of every record: the
//! best mixing, but each rank touches every part of the dataset every
//! epoch, which a local mmap serves well and a remote store does not. This
//! order keeps what a streaming reader needs small and local:
//!
//! # The order
//!
//! With `n` records, `block` records per block, `window` blocks per window,
//! `streams` streams (`P`), a seed and an epoch `e`:
//!
//! 1. The `nb = ceil(n / block)` blocks (block `b` is records
//!    `b * block ..`, the last one possibly shorter) are permuted by the
//!    Feistel permutation of [`crate::permute`] for (seed, epoch).
//! 2. The permuted sequence is cut into `P` contiguous runs, stream `p`
//!    taking slots `p * nb / P .. (p + 1) * nb / P` (so `P <= nb`).
//! 3. Each stream's blocks go in windows of `window` consecutive slots;
//!    the records of a window are permuted (a permutation per stream,
//!    window and epoch). A stream's record sequence is its windows in turn.
//! 4. The epoch's global order takes the streams round-robin: global
//!    position `g < P * L` (with `L` the shortest stream's length) is record
//!    `g / P` of stream `g % P`; the few records past `L` in the longer
//!    streams (less than two blocks each) follow, stream by stream.
//!
//! What it mixes: consecutive positions come from `P` different, randomly
//! placed regions of the dataset; records within a window of blocks are
//! fully shuffled; the block order and every window change each epoch. What
//! it does not: two records more than a window apart in the dataset never
//! meet in one window, so the order is as good as the dataset's own order at
//! scales above `window * block` records. A dataset `prep shuffle` wrote is
//! globally shuffled already, so nothing is lost there.
//!
//! # Ranks, workers and resuming
//!
//! Like [`Sampler`](super::Sampler), rank `r` of `W` takes global positions
//! `start + r, start + r + W, ...`, each rank the same number of them
//! (`(n - start) / W`; the rest, fewer than `W`, is left out of the epoch).
//! `start` is the number of positions the job had consumed when it last
//! resumed: the state of any rank, taken when every rank has read the same
//! number of records, is one global position, and a job resumed from it on
//! any number of ranks reads exactly the rest of the epoch, once. DataLoader
//! workers are ranks too: worker `k` of `K` in rank `r` is rank `r + k * W`
//! of `W * K`.
//!
//! # Locality and the cache
//!
//! When `W * K` divides `P`, global position `g` is always read by the
//! reader `g % (W * K)`, so each reader reads only the `P / (W * K)` streams
//! congruent to it: a node downloads about its share of the dataset per
//! epoch, not all of it. A reader holds at most two windows per stream it
//! reads (the one being read and the next, read ahead):
//! [`BlockOrder::cache_blocks`]. When `W * K` does not divide `P` the order
//! and the shares are still exact, but a reader cycles through every stream.

use crate::permute::{mix, Permutation};

/// Why an order cannot be built.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum OrderError {
    /// A parameter that must be at least 1 is 0.
    #[error("{what} must be at least 1")]
    Zero {
        /// The parameter.
        what: &'static str,
    },
    /// More streams than blocks: some stream would be empty.
    #[error(
        "{streams} streams need at least {streams} blocks, but {n} records in blocks of {block} make {blocks}: \
         use fewer streams or smaller blocks"
    )]
    TooFewBlocks {
        /// Streams asked for.
        streams: u64,
        /// Records.
        n: u64,
        /// Records per block.
        block: u64,
        /// Blocks.
        blocks: u64,
    },
}

/// One epoch's order of a dataset's records by blocks (see the [module
/// docs](self)). O(streams) memory; any position is computed directly.
#[derive(Debug, Clone)]
pub struct BlockOrder {
    n: u64,
    block: u64,
    window: u64,
    streams: u64,
    seed: u64,
    epoch: u64,
    blocks: Permutation,
    /// The slot (position in the permuted block sequence) of the last
    /// block when it is shorter than the others.
    short_slot: Option<u64>,
    /// Records in each stream.
    lengths: Vec<u64>,
    /// The shortest stream's length: the round-robin part ends at
    /// `streams * shortest`.
    shortest: u64,
    /// Records past `shortest` in streams before each one (the tails'
    /// offsets), one extra entry for the total.
    tail_starts: Vec<u64>,
}

impl BlockOrder {
    /// The order of epoch `epoch` of `n` records under `seed`, in blocks of
    /// `block` records, windows of `window` blocks and `streams` streams.
    ///
    /// # Errors
    /// [`OrderError::Zero`] for a zero `block`, `window` or `streams`;
    /// [`OrderError::TooFewBlocks`] when there are fewer blocks than
    /// streams.
    pub fn new(
        n: u64,
        block: u64,
        window: u64,
        streams: u64,
        seed: u64,
        epoch: u64,
    ) -> Result<BlockOrder, OrderError> {
        for (what, v) in [("block", block), ("window", window), ("streams", streams)] {
            if v == 0 {
                return Err(OrderError::Zero { what });
            }
        }
        let nb = n.div_ceil(block);
        if nb < streams {
            return Err(OrderError::TooFewBlocks {
                streams,
                n,
                block,
                blocks: nb,
            });
        }
        let blocks = Permutation::new(nb, seed, mix(epoch) ^ BLOCKS_STREAM);
        // The slot of the short last block: the one place the block sizes
        // differ. One pass over the blocks per epoch.
        let short_slot = (!n.is_multiple_of(block))
            .then(|| (0..nb).find(|&s| blocks.get(s) == nb - 1))
            .flatten();
        let mut order = BlockOrder {
            n,
            block,
            window,
            streams,
            seed,
            epoch,
            blocks,
            short_slot,
            lengths: Vec::new(),
            shortest: 0,
            tail_starts: Vec::new(),
        };
        order.lengths = (0..streams)
            .map(|p| {
                let slots = order.slots(p);
                order.records_in(slots.start, slots.end)
            })
            .collect();
        order.shortest = order.lengths.iter().copied().min().unwrap_or(0);
        let mut at = 0;
        order.tail_starts.push(0);
        for &len in &order.lengths {
            at += len - order.shortest;
            order.tail_starts.push(at);
        }
        Ok(order)
    }

    /// Records in the epoch: every record of the dataset.
    pub fn len(&self) -> u64 {
        self.n
    }

    /// True for an empty dataset.
    pub fn is_empty(&self) -> bool {
        self.n == 0
    }

    /// The epoch.
    pub fn epoch(&self) -> u64 {
        self.epoch
    }

    /// The number of streams.
    pub fn streams(&self) -> u64 {
        self.streams
    }

    /// The record at global position `g < len()`.
    ///
    /// # Panics
    /// If `g >= len()`.
    pub fn get(&self, g: u64) -> u64 {
        assert!(g < self.n, "position {g} outside an epoch of {}", self.n);
        let round_robin = self.streams * self.shortest;
        let (p, i) = if g < round_robin {
            (g % self.streams, g / self.streams)
        } else {
            let t = g - round_robin;
            // The stream whose tail holds `t`: the last start at or below it.
            let p = self.tail_starts.partition_point(|&s| s <= t) as u64 - 1;
            (p, self.shortest + (t - self.tail_starts[p as usize]))
        };
        self.stream_record(p, i)
    }

    /// The stream that global position `g` reads.
    pub fn stream_of(&self, g: u64) -> u64 {
        let round_robin = self.streams * self.shortest;
        if g < round_robin {
            g % self.streams
        } else {
            self.tail_starts.partition_point(|&s| s <= g - round_robin) as u64 - 1
        }
    }

    /// The block holding record `record`.
    pub fn block_of(&self, record: u64) -> u64 {
        record / self.block
    }

    /// Global positions a reader reads: reader `rank` of `world` (ranks
    /// times workers), from global position `start` (what the job had
    /// consumed when it started or resumed), each reader the same number.
    pub fn positions(&self, start: u64, rank: u64, world: u64) -> impl Iterator<Item = u64> {
        assert!(world > 0 && rank < world, "rank {rank} of {world}");
        let each = self.n.saturating_sub(start) / world;
        (0..each).map(move |k| start + rank + k * world)
    }

    /// The streams reader `rank` of `world` reads in the round-robin part
    /// of the epoch from `start`: `P / world` of them when `world` divides
    /// `P`, else every stream.
    pub fn streams_of(&self, start: u64, rank: u64, world: u64) -> Vec<u64> {
        if self.streams.is_multiple_of(world) {
            let first = (start + rank) % world;
            (first..self.streams).step_by(world as usize).collect()
        } else {
            (0..self.streams).collect()
        }
    }

    /// Blocks a reader of `streams_read` streams holds at most: the window
    /// it reads and the next one of each stream.
    pub fn cache_blocks(&self, streams_read: u64) -> u64 {
        streams_read * 2 * self.window
    }

    /// The slots (positions in the permuted block sequence) of stream `p`.
    fn slots(&self, p: u64) -> std::ops::Range<u64> {
        let nb = self.blocks.len();
        let at = |p: u64| (u128::from(p) * u128::from(nb) / u128::from(self.streams)) as u64;
        at(p)..at(p + 1)
    }

    /// Records in the blocks at slots `from..to`.
    fn records_in(&self, from: u64, to: u64) -> u64 {
        let full = (to - from) * self.block;
        match self.short_slot {
            Some(s) if (from..to).contains(&s) => full - (self.block - self.n % self.block),
            _ => full,
        }
    }

    /// Record `i` of stream `p`'s sequence: its window, then the record the
    /// window's permutation puts at that place.
    fn stream_record(&self, p: u64, i: u64) -> u64 {
        let slots = self.slots(p);
        // Windows hold `window * block` records but the one with the short
        // block, so `i`'s window is the one its full size gives or, past the
        // short block, the next.
        let full = self.window * self.block;
        let start =
            |j: u64| self.records_in(slots.start, (slots.start + j * self.window).min(slots.end));
        let mut j = i / full;
        if start(j + 1) <= i {
            j += 1;
        }
        let from = slots.start + j * self.window;
        let to = (from + self.window).min(slots.end);
        let len = self.records_in(from, to);
        let key = mix(mix(mix(self.epoch) ^ WINDOWS_STREAM) ^ p) ^ j;
        let v = Permutation::new(len, self.seed, key).get(i - start(j));
        self.window_record(from, v)
    }

    /// Record `v` of the window whose first slot is `from`: the blocks of its
    /// slots in turn.
    fn window_record(&self, from: u64, v: u64) -> u64 {
        let short = self.n % self.block;
        let (slot, offset) = match self.short_slot {
            // Past the short block, slots hold `block` records again.
            Some(s) if s >= from && v >= (s - from) * self.block + short => {
                let past = v - (s - from) * self.block - short;
                (s + 1 + past / self.block, past % self.block)
            }
            _ => (from + v / self.block, v % self.block),
        };
        self.blocks.get(slot) * self.block + offset
    }
}

/// Stream numbers of the two kinds of permutation, under one seed.
const BLOCKS_STREAM: u64 = 0x626c_6f63_6b73; // "blocks"
const WINDOWS_STREAM: u64 = 0x7769_6e64_6f77; // "window"

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn epoch_of(o: &BlockOrder) -> Vec<u64> {
        (0..o.len()).map(|g| o.get(g)).collect()
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(200))]

        #[test]
        fn every_record_once_per_epoch(
            n in 1u64..400, block in 1u64..20, window in 1u64..5, streams in 1u64..8, seed: u64, epoch in 0u64..3,
        ) {
            prop_assume!(n.div_ceil(block) >= streams);
            let o = BlockOrder::new(n, block, window, streams, seed, epoch).unwrap();
            let mut all = epoch_of(&o);
            all.sort_unstable();
            prop_assert_eq!(all, (0..n).collect::<Vec<_>>());
        }

        #[test]
        fn a_resume_on_any_world_size_reads_the_rest_of_the_epoch_once(
            n in 1u64..300, block in 1u64..16, streams in 1u64..6, seed: u64,
            before in 1u64..5, after in 1u64..5, steps in 0u64..40,
        ) {
            prop_assume!(n.div_ceil(block) >= streams);
            let o = BlockOrder::new(n, block, 2, streams, seed, 1).unwrap();
            // `before` ranks each read `steps` records (fewer when the epoch
            // ends first), then the job resumes on `after` ranks.
            let steps = steps.min(n / before);
            let mut read: Vec<u64> = (0..before)
                .flat_map(|r| o.positions(0, r, before).take(steps as usize).collect::<Vec<_>>())
                .collect();
            let start = steps * before;
            for r in 0..after {
                read.extend(o.positions(start, r, after));
            }
            let left_out = (n - start) % after;
            let mut records: Vec<u64> = read.iter().map(|&g| o.get(g)).collect();
            records.sort_unstable();
            let len = records.len();
            records.dedup();
            prop_assert_eq!(records.len(), len, "no record twice");
            prop_assert_eq!(len as u64, n - left_out);
        }
    }

    #[test]
    fn readers_that_divide_the_streams_read_only_their_streams_blocks() {
        let (n, block, window, streams) = (10_000u64, 50, 2, 8);
        let o = BlockOrder::new(n, block, window, streams, 9, 0).unwrap();
        for world in [1u64, 2, 4, 8] {
            let mut blocks_seen = vec![0u32; n.div_ceil(block) as usize];
            for r in 0..world {
                let own = o.streams_of(0, r, world);
                assert_eq!(own.len() as u64, streams / world);
                let mut mine = std::collections::BTreeSet::new();
                for g in o.positions(0, r, world) {
                    if g < streams * o.shortest {
                        assert!(own.contains(&o.stream_of(g)), "world {world} rank {r}");
                    }
                    mine.insert(o.block_of(o.get(g)));
                }
                for b in mine {
                    blocks_seen[b as usize] += 1;
                }
            }
            // Each block is downloaded by one reader, but those of the few
            // tails that several readers share.
            let shared = blocks_seen.iter().filter(|&&c| c > 1).count() as u64;
            assert!(
                shared <= 2 * streams,
                "world {world}: {shared} blocks read by several readers"
            );
        }
    }

    #[test]
    fn a_reader_needs_at_most_a_window_of_blocks_per_stream_at_once() {
        // Blocks live from their first use to their last in a reader's
        // sequence: at no moment more than one window per stream it reads
        // (the cache holds twice that, with the next windows read ahead).
        for (n, block, window, streams, world) in [
            (5_000u64, 25, 2, 8, 2u64),
            (4_321, 10, 3, 4, 4),
            (3_000, 7, 1, 6, 3),
            (2_000, 9, 4, 4, 1),
        ] {
            let o = BlockOrder::new(n, block, window, streams, 3, 2).unwrap();
            for r in 0..world {
                let blocks: Vec<u64> = o
                    .positions(0, r, world)
                    .map(|g| o.block_of(o.get(g)))
                    .collect();
                let mut span = std::collections::HashMap::new();
                for (t, &b) in blocks.iter().enumerate() {
                    span.entry(b).or_insert((t, t)).1 = t;
                }
                let mut live = vec![0i64; blocks.len() + 1];
                for &(first, last) in span.values() {
                    live[first] += 1;
                    live[last + 1] -= 1;
                }
                let most = live
                    .iter()
                    .scan(0, |at, d| {
                        *at += d;
                        Some(*at)
                    })
                    .max()
                    .unwrap();
                let read = o.streams_of(0, r, world).len() as u64;
                assert!(
                    most as u64 <= read * window + 2,
                    "n={n} block={block} window={window} streams={streams} world={world}: {most} blocks live"
                );
                assert_eq!(o.cache_blocks(read), 2 * read * window);
            }
        }
    }

    #[test]
    fn the_order_changes_with_the_epoch_and_the_seed_and_is_the_same_otherwise() {
        let a = epoch_of(&BlockOrder::new(1000, 10, 3, 4, 1, 0).unwrap());
        assert_eq!(a, epoch_of(&BlockOrder::new(1000, 10, 3, 4, 1, 0).unwrap()));
        assert_ne!(a, epoch_of(&BlockOrder::new(1000, 10, 3, 4, 1, 1).unwrap()));
        assert_ne!(a, epoch_of(&BlockOrder::new(1000, 10, 3, 4, 2, 0).unwrap()));
    }

    #[test]
    fn a_window_is_shuffled_within_its_blocks_only() {
        // One stream, windows of 2 blocks of 10: positions 0..20 are the
        // records of the first two permuted blocks, in some order.
        let o = BlockOrder::new(100, 10, 2, 1, 5, 0).unwrap();
        let first: Vec<u64> = (0..20).map(|g| o.get(g)).collect();
        let mut blocks: Vec<u64> = first.iter().map(|&r| r / 10).collect();
        blocks.sort_unstable();
        blocks.dedup();
        assert_eq!(blocks.len(), 2);
        assert_ne!(
            first,
            {
                let mut s = first.clone();
                s.sort_unstable();
                s
            },
            "shuffled within the window"
        );
    }

    #[test]
    fn bad_parameters_are_refused_with_the_numbers() {
        assert_eq!(
            BlockOrder::new(10, 0, 1, 1, 0, 0).unwrap_err(),
            OrderError::Zero { what: "block" }
        );
        let e = BlockOrder::new(100, 30, 1, 8, 0, 0).unwrap_err();
        assert_eq!(
            e.to_string(),
            "8 streams need at least 8 blocks, but 100 records in blocks of 30 make 4: use fewer streams or smaller blocks"
        );
    }
}
