"""prep.StreamingDataset against a real S3 server (moto's server mode on
127.0.0.1), behind a counting proxy that records every GET the readers make.

- 2 ranks x 2 DataLoader workers (torch) over a packed dataset several times
  larger than cache_limit: every row once per epoch across ranks, each rank's
  rows in the order's sequence, the cache directory never above its limit
  (sampled while the ranks run).
- A state taken on 2 ranks mid-epoch resumes on 3: what was read before and
  after is the epoch's rows, none twice.
- Two processes sharing cache_dir download each block once; two "nodes"
  (separate caches) of 2 ranks each download about half the dataset each.
- kill -9 of a reader mid-download, then a new reader on the same cache_dir:
  every row it gives is the dataset's own.
- A corrupt object, a missing dataset: errors that name the URL; a cache_limit below the need: refused at construction, with the
  number.

    PREP_BIN=target/debug/prep target/venv/bin/python -m pytest tests/python/test_stream.py
"""

from __future__ import annotations

import fcntl
import gc
import http.client
import http.server
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("boto3", reason="moto[server] (and boto3) not installed: pip install -r tools/requirements.txt")
pytest.importorskip("moto.server", reason="moto[server] not installed: pip install -r tools/requirements.txt")

import prep  # noqa: E402
from test_s3 import GPT2, CORPUS, Server, ok, prep as run_prep, store_env, upload_dir  # noqa: E402

native = pytest.importorskip("prep._native", reason="prep's extension module is not built (make package)")

SEQ_LEN = 128  # rows of 256 bytes
BLOCK = 16 << 10  # 64 rows a block
WINDOW = 2
STREAMS = 8


class Proxy(http.server.ThreadingHTTPServer):
    """Forwards to the S3 server, counting each GET (object key and Range) and
    the bytes sent back; `delay` seconds of sleep per 64 KiB slows transfers."""

    daemon_threads = True

    def __init__(self, upstream_port: int):
        self.upstream = upstream_port
        self.gets: list[tuple[str, str, int]] = []
        self.lock = threading.Lock()
        self.delay = 0.0
        # (status, S3 error code): answer every GET of a .bin with it, as a
        # store that refuses the credentials or stops answering does.
        self.fail: tuple[int, str] | None = None
        super().__init__(("127.0.0.1", 0), _Handler)
        self.url = f"http://127.0.0.1:{self.server_address[1]}"
        threading.Thread(target=self.serve_forever, daemon=True).start()

    def reset(self) -> None:
        with self.lock:
            self.gets.clear()

    def bin_bytes(self) -> int:
        with self.lock:
            return sum(n for key, _, n in self.gets if key.endswith(".bin"))


class _Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args) -> None:
        pass

    def _forward(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length else None
        fail = self.server.fail
        if fail and self.command == "GET" and self.path.split("?")[0].endswith(".bin"):
            status, code = fail
            data = f"<Error><Code>{code}</Code><Message>{code}</Message></Error>".encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/xml")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)
            return
        conn = http.client.HTTPConnection("127.0.0.1", self.server.upstream, timeout=60)
        conn.request(self.command, self.path, body=body, headers=dict(self.headers))
        resp = conn.getresponse()
        data = resp.read()
        self.send_response(resp.status)
        for k, v in resp.getheaders():
            if k.lower() not in ("transfer-encoding", "connection", "content-length"):
                self.send_header(k, v)
        # A HEAD's length is the object's, not that of its empty body.
        length = resp.getheader("Content-Length") if self.command == "HEAD" else None
        self.send_header("Content-Length", length or str(len(data)))
        self.end_headers()
        for at in range(0, len(data), 64 << 10):
            if self.server.delay:
                time.sleep(self.server.delay)
            self.wfile.write(data[at:at + (64 << 10)])
        if self.command == "GET":
            with self.server.lock:
                self.server.gets.append((self.path.split("?")[0], self.headers.get("Range", ""), len(data)))
        conn.close()

    do_GET = do_PUT = do_HEAD = do_POST = do_DELETE = _forward


@pytest.fixture(scope="module")
def s3():
    server = Server()
    proxy = Proxy(server.port)
    yield server, proxy
    proxy.shutdown()
    server.stop()


@pytest.fixture(scope="module")
def dataset(s3, tmp_path_factory):
    """A packed dataset of the corpus (rows of 128 tokens, 64 KiB shards, 4 KiB chunk sums),
    local and uploaded to s3://stream/packed."""
    server, proxy = s3
    tmp = tmp_path_factory.mktemp("stream")
    docs, packed = tmp / "docs", tmp / "packed"
    ok(run_prep("tokenize", "--tokenizer", GPT2, "--input", CORPUS, "--output", docs, "--quiet"))
    # Chunk checksums of 4 KiB (1 MiB unless told): blocks of 16 KiB then
    # download about their own bytes, as 16 MiB blocks do over 1 MiB chunks.
    env = {**os.environ, "PREP_SUM_CHUNK_BYTES": "4096"}
    ok(run_prep("pack", docs, packed, "--seq-len", SEQ_LEN, "--shard-size", "64KiB", "--quiet", env=env))
    client = server.client()
    client.create_bucket(Bucket="stream")
    upload_dir(client, "stream", packed, "packed")
    return packed


@pytest.fixture
def env(s3, monkeypatch):
    """This process's store settings: the proxy in front of the server."""
    _, proxy = s3
    for k, v in store_env(proxy.url).items():
        if k.startswith("AWS_"):
            monkeypatch.setenv(k, v)
    proxy.reset()
    yield proxy
    proxy.fail = None


URL = "s3://stream/packed"


def make(cache, **kw) -> prep.StreamingDataset:
    args = dict(cache_dir=cache, seed=3, block_bytes=BLOCK, window=WINDOW, streams=STREAMS)
    args.update(kw)
    return prep.StreamingDataset(URL, **args)


def rows_of(packed: Path) -> dict[bytes, list[int]]:
    ds = prep.Dataset(packed)
    out: dict[bytes, list[int]] = {}
    for i in range(len(ds)):
        out.setdefault(ds[i].tobytes(), []).append(i)
    return out


def test_dataset_is_several_times_the_cache(dataset, env, tmp_path):
    d = make(tmp_path / "c", cache_limit=1 << 40, world_size=2, rank=0, local_world_size=2)
    size = sum(p.stat().st_size for p in dataset.glob("*.bin"))
    assert size > 3 * d.cache_need, (size, d.cache_need)


RANK_SCRIPT = r"""
import json, sys, prep
import numpy as np
rank, world, cache, limit, workers, out = sys.argv[1:7]
d = prep.StreamingDataset("s3://stream/packed", cache_dir=cache, cache_limit=int(limit), seed=3,
                          rank=int(rank), world_size=int(world), batch_size=4, local_world_size=2,
                          block_bytes=16384, window=2, streams=8, indices=True)
rows = []
if int(workers):
    import torch
    loader = torch.utils.data.DataLoader(d, batch_size=4, num_workers=int(workers))
    for idx, batch in loader:
        rows += [(int(i), r.numpy().tobytes().hex()) for i, r in zip(idx, batch)]
else:
    rows = [(int(i), r.tobytes().hex()) for i, r in d]
json.dump({"rows": rows, "expected": d.indices().tolist()}, open(out, "w"))
"""


def run_watched(cache: Path, runs: list[tuple[Path, list[str]]]) -> tuple[list[dict], int]:
    """Runs each (output file, python arguments) at once, sampling the cache directory's size
    while any runs: each one's JSON output and the peak size."""
    procs = [(out, subprocess.Popen([sys.executable, *map(str, args)])) for out, args in runs]
    peak = 0
    while any(p.poll() is None for _, p in procs):
        peak = max(peak, dir_bytes(cache))
        time.sleep(0.005)
    for _, p in procs:
        assert p.returncode == 0, f"a rank exited {p.returncode}"
    return [json.loads(out.read_text()) for out, _ in procs], peak


def run_ranks(tmp: Path, cache: Path, limit: int, world: int, ranks, workers: int):
    script = tmp / "rank.py"
    script.write_text(RANK_SCRIPT)
    return run_watched(cache, [(tmp / f"rank{r}.json", [script, r, world, cache, limit, workers,
                                                         tmp / f"rank{r}.json"]) for r in ranks])


def dir_bytes(path: Path) -> int:
    """The bytes of the files in a cache directory, counted under its budget
    lock as the readers count them: a listing made while a block is renamed
    into place could otherwise see it under both names."""
    lock = path / ".locks" / "budget.lock"
    if not lock.exists():
        return 0
    with open(lock, "a+b") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        total = 0
        for root, _, files in os.walk(path):
            for f in files:
                try:
                    total += os.stat(os.path.join(root, f)).st_size
                except FileNotFoundError:
                    pass
        return total


def test_ranks_and_workers_read_every_row_once_under_the_limit(dataset, env, tmp_path):
    pytest.importorskip("torch", reason="the DataLoader run needs torch")
    limit = make(tmp_path / "probe", cache_limit=1 << 40, world_size=2, rank=0, local_world_size=2).cache_need
    results, peak = run_ranks(tmp_path, tmp_path / "cache", limit, 2, [0, 1], 2)
    assert peak <= limit, (peak, limit)
    n = len(prep.Dataset(dataset))
    ds = prep.Dataset(dataset)
    seen = []
    for r in results:
        got = [i for i, _ in r["rows"]]
        assert got == r["expected"], "a rank's rows in the order's sequence"
        for i, hexrow in r["rows"]:
            assert bytes.fromhex(hexrow) == ds[i].tobytes(), i
        seen += got
    assert len(seen) == len(set(seen)) == n - n % 2


def test_a_state_from_2_ranks_resumes_on_3(dataset, env, tmp_path):
    n = len(prep.Dataset(dataset))
    before, states = [], []
    for rank in range(2):
        d = make(tmp_path / "c", cache_limit=1 << 30, rank=rank, world_size=2, epoch=1, indices=True)
        it = iter(d)
        before += [int(next(it)[0]) for _ in range(50)]
        states.append(d.state_dict())
    assert states[0] == states[1], "every rank's state is the job's"
    state = json.loads(json.dumps(states[0]))
    after = []
    for rank in range(3):
        d = make(tmp_path / "c", cache_limit=1 << 30, rank=rank, world_size=3, indices=True)
        d.load_state_dict(state)
        after += [int(i) for i, _ in d]
    assert len(set(before) | set(after)) == len(before) + len(after)
    assert len(before) + len(after) == n - (n - 100) % 3

    other = make(tmp_path / "c", cache_limit=1 << 30, seed=4)
    with pytest.raises(ValueError, match="seed"):
        other.load_state_dict(state)


def test_processes_sharing_a_cache_download_each_block_once(dataset, env, tmp_path):
    script = tmp_path / "read.py"
    script.write_text(
        "import sys, prep\n"
        "d = prep.StreamingDataset('s3://stream/packed', cache_dir=sys.argv[1], cache_limit=1 << 30, seed=3,"
        " block_bytes=16384, window=2, streams=8)\n"
        "print(sum(1 for _ in d))\n")
    procs = [subprocess.Popen([sys.executable, str(script), str(tmp_path / "shared")], stdout=subprocess.PIPE)
             for _ in range(2)]
    for p in procs:
        assert p.wait() == 0
    bins = [(k, r) for k, r, _ in env.gets if k.endswith(".bin")]
    assert bins, "the readers fetched blocks"
    assert len(bins) == len(set(bins)), f"a range fetched twice: {Counter(bins).most_common(2)}"
    size = sum(p.stat().st_size for p in dataset.glob("*.bin"))
    assert env.bin_bytes() < 1.2 * size, (env.bin_bytes(), size)


def test_two_nodes_download_about_their_share(dataset, env, tmp_path):
    size = sum(p.stat().st_size for p in dataset.glob("*.bin"))
    served = []
    for node in range(2):
        env.reset()
        for rank in (2 * node, 2 * node + 1):
            d = make(tmp_path / f"node{node}", cache_limit=1 << 30, rank=rank, world_size=4, local_world_size=2)
            sum(1 for _ in d)
        served.append(env.bin_bytes())
    print(f"bytes served per node: {served} of a dataset of {size}")
    for s in served:
        assert s < 0.7 * size, (served, size)


def test_kill_9_mid_download_leaves_nothing_a_reader_uses(dataset, env, tmp_path):
    cache = tmp_path / "cache"
    script = tmp_path / "slow.py"
    script.write_text(
        "import sys, prep\n"
        "d = prep.StreamingDataset('s3://stream/packed', cache_dir=sys.argv[1], cache_limit=1 << 30, seed=3,"
        " block_bytes=65536, window=2, streams=2)\n"
        "print('started', flush=True)\n"
        "for _ in d: pass\n")
    env.delay = 0.05
    try:
        p = subprocess.Popen([sys.executable, str(script), str(cache)], stdout=subprocess.PIPE)
        assert p.stdout.readline().strip() == b"started"
        deadline = time.time() + 20
        while not list(cache.glob("*.part")) and time.time() < deadline:
            time.sleep(0.01)
        assert list(cache.glob("*.part")), "a download under way"
        p.send_signal(signal.SIGKILL)
        p.wait()
    finally:
        env.delay = 0.0
    ds = prep.Dataset(dataset)
    d = make(cache, cache_limit=1 << 30, block_bytes=65536, streams=2, indices=True)
    count = 0
    for i, row in d:
        assert row.tobytes() == ds[int(i)].tobytes()
        count += 1
    assert count == len(ds)
    assert not list(cache.glob("*.part"))


def error_of(rows) -> str:
    """The message of the OSError reading `rows` to the end raises. Not the
    exception: its traceback would keep the reader alive, with its fetches
    in flight. The caller's own reference goes with `del`."""
    try:
        for _ in rows:
            pass
    except OSError as e:
        return str(e)
    return "no error"


def test_errors_name_the_url(dataset, s3, env, tmp_path):
    server, proxy = s3
    client = server.client()
    # A shard changed in the store after the manifest was written.
    client.create_bucket(Bucket="bad")
    upload_dir(client, "bad", dataset, "packed")
    shard = json.loads((dataset / "manifest.json").read_text())["shards"][1]["bin"]
    body = bytearray((dataset / shard).read_bytes())
    body[100] ^= 1
    client.put_object(Bucket="bad", Key=f"packed/{shard}", Body=bytes(body))
    d = prep.StreamingDataset("s3://bad/packed", cache_dir=tmp_path / "c", cache_limit=1 << 30,
                              block_bytes=BLOCK, window=WINDOW, streams=STREAMS)
    message = error_of(iter(d))
    assert re.search(f"s3://bad/packed/{shard}.*corrupt", message), message
    gc.collect()
    assert not list((tmp_path / "c").glob("*.part"))

    with pytest.raises(OSError, match="s3://stream/nothing"):
        prep.StreamingDataset("s3://stream/nothing", cache_dir=tmp_path / "c", cache_limit=1 << 30)



def test_a_cache_limit_below_the_need_is_refused_with_the_number(dataset, env, tmp_path):
    need = make(tmp_path / "c", cache_limit=1 << 40, world_size=2, rank=1).cache_need
    with pytest.raises(ValueError, match=str(need)):
        make(tmp_path / "c", cache_limit=need - 1, world_size=2, rank=1)
    with pytest.raises(ValueError, match="invalid size \"lots\""):
        make(tmp_path / "c", cache_limit="lots")
    assert prep.streaming.parse_size("20GiB") == 20 << 30


@pytest.mark.parametrize("status,code", [(403, "AccessDenied"), (503, "SlowDown")])
def test_a_store_that_refuses_or_stops_answering_is_an_error_naming_the_object(dataset, env, tmp_path,
                                                                               status, code):
    """Refused credentials fail at once; a store that answers 503 is retried
    (the store client's backoff) and then fails; both name the object."""
    d = make(tmp_path / "c", cache_limit=1 << 30, indices=True)

    it = iter(d)
    next(it)  # the first blocks came through
    env.fail = (status, code)
    message = error_of(it)
    assert re.search(r"s3://stream/packed/shard-\d+\.bin", message), message
    # The reader is gone (its fetches in flight waited for): none left a part.
    del it
    gc.collect()
    assert not list((tmp_path / "c").glob("*.part"))


# --- Default settings: the plan follows the cache (issue 53) -------------------------------------

DEFAULTS_SCRIPT = r"""
import json, sys, warnings
warnings.simplefilter("error")  # torch's "not writable" warning fails the run
import prep, torch
rank, world, cache, limit, out, state = sys.argv[1:7]
d = prep.StreamingDataset("s3://stream-big/packed", cache_dir=cache, cache_limit=int(limit), seed=5,
                          rank=int(rank), world_size=int(world), batch_size=8, local_world_size=int(world),
                          indices=True)
if state != "-":
    d.load_state_dict(json.load(open(state)))
take = int(sys.argv[7])
loader = torch.utils.data.DataLoader(d, batch_size=8, num_workers=2)
rows, batches = [], 0
for idx, batch in loader:
    rows += [int(i) for i in idx]
    batches += 1
    if take and batches == take:
        break
json.dump({"rows": rows, "plan": d.plan, "need": d.cache_need,
           "state": d.state_dict(batches=batches)}, open(out, "w"))
"""


@pytest.fixture(scope="module")
def big(s3, tmp_path_factory):
    """A 75 MiB packed dataset (rows of 1,024 uint16 tokens) at s3://stream-big/packed: random ids in
    documents of 1 to 4,000 tokens, imported from a nanoGPT file and packed."""
    server, _ = s3
    tmp = tmp_path_factory.mktemp("big")
    rng = np.random.default_rng(53)
    tokens = rng.integers(0, 50256, size=75 * (1 << 20) // 2 + 4096, dtype=np.uint16)
    tokens[np.cumsum(rng.integers(1, 4000, size=len(tokens) // 1000)) % len(tokens)] = 50256
    flat = tmp / "flat.bin"
    tokens.tofile(flat)
    ok(run_prep("import", "nanogpt", flat, tmp / "docs", "--eos", "50256", "--quiet"))
    ok(run_prep("pack", tmp / "docs", tmp / "packed", "--seq-len", 1024, "--no-sep", "--quiet"))
    client = server.client()
    client.create_bucket(Bucket="stream-big")
    upload_dir(client, "stream-big", tmp / "packed", "packed")
    return tmp / "packed"


def run_default_ranks(tmp: Path, cache: Path, world: int, state: Path | None, take: int):
    script = tmp / "defaults.py"
    script.write_text(DEFAULTS_SCRIPT)
    outs = [tmp / f"defaults-{world}-{r}.json" for r in range(world)]
    return run_watched(cache, [(out, [script, r, world, cache, 32 << 20, out, state or "-", take])
                               for r, out in enumerate(outs)])


def test_a_75_mib_dataset_streams_through_32_mib_on_defaults_and_resumes_on_3(big, env, tmp_path):
    """Default block, window and streams on a cache a third of the dataset: two ranks sharing it
    (2 DataLoader workers each, warnings as errors) read 100 batches each, then the job resumes on
    3 ranks from the state and reads the rest: every row once, the cache never above its limit."""
    pytest.importorskip("torch", reason="the DataLoader run needs torch")
    size = sum(p.stat().st_size for p in big.glob("*.bin"))
    assert size > 2.3 * (32 << 20), size
    n = len(prep.Dataset(big))
    cache = tmp_path / "cache"
    first, peak1 = run_default_ranks(tmp_path, cache, 2, None, 100)
    assert first[0]["state"] == first[1]["state"], "every rank's state is the job's"
    assert first[0]["need"] <= 32 << 20 and peak1 <= 32 << 20, (first[0]["need"], peak1)
    state = tmp_path / "state.json"
    state.write_text(json.dumps(first[0]["state"]))
    second, peak2 = run_default_ranks(tmp_path, cache, 3, state, 0)
    assert peak2 <= 32 << 20, peak2
    assert second[0]["plan"] == first[0]["plan"], "the resumed job reads the recorded order"
    before = [i for r in first for i in r["rows"]]
    after = [i for r in second for i in r["rows"]]
    assert len(before) == 2 * 100 * 8
    assert len(set(before + after)) == len(before) + len(after), "no row twice"
    assert len(before) + len(after) == n - (n - len(before)) % 3, "every row of the epoch"


@pytest.mark.filterwarnings("error::UserWarning")
def test_rows_are_writable_and_a_dataloader_takes_them_without_a_warning(dataset, tmp_path):
    """Rows own their one copy and are writable, so torch's default_collate (which warns on a
    read-only numpy array, "The given NumPy array is not writable") takes them silently."""
    torch = pytest.importorskip("torch", reason="the DataLoader run needs torch")
    d = prep.StreamingDataset(dataset, cache_dir=tmp_path / "c", cache_limit="64MiB", seed=1,
                              rank=0, world_size=1)
    row = next(iter(d))
    assert row.flags.writeable and row.flags.owndata is False and row.base is not None
    row[0] = row[0]  # writing is allowed
    ds = prep.Dataset(dataset)
    n = 0
    for batch in torch.utils.data.DataLoader(d, batch_size=16, num_workers=0):
        assert batch.shape[1] == SEQ_LEN
        n += len(batch)
        if n >= 64:
            break
    assert n == 64 and len(ds) >= 64
