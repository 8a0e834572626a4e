"""A plain, hand-written DataLoader loop: the yardstick pipebench's own meters are checked against.

It reads the same dataset through the same chain with the same DataLoader settings, but with
no timed chain, no per-step records and no collate wrapper: what a user would write by hand.
"""

import time
from dataclasses import dataclass
from typing import Callable, Sequence

import torch
from torch.utils.data import DataLoader, Dataset, RandomSampler, SequentialSampler

from pipebench.config.specs import JobSpec
from pipebench.measure.runner import warmup_steps
from pipebench.pipeline.build import build_dataset, build_transforms


class PlainDataset(Dataset):
    """Load, apply the transforms, return (sample, label)."""

    def __init__(self, base: Dataset, transforms: Sequence[Callable]) -> None:
        self.base = base
        self.transforms = list(transforms)

    def __len__(self) -> int:
        return len(self.base)

    def __getitem__(self, index: int):
        sample, label = self.base[index]
        for transform in self.transforms:
            sample = transform(sample)
        return sample, label


@dataclass(frozen=True)
class PlainMeasurement:
    samples_per_s: float
    starvation_pct: float


def plain_loop(spec: JobSpec, steps: int) -> PlainMeasurement:
    """Time `steps` steps of a plain loop; an emulated consumer sleeps `consumer.step_ms` per step.

    It warms up exactly as the harness does, so the two are compared on the same steady state.
    """
    warmup = warmup_steps(spec)
    dataset = PlainDataset(build_dataset(spec), build_transforms(spec.per_sample, "per_sample"))
    batch_transforms = build_transforms(spec.per_batch, "per_batch")
    generator = torch.Generator().manual_seed(spec.run.seed)
    sampler = RandomSampler(dataset, generator=generator) if spec.loader.shuffle else SequentialSampler(dataset)
    extra = dict(prefetch_factor=spec.loader.prefetch_factor) if spec.workers else {}
    loader = DataLoader(dataset, batch_size=spec.loader.batch_size, sampler=sampler, drop_last=True,
                        num_workers=spec.workers, **extra)
    sleep_s = spec.consumer.step_ms / 1000.0 if spec.consumer.kind == "emulated" else 0.0
    iterator = iter(loader)
    for _ in range(1 + warmup):
        next(iterator)
        time.sleep(sleep_s)
    samples = 0
    wait = 0.0
    start = time.perf_counter()
    for _ in range(steps):
        before = time.perf_counter()
        data, _labels = next(iterator)
        for transform in batch_transforms:
            data = transform(data)
        wait += time.perf_counter() - before
        time.sleep(sleep_s)
        samples += data.shape[0]
    elapsed = time.perf_counter() - start
    del iterator
    return PlainMeasurement(samples / elapsed, 100.0 * wait / elapsed)
