"""Hugging Face `datasets` folders as users have them, written by `datasets`
itself, read by `prep tokenize`:

- a DatasetDict folder (`save_to_disk` of train and test) is refused, exit 2,
  naming its splits and the folder to name instead; naming a split reads
  that split alone;
- a `save_to_disk` folder of several shards gives exactly the files its
  state.json lists, in order: the output is byte for byte that of the same
  rows as JSONL, also with a stray `.arrow` file beside them;
- a cache folder holding several versions (`json-train.arrow`,
  `json-test.arrow`, the `cache-*.arrow` a `.map` wrote) is refused, naming
  each; naming one file reads it alone.

Each case runs twice: the folder on disk, and the same folder uploaded to
object storage (a moto S3 server on 127.0.0.1; skipped when moto is not
installed), where the same rules apply to the listing.

    PREP_BIN=target/debug/prep target/venv/bin/python -m pytest tests/python/test_hf_datasets.py
"""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

from test_reference import FIXTURES, PREP_BIN

datasets = pytest.importorskip("datasets", reason="datasets is not installed: pip install -r tools/requirements.txt")

GPT2 = FIXTURES / "tokenizers" / "gpt2.tokenizer.json.zst"
ROWS = [{"text": f"Row {i}: " + "a few words of text " * (1 + i % 7), "id": i} for i in range(600)]


class Where:
    """Where a test's folders are read from: `at(path)` is the input that
    names the local `path` there (itself on disk; in the bucket, the URL it
    was uploaded to, once `put(root)` uploaded a folder holding it)."""

    def __init__(self, server=None, prefix: str = "") -> None:
        self.server, self.prefix, self.roots = server, prefix, []

    def put(self, root: Path) -> None:
        if self.server is None:
            return
        from test_s3 import upload_dir
        upload_dir(self.server.client(), "hfdata", root, f"{self.prefix}/{root.name}")
        self.roots.append(root)

    def at(self, path: Path) -> str:
        if self.server is None:
            return str(path)
        root = next(r for r in self.roots if path == r or r in path.parents)
        return f"s3://hfdata/{self.prefix}/{root.name}/{path.relative_to(root).as_posix()}".rstrip("/.")

    def env(self) -> dict[str, str] | None:
        if self.server is None:
            return None
        from test_s3 import store_env
        return store_env(self.server.url)


@pytest.fixture(scope="module")
def store():
    pytest.importorskip("moto.server", reason="moto[server] not installed: pip install -r tools/requirements.txt")
    from test_s3 import Server
    server = Server()
    server.client().create_bucket(Bucket="hfdata")
    yield server
    server.stop()


@pytest.fixture(params=["disk", "s3"])
def where(request, tmp_path) -> Where:
    if request.param == "disk":
        return Where()
    return Where(request.getfixturevalue("store"), tmp_path.name)


def tokenize(inputs: list[Path | str], out: Path, where: Where | None = None) -> subprocess.CompletedProcess:
    args = [str(PREP_BIN), "tokenize", "--tokenizer", str(GPT2), "--output", str(out), "--quiet"]
    for i in inputs:
        args += ["--input", str(i)]
    return subprocess.run(args, capture_output=True, text=True, env=where.env() if where else None)


def data_bytes(out: Path) -> bytes:
    """The token bytes of a dataset, shard after shard."""
    manifest = json.loads((out / "manifest.json").read_text())
    return b"".join((out / s["bin"]).read_bytes() for s in manifest["shards"])


def jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


@pytest.fixture(autouse=True)
def offline(monkeypatch):
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")


def test_a_dataset_dict_folder_is_refused_and_a_split_reads_alone(tmp_path, where):
    ds = datasets.Dataset.from_list(ROWS)
    datasets.DatasetDict({"train": ds.select(range(400)), "test": ds.select(range(400, 600))}).save_to_disk(
        str(tmp_path / "dict"))
    where.put(tmp_path / "dict")
    proc = tokenize([where.at(tmp_path / "dict")], tmp_path / "out", where)
    assert proc.returncode == 2, proc.stderr
    assert "splits train, test" in proc.stderr and where.at(tmp_path / "dict" / "train") in proc.stderr, proc.stderr
    assert not (tmp_path / "out" / "manifest.json").exists()

    assert tokenize([where.at(tmp_path / "dict" / "train")], tmp_path / "train", where).returncode == 0
    assert tokenize([jsonl(tmp_path / "train.jsonl", ROWS[:400])], tmp_path / "want").returncode == 0
    assert data_bytes(tmp_path / "train") == data_bytes(tmp_path / "want")


def test_a_save_to_disk_folder_gives_exactly_its_listed_files_in_order(tmp_path, where):
    datasets.Dataset.from_list(ROWS).save_to_disk(str(tmp_path / "saved"), num_shards=3)
    listed = [f["filename"] for f in json.loads((tmp_path / "saved" / "state.json").read_text())["_data_files"]]
    assert len(listed) == 3
    # A stray version beside them (a file of another dataset): not listed, not read.
    datasets.Dataset.from_list(ROWS[:50]).save_to_disk(str(tmp_path / "other"))
    shutil.copy(tmp_path / "other" / "data-00000-of-00001.arrow", tmp_path / "saved" / "cache-0123456789abcdef.arrow")

    where.put(tmp_path / "saved")
    proc = tokenize([where.at(tmp_path / "saved")], tmp_path / "out", where)
    assert proc.returncode == 0, proc.stderr
    assert tokenize([jsonl(tmp_path / "all.jsonl", ROWS)], tmp_path / "want").returncode == 0
    assert data_bytes(tmp_path / "out") == data_bytes(tmp_path / "want")


def test_a_cache_folder_of_several_versions_is_refused_naming_them(tmp_path, where):
    source = jsonl(tmp_path / "docs.jsonl", ROWS)
    loaded = datasets.load_dataset("json", data_files={"train": str(source), "test": str(source)},
                                   cache_dir=str(tmp_path / "cache"))
    loaded["train"].map(lambda r: {"text": r["text"].upper()})
    [folder] = {p.parent for p in (tmp_path / "cache").rglob("json-train.arrow")}
    names = sorted(p.name for p in folder.glob("*.arrow"))
    assert "json-test.arrow" in names and any(n.startswith("cache-") for n in names), names

    where.put(tmp_path / "cache")
    proc = tokenize([where.at(tmp_path / "cache")], tmp_path / "out", where)
    assert proc.returncode == 2, proc.stderr
    assert f"{where.at(folder)}: the .arrow files here are {len(names)} versions or splits" in proc.stderr, proc.stderr
    for name in names:
        assert name in proc.stderr, (name, proc.stderr)
    assert not (tmp_path / "out" / "manifest.json").exists()

    proc = tokenize([where.at(folder / "json-train.arrow")], tmp_path / "train", where)
    assert proc.returncode == 0, proc.stderr
    assert tokenize([source], tmp_path / "want").returncode == 0
    assert data_bytes(tmp_path / "train") == data_bytes(tmp_path / "want")
