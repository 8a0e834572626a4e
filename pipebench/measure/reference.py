"""A plain, hand-written training loop: the yardstick pipebench's own measurement is checked against.

The same dataset, chain, DataLoader settings and kind of consumer, but its own DataLoader, collate
and two clocks (the wait in next(), the steps' wall time): no timed chain, no records, no meter.
`harness_loop` is pipebench's own job measurement of the same window.
"""

import dataclasses
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable, Optional, Sequence, Tuple

import torch
from torch import nn
from torch.utils.data import (
    DataLoader,
    Dataset,
    RandomSampler,
    SequentialSampler,
    default_collate,
)

from pipebench.base.errors import ConfigError
from pipebench.config.specs import JobSpec
from pipebench.measure.job import measure_job
from pipebench.measure.steps import warmup_steps, window_steps
from pipebench.pipeline.build import build_dataset, build_transforms
from pipebench.pipeline.loader_backends import pin_memory_effective
from pipebench.pipeline.consumers import ToyCNN
from pipebench.record.figures import Summary


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


class PlainCollate:
    """default_collate, then the batch transforms: in the worker, where pipebench's collate runs them."""

    def __init__(self, transforms: Sequence[Callable]) -> None:
        self.transforms = list(transforms)

    def __call__(self, samples):
        data, labels = default_collate(samples)
        for transform in self.transforms:
            data = transform(data)
        return data, labels


@dataclass(frozen=True)
class LoopMeasurement:
    """A loop's throughput and its share of step time spent waiting in next(loader)."""

    samples_per_s: float
    starvation_pct: float


class PlainSleep:
    """The emulated accelerator, by hand: the batch onto the device (when there is one), then a sleep."""

    def __init__(self, step_ms: float, device: Optional[torch.device], non_blocking: bool) -> None:
        self.sleep_s = step_ms / 1000.0
        self.device = device
        self.non_blocking = non_blocking

    def __call__(self, data: torch.Tensor, labels: torch.Tensor) -> None:
        if self.device is not None:
            data.to(self.device, non_blocking=self.non_blocking)
            torch.cuda.synchronize()
        time.sleep(self.sleep_s)


class PlainTraining:
    """The toy CNN trained by hand (CrossEntropyLoss, SGD), built on the first batch. On CUDA each
    step ends in torch.cuda.synchronize(), or the loop would time the launches; `run_ahead`: no wait
    at all, as training runs (the loop synchronises its window's ends instead)."""

    def __init__(self, lr: float, momentum: float, device: torch.device, non_blocking: bool,
                 run_ahead: bool = False) -> None:
        self.lr = lr
        self.momentum = momentum
        self.device = device
        self.non_blocking = non_blocking
        self.run_ahead = run_ahead
        self.loss_fn = nn.CrossEntropyLoss()
        self.model: Optional[ToyCNN] = None
        self.optimizer: Optional[torch.optim.Optimizer] = None

    def __call__(self, data: torch.Tensor, labels: torch.Tensor) -> None:
        if self.model is None:
            self.model = ToyCNN(int(data.shape[-1])).to(self.device).train()
            self.optimizer = torch.optim.SGD(self.model.parameters(), lr=self.lr, momentum=self.momentum)
        x = data.to(self.device, non_blocking=self.non_blocking)
        x = x.float().div_(255) if x.dtype == torch.uint8 else x.float()
        y = labels.to(self.device, non_blocking=self.non_blocking).long()
        loss = self.loss_fn(self.model(x), y)
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        self.optimizer.step()
        if self.device.type == "cuda" and not self.run_ahead:
            torch.cuda.synchronize()


def _plain_consumer(spec: JobSpec, non_blocking: bool, run_ahead: bool = False
                    ) -> Callable[[torch.Tensor, torch.Tensor], None]:
    """none, emulated or toy_cnn, on the device pipebench's consumer of that kind would use."""
    kind = spec.consumer.kind
    cuda = torch.device("cuda") if torch.cuda.is_available() else None
    if kind == "none":
        return lambda data, labels: None
    if kind == "emulated":
        return PlainSleep(spec.consumer.step_ms, cuda, non_blocking)
    if kind == "toy_cnn":
        device = torch.device("cpu") if spec.consumer.device == "cpu" or cuda is None else cuda
        return PlainTraining(spec.consumer.lr, spec.consumer.momentum, device, non_blocking, run_ahead)
    raise ConfigError(f"the plain loop feeds consumer none, emulated or toy_cnn, not {kind!r}")


def plain_loader(spec: JobSpec) -> DataLoader:
    """The DataLoader a user would write for `spec`: same dataset, chain, sampler seed and settings."""
    dataset = PlainDataset(build_dataset(spec), build_transforms(spec.per_sample, "per_sample"))
    generator = torch.Generator().manual_seed(spec.run.seed)
    sampler = RandomSampler(dataset, generator=generator) if spec.loader.shuffle else SequentialSampler(dataset)
    extra = dict(prefetch_factor=spec.loader.prefetch_factor, persistent_workers=spec.loader.persistent_workers,
                 multiprocessing_context=spec.loader.multiprocessing_context,
                 timeout=spec.loader.timeout_s) if spec.workers else {}
    return DataLoader(dataset, batch_size=spec.loader.batch_size, sampler=sampler, drop_last=spec.loader.drop_last,
                      collate_fn=PlainCollate(build_transforms(spec.per_batch, "per_batch")),
                      num_workers=spec.workers, pin_memory=pin_memory_effective(spec), **extra)


def plain_loop(spec: JobSpec, run_ahead: bool = False, loader: Optional[Iterable[Tuple[Any, Any]]] = None
               ) -> LoopMeasurement:
    """Time a plain loop over the harness's own window: after its warm-up (first batch, then
    `warmup_steps(spec)`), `window_steps(spec)` steps, whole worker cycles, so the two are compared
    on the same steady state (a cycle and a part can count most of two bursts of W batches in one
    cycle's time). An epoch's end starts the next one inside the timed steps.

    `loader`: each `iter()` one epoch of (data, labels); by default `plain_loader(spec)`.
    `run_ahead` (toy_cnn on CUDA): an asynchronous training loop, the GPU synchronised only before
    and after the timed steps, as pipebench's run.sync=async window is."""
    loader = plain_loader(spec) if loader is None else loader
    consume = _plain_consumer(spec, non_blocking=pin_memory_effective(spec), run_ahead=run_ahead)
    settle = torch.cuda.synchronize if run_ahead and torch.cuda.is_available() else (lambda: None)
    epoch = iter(loader)

    def next_batch() -> Tuple[Any, Any]:
        nonlocal epoch
        try:
            return next(epoch)
        except StopIteration:
            epoch = iter(loader)
            return next(epoch)

    for _ in range(1 + warmup_steps(spec)):
        consume(*next_batch())
    settle()
    samples = 0
    wait_s = 0.0
    start = time.perf_counter()
    for _ in range(window_steps(spec)):
        before = time.perf_counter()
        data, labels = next_batch()
        wait_s += time.perf_counter() - before
        consume(data, labels)
        samples += len(labels)
        # Free the batch (its shared memory, with workers) before the next wait starts: the time
        # blocked in next() is the wait for data, not the release of the last batch. The step's
        # wall time still pays for it, as pipebench's step loop pays for it in its own gap.
        del data, labels
    settle()
    elapsed = time.perf_counter() - start
    del epoch
    return LoopMeasurement(samples / elapsed, 100.0 * wait_s / elapsed)


def window_spec(spec: JobSpec, steps: int, warmup: int) -> JobSpec:
    """`spec` measured over exactly `steps` steps after `warmup`: one repeat, no time floor, no
    profiled steps, no progress bar (both loops run the same window)."""
    run = dataclasses.replace(spec.run, steps=steps, warmup_steps=warmup, min_time_s=0.0, repeats=1,
                              profile_steps=0, progress=False)
    return dataclasses.replace(spec, run=run)


def harness_summary(spec: JobSpec) -> Summary:
    """pipebench's own job measurement (`measure_job`, in this process) of `spec`: its summary row
    (benchmarks/async_loop_check.py reads its sync mode and utilisations too)."""
    with tempfile.TemporaryDirectory() as job_dir:
        return measure_job(spec, Path(job_dir)).summary


def harness_loop(spec: JobSpec) -> LoopMeasurement:
    """pipebench's own job measurement of `spec`, as a LoopMeasurement."""
    summary = harness_summary(spec)
    return LoopMeasurement(summary.samples_per_s, summary.starvation_pct)
