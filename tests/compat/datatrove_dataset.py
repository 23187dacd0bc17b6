"""datatrove's readers of tokenized `.ds` files, as nanotron trains from them.

Source: huggingface/datatrove, src/datatrove/utils/dataset.py at commit
c8aac6a56b156d65930bc1ff5a8938263ec7db9f, `DatatroveFileDataset` and
`DatatroveFolderDataset` (Apache License 2.0, Copyright HuggingFace Inc.).
Written for prep's compatibility suite from their index arithmetic, not
copied: a file holds `(size // token_size [capped by max_tokens]) //
(seq_len + 1)` samples; sample `i` is the `seq_len + 1` tokens at byte
`i * token_size * (seq_len + 1)`, uint16 for token size 2 and uint32
otherwise, as int64; a folder's files (matched by a glob pattern, in the
order found, optionally shuffled by `np.random.default_rng(seed)`) are
concatenated through the cumulative sums of their lengths and `bisect`.
Local paths and numpy arrays stand in for fsspec and torch tensors.
"""

from __future__ import annotations

import glob as globbing
import os
from bisect import bisect

import numpy as np


class FileDataset:
    def __init__(self, file_path: str, seq_len: int, token_size: int = 2,
                 max_tokens: int | None = None):
        self.file_path = file_path
        self.seq_len = seq_len
        self.token_size = token_size
        num_tokens = os.path.getsize(file_path) // token_size
        self._len = (min(max_tokens, num_tokens) if max_tokens else num_tokens) // (seq_len + 1)

    def __getitem__(self, item: int) -> np.ndarray:
        chunk_size = self.token_size * (self.seq_len + 1)
        with open(self.file_path, "rb") as f:
            f.seek(item * chunk_size)
            chunk = f.read(chunk_size)
        return np.frombuffer(chunk, np.uint16 if self.token_size == 2 else np.uint32).astype(np.int64)

    def __len__(self) -> int:
        return self._len


class FolderDataset:
    def __init__(self, pattern: str, seq_len: int, token_size: int = 2,
                 max_tokens: int | None = None, shuffle: bool = False, seed: int = 42):
        matched = sorted(globbing.glob(pattern))
        if not matched:
            raise FileNotFoundError(f'No files matching "{pattern}"')
        self.files = []
        remaining = max_tokens
        for path in matched:
            f = FileDataset(path, seq_len, token_size=token_size, max_tokens=remaining)
            self.files.append(f)
            if remaining is not None:
                remaining -= len(f) * (seq_len + 1)
                if remaining <= 0:
                    break
        if shuffle:
            order = np.random.default_rng(seed).permutation(range(len(self.files)))
            self.files = [self.files[i] for i in order]
        self.lens = np.cumsum([0] + [len(f) for f in self.files]).tolist()
        self.current_file = 0

    def __getitem__(self, item: int) -> np.ndarray:
        if not (self.lens[self.current_file] <= item < self.lens[self.current_file + 1]):
            self.current_file = bisect(self.lens, item) - 1
        return self.files[self.current_file][item - self.lens[self.current_file]]

    def __len__(self) -> int:
        return self.lens[-1] if self.lens else 0
