"""tools/slurm on a real Slurm: sbatch, job arrays, afterok, --kill-on-invalid-dep, scancel, squeue.

The cluster is the one-node cluster tools/slurm/testcluster.sh starts on
127.0.0.1 (`make test-slurm` runs this file through it); it hands the tests
PREP_TEST_SLURM, a file with the SLURM_CONF of that cluster. Without it every
test here is skipped, saying why; test_slurm.py's fake-sbatch tests run
everywhere.

    PREP_BIN=$PWD/target/debug/prep tools/slurm/testcluster.sh run -- \\
        target/venv/bin/python -m pytest -q -rs tests/python/test_slurm_real.py
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import time
from pathlib import Path

import pytest

from test_slurm import (BUCKETS, GPT2, PARTS, PREP_BIN, SEED, SEQ_LEN, SLURM, STAGE_ORDER,  # noqa: F401
                        assert_same_dataset, corpus, records)

# Job states in which a job may still run.
ACTIVE = {"PENDING", "CONFIGURING", "RUNNING", "COMPLETING", "SUSPENDED", "REQUEUED", "REQUEUE_HOLD",
          "REQUEUE_FED", "RESIZING", "SIGNALING", "STAGE_OUT"}
# How long a run of the chain may take before a test gives up waiting and shows what Slurm says.
# Not a timed assertion: a run takes seconds, and the limit only keeps a stuck cluster from
# holding CI for the whole of its time.
PATIENCE_S = 300


@pytest.fixture(scope="module")
def slurm_env() -> dict[str, str]:
    """The environment for Slurm's commands on the test cluster."""
    env_file = os.environ.get("PREP_TEST_SLURM")
    if not env_file:
        reason = os.environ.get("PREP_TEST_SLURM_UNAVAILABLE")
        pytest.skip(f"no Slurm cluster: {reason}" if reason else
                    "no Slurm cluster: `make test-slurm` starts one (tools/slurm/testcluster.sh)")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "PREP_", "SACCT", "SQUEUE"))}
    for line in Path(env_file).read_text().splitlines():
        key, value = line.split("=", 1)
        env[key] = shlex.split(value)[0]
    proc = subprocess.run(["sinfo", "-h", "-o", "%T"], capture_output=True, text=True, env=env, check=False)
    assert proc.returncode == 0 and proc.stdout.strip(), f"the cluster does not answer: {proc.stderr}"
    return env


def slurm(env: dict[str, str], *args: str) -> str:
    proc = subprocess.run(list(args), capture_output=True, text=True, env=env, check=False)
    assert proc.returncode == 0, f"{' '.join(args)}: {proc.stderr}"
    return proc.stdout


def submit(env: dict[str, str], run: Path, prep_bin: Path, inputs: list[Path], *extra: str) -> dict[str, str]:
    """tools/slurm/submit.sh with the tests' settings, through the real sbatch: stage -> job id."""
    args = [str(SLURM / "submit.sh"), "--prep", str(prep_bin), "--tokenizer", str(GPT2)]
    args += [a for p in inputs for a in ("--input", str(p))]
    args += ["--run", str(run), "--parts", str(PARTS), "--buckets", str(BUCKETS), "--seed", str(SEED),
             "--seq-len", str(SEQ_LEN), *extra]
    out = slurm(env, *args)
    jobs = dict(line.split("=") for line in out.split())
    assert list(jobs) == STAGE_ORDER
    return jobs


def states(env: dict[str, str], jobs: dict[str, str]) -> list[tuple[str, str, str, str]]:
    """What squeue says of the jobs: (stage, job id with its array tasks, state, reason)."""
    stage_of = {job: stage for stage, job in jobs.items()}
    out = slurm(env, "squeue", "-h", "-t", "all", "-j", ",".join(jobs.values()), "-o", "%F|%i|%T|%r")
    return [(stage_of[f[0]], f[1], f[2], f[3]) for f in (line.split("|") for line in out.splitlines())]


def wait_until_ended(env: dict[str, str], jobs: dict[str, str], run: Path) -> list[tuple[str, str, str, str]]:
    """Waits until no job of the run can still run, and returns their states."""
    deadline = time.monotonic() + PATIENCE_S
    while True:
        now = states(env, jobs)
        if not any(state in ACTIVE for _, _, state, _ in now):
            return now
        if time.monotonic() > deadline:
            logs = "\n".join(f"--- {p.name}\n{p.read_text()}" for p in sorted((run / "logs").glob("*.out")))
            pytest.fail(f"the run's jobs did not end within {PATIENCE_S}s: {now}\n{logs}")
        time.sleep(0.5)


def status(env: dict[str, str], run: Path) -> tuple[str, dict]:
    """status.sh's table and its JSON, both read from the cluster's real state."""
    text = slurm(env, str(SLURM / "status.sh"), str(run))
    summary = json.loads(slurm(env, str(SLURM / "status.sh"), "--json", str(run)))
    return text, summary


def the_stand_in(path: Path, body: str) -> Path:
    """A prep binary for the tests: `body` (sh) first, then the real prep."""
    path.write_text(f"#!/bin/sh\n{body}\nexec {shlex.quote(str(PREP_BIN))} \"$@\"\n")
    path.chmod(0o755)
    return path


# --- tests -----------------------------------------------------------------

def test_real_slurm_run_equals_one_machine(tmp_path, slurm_env, corpus):
    inputs, single = corpus
    run = tmp_path / "run"
    jobs = submit(slurm_env, run, PREP_BIN, inputs, "--dedup")
    ended = wait_until_ended(slurm_env, jobs, run)
    assert {state for _, _, state, _ in ended} == {"COMPLETED"}, ended
    # Every array task ran as its own job, under its array's id.
    for stage, tasks in (("tokenize", PARTS), ("scatter", PARTS), ("gather", BUCKETS), ("pack", PARTS)):
        ran = sorted(job for s, job, _, _ in ended if s == stage)
        assert ran == sorted(f"{jobs[stage]}_{i}" for i in range(tasks)), stage

    assert_same_dataset(run / "packed", single / "packed")
    assert_same_dataset(run / "shuffled", single / "shuffled")
    assert_same_dataset(run / "tokenized", single / "tokenized")
    first = records(run, "tokenize", 1)
    assert len(first) == 1 and first[0]["ok"] and first[0]["job"] == f"{jobs['tokenize']}_1"

    text, summary = status(slurm_env, run)
    assert summary["status"] == "done" and summary["failures"] == []
    assert summary["slurm"]["source"] in ("squeue", "sacct")
    by_stage = {j["stage"]: j for j in summary["slurm"]["jobs"]}
    assert list(by_stage) == STAGE_ORDER
    assert all(j["state"] == "COMPLETED" and j["job"] == jobs[j["stage"]] for j in summary["slurm"]["jobs"])
    assert (by_stage["gather"]["count"], by_stage["merge-packed"]["count"]) == (BUCKETS, 1)
    assert json.loads((run / "run-summary.json").read_text())["output"] == summary["output"]
    assert text.splitlines()[-1].startswith("done")
    assert f"slurm: gather job {jobs['gather']}: COMPLETED (tasks " in text


def test_real_slurm_run_with_its_data_in_a_bucket_equals_one_machine(tmp_path, slurm_env, corpus):
    """submit.sh --data s3://...: the jobs, run by slurmd with the submitting
    environment's store settings, write every dataset to a moto server on
    127.0.0.1; RUN keeps only the run's own files."""
    pytest.importorskip("moto.server", reason="moto[server] not installed")
    from test_s3 import Server, store_env

    inputs, single = corpus
    server = Server()
    try:
        server.client().create_bucket(Bucket="runs")
        store = {k: v for k, v in store_env(server.url).items() if k.startswith(("AWS_", "PREP_"))}
        env = {**slurm_env, **store, "PREP_STAGING_DIR": str(tmp_path / "staging")}
        run = tmp_path / "run"
        jobs = submit(env, run, PREP_BIN, inputs, "--dedup", "--data", "s3://runs/d1")
        ended = wait_until_ended(env, jobs, run)
        assert {state for _, _, state, _ in ended} == {"COMPLETED"}, ended
        for name in ("tokenized", "shuffled", "packed"):
            fetched = tmp_path / "fetched" / name
            slurm(env, str(PREP_BIN), "fetch", f"s3://runs/d1/{name}", str(fetched))
            assert_same_dataset(fetched, single / name)
        assert not [p for p in ("tokenized", "scatter", "shuffled", "packed") if (run / p).exists()]
        _, summary = status(env, run)
        assert summary["status"] == "done"
        assert summary["output"]["dir"] == "s3://runs/d1/packed"
    finally:
        server.stop()


def test_real_slurm_scancel_of_one_task_then_resubmit_resumes(tmp_path, slurm_env, corpus):
    inputs, single = corpus
    run = tmp_path / "run"
    started, claim = tmp_path / "task-1-started", tmp_path / "task-1-claimed"
    # Tokenize task 1 is still running when it is cancelled: its first attempt waits (as a long
    # part would) until scancel ends it. Every other call, and its second attempt, is prep itself.
    prep_bin = the_stand_in(tmp_path / "slow-prep", f"""case " $* " in *" tokenize "*"--part 1/"*)
    if mkdir {shlex.quote(str(claim))} 2>/dev/null; then touch {shlex.quote(str(started))}; exec sleep 600; fi ;;
esac""")
    jobs = submit(slurm_env, run, prep_bin, inputs, "--dedup")
    deadline = time.monotonic() + PATIENCE_S
    while not started.exists():
        assert time.monotonic() < deadline, f"tokenize task 1 never started: {states(slurm_env, jobs)}"
        time.sleep(0.2)
    slurm(slurm_env, "scancel", f"{jobs['tokenize']}_1")
    ended = wait_until_ended(slurm_env, jobs, run)

    got = {(stage, state) for stage, _, state, _ in ended}
    assert ("tokenize", "CANCELLED") in got and ("tokenize", "COMPLETED") in got
    for stage in STAGE_ORDER[1:]:
        assert {(s, r) for s, _, st, r in ended if s == stage} == {(stage, "DependencyNeverSatisfied")}, ended
        assert {st for s, _, st, _ in ended if s == stage} == {"CANCELLED"}
    killed = records(run, "tokenize", 1)
    assert [(a["ok"], a["exit"]) for a in killed] == [(False, 143)]
    assert "SIGTERM" in killed[0]["error"]

    text, summary = status(slurm_env, run)
    assert summary["status"] == "failed"
    assert [(f["stage"], f["index"], f["exit"], f["job"]) for f in summary["failures"]] == \
        [("tokenize", 1, 143, f"{jobs['tokenize']}_1")]
    assert f"failed: tokenize task 1 (job {jobs['tokenize']}_1" in text and "SIGTERM" in text
    assert f"slurm: merge-tokenized job {jobs['merge-tokenized']}: CANCELLED, reason DependencyNeverSatisfied" \
        in text
    assert text.splitlines()[-1].startswith("failed")

    # The finished parts are left as they are by the second submission: a finished task does nothing.
    done = {p: p.stat().st_mtime_ns for i in (0, 2) for p in (run / "tokenized" / f"part-{i:05d}").iterdir()}
    again = submit(slurm_env, run, prep_bin, inputs, "--dedup")
    assert set(again.values()).isdisjoint(jobs.values())
    ended = wait_until_ended(slurm_env, again, run)
    assert {state for _, _, state, _ in ended} == {"COMPLETED"}, ended
    assert {p: p.stat().st_mtime_ns for p in done} == done

    assert_same_dataset(run / "packed", single / "packed")
    assert_same_dataset(run / "tokenized", single / "tokenized")
    assert [(a["ok"], a["exit"]) for a in records(run, "tokenize", 1)] == [(False, 143), (True, 0)]
    assert [a["ok"] for a in records(run, "tokenize", 0)] == [True, True]
    text, summary = status(slurm_env, run)
    assert summary["status"] == "done" and summary["failures"] == []
    tok = summary["stages"]["tokenize"]
    assert (tok["done"], tok["attempts"], tok["failed_attempts"]) == (PARTS, 2 * PARTS, 1)
    assert text.splitlines()[-1].startswith("done")


def test_real_slurm_bad_input_fails_its_task_and_cancels_the_rest(tmp_path, slurm_env, corpus):
    inputs, _ = corpus
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"text": "a good document"}\n{"text": unquoted}\n')
    run = tmp_path / "run"
    # The last file is read by the last part.
    jobs = submit(slurm_env, run, PREP_BIN, [*inputs, bad])
    ended = wait_until_ended(slurm_env, jobs, run)

    tokenize = {job: (state, reason) for stage, job, state, reason in ended if stage == "tokenize"}
    last = f"{jobs['tokenize']}_{PARTS - 1}"
    assert tokenize.pop(last) == ("FAILED", "NonZeroExitCode")
    assert set(tokenize.values()) == {("COMPLETED", "None")}
    for stage in STAGE_ORDER[1:]:
        assert {(st, r) for s, _, st, r in ended if s == stage} == {("CANCELLED", "DependencyNeverSatisfied")}
    assert not (run / "tokenized" / "manifest.json").exists()
    assert not (run / "tokenized" / f"part-{PARTS - 1:05d}" / "manifest.json").exists()

    text, summary = status(slurm_env, run)
    assert summary["status"] == "failed"
    [failure] = summary["failures"]
    assert (failure["stage"], failure["index"], failure["exit"], failure["job"]) == ("tokenize", PARTS - 1, 2, last)
    assert str(bad) in failure["error"] and "line 2" in failure["error"]
    log = run / "logs" / f"prep-tokenize-{last}.out"
    assert failure["error"] in log.read_text()
    assert f"failed: tokenize task {PARTS - 1} (job {last} on " in text
    assert failure["error"] in text and f"log: {log}" in text
    assert f"slurm: tokenize job {jobs['tokenize']}: FAILED (task {PARTS - 1}), reason NonZeroExitCode" in text
    for stage in STAGE_ORDER[1:]:
        assert f"slurm: {stage} job {jobs[stage]}: CANCELLED" in text
    assert text.splitlines()[-1].startswith("failed")
    assert summary["stages"]["pack"]["merge"] == {"out": str(run / "packed"), "done": False}
    by_state = {(j["stage"], j["state"]): j for j in summary["slurm"]["jobs"]}
    assert by_state[("scatter", "CANCELLED")]["count"] == PARTS
    assert by_state[("scatter", "CANCELLED")]["reason"] == "DependencyNeverSatisfied"
