"""prep.Tokenizer (the fast engine from Python) against the `tokenizers`
package on every tokenizer file in fixtures/tokenizers, and Gemma 3's from
PREP_EXTERNAL_DATA (fixtures/README.md; skipped, saying so, without it): the ids of
`encode(text, add_special_tokens=False)` and with special tokens, one text
at a time and in batches, as lists and as numpy arrays, on 1 and 2
threads, over the golden texts (fixtures/golden, its long document left
out) and edge cases."""

from __future__ import annotations

import io
import json
import os
from pathlib import Path

import numpy as np
import pytest
import zstandard
from tokenizers import Tokenizer as HF

import prep

REPO = Path(__file__).resolve().parents[2]
EXTERNAL = os.environ.get("PREP_EXTERNAL_DATA")
FILES = [pytest.param(p, id=p.name.split(".")[0])
         for p in sorted((REPO / "fixtures" / "tokenizers").glob("*.tokenizer.json.zst"))]
FILES.append(pytest.param(Path(EXTERNAL or ".") / "tokenizers" / "gemma3.tokenizer.json.zst", id="gemma3",
                          marks=pytest.mark.skipif(not EXTERNAL, reason="needs PREP_EXTERNAL_DATA "
                                                   "(tokenizers/gemma3.tokenizer.json.zst)")))

EDGES = ["", " ", "  hello   world  ", "\n\n\t", "Hello<|endoftext|>world", "<s>x</s>", "[CLS] a [SEP]",
         "héllo wörld 中文 日本語 한국어 😀👩\u200d💻", "e\u0301 ﬁ Ⅻ ｶ", "don't 'TIS", "12345678901234", "\u2581x"]


def read(path: Path) -> bytes:
    with zstandard.ZstdDecompressor().stream_reader(io.BytesIO(path.read_bytes())) as r:
        return io.BufferedReader(r).read()


@pytest.fixture(scope="module")
def texts() -> list[str]:
    lines = read(REPO / "fixtures" / "golden" / "texts.jsonl.zst").decode().split("\n")
    golden = [json.loads(line)["text"] for line in lines if line.strip()]
    return EDGES + [t for t in golden if len(t) < 1 << 20]


@pytest.mark.parametrize("path", FILES)
def test_ids_equal_tokenizers(path: Path, texts: list[str], tmp_path: Path) -> None:
    hf = HF.from_str(read(path).decode())
    hf.no_truncation()
    hf.no_padding()
    ours = prep.Tokenizer.from_file(path, threads=2)
    assert ours.engine == "fast", ours.description
    for special in (False, True):
        want = [e.ids for e in hf.encode_batch(texts, add_special_tokens=special)]
        got = ours.encode_batch(texts, add_special_tokens=special)
        bad = [i for i, (a, b) in enumerate(zip(got, want)) if a != b]
        assert not bad and len(got) == len(want), \
            f"{path.name} (special {special}): {len(bad)} texts differ, the first {texts[bad[0]][:80]!r}"
        ids, ends = ours.encode_batch(texts, add_special_tokens=special, return_numpy=True)
        assert ids.dtype == np.uint32 and ends.dtype == np.uint64
        assert ends.tolist() == np.cumsum([len(w) for w in want]).tolist()
        assert ids.tolist() == [i for w in want for i in w]
        for text, w in list(zip(texts, want))[:40]:
            assert ours.encode(text, add_special_tokens=special) == w
    one = prep.Tokenizer(path, threads=1)
    assert one.encode_batch(texts) == ours.encode_batch(texts)
    assert ours.vocab_size == max(hf.get_vocab(with_added_tokens=True).values()) + 1


def test_lists_come_back_in_order_from_many_chunks(texts: list[str]) -> None:
    """encode_batch makes its lists while later chunks of texts are encoded;
    with chunks of very uneven cost (long texts among short ones) they
    finish out of order, and the lists still follow the texts."""
    tok = prep.Tokenizer.from_file(FILES[0].values[0], threads=2)
    long = max(texts, key=len)
    batch = [long if i % 97 == 0 else texts[i % len(texts)][:50] for i in range(6000)]
    want = [tok.encode(t) for t in batch]
    assert tok.encode_batch(batch) == want
    ids, ends = tok.encode_batch(batch, return_numpy=True)
    assert ends.tolist() == np.cumsum([len(w) for w in want]).tolist()
    assert tok.encode_batch([]) == []


def test_a_folder_and_the_decoder(tmp_path: Path) -> None:
    (tmp_path / "tokenizer.json").write_bytes(read(FILES[0].values[0]))
    tok = prep.Tokenizer.from_file(tmp_path)
    hf = HF.from_file(str(tmp_path / "tokenizer.json"))
    text = "A folder holds tokenizer.json: héllo"
    assert tok.encode(text) == hf.encode(text, add_special_tokens=False).ids
    assert tok.decode(tok.encode(text)) == hf.decode(hf.encode(text, add_special_tokens=False).ids)
    assert tok.encode(text, return_numpy=True).dtype == np.uint32


def test_errors_name_the_file(tmp_path: Path) -> None:
    with pytest.raises(OSError, match="no tokenizer.json"):
        prep.Tokenizer.from_file(tmp_path)
    bad = tmp_path / "tokenizer.json"
    bad.write_text("{not json")
    with pytest.raises(ValueError, match="tokenizer.json"):
        prep.Tokenizer.from_file(bad)


@pytest.mark.parametrize("path", FILES)
def test_a_damaged_compiled_form_is_rebuilt_with_the_same_ids(
        path: Path, texts: list[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The first load writes the compiled form, the second reads it; one
    damaged in any of three ways is rebuilt, the same bytes written again,
    and the ids are HF's every time."""
    monkeypatch.setenv("PREP_TOKENIZER_CACHE", str(tmp_path / "cache"))
    hf = HF.from_str(read(path).decode())
    hf.no_truncation()
    hf.no_padding()
    want = [e.ids for e in hf.encode_batch(texts[:200], add_special_tokens=False)]
    assert prep.Tokenizer(path, threads=1).encode_batch(texts[:200]) == want
    (form,) = (tmp_path / "cache").glob("*.tok")
    good = form.read_bytes()
    assert prep.Tokenizer(path, threads=1).encode_batch(texts[:200]) == want
    for damaged in (good[: len(good) // 3], good[:100] + bytes([good[100] ^ 1]) + good[101:], b""):
        form.write_bytes(damaged)
        assert prep.Tokenizer(path, threads=1).encode_batch(texts[:200]) == want
        assert form.read_bytes() == good
