"""Read the token files of other trainers with numpy alone, to check `prep export`.

Independent readers of the five formats `prep export` writes, written from
the formats' public descriptions (the trainers' own readers and writers), not
from prep's code. Each reader checks everything its trainer checks and the
file sizes the layout implies, and raises `ValueError` naming the file on any
mismatch. Token arrays are memory-mapped, not loaded (an empty file, which
numpy cannot map, gives an empty array).

    from interop_read import read_megatron, read_nanogpt, read_llmc, read_datatrove

    seqs = read_megatron("out/corpus")             # corpus.bin + corpus.idx
    stream = read_nanogpt("out/train.bin")
    val, train = read_llmc("out/llmc", name="prep")
    docs, meta = read_datatrove("out/corpus")      # corpus.ds + .ds.index + .ds.metadata

The formats:

- **megatron** (Megatron-LM / Megatron-Core `IndexedDataset`, "MMIDIDX"):
  `PREFIX.bin` holds the tokens, no header; `PREFIX.idx`, see `read_megatron`.
- **nanogpt** (nanoGPT's `train.bin`): one flat file of uint16 tokens,
  documents back to back, no header and no index.
- **llmc** (llm.c's `dev/data` shards): a directory of `NAME_val_000000.bin`
  and `NAME_train_000001.bin`, `NAME_train_000002.bin`, ..., each a 1,024-byte
  header and then tokens; see `read_llmc`.
- **datatrove** (datatrove's `DocumentTokenizer` output, read by nanotron):
  `PREFIX.ds` tokens, `PREFIX.ds.index` document ends and
  `PREFIX.ds.metadata`; see `read_datatrove`.
- **olmo-core** (OLMo-core's fine-tuning input as open-instruct writes it):
  a directory of token id parts, label mask parts and document boundary
  files; see `read_olmo_core`.
"""

from __future__ import annotations

import os
import re
import struct
from pathlib import Path

import numpy as np

__all__ = [
    "MEGATRON_DTYPES",
    "MegatronIndex",
    "llmc_shards",
    "megatron_index",
    "read_datatrove",
    "read_llmc",
    "read_llmc_shards",
    "read_megatron",
    "read_nanogpt",
    "read_olmo_core",
]

# --- helpers -------------------------------------------------------------------------------------


def _map(path: Path, dtype: np.dtype, offset: int = 0, count: int | None = None) -> np.ndarray:
    """`count` items of `dtype` at byte `offset` of `path`, memory-mapped read-only.

    `count=None` maps to the end of the file. numpy cannot map zero bytes, so
    an empty range gives an empty (unmapped) array instead.
    """
    dtype = np.dtype(dtype)
    if count is None:
        size = os.path.getsize(path) - offset
        if size % dtype.itemsize:
            raise ValueError(f"{path}: {size} bytes of tokens is not a whole number of "
                             f"{dtype.itemsize}-byte tokens")
        count = size // dtype.itemsize
    if count == 0:
        return np.zeros(0, dtype=dtype)
    return np.memmap(path, dtype=dtype, mode="r", offset=offset, shape=(count,))


# --- megatron ------------------------------------------------------------------------------------

MEGATRON_MAGIC = b"MMIDIDX\x00\x00"
MEGATRON_VERSION = 1
# Megatron's DType codes (megatron/core/datasets/indexed_dataset.py).
MEGATRON_DTYPES = {
    1: np.dtype("u1"),
    2: np.dtype("i1"),
    3: np.dtype("<i2"),
    4: np.dtype("<i4"),
    5: np.dtype("<i8"),
    6: np.dtype("<f8"),
    7: np.dtype("<f4"),
    8: np.dtype("<u2"),
}
_MEGATRON_HEADER = struct.Struct("<9sQBQQ")  # magic, version, dtype code, sequences, documents


class MegatronIndex:
    """A checked `PREFIX.idx`: `dtype`, `sequence_lengths` (int32),
    `sequence_pointers` (int64 byte offsets into `.bin`) and `document_indices`
    (int64), plus the paths."""

    def __init__(self, idx_path: Path, bin_path: Path, dtype: np.dtype, lengths: np.ndarray,
                 pointers: np.ndarray, doc_indices: np.ndarray):
        self.idx_path, self.bin_path, self.dtype = idx_path, bin_path, dtype
        self.sequence_lengths, self.sequence_pointers = lengths, pointers
        self.document_indices = doc_indices

    def __len__(self) -> int:
        return len(self.sequence_lengths)


def megatron_index(prefix: str | os.PathLike) -> MegatronIndex:
    """Read and check `PREFIX.idx` against `PREFIX.bin`.

    Layout of `.idx` (little-endian, no alignment):

    | offset | size | field |
    |-------:|-----:|-------|
    | 0  | 9     | magic `MMIDIDX\\x00\\x00` |
    | 9  | 8     | u64 version, 1 |
    | 17 | 1     | u8 dtype code: 1 u8, 2 i8, 3 i16, 4 i32, 5 i64, 6 f64, 7 f32, 8 u16 |
    | 18 | 8     | u64 S, the number of sequences |
    | 26 | 8     | u64 D, the number of document-index entries |
    | 34 | 4 S   | i32 sequence lengths, in tokens |
    | 34 + 4 S | 8 S | i64 sequence pointers: byte offsets into `.bin` |
    | 34 + 12 S | 8 D | i64 document indices: sequence numbers where documents start, then S |

    Megatron asserts the magic, the version, and that the last document index
    equals S (so D >= 1). Checked here as well: the dtype code is known; the
    file size is exactly 34 + 12 S + 8 D; lengths are not negative; the
    pointers are the running sum of length x item size from 0 (how Megatron's
    writer makes them, and what its reader relies on); the document indices
    start at 0 and do not decrease; and `.bin` is exactly the sum of the
    lengths x item size (it has no header).
    """
    prefix = Path(prefix)
    idx_path = Path(f"{prefix}.idx")
    bin_path = Path(f"{prefix}.bin")
    raw = idx_path.read_bytes()
    if len(raw) < _MEGATRON_HEADER.size:
        raise ValueError(f"{idx_path}: {len(raw)} bytes, shorter than the "
                         f"{_MEGATRON_HEADER.size}-byte header")
    magic, version, code, n_seq, n_doc = _MEGATRON_HEADER.unpack_from(raw)
    if magic != MEGATRON_MAGIC:
        raise ValueError(f"{idx_path}: magic {magic!r}, expected {MEGATRON_MAGIC!r}")
    if version != MEGATRON_VERSION:
        raise ValueError(f"{idx_path}: version {version}, expected {MEGATRON_VERSION}")
    if code not in MEGATRON_DTYPES:
        raise ValueError(f"{idx_path}: unknown dtype code {code}")
    dtype = MEGATRON_DTYPES[code]
    want = _MEGATRON_HEADER.size + 12 * n_seq + 8 * n_doc  # Python ints: no overflow
    if len(raw) != want:
        raise ValueError(f"{idx_path}: {len(raw)} bytes, expected 34 + 12 * {n_seq} + 8 * {n_doc}"
                         f" = {want}")
    if n_doc < 1:
        raise ValueError(f"{idx_path}: no document indices (Megatron needs the last to be S)")

    at = _MEGATRON_HEADER.size
    lengths = np.frombuffer(raw, dtype="<i4", count=n_seq, offset=at)
    pointers = np.frombuffer(raw, dtype="<i8", count=n_seq, offset=at + 4 * n_seq)
    doc_indices = np.frombuffer(raw, dtype="<i8", count=n_doc, offset=at + 12 * n_seq)

    if n_seq and lengths.min() < 0:
        raise ValueError(f"{idx_path}: negative sequence length at {int(np.argmin(lengths))}")
    ends = np.cumsum(lengths, dtype=np.int64) * dtype.itemsize
    starts = np.concatenate([np.zeros(1, np.int64), ends[:-1]]) if n_seq else ends
    if not np.array_equal(pointers, starts):
        bad = int(np.argmax(pointers != starts))
        raise ValueError(f"{idx_path}: sequence {bad} points at byte {int(pointers[bad])}, "
                         f"expected {int(starts[bad])} (the running sum of lengths x "
                         f"{dtype.itemsize})")
    if doc_indices[-1] != n_seq:
        raise ValueError(f"{idx_path}: last document index {int(doc_indices[-1])}, expected the "
                         f"sequence count {n_seq}")
    if doc_indices[0] != 0:
        raise ValueError(f"{idx_path}: first document index {int(doc_indices[0])}, expected 0")
    if np.any(np.diff(doc_indices) < 0):
        raise ValueError(f"{idx_path}: document indices decrease")

    total = int(ends[-1]) if n_seq else 0
    bin_size = bin_path.stat().st_size
    if bin_size != total:
        raise ValueError(f"{bin_path}: {bin_size} bytes, the index describes {total}")
    return MegatronIndex(idx_path, bin_path, dtype, lengths, pointers, doc_indices)


def read_megatron(prefix: str | os.PathLike) -> list[np.ndarray]:
    """The sequences of a Megatron indexed dataset (`PREFIX.bin` + `PREFIX.idx`), one
    array per sequence, views of the mapped `.bin` in the index's dtype.

    `.bin` is the raw tokens back to back, no header; `.idx` is described and
    checked by `megatron_index`. prep writes one sequence per document (so D =
    S + 1 and the document indices are 0, 1, ..., S), dtype code 8 (uint16)
    for uint16 datasets and 4 (int32) for uint32 ones.
    """
    index = megatron_index(prefix)
    tokens = _map(index.bin_path, index.dtype)
    out = []
    for pointer, length in zip(index.sequence_pointers.tolist(), index.sequence_lengths.tolist()):
        start = pointer // index.dtype.itemsize
        out.append(tokens[start:start + length])
    return out


# --- nanogpt -------------------------------------------------------------------------------------


def read_nanogpt(path: str | os.PathLike) -> np.ndarray:
    """The tokens of a nanoGPT `.bin`: uint16, little-endian, back to back, no header.

    nanoGPT reads it with `np.memmap(path, dtype=np.uint16, mode="r")`; the only
    check possible is that the size is a whole number of tokens.
    """
    return _map(Path(path), np.dtype("<u2"))


# --- llm.c ---------------------------------------------------------------------------------------

LLMC_HEADER_INTS = 256
LLMC_HEADER_BYTES = 4 * LLMC_HEADER_INTS
# magic -> (version, token dtype), from llm.c's dev/data/data_common.py and llmc/dataloader.h.
LLMC_MAGICS = {
    20240520: (1, np.dtype("<u2")),  # GPT-2 shards, uint16 tokens
    20240801: (7, np.dtype("<u4")),  # Llama 3 shards, uint32 tokens
}


def _llmc_shard(path: Path) -> np.ndarray:
    size = path.stat().st_size
    if size < LLMC_HEADER_BYTES:
        raise ValueError(f"{path}: {size} bytes, shorter than the {LLMC_HEADER_BYTES}-byte header")
    with path.open("rb") as f:
        header = np.frombuffer(f.read(LLMC_HEADER_BYTES), dtype="<i4")
    magic, version, count = (int(x) for x in header[:3])
    if magic not in LLMC_MAGICS:
        raise ValueError(f"{path}: magic {magic}, expected one of {sorted(LLMC_MAGICS)}")
    want_version, dtype = LLMC_MAGICS[magic]
    if version != want_version:
        raise ValueError(f"{path}: version {version}, expected {want_version} with magic {magic}")
    if count < 0:  # an int32 >= 2^31 reads as negative
        raise ValueError(f"{path}: token count {count} (must be below 2^31)")
    if np.any(header[3:] != 0):
        at = 3 + int(np.argmax(header[3:] != 0))
        raise ValueError(f"{path}: header int {at} is {int(header[at])}, expected 0")
    want = LLMC_HEADER_BYTES + count * dtype.itemsize
    if size != want:
        raise ValueError(f"{path}: {size} bytes, expected {LLMC_HEADER_BYTES} + {count} * "
                         f"{dtype.itemsize} = {want}")
    return _map(path, dtype, offset=LLMC_HEADER_BYTES, count=count)


def llmc_shards(directory: str | os.PathLike, name: str = "prep") -> tuple[Path | None, list[Path]]:
    """(val shard or None, train shards in order) of `name` in `directory`.

    Shard names are `NAME_val_000000.bin` (at most one, number 0) and
    `NAME_train_NNNNNN.bin` numbered 1, 2, ... without gaps, as llm.c's
    `dev/data` scripts write them. Any other `NAME_*.bin` is an error; files
    not starting with `NAME_` are ignored.
    """
    directory = Path(directory)
    pattern = re.compile(re.escape(name) + r"_(val|train)_(\d{6})\.bin")
    val, train = None, {}
    for path in sorted(directory.iterdir()):
        if not (path.name.startswith(f"{name}_") and path.name.endswith(".bin")):
            continue
        m = pattern.fullmatch(path.name)
        if not m:
            raise ValueError(f"{path}: not a shard name ({name}_val_000000.bin or "
                             f"{name}_train_NNNNNN.bin)")
        split, number = m.group(1), int(m.group(2))
        if split == "val":
            if number != 0:
                raise ValueError(f"{path}: the val shard is number 000000")
            val = path
        else:
            train[number] = path
    numbers = sorted(train)
    if numbers != list(range(1, len(numbers) + 1)):
        missing = sorted(set(range(1, (numbers[-1] if numbers else 0) + 1)) - set(numbers))
        raise ValueError(f"{directory}: train shards of {name} are not numbered 1, 2, ...: "
                         f"missing {[f'{name}_train_{n:06d}.bin' for n in missing]}")
    return val, [train[n] for n in numbers]


def read_llmc(directory: str | os.PathLike, name: str = "prep"
              ) -> tuple[np.ndarray | None, np.ndarray]:
    """(val tokens or None, train tokens) of llm.c shards `NAME_*.bin` in `directory`.

    Each shard is a header of 256 little-endian int32, 1,024 bytes, then its
    tokens:

    - h[0] magic and h[1] version: 20240520 and 1 for uint16 tokens (GPT-2),
      20240801 and 7 for uint32 tokens (Llama 3). llm.c refuses any other pair.
    - h[2]: the token count, below 2^31.
    - h[3..256]: zero.

    The file is exactly 1024 + count x token size bytes (llm.c checks this).
    All shards of a dataset have the same token type. The stream is the val
    shard (when there is one) and then the train shards in number order;
    shards are cut at a fixed token count, not at document boundaries. The
    train tokens are returned as one array (a copy when there are several
    shards; a mapped view when there is one).
    """
    val_path, train_paths = llmc_shards(directory, name)
    val = _llmc_shard(val_path) if val_path is not None else None
    parts = [_llmc_shard(p) for p in train_paths]
    dtypes = {a.dtype for a in parts + ([val] if val is not None else [])}
    if len(dtypes) > 1:
        raise ValueError(f"{directory}: shards of {name} mix token types {sorted(map(str, dtypes))}")
    dtype = dtypes.pop() if dtypes else np.dtype("<u2")
    if len(parts) == 1:
        train = parts[0]
    else:
        train = np.concatenate(parts) if parts else np.zeros(0, dtype=dtype)
    return val, train


def read_llmc_shards(directory: str | os.PathLike, name: str = "prep"
                     ) -> tuple[np.ndarray | None, list[np.ndarray]]:
    """Like `read_llmc`, with the train shards kept apart (mapped views)."""
    val_path, train_paths = llmc_shards(directory, name)
    return (_llmc_shard(val_path) if val_path is not None else None,
            [_llmc_shard(p) for p in train_paths])


# --- datatrove -----------------------------------------------------------------------------------

DATATROVE_TOKEN_DTYPES = {2: np.dtype("<u2"), 4: np.dtype("<u4")}


def read_datatrove(prefix: str | os.PathLike) -> tuple[list[np.ndarray], dict]:
    """(documents, metadata) of datatrove's tokenized files `PREFIX.ds*`.

    - `PREFIX.ds`: the tokens back to back, no header; uint16 when the
      vocabulary has at most 65,536 ids, else uint32 (the token size is in the
      metadata).
    - `PREFIX.ds.index`: raw little-endian u64, the exclusive end offset (in
      tokens) of each document; they do not decrease and the last equals the
      token count (an empty file when there are no documents).
    - `PREFIX.ds.metadata`: text `tokenizer_name|token_size\\n<count>\\n<human count>`,
      token_size 2 or 4, count the number of tokens in `.ds`.

    Returns the documents as views of the mapped `.ds` and the metadata as
    `{"tokenizer_name", "token_size", "token_count", "human_count"}`.
    """
    prefix = Path(prefix)
    ds_path = Path(f"{prefix}.ds")
    index_path = Path(f"{prefix}.ds.index")
    meta_path = Path(f"{prefix}.ds.metadata")

    text = meta_path.read_text(encoding="utf-8")
    lines = text.split("\n")
    if len(lines) == 4 and lines[3] == "":  # tolerate one trailing newline
        lines = lines[:3]
    if len(lines) != 3 or "|" not in lines[0]:
        raise ValueError(f"{meta_path}: expected 'tokenizer_name|token_size\\n<count>\\n<human "
                         f"count>', found {text!r}")
    tokenizer_name, _, token_size = lines[0].rpartition("|")
    try:
        token_size, count = int(token_size), int(lines[1])
    except ValueError:
        raise ValueError(f"{meta_path}: token size {token_size!r} or count {lines[1]!r} is not "
                         f"an integer") from None
    if token_size not in DATATROVE_TOKEN_DTYPES:
        raise ValueError(f"{meta_path}: token size {token_size}, expected 2 or 4")
    dtype = DATATROVE_TOKEN_DTYPES[token_size]
    metadata = {"tokenizer_name": tokenizer_name, "token_size": token_size,
                "token_count": count, "human_count": lines[2]}

    ds_size = ds_path.stat().st_size
    if ds_size != count * token_size:
        raise ValueError(f"{ds_path}: {ds_size} bytes, the metadata says {count} tokens of "
                         f"{token_size} bytes")
    index_size = index_path.stat().st_size
    if index_size % 8:
        raise ValueError(f"{index_path}: {index_size} bytes, not a whole number of u64")
    ends = np.fromfile(index_path, dtype="<u8").astype(np.int64)
    if len(ends):
        if ends[-1] != count:
            raise ValueError(f"{index_path}: last document ends at {int(ends[-1])}, the data "
                             f"has {count} tokens")
        if ends[0] < 0 or np.any(np.diff(ends) < 0):
            raise ValueError(f"{index_path}: document ends decrease")
    elif count:
        raise ValueError(f"{index_path}: no documents, but {ds_path} has {count} tokens")

    tokens = _map(ds_path, dtype)
    starts = np.concatenate([[0], ends[:-1]]) if len(ends) else ends
    docs = [tokens[s:e] for s, e in zip(starts.tolist(), ends.tolist())]
    return docs, metadata


def read_olmo_core(directory: str | os.PathLike, vocab_size: int
                   ) -> tuple[list[np.ndarray], list[np.ndarray] | None, list[list[tuple[int, int]]]]:
    """OLMo-core fine-tuning files, as open-instruct's converter writes them.

    `directory` holds `token_ids_part_NNNN.npy` (raw little-endian ids, no
    header: OLMo-core memory-maps them with the smallest unsigned dtype that
    holds `vocab_size - 1`), optionally `labels_mask_part_NNNN.npy` (raw
    bools, one per token, read as OLMo-core's `label_mask_paths`: np.bool_
    memmaps of the same parts) and `token_ids_part_NNNN.csv.gz` (the parts'
    document boundaries, a `start,end` line per document, offsets within the
    part). Parts are numbered from 0 without gaps. Returns the parts' ids, their
    masks (None when there are no mask files) and their boundaries.
    """
    import gzip

    directory = Path(directory)
    dtype = next(np.dtype(t) for t in (np.uint8, np.uint16, np.uint32, np.uint64)
                 if vocab_size - 1 <= np.iinfo(t).max)
    names = sorted(p.name for p in directory.glob("token_ids_part_*.npy"))
    want = [f"token_ids_part_{i:04d}.npy" for i in range(len(names))]
    if names != want:
        raise ValueError(f"{directory}: token id parts {names} are not numbered 0000 up without gaps")
    masked = (directory / "labels_mask_part_0000.npy").exists()
    ids, masks, bounds = [], [] if masked else None, []
    for i, name in enumerate(names):
        path = directory / name
        if path.stat().st_size % dtype.itemsize:
            raise ValueError(f"{path}: {path.stat().st_size} bytes are not whole {dtype} ids")
        part = _map(path, dtype)
        ids.append(part)
        if masked:
            mpath = directory / f"labels_mask_part_{i:04d}.npy"
            mask = _map(mpath, np.dtype(np.bool_))
            if len(mask) != len(part):
                raise ValueError(f"{mpath}: {len(mask)} mask entries for {len(part)} ids")
            masks.append(mask)
        cpath = directory / f"token_ids_part_{i:04d}.csv.gz"
        lines = gzip.decompress(cpath.read_bytes()).decode().splitlines()
        spans = [tuple(int(x) for x in line.split(",")) for line in lines]
        last = 0
        for start, end in spans:
            if not last <= start < end <= len(part):
                raise ValueError(f"{cpath}: document {start},{end} is out of order or outside "
                                 f"the part's {len(part)} ids")
            last = end
        bounds.append(spans)
    return ids, masks, bounds
