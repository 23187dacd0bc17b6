#!/usr/bin/env python3
"""prep dedup at size: time against corpus size, and memory under --memory.

    python tools/bench_dedup_scale.py --prep target/release/prep \\
        [--sizes 0.1,1,3] [--memory 64MiB] [--threads 1,2] [--scratch target/bench/dedup-scale]

The corpus at each size is made from the real corpus (debian-docs.jsonl.zst,
found by tools/corpora.py), tokenized once with the GPT-2 tokenizer of
fixtures/: as many copies of its tokens as make the size in text bytes
(the real corpus's JSONL counts once per copy), each copy's ids mapped
through a permutation of the vocabulary of its own (end-of-text kept), and
read back with `prep import nanogpt`. A copy keeps the real documents'
lengths and the near-duplicates they hold among themselves (the real corpus
has some: prep removes 12.7% of it), while its shingles are unrelated to
any other copy's: the share removed stays that of the real corpus at every
size, as the clusters of a real crawl would.

Each size is then deduplicated with each --threads and the --memory budget,
each run timed (wall, user, system), with the peak resident memory prep
reports (VmHWM: the entries, the clusters, and the input's mapped pages
while held) and the entries' sorted runs it spilled. The table gives
seconds per GB of text, so a linear stage shows a flat column.
"""

from __future__ import annotations

import argparse
import json
import math
import resource
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tools"))
from corpora import external  # noqa: E402

GPT2 = REPO / "fixtures" / "tokenizers" / "gpt2.tokenizer.json.zst"
EOS = 50256


def base_tokens(prep: str, scratch: Path) -> tuple[np.ndarray, int]:
    """The real corpus tokenized (its records back to back, each ending in
    end-of-text) and its JSONL size in bytes."""
    corpus = external("debian-docs.jsonl.zst")
    import zstandard

    with corpus.open("rb") as f:
        text_bytes = len(zstandard.ZstdDecompressor().stream_reader(f).read())
    tok = scratch / "base"
    if not (tok / "manifest.json").exists():
        subprocess.run([prep, "tokenize", "--tokenizer", str(GPT2), "--input", str(corpus),
                        "--output", str(tok), "--threads", "2", "-q"], check=True)
    manifest = json.loads((tok / "manifest.json").read_text())
    assert manifest["dtype"] == "uint16" and manifest["eos_appended"]
    parts = [np.fromfile(tok / s["bin"], dtype=np.uint16) for s in manifest["shards"]]
    return np.concatenate(parts), text_bytes


def write_copies(tokens: np.ndarray, copies: int, path: Path) -> None:
    """`copies` copies of `tokens`, copy k (k > 0) through a permutation of
    the ids below end-of-text of its own, as one flat uint16 file."""
    with path.open("wb") as out:
        for k in range(copies):
            if k == 0:
                out.write(tokens.tobytes())
                continue
            perm = np.random.default_rng(k).permutation(EOS).astype(np.uint16)
            table = np.append(perm, np.uint16(EOS))
            out.write(table[tokens].tobytes())


def timed(cmd: list[str]) -> dict:
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.monotonic()
    proc = subprocess.run(cmd, capture_output=True, text=True)
    wall = time.monotonic() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if proc.returncode != 0:
        sys.exit(f"failed: {' '.join(cmd)}\n{proc.stderr}")
    return {"wall": wall, "user": after.ru_utime - before.ru_utime,
            "sys": after.ru_stime - before.ru_stime, "stderr": proc.stderr}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--prep", required=True, type=Path)
    ap.add_argument("--sizes", default="0.1,1,3", help="GB of text, comma separated")
    ap.add_argument("--memory", default="64MiB")
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--scratch", type=Path, default=REPO / "target" / "bench" / "dedup-scale")
    args = ap.parse_args()
    prep = str(args.prep.resolve())
    args.scratch.mkdir(parents=True, exist_ok=True)
    tokens, text_bytes = base_tokens(prep, args.scratch)
    rows = []
    for gb in sorted(float(x) for x in args.sizes.split(",")):
        copies = max(1, math.ceil(gb * 1e9 / text_bytes))
        d = args.scratch / f"{gb:g}GB"
        shutil.rmtree(d, ignore_errors=True)
        d.mkdir()
        write_copies(tokens, copies, d / "tokens.bin")
        subprocess.run([prep, "import", "nanogpt", str(d / "tokens.bin"), str(d / "tok"), "--eos", str(EOS),
                        "--tokenizer", str(GPT2), "-q"], check=True)
        (d / "tokens.bin").unlink()
        manifest = json.loads((d / "tok" / "manifest.json").read_text())
        for n in [int(x) for x in args.threads.split(",")]:
            out = d / f"out-{n}"
            r = timed([prep, "dedup", str(d / "tok"), str(out), "--threads", str(n), "--memory", args.memory])
            said = r["stderr"]
            runs = said.split(" sorted runs spilled")[0].rsplit("(", 1)[-1] if "sorted runs spilled" in said else "0"
            # prep's own summary ends "Peak memory 80.1 MiB." (VmHWM).
            peak = said.split("Peak memory ")[1].split(" MiB")[0] + " MiB" if "Peak memory" in said else "?"
            m = json.loads((out / "manifest.json").read_text())
            rows.append({"gb": copies * text_bytes / 1e9, "documents": manifest["n_records"],
                         "tokens": manifest["n_tokens"], "threads": n,
                         "removed": m["provenance"]["documents"]["deduplicated"], "runs": runs, "peak": peak,
                         **{k: r[k] for k in ("wall", "user", "sys")}})
            shutil.rmtree(out)
            print(json.dumps(rows[-1]), flush=True)
        shutil.rmtree(d)
    print(f"\nprep dedup --memory {args.memory}, {len(tokens):,} tokens per copy of the corpus")
    print(f"{'GB':>6} {'documents':>10} {'tokens':>13} {'thr':>3} {'removed':>9} {'runs':>5} "
          f"{'wall s':>7} {'s/GB':>6} {'user s':>7} {'sys s':>6} {'peak':>11}")
    for r in rows:
        print(f"{r['gb']:6.2f} {r['documents']:10,} {r['tokens']:13,} {r['threads']:3} {r['removed']:9,} "
              f"{r['runs']:>5} {r['wall']:7.1f} {r['wall'] / r['gb']:6.1f} {r['user']:7.1f} {r['sys']:6.1f} "
              f"{r['peak']:>11}")
    (args.scratch / "results.json").write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
