#!/usr/bin/env python3
"""The mix and split benchmark: `prep mix` and `prep split` beside `cp` of the same bytes, in one run.

    cargo build --release
    target/venv/bin/python tools/bench_mix.py [--gib 1] [--prep target/release/prep]

Uses the synthetic dataset of tools/bench_validate.py (made if missing) as
two sources of a 0.7/0.3 mixture of 90% of their tokens, and as the input of
a split with --val 0.1. For each row it times (best of --repeat, page cache
warm): `cp` of the dataset's shard files into a scratch folder; prep mix;
prep split. prep syncs its output shards, so `cp` followed by `sync` is the
like-for-like copy and is timed too. Each run's output is deleted and `sync`
run before the next. Reports MB/s of token data written and the ratio to
the copies. Results also go to target/bench/mix.json.
"""

from __future__ import annotations

import argparse
import json
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
    n_tokens = json.loads((ds / "manifest.json").read_text())["n_tokens"]
    subprocess.run(["cat", *map(str, files)], stdout=subprocess.DEVNULL, check=True)
    out = args.scratch / "mix-out"
    # The same directory twice: two sources of one tokenizer, weights 0.7 and 0.3.
    mix_tokens = int(n_tokens * 0.9)

    def copy(durable: bool) -> int:
        out.mkdir(parents=True)
        subprocess.run(["cp", *map(str, files), str(out)], check=True)
        if durable:
            subprocess.run(["sync"], check=True)
        return data

    def mix() -> int:
        subprocess.run([str(args.prep), "mix", str(out), "--source", f"{ds}:0.7", "--source", f"{ds}:0.3",
                        "--tokens", str(mix_tokens), "--max-epochs", "2", "--seed", "1", "--quiet"], check=True)
        return json.loads((out / "manifest.json").read_text())["n_tokens"] * 2

    def split() -> int:
        subprocess.run([str(args.prep), "split", str(ds), str(out), "--val", "0.1", "--seed", "1", "--quiet"],
                       check=True)
        return data

    rows = [
        ("cp (read + write, page cache)", lambda: copy(False)),
        ("cp + sync (as durable as prep's output)", lambda: copy(True)),
        (f"prep mix 0.7/0.3, {mix_tokens} tokens", mix),
        ("prep split --val 0.1", split),
    ]
    print(f"dataset {ds}: {data / 1e6:.0f} MB of tokens, page cache warm, best of {args.repeat}")
    results = []
    for name, fn in rows:
        best, written = None, 0
        for _ in range(args.repeat):
            shutil.rmtree(out, ignore_errors=True)
            subprocess.run(["sync"], check=True)  # no earlier run's writeback in this one's time
            t = time.perf_counter()
            written = fn()
            secs = time.perf_counter() - t
            best = secs if best is None else min(best, secs)
        shutil.rmtree(out, ignore_errors=True)
        row = {"what": name, "seconds": round(best, 3), "bytes": written, "mb_s": round(written / 1e6 / best, 1)}
        results.append(row)
        print(f"  {name:<44} {best:7.3f} s {row['mb_s']:8.0f} MB/s")
    ratios = {}
    for copy_row in results[:2]:
        for r in results[2:]:
            key = f"{r['what']} / {copy_row['what']}"
            ratios[key] = round(r["mb_s"] / copy_row["mb_s"], 2)
            print(f"  {key}: {ratios[key]}")
    (args.scratch / "mix.json").write_text(json.dumps({"bytes": data, "results": results, "ratios_to_copy": ratios},
                                                      indent=1))


if __name__ == "__main__":
    main()
