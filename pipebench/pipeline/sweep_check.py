"""A sweep's jobs built before anything is measured: chains, datasets and loader backends, each
dataset once, and the plan-time lines of what the builds show.

The builds import what the chains and datasets need (torch, torchvision: seconds); the command
runs this in a child of its job process, which has them already (pipebench.sweep.build_check).
"""

import sys
from typing import Any, Dict, List, Sequence

from pipebench.config.specs import JobSpec
from pipebench.datasets.parquet_rows import ParquetRows
from pipebench.datasets.row_group_reads import random_access_line
from pipebench.datasets.shard_split import idle_line
from pipebench.pipeline.build import build_dataset, build_transforms
from pipebench.pipeline.loader_backends import check_backends

__all__ = ["check_sweep_builds", "dataset_notes", "idle_shard_lines", "random_access_lines"]


def check_sweep_builds(specs: Sequence[JobSpec]) -> None:
    """Build every job's chains and each distinct dataset once, check every backend can read its
    dataset (ConfigError), and print the plan-time warnings to stderr."""
    datasets_built: Dict[str, Any] = {}
    backends = []
    for spec in specs:
        build_transforms(spec.per_sample, "transform.per_sample")
        build_transforms(spec.per_batch, "transform.per_batch")
        key = repr(sorted(spec.dataset.items())) + f"|{spec.loader.batch_size}|{spec.loader.drop_last}"
        if key not in datasets_built:
            datasets_built[key] = build_dataset(spec)
        backends.append((spec.loader.backend, datasets_built[key]))
    # Every backend's library is installed (all the missing ones named in one line) and can read its
    # dataset, before any job runs.
    check_backends(backends)
    datasets = [dataset for _, dataset in backends]
    for line in dict.fromkeys([*idle_shard_lines(specs, datasets), *random_access_lines(specs, datasets)]):
        print(f"warning: {line}", file=sys.stderr, flush=True)
    for line in dataset_notes(datasets):
        print(f"note: {line}", file=sys.stderr, flush=True)


def dataset_notes(datasets: Sequence[Any]) -> List[str]:
    """Each distinct dataset's plan-time notes (`plan_notes`): what its build found about how it reads,
    such as a LitData set of decoded images, whose decode is in the load row."""
    lines = (line for dataset in datasets for line in getattr(dataset, "plan_notes", tuple)())
    return list(dict.fromkeys(lines))


def idle_shard_lines(specs: Sequence[JobSpec], datasets: Sequence[Any]) -> List[str]:
    """The plan-time line of each job whose sharded dataset has fewer shards than ranks x workers."""
    lines = (idle_line(spec.dataset_name, dataset.shard_count(), spec.distributed.nproc, spec.workers)
             for spec, dataset in zip(specs, datasets) if hasattr(dataset, "shard_count"))
    return [line for line in lines if line]


def random_access_lines(specs: Sequence[JobSpec], datasets: Sequence[Any]) -> List[str]:
    """The plan-time line of each job that reads a map-style Parquet set under a shuffling sampler
    (datasets/row_group_reads.py): nothing measured yet, so the rows a sample reads."""
    lines = (random_access_line(dataset.identity(), spec.loader.shuffle)
             for spec, dataset in zip(specs, datasets) if isinstance(dataset, ParquetRows))
    return [line for line in lines if line]
