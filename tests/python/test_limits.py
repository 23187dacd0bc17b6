"""The format's limits (crates/reader/src/format/FORMAT.md, "Limits") are the same in both
readers: a manifest at the cap is read by the Python reader and by prep; one
byte over it is refused by both, each naming the file.

The constants themselves are compared with FORMAT.md and the Rust code by
the Rust test `format::limits`; this file checks the behaviour.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from test_reference import FIXTURES, PREP_BIN

import prep
from prep import Dataset, FormatError

GPT2 = FIXTURES / "tokenizers" / "gpt2.tokenizer.json.zst"


@pytest.fixture(scope="module")
def small_dataset(tmp_path_factory) -> Path:
    if not PREP_BIN.is_file():
        pytest.fail(f"no prep binary at {PREP_BIN}: build it (cargo build) or set PREP_BIN")
    root = tmp_path_factory.mktemp("limits")
    text = root / "docs.jsonl"
    text.write_text('{"text": "one"}\n{"text": "two words"}\n')
    out = root / "ds"
    subprocess.run([str(PREP_BIN), "tokenize", "--tokenizer", str(GPT2), "--input", str(text),
                    "--output", str(out), "--quiet"], check=True)
    return out


def padded_copy(src: Path, dst: Path, size: int) -> Path:
    """A copy of the dataset whose manifest.json is `size` bytes: the same
    JSON followed by spaces, which every JSON parser skips."""
    shutil.copytree(src, dst)
    manifest = dst / "manifest.json"
    body = manifest.read_bytes()
    assert len(body) < size
    with manifest.open("ab") as f:
        remaining = size - len(body)
        chunk = b" " * (1 << 20)
        while remaining:
            n = min(remaining, len(chunk))
            f.write(chunk[:n])
            remaining -= n
    assert manifest.stat().st_size == size
    return dst


def prep_reads(dataset: Path) -> subprocess.CompletedProcess:
    return subprocess.run([str(PREP_BIN), "inspect", str(dataset), "--json"],
                          capture_output=True, text=True, check=False)


def test_the_manifest_cap_is_one_number():
    assert prep.MAX_MANIFEST_BYTES == 256 << 20


def test_a_manifest_at_the_cap_is_read_by_both(small_dataset, tmp_path):
    ds = padded_copy(small_dataset, tmp_path / "at", prep.MAX_MANIFEST_BYTES)
    assert len(Dataset(ds)) == 2
    proc = prep_reads(ds)
    assert proc.returncode == 0, proc.stderr


def test_a_manifest_one_byte_over_the_cap_is_refused_by_both(small_dataset, tmp_path):
    ds = padded_copy(small_dataset, tmp_path / "over", prep.MAX_MANIFEST_BYTES + 1)
    manifest = ds / "manifest.json"
    with pytest.raises(FormatError) as python_error:
        Dataset(ds)
    assert python_error.value.path == manifest
    assert str(prep.MAX_MANIFEST_BYTES + 1) in str(python_error.value)
    proc = prep_reads(ds)
    assert proc.returncode == 2, proc.stderr
    assert str(manifest) in proc.stderr and str(prep.MAX_MANIFEST_BYTES + 1) in proc.stderr, proc.stderr
    validate = subprocess.run([str(PREP_BIN), "validate", str(ds)], capture_output=True, text=True,
                              check=False)
    assert validate.returncode != 0
    assert "manifest.json" in validate.stdout + validate.stderr
