"""Each step's thread-scaling profile: its rate alone at 1, 2, 4, ... threads, and the share of its
wall time it ran off the CPU, as SPDL's pipeline profiler (`spdl.pipeline.profile_pipeline`) runs
each stage alone at several concurrencies.

The chain runs once on the first samples to capture every step's inputs
(`pipebench.measure.step_inputs`); then each step is called alone by k threads at once, the same
number of calls at every k, seeded, with one intra-op torch thread (as the thread backends run).
Per call, thread CPU time (`time.thread_time_ns`) against wall time says how long it ran without
the CPU: with k within the usable cores, a share that grows with k is time spent queued for a lock
the threads share, the GIL first of all (`pipebench.measure.thread_verdict`).

A job runs the pass after its measured repeats (so it never touches them) under a thread backend,
or wherever `run.thread_profile=true` asks.
"""

import math
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Sequence, Tuple

import torch

from pipebench.config.specs import JobSpec
from pipebench.measure.setup import seed_everything
from pipebench.measure.step_inputs import StepCall, capture_steps
from pipebench.measure.thread_verdict import ScalingFigures, thread_verdict
from pipebench.pipeline.loader_backends import THREADS
from pipebench.pipeline.timed_chain import InstrumentedDataset, TimedCollate

__all__ = ["Level", "StepProfile", "ThreadProfile", "profile_step", "profile_wanted",
           "thread_counts", "thread_profile_pass"]

# One step's calls at 1 thread take about this long, and the same calls are made at every thread
# count. A quarter second spans ~50 of the GIL's 5 ms switch intervals and many scheduler slices,
# so a rate is not one slice's luck; 8 steps x 5 thread counts x 2 runs on a 16-core host cost ~20 s.
LEVEL_S = 0.25
# Each thread count runs this many times, interleaved (1, 2, 4, 1, 2, 4), and keeps its fastest run,
# as timeit keeps its best: a burst from another tenant, or a first run's page faults, slows one
# run, rarely both (with one run each, a collate once read 10x faster on 2 threads than on 1 on the
# 2-core machine: its 1-thread run had been slowed so).
RUNS = 2
# Each thread makes at least this many calls, so the last call's tail (one thread still busy while
# the others are done) weighs a quarter of a thread's time or less.
MIN_CALLS_PER_THREAD = 4
# A step of a few microseconds would need 10^5+ calls to fill LEVEL_S; there the four clock reads
# around each call are most of what is timed anyway.
MAX_CALLS = 100_000
# A step that uses up its input (a lazy image's decode) gets a freshly opened one per call, all
# opened before the timed calls: each holds its file's bytes (~125 KB for the default JPEGs).
MAX_FRESH_CALLS = 512
# The whole pass stops starting steps after this long, naming the ones left out: a chain of
# per-batch steps at a large batch could otherwise add minutes to a job.
PASS_BUDGET_S = 60.0
NS_PER_S = 1e9


def profile_wanted(spec: JobSpec, worker_kind: str) -> bool:
    """run.thread_profile: true or false as set; unset (null), under a backend whose workers are threads."""
    asked = spec.run.thread_profile
    return worker_kind == THREADS if asked is None else bool(asked)


def thread_counts(workers: int, cores: int) -> Tuple[Tuple[int, ...], bool]:
    """1, 2, 4, ... up to the job's workers (the usable cores when it has fewer than two), never past
    the usable cores; and whether the cores capped it (a thread past them waits for a core, which
    reads as off the CPU and hides the GIL)."""
    wanted = workers if workers >= 2 else cores
    top = max(1, min(wanted, cores))
    counts = [1 << i for i in range(top.bit_length()) if 1 << i < top]
    return (*counts, top), wanted > cores


@dataclass(frozen=True)
class Level:
    """One thread count: `calls` calls in `seconds`, their summed wall and thread CPU time."""

    threads: int
    calls: int
    seconds: float
    wall_ns: int
    cpu_ns: int

    @property
    def rate(self) -> float:
        return self.calls / self.seconds

    @property
    def off_cpu(self) -> float:
        """The share of the calls' wall time their threads were off the CPU (0..1)."""
        return min(max(1.0 - self.cpu_ns / self.wall_ns, 0.0), 1.0) if self.wall_ns > 0 else 0.0


@dataclass(frozen=True)
class StepProfile:
    """One step's levels (1 thread first), or why it has none."""

    stage: str
    transform: str
    levels: Tuple[Level, ...] = ()
    error: str = ""

    def figures(self) -> ScalingFigures:
        alone = self.levels[0].rate
        return ScalingFigures(tuple(level.threads for level in self.levels),
                              tuple(level.rate / alone for level in self.levels),
                              self.levels[0].off_cpu, self.levels[-1].off_cpu)

    def columns(self) -> Dict[str, Any]:
        """Its transforms.csv cells (record.results.PROFILE_COLUMNS); none when it was not profiled."""
        if not self.levels:
            return {}
        figures = self.figures()
        return {
            "profile_threads": figures.top_threads,
            "thread_speedup": figures.top_speedup,
            "thread_speedups": " ".join(f"{k}:{s:.2f}" for k, s in zip(figures.threads, figures.speedups)),
            "off_cpu_pct_1t": 100.0 * figures.off_cpu_alone,
            "off_cpu_pct_nt": 100.0 * figures.off_cpu_top,
            "thread_verdict": thread_verdict(figures),
        }

    def record(self) -> Dict[str, Any]:
        return {"stage": self.stage, "transform": self.transform, "error": self.error or None,
                "levels": [{"threads": level.threads, "calls": level.calls, "samples_per_s": level.rate,
                            "off_cpu_pct": 100.0 * level.off_cpu} for level in self.levels]}


@dataclass(frozen=True)
class ThreadProfile:
    """The job's profile: the thread counts, whether the cores capped them, each step's profile, and
    a note on what was left out ('' when nothing was)."""

    threads: Tuple[int, ...]
    backend: str
    # Whether the job's workers are threads: the report's advice differs.
    on_threads: bool
    workers: int
    usable_cores: int
    capped: bool
    steps: Tuple[StepProfile, ...]
    note: str = ""

    def columns(self, stage: str, transform: str) -> Dict[str, Any]:
        return next((step.columns() for step in self.steps if (step.stage, step.transform) == (stage, transform)), {})

    def record(self) -> Dict[str, Any]:
        return {"threads": list(self.threads), "backend": self.backend, "on_threads": self.on_threads,
                "workers": self.workers, "usable_cores": self.usable_cores,
                "capped_by_cores": self.capped, "note": self.note or None,
                "steps": [step.record() for step in self.steps]}


def _timed_calls(call: Callable[[Any], Any], inputs: Sequence[Any], threads: int) -> Level:
    """`inputs` split over `threads` threads that start together; each call timed in its thread."""
    gate = threading.Barrier(threads + 1)

    def work(offset: int) -> Tuple[int, int]:
        wall = cpu = 0
        gate.wait()
        for item in inputs[offset::threads]:
            cpu_start, start = time.thread_time_ns(), time.perf_counter_ns()
            call(item)
            wall += time.perf_counter_ns() - start
            cpu += time.thread_time_ns() - cpu_start
        return wall, cpu

    with ThreadPoolExecutor(threads, thread_name_prefix="pipebench-thread-profile") as pool:
        futures = [pool.submit(work, offset) for offset in range(threads)]
        gate.wait()
        start = time.perf_counter_ns()
        done = [future.result() for future in futures]
        seconds = (time.perf_counter_ns() - start) / NS_PER_S
    return Level(threads, len(inputs), seconds, sum(w for w, _ in done), sum(c for _, c in done))


def _calls_for(step: StepCall, counts: Sequence[int]) -> int:
    """Calls a level: LEVEL_S at one thread by a warm-up's pace, within the bounds, split evenly at every count."""
    warm = _timed_calls(step.call, step.inputs_for(len(step.inputs) or MIN_CALLS_PER_THREAD), 1)
    ceiling = MAX_FRESH_CALLS if step.fresh is not None else MAX_CALLS
    calls = min(max(math.ceil(LEVEL_S * warm.rate), MIN_CALLS_PER_THREAD * counts[-1]), ceiling)
    even = math.lcm(*counts)
    return max(even, calls // even * even)


def profile_step(step: StepCall, counts: Sequence[int], seed: int) -> StepProfile:
    """One step alone at each thread count, the same calls at each, the best of RUNS runs; a step that
    raises has its line instead."""
    best: Dict[int, Level] = {}
    try:
        calls = _calls_for(step, counts)
        for _ in range(RUNS):
            for threads in counts:
                inputs = step.inputs_for(calls)
                seed_everything(seed)
                level = _timed_calls(step.call, inputs, threads)
                if threads not in best or level.rate > best[threads].rate:
                    best[threads] = level
    except Exception as exc:  # a step that is not thread-safe, or fails called again: say so, go on
        return StepProfile(step.stage, step.name, error=f"{type(exc).__name__}: {exc}")
    return StepProfile(step.stage, step.name, tuple(best[threads] for threads in counts))


def thread_profile_pass(spec: JobSpec, dataset: InstrumentedDataset, collate: TimedCollate, worker_kind: str,
                        usable_cores: int) -> ThreadProfile:
    """Every step's profile, on one intra-op torch thread (restored after), within PASS_BUDGET_S."""
    counts, capped = thread_counts(spec.workers, usable_cores)
    intra_op = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        seed_everything(spec.run.seed)
        captured = capture_steps(dataset, collate, spec.loader.batch_size)
        started = time.perf_counter()
        steps: List[StepProfile] = []
        for step in captured.steps:
            if time.perf_counter() - started > PASS_BUDGET_S:
                break
            steps.append(profile_step(step, counts, spec.run.seed))
    finally:
        torch.set_num_threads(intra_op)
    left = [step.name for step in captured.steps[len(steps):]]
    notes = [captured.note, f"stopped after {PASS_BUDGET_S:g} s: {', '.join(left)} not profiled" if left else ""]
    return ThreadProfile(counts, spec.loader.backend, worker_kind == THREADS, spec.workers, usable_cores, capped,
                         tuple(steps), "; ".join(filter(None, notes)))
