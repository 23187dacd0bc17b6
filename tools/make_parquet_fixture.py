"""Writes fixtures/corpus/debian-sample.parquet from the JSONL fixture corpus.

The first 300 documents of debian-sample.jsonl.zst, the text in column `text`
beside an `id` column (so a projection has something to leave out), in row
groups of 100 rows, zstd-compressed: a small Parquet input with several row
groups for the object-storage tests (ranged reads of footer and column
chunks, --part by row group). Needs pyarrow and zstandard:

    python tools/make_parquet_fixture.py
"""

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import zstandard

REPO = Path(__file__).resolve().parents[1]
CORPUS = REPO / "fixtures" / "corpus" / "debian-sample.jsonl.zst"
ROWS = 300
OUT = REPO / "fixtures" / "corpus" / "debian-sample.parquet"


def main() -> None:
    with CORPUS.open("rb") as f:
        raw = zstandard.ZstdDecompressor().stream_reader(f).read()
    texts = [json.loads(line)["text"] for line in raw.split(b"\n") if line.strip()][:ROWS]
    table = pa.table({"id": pa.array(range(len(texts)), pa.int64()), "text": pa.array(texts, pa.string())})
    pq.write_table(table, OUT, row_group_size=100, compression="zstd")
    print(f"{OUT}: {len(texts)} rows, {OUT.stat().st_size} bytes")


if __name__ == "__main__":
    main()
