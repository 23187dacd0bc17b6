"""prep's datasets from Python: the zero-copy reader, the training sampler,
PyTorch's PackedDataset and the attention helpers.

    pip install .        # in a clone of prep: this package (prep-llm) and the `prep` command

    import prep
    ds = prep.Dataset("data/packed-2049")          # numpy views of the mapped shards
    for i in prep.Sampler(len(ds), seed=1, epoch=0, rank=rank, world_size=world):
        row, pieces = ds[i], ds.segments(i)
        cu, max_len = prep.attention.cu_seqlens(pieces, len(row))

`prep.reader` is also the one file to copy for code that does not install
the package (see its docstring); `prep.PackedDataset` needs torch, and raises
ImportError when torch cannot be imported. The command is the same program
as `cargo install --path .` builds from the repository: `prep --help`.
"""

from . import attention
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
from . import reader as _reader

try:
    from importlib.metadata import PackageNotFoundError, version as _version

    __version__ = _version("prep-llm")
except PackageNotFoundError:  # imported from a source tree, not installed
    __version__ = "unknown"

__all__ = [
    "FORMAT_VERSION",
    "MAX_MANIFEST_BYTES",
    "SEGMENT_DTYPE",
    "Dataset",
    "FormatError",
    "Permutation",
    "Sampler",
    "SegmentError",
    "UnsupportedVersion",
    "attention",
]
if "PackedDataset" in _reader.__all__:
    from .reader import PackedDataset

    __all__.append("PackedDataset")


def __getattr__(name: str):
    if name == "PackedDataset":
        raise ImportError("prep.PackedDataset needs torch, which could not be imported")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
