"""Tokenizing from Python with prep's engine: `prep.Tokenizer`.

    tok = prep.Tokenizer.from_file("tokenizer.json")    # or a model folder, .json.zst, .json.gz
    ids = tok.encode("Hello world")                       # list[int]
    batch = tok.encode_batch(texts)                       # list[list[int]], every core, GIL released
    flat, ends = tok.encode_batch(texts, return_numpy=True)

The ids are `tokenizers.Tokenizer.encode(text, add_special_tokens=False).ids`
for the same file (with `add_special_tokens=True`, what the file's
post-processor puts around them, as `tokenizers` does). prep's fast engine
runs every tokenizer family it supports (byte-level and SentencePiece-style
BPE, Unigram, WordPiece; `tok.engine == "fast"`); a file it does not run is
encoded by HF tokenizers itself (`tok.engine == "hf"`, `tok.description`
says why). `decode` is HF tokenizers'.

Loading is quick: the engine's tables are read from a compiled form kept in
a cache directory (`PREP_TOKENIZER_CACHE`, else `$XDG_CACHE_HOME/prep/tokenizers`
or `~/.cache/prep/tokenizers`; `PREP_TOKENIZER_CACHE=off` keeps none), made
at the first load of each file and checked at every later one; HF
tokenizers reads the file only when first needed (`decode`, special tokens,
or a file the engine does not run).
"""

from __future__ import annotations

import os
from typing import Sequence

import numpy as np

from ._native import Tokenizer as _Native


class Tokenizer:
    """A tokenizer.json loaded for encoding. `threads`: the threads that
    encode in `encode_batch` (default: every core); its lists are made on
    the calling thread meanwhile."""

    def __init__(self, path: str | os.PathLike, threads: int | None = None) -> None:
        self._native = _Native(os.fspath(path), threads)

    @classmethod
    def from_file(cls, path: str | os.PathLike, threads: int | None = None) -> "Tokenizer":
        """A tokenizer.json (also .zst or .gz), or a folder holding one (a
        `save_pretrained` folder, or a hub cache snapshot)."""
        return cls(path, threads)

    @property
    def engine(self) -> str:
        """"fast" (prep's engine) or "hf" (HF tokenizers)."""
        return self._native.engine

    @property
    def description(self) -> str:
        """What runs the file, or why the fast engine does not."""
        return self._native.description

    @property
    def vocab_size(self) -> int:
        """One more than the largest id."""
        return self._native.vocab_size

    def encode(self, text: str, add_special_tokens: bool = False,
               return_numpy: bool = False) -> list[int] | np.ndarray:
        """The ids of `text`: a list, or a uint32 array."""
        ids = self._native.encode(text, add_special_tokens)
        return np.asarray(ids, dtype=np.uint32) if return_numpy else ids

    def encode_batch(self, texts: Sequence[str], add_special_tokens: bool = False,
                     return_numpy: bool = False) -> list[list[int]] | tuple[np.ndarray, np.ndarray]:
        """The ids of every text, on every thread, in order: a list of lists,
        or with `return_numpy` two arrays, every id back to back (uint32) and
        where each text's ids end (uint64): text i is `ids[ends[i-1]:ends[i]]`."""
        texts = list(texts)
        if not return_numpy:
            return self._native.encode_batch(texts, add_special_tokens)
        ids, ends = self._native.encode_batch_flat(texts, add_special_tokens)
        return np.frombuffer(ids, dtype="<u4"), np.frombuffer(ends, dtype="<u8")

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = False) -> str:
        """The text of `ids`, by HF tokenizers."""
        return self._native.decode([int(i) for i in ids], skip_special_tokens)

    def __repr__(self) -> str:
        return f"prep.Tokenizer({os.fspath(self._native.path)!r}, engine={self.engine!r})"


__all__ = ["Tokenizer"]
