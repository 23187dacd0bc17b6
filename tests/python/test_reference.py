"""prep's datasets, read with numpy alone, hold the reference ids.

Runs `prep tokenize` on fixtures/corpus/debian-sample.jsonl.zst (several shards)
and checks every document against the Python `tokenizers` package, the
reference prep must match (tools/requirements.txt pins its version). The
dataset is read here from the byte layout of crates/reader/src/format/FORMAT.md, without
prep's code, so these tests also check that the format is what it says.

    PREP_BIN=target/debug/prep target/venv/bin/python -m pytest tests/python
"""

from __future__ import annotations

import json
import os
import struct
import subprocess
from pathlib import Path

import numpy as np
import pytest
import xxhash
import zstandard
from tokenizers import Tokenizer

REPO = Path(__file__).resolve().parents[2]
FIXTURES = REPO / "fixtures"
CORPUS = FIXTURES / "corpus" / "debian-sample.jsonl.zst"
SCHEMA = REPO / "schemas" / "manifest.schema.json"
PREP_BIN = Path(os.environ.get("PREP_BIN", REPO / os.environ.get("CARGO_TARGET_DIR", "target") / "debug" / "prep"))

EOS = {"gpt2": "<|endoftext|>", "minilm-wordpiece": "[SEP]"}
SHARD_SIZE = "1MiB"

IDX_MAGIC = b"PREPIDX\0"
IDX_HEADER = struct.Struct("<8sIB3sQQ")  # magic, version, token size, reserved, records, tokens
TOKEN_DTYPES = {2: ("uint16", np.dtype("<u2")), 4: ("uint32", np.dtype("<u4"))}


def zst_bytes(path: Path) -> bytes:
    with path.open("rb") as f:
        return zstandard.ZstdDecompressor().stream_reader(f).read()


def corpus_texts() -> list[str]:
    # Split on "\n" only: str.splitlines() would also split on U+2028 and
    # friends, which JSON allows unescaped inside strings.
    lines = zst_bytes(CORPUS).split(b"\n")
    return [json.loads(line)["text"] for line in lines if line.strip()]


def reference_tokenizer(name: str) -> Tokenizer:
    path = FIXTURES / "tokenizers" / f"{name}.tokenizer.json.zst"
    tok = Tokenizer.from_str(zst_bytes(path).decode("utf-8"))
    # minilm-wordpiece's file enables truncation and padding; datasets get neither.
    tok.no_truncation()
    tok.no_padding()
    return tok


class Shard:
    """One shard, checked against FORMAT.md and mapped with numpy."""

    def __init__(self, root: Path, entry: dict, dtype: str):
        idx_path = root / entry["idx"]
        bin_path = root / entry["bin"]
        raw = idx_path.read_bytes()
        assert len(raw) >= IDX_HEADER.size, f"{idx_path}: shorter than its header"
        magic, version, token_size, reserved, n_records, n_tokens = IDX_HEADER.unpack_from(raw)
        assert magic == IDX_MAGIC, f"{idx_path}: magic {magic!r}"
        assert version == 1, f"{idx_path}: version {version}"
        assert token_size in TOKEN_DTYPES, f"{idx_path}: token size {token_size}"
        assert TOKEN_DTYPES[token_size][0] == dtype, f"{idx_path}: token size vs manifest dtype"
        assert reserved == b"\0\0\0", f"{idx_path}: reserved bytes {reserved!r}"
        assert len(raw) == IDX_HEADER.size + 8 * (n_records + 1), f"{idx_path}: size"
        assert (n_records, n_tokens) == (entry["n_records"], entry["n_tokens"]), idx_path
        assert len(raw) == entry["idx_bytes"], f"{idx_path}: idx_bytes"

        self.offsets = np.frombuffer(raw, dtype="<u8", offset=IDX_HEADER.size)
        assert self.offsets[0] == 0, f"{idx_path}: first offset"
        assert self.offsets[-1] == n_tokens, f"{idx_path}: last offset"
        assert np.all(np.diff(self.offsets.astype(np.int64)) >= 0), f"{idx_path}: offsets decrease"

        np_dtype = TOKEN_DTYPES[token_size][1]
        bin_size = bin_path.stat().st_size
        assert bin_size == n_tokens * token_size, f"{bin_path}: size"
        assert bin_size == entry["bin_bytes"], f"{bin_path}: bin_bytes"
        # numpy cannot map an empty file; an empty shard has no tokens to read.
        self.tokens = (np.memmap(bin_path, dtype=np_dtype, mode="r") if n_tokens
                       else np.zeros(0, dtype=np_dtype))
        self.n_records = n_records

    def record(self, i: int) -> np.ndarray:
        return self.tokens[self.offsets[i]:self.offsets[i + 1]]


class NumpyDataset:
    def __init__(self, root: Path):
        self.manifest = json.loads((root / "manifest.json").read_text(encoding="utf-8"))
        m = self.manifest
        assert m["format"] == "prep" and m["version"] == 1 and m["kind"] == "documents"
        self.shards = [Shard(root, entry, m["dtype"]) for entry in m["shards"]]
        assert sum(s.n_records for s in self.shards) == m["n_records"]
        assert sum(e["n_tokens"] for e in m["shards"]) == m["n_tokens"]

    def records(self):
        for shard in self.shards:
            for i in range(shard.n_records):
                yield shard.record(i)


@pytest.fixture(scope="module", params=sorted(EOS))
def tokenized(request, tmp_path_factory):
    """(tokenizer name, dataset directory) after one `prep tokenize` run."""
    if not PREP_BIN.is_file():
        pytest.fail(f"no prep binary at {PREP_BIN}: build it (cargo build) or set PREP_BIN")
    name = request.param
    out = tmp_path_factory.mktemp(name) / "ds"
    cmd = [str(PREP_BIN), "tokenize",
           "--tokenizer", str(FIXTURES / "tokenizers" / f"{name}.tokenizer.json.zst"),
           "--input", str(CORPUS), "--output", str(out),
           "--eos", EOS[name], "--threads", "2", "--shard-size", SHARD_SIZE, "--quiet"]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    assert proc.returncode == 0, (f"{' '.join(cmd)} exited {proc.returncode}\n"
                                  f"stdout:\n{proc.stdout}\nstderr:\n{proc.stderr}")
    return name, out


def test_every_document_matches_the_reference(tokenized):
    name, out = tokenized
    ds = NumpyDataset(out)
    tok = reference_tokenizer(name)
    eos = tok.token_to_id(EOS[name])
    assert ds.manifest["special_tokens"]["eos"] == eos
    assert ds.manifest["special_tokens"]["bos"] is None
    assert ds.manifest["dtype"] == "uint16"
    assert ds.manifest["vocab_size"] == tok.get_vocab_size(with_added_tokens=True)

    texts = corpus_texts()
    assert ds.manifest["n_records"] == len(texts)
    expected = [e.ids for e in tok.encode_batch(texts, add_special_tokens=False)]
    bad = []
    for i, (want, got) in enumerate(zip(expected, ds.records())):
        want = np.asarray(want + [eos], dtype=np.int64)
        got = np.asarray(got, dtype=np.int64)
        if not np.array_equal(want, got):
            n = min(len(want), len(got))
            at = int(np.argmax(want[:n] != got[:n])) if np.any(want[:n] != got[:n]) else n
            lo = max(at - 8, 0)
            bad.append(f"document {i}: {len(want)} ids expected, {len(got)} found, first "
                       f"difference at {at}: expected {want[lo:at + 8].tolist()}, "
                       f"found {got[lo:at + 8].tolist()}")
    assert not bad, f"{name}: {len(bad)} documents differ:\n" + "\n".join(bad[:5])
    assert ds.manifest["n_tokens"] == sum(len(ids) + 1 for ids in expected)


def test_shard_size_gives_several_shards(tokenized):
    name, out = tokenized
    ds = NumpyDataset(out)
    assert len(ds.shards) > 1, f"{name}: --shard-size {SHARD_SIZE} wrote one shard"
    for entry in ds.manifest["shards"]:
        for key in ("bin", "idx"):
            rel = Path(entry[key])
            assert not rel.is_absolute() and ".." not in rel.parts, entry[key]
        for key in ("bin", "idx"):
            # The manifest's checksum is the XXH3-64 of the file, 16 lowercase hex digits.
            data = (out / entry[key]).read_bytes()
            assert entry[f"{key}_xxh3"] == f"{xxhash.xxh3_64_intdigest(data):016x}", entry[key]


def test_manifest_matches_schema(tokenized):
    if not SCHEMA.is_file():
        pytest.skip(f"{SCHEMA.relative_to(REPO)} does not exist yet")
    import jsonschema

    _, out = tokenized
    schema = json.loads(SCHEMA.read_text(encoding="utf-8"))
    validator_cls = jsonschema.validators.validator_for(schema)
    validator_cls.check_schema(schema)
    manifest = json.loads((out / "manifest.json").read_text(encoding="utf-8"))
    validator_cls(schema, format_checker=validator_cls.FORMAT_CHECKER).validate(manifest)
