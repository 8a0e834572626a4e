"""The race: successive halving by intervals (F-race), as a pure rule over measured rounds.

After each stage `judge` keeps the best (by the objective) and every point the one rule cannot tell
apart from it (`pipebench.model.judging.judged`); survivors run longer rounds until one is left, the
last stage has run, or the next stage would not fit the budget (priced per point, `job_cost`, scaled
by what the last stage measured against that price). A point whose every job in a stage failed runs
once more before it leaves (FAILED); one the deadline kept from running leaves as UNRUN. docs/tune.md
says it in full. `run_race` drives it through a `measure(names, rounds, length)` callable, so the same
rule runs on synthetic rounds in tests and on real jobs; a `propose` callable can feed stage 1 in
batches (Optuna's sampler).
"""

import statistics
import time
from dataclasses import dataclass, field
from typing import Callable, Dict, List, Mapping, Optional, Sequence, Tuple

from pipebench.record.figures import Summary
from pipebench.tune.objective import ROUND_ID, Objective, Round, race_rates, slower_for_real

__all__ = ["Entrants", "Measure", "Propose", "RaceLimit", "RaceOutcome", "Schedule", "StageLog", "Verdict", "judge",
           "run_race"]

# The stop reasons, as tune.md and the terminal say them.
RESOLVED = "resolved: one point is left"
LAST_STAGE = "the last stage has run: the points left were not told apart"
BUDGET = "the budget is spent: the points left are those the race had not yet told apart"
NOTHING_MEETS = "nothing meets the objective"
NOTHING_MEASURED = "no point was measured: every job failed"
NOTHING_RUN = "no point was measured: the budget was spent before the race's first job"
# A point whose jobs the stage's sweep never started: the tune's deadline had passed (the sweep names
# the jobs it left out). Not a failure, so never run again.
UNRUN = "the budget was spent before its jobs ran (the sweep's line above names them)"
# A point whose every job failed runs again once in the same stage: a job can end without a result for a
# cause outside the point (a package edited under a running sweep, a process killed by another's hand),
# which would leave the race "resolved" with the true answer never measured. Failing twice, it is out.
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
    # Seconds a job of the last stage took on average (what a later job of that length would cost).
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


@dataclass(frozen=True)
class Entrants:
    """The points a race starts with: their names, their workers, and each one's stage-1 job seconds as
    first estimated (`job_cost`; `Schedule.job_s` for a point it leaves out)."""

    names: Sequence[str]
    workers: Mapping[str, int]
    job_cost: Mapping[str, float] = field(default_factory=dict)


@dataclass(frozen=True)
class RaceLimit:
    """When a race must end: `deadline` on `clock`, less room for `reserve_jobs` jobs of the last
    stage's length (tune's verification)."""

    deadline: float
    clock: Callable[[], float] = time.monotonic
    reserve_jobs: int = 0


def run_race(entrants: Entrants, measure: Measure, objective: Objective, schedule: Schedule, limit: RaceLimit,
             propose: Optional[Propose] = None) -> RaceOutcome:
    """Race `entrants` (module doc) until resolved, the last stage, or `limit`."""
    workers, clock, deadline = entrants.workers, limit.clock, limit.deadline
    rounds: Dict[str, List[Round]] = {}
    stages: List[StageLog] = []
    out: Dict[str, Tuple[int, str]] = {}
    propose = propose or _all_at_once(entrants.names)
    job_s = schedule.job_s
    # What the last stage measured against the estimate (1: none measured yet).
    scale = 1.0
    late = False
    verdict: Optional[Verdict] = None

    def estimate(name: str, number: int) -> float:
        """A job's seconds at stage `number` as estimated before any is measured."""
        first = entrants.job_cost.get(name, schedule.job_s)
        return first + schedule.round_s * (schedule.length(number) - 1)

    def run_stage(number: int, names: Sequence[str]) -> None:
        nonlocal job_s, scale, late, verdict
        started = clock()
        first = measure(names, schedule.rounds_per_stage, schedule.length(number))
        late = clock() >= deadline
        failed = [n for n in names if not first.get(n)]
        # Once more (FAILED), as a call of its own: its rounds pair with none of the first call's;
        # not past the deadline, where the sweep left them out (UNRUN).
        again = measure(failed, schedule.rounds_per_stage, schedule.length(number)) if failed and not late else {}
        late = clock() >= deadline
        for call, found in enumerate((first, again)):
            for name in names:
                rounds.setdefault(name, []).extend(Summary.from_row({**r.row, ROUND_ID: (len(stages), call, i)})
                                                   for i, r in enumerate(found.get(name) or ()))
        seconds = clock() - started
        ran = {n: len(first.get(n) or ()) + len(again.get(n) or ()) for n in names}
        expected = sum(estimate(n, number) * count for n, count in ran.items())
        if expected > 0:
            scale = seconds / expected
            job_s = seconds / sum(ran.values())
        for name in names:
            if not rounds.get(name):
                out[name] = (number, UNRUN if late and name in failed else FAILED)
        measured = {n: rounds[n] for n in rounds if n not in out and rounds[n]}
        if not measured:
            verdict = None
            return
        verdict = judge(measured, workers, objective)
        out.update({n: (number, why) for n, why in verdict.out.items()})
        stages.append(StageLog(number, schedule.length(number), tuple(names), verdict, seconds))

    def fits(number: int, names: Sequence[str]) -> bool:
        """Stage `number` of `names` and the reserve, at the estimate scaled by the last stage's measure."""
        jobs = [estimate(n, number) for n in names]
        # The verification's jobs, at these points' mean: it runs the pick beside the current settings.
        reserve = limit.reserve_jobs * (sum(jobs) / len(jobs) if jobs else schedule.job_s)
        return not late and clock() + scale * (sum(jobs) * schedule.rounds_per_stage + reserve) <= deadline

    stop = LAST_STAGE
    batch = list(propose(rounds, None))
    while batch:  # stage 1, in one batch or several; a later batch races beside the best so far
        reference = [verdict.best] if verdict is not None and verdict.best not in batch else []
        if stages and not fits(1, [*reference, *batch]):
            stop = BUDGET
            break
        run_stage(1, [*reference, *batch])
        if verdict is None or late:
            stop = BUDGET if late else stop
            break
        batch = [n for n in propose(rounds, verdict.best) if n not in rounds]
    for number in range(2, schedule.max_stages + 1):
        if verdict is None or len(verdict.kept) <= 1 or stop == BUDGET:
            break
        if not fits(number, verdict.kept):
            stop = BUDGET
            break
        run_stage(number, verdict.kept)
    if verdict is None:
        return RaceOutcome(tuple(stages), {}, (), out, NOTHING_RUN if late else NOTHING_MEASURED, job_s)
    failures = sum(why == FAILED for _, why in out.values())
    if any(why.startswith(NOTHING_MEETS) for why in verdict.out.values()):
        stop = NOTHING_MEETS
    elif late:
        stop = BUDGET
    elif len(verdict.kept) == 1:
        stop = RESOLVED_AMONG_MEASURED.format(failures) if failures else RESOLVED
    return RaceOutcome(tuple(stages), {n: tuple(r) for n, r in rounds.items() if r}, verdict.kept, out, stop, job_s)
