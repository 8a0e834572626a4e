"""Each step's thread-scaling profile: its rate alone at 1, 2, 4, ... threads, and the share of its
wall time it ran off the CPU, as SPDL's pipeline profiler (`spdl.pipeline.profile_pipeline`) runs
each stage alone at several concurrencies.

Each step is called alone on its captured inputs (`pipebench.measure.step_inputs`) by k threads at
once, the same calls at every k, with one intra-op torch thread (as the thread backends run). With k
within the usable cores, an off-CPU share (thread CPU against wall time) that grows with k is time
queued for a lock the threads share, the GIL first of all (`pipebench.measure.thread_verdict`).
A job runs the pass after its measured repeats, under a thread backend or `run.thread_profile=true`.
"""

import math
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from typing import Any, Callable, Dict, List, Sequence, Tuple

import torch

from pipebench.config.specs import JobSpec
from pipebench.measure.setup import seed_everything
from pipebench.measure.step_inputs import StepCall, capture_steps
from pipebench.measure.thread_verdict import ScalingFigures, thread_verdict
from pipebench.pipeline.loader_backends import THREADS
from pipebench.pipeline.timed_chain import InstrumentedDataset, TimedCollate
from pipebench.record.sections import ProfiledStep, ProfileLevel, StoredThreadProfile

__all__ = ["ThreadProfile", "profile_step", "profile_wanted", "step_columns", "thread_counts", "thread_profile_pass"]

# One step's calls at 1 thread take about this long, and the same calls are made at every thread
# count. A quarter second spans ~50 of the GIL's 5 ms switch intervals and many scheduler slices,
# so a rate is not one slice's luck; 8 steps x 5 thread counts x 2 runs on a 16-core host cost ~20 s.
LEVEL_S = 0.25
# Each thread count runs this many times, interleaved (1, 2, 4, 1, 2, 4), and keeps its fastest run,
# as timeit keeps its best: another tenant's burst or a first run's page faults slows one run, rarely
# both (with one run, a collate once read 10x faster on 2 threads than on 1).
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


def step_columns(step: ProfiledStep) -> Dict[str, Any]:
    """A step's transforms.csv cells (record.results.PROFILE_COLUMNS); none when it was not profiled."""
    if not step.levels:
        return {}
    speedups = step.speedups()
    alone, top = step.levels[0].off_cpu_pct, step.levels[-1].off_cpu_pct
    figures = ScalingFigures(tuple(k for k, _ in speedups), tuple(s for _, s in speedups), alone / 100.0, top / 100.0)
    return {
        "profile_threads": figures.top_threads,
        "thread_speedup": figures.top_speedup,
        "thread_speedups": " ".join(f"{k}:{s:.2f}" for k, s in speedups),
        "off_cpu_pct_1t": alone,
        "off_cpu_pct_nt": top,
        "thread_verdict": thread_verdict(figures),
    }


@dataclass(frozen=True)
class ThreadProfile(StoredThreadProfile):
    """The job's profile as it measured it (the stored section's type), with what the job writes of it."""

    def columns(self, stage: str, transform: str) -> Dict[str, Any]:
        step = self.step(stage, transform)
        return step_columns(step) if step is not None else {}

    def record(self) -> Dict[str, Any]:
        """result.json's `thread_profile` section."""
        return asdict(self)


def _timed_calls(call: Callable[[Any], Any], inputs: Sequence[Any], threads: int) -> ProfileLevel:
    """`inputs` split over `threads` threads that start together; each call timed in its thread, its
    thread CPU time against its wall time saying how long it ran off the CPU."""
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
    wall, cpu = sum(w for w, _ in done), sum(c for _, c in done)
    off_cpu = min(max(1.0 - cpu / wall, 0.0), 1.0) if wall > 0 else 0.0
    return ProfileLevel(threads, len(inputs), len(inputs) / seconds, 100.0 * off_cpu)


def _calls_for(step: StepCall, counts: Sequence[int]) -> int:
    """Calls a level: LEVEL_S at one thread by a warm-up's pace, within the bounds, split evenly at every count."""
    warm = _timed_calls(step.call, step.inputs_for(len(step.inputs) or MIN_CALLS_PER_THREAD), 1)
    ceiling = MAX_FRESH_CALLS if step.fresh is not None else MAX_CALLS
    calls = min(max(math.ceil(LEVEL_S * warm.samples_per_s), MIN_CALLS_PER_THREAD * counts[-1]), ceiling)
    even = math.lcm(*counts)
    return max(even, calls // even * even)


def profile_step(step: StepCall, counts: Sequence[int], seed: int) -> ProfiledStep:
    """One step alone at each thread count, the same calls at each, the best of RUNS runs; a step that
    raises has its line instead."""
    best: Dict[int, ProfileLevel] = {}
    try:
        calls = _calls_for(step, counts)
        for _ in range(RUNS):
            for threads in counts:
                inputs = step.inputs_for(calls)
                seed_everything(seed)
                level = _timed_calls(step.call, inputs, threads)
                if threads not in best or level.samples_per_s > best[threads].samples_per_s:
                    best[threads] = level
    except Exception as exc:  # a step that is not thread-safe, or fails called again: say so, go on
        return ProfiledStep(step.stage, step.name, error=f"{type(exc).__name__}: {exc}")
    return ProfiledStep(step.stage, step.name, levels=tuple(best[threads] for threads in counts))


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
        steps: List[ProfiledStep] = []
        for step in captured.steps:
            if time.perf_counter() - started > PASS_BUDGET_S:
                break
            steps.append(profile_step(step, counts, spec.run.seed))
    finally:
        torch.set_num_threads(intra_op)
    left = [step.name for step in captured.steps[len(steps):]]
    notes = [captured.note, f"stopped after {PASS_BUDGET_S:g} s: {', '.join(left)} not profiled" if left else ""]
    return ThreadProfile(counts, spec.loader.backend, worker_kind == THREADS, spec.workers, usable_cores, capped,
                         "; ".join(filter(None, notes)) or None, tuple(steps))
