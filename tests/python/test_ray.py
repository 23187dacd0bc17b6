"""tools/prep_ray.py: a partitioned run on a Ray cluster gives the dataset one machine makes.

A local Ray cluster of two worker CPUs is started here, once for the module,
and the driver joins it (its `main`, in this process). RUN/packed is compared
record for record (and segment for segment) with `prep tokenize; prep
shuffle --seed S; prep pack` on one machine (with --near-dedup, `prep dedup`
before the shuffle); tasks that fail once are retried and the run still
matches; a task that fails every time stops the run with prep's message.
Skipped where `ray` is not installed (`make test-ray` makes a virtual
environment with it).

    PREP_BIN=target/debug/prep target/venv-ray/bin/python -m pytest tests/python/test_ray.py
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys

import pytest

from test_slurm import (BUCKETS, GPT2, NEAR_COPIES, PARTS, PREP_BIN, REPO, SEED, SEQ_LEN,
                        assert_near_copies_removed, assert_near_dedup_run, assert_same_dataset, failing_once,
                        manifest, one_machine, split_corpus)

ray = pytest.importorskip("ray", reason="ray is not installed: `make test-ray` runs these tests in a venv with it")

sys.path.insert(0, str(REPO / "tools"))
import prep_ray  # noqa: E402


@pytest.fixture(scope="module", autouse=True)
def cluster():
    if not PREP_BIN.is_file():
        pytest.fail(f"no prep binary at {PREP_BIN}: build it (cargo build) or set PREP_BIN")
    # Two CPUs, so tasks of a stage run side by side in separate worker processes.
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield
    ray.shutdown()


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    root = tmp_path_factory.mktemp("corpus")
    inputs = split_corpus(root / "inputs")
    return inputs, one_machine(inputs, root / "one-machine", mode="concat")


@pytest.fixture(scope="module")
def near_corpus(tmp_path_factory):
    """The split corpus with near copies of some documents, and the one-machine run with prep dedup."""
    root = tmp_path_factory.mktemp("near-corpus")
    inputs = split_corpus(root / "inputs", near_copies=NEAR_COPIES)
    single = one_machine(inputs, root / "one-machine", mode="concat", near_dedup=True)
    assert_near_copies_removed(single)
    return inputs, single


def drive(capsys, run, inputs, prep_bin=PREP_BIN, *extra: str) -> tuple[int, list[str]]:
    """prep_ray.py's main on the running cluster: its exit status and the lines it printed."""
    capsys.readouterr()
    code = prep_ray.main(["--prep", str(prep_bin), "--tokenizer", str(GPT2),
                          *(a for p in inputs for a in ("--input", str(p))), "--run", str(run),
                          "--parts", str(PARTS), "--buckets", str(BUCKETS), "--seed", str(SEED),
                          "--seq-len", str(SEQ_LEN), "--mode", "concat", *extra])
    return code, capsys.readouterr().out.splitlines()


def test_ray_run_equals_one_machine_and_retries_failed_tasks(tmp_path, corpus, capsys):
    inputs, single = corpus
    run = tmp_path / "run"
    # Tokenize task 1 and gather task 2 fail on their first attempt; Ray runs them again.
    flaky = failing_once(tmp_path / "flaky-prep", tmp_path, "--part 1/", "--gather --bucket 2 ")
    code, lines = drive(capsys, run, inputs, flaky, "--max-retries", "2")
    assert code == 0, "\n".join(lines)

    assert_same_dataset(run / "packed", single / "packed")
    assert_same_dataset(run / "shuffled", single / "shuffled")
    assert_same_dataset(run / "tokenized", single / "tokenized")

    summary = json.loads((run / "run-summary.json").read_text())
    assert summary["engine"] == "ray" and summary["status"] == "done" and summary["error"] is None
    st = summary["stages"]
    assert list(st) == ["tokenize", "scatter", "gather", "pack"]
    for name, tasks in (("tokenize", PARTS), ("scatter", PARTS), ("gather", BUCKETS), ("pack", PARTS)):
        assert (st[name]["tasks"], st[name]["done"]) == (tasks, tasks), name
        assert st[name]["wall_seconds"] > 0
    assert (st["tokenize"]["attempts"], st["tokenize"]["retries"]) == (PARTS + 1, 1)
    assert (st["gather"]["retries"], st["scatter"]["retries"], st["pack"]["retries"]) == (1, 0, 0)
    want = {name: manifest(single / name) for name in ("tokenized", "shuffled", "packed")}
    assert (st["tokenize"]["tokens"], st["tokenize"]["records"]) == (want["tokenized"]["n_tokens"],
                                                                     want["tokenized"]["n_records"])
    assert st["gather"]["tokens"] == want["shuffled"]["n_tokens"]
    assert st["pack"]["records"] == want["packed"]["n_records"]
    assert st["scatter"]["merge"] is None
    for name, out in (("tokenize", "tokenized"), ("gather", "shuffled"), ("pack", "packed")):
        merge = st[name]["merge"]
        assert merge["out"] == str(run / out) and merge["seconds"] > 0
        assert (merge["tokens"], merge["records"]) == (want[out]["n_tokens"], want[out]["n_records"])
    assert summary["output"] == {"dir": str(run / "packed"), "tokens": want["packed"]["n_tokens"],
                                 "records": want["packed"]["n_records"]}

    # A progress line per finished task, the last of each stage with every task and all its tokens.
    progress = [line for line in lines if line.startswith("tokenize: ")]
    assert len(progress) == PARTS
    assert progress[-1].startswith(f"tokenize: {PARTS}/{PARTS} tasks done, ")
    assert f"{prep_ray.human(want['tokenized']['n_tokens'])} tokens written" in progress[-1]
    assert any("task 1 took 2 attempts" in line for line in progress)
    assert sum(line.startswith("gather: ") for line in lines) == BUCKETS
    assert lines[-1].startswith("done in ")

    # The attempt log of the retried task: two starts, a failure with prep's message, then done.
    log = [json.loads(x) for x in (run / ".tasks" / "ray-tokenize-00001.jsonl").read_text().splitlines()]
    assert [r["event"] for r in log] == ["start", "failed", "start", "done"]
    assert "injected failure" in log[1]["error"]

    # Run again on the finished run: every task finds its part done, and the output stays.
    code, _ = drive(capsys, run, inputs)
    assert code == 0
    assert_same_dataset(run / "packed", single / "packed")


def test_ray_run_with_near_dedup_equals_one_machine(tmp_path, near_corpus, capsys):
    inputs, single = near_corpus
    run = tmp_path / "run"
    # Signature task 1 fails on its first attempt; Ray runs it again.
    flaky = failing_once(tmp_path / "flaky-prep", tmp_path, "--signatures --part 1/")
    code, lines = drive(capsys, run, inputs, flaky, "--near-dedup", "--max-retries", "1")
    assert code == 0, "\n".join(lines)

    summary = json.loads((run / "run-summary.json").read_text())
    assert_near_dedup_run(run, single, summary, retried="signatures")
    tokenized, deduped = manifest(single / "tokenized"), manifest(single / "deduped")

    signed = [line for line in lines if line.startswith("signatures: ")]
    assert len(signed) == PARTS
    assert signed[-1].startswith(f"signatures: {PARTS}/{PARTS} tasks done, {tokenized['n_records']} documents signed, ")
    found = [line for line in lines if line.startswith("buckets: ")]
    assert len(found) == BUCKETS and "written" not in found[-1]
    merged = f"merge deduped: {prep_ray.human(deduped['n_tokens'])} tokens, {deduped['n_records']} records, "
    assert any(line.startswith(merged) for line in lines)


def test_a_task_failing_every_time_stops_the_run_with_prep_message(tmp_path, corpus, capsys):
    inputs, _ = corpus
    run = tmp_path / "run"
    broken = failing_once(tmp_path / "broken-prep", tmp_path, "--part 0/", always=True)
    code, lines = drive(capsys, run, inputs, broken, "--max-retries", "1")
    assert code == 2
    summary = json.loads((run / "run-summary.json").read_text())
    assert summary["status"] == "failed"
    assert summary["error"].startswith("tokenize task 0, attempt 2: prep exited with 2")
    assert "injected failure: --part 0/" in summary["error"]
    assert list(summary["stages"]) == ["tokenize"]
    assert summary["stages"]["tokenize"]["attempts"] >= 2
    assert not (run / "packed").exists()
    assert any(line.startswith("error: tokenize task 0") for line in lines)
    assert "injected failure: --part 0/" in "\n".join(lines)


def test_a_run_in_a_bucket_equals_one_machine(tmp_path, corpus, capsys, monkeypatch):
    """--run s3://...: every part, scatter part and merge lives in the bucket
    (a moto server on 127.0.0.1), the tasks share no folder, and the
    packed dataset equals one machine's, shard for shard."""
    pytest.importorskip("moto.server", reason="moto[server] not installed")
    from test_s3 import Server, store_env

    inputs, single = corpus
    server = Server()
    try:
        server.client().create_bucket(Bucket="runs")
        env = store_env(server.url)
        for key in [k for k in os.environ if k.startswith(("AWS_", "GOOGLE_", "AZURE_"))]:
            monkeypatch.delenv(key)
        for key, value in env.items():
            if key.startswith(("AWS_", "PREP_")):
                monkeypatch.setenv(key, value)
        monkeypatch.setenv("PREP_STAGING_DIR", str(tmp_path / "staging"))
        logs = tmp_path / "logs"
        code, lines = drive(capsys, "s3://runs/r1", inputs, PREP_BIN, "--log-dir", str(logs))
        assert code == 0, "\n".join(lines)
        for name in ("tokenized", "shuffled", "packed"):
            fetched = tmp_path / "fetched" / name
            proc = subprocess.run([str(PREP_BIN), "fetch", f"s3://runs/r1/{name}", str(fetched)],
                                  capture_output=True, text=True, env={**os.environ})
            assert proc.returncode == 0, proc.stderr
            assert_same_dataset(fetched, single / name)
        summary = json.loads((logs / "run-summary.json").read_text())
        assert summary["status"] == "done" and summary["run"] == "s3://runs/r1"
        want = manifest(single / "packed")
        assert summary["output"] == {"dir": "s3://runs/r1/packed", "tokens": want["n_tokens"],
                                     "records": want["n_records"]}
        assert summary["stages"]["tokenize"]["tokens"] == manifest(single / "tokenized")["n_tokens"]
        # Each merge names its parts' shards where they lie: nothing copied.
        listed = server.client().list_objects_v2(Bucket="runs", Prefix="r1/packed/")["Contents"]
        assert not [o["Key"] for o in listed if o["Key"].startswith("r1/packed/shard-")]
    finally:
        server.stop()


def test_plan_names_every_part_and_bucket():
    cfg = prep_ray.Config(prep=REPO / "prep", tokenizer=GPT2, inputs=("/data/a.jsonl",), run=REPO / "run",
                          parts=2, buckets=3, seed=5, seq_len=64, mode="bestfit", text_key="body",
                          dedup=True, threads=1)
    stages = prep_ray.plan(cfg)
    assert [s.name for s in stages] == ["tokenize", "scatter", "gather", "pack"]
    tok, scatter, gather, pack = stages
    assert tok.tasks[1].args == ("tokenize", "--tokenizer", str(GPT2), "--input", "/data/a.jsonl",
                                 "--output", str(REPO / "run/tokenized/part-00001"), "--part", "1/2",
                                 "--text-key", "body", "--dedup", "--threads", "1", "--quiet")
    assert tok.merge.args == ("merge", str(REPO / "run/tokenized/part-00000"),
                              str(REPO / "run/tokenized/part-00001"), str(REPO / "run/tokenized"), "--quiet")
    assert scatter.merge is None and len(scatter.tasks) == 2
    assert scatter.tasks[0].args[:10] == ("shuffle", str(REPO / "run/tokenized"), str(REPO / "run/scatter"),
                                          "--seed", "5", "--scatter", "--part", "0/2", "--buckets", "3")
    assert [t.out.name for t in gather.tasks] == ["bucket-00000", "bucket-00001", "bucket-00002"]
    assert gather.tasks[2].args[:5] == ("shuffle", str(REPO / "run/scatter"),
                                        str(REPO / "run/shuffled/bucket-00002"), "--gather", "--bucket")
    assert pack.tasks[1].args[:8] == ("pack", str(REPO / "run/shuffled"), str(REPO / "run/packed/part-00001"),
                                      "--part", "1/2", "--seq-len", "64", "--mode")
    assert pack.merge.out == REPO / "run/packed"


def test_plan_with_near_dedup_puts_its_three_stages_before_the_shuffle():
    cfg = prep_ray.Config(prep=REPO / "prep", tokenizer=GPT2, inputs=("/data/a.jsonl",), run=REPO / "run",
                          parts=2, buckets=3, seed=5, seq_len=64, near_dedup=True, threads=1)
    stages = prep_ray.plan(cfg)
    assert [s.name for s in stages] == ["tokenize", "signatures", "buckets", "dedup", "scatter", "gather", "pack"]
    _, signatures, buckets, dedup, scatter, _, _ = stages
    run, work = REPO / "run", str(REPO / "run/dedup-work")
    assert [t.args for t in signatures.tasks] == [
        ("dedup", str(run / "tokenized"), "--work", work, "--signatures", "--part", f"{i}/2", "--threads", "1",
         "--quiet") for i in range(2)]
    assert [t.out.name for t in signatures.tasks] == ["signatures-00000", "signatures-00001"]
    assert [t.args for t in buckets.tasks] == [
        ("dedup", "--work", work, "--buckets", "--part", f"{j}/3", "--threads", "1", "--quiet") for j in range(3)]
    assert buckets.tasks[2].out == run / "dedup-work/buckets-00002"
    assert signatures.merge is None and buckets.merge is None
    assert dedup.tasks[1].args == ("dedup", str(run / "tokenized"), str(run / "deduped/part-00001"), "--work", work,
                                   "--part", "1/2", "--threads", "1", "--quiet")
    assert dedup.merge.args == ("merge", str(run / "deduped/part-00000"), str(run / "deduped/part-00001"),
                                str(run / "deduped"), "--quiet")
    assert dedup.merge.stage == "merge-deduped"
    # The shuffle reads what prep dedup kept; without --near-dedup, what tokenize wrote.
    assert scatter.tasks[0].args[:3] == ("shuffle", str(run / "deduped"), str(run / "scatter"))
    plain = prep_ray.plan(dataclasses.replace(cfg, near_dedup=False))
    assert [s.name for s in plain] == ["tokenize", "scatter", "gather", "pack"]
    assert plain[1].tasks[0].args[:3] == ("shuffle", str(run / "tokenized"), str(run / "scatter"))
