"""Object storage against a real S3 server: moto's server mode on 127.0.0.1.

prep reads inputs from s3:// exactly as from disk (the shards are compared
byte for byte), `prep fetch` brings a dataset down verified, and each way a
store can fail (a missing bucket, bad credentials, no server) is an exit 2
with the URL in the message and no manifest left behind.

    PREP_BIN=target/debug/prep target/venv/bin/python -m pytest tests/python/test_s3.py

Skipped, saying why, when moto[server] is not installed (tools/requirements.txt
installs it).
"""

from __future__ import annotations

import filecmp
import gzip
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import zstandard

boto3 = pytest.importorskip("boto3", reason="moto[server] (and boto3) not installed: pip install -r tools/requirements.txt")
pytest.importorskip("moto.server", reason="moto[server] not installed: pip install -r tools/requirements.txt")

REPO = Path(__file__).resolve().parents[2]
CORPUS = REPO / "fixtures" / "corpus" / "debian-sample.jsonl.zst"
PARQUET = REPO / "fixtures" / "corpus" / "debian-sample.parquet"
GPT2 = REPO / "fixtures" / "tokenizers" / "gpt2.tokenizer.json.zst"
PREP_BIN = Path(os.environ.get("PREP_BIN", REPO / os.environ.get("CARGO_TARGET_DIR", "target") / "debug" / "prep"))

# Small ranged GETs, so that a 3 MB corpus crosses many chunk boundaries.
CHUNK = 256 << 10


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    """A moto S3 server on a free loopback port, stopped by `stop()`."""

    def __init__(self, env: dict[str, str] | None = None) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(self.port)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            env={**os.environ, **(env or {})},
        )
        for _ in range(300):  # up to 30 s for the server to listen
            if self.proc.poll() is not None:
                raise RuntimeError(f"moto server exited with {self.proc.returncode}")
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=0.5).close()
                return
            except OSError:
                time.sleep(0.1)
        self.stop()
        raise RuntimeError("moto server did not start listening within 30 s")

    def client(self):
        return boto3.client(
            "s3",
            endpoint_url=self.url,
            aws_access_key_id="testing",
            aws_secret_access_key="testing",
            region_name="us-east-1",
        )

    def stop(self) -> None:
        stop(self.proc)


def stop(proc: subprocess.Popen) -> None:
    """Stops a test server: politely, then for good after 10 s."""
    proc.terminate()
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


@pytest.fixture(scope="module")
def s3():
    server = Server()
    yield server
    server.stop()


def store_env(endpoint: str, key: str = "testing") -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "GOOGLE_", "AZURE_"))}
    env.update(
        AWS_ENDPOINT_URL=endpoint,
        AWS_ALLOW_HTTP="true",
        AWS_ACCESS_KEY_ID=key,
        AWS_SECRET_ACCESS_KEY="testing",
        AWS_REGION="us-east-1",
        PREP_STORE_CHUNK_BYTES=str(CHUNK),
    )
    return env


def prep(*args: object, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    if not PREP_BIN.is_file():
        pytest.fail(f"no prep binary at {PREP_BIN}: build it (cargo build) or set PREP_BIN")
    return subprocess.run(
        [str(PREP_BIN), *map(str, args)], capture_output=True, text=True, check=False, env=env, timeout=300
    )


def ok(proc: subprocess.CompletedProcess) -> subprocess.CompletedProcess:
    assert proc.returncode == 0, f"{' '.join(proc.args)}: exit {proc.returncode}: {proc.stderr}"
    return proc


def corpus_lines() -> list[bytes]:
    with CORPUS.open("rb") as f:
        return [x for x in zstandard.ZstdDecompressor().stream_reader(f).read().split(b"\n") if x.strip()]


def write_inputs(dest: Path) -> list[Path]:
    """The corpus as three files, one per JSONL encoding, in name order."""
    lines = corpus_lines()
    third = len(lines) // 3
    parts = [lines[:third], lines[third : 2 * third], lines[2 * third :]]
    dest.mkdir(parents=True)
    a, b, c = dest / "a.jsonl", dest / "b.jsonl.gz", dest / "c.jsonl.zst"
    a.write_bytes(b"\n".join(parts[0]) + b"\n")
    b.write_bytes(gzip.compress(b"\n".join(parts[1]) + b"\n"))
    c.write_bytes(zstandard.ZstdCompressor().compress(b"\n".join(parts[2]) + b"\n"))
    return [a, b, c]


def upload_dir(client, bucket: str, local: Path, prefix: str) -> None:
    for path in sorted(local.rglob("*")):
        if path.is_file():
            client.upload_file(str(path), bucket, f"{prefix}/{path.relative_to(local).as_posix()}")


def shard_files(ds: Path) -> list[str]:
    return sorted(p.name for p in ds.iterdir() if p.name.startswith("shard-"))


def assert_same_shards(a: Path, b: Path) -> None:
    names = shard_files(a)
    assert names, f"{a} has no shards"
    assert names == shard_files(b)
    for name in names:
        assert (a / name).read_bytes() == (b / name).read_bytes(), name


@pytest.fixture(scope="module")
def bucket(s3, tmp_path_factory):
    """Bucket `data` holding in/ (the three JSONL files) and pq/ (the Parquet fixture)."""
    client = s3.client()
    client.create_bucket(Bucket="data")
    local = tmp_path_factory.mktemp("inputs") / "in"
    write_inputs(local)
    upload_dir(client, "data", local, "in")
    client.upload_file(str(PARQUET), "data", "pq/debian-sample.parquet")
    return local


def tokenize(inputs: list[str], out: Path, *extra: object, env=None) -> subprocess.CompletedProcess:
    return prep(
        "tokenize",
        "--tokenizer",
        GPT2,
        "--input",
        *inputs,
        "--output",
        out,
        "--shard-size",
        "256KiB",
        "--threads",
        2,
        *extra,
        env=env,
    )


def test_tokenize_from_s3_glob_equals_tokenize_from_disk(s3, bucket, tmp_path):
    env = store_env(s3.url)
    ok(tokenize([str(bucket)], tmp_path / "local"))
    ok(tokenize(["s3://data/in/*.jsonl*"], tmp_path / "remote", env=env))
    assert_same_shards(tmp_path / "local", tmp_path / "remote")
    ok(prep("validate", tmp_path / "remote"))
    # A "folder" is walked as a local directory is.
    ok(tokenize(["s3://data/in"], tmp_path / "folder", env=env))
    assert_same_shards(tmp_path / "local", tmp_path / "folder")


def test_tokenize_from_an_http_address_equals_tokenize_from_disk(s3, bucket, tmp_path):
    """A single file at http(s)://: HEAD, then ranged GETs, no credentials
    (the object is public on the test server)."""
    s3.client().put_object(Bucket="data", Key="pub/c.jsonl.zst", Body=(bucket / "c.jsonl.zst").read_bytes(),
                           ACL="public-read")
    ok(tokenize([str(bucket / "c.jsonl.zst")], tmp_path / "local"))
    env = {k: v for k, v in store_env(s3.url).items() if not k.startswith("AWS_")}
    ok(tokenize([f"{s3.url}/data/pub/c.jsonl.zst"], tmp_path / "http", env=env))
    assert_same_shards(tmp_path / "local", tmp_path / "http")


def test_tokenize_parts_from_s3_equal_parts_from_disk(s3, bucket, tmp_path):
    """--part slices a plain file by bytes: a remote slice starts at the same line."""
    env = store_env(s3.url)
    for part in ("0/3", "1/3", "2/3"):
        name = part.replace("/", "of")
        ok(tokenize([str(bucket / "a.jsonl")], tmp_path / f"local-{name}", "--part", part))
        ok(tokenize(["s3://data/in/a.jsonl"], tmp_path / f"remote-{name}", "--part", part, env=env))
        assert_same_shards(tmp_path / f"local-{name}", tmp_path / f"remote-{name}")


def test_parquet_from_s3_equals_parquet_from_disk(s3, bucket, tmp_path):
    env = store_env(s3.url)
    ok(tokenize([str(PARQUET)], tmp_path / "local"))
    ok(tokenize(["s3://data/pq/*.parquet"], tmp_path / "remote", env=env))
    assert_same_shards(tmp_path / "local", tmp_path / "remote")
    # Row groups shared between parts come from the remote footer too.
    ok(tokenize([str(PARQUET)], tmp_path / "local-part", "--part", "1/2"))
    ok(tokenize(["s3://data/pq/debian-sample.parquet"], tmp_path / "remote-part", "--part", "1/2", env=env))
    assert_same_shards(tmp_path / "local-part", tmp_path / "remote-part")


@pytest.mark.parametrize("form", ["file", "stream"])
def test_arrow_ipc_from_s3_equals_arrow_ipc_from_disk(s3, bucket, tmp_path, form):
    """An IPC file is read by seeks (its footer, then each block it lists),
    a stream front to back; both by ranged GETs smaller than the file."""
    pa = pytest.importorskip("pyarrow")
    import pyarrow.ipc
    import pyarrow.parquet
    table = pyarrow.parquet.read_table(PARQUET)
    path = tmp_path / f"docs-{form}.arrow"
    new = pyarrow.ipc.new_file if form == "file" else pyarrow.ipc.new_stream
    with pa.OSFile(str(path), "wb") as sink, new(sink, table.schema) as writer:
        writer.write_table(table, max_chunksize=64)  # many small record batches
    assert path.stat().st_size > 4 * CHUNK
    s3.client().upload_file(str(path), "data", f"ipc/{path.name}")
    ok(tokenize([str(path)], tmp_path / "local"))
    ok(tokenize([f"s3://data/ipc/{path.name}"], tmp_path / "remote", env=store_env(s3.url)))
    assert_same_shards(tmp_path / "local", tmp_path / "remote")


def assert_failed_cleanly(proc: subprocess.CompletedProcess, out: Path, *words: str) -> None:
    assert proc.returncode == 2, f"exit {proc.returncode}: {proc.stderr}"
    for word in words:
        assert word in proc.stderr, proc.stderr
    assert not (out / "manifest.json").exists()


def test_a_missing_bucket_is_exit_2_naming_it(s3, bucket, tmp_path):
    out = tmp_path / "out"
    proc = tokenize(["s3://no-such-bucket/in/*.jsonl"], out, env=store_env(s3.url))
    assert_failed_cleanly(proc, out, "s3://no-such-bucket/in/*.jsonl", "no such bucket")
    proc = tokenize(["s3://no-such-bucket/in/a.jsonl"], out, env=store_env(s3.url))
    assert_failed_cleanly(proc, out, "s3://no-such-bucket/in/a.jsonl", "no such bucket")


def test_a_missing_object_is_exit_2_naming_it(s3, bucket, tmp_path):
    out = tmp_path / "out"
    proc = tokenize(["s3://data/in/nope.jsonl"], out, env=store_env(s3.url))
    assert_failed_cleanly(proc, out, "s3://data/in/nope.jsonl")
    proc = tokenize(["s3://data/in/*.parquet"], out, env=store_env(s3.url))
    assert_failed_cleanly(proc, out, "matched no file")


def test_bad_credentials_are_exit_2_naming_the_url(tmp_path):
    # A server that checks signatures against the keys its IAM knows: none.
    server = Server(env={"INITIAL_NO_AUTH_ACTION_COUNT": "0"})
    try:
        out = tmp_path / "out"
        proc = tokenize(["s3://data/in/*.jsonl"], out, env=store_env(server.url, key="AKIAWRONGWRONGWRONG1"))
        assert_failed_cleanly(proc, out, "s3://data/in/*.jsonl", "credentials")
    finally:
        server.stop()


def test_no_server_is_exit_2_naming_the_url(tmp_path):
    out = tmp_path / "out"
    proc = tokenize(["s3://data/in/a.jsonl"], out, env=store_env(f"http://127.0.0.1:{free_port()}"))
    assert_failed_cleanly(proc, out, "s3://data/in/a.jsonl")


def test_a_server_stopped_mid_read_is_exit_2_and_leaves_no_manifest(tmp_path):
    """The connection drops while the shards are being read: the reader's
    error names the object, the run stops with exit 2, no manifest."""
    server = Server()
    client = server.client()
    client.create_bucket(Bucket="data")
    # One large plain file read in many small ranged GETs.
    lines = corpus_lines()
    big = tmp_path / "big.jsonl"
    with big.open("wb") as f:
        for _ in range(8):
            f.write(b"\n".join(lines) + b"\n")
    client.upload_file(str(big), "data", "in/big.jsonl")
    env = {**store_env(server.url), "PREP_STORE_CHUNK_BYTES": str(16 << 10)}
    out = tmp_path / "out"
    proc = subprocess.Popen(
        [str(PREP_BIN), "tokenize", "--tokenizer", GPT2, "--input", "s3://data/in/big.jsonl", "--output", out,
         "--threads", "1"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
    )
    # Stop the server once the first shard's reading is under way (the
    # output directory exists), or after 20 s at most.
    for _ in range(200):
        if out.exists() or proc.poll() is not None:
            break
        time.sleep(0.1)
    server.stop()
    _, stderr = proc.communicate(timeout=120)
    if proc.returncode == 0:
        pytest.skip("the run finished before the server stopped; nothing dropped")
    assert proc.returncode == 2, stderr
    assert "s3://data/in/big.jsonl" in stderr, stderr
    assert not (out / "manifest.json").exists()


@pytest.fixture(scope="module")
def remote_dataset(s3, bucket, tmp_path_factory):
    """A tokenized dataset in the bucket at ds/, and its local original."""
    local = tmp_path_factory.mktemp("dataset") / "ds"
    ok(tokenize([str(bucket)], local))
    upload_dir(s3.client(), "data", local, "ds")
    return local


def test_fetch_brings_down_the_dataset_byte_for_byte(s3, remote_dataset, tmp_path):
    env = store_env(s3.url)
    dest = tmp_path / "fetched"
    ok(prep("fetch", "s3://data/ds", dest, env=env))
    cmp = filecmp.dircmp(remote_dataset, dest)
    assert sorted(os.listdir(dest)) == sorted(os.listdir(remote_dataset))
    for name in os.listdir(dest):
        assert (dest / name).read_bytes() == (remote_dataset / name).read_bytes(), name
    assert not cmp.diff_files
    ok(prep("validate", dest))
    # Again: the directory already holds it, complete.
    proc = ok(prep("fetch", "s3://data/ds/", dest, env=env))
    assert "already holds this dataset" in proc.stderr


def test_fetch_refuses_a_corrupt_object_then_resumes_once_it_is_repaired(s3, remote_dataset, tmp_path):
    env = store_env(s3.url)
    client = s3.client()
    upload_dir(client, "data", remote_dataset, "bad")
    shards = [n for n in shard_files(remote_dataset) if n.endswith(".bin")]
    assert len(shards) >= 2, "the dataset needs two shards for a resume to show"
    victim = shards[1]
    data = bytearray((remote_dataset / victim).read_bytes())
    data[len(data) // 2] ^= 0xFF
    client.put_object(Bucket="data", Key=f"bad/{victim}", Body=bytes(data))

    dest = tmp_path / "fetched"
    proc = prep("fetch", "s3://data/bad", dest, env=env)
    assert_failed_cleanly(proc, dest, f"s3://data/bad/{victim}", "does not match the manifest")
    assert not (dest / victim).exists()
    assert not any(p.name.endswith(".tmp") for p in dest.iterdir())
    # The shard verified before the corrupt one is kept for a resume.
    assert (dest / shards[0]).read_bytes() == (remote_dataset / shards[0]).read_bytes()

    client.upload_file(str(remote_dataset / victim), "data", f"bad/{victim}")
    proc = ok(prep("fetch", "s3://data/bad", dest, env=env))
    assert "already in place" in proc.stderr, proc.stderr
    for name in os.listdir(remote_dataset):
        assert (dest / name).read_bytes() == (remote_dataset / name).read_bytes(), name


def test_fetch_refuses_a_directory_holding_other_files(s3, remote_dataset, tmp_path):
    dest = tmp_path / "busy"
    dest.mkdir()
    (dest / "notes.txt").write_text("mine")
    proc = prep("fetch", "s3://data/ds", dest, env=store_env(s3.url))
    assert_failed_cleanly(proc, dest, "notes.txt")
    assert (dest / "notes.txt").read_text() == "mine"


def test_fetch_of_a_missing_dataset_is_exit_2(s3, bucket, tmp_path):
    dest = tmp_path / "none"
    proc = prep("fetch", "s3://data/nothing-here", dest, env=store_env(s3.url))
    assert_failed_cleanly(proc, dest, "s3://data/nothing-here/manifest.json")
    assert not dest.exists()


# --- validate, inspect and sample read a dataset in place -------------------

# An odd chunk size: ranged GETs then split tokens, offsets and segment
# entries between chunks, which the in-place checks must put back together.
ODD_CHUNK = 1031


def in_place_env(s3) -> dict[str, str]:
    return {**store_env(s3.url), "PREP_STORE_CHUNK_BYTES": str(ODD_CHUNK)}


def same_output(local: subprocess.CompletedProcess, remote: subprocess.CompletedProcess, local_name, remote_name):
    """The two runs print the same, once the dataset's name is swapped and
    the wall time (and the speed computed from it) are left out."""
    import json
    import re

    def clean(text: str, name: str) -> str:
        text = text.replace(str(name), "DATASET")
        try:
            report = json.loads(text)
        except ValueError:
            return re.sub(r" in [0-9.]+s: [0-9]+ MB/s\.", " in Ts.", text)
        if isinstance(report.get("checked"), dict):
            report["checked"].pop("seconds", None)
        return json.dumps(report, sort_keys=True, indent=1)

    assert remote.returncode == local.returncode, f"local exit {local.returncode}, remote {remote.returncode}: {remote.stderr}"
    assert clean(remote.stdout, remote_name) == clean(local.stdout, local_name)


def upload_dataset(s3, local: Path, prefix: str) -> str:
    upload_dir(s3.client(), "data", local, prefix)
    return f"s3://data/{prefix}"


@pytest.fixture(scope="module")
def small_dataset(s3, bucket, tmp_path_factory):
    """A quarter of the corpus in shards of 16 KiB (about 10 of them), tokenized
    with a word-level tokenizer of its 2,000 commonest words, locally and at small/.
    The in-place tests read it in GETs of ODD_CHUNK bytes, every command the
    shards and the tokenizer.json the dataset keeps: with GPT-2's (3.5 MB) on
    the whole corpus that was tens of thousands of requests to the moto server,
    ten minutes on 2 cores, for the same checks."""
    import collections
    import json

    tmp = tmp_path_factory.mktemp("small")
    lines = corpus_lines()[: len(corpus_lines()) // 4]
    source = tmp / "in.jsonl"
    source.write_bytes(b"\n".join(lines) + b"\n")
    words = collections.Counter(w for line in lines for w in json.loads(line)["text"].split())
    vocab = {"[UNK]": 0, "<eos>": 1}
    for word, _ in words.most_common(2000):
        vocab.setdefault(word, len(vocab))
    tokenizer = tmp / "words.tokenizer.json"
    tokenizer.write_text(json.dumps({
        "version": "1.0", "truncation": None, "padding": None,
        "added_tokens": [{"id": 1, "content": "<eos>", "single_word": False, "lstrip": False, "rstrip": False,
                          "normalized": False, "special": True}],
        "normalizer": None, "pre_tokenizer": {"type": "WhitespaceSplit"}, "post_processor": None, "decoder": None,
        "model": {"type": "WordLevel", "vocab": vocab, "unk_token": "[UNK]"},
    }))
    local = tmp / "ds"
    ok(prep("tokenize", "--tokenizer", tokenizer, "--input", source, "--output", local, "--shard-size", "16KiB",
            "--threads", 2))
    assert len([p for p in local.iterdir() if p.suffix == ".bin"]) >= 4
    upload_dataset(s3, local, "small")
    return local


@pytest.fixture(scope="module")
def packed_dataset(s3, small_dataset, tmp_path_factory):
    """The small dataset packed into rows (a .seg per shard), locally and at packed/."""
    local = tmp_path_factory.mktemp("packed") / "packed"
    ok(prep("pack", small_dataset, local, "--seq-len", 128, "--shard-size", "16KiB", "--threads", 2))
    assert len([p for p in local.iterdir() if p.suffix == ".seg"]) >= 4
    upload_dataset(s3, local, "packed")
    return local


@pytest.mark.parametrize("which", ["documents", "packed"])
def test_validate_inspect_and_sample_in_place_equal_them_on_disk(s3, small_dataset, packed_dataset, which):
    env = in_place_env(s3)
    local, url = (small_dataset, "s3://data/small") if which == "documents" else (packed_dataset, "s3://data/packed")
    runs = [
        ["validate"],
        ["validate", "--json"],
        ["validate", "--quick", "--json"],
        ["inspect"],
        ["inspect", "--json"],
        ["inspect", "--record", "3"],
        ["inspect", "--json", "--record", "0"],
        ["sample", "--seed", "7", "--world-size", "2", "--rank", "1"],
    ]
    for args in runs:
        here = prep(*args, local)
        there = prep(*args, url, env=env)
        assert here.returncode == 0, f"{args}: {here.stderr}"
        same_output(here, there, local, url)
    # The last record: its tokens end the last shard's .bin.
    last = int(json_of(prep("inspect", "--json", local))["manifest"]["n_records"]) - 1
    same_output(prep("inspect", "--json", "--record", last, local),
                prep("inspect", "--json", "--record", last, url, env=env), local, url)


def json_of(proc: subprocess.CompletedProcess):
    import json

    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def corrupt(path: Path, how: str) -> None:
    data = bytearray(path.read_bytes())
    if how == "flip":
        data[len(data) // 2 + 1] ^= 0xFF
    else:
        data = data[: len(data) - 13]
    path.write_bytes(bytes(data))


@pytest.mark.parametrize(
    "which,suffix,how",
    [
        ("documents", ".bin", "flip"),
        ("documents", ".bin", "truncate"),
        ("documents", ".idx", "flip"),
        ("documents", ".idx", "truncate"),
        ("packed", ".seg", "flip"),
        ("packed", ".seg", "truncate"),
        ("packed", ".bin", "flip"),
    ],
)
def test_a_corrupt_object_gives_the_problems_of_the_same_corruption_on_disk(
    s3, small_dataset, packed_dataset, tmp_path, which, suffix, how
):
    import shutil

    source = small_dataset if which == "documents" else packed_dataset
    local = tmp_path / "ds"
    shutil.copytree(source, local)
    victim = sorted(p for p in local.iterdir() if p.suffix == suffix)[1]
    corrupt(victim, how)
    prefix = f"corrupt-{which}-{suffix[1:]}-{how}"
    url = upload_dataset(s3, local, prefix)
    env = in_place_env(s3)
    here = prep("validate", "--json", local)
    assert here.returncode == 1, here.stdout
    assert victim.name in here.stdout
    same_output(here, prep("validate", "--json", url, env=env), local, url)
    same_output(prep("validate", local), prep("validate", url, env=env), local, url)


def test_an_object_prep_did_not_write_is_reported_as_an_unlisted_file(s3, small_dataset, tmp_path):
    import shutil

    local = tmp_path / "ds"
    shutil.copytree(small_dataset, local)
    (local / "shard-99999.bin").write_bytes(b"\0\0")
    url = upload_dataset(s3, local, "extra")
    here = prep("validate", "--json", local)
    assert "unlisted_file" in here.stdout and "shard-99999.bin" in here.stdout
    same_output(here, prep("validate", "--json", url, env=in_place_env(s3)), local, url)


@pytest.mark.parametrize("command", [["validate"], ["validate", "--json"], ["inspect"], ["sample", "--seed", "1"]])
def test_a_missing_bucket_or_manifest_in_place_is_exit_2_naming_the_manifest(s3, remote_dataset, command):
    env = in_place_env(s3)
    for url, words in [
        ("s3://no-such-bucket/ds", ["s3://no-such-bucket/ds/manifest.json", "no such bucket"]),
        ("s3://data/nothing-here", ["s3://data/nothing-here/manifest.json", "no manifest.json"]),
    ]:
        proc = prep(*command, url, env=env)
        assert proc.returncode == 2, f"{command} {url}: exit {proc.returncode}: {proc.stderr}"
        for word in words:
            assert word in proc.stderr, proc.stderr


def test_bad_credentials_in_place_are_exit_2_naming_the_object(s3, remote_dataset, tmp_path):
    server = Server(env={"INITIAL_NO_AUTH_ACTION_COUNT": "0"})
    try:
        env = store_env(server.url, key="AKIAWRONGWRONGWRONG1")
        for command in (["validate"], ["inspect"], ["sample", "--seed", "1"]):
            proc = prep(*command, "s3://data/ds", env=env)
            assert proc.returncode == 2, f"{command}: exit {proc.returncode}: {proc.stderr}"
            assert "s3://data/ds/manifest.json" in proc.stderr and "credentials" in proc.stderr, proc.stderr
    finally:
        server.stop()


def test_a_server_stopped_mid_validate_is_exit_2_naming_the_object(remote_dataset, tmp_path):
    """The connection drops while the shards are streamed: exit 2 (not a
    verdict on the dataset), the object that was being read named."""
    server = Server()
    client = server.client()
    client.create_bucket(Bucket="data")
    upload_dir(client, "data", remote_dataset, "ds")
    # Tiny GETs, one thread: the checks take long enough to be cut.
    env = {**store_env(server.url), "PREP_STORE_CHUNK_BYTES": "257"}
    proc = subprocess.Popen(
        [str(PREP_BIN), "validate", "--threads", "1", "s3://data/ds"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
    )
    time.sleep(1.5)
    server.stop()
    stdout, stderr = proc.communicate(timeout=120)
    if proc.returncode == 0:
        pytest.skip("validate finished before the server stopped; nothing dropped")
    assert proc.returncode == 2, stdout + stderr
    assert "s3://data/ds/" in stderr, stderr
    assert "INVALID" not in stdout
