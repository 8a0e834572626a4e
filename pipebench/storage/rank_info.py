"""Which rank of how many this process belongs to, from inside a rank or any of its DataLoader workers,
and which of the rank's workers it is.

torchrun puts RANK and WORLD_SIZE in every rank's environment, and DataLoader workers inherit
it under every start method; torch.distributed itself is initialised only in the rank process.
"""

import os
from typing import Tuple

import torch.distributed as dist
from torch.utils.data import get_worker_info


def rank_and_world() -> Tuple[int, int]:
    """(rank, world size); (0, 1) outside a multi-rank run."""
    if "RANK" in os.environ and "WORLD_SIZE" in os.environ:
        return int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def reader_position() -> Tuple[int, int, int, int]:
    """(rank, world size, DataLoader worker, workers): which reader of the job's a stream's copy is; the
    worker is 0 of 1 in the rank process itself."""
    info = get_worker_info()
    return (*rank_and_world(), *((info.id, info.num_workers) if info is not None else (0, 1)))
