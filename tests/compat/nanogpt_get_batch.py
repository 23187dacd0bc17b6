"""nanoGPT's `get_batch`, as train.py reads a prepared `train.bin`.

Source: karpathy/nanoGPT, train.py, `get_batch` (MIT licence, Copyright (c)
2022 Andrej Karpathy). Written for prep's compatibility suite from that
function's logic, not copied: a fresh `np.memmap` of the split's file as
uint16 on every call, `batch_size` start positions drawn uniformly from
`0 .. len(data) - block_size - 1` (`torch.randint(len(data) - block_size,
(batch_size,))`), inputs `data[i : i + block_size]` and targets
`data[i + 1 : i + 1 + block_size]` as int64, stacked. torch is not needed
here: `randint` stands in for `torch.randint` (pass a numpy generator's, or
fixed positions), and the stacks are numpy arrays rather than tensors.
"""

from __future__ import annotations

import os
from typing import Callable

import numpy as np


def get_batch(data_dir: str, split: str, block_size: int, batch_size: int,
              randint: Callable[[int, tuple], np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    data = np.memmap(os.path.join(data_dir, f"{split}.bin"), dtype=np.uint16, mode="r")
    ix = randint(len(data) - block_size, (batch_size,))
    x = np.stack([data[i:i + block_size].astype(np.int64) for i in ix])
    y = np.stack([data[i + 1:i + 1 + block_size].astype(np.int64) for i in ix])
    return x, y
