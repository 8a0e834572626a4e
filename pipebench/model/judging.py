"""The one rule for reading a setup's measured samples/s against another's, and the verdict words.

Every reader that ranks setups reads them alike: the report's ★ and ≈ (pipebench.report.comparison),
the diagnosis's thread-against-process line, and tune's probe and race (pipebench.tune.objective).

- **An interval that says nothing** (`telling`): a job's, rank's or watched loader's rate interval
  with a bound more than MAX_BOUND_FACTOR from its rate is dropped where it is measured
  (pipebench.measure.window.rate_interval), so the readers below see no interval rather than one
  that cannot tell this setup from one 3x slower or faster.
- **The spread** (`rate_spread`): one round shows its 95% CI (batch means over whole worker cycles);
  two or three rounds the hull of their CIs and rates, as the IQR of so few rounds is a fraction of
  their spread (two rounds' IQR is half their range, and told two points 0.5% apart apart); from
  MIN_SAMPLES rounds the median and the IQR across them.
- **The judgement** (`judged`), one of three answers: from MIN_SAMPLES rounds a side, the rounds'
  significance test (pipebench.base.significance.separated) says APART or WITHIN_NOISE. With fewer,
  the spreads say: APART where they are disjoint; WITHIN_NOISE where the slower's spread reaches the
  faster's rate; UNTOLD where they overlap but the slower's stops short of that rate (overlapping is
  not enough to be alike: that side is slower by its own noise, yet not shown slower), and where a
  side has no interval (too few cycles, or one too wide to say anything: `telling`).

Readers ask the question they need answered: the report's ≈ marks WITHIN_NOISE only, so a row is never
called alike without the evidence; tune's race drops a point only when APART, so a point is never lost
without it.

Pure arithmetic on figures; nothing here reads a results file.
"""

import math
import statistics
from dataclasses import dataclass, field
from typing import Sequence, Tuple

import numpy as np

from pipebench.base.noise_figures import compare_half_width
from pipebench.base.significance import MIN_SAMPLES, separated
from pipebench.base.stats import RatioInterval

# The verdict words of compare, tune's verification and its recommendation.
FASTER, SLOWER, NO_CHANGE, NOISY, INCOMPARABLE = "faster", "slower", "no change", "noisy", "incomparable"
# Half the 20% slowdown the nightly must catch, asv's default factor (1.1), and about 2.5x
# the spread of a ratio of two 5-repeat medians at 5% CV (~4%): large enough not to cry
# wolf, small enough to catch a 20% regression. The lead confirms it from measured noise.
DEFAULT_THRESHOLD = 0.10
# The least relative noise of a samples/s measured in one run: one run's interval sees the load
# inside its window only, and runs minutes apart on a shared 2-core machine differed by 13-33%
# (half-width, benchmarks/noise_check.py); rounds=N measures the real spread.
RUN_TO_RUN_RATE_FLOOR = 0.10

# An interval with a bound more than this factor from its rate (under a third of it, or over three
# times it) cannot tell this setup from one 3x slower or faster, more than any one change pipebench
# compares (the README's ImageNet recipe gains 1.83x). Such intervals come from few blocks (the t quantile
# is 4.3 at 3 blocks, 12.7 at 2) or a block far off the rest (pytorch/examples' eval loader: 76.5-1,036.6
# around 281.7 samples/s, issue 55). The rule is on the width, whatever the count of blocks.
MAX_BOUND_FACTOR = 3.0
# Why such a rate is shown without its interval.
TOO_WIDE_NOTE = ("no interval: its blocks spread too far ({low:.4g}..{high:.4g} around {value:.4g}, past "
                 "{factor:g}x of the rate) for it to say anything; measure more steps for one")

# What a spread is, as the comparison table's header and comparison.csv's spread_kind say it.
CI_SPREAD, ROUNDS_HULL, ROUNDS_SPREAD = "95% CI", "hull of the rounds' 95% CIs", "IQR over rounds"
# The judgement's three answers.
APART, WITHIN_NOISE, UNTOLD = "told apart", "within the noise", "no interval to tell by"


@dataclass(frozen=True)
class Spread:
    """A central samples/s figure, the interval shown beside it, the half-width that sets its figures,
    and the rounds' own rates (what the significance test reads from MIN_SAMPLES rounds on)."""

    value: float
    low: float
    high: float
    kind: str
    half_width: float
    rates: Tuple[float, ...] = field(default=(), repr=False)


def rate_spread(rates: Sequence[float], lows: Sequence[float], highs: Sequence[float]) -> Spread:
    """The rounds' samples/s and its spread (module doc); `lows` and `highs` are each round's 95% CI,
    nan where a round has none. Two or three rounds none of which has an interval have none (nan)."""
    rates = tuple(float(r) for r in rates)
    if len(rates) == 1:
        low, high = float(lows[0]), float(highs[0])
        return Spread(rates[0], low, high, CI_SPREAD, (high - low) / 2, rates)
    if len(rates) >= MIN_SAMPLES:
        low, median, high = np.percentile(rates, [25, 50, 75])
        return Spread(float(median), float(low), float(high), ROUNDS_SPREAD, compare_half_width(rates), rates)
    bounds = [float(b) for b in (*lows, *highs) if math.isfinite(b)]
    low, high = (min(bounds + list(rates)), max(bounds + list(rates))) if bounds else (math.nan, math.nan)
    return Spread(statistics.median(rates), low, high, ROUNDS_HULL, (high - low) / 2, rates)


def reaches(low: float, high: float, rate: float) -> bool:
    """Whether an interval holds a rate; one with NaN bounds holds none."""
    return low <= rate <= high


def judged(a: Spread, b: Spread) -> str:
    """APART, WITHIN_NOISE or UNTOLD: whether two setups' samples/s differ beyond the noise (module doc)."""
    if min(len(a.rates), len(b.rates)) >= MIN_SAMPLES:
        return APART if separated(a.rates, b.rates) else WITHIN_NOISE
    if not all(math.isfinite(bound) for bound in (a.low, a.high, b.low, b.high)):
        return UNTOLD
    if a.high < b.low or b.high < a.low:
        return APART
    slower, faster = sorted((a, b), key=lambda spread: spread.value)
    return WITHIN_NOISE if reaches(slower.low, slower.high, faster.value) else UNTOLD


def telling(interval: RatioInterval, factor: float = MAX_BOUND_FACTOR) -> RatioInterval:
    """The interval where it says something; where a bound lies more than `factor` from the rate
    (MAX_BOUND_FACTOR), the rate alone, with NaN bounds and a note saying why (TOO_WIDE_NOTE)."""
    value, low, high = interval.value, interval.low, interval.high
    if interval.note or not (high > value * factor or low < value / factor):  # NaN bounds compare False
        return interval
    nan = float("nan")
    note = TOO_WIDE_NOTE.format(low=low, high=high, value=value, factor=factor)
    return RatioInterval(value, nan, nan, interval.blocks, note)
