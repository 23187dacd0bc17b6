#!/usr/bin/env python3
"""The export/import benchmark: `prep export` and `prep import` beside a plain copy of the same bytes.

    cargo build --release
    target/venv/bin/python tools/bench_interop.py [--prep target/release/prep] [--dataset DIR]

The dataset defaults to target/bench/pack-debian-gpt2-x16 (16 copies of the
debian-docs corpus tokenized with GPT-2, about 1 GB of tokens, made by
tools/bench_pack.py; run `make bench-pack` first). For each format it times,
best of --repeat with the page cache warm and `sync` between runs: `cp` of
the dataset's .bin files followed by `sync` (prep syncs what it writes, so
that is the like-for-like copy); `prep export` of the dataset; `cp` + `sync`
of the exported files; `prep import` of them. Reports MB/s of token data and
each prep run's time over its copy's. Results also go to
target/bench/interop.json.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
FORMATS = {  # format: (export target inside the output folder, import input, import flags)
    "megatron": ("x", "x", []),
    "nanogpt": ("x.bin", "x.bin", ["--eos", "50256"]),
    "llmc": ("x", "x", ["--eos", "50256"]),
    "datatrove": ("x", "x", []),
}


def timed(cmd: list[str], repeat: int, before=None) -> float:
    best = float("inf")
    for _ in range(repeat):
        if before:
            before()
        subprocess.run(["sync"], check=True)
        t = time.perf_counter()
        subprocess.run(cmd, check=True, capture_output=True)
        best = min(best, time.perf_counter() - t)
    return best


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--prep", type=Path, default=REPO / "target" / "release" / "prep")
    ap.add_argument("--dataset", type=Path, default=REPO / "target" / "bench" / "pack-debian-gpt2-x16")
    ap.add_argument("--scratch", type=Path, default=REPO / "target" / "bench" / "interop")
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    if not (args.dataset / "manifest.json").is_file():
        raise SystemExit(f"{args.dataset}: no dataset; run `make bench-pack` first or pass --dataset")
    manifest = json.loads((args.dataset / "manifest.json").read_text())
    bins = [str(args.dataset / s["bin"]) for s in manifest["shards"]]
    data = sum(s["bin_bytes"] for s in manifest["shards"])
    subprocess.run(["cat", *bins], stdout=subprocess.DEVNULL, check=True)
    shutil.rmtree(args.scratch, ignore_errors=True)
    args.scratch.mkdir(parents=True)
    copy_dir = args.scratch / "copy"

    def reset(path: Path):
        return lambda: (shutil.rmtree(path, ignore_errors=True), path.mkdir(parents=True))

    cp = timed(["sh", "-c", f'cp {" ".join(bins)} {copy_dir} && sync'], args.repeat, reset(copy_dir))
    rows = []
    print(f"{args.dataset}: {manifest['n_records']:,} records, {data / 1e6:,.0f} MB of tokens; "
          f"cp + sync {cp:.2f}s ({data / cp / 1e6:,.0f} MB/s); best of {args.repeat}")
    print(f"  {'format':<10} {'export s':>9} {'MB/s':>7} {'/cp':>6} {'import s':>9} {'MB/s':>7} {'/cp':>6}")
    for fmt, (target, source, flags) in FORMATS.items():
        out = args.scratch / fmt
        export = timed([str(args.prep), "export", str(args.dataset), "--to", fmt, str(out / target), "-q"],
                       args.repeat, reset(out))
        files = sorted(p for p in out.rglob("*") if p.is_file())
        cp_files = timed(["sh", "-c", f'cp {" ".join(map(str, files))} {copy_dir} && sync'], args.repeat,
                         reset(copy_dir))
        back = args.scratch / f"{fmt}-back"
        imp = timed([str(args.prep), "import", fmt, str(out / source), str(back), "-q", *flags], args.repeat,
                    lambda: shutil.rmtree(back, ignore_errors=True))
        rows.append({"format": fmt, "export_s": export, "import_s": imp, "cp_s": cp, "cp_export_files_s": cp_files,
                     "export_over_cp": export / cp, "import_over_cp": imp / cp_files})
        print(f"  {fmt:<10} {export:>9.2f} {data / export / 1e6:>7,.0f} {export / cp:>6.2f} "
              f"{imp:>9.2f} {data / imp / 1e6:>7,.0f} {imp / cp_files:>6.2f}")
        shutil.rmtree(back, ignore_errors=True)
        shutil.rmtree(out, ignore_errors=True)
    shutil.rmtree(args.scratch, ignore_errors=True)
    result = {"dataset": str(args.dataset), "bytes": data, "cp_s": cp, "rows": rows}
    (REPO / "target" / "bench" / "interop.json").write_text(json.dumps(result, indent=2) + "\n")
    print("wrote target/bench/interop.json")


if __name__ == "__main__":
    main()
