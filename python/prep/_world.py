"""The rank and world size a loader takes when it is given none: one rule
for every loader of the package (StreamingDataset, DeviceLoader)."""

from __future__ import annotations

import os


def default_rank_and_world() -> tuple[int, int]:
    """torch.distributed's rank and world size where a process group is
    initialised; else the RANK and WORLD_SIZE environment variables (as
    torchrun sets them); else rank 0 of 1."""
    try:
        import torch.distributed as dist
    except ImportError:
        dist = None
    if dist is not None and dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1))
