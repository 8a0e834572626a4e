"""The race: successive halving by intervals (F-race), as a pure rule over measured rounds.

Every point that survives the pruning runs short interleaved rounds (stage 1). After each stage
`judge` keeps the best (by the objective) and every point the project's one rule cannot tell
apart from it (`pipebench.model.judging.judged`, which the report's ≈ reads too: intervals on a few
rounds, the paired significance test from MIN_SAMPLES rounds on); the others leave, each with its reason. Survivors run
more rounds, each `Schedule.growth` times longer than the stage before, until one point is left
(the winner is resolved), the last stage has run (the survivors were not told apart: whether they
are shown alike is the recommendation's to say, `pipebench.tune.recommend`), or the next stage would
not fit the budget (the survivors are named as they stand). A point whose every job in a stage
failed runs once more in that stage before it leaves (FAILED), and a race that ends with one point
because the others failed says so rather than "resolved".

`run_race` drives it through a `measure(names, rounds, length)` callable, so the same rule runs on
synthetic rounds of known truth in tests and on real jobs in `pipebench tune`. A `propose` callable
can feed stage 1 in batches (Optuna's sampler, `pipebench.tune.optuna_search`); by default every
entrant runs in one.
"""

import statistics
import time
from dataclasses import dataclass, field
from typing import Callable, Dict, List, Mapping, Optional, Sequence, Tuple

from pipebench.tune.objective import ROUND_ID, Objective, Round, race_rates, slower_for_real

__all__ = ["Measure", "Propose", "RaceOutcome", "Schedule", "StageLog", "Verdict", "judge", "run_race"]

# The stop reasons, as tune.md and the terminal say them.
RESOLVED = "resolved: one point is left"
LAST_STAGE = "the last stage has run: the points left were not told apart"
BUDGET = "the budget is spent: the points left are those the race had not yet told apart"
NOTHING_MEETS = "nothing meets the objective"
NOTHING_MEASURED = "no point was measured: every job failed"
# A point whose every job failed, run again once in the same stage: a job can end without a result for
# a cause outside the point (a crash from a package edited under a running sweep, a process killed by
# another's hand), and a point lost that way in stage 1 left the race "resolved" with the true answer
# never measured. A point whose jobs fail twice is out for it.
FAILED = "its jobs failed twice, so it was never measured (their lines are above)"
RESOLVED_AMONG_MEASURED = "resolved among the points measured: one is left, and {} point(s) whose jobs failed are out"

# measure(names, rounds, length) -> each name's new rounds (a point whose job failed may be missing).
Measure = Callable[[Sequence[str], int, float], Mapping[str, Sequence[Round]]]
# propose(rounds so far, the best so far or None) -> the next stage-1 entrants; empty when there are none.
Propose = Callable[[Mapping[str, Sequence[Round]], Optional[str]], Sequence[str]]


@dataclass(frozen=True)
class Schedule:
    """How the race spends its rounds. The defaults: two rounds a stage (a rate's spread needs two),
    three stages (the finalists get six rounds, past significance.MIN_SAMPLES, so the paired test
    decides at the end), each stage's rounds twice as long as the last (successive halving's doubling)."""

    rounds_per_stage: int = 2
    max_stages: int = 3
    growth: float = 2.0
    # Seconds a stage-1 round spends measuring (run.min_time_s), and a whole stage-1 job's seconds
    # as first estimated (process start and warm-up included), before any stage has been timed.
    round_s: float = 1.0
    job_s: float = 5.0

    def length(self, stage: int) -> float:
        """Stage `stage`'s (1 first) round length, as a multiple of stage 1's."""
        return self.growth ** (stage - 1)


@dataclass(frozen=True)
class Verdict:
    """One stage's judgement: the best point, the points kept (the best first) and why each other left."""

    best: str
    kept: Tuple[str, ...]
    out: Mapping[str, str]


@dataclass(frozen=True)
class StageLog:
    number: int
    length: float
    entrants: Tuple[str, ...]
    verdict: Verdict
    seconds: float


@dataclass(frozen=True)
class RaceOutcome:
    stages: Tuple[StageLog, ...]
    rounds: Mapping[str, Tuple[Round, ...]]
    # best first
    survivors: Tuple[str, ...]
    # name -> (stage it left at, why)
    out: Mapping[str, Tuple[int, str]]
    stop: str
    # Seconds a job of the last stage took (what a later stage of that length would cost a job).
    job_s: float = field(default=0.0)


def _sure_to_meet(objective: Objective, rounds: Sequence[Round]) -> bool:
    """Every round meets the starvation target, and there are rounds enough to say so."""
    return not objective.unmet(rounds) and not any(objective.unmet([r]) for r in rounds) and len(rounds) >= 2


def judge(rounds: Mapping[str, Sequence[Round]], workers: Mapping[str, int], objective: Objective) -> Verdict:
    """The best point and who stays in the race (module doc). Points that surely miss the objective's
    limits leave; when every point does, the closest is kept alone."""
    names = [n for n in rounds if rounds[n]]
    out = {n: objective.surely_unmet(rounds[n]) for n in names}
    able = [n for n in names if not out[n]]
    if not able:
        closest = min(names, key=lambda n: objective.closest(rounds[n]))
        return Verdict(closest, (closest,), {n: f"{NOTHING_MEETS}: {why}" for n, why in out.items() if n != closest})
    meeting = [n for n in able if not objective.unmet(rounds[n])] or able
    best = min(meeting, key=lambda n: objective.rank(workers[n], rounds[n]))
    best_rate = statistics.median(race_rates(rounds[best]))
    fewest = objective.target_starvation_pct is not None
    kept = [best]
    left = {n: why for n, why in out.items() if why}
    slower = slower_for_real(rounds, best, [n for n in able if n != best and
                                            (not fewest or workers[n] == workers[best])])
    for name in able:
        if name == best:
            continue
        rate = statistics.median(race_rates(rounds[name]))
        if fewest and workers[name] > workers[best] and _sure_to_meet(objective, rounds[best]):
            left[name] = (f"the target is met with fewer workers ({best}, workers={workers[best]}, starved "
                          f"under the target in every round)")
        elif slower.get(name):
            left[name] = f"slower than {best} beyond the noise ({rate:.4g} against {best_rate:.4g} samples/s)"
        else:
            kept.append(name)
    return Verdict(best, tuple(kept), left)


def _all_at_once(entrants: Sequence[str]) -> Propose:
    pending = [list(entrants)]
    return lambda rounds, best: pending.pop() if pending else []


def run_race(entrants: Sequence[str], workers: Mapping[str, int], measure: Measure, objective: Objective,
             schedule: Schedule, deadline: float, clock: Callable[[], float] = time.monotonic,
             reserve_jobs: int = 0, propose: Optional[Propose] = None) -> RaceOutcome:
    """Race `entrants` (module doc) until resolved, the last stage, or `deadline` (on `clock`) less
    room for `reserve_jobs` jobs of the last stage's length (tune's verification)."""
    rounds: Dict[str, List[Round]] = {}
    stages: List[StageLog] = []
    out: Dict[str, Tuple[int, str]] = {}
    propose = propose or _all_at_once(entrants)
    job_s = schedule.job_s
    verdict: Optional[Verdict] = None

    def run_stage(number: int, names: Sequence[str]) -> None:
        nonlocal job_s, verdict
        started = clock()
        first = measure(names, schedule.rounds_per_stage, schedule.length(number))
        failed = [n for n in names if not first.get(n)]
        # Once more (FAILED), as a call of its own: its rounds pair with none of the first call's.
        again = measure(failed, schedule.rounds_per_stage, schedule.length(number)) if failed else {}
        for call, found in enumerate((first, again)):
            for name in names:
                rounds.setdefault(name, []).extend({**r, ROUND_ID: (len(stages), call, i)}
                                                   for i, r in enumerate(found.get(name) or ()))
        seconds = clock() - started
        job_s = seconds / max(1, (len(names) + len(failed)) * schedule.rounds_per_stage)
        for name in names:
            if not rounds.get(name):
                out[name] = (number, FAILED)
        measured = {n: rounds[n] for n in rounds if n not in out and rounds[n]}
        if not measured:
            verdict = None
            return
        verdict = judge(measured, workers, objective)
        out.update({n: (number, why) for n, why in verdict.out.items()})
        stages.append(StageLog(number, schedule.length(number), tuple(names), verdict, seconds))

    def fits(number: int, count: int) -> bool:
        grown = job_s + schedule.round_s * (schedule.length(number) - schedule.length(max(1, number - 1)))
        return clock() + grown * (count * schedule.rounds_per_stage + reserve_jobs) <= deadline

    stop = LAST_STAGE
    batch = list(propose(rounds, None))
    while batch:  # stage 1, in one batch or several; a later batch races beside the best so far
        reference = [verdict.best] if verdict is not None and verdict.best not in batch else []
        if stages and not fits(1, len(batch) + len(reference)):
            stop = BUDGET
            break
        run_stage(1, [*reference, *batch])
        if verdict is None:
            break
        batch = [n for n in propose(rounds, verdict.best) if n not in rounds]
    for number in range(2, schedule.max_stages + 1):
        if verdict is None or len(verdict.kept) <= 1 or stop == BUDGET:
            break
        if not fits(number, len(verdict.kept)):
            stop = BUDGET
            break
        run_stage(number, verdict.kept)
    if verdict is None:
        return RaceOutcome(tuple(stages), {}, (), out, NOTHING_MEASURED, job_s)
    failures = sum(why == FAILED for _, why in out.values())
    if any(why.startswith(NOTHING_MEETS) for why in verdict.out.values()):
        stop = NOTHING_MEETS
    elif len(verdict.kept) == 1:
        stop = RESOLVED_AMONG_MEASURED.format(failures) if failures else RESOLVED
    return RaceOutcome(tuple(stages), {n: tuple(r) for n, r in rounds.items() if r}, verdict.kept, out, stop, job_s)
