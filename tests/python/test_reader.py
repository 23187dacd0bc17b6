"""The Python reader for training loops (the installed package `prep`, whose
prep.reader is python/prep/reader.py, the one file users may also copy
alone), against prep itself.

Datasets come from the real binary (`prep tokenize`, `prep pack`) or, for
the sampler and the corrupt-file cases, are written here from the byte
layout of crates/reader/src/format/FORMAT.md. Records are compared with the independent
reader of test_reference.py and the .seg parser of test_packed.py; the
sampler's order with `prep sample`, for sizes, seeds, epochs, ranks and world
sizes up to the edges of u64. The torch tests are skipped where torch is not
installed, unless PREP_REQUIRE_TORCH is set (make test sets it).

    make package   # builds the wheel and installs it into target/venv
    PREP_BIN=target/debug/prep target/venv/bin/python -m pytest tests/python
"""

from __future__ import annotations

import itertools
import json
import math
import os
import pickle
import random
import shutil
import struct
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import xxhash

from test_packed import check_pieces, permutation, read_packed
from test_reference import CORPUS, FIXTURES, PREP_BIN, REPO, SCHEMA, NumpyDataset

import prep as prep_module  # noqa: E402  (prep() below runs the binary)
from prep import Dataset, FormatError, Sampler, UnsupportedVersion  # noqa: E402


def need_torch():
    """torch, or a skip where it is not installed (a failure under PREP_REQUIRE_TORCH)."""
    if os.environ.get("PREP_REQUIRE_TORCH"):
        import torch

        return torch
    return pytest.importorskip("torch", reason="torch is not installed: make test installs it")

GPT2 = FIXTURES / "tokenizers" / "gpt2.tokenizer.json.zst"


def prep(*args: object, check: bool = True) -> subprocess.CompletedProcess:
    if not PREP_BIN.is_file():
        pytest.fail(f"no prep binary at {PREP_BIN}: build it (cargo build) or set PREP_BIN")
    proc = subprocess.run([str(PREP_BIN), *map(str, args)], capture_output=True, text=True, check=False)
    if check:
        assert proc.returncode == 0, f"prep {' '.join(map(str, args))}: {proc.stderr}"
    return proc


@pytest.fixture(scope="module")
def documents(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("reader") / "docs"
    prep("tokenize", "--tokenizer", GPT2, "--input", CORPUS, "--output", out,
         "--shard-size", "256KiB", "--quiet")
    return out


@pytest.fixture(scope="module")
def packed(documents) -> Path:
    out = documents.parent / "packed"
    prep("pack", documents, out, "--seq-len", "512", "--shard-size", "256KiB", "--quiet")
    return out


# --- A minimal dataset, written here ----------------------------------------------------------

def write_dataset(root: Path, shards: list, dtype: str = "uint16", vocab_size: int = 65536) -> Path:
    """A valid documents dataset: `shards` is a list of (tokens, offsets), or of lists of records."""
    np_dtype = np.dtype({"uint16": "<u2", "uint32": "<u4"}[dtype])
    root.mkdir(parents=True, exist_ok=True)
    entries = []
    for k, shard in enumerate(shards):
        if isinstance(shard, list):
            lengths = [len(r) for r in shard]
            tokens = np.concatenate([np.asarray(r, dtype=np_dtype) for r in shard] or
                                    [np.zeros(0, np_dtype)])
            offsets = np.concatenate([[0], np.cumsum(lengths)]).astype("<u8")
        else:
            tokens, offsets = shard
        n_records, n_tokens = len(offsets) - 1, int(offsets[-1])
        idx = struct.pack("<8sIB3sQQ", b"PREPIDX\0", 1, np_dtype.itemsize, b"\0\0\0",
                          n_records, n_tokens) + np.asarray(offsets, "<u8").tobytes()
        data = np.asarray(tokens, np_dtype).tobytes()
        name = f"shard-{k:05d}"
        (root / f"{name}.bin").write_bytes(data)
        (root / f"{name}.idx").write_bytes(idx)
        entries.append({"bin": f"{name}.bin", "idx": f"{name}.idx", "n_records": n_records,
                        "n_tokens": n_tokens, "bin_bytes": len(data), "idx_bytes": len(idx),
                        "bin_xxh3": xxhash.xxh3_64_hexdigest(data),
                        "idx_xxh3": xxhash.xxh3_64_hexdigest(idx)})
    n_records = sum(e["n_records"] for e in entries)
    manifest = {
        "format": "prep", "version": 1, "kind": "documents", "dtype": dtype,
        "vocab_size": vocab_size, "n_records": n_records,
        "n_tokens": sum(e["n_tokens"] for e in entries),
        "special_tokens": {"bos": None, "eos": None, "pad": None},
        "bos_prepended": False, "eos_appended": False,
        "tokenizer": {"file": None, "xxh3": xxhash.xxh3_64_hexdigest(b"")},
        "shards": entries,
        "provenance": {
            "prep_version": "0.0.0", "command": "tests/python/test_reader.py",
            "created": "2026-01-01T00:00:00Z", "inputs": [], "options": {},
            "documents": {"read": n_records, "written": n_records, "skipped": 0,
                          "deduplicated": 0, "empty": 0},
            "fingerprint": xxhash.xxh3_64_hexdigest(json.dumps([dtype, n_records]).encode()),
        },
    }
    (root / "manifest.json").write_text(json.dumps(manifest, indent=2) + "\n")
    return root


def empty_records(root: Path, n: int) -> Path:
    """A dataset of n empty records in one shard: any n for the price of its .idx."""
    return write_dataset(root, [(np.zeros(0, "<u2"), np.zeros(n + 1, "<u8"))])


def test_written_dataset_is_valid_for_prep_and_the_schema(tmp_path):
    import jsonschema

    root = write_dataset(tmp_path / "ds", [[], [[1, 2, 3], [], [65535]], [[], []], [[7] * 1000]])
    proc = prep("validate", root, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    schema = json.loads(SCHEMA.read_text(encoding="utf-8"))
    jsonschema.validators.validator_for(schema)(schema).validate(
        json.loads((root / "manifest.json").read_text()))


# --- Records ------------------------------------------------------------------------------------

def test_records_equal_the_reference_reader(documents):
    ds = Dataset(documents)
    ref = list(NumpyDataset(documents).records())
    assert len(ds.manifest["shards"]) > 2, "the test wants several shards"
    assert len(ds) == len(ref) == ds.manifest["n_records"]
    assert ds.kind == "documents" and ds.seq_len is None and ds.dtype == np.dtype("<u2")
    assert ds.manifest == json.loads((documents / "manifest.json").read_text())
    for i, want in enumerate(ref):
        assert ds[i].dtype == ds.dtype and np.array_equal(ds[i], want), f"record {i}"
    assert all(np.array_equal(a, b) for a, b in zip(ds, ref, strict=True))
    # The vectorized lookup finds the same shards as the scalar one.
    s, j = ds.locate(np.arange(len(ds)))
    firsts = np.cumsum([0] + [e["n_records"] for e in ds.manifest["shards"] if e["n_records"]])
    assert np.array_equal(firsts[s] + j, np.arange(len(ds)))


def test_sum_files_hold_each_chunks_checksum_and_the_reader_ignores_them(documents, tmp_path):
    """Every shard prep writes has a .sum, read here from the byte layout of
    FORMAT.md: the XXH3-64 of each chunk of its .bin. The reader reads a
    dataset with them as one without (an older prep's)."""
    m = json.loads((documents / "manifest.json").read_text())
    for s in m["shards"]:
        raw = (documents / s["sum"]).read_bytes()
        assert len(raw) == s["sum_bytes"] and xxhash.xxh3_64_hexdigest(raw) == s["sum_xxh3"]
        magic, version, reserved, chunk, n = struct.unpack_from("<8sIIQQ", raw)
        assert (magic, version, reserved, chunk) == (b"PREPSUM\0", 1, 0, 1 << 20)
        data = (documents / s["bin"]).read_bytes()
        assert n == -(-len(data) // chunk) and len(raw) == 32 + 8 * n
        want = [xxhash.xxh3_64_intdigest(data[i * chunk:(i + 1) * chunk]) for i in range(n)]
        assert list(struct.unpack_from(f"<{n}Q", raw, 32)) == want
    old = tmp_path / "old"
    shutil.copytree(documents, old)
    for s in m["shards"]:
        (old / s.pop("sum")).unlink()
        del s["sum_bytes"], s["sum_xxh3"]
    (old / "manifest.json").write_text(json.dumps(m))
    a, b = Dataset(documents), Dataset(old)
    assert len(a) == len(b) and all(np.array_equal(a[i], b[i]) for i in range(0, len(a), 97))
    assert prep("validate", old, check=False).returncode == 0


def test_indexing_is_like_a_python_sequence(documents):
    ds = Dataset(documents)
    n = len(ds)
    assert np.array_equal(ds[-1], ds[n - 1]) and np.array_equal(ds[-n], ds[0])
    assert np.array_equal(ds[np.int64(3)], ds[3]) and np.array_equal(ds[np.uint64(3)], ds[3])
    for bad in (n, n + 1, -n - 1, 2**64):
        with pytest.raises(IndexError):
            ds[bad]
    for bad in (1.0, "1", None):
        with pytest.raises(TypeError):
            ds[bad]


def test_records_are_read_only_views_of_the_mapping(documents):
    ds = Dataset(documents)
    for i in (0, len(ds) // 2, len(ds) - 1):
        r = ds[i]
        assert not r.flags.owndata and not r.flags.writeable
        assert np.shares_memory(r, ds[i]), "two reads of a record must view the same bytes"


def test_dataset_pickles_as_its_path(packed):
    ds = Dataset(packed)
    again = pickle.loads(pickle.dumps(ds))
    assert len(pickle.dumps(ds)) < 1000, "the mapped tokens must not be pickled"
    assert np.array_equal(again[7], ds[7]) and np.array_equal(again.segments(7), ds.segments(7))


def test_packed_rows_and_segments_equal_the_seg_parser(documents, packed):
    ds = Dataset(packed)
    m, rows, pieces = read_packed(packed)
    assert len(m["shards"]) > 2
    assert ds.kind == "packed" and ds.seq_len == 512 and len(ds) == len(rows)
    for i, (row, segs) in enumerate(zip(rows, pieces, strict=True)):
        assert ds[i].shape == (512,) and np.array_equal(ds[i], row), f"row {i}"
        got = ds.segments(i)
        assert got.dtype == prep_module.SEGMENT_DTYPE and np.array_equal(got, segs), f"row {i}"
    docs = list(NumpyDataset(documents).records())
    check_pieces([ds[i] for i in range(len(ds))], [ds.segments(i) for i in range(len(ds))],
                 docs, m["special_tokens"]["pad"])
    assert np.array_equal(ds.segments(-1), pieces[-1])


def test_segments_of_a_documents_dataset_is_an_error(documents):
    with pytest.raises(ValueError, match="segment index"):
        Dataset(documents).segments(0)


def test_empty_shards_and_empty_records(tmp_path):
    records = [[], [1, 2, 3], [], [65535], [], []]
    root = write_dataset(tmp_path / "ds", [[], records[:3], [[]], [], records[4:], [records[3]]])
    ds = Dataset(root)
    want = records[:3] + [[]] + records[4:] + [records[3]]
    assert len(ds) == len(want)
    for i, r in enumerate(want):
        assert ds[i].tolist() == r, f"record {i}"
    empty = Dataset(write_dataset(tmp_path / "none", []))
    assert len(empty) == 0 and list(empty) == []
    with pytest.raises(IndexError):
        empty[0]


def test_uint32_tokens(tmp_path):
    records = [[0, 70000, 2**32 - 1], [5]]
    ds = Dataset(write_dataset(tmp_path / "ds", [records], dtype="uint32", vocab_size=2**32))
    assert ds.dtype == np.dtype("<u4") and [r.tolist() for r in ds] == records


def test_missing_and_newer_manifests(tmp_path):
    with pytest.raises(FileNotFoundError, match="manifest.json"):
        Dataset(tmp_path)
    root = write_dataset(tmp_path / "ds", [[[1]]])
    m = json.loads((root / "manifest.json").read_text())
    (root / "manifest.json").write_text(json.dumps({**m, "version": 3}))
    with pytest.raises(UnsupportedVersion, match=r"manifest\.json: format version 3") as e:
        Dataset(root)
    assert isinstance(e.value, FormatError) and isinstance(e.value, ValueError)
    assert e.value.path == root / "manifest.json"


# --- Corrupt files ------------------------------------------------------------------------------

def patch(path: Path, at: int, data: bytes) -> None:
    raw = bytearray(path.read_bytes())
    raw[at:at + len(data)] = data
    path.write_bytes(bytes(raw))


def edit_manifest(root: Path, fn) -> None:
    m = json.loads((root / "manifest.json").read_text())
    fn(m)
    (root / "manifest.json").write_text(json.dumps(m))


IDX, BIN, SEG, MANIFEST = "shard-00001.idx", "shard-00001.bin", "shard-00001.seg", "manifest.json"

# (what, file the error must name, how to break the dataset at root)
CORRUPTIONS = [
    ("idx truncated", IDX, lambda r: (r / IDX).write_bytes((r / IDX).read_bytes()[:-8])),
    ("idx shorter than its header", IDX, lambda r: (r / IDX).write_bytes(b"PREPIDX\0\1\0")),
    ("idx empty", IDX, lambda r: (r / IDX).write_bytes(b"")),
    ("idx bad magic", IDX, lambda r: patch(r / IDX, 0, b"PREPIDY\0")),
    ("idx newer version", IDX, lambda r: patch(r / IDX, 8, struct.pack("<I", 2))),
    ("idx token size", IDX, lambda r: patch(r / IDX, 12, b"\4")),
    ("idx reserved", IDX, lambda r: patch(r / IDX, 13, b"\1")),
    ("idx huge record count", IDX, lambda r: patch(r / IDX, 16, struct.pack("<Q", 2**64 - 1))),
    ("idx token count", IDX, lambda r: patch(r / IDX, 24, struct.pack("<Q", 1))),
    ("first offset", IDX, lambda r: patch(r / IDX, 32, struct.pack("<Q", 1))),
    ("offsets decrease", IDX, lambda r: patch(r / IDX, 40, struct.pack("<QQ", 5, 2))),
    ("last offset", IDX, lambda r: patch(r / IDX, (r / IDX).stat().st_size - 8, struct.pack("<Q", 2))),
    ("bin too short", BIN, lambda r: (r / BIN).write_bytes((r / BIN).read_bytes()[:-2])),
    ("bin too long", BIN, lambda r: (r / BIN).write_bytes((r / BIN).read_bytes() + b"\0\0")),
    ("manifest not JSON", MANIFEST, lambda r: (r / MANIFEST).write_text("{")),
    ("manifest format", MANIFEST, lambda r: edit_manifest(r, lambda m: m.update(format="perp"))),
    ("manifest counts", MANIFEST, lambda r: edit_manifest(r, lambda m: m.update(n_records=1))),
    ("manifest dtype", MANIFEST, lambda r: edit_manifest(r, lambda m: m.update(dtype="int8"))),
    ("shard path escapes", MANIFEST,
     lambda r: edit_manifest(r, lambda m: m["shards"][0].update(bin="../x.bin"))),
    ("sum path escapes", MANIFEST, lambda r: edit_manifest(
        r, lambda m: m["shards"][0].update(sum="../x.sum", sum_bytes=40, sum_xxh3="0" * 16))),
    ("shard counts", "shard-00000.idx", lambda r: edit_manifest(
        r, lambda m: [m["shards"][0].update(n_records=3), m["shards"][1].update(n_records=2)])),
]

SEG_CORRUPTIONS = [
    ("seg size", SEG, lambda r: (r / SEG).write_bytes((r / SEG).read_bytes() + bytes(8))),
    ("seg truncated", SEG, lambda r: (r / SEG).write_bytes((r / SEG).read_bytes()[:10])),
    ("seg bad magic", SEG, lambda r: patch(r / SEG, 0, b"PREPSEH\0")),
    ("seg newer version", SEG, lambda r: patch(r / SEG, 8, struct.pack("<I", 9))),
    ("seg seq_len", SEG, lambda r: patch(r / SEG, 12, struct.pack("<I", 511))),
    ("seg row index decreases", SEG, lambda r: patch(r / SEG, 40, struct.pack("<Q", 2**40))),
    ("seg row index start", SEG, lambda r: patch(r / SEG, 32, struct.pack("<Q", 1))),
    ("manifest seq_len", "shard-00000.seg", lambda r: edit_manifest(r, lambda m: m.update(seq_len=256))),
    ("row length", IDX, lambda r: patch(r / IDX, 40, struct.pack("<Q", 500))),
]


@pytest.mark.parametrize("what,name,corrupt", CORRUPTIONS, ids=[c[0] for c in CORRUPTIONS])
def test_corrupt_documents_raise_format_error(tmp_path, what, name, corrupt):
    root = write_dataset(tmp_path / "ds", [[[1, 2]], [[1, 2, 3], [4, 5], [6], [7, 8, 9, 10]]])
    Dataset(root)
    corrupt(root)
    with pytest.raises(FormatError) as e:
        Dataset(root)
    assert name in str(e.value), e.value
    # prep's own reader refuses it too: the two agree on what a dataset is.
    assert prep("sample", root, "--seed", 0, check=False).returncode == 2, what


@pytest.mark.parametrize("what,name,corrupt", SEG_CORRUPTIONS, ids=[c[0] for c in SEG_CORRUPTIONS])
def test_corrupt_packed_raise_format_error(packed, tmp_path, what, name, corrupt):
    root = tmp_path / "packed"
    shutil.copytree(packed, root)
    corrupt(root)
    with pytest.raises(FormatError) as e:
        Dataset(root)
    assert name in str(e.value), e.value
    if what != "row length":  # prep's quick checks leave row lengths to `prep validate`
        assert prep("sample", root, "--seed", 0, check=False).returncode == 2, what


def _seg_entries(root: Path, name: str) -> tuple[int, np.ndarray]:
    """(byte offset of the entries, row index) of the .seg file `name`."""
    raw = (root / name).read_bytes()
    n_rows = struct.unpack_from("<Q", raw, 16)[0]
    row_index = np.frombuffer(raw, dtype="<u8", offset=32, count=n_rows + 1)
    return 32 + 8 * (n_rows + 1), row_index


def test_seg_entry_past_its_row_is_refused(packed, tmp_path):
    """A .seg entry outside its row (start 5000 and length 4e9 at seq_len 512,
    a last piece one token too long or past u32, an empty piece, a gap) is
    refused when the row is read, naming the file and the entry, in the same
    words as prep's reader, instead of reaching code that builds cu_seqlens;
    every other row still reads."""
    root = tmp_path / "packed"
    shutil.copytree(packed, root)
    pristine = (root / SEG).read_bytes()
    ds = Dataset(root)
    first_of_shard = ds.manifest["shards"][0]["n_records"]
    at, row_index = _seg_entries(root, SEG)
    # A row of shard 1 with several pieces, so a broken entry can follow sound ones.
    j = next(r for r in range(len(row_index) - 1) if row_index[r + 1] - row_index[r] >= 2)
    i = first_of_shard + j
    pieces = ds.segments(i).copy()
    first, last = int(row_index[j]), int(row_index[j + 1]) - 1
    last_start = int(pieces["start"][-1])
    cases = [  # (entry, start, length, what the error says)
        (first, 5000, 4_000_000_000, "piece 0 starts at 5000, expected 0"),
        (last, last_start, 512 - last_start + 1, "ends at 513, past the row's 512 tokens"),
        (last, last_start, 2**32 - 1, "past the row's 512 tokens"),
        (last, last_start, 0, "is empty"),
        (last, last_start + 1, 512 - last_start - 1, f"starts at {last_start + 1}, expected {last_start}"),
    ]
    for entry, start, length, says in cases:
        raw = bytearray(pristine)
        raw[at + 24 * entry + 16:at + 24 * entry + 24] = struct.pack("<II", start, length)
        (root / SEG).write_bytes(bytes(raw))
        ds = Dataset(root)  # opening stays cheap: rows are checked when read
        with pytest.raises(prep_module.SegmentError) as e:
            ds.segments(i)
        assert isinstance(e.value, FormatError)
        assert (e.value.path, e.value.row, e.value.entry) == (root / SEG, j, entry)
        assert f"row {j}, entry {entry}: " in str(e.value) and says in str(e.value), e.value
        for other in range(len(ds)):
            if other != i:
                got = ds.segments(other)
                assert got.size == 0 or int(got["start"][-1]) + int(got["length"][-1]) <= 512
        # prep's reader refuses the same row with the same words.
        proc = prep("inspect", root, "--record", i, check=False)
        assert proc.returncode == 2, (says, proc.stdout)
        rust_says = str(e.value).split(": ", 1)[1]
        assert SEG in proc.stderr and rust_says in proc.stderr, (rust_says, proc.stderr)


# --- The sampler --------------------------------------------------------------------------------

SEEDS = [0, 1, 2**63 + 5, 2**64 - 1]


def sampler_cases() -> list[tuple[int, int, int, int, int, int]]:
    """(n, seed, epoch, rank, world_size, start): every small n and seed, ranks and starts drawn."""
    rng = random.Random(20260101)
    cases = []
    for n in (0, 1, 2, 3, 4, 5, 17, 1000):
        for seed in SEEDS:
            for world_size in (1, rng.randint(2, 8)):
                rank = rng.randrange(world_size)
                epoch = rng.choice([0, 1, 7, 2**64 - 1])
                start = rng.choice([0, rng.randint(0, n // world_size + 1)])
                cases.append((n, seed, epoch, rank, world_size, start))
    for world_size in range(1, 9):
        for rank in range(world_size):
            cases.append((1000, 2**63 + 5, 3, rank, world_size, rng.choice([0, 17])))
    return cases


@pytest.fixture(scope="module")
def sized(tmp_path_factory):
    """A dataset of n (empty) records, for any n, made once per n."""
    root, made = tmp_path_factory.mktemp("sized"), {}

    def get(n: int) -> Path:
        if n not in made:
            made[n] = empty_records(root / str(n), n)
        return made[n]
    return get


def prep_sample(ds: Path, seed, epoch, rank, world_size, start, count=None) -> list[int]:
    args = ["sample", ds, "--seed", seed, "--epoch", epoch, "--rank", rank,
            "--world-size", world_size, "--start", start]
    out = prep(*args, *(["--count", count] if count is not None else [])).stdout
    return [int(line) for line in out.split()]


@pytest.mark.parametrize("n,seed,epoch,rank,world_size,start", sampler_cases())
def test_sampler_equals_prep_sample(sized, n, seed, epoch, rank, world_size, start):
    s = Sampler(n, seed, epoch=epoch, rank=rank, world_size=world_size, start=start)
    want = prep_sample(sized(n), seed, epoch, rank, world_size, start)
    assert list(s) == want
    assert len(s) == len(want) == max(n // world_size - start, 0)
    assert s.indices().tolist() == want


@pytest.mark.parametrize("seed,epoch,rank,world_size,where", [
    (2**64 - 1, 0, 0, 1, 0.5), (1, 5, 2, 3, 0.25), (2**63 + 5, 1, 7, 8, 1.0), (0, 2, 0, 2, 0.0)])
def test_sampler_equals_prep_sample_on_a_million_records(sized, seed, epoch, rank, world_size, where):
    n = 2**20 + 3
    per_rank = n // world_size
    start = max(int(per_rank * where) - 100, 0)  # 1.0: the last 100 positions of the epoch
    s = Sampler(n, seed, epoch, rank, world_size, start=start)
    want = prep_sample(sized(n), seed, epoch, rank, world_size, start, count=5000)
    assert list(itertools.islice(s, 5000)) == want
    assert s.indices(start, start + 5000).tolist() == want
    assert [s.get(start + k) for k in range(0, len(want), 97)] == want[::97]


def test_one_rank_reads_the_documented_permutation():
    for n in (0, 1, 2, 10, 255, 256, 257, 4097):
        for seed, epoch in ((0, 0), (42, 3), (2**64 - 1, 2**64 - 1)):
            assert list(Sampler(n, seed, epoch)) == permutation(n, seed, epoch), (n, seed, epoch)
    # prep's known values (crates/reader/src/permute.rs).
    assert list(Sampler(10, 0, 0)) == [6, 1, 8, 5, 3, 7, 9, 2, 0, 4]
    assert list(Sampler(10, 42, 3)) == [3, 4, 6, 7, 1, 0, 5, 8, 9, 2]


def test_ranks_share_an_epoch_minus_the_remainder():
    for n, w in ((0, 1), (1, 1), (5, 2), (10, 3), (97, 8), (1000, 7), (70000, 3)):
        seen = np.concatenate([Sampler(n, 3, 1, r, w).indices() for r in range(w)])
        assert len(np.unique(seen)) == len(seen) == n - n % w, (n, w)


def test_resuming_with_another_world_size_repeats_little_and_skips_nothing():
    n, w, w2, k = 1000, 8, 3, 37
    consumed = {i for r in range(w) for i in Sampler(n, 1, 0, r, w).indices(0, k).tolist()}
    k2 = Sampler.resume_position(k, w, w2)
    assert k2 == k * w // w2
    rest = [i for r in range(w2) for i in Sampler(n, 1, 0, r, w2, start=k2)]
    assert sum(i in consumed for i in rest) < w2
    assert len(consumed | set(rest)) == n - n % w2


def test_sampler_positions_and_errors():
    s = Sampler(100, 5, epoch=2, rank=1, world_size=3, start=10)
    whole = list(Sampler(100, 5, epoch=2, rank=1, world_size=3))
    assert len(whole) == 33 and list(s) == whole[10:] and len(s) == 23
    assert [s.get(p) for p in range(33)] == whole
    assert s.indices(5, 8).tolist() == whole[5:8] and s.indices(40, 50).size == 0
    for bad in (-1, 33):
        with pytest.raises(IndexError):
            s.get(bad)
    assert len(Sampler(100, 5, start=1000)) == 0 and list(Sampler(100, 5, start=1000)) == []
    with pytest.raises(ValueError, match="world_size"):
        Sampler(10, 0, world_size=0)
    with pytest.raises(ValueError, match="rank 3 is not below world_size 3"):
        Sampler(10, 0, rank=3, world_size=3)
    for bad in ({"seed": -1}, {"seed": 2**64}, {"epoch": -1}, {"start": -2}):
        with pytest.raises(ValueError):
            Sampler(10, **{"seed": 0, **bad})
    with pytest.raises(TypeError):
        Sampler(10, 1.5)
    assert Sampler.resume_position(2**63, 8, 3) == 2**63 * 8 // 3
    with pytest.raises(ValueError):
        Sampler.resume_position(5, 2, 0)


# --- torch --------------------------------------------------------------------------------------

@pytest.mark.parametrize("module", ["prep", "prep_reader"])
def test_the_reader_imports_without_torch(module, tmp_path):
    # prep_reader: python/prep/reader.py copied alone, as users copy it.
    shutil.copy(REPO / "python" / "prep" / "reader.py", tmp_path / "prep_reader.py")
    code = ("import sys; sys.modules['torch'] = None; sys.path.insert(0, sys.argv[1]); "
            f"import {module}\n"
            f"assert 'PackedDataset' not in {module}.__all__\n"
            f"try:\n    from {module} import PackedDataset\n"
            "except ImportError as e:\n    assert 'needs torch' in str(e) or 'needs the prep package' in str(e), e\n"
            "else:\n    raise AssertionError('PackedDataset without torch')\n")
    proc = subprocess.run([sys.executable, "-c", code, str(tmp_path)],
                          capture_output=True, text=True, check=False)
    assert proc.returncode == 0, proc.stderr


def loader_rows(torch, data, batch_size, num_workers, take=None, **kw):
    """The rows a DataLoader gives, batch after batch, as one (rows, L) array; and the batch count."""
    from torch.utils.data import DataLoader

    batches = list(itertools.islice(DataLoader(data, batch_size=batch_size,
                                               num_workers=num_workers, **kw), take))
    assert all(b.dtype == torch.int64 for b in batches)
    return (torch.cat(batches).numpy() if batches else np.zeros((0, data.dataset.seq_len))), len(batches)


def expected_rows(ds, seed, epoch, rank, world_size, start=0):
    """The rows every reader of the package reads: the stream's order, as
    StreamingDataset's indices() gives it for the same arguments."""
    order = prep_module.StreamingDataset(ds.path, seed=seed, epoch=epoch, rank=rank, world_size=world_size)
    if start:
        order.load_state_dict({**order.state_dict(), "position": start})
    return np.stack([ds[int(i)] for i in order.indices()])


@pytest.mark.filterwarnings("ignore:This DataLoader will create")  # 3 workers on 2 cores
@pytest.mark.parametrize("num_workers", [0, 1, 2, 3])
def test_dataloader_gives_the_readers_order(packed, num_workers):
    torch = need_torch()
    data = prep_module.PackedDataset(packed, seed=7, epoch=1, rank=1, world_size=3, batch_size=4)
    want = expected_rows(data.dataset, 7, 1, 1, 3)
    assert len(want) % 4 != 0, "the test wants a partial last batch"
    rows, n_batches = loader_rows(torch, data, 4, num_workers)
    assert n_batches == math.ceil(len(want) / 4) == len(torch.utils.data.DataLoader(data, batch_size=4))
    assert np.array_equal(rows, want)


@pytest.mark.parametrize("num_workers", [0, 2])
def test_state_dict_resumes_where_the_run_stopped(packed, num_workers):
    torch = need_torch()
    PackedDataset = prep_module.PackedDataset
    want = expected_rows(Dataset(packed), 3, 0, 0, 2)
    data = PackedDataset(packed, seed=3, rank=0, world_size=2, batch_size=4)
    first, k = loader_rows(torch, data, 4, num_workers, take=37)
    state = data.state_dict(batches=k)
    # A global position: 37 batches of 4 rows on each of 2 ranks.
    assert (state["format"], state["seed"], state["epoch"], state["position"]) == ("prep-stream", 3, 0, 296)
    if num_workers == 0:
        assert data.state_dict() == state, "the iterator's own count is exact without workers"
    again = PackedDataset(packed, seed=3, rank=0, world_size=2, batch_size=4)
    again.load_state_dict(json.loads(json.dumps(state)))
    rest, _ = loader_rows(torch, again, 4, num_workers, take=20)
    # ... and once more, from the middle of the resumed run.
    state2 = again.state_dict(batches=20)
    assert state2["position"] == 296 + 160
    third = PackedDataset(packed, seed=3, rank=0, world_size=2, batch_size=4)
    third.load_state_dict(state2)
    tail, _ = loader_rows(torch, third, 4, num_workers)
    assert np.array_equal(np.concatenate([first, rest, tail]), want)
    # At the end of the epoch the position is n // world_size * world_size, and nothing is left.
    done = third.state_dict(batches=10**9)
    assert done["position"] == len(data.dataset) // 2 * 2
    third.load_state_dict(done)
    assert len(third) == 0 and list(third) == []


def test_set_epoch_and_other_world_sizes(packed):
    need_torch()
    PackedDataset = prep_module.PackedDataset
    data = PackedDataset(packed, seed=11, rank=2, world_size=4)
    it = iter(data)
    for _ in range(10):
        next(it)
    assert data.state_dict()["position"] == 40  # 10 rows on each of 4 ranks
    data.set_epoch(5)
    assert data.state_dict()["position"] == 0
    assert np.array_equal(np.stack([r.numpy() for r in data]), expected_rows(data.dataset, 11, 5, 2, 4))
    # A state of 4 ranks after 30 rows each, resumed on 3 ranks: the rest of
    # the epoch from global position 120, no row twice, none left out.
    data.set_epoch(5)
    it = iter(data)
    for _ in range(30):
        next(it)
    state = data.state_dict()
    assert state["position"] == 120
    three = PackedDataset(packed, seed=11, rank=1, world_size=3)
    three.load_state_dict(state)
    assert three.state_dict() == state
    assert np.array_equal(np.stack([r.numpy() for r in three]),
                          expected_rows(data.dataset, 11, 5, 1, 3, start=120))
    with pytest.raises(ValueError, match="seed"):
        three.load_state_dict({**state, "seed": 12})
    with pytest.raises(ValueError, match="dataset"):
        three.load_state_dict({**state, "dataset": "0" * 16})
    # The state of the sampler's order (before the readers shared one) is refused, saying why.
    with pytest.raises(ValueError, match="not a prep reader state"):
        three.load_state_dict({"seed": 11, "epoch": 5, "position": 30, "world_size": 4, "rank": 2,
                               "n": len(data.dataset)})


def test_targets_are_the_row_shifted_by_one(packed):
    torch = need_torch()
    from torch.utils.data import DataLoader

    data = prep_module.PackedDataset(packed, seed=1, batch_size=4, targets=True)
    inputs, targets = next(iter(DataLoader(data, batch_size=4, num_workers=2)))
    assert inputs.shape == targets.shape == (4, 511)
    assert inputs.dtype == targets.dtype == torch.int64
    rows = expected_rows(data.dataset, 1, 0, 0, 1)[:4]
    assert np.array_equal(inputs.numpy(), rows[:, :-1]) and np.array_equal(targets.numpy(), rows[:, 1:])


def test_workers_started_by_spawn_reopen_the_dataset(packed):
    torch = need_torch()
    data = prep_module.PackedDataset(packed, seed=2, batch_size=8)
    rows, _ = loader_rows(torch, data, 8, 2, take=5, multiprocessing_context="spawn")
    assert np.array_equal(rows, expected_rows(data.dataset, 2, 0, 0, 1)[:40])


def test_packed_dataset_refuses_documents(documents):
    need_torch()
    with pytest.raises(ValueError, match="packed"):
        prep_module.PackedDataset(documents, seed=0)
