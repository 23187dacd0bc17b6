"""prep.DeviceLoader: batches of a packed dataset straight into GPU memory,
as torch tensors, through prep's Rust loader (prep._native.CudaLoader).

    loader = prep.DeviceLoader("data/packed-2049", batch_size=32, device=0, seed=1)
    for batch in loader:                  # int64 tensor (32, 2049) on cuda:0
        inputs, targets = batch[:, :-1], batch[:, 1:]
        ...

It is one of the package's readers (prep.streaming._Reader): the same
arguments and defaults, the rows in the same order as `prep.StreamingDataset`
and `prep.PackedDataset` read them, and the same `state_dict()`, which any of
them loads. A local dataset's rows are read in place; one in object storage
(`s3://...`, with `cache_dir`) through the stream's bounded cache. A
background thread gathers each batch's rows into a pinned staging buffer
and copies it to the device on its own stream, up to `depth` batches ahead;
ids are widened to int64 (or int32) on the device. `device="cpu"` runs the
same loader into host memory (torch CPU tensors).
With `gather="device"` (a kernel) or `gather="dma"` (the copy engines)
the GPU reads the rows from the dataset's files itself (page-locked in
place; a local dataset only), which is faster where host memory is the
limit. The tensor is the
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
from typing import Any, Iterator

import numpy as np

from .streaming import _Reader

__all__ = ["DeviceLoader"]

_WIDEN = {"int64": "i64", "int32": "i32", None: "none"}


class DeviceLoader(_Reader):
    """One rank's batches of a packed dataset, in GPU memory, epoch after epoch.

    Arguments: those of every reader (prep.streaming._Reader: `source`, a
    local directory or a store address; `seed`, `epoch`, `rank`,
    `world_size`, `cache_dir`, `cache_limit`, `local_world_size`,
    `block_bytes`, `window`, `streams`, `in_flight`); `batch_size` (rows per
    batch; an epoch's last batch may have fewer); `device` (the GPU
    ordinal, default torch's current device, or "cpu": the same loader into
    host memory); `epochs` (stop after this many epochs from `epoch`; None
    runs until the loader is dropped); `depth` (batches prepared ahead);
    `threads` (gather threads, 0: one per core); `dtype`: "int64" (default,
    what nn.Embedding takes), "int32", or None for the ids as stored (uint16
    or uint32); `gather`: "host" (the loader's threads copy rows into pinned
    staging buffers, the default) or, for a local dataset, "device" (a
    kernel on the GPU reads each row from the dataset's files, page-locked
    in place: fewer passes over host memory, for a dataset that fits in it)
    or "dma" (the GPU's copy engines copy each row from there: one pass, as
    a plain pinned copy; CUDA 12.8 or newer).

    `state_dict()` is where the next batch starts; `load_state_dict(state)`
    (any reader's state, from any world size) starts the next iteration
    there.
    """

    def __init__(self, source: Any, *, batch_size: int, device: int | str | None = None,
                 epochs: int | None = None, depth: int = 4, threads: int = 0,
                 dtype: str | None = "int64", gather: str = "host", **reader: Any):
        if dtype not in _WIDEN:
            raise ValueError(f"dtype must be 'int64', 'int32' or None, not {dtype!r}")
        super().__init__(source, batch_size=batch_size, **reader)
        if device is None:
            import torch

            device = torch.cuda.current_device() if torch.cuda.is_available() else 0
        self.device = device if device == "cpu" else operator.index(device)
        self.epochs = None if epochs is None else operator.index(epochs)
        self.depth, self.threads = operator.index(depth), operator.index(threads)
        self.widen, self.gather = dtype, gather
        self._resume = (self.epoch, self._start)
        self._active = None
        self._native_loader = self._new_loader()

    def _new_loader(self):
        from . import _native

        epoch, position = self._resume
        end = None if self.epochs is None else self.epoch + self.epochs
        args = (self._open(), self.batch_size, self.depth, self.rank, self.world_size, epoch, position, end,
                self.threads)
        if self.device == "cpu":
            if self.gather != "host":
                raise ValueError(f"gather={self.gather!r} is the GPU's; device='cpu' gathers on the host")
            return _native.HostLoader(*args)
        stream, batch_rows, depth, rank, world, epoch, position, end, threads = args
        return _native.CudaLoader(stream, self.device, batch_rows, depth, rank, world, epoch, position, end,
                                  threads, _WIDEN[self.widen], self.gather)

    @property
    def seq_len(self) -> int:
        return self._open().seq_len

    def __iter__(self) -> Iterator[Any]:
        import torch

        if self._native_loader is None:
            self._native_loader = self._new_loader()
        # The native loader of this pass (`_active`), made anew from where
        # the next pass starts.
        loader, self._native_loader = self._native_loader, None
        self._active = loader
        if self.device == "cpu":
            dtype = None if self.widen is None else np.dtype(self.widen)
            while (got := loader.next()) is not None:
                _, _, resume, rows = got
                self._resume = resume
                self.epoch = resume[0]
                batch = np.frombuffer(rows, dtype=self.dtype).reshape(-1, self.seq_len)
                yield torch.from_numpy(batch if dtype is None else batch.astype(dtype))
            return
        device = torch.device("cuda", self.device)
        while True:
            stream = torch.cuda.current_stream(device)
            batch = loader.next(stream.cuda_stream)
            if batch is None:
                return
            self._resume = batch.resume_at
            self.epoch = self._resume[0]
            # The tensor holds the batch, which goes back to the ring with
            # the last tensor over it; this frame keeps no reference to
            # either while the consumer has them (a list emptied on the
            # way out).
            hand = [batch]
            del batch
            yield torch.as_tensor(hand.pop(), device=device)

    def state_dict(self, batches: int | None = None) -> dict:
        """Where the next batch starts, as every reader's state (batches
        taken from this loader count themselves: `batches` is not needed)."""
        return self._state_at(*self._resume)

    def load_state_dict(self, state: dict) -> None:
        super().load_state_dict(state)
        self._restart((self.epoch, self._start))

    def set_epoch(self, epoch: int) -> None:
        super().set_epoch(epoch)
        self._restart((self.epoch, 0))

    def _restart(self, at: tuple[int, int]) -> None:
        # The loader made for the old start stops first: its producer reads
        # ahead through the same cache, whose room the new one needs.
        self._native_loader = self._active = None
        self._resume = at
        self._native_loader = self._new_loader()
