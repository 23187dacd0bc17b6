#!/usr/bin/env python3
"""The shuffle benchmark: `prep shuffle` beside `cp -r` + `sync` of the same dataset, in one run.

    cargo build --release
    target/venv/bin/python tools/bench_shuffle.py [--gib 1] [--repeat 5] [--prep target/release/prep]

On two synthetic datasets of about --gib GiB of uint32 tokens (tools/bench_runs.py,
made once in the scratch folder): small documents (about 200 tokens each, the
held-out shape) and large ones (about 20,000 tokens each). For each it runs,
in --repeat rounds (each row once a round, page cache warm, the output deleted
and `sync` run before every run, so that no run pays for another's
writeback): `cp -r` of the dataset (one read and one write of the bytes,
left in the page cache); the same followed by `sync` (prep syncs its output,
so this is the like-for-like copy); prep shuffle with a budget that holds
everything (in memory); prep shuffle with --memory of 1/8 of the data (out of
core: the documents go through bucket files, two reads and two writes).
Reports the median, min and max wall time, the median user and system time
(os.wait4), the time over the durable copy's (the goal: at most 1.5), and
prep's own peak memory from its summary. With --base, another build's rows
run in the same rounds (a before and after that no drift of the machine
between two runs can tilt). Results also go to
target/bench/shuffle.json.
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
from pathlib import Path

import bench_runs
from bench_runs import Row

REPO = Path(__file__).resolve().parent.parent
GOAL = 1.5


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--prep", type=Path, default=REPO / "target" / "release" / "prep")
    ap.add_argument("--scratch", type=Path, default=REPO / "target" / "bench")
    ap.add_argument("--gib", type=float, default=1.0)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--shapes", default="small,large", help="document shapes, of " + ",".join(bench_runs.SHAPES))
    ap.add_argument("--settle", type=float, default=bench_runs.SETTLE_S, help=bench_runs.SETTLE_HELP)
    ap.add_argument("--base", type=Path, help="another build of prep, timed in the same rounds (e.g. the commit before a change)")
    args = ap.parse_args()
    out = args.scratch / "shuffle-out"
    report: dict = {"prep": str(args.prep), "base": str(args.base) if args.base else None,
                    "repeat": args.repeat, "datasets": {}}
    for shape in args.shapes.split(","):
        ds = bench_runs.shaped_dataset(args.scratch, shape, args.gib)
        m = json.loads((ds / "manifest.json").read_text())
        data = sum(s["bin_bytes"] for s in m["shards"])
        bench_runs.warm(ds)

        def shuffle(prep: Path, memory: str) -> bench_runs.Run:
            return bench_runs.timed([prep, "shuffle", "--seed", "1", "--memory", memory, ds, out])

        budget_mib = max(1, int(data / 8 / (1 << 20)))
        rows = [
            Row("cp -r (page cache)", lambda: bench_runs.cp_r(ds, out, False)),
            Row("cp -r + sync (as durable as prep's output)", lambda: bench_runs.cp_r(ds, out, True)),
        ]
        for label, prep in [("", args.prep)] + ([("base: ", args.base)] if args.base else []):
            rows += [
                Row(f"{label}prep shuffle, in memory", lambda prep=prep: shuffle(prep, "64GiB")),
                Row(f"{label}prep shuffle, out of core (--memory {budget_mib}MiB)",
                    lambda prep=prep: shuffle(prep, f"{budget_mib}MiB")),
            ]
        bench_runs.rounds(rows, out, args.repeat, args.settle)
        title = (f"{shape} documents: {ds.name}, {m['n_records']:,} documents, {data / 1e6:.0f} MB of tokens, "
                 f"median of {args.repeat}")
        results = bench_runs.table(title, rows, rows[1].what)
        for row, r in zip(rows, results):
            peak = re.search(r"Peak memory ([0-9.]+ \w+)", row.runs[-1].stderr)
            how = re.search(r"(in memory|out of core through \d+ buckets)", row.runs[-1].stderr)
            r.update(peak=peak.group(1) if peak else None, mode=how.group(1) if how else None,
                     mb_s=round(data / 1e6 / statistics.median(x.wall for x in row.runs), 1))
            if r["peak"]:
                print(f"  {r['what']:44} peak {r['peak']}, {r['mode']}")
        goals = {r["what"]: {"time_over_cp_r_sync": r["over_base"], "met": r["over_base"] <= GOAL}
                 for r in results[2:] if not r["what"].startswith("base: ")}
        for what, g in goals.items():
            print(f"  goal {what} <= {GOAL} x cp -r + sync: {g['time_over_cp_r_sync']:.2f} "
                  f"{'met' if g['met'] else 'MISSED'}")
        report["datasets"][shape] = {"path": str(ds), "documents": m["n_records"], "bytes": data,
                                     "results": results, "goals": goals}
    path = args.scratch / "shuffle.json"
    path.write_text(json.dumps(report, indent=1) + "\n")
    print(f"\nwrote {path}")


if __name__ == "__main__":
    main()
