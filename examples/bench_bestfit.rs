//! How fast best-fit planning is on its own, without reading or writing
//! tokens: documents per second of `prep::pack::bestfit::plan` on one core.
//!
//!     cargo run --release --example bench_bestfit [-- DOCUMENTS]
//!
//! Document lengths are drawn from a heavy-tailed distribution like real web
//! and documentation text (most documents a few hundred tokens, a few far
//! longer than a row); the plan is timed for L = 512, 2048 and 8192, best of
//! three, and its padding is printed beside the lower bound (total tokens
//! over L, rounded up).

use std::time::Instant;

use prep::pack::bestfit;

fn main() {
    let n: usize = std::env::args()
        .nth(1)
        .map_or(2_000_000, |a| a.parse().expect("a number of documents"));
    // xorshift64*, fixed seed: the same lengths on every run.
    let mut state = 0x9E37_79B9_7F4A_7C15u64;
    let mut next = move || {
        state ^= state >> 12;
        state ^= state << 25;
        state ^= state >> 27;
        state.wrapping_mul(0x2545_F491_4F6C_DD1D)
    };
    // Log-uniform between 16 and 16,384 tokens: median 512, mean about 2,400.
    let lengths: Vec<u64> = (0..n)
        .map(|_| {
            let u = (next() >> 11) as f64 / (1u64 << 53) as f64;
            (16.0 * 1024f64.powf(u)) as u64
        })
        .collect();
    let total: u64 = lengths.iter().sum();
    println!(
        "{n} documents, {total} tokens (mean {:.0} per document), one core",
        total as f64 / n as f64
    );
    println!(
        "{:>6} {:>12} {:>14} {:>12} {:>10} {:>11}",
        "L", "rows", "lower bound", "seconds", "M docs/s", "M tokens/s"
    );
    for l in [512u32, 2048, 8192] {
        let mut best = f64::MAX;
        let mut rows = 0;
        for _ in 0..3 {
            let started = Instant::now();
            let plan = bestfit::plan(0, lengths.iter().copied(), l);
            best = best.min(started.elapsed().as_secs_f64());
            rows = plan.n_rows();
        }
        println!(
            "{l:>6} {rows:>12} {:>14} {best:>12.3} {:>10.2} {:>11.0}",
            total.div_ceil(u64::from(l)),
            n as f64 / best / 1e6,
            total as f64 / best / 1e6
        );
    }
}
