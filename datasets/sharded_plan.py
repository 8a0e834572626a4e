"""The plan-time warning of a dataset split by whole shards across ranks and workers (WebDataset,
MDS, a Parquet stream): readers left without a shard (pipebench/model/shards.py's `idle_line`)."""

from typing import Tuple

from pipebench.config.specs import JobSpec
from pipebench.model.shards import idle_line
from pipebench.storage.dataset_contract import DatasetContract


class ShardedPlan(DatasetContract):
    """The dataset contract of a sharded dataset, whose `shard_count()` says how many shards it splits."""

    def plan_warnings(self, spec: JobSpec) -> Tuple[str, ...]:
        line = idle_line(spec.dataset_name, self.shard_count(), spec.distributed.nproc, spec.workers)
        return (line,) if line else ()
