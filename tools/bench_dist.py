#!/usr/bin/env python3
"""The partitioned-run benchmark: a tokenize -> shuffle -> pack pipeline as N
tasks beside the same pipeline in one process, on the same cores.

    cargo build --release
    target/venv/bin/python tools/bench_dist.py [--parts 4] [--buckets 4] [--ray]

The real corpus (debian-docs.jsonl.zst of the corpora directory, tools/corpora.py; 92 MB of JSONL) is
decompressed into the scratch folder and cut into --files plain JSONL files
(kept between runs). Three runs of the pipeline, GPT-2, seed 1, --seq-len 2048:

1. one process: `prep tokenize` (all cores), `prep shuffle`, `prep pack`;
2. N tasks run as an engine would on this machine, as many at a time as there
   are cores, each task on one thread: tokenize --part I/N, merge, scatter,
   gather, merge, pack --part I/N, merge;
3. with --ray (needs `pip install ray`): tools/prep_ray.py on a local Ray
   instance with as many CPUs as the machine, N parts and B buckets.

Each row gives wall time per stage, the input JSONL MB/s of the whole
pipeline, its ratio to the one-process run, and the merges' time beside the
total. The final datasets are compared record for record (they must be
equal) and the merged ones checked to reference the parts' shards in place
(no token data copied). Results also go to target/bench/dist.json.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tools"))
from corpora import corpora  # noqa: E402

CORPORA = corpora()
sys.path.insert(0, str(REPO / "python"))  # the reader from the source tree

from prep.reader import Dataset  # noqa: E402


def sh(*cmd: object) -> float:
    """Runs a command, returns its wall seconds; raises with its stderr on failure."""
    t = time.perf_counter()
    r = subprocess.run([str(c) for c in cmd], capture_output=True, text=True)
    if r.returncode != 0:
        raise SystemExit(f"failed: {' '.join(map(str, cmd))}\n{r.stderr}")
    return time.perf_counter() - t


def corpus_files(scratch: Path, n: int) -> Path:
    """The corpus cut into n plain JSONL files of about equal size, made once."""
    folder = scratch / f"dist-input-{n}"
    if (folder / ".done").is_file():
        return folder
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    lines = subprocess.run(
        ["zstd", "-d", "-c", CORPORA / "debian-docs.jsonl.zst"], capture_output=True, check=True
    ).stdout.splitlines(keepends=True)
    per = -(-len(lines) // n)
    for i in range(n):
        (folder / f"part-{i:03}.jsonl").write_bytes(b"".join(lines[i * per:(i + 1) * per]))
    (folder / ".done").write_text("")
    return folder


def parallel(jobs: list[list[object]], workers: int) -> float:
    """Runs commands `workers` at a time; returns the wall seconds of all."""
    t = time.perf_counter()
    with ThreadPoolExecutor(workers) as pool:
        list(pool.map(lambda cmd: sh(*cmd), jobs))
    return time.perf_counter() - t


def same_records(a: Path, b: Path) -> bool:
    x, y = Dataset(a), Dataset(b)
    return len(x) == len(y) and all((x[i] == y[i]).all() for i in range(len(x)))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--prep", type=Path, default=REPO / "target" / "release" / "prep")
    ap.add_argument("--scratch", type=Path, default=REPO / "target" / "bench")
    ap.add_argument("--files", type=int, default=8, help="JSONL files the corpus is cut into")
    ap.add_argument("--parts", type=int, default=4)
    ap.add_argument("--buckets", type=int, default=4)
    ap.add_argument("--seq-len", type=int, default=2048)
    ap.add_argument("--window", type=int, default=5000,
                    help="bestfit window (documents); pack parts split by windows, so the corpus "
                         "(19,481 documents) needs several for every pack task to have work")
    ap.add_argument("--ray", action="store_true", help="also run tools/prep_ray.py on a local Ray instance")
    args = ap.parse_args()
    prep, scratch = args.prep.resolve(), args.scratch.resolve()
    cores = os.cpu_count() or 1
    tok = CORPORA / "tokenizers" / "gpt2.tokenizer.json.zst"
    inputs = corpus_files(scratch, args.files)
    input_bytes = sum(f.stat().st_size for f in inputs.glob("*.jsonl"))
    n, b, L, W = args.parts, args.buckets, str(args.seq_len), str(args.window)
    results: dict[str, dict] = {}

    # 1. One process.
    one = scratch / "dist-one"
    shutil.rmtree(one, ignore_errors=True)
    one.mkdir(parents=True)
    t_tok = sh(prep, "tokenize", "--tokenizer", tok, "--input", inputs, "--output", one / "tokenized", "-q")
    t_shuf = sh(prep, "shuffle", one / "tokenized", one / "shuffled", "--seed", "1", "-q")
    t_pack = sh(prep, "pack", one / "shuffled", one / "packed", "--seq-len", L, "--window", W, "-q")
    results["one process"] = {"tokenize": t_tok, "shuffle": t_shuf, "pack": t_pack, "merge": 0.0}

    # 2. N tasks, `cores` at a time, one thread each.
    run = scratch / "dist-tasks"
    shutil.rmtree(run, ignore_errors=True)
    run.mkdir(parents=True)
    part = lambda i: f"{i}/{n}"  # noqa: E731
    t_tok = parallel([[prep, "tokenize", "--tokenizer", tok, "--input", inputs, "--output",
                       run / "tokenized" / f"part-{i:05}", "--part", part(i), "--threads", "1", "-q"]
                      for i in range(n)], cores)
    m1 = sh(prep, "merge", *sorted((run / "tokenized").glob("part-*")), run / "tokenized", "-q")
    t_scatter = parallel([[prep, "shuffle", run / "tokenized", run / "scatter", "--seed", "1", "--scatter",
                           "--part", part(i), "--buckets", str(b), "-q"] for i in range(n)], cores)
    t_gather = parallel([[prep, "shuffle", run / "scatter", run / "shuffled" / f"bucket-{j:05}", "--gather",
                          "--bucket", str(j), "--threads", "1", "-q"] for j in range(b)], cores)
    m2 = sh(prep, "merge", *sorted((run / "shuffled").glob("bucket-*")), run / "shuffled", "-q")
    t_pack = parallel([[prep, "pack", run / "shuffled", run / "packed" / f"part-{i:05}", "--seq-len", L,
                        "--window", W, "--part", part(i), "--threads", "1", "-q"] for i in range(n)], cores)
    m3 = sh(prep, "merge", *sorted((run / "packed").glob("part-*")), run / "packed", "-q")
    results[f"{n} tasks, {cores} at a time"] = {
        "tokenize": t_tok, "shuffle": t_scatter + t_gather, "pack": t_pack, "merge": m1 + m2 + m3,
    }
    for stage in ("tokenized", "shuffled", "packed"):
        manifest = json.loads((run / stage / "manifest.json").read_text())
        in_place = all("/" in s["bin"] for s in manifest["shards"])
        results[f"{n} tasks, {cores} at a time"][f"{stage} in place"] = in_place
    equal = {"tasks": same_records(one / "packed", run / "packed")}

    # 3. Ray.
    if args.ray:
        ray_run = scratch / "dist-ray"
        shutil.rmtree(ray_run, ignore_errors=True)
        t = time.perf_counter()
        subprocess.run([sys.executable, REPO / "tools" / "prep_ray.py", "--prep", prep, "--tokenizer", tok,
                        "--input", str(inputs), "--run", ray_run, "--parts", str(n), "--buckets", str(b),
                        "--seed", "1", "--seq-len", L, "--window", W, "--num-cpus", str(cores)],
                       check=True, capture_output=True)
        wall = time.perf_counter() - t
        summary = json.loads((ray_run / "run-summary.json").read_text())
        stages = summary.get("stages", {})

        def stage_wall(name: str) -> float:
            return float((stages.get(name) or {}).get("wall_seconds") or 0.0)

        merges = sum(float(((s or {}).get("merge") or {}).get("seconds") or 0.0) for s in stages.values())
        results[f"Ray, {n} parts, {cores} CPUs"] = {
            "total_with_startup": wall,
            "driver_wall": float(summary.get("wall_seconds") or 0.0),
            "tokenize": stage_wall("tokenize"),
            "shuffle": stage_wall("scatter") + stage_wall("gather"),
            "pack": stage_wall("pack"),
            "merge": merges,
            "summary": summary,
        }
        equal["ray"] = same_records(one / "packed", ray_run / "packed")

    base = None
    print(f"{input_bytes / 1e6:.1f} MB of JSONL in {args.files} files, {cores} cores, GPT-2, "
          f"--seq-len {L}, {n} parts, {b} buckets")
    print(f"{'run':34} {'tokenize':>9} {'shuffle':>8} {'pack':>7} {'merges':>7} {'total':>7} {'MB/s':>6} {'vs one':>7}")
    for name, r in results.items():
        total = r["tokenize"] + r["shuffle"] + r["pack"] + r["merge"]
        r["total"] = total
        r["mb_per_s"] = input_bytes / 1e6 / total
        base = base or r["mb_per_s"]
        print(f"{name:34} {r['tokenize']:8.2f}s {r['shuffle']:7.2f}s {r['pack']:6.2f}s {r['merge']:6.3f}s "
              f"{total:6.2f}s {r['mb_per_s']:6.2f} {r['mb_per_s'] / base:6.2f}x")
        if "total_with_startup" in r:
            print(f"{'':34} (driver's own wall time {r['driver_wall']:.2f}s; "
                  f"with Ray start-up and shutdown {r['total_with_startup']:.2f}s)")
    print(f"final datasets equal to the one-process run: {equal}")
    out = REPO / "target" / "bench" / "dist.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"input_bytes": input_bytes, "cores": cores, "results": results,
                               "equal": equal}, indent=2, default=str))
    if not all(equal.values()):
        raise SystemExit("a partitioned run differs from the one-process run")


if __name__ == "__main__":
    main()
