#!/usr/bin/env python3
"""Run a prep pipeline as many tasks on a Ray cluster, for the dataset one machine makes.

    pip install -r tools/requirements-ray.txt
    python tools/prep_ray.py --prep /shared/bin/prep --tokenizer tok.json \\
        --input 'data/*.jsonl.zst' --run /shared/runs/r1 \\
        --parts 64 --buckets 64 --seed 1 --seq-len 2049 [--mode bestfit] [--window W] [--dedup] \\
        [--near-dedup] [--address auto] [--task-cpus 1] [--max-retries 3]

The pipeline is prep's partitioned run (`--part I/N`, `shuffle --scatter` and
`--gather`, `prep merge`), in the run directory RUN:

    tokenize  --part I/N  -> RUN/tokenized/part-IIIII     then prep merge -> RUN/tokenized
    shuffle --scatter I/N -> RUN/scatter/scatter-IIIII    (every scatter task, then)
    shuffle --gather J    -> RUN/shuffled/bucket-JJJJJ    then prep merge -> RUN/shuffled
    pack      --part I/N  -> RUN/packed/part-IIIII        then prep merge -> RUN/packed

With --near-dedup, near-duplicate documents are removed (prep dedup, MinHash)
between tokenize and shuffle, in three stages over the work directory
RUN/dedup-work, and scatter reads RUN/deduped instead of RUN/tokenized:

    dedup --signatures --part I/N -> RUN/dedup-work/signatures-IIIII
    dedup --buckets --part J/B    -> RUN/dedup-work/buckets-JJJJJ   (every signature task, then)
    dedup     --part I/N  -> RUN/deduped/part-IIIII       then prep merge -> RUN/deduped

RUN/packed equals `prep tokenize; [prep dedup;] prep shuffle --seed S; prep
pack` on one machine, record for record, and RUN/deduped/duplicates.jsonl
lists the documents removed, as one machine's `prep dedup` does. Each task is
a Ray task that runs the prep binary; a stage starts when the previous stage
(and its merge) is done. A task that fails (prep exits nonzero, or its
worker dies) is retried up to --max-retries times: a prep task that already
finished does nothing when run again, and an interrupted one resumes (a
scatter part starts over), so a retry is always safe. A task that still fails stops the
run with prep's error message; running the driver again on the same RUN goes
on from where it stopped.

Every node must see the prep binary and the tokenizer at the same paths.
The inputs and RUN are on a shared filesystem (relative paths are made
absolute here), or in object storage: with `--run s3://bucket/runs/r1` (or
gs://, az://) the tasks share nothing but the bucket. Every part, scatter
part and merged dataset is then written there by prep itself (each merge
names its parts' shards where they lie, copying nothing), and each node
needs no settings of its own: the store's variables of the driver's
environment (AWS_*, GOOGLE_*, AZURE_*, PREP_STORE_*) go with every task
(Ray's runtime_env). The attempt logs and run-summary.json, which are
the driver's, go to --log-dir (default ./prep-ray-NAME, NAME being RUN's
last part); a task logs its attempts there on the node that runs it, so
retries are counted exactly when that folder is shared or the cluster is
one machine.

As tasks finish, a line per task says how far its stage is
(`tokenize: 3/8 tasks done, 12.3M tokens written, 41.2s`, the tokens from
each finished part's manifest.json; a scatter or signature part counts its
documents instead, and a bucket part nothing). At the end
RUN/run-summary.json holds, per stage, the tasks, attempts and retries, wall
time, tokens and records, each merge's time and the total wall time; a table
of the same is printed.
Every attempt of every task is also logged, one JSON line at its start and
one at its end, in RUN/.tasks/ray-STAGE-IIIII.jsonl.

Exit status: 0 done; 2 a task failed after its retries, or a bad argument.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


SCHEMES = ("s3", "gs", "az", "azure", "http", "https")
# The environment variables prep's object storage reads: each cloud's own,
# and prep's settings of its requests, staging folder and locks.
STORE_ENV = ("AWS_", "GOOGLE_", "AZURE_", "PREP_STORE_", "PREP_STAGING_DIR", "PREP_LOCK_")


def is_url(s: str) -> bool:
    """Whether `s` is an object-storage address, as prep tells them from paths."""
    scheme, sep, _ = str(s).partition("://")
    return bool(sep) and scheme.lower() in SCHEMES


class Url(str):
    """An object-storage address, joined with `/` as a Path is."""

    def __truediv__(self, name: str) -> Url:
        return Url(f"{self.rstrip('/')}/{name}")

    @property
    def name(self) -> str:
        return self.rstrip("/").rsplit("/", 1)[-1]


@dataclass(frozen=True)
class Config:
    """One partitioned run: the prep binary, the inputs and every option that shapes the output."""

    prep: Path
    tokenizer: Path
    inputs: tuple[str, ...]
    run: Path | Url
    parts: int
    buckets: int
    seed: int
    seq_len: int
    mode: str | None = None
    window: int | None = None
    text_key: str | None = None
    dedup: bool = False
    near_dedup: bool = False
    threads: int | None = None
    # Where the driver keeps its attempt logs and run summary: RUN itself, or
    # a local folder when RUN is in object storage.
    logs: Path | None = None

    @property
    def local(self) -> Path:
        return self.logs if self.logs is not None else Path(self.run)


@dataclass(frozen=True)
class Task:
    """One prep command: task `index` of a stage, writing the dataset `out`."""

    stage: str
    index: int
    args: tuple[str, ...]
    out: Path | Url


@dataclass
class Stage:
    """The tasks of one stage and the merge that follows them (None for scatter, signatures, buckets)."""

    name: str
    tasks: list[Task]
    merge: Task | None


def _threads(cfg: Config) -> list[str]:
    return [] if cfg.threads is None else ["--threads", str(cfg.threads)]


def plan(cfg: Config) -> list[Stage]:
    """Every prep command of the run, stage by stage, in the order they must run.

    Pure: nothing is run or touched, so the commands can be checked without Ray.
    """
    run, n, b = cfg.run, cfg.parts, cfg.buckets

    def part(d: Path | Url, prefix: str, i: int) -> Path | Url:
        return d / f"{prefix}-{i:05d}"

    tok_dir, scatter_dir, shuf_dir, pack_dir = (run / "tokenized", run / "scatter",
                                                run / "shuffled", run / "packed")
    work_dir, dedup_dir = run / "dedup-work", run / "deduped"
    tokenize = []
    for i in range(n):
        args = ["tokenize", "--tokenizer", str(cfg.tokenizer)]
        for x in cfg.inputs:
            args += ["--input", x]
        args += ["--output", str(part(tok_dir, "part", i)), "--part", f"{i}/{n}"]
        if cfg.text_key is not None:
            args += ["--text-key", cfg.text_key]
        if cfg.dedup:
            args.append("--dedup")
        tokenize.append(Task("tokenize", i, (*args, *_threads(cfg), "--quiet"), part(tok_dir, "part", i)))
    # prep dedup's three stages: every signature part, then every bucket
    # part (each reads all the signature parts), then the dataset in parts.
    signatures = [
        Task("signatures", i, ("dedup", str(tok_dir), "--work", str(work_dir), "--signatures",
                               "--part", f"{i}/{n}", *_threads(cfg), "--quiet"),
             part(work_dir, "signatures", i))
        for i in range(n)
    ]
    buckets = [
        Task("buckets", j, ("dedup", "--work", str(work_dir), "--buckets", "--part", f"{j}/{b}",
                            *_threads(cfg), "--quiet"),
             part(work_dir, "buckets", j))
        for j in range(b)
    ]
    dedup = [
        Task("dedup", i, ("dedup", str(tok_dir), str(part(dedup_dir, "part", i)), "--work", str(work_dir),
                          "--part", f"{i}/{n}", *_threads(cfg), "--quiet"),
             part(dedup_dir, "part", i))
        for i in range(n)
    ]
    documents = dedup_dir if cfg.near_dedup else tok_dir
    scatter = [
        Task("scatter", i, ("shuffle", str(documents), str(scatter_dir), "--seed", str(cfg.seed),
                            "--scatter", "--part", f"{i}/{n}", "--buckets", str(b),
                            *_threads(cfg), "--quiet"),
             part(scatter_dir, "scatter", i))
        for i in range(n)
    ]
    gather = [
        Task("gather", j, ("shuffle", str(scatter_dir), str(part(shuf_dir, "bucket", j)),
                           "--gather", "--bucket", str(j), *_threads(cfg), "--quiet"),
             part(shuf_dir, "bucket", j))
        for j in range(b)
    ]
    mode = [] if cfg.mode is None else ["--mode", cfg.mode]
    if cfg.window is not None:
        mode += ["--window", str(cfg.window)]
    pack = [
        Task("pack", i, ("pack", str(shuf_dir), str(part(pack_dir, "part", i)), "--part", f"{i}/{n}",
                         "--seq-len", str(cfg.seq_len), *mode, *_threads(cfg), "--quiet"),
             part(pack_dir, "part", i))
        for i in range(n)
    ]

    def merge(tasks: list[Task], out: Path | Url) -> Task:
        # Parts named one by one, not by a glob: nothing else in the folder is taken.
        return Task(f"merge-{out.name}", 0, ("merge", *(str(t.out) for t in tasks), str(out), "--quiet"), out)

    near_dedup = [
        Stage("signatures", signatures, None),
        Stage("buckets", buckets, None),
        Stage("dedup", dedup, merge(dedup, dedup_dir)),
    ]
    return [
        Stage("tokenize", tokenize, merge(tokenize, tok_dir)),
        *(near_dedup if cfg.near_dedup else []),
        Stage("scatter", scatter, None),
        Stage("gather", gather, merge(gather, shuf_dir)),
        Stage("pack", pack, merge(pack, pack_dir)),
    ]


class PrepTaskFailed(RuntimeError):
    """prep exited nonzero; the message holds the command and prep's stderr."""


def read_counts(dataset: Path | Url, prep: str | None = None) -> tuple[int | None, int | None]:
    """(n_tokens, n_records) of a dataset's manifest.json, or Nones where there is none.

    A scatter part has no manifest but a scatter.json, and a signature part
    of prep dedup a signatures.json; each counts its documents (`end -
    start`) and not their tokens: (None, records). A bucket part counts
    neither. A dataset in object storage is read by `prep inspect --json`
    (the manifest and the indexes); a scatter or signature part there counts
    as (None, None).
    """
    if isinstance(dataset, Url):
        if prep is None:
            return None, None
        proc = subprocess.run([prep, "inspect", "--json", str(dataset)], capture_output=True, text=True,
                              check=False)
        try:
            manifest = json.loads(proc.stdout)["manifest"]
            return manifest.get("n_tokens"), manifest.get("n_records")
        except (ValueError, KeyError, TypeError):
            return None, None
    try:
        manifest = json.loads((dataset / "manifest.json").read_text())
        return manifest.get("n_tokens"), manifest.get("n_records")
    except (OSError, ValueError):
        pass
    for description in ("scatter.json", "signatures.json"):
        try:
            part = json.loads((dataset / description).read_text())
            return None, part["end"] - part["start"]
        except (OSError, ValueError, KeyError, TypeError):
            pass
    return None, None


def _log(path: Path, record: dict) -> None:
    # One short line per write in append mode: lines of concurrent attempts do not interleave.
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as f:
        f.write(json.dumps(record) + "\n")


def attempts_of(log: Path, run_id: str) -> int:
    """Attempts started of one task in the driver run `run_id`, from its log."""
    try:
        lines = log.read_text().splitlines()
    except OSError:
        return 0
    n = 0
    for line in lines:
        try:
            rec = json.loads(line)
        except ValueError:
            continue  # a line cut short by a worker killed mid-write
        n += rec.get("run_id") == run_id and rec.get("event") == "start"
    return n


def task_log(local: Path, task: Task) -> Path:
    """Where the attempts of a task are logged (`local`: Config.local)."""
    return local / ".tasks" / f"ray-{task.stage}-{task.index:05d}.jsonl"


def execute(prep: str, task: Task, local: str, run_id: str) -> dict:
    """Run one task's prep command here; raise PrepTaskFailed with prep's stderr if it fails.

    This is the body of the Ray task. Its attempts are logged to
    RUN/.tasks/ray-STAGE-IIIII.jsonl so the driver can count retries, worker
    deaths included (an attempt that starts and never ends).
    """
    log = task_log(Path(local), task)
    host = socket.gethostname()
    _log(log, {"run_id": run_id, "event": "start", "stage": task.stage, "index": task.index,
               "host": host, "pid": os.getpid(), "time": time.time()})
    t0 = time.monotonic()
    proc = subprocess.run([prep, *task.args], capture_output=True, text=True, check=False)
    seconds = time.monotonic() - t0
    if proc.returncode != 0:
        err = proc.stderr.strip() or proc.stdout.strip() or "(no output)"
        _log(log, {"run_id": run_id, "event": "failed", "stage": task.stage, "index": task.index,
                   "exit": proc.returncode, "seconds": seconds, "error": err[-2000:],
                   "time": time.time()})
        raise PrepTaskFailed(f"{task.stage} task {task.index}, attempt {attempts_of(log, run_id)}: "
                             f"prep exited with {proc.returncode}\n"
                             f"  command: {prep} {' '.join(task.args)}\n  {err}")
    tokens, records = read_counts(task.out, prep)
    _log(log, {"run_id": run_id, "event": "done", "stage": task.stage, "index": task.index,
               "seconds": seconds, "tokens": tokens, "records": records, "time": time.time()})
    return {"stage": task.stage, "index": task.index, "seconds": seconds, "tokens": tokens,
            "records": records, "host": host, "attempt": attempts_of(log, run_id)}


def human(n: float | None) -> str:
    """12345678 -> '12.3M'."""
    if n is None:
        return "?"
    for unit, scale in (("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if abs(n) >= scale:
            return f"{n / scale:.1f}{unit}"
    return str(int(n))


@dataclass
class StageReport:
    """What one stage did: filled as its tasks finish."""

    tasks: int
    done: int = 0
    attempts: int = 0
    retries: int = 0
    tokens: int = 0
    tokens_known: bool = True  # False for scatter and signature parts, which count documents only
    records: int = 0
    records_known: bool = True  # False for bucket parts, which count neither
    task_seconds: float = 0.0
    wall_seconds: float = 0.0
    merge: dict | None = None
    hosts: set = field(default_factory=set)

    def to_json(self) -> dict:
        return {"tasks": self.tasks, "done": self.done, "attempts": self.attempts,
                "retries": self.retries, "wall_seconds": round(self.wall_seconds, 3),
                "task_seconds": round(self.task_seconds, 3),
                "tokens": self.tokens if self.tokens_known else None,
                "records": self.records if self.records_known else None, "hosts": len(self.hosts),
                "merge": self.merge}


class RunFailed(RuntimeError):
    """A task failed after every retry; the message says which and why."""


class Driver:
    """Submits each stage's tasks to Ray, waits for them in order of completion, merges, reports."""

    def __init__(self, cfg: Config, *, task_cpus: float, max_retries: int,
                 out: Callable[[str], None] = print):
        import ray  # imported here so plan() and the helpers work without Ray

        self.ray = ray
        self.cfg = cfg
        self.max_retries = max_retries
        self.task_cpus = task_cpus
        self.out = out
        self.run_id = uuid.uuid4().hex
        self.reports: dict[str, StageReport] = {}
        # Ship this module's code with the task, so workers need not import it
        # (it is not installed on them; as a script it is __main__ anyway).
        if __name__ != "__main__":
            ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])
        self.remote = ray.remote(execute)
        # A run in object storage: the store's settings of this environment
        # go with every task, so that the workers need none of their own.
        forwarded = {k: v for k, v in os.environ.items() if k.startswith(STORE_ENV)}
        self.runtime_env = ({"runtime_env": {"env_vars": forwarded}}
                            if isinstance(cfg.run, Url) and forwarded else {})

    def submit(self, task: Task):
        return self.remote.options(
            name=f"prep-{task.stage}-{task.index}", num_cpus=self.task_cpus,
            max_retries=self.max_retries, retry_exceptions=True, **self.runtime_env,
        ).remote(str(self.cfg.prep), task, str(self.cfg.local), self.run_id)

    def result(self, ref) -> dict:
        try:
            return self.ray.get(ref)
        except self.ray.exceptions.RayTaskError as e:
            # The cause is prep's error, raised by execute on the last attempt.
            raise RunFailed(str(e.cause if isinstance(getattr(e, "cause", None), Exception) else e)) from None
        except self.ray.exceptions.RayError as e:  # a worker or node died on the last attempt
            raise RunFailed(f"{e} (after {self.max_retries + 1} attempts)") from None

    def run_stage(self, stage: Stage) -> StageReport:
        report = self.reports[stage.name] = StageReport(tasks=len(stage.tasks))
        t0 = time.monotonic()
        pending = [self.submit(t) for t in stage.tasks]
        try:
            while pending:
                ready, pending = self.ray.wait(pending, num_returns=1)
                for ref in ready:
                    r = self.result(ref)
                    report.done += 1
                    if r["tokens"] is None:
                        report.tokens_known = False
                    if r["records"] is None:
                        report.records_known = False
                    report.tokens += r["tokens"] or 0
                    report.records += r["records"] or 0
                    report.task_seconds += r["seconds"]
                    report.hosts.add(r["host"])
                    retried = f" (task {r['index']} took {r['attempt']} attempts)" if r["attempt"] > 1 else ""
                    if report.tokens_known:
                        written = f" {human(report.tokens)} tokens written,"
                    elif report.records_known:  # a signature part signs its documents, writes none
                        verb = "signed" if stage.name == "signatures" else "written"
                        written = f" {human(report.records)} documents {verb},"
                    else:
                        written = ""
                    self.out(f"{stage.name}: {report.done}/{report.tasks} tasks done,{written} "
                             f"{time.monotonic() - t0:.1f}s{retried}")
        finally:
            for ref in pending:  # only when a task failed for good: the stage stops
                self.ray.cancel(ref)
            report.wall_seconds = time.monotonic() - t0
            # From the logs, not the results: they also hold attempts whose worker died.
            attempts = [attempts_of(task_log(self.cfg.local, t), self.run_id) for t in stage.tasks]
            report.attempts = sum(attempts)
            report.retries = sum(max(a - 1, 0) for a in attempts)
        if stage.merge is not None:
            t1 = time.monotonic()
            r = self.result(self.submit(stage.merge))
            report.merge = {"out": str(stage.merge.out), "seconds": round(time.monotonic() - t1, 3),
                            "attempts": r["attempt"], "tokens": r["tokens"], "records": r["records"]}
            self.out(f"merge {stage.merge.out.name}: {human(r['tokens'])} tokens, "
                     f"{r['records']} records, {report.merge['seconds']:.1f}s")
        return report

    def run(self) -> dict:
        t0 = time.monotonic()
        error = None
        try:
            for stage in plan(self.cfg):
                self.run_stage(stage)
        except RunFailed as e:
            error = str(e)
        summary = self.summary(time.monotonic() - t0, error)
        write_json(self.cfg.local / "run-summary.json", summary)
        self.out(format_summary(summary))
        if error is not None:
            raise RunFailed(error)
        return summary

    def summary(self, wall: float, error: str | None) -> dict:
        tokens, records = read_counts(self.cfg.run / "packed", str(self.cfg.prep))
        cfg = self.cfg
        return {
            "engine": "ray",
            "status": "failed" if error else "done",
            "error": error,
            "run": str(cfg.run),
            "config": {"prep": str(cfg.prep), "tokenizer": str(cfg.tokenizer), "inputs": list(cfg.inputs),
                       "parts": cfg.parts, "buckets": cfg.buckets, "seed": cfg.seed,
                       "seq_len": cfg.seq_len, "mode": cfg.mode, "window": cfg.window, "text_key": cfg.text_key,
                       "dedup": cfg.dedup, "near_dedup": cfg.near_dedup, "threads": cfg.threads,
                       "max_retries": self.max_retries},
            "stages": {name: r.to_json() for name, r in self.reports.items()},
            "output": {"dir": str(cfg.run / "packed"), "tokens": tokens, "records": records},
            "wall_seconds": round(wall, 3),
        }


def write_json(path: Path, value: Any) -> None:
    """Write JSON atomically: a reader sees the old file or the new one, never half of one."""
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(value, indent=2) + "\n")
    tmp.replace(path)


def format_summary(s: dict) -> str:
    lines = [f"{'stage':<10} {'tasks':>7} {'retries':>7} {'wall s':>8} {'tokens':>8} {'records':>9} {'merge s':>8}"]
    for name, r in s["stages"].items():
        merge = f"{r['merge']['seconds']:.1f}" if r["merge"] else "-"
        records = "-" if r["records"] is None else r["records"]
        lines.append(f"{name:<10} {r['done']:>3}/{r['tasks']:<3} {r['retries']:>7} {r['wall_seconds']:>8.1f} "
                     f"{human(r['tokens']):>8} {records:>9} {merge:>8}")
    out = s["output"]
    lines.append(f"{s['status']} in {s['wall_seconds']:.1f}s: {out['dir']} holds "
                 f"{out['records'] if out['records'] is not None else '?'} records, {human(out['tokens'])} tokens")
    if s["error"]:
        lines.append(f"error: {s['error']}")
    return "\n".join(lines)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--prep", required=True, type=Path, help="the prep binary, at this path on every node")
    p.add_argument("--tokenizer", required=True, type=Path)
    p.add_argument("--input", required=True, action="append", dest="inputs",
                   help="a file, folder or glob, as prep tokenize takes it; repeat for more")
    p.add_argument("--run", required=True,
                   help="the run directory, on a shared filesystem, or an object-storage address (s3://...)")
    p.add_argument("--log-dir", type=Path,
                   help="with --run in object storage: the local folder of the attempt logs and "
                        "run-summary.json (default ./prep-ray-NAME)")
    p.add_argument("--parts", required=True, type=int,
                   help="tasks of tokenize, scatter and pack (and of dedup's signatures and output)")
    p.add_argument("--buckets", required=True, type=int,
                   help="shuffle buckets: tasks of gather (and of dedup --buckets)")
    p.add_argument("--seed", required=True, type=int, help="the shuffle seed")
    p.add_argument("--seq-len", required=True, type=int)
    p.add_argument("--mode", choices=("bestfit", "concat"))
    p.add_argument("--window", type=int,
                   help="bestfit documents per window: pack tasks split by windows, so a corpus needs at "
                        "least --parts windows for every pack task to have work (prep's default is 1,000,000)")
    p.add_argument("--text-key")
    p.add_argument("--dedup", action="store_true", help="tokenize --dedup: drop exact duplicates")
    p.add_argument("--near-dedup", action="store_true",
                   help="remove near-duplicate documents (prep dedup, MinHash) between tokenize and shuffle")
    p.add_argument("--address", default="local",
                   help="'local' starts a Ray instance on this machine (default); 'auto' joins the "
                        "running cluster; or a ray:// or host:port address")
    p.add_argument("--num-cpus", type=int, help="CPUs of the local Ray instance (--address local)")
    p.add_argument("--task-cpus", type=int, default=1,
                   help="CPUs Ray reserves per task, and prep's --threads (default 1)")
    p.add_argument("--max-retries", type=int, default=3, help="retries of a failed task (default 3)")
    args = p.parse_args(argv)
    for name in ("parts", "buckets", "seq_len", "task_cpus"):
        if getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be at least 1")
    if args.max_retries < 0:
        p.error("--max-retries must be at least 0")
    if not args.prep.is_file():
        p.error(f"--prep {args.prep}: no such file")
    return args


def config(args: argparse.Namespace) -> Config:
    remote = is_url(args.run)
    run = Url(args.run.rstrip("/")) if remote else Path(args.run).resolve()
    logs = None
    if remote:
        logs = (args.log_dir or Path(f"prep-ray-{run.name}")).resolve()
    elif args.log_dir is not None:
        raise SystemExit("prep_ray.py: --log-dir is for a --run in object storage; a local run logs in RUN")
    return Config(prep=args.prep.resolve(), tokenizer=args.tokenizer.resolve(),
                  inputs=tuple(x if is_url(x) else os.path.abspath(x) for x in args.inputs), run=run,
                  parts=args.parts, buckets=args.buckets, seed=args.seed, seq_len=args.seq_len,
                  mode=args.mode, window=args.window, text_key=args.text_key, dedup=args.dedup,
                  near_dedup=args.near_dedup, threads=args.task_cpus, logs=logs)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    cfg = config(args)
    import ray

    started_here = False
    if not ray.is_initialized():
        if args.address == "local":
            ray.init(num_cpus=args.num_cpus, include_dashboard=False)
        else:
            ray.init(address=args.address)
        started_here = True
    cfg.local.mkdir(parents=True, exist_ok=True)
    try:
        Driver(cfg, task_cpus=args.task_cpus, max_retries=args.max_retries).run()
    except RunFailed:
        return 2
    finally:
        if started_here:
            ray.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
