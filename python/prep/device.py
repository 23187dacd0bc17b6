"""prep.DeviceLoader: batches of a packed dataset straight into GPU memory,
as torch tensors, through prep's Rust loader (prep._native.CudaLoader).

    loader = prep.DeviceLoader("data/packed-2049", batch_size=32, device=0, seed=1)
    for batch in loader:                  # int64 tensor (32, 2049) on cuda:0
        inputs, targets = batch[:, :-1], batch[:, 1:]
        ...

A background thread gathers each batch's rows (in prep.Sampler's order:
this rank's share of a seeded permutation, a new one each epoch) into a
pinned staging buffer and copies it to the device on its own stream, up to
`depth` batches ahead; ids are widened to int64 (or int32) on the device.
With `gather="device"` (a kernel) or `gather="dma"` (the copy engines)
the GPU reads the rows from the dataset's files itself (page-locked in
place), which is faster where host memory is the limit. The tensor is the
loader's memory, handed over without a copy (`__cuda_array_interface__`),
and the loader keeps the stream rules itself:

- torch's current stream (when the batch is taken) waits on the device
  for the batch's copy; the host does not wait.
- The memory goes back to the loader when the last tensor over it is
  freed, after the work queued on that stream by then, as torch's own
  allocator reuses freed memory. A tensor kept past its step stays valid
  but holds one of the `depth` buffers; holding all of them while asking
  for the next batch is refused (RuntimeError), not a hang. Work on other
  streams must be joined into that stream before the tensor is freed.

Where there is no CUDA driver or no such device, construction raises
RuntimeError saying so. docs/reading.md has the details.
"""

from __future__ import annotations

import operator
import os
from typing import Any, Iterator

from ._world import default_rank_and_world

__all__ = ["DeviceLoader"]

_WIDEN = {"int64": "i64", "int32": "i32", None: "none"}


class DeviceLoader:
    """One rank's batches of a packed dataset, in GPU memory, epoch after epoch.

    Arguments: `path` (a local packed dataset); `batch_size` (rows per
    batch; an epoch's last batch may have fewer); `device` (the GPU
    ordinal, default torch's current device); `seed`; `epoch`, `position`
    (where to start: the epoch and the sampler position within it, as
    `state_dict` gives); `epochs` (stop after this many epochs from
    `epoch`; None runs until the loader is dropped); `rank`, `world_size`
    (default torch.distributed's, else RANK and WORLD_SIZE, else 0 and 1);
    `depth` (batches prepared ahead); `threads` (gather threads, 0: one per
    core); `dtype`: "int64" (default, what nn.Embedding takes), "int32", or
    None for the ids as stored (uint16 or uint32); `gather`: "host" (the
    loader's threads copy rows into pinned staging buffers, the default) or
    "device" (a kernel on the GPU reads each row from the dataset's files,
    page-locked in place: fewer passes over host memory, for a dataset that
    fits in it) or "dma" (the GPU's copy engines copy each row from there:
    one pass, as a plain pinned copy; CUDA 12.8 or newer).
    """

    def __init__(self, path: str | os.PathLike, *, batch_size: int, device: int | None = None,
                 seed: int = 0, epoch: int = 0, position: int = 0, epochs: int | None = None,
                 rank: int | None = None, world_size: int | None = None, depth: int = 4,
                 threads: int = 0, dtype: str | None = "int64", gather: str = "host"):
        import torch

        from . import _native

        if dtype not in _WIDEN:
            raise ValueError(f"dtype must be 'int64', 'int32' or None, not {dtype!r}")
        default_rank, default_world = default_rank_and_world()
        rank = default_rank if rank is None else operator.index(rank)
        world_size = default_world if world_size is None else operator.index(world_size)
        if not 0 <= rank < world_size:
            raise ValueError(f"rank {rank} of world_size {world_size}")
        if device is None:
            device = torch.cuda.current_device() if torch.cuda.is_available() else 0
        self.device = operator.index(device)
        self.epoch, self.position = operator.index(epoch), operator.index(position)
        end = None if epochs is None else self.epoch + operator.index(epochs)
        self._native = _native.CudaLoader(
            os.fspath(path), self.device, operator.index(batch_size), operator.index(depth),
            operator.index(seed), rank, world_size, self.epoch, self.position, end,
            operator.index(threads), _WIDEN[dtype], gather)
        self.seq_len = self._native.row_tokens

    def __iter__(self) -> Iterator[Any]:
        import torch

        device = torch.device("cuda", self.device)
        while True:
            stream = torch.cuda.current_stream(device)
            batch = self._native.next(stream.cuda_stream)
            if batch is None:
                return
            self.epoch, self.position = batch.resume_at
            # The tensor holds the batch, which goes back to the ring with
            # the last tensor over it; this frame keeps no reference to
            # either while the consumer has them (a list emptied on the
            # way out).
            hand = [batch]
            del batch
            yield torch.as_tensor(hand.pop(), device=device)

    def state_dict(self) -> dict:
        """Where the next batch starts: the epoch and the sampler position
        after the batches taken so far."""
        return {"epoch": self.epoch, "position": self.position}
