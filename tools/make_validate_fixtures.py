#!/usr/bin/env python3
"""Writes fixtures/validate/: a small good dataset and a family of broken ones.

    cargo build && target/venv/bin/python tools/make_validate_fixtures.py [--prep target/debug/prep]

The good dataset is made by `prep tokenize` from generated text with a tiny
word-level tokenizer, so every fixture is a few KB. Each broken dataset is a
copy with one deliberate fault. Where a fault would also break a checksum
without that being the point, the manifest's checksum is updated, so each
case has one root cause and tests/it/validate.rs can assert the exact problems
`prep validate` reports. Deterministic: a re-run writes the same bytes (the
good manifest's `created` timestamp is pinned).
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
import struct
import subprocess
import tempfile
from pathlib import Path

import xxhash

REPO = Path(__file__).resolve().parent.parent
OUT = REPO / "fixtures" / "validate"
WORDS = [f"w{i}" for i in range(40)]
HEADER = 32  # bytes before the first offset of an .idx
CHUNK = 1 << 20  # bytes of the .bin per checksum in a .sum, as prep writes it


def tokenizer_json() -> dict:
    vocab = {"[UNK]": 0, "<eos>": 1}
    vocab.update({w: i + 2 for i, w in enumerate(WORDS)})
    return {
        "version": "1.0", "truncation": None, "padding": None,
        "added_tokens": [{"id": 1, "content": "<eos>", "single_word": False, "lstrip": False,
                          "rstrip": False, "normalized": False, "special": True}],
        "normalizer": None, "pre_tokenizer": {"type": "WhitespaceSplit"},
        "post_processor": None, "decoder": None,
        "model": {"type": "WordLevel", "vocab": vocab, "unk_token": "[UNK]"},
    }


def xxh3(data: bytes) -> str:
    return f"{xxhash.xxh3_64_intdigest(data):016x}"


def make_good(prep: Path, work: Path) -> Path:
    rng = random.Random(20261121)
    docs = []
    for i in range(36):
        n = rng.choice([0, 1, 3, 8, 20, 45])
        docs.append({"text": " ".join(rng.choice(WORDS) for _ in range(n)), "id": i})
    corpus = work / "docs.jsonl"
    corpus.write_text("".join(json.dumps(d) + "\n" for d in docs))
    tok = work / "words.tokenizer.json"
    tok.write_text(json.dumps(tokenizer_json()))
    good = OUT / "good"
    subprocess.run([str(prep), "tokenize", "--quiet", "--tokenizer", str(tok), "--input", str(corpus),
                    "--output", str(good), "--eos", "<eos>", "--shard-size", "200B", "--threads", "1"],
                   check=True, cwd=work)
    m = load(good)
    # Pin what depends on where and when the fixture was made.
    m["provenance"]["created"] = "2026-11-21T00:00:00Z"
    m["provenance"]["inputs"] = [{"path": "docs.jsonl", "bytes": corpus.stat().st_size}]
    m["provenance"]["options"]["tokenizer"] = "words.tokenizer.json"
    save(good, m)
    return good


def load(d: Path) -> dict:
    return json.loads((d / "manifest.json").read_text())


def save(d: Path, m: dict) -> None:
    (d / "manifest.json").write_text(json.dumps(m, indent=2) + "\n")


def offsets(d: Path, shard: dict) -> list[int]:
    raw = (d / shard["idx"]).read_bytes()[HEADER:]
    return list(struct.unpack(f"<{len(raw) // 8}Q", raw))


def rehash(d: Path, m: dict, s: int, which: str) -> None:
    """Updates shard s's checksum of `which` ('bin', 'idx' or 'sum') to the file's."""
    shard = m["shards"][s]
    shard[f"{which}_xxh3"] = xxh3((d / shard[which]).read_bytes())


def chunk_sums(data: bytes, chunk: int = CHUNK) -> bytes:
    """A .sum of `data` (a .bin): header, then the XXH3-64 of each chunk."""
    sums = [xxhash.xxh3_64_intdigest(data[i:i + chunk]) for i in range(0, len(data), chunk)]
    return struct.pack("<8sIIQQ", b"PREPSUM\0", 1, 0, chunk, len(sums)) + struct.pack(f"<{len(sums)}Q", *sums)


def resum(d: Path, m: dict, s: int) -> None:
    """Rewrites shard s's .sum for its .bin as it is now, and lists it."""
    shard = m["shards"][s]
    (d / shard["sum"]).write_bytes(chunk_sums((d / shard["bin"]).read_bytes()))
    shard["sum_bytes"] = (d / shard["sum"]).stat().st_size
    rehash(d, m, s, "sum")


def case(name: str, good: Path) -> tuple[Path, dict]:
    d = OUT / name
    shutil.copytree(good, d)
    return d, load(d)


def set_token(d: Path, shard: dict, token: int, value: int) -> None:
    p = d / shard["bin"]
    data = bytearray(p.read_bytes())
    data[token * 2:token * 2 + 2] = struct.pack("<H", value)
    p.write_bytes(bytes(data))


def middle_token(d: Path, shard: dict) -> int:
    """A token inside the shard's longest record, neither first nor last."""
    o = offsets(d, shard)
    r = max(range(len(o) - 1), key=lambda i: o[i + 1] - o[i])
    assert o[r + 1] - o[r] >= 3
    return o[r] + (o[r + 1] - o[r]) // 2


def build(good: Path) -> None:
    m0 = load(good)
    assert len(m0["shards"]) >= 3, "the good dataset needs at least 3 shards"
    vocab = m0["vocab_size"]
    for shard in m0["shards"]:
        # prep's .sum is the one this file would write: the cases below that
        # rewrite a .sum write what prep does.
        assert (good / shard["sum"]).read_bytes() == chunk_sums((good / shard["bin"]).read_bytes())

    d, m = case("truncated_bin", good)
    p = d / m["shards"][1]["bin"]
    p.write_bytes(p.read_bytes()[:-2])

    d, m = case("truncated_idx", good)
    p = d / m["shards"][1]["idx"]
    p.write_bytes(p.read_bytes()[:-8])

    # A bit flipped inside a record keeps the id in range: only the checksum tells.
    d, m = case("flipped_bin", good)
    shard = m["shards"][1]
    t = middle_token(d, shard)
    p = d / shard["bin"]
    data = bytearray(p.read_bytes())
    old = struct.unpack_from("<H", data, t * 2)[0]
    new = 2 + ((old - 2 + 1) % len(WORDS))  # another word, never eos
    struct.pack_into("<H", data, t * 2, new)
    p.write_bytes(bytes(data))

    # A reserved header byte set: the header is refused, and the checksum differs.
    d, m = case("flipped_idx", good)
    p = d / m["shards"][1]["idx"]
    data = bytearray(p.read_bytes())
    data[13] ^= 0x01
    p.write_bytes(bytes(data))

    d, m = case("decreasing_offsets", good)
    shard = m["shards"][1]
    o = offsets(d, shard)
    i = next(k for k in range(1, len(o) - 2) if o[k] < o[k + 1])
    o[i], o[i + 1] = o[i + 1], o[i]
    p = d / shard["idx"]
    p.write_bytes(p.read_bytes()[:HEADER] + struct.pack(f"<{len(o)}Q", *o))
    rehash(d, m, 1, "idx")
    save(d, m)

    d, m = case("token_out_of_range", good)
    shard = m["shards"][2]
    set_token(d, shard, middle_token(d, shard), vocab + 5)
    rehash(d, m, 2, "bin")
    resum(d, m, 2)
    save(d, m)

    # The header says uint32 in a uint16 dataset.
    d, m = case("wrong_dtype", good)
    p = d / m["shards"][0]["idx"]
    data = bytearray(p.read_bytes())
    data[12] = 4
    p.write_bytes(bytes(data))
    rehash(d, m, 0, "idx")
    save(d, m)

    d, m = case("missing_shard", good)
    for ext in ("bin", "idx", "sum"):
        (d / m["shards"][1][ext]).unlink()

    d, m = case("extra_shard", good)
    n = len(m["shards"])
    for ext in ("bin", "idx", "sum"):
        shutil.copy(d / m["shards"][1][ext], d / f"shard-{n:05d}.{ext}")

    d, m = case("manifest_count_edited", good)
    m["n_records"] += 1
    save(d, m)

    # The last token of a record (its eos) replaced by a word.
    d, m = case("missing_eos", good)
    shard = m["shards"][0]
    o = offsets(d, shard)
    r = next(k for k in range(len(o) - 1) if o[k + 1] - o[k] >= 2)
    set_token(d, shard, o[r + 1] - 1, 2)
    rehash(d, m, 0, "bin")
    resum(d, m, 0)
    save(d, m)

    d, m = case("bad_schema", good)
    m["dtype"] = "float32"
    save(d, m)

    # A byte of a .bin changed and its whole-file checksum made to match:
    # only the chunk checksums tell.
    d, m = case("flipped_chunk", good)
    shard = m["shards"][1]
    t = middle_token(d, shard)
    old = struct.unpack_from("<H", (d / shard["bin"]).read_bytes(), t * 2)[0]
    set_token(d, shard, t, 2 + ((old - 2 + 1) % len(WORDS)))  # another word, never eos
    rehash(d, m, 1, "bin")
    save(d, m)

    # A bit of a chunk's checksum in a .sum flipped, the .sum's own checksum
    # made to match: the .bin and the .sum disagree on that chunk.
    d, m = case("flipped_sum", good)
    p = d / m["shards"][1]["sum"]
    data = bytearray(p.read_bytes())
    data[HEADER + 3] ^= 0x10
    p.write_bytes(bytes(data))
    rehash(d, m, 1, "sum")
    save(d, m)

    # A .sum header with chunks of 0 bytes.
    d, m = case("zero_chunk_bytes", good)
    p = d / m["shards"][1]["sum"]
    data = bytearray(p.read_bytes())
    data[16:24] = bytes(8)
    p.write_bytes(bytes(data))
    rehash(d, m, 1, "sum")
    save(d, m)

    # The good dataset as a prep from before .sum files wrote it: valid.
    d, m = case("no_sums", good)
    for shard in m["shards"]:
        (d / shard["sum"]).unlink()
        for key in ("sum", "sum_bytes", "sum_xxh3"):
            del shard[key]
    save(d, m)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--prep", type=Path, default=REPO / "target" / "debug" / "prep")
    args = ap.parse_args()
    if OUT.exists():
        shutil.rmtree(OUT)
    OUT.mkdir(parents=True)
    with tempfile.TemporaryDirectory() as work:
        good = make_good(args.prep.resolve(), Path(work))
    build(good)
    for d in sorted(OUT.iterdir()):
        size = sum(f.stat().st_size for f in d.iterdir())
        print(f"{d.relative_to(REPO)}: {size} bytes")


if __name__ == "__main__":
    main()
