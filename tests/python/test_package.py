"""The pip package (pyproject.toml): what `pip install prep-llm` gives a user.

A fresh virtual environment made here installs the wheel that make test
built (PREP_WHEEL, with the dev profile; the release build is the same
code), and from there: the `prep` command runs from the venv's bin (a
console script running the command line compiled into prep._native) and
fails, with the same exit codes and messages, where the binary fails; Ctrl-C
stops it and a closed stdout ends it quietly, as they do the binary; `import
prep` works with the working directory outside the repository, and the
module reads what the command wrote exactly as the command shows it
(`prep inspect --record`, `prep sample`). The Python reader and the Rust
reader refuse the same corrupt fixtures, naming the same file; and the
package's reader file, copied alone as users may copy it, reads what the
package reads.

    make test-python    # builds and installs the wheel, then runs this
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import venv
from pathlib import Path

import pytest

import prep
from test_reference import CORPUS, FIXTURES, PREP_BIN, REPO

GPT2 = FIXTURES / "tokenizers" / "gpt2.tokenizer.json.zst"
VALIDATE = FIXTURES / "validate"
# What `prep validate` checks and neither reader does on open: checksums and
# chunk checksums (it reads every byte), the .sum files (the mapped readers do
# not read them; the streaming reader checks them as it fetches), every token
# against the vocabulary and the eos rule (it reads every token), and files
# the manifest does not list.
VALIDATE_ONLY = {"checksum", "chunk_checksum", "chunk_sums", "token_out_of_range", "missing_eos", "unlisted_file"}


def run(*args: object, cwd: Path | None = None) -> str:
    proc = subprocess.run([str(a) for a in args], capture_output=True, text=True, check=False, cwd=cwd)
    assert proc.returncode == 0, f"{' '.join(map(str, args))}: {proc.stderr}"
    return proc.stdout


@pytest.fixture(scope="module")
def fresh(tmp_path_factory) -> Path:
    """A new venv with only the built wheel installed (and numpy, its dependency)."""
    wheel = os.environ.get("PREP_WHEEL")
    if not wheel:
        pytest.skip("PREP_WHEEL is not set: make test-python builds the wheel and sets it")
    root = tmp_path_factory.mktemp("fresh") / "venv"
    venv.create(root, with_pip=True)
    run(root / "bin" / "python", "-m", "pip", "install", "--quiet", "--disable-pip-version-check", wheel)
    return root


@pytest.fixture(scope="module")
def packed(fresh, tmp_path_factory) -> Path:
    """A packed dataset written by the fresh venv's own `prep`."""
    out = tmp_path_factory.mktemp("data")
    bin_prep = fresh / "bin" / "prep"
    run(bin_prep, "tokenize", "--tokenizer", GPT2, "--input", CORPUS, "--output", out / "docs",
        "--shard-size", "256KiB", "--quiet")
    run(bin_prep, "pack", out / "docs", out / "packed", "--seq-len", "256", "--shard-size", "256KiB",
        "--quiet")
    return out / "packed"


def in_fresh(fresh: Path, code: str, *args: object) -> str:
    """Runs `code` with the fresh venv's python, from a directory outside the repository."""
    return run(fresh / "bin" / "python", "-c", code, *args, cwd=fresh.parent)


def cargo_version() -> str:
    return re.search(r'^version = "([^"]+)"', (REPO / "Cargo.toml").read_text(), re.M).group(1)


def test_the_command_runs_from_the_venvs_bin(fresh):
    out = run(fresh / "bin" / "prep", "--version")
    assert out.strip() == f"prep {cargo_version()}"


def test_import_prep_works_outside_the_repository(fresh):
    where = in_fresh(fresh, "import prep, sys; print(prep.__file__); print(prep.__version__)").split()
    assert Path(where[0]).is_relative_to(fresh), where
    assert not fresh.is_relative_to(REPO)
    assert where[1] == run(fresh / "bin" / "prep", "--version").split()[1]


def test_native_main_returns_the_commands_exit_status(fresh):
    """prep._native.main(argv) runs the command in this process and returns its status,
    call after call."""
    code = ("import json, sys\n"
            "from prep import _native\n"
            "statuses = [_native.main(argv) for argv in json.loads(sys.argv[1])]\n"
            "print('statuses', *statuses, _native.__version__)\n")
    argvs = [["prep", "--version"],
             ["prep", "validate", str(VALIDATE / "flipped_bin")],  # finds a problem
             ["prep", "inspect", str(fresh.parent / "no-such-dataset")],
             ["prep", "inspect", str(VALIDATE / "good")]]
    out = in_fresh(fresh, code, json.dumps(argvs))
    # The command writes to file descriptor 1 itself; Python's own line comes last.
    assert out.splitlines()[-1] == f"statuses 0 1 2 0 {cargo_version()}"


@pytest.mark.parametrize("args", [
    ["tokenize", "--input", "x.jsonl"],             # usage: clap's message and usage line
    ["inspect", "{tmp}/no-such-dataset"],           # input: prep's own error
    ["shuffle", "{tmp}/no-such-dataset", "{tmp}/out", "--seed", "1"],
    ["frobnicate"],                                 # no such subcommand
], ids=["usage", "input", "shuffle-input", "subcommand"])
def test_the_command_fails_as_the_binary_does(fresh, tmp_path, args):
    """Exit code 2 and, word for word, the binary's message: `prep` named as the binary names it."""
    args = [a.format(tmp=tmp_path) for a in args]
    installed = subprocess.run([str(fresh / "bin" / "prep"), *args], capture_output=True, text=True,
                               check=False, cwd=tmp_path)
    binary = subprocess.run([str(PREP_BIN), *args], capture_output=True, text=True, check=False,
                            cwd=tmp_path)
    assert (installed.returncode, installed.stdout, installed.stderr) == (2, "", binary.stderr)
    assert binary.returncode == 2 and binary.stderr


def test_validate_exits_1_as_the_binary_does(fresh):
    args = ["validate", str(VALIDATE / "flipped_bin")]
    installed = subprocess.run([str(fresh / "bin" / "prep"), *args], capture_output=True, text=True,
                               check=False)
    binary = subprocess.run([str(PREP_BIN), *args], capture_output=True, text=True, check=False)
    assert installed.returncode == binary.returncode == 1
    # The last line holds the time taken; the verdict and the problems are the same.
    assert installed.stdout.splitlines()[:-1] == binary.stdout.splitlines()[:-1]


def test_the_command_imports_neither_numpy_nor_torch(fresh):
    """The console script's imports: `prep --help` starts in tens of ms, not seconds."""
    code = "import sys, prep._cli; print(sorted(m for m in ('numpy', 'torch') if m in sys.modules))"
    assert in_fresh(fresh, code).strip() == "[]"


def test_ctrl_c_stops_a_running_command(fresh, tmp_path):
    """SIGINT ends a long `prep tokenize` within seconds, as it ends the binary: one
    line saying to re-run the command to resume, and exit status 130.

    Python's own SIGINT handler only sets a flag that the interpreter checks
    between bytecodes, and none run while the command does: without the
    command's own handler, the command would run on to its end."""
    inputs = tmp_path / "inputs"
    inputs.mkdir()
    # Hundreds of copies of the corpus: minutes of work, even for a release build.
    for i in range(400):
        (inputs / f"copy-{i:03}.jsonl.zst").symlink_to(CORPUS)
    for name, prog in [("installed", fresh / "bin" / "prep"), ("binary", PREP_BIN)]:
        out = tmp_path / name
        proc = subprocess.Popen([str(prog), "tokenize", "--tokenizer", str(GPT2), "--input",
                                 str(inputs), "--output", str(out), "--threads", "1", "--quiet"],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            # The output directory appears once the command has parsed its
            # flags and started the run; then it is at work.
            deadline = time.monotonic() + 60
            while not out.exists() and proc.poll() is None and time.monotonic() < deadline:
                time.sleep(0.05)
            time.sleep(0.5)
            assert proc.poll() is None, f"{name}: ended before the signal: {proc.communicate()}"
            proc.send_signal(signal.SIGINT)
            sent = time.monotonic()
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                pytest.fail(f"{name}: still running 10 s after SIGINT")
            assert time.monotonic() - sent < 5, name
            _, stderr = proc.communicate()
            assert proc.returncode == 130, (name, proc.returncode, stderr)
            assert stderr.strip() == "prep: interrupted: re-run the same command to resume", (name, stderr)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()


def test_a_closed_stdout_ends_the_command_quietly(fresh, packed):
    """`prep inspect | head`: a write to a closed pipe ends the command with status 0 and no
    message, as the binary (SIGPIPE stays ignored, as Rust's runtime leaves it for the binary)."""
    outcomes = {}
    for name, prog in [("installed", fresh / "bin" / "prep"), ("binary", PREP_BIN)]:
        # A pipe whose reading end is closed before the command starts: its first write fails.
        read, write = os.pipe()
        os.close(read)
        try:
            proc = subprocess.run([str(prog), "sample", str(packed), "--seed", "1"], stdout=write,
                                  stderr=subprocess.PIPE, text=True, check=False)
        finally:
            os.close(write)
        outcomes[name] = (proc.returncode, proc.stderr)
    assert outcomes == {"installed": (0, ""), "binary": (0, "")}


def test_records_equal_what_prep_inspect_shows(fresh, packed):
    n = int(in_fresh(fresh, "import prep, sys; print(len(prep.Dataset(sys.argv[1])))", packed))
    code = ("import json, prep, sys\n"
            "ds = prep.Dataset(sys.argv[1])\n"
            "for i in map(int, sys.argv[2:]):\n"
            "    s = ds.segments(i)\n"
            "    print(json.dumps({'ids': ds[i].tolist(), 'segments': [\n"
            "        {k: int(p[k]) for k in ('doc', 'doc_offset', 'start', 'length')} for p in s]}))\n")
    picks = sorted({0, 1, n // 2, n - 1})
    got = in_fresh(fresh, code, packed, *picks).splitlines()
    for i, line in zip(picks, got):
        shown = json.loads(run(fresh / "bin" / "prep", "inspect", packed, "--record", i, "--json"))["record"]
        mine = json.loads(line)
        assert shown["index"] == i and mine["ids"] == shown["ids"], f"record {i}"
        assert len(mine["segments"]) == len(shown["segments"]), f"record {i}"
        for a, b in zip(mine["segments"], shown["segments"]):
            assert {k: b[k] for k in a} == a, f"record {i}"


def test_the_sampler_equals_prep_sample(fresh, packed):
    n = int(in_fresh(fresh, "import prep, sys; print(len(prep.Dataset(sys.argv[1])))", packed))
    mine = in_fresh(fresh, "import prep, sys; print(*prep.Sampler(int(sys.argv[1]), seed=1, epoch=2, "
                           "rank=1, world_size=3), sep='\\n')", n).split()
    theirs = run(fresh / "bin" / "prep", "sample", packed, "--seed", 1, "--epoch", 2, "--rank", 1,
                 "--world-size", 3).split()
    assert mine == theirs and len(mine) == n // 3


def test_the_reader_copied_alone_reads_what_the_package_reads(fresh, packed, tmp_path):
    """Users who copy one file take python/prep/reader.py: beside a script, as
    prep_reader.py, it needs numpy alone and reads every row the package reads."""
    shutil.copy(REPO / "python" / "prep" / "reader.py", tmp_path / "prep_reader.py")
    script = ("import sys, hashlib; sys.modules['torch'] = None; sys.path.insert(0, sys.argv[2]); "
              "import {m}; ds = {m}.Dataset(sys.argv[1]); h = hashlib.sha256(); "
              "[h.update(ds[i].tobytes()) for i in range(len(ds))]; print(len(ds), h.hexdigest())")
    alone = in_fresh(fresh, script.format(m="prep_reader"), packed, tmp_path)
    package = in_fresh(fresh, script.format(m="prep"), packed, tmp_path)
    assert alone == package and alone.split()[0] != "0"


def test_the_tests_read_the_installed_package():
    """tests/python import `prep` from the venv's site-packages, built from this tree."""
    assert not Path(prep.__file__).is_relative_to(REPO / "python")
    assert "site-packages" in Path(prep.__file__).parts
    installed = Path(prep.__file__).with_name("reader.py").read_bytes()
    assert installed == (REPO / "python" / "prep" / "reader.py").read_bytes(), (
        "the installed package is older than python/prep: run make package")


def rust_reader_verdict(path: Path) -> tuple[bool, str | None]:
    """Whether prep's own reader opens the dataset (`prep inspect`), and the file it names."""
    proc = subprocess.run([str(PREP_BIN), "inspect", str(path)], capture_output=True, text=True,
                          check=False)
    if proc.returncode == 0:
        return True, None
    assert proc.returncode == 2, proc.stderr
    m = re.match(r"prep: error: (\S+?): ", proc.stderr)
    return False, Path(m.group(1)).name if m else None


def python_reader_verdict(path: Path) -> tuple[bool, str | None]:
    try:
        ds = prep.Dataset(path)
        for i in range(len(ds)):
            ds[i]
    except prep.FormatError as e:
        return False, Path(e.path).name
    return True, None


@pytest.mark.parametrize("name", sorted(p.name for p in VALIDATE.iterdir() if p.is_dir()))
def test_both_readers_give_the_same_verdict_on_every_validate_fixture(name):
    path = VALIDATE / name
    rust, python = rust_reader_verdict(path), python_reader_verdict(path)
    assert python == rust, f"{name}: the Rust reader says {rust}, the Python reader {python}"
    report = json.loads(subprocess.run([str(PREP_BIN), "validate", "--json", str(path)],
                                       capture_output=True, text=True, check=False).stdout)
    problems = {(p["kind"], p.get("file")) for p in report["problems"]}
    if python[0]:
        # The readers open it: whatever validate finds is one of its own checks.
        assert {kind for kind, _ in problems} <= VALIDATE_ONLY, f"{name}: {problems}"
    else:
        # The readers refuse it: validate does too, and names the file they name.
        assert not report["valid"] and python[1] in {f for _, f in problems}, f"{name}: {problems}"


def test_tokenizer_directory_is_read_not_is_a_directory(fresh, tmp_path):
    """--tokenizer given a save_pretrained folder read its tokenizer.json (it said "Is a directory")."""
    import zstandard

    folder = tmp_path / "gpt2"
    folder.mkdir()
    (folder / "tokenizer.json").write_bytes(zstandard.ZstdDecompressor().decompress(
        GPT2.read_bytes(), max_output_size=1 << 30))
    (folder / "config.json").write_text("{}")
    bin_prep = fresh / "bin" / "prep"
    for name, tokenizer in [("dir", folder), ("file", GPT2)]:
        run(bin_prep, "tokenize", "--tokenizer", tokenizer, "--input", CORPUS, "--output",
            tmp_path / name, "--quiet")
    manifests = [json.loads((tmp_path / n / "manifest.json").read_text()) for n in ("dir", "file")]
    assert manifests[0]["tokenizer"]["xxh3"] == manifests[1]["tokenizer"]["xxh3"]
    assert manifests[0]["n_tokens"] == manifests[1]["n_tokens"] > 0


def test_sizes_read_from_python_as_the_command_line_reads_them():
    """fixtures/sizes/cases.json is the table src/size.rs is tested against
    too: "1.5" and ".5GiB" mean the same from Python as on the command line."""
    from prep.streaming import parse_size

    cases = json.loads((FIXTURES / "sizes" / "cases.json").read_text(encoding="utf-8"))["cases"]
    assert len(cases) > 20
    for text, want in cases:
        if want is None:
            with pytest.raises(ValueError, match="size"):
                parse_size(text)
        else:
            assert parse_size(text) == want, text
    assert parse_size(4096) == 4096
    with pytest.raises(ValueError, match="negative"):
        parse_size(-1)


def test_the_public_names_are_one_list():
    """prep's names come from _NAMES and _SUBMODULES; the TYPE_CHECKING block
    that type checkers read names the same ones from the same modules, and
    each resolves (PackedDataset needs torch, which this venv has)."""
    import ast

    tree = ast.parse((REPO / "python" / "prep" / "__init__.py").read_text(encoding="utf-8"))
    block = next(node for node in tree.body
                 if isinstance(node, ast.If) and getattr(node.test, "id", None) == "TYPE_CHECKING")
    static = {}
    for node in block.body:
        assert isinstance(node, ast.ImportFrom), ast.dump(node)
        for alias in node.names:
            static[alias.name] = node.module or "."
    submodules = {name for name, module in static.items() if module == "."}
    names = {name: module for name, module in static.items() if module != "."}
    assert submodules == set(prep._SUBMODULES)
    assert names == prep._NAMES
    assert sorted(prep.__all__) == sorted([*prep._NAMES, *prep._SUBMODULES])
    for name in prep.__all__:
        assert getattr(prep, name) is not None, name
        assert name in dir(prep), name
