#!/usr/bin/env python3
"""prep's streaming reader beside the readers users would pick instead:
Mosaic `streaming` (mosaicml-streaming), LitData and WebDataset, on the same
rows in the same local S3 server (moto) at the same cache limit.

    make bench-stream-peers
    # or, with target/venv-peers made and prep's release wheel installed in it:
    target/venv-peers/bin/python tools/bench_stream_peers.py [--quick] [--copies N] [--peers prep,mosaic,...]

The data is bench_stream.py's: the real corpus (tools/corpora.py) tokenized
with GPT-2 (once, as tools/bench_pack.py does), --copies times over, packed
into rows of 2048 uint16 tokens (4 KiB a row) in 64 MiB shards; --copies 4
is about 250 MB, --quick (1 copy) about 60 MB. It is converted once for
each peer into its own format, each shard of about --shard-bytes (default:
the cache limit / 6, at most 16 MiB, since Mosaic refuses a cache limit under
four shards), every row stored with its dataset index: MDS shards
(streaming.MDSWriter: columns index int64 and tokens ndarray:uint16:2048),
LitData chunks (litdata.optimize), WebDataset tars (webdataset.ShardWriter:
key the index, the row as raw bytes). Each format goes to its own prefix of
one moto server started here; the local copies are deleted once uploaded.

For each reader, the cache limit is a third of the dataset where it has one
(prep: cache_limit; Mosaic: cache_limit; LitData: max_cache_size;
WebDataset has none by default: it streams each tar over HTTP, and the
`webdataset+cache` row is its optional whole-shard file cache with
cache_size set to the limit). Two more rows: `loader-only`, the same
DataLoader over rows made in memory (its own ceiling on this machine), and
`litdata+big`, LitData with a cache twice the dataset (its distributed
reading and resume apart from its limit). Every measurement is a fresh process (or a
group of them, one per simulated rank, with a gloo process group on
127.0.0.1 and torchrun's variables RANK, WORLD_SIZE, LOCAL_RANK,
LOCAL_WORLD_SIZE, plus LitData's GLOBAL_RANK and NNODES), with an empty
cache directory shared by the ranks (one node), under --timeout:

1. epoch: one rank reads the whole epoch through a torch DataLoader
   (num_workers 2, batch_size 8; each peer's own loader where it has one):
   rows/s, MB/s, the time to the first batch, and the cache directory's peak
   size sampled every 10 ms, against the limit;
2. 2 ranks: every row's dataset index over 2 ranks read at once, checked to
   appear exactly once (duplicates and missing counted);
3. resume 2 -> 3: 2 ranks read a third of the epoch, the peer's state_dict
   is taken (rank 0's), then 3 ranks load it and read the rest; the union
   is checked the same way. A peer without such a state says so.

The table closes the run; the results also go to target/bench/stream-peers.json.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests" / "python"))

from bench_pack import CORPORA, REPO, copies_of, sh, tokenized_corpus  # noqa: E402
from test_s3 import Server, free_port, store_env, upload_dir  # noqa: E402
from test_stream import dir_bytes  # noqa: E402

BUCKET = "bench"
PEERS = ("loader-only", "prep", "mosaic", "litdata", "litdata+big", "webdataset", "webdataset+cache")
BATCH, WORKERS, SEED = 8, 2, 1


# -- the data ----------------------------------------------------------------

def packed_dataset(prep_bin: Path, scratch: Path, work: Path, copies: int, seq_len: int) -> Path:
    """bench_stream.py's dataset (--copies copies of the tokenized corpus packed
    into rows of seq_len in 64 MiB shards), made once in work/."""
    docs = tokenized_corpus(prep_bin, scratch, CORPORA / "debian-docs.jsonl.zst",
                            REPO / "fixtures" / "tokenizers" / "gpt2.tokenizer.json.zst")
    packed = work / f"packed-{seq_len}-x{copies}"
    if not (packed / "manifest.json").is_file():
        shutil.rmtree(packed, ignore_errors=True)
        source = copies_of(docs, work / f"docs-x{copies}", copies) if copies > 1 else docs
        sh(prep_bin, "pack", source, packed, "--seq-len", seq_len, "--shard-size", "64MiB", "--quiet")
        if source != docs:
            shutil.rmtree(source)
    return packed


def rows_of(packed: Path, start: int = 0, end: int | None = None):
    import prep

    ds = prep.Dataset(packed)
    for i in range(start, len(ds) if end is None else end):
        yield i, ds[i]


def write_mds(packed: Path, out: Path, shard_bytes: int, seq_len: int) -> None:
    from streaming import MDSWriter

    columns = {"index": "int64", "tokens": f"ndarray:uint16:{seq_len}"}
    with MDSWriter(out=str(out), columns=columns, size_limit=shard_bytes) as w:
        for i, row in rows_of(packed):
            w.write({"index": i, "tokens": row})


def _litdata_rows(span):  # litdata.optimize's fn: a generator of the span's rows
    packed, start, end = span
    for i, row in rows_of(Path(packed), start, end):
        yield {"index": i, "tokens": row.copy()}


def write_litdata(packed: Path, out: Path, shard_bytes: int, n: int) -> None:
    import litdata

    spans = [(str(packed), s, min(s + 4096, n)) for s in range(0, n, 4096)]
    litdata.optimize(fn=_litdata_rows, inputs=spans, output_dir=str(out), chunk_bytes=shard_bytes,
                     num_workers=1, keep_data_ordered=True, verbose=False)


def write_wds(packed: Path, out: Path, shard_bytes: int) -> None:
    import webdataset as wds

    out.mkdir(parents=True)
    with wds.ShardWriter(str(out / "shard-%06d.tar"), maxsize=shard_bytes, maxcount=1 << 30, verbose=0) as w:
        for i, row in rows_of(packed):
            w.write({"__key__": f"{i:09d}", "tokens.bin": row.tobytes()})


# -- a reader, in a child process --------------------------------------------

def tree_bytes(path: Path) -> int:
    total = 0
    for root, _, files in os.walk(path):
        for f in files:
            try:
                total += os.lstat(os.path.join(root, f)).st_size
            except FileNotFoundError:
                pass
    return total


class Peak:
    """The largest size of a directory while it runs, sampled every 10 ms (as
    bench_stream.peak_bytes does; prep's cache is counted under its budget
    lock with test_stream.dir_bytes, the others by walking it)."""

    def __init__(self, path: Path, sizer) -> None:
        self.path, self.sizer, self.peak = path, sizer, 0
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self.run, daemon=True)
        self.thread.start()

    def run(self) -> None:
        while not self.stop.is_set():
            self.peak = max(self.peak, self.sizer(self.path))
            time.sleep(0.01)

    def done(self) -> int:
        self.stop.set()
        self.thread.join()
        return self.peak


def child(cfg: dict) -> None:
    """One rank of one measurement: cfg says which peer, which mode (epoch,
    ranks, resume-a, resume-b), where the data and the cache are. Writes the
    indices it read (.npy) and a JSON result under cfg["out"]."""
    import numpy as np
    import torch

    peer, mode, rank, world = cfg["peer"], cfg["mode"], cfg["rank"], cfg["world"]
    out = Path(cfg["out"])
    if world > 1:
        import torch.distributed as dist

        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{cfg['port']}", rank=rank,
                                world_size=world)
    t0 = time.perf_counter()
    cache, limit = cfg["cache"], cfg["limit"]
    state = json.loads(Path(cfg["state"]).read_text()) if mode == "resume-b" else None
    info: dict = {}

    if peer == "prep":
        import prep

        ds = prep.StreamingDataset(cfg["urls"]["prep"], cache_dir=cache, cache_limit=limit, seed=SEED,
                                   batch_size=BATCH, indices=True)
        if state is not None:
            ds.load_state_dict(state)
        info["plan"] = ds.plan
        info["cache_need"] = ds.cache_need
        loader = torch.utils.data.DataLoader(ds, batch_size=BATCH, num_workers=WORKERS)
        unpack = lambda b: b[0]  # noqa: E731
        take_state = lambda k: ds.state_dict(batches=k)  # noqa: E731
    elif peer == "mosaic":
        from streaming import StreamingDataLoader, StreamingDataset

        ds = StreamingDataset(remote=cfg["urls"]["mosaic"], local=cache, cache_limit=limit, batch_size=BATCH,
                              shuffle=True, shuffle_seed=SEED, **cfg["mosaic"])
        loader = StreamingDataLoader(ds, batch_size=BATCH, num_workers=WORKERS)
        if state is not None:
            loader.load_state_dict(state)
        unpack = lambda b: b["index"]  # noqa: E731
        take_state = lambda k: loader.state_dict()  # noqa: E731
    elif peer.startswith("litdata"):
        import litdata
        from litdata.streaming import downloader

        # LitData's default download path (async, through obstore) builds its
        # S3 client without allow_http, so it cannot reach a plain-http
        # endpoint (reqwest's BadScheme) and every chunk wait times out. One
        # entry in its client options lets that same path run here, as it
        # would against S3 over https; the forked DataLoader workers inherit it.
        downloader._OBSTORE_CLIENT_OPTIONS["allow_http"] = "true"
        ds = litdata.StreamingDataset(cfg["urls"]["litdata"], cache_dir=cache, shuffle=True, seed=SEED,
                                      max_cache_size=limit)
        loader = litdata.StreamingDataLoader(ds, batch_size=BATCH, num_workers=WORKERS)
        if state is not None:
            loader.load_state_dict(state)
        unpack = lambda b: b["index"]  # noqa: E731
        take_state = lambda k: loader.state_dict()  # noqa: E731
    elif peer.startswith("webdataset"):
        import webdataset as wds

        extra = {"cache_dir": cache, "cache_size": limit} if peer == "webdataset+cache" else {}
        ds = (wds.WebDataset(cfg["urls"]["webdataset"], shardshuffle=100, seed=SEED, nodesplitter=wds.split_by_node,
                             workersplitter=wds.split_by_worker, empty_check=False, **extra)
              .shuffle(1000, seed=SEED)
              .map(lambda s: (int(s["__key__"]), np.frombuffer(s["tokens.bin"], dtype="<u2"))))
        loader = torch.utils.data.DataLoader(ds, batch_size=BATCH, num_workers=WORKERS)
        unpack = lambda b: b[0]  # noqa: E731
        take_state = None
        if state is not None:
            raise RuntimeError("webdataset has no state_dict to resume from")
    elif peer == "loader-only":
        n, seq_len = cfg["rows"], cfg["seq_len"]

        class Rows(torch.utils.data.IterableDataset):  # no I/O: the DataLoader's own ceiling
            def __iter__(self):
                info = torch.utils.data.get_worker_info()
                w, k = (info.id, info.num_workers) if info else (0, 1)
                row = np.zeros(seq_len, np.uint16)
                for i in range(w * BATCH, n, k * BATCH):
                    for j in range(i, min(i + BATCH, n)):
                        yield j, row.copy()

        loader = torch.utils.data.DataLoader(Rows(), batch_size=BATCH, num_workers=WORKERS)
        unpack = lambda b: b[0]  # noqa: E731
        take_state = None
    else:
        raise ValueError(peer)

    stop_after = cfg.get("batches")  # resume-a: this many batches, then the state
    got, first, batches = [], None, 0
    for batch in loader:
        if first is None:
            first = time.perf_counter() - t0
        got.append(np.asarray(unpack(batch), dtype=np.int64).reshape(-1))
        batches += 1
        if stop_after is not None and batches >= stop_after:
            break
    seconds = time.perf_counter() - t0
    indices = np.concatenate(got) if got else np.zeros(0, np.int64)
    np.save(out / f"{mode}-r{rank}.npy", indices)
    info.update(rows=int(len(indices)), seconds=seconds, first_batch_s=first, batches=batches)
    if mode == "resume-a" and rank == 0:
        (out / "state.json").write_text(json.dumps(take_state(batches), default=int))
    (out / f"{mode}-r{rank}.json").write_text(json.dumps(info, default=str))
    sys.stdout.flush()
    # Mosaic's and LitData's loaders can block at exit on their own
    # workers; the results are written, so leave without waiting for them.
    os._exit(0)


# -- the driver ----------------------------------------------------------------

def run_group(cfg: dict, world: int, mode: str, out: Path, timeout: float, sizer, env: dict,
              extra: dict | None = None) -> dict:
    """`world` ranks of one measurement at once, each a fresh process; the
    shared cache directory's peak sampled meanwhile. Returns each rank's
    result, or why there is none."""
    out.mkdir(parents=True, exist_ok=True)
    port = free_port()
    procs = []
    peak = Peak(Path(cfg["cache"]), sizer)
    t = time.perf_counter()
    for rank in range(world):
        c = {**cfg, **(extra or {}), "mode": mode, "rank": rank, "world": world, "port": port, "out": str(out)}
        e = {**env, "RANK": str(rank), "WORLD_SIZE": str(world), "LOCAL_RANK": str(rank),
             "LOCAL_WORLD_SIZE": str(world), "GLOBAL_RANK": str(rank), "NNODES": "1",
             "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}
        log = open(out / f"{mode}-r{rank}.log", "w")
        procs.append(subprocess.Popen([sys.executable, __file__, "--child", json.dumps(c)], env=e,
                                      stdout=log, stderr=subprocess.STDOUT, start_new_session=True))
    timed_out = False
    for p in procs:
        try:
            p.wait(timeout=max(0.1, timeout - (time.perf_counter() - t)))
        except subprocess.TimeoutExpired:
            timed_out = True
            break
    if timed_out:
        for p in procs:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()
    wall = time.perf_counter() - t
    result: dict = {"wall_s": wall, "peak_cache_bytes": peak.done()}
    if timed_out:
        result["error"] = f"timed out after {timeout:.0f} s"
    ranks = []
    for rank, p in enumerate(procs):
        f = out / f"{mode}-r{rank}.json"
        if f.is_file():
            ranks.append(json.loads(f.read_text()))
        else:
            ranks.append(None)
            if "error" not in result:
                result["error"] = f"rank {rank} exited {p.returncode}: {why(out / f'{mode}-r{rank}.log')}"
    result["ranks"] = ranks
    return result


def why(log: Path) -> str:
    """The last exception a child's log names, else its last lines."""
    lines = [x.strip() for x in log.read_text(errors="replace").splitlines() if x.strip()]
    errors = [x for x in lines if re.match(r"^(\[rank\d+\]: )?[\w.]+(Error|Exception|Interrupt)\b", x)]
    return errors[-1][:400] if errors else " | ".join(lines[-4:])[:400]


def indices_of(out: Path, mode: str, world: int):
    import numpy as np

    parts = [out / f"{mode}-r{r}.npy" for r in range(world)]
    return [np.load(p) for p in parts if p.is_file()]


def exactly_once(parts, n: int, start: int = 0, world: int = 1) -> dict:
    """Every index of the n rows once? Counts duplicates and missing ones,
    and says where they are what evening out `world` ranks over the n - start
    rows left costs: the remainder dropped, or the ranks padded with repeats."""
    import numpy as np

    allr = np.concatenate(parts) if parts else np.zeros(0, np.int64)
    counts = np.bincount(allr, minlength=n) if len(allr) else np.zeros(n, np.int64)
    dup, missing = int((counts[counts > 1] - 1).sum()), int((counts == 0).sum())
    rem = (n - start) % world
    res = {"rows_read": int(len(allr)), "per_rank": [int(len(p)) for p in parts],
           "distinct": int((counts > 0).sum()), "duplicates": dup, "missing": missing,
           "exactly_once": dup == 0 and missing == 0}
    if rem and dup == 0 and missing == rem:
        res["note"] = f"the remainder ({rem} of {n - start}) dropped so that {world} ranks read the same count"
    elif rem and missing == 0 and dup == world - rem:
        res["note"] = f"{dup} repeated so that {world} ranks read the same count"
    if len(set(res["per_rank"][-world:])) > 1:  # the last phase's ranks
        res["note"] = (res.get("note", "") + "; " if "note" in res else "") + "ranks read unequal counts"
    return res


def measure(peer: str, base: dict, work: Path, n: int, row_bytes: int, timeout: float, env: dict,
            resume_fraction: float) -> dict:
    sizer = dir_bytes if peer == "prep" else tree_bytes
    runs = work / "runs" / peer.replace("+", "-")
    shutil.rmtree(runs, ignore_errors=True)
    res: dict = {}

    # litdata+big: LitData with a cache twice the dataset, to tell its
    # distributed reading and resume apart from its cache limit.
    limit = base["limit"] * 6 if peer == "litdata+big" else base["limit"]
    res["cache_limit"] = limit

    def fresh(name: str) -> dict:
        cache = work / "cache" / f"{peer.replace('+', '-')}-{name}"
        shutil.rmtree(cache, ignore_errors=True)
        if peer != "webdataset":
            cache.mkdir(parents=True)
        if peer == "mosaic":  # what a killed run left in /dev/shm would refuse the next
            from streaming.base.util import clean_stale_shared_memory

            clean_stale_shared_memory()
        return {**base, "peer": peer, "cache": str(cache), "limit": limit}

    # 1. One rank, the whole epoch.
    print(f"[{peer}] epoch on 1 rank ...", flush=True)
    g = run_group(fresh("epoch"), 1, "epoch", runs, timeout, sizer, env)
    r = g["ranks"][0]
    epoch = {"peak_cache_bytes": g["peak_cache_bytes"], "wall_s": g["wall_s"]}
    if r is not None:
        epoch.update(r)
        epoch.update(rows_per_s=r["rows"] / r["seconds"], mb_per_s=r["rows"] * row_bytes / r["seconds"] / 1e6,
                     **{"check": exactly_once(indices_of(runs, "epoch", 1), n)})
    if "error" in g:
        epoch["error"] = g["error"]
    res["epoch"] = epoch
    shutil.rmtree(work / "cache", ignore_errors=True)
    if peer == "loader-only":
        res["ranks2"] = res["resume"] = {"supported": False, "why": "no data: the DataLoader's ceiling only"}
        return res

    # 2. Two ranks at once, each index once?
    print(f"[{peer}] 2 ranks ...", flush=True)
    g = run_group(fresh("ranks"), 2, "ranks", runs, timeout, sizer, env)
    two = {"peak_cache_bytes": g["peak_cache_bytes"], "wall_s": g["wall_s"],
           **exactly_once(indices_of(runs, "ranks", 2), n, 0, 2)}
    if "error" in g:
        two["error"] = g["error"]
    res["ranks2"] = two
    shutil.rmtree(work / "cache", ignore_errors=True)

    # 3. Resume: a third of the epoch on 2 ranks, the rest on 3.
    if peer.startswith("webdataset"):
        res["resume"] = {"supported": False,
                         "why": "WebDataset has no state_dict: its pipeline (shard lists split by rank and "
                                "worker, a shuffle buffer) keeps no position; a resumed job restarts the epoch "
                                "or skips batches by count on the same world, and shards are dealt to ranks by "
                                "rank, so another world size reads other shards"}
        return res
    print(f"[{peer}] resume 2 -> 3 ranks ...", flush=True)
    per_rank_batches = n // 2 // BATCH
    k = max(1, int(per_rank_batches * resume_fraction))
    cfg = fresh("resume")
    a = run_group(cfg, 2, "resume-a", runs, timeout, sizer, env, {"batches": k})
    resume: dict = {"supported": True, "batches_per_rank_before": k,
                    "before": {"per_rank": [x and x["rows"] for x in a["ranks"]]}}
    if "error" in a or not (runs / "state.json").is_file():
        resume["error"] = a.get("error", "no state written")
        res["resume"] = resume
        return res
    resume["state"] = json.loads((runs / "state.json").read_text())
    b = run_group(cfg, 3, "resume-b", runs, timeout, sizer, env, {"state": str(runs / "state.json")})
    resume["after"] = {"per_rank": [x and x["rows"] for x in b["ranks"]]}
    if "error" in b:
        resume["error"] = b["error"]
    resume["peak_cache_bytes"] = max(a["peak_cache_bytes"], b["peak_cache_bytes"])
    before = sum(x["rows"] for x in a["ranks"])
    resume.update(exactly_once(indices_of(runs, "resume-a", 2) + indices_of(runs, "resume-b", 3), n, before, 3))
    res["resume"] = resume
    shutil.rmtree(work / "cache", ignore_errors=True)
    return res


def versions() -> dict:
    from importlib.metadata import PackageNotFoundError, version

    out = {}
    for name in ("prep-llm", "mosaicml-streaming", "litdata", "webdataset", "torch", "numpy", "moto", "boto3"):
        try:
            out[name] = version(name)
        except PackageNotFoundError:
            out[name] = None
    return out


def mb(x) -> str:
    return "-" if x is None else f"{x / 1e6:.0f}"


def short(error: str) -> str:
    """An error for the table: the exception's name and the start of its message."""
    m = re.search(r"(\w+(?:Error|Exception))\b:?\s*(.*)", error)
    return f"{m.group(1)}: {m.group(2)[:70]}" if m else error[:90]


def cell_once(d: dict) -> str:
    if d.get("supported") is False:
        return "-" if "ceiling" in d.get("why", "") else "not supported"
    if not d.get("rows_read"):
        return f"failed: {short(d.get('error', 'no rows'))}"
    s = "yes" if d["exactly_once"] else f"no: {d['duplicates']} repeated, {d['missing']} missing"
    if d.get("note"):
        s += f" ({d['note']})"
    s += f"; rows a rank {'/'.join(map(str, d['per_rank']))}"
    if d.get("error"):
        s += f"; {short(d['error'])}"
    return s


def table(report: dict) -> str:
    lines = ["| reader | rows/s | MB/s | first batch s | peak cache MB (limit) | 2 ranks: each row once | "
             "resume 2 -> 3 ranks: each row once |", "|---|---:|---:|---:|---:|---|---|"]
    for peer, r in report["peers"].items():
        limit = r.get("cache_limit", report["cache_limit"])
        e = r["epoch"]
        if "rows_per_s" in e:
            speed = f"{e['rows_per_s']:,.0f} | {e['mb_per_s']:.0f} | {e['first_batch_s']:.2f}"
        else:
            speed = f"failed: {short(e.get('error', ''))} | - | -"
        if peer == "loader-only":
            cache = "-"
        elif peer == "webdataset":
            cache = "no cache (streams)"
        else:
            cache = f"{mb(max(e['peak_cache_bytes'], r['ranks2'].get('peak_cache_bytes', 0)))} ({mb(limit)})"
        lines.append(f"| {peer} | {speed} | {cache} | {cell_once(r['ranks2'])} | {cell_once(r['resume'])} |")
    return "\n".join(lines)


def main() -> None:
    if len(sys.argv) == 3 and sys.argv[1] == "--child":
        child(json.loads(sys.argv[2]))
        return
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--prep", type=Path, default=REPO / "target" / "release" / "prep",
                    help="the prep binary that packs the dataset (the readers are the installed package)")
    ap.add_argument("--scratch", type=Path, default=REPO / "target" / "bench",
                    help="the tokenized corpus is read from here; the data and caches go to SCRATCH/peers")
    ap.add_argument("--copies", type=int, default=4, help="copies of the tokenized corpus (4: about 250 MB)")
    ap.add_argument("--quick", action="store_true", help="one copy (about 60 MB), a shorter timeout")
    ap.add_argument("--seq-len", type=int, default=2048)
    ap.add_argument("--shard-bytes", type=int, default=None,
                    help="the peers' shard size (default: the cache limit / 6, at most 16 MiB)")
    ap.add_argument("--timeout", type=float, default=None, help="seconds for each measurement (900; --quick 300)")
    ap.add_argument("--resume-fraction", type=float, default=1 / 3)
    ap.add_argument("--peers", default=",".join(PEERS), help=f"a comma-separated subset of {','.join(PEERS)}")
    ap.add_argument("--out", type=Path, default=None, help="the JSON report (default SCRATCH/stream-peers.json)")
    args = ap.parse_args()
    copies = 1 if args.quick else args.copies
    timeout = args.timeout or (300 if args.quick else 900)
    peers = [p for p in args.peers.split(",") if p]
    for p in peers:
        if p not in PEERS:
            ap.error(f"unknown reader {p}: one of {', '.join(PEERS)}")
    import prep

    work = args.scratch / "peers"
    work.mkdir(parents=True, exist_ok=True)
    packed = packed_dataset(args.prep, args.scratch, work, copies, args.seq_len)
    ds = prep.Dataset(packed)
    n, row_bytes = len(ds), args.seq_len * ds[0].dtype.itemsize
    size = sum(p.stat().st_size for p in packed.glob("*.bin"))
    limit = size // 3
    shard_bytes = args.shard_bytes or min(16 << 20, limit // 6)
    print(f"{packed}: {n} rows, {size / 1e6:.0f} MB; cache limit {limit / 1e6:.1f} MB; "
          f"peer shards {shard_bytes / 1e6:.1f} MB", flush=True)

    server = Server()
    try:
        client = server.client()
        client.create_bucket(Bucket=BUCKET)
        env = {**os.environ, **{k: v for k, v in store_env(server.url).items() if k.startswith("AWS_")},
               "S3_ENDPOINT_URL": server.url}  # Mosaic's variable for the endpoint
        os.environ.update(env)
        urls: dict = {}
        t = time.perf_counter()
        upload_dir(client, BUCKET, packed, "prep")
        urls["prep"] = f"s3://{BUCKET}/prep"
        conversions: dict = {"prep": {"upload_s": time.perf_counter() - t}}
        writers = {"mosaic": lambda o: write_mds(packed, o, shard_bytes, args.seq_len),
                   "litdata": lambda o: write_litdata(packed, o, shard_bytes, n),
                   "webdataset": lambda o: write_wds(packed, o, shard_bytes)}
        for peer in ("mosaic", "litdata", "webdataset"):
            if not any(p.split("+")[0] == peer for p in peers):
                continue
            local = work / f"fmt-{peer}"
            shutil.rmtree(local, ignore_errors=True)
            print(f"converting to {peer}'s format ...", flush=True)
            t = time.perf_counter()
            writers[peer](local)
            convert = time.perf_counter() - t
            files = [p for p in local.rglob("*") if p.is_file()]
            t = time.perf_counter()
            upload_dir(client, BUCKET, local, peer)
            conversions[peer] = {"convert_s": convert, "upload_s": time.perf_counter() - t, "files": len(files),
                                 "bytes": sum(p.stat().st_size for p in files)}
            if peer == "webdataset":
                # WebDataset opens http(s) URLs with curl: presigned GETs on the same server.
                urls[peer] = [client.generate_presigned_url("get_object", Params={"Bucket": BUCKET,
                              "Key": f"{peer}/{p.relative_to(local).as_posix()}"}, ExpiresIn=86400)
                              for p in sorted(files) if p.suffix == ".tar"]
            else:
                urls[peer] = f"s3://{BUCKET}/{peer}"
            shutil.rmtree(local)  # the server holds it now

        rows_per_shard = max(1, shard_bytes // row_bytes)
        # Mosaic's own settings, without which it thrashes under the limit: a
        # shuffle block of one shard's rows (its default, 262,144 rows, spans
        # the whole dataset, so every shard is wanted at once) and one
        # canonical node, so that the order resumes on 3 ranks of the node.
        mosaic = {"shuffle_algo": "py1e", "shuffle_block_size": rows_per_shard, "num_canonical_nodes": 1,
                  "predownload": 8 * BATCH}
        settings = {
            "loader-only": "no reader: (index, zero row) pairs made in the DataLoader's workers, batch by "
                           "batch in turn: what the DataLoader itself costs on this machine",
            "prep": "defaults: plan chosen for the cache limit (block, window, streams), seed 1",
            "mosaic": f"cache_limit; shuffle=True, shuffle_algo py1e, shuffle_block_size {rows_per_shard} "
                      f"(one shard's rows), num_canonical_nodes 1, predownload {8 * BATCH} (its default, "
                      f"8 x batch_size); StreamingDataLoader; S3_ENDPOINT_URL for the endpoint",
            "litdata": "max_cache_size; allow_http added to its obstore client options (else its default async download path cannot reach an http endpoint); shuffle=True, seed 1, defaults otherwise; "
                       "StreamingDataLoader; AWS_ENDPOINT_URL for the endpoint",
            "litdata+big": "as litdata, with max_cache_size twice the dataset",
            "webdataset": "no cache: each tar streamed over HTTP by curl (presigned GETs); shardshuffle 100, "
                          "a 1,000-row shuffle buffer, split_by_node and split_by_worker",
            "webdataset+cache": "as webdataset, with cache_dir and cache_size = the limit: whole tars "
                                "downloaded into the cache, an LRU clean-up before a download at most every 30 s",
        }
        base = {"urls": urls, "limit": limit, "mosaic": mosaic, "rows": n, "seq_len": args.seq_len}
        report = {"machine": platform.machine(), "cpus": os.cpu_count(), "load_avg_at_start": os.getloadavg(),
                  "versions": versions(), "rows": n, "row_bytes": row_bytes, "dataset_bytes": size,
                  "copies": copies, "cache_limit": limit, "shard_bytes": shard_bytes, "batch_size": BATCH,
                  "num_workers": WORKERS, "timeout_s": timeout, "conversions": conversions,
                  "settings": {p: settings[p] for p in peers}, "peers": {}}
        for peer in peers:
            report["peers"][peer] = measure(peer, base, work, n, row_bytes, timeout, env, args.resume_fraction)
            print(json.dumps(report["peers"][peer], default=str)[:2000], flush=True)
        report["load_avg_at_end"] = os.getloadavg()
    finally:
        server.stop()
        shutil.rmtree(work / "cache", ignore_errors=True)
    out = args.out or args.scratch / "stream-peers.json"
    out.write_text(json.dumps(report, indent=1, default=str))
    print()
    for peer in peers:
        print(f"{peer}: {report['settings'][peer]}")
    print()
    print(table(report))
    print(f"\n{n} rows of {row_bytes} bytes ({size / 1e6:.0f} MB), cache limit {limit / 1e6:.1f} MB, "
          f"DataLoader num_workers {WORKERS}, batch_size {BATCH}; results in {out}")


if __name__ == "__main__":
    main()
