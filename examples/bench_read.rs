//! Random row gather from the page cache with the Rust reader, beside a
//! memcpy of the same bytes in the same run.
//!
//!     cargo run --release --example bench_read -- DIR [--batch 64] [--seed 0]
//!
//! DIR is a packed dataset (rows of, say, 2,048 tokens). The gather copies
//! every row of one epoch, in the sampler's order (the random order training
//! reads in), into a batch buffer of `--batch` rows, through
//! `Dataset::record` and `Sampler::get`. The memcpy copies the same number
//! of bytes, the same batch size at a time, from the mapped shards in file
//! order into the same buffer. Both read pages that are already in the page
//! cache and mapped (a first untimed pass faults them in); each figure is
//! the best of three passes. Prints GB/s of token bytes and the ratio, and a
//! JSON line for scripts.

use std::time::Instant;

use prep::format::Dataset;
use prep::sampler::Sampler;

fn main() {
    let mut args = std::env::args().skip(1);
    let dir = args
        .next()
        .expect("usage: bench_read DIR [--batch N] [--seed S]");
    let (mut batch, mut seed) = (64usize, 0u64);
    while let Some(flag) = args.next() {
        let value = args.next().expect("a value after the flag");
        match flag.as_str() {
            "--batch" => batch = value.parse().expect("a number"),
            "--seed" => seed = value.parse().expect("a number"),
            other => panic!("unknown flag {other}"),
        }
    }
    let ds = Dataset::open(&dir).expect("a dataset");
    let n = ds.len();
    let row_bytes = (ds.n_tokens() / n.max(1)) as usize * ds.dtype().size();
    let sampler = Sampler::new(n, seed, 0, 0, 1);
    let mut buffer = vec![0u8; batch * row_bytes];

    // Gather: every row of the epoch in sampler order, `batch` rows a step.
    let gather = |buffer: &mut [u8]| -> f64 {
        let started = Instant::now();
        let mut k = 0u64;
        while k < n {
            for (j, slot) in buffer.chunks_exact_mut(row_bytes).enumerate() {
                let Some(i) = sampler.get(k + j as u64) else {
                    break;
                };
                slot.copy_from_slice(ds.record(i).expect("in range").as_bytes());
            }
            k += batch as u64;
            std::hint::black_box(&buffer);
        }
        started.elapsed().as_secs_f64()
    };
    // Memcpy: the same bytes, the same buffer, in file order.
    let spans: Vec<&[u8]> = ds
        .tokens(0..ds.n_tokens())
        .expect("the whole range")
        .map(|t| t.as_bytes())
        .collect();
    let memcpy = |buffer: &mut [u8]| -> f64 {
        let started = Instant::now();
        for span in &spans {
            for chunk in span.chunks(buffer.len()) {
                buffer[..chunk.len()].copy_from_slice(chunk);
                std::hint::black_box(&buffer);
            }
        }
        started.elapsed().as_secs_f64()
    };
    gather(&mut buffer); // fault every page in
    memcpy(&mut buffer);
    let best = |f: &dyn Fn(&mut [u8]) -> f64, buffer: &mut [u8]| {
        (0..3).map(|_| f(buffer)).fold(f64::MAX, f64::min)
    };
    let t_gather = best(&gather, &mut buffer);
    let t_memcpy = best(&memcpy, &mut buffer);
    let bytes = (ds.n_tokens() * ds.dtype().size() as u64) as f64;
    let gbs = |t: f64| bytes / t / 1e9;
    println!(
        "{n} rows of {row_bytes} bytes ({:.2} GB), batches of {batch} rows, one thread, page cache warm",
        bytes / 1e9
    );
    println!("  memcpy, file order          {:>7.2} GB/s", gbs(t_memcpy));
    println!(
        "  Rust reader, sampler order  {:>7.2} GB/s  ({:.0}% of memcpy)",
        gbs(t_gather),
        100.0 * t_memcpy / t_gather
    );
    println!(
        "{{\"rows\": {n}, \"row_bytes\": {row_bytes}, \"batch\": {batch}, \"memcpy_gbs\": {:.3}, \"rust_gather_gbs\": {:.3}, \"ratio\": {:.3}}}",
        gbs(t_memcpy),
        gbs(t_gather),
        t_memcpy / t_gather
    );
}
