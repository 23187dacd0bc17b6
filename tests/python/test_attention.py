"""prep.attention: a packed row's pieces turned into what attention kernels take.

Small rows checked by hand, then properties over every row of a packed
dataset written by prep: cu_seqlens' differences are the pieces' lengths,
positions restart exactly where pieces start, the mask is block diagonal.
"""

from __future__ import annotations

import numpy as np
import pytest

from prep import SEGMENT_DTYPE, Dataset, attention
from test_reader import GPT2, need_torch, prep as run_prep  # noqa: F401
from test_reference import CORPUS


def row(*pieces: tuple[int, int]) -> np.ndarray:
    """Pieces (doc_offset, length) laid end to end from the row's start."""
    out = np.zeros(len(pieces), SEGMENT_DTYPE)
    start = 0
    for k, (offset, length) in enumerate(pieces):
        out[k] = (k, offset, start, length)
        start += length
    return out


# A row of 10: a document of 3, then one of 4 continued from an earlier row
# (its tokens 2..5), then 3 of padding.
ROW = row((0, 3), (2, 4))


def test_cu_seqlens_by_hand():
    cu, longest = attention.cu_seqlens(ROW, 10)
    assert cu.tolist() == [0, 3, 7, 10] and cu.dtype == np.int32 and longest == 4
    # Cut at 5 (the model reads fewer tokens): the second piece keeps 2, no padding.
    cu, longest = attention.cu_seqlens(ROW, 5)
    assert cu.tolist() == [0, 3, 5] and longest == 3
    # A full row has no padding sequence; a batch is laid end to end.
    cu, longest = attention.cu_seqlens([ROW, row((0, 10))], 10)
    assert cu.tolist() == [0, 3, 7, 10, 20] and longest == 10


def test_position_ids_by_hand():
    assert attention.position_ids(ROW, 10).tolist() == [0, 1, 2, 0, 1, 2, 3, 0, 1, 2]
    assert attention.position_ids(ROW, 10, continue_cut=True).tolist() == [0, 1, 2, 2, 3, 4, 5, 0, 1, 2]
    assert attention.position_ids([3, 4], 10).tolist() == [0, 1, 2, 0, 1, 2, 3, 0, 1, 2]


def test_document_ids_and_loss_mask_by_hand():
    assert attention.document_ids(ROW, 10).tolist() == [0, 0, 0, 1, 1, 1, 1, -1, -1, -1]
    assert attention.loss_mask(ROW, 10).tolist() == [1] * 7 + [0] * 3
    # Inputs row[:-1], targets row[1:]: target t is token t + 1, padding from t = 6.
    assert attention.loss_mask(ROW, 9, shift=True).tolist() == [1] * 6 + [0] * 3
    assert attention.loss_mask(row((0, 10)), 9, shift=True).tolist() == [1] * 9


def test_document_mask_by_hand():
    m = attention.document_mask(row((0, 2), (0, 1)), 4)
    assert m.astype(int).tolist() == [[1, 0, 0, 0],
                                      [1, 1, 0, 0],
                                      [0, 0, 1, 0],
                                      [0, 0, 0, 1]]
    full = attention.document_mask(row((0, 2), (0, 1)), 4, causal=False)
    assert full.astype(int).tolist() == [[1, 1, 0, 0],
                                         [1, 1, 0, 0],
                                         [0, 0, 1, 0],
                                         [0, 0, 0, 1]]


@pytest.fixture(scope="module")
def packed(tmp_path_factory):
    out = tmp_path_factory.mktemp("attention")
    run_prep("tokenize", "--tokenizer", GPT2, "--input", CORPUS, "--output", out / "docs",
             "--shard-size", "256KiB", "--quiet")
    run_prep("pack", out / "docs", out / "packed", "--seq-len", "129", "--shard-size", "256KiB", "--quiet")
    return Dataset(out / "packed")


def test_properties_on_every_row_of_a_packed_dataset(packed):
    n = packed.seq_len - 1
    cut_seen = padding_seen = False
    for i in range(len(packed)):
        pieces = packed.segments(i)
        lengths = np.minimum(pieces["start"].astype(np.int64) + pieces["length"], n) - pieces["start"]
        lengths = lengths[lengths > 0]
        used = int(lengths.sum())
        cu, longest = attention.cu_seqlens(pieces, n)
        pad = [n - used] if used < n else []
        assert np.diff(cu).tolist() == lengths.tolist() + pad and cu[-1] == n
        assert longest == max(lengths.tolist() + pad)
        starts = set(cu[:-1].tolist())
        pos = attention.position_ids(pieces, n)
        assert {t for t in range(n) if pos[t] == 0} == starts, f"row {i}"
        cont = attention.position_ids(pieces, n, continue_cut=True)
        assert np.array_equal(np.diff(cont)[np.diff(pos) == 1], np.ones(int((np.diff(pos) == 1).sum())))
        cut_seen |= bool((pieces["doc_offset"] > 0).any())
        mask = attention.document_mask(pieces, n)
        ids = np.repeat(np.arange(len(cu) - 1), np.diff(cu))
        assert np.array_equal(mask, (ids[:, None] == ids[None, :]) & np.tri(n, dtype=bool)), f"row {i}"
        assert mask.diagonal().all()
        weights = attention.loss_mask(pieces, n, shift=True)
        assert weights.sum() == max(min(int(pieces["length"].sum()), n + 1) - 1, 0)
        padding_seen |= used < n
    assert cut_seen and padding_seen, "the dataset should have cut documents and padding"
    # A batch is the rows one after another.
    batch = [packed.segments(i) for i in range(4)]
    cu, _ = attention.cu_seqlens(batch, n)
    singles = [attention.cu_seqlens(p, n)[0] for p in batch]
    assert cu.tolist() == [0] + [int(c) + k * n for k, s in enumerate(singles) for c in s[1:]]
    assert np.array_equal(attention.position_ids(batch, n),
                          np.stack([attention.position_ids(p, n) for p in batch]))


def test_torch_tensors():
    torch = need_torch()
    cu, longest = attention.cu_seqlens(ROW, 10, as_tensor=True)
    assert cu.dtype == torch.int32 and cu.tolist() == [0, 3, 7, 10] and longest == 4
    assert attention.position_ids(ROW, 10, as_tensor=True).dtype == torch.int64
    mask = attention.document_mask([ROW, ROW], 10, as_tensor=True)
    assert mask.dtype == torch.bool and mask.shape == (2, 10, 10)
    assert attention.loss_mask(ROW, 10, as_tensor=True).dtype == torch.float32
    # The mask works as scaled_dot_product_attention's attn_mask: no row is all False.
    q = torch.randn(1, 1, 10, 8)
    out = torch.nn.functional.scaled_dot_product_attention(q, q, q, attn_mask=mask[0])
    assert torch.isfinite(out).all()


def test_bad_pieces_are_refused():
    with pytest.raises(ValueError):
        attention.cu_seqlens(np.array([3, -1]), 10)
    with pytest.raises(ValueError):
        attention.position_ids(ROW, -1)
    with pytest.raises(TypeError):
        attention.document_mask(np.array([[1, 2]]), 4)
