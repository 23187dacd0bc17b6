"""Packed datasets read with numpy alone, from the layout of crates/reader/src/format/FORMAT.md.

Runs `prep tokenize` and `prep pack` on the demo corpus, then reads the rows
and the `.seg` segment indexes here, without prep's code: every piece holds
its document's tokens, bestfit keeps every token of every document exactly
once, and concat's seeded row order is the Feistel permutation the format
documents, recomputed in Python.

    PREP_BIN=target/debug/prep target/venv/bin/python -m pytest tests/python
"""

from __future__ import annotations

import json
import struct
import subprocess
from pathlib import Path

import numpy as np
import pytest

from test_reference import CORPUS, FIXTURES, PREP_BIN, SCHEMA, TOKEN_DTYPES, NumpyDataset, Shard

SEG_HEADER = struct.Struct("<8sIIQQ")  # magic, version, seq_len, rows, segments
SEGMENT = np.dtype([("doc", "<u8"), ("doc_offset", "<u8"), ("start", "<u4"), ("length", "<u4")])
EOS = 50256  # <|endoftext|> of GPT-2


def run(*args: str) -> None:
    proc = subprocess.run([str(PREP_BIN), *args], capture_output=True, text=True)
    assert proc.returncode == 0, f"prep {' '.join(args)}: {proc.stderr}"


@pytest.fixture(scope="module")
def documents(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("docs") / "ds"
    run("tokenize", "--tokenizer", str(FIXTURES / "tokenizers" / "gpt2.tokenizer.json.zst"),
        "--input", str(CORPUS), "--output", str(out), "--shard-size", "1MiB", "--quiet")
    return out


def read_packed(root: Path):
    """(manifest, rows, [pieces of each row]) of a packed dataset."""
    m = json.loads((root / "manifest.json").read_text(encoding="utf-8"))
    assert m["kind"] == "packed"
    seq_len = m["seq_len"]
    rows, pieces = [], []
    for entry in m["shards"]:
        shard = Shard(root, entry, m["dtype"])
        assert np.all(np.diff(shard.offsets.astype(np.int64)) == seq_len)
        raw = (root / entry["seg"]).read_bytes()
        magic, version, l, n_rows, n_segments = SEG_HEADER.unpack_from(raw)
        assert (magic, version, l, n_rows) == (b"PREPSEG\0", 1, seq_len, shard.n_records)
        assert len(raw) == 32 + 8 * (n_rows + 1) + 24 * n_segments == entry["seg_bytes"]
        row_index = np.frombuffer(raw, dtype="<u8", offset=32, count=n_rows + 1)
        segments = np.frombuffer(raw, dtype=SEGMENT, offset=32 + 8 * (n_rows + 1))
        assert row_index[0] == 0 and row_index[-1] == n_segments
        for r in range(n_rows):
            rows.append(shard.record(r))
            pieces.append(segments[row_index[r]:row_index[r + 1]])
    return m, rows, pieces


def check_pieces(rows, pieces, docs, pad):
    """Pieces tile each row from 0 and hold their document's tokens; padding follows.
    Returns {doc: [(doc_offset, length)]}."""
    found: dict[int, list[tuple[int, int]]] = {}
    for r, (row, segs) in enumerate(zip(rows, pieces)):
        at = 0
        for s in segs:
            assert s["start"] == at and s["length"] > 0, f"row {r}"
            doc = docs[int(s["doc"])]
            o, n = int(s["doc_offset"]), int(s["length"])
            assert np.array_equal(row[at:at + n], doc[o:o + n]), f"row {r}, document {s['doc']}"
            found.setdefault(int(s["doc"]), []).append((o, n))
            at += n
        assert np.all(row[at:] == pad), f"row {r}: padding"
    return found


def test_bestfit_rows_hold_every_token_once(documents, tmp_path):
    docs = list(NumpyDataset(documents).records())
    out = tmp_path / "bestfit"
    run("pack", str(documents), str(out), "--seq-len", "1024", "--shard-size", "512KiB", "--quiet")
    m, rows, pieces = read_packed(out)
    assert len(m["shards"]) > 1
    found = check_pieces(rows, pieces, docs, m["special_tokens"]["pad"])
    for i, doc in enumerate(docs):
        parts = sorted(found[i])
        assert sum(n for _, n in parts) == len(doc), f"document {i}"
        assert [o for o, _ in parts] == [1024 * k for k in range(len(parts))], f"document {i}"
        if len(doc) <= 1024:
            assert len(parts) == 1, f"document {i} fits a row but was split"
    packing = m["packing"]
    assert packing["pieces"] == sum(len(p) for p in pieces)
    assert packing["documents_cut"] == sum(len(d) > 1024 for d in docs)
    assert packing["pad_tokens"] == sum(1024 - (int(p[-1]["start"]) + int(p[-1]["length"]))
                                        for p in pieces)


M64 = (1 << 64) - 1


def mix(x: int) -> int:
    """SplitMix64's finaliser, as in crates/reader/src/permute.rs."""
    z = (x + 0x9E3779B97F4A7C15) & M64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & M64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & M64
    return z ^ (z >> 31)


def permutation(n: int, seed: int, stream: int) -> list[int]:
    """The keyed Feistel permutation of 0..n with cycle walking (crates/reader/src/permute.rs)."""
    k = max(((n - 1).bit_length() + 1) // 2, 1) if n > 1 else 1
    base = mix(mix(seed) ^ stream)
    keys = [mix(base ^ mix(i)) for i in range(6)]
    mask = (1 << k) - 1

    def feistel(x: int) -> int:
        left, right = x >> k, x & mask
        for key in keys:
            left, right = right, left ^ (mix(right ^ key) & mask)
        return (left << k) | right

    def image(i: int) -> int:
        x = feistel(i)
        while x >= n:
            x = feistel(x)
        return x

    return [image(i) for i in range(n)]


def test_concat_seeded_order_is_the_documented_permutation(documents, tmp_path):
    docs = list(NumpyDataset(documents).records())
    stream = np.concatenate(docs)
    out = tmp_path / "concat"
    run("pack", str(documents), str(out), "--seq-len", "777", "--mode", "concat",
        "--seed", "12345", "--quiet")
    m, rows, pieces = read_packed(out)
    check_pieces(rows, pieces, docs, None)
    n = len(stream) // 777
    assert len(rows) == n and m["packing"]["tokens_dropped"] == len(stream) % 777
    order = permutation(n, 12345, 0)
    for i, row in enumerate(rows):
        j = order[i]
        assert np.array_equal(row, stream[j * 777:(j + 1) * 777]), f"row {i} is not stream row {j}"


def test_packed_manifest_matches_schema(documents, tmp_path):
    import jsonschema

    out = tmp_path / "bestfit"
    run("pack", str(documents), str(out), "--seq-len", "2048", "--quiet")
    schema = json.loads(SCHEMA.read_text(encoding="utf-8"))
    manifest = json.loads((out / "manifest.json").read_text(encoding="utf-8"))
    jsonschema.validators.validator_for(schema)(schema).validate(manifest)
    assert manifest["special_tokens"]["pad"] == EOS
    assert TOKEN_DTYPES[2][0] == manifest["dtype"]
