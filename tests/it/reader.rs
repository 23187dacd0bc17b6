//! Reading from training code: token spans across shards, the sampler's
//! order from the command line, packed rows' pieces.

use crate::common::*;
use prep::format::{Dataset, Dtype};
use prep::sampler::Sampler;

/// Records with empty ones among them, over many small shards.
fn records() -> Vec<Vec<u32>> {
    let mut next = xorshift(5);
    (0..200)
        .map(|i| {
            let n = if i % 7 == 0 { 0 } else { next() % 40 };
            (0..n).map(|_| (next() % 60_000) as u32).collect()
        })
        .collect()
}

#[test]
fn token_spans_are_the_records_back_to_back() {
    let t = TestDir::new();
    let recs = records();
    write_dataset(t.dir.path(), Dtype::U16, 64, &recs);
    let ds = Dataset::open(t.dir.path()).unwrap();
    assert!(ds.n_shards() > 20);
    let all: Vec<u32> = recs.concat();
    let n = all.len();
    // Every shard boundary and its neighbours, the ends, and random ranges.
    let mut edges: Vec<usize> = vec![0, 1, n - 1, n];
    let mut at = 0;
    for s in &ds.manifest().shards {
        at += s.n_tokens as usize;
        edges.extend([at.saturating_sub(1), at, (at + 1).min(n)]);
    }
    let mut next = xorshift(77);
    let ends: Vec<usize> = edges.iter().step_by(17).copied().collect();
    let mut ranges: Vec<(usize, usize)> = edges
        .iter()
        .flat_map(|&a| ends.iter().map(move |&b| (a.min(b), a.max(b))))
        .collect();
    ranges.extend((0..2000).map(|_| {
        let (a, b) = (
            (next() % (n as u64 + 1)) as usize,
            (next() % (n as u64 + 1)) as usize,
        );
        (a.min(b), a.max(b))
    }));
    for (lo, hi) in ranges {
        let spans: Vec<_> = ds.tokens(lo as u64..hi as u64).unwrap().collect();
        assert!(spans.iter().all(|s| !s.is_empty()), "{lo}..{hi}");
        let got: Vec<u32> = spans.iter().flat_map(|s| s.to_vec()).collect();
        assert_eq!(&got[..], &all[lo..hi], "{lo}..{hi}");
    }
    assert!(ds.tokens(0..n as u64 + 1).is_err());
}

#[test]
fn prep_sample_prints_the_sampler_order() {
    let t = TestDir::new();
    let recs = records();
    write_dataset(t.dir.path(), Dtype::U16, 1 << 20, &recs);
    for (seed, epoch, rank, world, start) in [
        (1u64, 0u64, 0u64, 1u64, 0u64),
        (9, 3, 2, 3, 5),
        (u64::MAX, 1, 6, 7, 0),
    ] {
        let out = ok(t.prep().arg("sample").arg(t.dir.path()).args([
            "--seed",
            &seed.to_string(),
            "--epoch",
            &epoch.to_string(),
            "--rank",
            &rank.to_string(),
            "--world-size",
            &world.to_string(),
            "--start",
            &start.to_string(),
        ]));
        let printed: Vec<u64> = String::from_utf8(out.stdout)
            .unwrap()
            .lines()
            .map(|l| l.parse().unwrap())
            .collect();
        let expected: Vec<u64> = Sampler::new(200, seed, epoch, rank, world)
            .iter_from(start)
            .collect();
        assert_eq!(printed, expected);
        assert_eq!(printed.len() as u64, 200 / world - start);
    }
    let err = fails(
        t.prep().arg("sample").arg(t.dir.path()).args([
            "--seed",
            "1",
            "--rank",
            "3",
            "--world-size",
            "3",
        ]),
        2,
    );
    assert!(
        err.contains("--rank 3 is not below --world-size 3"),
        "{err}"
    );
    let counted = ok(t
        .prep()
        .arg("sample")
        .arg(t.dir.path())
        .args(["--seed", "1", "--count", "4"]));
    assert_eq!(
        String::from_utf8(counted.stdout).unwrap().lines().count(),
        4
    );
}
