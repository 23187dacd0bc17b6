#!/usr/bin/env python3
"""How long a tokenizer takes to be ready: from the JSON, and from its compiled form.

    make bench                      # runs this first
    target/venv/bin/python tools/bench_load.py --prep target/release/prep

For every tokenizer file in the corpora directory's tokenizers/ (tools/corpora.py:
PREP_EXTERNAL_DATA, else ../shared/corpora; Gemma 3's included), decompressed
once into the scratch folder, it runs in rounds (--repeat, default 5), each
run once a round:
  exec        `prep --version`: what starting the process costs alone;
  json        `prep tokenize` of one short document with PREP_TOKENIZER_CACHE=off:
              the engine reads the JSON, as every run did before the cache;
  compiled    the same run with the cache warm (a first run wrote the compiled
              form): what every later run of a file costs;
  py-json, py-compiled
              `prep.Tokenizer(path)` in a fresh interpreter (the release wheel,
              make bench-wheel), timed around the constructor alone (the
              package and numpy imported first), with the cache off and warm.
For the prep runs, each reports (in its summary) the milliseconds from the
run's start to the first document read, and the tokenizer's load alone; the
whole process's wall time (spawn to exit, which also writes the one-document
dataset and a copy of the tokenizer.json into it) is measured here. Reported:
the median and min/max of each over the rounds, and the goal: the first
document within 50 ms of the process's start with the compiled form. The
whole result goes to SCRATCH/load.json.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

import zstandard

sys.path.insert(0, str(Path(__file__).resolve().parent))
from corpora import corpora  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
GOAL_MS = 50.0
FIRST = re.compile(r"tokenizer ready in (\d+) ms: (.*?); the first document is read (\d+) ms after")


def tokenizer_files(folder: Path, scratch: Path) -> list[tuple[str, Path]]:
    """Every NAME.tokenizer.json(.zst) in folder, decompressed into scratch."""
    out = []
    for path in sorted(folder.glob("*.tokenizer.json*")):
        name = path.name.split(".tokenizer.json")[0]
        plain = scratch / f"load-{name}.tokenizer.json"
        if not plain.exists():
            data = path.read_bytes()
            if path.suffix == ".zst":
                data = zstandard.ZstdDecompressor().decompressobj().decompress(data)
            plain.write_bytes(data)
        out.append((name, plain))
    return out


def timed(cmd: list[str], env: dict) -> tuple[float, str]:
    """Wall milliseconds from spawn to exit, and stderr; a failure ends the run."""
    start = time.perf_counter()
    r = subprocess.run(cmd, capture_output=True, text=True, env=env)
    wall = (time.perf_counter() - start) * 1e3
    if r.returncode != 0:
        sys.exit(f"{' '.join(cmd)} failed ({r.returncode}):\n{r.stderr}")
    return wall, r.stderr


def prep_run(prep: Path, tok: Path, doc: Path, out: Path, env: dict) -> dict:
    shutil.rmtree(out, ignore_errors=True)
    wall, err = timed([str(prep), "tokenize", "--tokenizer", str(tok), "--input", str(doc),
                       "--output", str(out), "--threads", "1", "--no-eos"], env)
    m = FIRST.search(err)
    if m is None:
        sys.exit(f"no load note in prep's summary:\n{err}")
    return {"process_ms": wall, "load_ms": float(m.group(1)), "first_document_ms": float(m.group(3)),
            "source": m.group(2)}


# The class is looked up before the clock starts: that imports prep.tokenizer
# and numpy (about 0.15 s), which a program pays once whatever it loads.
PY_LOAD = """
import sys, time
import prep
Tokenizer = prep.Tokenizer
start = time.perf_counter()
Tokenizer(sys.argv[1], threads=1)
print((time.perf_counter() - start) * 1e3)
"""


def py_run(python: str, tok: Path, env: dict) -> float:
    r = subprocess.run([python, "-c", PY_LOAD, str(tok)], capture_output=True, text=True, env=env)
    if r.returncode != 0:
        sys.exit(f"prep.Tokenizer({tok}) failed:\n{r.stderr}")
    return float(r.stdout.strip().splitlines()[-1])


def stats(values: list[float]) -> dict:
    return {"median": round(statistics.median(values), 1), "min": round(min(values), 1),
            "max": round(max(values), 1)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--prep", type=Path, default=REPO / "target" / "release" / "prep")
    ap.add_argument("--python", default=sys.executable,
                    help="interpreter with the prep package (make package); '' to skip its rows")
    ap.add_argument("--tokenizer-dir", type=Path, default=corpora() / "tokenizers")
    ap.add_argument("--scratch", type=Path, default=REPO / "target" / "bench")
    ap.add_argument("--repeat", type=int, default=5)
    args = ap.parse_args()
    scratch = args.scratch
    scratch.mkdir(parents=True, exist_ok=True)
    cache = scratch / "load-tokenizer-cache"
    shutil.rmtree(cache, ignore_errors=True)
    doc = scratch / "load-doc.jsonl"
    doc.write_text('{"text": "The first document: hello, world."}\n')
    out = scratch / "load-out"
    off = {**os.environ, "PREP_TOKENIZER_CACHE": "off"}
    warm = {**os.environ, "PREP_TOKENIZER_CACHE": str(cache)}
    has_py = bool(args.python) and subprocess.run(
        [args.python, "-c", "import prep; prep.Tokenizer"], capture_output=True).returncode == 0

    files = tokenizer_files(args.tokenizer_dir, scratch)
    print(f"{len(files)} tokenizer files from {args.tokenizer_dir}; {args.repeat} rounds; "
          f"prep.Tokenizer rows: {'yes' if has_py else 'no (no prep package in ' + args.python + ')'}")
    for _, tok in files:  # the compiled forms the warm runs read
        first = prep_run(args.prep, tok, doc, out, warm)
        assert "written" in first["source"], first
    execs: list[float] = []
    rows: dict[str, dict[str, list]] = {name: {} for name, _ in files}
    for _ in range(args.repeat):
        execs.append(timed([str(args.prep), "--version"], off)[0])
        for name, tok in files:
            row = rows[name]
            for mode, env in (("json", off), ("compiled", warm)):
                r = prep_run(args.prep, tok, doc, out, env)
                want = "read from JSON" if mode == "json" else "compiled form read"
                assert want in r["source"], (name, mode, r["source"])
                for key in ("process_ms", "load_ms", "first_document_ms"):
                    row.setdefault(f"{mode}_{key}", []).append(r[key])
                if has_py:
                    row.setdefault(f"py_{mode}_ms", []).append(py_run(args.python, tok, env))
    shutil.rmtree(out, ignore_errors=True)

    result = {"repeat": args.repeat, "goal_ms": GOAL_MS, "exec_ms": stats(execs),
              "tokenizers": {name: {k: stats(v) for k, v in row.items()} for name, row in rows.items()}}
    head = (f"{'tokenizer':18} {'first doc, JSON':>16} {'first doc, compiled':>20} {'load JSON':>10} "
            f"{'load compiled':>14} {'process compiled':>17} {'speedup':>8}")
    if has_py:
        head += f" {'py JSON':>9} {'py compiled':>12}"
    print(f"\nmilliseconds, median of {args.repeat} [min-max]; `prep --version` alone: "
          f"{result['exec_ms']['median']} ms")
    print(head)
    met = True
    for name, row in result["tokenizers"].items():
        j, c = row["json_first_document_ms"], row["compiled_first_document_ms"]
        met &= c["median"] < GOAL_MS
        line = (f"{name:18} {j['median']:>8.1f} [{j['min']:.0f}-{j['max']:.0f}] "
                f"{c['median']:>10.1f} [{c['min']:.0f}-{c['max']:.0f}]"
                f" {row['json_load_ms']['median']:>10.1f} {row['compiled_load_ms']['median']:>14.1f}"
                f" {row['compiled_process_ms']['median']:>17.1f}"
                f" {j['median'] / max(c['median'], 0.5):>7.1f}x")
        if has_py:
            line += f" {row['py_json_ms']['median']:>9.1f} {row['py_compiled_ms']['median']:>12.1f}"
        print(line)
    result["goal_met"] = met
    print(f"\ngoal: the first document within {GOAL_MS:.0f} ms of the process's start with the compiled "
          f"form, every file: {'met' if met else 'NOT met'}")
    (scratch / "load.json").write_text(json.dumps(result, indent=1))
    print(f"written {scratch / 'load.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
