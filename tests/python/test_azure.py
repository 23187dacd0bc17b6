"""Object storage on Azure Blob: Azurite (Microsoft's emulator, from npm) on 127.0.0.1.

The same code serves every cloud (Apache object_store), but each has its own
requests, listings and conditional writes: this runs the pipeline tokenize ->
shuffle -> pack from and to az:// and compares it with the run on disk byte
for byte, checks the lease lock on Azure's conditional writes, validates and
fetches in place, and a missing container is exit 2 naming it.

    make target/azurite/.installed     # npm install azurite into target/azurite
    PREP_BIN=target/debug/prep target/venv/bin/python -m pytest tests/python/test_azure.py

Skipped, saying why, when Azurite (PREP_AZURITE, else target/azurite) or
azure-storage-blob (tools/requirements.txt) is not installed.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

blob = pytest.importorskip("azure.storage.blob", reason="azure-storage-blob not installed: pip install -r tools/requirements.txt")

from test_s3 import GPT2, REPO, free_port, ok, prep, stop, write_inputs  # noqa: E402
from test_s3_write import shard_names  # noqa: E402

AZURITE = Path(os.environ.get("PREP_AZURITE", REPO / os.environ.get("CARGO_TARGET_DIR", "target") / "azurite" / "node_modules" / ".bin" / "azurite-blob"))
ACCOUNT = "devstoreaccount1"
# Azurite's well-known development key (public, in Microsoft's documentation).
KEY = "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw=="


class Azurite:
    """Azurite's blob service on a free loopback port, its data in `root`."""

    def __init__(self, root: Path) -> None:
        if not AZURITE.is_file():
            pytest.skip(f"Azurite not installed at {AZURITE}: make target/azurite/.installed")
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc = subprocess.Popen(
            [str(AZURITE), "--blobHost", "127.0.0.1", "--blobPort", str(self.port), "--location", str(root),
             "--silent", "--skipApiVersionCheck"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )
        import socket

        for _ in range(300):
            if self.proc.poll() is not None:
                raise RuntimeError(f"azurite exited with {self.proc.returncode}")
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=0.5).close()
                break
            except OSError:
                time.sleep(0.1)
        else:
            self.stop()
            raise RuntimeError("azurite did not start listening within 30 s")
        self.service = blob.BlobServiceClient.from_connection_string(
            f"DefaultEndpointsProtocol=http;AccountName={ACCOUNT};AccountKey={KEY};"
            f"BlobEndpoint={self.url}/{ACCOUNT};"
        )

    def env(self, staging: Path) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "GOOGLE_", "AZURE_", "AZURITE_"))}
        env.update(
            AZURE_STORAGE_USE_EMULATOR="true",
            AZURITE_BLOB_STORAGE_URL=self.url,
            AZURE_ALLOW_HTTP="true",
            PREP_STAGING_DIR=str(staging),
        )
        return env

    def names(self, container: str, prefix: str) -> dict[str, int]:
        client = self.service.get_container_client(container)
        return {b.name[len(prefix) + 1:]: b.size for b in client.list_blobs(name_starts_with=prefix + "/")}

    def get(self, container: str, name: str) -> bytes:
        return self.service.get_blob_client(container, name).download_blob().readall()

    def stop(self) -> None:
        stop(self.proc)


@pytest.fixture(scope="module")
def azure(tmp_path_factory):
    server = Azurite(tmp_path_factory.mktemp("azurite"))
    server.service.create_container("data")
    local = tmp_path_factory.mktemp("inputs") / "in"
    write_inputs(local)
    container = server.service.get_container_client("data")
    for path in sorted(local.iterdir()):
        container.upload_blob(f"in/{path.name}", path.read_bytes())
    yield server, local
    server.stop()


def assert_same(server: Azurite, prefix: str, local: Path) -> None:
    names = server.names("data", prefix)
    assert shard_names(names) and shard_names(names) == shard_names(p.name for p in local.iterdir())
    for name in shard_names(names):
        assert server.get("data", f"{prefix}/{name}") == (local / name).read_bytes(), name
    assert "manifest.json" in names
    assert not [n for n in names if n.startswith(".prep") or n.endswith(".tmp")], names


def test_pipeline_from_and_to_azure_equals_the_run_on_disk(azure, tmp_path):
    server, inputs = azure
    env = server.env(tmp_path / "staging")
    local = tmp_path / "local"
    common = ["--tokenizer", GPT2, "--shard-size", "256KiB", "--threads", 2]
    ok(prep("tokenize", *common, "--input", inputs, "--output", local / "ds"))
    ok(prep("shuffle", local / "ds", local / "sh", "--seed", 1))
    ok(prep("pack", local / "sh", local / "pk", "--seq-len", 2049))

    ok(prep("tokenize", *common, "--input", "az://data/in/*.jsonl*", "--output", "az://data/pipe/ds", env=env))
    ok(prep("shuffle", "az://data/pipe/ds", "az://data/pipe/sh", "--seed", 1, env=env))
    ok(prep("pack", "az://data/pipe/sh", "az://data/pipe/pk", "--seq-len", 2049, env=env))
    for stage in ("ds", "sh", "pk"):
        assert_same(server, f"pipe/{stage}", local / stage)
    proc = ok(prep("validate", "az://data/pipe/pk", env=env))
    assert "valid" in proc.stdout + proc.stderr
    ok(prep("fetch", "az://data/pipe/pk", tmp_path / "fetched", env=env))
    for name in os.listdir(local / "pk"):
        if name.startswith("shard-"):
            assert (tmp_path / "fetched" / name).read_bytes() == (local / "pk" / name).read_bytes()


def test_the_lease_lock_on_azure_refuses_a_second_run_and_a_held_one(azure, tmp_path):
    server, inputs = azure
    env = server.env(tmp_path / "staging")
    container = server.service.get_container_client("data")
    holder = b"pid 4242 on elsewhere, lease 60 s"
    container.upload_blob("held/ds/.prep-lock", holder)
    args = ["tokenize", "--tokenizer", GPT2, "--input", inputs / "a.jsonl", "--output", "az://data/held/ds"]
    proc = prep(*args, env=env)
    assert proc.returncode == 2, proc.stderr
    assert "az://data/held/ds" in proc.stderr and "pid 4242 on elsewhere" in proc.stderr, proc.stderr
    assert server.names("data", "held/ds") == {".prep-lock": len(holder)}

    container.upload_blob("held/ds/.prep-lock", b"pid 4242 on elsewhere, lease 1 s", overwrite=True)
    time.sleep(2.5)
    ok(prep(*args, env=env))
    names = server.names("data", "held/ds")
    assert "manifest.json" in names and ".prep-lock" not in names, names


def test_a_missing_container_is_exit_2_naming_it(azure, tmp_path):
    server, inputs = azure
    proc = prep("tokenize", "--tokenizer", GPT2, "--input", inputs / "a.jsonl", "--output", "az://nocontainer/ds",
                env=server.env(tmp_path / "staging"))
    assert proc.returncode == 2, proc.stderr
    assert "az://nocontainer/ds" in proc.stderr, proc.stderr


STREAM_SCRIPT = r"""
import sys, prep
url, cache, local = sys.argv[1:4]
d = prep.StreamingDataset(url, cache_dir=cache, cache_limit=1 << 30, seed=5, block_bytes=65536, indices=True)
ds = prep.Dataset(local)
n = 0
for i, row in d:
    assert row.tobytes() == ds[int(i)].tobytes(), i
    n += 1
assert n == len(ds), (n, len(ds))
print(n)
"""


def test_a_packed_dataset_streams_from_azure(azure, tmp_path):
    """prep.StreamingDataset over az://: every row once, each the dataset's own bytes."""
    pytest.importorskip("prep._native", reason="prep's extension module is not built (make package)")
    server, inputs = azure
    local = tmp_path / "local"
    ok(prep("tokenize", "--tokenizer", GPT2, "--input", inputs, "--output", local / "ds", "--shard-size", "256KiB"))
    ok(prep("pack", local / "ds", local / "pk", "--seq-len", 512, "--shard-size", "256KiB"))
    container = server.service.get_container_client("data")
    for path in sorted((local / "pk").iterdir()):
        container.upload_blob(f"stream/pk/{path.name}", path.read_bytes())
    script = tmp_path / "stream.py"
    script.write_text(STREAM_SCRIPT)
    proc = subprocess.run([sys.executable, str(script), "az://data/stream/pk", str(tmp_path / "cache"),
                           str(local / "pk")],
                          capture_output=True, text=True, env=server.env(tmp_path / "staging"), timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert int(proc.stdout) > 100
