#!/usr/bin/env python3
"""The chat benchmark: `prep tokenize --chat` beside the Python reference, in one run.

    cargo build --release
    target/venv/bin/python tools/bench_chat.py [--prep target/release/prep] [--scratch target/bench]

Conversations: every row of the five chat datasets in fixtures/chat/corpus
(OpenAI messages, content parts, Alpaca, ShareGPT with tools, preference
rows), repeated --copies times into one JSONL file. Templates: Qwen2.5's
(tools, no generation blocks: masks from prefix renderings) and the
Llama-3 training template (generation blocks), each with a real vocabulary
(GPT-2's, plus the template's control tokens), and Mistral v0.1's with
Mistral 7B's own SentencePiece-style tokenizer (it refuses conversations
whose turns do not alternate, which every side skips).

Baselines, one Python process each (they run on one core):
- `python mask`: what prep computes, in Python: transformers'
  apply_chat_template(tokenize=False) of the whole conversation and of the
  prefixes that place each reply (or its generation spans), then
  tokenizers' encode with offsets and the overlap rule (tools/chat_reference.py's
  row rule without its self-checks);
- `python ids`: apply_chat_template(tokenize=True) alone, no mask, the
  least a Python pipeline does.
prep runs with --threads 1 and --threads 2 (whole process, page cache warm),
on the engine it picks (the fast one, for these byte-level vocabularies),
and with --engine hf on one thread: what chat mode ran before the fast
engine could place masks.
Every baseline's total tokens and trained tokens are checked equal to
prep's. Reports conversations/s and the ratios; results also go to
target/bench/chat.json.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import transformers

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tools"))
from corpora import chat, find_chat, read_text, tokenizer  # noqa: E402

GPT2 = REPO / "fixtures" / "tokenizers" / "gpt2.tokenizer.json.zst"
DATASETS = ("openai_sft.jsonl", "v1_sft_demo.jsonl", "alpaca_en_demo.json",
            "glaive_toolcall_en_demo.json", "dpo_en_demo.json")
LLAMA3 = {"bos_token": "<|begin_of_text|>", "eos_token": "<|eot_id|>"}
# name: (template, control tokens added to GPT-2's vocabulary, or a real
# tokenizer file to use as it is, and the template's variables). Llama 3's
# template is not shipped (fixtures/README.md): it runs where PREP_EXTERNAL_DATA
# has it, and is left out, saying so, where not.
TEMPLATES = {
    "qwen2.5": (chat("configs/qwen2.5.tokenizer_config.json"), ["<|im_start|>", "<|im_end|>"], None),
    "mistral-v0.1": (chat("configs/mistral-v0.1.chat_template.json"),
                     tokenizer("mistral-7b-v0.1"), {"bos_token": "<s>", "eos_token": "</s>"}),
}
if (LLAMA3_TRAINING := find_chat("templates/llama3-training.jinja")) is not None:
    TEMPLATES["llama3-training"] = (
        LLAMA3_TRAINING, ["<|begin_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"], LLAMA3)
else:
    print("llama3-training: left out (its template is read from PREP_EXTERNAL_DATA, not set)")

import chat_reference as ref  # noqa: E402


def rows_of(name: str) -> list:
    text = read_text(chat(f"data/{name}"))
    if name.endswith(".jsonl"):
        return [json.loads(line) for line in text.splitlines() if line.strip()]
    return json.loads(text)


def tokenizer_with(special: list[str] | Path, out: Path) -> Path:
    """GPT-2's vocabulary with `special` added, or the tokenizer file `special`, as a tokenizer.json."""
    from tokenizers import AddedToken

    if isinstance(special, Path):
        ref.read_tokenizer(special).save(str(out))
        return out
    tok = ref.read_tokenizer(GPT2)
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in special])
    tok.save(str(out))
    return out


def python_mask(reference: ref.Reference, rows: list) -> tuple[float, int, int, int]:
    """Seconds, conversations kept, tokens and trained tokens, prep's rule in Python."""
    kept = tokens = trained = 0
    start = time.perf_counter()
    for row in rows:
        try:
            messages, tools = ref.conversation(row)
            text = reference._render_row(messages, tools)
            spans = (reference._generation_spans(messages, tools, text) if reference.generation
                     else reference._prefix_spans(messages, tools, text))
        except ref.BadRow:
            continue
        enc = reference.hf(text, add_special_tokens=False, return_offsets_mapping=True)
        offsets = np.asarray(enc["offset_mapping"], dtype=np.int64).reshape(-1, 2)
        mask = ref._overlap_mask(offsets, spans)
        if not mask.any():
            continue
        kept += 1
        tokens += len(enc["input_ids"])
        trained += int(mask.sum())
    return time.perf_counter() - start, kept, tokens, trained


def python_ids(reference: ref.Reference, rows: list) -> tuple[float, int]:
    """Seconds and tokens of apply_chat_template(tokenize=True) alone."""
    tokens = 0
    start = time.perf_counter()
    for row in rows:
        try:
            messages, tools = ref.conversation(row)
            out = reference.hf.apply_chat_template(messages, tools=tools, chat_template=reference.template,
                                                   tokenize=True, return_dict=True,
                                                   add_generation_prompt=False, **reference.variables)
        except Exception:  # noqa: BLE001: a row the template refuses costs what it cost
            continue
        tokens += len(out["input_ids"])
    return time.perf_counter() - start, tokens


def run_prep(prep: Path, tokenizer: Path, template: Path, rows: Path, out: Path, threads: int,
             variables: dict, engine: str = "auto") -> tuple[float, dict]:
    subprocess.run(["rm", "-rf", str(out)], check=True)
    args = [str(prep), "tokenize", "--chat", "--tokenizer", str(tokenizer), "--chat-template", str(template),
            "--chat-date", ref.DATE.strftime("%Y-%m-%d"), "--input", str(rows),
            "--output", str(out), "--threads", str(threads), "--skip-bad", "--quiet",
            "--engine", engine]
    for k, v in variables.items():
        args += ["--chat-var", f"{k}={v}"]
    start = time.perf_counter()
    proc = subprocess.run(args, capture_output=True, text=True)
    seconds = time.perf_counter() - start
    if proc.returncode != 0:
        raise SystemExit(f"prep failed: {proc.stderr}")
    return seconds, json.loads((out / "manifest.json").read_text())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--prep", type=Path, default=REPO / "target" / "release" / "prep")
    ap.add_argument("--scratch", type=Path, default=REPO / "target" / "bench")
    ap.add_argument("--copies", type=int, default=4, help="times the corpus is repeated")
    args = ap.parse_args()
    scratch = args.scratch / "chat"
    scratch.mkdir(parents=True, exist_ok=True)
    rows = [r for name in DATASETS for r in rows_of(name)] * args.copies
    rows_path = scratch / "rows.jsonl"
    rows_path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), encoding="utf-8")
    print(f"{len(rows)} conversations ({rows_path.stat().st_size / 1e6:.1f} MB of JSONL), "
          f"{os.cpu_count()} cores; transformers {transformers.__version__}")
    results = {}
    for name, (template, special, given) in TEMPLATES.items():
        tokenizer = tokenizer_with(special, scratch / f"{name}.tokenizer.json")
        text = ref.template_text(template)
        variables = given if given is not None else ref.config_variables(template)
        reference = ref.Reference(text, tokenizer, variables)
        extra = {} if given is None else variables
        t1, m1 = run_prep(args.prep, tokenizer, template, rows_path, scratch / "out1", 1, extra)
        t2, m2 = run_prep(args.prep, tokenizer, template, rows_path, scratch / "out2", 2, extra)
        th, mh = run_prep(args.prep, tokenizer, template, rows_path, scratch / "outh", 1, extra, "hf")
        pm, kept, tokens, trained = python_mask(reference, rows)
        pi, ids_tokens = python_ids(reference, rows)
        assert m1["n_records"] == kept and m1["n_tokens"] == tokens, (name, m1["n_tokens"], tokens)
        assert m1["provenance"]["chat"]["trainable_tokens"] == trained, name
        assert m2["n_tokens"] == m1["n_tokens"]
        assert mh["n_tokens"] == m1["n_tokens"] and \
            mh["provenance"]["chat"]["trainable_tokens"] == trained, name
        engine = m1["provenance"]["options"]["engine"]
        by_hf = m1["provenance"]["chat"].get("placed_by_hf", 0)
        n = len(rows)
        r = {"conversations": n, "kept": kept, "tokens": tokens, "trained": trained,
             "engine": engine, "placed_by_hf": by_hf, "prep_hf_engine_1_thread_s": th,
             "prep_1_thread_s": t1, "prep_2_threads_s": t2, "python_mask_s": pm, "python_ids_s": pi,
             "prep_1_over_python_mask": pm / t1, "prep_2_over_python_mask": pm / t2,
             "prep_1_over_python_ids": pi / t1, "prep_2_over_python_ids": pi / t2}
        results[name] = r
        print(f"{name}: {kept} of {n} conversations kept, {tokens} tokens, {trained} trained; "
              f"engine {engine}, {by_hf} placed by HF offsets")
        for label, secs in [("prep --threads 1", t1), ("prep --threads 2", t2),
                            ("prep --engine hf, 1 thread", th),
                            ("python mask (prep's rule)", pm), ("python ids only", pi)]:
            print(f"  {label:28} {secs:7.2f} s  {n / secs:9.0f} conversations/s")
        print(f"  prep over python mask: {pm / t1:.1f}x on 1 thread, {pm / t2:.1f}x on 2; "
              f"over python ids only: {pi / t1:.1f}x, {pi / t2:.1f}x; "
              f"over its own HF engine: {th / t1:.1f}x")
    (args.scratch / "chat.json").write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
