"""The largest number of emulated accelerators at which every one keeps the minimum AU.

A pure search over `measure(n, rounds)`, which gives each round's AU at N = n (the least rank's; None
for a failed job): from a guess, it gallops until an N that meets lies below one that misses, then
bisects. Whether an N meets is read with tune's racing statistics (`judge_rounds`).
"""

import math
from dataclasses import dataclass
from typing import Callable, Dict, List, Optional, Sequence, Tuple

from pipebench.record.figures import Summary
from pipebench.tune.objective import Objective

__all__ = ["DECISIVE_POINTS", "FAILED_AU", "MAX_ROUNDS", "Probe", "SearchOutcome", "judge_rounds", "predicted_accelerators",
           "search_accelerators"]

# A round this many AU points or more from the minimum decides alone: the tolerance between
# the measured AU and the arithmetic's (5 points) is what a round of a few hundred steps is held to.
DECISIVE_POINTS = 5.0
# Rounds at most at one N; the race's own stage-1 plus one to break a tie.
MAX_ROUNDS = 3
# A failed round counts as one that missed: an N whose job fails is not sustained.
FAILED_AU = 0.0

Measure = Callable[[int, int], Sequence[Optional[float]]]


@dataclass(frozen=True)
class Probe:
    accelerators: int
    au_pct: Tuple[float, ...]
    meets: bool
    failed: int = 0


@dataclass(frozen=True)
class SearchOutcome:
    # The largest N found to meet the minimum (0: not even one accelerator).
    accelerators: int
    probes: Tuple[Probe, ...]
    # True when the search stopped at `most`, which met: more might.
    capped: bool


def predicted_accelerators(mb_per_s: float, step_s: float, batch_size: int, sample_bytes: float,
                           min_au_pct: float) -> int:
    """floor(M x S / (AU x B x size)): the accelerators a bandwidth of M MiB/s feeds at the minimum AU,
    with no chain, samples of `sample_bytes`, a step of S seconds a batch of B and reads overlapping the steps."""
    return math.floor(mb_per_s * 2**20 * step_s / (min_au_pct / 100.0 * batch_size * sample_bytes))


def judge_rounds(au: Sequence[float], min_au_pct: float) -> Optional[bool]:
    """Whether rounds of these AUs meet `min_au_pct`: True, False, or None while more rounds are needed."""
    objective = Objective(target_starvation_pct=100.0 - min_au_pct)
    rounds = [Summary.from_row({"starvation_pct": 100.0 - value}) for value in au]
    if len(au) == 1 and abs(au[0] - min_au_pct) >= DECISIVE_POINTS:
        return au[0] >= min_au_pct
    if objective.surely_unmet(rounds):
        return False
    if len(au) >= 2 and not any(objective.unmet([r]) for r in rounds):
        return True
    if len(au) >= MAX_ROUNDS:
        return not objective.unmet(rounds)
    return None


def _probe(measure: Measure, n: int, min_au_pct: float) -> Probe:
    au: List[float] = []
    failed = 0
    while True:
        got = list(measure(n, 1))
        failed += sum(value is None for value in got) or int(not got)
        au.extend(FAILED_AU if value is None else float(value) for value in (got or [None]))
        decided = judge_rounds(au, min_au_pct)
        if decided is not None:
            return Probe(n, tuple(au), decided, failed)


def search_accelerators(measure: Measure, min_au_pct: float, start: int, most: int) -> SearchOutcome:
    """The largest N in 1..`most` that meets `min_au_pct` (module doc), starting at `start`."""
    probes: Dict[int, Probe] = {}
    meets, misses = 0, most + 1  # the largest N known to meet (0: none yet), the least known to miss
    n, step = min(max(start, 1), most), 1
    while misses - meets > 1:
        probe = probes[n] = _probe(measure, n, min_au_pct)
        if probe.meets:
            meets = n
        else:
            misses = n
        if misses - meets <= 1:
            break
        if misses > most:  # nothing has missed yet: gallop up
            n = min(meets + step, most)
        elif meets == 0:  # nothing has met yet: gallop down
            n = max(misses - step, 1)
        else:
            n = (meets + misses) // 2
        step *= 2
    return SearchOutcome(meets, tuple(probes.values()), meets == most)
