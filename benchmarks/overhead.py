"""Overhead of pipebench's instrumentation against a plain hand-written DataLoader loop.

Both loops read the same dataset through the same chain, with the same sampler seed and
DataLoader settings. Each round runs plain, instrumented, plain, so
machine drift hits both alike, and the two plain runs give an A/A figure: the noise floor
below which no overhead can be resolved on this machine. Prints the medians over rounds.

    python benchmarks/overhead.py                       # seed chain (fast dilation), workers 0 and 2
    python benchmarks/overhead.py transform=yuv_mask workers=2 --rounds 6 --steps 20
"""

import argparse
import statistics
import time
from typing import Callable, List, Sequence

import torch
from torch.utils.data import DataLoader, Dataset, RandomSampler

from pipebench.build import build_dataset, build_loader, build_pipeline, build_transforms
from pipebench.configs import compose_job_spec
from pipebench.consumers import NoConsumer
from pipebench.runner import BatchStream, StepLoop, TimingSink
from pipebench.specs import JobSpec

# Issue #2's target: the harness costs at most this much throughput.
TARGET_OVERHEAD_PCT = 3.0


class PlainDataset(Dataset):
    """What a user writes by hand: load, apply the transforms, return (sample, label)."""

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


def plain_rate(spec: JobSpec, steps: int, warmup: int) -> float:
    dataset = PlainDataset(build_dataset(spec), build_transforms(spec.per_sample, "per_sample"))
    batch_transforms = build_transforms(spec.per_batch, "per_batch")
    sampler = RandomSampler(dataset, generator=torch.Generator().manual_seed(spec.run.seed))
    extra = dict(prefetch_factor=spec.loader.prefetch_factor) if spec.workers else {}
    loader = DataLoader(dataset, batch_size=spec.loader.batch_size, sampler=sampler, drop_last=True,
                        num_workers=spec.workers, **extra)
    iterator = iter(loader)
    for _ in range(1 + warmup):
        next(iterator)
    samples = 0
    start = time.perf_counter()
    for _ in range(steps):
        data, _labels = next(iterator)
        for transform in batch_transforms:
            data = transform(data)
        samples += data.shape[0]
    rate = samples / (time.perf_counter() - start)
    del iterator
    return rate


def instrumented_rate(spec: JobSpec, steps: int, warmup: int) -> float:
    _, instrumented, collate = build_pipeline(spec)
    stream = BatchStream(build_loader(spec, instrumented, collate), spec.run.on_error)
    loop = StepLoop(stream, NoConsumer(), device=None, non_blocking=False)
    sink = TimingSink()
    for _ in range(1 + warmup):
        loop.step(None)
    measured = [loop.step(sink) for _ in range(steps)]
    stream.close()
    return sum(s.samples for s in measured) * 1e9 / sum(s.step_ns for s in measured)


def main(argv: List[str] = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=15)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--workers", type=int, nargs="+", default=[0, 2])
    parser.add_argument("overrides", nargs="*", default=["transform=yuv_mask_fast"])
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    print(f"overrides: {' '.join(args.overrides)}; {args.rounds} rounds x {args.steps} steps, interleaved\n")
    print("| workers | plain samples/s | pipebench samples/s | overhead % | A/A plain vs plain % |")
    print("|---:|---:|---:|---:|---:|")
    for workers in args.workers:
        spec = compose_job_spec([*args.overrides, f"workers={workers}"])
        plain, timed, spread = [], [], []
        for _ in range(args.rounds):
            first, timed_rate, second = (measure(spec, args.steps, args.warmup)
                                         for measure in (plain_rate, instrumented_rate, plain_rate))
            plain.append((first + second) / 2)
            timed.append(timed_rate)
            spread.append(abs(first - second) / plain[-1] * 100)
        overhead = statistics.median((p - t) / p * 100 for p, t in zip(plain, timed))
        print(f"| {workers} | {statistics.median(plain):.1f} | {statistics.median(timed):.1f} | "
              f"{overhead:+.2f} | {statistics.median(spread):.2f} |")
    print(f"\ntarget: overhead within {TARGET_OVERHEAD_PCT}% (negative: pipebench measured faster); "
          "an overhead smaller than the A/A spread is below this machine's noise floor")


if __name__ == "__main__":
    main()
