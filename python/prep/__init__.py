"""prep's datasets from Python: the zero-copy reader, the training sampler,
PyTorch's PackedDataset and the attention helpers.

    pip install .        # in a clone of prep: this package (prep-llm) and the `prep` command

    import prep
    ds = prep.Dataset("data/packed-2049")          # numpy views of the mapped shards
    for i in prep.Sampler(len(ds), seed=1, epoch=0, rank=rank, world_size=world):
        row, pieces = ds[i], ds.segments(i)
        cu, max_len = prep.attention.cu_seqlens(pieces, len(row))

`prep.StreamingDataset` reads a packed dataset straight from object storage
through a bounded local cache (docs/streaming.md), and `prep.DeviceLoader`
delivers a packed dataset's batches into GPU memory as torch tensors
(docs/reading.md); `prep.Tokenizer` encodes text with prep's fast
tokenizer engine, ids identical to HF tokenizers'. All three run prep's Rust
code through the package's extension module.

`prep.reader` is also the one file to copy for code that does not install
the package (see its docstring); `prep.PackedDataset` needs torch, and raises
ImportError when torch cannot be imported. The command is the same program
as `cargo install --path .` builds from the repository: `prep --help`.

The names below are imported on first use, not with the package: the
console script `prep` (prep._cli) imports this package first, and the
reader brings numpy and, where it is installed, torch (seconds), which the
command does not need.
"""

from __future__ import annotations

import importlib

# Not `typing.TYPE_CHECKING`: typing alone costs the command tens of ms.
# Type checkers read this block; Python never runs it.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from . import attention, device, reader, streaming, tokenizer
    from .device import DeviceLoader
    from .tokenizer import Tokenizer
    from .streaming import PackedDataset, StreamingDataset
    from .reader import (
        FORMAT_VERSION,
        MAX_MANIFEST_BYTES,
        SEGMENT_DTYPE,
        Dataset,
        FormatError,
        Permutation,
        Sampler,
        SegmentError,
        UnsupportedVersion,
    )

# Every public name of `prep` and the submodule it comes from: the one list
# (the TYPE_CHECKING block above repeats it for type checkers, and
# tests/python/test_package.py holds the two equal). PackedDataset is offered
# only where torch imports.
_NAMES = {
    "FORMAT_VERSION": "reader",
    "MAX_MANIFEST_BYTES": "reader",
    "SEGMENT_DTYPE": "reader",
    "Dataset": "reader",
    "FormatError": "reader",
    "PackedDataset": "streaming",
    "Permutation": "reader",
    "Sampler": "reader",
    "SegmentError": "reader",
    "UnsupportedVersion": "reader",
    "DeviceLoader": "device",
    "StreamingDataset": "streaming",
    "Tokenizer": "tokenizer",
}
_SUBMODULES = ("attention", "device", "reader", "streaming", "tokenizer")


def _all() -> list[str]:
    from . import streaming

    return [*(n for n in _NAMES if n != "PackedDataset" or n in streaming.__all__), *_SUBMODULES]


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("prep-llm")
    except PackageNotFoundError:  # imported from a source tree, not installed
        return "unknown"


def __getattr__(name: str) -> object:
    if name in _SUBMODULES:
        value: object = importlib.import_module(f".{name}", __name__)
    elif name in _NAMES:
        module = importlib.import_module(f".{_NAMES[name]}", __name__)
        if name not in module.__all__:
            raise ImportError(f"prep.{name} needs torch, which could not be imported")
        value = getattr(module, name)
    elif name == "__all__":
        value = _all()
    elif name == "__version__":
        value = _version()
    else:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    globals()[name] = value  # the next lookup finds it without this function
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_NAMES, *_SUBMODULES, "__all__", "__version__"})
