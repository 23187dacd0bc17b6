#!/usr/bin/env python3
"""The tokenize benchmark: prep against a Python `tokenizers` baseline, same corpus, same machine.

    cargo build --release
    target/venv/bin/python tools/bench_tokenize.py                  # whole corpus
    target/venv/bin/python tools/bench_tokenize.py --limit-mb 10    # quick run on a prefix

For each tokenizer and thread count T it runs, one after the other:
  baseline  tools/baseline_tokenize.py with RAYON_NUM_THREADS=T (json.loads,
            encode_batch of 1,024 documents, eos appended, numpy writes a .bin);
  prep      prep tokenize --threads T --eos EOS.
Both read the same decompressed JSONL and the same decompressed tokenizer.json
from the scratch folder (default target/bench), so neither pays for zstd.

Reported per run: wall time; input MB/s (JSONL bytes / s) and text MB/s (UTF-8
bytes of the `text` fields / s), MB being 10^6 bytes; tokens/s; peak RSS of the
child process (ru_maxrss from os.wait4). Then the ratios prep/baseline at equal
threads and prep 2-thread/1-thread, a check that prep's token count equals the
baseline's (and whether the token bytes are identical), and the whole result as
JSON in target/bench/tokenize.json.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import time
from pathlib import Path

import zstandard

sys.path.insert(0, str(Path(__file__).resolve().parent))
from corpora import corpora  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
EOS = {
    "gpt2": "<|endoftext|>",
    "deepseek-v3": "<\uff5cend\u2581of\u2581sentence\uff5c>",
    "minilm-wordpiece": "[SEP]",
}
MB = 1e6


def prepare_corpus(corpus: Path, scratch: Path, limit_mb: float | None) -> tuple[Path, int, int, int]:
    """Decompresses the corpus (whole, or its first limit_mb MB) into scratch, once per size.

    Returns (the JSONL path, its bytes, documents, UTF-8 bytes of the texts)."""
    scratch.mkdir(parents=True, exist_ok=True)
    limit = int(limit_mb * MB) if limit_mb else None
    jsonl = scratch / ("corpus.jsonl" if limit is None else f"corpus-{limit_mb:g}MB.jsonl")
    corpus_bytes, n_docs, text_bytes = decompress_corpus(corpus, jsonl, limit)
    print(f"corpus {jsonl}: {corpus_bytes / MB:.1f} MB JSONL, {text_bytes / MB:.1f} MB text, "
          f"{n_docs:,} documents")
    return jsonl, corpus_bytes, n_docs, text_bytes


def write_tokenizer(tokenizer_dir: Path, scratch: Path, name: str) -> Path:
    """Decompresses tokenizer_dir/NAME.tokenizer.json.zst into scratch; returns its path."""
    tok_json = scratch / f"{name}.tokenizer.json"
    with (tokenizer_dir / f"{name}.tokenizer.json.zst").open("rb") as f:
        tok_json.write_bytes(zstandard.ZstdDecompressor().stream_reader(f).read())
    return tok_json


def decompress_corpus(src: Path, dst: Path, limit_bytes: int | None) -> tuple[int, int, int]:
    """Writes src (zstd JSONL) to dst, whole lines only, up to limit_bytes.

    Returns (JSONL bytes, documents, UTF-8 bytes of the texts)."""
    n_bytes = n_docs = text_bytes = 0
    tmp = dst.with_name(dst.name + ".tmp")
    with src.open("rb") as f, tmp.open("wb") as out:
        reader = zstandard.ZstdDecompressor().stream_reader(f, read_size=1 << 20)
        pending = b""
        done = False
        while not done:
            chunk = reader.read(1 << 22)
            if not chunk:
                lines, pending = ([pending] if pending else []), b""
                done = True
            else:
                lines = (pending + chunk).split(b"\n")
                pending = lines.pop()
            for line in lines:
                if limit_bytes is not None and n_bytes + len(line) + 1 > limit_bytes:
                    done = True
                    break
                out.write(line + b"\n")
                n_bytes += len(line) + 1
                if line.strip():
                    n_docs += 1
                    text_bytes += len(json.loads(line)["text"].encode("utf-8"))
    tmp.replace(dst)
    return n_bytes, n_docs, text_bytes


def run_measured(cmd: list[str], env: dict[str, str], log: Path) -> tuple[float, int, str]:
    """Runs cmd; returns (wall seconds, peak RSS in bytes, stdout). Fails on a non-zero exit."""
    with log.open("w") as out:
        start = time.perf_counter()
        proc = subprocess.Popen(cmd, env=env, stdout=out, stderr=subprocess.STDOUT)
        _, status, usage = os.wait4(proc.pid, 0)
        wall = time.perf_counter() - start
    proc.returncode = os.waitstatus_to_exitcode(status)
    text = log.read_text(errors="replace")
    if proc.returncode != 0:
        sys.exit(f"error: {' '.join(cmd)} exited {proc.returncode}:\n{text[-4000:]}")
    # ru_maxrss is in KiB on Linux.
    return wall, usage.ru_maxrss * 1024, text


def same_bytes(a: list[Path], b: Path) -> bool:
    """True when the files a, concatenated, hold the bytes of b."""
    if sum(p.stat().st_size for p in a) != b.stat().st_size:
        return False
    with b.open("rb") as fb:
        for p in a:
            with p.open("rb") as fa:
                while True:
                    chunk = fa.read(1 << 22)
                    if not chunk:
                        break
                    if fb.read(len(chunk)) != chunk:
                        return False
    return True


def tool_version(cmd: list[str]) -> str:
    try:
        return subprocess.run(cmd, capture_output=True, text=True, timeout=30).stdout.strip()
    except OSError as e:
        return f"unknown ({e})"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--corpus", type=Path,
                    default=corpora() / "debian-docs.jsonl.zst")
    ap.add_argument("--scratch", type=Path, default=REPO / "target" / "bench")
    ap.add_argument("--prep", type=Path, default=REPO / "target" / "release" / "prep")
    ap.add_argument("--python", default=sys.executable,
                    help="interpreter for the baseline; needs tokenizers and numpy")
    ap.add_argument("--tokenizers", default="gpt2,deepseek-v3",
                    help=f"comma-separated, from {', '.join(EOS)}")
    ap.add_argument("--threads", default="1,2", help="comma-separated thread counts")
    ap.add_argument("--limit-mb", type=float, default=None,
                    help="bench on the first N MB of the JSONL (whole lines)")
    args = ap.parse_args()

    names = [n for n in args.tokenizers.split(",") if n]
    threads = [int(t) for t in args.threads.split(",") if t]
    for n in names:
        if n not in EOS:
            ap.error(f"unknown tokenizer {n!r}; known: {', '.join(EOS)}")
    if not args.prep.is_file():
        ap.error(f"no prep binary at {args.prep}: run `cargo build --release` or pass --prep")

    scratch = args.scratch
    jsonl, corpus_bytes, n_docs, text_bytes = prepare_corpus(args.corpus, scratch, args.limit_mb)

    baseline = REPO / "tools" / "baseline_tokenize.py"
    runs = []
    checks = {}
    for name in names:
        tok_json = write_tokenizer(REPO / "fixtures" / "tokenizers", scratch, name)
        results = {}
        for impl in ("baseline", "prep"):
            for t in threads:
                env = dict(os.environ)
                if impl == "baseline":
                    out = scratch / f"baseline-{name}-t{t}.bin"
                    cmd = [args.python, str(baseline), "--tokenizer", str(tok_json),
                           "--input", str(jsonl), "--output", str(out), "--eos", EOS[name]]
                    env["RAYON_NUM_THREADS"] = str(t)
                    env["TOKENIZERS_PARALLELISM"] = "true"
                else:
                    out = scratch / f"prep-{name}-t{t}"
                    # A previous run's output would be resumed, not rewritten.
                    shutil.rmtree(out, ignore_errors=True)
                    cmd = [str(args.prep), "tokenize", "--tokenizer", str(tok_json),
                           "--input", str(jsonl), "--output", str(out), "--eos", EOS[name],
                           "--threads", str(t), "--quiet"]
                if out.is_file():
                    out.unlink()
                wall, rss, stdout = run_measured(cmd, env, scratch / f"{impl}-{name}-t{t}.log")
                if impl == "baseline":
                    summary = json.loads(stdout.strip().splitlines()[-1])
                    tokens, bins = summary["tokens"], [out]
                else:
                    manifest = json.loads((out / "manifest.json").read_text(encoding="utf-8"))
                    tokens = manifest["n_tokens"]
                    bins = [out / s["bin"] for s in manifest["shards"]]
                run = {"tokenizer": name, "impl": impl, "threads": t, "wall_s": round(wall, 3),
                       "input_mb_s": round(corpus_bytes / MB / wall, 3),
                       "text_mb_s": round(text_bytes / MB / wall, 3),
                       "tokens": tokens, "tokens_per_s": round(tokens / wall),
                       "peak_rss_mb": round(rss / MB, 1)}
                runs.append(run)
                results[(impl, t)] = (run, bins)
                print(f"  {name:16} {impl:8} T={t}  {wall:8.2f} s  "
                      f"{run['input_mb_s']:7.2f} MB/s  {tokens:,} tokens", flush=True)

        base_tokens = {results[("baseline", t)][0]["tokens"] for t in threads}
        prep_tokens = {results[("prep", t)][0]["tokens"] for t in threads}
        base_bins = results[("baseline", threads[0])][1][0]
        identical = all(same_bytes(results[("prep", t)][1], base_bins) for t in threads)
        checks[name] = {
            "baseline_tokens": sorted(base_tokens), "prep_tokens": sorted(prep_tokens),
            "token_count": "OK" if len(base_tokens | prep_tokens) == 1 else "MISMATCH",
            "token_bytes_identical": identical,
        }
        # Outputs are large; keep the scratch folder to the corpus and the logs.
        for (impl, t), (_, bins) in results.items():
            if impl == "baseline":
                bins[0].unlink(missing_ok=True)
            else:
                shutil.rmtree(scratch / f"prep-{name}-t{t}", ignore_errors=True)

    ratios = []
    for name in names:
        by = {(r["impl"], r["threads"]): r for r in runs if r["tokenizer"] == name}
        for t in threads:
            ratios.append({"tokenizer": name, "what": f"prep/baseline T={t}",
                           "speedup": round(by[("baseline", t)]["wall_s"] / by[("prep", t)]["wall_s"], 2)})
        if 1 in threads and 2 in threads:
            ratios.append({"tokenizer": name, "what": "prep T=2/T=1",
                           "speedup": round(by[("prep", 1)]["wall_s"] / by[("prep", 2)]["wall_s"], 2)})

    header = (f"{'tokenizer':16} {'impl':8} {'T':>2} {'wall s':>8} {'in MB/s':>8} "
              f"{'text MB/s':>9} {'Mtok/s':>7} {'RSS MB':>7}")
    print()
    print(header)
    print("-" * len(header))
    for r in runs:
        print(f"{r['tokenizer']:16} {r['impl']:8} {r['threads']:>2} {r['wall_s']:>8.2f} "
              f"{r['input_mb_s']:>8.2f} {r['text_mb_s']:>9.2f} "
              f"{r['tokens_per_s'] / 1e6:>7.3f} {r['peak_rss_mb']:>7.0f}")
    print()
    for r in ratios:
        print(f"{r['tokenizer']:16} {r['what']:22} {r['speedup']:.2f}x")
    print()
    for name, c in checks.items():
        print(f"{name:16} token count {c['token_count']} "
              f"(baseline {c['baseline_tokens']}, prep {c['prep_tokens']}); "
              f"token bytes identical: {'yes' if c['token_bytes_identical'] else 'NO'}")

    import tokenizers

    report = {
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform(),
                    "python": platform.python_version(),
                    "tokenizers": tokenizers.__version__,
                    "prep": tool_version([str(args.prep), "--version"])},
        "corpus": {"path": str(args.corpus), "limit_mb": args.limit_mb,
                   "jsonl_bytes": corpus_bytes, "text_bytes": text_bytes, "documents": n_docs},
        "runs": runs, "ratios": ratios, "checks": checks,
    }
    out = scratch / "tokenize.json"
    out.write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
    print(f"\nwrote {out}")
    ok = all(c["token_count"] == "OK" for c in checks.values())
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
