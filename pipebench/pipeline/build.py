"""Turn a JobSpec into live objects: the dataset, the instrumented chains, the loader backend,
the device chain and the consumer. `build_job` builds them all at once, so a job's measuring
code gets built parts and never reads the config's nodes itself."""

import sys
from dataclasses import dataclass
from typing import Any, Callable, List, Mapping, Optional, Sequence, Tuple

from torch.utils.data import IterableDataset

from pipebench.base.errors import ConfigError
from pipebench.config.specs import JobSpec
from pipebench.config.target_node import TargetNode
from pipebench.pipeline.consumers import Consumer, build_consumer
from pipebench.pipeline.device_chain import DeviceChain
from pipebench.storage.file_reads import file_reads_of, honoured
from pipebench.pipeline.instantiate import instantiate_node
from pipebench.pipeline.loader_backends import LoaderBackend, build_backend, pin_memory_effective
from pipebench.pipeline.recipe import open_recipes
from pipebench.pipeline.timed_chain import BatchReference, InstrumentedDataset, TimedCollate
from pipebench.pipeline.timed_iterable import InstrumentedIterable


def build_transforms(nodes: Sequence[Mapping[str, Any]], where: str) -> List[Callable]:
    return [instantiate_node(node, f"{where}[{i}]") for i, node in enumerate(nodes)]


def build_dataset(spec: JobSpec) -> Any:
    dataset = instantiate_node(spec.dataset, "dataset")
    if isinstance(dataset, IterableDataset) and not hasattr(dataset, "__len__"):
        raise ConfigError(f"dataset ({TargetNode.of(spec.dataset).target}): an IterableDataset must define __len__, "
                          "the number of samples in an epoch (pipebench checks each is read once)")
    if len(dataset) < spec.loader.batch_size and spec.loader.drop_last:
        raise ConfigError(
            f"dataset has {len(dataset)} samples, fewer than loader.batch_size={spec.loader.batch_size} "
            "with loader.drop_last=true: no batch would ever be made"
        )
    return dataset


def build_pipeline(spec: JobSpec, reference: Optional[BatchReference] = None
                   ) -> Tuple[Any, InstrumentedDataset, TimedCollate]:
    """The user's dataset, reading its files as `dataset.cache` / `dataset.storage` say, wrapped
    so every step of the chain is timed where it runs; the collate runs `reference` (calibrate=true)."""
    dataset = build_dataset(spec)
    reads = file_reads_of(dataset)
    if reads is not None:
        reads.use(honoured(spec.storage))
    wrapper = InstrumentedIterable if isinstance(dataset, IterableDataset) else InstrumentedDataset
    opened = open_recipes(spec.per_sample)
    for note in opened.notes:
        print(f"notice: {note}", file=sys.stderr, flush=True)
    instrumented = wrapper(dataset, build_transforms(opened.nodes, "transform.per_sample"))
    per_batch = build_transforms(spec.per_batch, "transform.per_batch")
    collate = TimedCollate(per_batch, reference, len(instrumented.steps))
    return dataset, instrumented, collate


@dataclass(frozen=True)
class JobParts:
    """What one job's config builds: the user's dataset, its timed chains, the loader backend over
    them, the steps after the copy, the consumer, and whether the copy is pinned."""

    dataset: Any
    instrumented: InstrumentedDataset
    collate: TimedCollate
    loader: LoaderBackend
    device_chain: DeviceChain
    consumer: Consumer
    pinned: bool


def build_job(spec: JobSpec, consumer_seed: int, reference: Optional[BatchReference] = None) -> JobParts:
    """Every part of the job `spec` names (a rank seeds its consumer apart); `reference`, the CPU
    reference the collate runs between batches (pipebench.measure.cpu_reference), under calibrate=true."""
    dataset, instrumented, collate = build_pipeline(spec, reference)
    return JobParts(dataset, instrumented, collate, build_backend(spec, instrumented, collate),
                    DeviceChain(build_transforms(spec.on_device, "transform.on_device")),
                    build_consumer(spec.consumer, consumer_seed), pin_memory_effective(spec))
