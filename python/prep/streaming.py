"""Reading a packed dataset for training: one order, one set of defaults
and one resume state, from a local directory, from object storage or into
GPU memory.

`prep.StreamingDataset` reads a packed dataset at an `s3://`, `gs://`,
`az://`, `https://` address, or in a local directory, in blocks of rows
through a cache that never holds more than `cache_limit` bytes.
`prep.PackedDataset` reads a local one in place (numpy views of the mapped
shards, as int64 tensors, with targets or labels), and `prep.DeviceLoader`
(device.py) delivers batches into GPU memory: all three are a `_Reader`
(below), read the same rows in the same order for the same arguments, and
take one another's `state_dict()`. The order, the fetching, the checks and
the cache are prep's Rust reader (`prep::stream`), called through the
package's extension module: one implementation for the `prep` command, Rust
training loops and these classes.

    data = prep.StreamingDataset("s3://bucket/packed", cache_dir="/local/cache",
                                 cache_limit="20GiB", seed=1, rank=rank,
                                 world_size=world, batch_size=8)
    if checkpoint:
        data.load_state_dict(checkpoint["data"])
    loader = DataLoader(data, batch_size=8, num_workers=4)
    for step, batch in enumerate(loader, 1):
        ...
        if step % 1000 == 0:
            checkpoint = {..., "data": data.state_dict(batches=step)}

The order (see docs/streaming.md): blocks of rows permuted per epoch,
dealt to a fixed number of streams, shuffled within windows of blocks and
read round-robin across streams. It depends on the dataset, the seed, the
epoch and the stream count fixed when the job first started (kept in the
state), never on the number of ranks or workers; so a state taken when every
rank has consumed the same number of rows resumes on any world size and
reads exactly the rest of the epoch.
"""

from __future__ import annotations

import json
import operator
import os
from typing import Any, Iterator

import numpy as np

from ._world import default_rank_and_world

try:
    import torch
    from torch.utils.data import IterableDataset as _Base
except ImportError:  # works without torch, as a plain iterable
    torch = None
    _Base = object

__all__ = ["StreamingDataset", "parse_size", "DEFAULT_CACHE_LIMIT"]  # and PackedDataset, where torch imports

DEFAULT_CACHE_LIMIT = 1 << 30
"""The `cache_limit` of every reader given none: 1 GiB. The order's plan
follows the limit (docs/streaming.md), so the readers of one job (and every
rank of it) must be given the same one to read the same order."""


def parse_size(value: int | str) -> int:
    """Bytes from an int or a size string: "20GiB", "512MiB", "1.5GB", "4096".

    A string is read by prep's own parser (the command line's `--shard-size`
    and `--memory` read sizes the same way); ValueError for one it refuses."""
    if isinstance(value, str):
        return _native().parse_size(value)
    value = operator.index(value)
    if value < 0:
        raise ValueError(f"a size must not be negative, not {value}")
    return value


def _native():
    from . import _native

    return _native


def _index(value: Any, what: str, least: int = 0) -> int:
    value = operator.index(value)
    if value < least:
        raise ValueError(f"{what} must be at least {least}, not {value}")
    return value


class _Reader:
    """What every reader of the package shares: its arguments and their
    defaults, the order (a `prep._native.Stream`, opened per process) and
    the resume state.

    Arguments: `source` (a local directory or a store address); `seed`
    (default 0), `epoch`; `rank`, `world_size` (default torch.distributed's,
    else the RANK and WORLD_SIZE variables, else 0 and 1); `batch_size`;
    `cache_dir` (needed for a store address; a local dataset's rows never
    pass through it); `cache_limit` (bytes or a size string; default
    DEFAULT_CACHE_LIMIT) and `local_world_size` (ranks sharing cache_dir,
    default LOCAL_WORLD_SIZE, else 1): the order's plan is chosen for them
    on this world where `block_bytes`, `window` and `streams` are left out,
    so every rank and every reader of a job must be given the same ones
    (torchrun's are); `in_flight`: fetches at once.

    A position is global: rows the whole job consumed in the epoch, every
    rank alike (rank r of W reads positions start + r, start + r + W, ...).
    """

    def __init__(self, source: str | os.PathLike, *, seed: int = 0, epoch: int = 0,
                 rank: int | None = None, world_size: int | None = None, batch_size: int = 1,
                 cache_dir: str | os.PathLike | None = None, cache_limit: int | str = DEFAULT_CACHE_LIMIT,
                 local_world_size: int | None = None, block_bytes: int | str | None = None,
                 window: int | None = None, streams: int | None = None, in_flight: int | None = None):
        default_rank, default_world = default_rank_and_world()
        self.url = os.fspath(source)
        self.cache_limit = parse_size(cache_limit)
        self.seed = _index(seed, "seed")
        self.rank = default_rank if rank is None else operator.index(rank)
        self.world_size = default_world if world_size is None else operator.index(world_size)
        if not 0 <= self.rank < self.world_size:
            raise ValueError(f"rank {self.rank} of world_size {self.world_size}")
        self.batch_size = _index(batch_size, "batch_size", 1)
        if local_world_size is None:
            local_world_size = int(os.environ.get("LOCAL_WORLD_SIZE", 1))
        self.local_world_size = _index(local_world_size, "local_world_size", 1)
        # None: chosen by prep::stream to fit cache_limit on this world
        # (docs/streaming.md, "The cache it needs"), kept there alone.
        self._params = {"block_bytes": None if block_bytes is None else parse_size(block_bytes),
                        "window": None if window is None else operator.index(window),
                        "streams": None if streams is None else operator.index(streams),
                        "in_flight": None if in_flight is None else operator.index(in_flight)}
        self.epoch = _index(epoch, "epoch")
        self._start = 0  # global position this pass starts from
        self._yielded = 0  # rows this process's iterator yielded in this pass
        self._state: dict | None = None  # the state loaded, which fixes the order's parameters
        self._stream, self._pid = None, os.getpid()
        if cache_dir is None:
            if "://" in self.url:
                raise ValueError(f"{self.url}: a dataset in object storage needs a cache_dir")
            # Never created: a local dataset's rows do not pass through it.
            cache_dir = os.path.join(self.url, ".prep-cache-unused")
        self.cache_dir = os.fspath(cache_dir)
        self._open().check_cache(self.world_size)

    def _open(self):
        # A DataLoader worker forked from this process opens its own: the
        # parent's store clients and their connections are the parent's.
        if self._stream is None or self._pid != os.getpid():
            self._pid = os.getpid()
            self._stream = self._new_stream(self._state)
        return self._stream

    def _new_stream(self, state: dict | None):
        return _native().Stream(
            self.url, self.cache_dir, self.cache_limit, self.seed, self._params["block_bytes"],
            self._params["window"], self._params["streams"], self._params["in_flight"],
            self.local_world_size, self.world_size, None if state is None else json.dumps(state))

    def __getstate__(self) -> dict:
        # DataLoader workers started by spawn get a copy without the native
        # handle, and open their own.
        state = dict(self.__dict__)
        state["_stream"] = None
        return state

    @property
    def dtype(self) -> np.dtype:
        """The ids' type as stored: uint16 or uint32."""
        return np.dtype("<u2" if self._open().dtype == "uint16" else "<u4")

    @property
    def seq_len(self) -> int:
        return self._open().seq_len

    @property
    def plan(self) -> dict:
        """The order's parameters: rows a block, blocks a window, streams (chosen
        for cache_limit when the job first started, or the state's)."""
        block, window, streams = self._open().plan
        return {"block": block, "window": window, "streams": streams}

    @property
    def cache_need(self) -> int:
        """Bytes of cache this job's ranks on one node need (what cache_limit must reach)."""
        return self._open().cache_need(self.world_size)

    def __len__(self) -> int:
        """Rows this rank reads in this pass (over all its workers)."""
        return max(0, self._open().n_records - self._start) // self.world_size

    def indices(self) -> np.ndarray:
        """The dataset indices of the rows this rank reads in this pass, in order (uint64)."""
        return np.frombuffer(self._open().indices(self.epoch, self._start, self.rank, self.world_size),
                             dtype="<u8")

    def set_epoch(self, epoch: int) -> None:
        """Start epoch `epoch` from its first position (the next iteration reads it)."""
        self.epoch = _index(epoch, "epoch")
        self._start = self._yielded = 0

    def state_dict(self, batches: int | None = None) -> dict:
        """Where the job stands, as a dict of JSON values: the same for every
        reader of the package, and loaded by any of them.

        Take it when every rank has consumed the same number of rows (as
        synchronous data-parallel training does): `batches` is the number of
        batches this rank's DataLoader has returned in this pass; without it,
        the rows this process's own iterator has yielded (exact with
        num_workers=0 only). Any rank's state resumes the whole job, on any
        world size.
        """
        if batches is None:
            consumed = self._yielded
        else:
            consumed = _index(batches, "batches") * self.batch_size
        consumed = min(consumed, len(self))
        return self._state_at(self.epoch, self._start + consumed * self.world_size)

    def _state_at(self, epoch: int, position: int) -> dict:
        return json.loads(self._open().state_json(epoch, position))

    def load_state_dict(self, state: dict) -> None:
        """Go on from a `state_dict()` of any reader of the package, taken on
        any world size: its epoch, from its position.

        A state of another dataset or another seed, or not a reader's state,
        is refused (ValueError).
        """
        if not isinstance(state, dict) or state.get("format") != "prep-stream":
            keys = sorted(state) if isinstance(state, dict) else type(state).__name__
            raise ValueError(
                f"not a prep reader state (a dict with format 'prep-stream'; got {keys}): states of "
                "PackedDataset and DeviceLoader before their order became the stream's cannot be resumed "
                "in it; start the epoch again")
        stream = self._new_stream(state)
        stream.check_cache(self.world_size)
        self._stream, self._state, self._pid = stream, dict(state), os.getpid()
        self.epoch = _index(state["epoch"], "epoch")
        self._start = _index(state["position"], "position")
        self._yielded = 0

    def _worker(self) -> tuple[int, int]:
        if torch is not None:
            info = torch.utils.data.get_worker_info()
            if info is not None:
                return info.id, info.num_workers
        return 0, 1


# Rows StreamingDataset takes from its reader per call when it yields them a
# row at a time.
_ROWS_A_CALL = 64


class StreamingDataset(_Reader, _Base):
    """The rows of a packed dataset, in a local directory or in storage,
    streamed through a bounded cache.

    Yields each row as a writable numpy array of the dataset's dtype (uint16
    or uint32), of shape (seq_len,), over its own copy of the row (so a
    DataLoader's collate takes it without a warning). An `IterableDataset`
    when torch is present; a plain iterable otherwise.

    Arguments: those of every reader (`_Reader`: source, seed, epoch, rank,
    world_size, batch_size, cache_dir, cache_limit, local_world_size,
    block_bytes, window, streams, in_flight); ranks of a node may share one
    cache_dir, each block is then downloaded once for all of them, and a
    local directory's blocks are read into memory under the same limit.
    `batch_size` is the DataLoader's, so that with `num_workers > 0` the
    DataLoader returns this rank's rows in order (worker w of K produces
    batches w, w + K, ...). `indices=True` yields (dataset index, row)
    pairs instead of rows; `batched=True` yields whole batches of
    `batch_size` rows instead, each a writable (batch_size, seq_len) array
    gathered in one call (the last may be shorter), with `indices=True` as
    (indices, batch): give it to a DataLoader with `batch_size=None`.

    A `cache_limit` that no plan fits (or, resuming, below what the state's
    plan needs on this world) is refused here (ValueError, with the number),
    not discovered as a hang.
    """

    def __init__(self, source: str | os.PathLike, *, indices: bool = False, batched: bool = False,
                 **reader: Any):
        if torch is not None:
            _Base.__init__(self)
        _Reader.__init__(self, source, **reader)
        self.with_indices = bool(indices)
        self.batched = bool(batched)

    def __iter__(self) -> Iterator[np.ndarray]:
        worker, workers = self._worker()
        reader = self._open().reader(self.epoch, self._start, self.rank, self.world_size, worker, workers,
                                     self.batch_size)
        dtype, seq_len = self.dtype, self.seq_len
        self._yielded = 0
        if self.batched:
            while (got := reader.next_batch(self.batch_size)) is not None:
                indices, rows = got
                batch = np.frombuffer(rows, dtype=dtype).reshape(-1, seq_len)
                self._yielded += len(batch)
                yield (np.frombuffer(indices, dtype="<u8"), batch) if self.with_indices else batch
            return
        # Rows a row at a time, taken from the reader in groups of up to
        # _ROWS_A_CALL: one crossing into the extension per group rather than
        # per row. The groups start at one row and double, so the first row
        # waits for its own block only (a group's rows come from as many
        # streams). Each row is a writable view of its group's buffer (the
        # one copy out of the cache); the order and what state_dict counts
        # are the rows yielded, as before.
        n = 1
        while (got := reader.next_batch(n)) is not None:
            n = min(2 * n, _ROWS_A_CALL)
            indices, rows = got
            group = np.frombuffer(rows, dtype=dtype).reshape(-1, seq_len)
            if self.with_indices:
                for index, row in zip(np.frombuffer(indices, dtype="<u8").tolist(), group):
                    self._yielded += 1
                    yield index, row
            else:
                for row in group:
                    self._yielded += 1
                    yield row


if torch is not None:
    __all__.append("PackedDataset")

    class PackedDataset(_Reader, torch.utils.data.IterableDataset):
        """The rows of a local packed dataset read in place, as int64 tensors,
        in the order every reader of the package reads (`StreamingDataset`'s
        for the same arguments), with `targets` or `labels` for training.

        `PackedDataset(path, seed=0, ..., targets=False, labels=False)`: the
        arguments of every reader (`_Reader`); the rows are numpy views of
        the mapped shards (`prep.Dataset`), widened to int64, so the dataset
        may carry loss masks and segments. Yields each row as an int64
        tensor of shape (seq_len,), or with `targets=True` the pair
        (row[:-1], row[1:]), both of shape (seq_len - 1,): pack with
        `--seq-len C+1` for a model of context C.

        DataLoader workers: pass the DataLoader's `batch_size` here too (1 if
        the DataLoader has batch_size=None). The rank's rows are cut into
        batches of batch_size, and worker w of K produces batches w, w + K,
        w + 2K, ...; the DataLoader takes one batch from each worker in turn,
        so what it returns, in order, is exactly the rank's rows in order,
        for any num_workers. Leave `drop_last` off, and do not use
        `persistent_workers=True` with set_epoch or load_state_dict:
        persistent workers keep the copy of this object they started with.

        Resuming: `state_dict(batches=b)` after b batches have come out of
        the DataLoader in this pass, and `load_state_dict(state)` in the new
        run, on any world size, by any reader of the package.

        Fine-tuning: with `labels=True` each row comes as a dict of int64
        tensors for a model of context C = seq_len - 1 (pack with `--seq-len
        C+1`), the shift done once, here:

          - `input_ids`: row[:-1];
          - `labels`: labels[j] is the target of position j, row[j + 1], or
            -100 where it must not be trained on: where the loss mask of token
            j + 1 is 0 (a dataset from `prep tokenize --chat`; a dataset
            without masks trains on every document token), where token j + 1
            starts another piece than token j's (no label crosses a document
            boundary, whatever the tokens are: the segment index says where
            documents end, not eos), and on padding;
          - `position_ids`: 0 at the start of every piece and of the padding
            (prep.attention.position_ids);
          - `cu_seqlens` (int32) and `max_seqlen`: the pieces' boundaries
            for flash-attention's varlen kernels, the padding one more
            sequence (prep.attention.cu_seqlens). cu_seqlens differs in length
            from row to row: batch with `batch_size=None` in the DataLoader
            and a collate of your own, or concatenate rows yourself.

        Attributes: `dataset` (the `prep.Dataset`), and every reader's.
        """

        def __init__(self, path: str | os.PathLike, seed: int = 0, epoch: int = 0, *,
                     targets: bool = False, labels: bool = False, **reader: Any):
            from .reader import Dataset

            torch.utils.data.IterableDataset.__init__(self)
            self.dataset = path if isinstance(path, Dataset) else Dataset(path)
            if self.dataset.seq_len is None:
                raise ValueError(f"{self.dataset.path}: a {self.dataset.kind} dataset; "
                                 f"PackedDataset reads packed datasets (prep pack)")
            if targets and labels:
                raise ValueError("targets=True and labels=True are two forms of the same pairs; pass one")
            if (targets or labels) and self.dataset.seq_len < 2:
                raise ValueError("targets=True and labels=True need rows of at least 2 tokens")
            _Reader.__init__(self, self.dataset.path, seed=seed, epoch=epoch, **reader)
            self.targets, self.labels = bool(targets), bool(labels)

        def __iter__(self) -> Iterator:
            worker, workers = self._worker()
            b, start, world = self.batch_size, self._start, self.world_size
            n_rows = len(self)
            n_batches = -(-n_rows // b)
            order, ds, targets, epoch = self._open(), self.dataset, self.targets, self.epoch
            self._yielded = 0
            # Several of this worker's batches per call into the order, to
            # amortise the crossing and numpy's overhead.
            group = max(1, 4096 // b)
            lanes = np.arange(b, dtype=np.uint64)
            for first in range(worker, n_batches, workers * group):
                batches = np.arange(first, min(first + workers * group, n_batches), workers, dtype=np.uint64)
                rows = (batches[:, None] * b + lanes).ravel()
                rows = rows[rows < n_rows]
                positions = start + self.rank + rows * world
                indices = np.frombuffer(order.at(epoch, positions.astype("<u8").tobytes()), dtype="<u8")
                for i in indices.tolist():
                    self._yielded += 1
                    if self.labels:
                        yield self.example(i)
                        continue
                    row = torch.from_numpy(ds[i].astype(np.int64))
                    yield (row[:-1], row[1:]) if targets else row

        def example(self, i: int) -> dict:
            """Row `i` as `labels=True` yields it (see the class docs)."""
            ds = self.dataset
            row = ds[i].astype(np.int64)
            n = len(row) - 1
            # The pieces end to end (as `segments` checks them), cut at n,
            # the padding one more piece: what prep.attention computes.
            lengths = ds.segments(i)["length"].astype(np.int64)
            ends = np.cumsum(lengths)
            piece = np.full(len(row), -1, dtype=np.int64)  # -1: padding
            piece[:int(ends[-1]) if len(ends) else 0] = np.repeat(np.arange(len(lengths)), lengths)
            trained = (piece[1:] == piece[:-1]) & (piece[1:] >= 0)
            if ds.has_loss_mask:
                trained &= ds.loss_mask(i)[1:] == 1
            cut = np.minimum(ends, n)
            cut = np.diff(np.concatenate(([0], cut)))
            cut = cut[cut > 0]
            if cut.sum() < n:
                cut = np.append(cut, n - cut.sum())
            cu = np.concatenate(([0], np.cumsum(cut))).astype(np.int32)
            positions = np.arange(n, dtype=np.int64) - np.repeat(cu[:-1].astype(np.int64), cut)
            return {
                "input_ids": torch.from_numpy(row[:-1].copy()),
                "labels": torch.from_numpy(np.where(trained, row[1:], -100)),
                "position_ids": torch.from_numpy(positions),
                "cu_seqlens": torch.from_numpy(cu),
                "max_seqlen": int(cut.max()) if len(cut) else 0,
            }
