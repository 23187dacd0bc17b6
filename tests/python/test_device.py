"""prep.DeviceLoader: a packed dataset's batches in GPU memory as torch tensors.

Everywhere, with device="cpu" (the same loader into host memory), against
the mapped reader (prep.Dataset in the readers' order, StreamingDataset's
indices) as the reference: every batch of two epochs, and a state taken
mid-epoch resumes at the next batch on another world size.
On a machine with a GPU (torch.cuda available), against the same reference:
- every batch of two epochs, for int64, int32 and the stored dtype, rows
  gathered by the host, by a kernel on the GPU or by its copy engines,
  equals the host rows, on the device,
  with no copy (the tensor's address is the loader's buffer);
- a tensor kept past later batches stays valid and holds its buffer until it
  is freed; holding every buffer while asking for the next is refused;
- work on a non-default stream sees each batch complete;
- state_dict resumes at the next batch.
Without one (CI), construction raises RuntimeError saying why.

    PREP_BIN=target/debug/prep target/venv/bin/python -m pytest tests/python/test_device.py
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="torch is not installed")
native = pytest.importorskip("prep._native", reason="prep's extension module is not built (make package)")

import prep  # noqa: E402

# Not from test_reference: that module needs zstandard and tokenizers, which a
# GPU machine's image may lack.
REPO = Path(__file__).resolve().parents[2]
FIXTURES = REPO / "fixtures"
CORPUS = FIXTURES / "corpus" / "debian-sample.jsonl.zst"
PREP_BIN = Path(os.environ.get("PREP_BIN", REPO / os.environ.get("CARGO_TARGET_DIR", "target") / "debug" / "prep"))
GPU = torch.cuda.is_available()
needs_gpu = pytest.mark.skipif(not GPU, reason="no CUDA device (torch.cuda.is_available() is False)")
SEQ_LEN = 128


def run(*args: str) -> None:
    proc = subprocess.run([str(PREP_BIN), *map(str, args)], capture_output=True, text=True)
    assert proc.returncode == 0, f"prep {' '.join(map(str, args))}: {proc.stderr}"


@pytest.fixture(scope="module")
def packed(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("device")
    run("tokenize", "--tokenizer", FIXTURES / "tokenizers" / "gpt2.tokenizer.json.zst",
        "--input", CORPUS, "--output", root / "docs", "--shard-size", "1MiB", "--quiet")
    run("pack", root / "docs", root / "packed", "--seq-len", SEQ_LEN,
        "--shard-size", "256KiB", "--quiet")
    return root / "packed"


def expected_batches(ds: prep.Dataset, batch: int, seed: int, epochs: range, rank: int = 0, world: int = 1):
    """(epoch, rows) of each batch, from the mapped reader in the readers' order."""
    for epoch in epochs:
        reader = prep.StreamingDataset(ds.path, seed=seed, epoch=epoch, rank=rank, world_size=world)
        order = reader.indices().tolist()
        for at in range(0, len(order), batch):
            yield epoch, np.stack([ds[i] for i in order[at:at + batch]])


@pytest.mark.parametrize("dtype", ["int64", None])
def test_host_batches_are_the_readers_rows_for_two_epochs(packed, dtype):
    ds = prep.Dataset(packed)
    for rank, world in ((0, 1), (1, 3)):
        loader = prep.DeviceLoader(packed, batch_size=7, device="cpu", seed=5, epochs=2, dtype=dtype,
                                   rank=rank, world_size=world, threads=2)
        want = list(expected_batches(ds, 7, 5, range(2), rank, world))
        got = list(loader)
        assert len(got) == len(want)
        for tensor, (_, rows) in zip(got, want):
            assert tensor.dtype == (torch.int64 if dtype else torch.uint16) and tensor.shape == rows.shape
            assert np.array_equal(tensor.numpy().astype(np.int64), rows.astype(np.int64))


def test_a_host_loaders_state_resumes_at_the_next_batch_on_another_world_size(packed):
    """A state of 2 ranks after 9 batches each, loaded by 3 loaders (and by a
    StreamingDataset): together they read exactly the rest of the epoch."""
    ds = prep.Dataset(packed)
    first = [prep.DeviceLoader(packed, batch_size=5, device="cpu", seed=2, epochs=1, rank=r, world_size=2)
             for r in range(2)]
    its = [iter(loader) for loader in first]
    before = [torch.cat([next(it) for _ in range(9)]) for it in its]
    state = first[0].state_dict()
    assert state == first[1].state_dict() and state["position"] == 9 * 5 * 2
    streaming = prep.StreamingDataset(packed, seed=2, world_size=2)
    streaming.load_state_dict(state)
    assert streaming.state_dict() == state
    rest = []
    for rank in range(3):
        loader = prep.DeviceLoader(packed, batch_size=5, device="cpu", seed=2, epochs=1, rank=rank,
                                   world_size=3)
        loader.load_state_dict(state)
        rest.append(torch.cat(list(loader)))
    # The rows are the order's, rank by rank; the order's indices say every
    # row was read once (rows alone may repeat in a dataset).
    indices = []
    for rank, rows in enumerate(before):
        order = prep.StreamingDataset(packed, seed=2, rank=rank, world_size=2).indices()[:len(rows)]
        assert np.array_equal(rows.numpy(), np.stack([ds[int(i)] for i in order]).astype(np.int64))
        indices += order.tolist()
    for rank, rows in enumerate(rest):
        reader = prep.StreamingDataset(packed, seed=2, rank=rank, world_size=3)
        reader.load_state_dict(state)
        order = reader.indices()
        assert np.array_equal(rows.numpy(), np.stack([ds[int(i)] for i in order]).astype(np.int64))
        indices += order.tolist()
    assert len(indices) == len(set(indices)), "a row read twice"
    assert len(ds) - len(indices) < 3, "more rows left out than the last world size leaves"


@pytest.mark.skipif(GPU, reason="a CUDA device is present")
def test_without_a_gpu_construction_says_why(packed):
    with pytest.raises(RuntimeError, match="no CUDA driver|no GPU cuda:|CUDA"):
        prep.DeviceLoader(packed, batch_size=4, device=0)


def test_an_unknown_gather_is_refused_naming_the_three(packed):
    with pytest.raises(ValueError, match="expected host, device or dma"):
        prep.DeviceLoader(packed, batch_size=4, device=0, gather="gpu")


@needs_gpu
@pytest.mark.parametrize("gather", ["host", "device", "dma"])
@pytest.mark.parametrize("dtype", ["int64", "int32", None])
def test_batches_equal_the_host_rows_for_two_epochs(packed, dtype, gather):
    ds = prep.Dataset(packed)
    want_dtype = {"int64": torch.int64, "int32": torch.int32, None: torch.uint16}[dtype]
    loader = prep.DeviceLoader(packed, batch_size=7, seed=5, epochs=2, dtype=dtype, depth=3, threads=2,
                               gather=gather)
    assert loader.seq_len == SEQ_LEN
    want = list(expected_batches(ds, 7, 5, range(2)))
    seen = 0
    for tensor, (_, rows) in zip(loader, want, strict=True):
        assert tensor.device == torch.device("cuda", 0) and tensor.dtype == want_dtype
        assert tensor.shape == rows.shape
        assert np.array_equal(tensor.cpu().numpy().astype(np.int64), rows.astype(np.int64))
        seen += 1
    assert seen == len(want)


@needs_gpu
def test_the_tensor_is_the_loaders_buffer_not_a_copy(packed):
    stream = prep.StreamingDataset(packed, seed=1)._open()
    loader = native.CudaLoader(stream, 0, 8, 2, 0, 1, 0, 0, 1, 2, "i64")
    stream = torch.cuda.current_stream()
    batch = loader.next(stream.cuda_stream)
    tensor = torch.as_tensor(batch, device="cuda:0")
    assert tensor.data_ptr() == batch.__cuda_array_interface__["data"][0]
    assert tensor.shape == (8, SEQ_LEN) and batch.rows == 8


@needs_gpu
def test_a_kept_tensor_stays_valid_and_holding_every_buffer_is_refused(packed):
    ds = prep.Dataset(packed)
    want = [rows for _, rows in expected_batches(ds, 4, 9, range(1))]
    loader = prep.DeviceLoader(packed, batch_size=4, seed=9, epochs=1, depth=3, threads=2)
    it = iter(loader)
    kept = [next(it), next(it)]
    for k in range(2, 8):
        t = next(it)  # the other buffer, reused batch after batch
        assert np.array_equal(t.cpu().numpy(), want[k])
        del t
    assert loader._active.held == 2
    kept.append(next(it))
    assert loader._active.held == 3
    with pytest.raises(RuntimeError, match="still held"):
        next(it)
    for k in range(2):
        assert np.array_equal(kept[k].cpu().numpy(), want[k]), "a kept batch was overwritten"
    del kept
    assert loader._active.held == 0


@needs_gpu
def test_work_on_a_side_stream_sees_each_batch_complete(packed):
    ds = prep.Dataset(packed)
    want = [rows.astype(np.int64).sum() for _, rows in expected_batches(ds, 16, 3, range(1))]
    side = torch.cuda.Stream()
    sums = []
    with torch.cuda.stream(side):
        for t in prep.DeviceLoader(packed, batch_size=16, seed=3, epochs=1, depth=2, threads=2):
            sums.append((t * 1).sum())  # queued on `side`, after the copy
    side.synchronize()
    assert [int(s) for s in sums] == [int(w) for w in want]


@needs_gpu
def test_state_dict_resumes_at_the_next_batch(packed):
    first = prep.DeviceLoader(packed, batch_size=5, seed=2, epochs=2)
    it = iter(first)
    for _ in range(len(prep.Dataset(packed)) // 5 + 3):  # into the second epoch
        next(it)
    state = first.state_dict()
    expected = next(it).cpu()
    again = prep.DeviceLoader(packed, batch_size=5, seed=2)
    again.load_state_dict(state)
    assert torch.equal(next(iter(again)).cpu(), expected)
