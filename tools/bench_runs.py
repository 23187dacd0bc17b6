"""What the stage benchmarks share: the synthetic datasets of two document
shapes, whole processes timed with their user and system time, and the
median of rounds beside `cp -r` + `sync` of the same dataset.

Each run is timed from its start to the end of its last process, and its
user and system time are those processes' own (os.wait4's rusage), so a
copy's `sync` counts in the copy's row. Rounds interleave the rows (each
row runs once a round), so that a machine that drifts tilts no ratio.
"""

from __future__ import annotations

import os
import shutil
import statistics
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import bench_validate

# The document shapes measured: ids of a Llama-3-sized vocabulary (uint32),
# about 1 GiB of tokens each, kept in the scratch folder between runs.
SHAPES = {
    # The held-out shape: about 200 tokens a document (100 to 300).
    "small": {"dtype": "uint32", "lengths": (100, 300)},
    # Long documents: about 20,000 tokens each (10,000 to 30,000).
    "large": {"dtype": "uint32", "lengths": (10_000, 30_000)},
}
LLAMA3_VOCAB, LLAMA3_EOS = 128_256, 128_001

# Seconds every run waits, after the output before it is deleted and
# synced, before it starts. On a virtual machine whose hypervisor takes
# back free memory (virtio-balloon free page reporting, as on the machines
# these figures come from), memory freed by the run before is handed back
# about 2 s after it is freed, and a run that starts sooner writes into
# some of it again at a lower cost than one that starts later: which rows
# did depended on how long they took to begin writing. After the wait,
# every run starts from the same state.
SETTLE_S = 3.0
SETTLE_HELP = (f"seconds each run waits after the output before it is deleted (default {SETTLE_S:g}): "
               "freed memory is handed back to the hypervisor meanwhile, so every run starts alike")


def shaped_dataset(scratch: Path, shape: str, gib: float) -> Path:
    """The synthetic dataset of `shape` (SHAPES), made once in scratch."""
    ds = scratch / f"docs-{shape}-{gib:g}GiB"
    spec = SHAPES[shape]
    bench_validate.make_dataset(ds, gib, dtype=spec["dtype"], lengths=spec["lengths"],
                                vocab=LLAMA3_VOCAB, eos=LLAMA3_EOS)
    return ds


def warm(ds: Path) -> None:
    """Reads every file of ds once, so that runs start from the page cache."""
    files = sorted(p for p in ds.iterdir() if p.is_file())
    subprocess.run(["cat", *map(str, files)], stdout=subprocess.DEVNULL, check=True)


@dataclass
class Run:
    wall: float
    user: float
    sys: float
    faults: int = 0  # minor page faults
    stderr: str = ""


def timed(*commands: list[object]) -> Run:
    """Runs the commands one after another; their wall time together and
    the user and system time of each process, summed."""
    user = sys_ = 0.0
    faults = 0
    err = ""
    start = time.perf_counter()
    for cmd in commands:
        with tempfile.TemporaryFile(mode="w+") as stderr:
            p = subprocess.Popen([str(c) for c in cmd], stdout=subprocess.DEVNULL, stderr=stderr)
            _, status, usage = os.wait4(p.pid, 0)
            p.returncode = os.waitstatus_to_exitcode(status)
            stderr.seek(0)
            err += stderr.read()
        if p.returncode != 0:
            raise SystemExit(f"{' '.join(map(str, cmd))} failed ({p.returncode}):\n{err}")
        user += usage.ru_utime
        sys_ += usage.ru_stime
        faults += usage.ru_minflt
    return Run(time.perf_counter() - start, user, sys_, faults, err)


def cp_r(ds: Path, out: Path, durable: bool) -> Run:
    """`cp -r` of the dataset's folder, and `sync` after it when durable."""
    cmds: list[list[object]] = [["cp", "-r", ds, out]]
    if durable:
        cmds.append(["sync"])
    return timed(*cmds)


@dataclass
class Row:
    what: str
    run: object  # () -> Run
    runs: list[Run] = field(default_factory=list)

    def summary(self) -> dict:
        walls = [r.wall for r in self.runs]
        return {"what": self.what, "median_s": round(statistics.median(walls), 3),
                "min_s": round(min(walls), 3), "max_s": round(max(walls), 3),
                "user_s": round(statistics.median(r.user for r in self.runs), 3),
                "sys_s": round(statistics.median(r.sys for r in self.runs), 3),
                "minor_faults": round(statistics.median(r.faults for r in self.runs)),
                "runs": len(walls)}


def rounds(rows: list[Row], out: Path, repeat: int, settle: float = SETTLE_S) -> None:
    """Runs every row `repeat` times, a round at a time; before each run the
    output is deleted and `sync` run, so that no run pays for another's
    writeback, and then `settle` seconds pass (see SETTLE_S)."""
    for _ in range(repeat):
        for row in rows:
            shutil.rmtree(out, ignore_errors=True)
            subprocess.run(["sync"], check=True)
            time.sleep(settle)
            row.runs.append(row.run())
    shutil.rmtree(out, ignore_errors=True)


def table(title: str, rows: list[Row], base: str) -> list[dict]:
    """Prints the rows' medians beside the row named `base`; returns them."""
    out = [r.summary() for r in rows]
    ref = next(r for r in out if r["what"] == base)["median_s"]
    print(f"\n{title}")
    print(f"  {'':44} {'median s':>9} {'min':>7} {'max':>7} {'user s':>7} {'sys s':>7} {'/ cp+sync':>10}")
    for r in out:
        r["over_base"] = round(r["median_s"] / ref, 2)
        print(f"  {r['what']:44} {r['median_s']:9.3f} {r['min_s']:7.3f} {r['max_s']:7.3f} "
              f"{r['user_s']:7.2f} {r['sys_s']:7.2f} {r['over_base']:10.2f}")
    return out
