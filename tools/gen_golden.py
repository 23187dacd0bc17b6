#!/usr/bin/env python3
"""Write the golden tokenization files that tests/it/golden.rs compares prep against.

    target/venv/bin/python tools/gen_golden.py            # (re)write fixtures/golden/
    target/venv/bin/python tools/gen_golden.py --check    # recompute, compare, write nothing

Writes fixtures/golden/texts.jsonl.zst (one {"text": ...} object per line) and,
for each tokenizer in fixtures/tokenizers/, fixtures/golden/<name>.ids.jsonl.zst:
one JSON array of token ids per line, line i holding the ids of text i.

The reference is the Python `tokenizers` package at the version the Rust crate
prep links (tools/requirements.txt pins it): Tokenizer.from_str(tokenizer.json),
no_truncation(), no_padding(), encode(text, add_special_tokens=False).ids.
Nothing else: no eos, no bos; the tests append those themselves.

The texts are deterministic: hand-written edge cases (below), documents of the
shared corpus chosen by a hash of their id across every language and source,
and one document of about 3 MB concatenated from corpus documents of several
languages. Every fifth line of texts.jsonl is written with all non-ASCII
characters as \\u escapes (surrogate pairs above U+FFFF), so that prep's JSON
reader is checked on escapes as well as on raw UTF-8.

Needs the shared corpora (../shared/corpora) only to choose corpus documents;
run tools/make_fixtures.py first so that fixtures/tokenizers/ exists.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
from collections import defaultdict
from pathlib import Path

import tokenizers
import zstandard
from tokenizers import Tokenizer

REPO = Path(__file__).resolve().parent.parent
TOKENIZERS = ("gpt2", "deepseek-v3", "minilm-wordpiece")
PINNED_TOKENIZERS = "0.23.2"
ZSTD_LEVEL = 19
# Corpus documents in the golden set are kept small so that the ids files stay
# small; the one large document covers size.
MAX_CORPUS_DOC_BYTES = 12_000
BIG_DOC_BYTES = 3_000_000
# Languages (by `lang` prefix) that get a second corpus document: the scripts a
# tokenizer is most likely to get wrong (RTL, CJK, Indic, Cyrillic, Greek, Vietnamese).
EXTRA_LANGS = ("ar", "fa", "el", "ja", "ko", "zh", "vi", "ru", "uk", "hi", "ta", "te",
               "kn", "gu", "mr", "as", "pa", "sr", "he", "th")
# Languages the large document is built from, in this order, round-robin.
BIG_DOC_LANGS = ("en", "ru-RU", "ja-JP", "zh_CN", "ar-MA", "de-DE", "ko-KR", "el-GR",
                 "fa-IR", "vi-VN", "ta", "hi", "te", "zh-TW", "fr-FR", "uk")


def edge_cases() -> list[str]:
    """Hand-written documents, each aimed at one way of getting ids wrong."""
    t: list[str] = []
    # Empty and whitespace-only documents. MiniLM gives no ids at all for these.
    t += ["", " ", "\n", "\t", "\r\n", "  \n\n  ", " \t\n\r\x0b\x0c",
          "\u00a0", "\u3000", "\u2028\u2029", "\u00a0 \u2009\u200a\u202f\u205f"]
    # Line endings, tabs, long runs of spaces and newlines.
    t += ["line one\r\nline two\r\nline three\r\n",
          "crlf\r\n\r\n\r\nparagraph\r\n",
          "lone\rcarriage\rreturns\r",
          "mixed\n\r\n\r\n\nendings",
          "\tindented\n\t\tdouble\n\t \t mixed tab space\n",
          "def f(x):\n\treturn x\t# tab before comment\n",
          "a" + " " * 257 + "b",
          " " * 1000,
          "\n" * 500,
          "words   with    runs     of      spaces       between        them",
          "trailing spaces   ",
          "   leading spaces",
          "x" + "\n \n\t\n" * 40 + "y"]
    # Digits and long numbers.
    t += ["0", "1234567890",
          "3.14159265358979323846264338327950288419716939937510582097494459",
          "".join(str((i * 7919) % 10) for i in range(1000)),
          "2024-01-01T12:00:00.000Z, 0x7fffffff, 0b1010, 1e-9, -42, +3.0, 1,000,000",
          "Arabic-Indic \u0661\u0662\u0663\u0664\u0665 Devanagari \u0967\u0968\u0969 "
          "full-width \uff11\uff12\uff13 roman \u216b superscript x\u00b2\u00b3",
          "IPv4 192.168.0.1 IPv6 2001:db8::ff00:42:8329 port :8080"]
    # Emoji: ZWJ sequences, skin tones, flags, keycaps, variation selectors.
    t += ["family \U0001F468\u200D\U0001F469\u200D\U0001F467\u200D\U0001F466 and "
          "\U0001F469\u200D\u2764\uFE0F\u200D\U0001F48B\u200D\U0001F468",
          "skin tones \U0001F44D\U0001F3FB \U0001F44D\U0001F3FD \U0001F44D\U0001F3FF "
          "\U0001F9D1\U0001F3FE\u200D\U0001F4BB",
          "flags \U0001F1EB\U0001F1F7\U0001F1EF\U0001F1F5\U0001F1E7\U0001F1F7 "
          "\U0001F3F3\uFE0F\u200D\U0001F308 \U0001F3F4\U000E0067\U000E0062\U000E0073"
          "\U000E0063\U000E0074\U000E007F",
          "keycaps 1\uFE0F\u20E3 #\uFE0F\u20E3 *\uFE0F\u20E3 0\u20E3",
          "\U0001F600\U0001F601\U0001F602\U0001F923\U0001F60D\U0001F680\U0001F525" * 20,
          "text\u2764\uFE0Ftext \u263A\uFE0E \u263A\uFE0F"]
    # Combining marks, decomposed accents, stacked diacritics, normalisation forms.
    t += ["Caf\u00e9 vs Cafe\u0301, na\u00efve vs nai\u0308ve, \u00c5 vs A\u030a vs \u212b",
          "Z\u0324\u0354\u0367\u0311\u0313a\u0308\u0356\u032d\u0308\u0307l\u036e\u0312"
          "\u036bg\u030c\u0317\u035a\u031ao\u0319\u0314\u036e\u0307\u0350\u0307",
          "e" + "\u0301\u0302\u0303\u0304\u0306\u0307\u0308\u030a\u030b\u030c" * 10,
          "\u0301 leading combining mark",
          "Hangul jamo \u1100\u1161\u11a8 vs \uac01, Vietnamese Ti\u00ea\u0301ng Vi\u1ec7t",
          "\u0939\u093f\u0928\u094d\u0926\u0940 \u0915\u094d\u0937 \u0924\u094d\u0930 "
          "\u0BA4\u0BAE\u0BBF\u0BB4\u0BCD",
          "Hebrew with niqqud \u05e9\u05b8\u05c1\u05dc\u05d5\u05b9\u05dd "
          "\u05e2\u05d5\u05b9\u05dc\u05b8\u05dd",
          "Thai \u0e20\u0e32\u0e29\u0e32\u0e44\u0e17\u0e22 \u0e01\u0e34\u0e48\u0e19"
          "\u0e49\u0e33 \u0e2a\u0e27\u0e31\u0e2a\u0e14\u0e35\u0e04\u0e23\u0e31\u0e1a"]
    # Control and invisible characters.
    t += ["\x00", "a\x00b\x00c", "\x01\x02\x03\x04\x05\x06\x07\x08\x0e\x0f\x10\x1f",
          "\x1b[31mred\x1b[0m and \x1b[1mbold\x1b[0m", "del\x7fete", "next\u0085line",
          "zero\u200bwidth\u200cnon\u200djoiner", "\ufeffBOM at the start",
          "soft\u00adhyphen", "bidi \u202eoverride\u202c and \u200fmarks\u200e",
          "tag chars \U000E0041\U000E0042", "private use \ue000\uf8ff \U000F0000"]
    # Special-token strings inside ordinary text. In the reference these become
    # the special token's id wherever the tokenizer declares them as added tokens,
    # even with add_special_tokens=False.
    t += ["a<|endoftext|>b", "<|endoftext|>", "<|endoftext|><|endoftext|>",
          "end of one document.<|endoftext|>Start of the next.",
          "almost <|endoftext| and <|endoftext and |endoftext|> and <| endoftext |>",
          "[SEP] [CLS]", "[CLS]hello world[SEP]", "[PAD][MASK][UNK]", "[sep] [cls] lowercase",
          "<\uff5cend\u2581of\u2581sentence\uff5c>",
          "x<\uff5cbegin\u2581of\u2581sentence\uff5c>y<\uff5cend\u2581of\u2581sentence\uff5c>z",
          "<\uff5c\u2581pad\u2581\uff5c> <\uff5cplace\u2581holder\u2581no\u25810\uff5c>",
          "<|end_of_sentence|> ascii look-alike of the deepseek token",
          "all together: <|endoftext|> [SEP] <\uff5cend\u2581of\u2581sentence\uff5c> [CLS]"]
    # Text that is all JSON escapes.
    t += ['He said "hi" and then \\"bye\\"',
          '{"text": "nested", "ids": [1, 2, 3], "s": "a\\nb\\t\\u0041"}',
          "C:\\Users\\prep\\Desktop\\file.txt \\\\server\\share",
          "\\u0041 is not an escape here, nor is \\n or \\x00",
          "\"\"\"\"\"\"\"\"\\\\\\\\\\\\\\\\''''''''",
          "</script><script>alert('x')</script>",
          "/slash\\/escaped/ and \b backspace \f formfeed"]
    # Lone characters outside the BMP, and other single characters.
    t += ["\U0001D11E", "\U00020000", "\U0010FFFD", "\U0001F600", "a", " a", "a ", "\u00ff",
          "\u20ac", "\uffff", "\ufffd"]
    # Long words and hard cases for BPE and WordPiece (max_input_chars_per_word=100).
    t += ["a" * 5000, "supercalifragilisticexpialidocious" * 30,
          "https://example.org/a/very/long/path?with=query&and=more#fragment" * 5,
          "QUJDREVGR0hJSktMTU5PUFFSU1RVVldYWVo0NTY3ODkrLw==" * 20,
          "\u6f22\u5b57" * 300, "\u0627\u0644\u0639\u0631\u0628\u064a\u0629" * 200]
    # Case, contractions, ligatures, casing that changes length.
    t += ["I'm you're they'll we've she'd it's DON'T WON'T Y'ALL",
          "curly \u2018quotes\u2019 and it\u2019s \u201cdouble\u201d",
          "\u0130stanbul \u0131\u015f\u0131k \u00df STRASSE \ufb01 \ufb02 \u01c5 \u1e9e",
          "\u039f\u0394\u039f\u03a3 \u03bf\u03b4\u03cc\u03c2 \u1f08\u03b8\u1fc6\u03bd\u03b1\u03b9",
          "\u2200x\u2208\u211d: x\u00b2 \u2265 0 \u2227 \u2203y \u2260 x, "
          "\U0001D400\U0001D401 \u2153 \u00bd",
          "half-width \uff76\uff80\uff76\uff85 full-width \uff21\uff22\uff23 "
          "\u30ab\u30bf\u30ab\u30ca \u3072\u3089\u304c\u306a"]
    # Other scripts the corpus lacks.
    t += ["Armenian \u0540\u0561\u0575\u0565\u0580\u0565\u0576 Georgian "
          "\u10e5\u10d0\u10e0\u10d7\u10e3\u10da\u10d8 Amharic \u12a0\u121b\u122d\u129b",
          "Khmer \u1797\u17b6\u179f\u17b6\u1781\u17d2\u1798\u17c2\u179a Tibetan "
          "\u0f56\u0f7c\u0f51\u0f0b\u0f61\u0f72\u0f42 Myanmar \u1019\u103c\u1014\u103a"
          "\u1019\u102c",
          "Mongolian \u182e\u1823\u1829\u182d\u1823\u182f Cherokee \u13e3\u13b3\u13a9 "
          "Sinhala \u0dc3\u0dd2\u0d82\u0dc4\u0dbd"]
    # Source code.
    t += ["fn main() {\n    let v: Vec<u32> = (0..10).collect();\n"
          "    println!(\"{:?}\", v);\n}\n",
          "#include <stdio.h>\r\nint main(void) {\r\n\tprintf(\"%d\\n\", 42);\r\n"
          "\treturn 0;\r\n}\r\n"]
    return t


def read_corpus(path: Path):
    with path.open("rb") as f:
        reader = zstandard.ZstdDecompressor().stream_reader(f, read_size=1 << 20)
        text = reader.read().decode("utf-8")
    for line in text.split("\n"):
        if line.strip():
            yield json.loads(line)


def order_key(doc_id: str) -> bytes:
    return hashlib.sha256(b"golden:" + doc_id.encode("utf-8")).digest()


def corpus_documents(corpus: Path) -> tuple[list[str], str, dict]:
    """Small documents across every (lang, source), and the one large document."""
    groups: dict[tuple[str, str], list[tuple[bytes, str]]] = defaultdict(list)
    for doc in read_corpus(corpus):
        groups[(doc["lang"], doc["source"])].append((order_key(doc["id"]), doc["text"]))
    for docs in groups.values():
        docs.sort(key=lambda d: d[0])

    small: list[str] = []
    used: set[tuple[str, str, int]] = set()
    for lang, source in sorted(groups):
        want = 2 if lang.split("-")[0].split("_")[0] in EXTRA_LANGS else 1
        for i, (_, text) in enumerate(groups[(lang, source)]):
            if want == 0:
                break
            if len(text.encode("utf-8")) <= MAX_CORPUS_DOC_BYTES:
                small.append(text)
                used.add((lang, source, i))
                want -= 1

    # The large document: documents of several languages, round-robin, in hash
    # order, none of them among the small ones, joined by blank lines.
    queues = []
    for lang in BIG_DOC_LANGS:
        docs = []
        for source in sorted(s for (l, s) in groups if l == lang):
            docs += [(k, text) for i, (k, text) in enumerate(groups[(lang, source)])
                     if (lang, source, i) not in used]
        docs.sort(key=lambda d: d[0])
        queues.append([text for _, text in docs])
    parts: list[str] = []
    size = 0
    depth = 0
    while size < BIG_DOC_BYTES:
        for q in queues:
            if depth < len(q) and size < BIG_DOC_BYTES:
                parts.append(q[depth])
                size += len(q[depth].encode("utf-8")) + 2
        depth += 1
    big = "\n\n".join(parts)
    stats = {"groups": len(groups), "small": len(small), "big_parts": len(parts),
             "big_bytes": len(big.encode("utf-8"))}
    return small, big, stats


def build_texts(corpus: Path) -> tuple[list[str], dict]:
    edges = edge_cases()
    small, big, stats = corpus_documents(corpus)
    # Interleave so that edge cases sit between ordinary documents rather than in
    # one block, put the large document in the middle, and end on an empty one.
    texts: list[str] = []
    for i in range(max(len(edges), len(small))):
        if i < len(edges):
            texts.append(edges[i])
        if i < len(small):
            texts.append(small[i])
        if i == len(small) // 2:
            texts.append(big)
    texts.append("")
    stats["edge_cases"] = len(edges)
    return texts, stats


def texts_jsonl(texts: list[str]) -> bytes:
    lines = []
    for i, text in enumerate(texts):
        lines.append(json.dumps({"text": text}, ensure_ascii=(i % 5 == 0)))
    return ("\n".join(lines) + "\n").encode("utf-8")


def ids_jsonl(tok: Tokenizer, texts: list[str]) -> tuple[bytes, int, int]:
    lines = []
    n_tokens = 0
    max_id = 0
    for text in texts:
        ids = tok.encode(text, add_special_tokens=False).ids
        n_tokens += len(ids)
        max_id = max([max_id, *ids])
        lines.append(json.dumps(ids, separators=(",", ":")))
    return ("\n".join(lines) + "\n").encode("utf-8"), n_tokens, max_id


def load_tokenizer(path: Path) -> Tokenizer:
    with path.open("rb") as f:
        raw = zstandard.ZstdDecompressor().stream_reader(f).read()
    tok = Tokenizer.from_str(raw.decode("utf-8"))
    # minilm-wordpiece's file switches on truncation at 128 and padding;
    # dataset preparation must apply neither.
    tok.no_truncation()
    tok.no_padding()
    return tok


def compress(data: bytes) -> bytes:
    # Single-threaded with the content size in the header: deterministic bytes.
    # The default window of level 19 is 8 MiB, which every decoder accepts.
    return zstandard.ZstdCompressor(level=ZSTD_LEVEL, write_content_size=True,
                                    threads=0).compress(data)


def decompress(path: Path) -> bytes:
    with path.open("rb") as f:
        return zstandard.ZstdDecompressor().stream_reader(f).read()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--corpora", type=Path, default=REPO.parent / "shared" / "corpora")
    ap.add_argument("--fixtures", type=Path, default=REPO / "fixtures")
    ap.add_argument("--check", action="store_true",
                    help="recompute and compare with the committed files; write nothing")
    args = ap.parse_args()

    print(f"tokenizers {tokenizers.__version__} (pinned {PINNED_TOKENIZERS})")
    if tokenizers.__version__ != PINNED_TOKENIZERS:
        print(f"error: the golden ids are defined by tokenizers {PINNED_TOKENIZERS}; "
              f"install tools/requirements.txt", file=sys.stderr)
        return 2

    texts, stats = build_texts(args.corpora / "debian-docs.jsonl.zst")
    print(f"{len(texts)} texts: {stats['edge_cases']} edge cases, {stats['small']} corpus "
          f"documents from {stats['groups']} (lang, source) pairs, one of "
          f"{stats['big_bytes']:,} bytes from {stats['big_parts']} documents")

    outputs = {"texts.jsonl.zst": texts_jsonl(texts)}
    for name in TOKENIZERS:
        tok = load_tokenizer(args.fixtures / "tokenizers" / f"{name}.tokenizer.json.zst")
        data, n_tokens, max_id = ids_jsonl(tok, texts)
        outputs[f"{name}.ids.jsonl.zst"] = data
        print(f"{name}: {n_tokens:,} tokens, largest id {max_id:,}, "
              f"vocab size {tok.get_vocab_size():,}")

    out_dir = args.fixtures / "golden"
    if args.check:
        bad = [f for f, data in outputs.items()
               if not (out_dir / f).exists() or decompress(out_dir / f) != data]
        for f in bad:
            print(f"DIFFERS: {out_dir / f}")
        print("golden files up to date" if not bad else "golden files out of date")
        return 1 if bad else 0

    out_dir.mkdir(parents=True, exist_ok=True)
    for f, data in outputs.items():
        tmp = out_dir / (f + ".tmp")
        tmp.write_bytes(compress(data))
        tmp.replace(out_dir / f)
        print(f"{out_dir / f}: {(out_dir / f).stat().st_size:,} bytes "
              f"({len(data):,} uncompressed)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
