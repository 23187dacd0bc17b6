"""`prep tokenize --chat` against transformers' apply_chat_template.

Every chat template of the chat corpus (fixtures/chat/corpus, and the
templates of Llama and Gemma from $PREP_EXTERNAL_DATA/chat: fixtures/README.md
says why those are not shipped), over every chat dataset of
fixtures/chat/corpus/data, through prep and through the
reference (tools/chat_reference.py, which states the rule): prep's records,
in order, are the ids of the rows the reference keeps, its loss masks are
the reference's masks, and the manifest counts the rows read, written and
skipped, and the bad ones by reason, as the reference does. Where the
reference finds every row bad (deepseek-v3: its generation prompt opens a
<think> block that the rendered replies do not have, so no reply can be
placed), prep writes no dataset and exits 2, naming the first row for the
reference's reason. Then the other --loss-mask policies, rows prep must
refuse (exit 2 naming the file and line, or skipped and counted with
--skip-bad), and the reader's `has_loss_mask` and `loss_mask(i)` on
datasets prep wrote.

The datasets: openai_sft.jsonl (a bare array of messages per line),
v1_sft_demo.jsonl (`messages` with content as lists of parts), and the JSON
arrays alpaca_en_demo.json (Alpaca), glaive_toolcall_en_demo.json (ShareGPT
with function_call/observation turns and `tools` as a string) and
dpo_en_demo.json (ShareGPT with `chosen`), each written here as JSONL, one
row a line, keys in order, and read by one prep run per template. All 128
rows of openai_sft and an even sample of SAMPLE rows (every k-th) of each of
the others keep the file under a minute on two cores (40 to 60 s measured,
with one pytest worker or two, as busy as the machine was);
PREP_CHAT_ROWS=all takes all 2,227 rows (about 2.5 minutes).

Each template runs with a tokenizer of its family where the corpus has one,
and otherwise with a real vocabulary plus the template's control tokens,
added with the `tokenizers` package and written here as tokenizer.json
(added: the special tokens of the config's added_tokens_decoder, and its
non-special ones as non-special added tokens, as the model's tokenizer has
them; with no config, the control tokens the template writes). --chat-template
names the config where the template came in one that holds it, else the
.jinja file, and bos_token/eos_token come from the config where it has them,
else as --chat-var:

| template           | --chat-template                                   | tokenizer                                     | bos / eos |
|--------------------|---------------------------------------------------|-----------------------------------------------|-----------|
| chatml-openhermes  | configs/chatml-openhermes.chat_template.json      | mistral-7b-v0.1 + <|im_start|> <|im_end|> (as OpenHermes-2.5 adds them) | <s> </s> (var) |
| deepseek-v3        | templates/deepseek-v3.jinja                       | deepseek-v3                                   | <｜begin▁of▁sentence｜> <｜end▁of▁sentence｜> (var) |
| gemma              | configs/gemma.tokenizer_config.json               | gemma3                                        | config: <bos> <eos> |
| llama2-chat        | configs/llama2-chat.chat_template.json            | mistral-7b-v0.1                               | <s> </s> (var) |
| llama3             | configs/llama3.tokenizer_config.json              | deepseek-v3 + the config's 256 special tokens | config |
| llama3-training    | templates/llama3-training.jinja                   | deepseek-v3 + the template's <|...|> tokens, bos, eos | <|begin_of_text|> <|eot_id|> (var, llama3's) |
| llama3.1           | templates/llama3.1.jinja                          | deepseek-v3 + the template's <|...|> tokens, bos, eos | <|begin_of_text|> <|eot_id|> (var, llama3's) |
| mistral-nemo-tools | templates/mistral-nemo-tools.jinja                | gpt2 + [INST] [/INST] [AVAILABLE_TOOLS] ... <s> </s> | <s> </s> (var) |
| mistral-v0.1       | configs/mistral-v0.1.chat_template.json           | mistral-7b-v0.1                               | <s> </s> (var) |
| phi3               | configs/phi3.tokenizer_config.json                | phi-3-mini                                    | config: <s> <|endoftext|> |
| phi4-mini          | configs/phi4-mini.tokenizer_config.json           | gpt2 + the config's added tokens              | config |
| qwen2.5            | configs/qwen2.5.tokenizer_config.json             | gpt2 + the config's added tokens              | config: eos <|im_end|>, no bos |
| smollm3            | templates/smollm3.jinja (its config has no template) | deepseek-v3 + the config's added tokens    | eos <|im_end|> (var, from the config) |
| tulu3              | templates/tulu3.jinja (its config has no template) | deepseek-v3 + <|system|> <|user|> <|assistant|>, bos, eos | <|begin_of_text|> <|end_of_text|> (var, from the config) |
| zephyr             | templates/zephyr.jinja                            | gpt2 + <|system|> <|user|> <|assistant|> <s> </s> | <s> </s> (var) |

Real tokenizers are fixtures/tokenizers/NAME.tokenizer.json.zst (gemma3's
from $PREP_EXTERNAL_DATA/tokenizers).
`strftime_now` reads 2026-01-01 on both sides (--chat-date 2026-01-01).

Skipped, saying why, when PREP_BIN is not set, and the Llama and Gemma cases
when PREP_EXTERNAL_DATA is not; transformers missing skips the file, but
fails it under PREP_REQUIRE_TORCH (make test sets it).

    PREP_BIN=target/debug/prep target/venv/bin/python -m pytest -q tests/python/test_chat.py
"""

from __future__ import annotations

import importlib.util
import io
import json
import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pytest
from tokenizers import AddedToken

REPO = Path(__file__).resolve().parents[2]
FIXTURES = REPO / "fixtures"
CHAT = FIXTURES / "chat" / "corpus"
EXTERNAL = Path(os.environ["PREP_EXTERNAL_DATA"]) if os.environ.get("PREP_EXTERNAL_DATA") else None
NEEDS_EXTERNAL = "needs PREP_EXTERNAL_DATA (the Llama and Gemma chat templates, gemma3's tokenizer)"


def chat_file(rel: str) -> Path:
    """A file of the chat corpus: fixtures/chat/corpus, else the part the
    repository does not ship, under $PREP_EXTERNAL_DATA/chat."""
    here = CHAT / rel
    if here.exists() or EXTERNAL is None:
        return here
    return EXTERNAL / "chat" / rel


def tokenizer_file(name: str) -> Path:
    """A real tokenizer: fixtures/tokenizers, else $PREP_EXTERNAL_DATA/tokenizers."""
    here = FIXTURES / "tokenizers" / f"{name}.tokenizer.json.zst"
    if here.exists() or EXTERNAL is None:
        return here
    return EXTERNAL / "tokenizers" / here.name

if not os.environ.get("PREP_BIN"):
    pytest.skip("PREP_BIN is not set: it names the prep binary these tests run "
                "(PREP_BIN=target/debug/prep)", allow_module_level=True)
PREP_BIN = Path(os.environ["PREP_BIN"])

if os.environ.get("PREP_REQUIRE_TORCH"):
    import transformers  # noqa: F401  (fails the file where it is missing)
else:
    pytest.importorskip("transformers", reason="transformers is not installed: pip install -r tools/requirements.txt")

sys.path.insert(0, str(REPO / "tools"))
import chat_reference as ref  # noqa: E402

# The reader of this checkout, not whichever prep the venv has installed:
# the one file training code copies, loaded as such.
_spec = importlib.util.spec_from_file_location("prep_reader", REPO / "python" / "prep" / "reader.py")
reader = importlib.util.module_from_spec(_spec)
sys.modules["prep_reader"] = reader
_spec.loader.exec_module(reader)

DATE = "2026-01-01"
SAMPLE = 60  # rows taken from each dataset but openai_sft (whole)
DATASETS = ("openai_sft.jsonl", "v1_sft_demo.jsonl", "alpaca_en_demo.json",
            "glaive_toolcall_en_demo.json", "dpo_en_demo.json")
GPT2 = FIXTURES / "tokenizers" / "gpt2.tokenizer.json.zst"



# --- The templates ------------------------------------------------------------------------------

@dataclass(frozen=True)
class Case:
    """A template, what prep gets as --chat-template, and the tokenizer to run it with."""

    name: str
    source: str  # a file of the chat corpus (chat_file)
    tokenizer: str  # a real tokenizer (tokenizer_file): the tokenizer, or the base vocabulary of a made one
    made: bool = False  # add control tokens to `tokenizer`
    config: str | None = None  # whose added tokens a made tokenizer gets (chat_file)
    variables: dict = field(default_factory=dict)  # given with --chat-var
    extra: tuple = ()  # control tokens a made tokenizer gets beside the template's <|...|> ones
    external: bool = False  # its template is read from PREP_EXTERNAL_DATA

    @property
    def path(self) -> Path:
        return chat_file(self.source)

    @property
    def template(self) -> str:
        return ref.template_text(self.path)

    def template_variables(self) -> dict:
        """bos_token/eos_token as the template sees them."""
        found = {}
        if self.source.endswith("tokenizer_config.json"):
            found = ref.config_variables(self.path)
        return {**found, **self.variables}


LLAMA3 = {"bos_token": "<|begin_of_text|>", "eos_token": "<|eot_id|>"}
SP = {"bos_token": "<s>", "eos_token": "</s>"}
CASES = [
    Case("chatml-openhermes", "configs/chatml-openhermes.chat_template.json", "mistral-7b-v0.1",
         made=True, variables=SP),
    Case("deepseek-v3", "templates/deepseek-v3.jinja", "deepseek-v3",
         variables={"bos_token": "<｜begin▁of▁sentence｜>", "eos_token": "<｜end▁of▁sentence｜>"}),
    Case("gemma", "configs/gemma.tokenizer_config.json", "gemma3", external=True),
    Case("llama2-chat", "configs/llama2-chat.chat_template.json", "mistral-7b-v0.1", variables=SP,
         external=True),
    Case("llama3", "configs/llama3.tokenizer_config.json", "deepseek-v3", made=True,
         config="configs/llama3.tokenizer_config.json", external=True),
    Case("llama3-training", "templates/llama3-training.jinja", "deepseek-v3", made=True,
         variables=LLAMA3, extra=("<|begin_of_text|>", "<|end_of_text|>"), external=True),
    Case("llama3.1", "templates/llama3.1.jinja", "deepseek-v3", made=True,
         variables=LLAMA3, extra=("<|begin_of_text|>", "<|end_of_text|>"), external=True),
    Case("mistral-nemo-tools", "templates/mistral-nemo-tools.jinja", "gpt2", made=True, variables=SP,
         extra=("[INST]", "[/INST]", "[AVAILABLE_TOOLS]", "[/AVAILABLE_TOOLS]", "[TOOL_CALLS]",
                "[TOOL_RESULTS]", "[/TOOL_RESULTS]", "<s>", "</s>")),
    Case("mistral-v0.1", "configs/mistral-v0.1.chat_template.json", "mistral-7b-v0.1", variables=SP),
    Case("phi3", "configs/phi3.tokenizer_config.json", "phi-3-mini"),
    Case("phi4-mini", "configs/phi4-mini.tokenizer_config.json", "gpt2", made=True,
         config="configs/phi4-mini.tokenizer_config.json"),
    Case("qwen2.5", "configs/qwen2.5.tokenizer_config.json", "gpt2", made=True,
         config="configs/qwen2.5.tokenizer_config.json"),
    Case("smollm3", "templates/smollm3.jinja", "deepseek-v3", made=True,
         config="configs/smollm3.tokenizer_config.json", variables={"eos_token": "<|im_end|>"}),
    Case("tulu3", "templates/tulu3.jinja", "deepseek-v3", made=True,
         variables={"bos_token": "<|begin_of_text|>", "eos_token": "<|end_of_text|>"},
         extra=("<|begin_of_text|>", "<|end_of_text|>")),
    Case("zephyr", "templates/zephyr.jinja", "gpt2", made=True, variables=SP, extra=("<s>", "</s>")),
]
# Each case as a test parameter: the Llama and Gemma ones skipped, with the
# reason, without PREP_EXTERNAL_DATA.
CASE_PARAMS = [pytest.param(c, id=c.name, marks=pytest.mark.skipif(c.external and EXTERNAL is None,
                                                                    reason=NEEDS_EXTERNAL))
               for c in CASES]


def test_the_corpus_has_every_template():
    """The fifteen templates of the corpus, those the repository ships under
    fixtures/chat/corpus and only those: a template dropped from fixtures
    would otherwise leave its cases skipped rather than run."""
    assert len(CASES) == 15
    shipped = {c.name for c in CASES if (CHAT / c.source).exists()}
    assert shipped == {c.name for c in CASES if not c.external}


def made_tokenizer(base: Path, out: Path, special: list[str], plain: list[str] = ()) -> Path:
    """`base` with `special` added as special tokens and `plain` as non-special
    added tokens (those it already has are left as they are), saved as `out`."""
    tok = ref.read_tokenizer(base)
    have = set(tok.get_vocab(with_added_tokens=True))
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in special if t not in have])
    tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in plain if t not in have])
    tok.save(str(out))
    return out


def case_tokenizer(case: Case, tmp: Path) -> Path:
    """The tokenizer file prep and the reference use for `case`."""
    base = tokenizer_file(case.tokenizer)
    if not case.made:
        return base
    special, plain = [], []
    if case.config:
        config = json.loads(chat_file(case.config).read_text(encoding="utf-8"))
        for _, token in sorted(config.get("added_tokens_decoder", {}).items(), key=lambda kv: int(kv[0])):
            (special if token.get("special") else plain).append(token["content"])
    else:
        special += sorted(set(re.findall(r"<\|[a-z_/]+\|>", case.template)))
    special += [t for t in case.extra if t not in special]
    for key in ("bos_token", "eos_token"):
        value = case.template_variables().get(key)
        if value and value not in special and value not in plain:
            special.append(value)
    directory = tmp / case.name
    directory.mkdir(parents=True, exist_ok=True)
    return made_tokenizer(base, directory / "tokenizer.json", special, plain)


# --- Running prep and reading what it wrote -----------------------------------------------------

def run_prep(tokenizer: Path, template: Path, rows: Path | list[Path], out: Path, variables: dict = (),
             *extra: str) -> subprocess.CompletedProcess:
    inputs = [rows] if isinstance(rows, Path) else rows
    args = [str(PREP_BIN), "tokenize", "--chat", "--tokenizer", str(tokenizer),
            "--chat-template", str(template), "--chat-date", DATE,
            "--input", *map(str, inputs), "--output", str(out), "--quiet", *extra]
    for key, value in dict(variables).items():
        args += ["--chat-var", f"{key}={value}"]
    return subprocess.run(args, capture_output=True, text=True)


def prep_ok(*args, **kw) -> subprocess.CompletedProcess:
    proc = run_prep(*args, **kw)
    assert proc.returncode == 0, f"prep tokenize --chat: exit {proc.returncode}\n{proc.stderr}"
    return proc


def records(out: Path) -> tuple[list[np.ndarray], list[np.ndarray], dict]:
    """prep's records and masks (empty when it wrote no record) and its manifest."""
    manifest = json.loads((out / "manifest.json").read_text())
    ds = reader.Dataset(out)
    if len(ds) == 0:
        return [], [], manifest
    assert ds.has_loss_mask, f"{out}: a chat dataset without loss masks"
    return [ds[i] for i in range(len(ds))], [ds.loss_mask(i) for i in range(len(ds))], manifest


def write_jsonl(path: Path, rows: list) -> Path:
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), encoding="utf-8")
    return path


def dataset_rows(name: str) -> list:
    """The rows of a corpus dataset, sampled as the module docstring says."""
    import zstandard

    data = zstandard.ZstdDecompressor().stream_reader(io.BytesIO((CHAT / "data" / f"{name}.zst").read_bytes()))
    text = data.read().decode("utf-8")
    if name.endswith(".jsonl"):
        rows = [json.loads(line) for line in text.split("\n") if line.strip()]
    else:
        rows = json.loads(text)
    if name == "openai_sft.jsonl" or os.environ.get("PREP_CHAT_ROWS") == "all" or len(rows) <= SAMPLE:
        return rows
    step = len(rows) / SAMPLE
    return [rows[int(k * step)] for k in range(SAMPLE)]


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> dict[str, tuple[list, Path]]:
    """Each dataset's rows and their JSONL file, the files named so that
    their sorted order (the order prep reads them in) is that of DATASETS."""
    tmp = tmp_path_factory.mktemp("rows")
    return {name: (rows := dataset_rows(name), write_jsonl(tmp / f"{k}-{Path(name).stem}.jsonl", rows))
            for k, name in enumerate(DATASETS)}


# --- Comparing with the reference ---------------------------------------------------------------

@dataclass
class Tally:
    """What the reference did with some rows."""

    rows: int = 0
    kept: int = 0
    skipped: int = 0  # no trainable token
    bad: dict = field(default_factory=dict)  # reason -> count
    trainable: int = 0  # tokens, in the kept rows

    def add(self, result: ref.Result) -> None:
        self.rows += 1
        if result.kept:
            self.trainable += int(result.mask.sum())
        if result.status == "bad":
            self.bad[result.reason] = self.bad.get(result.reason, 0) + 1
        else:
            setattr(self, result.status, getattr(self, result.status) + 1)

    def __str__(self) -> str:
        bad = ", ".join(f"{k} {v}" for k, v in sorted(self.bad.items())) or "none"
        return f"{self.rows} rows: {self.kept} kept, bad: {bad}; {self.skipped} without a trainable token"


PREP_SAYS = {"shape": "not a conversation", "template": "the chat template refused it",
             "render": "the chat template refused it", "unverifiable": "its loss mask cannot be verified"}
"""How prep words each reason of ref.REASONS when it names a bad row."""


def tally(results) -> Tally:
    t = Tally()
    for r in results:
        t.add(r)
    return t


def around(result: ref.Result, token: int, width: int = 60) -> str:
    """The rendered text around token `token`, for a report."""
    if not result.offsets:
        return ""
    s = result.offsets[min(token, len(result.offsets) - 1)][0]
    return repr(result.text[max(0, s - width):s]) + " >>> " + repr(result.text[s:s + width])


def compare(rows: list[tuple[str, ref.Result]], got_ids: list, got_masks: list) -> list[str]:
    """Differences between the kept rows of `rows` ((where, result), in
    input order) and prep's records, in words.

    Records are matched to rows in order; a record equal to a later kept row
    means prep left out the rows between, which are named, and the records
    after it are still compared with their own rows.
    """
    problems = []
    kept = [(where, r) for where, r in rows if r.kept]
    if len(kept) != len(got_ids):
        problems.append(f"the reference keeps {len(kept)} rows, prep wrote {len(got_ids)} records")
    at = {}
    for j, (_, r) in enumerate(kept):
        at.setdefault(tuple(r.ids), []).append(j)
    i = 0
    for k, (ids, mask) in enumerate(zip(got_ids, got_masks)):
        if len(problems) >= 12:
            problems.append("(and maybe more)")
            break
        ids = ids.tolist()
        later = [j for j in at.get(tuple(ids), []) if j >= i]
        if later and later[0] > i:
            left_out = [where for where, _ in kept[i:later[0]]]
            problems.append(f"prep wrote no record for {', '.join(left_out[:5])}"
                            f"{' ...' if len(left_out) > 5 else ''} ({len(left_out)} rows the reference keeps)")
            i = later[0]
        if i >= len(kept):
            problems.append(f"record {k}: prep wrote more records than the reference keeps")
            break
        where, r = kept[i]
        i += 1
        if ids != r.ids:
            t = next((j for j, (a, b) in enumerate(zip(ids, r.ids)) if a != b), min(len(ids), len(r.ids)))
            problems.append(f"{where} (record {k}): ids differ from token {t} (prep {ids[t:t + 5]}, "
                            f"reference {r.ids[t:t + 5]}; lengths {len(ids)}, {len(r.ids)}); "
                            f"text {around(r, t)}")
        elif not np.array_equal(mask, r.mask):
            t = int(np.flatnonzero(np.asarray(mask) != r.mask)[0])
            problems.append(f"{where} (record {k}): mask differs from token {t} "
                            f"(prep {mask[t:t + 8].tolist()}, reference {r.mask[t:t + 8].tolist()}); "
                            f"text {around(r, t)}")
    if i < len(kept) and len(problems) < 12:
        left_out = [where for where, _ in kept[i:]]
        problems.append(f"prep wrote no record for {', '.join(left_out[:5])}"
                        f"{' ...' if len(left_out) > 5 else ''} ({len(left_out)} rows the reference keeps)")
    return problems


def compare_counts(t: Tally, manifest: dict) -> list[str]:
    """The manifest's counts against the reference's: provenance.documents
    (every row read, the kept ones written, the bad ones skipped) and
    provenance.chat (the bad rows by reason, the rows without a trainable
    token, the trainable tokens)."""
    docs = manifest["provenance"]["documents"]
    want = {"read": t.rows, "written": t.kept, "skipped": sum(t.bad.values())}
    got = {k: docs.get(k) for k in want}
    problems = [] if got == want else [f"provenance.documents {got}, the reference {want} ({t})"]
    chat = manifest["provenance"].get("chat")
    if chat is None:
        return problems + ["provenance has no \"chat\""]
    want = {"malformed": t.bad.get("shape", 0),
            "refused": t.bad.get("template", 0) + t.bad.get("render", 0),
            "unverifiable": t.bad.get("unverifiable", 0), "no_trainable_token": t.skipped,
            "trainable_tokens": t.trainable}
    got = {k: chat.get(k) for k in want}
    return problems + ([] if got == want else [f"provenance.chat {got}, the reference {want}"])


# --- Every template over every dataset ----------------------------------------------------------

@pytest.mark.parametrize("case", CASE_PARAMS)
def test_template_over_every_dataset(case, corpus, tmp_path):
    """One prep run per template over the five datasets (read in order)."""
    tokenizer = case_tokenizer(case, tmp_path)
    reference = ref.Reference(case.template, tokenizer, case.template_variables())
    rows, report, problems = [], [], []
    for name in DATASETS:
        results = [reference.row(row) for row in corpus[name][0]]
        rows += [(f"{name} line {line}", r) for line, r in enumerate(results, 1)]
        report.append(f"{name}: {tally(results)}")
    for where, r in rows:
        if r.transformers_mask_differs:
            problems.append(f"{where}: transformers' assistant mask differs from the reference's "
                            f"at tokens {r.transformers_mask_differs[:8]}")
    out = tmp_path / "out"
    proc = run_prep(tokenizer, case.path, [corpus[n][1] for n in DATASETS], out,
                    case.variables, "--skip-bad")
    print(f"{case.name}:\n  " + "\n  ".join(report))
    total = tally(r for _, r in rows)
    if sum(total.bad.values()) == total.rows:
        # prep writes no dataset of bad rows only, even with --skip-bad; it
        # names the first, which must be bad for the reference's reason.
        first = f"{corpus[DATASETS[0]][1]}: line 1: {PREP_SAYS[rows[0][1].reason]}"
        assert proc.returncode == 2 and f"every one of the {total.rows} documents read was bad" \
            in proc.stderr and first in proc.stderr, \
            f"{case.name}: every row is bad ({total}; the first: {rows[0][1].message}), " \
            f"prep exit {proc.returncode}\n{proc.stderr}"
        return
    assert proc.returncode == 0, f"{case.name}: prep exit {proc.returncode}\n{proc.stderr}"
    got_ids, got_masks, manifest = records(out)
    problems += compare(rows, got_ids, got_masks)
    problems += compare_counts(total, manifest)
    # Every tokenizer here runs on the fast engine, which places the tokens
    # of every conversation whose tokens are its text byte for byte (all of
    # them for the byte-level files: no normalizer changes these texts) and
    # hands the others to HF tokenizers for their offsets.
    engine = manifest["provenance"]["options"]["engine"]
    by_hf = manifest["provenance"]["chat"].get("placed_by_hf")
    print(f"  engine {engine}, {by_hf} of {total.kept} conversations placed by HF offsets")
    if engine != "fast":
        problems.append(f"engine {engine}: expected the fast engine")
    if case.tokenizer in ("gpt2", "deepseek-v3") and by_hf != 0:
        problems.append(f"{by_hf} conversations placed by HF: expected none for a byte-level file")
    assert not problems, f"{case.name}:\n" + "\n".join(problems)


# --- Replies that begin with whitespace ---------------------------------------------------------

LEADS = (" ", "  ", "\n", "\n\n", "\t", " \n", "\n\t ")
"""What the replies of test_replies_beginning_with_whitespace begin with."""


def with_leading_whitespace(rows: list) -> list:
    """Each row once per LEADS, its assistant replies (string contents) beginning with that lead."""
    out = []
    for lead in LEADS:
        for row in rows:
            messages = row if isinstance(row, list) else row["messages"]
            messages = [dict(m, content=lead + m["content"])
                        if m.get("role") == "assistant" and isinstance(m.get("content"), str) else m
                        for m in messages]
            out.append(messages if isinstance(row, list) else {**row, "messages": messages})
    return out


WHITESPACE_ROWS = [
    [{"role": "system", "content": "Answer in one word."}, {"role": "user", "content": "Who wrote Jane Eyre?"},
     {"role": "assistant", "content": "Browne."}, {"role": "user", "content": "Her sister?"},
     {"role": "assistant", "content": "Emily."}],
    [{"role": "user", "content": "翻译：我需要帮助"}, {"role": "assistant", "content": "我需要帮助 means I need help."}],
    [{"role": "user", "content": "List two."}, {"role": "assistant", "content": "- one\n- two"},
     {"role": "user", "content": "And code?"}, {"role": "assistant", "content": "```py\nprint(1)\n```"}],
]


@pytest.mark.parametrize("case", CASE_PARAMS)
def test_replies_beginning_with_whitespace(case, corpus, tmp_path):
    """Replies that begin with spaces, newlines and tabs (issue 51), through
    every template: prep's ids and masks are the reference's, where a token
    that begins in the prompt is never trained even when its offsets reach
    into the reply (Phi-3's <|assistant|> takes the whitespace after it,
    rstrip); for a template with {% generation %} blocks, transformers' own
    assistant mask agrees but for such tokens."""
    tokenizer = case_tokenizer(case, tmp_path)
    reference = ref.Reference(case.template, tokenizer, case.template_variables())
    rows = with_leading_whitespace(WHITESPACE_ROWS + corpus["openai_sft.jsonl"][0][:5])
    results = [reference.row(row) for row in rows]
    where = [(f"line {line}", r) for line, r in enumerate(results, 1)]
    problems = [f"{w}: transformers' assistant mask differs from the reference's at tokens "
                f"{r.transformers_mask_differs[:8]}" for w, r in where if r.transformers_mask_differs]
    jsonl = write_jsonl(tmp_path / "rows.jsonl", rows)
    out = tmp_path / "out"
    proc = run_prep(tokenizer, case.path, jsonl, out, case.variables, "--skip-bad")
    total = tally(results)
    print(f"{case.name}: {total}")
    if sum(total.bad.values()) == total.rows:
        assert proc.returncode == 2 and f"{jsonl}: line 1: {PREP_SAYS[results[0].reason]}" in proc.stderr, \
            f"{case.name}: every row is bad ({results[0].message}), prep exit {proc.returncode}\n{proc.stderr}"
        return
    assert proc.returncode == 0, f"{case.name}: prep exit {proc.returncode}\n{proc.stderr}"
    got_ids, got_masks, manifest = records(out)
    problems += compare(where, got_ids, got_masks)
    problems += compare_counts(total, manifest)
    assert total.kept, f"{case.name}: no row kept ({total})"
    if case.name == "phi3":
        # The case: the header's offsets reach into the reply, and
        # the header is never trained; the reply's first token is.
        header = ref.read_tokenizer(tokenizer).token_to_id("<|assistant|>")
        headers = 0
        for ids, mask in zip(got_ids, got_masks):
            at = np.flatnonzero(ids == header)
            headers += len(at)
            problems += [f"a trained <|assistant|> in {ids.tolist()[:12]}..." for k in at if mask[k]]
            problems += [f"the reply after <|assistant|> untrained in {ids.tolist()[:12]}..."
                         for k in at if k + 1 < len(mask) and not mask[k + 1]]
        assert headers >= len(got_ids), "no <|assistant|> header seen"
    assert not problems, f"{case.name}:\n" + "\n".join(problems[:20])


# --- Loss mask policies -------------------------------------------------------------------------

@pytest.mark.parametrize("policy", ["last", "all"])
def test_loss_mask_policies(policy, corpus, tmp_path):
    """Multi-turn rows (dpo_en_demo) through qwen2.5: `last` trains the last
    reply only, `all` every token."""
    case = next(c for c in CASES if c.name == "qwen2.5")
    tokenizer = case_tokenizer(case, tmp_path)
    rows, jsonl = corpus["dpo_en_demo.json"]
    reference = ref.Reference(case.template, tokenizer, case.template_variables())
    results = [reference.row(row, policy) for row in rows]
    out = tmp_path / "out"
    prep_ok(tokenizer, case.path, jsonl, out, case.variables, "--skip-bad", "--loss-mask", policy)
    got_ids, got_masks, manifest = records(out)
    problems = compare([(f"line {line}", r) for line, r in enumerate(results, 1)], got_ids, got_masks)
    problems += compare_counts(tally(results), manifest)
    assert not problems, "\n".join(problems)
    # Against the default policy: `all` trains every token; `last` a part of
    # what `assistant` trains, and less of it where a row has several replies.
    several = 0
    for row, r in zip(rows, results):
        a = reference.row(row)
        if not r.kept or not a.kept:
            continue
        assert r.ids == a.ids
        if policy == "all":
            assert r.mask.all()
        else:
            assert r.mask.any() and (r.mask <= a.mask).all()
            if sum(m["role"] == "assistant" for m in ref.conversation(row)[0]) > 1:
                several += 1
                assert r.mask.sum() < a.mask.sum()
    assert policy == "all" or several, "no row with more than one reply"


# --- Rows prep must refuse ----------------------------------------------------------------------

GOOD = [
    [{"role": "user", "content": "What is two and two?"}, {"role": "assistant", "content": "Four."}],
    {"messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"},
                  {"role": "assistant", "content": "Hello."}]},
    {"instruction": "Name a colour.", "input": "", "output": "Blue."},
]

# (what, template file in fixtures/chat, bad row, reason)
BAD = [
    ("no messages", "chatml.jinja", {"messages": []}, "shape"),
    ("an unknown role", "chatml.jinja",
     [{"role": "narrator", "content": "Once"}, {"role": "assistant", "content": "upon"}], "shape"),
    ("a template that raises", "alternating.jinja",
     [{"role": "user", "content": "a"}, {"role": "user", "content": "b"},
      {"role": "assistant", "content": "c"}], "template"),
    ("an unverifiable mask", "drops-earlier-thinking.jinja",
     [{"role": "user", "content": "2+2?"}, {"role": "assistant", "content": "<think>sum</think>4"},
      {"role": "user", "content": "3+3?"}, {"role": "assistant", "content": "6"}], "unverifiable"),
]
CONTROL = ["<|im_start|>", "<|im_end|>", "<|user|>", "<|assistant|>", "<|system|>", "<|end|>"]


@pytest.fixture(scope="module")
def small_tokenizer(tmp_path_factory) -> Path:
    """gpt2 of fixtures/tokenizers with the fixture templates' control tokens."""
    return made_tokenizer(GPT2, tmp_path_factory.mktemp("tok") / "tokenizer.json", CONTROL)


@pytest.mark.parametrize("what, template, row, reason", BAD, ids=[b[0] for b in BAD])
def test_bad_rows(what, template, row, reason, small_tokenizer, tmp_path):
    template = FIXTURES / "chat" / template
    reference = ref.Reference(template.read_text(), small_tokenizer, {"eos_token": "<|endoftext|>"})
    assert all(reference.row(r).kept for r in GOOD), "a good row is not kept"
    result = reference.row(row)
    assert (result.status, result.reason) == ("bad", reason), result.message

    rows = write_jsonl(tmp_path / "rows.jsonl", GOOD[:2] + [row] + GOOD[2:])
    proc = run_prep(small_tokenizer, template, rows, tmp_path / "refused", {"eos_token": "<|endoftext|>"})
    assert proc.returncode == 2, f"{what}: exit {proc.returncode}\n{proc.stderr}"
    assert f"{rows}: line 3: {PREP_SAYS[reason]}" in proc.stderr, proc.stderr

    out = tmp_path / "skipped"
    prep_ok(small_tokenizer, template, rows, out, {"eos_token": "<|endoftext|>"}, "--skip-bad")
    got_ids, got_masks, manifest = records(out)
    assert [ids.tolist() for ids in got_ids] == [reference.row(r).ids for r in GOOD]
    assert [m.tolist() for m in got_masks] == [reference.row(r).mask.tolist() for r in GOOD]
    assert not compare_counts(tally(reference.row(r) for r in GOOD[:2] + [row] + GOOD[2:]), manifest)


def test_a_row_without_a_trainable_token_is_skipped_not_bad(small_tokenizer, tmp_path):
    template = FIXTURES / "chat" / "chatml.jinja"
    lonely = [{"role": "system", "content": "Nobody answers."}, {"role": "user", "content": "Hello?"}]
    reference = ref.Reference(template.read_text(), small_tokenizer, {})
    assert reference.row(lonely).status == "skipped"
    rows = write_jsonl(tmp_path / "rows.jsonl", [GOOD[0], lonely, GOOD[1]])
    out = tmp_path / "out"
    prep_ok(small_tokenizer, template, rows, out)
    got_ids, _, manifest = records(out)
    assert [ids.tolist() for ids in got_ids] == [reference.row(r).ids for r in (GOOD[0], GOOD[1])]
    assert not compare_counts(tally(reference.row(r) for r in (GOOD[0], lonely, GOOD[1])), manifest)


# --- The reader's loss masks --------------------------------------------------------------------

@pytest.fixture(scope="module")
def chat_dataset(small_tokenizer, tmp_path_factory) -> tuple[Path, list[ref.Result]]:
    """A chat dataset of several shards, and the reference's result for each row."""
    tmp = tmp_path_factory.mktemp("chat")
    rows = [[{"role": "user", "content": f"Question {i}: " + "why? " * (i % 9)},
             {"role": "assistant", "content": f"Answer {i}. " + "Because. " * (i % 13)}]
            for i in range(300)]
    template = FIXTURES / "chat" / "chatml.jinja"
    out = tmp / "ds"
    prep_ok(small_tokenizer, template, write_jsonl(tmp / "rows.jsonl", rows), out, {}, "--shard-size", "4KiB")
    reference = ref.Reference(template.read_text(), small_tokenizer, {})
    return out, [reference.row(r) for r in rows]


def test_loss_mask_reads_every_record_across_shards(chat_dataset):
    out, results = chat_dataset
    ds = reader.Dataset(out)
    assert ds.has_loss_mask and ds.manifest["version"] == 2
    assert len(ds.manifest["shards"]) > 1, "expected several shards"
    assert len(ds) == len(results)
    for i, r in enumerate(results):
        mask = ds.loss_mask(i)
        assert mask.dtype == np.uint8 and len(mask) == len(ds[i])
        assert ds[i].tolist() == r.ids and mask.tolist() == r.mask.tolist(), f"record {i}"
    assert ds.loss_mask(-1).tolist() == results[-1].mask.tolist()
    with pytest.raises(IndexError):
        ds.loss_mask(len(ds))


def test_loss_mask_is_a_read_only_view(chat_dataset):
    ds = reader.Dataset(chat_dataset[0])
    mask = ds.loss_mask(0)
    assert not mask.flags.writeable and not mask.flags.owndata
    with pytest.raises(ValueError):
        mask[0] = 1


def test_a_dataset_without_masks_says_so(tmp_path):
    out = tmp_path / "plain"
    proc = subprocess.run([str(PREP_BIN), "tokenize", "--tokenizer", str(GPT2), "--input",
                           str(FIXTURES / "corpus" / "debian-sample.jsonl.zst"), "--output", str(out),
                           "--quiet"], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    ds = reader.Dataset(out)
    assert ds.manifest["version"] == 1 and not ds.has_loss_mask
    with pytest.raises(ValueError, match="no loss masks"):
        ds.loss_mask(0)


def _copy(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst)
    return dst


def _edit(root: Path, fn) -> None:
    m = json.loads((root / "manifest.json").read_text())
    fn(m)
    (root / "manifest.json").write_text(json.dumps(m))


def test_a_version_2_shard_without_its_mask_is_refused(chat_dataset, tmp_path):
    root = _copy(chat_dataset[0], tmp_path / "ds")
    _edit(root, lambda m: m["shards"][1].pop("mask"))
    with pytest.raises(reader.FormatError, match=r'shard 1 lists no "mask"') as e:
        reader.Dataset(root)
    assert e.value.path == root / "manifest.json"


def test_a_mask_of_the_wrong_size_is_refused(chat_dataset, tmp_path):
    root = _copy(chat_dataset[0], tmp_path / "ds")
    name = json.loads((root / "manifest.json").read_text())["shards"][0]["mask"]
    (root / name).write_bytes((root / name).read_bytes()[:-1])
    with pytest.raises(reader.FormatError, match="one byte per token") as e:
        reader.Dataset(root)
    assert e.value.path == root / name


def test_a_newer_version_is_refused(chat_dataset, tmp_path):
    root = _copy(chat_dataset[0], tmp_path / "ds")
    _edit(root, lambda m: m.update(version=3))
    with pytest.raises(reader.UnsupportedVersion, match=r"format version 3, but this reader reads version 2"):
        reader.Dataset(root)


# --- Packed chat rows for fine-tuning: labels ------------------------------------------------------

_spec = importlib.util.spec_from_file_location("prep_attention", REPO / "python" / "prep" / "attention.py")
attention = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(attention)


@pytest.mark.parametrize("mode", ["bestfit", "concat"])
def test_packed_labels_follow_each_documents_mask(chat_dataset, tmp_path, mode):
    """PackedDataset(labels=True): every label is the next token of its own
    document where that token's mask is 1, else -100, computed here from the
    documents alone; positions and cu_seqlens are prep.attention's."""
    torch = pytest.importorskip("torch")
    docs, results = chat_dataset
    packed = tmp_path / "packed"
    seq_len = 65
    proc = subprocess.run([str(PREP_BIN), "pack", str(docs), str(packed), "--seq-len", str(seq_len),
                           "--mode", mode, "--pad", "0", "--no-sep", "--quiet"],
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    # The package's (it reads in the order prep's extension module computes),
    # over this checkout's reader's Dataset.
    import prep

    data = prep.PackedDataset(packed, seed=3, labels=True)
    ds = data.dataset
    assert ds.has_loss_mask
    seen = 0
    for i in range(len(ds)):
        ex = data.example(i)
        pieces = ds.segments(i)
        want = np.full(seq_len - 1, -100, dtype=np.int64)
        for p in pieces:
            ids, mask = results[int(p["doc"])].ids, results[int(p["doc"])].mask
            for k in range(1, int(p["length"])):
                at = int(p["start"]) + k - 1  # position whose target is the piece's token k
                if at < seq_len - 1 and mask[int(p["doc_offset"]) + k]:
                    want[at] = ids[int(p["doc_offset"]) + k]
        assert ex["labels"].tolist() == want.tolist(), f"row {i}"
        assert ex["input_ids"].tolist() == ds[i][:-1].tolist()
        assert ex["position_ids"].tolist() == attention.position_ids(pieces, seq_len - 1).tolist()
        cu, max_len = attention.cu_seqlens(pieces, seq_len - 1)
        assert ex["cu_seqlens"].tolist() == cu.tolist() and ex["max_seqlen"] == max_len
        assert ex["labels"].dtype == torch.int64
        seen += int((ex["labels"] != -100).sum())
    assert seen > 0
    # Through the iterator too: the readers' order, dicts of tensors.
    first = next(iter(data))
    assert set(first) == {"input_ids", "labels", "position_ids", "cu_seqlens", "max_seqlen"}


# --- Export to OLMo-core's fine-tuning files ----------------------------------------------------

sys.path.insert(0, str(REPO / "tools"))
import interop_read  # noqa: E402


def test_olmo_core_export_keeps_tokens_masks_and_boundaries(chat_dataset, tmp_path):
    docs, results = chat_dataset
    out = tmp_path / "olmo"
    proc = subprocess.run([str(PREP_BIN), "export", "--to", "olmo-core", "--quiet", str(docs), str(out)],
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    vocab = json.loads((docs / "manifest.json").read_text())["vocab_size"]
    ids, masks, bounds = interop_read.read_olmo_core(out, vocab)
    assert len(ids) == 1 and masks is not None
    assert ids[0].tolist() == [t for r in results for t in r.ids]
    assert masks[0].astype(np.uint8).tolist() == [m for r in results for m in r.mask.tolist()]
    lengths = [len(r.ids) for r in results]
    ends = np.cumsum(lengths)
    assert bounds[0] == [(int(e - n), int(e)) for e, n in zip(ends, lengths) if n], "one line per document"
    # An existing export is not overwritten.
    again = subprocess.run([str(PREP_BIN), "export", "--to", "olmo-core", "--quiet", str(docs), str(out)],
                           capture_output=True, text=True)
    assert again.returncode == 2 and "exists" in again.stderr, again.stderr


# --- Conversations from Parquet and Arrow ----------------------------------------------------------

@pytest.mark.parametrize("name", ["v1_sft_demo.jsonl", "alpaca_en_demo.json", "glaive_toolcall_en_demo.json"])
def test_parquet_and_arrow_rows_read_as_their_jsonl(name, small_tokenizer, tmp_path):
    """A conversation row of Parquet or Arrow (a datasets save_to_disk folder)
    gives the ids and mask of the same row in JSONL."""
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    datasets = pytest.importorskip("datasets")
    rows = dataset_rows(name)[:40]
    template = FIXTURES / "chat" / "chatml.jinja"
    outs = {}
    jsonl = write_jsonl(tmp_path / "rows.jsonl", rows)
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "rows.parquet", row_group_size=16)
    datasets.Dataset.from_list(rows).save_to_disk(str(tmp_path / "hf"))
    for kind, path in [("jsonl", jsonl), ("parquet", tmp_path / "rows.parquet"), ("arrow", tmp_path / "hf")]:
        out = tmp_path / f"out-{kind}"
        prep_ok(small_tokenizer, template, path, out, {}, "--skip-bad")
        ids, masks, manifest = records(out)
        outs[kind] = ([i.tolist() for i in ids], [m.tolist() for m in masks], manifest["provenance"]["chat"])
    assert outs["jsonl"][0], "no record"
    assert outs["parquet"] == outs["jsonl"]
    assert outs["arrow"] == outs["jsonl"]
