#!/usr/bin/env python3
"""The validate benchmark: `prep validate` throughput from page cache, beside
`cat FILES > /dev/null` and an XXH3-64 of the same bytes, in one run.

    cargo build --release
    target/venv/bin/python tools/bench_validate.py [--gib 1] [--prep target/release/prep]

It writes a synthetic valid dataset (uint16, random ids below a GPT-2-sized
vocabulary, records of 1 to 8,192 tokens ending in eos, 256 MiB shards) to a
scratch folder, reads it once to warm the page cache, then times each
command (best of --repeat). Reported: MB/s (10^6 bytes) of dataset files per
second, and the ratios of prep validate to cat and to XXH3 at equal cores.
Results also go to target/bench/validate.json.
"""

from __future__ import annotations

import argparse
import json
import mmap
import os
import subprocess
import time
from pathlib import Path

import numpy as np
import xxhash

REPO = Path(__file__).resolve().parent.parent
VOCAB = 50257
EOS = 50256
SHARD_TOKENS = 128 << 20  # 256 MiB of uint16
CHUNK = 1 << 20  # bytes of the .bin per checksum in a .sum, as prep writes it


def xxh3_file(path: Path) -> str:
    with open(path, "rb") as f:
        if os.fstat(f.fileno()).st_size == 0:
            return f"{xxhash.xxh3_64_intdigest(b''):016x}"
        with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as m:
            return f"{xxhash.xxh3_64_intdigest(m):016x}"


def write_sums(bin_path: Path, sum_path: Path) -> None:
    """The .sum of a .bin (crates/reader/src/format/FORMAT.md): header, then each 1 MiB chunk's XXH3-64."""
    data = bin_path.read_bytes()
    sums = [xxhash.xxh3_64_intdigest(data[i:i + CHUNK]) for i in range(0, len(data), CHUNK)]
    header = b"PREPSUM\0" + (1).to_bytes(4, "little") + bytes(4)
    header += CHUNK.to_bytes(8, "little") + len(sums).to_bytes(8, "little")
    sum_path.write_bytes(header + b"".join(s.to_bytes(8, "little") for s in sums))


def make_dataset(out: Path, gib: float, dtype: str = "uint16", lengths: tuple[int, int] = (1, 8192),
                 vocab: int = VOCAB, eos: int = EOS) -> list[Path]:
    """A synthetic valid dataset of about `gib` GiB of tokens in `out` (kept, and reused when there):
    random ids below `eos`, records of `lengths` tokens (uniform, both ends included) ending in eos,
    256 MiB shards. Returns its shard files."""
    out.mkdir(parents=True, exist_ok=True)
    if (out / "manifest.json").exists():
        m = json.loads((out / "manifest.json").read_text())
        return [out / s[k] for s in m["shards"] for k in ("bin", "idx", "sum") if k in s]
    rng = np.random.default_rng(7)
    size = {"uint16": 2, "uint32": 4}[dtype]
    total = int(gib * (1 << 30) / size)
    shard_tokens = SHARD_TOKENS * 2 // size
    lo, hi = lengths
    shards, files = [], []
    written = 0
    while written < total:
        n = min(shard_tokens, total - written)
        tokens = rng.integers(0, eos, size=n, dtype=np.dtype(dtype))
        lens = rng.integers(lo, hi + 1, size=n // (lo if lo > 1 else 1000) + 2)
        ends = np.cumsum(lens)
        ends = ends[ends < n]
        offsets = np.concatenate([[0], ends, [n]]).astype("<u8")
        tokens[offsets[1:] - 1] = eos
        name = f"shard-{len(shards):05d}"
        bin_path, idx_path = out / f"{name}.bin", out / f"{name}.idx"
        tokens.astype(f"<u{size}").tofile(bin_path)
        header = b"PREPIDX\0" + (1).to_bytes(4, "little") + bytes([size, 0, 0, 0])
        header += (len(offsets) - 1).to_bytes(8, "little") + n.to_bytes(8, "little")
        idx_path.write_bytes(header + offsets.tobytes())
        sum_path = out / f"{name}.sum"
        write_sums(bin_path, sum_path)
        shards.append({
            "bin": bin_path.name, "idx": idx_path.name, "n_records": len(offsets) - 1, "n_tokens": n,
            "bin_bytes": bin_path.stat().st_size, "idx_bytes": idx_path.stat().st_size,
            "bin_xxh3": xxh3_file(bin_path), "idx_xxh3": xxh3_file(idx_path),
            "sum": sum_path.name, "sum_bytes": sum_path.stat().st_size, "sum_xxh3": xxh3_file(sum_path),
        })
        files += [bin_path, idx_path, sum_path]
        written += n
    manifest = {
        "format": "prep", "version": 1, "kind": "documents", "dtype": dtype, "vocab_size": vocab,
        "n_records": sum(s["n_records"] for s in shards), "n_tokens": sum(s["n_tokens"] for s in shards),
        "special_tokens": {"bos": None, "eos": eos, "pad": None}, "bos_prepended": False, "eos_appended": True,
        "tokenizer": {"file": None, "xxh3": "0000000000000000"}, "shards": shards,
        "provenance": {"prep_version": "bench", "command": "bench_validate", "created": "2026-01-01T00:00:00Z",
                       "inputs": [], "options": {}, "fingerprint": "0000000000000000",
                       "documents": {"read": 0, "written": 0, "skipped": 0, "deduplicated": 0, "empty": 0}},
    }
    (out / "manifest.json").write_text(json.dumps(manifest, indent=2))
    return files


def best_of(repeat: int, fn) -> float:
    times = []
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return min(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--prep", type=Path, default=REPO / "target" / "release" / "prep")
    ap.add_argument("--scratch", type=Path, default=REPO / "target" / "bench")
    ap.add_argument("--gib", type=float, default=1.0, help="dataset size in GiB")
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    ds = args.scratch / f"validate-{args.gib:g}GiB"
    files = make_dataset(ds, args.gib)
    nbytes = sum(f.stat().st_size for f in files)
    subprocess.run(["cat", *map(str, files)], stdout=subprocess.DEVNULL, check=True)  # warm the page cache

    def run_prep(*flags: str) -> None:
        r = subprocess.run([str(args.prep), "validate", *flags, str(ds)], capture_output=True, text=True)
        if r.returncode != 0:
            raise SystemExit(f"prep validate failed ({r.returncode}):\n{r.stdout}{r.stderr}")

    rows = [
        ("cat FILES > /dev/null", 1, lambda: subprocess.run(["cat", *map(str, files)], stdout=subprocess.DEVNULL, check=True)),
        ("xxh3 of the same bytes", 1, lambda: [xxh3_file(f) for f in files]),
        ("prep validate --threads 1", 1, lambda: run_prep("--threads", "1")),
        ("prep validate --threads 2", 2, lambda: run_prep("--threads", "2")),
        ("prep validate --quick --threads 1", 1, lambda: run_prep("--quick", "--threads", "1")),
    ]
    results = []
    print(f"dataset {ds}: {nbytes / 1e6:.0f} MB in {len(files) // 2} shards, from page cache, best of {args.repeat}")
    for name, cores, fn in rows:
        secs = best_of(args.repeat, fn)
        mbs = nbytes / 1e6 / secs
        results.append({"what": name, "cores": cores, "seconds": round(secs, 3), "mb_s": round(mbs, 1),
                         "mb_s_per_core": round(mbs / cores, 1)})
        print(f"  {name:<36} {secs:7.3f} s  {mbs:8.0f} MB/s  ({mbs / cores:.0f} MB/s per core)")
    by = {r["what"]: r["mb_s"] for r in results}
    ratios = {
        "validate_1t / cat": round(by["prep validate --threads 1"] / by["cat FILES > /dev/null"], 2),
        "validate_1t / xxh3": round(by["prep validate --threads 1"] / by["xxh3 of the same bytes"], 2),
        "validate_2t / validate_1t": round(by["prep validate --threads 2"] / by["prep validate --threads 1"], 2),
    }
    for k, v in ratios.items():
        print(f"  {k}: {v}")
    out = args.scratch / "validate.json"
    out.write_text(json.dumps({"bytes": nbytes, "results": results, "ratios": ratios}, indent=1))
    print(f"results in {out}")


if __name__ == "__main__":
    main()
