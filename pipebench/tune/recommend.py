"""What tune recommends: the points within noise of the best, and the cheapest of them.

The best is the objective's (`pipebench.tune.objective`). Within noise of it: for samples/s, every
raced point shown as fast as it, to within compare's threshold (`shown_alike`: compare's `no
change`); for a starvation target, every point meeting the target with as few workers. Of those the
cheapest wins: the fewest CPU ms a sample (the whole process tree's), then the least summed PSS. A
faster point that costs more CPU is no better buy when the measurements show the two alike.

Not being told apart is not being shown alike: a point whose rounds are too few or too noisy to
bound its gap to the best (one short round at workers=0 against one of workers=2 whose interval
spans 2x) is *unresolved*. It is named, and not recommended for being cheaper: workers=0 is always
the cheapest in CPU, so the rule "cheapest of those not told apart" would pick it whenever the race
ran out of rounds, whatever the workers gave.

When nothing meets the objective, the point closest to it is named, with why it falls short.
"""

import math
from dataclasses import dataclass
from typing import Mapping, Sequence, Tuple

from pipebench.base.significance import DOWN, UP, against_base
from pipebench.regress.compare import DEFAULT_THRESHOLD, FASTER, SLOWER
from pipebench.tune.objective import Objective, Round, cpu_ms, pss_mb, shown_alike, slower_for_real

__all__ = ["Recommendation", "recommend", "verify_line"]


@dataclass(frozen=True)
class Recommendation:
    best: str
    # Within noise of the best, the best first.
    near: Tuple[str, ...]
    # The cheapest of `near`: the recommended point.
    pick: str
    # '' when the pick meets the objective; else why the closest point falls short.
    unmet: str
    # Neither told apart from the best nor shown alike: the race could not resolve them (module doc).
    unresolved: Tuple[str, ...] = ()

    @property
    def met(self) -> bool:
        return not self.unmet


def _cost(rounds: Sequence[Round]) -> Tuple[float, float]:
    """CPU ms a sample, then summed PSS; a figure not measured sorts last."""
    return tuple(value if math.isfinite(value) else math.inf for value in (cpu_ms(rounds), pss_mb(rounds)))


def recommend(rounds: Mapping[str, Sequence[Round]], survivors: Sequence[str], workers: Mapping[str, int],
              objective: Objective) -> Recommendation:
    """The recommendation from the race's survivors (the best first) and every point's rounds."""
    best = survivors[0]
    unmet = objective.unmet(rounds[best])
    if unmet:
        closest = min(rounds, key=lambda n: objective.closest(rounds[n]))
        return Recommendation(closest, (closest,), closest, objective.unmet(rounds[closest]) or unmet)
    unresolved: Tuple[str, ...] = ()
    if objective.target_starvation_pct is not None:
        near = [n for n in survivors if workers[n] == workers[best] and not objective.unmet(rounds[n])]
    else:
        slower = slower_for_real(rounds, best, [n for n in survivors if n != best])
        level = [n for n in survivors if n != best and not objective.unmet(rounds[n]) and not slower[n]]
        alike = shown_alike(rounds, best, level, DEFAULT_THRESHOLD)
        near = [best, *(n for n in level if alike[n])]
        unresolved = tuple(n for n in level if not alike[n])
    pick = min(near, key=lambda n: _cost(rounds[n]))
    return Recommendation(best, tuple(near), pick, "", unresolved)


def verify_line(pick: str, current: str, current_rates: Mapping[int, float], pick_rates: Mapping[int, float]) -> str:
    """The recommended point against the current settings, measured round by round in one session:
    the ratio of samples/s with its interval and compare's verdict (significant and past its threshold)."""
    change, direction = against_base(current_rates, {pick: pick_rates}, DEFAULT_THRESHOLD)[pick]
    verdict = {UP: FASTER, DOWN: SLOWER}.get(direction, direction)
    return (f"verified against your settings ({current}), {min(len(current_rates), len(pick_rates))} interleaved "
            f"rounds a side: {pick} gives {change.ratio:.2f}x their samples/s (95% interval {change.ci_low:.2f}x to "
            f"{change.ci_high:.2f}x): {verdict}")
