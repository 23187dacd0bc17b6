"""prep's exports read by the trainers' own reader logic.

Where a trainer's reader is small enough, its logic lives next to this file
(each file names its source, commit and licence) and reads what `prep
export` writes, beside the readers written from the formats' facts in
tests/python/test_interop.py:

- llm.c: the C DataLoader of llmc/dataloader.h (llmc_loader.c), compiled
  with the system C compiler `cc`, on `--to llmc` shards: every batch of
  every shard, for one and two processes, with --eot-first, a short last
  shard with and without --batch-tokens, and uint32 shards (which it
  refuses: only llm.c's Python loaders read them).
- nanoGPT: train.py's `get_batch` (nanogpt_get_batch.py) on `--to nanogpt`.
- datatrove: `DatatroveFileDataset` / `DatatroveFolderDataset` index
  arithmetic (datatrove_dataset.py) on `--to datatrove`, uint16 and uint32.

Run with `make test-compat` (part of `make test`), or
    PREP_BIN=target/debug/prep target/venv/bin/python -m pytest -q tests/compat
"""

from __future__ import annotations

import json
import importlib.util
import os
import shutil
import struct
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from datatrove_dataset import FileDataset, FolderDataset
from nanogpt_get_batch import get_batch

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
sys.path.insert(0, str(REPO / "tools"))
# The reader as users who copy one file take it: python/prep/reader.py,
# loaded as prep_reader (not the installed package).
_spec = importlib.util.spec_from_file_location("prep_reader", REPO / "python" / "prep" / "reader.py")
prep_reader = importlib.util.module_from_spec(_spec)
sys.modules["prep_reader"] = prep_reader
_spec.loader.exec_module(prep_reader)
Dataset = prep_reader.Dataset

PREP_BIN = Path(os.environ.get("PREP_BIN", REPO / os.environ.get("CARGO_TARGET_DIR", "target") / "debug" / "prep"))
GPT2 = REPO / "fixtures" / "tokenizers" / "gpt2.tokenizer.json.zst"
CORPUS = REPO / "fixtures" / "corpus" / "debian-sample.jsonl.zst"
EOS = 50256


def prep(*args: object) -> subprocess.CompletedProcess:
    if not PREP_BIN.is_file():
        pytest.fail(f"no prep binary at {PREP_BIN}: build it (cargo build) or set PREP_BIN")
    proc = subprocess.run([str(PREP_BIN), *map(str, args)], capture_output=True, text=True)
    assert proc.returncode == 0, f"prep {' '.join(map(str, args))}: {proc.stderr}"
    return proc


def stream(root: Path) -> np.ndarray:
    ds = Dataset(root)
    return np.concatenate([np.asarray(ds[i], dtype=np.int64) for i in range(len(ds))])


@pytest.fixture(scope="module")
def documents(tmp_path_factory) -> Path:
    """The demo corpus tokenized with GPT-2, in several shards, records ending with eos."""
    out = tmp_path_factory.mktemp("compat") / "docs"
    prep("tokenize", "--tokenizer", GPT2, "--input", CORPUS, "--output", out,
         "--shard-size", "256KiB", "--quiet")
    return out


@pytest.fixture(scope="module")
def wide(tmp_path_factory) -> Path:
    """A uint32 dataset (ids past 65,535), made by importing a datatrove file."""
    d = tmp_path_factory.mktemp("wide")
    rng = np.random.default_rng(3)
    ids = rng.integers(0, 200_000, size=5000, dtype=np.uint32)
    ends = np.array([1000, 2500, 5000], dtype=np.uint64)
    (d / "w.ds").write_bytes(ids.tobytes())
    (d / "w.ds.index").write_bytes(ends.tobytes())
    (d / "w.ds.metadata").write_bytes(b"t|4\n5000\n5.00K")
    prep("import", "datatrove", d / "w", d / "ds", "-q")
    assert json.loads((d / "ds" / "manifest.json").read_text())["dtype"] == "uint32"
    return d / "ds"


@pytest.fixture(scope="module")
def loader(tmp_path_factory) -> Path:
    """llmc_loader.c, built with the system C compiler."""
    cc = shutil.which("cc")
    if cc is None:
        pytest.fail("no C compiler `cc` on PATH: the llm.c loader cannot be built")
    exe = tmp_path_factory.mktemp("cc") / "llmc_loader"
    subprocess.run([cc, "-O1", "-Wall", "-Werror", "-o", str(exe), str(HERE / "llmc_loader.c")],
                   check=True)
    return exe


def run_loader(exe: Path, pattern: Path, B: int, T: int, batches: int, processes: int = 1,
               rank: int = 0) -> subprocess.CompletedProcess:
    args = [str(exe), str(pattern), str(B), str(T), str(batches)]
    if processes > 1:
        args += [str(processes), str(rank)]
    return subprocess.run(args, capture_output=True, text=True)


def loader_batches(exe: Path, pattern: Path, B: int, T: int, batches: int, processes: int = 1,
                   rank: int = 0) -> list[tuple[np.ndarray, np.ndarray]]:
    proc = run_loader(exe, pattern, B, T, batches, processes, rank)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert len(lines) == 2 * batches
    return [(np.array(lines[2 * b].split(), dtype=np.int64),
             np.array(lines[2 * b + 1].split(), dtype=np.int64)) for b in range(batches)]


def shard_counts(directory: Path, pattern: str) -> list[int]:
    counts = []
    for path in sorted(directory.glob(pattern)):
        magic, version, count = struct.unpack("<3i", path.read_bytes()[:12])
        counts.append(count)
    return counts


def expected_batches(tokens: np.ndarray, counts: list[int], B: int, T: int, processes: int,
                     rank: int) -> list[tuple[np.ndarray, np.ndarray]]:
    """What llm.c's loader serves, from the token stream the shards were cut from."""
    out, start = [], 0
    step = B * T * processes
    for n in counts:
        for s in range((n - 1) // step):
            at = start + s * step + rank * B * T
            out.append((tokens[at:at + B * T], tokens[at + 1:at + 1 + B * T]))
        start += n
    return out


# --- llm.c ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("B,T,processes", [(2, 64, 1), (4, 32, 2)])
def test_llmc_c_loader_reads_every_batch(documents, loader, tmp_path, B, T, processes):
    out = tmp_path / "llmc"
    prep("export", documents, "--to", "llmc", out, "--shard-tokens", "20000",
         "--val-tokens", "3000", "--batch-tokens", B * T * processes, "-q")
    tokens = stream(documents)
    counts = shard_counts(out, "prep_train_*.bin")
    assert len(counts) > 2
    for rank in range(processes):
        want = expected_batches(tokens[3000:], counts, B, T, processes, rank)
        # One batch more than there are: llm.c starts the next epoch.
        got = loader_batches(loader, out / "prep_train_*.bin", B, T, len(want) + 1, processes, rank)
        for i, ((gx, gy), (wx, wy)) in enumerate(zip(got, want + want[:1])):
            assert np.array_equal(gx, wx) and np.array_equal(gy, wy), f"rank {rank} batch {i}"
    val = loader_batches(loader, out / "prep_val_*.bin", B, T, 1, processes)
    assert np.array_equal(val[0][0], tokens[:B * T])


def test_llmc_c_loader_reads_eot_first_documents(documents, loader, tmp_path):
    out = tmp_path / "llmc"
    prep("export", documents, "--to", "llmc", out, "--eot-first", "--shard-tokens", "50000", "-q")
    ds = Dataset(documents)
    moved = np.concatenate([np.concatenate([[EOS], np.asarray(ds[i][:-1], dtype=np.int64)])
                            for i in range(len(ds))])
    counts = shard_counts(out, "prep_train_*.bin")
    want = expected_batches(moved, counts, 4, 256, 1, 0)
    got = loader_batches(loader, out / "prep_train_*.bin", 4, 256, len(want))
    assert got[0][0][0] == EOS, "each document starts with the end-of-text token, as llm.c's"
    for i, ((gx, gy), (wx, wy)) in enumerate(zip(got, want)):
        assert np.array_equal(gx, wx) and np.array_equal(gy, wy), f"batch {i}"


def test_llmc_c_loader_aborts_on_a_short_last_shard_unless_batch_tokens(documents, loader,
                                                                         tmp_path):
    total = len(stream(documents))
    # 2,100 train tokens in shards of 1,000: 1,000, 1,000, 100.
    common = ["--to", "llmc", "--shard-tokens", "1000", "--val-tokens", total - 2100, "-q"]
    short = tmp_path / "short"
    prep("export", documents, short, *common)
    assert shard_counts(short, "prep_train_*.bin") == [1000, 1000, 100]
    proc = run_loader(loader, short / "prep_train_*.bin", 2, 256, 1)
    assert proc.returncode != 0 and "fewer tokens than one batch" in proc.stderr
    fixed = tmp_path / "fixed"
    prep("export", documents, fixed, *common, "--batch-tokens", 512)
    assert shard_counts(fixed, "prep_train_*.bin") == [1000, 587, 513]
    loader_batches(loader, fixed / "prep_train_*.bin", 2, 256, 4)


def test_llmc_c_loader_refuses_uint32_shards(wide, loader, tmp_path):
    out = tmp_path / "llmc"
    prep("export", wide, "--to", "llmc", out, "-q")
    proc = run_loader(loader, out / "prep_train_*.bin", 1, 64, 1)
    assert proc.returncode != 0 and "Bad magic" in proc.stderr


# --- nanoGPT -------------------------------------------------------------------------------------

def test_nanogpt_get_batch_reads_the_export(documents, tmp_path):
    data_dir = tmp_path / "nanogpt"
    prep("export", documents, "--to", "nanogpt", data_dir / "train.bin", "-q")
    tokens = stream(documents)
    block = 256
    rng = np.random.default_rng(7)
    drawn = []

    def randint(high, size):
        drawn.append(rng.integers(0, high, size=size))
        return drawn[-1]

    def fixed(high, size):
        # The first and the last start position get_batch can draw.
        drawn.append(np.array([0, high - 1]))
        return drawn[-1]

    for pick in (randint, randint, fixed):
        x, y = get_batch(str(data_dir), "train", block, 32, pick)
        for row, i in enumerate(drawn[-1]):
            assert np.array_equal(x[row], tokens[i:i + block])
            assert np.array_equal(y[row], tokens[i + 1:i + 1 + block])
    assert drawn[-1][1] + block + 1 == len(tokens), "the last window ends at the last token"


# --- datatrove -----------------------------------------------------------------------------------

def test_datatrove_folder_dataset_reads_the_exports(documents, wide, tmp_path):
    folder = tmp_path / "dt"
    tokens = stream(documents)
    for name in ("a", "b"):
        prep("export", documents, "--to", "datatrove", folder / name, "-q")
    seq = 512
    per_file = len(tokens) // (seq + 1)
    ds = FolderDataset(str(folder / "*.ds"), seq)
    assert len(ds) == 2 * per_file
    for item in [0, 1, per_file - 1, per_file, per_file + 3, 2 * per_file - 1]:
        i = item % per_file
        assert np.array_equal(ds[item], tokens[i * (seq + 1):(i + 1) * (seq + 1)]), item
    capped = FolderDataset(str(folder / "*.ds"), seq, max_tokens=(per_file + 2) * (seq + 1))
    assert len(capped) == per_file + 2

    # uint32: the metadata says token size 4, and datatrove reads uint32.
    prep("export", wide, "--to", "datatrove", tmp_path / "w" / "x", "-q")
    meta = (tmp_path / "w" / "x.ds.metadata").read_text().splitlines()[0]
    assert meta.endswith("|4")
    wide_tokens = stream(wide)
    f = FileDataset(str(tmp_path / "w" / "x.ds"), 99, token_size=4)
    assert len(f) == len(wide_tokens) // 100
    for item in (0, len(f) - 1):
        assert np.array_equal(f[item], wide_tokens[item * 100:(item + 1) * 100])
