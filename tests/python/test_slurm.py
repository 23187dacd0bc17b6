"""tools/slurm: a partitioned run through the Slurm scripts gives the dataset one machine makes.

No Slurm here: submit.sh runs against a fake `sbatch` on PATH that logs its
arguments and prints job ids, and the jobs it submitted are then run in
dependency order by calling tools/slurm/prep-task.sh with the arguments each
sbatch call was given, once per array index with SLURM_ARRAY_TASK_ID set, as
Slurm would. RUN/packed is compared record for record (and segment for
segment) with `prep tokenize; prep shuffle --seed S; prep pack` on one
machine (with `--near-dedup`, `prep dedup` before the shuffle), read with the
Python reader (python/prep/reader.py). The helpers here are shared with
test_ray.py.

    PREP_BIN=target/debug/prep target/venv/bin/python -m pytest tests/python/test_slurm.py
"""

from __future__ import annotations

import json
import importlib.util
import os
import shlex
import stat
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import zstandard

REPO = Path(__file__).resolve().parents[2]
FIXTURES = REPO / "fixtures"
CORPUS = FIXTURES / "corpus" / "debian-sample.jsonl.zst"
GPT2 = FIXTURES / "tokenizers" / "gpt2.tokenizer.json.zst"
PREP_BIN = Path(os.environ.get("PREP_BIN", REPO / os.environ.get("CARGO_TARGET_DIR", "target") / "debug" / "prep"))
SLURM = REPO / "tools" / "slurm"

# The reader as users who copy one file take it: python/prep/reader.py,
# loaded as prep_reader (not the installed package).
_spec = importlib.util.spec_from_file_location("prep_reader", REPO / "python" / "prep" / "reader.py")
prep_reader = importlib.util.module_from_spec(_spec)
sys.modules["prep_reader"] = prep_reader
_spec.loader.exec_module(prep_reader)
Dataset = prep_reader.Dataset

# The run every test here and in test_ray.py makes: several parts and
# buckets of a corpus split into several files, so that parts cut across files.
PARTS, BUCKETS, SEED, SEQ_LEN = 3, 4, 7, 512
STAGE_ORDER = ["tokenize", "merge-tokenized", "scatter", "gather", "merge-shuffled", "pack", "merge-packed"]
# With --near-dedup: prep dedup's three stages and a merge between tokenize and the shuffle.
NEAR_DEDUP_STAGE_ORDER = [*STAGE_ORDER[:2], "signatures", "buckets", "dedup", "merge-deduped", *STAGE_ORDER[2:]]
# Documents copied with a few words changed, for prep dedup to remove.
NEAR_COPIES = 4


def prep(*args: object) -> None:
    if not PREP_BIN.is_file():
        pytest.fail(f"no prep binary at {PREP_BIN}: build it (cargo build) or set PREP_BIN")
    proc = subprocess.run([str(PREP_BIN), *map(str, args)], capture_output=True, text=True, check=False)
    assert proc.returncode == 0, f"prep {' '.join(map(str, args))}: {proc.stderr}"


def split_corpus(dest: Path, files: int = 4, duplicate: bool = False, near_copies: int = 0) -> list[Path]:
    """The fixture corpus as `files` plain JSONL files of consecutive documents, in name order, and
    with `duplicate` one more file that repeats the second (documents for --dedup to drop), and
    with `near_copies` a last file of that many documents copied from all over the corpus with a
    few words changed (for prep dedup to drop: they are the last records tokenized)."""
    with CORPUS.open("rb") as f:
        lines = [x for x in zstandard.ZstdDecompressor().stream_reader(f).read().split(b"\n") if x.strip()]
    dest.mkdir(parents=True)
    paths = []
    for k in range(files):
        path = dest / f"docs-{k:02d}.jsonl"
        path.write_bytes(b"".join(x + b"\n" for x in lines[k * len(lines) // files:(k + 1) * len(lines) // files]))
        paths.append(path)
    if duplicate:
        paths.append(dest / f"docs-{len(paths):02d}.jsonl")
        paths[-1].write_bytes(paths[1].read_bytes())
    if near_copies:
        # Long documents, evenly spread, so that copy and original fall in different parts.
        long = [doc for doc in map(json.loads, lines) if len(doc["text"].split(" ")) >= 300]
        copies = [near_copy(long[k * len(long) // near_copies]) for k in range(near_copies)]
        paths.append(dest / f"docs-{len(paths):02d}.jsonl")
        paths[-1].write_text("".join(json.dumps(doc) + "\n" for doc in copies))
    return paths


def near_copy(doc: dict) -> dict:
    """`doc` with one word in 150 changed (at least two): a Jaccard similarity of its token 5-grams
    near 0.95, which prep dedup's defaults find with a probability within 1e-5 of 1."""
    words = doc["text"].split(" ")
    words = ["CHANGED" if k % 150 == 75 else w for k, w in enumerate(words)]
    return {**doc, "id": f"{doc['id']}-near-copy", "text": " ".join(words)}


def one_machine(inputs: list[Path], out: Path, mode: str | None = None, dedup: bool = False,
                near_dedup: bool = False) -> Path:
    """`prep tokenize; [prep dedup;] prep shuffle; prep pack` with the run's settings: the dataset
    to match."""
    inputs_args = [a for p in inputs for a in ("--input", p)]
    dedup_args = ["--dedup"] if dedup else []
    prep("tokenize", "--tokenizer", GPT2, *inputs_args, *dedup_args, "--output", out / "tokenized", "--quiet")
    documents = out / "tokenized"
    if near_dedup:
        prep("dedup", documents, out / "deduped", "--quiet")
        documents = out / "deduped"
    prep("shuffle", documents, out / "shuffled", "--seed", SEED, "--quiet")
    mode_args = ["--mode", mode] if mode else []
    prep("pack", out / "shuffled", out / "packed", "--seq-len", SEQ_LEN, *mode_args, "--quiet")
    return out


def manifest(dataset: Path) -> dict:
    return json.loads((dataset / "manifest.json").read_text())


def removed(deduped: Path) -> dict[int, int]:
    """prep dedup's report: each removed record of its input, and the record it was removed for."""
    lines = (deduped / "duplicates.jsonl").read_text().splitlines()
    return {r["doc"]: r["kept"] for r in map(json.loads, lines)}


def assert_near_copies_removed(single: Path) -> None:
    """The one-machine dedup removed the planted copies (the last records tokenized) for documents
    before them: the run has near-duplicates to find, and across parts."""
    n = manifest(single / "tokenized")["n_records"]
    report = removed(single / "deduped")
    for doc in range(n - NEAR_COPIES, n):
        assert report.get(doc, n) < n - NEAR_COPIES, f"near copy {doc} kept: {report}"
    assert manifest(single / "deduped")["n_records"] == n - len(report)


def assert_same_dataset(got: Path, want: Path) -> None:
    """Same records in the same order, and for packed datasets the same segments."""
    a, b = Dataset(got), Dataset(want)
    assert len(a) == len(b), f"{got}: {len(a)} records, {want}: {len(b)}"
    assert len(a) > 0
    packed = manifest(want)["kind"] == "packed"
    for i in range(len(b)):
        assert np.array_equal(a[i], b[i]), f"record {i} differs between {got} and {want}"
        if packed:
            assert np.array_equal(a.segments(i), b.segments(i)), f"segments of row {i} differ"
    for key in ("n_records", "n_tokens", "kind", "dtype", "vocab_size", "seq_len"):
        assert manifest(got).get(key) == manifest(want).get(key), key


def assert_near_dedup_run(run: Path, single: Path, summary: dict, retried: str) -> None:
    """What a driver's --near-dedup run leaves (Ray's and Slurm's alike): every dataset
    equal to the one-machine run's, the report byte for byte, and a run summary whose
    stages count what they did; `retried` is the stage one of whose tasks failed once."""
    for name in ("tokenized", "deduped", "shuffled", "packed"):
        assert_same_dataset(run / name, single / name)
    report = "deduped/duplicates.jsonl"
    assert (run / report).read_bytes() == (single / report).read_bytes()
    assert summary["status"] == "done" and summary["config"]["near_dedup"] is True
    st = summary["stages"]
    assert list(st) == ["tokenize", "signatures", "buckets", "dedup", "scatter", "gather", "pack"]
    tasks = {"signatures": PARTS, "buckets": BUCKETS, "dedup": PARTS}
    for name, n in tasks.items():
        assert (st[name]["tasks"], st[name]["done"]) == (n, n), name
    assert (st[retried]["attempts"], st[retried]["retries"]) == (tasks[retried] + 1, 1)
    tokenized, deduped = manifest(single / "tokenized"), manifest(single / "deduped")
    # A signature part counts the documents it signed (end - start), a bucket part nothing.
    assert (st["signatures"]["tokens"], st["signatures"]["records"]) == (None, tokenized["n_records"])
    assert (st["buckets"]["tokens"], st["buckets"]["records"]) == (None, None)
    assert st["signatures"]["merge"] is None and st["buckets"]["merge"] is None
    assert (st["dedup"]["tokens"], st["dedup"]["records"]) == (deduped["n_tokens"], deduped["n_records"])
    merge = st["dedup"]["merge"]
    assert merge["out"] == str(run / "deduped") and merge["records"] == deduped["n_records"]
    assert st["scatter"]["records"] == deduped["n_records"]
    assert summary["output"]["records"] == manifest(single / "packed")["n_records"]


def failing_once(path: Path, marker_dir: Path, *patterns: str, always: bool = False) -> Path:
    """A stand-in prep binary that fails the first call whose arguments contain a pattern (every
    such call if `always`), saying so on stderr, and otherwise runs the real one."""
    checks = []
    for k, pattern in enumerate(patterns):
        claim = "true" if always else f"mkdir {shlex.quote(str(marker_dir / f'failed-{k}'))} 2>/dev/null"
        checks.append(f'case " $* " in *{shlex.quote(pattern)}*) if {claim}; then '
                      f'echo "injected failure: {pattern}" >&2; exit 2; fi ;; esac')
    path.write_text("#!/bin/sh\n" + "\n".join(checks) + f"\nexec {shlex.quote(str(PREP_BIN))} \"$@\"\n")
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return path


@pytest.fixture(autouse=True)
def no_slurm_queries(monkeypatch):
    """status.sh asks sacct and squeue about the run's jobs: here there are no such jobs (and a
    Slurm client with no configuration would look for a controller in DNS)."""
    monkeypatch.setenv("SACCT", "false")
    monkeypatch.setenv("SQUEUE", "false")


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> tuple[list[Path], Path]:
    """The split corpus, a file of it twice, and the one-machine run on it with --dedup."""
    root = tmp_path_factory.mktemp("corpus")
    inputs = split_corpus(root / "inputs", duplicate=True)
    return inputs, one_machine(inputs, root / "one-machine", dedup=True)


@pytest.fixture(scope="module")
def near_corpus(tmp_path_factory) -> tuple[list[Path], Path]:
    """The corpus of `corpus` with near copies too, and the one-machine run on it with --dedup and
    prep dedup."""
    root = tmp_path_factory.mktemp("near-corpus")
    inputs = split_corpus(root / "inputs", duplicate=True, near_copies=NEAR_COPIES)
    single = one_machine(inputs, root / "one-machine", dedup=True, near_dedup=True)
    assert_near_copies_removed(single)
    return inputs, single


# --- the fake Slurm -------------------------------------------------------

FAKE_SBATCH = """#!/usr/bin/env python3
import json, os, sys
log = os.environ["FAKE_SBATCH_LOG"]
n = sum(1 for _ in open(log)) if os.path.exists(log) else 0
with open(log, "a") as f:
    f.write(json.dumps(sys.argv[1:]) + "\\n")
print(f"{1000 + n};fakecluster" if n % 2 else 1000 + n)  # --parsable, with and without a cluster name
"""


def submit(tmp: Path, run: Path, prep_bin: Path, inputs: list[Path], *extra: str) -> tuple[list[list[str]], str]:
    bindir = tmp / "bin"
    bindir.mkdir(exist_ok=True)
    (bindir / "sbatch").write_text(FAKE_SBATCH)
    (bindir / "sbatch").chmod(0o755)
    log = tmp / "sbatch.log"
    log.unlink(missing_ok=True)
    env = {**os.environ, "PATH": f"{bindir}:{os.environ['PATH']}", "FAKE_SBATCH_LOG": str(log)}
    args = [str(SLURM / "submit.sh"), "--prep", str(prep_bin), "--tokenizer", str(GPT2)]
    args += [a for p in inputs for a in ("--input", str(p))]
    args += ["--run", str(run), "--parts", str(PARTS), "--buckets", str(BUCKETS), "--seed", str(SEED),
             "--seq-len", str(SEQ_LEN), *extra]
    proc = subprocess.run(args, capture_output=True, text=True, env=env, check=False)
    assert proc.returncode == 0, proc.stderr
    return [json.loads(line) for line in log.read_text().splitlines()], proc.stdout


def option(call: list[str], name: str) -> str | None:
    """The value of sbatch's --name=value or --name value in one logged call."""
    for k, a in enumerate(call):
        if a.startswith(name + "="):
            return a.split("=", 1)[1]
        if a == name and k + 1 < len(call):
            return call[k + 1]
    return None


def script_args(call: list[str]) -> list[str]:
    """What follows the batch script: the arguments prep-task.sh gets."""
    k = next(k for k, a in enumerate(call) if a.endswith("prep-task.sh"))
    assert Path(call[k]) == SLURM / "prep-task.sh"
    return call[k + 1:]


def array_indices(spec: str | None) -> list[int | None]:
    if spec is None:
        return [None]
    lo, hi = spec.split("-")
    return list(range(int(lo), int(hi) + 1))


def run_task(args: list[str], index: int | None, job: int, check: bool = True,
             extra_env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """prep-task.sh as Slurm runs it: from a spool copy (so it cannot find its siblings by its own
    path), with the array variables of task `index` (and `extra_env`: the submitting shell's)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "PREP_"))}
    env.update(extra_env or {})
    env["SLURM_JOB_ID"] = str(job)
    if index is not None:
        env.update(SLURM_ARRAY_TASK_ID=str(index), SLURM_ARRAY_JOB_ID=str(job))
    spool = Path(args[1]) / ".." / "spool-slurm_script"
    spool.write_bytes((SLURM / "prep-task.sh").read_bytes())
    spool.chmod(0o755)
    proc = subprocess.run([str(spool), *args], capture_output=True, text=True, env=env, check=False)
    if check:
        assert proc.returncode == 0, f"prep-task.sh {args} #{index}: {proc.stderr}"
    return proc


def records(run: Path, stage: str, index: int) -> list[dict]:
    path = run / ".tasks" / f"{stage}-{index:05d}.json"
    return [json.loads(line) for line in path.read_text().splitlines()]


# --- tests -----------------------------------------------------------------

def test_submit_chains_the_arrays_by_afterok(tmp_path):
    run = tmp_path / "run"
    calls, stdout = submit(tmp_path, run, PREP_BIN, [tmp_path / "a.jsonl", tmp_path / "b.jsonl"],
                           "--threads", "2", "--sbatch-arg=--partition=cpu", "--sbatch-arg", "--time=1:00:00")
    assert len(calls) == 7
    stages = [script_args(c)[0] for c in calls]
    assert stages == STAGE_ORDER
    assert all(script_args(c)[1:] == [str(run)] for c in calls)
    arrays = [option(c, "--array") for c in calls]
    assert arrays == [f"0-{PARTS - 1}", None, f"0-{PARTS - 1}", f"0-{BUCKETS - 1}", None, f"0-{PARTS - 1}", None]
    deps = [option(c, "--dependency") for c in calls]
    assert deps == [None] + [f"afterok:{1000 + k}" for k in range(6)]  # ids with ";cluster" cut off
    for c in calls:
        assert "--parsable" in c and "--kill-on-invalid-dep=yes" in c
        assert option(c, "--partition") == "cpu" and option(c, "--time") == "1:00:00"
        assert option(c, "--cpus-per-task") == "2"
        assert option(c, "--job-name") == f"prep-{script_args(c)[0]}"
        assert option(c, "--output").startswith(str(run / "logs") + "/")
    ids = dict(line.split("=") for line in stdout.split())
    assert ids == {s: str(1000 + k) for k, s in enumerate(STAGE_ORDER)}
    assert (run / "slurm-jobs").read_text().split() == stdout.split()
    env = (run / "slurm.env").read_text()
    assert f"PREP_PARTS={PARTS}" in env and f"PREP_BUCKETS={BUCKETS}" in env and "PREP_THREADS=2" in env
    assert "PREP_NEAR_DEDUP=0" in env


def test_submit_with_near_dedup_puts_dedup_between_tokenize_and_the_shuffle(tmp_path):
    run = tmp_path / "run"
    calls, stdout = submit(tmp_path, run, PREP_BIN, [tmp_path / "a.jsonl"], "--near-dedup")
    assert [script_args(c)[0] for c in calls] == NEAR_DEDUP_STAGE_ORDER
    arrays = dict(zip(NEAR_DEDUP_STAGE_ORDER, (option(c, "--array") for c in calls)))
    assert (arrays["signatures"], arrays["buckets"], arrays["dedup"], arrays["merge-deduped"]) == (
        f"0-{PARTS - 1}", f"0-{BUCKETS - 1}", f"0-{PARTS - 1}", None)
    # Each job after the one before: signatures after merge-tokenized, scatter after merge-deduped.
    assert [option(c, "--dependency") for c in calls] == [None] + [f"afterok:{1000 + k}" for k in range(10)]
    ids = [line.split("=") for line in stdout.split()]
    assert ids == [[s, str(1000 + k)] for k, s in enumerate(NEAR_DEDUP_STAGE_ORDER)]
    assert (run / "slurm-jobs").read_text().split() == stdout.split()
    assert "PREP_NEAR_DEDUP=1" in (run / "slurm.env").read_text()


def test_submit_takes_several_inputs_after_one_flag(tmp_path):
    # As prep does: `--input data/*.jsonl` after the shell expanded the glob.
    names = [tmp_path / f"{k}.jsonl" for k in ("a", "b", "c", "d")]
    run = tmp_path / "run"
    calls, _ = submit(tmp_path, run, PREP_BIN, [], "--input", *map(str, names[:3]), "--input=" + str(names[3]))
    assert len(calls) == 7
    env = subprocess.run(["bash", "-c", f'source {run}/slurm.env; printf "%s" "$PREP_INPUTS"'],
                         capture_output=True, text=True, check=True).stdout
    assert env.split("\n") == [str(p) for p in names]


def test_submit_refuses_bad_arguments(tmp_path):
    bad = [["--parts", "0"], ["--mode", "random"], ["--seed", "x"], ["--bogus"]]
    for extra in bad:
        args = [str(SLURM / "submit.sh"), "--prep", str(PREP_BIN), "--tokenizer", str(GPT2),
                "--input", "x.jsonl", "--run", str(tmp_path / "run"), "--parts", "2", "--buckets", "2",
                "--seed", "1", "--seq-len", "8", *extra]
        proc = subprocess.run(args, capture_output=True, text=True, env={**os.environ, "SBATCH": "false"},
                              check=False)
        assert proc.returncode == 2, extra
        assert "submit.sh:" in proc.stderr


def test_slurm_run_equals_one_machine(tmp_path, corpus):
    inputs, single = corpus
    run = tmp_path / "run"
    # Tokenize task 1 and gather task 2 fail once; resubmitting them (as a user
    # would after a failed array, or Slurm on a requeue) finishes the run.
    flaky = failing_once(tmp_path / "flaky-prep", tmp_path, "--part 1/", "--gather --bucket 2 ")
    calls, _ = submit(tmp_path, run, flaky, inputs, "--dedup")
    failures = 0
    for job, call in enumerate(calls, start=1000):
        for index in array_indices(option(call, "--array")):
            proc = run_task(script_args(call), index, job, check=False)
            if proc.returncode != 0:
                failures += 1
                assert "injected failure" in proc.stderr
                run_task(script_args(call), index, job)  # the resubmitted task
    assert failures == 2

    assert_same_dataset(run / "packed", single / "packed")
    assert_same_dataset(run / "shuffled", single / "shuffled")
    assert_same_dataset(run / "tokenized", single / "tokenized")
    documents = manifest(single / "tokenized")["provenance"]["documents"]
    assert documents["deduplicated"] > 0
    assert manifest(run / "tokenized")["provenance"]["documents"] == documents

    first, again = records(run, "tokenize", 1)
    assert (first["ok"], first["exit"], first["tokens"]) == (False, 2, None)
    assert (again["ok"], again["exit"]) == (True, 0)
    assert again["job"] == "1000_1" and again["seconds"] > 0
    assert again["tokens"] == manifest(run / "tokenized" / "part-00001")["n_tokens"]

    summary = json.loads((run / "run-summary.json").read_text())
    assert summary["engine"] == "slurm" and summary["status"] == "done"
    st = summary["stages"]
    assert list(st) == ["tokenize", "scatter", "gather", "pack"]
    for name, tasks in (("tokenize", PARTS), ("scatter", PARTS), ("gather", BUCKETS), ("pack", PARTS)):
        assert (st[name]["tasks"], st[name]["done"]) == (tasks, tasks), name
    assert (st["tokenize"]["attempts"], st["tokenize"]["retries"], st["tokenize"]["failed_attempts"]) == (PARTS + 1, 1, 1)
    assert (st["gather"]["retries"], st["scatter"]["retries"], st["pack"]["retries"]) == (1, 0, 0)
    want = {name: manifest(single / name) for name in ("tokenized", "shuffled", "packed")}
    # The parts' tokens, before the merge drops the duplicates one part holds of another's.
    parts = [manifest(run / "tokenized" / f"part-{i:05d}") for i in range(PARTS)]
    assert st["tokenize"]["tokens"] == sum(m["n_tokens"] for m in parts) > want["tokenized"]["n_tokens"]
    assert st["tokenize"]["records"] == sum(m["n_records"] for m in parts)
    assert st["gather"]["tokens"] == want["shuffled"]["n_tokens"]
    assert st["pack"]["records"] == want["packed"]["n_records"]
    assert st["scatter"]["merge"] is None
    for name, out in (("tokenize", "tokenized"), ("gather", "shuffled"), ("pack", "packed")):
        merge = st[name]["merge"]
        assert merge["done"] and merge["out"] == str(run / out)
        assert (merge["tokens"], merge["records"]) == (want[out]["n_tokens"], want[out]["n_records"])
    assert summary["output"] == {"dir": str(run / "packed"), "tokens": want["packed"]["n_tokens"],
                                 "records": want["packed"]["n_records"]}
    assert summary["wall_seconds"] > 0

    status = subprocess.run([str(SLURM / "status.sh"), str(run)], capture_output=True, text=True, check=True)
    lines = {line.split()[0]: line.split() for line in status.stdout.splitlines()}
    assert lines["tokenize"][1:3] == [f"{PARTS}/{PARTS}", "1"]
    assert lines["gather"][1] == f"{BUCKETS}/{BUCKETS}"
    assert lines["merge-packed"][1] == "1/1"
    assert status.stdout.splitlines()[-1].startswith("done")


def test_slurm_run_with_near_dedup_equals_one_machine(tmp_path, near_corpus):
    """--near-dedup: prep dedup's signature, bucket and dataset tasks and their merge between
    tokenize and the shuffle give one machine's `prep dedup` (its report byte for byte), and the
    datasets after it equal one machine's."""
    inputs, single = near_corpus
    run = tmp_path / "run"
    # Bucket task 1 fails once, and is resubmitted.
    flaky = failing_once(tmp_path / "flaky-prep", tmp_path, "--buckets --part 1/")
    calls, _ = submit(tmp_path, run, flaky, inputs, "--dedup", "--near-dedup")
    for job, call in enumerate(calls, start=1000):
        for index in array_indices(option(call, "--array")):
            if run_task(script_args(call), index, job, check=False).returncode != 0:
                run_task(script_args(call), index, job)

    summary = json.loads((run / "run-summary.json").read_text())
    assert_near_dedup_run(run, single, summary, retried="buckets")
    assert summary["stages"]["dedup"]["merge"]["done"]
    # The tasks wrote their parts where the scripts say: in DATA/dedup-work and DATA/deduped.
    assert sorted(p.name for p in (run / "dedup-work").iterdir()) == (
        [f"buckets-{j:05d}" for j in range(BUCKETS)] + [f"signatures-{i:05d}" for i in range(PARTS)])
    tokenized = manifest(single / "tokenized")

    status = subprocess.run([str(SLURM / "status.sh"), str(run)], capture_output=True, text=True, check=True)
    table = [line.split() for line in status.stdout.splitlines()[1:len(NEAR_DEDUP_STAGE_ORDER) + 1]]
    assert [row[0] for row in table] == NEAR_DEDUP_STAGE_ORDER
    rows = {row[0]: row for row in table}
    assert rows["signatures"][1:5] == [f"{PARTS}/{PARTS}", "0", "-", str(tokenized["n_records"])]
    assert rows["buckets"][1:5] == [f"{BUCKETS}/{BUCKETS}", "1", "-", "-"]
    assert rows["merge-deduped"][1:2] == ["1/1"]
    assert status.stdout.splitlines()[-1].startswith("done")


def test_slurm_run_with_its_data_in_a_bucket_equals_one_machine(tmp_path, corpus):
    """--data s3://...: every dataset of the run is in object storage (a moto
    server on 127.0.0.1); RUN holds only the run's own small files."""
    pytest.importorskip("moto.server", reason="moto[server] not installed")
    from test_s3 import Server, store_env

    inputs, single = corpus
    run = tmp_path / "run"
    server = Server()
    try:
        server.client().create_bucket(Bucket="runs")
        env = {**store_env(server.url), "PREP_STAGING_DIR": str(tmp_path / "staging")}
        env = {k: v for k, v in env.items() if k.startswith(("AWS_", "PREP_"))}
        calls, _ = submit(tmp_path, run, PREP_BIN, inputs, "--dedup", "--data", "s3://runs/d1/")
        for job, call in enumerate(calls, start=1000):
            for index in array_indices(option(call, "--array")):
                run_task(script_args(call), index, job, extra_env=env)
        for name in ("tokenized", "shuffled", "packed"):
            fetched = tmp_path / "fetched" / name
            proc = subprocess.run([str(PREP_BIN), "fetch", f"s3://runs/d1/{name}", str(fetched)],
                                  capture_output=True, text=True, env={**os.environ, **env})
            assert proc.returncode == 0, proc.stderr
            assert_same_dataset(fetched, single / name)
        assert not [p for p in ("tokenized", "scatter", "shuffled", "packed") if (run / p).exists()]
        want = manifest(single / "packed")
        summary = json.loads((run / "run-summary.json").read_text())
        assert summary["status"] == "done"
        assert summary["output"] == {"dir": "s3://runs/d1/packed", "tokens": want["n_tokens"],
                                     "records": want["n_records"]}
        assert summary["stages"]["pack"]["merge"]["out"] == "s3://runs/d1/packed"
        assert summary["stages"]["gather"]["tokens"] == manifest(single / "shuffled")["n_tokens"]
    finally:
        server.stop()


def test_status_of_a_run_under_way(tmp_path, corpus):
    inputs, _ = corpus
    run = tmp_path / "run"
    broken = failing_once(tmp_path / "broken-prep", tmp_path, "--part 0/", always=True)
    calls, _ = submit(tmp_path, run, broken, inputs)
    proc = run_task(script_args(calls[0]), 0, 1000, check=False)
    assert proc.returncode == 2 and "injected failure" in proc.stderr
    run_task(script_args(calls[0]), 2, 1000)
    summary = json.loads(subprocess.run([str(SLURM / "status.sh"), "--json", str(run)], capture_output=True,
                                        text=True, check=True).stdout)
    assert summary["status"] == "failed"
    tok = summary["stages"]["tokenize"]
    assert (tok["tasks"], tok["done"], tok["attempts"], tok["failed_attempts"]) == (PARTS, 1, 2, 1)
    assert tok["tokens"] == manifest(run / "tokenized" / "part-00002")["n_tokens"]
    assert summary["stages"]["tokenize"]["merge"] == {"out": str(run / "tokenized"), "done": False}
    assert summary["output"]["tokens"] is None
    assert not (run / "run-summary.json").exists()
    assert summary["failures"] == [{"stage": "tokenize", "index": 0, "exit": 2, "job": "1000_0",
                                    "host": os.uname().nodename, "error": "injected failure: --part 0/"}]
    assert summary["slurm"] is None  # no sacct or squeue here

    text = subprocess.run([str(SLURM / "status.sh"), str(run)], capture_output=True, text=True, check=True).stdout
    assert "failed: tokenize task 0 (job 1000_0 on " in text and "exit 2): injected failure: --part 0/" in text
    assert f"log: {run}/logs/prep-tokenize-1000_0.out" in text
    assert text.splitlines()[-1].startswith("failed")


def test_status_of_an_unfinished_run_does_not_call_the_last_merge_done(tmp_path):
    # status.sh asked whether merge-packed was done before it wrote the pack
    # stage, and awk's lookup made that merge look done in the JSON.
    run = tmp_path / "run"
    submit(tmp_path, run, PREP_BIN, [tmp_path / "a.jsonl"])
    summary = json.loads(subprocess.run([str(SLURM / "status.sh"), "--json", str(run)], capture_output=True,
                                        text=True, check=True).stdout)
    assert summary["status"] == "running"
    for stage, out in (("tokenize", "tokenized"), ("gather", "shuffled"), ("pack", "packed")):
        assert summary["stages"][stage]["merge"] == {"out": str(run / out), "done": False}, stage


def test_status_reads_the_jobs_states_from_sacct_else_squeue(tmp_path, monkeypatch):
    run = tmp_path / "run"
    submit(tmp_path, run, PREP_BIN, [tmp_path / "a.jsonl"])  # jobs 1000 (tokenize) to 1006 (merge-packed)
    bindir = tmp_path / "slurm-bin"
    bindir.mkdir()
    # What sacct -X -P -o JobID,State,Reason and squeue -o '%i|%T|%r' print on a cluster where
    # tokenize task 2 failed and --kill-on-invalid-dep cancelled the rest; and a job of no run here.
    lines = ["1000_0|COMPLETED|None", "1000_1|COMPLETED|None", "1000_2|FAILED|NonZeroExitCode",
             "1001|CANCELLED{by}|DependencyNeverSatisfied", "1002_[0-2]|CANCELLED{by}|DependencyNeverSatisfied",
             "1003_[0-1,3%2]|CANCELLED{by}|DependencyNeverSatisfied", "77|RUNNING|None"]
    for name, by in (("sacct", " by 0"), ("squeue", "")):
        out = "\n".join(line.replace("{by}", by) for line in lines)
        (bindir / name).write_text(f"#!/bin/sh\necho \"$*\" >> {bindir}/{name}.args\ncat <<'EOF'\n{out}\nEOF\n")
        (bindir / name).chmod(0o755)

    def status(source: str) -> tuple[str, dict]:
        monkeypatch.setenv("SACCT", str(bindir / "sacct") if source == "sacct" else "false")
        monkeypatch.setenv("SQUEUE", str(bindir / "squeue"))
        text, js = (subprocess.run([str(SLURM / "status.sh"), *a, str(run)], capture_output=True, text=True,
                                   check=True).stdout for a in ([], ["--json"]))
        return text, json.loads(js)

    for source in ("sacct", "squeue"):
        text, summary = status(source)
        assert summary["slurm"]["source"] == source
        assert summary["slurm"]["jobs"] == [
            {"stage": "tokenize", "job": "1000", "state": "COMPLETED", "reason": None, "tasks": "0-1", "count": 2},
            {"stage": "tokenize", "job": "1000", "state": "FAILED", "reason": "NonZeroExitCode", "tasks": "2",
             "count": 1},
            {"stage": "merge-tokenized", "job": "1001", "state": "CANCELLED", "reason": "DependencyNeverSatisfied",
             "tasks": None, "count": 1},
            {"stage": "scatter", "job": "1002", "state": "CANCELLED", "reason": "DependencyNeverSatisfied",
             "tasks": "0-2", "count": 3},
            {"stage": "gather", "job": "1003", "state": "CANCELLED", "reason": "DependencyNeverSatisfied",
             "tasks": "0-1,3", "count": 3},
        ]
        # No attempt failed here; Slurm's word is enough to call the run failed.
        assert summary["status"] == "failed" and summary["failures"] == []
        assert "slurm: tokenize job 1000: FAILED (task 2), reason NonZeroExitCode" in text.splitlines()
        assert "slurm: scatter job 1002: CANCELLED (tasks 0-2), reason DependencyNeverSatisfied" in text.splitlines()
        assert text.splitlines()[-1] == "failed"
    asked = (bindir / "sacct.args").read_text().split()
    assert asked[asked.index("-j") + 1] == "1000,1001,1002,1003,1004,1005,1006"
    asked = (bindir / "squeue.args").read_text().split()
    assert asked[asked.index("-j") + 1] == "1000,1001,1002,1003,1004,1005,1006"


def test_task_refuses_an_index_past_the_parts(tmp_path):
    run = tmp_path / "run"
    calls, _ = submit(tmp_path, run, PREP_BIN, [tmp_path / "a.jsonl"])
    proc = run_task(script_args(calls[0]), PARTS, 1000, check=False)
    assert proc.returncode == 2 and "past --parts" in proc.stderr
    proc = run_task(["sort", str(run)], 0, 1000, check=False)
    assert proc.returncode == 2 and "unknown stage" in proc.stderr
