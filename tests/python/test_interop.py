"""`prep export` and `prep import` against independent readers of the trainers' formats.

Each export (Megatron's MMIDIDX, nanoGPT's flat .bin, llm.c's shards,
datatrove's .ds files) is read back with tools/interop_read.py, written from
the formats' public descriptions with numpy alone, and compared token by
token with the records read by test_reference.py's reader (neither uses
prep's code). Each export is then imported back with `prep import` and the
new dataset's records compared with the original ones. Edge cases (no
records, one record, empty records, the largest ids of uint16 and uint32,
packed rows) use datasets written here from crates/reader/src/format/FORMAT.md. Where
megatron-core or datatrove is installed, their own readers read the exports
too; otherwise those tests are skipped.

    PREP_BIN=target/debug/prep target/venv/bin/python -m pytest tests/python
"""

from __future__ import annotations

import importlib.util
import json
import struct
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from test_packed import read_packed
from test_reader import write_dataset
from test_reference import CORPUS, FIXTURES, PREP_BIN, REPO, NumpyDataset

sys.path.insert(0, str(REPO / "tools"))
import interop_read  # noqa: E402
from interop_read import (  # noqa: E402
    megatron_index,
    read_datatrove,
    read_llmc,
    read_llmc_shards,
    read_megatron,
    read_nanogpt,
)

GPT2 = FIXTURES / "tokenizers" / "gpt2.tokenizer.json.zst"
EOS = 50256  # <|endoftext|> of GPT-2


def prep(*args: object, check: bool = True) -> subprocess.CompletedProcess:
    if not PREP_BIN.is_file():
        pytest.fail(f"no prep binary at {PREP_BIN}: build it (cargo build) or set PREP_BIN")
    proc = subprocess.run([str(PREP_BIN), *map(str, args)], capture_output=True, text=True,
                          check=False)
    if check:
        assert proc.returncode == 0, f"prep {' '.join(map(str, args))}: {proc.stderr}"
    return proc


def records(root: Path) -> list[np.ndarray]:
    return [np.asarray(r) for r in NumpyDataset(root).records()]


def assert_same(got: list, want: list, what: str) -> None:
    assert len(got) == len(want), f"{what}: {len(got)} records, expected {len(want)}"
    for i, (g, w) in enumerate(zip(got, want)):
        g = np.asarray(g, dtype=np.int64)
        w = np.asarray(w, dtype=np.int64)
        if not np.array_equal(g, w):
            n = min(len(g), len(w))
            at = int(np.argmax(g[:n] != w[:n])) if np.any(g[:n] != w[:n]) else n
            pytest.fail(f"{what}: record {i}: {len(g)} tokens, expected {len(w)}; first "
                        f"difference at {at}: {g[at:at + 8].tolist()} vs {w[at:at + 8].tolist()}")


def stream(recs: list) -> np.ndarray:
    return np.concatenate([np.asarray(r, np.int64) for r in recs] or [np.zeros(0, np.int64)])


def eot_first(recs: list, eos: int = EOS) -> list[np.ndarray]:
    """llm.c's order: each record's final eos moved to its front."""
    out = []
    for r in recs:
        r = np.asarray(r, np.int64)
        assert len(r) and r[-1] == eos, "eot-first needs every record to end with eos"
        out.append(np.concatenate([[eos], r[:-1]]))
    return out


def assert_eos_manifest(root: Path, eos: int = EOS) -> None:
    """An import split at eos says so, as `prep tokenize` would."""
    m = json.loads((root / "manifest.json").read_text())
    assert m["special_tokens"]["eos"] == eos and m["eos_appended"], m["special_tokens"]


def imported(fmt: str, inputs: list, out: Path, *extra: object) -> list[np.ndarray]:
    """`prep import` the inputs, validate the dataset, and return its records."""
    prep("import", fmt, *inputs, out, *extra)
    proc = prep("validate", out, check=False)
    assert proc.returncode == 0, f"prep validate {out}: {proc.stdout}{proc.stderr}"
    return records(out)


@pytest.fixture(scope="module")
def documents(tmp_path_factory) -> Path:
    """The demo corpus, tokenized with GPT-2 into several shards; records end with eos."""
    out = tmp_path_factory.mktemp("interop") / "docs"
    prep("tokenize", "--tokenizer", GPT2, "--input", CORPUS, "--output", out,
         "--shard-size", "256KiB", "--quiet")
    m = json.loads((out / "manifest.json").read_text())
    assert len(m["shards"]) > 1 and m["dtype"] == "uint16" and m["eos_appended"]
    assert m["special_tokens"]["eos"] == EOS
    return out


@pytest.fixture(scope="module")
def reference(documents) -> list[np.ndarray]:
    recs = records(documents)
    assert all(len(r) and r[-1] == EOS for r in recs)
    return recs


# --- megatron ------------------------------------------------------------------------------------

def test_megatron_round_trip(documents, reference, tmp_path):
    prefix = tmp_path / "meg" / "corpus"
    prefix.parent.mkdir()
    prep("export", documents, "--to", "megatron", prefix)
    assert sorted(p.name for p in prefix.parent.iterdir()) == ["corpus.bin", "corpus.idx"]

    index = megatron_index(prefix)
    assert index.dtype == np.dtype("<u2")  # code 8 for a uint16 dataset
    assert (prefix.parent / "corpus.idx").read_bytes()[17] == 8
    # One sequence per document: D = S + 1, document indices 0..S.
    assert np.array_equal(index.document_indices, np.arange(len(reference) + 1))
    assert_same(read_megatron(prefix), reference, "megatron export")

    assert_same(imported("megatron", [prefix], tmp_path / "back", "--tokenizer", GPT2),
                reference, "megatron import")
    m = json.loads((tmp_path / "back" / "manifest.json").read_text())
    assert m["dtype"] == "uint16"


def test_megatron_of_packed_rows(documents, tmp_path):
    packed = tmp_path / "packed"
    prep("pack", documents, packed, "--seq-len", "512", "--shard-size", "256KiB", "--quiet")
    _, rows, _ = read_packed(packed)
    prefix = tmp_path / "rows"
    prep("export", packed, "--to", "megatron", prefix)
    seqs = read_megatron(prefix)
    assert len(seqs) == len(rows) > 1
    assert all(len(s) == 512 for s in seqs)
    assert_same(seqs, rows, "megatron export of packed rows")


# --- nanogpt -------------------------------------------------------------------------------------

def test_nanogpt_round_trip(documents, reference, tmp_path):
    out = tmp_path / "train.bin"
    prep("export", documents, "--to", "nanogpt", out)
    tokens = read_nanogpt(out)
    assert tokens.dtype == np.dtype("<u2")
    assert np.array_equal(tokens.astype(np.int64), stream(reference))

    assert_same(imported("nanogpt", [out], tmp_path / "back", "--eos", EOS), reference,
                "nanogpt import")
    assert_eos_manifest(tmp_path / "back")
    # Without --eos, each input is one record.
    got = imported("nanogpt", [out, out], tmp_path / "whole")
    assert_same(got, [stream(reference)] * 2, "nanogpt import without --eos")


# --- llm.c ---------------------------------------------------------------------------------------

LLMC_CASES = {
    # id: (export options, name, shard tokens, val tokens, eot first)
    "defaults": ([], "prep", 100_000_000, 0, False),
    "val-and-shards": (["--name", "deb", "--shard-tokens", "50000", "--val-tokens", "20000"],
                       "deb", 50_000, 20_000, False),
    "many-small-shards": (["--shard-tokens", "9973", "--val-tokens", "9973"],
                          "prep", 9973, 9973, False),
    "eot-first": (["--shard-tokens", "65536", "--val-tokens", "1000", "--eot-first"],
                  "prep", 65536, 1000, True),
    "val-larger-than-shards": (["--shard-tokens", "20000", "--val-tokens", "30001"],
                               "prep", 20_000, 30_001, False),
    "eot-first-no-val": (["--eot-first", "--name", "fw"], "fw", 100_000_000, 0, True),
}


@pytest.mark.parametrize("case", sorted(LLMC_CASES))
def test_llmc_round_trip(documents, reference, tmp_path, case):
    options, name, shard_tokens, val_tokens, first = LLMC_CASES[case]
    out = tmp_path / "llmc"
    prep("export", documents, "--to", "llmc", out, *options)
    want = stream(eot_first(reference) if first else reference)
    assert len(want) > 3 * 50_000  # the cases above cut several shards

    val, shards = read_llmc_shards(out, name)
    names = sorted(p.name for p in out.iterdir())
    expected_names = ([f"{name}_val_000000.bin"] if val_tokens else []) + [
        f"{name}_train_{k:06d}.bin" for k in range(1, len(shards) + 1)]
    assert names == sorted(expected_names)
    if val_tokens:
        assert val is not None and len(val) == val_tokens
    else:
        assert val is None
    # Cut every shard_tokens tokens of the train stream: full shards, then the rest.
    train_len = len(want) - val_tokens
    assert len(shards) == -(-train_len // shard_tokens)
    assert all(len(s) == shard_tokens for s in shards[:-1])
    assert 0 < len(shards[-1]) <= shard_tokens
    for path in out.iterdir():
        header = np.fromfile(path, dtype="<i4", count=3)
        assert header.tolist()[:2] == [20240520, 1], path  # uint16 tokens

    val2, train = read_llmc(out, name)
    got = np.concatenate([val2 if val2 is not None else np.zeros(0, "<u2"), train])
    assert got.dtype == np.dtype("<u2")
    assert np.array_equal(got.astype(np.int64), want), f"llmc stream ({case})"

    extra = ["--eos", EOS] + (["--eot-first"] if first else [])
    assert_same(imported("llmc", [out], tmp_path / "back", *extra), reference,
                f"llmc import of the directory ({case})")
    assert_eos_manifest(tmp_path / "back")
    if len(names) == 1:  # a shard file itself as the input
        assert_same(imported("llmc", [out / names[0]], tmp_path / "file", *extra), reference,
                    f"llmc import of the shard file ({case})")


def test_llmc_eot_first_import_without_it_keeps_the_stream_order(documents, reference, tmp_path):
    out = tmp_path / "llmc"
    prep("export", documents, "--to", "llmc", out, "--eot-first")
    # Split after each eos instead: every record is the next one's text after a leading eos.
    got = imported("llmc", [out], tmp_path / "back", "--eos", EOS)
    flat = stream(eot_first(reference))
    assert np.array_equal(stream(got), flat)
    assert all(len(r) and r[-1] == EOS for r in got[:-1])


# --- datatrove -----------------------------------------------------------------------------------

def test_datatrove_round_trip(documents, reference, tmp_path):
    prefix = tmp_path / "dt" / "000_corpus"
    prefix.parent.mkdir()
    prep("export", documents, "--to", "datatrove", prefix, "--tokenizer-name", "gpt2")
    assert sorted(p.name for p in prefix.parent.iterdir()) == [
        "000_corpus.ds", "000_corpus.ds.index", "000_corpus.ds.metadata"]
    docs, meta = read_datatrove(prefix)
    assert meta["tokenizer_name"] == "gpt2"
    assert meta["token_size"] == 2
    assert meta["token_count"] == len(stream(reference))
    assert meta["human_count"]
    assert_same(docs, reference, "datatrove export")

    assert_same(imported("datatrove", [prefix], tmp_path / "back"), reference,
                "datatrove import")
    # Two inputs are read in order.
    assert_same(imported("datatrove", [prefix, prefix], tmp_path / "twice"), reference * 2,
                "datatrove import of two prefixes")


def test_datatrove_default_tokenizer_name(documents, tmp_path):
    prefix = tmp_path / "corpus"
    prep("export", documents, "--to", "datatrove", prefix)
    _, meta = read_datatrove(prefix)
    name = meta["tokenizer_name"]
    assert name and "|" not in name and "\n" not in name


# --- Edge cases ----------------------------------------------------------------------------------

ALL_EXPORTS = ["megatron", "nanogpt", "llmc", "datatrove"]


def export_and_read(ds: Path, fmt: str, out: Path, *extra: object):
    """Export `ds` to `fmt` at `out`; return (records or None, stream) as read back."""
    prep("export", ds, "--to", fmt, out, *extra)
    if fmt == "megatron":
        seqs = read_megatron(out)
        return seqs, stream(seqs)
    if fmt == "datatrove":
        docs, meta = read_datatrove(out)
        assert meta["token_count"] == len(stream(docs))
        return docs, stream(docs)
    if fmt == "nanogpt":
        return None, read_nanogpt(out).astype(np.int64)
    val, train = read_llmc(out)
    return None, np.concatenate([np.asarray(val if val is not None else [], np.int64),
                                 train.astype(np.int64)])


@pytest.fixture(scope="module")
def empty_dataset(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("empty")
    (root / "empty.jsonl").write_bytes(b"")
    prep("tokenize", "--tokenizer", GPT2, "--input", root / "empty.jsonl",
         "--output", root / "ds", "--quiet")
    assert json.loads((root / "ds" / "manifest.json").read_text())["n_records"] == 0
    return root / "ds"


@pytest.mark.parametrize("fmt", ALL_EXPORTS)
def test_empty_dataset(empty_dataset, tmp_path, fmt):
    recs, tokens = export_and_read(empty_dataset, fmt, tmp_path / "out")
    assert len(tokens) == 0
    if recs is not None:
        assert recs == []
    if fmt == "megatron":
        assert (tmp_path / "out.idx").stat().st_size == 34 + 8  # S = 0, D = 1
    if fmt in ("megatron", "datatrove"):
        assert imported(fmt, [tmp_path / "out"], tmp_path / "back") == []
    else:
        assert imported(fmt, [tmp_path / "out"], tmp_path / "back", "--eos", EOS) == []


@pytest.mark.parametrize("fmt", ALL_EXPORTS)
def test_single_document(documents, reference, tmp_path, fmt):
    one = [reference[3]]
    ds = write_dataset(tmp_path / "one", [one], vocab_size=50257)
    recs, tokens = export_and_read(ds, fmt, tmp_path / "out")
    assert np.array_equal(tokens, stream(one))
    if recs is not None:
        assert_same(recs, one, f"{fmt} export of one document")
    extra = [] if fmt in ("megatron", "datatrove") else ["--eos", EOS]
    assert_same(imported(fmt, [tmp_path / "out"], tmp_path / "back", *extra), one,
                f"{fmt} import of one document")


# Records ending with the largest uint16 id, used as eos for the stream formats; one empty.
U16_RECORDS = [[0, 65534, 65535], [1, 2, 3, 65535], [65535], [], [40000, 65535]]
U16_STREAM_RECORDS = [r for r in U16_RECORDS if r]  # a stream cannot keep an empty record


@pytest.mark.parametrize("fmt", ALL_EXPORTS)
def test_largest_uint16_ids(tmp_path, fmt):
    ds = write_dataset(tmp_path / "ds", [U16_RECORDS[:2], U16_RECORDS[2:]], vocab_size=65536)
    recs, tokens = export_and_read(ds, fmt, tmp_path / "out")
    assert np.array_equal(tokens, stream(U16_RECORDS))
    if recs is not None:
        assert_same(recs, U16_RECORDS, f"{fmt} export")
        if fmt == "megatron":
            assert megatron_index(tmp_path / "out").dtype == np.dtype("<u2")
        back = imported(fmt, [tmp_path / "out"], tmp_path / "back")
        assert_same(back, U16_RECORDS, f"{fmt} import")
    else:
        back = imported(fmt, [tmp_path / "out"], tmp_path / "back", "--eos", 65535)
        assert_same(back, U16_STREAM_RECORDS, f"{fmt} import")
    assert json.loads((tmp_path / "back" / "manifest.json").read_text())["dtype"] == "uint16"


U32_RECORDS = [[0, 65536, 2**31 - 1], [], [70000, 2**31 - 2, 7]]
U32_HIGH = [[0, 1], [2**31], [2**32 - 1, 5]]


@pytest.mark.parametrize("fmt", ["megatron", "llmc", "datatrove"])
def test_uint32_ids_below_2_31(tmp_path, fmt):
    ds = write_dataset(tmp_path / "ds", [U32_RECORDS], dtype="uint32", vocab_size=2**31)
    recs, tokens = export_and_read(ds, fmt, tmp_path / "out")
    assert np.array_equal(tokens, stream(U32_RECORDS))
    if fmt == "megatron":
        assert megatron_index(tmp_path / "out").dtype == np.dtype("<i4")  # code 4
        assert (tmp_path / "out.idx").read_bytes()[17] == 4
    if fmt == "datatrove":
        assert read_datatrove(tmp_path / "out")[1]["token_size"] == 4
    if fmt == "llmc":
        for path in (tmp_path / "out").iterdir():
            assert np.fromfile(path, dtype="<i4", count=2).tolist() == [20240801, 7], path
        back = imported(fmt, [tmp_path / "out"], tmp_path / "back", "--eos", 7)
        assert_same(back, [stream(U32_RECORDS)], "llmc import")
    else:
        assert_same(recs, U32_RECORDS, f"{fmt} export")
        assert_same(imported(fmt, [tmp_path / "out"], tmp_path / "back"), U32_RECORDS,
                    f"{fmt} import")
    assert json.loads((tmp_path / "back" / "manifest.json").read_text())["dtype"] == "uint32"


@pytest.mark.parametrize("fmt", ["llmc", "datatrove"])
def test_uint32_ids_from_2_31(tmp_path, fmt):
    ds = write_dataset(tmp_path / "ds", [U32_HIGH], dtype="uint32", vocab_size=2**32)
    recs, tokens = export_and_read(ds, fmt, tmp_path / "out")
    assert np.array_equal(tokens, stream(U32_HIGH))
    if recs is not None:
        assert_same(recs, U32_HIGH, f"{fmt} export")
    # 4-byte llm.c and datatrove tokens are uint32: 2^31 is an id, not a negative one.
    back = imported(fmt, [tmp_path / "out"], tmp_path / "back")
    want = [stream(U32_HIGH)] if fmt == "llmc" else U32_HIGH
    assert_same(back, want, f"{fmt} import")


def test_megatron_refuses_ids_from_2_31(tmp_path):
    ds = write_dataset(tmp_path / "ds", [U32_HIGH], dtype="uint32", vocab_size=2**32)
    proc = prep("export", ds, "--to", "megatron", tmp_path / "out", check=False)
    assert proc.returncode == 2 and proc.stderr.strip(), proc.stderr
    assert not [p.name for p in tmp_path.iterdir() if p.name.startswith("out")]


def test_nanogpt_refuses_uint32(tmp_path):
    ds = write_dataset(tmp_path / "ds", [[[1, 2, 3]]], dtype="uint32", vocab_size=70000)
    proc = prep("export", ds, "--to", "nanogpt", tmp_path / "out.bin", check=False)
    assert proc.returncode == 2 and "uint16" in proc.stderr, proc.stderr
    assert not [p.name for p in tmp_path.iterdir() if p.name.startswith("out")]


# --- Bad input -----------------------------------------------------------------------------------

def patch(path: Path, at: int, data: bytes) -> None:
    raw = bytearray(path.read_bytes())
    raw[at:at + len(data)] = data
    path.write_bytes(bytes(raw))


@pytest.fixture(scope="module")
def small(tmp_path_factory) -> Path:
    """A small dataset whose records end with eos 9 (vocabulary of 16)."""
    recs = [[1, 2, 9], [3, 9], [4, 5, 6, 9], [9]]
    return write_dataset(tmp_path_factory.mktemp("small") / "ds", [recs], vocab_size=16)


def megatron_corruptions():
    # (what, corrupt(prefix)) -> the file the error must name
    s = struct.Struct("<Q")
    return {
        "magic": (lambda p: patch(Path(f"{p}.idx"), 0, b"MMIDIDY"), ".idx"),
        "version": (lambda p: patch(Path(f"{p}.idx"), 9, s.pack(2)), ".idx"),
        "dtype code": (lambda p: patch(Path(f"{p}.idx"), 17, b"\x09"), ".idx"),
        "sequence count": (lambda p: patch(Path(f"{p}.idx"), 18, s.pack(5)), ".idx"),
        "last document index": (lambda p: patch(Path(f"{p}.idx"), 34 + 12 * 4 + 8 * 4,
                                                s.pack(3)), ".idx"),
        "pointer": (lambda p: patch(Path(f"{p}.idx"), 34 + 16 + 8, s.pack(2)), ".idx"),
        "truncated idx": (lambda p: Path(f"{p}.idx").write_bytes(Path(f"{p}.idx").read_bytes()[:-1]),
                          ".idx"),
        "truncated bin": (lambda p: Path(f"{p}.bin").write_bytes(Path(f"{p}.bin").read_bytes()[:-2]),
                          ".bin"),
    }


@pytest.mark.parametrize("what", sorted(megatron_corruptions()))
def test_corrupt_megatron(small, tmp_path, what):
    corrupt, suffix = megatron_corruptions()[what]
    prefix = tmp_path / "m"
    prep("export", small, "--to", "megatron", prefix)
    read_megatron(prefix)
    corrupt(prefix)
    with pytest.raises(ValueError, match=r"m\." + suffix[1:]):
        read_megatron(prefix)
    proc = prep("import", "megatron", prefix, tmp_path / "back", check=False)
    assert proc.returncode == 2, f"{what}: {proc.stderr}"
    assert f"m{suffix}" in proc.stderr, proc.stderr
    assert not (tmp_path / "back" / "manifest.json").exists()


def llmc_corruptions():
    i32 = struct.Struct("<i")
    return {
        "magic": lambda p: patch(p, 0, i32.pack(20240521)),
        "version": lambda p: patch(p, 4, i32.pack(7)),
        "count": lambda p: patch(p, 8, i32.pack(100)),
        "reserved": lambda p: patch(p, 1020, i32.pack(1)),
        "truncated": lambda p: p.write_bytes(p.read_bytes()[:-2]),
        "header only": lambda p: p.write_bytes(p.read_bytes()[:1000]),
    }


@pytest.mark.parametrize("what", sorted(llmc_corruptions()))
def test_corrupt_llmc(small, tmp_path, what):
    out = tmp_path / "l"
    prep("export", small, "--to", "llmc", out, "--shard-tokens", "4", "--val-tokens", "3")
    read_llmc(out)
    prep("import", "llmc", out, tmp_path / "before", "--eos", 9)
    shard = out / "prep_train_000002.bin"
    llmc_corruptions()[what](shard)
    with pytest.raises(ValueError, match="prep_train_000002.bin"):
        read_llmc(out)
    proc = prep("import", "llmc", out, tmp_path / "back", "--eos", 9, check=False)
    if what == "reserved":
        # llm.c's loader reads h[0..2] and nothing after, and so does prep's
        # import: the shard imports, to the same tokens as before.
        assert proc.returncode == 0, proc.stderr
        assert (tmp_path / "back" / "shard-00000.bin").read_bytes() == \
            (tmp_path / "before" / "shard-00000.bin").read_bytes()
    else:
        assert proc.returncode == 2, f"{what}: {proc.stderr}"
        assert "prep_train_000002.bin" in proc.stderr, proc.stderr


def test_llmc_reader_needs_consecutive_train_shards(small, tmp_path):
    out = tmp_path / "l"
    prep("export", small, "--to", "llmc", out, "--shard-tokens", "4")
    (out / "prep_train_000002.bin").unlink()
    with pytest.raises(ValueError, match="prep_train_000002.bin"):
        read_llmc(out)


def datatrove_corruptions():
    return {
        "last end": (lambda p: patch(Path(f"{p}.ds.index"), 24, struct.pack("<Q", 9)),
                     ".ds.index"),
        "decreasing ends": (lambda p: patch(Path(f"{p}.ds.index"), 8, struct.pack("<Q", 1)),
                            ".ds.index"),
        "odd index": (lambda p: Path(f"{p}.ds.index").write_bytes(
            Path(f"{p}.ds.index").read_bytes() + b"\0"), ".ds.index"),
        "token size": (lambda p: Path(f"{p}.ds.metadata").write_text("x|3\n10\n10"),
                       ".ds.metadata"),
        "count": (lambda p: Path(f"{p}.ds.metadata").write_text("x|2\n11\n11"),
                  ".ds"),
        "truncated ds": (lambda p: Path(f"{p}.ds").write_bytes(Path(f"{p}.ds").read_bytes()[:-2]),
                         ".ds"),
    }


@pytest.mark.parametrize("what", sorted(datatrove_corruptions()))
def test_corrupt_datatrove(small, tmp_path, what):
    corrupt, suffix = datatrove_corruptions()[what]
    prefix = tmp_path / "d"
    prep("export", small, "--to", "datatrove", prefix)
    docs, meta = read_datatrove(prefix)
    assert meta["token_count"] == 10 and len(docs) == 4
    corrupt(prefix)
    with pytest.raises(ValueError, match="d" + suffix.replace(".", r"\.")):
        read_datatrove(prefix)
    proc = prep("import", "datatrove", prefix, tmp_path / "back", check=False)
    assert proc.returncode == 2, f"{what}: {proc.stderr}"
    assert "d.ds" in proc.stderr, proc.stderr


def test_nanogpt_odd_size(tmp_path):
    path = tmp_path / "odd.bin"
    path.write_bytes(b"\1\0\2")
    with pytest.raises(ValueError, match="odd.bin"):
        read_nanogpt(path)
    proc = prep("import", "nanogpt", path, tmp_path / "back", check=False)
    assert proc.returncode == 2 and "odd.bin" in proc.stderr, proc.stderr


# --- --eos by name, llm.c shard files as one stream, an eos that cannot occur ---------------------

def test_import_eos_by_name(documents, reference, tmp_path):
    out = tmp_path / "train.bin"
    prep("export", documents, "--to", "nanogpt", out)
    assert_same(imported("nanogpt", [out], tmp_path / "named", "--tokenizer", GPT2,
                         "--eos", "<|endoftext|>"), reference, "nanogpt import, eos by name")


def test_llmc_import_of_the_shard_files_is_one_stream(documents, reference, tmp_path):
    out = tmp_path / "llmc"
    prep("export", documents, "--to", "llmc", out, "--shard-tokens", "50000",
         "--val-tokens", "20000")
    files = sorted(out.iterdir(), key=lambda p: ("_train_" in p.name, p.name))  # val first
    assert len(files) > 2
    assert_same(imported("llmc", files, tmp_path / "files", "--eos", EOS), reference,
                "llmc import of the shard files")


def test_import_refuses_an_eos_wider_than_the_tokens(documents, tmp_path):
    out = tmp_path / "train.bin"
    prep("export", documents, "--to", "nanogpt", out)
    proc = prep("import", "nanogpt", out, tmp_path / "back", "--eos", 50256 + 65536, check=False)
    assert proc.returncode == 2 and "uint16" in proc.stderr, proc.stderr


# --- The trainers' own readers, where installed ---------------------------------------------------

def test_megatron_core_reads_the_export(documents, reference, tmp_path):
    if importlib.util.find_spec("megatron") is None:
        pytest.skip("megatron-core is not installed")
    try:
        from megatron.core.datasets.indexed_dataset import IndexedDataset
    except ImportError as e:  # megatron-core without torch, or an older layout
        pytest.skip(f"megatron.core's IndexedDataset does not import: {e}")
    prefix = tmp_path / "corpus"
    prep("export", documents, "--to", "megatron", prefix)
    ds = IndexedDataset(str(prefix), multimodal=False, mmap=True)
    assert len(ds) == len(reference)
    assert_same([ds[i] for i in range(len(ds))], reference, "megatron.core IndexedDataset")
    assert np.array_equal(ds.document_indices, np.arange(len(reference) + 1))


def test_datatrove_reads_the_export(documents, reference, tmp_path):
    if importlib.util.find_spec("datatrove") is None:
        pytest.skip("datatrove is not installed")
    try:
        from datatrove.utils.dataset import DatatroveFileDataset
    except ImportError as e:  # datatrove without torch
        pytest.skip(f"datatrove's DatatroveFileDataset does not import: {e}")
    prefix = tmp_path / "corpus"
    prep("export", documents, "--to", "datatrove", prefix, "--tokenizer-name", "gpt2")
    seq_len = 127
    ds = DatatroveFileDataset(f"{prefix}.ds", seq_len, token_size=2, return_positions=True)
    flat = stream(reference)
    # Windows of seq_len + 1 tokens back to back; positions count from each document's start
    # (or the window's), taken from the .ds.index.
    assert len(ds) == len(flat) // (seq_len + 1)
    ends = np.cumsum([len(r) for r in reference])
    for i in range(len(ds)):
        item = ds[i]
        lo = i * (seq_len + 1)
        at = np.arange(lo, lo + seq_len + 1)
        assert np.array_equal(np.asarray(item["input_ids"], np.int64), flat[at]), f"window {i}"
        doc = np.searchsorted(ends, at, side="right")
        start = np.maximum(np.concatenate([[0], ends])[doc], lo)
        assert np.array_equal(np.asarray(item["positions"], np.int64), at - start), f"window {i}"


def test_interop_read_imports_with_numpy_alone():
    code = ("import sys; sys.path.insert(0, sys.argv[1]); import interop_read; "
            "print(sorted(set(sys.modules) & {'torch', 'megatron', 'datatrove', 'prep_reader'}))")
    proc = subprocess.run([sys.executable, "-c", code, str(REPO / "tools")],
                          capture_output=True, text=True, check=True)
    assert proc.stdout.strip() == "[]"
    assert Path(interop_read.__file__).name == "interop_read.py"


# --- Files in the trainers' own layouts ----------------------------------------------------------

def test_megatron_split_sentences_import_keeps_documents(tmp_path):
    """A file as IndexedDatasetBuilder writes it with --split-sentences: add_item per sentence,
    end_document per document, so document_indices group several sequences."""
    docs = [[[1, 2], [3]], [[4, 5, 6]], [[7], [8], [9, 10]]]
    sentences = [np.array(s, dtype="<u2") for d in docs for s in d]
    lengths = np.array([len(s) for s in sentences], dtype="<i4")
    pointers = np.concatenate([[0], np.cumsum(lengths)[:-1] * 2]).astype("<i8")
    doc_indices = np.cumsum([0] + [len(d) for d in docs]).astype("<i8")
    prefix = tmp_path / "split"
    Path(f"{prefix}.bin").write_bytes(b"".join(s.tobytes() for s in sentences))
    Path(f"{prefix}.idx").write_bytes(
        b"MMIDIDX\x00\x00" + struct.pack("<QBQQ", 1, 8, len(sentences), len(doc_indices))
        + lengths.tobytes() + pointers.tobytes() + doc_indices.tobytes())
    back = imported("megatron", [prefix], tmp_path / "back")
    assert_same(back, [np.concatenate(d) for d in docs], "one record per document")


def test_datatrove_tokenized_file_without_metadata_imports(tmp_path):
    """TokenizedFile alone writes .ds and .ds.index (uint64 document ends), no .ds.metadata."""
    docs = [[70000, 1, 2], [3], [4, 99999]]
    prefix = tmp_path / "00000_unshuffled"
    Path(f"{prefix}.ds").write_bytes(np.concatenate(docs).astype("<u4").tobytes())
    Path(f"{prefix}.ds.index").write_bytes(
        np.cumsum([len(d) for d in docs]).astype("<u8").tobytes())
    assert_same(imported("datatrove", [prefix], tmp_path / "back"), docs, "datatrove import")
