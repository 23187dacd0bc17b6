#!/usr/bin/env python3
"""The shuffle benchmark: `prep shuffle` beside a plain copy of the same bytes, in one run.

    cargo build --release
    target/venv/bin/python tools/bench_shuffle.py [--gib 1] [--prep target/release/prep]

Uses the synthetic dataset of tools/bench_validate.py (made if missing). For
each row it times (best of --repeat, page cache warm): `cp` of the dataset's
shard files into a scratch folder (one read and one write of the bytes); prep
the same followed by `sync` (prep syncs its output shards to disk, so this is
the like-for-like copy); prep shuffle with a budget that holds everything (in memory); prep shuffle with
--memory of 1/8 of the data (out of core: two reads and two writes). Each
run's output is deleted and `sync` run before the next, so no run pays for
another's writeback. Reports MB/s of token data, the
ratio to the copy, and prep's own peak memory from its summary. Results
also go to target/bench/shuffle.json.
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import subprocess
import time
from pathlib import Path

import bench_validate

REPO = Path(__file__).resolve().parent.parent


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--prep", type=Path, default=REPO / "target" / "release" / "prep")
    ap.add_argument("--scratch", type=Path, default=REPO / "target" / "bench")
    ap.add_argument("--gib", type=float, default=1.0)
    ap.add_argument("--repeat", type=int, default=2)
    args = ap.parse_args()
    ds = args.scratch / f"validate-{args.gib:g}GiB"
    files = bench_validate.make_dataset(ds, args.gib)
    data = sum(f.stat().st_size for f in files if f.suffix == ".bin")
    subprocess.run(["cat", *map(str, files)], stdout=subprocess.DEVNULL, check=True)
    out = args.scratch / "shuffle-out"

    def clean() -> None:
        shutil.rmtree(out, ignore_errors=True)

    def copy(durable: bool) -> str:
        out.mkdir(parents=True)
        subprocess.run(["cp", *map(str, files), str(out)], check=True)
        if durable:
            subprocess.run(["sync"], check=True)
        return ""

    def shuffle(memory: str) -> str:
        r = subprocess.run([str(args.prep), "shuffle", "--seed", "1", "--memory", memory, str(ds), str(out)],
                           capture_output=True, text=True, check=True)
        return r.stderr

    budget_mib = max(1, int(data / 8 / (1 << 20)))
    rows = [
        ("cp (read + write, page cache)", lambda: copy(False)),
        ("cp + sync (as durable as prep's output)", lambda: copy(True)),
        ("prep shuffle, in memory", lambda: shuffle("64GiB")),
        (f"prep shuffle, out of core (--memory {budget_mib}MiB)", lambda: shuffle(f"{budget_mib}MiB")),
    ]
    print(f"dataset {ds}: {data / 1e6:.0f} MB of tokens, page cache warm, best of {args.repeat}")
    results = []
    for name, fn in rows:
        best, summary = None, ""
        for _ in range(args.repeat):
            clean()
            subprocess.run(["sync"], check=True)  # no earlier run's writeback in this one's time
            t = time.perf_counter()
            summary = fn()
            secs = time.perf_counter() - t
            best = secs if best is None else min(best, secs)
        clean()
        peak = re.search(r"Peak memory ([0-9.]+ \w+)", summary)
        how = re.search(r"(in memory|out of core through \d+ buckets)", summary)
        row = {"what": name, "seconds": round(best, 3), "mb_s": round(data / 1e6 / best, 1),
               "peak": peak.group(1) if peak else None, "mode": how.group(1) if how else None}
        results.append(row)
        print(f"  {name:<44} {best:7.3f} s {row['mb_s']:8.0f} MB/s  peak {row['peak'] or '-':>10}  {row['mode'] or ''}")
    ratios = {}
    for copy_row in results[:2]:
        for r in results[2:]:
            key = f"{r['what']} / {copy_row['what']}"
            ratios[key] = round(r["mb_s"] / copy_row["mb_s"], 2)
            print(f"  {key}: {ratios[key]}")
    (args.scratch / "shuffle.json").write_text(json.dumps({"bytes": data, "results": results, "ratios_to_copy": ratios}, indent=1))


if __name__ == "__main__":
    main()
