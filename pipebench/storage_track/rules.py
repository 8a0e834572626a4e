"""The storage check's rules, as MLPerf Storage states them, and its verdict: pure arithmetic, no files.

AU met by every accelerator in every run; 1 warm-up and RUNS runs that replicate within REPLICATION;
a dataset of at least MEMORY_FACTOR x the host's memory and MIN_STEPS_PER_EPOCH steps an epoch. The
verdict is shaped like mlpstorage's, CLOSED, OPEN or INVALID, each with its reasons
(docs/storage-check.md). These are MLPerf Storage-style results, not MLPerf results.
"""

import math
import statistics
from dataclasses import dataclass, field
from typing import Optional, Sequence, Tuple

__all__ = ["CLOSED", "INVALID", "MEMORY_FACTOR", "MIN_STEPS_PER_EPOCH", "OPEN", "REPLICATION", "RUNS", "Procedure",
           "Verdict", "memory_rule", "replicates", "steps_rule", "verdict"]

CLOSED, OPEN, INVALID = "CLOSED", "OPEN", "INVALID"
# MLPerf Storage's procedure: 5 runs after the warm-up, each a new seed.
RUNS = 5
# The runs' samples/s should replicate within this share of their mean.
REPLICATION = 0.05
# The dataset is at least this many times the host's memory, so the page cache cannot hold it.
MEMORY_FACTOR = 5
# And at least this many steps an epoch (each accelerator's).
MIN_STEPS_PER_EPOCH = 500


def replicates(rates: Sequence[float]) -> Tuple[bool, float]:
    """Whether every run's rate is within REPLICATION of the runs' mean, and the largest departure (a
    share of the mean); (False, nan) for fewer than two runs, which show no spread."""
    if len(rates) < 2:
        return False, math.nan
    mean = statistics.fmean(rates)
    spread = max(abs(r - mean) for r in rates) / mean if mean > 0 else math.inf
    return spread <= REPLICATION, spread


def memory_rule(dataset_bytes: Optional[int], ram_bytes: int) -> str:
    """'' when the dataset is at least MEMORY_FACTOR x the host's memory, else why not, in words."""
    need = MEMORY_FACTOR * ram_bytes
    if dataset_bytes is None:
        return f"the dataset's size is unknown, so it is not shown to be {MEMORY_FACTOR}x the host's memory"
    if dataset_bytes >= need:
        return ""
    return (f"the dataset ({dataset_bytes / 2**30:.3g} GiB) is under {MEMORY_FACTOR}x the host's memory "
            f"({MEMORY_FACTOR} x {ram_bytes / 2**30:.3g} = {need / 2**30:.3g} GiB)")


def steps_rule(length: int, batch_size: int, accelerators: int) -> int:
    """The samples the dataset needs for MIN_STEPS_PER_EPOCH steps an epoch on each of `accelerators`;
    0 when `length` has them."""
    need = MIN_STEPS_PER_EPOCH * batch_size * max(accelerators, 1)
    return 0 if length >= need else need


@dataclass(frozen=True)
class Procedure:
    """What a check did, as the verdict reads it."""

    accelerators: int
    min_au_pct: float
    # One AU a finished run (the least rank's), and its samples/s.
    au_pct: Tuple[float, ...]
    samples_per_s: Tuple[float, ...]
    runs_asked: int = RUNS
    # Why the procedure stopped short ('' when every run finished): a failed or interrupted run.
    failure: str = ""
    preset: bool = True
    chain: str = "none"
    shortened: Tuple[str, ...] = ()
    memory: str = ""
    steps_needed: int = 0
    notes: Tuple[str, ...] = field(default=())


@dataclass(frozen=True)
class Verdict:
    verdict: str
    reasons: Tuple[str, ...]
    replicated: bool
    spread: float


def verdict(done: Procedure) -> Verdict:
    """CLOSED, OPEN or INVALID and every reason for it (module doc); the replication and its spread."""
    invalid, open_ = [], []
    if done.failure:
        invalid.append(f"the procedure stopped: {done.failure}")
    if done.accelerators < 1 and not done.failure:
        invalid.append(f"no number of accelerators kept the AU at {done.min_au_pct:g}% or more")
    if len(done.au_pct) < done.runs_asked:
        invalid.append(f"{len(done.au_pct)} of {done.runs_asked} runs finished")
    low = [i + 1 for i, au in enumerate(done.au_pct) if au < done.min_au_pct]
    if low and done.accelerators >= 1:
        invalid.append(f"run(s) {', '.join(map(str, low))} missed the {done.min_au_pct:g}% AU minimum "
                       f"(least {min(done.au_pct):.1f}%)")
    if done.steps_needed:
        invalid.append(f"the dataset is too small for {MIN_STEPS_PER_EPOCH} steps an epoch on "
                       f"{done.accelerators} accelerator(s): it needs {done.steps_needed} samples")
    ok, spread = replicates(done.samples_per_s)
    if len(done.samples_per_s) >= 2 and not ok:
        open_.append(f"the runs do not replicate within {REPLICATION:.0%}: one is {spread:.1%} off their mean")
    if not done.preset:
        open_.append("workload=custom: not one of the workloads' presets")
    if done.chain != "none":
        open_.append(f"the preprocessing is in (transform={done.chain}); MLPerf Storage's closed division has none")
    open_.extend(f"shortened: {line}" for line in done.shortened)
    if done.memory:
        open_.append(f"{done.memory}: run with dataset.cache=cold, which is not the rule met")
    open_.extend(done.notes)
    if invalid:
        return Verdict(INVALID, tuple(invalid + open_), ok, spread)
    return Verdict(OPEN if open_ else CLOSED, tuple(open_), ok, spread)
