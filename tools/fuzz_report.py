#!/usr/bin/env python3
"""The table of a fuzz campaign (`make fuzz-long`): for each target, how long
it ran, how many inputs it executed, the size of its kept corpus, and what
it found, read from libFuzzer's own output.

    python3 tools/fuzz_report.py LOG_DIR CORPUS_DIR TARGET...

LOG_DIR holds TARGET.log (libFuzzer's output, run with -print_final_stats=1)
and TARGET.rc (its exit status). Exits 1 when a target crashed or did not
finish, naming it and the input libFuzzer saved.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path


def summary(log: str) -> dict[str, object]:
    done = re.findall(r"Done (\d+) runs in (\d+) second", log)
    execs = re.findall(r"stat::number_of_executed_units:\s+(\d+)", log)
    new = re.findall(r"stat::new_units_added:\s+(\d+)", log)
    rss = re.findall(r"stat::peak_rss_mb:\s+(\d+)", log)
    cov = re.findall(r"\bcov: (\d+) ft: (\d+)", log)
    saved = re.findall(r"Test unit written to (\S+)", log)
    crash = re.findall(r"==\d+==\s*(ERROR: .*|WARNING: .*)|(panicked at .*)|(deadly signal)", log)
    return {
        "seconds": int(done[-1][1]) if done else None,
        "execs": int(execs[-1]) if execs else (int(done[-1][0]) if done else None),
        "new": int(new[-1]) if new else None,
        "rss": int(rss[-1]) if rss else None,
        "cov": f"{cov[-1][0]} / {cov[-1][1]}" if cov else "?",
        "saved": saved,
        "crash": ["".join(c).strip() for c in crash],
    }


def main() -> int:
    if len(sys.argv) < 4:
        print(__doc__, file=sys.stderr)
        return 2
    logs, corpora, targets = Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3:]
    failed = []
    print("| target | minutes | execs | execs/s | corpus (files) | cov / features | peak RSS MB | crashes |")
    print("|---|---|---|---|---|---|---|---|")
    for t in targets:
        log_path, rc_path = logs / f"{t}.log", logs / f"{t}.rc"
        if not log_path.is_file():
            print(f"| {t} | not run | | | | | | |")
            failed.append(f"{t}: no log at {log_path}")
            continue
        s = summary(log_path.read_text(errors="replace"))
        rc = int(rc_path.read_text().strip()) if rc_path.is_file() else None
        corpus = corpora / t
        files = sum(1 for p in corpus.iterdir() if p.is_file()) if corpus.is_dir() else 0
        crashes = len(s["saved"]) if (s["saved"] or rc) else 0
        if rc != 0 or s["saved"]:
            failed.append(f"{t}: exit {rc}; {'; '.join(s['crash'][:2]) or 'see ' + str(log_path)}; "
                          f"saved: {', '.join(s['saved']) or 'nothing'}")
            crashes = max(crashes, 1)
        secs, execs = s["seconds"], s["execs"]
        rate = (f"{execs / secs:,.0f}" if execs / secs >= 10 else f"{execs / secs:.1f}") if secs and execs else "?"
        print(f"| {t} | {secs / 60:.1f} | {execs:,} | {rate} | {files:,} | {s['cov']} | {s['rss']} | {crashes} |"
              if secs is not None and execs is not None else
              f"| {t} | ? | ? | ? | {files:,} | {s['cov']} | {s['rss']} | {crashes} |")
    for f in failed:
        print(f"FAILED {f}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
