//! The order in which training reads a dataset's records: a seeded,
//! per-epoch permutation split across data-parallel ranks, in O(1) memory,
//! resumable from a position alone.
//!
//! # The order
//!
//! Epoch `e` reads the records in the order of the keyed permutation `P` of
//! `0..n` for (seed, stream `e`) — the Feistel network of [`crate::permute`],
//! which needs no index array, whatever `n`. Global position `g` of the
//! epoch is record `P(g)`. With `W` ranks, rank `r` takes global positions
//! `r, r + W, r + 2W, ...`: its `k`-th record is `P(k * W + r)`. Every rank
//! takes `n / W` records (rounded down), so that all ranks run the same
//! number of steps; the `n % W` global positions past `(n / W) * W` are left
//! out of that epoch — a different set of records in every epoch, since the
//! permutation changes with the epoch.
//!
//! # Resuming
//!
//! A rank's state is `(epoch, position)`: the epoch and how many of its
//! records it has consumed. [`Sampler::get`] computes any position directly,
//! so resuming at position `k` costs nothing and gives exactly the records an
//! uninterrupted run would have read from `k` on.
//!
//! If the number of ranks changes at a resume (`W` to `W'`), the ranks had
//! consumed, together, the first `k * W` global positions of the epoch.
//! [`Sampler::resume_position`] gives the position `k' = floor(k * W / W')`
//! to start from: ranks then go on from global position `k' * W'`, which
//! repeats the at most `W' - 1` positions between `k' * W'` and `k * W` and
//! skips none. The records left out at the end of the epoch are then the
//! last `n % W'` positions instead of the last `n % W`.

mod blocks;

pub use blocks::{BlockOrder, OrderError};

use crate::permute::Permutation;

/// The records one rank reads in one epoch.
///
/// ```
/// use prep_reader::sampler::Sampler;
///
/// // 10 records, 3 ranks: each rank reads 3 of them; one is left out.
/// let ranks: Vec<Vec<u64>> = (0..3)
///     .map(|r| Sampler::new(10, 7, 0, r, 3).iter().collect())
///     .collect();
/// assert!(ranks.iter().all(|r| r.len() == 3));
/// let mut all: Vec<u64> = ranks.concat();
/// all.sort();
/// all.dedup();
/// assert_eq!(all.len(), 9, "disjoint shares");
///
/// // Resuming at position 2 gives what an uninterrupted run reads from there.
/// let s = Sampler::new(10, 7, 0, 1, 3);
/// assert_eq!(s.iter_from(2).collect::<Vec<_>>(), ranks[1][2..].to_vec());
/// ```
#[derive(Debug, Clone)]
pub struct Sampler {
    perm: Permutation,
    rank: u64,
    world_size: u64,
    epoch: u64,
}

impl Sampler {
    /// The sampler of `rank` among `world_size` ranks, for epoch `epoch` of
    /// a dataset of `n` records, under `seed`.
    ///
    /// # Panics
    /// If `world_size` is 0 or `rank >= world_size`.
    pub fn new(n: u64, seed: u64, epoch: u64, rank: u64, world_size: u64) -> Sampler {
        assert!(world_size > 0, "world_size must be at least 1");
        assert!(
            rank < world_size,
            "rank {rank} is not below world_size {world_size}"
        );
        Sampler {
            perm: Permutation::new(n, seed, epoch),
            rank,
            world_size,
            epoch,
        }
    }

    /// Records this rank reads in the epoch: `n / world_size`.
    pub fn len(&self) -> u64 {
        self.perm.len() / self.world_size
    }

    /// True when this rank reads nothing this epoch (`n < world_size`).
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The epoch.
    pub fn epoch(&self) -> u64 {
        self.epoch
    }

    /// The record this rank reads at `position` (`< len()`), or `None` past
    /// the end.
    pub fn get(&self, position: u64) -> Option<u64> {
        (position < self.len()).then(|| self.perm.get(position * self.world_size + self.rank))
    }

    /// Every record of the epoch, in order.
    pub fn iter(&self) -> impl Iterator<Item = u64> + '_ {
        self.iter_from(0)
    }

    /// The records from `position` on: a resumed run.
    pub fn iter_from(&self, position: u64) -> impl Iterator<Item = u64> + '_ {
        (position..self.len()).map(move |k| self.perm.get(k * self.world_size + self.rank))
    }

    /// Where a rank resumes when the number of ranks changes from
    /// `old_world_size` (after each had consumed `position` records) to
    /// `new_world_size`: `floor(position * old / new)`. See the module
    /// documentation for what is repeated.
    pub fn resume_position(position: u64, old_world_size: u64, new_world_size: u64) -> u64 {
        let consumed = u128::from(position) * u128::from(old_world_size);
        (consumed / u128::from(new_world_size.max(1))) as u64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranks_partition_the_epoch_minus_the_remainder() {
        for (n, w) in [(0u64, 1u64), (1, 1), (5, 2), (10, 3), (97, 8), (1000, 7)] {
            let mut seen = vec![0u32; n as usize];
            for r in 0..w {
                let s = Sampler::new(n, 3, 1, r, w);
                assert_eq!(s.len(), n / w);
                for i in s.iter() {
                    seen[i as usize] += 1;
                }
            }
            assert!(seen.iter().all(|&c| c <= 1), "n={n} w={w}: disjoint");
            assert_eq!(
                seen.iter().filter(|&&c| c == 0).count() as u64,
                n % w,
                "n={n} w={w}: only the remainder is left out"
            );
        }
    }

    #[test]
    fn one_rank_reads_the_whole_permutation_and_epochs_differ() {
        let e0: Vec<u64> = Sampler::new(100, 5, 0, 0, 1).iter().collect();
        let e1: Vec<u64> = Sampler::new(100, 5, 1, 0, 1).iter().collect();
        let mut sorted = e0.clone();
        sorted.sort_unstable();
        assert_eq!(sorted, (0..100).collect::<Vec<_>>());
        assert_ne!(e0, e1);
        assert_eq!(Sampler::new(100, 5, 0, 0, 1).get(100), None);
    }

    #[test]
    fn resuming_with_fewer_ranks_repeats_a_little_and_skips_nothing() {
        let (n, w, w2, k) = (1000u64, 8u64, 3u64, 37u64);
        let consumed: std::collections::HashSet<u64> = (0..w)
            .flat_map(|r| {
                Sampler::new(n, 1, 0, r, w)
                    .iter()
                    .take(k as usize)
                    .collect::<Vec<_>>()
            })
            .collect();
        let k2 = Sampler::resume_position(k, w, w2);
        let rest: Vec<u64> = (0..w2)
            .flat_map(|r| {
                Sampler::new(n, 1, 0, r, w2)
                    .iter_from(k2)
                    .collect::<Vec<_>>()
            })
            .collect();
        let repeated = rest.iter().filter(|i| consumed.contains(i)).count() as u64;
        assert!(repeated < w2, "{repeated} repeated");
        let read: std::collections::HashSet<u64> = consumed.iter().chain(&rest).copied().collect();
        assert_eq!(
            read.len() as u64,
            n - n % w2,
            "nothing skipped but the remainder"
        );
    }
}
