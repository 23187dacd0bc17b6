#!/usr/bin/env python3
"""Two prep builds, the same stages on the same 1 GB dataset, interleaved: median of N.

    python3 tools/bench_stages_ab.py BASE_PREP NEW_PREP [RUNS] [CASES]

For a change that should not slow a stage down (the input checks of issue
51 were measured so): `prep shuffle` in memory and out of core, `prep pack`
concat, concat --seed 1 and bestfit at L = 2048, on 16 copies of the
debian-docs corpus in GPT-2 ids (tools/bench_pack.py makes them, with
BASE_PREP, in /tmp/bench). Each run's output is deleted and `sync` run
before the next; the two builds alternate which goes first. Prints the
median wall time and CPU time (user + system) of each, and writes every time to /tmp/bench/verify-bench.json. Needs only
the standard library.
"""
import json, resource, shutil, subprocess, sys, time, statistics
from pathlib import Path
REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tools"))
import bench_pack

base, new = Path(sys.argv[1]), Path(sys.argv[2])
runs = int(sys.argv[3]) if len(sys.argv) > 3 else 5
scratch = Path("/tmp/bench")
scratch.mkdir(exist_ok=True)
corpus = bench_pack.CORPORA / "debian-docs.jsonl.zst"
tok = REPO / "fixtures" / "tokenizers" / "gpt2.tokenizer.json.zst"
ds = bench_pack.tokenized_corpus(base, scratch, corpus, tok)
big = scratch / "x16"
if not (big / "manifest.json").is_file():
    bench_pack.copies_of(ds, big, 16)
subprocess.run(["cat", *map(str, big.glob("*.bin"))], stdout=subprocess.DEVNULL)
out = scratch / "out"
cases = {
    "shuffle, in memory": ["shuffle", "--quiet", "--seed", "1", "--memory", "8GiB", big, out],
    "shuffle, --memory 256MiB": ["shuffle", "--quiet", "--seed", "1", "--memory", "256MiB", big, out],
    "pack concat": ["pack", "--quiet", big, out, "--seq-len", "2048", "--mode", "concat"],
    "pack concat --seed 1": ["pack", "--quiet", big, out, "--seq-len", "2048", "--mode", "concat", "--seed", "1"],
    "pack bestfit": ["pack", "--quiet", big, out, "--seq-len", "2048"],
}
only = sys.argv[4].split(",") if len(sys.argv) > 4 else list(cases)
times = {c: {"base": [], "new": []} for c in cases}  # (wall, cpu) of each run
for r in range(runs):
    for c in cases:
        if not any(o in c for o in only):
            continue
        for name, exe in (("base", base), ("new", new)) if r % 2 == 0 else (("new", new), ("base", base)):
            shutil.rmtree(out, ignore_errors=True)
            subprocess.run(["sync"])
            r0 = resource.getrusage(resource.RUSAGE_CHILDREN)
            t = time.perf_counter()
            subprocess.run([str(exe), *map(str, cases[c])], check=True)
            wall = time.perf_counter() - t
            r1 = resource.getrusage(resource.RUSAGE_CHILDREN)
            cpu = (r1.ru_utime - r0.ru_utime) + (r1.ru_stime - r0.ru_stime)
            times[c][name].append((wall, cpu))
        print(c, {k: [round(x, 3) for x in v[-1]] for k, v in times[c].items()}, flush=True)
shutil.rmtree(out, ignore_errors=True)
print("| run | wall before (s) | wall after (s) | after / before | CPU before (s) | CPU after (s) | after / before |")
print("|---|---|---|---|---|---|---|")
for c, t in times.items():
    if t["base"]:
        row = [c]
        for k in (0, 1):
            b = statistics.median(x[k] for x in t["base"])
            n = statistics.median(x[k] for x in t["new"])
            row += [f"{b:.2f}", f"{n:.2f}", f"{n / b:.3f}"]
        print("| " + " | ".join(row) + " |")
json.dump(times, open(scratch / "verify-bench.json", "w"), indent=1)
