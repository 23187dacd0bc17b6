"""prep's throughput with a local S3 server beside the same runs on local disk.

Starts moto's S3 server on a free 127.0.0.1 port, uploads the corpus (the
fixture corpus repeated to --mib MiB of JSONL, as one .jsonl.zst and one plain
.jsonl), then times, each as a whole process, best of --repeat:

  reading   `prep tokenize` of the local files and of the same objects
            through s3://, into a local dataset;
  writing   the pipeline tokenize -> shuffle -> pack, once on disk and once
            bucket to bucket (tokenize reads the local plain file and writes
            s3://; shuffle and pack read and write the bucket), then
            `prep validate` of the packed dataset in place and `prep fetch`
            of it;

checks that each s3 run wrote the shards of its disk twin, byte for byte,
and prints MB/s (the stage's input bytes: JSONL for tokenize, token and
index bytes of the dataset read for the others) with the ratio s3 / disk.
The server runs on this machine, so the difference is prep's object-store
path (ranged GETs, uploads, the staging copy, the HTTP stack, the server's
own cost), not a network's.

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


def timed(prep: str, args: list[str], env: dict[str, str]) -> float:
    import subprocess

    start = time.perf_counter()
    proc = subprocess.run([prep, *args], capture_output=True, text=True, env=env, check=False)
    elapsed = time.perf_counter() - start
    if proc.returncode != 0:
        sys.exit(f"prep {' '.join(args)}: {proc.stderr}")
    return elapsed


def dataset_bytes(ds: Path) -> int:
    return sum(p.stat().st_size for p in ds.iterdir() if p.name.startswith("shard-"))


def writing(prep: str, plain: Path, tmp: Path, env: dict[str, str], local_env: dict[str, str],
            repeat: int) -> None:
    """The pipeline on disk, then bucket to bucket; validate and fetch of the result."""
    disk = tmp / "disk"
    gpt2 = ["--tokenizer", str(GPT2)]
    steps = [
        ("tokenize", lambda root, src: ["tokenize", *gpt2, "--input", str(plain), "--output", f"{root}/ds",
                                        "--shard-size", "64MiB", "--overwrite", "--quiet"]),
        ("shuffle", lambda root, src: ["shuffle", f"{root}/ds", f"{root}/sh", "--seed", "1", "--shard-size",
                                       "64MiB", "--overwrite", "--quiet"]),
        ("pack", lambda root, src: ["pack", f"{root}/sh", f"{root}/pk", "--seq-len", "2049", "--overwrite",
                                    "--quiet"]),
        ("validate", lambda root, src: ["validate", f"{root}/pk"]),
    ]
    print(f"\n{'stage':<10} {'disk s':>8} {'disk MB/s':>10} {'s3 s':>8} {'s3 MB/s':>8} {'s3/disk':>8}")
    for name, args in steps:
        best = {}
        for where, root, e in (("disk", str(disk), local_env), ("s3", "s3://bench/pipe", env)):
            best[where] = min(timed(prep, args(root, where), e) for _ in range(repeat))
        size = plain.stat().st_size if name == "tokenize" else dataset_bytes(
            disk / {"shuffle": "ds", "pack": "sh", "validate": "pk"}[name])
        d, s3 = size / 1e6 / best["disk"], size / 1e6 / best["s3"]
        print(f"{name:<10} {best['disk']:>8.2f} {d:>10.1f} {best['s3']:>8.2f} {s3:>8.1f} {s3 / d:>8.2f}")
    fetched = tmp / "fetched"
    best = []
    for _ in range(repeat):
        shutil.rmtree(fetched, ignore_errors=True)
        best.append(timed(prep, ["fetch", "s3://bench/pipe/pk", str(fetched)], env))
    size = dataset_bytes(disk / "pk")
    print(f"{'fetch':<10} {'':>8} {'':>10} {min(best):>8.2f} {size / 1e6 / min(best):>8.1f}")
    for stage in ("ds", "sh", "pk"):
        got = tmp / f"got-{stage}"
        shutil.rmtree(got, ignore_errors=True)
        timed(prep, ["fetch", f"s3://bench/pipe/{stage}", str(got)], env)
        if shards(got) != shards(disk / stage):
            sys.exit(f"{stage}: the shards written to s3 differ from those written to disk")
    print("datasets written to s3 equal those written to disk")


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
            env["PREP_STAGING_DIR"] = str(tmp / "staging")
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
            print("shards from s3 equal those from disk")
            writing(args.prep, inputs / "plain.jsonl", tmp, env, local_env, args.repeat)
        finally:
            server.stop()


if __name__ == "__main__":
    main()
