#!/usr/bin/env python3
"""The GPU loader's sweep: `prep bench-read --device cuda:N` at batches of
64 KiB to 64 MiB on a packed dataset of at least 1 GB, each beside the
event-timed pinned copy of the same size in the same run.

    cargo build --release --features cuda
    python3 tools/bench_gpu.py --prep target/release/prep --scratch /tmp/prep-gpu [--device cuda:0]

The dataset: --gb GB of random GPT-2 ids (a document ends at each id 50256,
about one in 1,000), written as a nanoGPT .bin, imported (`prep import
nanogpt`) and packed into rows of 2,048 tokens (4 KiB), once, into
SCRATCH/packed-2048 (kept for the next run). The loader moves bytes; what
the ids are does not change its speed, and random ids need no corpus on the
machine with the GPU.

For each batch size, two runs of one loader each (16 threads by default,
depth 4): a simulated step of twice the reference copy time of a batch
(--step-x 2: no step should wait after warm-up) and of once (--step-x 1).
Prints a table (Markdown) and writes every report to --json.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

ROW_TOKENS = 2048
EOS = 50256
SIZES = [64 << 10, 256 << 10, 1 << 20, 4 << 20, 16 << 20, 64 << 20]


def sh(*args: object) -> str:
    proc = subprocess.run([str(a) for a in args], capture_output=True, text=True)
    if proc.returncode != 0:
        sys.exit(f"{' '.join(map(str, args))}: exit {proc.returncode}\n{proc.stderr}")
    return proc.stdout


def dataset(prep: Path, scratch: Path, gb: float) -> Path:
    packed = scratch / "packed-2048"
    if (packed / "manifest.json").exists():
        return packed
    scratch.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    rng = np.random.default_rng(0)
    n = int(gb * 1e9 / 2)
    raw = scratch / "random.bin"
    with raw.open("wb") as f:
        for at in range(0, n, 1 << 26):
            ids = rng.integers(0, EOS, size=min(1 << 26, n - at), dtype=np.uint16)
            ids[rng.random(ids.size) < 1e-3] = EOS
            ids.tofile(f)
    sh(prep, "import", "nanogpt", raw, scratch / "docs", "--eos", EOS, "--overwrite", "--quiet")
    # Each imported document ends with its eos already.
    sh(prep, "pack", scratch / "docs", packed, "--seq-len", ROW_TOKENS, "--no-sep", "--overwrite", "--quiet")
    raw.unlink()
    print(f"made {packed} in {time.perf_counter() - started:.0f} s", file=sys.stderr)
    return packed


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--prep", type=Path, default=Path("target/release/prep"))
    ap.add_argument("--scratch", type=Path, default=Path("target/bench/gpu"))
    ap.add_argument("--device", default="cuda:0")
    ap.add_argument("--gb", type=float, default=1.2, help="dataset size in GB (default 1.2)")
    ap.add_argument("--threads", type=int, default=0)
    ap.add_argument("--depth", type=int, default=4)
    ap.add_argument("--pinned", default="plain", help="cuda: the staging memory, plain or wc (write-combined)")
    ap.add_argument("--gather", default="host", help="cuda: who gathers rows: host, device (a kernel) or dma (the copy engines)")
    ap.add_argument("--json", type=Path, help="where to write every report")
    args = ap.parse_args()
    packed = dataset(args.prep, args.scratch, args.gb)
    reports = []
    for size in SIZES:
        rows = size // (ROW_TOKENS * 2)
        steps = max(32, min(4000, (2 << 30) // size))
        for x in (2, 1):
            out = sh(args.prep, "bench-read", packed, "--device", args.device, "--batch", rows, "--steps", steps,
                     "--step-x", x, "--depth", args.depth, "--threads", args.threads, "--json",
                     *(["--pinned", args.pinned, "--gather", args.gather] if args.device != "cpu" else []))
            report = json.loads(out)
            report["step_x"] = x
            reports.append(report)
            print(f"{size >> 10} KiB x{x}: {report['loader_bytes_per_second'] / 1e9:.2f} GB/s, "
                  f"{report['steps_waiting']} of {report['steps_timed']} steps waited", file=sys.stderr)
    if args.json:
        args.json.write_text(json.dumps(reports, indent=1))
    print(f"\n{packed}: {reports[0]['rows']} rows of {ROW_TOKENS} tokens (uint16), to {reports[0]['place']}, "
          f"depth {args.depth}, threads {args.threads or 'one per core'}\n")
    print("| batch | rows | loader tokens/s | loader GB/s | pinned copy GB/s | ratio | waits, step 2x copy | waits, step 1x copy |")
    print("|---|---|---|---|---|---|---|---|")
    for two, one in zip(reports[::2], reports[1::2]):
        copy = two["batch_copy"]["bytes_per_second"]
        loader = two["loader_bytes_per_second"]

        def waits(r: dict) -> str:
            return (f"{r['steps_waiting']} of {r['steps_timed']} (mean {r['wait_mean_seconds'] * 1e3:.3f} ms, "
                    f"step {r['step_seconds'] * 1e3:.3f} ms)")

        print(f"| {two['batch_bytes'] >> 10} KiB | {two['batch_rows']} | {two['loader_tokens_per_second'] / 1e6:,.0f}M "
              f"| {loader / 1e9:.2f} | {copy / 1e9:.2f} | {loader / copy:.2f} | {waits(two)} | {waits(one)} |")


if __name__ == "__main__":
    main()
