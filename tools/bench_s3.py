"""Tokenize throughput from a local S3 server beside the same run from local disk.

Starts moto's S3 server on a free 127.0.0.1 port, uploads the corpus (the
fixture corpus repeated to --mib MiB of JSONL, as one .jsonl.zst and one plain
.jsonl), then times `prep tokenize` on the local files and on the same
objects through s3://, checks that both wrote the same shards, and prints MB/s
of input for each. The server runs on this machine, so the difference is
prep's object-store path (ranged GETs, the HTTP stack, the server's own cost),
not a network's.

    python tools/bench_s3.py --prep target/release/prep
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

import zstandard

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests" / "python"))
from test_s3 import Server, corpus_lines, store_env  # noqa: E402

GPT2 = REPO / "fixtures" / "tokenizers" / "gpt2.tokenizer.json.zst"


def run(prep: str, inputs: list[str], out: Path, env: dict[str, str]) -> float:
    import subprocess

    shutil.rmtree(out, ignore_errors=True)
    start = time.perf_counter()
    proc = subprocess.run(
        [prep, "tokenize", "--tokenizer", str(GPT2), "--input", *inputs, "--output", str(out), "--quiet"],
        capture_output=True, text=True, env=env, check=False,
    )
    elapsed = time.perf_counter() - start
    if proc.returncode != 0:
        sys.exit(f"prep tokenize {inputs}: {proc.stderr}")
    return elapsed


def shards(ds: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(ds.iterdir()) if p.name.startswith("shard-")}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prep", required=True)
    parser.add_argument("--mib", type=int, default=64, help="MiB of JSONL per input file")
    parser.add_argument("--repeat", type=int, default=3, help="runs of each, the best is reported")
    args = parser.parse_args()

    lines = corpus_lines()
    block = b"\n".join(lines) + b"\n"
    with tempfile.TemporaryDirectory(prefix="bench-s3-") as tmp:
        tmp = Path(tmp)
        raw = block * max(1, (args.mib << 20) // len(block))
        inputs = tmp / "in"
        inputs.mkdir()
        (inputs / "plain.jsonl").write_bytes(raw)
        (inputs / "packed.jsonl.zst").write_bytes(zstandard.ZstdCompressor(level=3).compress(raw))
        server = Server()
        try:
            client = server.client()
            client.create_bucket(Bucket="bench")
            for path in sorted(inputs.iterdir()):
                client.upload_file(str(path), "bench", f"in/{path.name}")
            env = store_env(server.url)
            env.pop("PREP_STORE_CHUNK_BYTES")  # the default chunk size
            local_env = {k: v for k, v in os.environ.items()}
            print(f"input: {len(raw) / 1e6:.0f} MB of JSONL per file; best of {args.repeat}")
            print(f"{'input':<22} {'from':<6} {'seconds':>8} {'MB/s':>8}")
            for name in ("plain.jsonl", "packed.jsonl.zst"):
                size = (inputs / name).stat().st_size
                results = {}
                for where, spec, e in (
                    ("disk", str(inputs / name), local_env),
                    ("s3", f"s3://bench/in/{name}", env),
                ):
                    best = min(run(args.prep, [spec], tmp / f"out-{where}", e) for _ in range(args.repeat))
                    results[where] = shards(tmp / f"out-{where}")
                    print(f"{name:<22} {where:<6} {best:>8.2f} {len(raw) / 1e6 / best:>8.1f}"
                          f"   ({size / 1e6:.0f} MB read)")
                if results["disk"] != results["s3"]:
                    sys.exit(f"{name}: the shards from s3 differ from those from disk")
        finally:
            server.stop()
    print("shards from s3 equal those from disk")


if __name__ == "__main__":
    main()
