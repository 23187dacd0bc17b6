#!/usr/bin/env python3
"""The streaming benchmark: prep.StreamingDataset reading a packed dataset
from an S3 server, beside reading the same rows from local mmap and beside a
plain ranged-GET copy of the same bytes from the same server, in one run.

    make bench-stream
    # or, with the package installed in the venv (release: make bench-stream
    # builds and installs it):
    target/venv/bin/python tools/bench_stream.py --prep target/release/prep [--scratch target/bench]

The real corpus (debian-docs.jsonl.zst of the corpora directory: tools/corpora.py) tokenized with
GPT-2 (made once, as tools/bench_pack.py does), --copies times over (8: about
500 MB of tokens), is packed into rows of --seq-len 2048 tokens in 64 MiB
shards, once, and uploaded to a moto S3 server started here on 127.0.0.1.
The stream reads blocks of 4 MiB, 8 streams, windows of 2 blocks, through a
cache limited to 160 MiB (a third of the dataset). Then, in one process each:

1. local: the rows in the stream's order for one rank of one, from
   prep.Dataset (the mapped local copy): rows/s and MB/s;
2. ranged-GET copy: every shard's bytes with ranged GETs of --block-bytes,
   --in-flight at once (boto3, threads), into memory: what the server
   delivers, the stream's ceiling;
3. stream: prep.StreamingDataset over s3:// with an empty cache_dir under
   --cache-limit: rows/s, MB/s, the time to the first row, and the cache
   directory's peak size (sampled every 10 ms);
4. the same stream over the local directory: the reader's own ceiling
   (fetch, checks, cache, maps) without a network, a row a call and then
   batched=True (32 rows a call), each against the local mmap loop of 1;
5. prep.PackedDataset over the local directory: the same order, the rows
   read in place from the mapped shards (int64 tensors), against the same
   loop.

The ratios stream/copy and stream/local close the report; the results also
go to target/bench/stream.json.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import os
import platform
import shutil
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests" / "python"))

from bench_pack import CORPORA, REPO, copies_of, sh, tokenized_corpus  # noqa: E402

import prep  # noqa: E402  (the installed package: the extension module is in the wheel)
from test_s3 import Server, store_env, upload_dir  # noqa: E402
from test_stream import dir_bytes  # noqa: E402


def peak_bytes(path: Path, stop: threading.Event, out: list[int]) -> None:
    """The cache directory's largest size while the stream runs, sampled
    every 10 ms as the tests sample it (under its budget lock)."""
    peak = 0
    while not stop.is_set():
        peak = max(peak, dir_bytes(path))
        time.sleep(0.01)
    out.append(peak)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--prep", type=Path, default=REPO / "target" / "release" / "prep")
    ap.add_argument("--scratch", type=Path, default=REPO / "target" / "bench")
    ap.add_argument("--seq-len", type=int, default=2048)
    ap.add_argument("--copies", type=int, default=8,
                    help="copies of the tokenized corpus in the dataset (8: about 500 MB)")
    ap.add_argument("--block-bytes", type=int, default=4 << 20)
    ap.add_argument("--window", type=int, default=2)
    ap.add_argument("--streams", type=int, default=8)
    ap.add_argument("--in-flight", type=int, default=4)
    ap.add_argument("--cache-limit", default="160MiB")
    args = ap.parse_args()
    scratch = args.scratch
    scratch.mkdir(parents=True, exist_ok=True)
    docs = tokenized_corpus(args.prep, scratch, CORPORA / "debian-docs.jsonl.zst",
                            REPO / "fixtures" / "tokenizers" / "gpt2.tokenizer.json.zst")
    packed = scratch / f"stream-packed-{args.seq_len}-x{args.copies}"
    if not (packed / "manifest.json").is_file() or "sum" not in json.loads(
            (packed / "manifest.json").read_text())["shards"][0]:
        shutil.rmtree(packed, ignore_errors=True)
        # The copies are made only to be packed, and removed after.
        source = copies_of(docs, scratch / f"stream-docs-x{args.copies}", args.copies) if args.copies > 1 else docs
        sh(args.prep, "pack", source, packed, "--seq-len", args.seq_len, "--shard-size", "64MiB", "--quiet")
        if source != docs:
            shutil.rmtree(source)
    size = sum(p.stat().st_size for p in packed.glob("*.bin"))

    server = Server()
    try:
        client = server.client()
        client.create_bucket(Bucket="bench")
        upload_dir(client, "bench", packed, "packed")
        os.environ.update({k: v for k, v in store_env(server.url).items() if k.startswith("AWS_")})
        report = {"machine": platform.machine(), "cpus": os.cpu_count(), "dataset_bytes": size,
                  "seq_len": args.seq_len, "block_bytes": args.block_bytes, "window": args.window,
                  "streams": args.streams, "in_flight": args.in_flight}
        params = dict(seed=1, block_bytes=args.block_bytes, window=args.window, streams=args.streams,
                      in_flight=args.in_flight)

        ds = prep.Dataset(packed)
        probe = prep.StreamingDataset("s3://bench/packed", cache_dir=scratch / "stream-probe",
                                      cache_limit=args.cache_limit, **params)
        order = probe.indices()
        t = time.perf_counter()
        for i in order.tolist():
            ds[i].copy()
        local = time.perf_counter() - t
        report["local"] = {"rows_per_s": len(order) / local, "mb_per_s": size / local / 1e6}

        bins = sorted(p.name for p in packed.glob("*.bin"))
        ranges = [(b, at, min(at + args.block_bytes, (packed / b).stat().st_size))
                  for b in bins for at in range(0, (packed / b).stat().st_size, args.block_bytes)]

        def get(r):
            name, start, end = r
            return len(client.get_object(Bucket="bench", Key=f"packed/{name}",
                                         Range=f"bytes={start}-{end - 1}")["Body"].read())

        t = time.perf_counter()
        with concurrent.futures.ThreadPoolExecutor(args.in_flight) as pool:
            copied = sum(pool.map(get, ranges))
        copy = time.perf_counter() - t
        assert copied == size
        report["ranged_get_copy"] = {"mb_per_s": size / copy / 1e6, "seconds": copy}

        cache = scratch / "stream-cache"
        shutil.rmtree(cache, ignore_errors=True)
        stop, peak = threading.Event(), []
        sampler = threading.Thread(target=peak_bytes, args=(cache, stop, peak))
        sampler.start()
        t = time.perf_counter()
        d = prep.StreamingDataset("s3://bench/packed", cache_dir=cache, cache_limit=args.cache_limit, **params)
        first, rows = None, 0
        for _ in d:
            if first is None:
                first = time.perf_counter() - t
            rows += 1
        stream = time.perf_counter() - t
        stop.set()
        sampler.join()
        report["stream"] = {"rows_per_s": rows / stream, "mb_per_s": size / stream / 1e6,
                            "first_row_s": first, "peak_cache_bytes": peak[0], "cache_need": d.cache_need,
                            "cache_limit": prep.streaming.parse_size(args.cache_limit)}
        report["stream_over_copy"] = report["ranged_get_copy"]["seconds"] / stream
        report["stream_over_local"] = local / stream

        # The reader's own ceiling: the same stream from the local directory
        # (reads, checks, cache writes and maps, but no network).
        cache = scratch / "stream-cache-local"
        shutil.rmtree(cache, ignore_errors=True)
        t = time.perf_counter()
        d = prep.StreamingDataset(str(packed), cache_dir=cache, cache_limit=args.cache_limit, **params)
        rows = sum(1 for _ in d)
        from_dir = time.perf_counter() - t
        report["stream_from_local_dir"] = {"rows_per_s": rows / from_dir, "mb_per_s": size / from_dir / 1e6,
                                           "over_local_mmap": local / from_dir}
        shutil.rmtree(cache, ignore_errors=True)
        # The same, a batch of 32 rows a call (batched=True): one crossing
        # into Python a batch rather than a row.
        t = time.perf_counter()
        d = prep.StreamingDataset(str(packed), cache_dir=cache, cache_limit=args.cache_limit, batch_size=32,
                                  batched=True, **params)
        rows = sum(len(b) for b in d)
        from_dir = time.perf_counter() - t
        report["stream_from_local_dir_batched"] = {"rows_per_s": rows / from_dir,
                                                   "mb_per_s": size / from_dir / 1e6,
                                                   "over_local_mmap": local / from_dir}
        shutil.rmtree(cache, ignore_errors=True)
        # The local dataset read in place in the same order (PackedDataset:
        # the mapped shards' rows at the order's indices, widened to int64
        # tensors), where torch is installed.
        if "PackedDataset" in prep.streaming.__all__:
            t = time.perf_counter()
            d = prep.PackedDataset(packed, cache_limit=args.cache_limit, **params)
            rows = sum(1 for _ in d)
            in_place = time.perf_counter() - t
            report["packed_dataset_in_place"] = {"rows_per_s": rows / in_place, "mb_per_s": size / in_place / 1e6,
                                                 "over_local_mmap": local / in_place}
    finally:
        server.stop()
    print(json.dumps(report, indent=1))
    (scratch / "stream.json").write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
