//! The order's parameters chosen to fit the cache a job gives: rows per
//! block, blocks per window and streams, from the cache limit, the
//! dataset's size and the world, wherever the caller leaves them open.
//!
//! # What a job needs
//!
//! Rank `r` of `W` reads global positions `r, r + W, ...`; position `g` is
//! on stream `g % P`, so rank `r` reads the `P / gcd(P, W)` streams
//! congruent to `r` modulo `gcd(P, W)`: all of them only when `P` and `W`
//! share no factor. It holds at most two windows of each (the one it reads
//! and the next). The ranks of a node that share a cache directory need
//! that each, so a node needs
//!
//! ```text
//! min(local_ranks × 2 × window × P / gcd(P, W) × block_bytes,  the whole dataset)
//! ```
//!
//! with `block_bytes` a block's rows plus its 16-byte trailer: nothing is
//! evicted from a cache that holds every block, so no job needs more than
//! the dataset. When every rank of a one-node job shares the cache
//! (`local_ranks = W`) and `W` divides `P`, the need is `2 × window × P ×
//! block_bytes` whatever `W` is; that is why the streams are chosen from
//! numbers with many divisors ([`STREAM_LADDER`]): a job started on 2 ranks
//! resumes on 3, 4, 6 or 12 with the same need.
//!
//! # The choice
//!
//! A caller may fix any of the three; the others are chosen, in this order
//! of preference, as the first that fits under the limit:
//! 1. blocks of at least [`MIN_BLOCK_BYTES`] (fewer, larger ranged reads),
//!    then blocks down to one row;
//! 2. the most streams of [`STREAM_LADDER`] the dataset has blocks for
//!    (positions next to each other come from that many places in the
//!    dataset), preferring a count the world divides;
//! 3. windows of [`DEFAULT_WINDOW`] blocks, then 2, then 1;
//! 4. the largest block up to [`DEFAULT_BLOCK_BYTES`] that still fits.
//!
//! It is a function of the dataset's rows and row size, the cache limit,
//! the local ranks and the world at the job's first start, and of nothing
//! else. A resumed job takes the three from its state instead, so its order
//! is the same on any world size and cache limit; only its need changes.

use super::TRAILER_BYTES;

/// Bytes of rows per block at most, when the block is chosen.
pub const DEFAULT_BLOCK_BYTES: u64 = 16 << 20;
/// Bytes of rows per block the choice tries to keep (larger ranged reads)
/// before it goes down to single rows.
pub const MIN_BLOCK_BYTES: u64 = 1 << 20;
/// Blocks per window, when the window is chosen and the cache allows it.
pub const DEFAULT_WINDOW: u64 = 4;
/// The stream counts chosen from, largest first: each divisible by 1, 2, 3,
/// 4, 6 and 12 from 12 on, and by every power of two up to 64 at 960.
pub const STREAM_LADDER: &[u64] = &[960, 480, 240, 192, 96, 48, 24, 12, 6, 4, 2, 1];

/// What the order of a stream depends on besides the seed and the epoch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Plan {
    /// Rows per block.
    pub block: u64,
    /// Blocks per window.
    pub window: u64,
    /// Streams.
    pub streams: u64,
}

/// A dataset and the job that reads it: what a [`Plan`]'s need depends on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Job {
    /// Rows in the dataset.
    pub rows: u64,
    /// Bytes a row takes.
    pub row_bytes: u64,
    /// Ranks that share the cache directory.
    pub local_ranks: u64,
    /// Ranks in the job.
    pub world: u64,
}

/// What a plan needs of the cache, with the terms of the product.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Need {
    /// Bytes the cache directory must hold.
    pub bytes: u64,
    /// Streams each rank reads.
    pub streams_read: u64,
    /// Bytes a block takes in the cache.
    pub block_bytes: u64,
    /// Bytes the whole dataset takes in the cache.
    pub whole: u64,
}

fn gcd(a: u64, b: u64) -> u64 {
    if b == 0 {
        a
    } else {
        gcd(b, a % b)
    }
}

impl Job {
    /// Blocks of `block` rows (the last one possibly shorter).
    pub fn blocks(&self, block: u64) -> u64 {
        self.rows.div_ceil(block.max(1)).max(1)
    }

    /// What `plan` needs of the cache (see the [module docs](self)).
    pub fn need(&self, plan: Plan) -> Need {
        let streams_read = plan.streams / gcd(plan.streams, self.world.max(1));
        let block_bytes = plan.block * self.row_bytes + TRAILER_BYTES;
        let whole =
            self.rows * self.row_bytes + self.rows.div_ceil(plan.block.max(1)) * TRAILER_BYTES;
        let windows = self
            .local_ranks
            .max(1)
            .saturating_mul(2 * plan.window)
            .saturating_mul(streams_read)
            .saturating_mul(block_bytes);
        Need {
            bytes: windows.min(whole),
            streams_read,
            block_bytes,
            whole,
        }
    }

    /// The plan for a cache of `limit` bytes, with the parameters the
    /// caller fixed (`Some`) kept; `Err` with the smallest plan (and its
    /// need) when none fits.
    pub fn plan(
        &self,
        limit: u64,
        block_bytes: Option<u64>,
        window: Option<u64>,
        streams: Option<u64>,
    ) -> Result<Plan, Plan> {
        let rows_of = |bytes: u64| (bytes / self.row_bytes.max(1)).max(1);
        let cap = rows_of(block_bytes.unwrap_or(DEFAULT_BLOCK_BYTES));
        if self.rows == 0 {
            // Nothing to read and nothing to cache: any plan serves.
            return Ok(Plan {
                block: cap,
                window: window.unwrap_or(DEFAULT_WINDOW),
                streams: streams.unwrap_or(1),
            });
        }
        let floors: Vec<u64> = match block_bytes {
            Some(_) => vec![cap],
            None => vec![rows_of(MIN_BLOCK_BYTES).min(cap), 1],
        };
        let windows: Vec<u64> = match window {
            Some(w) => vec![w],
            None => vec![DEFAULT_WINDOW, 2, 1],
        };
        let given_streams = streams;
        let streams: Vec<u64> = match streams {
            Some(p) => vec![p],
            None => {
                // Those the world divides first, each group largest first.
                let world = self.world.max(1);
                let fits = |p: &&u64| **p <= self.rows.max(1);
                let divided = STREAM_LADDER
                    .iter()
                    .filter(fits)
                    .filter(|p| *p % world == 0);
                let rest = STREAM_LADDER
                    .iter()
                    .filter(fits)
                    .filter(|p| *p % world != 0);
                divided.chain(rest).copied().collect()
            }
        };
        for &floor in &floors {
            for &p in &streams {
                // Every stream needs a block: a block given is kept (the
                // streams must not outnumber its blocks); a block chosen
                // has at most rows / p rows.
                let most = match block_bytes {
                    Some(_) if p > self.blocks(cap) => continue,
                    Some(_) => cap,
                    None => (self.rows / p.max(1)).min(cap),
                };
                if most < floor {
                    continue;
                }
                for &w in &windows {
                    if let Some(block) = self.largest_block(limit, floor, most, w, p) {
                        return Ok(Plan {
                            block,
                            window: w,
                            streams: p,
                        });
                    }
                }
            }
        }
        Err(self.smallest(block_bytes.map(|_| cap), window, given_streams))
    }

    /// The largest block in `floor..=most` rows whose plan fits `limit`.
    fn largest_block(
        &self,
        limit: u64,
        floor: u64,
        most: u64,
        window: u64,
        streams: u64,
    ) -> Option<u64> {
        let fits = |block: u64| {
            self.need(Plan {
                block,
                window,
                streams,
            })
            .bytes
                <= limit
        };
        if fits(most) {
            return Some(most);
        }
        if !fits(floor) {
            return None;
        }
        // The windowed need grows with the block; the whole dataset's
        // shrinks, but did not fit at `most`, so it fits at no smaller one.
        let (mut lo, mut hi) = (floor, most);
        while hi - lo > 1 {
            let mid = lo + (hi - lo) / 2;
            if fits(mid) {
                lo = mid;
            } else {
                hi = mid;
            }
        }
        Some(lo)
    }

    /// The plan that needs least, with what the caller fixed.
    fn smallest(&self, block: Option<u64>, window: Option<u64>, streams: Option<u64>) -> Plan {
        let block = block.unwrap_or(1);
        let streams = streams.unwrap_or_else(|| {
            // The ladder's count with the fewest streams a rank reads (the
            // most streams among those), one the blocks can fill.
            *STREAM_LADDER
                .iter()
                .filter(|p| **p <= self.blocks(block))
                .min_by_key(|p| (**p / gcd(**p, self.world.max(1)), std::cmp::Reverse(**p)))
                .unwrap_or(&1)
        });
        Plan {
            block,
            window: window.unwrap_or(1),
            streams,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const MIB: u64 = 1 << 20;

    fn job(rows: u64, row_bytes: u64, local_ranks: u64, world: u64) -> Job {
        Job {
            rows,
            row_bytes,
            local_ranks,
            world,
        }
    }

    #[test]
    fn a_third_of_a_75_mib_dataset_fits_on_2_ranks_and_on_3() {
        // 2,048 tokens of uint16 a row: 4 KiB rows, 19,200 of them.
        let two = job(19_200, 4096, 2, 2);
        let plan = two.plan(32 * MIB, None, None, None).unwrap();
        assert!(two.need(plan).bytes <= 32 * MIB, "{plan:?}");
        assert!(
            plan.block * 4096 >= MIB,
            "blocks of at least 1 MiB: {plan:?}"
        );
        assert!(plan.streams >= 12, "{plan:?}");
        // The guide's example: 2 KiB rows (1,024 uint16 tokens), 38,400 of them.
        let guide = job(38_400, 2048, 2, 2);
        assert_eq!(
            guide.plan(32 * MIB, None, None, None).unwrap(),
            Plan {
                block: 682,
                window: 1,
                streams: 12
            }
        );
        // The same plan (a resume) on 3 ranks of one node, and on 1.
        for world in [1, 3, 4, 6] {
            let other = job(19_200, 4096, world, world);
            assert!(
                other.need(plan).bytes <= 32 * MIB,
                "{world} ranks: {:?}",
                other.need(plan)
            );
        }
    }

    #[test]
    fn a_dataset_under_the_limit_is_cached_whole_with_the_default_window() {
        let j = job(1000, 4096, 8, 8);
        let plan = j.plan(64 * MIB, None, None, None).unwrap();
        let need = j.need(plan);
        assert_eq!(need.bytes, need.whole, "{plan:?}");
        assert_eq!(plan.window, DEFAULT_WINDOW);
        assert!(need.whole < 64 * MIB);
    }

    #[test]
    fn a_limit_below_one_row_per_stream_is_refused_with_the_smallest_plan() {
        let j = job(10_000, 4096, 2, 2);
        let smallest = j.plan(4096, None, None, None).unwrap_err();
        assert_eq!(
            smallest,
            Plan {
                block: 1,
                window: 1,
                streams: 2
            }
        );
        // 2 ranks x 2 windows x 1 stream each x (4096 + 16).
        assert_eq!(j.need(smallest).bytes, 2 * 2 * (4096 + TRAILER_BYTES));
        assert!(j.plan(j.need(smallest).bytes, None, None, None).is_ok());
    }

    #[test]
    fn a_block_given_larger_than_the_dataset_is_one_block_on_one_stream() {
        let j = job(100, 4096, 1, 1);
        let plan = j.plan(64 * MIB, Some(16 * MIB), None, None).unwrap();
        assert_eq!((plan.block, plan.streams), (4096, 1));
        assert_eq!(
            j.need(plan).bytes,
            100 * 4096 + TRAILER_BYTES,
            "cached whole"
        );
    }

    #[test]
    fn an_empty_dataset_needs_nothing() {
        let j = job(0, 4096, 2, 2);
        let plan = j.plan(0, None, None, None).unwrap();
        assert_eq!(j.need(plan).bytes, 0);
    }

    #[test]
    fn what_the_caller_fixes_is_kept() {
        let j = job(100_000, 4096, 1, 1);
        let plan = j.plan(1 << 40, Some(64 << 10), Some(3), Some(7)).unwrap();
        assert_eq!(
            plan,
            Plan {
                block: 16,
                window: 3,
                streams: 7
            }
        );
        let plan = j.plan(1 << 40, None, None, Some(5)).unwrap();
        assert_eq!((plan.streams, plan.window), (5, DEFAULT_WINDOW));
    }

    #[test]
    fn a_world_that_shares_no_factor_reads_every_stream() {
        let plan = Plan {
            block: 10,
            window: 1,
            streams: 12,
        };
        assert_eq!(job(1_000_000, 1, 1, 5).need(plan).streams_read, 12);
        assert_eq!(job(1_000_000, 1, 1, 8).need(plan).streams_read, 3);
        assert_eq!(job(1_000_000, 1, 1, 3).need(plan).streams_read, 4);
    }

    proptest! {
        /// Whatever the dataset, world and limit, with the block chosen or
        /// given: a plan that fits its need under the limit, keeps a given
        /// block and has a block for every stream; or a refusal whose
        /// smallest plan needs more than the limit.
        #[test]
        fn a_plan_fits_or_the_smallest_does_not(
            rows in 1u64..200_000,
            row_bytes in 1u64..20_000,
            world in 1u64..40,
            local in 1u64..9,
            limit_kib in 1u64..1_000_000,
            given_kib in proptest::option::of(1u64..40_000),
        ) {
            let local = local.min(world);
            let j = job(rows, row_bytes, local, world);
            let (limit, given) = (limit_kib << 10, given_kib.map(|k| k << 10));
            match j.plan(limit, given, None, None) {
                Ok(plan) => {
                    prop_assert!(j.need(plan).bytes <= limit, "{:?} {:?}", plan, j.need(plan));
                    prop_assert!(plan.streams <= j.blocks(plan.block), "{:?}", plan);
                    prop_assert!(plan.block >= 1 && plan.window >= 1);
                    if let Some(given) = given {
                        prop_assert_eq!(plan.block, (given / row_bytes).max(1));
                    }
                }
                Err(smallest) => prop_assert!(j.need(smallest).bytes > limit),
            }
        }
    }
}
