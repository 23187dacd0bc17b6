"""Training straight from object storage: `prep.StreamingDataset`.

A packed dataset at an `s3://`, `gs://`, `az://`, `https://` address (or a
local directory) is read in blocks of rows through a local cache directory
that never holds more than `cache_limit` bytes. The order, the fetching,
the checks and the cache are prep's Rust reader (`prep::stream`), called
through the package's extension module: one implementation for the `prep`
command, Rust training loops and this class.

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

__all__ = ["StreamingDataset", "parse_size"]


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


class StreamingDataset(_Base):
    """The rows of a packed dataset in storage, streamed through a bounded cache.

    Yields each row as a writable numpy array of the dataset's dtype (uint16
    or uint32), of shape (seq_len,), over its own copy of the row (so a
    DataLoader's collate takes it without a warning). An `IterableDataset`
    when torch is present; a plain iterable otherwise.

    Arguments: `url` (a store address or a local directory); `cache_dir` and
    `cache_limit` (bytes, or a size string such as "20GiB"): ranks of a node
    may share one cache_dir, each block is then downloaded once for all of
    them; `seed`, `epoch`; `rank`, `world_size` (default: torch.distributed's,
    else the RANK and WORLD_SIZE variables, else 0 and 1); `batch_size`: the
    DataLoader's, so that with `num_workers > 0` the DataLoader returns this
    rank's rows in order (worker w of K produces batches w, w + K, ...);
    `local_world_size`: ranks sharing cache_dir (default LOCAL_WORLD_SIZE,
    else 1); `block_bytes`, `window`, `streams`: the order's parameters,
    chosen to fit `cache_limit` on this world where left out (`plan` says
    what was chosen; docs/streaming.md; every rank must then be given the
    same cache_limit and local_world_size, as torchrun's are, or their
    orders differ); `in_flight`: fetches at once;
    `indices=True` yields (dataset index, row) pairs instead of rows;
    `batched=True` yields whole batches of `batch_size` rows instead, each a
    writable (batch_size, seq_len) array gathered in one call (the last may
    be shorter), with `indices=True` as (indices, batch): give it to a
    DataLoader with `batch_size=None`.

    A `cache_limit` that no plan fits (or, resuming, below what the state's
    plan needs on this world) is refused here (ValueError, with the number),
    not discovered as a hang.
    """

    def __init__(self, url: str | os.PathLike, *, cache_dir: str | os.PathLike, cache_limit: int | str,
                 seed: int = 0, epoch: int = 0, rank: int | None = None, world_size: int | None = None,
                 batch_size: int = 1, local_world_size: int | None = None,
                 block_bytes: int | str | None = None, window: int | None = None, streams: int | None = None,
                 in_flight: int | None = None, indices: bool = False, batched: bool = False):
        if torch is not None:
            super().__init__()
        default_rank, default_world = default_rank_and_world()
        self.url = os.fspath(url)
        self.cache_dir = os.fspath(cache_dir)
        self.cache_limit = parse_size(cache_limit)
        self.seed = operator.index(seed)
        self.rank = default_rank if rank is None else operator.index(rank)
        self.world_size = default_world if world_size is None else operator.index(world_size)
        if not 0 <= self.rank < self.world_size:
            raise ValueError(f"rank {self.rank} of world_size {self.world_size}")
        self.batch_size = operator.index(batch_size)
        if self.batch_size < 1:
            raise ValueError(f"batch_size must be at least 1, not {self.batch_size}")
        if local_world_size is None:
            local_world_size = int(os.environ.get("LOCAL_WORLD_SIZE", 1))
        self.local_world_size = operator.index(local_world_size)
        # None: chosen by prep::stream to fit cache_limit on this world
        # (docs/streaming.md, "The cache it needs"), kept there alone.
        self._params = {"block_bytes": None if block_bytes is None else parse_size(block_bytes),
                        "window": None if window is None else operator.index(window),
                        "streams": None if streams is None else operator.index(streams),
                        "in_flight": None if in_flight is None else operator.index(in_flight)}
        self.epoch = operator.index(epoch)
        self.with_indices = bool(indices)
        self.batched = bool(batched)
        self._start = 0  # global position this pass starts from
        self._yielded = 0  # rows this process's iterator yielded in this pass
        self._state: dict | None = None  # the state loaded, which fixes the order's parameters
        self._stream, self._pid = None, os.getpid()
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

    def __iter__(self) -> Iterator[np.ndarray]:
        worker, workers = 0, 1
        if torch is not None:
            info = torch.utils.data.get_worker_info()
            if info is not None:
                worker, workers = info.id, info.num_workers
        reader = self._open().reader(self.epoch, self._start, self.rank, self.world_size, worker, workers,
                                     self.batch_size)
        dtype = self.dtype
        self._yielded = 0
        if self.batched:
            seq_len = self.seq_len
            while (got := reader.next_batch(self.batch_size)) is not None:
                indices, rows = got
                batch = np.frombuffer(rows, dtype=dtype).reshape(-1, seq_len)
                self._yielded += len(batch)
                yield (np.frombuffer(indices, dtype="<u8"), batch) if self.with_indices else batch
            return
        for index, row in reader:
            self._yielded += 1
            row = np.frombuffer(row, dtype=dtype)
            yield (index, row) if self.with_indices else row

    def indices(self) -> np.ndarray:
        """The dataset indices of the rows this rank reads in this pass, in order (uint64)."""
        return np.frombuffer(self._open().indices(self.epoch, self._start, self.rank, self.world_size),
                             dtype="<u8")

    def set_epoch(self, epoch: int) -> None:
        """Start epoch `epoch` from its first position (the next iteration reads it)."""
        self.epoch = operator.index(epoch)
        self._start = self._yielded = 0

    def state_dict(self, batches: int | None = None) -> dict:
        """Where the job stands, as a dict of JSON values.

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
            batches = operator.index(batches)
            if batches < 0:
                raise ValueError(f"batches must not be negative, not {batches}")
            consumed = batches * self.batch_size
        consumed = min(consumed, len(self))
        position = self._start + consumed * self.world_size
        return json.loads(self._open().state_json(self.epoch, position))

    def load_state_dict(self, state: dict) -> None:
        """Go on from a `state_dict()`, taken on any world size: its epoch, from its position.

        A state of another dataset or another seed is refused (ValueError).
        """
        stream = self._new_stream(state)
        stream.check_cache(self.world_size)
        self._stream, self._state, self._pid = stream, dict(state), os.getpid()
        self.epoch = operator.index(state["epoch"])
        self._start = operator.index(state["position"])
        self._yielded = 0
