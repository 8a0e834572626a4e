"""What tune recommends: the points within noise of the best, and the cheapest of them (fewest CPU ms
a sample, then least summed PSS): a faster point that costs more is no better buy when the
measurements show the two alike.

Not being told apart is not being shown alike: a point whose rounds cannot bound its gap to the best
is *unresolved*, named and not picked for being cheaper (workers=0 is always the cheapest in CPU, so
"the cheapest of those not told apart" would pick it whenever the race ran out of rounds). Among
chains within noise of the best, the stricter equivalence to the user's chain wins before the cost
(`STRICTNESS`): a tie in speed is no reason to accept pixels that differ. docs/tune.md has it in full.
"""

import math
from dataclasses import dataclass
from typing import Mapping, Optional, Sequence, Tuple

from pipebench.base.significance import DOWN, UP, against_base
from pipebench.explore.equivalence import CLOSE, IDENTICAL, SAME_DISTRIBUTION
from pipebench.model.judging import DEFAULT_THRESHOLD, FASTER, SLOWER
from pipebench.tune.objective import Objective, Round, cpu_ms, pss_mb, shown_alike, slower_for_real

__all__ = ["NOT_THE_BOTTLENECK_PCT", "STRICTNESS", "Recommendation", "bottleneck_note", "crash_warning", "recommend",
           "sibling_warning", "strictness", "verify_line"]

# explore's equivalence verdicts, strictest first: a chain's own verdict is "base" (explore.plan's).
# `close (max |Δ| = k)` reads as close.
STRICTNESS = ("base", IDENTICAL, CLOSE, SAME_DISTRIBUTION)
# At or under this starvation at the user's own step the loader is not what holds the model back:
# MLPerf Storage's bar, the accelerator busy 90% of the time or more.
NOT_THE_BOTTLENECK_PCT = 10.0


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
    # Why the pick is not the cheapest of `near`: a stricter equivalence won the tie ('' otherwise).
    stricter: str = ""

    @property
    def met(self) -> bool:
        return not self.unmet


def _cost(rounds: Sequence[Round]) -> Tuple[float, float]:
    """CPU ms a sample, then summed PSS; a figure not measured sorts last."""
    return tuple(value if math.isfinite(value) else math.inf for value in (cpu_ms(rounds), pss_mb(rounds)))


def strictness(verdict: str) -> int:
    """The verdict's place in STRICTNESS (0 strictest); an unknown verdict sorts last."""
    return next((i for i, v in enumerate(STRICTNESS) if verdict == v or verdict.startswith(f"{v} (")),
                len(STRICTNESS))


def recommend(rounds: Mapping[str, Sequence[Round]], survivors: Sequence[str], workers: Mapping[str, int],
              objective: Objective, equivalence: Optional[Mapping[str, str]] = None) -> Recommendation:
    """The recommendation from the race's survivors (the best first) and every point's rounds;
    `equivalence`: each point's chain's verdict against the user's chain (none: all the user's)."""
    verdicts = equivalence or {}
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
    cheapest = min(near, key=lambda n: _cost(rounds[n]))
    pick = min(near, key=lambda n: (strictness(verdicts.get(n, STRICTNESS[0])), _cost(rounds[n])))
    stricter = "" if pick == cheapest else (
        f"{pick} is recommended over {cheapest}, which is within noise of it and cheaper: its chain is "
        f"{verdicts.get(pick, STRICTNESS[0])} to yours (explore's equivalence), {cheapest}'s only "
        f"{verdicts.get(cheapest, STRICTNESS[0])}, and a tie is no reason to take the looser one")
    return Recommendation(best, tuple(near), pick, "", unresolved, stricter)


def verify_line(pick: str, current: str, current_rates: Mapping[int, float], pick_rates: Mapping[int, float]) -> str:
    """The recommended point against the current settings, measured round by round in one session:
    the ratio of samples/s with its interval and compare's verdict (significant and past its threshold)."""
    change, direction = against_base(current_rates, {pick: pick_rates}, DEFAULT_THRESHOLD)[pick]
    verdict = {UP: FASTER, DOWN: SLOWER}.get(direction, direction)
    return (f"verified against your settings ({current}), {min(len(current_rates), len(pick_rates))} interleaved "
            f"rounds a side: {pick} gives {change.ratio:.2f}x their samples/s (95% interval {change.ci_low:.2f}x to "
            f"{change.ci_high:.2f}x): {verdict}")


def crash_warning(chain: str, why: str) -> str:
    """The finding that a chain's probe job crashed: named first, not a quiet drop."""
    return (f"{chain}'s probe job crashed ({why}): the chain is dropped, and a chain that crashes on this "
            "host is a finding, not noise; run it alone (`pipebench run transform=...`) to see why")


def sibling_warning(pick_chain: str, crashed: Sequence[str], moves: Mapping[str, Sequence[str]]) -> str:
    """The warning the recommendation carries when its chain shares a move with a chain whose probe
    crashed ('' when it shares none): the crash may be the move's, and the pick's probe may have been lucky."""
    shared = {chain: sorted(set(moves.get(pick_chain, ())) & set(moves.get(chain, ()))) for chain in crashed}
    shared = {chain: found for chain, found in shared.items() if found}
    if not shared:
        return ""
    named = "; ".join(f"{chain} (shares {', '.join(found)})" for chain, found in shared.items())
    return (f"{pick_chain} shares a move with chain(s) whose probe crashed: {named}. Its own jobs survived, but "
            "the move may crash it too: run it at length before you adopt it")


def bottleneck_note(starvation_pct: float, source: str, step: str) -> str:
    """The note that the loader is not the bottleneck at the user's own step ('' when it is, or unknown):
    `source` says where the starvation comes from (measured or the model's), `step` the consumer."""
    if not math.isfinite(starvation_pct) or starvation_pct > NOT_THE_BOTTLENECK_PCT:
        return ""
    return (f"the loader is not the bottleneck at your own step ({step}): your settings starve it "
            f"{starvation_pct:.1f}% of the time ({source}), within the {NOT_THE_BOTTLENECK_PCT:g}% a model "
            "busy 90% of the time allows; a faster loader shows its gain only where the step is shorter")
