"""prep.StreamingDataset from gs:// and https:// (and http://), against a
local server on 127.0.0.1 that speaks what object_store sends each
(tests/python/range_server.py: GCS's XML API through a service-account file
with `gcs_base_url`, as object_store's own tests reach an emulator; a web
server with Range, over TLS under a certificate authority made for the test
and trusted through SSL_CERT_FILE).

- Every row once across 2 ranks, each the dataset's own bytes, fetched
  through the server (its GET log shows the shards' ranges).
- The same epoch order as from the local directory, and a state taken while
  streaming the local directory resumes the stream from the store, and back.
- One state through the package's three readers and both places: taken from
  the store on 2 ranks, resumed in place from the directory
  (prep.PackedDataset) on 3, and finished from the store by the batch loader
  (prep.DeviceLoader into host memory) on 1: every row once, each the row
  the order puts there.

    PREP_BIN=target/debug/prep target/venv/bin/python -m pytest tests/python/test_stream_stores.py
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

import prep
from range_server import RangeServer, gcs_service_account, self_signed
from test_s3 import CORPUS, GPT2, ok, prep as run_prep

native = pytest.importorskip("prep._native", reason="prep's extension module is not built (make package)")


@pytest.fixture(scope="module")
def root(tmp_path_factory) -> Path:
    """A directory served as the store: bkt/packed, a packed dataset of the corpus (rows of
    128 tokens, 64 KiB shards)."""
    tmp = tmp_path_factory.mktemp("stores")
    docs, packed = tmp / "docs", tmp / "root" / "bkt" / "packed"
    ok(run_prep("tokenize", "--tokenizer", GPT2, "--input", CORPUS, "--output", docs, "--quiet"))
    ok(run_prep("pack", docs, packed, "--seq-len", 128, "--shard-size", "64KiB", "--quiet"))
    return tmp / "root"


@pytest.fixture(params=["gs", "http", "https"])
def store(request, root, tmp_path, monkeypatch):
    """(the dataset's URL in the store, the server)."""
    if request.param == "https":
        if shutil.which("openssl") is None:
            pytest.fail("openssl is needed to make the test's certificates")
        ca, cert, key = self_signed(tmp_path)
        monkeypatch.setenv("SSL_CERT_FILE", str(ca))
        server = RangeServer(root, tls=(cert, key))
    else:
        server = RangeServer(root)
    if request.param == "gs":
        monkeypatch.setenv("GOOGLE_SERVICE_ACCOUNT", str(gcs_service_account(tmp_path / "sa.json", server)))
        url = "gs://bkt/packed"
    else:
        url = f"{server.url}/bkt/packed"
    yield url, server
    server.stop()


def stream(url, cache: Path, **kw) -> prep.StreamingDataset:
    args = dict(cache_dir=cache, cache_limit="4MiB", seed=9, rank=0, world_size=1, indices=True)
    args.update(kw)
    return prep.StreamingDataset(url, **args)


def test_every_row_once_across_2_ranks_as_the_dataset_has_it(store, root, tmp_path):
    url, server = store
    ds = prep.Dataset(root / "bkt" / "packed")
    seen = []
    for rank in range(2):
        d = stream(url, tmp_path / "cache", rank=rank, world_size=2, local_world_size=2)
        rows = list(d)
        assert [int(i) for i, _ in rows] == d.indices().tolist(), "the order's sequence"
        for i, row in rows:
            assert np.array_equal(row, ds[int(i)]), int(i)
        seen += [int(i) for i, _ in rows]
    assert len(seen) == len(set(seen)) == len(ds) - len(ds) % 2
    fetched = [key for key, _ in server.gets if key.endswith(".bin")]
    assert fetched, f"no shard was read from the server: {server.gets[:5]}"
    assert all(r.startswith("bytes=") for key, r in server.gets if key.endswith(".bin"))


def test_the_local_directory_and_the_store_read_one_order_and_share_states(store, root, tmp_path):
    url, _ = store
    local = root / "bkt" / "packed"
    for epoch in (0, 3):
        a = stream(local, tmp_path / "a", epoch=epoch)
        b = stream(url, tmp_path / "b", epoch=epoch)
        assert a.plan == b.plan
        assert np.array_equal(a.indices(), b.indices()), f"epoch {epoch}"
    # 100 rows from the directory, the rest from the store; and the reverse.
    for first, then in ((local, url), (url, local)):
        d = stream(first, tmp_path / "c1")
        it = iter(d)
        before = [int(next(it)[0]) for _ in range(100)]
        state = d.state_dict()
        e = stream(then, tmp_path / "c2")
        e.load_state_dict(state)
        after = [int(i) for i, _ in e]
        whole = stream(local, tmp_path / "c3").indices().tolist()
        assert before + after == whole, f"{first} then {then}"


def test_one_state_moves_between_the_three_readers_the_two_places_and_world_sizes(store, root, tmp_path):
    torch = pytest.importorskip("torch", reason="PackedDataset and DeviceLoader need torch")
    url, _ = store
    local = root / "bkt" / "packed"
    ds = prep.Dataset(local)
    common = dict(cache_limit="4MiB", seed=9)

    def order(world, rank, state=None):
        reader = prep.StreamingDataset(local, world_size=world, rank=rank, **common)
        if state is not None:
            reader.load_state_dict(state)
        return reader.indices().tolist()

    def rows_of(indices):
        return np.stack([ds[i] for i in indices]).astype(np.int64)

    read = []
    # 2 ranks stream 40 rows each from the store.
    for rank in range(2):
        d = stream(url, tmp_path / "cache", rank=rank, world_size=2, local_world_size=2, **common)
        it = iter(d)
        got = [int(next(it)[0]) for _ in range(40)]
        assert got == order(2, rank)[:40]
        read += got
    state = d.state_dict()
    # 3 ranks go on in place from the directory, 30 rows each.
    for rank in range(3):
        p = prep.PackedDataset(local, world_size=3, rank=rank, **common)
        p.load_state_dict(state)
        it = iter(p)
        rows = torch.stack([next(it) for _ in range(30)]).numpy()
        want = order(3, rank, state)[:30]
        assert np.array_equal(rows, rows_of(want)), f"PackedDataset rank {rank}"
        read += want
    state = p.state_dict()
    assert state["position"] == 80 + 90
    # One batch loader finishes the epoch from the store.
    loader = prep.DeviceLoader(url, device="cpu", batch_size=16, epochs=1, world_size=1, rank=0,
                               cache_dir=tmp_path / "cache2", **common)
    loader.load_state_dict(state)
    rest = torch.cat(list(loader)).numpy()
    want = order(1, 0, state)
    assert np.array_equal(rest, rows_of(want)), "DeviceLoader"
    read += want
    assert sorted(read) == list(range(len(ds))), "every row once"
    assert loader.state_dict()["position"] == len(ds)


def test_batches_are_the_rows_in_one_call_each_and_a_dataloader_takes_them(store, root, tmp_path):
    """batched=True: the same rows in the same order, batch_size at a time (the last shorter), and
    through a DataLoader with 2 workers and batch_size=None the rank's rows in order."""
    url, _ = store
    rows = stream(url, tmp_path / "a", rank=1, world_size=2, batch_size=32)
    want_idx = [int(i) for i, _ in rows]
    want = np.stack([r for _, r in rows])
    got = list(stream(url, tmp_path / "b", rank=1, world_size=2, batch_size=32, batched=True))
    assert all(len(i) == 32 for i, _ in got[:-1]) and 0 < len(got[-1][0]) <= 32
    assert np.concatenate([i for i, _ in got]).tolist() == want_idx
    batches = np.concatenate([b for _, b in got])
    assert np.array_equal(batches, want) and batches.flags.writeable
    torch = pytest.importorskip("torch", reason="the DataLoader run needs torch")
    d = stream(url, tmp_path / "c", rank=1, world_size=2, batch_size=32, batched=True)
    loader = torch.utils.data.DataLoader(d, batch_size=None, num_workers=2)
    idx = [i for i, _ in loader]
    assert torch.cat(idx).tolist() == want_idx
    assert d.state_dict(batches=len(idx))["position"] == len(prep.Dataset(root / "bkt" / "packed")) // 2 * 2
