"""What attention kernels take, from a packed row's documents.

A row of a packed dataset holds several documents end to end (the last one
possibly cut, and continued in a later row), then padding up to the row's
length. `Dataset.segments(i)` lists the row's pieces; these helpers turn that
list into the inputs that keep documents from attending to each other:

    from prep import Dataset, attention

    ds = Dataset("data/packed-2049")
    row, pieces = ds[i], ds.segments(i)
    n = len(row) - 1                                   # the model reads row[:-1]
    cu, max_len = attention.cu_seqlens(pieces, n)      # flash_attn_varlen_func
    pos = attention.position_ids(pieces, n)            # rotary embeddings
    mask = attention.document_mask(pieces, n)          # (n, n) bool, for SDPA
    weights = attention.loss_mask(pieces, n, shift=True)   # 0 where the target is padding

`length` is the number of tokens the model reads: the row's length, or one
less when the row is split into inputs `row[:-1]` and targets `row[1:]`.
Pieces are cut at `length`. The padding after the last piece is one more
sequence of its own (so `cu_seqlens[-1] == length`, and no padding token
attends to a document or a document to it), and the loss mask is 0 on it.

`pieces` is one row's pieces (an array of `SEGMENT_DTYPE`, or of their
lengths), or a list of rows' pieces for a batch: the batch's rows are then
laid end to end, each `length` long (cu_seqlens over the flattened batch;
positions, masks and loss masks stacked, one row per row). Each helper
returns numpy arrays, or torch tensors with `as_tensor=True` (int32
cu_seqlens as flash-attention wants them, int64 positions, bool masks,
float32 loss masks).
"""

from __future__ import annotations

import operator
from typing import Any, Sequence

import numpy as np

__all__ = ["cu_seqlens", "document_ids", "document_mask", "loss_mask", "position_ids"]


def _lengths(pieces: Any) -> tuple[np.ndarray, np.ndarray]:
    """The pieces' lengths and their documents' offsets (0 where unknown), as int64."""
    pieces = np.asarray(pieces)
    if pieces.dtype.names is not None:
        return pieces["length"].astype(np.int64), pieces["doc_offset"].astype(np.int64)
    if pieces.ndim != 1 or not np.issubdtype(pieces.dtype, np.integer):
        raise TypeError("pieces must be a row's segments (SEGMENT_DTYPE) or a 1-D array of lengths")
    lengths = pieces.astype(np.int64)
    if (lengths < 0).any():
        raise ValueError("a piece's length cannot be negative")
    return lengths, np.zeros_like(lengths)


def _is_batch(pieces: Any) -> bool:
    return isinstance(pieces, (list, tuple)) and not (
        len(pieces) > 0 and isinstance(pieces[0], (int, np.integer)))


def _cut(pieces: Any, length: int) -> tuple[np.ndarray, np.ndarray]:
    """The lengths and offsets of the pieces within the first `length` tokens, then the
    padding as one more piece (offset 0) where some is left; empty pieces dropped."""
    lengths, offsets = _lengths(pieces)
    ends = np.minimum(np.cumsum(lengths), length)
    starts = np.concatenate(([0], ends[:-1]))
    kept = ends > starts
    lengths, offsets = (ends - starts)[kept], offsets[kept]
    used = int(lengths.sum())
    if used < length:
        lengths = np.append(lengths, length - used)
        offsets = np.append(offsets, 0)
    return lengths, offsets


def _length(length: Any) -> int:
    length = operator.index(length)
    if length < 0:
        raise ValueError(f"length must not be negative, not {length}")
    return length


def _out(array: np.ndarray, as_tensor: bool):
    if not as_tensor:
        return array
    import torch

    return torch.from_numpy(np.ascontiguousarray(array))


def _rows(pieces: Any) -> Sequence:
    return pieces if _is_batch(pieces) else [pieces]


def cu_seqlens(pieces: Any, length: int, as_tensor: bool = False):
    """(cu_seqlens, max_seqlen) for flash-attention's varlen kernels.

    cu_seqlens is int32, starts at 0 and ends at `length` times the number of
    rows; its differences are the pieces' lengths (cut at `length`), each
    row's padding being one more sequence. max_seqlen is the largest of them
    (an int; 0 for length 0).
    """
    length = _length(length)
    all_lengths = [_cut(row, length)[0] for row in _rows(pieces)]
    flat = np.concatenate(all_lengths) if all_lengths else np.zeros(0, np.int64)
    cu = np.concatenate(([0], np.cumsum(flat))).astype(np.int32)
    return _out(cu, as_tensor), int(flat.max()) if flat.size else 0


def document_ids(pieces: Any, length: int, as_tensor: bool = False):
    """Which piece each token belongs to: 0, 1, ... in row order, -1 on padding.

    Shape (length,), or (rows, length) for a batch; int64.
    """
    length = _length(length)

    def one(row) -> np.ndarray:
        lengths, _ = _cut(row, length)
        ids = np.repeat(np.arange(len(lengths), dtype=np.int64), lengths)
        ids[int(_cut_used(row, length)):] = -1
        return ids

    return _out(_stack([one(row) for row in _rows(pieces)], pieces, length), as_tensor)


def _cut_used(row: Any, length: int) -> int:
    lengths, _ = _lengths(row)
    return min(int(lengths.sum()), length)


def _stack(rows: list, pieces: Any, length: int, dtype=np.int64) -> np.ndarray:
    if _is_batch(pieces):
        return np.stack(rows) if rows else np.zeros((0, length), dtype)
    return rows[0]


def position_ids(pieces: Any, length: int, continue_cut: bool = False, as_tensor: bool = False):
    """Each token's position in its document: 0 at every piece's start.

    With `continue_cut`, a piece that continues a document cut in an
    earlier row (its `doc_offset` > 0) goes on from that offset instead of
    restarting; that needs the pieces as `SEGMENT_DTYPE`. Padding counts
    from 0 like a document of its own. Shape (length,), or (rows, length)
    for a batch; int64.
    """
    length = _length(length)

    def one(row) -> np.ndarray:
        lengths, offsets = _cut(row, length)
        starts = np.concatenate(([0], np.cumsum(lengths)[:-1]))
        first = offsets if continue_cut else np.zeros_like(offsets)
        return np.arange(length, dtype=np.int64) - np.repeat(starts - first, lengths)

    return _out(_stack([one(row) for row in _rows(pieces)], pieces, length), as_tensor)


def document_mask(pieces: Any, length: int, causal: bool = True, as_tensor: bool = False):
    """Which tokens each token may attend to: True within its own piece only.

    A bool matrix (length, length) that is block diagonal, one block per
    piece and one for the padding (so no row is all False), lower
    triangular too with `causal`; (rows, length, length) for a batch. For
    `torch.nn.functional.scaled_dot_product_attention(attn_mask=...)`, where
    True means "may attend".
    """
    length = _length(length)

    def one(row) -> np.ndarray:
        lengths, _ = _cut(row, length)
        block = np.repeat(np.arange(len(lengths)), lengths)
        mask = block[:, None] == block[None, :]
        if causal:
            mask &= np.tri(length, dtype=bool)
        return mask

    return _out(_stack([one(row) for row in _rows(pieces)], pieces, length), as_tensor)


def loss_mask(pieces: Any, length: int, shift: bool = False, as_tensor: bool = False):
    """1.0 on the tokens of documents, 0.0 on padding; float32.

    With `shift`, the mask is for the targets `row[1:]` of inputs
    `row[:-1]` (pass the inputs' length): entry t is 0 where token t + 1 of
    the row is padding. Shape (length,), or (rows, length) for a batch.
    """
    length = _length(length)

    def one(row) -> np.ndarray:
        used = _cut_used(row, length + 1 if shift else length)
        mask = np.zeros(length, np.float32)
        mask[:max(used - 1, 0) if shift else used] = 1.0
        return mask

    return _out(_stack([one(row) for row in _rows(pieces)], pieces, length, np.float32), as_tensor)
