#!/usr/bin/env python3
"""The tokenizer-engine benchmark: prep's fast and hf engines, Python `tokenizers` and GigaToken.

    make bench                                                       # with everything it needs
    target/venv/bin/python tools/bench_engines.py --prep target/release/prep \\
        --giga-python target/venv-giga/bin/python                    # whole corpus
    target/venv/bin/python tools/bench_engines.py --limit-mb 5 ...   # quick run on a prefix

For each tokenizer (by default every file in the corpora directory's tokenizers/ (tools/corpora.py),
of every family, then those DERIVED from them: GPT-2's vocabulary under
Qwen's split pattern; `--tokenizers byte-level` takes the files whose
pre-tokenizer has a ByteLevel step) and thread count T (1 and all cores, os.cpu_count())
it runs, one after the other, each as a child process:
  prep-fast   prep tokenize --engine fast --threads T --eos EOS;
  prep-hf     prep tokenize --engine hf --threads T --eos EOS (the HuggingFace
              tokenizers crate inside prep);
  tokenizers  tools/baseline_tokenize.py with RAYON_NUM_THREADS=T, as
              tools/bench_tokenize.py runs it (json.loads, encode_batch, eos
              appended, numpy writes a .bin);
  gigatoken   `Tokenizer(path).encode_files(JsonlFileSource([jsonl], field="text"))`
              from the `gigatoken` package (PyPI, Rust core), in its own venv
              (make target/venv-giga/.installed) with RAYON_NUM_THREADS=T: its
              Rust code runs on rayon's global pool, sized by that variable.
              encode_files reads the JSONL itself and returns an awkward Array
              (documents * var * uint32, in file order, no eos); this script's
              --gigatoken-child mode writes its ids and document lengths to
              files, so like the others it goes from JSONL to a token file.
All read the same decompressed JSONL and tokenizer.json from the scratch
folder (default target/bench), so none pays for zstd. prep's runs read the
tokenizer's compiled form (PREP_TOKENIZER_CACHE; make sets it under the target
directory), which the probe run before them writes: each file's JSON is read
once, as on a user's machine, and the timed runs pay only the compiled load
(tools/bench_load.py measures both). The others read the JSON every run, as
they always do. If the prep binary has
no --engine option yet, prep runs once per T without it, as prep-hf.

With --repeat N, the runs go in N rounds, each run once a round, so that a
machine whose speed drifts slows the runs of a round alike. Reported per run
(best wall time of the N, and the median): wall time; input MB/s
(JSONL bytes / s, MB = 10^6 bytes); tokens/s (the tokens the run wrote:
prep and tokenizers count one eos per document, gigatoken none); peak RSS of
the child (ru_maxrss from os.wait4; Linux counts the parent's own peak, this
script's, as its floor: about 50 MB, from decompressing the corpus, reported
as rss_floor_mb); CPU seconds
of the child (user + system, which shows how many cores it really used).
Then the speedups of prep-fast (and prep-hf) over the others at equal
threads and of T=all over T=1, and the id checks:
  - every prep run (both engines, all T) wrote identical shard files (.bin and
    .idx, byte for byte), and its manifest records the engine asked for;
  - the tokenizers baseline's .bin holds the bytes of prep's .bins;
  - gigatoken: documents equal, tokens + one eos per document equal prep's
    n_tokens, and its ids with the eos id put after each document equal
    prep's token stream, every token of every document.
The whole result goes to target/bench/engines.json (or --json).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import shutil
import statistics
import subprocess
import sys
import time
from importlib.metadata import version
from pathlib import Path

# Only the standard library is imported here: the --gigatoken-child mode runs
# in target/venv-giga, which has gigatoken (and numpy) but not zstandard nor
# tokenizers. The benchmark itself imports bench_tokenize's helpers in main().
#
# The benchmark process stays small (no numpy, no ids in memory): a child's
# ru_maxrss starts from the parent's peak RSS (subprocess execs from a vfork of
# the parent), so a large parent would inflate every later child's figure. The
# gigatoken id check therefore runs as a child too (--compare-child).

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tools"))
from corpora import corpora  # noqa: E402

CORPORA = corpora()
TOKENIZERS = ("gpt2", "deepseek-v3")
# End-of-document tokens of the byte-level files bench_tokenize.py does not name.
MORE_EOS = {
    "gpt-neox-20b": "<|endoftext|>",
    "falcon": "<|endoftext|>",
    "roberta-base": "</s>",
    "mistral-7b-v0.1": "</s>",
    "phi-3-mini": "<|endoftext|>",
    "t5-small": "</s>",
    "bert-base-uncased": "[SEP]",
    "gemma3": "<eos>",
    "qwen-pattern-on-gpt2": "<|endoftext|>",
}

# Qwen2, 2.5 and 3's split pattern: cl100k's with one number a piece.
QWEN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
        r"|\s*[\r\n]+|\s+(?!\S)|\s+")
# Tokenizers made from a real file by swapping one part, as NAME: (the file, the change).
# No Qwen tokenizer file is in the corpora; their pattern on GPT-2's vocabulary runs the
# same split and a vocabulary of the same family, with HF as the reference for ids.
DERIVED = {
    "qwen-pattern-on-gpt2": ("gpt2", lambda tok: {
        **tok,
        "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
            {"type": "Split", "pattern": {"Regex": QWEN}, "behavior": "Isolated", "invert": False},
            {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True,
             "use_regex": False}]},
    }),
}


def all_tokenizers(tokenizer_dir: Path) -> list[str]:
    """Names of every tokenizer file in tokenizer_dir, then those DERIVED from them."""
    names = [p.name.removesuffix(".tokenizer.json.zst")
             for p in sorted(tokenizer_dir.glob("*.tokenizer.json.zst"))]
    names = names or list(TOKENIZERS)
    return names + [n for n, (base, _) in DERIVED.items() if base in names]


def write_any_tokenizer(write_tokenizer, tokenizer_dir: Path, scratch: Path, name: str) -> Path:
    """A file of tokenizer_dir, or one DERIVED from it, as a tokenizer.json in scratch."""
    if name not in DERIVED:
        return write_tokenizer(tokenizer_dir, scratch, name)
    base, change = DERIVED[name]
    tok = change(json.loads(write_tokenizer(tokenizer_dir, scratch, base).read_text(encoding="utf-8")))
    path = scratch / f"{name}.tokenizer.json"
    path.write_text(json.dumps(tok, ensure_ascii=False), encoding="utf-8")
    return path


def byte_level_tokenizers(tokenizer_dir: Path) -> list[str]:
    """Names of the tokenizer files in tokenizer_dir whose pre-tokenizer has a ByteLevel step."""
    import zstandard

    def has_byte_level(pre) -> bool:
        return isinstance(pre, dict) and (
            pre.get("type") == "ByteLevel" or any(map(has_byte_level, pre.get("pretokenizers") or [])))

    names = []
    for path in sorted(tokenizer_dir.glob("*.tokenizer.json.zst")):
        with path.open("rb") as f:
            tok = json.loads(zstandard.ZstdDecompressor().stream_reader(f).read())
        if has_byte_level(tok.get("pre_tokenizer")):
            names.append(path.name.removesuffix(".tokenizer.json.zst"))
    return names or list(TOKENIZERS)
IMPLS = ("prep-fast", "prep-hf", "tokenizers", "gigatoken")
MB = 1e6


def gigatoken_child(argv: list[str]) -> int:
    """Runs in the gigatoken venv: encode_files on one JSONL, then write the result.

    Writes OUTPUT (the ids, uint32, back to back, no eos) and OUTPUT.lengths
    (tokens per document, int64) and prints one JSON object with counts and
    the time of each step. The thread count comes from RAYON_NUM_THREADS."""
    ap = argparse.ArgumentParser(prog="bench_engines.py --gigatoken-child")
    ap.add_argument("--tokenizer", type=Path, required=True)
    ap.add_argument("--input", type=Path, required=True)
    ap.add_argument("--output", type=Path, required=True)
    args = ap.parse_args(argv)

    t0 = time.perf_counter()
    import awkward as ak
    from gigatoken import JsonlFileSource, Tokenizer

    tok = Tokenizer(str(args.tokenizer))
    t1 = time.perf_counter()
    docs = tok.encode_files(JsonlFileSource([str(args.input)], field="text"))
    t2 = time.perf_counter()
    # docs is an awkward Array of type `documents * var * uint32`: one row of
    # ids per JSONL line, in file order. Flattened, it is one uint32 buffer.
    ids = ak.to_numpy(ak.flatten(docs))
    lengths = ak.to_numpy(ak.num(docs)).astype("<i8")
    ids.astype("<u4", copy=False).tofile(args.output)
    lengths.tofile(args.output.with_name(args.output.name + ".lengths"))
    t3 = time.perf_counter()
    print(json.dumps({"documents": len(lengths), "tokens": int(ids.size), "dtype": str(ids.dtype),
                      "load_s": round(t1 - t0, 3), "encode_files_s": round(t2 - t1, 3),
                      "write_s": round(t3 - t2, 3), "gigatoken": version("gigatoken"),
                      "rayon_num_threads": os.environ.get("RAYON_NUM_THREADS")}))
    return 0


def refusal(cmd: list[str], env: dict, log: Path, prep: Path, tokenizer: Path | None) -> str | None:
    """Why an engine will not take a tokenizer, or None when it does.

    For prep's fast engine, `prep tokenize --engine fast` on an empty input
    says it; for gigatoken, loading the tokenizer in its child does."""
    if tokenizer is not None:
        empty = log.with_suffix(".jsonl")
        empty.write_text('{"text": "probe"}\n')
        out = log.with_suffix(".out")
        shutil.rmtree(out, ignore_errors=True)
        r = subprocess.run([str(prep), "tokenize", "--engine", "fast", "--tokenizer", str(tokenizer),
                            "--input", str(empty), "--output", str(out), "--quiet"],
                           capture_output=True, text=True, env=env)
        shutil.rmtree(out, ignore_errors=True)
        empty.unlink()
    else:
        python, script = cmd[0], cmd[1]
        tok = cmd[cmd.index("--tokenizer") + 1]
        r = subprocess.run([python, "-c", "import sys; from gigatoken import Tokenizer; "
                            "Tokenizer(sys.argv[1])", tok], capture_output=True, text=True, env=env)
    if r.returncode == 0:
        return None
    lines = [line.strip() for line in (r.stderr or r.stdout).strip().splitlines() if line.strip()]
    # A Python exception's message is its "SomethingError: ..." line (gigatoken's
    # Rust errors are followed by their source location); a Rust panic's is the
    # line after "panicked at".
    for line in reversed(lines):
        if line.split(":", 1)[0].endswith("Error") and ":" in line:
            return line[:300]
    for i, line in enumerate(lines[:-1]):
        if "panicked at" in line:
            return lines[i + 1][:300]
    return lines[-1][:300] if lines else f"exit {r.returncode}"


def prep_has_engine(prep: Path) -> bool:
    """Whether this prep binary's tokenize takes --engine."""
    r = subprocess.run([str(prep), "tokenize", "--help"], capture_output=True, text=True)
    return "--engine" in r.stdout


def prep_shards(out: Path) -> tuple[dict, list[Path], list[Path]]:
    """A prep dataset's manifest and its shard files (.bin, .idx), in order."""
    manifest = json.loads((out / "manifest.json").read_text(encoding="utf-8"))
    return (manifest, [out / s["bin"] for s in manifest["shards"]],
            [out / s["idx"] for s in manifest["shards"]])


def compare_child(argv: list[str]) -> int:
    """Compares gigatoken's ids (no eos) with prep's token stream (eos after each document).

    Reads GIGA_BIN and GIGA_BIN.lengths (from --gigatoken-child) and the prep
    dataset PREP_DIR; prints the result as one JSON object."""
    ap = argparse.ArgumentParser(prog="bench_engines.py --compare-child")
    ap.add_argument("giga_bin", type=Path)
    ap.add_argument("prep_dir", type=Path)
    args = ap.parse_args(argv)

    import numpy as np

    giga_bin = args.giga_bin
    prep_manifest, prep_bins, _ = prep_shards(args.prep_dir)
    ids = np.fromfile(giga_bin, dtype="<u4")
    lengths = np.fromfile(giga_bin.with_name(giga_bin.name + ".lengths"), dtype="<i8")
    eos = prep_manifest["special_tokens"]["eos"]
    dtype = np.dtype("<u2") if prep_manifest["dtype"] == "uint16" else np.dtype("<u4")
    prep = np.concatenate([np.fromfile(p, dtype=dtype) for p in prep_bins]).astype("<u4")
    # gigatoken's stream as prep writes it: the eos id after each document.
    expected = np.insert(ids, np.cumsum(lengths), eos)
    result = {
        "documents": {"gigatoken": int(lengths.size), "prep": prep_manifest["n_records"]},
        "tokens": {"gigatoken": int(ids.size), "gigatoken_plus_eos": int(ids.size + lengths.size),
                   "prep": prep_manifest["n_tokens"]},
    }
    result["token_count"] = ("OK" if result["tokens"]["gigatoken_plus_eos"] == prep_manifest["n_tokens"]
                             and lengths.size == prep_manifest["n_records"] else "MISMATCH")
    n = min(expected.size, prep.size)
    diff = np.flatnonzero(expected[:n] != prep[:n])
    if expected.size == prep.size and diff.size == 0:
        result["ids_identical"] = True
    else:
        # Where the streams part: the document (in gigatoken's counting) of the first difference.
        first = int(diff[0]) if diff.size else n
        ends = np.cumsum(lengths + 1)
        result["ids_identical"] = False
        result["first_difference"] = {"token": first,
                                      "document": int(np.searchsorted(ends, first, side="right"))}
    print(json.dumps(result))
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--corpus", type=Path, default=CORPORA / "debian-docs.jsonl.zst")
    ap.add_argument("--tokenizer-dir", type=Path, default=CORPORA / "tokenizers",
                    help="folder of NAME.tokenizer.json.zst")
    ap.add_argument("--scratch", type=Path, default=REPO / "target" / "bench")
    ap.add_argument("--prep", type=Path, default=REPO / "target" / "release" / "prep")
    ap.add_argument("--python", default=sys.executable,
                    help="interpreter for the tokenizers baseline; needs tokenizers and numpy")
    ap.add_argument("--giga-python", type=Path,
                    default=REPO / "target" / "venv-giga" / "bin" / "python",
                    help="interpreter with gigatoken (make target/venv-giga/.installed)")
    ap.add_argument("--tokenizers", default=None,
                    help="comma-separated tokenizer names, or `byte-level` (default: every "
                         "file in --tokenizer-dir)")
    ap.add_argument("--threads", default=f"1,{os.cpu_count()}",
                    help="comma-separated thread counts (default: 1 and all cores)")
    ap.add_argument("--impls", default=",".join(IMPLS),
                    help=f"comma-separated, from {', '.join(IMPLS)}")
    ap.add_argument("--limit-mb", type=float, default=None,
                    help="bench on the first N MB of the JSONL (whole lines)")
    ap.add_argument("--repeat", type=int, default=1,
                    help="rounds of runs, each run once a round; the best wall time counts")
    ap.add_argument("--json", type=Path, default=None,
                    help="where the result goes (default: SCRATCH/engines.json)")
    args = ap.parse_args()

    sys.path.insert(0, str(REPO / "tools"))
    from bench_tokenize import (EOS, prepare_corpus, run_measured, same_bytes, tool_version,
                                write_tokenizer)

    EOS = {**EOS, **MORE_EOS}
    if args.tokenizers is None:
        args.tokenizers = ",".join(all_tokenizers(args.tokenizer_dir))
    elif args.tokenizers == "byte-level":
        args.tokenizers = ",".join(byte_level_tokenizers(args.tokenizer_dir))
    names = [n for n in args.tokenizers.split(",") if n]
    threads = list(dict.fromkeys(int(t) for t in args.threads.split(",") if t))
    impls = [i for i in args.impls.split(",") if i]
    for n in names:
        if n not in EOS:
            ap.error(f"unknown tokenizer {n!r}; known: {', '.join(EOS)}")
    for i in impls:
        if i not in IMPLS:
            ap.error(f"unknown implementation {i!r}; known: {', '.join(IMPLS)}")
    if args.repeat < 1:
        ap.error("--repeat must be at least 1")
    if not args.prep.is_file():
        ap.error(f"no prep binary at {args.prep}: run `cargo build --release` or pass --prep")
    if "gigatoken" in impls and not args.giga_python.is_file():
        ap.error(f"no interpreter at {args.giga_python}: run `make target/venv-giga/.installed` "
                 "or pass --giga-python (or leave gigatoken out of --impls)")

    notes = []
    has_engine = prep_has_engine(args.prep)
    if not has_engine and "prep-fast" in impls:
        note = (f"{args.prep} tokenize has no --engine option: prep runs without it, as "
                "prep-hf, and there is no prep-fast run")
        print(f"note: {note}")
        notes.append(note)
        impls.remove("prep-fast")
        if "prep-hf" not in impls:
            impls.insert(0, "prep-hf")

    scratch = args.scratch
    # The same file as bench_tokenize.py's, which make bench runs first.
    jsonl, corpus_bytes, n_docs, text_bytes = prepare_corpus(args.corpus, scratch, args.limit_mb)

    baseline = REPO / "tools" / "baseline_tokenize.py"
    runs = []
    refused = []  # (tokenizer, impl, the last line it printed)
    checks = {}
    giga_version = None
    for name in names:
        tok_json = write_any_tokenizer(write_tokenizer, args.tokenizer_dir, scratch, name)
        results = {}  # (impl, T) -> (run, output path)
        # Every (impl, T) this file runs, its refusals found first.
        jobs = []
        for impl in impls:
            for t in threads:
                env = dict(os.environ)
                env["RAYON_NUM_THREADS"] = str(t)
                if impl.startswith("prep"):
                    out = scratch / f"engines-{impl}-{name}-t{t}"
                    cmd = [str(args.prep), "tokenize", "--tokenizer", str(tok_json),
                           "--input", str(jsonl), "--output", str(out), "--eos", EOS[name],
                           "--threads", str(t), "--quiet"]
                    if has_engine:
                        cmd += ["--engine", impl.removeprefix("prep-")]
                elif impl == "tokenizers":
                    out = scratch / f"engines-tokenizers-{name}-t{t}.bin"
                    cmd = [args.python, str(baseline), "--tokenizer", str(tok_json),
                           "--input", str(jsonl), "--output", str(out), "--eos", EOS[name]]
                    env["TOKENIZERS_PARALLELISM"] = "true"
                else:
                    out = scratch / f"engines-gigatoken-{name}-t{t}.bin"
                    cmd = [str(args.giga_python), str(Path(__file__).resolve()), "--gigatoken-child",
                           "--tokenizer", str(tok_json), "--input", str(jsonl), "--output", str(out)]
                # An engine that refuses a file (prep's fast engine, gigatoken)
                # says why and exits non-zero: that is a finding, not a failure.
                if impl in ("prep-fast", "gigatoken"):
                    why = refusal(cmd, env, scratch / f"engines-{impl}-{name}-probe.log",
                                  args.prep, tok_json if impl == "prep-fast" else None)
                    if why is not None:
                        refused.append((name, impl, why))
                        print(f"  {name:12} {impl:10} refuses this file: {why}", flush=True)
                        break
                jobs.append((impl, t, cmd, env, out))
        # Round by round, each run once a round: a machine whose speed drifts
        # (a virtual machine's neighbours) slows every run of a round alike,
        # not all the repeats of one of them.
        walls = {(impl, t): [] for impl, t, *_ in jobs}
        best = {}
        for _ in range(args.repeat):
            for impl, t, cmd, env, out in jobs:
                # A previous run's prep output would be resumed, not rewritten.
                if out.is_dir():
                    shutil.rmtree(out)
                else:
                    out.unlink(missing_ok=True)
                # os.wait4 in run_measured reaps the child, so its CPU time
                # lands in RUSAGE_CHILDREN: the difference is this run's.
                before = resource.getrusage(resource.RUSAGE_CHILDREN)
                wall, rss, stdout = run_measured(cmd, env, scratch / f"engines-{impl}-{name}-t{t}.log")
                after = resource.getrusage(resource.RUSAGE_CHILDREN)
                cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
                walls[(impl, t)].append(wall)
                if (impl, t) not in best or wall < best[(impl, t)][0]:
                    best[(impl, t)] = (wall, rss, cpu, stdout)
        for impl, t, cmd, env, out in jobs:
            wall, rss, cpu, stdout = best[(impl, t)]
            run = {"tokenizer": name, "impl": impl, "threads": t}
            if impl.startswith("prep"):
                manifest, _, _ = prep_shards(out)
                tokens = manifest["n_tokens"]
                # What prep says it ran (absent from a prep without --engine).
                run["engine"] = manifest["provenance"]["options"].get("engine")
            else:
                summary = json.loads(stdout.strip().splitlines()[-1])
                tokens = summary["tokens"]
                if impl == "gigatoken":
                    giga_version = summary["gigatoken"]
                    run["steps_s"] = {k: summary[k] for k in ("load_s", "encode_files_s", "write_s")}
            run.update({"wall_s": round(wall, 3), "wall_median_s": round(statistics.median(walls[(impl, t)]), 3),
                        "input_mb_s": round(corpus_bytes / MB / wall, 3),
                        "tokens": tokens, "tokens_per_s": round(tokens / wall),
                        "peak_rss_mb": round(rss / MB, 1), "cpu_s": round(cpu, 2),
                        "repeat": args.repeat})
            runs.append(run)
            results[(impl, t)] = (run, out)
            print(f"  {name:12} {impl:10} T={t}  {wall:8.2f} s  {run['input_mb_s']:7.2f} MB/s  "
                  f"{tokens:,} tokens  cpu {cpu:.1f} s"
                  + (f"  median of {args.repeat} {run['wall_median_s']:.2f} s" if args.repeat > 1 else "")
                  + (f"  (in the child: load {run['steps_s']['load_s']:.2f} s, encode_files "
                     f"{run['steps_s']['encode_files_s']:.2f} s, write {run['steps_s']['write_s']:.2f} s)"
                     if "steps_s" in run else ""), flush=True)

        # The checks, against the first prep run of this tokenizer.
        check = {}
        prep_runs = [k for k in results if k[0].startswith("prep")]
        if prep_runs:
            ref_manifest, ref_bins, ref_idxs = prep_shards(results[prep_runs[0]][1])
            same = {}
            for key in prep_runs[1:]:
                _, bins, idxs = prep_shards(results[key][1])
                same[f"{key[0]} T={key[1]}"] = (
                    len(bins) == len(ref_bins)
                    and all(same_bytes([a], b) for a, b in zip(bins + idxs, ref_bins + ref_idxs)))
            check["prep_reference"] = f"{prep_runs[0][0]} T={prep_runs[0][1]}"
            check["prep_shards_identical"] = same
            check["prep_engines_recorded"] = {f"{k[0]} T={k[1]}": results[k][0]["engine"]
                                              for k in prep_runs}
            check["prep_tokens"] = ref_manifest["n_tokens"]
            if any(k[0] == "tokenizers" for k in results):
                check["tokenizers_bytes_identical"] = all(
                    same_bytes(ref_bins, results[k][1]) for k in results if k[0] == "tokenizers")
            giga = [k for k in results if k[0] == "gigatoken"]
            if giga:
                r = subprocess.run([sys.executable, str(Path(__file__).resolve()), "--compare-child",
                                    str(results[giga[0]][1]), str(results[prep_runs[0]][1])],
                                   capture_output=True, text=True)
                if r.returncode != 0:
                    sys.exit(f"error: the gigatoken id check failed:\n{r.stderr[-4000:]}")
                check["gigatoken"] = json.loads(r.stdout)
                # Every gigatoken run wrote the same ids as the first.
                check["gigatoken"]["runs_identical"] = all(
                    same_bytes([results[k][1]], results[giga[0]][1]) for k in giga[1:])
        checks[name] = check
        # Outputs are large; keep the scratch folder to the corpus and the logs.
        for (impl, t), (_, out) in results.items():
            if out.is_dir():
                shutil.rmtree(out, ignore_errors=True)
            else:
                out.unlink(missing_ok=True)
                out.with_name(out.name + ".lengths").unlink(missing_ok=True)

    # Speedups at equal threads (the other's wall time / prep's), and of all cores over 1.
    ratios = []
    for name in names:
        by = {(r["impl"], r["threads"]): r for r in runs if r["tokenizer"] == name}
        for t in threads:
            for mine in ("prep-fast", "prep-hf"):
                for other in IMPLS[IMPLS.index(mine) + 1:]:
                    if (mine, t) in by and (other, t) in by:
                        ratios.append({"tokenizer": name, "what": f"{mine}/{other} T={t}",
                                       "speedup": round(by[(other, t)]["wall_s"] / by[(mine, t)]["wall_s"], 2),
                                       "speedup_median": round(by[(other, t)]["wall_median_s"]
                                                               / by[(mine, t)]["wall_median_s"], 2)})
        if len(threads) > 1:
            lo, hi = min(threads), max(threads)
            for impl in impls:
                if (impl, lo) in by and (impl, hi) in by:
                    ratios.append({"tokenizer": name, "what": f"{impl} T={hi}/T={lo}",
                                   "speedup": round(by[(impl, lo)]["wall_s"] / by[(impl, hi)]["wall_s"], 2)})

    header = (f"{'tokenizer':12} {'impl':10} {'T':>2} {'wall s':>8} {'MB/s':>8} "
              f"{'Mtok/s':>7} {'RSS MB':>7} {'cpu s':>7}")
    print()
    print(header)
    print("-" * len(header))
    for r in runs:
        print(f"{r['tokenizer']:12} {r['impl']:10} {r['threads']:>2} {r['wall_s']:>8.2f} "
              f"{r['input_mb_s']:>8.2f} {r['tokens_per_s'] / 1e6:>7.3f} {r['peak_rss_mb']:>7.0f} "
              f"{r['cpu_s']:>7.1f}")
    floor = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 / MB
    print(f"(RSS of a child reads at least {floor:.0f} MB, this process's own peak)")
    # The speedups as a table: one row per (tokenizer, prep engine, T), one column per other.
    print()
    others = [i for i in IMPLS[1:] if i in impls]
    print(f"{'speedup of':24} {'T':>2} " + " ".join(f"{'over ' + o:>16}" for o in others))
    if args.repeat > 1:
        print(f"(best of {args.repeat} over best of {args.repeat}; in brackets, median over median)")
    speedup = {(r["tokenizer"], r["what"]): r for r in ratios}

    def cell(r):
        if r is None:
            return "-"
        if args.repeat > 1:
            return f"{r['speedup']:.2f}x ({r['speedup_median']:.2f}x)"
        return f"{r['speedup']:.2f}x"
    for name in names:
        for mine in ("prep-fast", "prep-hf"):
            for t in threads:
                cells = [speedup.get((name, f"{mine}/{o} T={t}")) for o in others]
                if any(c is not None for c in cells):
                    print(f"{name + ' ' + mine:24} {t:>2} "
                          + " ".join(f"{cell(c):>16}" for c in cells))
        scaling = [f"{r['what'].split()[0]} {r['speedup']:.2f}x" for r in ratios
                   if r["tokenizer"] == name and "/T=" in r["what"]]
        if scaling:
            print(f"{name:12} T={max(threads)} over T={min(threads)}: {', '.join(scaling)}")
    print()
    ok = True
    for name, c in checks.items():
        if "prep_reference" in c:
            bad = [k for k, v in c["prep_shards_identical"].items() if not v]
            ok &= not bad
            print(f"{name:12} prep shards identical to {c['prep_reference']}: "
                  + (f"NO for {', '.join(bad)}" if bad else
                     f"yes ({len(c['prep_shards_identical'])} other runs)")
                  + "; engines recorded: "
                  + ", ".join(f"{k} {v}" for k, v in c["prep_engines_recorded"].items()))
            for k, v in c["prep_engines_recorded"].items():
                # A run asked for an engine must have run it (a prep without --engine records none).
                if has_engine and v != k.split()[0].removeprefix("prep-"):
                    ok = False
                    print(f"{name:12} {k} recorded engine {v!r}")
        if "tokenizers_bytes_identical" in c:
            ok &= c["tokenizers_bytes_identical"]
            print(f"{name:12} tokenizers baseline bytes identical to prep: "
                  f"{'yes' if c['tokenizers_bytes_identical'] else 'NO'}")
        if "gigatoken" in c:
            g = c["gigatoken"]
            ok &= g["token_count"] == "OK" and g["ids_identical"] and g["runs_identical"]
            print(f"{name:12} gigatoken tokens {g['tokens']['gigatoken']:,} + {g['documents']['gigatoken']:,} "
                  f"eos = {g['tokens']['gigatoken_plus_eos']:,}, prep {g['tokens']['prep']:,}: "
                  f"{g['token_count']}; ids with eos equal prep's: "
                  + ("yes" if g["ids_identical"] else f"NO, first at {g['first_difference']}"))

    for name, impl, why in refused:
        print(f"{name:12} {impl} refuses the file: {why}")
        # prep's fast engine must run every file it is benchmarked on.
        ok &= impl != "prep-fast"

    report = {
        "refused": [{"tokenizer": n, "impl": i, "why": w} for n, i, w in refused],
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform(),
                    "python": platform.python_version(), "tokenizers": version("tokenizers"),
                    "gigatoken": giga_version, "prep": tool_version([str(args.prep), "--version"]),
                    "prep_has_engine": has_engine,
                    # This process's peak RSS: the least any child's peak RSS can read.
                    "rss_floor_mb": round(floor, 1)},
        "corpus": {"path": str(args.corpus), "limit_mb": args.limit_mb,
                   "jsonl_bytes": corpus_bytes, "text_bytes": text_bytes, "documents": n_docs},
        "notes": notes, "runs": runs, "ratios": ratios, "checks": checks,
    }
    out = args.json or scratch / "engines.json"
    out.write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
    print(f"\nwrote {out}")
    return 0 if ok else 1


if __name__ == "__main__":
    if sys.argv[1:2] == ["--gigatoken-child"]:
        sys.exit(gigatoken_child(sys.argv[2:]))
    if sys.argv[1:2] == ["--compare-child"]:
        sys.exit(compare_child(sys.argv[2:]))
    sys.exit(main())
