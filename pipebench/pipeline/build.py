"""Turn a JobSpec into live objects: the dataset, the instrumented chains and the DataLoader."""

import sys

from typing import Any, Callable, List, Mapping, Optional, Sequence, Tuple

import torch
from torch.utils.data import (
    DataLoader,
    DistributedSampler,
    IterableDataset,
    RandomSampler,
    SequentialSampler,
)

from pipebench.base.errors import ConfigError
from pipebench.config.specs import JobSpec
from pipebench.pipeline.file_reads import file_reads_of, honoured
from pipebench.pipeline.instantiate import instantiate_node
from pipebench.pipeline.device_chain import DeviceChain
from pipebench.pipeline.rank_info import rank_and_world
from pipebench.pipeline.recipe import open_recipes
from pipebench.pipeline.timed_chain import InstrumentedDataset, TimedCollate, WorkerInit
from pipebench.pipeline.timed_iterable import InstrumentedIterable


def build_transforms(nodes: Sequence[Mapping[str, Any]], where: str) -> List[Callable]:
    return [instantiate_node(node, f"{where}[{i}]") for i, node in enumerate(nodes)]


def build_dataset(spec: JobSpec) -> Any:
    dataset = instantiate_node(spec.dataset, "dataset")
    if isinstance(dataset, IterableDataset) and not hasattr(dataset, "__len__"):
        raise ConfigError(f"dataset ({spec.dataset.get('_target_')}): an IterableDataset must define __len__, "
                          "the number of samples in an epoch (pipebench checks each is read once)")
    if len(dataset) < spec.loader.batch_size and spec.loader.drop_last:
        raise ConfigError(
            f"dataset has {len(dataset)} samples, fewer than loader.batch_size={spec.loader.batch_size} "
            "with loader.drop_last=true: no batch would ever be made"
        )
    return dataset


def build_pipeline(spec: JobSpec) -> Tuple[Any, InstrumentedDataset, TimedCollate]:
    """The user's dataset, reading its files as `dataset.cache` / `dataset.storage` say, wrapped
    so every step of the chain is timed where it runs."""
    dataset = build_dataset(spec)
    reads = file_reads_of(dataset)
    if reads is not None:
        reads.use(honoured(spec.storage))
    wrapper = InstrumentedIterable if isinstance(dataset, IterableDataset) else InstrumentedDataset
    opened = open_recipes(spec.per_sample)
    for note in opened.notes:
        print(f"notice: {note}", file=sys.stderr, flush=True)
    instrumented = wrapper(dataset, build_transforms(opened.nodes, "transform.per_sample"))
    collate = TimedCollate(build_transforms(spec.per_batch, "transform.per_batch"))
    return dataset, instrumented, collate


def build_device_chain(spec: JobSpec) -> DeviceChain:
    """transform.on_device: the steps the main process runs on each batch after the copy."""
    return DeviceChain(build_transforms(spec.on_device, "transform.on_device"))


def pin_memory_effective(spec: JobSpec) -> bool:
    """Pinning needs an accelerator; without one DataLoader warns and does nothing useful."""
    return spec.loader.pin_memory and torch.cuda.is_available()


def build_sampler(spec: JobSpec, dataset: InstrumentedDataset) -> Optional[Any]:
    """None for an iterable dataset (it shards itself); a DistributedSampler in a multi-rank run
    (same seed on every rank, so the shares are disjoint); else random or sequential order."""
    if isinstance(dataset, IterableDataset):
        return None
    rank, world = rank_and_world()
    if world > 1:
        return DistributedSampler(dataset, num_replicas=world, rank=rank, shuffle=spec.loader.shuffle,
                                  seed=spec.run.seed, drop_last=spec.loader.drop_last)
    generator = torch.Generator().manual_seed(spec.run.seed)
    return RandomSampler(dataset, generator=generator) if spec.loader.shuffle else SequentialSampler(dataset)


def build_loader(spec: JobSpec, dataset: InstrumentedDataset, collate: TimedCollate,
                 trace_session: Optional[Any] = None) -> DataLoader:
    """A DataLoader as the user asked for it; worker-only arguments are dropped at workers=0.

    `trace_session` (a viztrace.VizTraceSession) makes every worker start its own recorder.
    """
    sampler = build_sampler(spec, dataset)
    kwargs = dict(
        batch_size=spec.loader.batch_size,
        sampler=sampler,
        drop_last=spec.loader.drop_last,
        collate_fn=collate,
        num_workers=spec.workers,
        pin_memory=pin_memory_effective(spec),
    )
    if spec.workers > 0:
        # DataLoader raises a ValueError for these with num_workers=0: they configure workers.
        kwargs.update(
            prefetch_factor=spec.loader.prefetch_factor,
            persistent_workers=spec.loader.persistent_workers,
            multiprocessing_context=spec.loader.multiprocessing_context,
            timeout=spec.loader.timeout_s,
            worker_init_fn=WorkerInit(spec.loader.sharing_strategy, trace_session),
        )
    return DataLoader(dataset, **kwargs)
