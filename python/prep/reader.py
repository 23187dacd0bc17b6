"""Read prep datasets from a Python training loop: one file, numpy only.

Installed with pip (the distribution prep-llm: `pip install .` in the prep
repository, beside the `prep` command) this is
`prep.reader`, and everything below is importable from `prep` itself:
`from prep import Dataset, Sampler`. Training code that does not install
the package copies this one file (python/prep/reader.py in the prep
repository) beside itself as prep_reader.py instead:
`from prep_reader import Dataset, Sampler`. It imports nothing of prep.

It reads the on-disk format of prep (crates/reader/src/format/FORMAT.md in the prep
repository), versions 1 and 2, and draws records in the order of prep's
training sampler, bit for bit:

    from prep import Dataset, Sampler

    ds = Dataset("data/packed-2049")             # manifest.json + shards
    row = ds[0]                                  # numpy view of the mapped .bin, no copy
    pieces = ds.segments(0)                      # packed datasets: the row's documents
    for i in Sampler(len(ds), seed=1, epoch=0, rank=rank, world_size=world):
        train_on(ds[i])

A dataset of `prep tokenize --chat` (version 2) also carries a loss mask: one
byte per token, 1 where the token is a target (an assistant reply), 0 where
its label is left out of the loss:

    ds = Dataset("data/chat")
    if ds.has_loss_mask:
        ids, mask = ds[0], ds.loss_mask(0)       # same length; mask is uint8, 0 or 1

For training, the package's readers (`prep.PackedDataset`, which reads a
local dataset in place through this file's `Dataset`; `prep.StreamingDataset`
and `prep.DeviceLoader`) read in one order, with one resume state, from a
directory, a bucket or into GPU memory; they need the package's extension
module, so they are not part of this file (prep.streaming, docs/reading.md).

Everything that could be wrong with the files is checked when a dataset is
opened, as prep's own reader does (headers, sizes, offsets, row indexes;
not the checksums: `prep validate` checks those), and a packed row's
pieces when `segments` hands them out; a problem is reported as a
`FormatError` naming the file. A newer format than this file knows raises
`UnsupportedVersion`: get a newer prep (or prep_reader.py).
"""

from __future__ import annotations

import bisect
import json
import mmap
import operator
import os
import struct
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

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
]  # prep.PackedDataset is prep.streaming's (it needs the package's extension module)

FORMAT_VERSION = 2
"""The newest manifest version this file reads; newer ones are refused.
Version 1 is a dataset without loss masks, version 2 one whose every shard
has a .mask file."""

_HEADER_VERSION = 1  # of .idx and .seg headers, in datasets of both versions

SEGMENT_DTYPE = np.dtype([("doc", "<u8"), ("doc_offset", "<u8"), ("start", "<u4"), ("length", "<u4")])
"""One piece of a packed row, as a .seg file stores it (24 bytes)."""

_IDX_MAGIC = b"PREPIDX\0"
_SEG_MAGIC = b"PREPSEG\0"
_IDX_HEADER = struct.Struct("<8sIB3sQQ")  # magic, version, token size, reserved, records, tokens
_SEG_HEADER = struct.Struct("<8sIIQQ")  # magic, version, seq_len, rows, segments
_HEADER_LEN = 32
_DTYPES = {"uint16": np.dtype("<u2"), "uint32": np.dtype("<u4")}
MAX_MANIFEST_BYTES = 256 << 20
"""The largest manifest.json read (FORMAT.md, Limits); prep's own reader has the same."""
_MAX_SEQ_LEN = (1 << 32) - 1
_U64 = 1 << 64


class FormatError(ValueError):
    """A file of the dataset is not what the format says; `path` names it."""

    def __init__(self, path: os.PathLike | str, message: str):
        self.path = Path(path)
        super().__init__(f"{path}: {message}")


class UnsupportedVersion(FormatError):
    """A file has a format version this reader does not know (a newer prep wrote it)."""

    def __init__(self, path: os.PathLike | str, found: int, supported: int = FORMAT_VERSION):
        self.found, self.supported = found, supported
        super().__init__(path, f"format version {found}, but this reader reads version "
                               f"{supported}: install a newer prep (prep-llm), or copy the "
                               f"prep_reader.py of a newer prep")


class SegmentError(FormatError):
    """A packed row's entries in a .seg file break the rules of the row (an
    empty piece, a gap or overlap, a piece past `seq_len`); `path` names the
    .seg file, `row` the row within the shard, `entry` the entry's number in
    the file."""

    def __init__(self, path: os.PathLike | str, row: int, entry: int, message: str):
        self.row, self.entry = row, entry
        super().__init__(path, f"row {row}, entry {entry}: {message}")


def _check_row(path: Path, row: int, first: int, pieces: np.ndarray, seq_len: int) -> np.ndarray:
    """Returns `pieces` (row `row`'s entries, the first being entry `first` of
    the .seg file at `path`) if they obey the rule of a packed row, else
    raises SegmentError for the first piece that does not: each piece is at
    least one token long, the pieces lie back to back from position 0, and
    the last ends at or before `seq_len`. The same rule, in the same order
    and words, as prep's `format::row_violation`; the arithmetic is in int64,
    so no u32 entry overflows it."""
    if len(pieces) == 0:
        return pieces  # a row of padding only
    length = pieces["length"].astype(np.int64)
    end = pieces["start"].astype(np.int64) + length
    expected = np.concatenate(([0], end[:-1]))
    bad = (length == 0) | (pieces["start"] != expected) | (end > seq_len)
    if not bad.any():
        return pieces
    k = int(np.argmax(bad))
    if length[k] == 0:
        message = f"piece {k} is empty"
    elif pieces["start"][k] != expected[k]:
        message = f"piece {k} starts at {pieces['start'][k]}, expected {expected[k]}"
    else:
        message = f"piece {k} ends at {end[k]}, past the row's {seq_len} tokens"
    raise SegmentError(path, row, first + k, message)


# --- Opening a dataset -------------------------------------------------------------------------

def _count(value: Any, path: Path, what: str) -> int:
    """A manifest integer that counts something: an int (not a bool) in 0..2^64."""
    if type(value) is not int or not 0 <= value < _U64:
        raise FormatError(path, f"{what} is {value!r}, not a non-negative integer")
    return value


def _relative(value: Any, path: Path, what: str) -> str:
    """A shard file name: relative, '/'-separated, never leaving the dataset directory."""
    ok = (isinstance(value, str) and value and "\\" not in value and not value.startswith("/")
          and all(part not in ("", ".", "..") for part in value.split("/")))
    if not ok:
        raise FormatError(path, f"{what} {value!r} is not a plain relative path")
    return value


def _read_manifest(root: Path) -> dict:
    path = root / "manifest.json"
    try:
        size = path.stat().st_size
    except FileNotFoundError:
        raise FileNotFoundError(f"{path}: no such file; {root} is not a prep dataset "
                                f"(or prep was interrupted while writing it)") from None
    if size > MAX_MANIFEST_BYTES:
        raise FormatError(path, f"{size} bytes, more than any manifest needs")
    try:
        m = json.loads(path.read_bytes())
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise FormatError(path, f"not valid JSON: {e}") from None
    if not isinstance(m, dict):
        raise FormatError(path, "not a JSON object")
    if m.get("format") != "prep":
        raise FormatError(path, f'"format" is {m.get("format")!r}, not "prep"')
    version = m.get("version")
    if type(version) is not int or version < 1:
        raise FormatError(path, f'"version" is {version!r}, not a positive integer')
    if version > FORMAT_VERSION:
        raise UnsupportedVersion(path, version)
    if m.get("kind") not in ("documents", "packed"):
        raise FormatError(path, f'unknown "kind" {m.get("kind")!r}')
    if m.get("dtype") not in _DTYPES:
        raise FormatError(path, f'"dtype" is {m.get("dtype")!r}, not "uint16" or "uint32"')
    if m["kind"] == "packed":
        seq_len = m.get("seq_len")
        if type(seq_len) is not int or not 1 <= seq_len <= _MAX_SEQ_LEN:
            raise FormatError(path, f'a packed dataset\'s "seq_len" is {seq_len!r}')
    shards = m.get("shards")
    if not isinstance(shards, list) or not all(isinstance(s, dict) for s in shards):
        raise FormatError(path, '"shards" is not a list of objects')
    for i, s in enumerate(shards):
        # A .sum (chunk checksums, for readers of byte ranges) is not read
        # here, but its name is held to the rule every shard path is, as
        # prep's own reader does.
        for key in ("bin", "idx") + tuple(k for k in ("seg", "sum") if k in s):
            _relative(s.get(key), path, f"shard {i}: {key!r}")
        for key in ("n_records", "n_tokens"):
            _count(s.get(key), path, f"shard {i}: {key!r}")
        if version >= 2:
            # Version 2 exists so that no reader trains on every token of a
            # masked dataset: a shard without its mask is a broken dataset,
            # not one to read as version 1.
            if "mask" not in s:
                raise FormatError(path, f"format version {version}, but shard {i} lists no "
                                        f'"mask": every shard of a version 2 dataset has a loss mask')
            _relative(s["mask"], path, f"shard {i}: 'mask'")
            if "mask_bytes" in s and _count(s["mask_bytes"], path, f"shard {i}: 'mask_bytes'") != s["n_tokens"]:
                raise FormatError(path, f"shard {i}: \"mask_bytes\" is {s['mask_bytes']}, but a mask "
                                        f"has one byte per token and the shard holds {s['n_tokens']}")
    for key in ("n_records", "n_tokens"):
        total = sum(s[key] for s in shards)
        if _count(m.get(key), path, f'"{key}"') != total:
            raise FormatError(path, f'"{key}" is {m[key]} but the shards hold {total}')
    return m


# Python's mmap (and so numpy.memmap) keeps a duplicate of the file
# descriptor open for each map unless told not to, which only 3.13+ can; a
# dataset of thousands of shards would otherwise hold three descriptors per
# shard, past many systems' limit of 1,024.
_MMAP_KW = {"trackfd": False} if sys.version_info >= (3, 13) else {}


def _map(path: Path, size: int) -> np.ndarray:
    """The file's bytes as a read-only uint8 array backed by a shared mapping.

    What numpy.memmap(path, mode="r") gives, without numpy.memmap's
    per-slice overhead. mmap cannot map an empty file, so an empty file
    gives an empty array. The mapping stays valid while any array
    viewing it lives; a file truncated underneath it makes reads past the new
    end fail with SIGBUS, as with any mapped file: do not rewrite a dataset
    that training is reading.
    """
    if size == 0:
        return np.zeros(0, dtype=np.uint8)
    with open(path, "rb") as f:
        m = mmap.mmap(f.fileno(), size, access=mmap.ACCESS_READ, **_MMAP_KW)
    return np.frombuffer(m, dtype=np.uint8)


def _listed_size(path: Path) -> int:
    """The size of a file the manifest lists; a missing one is a FormatError naming it."""
    try:
        return path.stat().st_size
    except FileNotFoundError:
        raise FormatError(path, "missing: the manifest lists it, but there is no such file") from None


def _header(path: Path, size: int, length: int, what: str) -> bytes:
    if size < length:
        raise FormatError(path, f"{size} bytes, shorter than the {length}-byte {what} header")
    with open(path, "rb") as f:
        return f.read(length)


class _Shard:
    """One shard's mapped files, checked like prep's reader checks them at open."""

    def __init__(self, root: Path, i: int, entry: dict, manifest: dict):
        dtype = _DTYPES[manifest["dtype"]]
        idx_path, bin_path = root / entry["idx"], root / entry["bin"]

        size = _listed_size(idx_path)
        head = _header(idx_path, size, _HEADER_LEN, ".idx")
        magic, version, token_size, reserved, n_records, n_tokens = _IDX_HEADER.unpack(head)
        if magic != _IDX_MAGIC:
            raise FormatError(idx_path, f"not a prep index (magic bytes {magic!r})")
        if version == 0:
            raise FormatError(idx_path, "version 0 in the header; versions start at 1")
        if version > _HEADER_VERSION:
            raise UnsupportedVersion(idx_path, version, _HEADER_VERSION)
        if token_size != dtype.itemsize:
            raise FormatError(idx_path, f"token size {token_size}, but the manifest's dtype is "
                                        f"{manifest['dtype']} ({dtype.itemsize} bytes)")
        if reserved != b"\0\0\0":
            raise FormatError(idx_path, f"reserved header bytes are {reserved!r}, not zero")
        expected = _HEADER_LEN + 8 * (n_records + 1)  # Python ints: no overflow
        if size != expected:
            raise FormatError(idx_path, f"{size} bytes, but a header with {n_records} records "
                                        f"needs {expected}")
        if (n_records, n_tokens) != (entry["n_records"], entry["n_tokens"]):
            raise FormatError(idx_path, f"header has {n_records} records and {n_tokens} tokens, "
                                        f"but the manifest lists {entry['n_records']} and "
                                        f"{entry['n_tokens']} for shard {i}")
        offsets = _map(idx_path, size)[_HEADER_LEN:].view("<u8")
        if offsets[0] != 0:
            raise FormatError(idx_path, f"offsets[0] is {offsets[0]}, not 0")
        if offsets[-1] != n_tokens:
            raise FormatError(idx_path, f"offsets[{n_records}] is {offsets[-1]}, not the "
                                        f"header's token count {n_tokens}")
        down = np.flatnonzero(offsets[1:] < offsets[:-1])
        if down.size:
            k = int(down[0]) + 1
            raise FormatError(idx_path, f"offsets[{k}] = {offsets[k]} is smaller than "
                                        f"offsets[{k - 1}] = {offsets[k - 1]}; offsets must not decrease")

        bin_size = _listed_size(bin_path)
        if bin_size != n_tokens * dtype.itemsize:
            raise FormatError(bin_path, f"{bin_size} bytes, but {n_tokens} tokens of "
                                        f"{manifest['dtype']} need {n_tokens * dtype.itemsize}")
        self.tokens = _map(bin_path, bin_size).view(dtype)
        self.offsets = offsets
        self.n_records = n_records
        self.row_index = self.entries = self.seg_path = None
        self.rows = None  # packed: the tokens as a (rows, seq_len) view
        self.mask = self.mask_rows = None  # version 2: the loss mask, as tokens and rows are

        if manifest["version"] >= 2:
            mask_path = root / entry["mask"]
            mask_size = _listed_size(mask_path)
            if mask_size != n_tokens:
                raise FormatError(mask_path, f"{mask_size} bytes, but a loss mask has one byte per "
                                             f"token and the shard holds {n_tokens} tokens")
            self.mask = _map(mask_path, mask_size)

        seq_len = manifest.get("seq_len") if manifest["kind"] == "packed" else None
        self.seq_len = seq_len
        if "seg" in entry:
            self._open_segments(root / entry["seg"], n_records, seq_len)
        if seq_len is not None:
            # Rows of exactly seq_len tokens are the contract, and let ds[i]
            # skip the offsets.
            bad = np.flatnonzero(np.diff(offsets) != seq_len)
            if bad.size:
                r = int(bad[0])
                raise FormatError(idx_path, f"row {r} has {offsets[r + 1] - offsets[r]} tokens, "
                                            f"but the manifest's seq_len is {seq_len}")
            self.rows = self.tokens.reshape(n_records, seq_len)
            if self.mask is not None:
                self.mask_rows = self.mask.reshape(n_records, seq_len)

    def _open_segments(self, path: Path, n_rows: int, seq_len: int | None) -> None:
        size = _listed_size(path)
        head = _header(path, size, _HEADER_LEN, ".seg")
        magic, version, row_len, rows, n_segments = _SEG_HEADER.unpack(head)
        if magic != _SEG_MAGIC:
            raise FormatError(path, f"not a prep segment index (magic bytes {magic!r})")
        if version == 0:
            raise FormatError(path, "version 0 in the header; versions start at 1")
        if version > _HEADER_VERSION:
            raise UnsupportedVersion(path, version, _HEADER_VERSION)
        at = _HEADER_LEN + 8 * (rows + 1)
        expected = at + SEGMENT_DTYPE.itemsize * n_segments
        if size != expected:
            raise FormatError(path, f"{size} bytes, but a header with {rows} rows and "
                                    f"{n_segments} segments needs {expected}")
        if rows != n_rows:
            raise FormatError(path, f"{rows} rows, but the shard's index has {n_rows} records")
        if row_len != seq_len:
            raise FormatError(path, f"rows of {row_len} tokens, but the manifest's seq_len is {seq_len}")
        raw = _map(path, size)
        row_index = raw[_HEADER_LEN:at].view("<u8")
        if row_index[0] != 0 or row_index[-1] != n_segments or np.any(row_index[1:] < row_index[:-1]):
            raise FormatError(path, "the row index does not run from 0 to the number of "
                                    f"segments ({n_segments}) without decreasing")
        self.row_index = row_index
        self.entries = raw[at:].view(SEGMENT_DTYPE)
        self.seg_path = path


class Dataset:
    """A prep dataset directory, memory-mapped: records as numpy views, no copies.

    `Dataset(path)` reads `manifest.json`, maps every shard's `.bin`, `.idx`
    (and `.seg` for a packed dataset) and checks what reading relies on:
    headers, versions, sizes, offsets, row indexes. A problem raises
    `FormatError` (a ValueError) naming the file; a missing file raises
    FileNotFoundError. Checksums are not verified here (run `prep validate`).

    Records are numbered from 0 across all shards. `ds[i]` is a read-only
    numpy array of record i's token ids (dtype `ds.dtype`, uint16 or uint32
    little-endian), a view into the mapped file: copy it (or `.astype`) to
    keep or modify it. Negative indices count from the end; an index out of
    range raises IndexError. For a packed dataset every record is a row of
    `ds.seq_len` tokens and `ds.segments(i)` lists its document pieces.

    A dataset of format version 2 (`prep tokenize --chat`) has a loss mask:
    `ds.loss_mask(i)` is record i's, one uint8 per token (1: the token is a
    target, 0: not), a view into the mapped .mask file like `ds[i]`. Each
    .mask file is checked at open to hold exactly one byte per token of its
    shard.

    Attributes: `path`; `manifest` (the parsed manifest.json, a dict);
    `kind` ("documents" or "packed"); `dtype` (numpy <u2 or <u4); `seq_len`
    (tokens per row of a packed dataset, None for documents);
    `has_loss_mask` (True for a version 2 dataset).

    A Dataset pickles as its path (it is reopened, and rechecked, on the
    other side), so it can go to DataLoader worker processes under any start
    method.
    """

    def __init__(self, path: os.PathLike | str):
        self.path = Path(path)
        self.manifest: dict = _read_manifest(self.path)
        m = self.manifest
        self.kind: str = m["kind"]
        self.dtype: np.dtype = _DTYPES[m["dtype"]]
        self.seq_len: int | None = m["seq_len"] if self.kind == "packed" else None
        self.has_loss_mask: bool = m["version"] >= 2
        shards = [_Shard(self.path, i, e, m) for i, e in enumerate(m["shards"])]
        # Empty shards hold no record: leave them out of the lookup, so the
        # shard of record i is the last one starting at or before i.
        self._shards = [s for s in shards if s.n_records]
        self._starts = np.cumsum([0] + [s.n_records for s in self._shards[:-1]], dtype=np.int64)
        self._starts_list = self._starts.tolist()
        self._len = m["n_records"]

    def __reduce__(self):
        return (type(self), (self.path,))

    def __len__(self) -> int:
        return self._len

    def __repr__(self) -> str:
        extra = f", seq_len={self.seq_len}" if self.seq_len is not None else ""
        return (f"Dataset({str(self.path)!r}, {self.kind}, {self._len} records, "
                f"{self.manifest['n_tokens']} tokens of {self.manifest['dtype']}{extra})")

    def _locate(self, i: Any) -> tuple[_Shard, int]:
        """The shard of record i (negative: from the end) and i's index in it."""
        if type(i) is not int:
            i = operator.index(i)
        n = self._len
        k = i + n if i < 0 else i
        if not 0 <= k < n:
            raise IndexError(f"record {i} out of range for a dataset of {n} records")
        # bisect over a list beats np.searchsorted for one index (no array
        # round trip); it finds the same shard.
        starts = self._starts_list
        s = bisect.bisect_right(starts, k) - 1
        return self._shards[s], k - starts[s]

    def locate(self, indices: Any) -> tuple[np.ndarray, np.ndarray]:
        """(shard number among the non-empty shards, index within it) of each record in `indices`.

        Vectorized (np.searchsorted over the shards' first records); indices
        must be in range (no negative ones).
        """
        idx = np.asarray(indices, dtype=np.int64)
        if idx.size and (idx.min() < 0 or idx.max() >= self._len):
            raise IndexError(f"an index is out of range for a dataset of {self._len} records")
        s = np.searchsorted(self._starts, idx, side="right") - 1
        return s, idx - self._starts[s]

    def __getitem__(self, i: int) -> np.ndarray:
        # The hot path of a training loop: _locate inlined (a call costs as
        # much as the rest), and a packed shard's rows read from its
        # (rows, seq_len) view without the offsets.
        if type(i) is not int:
            i = operator.index(i)
        n = self._len
        k = i + n if i < 0 else i
        if not 0 <= k < n:
            raise IndexError(f"record {i} out of range for a dataset of {n} records")
        starts = self._starts_list
        s = bisect.bisect_right(starts, k) - 1
        shard, j = self._shards[s], k - starts[s]
        if shard.rows is not None:
            return shard.rows[j]
        o = shard.offsets
        return shard.tokens[o[j]:o[j + 1]]

    def __iter__(self) -> Iterator[np.ndarray]:
        """Every record in order, as views."""
        for shard in self._shards:
            o = shard.offsets
            for j in range(shard.n_records):
                yield shard.tokens[o[j]:o[j + 1]]

    def loss_mask(self, i: int) -> np.ndarray:
        """Record `i`'s loss mask: a read-only uint8 array as long as `ds[i]`.

        Byte k is 1 when token k of the record is a target (its label counts
        in the loss), 0 when it is not. A view into the mapped .mask file, no
        copy. Negative indices count from the end; an index out of range
        raises IndexError. Raises ValueError for a dataset without masks
        (format version 1: `has_loss_mask` is False).
        """
        if not self.has_loss_mask:
            raise ValueError(f"{self.path}: no loss masks; a dataset has them when `prep tokenize "
                             f"--chat` wrote it (manifest version 2), this one is version "
                             f"{self.manifest['version']}")
        shard, j = self._locate(i)
        if shard.mask_rows is not None:
            return shard.mask_rows[j]
        o = shard.offsets
        return shard.mask[o[j]:o[j + 1]]

    def segments(self, i: int) -> np.ndarray:
        """The document pieces of row `i` of a packed dataset, in row order.

        A structured array (dtype `SEGMENT_DTYPE`: doc, doc_offset, start,
        length) viewing the mapped .seg file. The pieces tile the front of
        the row; the tokens after the last one's `start + length` are padding.
        Raises ValueError for a dataset without segment indexes (documents),
        and SegmentError (a FormatError), naming the .seg file and the entry,
        for a row whose entries break that rule: what is returned is always
        safe to turn into `cu_seqlens` or masks over the row.
        """
        shard, j = self._locate(i)
        if shard.entries is None:
            raise ValueError(f"{self.path}: record {i} has no segment index; only the "
                             f"rows of packed datasets (prep pack) have one")
        first, end = int(shard.row_index[j]), int(shard.row_index[j + 1])
        return _check_row(shard.seg_path, j, first, shard.entries[first:end], self.seq_len)


# --- The sampler -------------------------------------------------------------------------------

_M64 = _U64 - 1
_ROUNDS = 6
_C0, _C1, _C2 = 0x9E3779B97F4A7C15, 0xBF58476D1CE4E5B9, 0x94D049BB133111EB
_NC0, _NC1, _NC2 = np.uint64(_C0), np.uint64(_C1), np.uint64(_C2)
_N27, _N30, _N31 = np.uint64(27), np.uint64(30), np.uint64(31)
_BLOCK = 16384  # positions per pass of the vectorized network


def _mix(x: int) -> int:
    """SplitMix64's finaliser on a Python int (prep's permute::mix)."""
    z = (x + _C0) & _M64
    z = ((z ^ (z >> 30)) * _C1) & _M64
    z = ((z ^ (z >> 27)) * _C2) & _M64
    return z ^ (z >> 31)


def _u64(value: Any, what: str) -> int:
    try:
        v = operator.index(value)
    except TypeError:
        raise TypeError(f"{what} must be an integer, not {type(value).__name__}") from None
    if not 0 <= v < _U64:
        raise ValueError(f"{what} must be in 0..2**64, not {v}")
    return v


class Permutation:
    """prep's keyed permutation of 0..n (Rust: `prep::permute::Permutation`), vectorized.

    A balanced Feistel network on 2k bits (k = max(ceil(bits(n - 1) / 2), 1)),
    6 rounds with round function F(i, x) = mix(x ^ key[i]) & (2^k - 1),
    keys[i] = mix(base ^ mix(i)) with base = mix(mix(seed) ^ stream), and
    cycle walking: applied again while the result is >= n. Equal to the Rust
    one bit for bit for every n, seed and stream below 2^64.
    """

    def __init__(self, n: int, seed: int, stream: int = 0):
        self.n = _u64(n, "n")
        self.seed = _u64(seed, "seed")
        self.stream = _u64(stream, "stream")
        bits = (self.n - 1).bit_length() if self.n else 0
        self._k = np.uint64(max((bits + 1) // 2, 1))
        self._mask = np.uint64((1 << int(self._k)) - 1)
        base = _mix(_mix(self.seed) ^ self.stream)
        self._int_keys = [_mix(base ^ _mix(i)) for i in range(_ROUNDS)]
        self._keys = [np.uint64(key) for key in self._int_keys]

    def __len__(self) -> int:
        return self.n

    def _feistel(self, x: np.ndarray) -> np.ndarray:
        """One pass of the network over a uint64 array; a new array.

        Works in place in preallocated buffers: numpy's temporaries for
        arrays this size cost more than the arithmetic.
        """
        k, mask = self._k, self._mask
        left, right = x >> k, x & mask
        f, t = np.empty_like(x), np.empty_like(x)
        for key in self._keys:
            np.bitwise_xor(right, key, out=f)
            f += _NC0  # f = mix(f), as _mix does it
            np.right_shift(f, _N30, out=t)
            f ^= t
            f *= _NC1
            np.right_shift(f, _N27, out=t)
            f ^= t
            f *= _NC2
            np.right_shift(f, _N31, out=t)
            f ^= t
            f &= mask
            f ^= left
            left, right, f = right, f, left
        left <<= k
        left |= right
        return left

    def map(self, positions: Any) -> np.ndarray:
        """The images of `positions` (array-like of ints, each below n), as uint64."""
        x = np.asarray(positions, dtype=np.uint64)
        if x.size and x.max() >= self.n:
            raise IndexError(f"position {int(x.max())} outside a permutation of {self.n}")
        flat = x.ravel()
        out = np.empty(flat.size, dtype=np.uint64)
        n = np.uint64(self.n)
        # Cycle walking, in blocks small enough for the buffers to stay in
        # cache: the values still >= n after a pass go into the next block
        # beside fresh positions, so that every pass is a full block (a pass
        # costs about the same for 10 values as for 10,000).
        walking, slots = np.zeros(0, dtype=np.uint64), np.zeros(0, dtype=np.intp)
        lo = 0
        with np.errstate(over="ignore"):
            while lo < flat.size or walking.size:
                m = walking.size
                take = min(_BLOCK - m, flat.size - lo)
                y = self._feistel(np.concatenate((walking, flat[lo:lo + take])))
                # Store every value (the ones still walking are overwritten
                # when they are done), then keep walking the ones >= n.
                out[slots] = y[:m]
                out[lo:lo + take] = y[m:]
                bad = np.flatnonzero(y >= n)
                k = np.searchsorted(bad, m)
                walking = y[bad]
                slots = np.concatenate((slots[bad[:k]], bad[k:] + (lo - m)))
                lo += take
        return out.reshape(x.shape)

    def __getitem__(self, i: int) -> int:
        i = operator.index(i)
        if not 0 <= i < self.n:
            raise IndexError(f"index {i} outside a permutation of {self.n}")
        return self._image(i)

    def _image(self, i: int) -> int:
        """P(i) with Python ints: for one index, faster than a numpy pass."""
        k = int(self._k)
        mask = (1 << k) - 1
        x = i
        while True:
            left, right = x >> k, x & mask
            for key in self._int_keys:
                left, right = right, left ^ (_mix(right ^ key) & mask)
            x = (left << k) | right
            if x < self.n:
                return x


class Sampler:
    """The records one rank reads in one epoch: prep's training order (Rust `prep::sampler::Sampler`).

    Epoch `e` reads the dataset in the order of `Permutation(n, seed, stream=e)`.
    With `world_size` ranks, rank r's k-th record is P(k * world_size + r),
    for k < n // world_size: every rank reads the same number of records,
    and the n % world_size records the permutation puts last are left out of
    that epoch (different ones each epoch). Iterating yields Python ints
    from position `start` (a resumed run) to the end; the result equals
    `prep sample DIR --seed S --epoch E --rank R --world-size W --start K`.

    `len(sampler)` is the number of records still to come from `start`.
    `get(position)` and `indices(begin, end)` compute any position directly,
    so resuming costs nothing. Indices are computed 65,536 at a time with
    numpy, tens of millions per second.

    Raises ValueError for world_size < 1 or a rank outside 0..world_size,
    and for arguments outside 0..2**64 (they are u64 in prep).
    """

    CHUNK = 65536

    def __init__(self, n: int, seed: int, epoch: int = 0, rank: int = 0, world_size: int = 1,
                 start: int = 0):
        n, seed, epoch = _u64(n, "n"), _u64(seed, "seed"), _u64(epoch, "epoch")
        world_size, rank, start = _u64(world_size, "world_size"), _u64(rank, "rank"), _u64(start, "start")
        if world_size < 1:
            raise ValueError("world_size must be at least 1")
        if rank >= world_size:
            raise ValueError(f"rank {rank} is not below world_size {world_size}")
        self.n, self.seed, self.epoch = n, seed, epoch
        self.rank, self.world_size, self.start = rank, world_size, start
        self.per_rank = n // world_size  # records each rank reads in the epoch
        self.permutation = Permutation(n, seed, epoch)

    def __len__(self) -> int:
        return max(self.per_rank - self.start, 0)

    def __repr__(self) -> str:
        return (f"Sampler(n={self.n}, seed={self.seed}, epoch={self.epoch}, rank={self.rank}, "
                f"world_size={self.world_size}, start={self.start})")

    def at(self, positions: Any) -> np.ndarray:
        """The records at rank `positions` (array-like, each in 0..per_rank), as uint64."""
        k = np.asarray(positions, dtype=np.uint64)
        if k.size and k.max() >= self.per_rank:
            raise IndexError(f"position {int(k.max())} is past this rank's {self.per_rank} records")
        # k * world_size + rank < n: no overflow.
        return self.permutation.map(k * np.uint64(self.world_size) + np.uint64(self.rank))

    def indices(self, begin: int | None = None, end: int | None = None) -> np.ndarray:
        """The records at positions begin..end (default: start..per_rank), as a uint64 array."""
        begin = self.start if begin is None else operator.index(begin)
        end = self.per_rank if end is None else min(operator.index(end), self.per_rank)
        if begin < 0:
            raise IndexError(f"position {begin} is negative")
        if end <= begin:
            return np.zeros(0, dtype=np.uint64)
        return self.at(np.arange(end - begin, dtype=np.uint64) + np.uint64(begin))

    def get(self, position: int) -> int:
        """The record at rank `position` (counted from the epoch's start, not from `start`).

        Raises IndexError unless 0 <= position < n // world_size.
        """
        position = operator.index(position)
        if not 0 <= position < self.per_rank:
            raise IndexError(f"position {position} is outside this rank's {self.per_rank} records")
        return self.permutation._image(position * self.world_size + self.rank)

    def __iter__(self) -> Iterator[int]:
        for lo in range(self.start, self.per_rank, self.CHUNK):
            yield from self.indices(lo, lo + self.CHUNK).tolist()

    @staticmethod
    def resume_position(position: int, old_world_size: int, new_world_size: int) -> int:
        """Where a rank resumes when the number of ranks changes: position * old // new.

        The ranks had consumed `position` records each, the first
        position * old global positions of the epoch together. Starting every
        new rank at the returned k' repeats at most new - 1 of those and skips
        none; the records left out at the epoch's end become the last
        n % new positions instead of the last n % old.
        """
        position = _u64(position, "position")
        old, new = _u64(old_world_size, "old_world_size"), _u64(new_world_size, "new_world_size")
        if old < 1 or new < 1:
            raise ValueError("world sizes must be at least 1")
        return position * old // new


# --- PackedDataset ---------------------------------------------------------------------------


def __getattr__(name: str):
    # PackedDataset reads in the order every reader of the package reads,
    # which prep's extension module computes: it lives with them
    # (prep.streaming), and this name stays for code that imported it here.
    if name == "PackedDataset":
        try:
            from . import streaming
        except ImportError as e:  # this file copied alone, without the package
            raise ImportError(f"{__name__}.PackedDataset needs the prep package (pip install prep-llm)") from e
        if "PackedDataset" not in streaming.__all__:
            raise ImportError(f"{__name__}.PackedDataset needs torch, which could not be imported")
        return streaming.PackedDataset
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
