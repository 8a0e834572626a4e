"""The calibration: the fixed decode + transform workload (pipebench.measure.cpu_reference), timed once per invocation.

Its score, timed before the jobs (pipebench.sweep.calibrate), tracks how fast the machine is now at
the kind of work pipebench measures, so `compare` can tell a slower machine from a slower pipeline.
"""

import statistics
import sys
import time
from dataclasses import asdict, dataclass
from typing import Any, Callable, List

import torch

from pipebench.base.cores import usable_cores
from pipebench.measure.fingerprint import cpu_model
from pipebench.measure.cpu_reference import (
    IMAGE_HEIGHT,
    IMAGE_WIDTH,
    JPEG_QUALITY,
    WORKLOAD_VERSION,
    run_workload,
    seed_chain,
    synthetic_jpeg,
)
from pipebench.record.results import Calibration


@dataclass(frozen=True)
class CalibrationPlan:
    """How much work: `warmup` untimed then `repetitions` timed blocks of `samples_per_repetition` samples."""

    # ~4 ms a sample on the project's 2-core machine: 30 x 12 samples is ~1.5 s timed, enough
    # repetitions for a stable median, short enough to run before every nightly suite.
    repetitions: int = 30
    samples_per_repetition: int = 12
    # First calls pay for lazy imports and allocator growth.
    warmup: int = 2
    seed: int = 0


def _one_repetition(jpeg: bytes, chain: List[Callable[[Any], Any]], samples: int) -> float:
    start = time.perf_counter()
    for _ in range(samples):
        run_workload(jpeg, chain)
    return time.perf_counter() - start


def run_calibration(plan: CalibrationPlan = CalibrationPlan()) -> Calibration:
    """Time the workload on one intra-op thread (as DataLoader workers run), leaving torch's
    thread count and global RNG as they were."""
    jpeg = synthetic_jpeg(plan.seed)
    chain = seed_chain()
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(plan.seed)
            for _ in range(plan.warmup):
                _one_repetition(jpeg, chain, plan.samples_per_repetition)
            samples = tuple(_one_repetition(jpeg, chain, plan.samples_per_repetition)
                            for _ in range(plan.repetitions))
    finally:
        torch.set_num_threads(threads)
    fingerprint = {
        "workload_version": WORKLOAD_VERSION,
        "workload": f"decode {IMAGE_WIDTH}x{IMAGE_HEIGHT} q{JPEG_QUALITY} + "
                    + ", ".join(type(t).__name__ for t in chain),
        "plan": asdict(plan),
        "torch": torch.__version__,
        "python": sys.version.split()[0],
        "cpu_model": cpu_model(),
        "usable_cores": usable_cores(),
    }
    return Calibration(score_s=statistics.median(samples), samples_s=samples, fingerprint=fingerprint)
