#!/usr/bin/env python3
"""What a write(2)'s size costs: 1 GiB written into a new file in writes of
each size, the system time the writing process spends, median of rounds.

    target/venv/bin/python tools/bench_write_size.py [--gib 1] [--repeat 3] [--scratch target/bench]

Why prep writes large files in pieces of at most 256 KiB
(crates/reader/src/format/writer.rs, MAX_WRITE): the kernel takes the
page-cache memory for a write in pieces as large as the write, and on a
machine whose hypervisor takes back free memory in large blocks, large
pieces cost more to come by. Each run writes the same bytes (one buffer,
written again and again), starts after the file before it is deleted and
`sync` run and bench_runs.SETTLE_S seconds have passed, and ends before any
sync of its own, so what it measures is the copy into the page cache alone.
Results also go to target/bench/write_size.json.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import resource
import statistics
import subprocess
import time
from pathlib import Path

import bench_runs

REPO = Path(__file__).resolve().parent.parent
SIZES = [16 << 10, 64 << 10, 256 << 10, 1 << 20, 4 << 20]


def one(path: Path, size: int, total: int) -> tuple[float, float]:
    """Writes `total` bytes to a new `path` in writes of `size`; wall and system seconds."""
    buf = os.urandom(size)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        before = resource.getrusage(resource.RUSAGE_SELF).ru_stime
        start = time.perf_counter()
        done = 0
        while done < total:
            done += os.write(fd, buf[: min(size, total - done)])
        wall = time.perf_counter() - start
        return wall, resource.getrusage(resource.RUSAGE_SELF).ru_stime - before
    finally:
        os.close(fd)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--scratch", type=Path, default=REPO / "target" / "bench")
    ap.add_argument("--gib", type=float, default=1.0)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--settle", type=float, default=bench_runs.SETTLE_S, help=bench_runs.SETTLE_HELP)
    args = ap.parse_args()
    args.scratch.mkdir(parents=True, exist_ok=True)
    path = args.scratch / "write-size.tmp"
    total = int(args.gib * (1 << 30))
    runs: dict[int, list[tuple[float, float]]] = {s: [] for s in SIZES}
    order = random.Random(1)
    for _ in range(args.repeat):
        # A new order each round: a run writes into what the run before it
        # freed, and no size should always follow the same one.
        for size in order.sample(SIZES, len(SIZES)):
            path.unlink(missing_ok=True)
            subprocess.run(["sync"], check=True)
            time.sleep(args.settle)
            runs[size].append(one(path, size, total))
    path.unlink(missing_ok=True)
    print(f"\n{total / (1 << 30):g} GiB into a new file, median of {args.repeat} (min to max)")
    print(f"  {'write size':>10} {'wall s':>8} {'system s':>9} {'min':>7} {'max':>7}")
    report = []
    for size in SIZES:
        walls = [w for w, _ in runs[size]]
        sys_ = [s for _, s in runs[size]]
        row = {"write_bytes": size, "wall_s": round(statistics.median(walls), 3),
               "sys_s": round(statistics.median(sys_), 3), "sys_min_s": round(min(sys_), 3),
               "sys_max_s": round(max(sys_), 3)}
        report.append(row)
        print(f"  {size >> 10:>8} K {row['wall_s']:8.3f} {row['sys_s']:9.3f} {row['sys_min_s']:7.3f} {row['sys_max_s']:7.3f}")
    out = args.scratch / "write_size.json"
    out.write_text(json.dumps({"bytes": total, "repeat": args.repeat, "rows": report}, indent=1) + "\n")
    print(f"\nwrote {out}")


if __name__ == "__main__":
    main()
