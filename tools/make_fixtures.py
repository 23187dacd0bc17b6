#!/usr/bin/env python3
"""Write the committed fixtures that come from ../shared/corpora.

    target/venv/bin/python tools/make_fixtures.py [--corpora ../shared/corpora]

Writes, deterministically (a re-run gives the same bytes):

  fixtures/tokenizers/NAME.tokenizer.json.zst, for every NAME of TOKENIZERS
      (every file of the collection whose licence lets it be redistributed:
      fixtures/README.md), copied byte for byte; prep reads .zst tokenizer
      files directly.
  fixtures/tokenizers/deepseek-v3.LICENSE
  fixtures/chat/corpus/templates/NAME.jinja, configs/NAME.*.json
      for every NAME of CHAT_TEMPLATES (the chat corpus's templates whose
      licences let them be redistributed: fixtures/README.md), byte for byte.
  fixtures/chat/corpus/data/FILE.zst
      every chat dataset of the corpus, compressed.
  fixtures/corpus/debian-sample.jsonl.zst
      about 3 MB of text from debian-docs.jsonl.zst, the corpus of `make demo`.
      Each selected line is kept byte for byte (its JSON is not re-serialised).

The sample takes documents from every (`lang`, `source`) pair round-robin, so
that every script and every source of the corpus is present; within a pair the
documents are taken in an order fixed by a hash of their `id`, not file order,
so that the sample is not only the first chapter of each manual. Documents over
MAX_DOC_BYTES of text are skipped: the demo should show many documents, and the
golden texts already carry one very large document.

Needs only the standard library and `zstandard` (tools/requirements.txt).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import shutil
import sys
from collections import defaultdict
from pathlib import Path

import zstandard

REPO = Path(__file__).resolve().parent.parent
TOKENIZERS = ("gpt2", "deepseek-v3", "minilm-wordpiece", "gpt-neox-20b", "roberta-base", "falcon",
              "mistral-7b-v0.1", "phi-3-mini", "t5-small", "bert-base-uncased")
# Not the Llama and Gemma ones (Meta's and Google's model terms also cover
# their text): tests read those from PREP_EXTERNAL_DATA.
CHAT_TEMPLATES = ("chatml-openhermes", "deepseek-v3", "mistral-nemo-tools", "mistral-v0.1", "phi3",
                  "phi4-mini", "qwen2.5", "smollm3", "tulu3", "zephyr")
TARGET_TEXT_BYTES = 3_000_000
MAX_DOC_BYTES = 200_000
ZSTD_LEVEL = 19


def read_zst_lines(path: Path):
    """Yield the raw lines (bytes, newline stripped) of a zstd-compressed file."""
    with path.open("rb") as f:
        reader = zstandard.ZstdDecompressor().stream_reader(f, read_size=1 << 20)
        pending = b""
        while True:
            chunk = reader.read(1 << 20)
            if not chunk:
                break
            pending += chunk
            lines = pending.split(b"\n")
            pending = lines.pop()
            yield from lines
        if pending:
            yield pending


def write_zst(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    # Single-threaded, with the content size in the frame header: the output is
    # a function of the input bytes and the zstandard version only.
    cctx = zstandard.ZstdCompressor(level=ZSTD_LEVEL, write_content_size=True, threads=0)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_bytes(cctx.compress(data))
    tmp.replace(path)


def order_key(doc_id: str) -> bytes:
    return hashlib.sha256(doc_id.encode("utf-8")).digest()


def sample_corpus(corpus: Path) -> tuple[list[bytes], dict]:
    groups: dict[tuple[str, str], list[tuple[bytes, int, bytes]]] = defaultdict(list)
    for raw in read_zst_lines(corpus):
        if not raw.strip():
            continue
        doc = json.loads(raw)
        n = len(doc["text"].encode("utf-8"))
        if n == 0 or n > MAX_DOC_BYTES:
            continue
        groups[(doc["lang"], doc["source"])].append((order_key(doc["id"]), n, raw))
    for docs in groups.values():
        docs.sort(key=lambda d: d[0])

    keys = sorted(groups)
    chosen: list[bytes] = []
    text_bytes = 0
    per_lang: dict[str, int] = defaultdict(int)
    per_source: dict[str, int] = defaultdict(int)
    depth = 0
    while text_bytes < TARGET_TEXT_BYTES:
        took = False
        for lang, source in keys:
            docs = groups[(lang, source)]
            if depth >= len(docs):
                continue
            _, n, raw = docs[depth]
            chosen.append(raw)
            text_bytes += n
            per_lang[lang] += 1
            per_source[source] += 1
            took = True
            if text_bytes >= TARGET_TEXT_BYTES:
                break
        if not took:
            break
        depth += 1
    stats = {
        "documents": len(chosen),
        "text_bytes": text_bytes,
        "languages": len(per_lang),
        "sources": dict(sorted(per_source.items())),
    }
    return chosen, stats


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--corpora", type=Path, default=REPO.parent / "shared" / "corpora",
                    help="folder holding debian-docs.jsonl.zst and tokenizers/")
    ap.add_argument("--out", type=Path, default=REPO / "fixtures")
    args = ap.parse_args()

    tok_out = args.out / "tokenizers"
    tok_out.mkdir(parents=True, exist_ok=True)
    for name in TOKENIZERS:
        src = args.corpora / "tokenizers" / f"{name}.tokenizer.json.zst"
        shutil.copyfile(src, tok_out / src.name)
        print(f"{tok_out / src.name}: {src.stat().st_size:,} bytes")
    shutil.copyfile(args.corpora / "tokenizers" / "deepseek-v3.LICENSE",
                    tok_out / "deepseek-v3.LICENSE")

    chat, chat_out = args.corpora / "chat", args.out / "chat" / "corpus"
    for name in CHAT_TEMPLATES:
        for src in [chat / "templates" / f"{name}.jinja", *sorted((chat / "configs").glob(f"{name}.*.json"))]:
            dst = chat_out / src.parent.name / src.name
            dst.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(src, dst)
    for src in sorted((chat / "data").iterdir()):
        write_zst(chat_out / "data" / f"{src.name}.zst", src.read_bytes())
    print(f"{chat_out}: {len(CHAT_TEMPLATES)} templates, {len(list((chat / 'data').iterdir()))} datasets")

    lines, stats = sample_corpus(args.corpora / "debian-docs.jsonl.zst")
    out = args.out / "corpus" / "debian-sample.jsonl.zst"
    write_zst(out, b"".join(line + b"\n" for line in lines))
    print(f"{out}: {out.stat().st_size:,} bytes; {stats['documents']} documents, "
          f"{stats['text_bytes']:,} bytes of text, {stats['languages']} languages, "
          f"sources {stats['sources']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
