"""Overhead of pipebench's measurement per loader backend, against a plain loop of that backend.

For each `loader.backend` the harness side is the real job code (`measure_job`: the timed chain
in the workers or the pool's threads, per-step records, the meters); the plain side is what a
user writes by hand with that library, with none of pipebench's chain or meters:

- dataloader: `pipebench.measure.reference.plain_loader` (a DataLoader over the bare chain);
- threads: torchdata.nodes, ParallelMapper(method="thread") over the bare chain, Batcher, the
  collate as a Mapper, PinMemory when pinning, Prefetcher, Loader;
- spdl: an SPDL pipeline, the bare chain on a pool of `workers` threads, aggregate, the collate,
  the pin when pinning, a prefetching sink.

Both sides run the same dataset, chain, sampler seed, batch, worker count and prefetch, built
the way the backend builds its own (the same pool and queues), and time the same window
(`reference.plain_loop`: the first batch and the harness's warm-up, then the harness's window:
`--steps`, but at least `run.worker_cycles` whole worker cycles). Rounds are counterbalanced:
odd rounds run plain, harness, plain and even rounds harness, plain, harness, so drift hits both
sides alike and a cost of running in the middle (or after the other side) cancels over rounds
instead of passing for the harness's own. Each side ends with the threads it started ended
(`alone`), so none runs on beside the next. The side run twice gives an A/A figure: the noise floor
below which no ratio can be told from 1 here. Prints a markdown table of medians over rounds.

    python benchmarks/backend_overhead.py                          # yuv_mask_fast, workers=2, 5 rounds
    python benchmarks/backend_overhead.py --rounds 3 --backends threads spdl consumer=emulated
"""

import argparse
import gc
import statistics
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Callable, Iterator, List, Optional, Tuple

import torch
from plain_loop_check import RATIO_HIGH, RATIO_LOW, check_epoch_covers_window
from torch.utils.data import RandomSampler, SequentialSampler
from torch.utils.data._utils.pin_memory import pin_memory

from pipebench.config.compose import compose_job_spec
from pipebench.config.specs import LOADER_BACKENDS, JobSpec
from pipebench.measure.reference import (
    PlainCollate,
    PlainDataset,
    harness_loop,
    plain_loader,
    plain_loop,
    window_spec,
)
from pipebench.measure.steps import window_steps
from pipebench.measure.setup import quiet_torch_output
from pipebench.pipeline.build import build_dataset, build_transforms
from pipebench.pipeline.loader_backends import pin_memory_effective

DEFAULT_OVERRIDES = ("transform=yuv_mask_fast", "consumer=none")


class _PlainThreadChain:
    """What both hand-written thread loops share: the bare chain, its collate, the seeded order."""

    def __init__(self, spec: JobSpec) -> None:
        self.dataset = PlainDataset(build_dataset(spec), build_transforms(spec.per_sample, "per_sample"))
        self.collate = PlainCollate(build_transforms(spec.per_batch, "per_batch"))
        generator = torch.Generator().manual_seed(spec.run.seed)
        self.order = (RandomSampler(self.dataset, generator=generator) if spec.loader.shuffle
                      else SequentialSampler(self.dataset))
        self.workers = spec.workers
        self.batch_size = spec.loader.batch_size
        self.drop_last = spec.loader.drop_last
        self.prefetch = spec.loader.prefetch_factor
        self.pin = pin_memory_effective(spec)
        self.timeout_s = spec.loader.timeout_s


class PlainNodes(_PlainThreadChain):
    """torchdata.nodes by hand; each iter() a fresh graph, one epoch of (data, labels)."""

    def __iter__(self) -> Iterator[Tuple[Any, Any]]:
        import torchdata.nodes as nodes

        node = nodes.ParallelMapper(nodes.IterableWrapper(self.order), self.dataset.__getitem__,
                                    num_workers=self.workers, in_order=True, method="thread")
        node = nodes.Mapper(nodes.Batcher(node, self.batch_size, drop_last=self.drop_last), self.collate)
        if self.pin:
            node = nodes.PinMemory(node)
        return iter(nodes.Loader(nodes.Prefetcher(node, prefetch_factor=self.prefetch)))


class PlainSpdl(_PlainThreadChain):
    """An SPDL pipeline by hand; each iter() a fresh pipeline, one epoch of (data, labels)."""

    def __iter__(self) -> Iterator[Tuple[Any, Any]]:
        from spdl.pipeline import AsyncQueue, PipelineBuilder

        pool = ThreadPoolExecutor(max_workers=self.workers)
        builder = (PipelineBuilder().add_source(list(self.order))
                   .pipe(self.dataset.__getitem__, concurrency=self.workers, executor=pool, output_order="input")
                   .aggregate(self.batch_size, drop_last=self.drop_last).pipe(self.collate))
        if self.pin:
            builder = builder.pipe(pin_memory)
        pipeline = builder.add_sink(self.prefetch).build(num_threads=self.workers + 1, queue_class=AsyncQueue,
                                                         task_hook_factory=lambda stage: [])
        try:
            with pipeline.auto_stop():
                yield from pipeline.get_iterator(timeout=self.timeout_s)
        finally:
            pool.shutdown(wait=False, cancel_futures=True)


PLAIN_LOADERS = {"dataloader": plain_loader, "threads": PlainNodes, "spdl": PlainSpdl}


@dataclass(frozen=True)
class Round:
    """One round of one backend: each side's samples/s (the mean of its two runs for the side run
    twice), and that side's A/A spread."""

    plain: float
    harness: float
    aa_pct: float

    @property
    def ratio(self) -> float:
        return self.harness / self.plain


def counterbalanced(index: int, plain: Callable[[], float], harness: Callable[[], float]) -> Round:
    """Round `index` (from 0): plain, harness, plain when even, harness, plain, harness when odd."""
    twice, once = (plain, harness) if index % 2 == 0 else (harness, plain)
    first, middle, last = twice(), once(), twice()
    outer = (first + last) / 2
    aa_pct = abs(first - last) / outer * 100
    return Round(outer, middle, aa_pct) if index % 2 == 0 else Round(middle, outer, aa_pct)


# How long a side's own threads get to end after it (a pool shut down without waiting ends its
# threads as each sees the shutdown: milliseconds). A thread that outlives this (tqdm's monitor,
# which sleeps) is left running.
SIDE_THREADS_END_S = 2.0


def alone(side: Callable[[], float]) -> Callable[[], float]:
    """`side`, ending with the threads it started ended, so none runs beside the next side. A
    dropped torchdata graph keeps its 5 threads (about 0.17 of a core, measured here) until it is
    collected: the plain threads loop's graph ran on beside the harness (one 6-round run read
    threads at 0.850; two runs since, each side alone, 0.954 and 0.973)."""

    def run() -> float:
        before = set(threading.enumerate())
        rate = side()
        gc.collect()
        deadline = time.monotonic() + SIDE_THREADS_END_S
        for thread in set(threading.enumerate()) - before:
            thread.join(timeout=max(deadline - time.monotonic(), 0.0))
        return rate

    return run


def measure_round(spec: JobSpec, index: int) -> Round:
    loader = PLAIN_LOADERS[spec.loader.backend]
    return counterbalanced(index, alone(lambda: plain_loop(spec, loader=loader(spec)).samples_per_s),
                           alone(lambda: harness_loop(spec).samples_per_s))


def verdict(ratio: float, aa_pct: float) -> str:
    """PASS inside the target; outside it, FAIL only where the miss is larger than the A/A spread
    (the twice-run side's own difference), else it is within this machine's noise."""
    if RATIO_LOW <= ratio <= RATIO_HIGH:
        return "PASS"
    return "within noise" if abs(ratio - 1) * 100 <= aa_pct else "FAIL"


def table(results: dict) -> str:
    lines = ["| backend | plain samples/s | pipebench samples/s | ratio (range) | A/A % | target | verdict |",
             "|---|---:|---:|---|---:|---|---|"]
    for backend, rounds in results.items():
        ratios = [r.ratio for r in rounds]
        ratio = statistics.median(ratios)
        aa_pct = statistics.median(r.aa_pct for r in rounds)
        lines.append(f"| {backend} | {statistics.median(r.plain for r in rounds):.1f} "
                     f"| {statistics.median(r.harness for r in rounds):.1f} "
                     f"| {ratio:.3f} ({min(ratios):.3f}–{max(ratios):.3f}) "
                     f"| {aa_pct:.1f} | {RATIO_LOW}–{RATIO_HIGH} | {verdict(ratio, aa_pct)} |")
    return "\n".join(lines)


def main(argv: Optional[List[str]] = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=15)
    parser.add_argument("--warmup", type=int, default=4, help="warm-up steps (at least workers x prefetch)")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--backends", nargs="+", default=list(LOADER_BACKENDS), choices=LOADER_BACKENDS)
    parser.add_argument("overrides", nargs="*", default=list(DEFAULT_OVERRIDES))
    args = parser.parse_args(argv)
    quiet_torch_output()
    # One intra-op thread, as pipebench runs thread-backend jobs and every worker process.
    torch.set_num_threads(1)
    specs = {backend: window_spec(compose_job_spec([*args.overrides, f"workers={args.workers}",
                                                    f"loader.backend={backend}"]), args.steps, args.warmup)
             for backend in args.backends}
    for spec in specs.values():
        check_epoch_covers_window(spec)
    window = window_steps(next(iter(specs.values())))
    print(f"overrides: {' '.join(args.overrides)} workers={args.workers}; {args.rounds} rounds x {window} steps "
          "per backend, plain, pipebench, plain then pipebench, plain, pipebench", flush=True)
    started = time.perf_counter()
    results = {backend: [] for backend in specs}
    for round_ in range(args.rounds):
        for backend, spec in specs.items():
            measured = measure_round(spec, round_)
            results[backend].append(measured)
            print(f"round {round_ + 1} {backend}: plain {measured.plain:.1f}/s, pipebench {measured.harness:.1f}/s, "
                  f"A/A {measured.aa_pct:.1f}% ({'plain' if round_ % 2 == 0 else 'pipebench'} twice)", flush=True)
    print(f"\n{table(results)}\n")
    print(f"ratio: pipebench samples/s over plain, the side run twice as its mean; medians of the rounds, range "
          f"in brackets; a ratio within the A/A spread of 1 is below this machine's noise floor "
          f"({time.perf_counter() - started:.0f} s)")


if __name__ == "__main__":
    main()
