#!/usr/bin/env python3
"""prep.Tokenizer.encode_batch beside tokenizers' and GigaToken's, in one process.

    make bench-tokenizer-py
    # or, in a venv with prep's wheel (release), tokenizers and gigatoken:
    python tools/bench_tokenizer_py.py [--mb 16] [--files gpt2,deepseek-v3,...]

Texts: the first --mb MB of debian-docs.jsonl.zst in the corpora directory (tools/corpora.py; its
`text` fields, multilingual documentation), as a list of Python strings.
For each tokenizer file named (fixtures/tokenizers, else the corpora directory), and each
thread count (1 and 2: a child process each, RAYON_NUM_THREADS set for the
two Rust libraries that use rayon's global pool), three calls on the same
list, each timed alone after one warm-up call on a small part:

- prep:       prep.Tokenizer(path, threads=T).encode_batch(texts)
- tokenizers: tokenizers.Tokenizer.from_str(json).encode_batch_fast(texts,
              add_special_tokens=False), its ids as lists
- gigatoken:  gigatoken.Tokenizer.from_json(json).encode_batch_list(texts)
              (where it loads the file)

Every list of ids is checked equal to tokenizers' (prep's must be; a
gigatoken difference is reported). Prints MB/s and prep's ratios; writes
target/bench/tokenizer-py.json.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tools"))
from corpora import corpora  # noqa: E402

SHARED = corpora()
FILES = ("gpt2", "deepseek-v3", "gpt-neox-20b", "mistral-7b-v0.1", "gemma3", "t5-small", "bert-base-uncased")


def texts_of(mb: float) -> list[str]:
    import zstandard

    out, size = [], 0
    with zstandard.ZstdDecompressor().stream_reader(open(SHARED / "debian-docs.jsonl.zst", "rb")) as r:
        for line in io.TextIOWrapper(r, encoding="utf-8", newline="\n"):
            text = json.loads(line)["text"]
            out.append(text)
            size += len(text.encode())
            if size >= mb * 1e6:
                break
    return out


def read_json(name: str) -> str:
    import zstandard

    with zstandard.ZstdDecompressor().stream_reader(open(SHARED / "tokenizers" / f"{name}.tokenizer.json.zst", "rb")) as r:
        return io.BufferedReader(r).read().decode()


def timed(f):
    start = time.perf_counter()
    out = f()
    return time.perf_counter() - start, out


def child(args) -> None:
    """One thread count: every file, the three libraries."""
    import prep
    import tokenizers

    try:
        import gigatoken
    except ImportError:
        gigatoken = None
    texts = texts_of(args.mb)
    mb = sum(len(t.encode()) for t in texts) / 1e6
    results = {}
    for name in args.files.split(","):
        raw = read_json(name)
        path = SHARED / "tokenizers" / f"{name}.tokenizer.json.zst"
        ours = prep.Tokenizer(path, threads=args.threads)
        hf = tokenizers.Tokenizer.from_str(raw)
        hf.no_truncation()
        hf.no_padding()
        ours.encode_batch(texts[:50])
        hf.encode_batch_fast(texts[:50], add_special_tokens=False)
        t_prep, got = timed(lambda: ours.encode_batch(texts))
        t_hf, want = timed(lambda: [e.ids for e in hf.encode_batch_fast(texts, add_special_tokens=False)])
        assert got == want, f"{name}: prep's ids differ from tokenizers'"
        r = {"mb": mb, "engine": ours.engine, "prep_s": t_prep, "tokenizers_s": t_hf,
             "prep_over_tokenizers": t_hf / t_prep}
        if gigatoken is not None:
            try:
                giga = gigatoken.Tokenizer.from_json(raw)
                giga.encode_batch_list(texts[:50])
                t_giga, ids = timed(lambda: giga.encode_batch_list(texts))
                r.update(gigatoken_s=t_giga, prep_over_gigatoken=t_giga / t_prep,
                         gigatoken_same_ids=[list(map(int, x)) for x in ids] == want)
            except Exception as e:  # noqa: BLE001: a file GigaToken does not load is reported, not fatal
                r["gigatoken"] = f"does not load it: {type(e).__name__}: {str(e)[:120]}"
        results[name] = r
    print(json.dumps(results))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mb", type=float, default=16)
    ap.add_argument("--files", default=",".join(FILES))
    ap.add_argument("--threads", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--out", type=Path, default=REPO / "target" / "bench" / "tokenizer-py.json")
    args = ap.parse_args()
    if args.threads:
        return child(args)
    report = {}
    for threads in (1, 2):
        env = dict(os.environ, RAYON_NUM_THREADS=str(threads), TOKENIZERS_PARALLELISM="true")
        proc = subprocess.run([sys.executable, __file__, "--mb", str(args.mb), "--files", args.files,
                               "--threads", str(threads)], env=env, capture_output=True, text=True)
        if proc.returncode != 0:
            raise SystemExit(proc.stderr)
        report[threads] = json.loads(proc.stdout.strip().splitlines()[-1])
    print(f"{report[1][next(iter(report[1]))]['mb']:.1f} MB of debian-docs text, {os.cpu_count()} cores")
    for name in args.files.split(","):
        for threads in (1, 2):
            r = report[threads][name]
            mbs = lambda s: f"{r['mb'] / s:7.1f} MB/s"  # noqa: E731
            giga = (f"gigatoken {mbs(r['gigatoken_s'])}{'' if r['gigatoken_same_ids'] else ' (ids differ)'}"
                    if "gigatoken_s" in r else f"gigatoken {r.get('gigatoken', 'not installed')}")
            ratio = f"{r['prep_over_gigatoken']:.2f}x gigatoken" if "prep_over_gigatoken" in r else ""
            print(f"{name:18} {threads} thread{'s' if threads > 1 else ' '}  prep {mbs(r['prep_s'])}  "
                  f"tokenizers {mbs(r['tokenizers_s'])}  {giga}  prep {r['prep_over_tokenizers']:.1f}x tokenizers"
                  f"{', ' + ratio if ratio else ''}")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
