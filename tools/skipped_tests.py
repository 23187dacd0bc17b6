#!/usr/bin/env python3
"""The Rust tests a run skipped, with their reasons: every ignored test of
the workspace's test binaries, as `cargo test -- --list --ignored` names
them, and the reason its `#[ignore = "..."]` gives.

    python3 tools/skipped_tests.py [--require PREFIX]

With --require PREFIX (CI passes "needs PREP_EXTERNAL_DATA"), a skipped test
whose reason starts with PREFIX fails the run: CI must run every test whose
data it has. Exit 0 otherwise. Needs only the standard library.
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
SOURCES = [*REPO.glob("tests/**/*.rs"), *REPO.glob("src/**/*.rs"), *REPO.glob("crates/*/src/**/*.rs"),
           *REPO.glob("crates/*/tests/**/*.rs")]
IGNORE = re.compile(r'#\[ignore(?:\s*=\s*"((?:[^"\\]|\\.)*)")?\]')
CFG_IGNORE = re.compile(r'ignore\s*=\s*"((?:[^"\\]|\\.)*)"')


def reasons() -> dict[str, str]:
    """Each test function's name with the reason its ignore attribute gives."""
    found: dict[str, str] = {}
    for path in SOURCES:
        lines = path.read_text(encoding="utf-8").split("\n")
        for i, line in enumerate(lines):
            m = re.match(r"\s*(?:pub\s+)?fn\s+(\w+)\s*\(", line)
            if not m:
                continue
            # The attributes right above the function.
            j, attrs = i - 1, []
            while j >= 0 and (lines[j].strip().startswith(("#[", "///", "//", ")]", "not(", "ignore"))
                              or lines[j].strip().endswith(",")):
                attrs.append(lines[j])
                j -= 1
            text = " ".join(reversed(attrs))
            hit = IGNORE.search(text) or CFG_IGNORE.search(text)
            if hit:
                found.setdefault(m.group(1), hit.group(1) or "(no reason given)")
    return found


def by_hand_tests() -> list[str]:
    """The tests compiled only under cfg(prep_by_hand), as file::name."""
    found = []
    for path in SOURCES:
        lines = path.read_text(encoding="utf-8").split("\n")
        for i, line in enumerate(lines):
            if line.strip() == "#[cfg(prep_by_hand)]":
                for nxt in lines[i + 1:i + 4]:
                    m = re.match(r"\s*(?:pub\s+)?fn\s+(\w+)\s*\(", nxt)
                    if m:
                        found.append(f"{path.stem}::{m.group(1)}")
                        break
    return sorted(found)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--require", help="fail if a skipped test's reason starts with this")
    ap.add_argument("--cargo", default="cargo")
    args = ap.parse_args()
    out = subprocess.run([args.cargo, "test", "-q", "--workspace", "--tests", "--", "--list", "--ignored"],
                         cwd=REPO, capture_output=True, text=True, check=True).stdout
    names = sorted({line[: -len(": test")] for line in out.splitlines() if line.endswith(": test")})
    why = reasons()
    print(f"{len(names)} Rust test{'' if len(names) == 1 else 's'} skipped (ignored):")
    failed = []
    for name in names:
        reason = why.get(name.rsplit("::", 1)[-1], "(no reason found)")
        print(f"  {name}: {reason}")
        if args.require and reason.startswith(args.require):
            failed.append(name)
    by_hand = by_hand_tests()
    print(f"{len(by_hand)} Rust test{'' if len(by_hand) == 1 else 's'} not built by make test "
          f"(cfg(prep_by_hand): make test-by-hand runs them): {', '.join(by_hand)}")
    if failed:
        print(f"error: {len(failed)} skipped test(s) need data this run was given ({args.require}): "
              f"{', '.join(failed)}. Was the test build made before the variable was set?", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
