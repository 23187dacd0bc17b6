//! Partitioned runs: task `I` of `N` (`--part I/N`) does a deterministic share
//! of a stage's work, and `prep merge` joins the shares into the dataset one
//! machine would have made.
//!
//! Every share is cut from a line of work units numbered `0..total` (input
//! bytes for tokenize, documents for shuffle's scatter, rows or windows for
//! pack): part `I` takes `[floor(I*total/N), floor((I+1)*total/N))`. The cut
//! depends on `total` and `N` alone, so every task computes the same one with
//! no coordination, and any task re-run alone (an engine's retry) does the
//! same work again.

use std::fmt;
use std::ops::Range;
use std::str::FromStr;

/// Task `index` of `count`, as given to `--part I/N` (`0 <= I < N`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Part {
    /// 0-based task number.
    pub index: u64,
    /// Number of tasks.
    pub count: u64,
}

impl Part {
    /// The whole job as one part: `0/1`.
    pub const WHOLE: Part = Part { index: 0, count: 1 };

    /// Part `index` of `count`, or `None` unless `index < count`.
    pub fn new(index: u64, count: u64) -> Option<Part> {
        (index < count).then_some(Part { index, count })
    }

    /// Where part `i` of `count` starts on a line of `total` units.
    fn boundary(i: u64, count: u64, total: u64) -> u64 {
        (u128::from(i) * u128::from(total) / u128::from(count)) as u64
    }

    /// This part's units of `total`. The ranges of parts `0..N` tile
    /// `0..total` in order; some are empty when `total < N`.
    pub fn range(self, total: u64) -> Range<u64> {
        Part::boundary(self.index, self.count, total)
            ..Part::boundary(self.index + 1, self.count, total)
    }

    /// The part of `count` whose range of `total` units holds unit `x`; units
    /// at or past `total` belong to the last part.
    pub fn holding(x: u64, count: u64, total: u64) -> u64 {
        if x >= total {
            return count - 1;
        }
        // floor(x * N / T) is at most one below the answer.
        let guess = (u128::from(x) * u128::from(count) / u128::from(total)) as u64;
        let mut i = guess.min(count - 1);
        while Part::boundary(i + 1, count, total) <= x {
            i += 1;
        }
        while Part::boundary(i, count, total) > x {
            i -= 1;
        }
        i
    }

    /// True when this is the last part (the one that takes what lies past
    /// the end of the line, such as a padded last row).
    pub fn is_last(self) -> bool {
        self.index + 1 == self.count
    }
}

impl fmt::Display for Part {
    /// Writes `I/N`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.index, self.count)
    }
}

impl FromStr for Part {
    type Err = String;

    /// Parses `I/N` with `0 <= I < N`.
    fn from_str(s: &str) -> Result<Part, String> {
        let bad = || format!("{s:?} is not a part: expected I/N with 0 <= I < N, such as 3/8");
        let (i, n) = s.split_once('/').ok_or_else(bad)?;
        let i: u64 = i.trim().parse().map_err(|_| bad())?;
        let n: u64 = n.trim().parse().map_err(|_| bad())?;
        Part::new(i, n).ok_or_else(bad)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn parses_and_refuses() {
        assert_eq!("3/8".parse::<Part>(), Ok(Part { index: 3, count: 8 }));
        assert_eq!(Part { index: 3, count: 8 }.to_string(), "3/8");
        for bad in ["8/8", "1/0", "x/2", "1", "-1/2", "1/2/3", ""] {
            assert!(bad.parse::<Part>().is_err(), "{bad}");
        }
    }

    proptest! {
        #[test]
        fn ranges_tile_the_line_and_holding_agrees(total in 0u64..10_000, count in 1u64..50, probe in 0u64..11_000) {
            let mut next = 0;
            for i in 0..count {
                let r = Part::new(i, count).unwrap().range(total);
                prop_assert_eq!(r.start, next);
                prop_assert!(r.end >= r.start);
                for x in [r.start, r.end.saturating_sub(1)] {
                    if r.contains(&x) {
                        prop_assert_eq!(Part::holding(x, count, total), i);
                    }
                }
                next = r.end;
            }
            prop_assert_eq!(next, total);
            let holder = Part::holding(probe, count, total);
            prop_assert!(holder < count);
            if probe < total {
                prop_assert!(Part::new(holder, count).unwrap().range(total).contains(&probe));
            }
        }

        #[test]
        fn huge_lines_do_not_overflow(total in u64::MAX - 1000..=u64::MAX, count in 1u64..1000) {
            let last = Part::new(count - 1, count).unwrap().range(total);
            prop_assert_eq!(last.end, total);
            prop_assert_eq!(Part::holding(total - 1, count, total), count - 1);
        }
    }
}
