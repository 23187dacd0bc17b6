//! What checking an input costs a stage: a dataset's tokens read record by
//! record in order, as `prep shuffle` reads them, with and without the
//! checks of [`prep::format::Verified`] (each chunk's XXH3, every id below
//! the vocabulary), and at random, as `prep pack`'s rows read them, the
//! same two ways. Page cache warm; best of five, the two ways interleaved.
//!
//!     cargo run --release --example bench_verify -- DATASET
//!
//! Prints seconds and GB/s of token data for each; the difference is what
//! the checks add to a stage that reads the dataset once.

use std::fs::File;
use std::io::{BufReader, Read, Seek, SeekFrom};
use std::os::unix::fs::FileExt;
use std::time::Instant;

use prep::format::{Dataset, ShardPart};

fn main() {
    let dir = std::env::args().nth(1).expect("a dataset directory");
    let ds = Dataset::open(&dir).expect("the dataset opens");
    let size = ds.dtype().size() as u64;
    let bytes = ds.n_tokens() * size;
    let bounds: Vec<Vec<(u64, u64)>> = (0..ds.n_shards())
        .map(|s| {
            let o = ds.shard_offsets(s);
            o.windows(2).map(|w| (w[0] * size, w[1] * size)).collect()
        })
        .collect();
    // The records in a fixed scattered order: xorshift over record numbers.
    let mut order: Vec<(usize, u64, u64)> = bounds
        .iter()
        .enumerate()
        .flat_map(|(s, b)| b.iter().map(move |&(lo, hi)| (s, lo, hi)))
        .collect();
    let mut state = 0x9E37_79B9_7F4A_7C15u64;
    for i in (1..order.len()).rev() {
        state ^= state >> 12;
        state ^= state << 25;
        state ^= state >> 27;
        let j = (state.wrapping_mul(0x2545_F491_4F6C_DD1D) % (i as u64 + 1)) as usize;
        order.swap(i, j);
    }
    let mut record = Vec::new();
    let in_order_plain = |record: &mut Vec<u8>| {
        for (s, b) in bounds.iter().enumerate() {
            let path = ds.dir().join(&ds.manifest().shards[s].bin);
            let mut f = BufReader::with_capacity(1 << 20, File::open(path).unwrap());
            f.seek(SeekFrom::Start(0)).unwrap();
            for &(lo, hi) in b {
                record.resize((hi - lo) as usize, 0);
                f.read_exact(record).unwrap();
            }
        }
    };
    let in_order_checked = |record: &mut Vec<u8>| {
        let v = ds.verified().unwrap();
        for (s, b) in bounds.iter().enumerate() {
            let mut r = v.reader(s, ShardPart::Bin, true);
            for &(lo, hi) in b {
                record.resize((hi - lo) as usize, 0);
                r.read(lo, record).unwrap();
            }
        }
    };
    let at_random_plain = |record: &mut Vec<u8>| {
        let files: Vec<File> = (0..ds.n_shards())
            .map(|s| File::open(ds.dir().join(&ds.manifest().shards[s].bin)).unwrap())
            .collect();
        for &(s, lo, hi) in &order {
            record.resize((hi - lo) as usize, 0);
            files[s].read_exact_at(record, lo).unwrap();
        }
    };
    let at_random_checked = |record: &mut Vec<u8>| {
        let v = ds.verified().unwrap();
        let mut readers: Vec<_> = (0..ds.n_shards())
            .map(|s| v.reader(s, ShardPart::Bin, false))
            .collect();
        for &(s, lo, hi) in &order {
            record.clear();
            readers[s].read_append(lo..hi, record).unwrap();
        }
    };
    type Run<'a> = &'a dyn Fn(&mut Vec<u8>);
    let runs: [(&str, Run, Run); 2] = [
        ("in order", &in_order_plain, &in_order_checked),
        ("at random", &at_random_plain, &at_random_checked),
    ];
    println!(
        "{} records, {:.2} GB of tokens",
        order.len(),
        bytes as f64 / 1e9
    );
    for (name, plain, checked) in runs {
        let (mut best_plain, mut best_checked) = (f64::MAX, f64::MAX);
        for _ in 0..5 {
            let t = Instant::now();
            plain(&mut record);
            best_plain = best_plain.min(t.elapsed().as_secs_f64());
            let t = Instant::now();
            checked(&mut record);
            best_checked = best_checked.min(t.elapsed().as_secs_f64());
        }
        println!(
            "{name}: plain {best_plain:.3} s ({:.2} GB/s), checked {best_checked:.3} s ({:.2} GB/s), +{:.3} s",
            bytes as f64 / 1e9 / best_plain,
            bytes as f64 / 1e9 / best_checked,
            best_checked - best_plain
        );
    }
}
