"""A streaming (IterableDataset) view of any map-style dataset, sharded by rank and by worker.

Stream-style datasets (tar shards, record files, a database cursor) decide for themselves which
samples a process reads, so DistributedSampler cannot help them: each copy of the stream must
take its own disjoint share, one share per (rank, DataLoader worker). This dataset shows the
correct way: shard `k` of `ranks x workers` reads indices k, k + n, k + 2n, ... of the source.
`shard=false` reproduces the classic bug (every copy reads everything) that pipebench's
exactly-once check reports as duplicates.
"""

from __future__ import annotations

from typing import Any, Iterator, Tuple

from torch.utils.data import IterableDataset

from pipebench.storage.dataset_contract import DatasetContract, told
from pipebench.storage.rank_info import reader_position


def shard_of(rank: int, world: int, worker: int, workers: int) -> Tuple[int, int]:
    """(this copy's shard, number of shards): rank-major, so each rank's workers are adjacent."""
    return rank * workers + worker, world * workers


class ShardedStream(IterableDataset, DatasetContract):
    """Yields `(index, sample, target)` for this process's share of `source`, in index order.

    `source` is any map-style dataset (a `_target_` node in the config, built by Hydra).
    Rank and world size come from torchrun's environment, the worker from `get_worker_info()`,
    both read when iteration starts, so they are right in every process whatever the start method.
    """

    def __init__(self, source: Any, shard: bool = True):
        self.source = source
        self.shard = bool(shard)

    def __len__(self) -> int:
        return len(self.source)

    def __iter__(self) -> Iterator[Tuple[int, Any, Any]]:
        start, step = shard_of(*reader_position()) if self.shard else (0, 1)
        for index in range(start, len(self.source), step):
            yield (index, *self.source[index])

    @property
    def reads(self) -> Any:
        """The source's file reader (pipebench.storage.file_reads), if it reads files."""
        return getattr(self.source, "reads", None)

    def files(self) -> list:
        """The source's files (its dataset contract's, `told`)."""
        return told(self.source).files()

    def notes(self) -> tuple:
        """The source's notes on how it was built."""
        return told(self.source).notes()

    def describe(self, index: int) -> str:
        return told(self.source).describe(index) if index >= 0 else f"sample {index}"

    def identity(self) -> dict:
        return {"name": "sharded_stream", "shard": self.shard, "source": told(self.source).identity()}
