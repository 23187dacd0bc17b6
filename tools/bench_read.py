#!/usr/bin/env python3
"""The read benchmark: the Python reader (python/prep/reader.py) gathering rows in sampler order, beside a memcpy.

    cargo build --release
    target/venv/bin/python tools/bench_read.py [--prep target/release/prep] [--scratch target/bench]

The real corpus (debian-docs.jsonl.zst of the corpora directory: tools/corpora.py) tokenized with
GPT-2 (target/bench/pack-debian-gpt2, made and kept as tools/bench_pack.py
does) is packed into rows of --seq-len 2048 tokens, once, into
target/bench/read-packed-2048 (delete it to pack again). Then, page cache
warm, best of --repeat, one process:

1. Gather: the rows of --epochs epochs, in the Sampler's order (indices
   computed beforehand, not timed), copied batch after batch into one
   preallocated (--batch, seq_len) numpy array with `out[j] = ds[i]`, as a
   training loop's collate does. Also in input order (row 0, 1, 2, ...), to
   show what the random order costs. Beside them, np.copyto of a contiguous
   in-memory array of the same byte size into another, and the same bytes
   copied from contiguous memory into the batch array a batch at a time
   (the gather's best case: no index, no lookup, no page-cache mapping).
   Rates are GB/s of token bytes moved.
2. Sampler: indices per second from Sampler.indices (numpy), from iterating
   a Sampler (Python ints), and from Sampler.get (one at a time), for this
   dataset's row count and for n = 2^40 + 1, whose Feistel domain is almost
   4n, the worst case for cycle walking.

Results also go to target/bench/read.json.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

from bench_pack import CORPORA, REPO, sh, tokenized_corpus

sys.path.insert(0, str(REPO / "python"))  # the reader from the source tree
from prep.reader import Dataset, Sampler  # noqa: E402


def best(fn, repeat: int) -> float:
    """Best wall time of fn() over repeat runs, after one untimed run."""
    fn()
    times = []
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return min(times)


def packed_dataset(prep: Path, docs: Path, scratch: Path, seq_len: int) -> Path:
    """docs packed into rows of seq_len tokens in scratch, made once and then reused."""
    out = scratch / f"read-packed-{seq_len}"
    if not (out / "manifest.json").is_file():
        print(f"packing {docs} into {out} ...", flush=True)
        sh(prep, "pack", docs, out, "--seq-len", seq_len, "--overwrite", "--quiet")
    return out


def gather(ds: Dataset, order: list[int], out: np.ndarray) -> None:
    """Rows `order` into `out`, batch after batch: the loop a collate function runs."""
    b = len(out)
    for lo in range(0, len(order), b):
        for j, i in enumerate(order[lo:lo + b]):
            out[j] = ds[i]


def copy_batches(src: np.ndarray, out: np.ndarray) -> None:
    """The same bytes as a gather, copied from contiguous memory a batch at a time."""
    b = len(out)
    for lo in range(0, len(src) - b + 1, b):
        np.copyto(out, src[lo:lo + b])
    rest = len(src) % b
    if rest:
        np.copyto(out[:rest], src[len(src) - rest:])


def sampler_rates(n: int, positions: int, repeat: int) -> dict:
    """Indices per second for `positions` positions of a Sampler over n records."""
    s = Sampler(n, seed=1)
    per_rank = len(s)
    chunks = [(lo, min(lo + per_rank, positions)) for lo in range(0, positions, per_rank)]

    def vectorized() -> None:
        for lo, hi in chunks:  # epochs of a small dataset, or the start of a large one's
            Sampler(n, seed=1, epoch=lo).indices(0, hi - lo)

    def iterate() -> None:
        left, epoch = positions // 4, 0
        while left:
            for _ in zip(range(left), Sampler(n, seed=1, epoch=epoch)):
                pass
            left, epoch = left - min(left, per_rank), epoch + 1

    singles = 20000

    def get() -> None:
        for k in range(singles):
            s.get(k % per_rank)

    return {"n": n, "domain_over_n": round(4 ** max(((n - 1).bit_length() + 1) // 2, 1) / n, 3),
            "indices_per_s": round(positions / best(vectorized, repeat)),
            "iter_per_s": round(positions // 4 / best(iterate, repeat)),
            "get_per_s": round(singles / best(get, repeat))}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--prep", type=Path, default=REPO / "target" / "release" / "prep")
    ap.add_argument("--scratch", type=Path, default=REPO / "target" / "bench")
    ap.add_argument("--corpus", type=Path, default=CORPORA / "debian-docs.jsonl.zst")
    ap.add_argument("--tokenizer", type=Path, default=CORPORA / "tokenizers" / "gpt2.tokenizer.json.zst")
    ap.add_argument("--seq-len", type=int, default=2048, help="tokens per row")
    ap.add_argument("--batch", type=int, default=64, help="rows per batch")
    ap.add_argument("--epochs", type=int, default=4, help="epochs of rows gathered per timed run")
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    if not args.prep.is_file():
        ap.error(f"no prep binary at {args.prep}: run `cargo build --release` or pass --prep")
    args.scratch.mkdir(parents=True, exist_ok=True)
    prep = args.prep.resolve()
    docs = tokenized_corpus(prep, args.scratch, args.corpus, args.tokenizer)
    root = packed_dataset(prep, docs, args.scratch, args.seq_len)
    ds = Dataset(root)
    n, L = len(ds), ds.seq_len
    bins = [root / s["bin"] for s in ds.manifest["shards"]]
    subprocess.run(["cat", *map(str, bins)], stdout=subprocess.DEVNULL, check=True)  # warm the cache

    # 1. Gather. Orders are Python lists of ints, made before the clock starts.
    order = [i for e in range(args.epochs) for i in Sampler(n, seed=1, epoch=e)]
    sequential = list(range(n)) * args.epochs
    rows = len(order)
    nbytes = rows * L * ds.dtype.itemsize
    out = np.zeros((args.batch, L), dtype=ds.dtype)
    src = np.ones((rows, L), dtype=ds.dtype)  # ones, not empty: every page really allocated
    dst = np.zeros_like(src)
    runs = [("gather, sampler order: out[j] = ds[i]", lambda: gather(ds, order, out)),
            ("gather, input order: out[j] = ds[i]", lambda: gather(ds, sequential, out)),
            ("memcpy: np.copyto, one array", lambda: np.copyto(dst, src)),
            ("memcpy: np.copyto into the batch array", lambda: copy_batches(src, out))]
    results = []
    for what, fn in runs:
        seconds = best(fn, args.repeat)
        results.append({"what": what, "seconds": round(seconds, 4), "gb_s": round(nbytes / seconds / 1e9, 2),
                        "rows_per_s": round(rows / seconds), "ns_per_row": round(seconds / rows * 1e9)})
    memcpy = results[2]["gb_s"]
    for r in results:
        r["of_memcpy"] = round(r["gb_s"] / memcpy, 3)
    print(f"\n1. row gather from page cache: {n:,} rows of {L} tokens ({ds.manifest['dtype']}) in "
          f"{len(bins)} shard{'s' * (len(bins) != 1)}, {args.epochs} epochs = {rows:,} rows, {nbytes / 1e6:.0f} MB per run, "
          f"batches of {args.batch}, best of {args.repeat}, {os.cpu_count()} cpus")
    print(f"  {'':42} {'s':>7} {'GB/s':>6} {'rows/s':>10} {'ns/row':>7} {'/memcpy':>8}")
    for r in results:
        print(f"  {r['what']:42} {r['seconds']:7.3f} {r['gb_s']:6.2f} {r['rows_per_s']:>10,} "
              f"{r['ns_per_row']:>7,} {r['of_memcpy']:8.3f}")

    # 2. Sampler index generation.
    positions = 4_000_000
    rates = [sampler_rates(n, positions, args.repeat), sampler_rates(2**40 + 1, positions, args.repeat)]
    print(f"\n2. Sampler index generation ({positions:,} positions; iteration over a quarter of them)")
    print(f"  {'n':>15} {'domain/n':>8} {'indices() M/s':>13} {'iter M/s':>9} {'get() M/s':>9}")
    for r in rates:
        print(f"  {r['n']:>15,} {r['domain_over_n']:>8.3f} {r['indices_per_s'] / 1e6:>13.1f} "
              f"{r['iter_per_s'] / 1e6:>9.1f} {r['get_per_s'] / 1e6:>9.3f}")

    report = {"cpus": os.cpu_count(), "python": platform.python_version(), "numpy": np.__version__,
              "prep": sh(prep, "--version").stdout.strip(),
              "dataset": {"rows": n, "seq_len": L, "dtype": ds.manifest["dtype"], "shards": len(bins),
                          "bytes": ds.manifest["n_tokens"] * ds.dtype.itemsize},
              "gather": {"epochs": args.epochs, "rows": rows, "bytes": nbytes, "batch": args.batch,
                         "repeat": args.repeat, "runs": results},
              "sampler": {"positions": positions, "runs": rates}}
    path = args.scratch / "read.json"
    path.write_text(json.dumps(report, indent=1) + "\n")
    print(f"\nwrote {path}")


if __name__ == "__main__":
    sys.exit(main())
