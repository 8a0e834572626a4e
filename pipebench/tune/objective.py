"""What tune looks for, and how one point's measured rounds (typed summary rows) read against it:
the highest epoch-effective samples/s (the default, so `persistent_workers` is judged by what it
saves), or the fewest workers under `--target-starvation PCT`; `--max-pss-gib G` beside either.
"""

import math
import statistics
from dataclasses import dataclass
from typing import Dict, List, Mapping, Optional, Sequence, Tuple

from pipebench.base.significance import DOWN, MIN_SAMPLES, NO_CHANGE, against_base
from pipebench.model import judging
from pipebench.model.judging import APART, RUN_TO_RUN_RATE_FLOOR, Spread, judged
from pipebench.record.figures import Summary, nan_if_none

__all__ = ["MIB_PER_GIB", "Objective", "cpu_ms", "probe_ties", "pss_mb", "race_rates", "rate_spread", "shown_alike", "starvation",
           "slower_for_real", "told_apart_rounds"]

MIB_PER_GIB = 1024.0
# A point is out for starvation only once this many rounds all starve past the target: one short
# round's starvation swings with the host's load.
STARVATION_OUT_ROUNDS = 2
# A point leaves the race on MIN_SAMPLES rounds only when it is slower for real (significant, Holm over
# the survivors) by more than this: the race looks at the same points once a stage, and each look is
# another chance to lose a tied point to the noise (planted ties 1000 vs 1000 at 5% round noise lost one
# by a 3.4% draw in the third stage without it); a point within 5% of the best is as good a buy where it
# costs less, and round-to-round spread on a shared 2-core machine is 10% and more
# (pipebench.model.judging.RUN_TO_RUN_RATE_FLOOR).
RACE_THRESHOLD = 0.05
# Where the race keeps which of its rounds a round was, so points' rounds run side by side pair up.
ROUND_ID = "race_round"

Round = Summary


def _scaled(summary: Round) -> Tuple[float, float, float]:
    """The round's samples/s and 95% CI as the epoch-effective rate, where it has one."""
    steady = float(summary.samples_per_s)
    epoch = nan_if_none(summary.samples_per_s_epoch)
    scale = epoch / steady if math.isfinite(epoch) and epoch > 0 else 1.0
    return (steady * scale, nan_if_none(summary.samples_per_s_ci_low) * scale,
            nan_if_none(summary.samples_per_s_ci_high) * scale)


def race_rates(rounds: Sequence[Round]) -> List[float]:
    """Each round's rate as the race reads it (the epoch-effective rate)."""
    return [_scaled(r)[0] for r in rounds]


def rate_spread(rounds: Sequence[Round]) -> Spread:
    """The rounds' epoch-effective rate and its spread, by the one rule (pipebench.model.judging)."""
    rates, lows, highs = zip(*(_scaled(r) for r in rounds))
    return judging.rate_spread(rates, lows, highs)


def cpu_ms(rounds: Sequence[Round]) -> float:
    """CPU ms a sample, the whole process tree's (workers and main loop), else the chain's."""
    return Summary.median(rounds, "process_cpu_ms_per_sample", "cpu_ms_per_sample")


def pss_mb(rounds: Sequence[Round]) -> float:
    return Summary.median(rounds, "pss_mb_peak")


def starvation(rounds: Sequence[Round]) -> float:
    return Summary.median(rounds, "starvation_pct")


@dataclass(frozen=True)
class Objective:
    """None: that objective is not asked for."""

    target_starvation_pct: Optional[float] = None
    max_pss_gib: Optional[float] = None

    @property
    def name(self) -> str:
        ranked = (f"fewest workers keeping starvation under {self.target_starvation_pct:g}%"
                  if self.target_starvation_pct is not None else "highest samples/s")
        return ranked + (f", summed PSS under {self.max_pss_gib:g} GiB" if self.max_pss_gib is not None else "")

    def unmet(self, rounds: Sequence[Round]) -> str:
        """Why the rounds (medians) miss the objective's limits, '' when they meet them."""
        if self.max_pss_gib is not None and pss_mb(rounds) > self.max_pss_gib * MIB_PER_GIB:
            return f"summed PSS {pss_mb(rounds) / MIB_PER_GIB:.2f} GiB over the {self.max_pss_gib:g} GiB cap"
        if self.target_starvation_pct is not None and starvation(rounds) > self.target_starvation_pct:
            return f"starvation {starvation(rounds):.1f}% over the {self.target_starvation_pct:g}% target"
        return ""

    def surely_unmet(self, rounds: Sequence[Round]) -> str:
        """Why the rounds miss a limit beyond doubt ('' otherwise): memory is read once and barely
        moves, starvation only once STARVATION_OUT_ROUNDS rounds all pass the target."""
        if self.max_pss_gib is not None and pss_mb(rounds) > self.max_pss_gib * MIB_PER_GIB:
            return self.unmet(rounds)
        target = self.target_starvation_pct
        values = [nan_if_none(r.starvation_pct) for r in rounds]
        if target is not None and len(values) >= STARVATION_OUT_ROUNDS and min(values) > target:
            return f"starvation over the {target:g}% target in all {len(values)} rounds (least {min(values):.1f}%)"
        return ""

    def rank(self, workers: int, rounds: Sequence[Round]) -> Tuple[float, ...]:
        """Smaller is better: the fewest workers first for a starvation target, then the fastest."""
        rate = -statistics.median(race_rates(rounds))
        return (workers, rate) if self.target_starvation_pct is not None else (rate,)

    def closest(self, rounds: Sequence[Round]) -> float:
        """How far the rounds are from the objective's limit (smaller is closer), for when nothing meets it."""
        if self.max_pss_gib is not None and pss_mb(rounds) > self.max_pss_gib * MIB_PER_GIB:
            return pss_mb(rounds)
        return starvation(rounds) if self.target_starvation_pct is not None else 0.0


def told_apart_rounds(a: Sequence[Round], b: Sequence[Round]) -> bool:
    """Whether two points' rates differ beyond the noise, by the one rule (pipebench.model.judging.judged)."""
    return judged(rate_spread(a), rate_spread(b)) == APART


def probe_ties(probes: Mapping[str, Sequence[Round]], fastest: str) -> List[str]:
    """The chains a probe of one short job each cannot tell from `fastest`: those their intervals do
    not tell apart, and those within RUN_TO_RUN_RATE_FLOOR of it (one job's interval sees only the load
    inside its own window, and jobs minutes apart differ by more), in `probes`' order."""
    top = race_rates(probes[fastest])[0]
    return [c for c in probes if c == fastest or race_rates(probes[c])[0] >= (1 - RUN_TO_RUN_RATE_FLOOR) * top
            or not told_apart_rounds(probes[fastest], probes[c])]


def _by_round(rounds: Sequence[Round]) -> Dict[object, float]:
    """Rates keyed by the race's round (ROUND_ID), so rounds run side by side pair up."""
    return {r.row.get(ROUND_ID, i): rate for i, (r, rate) in enumerate(zip(rounds, race_rates(rounds)))}


def slower_for_real(rounds: Mapping[str, Sequence[Round]], best: str, others: Sequence[str]) -> Dict[str, bool]:
    """Whether each of `others` is slower than `best` beyond the noise. With MIN_SAMPLES rounds a side,
    by the rule of significance (`against_base`: paired over the rounds they ran side by side,
    Holm-corrected over `others`, and by more than RACE_THRESHOLD); with fewer, by the one rule
    (`told_apart_rounds`)."""
    top = statistics.median(race_rates(rounds[best]))
    tested = {n: _by_round(rounds[n]) for n in others if min(len(rounds[n]), len(rounds[best])) >= MIN_SAMPLES}
    slower = {n: statistics.median(race_rates(rounds[n])) < top and told_apart_rounds(rounds[best], rounds[n])
              for n in others if n not in tested}
    if tested:
        slower.update({n: direction == DOWN for n, (_, direction) in
                       against_base(_by_round(rounds[best]), tested, RACE_THRESHOLD).items()})
    return slower


def shown_alike(rounds: Mapping[str, Sequence[Round]], best: str, others: Sequence[str], margin: float
                ) -> Dict[str, bool]:
    """Whether each of `others` is shown within `margin` of `best` (more than not told apart): compare's
    `no change` on the paired ratio's interval with MIN_SAMPLES rounds a side, else on the widest ratio
    the two intervals allow. A side with no interval shows nothing: one short round whose interval
    spans 2x cannot say that a point is as fast as the best."""
    tested = {n: _by_round(rounds[n]) for n in others if min(len(rounds[n]), len(rounds[best])) >= MIN_SAMPLES}
    alike = {n: direction == NO_CHANGE for n, (_, direction) in
             (against_base(_by_round(rounds[best]), tested, margin).items() if tested else ())}
    top = rate_spread(rounds[best])
    for name in (n for n in others if n not in tested):
        other = rate_spread(rounds[name])
        bounds = (other.low, other.high, top.low, top.high)
        if not all(math.isfinite(b) and b > 0 for b in bounds):
            alike[name] = False
            continue
        low, high = other.low / top.high, other.high / top.low
        alike[name] = abs(other.value / top.value - 1) <= margin and (high - low) / 2 <= margin
    return alike
