#!/usr/bin/env python3
"""The baseline prep is measured against: JSONL to a token file with Python `tokenizers`.

    RAYON_NUM_THREADS=2 python tools/baseline_tokenize.py \\
        --tokenizer gpt2.tokenizer.json --input docs.jsonl --output out.bin --eos '<|endoftext|>'

What a careful user would write without prep: json.loads each line, batches of
1,024 documents through `Tokenizer.encode_batch(texts, add_special_tokens=False)`
(parallel over RAYON_NUM_THREADS threads), the eos id appended to each document,
ids written with numpy as little-endian uint16 (vocabulary of at most 65,536
ids) or uint32, back to back, like the tokens of a prep shard's .bin.
Truncation and padding are switched off, as prep does.

Prints one JSON object: documents, tokens, dtype.
"""

from __future__ import annotations

import argparse
import json
import sys
from itertools import chain
from pathlib import Path

import numpy as np
from tokenizers import Tokenizer

BATCH = 1024


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tokenizer", type=Path, required=True, help="tokenizer.json (not compressed)")
    ap.add_argument("--input", type=Path, required=True, help="JSONL with a `text` field")
    ap.add_argument("--output", type=Path, required=True, help="token file to write")
    ap.add_argument("--eos", required=True, help="eos token, appended to every document")
    ap.add_argument("--batch", type=int, default=BATCH)
    args = ap.parse_args()

    tok = Tokenizer.from_file(str(args.tokenizer))
    tok.no_truncation()
    tok.no_padding()
    eos = tok.token_to_id(args.eos)
    if eos is None:
        print(f"error: {args.eos!r} is not in the vocabulary", file=sys.stderr)
        return 2
    dtype = np.dtype("<u2") if tok.get_vocab_size(with_added_tokens=True) <= 65536 else np.dtype("<u4")

    documents = tokens = 0

    def flush(batch: list[str], out) -> None:
        nonlocal documents, tokens
        encodings = tok.encode_batch(batch, add_special_tokens=False)
        ids = np.fromiter(chain.from_iterable(chain(e.ids, (eos,)) for e in encodings), dtype=dtype)
        ids.tofile(out)
        documents += len(batch)
        tokens += len(ids)

    with args.input.open("r", encoding="utf-8", newline="\n") as f, args.output.open("wb") as out:
        batch: list[str] = []
        for line in f:
            if not line.strip():
                continue
            batch.append(json.loads(line)["text"])
            if len(batch) == args.batch:
                flush(batch, out)
                batch = []
        if batch:
            flush(batch, out)

    print(json.dumps({"documents": documents, "tokens": tokens,
                      "dtype": "uint16" if dtype.itemsize == 2 else "uint32"}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
