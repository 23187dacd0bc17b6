"""A store that does not honour conditional writes: s3rver (npm), an S3
server that accepts `PUT If-None-Match: *` on an object that exists and
replaces it. prep's lock rests on that condition, so:

- `prep tokenize --output s3://...` is refused, exit 2, with a message that
  names the store, what it lacks, and the way out; the store is left as it
  was (no lock, no shard);
- with `--single-writer` or PREP_STORE_SINGLE_WRITER=1 (the user guarantees
  one writer) the run writes, `prep validate` of the result passes, and the
  manifest records it (`provenance.single_writer`).
moto, which honours the condition, is tested by test_s3.py as before.

    make target/s3rver/.installed
    PREP_BIN=target/debug/prep target/venv/bin/python -m pytest tests/python/test_s3rver.py
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import time
from pathlib import Path

import pytest

from test_s3 import CORPUS, GPT2, free_port, prep, stop

REPO = Path(__file__).resolve().parents[2]
S3RVER = Path(os.environ.get("PREP_S3RVER", REPO / os.environ.get("CARGO_TARGET_DIR", "target") / "s3rver" / "node_modules" / ".bin" / "s3rver"))


@pytest.fixture(scope="module")
def s3rver(tmp_path_factory):
    if not S3RVER.is_file():
        pytest.skip(f"s3rver not installed at {S3RVER}: make target/s3rver/.installed")
    root, port = tmp_path_factory.mktemp("s3rver"), free_port()
    proc = subprocess.Popen([str(S3RVER), "--directory", str(root), "--address", "127.0.0.1", "--port", str(port),
                             "--silent", "--configure-bucket", "bucket"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    for _ in range(300):
        if proc.poll() is not None:
            raise RuntimeError(f"s3rver exited with {proc.returncode}")
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
            break
        except OSError:
            time.sleep(0.1)
    else:
        stop(proc)
        raise RuntimeError("s3rver did not start listening within 30 s")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "GOOGLE_", "AZURE_", "PREP_STORE_"))}
    env.update(AWS_ENDPOINT_URL=f"http://127.0.0.1:{port}", AWS_ALLOW_HTTP="true", AWS_ACCESS_KEY_ID="S3RVER",
               AWS_SECRET_ACCESS_KEY="S3RVER", AWS_REGION="us-east-1")
    yield root, env
    stop(proc)


def objects(root: Path, prefix: str) -> list[str]:
    """The keys s3rver holds under bucket/prefix (it keeps each object as KEY._S3rver_object on disk)."""
    base = root / "bucket" / prefix
    suffix = "._S3rver_object"
    return sorted(str(p.relative_to(base))[:-len(suffix)] for p in base.rglob("*" + suffix)) if base.exists() else []


def tokenize(out: str, env: dict[str, str], staging: Path, *flags: str):
    return prep("tokenize", "--tokenizer", GPT2, "--input", CORPUS, "--output", out, "--quiet", *flags,
                env={**env, "PREP_STAGING_DIR": str(staging)})


def manifest(root: Path, prefix: str) -> dict:
    return json.loads((root / "bucket" / prefix / "manifest.json._S3rver_object").read_bytes())


def test_a_store_that_ignores_conditional_writes_is_refused_naming_it(s3rver, tmp_path):
    root, env = s3rver
    proc = tokenize("s3://bucket/refused", env, tmp_path / "staging")
    assert proc.returncode == 2, proc.stderr
    assert "s3://bucket/refused" in proc.stderr and "If-None-Match" in proc.stderr, proc.stderr
    assert "--single-writer" in proc.stderr and "PREP_STORE_SINGLE_WRITER=1" in proc.stderr, proc.stderr
    assert objects(root, "refused") == [], "nothing left in the store"


def test_with_a_single_writer_guaranteed_the_run_writes_a_valid_dataset(s3rver, tmp_path):
    root, env = s3rver
    env = {**env, "PREP_STORE_SINGLE_WRITER": "1"}
    proc = tokenize("s3://bucket/ds", env, tmp_path / "staging")
    assert proc.returncode == 0, proc.stderr
    check = prep("validate", "s3://bucket/ds", env=env)
    assert check.returncode == 0, check.stderr + check.stdout
    keys = objects(root, "ds")
    assert "manifest.json" in keys and "shard-00000.bin" in keys, keys
    assert ".prep-lock" not in keys, "the lock is released"
    assert manifest(root, "ds")["provenance"]["single_writer"] is True


@pytest.mark.parametrize("command", ["tokenize", "merge"])
def test_the_single_writer_flag_writes_and_the_manifest_records_it(s3rver, tmp_path, command):
    root, env = s3rver
    if command == "tokenize":
        proc = tokenize("s3://bucket/flag", env, tmp_path / "staging", "--single-writer")
    else:
        parts = []
        for i in (0, 1):
            part = tmp_path / f"part{i}"
            ok = prep("tokenize", "--tokenizer", GPT2, "--input", CORPUS, "--output", part, "--part", f"{i}/2",
                      "--quiet", env=env)
            assert ok.returncode == 0, ok.stderr
            parts.append(part)
        merge_env = {**env, "PREP_STAGING_DIR": str(tmp_path / "staging")}
        proc = prep("merge", *parts, "s3://bucket/merged", "--quiet", env=merge_env)
        assert proc.returncode == 2 and "--single-writer" in proc.stderr, proc.stderr
        proc = prep("merge", *parts, "s3://bucket/merged", "--quiet", "--single-writer", env=merge_env)
    assert proc.returncode == 0, proc.stderr
    prefix = "flag" if command == "tokenize" else "merged"
    check = prep("validate", f"s3://bucket/{prefix}", env=env)
    assert check.returncode == 0, check.stderr + check.stdout
    assert manifest(root, prefix)["provenance"]["single_writer"] is True
