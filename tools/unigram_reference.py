"""Reference ids from the Python `tokenizers` package, for prep's Unigram tests.

    python tools/unigram_reference.py TOKENIZER.json[.zst] TEXTS.jsonl[.zst] OUT.jsonl

Writes one line per input line: {"ids": [...]}, the ids of
Tokenizer.from_file(...).encode(text, add_special_tokens=False) with truncation
and padding off, which is the contract prep's engines are held to. The Rust
crate of the same version can differ from this package (it reads Unigram
scores with another float parser), so Unigram tests compare with these ids.
"""

import io
import json
import sys

from tokenizers import Tokenizer


def read(path):
    data = open(path, "rb").read()
    if path.endswith(".zst"):
        import zstandard  # only when given a compressed file

        data = zstandard.ZstdDecompressor().stream_reader(io.BytesIO(data)).read()
    return data


def main(tokenizer_path, texts_path, out_path):
    tok = Tokenizer.from_str(read(tokenizer_path).decode())
    tok.no_truncation()
    tok.no_padding()
    lines = read(texts_path).decode().splitlines()
    with open(out_path, "w") as out:
        for line in lines:
            if not line.strip():
                continue
            text = json.loads(line)["text"]
            ids = tok.encode(text, add_special_tokens=False).ids
            out.write(json.dumps({"ids": ids}) + "\n")


if __name__ == "__main__":
    main(*sys.argv[1:])
